//! The verdict: which cause explains the target's latency jitter, with the mechanism, its share
//! and the evidence, and what could not be measured. Two bases: with requests, the excess of
//! the tail over the median requests, split by where it went (`from_requests`); without, the
//! impediments the target's threads met over the window (`impediments`). The thresholds and
//! their reasons are in docs/ATTRIBUTION.md. Pure: the summary in, the verdict out.

mod contention;
mod evidence;
mod gpu;
mod held;
mod impediments;
pub mod mechanism;
pub mod model;
mod placement;
mod queue;
mod ranks;
mod requests;
mod words;

pub use model::{Basis, Cause, Mechanism, NotAssessed, Primary, Verdict};

use super::summary::Summary;
use evidence::ms;

/// Causes below this share are left out of the ranking: too small to act on.
pub const MIN_SHARE: f64 = 0.10;

/// A window shorter than about a second cannot rule a cause out: NVML's utilization sample
/// covers up to 1 s, a CFS bandwidth period is 100 ms, and Python's GC or a burst of neighbours
/// comes every few seconds. What it measured stands; what it did not see is not called absent
/// (docs/ATTRIBUTION.md). 0.9 s, not 1 s: a watch's `-i 1s` window ends when its cut is taken,
/// a few ms either side of the second.
pub const MIN_WINDOW_NS: u64 = 900_000_000;

fn ranked(mut causes: Vec<Cause>, min_share: f64) -> Vec<Cause> {
    causes.retain(|c| c.share >= min_share && c.share > 0.0);
    causes.sort_by(|a, b| b.share.total_cmp(&a.share));
    causes
}

pub fn judge(s: &Summary) -> Verdict {
    let not_assessed = not_assessed(s);
    let window = impediments::causes(s);
    // The time behind the shares: the impediments' own (`impediments::causes` keeps it), or
    // for the tail its share of the tail's excess, summed over the tail requests.
    let lost_total: f64 = window.iter().map(|c| c.attributed_ns).sum();
    let bound = impediments::bound(s);
    let reqs = s.requests.as_ref();
    let (basis, causes) = match reqs {
        Some(r) if r.jitter => {
            let causes = explain_queueing(requests::causes(s, r), &window);
            (Basis::TailExcess, ranked(causes, MIN_SHARE))
        }
        // Each impediment rule applies its own threshold; the shares only rank them.
        _ => (Basis::LostTime, ranked(window, 0.0)),
    };
    let tail_excess = reqs.map_or(0.0, |r| r.excess_ns.max(0.0) * r.tail.requests as f64);
    let causes: Vec<Cause> = causes
        .into_iter()
        .map(|c| Cause {
            acts_in: placement::place(s, &c.mechanism, basis == Basis::TailExcess),
            attributed_ns: match basis {
                Basis::TailExcess => c.share * tail_excess,
                Basis::LostTime => c.share * lost_total,
            },
            ..c
        })
        .collect();
    let causes = ranks::apply(s, basis, causes);
    let primary = match (causes.first(), reqs) {
        (Some(c), _) => c.cause(),
        (None, Some(r)) if r.jitter => Primary::Unexplained,
        _ => Primary::None,
    };
    let headline = headline(s, primary, &causes, &not_assessed);
    Verdict {
        primary,
        headline,
        basis,
        causes,
        not_assessed,
        bound,
    }
}

/// Queueing behind earlier requests is a symptom: work piled up while something kept the
/// server's threads from running, possibly before the requests were even admitted (a
/// throttled dispatcher admits a burst when it runs again). When impediments over the window
/// are above their thresholds, the queueing share goes to them, in proportion to the time each
/// took; otherwise it stays unexplained.
fn explain_queueing(mut causes: Vec<Cause>, window: &[Cause]) -> Vec<Cause> {
    let Some(q) = causes
        .iter()
        .position(|c| c.mechanism == Mechanism::Queueing)
    else {
        return causes;
    };
    if window.is_empty() || causes[q].share <= 0.0 {
        return causes;
    }
    let queue = causes.remove(q);
    for w in window {
        let add = queue.share * w.share;
        if add < 0.005 {
            continue;
        }
        match causes.iter_mut().find(|c| c.mechanism == w.mechanism) {
            Some(c) => {
                c.share += add;
                c.evidence.push_str(&format!(
                    "; and {:.0}% of the excess is queueing behind requests it delayed",
                    add * 100.0
                ));
            }
            None => causes.push(Cause::new(
                w.mechanism.clone(),
                add,
                format!(
                    "{}; the tail queued behind earlier requests ({}), the backlog this left",
                    w.evidence, queue.evidence
                ),
            )),
        }
    }
    causes
}

