//! CUDA driver calls of the target, by uprobes on libcuda.so: kernel launches are counted, and
//! the time each thread spends inside synchronizing calls (stream/context/event synchronize,
//! synchronous device-to-host copies) is measured from entry to return. That time is the
//! thread waiting for the GPU, whether it spins on a CPU or sleeps meanwhile.
//!
//! One entry and one return program serve every function; the attach cookie says which.

use aya_ebpf::{
    EbpfContext,
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns, generated::bpf_get_attach_cookie},
    macros::{uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext},
};
use tracer_common::{CudaFn, CudaThread, Event, EventKind};

use crate::maps::{CUDA_THREADS, emit, is_member};

const BPF_NOEXIST: u64 = 1;

/// The calling thread's TID if it belongs to the target.
#[inline(always)]
fn target_tid() -> Option<u32> {
    let id = bpf_get_current_pid_tgid();
    is_member((id >> 32) as u32).then_some(id as u32)
}

#[inline(always)]
fn entry(tid: u32) -> Option<&'static mut CudaThread> {
    if let Some(c) = CUDA_THREADS.get_ptr_mut(tid) {
        return Some(unsafe { &mut *c });
    }
    let _ = CUDA_THREADS.insert(tid, CudaThread::default(), BPF_NOEXIST);
    CUDA_THREADS.get_ptr_mut(tid).map(|c| unsafe { &mut *c })
}

#[inline(always)]
fn cookie(ctx: &impl EbpfContext) -> u32 {
    // SAFETY: the helper only reads the attach cookie of the running program.
    unsafe { bpf_get_attach_cookie(ctx.as_ptr()) as u32 }
}

#[uprobe]
pub fn cuda_call_enter(ctx: ProbeContext) -> u32 {
    let Some(tid) = target_tid() else {
        return 0;
    };
    let f = cookie(&ctx);
    let Some(c) = entry(tid) else {
        return 0;
    };
    let now = unsafe { bpf_ktime_get_ns() };
    if f < CudaFn::StreamSynchronize as u32 {
        c.launches += 1;
        emit(&Event {
            ts_ns: now,
            tid,
            kind: EventKind::CudaLaunch as u32,
            cpu: 0,
            aux: f,
            value: 0,
        });
        return 0;
    }
    if c.depth == 0 {
        c.sync_start_ns = now;
        c.sync_fn = f;
    }
    c.depth += 1;
    0
}

#[uretprobe]
pub fn cuda_call_exit(ctx: RetProbeContext) -> u32 {
    let Some(tid) = target_tid() else {
        return 0;
    };
    let Some(c) = CUDA_THREADS.get_ptr_mut(tid) else {
        return 0;
    };
    let c = unsafe { &mut *c };
    if c.depth == 0 {
        // The call began before the probes were attached.
        return 0;
    }
    c.depth -= 1;
    if c.depth > 0 {
        return 0;
    }
    let now = unsafe { bpf_ktime_get_ns() };
    let d = now.saturating_sub(c.sync_start_ns);
    c.sync_calls += 1;
    c.sync_ns += d;
    if d > c.sync_max_ns {
        c.sync_max_ns = d;
    }
    emit(&Event {
        ts_ns: now,
        tid,
        kind: EventKind::CudaSync as u32,
        cpu: 0,
        aux: cookie(&ctx),
        value: d,
    });
    0
}
