//! The recording: everything one tracing window produced, on the monotonic clock, assembled from
//! the sources. Assembly is pure: the kernel's per-thread totals and the window edges in, closed
//! per-thread accounts out.

pub mod collect;
pub mod counters;
pub mod gpu;
pub mod requests;
pub mod samples;
pub mod waits;

use std::collections::BTreeMap;

use counters::{CounterBins, CounterTotals};
use gpu::GpuRecording;
pub use samples::WaitSamples;
use serde::{Deserialize, Serialize};
use tracer_common::{FLAG_CREATED, FLAG_EXITED, ThreadState, ThreadStats};

use crate::sources::{
    ebpf::{Losses, ProbeMode},
    host::Capabilities,
    process::ThreadInfo,
};

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
    /// Recovered from a trace file the tracer did not finish (crash, kill, full disk).
    Unfinished,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TargetMeta {
    pub pid: u32,
    pub comm: String,
    pub cmdline: Vec<String>,
}

/// One thread's account over the window. `oncpu_ns + runq_wait_ns + blocked_ns` covers the part
/// of the window the thread was alive.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ThreadRecord {
    pub tid: u32,
    pub comm: String,
    pub created_ns: Option<u64>,
    pub exited_ns: Option<u64>,
    pub parent_tid: Option<u32>,
    pub voluntary_switches: u64,
    pub involuntary_switches: u64,
    pub migrations: u64,
    pub wakeups: u64,
    pub oncpu_ns: u64,
    pub runq_wait_ns: u64,
    pub blocked_ns: u64,
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
}

/// A thread's CUDA driver calls over the window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CudaTotals {
    pub launches: u64,
    pub sync_calls: u64,
    /// Time inside synchronizing calls: waiting for the GPU.
    pub sync_ns: u64,
    pub sync_max_ns: u64,
}

impl From<&tracer_common::CudaThread> for CudaTotals {
    fn from(c: &tracer_common::CudaThread) -> Self {
        Self {
            launches: c.launches,
            sync_calls: c.sync_calls,
            sync_ns: c.sync_ns,
            sync_max_ns: c.sync_max_ns,
        }
    }
}

/// One synchronizing CUDA call of one thread, on the timeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CudaSpan {
    pub tid: u32,
    pub start_ns: u64,
    pub end_ns: u64,
    /// The libcuda function (`CudaFn` discriminant).
    pub function: u32,
}

impl ThreadRecord {
    pub fn offcpu_ns(&self) -> u64 {
        self.runq_wait_ns + self.blocked_ns
    }
    pub fn alive_ns(&self) -> u64 {
        self.oncpu_ns + self.offcpu_ns()
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PreemptorRecord {
    pub pid: u32,
    pub tgid: u32,
    pub comm: String,
    /// Name of the process (thread group leader), when it still existed at the end.
    pub process_comm: Option<String>,
    /// Run-queue waiting of the target's threads while this task ran (ns).
    pub wait_ns: u64,
    pub slices: u64,
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
    /// The target cgroup's CPU bandwidth throttling over the window.
    pub cgroup: Option<CgroupRecording>,
    /// The machine and the tracer invocation.
    pub host: HostMeta,
    /// Set when this recording was recovered from an incomplete trace file: what is missing.
    pub incomplete: Option<String>,
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
    /// The target's requests, from its marker functions or a latency log.
    #[serde(skip)]
    pub requests: Option<requests::RequestSet>,
}

/// The machine a recording was made on, and how the tracer was invoked.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct HostMeta {
    pub hostname: String,
    pub kernel: String,
    pub clocksource: String,
    pub cpu_model: String,
    pub cpus_online: Vec<u32>,
    pub topology: Vec<crate::sources::topology::CpuPlace>,
    /// The tracer's own command line.
    pub argv: Vec<String>,
    /// CLOCK_REALTIME minus CLOCK_MONOTONIC when the recording started, to place a latency
    /// log kept on wall-clock time.
    #[serde(default)]
    pub realtime_minus_monotonic_ns: i64,
}

/// The target cgroup's throttling counters over the window.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CgroupRecording {
    pub cgroup: crate::sources::cgroup::CpuCgroup,
    pub samples: Vec<crate::sources::cgroup::CgroupSample>,
}

/// Raw timeline records, in arrival order.
#[derive(Debug, Clone, Default)]
pub struct Timeline {
    pub events: Vec<tracer_common::Event>,
    pub slices: Vec<tracer_common::CounterSlice>,
}

