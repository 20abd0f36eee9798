//! Causes beyond scheduling, cache and GPU load: lock waits (the GIL among them), runtime
//! pauses (garbage collection) and host-bound GPU work. From the tail's excess where requests
//! say where it went; from the window's totals otherwise. Thresholds: docs/ATTRIBUTION.md.

use super::{
    evidence::{ms, pct},
    gpu::{GPU_BUSY_PCT, target_gpu_util},
    mechanism::{Holder, Mechanism},
    model::Cause,
};
use crate::{
    analysis::{
        held::GIL_WAIT_MAX_NS,
        requests::{HolderTime, RequestAnalysis, add_holder},
        summary::Summary,
        wakers::WakerKind,
    },
    recording::{printable, wakers::BlockedIn},
};

/// Over the window: a busy thread's futex waits held by threads of its process, counted when
/// they are at least this share of the time the threads wanted a CPU.
pub const LOCK_MIN: f64 = 0.10;
/// A waiting thread counts when on a CPU at least this share of the window (an idle worker
/// waiting for work is not held up), and a holder when on a CPU at least this share, or for at
/// least `LOCK_HOLDER_WORKED` times the waiting it ended: a holder that works in bursts (40 ms
/// under the lock every 250 ms is 16 % of the window) ran about as long as the others waited
/// for it, where a dispatcher that hands a worker its next job runs a sliver of that.
pub const LOCK_WAITER_BUSY: f64 = 0.10;
pub const LOCK_HOLDER_BUSY: f64 = 0.50;
pub const LOCK_HOLDER_WORKED: f64 = 0.50;
/// Collections taking at least this share of the window.
pub const GC_MIN: f64 = 0.05;
/// Host-bound: a GPU-using thread on its CPU outside CUDA waits for this share of the window,
/// launching at least `LAUNCH_RATE_MIN` kernels a second, its GPU below `GPU_BUSY_PCT`.
pub const HOST_ONCPU_MIN: f64 = 0.60;
pub const LAUNCH_RATE_MIN: f64 = 100.0;
/// Clock throttling: a policy held a GPU's clocks down for this share of the window.
pub const CLOCK_THROTTLE_MIN: f64 = 0.10;

/// The holders named, with their share of the waiting.
fn holders(s: &Summary, times: &[HolderTime]) -> Vec<Holder> {
    let total: f64 = times.iter().map(|h| h.ns).sum::<f64>().max(1e-9);
    times
        .iter()
        .take(4)
        .map(|h| {
            let t = s.threads.iter().find(|t| t.tid == h.tid);
            Holder {
                tid: h.tid,
                pid: t.map_or(0, |t| t.pid),
                comm: t.map_or_else(String::new, |t| t.comm.clone()),
                share: h.ns / total,
            }
        })
        .enumerate()
        // Holders of a sliver of the wait are noise in the text: the largest always stays.
        .filter(|(i, h)| *i == 0 || h.share >= 0.05)
        .map(|(_, h)| h)
        .collect()
}

/// Whether the process `pid` runs CPython, so its Python threads' lock is the GIL.
fn is_python(s: &Summary, pid: u32) -> bool {
    s.process(pid).is_some_and(|p| p.python.is_some())
}

fn oncpu_share(s: &Summary, tid: u32) -> Option<f64> {
    let t = s.threads.iter().find(|t| t.tid == tid)?;
    Some(t.totals.time.oncpu_ns as f64 / s.duration_ns.max(1) as f64)
}

