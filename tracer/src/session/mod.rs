//! One recording session: attach the sources to a target, stream their events (to a trace file
//! too, when asked) until the window ends (duration, Ctrl-C / SIGTERM, or the target's exit),
//! detach, and assemble the recording.

use std::{collections::BTreeMap, os::fd::OwnedFd, path::PathBuf, time::Duration};

use anyhow::{Context as _, Result};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tokio::{
    io::unix::AsyncFd,
    signal::unix::{Signal, SignalKind, signal},
};
mod assemble;
mod cgroups;
mod end;
mod flight;
mod wait;
mod windows;

pub use end::Finished;
pub use flight::{FlightStore, Held as FlightHeld};
pub use windows::CUT_LAG;

use crate::{
    recording::{
        Capability, EndReason, HostMeta, Recording, ThreadInfo, cgroup::CgroupSample,
        collect::Collector, counters::slot_name,
    },
    sources::{
        cgroup::ThrottleSet,
        clock::monotonic_ns,
        ebpf::{ProbeOptions, Reaped, SchedProbes},
        gpu::{GpuOptions, GpuSampler, Members},
        host,
        perf::{CounterChoice, PerfSet},
        privileges,
        process::{self, Target},
        targets::Targets,
    },
    trace::{TraceMeta, writer::TraceWriter},
};

pub struct SessionOptions {
    /// None: until the target exits or the user interrupts.
    pub duration: Option<Duration>,
    pub probes: ProbeOptions,
    /// Which perf counters to read at each context switch.
    pub counters: CounterChoice,
    /// Width of the time bins of the counter series.
    pub bin: Duration,
    /// GPU sampling, unless turned off.
    pub gpu: Option<GpuSettings>,
    /// Draw a progress line on stderr (only when it is a terminal).
    pub progress: bool,
    /// Print the "recording ..." notice on stderr.
    pub notices: bool,
    /// Write the recording to this trace file as it goes.
    pub output: Option<PathBuf>,
    /// Keep every timeline record in memory (for Perfetto and HTML outputs).
    pub keep_timeline: bool,
    /// `tracer watch --keep`: hold the timeline records of the run's last stretch (the
    /// kernel side then sends every state change), at most this many bytes of them.
    pub flight: Option<usize>,
    /// `tracer watch`: cut into windows, each assembled from its records `CUT_LAG` after its
    /// end, so idle CPUs' records must be sent to it (an idle sender) rather than taken at the
    /// end.
    pub windows: bool,
    /// How the run ends, in words, where that is not `duration` nor the target's exit (a
    /// watch of N windows, or of a cgroup).
    pub until: Option<String>,
    /// A single recording's latency log (`--latencies`), joined in before the trace file is
    /// finished so that the file holds the requests (a watch joins its log per window).
    pub latencies: Option<PathBuf>,
}

pub struct GpuSettings {
    /// `index` or `uuid` of the one GPU to sample.
    pub select: Option<String>,
    pub interval: Duration,
}

/// How often the ring buffer is drained, the progress line refreshed and dead threads moved out
/// of the kernel map. The kernel wakes the reader earlier only when the ring fills up.
const TICK: Duration = Duration::from_millis(100);
/// Threads whose own /proc counts are read at both ends of the window for the self-check (two
/// small files each, about 10 us).
const SELF_CHECK_THREADS: usize = 4096;
/// How long after detaching the programs the unsent per-CPU records are read.
const DETACH_GRACE: Duration = Duration::from_millis(20);

/// What a trace file says of the recording it holds, from `start`.
fn trace_meta(
    target: &Target,
    host: &HostMeta,
    probes: &SchedProbes,
    start: u64,
    bin_ns: u64,
    threads: BTreeMap<u32, ThreadInfo>,
) -> TraceMeta {
    TraceMeta {
        tracer_version: crate::VERSION.into(),
        target: assemble::target_meta(target),
        host: host.clone(),
        probe_mode: probes.mode(),
        start_ns: start,
        bin_ns,
        counter_mask: probes.counter_mask,
        threads,
        pid_namespace: target
            .pidns
            .as_ref()
            .map(|ns| crate::recording::PidNamespaceIds {
                inode: ns.inode,
                ids: ns.table(),
            }),
    }
}

