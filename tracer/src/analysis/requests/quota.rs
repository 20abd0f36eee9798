//! Waits behind other tasks that a cgroup's CPU quota made up for. Within one quota period a
//! throttled cgroup gets its quota and no more: a thread that waited behind another task early
//! in the period and was throttled later in it ran no less in that period than without the
//! other task, only later, and the throttle came that much later and shorter. Such a wait of a
//! request's serving thread, followed by a throttled wait within the same request and period,
//! is put to the quota, not to the task that ran. A request that ended before its thread was
//! throttled keeps its waits as they were: that delay was its own.

use super::Breakdown;
use crate::recording::Recording;

/// The cfs period when the recording names no limit: the kernel's default (100 ms).
const DEFAULT_PERIOD_NS: u64 = 100_000_000;

/// The period of the limit that binds (the fewest CPUs' worth) on the recording's cgroup path.
pub(super) fn period_ns(rec: &Recording) -> u64 {
    rec.cgroup
        .as_ref()
        .and_then(|c| {
            c.cgroup
                .limits
                .iter()
                .min_by(|a, b| a.cpus.total_cmp(&b.cpus))
        })
        .map_or(DEFAULT_PERIOD_NS, |l| (l.period_us * 1000).max(1))
}

/// One request's contention waits since its thread was last throttled.
pub(super) struct QuotaShift {
    period_ns: u64,
    /// (end of the wait's piece, its contention ns as added to the request).
    pending: Vec<(u64, f64)>,
}

impl QuotaShift {
    pub(super) fn new(period_ns: u64) -> Self {
        Self {
            period_ns,
            pending: Vec::new(),
        }
    }

    /// A run-queue piece `[start, end)` added `contention` ns to `p`; `throttled`: its wait
    /// was throttled in part. A throttled one moves the contention of the same period before
    /// it to the quota.
    pub(super) fn on_wait(
        &mut self,
        p: &mut Breakdown,
        (start, end): (u64, u64),
        (contention, throttled): (f64, bool),
    ) {
        if throttled {
            let from = start.saturating_sub(self.period_ns);
            let moved: f64 = self
                .pending
                .iter()
                .filter(|(e, _)| *e >= from)
                .map(|(_, ns)| ns)
                .sum();
            let moved = moved.min(p.runq_contention_ns);
            p.runq_contention_ns -= moved;
            p.runq_throttled_ns += moved;
            self.pending.clear();
        }
        if contention > 0.0 {
            self.pending.push((end, contention));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn contention_the_quota_made_up_for_goes_to_the_quota() {
        let mut p = Breakdown::default();
        let mut q = QuotaShift::new(100 * MS);
        // 5 ms behind another task at 10 ms, then (still in the period) throttled at 50 ms.
        p.runq_contention_ns += 5e6;
        q.on_wait(&mut p, (10 * MS, 15 * MS), (5e6, false));
        p.runq_throttled_ns += 40e6;
        q.on_wait(&mut p, (50 * MS, 90 * MS), (0.0, true));
        assert_eq!((p.runq_contention_ns, p.runq_throttled_ns), (0.0, 45e6));
        // After the throttle, a wait behind another task that no throttle follows stays.
        p.runq_contention_ns += 3e6;
        q.on_wait(&mut p, (95 * MS, 98 * MS), (3e6, false));
        assert_eq!((p.runq_contention_ns, p.runq_throttled_ns), (3e6, 45e6));
        // A throttle more than a period after a wait leaves that wait alone.
        p.runq_throttled_ns += 10e6;
        q.on_wait(&mut p, (300 * MS, 310 * MS), (0.0, true));
        assert_eq!((p.runq_contention_ns, p.runq_throttled_ns), (3e6, 55e6));
    }
}
