//! The timeline: each thread's states as intervals, rebuilt from the recorded transitions with
//! the same rules the kernel side applies (tracer-ebpf `sched/`); what kind of wait a
//! switch-in ended is the kernel's classification, carried in the record. The one userspace
//! copy of the state machine: built once per recording (`Recording::threads_over_time`) and
//! read by the request decomposition, the Perfetto and HTML outputs, and trace recovery (the
//! totals when a trace file lost its final frame).

use std::collections::BTreeMap;

use serde::Serialize;
use tracer_common::{Event, EventKind, SWITCH_RUNNABLE_UNSURE, WAKER_IDLE};

use crate::recording::{
    cuda::CudaSpan,
    threads::{StateTimes, Switches, ThreadTotals},
    waits::WaitKind,
    wakers::wakeup_how,
};

/// Every thread's timeline, by TID.
pub type Timelines = BTreeMap<u32, ThreadTimeline>;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    Running,
    /// Waiting in a run queue.
    Runnable,
    Blocked,
}

impl State {
    pub fn name(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Runnable => "runnable (waiting for a CPU)",
            Self::Blocked => "blocked",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Interval {
    pub start_ns: u64,
    pub end_ns: u64,
    pub state: State,
    /// The CPU it ran on (running), or whose run queue it waited in when known.
    pub cpu: Option<u32>,
    /// Runnable intervals ended by a switch-in: what kind of wait it was, and the task that
    /// had the CPU just before (0: the idle task).
    pub wait: Option<(WaitKind, u32)>,
    /// Of a runnable interval ended by a switch-in, the part its cgroup was throttled.
    pub throttled_ns: u64,
    /// Of a handoff (`WaitKind::Handoff`), the part its partner (`wait`'s task) held the CPU,
    /// at the interval's end; the rest was behind other tasks.
    pub handoff_ns: u64,
    /// Blocked intervals ended by a wakeup: who woke the thread and what it was blocked in.
    pub woken: Option<Woken>,
}

impl Interval {
    /// An interval that no switch-in or wakeup ended (so none of their annotations).
    pub fn plain(start_ns: u64, end_ns: u64, state: State, cpu: Option<u32>) -> Self {
        Self {
            start_ns,
            end_ns,
            state,
            cpu,
            wait: None,
            throttled_ns: 0,
            handoff_ns: 0,
            woken: None,
        }
    }
}

/// The end of a blocked interval, from its wakeup record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Woken {
    /// The waking task (0: the idle task, an interrupt).
    pub by: u32,
    /// The system call the thread was blocked in, when known.
    pub syscall: Option<u32>,
    /// `tracer_common::WAKER_*` bits.
    pub flags: u32,
}

/// One thread over the window.
#[derive(Debug, Clone, Default)]
pub struct ThreadTimeline {
    pub tid: u32,
    pub intervals: Vec<Interval>,
    pub switches: Switches,
    /// Complete run-queue waits (ns), with the CPU that ended each.
    pub waits: Vec<(u64, u32)>,
    pub created_ns: Option<u64>,
    pub exited_ns: Option<u64>,
    pub parent_tid: Option<u32>,
    state: Option<State>,
    since: u64,
    cpu: Option<u32>,
    dead: bool,
    /// Its last switch-out said runnable without a preemption, which a classic tracepoint
    /// before 5.18 also says of a task that blocked (`SWITCH_RUNNABLE_UNSURE`).
    unsure: bool,
}

impl ThreadTimeline {
    fn close(&mut self, until: u64) {
        if let Some(state) = self.state
            && until > self.since
        {
            self.intervals
                .push(Interval::plain(self.since, until, state, self.cpu));
        }
    }

    /// Moves to `state` at `ts`. Without a known state yet, `before` is what the event implies
    /// the thread was doing since the window's start.
    fn go(&mut self, ts: u64, state: State, before: State, window_start: u64) {
        if self.state.is_none() && self.created_ns.is_none() {
            self.state = Some(before);
            self.since = window_start;
        }
        self.close(ts);
        self.state = Some(state);
        self.since = ts;
    }

