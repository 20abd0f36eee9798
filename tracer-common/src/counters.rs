//! Perf counters read at a target thread's switches.

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
