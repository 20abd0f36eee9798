//! One hop across threads. A serving thread that hands work to another thread of the service
//! (an engine thread, a worker, another member process) and blocks until it is woken by it was
//! waiting for that thread: its blocked time is what that thread went through meanwhile. While
//! the other thread ran, the wait stays `blocked` (the work handed over, its waker named);
//! while it waited for a CPU, was in a collection, waited for a lock or for the GPU, the
//! serving thread's wait is put to that part, so a front end's tail caused by a slow engine
//! step reaches the engine step's cause. A lock wait ended by its holder is followed the same
//! way: what the holder went through while the waiter waited. One hop: the other thread's own
//! waits are not followed further.

use super::{Breakdown, HolderTime, Stalls, ThreadView, add_holder, piece};
use crate::{
    analysis::{
        held::{Held, LockWait},
        wakers::{WakerKind, WakerRef},
    },
    recording::timeline::Interval,
};

/// What a hop found: the waiting thread's piece as the other thread's parts, and who held
/// the locks of its `lock_wait_ns` (ns each, adding up to it).
pub(super) struct Hop {
    pub parts: Breakdown,
    pub holders: Vec<HolderTime>,
}

impl Hop {
    fn scaled(mut self, f: f64) -> Self {
        let mut parts = Breakdown::default();
        parts.add_scaled(&self.parts, f);
        self.holders.iter_mut().for_each(|h| *h = h.scaled(f));
        Self {
            parts,
            holders: self.holders,
        }
    }
}

/// What `waker` went through over `[s, e)`, the blocked piece of `tid` it ended, part by
/// part (with the holders of its own lock waits), and the parts' total; None when the waker is
/// not a traced thread of the service (an interrupt, a kernel thread, another process) or its
/// timeline has nothing there.
fn waker_parts<'a>(
    w: &WakerRef,
    (tid, s, e): (u32, u64, u64),
    views: &dyn Fn(u32) -> Option<ThreadView<'a>>,
    ctx: (&Stalls, &Held),
) -> Option<(Hop, f64)> {
    if !matches!(w.kind, WakerKind::SameProcess | WakerKind::Member) || w.tid == tid {
        return None;
    }
    let v = views(w.tid)?;
    let (stalls, held) = ctx;
    let mut sum = Breakdown::default();
    let mut holders = Vec::new();
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
        let (q, lock) = piece(i, (is, ie), (is, is), &v, stalls, held, w.tid);
        // The other thread's own lock wait keeps its holders: a front end waiting for an
        // engine thread that waited for a lock was held up by that lock's holder.
        if let Some(l) = lock {
            for (t, ns) in l.holders {
                add_holder(
                    &mut holders,
                    HolderTime::of(t, ns * q.lock_wait_ns / whole * rest, l.long),
                );
            }
        }
        sum.add_scaled(&q, rest);
    }
    let total: f64 = sum.values().iter().sum();
    (total > 0.0).then_some((
        Hop {
            parts: sum,
            holders,
        },
        total,
    ))
}

/// The blocked piece `[s, e)` of `tid`, ended by `waker`, as the waker's parts over the same
/// stretch, scaled to `blocked` ns; None when the waker is no traced thread of the service.
pub(super) fn through_waker<'a>(
    waker: Option<&WakerRef>,
    span: (u32, u64, u64),
    blocked: f64,
    views: &dyn Fn(u32) -> Option<ThreadView<'a>>,
    ctx: (&Stalls, &Held),
) -> Option<Hop> {
    let (mut hop, total) = waker_parts(waker?, span, views, ctx)?;
    // Its running is the work handed over: the serving thread was blocked on it.
    let p = &mut hop.parts;
    p.blocked_ns += p.oncpu_ns + p.queued_oncpu_ns;
    p.oncpu_ns = 0.0;
    p.queued_oncpu_ns = 0.0;
    Some(hop.scaled(blocked / total))
}

