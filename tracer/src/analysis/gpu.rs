//! GPU figures over the window: utilization as the driver measured it (time-weighted over its
//! sample intervals), clocks, power, throttling, GPM, and the target's CUDA waits.

use serde::Serialize;

use crate::recording::{
    Recording,
    gpu::{GpuPoll, GpuRecording, UtilKind, UtilSample},
};

/// NVML clock-event (throttle) reason bits (nvml.h, nvmlClocksEventReason*).
pub const CLOCK_EVENT_REASONS: [(u64, &str); 9] = [
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
];

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct ReasonShare {
    pub reason: &'static str,
    /// Fraction of polls in which the reason was active.
    pub share_of_polls: f64,
}

#[derive(Debug, Clone, Default, Serialize, schemars::JsonSchema)]
pub struct GpmSummary {
    pub sm_activity_pct: Option<f64>,
    pub sm_occupancy_pct: Option<f64>,
    pub tensor_activity_pct: Option<f64>,
    pub dram_bw_util_pct: Option<f64>,
}

/// One poll, trimmed for the series.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct GpuPoint {
    pub t_ns: u64,
    pub util_gpu_pct: Option<u32>,
    pub sm_clock_mhz: Option<u32>,
    pub power_w: Option<f64>,
    pub sm_activity_pct: Option<f64>,
    pub tensor_activity_pct: Option<f64>,
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct GpuDeviceSummary {
    pub index: u32,
    pub name: String,
    pub uuid: String,
    pub used_by_target: bool,
    /// Driver utilization averaged over the window, weighting each driver sample by how much of
    /// its interval falls inside it.
    pub util_gpu_pct: Option<f64>,
    pub util_gpu_pct_max: Option<f64>,
    pub util_mem_pct: Option<f64>,
    /// The target set's own SM utilization: its members' added up.
    pub target_sm_pct: Option<f64>,
    /// Each member's own SM utilization (those NVML reported on this GPU), largest first.
    pub member_sm: Vec<MemberSm>,
    pub sm_clock_mhz: Option<f64>,
    pub sm_clock_mhz_min: Option<u32>,
    pub mem_clock_mhz: Option<f64>,
    pub power_w: Option<f64>,
    pub power_w_max: Option<f64>,
    pub temperature_c_max: Option<u32>,
    pub mem_used_bytes_max: Option<u64>,
    pub target_mem_bytes_max: Option<u64>,
    pub pcie_tx_kib_s: Option<f64>,
    pub pcie_rx_kib_s: Option<f64>,
    pub clock_event_reasons: Vec<ReasonShare>,
    /// The time each policy held the clocks down in the window, from NVML's cumulative
    /// violation counters at the first and last polls (policies with none left out).
    pub clock_violations: Vec<ClockViolationShare>,
    /// Averages over the window; null without GPM.
    pub gpm: Option<GpmSummary>,
    pub series: Vec<GpuPoint>,
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct ClockViolationShare {
    /// `power`, `thermal`, `sync_boost`, `board_limit`, `low_utilization`, `reliability`,
    /// `total_app_clocks`, `total_base_clocks` (NVML's performance policies).
    pub policy: String,
    pub ns: u64,
    /// Share of the time between the two polls, at most 1 (the driver's counter can run a
    /// few ms over the span).
    pub share: f64,
}

/// Each policy's violation time between the first and the last poll that read the counters
/// (every 2 s and at the window's end: they are costly).
fn violations(polls: &[&GpuPoll]) -> Vec<ClockViolationShare> {
    let mut read = polls.iter().filter(|p| !p.violation_ns.is_empty());
    let (Some(a), Some(b)) = (read.next(), read.next_back()) else {
        return vec![];
    };
    let span = b.t_ns.saturating_sub(a.t_ns).max(1) as f64;
    crate::recording::gpu::VIOLATION_POLICIES
        .iter()
        .enumerate()
        .filter_map(|(i, policy)| {
            let (x, y) = (
                a.violation_ns.get(i).copied()??,
                b.violation_ns.get(i).copied()??,
            );
            let ns = y.saturating_sub(x);
            // The driver updates the counters on its own ticks, not at the poll's instant: a
            // policy that held the clocks all along reads up to a few ms over the span
            // between the polls (2,026 ms in 2,020 on the H100). Held all the time is 1.
            (ns > 0).then(|| ClockViolationShare {
                policy: policy.to_string(),
                ns,
                share: (ns as f64 / span).min(1.0),
            })
        })
        .collect()
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct MemberSm {
    /// The member (`processes[].pid`; 0 in files from before process trees: the target).
    pub pid: u32,
    pub sm_pct: f64,
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct GpuSummary {
    pub selection: String,
    pub interval_ns: u64,
    /// Error bound of the realtime-to-monotonic conversion of driver timestamps.
    pub clock_alignment_error_ns: u64,
    /// Largest error bound of a poll's timestamp (half the time its NVML calls took).
    pub poll_time_error_ns_max: u64,
    pub sampler_cpu_ns: u64,
    /// The sampler's CPU time as a share of one CPU over the window.
    pub sampler_cpu_share: f64,
    /// That cost by NVML call.
    pub sampler_calls: Vec<crate::recording::gpu::CallCost>,
    pub devices: Vec<GpuDeviceSummary>,
}

/// Time-weighted mean of interval samples over `[from, to]`, and the largest one that overlaps.
pub fn weighted_mean(samples: &[&UtilSample], from: u64, to: u64) -> Option<(f64, f64)> {
    let mut sum = 0.0;
    let mut weight = 0.0;
    let mut max: Option<f64> = None;
    for s in samples {
        let overlap = s.end_ns.min(to).saturating_sub(s.start_ns.max(from)) as f64;
        if overlap > 0.0 {
            sum += s.pct * overlap;
            weight += overlap;
            max = Some(max.map_or(s.pct, |m| m.max(s.pct)));
        }
    }
    (weight > 0.0).then(|| (sum / weight, max.unwrap_or(0.0)))
}

pub(crate) fn mean<T: Into<f64> + Copy>(values: impl Iterator<Item = Option<T>>) -> Option<f64> {
    let v: Vec<f64> = values.flatten().map(Into::into).collect();
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// Each member's own SM share (`ProcessSm` samples), largest first.
fn member_sm(own: &[&UtilSample], from: u64, to: u64) -> Vec<MemberSm> {
    let mut pids: Vec<u32> = own.iter().map(|s| s.pid).collect();
    pids.sort_unstable();
    pids.dedup();
    let mut member_sm: Vec<MemberSm> = pids
        .into_iter()
        .filter_map(|pid| {
            let mine: Vec<&UtilSample> = own.iter().copied().filter(|s| s.pid == pid).collect();
            weighted_mean(&mine, from, to).map(|(sm_pct, _)| MemberSm { pid, sm_pct })
        })
        .collect();
    member_sm.sort_by(|a, b| b.sm_pct.total_cmp(&a.sm_pct));
    member_sm
}

/// The clock-event reasons the polls saw, each with the share of polls it was on in.
fn clock_event_reasons(polls: &[&GpuPoll]) -> Vec<ReasonShare> {
    let n = polls.len().max(1) as f64;
    CLOCK_EVENT_REASONS
        .iter()
        .filter_map(|&(bit, reason)| {
            let on = polls
                .iter()
                .filter(|p| p.clock_event_reasons.is_some_and(|r| r & bit != 0))
                .count();
            (on > 0).then(|| ReasonShare {
                reason,
                share_of_polls: on as f64 / n,
            })
        })
        .collect()
}

/// The GPM metrics' means over the polls that have them (Hopper and later).
fn gpm(polls: &[&GpuPoll]) -> Option<GpmSummary> {
    let gpms: Vec<_> = polls.iter().filter_map(|p| p.gpm).collect();
    (!gpms.is_empty()).then(|| GpmSummary {
        sm_activity_pct: mean(gpms.iter().map(|g| g.sm_activity_pct)),
        sm_occupancy_pct: mean(gpms.iter().map(|g| g.sm_occupancy_pct)),
        tensor_activity_pct: mean(gpms.iter().map(|g| g.tensor_activity_pct)),
        dram_bw_util_pct: mean(gpms.iter().map(|g| g.dram_bw_util_pct)),
    })
}

fn device_summary(g: &GpuRecording, index: u32, from: u64, to: u64) -> GpuDeviceSummary {
    let info = g.devices.iter().find(|d| d.index == index);
    let polls: Vec<&GpuPoll> = g
        .polls
        .iter()
        .filter(|p| p.device == index && p.t_ns >= from && p.t_ns <= to)
        .collect();
    let of_kind = |k: UtilKind| -> Vec<&UtilSample> {
        g.util_samples
            .iter()
            .filter(|s| s.device == index && s.kind == k)
            .collect()
    };
    let util = weighted_mean(&of_kind(UtilKind::Gpu), from, to);
    let util_mem = weighted_mean(&of_kind(UtilKind::Memory), from, to);
    let member_sm = member_sm(&of_kind(UtilKind::ProcessSm), from, to);
    let target_sm =
        (!member_sm.is_empty()).then(|| member_sm.iter().map(|m| m.sm_pct).sum::<f64>());
    let watts = |mw: Option<u32>| mw.map(|m| m as f64 / 1000.0);
    GpuDeviceSummary {
        index,
        name: info.map(|d| d.name.clone()).unwrap_or_default(),
        uuid: info.map(|d| d.uuid.clone()).unwrap_or_default(),
        used_by_target: info.is_some_and(|d| d.used_by_target),
        // Without driver samples (not every GPU buffers them), the polled rates.
        util_gpu_pct: util
            .map(|u| u.0)
            .or_else(|| mean(polls.iter().map(|p| p.util_gpu_pct))),
        util_gpu_pct_max: util.map(|u| u.1).or_else(|| {
            polls
                .iter()
                .filter_map(|p| p.util_gpu_pct)
                .max()
                .map(f64::from)
        }),
        util_mem_pct: util_mem
            .map(|u| u.0)
            .or_else(|| mean(polls.iter().map(|p| p.util_mem_pct))),
        target_sm_pct: target_sm,
        member_sm,
        sm_clock_mhz: mean(polls.iter().map(|p| p.sm_clock_mhz)),
        sm_clock_mhz_min: polls.iter().filter_map(|p| p.sm_clock_mhz).min(),
        mem_clock_mhz: mean(polls.iter().map(|p| p.mem_clock_mhz)),
        power_w: mean(polls.iter().map(|p| watts(p.power_mw))),
        power_w_max: polls
            .iter()
            .filter_map(|p| watts(p.power_mw))
            .reduce(f64::max),
        temperature_c_max: polls.iter().filter_map(|p| p.temperature_c).max(),
        mem_used_bytes_max: polls.iter().filter_map(|p| p.mem_used_bytes).max(),
        target_mem_bytes_max: polls.iter().filter_map(|p| p.target_mem_bytes).max(),
        pcie_tx_kib_s: mean(polls.iter().map(|p| p.pcie_tx_kib_s)),
        pcie_rx_kib_s: mean(polls.iter().map(|p| p.pcie_rx_kib_s)),
        clock_event_reasons: clock_event_reasons(&polls),
        clock_violations: violations(&polls),
        gpm: gpm(&polls),
        series: polls
            .iter()
            .map(|p| GpuPoint {
                t_ns: p.t_ns,
                util_gpu_pct: p.util_gpu_pct,
                sm_clock_mhz: p.sm_clock_mhz,
                power_w: watts(p.power_mw),
                sm_activity_pct: p.gpm.and_then(|g| g.sm_activity_pct),
                tensor_activity_pct: p.gpm.and_then(|g| g.tensor_activity_pct),
            })
            .collect(),
    }
}

pub fn summarize(rec: &Recording) -> Option<GpuSummary> {
    let g = rec.gpu.as_ref()?;
    let (from, to) = (rec.start_ns, rec.end_ns);
    Some(GpuSummary {
        selection: g.selection.clone(),
        interval_ns: g.interval_ns,
        clock_alignment_error_ns: g.clock.error_ns,
        poll_time_error_ns_max: g.polls.iter().map(|p| p.err_ns).max().unwrap_or(0),
        sampler_cpu_ns: g.sampler_cpu_ns,
        sampler_cpu_share: g.sampler_cpu_ns as f64 / rec.duration_ns().max(1) as f64,
        sampler_calls: g.sampler_calls.clone(),
        devices: g
            .devices
            .iter()
            .map(|d| device_summary(g, d.index, from, to))
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(start: u64, end: u64, pct: f64) -> UtilSample {
        UtilSample {
            device: 0,
            kind: UtilKind::Gpu,
            pid: 0,
            start_ns: start,
            end_ns: end,
            pct,
        }
    }

    #[test]
    fn violations_are_taken_between_the_polls_that_read_them() {
        // The counters are read every 2 s and at the window's end: polls between have none.
        let poll = |t_ns: u64, v: Option<u64>| GpuPoll {
            t_ns,
            violation_ns: v.map(|ns| vec![Some(ns), None]).unwrap_or_default(),
            ..Default::default()
        };
        let polls = [
            poll(0, None),
            poll(100, Some(1_000)),
            poll(200, None),
            poll(300, Some(1_150)),
            poll(400, None),
        ];
        let v = violations(&polls.iter().collect::<Vec<_>>());
        assert_eq!(v.len(), 1, "power only: thermal was never read: {v:?}");
        assert_eq!((v[0].policy.as_str(), v[0].ns), ("power", 150));
        assert!(
            (v[0].share - 0.75).abs() < 1e-9,
            "over the 200 ns between the readings"
        );
        assert!(
            violations(&polls[..3].iter().collect::<Vec<_>>()).is_empty(),
            "one reading"
        );
        // A counter that moved a little more than the span: held all the time.
        let over = [poll(100, Some(1_000)), poll(300, Some(1_203))];
        let v = violations(&over.iter().collect::<Vec<_>>());
        assert_eq!((v[0].ns, v[0].share), (203, 1.0));
    }

    #[test]
    fn utilization_is_weighted_by_overlap_with_the_window() {
        // 0-100 at 100 %, 100-200 at 0 %, window 50-200: 50 ns at 100, 100 ns at 0.
        let a = s(0, 100, 100.0);
        let b = s(100, 200, 0.0);
        let (avg, max) = weighted_mean(&[&a, &b], 50, 200).unwrap();
        assert!((avg - 100.0 / 3.0).abs() < 1e-9);
        assert_eq!(max, 100.0);
        // Samples outside the window count for nothing.
        assert_eq!(weighted_mean(&[&a], 100, 200), None);
    }

    #[test]
    fn reasons_and_gpm_are_summarized_per_device() {
        use crate::recording::gpu::{GpmValues, GpuDevice};
        let poll = |t: u64, reasons: u64, sm: f64| GpuPoll {
            device: 0,
            t_ns: t,
            power_mw: Some(500_000),
            sm_clock_mhz: Some(1980),
            clock_event_reasons: Some(reasons),
            gpm: Some(GpmValues {
                sm_activity_pct: Some(sm),
                ..Default::default()
            }),
            ..Default::default()
        };
        let g = GpuRecording {
            devices: vec![GpuDevice {
                index: 0,
                name: "H200".into(),
                uuid: "GPU-x".into(),
                gpm_supported: true,
                used_by_target: true,
                contexts: vec![],
            }],
            polls: vec![
                poll(10, 0x4, 90.0),
                poll(20, 0x4 | 0x1, 100.0),
                poll(30, 0, 95.0),
            ],
            util_samples: vec![s(0, 40, 80.0)],
            ..Default::default()
        };
        let d = device_summary(&g, 0, 0, 40);
        assert_eq!(d.util_gpu_pct, Some(80.0));
        assert_eq!(d.power_w, Some(500.0));
        let cap = d
            .clock_event_reasons
            .iter()
            .find(|r| r.reason == "sw_power_cap")
            .unwrap();
        assert!((cap.share_of_polls - 2.0 / 3.0).abs() < 1e-9);
        assert_eq!(d.gpm.unwrap().sm_activity_pct, Some(95.0));
        assert_eq!(d.series.len(), 3);
        // Polls outside the window are left out.
        assert_eq!(device_summary(&g, 0, 15, 25).series.len(), 1);
    }

    #[test]
    fn the_sets_own_sm_is_its_members_added_up() {
        let own = |pid, start, end, pct| UtilSample {
            kind: UtilKind::ProcessSm,
            pid,
            ..s(start, end, pct)
        };
        let g = GpuRecording {
            util_samples: vec![
                s(0, 100, 90.0),
                own(200, 0, 50, 40.0),
                own(200, 50, 100, 20.0),
                own(300, 0, 100, 10.0),
            ],
            ..Default::default()
        };
        let d = device_summary(&g, 0, 0, 100);
        let per: Vec<(u32, f64)> = d.member_sm.iter().map(|m| (m.pid, m.sm_pct)).collect();
        assert_eq!(per, vec![(200, 30.0), (300, 10.0)]);
        assert_eq!(d.target_sm_pct, Some(40.0));
    }
}
