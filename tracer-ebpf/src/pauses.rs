//! Runtime pauses: CPython's garbage collections, from its USDT probes `python:gc__start` and
//! `gc__done` (a uprobe at each probe's address). One program for both; the attach cookie
//! says which, and where the probe's argument is (`tracer_common::gc_cookie`).

use aya_ebpf::{
    EbpfContext,
    helpers::{
        bpf_get_current_pid_tgid, bpf_get_smp_processor_id, bpf_ktime_get_ns, bpf_probe_read_user,
        generated::bpf_get_attach_cookie,
    },
    macros::uprobe,
    programs::ProbeContext,
};
use tracer_common::{Event, EventKind, GC_ARG_MEMORY, GC_ARG_NONE, GC_DONE};

use crate::maps::{emit, is_member};

/// The registers by their 8-byte slot in `pt_regs` (x86-64 order: r15 r14 r13 r12 rbp rbx
/// r11 r10 r9 r8 rax rcx rdx rsi rdi orig_rax rip cs eflags rsp), each read at its constant
/// offset with a volatile load, which the compiler cannot turn into one load at a computed
/// offset (the verifier refuses that for the context); one is then picked by index.
#[inline(always)]
fn regs(ctx: &ProbeContext) -> [u64; 20] {
    let r = ctx.regs;
    // SAFETY: `r` is the probe's pt_regs; each read is of one field at a fixed offset.
    unsafe {
        [
            core::ptr::read_volatile(&raw const (*r).r15),
            core::ptr::read_volatile(&raw const (*r).r14),
            core::ptr::read_volatile(&raw const (*r).r13),
            core::ptr::read_volatile(&raw const (*r).r12),
            core::ptr::read_volatile(&raw const (*r).rbp),
            core::ptr::read_volatile(&raw const (*r).rbx),
            core::ptr::read_volatile(&raw const (*r).r11),
            core::ptr::read_volatile(&raw const (*r).r10),
            core::ptr::read_volatile(&raw const (*r).r9),
            core::ptr::read_volatile(&raw const (*r).r8),
            core::ptr::read_volatile(&raw const (*r).rax),
            core::ptr::read_volatile(&raw const (*r).rcx),
            core::ptr::read_volatile(&raw const (*r).rdx),
            core::ptr::read_volatile(&raw const (*r).rsi),
            core::ptr::read_volatile(&raw const (*r).rdi),
            0,
            0,
            0,
            0,
            core::ptr::read_volatile(&raw const (*r).rsp),
        ]
    }
}

#[uprobe]
pub fn gc_probe(ctx: ProbeContext) -> u32 {
    let id = bpf_get_current_pid_tgid();
    if !is_member((id >> 32) as u32) {
        return 0;
    }
    let now = unsafe { bpf_ktime_get_ns() };
    // SAFETY: the helper only reads the attach cookie of the running program.
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    let slot = (cookie >> 8) & 0xff;
    let size = (cookie >> 17) & 0xf;
    let arg = if slot == GC_ARG_NONE {
        None
    } else {
        regs(&ctx).get(slot as usize).copied().and_then(|r| {
            if cookie & GC_ARG_MEMORY == 0 {
                return Some(r);
            }
            let at = r.wrapping_add((cookie >> 32) as i32 as i64 as u64);
            // SAFETY: a read of the probed thread's own memory, checked by the helper.
            unsafe { bpf_probe_read_user(at as *const u64) }.ok()
        })
    };
    // Little-endian: the low `size` bytes are the argument.
    let value = arg.map(|v| {
        if size >= 8 {
            v
        } else {
            v & ((1u64 << (size * 8)) - 1)
        }
    });
    let kind = if cookie & 0xff == GC_DONE {
        EventKind::GcDone
    } else {
        EventKind::GcStart
    };
    emit(&Event {
        ts_ns: now,
        tid: id as u32,
        kind: kind as u32,
        cpu: unsafe { bpf_get_smp_processor_id() },
        aux: value.is_some() as u32,
        value: value.unwrap_or(0),
    });
    0
}
