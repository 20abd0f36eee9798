//! Consecutive windows of one long recording (`tracer watch`): the kernel keeps running totals,
//! so a window's accounts are what the totals moved by since the last window. Pure.
//!
//! A window's recording starts as the cumulative one (every account closed at the window's
//! end, as `attach` would close them, from the first window's start) with the window's own
//! timeline data (wait samples and kinds, requests, pauses, CUDA spans); `Reported::take`
//! turns it into the window's by taking off what earlier windows reported. What is taken off
//! is the sum of what was reported, not the last cumulative value: a thread that changed state
//! while the accounts were read (a few microseconds) was closed in the state it was leaving,
//! and the cumulative value of that state can step back at the next reading. The window then
//! reports nothing for it (not a negative time), and the next windows catch up, so the windows
//! always add up to the whole run (`tests/tests/watch.rs`).

use std::collections::BTreeMap;

use super::{
    CudaTotals, Losses, MigrationRoute, Recording, ThreadRecord, counters::CounterTotals,
    threads::ThreadTotals, wakers::WakerRecord,
};

/// What the windows so far reported of one thread.
#[derive(Debug, Clone, Default)]
struct ThreadSoFar {
    /// Tells a new thread that reuses a TID from the one reported.
    created_ns: Option<u64>,
    exited_ns: Option<u64>,
    totals: ThreadTotals,
    runq_waits: u64,
    runq_wait_max_ns: u64,
    hist: Vec<u32>,
    counters: Option<CounterTotals>,
    cuda: Option<CudaTotals>,
}

use super::wakers::WakerKeyOf as WakerKey;

/// The sums of what the windows so far reported, by account.
#[derive(Debug, Clone, Default)]
pub struct Reported {
    threads: BTreeMap<u32, ThreadSoFar>,
    preemptors: BTreeMap<(u32, u32), (u64, u64)>,
    routes: BTreeMap<(u32, u32, u32), u64>,
    wakers: BTreeMap<WakerKey, (u64, u64, u64, Vec<u32>)>,
    losses: Losses,
}

/// `cur - *so_far`, clamped at 0, and `*so_far` advanced by it.
fn step(cur: u64, so_far: &mut u64) -> u64 {
    let d = cur.saturating_sub(*so_far);
    *so_far += d;
    d
}

fn step_hist(cur: &mut [u32], so_far: &mut Vec<u32>) {
    so_far.resize(cur.len().max(so_far.len()), 0);
    for (c, s) in cur.iter_mut().zip(so_far.iter_mut()) {
        let d = c.saturating_sub(*s);
        *s += d;
        *c = d;
    }
}

fn step_totals(cur: &mut ThreadTotals, s: &mut ThreadTotals) {
    let (c, so) = (&mut cur.switches, &mut s.switches);
    c.voluntary_switches = step(c.voluntary_switches, &mut so.voluntary_switches);
    c.involuntary_switches = step(c.involuntary_switches, &mut so.involuntary_switches);
    c.migrations = step(c.migrations, &mut so.migrations);
    c.wakeups = step(c.wakeups, &mut so.wakeups);
    let (c, so) = (&mut cur.time, &mut s.time);
    c.oncpu_ns = step(c.oncpu_ns, &mut so.oncpu_ns);
    c.runq_wait_ns = step(c.runq_wait_ns, &mut so.runq_wait_ns);
    c.blocked_ns = step(c.blocked_ns, &mut so.blocked_ns);
}

fn step_counters(cur: &mut CounterTotals, s: &mut CounterTotals) {
    for i in 0..cur.scaled.len() {
        cur.scaled[i] = step(cur.scaled[i], &mut s.scaled[i]);
        cur.raw[i] = step(cur.raw[i], &mut s.raw[i]);
        cur.enabled_ns[i] = step(cur.enabled_ns[i], &mut s.enabled_ns[i]);
        cur.running_ns[i] = step(cur.running_ns[i], &mut s.running_ns[i]);
    }
}

