//! A small synthetic inference server: a dispatcher thread admits requests at a steady rate
//! (open loop, like clients that do not wait for each other), worker threads each take one and
//! do a fixed amount of work on it. Every request passes through two marker functions the
//! tracer can probe (`tracer_request_start` on admission, `tracer_request_end` on completion,
//! both taking the request id), and can be logged on CLOCK_MONOTONIC as well.
//!
//! With `--engine-process` it is a service of two processes, shaped like vLLM's: this process
//! (the front end, `demo-api`) admits the requests and passes each down a pipe to a child
//! process (the engine, `demo-engine`) whose workers serve them and which marks and logs them.

use std::{
    collections::VecDeque,
    fs::File,
    io::{BufWriter, Write as _},
    path::PathBuf,
    sync::{
        Arc, Condvar, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread,
    time::Duration,
};

use anyhow::{Context as _, Result};
use clap::Args;

use super::work::Work;
use crate::{
    recording::requests::RequestSpan,
    sources::{clock::monotonic_ns, topology::set_affinity},
};

#[derive(Debug, Args, Clone)]
pub struct WorkloadArgs {
    /// Worker threads.
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
    /// Requests per second, all workers together.
    #[arg(long, default_value_t = 400)]
    pub rate: u32,
    /// The work each request does, as CPU time on a quiet machine, in microseconds.
    #[arg(long, default_value_t = 1000)]
    pub work_us: u64,
    /// Memory each worker's requests walk through, in KiB (0: arithmetic only). A working set
    /// beyond the private caches makes requests sensitive to what else uses the shared cache.
    #[arg(long, default_value_t = 0)]
    pub working_set_kib: usize,
    /// Run every thread on these CPUs only (e.g. 0 or 0,1).
    #[arg(long, value_delimiter = ',')]
    pub cpus: Vec<usize>,
    /// Run this long, then write the log and exit (SIGINT ends it sooner, the same way).
    #[arg(long, default_value = "10s", value_parser = crate::units::parse_duration)]
    pub duration: Duration,
    /// Where to write one JSON line per request: {"start_ns", "end_ns", "tid", "id"}, after a
    /// {"clock": "monotonic"} line (the format `--latencies` reads).
    #[arg(long)]
    pub latency_log: Option<PathBuf>,
    /// Serve from a child process: this one admits the requests and hands them to an engine
    /// process down a pipe, as an API server hands them to its engine core.
    #[arg(long)]
    pub engine_process: bool,
    /// With --engine-process: the front end's CPUs (--cpus is then the engine's).
    #[arg(long, value_delimiter = ',')]
    pub front_end_cpus: Vec<usize>,
    /// From this long after the start, a thread of the server takes the lock the workers take
    /// once per request (their shared statistics) every 250 ms and holds it for 40 ms of work:
    /// a native mutex held by a sibling (the lock-contention scenario).
    #[arg(long, value_parser = crate::units::parse_duration)]
    pub lock_after: Option<Duration>,
    /// The lock holder's CPUs (default: the server's).
    #[arg(long, value_delimiter = ',')]
    pub lock_cpus: Vec<usize>,
    /// Be the engine: read requests (id, admission time) from stdin until it closes.
    #[arg(long, hide = true)]
    pub engine: bool,
}

/// The last request admitted and completed. Storing them gives the two marker functions
/// different bodies, which the linker would otherwise fold into one (and both probes would
/// fire on every call). Exported, so the stores cannot be optimized away with the calls. A
/// plain store, not a read-modify-write: x86 uprobes refuse to probe a `lock`-prefixed first
/// instruction (ENOTSUPP).
#[unsafe(no_mangle)]
pub static TRACER_LAST_REQUEST_STARTED: AtomicU64 = AtomicU64::new(0);
#[unsafe(no_mangle)]
pub static TRACER_LAST_REQUEST_ENDED: AtomicU64 = AtomicU64::new(0);

/// Marks a request's admission: a uprobe target (`--request-start EXE:tracer_request_start`).
/// Not inlined and kept under its own name, so the probe has a function to attach to.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn tracer_request_start(id: u64) {
    TRACER_LAST_REQUEST_STARTED.store(id, Ordering::Relaxed);
}

