//! Who held the CPUs while the target's threads waited, grouped into neighbours: the unit a
//! person can act on. A neighbour is often several processes: `stress-ng --cpu 2` is two
//! workers, a shell loop a stream of short-lived children, a container many processes. Ranked
//! one process at a time, each of them loses to the target's own threads taken together
//! (measured: stress-ng's two workers caused 51 % of the waiting, the target's own threads 47 %,
//! and the verdict said "contention among its own threads" in 4 runs of 4). So processes are
//! grouped first: by cgroup where they have one of their own (a container, a service), else by
//! command and parent (a pool of workers, a loop's children); the target's own threads are one
//! group, and its child processes (not traced) another.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::preemptors::{IDLE, PreemptorSummary};
use crate::recording::Recording;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum NeighbourKind {
    /// The target's own threads.
    Target,
    /// Processes the target forked, or their descendants: not traced.
    Children,
    /// The processes of a cgroup of their own (not the target's, nor one above it): a
    /// container, a service.
    Cgroup,
    /// Processes of the same command forked by the same parent: a pool of workers, a loop's
    /// children.
    Command,
    /// One process (its cgroup shared with the target, and its parent unknown).
    Process,
    /// No task: the CPU idled while a thread waited (throttling, or a slow wakeup).
    Idle,
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct Neighbour {
    pub kind: NeighbourKind,
    /// Who: the cgroup's path, or the command's or process's name.
    pub name: String,
    /// Its processes (TGIDs), most waiting first; at most 20.
    pub processes: Vec<u32>,
    pub process_count: u64,
    pub threads: u64,
    /// The target's run-queue waiting while its tasks ran.
    pub wait_ns: u64,
    /// Share of all attributed waiting.
    pub wait_share: f64,
    /// Of `wait_ns`, the handoffs its tasks were the partners in: the exchange, not
    /// contention.
    pub handoff_ns: u64,
}

impl Neighbour {
    /// The migration stopper's waiting is the cost of migrations, not contention.
    pub fn is_stopper(&self) -> bool {
        crate::recording::is_migration_stopper(&self.name)
    }
}

/// Processes listed per neighbour.
const LISTED: usize = 20;

/// A cgroup is a neighbour's own when it is neither the target's nor one of its ancestors (a
/// session or slice the target shares says nothing about who the work belongs to).
fn own_cgroup(cgroup: &str, target: Option<&str>) -> bool {
    if cgroup.is_empty() || cgroup == "/" {
        return false;
    }
    match target {
        Some(t) => t != cgroup && !t.starts_with(&format!("{}/", cgroup.trim_end_matches('/'))),
        None => true,
    }
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Key {
    Target,
    Children,
    Idle,
    Cgroup(String),
    Command(String, u32),
    Process(u32),
}

/// Groups `preemptors` (per task, as summarized) into neighbours, most waiting first.
pub fn group(rec: &Recording, preemptors: &[PreemptorSummary]) -> Vec<Neighbour> {
    let children: BTreeSet<u32> = rec.children.iter().map(|c| c.pid).collect();
    let target_cgroup = rec.target_cgroup.as_deref();
    // Per task: its record, for the parent, cgroup and process name.
    let records: BTreeMap<u32, &crate::recording::PreemptorRecord> =
        rec.preemptors.iter().map(|r| (r.pid, r)).collect();
    let mut groups: BTreeMap<Key, (Neighbour, BTreeMap<u32, u64>)> = BTreeMap::new();
    for p in preemptors {
        let r = records.get(&p.pid);
        let process = r
            .and_then(|r| r.process_comm.clone())
            .unwrap_or_else(|| p.comm.clone());
        let cgroup = r.and_then(|r| r.cgroup.clone()).unwrap_or_default();
        let (key, kind, name) = if p.same_process {
            let name = if rec.processes.len() > 1 {
                "the service itself".to_string()
            } else {
                rec.target.comm.clone()
            };
            (Key::Target, NeighbourKind::Target, name)
        } else if p.pid == 0 {
            (Key::Idle, NeighbourKind::Idle, IDLE.to_string())
        } else if children.contains(&p.tgid) {
            (
                Key::Children,
                NeighbourKind::Children,
                "its child processes".to_string(),
            )
        } else if !crate::recording::is_migration_stopper(&process)
            && own_cgroup(&cgroup, target_cgroup)
        {
            (Key::Cgroup(cgroup.clone()), NeighbourKind::Cgroup, cgroup)
        } else if let Some(ppid) = r
            .and_then(|r| r.ppid)
            // Processes of one command under init are unrelated daemons, not one program's
            // workers: each is its own neighbour.
            .filter(|&ppid| ppid > 1 && !crate::recording::is_migration_stopper(&process))
        {
            (
                Key::Command(process.clone(), ppid),
                NeighbourKind::Command,
                process,
            )
        } else {
            (Key::Process(p.tgid), NeighbourKind::Process, process)
        };
        let (g, per_process) = groups.entry(key).or_insert_with(|| {
            (
                Neighbour {
                    kind,
                    name,
                    processes: vec![],
                    process_count: 0,
                    threads: 0,
                    wait_ns: 0,
                    wait_share: 0.0,
                    handoff_ns: 0,
                },
                BTreeMap::new(),
            )
        });
        g.threads += 1;
        g.wait_ns += p.wait_ns;
        g.wait_share += p.wait_share;
        g.handoff_ns += p.handoff_ns;
        *per_process.entry(p.tgid).or_default() += p.wait_ns;
    }
    let mut out: Vec<Neighbour> = groups
        .into_values()
        .map(|(mut g, per_process)| {
            let mut procs: Vec<(u32, u64)> = per_process.into_iter().collect();
            procs.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
            g.process_count = procs.len() as u64;
            g.processes = procs.into_iter().take(LISTED).map(|(p, _)| p).collect();
            g
        })
        .collect();
    out.sort_by(|a, b| b.wait_ns.cmp(&a.wait_ns).then(a.kind.cmp(&b.kind)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        analysis::preemptors::summarize,
        recording::testutil::recording,
        recording::{ChildRecord, PreemptorRecord},
    };

    fn p(
        pid: u32,
        tgid: u32,
        comm: &str,
        wait_ns: u64,
        ppid: Option<u32>,
        cgroup: &str,
    ) -> PreemptorRecord {
        PreemptorRecord {
            pid,
            tgid,
            comm: comm.into(),
            process_comm: Some(comm.into()),
            wait_ns,
            slices: 1,
            ppid,
            cgroup: Some(cgroup.into()),
            handoff_ns: 0,
        }
    }

    #[test]
    fn workers_of_one_command_outrank_the_targets_own_threads_together() {
        // The case: two stress-ng workers at 26 % and 25 % each, the target's own
        // threads at 47 % in all, a shell loop's short-lived children, a container.
        let mut rec = recording(
            vec![],
            vec![
                p(
                    11,
                    11,
                    "stress-ng-cpu",
                    260,
                    Some(10),
                    "/user.slice/s1.scope",
                ),
                p(
                    12,
                    12,
                    "stress-ng-cpu",
                    250,
                    Some(10),
                    "/user.slice/s1.scope",
                ),
                p(101, 100, "server", 250, None, "/user.slice/s1.scope"),
                p(102, 100, "server", 220, None, "/user.slice/s1.scope"),
                p(21, 21, "true", 5, Some(20), "/user.slice/s1.scope"),
                p(22, 22, "true", 6, Some(20), "/user.slice/s1.scope"),
                p(31, 31, "postgres", 4, Some(1), "/system.slice/db.service"),
                p(32, 32, "postgres", 3, Some(31), "/system.slice/db.service"),
                p(0, 0, "swapper/0", 2, None, "/"),
                p(41, 41, "worker", 1, Some(100), "/user.slice/s1.scope"),
            ],
        );
        rec.target_cgroup = Some("/user.slice/s1.scope".into());
        rec.children = vec![ChildRecord {
            pid: 41,
            parent: 100,
            comm: "worker".into(),
            ..Default::default()
        }];
        let (per_task, _) = summarize(&rec);
        let n = group(&rec, &per_task);
        let kinds: Vec<(NeighbourKind, &str, u64)> = n
            .iter()
            .map(|g| (g.kind, g.name.as_str(), g.process_count))
            .collect();
        assert_eq!(
            kinds,
            vec![
                (NeighbourKind::Command, "stress-ng-cpu", 2),
                (NeighbourKind::Target, "server", 1),
                (NeighbourKind::Command, "true", 2),
                (NeighbourKind::Cgroup, "/system.slice/db.service", 2),
                (NeighbourKind::Idle, "idle", 1),
                (NeighbourKind::Children, "its child processes", 1),
            ]
        );
        assert_eq!(n[0].processes, vec![11, 12]);
        assert!((n[0].wait_share - 510.0 / 1001.0).abs() < 1e-9);

        // Two daemons of one command under init are two neighbours, not one program.
        let mut rec = recording(
            vec![],
            vec![
                p(51, 51, "python3", 300, Some(1), "/user.slice/s1.scope"),
                p(52, 52, "python3", 1, Some(1), "/user.slice/s1.scope"),
            ],
        );
        rec.target_cgroup = Some("/user.slice/s1.scope".into());
        let (per_task, _) = summarize(&rec);
        let n = group(&rec, &per_task);
        let kinds: Vec<(NeighbourKind, &str, u64)> = n
            .iter()
            .map(|g| (g.kind, g.name.as_str(), g.process_count))
            .collect();
        assert_eq!(
            kinds,
            vec![
                (NeighbourKind::Process, "python3", 1),
                (NeighbourKind::Process, "python3", 1),
            ]
        );
    }
}
