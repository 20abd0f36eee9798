//! `tracer`: why does an inference server's latency jitter?
//!
//! The data flow is the module layout: `sources` (eBPF scheduler probes, /proc) feed one
//! `session`, which assembles a `recording` on the monotonic clock; `analysis` turns it into a
//! summary with pure functions; `render` prints it. `cli` wires the subcommands; `workload` holds
//! the built-in server and disturbances the demo and the tests run.

pub mod analysis;
pub mod cli;
pub mod error;
pub mod output;
pub mod recording;
pub mod render;
pub mod session;
pub mod signals;
pub mod sources;
pub mod trace;
pub mod workload;
