//! Where a cause acts: the process of the target set whose threads bore most of it. A service
//! is several processes (an API server, an engine, one worker per GPU) and a user gives the PID
//! they find first; the verdict names the member that the cause slowed, whichever was given.
//! Pure: each thread's part of the cause (its waits of that kind, its time blocked on the GPU,
//! or its part of the slow requests), added up per process.

use std::collections::BTreeMap;

use serde::Serialize;

use super::mechanism::Mechanism;
use crate::analysis::{
    requests::{Breakdown, RequestAnalysis},
    summary::{Summary, ThreadSummary},
};

/// The member a cause acts in.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct ActsIn {
    /// Its PID (kernel TGID; `processes[].pid`).
    pub pid: u32,
    /// Its role in the service (`processes[].role`).
    pub role: String,
    pub comm: String,
    /// Its threads' part of the cause, 0..1: what the other members bore is the rest.
    pub share: f64,
    /// `pid` as the tool's PID namespace numbers it, for the text.
    #[serde(skip)]
    pub shown_pid: String,
}

impl ActsIn {
    /// Member `pid` (the target's name where the summary lists no such process: a recording
    /// from before process trees), bearing `share` of the cause.
    pub fn of(s: &Summary, pid: u32, share: f64) -> Self {
        let p = s.process(pid);
        Self {
            pid,
            role: p.map_or_else(|| s.comm.clone(), |p| p.role.clone()),
            comm: p.map_or_else(|| s.comm.clone(), |p| p.comm.clone()),
            share,
            shown_pid: s.shown_id(pid),
        }
    }
}

impl std::fmt::Display for ActsIn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (PID {})", self.role, self.shown_pid)
    }
}

/// The member whose threads bore most of `m`; none when no thread bore any of it.
/// `from_tail`: the shares are of the tail's excess (the verdict's basis).
pub fn place(s: &Summary, m: &Mechanism, from_tail: bool) -> Option<ActsIn> {
    let mut per: BTreeMap<u32, f64> = BTreeMap::new();
    // With requests, the slow requests' own parts say where the excess went; the window's
    // totals are the fallback when those parts hold none of it.
    if from_tail && let Some(r) = &s.requests {
        from_requests(s, r, m, &mut per);
    }
    if per.values().all(|v| *v <= 0.0) {
        per.clear();
        for t in &s.threads {
            *per.entry(process_of(s, t)).or_default() += window_part(t, m);
        }
    }
    let total: f64 = per.values().filter(|v| **v > 0.0).sum();
    let (&pid, &most) = per
        .iter()
        .filter(|(_, v)| **v > 0.0)
        .max_by(|a, b| a.1.total_cmp(b.1).then(b.0.cmp(a.0)))?;
    Some(ActsIn::of(s, pid, most / total))
}

/// A thread's process; a recovered file from before process trees says none: the target's.
fn process_of(s: &Summary, t: &ThreadSummary) -> u32 {
    if t.pid == 0 { s.pid } else { t.pid }
}

/// What of `m` a thread bore over the window.
fn window_part(t: &ThreadSummary, m: &Mechanism) -> f64 {
    let w = &t.wait_classes;
    let ns = match m {
        Mechanism::RunQueueContention { .. } if w.contention_ns > 0 => w.contention_ns,
        Mechanism::RunQueueContention { .. } => t.totals.time.runq_wait_ns,
        Mechanism::CgroupThrottling => w.idle_cpu_ns + w.throttled_ns,
        Mechanism::IdleCpuWakeup => w.idle_cpu_ns,
        // The waits after moves; the moves themselves (a count, 1 ns each) only break ties.
        Mechanism::Migrations => w.migration_ns + t.totals.switches.migrations,
        Mechanism::SmSaturationByOthers { .. }
        | Mechanism::SmSaturation { .. }
        | Mechanism::SyncStalls { .. }
        | Mechanism::LongerGpuWork { .. }
        | Mechanism::ClockThrottle { .. } => t.cuda.as_ref().map_or(0, |c| c.sync_ns),
        Mechanism::LlcMisses
        | Mechanism::LongerOncpu { .. }
        | Mechanism::Queueing
        | Mechanism::LongRequestOnServingThread { .. }
        | Mechanism::GcPause { .. }
        | Mechanism::LaunchOverhead { .. } => t.totals.time.oncpu_ns,
        Mechanism::LockWait { .. } => t.totals.time.blocked_ns,
        Mechanism::OtherBlocked | Mechanism::Uncovered => t.offcpu_ns,
        // Placed by the rule that finds it (verdict/ranks.rs): the late rank's threads.
        Mechanism::LateRank { pid, .. } => (t.pid == *pid) as u64 * t.totals.time.alive_ns(),
    };
    ns as f64
}

/// The slow requests' parts of `m`, each put to the process of the thread that served it.
fn from_requests(s: &Summary, r: &RequestAnalysis, m: &Mechanism, per: &mut BTreeMap<u32, f64>) {
    let pid_of: BTreeMap<u32, u32> = s
        .threads
        .iter()
        .map(|t| (t.tid, process_of(s, t)))
        .collect();
    for q in &r.slowest {
        let Some(&pid) = pid_of.get(&q.tid) else {
            continue;
        };
        *per.entry(pid).or_default() += request_part(&q.parts, m);
    }
}

fn request_part(b: &Breakdown, m: &Mechanism) -> f64 {
    match m {
        Mechanism::RunQueueContention { .. } => b.runq_contention_ns,
        Mechanism::CgroupThrottling => b.runq_idle_cpu_ns + b.runq_throttled_ns,
        Mechanism::IdleCpuWakeup => b.runq_idle_cpu_ns,
        Mechanism::Migrations => b.runq_migration_ns + b.oncpu_ns,
        Mechanism::SmSaturationByOthers { .. }
        | Mechanism::SmSaturation { .. }
        | Mechanism::SyncStalls { .. }
        | Mechanism::LongerGpuWork { .. }
        | Mechanism::ClockThrottle { .. } => b.cuda_sync_ns,
        Mechanism::LlcMisses | Mechanism::LongerOncpu { .. } | Mechanism::LaunchOverhead { .. } => {
            b.oncpu_ns
        }
        Mechanism::LockWait { .. } => b.lock_wait_ns,
        Mechanism::GcPause { .. } => b.runtime_pause_ns,
        Mechanism::Queueing => b.queued_oncpu_ns,
        // The waiting and the long work are both on the serving thread.
        Mechanism::LongRequestOnServingThread { .. } => b.queued_oncpu_ns + b.oncpu_ns,
        Mechanism::OtherBlocked => b.blocked_ns,
        Mechanism::Uncovered => b.uncovered_ns,
        Mechanism::LateRank { .. } => 0.0,
    }
}
