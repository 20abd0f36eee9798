//! Who held up whom: each target thread's blocked time by the task that ended it (the
//! kernel's `WAKERS` totals), the largest pairs per process, and one hop further inside the
//! service: what the waker itself was doing (on a CPU, or waiting in turn for someone).

use std::collections::HashMap;

use serde::Serialize;

use tracer_common::{WAKER_KTHREAD, WAKER_TIMER};

use crate::recording::{
    Recording, printable,
    timeline::Woken,
    wakers::{BlockedIn, WakerRecord},
};

/// The name libcuda gives the thread that waits for the device's events (`comm`).
const CUDA_EVENT_HANDLER: &str = "cuda-EvtHandlr";

/// Pairs kept per thread, and per process of the set.
pub const PAIRS_PER_THREAD: usize = 3;
pub const PAIRS_PER_PROCESS: usize = 20;

/// What kind of task ended a wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum WakerKind {
    /// Another thread of the waiting thread's process.
    SameProcess,
    /// A thread of another process of the service (the target set).
    Member,
    /// A process outside the set.
    OtherProcess,
    /// A kernel thread (kworker, ksoftirqd, an interrupt thread).
    KernelThread,
    /// An interrupt: on an idle CPU (the idle task was current) outside a timer's callback, or
    /// a device's interrupt handler that hit a running task, which is not named.
    Interrupt,
    /// The GPU driver's completion path: a device's interrupt or a kernel thread ended a wait
    /// in the driver (ioctl or poll) of a thread that makes synchronizing CUDA calls, or of
    /// libcuda's event-handler thread (`cuda-EvtHandlr`).
    GpuDriver,
    /// A timer: the end of a sleep the thread asked for (nanosleep, clock_nanosleep), or the
    /// timeout of a wait (a poll's, a futex wait's): a timer callback ended it, in an interrupt
    /// the kernel charges to whatever task it hit, which is not named.
    Timer,
}

/// The task that ended a wait.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct WakerRef {
    pub tid: u32,
    pub pid: u32,
    pub comm: String,
    pub kind: WakerKind,
}

impl WakerRef {
    /// "thread 12 (python3)", "kworker/0:1 (kernel thread)", "an interrupt".
    pub fn describe(&self) -> String {
        let comm = printable(&self.comm);
        match self.kind {
            WakerKind::Interrupt => "an interrupt (a device's, or on an idle CPU)".into(),
            WakerKind::GpuDriver => "the GPU driver (its completion interrupt)".into(),
            WakerKind::Timer => "a timer (its own timeout or sleep)".into(),
            WakerKind::KernelThread => format!("{comm} (kernel thread)"),
            WakerKind::SameProcess => format!("thread {} ({comm})", self.tid),
            _ => format!("{comm} (PID {}, thread {})", self.pid, self.tid),
        }
    }
}

/// One thread's waits that one task ended, in one kind of system call.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct HeldUp {
    /// The thread that waited, and its process.
    pub tid: u32,
    pub pid: u32,
    pub comm: String,
    pub by: WakerRef,
    pub blocked_in: BlockedIn,
    pub blocked_ns: u64,
    pub wakeups: u64,
    pub max_ns: u64,
    /// Share of the waiting thread's blocked time.
    pub share_of_blocked: f64,
    /// One hop on, for a waker of the set: the share of the window it was on a CPU (a holder
    /// working while the other waits), and the task that ended most of its own waiting.
    pub waker_oncpu_share: Option<f64>,
    pub waker_held_up_by: Option<WakerRef>,
}

/// Names and classifies the tasks that ended target threads' waits.
pub struct Classifier<'a> {
    threads: HashMap<u32, &'a crate::recording::ThreadRecord>,
    members: std::collections::HashSet<u32>,
    /// A waker's process and name, from the kernel's totals (which have them for tasks outside
    /// the set too).
    seen: HashMap<u32, (u32, &'a str, bool)>,
}

impl<'a> Classifier<'a> {
    pub fn new(rec: &'a Recording) -> Self {
        Self {
            threads: rec.threads.iter().map(|t| (t.tid, t)).collect(),
            members: rec.processes.iter().map(|p| p.pid).collect(),
            seen: rec
                .wakers
                .iter()
                .map(|w| {
                    let v = (w.waker_tgid, w.waker_comm.as_str(), w.kernel_thread);
                    (w.waker_tid, v)
                })
                .collect(),
        }
    }

