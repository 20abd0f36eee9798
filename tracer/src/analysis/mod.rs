//! Analysis: pure functions from a `Recording` to what the renderers print. No I/O here.

pub mod cgroup;
pub mod counters;
pub mod gpu;
pub mod neighbours;
pub mod preemptors;
pub mod quantiles;
pub mod requests;
pub mod selfcheck;
pub mod summary;
pub mod timeline;
pub mod verdict;

#[cfg(test)]
pub mod testutil;
