//! What each mechanism is in words, and what to do about it: the text of the verdict. Apart
//! from `mechanism.rs`, which holds the mechanisms' data, category and stable ids, so that the
//! rules and the schema read without the prose. `fmt` is one match arm per mechanism, the same
//! order as the enum.

use std::fmt;

use super::mechanism::{ClockCap, ClocksHeld, Contender, Mechanism};
use crate::analysis::{
    neighbours::NeighbourKind,
    ranks::{FoundBy, LateCause},
};

pub(super) const OWN: &str =
    "Run fewer busy threads than the CPUs the server has (thread pools, OMP_NUM_THREADS).";
pub(super) const OTHERS: &str =
    "Give the server CPUs of its own (cpuset, taskset) or move the other work off them.";
pub(super) const CHILDREN: &str = "Its own child processes took the CPUs: trace them (-p each), and give \
                        them CPUs apart from the server's or fewer workers.";

impl Mechanism {
    /// What to do about it.
    pub fn advice(&self) -> String {
        let s = match self {
            Self::RunQueueContention { by } => return contention_advice(by),
            Self::CgroupThrottling => {
                "Raise the cgroup's CPU quota (cpu.max, cpu.cfs_quota_us) above the server's peak use, or lift it."
            }
            Self::IdleCpuWakeup => {
                "Idle CPUs are slow to wake (deep C-states, or a VM's vCPU descheduled): limit C-states or keep the CPUs polling."
            }
            Self::Migrations => {
                "Pin the server's threads (taskset, cpuset) and find what keeps changing their affinity or rebalancing them."
            }
            Self::LlcMisses => {
                "Something evicts the server's cache: move the neighbour off its LLC, or partition the LLC (resctrl/CAT)."
            }
            Self::LongerOncpu { llc_measured: true } => {
                "Profile the slow requests' code paths (perf record) and check CPU frequency and steal time."
            }
            Self::LongerOncpu {
                llc_measured: false,
            } => {
                "Run where a PMU is available (bare metal, or a VM with PMU passthrough) to measure LLC misses."
            }
            Self::SmSaturationByOthers { .. } => {
                "Other processes share the GPU: give the server a GPU (or a MIG slice) of its own, or schedule the other work elsewhere."
            }
            Self::SmSaturation { .. } => {
                "The GPU is at capacity: smaller batches or fewer concurrent streams per GPU, or more GPUs."
            }
            Self::SyncStalls { .. } => {
                "Wait for the request's own work only (synchronize its stream or an event, not the device), or move the background GPU work to another stream priority or GPU."
            }
            Self::LongerGpuWork { .. } => {
                "The slow requests do more GPU work: look at their inputs (sequence length, batch) and kernels (nsys on a sample)."
            }
            Self::LockWait { gil: true, .. } => {
                "The GIL serializes the process's Python threads: move the CPU-bound work out of the serving process (a process pool, a C extension that releases the GIL), or onto a free-threaded build."
            }
            Self::LockWait { gil: false, .. } => {
                "Shorten what the holder does under the lock (or split the lock); if the holder is a worker the serving thread hands work to, that work's time is the wait."
            }
            Self::GcPause { .. } => {
                "Call gc.freeze() after warm-up so the long-lived heap is not scanned again, raise the thresholds (gc.set_threshold), or collect between requests (gc.disable() with gc.collect() when idle)."
            }
            Self::LaunchOverhead { .. } => {
                "The CPU paces the GPU: capture the step in a CUDA graph (torch.compile mode=\"reduce-overhead\", vLLM's cudagraphs), fuse kernels, move Python work off the serving thread, or use a faster CPU."
            }
            Self::ClockThrottle { .. } => {
                "The GPU's clocks were held down: check its power limit (nvidia-smi -q -d POWER), cooling and application clocks."
            }
            Self::LongRequestOnServingThread { .. } => {
                "Move the long work off the serving thread or event loop (tokenization in a thread or process pool, chunked prefill), or cap the input size, so one long request does not hold up the ones behind it."
            }
            Self::Queueing => {
                "Requests arrive faster than one thread serves them at times: add workers, or remove what slows the earlier requests (the causes above)."
            }
            Self::OtherBlocked => {
                "Look at what the serving thread blocks on (off-CPU profile: offcputime, perf sched)."
            }
            Self::Uncovered => {
                "Events were lost or the serving thread was not traced: enlarge --ring-kib."
            }
            Self::LateRank { own_cause, .. } => late_rank_advice(*own_cause),
        };
        s.into()
    }
}

