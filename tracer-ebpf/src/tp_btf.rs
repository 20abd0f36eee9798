//! BTF-typed tracepoints (tp_btf): the arguments are the kernel's own `task_struct` pointers.
//! Field offsets come from the running kernel's BTF through `CONFIG`, never from headers.

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_get_smp_processor_id, bpf_ktime_get_ns, generated},
    macros::btf_tracepoint,
    programs::BtfTracePointContext,
};

use crate::{
    clock,
    maps::config,
    sched::{self, Comm, Switch},
};

/// A field of a `task_struct` the tracepoint passed. tp_btf arguments are typed pointers, and
/// `CONFIG` lives in a frozen read-only map, so the verifier knows the offset and checks a
/// plain load against the kernel's BTF; the load then runs as an exception-protected memory
/// access, without the helper call `bpf_probe_read_kernel` costs (measured: most of the
/// early-exit path's time on our VMs, BENCHMARKS.md).
#[inline(always)]
fn read_u32(task: *const u8, off: u32) -> u32 {
    unsafe { core::ptr::read_volatile(task.add(off as usize) as *const u32) }
}

/// A pointer member of a kernel struct the verifier knows the type of (from BTF, as for
/// `read_u32`): the result is typed too, so its own members can be read the same way. A
/// faulting load gives null, and loads through null give 0.
#[inline(always)]
fn read_ptr(obj: *const u8, off: u32) -> *const u8 {
    unsafe { core::ptr::read_volatile(obj.add(off as usize) as *const *const u8) }
}

#[inline(always)]
fn tgid_of(task: *const u8) -> u32 {
    read_u32(task, config!(task_tgid_off))
}

#[inline(always)]
fn pid_of(task: *const u8) -> u32 {
    read_u32(task, config!(task_pid_off))
}

#[inline(always)]
fn comm_of(task: *const u8) -> Comm {
    Comm::At(unsafe { task.add(config!(task_comm_off) as usize) })
}

#[inline(always)]
fn is_target(tgid: u32) -> bool {
    crate::maps::is_member(tgid)
}

/// sched_switch(bool preempt, struct task_struct *prev, struct task_struct *next,
/// unsigned int prev_state)
#[btf_tracepoint(function = "sched_switch")]
pub fn sched_switch_btf(ctx: BtfTracePointContext) -> i32 {
    switch(&ctx, ctx.arg::<u64>(3) & 0xffff_ffff)
}

/// sched_switch(bool preempt, struct task_struct *prev, struct task_struct *next) before
/// Linux 5.18 (commit fa2c3254d7cf added `prev_state`): the verifier rejects a read of a
/// fourth argument there, so this one reads none, and the switch's kind comes from the task
/// (`sched/counts.rs`, `blocked_by_counts`).
#[btf_tracepoint(function = "sched_switch")]
pub fn sched_switch_btf_3args(ctx: BtfTracePointContext) -> i32 {
    switch(&ctx, sched::STATE_UNKNOWN)
}

#[inline(always)]
fn switch(ctx: &BtfTracePointContext, prev_state: u64) -> i32 {
    // Plain loads from the task rather than `bpf_get_current_pid_tgid` (`prev` is `current`):
    // a helper call costs more than a load (BENCHMARKS.md).
    let prev: *const u8 = ctx.arg(1);
    let prev_tgid = tgid_of(prev);
    let next: *const u8 = ctx.arg(2);
    let next_tgid = tgid_of(next);
    let prev_target = is_target(prev_tgid);
    let next_target = is_target(next_tgid);
    let sw = Switch {
        preempt: ctx.arg::<u64>(0) & 0xff != 0,
        prev_state,
        prev_pid: pid_of(prev),
        prev_tgid,
        prev_target,
        next_pid: 0,
        next_tgid: 0,
        next_target,
        next_comm: comm_of(next),
        next_task: next,
        prev_task: prev,
    };
    let sw = if next_target {
        Switch {
            next_pid: pid_of(next),
            next_tgid,
            ..sw
        }
    } else {
        sw
    };
    // `prev` is on this CPU's run queue, whose clock `__schedule` has just updated.
    sched::on_switch(unsafe { bpf_get_smp_processor_id() }, &sw, RqClock(prev));
    0
}

