//! Causes from the impediments over the window, for when there are no requests to compare (or
//! their latency is steady): how much of the time the threads wanted a CPU they lost, and to
//! what; the GPU's state while they waited on it; their MPKI against their own baseline.

use super::{
    evidence::{ms, pct, throttle_evidence, throttled},
    gpu::{GPU_BUSY_PCT, gpu_mechanism, target_gpu_util},
    mechanism::Mechanism,
    model::Cause,
};
use crate::{
    analysis::summary::Summary,
    recording::{is_migration_stopper, printable, waits::WaitClasses},
};

/// Run-queue contention worth naming: 10 % of the time the threads wanted a CPU. Below that,
/// CFS on a busy machine is doing its job; above it, a request of 1 ms runs at 0.9x speed or
/// worse on average and its tail much worse.
pub const CONTENTION_MIN: f64 = 0.10;
/// Waiting on an idle CPU while the cgroup throttled: 2 % of the wanted time.
pub const THROTTLE_MIN: f64 = 0.02;
/// Forced migrations (moves while waiting) per second per busy thread. Load balancing moves a
/// thread a few times a second; dozens per second means something keeps moving it.
pub const MIGRATION_RATE_MIN: f64 = 20.0;
/// A thread waiting on the GPU for at least 20 % of its busy time (on a CPU, waiting for one,
/// or in CUDA synchronization), while the GPU was >= 85 % busy (`GPU_BUSY_PCT`). Busy time, not wall time: a
/// server idle between requests still has every request slowed.
pub const GPU_SYNC_MIN: f64 = 0.20;
/// A thread's MPKI is elevated in a bin at twice its median bin (and >= 1), in 10 % of bins.
pub const MPKI_ELEVATION: f64 = 2.0;
pub const MPKI_ELEVATED_BINS_MIN: f64 = 0.10;
/// A thread counts as busy at 5 % on-CPU over the window.
const BUSY_SHARE: f64 = 0.05;

pub fn causes(s: &Summary) -> Vec<Cause> {
    let w = Waits::of(s);
    let mut lost = scheduling(s, &w);
    lost.extend(gpu_wait(s));
    lost.extend(
        cache_loss(s).map(|(ns, evidence)| (ns, Cause::new(Mechanism::LlcMisses, 0.0, evidence))),
    );
    lost.extend(super::held::window_causes(s, w.wanted));
    let total: f64 = lost.iter().map(|l| l.0).sum::<f64>().max(1.0);
    lost.into_iter()
        .map(|(ns, cause)| Cause {
            share: ns / total,
            attributed_ns: ns,
            ..cause
        })
        .collect()
}

/// The threads' run-queue wait over the window, split by what held them (ns).
struct Waits {
    /// On a CPU or waiting for one: the time the threads wanted a CPU.
    wanted: f64,
    /// Behind other tasks, the quota's and the moves' waits taken out.
    contention_ns: f64,
    /// Held by the cgroup's quota while other tasks ran, `made_up_ns` included.
    throttled_ns: f64,
    /// Of those, waits behind other tasks the quota made up for (estimated).
    made_up_ns: f64,
    /// With the CPU idle.
    idle_ns: f64,
    /// After forced moves, and behind the migration stopper.
    migration_ns: f64,
    stopper_ns: f64,
}

