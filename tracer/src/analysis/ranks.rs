//! Tensor-parallel ranks: members of the service that each drive a GPU and meet the others in
//! collectives every step, so a step lasts as long as the latest rank. Per rank, what it spent
//! where; then the late rank (the straggler), found from the waiting: the others wait for it
//! (inside synchronizing CUDA calls while the collective spins on their GPUs, or blocked until
//! a rank's thread wakes them, for a host-side collective), so it is the one that waits least.
//! Its own cause is the part of its time where it exceeds its peers most. The rules and
//! thresholds are in docs/ATTRIBUTION.md ("Tensor-parallel ranks"). Pure.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use self::late::judge;
use super::{gpu::mean, summary::Summary};
use crate::recording::{Recording, wakers::BlockedIn};

/// The late rank's peers must wait this share of the window more than it does (and 10 ms)...
pub const MIN_PEER_EXCESS: f64 = 0.05;
/// ...and at least this many times its own waiting: two ranks a few percent apart are not
/// waiting for each other.
pub const MIN_PEER_RATIO: f64 = 1.5;
/// A cause must account for this share of what the peers waited for to be named.
pub const MIN_CAUSE_SHARE: f64 = 0.25;
/// The busy share other processes' kernels must take of a rank's GPU (points) to make it the
/// late one when the host side cannot tell.
pub const MIN_FOREIGN_SM_PCT: f64 = 10.0;

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct Rank {
    /// The member (`processes[].pid`).
    pub pid: u32,
    pub role: String,
    /// The GPUs it held a compute context on (NVML), lowest first; empty when not sampled.
    pub gpus: Vec<u32>,
    /// Its GPU-driving threads' times (all its threads' where no CUDA call was seen).
    pub oncpu_ns: u64,
    pub runq_wait_ns: u64,
    pub blocked_ns: u64,
    pub launches: u64,
    pub sync_calls: u64,
    /// Time inside synchronizing CUDA calls (its GPU work and the collectives' waits).
    pub sync_ns: u64,
    /// Blocked time of its GPU-driving threads that another rank's thread ended (a host-side
    /// collective on the step's thread).
    pub blocked_by_ranks_ns: u64,
    /// `sync_ns + blocked_by_ranks_ns`: its waiting for GPUs and for the other ranks.
    pub waiting_ns: u64,
    /// Garbage collections (CPython's USDT probes), in all.
    pub gc_ns: u64,
    /// Its GPUs' busy share, and the part of it its own kernels took (NVML per-process
    /// samples; null when NVML reported none).
    pub gpu_busy_pct: Option<f64>,
    pub own_sm_pct: Option<f64>,
    /// Processes outside the service with a context on its GPUs (kernel PIDs, as every PID
    /// of the document; `pid_namespace` maps them).
    pub others_on_gpu: Vec<u32>,
    /// The same as the tool's PID namespace numbers them, for the evidence.
    #[serde(skip)]
    pub shown_others: Vec<String>,
    /// Time a power, thermal, board or reliability policy held its GPUs' clocks down.
    pub clocks_held_ns: u64,
}

/// What made the late rank late: the part of its time where it exceeded its peers' median
/// most.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum LateCause {
    /// Waiting for a CPU.
    RunQueue,
    /// Its runtime's garbage collections.
    GcPause,
    /// Off a CPU, not woken by another rank: sleeps, I/O, locks (a blocking synchronize
    /// cannot be told apart; the late rank is the one that waits least there).
    OffCpu,
    /// On a CPU outside synchronizing calls: host work (Python, launches).
    HostWork,
    /// Its GPU shared with processes outside the service.
    GpuShared,
    /// Its GPU's clocks held down by a policy.
    ClocksHeld,
    /// Nothing measured accounts for it.
    NotMeasured,
}

