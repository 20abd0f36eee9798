//! What the host let the tracer measure, as every recording carries it: a missing capability
//! makes its signal "not assessed", never "absent". The probing itself is in `sources/host.rs`
//! and `sources/perf.rs`.

use serde::{Deserialize, Serialize};

/// Whether a capability is there, and if not, why.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct Capability {
    pub available: bool,
    pub reason: String,
}

/// The PMU capability, with which events opened.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PmuCapability {
    pub available: bool,
    pub reason: String,
    /// Per hardware event: opened or not.
    pub events: std::collections::BTreeMap<String, bool>,
    /// The last-level-cache events opened: cache thrash can be assessed.
    pub llc_available: bool,
}

/// The capabilities a recording relied on, with the reason for each one missing. A missing
/// capability makes its signal "not assessed", never "absent".
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Capabilities {
    pub pmu: PmuCapability,
    pub btf: Capability,
    pub tracefs: Capability,
    pub gpu: GpuCapability,
}

/// The GPU side: NVML sampling (`available`, `reason`), and beneath it GPM and the CUDA
/// uprobes, each of which can be missing on its own.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct GpuCapability {
    pub available: bool,
    pub reason: String,
    /// GPM metrics (SM activity, occupancy, tensor, DRAM bandwidth): Hopper and later.
    pub gpm: Capability,
    /// Time the target's threads spend in synchronizing CUDA calls (uprobes on libcuda).
    pub cuda: Capability,
}

impl GpuCapability {
    pub fn from_parts(nvml: Capability, gpm: Capability, cuda: Capability) -> Self {
        Self {
            available: nvml.available,
            reason: nvml.reason,
            gpm,
            cuda,
        }
    }
}

impl Capability {
    pub fn yes(reason: impl Into<String>) -> Self {
        Self {
            available: true,
            reason: reason.into(),
        }
    }

    pub fn no(reason: impl Into<String>) -> Self {
        Self {
            available: false,
            reason: reason.into(),
        }
    }
}

/// A host where nothing optional is available, for analysis tests.
#[cfg(test)]
pub fn no_capabilities() -> Capabilities {
    Capabilities {
        pmu: PmuCapability {
            available: false,
            reason: "test".into(),
            events: Default::default(),
            llc_available: false,
        },
        btf: Capability::no("test"),
        tracefs: Capability::no("test"),
        gpu: GpuCapability::from_parts(
            Capability::no("test"),
            Capability::no("test"),
            Capability::no("test"),
        ),
    }
}
