//! Timer callbacks and device interrupt handlers, marked per CPU (`CpuWait::irq_bits`).
//! `sched_waking` in one names whatever task the interrupt hit as the waker: a poll's timeout
//! expiring, or a device's completion, beside a busy neighbour was "ended by" that neighbour.
//! With the marks, the waking programs know such a wakeup is no task's doing.
//!
//! Marked: hard interrupt handlers (`irq_handler_entry`/`exit`), hrtimer callbacks (the
//! timeouts of futex, poll, epoll and sleeps: `hrtimer_expire_entry`/`exit`) and timer-wheel
//! callbacks (`schedule_timeout`: `timer_expire_entry`/`exit`). Not marked: the rest of softirq
//! processing, which also runs at `local_bh_enable` in a task's own context on that task's
//! behalf (a loopback TCP send delivers the packet and wakes its reader there), so a NIC's
//! receive wakeup stays charged to the task it hit.
//!
//! A bit per kind, set at its entry and cleared at its exit, not a count: the kernel skips a
//! program's run nested in its own (an hrtimer firing in hard interrupt context while the
//! exit program runs for a soft one), and a count would then stay up for good; a bit set by a
//! skipped pair's entry is cleared by the next callback of its kind, milliseconds later.

use aya_ebpf::{
    helpers::bpf_get_smp_processor_id, macros::raw_tracepoint, programs::RawTracePointContext,
};
use tracer_common::{IRQ_HANDLER, IRQ_HRTIMER, IRQ_TIMER};

use crate::sched::mark_interrupt;

#[inline(always)]
fn mark(kind: u32, inside: bool) -> i32 {
    mark_interrupt(unsafe { bpf_get_smp_processor_id() }, kind, inside);
    0
}

#[raw_tracepoint(tracepoint = "irq_handler_entry")]
pub fn irq_handler_enter(_ctx: RawTracePointContext) -> i32 {
    mark(IRQ_HANDLER, true)
}

#[raw_tracepoint(tracepoint = "irq_handler_exit")]
pub fn irq_handler_leave(_ctx: RawTracePointContext) -> i32 {
    mark(IRQ_HANDLER, false)
}

#[raw_tracepoint(tracepoint = "hrtimer_expire_entry")]
pub fn hrtimer_enter(_ctx: RawTracePointContext) -> i32 {
    mark(IRQ_HRTIMER, true)
}

#[raw_tracepoint(tracepoint = "hrtimer_expire_exit")]
pub fn hrtimer_leave(_ctx: RawTracePointContext) -> i32 {
    mark(IRQ_HRTIMER, false)
}

#[raw_tracepoint(tracepoint = "timer_expire_entry")]
pub fn timer_enter(_ctx: RawTracePointContext) -> i32 {
    mark(IRQ_TIMER, true)
}

#[raw_tracepoint(tracepoint = "timer_expire_exit")]
pub fn timer_leave(_ctx: RawTracePointContext) -> i32 {
    mark(IRQ_TIMER, false)
}
