//! Scheduler accounting shared by the tp_btf and the classic programs.
//!
//! Every target thread moves between Running, Runnable (waiting in a run queue) and Blocked. Each
//! handler closes the interval of the state being left and adds it to the thread's totals. The
//! rules follow the kernel's own counters (kernel/sched/core.c, `__schedule`): a switch-out is
//! voluntary (`nvcsw`) when the task was not preempted and its state was not TASK_RUNNING, and
//! involuntary (`nivcsw`) otherwise, which includes `sched_yield`; a migration (`nr_migrations`)
//! is a change of CPU in `set_task_cpu`, whose tracepoint also fires when the CPU stays the same.

use aya_ebpf::helpers::{
    bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_kernel, bpf_probe_read_kernel_buf,
    generated,
};
use tracer_common::{
    COMM_LEN, ChildProcess, Counter, CpuWait, Event, EventKind, FLAG_CREATED, FLAG_EXECED,
    FLAG_EXITED, FLAG_MOVED, FLAG_REPAIRED, FLAG_RUNNABLE_UNSURE, FLAG_SEEN, FLAG_THROTTLE_BASE,
    MigrationKey, PF_KTHREAD, Preemptor, RUNQ_HIST_SLOTS, SWITCH_RUNNABLE_UNSURE, THROTTLED_SHIFT,
    ThreadState, ThreadStats, WAIT_CODE_SHIFT, WAKER_IDLE, WAKER_KTHREAD, WAKER_PENDING, WaitCode,
    WakerKey, WakerRun, hist_slot,
};

use crate::maps::{
    Batch, CHILDREN, CPU_WAIT, MIGRATIONS, PREEMPTORS, THREAD_SLOTS, THREAD_TEMPLATE, THREADS,
    WAKERS, add, config, count, emit, sends_when_idle,
};

const BPF_NOEXIST: u64 = 1;
const NO_CPU: u32 = u32::MAX;

/// Where to take a task's name from.
#[derive(Clone, Copy)]
pub enum Comm {
    /// The task is `current`.
    Current,
    /// A kernel address holding the 16-byte name (in a task_struct or a trace record).
    At(*const u8),
}

fn read_comm(dst: &mut [u8; COMM_LEN], from: Comm) {
    match from {
        Comm::Current => unsafe {
            generated::bpf_get_current_comm(dst.as_mut_ptr().cast(), COMM_LEN as u32);
        },
        Comm::At(src) => {
            if !src.is_null() {
                let _ = unsafe { bpf_probe_read_kernel_buf(src, dst) };
            }
        }
    }
}

/// Sets every field of a new entry for `tid`.
#[inline(always)]
fn init(t: &mut ThreadStats, tid: u32, tgid: u32, comm: Comm) {
    t.tgid = tgid;
    t.comm = [0; COMM_LEN];
    read_comm(&mut t.comm, comm);
    t.state = ThreadState::Unknown as u32;
    t.first_state = ThreadState::Unknown as u32;
    t.first_ts_ns = 0;
    t.state_ts_ns = 0;
    t.created_ts_ns = 0;
    t.exited_ts_ns = 0;
    t.voluntary_switches = 0;
    t.involuntary_switches = 0;
    t.migrations = 0;
    t.wakeups = 0;
    t.oncpu_ns = 0;
    t.runq_wait_ns = 0;
    t.blocked_ns = 0;
    t.runq_waits = 0;
    t.runq_wait_max_ns = 0;
    t.wait_cpu = NO_CPU;
    t.last_cpu = NO_CPU;
    t.parent_tid = 0;
    t.flags = 0;
    t.caused_wait_ns = 0;
    t.caused_slices = 0;
    t.seen_exec_ns = 0;
    t.seen_nvcsw = 0;
    t.seen_nivcsw = 0;
    t.seen_migrations = 0;
    t.runq_hist = [0; RUNQ_HIST_SLOTS];
    t.waker_tid = 0;
    t.waker_tgid = 0;
    t.waker_syscall = 0;
    t.waker_flags = 0;
    t.waker_comm = [0; COMM_LEN];
    t.tid = tid;
}

/// A task's own counters, read from its task_struct where the program has one (tp_btf).
#[derive(Clone, Copy)]
struct TaskCounts {
    /// `se.sum_exec_runtime`: its time on a CPU so far.
    pub exec_ns: u64,
    pub nvcsw: u64,
    pub nivcsw: u64,
    /// `se.nr_migrations`.
    pub migrations: u64,
}

/// The counters of `task`, a task_struct the tracepoint passed (tp_btf; plain loads, whose
/// offsets come from BTF through `CONFIG`), or None: classic tracepoints pass no task (null).
/// Read only where a target task is at hand, never on the early-exit path.
#[inline(always)]
fn counts_of(task: *const u8) -> Option<TaskCounts> {
    if task.is_null() || config!(task_counts) == 0 {
        return None;
    }
    let at = |off: u32| unsafe { core::ptr::read_volatile(task.add(off as usize) as *const u64) };
    Some(TaskCounts {
        exec_ns: at(config!(task_exec_off)),
        nvcsw: at(config!(task_nvcsw_off)),
        nivcsw: at(config!(task_nivcsw_off)),
        migrations: at(config!(task_migrations_off)),
    })
}

/// Waits shorter than this are not looked at for throttling at their end: at most this much of
/// one could have been a throttle (which lasts to the end of its quota period, milliseconds),
/// and left as contention it is noise beside the throttles that matter.
const THROTTLED_MIN_WAIT_NS: u64 = 100_000;

/// How long CFS bandwidth control has held `task`'s group queue on its CPU throttled, in all
/// (`Config::cfs_rq_throttled_off`), or 0 where that is not known (classic tracepoints pass no
/// task). Read at the start and end of a target thread's wait, never on the early-exit path.
#[inline(always)]
fn throttled_ns(task: *const u8) -> u64 {
    let off = config!(cfs_rq_throttled_off);
    if task.is_null() || off == 0 {
        return 0;
    }
    // SAFETY: BTF-typed loads, as in `counts_of`: `task->se.cfs_rq`, then the counter in it;
    // a faulting load gives 0.
    unsafe {
        let cfs_rq = core::ptr::read_volatile(
            task.add(config!(task_cfs_rq_off) as usize) as *const *const u8
        );
        core::ptr::read_volatile(cfs_rq.add(off as usize) as *const u64)
    }
}

