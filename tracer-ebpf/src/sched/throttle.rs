//! CFS bandwidth throttling of a target thread's run-queue wait: the group queue's throttled
//! time, read where the wait begins and ends (tp_btf, where BTF gives the offsets), says what
//! share of the wait was a throttle rather than contention.

use tracer_common::{FLAG_THROTTLE_BASE, ThreadStats};

use crate::maps::config;

/// Waits shorter than this are not looked at for throttling at their end: at most this much of
/// one could have been a throttle (which lasts to the end of its quota period, milliseconds),
/// and left as contention it is noise beside the throttles that matter.
pub(super) const THROTTLED_MIN_WAIT_NS: u64 = 100_000;

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
pub(super) fn note_throttle_base(t: &mut ThreadStats, task: *const u8) {
    t.throttled_at_wait = throttled_ns(task);
    t.flags |= FLAG_THROTTLE_BASE;
}

/// The share of the wait of `waited` ns that `task` ends now, in thousandths, that its group
/// queue was throttled: what the queue's throttled time grew by meanwhile. (A throttle already
/// under way when the wait began is counted whole at its end, so the growth can exceed the
/// wait: the share is then the whole.)
#[inline(always)]
pub(super) fn throttled_permille(t: &ThreadStats, task: *const u8, waited: u64) -> u32 {
    if t.flags & FLAG_THROTTLE_BASE == 0 {
        return 0;
    }
    let grew = throttled_ns(task).wrapping_sub(t.throttled_at_wait);
    if (grew as i64) <= 0 || waited == 0 {
        return 0;
    }
    (grew.min(waited) * 1000 / waited) as u32
}