    /// A switch-in at `ts`: it runs on `ev.cpu`, and the wait it ended gets its kind.
    fn switch_in(&mut self, ev: &Event, ts: u64, start: u64) {
        self.unsure = false;
        if self.state == Some(State::Runnable) && ev.value > 0 {
            self.waits.push((ev.value, ev.cpu));
        }
        self.cpu = Some(ev.cpu);
        self.go(ts, State::Running, State::Runnable, start);
        if let (Some(last), Some(kind)) = (self.intervals.last_mut(), WaitKind::of(ev))
            && last.state == State::Runnable
            && last.end_ns == ts
        {
            last.wait = Some((kind, ev.aux));
            last.throttled_ns = ev.throttled_ns().min(last.end_ns - last.start_ns);
            last.handoff_ns = ev.handoff_ns().min(last.end_ns - last.start_ns);
        }
    }

    /// A switch-out at `ts`: preempted, it waits for a CPU; else it blocks, or ends if it exited.
    fn switch_out(&mut self, ev: &Event, ts: u64, start: u64) {
        self.cpu = Some(ev.cpu);
        if matches!(self.state, Some(State::Runnable | State::Blocked)) {
            self.unseen_switch_in(ev.value, ts);
        }
        if ev.aux & 1 == 1 {
            self.unsure = ev.aux & SWITCH_RUNNABLE_UNSURE != 0;
            self.switches.involuntary_switches += 1;
            self.go(ts, State::Runnable, State::Running, start);
        } else {
            self.switches.voluntary_switches += 1;
            self.go(ts, State::Blocked, State::Running, start);
            if self.exited_ns.is_some() {
                self.close(ts);
                self.state = None;
                self.dead = true;
            }
        }
    }

    /// Switching out while waiting or blocked: the switch-in (and, blocked, the wakeup) before
    /// went untraced (losses.unseen_switch_ins; PID 1's switches on our VMs). The record's
    /// slice is what the kernel side accounted as running (`repair_unseen_switch_in`, put right
    /// by the task's own run time where it can be read: `settle_repaired`): the end of the
    /// interval, on this CPU; the rest stays as it was, a wait (or a sleep) no switch-in ended.
    fn unseen_switch_in(&mut self, slice: u64, ts: u64) {
        let ran = slice.min(ts.saturating_sub(self.since));
        if ran > 0 {
            self.close(ts - ran);
            self.since = ts - ran;
            self.state = Some(State::Running);
        }
    }

    /// The thread's last slice, running to the window's end as far as the records go, ended at
    /// `at` by a switch no program saw (`close::TailSwitch`, from the thread's own counters):
    /// the rest of the window it waited for a CPU (`preempted`) or was blocked, as its totals.
    pub fn switched_unseen_at_end(&mut self, at: u64, preempted: bool) {
        let Some(last) = self.intervals.last_mut() else {
            return;
        };
        if last.state != State::Running || at >= last.end_ns {
            return;
        }
        let at = at.max(last.start_ns);
        let end = std::mem::replace(&mut last.end_ns, at);
        let cpu = last.cpu;
        if at == last.start_ns {
            self.intervals.pop();
        }
        // The switch counts stay the programs' own, as the totals' (`close_thread`) do.
        let state = if preempted {
            State::Runnable
        } else {
            State::Blocked
        };
        self.intervals.push(Interval::plain(at, end, state, cpu));
    }