/// Notes the throttled-time count where a wait of `t` (whose task is `task`) begins.
#[inline(always)]
fn note_throttle_base(t: &mut ThreadStats, task: *const u8) {
    t.throttled_at_wait = throttled_ns(task);
    t.flags |= FLAG_THROTTLE_BASE;
}

/// The share of the wait of `waited` ns that `task` ends now, in thousandths, that its group
/// queue was throttled: what the queue's throttled time grew by meanwhile. (A throttle already
/// under way when the wait began is counted whole at its end, so the growth can exceed the
/// wait: the share is then the whole.)
#[inline(always)]
fn throttled_permille(t: &ThreadStats, task: *const u8, waited: u64) -> u32 {
    if t.flags & FLAG_THROTTLE_BASE == 0 {
        return 0;
    }
    let grew = throttled_ns(task).wrapping_sub(t.throttled_at_wait);
    if (grew as i64) <= 0 || waited == 0 {
        return 0;
    }
    (grew.min(waited) * 1000 / waited) as u32
}

/// Keeps the thread's own counters, less what the probes have counted so far: at its next
/// reading, whatever the counters moved by beyond what the probes counted meanwhile was never
/// reported. (Offsets, not the counters themselves: the probes' own counting in between,
/// switch-outs included, then needs no reading of its own.)
#[inline(always)]
fn remember(t: &mut ThreadStats, c: Option<&TaskCounts>) {
    if let Some(c) = c {
        t.seen_exec_ns = c.exec_ns.wrapping_sub(t.oncpu_ns);
        t.seen_nvcsw = c.nvcsw.wrapping_sub(t.voluntary_switches);
        t.seen_nivcsw = c.nivcsw.wrapping_sub(t.involuntary_switches);
        t.seen_migrations = c.migrations.wrapping_sub(t.migrations);
        t.flags |= FLAG_SEEN;
    }
}

/// Compares the thread's own counters with what the probes counted since its last reading.
/// More switches than counted means some were never reported (on our Firecracker VMs no
/// sched_switch fires with `prev` a thread of PID 1, and some of its wakeups are missing too):
/// they are added to its totals here, and the time it ran that was not accounted (negative: it
/// was accounted as running when it was not) is returned, with whether it blocked meanwhile.
/// None when the counters agree, or cannot be read (classic tracepoints).
#[inline(always)]
fn unseen(t: &mut ThreadStats, c: Option<&TaskCounts>) -> Option<(i64, bool)> {
    let c = c?;
    if t.flags & FLAG_SEEN == 0 {
        return None;
    }
    if t.flags & FLAG_REPAIRED != 0 {
        correct_repaired(t, c);
    }
    // Moves no tracepoint reported: counted here, whatever the switches say.
    let moved = c
        .migrations
        .wrapping_sub(t.migrations)
        .wrapping_sub(t.seen_migrations) as i64;
    if moved > 0 {
        t.migrations += moved as u64;
    }
    let nv = c
        .nvcsw
        .wrapping_sub(t.voluntary_switches)
        .wrapping_sub(t.seen_nvcsw) as i64;
    let niv = c
        .nivcsw
        .wrapping_sub(t.involuntary_switches)
        .wrapping_sub(t.seen_nivcsw) as i64;
    if nv <= 0 && niv <= 0 {
        return None;
    }
    let (nv, niv) = (nv.max(0) as u64, niv.max(0) as u64);
    t.voluntary_switches += nv;
    t.involuntary_switches += niv;
    add(Counter::UnseenSwitchOut, nv + niv);
    anomaly!(
        "unseen switch-out: tid {}'s own counters show {} voluntary and {} involuntary \
         switches no tracepoint reported",
        t.tid,
        nv,
        niv
    );
    let ran = c
        .exec_ns
        .wrapping_sub(t.oncpu_ns)
        .wrapping_sub(t.seen_exec_ns) as i64;
    Some((ran, nv > 0))
}

/// After `repair_unseen_switch_in`: the interval from the thread's last wait to its switch-out
/// was accounted as running, though the task whose switch went untraced (PID 1 on our VMs) ran
/// first. The thread's own run time since it was last read says how much: that excess was
/// run-queue waiting. (Measured: 2.3 ms of 33.7 ms accounted to a worker that ran 31.4 ms, by
/// perf's task-clock and schedstat alike.) Not inlined, for the verifier, as `reconcile_in`.
#[inline(never)]
fn correct_repaired(t: &mut ThreadStats, c: &TaskCounts) {
    t.flags &= !FLAG_REPAIRED;
    let over = t
        .oncpu_ns
        .wrapping_add(t.seen_exec_ns)
        .wrapping_sub(c.exec_ns) as i64;
    if over > 0 {
        let over = (over as u64).min(t.oncpu_ns);
        t.oncpu_ns -= over;
        t.runq_wait_ns += over;
    } else {
        // It ran more than accounted: a slice after an unreported wakeup, counted blocked.
        let under = over.unsigned_abs().min(t.blocked_ns);
        t.blocked_ns -= under;
        t.oncpu_ns += under;
    }
}

/// Accounts what `unseen` found over the interval since the thread's last event: the time it
/// ran, up to the interval's length; or, when more had been accounted as running than it ran,
/// that excess moved off the CPU. Returns the rest of the interval, spent off a CPU.
#[inline(always)]
fn account_unseen(t: &mut ThreadStats, ran: i64, now: u64) -> u64 {
    let span = now.saturating_sub(t.state_ts_ns);
    if ran >= 0 {
        let ran = (ran as u64).min(span);
        t.oncpu_ns += ran;
        span - ran
    } else {
        let excess = ran.unsigned_abs().min(t.oncpu_ns);
        t.oncpu_ns -= excess;
        t.blocked_ns += excess;
        span
    }
}

/// Takes a thread off its CPU's waiters (it is no longer waiting where the probes thought).
#[inline(always)]
fn stop_waiting(t: &mut ThreadStats, now: u64) {
    if t.state == ThreadState::Runnable as u32 {
        waiter_remove(t.wait_cpu, now);
    }
    t.wait_cpu = NO_CPU;
}

