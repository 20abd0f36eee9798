//! CPU hogs: threads that never block, the demo's disturbance. At the same priority as the
//! workload, CFS gives each runnable thread an equal share, so every hog on a worker's CPU
//! makes that worker wait in the run queue.

use std::{thread, time::Duration};

use anyhow::{Context as _, Result};
use clap::Args;

use crate::{sources::process::monotonic_ns, workload::server::set_thread_name};

#[derive(Debug, Args, Clone)]
pub struct HogArgs {
    /// Number of spinning threads (default: one per online CPU).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Stop after this long.
    #[arg(long, default_value = "10s", value_parser = crate::cli::parse_duration)]
    pub duration: Duration,
}

pub fn run(args: HogArgs) -> Result<()> {
    set_thread_name("cpu-hog");
    let n = args
        .threads
        .unwrap_or_else(|| thread::available_parallelism().map_or(1, |n| n.get()));
    let end = monotonic_ns() + args.duration.as_nanos() as u64;
    let hogs: Vec<_> = (0..n)
        .map(|i| {
            thread::Builder::new()
                .name(format!("cpu-hog-{i}"))
                .spawn(move || {
                    let mut x = 1u64;
                    while monotonic_ns() < end {
                        for _ in 0..10_000 {
                            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                        }
                        std::hint::black_box(x);
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
