//! Request-level decomposition: each request's wall time, on the thread that served it, split
//! into on-CPU, run-queue wait (by kind), waiting for the GPU and other blocked time; then the
//! tail (p99 and above) set against the median requests, so the tail's excess can be split
//! across causes. Pure: the recording in, figures out.

use std::collections::HashMap;

use serde::Serialize;

mod context;
mod decompose;
mod handoff;
mod parts;
mod queue;
mod quota;
mod stalls;

use context::Context;
use decompose::{ThreadView, decompose, piece};
pub use parts::{BlockedBy, Breakdown, HolderTime, QueuedBy, RequestRef, add_holder};
use parts::{add_blocked, add_queued, rank_blocked, rank_holders, rank_queued};
use stalls::Stalls;

use crate::recording::{
    Recording,
    requests::{RequestSet, RequestSource},
};

/// One request, decomposed.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct RequestDetail {
    pub start_ns: u64,
    pub end_ns: u64,
    pub tid: u32,
    pub id: Option<u64>,
    pub wall_ns: u64,
    pub parts: Breakdown,
    /// CPU changes of the serving thread during the request.
    pub migrations: u32,
    /// The part of `cuda_sync_ns` in device- or context-wide synchronization (which waits for
    /// all of the process's GPU work, not just the request's).
    pub cuda_device_sync_ns: f64,
    /// LLC misses and instructions over its on-CPU slices (pro rata), when measured.
    pub llc_misses: Option<f64>,
    pub instructions: Option<f64>,
    /// Who held the locks of `parts.lock_wait_ns`, largest first.
    pub lock_holders: Vec<HolderTime>,
    /// Who ended the serving thread's blocked time (`lock_wait_ns` + `blocked_ns`), largest
    /// first.
    pub blocked_by: Vec<BlockedBy>,
    /// What the serving thread's time in `queued_oncpu_ns` went to (queue.rs), largest first.
    pub queued_by: Vec<QueuedBy>,
    /// The queued time of later requests put down to this request's own on-CPU work beyond
    /// the median request's: how much it held up the line.
    pub held_up_others_ns: f64,
}

/// A set of requests (the median ones, or the tail), on average.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct Group {
    pub requests: usize,
    pub wall_ns_mean: f64,
    pub mean: Breakdown,
    pub migrations_mean: f64,
    pub cuda_device_sync_ns_mean: f64,
    /// LLC misses per thousand instructions over the group's requests, when measured.
    pub mpki: Option<f64>,
    /// Who held the locks the group's requests waited for: mean ns per request, largest first.
    pub lock_holders: Vec<HolderTime>,
    /// Who ended the group's blocked time: mean ns per request, largest first.
    pub blocked_by: Vec<BlockedBy>,
    /// What the group's queued time went to: mean ns per request, largest first.
    pub queued_by: Vec<QueuedBy>,
    /// The group's requests that held up later ones with their own long on-CPU work, with
    /// that work beyond the median request's: mean ns per request of the group.
    pub holding_up: Vec<QueuedBy>,
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct RequestAnalysis {
    pub source: RequestSource,
    /// Requests wholly inside the window, decomposed.
    pub requests: usize,
    /// Requests that could not be used (see `RequestSet::unpaired`).
    pub unpaired: u64,
    /// Requests whose serving thread the recording does not trace (a latency log's `tid` that
    /// is not a thread of the target set): their time is all `uncovered`.
    pub untraced_requests: usize,
    /// Those threads (the first 8).
    pub untraced_tids: Vec<u32>,
    pub p50_ns: u64,
    pub p90_ns: u64,
    pub p99_ns: u64,
    pub max_ns: u64,
    /// p99 / p50.
    pub jitter_ratio: f64,
    /// Whether the tail is significantly slower than the median (see ATTRIBUTION.md).
    pub jitter: bool,
    /// The largest gap between a request's wall time and its decomposition, as a share of its
    /// wall time (0 when every request is covered by the timeline end to end).
    pub closure_error_max: f64,
    /// Share of requests whose decomposition closes within 5 %.
    pub closure_within_5pct: f64,
    /// The requests between p40 and p60.
    pub median: Group,
    /// The requests at or above p99 (at least 5 when there are enough).
    pub tail: Group,
    /// Tail mean minus median mean, by part: where the tail's extra time went.
    pub excess: Breakdown,
    pub excess_ns: f64,
    /// The slowest requests, decomposed.
    pub slowest: Vec<RequestDetail>,
}

