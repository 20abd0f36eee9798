//! Reconciliation with a thread's own counters (`nvcsw`, `nivcsw`, `se.sum_exec_runtime`,
//! `se.nr_migrations`), read from its `task_struct` where the program has one (tp_btf): what
//! the probes missed (a switch or a move no tracepoint reported) is found and accounted here,
//! apart from the state machine, whose common path only compares the counters inline.

use tracer_common::{
    Counter, FLAG_REPAIRED, FLAG_RUNNABLE_UNSURE, FLAG_SEEN, ThreadState, ThreadStats,
};

use super::cpu_wait::stop_waiting;
use super::{NO_CPU, enter, leave};
use crate::maps::{CPU_WAIT, add, config, count};

/// A task's own counters, read from its task_struct where the program has one (tp_btf).
#[derive(Clone, Copy)]
pub(super) struct TaskCounts {
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
pub(super) fn counts_of(task: *const u8) -> Option<TaskCounts> {
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

/// Keeps the thread's own counters, less what the probes have counted so far: at its next
/// reading, whatever the counters moved by beyond what the probes counted meanwhile was never
/// reported. (Offsets, not the counters themselves: the probes' own counting in between,
/// switch-outs included, then needs no reading of its own.)
#[inline(always)]
pub(super) fn remember(t: &mut ThreadStats, c: Option<&TaskCounts>) {
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
pub(super) fn unseen(t: &mut ThreadStats, c: Option<&TaskCounts>) -> Option<(i64, bool)> {
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

/// At the switch-out that follows `repair_unseen_switch_in`, where the task's own counters can
/// be read (tp_btf: `se.sum_exec_runtime` is brought up to date before the tracepoint, by
/// `update_curr` as `prev` is dequeued or put back), `correct_repaired` now rather than at the
/// thread's next reading: the switch-out record then carries the slice the thread really ran,
/// and the timeline, rebuilt from the records, places the rest of the interval as the totals
/// do (waiting behind the untraced task, or blocked). Returns `slice` corrected. Not inlined,
/// for the verifier, as `reconcile_in`.
#[inline(never)]
pub(super) fn settle_repaired(t: &mut ThreadStats, task: *const u8, slice: u64) -> u64 {
    let Some(c) = counts_of(task) else {
        return slice;
    };
    if t.flags & FLAG_SEEN == 0 {
        return slice;
    }
    let before = t.oncpu_ns;
    correct_repaired(t, &c);
    let moved = t.oncpu_ns.wrapping_sub(before) as i64;
    (slice as i64).saturating_add(moved).max(0) as u64
}

/// Accounts what `unseen` found over the interval since the thread's last event: the time it
/// ran, up to the interval's length; or, when more had been accounted as running than it ran,
/// that excess moved off the CPU. Returns the rest of the interval, spent off a CPU.
#[inline(always)]
pub(super) fn account_unseen(t: &mut ThreadStats, ran: i64, now: u64) -> u64 {
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

/// Whether a switch-out the tracepoint passed no `prev_state` for was the thread blocking
/// (a voluntary switch). `__schedule` counts the switch in the task's own `nvcsw` or `nivcsw`
/// before `trace_sched_switch` (since Linux 3.x), so where the thread's counters were read at
/// its last switch-in, the voluntary count having moved past the probes' own says so exactly.
/// Otherwise (its first switch-out since the attach) the run queue does: a task that blocks is
/// taken off it before the tracepoint, under the run queue's lock, which a concurrent wakeup
/// also takes to put it back; this misses only a sleep that a pending signal cancelled
/// (counted voluntary, left on the queue). Not inlined, for the verifier, as `reconcile_in`.
#[inline(never)]
pub(super) fn blocked_by_counts(t: &ThreadStats, task: *const u8) -> bool {
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

/// Whether the thread's own counters `c` say nothing `unseen` would act on: read before, no
/// repair pending, and no switch or migration beyond what the probes counted. The common case,
/// tested inline so that a switch-in makes no call for it.
#[inline(always)]
pub(super) fn counts_agree(t: &ThreadStats, c: &TaskCounts) -> bool {
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
pub(super) fn reconcile_in(t: &mut ThreadStats, c: &TaskCounts, now: u64) {
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
/// Where the thread's own counters can be read, the switch-out that follows moves back off the
/// CPU what it did not run (`settle_repaired`).
/// A thread the probes thought blocked switches out too: its wakeup went unreported as well
/// (PID 1's wakeups on our VMs): blocked until now, then a slice the thread's own run time,
/// read at its next traced event, gives back (measured: 2 of 156 slices of a worker, with no
/// loss said, before).
#[inline(never)]
pub(super) fn repair_unseen_switch_in(t: &mut ThreadStats, now: u64) {
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
    // right by the thread's own counters there (`settle_repaired`) or, where they cannot be
    // read then, at their next reading (`correct_repaired`).
    t.state = ThreadState::Running as u32;
    t.flags |= FLAG_REPAIRED;
}

/// A thread the probes took for runnable since a switch-out that reported it so is woken: it
/// had blocked (a task on its run queue gets no wakeup: try_to_wake_up returns early for a
/// running state), and a classic `sched_switch` before Linux 5.18 re-read its state after a
/// wakeup from another CPU had begun (TASK_WAKING reads as runnable). The switch was
/// voluntary, as the kernel counted it, and the interval since is blocked, which the wakeup
/// now ends. Its CPU loses a waiter; what that CPU's tasks were charged for it meanwhile
/// stays (a few microseconds: the wakeup was already under way at the switch).
#[inline(never)]
pub(super) fn blocked_after_all(t: &mut ThreadStats) {
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
