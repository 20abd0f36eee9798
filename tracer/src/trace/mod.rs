//! The trace file: a recording written as it is made, and read back by `tracer report`.
//! `format.rs` is the byte layout; `writer.rs` writes incrementally to a temporary file and
//! renames it when done; `frames.rs` reads frames back one at a time (checksums, the bound on
//! the decompressed size); `reader.rs` holds them to the file's order and recovers what it can
//! from a damaged file; `recover.rs` turns what was read into a recording. `output.rs` is what
//! every output file (trace, HTML, Perfetto) goes through: which paths are accepted, the
//! rename into place, the owner.

pub mod format;
pub mod frames;
pub mod output;
pub mod reader;
pub mod recover;
#[cfg(test)]
mod testfile;
mod upgrade;
pub mod writer;

use serde::{Deserialize, Serialize};

use crate::recording::{HostMeta, ProbeMode, TargetMeta};

/// What a trace file says of itself first, so that even a file cut short after it can be
/// placed and partly read.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TraceMeta {
    pub tracer_version: String,
    pub target: TargetMeta,
    pub host: HostMeta,
    pub probe_mode: ProbeMode,
    /// Window start, CLOCK_MONOTONIC.
    pub start_ns: u64,
    /// Width of the counter bins.
    pub bin_ns: u64,
    /// Perf counter slots measured (`PerfSlot` bits).
    pub counter_mask: u32,
    /// The target's threads when the recording started.
    pub threads: std::collections::BTreeMap<u32, crate::recording::ThreadInfo>,
    /// The tool's PID namespace as listed when the recording started, if it ran in one.
    #[serde(default)]
    pub pid_namespace: Option<crate::recording::PidNamespaceIds>,
}
