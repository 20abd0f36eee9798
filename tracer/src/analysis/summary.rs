//! The process summary: totals, per-thread rows and the top preemptors. This struct is also the
//! `--json` document, so its field names are a stable interface: snake_case, units in the name.

use serde::Serialize;

pub use super::preemptors::{IDLE, PreemptorProcess, PreemptorSummary};
use super::{
    counters::{self, CounterBin, CounterValues, ThreadCounterSummary},
    gpu::{self as gpu_analysis, GpuSummary},
    preemptors,
    quantiles::{QuantileSource, wait_quantiles},
    requests::RequestAnalysis,
};
use crate::recording::{
    Capabilities, EndReason, Losses, MigrationRoute, ProbeMode, Recording, ThreadRecord,
    WaitSamples,
    counters::slot_names,
    threads::{StateTimes, Switches, ThreadTotals},
    topology::{MigrationKind, classify},
    waits::WaitClasses,
};

/// Version of the JSON document's shape; bumped on any incompatible change.
pub const SCHEMA_VERSION: u32 = 2;

/// The first five fields are written by `Report`, with the verdict after them.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct Summary {
    #[serde(skip)]
    pub schema_version: u32,
    #[serde(skip)]
    pub tracer_version: String,
    #[serde(skip)]
    pub pid: u32,
    #[serde(skip)]
    pub comm: String,
    #[serde(skip)]
    pub cmdline: Vec<String>,
    /// The requests' latency and its decomposition, when requests were given.
    pub requests: Option<RequestAnalysis>,
    pub duration_ns: u64,
    /// Window edges on CLOCK_MONOTONIC, like every timestamp in this document.
    pub start_ns: u64,
    pub end_ns: u64,
    /// Add to a CLOCK_MONOTONIC time to get CLOCK_REALTIME (wall-clock) nanoseconds.
    pub realtime_minus_monotonic_ns: i64,
    pub end_reason: EndReason,
    pub target_exited_ns: Option<u64>,
    pub probe_mode: ProbeMode,
    pub probe_fallback_reason: Option<String>,
    /// Set when the recording came from an unfinished trace file: what is missing.
    pub incomplete: Option<String>,
    pub tracer_cost: Option<crate::recording::TracerCost>,
    /// Timeline events lost to a full ring buffer. The per-thread totals stay exact.
    pub dropped_events: u64,
    /// The timeline records before this time are missing (a flight-recorder file cut by
    /// `--keep-max-mib`): the per-request figures and wait samples begin there; the per-thread
    /// totals stay exact.
    pub timeline_missing_before_ns: Option<u64>,
    pub events_received: u64,
    pub losses: Losses,
    /// The recording checked against each thread's own counters in /proc over the same
    /// window; null when they were not read (a recovered trace file).
    pub self_check: Option<super::selfcheck::SelfCheck>,
    /// What this host let the tracer measure; a signal that was not available is "not
    /// assessed", never "absent".
    pub capabilities: Capabilities,
    pub totals: Totals,
    pub counters: CountersSummary,
    /// NVML figures per GPU; null when no GPU was sampled (see `capabilities.gpu`).
    pub gpu: Option<GpuSummary>,
    /// The target cgroup's CPU bandwidth throttling (of the members' cgroups, the most
    /// throttled, else the first member's); null when no cpu.stat was found.
    pub cgroup: Option<super::cgroup::CgroupSummary>,
    /// Every distinct cgroup of the members, the first member's first, with which members
    /// each holds.
    pub cgroups: Vec<super::cgroup::CgroupSummary>,
    pub cuda: CudaSummary,
    /// The processes traced (the target set): the first given first, then their descendants
    /// and the processes forked during the window, with when each joined and left.
    pub processes: Vec<super::processes::ProcessSummary>,
    /// Sorted by run-queue wait, largest first.
    pub threads: Vec<ThreadSummary>,
    /// Sorted by the waiting they caused, largest first.
    pub preemptors: Vec<PreemptorSummary>,
    /// The same, added up per process.
    pub preemptor_processes: Vec<PreemptorProcess>,
    /// The same, grouped into neighbours (a cgroup of their own, or one command and parent;
    /// the target's own threads; its child processes): what the verdict ranks.
    pub neighbours: Vec<super::neighbours::Neighbour>,
    /// The target's child processes (and theirs): not traced, so their own scheduling is not
    /// in this document; trace them with their own PID.
    pub untraced_children: Vec<crate::recording::ChildRecord>,
    /// Hypervisor steal on each CPU over the window (CPUs with none left out; empty: none, or
    /// not known): time a thread shown as on a CPU did not run. /proc/stat, 10 ms ticks.
    pub cpu_steal: Vec<CpuSteal>,
    /// Who held up whom: the threads' blocked time by the task that ended it, the largest
    /// pairs of each process first (empty: nothing was woken, or an older trace file).
    pub held_up_by: Vec<super::wakers::HeldUp>,
    /// The tensor-parallel ranks (two or more members driving GPUs) and the late one; null
    /// for a service with fewer.
    pub ranks: Option<super::ranks::Ranks>,
    /// Garbage collections per thread of the CPython members (empty: none, or not traced:
    /// see `pause_probes`).
    pub gc: Vec<super::pauses::GcThread>,
    /// For each CPython member, whether its collections were traced, and why not.
    pub pause_probes: Vec<crate::recording::pauses::PauseProbe>,
    pub migration_routes: Vec<RouteSummary>,
    /// The tool's PID namespace, when it ran inside one (a container). Every ID in this
    /// document is the kernel's, as the host numbers them (and as NVML and the host's tools
    /// report them); `ids` says what the namespace calls those it knows.
    pub pid_namespace: Option<PidNamespaceSummary>,
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct PidNamespaceSummary {
    /// The namespace's inode, as /proc/PID/ns/pid shows it.
    pub inode: u64,
    /// The target's PID in the namespace: the one given to the tool.
    pub pid: Option<u32>,
    /// The IDs of this document that the namespace knows; a task missing here (a neighbour
    /// outside the container) has no ID there.
    pub ids: Vec<NamespacedId>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct NamespacedId {
    pub host: u32,
    pub ns: u32,
}

impl Summary {
    /// The process of the target set with this PID, as `processes[]` lists it.
    pub fn process(&self, pid: u32) -> Option<&super::processes::ProcessSummary> {
        self.processes.iter().find(|p| p.pid == pid)
    }

    /// Where that process stands in `processes[]` (after all of them when it is not there): the
    /// order the renderers group threads by.
    pub fn process_rank(&self, pid: u32) -> usize {
        self.processes
            .iter()
            .position(|p| p.pid == pid)
            .unwrap_or(usize::MAX)
    }

    /// How a kernel PID or TID is shown to a person: the tool's own namespace's number, which
    /// is what its /proc and `ps` show; a task outside that namespace has none there, and is
    /// shown by the host's number, marked.
    pub fn shown_id(&self, host: u32) -> String {
        match &self.pid_namespace {
            None => host.to_string(),
            Some(_) if host == 0 => "0".into(),
            Some(ns) => match ns.ids.iter().find(|i| i.host == host) {
                Some(i) => i.ns.to_string(),
                None => format!("host:{host}"),
            },
        }
    }
}

/// The namespace IDs of every ID the summary mentions.
fn pid_namespace(rec: &Recording, s: &Summary) -> Option<PidNamespaceSummary> {
    let ns = rec.pid_namespace.as_ref()?;
    let mut wanted = std::collections::BTreeSet::new();
    wanted.insert(s.pid);
    wanted.extend(s.threads.iter().map(|t| t.tid));
    wanted.extend(s.preemptors.iter().flat_map(|p| [p.pid, p.tgid]));
    wanted.extend(s.preemptor_processes.iter().map(|p| p.tgid));
    wanted.extend(s.migration_routes.iter().map(|r| r.route.tid));
    // The processes NVML listed on the GPUs: the ranks' evidence names those outside the
    // service.
    if let Some(g) = &rec.gpu {
        wanted.extend(g.devices.iter().flat_map(|d| &d.contexts));
        wanted.extend(g.polls.iter().flat_map(|p| p.contexts.iter().flatten()));
    }
    Some(PidNamespaceSummary {
        inode: ns.inode,
        pid: ns.ids.get(&s.pid).copied(),
        ids: wanted
            .into_iter()
            .filter_map(|host| {
                Some(NamespacedId {
                    host,
                    ns: *ns.ids.get(&host)?,
                })
            })
            .collect(),
    })
}

/// A migration route, with how far it moved the thread.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct CpuSteal {
    pub cpu: u32,
    pub steal_ns: u64,
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct RouteSummary {
    #[serde(flatten)]
    pub route: MigrationRoute,
    pub kind: MigrationKind,
}

/// The target's CUDA driver calls, all threads together.
#[derive(Debug, Clone, Default, Serialize, schemars::JsonSchema)]
pub struct CudaSummary {
    /// The uprobes were attached (see `capabilities.gpu.cuda`).
    pub measured: bool,
    pub launches: u64,
    pub sync_calls: u64,
    /// Time threads spent inside synchronizing calls, added over threads.
    pub sync_ns: u64,
    /// The largest share of a thread's time spent waiting for the GPU.
    pub max_thread_sync_share: f64,
    /// The largest share of a thread's busy time (on a CPU, waiting for one, or in a
    /// synchronizing call) spent waiting for the GPU.
    pub max_thread_sync_busy_share: f64,
    /// Synchronizing calls whose return the probes missed (left by longjmp, an exception or a
    /// thread cancellation), closed at the thread's next call; their time is not in
    /// `sync_ns`.
    pub lost_returns: u64,
}

/// One thread's CUDA calls.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct ThreadCuda {
    pub launches: u64,
    pub sync_calls: u64,
    pub sync_ns: u64,
    pub sync_max_ns: u64,
    /// Calls whose return the probes missed (see `CudaSummary::lost_returns`).
    pub lost_returns: u64,
    /// Share of the thread's time in the window spent in synchronizing calls.
    pub sync_share: f64,
    /// Share of its busy time (on-CPU + run-queue wait + synchronizing calls, which may overlap
    /// on-CPU time when the call spins) spent in synchronizing calls.
    pub sync_busy_share: f64,
}