/// At least this many requests are needed to speak of a p99.
pub const MIN_REQUESTS: usize = 20;
/// The tail counts as jitter when it exceeds p50 by JITTER_FLOOR_NS and either p99 >=
/// JITTER_RATIO x p50, or p99 >= JITTER_RATIO_BROAD x p50 with the p90 moved too (p90 >=
/// P90_RATIO x p50): a tail that is more than a handful of outliers. On our VMs a quiet server
/// reaches p99 = 1.56 x p50 from the host alone, with p90 <= 1.09 x p50 (docs/ATTRIBUTION.md).
pub const JITTER_RATIO: f64 = 2.0;
pub const JITTER_RATIO_BROAD: f64 = 1.5;
pub const P90_RATIO: f64 = 1.2;
pub const JITTER_FLOOR_NS: u64 = 200_000;

/// p99 / p50 (0 without a p50).
fn jitter_ratio(p50: u64, p99: u64) -> f64 {
    if p50 > 0 {
        p99 as f64 / p50 as f64
    } else {
        0.0
    }
}

/// Whether `n` requests with these quantiles have a tail worth the name (the rule above).
pub fn is_jitter(n: usize, p50: u64, p90: u64, p99: u64) -> bool {
    let ratio = jitter_ratio(p50, p99);
    n >= MIN_REQUESTS
        && (ratio >= JITTER_RATIO
            || ratio >= JITTER_RATIO_BROAD && p90 as f64 >= P90_RATIO * p50 as f64)
        && p99.saturating_sub(p50) >= JITTER_FLOOR_NS
}

impl RequestDetail {
    fn named(&self) -> RequestRef {
        RequestRef {
            tid: self.tid,
            id: self.id,
            start_ns: self.start_ns,
            wall_ns: self.wall_ns,
            oncpu_ns: self.parts.oncpu_ns,
        }
    }
}

/// Resolves every request's queued time (queue.rs) into `queued_by`, and each request's
/// part in the others' into `held_up_others_ns`.
fn follow_queues(
    details: &mut [RequestDetail],
    spans: &[queue::QueuedSpans],
    normal: &queue::Normal,
) {
    let resolved = queue::chase(details, spans, normal);
    let names: Vec<RequestRef> = details.iter().map(RequestDetail::named).collect();
    for (i, split) in resolved.into_iter().enumerate() {
        let mut by = Vec::new();
        for (key, ns) in split {
            match key {
                queue::Key::Own(h) => {
                    details[h].held_up_others_ns += ns;
                    add_queued(&mut by, "request", Some(names[h]), ns);
                }
                queue::Key::Part(k) => add_queued(&mut by, Breakdown::FIELDS[k], None, ns),
                queue::Key::Backlog => add_queued(&mut by, "backlog", None, ns),
            }
        }
        rank_queued(&mut by);
        details[i].queued_by = by;
    }
}

