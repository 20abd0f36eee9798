//! The numbers behind the causes, in words, as both bases of the verdict write them: shares,
//! durations, and the cgroup throttling seen.

use crate::analysis::summary::Summary;

/// "34%" followed by `what`.
pub fn pct(share: f64, what: &str) -> String {
    let p = crate::units::pct(share);
    if what.is_empty() {
        p
    } else {
        format!("{p} {what}")
    }
}

pub fn ms(ns: f64) -> String {
    crate::units::dur_f(ns)
}

/// Whether the target's cgroup was throttled in the window.
pub fn throttled(s: &Summary) -> bool {
    s.cgroup
        .as_ref()
        .is_some_and(|c| c.throttled_periods > 0 || c.throttled_ns > 0)
}

pub fn throttle_evidence(s: &Summary) -> String {
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
    // In a service spread over cgroups, which members this one holds.
    let holding = if s.cgroups.len() > 1 && !c.pids.is_empty() {
        let pids: Vec<String> = c.pids.iter().map(|p| s.shown_id(*p)).collect();
        format!(" (holding PID {})", pids.join(", "))
    } else {
        String::new()
    };
    format!(
        "{whose}{holding} throttled in {} of {} periods ({}){quota}",
        c.throttled_periods,
        c.periods,
        ms(c.throttled_ns as f64)
    )
}
