//! Monotonic time for the scheduler programs without the clock helper.
//!
//! `bpf_ktime_get_ns` is a helper call that reaches the clocksource through an indirect call;
//! with the return-thunk mitigations of current AMD and Intel kernels it cost about 90 ns per
//! wakeup on our VMs, more than half of the program (BENCHMARKS.md). A wakeup updates the clock
//! of the run queue the task joins before enqueueing it (`update_rq_clock`, in every wakeup
//! path and in `wake_up_new_task`), so that time is three loads away at `sched_wakeup`:
//! `p->se.cfs_rq->rq->clock`. It is when the kernel's own accounting starts the wait
//! (schedstat's `run_delay`), a few hundred ns before the tracepoint. `__schedule` updates
//! this CPU's clock before it picks the next task, so a `sched_switch` in which `prev` blocks
//! reads it the same way, through `prev`: the time the kernel's own accounting ends the slice
//! (`sum_exec_runtime`) and the wait (`run_delay`) at. A wakeup that preempts the running task
//! asks the next `__schedule` to skip its update (`rq_clock_skip_update`: the wakeup has just
//! done one), so that switch would read the wakeup's time, microseconds early (measured: 10 us
//! a wakeup on our VMs, behind CPU hogs). Such a switch is a preemption (`prev` left runnable),
//! which reads the helper; so does a switch whose clock still reads the time a target's wakeup
//! noted for its CPU (`CpuWait::since_ns`: the wakee preempted a task that then blocked). What
//! is left: a task that blocks while a non-target's wakeup has asked to preempt it, before it
//! reached a preemption point; its slice ends at that wakeup, a few microseconds early, as in
//! the kernel's own accounting.
//!
//! That clock is `sched_clock` time, not monotonic time. Each CPU keeps the difference between
//! the two, measured on the first `CAL_SAMPLES` wakeups and switches of each tick: the smallest
//! difference is the one read closest to the clock's update (each sample's run-queue clock is
//! older than the helper's reading by the work since, which varies), so that is the one kept. Over a
//! tick the two clocks drift apart by nothing with a stable TSC and by at most 500 ppm of 4 ms
//! (2 us) under the fastest NTP slew. Each new tick's first sample also checks the previous
//! difference against the helper and adds the error up (`Counter::ClockErrorNs`), so a
//! recording states how close its scheduler times were to the helper's.

use aya_ebpf::{
    helpers::{bpf_ktime_get_ns, generated::bpf_jiffies64},
    macros::map,
    maps::PerCpuArray,
};
use tracer_common::Counter;

use crate::maps::{add, count};

/// Wakeups per CPU and tick that also read the clock helper.
const CAL_SAMPLES: u64 = 16;

/// Per CPU: monotonic minus run-queue clock, the tick it was measured in, and how many
/// samples of that tick it is the smallest of.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Calibration {
    jiffies: u64,
    offset: i64,
    samples: u64,
}

#[map]
static CALIBRATION: PerCpuArray<Calibration> = PerCpuArray::with_max_entries(1, 0);

/// Monotonic time for a run-queue clock reading `rq_clock` taken by this wakeup; 0 means the
/// kernel gave none (the loads fault to 0), and the helper is used.
#[inline(always)]
pub fn monotonic_from_rq(rq_clock: u64) -> u64 {
    let Some(cal) = CALIBRATION.get_ptr_mut(0) else {
        return unsafe { bpf_ktime_get_ns() };
    };
    // Per-CPU slot, and the wakeup programs run with interrupts off: nothing else writes it.
    let cal = unsafe { &mut *cal };
    let tick = unsafe { bpf_jiffies64() };
    if rq_clock != 0 && cal.jiffies == tick && cal.samples >= CAL_SAMPLES {
        return rq_clock.wrapping_add(cal.offset as u64);
    }
    let now = unsafe { bpf_ktime_get_ns() };
    if rq_clock == 0 {
        return now;
    }
    let sample = now.wrapping_sub(rq_clock) as i64;
    if cal.jiffies != tick {
        if cal.samples != 0 {
            // What the previous tick's difference gives now.
            count(Counter::ClockChecks);
            add(
                Counter::ClockErrorNs,
                rq_clock.wrapping_add(cal.offset as u64).abs_diff(now),
            );
        }
        cal.jiffies = tick;
        cal.offset = sample;
        cal.samples = 1;
    } else {
        cal.samples += 1;
        if sample < cal.offset {
            cal.offset = sample;
        }
    }
    rq_clock.wrapping_add(cal.offset as u64)
}
