//! The per-CPU count of target threads waiting in each run queue (`CPU_WAIT`), with the
//! target-waiting time pending on each CPU, which the task leaving it is charged with
//! (`owed`; `charge` in `mod.rs` bills a task outside the target).

use tracer_common::{CpuWait, ThreadState, ThreadStats};

use super::NO_CPU;
use crate::maps::CPU_WAIT;

/// Takes a thread off its CPU's waiters (it is no longer waiting where the probes thought).
#[inline(always)]
pub(super) fn stop_waiting(t: &mut ThreadStats, now: u64) {
    if t.state == ThreadState::Runnable as u32 {
        waiter_remove(t.wait_cpu, now);
    }
    t.wait_cpu = NO_CPU;
}

/// A timer callback or device interrupt handler of `kind` (`IRQ_*`) began (`inside`) or
/// ended on `cpu` (`irq.rs`).
#[inline(always)]
pub fn mark_interrupt(cpu: u32, kind: u32, inside: bool) {
    if let Some(w) = CPU_WAIT.get_ptr_mut(cpu) {
        // SAFETY: this CPU's entry, whose marks only this CPU writes.
        let w = unsafe { &mut *w };
        if inside {
            w.irq_bits |= kind;
            w.irq_last = kind;
        } else {
            w.irq_bits &= !kind;
        }
    }
}

/// The innermost kind of timer callback or device interrupt handler `cpu` is in (`IRQ_*`;
/// 0: none; where the last one entered has left, every kind still up): a wakeup it makes
/// under any is no task's doing.
#[inline(always)]
pub fn interrupt_bits(cpu: u32) -> u32 {
    let Some(w) = CPU_WAIT.get_ptr(cpu) else {
        return 0;
    };
    // SAFETY: a read of this CPU's entry.
    let (bits, last) = unsafe { ((*w).irq_bits, (*w).irq_last) };
    if bits & last != 0 { last } else { bits }
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
pub(super) fn waiter_add(cpu: u32, now: u64) {
    if let Some(w) = CPU_WAIT.get_ptr_mut(cpu) {
        let w = unsafe { &mut *w };
        settle(w, now);
        w.waiters += 1;
    }
}

#[inline(always)]
pub(super) fn waiter_remove(cpu: u32, now: u64) {
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
pub(super) fn owed(w: &mut CpuWait, now: u64) -> u64 {
    settle(w, now);
    let owed = w.pending_ns;
    w.pending_ns = 0;
    owed
}