/// The thread's entry, created on first sight: its slot if free or its own, else the hash map.
#[inline(always)]
fn thread(tid: u32, tgid: u32, comm: Comm) -> Option<&'static mut ThreadStats> {
    let slot = THREAD_SLOTS.get_ptr_mut(tid & config!(thread_slot_mask));
    if let Some(s) = slot {
        let s = unsafe { &mut *s };
        if s.tid == tid {
            return Some(s);
        }
    }
    if let Some(t) = THREADS.get_ptr_mut(tid) {
        return Some(unsafe { &mut *t });
    }
    if let Some(s) = slot {
        // Free (userspace frees the slots of dead threads), and the thread has no entry in
        // the hash map, checked just above: a thread never has two entries. Two new threads
        // whose TIDs share a slot, first seen on two CPUs in the same instant, could both
        // take it; nothing cheaper than an atomic exchange (which this eBPF target lacks)
        // would rule that out.
        let s = unsafe { &mut *s };
        if s.tid == 0 {
            init(s, tid, tgid, comm);
            return Some(s);
        }
    }
    let template = THREAD_TEMPLATE.get_ptr_mut(0)?;
    let t = unsafe { &mut *template };
    init(t, tid, tgid, comm);
    // NOEXIST: if another CPU created it meanwhile, keep theirs. Passed by reference: by value
    // it would be copied onto the stack first.
    #[allow(clippy::needless_borrows_for_generic_args)]
    let inserted = THREADS.insert(tid, &*t, BPF_NOEXIST);
    if inserted.is_err() && THREADS.get_ptr_mut(tid).is_none() {
        count(Counter::ThreadMapFull);
        anomaly!(
            "thread map full: tid {} of tgid {} is not tracked",
            tid,
            tgid
        );
        return None;
    }
    THREADS.get_ptr_mut(tid).map(|t| unsafe { &mut *t })
}

/// Closes the current state at `now`. If no event was seen yet, `before` is the state the
/// thread must have been in (deduced from the event), and userspace closes that interval
/// against the window start.
#[inline(always)]
fn leave(t: &mut ThreadStats, now: u64, before: ThreadState) -> u64 {
    let state = t.state;
    if state == ThreadState::Unknown as u32 {
        t.first_state = before as u32;
        t.first_ts_ns = now;
        return 0;
    }
    // The switch first: off, the verifier removes the whole test, not only the log.
    if config!(debug_bpf) != 0 && now < t.state_ts_ns {
        anomaly!(
            "clock ran backwards: tid {} in state {} since {} ns, now {} (the interval counts 0)",
            t.tid,
            state,
            t.state_ts_ns,
            now
        );
    }
    let d = now.saturating_sub(t.state_ts_ns);
    if state == ThreadState::Running as u32 {
        t.oncpu_ns += d;
    } else if state == ThreadState::Runnable as u32 {
        t.runq_wait_ns += d;
    } else {
        t.blocked_ns += d;
    }
    d
}

#[inline(always)]
fn enter(t: &mut ThreadStats, state: ThreadState, now: u64) {
    t.state = state as u32;
    t.state_ts_ns = now;
}

/// Folds the target-waiting time on `w` up to `now` into `pending_ns`.
#[inline(always)]
fn settle(w: &mut CpuWait, now: u64) {
    if w.waiters != 0 {
        w.pending_ns += now.saturating_sub(w.since_ns) * w.waiters as u64;
    }
    w.since_ns = now;
}

#[inline(always)]
fn waiter_add(cpu: u32, now: u64) {
    if let Some(w) = CPU_WAIT.get_ptr_mut(cpu) {
        let w = unsafe { &mut *w };
        settle(w, now);
        w.waiters += 1;
    }
}

#[inline(always)]
fn waiter_remove(cpu: u32, now: u64) {
    if cpu == NO_CPU {
        return;
    }
    if let Some(w) = CPU_WAIT.get_ptr_mut(cpu) {
        let w = unsafe { &mut *w };
        settle(w, now);
        if w.waiters > 0 {
            w.waiters -= 1;
        }
    }
}

/// Takes the target-waiting time on `w` up to `now`: what the task leaving the CPU (always
/// `current`) caused.
#[inline(always)]
fn owed(w: &mut CpuWait, now: u64) -> u64 {
    settle(w, now);
    let owed = w.pending_ns;
    w.pending_ns = 0;
    owed
}

/// Charges a task outside the target with `owed` ns of waiting it caused target threads. (A
/// target thread is charged in its own entry, `ThreadStats::caused_wait_ns`.)
#[inline(always)]
fn charge(owed: u64, pid: u32, tgid: u32) {
    // The idle task (pid 0) is recorded too: a CPU idling while a target thread waits in its
    // run queue means the thread could not run although the CPU was free (its cgroup was
    // throttled), or the wakeup was slow.
    if let Some(p) = PREEMPTORS.get_ptr_mut(pid) {
        // A task runs on one CPU at a time, so no other CPU updates this entry meanwhile.
        let p = unsafe { &mut *p };
        p.wait_ns += owed;
        p.slices += 1;
        return;
    }
    // Once per preemptor: two helper calls and two reads are nothing here.
    let mut p = Preemptor {
        pid,
        tgid,
        comm: [0; COMM_LEN],
        wait_ns: owed,
        slices: 1,
        ppid: current_parent(),
        _pad: 0,
        cgroup_id: unsafe { generated::bpf_get_current_cgroup_id() },
    };
    read_comm(&mut p.comm, Comm::Current);
    if PREEMPTORS.insert(pid, p, BPF_NOEXIST).is_err() {
        count(Counter::PreemptorMapFull);
        anomaly!(
            "preemptor map full: {} ns caused by tid {} not attributed",
            owed,
            pid
        );
    }
}

/// `current->real_parent->tgid`, or 0 where the offsets are unknown (no BTF).
#[inline(always)]
fn current_parent() -> u32 {
    if config!(task_real_parent_off) == 0 {
        return 0;
    }
    let task = unsafe { generated::bpf_get_current_task() } as *const u8;
    let parent: *const u8 = unsafe {
        bpf_probe_read_kernel(
            task.wrapping_add(config!(task_real_parent_off) as usize)
                .cast(),
        )
    }
    .unwrap_or(core::ptr::null());
    if parent.is_null() {
        return 0;
    }
    unsafe { bpf_probe_read_kernel(parent.wrapping_add(config!(task_tgid_off) as usize).cast()) }
        .unwrap_or(0)
}