/// Perf counters for the whole process, and over time.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct CountersSummary {
    /// The counters measured (empty: none could be opened, see `capabilities.pmu`).
    pub measured: Vec<&'static str>,
    pub bin_ns: u64,
    /// The bin width asked for, when `bin_ns` had to be wider to keep the series within
    /// 10,000 bins over the window.
    pub bins_widened_from_ns: Option<u64>,
    /// Totals over all threads.
    #[serde(flatten)]
    pub totals: CounterValues,
    /// All threads added up per time bin, bins with activity only.
    pub series: Vec<CounterBin>,
}

/// The target's threads added up.
#[derive(Debug, Clone, Default, Serialize, schemars::JsonSchema)]
pub struct Totals {
    pub threads: u64,
    pub threads_created: u64,
    pub threads_exited: u64,
    /// All threads' times added up.
    #[serde(flatten)]
    pub time: StateTimes,
    pub offcpu_ns: u64,
    /// All threads' switches, moves and wakeups added up.
    #[serde(flatten)]
    pub switches: Switches,
    pub runq_waits: u64,
    pub runq_wait_p50_ns: Option<u64>,
    pub runq_wait_p99_ns: Option<u64>,
    pub runq_wait_max_ns: u64,
    pub runq_wait_quantiles_from: Option<QuantileSource>,
    /// Run-queue wait as a share of the time the threads wanted a CPU (on-CPU + waiting).
    pub runq_wait_share: f64,
    /// Migrations by how far they went (from the migration routes and the CPU topology).
    pub migrations_same_core: u64,
    pub migrations_same_llc: u64,
    pub migrations_cross_llc: u64,
    pub migrations_cross_numa: u64,
    /// Run-queue waits by kind, all threads together.
    pub wait_classes: WaitClasses,
}

