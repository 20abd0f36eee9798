//! Closing windows: the one window of `attach`, and the consecutive windows of `tracer watch`,
//! whose accounts are what the kernel's running totals moved by (`recording::window`).
//!
//! A window is cut in two steps. At its end the kernel's accounts, the threads' /proc counts,
//! the cgroups and the GPU are read (`begin_cut`); the CPUs' batches of records from before
//! the end still arrive for a moment, and go to the closing window by their time. After
//! `CUT_LAG` the window is assembled (`end_cut`). A record from before a window's end that
//! arrives later still (a CPU that ran one task without switching since, or an idle one whose
//! batch was not sent in time) is counted in the next window's `late_records`, not silently
//! added to it.

use std::{collections::BTreeSet, time::Duration};

use anyhow::Result;
use tracer_common::Preemptor;

use super::{SELF_CHECK_THREADS, Session, assemble};
use crate::{
    recording::{
        CgroupRecording, EndReason, ProcWindow, Recording, TracerCost, children::Forked,
        collect::Collector, gpu::GpuRecording, wakers::WakerRecord, window::Reported,
    },
    sources::{clock::monotonic_ns, ebpf::Reaped, process},
};

/// A process whose /proc start time is further than this from when the kernel side saw it
/// forked is another one, which took the PID since: /proc's start time is to the clock tick
/// (10 ms at USER_HZ 100), and the two clocks are read apart.
const PROCESS_START_SLACK_NS: u64 = 50_000_000;

/// How long after a window's end its records are still taken: a CPU sends its batch at its
/// first switch after the next tick (4 ms at HZ=250); one gone idle, when `end_cut` asks it
/// to (or as it went idle, where the kernel cannot run a program on another CPU).
pub const CUT_LAG: Duration = Duration::from_millis(250);

/// How many tasks that made target threads wait must have been seen before exited ones are
/// taken out of the kernel's map (a quarter of its room, `MAX_PREEMPTORS`).
const PREEMPTORS_PRUNED_ABOVE: usize = tracer_common::MAX_PREEMPTORS as usize / 4;

/// The same for the counts of blocked time by waker (`MAX_WAKERS`).
const WAKERS_PRUNED_ABOVE: usize = tracer_common::MAX_WAKERS as usize / 4;

/// A window whose end has passed and whose records may still be arriving.
pub struct Closing {
    /// The window it ends.
    pub start: u64,
    pub end: u64,
    pub col: Collector,
    kernel: assemble::Kernel,
    /// The threads wholly accounted in `kernel` (exited and switched out for the last time):
    /// only these are done with after this window.
    dead: BTreeSet<u32>,
    proc_end: ProcSide,
    gpu: Option<GpuRecording>,
    cgroups: Vec<Vec<crate::recording::cgroup::CgroupSample>>,
    cpu_end: u64,
}

/// The /proc side at a window's edge: the threads' own counts (the first
/// `SELF_CHECK_THREADS`, and how many were left out), each CPU's steal time, the untraced
/// children.
#[derive(Clone)]
pub struct ProcSide {
    pub counts: std::collections::BTreeMap<u32, crate::recording::ProcCounts>,
    pub left_out: u64,
    pub steal: Vec<(u32, u64)>,
    pub children: Vec<crate::recording::children::ChildSnapshot>,
}

impl ProcSide {
    pub(super) fn read(session: &Session<'_>) -> Self {
        let (counts, left_out) = session.targets.thread_counts(SELF_CHECK_THREADS);
        Self {
            counts,
            left_out,
            steal: process::cpu_steal(),
            children: session.targets.children(),
        }
    }
}

/// What the windows so far have reported, and what the whole run keeps for its trace file.
pub struct Windows {
    reported: Reported,
    run_start: u64,
    /// Where the current window began, and the tracer's CPU time then.
    window_start: u64,
    cpu_mark: u64,
    /// The whole run's GPU and cgroup samples, kept only for a trace file (its final frame
    /// covers the run).
    pub(super) whole_gpu: Option<GpuRecording>,
    pub(super) whole_cgroups: Option<Vec<Vec<crate::recording::cgroup::CgroupSample>>>,
    /// The accounts of threads that ended in earlier windows, which each window's cut drops:
    /// the whole run's final frame needs them (kept only for a trace file).
    pub(super) whole_reaped: Option<Reaped>,
    /// Forked processes found exited at the last cut (PID, when forked): listed in the window
    /// after it too (the one with their last moments), then taken out of the kernel's map.
    exited: std::collections::BTreeMap<u32, u64>,
    /// Records from before the current window that arrived after it began.
    pub late: u64,
}

