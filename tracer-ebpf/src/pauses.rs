//! Runtime pauses: CPython's garbage collections, from its USDT probes `python:gc__start` and
//! `gc__done` (a uprobe at each probe's address), a program for each. Where the probe's
//! argument is (`tracer_common::gc_cookie`) comes from `GC_ARGS`, per process.

use aya_ebpf::{
    helpers::{
        bpf_get_current_pid_tgid, bpf_get_smp_processor_id, bpf_ktime_get_ns, bpf_probe_read_user,
    },
    macros::uprobe,
    programs::ProbeContext,
};
use tracer_common::{Event, EventKind, GC_ARG_MEMORY, GC_ARG_NONE, GC_DONE, GC_START};

use crate::maps::{GC_ARGS, emit, is_member};

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

/// `python:gc__start`: one program per probe, since attach cookies (which could say which
/// probe fired) exist only from Linux 5.15.
#[uprobe]
pub fn gc_start(ctx: ProbeContext) -> u32 {
    gc(&ctx, GC_START)
}

#[uprobe]
pub fn gc_done(ctx: ProbeContext) -> u32 {
    gc(&ctx, GC_DONE)
}

#[inline(always)]
fn gc(ctx: &ProbeContext, kind: u64) -> u32 {
    let id = bpf_get_current_pid_tgid();
    let tgid = (id >> 32) as u32;
    if !is_member(tgid) {
        return 0;
    }
    let now = unsafe { bpf_ktime_get_ns() };
    // Where this process's Python keeps the probe's argument (its build's USDT note), else
    // where the first Python probed keeps it (a process forked from a member later).
    let spec = unsafe { GC_ARGS.get(tgid).or_else(|| GC_ARGS.get(0)) };
    let cookie = spec.map_or(kind | (GC_ARG_NONE << 8), |s| s[kind as usize & 1]);
    let slot = (cookie >> 8) & 0xff;
    let size = (cookie >> 17) & 0xf;
    let arg = if slot == GC_ARG_NONE {
        None
    } else {
        regs(ctx).get(slot as usize).copied().and_then(|r| {
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
    let kind = if kind == GC_DONE {
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