/// One thread of the target over the window.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct ThreadSummary {
    pub tid: u32,
    /// Its process (`processes[].pid`; 0 when a recovered trace file does not say).
    pub pid: u32,
    pub comm: String,
    pub created_ns: Option<u64>,
    pub exited_ns: Option<u64>,
    #[serde(flatten)]
    pub totals: ThreadTotals,
    pub offcpu_ns: u64,
    pub runq_waits: u64,
    pub runq_wait_p50_ns: Option<u64>,
    pub runq_wait_p99_ns: Option<u64>,
    pub runq_wait_max_ns: u64,
    pub runq_wait_quantiles_from: QuantileSource,
    pub runq_wait_log2_hist: Vec<u32>,
    /// Its run-queue waits by kind.
    pub wait_classes: WaitClasses,
    /// Perf counters over the thread's slices (null when none were measured).
    pub counters: Option<ThreadCounterSummary>,
    /// The thread's counters per time bin, bins with activity only.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub counter_bins: Vec<CounterBin>,
    /// CUDA calls (null when the thread made none, or CUDA was not probed).
    pub cuda: Option<ThreadCuda>,
}

fn thread_summary(rec: &Recording, t: &ThreadRecord) -> ThreadSummary {
    let (p50, p99, from) = wait_quantiles(
        &t.runq_wait_samples,
        &t.runq_wait_log2_hist,
        t.runq_waits,
        t.runq_wait_max_ns,
    );
    ThreadSummary {
        tid: t.tid,
        pid: t.pid,
        comm: t.comm.clone(),
        created_ns: t.created_ns,
        exited_ns: t.exited_ns,
        totals: t.totals,
        offcpu_ns: t.totals.time.offcpu_ns(),
        runq_waits: t.runq_waits,
        runq_wait_p50_ns: p50,
        runq_wait_p99_ns: p99,
        runq_wait_max_ns: t.runq_wait_max_ns,
        runq_wait_quantiles_from: from,
        runq_wait_log2_hist: t.runq_wait_log2_hist.clone(),
        wait_classes: t.wait_classes,
        counters: (rec.counter_mask != 0)
            .then(|| counters::thread_summary(&t.counters.unwrap_or_default(), rec.counter_mask)),
        counter_bins: counters::thread_series(rec, t.tid),
        cuda: t.cuda.map(|c| ThreadCuda {
            launches: c.launches,
            sync_calls: c.sync_calls,
            sync_ns: c.sync_ns,
            sync_max_ns: c.sync_max_ns,
            lost_returns: c.lost_returns,
            sync_share: c.sync_ns as f64 / t.totals.time.alive_ns().max(1) as f64,
            sync_busy_share: c.sync_ns as f64
                / (t.totals.time.oncpu_ns + t.totals.time.runq_wait_ns + c.sync_ns).max(1) as f64,
        }),
    }
}