/// What to do about a late rank, by what made it late.
fn late_rank_advice(own_cause: LateCause) -> &'static str {
    match own_cause {
        LateCause::RunQueue => {
            "Give each rank CPUs of its own (cpuset, taskset) and keep other work off them: every rank waits for the one that waits for a CPU."
        }
        LateCause::GcPause => {
            "Call gc.freeze() after warm-up in every rank, or collect in all ranks at the same step (gc.disable() with gc.collect() every N steps), so one rank's collection does not stall the others."
        }
        LateCause::OffCpu => {
            "Find what the late rank's thread blocks on in its step (the held-up-by pairs list its wakers): a sleep, I/O or a lock there holds every rank up."
        }
        LateCause::HostWork => {
            "The late rank does more host work per step than its peers: profile it (py-spy, perf record) and even out the work (its own inputs, logging, a rank-0-only task)."
        }
        LateCause::GpuShared => {
            "Move the other processes off the late rank's GPU: every rank waits for the slowest GPU."
        }
        LateCause::ClocksHeld => {
            "The late rank's GPU had its clocks held down: check its power limit and cooling (nvidia-smi -q -d POWER,PERFORMANCE)."
        }
        LateCause::NotMeasured => {
            "Nothing measured explains why the rank is late: look at its timeline (--perfetto) around the steps its peers waited on."
        }
    }
}

/// The advice for each side named, once each.
fn contention_advice(by: &[Contender]) -> String {
    let of = |c: &Contender| match c.kind {
        NeighbourKind::Target => OWN,
        NeighbourKind::Children => CHILDREN,
        _ => OTHERS,
    };
    match by {
        [a, b, ..] if of(a) != of(b) => format!("{} {}", of(a), of(b)),
        [a, ..] => of(a).into(),
        [] => OTHERS.into(),
    }
}

/// The text for people: the JSON's `mechanism`. The longer arms are functions of their own
/// below, in the same order.
impl fmt::Display for Mechanism {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let busy = |u: &Option<f64>| u.map(|u| format!("GPU {u:.0}% busy"));
        match self {
            Self::RunQueueContention { by } => run_queue_contention(f, by),
            Self::CgroupThrottling => write!(f, "cgroup CPU throttling"),
            Self::IdleCpuWakeup => write!(f, "wakeup latency of idle CPUs"),
            Self::Migrations => write!(f, "migrations"),
            Self::LlcMisses => write!(f, "LLC misses"),
            Self::LongerOncpu { llc_measured: true } => {
                write!(f, "longer on-CPU time, cache misses unchanged")
            }
            Self::LongerOncpu {
                llc_measured: false,
            } => write!(f, "longer on-CPU time (cache misses not measured)"),
            Self::SmSaturationByOthers {
                gpu_busy_pct: u,
                own_sm_pct: o,
            } => write!(
                f,
                "SM saturation by other processes (GPU {u:.0}% busy, {o:.0}% of it the server's kernels)"
            ),
            Self::SmSaturation {
                gpu_busy_pct,
                clocks_held,
            } => sm_saturation(f, *gpu_busy_pct, clocks_held.as_ref()),
            Self::SyncStalls { gpu_busy_pct } => write!(
                f,
                "synchronization stalls: device-wide synchronize waits for all the process's \
                 queued GPU work{}",
                busy(gpu_busy_pct).map_or(String::new(), |b| format!(" ({b})"))
            ),
            Self::LongerGpuWork {
                gpu_busy_pct: Some(u),
            } => write!(f, "longer GPU work per request (GPU {u:.0}% busy)"),
            Self::LongerGpuWork { gpu_busy_pct: None } => {
                write!(f, "longer waits for the GPU (GPU not sampled)")
            }
            Self::LockWait { holders, gil } => {
                let what = if *gil { "the GIL" } else { "a lock" };
                write!(f, "waiting for {what}")?;
                let named = holders.iter().take(2).map(|h| {
                    format!(
                        "thread {} ({}, PID {}: {} of the wait)",
                        h.tid,
                        crate::recording::printable(&h.comm),
                        h.pid,
                        crate::units::pct(h.share)
                    )
                });
                listed(f, " held by ", named, " and ", "")
            }
            Self::GcPause {
                collections,
                longest_ns,
                generation,
            } => write!(
                f,
                "garbage-collection pauses ({collections} collections, the longest {}{})",
                crate::units::dur(*longest_ns),
                generation.map_or(String::new(), |g| format!(", generation {g}"))
            ),
            Self::LaunchOverhead {
                oncpu_share,
                oncpu_of_requests,
                launches_per_s,
                gpu_idle_pct,
            } => write!(
                f,
                "kernel-launch/Python overhead: the serving thread on its CPU {} of {} \
                 outside CUDA waits, {launches_per_s:.0} launches/s, the GPU idle \
                 {gpu_idle_pct:.0}% of the time",
                crate::units::pct(*oncpu_share),
                if *oncpu_of_requests {
                    "its requests' time"
                } else {
                    "the window"
                }
            ),
            Self::ClockThrottle { policies } => {
                write!(f, "GPU clocks held down")?;
                let named = policies.iter().take(2).map(|p| {
                    format!(
                        "by {} {} of the window",
                        p.policy,
                        crate::units::pct(p.share)
                    )
                });
                listed(f, " (", named, ", ", ")")
            }
            Self::LongRequestOnServingThread { requests } => {
                write!(f, "long requests on the serving thread")?;
                listed(
                    f,
                    ": ",
                    requests.iter().take(3).map(|r| r.to_string()),
                    ", ",
                    "",
                )
            }
            Self::Queueing => write!(f, "queueing behind earlier requests"),
            Self::OtherBlocked => write!(f, "other off-CPU waits (locks, I/O, sleeps)"),
            Self::Uncovered => write!(f, "time the timeline does not cover"),
            Self::LateRank {
                gpus,
                own_cause,
                found_by,
                peers_waited_ns,
                sync_calls,
                ..
            } => late_rank(
                f,
                gpus,
                *own_cause,
                *found_by,
                *peers_waited_ns,
                *sync_calls,
            ),
        }
    }
}