/// A maximum is not a running total: a larger one than any reported happened in this
/// window; else this window's is what its own samples say (`own`), or, with none, unknown
/// but at most the one reported, which is given.
fn step_max(cur: u64, so_far: &mut u64, own: Option<u64>) -> u64 {
    if cur > *so_far {
        *so_far = cur;
        cur
    } else {
        own.unwrap_or(cur)
    }
}

fn step_cuda(cur: &mut CudaTotals, s: &mut CudaTotals, own_max: Option<u64>) {
    cur.launches = step(cur.launches, &mut s.launches);
    cur.sync_calls = step(cur.sync_calls, &mut s.sync_calls);
    cur.sync_ns = step(cur.sync_ns, &mut s.sync_ns);
    cur.lost_returns = step(cur.lost_returns, &mut s.lost_returns);
    cur.sync_max_ns = if cur.sync_calls == 0 {
        // Keep the running maximum up to date without reporting it here.
        s.sync_max_ns = s.sync_max_ns.max(cur.sync_max_ns);
        0
    } else {
        step_max(cur.sync_max_ns, &mut s.sync_max_ns, own_max)
    };
}

impl Reported {
    /// Turns `rec`, cumulative from the run's start and closed at `window_start`..`rec.end_ns`'s
    /// end, into the window `[window_start, rec.end_ns]`, and adds it to what was reported.
    pub fn take(&mut self, rec: &mut Recording, window_start: u64) {
        rec.start_ns = window_start;
        let sync_max = own_sync_max(rec);
        let mut threads = std::mem::take(&mut rec.threads);
        threads.retain_mut(|t| self.take_thread(t, window_start, sync_max.get(&t.tid).copied()));
        rec.threads = threads;
        let mut preemptors = std::mem::take(&mut rec.preemptors);
        preemptors.retain_mut(|p| {
            let s = self.preemptors.entry((p.pid, p.tgid)).or_default();
            p.wait_ns = step(p.wait_ns, &mut s.0);
            p.slices = step(p.slices, &mut s.1);
            // The handoffs are the window's own (its records'), the wait cumulative until here.
            p.handoff_ns = p.handoff_ns.min(p.wait_ns);
            p.slices > 0 || p.wait_ns > 0
        });
        rec.preemptors = preemptors;
        rec.migration_routes.retain_mut(|r: &mut MigrationRoute| {
            let s = self
                .routes
                .entry((r.tid, r.from_cpu, r.to_cpu))
                .or_default();
            r.count = step(r.count, s);
            r.count > 0
        });
        rec.wakers.retain_mut(|w: &mut WakerRecord| {
            let s = self.wakers.entry(w.key()).or_default();
            w.blocked_ns = step(w.blocked_ns, &mut s.0);
            w.count = step(w.count, &mut s.1);
            w.max_ns = step_max(w.max_ns, &mut s.2, None);
            step_hist(&mut w.hist, &mut s.3);
            w.count > 0
        });
        self.take_losses(&mut rec.losses);
    }