fn cuda_summary(rec: &Recording, threads: &[ThreadSummary]) -> CudaSummary {
    let mut c = CudaSummary {
        measured: rec.capabilities.gpu.cuda.available,
        ..Default::default()
    };
    for t in threads.iter().filter_map(|t| t.cuda.as_ref()) {
        c.launches += t.launches;
        c.sync_calls += t.sync_calls;
        c.sync_ns += t.sync_ns;
        c.lost_returns += t.lost_returns;
        c.max_thread_sync_share = c.max_thread_sync_share.max(t.sync_share);
        c.max_thread_sync_busy_share = c.max_thread_sync_busy_share.max(t.sync_busy_share);
    }
    c
}

fn counters_summary(rec: &Recording) -> CountersSummary {
    let mut sums = [0u64; tracer_common::PERF_SLOTS];
    for t in &rec.threads {
        if let Some(c) = &t.counters {
            for (sum, v) in sums.iter_mut().zip(c.scaled) {
                *sum += v;
            }
        }
    }
    CountersSummary {
        measured: slot_names(rec.counter_mask),
        bin_ns: rec.counter_bins.bin_ns,
        bins_widened_from_ns: rec.counter_bins.widened_from_ns,
        totals: CounterValues::from_slots(&sums, rec.counter_mask),
        series: counters::process_series(rec),
    }
}

