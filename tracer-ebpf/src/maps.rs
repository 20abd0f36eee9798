//! Maps and the load-time configuration shared by every program.

use aya_ebpf::{
    helpers::generated::bpf_jiffies64,
    macros::map,
    maps::{Array, HashMap, PerCpuArray, PerfEventArray, RingBuf},
};
use tracer_common::{
    BATCH_BYTES, BPF_F_MMAPABLE, BatchBuf, COUNTER_SLOTS, ChildProcess, Config, Counter, CpuWait,
    CudaThread, Event, MAX_CHILDREN, MAX_MIGRATION_ROUTES, MAX_PREEMPTORS, MAX_TARGET_CGROUPS,
    MAX_THREADS, MAX_WAKERS, MigrationKey, Preemptor, TARGET_WORDS,
    THREAD_SLOTS as THREAD_SLOTS_DEFAULT, ThreadCounters, ThreadStats, WakerKey, WakerStats,
};

/// Set by the loader before the programs are loaded; `.rodata`, so the verifier treats the
/// values as constants.
#[unsafe(no_mangle)]
pub static CONFIG: Config = Config::zeroed();

/// Reads one field of `CONFIG`. The volatile read keeps the compiler from folding in the
/// zero it was compiled with: the real value is only known at load time.
macro_rules! config {
    ($field:ident) => {{
        // The macro is also used inside callers' unsafe blocks.
        #[allow(unused_unsafe)]
        let value = unsafe { core::ptr::read_volatile(&raw const $crate::maps::CONFIG.$field) };
        value
    }};
}
pub(crate) use config;

/// Per-thread totals of the target, in the slot `tid & thread_slot_mask` (`tid` 0: free). The
/// verifier turns an array lookup into a few inline instructions; a hash lookup is two calls,
/// about 60 ns on our VMs, and the scheduler programs make three per round trip
/// (BENCHMARKS.md). The loader sizes it.
#[map]
pub static THREAD_SLOTS: Array<ThreadStats> =
    Array::with_max_entries(THREAD_SLOTS_DEFAULT, BPF_F_MMAPABLE);

/// The threads whose slot another thread holds, keyed by TID.
#[map]
pub static THREADS: HashMap<u32, ThreadStats> = HashMap::with_max_entries(MAX_THREADS, 0);

/// Zeroed template used to insert new `THREADS` entries: a `ThreadStats` is too large to build on
/// the 512-byte eBPF stack next to everything else.
#[map]
pub static THREAD_TEMPLATE: PerCpuArray<ThreadStats> = PerCpuArray::with_max_entries(1, 0);

/// The target set, by TGID: bit `tgid % 64` of word `tgid / 64`. Every scheduler event asks it
/// about one or two tasks, most of them not traced: an array, whose lookup the verifier turns
/// into a few inline instructions, not a hash map (two calls, about 60 ns here). Userspace sets
/// the bits before attaching.
#[map]
pub static TARGETS: Array<u64> = Array::with_max_entries(TARGET_WORDS, 0);

/// Puts the process `tgid` in the target set, or takes it out. Only its own fork (or a fork
/// that reuses its TGID) changes its bit, so adding the bit when it is clear, or subtracting it
/// when it is set, is exact; the add is atomic (`BPF_XADD`, which every kernel has, unlike the
/// atomic OR of Linux 5.12), so a bit that another CPU sets in the same word is never lost.
#[inline(always)]
pub fn set_member(tgid: u32, member: bool) {
    let Some(w) = TARGETS.get_ptr_mut(tgid >> 6) else {
        return;
    };
    let bit = 1u64 << (tgid & 63);
    let is = unsafe { *w } & bit != 0;
    if is != member {
        let delta = if member { bit } else { bit.wrapping_neg() };
        // SAFETY: `w` points into the map's value, which lives as long as the program. The
        // result is not used, so this is the plain atomic add every kernel's verifier takes.
        unsafe {
            core::intrinsics::atomic_xadd::<u64, u64, { core::intrinsics::AtomicOrdering::Relaxed }>(
                w, delta,
            );
        }
    }
}

/// Whether the process `tgid` is traced (never the idle task: its bit is never set).
#[inline(always)]
pub fn is_member(tgid: u32) -> bool {
    match TARGETS.get(tgid >> 6) {
        Some(w) => *w & (1u64 << (tgid & 63)) != 0,
        None => false,
    }
}

/// Who ran while target threads waited for a CPU, keyed by TID.
#[map]
pub static PREEMPTORS: HashMap<u32, Preemptor> = HashMap::with_max_entries(MAX_PREEMPTORS, 0);

