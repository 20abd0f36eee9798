//! Who ended the target threads' blocked intervals: the kernel's totals per (thread, waker,
//! system call), and what the system call and the waker say about the wait.

use serde::{Deserialize, Serialize};
use tracer_common::{ThreadStats, WAKER_IDLE, WAKER_KTHREAD, WakerKey, WakerStats};

use super::names::comm_string;

/// A `WakerRecord`'s key: the thread, its waker, the system call, whether a timer.
pub type WakerKeyOf = (u32, u32, Option<u32>, bool);

/// The `WAKERS` key of a record's key (`WakerRecord::kernel_key`).
pub fn kernel_key((tid, waker_tid, syscall, timer): WakerKeyOf) -> WakerKey {
    WakerKey {
        tid,
        waker_tid,
        syscall: syscall.map_or(0, |s| s + 1),
        timer: timer as u32,
    }
}

/// A thread's blocked intervals that one waker ended, in one system call.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WakerRecord {
    /// The thread that was woken.
    pub tid: u32,
    /// The task that woke it (`current` at `sched_waking`; 0: the idle task, an interrupt).
    pub waker_tid: u32,
    pub waker_tgid: u32,
    pub waker_comm: String,
    /// The waker is a kernel thread.
    pub kernel_thread: bool,
    /// No task: a timer's callback ended the waits (a timeout or a sleep; `WAKER_TIMER`).
    /// Absent from files written before it was kept: false.
    #[serde(default)]
    pub timer: bool,
    /// The system call the thread was blocked in, when the kernel could say (5.15+, tp_btf).
    pub syscall: Option<u32>,
    pub blocked_ns: u64,
    pub count: u64,
    pub max_ns: u64,
    /// Log2 histogram of the intervals (`tracer_common::hist_slot`).
    pub hist: Vec<u32>,
}

impl WakerRecord {
    pub fn from_kernel(k: &WakerKey, v: &WakerStats) -> Self {
        Self {
            tid: k.tid,
            waker_tid: if v.flags & WAKER_IDLE != 0 {
                0
            } else {
                k.waker_tid
            },
            waker_tgid: v.waker_tgid,
            waker_comm: comm_string(&v.comm),
            kernel_thread: v.flags & WAKER_KTHREAD != 0,
            timer: k.timer != 0,
            syscall: k.syscall.checked_sub(1),
            blocked_ns: v.blocked_ns,
            count: v.count,
            max_ns: v.max_ns,
            hist: v.hist.to_vec(),
        }
    }

    /// The `WAKERS` key `from_kernel` read this under (its waker is 0 exactly where the
    /// kernel's is: the idle task, or an interrupt, whose wakes note no task).
    pub fn kernel_key(&self) -> WakerKey {
        kernel_key(self.key())
    }

    pub fn blocked_in(&self) -> BlockedIn {
        BlockedIn::of(self.syscall)
    }

    /// What tells one count from another of the same thread: its waker, system call, timer.
    pub fn key(&self) -> WakerKeyOf {
        (self.tid, self.waker_tid, self.syscall, self.timer)
    }

    /// Adds `o`, another count of the same `key`.
    pub fn merge(&mut self, o: &Self) {
        self.blocked_ns += o.blocked_ns;
        self.count += o.count;
        self.max_ns = self.max_ns.max(o.max_ns);
        if self.hist.len() < o.hist.len() {
            self.hist.resize(o.hist.len(), 0);
        }
        for (a, b) in self.hist.iter_mut().zip(&o.hist) {
            *a += b;
        }
    }
}

/// The kernel's `WAKERS` entries with each thread's last run of waits by one waker, which the
/// kernel side adds there only when another waker follows (`ThreadStats::run`).
pub fn with_runs(mut records: Vec<WakerRecord>, threads: &[ThreadStats]) -> Vec<WakerRecord> {
    let mut at: std::collections::HashMap<_, usize> = records
        .iter()
        .enumerate()
        .map(|(i, r)| (r.key(), i))
        .collect();
    for t in threads.iter().filter(|t| t.run.stats.count > 0) {
        let run = WakerRecord::from_kernel(&t.run.key(t.tid), &t.run.stats);
        match at.get(&run.key()) {
            Some(&i) => records[i].merge(&run),
            None => {
                at.insert(run.key(), records.len());
                records.push(run);
            }
        }
    }
    records
}

/// What a thread was blocked in, from its system call's number.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum BlockedIn {
    /// `futex`/`futex_waitv`: a lock, a condition variable, a semaphore (CPython's GIL).
    Futex,
    /// epoll, poll, select: waiting for any of several events (an event loop).
    Poll,
    /// read, recv: waiting for data on one file or socket.
    Read,
    /// nanosleep, clock_nanosleep: a sleep it asked for.
    Sleep,
    /// ioctl: inside a driver (the GPU driver's waits among them).
    Ioctl,
    /// wait4/waitid: waiting for a child process.
    ChildWait,
    /// Another system call.
    OtherSyscall,
    /// Not in a system call (a page fault), or not known (classic tracepoints, Linux < 5.15).
    Unknown,
}