impl Windows {
    pub fn new(start: u64, cpu: u64, whole_run: bool) -> Self {
        Self {
            reported: Reported::default(),
            run_start: start,
            window_start: start,
            cpu_mark: cpu,
            whole_gpu: None,
            whole_cgroups: whole_run.then(Vec::new),
            whole_reaped: whole_run.then(Reaped::default),
            exited: Default::default(),
            late: 0,
        }
    }

    pub fn window_start(&self) -> u64 {
        self.window_start
    }

    /// Whether a window was cut already (`tracer watch`).
    pub fn cut_any(&self) -> bool {
        self.window_start != self.run_start
    }
}

/// Whether the task the kernel calls `tid` has exited: this tool's /proc has no such task. A
/// task it cannot show (outside its PID namespace, or, inside one, started after the
/// namespace was last listed) is not known to have, and stays. A live task judged exited
/// costs nothing either: its entry is taken out only as reported, and made again from 0.
fn exited(target: &crate::sources::process::Target, tid: u32) -> bool {
    target.proc_pid_of(tid).is_some_and(|p| {
        matches!(
            std::fs::symlink_metadata(format!("/proc/{p}")),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound
        )
    })
}

/// Adds `part` (a later stretch of the same sampling) to `whole`.
fn append_gpu(whole: &mut Option<GpuRecording>, part: &GpuRecording) {
    match whole {
        None => *whole = Some(part.clone()),
        Some(w) => {
            w.polls.extend_from_slice(&part.polls);
            w.util_samples.extend_from_slice(&part.util_samples);
            w.sampler_cpu_ns += part.sampler_cpu_ns;
            for c in &part.sampler_calls {
                match w.sampler_calls.iter_mut().find(|x| x.call == c.call) {
                    Some(x) => {
                        x.calls += c.calls;
                        x.cpu_ns += c.cpu_ns;
                        x.wall_ns += c.wall_ns;
                    }
                    None => w.sampler_calls.push(c.clone()),
                }
            }
        }
    }
}