/// How the late rank was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FoundBy {
    /// It waited least: `peers_waited_ns` is how much more its peers waited.
    Waiting,
    /// Every rank waited alike, and only its GPU was shared with other processes:
    /// `peers_waited_ns` is all of its peers' waiting (every step waits for the slowest GPU).
    SharedGpu,
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct Straggler {
    pub pid: u32,
    pub gpus: Vec<u32>,
    pub found_by: FoundBy,
    /// What the peers waited for it (median over the peers; see `found_by`).
    pub peers_waited_ns: u64,
    /// The synchronizing calls it made (each rank made about as many, within 10 %):
    /// `peers_waited_ns / sync_calls` is the wait per call.
    pub sync_calls: u64,
    pub cause: LateCause,
    /// How much more of that than its peers' median, ns.
    pub cause_ns: u64,
    /// The evidence in words ("run-queue waits 1.36 s against 12 ms for its peers").
    pub evidence: String,
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct Ranks {
    /// By first GPU, then PID.
    pub ranks: Vec<Rank>,
    pub straggler: Option<Straggler>,
    /// Why there is a late rank or none, in words (which test decided).
    pub assessment: String,
}

/// The ranks of the service (two or more members driving GPUs), or none.
pub fn summarize(rec: &Recording, s: &Summary) -> Option<Ranks> {
    let members: BTreeSet<u32> = s.processes.iter().map(|p| p.pid).collect();
    let contexts = gpu_contexts(rec);
    let steppers = steppers(s);
    let none = BTreeSet::new();
    let stepping = |pid: u32| steppers.get(&pid).unwrap_or(&none);
    let mut ranks: Vec<Rank> = s
        .processes
        .iter()
        .map(|p| rank(s, p, stepping(p.pid), &contexts, &members))
        .filter(|r| r.launches + r.sync_calls > 0 || (!s.cuda.measured && !r.gpus.is_empty()))
        .collect();
    if ranks.len() < 2 {
        return None;
    }
    let pids: BTreeSet<u32> = ranks.iter().map(|r| r.pid).collect();
    for r in &mut ranks {
        r.blocked_by_ranks_ns = blocked_by_ranks(rec, r.pid, stepping(r.pid), &pids);
        r.waiting_ns = r.sync_ns + r.blocked_by_ranks_ns;
    }
    ranks.sort_by_key(|r| (r.gpus.first().copied().unwrap_or(u32::MAX), r.pid));
    let (mut straggler, assessment) = judge(&ranks, s.duration_ns);
    if let Some(st) = straggler
        .as_mut()
        .filter(|st| st.cause == LateCause::OffCpu)
        && let Some(b) = off_cpu_in(rec, st.pid, stepping(st.pid), &pids)
    {
        st.evidence
            .push_str(&format!(" (mostly blocked in {})", b.name()));
    }
    Some(Ranks {
        ranks,
        straggler,
        assessment,
    })
}

/// Of the GPUs a rank has a context on, those NVML's per-process samples show its kernels
/// running on, if any: a process often has a stray context on GPU 0 as well (CUDA initialized
/// before `set_device`), which would add that GPU's load and other processes to the rank's.
/// Without per-process samples, or with none above 0, every GPU listed.
fn running_on(listed: Vec<u32>, sm_pct: impl Fn(u32) -> Option<f64>) -> Vec<u32> {
    if listed.len() < 2 {
        return listed;
    }
    let running: Vec<u32> = listed
        .iter()
        .copied()
        .filter(|&g| sm_pct(g).is_some_and(|p| p > 0.0))
        .collect();
    if running.is_empty() { listed } else { running }
}

/// GPU index -> every PID NVML listed with a context on it, at the start or at any poll.
fn gpu_contexts(rec: &Recording) -> BTreeMap<u32, BTreeSet<u32>> {
    let mut out: BTreeMap<u32, BTreeSet<u32>> = BTreeMap::new();
    let Some(g) = &rec.gpu else { return out };
    for d in &g.devices {
        out.entry(d.index).or_default().extend(&d.contexts);
    }
    for p in &g.polls {
        if let Some(c) = &p.contexts {
            out.entry(p.device).or_default().extend(c);
        }
    }
    out
}

fn rank(
    s: &Summary,
    p: &super::processes::ProcessSummary,
    stepping: &BTreeSet<u32>,
    contexts: &BTreeMap<u32, BTreeSet<u32>>,
    members: &BTreeSet<u32>,
) -> Rank {
    let listed: Vec<u32> = contexts
        .iter()
        .filter(|(_, pids)| pids.contains(&p.pid))
        .map(|(&g, _)| g)
        .collect();
    let gpus = running_on(listed, |g| {
        let d = s.gpu.as_ref()?.devices.iter().find(|d| d.index == g)?;
        Some(d.member_sm.iter().find(|m| m.pid == p.pid)?.sm_pct)
    });
    let mut r = Rank {
        pid: p.pid,
        role: p.role.clone(),
        oncpu_ns: p.totals.time.oncpu_ns,
        runq_wait_ns: p.totals.time.runq_wait_ns,
        blocked_ns: p.totals.time.blocked_ns,
        launches: 0,
        sync_calls: 0,
        sync_ns: 0,
        blocked_by_ranks_ns: 0,
        waiting_ns: 0,
        gc_ns: s
            .gc
            .iter()
            .filter(|g| g.pid == p.pid)
            .map(|g| g.total_ns)
            .sum(),
        gpu_busy_pct: None,
        own_sm_pct: None,
        others_on_gpu: gpus
            .iter()
            .flat_map(|g| contexts[g].iter().copied())
            .filter(|pid| !members.contains(pid))
            .collect::<BTreeSet<u32>>()
            .into_iter()
            .collect(),
        shown_others: Vec::new(),
        clocks_held_ns: 0,
        gpus,
    };
    r.shown_others = r.others_on_gpu.iter().map(|&p| s.shown_id(p)).collect();
    add_driving_threads(s, stepping, &mut r);
    if let Some(g) = &s.gpu {
        add_gpu_figures(g, &mut r);
    }
    r
}

/// The rank's times are its GPU-driving threads' (launches or synchronizing calls), where the
/// probes saw any: a rank has tens of threads idle in poll or a condition variable all the
/// window (measured: 140 s blocked in 8 s), whose time would drown the step thread's.
fn add_driving_threads(s: &Summary, stepping: &BTreeSet<u32>, r: &mut Rank) {
    let mut times = crate::recording::threads::StateTimes::default();
    let driving = s.threads.iter().filter(|t| stepping.contains(&t.tid));
    for (t, c) in driving.filter_map(|t| Some((t, t.cuda.as_ref()?))) {
        r.launches += c.launches;
        r.sync_calls += c.sync_calls;
        r.sync_ns += c.sync_ns;
        times += t.totals.time;
    }
    if !stepping.is_empty() {
        r.oncpu_ns = times.oncpu_ns;
        r.runq_wait_ns = times.runq_wait_ns;
        r.blocked_ns = times.blocked_ns;
    }
}

/// The rank's GPUs: how busy, its own share of them, and the longest any policy held their
/// clocks down.
fn add_gpu_figures(g: &super::gpu::GpuSummary, r: &mut Rank) {
    let mine: Vec<&super::gpu::GpuDeviceSummary> = g
        .devices
        .iter()
        .filter(|d| r.gpus.contains(&d.index))
        .collect();
    r.gpu_busy_pct = mean(mine.iter().map(|d| d.util_gpu_pct));
    r.own_sm_pct = mean(mine.iter().map(|d| {
        d.member_sm
            .iter()
            .find(|m| m.pid == r.pid)
            .map(|m| m.sm_pct)
    }));
    r.clocks_held_ns = mine
        .iter()
        .flat_map(|d| &d.clock_violations)
        .filter(|v| {
            matches!(
                v.policy.as_str(),
                "power" | "thermal" | "board_limit" | "reliability"
            )
        })
        .map(|v| v.ns)
        .max()
        .unwrap_or(0);
}

/// Blocked time of rank `pid`'s GPU-driving threads (launches or synchronizing calls) that a
/// thread of another rank ended: a collective that waits on the host, on the step's own
/// thread. Other threads are left out: a transport's I/O thread (gloo's) waits for the peer's
/// next message all the time between collectives, on time or late, and which rank it waits for
/// more says nothing about which one is late (single-GPU runs, docs/GPU.md); the step thread
/// waits for that I/O thread, one hop on, which is not followed here.
fn blocked_by_ranks(
    rec: &Recording,
    pid: u32,
    stepping: &BTreeSet<u32>,
    ranks: &BTreeSet<u32>,
) -> u64 {
    rec.wakers
        .iter()
        .filter(|w| stepping.contains(&w.tid))
        .filter(|w| w.waker_tgid != pid && ranks.contains(&w.waker_tgid))
        .map(|w| w.blocked_ns)
        .sum()
}

/// Each process's GPU-driving threads: launches or synchronizing calls seen.
fn steppers(s: &Summary) -> BTreeMap<u32, BTreeSet<u32>> {
    let mut out: BTreeMap<u32, BTreeSet<u32>> = BTreeMap::new();
    for t in &s.threads {
        if t.cuda
            .as_ref()
            .is_some_and(|c| c.launches + c.sync_calls > 0)
        {
            out.entry(t.pid).or_default().insert(t.tid);
        }
    }
    out
}

/// The system call most of a rank's step-thread blocked time not ended by another rank was
/// in (for the evidence: "blocked in a sleep"), from the waker records.
fn off_cpu_in(
    rec: &Recording,
    pid: u32,
    stepping: &BTreeSet<u32>,
    ranks: &BTreeSet<u32>,
) -> Option<BlockedIn> {
    let mut by: BTreeMap<String, (u64, BlockedIn)> = BTreeMap::new();
    for w in &rec.wakers {
        if stepping.contains(&w.tid) && (w.waker_tgid == pid || !ranks.contains(&w.waker_tgid)) {
            let b = w.blocked_in();
            by.entry(format!("{b:?}")).or_insert((0, b)).0 += w.blocked_ns;
        }
    }
    by.into_values().max_by_key(|(ns, _)| *ns).map(|(_, b)| b)
}

mod late;
#[cfg(test)]
mod tests;
