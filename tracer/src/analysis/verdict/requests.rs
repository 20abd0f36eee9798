//! Causes from the requests: the tail's excess over the median requests, part by part.

use super::{
    evidence::{ms, pct, throttle_evidence, throttled},
    gpu::gpu_mechanism,
    mechanism::Mechanism,
    model::Cause,
};
use crate::analysis::{requests::RequestAnalysis, summary::Summary};

/// Tail requests moved this many more times than median ones on average: their extra on-CPU
/// time is put down to the moves (caches refilled on the new CPU) rather than left unexplained.
pub const MIGRATION_EXCESS_MIN: f64 = 0.5;
/// At most this much extra on-CPU time per extra move is put down to the moves: refilling a
/// core's caches after a move (a few MB of L2 and L3 at tens of GB/s) takes tens to hundreds
/// of microseconds, so a tail that moved a little more and ran milliseconds longer did more
/// work, and the rest stays longer on-CPU time.
pub const MIGRATION_COST_MAX_NS: f64 = 1_000_000.0;
/// Tail MPKI at least this multiple of the median requests' MPKI (and at least 1): cache thrash.
pub const MPKI_RATIO_MIN: f64 = 1.5;
pub const MPKI_MIN: f64 = 1.0;

pub fn causes(s: &Summary, r: &RequestAnalysis) -> Vec<Cause> {
    // The excess with its queued part followed to what held the line up (queue.rs).
    let routed = super::queue::route(s, r);
    let ex = &routed.parts;
    let hol = routed.head_of_line_ns;
    let positive: f64 = ex.values().iter().filter(|v| **v > 0.0).sum::<f64>() + hol;
    if positive <= 0.0 {
        return vec![];
    }
    let share = |v: f64| v.max(0.0) / positive;
    let (tail, median) = (&r.tail, &r.median);
    // What reached a part through the queue, said beside it.
    let via = |v: f64| {
        if v > 0.01 * positive {
            format!(
                "; {} more per tail request reached it through the queue: the serving thread was held up by it on earlier requests while the tail waited",
                ms(v)
            )
        } else {
            String::new()
        }
    };
    let q = &routed.via_queue;
    let per = |v: f64, m: f64| format!("{} in tail requests vs {} in median ones", ms(v), ms(m));
    let mut out = Vec::new();

    // Run-queue waits behind other tasks; who ran meanwhile is known over the window (the
    // kernel integrates it per CPU), not per request.
    out.push(Cause::new(
        super::contention::mechanism(s),
        share(ex.runq_contention_ns),
        format!(
            "waiting for a CPU: {}{}{}",
            per(tail.mean.runq_contention_ns, median.mean.runq_contention_ns),
            super::contention::caused(s, "over the window "),
            via(q.runq_contention_ns)
        ),
    ));

    // Run-queue waits the kernel said the cgroup's quota held (whoever ran meanwhile), and
    // waits that ended on an idle CPU: throttling too where the cgroup was throttled.
    let idle =
        per(tail.mean.runq_idle_cpu_ns, median.mean.runq_idle_cpu_ns) + &via(q.runq_idle_cpu_ns);
    let held =
        per(tail.mean.runq_throttled_ns, median.mean.runq_throttled_ns) + &via(q.runq_throttled_ns);
    out.extend(quota_causes(
        s,
        (share(ex.runq_throttled_ns), share(ex.runq_idle_cpu_ns)),
        (&held, &idle),
    ));

    // Migrations: the waits after moves, and the extra on-CPU time when the tail moved more.
    let extra_moves = tail.migrations_mean - median.migrations_mean;
    let oncpu_from_moves = extra_moves >= MIGRATION_EXCESS_MIN;
    let moved_oncpu = if oncpu_from_moves {
        ex.oncpu_ns.clamp(0.0, extra_moves * MIGRATION_COST_MAX_NS)
    } else {
        0.0
    };
    out.push(Cause::new(
        Mechanism::Migrations,
        share(ex.runq_migration_ns) + share(moved_oncpu),
        format!(
            "{:.1} CPU changes per tail request vs {:.1} per median one; waiting after a move: {}{}{}",
            tail.migrations_mean,
            median.migrations_mean,
            per(tail.mean.runq_migration_ns, median.mean.runq_migration_ns),
            via(q.runq_migration_ns),
            if oncpu_from_moves {
                format!(
                    "; on-CPU time {}, {} more of it put down to the moves",
                    per(tail.mean.oncpu_ns, median.mean.oncpu_ns),
                    ms(moved_oncpu)
                )
            } else {
                String::new()
            }
        ),
    ));

    // Longer on-CPU time not put down to moves: cache misses if measured.
    let oncpu = per(tail.mean.oncpu_ns, median.mean.oncpu_ns);
    let (mechanism, evidence) = match (tail.mpki, median.mpki) {
        (Some(t), Some(m)) if t >= MPKI_MIN && t >= MPKI_RATIO_MIN * m => (
            Mechanism::LlcMisses,
            format!(
                "{t:.1} LLC misses per 1000 instructions in tail requests vs {m:.1} in median ones; on-CPU time {oncpu}"
            ),
        ),
        (Some(t), Some(m)) => (
            Mechanism::LongerOncpu { llc_measured: true },
            format!(
                "on-CPU time {oncpu}; LLC MPKI {t:.1} vs {m:.1}: more work per request, a lower CPU clock, or hypervisor steal"
            ),
        ),
        _ => (
            Mechanism::LongerOncpu {
                llc_measured: false,
            },
            format!(
                "on-CPU time {oncpu}; without LLC counters, cache thrash, more work per request, a lower clock or steal cannot be told apart"
            ),
        ),
    };
    let longer = share(ex.oncpu_ns - moved_oncpu);
    // Not cache misses: a thread pacing its GPU makes it host work (held.rs).
    let c = match mechanism {
        Mechanism::LlcMisses => None,
        _ => super::held::host_bound_tail(s, r, longer, &oncpu),
    }
    .unwrap_or_else(|| Cause::new(mechanism, longer, evidence));
    out.push(Cause {
        evidence: c.evidence + &via(q.oncpu_ns) + &steal_note(s, r),
        ..c
    });

    let gpu = gpu_mechanism(
        s,
        (tail.mean.cuda_sync_ns > 0.0)
            .then(|| tail.cuda_device_sync_ns_mean / tail.mean.cuda_sync_ns),
    );
    out.push(Cause::new(
        gpu,
        share(ex.cuda_sync_ns),
        format!(
            "waiting for the GPU: {}{}{}",
            per(tail.mean.cuda_sync_ns, median.mean.cuda_sync_ns),
            via(q.cuda_sync_ns),
            if tail.cuda_device_sync_ns_mean > 0.0 {
                format!(
                    ", {} of it in device-wide synchronization",
                    ms(tail.cuda_device_sync_ns_mean)
                )
            } else {
                String::new()
            }
        ),
    ));
    out.extend(
        super::held::tail_causes(s, r, ex, &share)
            .into_iter()
            .map(|c| {
                let extra = match c.mechanism {
                    Mechanism::LockWait { .. } => via(q.lock_wait_ns),
                    _ => via(q.runtime_pause_ns),
                };
                Cause {
                    evidence: c.evidence + &extra,
                    ..c
                }
            }),
    );
    out.push(Cause::new(
        Mechanism::LongRequestOnServingThread {
            requests: routed.requests.iter().take(5).cloned().collect(),
        },
        share(hol),
        format!(
            "the serving thread was on a few long requests' own work while the tail waited, \
             or was that work: {} per tail request ({} requests named; the queued time in tail \
             requests: {}){}",
            ms(hol),
            routed.requests.len(),
            per(tail.mean.queued_oncpu_ns, median.mean.queued_oncpu_ns),
            unseen_pauses(s)
        ),
    ));
    out.push(Cause::new(
        Mechanism::Queueing,
        share(ex.queued_oncpu_ns),
        format!(
            "the serving thread was still on earlier requests, served in normal time: {} of the \
             queued time in tail requests ({}) was not put down to what held them up",
            ms(ex.queued_oncpu_ns.max(0.0)),
            per(tail.mean.queued_oncpu_ns, median.mean.queued_oncpu_ns)
        ),
    ));
    out.push(Cause::new(
        Mechanism::OtherBlocked,
        share(ex.blocked_ns),
        format!(
            "blocked, not on the GPU, a lock or a pause: {}{}",
            per(tail.mean.blocked_ns, median.mean.blocked_ns),
            via(q.blocked_ns)
        ),
    ));
    out.push(Cause::new(
        Mechanism::Uncovered,
        share(ex.uncovered_ns),
        format!(
            "uncovered: {}; {}",
            per(tail.mean.uncovered_ns, median.mean.uncovered_ns),
            pct(r.closure_within_5pct, "of requests decompose within 5 %")
        ),
    ));
    out
}