/// A process's pidfd (opened when it was resolved), which becomes readable when it exits, with
/// its PID as /proc shows it.
fn exit_watch(target: &Target) -> Option<(u32, AsyncFd<OwnedFd>)> {
    let fd = target.pidfd.as_ref()?.try_clone().ok()?;
    // SAFETY: the AsyncFd owns this duplicate, which stays open until the AsyncFd is dropped.
    let fd = unsafe { AsyncFd::register(fd) }.ok()?;
    Some((target.proc_pid, fd))
}

fn progress_bar(opts: &SessionOptions, pid: u32) -> ProgressBar {
    let bar = match opts.duration {
        Some(d) => ProgressBar::new(d.as_millis() as u64),
        None => ProgressBar::new_spinner(),
    };
    let template = match opts.duration {
        Some(_) => "{spinner} recording PID {prefix} {bar:20} {elapsed}/{duration} {msg}",
        None => "{spinner} recording PID {prefix} {elapsed} {msg} (Ctrl-C to stop)",
    };
    bar.set_style(ProgressStyle::with_template(template).expect("static template"));
    bar.set_prefix(pid.to_string());
    // indicatif draws nothing when stderr is not a terminal.
    bar.set_draw_target(if opts.progress {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    });
    bar
}

/// A recording in progress: everything attached, the window (or, watching, the run) open.
pub struct Session<'o> {
    opts: &'o SessionOptions,
    /// The members at the start, less those that exited before it.
    targets: Targets,
    probes: SchedProbes,
    writer: Option<TraceWriter>,
    /// Held open: the programs read the counters through its descriptors.
    _perf: PerfSet,
    sampler: Result<GpuSampler, Capability>,
    throttle: ThrottleSet,
    /// Each cgroup's samples since the last window was cut.
    throttling: Vec<Vec<CgroupSample>>,
    /// The processes given that are still running: the recording ends when the last exits.
    exit_fds: Vec<(u32, AsyncFd<OwnedFd>)>,
    interrupt: Signal,
    terminate: Signal,
    /// SIGHUP, SIGUSR1 and other triggers, handled only where a caller asked (`tracer
    /// watch`).
    hangup: Option<Signal>,
    user1: Option<Signal>,
    trigger: Option<tokio::sync::mpsc::UnboundedReceiver<()>>,
    host: HostMeta,
    start: u64,
    cpu_at_start: u64,
    /// The threads /proc listed just after attaching.
    initial: BTreeMap<u32, ThreadInfo>,
    /// The /proc side at the start of the current window.
    counts: windows::ProcSide,
    /// The timeline data of the current window, and of the one being cut (records still
    /// arriving from other CPUs' batches go to the window their time falls in).
    col: Collector,
    closing: Option<windows::Closing>,
    finished: Reaped,
    target_exited_ns: Option<u64>,
    ticks: u64,
    cgroup_watch: Option<cgroups::CgroupWatch>,
    gpu_members: Members,
    bar: ProgressBar,
    windows: windows::Windows,
    flight: Option<flight::FlightRing>,
}

/// What woke `Session::wait`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    Deadline,
    Interrupted,
    TargetExited,
    Hangup,
    /// SIGUSR1, or a trigger sent to the channel given to `handle_signals`.
    Trigger,
}

/// Records the processes of `targets`. `attached` runs once every probe is attached (`tracer
/// run` releases its child there).
pub async fn record(
    targets: &Targets,
    opts: &SessionOptions,
    attached: impl FnOnce() -> Result<()>,
) -> Result<Recording> {
    let mut session = Session::open(targets, opts, attached)?;
    let deadline = opts.duration.map(|d| tokio::time::Instant::now() + d);
    let end_reason = loop {
        match session.wait(deadline).await? {
            Wake::Deadline => break EndReason::Duration,
            Wake::Interrupted => break EndReason::Interrupted,
            Wake::TargetExited => break EndReason::TargetExited,
            // Not handled without a caller that asked.
            Wake::Hangup | Wake::Trigger => {}
        }
    };
    session.finish(end_reason).await.map(|f| f.last)
}

