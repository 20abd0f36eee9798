//! The verdict's text: the one line to act on first, then the ranked causes with their
//! evidence, what was not assessed, and where the requests' time went.

use std::fmt::Write as _;

use crate::analysis::{
    Report,
    requests::{BlockedBy, RequestAnalysis},
    summary::Summary,
    verdict::Basis,
};
use crate::units::dur;

pub fn render(r: &Report, out: &mut String) {
    let (s, v) = (&r.summary, &r.verdict);
    let _ = writeln!(out, "Verdict: {}", v.headline);
    if !v.causes.is_empty() {
        let of = match v.basis {
            Basis::TailExcess => "of the tail's excess over the median requests",
            Basis::LostTime => "of the time lost to impediments",
        };
        let _ = writeln!(out, "\nCauses, ranked (share {of}):");
        for (i, c) in v.causes.iter().enumerate() {
            let cause = super::serde_name(&c.cause());
            let place = match &c.acts_in {
                Some(a) if s.processes.len() > 1 => {
                    format!(" in {a}, {} of it", crate::units::pct(a.share))
                }
                _ => String::new(),
            };
            let _ = writeln!(
                out,
                "  {}. {:>3.0}%  {cause}{place}: {}\n         {}",
                i + 1,
                c.share * 100.0,
                c.mechanism,
                c.evidence
            );
        }
    }
    if let Some(b) = &v.bound {
        let _ = writeln!(out, "\nThroughput: {b}");
    }
    if !v.not_assessed.is_empty() {
        let _ = writeln!(out, "\nNot assessed (never counted as absent):");
        for n in &v.not_assessed {
            let _ = writeln!(out, "  - {}: {}", n.signal.replace('_', " "), n.reason);
        }
    }
    self_check(s, out);
    if let Some(r) = &s.requests {
        requests(r, out);
    }
    out.push('\n');
}

/// Says plainly when the recording disagrees with the kernel's own counts, thread by thread:
/// those numbers are not to be trusted.
fn self_check(s: &Summary, out: &mut String) {
    let Some(c) = &s.self_check else {
        return;
    };
    if c.disagreements.is_empty() {
        return;
    }
    let mut threads: Vec<u32> = c.disagreements.iter().map(|d| d.tid).collect();
    threads.dedup();
    let _ = writeln!(
        out,
        "\nSelf-check FAILED: for {} of {} threads the recording disagrees with the kernel's own \
         counts (/proc), so their numbers below are wrong{}:",
        threads.len(),
        c.threads_checked,
        if s.losses.unseen_switch_ins + s.losses.unseen_switch_outs > 0 {
            format!(
                " (the probes saw {} switches that no tracepoint reported)",
                s.losses.unseen_switch_ins + s.losses.unseen_switch_outs
            )
        } else {
            String::new()
        }
    );
    for d in c.disagreements.iter().take(10) {
        let (rec, ker) = if d.what == "oncpu_ns" {
            (dur(d.recorded), dur(d.kernel))
        } else {
            (d.recorded.to_string(), d.kernel.to_string())
        };
        let _ = writeln!(
            out,
            "  - TID {} ({}): {} recorded {rec}, the kernel counted {ker}",
            s.shown_id(d.tid),
            crate::recording::printable(&d.comm),
            d.what.replace('_', " ").replace(" ns", ""),
        );
    }
    if c.disagreements.len() > 10 {
        let _ = writeln!(
            out,
            "  ... {} more in the JSON (self_check)",
            c.disagreements.len() - 10
        );
    }
}

fn requests(r: &RequestAnalysis, out: &mut String) {
    if r.requests == 0 {
        let _ = writeln!(
            out,
            "\nRequests: none ended wholly in the window ({} left out: unpaired, or not wholly \
             in the window)",
            r.unpaired
        );
        return;
    }
    let _ = writeln!(
        out,
        "\nRequests: {} decomposed ({} left out: unpaired, or not wholly in the window), p50 {}  p90 {}  p99 {}  max {}; {:.0}% close \
         within 5% of their wall time",
        r.requests,
        r.unpaired,
        dur(r.p50_ns),
        dur(r.p90_ns),
        dur(r.p99_ns),
        dur(r.max_ns),
        r.closure_within_5pct * 100.0
    );
    if r.untraced_requests > 0 {
        let tids: Vec<String> = r.untraced_tids.iter().map(u32::to_string).collect();
        let _ = writeln!(
            out,
            "  warning: {} of them name threads this recording does not trace (tid {}): their \
             time is uncovered; a latency log's tid is the serving thread's gettid() in a \
             traced process, as this tool's PID namespace numbers it (a server in a container \
             numbers its threads as the container does: run the tracer in its namespace, \
             nsenter -t PID -p -m)",
            r.untraced_requests,
            tids.join(", ")
        );
    }
    breakdown_table(r, out);
    for (name, g) in [("tail", &r.tail), ("median", &r.median)] {
        if !g.blocked_by.is_empty() {
            let _ = writeln!(
                out,
                "  {name} blocked, ended by: {}",
                blocked_by(&g.blocked_by)
            );
        }
    }
    if !r.tail.queued_by.is_empty() {
        let _ = writeln!(
            out,
            "  tail queued behind: {}",
            queued_by(&r.tail.queued_by)
        );
    }
}

