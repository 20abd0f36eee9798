//! The target's CUDA driver calls: per thread over the window, and each synchronizing call on
//! the timeline (from the libcuda uprobes, `sources/ebpf/cuda.rs`).

use serde::{Deserialize, Serialize};

/// A thread's CUDA driver calls over the window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CudaTotals {
    pub launches: u64,
    pub sync_calls: u64,
    /// Time inside synchronizing calls: waiting for the GPU.
    pub sync_ns: u64,
    pub sync_max_ns: u64,
    /// Synchronizing calls whose return was not seen (left by longjmp, an exception or a
    /// thread cancellation), found and closed at the thread's next call: their time is not
    /// counted.
    #[serde(default)]
    pub lost_returns: u64,
}

impl From<&tracer_common::CudaThread> for CudaTotals {
    fn from(c: &tracer_common::CudaThread) -> Self {
        Self {
            launches: c.launches,
            sync_calls: c.sync_calls,
            sync_ns: c.sync_ns,
            sync_max_ns: c.sync_max_ns,
            lost_returns: c.lost_returns,
        }
    }
}

/// One synchronizing CUDA call of one thread, on the timeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CudaSpan {
    pub tid: u32,
    pub start_ns: u64,
    pub end_ns: u64,
    /// The libcuda function (`CudaFn` discriminant).
    pub function: u32,
}
