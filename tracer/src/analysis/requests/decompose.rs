//! One request decomposed on its serving thread: each piece of the thread's timeline inside
//! the request split into parts (on a CPU, each kind of run-queue wait, lock waits, pauses, GPU
//! waits, blocked), lock waits followed to their holders (handoff.rs), the quota's shift
//! (quota.rs), and the request's moves, device-wide syncs and counters.

use super::{
    BlockedBy, Breakdown, HolderTime, RequestDetail, add_blocked, add_holder, handoff, queue,
    quota, rank_blocked, rank_holders, stalls::Stalls,
};
use crate::analysis::held::Held;
use crate::recording::{
    CudaSpan,
    requests::RequestSpan,
    timeline::{Interval, State},
    waits::WaitKind,
};
use tracer_common::CudaFn;

/// What the decomposition of each request reads: one thread's intervals, CUDA calls,
/// migrations and counter slices, in time order.
pub(super) struct ThreadView<'a> {
    pub(super) intervals: &'a [Interval],
    pub(super) syncs: &'a [&'a CudaSpan],
    pub(super) migrations: &'a [u64],
    /// (start, end, llc misses, instructions).
    pub(super) slices: &'a [(u64, u64, u64, u64)],
}

fn overlap(a0: u64, a1: u64, b0: u64, b1: u64) -> u64 {
    a1.min(b1).saturating_sub(a0.max(b0))
}

/// Time of `[s, e)` inside CUDA synchronizing calls.
fn sync_overlap(syncs: &[&CudaSpan], s: u64, e: u64) -> u64 {
    let from = syncs.partition_point(|c| c.end_ns <= s);
    syncs[from..]
        .iter()
        .take_while(|c| c.start_ns < e)
        .map(|c| overlap(c.start_ns, c.end_ns, s, e))
        .sum()
}

/// One interval's piece `[is, ie)` of a request `[s, ..)` on thread `tid`, split by state; the
/// thread was on earlier requests until `busy_until`.
pub(super) fn piece(
    i: &Interval,
    (is, ie): (u64, u64),
    (s, busy_until): (u64, u64),
    v: &ThreadView,
    stalls: &Stalls,
    held: &Held,
    tid: u32,
) -> (Breakdown, Option<crate::analysis::held::LockWait>) {
    let mut p = Breakdown::default();
    let ov = (ie - is) as f64;
    let mut lock = None;
    match i.state {
        // A handoff: the thread the serving thread exchanges work with held the CPU to the
        // wait's end, so it waited for that thread's work as if blocked on it
        // (`Held::woken_by` names it); before that, behind other tasks.
        State::Runnable if i.wait.map(|w| w.0) == Some(WaitKind::Handoff) => {
            let handoff = overlap(is, ie, i.end_ns - i.handoff_ns, i.end_ns) as f64;
            p.blocked_ns += handoff;
            p.runq_contention_ns += ov - handoff;
        }
        State::Runnable => {
            let idle = i.cpu.map_or(0, |c| stalls.overlap(c, is, ie)) as f64;
            // The throttled part of a wait behind other tasks, pro rata over the piece: where
            // in the wait the throttle fell is not known, only how long it was. (A wait on an
            // idle CPU stays idle-CPU time, judged by the cgroup's counters.)
            let whole = (i.end_ns - i.start_ns).max(1) as f64;
            let throttled = match i.wait.map(|w| w.0) {
                Some(WaitKind::Contention) => (ov * i.throttled_ns as f64 / whole).min(ov - idle),
                _ => 0.0,
            };
            p.runq_idle_cpu_ns += idle;
            p.runq_throttled_ns += throttled;
            let rest = ov - idle - throttled;
            if i.wait.map(|w| w.0) == Some(WaitKind::Migration) {
                p.runq_migration_ns += rest;
            } else {
                p.runq_contention_ns += rest;
            }
        }
        State::Running | State::Blocked => {
            let gpu = sync_overlap(v.syncs, is, ie) as f64;
            p.cuda_sync_ns += gpu;
            if i.state == State::Running {
                let queued = overlap(is, ie, s, busy_until) as f64;
                let queued_gpu = sync_overlap(v.syncs, is, ie.min(busy_until).max(is)) as f64;
                p.queued_oncpu_ns += queued - queued_gpu;
                p.oncpu_ns += ov - gpu - (queued - queued_gpu);
            } else if gpu < ov
                && let Some(l) = held.lock_wait(tid, i, is, ie)
            {
                p.lock_wait_ns += ov - gpu;
                lock = Some(l);
            } else {
                p.blocked_ns += ov - gpu;
            }
        }
    }
    (p, lock)
}

/// The time in device-wide synchronizing calls (which wait for all the process's queued GPU
/// work, not only the request's) within `[s, e)`.
fn device_sync_ns(v: &ThreadView, s: u64, e: u64) -> f64 {
    let device_wide: Vec<&CudaSpan> = v
        .syncs
        .iter()
        .copied()
        .filter(|c| {
            matches!(
                CudaFn::try_from(c.function),
                Ok(CudaFn::CtxSynchronize | CudaFn::RtDeviceSynchronize)
            )
        })
        .collect();
    sync_overlap(&device_wide, s, e) as f64
}

