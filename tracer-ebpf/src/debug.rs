//! `--debug-bpf`: a log line, through aya-log's ring buffer, for each state the programs repair
//! or only count because it should not happen (an untraced switch or wakeup, a full map, a
//! clock that ran backwards), with the thread, CPU and times that make a wrong number
//! diagnosable. Off by default, and then free: `CONFIG.debug_bpf` is a constant to the
//! verifier, which removes the branch and everything in it (BENCHMARKS.md measures it).

/// `anomaly!("format", args...)`: aya-log's `warn!` behind the load-time switch.
macro_rules! anomaly {
    ($($arg:tt)+) => {
        if $crate::maps::config!(debug_bpf) != 0 {
            // aya-log takes a context argument it does not use.
            aya_log_ebpf::warn!(&(), $($arg)+);
        }
    };
}