impl<'o> Session<'o> {
    /// Loads and attaches every source to `targets`, and opens the window.
    pub fn open(
        targets: &Targets,
        opts: &'o SessionOptions,
        attached: impl FnOnce() -> Result<()>,
    ) -> Result<Self> {
        // Caught from the start: loading the probes takes a while (0.2 s here, more with a
        // large libcuda), and a signal then was lost (SIGINT, to a handler registered earlier
        // in the process, whose stream did not exist yet) or killed the tool with its trace
        // file just begun (SIGTERM). Now it ends the window as soon as it opens.
        let interrupt = signal(SignalKind::interrupt()).context("SIGINT handler")?;
        let terminate = signal(SignalKind::terminate()).context("SIGTERM handler")?;
        privileges::check()?;
        // The first process given names the recording; every source covers every member: the
        // CUDA and marker uprobes (on each distinct library file), NVML's processes, and the
        // throttling of each distinct cgroup.
        let target = targets.primary();
        let mut src = Loaded::load(targets, opts)?;

        // The CUDA probes first: attaching them takes a while with a large libcuda, and they
        // only account CUDA calls, which the window's edges do not cut.
        src.attach_uprobes(targets, opts)?;
        let gone = src.leave_out_exited(targets)?;
        let cgroup_watch = match &targets.cgroup {
            Some(c) => Some(cgroups::CgroupWatch::start(c, &mut src.probes)?),
            None => None,
        };
        let targets = targets.without(&gone);
        let start = monotonic_ns();
        let cpu_at_start = process::own_usage().0;
        let (counts, initial) = src.attach_sched(&targets)?;
        let bin_ns = opts.bin.as_nanos() as u64;
        src.announce(target, &targets, opts, start, bin_ns, &initial);
        attached()?;
        let bar = progress_bar(opts, target.pid);
        let throttling = vec![Vec::new(); src.throttle.0.len()];
        let whole_run = src.writer.is_some();
        Ok(Self {
            opts,
            targets,
            probes: src.probes,
            writer: src.writer,
            _perf: src.perf,
            sampler: src.sampler,
            throttle: src.throttle,
            throttling,
            exit_fds: src.exit_fds,
            interrupt,
            terminate,
            hangup: None,
            user1: None,
            trigger: None,
            host: src.host,
            start,
            cpu_at_start,
            initial,
            counts,
            col: Collector::new(start, bin_ns, opts.keep_timeline),
            closing: None,
            finished: Reaped::default(),
            target_exited_ns: None,
            ticks: 0,
            cgroup_watch,
            gpu_members: src.gpu_members,
            bar,
            windows: windows::Windows::new(start, cpu_at_start, whole_run),
            flight: opts.flight.map(flight::FlightRing::new),
        })
    }

    /// Handles SIGHUP and SIGUSR1 from now on, and the triggers sent to `trigger`: `wait`
    /// returns when one comes.
    pub fn handle_signals(
        &mut self,
        trigger: tokio::sync::mpsc::UnboundedReceiver<()>,
    ) -> Result<()> {
        self.hangup = Some(signal(SignalKind::hangup()).context("SIGHUP handler")?);
        self.user1 = Some(signal(SignalKind::user_defined1()).context("SIGUSR1 handler")?);
        self.trigger = Some(trigger);
        Ok(())
    }

    /// No process's exit ends the recording (`--cgroup` alone: the service's processes come
    /// and go).
    pub fn ignore_target_exit(&mut self) {
        self.exit_fds.clear();
    }

    /// The target set as it was at the start.
    pub fn targets(&self) -> &Targets {
        &self.targets
    }

    /// When the run began (CLOCK_MONOTONIC).
    pub fn start_ns(&self) -> u64 {
        self.start
    }
}

/// What `Session::open` makes before attaching anything: output, counters, probes, samplers.
struct Loaded {
    // In the reverse of the order they are made: an error before the session is whole drops
    // them in the order it dropped them when they were `open`'s locals.
    host: HostMeta,
    exit_fds: Vec<(u32, AsyncFd<OwnedFd>)>,
    throttle: ThrottleSet,
    pid_pairs: Vec<(u32, u32)>,
    sampler: Result<GpuSampler, Capability>,
    gpu_members: Members,
    probes: SchedProbes,
    perf: PerfSet,
    writer: Option<TraceWriter>,
}

