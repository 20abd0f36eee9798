//! `send_batch`: sends the batch of the CPU it runs on. Never attached: userspace runs it on an
//! idle CPU at each window's cut (BPF_PROG_TEST_RUN with BPF_F_TEST_RUN_ON_CPU), so that the
//! CPUs need not send their batch at every switch to idle (`maps::IDLE_SENDER`).

use aya_ebpf::{
    helpers::bpf_get_smp_processor_id, macros::raw_tracepoint, programs::RawTracePointContext,
};

use crate::maps::{Batch, sends_when_idle};

/// On another CPU than the caller's the kernel runs it in an IPI, with interrupts off, as
/// `Batch` requires. On the caller's own CPU it would run with them on; that CPU is the one
/// that still sends its batch when idle, and is skipped here.
#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn send_batch(_ctx: RawTracePointContext) -> i32 {
    let cpu = unsafe { bpf_get_smp_processor_id() };
    if sends_when_idle(cpu) {
        return 0;
    }
    if let Some(mut b) = Batch::get() {
        b.send();
    }
    1
}
