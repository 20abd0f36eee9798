//! `--cgroup` during the window: the kernel side adds a process moved into a followed cgroup
//! as it moves (tp_btf); once a second, the cgroups created under the one given are followed
//! too, and any process found in them that is not a member yet joins (the classic
//! tracepoints' only way, and a net under the kernel side's). A cgroup is followed by its
//! kernel id, so one removed and made again at the same path (systemd stops a unit's cgroup
//! with the unit and makes a new one at its start) is followed anew; the cgroup given going
//! and coming back is said.

use std::collections::BTreeSet;

use anyhow::Result;

use crate::sources::{cgroup_target::CgroupTarget, ebpf::SchedProbes, process};

pub struct CgroupWatch {
    target: CgroupTarget,
    /// The kernel ids (inode numbers) followed.
    ids: BTreeSet<u64>,
    /// Whether the cgroup given was there at the last poll.
    present: bool,
    notices: bool,
}

impl CgroupWatch {
    /// Follows `target`'s cgroups from the kernel side (before the programs are attached);
    /// `notices`: say on stderr when the cgroup given is removed or made again.
    pub fn start(target: &CgroupTarget, probes: &mut SchedProbes, notices: bool) -> Result<Self> {
        let ids = target.ids(&target.dirs());
        probes.follow_cgroups(&ids)?;
        Ok(Self {
            target: target.clone(),
            ids: ids.iter().map(|i| i.0).collect(),
            present: true,
            notices,
        })
    }

    /// Follows the cgroups created since, and adds the processes in any of them that are not
    /// members yet. Returns those added.
    pub fn poll(&mut self, probes: &mut SchedProbes) -> Result<Vec<u32>> {
        let now = self.target.dirs();
        let ids = self.target.ids(&now);
        let new: Vec<(u64, u32)> = ids
            .iter()
            .filter(|(id, _)| !self.ids.contains(id))
            .copied()
            .collect();
        // Removed ones make room first: a service restarted for days must not fill the map.
        let live: BTreeSet<u64> = ids.iter().map(|i| i.0).collect();
        let gone: Vec<u64> = self.ids.difference(&live).copied().collect();
        if !gone.is_empty() {
            probes.remove_cgroups(&gone)?;
            self.ids.retain(|id| live.contains(id));
        }
        if !new.is_empty() {
            probes.add_cgroups(&new)?;
            self.ids.extend(new.iter().map(|i| i.0));
        }
        self.say_presence();
        let mut added = Vec::new();
        for pid in CgroupTarget::pids(&now) {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            if probes.join(pid, comm.trim_end(), &process::task_ids(pid))? {
                added.push(pid);
            }
        }
        Ok(added)
    }

    /// The cgroup given removed, or back: said once each time.
    fn say_presence(&mut self) {
        let present = self.target.dir.is_dir();
        if present == self.present {
            return;
        }
        self.present = present;
        if !self.notices {
            return;
        }
        if present {
            eprintln!(
                "tracer: cgroup {} was made again: following it",
                self.target.dir.display()
            );
        } else {
            eprintln!(
                "tracer: cgroup {} was removed: its processes that moved elsewhere are still \
                 followed, and the cgroup is followed again if it is made again",
                self.target.dir.display()
            );
        }
    }
}
