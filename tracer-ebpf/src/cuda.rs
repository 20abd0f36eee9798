//! CUDA driver calls of the target, by uprobes on libcuda.so: kernel launches are counted, and
//! the time each thread spends inside synchronizing calls (stream/context/event synchronize,
//! synchronous device-to-host copies) is measured from entry to return. That time is the
//! thread waiting for the GPU, whether it spins on a CPU or sleeps meanwhile.
//!
//! An entry program per function and one return program for all of them.

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_user},
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

/// One entry program per function (`CudaFn`, by number): attach cookies, which could say
/// which function a single program was entered from, exist only from Linux 5.15.
macro_rules! entries {
    ($($name:ident = $f:ident),* $(,)?) => {
        $(
            #[uprobe]
            pub fn $name(ctx: ProbeContext) -> u32 {
                // SAFETY: the probe's own pt_regs; one field at a constant offset.
                let sp = unsafe { core::ptr::read_volatile(&raw const (*ctx.regs).rsp) };
                enter(CudaFn::$f as u32, sp)
            }
        )*
    };
}

entries!(
    cuda_enter_0 = LaunchKernel,
    cuda_enter_1 = LaunchKernelPtsz,
    cuda_enter_2 = LaunchKernelEx,
    cuda_enter_3 = LaunchKernelExPtsz,
    cuda_enter_4 = StreamSynchronize,
    cuda_enter_5 = StreamSynchronizePtsz,
    cuda_enter_6 = CtxSynchronize,
    cuda_enter_7 = EventSynchronize,
    cuda_enter_8 = MemcpyDtoH,
    cuda_enter_9 = MemcpyDtoHPtds,
    cuda_enter_10 = RtDeviceSynchronize,
    cuda_enter_11 = RtStreamSynchronize,
    cuda_enter_12 = RtEventSynchronize,
    cuda_enter_13 = RtMemcpy,
);

#[inline(always)]
fn enter(f: u32, sp: u64) -> u32 {
    let Some(tid) = target_tid() else {
        return 0;
    };
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
    // The call in progress ended unseen (`CudaThread::sync_sp`) if this one enters above its
    // stack pointer (the stack grows down: a nested call enters below it, or at it by a tail
    // call), or if its return address is still in place: the return probe replaces it with
    // its trampoline right after this program runs, so a call whose slot still holds it was
    // entered without one (before the return probe was attached), or the slot is this call's
    // own, from the same call site. Then this call starts afresh.
    if c.depth > 0
        && (sp > c.sync_sp
            || unsafe { bpf_probe_read_user(c.sync_sp as *const u64) }.ok() == Some(c.sync_ret))
    {
        c.lost_returns += 1;
        c.depth = 0;
    }
    if c.depth == 0 {
        c.sync_start_ns = now;
        c.sync_fn = f;
        c.sync_sp = sp;
        // Read only for an outermost call: a nested one's return address is never compared.
        c.sync_ret = unsafe { bpf_probe_read_user(sp as *const u64) }.unwrap_or(0);
    }
    c.depth += 1;
    0
}

#[uretprobe]
pub fn cuda_call_exit(_ctx: RetProbeContext) -> u32 {
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
        // The outermost call's function, kept at its entry.
        aux: c.sync_fn,
        value: d,
    });
    0
}
