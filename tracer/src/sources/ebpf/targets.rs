//! The target set in the kernel: the processes whose threads the programs account (a bit per
//! TGID), the cgroups followed for processes moving in, and processes joining during the window.

use anyhow::{Context as _, Result};
use aya::maps::HashMap;

use super::SchedProbes;
use crate::recording::ProbeMode;

/// Sets (`on`) or clears the bits of `tgids` in the kernel side's target set (`TARGETS`, a bit
/// per TGID), before anything is attached: from then on every program treats their threads as
/// the target's (or not).
pub(super) fn mark_targets(ebpf: &mut aya::Ebpf, tgids: &[u32], on: bool) -> Result<()> {
    let mut set: aya::maps::Array<_, u64> =
        aya::maps::Array::try_from(ebpf.map_mut("TARGETS").context("TARGETS map")?)?;
    for &tgid in tgids {
        anyhow::ensure!(
            tgid < tracer_common::PID_LIMIT,
            "PID {tgid} is beyond the kernel's PID limit"
        );
        let word = set.get(&(tgid >> 6), 0).context("reading the target set")?;
        let bit = 1u64 << (tgid & 63);
        let word = if on { word | bit } else { word & !bit };
        set.set(tgid >> 6, word, 0)
            .context("writing the target set")?;
    }
    Ok(())
}

impl SchedProbes {
    /// Follows the cgroups `ids` (id, hierarchy id): a process moved into one during the window
    /// joins the set, from the kernel side where it can (tp_btf with the cgroup offsets; says
    /// whether it can), else only as `join` adds it.
    pub fn follow_cgroups(&mut self, ids: &[(u64, u32)]) -> Result<bool> {
        self.add_cgroups(ids)?;
        self.follow_cgroups = true;
        Ok(self.mode == ProbeMode::TpBtf && self.cgroup_offsets)
    }

    /// Adds cgroups to those followed (a descendant created during the window).
    pub fn add_cgroups(&mut self, ids: &[(u64, u32)]) -> Result<()> {
        let mut map: HashMap<_, u64, u32> = HashMap::try_from(
            self.ebpf
                .map_mut("TARGET_CGROUPS")
                .context("TARGET_CGROUPS map")?,
        )?;
        for &(id, hierarchy) in ids {
            map.insert(id, hierarchy, 0).with_context(|| {
                format!(
                    "following cgroup {id}: more than {} cgroups",
                    tracer_common::MAX_TARGET_CGROUPS
                )
            })?;
        }
        Ok(())
    }

    /// Stops following cgroups that were removed (their ids are never used again; the map
    /// keeps room for those made since).
    pub fn remove_cgroups(&mut self, ids: &[u64]) -> Result<()> {
        let mut map: HashMap<_, u64, u32> = HashMap::try_from(
            self.ebpf
                .map_mut("TARGET_CGROUPS")
                .context("TARGET_CGROUPS map")?,
        )?;
        for id in ids {
            // Absent already is as good.
            let _ = map.remove(id);
        }
        Ok(())
    }

    /// Adds a process found in a followed cgroup to the set, noted as joined now (the kernel
    /// side notes those it sees move in the same way); `tids`: its threads, which the classic
    /// programs know it by. False: it was a member already.
    pub fn join(&mut self, pid: u32, comm: &str, threads: &[u32]) -> Result<bool> {
        let set: aya::maps::Array<_, u64> =
            aya::maps::Array::try_from(self.ebpf.map("TARGETS").context("TARGETS map")?)?;
        if pid >= tracer_common::PID_LIMIT
            || set.get(&(pid >> 6), 0).context("reading the target set")? & (1 << (pid & 63)) != 0
        {
            return Ok(false);
        }
        mark_targets(&mut self.ebpf, &[pid], true)?;
        if self.mode == ProbeMode::Classic {
            // The classic programs know a switching task by its TID.
            let mut tids: HashMap<_, u32, u32> = HashMap::try_from(
                self.ebpf
                    .map_mut("TARGET_TIDS")
                    .context("TARGET_TIDS map")?,
            )?;
            for &tid in threads {
                let _ = tids.insert(tid, pid, 0);
            }
        }
        let mut c = tracer_common::ChildProcess {
            parent: 0,
            _pad: 0,
            created_ns: crate::sources::clock::monotonic_ns(),
            comm: [0; tracer_common::COMM_LEN],
        };
        for (d, b) in c
            .comm
            .iter_mut()
            .zip(comm.bytes().take(tracer_common::COMM_LEN - 1))
        {
            *d = b;
        }
        let mut children: HashMap<_, u32, tracer_common::ChildProcess> =
            HashMap::try_from(self.ebpf.map_mut("CHILDREN").context("CHILDREN map")?)?;
        children.insert(pid, c, 0)?;
        Ok(true)
    }

    /// Takes processes out of the target set before anything is attached (nothing writes the
    /// set but the programs, which are not attached yet).
    pub fn remove_targets(&mut self, tgids: &[u32]) -> Result<()> {
        mark_targets(&mut self.ebpf, tgids, false)
    }
}
