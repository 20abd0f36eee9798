//! `--cgroup` during the window: the kernel side adds a process moved into a followed cgroup
//! as it moves (tp_btf); once a second, the cgroups created under the one given are followed
//! too, and any process found in them that is not a member yet joins (the classic
//! tracepoints' only way, and a net under the kernel side's).

use std::{collections::BTreeSet, path::PathBuf};

use anyhow::Result;

use crate::sources::{cgroup_target::CgroupTarget, ebpf::SchedProbes, process};

pub struct CgroupWatch {
    target: CgroupTarget,
    dirs: BTreeSet<PathBuf>,
}

impl CgroupWatch {
    /// Follows `target`'s cgroups from the kernel side (before the programs are attached).
    pub fn start(target: &CgroupTarget, probes: &mut SchedProbes) -> Result<Self> {
        let dirs = target.dirs();
        probes.follow_cgroups(&target.ids(&dirs))?;
        Ok(Self {
            target: target.clone(),
            dirs: dirs.into_iter().collect(),
        })
    }

    /// Follows the cgroups created since, and adds the processes in any of them that are not
    /// members yet. Returns those added.
    pub fn poll(&mut self, probes: &mut SchedProbes) -> Result<Vec<u32>> {
        let now = self.target.dirs();
        let new: Vec<PathBuf> = now
            .iter()
            .filter(|d| !self.dirs.contains(*d))
            .cloned()
            .collect();
        if !new.is_empty() {
            probes.add_cgroups(&self.target.ids(&new))?;
            self.dirs.extend(new);
        }
        let mut added = Vec::new();
        for pid in CgroupTarget::pids(&now) {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            if probes.join(pid, comm.trim_end(), &process::task_ids(pid))? {
                added.push(pid);
            }
        }
        Ok(added)
    }
}
