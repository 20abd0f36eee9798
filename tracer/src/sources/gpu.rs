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

use nvml_wrapper::{
    Device, Nvml,
    enum_wrappers::device::{Clock, ClockId, PcieUtilCounter, Sampling, TemperatureSensor},
    enums::device::{SampleValue, UsedGpuMemory},
    enums::gpm::GpmMetricId,
    gpm::{GpmSample, gpm_metrics_get},
};

use super::{
    clock::{monotonic_ns, realtime_ns, thread_cpu_ns},
    host,
};
use crate::recording::Capability;
use crate::recording::gpu::{
    CallCost, ClockAlignment, GpmValues, GpuDevice, GpuPoll, GpuRecording, UtilKind, UtilSample,
    intervals,
};

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

/// Accumulates the CPU and wall time of each kind of NVML call.
#[derive(Default)]
struct Costs(std::collections::BTreeMap<&'static str, CallCost>);

impl Costs {
    fn time<T>(&mut self, call: &'static str, f: impl FnOnce() -> T) -> T {
        let (c0, w0) = (thread_cpu_ns(), monotonic_ns());
        let out = f();
        let e = self.0.entry(call).or_insert_with(|| CallCost {
            call: call.to_string(),
            ..Default::default()
        });
        e.calls += 1;
        e.cpu_ns += thread_cpu_ns() - c0;
        e.wall_ns += monotonic_ns() - w0;
        out
    }
}

/// State kept per device between polls.
struct DeviceState<'n> {
    info: GpuDevice,
    device: Device<'n>,
    last_util_us: u64,
    last_mem_us: u64,
    last_proc_us: u64,
    util: Vec<(u64, f64)>,
    mem: Vec<(u64, f64)>,
    /// Each member's own utilization, by PID.
    proc_sm: BTreeMap<u32, Vec<(u64, f64)>>,
    proc_mem: BTreeMap<u32, Vec<(u64, f64)>>,
    gpm_prev: Option<GpmSample<'n>>,
}

fn sample_value(v: &SampleValue) -> f64 {
    match *v {
        SampleValue::F64(x) => x,
        SampleValue::U32(x) => x as f64,
        SampleValue::U64(x) => x as f64,
        SampleValue::I64(x) => x as f64,
    }
}

/// Buffered driver samples newer than `*last`, appended to `out`.
fn drain_samples(d: &Device, kind: Sampling, last: &mut u64, out: &mut Vec<(u64, f64)>) {
    if let Ok(samples) = d.samples(kind, *last) {
        for s in samples {
            *last = (*last).max(s.timestamp);
            out.push((s.timestamp, sample_value(&s.value)));
        }
    }
}

const GPM_METRICS: [GpmMetricId; 5] = [
    GpmMetricId::SmUtil,
    GpmMetricId::SmOccupancy,
    GpmMetricId::AnyTensorUtil,
    GpmMetricId::DramBwUtil,
    GpmMetricId::GraphicsUtil,
];

fn gpm(nvml: &Nvml, st: &mut DeviceState, costs: &mut Costs) -> Option<GpmValues> {
    if !st.info.gpm_supported {
        return None;
    }
    let now = costs.time("gpm_sample", || st.device.gpm_sample()).ok()?;
    let prev = st.gpm_prev.replace(now)?;
    let cur = st.gpm_prev.as_ref()?;
    let results = costs
        .time("gpm_metrics_get", || {
            gpm_metrics_get(nvml, &prev, cur, &GPM_METRICS)
        })
        .ok()?;
    let mut v = GpmValues::default();
    for (id, r) in GPM_METRICS.iter().zip(results) {
        let Ok(r) = r else { continue };
        let slot = match id {
            GpmMetricId::SmUtil => &mut v.sm_activity_pct,
            GpmMetricId::SmOccupancy => &mut v.sm_occupancy_pct,
            GpmMetricId::AnyTensorUtil => &mut v.tensor_activity_pct,
            GpmMetricId::DramBwUtil => &mut v.dram_bw_util_pct,
            _ => &mut v.graphics_activity_pct,
        };
        // NVML reports NaN for a metric it could not compute over the interval.
        *slot = r.value.is_finite().then_some(r.value);
    }
    Some(v)
}

/// Which of the costlier NVML calls a poll makes.
#[derive(Clone, Copy)]
struct Extras {
    /// Driver sample buffers, the target's utilization and memory, GPM, the clock-violation
    /// counters. A cut's last poll is slow, so a window's first and last polls both have the
    /// counters (its first is the last one before).
    slow: bool,
    pcie: bool,
}

/// "PID 12", "the target set (3 processes)".
fn who(members: &BTreeSet<u32>) -> String {
    match members.len() {
        1 => format!("PID {}", members.first().expect("one")),
        n => format!("the target set ({n} processes)"),
    }
}

