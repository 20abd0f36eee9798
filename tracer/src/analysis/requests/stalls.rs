//! Run-queue waits on an idle CPU, per CPU: the stretches in which the target's threads could
//! not run although the CPU was free (a throttled cgroup, a slow wakeup).

use std::collections::HashMap;

use crate::recording::{
    timeline::{self, State},
    waits::WaitKind,
};

/// Per CPU, the stretches in which none of the target's threads ran on it although one waited
/// in its run queue, and the wait ended with the CPU idle: the CPU was free but the threads
/// could not run (their cgroup was throttled), or it was slow to wake. Every target thread
/// waiting on that CPU meanwhile waited for the same reason, whichever task it followed.
#[derive(Default)]
pub(super) struct Stalls(HashMap<u32, Vec<(u64, u64)>>);

impl Stalls {
    pub(super) fn build(
        timelines: &std::collections::BTreeMap<u32, timeline::ThreadTimeline>,
    ) -> Self {
        let mut run_ends: HashMap<u32, Vec<u64>> = HashMap::new();
        for t in timelines.values() {
            for i in t.intervals.iter().filter(|i| i.state == State::Running) {
                if let Some(c) = i.cpu {
                    run_ends.entry(c).or_default().push(i.end_ns);
                }
            }
        }
        for v in run_ends.values_mut() {
            v.sort_unstable();
        }
        let mut stalls: HashMap<u32, Vec<(u64, u64)>> = HashMap::new();
        for t in timelines.values() {
            for i in &t.intervals {
                let (Some(c), Some((WaitKind::IdleCpu, _))) = (i.cpu, i.wait) else {
                    continue;
                };
                // From the last moment a target thread ran on that CPU, or the start of this
                // wait if later (before it, the CPU may have run other tasks).
                let ends = run_ends.get(&c).map_or(&[][..], |v| v.as_slice());
                let k = ends.partition_point(|&e| e <= i.end_ns);
                let last_run = if k > 0 { ends[k - 1] } else { 0 };
                stalls
                    .entry(c)
                    .or_default()
                    .push((last_run.max(i.start_ns), i.end_ns));
            }
        }
        for v in stalls.values_mut() {
            crate::analysis::held::merge_spans(v);
        }
        Self(stalls)
    }

    /// Time of `[s, e)` inside stalls of `cpu`.
    pub(super) fn overlap(&self, cpu: u32, s: u64, e: u64) -> u64 {
        self.0
            .get(&cpu)
            .map_or(0, |v| crate::analysis::held::spans_overlap(v, s, e))
    }
}
