//! The records the ring buffer carries, and the per-CPU batches they travel in.

/// Kinds of timeline events. Fixed discriminants: they are part of the trace format.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// The thread got a CPU. `cpu`: that CPU; `value`: how long it waited runnable (0 when the
    /// wait began before the recording); `aux`: TID that ran on the CPU before it.
    SwitchIn = 1,
    /// The thread left the CPU. `aux`: 1 if it was still runnable (involuntary), 0 if it blocked;
    /// `value`: how long this slice on the CPU lasted (0 when it began before the recording).
    SwitchOut = 2,
    /// The thread was woken. `cpu`: the CPU whose run queue it joins; `aux`: waker TID.
    Wakeup = 3,
    /// A thread created during the recording was woken for the first time.
    WakeupNew = 4,
    /// The thread moved between CPUs. `aux`: from CPU; `cpu`: to CPU.
    Migrate = 5,
    /// A thread was created. `aux`: the TID of the thread that created it.
    ThreadNew = 6,
    /// The thread exited.
    ThreadExit = 7,
    /// Counter deltas over one on-CPU slice: a `CounterSlice` record, not an `Event`.
    CounterSlice = 8,
    /// The thread launched a CUDA kernel. `aux`: the `CudaFn`.
    CudaLaunch = 9,
    /// The thread returned from a synchronizing CUDA call. `aux`: the `CudaFn`; `value`: how
    /// long it was inside (the call started at `ts_ns - value`).
    CudaSync = 10,
    /// The target called its request-start marker function. `aux`: 1 if `value` holds the
    /// request id (read from the argument named at load time), 0 if not; `cpu`: the CPU.
    RequestStart = 11,
    /// The target called its request-end marker function; fields as for `RequestStart`.
    RequestEnd = 12,
    /// A thread that was not the process's main one exec'd and took over the main TID
    /// (`tid`, the TGID). `aux`: the TID it had, which ends here.
    Exec = 13,
    /// A garbage collection began (CPython's `gc__start` USDT probe). `value`: the generation
    /// (with `aux` 1; 0: not read).
    GcStart = 14,
    /// A garbage collection ended (`gc__done`). `value`: objects collected (with `aux` 1).
    GcDone = 15,
}

impl TryFrom<u32> for EventKind {
    type Error = u32;
    fn try_from(v: u32) -> Result<Self, u32> {
        Ok(match v {
            1 => Self::SwitchIn,
            2 => Self::SwitchOut,
            3 => Self::Wakeup,
            4 => Self::WakeupNew,
            5 => Self::Migrate,
            6 => Self::ThreadNew,
            13 => Self::Exec,
            7 => Self::ThreadExit,
            8 => Self::CounterSlice,
            9 => Self::CudaLaunch,
            10 => Self::CudaSync,
            11 => Self::RequestStart,
            12 => Self::RequestEnd,
            14 => Self::GcStart,
            15 => Self::GcDone,
            other => return Err(other),
        })
    }
}

/// One state transition of a target thread, on the ring buffer.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    /// `bpf_ktime_get_ns()`: CLOCK_MONOTONIC.
    pub ts_ns: u64,
    pub tid: u32,
    /// `EventKind` in the low byte; for a `SwitchIn`, the `WaitCode` of the wait it ends in
    /// the next bits (`WAIT_CODE_SHIFT`), and its throttled share (`THROTTLED_SHIFT`). Records
    /// of trace format 1 have no wait code; records written before the share have 0 there.
    pub kind: u32,
    pub cpu: u32,
    pub aux: u32,
    pub value: u64,
}

/// A `SwitchOut` record's `aux`: bit 0 set when the switch left the thread runnable; this bit
/// too when that was not a preemption but the state the tracepoint reported, which a classic
/// tracepoint before Linux 5.18 re-reads after a wakeup may have begun: a wakeup before the
/// thread runs again then says it had blocked.
pub const SWITCH_RUNNABLE_UNSURE: u32 = 2;

