//! A workload the integration tests drive over stdin/stdout, so that the tracer's window can be
//! bracketed exactly: every thread is parked (blocked) whenever the test reads /proc, and all
//! the activity happens between "go" and "done".
//!
//! Usage: tracer-testload mixed THREADS | lifecycle | pinned CPU MILLIS | pingpong | cuda LIBRARY
//! | cuda-late LIBRARY (loads it on an "open" line)
//! Prints `ready pid=P tids=T1,T2,...`, then for each `go` line on stdin runs the scenario once
//! and prints `done ...`. Exits at end of input.
//!
//! `tracer-testload many THREADS` is different: that many threads, active from the start
//! (`many_threads`), `ready pid=P threads=N` once all exist, and the exit at end of input.
//! So is `tracer-testload paced RATE THREADS`: THREADS/2 pairs of threads passing a byte
//! back and forth over pipes, RATE round trips a second in all (`paced`), for `cargo xtask
//! bench`'s cost of `tracer watch`.

use std::{
    io::{BufRead, Write},
    sync::{Arc, Barrier, Condvar, Mutex},
    thread,
    time::{Duration, Instant},
};

fn gettid() -> u32 {
    // SAFETY: no arguments, cannot fail.
    unsafe { libc::gettid() as u32 }
}

fn pin_to(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is valid; CPU_SET writes inside it; pid 0 is this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set);
    }
}

fn spin_for(d: Duration) {
    let until = Instant::now() + d;
    let mut x = 1u64;
    while Instant::now() < until {
        for _ in 0..200 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
        }
        std::hint::black_box(x);
    }
}

