//! Empty programs on the tracepoints the tracer uses. Not part of a recording: `cargo xtask
//! bench` attaches them (`tracer floor`) to measure what any program on these tracepoints costs
//! on this kernel before doing anything, the floor under the tracer's own early-exit path.

use aya_ebpf::{macros::btf_tracepoint, programs::BtfTracePointContext};

#[btf_tracepoint(function = "sched_switch")]
pub fn floor_switch(_ctx: BtfTracePointContext) -> i32 {
    0
}

#[btf_tracepoint(function = "sched_wakeup")]
pub fn floor_wakeup(_ctx: BtfTracePointContext) -> i32 {
    0
}

#[btf_tracepoint(function = "sched_wakeup_new")]
pub fn floor_wakeup_new(_ctx: BtfTracePointContext) -> i32 {
    0
}

#[btf_tracepoint(function = "sched_migrate_task")]
pub fn floor_migrate(_ctx: BtfTracePointContext) -> i32 {
    0
}

#[btf_tracepoint(function = "sched_process_fork")]
pub fn floor_fork(_ctx: BtfTracePointContext) -> i32 {
    0
}

#[btf_tracepoint(function = "sched_process_exit")]
pub fn floor_exit(_ctx: BtfTracePointContext) -> i32 {
    0
}

#[btf_tracepoint(function = "sched_waking")]
pub fn floor_waking(_ctx: BtfTracePointContext) -> i32 {
    0
}
