//! A small synthetic inference server: a dispatcher thread admits requests at a steady rate
//! (open loop, like clients that do not wait for each other), worker threads each take one and
//! spend a fixed amount of CPU time on it. Every request's arrival and completion are logged on
//! CLOCK_MONOTONIC, the tracer's clock, so latencies can be lined up with the recording.

use std::{
    collections::VecDeque,
    fs::File,
    io::{BufWriter, Write as _},
    path::PathBuf,
    sync::{Arc, Condvar, Mutex},
    thread,
    time::Duration,
};

use anyhow::{Context as _, Result};
use clap::Args;

use crate::sources::process::monotonic_ns;

#[derive(Debug, Args, Clone)]
pub struct WorkloadArgs {
    /// Worker threads.
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
    /// Requests per second, all workers together.
    #[arg(long, default_value_t = 400)]
    pub rate: u32,
    /// CPU time each request costs, in microseconds.
    #[arg(long, default_value_t = 1000)]
    pub work_us: u64,
    /// Run this long, then write the log and exit.
    #[arg(long, default_value = "10s", value_parser = crate::cli::parse_duration)]
    pub duration: Duration,
    /// Where to write one JSON line per request: {"start_ns", "end_ns", "tid"}, monotonic.
    #[arg(long)]
    pub latency_log: Option<PathBuf>,
}

/// One served request: arrival and completion on CLOCK_MONOTONIC, and who served it.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
pub struct RequestSpan {
    pub start_ns: u64,
    pub end_ns: u64,
    pub tid: u32,
}

struct Queue {
    pending: Mutex<(VecDeque<u64>, bool)>,
    ready: Condvar,
}

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into our timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Burns `ns` of this thread's CPU time: the same work whether or not the thread is preempted
/// meanwhile, as a real request's computation would be.
pub fn burn_cpu(ns: u64) {
    let until = thread_cpu_ns() + ns;
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    while thread_cpu_ns() < until {
        for _ in 0..256 {
            x = x.rotate_left(7).wrapping_mul(0x2545_f491_4f6c_dd1d) ^ 0x5555;
        }
        std::hint::black_box(x);
    }
}

pub fn gettid() -> u32 {
    // SAFETY: gettid has no arguments and cannot fail.
    unsafe { libc::gettid() as u32 }
}

/// Sets the calling thread's name (its comm), as the tracer will show it.
pub fn set_thread_name(name: &str) {
    if let Ok(c) = std::ffi::CString::new(name) {
        // SAFETY: PR_SET_NAME reads a NUL-terminated string (truncated to 15 bytes).
        unsafe { libc::prctl(libc::PR_SET_NAME, c.as_ptr()) };
    }
}

pub fn run(args: WorkloadArgs) -> Result<()> {
    set_thread_name("demo-server");
    let queue = Arc::new(Queue {
        pending: Mutex::new((VecDeque::new(), false)),
        ready: Condvar::new(),
    });
    let work_ns = args.work_us * 1000;
    let workers: Vec<_> = (0..args.workers.max(1))
        .map(|i| {
            let q = Arc::clone(&queue);
            thread::Builder::new()
                .name(format!("worker-{i}"))
                .spawn(move || worker(&q, work_ns))
                .context("spawning a worker")
        })
        .collect::<Result<_>>()?;

    let interval_ns = 1_000_000_000 / u64::from(args.rate.max(1));
    let end = monotonic_ns() + args.duration.as_nanos() as u64;
    let mut next = monotonic_ns();
    while next < end {
        let now = monotonic_ns();
        if now < next {
            thread::sleep(Duration::from_nanos(next - now));
        }
        let mut p = queue.pending.lock().expect("queue lock");
        p.0.push_back(next);
        drop(p);
        queue.ready.notify_one();
        next += interval_ns;
    }
    queue.pending.lock().expect("queue lock").1 = true;
    queue.ready.notify_all();
    let mut spans = Vec::new();
    for w in workers {
        spans.extend(w.join().map_err(|_| anyhow::anyhow!("a worker panicked"))?);
    }
    if let Some(path) = args.latency_log {
        write_log(&path, &spans)?;
    }
    Ok(())
}

fn worker(q: &Queue, work_ns: u64) -> Vec<RequestSpan> {
    let tid = gettid();
    let mut spans = Vec::new();
    loop {
        let mut p = q.pending.lock().expect("queue lock");
        let arrival = loop {
            if let Some(a) = p.0.pop_front() {
                break a;
            }
            if p.1 {
                return spans;
            }
            p = q.ready.wait(p).expect("queue lock");
        };
        drop(p);
        burn_cpu(work_ns);
        spans.push(RequestSpan {
            start_ns: arrival,
            end_ns: monotonic_ns(),
            tid,
        });
    }
}

fn write_log(path: &PathBuf, spans: &[RequestSpan]) -> Result<()> {
    let mut out =
        BufWriter::new(File::create(path).with_context(|| format!("creating {}", path.display()))?);
    for s in spans {
        serde_json::to_writer(&mut out, s)?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(())
}

/// Reads a log written by `write_log`.
pub fn read_log(path: &std::path::Path) -> Result<Vec<RequestSpan>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).with_context(|| format!("bad latency line {l:?}")))
        .collect()
}
