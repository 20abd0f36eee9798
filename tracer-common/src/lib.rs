//! Types shared by the eBPF programs (`tracer-ebpf`) and the userspace loader (`tracer`).
//!
//! Every type here crosses the kernel/user boundary as raw bytes, so each is `#[repr(C)]`,
//! `Copy`, built from fixed-width integers only (no `bool`, `usize` or pointers), with its
//! padding spelled out. Userspace decodes them with `read_unaligned` after a length check and
//! turns the `u32` kinds into enums with `TryFrom`, never with a transmute.
#![no_std]

/// Length of a kernel task name (`TASK_COMM_LEN`).
pub const COMM_LEN: usize = 16;

/// Slots of the in-kernel run-queue wait histogram. Slot `i` counts waits `w` with
/// `2^(i-1) <= w < 2^i` nanoseconds (slot 0: `w == 0`); the last slot takes everything longer.
/// 40 slots reach 2^39 ns, about 9 minutes.
pub const RUNQ_HIST_SLOTS: usize = 40;

/// Maximum number of threads tracked at once in the kernel. Userspace moves dead threads out of
/// the map while recording, so this bounds live threads, not threads seen.
pub const MAX_THREADS: u32 = 16384;
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
    /// CPU whose run queue holds the thread while it is runnable.
    pub wait_cpu: u32,
    /// CPU the thread last ran on.
    pub last_cpu: u32,
    pub parent_tid: u32,
    /// `FLAG_*` bits.
    pub flags: u32,
    pub runq_hist: [u32; RUNQ_HIST_SLOTS],
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
            wait_cpu: u32::MAX,
            last_cpu: u32::MAX,
            parent_tid: 0,
            flags: 0,
            runq_hist: [0; RUNQ_HIST_SLOTS],
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
}

/// Per-CPU bookkeeping of target threads waiting in that CPU's run queue.
/// `pending_ns` integrates `waiters` over time since the last context switch on the CPU; the
/// next switch charges it to the task switched out.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuWait {
    pub waiters: u32,
    pub _pad: u32,
    pub since_ns: u64,
    pub pending_ns: u64,
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
    /// A target thread switched in while it was running as far as the probes knew.
    UnseenSwitchOut = 5,
    /// `bpf_perf_event_read_value` failed: a slice's counters are missing.
    PerfReadFailed = 6,
}
pub const COUNTER_SLOTS: u32 = 7;

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
            7 => Self::ThreadExit,
            8 => Self::CounterSlice,
            9 => Self::CudaLaunch,
            10 => Self::CudaSync,
            11 => Self::RequestStart,
            12 => Self::RequestEnd,
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
    /// the next bits (`WAIT_CODE_SHIFT`). Records of trace format 1 have no wait code.
    pub kind: u32,
    pub cpu: u32,
    pub aux: u32,
    pub value: u64,
}

/// Where a `SwitchIn` record keeps its `WaitCode`.
pub const WAIT_CODE_SHIFT: u32 = 8;
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
}

impl Event {
    /// The record's `EventKind`, without the wait code.
    #[inline(always)]
    pub fn event_kind(&self) -> Result<EventKind, u32> {
        EventKind::try_from(self.kind & KIND_MASK)
    }

