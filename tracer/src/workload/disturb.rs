//! The disturbances the demo injects, each a separate process so the tracer sees it as what it
//! is, a neighbour: CPU hogs, a cache-thrashing neighbour, and a task that keeps moving the
//! target's threads between CPUs.

use std::{thread, time::Duration};

use anyhow::{Context as _, Result};
use clap::{Args, Subcommand};

use super::server::set_thread_name;
use crate::sources::clock::monotonic_ns;
use crate::sources::topology::set_affinity;

#[derive(Debug, Args, Clone)]
pub struct DisturbArgs {
    #[command(subcommand)]
    pub kind: Disturbance,
    /// Stop after this long.
    #[arg(long, default_value = "10s", value_parser = crate::units::parse_duration, global = true)]
    pub duration: Duration,
    /// Run on these CPUs only.
    #[arg(long, value_delimiter = ',', global = true)]
    pub cpus: Vec<usize>,
}

#[derive(Debug, Subcommand, Clone)]
pub enum Disturbance {
    /// Threads that never block, or with --burst spin that long (wall time) and then sleep
    /// --pause, over and over.
    Spin {
        #[arg(long, default_value_t = 2)]
        threads: usize,
        /// Spin this long, then sleep --pause, and again: a neighbour that sleeps now and
        /// then. CFS (Linux before 6.6) places a waking thread ahead of threads that never
        /// sleep, so pure spinners barely delay a server that wakes for each request (under
        /// emulation on 5.10 and 6.1: p99 1.3x p50 with two of them); hogs that wake too
        /// compete with it on equal terms, as under EEVDF.
        #[arg(long, value_parser = crate::units::parse_duration)]
        burst: Option<Duration>,
        #[arg(long, default_value = "1ms", value_parser = crate::units::parse_duration)]
        pause: Duration,
        /// Run the hogs at real-time priority (SCHED_FIFO 1): a server thread that wakes
        /// then waits for a burst to end under every scheduler. Under CFS a waking thread
        /// otherwise often preempts even hogs that sleep (with two of them at 3 ms on and 6 ms
        /// off, the tail did not rise in about 1 run in 7 on 5.10 and 6.1). Refused (no
        /// CAP_SYS_NICE, or a cgroup without real-time time), they say so and run as others.
        #[arg(long)]
        fifo: bool,
    },
    /// Threads streaming through a buffer larger than any cache, one per CPU of --cpus (at
    /// SCHED_IDLE priority, so that they yield their CPUs to anything else there).
    Stream {
        #[arg(long, default_value_t = 256)]
        mib: usize,
    },
    /// Moves every thread of PID between the CPUs given with --cpus, at random intervals.
    Migrate {
        #[arg(long)]
        pid: u32,
        /// Mean time between moves.
        #[arg(long, default_value = "2ms", value_parser = crate::units::parse_duration)]
        every: Duration,
    },
}

pub fn run(args: DisturbArgs) -> Result<()> {
    let end = monotonic_ns() + args.duration.as_nanos() as u64;
    match args.kind {
        Disturbance::Spin {
            threads,
            burst,
            pause,
            fifo,
        } => spin(threads, burst.map(|b| (b, pause)), fifo, &args.cpus, end),
        Disturbance::Stream { mib } => stream(mib, &args.cpus, end),
        Disturbance::Migrate { pid, every } => migrate(pid, &args.cpus, every, end),
    }
}

fn spin(
    n: usize,
    duty: Option<(Duration, Duration)>,
    fifo: bool,
    cpus: &[usize],
    end: u64,
) -> Result<()> {
    set_thread_name("cpu-hog");
    if !cpus.is_empty() {
        set_affinity(0, cpus)?;
    }
    if fifo {
        let param = libc::sched_param { sched_priority: 1 };
        // SAFETY: plain syscall on the calling thread with a valid parameter block; the hog
        // threads spawned below inherit the policy.
        if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) } != 0 {
            eprintln!(
                "cpu-hog: SCHED_FIFO refused ({}): the hogs run at normal priority, where a \
                 waking server thread may preempt them",
                std::io::Error::last_os_error()
            );
        }
    }
    let hogs: Vec<_> = (0..n.max(1))
        .map(|i| {
            thread::Builder::new()
                .name(format!("cpu-hog-{i}"))
                .spawn(move || {
                    let mut x = 1u64;
                    let mut now = monotonic_ns();
                    while now < end {
                        let until = match duty {
                            Some((burst, _)) => now + burst.as_nanos() as u64,
                            None => end,
                        };
                        while now < until.min(end) {
                            for _ in 0..10_000 {
                                x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                            }
                            std::hint::black_box(x);
                            now = monotonic_ns();
                        }
                        if let Some((_, pause)) = duty {
                            thread::sleep(pause);
                            now = monotonic_ns();
                        }
                    }
                })
                .context("spawning a hog thread")
        })
        .collect::<Result<_>>()?;
    for h in hogs {
        let _ = h.join();
    }
    Ok(())
}

fn stream(mib: usize, cpus: &[usize], end: u64) -> Result<()> {
    // One streaming thread per CPU given, each pinned there with its share of the buffer: a
    // large LLC is refilled faster than one core alone could.
    let per = (mib.max(1) << 20) / cpus.len().max(1);
    let threads: Vec<_> = (0..cpus.len().max(1))
        .map(|i| {
            let cpu = cpus.get(i).copied();
            thread::spawn(move || stream_one(per, cpu, end))
        })
        .collect();
    for t in threads {
        t.join()
            .map_err(|_| anyhow::anyhow!("a streaming thread panicked"))??;
    }
    Ok(())
}

fn stream_one(bytes: usize, cpu: Option<usize>, end: u64) -> Result<()> {
    set_thread_name("cache-thrasher");
    if let Some(cpu) = cpu {
        set_affinity(0, &[cpu])?;
    }
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: plain syscall on the calling thread with a valid parameter block.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) } != 0 {
        anyhow::bail!("SCHED_IDLE: {}", std::io::Error::last_os_error());
    }
    let mut buf = vec![1u8; bytes.max(1 << 20)];
    while monotonic_ns() < end {
        // One write per cache line: every line of the buffer passes through the caches.
        for i in (0..buf.len()).step_by(64) {
            buf[i] = buf[i].wrapping_add(1);
        }
        std::hint::black_box(&buf);
    }
    Ok(())
}

fn migrate(pid: u32, cpus: &[usize], every: Duration, end: u64) -> Result<()> {
    set_thread_name("migrator");
    anyhow::ensure!(
        cpus.len() >= 2,
        "--cpus must name at least two CPUs to move between"
    );
    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ u64::from(pid);
    let mut turn = 0usize;
    while monotonic_ns() < end {
        // Exponential gaps: moves come at random points of the requests, not in step with them.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let u = (x >> 11) as f64 / (1u64 << 53) as f64;
        let gap = every.as_secs_f64() * -(1.0 - u).ln();
        thread::sleep(Duration::from_secs_f64(gap.min(1.0)));
        turn = (turn + 1) % cpus.len();
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            break; // the target is gone
        };
        for t in tasks.flatten() {
            if let Some(tid) = t.file_name().to_str().and_then(|s| s.parse().ok()) {
                // A thread may exit in between; that is not an error.
                let _ = set_affinity(tid, &cpus[turn..=turn]);
            }
        }
    }
    Ok(())
}