impl Waits {
    fn of(s: &Summary) -> Self {
        let t = &s.totals;
        let c: &WaitClasses = &t.wait_classes;
        let classified = c.total_ns() as f64;
        // The wait classes come from the timeline; the kernel's total is exact even if events
        // were lost, so they are scaled to it.
        let scale = if classified > 0.0 {
            t.time.runq_wait_ns as f64 / classified
        } else {
            0.0
        };
        // Who held the CPU while the threads waited, integrated by the kernel per CPU: the idle
        // task (the CPU was free but the thread could not run: throttling, or a slow wakeup),
        // the migration stopper (the cost of forced moves), or other tasks (contention).
        let share_of = |f: &dyn Fn(&crate::analysis::summary::PreemptorProcess) -> bool| -> f64 {
            s.preemptor_processes
                .iter()
                .filter(|p| f(p))
                .map(|p| p.wait_share)
                .sum()
        };
        let idle_share = share_of(&|p| p.tgid == 0);
        let stopper_share = share_of(&|p| is_migration_stopper(&p.comm));
        let runq = t.time.runq_wait_ns as f64;
        let others = if s.preemptor_processes.is_empty() {
            runq
        } else {
            runq * (1.0 - idle_share - stopper_share)
        };
        let migration_ns = c.migration_ns as f64 * scale;
        // A handoff (behind the thread it exchanges work with, until that one blocked) is
        // charged to that thread like any wait, but the waiter was waiting for its part of
        // the work: no CPU was wanted and denied.
        let handoff_ns = c.handoff_ns as f64 * scale;
        // Waits after a forced move are charged to whoever ran on the new CPU; they count as
        // migrations, not contention. Waits the cgroup's quota held while other tasks ran are
        // charged to those tasks; they count as throttling.
        // (Of what the kernel charged to other tasks, not to the idle task: a throttled wait's
        // idle stretches are already in `idle_ns`.)
        let charged = (others - migration_ns - handoff_ns).max(0.0);
        let held = (c.throttled_ns as f64 * scale).min(charged);
        // Within a quota period a throttled cgroup runs its quota and no more: a wait behind
        // another task in a period that ended throttled was made up for later in it
        // (requests/quota.rs follows this wait by wait). The window keeps no order of waits,
        // so the share of periods that ended throttled stands for the share of the waits
        // behind other tasks that the quota made up for.
        let made_up_ns = (charged - held) * throttled_period_share(s);
        Waits {
            wanted: ((t.time.oncpu_ns + t.time.runq_wait_ns) as f64 - handoff_ns).max(1.0),
            contention_ns: charged - held - made_up_ns,
            throttled_ns: held + made_up_ns,
            made_up_ns,
            idle_ns: runq * idle_share,
            migration_ns,
            stopper_ns: runq * stopper_share,
        }
    }
}

/// The share of the bandwidth periods (those the cgroup was active in) that ended throttled,
/// 0 when none did. Members in several cgroups: each thread's waits behind other tasks count
/// at its own cgroup's share (one throttled pod does not make another's contention its
/// quota's); a member no cgroup lists (it joined later) at 0.
fn throttled_period_share(s: &Summary) -> f64 {
    if !throttled(s) {
        return 0.0;
    }
    let share = |c: &crate::analysis::cgroup::CgroupSummary| c.throttled_share.clamp(0.0, 1.0);
    if s.cgroups.len() <= 1 {
        return s.cgroup.as_ref().map_or(0.0, share);
    }
    let of_pid = |pid: u32| {
        s.cgroups
            .iter()
            .find(|c| c.pids.contains(&pid))
            .map_or(0.0, share)
    };
    let (mut weighted, mut all) = (0.0, 0.0);
    for t in &s.threads {
        let ns = t.wait_classes.contention_ns as f64;
        weighted += ns * of_pid(t.pid);
        all += ns;
    }
    if all > 0.0 { weighted / all } else { 0.0 }
}

