//! The mechanisms' ids, texts and advice.

use super::*;
use crate::analysis::verdict::words::{OTHERS, OWN};

#[test]
fn the_id_is_what_the_json_says() {
    let all = [
        Mechanism::RunQueueContention { by: vec![] },
        Mechanism::CgroupThrottling,
        Mechanism::IdleCpuWakeup,
        Mechanism::Migrations,
        Mechanism::LlcMisses,
        Mechanism::LongerOncpu { llc_measured: true },
        Mechanism::SmSaturationByOthers {
            gpu_busy_pct: 99.0,
            own_sm_pct: 10.0,
        },
        Mechanism::SmSaturation {
            gpu_busy_pct: 99.0,
            clocks_held: None,
        },
        Mechanism::SyncStalls { gpu_busy_pct: None },
        Mechanism::LongerGpuWork { gpu_busy_pct: None },
        Mechanism::Queueing,
        Mechanism::OtherBlocked,
        Mechanism::Uncovered,
    ];
    for m in all {
        let v = serde_json::to_value(&m).unwrap();
        assert_eq!(v["mechanism_id"], m.id(), "{m:?}");
    }
}

#[test]
fn the_text_names_the_sides_and_the_advice_each_kind_once() {
    let side = |kind, name: &str, share| Contender {
        kind,
        name: name.into(),
        pids: vec![11],
        process_count: 1,
        wait_share: share,
        shown_pids: vec!["11".into()],
        members: vec![],
    };
    let m = Mechanism::RunQueueContention {
        by: vec![
            side(NeighbourKind::Process, "stress-ng-cpu", 0.5),
            side(NeighbourKind::Target, "server", 0.4),
        ],
    };
    assert_eq!(
        m.to_string(),
        "run-queue contention: preempted by stress-ng-cpu (PID 11) (50% of the waiting) \
         and its own threads (40%)"
    );
    assert_eq!(m.advice(), format!("{OTHERS} {OWN}"));
    assert_eq!(m.cause(), Primary::Scheduling);
}

#[test]
fn the_gpu_texts_are_the_ones_the_json_always_had() {
    let held = |by, mean, min| {
        Some(ClocksHeld {
            by,
            sm_clock_mhz: mean,
            sm_clock_mhz_min: min,
        })
    };
    let cases = [
        (
            Mechanism::SmSaturationByOthers {
                gpu_busy_pct: 97.4,
                own_sm_pct: 12.6,
            },
            "SM saturation by other processes (GPU 97% busy, 13% of it the server's kernels)",
        ),
        (
            Mechanism::SmSaturation {
                gpu_busy_pct: 99.0,
                clocks_held: held(ClockCap::PowerCap, Some(1402.4), Some(1100)),
            },
            "SM saturation (GPU 99% busy; SM clock held down by the power cap: 1402 MHz mean, \
             1100 MHz min)",
        ),
        (
            Mechanism::SmSaturation {
                gpu_busy_pct: 99.0,
                clocks_held: held(ClockCap::Thermal, None, None),
            },
            "SM saturation (GPU 99% busy; clocks held down by thermal slowdown)",
        ),
        (
            Mechanism::SmSaturation {
                gpu_busy_pct: 90.0,
                clocks_held: None,
            },
            "SM saturation (GPU 90% busy)",
        ),
        (
            Mechanism::SyncStalls {
                gpu_busy_pct: Some(40.0),
            },
            "synchronization stalls: device-wide synchronize waits for all the process's \
             queued GPU work (GPU 40% busy)",
        ),
        (
            Mechanism::SyncStalls { gpu_busy_pct: None },
            "synchronization stalls: device-wide synchronize waits for all the process's \
             queued GPU work",
        ),
        (
            Mechanism::LongerGpuWork {
                gpu_busy_pct: Some(30.0),
            },
            "longer GPU work per request (GPU 30% busy)",
        ),
        (
            Mechanism::LongerGpuWork { gpu_busy_pct: None },
            "longer waits for the GPU (GPU not sampled)",
        ),
    ];
    for (m, text) in cases {
        assert_eq!(m.to_string(), text);
        assert_eq!(m.cause(), Primary::GpuSaturation);
    }
}
