//! Per-thread scheduler accounting kept in the kernel's maps, and what the kernel side could
//! not record.

/// Length of a kernel task name (`TASK_COMM_LEN`).
pub const COMM_LEN: usize = 16;

/// Slots of the in-kernel run-queue wait histogram. Slot `i` counts waits `w` with
/// `2^(i-1) <= w < 2^i` nanoseconds (slot 0: `w == 0`); the last slot takes everything longer.
/// 40 slots reach 2^39 ns, about 9 minutes.
pub const RUNQ_HIST_SLOTS: usize = 40;

/// Maximum number of threads tracked at once in the kernel. Userspace moves dead threads out of
/// the map while recording, so this bounds live threads, not threads seen.
pub const MAX_THREADS: u32 = 16384;
/// Direct-mapped thread slots (`THREAD_SLOTS`, indexed by TID modulo the count, a power of
/// two; the loader may change it): a thread whose slot another thread holds goes to the
/// `THREADS` hash map instead. A process's threads mostly have nearby TIDs, so they rarely
/// collide.
pub const THREAD_SLOTS: u32 = 4096;
/// `BPF_F_MMAPABLE`: userspace maps the slots into its memory and reads them without a system
/// call per slot.
pub const BPF_F_MMAPABLE: u32 = 1 << 10;
/// Maximum number of distinct tasks recorded as having run while a target thread waited.
pub const MAX_PREEMPTORS: u32 = 4096;
/// Maximum number of distinct (thread, from CPU, to CPU) migration routes.
pub const MAX_MIGRATION_ROUTES: u32 = 16384;

/// Where a target thread is in its life, as the kernel side sees it.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThreadState {
    /// No event seen yet.
    Unknown = 0,
    /// On a CPU.
    Running = 1,
    /// On a run queue, waiting for a CPU (woken up, or preempted).
    Runnable = 2,
    /// Off CPU and not runnable (sleeping, waiting on I/O, a lock, the GPU...).
    Blocked = 3,
    /// Created, not yet woken for the first time.
    New = 4,
    /// Switched out for the last time after exiting.
    Dead = 5,
}

impl TryFrom<u32> for ThreadState {
    type Error = u32;
    fn try_from(v: u32) -> Result<Self, u32> {
        Ok(match v {
            0 => Self::Unknown,
            1 => Self::Running,
            2 => Self::Runnable,
            3 => Self::Blocked,
            4 => Self::New,
            5 => Self::Dead,
            other => return Err(other),
        })
    }
}

/// `ThreadStats::flags`: the thread was created during the recording.
pub const FLAG_CREATED: u32 = 1;
/// `ThreadStats::flags`: the thread exited during the recording.
pub const FLAG_EXITED: u32 = 2;
/// `ThreadStats::flags`: the entry was created when the map was full of other entries and
/// an earlier insert failed, so the counts may start late.
pub const FLAG_LATE: u32 = 4;
/// `ThreadStats::flags`, kernel side only: the thread was moved to another CPU while it waited
/// in a run queue (its current wait is a `WaitCode::Migration`).
pub const FLAG_MOVED: u32 = 8;
/// `ThreadStats::flags`: `seen_*` hold the kernel's own counters of the thread as of its last
/// traced event (tp_btf programs read them from the task_struct).
pub const FLAG_SEEN: u32 = 16;
/// `ThreadStats::flags`: the thread's TID ended in an exec by another thread of its process,
/// which took over the process's main TID (`de_thread`, fs/exec.c).
pub const FLAG_EXECED: u32 = 32;
/// `ThreadStats::flags`, kernel side only: a switch-in no tracepoint reported was repaired by
/// counting the thread as running from when it was last seen waiting; its own run time, read
/// at its next traced event, says how much of that it was still waiting.
pub const FLAG_REPAIRED: u32 = 64;
/// `ThreadStats::flags`, kernel side only: the thread's last switch-out was not a preemption
/// and reported it runnable, which a classic tracepoint before Linux 5.18 also does for a
/// task that blocked and was woken before the record was written (the state is re-read
/// then): a wakeup before it runs again says it blocked.
pub const FLAG_RUNNABLE_UNSURE: u32 = 128;
/// `ThreadStats::flags`, kernel side only: `throttled_at_wait` was read when the current wait
/// began, so its growth at the switch-in is the wait's throttled part. A wait begun another way
/// (a repaired switch) has no reading, and its share is left unknown (0).
pub const FLAG_THROTTLE_BASE: u32 = 256;
/// `ThreadStats::flags`, kernel side only: the thread's current wait began with a wakeup
/// whose waker `sched_waking` noted (`waker_tid`); cleared when it next switches in or out.
pub const FLAG_WOKEN: u32 = 512;
/// `ThreadStats::flags`, kernel side only: the thread was preempted by the task it had just
/// woken (a thread's `FLAG_WOKEN` wait, `waker_tid` this one; a task outside the target,
/// `woke_tid`). If that task blocks as this one gets the CPU back, the wait was a handoff
/// (`WaitCode::Handoff`).
pub const FLAG_HANDOFF: u32 = 1024;
/// `ThreadStats::flags`, kernel side only: the task leaving the CPU as this thread gets it is
/// its partner and blocks (`partner_since_ns` holds since when it ran); decided just before
/// the switch is accounted, used at this thread's switch-in.
pub const FLAG_PARTNER: u32 = 2048;

