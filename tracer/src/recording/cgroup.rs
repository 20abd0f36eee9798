//! The target's cgroup CPU bandwidth limits and throttling counters, as recorded (read by
//! `sources/cgroup.rs` from cgroup v2's `cpu.max`/`cpu.stat` or v1's `cpu.cfs_*`/`cpu.stat`).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Which cgroup hierarchy layout the host uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CgroupVersion {
    /// Only the unified hierarchy.
    V2,
    /// v1 controllers, with the unified hierarchy mounted beside them.
    Hybrid,
    V1,
}

/// A CPU bandwidth limit of one cgroup on the path from the target's cgroup to the root.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CpuLimit {
    pub cgroup: String,
    /// Its directory, where its own `cpu.stat` is: a quota on an ancestor throttles the
    /// whole subtree, and only the ancestor's counters show it.
    #[serde(default)]
    pub dir: PathBuf,
    pub quota_us: u64,
    pub period_us: u64,
    /// quota / period: how many CPUs' worth of time per period.
    pub cpus: f64,
}

/// Throttling counters of the cgroup, as `cpu.stat` reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Throttling {
    pub nr_periods: u64,
    pub nr_throttled: u64,
    pub throttled_ns: u64,
}

/// Where the target's CPU controller files are, and what they say.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CpuCgroup {
    pub version: CgroupVersion,
    /// The target's cgroup directory with the cpu controller.
    pub path: PathBuf,
    /// Its path in the hierarchy, as /proc/PID/cgroup names it.
    #[serde(default)]
    pub name: String,
    /// Limits set on it or on an ancestor (the smallest one binds).
    pub limits: Vec<CpuLimit>,
    pub throttling: Option<Throttling>,
}

/// The target cgroup's throttling counters at one moment, and those of every cgroup with a
/// limit on its path to the root (in the order of `CpuCgroup::limits`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgroupSample {
    pub t_ns: u64,
    #[serde(flatten)]
    pub throttling: Throttling,
    #[serde(default)]
    pub limited: Vec<Throttling>,
}
