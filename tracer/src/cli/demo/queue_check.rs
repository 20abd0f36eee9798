//! The queue's part of a scenario's ground truth (docs/ATTRIBUTION.md, "Following the queue"):
//! when the tail waited behind earlier requests, the time it waited must reach the injected
//! cause through the queue, not stop at "queueing"; in head-of-line, the requests named as
//! blocking must be long ones the server itself logged as long.

use serde::Serialize;

use super::scenario::Scenario;
use crate::analysis::{Report, verdict::Mechanism};

/// The queued time must reach the cause at least this much (of the tail's queued time).
pub const TO_CAUSE_MIN: f64 = 0.8;
/// The check applies when the tail requests queued at least this long on average: below it,
/// the queue is not part of their story (a request's own service is ~0.5 ms here).
pub const QUEUED_MIN_NS: f64 = 50_000.0;

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct QueueCheck {
    /// The injected cause's part, as `queued_by` names it.
    pub cause: &'static str,
    /// The tail requests' queued time, and their excess over the median, ns per request.
    pub tail_queued_ns: f64,
    pub tail_excess_ns: f64,
    /// Share of the tail's queued time that reached `cause` through the queue.
    pub to_cause: f64,
    /// Head-of-line: the requests the verdict names as blocking, and how many of them the
    /// server logged as long.
    pub named: Option<usize>,
    pub named_long: Option<usize>,
    /// Whether the queue was part of the tail (`QUEUED_MIN_NS`), so that it is judged.
    pub judged: bool,
    pub ok: bool,
}

/// The check for `scenario`, or None when it injects nothing that queues requests.
pub fn check(scenario: Scenario, report: &Report, long_ids: &[u64]) -> Option<QueueCheck> {
    let cause = match scenario.base() {
        Scenario::GcPause => "runtime_pause",
        Scenario::LockContention | Scenario::GilContention => "lock_wait",
        Scenario::HeadOfLine => "request",
        _ => return None,
    };
    let r = report.summary.requests.as_ref()?;
    let queued: f64 = r.tail.queued_by.iter().map(|q| q.ns).sum();
    let reached: f64 = r
        .tail
        .queued_by
        .iter()
        .filter(|q| q.cause == cause)
        .map(|q| q.ns)
        .sum();
    let to_cause = if queued > 0.0 { reached / queued } else { 0.0 };
    let named: Option<Vec<Option<u64>>> =
        report
            .verdict
            .causes
            .iter()
            .find_map(|c| match &c.mechanism {
                Mechanism::LongRequestOnServingThread { requests } => {
                    Some(requests.iter().map(|q| q.id).collect())
                }
                _ => None,
            });
    let (named, named_long) = match (scenario.base(), named) {
        (Scenario::HeadOfLine, Some(ids)) => (
            Some(ids.len()),
            Some(
                ids.iter()
                    .filter(|id| id.is_some_and(|i| long_ids.contains(&i)))
                    .count(),
            ),
        ),
        (Scenario::HeadOfLine, None) => (Some(0), Some(0)),
        _ => (None, None),
    };
    let judged = r.tail.mean.queued_oncpu_ns >= QUEUED_MIN_NS;
    let names_ok = match (named, named_long) {
        (Some(n), Some(l)) => n > 0 && l == n,
        _ => true,
    };
    Some(QueueCheck {
        cause,
        tail_queued_ns: r.tail.mean.queued_oncpu_ns,
        tail_excess_ns: r.excess_ns,
        to_cause,
        named,
        named_long,
        judged,
        ok: names_ok && (!judged || to_cause >= TO_CAUSE_MIN),
    })
}