    #[inline(always)]
    pub fn wait_code(&self) -> WaitCode {
        match (self.kind >> WAIT_CODE_SHIFT) & 3 {
            1 => WaitCode::Contention,
            2 => WaitCode::Migration,
            3 => WaitCode::IdleCpu,
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

/// Number of perf counter slots (`PerfSlot`).
pub const PERF_SLOTS: usize = 7;

/// Perf counters read per CPU at every context switch of a target thread, and the slot each
/// occupies. The hardware ones need a PMU; the software ones always open and let the same path
/// be checked against the scheduler data where there is no PMU.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PerfSlot {
    Cycles = 0,
    Instructions = 1,
    /// Last-level cache read accesses.
    LlcReferences = 2,
    /// Last-level cache read misses.
    LlcMisses = 3,
    /// The software cpu-clock (ns): per slice, the slice's length as perf measures it.
    CpuClock = 4,
    /// The software context-switches counter.
    ContextSwitches = 5,
    /// The software cpu-migrations counter (counted when a migrated task is next switched in).
    CpuMigrations = 6,
}

impl PerfSlot {
    /// Name of the per-CPU perf event array holding this slot's counters.
    pub const fn map_name(self) -> &'static str {
        match self {
            Self::Cycles => "PERF_CYCLES",
            Self::Instructions => "PERF_INSTRUCTIONS",
            Self::LlcReferences => "PERF_LLC_REFERENCES",
            Self::LlcMisses => "PERF_LLC_MISSES",
            Self::CpuClock => "PERF_CPU_CLOCK",
            Self::ContextSwitches => "PERF_CONTEXT_SWITCHES",
            Self::CpuMigrations => "PERF_CPU_MIGRATIONS",
        }
    }

    pub const ALL: [PerfSlot; PERF_SLOTS] = [
        Self::Cycles,
        Self::Instructions,
        Self::LlcReferences,
        Self::LlcMisses,
        Self::CpuClock,
        Self::ContextSwitches,
        Self::CpuMigrations,
    ];
}

/// What `bpf_perf_event_read_value` returns (`struct bpf_perf_event_value`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CounterReading {
    pub counter: u64,
    /// Time the event was enabled and actually counting (they differ when the PMU multiplexes).
    pub enabled: u64,
    pub running: u64,
}

/// Per-thread perf counter totals, keyed by TID.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ThreadCounters {
    /// Bit k set: `start[k]` holds the reading at the current slice's switch-in.
    pub valid: u32,
    pub _pad: u32,
    pub slice_start_ns: u64,
    pub start: [CounterReading; PERF_SLOTS],
    /// Sum over slices of the counter delta scaled by enabled/running (multiplexing).
    pub scaled: [u64; PERF_SLOTS],
    /// Sum of the raw deltas, and of the enabled and running time deltas.
    pub raw: [u64; PERF_SLOTS],
    pub enabled: [u64; PERF_SLOTS],
    pub running: [u64; PERF_SLOTS],
}

/// Counter deltas of one on-CPU slice of a target thread, on the ring buffer. Shares its first
/// 16 bytes with `Event`, so a reader can tell the two apart by `kind`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CounterSlice {
    /// Slice end (switch-out), CLOCK_MONOTONIC.
    pub ts_ns: u64,
    pub tid: u32,
    /// `EventKind::CounterSlice`.
    pub kind: u32,
    pub cpu: u32,
    /// Bit k set: `values[k]` was measured.
    pub valid: u32,
    /// Slice start (switch-in).
    pub start_ns: u64,
    /// Scaled deltas, by `PerfSlot`.
    pub values: [u64; PERF_SLOTS],
}

/// libcuda entry points the uprobes attach to; the discriminant is the attach cookie.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CudaFn {
    LaunchKernel = 0,
    LaunchKernelPtsz = 1,
    LaunchKernelEx = 2,
    LaunchKernelExPtsz = 3,
    StreamSynchronize = 4,
    StreamSynchronizePtsz = 5,
    CtxSynchronize = 6,
    EventSynchronize = 7,
    /// A synchronous device-to-host copy.
    MemcpyDtoH = 8,
    MemcpyDtoHPtds = 9,
    /// The runtime API (libcudart), which frameworks call: it may reach the driver through
    /// private entry points that are not the exported symbols above.
    RtDeviceSynchronize = 10,
    RtStreamSynchronize = 11,
    RtEventSynchronize = 12,
    /// cudaMemcpy: synchronous whatever its direction.
    RtMemcpy = 13,
}

