//! The target set: the processes given, and, following children (the default), every process
//! descended from them when the recording starts; the kernel side adds those forked during it
//! (tracer-ebpf `on_process_fork`). A service is a process tree (an API server, an engine, a
//! worker per GPU): the PID a user finds first is rarely the one that does the work.

use std::collections::BTreeMap;

use super::{
    cgroup_target::CgroupTarget,
    process::{Target, descendants, process_stat},
};
use crate::{
    error::TracerError,
    recording::{
        ProcCounts, ProcessRecord, ThreadInfo,
        children::{ChildSnapshot, Forked},
    },
};

/// Whether `proc_pid` (as this tool's /proc numbers it) is this tracer: under `-p` of an
/// ancestor (the shell that started it) or `--cgroup` of its own cgroup, it would otherwise
/// record its own work as the target's.
pub fn is_self(proc_pid: u32) -> bool {
    proc_pid == std::process::id()
}

/// Each member is pinned by its pidfd as a single target is.
#[derive(Debug, Clone)]
pub struct Targets {
    /// The members when the recording starts, the first PID given first: it names the
    /// recording.
    pub members: Vec<Target>,
    /// How many of `members`, from the first, were named; the rest are their descendants.
    pub given: usize,
    /// Descendants join: those alive now (listed here) and those forked in the window (by
    /// the kernel side).
    pub follow: bool,
    /// This tracer was among the descendants or the cgroup's processes, and was left out
    /// (its own work is not the target's).
    pub left_out_self: bool,
    /// `--cgroup`: its processes are members, and those that join it during the window.
    pub cgroup: Option<CgroupTarget>,
}

impl Targets {
    /// One process, and its children when `follow`.
    pub fn of(target: Target, follow: bool) -> Self {
        let mut t = Self {
            members: vec![target],
            given: 1,
            follow,
            cgroup: None,
            left_out_self: false,
        };
        if follow {
            t.add_descendants();
        }
        t
    }

    /// The processes `pids` names (a thread ID stands for its process), each once, and their
    /// descendants when `follow`. A PID that names no live process is an error that says which.
    pub fn resolve(pids: &[u32], follow: bool) -> Result<Self, TracerError> {
        let mut members: Vec<Target> = Vec::new();
        for &pid in pids {
            let t = Target::resolve(pid)?;
            if is_self(t.proc_pid) {
                return Err(TracerError::Usage {
                    message: format!(
                        "PID {pid} is this tracer itself: give the PID of the process to trace"
                    ),
                });
            }
            if !members.iter().any(|m| m.pid == t.pid) {
                members.push(t);
            }
        }
        let given = members.len();
        let mut t = Self {
            members,
            given,
            follow,
            cgroup: None,
            left_out_self: false,
        };
        if follow {
            t.add_descendants();
        }
        Ok(t)
    }

    /// The processes `pids` names, then every process in `cgroup` and its descendant cgroups
    /// (lowest PID first: a service's first process), and their descendants; those that
    /// join the cgroup during the window join the set too. None at all is an error.
    pub fn with_cgroup(pids: &[u32], cgroup: CgroupTarget) -> Result<Self, TracerError> {
        // Descendants once, of every member, after the cgroup's processes are in.
        let mut t = Self::resolve(pids, false)?;
        t.follow = true;
        for pid in CgroupTarget::pids(&cgroup.dirs()) {
            // One exiting as the cgroup is read is gone, not an error.
            let Ok(m) = Target::resolve(pid) else {
                continue;
            };
            if is_self(m.proc_pid) {
                t.left_out_self = true;
                continue;
            }
            if !t.members.iter().any(|x| x.pid == m.pid) {
                t.members.push(m);
            }
        }
        if t.members.is_empty() {
            return Err(TracerError::Usage {
                message: format!(
                    "cgroup {} ({}) has no process now: start the service first (processes \
                     that join it during the recording are traced, but the recording needs one \
                     to start with), or give one with -p",
                    cgroup.given,
                    cgroup.dir.display()
                ),
            });
        }
        t.add_descendants();
        t.cgroup = Some(cgroup);
        Ok(t)
    }

