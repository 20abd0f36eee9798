//! `send_batch`: sends the batch of the CPU it runs on. Never attached: a watch runs it on
//! each CPU that leaves its batch to userspace (`maps::IDLE_SENDER`) and holds records, when
//! each window's records are taken (BPF_PROG_TEST_RUN with BPF_F_TEST_RUN_ON_CPU), so that
//! those CPUs need not send it at every switch to idle.

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_get_smp_processor_id},
    macros::raw_tracepoint,
    programs::RawTracePointContext,
};

use crate::maps::{Batch, sends_when_idle};

/// On another CPU than the caller's the kernel runs it in an IPI, with interrupts off, as
/// `Batch` requires. On the caller's own CPU (the start's check of the kernel asks for that;
/// a cpuset change can also move the sender there) it would run with them on, in the caller's
/// own context: the caller passes its thread ID as the first argument, and the program does
/// nothing when it is the task it runs in.
#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn send_batch(ctx: RawTracePointContext) -> i32 {
    let caller: u64 = ctx.arg(0);
    if bpf_get_current_pid_tgid() & 0xffff_ffff == caller {
        return 0;
    }
    let cpu = unsafe { bpf_get_smp_processor_id() };
    if sends_when_idle(cpu) {
        return 0;
    }
    if let Some(mut b) = Batch::get() {
        b.send();
    }
    1
}
