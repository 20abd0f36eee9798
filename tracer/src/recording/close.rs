//! Each thread's record: the kernel's account closed against the window's edges, joined with
//! what the other sources kept for it (names, wait samples and kinds, counters, CUDA calls).
//! Pure.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use tracer_common::{FLAG_CREATED, FLAG_EXITED, FLAG_SEEN, ThreadState, ThreadStats};

use super::{
    ProcCounts, ThreadRecord, comm_string, counters::CounterTotals, cuda::CudaTotals,
    samples::WaitSamples, threads, threads::ThreadInfo, waits,
};

/// The switch off the CPU that a thread's own counters, read just after the window, show it
/// made after its last traced switch-in and before the window's end: no program saw it (they
/// were detached, or it was a switch the host does not trace), and the thread's CPU time puts
/// it at `ts_ns`. The timeline ends the thread's last slice there as the totals do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TailSwitch {
    pub ts_ns: u64,
    /// Only its involuntary count moved: it was preempted and waits for a CPU; else it blocked.
    pub preempted: bool,
}

/// The interval after the last event (`tail` ns up to `end`), for a thread the probes last saw
/// switched in: its own counters read just after the window (`after`) say whether it ran all
/// of it. It did not if it switched off the CPU since and no tracepoint reported it (the
/// programs detach just before the window's end; on our VMs, a switch to a thread of PID 1 is
/// never reported): its switch counts moved on. Then it ran what its CPU time moved by since
/// that switch-in (exact: the kernel brings it up to date at every switch), and was off the
/// CPU for the rest. A thread still running has the same switch counts, and its CPU time may
/// lag by a tick (schedstat is the raw `sum_exec_runtime`): it ran all of the tail.
fn running_tail(
    s: &ThreadStats,
    tail: u64,
    end: u64,
    after: Option<&ProcCounts>,
) -> (u64, Option<TailSwitch>) {
    // `seen_*` hold the thread's counters less the probes' own counts at its last reading
    // (tracer-ebpf `remember`): what moved beyond them went unreported.
    let unreported = |kernel: u64, counted: u64, offset: u64| {
        kernel.wrapping_sub(counted).wrapping_sub(offset) as i64
    };
    let Some(a) = after.filter(|_| s.flags & FLAG_SEEN != 0) else {
        return (tail, None);
    };
    let voluntary = unreported(a.voluntary, s.voluntary_switches, s.seen_nvcsw) > 0;
    let involuntary = unreported(a.involuntary, s.involuntary_switches, s.seen_nivcsw) > 0;
    if !voluntary && !involuntary {
        return (tail, None);
    }
    let ran = (unreported(a.oncpu_ns, s.oncpu_ns, s.seen_exec_ns).max(0) as u64).min(tail);
    let switch = (ran < tail).then_some(TailSwitch {
        ts_ns: end - (tail - ran),
        preempted: !voluntary,
    });
    (ran, switch)
}

/// Closes a kernel account against the window `[start, end]`: the interval before the first
/// event goes to the state deduced from it, the interval after the last event to the state the
/// thread is still in.
pub fn close_thread(
    s: &ThreadStats,
    start: u64,
    end: u64,
    comm: Option<&str>,
    samples: WaitSamples,
    after: Option<&ProcCounts>,
) -> ThreadRecord {
    let mut time = threads::StateTimes::from(s);
    let created = s.flags & FLAG_CREATED != 0;
    if !created && s.first_state != ThreadState::Unknown as u32 {
        time.add_in(s.first_state, s.first_ts_ns.saturating_sub(start));
    }
    let mut tail_switch = None;
    if s.state == ThreadState::Running as u32 {
        let (ran, switch) = running_tail(s, end.saturating_sub(s.state_ts_ns), end, after);
        time.oncpu_ns += ran;
        if let Some(sw) = switch {
            let off = end - sw.ts_ns;
            if sw.preempted {
                time.runq_wait_ns += off;
            } else {
                time.blocked_ns += off;
            }
        }
        tail_switch = switch;
    } else if s.state != ThreadState::Unknown as u32 {
        time.add_in(s.state, end.saturating_sub(s.state_ts_ns));
    }
    let kernel_comm = comm_string(&s.comm);
    ThreadRecord {
        tid: s.tid,
        pid: s.tgid,
        // The name the thread has now beats the one it had when first seen; an exited thread
        // keeps the name the kernel saw at exit.
        comm: match comm {
            Some(c) if s.flags & FLAG_EXITED == 0 => c.to_string(),
            _ => kernel_comm,
        },
        created_ns: created.then_some(s.created_ts_ns),
        exited_ns: (s.flags & FLAG_EXITED != 0).then_some(s.exited_ts_ns),
        parent_tid: created.then_some(s.parent_tid),
        totals: threads::ThreadTotals {
            switches: s.into(),
            time,
        },
        runq_waits: s.runq_waits,
        runq_wait_max_ns: s.runq_wait_max_ns,
        runq_wait_log2_hist: s.runq_hist.to_vec(),
        runq_wait_samples: samples,
        counters: None,
        cuda: None,
        wait_classes: Default::default(),
        tail_switch,
    }
}