/// Monotonic time from the clock of the run queue `task` is on (clock.rs), where the kernel
/// lets it be read (`wakeup_rq_clock`), else from the helper. At a wakeup the task has just
/// joined that queue, whose clock the wakeup updated; at a switch it is this CPU's, updated
/// at the start of `__schedule` (or, when a wakeup that preempts asked it to skip that update,
/// at that wakeup: then the kernel's own run time and run-queue delay stop there too).
#[inline(always)]
fn rq_now(task: *const u8) -> u64 {
    if config!(wakeup_rq_clock) == 0 {
        return unsafe { bpf_ktime_get_ns() };
    }
    let cfs_rq = read_ptr(task, config!(task_cfs_rq_off));
    let rq = read_ptr(cfs_rq, config!(cfs_rq_rq_off));
    let rq_clock =
        unsafe { core::ptr::read_volatile(rq.add(config!(rq_clock_off) as usize) as *const u64) };
    clock::monotonic_from_rq(rq_clock)
}

/// The time from the run queue `0` is on (`rq_now`).
struct RqClock(*const u8);

impl sched::Clock for RqClock {
    #[inline(always)]
    fn now(self) -> u64 {
        rq_now(self.0)
    }
}

#[inline(always)]
fn wakeup(ctx: &BtfTracePointContext, new: bool) {
    let p: *const u8 = ctx.arg(0);
    if !is_target(tgid_of(p)) {
        return;
    }
    // The tracepoint fires once the task is on its new run queue, so task_cpu(p) is that queue.
    let cpu = read_u32(p, config!(task_cpu_off));
    // `p` is on its new run queue, whose clock the wakeup has just updated.
    sched::on_wakeup(pid_of(p), tgid_of(p), cpu, new, comm_of(p), p, RqClock(p));
}

/// sched_waking(struct task_struct *p), in try_to_wake_up, in the waker's context (its
/// sched_wakeup may fire later on the wakee's CPU, inside whatever runs there: a wakeup queued
/// to an idle CPU runs in the idle task). The waker and, where the kernel can say, the system
/// call the wakee is blocked in.
#[btf_tracepoint(function = "sched_waking")]
pub fn sched_waking_btf(ctx: BtfTracePointContext) -> i32 {
    let p: *const u8 = ctx.arg(0);
    let cpu = unsafe { bpf_get_smp_processor_id() };
    if !is_target(tgid_of(p)) {
        // A task outside the target, woken by one of its threads: noted in the waker's entry.
        sched::on_waking_other(cpu, pid_of(p));
        return 0;
    }
    let regs_off = config!(regs_syscall_off);
    if regs_off == u32::MAX {
        // Before Linux 5.15: the waker from helpers, the syscall unknown. (The verifier never
        // reaches the branch below then: the offset is a constant, and the helpers it calls
        // do not exist.)
        sched::on_waking(
            pid_of(p),
            tgid_of(p),
            comm_of(p),
            (cpu, 0),
            sched::note_current_waker,
        );
        return 0;
    }
    // SAFETY: helpers on the tracepoint's own task argument and on `current`; both return
    // typed pointers, so the loads below are checked against BTF like `read_u32`'s.
    let regs = unsafe { generated::bpf_task_pt_regs(p as *mut _) } as *const u8;
    // orig_ax is -1 outside a system call: plus one, 0, "unknown".
    let syscall =
        unsafe { core::ptr::read_volatile(regs.add(regs_off as usize) as *const u64) } as u32;
    let cur = unsafe { generated::bpf_get_current_task_btf() } as *const u8;
    sched::on_waking(
        pid_of(p),
        tgid_of(p),
        comm_of(p),
        (cpu, syscall.wrapping_add(1)),
        |t| {
            t.waker_tid = pid_of(cur);
            t.waker_tgid = tgid_of(cur);
            t.waker_flags = sched::waker_flags(t.waker_tid, read_u32(cur, config!(task_flags_off)));
            let name = unsafe { cur.add(config!(task_comm_off) as usize) } as *const [u64; 2];
            // Two loads, not a helper call: the name is 16 bytes.
            let name = unsafe { core::ptr::read_volatile(name) };
            t.waker_comm = unsafe { core::mem::transmute::<[u64; 2], [u8; 16]>(name) };
        },
    );
    0
}