    /// Whether `tid` waits for the GPU in the driver: it makes synchronizing CUDA calls, or it
    /// is libcuda's event-handler thread. With blocking sync (`cudaEventBlockingSync`,
    /// `cudaDeviceScheduleBlockingSync`) that thread sleeps in a poll of the device until the
    /// GPU's completion interrupt and then wakes the synchronizing thread by a futex (seen on
    /// an H100, docs/GPU.md): the interrupt is the driver's, the futex the helper's.
    fn waits_for_gpu(&self, tid: u32) -> bool {
        self.threads.get(&tid).is_some_and(|t| {
            t.cuda.as_ref().is_some_and(|c| c.sync_calls > 0) || t.comm == CUDA_EVENT_HANDLER
        })
    }

    /// The task `waker_tid` (of process `tgid` when known, 0 if not) that ended a wait of
    /// `tid` in `blocked_in`.
    fn classify(
        &self,
        tid: u32,
        waker_tid: u32,
        tgid: u32,
        comm: &str,
        kthread: bool,
        blocked_in: BlockedIn,
    ) -> WakerRef {
        if blocked_in == BlockedIn::Sleep {
            // A signal could end it too, but rarely does; the task the timer's interrupt hit
            // had nothing to do with it (before the interrupt marks, and on kernels where a
            // timer's callback is not marked, it was named as the waker: "a sleep ended by
            // rustc").
            return Self::timer();
        }
        let pid_of = |t: u32| self.threads.get(&t).map(|t| t.pid);
        let pid = if tgid != 0 {
            tgid
        } else {
            pid_of(waker_tid).unwrap_or(0)
        };
        let own = pid_of(tid).unwrap_or(0);
        let in_driver = matches!(blocked_in, BlockedIn::Ioctl | BlockedIn::Poll);
        let kind = if (waker_tid == 0 || kthread) && in_driver && self.waits_for_gpu(tid) {
            WakerKind::GpuDriver
        } else if waker_tid == 0 {
            WakerKind::Interrupt
        } else if kthread {
            WakerKind::KernelThread
        } else if pid == own {
            WakerKind::SameProcess
        } else if self.members.contains(&pid) || self.threads.contains_key(&waker_tid) {
            WakerKind::Member
        } else {
            WakerKind::OtherProcess
        };
        WakerRef {
            tid: waker_tid,
            pid,
            comm: comm.to_string(),
            kind,
        }
    }

    /// A timer's callback ended the wait: no task did.
    fn timer() -> WakerRef {
        WakerRef {
            tid: 0,
            pid: 0,
            comm: String::new(),
            kind: WakerKind::Timer,
        }
    }

    pub fn of_record(&self, w: &WakerRecord) -> WakerRef {
        if w.timer {
            return Self::timer();
        }
        let (t, b) = (w.waker_tid, w.blocked_in());
        self.classify(w.tid, t, w.waker_tgid, &w.waker_comm, w.kernel_thread, b)
    }

    /// The waker of one blocked interval of `tid`, from its wakeup record.
    pub fn of_woken(&self, tid: u32, w: &Woken) -> WakerRef {
        if w.flags & WAKER_TIMER != 0 {
            return Self::timer();
        }
        let by = w.by;
        let kthread = w.flags & WAKER_KTHREAD != 0;
        let (tgid, comm) = match (self.seen.get(&by), self.threads.get(&by)) {
            (Some(&(tgid, comm, _)), _) => (tgid, comm),
            (None, Some(t)) => (t.pid, t.comm.as_str()),
            (None, None) => (0, ""),
        };
        self.classify(tid, by, tgid, comm, kthread, BlockedIn::of(w.syscall))
    }
}