fn group(items: &[&RequestDetail], normal_oncpu_ns: f64) -> Group {
    let n = items.len().max(1) as f64;
    let parts: Vec<&Breakdown> = items.iter().map(|d| &d.parts).collect();
    let misses: Option<f64> = items.iter().map(|d| d.llc_misses).sum();
    let instr: Option<f64> = items.iter().map(|d| d.instructions).sum();
    let mut holders: Vec<HolderTime> = Vec::new();
    for d in items {
        for h in &d.lock_holders {
            add_holder(&mut holders, h.scaled(1.0 / n));
        }
    }
    rank_holders(&mut holders);
    let mut blocked_by: Vec<BlockedBy> = Vec::new();
    for b in items.iter().flat_map(|d| &d.blocked_by) {
        add_blocked(&mut blocked_by, b.by.clone(), b.ns / n);
    }
    rank_blocked(&mut blocked_by);
    let mut queued_by: Vec<QueuedBy> = Vec::new();
    for q in items.iter().flat_map(|d| &d.queued_by) {
        add_queued(&mut queued_by, q.cause, q.request, q.ns / n);
    }
    rank_queued(&mut queued_by);
    let mut holding_up: Vec<QueuedBy> = Vec::new();
    // Only a long request holds up others (`held_up_others_ns` is set for long ones only).
    for d in items.iter().filter(|d| d.held_up_others_ns > 0.0) {
        let own = (d.parts.oncpu_ns - normal_oncpu_ns).max(0.0) / n;
        add_queued(&mut holding_up, "request", Some(d.named()), own);
    }
    holding_up.retain(|q| q.ns > 0.0);
    rank_queued(&mut holding_up);
    Group {
        lock_holders: holders,
        blocked_by,
        queued_by,
        holding_up,
        requests: items.len(),
        wall_ns_mean: items.iter().map(|d| d.wall_ns as f64).sum::<f64>() / n,
        mean: Breakdown::mean(&parts),
        migrations_mean: items.iter().map(|d| d.migrations as f64).sum::<f64>() / n,
        cuda_device_sync_ns_mean: items.iter().map(|d| d.cuda_device_sync_ns).sum::<f64>() / n,
        mpki: misses
            .zip(instr)
            .and_then(|(m, i)| (i > 0.0).then(|| m * 1000.0 / i)),
    }
}

/// Nearest-rank quantile of sorted values.
fn quantile(sorted: &[u64], q: f64) -> u64 {
    let n = sorted.len();
    sorted[((q * n as f64).ceil() as usize).clamp(1, n) - 1]
}

/// The recording's requests, decomposed. `prev`: the window just before (a watch's), on which
/// the part of a request that began there is decomposed. What neither covers (a marker's start
/// a moment before the recording's, say) is `uncovered`; which requests come is the sources'
/// choice (a watch's: those begun in the window before, at the earliest).
pub fn analyze(rec: &Recording, prev: Option<&Recording>) -> Option<RequestAnalysis> {
    let set: &RequestSet = rec.requests.as_ref()?;
    let (mut details, queued_spans) = decompose_all(rec, prev, set);
    let (untraced_requests, untraced_tids) = untraced(rec, set);
    let n = details.len();
    let r = Ranked::of(&details);
    let closure: Vec<f64> = details
        .iter()
        .map(|d| d.parts.uncovered_ns / d.wall_ns.max(1) as f64)
        .collect();
    // What a normal request is, then the queues followed with it, then the groups.
    let median_parts: Vec<&Breakdown> = r.median.iter().map(|&i| &details[i].parts).collect();
    let normal = queue::Normal {
        wall_ns: r
            .median
            .iter()
            .map(|&i| details[i].wall_ns as f64)
            .sum::<f64>()
            / r.median.len().max(1) as f64,
        parts: Breakdown::mean(&median_parts),
    };
    follow_queues(&mut details, &queued_spans, &normal);
    let pick =
        |idx: &[usize]| -> Vec<&RequestDetail> { idx.iter().map(|&i| &details[i]).collect() };
    let oncpu = normal.parts.oncpu_ns;
    let (median, tail) = (group(&pick(&r.median), oncpu), group(&pick(&r.tail), oncpu));
    let (p50, p90, p99) = (r.p50, r.p90, r.p99);
    let slowest = r
        .order
        .iter()
        .rev()
        .take(5)
        .map(|&i| details[i].clone())
        .collect();
    Some(RequestAnalysis {
        source: set.source,
        requests: n,
        unpaired: set.unpaired,
        untraced_requests,
        untraced_tids,
        p50_ns: p50,
        p90_ns: p90,
        p99_ns: p99,
        max_ns: r.max,
        jitter_ratio: jitter_ratio(p50, p99),
        jitter: is_jitter(n, p50, p90, p99),
        closure_error_max: closure.iter().copied().fold(0.0, f64::max),
        closure_within_5pct: if n > 0 {
            closure.iter().filter(|&&c| c <= 0.05).count() as f64 / n as f64
        } else {
            1.0
        },
        excess: tail.mean.minus(&median.mean),
        excess_ns: tail.wall_ns_mean - median.wall_ns_mean,
        median,
        tail,
        slowest,
    })
}