impl Recording {
    pub fn duration_ns(&self) -> u64 {
        self.end_ns.saturating_sub(self.start_ns)
    }
}

pub fn comm_string(raw: &[u8]) -> String {
    let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
    String::from_utf8_lossy(&raw[..end]).into_owned()
}

fn add_to(state: u32, ns: u64, on: &mut u64, rq: &mut u64, bl: &mut u64) {
    match ThreadState::try_from(state) {
        Ok(ThreadState::Running) => *on += ns,
        Ok(ThreadState::Runnable) => *rq += ns,
        Ok(ThreadState::Blocked | ThreadState::New) => *bl += ns,
        _ => {}
    }
}

/// Closes a kernel account against the window `[start, end]`: the interval before the first
/// event goes to the state deduced from it, the interval after the last event to the state the
/// thread is still in.
pub fn close_thread(
    s: &ThreadStats,
    start: u64,
    end: u64,
    comm: Option<&str>,
    samples: WaitSamples,
) -> ThreadRecord {
    let (mut on, mut rq, mut bl) = (s.oncpu_ns, s.runq_wait_ns, s.blocked_ns);
    let created = s.flags & FLAG_CREATED != 0;
    if !created && s.first_state != ThreadState::Unknown as u32 {
        let head = s.first_ts_ns.saturating_sub(start);
        add_to(s.first_state, head, &mut on, &mut rq, &mut bl);
    }
    if s.state != ThreadState::Unknown as u32 {
        let tail = end.saturating_sub(s.state_ts_ns);
        add_to(s.state, tail, &mut on, &mut rq, &mut bl);
    }
    let kernel_comm = comm_string(&s.comm);
    ThreadRecord {
        tid: s.tid,
        // The name the thread has now beats the one it had when first seen; an exited thread
        // keeps the name the kernel saw at exit.
        comm: match comm {
            Some(c) if s.flags & FLAG_EXITED == 0 => c.to_string(),
            _ => kernel_comm,
        },
        created_ns: created.then_some(s.created_ts_ns),
        exited_ns: (s.flags & FLAG_EXITED != 0).then_some(s.exited_ts_ns),
        parent_tid: created.then_some(s.parent_tid),
        voluntary_switches: s.voluntary_switches,
        involuntary_switches: s.involuntary_switches,
        migrations: s.migrations,
        wakeups: s.wakeups,
        oncpu_ns: on,
        runq_wait_ns: rq,
        blocked_ns: bl,
        runq_waits: s.runq_waits,
        runq_wait_max_ns: s.runq_wait_max_ns,
        runq_wait_log2_hist: s.runq_hist.to_vec(),
        runq_wait_samples: samples,
        counters: None,
        cuda: None,
        wait_classes: Default::default(),
    }
}

/// A thread that produced no event in the whole window: it kept the state /proc showed at the
/// start (a thread that is R and never switches is alone on its CPU the whole time).
pub fn quiet_thread(info: &ThreadInfo, start: u64, end: u64) -> ThreadRecord {
    let len = end.saturating_sub(start);
    let running = info.state == 'R';
    ThreadRecord {
        tid: info.tid,
        comm: info.comm.clone(),
        created_ns: None,
        exited_ns: None,
        parent_tid: None,
        voluntary_switches: 0,
        involuntary_switches: 0,
        migrations: 0,
        wakeups: 0,
        oncpu_ns: if running { len } else { 0 },
        runq_wait_ns: 0,
        blocked_ns: if running { 0 } else { len },
        runq_waits: 0,
        runq_wait_max_ns: 0,
        runq_wait_log2_hist: vec![0; tracer_common::RUNQ_HIST_SLOTS],
        runq_wait_samples: WaitSamples::default(),
        counters: None,
        cuda: None,
        wait_classes: Default::default(),
    }
}

/// What the sources produced for the threads, to be joined into thread records.
#[derive(Default)]
pub struct ThreadInputs {
    /// The kernel's per-thread accounts.
    pub kernel: Vec<ThreadStats>,
    /// Threads /proc listed at the start, and at the end (for their current names).
    pub initial: BTreeMap<u32, ThreadInfo>,
    pub final_names: BTreeMap<u32, ThreadInfo>,
    /// Run-queue waits from the timeline.
    pub samples: BTreeMap<u32, WaitSamples>,
    /// Perf counter totals, when counters were open.
    pub counters: BTreeMap<u32, CounterTotals>,
    /// CUDA call accounting, when the uprobes were attached.
    pub cuda: BTreeMap<u32, CudaTotals>,
    /// Run-queue waits by kind.
    pub waits: BTreeMap<u32, waits::WaitClasses>,
}