/// The calling thread's own counters, from /proc/thread-self.
fn own_counts() -> (u64, u64, u64) {
    let status = std::fs::read_to_string("/proc/thread-self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    let sched = std::fs::read_to_string("/proc/thread-self/sched").unwrap_or_default();
    let migrations = sched
        .lines()
        .find(|l| l.starts_with("se.nr_migrations"))
        .and_then(|l| l.split(':').nth(1))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    (
        field("voluntary_ctxt_switches:"),
        field("nonvoluntary_ctxt_switches:"),
        migrations,
    )
}

/// What the last `cuda` round did, as the workload itself measured it.
static CUDA_ROUND: Mutex<Option<(u64, u64, u64)>> = Mutex::new(None);

type Launch = unsafe extern "C" fn(
    *mut libc::c_void,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    *mut libc::c_void,
    *mut *mut libc::c_void,
    *mut *mut libc::c_void,
) -> i32;
type SyncOn = unsafe extern "C" fn(*mut libc::c_void) -> i32;
type Sync = unsafe extern "C" fn() -> i32;
type Memcpy = unsafe extern "C" fn(*mut libc::c_void, u64, usize) -> i32;

/// `cuda-late`: the stand-in, loaded on "open" (after the tracer attached).
static LATE_CUDA: std::sync::OnceLock<FakeCuda> = std::sync::OnceLock::new();

/// The stand-in libcuda (tests/fakecuda), loaded at run time as a real program loads libcuda.
struct FakeCuda {
    launch: Launch,
    stream_sync: SyncOn,
    ctx_sync: Sync,
    event_sync: SyncOn,
    memcpy_dtoh: Memcpy,
    lost_return: Sync,
}

impl FakeCuda {
    fn open(path: &str) -> Self {
        let c = std::ffi::CString::new(path).unwrap();
        // SAFETY: dlopen/dlsym on a library we built for this purpose; each symbol is cast to
        // the signature the C file defines.
        unsafe {
            let h = libc::dlopen(c.as_ptr(), libc::RTLD_NOW);
            assert!(!h.is_null(), "dlopen {path}");
            let sym = |name: &str| {
                let n = std::ffi::CString::new(name).unwrap();
                let p = libc::dlsym(h, n.as_ptr());
                assert!(!p.is_null(), "dlsym {name}");
                p
            };
            Self {
                launch: std::mem::transmute::<*mut libc::c_void, Launch>(sym("cuLaunchKernel")),
                stream_sync: std::mem::transmute::<*mut libc::c_void, SyncOn>(sym(
                    "cuStreamSynchronize",
                )),
                ctx_sync: std::mem::transmute::<*mut libc::c_void, Sync>(sym("cuCtxSynchronize")),
                event_sync: std::mem::transmute::<*mut libc::c_void, SyncOn>(sym(
                    "cuEventSynchronize",
                )),
                memcpy_dtoh: std::mem::transmute::<*mut libc::c_void, Memcpy>(sym(
                    "cuMemcpyDtoH_v2",
                )),
                lost_return: std::mem::transmute::<*mut libc::c_void, Sync>(sym(
                    "fake_lost_return",
                )),
            }
        }
    }

    /// One synchronizing call left without a return (not counted: the probes cannot time it),
    /// then 20 steps of: 5 launches, then one synchronizing call of each kind. Returns
    /// (launches, synchronizing calls, ns spent inside them) as measured around the calls.
    fn round(&self) -> (u64, u64, u64) {
        let null = std::ptr::null_mut();
        let (mut launches, mut syncs, mut ns) = (0, 0, 0u64);
        // SAFETY: the stand-in's own function, no arguments.
        unsafe { (self.lost_return)() };
        let timed = |f: &dyn Fn()| {
            let t = Instant::now();
            f();
            t.elapsed().as_nanos() as u64
        };
        for _ in 0..20 {
            for _ in 0..5 {
                // SAFETY: the stand-in ignores its arguments.
                unsafe { (self.launch)(null, 1, 1, 1, 1, 1, 1, 0, null, null.cast(), null.cast()) };
                launches += 1;
            }
            // SAFETY: as above.
            ns += timed(&|| unsafe {
                (self.stream_sync)(null);
            });
            ns += timed(&|| unsafe {
                (self.ctx_sync)();
            });
            ns += timed(&|| unsafe {
                (self.event_sync)(null);
            });
            ns += timed(&|| unsafe {
                (self.memcpy_dtoh)(null, 0, 0);
            });
            syncs += 4;
        }
        (launches, syncs, ns)
    }
}

/// The counts the exiting thread read just before it exited.
static LEAVER: Mutex<Option<(u32, u64, u64, u64)>> = Mutex::new(None);

/// A gate threads park on between rounds.
struct Gate {
    round: Mutex<u64>,
    cv: Condvar,
}

impl Gate {
    fn wait_past(&self, seen: u64) -> u64 {
        let mut r = self.round.lock().unwrap();
        while *r == seen {
            r = self.cv.wait(r).unwrap();
        }
        *r
    }
    fn open(&self) {
        *self.round.lock().unwrap() += 1;
        self.cv.notify_all();
    }
}

/// Work with every kind of switch: sleeps (voluntary), yields (involuntary), and a change of
/// affinity every so often (migrations).
fn mixed_round(index: usize) {
    let cpus = thread::available_parallelism().map_or(1, |n| n.get());
    for i in 0..150 {
        spin_for(Duration::from_micros(200));
        thread::sleep(Duration::from_micros(300));
        if i % 10 == 0 {
            // SAFETY: sched_yield has no arguments.
            unsafe { libc::sched_yield() };
        }
        if i % 50 == 25 && cpus > 1 {
            pin_to((index + i / 50) % cpus);
        }
    }
    // Free again, so the next round starts from the same affinity.
    // SAFETY: a zeroed set with every CPU added is valid.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for c in 0..cpus {
            libc::CPU_SET(c, &mut set);
        }
        libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set);
    }
}

/// Whose turn it is in `pingpong`: even for worker 0, odd for worker 1.
static TURN: Mutex<u64> = Mutex::new(0);
static TURN_CV: Condvar = Condvar::new();

/// Two threads on CPU 0 hand a turn back and forth 10,000 times each: every hand-off wakes
/// the other, tens of thousands of wakeups a second on one CPU.
fn pingpong_round(index: usize) {
    pin_to(0);
    for _ in 0..10_000 {
        let mut turn = TURN.lock().unwrap();
        while *turn % 2 != index as u64 {
            turn = TURN_CV.wait(turn).unwrap();
        }
        *turn += 1;
        TURN_CV.notify_all();
    }
}

/// When `many` started: its threads' wakeups are placed from it.
static MANY_START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

/// One thread of `many`: it wakes once a second, in one of 100 groups 10 ms apart, and spins a
/// few microseconds. A group's threads wake together, so each waits behind its siblings and
/// preempts some of them: every thread has wait samples and a preemptor entry, the tracer's
/// per-thread work at its largest, for a few percent of a CPU at 20,000 threads.
extern "C" fn many_thread(index: *mut libc::c_void) -> *mut libc::c_void {
    let start = *MANY_START.get().expect("set before the threads");
    let phase = Duration::from_millis(10 * (index as u64 % 100));
    for second in 1u64.. {
        let at = start + Duration::from_secs(second) + phase;
        thread::sleep(at.saturating_duration_since(Instant::now()));
        spin_for(Duration::from_micros(3));
    }
    std::ptr::null_mut()
}

