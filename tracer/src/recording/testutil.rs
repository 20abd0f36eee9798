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
        tail_switch: None,
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
        timeline_missing_before_ns: None,
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

/// Two tensor-parallel ranks, one process a GPU, over a 1-s window: rank PID 300 (GPU 0, 97 %
/// busy to NVML: the collective spins there while it waits) is 500 ms in synchronize; rank
/// PID 400 (GPU 1, 10 % busy) sleeps 650 ms and waits 50 ms: the late one.
pub fn two_ranks() -> Recording {
    use crate::recording::{
        ProcessRecord,
        cuda::CudaTotals,
        gpu::{GpuDevice, GpuRecording, UtilKind, UtilSample},
    };
    const MS: u64 = 1_000_000;
    let rank = |tid: u32, pid: u32, sync_ms: u64, blocked_ms: u64| {
        let mut t = thread(tid, 300 * MS, 0, &[]);
        t.pid = pid;
        t.totals.time.blocked_ns = blocked_ms * MS;
        t.cuda = Some(CudaTotals {
            launches: 1000,
            sync_calls: 100,
            sync_ns: sync_ms * MS,
            sync_max_ns: 10 * MS,
            ..Default::default()
        });
        t
    };
    let mut rec = recording(
        vec![rank(301, 300, 500, 200), rank(401, 400, 50, 650)],
        vec![],
    );
    (rec.start_ns, rec.end_ns) = (0, 1000 * MS);
    rec.processes = [300, 400]
        .map(|pid| ProcessRecord {
            pid,
            ppid: 1,
            comm: "python3".into(),
            cmdline: vec!["python3 -m worker".into()],
            given: true,
            joined_ns: None,
            cgroup: None,
            python: None,
        })
        .to_vec();
    rec.capabilities.gpu.available = true;
    rec.capabilities.gpu.cuda.available = true;
    let gpus = [(0, 300, 97.0), (1, 400, 10.0)];
    rec.gpu = Some(GpuRecording {
        devices: gpus
            .iter()
            .map(|&(index, pid, _)| GpuDevice {
                index,
                name: "H200".into(),
                uuid: format!("GPU-{index}"),
                gpm_supported: false,
                used_by_target: true,
                contexts: vec![pid],
            })
            .collect(),
        util_samples: gpus
            .iter()
            .map(|&(device, _, pct)| UtilSample {
                device,
                kind: UtilKind::Gpu,
                pid: 0,
                start_ns: 0,
                end_ns: 1000 * MS,
                pct,
            })
            .collect(),
        ..Default::default()
    });
    rec
}

/// `tid`'s waits that thread 9 ended in system call 202 (futex): one, of `blocked_ns`.
pub fn waker(tid: u32, blocked_ns: u64) -> crate::recording::wakers::WakerRecord {
    crate::recording::wakers::WakerRecord {
        tid,
        waker_tid: 9,
        waker_tgid: 9,
        waker_comm: "w".into(),
        kernel_thread: false,
        timer: false,
        syscall: Some(202),
        blocked_ns,
        count: 1,
        max_ns: blocked_ns,
        hist: vec![0, 1],
    }
}
