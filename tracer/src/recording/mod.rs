//! The recording: everything one tracing window produced, on the monotonic clock, assembled from
//! the sources. Assembly is pure: the kernel's per-thread totals and the window edges in, closed
//! per-thread accounts out.

pub mod cgroup;
pub mod children;
pub mod collect;
pub mod counters;
pub mod gpu;
pub mod host;
pub mod probes;
pub mod records;
pub mod requests;
pub mod samples;
pub mod threads;
pub mod timeline;
pub mod topology;
pub mod waits;

use std::collections::BTreeMap;

use counters::{CounterBins, CounterTotals};
use gpu::GpuRecording;
pub use samples::WaitSamples;
use serde::{Deserialize, Serialize};
use tracer_common::{FLAG_CREATED, FLAG_EXITED, FLAG_SEEN, ThreadState, ThreadStats};

pub use host::{Capabilities, Capability, GpuCapability, PmuCapability};
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
    /// The target's cgroup in the v2 hierarchy (what preemptors' cgroups are compared with).
    #[serde(default)]
    pub target_cgroup: Option<String>,
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

/// The target cgroup's throttling counters over the window.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CgroupRecording {
    pub cgroup: cgroup::CpuCgroup,
    pub samples: Vec<cgroup::CgroupSample>,
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

    /// Every thread's states over the window, rebuilt from the timeline events the first time
    /// it is asked for and shared from then on: by the request decomposition, the renderers
    /// and trace recovery. A recording is not changed once assembled; a change to its window
    /// or events after the first call is a bug, caught in debug builds.
    pub fn threads_over_time(&self) -> &timeline::Timelines {
        let window = (self.start_ns, self.end_ns, self.timeline.events.len());
        let b = self.timeline.built.get_or_init(|| Built {
            window,
            threads: timeline::build(&self.timeline.events, self.start_ns, self.end_ns),
        });
        debug_assert_eq!(
            b.window, window,
            "the recording changed after its timeline was built"
        );
        &b.threads
    }
}

pub fn comm_string(raw: &[u8]) -> String {
    let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
    String::from_utf8_lossy(&raw[..end]).into_owned()
}