    /// One thread's window; false when it has nothing in it (it ended before the window).
    fn take_thread(&mut self, t: &mut ThreadRecord, start: u64, sync_max: Option<u64>) -> bool {
        if t.exited_ns.is_some_and(|e| e < start) {
            self.threads.remove(&t.tid);
            return false;
        }
        let s = self.threads.entry(t.tid).or_default();
        if s.created_ns != t.created_ns && s.exited_ns.is_some() {
            // The TID stands for another thread now.
            *s = ThreadSoFar::default();
        }
        s.created_ns = t.created_ns;
        s.exited_ns = t.exited_ns;
        step_totals(&mut t.totals, &mut s.totals);
        t.runq_waits = step(t.runq_waits, &mut s.runq_waits);
        let own_max =
            (!t.runq_wait_samples.is_empty()).then(|| t.runq_wait_samples.value_at_quantile(1.0));
        t.runq_wait_max_ns = if t.runq_waits == 0 {
            s.runq_wait_max_ns = s.runq_wait_max_ns.max(t.runq_wait_max_ns);
            0
        } else {
            step_max(t.runq_wait_max_ns, &mut s.runq_wait_max_ns, own_max)
        };
        step_hist(&mut t.runq_wait_log2_hist, &mut s.hist);
        if let Some(c) = t.counters.as_mut() {
            step_counters(c, s.counters.get_or_insert_with(Default::default));
        }
        if let Some(c) = t.cuda.as_mut() {
            step_cuda(c, s.cuda.get_or_insert_with(Default::default), sync_max);
        }
        // Born or parented before the window: not news in it.
        if t.created_ns.is_some_and(|c| c < start) {
            t.created_ns = None;
            t.parent_tid = None;
        }
        true
    }

    fn take_losses(&mut self, l: &mut Losses) {
        let s = &mut self.losses;
        l.ringbuf_dropped = step(l.ringbuf_dropped, &mut s.ringbuf_dropped);
        l.thread_map_full = step(l.thread_map_full, &mut s.thread_map_full);
        l.preemptor_map_full = step(l.preemptor_map_full, &mut s.preemptor_map_full);
        l.migration_map_full = step(l.migration_map_full, &mut s.migration_map_full);
        l.child_map_full = step(l.child_map_full, &mut s.child_map_full);
        l.waker_map_full = step(l.waker_map_full, &mut s.waker_map_full);
        l.unseen_switch_ins = step(l.unseen_switch_ins, &mut s.unseen_switch_ins);
        l.unseen_switch_outs = step(l.unseen_switch_outs, &mut s.unseen_switch_outs);
        l.unseen_wakeups = step(l.unseen_wakeups, &mut s.unseen_wakeups);
        l.perf_read_failed = step(l.perf_read_failed, &mut s.perf_read_failed);
        l.clock_checks = step(l.clock_checks, &mut s.clock_checks);
        l.clock_error_ns = step(l.clock_error_ns, &mut s.clock_error_ns);
    }

    /// Forgets the threads `dead`, wholly accounted: no later window has anything of theirs.
    pub fn forget(&mut self, dead: &std::collections::BTreeSet<u32>) {
        self.threads.retain(|tid, _| !dead.contains(tid));
    }

    /// Forgets what was reported of the blocked time, the moves and the waiting caused of
    /// threads `gone`, whose kernel entries were taken out
    /// (`SchedProbes::forget_thread_accounts`): an entry made again under one of their TIDs (a
    /// new thread) counts from 0.
    pub fn forget_thread_accounts(&mut self, gone: &std::collections::BTreeSet<u32>) {
        self.wakers.retain(|k, _| !gone.contains(&k.0));
        self.routes.retain(|k, _| !gone.contains(&k.0));
        // The waiting they caused others, kept in their own thread entries.
        self.preemptors.retain(|k, _| !gone.contains(&k.0));
    }

    /// How many counts of blocked time ended by a task were reported, in all (those the
    /// idle task or an interrupt ended are never taken out).
    pub fn wakers_known(&self) -> usize {
        self.wakers.keys().filter(|k| k.1 != 0).count()
    }

    /// The counts of blocked time reported in an earlier window that did not grow in `window`
    /// (a window `take` made), ended by a task (not an interrupt or the idle task): the ones
    /// whose kernel entries may be taken out once the waker has exited. Each with what was
    /// reported of it (blocked time, count).
    pub fn quiet_wakers(&self, window: &Recording) -> BTreeMap<WakerKey, (u64, u64)> {
        let active: std::collections::BTreeSet<WakerKey> =
            window.wakers.iter().map(WakerRecord::key).collect();
        self.wakers
            .iter()
            .filter(|(k, _)| k.1 != 0 && !active.contains(k))
            .map(|(k, s)| (*k, (s.0, s.1)))
            .collect()
    }