impl Loaded {
    /// Opens the output and the perf counters, loads the probes and starts the samplers.
    fn load(targets: &Targets, opts: &SessionOptions) -> Result<Self> {
        // Open the output first: a path that cannot be written fails before anything is traced.
        let writer = opts
            .output
            .as_deref()
            .map(TraceWriter::create)
            .transpose()?;
        let cpus = aya::util::online_cpus().map_err(|(what, e)| anyhow::anyhow!("{what}: {e}"))?;
        let mut perf = PerfSet::open(opts.counters, &cpus);
        // The kernel side sends every state change only when something reads them: the kept
        // timeline or a trace file. Decided here, from the options that need them, so that no
        // caller can keep a timeline the probes do not feed.
        let timeline = opts.keep_timeline || opts.output.is_some() || opts.flight.is_some();
        let mut probes = SchedProbes::load(
            &targets.tgids(),
            targets.follow,
            &opts.probes,
            &mut perf,
            timeline,
        )?;
        if opts.windows {
            probes.start_idle_sender();
        }
        // NVML numbers processes as this tool's namespace does; the forked ones join as the
        // kernel side reports them (below, once a second).
        let gpu_members = Members::new(targets.members.iter().map(|t| t.proc_pid));
        let sampler = match &opts.gpu {
            Some(g) => GpuSampler::start(
                gpu_members.clone(),
                GpuOptions {
                    select: g.select.clone(),
                    interval: g.interval,
                },
            ),
            None => Err(Capability {
                available: false,
                reason: "GPU sampling turned off (--no-gpu)".into(),
            }),
        };
        let pid_pairs: Vec<(u32, u32)> = targets
            .members
            .iter()
            .map(|t| (t.proc_pid, t.pid))
            .collect();
        let throttle = ThrottleSet::new(&pid_pairs);
        let exit_fds = targets.members[..targets.given]
            .iter()
            .filter_map(exit_watch)
            .collect();
        let host = host::host_meta(&cpus);
        Ok(Self {
            host,
            exit_fds,
            throttle,
            pid_pairs,
            sampler,
            gpu_members,
            probes,
            perf,
            writer,
        })
    }

    /// Attaches the CUDA, GC and request-marker uprobes to every member.
    fn attach_uprobes(&mut self, targets: &Targets, opts: &SessionOptions) -> Result<()> {
        // /proc paths and uprobe PIDs are this tool's namespace's; the programs filter on the
        // kernel's TGID, set at load.
        let proc_pids: Vec<u32> = targets.members.iter().map(|t| t.proc_pid).collect();
        self.probes.attach_cuda(&proc_pids)?;
        self.probes.attach_gc(&self.pid_pairs);
        if let Some(m) = &opts.probes.markers {
            self.probes.attach_markers(&proc_pids, m)?;
        }
        Ok(())
    }

    /// Fails if a process given has exited; drops the exited descendants, returning their PIDs.
    fn leave_out_exited(&mut self, targets: &Targets) -> Result<Vec<u32>> {
        // Pinned by its pidfd since it was resolved: if it is gone now, its PID may already
        // stand for another process, which the programs (filtering on the number) must not
        // record. A process given is then an error; a descendant that exited meanwhile (a
        // shell's short command) leaves the set.
        if let Some(t) = targets.members[..targets.given].iter().find(|t| t.gone()) {
            anyhow::bail!(
                "PID {} ({}) exited before the recording started",
                t.pid,
                crate::recording::printable(&t.comm)
            );
        }
        let gone: Vec<u32> = targets.members[targets.given..]
            .iter()
            .filter(|t| t.gone())
            .map(|t| t.pid)
            .collect();
        self.probes.remove_targets(&gone)?;
        Ok(gone)
    }

    /// Attaches the scheduler probes, then reads the window's /proc side and lists the threads.
    fn attach_sched(
        &mut self,
        targets: &Targets,
    ) -> Result<(windows::ProcSide, BTreeMap<u32, ThreadInfo>)> {
        self.probes.attach(|| {
            targets
                .threads()
                .into_values()
                .map(|t| (t.tid, t.pid))
                .collect()
        })?;
        // The threads' own counts, as near the window's start as can be: the self-check
        // compares the recording with what they add up to over the window.
        let (counts_start, left_out) = targets.thread_counts(SELF_CHECK_THREADS);
        let counts = windows::ProcSide {
            counts: counts_start,
            left_out,
            steal: process::cpu_steal(),
            children: targets.children(),
        };
        // Listed after attaching: a thread created since is seen by the probes, so none is
        // missed.
        let initial = targets.threads();
        Ok((counts, initial))
    }

    /// Writes the trace file's header, and the notices on stderr when asked for.
    fn announce(
        &mut self,
        target: &Target,
        targets: &Targets,
        opts: &SessionOptions,
        start: u64,
        bin_ns: u64,
        initial: &BTreeMap<u32, ThreadInfo>,
    ) {
        if let Some(w) = self.writer.as_mut() {
            w.meta(&trace_meta(
                target,
                &self.host,
                &self.probes,
                start,
                bin_ns,
                initial.clone(),
            ));
        }
        if opts.notices {
            notices(
                targets,
                opts,
                &self.probes,
                &self.perf,
                &self.sampler,
                initial.len(),
            );
            if let Some(w) = &self.writer {
                eprintln!("tracer: writing {}", w.temp().display());
            }
        }
    }
}

