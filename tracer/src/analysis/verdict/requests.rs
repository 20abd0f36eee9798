//! Causes from the requests: the tail's excess over the median requests, part by part.

use super::{Cause, Primary, gpu_advice, gpu_mechanism, ms, pct, throttle_evidence, throttled};
use crate::analysis::{requests::RequestAnalysis, summary::Summary};

/// Tail requests moved this many more times than median ones on average: their extra on-CPU
/// time is put down to the moves (caches refilled on the new CPU) rather than left unexplained.
pub const MIGRATION_EXCESS_MIN: f64 = 0.5;
/// Tail MPKI at least this multiple of the median requests' MPKI (and at least 1): cache thrash.
pub const MPKI_RATIO_MIN: f64 = 1.5;
pub const MPKI_MIN: f64 = 1.0;
/// The mechanism of the queueing part, which `explain_queueing` may hand to the impediments.
pub const QUEUEING: &str = "queueing behind earlier requests";

pub fn causes(s: &Summary, r: &RequestAnalysis) -> Vec<Cause> {
    let ex = &r.excess;
    let positive: f64 = ex.values().iter().filter(|v| **v > 0.0).sum();
    if positive <= 0.0 {
        return vec![];
    }
    let share = |v: f64| v.max(0.0) / positive;
    let (tail, median) = (&r.tail, &r.median);
    let per = |v: f64, m: f64| format!("{} in tail requests vs {} in median ones", ms(v), ms(m));
    let mut out = Vec::new();

    // Run-queue waits behind other tasks; who ran meanwhile is known over the window (the
    // kernel integrates it per CPU), not per request.
    out.push(Cause {
        cause: Primary::Scheduling,
        mechanism: super::contention::mechanism(s),
        share: share(ex.runq_contention_ns),
        evidence: format!(
            "waiting for a CPU: {}{}",
            per(tail.mean.runq_contention_ns, median.mean.runq_contention_ns),
            super::contention::caused(s, "over the window ")
        ),
        advice: super::contention::advice(s),
    });

    // Run-queue waits that ended on an idle CPU.
    if throttled(s) {
        out.push(Cause {
            cause: Primary::Scheduling,
            mechanism: "cgroup CPU throttling".into(),
            share: share(ex.runq_idle_cpu_ns),
            evidence: format!(
                "runnable with the CPU idle: {}; {}",
                per(tail.mean.runq_idle_cpu_ns, median.mean.runq_idle_cpu_ns),
                throttle_evidence(s)
            ),
            advice: "Raise the cgroup's CPU quota (cpu.max, cpu.cfs_quota_us) above the server's peak use, or lift it.".into(),
        });
    } else {
        out.push(Cause {
            cause: Primary::Scheduling,
            mechanism: "wakeup latency of idle CPUs".into(),
            share: share(ex.runq_idle_cpu_ns),
            evidence: format!(
                "runnable with the CPU idle: {}; no cgroup throttling seen",
                per(tail.mean.runq_idle_cpu_ns, median.mean.runq_idle_cpu_ns)
            ),
            advice: "Idle CPUs are slow to wake (deep C-states, or a VM's vCPU descheduled): limit C-states or keep the CPUs polling.".into(),
        });
    }

    // Migrations: the waits after moves, and the extra on-CPU time when the tail moved more.
    let extra_moves = tail.migrations_mean - median.migrations_mean;
    let oncpu_from_moves = extra_moves >= MIGRATION_EXCESS_MIN;
    out.push(Cause {
        cause: Primary::Scheduling,
        mechanism: "migrations".into(),
        share: share(ex.runq_migration_ns) + if oncpu_from_moves { share(ex.oncpu_ns) } else { 0.0 },
        evidence: format!(
            "{:.1} CPU changes per tail request vs {:.1} per median one; waiting after a move: {}{}",
            tail.migrations_mean,
            median.migrations_mean,
            per(tail.mean.runq_migration_ns, median.mean.runq_migration_ns),
            if oncpu_from_moves {
                format!("; on-CPU time {}", per(tail.mean.oncpu_ns, median.mean.oncpu_ns))
            } else {
                String::new()
            }
        ),
        advice: "Pin the server's threads (taskset, cpuset) and find what keeps changing their affinity or rebalancing them.".into(),
    });

    // Longer on-CPU time not put down to moves: cache misses if measured.
    if !oncpu_from_moves {
        let oncpu = per(tail.mean.oncpu_ns, median.mean.oncpu_ns);
        out.push(match (tail.mpki, median.mpki) {
            (Some(t), Some(m)) if t >= MPKI_MIN && t >= MPKI_RATIO_MIN * m => Cause {
                cause: Primary::CacheThrash,
                mechanism: "LLC misses".into(),
                share: share(ex.oncpu_ns),
                evidence: format!("{t:.1} LLC misses per 1000 instructions in tail requests vs {m:.1} in median ones; on-CPU time {oncpu}"),
                advice: "Something evicts the server's cache: move the neighbour off its LLC, or partition the LLC (resctrl/CAT).".into(),
            },
            (Some(t), Some(m)) => Cause {
                cause: Primary::Unexplained,
                mechanism: "longer on-CPU time, cache misses unchanged".into(),
                share: share(ex.oncpu_ns),
                evidence: format!("on-CPU time {oncpu}; LLC MPKI {t:.1} vs {m:.1}: more work per request, a lower CPU clock, or hypervisor steal"),
                advice: "Profile the slow requests' code paths (perf record) and check CPU frequency and steal time.".into(),
            },
            _ => Cause {
                cause: Primary::Unexplained,
                mechanism: "longer on-CPU time (cache misses not measured)".into(),
                share: share(ex.oncpu_ns),
                evidence: format!("on-CPU time {oncpu}; without LLC counters, cache thrash, more work per request, a lower clock or steal cannot be told apart"),
                advice: "Run where a PMU is available (bare metal, or a VM with PMU passthrough) to measure LLC misses.".into(),
            },
        });
    }

    let gpu = gpu_mechanism(
        s,
        (tail.mean.cuda_sync_ns > 0.0)
            .then(|| tail.cuda_device_sync_ns_mean / tail.mean.cuda_sync_ns),
    );
    out.push(Cause {
        cause: Primary::GpuSaturation,
        advice: gpu_advice(&gpu),
        mechanism: gpu,
        share: share(ex.cuda_sync_ns),
        evidence: format!(
            "waiting for the GPU: {}{}",
            per(tail.mean.cuda_sync_ns, median.mean.cuda_sync_ns),
            if tail.cuda_device_sync_ns_mean > 0.0 {
                format!(
                    ", {} of it in device-wide synchronization",
                    ms(tail.cuda_device_sync_ns_mean)
                )
            } else {
                String::new()
            }
        ),
    });
    out.push(Cause {
        cause: Primary::Unexplained,
        mechanism: QUEUEING.into(),
        share: share(ex.queued_oncpu_ns),
        evidence: format!(
            "the serving thread was still on earlier requests: {}",
            per(tail.mean.queued_oncpu_ns, median.mean.queued_oncpu_ns)
        ),
        advice: "Requests arrive faster than one thread serves them at times: add workers, or remove what slows the earlier requests (the causes above).".into(),
    });
    out.push(Cause {
        cause: Primary::Unexplained,
        mechanism: "other off-CPU waits (locks, I/O, sleeps)".into(),
        share: share(ex.blocked_ns),
        evidence: format!(
            "blocked, not on the GPU: {}",
            per(tail.mean.blocked_ns, median.mean.blocked_ns)
        ),
        advice:
            "Look at what the serving thread blocks on (off-CPU profile: offcputime, perf sched)."
                .into(),
    });
    out.push(Cause {
        cause: Primary::Unexplained,
        mechanism: "time the timeline does not cover".into(),
        share: share(ex.uncovered_ns),
        evidence: format!(
            "uncovered: {}; {}",
            per(tail.mean.uncovered_ns, median.mean.uncovered_ns),
            pct(r.closure_within_5pct, "of requests decompose within 5 %")
        ),
        advice: "Events were lost or the serving thread was not traced: enlarge --ring-kib.".into(),
    });
    out
}