/// `paced RATE THREADS`: each pair's first thread sends a byte and waits for the answer, its
/// round trips spread over slots of 1 ms (or more), sleeping out the rest of each slot. On
/// one CPU a round trip is two context switches, and each slot's sleep one more per pair: the
/// bench counts the switches in /proc, not from RATE.
fn paced(rate: u64, threads: usize) {
    let pairs = (threads / 2).max(1) as u64;
    // Slots of 1 ms, or longer with one round trip each when a pair makes fewer than 1000.
    let per_pair = (rate / pairs).max(1);
    let (per_slot, slot_us) = if per_pair >= 1000 {
        (per_pair / 1000, 1000)
    } else {
        (1, 1_000_000 / per_pair)
    };
    for _ in 0..pairs {
        let (mut from_a, mut to_b) = std::io::pipe().expect("pipe");
        let (mut from_b, mut to_a) = std::io::pipe().expect("pipe");
        thread::spawn(move || {
            let mut byte = [0u8; 1];
            while std::io::Read::read_exact(&mut from_a, &mut byte).is_ok() {
                if to_a.write_all(&byte).is_err() {
                    break;
                }
            }
        });
        thread::spawn(move || {
            let mut byte = [0u8; 1];
            let start = Instant::now();
            for slot in 1u32.. {
                for _ in 0..per_slot {
                    to_b.write_all(&byte).expect("pipe");
                    std::io::Read::read_exact(&mut from_b, &mut byte).expect("pipe");
                }
                let at = start + Duration::from_micros(slot_us * u64::from(slot));
                thread::sleep(at.saturating_duration_since(Instant::now()));
            }
        });
    }
    say(&format!(
        "ready pid={} threads={}",
        std::process::id(),
        2 * pairs
    ));
    for line in std::io::stdin().lock().lines() {
        if line.is_err() {
            break;
        }
    }
    std::process::exit(0);
}

