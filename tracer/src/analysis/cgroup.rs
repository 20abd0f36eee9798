//! The target cgroup's CPU bandwidth throttling over the window, from the `cpu.stat` samples.

use serde::Serialize;

use crate::{
    recording::Recording,
    sources::cgroup::{CgroupVersion, CpuLimit},
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

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct CgroupSummary {
    pub path: String,
    pub version: String,
    /// CPU quotas on the cgroup or its ancestors, as `cpus` (quota / period).
    pub limits_cpus: Vec<f64>,
    /// Over the window.
    pub periods: u64,
    pub throttled_periods: u64,
    pub throttled_ns: u64,
    /// Share of the bandwidth periods in which the cgroup was throttled.
    pub throttled_share: f64,
    pub series: Vec<ThrottlePoint>,
}

pub fn summarize(rec: &Recording) -> Option<CgroupSummary> {
    let c = rec.cgroup.as_ref()?;
    let series: Vec<ThrottlePoint> = c
        .samples
        .windows(2)
        .map(|w| ThrottlePoint {
            t_ns: w[1].t_ns,
            periods: w[1]
                .throttling
                .nr_periods
                .saturating_sub(w[0].throttling.nr_periods),
            throttled_periods: w[1]
                .throttling
                .nr_throttled
                .saturating_sub(w[0].throttling.nr_throttled),
            throttled_ns: w[1]
                .throttling
                .throttled_ns
                .saturating_sub(w[0].throttling.throttled_ns),
        })
        .collect();
    let periods: u64 = series.iter().map(|p| p.periods).sum();
    let throttled_periods: u64 = series.iter().map(|p| p.throttled_periods).sum();
    Some(CgroupSummary {
        path: c.cgroup.path.display().to_string(),
        version: match c.cgroup.version {
            CgroupVersion::V2 => "v2",
            CgroupVersion::Hybrid => "hybrid",
            CgroupVersion::V1 => "v1",
        }
        .into(),
        limits_cpus: c.cgroup.limits.iter().map(|l: &CpuLimit| l.cpus).collect(),
        periods,
        throttled_periods,
        throttled_ns: series.iter().map(|p| p.throttled_ns).sum(),
        throttled_share: if periods > 0 {
            throttled_periods as f64 / periods as f64
        } else {
            0.0
        },
        series,
    })
}
