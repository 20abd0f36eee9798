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
use tracer_common::{EventKind, ThreadStats};

use crate::{
    recording::{
        EndReason, MigrationRoute, PreemptorRecord, Recording, TargetMeta, WaitSamples,
        assemble_threads, comm_string,
    },
    sources::{
        ebpf::{ProbeOptions, SchedProbes},
        privileges,
        process::{Target, comm_of, monotonic_ns},
    },
};

pub struct SessionOptions {
    /// None: until the target exits or the user interrupts.
    pub duration: Option<Duration>,
    pub probes: ProbeOptions,
    /// Draw a progress line on stderr (only when it is a terminal).
    pub progress: bool,
    /// Print the "recording ..." notice on stderr.
    pub notices: bool,
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

/// Records `target`. `attached` runs once every probe is attached (`tracer run` releases its
/// child there).
pub async fn record(
    target: &Target,
    opts: &SessionOptions,
    attached: impl FnOnce() -> Result<()>,
) -> Result<Recording> {
    privileges::check()?;
    let mut probes = SchedProbes::load(target.pid, &opts.probes)?;
    let exit_fd = pidfd(target.pid);
    let mut interrupt = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    let mut terminate = signal(SignalKind::terminate()).context("SIGTERM handler")?;

    let start = monotonic_ns();
    probes.attach(|| target.threads().into_keys().collect())?;
    // Listed after attaching: a thread created since is seen by the probes, so none is missed.
    let initial = target.threads();
    if opts.notices {
        if let Some(reason) = &probes.fallback_reason {
            eprintln!("tracer: using classic tracepoints: {reason}");
        }
        let until = match opts.duration {
            Some(d) => format!("for {}", humantime(d)),
            None => "until it exits".to_string(),
        };
        eprintln!(
            "tracer: recording PID {} ({}, {} threads) {until}; Ctrl-C stops early and still reports",
            target.pid,
            target.comm,
            initial.len()
        );
    }
    attached()?;

    let bar = progress_bar(opts, target.pid);
    let deadline = opts.duration.map(|d| tokio::time::Instant::now() + d);
    let mut tick = tokio::time::interval(TICK);
    let mut samples: BTreeMap<u32, WaitSamples> = BTreeMap::new();
    let mut finished: Vec<ThreadStats> = Vec::new();
    let mut events_received = 0u64;
    let mut target_exited_ns = None;

    let mut on_event = |ev: tracer_common::Event| {
        if ev.kind == EventKind::SwitchIn as u32 && ev.value > 0 {
            samples.entry(ev.tid).or_default().record(ev.value);
        }
    };
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
                events_received += probes.drain(&mut on_event) as u64;
            }
            _ = tick.tick() => {
                events_received += probes.drain(&mut on_event) as u64;
                finished.extend(probes.reap_dead()?);
                if let Some(d) = opts.duration {
                    bar.set_position(bar.elapsed().as_millis().min(d.as_millis()) as u64);
                } else {
                    bar.tick();
                }
                let dropped = probes.losses().map(|l| l.ringbuf_dropped).unwrap_or(0);
                bar.set_message(format!("{events_received} events, {dropped} dropped"));
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

    probes.detach();
    let end = monotonic_ns();
    events_received += probes.drain(&mut on_event) as u64;
    let losses = probes.losses()?;
    let mut kernel = probes.threads()?;
    kernel.extend(finished);
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
    let final_names = target.threads();
    let threads = assemble_threads(kernel, &initial, &final_names, samples, start, end);
    Ok(Recording {
        tracer_version: env!("CARGO_PKG_VERSION"),
        target: TargetMeta {
            pid: target.pid,
            comm: target.comm.clone(),
            cmdline: target.cmdline.clone(),
        },
        probe_mode: probes.mode(),
        probe_fallback_reason: probes.fallback_reason.clone(),
        start_ns: start,
        end_ns: end,
        end_reason,
        target_exited_ns,
        threads,
        preemptors,
        migration_routes,
        losses,
        events_received,
    })
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
