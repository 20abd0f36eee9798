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

/// The summary of a recording, built whole and then judged: the verdict reads the finished
/// summary (`verdict::judge`) and is stored beside what it read.
pub fn summarize(rec: &crate::recording::Recording) -> summary::Summary {
    let mut s = summary::build(rec);
    s.verdict = verdict::judge(&s);
    s
}
