//! What the page draws, as one compact JSON document: the report (verdict and summary, as
//! `--json` has them) and the recording's series on one time axis, in ns from the window's
//! start. Thread lanes carry their state changes exactly (delta-encoded), or, for a thread with
//! more changes than a page should hold, its running and runnable time per bin: either way the
//! page can draw each pixel's share of every state at any zoom.

use serde::Serialize;

use crate::{
    analysis::report::Report,
    recording::{
        Recording,
        gpu::UtilKind,
        timeline::{self, State},
    },
};

/// Lanes drawn; the rest of the threads are listed as left out.
pub const MAX_LANES: usize = 64;
/// Above this many state changes a lane is sent as bins of the window.
const MAX_EXACT: usize = 20_000;
const LANE_BINS: u64 = 8_192;
const HEAT_BINS: u64 = 1_000;

#[derive(Serialize)]
pub struct Page<'a> {
    pub report: &'a Report,
    pub duration_ns: u64,
    pub lanes: Vec<Lane>,
    /// Threads with a timeline that got no lane.
    pub lanes_left_out: usize,
    pub heat: Option<Heat>,
    pub gpus: Vec<GpuSeries>,
    pub counters: Option<CounterSeries>,
    pub requests: Option<Requests>,
}

/// Instructions per cycle and LLC misses per thousand instructions over all the target's
/// threads, per counter bin (start, ns from the window start), where the counters were read.
#[derive(Serialize)]
pub struct CounterSeries {
    pub t: Vec<u64>,
    pub ipc: Vec<Option<f64>>,
    pub mpki: Vec<Option<f64>>,
}

/// One thread's states over the window. Exact: `t` are the state changes (ns from the window
/// start, delta-encoded: each is the gap after the one before) and `s[i]` the state from
/// `t[i]` to `t[i+1]` (0 running, 1 runnable, 2 blocked); the last entry of `t` ends the last
/// state. Binned: `bin_ns` wide bins from 0, `run`/`rq` the ns of each bin in each state.
#[derive(Serialize, Default)]
pub struct Lane {
    pub tid: u32,
    pub pid: u32,
    pub comm: String,
    pub role: String,
    pub t: Vec<u64>,
    pub s: Vec<u8>,
    pub bin_ns: u64,
    pub run: Vec<u64>,
    pub rq: Vec<u64>,
    /// Synchronizing CUDA calls, requests served and garbage collections, as (start, end)
    /// pairs, delta-encoded.
    pub sync: Vec<u64>,
    pub req: Vec<u64>,
    pub gc: Vec<u64>,
}

/// Run-queue wait per CPU and bin (ns), each wait on the CPU that ended it.
#[derive(Serialize)]
pub struct Heat {
    pub cpus: Vec<u32>,
    pub bin_ns: u64,
    pub wait: Vec<Vec<u64>>,
}

/// One GPU's samples: times (ns from the window start) and the series, `null` where a poll
/// lacked the value.
#[derive(Serialize)]
pub struct GpuSeries {
    pub index: u32,
    pub name: String,
    pub t: Vec<u64>,
    pub util: Vec<Option<u32>>,
    pub sm_clock_mhz: Vec<Option<u32>>,
    pub power_w: Vec<Option<f64>>,
    /// Share of each poll interval some policy held the clocks down (the largest policy).
    pub violation_pct: Vec<Option<f64>>,
    /// The target's SM utilization: (end time, percent) of the driver's averages.
    pub target_sm: Vec<(u64, f64)>,
}

/// Every request wholly in the window, by end time: end (ns from the window start), wall time,
/// serving thread, id; and where each of the report's `requests.slowest[]` is among them
/// (the report's times are the kernel clock's, too large for a browser's numbers).
#[derive(Serialize)]
pub struct Requests {
    pub end: Vec<u64>,
    pub wall: Vec<u64>,
    pub tid: Vec<u32>,
    pub id: Vec<Option<u64>>,
    pub slowest_at: Vec<Option<usize>>,
}

fn delta(v: impl IntoIterator<Item = u64>) -> Vec<u64> {
    let mut last = 0;
    v.into_iter()
        .map(|x| {
            let d = x.saturating_sub(last);
            last = x.max(last);
            d
        })
        .collect()
}

pub fn build<'a>(rec: &Recording, report: &'a Report) -> Page<'a> {
    let (lanes, lanes_left_out) = lanes(rec, report);
    Page {
        report,
        duration_ns: rec.duration_ns(),
        lanes,
        lanes_left_out,
        heat: heat(rec),
        gpus: gpus(rec),
        counters: counters(rec, report),
        requests: requests(rec, report),
    }
}