    /// Forgets the counts `keys`, whose kernel entries were taken out.
    pub fn forget_wakers(&mut self, keys: &std::collections::BTreeSet<WakerKey>) {
        self.wakers.retain(|k, _| !keys.contains(k));
    }

    /// How many tasks outside the target that ran while target threads waited were reported,
    /// in all (a target thread's waiting caused is kept in its own entry).
    pub fn preemptors_known(&self) -> usize {
        self.preemptors
            .keys()
            .filter(|k| !self.threads.contains_key(&k.0))
            .count()
    }

    /// The tasks reported in an earlier window that did not run while target threads waited
    /// in `window` (a window `take` made: it lists only those that did), but for the idle
    /// task and the target's threads: the ones whose kernel entries may be taken out once
    /// they have exited. Each with the totals reported of it (wait, slices).
    pub fn quiet_preemptors(&self, window: &Recording) -> Vec<(u32, (u64, u64))> {
        let active: std::collections::BTreeSet<(u32, u32)> =
            window.preemptors.iter().map(|p| (p.pid, p.tgid)).collect();
        self.preemptors
            .iter()
            .filter(|(k, _)| k.0 != 0 && !active.contains(k) && !self.threads.contains_key(&k.0))
            .map(|(k, &v)| (k.0, v))
            .collect()
    }

    /// Forgets the tasks `pids`, whose kernel entries were taken out: one made again under a
    /// PID counts from 0.
    pub fn forget_preemptors(&mut self, pids: &std::collections::BTreeSet<u32>) {
        self.preemptors.retain(|k, _| !pids.contains(&k.0));
    }
}

/// Consecutive windows as one recording (the flight recorder's file): what they accounted,
/// added up; the timeline's data (pauses, wait kinds, bins, requests from markers) is not,
/// since it is rebuilt from the records the file holds when it is read back. Requests from a
/// latency log are joined (`logged_requests`). None for no window.
pub fn merge(windows: &[Recording]) -> Option<Recording> {
    let (first, rest) = windows.split_first()?;
    let mut out = first.clone();
    for w in rest {
        add_window(&mut out, w);
    }
    out.requests = logged_requests(windows, out.start_ns).or(out.requests);
    Some(out)
}

/// The windows' requests from a latency log, as one recording's: each window holds those that
/// ended in it, so they add up without overlap; one begun before the first window is not
/// wholly inside and counts as unpaired, as in a single recording. (A request unpaired in its
/// window, begun two windows back, stays unpaired.)
fn logged_requests(windows: &[Recording], start_ns: u64) -> Option<super::requests::RequestSet> {
    let mut sets = windows
        .iter()
        .filter_map(|w| w.requests.as_ref().filter(|r| r.from_log()));
    let mut out = sets.next()?.clone();
    for r in sets {
        out.spans.extend_from_slice(&r.spans);
        out.unpaired += r.unpaired;
    }
    let before = out.spans.len();
    out.spans.retain(|s| s.start_ns >= start_ns);
    out.unpaired += (before - out.spans.len()) as u64;
    Some(out)
}