/// A thread that produced no event in the whole window: it kept the state /proc showed at the
/// start (a thread that is R and never switches is alone on its CPU the whole time).
pub fn quiet_thread(info: &ThreadInfo, start: u64, end: u64) -> ThreadRecord {
    let len = end.saturating_sub(start);
    let running = info.state == 'R';
    ThreadRecord {
        tid: info.tid,
        pid: info.pid,
        comm: info.comm.clone(),
        created_ns: None,
        exited_ns: None,
        parent_tid: None,
        totals: threads::ThreadTotals {
            switches: Default::default(),
            time: threads::StateTimes {
                oncpu_ns: if running { len } else { 0 },
                runq_wait_ns: 0,
                blocked_ns: if running { 0 } else { len },
            },
        },
        runq_waits: 0,
        runq_wait_max_ns: 0,
        runq_wait_log2_hist: vec![0; tracer_common::RUNQ_HIST_SLOTS],
        runq_wait_samples: WaitSamples::default(),
        counters: None,
        cuda: None,
        wait_classes: Default::default(),
        tail_switch: None,
    }
}

/// What the sources produced for the threads, to be joined into thread records.
#[derive(Default)]
pub struct ThreadInputs {
    /// The kernel's per-thread accounts.
    pub kernel: Vec<ThreadStats>,
    /// Threads /proc listed at the start, and at the end (for their current names).
    pub initial: BTreeMap<u32, ThreadInfo>,
    pub final_names: BTreeMap<u32, ThreadInfo>,
    /// Run-queue waits from the timeline.
    pub samples: BTreeMap<u32, WaitSamples>,
    /// Perf counter totals, when counters were open.
    pub counters: BTreeMap<u32, CounterTotals>,
    /// CUDA call accounting, when the uprobes were attached.
    pub cuda: BTreeMap<u32, CudaTotals>,
    /// Run-queue waits by kind.
    pub waits: BTreeMap<u32, waits::WaitClasses>,
    /// The threads' own counters read just after the window (for `close_thread`).
    pub end_counts: BTreeMap<u32, ProcCounts>,
}