/// The thread's moves between CPUs within `[s, e)`.
fn migrations_in(v: &ThreadView, s: u64, e: u64) -> u32 {
    let from = v.migrations.partition_point(|&t| t < s);
    v.migrations[from..].iter().take_while(|&&t| t < e).count() as u32
}

/// LLC misses and instructions within `[s, e)`: each counter slice's share by its overlap.
fn llc_in(v: &ThreadView, s: u64, e: u64) -> (f64, f64) {
    let (mut misses, mut instr) = (0.0, 0.0);
    let from = v.slices.partition_point(|x| x.1 <= s);
    for &(a, b, m, n) in v.slices[from..].iter().take_while(|x| x.0 < e) {
        let f = overlap(a, b, s, e) as f64 / (b - a).max(1) as f64;
        misses += m as f64 * f;
        instr += n as f64 * f;
    }
    (misses, instr)
}

/// Decomposes `r` on its serving thread. Until `busy_until` (the end of the thread's previous
/// request) the thread's CPU time went to earlier requests: this one was queued.
pub(super) fn decompose<'a>(
    r: &RequestSpan,
    v: &ThreadView,
    ctx: (&Stalls, &Held, &dyn Fn(u32) -> Option<ThreadView<'a>>),
    busy_until: u64,
    (llc, quota_period_ns): (bool, u64),
) -> (RequestDetail, queue::QueuedSpans) {
    let (stalls, held, other) = ctx;
    let mut quota = quota::QuotaShift::new(quota_period_ns);
    let ctx2 = (stalls, held);
    let (s, e) = (r.start_ns, r.end_ns);
    let mut p = Breakdown::default();
    let mut queued_spans = Vec::new();
    let mut holders: Vec<HolderTime> = Vec::new();
    let mut blocked_by: Vec<BlockedBy> = Vec::new();
    let from = v.intervals.partition_point(|i| i.end_ns <= s);
    for i in v.intervals[from..].iter().take_while(|i| i.start_ns < e) {
        let (is, ie) = (i.start_ns.max(s), i.end_ns.min(e));
        if ie <= is {
            continue;
        }
        // A runtime pause of the process takes the piece first, whatever the thread did in it:
        // the rest of the piece is split as below, in proportion.
        let paused = held.paused(r.tid, is, ie) as f64;
        p.runtime_pause_ns += paused;
        let whole = (ie - is) as f64;
        let rest = (whole - paused) / whole;
        if rest <= 0.0 {
            continue;
        }
        let (mut q, lock) = piece(i, (is, ie), (s, busy_until), v, stalls, held, r.tid);
        let waker = held.woken_by(r.tid, i);
        // A handoff's blocked part is its partner's running, the work handed over: nothing
        // further to follow.
        let piece_holders = if i.wait.map(|w| w.0) == Some(WaitKind::Handoff) {
            Vec::new()
        } else {
            handoff::follow(&mut q, lock, waker.as_ref(), (r.tid, is, ie), other, ctx2)
        };
        // Where the queued time lies, for the chase (queue.rs): the same amount, spread over
        // the stretch of the piece before `busy_until`.
        let (qa, qb) = (is, ie.min(busy_until));
        if q.queued_oncpu_ns > 0.0 && qb > qa {
            queued_spans.push((qa, qb, q.queued_oncpu_ns * rest / (qb - qa) as f64));
        }
        for h in piece_holders {
            add_holder(&mut holders, h.scaled(rest));
        }
        let off = (q.lock_wait_ns + q.blocked_ns) * rest;
        if off > 0.0 {
            add_blocked(&mut blocked_by, waker, off);
        }
        p.add_scaled(&q, rest);
        if i.state == State::Runnable {
            // Any throttle ends the period's contention, on an idle CPU too.
            quota.on_wait(
                &mut p,
                (is, ie),
                (q.runq_contention_ns * rest, i.throttled_ns > 0),
            );
        }
    }
    rank_holders(&mut holders);
    rank_blocked(&mut blocked_by);
    let wall = r.wall_ns();
    p.uncovered_ns = (wall as f64 - p.covered_ns()).max(0.0);
    let (misses, instr) = if llc { llc_in(v, s, e) } else { (0.0, 0.0) };
    let detail = RequestDetail {
        start_ns: s,
        end_ns: e,
        tid: r.tid,
        id: r.id,
        wall_ns: wall,
        parts: p,
        migrations: migrations_in(v, s, e),
        cuda_device_sync_ns: device_sync_ns(v, s, e),
        llc_misses: llc.then_some(misses),
        instructions: llc.then_some(instr),
        lock_holders: holders,
        blocked_by,
        queued_by: Vec::new(),
        held_up_others_ns: 0.0,
    };
    (detail, queued_spans)
}