/// A fork that made a new process (`child`, its TGID) of `parent`, kept when the parent is a
/// member of the target set or a process one forked. Following children, the child joins the
/// set here, before it first runs, and its first thread is the target's from its birth:
/// returns true, and the caller records that thread. Otherwise it is only noted: the summary
/// names it, and its preemption of the target as its own children's.
#[inline(always)]
pub fn on_process_fork(child: u32, parent: u32, comm: Comm) -> bool {
    let member = crate::maps::is_member(parent);
    if !member && crate::maps::is_member(child) {
        // A TGID a member had, reused by a process outside the set after the member exited.
        crate::maps::set_member(child, false);
    }
    if !member && CHILDREN.get_ptr(parent).is_none() {
        return false;
    }
    let joins = member && config!(follow_children) != 0;
    if joins {
        crate::maps::set_member(child, true);
    }
    let mut c = ChildProcess {
        parent,
        _pad: 0,
        created_ns: unsafe { bpf_ktime_get_ns() },
        comm: [0; COMM_LEN],
    };
    read_comm(&mut c.comm, comm);
    // An entry already there is of a process that had this PID before and exited (userspace
    // takes those out a window after their exit): the new one replaces it. -E2BIG: the map is
    // full.
    if CHILDREN.insert(child, c, 0) == Err(-7) {
        count(Counter::ChildMapFull);
        anomaly!(
            "child map full: the fork of {} by {} is not noted",
            child,
            parent
        );
    }
    joins
}

/// A task moved into a cgroup (`id` in hierarchy `root`). A process whose leader moves into a
/// cgroup of `TARGET_CGROUPS` joins the set, noted as a joined process with the time (its
/// parent unknown here: 0). Its other threads move with it (cgroup.procs) and are members
/// through their TGID; a lone thread moved (cgroup.threads, v1 `tasks`) is not followed.
#[inline(always)]
pub fn on_cgroup_attach(id: u64, root: u32, pid: u32, tgid: u32, comm: Comm) {
    if pid != tgid || crate::maps::is_member(tgid) {
        return;
    }
    match unsafe { crate::maps::TARGET_CGROUPS.get(id) } {
        Some(r) if *r == root => {}
        _ => return,
    }
    crate::maps::set_member(tgid, true);
    let mut c = ChildProcess {
        parent: 0,
        _pad: 0,
        created_ns: unsafe { bpf_ktime_get_ns() },
        comm: [0; COMM_LEN],
    };
    read_comm(&mut c.comm, comm);
    if CHILDREN.insert(tgid, c, 0).is_err() {
        count(Counter::ChildMapFull);
        anomaly!(
            "child map full: {}'s move into a target cgroup is not noted",
            tgid
        );
    }
}

#[inline(always)]
fn event(ts_ns: u64, tid: u32, kind: EventKind, cpu: u32, aux: u32, value: u64) -> Event {
    Event {
        ts_ns,
        tid,
        kind: kind as u32,
        cpu,
        aux,
        value,
    }
}

/// A context switch on `cpu`, as the tracepoint reports it.
pub struct Switch {
    pub preempt: bool,
    /// `prev->__state` as passed to the tracepoint (TASK_RUNNING is 0), or `STATE_UNKNOWN`
    /// where the tracepoint has no such argument (tp_btf before Linux 5.18).
    pub prev_state: u64,
    pub prev_pid: u32,
    pub prev_tgid: u32,
    pub prev_target: bool,
    pub next_pid: u32,
    /// Its process, when it is a member (0 otherwise).
    pub next_tgid: u32,
    pub next_target: bool,
    pub next_comm: Comm,
    /// The task switching in, for its own counters (tp_btf); null for classic tracepoints,
    /// whose records carry none.
    pub next_task: *const u8,
    /// The task switching out (tp_btf without `prev_state`; null otherwise).
    pub prev_task: *const u8,
}

/// `Switch::prev_state` when the tracepoint does not pass it.
pub const STATE_UNKNOWN: u64 = u64::MAX;

/// Whether a switch-out the tracepoint passed no `prev_state` for was the thread blocking
/// (a voluntary switch). `__schedule` counts the switch in the task's own `nvcsw` or `nivcsw`
/// before `trace_sched_switch` (since Linux 3.x), so where the thread's counters were read at
/// its last switch-in, the voluntary count having moved past the probes' own says so exactly.
/// Otherwise (its first switch-out since the attach) the run queue does: a task that blocks is
/// taken off it before the tracepoint, under the run queue's lock, which a concurrent wakeup
/// also takes to put it back; this misses only a sleep that a pending signal cancelled
/// (counted voluntary, left on the queue). Not inlined, for the verifier, as `reconcile_in`.
#[inline(never)]
fn blocked_by_counts(t: &ThreadStats, task: *const u8) -> bool {
    if t.flags & FLAG_SEEN != 0 && config!(task_counts) != 0 {
        let nvcsw = unsafe {
            core::ptr::read_volatile(task.add(config!(task_nvcsw_off) as usize) as *const u64)
        };
        return nvcsw
            .wrapping_sub(t.seen_nvcsw)
            .wrapping_sub(t.voluntary_switches) as i64
            > 0;
    }
    let on_rq = unsafe {
        core::ptr::read_volatile(task.add(config!(task_on_rq_off) as usize) as *const u32)
    };
    on_rq == 0
}

/// Where a program takes the time of its event from, read only when the event counts. A trait
/// with an always-inlined method rather than a closure: the compiler made a closure into a
/// function of its own, and every target wakeup paid a BPF-to-BPF call for it (about 20 ns on
/// our VMs, with the kernel's return-thunk mitigations: BENCHMARKS.md).
pub trait Clock {
    fn now(self) -> u64;
}

/// The clock helper (classic tracepoints: no task at hand to read a run queue's clock from).
pub struct HelperClock;

impl Clock for HelperClock {
    #[inline(always)]
    fn now(self) -> u64 {
        unsafe { bpf_ktime_get_ns() }
    }
}