impl CudaFn {
    pub const ALL: [CudaFn; 14] = [
        Self::LaunchKernel,
        Self::LaunchKernelPtsz,
        Self::LaunchKernelEx,
        Self::LaunchKernelExPtsz,
        Self::StreamSynchronize,
        Self::StreamSynchronizePtsz,
        Self::CtxSynchronize,
        Self::EventSynchronize,
        Self::MemcpyDtoH,
        Self::MemcpyDtoHPtds,
        Self::RtDeviceSynchronize,
        Self::RtStreamSynchronize,
        Self::RtEventSynchronize,
        Self::RtMemcpy,
    ];

    /// Whether the function belongs to the runtime library (libcudart) rather than libcuda.
    pub const fn runtime(self) -> bool {
        (self as u32) >= Self::RtDeviceSynchronize as u32
    }

    /// The exported symbol.
    pub const fn symbol(self) -> &'static str {
        match self {
            Self::LaunchKernel => "cuLaunchKernel",
            Self::LaunchKernelPtsz => "cuLaunchKernel_ptsz",
            Self::LaunchKernelEx => "cuLaunchKernelEx",
            Self::LaunchKernelExPtsz => "cuLaunchKernelEx_ptsz",
            Self::StreamSynchronize => "cuStreamSynchronize",
            Self::StreamSynchronizePtsz => "cuStreamSynchronize_ptsz",
            Self::CtxSynchronize => "cuCtxSynchronize",
            Self::EventSynchronize => "cuEventSynchronize",
            Self::MemcpyDtoH => "cuMemcpyDtoH_v2",
            Self::MemcpyDtoHPtds => "cuMemcpyDtoH_v2_ptds",
            Self::RtDeviceSynchronize => "cudaDeviceSynchronize",
            Self::RtStreamSynchronize => "cudaStreamSynchronize",
            Self::RtEventSynchronize => "cudaEventSynchronize",
            Self::RtMemcpy => "cudaMemcpy",
        }
    }

    /// Whether the call blocks the calling thread until the GPU has caught up.
    pub const fn synchronizes(self) -> bool {
        (self as u32) >= Self::StreamSynchronize as u32
    }
}

impl TryFrom<u32> for CudaFn {
    type Error = u32;
    fn try_from(v: u32) -> Result<Self, u32> {
        Self::ALL.get(v as usize).copied().ok_or(v)
    }
}

/// Per-thread CUDA call accounting, keyed by TID.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CudaThread {
    pub launches: u64,
    /// Completed synchronizing calls (outermost only: libcuda may call its own exported
    /// functions from inside one).
    pub sync_calls: u64,
    pub sync_ns: u64,
    pub sync_max_ns: u64,
    /// Entry time of the synchronizing call in progress (valid while `depth > 0`).
    pub sync_start_ns: u64,
    pub sync_fn: u32,
    pub depth: u32,
}

/// `Config::request_id_arg` when the marker functions carry no request id.
pub const NO_REQUEST_ID: u32 = u32::MAX;

/// Attach cookies of the request marker uprobe.
pub const REQUEST_START_COOKIE: u64 = 0;
pub const REQUEST_END_COOKIE: u64 = 1;

