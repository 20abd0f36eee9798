//! Request markers: a uprobe on a pair of functions in the target that bracket one request
//! (`--request-start`, `--request-end`). Each call becomes a timeline event on the calling
//! thread, with the request id when one argument carries it; userspace pairs them into
//! requests and decomposes each one's wall time with the scheduler timeline.
//!
//! A program for each of the two functions.

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_get_smp_processor_id, bpf_ktime_get_ns},
    macros::uprobe,
    programs::ProbeContext,
};
use tracer_common::{Event, EventKind};

use crate::maps::{config, emit, is_member};

/// The start marker: one program per marker, since attach cookies (which could say which
/// marker fired) exist only from Linux 5.15.
#[uprobe]
pub fn request_start(ctx: ProbeContext) -> u32 {
    marker(&ctx, EventKind::RequestStart)
}

#[uprobe]
pub fn request_end(ctx: ProbeContext) -> u32 {
    marker(&ctx, EventKind::RequestEnd)
}

#[inline(always)]
fn marker(ctx: &ProbeContext, kind: EventKind) -> u32 {
    let id = bpf_get_current_pid_tgid();
    if !is_member((id >> 32) as u32) {
        return 0;
    }
    let now = unsafe { bpf_ktime_get_ns() };
    let arg = config!(request_id_arg);
    // Every argument register is read at its constant offset, with volatile loads that the
    // compiler cannot merge into one load at a computed offset (which the verifier rejects for
    // the context), then one is picked by value. The System V x86-64 argument registers: the
    // host this is built for (aya-ebpf's pt_regs follows the host).
    let r = ctx.regs;
    // SAFETY: `r` is the probe's pt_regs; each read is of one field at a fixed offset.
    let regs: [u64; 6] = unsafe {
        [
            core::ptr::read_volatile(&raw const (*r).rdi),
            core::ptr::read_volatile(&raw const (*r).rsi),
            core::ptr::read_volatile(&raw const (*r).rdx),
            core::ptr::read_volatile(&raw const (*r).rcx),
            core::ptr::read_volatile(&raw const (*r).r8),
            core::ptr::read_volatile(&raw const (*r).r9),
        ]
    };
    let (has_id, request) = match arg {
        0 => (1, regs[0]),
        1 => (1, regs[1]),
        2 => (1, regs[2]),
        3 => (1, regs[3]),
        4 => (1, regs[4]),
        5 => (1, regs[5]),
        _ => (0, 0),
    };
    emit(&Event {
        ts_ns: now,
        tid: id as u32,
        kind: kind as u32,
        cpu: unsafe { bpf_get_smp_processor_id() },
        aux: has_id,
        value: request,
    });
    0
}
