//! The target's child processes, which its TGID filter does not trace: those /proc showed at
//! the window's start, and those the kernel side saw forked during it (tracer-ebpf
//! `on_process_fork`), with what /proc shows of them at the end.

use std::collections::BTreeMap;

use super::ChildRecord;

/// A descendant of the target as /proc showed it: PID, parent, name, CPU time so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildSnapshot {
    pub pid: u32,
    pub parent: u32,
    pub comm: String,
    pub cpu_ns: u64,
}

/// A fork the kernel side saw: PID, parent, name, when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forked {
    pub pid: u32,
    pub parent: u32,
    pub comm: String,
    pub created_ns: u64,
}

/// Joins the three views. A child's CPU time over the window is known when /proc showed it at
/// both ends, or when it was born inside the window and was still there at the end (all of
/// its life).
pub fn child_records(
    start: &[ChildSnapshot],
    end: &[ChildSnapshot],
    forked: &[Forked],
) -> Vec<ChildRecord> {
    let at_end: BTreeMap<u32, &ChildSnapshot> = end.iter().map(|c| (c.pid, c)).collect();
    let mut out: BTreeMap<u32, ChildRecord> = BTreeMap::new();
    for c in start {
        let e = at_end.get(&c.pid);
        out.insert(
            c.pid,
            ChildRecord {
                pid: c.pid,
                parent: c.parent,
                comm: e.map_or(c.comm.clone(), |e| e.comm.clone()),
                created_ns: None,
                alive_at_end: e.is_some(),
                cpu_ns: e.map(|e| e.cpu_ns.saturating_sub(c.cpu_ns)),
            },
        );
    }
    for f in forked {
        let e = at_end.get(&f.pid);
        out.entry(f.pid).or_insert_with(|| ChildRecord {
            pid: f.pid,
            parent: f.parent,
            comm: e.map_or(f.comm.clone(), |e| e.comm.clone()),
            created_ns: Some(f.created_ns),
            alive_at_end: e.is_some(),
            cpu_ns: e.map(|e| e.cpu_ns),
        });
    }
    out.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(pid: u32, comm: &str, cpu_ns: u64) -> ChildSnapshot {
        ChildSnapshot {
            pid,
            parent: 1,
            comm: comm.into(),
            cpu_ns,
        }
    }

    #[test]
    fn children_from_proc_and_forks_are_joined() {
        let start = [snap(10, "worker", 100), snap(11, "gone", 5)];
        let end = [snap(10, "worker", 900), snap(12, "new", 40)];
        let forked = [
            Forked {
                pid: 12,
                parent: 10,
                comm: "python3".into(),
                created_ns: 7,
            },
            Forked {
                pid: 13,
                parent: 1,
                comm: "brief".into(),
                created_ns: 8,
            },
        ];
        let r = child_records(&start, &end, &forked);
        let by = |pid| r.iter().find(|c| c.pid == pid).unwrap();
        assert_eq!(r.len(), 4);
        assert_eq!(by(10).cpu_ns, Some(800));
        assert!(by(10).alive_at_end && by(10).created_ns.is_none());
        assert_eq!((by(11).alive_at_end, by(11).cpu_ns), (false, None));
        assert_eq!((by(12).comm.as_str(), by(12).cpu_ns), ("new", Some(40)));
        assert_eq!((by(12).parent, by(12).created_ns), (10, Some(7)));
        assert!(!by(13).alive_at_end);
    }
}
