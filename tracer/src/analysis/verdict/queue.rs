//! The tail's queueing, followed to its causes. The decomposition leaves the time a tail request
//! waited behind earlier requests as `queued_oncpu`; the chase (analysis/requests/queue.rs)
//! says, per request, what held the serving thread up meanwhile. Here the tail's excess of it
//! is routed the same way: to the parts whose causes already exist (a collection, a lock, a
//! run-queue wait of the earlier requests), to head-of-line blocking (their own long on-CPU
//! work), and what is left is ordinary queueing (arrivals outpaced normal service). A tail
//! request that itself held up later ones with its own long work is head-of-line too: the same
//! requests, seen from the front of the line.

use std::fmt;

use serde::Serialize;

use crate::analysis::{
    requests::{Breakdown, QueuedBy, RequestAnalysis, RequestRef},
    summary::Summary,
};

/// A request whose own on-CPU work held up the ones behind it.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct BlockingRequest {
    pub tid: u32,
    /// Its id, when the markers or the latency log carry one.
    pub id: Option<u64>,
    /// When it started, from the start of the recording.
    pub at_ns: u64,
    pub wall_ns: u64,
    /// Its own on-CPU time.
    pub oncpu_ns: f64,
    /// Share of the head-of-line time it accounts for.
    pub share: f64,
}

/// The tail's excess with its queued part routed: `parts.queued_oncpu_ns` is what stays
/// ordinary queueing, `parts.oncpu_ns` is less the blocking requests' own long work.
pub struct Routed {
    pub parts: Breakdown,
    /// What reached each part through the queue (ns per tail request).
    pub via_queue: Breakdown,
    /// Head-of-line blocking: long requests' own on-CPU work, ns per tail request.
    pub head_of_line_ns: f64,
    /// The requests behind it, largest share first.
    pub requests: Vec<BlockingRequest>,
}

pub fn route(s: &Summary, r: &RequestAnalysis) -> Routed {
    let ex = &r.excess;
    let mut parts = *ex;
    let mut via = [0.0; Breakdown::FIELDS.len()];
    let queued = ex.queued_oncpu_ns.max(0.0);
    parts.queued_oncpu_ns = ex.queued_oncpu_ns.min(0.0);
    let mut named: Vec<(RequestRef, f64)> = Vec::new();
    let mut hol = 0.0;
    let total: f64 = r.tail.queued_by.iter().map(|q| q.ns).sum();
    let entries: &[QueuedBy] = if total > 0.0 { &r.tail.queued_by } else { &[] };
    if entries.is_empty() {
        parts.queued_oncpu_ns += queued;
    }
    for q in entries {
        let ns = queued * q.ns / total;
        match (
            q.cause,
            Breakdown::FIELDS.iter().position(|f| *f == q.cause),
        ) {
            ("request", _) => {
                hol += ns;
                if let Some(req) = q.request {
                    add(&mut named, req, ns);
                }
            }
            (_, Some(k)) if q.cause != "queued_oncpu" => via[k] += ns,
            _ => parts.queued_oncpu_ns += ns,
        }
    }
    let mut via = Breakdown::from_values(via);
    via.queued_oncpu_ns = 0.0;
    parts.add_scaled(&via, 1.0);
    // The tail's own long work, where those requests held up later ones: at most the tail's
    // on-CPU excess, which it is part of.
    let own: f64 = r.tail.holding_up.iter().map(|q| q.ns).sum();
    let take = own.min(parts.oncpu_ns.max(0.0));
    if take > 0.0 {
        for q in &r.tail.holding_up {
            if let Some(req) = q.request {
                add(&mut named, req, q.ns * take / own);
            }
        }
        parts.oncpu_ns -= take;
        hol += take;
    }
    named.sort_by(|a, b| b.1.total_cmp(&a.1));
    let requests = named
        .into_iter()
        .map(|(q, ns)| BlockingRequest {
            tid: q.tid,
            id: q.id,
            at_ns: q.start_ns.saturating_sub(s.start_ns),
            wall_ns: q.wall_ns,
            oncpu_ns: q.oncpu_ns,
            share: if hol > 0.0 { ns / hol } else { 0.0 },
        })
        .collect();
    Routed {
        parts,
        via_queue: via,
        head_of_line_ns: hol,
        requests,
    }
}

fn add(v: &mut Vec<(RequestRef, f64)>, req: RequestRef, ns: f64) {
    match v
        .iter_mut()
        .find(|(r, _)| (r.tid, r.start_ns) == (req.tid, req.start_ns))
    {
        Some(e) => e.1 += ns,
        None => v.push((req, ns)),
    }
}

/// "request 17 (thread 1234, at +2.310 s: 61.2ms, 60.8ms on a CPU; 34% of it)".
impl fmt::Display for BlockingRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.id {
            Some(id) => write!(f, "request {id} (thread {}", self.tid)?,
            None => write!(f, "a request of thread {}", self.tid)?,
        }
        write!(
            f,
            ", at +{:.3} s: {}, {} on a CPU; {} of it)",
            self.at_ns as f64 / 1e9,
            crate::units::dur(self.wall_ns),
            crate::units::dur(self.oncpu_ns as u64),
            crate::units::pct(self.share)
        )
    }
}