/// The lanes, grouped by process in the summary's order, the busiest threads first.
fn lanes(rec: &Recording, report: &Report) -> (Vec<Lane>, usize) {
    let s = &report.summary;
    let timelines = rec.threads_over_time();
    let mut rows: Vec<&crate::analysis::summary::ThreadSummary> = s
        .threads
        .iter()
        .filter(|t| timelines.contains_key(&t.tid))
        .collect();
    rows.sort_by_key(|t| {
        let busy = t.totals.time.oncpu_ns + t.totals.time.runq_wait_ns;
        (s.process_rank(t.pid), std::cmp::Reverse(busy), t.tid)
    });
    let left_out = rows.len().saturating_sub(MAX_LANES);
    rows.truncate(MAX_LANES);
    let rel = |ns: u64| ns.saturating_sub(rec.start_ns).min(rec.duration_ns());
    let lanes = rows
        .into_iter()
        .map(|t| {
            let tl = &timelines[&t.tid];
            let mut lane = Lane {
                tid: t.tid,
                pid: t.pid,
                comm: t.comm.clone(),
                role: s.process(t.pid).map_or(String::new(), |p| p.role.clone()),
                ..Default::default()
            };
            states(&mut lane, &tl.intervals, rec.duration_ns(), rel);
            lane.sync = delta(
                timeline::cuda_spans(&rec.cuda_syncs, t.tid)
                    .flat_map(|c| [rel(c.start_ns), rel(c.end_ns)]),
            );
            lane.gc = delta(
                rec.runtime_pauses
                    .iter()
                    .filter(|p| p.tid == t.tid)
                    .flat_map(|p| [rel(p.start_ns), rel(p.end_ns)]),
            );
            if let Some(r) = &rec.requests {
                let spans = r.spans.iter().filter(|x| x.tid == t.tid);
                lane.req = delta(spans.flat_map(|x| [rel(x.start_ns), rel(x.end_ns)]));
            }
            lane
        })
        .collect();
    (lanes, left_out)
}

fn states(
    lane: &mut Lane,
    intervals: &[timeline::Interval],
    window: u64,
    rel: impl Fn(u64) -> u64,
) {
    let code = |s: State| match s {
        State::Running => 0u8,
        State::Runnable => 1,
        State::Blocked => 2,
    };
    if intervals.len() <= MAX_EXACT {
        let mut t = Vec::with_capacity(intervals.len() + 1);
        for i in intervals {
            t.push(rel(i.start_ns));
            lane.s.push(code(i.state));
        }
        t.extend(intervals.last().map(|i| rel(i.end_ns)));
        lane.t = delta(t);
        return;
    }
    let bin = window.div_ceil(LANE_BINS).max(1);
    let n = window.div_ceil(bin) as usize;
    lane.bin_ns = bin;
    lane.run = vec![0; n];
    lane.rq = vec![0; n];
    for i in intervals.iter().filter(|i| i.state != State::Blocked) {
        let into = if i.state == State::Running {
            &mut lane.run
        } else {
            &mut lane.rq
        };
        spread(into, bin, rel(i.start_ns), rel(i.end_ns));
    }
}

/// Adds `[a, b)` to the bins of width `bin` it covers.
fn spread(bins: &mut [u64], bin: u64, a: u64, b: u64) {
    let mut t = a;
    while t < b {
        let col = (t / bin) as usize;
        let until = b.min((col as u64 + 1) * bin);
        if let Some(cell) = bins.get_mut(col) {
            *cell += until - t;
        }
        t = until;
    }
}

fn heat(rec: &Recording) -> Option<Heat> {
    let timelines = rec.threads_over_time();
    let mut cpus: Vec<u32> = rec.host.cpus_online.clone();
    if cpus.is_empty() {
        let max = timelines
            .values()
            .flat_map(|t| t.waits.iter().map(|w| w.1))
            .max()?;
        cpus = (0..=max).collect();
    }
    let window = rec.duration_ns().max(1);
    let bin = window.div_ceil(HEAT_BINS).max(1);
    let n = window.div_ceil(bin) as usize;
    let mut wait = vec![vec![0u64; n]; cpus.len()];
    let switch_ins = rec
        .timeline
        .events
        .iter()
        .filter(|e| e.event_kind() == Ok(tracer_common::EventKind::SwitchIn) && e.value > 0);
    for ev in switch_ins {
        let Some(row) = cpus.iter().position(|&c| c == ev.cpu) else {
            continue;
        };
        let end = ev.ts_ns.min(rec.end_ns);
        let start = ev.ts_ns.saturating_sub(ev.value).max(rec.start_ns);
        let rel = |t: u64| t.saturating_sub(rec.start_ns);
        spread(&mut wait[row], bin, rel(start), rel(end));
    }
    wait.iter().flatten().any(|&w| w > 0).then_some(Heat {
        cpus,
        bin_ns: bin,
        wait,
    })
}