/// Joins the inputs into thread records sorted by TID.
pub fn assemble_threads(mut inp: ThreadInputs, start: u64, end: u64) -> Vec<ThreadRecord> {
    let mut out: BTreeMap<u32, ThreadRecord> = BTreeMap::new();
    for s in &inp.kernel {
        let name = inp
            .final_names
            .get(&s.tid)
            .or_else(|| inp.initial.get(&s.tid))
            .map(|i| i.comm.as_str());
        let w = inp.samples.remove(&s.tid).unwrap_or_default();
        let mut rec = close_thread(s, start, end, name, w);
        rec.counters = inp.counters.remove(&s.tid);
        rec.wait_classes = inp.waits.remove(&s.tid).unwrap_or_default();
        out.insert(s.tid, rec);
    }
    for (tid, info) in &inp.initial {
        out.entry(*tid)
            .or_insert_with(|| quiet_thread(info, start, end));
    }
    for (tid, c) in inp.cuda {
        if let Some(t) = out.get_mut(&tid) {
            t.cuda = Some(c);
        }
    }
    out.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(tid: u32) -> ThreadStats {
        ThreadStats::new(tid, 100)
    }

    #[test]
    fn window_edges_close_the_account() {
        // Blocked before the window, woken at 150, ran 160..400, blocked since 400.
        let mut s = stats(1);
        s.first_state = ThreadState::Blocked as u32;
        s.first_ts_ns = 150;
        s.runq_wait_ns = 10;
        s.oncpu_ns = 240;
        s.state = ThreadState::Blocked as u32;
        s.state_ts_ns = 400;
        let r = close_thread(&s, 100, 1000, None, WaitSamples::default());
        assert_eq!(r.blocked_ns, 50 + 600);
        assert_eq!(r.oncpu_ns, 240);
        assert_eq!(r.runq_wait_ns, 10);
        assert_eq!(r.alive_ns(), 900);
    }

    #[test]
    fn created_and_dead_threads_cover_only_their_life() {
        let mut s = stats(2);
        s.flags = FLAG_CREATED | FLAG_EXITED;
        s.created_ts_ns = 300;
        s.exited_ts_ns = 700;
        s.first_state = ThreadState::New as u32;
        s.first_ts_ns = 300;
        s.blocked_ns = 5;
        s.runq_wait_ns = 15;
        s.oncpu_ns = 380;
        s.state = ThreadState::Dead as u32;
        s.state_ts_ns = 700;
        s.comm = *b"worker\0\0\0\0\0\0\0\0\0\0";
        let r = close_thread(&s, 100, 1000, Some("renamed"), WaitSamples::default());
        assert_eq!(r.alive_ns(), 400);
        assert_eq!(r.created_ns, Some(300));
        assert_eq!(r.exited_ns, Some(700));
        // An exited thread keeps its kernel-side name: /proc no longer knows it.
        assert_eq!(r.comm, "worker");
    }

    #[test]
    fn threads_without_events_keep_their_start_state() {
        let mut initial = BTreeMap::new();
        initial.insert(
            5,
            ThreadInfo {
                tid: 5,
                comm: "sleeper".into(),
                state: 'S',
            },
        );
        initial.insert(
            6,
            ThreadInfo {
                tid: 6,
                comm: "spinner".into(),
                state: 'R',
            },
        );
        let mut s = stats(7);
        s.first_state = ThreadState::Running as u32;
        s.first_ts_ns = 200;
        s.state = ThreadState::Runnable as u32;
        s.state_ts_ns = 200;
        s.involuntary_switches = 1;
        let threads = assemble_threads(
            ThreadInputs {
                kernel: vec![s],
                initial,
                ..Default::default()
            },
            0,
            1000,
        );
        let tids: Vec<u32> = threads.iter().map(|t| t.tid).collect();
        assert_eq!(tids, vec![5, 6, 7]);
        assert_eq!(threads[0].blocked_ns, 1000);
        assert_eq!(threads[1].oncpu_ns, 1000);
        assert_eq!(threads[2].oncpu_ns, 200);
        assert_eq!(threads[2].runq_wait_ns, 800);
    }

    #[test]
    fn comm_is_cut_at_nul_and_lossy() {
        assert_eq!(comm_string(b"abc\0def"), "abc");
        assert_eq!(comm_string(b"\xffx"), "\u{fffd}x");
        assert_eq!(comm_string(b"sixteen_chars_ab"), "sixteen_chars_ab");
    }
}