/// Per-thread totals, aggregated in the kernel, keyed by TID.
///
/// Time accounting: every event moves the thread between states; the time spent in the state it
/// leaves is added to `oncpu_ns`, `runq_wait_ns` or `blocked_ns`. The interval before the first
/// event and after the last one are not known to the kernel side: `first_ts_ns` / `first_state`
/// and `state_ts_ns` / `state` let userspace close both ends against its own window.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ThreadStats {
    pub tid: u32,
    pub tgid: u32,
    pub comm: [u8; COMM_LEN],
    /// Current `ThreadState`.
    pub state: u32,
    /// The state the thread was in before the first event of the recording (deduced from that
    /// event: a switch-out means it was running, a switch-in that it was runnable, a wakeup
    /// that it was blocked).
    pub first_state: u32,
    /// Monotonic time of the first event.
    pub first_ts_ns: u64,
    /// Monotonic time the current state was entered.
    pub state_ts_ns: u64,
    pub created_ts_ns: u64,
    pub exited_ts_ns: u64,
    /// Switches out while blocking (the kernel's `nvcsw`).
    pub voluntary_switches: u64,
    /// Switches out while still runnable: preemption or yield (the kernel's `nivcsw`).
    pub involuntary_switches: u64,
    /// Changes of CPU (the kernel's `se.nr_migrations`).
    pub migrations: u64,
    /// Wakeups from blocked to runnable.
    pub wakeups: u64,
    pub oncpu_ns: u64,
    pub runq_wait_ns: u64,
    pub blocked_ns: u64,
    /// Number of complete run-queue waits (runnable -> running) seen inside the window.
    pub runq_waits: u64,
    pub runq_wait_max_ns: u64,
    /// `cfs_rq_throttled_off`'s counter of the thread's group queue when its current wait
    /// began: what it grew by at the switch-in is the wait's throttled time.
    pub throttled_at_wait: u64,
    /// With `FLAG_PARTNER`: since when the thread's partner, which blocked as this one got the
    /// CPU, had run (its last slice): the handoff part of the wait is from then on.
    pub partner_since_ns: u64,
    /// When the thread's last slice on a CPU began, kept at its switch-out (which moves
    /// `state_ts_ns` on) for the thread switching in after it (`partner_since_ns`).
    pub slice_start_ns: u64,
    /// The task outside the target this thread last woke in its current slice (0: none),
    /// noted at `sched_waking` in its context (the wakee has no entry to note it in); cleared
    /// at each switch-in. Kept through a wait that began when that task took the CPU from it
    /// (`FLAG_HANDOFF`), to know the partner when it blocks.
    pub woke_tid: u32,
    pub _pad: u32,
    /// CPU whose run queue holds the thread while it is runnable.
    pub wait_cpu: u32,
    /// CPU the thread last ran on.
    pub last_cpu: u32,
    pub parent_tid: u32,
    /// `FLAG_*` bits.
    pub flags: u32,
    /// This thread as a preemptor of the target's other threads (see `Preemptor`), kept here
    /// rather than in the preemptor map: the thread's entry is at hand when it switches out,
    /// and a second map lookup per switch cost 40-110 ns (BENCHMARKS.md).
    pub caused_wait_ns: u64,
    pub caused_slices: u64,
    /// The kernel's `se.sum_exec_runtime`, `nvcsw` and `nivcsw` of the thread as of its last
    /// traced event (with `FLAG_SEEN`). A switch the tracepoint never reported shows as a
    /// difference at the next traced event, which then accounts it exactly (`sched.rs`).
    pub seen_exec_ns: u64,
    pub seen_nvcsw: u64,
    pub seen_nivcsw: u64,
    /// The same for `se.nr_migrations`: a move no sched_migrate_task reported (as switches go
    /// unreported on our VMs, so do some moves) is added at the next traced event.
    pub seen_migrations: u64,
    pub runq_hist: [u32; RUNQ_HIST_SLOTS],
    /// Who is waking the thread, noted at `sched_waking` (which runs in the waker's context;
    /// `sched_wakeup` may run later on the wakee's CPU, in whatever task runs there) and used
    /// at the wakeup that follows (with `WAKER_PENDING`): `WakerKey`'s waker and syscall.
    pub waker_tid: u32,
    pub waker_tgid: u32,
    pub waker_syscall: u32,
    /// `WAKER_*` bits.
    pub waker_flags: u32,
    pub waker_comm: [u8; COMM_LEN],
    /// The waits one waker (in one system call) has ended in a row, not yet added to
    /// `WAKERS`: the kernel side adds a run there when another waker ends a wait, userspace the
    /// last one at the end. A thread woken again and again by the same task (a queue handover,
    /// a lock passed back and forth) then costs no map lookup per wakeup (BENCHMARKS.md).
    pub run: WakerRun,
}

