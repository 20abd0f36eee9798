//! The late-rank rules on the per-rank figures of the two-H200 baseline (docs/GPU.md): an 8-s
//! window, two ranks, one process a GPU.

use super::{
    late::{late_by_gpu, late_by_waiting},
    *,
};

const MS: u64 = 1_000_000;
const WINDOW: u64 = 8_000 * MS;

fn rank(pid: u32, gpu: u32, oncpu: u64, runq: u64, blocked: u64, sync: u64) -> Rank {
    Rank {
        pid,
        role: format!("rank{gpu}"),
        gpus: vec![gpu],
        oncpu_ns: oncpu * MS,
        runq_wait_ns: runq * MS,
        blocked_ns: blocked * MS,
        launches: 3_500,
        sync_calls: 1_760,
        sync_ns: sync * MS,
        blocked_by_ranks_ns: 0,
        waiting_ns: sync * MS,
        gc_ns: 0,
        gpu_busy_pct: Some(7.0),
        own_sm_pct: Some(6.0),
        others_on_gpu: vec![],
        shown_others: vec![],
        clocks_held_ns: 0,
    }
}

#[test]
fn quiet_ranks_have_no_late_one() {
    let ranks = [
        rank(10, 0, 852, 5, 6_900, 280),
        rank(11, 1, 848, 5, 6_900, 260),
    ];
    assert!(late_by_waiting(&ranks, WINDOW).is_none());
    assert!(late_by_gpu(&ranks).is_none());
}

#[test]
fn a_rank_kept_off_its_cpu_is_late_by_run_queue() {
    // The hog run: rank 1 waited 1.36 s for its CPU, rank 0 waited in synchronize for it.
    let ranks = [
        rank(10, 0, 1_985, 5, 4_500, 1_504),
        rank(11, 1, 900, 1_358, 5_300, 432),
    ];
    let late = late_by_waiting(&ranks, WINDOW).expect("a late rank");
    assert_eq!((late.pid, late.cause), (11, LateCause::RunQueue));
    assert_eq!(late.peers_waited_ns, (1_504 - 432) * MS);
    assert_eq!((late.sync_calls, late.found_by), (1_760, FoundBy::Waiting));
    assert_eq!(late.cause_ns, (1_358 - 5) * MS);
}

#[test]
fn a_rank_that_sleeps_is_late_by_off_cpu_waits() {
    // The stall run: rank 1 sleeps 30 ms every 20 steps; rank 0 spins in synchronize
    // (on-CPU) meanwhile.
    let mut r0 = rank(10, 0, 2_624, 5, 5_300, 2_400);
    let r1 = rank(11, 1, 643, 5, 7_300, 202);
    r0.sync_calls = 1_327;
    let mut r1 = r1;
    r1.sync_calls = 1_327;
    let late = late_by_waiting(&[r0, r1], WINDOW).expect("a late rank");
    assert_eq!((late.pid, late.cause), (11, LateCause::OffCpu));
    assert_eq!(late.cause_ns, 2_000 * MS);
}

#[test]
fn a_host_side_collective_counts_as_waiting() {
    // Gloo over TCP: no synchronize time, the waiting is blocked time a peer ended.
    let mut r0 = rank(10, 0, 300, 5, 7_600, 0);
    let mut r1 = rank(11, 0, 300, 5, 7_600, 0);
    r0.blocked_by_ranks_ns = 3_000 * MS;
    r0.waiting_ns = 3_000 * MS;
    r1.blocked_by_ranks_ns = 200 * MS;
    r1.waiting_ns = 200 * MS;
    let late = late_by_waiting(&[r0, r1], WINDOW).expect("a late rank");
    assert_eq!(late.pid, 11);
    // Its extra blocked time (not ended by a rank) is what made it late.
    assert_eq!(late.cause, LateCause::OffCpu);
}