impl Session<'_> {
    /// Ends the current window now: reads what it is assembled from, and starts the next.
    /// `end_cut` assembles it once its last records have arrived.
    pub fn begin_cut(&mut self) -> Result<()> {
        if self.closing.is_some() {
            self.end_cut()?;
        }
        self.drain();
        // Before the reading: each account is read at its own instant after `end`, and a state
        // a window closes at `end` lasted at least until then, so the windows' running totals
        // never get ahead of the kernel's and add up to the whole run exactly. Stamped after,
        // a thread that switched out or exited while the map was read was said to run on to
        // the end, more than the whole run then had. The price: what happened while the map
        // was read (microseconds) is in this window, its timeline records in the next.
        let end = monotonic_ns();
        let kernel = assemble::Kernel::read(&mut self.probes, &self.finished, None)?;
        let dead = kernel.dead();
        let proc_end = ProcSide::read(self);
        let mut cgroups = std::mem::take(&mut self.throttling);
        for (i, (t, _)) in self.throttle.0.iter().enumerate() {
            if let Some(s) = t.sample(end) {
                cgroups[i].push(s.clone());
                // The next window starts from the same reading.
                self.throttling.push(vec![s]);
            } else {
                self.throttling.push(vec![]);
            }
        }
        let gpu = self.sampler.as_ref().ok().map(|s| s.cut());
        let next = self.col.successor(end);
        let col = std::mem::replace(&mut self.col, next);
        self.closing = Some(Closing {
            start: self.windows.window_start,
            end,
            col,
            kernel,
            dead,
            proc_end,
            gpu,
            cgroups,
            cpu_end: process::own_usage().0,
        });
        Ok(())
    }

    /// Assembles the window `begin_cut` ended.
    pub fn end_cut(&mut self) -> Result<Recording> {
        // Records from before the end that CPUs idle now still hold (gone idle before the end,
        // or since): sent now, they are in the ring buffer for this drain. A CPU that has run
        // one task without a switch since `CUT_LAG` before is still late, as before.
        self.probes.send_idle_batches();
        self.drain();
        let c = self.closing.take().expect("begin_cut first");
        let (gpu, gpu_capability) = match &self.sampler {
            Ok(s) => (c.gpu, s.capability.clone()),
            Err(cap) => (None, cap.clone()),
        };
        let ended = self.ended(
            c.end,
            EndReason::Window,
            gpu,
            gpu_capability,
            c.cgroups,
            c.proc_end,
        );
        // The kernel's map is read already: what leaves it now is still this window's.
        self.forget_exited(&c.kernel)?;
        let mut col = c.col;
        col.hand_over_requests(c.start, &mut self.col);
        // Threads wholly accounted in this window's reading have been reported in full (one
        // that exited before the end but was read before its last switch is not yet); those
        // reaped from the thread maps too are read for the last time (no later reading joins
        // their last runs of waits again): their other accounts leave the kernel's maps, as
        // this reading has them.
        let dead = c.dead;
        // Not a TID a live thread has taken again since (a reused one, or the leader's, which
        // an exec from another thread takes over): its entries are that thread's now.
        let live = c.kernel.live_threads();
        let gone_tids = (self.finished.stats.iter())
            .map(|s| s.tid)
            .filter(|t| dead.contains(t) && !live.contains(t))
            .collect();
        let mut taken = c.kernel.accounts_of(&gone_tids);
        let rec = self.window_of(c.kernel, col, ended, c.cpu_end)?;
        self.windows.reported.forget(&dead);
        // Gone from the threads /proc listed at the start too: else a thread without a kernel
        // account would be taken for one that stayed quiet all along.
        let gone = forget_ended(&mut self.finished, &dead);
        for s in &gone.stats {
            self.initial.remove(&s.tid);
        }
        if let Some(w) = self.windows.whole_reaped.as_mut() {
            w.extend(gone);
        }
        self.probes.forget_thread_accounts(&taken)?;
        self.windows.reported.forget_thread_accounts(&gone_tids);
        taken.preemptors = self.forget_exited_preemptors(&rec)?;
        taken.wakers.extend(self.forget_exited_wakers(&rec)?);
        if let Some(w) = self.windows.whole_reaped.as_mut() {
            w.extend(taken);
        }
        Ok(rec)
    }

    /// Takes the tasks that ran while target threads waited, and have exited since, out of
    /// the kernel's map once it holds a quarter of its room (below that, the checks would cost
    /// an idle watch more than the room is worth): a node runs short-lived processes for days
    /// (probes, cron jobs, shells), each a new entry, and a full map loses the next ones'
    /// waits (`preemptor_map_full`). Only those quiet in `window` (its own list: the ones that
    /// ran in it) are checked, and only those this tool's /proc can show; and an entry is
    /// taken out only if it holds what was reported of it (one charged after the window's
    /// reading is reported first). An exited task is never charged again, so nothing is lost,
    /// unless its PID is taken by a new task between the check and the removal.
    fn forget_exited_preemptors(&mut self, window: &Recording) -> Result<Vec<Preemptor>> {
        if self.windows.reported.preemptors_known() <= PREEMPTORS_PRUNED_ABOVE {
            return Ok(Vec::new());
        }
        let target = self.targets.primary();
        let exited: Vec<(u32, (u64, u64))> = self
            .windows
            .reported
            .quiet_preemptors(window)
            .into_iter()
            .filter(|&(pid, _)| exited(target, pid))
            .collect();
        let taken = self.probes.forget_preemptors(&exited)?;
        let pids = taken.iter().map(|p| p.pid).collect();
        self.windows.reported.forget_preemptors(&pids);
        Ok(taken)
    }

    /// Takes the counts of blocked time ended by tasks that have exited out of the kernel's
    /// map once a quarter of its room is used (`forget_exited_preemptors`, for the same
    /// reasons): a thread woken by a new thread each time (a pool that starts one per task, a
    /// join) adds an entry per waker for as long as it lives. Only counts that did not grow in
    /// `window`, and each on the kernel side's terms (`SchedProbes::forget_wakers`).
    fn forget_exited_wakers(&mut self, window: &Recording) -> Result<Vec<WakerRecord>> {
        if self.windows.reported.wakers_known() <= WAKERS_PRUNED_ABOVE {
            return Ok(Vec::new());
        }
        let target = self.targets.primary();
        let mut gone = std::collections::BTreeMap::new();
        let mut quiet = self.windows.reported.quiet_wakers(window);
        quiet.retain(|k, _| *gone.entry(k.1).or_insert_with(|| exited(target, k.1)));
        if quiet.is_empty() {
            return Ok(Vec::new());
        }
        let taken = self.probes.forget_wakers(&quiet)?;
        let keys = taken.iter().map(WakerRecord::key).collect();
        self.windows.reported.forget_wakers(&keys);
        Ok(taken)
    }

    /// Takes the processes found exited at the last cut out of the kernel's map (this window,
    /// read from it in `kernel`, lists them for the last time), and notes which of the window's
    /// have exited since: a service that forks for days would otherwise list every process it
    /// ever forked in each window, and fill the map.
    fn forget_exited(&mut self, kernel: &assemble::Kernel) -> Result<()> {
        let before = std::mem::take(&mut self.windows.exited);
        let live = kernel.live_processes();
        let primary = self.targets.primary();
        let follow = self.targets.follow;
        let gone = |f: &Forked| match primary.proc_pid_of(f.pid) {
            // /proc has no such process, or its PID names a later one (started more than a
            // few ticks from the fork; a process that joined a cgroup has its joining time).
            Some(p) => process::started_ns(p)
                .is_none_or(|t| f.parent != 0 && t.abs_diff(f.created_ns) > PROCESS_START_SLACK_NS),
            // One the tool's PID namespace has not listed: gone when no thread of it lives
            // (a child that is not followed has no traced thread: it stays).
            None => follow && !live.contains(&f.pid),
        };
        self.windows.exited = kernel
            .forked()
            .iter()
            .filter(|f| !before.contains_key(&f.pid))
            .filter(|f| gone(f))
            .map(|f| (f.pid, f.created_ns))
            .collect();
        let children = self.probes.forget_children(&before)?;
        if let Some(w) = self.windows.whole_reaped.as_mut() {
            w.children.extend(children);
        }
        Ok(())
    }

    /// Turns the cumulative accounts into the window's, and moves on to the next window.
    pub(super) fn window_of(
        &mut self,
        kernel: assemble::Kernel,
        col: Collector,
        ended: assemble::Ended,
        cpu_end: u64,
    ) -> Result<Recording> {
        let end = ended.end;
        let mut rec = assemble::recording(&self.targets, &self.probes, kernel, col, ended)?;
        if let Some(w) = self.windows.whole_cgroups.as_mut() {
            let all = std::iter::once(&rec.cgroup)
                .flatten()
                .chain(rec.other_cgroups.iter());
            for (i, cg) in all.enumerate() {
                if w.len() <= i {
                    w.push(Vec::new());
                }
                w[i].extend(cg.samples.iter().cloned());
            }
        }
        if let (Some(g), true) = (&rec.gpu, self.windows.whole_cgroups.is_some()) {
            append_gpu(&mut self.windows.whole_gpu, g);
        }
        let start = self.windows.window_start;
        self.windows.reported.take(&mut rec, start);
        rec.losses.late_records = std::mem::take(&mut self.windows.late);
        let cpu = cpu_end.saturating_sub(self.windows.cpu_mark);
        rec.tracer_cost = Some(TracerCost {
            cpu_ns: cpu,
            cpu_share: cpu as f64 / (end - start).max(1) as f64,
            peak_rss_bytes: process::own_usage().1,
        });
        self.windows.window_start = end;
        self.windows.cpu_mark = cpu_end;
        Ok(rec)
    }

    /// What `assemble` needs besides the kernel's accounts, for a window ending at `end`; the
    /// /proc side at `end` becomes the next window's start.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn ended(
        &mut self,
        end: u64,
        end_reason: EndReason,
        gpu: Option<GpuRecording>,
        gpu_capability: crate::recording::Capability,
        cgroups: Vec<Vec<crate::recording::cgroup::CgroupSample>>,
        proc_end: ProcSide,
    ) -> assemble::Ended {
        let start = std::mem::replace(&mut self.counts, proc_end.clone());
        assemble::Ended {
            start: self.start,
            end,
            end_reason,
            // Not a window the exit came after (the one being cut when it came).
            target_exited_ns: self.target_exited_ns.filter(|&t| t <= end),
            initial: self.initial.clone(),
            gpu,
            gpu_capability,
            cgroups: self
                .throttle
                .0
                .iter()
                .zip(cgroups)
                .map(|((t, pids), samples)| CgroupRecording {
                    cgroup: t.cgroup.clone(),
                    samples,
                    pids: pids.clone(),
                })
                .collect(),
            host: self.host.clone(),
            proc_counts: ProcWindow {
                start: start.counts,
                end: proc_end.counts,
                left_out: start.left_out,
                steal_start: start.steal,
                steal_end: proc_end.steal,
            },
            children: (start.children, proc_end.children),
        }
    }
}

/// Takes out the accounts of the threads `dead` (reported in full by now).
fn forget_ended(finished: &mut Reaped, gone: &BTreeSet<u32>) -> Reaped {
    let (stats, kept) = std::mem::take(&mut finished.stats)
        .into_iter()
        .partition(|s| gone.contains(&s.tid));
    finished.stats = kept;
    let (counters, kept) = std::mem::take(&mut finished.counters)
        .into_iter()
        .partition(|(tid, _)| gone.contains(tid));
    finished.counters = kept;
    let (cuda, kept) = std::mem::take(&mut finished.cuda)
        .into_iter()
        .partition(|(tid, _)| gone.contains(tid));
    finished.cuda = kept;
    Reaped {
        stats,
        counters,
        cuda,
        ..Default::default()
    }
}
