//! Scheduler accounting shared by the tp_btf and the classic programs.
//!
//! Every target thread moves between Running, Runnable (waiting in a run queue) and Blocked. Each
//! handler closes the interval of the state being left and adds it to the thread's totals. The
//! rules follow the kernel's own counters (kernel/sched/core.c, `__schedule`): a switch-out is
//! voluntary (`nvcsw`) when the task was not preempted and its state was not TASK_RUNNING, and
//! involuntary (`nivcsw`) otherwise, which includes `sched_yield`; a migration (`nr_migrations`)
//! is a change of CPU in `set_task_cpu`, whose tracepoint also fires when the CPU stays the same.
//!
//! The state machine is here, with `charge`, which bills a task outside the target for the
//! waiting it caused (`on_switch` is its only caller); the rest is split by concern: `entry` (a
//! thread's entry, found or made on first sight), `counts` (reconciliation with the task's own
//! counters, where a `task_struct` is at hand), `throttle` (CFS bandwidth throttling of a wait),
//! `cpu_wait` (the per-CPU count of waiting target threads), `wakeup` (wakeups and their wakers)
//! and `lifecycle` (forks, cgroup moves, migrations, thread creation, exec and exit). `charge`
//! stays here because in `cpu_wait` it put its `Preemptor` elsewhere in the switch programs'
//! stack frames: rustc orders a unit's functions by symbol name, module path included, and
//! LLVM inlines in that order. As split, the BPF instructions are those of the single file.

mod counts;
mod cpu_wait;
mod entry;
mod lifecycle;
mod throttle;
mod wakeup;

use aya_ebpf::helpers::{bpf_ktime_get_ns, bpf_probe_read_kernel, generated};
use tracer_common::{
    COMM_LEN, Counter, Event, EventKind, FLAG_EXITED, FLAG_HANDOFF, FLAG_MOVED, FLAG_PARTNER,
    FLAG_REPAIRED, FLAG_RUNNABLE_UNSURE, FLAG_THROTTLE_BASE, FLAG_WOKEN, Preemptor,
    SWITCH_RUNNABLE_UNSURE, THROTTLED_SHIFT, ThreadState, ThreadStats, WAIT_CODE_SHIFT,
    WAKER_KTHREAD, WaitCode, hist_slot,
};

use crate::maps::{Batch, CPU_WAIT, PREEMPTORS, config, count, sends_when_idle};
use counts::{
    blocked_by_counts, counts_agree, counts_of, reconcile_in, remember, repair_unseen_switch_in,
    settle_repaired,
};
pub use cpu_wait::mark_interrupt;
use cpu_wait::{owed, waiter_add, waiter_remove};
pub use entry::Comm;
use entry::{existing, read_comm, thread};
pub use lifecycle::{
    on_cgroup_attach, on_exec, on_migrate, on_process_fork, on_thread_exit, on_thread_new,
};
use throttle::{THROTTLED_MIN_WAIT_NS, note_throttle_base, throttled_permille};
pub use wakeup::{note_current_waker, on_wakeup, on_waking, on_waking_other, waker_flags};

const BPF_NOEXIST: u64 = 1;
const NO_CPU: u32 = u32::MAX;

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
    /// The task switching out (tp_btf; null for classic tracepoints).
    pub prev_task: *const u8,
}