#[test]
fn a_gpu_shared_with_another_process_makes_its_rank_late() {
    // Both ranks wait about as long (every step waits for the slow GPU); only GPU 1 has a
    // process from outside the service on it, taking most of its busy time.
    let r0 = rank(10, 0, 900, 5, 5_000, 2_000);
    let mut r1 = rank(11, 1, 900, 5, 5_000, 2_100);
    r1.others_on_gpu = vec![99];
    // The neighbour as the tool's PID namespace numbers it: what the evidence names.
    r1.shown_others = vec!["7".into()];
    r1.gpu_busy_pct = Some(98.0);
    r1.own_sm_pct = Some(20.0);
    let ranks = [r0.clone(), r1.clone()];
    assert!(late_by_waiting(&ranks, WINDOW).is_none());
    let late = late_by_gpu(&ranks).expect("a late rank");
    assert_eq!((late.pid, late.cause), (11, LateCause::GpuShared));
    assert!(late.evidence.ends_with("(PID 7)"), "{}", late.evidence);
    // Both GPUs shared: neither is singled out.
    let mut r0 = r0;
    r0.others_on_gpu = vec![98];
    r0.shown_others = vec!["98".into()];
    r0.gpu_busy_pct = Some(95.0);
    assert!(late_by_gpu(&[r0, r1]).is_none());
}

#[test]
fn a_late_rank_with_nothing_measured_says_so() {
    let r0 = rank(10, 0, 900, 5, 5_000, 2_000);
    let r1 = rank(11, 1, 900, 5, 5_000, 300);
    let late = late_by_waiting(&[r0, r1], WINDOW).expect("a late rank");
    assert_eq!(late.cause, LateCause::NotMeasured);
}

#[test]
fn ranks_that_synchronize_unlike_each_other_are_not_compared() {
    // Rank 1 polls (or waits in a host-side collective): few synchronizing calls, so little
    // time in them, for no fault of its own.
    let r0 = rank(10, 0, 900, 5, 5_000, 2_000);
    let mut r1 = rank(11, 1, 900, 5, 5_000, 300);
    r1.sync_calls = 40;
    let (late, why) = judge(&[r0, r1], WINDOW);
    assert!(late.is_none());
    assert!(
        why.starts_with("not assessed: the ranks made 40 to 1760"),
        "{why}"
    );
    // Alike, and apart by little: none, with the figures.
    let (late, why) = judge(
        &[
            rank(10, 0, 852, 5, 6_900, 280),
            rank(11, 1, 848, 5, 6_900, 260),
        ],
        WINDOW,
    );
    assert!(late.is_none());
    assert!(
        why.starts_with("no late rank: the ranks waited 260ms to 280ms"),
        "{why}"
    );
}

#[test]
fn an_idle_process_on_a_rank_gpu_does_not_make_it_late() {
    // Another process holds a context on GPU 1 (a notebook), and NVML gave no per-process
    // sample of the rank's own: the GPU's busy share cannot be put to the other process.
    let r0 = rank(10, 0, 900, 5, 5_000, 2_000);
    let mut r1 = rank(11, 1, 900, 5, 5_000, 2_100);
    r1.others_on_gpu = vec![99];
    r1.shown_others = vec!["99".into()];
    r1.gpu_busy_pct = Some(98.0);
    r1.own_sm_pct = None;
    assert!(late_by_gpu(&[r0, r1]).is_none());
}

#[test]
fn a_stray_context_does_not_add_a_gpu_to_a_rank() {
    let sm = |on: &'static [(u32, f64)]| move |g: u32| on.iter().find(|x| x.0 == g).map(|x| x.1);
    // A context on GPU 0 (CUDA initialized before set_device), the kernels on GPU 1.
    assert_eq!(running_on(vec![0, 1], sm(&[(0, 0.0), (1, 35.0)])), vec![1]);
    // Nothing running, or no per-process samples: every GPU listed.
    assert_eq!(
        running_on(vec![0, 1], sm(&[(0, 0.0), (1, 0.0)])),
        vec![0, 1]
    );
    assert_eq!(running_on(vec![0, 1], sm(&[])), vec![0, 1]);
    // A rank really spread over two GPUs keeps both.
    assert_eq!(
        running_on(vec![0, 1], sm(&[(0, 20.0), (1, 35.0)])),
        vec![0, 1]
    );
    assert_eq!(running_on(vec![3], sm(&[])), vec![3]);
}
