//! Following the queue. A request that arrives while its serving thread is still on earlier
//! requests waits; the decomposition counts the thread's on-CPU time in that wait as
//! `queued_oncpu`. That is an effect. Here each stretch of it is put down to what the thread
//! was doing then: it was serving an earlier request H (the head of the line).
//!
//! - While H was within its normal time (its start plus the median request's wall time), the
//!   wait is ordinary queueing: arrivals came faster than normal service (`Backlog`).
//! - Past it, H was late, and why H was late is why the queue was still there: H's own
//!   excess over the median request, part by part: its longer on-CPU work (`Own(H)` when H is
//!   a long request, `long_requests`: head-of-line blocking; else the `oncpu` part), its run-queue waits, lock waits,
//!   pauses, GPU waits, ... (`Part`), and the queue H itself waited in, already resolved the
//!   same way (requests are taken in order of their end, so H's is known first). So a chain
//!   of requests behind one long request, or behind one garbage collection, ends at it, however
//!   many requests deep.
//!
//! The shares of one request's queued time add up to it exactly. Pure.

use std::collections::HashMap;

use super::{Breakdown, RequestDetail};

/// Where a piece of queued time went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Key {
    /// The on-CPU work of the request at this index (into the decomposed requests) beyond the
    /// median request's.
    Own(usize),
    /// A part of the earlier requests' excess, as the index of a `Breakdown` field.
    Part(usize),
    /// Earlier requests served in normal time: arrivals outpaced service.
    Backlog,
}

/// Per request, its queued on-CPU time as stretches of the serving thread's time:
/// (start, end, ns of queued time per ns of the stretch).
pub type QueuedSpans = Vec<(u64, u64, f64)>;

/// What a request normally is: the median requests' wall time and mean parts.
pub struct Normal {
    pub wall_ns: f64,
    pub parts: Breakdown,
}

/// Index of `oncpu` and of `queued_oncpu` among `Breakdown::FIELDS`.
const ONCPU: usize = 0;
const QUEUED: usize = 1;

/// The queued time of every request, split by `Key`. `details` in order of their end, as the
/// decomposition produced them; `spans[i]` the queued stretches of `details[i]`.
pub fn chase(
    details: &[RequestDetail],
    spans: &[QueuedSpans],
    normal: &Normal,
) -> Vec<Vec<(Key, f64)>> {
    // Per serving thread, its requests in order of their end.
    let mut by_thread: HashMap<u32, Vec<usize>> = HashMap::new();
    for (i, d) in details.iter().enumerate() {
        by_thread.entry(d.tid).or_default().push(i);
    }
    let long = long_requests(details, &by_thread, normal);
    let mut out: Vec<Vec<(Key, f64)>> = vec![Vec::new(); details.len()];
    for (i, d) in details.iter().enumerate() {
        let line = &by_thread[&d.tid];
        let mut split: Vec<(Key, f64)> = Vec::new();
        for &(a, b, density) in &spans[i] {
            let mut t = a;
            while t < b {
                let Some(h) = head(details, line, t, i) else {
                    add(&mut split, Key::Backlog, (b - t) as f64 * density);
                    break;
                };
                let until = b.min(details[h].end_ns);
                let due = details[h].start_ns.saturating_add(normal.wall_ns as u64);
                let on_time = until.min(due).saturating_sub(t) as f64 * density;
                let late = until.saturating_sub(due.max(t)) as f64 * density;
                add(&mut split, Key::Backlog, on_time);
                if late > 0.0 {
                    spread(
                        &mut split,
                        &excess((h, long[h]), &details[h], &out[h], normal),
                        late,
                    );
                }
                t = until;
            }
        }
        split.retain(|(_, ns)| *ns > 0.0);
        out[i] = split;
    }
    out
}

/// The request thread `line` was serving at `t`: of its requests under way at `t` (started,
/// not ended), the one to end first; not `me`, the request waiting. Requests end in order on
/// a serving loop, so the search is short; it gives up after a few steps rather than go
/// quadratic on a thread with thousands of requests in flight.
fn head(details: &[RequestDetail], line: &[usize], t: u64, me: usize) -> Option<usize> {
    let from = line.partition_point(|&j| details[j].end_ns <= t);
    line[from..]
        .iter()
        .take(64)
        .copied()
        .find(|&j| j != me && details[j].start_ns <= t)
}