fn notices(
    targets: &Targets,
    opts: &SessionOptions,
    probes: &SchedProbes,
    perf: &PerfSet,
    sampler: &Result<GpuSampler, Capability>,
    threads: usize,
) {
    match sampler {
        Ok(s) => eprintln!("tracer: GPU: {}", s.capability.reason),
        Err(c) if opts.gpu.is_some() => eprintln!("tracer: GPU not sampled: {}", c.reason),
        Err(_) => {}
    }
    if probes.cuda.available || sampler.is_ok() {
        eprintln!("tracer: CUDA waits: {}", probes.cuda.reason);
    }
    if let Some(reason) = &probes.fallback_reason {
        eprintln!("tracer: using classic tracepoints: {reason}");
    }
    if matches!(opts.counters, CounterChoice::Auto | CounterChoice::All) && !perf.pmu.llc_available
    {
        eprintln!(
            "tracer: LLC/IPC counters unavailable: {}; cache thrash will not be assessed",
            perf.pmu.reason
        );
    }
    // One line per reason: the counters given up together share theirs.
    let mut reasons: Vec<(&str, Vec<&str>)> = Vec::new();
    for (slot, why) in &perf.software_errors {
        match reasons.iter_mut().find(|(w, _)| w == why) {
            Some((_, slots)) => slots.push(slot_name(*slot)),
            None => reasons.push((why, vec![slot_name(*slot)])),
        }
    }
    for (why, slots) in reasons {
        eprintln!(
            "tracer: software counters unavailable ({}): {why}",
            slots.join(", ")
        );
    }
    if targets.left_out_self {
        eprintln!(
            "tracer: this tracer (PID {}) is itself among the processes found: it leaves itself \
             out",
            std::process::id()
        );
    }
    let target = targets.primary();
    let until = match (&opts.until, opts.duration) {
        (Some(u), _) => u.clone(),
        (None, Some(d)) => format!("for {}", crate::units::given(d)),
        (None, None) => "until it exits".to_string(),
    };
    let host = if target.pid != target.proc_pid {
        format!(", PID {} on the host", target.pid)
    } else {
        String::new()
    };
    // Which processes: the first, and how many more, with their PIDs (at most 8 listed).
    let more = &targets.members[1..];
    let others = match more.len() {
        0 => String::new(),
        n => {
            let mut pids: Vec<String> = more
                .iter()
                .take(8)
                .map(|m| m.proc_pid.to_string())
                .collect();
            if n > 8 {
                pids.push("...".into());
            }
            format!(
                " and {n} more process{} (PID {})",
                if n == 1 { "" } else { "es" },
                pids.join(", ")
            )
        }
    };
    let cgroup = targets.cgroup.as_ref().map_or(String::new(), |c| {
        format!(", in cgroup {} and those that join it", c.dir.display())
    });
    eprintln!(
        "tracer: recording PID {} ({}{host}){others}{cgroup}, {threads} threads, {until}; Ctrl-C \
         stops early and still reports",
        target.proc_pid,
        crate::recording::printable(&target.comm),
    );
}

/// Once a second: the processes that joined the set (forked, or moved into a followed cgroup)
/// reach the sources that match processes themselves: NVML's per-process figures, and the
/// CUDA probes, for a member that initialized CUDA from a library not probed yet. Returns the
/// cgroup watch's notice, if any.
fn members_joined(
    probes: &mut SchedProbes,
    targets: &Targets,
    cgroup_watch: &mut Option<cgroups::CgroupWatch>,
    gpu_members: &Members,
) -> Result<Option<String>> {
    let notice = match cgroup_watch.as_mut() {
        Some(w) => w.poll(probes)?,
        None => None,
    };
    // The kernel's PIDs; this tool's /proc numbers them the same outside a PID namespace.
    let mut pids: Vec<u32> = targets.members.iter().map(|t| t.proc_pid).collect();
    if targets.follow || targets.cgroup.is_some() {
        let joined = probes.children()?.into_iter().map(|(pid, _)| pid);
        pids.extend(joined.filter_map(|p| targets.primary().proc_pid_of(p)));
    }
    gpu_members.add(pids.iter().copied());
    probes.poll_cuda(&pids)?;
    Ok(notice)
}

/// Builds the single-threaded runtime the recording loop runs on: one thread is enough to drain
/// the ring buffer, and it keeps the tracer's own footprint small.
pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}
