//! How the kernel side recorded: which tracepoints, and what it could not record.

use serde::{Deserialize, Serialize};

/// The family actually attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ProbeMode {
    TpBtf,
    Classic,
}

/// What the kernel side could not record.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub struct Losses {
    /// Timeline events lost to a full ring buffer (in-kernel totals stay exact).
    pub ringbuf_dropped: u64,
    pub thread_map_full: u64,
    pub preemptor_map_full: u64,
    pub migration_map_full: u64,
    /// Processes that joined the set but could not be noted in the kernel's map of joined
    /// processes (`MAX_CHILDREN`): traced, listed from their threads, joined at an unknown time.
    #[serde(default)]
    pub child_map_full: u64,
    /// Wakeups whose blocked interval could not be put down to its waker: the waker map
    /// (`MAX_WAKERS` distinct thread, waker and system call triples) was full.
    #[serde(default)]
    pub waker_map_full: u64,
    /// Switches onto a CPU the kernel did not trace, repaired (see tracer-ebpf `sched/`).
    pub unseen_switch_ins: u64,
    /// Switches off a CPU the kernel did not trace, repaired.
    pub unseen_switch_outs: u64,
    /// Switches onto a CPU of a thread the probes took for blocked: its wakeup went untraced,
    /// or (kernels 5.18 to 6.12) a signal cut its sleep short (tracer-common
    /// `Counter::UnseenWakeup`); the run-queue wait before the switch-in is missing from the
    /// waits and counted as blocked.
    #[serde(default)]
    pub unseen_wakeups: u64,
    /// Perf counter reads that failed: those slices' counters are missing.
    pub perf_read_failed: u64,
    /// Not a loss: how exact the switch and wakeup times were. The scheduler programs convert
    /// the run queue's clock to monotonic time with a per-CPU difference, the smallest of the
    /// first 16 readings of each tick (tracer-ebpf `clock.rs`); each tick's first one checks the
    /// last tick's difference against the clock helper. `clock_checks` counts those checks
    /// and `clock_error_ns` adds up their errors.
    #[serde(default)]
    pub clock_checks: u64,
    #[serde(default)]
    pub clock_error_ns: u64,
    /// `tracer watch`: records from before the window began that arrived after the one they
    /// belong to was reported (a CPU that ran one task without switching held them). Its wait
    /// samples and timeline lack them; its totals, from the kernel, do not.
    #[serde(default)]
    pub late_records: u64,
}
