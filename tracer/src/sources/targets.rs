//! The target set: the processes given, and, following children (the default), every process
//! descended from them when the recording starts; the kernel side adds those forked during it
//! (tracer-ebpf `on_process_fork`). A service is a process tree (an API server, an engine, a
//! worker per GPU): the PID a user finds first is rarely the one that does the work.

use std::collections::BTreeMap;

use super::process::{Target, descendants, process_stat};
use crate::{
    error::TracerError,
    recording::{
        ProcCounts, ProcessRecord, ThreadInfo,
        children::{ChildSnapshot, Forked},
    },
};

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
}

impl Targets {
    /// One process, and its children when `follow`.
    pub fn of(target: Target, follow: bool) -> Self {
        let mut t = Self {
            members: vec![target],
            given: 1,
            follow,
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
            if !members.iter().any(|m| m.pid == t.pid) {
                members.push(t);
            }
        }
        let given = members.len();
        let mut t = Self {
            members,
            given,
            follow,
        };
        if follow {
            t.add_descendants();
        }
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
                ppid: process_stat(m.proc_pid)
                    .and_then(|s| m.host_tid(s.0))
                    .unwrap_or(0),
                comm: m.comm.clone(),
                cmdline: m.cmdline.clone(),
                given: i < self.given,
                joined_ns: None,
            })
            .collect();
        for f in joined {
            if out.iter().any(|p| p.pid == f.pid) {
                continue;
            }
            let cmdline = self
                .primary()
                .proc_pid_of(f.pid)
                .and_then(|p| procfs::process::Process::new(p as i32).ok())
                .and_then(|p| p.cmdline().ok())
                .unwrap_or_default();
            out.push(ProcessRecord {
                pid: f.pid,
                ppid: f.parent,
                comm: f.comm.clone(),
                cmdline,
                given: false,
                joined_ns: Some(f.created_ns),
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
        for m in &self.members {
            for c in m.children() {
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