/// The lock cause for the holders' `times`. In a CPython process a futex its threads hand
/// over is the GIL, unless most of the waiting was in single waits longer than a GIL waiter
/// ever waits (`GIL_WAIT_MAX_NS`): then a lock of the program's own.
fn lock_cause(s: &Summary, times: &[HolderTime], share: f64, evidence: String) -> Cause {
    let hs = holders(s, times);
    let total: f64 = times.iter().map(|h| h.ns).sum::<f64>().max(1e-9);
    let long = times.iter().map(|h| h.long_ns).sum::<f64>() / total;
    let python = hs.first().is_some_and(|h| is_python(s, h.pid));
    let gil = python && long < 0.5;
    let how = match (python, s.process(hs.first().map_or(0, |h| h.pid))) {
        (true, Some(p)) => {
            let py = p.python.as_ref();
            let (version, how) = (
                py.map_or("", |p| p.version.as_str()),
                py.map_or("", |p| p.how.as_str()),
            );
            if gil {
                format!(
                    "; the process runs CPython {version} ({how}), and a futex its threads hand over is the GIL"
                )
            } else {
                format!(
                    "; the process runs CPython {version} ({how}), but {} of the waiting was in single waits of more than {}, longer than a GIL waiter waits (one switch interval, then it asks the holder to drop it): a lock of the program's own (a threading.Lock, a queue, a condition), not the GIL",
                    pct(long, ""),
                    ms(GIL_WAIT_MAX_NS as f64)
                )
            }
        }
        _ => String::new(),
    };
    let held: Vec<String> = hs
        .iter()
        .take(2)
        .map(|h| {
            format!(
                "thread {} ({}) ended {} of it and was on a CPU {} of the window",
                h.tid,
                printable(&h.comm),
                pct(h.share, ""),
                oncpu_share(s, h.tid).map_or("?".into(), |x| pct(x, ""))
            )
        })
        .collect();
    Cause::new(
        Mechanism::LockWait { holders: hs, gil },
        share,
        format!("{evidence}; {}{how}", held.join("; ")),
    )
}

/// The tail's lock waits and collections, as shares of the excess (`share` of a part).
/// `ex`: the tail's excess, its queued part routed (queue.rs).
pub fn tail_causes(
    s: &Summary,
    r: &RequestAnalysis,
    ex: &crate::analysis::requests::Breakdown,
    share: &dyn Fn(f64) -> f64,
) -> Vec<Cause> {
    let (t, m) = (&r.tail.mean, &r.median.mean);
    let mut out = vec![lock_cause(
        s,
        &r.tail.lock_holders,
        share(ex.lock_wait_ns),
        format!(
            "blocked in a futex another thread held, or waiting for a thread of the service that was: {} in tail requests vs {} in median ones",
            ms(t.lock_wait_ns),
            ms(m.lock_wait_ns)
        ),
    )];
    if let Some(c) = gc_cause(s, share(ex.runtime_pause_ns)) {
        out.push(Cause {
            evidence: format!(
                "inside a collection of the serving process: {} in tail requests vs {} in median ones; {}",
                ms(t.runtime_pause_ns),
                ms(m.runtime_pause_ns),
                c.evidence
            ),
            ..c
        });
    }
    out
}

fn gc_cause(s: &Summary, share: f64) -> Option<Cause> {
    let longest = s.gc.iter().max_by_key(|g| g.max_ns)?;
    let n: u64 = s.gc.iter().map(|g| g.collections).sum();
    let total: u64 = s.gc.iter().map(|g| g.total_ns).sum();
    Some(Cause::new(
        Mechanism::GcPause {
            collections: n,
            longest_ns: longest.max_ns,
            generation: longest.max_generation,
        },
        share,
        format!(
            "{n} collections took {} of the window in all ({}); the longest {} on thread {}, generation {}",
            ms(total as f64),
            pct(total as f64 / s.duration_ns.max(1) as f64, ""),
            ms(longest.max_ns as f64),
            longest.tid,
            longest.max_generation.map_or("?".into(), |g| g.to_string())
        ),
    ))
}

