//! The NVML reads of one poll: the per-poll readings, the costlier ones every few seconds
//! (the driver's sample buffers, the target's own utilization, GPM, the violation counters,
//! PCIe), each call's cost accounted.

use std::collections::{BTreeMap, BTreeSet};

use nvml_wrapper::{
    Device, Nvml,
    enum_wrappers::device::{Clock, ClockId, PcieUtilCounter, Sampling, TemperatureSensor},
    enums::device::{SampleValue, UsedGpuMemory},
    enums::gpm::GpmMetricId,
    gpm::{GpmSample, gpm_metrics_get},
};

use super::super::clock::{monotonic_ns, thread_cpu_ns};
use crate::recording::gpu::{CallCost, GpmValues, GpuDevice, GpuPoll};

/// Accumulates the CPU and wall time of each kind of NVML call.
#[derive(Default)]
pub(super) struct Costs(pub(super) BTreeMap<&'static str, CallCost>);

impl Costs {
    pub(super) fn time<T>(&mut self, call: &'static str, f: impl FnOnce() -> T) -> T {
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
pub(super) struct DeviceState<'n> {
    pub(super) info: GpuDevice,
    pub(super) device: Device<'n>,
    pub(super) last_util_us: u64,
    pub(super) last_mem_us: u64,
    pub(super) last_proc_us: u64,
    pub(super) util: Vec<(u64, f64)>,
    pub(super) mem: Vec<(u64, f64)>,
    /// Each member's own utilization, by PID.
    pub(super) proc_sm: BTreeMap<u32, Vec<(u64, f64)>>,
    pub(super) proc_mem: BTreeMap<u32, Vec<(u64, f64)>>,
    pub(super) gpm_prev: Option<GpmSample<'n>>,
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
pub(super) struct Extras {
    /// Driver sample buffers, the target's utilization and memory, GPM, the clock-violation
    /// counters. A cut's last poll is slow, so a window's first and last polls both have the
    /// counters (its first is the last one before).
    pub(super) slow: bool,
    pub(super) pcie: bool,
}

pub(super) fn poll(
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