/// Where a `SwitchIn` record keeps its `WaitCode`.
pub const WAIT_CODE_SHIFT: u32 = 8;
/// Where a `SwitchIn` record keeps the share of its wait, in thousandths (0-1000, 10 bits),
/// that CFS bandwidth control held the thread's cgroup throttled (its CPU quota spent for the
/// period), whatever the wait's code says ran meanwhile; of a `WaitCode::Handoff`, the share
/// its partner held the CPU instead. 0 in trace files written before.
pub const THROTTLED_SHIFT: u32 = 16;
pub const THROTTLED_MASK: u32 = 0x3ff;
/// The bits of `Event::kind` that hold the `EventKind`.
pub const KIND_MASK: u32 = 0xff;

/// What kind of run-queue wait a switch-in ended, decided in the kernel from the thread's
/// state there (records arrive grouped by CPU, not in time order, so userspace cannot
/// follow a thread's transitions as they come).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitCode {
    /// Not classified: records of trace format 1.
    None = 0,
    /// Another task held the CPU.
    Contention = 1,
    /// The thread was moved to another CPU while it waited.
    Migration = 2,
    /// The CPU was idle when the thread got it.
    IdleCpu = 3,
    /// A handoff: the thread waited behind the thread it exchanges work with, which blocked as
    /// it got the CPU: one it had just woken and was preempted by, or the one that woke it on
    /// its own CPU and ran on (tracer-ebpf `sched/mod.rs`, `linked`). The share field says
    /// how much of the wait that thread's last slice covered; the rest is contention.
    Handoff = 4,
}

impl Event {
    /// The record's `EventKind`, without the wait code.
    #[inline(always)]
    pub fn event_kind(&self) -> Result<EventKind, u32> {
        EventKind::try_from(self.kind & KIND_MASK)
    }

    /// For a `SwitchIn`, the part of the wait it ended that its share field gives: of a
    /// handoff, the part its partner held the CPU; of any other wait, the part the thread's
    /// cgroup was throttled.
    #[inline(always)]
    pub fn part_ns(&self) -> u64 {
        let permille = u128::from((self.kind >> THROTTLED_SHIFT) & THROTTLED_MASK).min(1000);
        // In u128: a damaged file's wait can be any u64.
        (u128::from(self.value) * permille / 1000) as u64
    }

    /// For a `SwitchIn`, how much of the wait it ended the thread's cgroup was throttled.
    #[inline(always)]
    pub fn throttled_ns(&self) -> u64 {
        match self.wait_code() {
            WaitCode::Handoff => 0,
            _ => self.part_ns(),
        }
    }

    /// For a `SwitchIn` that ended a handoff, the part of the wait its partner held the CPU.
    #[inline(always)]
    pub fn handoff_ns(&self) -> u64 {
        match self.wait_code() {
            WaitCode::Handoff => self.part_ns(),
            _ => 0,
        }
    }

    #[inline(always)]
    pub fn wait_code(&self) -> WaitCode {
        match (self.kind >> WAIT_CODE_SHIFT) & 7 {
            1 => WaitCode::Contention,
            2 => WaitCode::Migration,
            3 => WaitCode::IdleCpu,
            4 => WaitCode::Handoff,
            _ => WaitCode::None,
        }
    }
}

/// Room for the records a CPU gathers before sending them to the ring buffer as one (a power
/// of two; the loader may set a smaller `Config::batch_bytes`).
pub const BATCH_BYTES: usize = 4096;
const _: () = assert!(BATCH_BYTES.is_power_of_two());

/// Per-CPU records not yet sent (the kernel side's `BATCH` map). The ring buffer costs about
/// 170 ns per record on our VMs whatever its size, so the scheduler programs append their
/// records here and send them together; the reader takes what is left after detaching.
#[repr(C, align(8))]
#[derive(Clone, Copy)]
pub struct BatchBuf {
    /// Bytes used in `bytes`: records back to back, each told by its kind.
    pub len: u32,
    /// How many records `len` bytes hold (for the drop count if the ring buffer is full).
    pub records: u32,
    /// `jiffies` when the first record went in: the batch is sent at the first context switch
    /// on its CPU after the next tick, so nothing waits in it longer than about a tick.
    pub first_jiffies: u64,
    pub bytes: [u8; BATCH_BYTES],
}
