//! One hop across threads. A serving thread that hands work to another thread of the service
//! (an engine thread, a worker, another member process) and blocks until it is woken by it was
//! waiting for that thread: its blocked time is what that thread went through meanwhile. While
//! the other thread ran, the wait stays `blocked` (the work handed over, its waker named);
//! while it waited for a CPU, was in a collection, waited for a lock or for the GPU, the
//! serving thread's wait is put to that part, so a front end's tail caused by a slow engine
//! step reaches the engine step's cause. A lock wait ended by its holder is followed the same
//! way: what the holder went through while the waiter waited. One hop: the other thread's own
//! waits are not followed further.

use super::{Breakdown, Stalls, ThreadView, piece};
use crate::{
    analysis::{held::Held, wakers::WakerKind},
    recording::timeline::Interval,
};

/// What `waker` went through over `[s, e)`, the blocked piece of `tid` it ended, part by
/// part, with the parts' total; None when the waker is not a traced thread of the service (an
/// interrupt, a kernel thread, another process) or its timeline has nothing there.
fn waker_parts<'a>(
    waker: Option<&crate::analysis::wakers::WakerRef>,
    (tid, s, e): (u32, u64, u64),
    views: &dyn Fn(u32) -> Option<ThreadView<'a>>,
    ctx: (&Stalls, &Held),
) -> Option<(Breakdown, f64)> {
    let w = waker
        .filter(|w| matches!(w.kind, WakerKind::SameProcess | WakerKind::Member) && w.tid != tid)?;
    let v = views(w.tid)?;
    let (stalls, held) = ctx;
    let mut sum = Breakdown::default();
    let from = v.intervals.partition_point(|i: &Interval| i.end_ns <= s);
    for i in v.intervals[from..].iter().take_while(|i| i.start_ns < e) {
        let (is, ie) = (i.start_ns.max(s), i.end_ns.min(e));
        if ie <= is {
            continue;
        }
        let whole = (ie - is) as f64;
        let paused = held.paused(w.tid, is, ie) as f64;
        sum.runtime_pause_ns += paused;
        let rest = (whole - paused) / whole;
        // No queue on the other thread: its requests, if any, are not this one's.
        let (q, _) = piece(i, (is, ie), (is, is), &v, stalls, held, w.tid);
        sum.add_scaled(&q, rest);
    }
    let total: f64 = sum.values().iter().sum();
    (total > 0.0).then_some((sum, total))
}

/// The blocked piece `[s, e)` of `tid`, ended by `waker`, as the waker's parts over the same
/// stretch, scaled to `blocked` ns; None when the waker is no traced thread of the service.
pub(super) fn through_waker<'a>(
    waker: Option<&crate::analysis::wakers::WakerRef>,
    span: (u32, u64, u64),
    blocked: f64,
    views: &dyn Fn(u32) -> Option<ThreadView<'a>>,
    ctx: (&Stalls, &Held),
) -> Option<Breakdown> {
    let (mut sum, total) = waker_parts(waker, span, views, ctx)?;
    // Its running is the work handed over: the serving thread was blocked on it.
    sum.blocked_ns += sum.oncpu_ns + sum.queued_oncpu_ns;
    sum.oncpu_ns = 0.0;
    sum.queued_oncpu_ns = 0.0;
    let mut out = Breakdown::default();
    out.add_scaled(&sum, blocked / total);
    Some(out)
}

