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
    let positive: f64 = routed
        .parts
        .values()
        .iter()
        .filter(|v| **v > 0.0)
        .sum::<f64>()
        + routed.head_of_line_ns;
    if positive <= 0.0 {
        return vec![];
    }
    let t = Tail {
        s,
        r,
        routed: &routed,
        positive,
    };
    let mut out = t.scheduling();
    out.push(t.oncpu(t.moved_oncpu().unwrap_or(0.0)));
    out.push(t.gpu());
    out.extend(t.held());
    out.extend(t.waiting());
    out
}

/// The tail's excess being split: shares of its positive parts, and the words each cause says.
struct Tail<'a> {
    s: &'a Summary,
    r: &'a RequestAnalysis,
    routed: &'a super::queue::Routed,
    /// The excess's positive parts added up, ns per tail request.
    positive: f64,
}

impl Tail<'_> {
    fn share(&self, v: f64) -> f64 {
        v.max(0.0) / self.positive
    }

    /// What reached a part through the queue, said beside it.
    fn via(&self, v: f64) -> String {
        if v > 0.01 * self.positive {
            format!(
                "; {} more per tail request reached it through the queue: the serving thread was held up by it on earlier requests while the tail waited",
                ms(v)
            )
        } else {
            String::new()
        }
    }

    /// A part's mean in tail requests against median ones, in words.
    fn per(&self, part: impl Fn(&crate::analysis::requests::Breakdown) -> f64) -> String {
        format!(
            "{} in tail requests vs {} in median ones",
            ms(part(&self.r.tail.mean)),
            ms(part(&self.r.median.mean))
        )
    }

    /// The extra on-CPU time put down to the tail's extra moves (`MIGRATION_EXCESS_MIN`,
    /// `MIGRATION_COST_MAX_NS`), ns per tail request; None when the tail did not move more.
    fn moved_oncpu(&self) -> Option<f64> {
        let extra_moves = self.r.tail.migrations_mean - self.r.median.migrations_mean;
        (extra_moves >= MIGRATION_EXCESS_MIN).then(|| {
            self.routed
                .parts
                .oncpu_ns
                .clamp(0.0, extra_moves * MIGRATION_COST_MAX_NS)
        })
    }

    /// Run-queue waits behind other tasks, the quota's, on idle CPUs, and after moves.
    fn scheduling(&self) -> Vec<Cause> {
        let (s, ex, q) = (self.s, &self.routed.parts, &self.routed.via_queue);
        let (tail, median) = (&self.r.tail, &self.r.median);
        // Who ran meanwhile is known over the window (the kernel integrates it per CPU), not
        // per request.
        let mut out = vec![Cause::new(
            super::contention::mechanism(s),
            self.share(ex.runq_contention_ns),
            format!(
                "waiting for a CPU: {}{}{}",
                self.per(|b| b.runq_contention_ns),
                super::contention::caused(s, "over the window "),
                self.via(q.runq_contention_ns)
            ),
        )];
        // Run-queue waits the kernel said the cgroup's quota held (whoever ran meanwhile), and
        // waits that ended on an idle CPU: throttling too where the cgroup was throttled.
        let idle = self.per(|b| b.runq_idle_cpu_ns) + &self.via(q.runq_idle_cpu_ns);
        let held = self.per(|b| b.runq_throttled_ns) + &self.via(q.runq_throttled_ns);
        out.extend(quota_causes(
            s,
            (
                self.share(ex.runq_throttled_ns),
                self.share(ex.runq_idle_cpu_ns),
            ),
            (&held, &idle),
        ));
        // Migrations: the waits after moves, and the extra on-CPU time when the tail moved more.
        let moved = self.moved_oncpu();
        out.push(Cause::new(
            Mechanism::Migrations,
            self.share(ex.runq_migration_ns) + self.share(moved.unwrap_or(0.0)),
            format!(
                "{:.1} CPU changes per tail request vs {:.1} per median one; waiting after a move: {}{}{}",
                tail.migrations_mean,
                median.migrations_mean,
                self.per(|b| b.runq_migration_ns),
                self.via(q.runq_migration_ns),
                match moved {
                    Some(moved) => format!(
                        "; on-CPU time {}, {} more of it put down to the moves",
                        self.per(|b| b.oncpu_ns),
                        ms(moved)
                    ),
                    None => String::new(),
                }
            ),
        ));
        out
    }

    /// Longer on-CPU time not put down to moves: cache misses if measured; host work where
    /// the thread paces its GPU (held.rs); else unexplained.
    fn oncpu(&self, moved: f64) -> Cause {
        let (s, r) = (self.s, self.r);
        let oncpu = self.per(|b| b.oncpu_ns);
        let (mechanism, evidence) = match (r.tail.mpki, r.median.mpki) {
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
        let longer = self.share(self.routed.parts.oncpu_ns - moved);
        let c = match mechanism {
            Mechanism::LlcMisses => None,
            _ => super::held::host_bound_tail(s, r, longer, &oncpu),
        }
        .unwrap_or_else(|| Cause::new(mechanism, longer, evidence));
        Cause {
            evidence: c.evidence + &self.via(self.routed.via_queue.oncpu_ns) + &steal_note(s, r),
            ..c
        }
    }

    /// Waiting for the GPU.
    fn gpu(&self) -> Cause {
        let tail = &self.r.tail;
        Cause::new(
            gpu_mechanism(
                self.s,
                (tail.mean.cuda_sync_ns > 0.0)
                    .then(|| tail.cuda_device_sync_ns_mean / tail.mean.cuda_sync_ns),
            ),
            self.share(self.routed.parts.cuda_sync_ns),
            format!(
                "waiting for the GPU: {}{}{}",
                self.per(|b| b.cuda_sync_ns),
                self.via(self.routed.via_queue.cuda_sync_ns),
                if tail.cuda_device_sync_ns_mean > 0.0 {
                    format!(
                        ", {} of it in device-wide synchronization",
                        ms(tail.cuda_device_sync_ns_mean)
                    )
                } else {
                    String::new()
                }
            ),
        )
    }

    /// Lock waits and collections (held.rs).
    fn held(&self) -> Vec<Cause> {
        let q = &self.routed.via_queue;
        super::held::tail_causes(self.s, self.r, &self.routed.parts, &|v| self.share(v))
            .into_iter()
            .map(|c| {
                let extra = match c.mechanism {
                    Mechanism::LockWait { .. } => self.via(q.lock_wait_ns),
                    _ => self.via(q.runtime_pause_ns),
                };
                Cause {
                    evidence: c.evidence + &extra,
                    ..c
                }
            })
            .collect()
    }

    /// Behind long requests, behind ordinary queueing, other blocking, and what the timeline
    /// does not cover.
    fn waiting(&self) -> Vec<Cause> {
        let (s, ex, routed) = (self.s, &self.routed.parts, self.routed);
        let hol = routed.head_of_line_ns;
        vec![
            Cause::new(
                Mechanism::LongRequestOnServingThread {
                    requests: routed.requests.iter().take(5).cloned().collect(),
                },
                self.share(hol),
                format!(
                    "the serving thread was on a few long requests' own work while the tail \
                     waited, or was that work: {} per tail request ({} requests named; the \
                     queued time in tail requests: {}){}",
                    ms(hol),
                    routed.requests.len(),
                    self.per(|b| b.queued_oncpu_ns),
                    unseen_pauses(s)
                ),
            ),
            Cause::new(
                Mechanism::Queueing,
                self.share(ex.queued_oncpu_ns),
                format!(
                    "the serving thread was still on earlier requests, served in normal time: {} \
                     of the queued time in tail requests ({}) was not put down to what held \
                     them up",
                    ms(ex.queued_oncpu_ns.max(0.0)),
                    self.per(|b| b.queued_oncpu_ns)
                ),
            ),
            Cause::new(
                Mechanism::OtherBlocked,
                self.share(ex.blocked_ns),
                format!(
                    "blocked, not on the GPU, a lock or a pause: {}{}",
                    self.per(|b| b.blocked_ns),
                    self.via(self.routed.via_queue.blocked_ns)
                ),
            ),
            Cause::new(
                Mechanism::Uncovered,
                self.share(ex.uncovered_ns),
                format!(
                    "uncovered: {}; {}",
                    self.per(|b| b.uncovered_ns),
                    pct(
                        self.r.closure_within_5pct,
                        "of requests decompose within 5 %"
                    )
                ),
            ),
        ]
    }
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
