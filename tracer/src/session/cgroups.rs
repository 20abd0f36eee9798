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
}

impl CgroupWatch {
    /// Follows `target`'s cgroups from the kernel side (before the programs are attached).
    pub fn start(target: &CgroupTarget, probes: &mut SchedProbes) -> Result<Self> {
        let ids = target.ids(&target.dirs());
        probes.follow_cgroups(&ids)?;
        Ok(Self {
            target: target.clone(),
            ids: ids.iter().map(|i| i.0).collect(),
            present: true,
        })
    }

    /// Follows the cgroups created since, and adds the processes in any of them that are not
    /// members yet. Returns what to say, if the cgroup given was removed or made again (the
    /// caller prints it, past its progress bar).
    pub fn poll(&mut self, probes: &mut SchedProbes) -> Result<Option<String>> {
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
        let notice = self.presence_changed();
        for pid in CgroupTarget::pids(&now) {
            if crate::sources::targets::is_self(pid) {
                continue;
            }
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            probes.join(pid, comm.trim_end(), &process::task_ids(pid))?;
        }
        Ok(notice)
    }

    /// The cgroup given removed, or back: said once each time.
    fn presence_changed(&mut self) -> Option<String> {
        let present = self.target.dir.is_dir();
        if present == self.present {
            return None;
        }
        self.present = present;
        let dir = self.target.dir.display();
        Some(if present {
            format!("tracer: cgroup {dir} was made again: following it")
        } else {
            format!(
                "tracer: cgroup {dir} was removed: its processes that moved elsewhere are still \
                 followed, and the cgroup is followed again if it is made again"
            )
        })
    }
}