/// Load-time configuration of the eBPF programs (a `.rodata` global set by the loader, so the
/// verifier sees constants).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// The TGID (process ID) whose threads are traced.
    pub target_tgid: u32,
    /// Wake the reader once this many bytes wait in the ring buffer (it also drains on a timer).
    pub ring_wakeup_bytes: u32,
    /// Bit k set: perf counter slot k is open on every CPU (in that slot's per-CPU array).
    pub counter_mask: u32,
    /// Which argument of the request marker functions holds the request id (0-5), or
    /// `NO_REQUEST_ID` when they take none.
    pub request_id_arg: u32,
    /// Offsets in `struct task_struct`, read from the running kernel's BTF (tp_btf programs).
    pub task_pid_off: u32,
    pub task_tgid_off: u32,
    pub task_comm_off: u32,
    /// Offset of the CPU number (`thread_info.cpu` or `cpu`, whichever the kernel has).
    pub task_cpu_off: u32,
    /// Field offsets in the classic tracepoints' records, read from tracefs `format` files
    /// (classic fallback only).
    pub switch_prev_state_off: u32,
    /// Size of `prev_state` in the classic sched_switch record (`long`: 8 on 64-bit kernels).
    pub switch_prev_state_size: u32,
    pub switch_next_pid_off: u32,
    pub switch_next_comm_off: u32,
    pub wakeup_pid_off: u32,
    pub wakeup_cpu_off: u32,
    pub wakeup_comm_off: u32,
    pub migrate_pid_off: u32,
    pub migrate_orig_cpu_off: u32,
    pub migrate_dest_cpu_off: u32,
    pub newtask_pid_off: u32,
    pub newtask_flags_off: u32,
    pub newtask_comm_off: u32,
    /// 1: send every state change of the target's threads (for a timeline: a trace file, the
    /// Perfetto and HTML outputs, per-request decomposition). 0: send only what the summary
    /// reads from the records: switch-ins (each wait's length and kind), counter slices and
    /// thread births and exits; the totals are kept in maps either way.
    pub transitions: u32,
    /// Send a CPU's batch once it holds this many bytes (at most `BATCH_BYTES`; less for a
    /// small ring buffer, which a full batch would not fit).
    pub batch_bytes: u32,
}

impl Config {
    pub const fn zeroed() -> Self {
        Self {
            target_tgid: 0,
            ring_wakeup_bytes: 0,
            counter_mask: 0,
            request_id_arg: NO_REQUEST_ID,
            task_pid_off: 0,
            task_tgid_off: 0,
            task_comm_off: 0,
            task_cpu_off: 0,
            switch_prev_state_off: 0,
            switch_prev_state_size: 8,
            switch_next_pid_off: 0,
            switch_next_comm_off: 0,
            wakeup_pid_off: 0,
            wakeup_cpu_off: 0,
            wakeup_comm_off: 0,
            migrate_pid_off: 0,
            migrate_orig_cpu_off: 0,
            migrate_dest_cpu_off: 0,
            newtask_pid_off: 0,
            newtask_flags_off: 0,
            newtask_comm_off: 0,
            transitions: 1,
            batch_bytes: BATCH_BYTES as u32,
        }
    }
}