/// `many THREADS`. The threads are bare pthreads: a std thread maps four areas (stack, alternate
/// signal stack and their guard pages), and 20,000 of them would pass the default
/// vm.max_map_count of 65,530; a pthread with a small stack maps two.
fn many_threads(n: usize) {
    MANY_START.get_or_init(Instant::now);
    // SAFETY: the attribute is initialised before use and destroyed after; each thread gets its
    // index as its argument, not a pointer to anything.
    unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        libc::pthread_attr_init(&mut attr);
        libc::pthread_attr_setstacksize(&mut attr, 64 << 10);
        libc::pthread_attr_setdetachstate(&mut attr, libc::PTHREAD_CREATE_DETACHED);
        for index in 0..n {
            let mut t: libc::pthread_t = 0;
            let rc = libc::pthread_create(&mut t, &attr, many_thread, index as *mut libc::c_void);
            assert_eq!(
                rc, 0,
                "thread {index}: pthread_create failed (ulimit -u, kernel.threads-max, \
                 kernel.pid_max, vm.max_map_count)"
            );
        }
        libc::pthread_attr_destroy(&mut attr);
    }
    say(&format!("ready pid={} threads={n}", std::process::id()));
    for line in std::io::stdin().lock().lines() {
        if line.is_err() {
            break;
        }
    }
    // The threads never finish: leave without waiting for them.
    std::process::exit(0);
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let scenario = args.first().map(String::as_str).unwrap_or("mixed");
    if scenario == "paced" {
        let arg = |i: usize| args.get(i).and_then(|s| s.parse().ok());
        paced(
            arg(1).expect("paced RATE THREADS"),
            arg(2).expect("paced RATE THREADS") as usize,
        );
    }
    if scenario == "many" {
        many_threads(
            args.get(1)
                .and_then(|s| s.parse().ok())
                .expect("many THREADS"),
        );
    }
    let gate = Arc::new(Gate {
        round: Mutex::new(0),
        cv: Condvar::new(),
    });
    let n = match scenario {
        "mixed" => args.get(1).and_then(|s| s.parse().ok()).unwrap_or(3),
        "lifecycle" => 2,
        "pinned" => 2,
        "pingpong" => 2,
        "cuda" | "cuda-late" => 1,
        other => panic!("unknown scenario {other}"),
    };
    let cuda =
        (scenario == "cuda").then(|| Arc::new(FakeCuda::open(args.get(1).expect("cuda LIBRARY"))));
    let cpu: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let millis: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(1000);
    // Each round, every worker passes this barrier when its work is done (in lifecycle, the
    // worker that exits does not).
    let parties = if scenario == "lifecycle" { n } else { n + 1 };
    let done = Arc::new(Barrier::new(parties));
    let (tid_tx, tid_rx) = std::sync::mpsc::channel();
    for index in 0..n {
        let gate = Arc::clone(&gate);
        let done = Arc::clone(&done);
        let tid_tx = tid_tx.clone();
        let scenario = scenario.to_string();
        let cuda = cuda.clone();
        thread::Builder::new()
            .name(format!("load-{index}"))
            .spawn(move || {
                tid_tx.send((index, gettid())).unwrap();
                let mut seen = 0;
                loop {
                    seen = gate.wait_past(seen);
                    match scenario.as_str() {
                        "mixed" => mixed_round(index),
                        "pingpong" => pingpong_round(index),
                        "pinned" => {
                            pin_to(cpu);
                            spin_for(Duration::from_millis(millis));
                        }
                        "cuda" => {
                            let r = cuda.as_ref().expect("library").round();
                            *CUDA_ROUND.lock().unwrap() = Some(r);
                        }
                        "cuda-late" => {
                            let r = LATE_CUDA.get().expect("\"open\" first").round();
                            *CUDA_ROUND.lock().unwrap() = Some(r);
                        }
                        "lifecycle" if index == 0 => {
                            // Work, read its own counts, and exit at once inside the window:
                            // nothing that could block or wake another thread comes between
                            // the read and the exit system call (the main thread prints the
                            // counts later).
                            mixed_round(index);
                            let (v, i, m) = own_counts();
                            *LEAVER.lock().unwrap() = Some((gettid(), v, i, m));
                            // SAFETY: ends only this thread; its stack is leaked, and nobody
                            // joins it.
                            unsafe { libc::syscall(libc::SYS_exit, 0) };
                        }
                        _ => mixed_round(index),
                    }
                    done.wait();
                }
            })
            .unwrap();
    }
    // Workers start in any order; list their TIDs by index.
    let mut tids: Vec<(usize, u32)> = (0..n).map(|_| tid_rx.recv().unwrap()).collect();
    tids.sort();
    let tids: Vec<String> = tids.iter().map(|(_, t)| t.to_string()).collect();
    say(&format!(
        "ready pid={} tids={},{}",
        std::process::id(),
        gettid(),
        tids.join(",")
    ));
    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        if line.trim() == "open" && scenario == "cuda-late" {
            // The library loaded now, as a process initializes CUDA after start-up.
            let _ = LATE_CUDA.set(FakeCuda::open(args.get(1).expect("cuda-late LIBRARY")));
            say("opened");
            continue;
        }
        if line.trim() != "go" {
            continue;
        }
        let mut extra = String::new();
        if scenario == "lifecycle" {
            // A thread born inside the window that stays alive, parked.
            let (tx, rx) = std::sync::mpsc::channel();
            let park = Arc::new(Barrier::new(2));
            let park2 = Arc::clone(&park);
            thread::Builder::new()
                .name("born".into())
                .spawn(move || {
                    tx.send(gettid()).unwrap();
                    mixed_round(1);
                    park2.wait();
                    // Stay alive and blocked until the process ends.
                    loop {
                        thread::park();
                    }
                })
                .unwrap();
            extra = format!(" born={}", rx.recv().unwrap());
            gate.open();
            done.wait();
            park.wait();
            // Wait for the leaver to be gone, then say what it read.
            let (tid, v, i, m) = loop {
                if let Some(l) = *LEAVER.lock().unwrap()
                    && !std::path::Path::new(&format!("/proc/self/task/{}", l.0)).exists()
                {
                    break l;
                }
                thread::sleep(Duration::from_millis(1));
            };
            say(&format!("exiting tid={tid} vol={v} invol={i} migr={m}"));
        } else {
            gate.open();
            done.wait();
        }
        if let Some((launches, syncs, sync_ns)) = CUDA_ROUND.lock().unwrap().take() {
            extra = format!(" launches={launches} syncs={syncs} sync_ns={sync_ns}");
        }
        say(&format!("done{extra}"));
    }
}