/// Processes the target forked, and theirs, keyed by their TGID (tracer-ebpf `on_fork`).
#[map]
pub static CHILDREN: HashMap<u32, ChildProcess> = HashMap::with_max_entries(MAX_CHILDREN, 0);

/// The cgroups whose new processes join the set (`--cgroup`): each one's id (`kernfs_node.id`,
/// its directory's inode number) with its hierarchy's id (ids are per hierarchy in v1; 0 is
/// the unified one).
#[map]
pub static TARGET_CGROUPS: HashMap<u64, u32> = HashMap::with_max_entries(MAX_TARGET_CGROUPS, 0);

/// Target threads' blocked intervals by who ended them (`sched/wakeup.rs` `note_waker`).
#[map]
pub static WAKERS: HashMap<WakerKey, WakerStats> = HashMap::with_max_entries(MAX_WAKERS, 0);

/// Migration routes of target threads, with counts.
#[map]
pub static MIGRATIONS: HashMap<MigrationKey, u64> =
    HashMap::with_max_entries(MAX_MIGRATION_ROUTES, 0);

/// Target threads waiting in each CPU's run queue. A plain array, not a per-CPU one: a wakeup or
/// migration on one CPU updates the entry of another. The loader sizes it to the CPU count.
#[map]
pub static CPU_WAIT: Array<CpuWait> = Array::with_max_entries(1024, 0);

/// `Counter` slots: what the kernel side could not record.
#[map]
pub static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(COUNTER_SLOTS, 0);

/// Timeline events of the target threads. The loader may resize it.
#[map]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(8 << 20, 0);

/// Perf counters, one array per `PerfSlot`, indexed by CPU; the loader fills in the counters'
/// file descriptors. (One array per slot: aya caps perf event arrays at the CPU count.)
#[map]
pub static PERF_CYCLES: PerfEventArray<u32> = PerfEventArray::new(0);
#[map]
pub static PERF_INSTRUCTIONS: PerfEventArray<u32> = PerfEventArray::new(0);
#[map]
pub static PERF_LLC_REFERENCES: PerfEventArray<u32> = PerfEventArray::new(0);
#[map]
pub static PERF_LLC_MISSES: PerfEventArray<u32> = PerfEventArray::new(0);
#[map]
pub static PERF_CPU_CLOCK: PerfEventArray<u32> = PerfEventArray::new(0);
#[map]
pub static PERF_CONTEXT_SWITCHES: PerfEventArray<u32> = PerfEventArray::new(0);
#[map]
pub static PERF_CPU_MIGRATIONS: PerfEventArray<u32> = PerfEventArray::new(0);

/// Per-thread perf counter totals, keyed by TID (only used when counters are open).
#[map]
pub static THREAD_COUNTERS: HashMap<u32, ThreadCounters> =
    HashMap::with_max_entries(MAX_THREADS, 0);

/// Zeroed template for new `THREAD_COUNTERS` entries.
#[map]
pub static COUNTERS_TEMPLATE: PerCpuArray<ThreadCounters> = PerCpuArray::with_max_entries(1, 0);

/// Where each traced Python keeps its GC probes' argument, by process (0: the first Python
/// probed): `[gc__start, gc__done]` in `tracer_common::gc_cookie`'s encoding.
#[map]
pub static GC_ARGS: HashMap<u32, [u64; 2]> = HashMap::with_max_entries(MAX_CHILDREN, 0);

/// CUDA call accounting per target thread, keyed by TID.
#[map]
pub static CUDA_THREADS: HashMap<u32, CudaThread> = HashMap::with_max_entries(MAX_THREADS, 0);

/// Classic fallback only: the target's TIDs (classic sched_switch and sched_wakeup records
/// carry a TID but no TGID). Filled by the loader, kept current by task_newtask and exit.
#[map]
pub static TARGET_TIDS: HashMap<u32, u32> = HashMap::with_max_entries(MAX_THREADS, 0);

#[inline(always)]
pub fn count(counter: Counter) {
    add(counter, 1);
}

#[inline(always)]
pub fn add(counter: Counter, n: u64) {
    if let Some(slot) = COUNTERS.get_ptr_mut(counter as u32) {
        // Per-CPU slot: no other CPU writes it.
        unsafe { *slot += n };
    }
}

const BPF_RB_NO_WAKEUP: u64 = 1;
const BPF_RB_FORCE_WAKEUP: u64 = 2;
const BPF_RB_AVAIL_DATA: u64 = 0;