/// Every thread's waits by waker, as the summary lists them, largest first: each thread's
/// `PAIRS_PER_THREAD` largest, at most `PAIRS_PER_PROCESS` for each process.
pub fn summarize(rec: &Recording) -> Vec<HeldUp> {
    let c = Classifier::new(rec);
    let threads = &c.threads;
    let window = rec.duration_ns().max(1) as f64;
    // Each thread's largest waker, for the hop.
    let mut top: HashMap<u32, &WakerRecord> = HashMap::new();
    for w in &rec.wakers {
        let e = top.entry(w.tid).or_insert(w);
        if w.blocked_ns > e.blocked_ns {
            *e = w;
        }
    }
    let pairs: Vec<HeldUp> = rec
        .wakers
        .iter()
        .filter(|w| w.blocked_ns > 0)
        .filter_map(|w| {
            let t = threads.get(&w.tid)?;
            let by = c.of_record(w);
            let inside = matches!(by.kind, WakerKind::SameProcess | WakerKind::Member);
            let waker = threads.get(&w.waker_tid).filter(|_| inside);
            Some(HeldUp {
                tid: w.tid,
                pid: t.pid,
                comm: t.comm.clone(),
                blocked_in: w.blocked_in(),
                blocked_ns: w.blocked_ns,
                wakeups: w.count,
                max_ns: w.max_ns,
                share_of_blocked: w.blocked_ns as f64 / t.totals.time.blocked_ns.max(1) as f64,
                waker_oncpu_share: waker.map(|b| b.totals.time.oncpu_ns as f64 / window),
                waker_held_up_by: waker
                    .and_then(|b| top.get(&b.tid))
                    .map(|w2| c.of_record(w2)),
                by,
            })
        })
        .collect();
    let mut pairs = merge_timers(pairs);
    pairs.sort_by(|a, b| {
        b.blocked_ns
            .cmp(&a.blocked_ns)
            .then((a.tid, a.by.tid).cmp(&(b.tid, b.by.tid)))
    });
    let (mut per, mut each): (HashMap<u32, usize>, HashMap<u32, usize>) = Default::default();
    pairs.retain(|p| {
        let t = each.entry(p.tid).or_default();
        *t += 1;
        if *t > PAIRS_PER_THREAD {
            return false;
        }
        let n = per.entry(p.pid).or_default();
        *n += 1;
        *n <= PAIRS_PER_PROCESS
    });
    pairs
}

