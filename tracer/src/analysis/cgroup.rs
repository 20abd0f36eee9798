//! The target's CPU bandwidth throttling over the window, from the `cpu.stat` samples of its
//! cgroup and of every ancestor with a quota. A quota throttles the whole subtree under it, and
//! only the cgroup that holds the quota counts it: with the limit on a parent, the target's own
//! cgroup says "throttled in 0 of 0 periods" while the parent was throttled in every one. The
//! throttling reported is the cgroup's that throttled the most.

use serde::Serialize;

use crate::recording::{
    CgroupRecording, Recording,
    cgroup::{CgroupSample, CgroupVersion, Throttling},
};

/// Throttling between two samples.
#[derive(Debug, Clone, Copy, Serialize, schemars::JsonSchema)]
pub struct ThrottlePoint {
    /// End of the interval (CLOCK_MONOTONIC).
    pub t_ns: u64,
    pub periods: u64,
    pub throttled_periods: u64,
    pub throttled_ns: u64,
}

/// One cgroup with a CPU quota, on the path from the target's cgroup to the root.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct LimitSummary {
    /// Its path in the hierarchy ("/" is the root).
    pub cgroup: String,
    /// quota / period: how many CPUs' worth of time per period.
    pub cpus: f64,
    pub periods: u64,
    pub throttled_periods: u64,
    pub throttled_ns: u64,
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct CgroupSummary {
    /// The target's cgroup directory.
    pub path: String,
    /// The members in it when the recording started (empty: the target, in files from before
    /// process trees).
    pub pids: Vec<u32>,
    pub version: String,
    /// CPU quotas on the cgroup or its ancestors, as `cpus` (quota / period).
    pub limits_cpus: Vec<f64>,
    /// Each of those limits, with the throttling it did over the window.
    pub limits: Vec<LimitSummary>,
    /// The cgroup whose quota throttled the most: the target's own, or an ancestor's; null
    /// when none throttled.
    pub throttled_by: Option<String>,
    /// Over the window, in the cgroup that throttled the most (else the target's own).
    pub periods: u64,
    pub throttled_periods: u64,
    pub throttled_ns: u64,
    /// Share of the bandwidth periods in which that cgroup was throttled.
    pub throttled_share: f64,
    pub series: Vec<ThrottlePoint>,
}

/// The series of one cgroup's counters (`pick` chooses them out of a sample).
fn series(
    samples: &[CgroupSample],
    pick: impl Fn(&CgroupSample) -> Throttling,
) -> Vec<ThrottlePoint> {
    samples
        .windows(2)
        .map(|w| {
            let (a, b) = (pick(&w[0]), pick(&w[1]));
            ThrottlePoint {
                t_ns: w[1].t_ns,
                periods: b.nr_periods.saturating_sub(a.nr_periods),
                throttled_periods: b.nr_throttled.saturating_sub(a.nr_throttled),
                throttled_ns: b.throttled_ns.saturating_sub(a.throttled_ns),
            }
        })
        .collect()
}

fn sum(s: &[ThrottlePoint]) -> (u64, u64, u64) {
    s.iter().fold((0, 0, 0), |(p, t, n), x| {
        (p + x.periods, t + x.throttled_periods, n + x.throttled_ns)
    })
}

/// The cgroup the verdict reads (the members' most throttled one, else the first member's),
/// and every cgroup of the members, the first member's first.
pub fn summarize(rec: &Recording) -> (Option<CgroupSummary>, Vec<CgroupSummary>) {
    let all: Vec<CgroupSummary> = rec
        .cgroup
        .iter()
        .chain(&rec.other_cgroups)
        .map(one)
        .collect();
    let judged = all
        .iter()
        .enumerate()
        .max_by_key(|(i, c)| {
            (
                c.throttled_ns.max(c.throttled_periods),
                std::cmp::Reverse(*i),
            )
        })
        .map(|(_, c)| c.clone());
    (judged, all)
}