fn add_thread(t: &mut ThreadRecord, w: &ThreadRecord) {
    t.totals += w.totals;
    t.runq_waits += w.runq_waits;
    t.runq_wait_max_ns = t.runq_wait_max_ns.max(w.runq_wait_max_ns);
    if t.runq_wait_log2_hist.len() < w.runq_wait_log2_hist.len() {
        t.runq_wait_log2_hist.resize(w.runq_wait_log2_hist.len(), 0);
    }
    for (a, b) in t.runq_wait_log2_hist.iter_mut().zip(&w.runq_wait_log2_hist) {
        *a += b;
    }
    match (t.counters.as_mut(), &w.counters) {
        (Some(a), Some(b)) => {
            for i in 0..a.scaled.len() {
                a.scaled[i] += b.scaled[i];
                a.raw[i] += b.raw[i];
                a.enabled_ns[i] += b.enabled_ns[i];
                a.running_ns[i] += b.running_ns[i];
            }
        }
        (None, Some(b)) => t.counters = Some(*b),
        _ => {}
    }
    match (t.cuda.as_mut(), &w.cuda) {
        (Some(a), Some(b)) => {
            a.launches += b.launches;
            a.sync_calls += b.sync_calls;
            a.sync_ns += b.sync_ns;
            a.lost_returns += b.lost_returns;
            a.sync_max_ns = a.sync_max_ns.max(b.sync_max_ns);
        }
        (None, Some(b)) => t.cuda = Some(*b),
        _ => {}
    }
    t.exited_ns = w.exited_ns;
    // A later window's records go on past an earlier one's end.
    t.tail_switch = w.tail_switch;
    t.comm = w.comm.clone();
}

fn add_window(out: &mut Recording, w: &Recording) {
    out.end_ns = w.end_ns;
    out.end_reason = w.end_reason;
    out.target_exited_ns = w.target_exited_ns;
    let mut threads: BTreeMap<u32, ThreadRecord> = std::mem::take(&mut out.threads)
        .into_iter()
        .map(|t| (t.tid, t))
        .collect();
    for t in &w.threads {
        match threads.get_mut(&t.tid) {
            // A TID another thread had before: the later one is listed (one record per TID).
            Some(a) if t.created_ns.is_some() && a.exited_ns.is_some() => *a = t.clone(),
            Some(a) => add_thread(a, t),
            None => {
                threads.insert(t.tid, t.clone());
            }
        }
    }
    out.threads = threads.into_values().collect();
    add_kernel_lists(out, w);
    add_losses(&mut out.losses, &w.losses);
    out.events_received += w.events_received;
    add_samples(out, w);
    if let (Some(a), Some(b)) = (out.tracer_cost.as_mut(), &w.tracer_cost) {
        a.cpu_ns += b.cpu_ns;
        a.cpu_share = a.cpu_ns as f64 / (out.end_ns - out.start_ns).max(1) as f64;
        a.peak_rss_bytes = a.peak_rss_bytes.max(b.peak_rss_bytes);
    }
    if let (Some(a), Some(b)) = (out.proc_counts.as_mut(), &w.proc_counts) {
        a.end = b.end.clone();
        a.steal_end = b.steal_end.clone();
    }
    out.children = w.children.clone();
    out.processes = w.processes.clone();
}

/// The kernel's lists keyed by task or route: who ran while the threads waited, the moves,
/// who woke whom; the same key's counts added up.
fn add_kernel_lists(out: &mut Recording, w: &Recording) {
    for p in &w.preemptors {
        match out
            .preemptors
            .iter_mut()
            .find(|q| (q.pid, q.tgid) == (p.pid, p.tgid))
        {
            Some(q) => {
                q.wait_ns += p.wait_ns;
                q.slices += p.slices;
                q.handoff_ns += p.handoff_ns;
            }
            None => out.preemptors.push(p.clone()),
        }
    }
    for r in &w.migration_routes {
        let key = (r.tid, r.from_cpu, r.to_cpu);
        match out
            .migration_routes
            .iter_mut()
            .find(|q| (q.tid, q.from_cpu, q.to_cpu) == key)
        {
            Some(q) => q.count += r.count,
            None => out.migration_routes.push(*r),
        }
    }
    for k in &w.wakers {
        match out.wakers.iter_mut().find(|q| q.key() == k.key()) {
            Some(q) => q.merge(k),
            None => out.wakers.push(k.clone()),
        }
    }
}

