//! Wakeups of target threads (`sched_wakeup`, `sched_wakeup_new`) and their wakers
//! (`sched_waking`, in the waker's context): the blocked interval a wakeup ends is charged to
//! its waker in `WAKERS`, by thread, waker and system call (and, for a wait no task ended,
//! whether a timer did).

use aya_ebpf::helpers::{bpf_get_current_pid_tgid, bpf_probe_read_kernel, generated};
use tracer_common::{
    Counter, EventKind, FLAG_RUNNABLE_UNSURE, FLAG_WOKEN, IRQ_HANDLER, PF_KTHREAD, RUNQ_HIST_SLOTS,
    ThreadState, ThreadStats, WAKER_IDLE, WAKER_KTHREAD, WAKER_PENDING, WAKER_TIMER, WakerRun,
    WakerStats, hist_slot,
};

use super::counts::{account_unseen, blocked_after_all, counts_of, remember, unseen};
use super::cpu_wait::{interrupt_bits, stop_waiting, waiter_add};
use super::throttle::note_throttle_base;
use super::{BPF_NOEXIST, Clock, Comm, enter, event, existing, leave, read_comm, thread};
use crate::maps::{Batch, CPU_WAIT, WAKERS, config, count};
use crate::zero::zero_words;
use core::mem::offset_of;

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
    // The wait begins with this wakeup: a preemption of its waker by it may be a handoff.
    if noted && !new {
        t.flags |= FLAG_WOKEN;
    } else {
        t.flags &= !FLAG_WOKEN;
    }
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

/// `sched_waking` on `cpu` of a target thread, in the waker's context: who is waking it
/// (`noted` fills in `waker_tid`, `waker_tgid`, `waker_flags` and `waker_comm`; not called in a
/// timer callback or device interrupt, which only happened to hit `current`: `irq.rs`) and,
/// where known, the system call it is blocked in (its number plus one; 0: unknown), for the
/// wakeup that follows.
#[inline(always)]
pub fn on_waking(
    tid: u32,
    tgid: u32,
    comm: Comm,
    (cpu, syscall): (u32, u32),
    noted: impl FnOnce(&mut ThreadStats),
) {
    let Some(t) = thread(tid, tgid, comm) else {
        return;
    };
    let bits = interrupt_bits(cpu);
    if bits != 0 {
        note_interrupt_waker(t, bits);
    } else {
        noted(t);
    }
    t.waker_syscall = syscall;
    t.waker_flags |= WAKER_PENDING;
}

/// `sched_waking` on `cpu` of a task outside the target (TID `wakee`): if `current` is a
/// target thread (`CpuWait::running_tid`, kept by the switch programs: `current`'s ids from a
/// helper would cost every wakeup of the host a call), the task it woke in this slice, its
/// partner should that task take the CPU from it and block as it gets the CPU back
/// (`FLAG_HANDOFF`). The wakee has no entry to note its waker in, so the waker notes its wakee.
/// Not in a timer callback or device interrupt, which only happened to hit `current`.
#[inline(always)]
pub fn on_waking_other(cpu: u32, wakee: u32) {
    let Some(w) = CPU_WAIT.get_ptr(cpu) else {
        return;
    };
    // SAFETY: this CPU's entry, whose running thread only this CPU's switches write.
    let tid = unsafe { (*w).running_tid };
    // Found, not made: the running thread's switch-in made its entry, unless its map was full.
    // And still running here: a thread that left the target set without a switch the
    // programs timed is not `current` any more.
    if tid != 0
        && let Some(t) = existing(tid)
        && t.state == ThreadState::Running as u32
        && t.last_cpu == cpu
        // SAFETY: this CPU's entry, whose marks only this CPU writes.
        && unsafe { (*w).irq_bits } == 0
    {
        t.woke_tid = wakee;
    }
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

/// Notes an interrupt (`IRQ_*` bits `bits`, the innermost: `interrupt_bits`) as the waker of
/// `t`: no task, as for a wakeup on an idle CPU; the task the interrupt hit did not ask for
/// it. A timer's unless a device's handler is innermost.
#[inline(always)]
fn note_interrupt_waker(t: &mut ThreadStats, bits: u32) {
    t.waker_tid = 0;
    t.waker_tgid = 0;
    t.waker_flags = if bits & IRQ_HANDLER == 0 {
        WAKER_IDLE | WAKER_TIMER
    } else {
        WAKER_IDLE
    };
    t.waker_comm = [0; 16];
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

/// A run's totals and histogram: the words of `WakerStats` from `blocked_ns` on.
type Tail = [u64; (size_of::<WakerStats>() - offset_of!(WakerStats, blocked_ns)) / 8];
const _: () = assert!(
    offset_of!(WakerStats, hist) + size_of::<[u32; RUNQ_HIST_SLOTS]>() == size_of::<WakerStats>()
        && offset_of!(WakerStats, max_ns) + 8 == offset_of!(WakerStats, hist)
        && offset_of!(WakerStats, count) + 8 == offset_of!(WakerStats, max_ns)
        && offset_of!(WakerStats, blocked_ns) + 8 == offset_of!(WakerStats, count)
        && offset_of!(WakerStats, blocked_ns).is_multiple_of(8)
        && size_of::<WakerStats>().is_multiple_of(8)
        && align_of::<WakerStats>() == 8
);

/// Adds one blocked interval of `t` to the run of its waker (`ThreadStats::run`); a wait
/// another waker ended first adds the run so far to `WAKERS`.
#[inline(always)]
fn note_waker(t: &mut ThreadStats, ns: u64) {
    let tid = t.tid;
    let r = &mut t.run;
    // The same waker: the same task, system call, and for no task, timer or not.
    let other = r.waker_tid != t.waker_tid
        || r.syscall != t.waker_syscall
        || (r.stats.flags ^ t.waker_flags) & WAKER_TIMER != 0;
    if r.stats.count == 0 || other {
        if r.stats.count != 0 {
            flush_run(tid, r);
        }
        r.waker_tid = t.waker_tid;
        r.syscall = t.waker_syscall;
        r.stats.waker_tgid = t.waker_tgid;
        r.stats.flags = t.waker_flags & !WAKER_PENDING;
        r.stats.comm = t.waker_comm;
        // The totals and the histogram, a word at a time: assigned, they were a byte-by-byte
        // memset of 168 bytes at each change of waker (`zero.rs`).
        // SAFETY: from `blocked_ns` to the end of the stats: whole words, 8-aligned (`Tail`).
        unsafe {
            let from = (&raw mut r.stats).byte_add(offset_of!(WakerStats, blocked_ns));
            zero_words(from.cast::<Tail>());
        }
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
    let key = r.key(tid);
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
