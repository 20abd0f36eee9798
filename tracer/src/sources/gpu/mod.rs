//! NVML sampling on its own thread at a bounded rate: the GPUs the target uses, their
//! utilization (with the driver's buffered samples), clocks, power, temperature, memory, PCIe,
//! clock-event (throttle) reasons, the target's own share, and GPM metrics on Hopper and later.
//! Every poll is bracketed by monotonic clock reads; driver timestamps are realtime and go
//! through a measured realtime-to-monotonic offset.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    thread::JoinHandle,
    time::Duration,
};

use nvml_wrapper::Nvml;

mod reads;

use super::{
    clock::{monotonic_ns, realtime_ns, thread_cpu_ns},
    host,
};
use crate::recording::Capability;
use crate::recording::gpu::{
    ClockAlignment, GpuDevice, GpuPoll, GpuRecording, UtilKind, UtilSample, intervals,
};
use reads::{Costs, DeviceState, Extras, poll};

pub struct GpuOptions {
    /// `index` or `uuid` of the one GPU to sample; default: those the target uses, else all.
    pub select: Option<String>,
    pub interval: Duration,
}

/// Measures monotonic - realtime: the tightest of several (realtime, monotonic, realtime)
/// brackets gives the offset and its error bound.
pub fn measure_clock_alignment() -> ClockAlignment {
    let mut best = ClockAlignment {
        offset_ns: 0,
        error_ns: u64::MAX,
    };
    for _ in 0..16 {
        let r1 = realtime_ns();
        let m = monotonic_ns();
        let r2 = realtime_ns();
        let half = r2.saturating_sub(r1) / 2;
        if half < best.error_ns {
            best = ClockAlignment {
                offset_ns: m as i64 - (r1 + half) as i64,
                error_ns: half,
            };
        }
    }
    best
}

/// The target set's PIDs as the sampler matches NVML's processes against them: shared with
/// the session, which adds the processes that join during the window.
#[derive(Clone, Default)]
pub struct Members(Arc<std::sync::Mutex<BTreeSet<u32>>>);

impl Members {
    pub fn new(pids: impl IntoIterator<Item = u32>) -> Self {
        Self(Arc::new(std::sync::Mutex::new(pids.into_iter().collect())))
    }

    pub fn add(&self, pids: impl IntoIterator<Item = u32>) {
        self.0.lock().expect("members lock").extend(pids);
    }

    fn get(&self) -> BTreeSet<u32> {
        self.0.lock().expect("members lock").clone()
    }
}

/// A running sampler. Dropping it without `finish` stops it too.
pub struct GpuSampler {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<GpuRecording>>,
    pub capability: Capability,
    /// Each poll as it is made, for the trace file.
    pub polls: mpsc::Receiver<GpuPoll>,
    /// Asks the thread for what it sampled since the last cut (`cut`).
    cuts: mpsc::Sender<mpsc::Sender<GpuRecording>>,
}

impl GpuSampler {
    /// Starts sampling, or says why it cannot (no NVML, no GPU, no such GPU). `members`: the
    /// target set's PIDs, which the session adds to as members join.
    pub fn start(members: Members, opts: GpuOptions) -> Result<Self, Capability> {
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = mpsc::channel();
        let (poll_tx, poll_rx) = mpsc::channel();
        let (cut_tx, cut_rx) = mpsc::channel();
        let flag = Arc::clone(&stop);
        let control = Control {
            stop: flag,
            cuts: cut_rx,
        };
        let handle = std::thread::Builder::new()
            .name("tracer-nvml".into())
            .spawn(move || sampler_thread(members, opts, control, ready_tx, poll_tx))
            .map_err(|e| Capability {
                available: false,
                reason: format!("could not start the NVML sampler thread: {e}"),
            })?;
        match ready_rx.recv() {
            Ok(Ok(reason)) => Ok(Self {
                stop,
                handle: Some(handle),
                capability: Capability {
                    available: true,
                    reason,
                },
                polls: poll_rx,
                cuts: cut_tx,
            }),
            other => {
                let reason = match other {
                    Ok(Err(reason)) => reason,
                    _ => "the NVML sampler thread failed".to_string(),
                };
                let _ = handle.join();
                Err(Capability {
                    available: false,
                    reason,
                })
            }
        }
    }

    /// What was sampled since the last cut (or the start), ending with a poll made now; the
    /// sampling goes on. One window of `tracer watch`: the thread keeps nothing older.
    pub fn cut(&self) -> GpuRecording {
        let (tx, rx) = mpsc::channel();
        if self.cuts.send(tx).is_err() {
            return GpuRecording::default();
        }
        rx.recv().unwrap_or_default()
    }