/// sched_wakeup(struct task_struct *p)
#[btf_tracepoint(function = "sched_wakeup")]
pub fn sched_wakeup_btf(ctx: BtfTracePointContext) -> i32 {
    wakeup(&ctx, false);
    0
}

/// sched_wakeup_new(struct task_struct *p)
#[btf_tracepoint(function = "sched_wakeup_new")]
pub fn sched_wakeup_new_btf(ctx: BtfTracePointContext) -> i32 {
    wakeup(&ctx, true);
    0
}

/// sched_migrate_task(struct task_struct *p, int dest_cpu), called before the CPU changes, so
/// task_cpu(p) is the origin.
#[btf_tracepoint(function = "sched_migrate_task")]
pub fn sched_migrate_task_btf(ctx: BtfTracePointContext) -> i32 {
    let p: *const u8 = ctx.arg(0);
    if !is_target(tgid_of(p)) {
        return 0;
    }
    let from = read_u32(p, config!(task_cpu_off));
    let to = ctx.arg::<u64>(1) as u32;
    sched::on_migrate(pid_of(p), tgid_of(p), from, to, comm_of(p));
    0
}

/// sched_process_fork(struct task_struct *parent, struct task_struct *child): a new thread of
/// the target has the target's TGID; a new process has a TGID of its own (its PID).
#[btf_tracepoint(function = "sched_process_fork")]
pub fn sched_process_fork_btf(ctx: BtfTracePointContext) -> i32 {
    let child: *const u8 = ctx.arg(1);
    let child_tgid = tgid_of(child);
    let parent: *const u8 = ctx.arg(0);
    if is_target(child_tgid) {
        sched::on_thread_new(pid_of(child), child_tgid, pid_of(parent), comm_of(child));
    } else if pid_of(child) == child_tgid
        // A new process: the target's child, or a descendant's? Followed, it is a member now.
        && sched::on_process_fork(child_tgid, tgid_of(parent), comm_of(child))
    {
        sched::on_thread_new(child_tgid, child_tgid, pid_of(parent), comm_of(child));
    }
    0
}

/// sched_process_exec(struct task_struct *p, pid_t old_pid, struct linux_binprm *bprm); `p`
/// is `current`, and its pid is the TGID already when another thread exec'd.
#[btf_tracepoint(function = "sched_process_exec")]
pub fn sched_process_exec_btf(ctx: BtfTracePointContext) -> i32 {
    let p: *const u8 = ctx.arg(0);
    if !is_target(tgid_of(p)) {
        return 0;
    }
    let old = ctx.arg::<u64>(1) as u32;
    sched::on_exec(pid_of(p), tgid_of(p), old, p);
    0
}

/// sched_process_exit(struct task_struct *p, bool group_dead); `p` is `current`.
#[btf_tracepoint(function = "sched_process_exit")]
pub fn sched_process_exit_btf(_ctx: BtfTracePointContext) -> i32 {
    let cur = bpf_get_current_pid_tgid();
    if is_target((cur >> 32) as u32) {
        sched::on_thread_exit(cur as u32, (cur >> 32) as u32);
    }
    0
}

/// cgroup_attach_task(struct cgroup *dst_cgrp, const char *path, struct task_struct *task,
/// bool threadgroup): attached only with `--cgroup`.
#[btf_tracepoint(function = "cgroup_attach_task")]
pub fn cgroup_attach_btf(ctx: BtfTracePointContext) -> i32 {
    let cgrp: *const u8 = ctx.arg(0);
    let task: *const u8 = ctx.arg(2);
    let kn = read_ptr(cgrp, config!(cgroup_kn_off));
    // SAFETY: a typed BTF load at a constant offset, as in `read_u32`.
    let id =
        unsafe { core::ptr::read_volatile(kn.add(config!(kernfs_id_off) as usize) as *const u64) };
    let root = read_ptr(cgrp, config!(cgroup_root_off));
    let hierarchy = read_u32(root, config!(root_hierarchy_off));
    sched::on_cgroup_attach(id, hierarchy, pid_of(task), tgid_of(task), comm_of(task));
    0
}