/// Lock waits over the window, from the kernel's totals by waker: a busy thread's futex waits
/// ended by a thread of its process, or by a timeout (a timer's) while a busy thread of its
/// process ran. (ns lost, cause.)
fn window_lock(s: &Summary, wanted: f64) -> Option<(f64, Cause)> {
    let window = s.duration_ns.max(1) as f64;
    let busy = |tid: u32| oncpu_share(s, tid).unwrap_or(0.0);
    // Whether `tid` worked enough to have held what others waited `waited` ns for.
    let holds = |tid: u32, waited: f64| {
        busy(tid) >= LOCK_HOLDER_BUSY || busy(tid) * window >= LOCK_HOLDER_WORKED * waited
    };
    let mut lost = 0.0;
    let mut by: Vec<HolderTime> = Vec::new();
    let mut add =
        |tid: u32, ns: f64, long: bool| add_holder(&mut by, HolderTime::of(tid, ns, long));
    for p in s
        .held_up_by
        .iter()
        .filter(|p| p.blocked_in == BlockedIn::Futex && busy(p.tid) >= LOCK_WAITER_BUSY)
    {
        let ns = p.blocked_ns as f64;
        match p.by.kind {
            WakerKind::SameProcess if holds(p.by.tid, ns) => {
                lost += ns;
                let mean = p.blocked_ns / p.wakeups.max(1);
                add(p.by.tid, ns, mean > GIL_WAIT_MAX_NS);
            }
            WakerKind::Timer | WakerKind::Interrupt | WakerKind::KernelThread => {
                // A timed wait that expired (a timer's, or an interrupt's or kernel thread's
                // where timer callbacks are not marked): held by the busiest other thread of
                // the process.
                let holder = s
                    .threads
                    .iter()
                    .filter(|t| t.pid == p.pid && t.tid != p.tid)
                    .max_by_key(|t| t.totals.time.oncpu_ns)
                    .filter(|t| holds(t.tid, ns));
                if let Some(h) = holder {
                    lost += ns;
                    add(h.tid, ns, false);
                }
            }
            _ => {}
        }
    }
    if lost / wanted < LOCK_MIN {
        return None;
    }
    by.sort_by(|a, b| b.ns.total_cmp(&a.ns));
    let cause = lock_cause(
        s,
        &by,
        0.0,
        format!(
            "busy threads waited {} in futexes that other threads of their process held while they worked ({} of the time the threads wanted a CPU)",
            ms(lost),
            pct(lost / wanted, "")
        ),
    );
    Some((lost, cause))
}

/// A GPU-using thread on its CPU most of the window (or of the requests it served) outside
/// CUDA waits, launching kernels, while its GPU was partly idle: the host paces the GPU. A
/// thread spinning inside a synchronizing call is waiting for the GPU, not pacing it: its time
/// in those calls is taken off its on-CPU time first.
fn host_bound(s: &Summary) -> Option<(f64, Cause)> {
    pacer(s).map(|(_, ns, c)| (ns, c))
}

/// The tail's longer on-CPU time, where most of the slowest requests ran on the thread that
/// paces its GPU (`host_bound`): that time is the launch path the GPU waited for, and the fix
/// (CUDA graphs, fewer and larger kernels, less Python per step) is the host-bound one, not a
/// cache or a clock. `oncpu`: the tail's on-CPU time against the median's, in words.
pub fn host_bound_tail(s: &Summary, r: &RequestAnalysis, share: f64, oncpu: &str) -> Option<Cause> {
    let (tid, _, c) = pacer(s)?;
    let on = r.slowest.iter().filter(|d| d.tid == tid).count();
    (2 * on > r.slowest.len()).then(|| Cause {
        share,
        evidence: format!(
            "on-CPU time {oncpu}, in the thread that paces its GPU ({on} of the {} slowest \
             requests): {}; its host work took longer (more launches, a lower clock, steal or \
             cache misses would all show so)",
            r.slowest.len(),
            c.evidence
        ),
        ..c
    })
}