/// Characters that would change how a terminal shows what follows (C0/C1 controls, DEL, and
/// the bidirectional overrides that reorder a line), when they are not meant.
pub fn unsafe_for_terminals(c: char, keep_newlines: bool) -> bool {
    (c.is_control() && !(keep_newlines && c == '\n'))
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

fn escape_into(out: &mut String, c: char) {
    use std::fmt::Write as _;
    let _ = match c {
        '\n' => write!(out, "\\n"),
        '\t' => write!(out, "\\t"),
        c if (c as u32) < 0x100 => write!(out, "\\x{:02x}", c as u32),
        c => write!(out, "\\u{{{:x}}}", c as u32),
    };
}

/// A name from the kernel or /proc (a thread's comm, a command line) as it may be shown in a
/// sentence or a table: control characters and bidirectional overrides escaped (`\x1b`, `\n`),
/// and backslashes doubled so an escape cannot be faked. A thread can name itself anything
/// but NUL (prctl PR_SET_NAME), including terminal escape sequences.
pub fn printable(name: &str) -> std::borrow::Cow<'_, str> {
    if !name
        .chars()
        .any(|c| c == '\\' || unsafe_for_terminals(c, false))
    {
        return std::borrow::Cow::Borrowed(name);
    }
    let mut out = String::with_capacity(name.len() + 8);
    for c in name.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            c if unsafe_for_terminals(c, false) => escape_into(&mut out, c),
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Text for a terminal: every control character but the newlines escaped. The last line of
/// defence for whole outputs; names are escaped where they are formatted (`printable`), which
/// also catches a newline inside a name.
pub fn terminal_safe(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(|c| unsafe_for_terminals(c, true)) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if unsafe_for_terminals(c, true) {
            escape_into(&mut out, c);
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Closes a kernel account against the window `[start, end]`: the interval before the first
/// event goes to the state deduced from it, the interval after the last event to the state the
/// thread is still in.
/// The interval after the last event, for a thread the probes last saw switched in: its own
/// counters read just after the window (`after`) say whether it ran all of it. It did not if
/// it switched off the CPU since and no tracepoint reported it (on our VMs, any thread of
/// PID 1): its switch counts moved on. Then it ran what its CPU time moved by since that
/// switch-in (exact: the kernel brings it up to date at every switch), and was off the CPU for
/// the rest. A thread still running has the same switch counts, and its CPU time may lag by a
/// tick (schedstat is the raw `sum_exec_runtime`): it ran all of the tail.
fn running_tail(s: &ThreadStats, tail: u64, after: Option<&ProcCounts>) -> (u64, u64) {
    // `seen_*` hold the thread's counters less the probes' own counts at its last reading
    // (tracer-ebpf `remember`): what moved beyond them went unreported.
    let unreported = |kernel: u64, counted: u64, offset: u64| {
        kernel.wrapping_sub(counted).wrapping_sub(offset) as i64
    };
    match after {
        Some(a)
            if s.flags & FLAG_SEEN != 0
                && (unreported(a.voluntary, s.voluntary_switches, s.seen_nvcsw) > 0
                    || unreported(a.involuntary, s.involuntary_switches, s.seen_nivcsw) > 0) =>
        {
            let ran = unreported(a.oncpu_ns, s.oncpu_ns, s.seen_exec_ns).max(0) as u64;
            (ran.min(tail), tail.saturating_sub(ran))
        }
        _ => (tail, 0),
    }
}

pub fn close_thread(
    s: &ThreadStats,
    start: u64,
    end: u64,
    comm: Option<&str>,
    samples: WaitSamples,
    after: Option<&ProcCounts>,
) -> ThreadRecord {
    let mut time = threads::StateTimes::from(s);
    let created = s.flags & FLAG_CREATED != 0;
    if !created && s.first_state != ThreadState::Unknown as u32 {
        time.add_in(s.first_state, s.first_ts_ns.saturating_sub(start));
    }
    if s.state == ThreadState::Running as u32 {
        let (ran, off) = running_tail(s, end.saturating_sub(s.state_ts_ns), after);
        time.oncpu_ns += ran;
        time.blocked_ns += off;
    } else if s.state != ThreadState::Unknown as u32 {
        time.add_in(s.state, end.saturating_sub(s.state_ts_ns));
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
        totals: threads::ThreadTotals {
            switches: s.into(),
            time,
        },
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
        totals: threads::ThreadTotals {
            switches: Default::default(),
            time: threads::StateTimes {
                oncpu_ns: if running { len } else { 0 },
                runq_wait_ns: 0,
                blocked_ns: if running { 0 } else { len },
            },
        },
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
    /// The threads' own counters read just after the window (for `close_thread`).
    pub end_counts: BTreeMap<u32, ProcCounts>,
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
        let mut rec = close_thread(s, start, end, name, w, inp.end_counts.get(&s.tid));
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
        let r = close_thread(&s, 100, 1000, None, WaitSamples::default(), None);
        assert_eq!(r.totals.time.blocked_ns, 50 + 600);
        assert_eq!(r.totals.time.oncpu_ns, 240);
        assert_eq!(r.totals.time.runq_wait_ns, 10);
        assert_eq!(r.totals.time.alive_ns(), 900);
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
        let r = close_thread(&s, 100, 1000, Some("renamed"), WaitSamples::default(), None);
        assert_eq!(r.totals.time.alive_ns(), 400);
        assert_eq!(r.created_ns, Some(300));
        assert_eq!(r.exited_ns, Some(700));
        // An exited thread keeps its kernel-side name: /proc no longer knows it.
        assert_eq!(r.comm, "worker");
    }

    #[test]
    fn an_unreported_switch_off_the_cpu_ends_the_running_tail() {
        // Seen blocked from the window's start (100), switched in at 400 having run 5 us in
        // all and switched 10 times; still "running" at the window's end (1000) as far as the
        // probes know.
        let mut s = stats(3);
        s.first_state = ThreadState::Blocked as u32;
        s.first_ts_ns = 100;
        s.state = ThreadState::Running as u32;
        s.state_ts_ns = 400;
        s.flags |= FLAG_SEEN;
        // The counters less the probes' own counts (tracer-ebpf `remember`).
        s.seen_exec_ns = 5_000;
        (s.seen_nvcsw, s.seen_nivcsw) = (8, 2);
        let after = |oncpu_ns, voluntary| ProcCounts {
            t_ns: 1_010,
            oncpu_ns,
            voluntary,
            involuntary: 2,
        };
        // It blocked after 50 ns, unreported: 50 on the CPU, the rest blocked.
        let r = close_thread(
            &s,
            100,
            1000,
            None,
            WaitSamples::default(),
            Some(&after(5_050, 9)),
        );
        assert_eq!(
            (r.totals.time.oncpu_ns, r.totals.time.blocked_ns),
            (50, 550)
        );
        // Still running: no switch since, and its CPU time lags (not updated since a tick).
        let r = close_thread(
            &s,
            100,
            1000,
            None,
            WaitSamples::default(),
            Some(&after(5_100, 8)),
        );
        assert_eq!((r.totals.time.oncpu_ns, r.totals.time.blocked_ns), (600, 0));
        // Without its counters (classic tracepoints), the tail runs to the end as before.
        s.flags &= !FLAG_SEEN;
        let r = close_thread(
            &s,
            100,
            1000,
            None,
            WaitSamples::default(),
            Some(&after(5_050, 9)),
        );
        assert_eq!(r.totals.time.oncpu_ns, 600);
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
        assert_eq!(threads[0].totals.time.blocked_ns, 1000);
        assert_eq!(threads[1].totals.time.oncpu_ns, 1000);
        assert_eq!(threads[2].totals.time.oncpu_ns, 200);
        assert_eq!(threads[2].totals.time.runq_wait_ns, 800);
    }

    #[test]
    fn names_cannot_drive_the_terminal() {
        assert_eq!(printable("python3"), "python3");
        let evil = "x\u{1b}]0;owned\u{7}\u{1b}[2J\nfake line\u{202e}";
        let p = printable(evil);
        assert_eq!(p, "x\\x1b]0;owned\\x07\\x1b[2J\\nfake line\\u{202e}");
        assert!(!p.chars().any(char::is_control));
        assert_eq!(
            printable("a\\x1b"),
            "a\\\\x1b",
            "a literal backslash cannot fake one"
        );
        assert_eq!(terminal_safe("ok\nline\u{9b}2J"), "ok\nline\\x9b2J");
    }

    #[test]
    fn comm_is_cut_at_nul_and_lossy() {
        assert_eq!(comm_string(b"abc\0def"), "abc");
        assert_eq!(comm_string(b"\xffx"), "\u{fffd}x");
        assert_eq!(comm_string(b"sixteen_chars_ab"), "sixteen_chars_ab");
    }
}