/// A counter delta extrapolated to the whole time its event was enabled, when the PMU
/// multiplexed it and it counted only `running` of the `enabled` ns (what perf stat does).
///
/// Computed as `delta * enabled / running` without 128-bit arithmetic, which the eBPF target
/// lacks: `q * enabled + r * enabled / running` with `q, r = divmod(delta, running)`, and
/// `enabled` first brought under 2^32 (with `running`, keeping their ratio) so that `r *
/// enabled < running * enabled` fits in 64 bits.
#[inline(always)]
pub fn scale_for_multiplexing(delta: u64, enabled: u64, running: u64) -> u64 {
    if running == 0 || running >= enabled {
        return delta;
    }
    let shift = (64 - enabled.leading_zeros()).saturating_sub(32);
    let (enabled, running) = (enabled >> shift, running >> shift);
    if running == 0 {
        return delta;
    }
    let (q, r) = (delta / running, delta % running);
    q * enabled + r * enabled / running
}

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

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all of these are repr(C), Copy, made of integers with explicit padding, and valid
    // for any bit pattern.
    unsafe impl aya::Pod for super::ThreadStats {}
    unsafe impl aya::Pod for super::Preemptor {}
    unsafe impl aya::Pod for super::CpuWait {}
    unsafe impl aya::Pod for super::MigrationKey {}
    unsafe impl aya::Pod for super::Event {}
    unsafe impl aya::Pod for super::Config {}
    unsafe impl aya::Pod for super::ThreadCounters {}
    unsafe impl aya::Pod for super::CounterReading {}
    unsafe impl aya::Pod for super::CounterSlice {}
    unsafe impl aya::Pod for super::CudaThread {}
    unsafe impl aya::Pod for super::BatchBuf {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_have_no_hidden_padding() {
        // The kernel and userspace agree on these sizes only if no implicit padding creeps in.
        assert_eq!(core::mem::size_of::<Event>(), 32);
        assert_eq!(core::mem::size_of::<CpuWait>(), 24);
        assert_eq!(core::mem::size_of::<MigrationKey>(), 16);
        assert_eq!(core::mem::size_of::<Preemptor>(), 40);
        assert_eq!(
            core::mem::size_of::<ThreadStats>(),
            4 + 4 + 16 + 4 + 4 + 8 * 13 + 4 * 4 + 4 * RUNQ_HIST_SLOTS
        );
        assert_eq!(core::mem::size_of::<Config>(), 23 * 4);
        assert_eq!(core::mem::size_of::<BatchBuf>(), 16 + BATCH_BYTES);
        assert_eq!(core::mem::size_of::<CounterSlice>(), 32 + 8 * PERF_SLOTS);
        assert_eq!(core::mem::size_of::<CudaThread>(), 48);
        assert_eq!(
            core::mem::size_of::<ThreadCounters>(),
            16 + 24 * PERF_SLOTS + 4 * 8 * PERF_SLOTS
        );
    }

    #[test]
    fn hist_slots_are_log2() {
        assert_eq!(hist_slot(0), 0);
        assert_eq!(hist_slot(1), 1);
        assert_eq!(hist_slot(2), 2);
        assert_eq!(hist_slot(3), 2);
        assert_eq!(hist_slot(1023), 10);
        assert_eq!(hist_slot(1024), 11);
        assert_eq!(hist_slot(u64::MAX), RUNQ_HIST_SLOTS - 1);
    }

    #[test]
    fn multiplexed_counts_are_extrapolated() {
        // Counted a quarter of the time: four times the raw count.
        assert_eq!(scale_for_multiplexing(1_000, 4_000, 1_000), 4_000);
        // Never multiplexed, or never running: the raw count.
        assert_eq!(scale_for_multiplexing(1_000, 4_000, 4_000), 1_000);
        assert_eq!(scale_for_multiplexing(0, 4_000, 0), 0);
        // A 10 ms slice at 5 GHz, counted half the time.
        assert_eq!(
            scale_for_multiplexing(25_000_000, 10_000_000, 5_000_000),
            50_000_000
        );
        // A 100 s slice (enabled over 2^32 ns) at 5 GHz, counted 3/4 of the time: within
        // a part per million of the exact value.
        let (delta, enabled, running) = (375_000_000_000u64, 100_000_000_000, 75_000_000_000);
        let exact = (delta as u128 * enabled as u128 / running as u128) as u64;
        let got = scale_for_multiplexing(delta, enabled, running);
        assert!(got.abs_diff(exact) <= exact / 1_000_000, "{got} vs {exact}");
        // Low rates (a few LLC misses) are not rounded away.
        assert_eq!(scale_for_multiplexing(3, 1_000_000, 500_000), 6);
    }

    #[test]
    fn kinds_round_trip_and_reject_unknown() {
        for k in 1..=12u32 {
            assert_eq!(EventKind::try_from(k).map(|e| e as u32), Ok(k));
        }
        assert_eq!(EventKind::try_from(0), Err(0));
        assert_eq!(EventKind::try_from(13), Err(13));
        for f in CudaFn::ALL {
            assert_eq!(CudaFn::try_from(f as u32), Ok(f));
        }
        assert!(CudaFn::try_from(CudaFn::ALL.len() as u32).is_err());
        assert_eq!(ThreadState::try_from(6), Err(6));
    }
}