/// Why request `h` took longer than a normal one, as weights: its parts beyond the median
/// requests' (its longer on-CPU work as `Own(h)`), and its own queueing beyond the median's,
/// by what `queued` (its resolved queue) says that was.
fn excess(
    (h, long): (usize, bool),
    d: &RequestDetail,
    queued: &[(Key, f64)],
    normal: &Normal,
) -> Vec<(Key, f64)> {
    let (mine, usual) = (d.parts.values(), normal.parts.values());
    let mut w: Vec<(Key, f64)> = Vec::new();
    for (k, (m, u)) in mine.iter().zip(usual).enumerate() {
        let over = (m - u).max(0.0);
        match k {
            ONCPU if long => add(&mut w, Key::Own(h), over),
            QUEUED => {
                let total: f64 = queued.iter().map(|(_, ns)| ns).sum();
                if total > 0.0 {
                    for &(key, ns) in queued {
                        add(&mut w, key, over * ns / total);
                    }
                } else {
                    add(&mut w, Key::Backlog, over);
                }
            }
            _ => add(&mut w, Key::Part(k), over),
        }
    }
    w
}

/// A request is long, its own work a head-of-line blocker, when it was on a CPU at least
/// `LONG_RATIO` times as long as the median request and as the median of its neighbours on
/// its thread (`NEIGHBOURS` either side), and `LONG_MIN_NS` longer than the median request.
/// Head-of-line is a few requests carrying long work among normal ones (the requests behind
/// such tails in real servers are 50-200 times the median: a long prompt's tokenization,
/// docs/ATTRIBUTION.md). On-CPU time that grew for every request of a stretch (cache thrash
/// here made a run of consecutive requests 4-5 times slower) is the `oncpu` part and keeps
/// its own cause.
pub const LONG_RATIO: f64 = 5.0;
pub const LONG_MIN_NS: f64 = 1_000_000.0;
const NEIGHBOURS: usize = 4;

fn long_requests(
    details: &[RequestDetail],
    by_thread: &HashMap<u32, Vec<usize>>,
    normal: &Normal,
) -> Vec<bool> {
    let usual = normal.parts.oncpu_ns;
    let mut long = vec![false; details.len()];
    for line in by_thread.values() {
        for (k, &i) in line.iter().enumerate() {
            let own = details[i].parts.oncpu_ns;
            if own < LONG_RATIO * usual || own - usual < LONG_MIN_NS {
                continue;
            }
            let mut near: Vec<f64> = line
                [k.saturating_sub(NEIGHBOURS)..(k + NEIGHBOURS + 1).min(line.len())]
                .iter()
                .filter(|&&j| j != i)
                .map(|&j| details[j].parts.oncpu_ns)
                .collect();
            near.sort_by(f64::total_cmp);
            let local = near.get(near.len() / 2).copied().unwrap_or(0.0);
            long[i] = own >= LONG_RATIO * local;
        }
    }
    long
}

/// Adds `ns` to `key`'s entry.
fn add(v: &mut Vec<(Key, f64)>, key: Key, ns: f64) {
    if ns <= 0.0 {
        return;
    }
    match v.iter_mut().find(|(k, _)| *k == key) {
        Some(e) => e.1 += ns,
        None => v.push((key, ns)),
    }
}

