//! The terminal's GPU section: the CUDA waits, the sampler's own cost, and one row per GPU
//! sampled (utilization, clocks, power, memory, what held the clocks).

use std::fmt::Write as _;

use super::text::opt;
use crate::{
    analysis::summary::Summary,
    units::{dur, pct},
};

fn opt_f(v: Option<f64>, unit: &str) -> String {
    v.map(|x| format!("{x:.0}{unit}"))
        .unwrap_or_else(|| "-".into())
}

/// The GPU section: each sampled GPU, then the target's CUDA waits.
pub fn gpu(out: &mut String, s: &Summary) {
    let cap = &s.capabilities.gpu;
    if let Some(g) = &s.gpu {
        gpu_devices(out, s, g);
    } else {
        let _ = writeln!(out, "\nGPU: not sampled: {}", cap.reason);
    }
    let c = &s.cuda;
    if !c.measured {
        let _ = writeln!(out, "  CUDA waits: not measured: {}", cap.cuda.reason);
        return;
    }
    let _ = writeln!(
        out,
        "  CUDA: {} kernel launches, {} synchronizing calls, {} waiting for the GPU (up to {} of \
         a thread's time)",
        c.launches,
        c.sync_calls,
        dur(c.sync_ns),
        pct(c.max_thread_sync_share)
    );
}

fn gpu_devices(out: &mut String, s: &Summary, g: &crate::analysis::gpu::GpuSummary) {
    let cap = &s.capabilities.gpu;
    let _ = writeln!(
        out,
        "\nGPU ({}; sampler used {} of CPU, {:.2}% of one core):",
        g.selection,
        dur(g.sampler_cpu_ns),
        g.sampler_cpu_share * 100.0
    );
    for d in &g.devices {
        let _ = writeln!(
            out,
            "  GPU {} {}: utilization {} (max {}, the target's own SM share {}), SM clock {} \
             (min {}), power {} (max {}), max {}",
            d.index,
            d.name,
            opt_f(d.util_gpu_pct, "%"),
            opt_f(d.util_gpu_pct_max, "%"),
            opt_f(d.target_sm_pct, "%"),
            opt_f(d.sm_clock_mhz, " MHz"),
            opt(d.sm_clock_mhz_min),
            opt_f(d.power_w, " W"),
            opt_f(d.power_w_max, " W"),
            d.temperature_c_max
                .map_or("-".into(), |t| format!("{t} °C")),
        );
        match &d.gpm {
            Some(m) => {
                let _ = writeln!(
                    out,
                    "    GPM: SM activity {}, SM occupancy {}, tensor {}, DRAM bandwidth {}",
                    opt_f(m.sm_activity_pct, "%"),
                    opt_f(m.sm_occupancy_pct, "%"),
                    opt_f(m.tensor_activity_pct, "%"),
                    opt_f(m.dram_bw_util_pct, "%")
                );
            }
            None => {
                let _ = writeln!(out, "    GPM: {}", cap.gpm.reason);
            }
        }
        if !d.clock_event_reasons.is_empty() {
            let reasons: Vec<String> = d
                .clock_event_reasons
                .iter()
                .map(|r| format!("{} {}", r.reason, pct(r.share_of_polls)))
                .collect();
            let _ = writeln!(
                out,
                "    clock events (share of polls): {}",
                reasons.join(", ")
            );
        }
    }
}
