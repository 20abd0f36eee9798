//! The interrupt marks (tracer-ebpf `irq.rs`): programs on the entry and exit of device
//! interrupt handlers and timer callbacks, so that `sched_waking` knows a wakeup made in one
//! is no task's doing. Raw tracepoints: the same on every kernel the tracer runs on, with or
//! without BTF, and no record copied.

use anyhow::{Context as _, Result};
use aya::{
    Ebpf,
    programs::{RawTracePoint, raw_trace_point::RawTracePointLink},
};

/// Program and tracepoint, in attach order: the exits first, so that no entry is marked whose
/// exit goes unseen.
const PROGRAMS: [(&str, &str); 6] = [
    ("irq_handler_leave", "irq_handler_exit"),
    ("hrtimer_leave", "hrtimer_expire_exit"),
    ("timer_leave", "timer_expire_exit"),
    ("irq_handler_enter", "irq_handler_entry"),
    ("hrtimer_enter", "hrtimer_expire_entry"),
    ("timer_enter", "timer_expire_entry"),
];

fn program<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut RawTracePoint> {
    Ok(ebpf
        .program_mut(name)
        .with_context(|| format!("program {name}"))?
        .try_into()?)
}

/// Puts the programs through the verifier, attaching nothing.
pub fn load(ebpf: &mut Ebpf) -> Result<()> {
    for (name, _) in PROGRAMS {
        program(ebpf, name)?
            .load()
            .map_err(|e| super::load_error_of(&format!("{name}: "), &e))?;
    }
    Ok(())
}

pub fn attach(ebpf: &mut Ebpf) -> Result<Vec<RawTracePointLink>> {
    PROGRAMS
        .into_iter()
        .map(|(name, tracepoint)| {
            let prog = program(ebpf, name)?;
            let id = prog
                .attach(tracepoint)
                .with_context(|| format!("attaching {name} to {tracepoint}"))?;
            Ok(prog.take_link(id)?)
        })
        .collect()
}
