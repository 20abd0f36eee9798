//! The clocks the recording is kept on: CLOCK_MONOTONIC is the programs' `bpf_ktime_get_ns`,
//! CLOCK_REALTIME stamps NVML's samples and latency logs.

/// Reads CLOCK_MONOTONIC, the clock of `bpf_ktime_get_ns`.
pub fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// Reads CLOCK_REALTIME (NVML's driver samples are stamped with it).
pub fn realtime_ns() -> u64 {
    clock_ns(libc::CLOCK_REALTIME)
}

/// CLOCK_BOOTTIME (CLOCK_MONOTONIC and the time suspended), /proc's process start times' clock.
pub fn boottime_ns() -> u64 {
    clock_ns(libc::CLOCK_BOOTTIME)
}

/// The calling thread's own CPU time.
pub fn thread_cpu_ns() -> u64 {
    clock_ns(libc::CLOCK_THREAD_CPUTIME_ID)
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own; the clocks used always exist.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// CLOCK_REALTIME minus CLOCK_MONOTONIC now: the realtime reading taken between two monotonic
/// ones, against their midpoint.
pub fn realtime_minus_monotonic_ns() -> i64 {
    let a = monotonic_ns();
    let r = clock_ns(libc::CLOCK_REALTIME);
    let b = monotonic_ns();
    r as i64 - (a / 2 + b / 2) as i64
}
