//! The verdict: which cause explains the target's latency jitter, with the mechanism, its share
//! and the evidence, and what could not be measured. Two bases: with requests, the excess of
//! the tail over the median requests, split by where it went (`from_requests`); without, the
//! impediments the target's threads met over the window (`impediments`). The thresholds and
//! their reasons are in docs/ATTRIBUTION.md. Pure: the summary in, the verdict out.

mod contention;
mod impediments;
pub mod mechanism;
pub mod model;
mod requests;

pub use model::{Basis, Cause, Mechanism, NotAssessed, Primary, Verdict};

use super::summary::Summary;
use mechanism::{ClockCap, ClocksHeld};

/// Causes below this share are left out of the ranking: too small to act on.
pub const MIN_SHARE: f64 = 0.10;

fn ranked(mut causes: Vec<Cause>, min_share: f64) -> Vec<Cause> {
    causes.retain(|c| c.share >= min_share && c.share > 0.0);
    causes.sort_by(|a, b| b.share.total_cmp(&a.share));
    causes
}

pub fn judge(s: &Summary) -> Verdict {
    let not_assessed = not_assessed(s);
    let window = impediments::causes(s);
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
         waiting is not in this verdict: trace them with -p",
        busy.len(),
        if busy.len() == 1 { "" } else { "es" },
        named.join(", "),
        if busy.len() > 5 { ", ..." } else { "" }
    ))
}

fn not_assessed(s: &Summary) -> Vec<NotAssessed> {
    let mut out = Vec::new();
    let mut add = |signal: &str, reason: String| {
        out.push(NotAssessed {
            signal: signal.into(),
            reason,
        })
    };
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
            "no requests given (--request-start/--request-end or --latencies): judged on the \
             impediments over the window, not on latency"
                .into(),
        );
    }
    if s.dropped_events > 0 {
        add(
            "complete_timeline",
            format!(
                "{} timeline events were lost to a full ring buffer (--ring-kib): per-request \
                 figures may be incomplete, totals are exact",
                s.dropped_events
            ),
        );
    }
    out
}

/// The neighbour that caused most of the target's run-queue waiting (idle CPUs and the
/// migration stopper aside: those are throttling, slow wakeups and migrations).
pub(crate) fn top_neighbour(s: &Summary) -> Option<&super::neighbours::Neighbour> {
    contention::top(s)
}

/// Whether the target's cgroup was throttled in the window.
fn throttled(s: &Summary) -> bool {
    s.cgroup
        .as_ref()
        .is_some_and(|c| c.throttled_periods > 0 || c.throttled_ns > 0)
}

fn throttle_evidence(s: &Summary) -> String {
    let Some(c) = &s.cgroup else {
        return String::new();
    };
    // The cgroup whose quota did it, which may be an ancestor of the target's.
    let by = c.throttled_by.as_deref();
    let quota = c
        .limits
        .iter()
        .find(|l| Some(l.cgroup.as_str()) == by)
        .map(|l| l.cpus)
        .or_else(|| c.limits_cpus.iter().copied().reduce(f64::min))
        .map_or(String::new(), |q| format!(", quota {q:.2} CPUs"));
    let whose = match by {
        Some(b) if !c.path.ends_with(b) => {
            format!("cgroup {b} (an ancestor of the target's {})", c.path)
        }
        _ => format!("cgroup {}", c.path),
    };
    format!(
        "{whose} throttled in {} of {} periods ({}){quota}",
        c.throttled_periods,
        c.periods,
        ms(c.throttled_ns as f64)
    )
}

/// Mean utilization of the GPUs the target uses (of all sampled ones if it uses none that NVML
/// attributes to it).
fn target_gpu_util(s: &Summary) -> Option<f64> {
    let g = s.gpu.as_ref()?;
    let used: Vec<f64> = g
        .devices
        .iter()
        .filter(|d| d.used_by_target)
        .filter_map(|d| d.util_gpu_pct)
        .collect();
    let all: Vec<f64> = g.devices.iter().filter_map(|d| d.util_gpu_pct).collect();
    let v = if used.is_empty() { all } else { used };
    v.into_iter().reduce(f64::max)
}