    /// Stops sampling and returns what was recorded.
    pub fn finish(mut self) -> GpuRecording {
        self.stop.store(true, Ordering::Relaxed);
        self.handle
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for GpuSampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// The devices to sample and why.
fn select(
    nvml: &Nvml,
    members: &BTreeSet<u32>,
    want: Option<&str>,
) -> Result<(Vec<GpuDevice>, String), String> {
    let count = nvml
        .device_count()
        .map_err(|e| format!("NVML device count: {e}"))?;
    let mut all = Vec::new();
    for index in 0..count {
        let Ok(d) = nvml.device_by_index(index) else {
            continue;
        };
        let contexts: Vec<u32> = d
            .running_compute_processes()
            .map(|ps| ps.iter().map(|p| p.pid).collect())
            .unwrap_or_default();
        all.push(GpuDevice {
            index,
            name: d.name().unwrap_or_default(),
            uuid: d.uuid().unwrap_or_default(),
            gpm_supported: d.gpm_support().unwrap_or(false),
            used_by_target: contexts.iter().any(|p| members.contains(p)),
            contexts,
        });
    }
    if all.is_empty() {
        return Err("NVML works but reports no GPU".into());
    }
    if let Some(w) = want {
        let found: Vec<GpuDevice> = all
            .into_iter()
            .filter(|g| g.index.to_string() == w || g.uuid == w)
            .collect();
        if found.is_empty() {
            return Err(format!(
                "no GPU with index or UUID {w:?} (see `tracer doctor`)"
            ));
        }
        return Ok((found, format!("--gpu {w}")));
    }
    let used: Vec<GpuDevice> = all.iter().filter(|g| g.used_by_target).cloned().collect();
    if used.is_empty() {
        Ok((
            all,
            format!(
                "{} holds no CUDA context yet: sampling every GPU",
                who(members)
            ),
        ))
    } else {
        Ok((used, format!("the GPUs {} has a context on", who(members))))
    }
}

/// "PID 12", "the target set (3 processes)".
fn who(members: &BTreeSet<u32>) -> String {
    match members.len() {
        1 => format!("PID {}", members.first().expect("one")),
        n => format!("the target set ({n} processes)"),
    }
}

/// The costlier calls, measured on an H200 (driver 580): reading the driver's sample buffers
/// 4 ms, the per-process utilization 2 ms, GPM metrics 1.7 ms, the eight violation counters
/// 7.2 ms, against about 0.01 ms for a clock or power reading. Polled every 100 ms the
/// violation counters alone cost 7.2 % of a core; once a second, all of them 2.4 %. The
/// buffers keep their samples, GPM averages over any interval and the violation counters are
/// cumulative, so every 2 s (and at each cut: every window has its own) loses nothing.
const SLOW_EVERY: Duration = Duration::from_secs(2);
/// PCIe throughput: each call measures for 20 ms (wall time, not CPU).
const PCIE_EVERY: Duration = Duration::from_secs(5);

/// How the session steers the sampler thread.
struct Control {
    stop: Arc<AtomicBool>,
    cuts: mpsc::Receiver<mpsc::Sender<GpuRecording>>,
}

/// What stays the same from one cut to the next.
struct Fixed {
    devices: Vec<GpuDevice>,
    selection: String,
    interval_ns: u64,
    clock: ClockAlignment,
    driver_version: Option<String>,
}

/// What was sampled since the last cut, with one last poll for the samples the driver
/// buffered since; the buffers are left empty.
fn take_recording(
    nvml: &Nvml,
    states: &mut [DeviceState],
    polls: &mut Vec<GpuPoll>,
    members: &BTreeSet<u32>,
    costs: &mut Costs,
    fixed: &Fixed,
) -> GpuRecording {
    let last = Extras {
        slow: true,
        pcie: false,
    };
    for st in states.iter_mut() {
        polls.push(poll(nvml, st, members, last, costs));
    }
    let mut util_samples: Vec<UtilSample> = Vec::new();
    for st in states.iter_mut() {
        let idx = st.info.index;
        for (kind, samples) in [
            (UtilKind::Gpu, std::mem::take(&mut st.util)),
            (UtilKind::Memory, std::mem::take(&mut st.mem)),
        ] {
            util_samples.extend(intervals(idx, kind, 0, samples, &fixed.clock));
        }
        for (kind, per) in [
            (UtilKind::ProcessSm, std::mem::take(&mut st.proc_sm)),
            (UtilKind::ProcessMemory, std::mem::take(&mut st.proc_mem)),
        ] {
            for (pid, samples) in per {
                util_samples.extend(intervals(idx, kind, pid, samples, &fixed.clock));
            }
        }
    }
    let taken = std::mem::take(polls);
    // The next stretch starts from this one's last poll of each device, so that what a
    // running counter (violation time) did between the two polls is in one of them.
    for st in states.iter() {
        if let Some(p) = taken.iter().rev().find(|p| p.device == st.info.index) {
            polls.push(p.clone());
        }
    }
    GpuRecording {
        devices: fixed.devices.clone(),
        selection: fixed.selection.clone(),
        interval_ns: fixed.interval_ns,
        clock: fixed.clock,
        polls: taken,
        util_samples,
        sampler_cpu_ns: 0,
        sampler_calls: std::mem::take(&mut costs.0).into_values().collect(),
        gpm: fixed.devices.iter().any(|g| g.gpm_supported),
        driver_version: fixed.driver_version.clone(),
    }
}

/// Whether `every` has passed since `last` (then `last` is now).
fn due(last: &mut u64, every: Duration, now: u64) -> bool {
    let yes = now.saturating_sub(*last) >= every.as_nanos() as u64;
    if yes {
        *last = now;
    }
    yes
}

/// Each selected GPU's handle and what its polls carry from one to the next, the driver's
/// history from before now skipped.
fn device_states<'n>(nvml: &'n Nvml, devices: &[GpuDevice]) -> Vec<DeviceState<'n>> {
    let start_us = realtime_ns() / 1000;
    devices
        .iter()
        .filter_map(|g| {
            let device = nvml.device_by_index(g.index).ok()?;
            let gpm_prev = if g.gpm_supported {
                device.gpm_sample().ok()
            } else {
                None
            };
            Some(DeviceState {
                info: g.clone(),
                device,
                last_util_us: start_us,
                last_mem_us: start_us,
                last_proc_us: start_us,
                util: vec![],
                mem: vec![],
                proc_sm: BTreeMap::new(),
                proc_mem: BTreeMap::new(),
                gpm_prev,
            })
        })
        .collect()
}