    /// A wakeup at `ts`: a blocked thread turns runnable, its blocked interval saying who woke it.
    fn wakeup(&mut self, ev: &Event, ts: u64, start: u64) {
        if std::mem::take(&mut self.unsure) && self.state == Some(State::Runnable) {
            // It had blocked after all, as the kernel side decided too.
            self.switches.involuntary_switches -= 1;
            self.switches.voluntary_switches += 1;
            self.state = Some(State::Blocked);
        }
        if !matches!(self.state, Some(State::Running | State::Runnable)) {
            self.switches.wakeups += 1;
            self.cpu = Some(ev.cpu);
            self.go(ts, State::Runnable, State::Blocked, start);
            if let Some(last) = self.intervals.last_mut()
                && last.state == State::Blocked
                && last.end_ns == ts
            {
                let (syscall, flags) = wakeup_how(ev.value);
                last.woken = Some(Woken {
                    by: if flags & WAKER_IDLE != 0 { 0 } else { ev.aux },
                    syscall,
                    flags,
                });
            }
        }
    }
}

/// Rebuilds every thread's intervals over `[start, end]` from the events, in time order. The
/// kernel side sends each CPU's events in order, in batches (tracer-ebpf `Batch`), so the
/// records of two CPUs interleave out of order; a stable sort by timestamp puts them back,
/// keeping arrival order for equal stamps. A recording's events are sorted once when it is
/// assembled, so this copy is only made for events from elsewhere.
pub fn build(events: &[Event], start: u64, end: u64) -> Timelines {
    let sorted;
    let events = if events.is_sorted_by_key(|e| e.ts_ns) {
        events
    } else {
        let mut v = events.to_vec();
        v.sort_by_key(|e| e.ts_ns);
        sorted = v;
        &sorted
    };
    let mut threads = Timelines::new();
    for ev in events {
        let Ok(kind) = ev.event_kind() else {
            continue;
        };
        let ts = ev.ts_ns.clamp(start, end.max(start));
        if kind == EventKind::Exec {
            exec(&mut threads, ev, ts, start);
            continue;
        }
        let t = threads.entry(ev.tid).or_insert_with(|| ThreadTimeline {
            tid: ev.tid,
            ..Default::default()
        });
        if t.dead {
            continue;
        }
        match kind {
            EventKind::SwitchIn => t.switch_in(ev, ts, start),
            EventKind::SwitchOut => t.switch_out(ev, ts, start),
            EventKind::Wakeup | EventKind::WakeupNew => t.wakeup(ev, ts, start),
            EventKind::Migrate => {
                t.switches.migrations += 1;
                t.cpu = Some(ev.cpu);
            }
            EventKind::ThreadNew => {
                t.created_ns = Some(ev.ts_ns);
                t.parent_tid = Some(ev.aux);
                t.state = Some(State::Blocked);
                t.since = ts;
            }
            EventKind::ThreadExit => t.exited_ns = Some(ev.ts_ns),
            EventKind::Exec
            | EventKind::CounterSlice
            | EventKind::CudaLaunch
            | EventKind::CudaSync
            | EventKind::RequestStart
            | EventKind::RequestEnd
            | EventKind::GcStart
            | EventKind::GcDone => {}
        }
    }
    for t in threads.values_mut() {
        if !t.dead {
            t.close(end);
        }
    }
    threads
}

/// A thread that exec'd took over the main TID (`ev.tid`): its old TID (`ev.aux`) ends, and
/// the main TID, dead since the old main thread exited, runs again from here.
fn exec(threads: &mut Timelines, ev: &Event, ts: u64, start: u64) {
    let new = |tid| ThreadTimeline {
        tid,
        ..Default::default()
    };
    let old = threads.entry(ev.aux).or_insert_with(|| new(ev.aux));
    if !old.dead {
        old.go(ts, State::Blocked, State::Running, start);
        old.state = None;
        old.dead = true;
        old.exited_ns = Some(ev.ts_ns);
    }
    let main = threads.entry(ev.tid).or_insert_with(|| new(ev.tid));
    if main.dead {
        main.dead = false;
        main.state = Some(State::Running);
        main.since = ts;
    } else {
        main.go(ts, State::Running, State::Blocked, start);
    }
    main.exited_ns = None;
    main.cpu = None;
}

impl ThreadTimeline {
    pub fn total(&self, state: State) -> u64 {
        self.intervals
            .iter()
            .filter(|i| i.state == state)
            .map(|i| i.end_ns - i.start_ns)
            .sum()
    }