/// Why the GPU made the threads wait: other processes on it, a full GPU (its clocks perhaps
/// held down by power or heat), device-wide synchronization waiting for other work of the same
/// process, or longer GPU work. `device_sync`: the share of the tail's GPU waits spent in device-wide
/// synchronization, when requests were decomposed.
fn gpu_mechanism(s: &Summary, device_sync: Option<f64>) -> Mechanism {
    let util = target_gpu_util(s);
    let own = s.gpu.as_ref().and_then(|g| {
        g.devices
            .iter()
            .filter(|d| d.used_by_target)
            .filter_map(|d| d.target_sm_pct)
            .reduce(f64::max)
    });
    let reasons = s.gpu.as_ref().map(|g| {
        g.devices
            .iter()
            .flat_map(|d| d.clock_event_reasons.iter())
            .filter(|r| r.share_of_polls >= 0.2)
            .map(|r| r.reason)
            .collect::<Vec<_>>()
    });
    let has = |names: &[&str]| {
        reasons
            .as_ref()
            .is_some_and(|r| r.iter().any(|x| names.contains(x)))
    };
    if let (Some(u), Some(o)) = (util, own)
        && u >= impediments::GPU_BUSY_PCT
        && u - o >= OTHERS_GPU_MIN_PCT
    {
        return Mechanism::SmSaturationByOthers {
            gpu_busy_pct: u,
            own_sm_pct: o,
        };
    }
    // A power or thermal cap only matters to a GPU that is working hard: the H200 we measured
    // on reports its power-cap reason at 15 % utilization too, with its clocks at full speed.
    let clocks = s.gpu.as_ref().and_then(|g| {
        g.devices
            .iter()
            .find(|d| d.used_by_target)
            .or(g.devices.first())
    });
    if let Some(u) = util
        && u >= impediments::GPU_BUSY_PCT
    {
        let by = if has(&["sw_power_cap", "hw_power_brake_slowdown"]) {
            Some(ClockCap::PowerCap)
        } else if has(&["sw_thermal_slowdown", "hw_thermal_slowdown", "hw_slowdown"]) {
            Some(ClockCap::Thermal)
        } else {
            None
        };
        return Mechanism::SmSaturation {
            gpu_busy_pct: u,
            clocks_held: by.map(|by| ClocksHeld {
                by,
                sm_clock_mhz: clocks.and_then(|d| d.sm_clock_mhz),
                sm_clock_mhz_min: clocks.and_then(|d| d.sm_clock_mhz_min),
            }),
        };
    }
    // Device-wide synchronization waits for all of the process's GPU work: on a GPU that is not
    // full, a tail spent there is the request waiting for the process's other work.
    if device_sync.is_some_and(|d| d >= 0.5) {
        return Mechanism::SyncStalls { gpu_busy_pct: util };
    }
    Mechanism::LongerGpuWork { gpu_busy_pct: util }
}

/// The GPU counts as taken by other processes when its busy share exceeds the server's own
/// kernels' share by this much (NVML's per-process SM utilization).
pub const OTHERS_GPU_MIN_PCT: f64 = 20.0;

/// "34%" followed by `what`.
fn pct(share: f64, what: &str) -> String {
    let p = crate::units::pct(share);
    if what.is_empty() {
        p
    } else {
        format!("{p} {what}")
    }
}

fn ms(ns: f64) -> String {
    crate::units::dur_f(ns)
}

fn headline(s: &Summary, primary: Primary, causes: &[Cause], na: &[NotAssessed]) -> String {
    let latency = s.requests.as_ref().map(|r| {
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
    match (primary, causes.first()) {
        (Primary::None, _) => match latency {
            Some(l) => {
                format!("No significant jitter: {l}; no impediment above threshold{unmeasured}.")
            }
            None => format!(
                "No impediment above threshold: the threads got the CPU when they wanted it{unmeasured}."
            ),
        },
        (Primary::Unexplained, c) => format!(
            "Unexplained jitter: {}; {}{unmeasured}.",
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
            format!(
                "{}: {} ({scope}). {}",
                capitalize(p.name()),
                c.mechanism,
                c.mechanism.advice()
            )
        }
        (p, None) => capitalize(p.name()),
    }
}

fn capitalize(s: &str) -> String {
    let mut c = s.chars();
    c.next()
        .map(|f| f.to_uppercase().collect::<String>() + c.as_str())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests;
