//! Classic tracepoints: the fallback where the kernel has no BTF. Record field offsets come from
//! the tracefs `format` files through `CONFIG`. The records carry TIDs but no TGIDs, so target
//! membership is a lookup in `TARGET_TIDS`, except for `current`, whose TGID a helper gives.

use aya_ebpf::{
    EbpfContext,
    helpers::{bpf_get_current_pid_tgid, bpf_get_smp_processor_id},
    macros::tracepoint,
    programs::TracePointContext,
};

use crate::{
    maps::{TARGET_TIDS, config, is_member},
    sched::{self, Comm, Switch},
};

/// `CLONE_THREAD` from include/uapi/linux/sched.h: the new task joins the parent's thread group.
const CLONE_THREAD: u64 = 0x0001_0000;
/// `TASK_REPORT_MAX` (include/linux/sched.h since 4.14): the classic sched_switch record sets
/// this bit in `prev_state` when the task was preempted.
const TASK_REPORT_MAX: u64 = 0x100;

#[inline(always)]
fn read_u32(ctx: &TracePointContext, off: u32) -> u32 {
    unsafe { ctx.read_at::<u32>(off as usize) }.unwrap_or(0)
}

/// The process of the member thread `tid` (`TARGET_TIDS` maps each to its TGID: the classic
/// records name only the thread).
#[inline(always)]
fn target_tgid_of(tid: u32) -> Option<u32> {
    if tid == 0 {
        return None;
    }
    TARGET_TIDS.get_ptr(tid).map(|t| unsafe { *t })
}

/// `current`'s TID and TGID, when it is a member's thread.
#[inline(always)]
fn current_is_target() -> Option<(u32, u32)> {
    let cur = bpf_get_current_pid_tgid();
    let tgid = (cur >> 32) as u32;
    is_member(tgid).then_some((cur as u32, tgid))
}

#[inline(always)]
fn field(ctx: &TracePointContext, off: u32) -> Comm {
    Comm::At(unsafe { (ctx.as_ptr() as *const u8).add(off as usize) })
}

#[tracepoint(category = "sched", name = "sched_switch")]
pub fn sched_switch_tp(ctx: TracePointContext) -> u32 {
    let prev = bpf_get_current_pid_tgid();
    let prev_tgid = (prev >> 32) as u32;
    let next_pid = read_u32(&ctx, config!(switch_next_pid_off));
    let next = target_tgid_of(next_pid);
    let raw_state = if config!(switch_prev_state_size) == 8 {
        unsafe { ctx.read_at::<u64>(config!(switch_prev_state_off) as usize) }.unwrap_or(0)
    } else {
        read_u32(&ctx, config!(switch_prev_state_off)) as u64
    };
    let prev_target = is_member(prev_tgid);
    let sw = Switch {
        preempt: raw_state & TASK_REPORT_MAX != 0,
        prev_state: raw_state & (TASK_REPORT_MAX - 1),
        prev_pid: prev as u32,
        prev_tgid,
        prev_target,
        next_pid,
        next_tgid: next.unwrap_or(0),
        next_target: next.is_some(),
        next_comm: field(&ctx, config!(switch_next_comm_off)),
        // The classic record carries no task: the kernel's own counters cannot be read.
        next_task: core::ptr::null(),
        prev_task: core::ptr::null(),
    };
    sched::on_switch(
        unsafe { bpf_get_smp_processor_id() },
        &sw,
        sched::HelperClock,
    );
    if prev_target && is_dead(prev as u32) {
        // The TID may be reused by another process: stop treating it as the target's.
        let _ = TARGET_TIDS.remove(prev as u32);
    }
    0
}

#[inline(always)]
fn is_dead(tid: u32) -> bool {
    match crate::maps::THREADS.get_ptr(tid) {
        Some(t) => unsafe { (*t).state == tracer_common::ThreadState::Dead as u32 },
        None => false,
    }
}

#[inline(always)]
fn wakeup(ctx: &TracePointContext, new: bool) {
    let tid = read_u32(ctx, config!(wakeup_pid_off));
    let Some(tgid) = target_tgid_of(tid) else {
        return;
    };
    let cpu = read_u32(ctx, config!(wakeup_cpu_off));
    sched::on_wakeup(
        tid,
        tgid,
        cpu,
        new,
        field(ctx, config!(wakeup_comm_off)),
        core::ptr::null(),
        sched::HelperClock,
    );
}

