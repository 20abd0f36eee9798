//! The terminal's "held up by" table: the largest (waiting thread, waker) pairs.

use std::fmt::Write as _;

use super::text::table;
use crate::{
    analysis::{
        summary::Summary,
        wakers::{HeldUp, WakerKind},
    },
    recording::printable,
    units::{dur, pct},
};

const MAX_ROWS: usize = 10;

/// One hop on, in words: what the waker did meanwhile.
fn hop(p: &HeldUp) -> String {
    match (p.waker_oncpu_share, &p.waker_held_up_by) {
        (Some(on), Some(w)) if on < 0.5 => format!(
            "it ran {} of the window; itself woken mostly by {}",
            pct(on),
            w.describe()
        ),
        (Some(on), _) => format!("it ran {} of the window", pct(on)),
        _ => String::new(),
    }
}

pub fn held_up(out: &mut String, s: &Summary) {
    if s.held_up_by.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\nHeld up by (who ended the threads' blocked time; the largest pairs of each process):"
    );
    let mut t = table(&[
        "TID",
        "THREAD",
        "BLOCKED IN",
        "ENDED BY",
        "BLOCKED",
        "WAKEUPS",
        "MAX",
        "OF ITS",
        "NOTE",
    ]);
    for p in s.held_up_by.iter().take(MAX_ROWS) {
        let by = match p.by.kind {
            WakerKind::SameProcess | WakerKind::Member if s.processes.len() > 1 => {
                format!("{} of PID {}", p.by.describe(), s.shown_id(p.by.pid))
            }
            _ => p.by.describe(),
        };
        t.add_row(vec![
            s.shown_id(p.tid),
            printable(&p.comm).into_owned(),
            p.blocked_in.name().to_string(),
            by,
            dur(p.blocked_ns),
            p.wakeups.to_string(),
            dur(p.max_ns),
            pct(p.share_of_blocked),
            hop(p),
        ]);
    }
    let _ = writeln!(out, "{t}");
}