/// The thread pacing its GPU, if any: (its tid, the GPU's idle share of its outside time in
/// ns, the cause).
fn pacer(s: &Summary) -> Option<(u32, f64, Cause)> {
    let util = target_gpu_util(s)?;
    if util >= GPU_BUSY_PCT {
        return None;
    }
    let window = s.duration_ns.max(1) as f64;
    let secs = window / 1e9;
    let (t, outside) = s
        .threads
        .iter()
        .filter_map(|t| {
            let c = t.cuda.as_ref()?;
            let outside = t.totals.time.oncpu_ns.saturating_sub(c.sync_ns) as f64;
            (c.launches as f64 / secs >= LAUNCH_RATE_MIN).then_some((t, outside))
        })
        .max_by(|a, b| a.1.total_cmp(&b.1))?;
    // A server idles between requests: where the thread serves requests, its share of their
    // time counts too (the median requests', on a CPU outside synchronizing calls).
    let served = s
        .requests
        .as_ref()
        .filter(|r| r.requests > 0 && r.slowest.iter().any(|d| d.tid == t.tid))
        .map(|r| {
            let m = &r.median;
            (m.mean.oncpu_ns + m.mean.queued_oncpu_ns) / m.wall_ns_mean.max(1.0)
        });
    let share = outside / window;
    let (share, of_requests, of) = match served {
        Some(x) if x > share => (
            x,
            true,
            format!(
                "of its requests' time ({} of the window)",
                pct(outside / window, "")
            ),
        ),
        _ => (share, false, "of the window".to_string()),
    };
    if share < HOST_ONCPU_MIN {
        return None;
    }
    let launches = t.cuda.as_ref().map_or(0, |c| c.launches) as f64 / secs;
    let idle = 100.0 - util;
    Some((
        t.tid,
        outside * idle / 100.0,
        Cause::new(
            Mechanism::LaunchOverhead {
                oncpu_share: share,
                oncpu_of_requests: of_requests,
                launches_per_s: launches,
                gpu_idle_pct: idle,
            },
            0.0,
            format!(
                "thread {} ({}) was on a CPU {} {of} outside synchronizing CUDA calls \
                 and launched {launches:.0} kernels a second, while its GPU was {util:.0}% busy: \
                 the GPU waited for the host between steps",
                t.tid,
                printable(&t.comm),
                pct(share, "")
            ),
        ),
    ))
}

/// Clocks held down by a policy (power, thermal, board, reliability: not the idle
/// `low_utilization` or the application-clock totals) for `CLOCK_THROTTLE_MIN` of the window on
/// a GPU of the set that was not saturated, while its threads waited on the GPU.
fn clock_throttle(s: &Summary) -> Option<(f64, Cause)> {
    let g = s.gpu.as_ref()?;
    let util = target_gpu_util(s)?;
    if util >= GPU_BUSY_PCT || s.cuda.sync_ns == 0 {
        return None;
    }
    let held = ["power", "thermal", "board_limit", "reliability"];
    let policies: Vec<crate::analysis::verdict::mechanism::ClockViolation> = g
        .devices
        .iter()
        .filter(|d| d.used_by_target)
        .flat_map(|d| {
            d.clock_violations
                .iter()
                .filter(|v| held.contains(&v.policy.as_str()) && v.share >= CLOCK_THROTTLE_MIN)
                .map(|v| crate::analysis::verdict::mechanism::ClockViolation {
                    gpu: d.index,
                    policy: v.policy.clone(),
                    ns: v.ns,
                    share: v.share,
                })
        })
        .collect();
    let worst = policies.iter().map(|p| p.share).reduce(f64::max)?;
    let text: Vec<String> = policies
        .iter()
        .map(|p| {
            format!(
                "GPU {} {} {} ({})",
                p.gpu,
                p.policy,
                ms(p.ns as f64),
                pct(p.share, "")
            )
        })
        .collect();
    Some((
        s.cuda.sync_ns as f64 * worst,
        Cause::new(
            Mechanism::ClockThrottle { policies },
            0.0,
            format!(
                "NVML's violation counters over the window: {}; the GPU {util:.0}% busy, its                  threads {} in CUDA synchronization",
                text.join(", "),
                ms(s.cuda.sync_ns as f64)
            ),
        ),
    ))
}

/// The window's causes of this family: (ns lost, cause).
pub fn window_causes(s: &Summary, wanted: f64) -> Vec<(f64, Cause)> {
    let mut out: Vec<(f64, Cause)> = Vec::new();
    out.extend(window_lock(s, wanted));
    let gc: u64 = s.gc.iter().map(|g| g.total_ns).sum();
    if gc as f64 >= GC_MIN * s.duration_ns.max(1) as f64
        && let Some(c) = gc_cause(s, 0.0)
    {
        out.push((gc as f64, c));
    }
    out.extend(host_bound(s));
    out.extend(clock_throttle(s));
    out
}
