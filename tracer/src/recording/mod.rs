//! The recording: everything one tracing window produced, on the monotonic clock, assembled from
//! the sources. Assembly is pure: the kernel's per-thread totals and the window edges in, closed
//! per-thread accounts out.

pub mod cgroup;
pub mod children;
pub mod close;
pub mod collect;
pub mod counters;
pub mod cuda;
pub mod gpu;
pub mod host;
pub mod latency_log;
pub mod names;
pub mod pauses;
pub mod probes;
pub mod records;
pub mod requests;
pub mod samples;
pub mod threads;
pub mod timeline;
pub mod topology;
pub mod waits;
pub mod wakers;
pub mod window;

#[cfg(test)]
pub mod testutil;

use std::collections::BTreeMap;

use counters::{CounterBins, CounterTotals};
use gpu::GpuRecording;
pub use samples::WaitSamples;
use serde::{Deserialize, Serialize};

pub use cuda::{CudaSpan, CudaTotals};
pub use host::{Capabilities, Capability, GpuCapability, PmuCapability};
pub use names::{comm_string, printable, terminal_safe, unsafe_for_terminals};
pub use probes::{Losses, ProbeMode};
pub use threads::ThreadInfo;

/// Why the recording ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum EndReason {
    /// The requested duration elapsed.
    Duration,
    /// SIGINT or SIGTERM.
    Interrupted,
    /// The target process exited.
    TargetExited,
    /// `tracer watch` closed the window at its interval; the recording went on.
    Window,
    /// Recovered from a trace file the tracer did not finish (crash, kill, full disk).
    Unfinished,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TargetMeta {
    pub pid: u32,
    pub comm: String,
    pub cmdline: Vec<String>,
}

/// One process of the target set: given, a descendant when the recording started, or forked
/// by a member during it (`joined_ns`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ProcessRecord {
    /// The kernel's PID (TGID).
    pub pid: u32,
    /// Its parent when it joined (0 when unknown).
    pub ppid: u32,
    pub comm: String,
    pub cmdline: Vec<String>,
    /// Named on the command line (not brought in as a descendant).
    pub given: bool,
    /// When it was forked, if inside the window (None: it was there at the start).
    pub joined_ns: Option<u64>,
    /// Its CPU cgroup (the v2 path, or the v1 cpu controller's), when known.
    #[serde(default)]
    pub cgroup: Option<String>,
    /// The CPython interpreter it runs, when it is one (absent from older files).
    #[serde(default)]
    pub python: Option<pauses::Python>,
}

/// One thread's account over the window. `oncpu_ns + runq_wait_ns + blocked_ns` covers the part
/// of the window the thread was alive.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ThreadRecord {
    pub tid: u32,
    /// Its process (the kernel's TGID; 0 in trace files from before process trees).
    #[serde(default)]
    pub pid: u32,
    pub comm: String,
    pub created_ns: Option<u64>,
    pub exited_ns: Option<u64>,
    pub parent_tid: Option<u32>,
    #[serde(flatten)]
    pub totals: threads::ThreadTotals,
    /// Complete run-queue waits inside the window.
    pub runq_waits: u64,
    pub runq_wait_max_ns: u64,
    /// The kernel's log2 histogram of those waits (slot i: [2^(i-1), 2^i) ns).
    pub runq_wait_log2_hist: Vec<u32>,
    #[serde(skip)]
    pub runq_wait_samples: WaitSamples,
    /// Perf counter totals over the thread's slices in the window, if counters were open.
    pub counters: Option<CounterTotals>,
    /// CUDA calls, if the thread made any while the uprobes were attached.
    pub cuda: Option<CudaTotals>,
    /// Its run-queue waits by kind (from the timeline: complete waits seen by userspace).
    #[serde(default)]
    pub wait_classes: waits::WaitClasses,
    /// Its last slice's end where no program saw it (`close::TailSwitch`), for the timeline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tail_switch: Option<close::TailSwitch>,
}

/// The kernel's per-CPU migration stopper (`migration/N`): the CPU time it takes is the cost
/// of moving threads, not contention.
pub fn is_migration_stopper(comm: &str) -> bool {
    comm.starts_with("migration/")
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PreemptorRecord {
    pub pid: u32,
    pub tgid: u32,
    pub comm: String,
    /// Name of the process (thread group leader), when it still existed at the end.
    pub process_comm: Option<String>,
    /// Run-queue waiting of the target's threads while this task ran (ns).
    pub wait_ns: u64,
    pub slices: u64,
    /// Its parent process, when known (the kernel side reads it at the first slice; else
    /// /proc at the end).
    #[serde(default)]
    pub ppid: Option<u32>,
    /// Its cgroup (in the v2 hierarchy), when known.
    #[serde(default)]
    pub cgroup: Option<String>,
    /// Of `wait_ns`, the handoffs it was the partner in (`WaitKind::Handoff`: a target thread
    /// waited behind it as the task it exchanges work with, until it blocked), from the
    /// window's switch-in records: the exchange, not contention.
    #[serde(default)]
    pub handoff_ns: u64,
}

/// A process the target forked, or one of its descendants: not traced (the programs follow
/// the target's TGID), and named in the summary.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ChildRecord {
    pub pid: u32,
    /// The process that forked it.
    pub parent: u32,
    pub comm: String,
    /// When it was forked, if inside the window (None: it existed at the start).
    pub created_ns: Option<u64>,
    pub alive_at_end: bool,
    /// Its CPU time over the window (all its threads, /proc), when it was alive at both ends
    /// or born inside the window.
    pub cpu_ns: Option<u64>,
}