/// Joins the inputs into thread records sorted by TID.
pub fn assemble_threads(mut inp: ThreadInputs, start: u64, end: u64) -> Vec<ThreadRecord> {
    let mut out: BTreeMap<u32, ThreadRecord> = BTreeMap::new();
    for s in &inp.kernel {
        let name = inp
            .final_names
            .get(&s.tid)
            .or_else(|| inp.initial.get(&s.tid))
            .map(|i| i.comm.as_str());
        let w = inp.samples.remove(&s.tid).unwrap_or_default();
        let mut rec = close_thread(s, start, end, name, w, inp.end_counts.get(&s.tid));
        rec.counters = inp.counters.remove(&s.tid);
        rec.wait_classes = inp.waits.remove(&s.tid).unwrap_or_default();
        out.insert(s.tid, rec);
    }
    for (tid, info) in &inp.initial {
        out.entry(*tid)
            .or_insert_with(|| quiet_thread(info, start, end));
    }
    for (tid, c) in inp.cuda {
        if let Some(t) = out.get_mut(&tid) {
            t.cuda = Some(c);
        }
    }
    out.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(tid: u32) -> ThreadStats {
        ThreadStats::new(tid, 100)
    }

    #[test]
    fn window_edges_close_the_account() {
        // Blocked before the window, woken at 150, ran 160..400, blocked since 400.
        let mut s = stats(1);
        s.first_state = ThreadState::Blocked as u32;
        s.first_ts_ns = 150;
        s.runq_wait_ns = 10;
        s.oncpu_ns = 240;
        s.state = ThreadState::Blocked as u32;
        s.state_ts_ns = 400;
        let r = close_thread(&s, 100, 1000, None, WaitSamples::default(), None);
        assert_eq!(r.totals.time.blocked_ns, 50 + 600);
        assert_eq!(r.totals.time.oncpu_ns, 240);
        assert_eq!(r.totals.time.runq_wait_ns, 10);
        assert_eq!(r.totals.time.alive_ns(), 900);
    }

    #[test]
    fn created_and_dead_threads_cover_only_their_life() {
        let mut s = stats(2);
        s.flags = FLAG_CREATED | FLAG_EXITED;
        s.created_ts_ns = 300;
        s.exited_ts_ns = 700;
        s.first_state = ThreadState::New as u32;
        s.first_ts_ns = 300;
        s.blocked_ns = 5;
        s.runq_wait_ns = 15;
        s.oncpu_ns = 380;
        s.state = ThreadState::Dead as u32;
        s.state_ts_ns = 700;
        s.comm = *b"worker\0\0\0\0\0\0\0\0\0\0";
        let r = close_thread(&s, 100, 1000, Some("renamed"), WaitSamples::default(), None);
        assert_eq!(r.totals.time.alive_ns(), 400);
        assert_eq!(r.created_ns, Some(300));
        assert_eq!(r.exited_ns, Some(700));
        // An exited thread keeps its kernel-side name: /proc no longer knows it.
        assert_eq!(r.comm, "worker");
    }

    #[test]
    fn an_unreported_switch_off_the_cpu_ends_the_running_tail() {
        // Seen blocked from the window's start (100), switched in at 400 having run 5 us in
        // all and switched 10 times; still "running" at the window's end (1000) as far as the
        // probes know.
        let mut s = stats(3);
        s.first_state = ThreadState::Blocked as u32;
        s.first_ts_ns = 100;
        s.state = ThreadState::Running as u32;
        s.state_ts_ns = 400;
        s.flags |= FLAG_SEEN;
        // The counters less the probes' own counts (tracer-ebpf `remember`).
        s.seen_exec_ns = 5_000;
        (s.seen_nvcsw, s.seen_nivcsw) = (8, 2);
        let after = |oncpu_ns, voluntary| ProcCounts {
            t_ns: 1_010,
            oncpu_ns,
            voluntary,
            involuntary: 2,
        };
        let close = |s: &ThreadStats, after: &ProcCounts| {
            close_thread(s, 100, 1000, None, WaitSamples::default(), Some(after))
        };
        // It blocked after 50 ns, unreported: 50 on the CPU, the rest blocked.
        let r = close(&s, &after(5_050, 9));
        assert_eq!(
            (r.totals.time.oncpu_ns, r.totals.time.blocked_ns),
            (50, 550)
        );
        let blocked_at = TailSwitch {
            ts_ns: 450,
            preempted: false,
        };
        assert_eq!(r.tail_switch, Some(blocked_at));
        // Preempted after 50 ns instead: the rest is a wait for a CPU.
        let preempted = ProcCounts {
            involuntary: 3,
            ..after(5_050, 8)
        };
        let r = close(&s, &preempted);
        let t = r.totals.time;
        assert_eq!((t.oncpu_ns, t.runq_wait_ns, t.blocked_ns), (50, 550, 0));
        assert!(r.tail_switch.unwrap().preempted);
        // Still running: no switch since, and its CPU time lags (not updated since a tick).
        let r = close(&s, &after(5_100, 8));
        assert_eq!((r.totals.time.oncpu_ns, r.totals.time.blocked_ns), (600, 0));
        assert_eq!(r.tail_switch, None);
        // Without its counters (classic tracepoints), the tail runs to the end as before.
        s.flags &= !FLAG_SEEN;
        let r = close(&s, &after(5_050, 9));
        assert_eq!(r.totals.time.oncpu_ns, 600);
        assert_eq!(r.tail_switch, None);
    }

    #[test]
    fn threads_without_events_keep_their_start_state() {
        let mut initial = BTreeMap::new();
        initial.insert(
            5,
            ThreadInfo {
                tid: 5,
                pid: 5,
                comm: "sleeper".into(),
                state: 'S',
            },
        );
        initial.insert(
            6,
            ThreadInfo {
                tid: 6,
                pid: 5,
                comm: "spinner".into(),
                state: 'R',
            },
        );
        let mut s = stats(7);
        s.first_state = ThreadState::Running as u32;
        s.first_ts_ns = 200;
        s.state = ThreadState::Runnable as u32;
        s.state_ts_ns = 200;
        s.involuntary_switches = 1;
        let threads = assemble_threads(
            ThreadInputs {
                kernel: vec![s],
                initial,
                ..Default::default()
            },
            0,
            1000,
        );
        let tids: Vec<u32> = threads.iter().map(|t| t.tid).collect();
        assert_eq!(tids, vec![5, 6, 7]);
        assert_eq!(threads[0].totals.time.blocked_ns, 1000);
        assert_eq!(threads[1].totals.time.oncpu_ns, 1000);
        assert_eq!(threads[2].totals.time.oncpu_ns, 200);
        assert_eq!(threads[2].totals.time.runq_wait_ns, 800);
    }
}
