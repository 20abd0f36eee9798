//! Perf counters per slice: the loader opens one counter per CPU for each slot (hardware where a
//! PMU exists, software ones to check the plumbing); at a target thread's switch-in the current
//! CPU's counters are read, at its switch-out read again, and the deltas are charged to the
//! thread. This costs nothing while other tasks run, unlike per-thread counters that the kernel
//! switches at every context switch, and covers threads created later with no help from
//! userspace.

use core::mem::MaybeUninit;

use aya_ebpf::helpers::generated::bpf_perf_event_read_value;
use tracer_common::{
    Counter, CounterReading, CounterSlice, EventKind, PERF_SLOTS, ThreadCounters,
    scale_for_multiplexing,
};

use crate::maps::{
    Batch, COUNTERS_TEMPLATE, PERF_CONTEXT_SWITCHES, PERF_CPU_CLOCK, PERF_CPU_MIGRATIONS,
    PERF_CYCLES, PERF_INSTRUCTIONS, PERF_LLC_MISSES, PERF_LLC_REFERENCES, THREAD_COUNTERS, config,
    count,
};
use crate::zero::zero_words;

const BPF_NOEXIST: u64 = 1;
/// `BPF_F_CURRENT_CPU`: the counter of the CPU the program runs on (the kernel refuses to read
/// another CPU's counter anyway).
const CURRENT_CPU: u64 = 0xffff_ffff;

/// Reads slot `k` on the current CPU into `out`, which may be uninitialised (the helper fills
/// it, or zeroes it on failure).
///
/// # Safety
/// `out` is valid for writes of a `CounterReading`.
#[inline(always)]
unsafe fn read(k: usize, out: *mut CounterReading) -> bool {
    // PerfEventArray is a transparent wrapper over the map definition, so a pointer to the
    // static is the map pointer the helper wants.
    let map: *mut core::ffi::c_void = match k {
        0 => (&raw const PERF_CYCLES).cast_mut().cast(),
        1 => (&raw const PERF_INSTRUCTIONS).cast_mut().cast(),
        2 => (&raw const PERF_LLC_REFERENCES).cast_mut().cast(),
        3 => (&raw const PERF_LLC_MISSES).cast_mut().cast(),
        4 => (&raw const PERF_CPU_CLOCK).cast_mut().cast(),
        5 => (&raw const PERF_CONTEXT_SWITCHES).cast_mut().cast(),
        _ => (&raw const PERF_CPU_MIGRATIONS).cast_mut().cast(),
    };
    // SAFETY: `out` is valid for writes of the size passed (the caller's promise).
    let rc = unsafe {
        bpf_perf_event_read_value(
            map,
            CURRENT_CPU,
            out.cast(),
            size_of::<CounterReading>() as u32,
        )
    };
    if rc != 0 {
        count(Counter::PerfReadFailed);
        anomaly!("perf counter read failed: slot {} error {}", k as u32, rc);
    }
    rc == 0
}

#[inline(always)]
fn entry(tid: u32) -> Option<&'static mut ThreadCounters> {
    if let Some(c) = THREAD_COUNTERS.get_ptr_mut(tid) {
        return Some(unsafe { &mut *c });
    }
    // Built in a per-CPU template: the struct is too large for the stack. Only `valid` needs a
    // value here; the totals of the template are never written, so they stay zero.
    let t = unsafe { &mut *COUNTERS_TEMPLATE.get_ptr_mut(0)? };
    t.valid = 0;
    #[allow(clippy::needless_borrows_for_generic_args)]
    let _ = THREAD_COUNTERS.insert(tid, &*t, BPF_NOEXIST);
    THREAD_COUNTERS.get_ptr_mut(tid).map(|c| unsafe { &mut *c })
}

/// A target thread got the CPU: note where its counters start.
#[inline(always)]
pub fn slice_begin(tid: u32, now: u64) {
    let mask = config!(counter_mask);
    if mask == 0 {
        return;
    }
    let Some(c) = entry(tid) else {
        return;
    };
    let mut valid = 0u32;
    for k in 0..PERF_SLOTS {
        // SAFETY: an element of the entry.
        if mask & (1 << k) != 0 && unsafe { read(k, &raw mut c.start[k]) } {
            valid |= 1 << k;
        }
    }
    c.valid = valid;
    c.slice_start_ns = now;
}

/// A target thread leaves `cpu`: charge it the deltas since `slice_begin`.
#[inline(always)]
pub fn slice_end(tid: u32, cpu: u32, now: u64, out: &mut Batch) {
    if config!(counter_mask) == 0 {
        return;
    }
    let Some(c) = THREAD_COUNTERS.get_ptr_mut(tid) else {
        return;
    };
    let c = unsafe { &mut *c };
    if c.valid == 0 {
        return;
    }
    // Zeroed a word at a time, not by a struct literal (a byte-by-byte memset at every
    // target switch: `zero.rs`).
    let mut slice = MaybeUninit::<CounterSlice>::uninit();
    // SAFETY: a stack slot of the size, plain data.
    let slice = unsafe {
        zero_words(slice.as_mut_ptr());
        slice.assume_init_mut()
    };
    slice.ts_ns = now;
    slice.tid = tid;
    slice.kind = EventKind::CounterSlice as u32;
    slice.cpu = cpu;
    slice.start_ns = c.slice_start_ns;
    let mut end = MaybeUninit::<CounterReading>::uninit();
    for k in 0..PERF_SLOTS {
        // SAFETY: a stack slot of the size.
        if c.valid & (1 << k) == 0 || !unsafe { read(k, end.as_mut_ptr()) } {
            continue;
        }
        // SAFETY: the read succeeded, so the helper filled it.
        let end = unsafe { end.assume_init_ref() };
        let start = c.start[k];
        let delta = end.counter.wrapping_sub(start.counter);
        let enabled = end.enabled.wrapping_sub(start.enabled);
        let running = end.running.wrapping_sub(start.running);
        let scaled = scale_for_multiplexing(delta, enabled, running);
        c.scaled[k] += scaled;
        c.raw[k] += delta;
        c.enabled[k] += enabled;
        c.running[k] += running;
        slice.values[k] = scaled;
        slice.valid |= 1 << k;
    }
    c.valid = 0;
    out.push(&*slice);
}