    /// Adds every live descendant of the members. One that exits while being resolved is
    /// left out: it is gone, and a fork after this is the kernel side's to see.
    fn add_descendants(&mut self) {
        let given: Vec<u32> = self.members.iter().map(|m| m.proc_pid).collect();
        for pid in given {
            for (child, _, _, _) in descendants(pid) {
                let Ok(t) = Target::resolve(child) else {
                    continue;
                };
                if is_self(t.proc_pid) {
                    self.left_out_self = true;
                    continue;
                }
                if !self.members.iter().any(|m| m.pid == t.pid) {
                    self.members.push(t);
                }
            }
        }
    }

    /// The members as the recording lists them, and those the kernel side saw join.
    pub fn records(&self, joined: &[Forked]) -> Vec<ProcessRecord> {
        let mut out: Vec<ProcessRecord> = self
            .members
            .iter()
            .enumerate()
            .map(|(i, m)| ProcessRecord {
                pid: m.pid,
                ppid: m.host_tid(m.ppid).filter(|_| m.ppid != 0).unwrap_or(0),
                comm: m.comm.clone(),
                cmdline: m.cmdline.clone(),
                given: i < self.given,
                joined_ns: None,
                cgroup: m.cgroup.clone(),
                python: crate::sources::python::detect(m.proc_pid),
            })
            .collect();
        for f in joined {
            if out.iter().any(|p| p.pid == f.pid) {
                continue;
            }
            let proc_pid = self.primary().proc_pid_of(f.pid);
            let cmdline = proc_pid
                .and_then(|p| procfs::process::Process::new(p as i32).ok())
                .and_then(|p| p.cmdline().ok())
                .unwrap_or_default();
            // One that joined by moving into a followed cgroup: its parent from /proc.
            let ppid = match f.parent {
                0 => proc_pid
                    .and_then(process_stat)
                    .and_then(|s| self.primary().host_tid(s.0))
                    .unwrap_or(0),
                p => p,
            };
            out.push(ProcessRecord {
                pid: f.pid,
                ppid,
                comm: f.comm.clone(),
                cmdline,
                given: false,
                joined_ns: Some(f.created_ns),
                cgroup: proc_pid.and_then(crate::sources::cgroup::cgroup_name),
                python: proc_pid.and_then(crate::sources::python::detect),
            });
        }
        out
    }

    /// The set less the processes `gone`.
    pub fn without(&self, gone: &[u32]) -> Self {
        let mut t = self.clone();
        t.members.retain(|m| !gone.contains(&m.pid));
        t
    }

    /// The first process given.
    pub fn primary(&self) -> &Target {
        &self.members[0]
    }

    /// The members' kernel PIDs (TGIDs), for the kernel side's set.
    pub fn tgids(&self) -> Vec<u32> {
        self.members.iter().map(|m| m.pid).collect()
    }

    /// Every member's threads now, by kernel TID.
    pub fn threads(&self) -> BTreeMap<u32, ThreadInfo> {
        self.members.iter().flat_map(|m| m.threads()).collect()
    }

    /// Every member's threads' own counters now, at most `limit` in all, and how many more.
    pub fn thread_counts(&self, limit: usize) -> (BTreeMap<u32, ProcCounts>, u64) {
        let mut out = BTreeMap::new();
        let mut more = 0;
        for m in &self.members {
            let (counts, left) = m.thread_counts(limit.saturating_sub(out.len()));
            more += left;
            out.extend(counts);
        }
        (out, more)
    }

    /// The members' descendants that are not members (none when following children, but
    /// for a process forked since the set was listed).
    pub fn children(&self) -> Vec<ChildSnapshot> {
        let mut out: Vec<ChildSnapshot> = Vec::new();
        let table = super::process::ProcTable::read();
        for m in &self.members {
            for c in m.children(&table) {
                if !self.members.iter().any(|x| x.pid == c.pid)
                    && !out.iter().any(|o| o.pid == c.pid)
                {
                    out.push(c);
                }
            }
        }
        out
    }
}