/// `items` joined by `sep` between `open` and `close`; nothing at all when there are none.
fn listed(
    f: &mut fmt::Formatter<'_>,
    open: &str,
    items: impl Iterator<Item = String>,
    sep: &str,
    close: &str,
) -> fmt::Result {
    let items: Vec<String> = items.collect();
    if items.is_empty() {
        return Ok(());
    }
    write!(f, "{open}{}{close}", items.join(sep))
}

fn run_queue_contention(f: &mut fmt::Formatter<'_>, by: &[Contender]) -> fmt::Result {
    match by {
        [] => write!(f, "run-queue contention"),
        [a] if a.kind == NeighbourKind::Target && a.members.is_empty() => {
            write!(f, "run-queue contention among its own threads")
        }
        [a] if a.kind == NeighbourKind::Target => {
            write!(
                f,
                "run-queue contention within the service: preempted by {a}"
            )
        }
        [a] => write!(f, "run-queue contention: preempted by {a}"),
        [a, b, ..] => write!(
            f,
            "run-queue contention: preempted by {a} ({} of the waiting) and {b} ({})",
            crate::units::pct(a.wait_share),
            crate::units::pct(b.wait_share)
        ),
    }
}

fn sm_saturation(
    f: &mut fmt::Formatter<'_>,
    busy_pct: f64,
    clocks_held: Option<&ClocksHeld>,
) -> fmt::Result {
    write!(f, "SM saturation (GPU {busy_pct:.0}% busy")?;
    if let Some(c) = clocks_held {
        let why = match c.by {
            ClockCap::PowerCap => "the power cap",
            ClockCap::Thermal => "thermal slowdown",
        };
        match (c.sm_clock_mhz, c.sm_clock_mhz_min) {
            (Some(mean), Some(min)) => write!(
                f,
                "; SM clock held down by {why}: {mean:.0} MHz mean, {min} MHz min"
            )?,
            _ => write!(f, "; clocks held down by {why}")?,
        }
    }
    write!(f, ")")
}