/// The samples taken over time: GPU polls and utilization, the cgroups' counters.
fn add_samples(out: &mut Recording, w: &Recording) {
    match (out.gpu.as_mut(), &w.gpu) {
        (Some(a), Some(b)) => {
            // Each window starts from the last one's final poll: once is enough.
            let last = a.polls.last().map(|p| p.t_ns);
            a.polls
                .extend(b.polls.iter().filter(|p| Some(p.t_ns) > last).cloned());
            a.util_samples.extend_from_slice(&b.util_samples);
            a.sampler_cpu_ns += b.sampler_cpu_ns;
        }
        (None, Some(b)) => out.gpu = Some(b.clone()),
        _ => {}
    }
    let cgroups = std::iter::once(&mut out.cgroup)
        .flatten()
        .chain(out.other_cgroups.iter_mut());
    let theirs = std::iter::once(&w.cgroup).flatten().chain(&w.other_cgroups);
    for (a, b) in cgroups.zip(theirs) {
        let last = a.samples.last().map(|s| s.t_ns);
        a.samples
            .extend(b.samples.iter().filter(|s| Some(s.t_ns) > last).cloned());
    }
}

fn add_losses(a: &mut Losses, b: &Losses) {
    a.ringbuf_dropped += b.ringbuf_dropped;
    a.thread_map_full += b.thread_map_full;
    a.preemptor_map_full += b.preemptor_map_full;
    a.migration_map_full += b.migration_map_full;
    a.child_map_full += b.child_map_full;
    a.waker_map_full += b.waker_map_full;
    a.unseen_switch_ins += b.unseen_switch_ins;
    a.unseen_switch_outs += b.unseen_switch_outs;
    a.unseen_wakeups += b.unseen_wakeups;
    a.perf_read_failed += b.perf_read_failed;
    a.clock_checks += b.clock_checks;
    a.clock_error_ns += b.clock_error_ns;
    a.late_records += b.late_records;
}