/// `clock` gives the time, called only if the switch concerns a target (or a CPU one waits
/// for): the early exit reads no clock.
#[inline(always)]
pub fn on_switch(cpu: u32, sw: &Switch, clock: impl Clock) {
    let Some(mut out) = Batch::get() else {
        return;
    };
    let wait = CPU_WAIT.get_ptr_mut(cpu);
    let owing = match wait {
        Some(w) => unsafe { (*w).waiters != 0 || (*w).pending_ns != 0 },
        None => false,
    };
    // The path every non-target switch takes: nothing to record, only this CPU's batch to send
    // if it has waited a tick or the CPU goes idle.
    if !sw.prev_target && !sw.next_target && !owing {
        out.age(sw.next_pid == 0 && sends_when_idle(cpu));
        return;
    }
    // The run queue's clock, unless this `__schedule` may have skipped updating it (clock.rs):
    // a switch that leaves `prev` runnable is a preemption, which a wakeup's skip request
    // comes with; and a target's wakeup that preempted noted its time on this CPU, which the
    // clock then still reads. The helper says when those switches really came.
    let now = if sw.preempt || sw.prev_state == 0 || sw.prev_state == STATE_UNKNOWN {
        unsafe { bpf_ktime_get_ns() }
    } else {
        let t = clock.now();
        match wait {
            Some(w) if unsafe { (*w).since_ns } == t => unsafe { bpf_ktime_get_ns() },
            _ => t,
        }
    };
    let mut prev = if sw.prev_target {
        thread(sw.prev_pid, sw.prev_tgid, Comm::Current)
    } else {
        None
    };
    // A thread switching out is running, unless its switch-in went unseen: the check is
    // inline, the repair out of line (a BPF-to-BPF call costs about 20 ns on our VMs, with
    // the kernel's return-thunk mitigations: BENCHMARKS.md).
    if let Some(t) = prev.as_deref_mut()
        && (t.state == ThreadState::Blocked as u32 || t.state == ThreadState::Runnable as u32)
    {
        repair_unseen_switch_in(t, now);
    }
    if owing && let Some(w) = wait {
        let owed = owed(unsafe { &mut *w }, now);
        if owed != 0 {
            match prev.as_deref_mut() {
                Some(t) => {
                    t.caused_wait_ns += owed;
                    t.caused_slices += 1;
                }
                None => charge(owed, sw.prev_pid, sw.prev_tgid),
            }
        }
    }
    if let Some(t) = prev {
        switch_out(t, cpu, now, sw, &mut out);
    }
    if sw.next_target
        && let Some(t) = thread(sw.next_pid, sw.next_tgid, sw.next_comm)
    {
        switch_in(t, cpu, now, sw, &mut out);
    }
    out.age(sw.next_pid == 0 && sends_when_idle(cpu));
}

/// Whether the thread's own counters `c` say nothing `unseen` would act on: read before, no
/// repair pending, and no switch or migration beyond what the probes counted. The common case,
/// tested inline so that a switch-in makes no call for it.
#[inline(always)]
fn counts_agree(t: &ThreadStats, c: &TaskCounts) -> bool {
    if t.flags & FLAG_SEEN == 0 {
        return true;
    }
    let beyond = |now: u64, counted: u64, seen: u64| now.wrapping_sub(counted).wrapping_sub(seen);
    t.flags & FLAG_REPAIRED == 0
        && beyond(c.migrations, t.migrations, t.seen_migrations) == 0
        && beyond(c.nvcsw, t.voluntary_switches, t.seen_nvcsw) == 0
        && beyond(c.nivcsw, t.involuntary_switches, t.seen_nivcsw) == 0
}

/// The thread switching in against its own counters: it switched out (and maybe in and out
/// again) unreported, so it ran what `unseen` says, then was off a CPU until now, blocked or,
/// if it was only preempted, waiting for one (which this switch-in ends, as a run-queue wait of
/// that length). Not inlined: a switch program with every branch of this inlined, and the perf
/// counter reads, passes the verifier's million-instruction limit; called only when the
/// counters disagree (`counts_agree`).
#[inline(never)]
fn reconcile_in(t: &mut ThreadStats, c: &TaskCounts, now: u64) {
    let Some((ran, blocked)) = unseen(t, Some(c)) else {
        return;
    };
    let off = account_unseen(t, ran, now);
    stop_waiting(t, now);
    t.state = if blocked {
        ThreadState::Blocked as u32
    } else {
        ThreadState::Runnable as u32
    };
    t.state_ts_ns = now - off;
}

/// A target thread is switching out, so it is running, but the probes last saw it waiting: the
/// switch that gave it the CPU was never traced. That happens (1) at the start of a recording,
/// between attaching sched_wakeup and sched_switch, and (2) on hosts where some task's switches
/// out are untraced: on our Firecracker VMs, sched_switch never fires with prev = a thread of
/// PID 1 (process_api), for bpftrace as for us, so the task it preempted resumes unseen. The
/// wait bookkeeping is undone (the thread no longer waits, and the waiting pending on its CPU
/// cannot be told apart from running, so no one is charged); the time since the thread was
/// last seen waiting counts as on-CPU, since in case (2) the untraced task runs only briefly.
/// Where the thread's own counters can be read, its next switch-in or wakeup moves back off
/// the CPU what it did not run (`account_unseen`).
/// A thread the probes thought blocked switches out too: its wakeup went unreported as well
/// (PID 1's wakeups on our VMs): blocked until now, then a slice the thread's own run time,
/// read at its next traced event, gives back (measured: 2 of 156 slices of a worker, with no
/// loss said, before).
#[inline(never)]
fn repair_unseen_switch_in(t: &mut ThreadStats, now: u64) {
    // Called only for a thread the probes took for blocked or runnable.
    if t.state == ThreadState::Blocked as u32 {
        count(Counter::UnseenSwitchIn);
        anomaly!(
            "unseen switch-in: tid {} switched out while blocked since {} ns (its wakeup and \
             switch-in were not traced); the interval is closed as blocked at {}",
            t.tid,
            t.state_ts_ns,
            now
        );
        leave(t, now, ThreadState::Blocked);
        enter(t, ThreadState::Running, now);
        t.flags |= FLAG_REPAIRED;
        return;
    }
    if t.state != ThreadState::Runnable as u32 {
        return;
    }
    count(Counter::UnseenSwitchIn);
    anomaly!(
        "unseen switch-in: tid {} switched out while waiting for CPU {} since {} ns (its \
         switch-in was not traced); now {}",
        t.tid,
        t.wait_cpu,
        t.state_ts_ns,
        now
    );
    if t.wait_cpu != NO_CPU
        && let Some(w) = CPU_WAIT.get_ptr_mut(t.wait_cpu)
    {
        let w = unsafe { &mut *w };
        w.waiters = w.waiters.saturating_sub(1);
        w.pending_ns = 0;
    }
    t.wait_cpu = NO_CPU;
    // state_ts stays: the interval since then is closed as running by switch_out, and put
    // right at the next reading of the thread's own counters (`correct_repaired`).
    t.state = ThreadState::Running as u32;
    t.flags |= FLAG_REPAIRED;
}