/// Every request decomposed on its serving thread, with what it queued behind; one begun in
/// the window before (a watch's) on both windows.
fn decompose_all(
    rec: &Recording,
    prev: Option<&Recording>,
    set: &RequestSet,
) -> (Vec<RequestDetail>, Vec<queue::QueuedSpans>) {
    let ctx = Context::new(rec);
    // Built only for requests that need it: a context costs a pass over its recording.
    let earlier = prev
        .filter(|p| p.end_ns == rec.start_ns)
        .filter(|_| set.spans.iter().any(|r| r.start_ns < rec.start_ns))
        .map(Context::new);
    let mut details: Vec<RequestDetail> = Vec::with_capacity(set.spans.len());
    let mut queued_spans: Vec<queue::QueuedSpans> = Vec::with_capacity(set.spans.len());
    // Spans come in order of their end: each thread's previous end is the last one seen.
    let mut last_end: HashMap<u32, u64> = HashMap::new();
    for r in &set.spans {
        let busy_until = last_end.insert(r.tid, r.end_ns).unwrap_or(0);
        let (mut d, q) = ctx.decompose(r, busy_until);
        if let (Some(e), true) = (&earlier, r.start_ns < rec.start_ns) {
            d.add_earlier(&e.decompose(r, 0).0);
        }
        details.push(d);
        queued_spans.push(q);
    }
    (details, queued_spans)
}

/// Requests served by threads the recording did not trace: how many, and up to 8 of the
/// threads.
fn untraced(rec: &Recording, set: &RequestSet) -> (usize, Vec<u32>) {
    let traced: std::collections::HashSet<u32> = rec.threads.iter().map(|t| t.tid).collect();
    let untraced: Vec<u32> = set
        .spans
        .iter()
        .map(|s| s.tid)
        .filter(|t| !traced.contains(t))
        .collect();
    let mut tids = untraced.clone();
    tids.sort_unstable();
    tids.dedup();
    tids.truncate(8);
    (untraced.len(), tids)
}

/// The requests by wall time: their quantiles, and which are the tail and the median.
struct Ranked {
    /// Indices, fastest first (ties in order of end).
    order: Vec<usize>,
    p50: u64,
    p90: u64,
    p99: u64,
    max: u64,
    tail: Vec<usize>,
    median: Vec<usize>,
}

impl Ranked {
    fn of(details: &[RequestDetail]) -> Self {
        let n = details.len();
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by_key(|&i| (details[i].wall_ns, i));
        let walls: Vec<u64> = order.iter().map(|&i| details[i].wall_ns).collect();
        let (p50, p90, p99, max) = if n > 0 {
            (
                quantile(&walls, 0.5),
                quantile(&walls, 0.9),
                quantile(&walls, 0.99),
                walls[n - 1],
            )
        } else {
            (0, 0, 0, 0)
        };
        // The tail: at or above p99, and at least the 5 slowest when there are 50 requests
        // or more, so one outlier does not make the whole story.
        let tail_from = walls.partition_point(|&w| w < p99);
        let tail_from = if n >= 50 {
            tail_from.min(n - 5)
        } else {
            tail_from
        };
        let (m0, m1) = (
            (n as f64 * 0.4) as usize,
            ((n as f64 * 0.6) as usize).max(1),
        );
        Ranked {
            tail: order[tail_from.min(n)..].to_vec(),
            median: order[m0.min(n)..m1.min(n)].to_vec(),
            order,
            p50,
            p90,
            p99,
            max,
        }
    }
}