/// The tracer's own cost over the window, every thread of its process, user and system time
/// (the BPF programs' time is charged to the tasks they run on, not here: `cargo xtask bench`
/// measures that).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct TracerCost {
    pub cpu_ns: u64,
    /// `cpu_ns` over the window: the share of one CPU.
    pub cpu_share: f64,
    /// The process's peak resident set, loading included.
    pub peak_rss_bytes: u64,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, schemars::JsonSchema)]
pub struct MigrationRoute {
    pub tid: u32,
    pub from_cpu: u32,
    pub to_cpu: u32,
    pub count: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Recording {
    pub tracer_version: String,
    pub target: TargetMeta,
    pub probe_mode: ProbeMode,
    /// Why tp_btf was not used, if it was not.
    pub probe_fallback_reason: Option<String>,
    pub start_ns: u64,
    pub end_ns: u64,
    pub end_reason: EndReason,
    pub target_exited_ns: Option<u64>,
    pub threads: Vec<ThreadRecord>,
    pub preemptors: Vec<PreemptorRecord>,
    pub migration_routes: Vec<MigrationRoute>,
    pub losses: Losses,
    pub events_received: u64,
    /// What could be measured on this host, and why not where not.
    pub capabilities: Capabilities,
    /// Bit k: perf counter slot k was measured (`PerfSlot`).
    pub counter_mask: u32,
    #[serde(skip)]
    pub counter_bins: CounterBins,
    /// NVML samples, when a GPU could be sampled.
    pub gpu: Option<GpuRecording>,
    /// The target cgroup's CPU bandwidth throttling over the window (the first member's).
    pub cgroup: Option<CgroupRecording>,
    /// The same for each other cgroup the members were in, once each.
    #[serde(default)]
    pub other_cgroups: Vec<CgroupRecording>,
    /// The machine and the tracer invocation.
    pub host: HostMeta,
    /// Set when this recording was recovered from an incomplete trace file: what is missing.
    pub incomplete: Option<String>,
    /// The timeline records before this time are missing: the flight recorder's memory
    /// ceiling (`--keep-max-mib`) let them go. The per-thread totals stay exact.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline_missing_before_ns: Option<u64>,
    /// What the tracer's own process cost over the window (absent from older files).
    #[serde(default)]
    pub tracer_cost: Option<TracerCost>,
    /// Why the trace file could not be finished (a full disk): the recording is still whole,
    /// so it is reported, and then the command fails with this.
    #[serde(skip)]
    pub output_error: Option<String>,
    /// The timeline records, kept when an output needs them (Perfetto, HTML).
    #[serde(skip)]
    pub timeline: Timeline,
    /// Synchronizing CUDA calls, in time order of their end (rebuilt from the timeline).
    #[serde(skip)]
    pub cuda_syncs: Vec<CudaSpan>,
    /// Kernel launches per thread per time bin (the counter bins' width).
    #[serde(skip)]
    pub cuda_launch_bins: BTreeMap<u32, BTreeMap<u64, u64>>,
    /// The target's requests, from its marker functions or a latency log. A trace file holds
    /// a latency log's (read back as they were); markers' are rebuilt from its records.
    #[serde(default, skip_serializing_if = "requests::rebuilt")]
    pub requests: Option<requests::RequestSet>,
    /// The tool's PID namespace, when it ran inside one. Every ID in the recording is the
    /// kernel's (the initial namespace's); this says what the namespace calls them.
    #[serde(default)]
    pub pid_namespace: Option<PidNamespaceIds>,
    /// The threads' own counters at both ends of the window (for the self-check).
    #[serde(default)]
    pub proc_counts: Option<ProcWindow>,
    /// The target's child processes (and theirs), which were not traced.
    #[serde(default)]
    pub children: Vec<ChildRecord>,
    /// The processes traced, the first given first (trace files from before process trees:
    /// none; the target alone was).
    #[serde(default)]
    pub processes: Vec<ProcessRecord>,
    /// The target's cgroup in the v2 hierarchy (what preemptors' cgroups are compared with).
    #[serde(default)]
    pub target_cgroup: Option<String>,
    /// The threads' blocked time by who ended it (absent from older files).
    #[serde(default)]
    pub wakers: Vec<wakers::WakerRecord>,
    /// Runtime pauses (garbage collections) of the members, in time order.
    #[serde(default)]
    pub runtime_pauses: Vec<pauses::RuntimePause>,
    /// For each CPython member, whether its collections were traced.
    #[serde(default)]
    pub pause_probes: Vec<pauses::PauseProbe>,
}

/// A thread's own counters as the kernel keeps them (/proc/PID/task/TID/schedstat and
/// status), and when they were read: what the recording is checked against.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcCounts {
    /// CLOCK_MONOTONIC when they were read.
    pub t_ns: u64,
    /// schedstat's time on a CPU (`se.sum_exec_runtime`).
    pub oncpu_ns: u64,
    pub voluntary: u64,
    pub involuntary: u64,
}