/// sched_waking, in the waker's context: its record is sched_wakeup's (the same event class),
/// so the same offsets apply. The classic record has no task, so the syscall is unknown.
#[tracepoint(category = "sched", name = "sched_waking")]
pub fn sched_waking_tp(ctx: TracePointContext) -> u32 {
    let tid = read_u32(&ctx, config!(wakeup_pid_off));
    let cpu = unsafe { bpf_get_smp_processor_id() };
    let Some(tgid) = target_tgid_of(tid) else {
        // A task outside the target, woken by one of its threads: noted in the waker's entry.
        sched::on_waking_other(cpu, tid);
        return 0;
    };
    sched::on_waking(
        tid,
        tgid,
        field(&ctx, config!(wakeup_comm_off)),
        (cpu, 0),
        sched::note_current_waker,
    );
    0
}

#[tracepoint(category = "sched", name = "sched_wakeup")]
pub fn sched_wakeup_tp(ctx: TracePointContext) -> u32 {
    wakeup(&ctx, false);
    0
}

#[tracepoint(category = "sched", name = "sched_wakeup_new")]
pub fn sched_wakeup_new_tp(ctx: TracePointContext) -> u32 {
    wakeup(&ctx, true);
    0
}

#[tracepoint(category = "sched", name = "sched_migrate_task")]
pub fn sched_migrate_task_tp(ctx: TracePointContext) -> u32 {
    let tid = read_u32(&ctx, config!(migrate_pid_off));
    let Some(tgid) = target_tgid_of(tid) else {
        return 0;
    };
    let from = read_u32(&ctx, config!(migrate_orig_cpu_off));
    let to = read_u32(&ctx, config!(migrate_dest_cpu_off));
    // The record's comm is a __data_loc string; the name is filled in later from other events.
    sched::on_migrate(tid, tgid, from, to, Comm::At(core::ptr::null()));
    0
}

/// task_newtask runs in the parent, and its record has the clone flags, which say whether the
/// new task is a thread of the parent's process (sched_process_fork's record does not).
#[tracepoint(category = "task", name = "task_newtask")]
pub fn task_newtask_tp(ctx: TracePointContext) -> u32 {
    let flags = unsafe { ctx.read_at::<u64>(config!(newtask_flags_off) as usize) }.unwrap_or(0);
    if flags & CLONE_THREAD == 0 {
        // A new process: the target's child, or a descendant's?
        let cur = bpf_get_current_pid_tgid();
        let tid = read_u32(&ctx, config!(newtask_pid_off));
        let comm = field(&ctx, config!(newtask_comm_off));
        if sched::on_process_fork(tid, (cur >> 32) as u32, comm) {
            // A new process's first thread: its TID is its TGID.
            let _ = TARGET_TIDS.insert(tid, tid, 0);
            sched::on_thread_new(tid, tid, cur as u32, comm);
        }
        return 0;
    }
    let Some((parent, tgid)) = current_is_target() else {
        return 0;
    };
    let tid = read_u32(&ctx, config!(newtask_pid_off));
    let _ = TARGET_TIDS.insert(tid, tgid, 0);
    sched::on_thread_new(tid, tgid, parent, field(&ctx, config!(newtask_comm_off)));
    0
}

/// sched_process_exec: `current` exec'd; `old_pid` is the TID it had (the TGID now holds it
/// when it was not the main thread).
#[tracepoint(category = "sched", name = "sched_process_exec")]
pub fn sched_process_exec_tp(ctx: TracePointContext) -> u32 {
    let Some((tid, tgid)) = current_is_target() else {
        return 0;
    };
    let old = read_u32(&ctx, config!(exec_old_pid_off));
    if old != tid {
        // The old TID is gone; the main one is this thread now.
        let _ = TARGET_TIDS.remove(old);
        let _ = TARGET_TIDS.insert(tid, tgid, 0);
    }
    sched::on_exec(tid, tgid, old, core::ptr::null());
    0
}

#[tracepoint(category = "sched", name = "sched_process_exit")]
pub fn sched_process_exit_tp(_ctx: TracePointContext) -> u32 {
    if let Some((tid, tgid)) = current_is_target() {
        sched::on_thread_exit(tid, tgid);
    }
    0
}
