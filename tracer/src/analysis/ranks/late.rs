//! Which rank is late, if any: by the waiting (the one that waits least while its peers wait
//! clearly more, and its own cause), else by its GPU (the only one other processes shared).
//! The thresholds are ranks.rs's constants; the rules in docs/ATTRIBUTION.md. Pure.

use super::{
    FoundBy, LateCause, MIN_CAUSE_SHARE, MIN_FOREIGN_SM_PCT, MIN_PEER_EXCESS, MIN_PEER_RATIO, Rank,
    Straggler,
};
use crate::units::dur;

/// The late rank, if the ranks can be compared, and why (or why not) in words.
pub(super) fn judge(ranks: &[Rank], window_ns: u64) -> (Option<Straggler>, String) {
    let calls: Vec<u64> = ranks.iter().map(|r| r.sync_calls).collect();
    let (lo, hi) = (
        calls.iter().copied().min().unwrap_or(0),
        calls.iter().copied().max().unwrap_or(0),
    );
    // Ranks that meet in the same collectives synchronize about as often; a rank that does
    // not (it polls, or waits in a host-side collective) would wait least for no fault of its.
    if lo == 0 || (hi - lo) * 10 > hi {
        return (
            None,
            format!(
                "not assessed: the ranks made {lo} to {hi} synchronizing calls, not about as \
                 many (10 %): they do not all wait for their collectives in synchronize (a \
                 host-side collective, polling, or ranks of different jobs)"
            ),
        );
    }
    if let Some(late) = late_by_waiting(ranks, window_ns) {
        return (
            Some(late),
            "the rank that waited least, its peers clearly more".into(),
        );
    }
    if let Some(late) = late_by_gpu(ranks) {
        return (
            Some(late),
            "the ranks waited alike, and only the late one's GPU was shared".into(),
        );
    }
    let w: Vec<u64> = ranks.iter().map(|r| r.waiting_ns).collect();
    (
        None,
        format!(
            "no late rank: the ranks waited {} to {}, under the {:.0} % of the window (and \
             10 ms) and {MIN_PEER_RATIO}x apart that name one",
            dur(w.iter().copied().min().unwrap_or(0)),
            dur(w.iter().copied().max().unwrap_or(0)),
            MIN_PEER_EXCESS * 100.0
        ),
    )
}

fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    match v.len() {
        0 => 0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2,
    }
}

/// The rank that waits least, when its peers wait clearly more (`MIN_PEER_EXCESS`,
/// `MIN_PEER_RATIO`).
pub(super) fn late_by_waiting(ranks: &[Rank], window_ns: u64) -> Option<Straggler> {
    let late = ranks.iter().min_by_key(|r| (r.waiting_ns, r.pid))?;
    let peers: Vec<&Rank> = ranks.iter().filter(|r| r.pid != late.pid).collect();
    let peer_wait = median(peers.iter().map(|r| r.waiting_ns).collect());
    let excess = peer_wait.saturating_sub(late.waiting_ns);
    let floor = (MIN_PEER_EXCESS * window_ns as f64).max(10e6);
    if (excess as f64) < floor || (peer_wait as f64) < MIN_PEER_RATIO * late.waiting_ns as f64 {
        return None;
    }
    let peer = |f: fn(&Rank) -> u64| median(peers.iter().map(|r| f(r)).collect());
    // Blocked time a rank did not end: sleeps, I/O, locks, and a synchronize that blocks
    // rather than spins (which of the two cannot be told here; the late rank waits least in
    // synchronize, so its excess is not that).
    let off_cpu = |r: &Rank| r.blocked_ns.saturating_sub(r.blocked_by_ranks_ns);
    // On-CPU time as it is: peers that spin in synchronize are on a CPU meanwhile, so their
    // host work cannot be told from their waiting; compared as it is, host work is only named
    // where the late rank was on a CPU more than spinning peers were.
    let host = |r: &Rank| r.oncpu_ns;
    let parts: [(LateCause, u64, u64); 4] = [
        (
            LateCause::RunQueue,
            late.runq_wait_ns,
            peer(|r| r.runq_wait_ns),
        ),
        (LateCause::GcPause, late.gc_ns, peer(|r| r.gc_ns)),
        (LateCause::OffCpu, off_cpu(late), peer(off_cpu)),
        (LateCause::HostWork, host(late), peer(host)),
    ];
    let (cause, own, theirs) = parts
        .iter()
        .copied()
        .max_by_key(|(_, own, theirs)| own.saturating_sub(*theirs))?;
    let more = own.saturating_sub(theirs);
    let (cause, cause_ns, evidence) = if (more as f64) >= MIN_CAUSE_SHARE * excess as f64 {
        let what = match cause {
            LateCause::RunQueue => "run-queue waits",
            LateCause::GcPause => "garbage collections",
            LateCause::OffCpu => "off-CPU waits not ended by a rank",
            _ => "on-CPU time",
        };
        (
            cause,
            more,
            format!("{what} {} against {} for its peers", dur(own), dur(theirs)),
        )
    } else if let Some(g) = gpu_side(late, &peers) {
        g
    } else {
        (
            LateCause::NotMeasured,
            0,
            "no measured part of its time exceeds its peers' by enough to explain it".into(),
        )
    };
    Some(Straggler {
        pid: late.pid,
        gpus: late.gpus.clone(),
        found_by: FoundBy::Waiting,
        peers_waited_ns: excess,
        sync_calls: late.sync_calls,
        cause,
        cause_ns,
        evidence,
    })
}