/// A lock wait `[s, e)` of `tid` that its holder `waker` ended (a sibling's futex wakeup), as
/// the holder's parts over the same stretch, scaled to `lock` ns. While the holder ran or was
/// off the CPU itself, the wait stays a lock wait held by it: it held the lock, or was making
/// what the waiter waited for (a condition variable's producer); while it waited for a lock
/// itself, that lock's holders take their part. While it waited for a CPU, was in a collection
/// or waited for the GPU, the wait is put to that part: a holder held off its CPU by a
/// neighbour is the neighbour's doing, not the lock's.
pub(super) fn through_holder<'a>(
    waker: Option<&WakerRef>,
    span: (u32, u64, u64),
    (lock, long): (f64, bool),
    views: &dyn Fn(u32) -> Option<ThreadView<'a>>,
    ctx: (&Stalls, &Held),
) -> Option<Hop> {
    let w = waker?;
    let (mut hop, total) = waker_parts(w, span, views, ctx)?;
    let p = &mut hop.parts;
    let own = p.oncpu_ns + p.queued_oncpu_ns + p.blocked_ns;
    p.lock_wait_ns += own;
    p.oncpu_ns = 0.0;
    p.queued_oncpu_ns = 0.0;
    p.blocked_ns = 0.0;
    add_holder(&mut hop.holders, HolderTime::of(w.tid, own, long));
    Some(hop.scaled(lock / total))
}

