//! A CPU bandwidth limit on the demo workload: a cgroup of its own under a quota (cpu.max on
//! cgroup v2, cpu.cfs_quota_us on v1), removed again when dropped.

use std::path::PathBuf;

use anyhow::{Context as _, Result};

use crate::{
    recording::cgroup::CgroupVersion,
    sources::cgroup::{cpu_root, version},
};

/// The bandwidth period: the kernel's default, so a quota of q CPUs lets the group run
/// q x 100 ms in every 100 ms.
const PERIOD_US: u64 = 100_000;

pub struct CpuLimit {
    version: CgroupVersion,
    root: PathBuf,
    dir: PathBuf,
}

fn write(path: PathBuf, value: &str) -> Result<()> {
    std::fs::write(&path, value).with_context(|| format!("writing {value:?} to {}", path.display()))
}

impl CpuLimit {
    /// Moves `pid` (all its threads) into a new cgroup, without a limit yet.
    pub fn create(pid: u32) -> Result<Self> {
        let version = version();
        let root = cpu_root(version);
        if version == CgroupVersion::V2 {
            let controllers =
                std::fs::read_to_string(root.join("cgroup.subtree_control")).unwrap_or_default();
            if !controllers.split_whitespace().any(|c| c == "cpu") {
                write(root.join("cgroup.subtree_control"), "+cpu")
                    .context("enabling the cpu controller for child cgroups")?;
            }
        }
        let dir = root.join(format!("tracer-demo-{pid}"));
        std::fs::create_dir(&dir).with_context(|| {
            format!(
                "creating the cgroup {} (the cfs-throttle scenario needs root and a writable \
                 cgroup hierarchy with the cpu controller)",
                dir.display()
            )
        })?;
        let limit = Self { version, root, dir };
        write(limit.dir.join("cgroup.procs"), &pid.to_string())?;
        Ok(limit)
    }

    /// Moves another process into the cgroup: it then shares the quota.
    pub fn add(&self, pid: u32) -> Result<()> {
        write(self.dir.join("cgroup.procs"), &pid.to_string())
    }

    /// Limits the cgroup to `cpus` CPUs' worth of time per period.
    pub fn set(&self, cpus: f64) -> Result<()> {
        let quota = (cpus * PERIOD_US as f64).round().max(1000.0) as u64;
        match self.version {
            CgroupVersion::V2 => write(self.dir.join("cpu.max"), &format!("{quota} {PERIOD_US}")),
            _ => {
                write(self.dir.join("cpu.cfs_period_us"), &PERIOD_US.to_string())?;
                write(self.dir.join("cpu.cfs_quota_us"), &quota.to_string())
            }
        }
    }

    pub fn path(&self) -> &std::path::Path {
        &self.dir
    }
}

impl Drop for CpuLimit {
    fn drop(&mut self) {
        // Whatever is still inside goes back to the root, then the cgroup goes.
        if let Ok(procs) = std::fs::read_to_string(self.dir.join("cgroup.procs")) {
            for pid in procs.lines() {
                let _ = std::fs::write(self.root.join("cgroup.procs"), pid);
            }
        }
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() || !self.dir.exists() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        eprintln!("tracer: could not remove the cgroup {}", self.dir.display());
    }
}
