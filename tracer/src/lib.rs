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
