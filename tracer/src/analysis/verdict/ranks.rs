//! The late rank of a tensor-parallel service (analysis/ranks.rs) in the verdict. Its peers'
//! GPUs spin in the collective while they wait for it and look busy to NVML: GPU causes
//! placed in a peer are that waiting, not saturation, and go. The late rank's own cause leads:
//! a cause the other rules found in it, of the same category, with the peers' waiting added to
//! its evidence; else a `late_rank` cause of its own.

use super::{
    mechanism::{Mechanism, Primary},
    model::Cause,
    placement::ActsIn,
};
use crate::analysis::{ranks::LateCause, summary::Summary};

pub fn apply(s: &Summary, mut causes: Vec<Cause>) -> Vec<Cause> {
    let Some(r) = s.ranks.as_ref() else {
        return causes;
    };
    let Some(late) = r.straggler.as_ref() else {
        return causes;
    };
    let peers: Vec<u32> = r
        .ranks
        .iter()
        .map(|r| r.pid)
        .filter(|p| *p != late.pid)
        .collect();
    causes.retain(|c| {
        let spinning = c.cause() == Primary::GpuSaturation
            && c.acts_in.as_ref().is_some_and(|a| peers.contains(&a.pid));
        !spinning
    });
    let mechanism = Mechanism::LateRank {
        pid: late.pid,
        gpus: late.gpus.clone(),
        own_cause: late.cause,
        peers_waited_ns: late.peers_waited_ns,
        steps: late.steps,
    };
    let family = mechanism.cause();
    let text = format!("{mechanism}; {}", late.evidence);
    let found = causes.iter().position(|c| {
        family != Primary::LateRank
            && late.cause != LateCause::NotMeasured
            && c.cause() == family
            && c.acts_in.as_ref().is_some_and(|a| a.pid == late.pid)
    });
    let lead = match found {
        Some(i) => {
            let mut c = causes.remove(i);
            c.evidence = format!("{}; {text}", c.evidence);
            c
        }
        None => {
            // A share of the time lost: the peers' waiting beside what the other causes took.
            let others: f64 = causes.iter().map(|c| c.attributed_ns).sum();
            let waited = late.peers_waited_ns as f64;
            let share = waited / (waited + others).max(1.0);
            for c in &mut causes {
                c.share *= 1.0 - share;
            }
            let mut c = Cause::new(mechanism, share, late.evidence.clone());
            c.attributed_ns = waited;
            c.acts_in = s.process(late.pid).map(|p| ActsIn {
                pid: p.pid,
                role: p.role.clone(),
                comm: p.comm.clone(),
                share: 1.0,
                shown_pid: s.shown_id(p.pid),
            });
            c
        }
    };
    causes.insert(0, lead);
    causes
}
