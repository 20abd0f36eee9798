//! The GPU's part in a cause: which mechanism its state says (other processes on it, a full GPU
//! whose clocks may be held down, device-wide synchronization, or longer GPU work).

use super::mechanism::{ClockCap, ClocksHeld, Mechanism};
use crate::analysis::summary::Summary;

/// A GPU counts as full at this utilization (NVML's busy share of the sample period).
pub const GPU_BUSY_PCT: f64 = 85.0;

/// Mean utilization of the GPUs the target uses (of all sampled ones if it uses none that NVML
/// attributes to it).
pub fn target_gpu_util(s: &Summary) -> Option<f64> {
    let g = s.gpu.as_ref()?;
    let used: Vec<f64> = g
        .devices
        .iter()
        .filter(|d| d.used_by_target)
        .filter_map(|d| d.util_gpu_pct)
        .collect();
    let all: Vec<f64> = g.devices.iter().filter_map(|d| d.util_gpu_pct).collect();
    let v = if used.is_empty() { all } else { used };
    v.into_iter().reduce(f64::max)
}

/// Why the GPU made the threads wait: other processes on it, a full GPU (its clocks perhaps
/// held down by power or heat), device-wide synchronization waiting for other work of the same
/// process, or longer GPU work. `device_sync`: the share of the tail's GPU waits spent in device-wide
/// synchronization, when requests were decomposed.
pub fn gpu_mechanism(s: &Summary, device_sync: Option<f64>) -> Mechanism {
    let util = target_gpu_util(s);
    let own = s.gpu.as_ref().and_then(|g| {
        g.devices
            .iter()
            .filter(|d| d.used_by_target)
            .filter_map(|d| d.target_sm_pct)
            .reduce(f64::max)
    });
    let reasons = s.gpu.as_ref().map(|g| {
        g.devices
            .iter()
            .flat_map(|d| d.clock_event_reasons.iter())
            .filter(|r| r.share_of_polls >= 0.2)
            .map(|r| r.reason)
            .collect::<Vec<_>>()
    });
    let has = |names: &[&str]| {
        reasons
            .as_ref()
            .is_some_and(|r| r.iter().any(|x| names.contains(x)))
    };
    if let (Some(u), Some(o)) = (util, own)
        && u >= GPU_BUSY_PCT
        && u - o >= OTHERS_GPU_MIN_PCT
    {
        return Mechanism::SmSaturationByOthers {
            gpu_busy_pct: u,
            own_sm_pct: o,
        };
    }
    // A power or thermal cap only matters to a GPU that is working hard: the H200 we measured
    // on reports its power-cap reason at 15 % utilization too, with its clocks at full speed.
    let clocks = s.gpu.as_ref().and_then(|g| {
        g.devices
            .iter()
            .find(|d| d.used_by_target)
            .or(g.devices.first())
    });
    if let Some(u) = util
        && u >= GPU_BUSY_PCT
    {
        let by = if has(&["sw_power_cap", "hw_power_brake_slowdown"]) {
            Some(ClockCap::PowerCap)
        } else if has(&["sw_thermal_slowdown", "hw_thermal_slowdown", "hw_slowdown"]) {
            Some(ClockCap::Thermal)
        } else {
            None
        };
        return Mechanism::SmSaturation {
            gpu_busy_pct: u,
            clocks_held: by.map(|by| ClocksHeld {
                by,
                sm_clock_mhz: clocks.and_then(|d| d.sm_clock_mhz),
                sm_clock_mhz_min: clocks.and_then(|d| d.sm_clock_mhz_min),
            }),
        };
    }
    // Device-wide synchronization waits for all of the process's GPU work: on a GPU that is not
    // full, a tail spent there is the request waiting for the process's other work.
    if device_sync.is_some_and(|d| d >= 0.5) {
        return Mechanism::SyncStalls { gpu_busy_pct: util };
    }
    Mechanism::LongerGpuWork { gpu_busy_pct: util }
}

/// The GPU counts as taken by other processes when its busy share exceeds the server's own
/// kernels' share by this much (NVML's per-process SM utilization).
pub const OTHERS_GPU_MIN_PCT: f64 = 20.0;