#[inline(always)]
fn switch_out(t: &mut ThreadStats, cpu: u32, now: u64, sw: &Switch, out: &mut Batch) {
    let slice = leave(t, now, ThreadState::Running);
    crate::counters::slice_end(sw.prev_pid, cpu, now, out);
    t.last_cpu = cpu;
    t.flags &= !FLAG_MOVED;
    let involuntary = if sw.preempt {
        true
    } else if sw.prev_state == STATE_UNKNOWN {
        !blocked_by_counts(t, sw.prev_task)
    } else {
        sw.prev_state == 0
    };
    if involuntary {
        t.involuntary_switches += 1;
        if !sw.preempt && sw.prev_task.is_null() {
            t.flags |= FLAG_RUNNABLE_UNSURE;
        }
        enter(t, ThreadState::Runnable, now);
        t.wait_cpu = cpu;
        note_throttle_base(t, sw.prev_task);
        waiter_add(cpu, now);
    } else {
        t.voluntary_switches += 1;
        // The switch after exit is the thread's last: nothing more will be accounted.
        let state = if t.flags & FLAG_EXITED != 0 {
            ThreadState::Dead
        } else {
            ThreadState::Blocked
        };
        enter(t, state, now);
        t.wait_cpu = NO_CPU;
    }
    if config!(transitions) != 0 {
        out.push(&event(
            now,
            sw.prev_pid,
            EventKind::SwitchOut,
            cpu,
            involuntary as u32
                | ((t.flags & FLAG_RUNNABLE_UNSURE != 0) as u32 * SWITCH_RUNNABLE_UNSURE),
            slice,
        ));
    }
}

/// A thread the probes took for runnable since a switch-out that reported it so is woken: it
/// had blocked (a task on its run queue gets no wakeup: try_to_wake_up returns early for a
/// running state), and a classic `sched_switch` before Linux 5.18 re-read its state after a
/// wakeup from another CPU had begun (TASK_WAKING reads as runnable). The switch was
/// voluntary, as the kernel counted it, and the interval since is blocked, which the wakeup
/// now ends. Its CPU loses a waiter; what that CPU's tasks were charged for it meanwhile
/// stays (a few microseconds: the wakeup was already under way at the switch).
#[inline(never)]
fn blocked_after_all(t: &mut ThreadStats) {
    t.flags &= !FLAG_RUNNABLE_UNSURE;
    t.involuntary_switches = t.involuntary_switches.saturating_sub(1);
    t.voluntary_switches += 1;
    if t.wait_cpu != NO_CPU
        && let Some(w) = CPU_WAIT.get_ptr_mut(t.wait_cpu)
    {
        let w = unsafe { &mut *w };
        w.waiters = w.waiters.saturating_sub(1);
    }
    t.wait_cpu = NO_CPU;
    t.state = ThreadState::Blocked as u32;
}

#[inline(always)]
fn switch_in(t: &mut ThreadStats, cpu: u32, now: u64, sw: &Switch, out: &mut Batch) {
    t.flags &= !FLAG_RUNNABLE_UNSURE;
    let counts = counts_of(sw.next_task);
    if let Some(c) = counts.as_ref()
        && !counts_agree(t, c)
    {
        reconcile_in(t, c, now);
    }
    let was = t.state;
    if was == ThreadState::Running as u32 {
        // Its last switch out was not traced (and its counters cannot be read: classic
        // tracepoints); the interval closes as running.
        count(Counter::UnseenSwitchOut);
        anomaly!(
            "unseen switch-out: tid {} switched in on CPU {} while running since {} ns as far \
             as the probes knew; now {}",
            t.tid,
            cpu,
            t.state_ts_ns,
            now
        );
    }
    if was == ThreadState::Blocked as u32 {
        // The kernel traces a wakeup before a blocked task can run again: this one's was not.
        count(Counter::UnseenWakeup);
        anomaly!(
            "unseen wakeup: tid {} switched in on CPU {} while blocked since {} ns as far as \
             the probes knew (its wakeup was not traced); now {}",
            t.tid,
            cpu,
            t.state_ts_ns,
            now
        );
    }
    let waited = leave(t, now, ThreadState::Runnable);
    if was == ThreadState::Runnable as u32 {
        t.runq_waits += 1;
        if waited > t.runq_wait_max_ns {
            t.runq_wait_max_ns = waited;
        }
        let slot = hist_slot(waited);
        if let Some(c) = t.runq_hist.get_mut(slot) {
            *c += 1;
        }
        waiter_remove(t.wait_cpu, now);
    }
    t.wait_cpu = NO_CPU;
    t.last_cpu = cpu;
    enter(t, ThreadState::Running, now);
    remember(t, counts.as_ref());
    crate::counters::slice_begin(sw.next_pid, now);
    // A wait that ended is at least 1 ns, so the record tells it from a switch-in that ended
    // none: a wakeup that preempted reads the same run-queue clock as this switch (clock.rs),
    // and a wakeup from another CPU's clock can come out a few hundred ns after it.
    let waited = if was == ThreadState::Runnable as u32 {
        waited.max(1)
    } else {
        0
    };
    let kind = wait_kind_bits(t, sw, waited);
    let mut ev = event(
        now,
        sw.next_pid,
        EventKind::SwitchIn,
        cpu,
        sw.prev_pid,
        waited,
    );
    ev.kind |= kind;
    out.push(&ev);
}