/// Spreads `ns` over `weights` in proportion; all to `Backlog` when they are all zero (the
/// request was late by no part we measured).
fn spread(v: &mut Vec<(Key, f64)>, weights: &[(Key, f64)], ns: f64) {
    let total: f64 = weights.iter().map(|(_, w)| w).sum();
    if total <= 0.0 {
        add(v, Key::Backlog, ns);
        return;
    }
    for &(key, w) in weights {
        add(v, key, ns * w / total);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn req(start: u64, end: u64, parts: Breakdown) -> RequestDetail {
        RequestDetail {
            start_ns: start,
            end_ns: end,
            tid: 7,
            id: None,
            wall_ns: end - start,
            parts,
            migrations: 0,
            cuda_device_sync_ns: 0.0,
            llc_misses: None,
            instructions: None,
            lock_holders: vec![],
            blocked_by: vec![],
            queued_by: vec![],
            held_up_others_ns: 0.0,
        }
    }

    fn oncpu(ms: f64, queued_ms: f64) -> Breakdown {
        Breakdown {
            oncpu_ns: ms * 1e6,
            queued_oncpu_ns: queued_ms * 1e6,
            ..Breakdown::default()
        }
    }

    fn normal() -> Normal {
        Normal {
            wall_ns: 1e6,
            parts: oncpu(1.0, 0.0),
        }
    }

    fn total(split: &[(Key, f64)]) -> f64 {
        split.iter().map(|(_, ns)| ns).sum()
    }

    #[test]
    fn the_part_indices_are_the_fields() {
        let f = Breakdown::FIELDS;
        assert_eq!((f[ONCPU], f[QUEUED]), ("oncpu", "queued_oncpu"));
    }

    #[test]
    fn a_chain_behind_one_long_request_ends_at_it() {
        // L works 60 ms; B arrives at 10 ms and waits for it; C arrives at 20 ms and waits for
        // L, then for B, which was late only because it waited for L.
        let details = [
            req(0, 60 * MS, oncpu(60.0, 0.0)),
            req(10 * MS, 61 * MS, oncpu(1.0, 50.0)),
            req(20 * MS, 62 * MS, oncpu(1.0, 41.0)),
        ];
        let spans = vec![
            vec![],
            vec![(10 * MS, 60 * MS, 1.0)],
            vec![(20 * MS, 61 * MS, 1.0)],
        ];
        let out = chase(&details, &spans, &normal());
        assert_eq!(out[1], vec![(Key::Own(0), 50e6)]);
        assert_eq!(out[2].len(), 1, "{:?}", out[2]);
        assert_eq!(out[2][0].0, Key::Own(0));
        assert!((total(&out[2]) - 41e6).abs() < 1.0, "{:?}", out[2]);
    }

    #[test]
    fn waiting_behind_requests_served_in_normal_time_is_backlog() {
        // A is served in its normal 1 ms; B arrived half-way through it.
        let details = [
            req(0, MS, oncpu(1.0, 0.0)),
            req(MS / 2, 2 * MS, oncpu(1.0, 0.5)),
        ];
        let spans = vec![vec![], vec![(MS / 2, MS, 1.0)]];
        let out = chase(&details, &spans, &normal());
        assert_eq!(out[1], vec![(Key::Backlog, 0.5e6)]);
    }

    #[test]
    fn an_earlier_request_late_for_a_pause_passes_the_pause_on() {
        // A was stopped by a 30 ms pause and then worked 1 ms: B, arriving at 5 ms, waited
        // past A's normal end for that reason. The density halves the queued time (a part of
        // the stretch went to the GPU, say): the split follows it.
        let pause = Breakdown {
            runtime_pause_ns: 30e6,
            ..oncpu(1.0, 0.0)
        };
        let details = [
            req(0, 31 * MS, pause),
            req(5 * MS, 32 * MS, oncpu(1.0, 13.0)),
        ];
        let spans = vec![vec![], vec![(5 * MS, 31 * MS, 0.5)]];
        let out = chase(&details, &spans, &normal());
        let pause_part = Breakdown::FIELDS
            .iter()
            .position(|f| *f == "runtime_pause")
            .unwrap();
        assert_eq!(out[1], vec![(Key::Part(pause_part), 13e6)]);
    }

    #[test]
    fn time_no_earlier_request_covers_is_backlog_not_lost() {
        let details = [req(10 * MS, 20 * MS, oncpu(1.0, 5.0))];
        let spans = vec![vec![(10 * MS, 15 * MS, 1.0)]];
        let out = chase(&details, &spans, &normal());
        assert_eq!(out[0], vec![(Key::Backlog, 5e6)]);
    }

    #[test]
    fn a_stretch_of_slow_requests_is_longer_on_cpu_time_not_head_of_line() {
        // Five requests in a row each on a CPU 10 ms (ten times the median), arriving 1 ms
        // apart: every one is slow, none is a long one among normal ones.
        let details: Vec<RequestDetail> = (0..5u64)
            .map(|k| req(k * MS, (k + 1) * 10 * MS, oncpu(10.0, (9 * k) as f64)))
            .collect();
        let spans: Vec<QueuedSpans> = (0..5u64)
            .map(|k| {
                if k == 0 {
                    vec![]
                } else {
                    vec![(k * MS, k * 10 * MS, 1.0)]
                }
            })
            .collect();
        let out = chase(&details, &spans, &normal());
        for split in &out[1..] {
            assert!(
                split.iter().all(|(key, _)| *key == Key::Part(ONCPU)),
                "{split:?}"
            );
        }
    }
}
