//! The terminal's tensor-parallel table: one row per rank (a member driving a GPU), and the late
//! rank with what the others waited for it.

use std::fmt::Write as _;

use super::text::table;
use crate::{
    analysis::{ranks::FoundBy, summary::Summary},
    recording::printable,
    units::dur,
};

pub fn ranks(out: &mut String, s: &Summary) {
    let Some(r) = &s.ranks else {
        return;
    };
    let _ = writeln!(
        out,
        "\nTensor-parallel ranks (members driving a GPU; times of their GPU-driving threads):"
    );
    let mut t = table(&[
        "PID",
        "ROLE",
        "GPU",
        "ON-CPU",
        "RUN-QUEUE",
        "BLOCKED",
        "IN SYNC",
        "WAITING",
        "GPU BUSY",
    ]);
    for k in &r.ranks {
        let gpus: Vec<String> = k.gpus.iter().map(u32::to_string).collect();
        t.add_row(vec![
            s.shown_id(k.pid),
            printable(&k.role).into_owned(),
            if gpus.is_empty() {
                "-".into()
            } else {
                gpus.join(",")
            },
            dur(k.oncpu_ns),
            dur(k.runq_wait_ns),
            dur(k.blocked_ns),
            format!("{} ({} calls)", dur(k.sync_ns), k.sync_calls),
            dur(k.waiting_ns),
            k.gpu_busy_pct.map_or("-".into(), |b| format!("{b:.0}%")),
        ]);
    }
    let _ = writeln!(out, "{t}");
    match &r.straggler {
        Some(late) => {
            let waited = match late.found_by {
                FoundBy::Waiting => format!(
                    "the others waited {} more than it did in synchronizing calls",
                    dur(late.peers_waited_ns)
                ),
                FoundBy::SharedGpu => format!(
                    "the others waited {} in synchronizing calls, every step held to its GPU",
                    dur(late.peers_waited_ns)
                ),
            };
            let _ = writeln!(
                out,
                "  late rank: PID {}: {waited} ({} per call over {}); its {}",
                s.shown_id(late.pid),
                dur(late.peers_waited_ns / late.sync_calls.max(1)),
                late.sync_calls,
                late.evidence
            );
        }
        None => {
            let _ = writeln!(out, "  {}", r.assessment);
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_table_lists_each_rank_and_names_the_late_one() {
        let r = crate::analysis::analyze(&crate::recording::testutil::two_ranks());
        let mut out = String::new();
        super::ranks(&mut out, &r.summary);
        let rows: Vec<&str> = out.lines().filter(|l| l.contains("(100 calls)")).collect();
        assert_eq!(rows.len(), 2, "{out}");
        assert!(
            rows[0].trim_start().starts_with("300") && rows[0].contains("97%"),
            "{out}"
        );
        assert!(
            rows[1].trim_start().starts_with("400") && rows[1].contains("650ms"),
            "{out}"
        );
        assert!(
            out.contains("late rank: PID 400: the others waited 450ms more than it did in synchronizing calls (4.50ms per call over 100); its off-CPU waits"),
            "{out}"
        );
        // A service without ranks prints nothing.
        let r = crate::analysis::analyze(&crate::recording::testutil::recording(vec![], vec![]));
        let mut out = String::new();
        super::ranks(&mut out, &r.summary);
        assert!(out.is_empty(), "{out}");
    }
}