/// The switch-in record's wait bits for the wait of `waited` ns it ends (0: none): its
/// `WaitCode` and throttled share. Ends the wait's flags.
#[inline(always)]
fn wait_kind_bits(t: &mut ThreadStats, sw: &Switch, waited: u64) -> u32 {
    // The same rules as userspace's WaitTracker, which needs the events in time order. A
    // thread moved while it waited sits in another CPU's group queue, whose throttled time
    // is another count: its throttled share is not known. A wait too short to hold a
    // throttle worth naming skips the read (most waits of a busy server: +9 ns a switch-in
    // on the pipe benchmark when read at every one).
    let throttled = if t.flags & FLAG_MOVED == 0 && waited >= THROTTLED_MIN_WAIT_NS {
        throttled_permille(t, sw.next_task, waited)
    } else {
        0
    };
    let code = if t.flags & FLAG_MOVED != 0 {
        WaitCode::Migration
    } else if sw.prev_pid == 0 {
        WaitCode::IdleCpu
    } else {
        WaitCode::Contention
    };
    t.flags &= !(FLAG_MOVED | FLAG_THROTTLE_BASE);
    (code as u32) << WAIT_CODE_SHIFT | throttled << THROTTLED_SHIFT
}

/// A target thread was woken (or, with `new`, woken for the first time after creation), and
/// joins the run queue of `cpu`. `clock` gives the time, called only if the wakeup counts.
#[inline(always)]
pub fn on_wakeup(
    tid: u32,
    tgid: u32,
    cpu: u32,
    new: bool,
    comm: Comm,
    task: *const u8,
    clock: impl Clock,
) {
    let counts = counts_of(task);
    let Some(t) = thread(tid, tgid, comm) else {
        return;
    };
    // A wakeup of a task that is already runnable (it was woken before it managed to block)
    // changes nothing. But the kernel reports no wakeup of a task that is running
    // (try_to_wake_up returns early): one the probes think is running or waiting blocked
    // unreported (it was switched in, or out, by a switch no tracepoint reported). Its own
    // counters, when they can be read, say so and how long it ran; the rest of the interval
    // counts as blocked (how much of it was a wait for a CPU is not known).
    if t.flags & FLAG_RUNNABLE_UNSURE != 0 && t.state == ThreadState::Runnable as u32 {
        blocked_after_all(t);
    }
    let awake = t.state == ThreadState::Running as u32 || t.state == ThreadState::Runnable as u32;
    if awake && counts.is_none() {
        return;
    }
    let now = clock.now();
    if let Some((ran, _)) = unseen(t, counts.as_ref()) {
        let off = account_unseen(t, ran, now);
        t.blocked_ns += off;
        stop_waiting(t, now);
        t.state = ThreadState::Blocked as u32;
        t.state_ts_ns = now;
    }
    if t.state == ThreadState::Running as u32 || t.state == ThreadState::Runnable as u32 {
        return;
    }
    let blocked_since = (t.state == ThreadState::Blocked as u32).then_some(t.state_ts_ns);
    leave(t, now, ThreadState::Blocked);
    remember(t, counts.as_ref());
    t.wakeups += 1;
    enter(t, ThreadState::Runnable, now);
    t.wait_cpu = cpu;
    note_throttle_base(t, task);
    waiter_add(cpu, now);
    // The waker `sched_waking` noted, if it did (not before it is attached, after this
    // program): the blocked interval just closed goes to it.
    let noted = t.waker_flags & WAKER_PENDING != 0;
    t.waker_flags &= !WAKER_PENDING;
    if noted
        && !new
        && let Some(since) = blocked_since
    {
        note_waker(t, now.saturating_sub(since));
    }
    let kind = if new {
        EventKind::WakeupNew
    } else {
        EventKind::Wakeup
    };
    if config!(transitions) == 0 {
        return;
    }
    let (waker, how) = if noted {
        let how = t.waker_syscall as u64 | ((t.waker_flags as u64) << 32);
        (t.waker_tid, how)
    } else {
        (bpf_get_current_pid_tgid() as u32, 0)
    };
    if let Some(mut out) = Batch::get() {
        out.push(&event(now, tid, kind, cpu, waker, how));
    }
}

/// `sched_waking` of a target thread, in the waker's context: who is waking it (`noted` fills
/// in `waker_tid`, `waker_tgid`, `waker_flags` and `waker_comm`) and, where known, the system
/// call it is blocked in (its number plus one; 0: unknown), for the wakeup that follows.
#[inline(always)]
pub fn on_waking(
    tid: u32,
    tgid: u32,
    comm: Comm,
    syscall: u32,
    noted: impl FnOnce(&mut ThreadStats),
) {
    let Some(t) = thread(tid, tgid, comm) else {
        return;
    };
    noted(t);
    t.waker_syscall = syscall;
    t.waker_flags |= WAKER_PENDING;
}

/// `WAKER_*` flags of a waker with TID `tid` and `task_struct.flags` `flags`.
#[inline(always)]
pub fn waker_flags(tid: u32, flags: u32) -> u32 {
    let mut f = 0;
    if tid == 0 {
        f |= WAKER_IDLE;
    }
    if flags & PF_KTHREAD != 0 {
        f |= WAKER_KTHREAD;
    }
    f
}

/// Notes `current` as the waker of `t` with helpers, where no typed `current` can be had
/// (classic tracepoints, kernels before 5.11).
#[inline(always)]
pub fn note_current_waker(t: &mut ThreadStats) {
    let id = bpf_get_current_pid_tgid();
    t.waker_tid = id as u32;
    t.waker_tgid = (id >> 32) as u32;
    read_comm(&mut t.waker_comm, Comm::Current);
    let task = unsafe { generated::bpf_get_current_task() } as *const u8;
    let flags: u32 = if task.is_null() || config!(task_flags_off) == 0 {
        0
    } else {
        unsafe { bpf_probe_read_kernel(task.add(config!(task_flags_off) as usize) as *const u32) }
            .unwrap_or(0)
    };
    t.waker_flags = waker_flags(t.waker_tid, flags);
}

/// Adds one blocked interval of `t` to the run of its waker (`ThreadStats::run`); a wait
/// another waker ended first adds the run so far to `WAKERS`.
#[inline(always)]
fn note_waker(t: &mut ThreadStats, ns: u64) {
    let tid = t.tid;
    let r = &mut t.run;
    if r.stats.count == 0 || r.waker_tid != t.waker_tid || r.syscall != t.waker_syscall {
        if r.stats.count != 0 {
            flush_run(tid, r);
        }
        r.waker_tid = t.waker_tid;
        r.syscall = t.waker_syscall;
        r.stats.waker_tgid = t.waker_tgid;
        r.stats.flags = t.waker_flags & !WAKER_PENDING;
        r.stats.comm = t.waker_comm;
        r.stats.blocked_ns = 0;
        r.stats.count = 0;
        r.stats.max_ns = 0;
        r.stats.hist = [0; RUNQ_HIST_SLOTS];
    }
    // A thread's wakeups come one at a time (it runs between them), so plain adds suffice.
    let w = &mut r.stats;
    w.blocked_ns += ns;
    w.count += 1;
    if ns > w.max_ns {
        w.max_ns = ns;
    }
    if let Some(c) = w.hist.get_mut(hist_slot(ns)) {
        *c += 1;
    }
}

