//! `tracer`: why does an inference server's latency jitter?
//!
//! The data flow is the module layout: `sources` (eBPF scheduler probes, /proc) feed one
//! `session`, which assembles a `recording` on the monotonic clock; `analysis` turns it into a
//! summary with pure functions; `render` prints it. `cli` wires the subcommands; `workload` holds
//! the built-in server and disturbances the demo and the tests run. At the import level the
//! recording is the bottom layer, under every other (ARCHITECTURE.md; `layers.rs` checks it).

pub mod analysis;
pub mod cli;
pub mod error;
pub mod recording;
pub mod render;
pub mod session;
pub mod signals;
pub mod sources;
pub mod trace;
pub mod units;
pub mod workload;

#[cfg(test)]
mod layers;

/// What `tracer --version` prints and every summary and trace file records: the release, the
/// commit it was built from, and the embedded eBPF object's id (build.rs).
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("TRACER_GIT_COMMIT"),
    ", eBPF object ",
    env!("TRACER_EBPF_ID"),
    ")"
);