/// Wake the reader only when the buffer is filling up: it drains on a timer, and a wakeup per
/// record would make the tracer itself preempt the target.
#[inline(always)]
fn wakeup_flags() -> u64 {
    if EVENTS.query(BPF_RB_AVAIL_DATA) >= config!(ring_wakeup_bytes) as u64 {
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    }
}

/// Queues one record on its own.
#[inline(always)]
pub fn emit(event: &Event) {
    if EVENTS.output::<Event>(event, wakeup_flags()).is_err() {
        count(Counter::RingbufDropped);
    }
}

/// Per CPU, whether it leaves its batch to userspace when it goes idle (1) or sends it (0).
/// A CPU that leaves it keeps its last records until it next switches, which may be seconds;
/// but a send at every switch to idle is a ring-buffer output per handover where threads hand
/// work to each other across idle CPUs, the most common shape of a server (BENCHMARKS.md).
/// Userspace sets every CPU to 1 after loading (a single recording takes what is left from the
/// map at the end); a watch sets 0 where it cannot run `send_batch` itself each window (its
/// sender's CPU, CPUs kept free of interruptions, or all where the kernel cannot). The loader
/// sizes it to the CPU count.
#[map]
pub static IDLE_SENDER: Array<u32> = Array::with_max_entries(1024, 0);

#[inline(always)]
pub fn sends_when_idle(cpu: u32) -> bool {
    match IDLE_SENDER.get(cpu) {
        Some(&left) => left == 0,
        None => true,
    }
}

/// Per-CPU records not yet sent (see `tracer_common::BatchBuf`).
#[map]
pub static BATCH: PerCpuArray<BatchBuf> = PerCpuArray::with_max_entries(1, 0);

/// This CPU's batch. Only programs that run with interrupts disabled use it (sched_switch,
/// sched_wakeup(_new) and sched_migrate_task all fire under a run-queue or `pi_lock` spinlock
/// taken with interrupts off), so no other program can run on this CPU while one of them is
/// appending to it. The uprobes and the fork and exit tracepoints, which run with interrupts
/// on, send their records on their own (`emit`).
pub struct Batch(&'static mut BatchBuf);

impl Batch {
    #[inline(always)]
    pub fn get() -> Option<Batch> {
        let b = BATCH.get_ptr_mut(0)?;
        Some(Batch(unsafe { &mut *b }))
    }

    /// Appends a record, sending the batch first if the record would not fit.
    #[inline(always)]
    pub fn push<T: Copy>(&mut self, record: &T) {
        const { assert!(size_of::<T>().is_multiple_of(8)) };
        let n = size_of::<T>();
        // Send first if the record would fill the batch: `len` stays below the limit, which is
        // at most BATCH_BYTES.
        if self.0.len as usize + n >= config!(batch_bytes) as usize {
            self.send();
        }
        let len = self.0.len as usize;
        // Also what lets the verifier accept the variable offset. The batch never fills up
        // completely, so that `send` can bound its length with a mask (see there).
        if len >= BATCH_BYTES - n {
            count(Counter::RingbufDropped);
            return;
        }
        if len == 0 {
            self.0.first_jiffies = unsafe { bpf_jiffies64() };
        }
        // Every record's size is a multiple of 8 and the buffer is 8-aligned, so this is an
        // aligned write: 8-byte stores rather than the byte stores an unaligned one becomes.
        unsafe { core::ptr::write(self.0.bytes.as_mut_ptr().add(len).cast::<T>(), *record) };
        self.0.len = (len + n) as u32;
        self.0.records += 1;
    }

    /// Sends the batch if a tick has passed since its first record, or now if `now` (the CPU
    /// is going idle: nothing else would send it soon).
    #[inline(always)]
    pub fn age(&mut self, now: bool) {
        if self.0.len != 0 && (now || unsafe { bpf_jiffies64() } != self.0.first_jiffies) {
            self.send();
        }
    }

    #[inline(always)]
    pub fn send(&mut self) {
        // `push` keeps it below BATCH_BYTES, a power of two, so the mask changes nothing; it
        // is there for the verifier, which cannot follow a comparison when the compiler
        // checks one copy of a register and passes another to the helper.
        let len = self.0.len as usize & (BATCH_BYTES - 1);
        let records = self.0.records;
        self.0.len = 0;
        self.0.records = 0;
        if len == 0 {
            return;
        }
        let bytes = &self.0.bytes[..len];
        if EVENTS.output::<[u8]>(bytes, wakeup_flags()).is_err() {
            add(Counter::RingbufDropped, records as u64);
        }
    }
}