/// A run of waits one waker ended (see `ThreadStats::run`): its `WakerKey` (less the thread)
/// and what `WAKERS` would hold for it. Empty while `stats.count` is 0.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct WakerRun {
    pub waker_tid: u32,
    pub syscall: u32,
    pub stats: WakerStats,
}

impl WakerRun {
    /// The `WAKERS` key this run of thread `tid` is added under (the kernel side when another
    /// waker follows, userspace for the last run at the end).
    pub fn key(&self, tid: u32) -> WakerKey {
        WakerKey {
            tid,
            waker_tid: self.waker_tid,
            syscall: self.syscall,
            timer: u32::from(self.stats.flags & WAKER_TIMER != 0),
        }
    }

    pub const EMPTY: Self = Self {
        waker_tid: 0,
        syscall: 0,
        stats: WakerStats {
            waker_tgid: 0,
            flags: 0,
            comm: [0; COMM_LEN],
            blocked_ns: 0,
            count: 0,
            max_ns: 0,
            hist: [0; RUNQ_HIST_SLOTS],
        },
    };
}

impl ThreadStats {
    pub const fn new(tid: u32, tgid: u32) -> Self {
        Self {
            tid,
            tgid,
            comm: [0; COMM_LEN],
            state: ThreadState::Unknown as u32,
            first_state: ThreadState::Unknown as u32,
            first_ts_ns: 0,
            state_ts_ns: 0,
            created_ts_ns: 0,
            exited_ts_ns: 0,
            voluntary_switches: 0,
            involuntary_switches: 0,
            migrations: 0,
            wakeups: 0,
            oncpu_ns: 0,
            runq_wait_ns: 0,
            blocked_ns: 0,
            runq_waits: 0,
            runq_wait_max_ns: 0,
            throttled_at_wait: 0,
            partner_since_ns: 0,
            slice_start_ns: 0,
            woke_tid: 0,
            _pad: 0,
            wait_cpu: u32::MAX,
            last_cpu: u32::MAX,
            parent_tid: 0,
            flags: 0,
            caused_wait_ns: 0,
            caused_slices: 0,
            seen_exec_ns: 0,
            seen_nvcsw: 0,
            seen_nivcsw: 0,
            seen_migrations: 0,
            runq_hist: [0; RUNQ_HIST_SLOTS],
            waker_tid: 0,
            waker_tgid: 0,
            waker_syscall: 0,
            waker_flags: 0,
            waker_comm: [0; COMM_LEN],
            run: WakerRun::EMPTY,
        }
    }
}

/// A task that ran on a CPU while target threads waited in that CPU's run queue, keyed by its
/// TID. `wait_ns` is the waiting it caused: the time it ran multiplied by the number of target
/// threads waiting meanwhile.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Preemptor {
    pub pid: u32,
    pub tgid: u32,
    pub comm: [u8; COMM_LEN],
    pub wait_ns: u64,
    /// Number of times it was switched out while target threads waited.
    pub slices: u64,
    /// Its parent's TGID (`real_parent`), when the programs can read it (0: unknown): with its
    /// cgroup, what groups neighbours made of several processes (stress-ng's workers, a shell
    /// loop's children) into one.
    pub ppid: u32,
    pub _pad: u32,
    /// Its cgroup (v2 id, `bpf_get_current_cgroup_id`; the cgroup directory's inode).
    pub cgroup_id: u64,
}

