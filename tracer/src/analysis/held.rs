//! What held a request's serving thread up while it was off the CPU, piece by piece: a lock
//! another thread of its process held (a futex wait that thread ended, or that timed out while
//! it ran), or a runtime pause of its process (a garbage collection). Built once per recording
//! for the request decomposition.

use std::collections::HashMap;

use super::wakers::{Classifier, WakerRef};
use crate::recording::{
    Recording,
    timeline::{Interval, State, Timelines, Woken},
    waits::WaitKind,
    wakers::BlockedIn,
};

/// Sorts `v` and merges the spans that overlap.
pub(super) fn merge_spans(v: &mut Vec<(u64, u64)>) {
    v.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(v.len());
    for &(a, b) in v.iter() {
        match merged.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => merged.push((a, b)),
        }
    }
    *v = merged;
}

/// Time of `[s, e)` inside the sorted, merged spans `v`.
pub(super) fn spans_overlap(v: &[(u64, u64)], s: u64, e: u64) -> u64 {
    let from = v.partition_point(|x| x.1 <= s);
    v[from..]
        .iter()
        .take_while(|x| x.0 < e)
        .map(|x| x.1.min(e).saturating_sub(x.0.max(s)))
        .sum()
}

/// A thread's on-CPU stretches, sorted by start, with the longest one's length (for the
/// backward reach of an overlap query).
#[derive(Default)]
struct Runs {
    runs: Vec<(u64, u64, u32)>,
    longest: u64,
}

impl Runs {
    /// `(tid, ns)` of each thread that ran during `[s, e)`, but `not`.
    fn during(&self, s: u64, e: u64, not: u32) -> Vec<(u32, u64)> {
        let from = self
            .runs
            .partition_point(|r| r.0 + self.longest <= s)
            .min(self.runs.len());
        let mut out: Vec<(u32, u64)> = Vec::new();
        for &(a, b, tid) in self.runs[from..].iter().take_while(|r| r.0 < e) {
            let ov = b.min(e).saturating_sub(a.max(s));
            if ov == 0 || tid == not {
                continue;
            }
            match out.iter_mut().find(|(t, _)| *t == tid) {
                Some(x) => x.1 += ov,
                None => out.push((tid, ov)),
            }
        }
        out
    }
}

/// CPython's GIL waiters wait one switch interval at a time (5 ms unless
/// `sys.setswitchinterval` changed it), then ask the holder to drop it: a single futex wait a
/// sibling ended after more than twice that was not for the GIL but for a lock of the
/// program's own (a `threading.Lock`, a queue, a condition).
pub const GIL_WAIT_MAX_NS: u64 = 10_000_000;

/// What a lock wait's piece is put down to.
pub struct LockWait {
    /// The threads that held it, with how much of the piece each accounts for (ns).
    pub holders: Vec<(u32, f64)>,
    /// A single wait, ended by its holder, longer than `GIL_WAIT_MAX_NS`.
    pub long: bool,
    /// The holder ended it (a sibling's futex wakeup), rather than a timeout while the holders
    /// ran: what the holder went through meanwhile can be followed (handoff.rs).
    pub by_holder: bool,
}

/// Per process of the set, its threads' on-CPU stretches and its runtime pauses; and who the
/// wakers were.
pub struct Held<'a> {
    process_of: HashMap<u32, u32>,
    wakers: Classifier<'a>,
    runs: HashMap<u32, Runs>,
    /// Per process, its pauses (start, end), sorted and merged.
    pauses: HashMap<u32, Vec<(u64, u64)>>,
}

impl<'a> Held<'a> {
    pub fn build(rec: &'a Recording, timelines: &Timelines) -> Self {
        let process_of: HashMap<u32, u32> = rec.threads.iter().map(|t| (t.tid, t.pid)).collect();
        let mut runs: HashMap<u32, Runs> = HashMap::new();
        for t in timelines.values() {
            let Some(&pid) = process_of.get(&t.tid) else {
                continue;
            };
            let r = runs.entry(pid).or_default();
            for i in t.intervals.iter().filter(|i| i.state == State::Running) {
                r.runs.push((i.start_ns, i.end_ns, t.tid));
                r.longest = r.longest.max(i.end_ns - i.start_ns);
            }
        }
        for r in runs.values_mut() {
            r.runs.sort_unstable();
        }
        let mut pauses: HashMap<u32, Vec<(u64, u64)>> = HashMap::new();
        for p in &rec.runtime_pauses {
            let pid = process_of.get(&p.tid).copied().unwrap_or(p.pid);
            pauses.entry(pid).or_default().push((p.start_ns, p.end_ns));
        }
        for v in pauses.values_mut() {
            merge_spans(v);
        }
        Self {
            process_of,
            wakers: Classifier::new(rec),
            runs,
            pauses,
        }
    }