fn totals(threads: &[ThreadRecord]) -> Totals {
    let mut t = Totals::default();
    let mut merged = WaitSamples::default();
    let mut log2 = vec![0u32; tracer_common::RUNQ_HIST_SLOTS];
    for th in threads {
        t.threads += 1;
        t.threads_created += th.created_ns.is_some() as u64;
        t.threads_exited += th.exited_ns.is_some() as u64;
        t.time += th.totals.time;
        t.switches += th.totals.switches;
        t.runq_waits += th.runq_waits;
        t.runq_wait_max_ns = t.runq_wait_max_ns.max(th.runq_wait_max_ns);
        t.wait_classes.merge(&th.wait_classes);
        // Merging only makes sense while every thread's samples are complete.
        if th.runq_wait_samples.len() == th.runq_waits {
            merged.merge(&th.runq_wait_samples);
        }
        for (sum, &c) in log2.iter_mut().zip(&th.runq_wait_log2_hist) {
            *sum = sum.saturating_add(c);
        }
    }
    t.offcpu_ns = t.time.offcpu_ns();
    let (p50, p99, from) = wait_quantiles(&merged, &log2, t.runq_waits, t.runq_wait_max_ns);
    t.runq_wait_p50_ns = p50;
    t.runq_wait_p99_ns = p99;
    t.runq_wait_quantiles_from = Some(from);
    let wanted = t.time.oncpu_ns + t.time.runq_wait_ns;
    t.runq_wait_share = if wanted > 0 {
        t.time.runq_wait_ns as f64 / wanted as f64
    } else {
        0.0
    };
    t
}

/// The summary, which the verdict reads (`analysis::analyze` judges it).
pub fn build(rec: &Recording) -> Summary {
    build_after(rec, None)
}

