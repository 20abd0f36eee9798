//! One recording session: attach the sources to a target, stream their events (to a trace file
//! too, when asked) until the window ends (duration, Ctrl-C / SIGTERM, or the target's exit),
//! detach, and assemble the recording.

use std::{os::fd::OwnedFd, path::PathBuf, time::Duration};

use anyhow::{Context as _, Result};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tokio::{
    io::unix::AsyncFd,
    signal::unix::{SignalKind, signal},
};
mod assemble;
mod cgroups;

use crate::{
    recording::{
        Capability, CgroupRecording, EndReason, Recording, TracerCost,
        collect::Collector,
        counters::slot_name,
        records::{Record, encode, split},
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

/// Opens a pidfd, which becomes readable when the process exits (Linux 5.3+).
/// The target's pidfd (opened when it was resolved), which becomes readable when it exits.
fn exit_watch(target: &Target) -> Option<AsyncFd<OwnedFd>> {
    let fd = target.pidfd.as_ref()?.try_clone().ok()?;
    // SAFETY: the AsyncFd owns this duplicate, which stays open until the AsyncFd is dropped.
    unsafe { AsyncFd::register(fd) }.ok()
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

/// Records the processes of `targets`. `attached` runs once every probe is attached (`tracer
/// run` releases its child there).
pub async fn record(
    targets: &Targets,
    opts: &SessionOptions,
    attached: impl FnOnce() -> Result<()>,
) -> Result<Recording> {
    privileges::check()?;
    // The first process given names the recording; every source covers every member: the
    // CUDA and marker uprobes (on each distinct library file), NVML's processes, and the
    // throttling of each distinct cgroup.
    let target = targets.primary();
    // Open the output first: a path that cannot be written fails before anything is traced.
    let mut writer = opts
        .output
        .as_deref()
        .map(TraceWriter::create)
        .transpose()?;
    let cpus = aya::util::online_cpus().map_err(|(what, e)| anyhow::anyhow!("{what}: {e}"))?;
    let perf = PerfSet::open(opts.counters, &cpus);
    // The kernel side sends every state change only when something reads them: the kept
    // timeline or a trace file. Decided here, from the options that need them, so that no
    // caller can keep a timeline the probes do not feed.
    let timeline = opts.keep_timeline || opts.output.is_some();
    let mut probes = SchedProbes::load(
        &targets.tgids(),
        targets.follow,
        &opts.probes,
        &perf,
        timeline,
    )?;
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
    let throttle = ThrottleSet::new(
        &targets
            .members
            .iter()
            .map(|t| (t.proc_pid, t.pid))
            .collect::<Vec<_>>(),
    );
    let exit_fd = exit_watch(target);
    let mut interrupt = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    let mut terminate = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let host = host::host_meta(&cpus);

    // The CUDA probes first: attaching them takes a while with a large libcuda, and they
    // only account CUDA calls, which the window's edges do not cut.
    // /proc paths and uprobe PIDs are this tool's namespace's; the programs filter on the
    // kernel's TGID, set at load.
    let proc_pids: Vec<u32> = targets.members.iter().map(|t| t.proc_pid).collect();
    probes.attach_cuda(&proc_pids)?;
    probes.attach_gc(
        &targets
            .members
            .iter()
            .map(|t| (t.proc_pid, t.pid))
            .collect::<Vec<_>>(),
    );
    if let Some(m) = &opts.probes.markers {
        probes.attach_markers(&proc_pids, m)?;
    }
    // Pinned by its pidfd since it was resolved: if it is gone now, its PID may already stand
    // for another process, which the programs (filtering on the number) must not record. A
    // process given is then an error; a descendant that exited meanwhile (a shell's short
    // command) leaves the set.
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
    probes.remove_targets(&gone)?;
    let mut cgroup_watch = match &targets.cgroup {
        Some(c) => Some(cgroups::CgroupWatch::start(c, &mut probes)?),
        None => None,
    };
    let targets = &targets.without(&gone);
    let start = monotonic_ns();
    let cpu_at_start = process::own_usage().0;
    probes.attach(|| {
        targets
            .threads()
            .into_values()
            .map(|t| (t.tid, t.pid))
            .collect()
    })?;
    // The threads' own counts, as near the window's start as can be: the self-check
    // compares the recording with what they add up to over the window.
    let (counts_start, left_out) = targets.thread_counts(SELF_CHECK_THREADS);
    let steal_start = process::cpu_steal();
    let children_start = targets.children();
    // Listed after attaching: a thread created since is seen by the probes, so none is missed.
    let initial = targets.threads();
    let bin_ns = opts.bin.as_nanos() as u64;
    if let Some(w) = writer.as_mut() {
        w.meta(&TraceMeta {
            tracer_version: env!("CARGO_PKG_VERSION").into(),
            target: assemble::target_meta(target),
            host: host.clone(),
            probe_mode: probes.mode(),
            start_ns: start,
            bin_ns,
            counter_mask: probes.counter_mask,
            threads: initial.clone(),
            pid_namespace: target
                .pidns
                .as_ref()
                .map(|ns| crate::recording::PidNamespaceIds {
                    inode: ns.inode,
                    ids: ns.table(),
                }),
        });
    }
    if opts.notices {
        notices(targets, opts, &probes, &perf, &sampler, initial.len());
        if let Some(w) = &writer {
            eprintln!("tracer: writing {}", w.temp().display());
        }
    }
    attached()?;

    let bar = progress_bar(opts, target.pid);
    let deadline = opts.duration.map(|d| tokio::time::Instant::now() + d);
    let mut tick = tokio::time::interval(TICK);
    let mut col = Collector::new(start, bin_ns, opts.keep_timeline);
    let mut finished = Reaped::default();
    let mut throttling: Vec<Vec<_>> = vec![Vec::new(); throttle.0.len()];
    let mut target_exited_ns = None;
    let mut ticks = 0u64;
    let end_reason = loop {
        let sleep = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        let exited = async {
            match &exit_fd {
                Some(fd) => drop(fd.readable().await),
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            guard = probes.events().readable_mut() => {
                let mut guard = guard.context("waiting on the ring buffer")?;
                guard.clear_ready();
                drop(guard);
                drain(&mut probes, &mut col, &mut writer);
            }
            _ = tick.tick() => {
                drain(&mut probes, &mut col, &mut writer);
                finished.extend(probes.reap_dead()?);
                ticks += 1;
                if ticks.is_multiple_of(10) {
                    members_joined(&mut probes, targets, &mut cgroup_watch, &gpu_members)?;
                }
                let now = monotonic_ns();
                for (i, (t, _)) in throttle.0.iter().enumerate() {
                    let Some(s) = t.sample(now) else { continue };
                    // The first member's cgroup is streamed for recovery.
                    if let (0, Some(w)) = (i, writer.as_mut()) {
                        w.cgroup(s.clone());
                    }
                    throttling[i].push(s);
                }
                if let (Ok(g), Some(w)) = (&sampler, writer.as_mut()) {
                    let polls: Vec<_> = g.polls.try_iter().collect();
                    w.gpu_polls(&polls);
                }
                if let Some(w) = writer.as_mut() {
                    w.maybe_flush();
                }
                progress(&bar, opts, col.records, &probes);
            }
            _ = sleep => break EndReason::Duration,
            _ = interrupt.recv() => break EndReason::Interrupted,
            _ = terminate.recv() => break EndReason::Interrupted,
            _ = exited => {
                target_exited_ns = Some(monotonic_ns());
                break EndReason::TargetExited;
            }
        }
    };
    bar.finish_and_clear();
    // The window is closed: from here a signal ends the tool at once (signals.rs).
    crate::signals::exit_on_interrupt(&match &writer {
        Some(w) => format!(
            "the partial trace is in {} (`tracer report` reads it)",
            w.temp().display()
        ),
        None => "no summary was printed".into(),
    });

    probes.detach_sched();
    let end = monotonic_ns();
    let (counts_end, _) = targets.thread_counts(SELF_CHECK_THREADS);
    let steal_end = process::cpu_steal();
    let children_end = targets.children();
    // The CUDA accounting as of the window's end; the uprobes come off after (slowly).
    let cuda_at_end = probes.cuda_threads()?;
    probes.detach_uprobes();
    // Nothing more arrives once detached: take all that is left in the ring buffer, then the
    // records each CPU had not sent yet. A program that started before the detach may still
    // be running on another CPU (for microseconds; longer only if the hypervisor stops that
    // vCPU): give it time to finish its batch.
    tokio::time::sleep(DETACH_GRACE).await;
    while drain(&mut probes, &mut col, &mut writer) > 0 {}
    for batch in probes.unsent_batches()? {
        for r in split(&batch) {
            take(r, &mut col, &mut writer);
        }
    }
    for (i, (t, _)) in throttle.0.iter().enumerate() {
        throttling[i].extend(t.sample(end));
    }
    drop(perf);
    let (gpu, gpu_capability) = match sampler {
        Ok(s) => {
            let cap = s.capability.clone();
            (Some(s.finish()), cap)
        }
        Err(cap) => (None, cap),
    };
    let ended = assemble::Ended {
        start,
        end,
        end_reason,
        target_exited_ns,
        initial,
        cuda_at_end,
        finished,
        gpu,
        gpu_capability,
        cgroups: throttle
            .0
            .into_iter()
            .zip(throttling)
            .map(|((t, pids), samples)| CgroupRecording {
                cgroup: t.cgroup,
                samples,
                pids,
            })
            .collect(),
        host,
        proc_counts: crate::recording::ProcWindow {
            start: counts_start,
            end: counts_end,
            left_out,
            steal_start,
            steal_end,
        },
        children: (children_start, children_end),
    };
    let mut rec = assemble::recording(targets, &mut probes, col, ended)?;
    let (cpu, rss) = process::own_usage();
    rec.tracer_cost = Some(TracerCost {
        cpu_ns: cpu - cpu_at_start,
        cpu_share: (cpu - cpu_at_start) as f64 / (end - start).max(1) as f64,
        peak_rss_bytes: rss,
    });
    if let Some(w) = writer {
        // A signal from here until the message below says the file is complete waits (the
        // file renamed into place while the message still named the temporary one told a
        // user who interrupted then that the complete trace was partial).
        let _held = crate::signals::Deferred::new();
        // A file that cannot be finished (full disk) must not cost the recording: it is still
        // reported, and the command fails after.
        match w.finish(&rec) {
            Ok(path) => {
                crate::signals::exit_on_interrupt(&format!(
                    "the trace file {} is complete (`tracer report` reads it)",
                    path.display()
                ));
                if opts.notices {
                    eprintln!("tracer: trace written to {}", path.display());
                }
            }
            Err(e) => rec.output_error = Some(format!("{e:#}")),
        }
    }
    Ok(rec)
}

/// Takes every record in the ring buffer to the collector and, when writing a trace, to the
/// file.
fn drain(probes: &mut SchedProbes, col: &mut Collector, writer: &mut Option<TraceWriter>) -> usize {
    probes.drain(|r| take(r, col, writer))
}

fn take(r: Record, col: &mut Collector, writer: &mut Option<TraceWriter>) {
    if let Some(w) = writer.as_mut() {
        w.record(encode(&r));
    }
    col.on_record(r);
}

fn progress(bar: &ProgressBar, opts: &SessionOptions, records: u64, probes: &SchedProbes) {
    if let Some(d) = opts.duration {
        bar.set_position(bar.elapsed().as_millis().min(d.as_millis()) as u64);
    } else {
        bar.tick();
    }
    let dropped = probes.losses().map(|l| l.ringbuf_dropped).unwrap_or(0);
    bar.set_message(format!("{records} events, {dropped} dropped"));
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
    for (slot, why) in &perf.software_errors {
        eprintln!(
            "tracer: software counter {} unavailable: {why}",
            slot_name(*slot)
        );
    }
    let target = targets.primary();
    let until = match opts.duration {
        Some(d) => format!("for {}", crate::units::given(d)),
        None => "until it exits".to_string(),
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
/// CUDA probes, for a member that initialized CUDA from a library not probed yet.
fn members_joined(
    probes: &mut SchedProbes,
    targets: &Targets,
    cgroup_watch: &mut Option<cgroups::CgroupWatch>,
    gpu_members: &Members,
) -> Result<()> {
    if let Some(w) = cgroup_watch.as_mut() {
        w.poll(probes)?;
    }
    // The kernel's PIDs; this tool's /proc numbers them the same outside a PID namespace.
    let mut pids: Vec<u32> = targets.members.iter().map(|t| t.proc_pid).collect();
    if targets.follow || targets.cgroup.is_some() {
        let joined = probes.children()?.into_iter().map(|(pid, _)| pid);
        pids.extend(joined.filter_map(|p| targets.primary().proc_pid_of(p)));
    }
    gpu_members.add(pids.iter().copied());
    probes.poll_cuda(&pids)?;
    Ok(())
}

/// Builds the single-threaded runtime the recording loop runs on: one thread is enough to drain
/// the ring buffer, and it keeps the tracer's own footprint small.
pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}