/// Marks a request's completion (`--request-end EXE:tracer_request_end`).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn tracer_request_end(id: u64) {
    TRACER_LAST_REQUEST_ENDED.store(id, Ordering::Relaxed);
}

struct Queue {
    pending: Mutex<(VecDeque<(u64, u64)>, bool)>,
    ready: Condvar,
}

pub fn gettid() -> u32 {
    // The system call, not glibc's gettid(): that wrapper is glibc 2.30+, and the release
    // binary is linked against 2.28 (`cargo xtask dist`).
    // SAFETY: gettid has no arguments and cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) as u32 }
}

/// Sets the calling thread's name (its comm), as the tracer will show it.
pub fn set_thread_name(name: &str) {
    if let Ok(c) = std::ffi::CString::new(name) {
        // SAFETY: PR_SET_NAME reads a NUL-terminated string (truncated to 15 bytes).
        unsafe { libc::prctl(libc::PR_SET_NAME, c.as_ptr()) };
    }
}

pub fn run(args: WorkloadArgs) -> Result<()> {
    if args.engine_process {
        return front_end(&args);
    }
    set_thread_name(if args.engine {
        "demo-engine"
    } else {
        "demo-server"
    });
    if !args.cpus.is_empty() {
        // Threads created from here on inherit the affinity.
        set_affinity(0, &args.cpus)?;
    }
    let work = Work::calibrate(args.work_us * 1000, args.working_set_kib * 1024);
    let queue = Arc::new(Queue {
        pending: Mutex::new((VecDeque::new(), false)),
        ready: Condvar::new(),
    });
    let stats = Arc::new(Mutex::new(0u64));
    if let Some(after) = args.lock_after {
        let (stats, cpus, work) = (Arc::clone(&stats), args.lock_cpus.clone(), work.fresh());
        let end = monotonic_ns() + args.duration.as_nanos() as u64;
        thread::Builder::new()
            .name("lock-holder".into())
            .spawn(move || hold_lock(&stats, after, &cpus, work, end))
            .context("spawning the lock holder")?;
    }
    let workers: Vec<_> = (0..args.workers.max(1))
        .map(|i| {
            let (q, stats) = (Arc::clone(&queue), Arc::clone(&stats));
            let mut w = work.fresh();
            thread::Builder::new()
                .name(format!("worker-{i}"))
                .spawn(move || worker(&q, &stats, &mut w))
                .context("spawning a worker")
        })
        .collect::<Result<_>>()?;
    let enqueue = |id: u64, admitted: u64| {
        queue
            .pending
            .lock()
            .expect("queue lock")
            .0
            .push_back((id, admitted));
        queue.ready.notify_one();
    };
    if args.engine {
        // The front end admitted each request; the engine marks it when it gets it.
        let mut input = std::io::stdin().lock();
        let mut msg = [0u8; 16];
        while std::io::Read::read_exact(&mut input, &mut msg).is_ok() {
            let id = u64::from_le_bytes(msg[..8].try_into().expect("8 bytes"));
            let admitted = u64::from_le_bytes(msg[8..].try_into().expect("8 bytes"));
            tracer_request_start(id);
            enqueue(id, admitted);
        }
    } else {
        admit(&args, |id, admitted| {
            // The request is admitted now, whenever the dispatcher got to it: that is what a
            // server sees, and what the marker records.
            tracer_request_start(id);
            enqueue(id, admitted);
            Ok(())
        })?;
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

/// Set by SIGINT: stop admitting, serve what is queued, write the log and exit. The demo
/// stops its server so once the recording is over, however long attaching took (BPF loading
/// under emulation has taken longer than the whole demo window).
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

fn stop_on_sigint() {
    // SAFETY: the handler only stores to an atomic; the zeroed sigaction has an empty mask
    // and no flags.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigint as extern "C" fn(libc::c_int) as usize;
        libc::sigaction(libc::SIGINT, &sa, std::ptr::null_mut());
    }
}

/// Admits requests at the steady rate for the duration, or until SIGINT: `each(id, admission
/// time)`.
fn admit(args: &WorkloadArgs, mut each: impl FnMut(u64, u64) -> Result<()>) -> Result<()> {
    stop_on_sigint();
    let interval_ns = 1_000_000_000 / u64::from(args.rate.max(1));
    let end = monotonic_ns() + args.duration.as_nanos() as u64;
    let mut next = monotonic_ns();
    let mut id = 0u64;
    while next < end && !STOP.load(Ordering::Relaxed) {
        let now = monotonic_ns();
        if now < next {
            thread::sleep(Duration::from_nanos(next - now));
        }
        id += 1;
        each(id, monotonic_ns())?;
        next += interval_ns;
    }
    Ok(())
}

/// The front end of a two-process service: starts the engine (this binary, `--engine`, with
/// the serving arguments), admits the requests and writes each to the engine's stdin.
fn front_end(args: &WorkloadArgs) -> Result<()> {
    use std::process::{Command, Stdio};
    set_thread_name("demo-api");
    if !args.front_end_cpus.is_empty() {
        set_affinity(0, &args.front_end_cpus)?;
    }
    let exe = std::env::current_exe().context("locating the tracer binary")?;
    let mut engine_args = vec![
        "workload".to_string(),
        "--engine".into(),
        format!("--workers={}", args.workers),
        format!("--work-us={}", args.work_us),
        format!("--working-set-kib={}", args.working_set_kib),
        format!("--duration={}ms", args.duration.as_millis()),
    ];
    if !args.cpus.is_empty() {
        let cpus: Vec<String> = args.cpus.iter().map(ToString::to_string).collect();
        engine_args.push(format!("--cpus={}", cpus.join(",")));
    }
    if let Some(log) = &args.latency_log {
        engine_args.push(format!("--latency-log={}", log.display()));
    }
    // The engine dies with the front end, as a child of the demo must.
    let mut engine = super::die_with_parent(&mut Command::new(exe))
        .args(&engine_args)
        .stdin(Stdio::piped())
        .spawn()
        .context("starting the engine process")?;
    let mut pipe = engine.stdin.take().expect("piped");
    let admitted = admit(args, |id, at| {
        let mut msg = [0u8; 16];
        msg[..8].copy_from_slice(&id.to_le_bytes());
        msg[8..].copy_from_slice(&at.to_le_bytes());
        pipe.write_all(&msg)
            .context("passing a request to the engine")
    });
    // Closing the pipe tells the engine that no more requests come.
    drop(pipe);
    let status = engine.wait().context("waiting for the engine")?;
    admitted?;
    anyhow::ensure!(status.success(), "the engine process failed: {status}");
    Ok(())
}

/// Holds `lock` for 40 ms of work every 250 ms, from `after` until `end`.
fn hold_lock(lock: &Mutex<u64>, after: Duration, cpus: &[usize], mut work: Work, end: u64) {
    if !cpus.is_empty() {
        let _ = set_affinity(0, cpus);
    }
    thread::sleep(after);
    while monotonic_ns() < end {
        {
            let mut n = lock.lock().expect("stats lock");
            for _ in 0..40 {
                work.run();
            }
            *n += 1;
        }
        thread::sleep(Duration::from_millis(250));
    }
}

fn worker(q: &Queue, stats: &Mutex<u64>, work: &mut Work) -> Vec<RequestSpan> {
    let tid = gettid();
    let mut spans = Vec::new();
    loop {
        let mut p = q.pending.lock().expect("queue lock");
        let (id, admitted) = loop {
            if let Some(a) = p.0.pop_front() {
                break a;
            }
            if p.1 {
                return spans;
            }
            p = q.ready.wait(p).expect("queue lock");
        };
        drop(p);
        work.run();
        *stats.lock().expect("stats lock") += 1;
        let end_ns = monotonic_ns();
        tracer_request_end(id);
        spans.push(RequestSpan {
            start_ns: admitted,
            end_ns,
            tid,
            id: Some(id),
        });
    }
}

fn write_log(path: &PathBuf, spans: &[RequestSpan]) -> Result<()> {
    let mut out =
        BufWriter::new(File::create(path).with_context(|| format!("creating {}", path.display()))?);
    out.write_all(b"{\"clock\":\"monotonic\"}\n")?;
    for s in spans {
        serde_json::to_writer(&mut out, s)?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(())
}