/// The summary of a watch window, `prev` the one before it (requests that began there are
/// decomposed on both).
pub fn build_after(rec: &Recording, prev: Option<&Recording>) -> Summary {
    let mut threads: Vec<ThreadSummary> =
        rec.threads.iter().map(|t| thread_summary(rec, t)).collect();
    threads.sort_by(|a, b| {
        let wait = |t: &ThreadSummary| t.totals.time.runq_wait_ns;
        wait(b).cmp(&wait(a)).then(a.tid.cmp(&b.tid))
    });
    let (preemptors, preemptor_processes) = preemptors::summarize(rec);
    let neighbours = super::neighbours::group(rec, &preemptors);
    let mut migration_routes: Vec<RouteSummary> = rec
        .migration_routes
        .iter()
        .map(|r| RouteSummary {
            route: *r,
            kind: classify(&rec.host.topology, r.from_cpu, r.to_cpu),
        })
        .collect();
    migration_routes.sort_by_key(|r| {
        let r = &r.route;
        (std::cmp::Reverse(r.count), r.tid, r.from_cpu, r.to_cpu)
    });
    let mut totals = totals(&rec.threads);
    for r in &migration_routes {
        let slot = match r.kind {
            MigrationKind::SameCore => &mut totals.migrations_same_core,
            MigrationKind::SameLlc => &mut totals.migrations_same_llc,
            MigrationKind::CrossLlc => &mut totals.migrations_cross_llc,
            MigrationKind::CrossNuma => &mut totals.migrations_cross_numa,
            MigrationKind::Unknown => continue,
        };
        *slot += r.route.count;
    }

    let (cgroup, cgroups) = super::cgroup::summarize(rec);
    let mut s = Summary {
        schema_version: SCHEMA_VERSION,
        tracer_version: rec.tracer_version.clone(),
        pid: rec.target.pid,
        comm: rec.target.comm.clone(),
        cmdline: rec.target.cmdline.clone(),
        requests: super::requests::analyze(rec, prev),
        duration_ns: rec.duration_ns(),
        start_ns: rec.start_ns,
        end_ns: rec.end_ns,
        realtime_minus_monotonic_ns: rec.host.realtime_minus_monotonic_ns,
        end_reason: rec.end_reason,
        target_exited_ns: rec.target_exited_ns,
        probe_mode: rec.probe_mode,
        probe_fallback_reason: rec.probe_fallback_reason.clone(),
        incomplete: rec.incomplete.clone(),
        tracer_cost: rec.tracer_cost,
        dropped_events: rec.losses.ringbuf_dropped,
        timeline_missing_before_ns: rec.timeline_missing_before_ns,
        events_received: rec.events_received,
        losses: rec.losses,
        self_check: super::selfcheck::check(rec),
        capabilities: rec.capabilities.clone(),
        totals,
        counters: counters_summary(rec),
        gpu: gpu_analysis::summarize(rec),
        cgroup,
        cgroups,
        cuda: cuda_summary(rec, &threads),
        processes: super::processes::summarize(rec),
        threads,
        preemptors,
        neighbours,
        preemptor_processes,
        untraced_children: rec.children.clone(),
        cpu_steal: rec
            .proc_counts
            .as_ref()
            .map(|w| w.steal())
            .unwrap_or_default()
            .into_iter()
            .map(|(cpu, steal_ns)| CpuSteal { cpu, steal_ns })
            .collect(),
        held_up_by: super::wakers::summarize(rec),
        gc: super::pauses::summarize(rec),
        pause_probes: rec.pause_probes.clone(),
        migration_routes,
        pid_namespace: None,
        ranks: None,
    };
    s.pid_namespace = pid_namespace(rec, &s);
    s.ranks = super::ranks::summarize(rec, &s);
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        recording::PreemptorRecord,
        recording::testutil::{recording, thread},
    };

    #[test]
    fn sorts_and_totals() {
        let rec = recording(
            vec![
                thread(1, 5_000, 1_000, &[400, 600]),
                thread(2, 3_000, 3_000, &[3_000]),
            ],
            vec![
                PreemptorRecord {
                    pid: 7,
                    tgid: 7,
                    comm: "hog-0".into(),
                    process_comm: Some("hog".into()),
                    wait_ns: 2_000,
                    slices: 3,
                    ..Default::default()
                },
                PreemptorRecord {
                    pid: 8,
                    tgid: 7,
                    comm: "hog-1".into(),
                    process_comm: Some("hog".into()),
                    wait_ns: 1_000,
                    slices: 3,
                    ..Default::default()
                },
                PreemptorRecord {
                    pid: 2,
                    tgid: 100,
                    comm: "t2".into(),
                    process_comm: Some("server".into()),
                    wait_ns: 1_000,
                    slices: 1,
                    ..Default::default()
                },
            ],
        );
        let s = crate::analysis::analyze(&rec).summary;
        assert_eq!(s.duration_ns, 10_000);
        assert_eq!(s.threads[0].tid, 2, "largest wait first");
        assert_eq!(s.totals.time.runq_wait_ns, 4_000);
        assert_eq!(s.totals.runq_waits, 3);
        assert_eq!(s.totals.runq_wait_max_ns, 3_000);
        assert!((s.totals.runq_wait_share - 4_000.0 / 12_000.0).abs() < 1e-9);
        assert_eq!(
            s.totals.runq_wait_quantiles_from,
            Some(QuantileSource::Events)
        );
        assert_eq!(s.preemptors[0].comm, "hog-0");
        assert!(!s.preemptors[0].same_process);
        assert!(s.preemptors[2].same_process || s.preemptors[1].same_process);
        assert!((s.preemptors[0].wait_share - 0.5).abs() < 1e-9);
        // Per process: the two hog threads together.
        assert_eq!(s.preemptor_processes.len(), 2);
        let hog = &s.preemptor_processes[0];
        assert_eq!((hog.tgid, hog.comm.as_str(), hog.threads), (7, "hog", 2));
        assert_eq!(hog.wait_ns, 3_000);
        assert!((hog.wait_share - 0.75).abs() < 1e-9);
        assert!(s.preemptor_processes[1].same_process);
    }

    #[test]
    fn incomplete_samples_fall_back_to_the_kernel_histogram() {
        let mut t = thread(1, 5_000, 1_000, &[400, 600]);
        t.runq_waits = 3; // one wait never reached userspace
        let s = crate::analysis::analyze(&recording(vec![t], vec![])).summary;
        assert_eq!(
            s.threads[0].runq_wait_quantiles_from,
            QuantileSource::KernelLog2
        );
        assert_eq!(
            s.totals.runq_wait_quantiles_from,
            Some(QuantileSource::KernelLog2)
        );
    }
}