    /// The thread's totals as the timeline tells them.
    pub fn totals(&self) -> ThreadTotals {
        ThreadTotals {
            switches: self.switches,
            time: StateTimes {
                oncpu_ns: self.total(State::Running),
                runq_wait_ns: self.total(State::Runnable),
                blocked_ns: self.total(State::Blocked),
            },
        }
    }
}

/// CUDA synchronizing calls of one thread.
pub fn cuda_spans(spans: &[CudaSpan], tid: u32) -> impl Iterator<Item = &CudaSpan> {
    spans.iter().filter(move |s| s.tid == tid)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A thread's intervals as (start, end, state).
    fn states(t: &ThreadTimeline) -> Vec<(u64, u64, State)> {
        t.intervals
            .iter()
            .map(|i| (i.start_ns, i.end_ns, i.state))
            .collect()
    }

    fn ev(ts: u64, tid: u32, kind: EventKind, cpu: u32, aux: u32, value: u64) -> Event {
        Event {
            ts_ns: ts,
            tid,
            kind: kind as u32,
            cpu,
            aux,
            value,
        }
    }

    #[test]
    fn intervals_follow_the_transitions_and_close_at_the_edges() {
        use EventKind::*;
        let events = vec![
            // Blocked since before the window, woken at 100, runs 110-200, preempted,
            // runs again 260-300, blocks.
            ev(100, 7, Wakeup, 1, 0, 0),
            ev(110, 7, SwitchIn, 1, 0, 10),
            ev(200, 7, SwitchOut, 1, 1, 90),
            ev(260, 7, SwitchIn, 0, 0, 60),
            ev(270, 7, Migrate, 0, 1, 0),
            ev(300, 7, SwitchOut, 0, 0, 40),
        ];
        let t = &build(&events, 0, 1000)[&7];
        assert_eq!(
            states(t),
            vec![
                (0, 100, State::Blocked),
                (100, 110, State::Runnable),
                (110, 200, State::Running),
                (200, 260, State::Runnable),
                (260, 300, State::Running),
                (300, 1000, State::Blocked),
            ]
        );
        let s = t.switches;
        assert_eq!((s.voluntary_switches, s.involuntary_switches), (1, 1));
        assert_eq!((s.migrations, s.wakeups), (1, 1));
        assert_eq!(t.waits, vec![(10, 1), (60, 0)]);
        assert_eq!(
            t.total(State::Running) + t.total(State::Runnable) + t.total(State::Blocked),
            1000
        );
    }

    /// A classic switch-out before 5.18 that said runnable (no preemption) and a wakeup
    /// before the thread ran again: it had blocked, and is counted and drawn so. A runnable
    /// switch-out that was not unsure stays a wait whatever follows.
    #[test]
    fn a_wakeup_after_an_unsure_runnable_switch_out_makes_it_a_block() {
        use EventKind::*;
        let unsure = 1 | SWITCH_RUNNABLE_UNSURE;
        let events = vec![
            ev(110, 7, SwitchIn, 1, 0, 0),
            ev(200, 7, SwitchOut, 1, unsure, 90),
            ev(250, 7, Wakeup, 1, 0, 0),
            ev(260, 7, SwitchIn, 1, 0, 10),
            ev(300, 7, SwitchOut, 1, unsure, 40),
            ev(340, 7, SwitchIn, 1, 0, 40),
        ];
        let t = &build(&events, 100, 400)[&7];
        assert_eq!(
            states(t),
            vec![
                (100, 110, State::Runnable),
                (110, 200, State::Running),
                (200, 250, State::Blocked),
                (250, 260, State::Runnable),
                (260, 300, State::Running),
                (300, 340, State::Runnable),
                (340, 400, State::Running),
            ]
        );
        let s = t.switches;
        assert_eq!((s.voluntary_switches, s.involuntary_switches), (1, 1));
        assert_eq!(s.wakeups, 1);
    }

    /// A thread preempted, then switching out again with no switch-in between (the switch
    /// that gave it the CPU was untraced): the record's slice, what the kernel side counted as
    /// running, ends the interval on the CPU it left, and the rest stays a wait that no
    /// switch-in ended. Uncorrected (classic tracepoints), the slice is the whole interval.
    #[test]
    fn a_switch_out_while_waiting_runs_its_slice_at_the_end() {
        use EventKind::*;
        let events = vec![
            ev(110, 7, SwitchIn, 0, 0, 0),
            ev(200, 7, SwitchOut, 0, 1, 90),
            // Corrected by the task's own run time: it ran 30 of the 100 ns.
            ev(300, 7, SwitchOut, 1, 1, 30),
            // Uncorrected: all of it.
            ev(330, 7, SwitchOut, 1, 0, 30),
            ev(350, 7, Wakeup, 1, 0, 0),
            ev(370, 7, SwitchIn, 1, 5, 20),
        ];
        let t = &build(&events, 100, 400)[&7];
        assert_eq!(
            states(t),
            vec![
                (100, 110, State::Runnable),
                (110, 200, State::Running),
                (200, 270, State::Runnable),
                (270, 300, State::Running),
                (300, 330, State::Running),
                (330, 350, State::Blocked),
                (350, 370, State::Runnable),
                (370, 400, State::Running),
            ]
        );
        assert_eq!(t.intervals[3].cpu, Some(1));
        assert_eq!(t.intervals[2].wait, None);
        assert_eq!(t.waits, vec![(20, 1)]);
    }

    /// A thread switching out while blocked: its wakeup and switch-in went untraced, and it
    /// ran the record's slice (the task's own run time; 0 where that cannot be read) at the
    /// end of the sleep.
    #[test]
    fn a_switch_out_while_blocked_runs_its_slice_at_the_end() {
        use EventKind::*;
        let events = vec![
            ev(110, 7, SwitchOut, 0, 0, 10),
            ev(200, 7, SwitchOut, 0, 0, 25),
            ev(300, 7, SwitchOut, 0, 0, 0),
        ];
        let t = &build(&events, 100, 400)[&7];
        assert_eq!(
            states(t),
            vec![
                (100, 110, State::Running),
                (110, 175, State::Blocked),
                (175, 200, State::Running),
                (200, 300, State::Blocked),
                (300, 400, State::Blocked),
            ]
        );
    }

    /// Running to the window's end as far as the records go, but its own counters read after
    /// the window show it was preempted at 250 (`close::TailSwitch`): the timeline ends the
    /// slice there, as the totals do; a switch after the end, or of a thread not running,
    /// changes nothing.
    #[test]
    fn a_switch_no_program_saw_ends_the_last_slice() {
        use EventKind::*;
        let events = vec![ev(110, 7, Wakeup, 1, 0, 0), ev(120, 7, SwitchIn, 1, 0, 10)];
        let mut t = build(&events, 100, 400).remove(&7).unwrap();
        t.switched_unseen_at_end(250, true);
        t.switched_unseen_at_end(500, false);
        assert_eq!(
            states(&t),
            vec![
                (100, 110, State::Blocked),
                (110, 120, State::Runnable),
                (120, 250, State::Running),
                (250, 400, State::Runnable),
            ]
        );
        assert_eq!(
            t.switches.involuntary_switches, 0,
            "the counts stay the programs', as the totals'"
        );
        t.switched_unseen_at_end(300, false);
        assert_eq!(t.intervals.len(), 4);
    }

    #[test]
    fn a_thread_born_and_dead_in_the_window_covers_its_life_only() {
        use EventKind::*;
        let events = vec![
            ev(100, 9, ThreadNew, 0, 7, 0),
            ev(120, 9, WakeupNew, 0, 7, 0),
            ev(130, 9, SwitchIn, 0, 7, 10),
            ev(180, 9, ThreadExit, 0, 0, 0),
            ev(190, 9, SwitchOut, 0, 0, 60),
        ];
        let t = &build(&events, 0, 1000)[&9];
        assert_eq!(t.created_ns, Some(100));
        assert_eq!(t.exited_ns, Some(180));
        let span: u64 = t.intervals.iter().map(|i| i.end_ns - i.start_ns).sum();
        assert_eq!(span, 90);
        assert_eq!(t.intervals.first().unwrap().start_ns, 100);
        assert_eq!(t.intervals.last().unwrap().end_ns, 190);
    }
}
