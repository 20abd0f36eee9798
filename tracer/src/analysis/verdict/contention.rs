//! Run-queue contention in words: who the neighbour was, and what to do, shared by both bases
//! of the verdict (the tail's excess, the window's impediments). When the two largest sides are
//! close (the target's own threads and a neighbour, say), both are named.

use super::{Summary, pct};
use crate::{
    analysis::neighbours::{Neighbour, NeighbourKind},
    recording::printable,
};

/// The second side is named too when it caused at least this part of the first's waiting.
const CLOSE: f64 = 2.0 / 3.0;

/// The neighbours that took the CPU from the target's threads (the idle task and the migration
/// stopper aside: those are throttling, slow wakeups and migrations), largest first.
fn contenders(s: &Summary) -> impl Iterator<Item = &Neighbour> {
    s.neighbours
        .iter()
        .filter(|n| n.kind != NeighbourKind::Idle && !n.is_stopper())
}

/// The neighbour that caused most of the target's run-queue waiting.
pub(crate) fn top(s: &Summary) -> Option<&Neighbour> {
    contenders(s).next()
}

/// The top neighbour, and the second when it is close.
fn sides(s: &Summary) -> (Option<&Neighbour>, Option<&Neighbour>) {
    let mut it = contenders(s);
    let first = it.next();
    let second = it
        .next()
        .filter(|b| first.is_some_and(|a| b.wait_ns as f64 >= CLOSE * a.wait_ns as f64));
    (first, second)
}

/// "stress-ng-cpu (2 processes: PIDs 11, 12)", "its own threads", "cgroup /docker/x.scope (3
/// processes)".
pub(crate) fn who(s: &Summary, n: &Neighbour) -> String {
    let name = printable(&n.name);
    // "2 processes: PIDs 11, 12", "1 process: PID 11".
    let listed = || {
        let mut v: Vec<String> = n.processes.iter().take(4).map(|p| s.shown_id(*p)).collect();
        if n.process_count > v.len() as u64 {
            v.push("...".into());
        }
        match n.process_count {
            1 => format!("1 process: PID {}", v.join(", ")),
            c => format!("{c} processes: PIDs {}", v.join(", ")),
        }
    };
    match n.kind {
        NeighbourKind::Target => "its own threads".into(),
        NeighbourKind::Children => {
            format!(
                "its own child processes, which were not traced ({})",
                listed()
            )
        }
        NeighbourKind::Cgroup if n.process_count == 1 => format!("cgroup {name} (1 process)"),
        NeighbourKind::Cgroup => format!("cgroup {name} ({} processes)", n.process_count),
        _ if n.process_count == 1 => format!("{name} (PID {})", s.shown_id(n.processes[0])),
        _ => format!("{name} ({})", listed()),
    }
}

pub(crate) fn mechanism(s: &Summary) -> String {
    match sides(s) {
        (Some(a), None) if a.kind == NeighbourKind::Target => {
            "run-queue contention among its own threads".into()
        }
        (Some(a), None) => format!("run-queue contention: preempted by {}", who(s, a)),
        (Some(a), Some(b)) => format!(
            "run-queue contention: preempted by {} ({} of the waiting) and {} ({})",
            who(s, a),
            pct(a.wait_share, ""),
            who(s, b),
            pct(b.wait_share, "")
        ),
        (None, _) => "run-queue contention".into(),
    }
}

/// "; stress-ng-cpu caused 51 % of the waiting", for the evidence.
pub(crate) fn caused(s: &Summary, scope: &str) -> String {
    top(s).map_or(String::new(), |n| {
        format!(
            "; {scope}{} caused {} of the target's waiting",
            who(s, n),
            pct(n.wait_share, "")
        )
    })
}

const OWN: &str =
    "Run fewer busy threads than the CPUs the server has (thread pools, OMP_NUM_THREADS).";
const OTHERS: &str =
    "Give the server CPUs of its own (cpuset, taskset) or move the other work off them.";
const CHILDREN: &str = "Its own child processes took the CPUs: trace them (-p each), and give \
                        them CPUs apart from the server's or fewer workers.";

pub(crate) fn advice(s: &Summary) -> String {
    let of = |n: &Neighbour| match n.kind {
        NeighbourKind::Target => OWN,
        NeighbourKind::Children => CHILDREN,
        _ => OTHERS,
    };
    match sides(s) {
        (Some(a), Some(b)) if of(a) != of(b) => format!("{} {}", of(a), of(b)),
        (Some(a), _) => of(a).into(),
        (None, _) => OTHERS.into(),
    }
}