/// The hypervisor's steal over the window, beside the tail's extra on-CPU time: steal shows as
/// on-CPU time (the thread was on its vCPU while the vCPU did not run), so it can make a tail of
/// longer on-CPU time. Known per CPU over the window (10 ms ticks), not per request: a
/// comparison, not an attribution.
fn steal_note(s: &Summary, r: &RequestAnalysis) -> String {
    let stolen: u64 = s.cpu_steal.iter().map(|c| c.steal_ns).sum();
    if stolen == 0 {
        return String::new();
    }
    let extra = (r.tail.mean.oncpu_ns - r.median.mean.oncpu_ns).max(0.0) * r.tail.requests as f64;
    let cpus: Vec<String> = s.cpu_steal.iter().map(|c| c.cpu.to_string()).collect();
    format!(
        "; the hypervisor stole {} from CPU {} in the window (steal time), against {} of extra \
         on-CPU time in the tail requests in all: steal is known per CPU over the window, not \
         per request",
        ms(stolen as f64),
        cpus.join(", "),
        ms(extra)
    )
}

/// Where a CPython process's GC probes did not attach, a long request's "own work" may be a
/// collection it triggered: said, not assumed either way.
fn unseen_pauses(s: &Summary) -> String {
    match s.pause_probes.iter().find(|p| !p.attached) {
        Some(p) => format!(
            "; the garbage-collection probes did not attach to PID {} ({}): part of that work \
             may be collections the requests triggered",
            s.shown_id(p.pid),
            p.reason.as_deref().unwrap_or("no reason given")
        ),
        None => String::new(),
    }
}

/// Cgroup throttling (the waits its quota held, and the idle-CPU waits where the cgroup was
/// throttled) and, where it was not, idle CPUs' wakeup latency: from their `shares` of the
/// excess and their figures in words.
fn quota_causes(
    s: &Summary,
    (held_share, idle_share): (f64, f64),
    (held, idle): (&str, &str),
) -> Vec<Cause> {
    let mut out = vec![Cause::new(
        Mechanism::CgroupThrottling,
        held_share + if throttled(s) { idle_share } else { 0.0 },
        format!(
            "runnable while the cgroup was throttled and other tasks ran: {held}{}; {}",
            if throttled(s) {
                format!("; runnable with the CPU idle: {idle}")
            } else {
                String::new()
            },
            throttle_evidence(s)
        ),
    )];
    if !throttled(s) {
        out.push(Cause::new(
            Mechanism::IdleCpuWakeup,
            idle_share,
            format!("runnable with the CPU idle: {idle}; no cgroup throttling seen"),
        ));
    }
    out
}