/// `Switch::prev_state` when the tracepoint does not pass it.
pub const STATE_UNKNOWN: u64 = u64::MAX;

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
    if let Some(t) = prev.as_deref_mut() {
        switch_out(t, cpu, now, sw, &mut out);
    }
    let mut next = if sw.next_target {
        thread(sw.next_pid, sw.next_tgid, sw.next_comm)
    } else {
        None
    };
    // The two threads' handoff state, between the two accounts and kept in their entries,
    // not carried in variables: a pointer or a flag live across the counter reads in
    // `switch_out` or `switch_in` multiplies the states the verifier walks (with counters
    // on, the program no longer loaded).
    match (prev, next.as_deref_mut()) {
        (Some(p), Some(n)) => {
            // `prev`, left runnable, gave the CPU to the thread it has just woken: a handoff
            // if that one keeps it until `prev` gets it back.
            if p.state == ThreadState::Runnable as u32
                && n.flags & FLAG_WOKEN != 0
                && n.state == ThreadState::Runnable as u32
                && n.waker_tid == sw.prev_pid
            {
                p.flags |= FLAG_HANDOFF;
            }
            // `prev` blocks as `next`'s partner: the part of `next`'s wait since `prev` began
            // its slice is a handoff. Nor where `prev`'s slice began before the recording
            // (its start 0: the whole wait would have counted).
            if blocks(sw) && p.slice_start_ns != 0 && linked(n, sw.prev_pid, p.waker_tid == n.tid) {
                n.flags |= FLAG_PARTNER;
                n.partner_since_ns = p.slice_start_ns;
            }
        }
        // The same with a partner outside the target (a client or a front end the target set
        // leaves out), which has no entry: `prev` woke it (`woke_tid`), and its slice began at
        // the CPU's last timed switch (`CpuWait::switched_ns`; one before the wait began is
        // cut to the wait at the switch-in).
        (Some(p), None) if !sw.next_target => {
            if p.state == ThreadState::Runnable as u32
                && p.woke_tid != 0
                && p.woke_tid == untracked_next_pid(sw)
            {
                p.flags |= FLAG_HANDOFF;
            }
        }
        // An outside task is a partner only if each woke the other last, and not if it blocks
        // in a sleep it asked for: `sched_waking` in an interrupt names whatever task it
        // interrupted as the waker, and a neighbour whose timer fires while `next` runs (or
        // that runs while `next`'s timer fires, its waker then for as long as `next` does not
        // block again) would otherwise pass for one, its bursts for handoffs. Nor is a kernel
        // thread one.
        (None, Some(n)) if !sw.prev_target => {
            if blocks(sw)
                && n.flags & (FLAG_HANDOFF | FLAG_WOKEN) != 0
                && n.woke_tid == sw.prev_pid
                && n.waker_tid == sw.prev_pid
                && n.waker_flags & WAKER_KTHREAD == 0
                && !asleep(sw.prev_task)
                && let Some(w) = wait
                && unsafe { (*w).switched_ns } != 0
            {
                n.flags |= FLAG_PARTNER;
                n.partner_since_ns = unsafe { (*w).switched_ns };
            }
        }
        _ => {}
    }
    if let Some(t) = next {
        switch_in(t, cpu, now, sw, &mut out);
    }
    if let Some(w) = wait {
        // SAFETY: this CPU's entry. Other CPUs' wakeups update its waiters (`waiter_add`); only
        // this CPU's switches write these two fields.
        unsafe {
            (*w).switched_ns = now;
            (*w).running_tid = if sw.next_target { sw.next_pid } else { 0 };
        }
    }
    out.age(sw.next_pid == 0 && sends_when_idle(cpu));
}

/// The TID of the task switching in, when it is outside the target: tp_btf's `Switch` leaves
/// it 0 then (a load every switch would pay for), so it is read from the task here, only when
/// needed.
#[inline(always)]
fn untracked_next_pid(sw: &Switch) -> u32 {
    if sw.next_pid != 0 || sw.next_task.is_null() {
        return sw.next_pid;
    }
    // SAFETY: the tracepoint's own task argument, typed (BTF), at the pid's offset, as
    // tp_btf.rs reads it.
    unsafe {
        core::ptr::read_volatile(sw.next_task.add(config!(task_pid_off) as usize) as *const u32)
    }
}

/// Whether `task` (a `task_struct` the verifier knows the type of; null for classic
/// tracepoints, which then cannot tell) is in a sleep it asked for (`Config::sleep_syscalls`),
/// from its saved registers (Linux 5.15+). A helper call, made only for an outside task found to
/// be a partner otherwise.
#[inline(always)]
fn asleep(task: *const u8) -> bool {
    let off = config!(regs_syscall_off);
    // The offset is a constant for the verifier: before 5.15, which lacks the helper, the
    // call below is never reached (as in `sched_waking_btf`).
    if task.is_null() || off == u32::MAX {
        return false;
    }
    let regs = unsafe { generated::bpf_task_pt_regs(task as *mut _) } as *const u8;
    if regs.is_null() {
        return false;
    }
    // SAFETY: the helper's typed `pt_regs`, at the system call number's offset (BTF).
    let nr = unsafe { core::ptr::read_volatile(regs.add(off as usize) as *const u64) } as u32;
    let sleeps = config!(sleep_syscalls);
    nr == sleeps[0] || nr == sleeps[1]
}