/// The target's threads' own counters read just after attaching and just after detaching.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ProcWindow {
    /// By kernel TID.
    pub start: BTreeMap<u32, ProcCounts>,
    pub end: BTreeMap<u32, ProcCounts>,
    /// Threads left out: only the first `SELF_CHECK_THREADS` are read.
    pub left_out: u64,
    /// Each CPU's steal time (the hypervisor running something else on it), ns, at both
    /// ends: /proc/stat, in ticks of the kernel's USER_HZ (10 ms).
    #[serde(default)]
    pub steal_start: Vec<(u32, u64)>,
    #[serde(default)]
    pub steal_end: Vec<(u32, u64)>,
}

impl ProcWindow {
    /// Each CPU's steal over the window, ns (CPUs with none left out).
    pub fn steal(&self) -> Vec<(u32, u64)> {
        self.steal_end
            .iter()
            .filter_map(|&(cpu, end)| {
                let start = self.steal_start.iter().find(|s| s.0 == cpu)?.1;
                let d = end.saturating_sub(start);
                (d > 0).then_some((cpu, d))
            })
            .collect()
    }
}

/// The IDs of the tasks seen in the tool's PID namespace.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PidNamespaceIds {
    /// The namespace's inode (as /proc/PID/ns/pid shows it).
    pub inode: u64,
    /// Kernel TID -> TID in the namespace.
    pub ids: BTreeMap<u32, u32>,
}

/// The machine a recording was made on, and how the tracer was invoked.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct HostMeta {
    pub hostname: String,
    pub kernel: String,
    pub clocksource: String,
    pub cpu_model: String,
    pub cpus_online: Vec<u32>,
    pub topology: Vec<topology::CpuPlace>,
    /// The tracer's own command line.
    pub argv: Vec<String>,
    /// CLOCK_REALTIME minus CLOCK_MONOTONIC when the recording started, to place a latency
    /// log kept on wall-clock time.
    #[serde(default)]
    pub realtime_minus_monotonic_ns: i64,
}

impl HostMeta {
    /// A CLOCK_MONOTONIC time of this recording as Unix time (ns; 0 for one before 1970).
    pub fn unix_ns(&self, monotonic_ns: u64) -> u64 {
        (monotonic_ns as i128 + self.realtime_minus_monotonic_ns as i128).max(0) as u64
    }
}

/// The target cgroup's throttling counters over the window.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CgroupRecording {
    pub cgroup: cgroup::CpuCgroup,
    pub samples: Vec<cgroup::CgroupSample>,
    /// The members in it when the recording started (empty in files from before process
    /// trees: the target).
    #[serde(default)]
    pub pids: Vec<u32>,
}

/// Raw timeline records: the events in time order (`Collector::finish_into` sorts them), the
/// counter slices as they came.
#[derive(Debug, Clone, Default)]
pub struct Timeline {
    pub events: Vec<tracer_common::Event>,
    pub slices: Vec<tracer_common::CounterSlice>,
    /// Each thread's states, rebuilt from `events` once, on first use (`Recording::threads_over_time`).
    built: std::sync::OnceLock<Built>,
}

#[derive(Debug, Clone)]
struct Built {
    /// What it was built from: the window and the number of events.
    window: (u64, u64, usize),
    threads: timeline::Timelines,
}

impl Recording {
    pub fn duration_ns(&self) -> u64 {
        self.end_ns.saturating_sub(self.start_ns)
    }

    /// Whether the process `tgid` was traced: the target, or another process of its set.
    pub fn is_member(&self, tgid: u32) -> bool {
        tgid == self.target.pid && tgid != 0 || self.processes.iter().any(|p| p.pid == tgid)
    }

    /// Every thread's states over the window, rebuilt from the timeline events the first time
    /// it is asked for and shared from then on: by the request decomposition, the renderers
    /// and trace recovery. A recording is not changed once assembled; a change to its window
    /// or events after the first call is a bug, caught in debug builds.
    pub fn threads_over_time(&self) -> &timeline::Timelines {
        let window = (self.start_ns, self.end_ns, self.timeline.events.len());
        let b = self.timeline.built.get_or_init(|| {
            let mut threads = timeline::build(&self.timeline.events, self.start_ns, self.end_ns);
            for t in &self.threads {
                if let (Some(sw), Some(tl)) = (t.tail_switch, threads.get_mut(&t.tid)) {
                    tl.switched_unseen_at_end(sw.ts_ns, sw.preempted);
                }
            }
            Built { window, threads }
        });
        debug_assert_eq!(
            b.window, window,
            "the recording changed after its timeline was built"
        );
        &b.threads
    }
}