/// The median and tail requests' mean time in each part, and the tail's excess over the median.
fn breakdown_table(r: &RequestAnalysis, out: &mut String) {
    let _ = writeln!(
        out,
        "  {:<18} {:>10} {:>10} {:>10}",
        "mean per request",
        format!("median({})", r.median.requests),
        format!("tail({})", r.tail.requests),
        "excess"
    );
    // In `Breakdown::FIELDS` order (one name each: the type says so).
    let names: [&str; crate::analysis::requests::Breakdown::FIELDS.len()] = [
        "on CPU",
        "on CPU, queued",
        "run queue: others",
        "run queue: moved",
        "run queue: idle",
        "run queue: quota",
        "GPU wait",
        "other blocked",
        "lock wait",
        "runtime pause",
        "not covered",
    ];
    let (m, t, e) = (
        r.median.mean.values(),
        r.tail.mean.values(),
        r.excess.values(),
    );
    for (i, name) in names.iter().enumerate() {
        if m[i] == 0.0 && t[i] == 0.0 {
            continue;
        }
        let _ = writeln!(
            out,
            "  {name:<18} {:>10} {:>10} {:>10}",
            dur(m[i].max(0.0) as u64),
            dur(t[i].max(0.0) as u64),
            signed(e[i])
        );
    }
    let _ = writeln!(
        out,
        "  {:<18} {:>10} {:>10} {:>10}",
        "wall",
        dur(r.median.wall_ns_mean as u64),
        dur(r.tail.wall_ns_mean as u64),
        signed(r.excess_ns)
    );
}

/// "request 17 (60.1ms on a CPU) 19.3ms, their runtime pause 1.1ms": what the serving
/// thread was held up by while the tail waited in line (the chase, analysis/requests/queue.rs).
fn queued_by(v: &[crate::analysis::requests::QueuedBy]) -> String {
    v.iter()
        .filter(|q| q.ns >= 1_000.0)
        .map(|q| {
            let what = match (&q.request, q.cause) {
                (Some(r), _) => match r.id {
                    Some(id) => format!("request {id} ({} on a CPU)", dur(r.oncpu_ns as u64)),
                    None => format!(
                        "a request of thread {} ({} on a CPU)",
                        r.tid,
                        dur(r.oncpu_ns as u64)
                    ),
                },
                (None, "request") => "other long requests".into(),
                (None, "backlog") => "earlier requests in normal time".into(),
                (None, part) => format!("their {}", part.replace('_', " ")),
            };
            format!("{what} {}", dur(q.ns as u64))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// "thread 12 (python3) 3.1ms, a timer (its own timeout or sleep) 0.4ms".
fn blocked_by(v: &[BlockedBy]) -> String {
    v.iter()
        .map(|b| {
            let who =
                b.by.as_ref()
                    .map_or("others or unseen".into(), |w| w.describe());
            format!("{who} {}", dur(b.ns as u64))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn signed(ns: f64) -> String {
    if ns < 0.0 {
        format!("-{}", dur((-ns) as u64))
    } else {
        format!("+{}", dur(ns as u64))
    }
}

#[cfg(test)]
mod tests {
    use crate::recording::requests::{RequestSet, RequestSource, RequestSpan};

    /// Requests of a thread the recording does not trace are said to be, with the thread; a
    /// window without requests says none ended in it, not "p99 0ns".
    #[test]
    fn requests_say_what_they_could_not_use() {
        let text = |spans: Vec<RequestSpan>| {
            let mut rec = crate::recording::testutil::recording(vec![], vec![]);
            rec.requests = Some(RequestSet {
                source: RequestSource::File,
                spans,
                unpaired: 2,
            });
            crate::render::text::render(&crate::analysis::analyze(&rec))
        };
        let span = |s| RequestSpan {
            start_ns: s,
            end_ns: s + 100,
            tid: 4242,
            id: None,
        };
        let t = text(vec![span(2_000), span(3_000), span(4_000)]);
        assert!(
            t.contains("3 of them name threads this recording does not trace (tid 4242)"),
            "{t}"
        );
        let t = text(vec![]);
        assert!(
            t.contains("Requests: none ended wholly in the window (2 left out"),
            "{t}"
        );
        assert!(!t.contains("p99 0ns"), "{t}");
    }
}