/// One pair per thread and system call for its timers: the kernel keys a sleep's by the task
/// each timer interrupt happened to hit (where its callback is not marked), which says nothing.
/// The system call stays apart: a futex wait's timeout is a lock's, a sleep's is not.
fn merge_timers(pairs: Vec<HeldUp>) -> Vec<HeldUp> {
    let mut out: Vec<HeldUp> = Vec::with_capacity(pairs.len());
    // Each thread's timer pair in `out`: thousands of pairs are merged in one pass.
    let mut timer_of: HashMap<(u32, BlockedIn), usize> = HashMap::new();
    for p in pairs {
        if p.by.kind != WakerKind::Timer {
            out.push(p);
            continue;
        }
        match timer_of.get(&(p.tid, p.blocked_in)) {
            Some(&i) => {
                let o = &mut out[i];
                o.blocked_ns += p.blocked_ns;
                o.wakeups += p.wakeups;
                o.max_ns = o.max_ns.max(p.max_ns);
                o.share_of_blocked += p.share_of_blocked;
            }
            None => {
                timer_of.insert((p.tid, p.blocked_in), out.len());
                out.push(p);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recording::testutil::{recording, thread};

    fn waker(tid: u32, waker_tid: u32, waker_tgid: u32, syscall: u32, ns: u64) -> WakerRecord {
        WakerRecord {
            tid,
            waker_tid,
            waker_tgid,
            waker_comm: format!("w{waker_tid}"),
            kernel_thread: false,
            timer: false,
            syscall: Some(syscall),
            blocked_ns: ns,
            count: 10,
            max_ns: ns / 5,
            hist: vec![],
        }
    }

    #[test]
    fn pairs_are_ranked_with_the_kind_of_waker_and_one_hop() {
        let mut rec = recording(
            vec![thread(10, 100, 1_000, &[]), thread(11, 900_000_000, 0, &[])],
            vec![],
        );
        rec.end_ns = rec.start_ns + 1_000_000_000;
        rec.threads[0].totals.time.blocked_ns = 800_000_000;
        rec.threads[0].pid = 10;
        rec.threads[1].pid = 10;
        rec.wakers = vec![
            waker(10, 11, 10, 202, 600_000_000),
            waker(10, 0, 0, 232, 100_000_000),
            waker(10, 77, 77, 0, 50_000_000),
            waker(11, 0, 0, 35, 1_000),
        ];
        let p = summarize(&rec);
        assert_eq!(p.len(), 4);
        assert_eq!(p[0].by.kind, WakerKind::SameProcess);
        assert_eq!(p[0].blocked_in, BlockedIn::of(Some(202)));
        assert!((p[0].share_of_blocked - 0.75).abs() < 1e-9);
        // The holder was on a CPU 900 ms of the 1 s window; its own waits were sleeps.
        assert!((p[0].waker_oncpu_share.unwrap() - 0.9).abs() < 1e-9);
        assert_eq!(
            p[0].waker_held_up_by.as_ref().map(|w| w.kind),
            Some(WakerKind::Timer)
        );
        assert_eq!(p[1].by.kind, WakerKind::Interrupt);
        assert_eq!(p[2].by.kind, WakerKind::OtherProcess);
        assert!(p[2].waker_oncpu_share.is_none());
    }

    /// A sleep's end is its timer's, whatever task the timer interrupt hit: one pair, the
    /// tasks not named (before: "a sleep ended by rustc", one pair per task hit).
    #[test]
    fn sleeps_are_ended_by_their_timer_not_the_task_it_hit() {
        let mut rec = recording(vec![thread(10, 100, 1_000, &[])], vec![]);
        rec.threads[0].pid = 10;
        rec.threads[0].totals.time.blocked_ns = 1_000;
        rec.wakers = vec![
            waker(10, 555, 555, 230, 300),
            waker(10, 0, 0, 35, 200),
            waker(10, 11, 10, 202, 100),
        ];
        let p = summarize(&rec);
        assert_eq!(p.len(), 2, "{p:?}");
        assert_eq!(p[0].by.kind, WakerKind::Timer);
        assert_eq!((p[0].by.tid, p[0].blocked_ns, p[0].wakeups), (0, 500, 20));
        assert!((p[0].share_of_blocked - 0.5).abs() < 1e-9);
        assert_eq!(p[0].by.describe(), "a timer (its own timeout or sleep)");
        assert_eq!(p[1].by.kind, WakerKind::SameProcess);
    }

    /// A thread that makes synchronizing CUDA calls, blocked in poll: a device's interrupt
    /// ending it is the GPU driver's, its timeout a timer's (before the kernel side told
    /// timers apart, both read as the driver's); a futex wait's timeouts stay their own pair,
    /// apart from the poll's, for the lock rules.
    #[test]
    fn a_timeout_is_a_timer_not_the_gpu_driver() {
        let mut rec = recording(vec![thread(10, 100, 1_000, &[])], vec![]);
        rec.threads[0].pid = 10;
        rec.threads[0].totals.time.blocked_ns = 1_000;
        rec.threads[0].cuda = Some(crate::recording::cuda::CudaTotals {
            sync_calls: 5,
            ..Default::default()
        });
        let timer = |syscall, ns| WakerRecord {
            timer: true,
            ..waker(10, 0, 0, syscall, ns)
        };
        // poll (7) and futex (202) on x86-64.
        rec.wakers = vec![waker(10, 0, 0, 7, 400), timer(7, 300), timer(202, 200)];
        let p = summarize(&rec);
        let got: Vec<_> = p
            .iter()
            .map(|p| (p.by.kind, p.blocked_in, p.blocked_ns))
            .collect();
        assert_eq!(
            got,
            [
                (WakerKind::GpuDriver, BlockedIn::of(Some(7)), 400),
                (WakerKind::Timer, BlockedIn::of(Some(7)), 300),
                (WakerKind::Timer, BlockedIn::of(Some(202)), 200),
            ]
        );
    }

    /// Blocking sync as an H100 ran it: the synchronizing thread's futex waits ended by
    /// libcuda's event-handler thread, whose polls the GPU's interrupt ended (the driver's)
    /// or its timeout (a timer's): one hop from the waiting thread to the driver. A thread of
    /// another name, no CUDA calls, woken in poll by an interrupt (a network packet on an idle
    /// CPU) is no driver's.
    #[test]
    fn the_cuda_event_handler_waits_for_the_driver() {
        let mut rec = recording(
            vec![
                thread(10, 100, 1_000, &[]),
                thread(11, 100, 1_000, &[]),
                thread(12, 100, 1_000, &[]),
            ],
            vec![],
        );
        for (t, comm) in rec
            .threads
            .iter_mut()
            .zip(["python3", CUDA_EVENT_HANDLER, "zmq"])
        {
            t.pid = 10;
            t.comm = comm.into();
            t.totals.time.blocked_ns = 1_000;
        }
        rec.wakers = vec![
            waker(10, 11, 10, 202, 900),
            waker(11, 0, 0, 7, 800),
            WakerRecord {
                timer: true,
                ..waker(11, 0, 0, 7, 100)
            },
            waker(12, 0, 0, 7, 700),
        ];
        let p = summarize(&rec);
        let got: Vec<_> = p.iter().map(|p| (p.tid, p.by.kind)).collect();
        assert_eq!(
            got,
            [
                (10, WakerKind::SameProcess),
                (11, WakerKind::GpuDriver),
                (12, WakerKind::Interrupt),
                (11, WakerKind::Timer),
            ]
        );
        assert_eq!(
            p[0].waker_held_up_by.as_ref().map(|w| w.kind),
            Some(WakerKind::GpuDriver)
        );
    }
}
