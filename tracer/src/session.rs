//! One recording session: attach the sources to a target, stream their events until the window
//! ends (duration, Ctrl-C / SIGTERM, or the target's exit), detach, and assemble the recording.

use std::{
    collections::BTreeMap,
    os::fd::{FromRawFd as _, OwnedFd},
    time::Duration,
};

use anyhow::{Context as _, Result};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tokio::{
    io::unix::AsyncFd,
    signal::unix::{SignalKind, signal},
};
use tracer_common::EventKind;

use crate::{
    recording::{
        CudaSpan, CudaTotals, EndReason, MigrationRoute, PreemptorRecord, Recording, TargetMeta,
        ThreadInputs, WaitSamples, assemble_threads, comm_string,
        counters::{CounterBins, CounterTotals},
        gpu::GpuRecording,
    },
    sources::{
        ebpf::{ProbeOptions, Reaped, Record, SchedProbes, layout},
        gpu::{GpuOptions, GpuSampler},
        host::{self, Capabilities, GpuCapability},
        perf::{Capability, CounterChoice, PerfSet, slot_name},
        privileges,
        process::{Target, comm_of, monotonic_ns},
    },
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
}

pub struct GpuSettings {
    /// `index` or `uuid` of the one GPU to sample.
    pub select: Option<String>,
    pub interval: Duration,
}

/// How often the ring buffer is drained, the progress line refreshed and dead threads moved out
/// of the kernel map. The kernel wakes the reader earlier only when the ring fills up.
const TICK: Duration = Duration::from_millis(100);

/// Opens a pidfd, which becomes readable when the process exits (Linux 5.3+).
fn pidfd(pid: u32) -> Option<AsyncFd<OwnedFd>> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_int, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: the descriptor was just created and is owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    // SAFETY: the AsyncFd owns the OwnedFd, which stays open until the AsyncFd is dropped.
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

/// What the session accumulates from the ring buffer and the reaped threads while recording.
struct Collector {
    samples: BTreeMap<u32, WaitSamples>,
    bins: CounterBins,
    finished: Reaped,
    cuda_syncs: Vec<CudaSpan>,
    cuda_launches: BTreeMap<u32, BTreeMap<u64, u64>>,
    records: u64,
}

impl Collector {
    fn on_record(&mut self, rec: Record) {
        self.records += 1;
        match rec {
            Record::Event(ev) => match EventKind::try_from(ev.kind) {
                Ok(EventKind::SwitchIn) if ev.value > 0 => {
                    self.samples.entry(ev.tid).or_default().record(ev.value);
                }
                Ok(EventKind::CudaSync) => self.cuda_syncs.push(CudaSpan {
                    tid: ev.tid,
                    start_ns: ev.ts_ns.saturating_sub(ev.value),
                    end_ns: ev.ts_ns,
                    function: ev.aux,
                }),
                Ok(EventKind::CudaLaunch) => {
                    let bin = ev.ts_ns.saturating_sub(self.bins.start_ns) / self.bins.bin_ns;
                    *self
                        .cuda_launches
                        .entry(ev.tid)
                        .or_default()
                        .entry(bin)
                        .or_default() += 1;
                }
                _ => {}
            },
            Record::Counters(slice) => self.bins.add(&slice),
        }
    }

    fn drain(&mut self, probes: &mut SchedProbes) {
        probes.drain(|r| self.on_record(r));
    }
}