    /// Time of `[s, e)` inside a runtime pause of `tid`'s process: while a collection holds
    /// the interpreter, none of its threads runs Python, whichever one collects.
    pub fn paused(&self, tid: u32, s: u64, e: u64) -> u64 {
        self.process_of
            .get(&tid)
            .and_then(|p| self.pauses.get(p))
            .map_or(0, |v| spans_overlap(v, s, e))
    }

    /// Who ended a blocked interval `i` of `tid`; for a handoff (a run-queue wait behind the
    /// thread `tid` exchanges work with), that thread, as if it had woken `tid`. None when
    /// the wakeup was not seen.
    pub fn woken_by(&self, tid: u32, i: &Interval) -> Option<WakerRef> {
        if let Some((WaitKind::Handoff, by)) = i.wait {
            let w = Woken {
                by,
                syscall: None,
                flags: 0,
            };
            return Some(self.wakers.of_woken(tid, &w));
        }
        i.woken.map(|w| self.wakers.of_woken(tid, &w))
    }

    /// Whether the blocked piece `[s, e)` of `i` (a blocked interval of `tid`) was a wait for
    /// a lock another thread of the process held: blocked in a futex, and ended by a thread of
    /// the process, or ended otherwise (a timed wait's timeout: CPython's GIL waits 5 ms at a
    /// time) while threads of the process ran for at least half of it. The holders are the
    /// waker, or the threads that ran, by their time.
    pub fn lock_wait(&self, tid: u32, i: &Interval, s: u64, e: u64) -> Option<LockWait> {
        let w = i.woken?;
        if BlockedIn::of(w.syscall) != BlockedIn::Futex {
            return None;
        }
        let pid = *self.process_of.get(&tid)?;
        let len = e.saturating_sub(s) as f64;
        if w.by != 0 && w.by != tid && self.process_of.get(&w.by) == Some(&pid) {
            return Some(LockWait {
                holders: vec![(w.by, len)],
                long: i.end_ns - i.start_ns > GIL_WAIT_MAX_NS,
                by_holder: true,
            });
        }
        let ran = self.runs.get(&pid)?.during(i.start_ns, i.end_ns, tid);
        let total: u64 = ran.iter().map(|r| r.1).sum();
        let whole = (i.end_ns - i.start_ns).max(1);
        if total * 2 < whole {
            return None;
        }
        Some(LockWait {
            holders: ran
                .into_iter()
                .map(|(t, ns)| (t, len * ns as f64 / total as f64))
                .collect(),
            long: false,
            by_holder: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        recording::testutil::{recording, thread},
        recording::timeline::{ThreadTimeline, Woken},
    };

    fn iv(s: u64, e: u64, state: State, woken: Option<Woken>) -> Interval {
        Interval {
            woken,
            ..Interval::plain(s, e, state, Some(0))
        }
    }

    #[test]
    fn futex_waits_a_sibling_ended_or_outran_are_lock_waits() {
        let rec = recording(vec![thread(1, 0, 0, &[]), thread(2, 0, 0, &[])], vec![]);
        let mut tl = Timelines::new();
        let t = |tid, intervals| {
            let mut t = ThreadTimeline::default();
            t.tid = tid;
            t.intervals = intervals;
            t
        };
        // Thread 2 runs 0-80 and 100-200.
        tl.insert(
            2,
            t(
                2,
                vec![
                    iv(0, 80, State::Running, None),
                    iv(100, 200, State::Running, None),
                ],
            ),
        );
        let held = Held::build(&rec, &tl);
        let futex = 202u32;
        let by = |by, syscall| {
            Some(Woken {
                by,
                syscall,
                flags: 0,
            })
        };
        // Woken by the sibling: all of it is the sibling's.
        let w = held
            .lock_wait(1, &iv(0, 50, State::Blocked, by(2, Some(futex))), 0, 50)
            .unwrap();
        assert_eq!(w.holders, vec![(2, 50.0)]);
        if cfg!(target_arch = "x86_64") {
            // A timeout (the idle task woke it) while the sibling ran 80 of 100 ns: its.
            let w = held
                .lock_wait(1, &iv(0, 100, State::Blocked, by(0, Some(futex))), 0, 100)
                .unwrap();
            assert_eq!(w.holders, vec![(2, 100.0)]);
            // The sibling ran 0 of 20 ns: not held.
            assert!(
                held.lock_wait(1, &iv(80, 100, State::Blocked, by(0, Some(futex))), 80, 100)
                    .is_none()
            );
            // Not a futex (a read): not a lock wait, whoever woke it.
            assert!(
                held.lock_wait(1, &iv(0, 50, State::Blocked, by(2, Some(0))), 0, 50)
                    .is_none()
            );
        }
        assert!(
            held.lock_wait(1, &iv(0, 50, State::Blocked, by(2, None)), 0, 50)
                .is_none()
        );
    }
}
