//! Who ran while the target's threads waited in a run queue: per task, and added up by process.

use std::collections::HashMap;

use serde::Serialize;

use crate::recording::Recording;

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct PreemptorSummary {
    pub pid: u32,
    pub tgid: u32,
    pub comm: String,
    /// Run-queue waiting of the target's threads while this task ran.
    pub wait_ns: u64,
    pub slices: u64,
    /// Share of all attributed waiting.
    pub wait_share: f64,
    /// The preemptor is a thread of the target set: the service itself.
    pub same_process: bool,
    /// Of `wait_ns`, the handoffs it was the partner in: the exchange, not contention.
    pub handoff_ns: u64,
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct PreemptorProcess {
    pub tgid: u32,
    pub comm: String,
    pub wait_ns: u64,
    pub wait_share: f64,
    /// How many of its threads ran while the target waited.
    pub threads: u64,
    pub same_process: bool,
}

/// The name given to the idle task as a preemptor: the CPU idled while a target thread waited
/// in its run queue.
pub const IDLE: &str = "idle";

/// Adds preemptors up by process. The name is the process's own when known, else that of its
/// thread that caused the most waiting. Groups and names are found by hash, not by search: a
/// process of 20,000 threads brings as many preemptors, and the machine thousands of processes.
fn by_process(rec: &Recording, preemptors: &[PreemptorSummary]) -> Vec<PreemptorProcess> {
    let mut process_comm: HashMap<u32, Option<&String>> = HashMap::new();
    for r in &rec.preemptors {
        process_comm.entry(r.pid).or_insert(r.process_comm.as_ref());
    }
    let mut groups: Vec<PreemptorProcess> = Vec::new();
    let mut group_of: HashMap<u32, usize> = HashMap::new();
    for p in preemptors {
        if let Some(&i) = group_of.get(&p.tgid) {
            let g = &mut groups[i];
            g.wait_ns += p.wait_ns;
            g.wait_share += p.wait_share;
            g.threads += 1;
            continue;
        }
        // pid 0: the idle task of whichever CPU, one entry for all.
        let comm = if p.pid == 0 {
            IDLE.to_string()
        } else {
            process_comm
                .get(&p.pid)
                .copied()
                .flatten()
                .cloned()
                .unwrap_or_else(|| p.comm.clone())
        };
        group_of.insert(p.tgid, groups.len());
        groups.push(PreemptorProcess {
            tgid: p.tgid,
            comm,
            wait_ns: p.wait_ns,
            wait_share: p.wait_share,
            threads: 1,
            same_process: p.same_process,
        });
    }
    groups.sort_by(|a, b| b.wait_ns.cmp(&a.wait_ns).then(a.tgid.cmp(&b.tgid)));
    groups
}

/// The preemptors, most waiting first, and the same added up by process.
pub fn summarize(rec: &Recording) -> (Vec<PreemptorSummary>, Vec<PreemptorProcess>) {
    let attributed: u64 = rec.preemptors.iter().map(|p| p.wait_ns).sum();
    let mut preemptors: Vec<PreemptorSummary> = rec
        .preemptors
        .iter()
        .map(|p| PreemptorSummary {
            pid: p.pid,
            tgid: p.tgid,
            comm: p.comm.clone(),
            wait_ns: p.wait_ns,
            slices: p.slices,
            wait_share: if attributed > 0 {
                p.wait_ns as f64 / attributed as f64
            } else {
                0.0
            },
            same_process: rec.is_member(p.tgid),
            handoff_ns: p.handoff_ns,
        })
        .collect();
    preemptors.sort_by(|a, b| b.wait_ns.cmp(&a.wait_ns).then(a.pid.cmp(&b.pid)));
    let processes = by_process(rec, &preemptors);
    (preemptors, processes)
}