fn sampler_thread(
    shared: Members,
    opts: GpuOptions,
    control: Control,
    ready: mpsc::Sender<Result<String, String>>,
    stream: mpsc::Sender<GpuPoll>,
) -> GpuRecording {
    let cpu0 = thread_cpu_ns();
    let nvml = match host::nvml() {
        Ok(n) => n,
        Err(e) => {
            let _ = ready.send(Err(host::nvml_error_reason(&e)));
            return GpuRecording::default();
        }
    };
    let members = shared.get();
    let (devices, selection) = match select(&nvml, &members, opts.select.as_deref()) {
        Ok(s) => s,
        Err(why) => {
            let _ = ready.send(Err(why));
            return GpuRecording::default();
        }
    };
    let clock = measure_clock_alignment();
    let mut states = device_states(&nvml, &devices);
    let names: Vec<String> = devices
        .iter()
        .map(|g| format!("{} ({})", g.index, g.name))
        .collect();
    let _ = ready.send(Ok(format!(
        "NVML, GPU {}: {selection}, every {} ms",
        names.join(", "),
        opts.interval.as_millis()
    )));
    let mut polls = Vec::new();
    let mut costs = Costs::default();
    let (mut last_slow, mut last_pcie) = (0u64, 0u64);
    let fixed = Fixed {
        devices: devices.clone(),
        selection,
        interval_ns: opts.interval.as_nanos() as u64,
        clock,
        driver_version: nvml.sys_driver_version().ok(),
    };
    // The thread's CPU time as of the last cut: each cut reports its own.
    let mut cpu_mark = cpu0;
    let mut cut = |states: &mut [DeviceState], polls: &mut Vec<GpuPoll>, costs: &mut Costs| {
        let mut r = take_recording(&nvml, states, polls, &shared.get(), costs, &fixed);
        let now = thread_cpu_ns();
        r.sampler_cpu_ns = now - cpu_mark;
        cpu_mark = now;
        r
    };
    while !control.stop.load(Ordering::Relaxed) {
        let now = monotonic_ns();
        let extras = Extras {
            slow: due(&mut last_slow, SLOW_EVERY, now),
            pcie: due(&mut last_pcie, PCIE_EVERY, now),
        };
        let members = shared.get();
        for st in states.iter_mut() {
            let p = poll(&nvml, st, &members, extras, &mut costs);
            // The session drains the stream every tick, into the trace file if one is written.
            let _ = stream.send(p.clone());
            polls.push(p);
        }
        // The interval, or a cut asked for meanwhile (answered at once).
        match control.cuts.recv_timeout(opts.interval) {
            Ok(reply) => {
                let _ = reply.send(cut(&mut states, &mut polls, &mut costs));
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            // The sampler was dropped: stop.
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    let r = cut(&mut states, &mut polls, &mut costs);
    drop(states);
    r
}