/// Contention, throttling, idle-CPU wakeups and forced moves, each over its threshold:
/// (ns lost, cause).
fn scheduling(s: &Summary, w: &Waits) -> Vec<(f64, Cause)> {
    let wanted = w.wanted;
    let mut lost = Vec::new();
    if w.contention_ns / wanted >= CONTENTION_MIN {
        lost.push((
            w.contention_ns,
            Cause::new(
                super::contention::mechanism(s),
                0.0,
                format!(
                    "{} of the time its threads wanted a CPU they waited for one behind other tasks ({} in all over {}){}",
                    pct(w.contention_ns / wanted, ""),
                    ms(w.contention_ns),
                    crate::units::dur(s.duration_ns),
                    super::contention::caused(s, "")
                ),
            ),
        ));
    }

    let throttle_ns = w.throttled_ns + if throttled(s) { w.idle_ns } else { 0.0 };
    if (throttled(s) || w.throttled_ns > 0.0) && throttle_ns / wanted >= THROTTLE_MIN {
        lost.push((
            throttle_ns,
            Cause::new(
                Mechanism::CgroupThrottling,
                0.0,
                format!(
                    "runnable while their cgroup was throttled for {} ({} of the wanted time): {} of it while other tasks ran, {} with the CPU idle{}; {}",
                    ms(throttle_ns),
                    pct(throttle_ns / wanted, ""),
                    ms(w.throttled_ns),
                    ms(throttle_ns - w.throttled_ns),
                    if w.made_up_ns > 0.0 {
                        format!(
                            "; {} of the waits behind other tasks put down to the quota, as the \
                             share of periods that ended throttled ({}): the quota made up \
                             for them later in the period",
                            ms(w.made_up_ns),
                            pct(throttled_period_share(s), "")
                        )
                    } else {
                        String::new()
                    },
                    throttle_evidence(s)
                ),
            ),
        ));
    }
    if !throttled(s) && w.idle_ns / wanted >= CONTENTION_MIN {
        lost.push((
            w.idle_ns,
            Cause::new(
                Mechanism::IdleCpuWakeup,
                0.0,
                format!(
                    "runnable while their CPU idled for {} ({} of the wanted time), with no cgroup throttling seen",
                    ms(w.idle_ns),
                    pct(w.idle_ns / wanted, "")
                ),
            ),
        ));
    }

    lost.extend(forced_moves(s, w));
    lost
}

/// Forced moves (migrated while waiting), at `MIGRATION_RATE_MIN` or more per busy thread a
/// second: the waits after them and behind the migration stopper.
fn forced_moves(s: &Summary, w: &Waits) -> Option<(f64, Cause)> {
    let t = &s.totals;
    let secs = (s.duration_ns as f64 / 1e9).max(1e-3);
    let busy = s
        .threads
        .iter()
        .filter(|th| th.totals.time.oncpu_ns as f64 >= BUSY_SHARE * s.duration_ns as f64)
        .count()
        .max(1) as f64;
    let forced_rate = t.wait_classes.migration_waits as f64 / secs / busy;
    if forced_rate < MIGRATION_RATE_MIN {
        return None;
    }
    let ns = w.migration_ns + w.stopper_ns;
    Some((
        ns.max(1.0),
        Cause::new(
            Mechanism::Migrations,
            0.0,
            format!(
                "{forced_rate:.0} forced moves per second per busy thread ({} migrations in all: {} same-LLC, {} cross-LLC, {} cross-NUMA); {} waiting after moves and behind the migration stopper",
                t.switches.migrations,
                t.migrations_same_llc + t.migrations_same_core,
                t.migrations_cross_llc,
                t.migrations_cross_numa,
                ms(ns)
            ),
        ),
    ))
}

/// A thread waiting in CUDA synchronization much of its busy time on a busy GPU.
fn gpu_wait(s: &Summary) -> Option<(f64, Cause)> {
    let u = target_gpu_util(s)?;
    if u < GPU_BUSY_PCT || s.cuda.max_thread_sync_busy_share < GPU_SYNC_MIN {
        return None;
    }
    Some((
        s.cuda.sync_ns as f64,
        Cause::new(
            gpu_mechanism(s, None),
            0.0,
            format!(
                "GPU {u:.0}% busy; a thread spent {} of its busy time waiting in CUDA synchronization ({} calls, {} in all)",
                pct(s.cuda.max_thread_sync_busy_share, ""),
                s.cuda.sync_calls,
                ms(s.cuda.sync_ns as f64)
            ),
        ),
    ))
}

