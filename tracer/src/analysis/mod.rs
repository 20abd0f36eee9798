//! Analysis: pure functions from a `Recording` to what the renderers print. No I/O here.

pub mod cgroup;
pub mod counters;
pub mod gpu;
pub mod held;
pub mod neighbours;
pub mod pauses;
pub mod preemptors;
pub mod processes;
pub mod quantiles;
pub mod ranks;
pub mod report;
pub mod requests;
pub mod roles;
pub mod selfcheck;
pub mod summary;
pub mod verdict;
pub mod wakers;

pub use report::Report;

/// The report on a recording: the summary built whole, then judged (`verdict::judge` reads
/// the finished summary), the two side by side.
pub fn analyze(rec: &crate::recording::Recording) -> Report {
    analyze_after(rec, None)
}

/// The report on a watch window, `prev` the window just before it: a request that began there
/// is decomposed on both (without it, left out).
pub fn analyze_after(
    rec: &crate::recording::Recording,
    prev: Option<&crate::recording::Recording>,
) -> Report {
    let summary = summary::build_after(rec, prev);
    let verdict = verdict::judge(&summary);
    Report { summary, verdict }
}