/// The target's child processes that worked in the window (on a CPU for 1 % of it, or of
/// unknown CPU time), busiest first, in words.
fn working_children(s: &Summary) -> Option<String> {
    let mut busy: Vec<&crate::recording::ChildRecord> = s
        .untraced_children
        .iter()
        .filter(|c| c.cpu_ns.is_none_or(|n| n * 100 >= s.duration_ns))
        .collect();
    if busy.is_empty() {
        return None;
    }
    busy.sort_by_key(|c| std::cmp::Reverse(c.cpu_ns));
    let named: Vec<String> = busy
        .iter()
        .take(5)
        .map(|c| {
            let cpu = c
                .cpu_ns
                .map_or(String::new(), |n| format!(", {} on a CPU", ms(n as f64)));
            format!(
                "PID {} ({}{cpu})",
                s.shown_id(c.pid),
                crate::recording::printable(&c.comm)
            )
        })
        .collect();
    Some(format!(
        "{} child process{} of the target worked in the window untraced: {}{}; their threads' \
         waiting is not in this verdict: trace them with -p (or without --no-children)",
        busy.len(),
        if busy.len() == 1 { "" } else { "es" },
        named.join(", "),
        if busy.len() > 5 { ", ..." } else { "" }
    ))
}

fn not_assessed(s: &Summary) -> Vec<NotAssessed> {
    let mut out = signals_not_measured(s);
    out.extend(recording_short(s));
    out
}

fn gap(signal: &str, reason: String) -> NotAssessed {
    NotAssessed {
        signal: signal.into(),
        reason,
    }
}

/// The signals this host or this recording could not measure: child processes' work, cache
/// misses, the GPU and its waits, the cgroup's throttling, request latency.
fn signals_not_measured(s: &Summary) -> Vec<NotAssessed> {
    let mut out = Vec::new();
    let mut add = |signal: &str, reason: String| out.push(gap(signal, reason));
    if let Some(why) = working_children(s) {
        add("child_processes", why);
    }
    if !s.capabilities.pmu.llc_available {
        add(
            "cache_misses",
            format!(
                "LLC miss and instruction counters unavailable ({}); cache thrash can be \
                 neither confirmed nor ruled out",
                s.capabilities.pmu.reason
            ),
        );
    }
    if s.gpu.is_none() {
        add(
            "gpu",
            format!("no GPU sampled: {}", s.capabilities.gpu.reason),
        );
    } else if !s.cuda.measured {
        add(
            "gpu_waits",
            format!(
                "time blocked on the GPU not measured: {}",
                s.capabilities.gpu.cuda.reason
            ),
        );
    }
    if s.cgroup.is_none() {
        add(
            "cgroup_throttling",
            "the target's cgroup cpu.stat was not found".into(),
        );
    }
    if s.requests.is_none() {
        add(
            "request_latency",
            "no requests known (none given with --request-start/--request-end or --latencies, \
             or none of those given fired or could be read): judged on the impediments over \
             the window, not on latency"
                .into(),
        );
    }
    out
}

/// Where the recording itself falls short: a window under a second, an unfinished trace
/// file, a timeline with gaps.
fn recording_short(s: &Summary) -> Vec<NotAssessed> {
    let mut out = Vec::new();
    let mut add = |signal: &str, reason: String| out.push(gap(signal, reason));
    if s.duration_ns < MIN_WINDOW_NS {
        add(
            "window_length",
            format!(
                "the window was {}, under a second: too short to rule out causes that recur \
                 less often (cgroup quota periods, GPU utilization samples, GC); what it \
                 measured stands: record a longer window to judge the rest",
                ms(s.duration_ns as f64)
            ),
        );
    }
    if s.incomplete.is_some() {
        // The text output prints the whole reason as a warning already.
        add(
            "complete_recording",
            "the trace file was not finished: what ran while the threads waited \
             (preemptors), migration routes and the kernel's exact totals were in its missing \
             final frame"
                .into(),
        );
    }
    // One entry for the timeline, with each way it fell short.
    let mut gaps = Vec::new();
    if let Some(t) = s.timeline_missing_before_ns {
        gaps.push(format!(
            "its first {} were let go by the flight recorder's memory ceiling (--keep-max-mib)",
            ms(t.saturating_sub(s.start_ns) as f64)
        ));
    }
    if s.dropped_events > 0 {
        gaps.push(format!(
            "{} of its events were lost to a full ring buffer (--ring-kib)",
            s.dropped_events
        ));
    }
    if !gaps.is_empty() {
        add(
            "complete_timeline",
            format!(
                "the timeline is incomplete: {}; per-request figures may be incomplete, totals \
                 are exact",
                gaps.join("; and ")
            ),
        );
    }
    out
}