fn one(c: &CgroupRecording) -> CgroupSummary {
    let own = series(&c.samples, |s| s.throttling);
    let (own_periods, own_throttled, own_ns) = sum(&own);
    let mut limits = Vec::new();
    let mut worst: Option<(String, Vec<ThrottlePoint>, u64)> = None;
    for (i, l) in c.cgroup.limits.iter().enumerate() {
        let s = series(&c.samples, |x| {
            x.limited.get(i).copied().unwrap_or_default()
        });
        let (periods, throttled_periods, throttled_ns) = sum(&s);
        limits.push(LimitSummary {
            cgroup: l.cgroup.clone(),
            cpus: l.cpus,
            periods,
            throttled_periods,
            throttled_ns,
        });
        let score = throttled_ns.max(throttled_periods);
        if score > 0 && worst.as_ref().is_none_or(|w| score > w.2) {
            worst = Some((l.cgroup.clone(), s, score));
        }
    }
    // The target's own counters win where it throttled too (its own quota, or the same one).
    let own_score = own_ns.max(own_throttled);
    let (throttled_by, series) = match worst {
        Some((name, s, score)) if score > own_score => (Some(name), s),
        _ if own_score > 0 => (Some(c.cgroup.name.clone()), own),
        _ => (None, own),
    };
    let (periods, throttled_periods, throttled_ns) = match throttled_by {
        Some(_) => sum(&series),
        None => (own_periods, own_throttled, own_ns),
    };
    CgroupSummary {
        path: c.cgroup.path.display().to_string(),
        pids: c.pids.clone(),
        version: match c.cgroup.version {
            CgroupVersion::V2 => "v2",
            CgroupVersion::Hybrid => "hybrid",
            CgroupVersion::V1 => "v1",
        }
        .into(),
        limits_cpus: c.cgroup.limits.iter().map(|l| l.cpus).collect(),
        limits,
        throttled_by,
        periods,
        throttled_periods,
        throttled_ns,
        throttled_share: if periods > 0 {
            throttled_periods as f64 / periods as f64
        } else {
            0.0
        },
        series,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        recording::CgroupRecording,
        recording::cgroup::{CpuCgroup, CpuLimit},
        recording::testutil::recording,
    };

    fn t(periods: u64, throttled: u64, ns: u64) -> Throttling {
        Throttling {
            nr_periods: periods,
            nr_throttled: throttled,
            throttled_ns: ns,
        }
    }

    #[test]
    fn a_quota_on_a_parent_is_named_as_what_throttled() {
        let mut rec = recording(vec![], vec![]);
        let limit = CpuLimit {
            cgroup: "/parent".into(),
            dir: "/sys/fs/cgroup/cpu/parent".into(),
            quota_us: 20_000,
            period_us: 100_000,
            cpus: 0.2,
        };
        let sample = |t_ns, own, parent| CgroupSample {
            t_ns,
            throttling: own,
            limited: vec![parent],
        };
        rec.cgroup = Some(CgroupRecording {
            pids: vec![],
            cgroup: CpuCgroup {
                version: CgroupVersion::V1,
                path: "/sys/fs/cgroup/cpu/parent/child".into(),
                name: "/parent/child".into(),
                limits: vec![limit],
                throttling: None,
            },
            samples: vec![
                sample(0, t(0, 0, 0), t(100, 10, 1_000)),
                sample(1, t(0, 0, 0), t(121, 31, 61_000)),
            ],
        });
        let s = summarize(&rec).0.unwrap();
        assert_eq!(s.throttled_by.as_deref(), Some("/parent"));
        assert_eq!(
            (s.periods, s.throttled_periods, s.throttled_ns),
            (21, 21, 60_000)
        );
        assert_eq!(s.limits[0].throttled_periods, 21);
    }

    #[test]
    fn of_the_members_cgroups_the_throttled_one_is_judged() {
        let mut rec = recording(vec![], vec![]);
        let cg = |name: &str, pids: Vec<u32>, throttled: u64| CgroupRecording {
            pids,
            cgroup: CpuCgroup {
                version: CgroupVersion::V2,
                path: format!("/sys/fs/cgroup{name}").into(),
                name: name.into(),
                limits: vec![],
                throttling: None,
            },
            samples: vec![
                CgroupSample {
                    t_ns: 0,
                    throttling: t(0, 0, 0),
                    limited: vec![],
                },
                CgroupSample {
                    t_ns: 1,
                    throttling: t(10, throttled, throttled * 1000),
                    limited: vec![],
                },
            ],
        };
        rec.cgroup = Some(cg("/api", vec![100], 0));
        rec.other_cgroups = vec![cg("/engine", vec![200, 201], 4), cg("/idle", vec![300], 0)];
        let (judged, all) = summarize(&rec);
        let judged = judged.unwrap();
        assert_eq!(
            (judged.path.as_str(), judged.throttled_periods),
            ("/sys/fs/cgroup/engine", 4)
        );
        assert_eq!(judged.pids, vec![200, 201]);
        let paths: Vec<&str> = all.iter().map(|c| c.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "/sys/fs/cgroup/api",
                "/sys/fs/cgroup/engine",
                "/sys/fs/cgroup/idle"
            ]
        );
        // None throttled: the first member's.
        rec.other_cgroups.truncate(0);
        rec.other_cgroups.push(cg("/idle", vec![300], 0));
        assert_eq!(summarize(&rec).0.unwrap().path, "/sys/fs/cgroup/api");
    }
}