/// Time lost to cache misses, estimated per busy thread from its counter bins: in bins where
/// its MPKI is at least twice its median, the cycles beyond what its median IPC would have
/// needed.
fn cache_loss(s: &Summary) -> Option<(f64, String)> {
    if !s.capabilities.pmu.llc_available {
        return None;
    }
    let (mut lost_ns, mut elevated, mut bins_all) = (0.0, 0usize, 0usize);
    let (mut worst_ratio, mut worst) = (0.0f64, String::new());
    for th in &s.threads {
        let bins: Vec<(f64, f64, u64)> = th
            .counter_bins
            .iter()
            .filter_map(|b| Some((b.values.mpki?, b.values.ipc?, b.values.cycles?)))
            .collect();
        if bins.len() < 10 {
            continue;
        }
        let mut m: Vec<f64> = bins.iter().map(|b| b.0).collect();
        m.sort_by(f64::total_cmp);
        let median_mpki = m[m.len() / 2];
        let mut ipcs: Vec<f64> = bins.iter().map(|b| b.1).collect();
        ipcs.sort_by(f64::total_cmp);
        let median_ipc = ipcs[ipcs.len() / 2];
        let hot: Vec<&(f64, f64, u64)> = bins
            .iter()
            .filter(|b| b.0 >= 1.0 && b.0 >= MPKI_ELEVATION * median_mpki)
            .collect();
        bins_all += bins.len();
        elevated += hot.len();
        if (hot.len() as f64) < MPKI_ELEVATED_BINS_MIN * bins.len() as f64 {
            continue;
        }
        // ns per cycle of this thread, from its on-CPU time.
        let cycles: u64 = bins.iter().map(|b| b.2).sum();
        let ns_per_cycle = th.totals.time.oncpu_ns as f64 / cycles.max(1) as f64;
        for b in &hot {
            if median_ipc > 0.0 && b.1 < median_ipc {
                lost_ns += b.2 as f64 * (1.0 - b.1 / median_ipc) * ns_per_cycle;
            }
        }
        let hot_mpki = hot.iter().map(|b| b.0).sum::<f64>() / hot.len() as f64;
        if hot_mpki / median_mpki.max(1e-3) > worst_ratio {
            worst_ratio = hot_mpki / median_mpki.max(1e-3);
            worst = format!(
                "{} ({}): {hot_mpki:.1} MPKI in its worst bins vs {median_mpki:.1} median",
                printable(&th.comm),
                th.tid
            );
        }
    }
    let wanted = (s.totals.time.oncpu_ns + s.totals.time.runq_wait_ns).max(1) as f64;
    (lost_ns / wanted >= 0.05).then(|| {
        (
            lost_ns,
            format!(
                "MPKI at least {MPKI_ELEVATION}x the thread's median in {elevated} of {bins_all} bins; {worst}; about {} of on-CPU time lost to the misses",
                ms(lost_ns)
            ),
        )
    })
}

/// What bounds throughput, by the rules of thumb: a busy GPU with few LLC misses is GPU-bound;
/// many LLC misses with an idle GPU is memory-bound; a busy CPU thread with an idle GPU is
/// host-bound.
pub fn bound(s: &Summary) -> Option<String> {
    let util = target_gpu_util(s)?;
    let mpki = s.counters.totals.mpki;
    let busiest = s
        .threads
        .iter()
        .max_by_key(|t| t.totals.time.oncpu_ns)
        .map(|t| {
            (
                printable(&t.comm).into_owned(),
                t.totals.time.oncpu_ns as f64 / s.duration_ns.max(1) as f64,
            )
        });
    if util >= GPU_BUSY_PCT && mpki.is_none_or(|m| m < 10.0) {
        return Some(format!("GPU-bound: the GPU was {util:.0}% busy"));
    }
    if util < 30.0 {
        if let Some(m) = mpki
            && m >= 10.0
        {
            return Some(format!(
                "memory-bound on the host: {m:.1} LLC MPKI with the GPU {util:.0}% busy"
            ));
        }
        if let Some((comm, share)) = busiest
            && share >= 0.8
        {
            return Some(format!(
                "host-bound: {comm} was on a CPU {} of the time while the GPU was {util:.0}% busy",
                pct(share, "")
            ));
        }
    }
    None
}
