//! Run-queue contention: who the neighbour was, shared by both bases
//! of the verdict (the tail's excess, the window's impediments). When the two largest sides are
//! close (the target's own threads and a neighbour, say), both are named.

use super::{
    evidence::pct,
    mechanism::{Contender, Mechanism},
};
use crate::analysis::{
    neighbours::{Neighbour, NeighbourKind},
    summary::Summary,
};

/// The second side is named too when it caused at least this part of the first's waiting.
const CLOSE: f64 = 2.0 / 3.0;

/// The neighbours that took the CPU from the target's threads (the idle task and the migration
/// stopper aside: those are throttling, slow wakeups and migrations), largest first. The
/// kernel charges a handoff to the partner that held the CPU, like any wait; it is not
/// contention, so each neighbour's share is without the handoffs it was the partner in
/// (`Neighbour::handoff_ns`: the service's own threads, or a client outside it). A recording
/// from before the partners were kept has only the total (`wait_classes`), which then comes
/// off the service's own share, where most partners are.
fn contenders(s: &Summary) -> Vec<Neighbour> {
    let by_partner = s.neighbours.iter().any(|n| n.handoff_ns > 0);
    let handoff = s.totals.wait_classes.handoff_ns;
    let mut v: Vec<Neighbour> = s
        .neighbours
        .iter()
        .filter(|n| n.kind != NeighbourKind::Idle && !n.is_stopper())
        .cloned()
        .map(|mut n| {
            let part = match (by_partner, n.kind) {
                (true, _) => n.handoff_ns,
                (false, NeighbourKind::Target) => handoff,
                (false, _) => 0,
            };
            if part > 0 {
                let kept = n.wait_ns.saturating_sub(part);
                n.wait_share *= kept as f64 / n.wait_ns.max(1) as f64;
                n.wait_ns = kept;
            }
            n
        })
        .filter(|n| n.wait_ns > 0)
        .collect();
    v.sort_by(|a, b| b.wait_ns.cmp(&a.wait_ns).then(a.kind.cmp(&b.kind)));
    v
}

/// The neighbour that caused most of the target's run-queue waiting.
pub(crate) fn top(s: &Summary) -> Option<Neighbour> {
    contenders(s).into_iter().next()
}

/// The top neighbour, and the second when it is close.
fn sides(s: &Summary) -> (Option<Neighbour>, Option<Neighbour>) {
    let mut it = contenders(s).into_iter();
    let first = it.next();
    let second = it.next().filter(|b| {
        first
            .as_ref()
            .is_some_and(|a| b.wait_ns as f64 >= CLOSE * a.wait_ns as f64)
    });
    (first, second)
}

/// The neighbour as the verdict names it.
fn contender(s: &Summary, n: &Neighbour) -> Contender {
    let pids: Vec<u32> = n.processes.iter().take(4).copied().collect();
    // The service's own processes are named by what they are in it, not left as "its own".
    let members = match n.kind {
        NeighbourKind::Target if s.processes.len() > 1 => pids
            .iter()
            .map(|&p| {
                let role = s.process(p).map_or("?", |m| &m.role);
                format!(
                    "{} (PID {})",
                    crate::recording::printable(role),
                    s.shown_id(p)
                )
            })
            .collect(),
        _ => vec![],
    };
    Contender {
        members,
        kind: n.kind,
        name: n.name.clone(),
        shown_pids: pids.iter().map(|p| s.shown_id(*p)).collect(),
        pids,
        process_count: n.process_count,
        wait_share: n.wait_share,
    }
}

/// Run-queue contention, naming the top neighbour, and the second when it is close.
pub(crate) fn mechanism(s: &Summary) -> Mechanism {
    let (a, b) = sides(s);
    Mechanism::RunQueueContention {
        by: a.into_iter().chain(b).map(|n| contender(s, &n)).collect(),
    }
}

/// "; stress-ng-cpu caused 51 % of the waiting", for the evidence.
pub(crate) fn caused(s: &Summary, scope: &str) -> String {
    top(s).map_or(String::new(), |n| {
        format!(
            "; {scope}{} caused {} of the target's waiting",
            contender(s, &n),
            pct(n.wait_share, "")
        )
    })
}