fn late_rank(
    f: &mut fmt::Formatter<'_>,
    gpus: &[u32],
    own_cause: LateCause,
    found_by: FoundBy,
    peers_waited_ns: u64,
    sync_calls: u64,
) -> fmt::Result {
    let what = match own_cause {
        LateCause::RunQueue => "waiting for a CPU",
        LateCause::GcPause => "its garbage collections",
        LateCause::OffCpu => "off-CPU waits",
        LateCause::HostWork => "more host work than its peers",
        LateCause::GpuShared => "its GPU shared with other processes",
        LateCause::ClocksHeld => "its GPU's clocks held down",
        LateCause::NotMeasured => "a reason not measured",
    };
    let gpu = match gpus {
        [] => "a rank".to_string(),
        [g] => format!("the rank on GPU {g}"),
        many => format!(
            "the rank on GPUs {}",
            many.iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let waited = crate::units::dur(peers_waited_ns);
    match found_by {
        FoundBy::Waiting => write!(
            f,
            "{gpu} late, by {what}: the other ranks waited {waited} more than it did \
             in synchronizing calls"
        )?,
        FoundBy::SharedGpu => write!(
            f,
            "{gpu} late, by {what}: the other ranks waited {waited} in \
             synchronizing calls, every step held to the slowest GPU"
        )?,
    }
    if let Some(per_call) = peers_waited_ns.checked_div(sync_calls) {
        write!(
            f,
            " ({} per call over {sync_calls})",
            crate::units::dur(per_call)
        )?;
    }
    Ok(())
}

/// "stress-ng-cpu (2 processes: PIDs 11, 12)", "its own threads", "cgroup /docker/x.scope (3
/// processes)".
impl fmt::Display for Contender {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = crate::recording::printable(&self.name);
        // "2 processes: PIDs 11, 12", "1 process: PID 11".
        let listed = || {
            let mut v = self.shown_pids.clone();
            if self.process_count > v.len() as u64 {
                v.push("...".into());
            }
            match self.process_count {
                1 => format!("1 process: PID {}", v.join(", ")),
                c => format!("{c} processes: PIDs {}", v.join(", ")),
            }
        };
        match self.kind {
            NeighbourKind::Target if self.members.is_empty() => write!(f, "its own threads"),
            NeighbourKind::Target => {
                write!(f, "the service itself: {}", self.members.join(", "))?;
                if self.process_count > self.members.len() as u64 {
                    write!(f, ", ...")?;
                }
                Ok(())
            }
            NeighbourKind::Children => write!(
                f,
                "its own child processes, which were not traced ({})",
                listed()
            ),
            NeighbourKind::Cgroup if self.process_count == 1 => {
                write!(f, "cgroup {name} (1 process)")
            }
            NeighbourKind::Cgroup => write!(f, "cgroup {name} ({} processes)", self.process_count),
            _ if self.process_count == 1 => write!(
                f,
                "{name} (PID {})",
                self.shown_pids.first().map_or("?", String::as_str)
            ),
            _ => write!(f, "{name} ({})", listed()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::verdict::mechanism::{ClockViolation, Holder};

    #[test]
    fn lists_name_at_most_their_first_items_and_vanish_when_empty() {
        let holder = |tid, share| Holder {
            tid,
            pid: 7,
            comm: "python3".into(),
            share,
        };
        let lock = Mechanism::LockWait {
            holders: vec![holder(8, 0.75), holder(9, 0.2), holder(10, 0.05)],
            gil: true,
        };
        assert_eq!(
            lock.to_string(),
            "waiting for the GIL held by thread 8 (python3, PID 7: 75% of the wait) and \
             thread 9 (python3, PID 7: 20% of the wait)"
        );
        let nobody = Mechanism::LockWait {
            holders: vec![],
            gil: false,
        };
        assert_eq!(nobody.to_string(), "waiting for a lock");
        let clocks = Mechanism::ClockThrottle {
            policies: vec![ClockViolation {
                gpu: 0,
                policy: "power".into(),
                ns: 1,
                share: 0.5,
            }],
        };
        assert_eq!(
            clocks.to_string(),
            "GPU clocks held down (by power 50% of the window)"
        );
        let held = Mechanism::SmSaturation {
            gpu_busy_pct: 99.4,
            clocks_held: Some(ClocksHeld {
                by: ClockCap::Thermal,
                sm_clock_mhz: Some(1500.4),
                sm_clock_mhz_min: Some(1200),
            }),
        };
        assert_eq!(
            held.to_string(),
            "SM saturation (GPU 99% busy; SM clock held down by thermal slowdown: 1500 MHz \
             mean, 1200 MHz min)"
        );
    }

    #[test]
    fn a_late_rank_says_which_gpus_and_what_each_call_waited() {
        let late = Mechanism::LateRank {
            pid: 1,
            gpus: vec![2, 3],
            own_cause: LateCause::GcPause,
            found_by: FoundBy::Waiting,
            peers_waited_ns: 40_000_000,
            sync_calls: 4,
        };
        assert_eq!(
            late.to_string(),
            "the rank on GPUs 2, 3 late, by its garbage collections: the other ranks waited \
             40.0ms more than it did in synchronizing calls (10.0ms per call over 4)"
        );
        assert!(
            late.advice()
                .starts_with("Call gc.freeze() after warm-up in every rank")
        );
    }
}