fn poll(
    nvml: &Nvml,
    st: &mut DeviceState,
    members: &BTreeSet<u32>,
    extras: Extras,
    costs: &mut Costs,
) -> GpuPoll {
    let t0 = monotonic_ns();
    let d = &st.device;
    let rates = costs
        .time("utilization_rates", || d.utilization_rates())
        .ok();
    let (contexts, target_mem_bytes) = if extras.slow {
        compute_processes(d, members, costs)
    } else {
        (None, None)
    };
    let mem = costs.time("memory_info", || d.memory_info()).ok();
    let mut p = GpuPoll {
        device: st.info.index,
        util_gpu_pct: rates.as_ref().map(|r| r.gpu),
        util_mem_pct: rates.as_ref().map(|r| r.memory),
        sm_clock_mhz: costs
            .time("clock", || d.clock(Clock::SM, ClockId::Current))
            .ok(),
        mem_clock_mhz: costs
            .time("clock", || d.clock(Clock::Memory, ClockId::Current))
            .ok(),
        power_mw: costs.time("power_usage", || d.power_usage()).ok(),
        temperature_c: costs
            .time("temperature", || d.temperature(TemperatureSensor::Gpu))
            .ok(),
        mem_used_bytes: mem.as_ref().map(|m| m.used),
        mem_total_bytes: mem.as_ref().map(|m| m.total),
        clock_event_reasons: costs
            .time("current_throttle_reasons", || d.current_throttle_reasons())
            .ok()
            .map(|r| r.bits()),
        target_mem_bytes,
        contexts,
        ..Default::default()
    };
    if extras.slow {
        slow_reads(nvml, st, members, costs, &mut p);
    }
    let t1 = monotonic_ns();
    p.t_ns = t0 + (t1 - t0) / 2;
    p.err_ns = (t1 - t0) / 2;
    // After the bracket: the PCIe call measures for 20 ms itself, and would blur the time of
    // the instant readings above.
    if extras.pcie {
        pcie(&st.device, costs, &mut p);
    }
    p
}

/// The processes with a compute context on the GPU, and the service's memory on it (its
/// members' together), from one call.
fn compute_processes(
    d: &Device,
    members: &BTreeSet<u32>,
    costs: &mut Costs,
) -> (Option<Vec<u32>>, Option<u64>) {
    let Ok(ps) = costs.time("running_compute_processes", || {
        d.running_compute_processes()
    }) else {
        return (None, None);
    };
    let mine: Vec<u64> = ps
        .iter()
        .filter(|p| members.contains(&p.pid))
        .map(|p| match p.used_gpu_memory {
            UsedGpuMemory::Used(b) => b,
            UsedGpuMemory::Unavailable => 0,
        })
        .collect();
    (
        Some(ps.iter().map(|p| p.pid).collect()),
        (!mine.is_empty()).then(|| mine.iter().sum()),
    )
}

/// The costlier reads (`Extras::slow`): the violation counters, the driver's sample buffers,
/// the members' own utilization, GPM.
fn slow_reads(
    nvml: &Nvml,
    st: &mut DeviceState,
    members: &BTreeSet<u32>,
    costs: &mut Costs,
    p: &mut GpuPoll,
) {
    let d = &st.device;
    p.violation_ns = costs.time("violation_status", || {
        use nvml_wrapper::enum_wrappers::device::PerformancePolicy as P;
        [
            P::Power,
            P::Thermal,
            P::SyncBoost,
            P::BoardLimit,
            P::LowUtilization,
            P::Reliability,
            P::TotalAppClocks,
            P::TotalBaseClocks,
        ]
        .into_iter()
        .map(|policy| d.violation_status(policy).ok().map(|v| v.violation_time))
        .collect()
    });
    costs.time("samples", || {
        drain_samples(
            d,
            Sampling::GpuUtilization,
            &mut st.last_util_us,
            &mut st.util,
        );
        drain_samples(
            d,
            Sampling::MemoryUtilization,
            &mut st.last_mem_us,
            &mut st.mem,
        );
    });
    // NotFound when the target used no GPU time since `last`: nothing to add.
    let procs = costs.time("process_utilization_stats", || {
        d.process_utilization_stats(st.last_proc_us)
    });
    if let Ok(samples) = procs {
        for s in samples.into_iter().filter(|s| members.contains(&s.pid)) {
            st.last_proc_us = st.last_proc_us.max(s.timestamp);
            let at = |m: &mut BTreeMap<u32, Vec<(u64, f64)>>, v: u32| {
                m.entry(s.pid).or_default().push((s.timestamp, v as f64))
            };
            at(&mut st.proc_sm, s.sm_util);
            at(&mut st.proc_mem, s.mem_util);
        }
    }
    p.gpm = gpm(nvml, st, costs);
}

/// PCIe throughput both ways (each call measures for 20 ms itself).
fn pcie(d: &Device, costs: &mut Costs, p: &mut GpuPoll) {
    p.pcie_tx_kib_s = costs
        .time("pcie_throughput", || {
            d.pcie_throughput(PcieUtilCounter::Send)
        })
        .ok();
    p.pcie_rx_kib_s = costs
        .time("pcie_throughput", || {
            d.pcie_throughput(PcieUtilCounter::Receive)
        })
        .ok();
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
