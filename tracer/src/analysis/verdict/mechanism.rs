//! How a cause worked, as a value: each mechanism carries its data and knows its cause category,
//! its stable id (the JSON's `mechanism_id`, for scripts and alerts), its text for people and
//! its advice (those two in `words.rs`). The rules in `verdict/` only decide which mechanism
//! applies and with what data; causes merge by comparing mechanisms, never their text.

use serde::Serialize;

use super::queue::BlockingRequest;
use crate::analysis::neighbours::NeighbourKind;
use crate::analysis::ranks::{FoundBy, LateCause};

/// The cause the verdict names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Primary {
    Scheduling,
    CacheThrash,
    GpuSaturation,
    /// Threads of the service waited for a lock (a mutex, the GIL) another one held.
    LockContention,
    /// The runtime stopped the process's threads: Python's garbage collection.
    RuntimePause,
    /// The host, not the GPU, paced the GPU work: a serving thread busy on its CPU launching
    /// kernels while its GPU idled in part.
    HostBound,
    /// Requests waited behind a few long requests' own work on the serving thread.
    HeadOfLine,
    /// One tensor-parallel rank held every step up, for a reason that has no category of its
    /// own (off-CPU waits, or nothing measured): the others waited for it in collectives.
    LateRank,
    /// No significant jitter, and no impediment above its threshold.
    None,
    /// Jitter present, but not explained by what was measured.
    Unexplained,
}

impl Primary {
    pub fn name(self) -> &'static str {
        match self {
            Self::Scheduling => "scheduling",
            Self::CacheThrash => "cache thrash",
            Self::GpuSaturation => "GPU saturation",
            Self::LockContention => "lock contention",
            Self::RuntimePause => "runtime pause",
            Self::HostBound => "host-bound steps",
            Self::HeadOfLine => "head-of-line blocking",
            Self::LateRank => "a late rank",
            Self::None => "no significant jitter",
            Self::Unexplained => "unexplained",
        }
    }
}

/// The structured part is `mechanism_data` in the JSON (absent for mechanisms without data).
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
#[serde(
    tag = "mechanism_id",
    content = "mechanism_data",
    rename_all = "snake_case"
)]
pub enum Mechanism {
    /// Waiting for a CPU while other tasks ran: `by` names the one or two neighbours that
    /// caused most of it (empty when who ran was not attributed).
    RunQueueContention { by: Vec<Contender> },
    /// Runnable with the CPU idle while the cgroup's CPU quota was used up.
    CgroupThrottling,
    /// Runnable with the CPU idle, no throttling seen: idle CPUs slow to wake.
    IdleCpuWakeup,
    /// Forced moves between CPUs: the waits after them, and the refill of caches.
    Migrations,
    /// More LLC misses per instruction than the thread's (or the median requests') own.
    LlcMisses,
    /// Longer on-CPU time not put down to moves; `llc_measured`: cache misses were measured
    /// and did not change.
    LongerOncpu { llc_measured: bool },
    /// The GPU was busy with other processes' kernels.
    SmSaturationByOthers { gpu_busy_pct: f64, own_sm_pct: f64 },
    /// The GPU was full; `clocks_held`: its clocks were held down while it was.
    SmSaturation {
        gpu_busy_pct: f64,
        clocks_held: Option<ClocksHeld>,
    },
    /// Device-wide synchronization waited for all of the process's GPU work.
    SyncStalls { gpu_busy_pct: Option<f64> },
    /// The slow requests waited longer for their own GPU work.
    LongerGpuWork { gpu_busy_pct: Option<f64> },
    /// Waiting in a futex for a lock another thread of the process held; `gil`: the process
    /// is CPython and the holders are its threads, so the lock is (most likely) the GIL.
    LockWait { holders: Vec<Holder>, gil: bool },
    /// Garbage collections of the process (CPython's `gc`, from its USDT probes).
    GcPause {
        collections: u64,
        longest_ns: u64,
        /// The generation of the longest one.
        generation: Option<u32>,
    },
    /// A GPU-using thread on its CPU most of the window outside synchronizing CUDA calls,
    /// launching kernels, while its GPU was partly idle.
    LaunchOverhead {
        /// Of the median request's time where the thread serves requests and that is the
        /// larger (`oncpu_of_requests`), else of the window.
        oncpu_share: f64,
        oncpu_of_requests: bool,
        launches_per_s: f64,
        gpu_idle_pct: f64,
    },
    /// A GPU's clocks held down by a policy (power, thermal...) for part of the window, the
    /// GPU not saturated: NVML's violation counters.
    ClockThrottle { policies: Vec<ClockViolation> },
    /// The serving thread was on a few long requests' own on-CPU work while later requests
    /// waited (and those requests were slow themselves): head-of-line blocking.
    LongRequestOnServingThread { requests: Vec<BlockingRequest> },
    /// The serving thread was still on earlier requests, served in normal time: arrivals
    /// outpaced service.
    Queueing,
    /// Blocked, not on the GPU: locks, I/O, sleeps.
    OtherBlocked,
    /// Time the timeline does not cover (lost events, untraced thread).
    Uncovered,
    /// A tensor-parallel rank the others waited for in their collectives (analysis/ranks.rs):
    /// `own_cause` is what made it late, `peers_waited_ns` what they waited for it in all
    /// (`found_by` says which waiting), over `sync_calls` synchronizing calls. GPU numbers are
    /// NVML's indices.
    LateRank {
        pid: u32,
        gpus: Vec<u32>,
        own_cause: LateCause,
        found_by: FoundBy,
        peers_waited_ns: u64,
        sync_calls: u64,
    },
}

