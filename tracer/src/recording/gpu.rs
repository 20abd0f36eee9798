//! GPU data in the recording, on the monotonic timeline, with the error bounds of each
//! timestamp.

use serde::{Deserialize, Serialize};

/// How CLOCK_REALTIME maps to CLOCK_MONOTONIC during the recording: NVML's buffered samples
/// carry realtime microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClockAlignment {
    /// monotonic - realtime, in ns.
    pub offset_ns: i64,
    /// Half the width of the tightest (realtime, monotonic, realtime) bracket measured.
    pub error_ns: u64,
}

impl ClockAlignment {
    /// A realtime timestamp in microseconds, on the monotonic clock in ns.
    pub fn realtime_us_to_mono_ns(&self, us: u64) -> u64 {
        (us as i128 * 1000 + self.offset_ns as i128).max(0) as u64
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GpuDevice {
    pub index: u32,
    pub name: String,
    pub uuid: String,
    pub gpm_supported: bool,
    /// The target had a context on this GPU when the recording started.
    pub used_by_target: bool,
    /// Every process (members or not, kernel PIDs) with a compute context on it then: which
    /// GPU a rank of a tensor-parallel service uses, and who else shares it.
    #[serde(default)]
    pub contexts: Vec<u32>,
}

/// GPM metrics over the interval ending at a poll (percent).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct GpmValues {
    pub sm_activity_pct: Option<f64>,
    pub sm_occupancy_pct: Option<f64>,
    pub tensor_activity_pct: Option<f64>,
    pub dram_bw_util_pct: Option<f64>,
    pub graphics_activity_pct: Option<f64>,
}

/// One poll of one GPU. `t_ns` is the middle of the NVML calls, `err_ns` half their span.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct GpuPoll {
    pub device: u32,
    pub t_ns: u64,
    pub err_ns: u64,
    /// nvmlDeviceGetUtilizationRates: averages over the driver's last sample period.
    pub util_gpu_pct: Option<u32>,
    pub util_mem_pct: Option<u32>,
    pub sm_clock_mhz: Option<u32>,
    pub mem_clock_mhz: Option<u32>,
    pub power_mw: Option<u32>,
    pub temperature_c: Option<u32>,
    pub mem_used_bytes: Option<u64>,
    pub mem_total_bytes: Option<u64>,
    /// PCIe throughput (KiB/s), polled less often: NVML measures it over 20 ms per call.
    pub pcie_tx_kib_s: Option<u32>,
    pub pcie_rx_kib_s: Option<u32>,
    /// nvmlClocksEventReasons bits active at the poll.
    pub clock_event_reasons: Option<u64>,
    /// GPU memory the target process holds.
    pub target_mem_bytes: Option<u64>,
    pub gpm: Option<GpmValues>,
    /// nvmlDeviceGetViolationStatus: the time (ns, cumulative since the driver loaded) each
    /// policy of `VIOLATION_POLICIES` held the clocks down; the window's differences say
    /// exactly how long each did in it.
    #[serde(default)]
    pub violation_ns: Vec<Option<u64>>,
    /// The processes with a compute context on the GPU, read with the costly calls (members
    /// that create one during the window, neighbours that come and go); null when not read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub contexts: Option<Vec<u32>>,
}

/// The policies `GpuPoll::violation_ns` reads, in its order.
pub const VIOLATION_POLICIES: [&str; 8] = [
    "power",
    "thermal",
    "sync_boost",
    "board_limit",
    "low_utilization",
    "reliability",
    "total_app_clocks",
    "total_base_clocks",
];

/// Which utilization a driver sample reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UtilKind {
    Gpu,
    Memory,
    /// The target process's SM utilization (nvmlDeviceGetProcessUtilization).
    ProcessSm,
    ProcessMemory,
}

/// A driver-buffered utilization sample: an average over `[start_ns, end_ns]`, not an instant.
/// `start_ns` is the previous sample's time (the driver's sample period is 1/6 s to 1 s).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct UtilSample {
    pub device: u32,
    pub kind: UtilKind,
    /// For the per-process kinds: the member process (0 in files from before process trees,
    /// where it was the target).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub pid: u32,
    pub start_ns: u64,
    pub end_ns: u64,
    pub pct: f64,
}

/// What one kind of NVML call cost the sampler over the recording.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CallCost {
    pub call: String,
    pub calls: u64,
    pub cpu_ns: u64,
    pub wall_ns: u64,
}

/// Everything the GPU sampler recorded.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct GpuRecording {
    pub devices: Vec<GpuDevice>,
    /// Why these GPUs were sampled.
    pub selection: String,
    pub interval_ns: u64,
    pub clock: ClockAlignment,
    pub polls: Vec<GpuPoll>,
    pub util_samples: Vec<UtilSample>,
    /// CPU time the sampler thread used, to report its own cost.
    pub sampler_cpu_ns: u64,
    /// That cost by NVML call.
    pub sampler_calls: Vec<CallCost>,
    /// Whether GPM metrics were collected (Hopper and later).
    pub gpm: bool,
    pub driver_version: Option<String>,
}

/// Turns driver samples (realtime µs, value) of one kind into intervals on the monotonic
/// clock: each sample averages the time since the previous one. The first sample's interval
/// is assumed to be as long as the median period.
fn is_zero(v: &u32) -> bool {
    *v == 0
}

pub fn intervals(
    device: u32,
    kind: UtilKind,
    pid: u32,
    mut samples: Vec<(u64, f64)>,
    clock: &ClockAlignment,
) -> Vec<UtilSample> {
    samples.sort_by_key(|s| s.0);
    samples.dedup_by_key(|s| s.0);
    let mut periods: Vec<u64> = samples.windows(2).map(|w| w[1].0 - w[0].0).collect();
    periods.sort_unstable();
    let median_us = periods.get(periods.len() / 2).copied().unwrap_or(0);
    let mut out = Vec::with_capacity(samples.len());
    for (i, &(ts, pct)) in samples.iter().enumerate() {
        let prev = if i == 0 {
            ts.saturating_sub(median_us)
        } else {
            samples[i - 1].0
        };
        if prev == ts {
            continue;
        }
        out.push(UtilSample {
            device,
            kind,
            pid,
            start_ns: clock.realtime_us_to_mono_ns(prev),
            end_ns: clock.realtime_us_to_mono_ns(ts),
            pct,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn realtime_samples_land_on_the_monotonic_clock() {
        // Monotonic is 1000 s behind realtime.
        let clock = ClockAlignment {
            offset_ns: -1_000_000_000_000,
            error_ns: 500,
        };
        assert_eq!(clock.realtime_us_to_mono_ns(1_000_000_001), 1_000);
    }

    #[test]
    fn samples_become_intervals_ending_at_their_timestamp() {
        let clock = ClockAlignment::default();
        // Out of order, with a duplicate: the driver may return overlapping batches.
        let samples = vec![(2_000, 50.0), (1_000, 40.0), (3_000, 60.0), (2_000, 50.0)];
        let iv = intervals(0, UtilKind::Gpu, 0, samples, &clock);
        assert_eq!(iv.len(), 3);
        assert_eq!(
            (iv[0].start_ns, iv[0].end_ns, iv[0].pct),
            (0, 1_000_000, 40.0)
        );
        assert_eq!((iv[1].start_ns, iv[1].end_ns), (1_000_000, 2_000_000));
        assert_eq!(
            (iv[2].start_ns, iv[2].end_ns, iv[2].pct),
            (2_000_000, 3_000_000, 60.0)
        );
        assert!(intervals(0, UtilKind::Gpu, 0, vec![], &clock).is_empty());
    }
}