/// The late rank's GPU side: other processes on its GPU, or its clocks held down, where its
/// peers' GPUs had neither.
fn gpu_side(late: &Rank, peers: &[&Rank]) -> Option<(LateCause, u64, String)> {
    if let Some(f) = foreign_pct(late).filter(|f| *f >= MIN_FOREIGN_SM_PCT)
        && peers
            .iter()
            .all(|p| foreign_pct(p).is_none_or(|x| x < f / 2.0))
    {
        return Some((
            LateCause::GpuShared,
            0,
            format!(
                "its GPU {}% busy, {:.0} points of it other processes' kernels ({})",
                late.gpu_busy_pct.unwrap_or(0.0).round(),
                f,
                pids(&late.shown_others)
            ),
        ));
    }
    let held = late.clocks_held_ns;
    (held > 0 && peers.iter().all(|p| p.clocks_held_ns * 2 < held)).then(|| {
        (
            LateCause::ClocksHeld,
            held,
            format!(
                "its GPU's clocks held down for {} (NVML violation counters)",
                dur(held)
            ),
        )
    })
}

/// The busy share of a rank's GPU not from its own kernels, where other processes hold a
/// context on it and NVML gave both figures (without the rank's own per-process samples, an
/// idle process holding a context would look as busy as the GPU).
fn foreign_pct(r: &Rank) -> Option<f64> {
    if r.others_on_gpu.is_empty() {
        return None;
    }
    Some((r.gpu_busy_pct? - r.own_sm_pct?).max(0.0))
}

/// When every rank waits about as long (a slow GPU holds every step up for all of them, its
/// own rank included), the rank whose GPU other processes share, if only its GPU is shared.
pub(super) fn late_by_gpu(ranks: &[Rank]) -> Option<Straggler> {
    let (late, f) = ranks
        .iter()
        .filter_map(|r| foreign_pct(r).map(|f| (r, f)))
        .max_by(|a, b| a.1.total_cmp(&b.1))?;
    if f < MIN_FOREIGN_SM_PCT
        || ranks
            .iter()
            .any(|r| r.pid != late.pid && !r.others_on_gpu.is_empty())
    {
        return None;
    }
    let peers: Vec<&Rank> = ranks.iter().filter(|r| r.pid != late.pid).collect();
    // Every rank waited for that GPU, its own rank too: the peers' waiting is all of it.
    let waited = median(peers.iter().map(|r| r.waiting_ns).collect());
    if waited == 0 {
        return None;
    }
    let (cause, cause_ns, evidence) = gpu_side(late, &peers)?;
    Some(Straggler {
        pid: late.pid,
        gpus: late.gpus.clone(),
        found_by: FoundBy::SharedGpu,
        peers_waited_ns: waited,
        sync_calls: late.sync_calls,
        cause,
        cause_ns,
        evidence,
    })
}

fn pids(p: &[String]) -> String {
    let named: Vec<String> = p.iter().take(4).map(|p| format!("PID {p}")).collect();
    named.join(", ") + if p.len() > 4 { ", ..." } else { "" }
}