impl BlockedIn {
    /// The numbers of the sleeps a thread asks for (`Sleep`), for the kernel side
    /// (`Config::sleep_syscalls`; `u32::MAX` fills what is left).
    pub fn sleep_numbers() -> [u32; 2] {
        let mut out = [u32::MAX; 2];
        let sleeps = Self::TABLE.iter().filter(|(_, b)| *b == Self::Sleep);
        for (slot, (nr, _)) in out.iter_mut().zip(sleeps) {
            *slot = *nr;
        }
        out
    }

    /// System call numbers of this architecture (arch/*/entry/syscalls, include/uapi/asm-generic
    /// unistd.h).
    #[cfg(target_arch = "x86_64")]
    const TABLE: &'static [(u32, BlockedIn)] = &[
        (202, Self::Futex),
        (449, Self::Futex),
        (7, Self::Poll),
        (23, Self::Poll),
        (232, Self::Poll),
        (270, Self::Poll),
        (271, Self::Poll),
        (281, Self::Poll),
        (441, Self::Poll),
        (0, Self::Read),
        (17, Self::Read),
        (19, Self::Read),
        (45, Self::Read),
        (47, Self::Read),
        (299, Self::Read),
        (35, Self::Sleep),
        (230, Self::Sleep),
        (16, Self::Ioctl),
        (61, Self::ChildWait),
        (247, Self::ChildWait),
    ];
    #[cfg(not(target_arch = "x86_64"))]
    const TABLE: &'static [(u32, BlockedIn)] = &[
        (98, Self::Futex),
        (449, Self::Futex),
        (22, Self::Poll),
        (72, Self::Poll),
        (73, Self::Poll),
        (441, Self::Poll),
        (63, Self::Read),
        (65, Self::Read),
        (67, Self::Read),
        (207, Self::Read),
        (212, Self::Read),
        (101, Self::Sleep),
        (115, Self::Sleep),
        (29, Self::Ioctl),
        (260, Self::ChildWait),
        (95, Self::ChildWait),
    ];

    pub fn of(syscall: Option<u32>) -> Self {
        let Some(nr) = syscall else {
            return Self::Unknown;
        };
        Self::TABLE
            .iter()
            .find(|(n, _)| *n == nr)
            .map_or(Self::OtherSyscall, |(_, b)| *b)
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Futex => "a futex (lock or condition variable)",
            Self::Poll => "poll/epoll",
            Self::Read => "a read",
            Self::Sleep => "a sleep",
            Self::Ioctl => "an ioctl (a driver)",
            Self::ChildWait => "waiting for a child",
            Self::OtherSyscall => "another system call",
            Self::Unknown => "no known system call",
        }
    }
}

/// Decodes the `value` of a wakeup record: the syscall (plus one) and the waker flags.
pub fn wakeup_how(value: u64) -> (Option<u32>, u32) {
    ((value as u32).checked_sub(1), (value >> 32) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syscalls_are_classified_and_unknown_stays_unknown() {
        #[cfg(target_arch = "x86_64")]
        {
            assert_eq!(BlockedIn::of(Some(202)), BlockedIn::Futex);
            assert_eq!(BlockedIn::of(Some(232)), BlockedIn::Poll);
            assert_eq!(BlockedIn::of(Some(1)), BlockedIn::OtherSyscall);
        }
        assert_eq!(BlockedIn::of(None), BlockedIn::Unknown);
        assert_eq!(wakeup_how(0), (None, 0));
        assert_eq!(wakeup_how(203 | (2 << 32)), (Some(202), 2));
    }
}

#[cfg(test)]
mod run_tests {
    use super::*;

    #[test]
    fn the_last_run_of_each_thread_joins_the_kernels_entries() {
        let key = WakerKey {
            tid: 7,
            waker_tid: 8,
            syscall: 203,
            timer: 0,
        };
        let mut stats = tracer_common::WakerRun::EMPTY.stats;
        stats.blocked_ns = 100;
        stats.count = 2;
        stats.max_ns = 60;
        stats.hist[3] = 2;
        let entries = vec![WakerRecord::from_kernel(&key, &stats)];
        let mut a = ThreadStats::new(7, 7);
        a.run.waker_tid = 8;
        a.run.syscall = 203;
        a.run.stats = stats;
        a.run.stats.max_ns = 90;
        // Another waker's run, not in the map yet; and a thread with no run.
        let mut b = ThreadStats::new(9, 7);
        b.run.waker_tid = 1;
        b.run.stats.count = 1;
        b.run.stats.blocked_ns = 5;
        let c = ThreadStats::new(10, 7);
        let r = with_runs(entries, &[a, b, c]);
        assert_eq!(r.len(), 2);
        assert_eq!((r[0].blocked_ns, r[0].count, r[0].max_ns), (200, 4, 90));
        assert_eq!(r[0].hist[3], 4);
        assert_eq!((r[1].tid, r[1].waker_tid, r[1].syscall), (9, 1, None));
        assert_eq!(r[1].blocked_ns, 5);
    }
}