/// Adds a finished run of thread `tid` to its entry in `WAKERS`, made on first use.
#[inline(always)]
fn flush_run(tid: u32, r: &WakerRun) {
    let key = WakerKey {
        tid,
        waker_tid: r.waker_tid,
        syscall: r.syscall,
        _pad: 0,
    };
    let Some(w) = WAKERS.get_ptr_mut(key) else {
        // By reference: the value is inserted from the thread's entry, not copied to the
        // stack (208 bytes of a 512-byte stack).
        #[allow(clippy::needless_borrows_for_generic_args)]
        let inserted = WAKERS.insert(&key, &r.stats, BPF_NOEXIST);
        if inserted.is_err() {
            count(Counter::WakerMapFull);
            anomaly!(
                "waker map full: {} ns of tid {}'s blocked time ended by tid {} not attributed",
                r.stats.blocked_ns,
                tid,
                r.waker_tid
            );
        }
        return;
    };
    let w = unsafe { &mut *w };
    w.blocked_ns += r.stats.blocked_ns;
    w.count += r.stats.count;
    if r.stats.max_ns > w.max_ns {
        w.max_ns = r.stats.max_ns;
    }
    for (c, n) in w.hist.iter_mut().zip(r.stats.hist.iter()) {
        *c += n;
    }
}

/// `set_task_cpu` on a target thread.
#[inline(always)]
pub fn on_migrate(tid: u32, tgid: u32, from: u32, to: u32, comm: Comm) {
    if from == to {
        return;
    }
    let Some(t) = thread(tid, tgid, comm) else {
        return;
    };
    let now = unsafe { bpf_ktime_get_ns() };
    t.migrations += 1;
    // A runnable thread moved by the load balancer now waits in another run queue, and its
    // wait is a migration's.
    if t.state == ThreadState::Runnable as u32 {
        t.flags |= FLAG_MOVED;
        if t.wait_cpu != NO_CPU {
            waiter_remove(t.wait_cpu, now);
            waiter_add(to, now);
            t.wait_cpu = to;
        }
    }
    let key = MigrationKey {
        tid,
        from_cpu: from,
        to_cpu: to,
        _pad: 0,
    };
    match MIGRATIONS.get_ptr_mut(key) {
        Some(n) => unsafe { *n += 1 },
        None => {
            if MIGRATIONS.insert(key, 1, BPF_NOEXIST).is_err() {
                count(Counter::MigrationMapFull);
                anomaly!(
                    "migration map full: tid {} CPU {} -> {} not noted",
                    tid,
                    from,
                    to
                );
            }
        }
    }
    if config!(transitions) != 0
        && let Some(mut out) = Batch::get()
    {
        out.push(&event(now, tid, EventKind::Migrate, to, from, 0));
    }
}

/// A new thread of the member `tgid`, created by `parent` (a thread of its own process, or of
/// the member that forked it).
#[inline(always)]
pub fn on_thread_new(tid: u32, tgid: u32, parent: u32, comm: Comm) {
    let Some(t) = thread(tid, tgid, comm) else {
        return;
    };
    let now = unsafe { bpf_ktime_get_ns() };
    t.flags |= FLAG_CREATED;
    t.created_ts_ns = now;
    t.parent_tid = parent;
    // Created now: nothing before this belongs to it.
    t.first_state = ThreadState::New as u32;
    t.first_ts_ns = now;
    enter(t, ThreadState::New, now);
    emit(&event(now, tid, EventKind::ThreadNew, NO_CPU, parent, 0));
}

/// The target's thread `old_tid` exec'd (`tid`, which is `current`, is its TID now). When it
/// was not the main thread, the kernel gave it the main thread's TID, which is the TGID, once
/// every other thread (the old main one too) had exited (`de_thread`, fs/exec.c): its own
/// entry ends here, and the main TID's, which that exit marked dead, goes on as this thread,
/// running. Without this the old TID stayed "running" to the end of the window and the main
/// thread, alive, showed as exited.
#[inline(always)]
pub fn on_exec(tid: u32, tgid: u32, old_tid: u32, task: *const u8) {
    let counts = counts_of(task);
    let now = unsafe { bpf_ktime_get_ns() };
    if old_tid != tid
        && let Some(t) = thread(old_tid, tgid, Comm::Current)
    {
        leave(t, now, ThreadState::Running);
        t.flags |= FLAG_EXITED | FLAG_EXECED;
        t.exited_ts_ns = now;
        enter(t, ThreadState::Dead, now);
    }
    let Some(t) = thread(tid, tgid, Comm::Current) else {
        return;
    };
    if old_tid != tid {
        // The dead main thread's interval is over; this one is running from now on.
        t.flags &= !FLAG_EXITED;
        t.exited_ts_ns = 0;
        t.wait_cpu = NO_CPU;
        if t.state == ThreadState::Unknown as u32 {
            t.first_state = ThreadState::Running as u32;
            t.first_ts_ns = now;
        }
        enter(t, ThreadState::Running, now);
        remember(t, counts.as_ref());
        emit(&event(now, tid, EventKind::Exec, NO_CPU, old_tid, 0));
    }
    // The new program's name.
    read_comm(&mut t.comm, Comm::Current);
}

/// The target thread `tid`, which is `current`, exits.
#[inline(always)]
pub fn on_thread_exit(tid: u32, tgid: u32) {
    let Some(t) = thread(tid, tgid, Comm::Current) else {
        return;
    };
    let now = unsafe { bpf_ktime_get_ns() };
    t.flags |= FLAG_EXITED;
    t.exited_ts_ns = now;
    // Keep the name it had last, for the report.
    read_comm(&mut t.comm, Comm::Current);
    emit(&event(now, tid, EventKind::ThreadExit, NO_CPU, 0, 0));
}
