//! Maps and the load-time configuration shared by every program.

use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, PerCpuArray, PerfEventArray, RingBuf},
};
use tracer_common::{
    COUNTER_SLOTS, Config, Counter, CpuWait, CudaThread, Event, MAX_MIGRATION_ROUTES,
    MAX_PREEMPTORS, MAX_THREADS, MigrationKey, Preemptor, ThreadCounters, ThreadStats,
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

/// Per-thread totals of the target, keyed by TID.
#[map]
pub static THREADS: HashMap<u32, ThreadStats> = HashMap::with_max_entries(MAX_THREADS, 0);

/// Zeroed template used to insert new `THREADS` entries: a `ThreadStats` is too large to build on
/// the 512-byte eBPF stack next to everything else.
#[map]
pub static THREAD_TEMPLATE: PerCpuArray<ThreadStats> = PerCpuArray::with_max_entries(1, 0);

/// Who ran while target threads waited for a CPU, keyed by TID.
#[map]
pub static PREEMPTORS: HashMap<u32, Preemptor> = HashMap::with_max_entries(MAX_PREEMPTORS, 0);

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

/// CUDA call accounting per target thread, keyed by TID.
#[map]
pub static CUDA_THREADS: HashMap<u32, CudaThread> = HashMap::with_max_entries(MAX_THREADS, 0);

/// Classic fallback only: the target's TIDs (classic sched_switch and sched_wakeup records
/// carry a TID but no TGID). Filled by the loader, kept current by task_newtask and exit.
#[map]
pub static TARGET_TIDS: HashMap<u32, u32> = HashMap::with_max_entries(MAX_THREADS, 0);

#[inline(always)]
pub fn count(counter: Counter) {
    if let Some(slot) = COUNTERS.get_ptr_mut(counter as u32) {
        // Per-CPU slot: no other CPU writes it.
        unsafe { *slot += 1 };
    }
}

const BPF_RB_NO_WAKEUP: u64 = 1;
const BPF_RB_FORCE_WAKEUP: u64 = 2;
const BPF_RB_AVAIL_DATA: u64 = 0;

/// Queues a record without waking the reader, unless the buffer is filling up: the reader
/// drains on a timer, and a wakeup per event would make the tracer itself preempt the target.
#[inline(always)]
pub fn emit_bytes<T>(record: &T) {
    let flags = if EVENTS.query(BPF_RB_AVAIL_DATA) >= config!(ring_wakeup_bytes) as u64 {
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    };
    if EVENTS.output::<T>(record, flags).is_err() {
        count(Counter::RingbufDropped);
    }
}

#[inline(always)]
pub fn emit(event: &Event) {
    emit_bytes(event);
}