/// Records `target`. `attached` runs once every probe is attached (`tracer run` releases its
/// child there).
pub async fn record(
    target: &Target,
    opts: &SessionOptions,
    attached: impl FnOnce() -> Result<()>,
) -> Result<Recording> {
    privileges::check()?;
    let cpus = aya::util::online_cpus().map_err(|(what, e)| anyhow::anyhow!("{what}: {e}"))?;
    let perf = PerfSet::open(opts.counters, &cpus);
    let mut probes = SchedProbes::load(target.pid, &opts.probes, &perf)?;
    let sampler = match &opts.gpu {
        Some(g) => GpuSampler::start(
            target.pid,
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
    let exit_fd = pidfd(target.pid);
    let mut interrupt = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    let mut terminate = signal(SignalKind::terminate()).context("SIGTERM handler")?;

    // The CUDA probes first: attaching them takes a while with a large libcuda, and they
    // only account CUDA calls, which the window's edges do not cut.
    probes.attach_cuda(target.pid)?;
    let start = monotonic_ns();
    probes.attach(|| target.threads().into_keys().collect())?;
    // Listed after attaching: a thread created since is seen by the probes, so none is missed.
    let initial = target.threads();
    if opts.notices {
        notices(target, opts, &probes, &perf, &sampler, initial.len());
    }
    attached()?;

    let bar = progress_bar(opts, target.pid);
    let deadline = opts.duration.map(|d| tokio::time::Instant::now() + d);
    let mut tick = tokio::time::interval(TICK);
    let mut col = Collector {
        samples: BTreeMap::new(),
        bins: CounterBins::new(start, opts.bin.as_nanos() as u64),
        finished: Reaped::default(),
        cuda_syncs: Vec::new(),
        cuda_launches: BTreeMap::new(),
        records: 0,
    };
    let mut target_exited_ns = None;
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
                col.drain(&mut probes);
            }
            _ = tick.tick() => {
                col.drain(&mut probes);
                col.finished.extend(probes.reap_dead()?);
                if let Some(d) = opts.duration {
                    bar.set_position(bar.elapsed().as_millis().min(d.as_millis()) as u64);
                } else {
                    bar.tick();
                }
                let dropped = probes.losses().map(|l| l.ringbuf_dropped).unwrap_or(0);
                bar.set_message(format!("{} events, {dropped} dropped", col.records));
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

    probes.detach_sched();
    let end = monotonic_ns();
    // The CUDA accounting as of the window's end; the uprobes come off after (slowly).
    let cuda_at_end = probes.cuda_threads()?;
    probes.detach_cuda();
    col.drain(&mut probes);
    col.cuda_syncs.retain(|s| s.end_ns <= end);
    drop(perf);
    let (gpu, gpu_capability) = match sampler {
        Ok(s) => {
            let cap = s.capability.clone();
            (Some(s.finish()), cap)
        }
        Err(cap) => (None, cap),
    };
    let ended = Ended {
        start,
        end,
        end_reason,
        target_exited_ns,
        initial,
        cuda_at_end,
    };
    collect(target, opts, &mut probes, col, ended, gpu, gpu_capability)
}

/// How the window went.
struct Ended {
    start: u64,
    end: u64,
    end_reason: EndReason,
    target_exited_ns: Option<u64>,
    initial: BTreeMap<u32, crate::sources::process::ThreadInfo>,
    cuda_at_end: Vec<(u32, tracer_common::CudaThread)>,
}

/// Reads what the kernel side kept and assembles the recording.
#[allow(clippy::too_many_arguments)]
fn collect(
    target: &Target,
    opts: &SessionOptions,
    probes: &mut SchedProbes,
    mut col: Collector,
    w: Ended,
    gpu: Option<GpuRecording>,
    gpu_capability: Capability,
) -> Result<Recording> {
    let losses = probes.losses()?;
    let mut kernel = probes.threads()?;
    kernel.append(&mut col.finished.stats);
    let counters: BTreeMap<u32, CounterTotals> = probes
        .thread_counters()?
        .iter()
        .chain(col.finished.counters.iter())
        .map(|(tid, c)| (*tid, CounterTotals::from(c)))
        .collect();
    let cuda: BTreeMap<u32, CudaTotals> = w
        .cuda_at_end
        .iter()
        .chain(col.finished.cuda.iter())
        .map(|(tid, c)| (*tid, CudaTotals::from(c)))
        .collect();
    let preemptors = probes
        .preemptors()?
        .into_iter()
        .map(|p| PreemptorRecord {
            pid: p.pid,
            tgid: p.tgid,
            comm: comm_string(&p.comm),
            process_comm: comm_of(p.tgid),
            wait_ns: p.wait_ns,
            slices: p.slices,
        })
        .collect();
    let migration_routes = probes
        .migrations()?
        .into_iter()
        .map(|(k, count)| MigrationRoute {
            tid: k.tid,
            from_cpu: k.from_cpu,
            to_cpu: k.to_cpu,
            count,
        })
        .collect();
    let inputs = ThreadInputs {
        kernel,
        initial: w.initial,
        final_names: target.threads(),
        samples: std::mem::take(&mut col.samples),
        counters,
        cuda,
    };
    let threads = assemble_threads(inputs, w.start, w.end);
    let btf_path = opts
        .probes
        .btf_path
        .clone()
        .unwrap_or_else(|| layout::VMLINUX_BTF.into());
    Ok(Recording {
        tracer_version: env!("CARGO_PKG_VERSION"),
        target: TargetMeta {
            pid: target.pid,
            comm: target.comm.clone(),
            cmdline: target.cmdline.clone(),
        },
        probe_mode: probes.mode(),
        probe_fallback_reason: probes.fallback_reason.clone(),
        start_ns: w.start,
        end_ns: w.end,
        end_reason: w.end_reason,
        target_exited_ns: w.target_exited_ns,
        threads,
        preemptors,
        migration_routes,
        losses,
        events_received: col.records,
        capabilities: Capabilities {
            pmu: probes.pmu.clone(),
            btf: host::btf(&btf_path),
            tracefs: host::tracefs(),
            gpu: GpuCapability::from_parts(
                gpu_capability,
                gpm_capability(gpu.as_ref()),
                probes.cuda.clone(),
            ),
        },
        counter_mask: probes.counter_mask,
        counter_bins: col.bins,
        gpu,
        cuda_syncs: col.cuda_syncs,
        cuda_launch_bins: col.cuda_launches,
    })
}

fn gpm_capability(gpu: Option<&GpuRecording>) -> Capability {
    match gpu {
        None => Capability {
            available: false,
            reason: "no GPU sampled".into(),
        },
        Some(g) if g.gpm => Capability {
            available: true,
            reason: "GPM metrics sampled".into(),
        },
        Some(_) => Capability {
            available: false,
            reason: "GPM unsupported on the sampled GPUs (it needs Hopper or later): SM \
                     activity, occupancy, tensor and DRAM metrics are not assessed"
                .into(),
        },
    }
}

fn notices(
    target: &Target,
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
    let until = match opts.duration {
        Some(d) => format!("for {}", humantime(d)),
        None => "until it exits".to_string(),
    };
    eprintln!(
        "tracer: recording PID {} ({}, {threads} threads) {until}; Ctrl-C stops early and still reports",
        target.pid, target.comm,
    );
}

/// "10s", "1.5s", "250ms".
pub fn humantime(d: Duration) -> String {
    let ms = d.as_millis();
    if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else if ms >= 1000 {
        format!("{:.1}s", d.as_secs_f64())
    } else {
        format!("{ms}ms")
    }
}
