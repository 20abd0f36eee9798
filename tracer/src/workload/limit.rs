//! A CPU bandwidth limit on the demo workload: a cgroup of its own under a quota (cpu.max on
//! cgroup v2, cpu.cfs_quota_us on v1), removed again when dropped.

use std::path::{Path, PathBuf};

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
        sweep_stale(&root);
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

/// Removes the cgroups earlier demos left behind (a demo killed before it could remove its
/// own): those whose workload PID is gone. Removing a cgroup that still holds a process fails,
/// so nothing running is touched.
fn sweep_stale(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("tracer-demo-"))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new("/proc").join(pid.to_string()).exists() {
            let _ = std::fs::remove_dir(e.path());
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroups_of_gone_demos_are_swept_and_others_left() {
        let root = std::env::temp_dir().join(format!("tracer-sweep-{}", std::process::id()));
        std::fs::create_dir_all(&root).unwrap();
        // A PID that was and is no more: a child that exited and was reaped.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let gone = child.id();
        child.wait().unwrap();
        let alive = std::process::id();
        for name in [
            format!("tracer-demo-{gone}"),
            format!("tracer-demo-{alive}"),
            "tracer-demo-notapid".into(),
            format!("other-{gone}"),
        ] {
            std::fs::create_dir(root.join(name)).unwrap();
        }
        sweep_stale(&root);
        let mut left: Vec<String> = std::fs::read_dir(&root)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        let mut want = vec![
            format!("other-{gone}"),
            format!("tracer-demo-{alive}"),
            "tracer-demo-notapid".to_string(),
        ];
        want.sort();
        assert_eq!(left, want);
        std::fs::remove_dir_all(&root).unwrap();
    }
}