fn gpus(rec: &Recording) -> Vec<GpuSeries> {
    let Some(g) = rec.gpu.as_ref() else {
        return vec![];
    };
    let rel = |t: u64| t.saturating_sub(rec.start_ns);
    g.devices
        .iter()
        .map(|d| {
            let polls: Vec<_> = g
                .polls
                .iter()
                .filter(|p| p.device == d.index && (rec.start_ns..=rec.end_ns).contains(&p.t_ns))
                .collect();
            // Violation counters are cumulative, and read by some polls only (every 2 s):
            // each step between two readings is its share of their gap, drawn at every poll
            // the step covers.
            let mut violation_pct = vec![None; polls.len()];
            let read: Vec<usize> = (0..polls.len())
                .filter(|&i| !polls[i].violation_ns.is_empty())
                .collect();
            for w in read.windows(2) {
                let (a, b) = (polls[w[0]], polls[w[1]]);
                let gap = b.t_ns.saturating_sub(a.t_ns).max(1) as f64;
                let steps = b.violation_ns.iter().zip(&a.violation_ns);
                let held =
                    steps.filter_map(|(b, a)| Some(b.as_ref()?.saturating_sub(*a.as_ref()?)));
                let pct = held.max().map(|ns| (ns as f64 / gap * 100.0).min(100.0));
                violation_pct[w[0] + 1..=w[1]].fill(pct);
            }
            GpuSeries {
                index: d.index,
                name: d.name.clone(),
                t: polls.iter().map(|p| rel(p.t_ns)).collect(),
                util: polls.iter().map(|p| p.util_gpu_pct).collect(),
                sm_clock_mhz: polls.iter().map(|p| p.sm_clock_mhz).collect(),
                power_w: polls
                    .iter()
                    .map(|p| p.power_mw.map(|mw| mw as f64 / 1000.0))
                    .collect(),
                violation_pct,
                target_sm: g
                    .util_samples
                    .iter()
                    .filter(|u| u.device == d.index && u.kind == UtilKind::ProcessSm)
                    .filter(|u| (rec.start_ns..=rec.end_ns).contains(&u.end_ns))
                    .map(|u| (rel(u.end_ns), u.pct))
                    .collect(),
            }
        })
        .collect()
}

fn counters(rec: &Recording, report: &Report) -> Option<CounterSeries> {
    let mut bins: std::collections::BTreeMap<u64, [u64; 3]> = Default::default();
    for b in report.summary.threads.iter().flat_map(|t| &t.counter_bins) {
        let v = &b.values;
        let e = bins
            .entry(b.start_ns.saturating_sub(rec.start_ns))
            .or_default();
        e[0] += v.instructions.unwrap_or(0);
        e[1] += v.cycles.unwrap_or(0);
        e[2] += v.llc_misses.unwrap_or(0);
    }
    if bins.is_empty() {
        return None;
    }
    let ratio = |a: u64, b: u64, k: f64| (b > 0).then(|| a as f64 * k / b as f64);
    Some(CounterSeries {
        t: bins.keys().copied().collect(),
        ipc: bins.values().map(|v| ratio(v[0], v[1], 1.0)).collect(),
        mpki: bins.values().map(|v| ratio(v[2], v[0], 1000.0)).collect(),
    })
}

fn requests(rec: &Recording, report: &Report) -> Option<Requests> {
    let r = rec.requests.as_ref()?;
    let mut spans: Vec<_> = r
        .spans
        .iter()
        .filter(|x| x.start_ns >= rec.start_ns && x.end_ns <= rec.end_ns)
        .collect();
    spans.sort_by_key(|x| x.end_ns);
    let slowest = report
        .summary
        .requests
        .as_ref()
        .map_or(&[][..], |a| &a.slowest[..]);
    let slowest_at = slowest
        .iter()
        .map(|d| {
            spans
                .iter()
                .position(|x| (x.start_ns, x.end_ns, x.tid) == (d.start_ns, d.end_ns, d.tid))
        })
        .collect();
    Some(Requests {
        slowest_at,
        end: spans.iter().map(|x| x.end_ns - rec.start_ns).collect(),
        wall: spans.iter().map(|x| x.wall_ns()).collect(),
        tid: spans.iter().map(|x| x.tid).collect(),
        id: spans.iter().map(|x| x.id).collect(),
    })
}
