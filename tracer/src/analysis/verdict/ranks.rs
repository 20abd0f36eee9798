//! The late rank of a tensor-parallel service (analysis/ranks.rs) in the verdict. Its peers'
//! GPUs spin in the collective while they wait for it and look busy to NVML: the GPU causes
//! the service's own work explains (saturation, synchronize stalls, longer GPU work) placed in
//! a peer are that waiting, and their share goes to the late rank; GPU causes that name other
//! processes or clock policies stay. The late rank's cause: one the other rules found in it,
//! of the same category, with the peers' waiting added to its evidence; else a `late_rank`
//! cause of its own.

use super::{
    mechanism::{Mechanism, Primary},
    model::{Basis, Cause},
    placement::ActsIn,
};
use crate::analysis::{ranks::LateCause, summary::Summary};

/// A GPU cause that waiting in a collective looks like, in a rank that waited.
fn spinning(m: &Mechanism) -> bool {
    matches!(
        m,
        Mechanism::SmSaturation { .. }
            | Mechanism::SyncStalls { .. }
            | Mechanism::LongerGpuWork { .. }
    )
}

pub fn apply(s: &Summary, basis: Basis, mut causes: Vec<Cause>) -> Vec<Cause> {
    let Some(r) = s.ranks.as_ref() else {
        return causes;
    };
    let Some(late) = r.straggler.as_ref() else {
        return causes;
    };
    // Requests without jitter: nothing to explain, whatever the ranks did.
    if s.requests.as_ref().is_some_and(|q| !q.jitter) {
        return causes;
    }
    let peers: Vec<u32> = r
        .ranks
        .iter()
        .map(|r| r.pid)
        .filter(|p| *p != late.pid)
        .collect();
    let (mut moved_share, mut moved_ns) = (0.0, 0.0);
    causes.retain(|c| {
        let keep =
            !(spinning(&c.mechanism) && c.acts_in.as_ref().is_some_and(|a| peers.contains(&a.pid)));
        if !keep {
            moved_share += c.share;
            moved_ns += c.attributed_ns;
        }
        keep
    });
    let mechanism = Mechanism::LateRank {
        pid: late.pid,
        gpus: late.gpus.clone(),
        own_cause: late.cause,
        found_by: late.found_by,
        peers_waited_ns: late.peers_waited_ns,
        sync_calls: late.sync_calls,
    };
    let family = mechanism.cause();
    let found = causes.iter().position(|c| {
        family != Primary::LateRank
            && late.cause != LateCause::NotMeasured
            && c.cause() == family
            && c.acts_in.as_ref().is_some_and(|a| a.pid == late.pid)
    });
    if let Some(i) = found {
        let c = &mut causes[i];
        c.evidence = format!("{}; {mechanism}; {}", c.evidence, late.evidence);
        c.share += moved_share;
        c.attributed_ns += moved_ns;
    } else {
        let (share, attributed) = match basis {
            // Over the window the peers' waiting is time lost beside the other causes' own:
            // the shares are recomputed over both (each cause's time stays what it was).
            Basis::LostTime => {
                let others: f64 = causes.iter().map(|c| c.attributed_ns).sum();
                let waited = late.peers_waited_ns as f64;
                let share = waited / (waited + others).max(1.0);
                for c in &mut causes {
                    c.share *= 1.0 - share;
                }
                (share, waited)
            }
            // Of the tail's excess, what the peers' GPU causes had taken: the waiting in the
            // collective they stood for. Nothing moved, no share of the tail is claimed.
            Basis::TailExcess => (moved_share, moved_ns),
        };
        let mut c = Cause::new(mechanism, share, late.evidence.clone());
        c.attributed_ns = attributed;
        // Ranks are processes of the summary, so the member is always found.
        c.acts_in = Some(ActsIn::of(s, late.pid, 1.0));
        if share > 0.0 {
            causes.push(c);
        }
    }
    causes.sort_by(|a, b| b.share.total_cmp(&a.share));
    causes
}