/// The piece `[s, e)` of `tid`'s blocked interval, split into `q` by `piece`, followed to the
/// thread that ended it: a lock wait to its holder, other blocked time to its waker. Returns
/// who held the piece's lock waits, ns each (adding up to `q.lock_wait_ns`).
pub(super) fn follow<'a>(
    q: &mut Breakdown,
    lock: Option<LockWait>,
    waker: Option<&WakerRef>,
    span: (u32, u64, u64),
    views: &dyn Fn(u32) -> Option<ThreadView<'a>>,
    ctx: (&Stalls, &Held),
) -> Vec<HolderTime> {
    if let Some(lock) = lock {
        // A timed wait's timeout has no holder to follow: it stays, held by the threads that
        // ran, by their time.
        if let Some(h) = lock
            .by_holder
            .then(|| through_holder(waker, span, (q.lock_wait_ns, lock.long), views, ctx))
            .flatten()
        {
            q.lock_wait_ns = 0.0;
            q.add_scaled(&h.parts, 1.0);
            return h.holders;
        }
        let whole = span.2.saturating_sub(span.1).max(1) as f64;
        let mut holders = Vec::new();
        for (tid, ns) in lock.holders {
            add_holder(
                &mut holders,
                HolderTime::of(tid, ns * q.lock_wait_ns / whole, lock.long),
            );
        }
        return holders;
    }
    if q.blocked_ns > 0.0
        && let Some(h) = through_waker(waker, span, q.blocked_ns, views, ctx)
    {
        q.blocked_ns = 0.0;
        q.add_scaled(&h.parts, 1.0);
        return h.holders;
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::recording::{testutil::recording, timeline::State, waits::WaitKind};

    const MS: u64 = 1_000_000;

    fn interval(start: u64, end: u64, state: State) -> Interval {
        Interval {
            wait: (state == State::Runnable).then_some((WaitKind::Contention, 99)),
            ..Interval::plain(start, end, state, Some(0))
        }
    }

    /// Thread 11's timeline `w`, the only one there is.
    fn only_11<'a>(w: &'a [Interval]) -> impl Fn(u32) -> Option<ThreadView<'a>> {
        move |tid| {
            (tid == 11).then_some(ThreadView {
                intervals: w,
                syncs: &[],
                migrations: &[],
                slices: &[],
            })
        }
    }

    /// Thread 11 of process `pid`, as the waker of a thread of the same process.
    fn thread_11(pid: u32, comm: &str) -> WakerRef {
        WakerRef {
            tid: 11,
            pid,
            comm: comm.into(),
            kind: WakerKind::SameProcess,
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
        let view = only_11(&w);
        let sibling = thread_11(10, "engine");
        let h = through_waker(
            Some(&sibling),
            (10, 0, 10 * MS),
            10e6,
            &view,
            (&stalls, &held),
        )
        .expect("a sibling's wait")
        .parts;
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
    fn a_handoff_is_blocked_on_its_partner_and_the_rest_of_the_wait_contention() {
        // Thread 10 woke thread 11 and was preempted by it; 11 ran 4 ms and blocked, and 10
        // got its CPU back. The kernel calls the 4 ms a handoff: 10 waited for 11's work, as
        // if blocked until 11 woke it, not for a CPU.
        let own = [Interval {
            wait: Some((WaitKind::Handoff, 11)),
            handoff_ns: 4 * MS,
            ..Interval::plain(0, 4 * MS, State::Runnable, Some(0))
        }];
        let threads = vec![
            crate::recording::testutil::thread(10, 0, 4 * MS, &[4 * MS]),
            crate::recording::testutil::thread(11, 4 * MS, 0, &[]),
        ];
        let rec = recording(threads, vec![]);
        let held = Held::build(&rec, &BTreeMap::new());
        let stalls = Stalls::build(&BTreeMap::new());
        let partner = held.woken_by(10, &own[0]).expect("the partner");
        assert_eq!((partner.tid, partner.kind), (11, WakerKind::SameProcess));
        let mine = ThreadView {
            intervals: &own,
            syncs: &[],
            migrations: &[],
            slices: &[],
        };
        let (q, _) = piece(&own[0], (0, 4 * MS), (0, 0), &mine, &stalls, &held, 10);
        assert_eq!((q.blocked_ns, q.runq_contention_ns), (4e6, 0.0));
        // 11 was preempted by another task during the wait: only its last slice, the wait's
        // last 1 ms, is the handoff; the 3 ms before, behind the other task, contention. A
        // request's piece of it counts what it covers of each.
        let split = Interval {
            handoff_ns: MS,
            ..own[0]
        };
        let (q, _) = piece(&split, (0, 4 * MS), (0, 0), &mine, &stalls, &held, 10);
        assert_eq!((q.blocked_ns, q.runq_contention_ns), (1e6, 3e6));
        let (q, _) = piece(&split, (2 * MS, 4 * MS), (0, 0), &mine, &stalls, &held, 10);
        assert_eq!((q.blocked_ns, q.runq_contention_ns), (1e6, 1e6));
        // The same wait behind another task is contention, and names no partner.
        let other = Interval {
            wait: Some((WaitKind::Contention, 11)),
            handoff_ns: 0,
            ..own[0]
        };
        assert!(held.woken_by(10, &other).is_none());
        let (q, _) = piece(&other, (0, 4 * MS), (0, 0), &mine, &stalls, &held, 10);
        assert_eq!((q.blocked_ns, q.runq_contention_ns), (0.0, 4e6));
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
        let view = only_11(&w);
        let holder = thread_11(10, "producer");
        let h = through_holder(
            Some(&holder),
            (10, 0, 10 * MS),
            (10e6, true),
            &view,
            (&stalls, &held),
        )
        .expect("a sibling's wait");
        assert_eq!(h.holders, vec![HolderTime::of(11, 5e6, true)]);
        let h = h.parts;
        assert_eq!(h.runq_contention_ns, 5e6);
        assert_eq!(h.lock_wait_ns, 5e6);
        assert_eq!(h.blocked_ns + h.oncpu_ns + h.queued_oncpu_ns, 0.0);
        // A timeout (an interrupt ended the wait) has no holder to follow.
        let irq = WakerRef {
            kind: WakerKind::Interrupt,
            ..holder
        };
        assert!(
            through_holder(
                Some(&irq),
                (10, 0, 10 * MS),
                (10e6, false),
                &view,
                (&stalls, &held)
            )
            .is_none()
        );
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn a_wait_for_a_sibling_in_a_lock_wait_names_that_lock_s_holder() {
        use crate::recording::{testutil::thread, timeline::Woken};
        // Thread 10 waits 10 ms for thread 11 (a read); 11 spent 8 ms of it in a futex that
        // thread 12 ended, then ran 2 ms. The 10 ms: 8 a lock wait held by 12, 2 blocked.
        let mut lock = interval(0, 8 * MS, State::Blocked);
        lock.woken = Some(Woken {
            by: 12,
            syscall: Some(202),
            flags: 0,
        });
        let w = [lock, interval(8 * MS, 10 * MS, State::Running)];
        let rec = recording(
            vec![
                thread(10, 0, 0, &[]),
                thread(11, 0, 0, &[]),
                thread(12, 0, 0, &[]),
            ],
            vec![],
        );
        let held = Held::build(&rec, &BTreeMap::new());
        let stalls = Stalls::build(&BTreeMap::new());
        let view = only_11(&w);
        let engine = thread_11(100, "engine");
        let h = through_waker(
            Some(&engine),
            (10, 0, 10 * MS),
            10e6,
            &view,
            (&stalls, &held),
        )
        .expect("a sibling's wait");
        assert_eq!(h.parts.lock_wait_ns, 8e6);
        assert_eq!(h.parts.blocked_ns, 2e6);
        assert_eq!(h.holders, vec![HolderTime::of(12, 8e6, false)]);
    }
}
