//! Recordings built by hand for the analysis tests.

use crate::recording::{
    EndReason, Losses, PreemptorRecord, ProbeMode, Recording, TargetMeta, ThreadRecord,
    WaitSamples,
    threads::{StateTimes, Switches, ThreadTotals},
};

/// A thread with `on` ns on a CPU, `rq` ns waiting, and the given complete waits.
pub fn thread(tid: u32, on: u64, rq: u64, waits: &[u64]) -> ThreadRecord {
    let mut samples = WaitSamples::default();
    let mut log2 = vec![0u32; tracer_common::RUNQ_HIST_SLOTS];
    for &w in waits {
        samples.record(w);
        log2[tracer_common::hist_slot(w)] += 1;
    }
    ThreadRecord {
        tid,
        pid: 100,
        comm: format!("t{tid}"),
        created_ns: None,
        exited_ns: None,
        parent_tid: None,
        totals: ThreadTotals {
            switches: Switches {
                voluntary_switches: 1,
                involuntary_switches: waits.len() as u64,
                migrations: 0,
                wakeups: 0,
            },
            time: StateTimes {
                oncpu_ns: on,
                runq_wait_ns: rq,
                blocked_ns: 0,
            },
        },
        runq_waits: waits.len() as u64,
        runq_wait_max_ns: waits.iter().copied().max().unwrap_or(0),
        runq_wait_log2_hist: log2,
        runq_wait_samples: samples,
        counters: None,
        cuda: None,
        wait_classes: Default::default(),
    }
}

pub fn recording(threads: Vec<ThreadRecord>, preemptors: Vec<PreemptorRecord>) -> Recording {
    Recording {
        tracer_version: "test".into(),
        target: TargetMeta {
            pid: 100,
            comm: "server".into(),
            cmdline: vec![],
        },
        probe_mode: ProbeMode::TpBtf,
        probe_fallback_reason: None,
        start_ns: 1_000,
        end_ns: 11_000,
        end_reason: EndReason::Duration,
        target_exited_ns: None,
        threads,
        preemptors,
        migration_routes: vec![],
        losses: Losses::default(),
        events_received: 0,
        capabilities: crate::recording::host::no_capabilities(),
        counter_mask: 0,
        counter_bins: Default::default(),
        gpu: None,
        cuda_syncs: vec![],
        cuda_launch_bins: Default::default(),
        requests: None,
        cgroup: None,
        other_cgroups: vec![],
        host: Default::default(),
        incomplete: None,
        tracer_cost: None,
        output_error: None,
        timeline: Default::default(),
        pid_namespace: None,
        proc_counts: None,
        children: vec![],
        processes: vec![],
        target_cgroup: None,
        wakers: vec![],
        runtime_pauses: vec![],
        pause_probes: vec![],
    }
}