/// A neighbour that took the CPU from the target's threads.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct Contender {
    pub kind: NeighbourKind,
    /// The cgroup's path, or the command's or process's name.
    pub name: String,
    /// Its processes (kernel TGIDs), most waiting first; at most 4.
    pub pids: Vec<u32>,
    pub process_count: u64,
    /// Share of the target's attributed waiting it caused.
    pub wait_share: f64,
    /// `pids` as the tool's PID namespace numbers them, for the text.
    #[serde(skip)]
    pub shown_pids: Vec<String>,
    /// For the target's own side in a service of several processes: its members that ran,
    /// as "role (PID n)", for the text ("the service itself: engine_core (PID 12)").
    #[serde(skip)]
    pub members: Vec<String>,
}

/// A thread that held a lock others waited for.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct Holder {
    pub tid: u32,
    pub pid: u32,
    pub comm: String,
    /// Share of the lock waiting it accounts for.
    pub share: f64,
}

/// Time a policy held a GPU's clocks down in the window (NVML `nvmlDeviceGetViolationStatus`).
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct ClockViolation {
    pub gpu: u32,
    /// `power`, `thermal`, `sync_boost`, `board_limit`, `low_utilization`, `reliability`,
    /// `total_app_clocks`, `total_base_clocks`.
    pub policy: String,
    pub ns: u64,
    /// Share of the window.
    pub share: f64,
}

/// Why a busy GPU ran slower than it could.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ClockCap {
    PowerCap,
    Thermal,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, schemars::JsonSchema)]
pub struct ClocksHeld {
    pub by: ClockCap,
    pub sm_clock_mhz: Option<f64>,
    pub sm_clock_mhz_min: Option<u32>,
}

impl Mechanism {
    /// The cause category it belongs to.
    pub fn cause(&self) -> Primary {
        match self {
            Self::RunQueueContention { .. }
            | Self::CgroupThrottling
            | Self::IdleCpuWakeup
            | Self::Migrations => Primary::Scheduling,
            Self::LlcMisses => Primary::CacheThrash,
            Self::SmSaturationByOthers { .. }
            | Self::SmSaturation { .. }
            | Self::SyncStalls { .. }
            | Self::LongerGpuWork { .. } => Primary::GpuSaturation,
            Self::ClockThrottle { .. } => Primary::GpuSaturation,
            Self::LockWait { .. } => Primary::LockContention,
            Self::GcPause { .. } => Primary::RuntimePause,
            Self::LaunchOverhead { .. } => Primary::HostBound,
            Self::LongRequestOnServingThread { .. } => Primary::HeadOfLine,
            Self::LongerOncpu { .. } | Self::Queueing | Self::OtherBlocked | Self::Uncovered => {
                Primary::Unexplained
            }
            Self::LateRank { own_cause, .. } => match own_cause {
                LateCause::RunQueue => Primary::Scheduling,
                LateCause::GcPause => Primary::RuntimePause,
                LateCause::HostWork => Primary::HostBound,
                LateCause::GpuShared | LateCause::ClocksHeld => Primary::GpuSaturation,
                LateCause::OffCpu | LateCause::NotMeasured => Primary::LateRank,
            },
        }
    }

    /// The stable id: the JSON's `mechanism_id` (serde writes it from the variant's name; a
    /// test keeps the two the same).
    pub fn id(&self) -> &'static str {
        match self {
            Self::RunQueueContention { .. } => "run_queue_contention",
            Self::CgroupThrottling => "cgroup_throttling",
            Self::IdleCpuWakeup => "idle_cpu_wakeup",
            Self::Migrations => "migrations",
            Self::LlcMisses => "llc_misses",
            Self::LongerOncpu { .. } => "longer_oncpu",
            Self::SmSaturationByOthers { .. } => "sm_saturation_by_others",
            Self::SmSaturation { .. } => "sm_saturation",
            Self::SyncStalls { .. } => "sync_stalls",
            Self::LongerGpuWork { .. } => "longer_gpu_work",
            Self::LockWait { .. } => "lock_wait",
            Self::GcPause { .. } => "gc_pause",
            Self::LaunchOverhead { .. } => "launch_overhead",
            Self::ClockThrottle { .. } => "clock_throttle",
            Self::LongRequestOnServingThread { .. } => "long_request_on_serving_thread",
            Self::Queueing => "queueing",
            Self::OtherBlocked => "other_blocked",
            Self::Uncovered => "uncovered",
            Self::LateRank { .. } => "late_rank",
        }
    }
}

#[cfg(test)]
#[path = "mechanism_tests.rs"]
mod tests;