/// Processes the target started (and theirs), which its TGID filter does not trace.
pub const MAX_CHILDREN: u32 = 4096;
/// Cgroups `--cgroup` follows (the one given and its descendants).
pub const MAX_TARGET_CGROUPS: u32 = 4096;

/// One more than the highest PID a kernel gives (`PID_MAX_LIMIT`, include/linux/threads.h: 4M
/// on 64-bit; /proc/sys/kernel/pid_max cannot be set higher): the target set has a bit for each.
pub const PID_LIMIT: u32 = 4 << 20;
/// Words of the target set's bitmap (`TARGETS`): 512 KiB.
pub const TARGET_WORDS: u32 = PID_LIMIT / 64;

/// A process forked by the target or by one of its descendants during the recording.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ChildProcess {
    /// The process that forked it.
    pub parent: u32,
    pub _pad: u32,
    pub created_ns: u64,
    pub comm: [u8; COMM_LEN],
}

/// Per-CPU bookkeeping of target threads waiting in that CPU's run queue.
/// `pending_ns` integrates `waiters` over time since the last context switch on the CPU; the
/// next switch charges it to the task switched out. `switched_ns`: the time of the last switch
/// on the CPU that the programs timed, which every switch is while a target thread waits there
/// (`waiters`): the start of the running task's slice, or earlier than the wait (a task outside
/// the target has no entry to keep its slice's start in).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuWait {
    pub waiters: u32,
    /// The target thread on the CPU as of its last timed switch (0: none): every switch to or
    /// from a target thread is timed, so this is `current`'s, for the wakeups it makes
    /// (`sched_waking`) without a helper call at every wakeup of the host.
    pub running_tid: u32,
    pub since_ns: u64,
    pub pending_ns: u64,
    pub switched_ns: u64,
    /// The kinds of timer callback and device interrupt handler the CPU is in, a bit each
    /// (`IRQ_*`), from their tracepoints (tracer-ebpf `irq.rs`): a wakeup made in one is no
    /// task's doing.
    pub irq_bits: u32,
    /// The kind (`IRQ_*`) entered last: while its bit is up, the innermost of the marks (on
    /// arm64 the timer's hrtimer callbacks run inside its interrupt handler; on x86-64 a
    /// device's handler can interrupt a softirq's timer callback).
    pub irq_last: u32,
}

/// `CpuWait::irq_bits`: in a device's interrupt handler, an hrtimer callback, a timer-wheel
/// callback.
pub const IRQ_HANDLER: u32 = 1;
pub const IRQ_HRTIMER: u32 = 2;
pub const IRQ_TIMER: u32 = 4;

/// Tasks the PID namespace iterator can list (tracer-ebpf `pidns.rs`).
pub const MAX_PIDNS_TASKS: u32 = 1 << 18;
/// PID namespaces nest at most 32 deep (MAX_PID_NS_LEVEL); the iterator follows 8, which is
/// more than any container runtime makes.
pub const MAX_PIDNS_LEVELS: u32 = 8;

/// A task found in the PID namespace being listed, keyed by its TID in the initial namespace.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PidNsIds {
    /// Its process, in the initial namespace.
    pub tgid: u32,
    /// Its TID in the listed namespace.
    pub ns_tid: u32,
}

/// Distinct (wakee, waker, syscall) triples the waker map holds.
pub const MAX_WAKERS: u32 = 16384;

/// `ThreadStats::waker_flags` / `WakerStats::flags`: a waker was noted and not used yet.
pub const WAKER_PENDING: u32 = 1;
/// The waker is a kernel thread (`PF_KTHREAD`: a kworker, ksoftirqd, an interrupt thread...).
pub const WAKER_KTHREAD: u32 = 2;
/// The waker is the idle task: the wakeup came from an interrupt on an idle CPU.
pub const WAKER_IDLE: u32 = 4;
/// With `WAKER_IDLE`: the wakeup came from a timer callback (hrtimer or timer wheel) and no
/// device's handler, so a timeout ended the wait (a sleep's, a poll's, a futex wait's), not a
/// device or another task.
pub const WAKER_TIMER: u32 = 8;
/// `PF_KTHREAD` in `task_struct.flags` (include/linux/sched.h, unchanged since 2.6).
pub const PF_KTHREAD: u32 = 0x0020_0000;