/// The neighbour that caused most of the target's run-queue waiting (idle CPUs and the
/// migration stopper aside: those are throttling, slow wakeups and migrations).
pub(crate) fn top_neighbour(s: &Summary) -> Option<super::neighbours::Neighbour> {
    contention::top(s)
}

fn headline(s: &Summary, primary: Primary, causes: &[Cause], na: &[NotAssessed]) -> String {
    // No request ended in the window: nothing to say of their latency ("p99 0ns").
    let latency = s.requests.as_ref().filter(|r| r.requests > 0).map(|r| {
        format!(
            "p99 {} is {:.1}x p50 {}",
            ms(r.p99_ns as f64),
            r.jitter_ratio,
            ms(r.p50_ns as f64)
        )
    });
    let missing: Vec<&str> = na
        .iter()
        .filter(|n| {
            matches!(
                n.signal.as_str(),
                "cache_misses" | "gpu_waits" | "child_processes"
            )
        })
        .map(|n| n.signal.as_str())
        .collect();
    let unmeasured = if missing.is_empty() {
        String::new()
    } else {
        format!(" (not measured: {})", missing.join(", ").replace('_', " "))
    };
    let little = little(s);
    match (primary, causes.first()) {
        (Primary::None, _) if s.duration_ns == 0 => {
            "Nothing to judge: the recording covers no time (an unfinished trace file, or a \
             zero-length window)."
                .into()
        }
        (Primary::None, _) => match latency {
            Some(l) => {
                format!(
                    "No significant jitter{little}: {l}; no impediment above \
                     threshold{unmeasured}."
                )
            }
            None => format!(
                "No impediment above threshold{little}: the threads got the CPU when they wanted \
                 it{unmeasured}."
            ),
        },
        (Primary::Unexplained, c) => format!(
            "Unexplained jitter{little}: {}; {}{unmeasured}.",
            latency.unwrap_or_default(),
            c.map_or(
                "no measured signal accounts for the tail".into(),
                |c| format!(
                    "{:.0}% of the tail excess is {}",
                    c.share * 100.0,
                    c.mechanism
                )
            )
        ),
        (p, Some(c)) => {
            let scope = match &latency {
                Some(l) if s.requests.as_ref().is_some_and(|r| r.jitter) => {
                    format!("{l}; {:.0}% of the tail excess", c.share * 100.0)
                }
                // A share of what the threads lost to the impediments found, not of their time.
                _ => format!("{:.0}% of the time lost to impediments", c.share * 100.0),
            };
            // In a service of several processes, the member it acts in comes first.
            let place = match &c.acts_in {
                Some(a) if s.processes.len() > 1 => format!(" in {a}"),
                _ => String::new(),
            };
            // A cause found in a few milliseconds stands, but says how little it rests on.
            format!(
                "{}{place}{little}: {} ({scope}). {}",
                capitalize(p.name()),
                c.mechanism,
                c.mechanism.advice()
            )
        }
        (p, None) => capitalize(p.name()),
    }
}

/// What a verdict rests on, when that is little: above all for "no impediment", which claims
/// an absence.
fn little(s: &Summary) -> String {
    let mut little = String::new();
    if s.duration_ns < MIN_WINDOW_NS {
        little += &format!(" in only {}", ms(s.duration_ns as f64));
    }
    if s.incomplete.is_some() {
        little += " of an unfinished trace file";
    }
    little
}

fn capitalize(s: &str) -> String {
    let mut c = s.chars();
    c.next()
        .map(|f| f.to_uppercase().collect::<String>() + c.as_str())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests;