/// The longest synchronizing CUDA call of each thread in the window, from its spans.
fn own_sync_max(rec: &Recording) -> BTreeMap<u32, u64> {
    let mut m: BTreeMap<u32, u64> = BTreeMap::new();
    for s in &rec.cuda_syncs {
        let e = m.entry(s.tid).or_default();
        *e = (*e).max(s.end_ns - s.start_ns);
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recording::threads::{StateTimes, Switches};

    fn thread(tid: u32, oncpu: u64, blocked: u64, switches: u64) -> ThreadRecord {
        ThreadRecord {
            tid,
            pid: 1,
            comm: "t".into(),
            created_ns: None,
            exited_ns: None,
            parent_tid: None,
            totals: ThreadTotals {
                switches: Switches {
                    voluntary_switches: switches,
                    ..Default::default()
                },
                time: StateTimes {
                    oncpu_ns: oncpu,
                    runq_wait_ns: 0,
                    blocked_ns: blocked,
                },
            },
            runq_waits: 0,
            runq_wait_max_ns: 0,
            runq_wait_log2_hist: vec![0; 4],
            runq_wait_samples: Default::default(),
            counters: None,
            cuda: None,
            wait_classes: Default::default(),
            tail_switch: None,
        }
    }

    fn rec(end: u64, threads: Vec<ThreadRecord>) -> Recording {
        let mut r = crate::recording::testutil::recording(vec![], vec![]);
        r.end_ns = end;
        r.threads = threads;
        r
    }

    #[test]
    fn windows_add_up_to_the_whole_even_when_a_reading_steps_back() {
        let mut reported = Reported::default();
        // Cumulative readings at 100, 200, 300: the second closed the thread on the CPU for
        // 5 ns it actually spent blocked, which the third reading corrects.
        let readings = [(100, 60, 40, 3), (200, 125, 75, 5), (300, 160, 140, 9)];
        let mut sum = (0, 0, 0);
        let mut start = 0;
        for (end, oncpu, blocked, sw) in readings {
            let mut r = rec(end, vec![thread(7, oncpu, blocked, sw)]);
            reported.take(&mut r, start);
            let t = &r.threads[0].totals;
            assert_eq!(r.start_ns, start);
            sum.0 += t.time.oncpu_ns;
            sum.1 += t.time.blocked_ns;
            sum.2 += t.switches.voluntary_switches;
            start = end;
        }
        assert_eq!(sum, (160, 140, 9), "the windows add up to the last reading");
    }

    #[test]
    fn negative_steps_are_clamped_and_caught_up() {
        let mut reported = Reported::default();
        let mut a = rec(100, vec![thread(7, 70, 30, 1)]);
        reported.take(&mut a, 0);
        // On the CPU 5 ns less than the first reading said: nothing this window, not -5.
        let mut b = rec(200, vec![thread(7, 65, 135, 1)]);
        reported.take(&mut b, 100);
        assert_eq!(b.threads[0].totals.time.oncpu_ns, 0);
        assert_eq!(b.threads[0].totals.time.blocked_ns, 105);
        let mut c = rec(300, vec![thread(7, 100, 200, 2)]);
        reported.take(&mut c, 200);
        assert_eq!(
            c.threads[0].totals.time.oncpu_ns, 30,
            "100 less the 70 reported"
        );
    }

    #[test]
    fn a_reused_tid_starts_afresh_and_an_ended_thread_is_forgotten() {
        let mut reported = Reported::default();
        let mut old = thread(7, 50, 0, 2);
        old.exited_ns = Some(80);
        let mut a = rec(100, vec![old.clone()]);
        reported.take(&mut a, 0);
        assert_eq!(a.threads.len(), 1);
        // The next window still lists the dead thread (its account is kept until reaped):
        // nothing of it falls in the window.
        let mut b = rec(200, vec![old]);
        reported.take(&mut b, 100);
        assert!(b.threads.is_empty());
        let mut new = thread(7, 20, 10, 1);
        new.created_ns = Some(250);
        new.parent_tid = Some(1);
        let mut c = rec(300, vec![new]);
        reported.take(&mut c, 200);
        assert_eq!(c.threads[0].totals.time.oncpu_ns, 20);
        assert_eq!(c.threads[0].created_ns, Some(250));
    }

    #[test]
    fn merged_windows_are_what_they_took_apart() {
        let mut reported = Reported::default();
        let readings = [(100, 60, 40, 3), (200, 125, 75, 5), (300, 160, 140, 9)];
        let mut windows = vec![];
        let mut start = 0;
        for (end, oncpu, blocked, sw) in readings {
            let mut r = rec(end, vec![thread(7, oncpu, blocked, sw)]);
            reported.take(&mut r, start);
            windows.push(r);
            start = end;
        }
        let m = merge(&windows[1..]).expect("two windows");
        assert_eq!((m.start_ns, m.end_ns), (100, 300));
        let t = &m.threads[0].totals;
        assert_eq!(
            (
                t.time.oncpu_ns,
                t.time.blocked_ns,
                t.switches.voluntary_switches
            ),
            (100, 100, 6),
            "the last reading less the first window"
        );
        assert!(merge(&[]).is_none());
    }

    /// A latency log's requests are joined across windows; one begun before the first is not
    /// wholly inside the merged span and counts as unpaired.
    #[test]
    fn merged_windows_join_their_logged_requests() {
        use crate::recording::requests::{RequestSet, RequestSource, RequestSpan};
        let logged = |spans: &[(u64, u64)], unpaired| RequestSet {
            source: RequestSource::File,
            spans: spans
                .iter()
                .map(|&(start_ns, end_ns)| RequestSpan {
                    start_ns,
                    end_ns,
                    tid: 7,
                    id: None,
                })
                .collect(),
            unpaired,
        };
        let mut a = rec(200, vec![thread(7, 1, 1, 1)]);
        a.start_ns = 100;
        a.requests = Some(logged(&[(90, 110), (120, 150)], 1));
        let mut b = rec(300, vec![thread(7, 1, 1, 1)]);
        b.start_ns = 200;
        b.requests = Some(logged(&[(190, 210), (250, 290)], 0));
        let m = merge(&[a, b]).expect("two windows").requests.unwrap();
        let spans: Vec<(u64, u64)> = m.spans.iter().map(|s| (s.start_ns, s.end_ns)).collect();
        assert_eq!(spans, [(120, 150), (190, 210), (250, 290)]);
        assert_eq!(m.unpaired, 2);
    }

    #[test]
    fn a_maximum_is_this_windows_own() {
        let mut reported = Reported::default();
        let mut t = thread(7, 10, 0, 0);
        t.runq_waits = 2;
        t.runq_wait_max_ns = 900;
        let mut a = rec(100, vec![t.clone()]);
        reported.take(&mut a, 0);
        assert_eq!(a.threads[0].runq_wait_max_ns, 900);
        // Two more waits, the longest 40 ns (its samples say): the running maximum is still 900.
        t.runq_waits = 4;
        t.runq_wait_samples.record(40);
        t.runq_wait_samples.record(12);
        let mut b = rec(200, vec![t]);
        reported.take(&mut b, 100);
        assert_eq!(b.threads[0].runq_waits, 2);
        assert_eq!(b.threads[0].runq_wait_max_ns, 40);
    }

    /// The accounts a watch takes out of the kernel's maps: an ended thread's blocked time and
    /// moves, and exited preemptors. A TID or PID made again counts from 0, and a preemptor
    /// is offered for removal only while quiet, with what was reported of it.
    #[test]
    fn forgotten_accounts_count_afresh() {
        let waker = crate::recording::testutil::waker;
        let route = |tid, count| MigrationRoute {
            tid,
            from_cpu: 0,
            to_cpu: 1,
            count,
        };
        let preemptor = |pid, wait_ns| crate::recording::PreemptorRecord {
            pid,
            tgid: pid,
            wait_ns,
            slices: 1,
            ..Default::default()
        };
        let mut reported = Reported::default();
        let mut a = rec(100, vec![]);
        a.wakers = vec![waker(7, 50), waker(8, 60)];
        a.migration_routes = vec![route(7, 3), route(8, 4)];
        a.preemptors = vec![preemptor(0, 10), preemptor(40, 20), preemptor(41, 30)];
        reported.take(&mut a, 0);
        // 41 ran again in the next window; 40 and the idle task did not.
        let mut b = rec(200, vec![]);
        b.preemptors = vec![preemptor(0, 10), preemptor(40, 20), preemptor(41, 35)];
        reported.take(&mut b, 100);
        assert_eq!(reported.quiet_preemptors(&b), [(40, (20, 1))]);
        assert_eq!(reported.preemptors_known(), 3);
        // Thread 7 ended and its entries were taken out; so was task 40.
        reported.forget_thread_accounts(&[7].into());
        reported.forget_preemptors(&[40].into());
        assert_eq!(reported.preemptors_known(), 2);
        // New entries under the same IDs: all of them is news; thread 8's are not.
        let mut c = rec(300, vec![]);
        c.wakers = vec![waker(7, 5), waker(8, 60)];
        c.migration_routes = vec![route(7, 1), route(8, 4)];
        c.preemptors = vec![preemptor(40, 2)];
        reported.take(&mut c, 200);
        let blocked: Vec<(u32, u64)> = c.wakers.iter().map(|w| (w.tid, w.blocked_ns)).collect();
        assert_eq!(blocked, [(7, 5)]);
        let moves: Vec<(u32, u64)> = c
            .migration_routes
            .iter()
            .map(|r| (r.tid, r.count))
            .collect();
        assert_eq!(moves, [(7, 1)]);
        let waits: Vec<(u32, u64)> = c.preemptors.iter().map(|p| (p.pid, p.wait_ns)).collect();
        assert_eq!(waits, [(40, 2)]);
    }
}