/// A lock wait `[s, e)` of `tid` that its holder `waker` ended (a sibling's futex wakeup), as
/// the holder's parts over the same stretch, scaled to `lock` ns. While the holder ran or was
/// off the CPU itself, the wait stays a lock wait: it held the lock, or was making what the
/// waiter waited for (a condition variable's producer). While it waited for a CPU, was in a
/// collection or waited for the GPU, the wait is put to that part: a holder held off its CPU
/// by a neighbour is the neighbour's doing, not the lock's.
pub(super) fn through_holder<'a>(
    waker: Option<&crate::analysis::wakers::WakerRef>,
    span: (u32, u64, u64),
    lock: f64,
    views: &dyn Fn(u32) -> Option<ThreadView<'a>>,
    ctx: (&Stalls, &Held),
) -> Option<Breakdown> {
    let (mut sum, total) = waker_parts(waker, span, views, ctx)?;
    sum.lock_wait_ns += sum.oncpu_ns + sum.queued_oncpu_ns + sum.blocked_ns;
    sum.oncpu_ns = 0.0;
    sum.queued_oncpu_ns = 0.0;
    sum.blocked_ns = 0.0;
    let mut out = Breakdown::default();
    out.add_scaled(&sum, lock / total);
    Some(out)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::{
        analysis::wakers::WakerRef,
        recording::{testutil::recording, timeline::State, waits::WaitKind},
    };

    const MS: u64 = 1_000_000;

    fn interval(start: u64, end: u64, state: State) -> Interval {
        Interval {
            start_ns: start,
            end_ns: end,
            state,
            cpu: Some(0),
            wait: (state == State::Runnable).then_some((WaitKind::Contention, 99)),
            woken: None,
        }
    }

    #[test]
    fn a_wait_for_a_preempted_sibling_is_its_run_queue_wait() {
        // Thread 10 blocks for 10 ms until thread 11 wakes it; meanwhile 11 waited 6 ms for a
        // CPU behind another task and ran 4 ms. 10's 10 ms: 6 run-queue contention, 4 blocked
        // on the work handed over.
        let w = [
            interval(0, 6 * MS, State::Runnable),
            interval(6 * MS, 10 * MS, State::Running),
        ];
        let rec = recording(vec![], vec![]);
        let held = Held::build(&rec, &BTreeMap::new());
        let stalls = Stalls::build(&BTreeMap::new());
        let view = |tid: u32| {
            (tid == 11).then_some(ThreadView {
                intervals: &w,
                syncs: &[],
                migrations: &[],
                slices: &[],
            })
        };
        let sibling = WakerRef {
            tid: 11,
            pid: 10,
            comm: "engine".into(),
            kind: WakerKind::SameProcess,
        };
        let h = through_waker(
            Some(&sibling),
            (10, 0, 10 * MS),
            10e6,
            &view,
            (&stalls, &held),
        )
        .expect("a sibling's wait");
        assert_eq!(h.runq_contention_ns, 6e6);
        assert_eq!(h.blocked_ns, 4e6);
        assert_eq!(h.oncpu_ns, 0.0);
        // An interrupt, or the thread itself, is no hop.
        let irq = WakerRef {
            kind: WakerKind::Interrupt,
            ..sibling.clone()
        };
        assert!(
            through_waker(Some(&irq), (10, 0, 10 * MS), 10e6, &view, (&stalls, &held)).is_none()
        );
        assert!(
            through_waker(
                Some(&sibling),
                (11, 0, 10 * MS),
                10e6,
                &view,
                (&stalls, &held)
            )
            .is_none()
        );
    }

    #[test]
    fn a_lock_wait_for_a_preempted_holder_is_its_run_queue_wait() {
        // Thread 10 waits 10 ms in a futex until thread 11 hands it over; meanwhile 11 waited
        // 5 ms for a CPU, ran 3 ms and was blocked 2 ms. The 10 ms: 5 run-queue contention, 5
        // a lock wait (the holder's running and its own blocked time).
        let w = [
            interval(0, 5 * MS, State::Runnable),
            interval(5 * MS, 8 * MS, State::Running),
            interval(8 * MS, 10 * MS, State::Blocked),
        ];
        let rec = recording(vec![], vec![]);
        let held = Held::build(&rec, &BTreeMap::new());
        let stalls = Stalls::build(&BTreeMap::new());
        let view = |tid: u32| {
            (tid == 11).then_some(ThreadView {
                intervals: &w,
                syncs: &[],
                migrations: &[],
                slices: &[],
            })
        };
        let holder = WakerRef {
            tid: 11,
            pid: 10,
            comm: "producer".into(),
            kind: WakerKind::SameProcess,
        };
        let h = through_holder(
            Some(&holder),
            (10, 0, 10 * MS),
            10e6,
            &view,
            (&stalls, &held),
        )
        .expect("a sibling's wait");
        assert_eq!(h.runq_contention_ns, 5e6);
        assert_eq!(h.lock_wait_ns, 5e6);
        assert_eq!(h.blocked_ns + h.oncpu_ns + h.queued_oncpu_ns, 0.0);
        // A timeout (an interrupt ended the wait) has no holder to follow.
        let irq = WakerRef {
            kind: WakerKind::Interrupt,
            ..holder
        };
        assert!(
            through_holder(Some(&irq), (10, 0, 10 * MS), 10e6, &view, (&stalls, &held)).is_none()
        );
    }
}