/// Whether the task switching out blocks (where the tracepoint says: not on tp_btf before
/// Linux 5.18, where no wait is a handoff).
#[inline(always)]
fn blocks(sw: &Switch) -> bool {
    !sw.preempt && sw.prev_state != 0 && sw.prev_state != STATE_UNKNOWN
}

/// Whether `prev` (TID `prev_pid`, which `t` woke last if `woken_by_t`), blocking as `t` gets
/// the CPU, is the task `t` exchanges work with: `t` had woken it and was preempted by it
/// (`FLAG_HANDOFF`), or it had woken `t` here and kept running (`FLAG_WOKEN`: a sync wakeup
/// puts the wakee on the waker's CPU, and a socket's reader wakes its writer). Then the part
/// of `t`'s wait that `prev`'s last slice covers is a handoff (`wait_kind_bits`): the exchange
/// itself, not a CPU denied, as `t` gets the CPU when its partner blocks, once its part is
/// done. A partner preempted at the end (a busy thread that woke `t` and ran on) is none.
#[inline(always)]
fn linked(t: &ThreadStats, prev_pid: u32, woken_by_t: bool) -> bool {
    (t.flags & FLAG_HANDOFF != 0 && woken_by_t)
        || (t.flags & FLAG_WOKEN != 0 && t.waker_tid == prev_pid)
}

#[inline(always)]
fn switch_out(t: &mut ThreadStats, cpu: u32, now: u64, sw: &Switch, out: &mut Batch) {
    t.slice_start_ns = t.state_ts_ns;
    // A wait that begins here began with no wakeup (nor handoff, until `on_switch` says).
    t.flags &= !(FLAG_WOKEN | FLAG_HANDOFF);
    let mut slice = leave(t, now, ThreadState::Running);
    if t.flags & FLAG_REPAIRED != 0 {
        slice = settle_repaired(t, sw.prev_task, slice);
    }
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

#[inline(always)]
fn switch_in(t: &mut ThreadStats, cpu: u32, now: u64, sw: &Switch, out: &mut Batch) {
    t.flags &= !FLAG_RUNNABLE_UNSURE;
    // A new slice: what it wakes is noted afresh (`woke_tid`: kept through the wait that
    // follows it, where the partner is checked).
    t.woke_tid = 0;
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
    let handoff = if t.flags & FLAG_PARTNER != 0 {
        now.saturating_sub(t.partner_since_ns).min(waited)
    } else {
        0
    };
    let kind = wait_kind_bits(t, sw, waited, handoff);
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
/// `WaitCode` and throttled share, or, for a handoff, the share of the wait (its last
/// `handoff` ns) that the partner held the CPU (`linked`). Ends the wait's flags.
#[inline(always)]
fn wait_kind_bits(t: &mut ThreadStats, sw: &Switch, waited: u64, handoff: u64) -> u32 {
    // The same rules as userspace's WaitTracker, which needs the events in time order. A
    // thread moved while it waited sits in another CPU's group queue, whose throttled time
    // is another count: its throttled share is not known. A wait too short to hold a
    // throttle worth naming skips the read (most waits of a busy server: +9 ns a switch-in
    // on the pipe benchmark when read at every one).
    let moved = t.flags & FLAG_MOVED != 0;
    let share = if !moved && handoff != 0 {
        // The partner's part, where a contention wait keeps its throttled part (`handoff` is
        // at most `waited`, so never 0 here: `checked_div` only keeps a panic path out of
        // the program, which the verifier rejects).
        (handoff * 1000).checked_div(waited).unwrap_or(0) as u32
    } else if !moved && waited >= THROTTLED_MIN_WAIT_NS {
        throttled_permille(t, sw.next_task, waited)
    } else {
        0
    };
    let code = if moved {
        WaitCode::Migration
    } else if handoff != 0 {
        WaitCode::Handoff
    } else if sw.prev_pid == 0 {
        WaitCode::IdleCpu
    } else {
        WaitCode::Contention
    };
    t.flags &= !(FLAG_MOVED | FLAG_THROTTLE_BASE | FLAG_HANDOFF | FLAG_WOKEN | FLAG_PARTNER);
    (code as u32) << WAIT_CODE_SHIFT | share << THROTTLED_SHIFT
}