/// Key of the waker map: a target thread's blocked intervals, by who ended them and in which
/// system call it was blocked (its number plus one, read from the wakee's saved registers;
/// 0: not known, as with the classic tracepoints or before Linux 5.15).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WakerKey {
    pub tid: u32,
    pub waker_tid: u32,
    pub syscall: u32,
    /// 1 for the waits a timer ended (`WAKER_TIMER`), 0 for the rest: a thread's timeouts and
    /// its device wakeups (both `waker_tid` 0) are separate entries.
    pub timer: u32,
}

/// The blocked intervals of one `WakerKey`: how many, how long in all and at most, their log2
/// histogram (`hist_slot`), and the waker's process and name.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct WakerStats {
    pub waker_tgid: u32,
    /// `WAKER_KTHREAD`, `WAKER_IDLE`.
    pub flags: u32,
    pub comm: [u8; COMM_LEN],
    pub blocked_ns: u64,
    pub count: u64,
    pub max_ns: u64,
    pub hist: [u32; RUNQ_HIST_SLOTS],
}

/// Key of the migration-route map: which thread moved from which CPU to which.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MigrationKey {
    pub tid: u32,
    pub from_cpu: u32,
    pub to_cpu: u32,
    pub _pad: u32,
}

/// Indexes of the per-CPU `COUNTERS` array: things the kernel side could not do.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    /// Ring buffer full: a timeline event was dropped (the in-kernel totals are still exact).
    RingbufDropped = 0,
    /// The thread map was full: a new thread could not be tracked.
    ThreadMapFull = 1,
    /// The preemptor map was full: some waiting could not be attributed.
    PreemptorMapFull = 2,
    /// The migration-route map was full.
    MigrationMapFull = 3,
    /// A target thread switched out while it was waiting for a CPU as far as the probes knew:
    /// the switch that gave it the CPU was not traced (see `sched.rs`).
    UnseenSwitchIn = 4,
    /// Switches off a CPU of a target thread that no tracepoint reported, found at its next
    /// traced event (it switched in while running as far as the probes knew, or its own
    /// counters had moved on).
    UnseenSwitchOut = 5,
    /// `bpf_perf_event_read_value` failed: a slice's counters are missing.
    PerfReadFailed = 6,
    /// Checks of a CPU's run-queue-to-monotonic clock difference against the clock helper
    /// (tracer-ebpf `clock.rs`), about one per CPU per tick.
    ClockChecks = 7,
    /// Sum over those checks of the difference's error, in ns.
    ClockErrorNs = 8,
    /// The map of joined processes was full: a process joined the set (it is traced) but its
    /// fork or move is not noted (userspace lists it from its threads, without the time).
    ChildMapFull = 9,
    /// The waker map was full: some blocked time is not attributed to its waker.
    WakerMapFull = 10,
    /// A target thread switched in while it was blocked as far as the probes knew: its wakeup
    /// was not traced, and the run-queue wait that wakeup began counts as blocked. The kernel
    /// skips classic tracepoint programs now and then without counting it anywhere (no
    /// `recursion_misses`): with `kernel.bpf_stats_enabled`, the classic `sched_wakeup`
    /// program ran 891 times in a second in which the tp_btf one ran 908, both attached to
    /// the cpu-contention demo (2026-12-05), and the classic recording's threads had 27 and
    /// 28 fewer wakeups than voluntary switches. Also counted, with no wakeup lost: a sleep a
    /// pending signal cut short, which kernels 5.18 to 6.12 report with the sleeping state
    /// (the task stayed runnable, and its wait counts as blocked all the same), and a wakeup
    /// between attaching `sched_switch` and `sched_wakeup`.
    UnseenWakeup = 11,
}
pub const COUNTER_SLOTS: u32 = 12;

/// Index of the run-queue wait histogram slot for a wait of `ns` nanoseconds.
#[inline(always)]
pub fn hist_slot(ns: u64) -> usize {
    let bits = (64 - ns.leading_zeros()) as usize;
    if bits >= RUNQ_HIST_SLOTS {
        RUNQ_HIST_SLOTS - 1
    } else {
        bits
    }
}
