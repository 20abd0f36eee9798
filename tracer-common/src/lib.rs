//! Types shared by the eBPF programs (`tracer-ebpf`) and the userspace loader (`tracer`).
//!
//! Every type here crosses the kernel/user boundary as raw bytes, so each is `#[repr(C)]`,
//! `Copy`, built from fixed-width integers only (no `bool`, `usize` or pointers), with its
//! padding spelled out. Userspace decodes them with `read_unaligned` after a length check and
//! turns the `u32` kinds into enums with `TryFrom`, never with a transmute.
#![no_std]

mod config;
mod counters;
mod records;
mod sched;
mod uprobes;

pub use config::*;
pub use counters::*;
pub use records::*;
pub use sched::*;
pub use uprobes::*;

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all of these are repr(C), Copy, made of integers with explicit padding, and valid
    // for any bit pattern.
    unsafe impl aya::Pod for super::ThreadStats {}
    unsafe impl aya::Pod for super::Preemptor {}
    unsafe impl aya::Pod for super::CpuWait {}
    unsafe impl aya::Pod for super::MigrationKey {}
    unsafe impl aya::Pod for super::WakerKey {}
    unsafe impl aya::Pod for super::WakerStats {}
    unsafe impl aya::Pod for super::Event {}
    unsafe impl aya::Pod for super::Config {}
    unsafe impl aya::Pod for super::ThreadCounters {}
    unsafe impl aya::Pod for super::CounterReading {}
    unsafe impl aya::Pod for super::CounterSlice {}
    unsafe impl aya::Pod for super::CudaThread {}
    unsafe impl aya::Pod for super::PidNsIds {}
    unsafe impl aya::Pod for super::ChildProcess {}
    unsafe impl aya::Pod for super::BatchBuf {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_have_no_hidden_padding() {
        // The kernel and userspace agree on these sizes only if no implicit padding creeps in.
        assert_eq!(core::mem::size_of::<Event>(), 32);
        assert_eq!(core::mem::size_of::<CpuWait>(), 40);
        assert_eq!(core::mem::size_of::<MigrationKey>(), 16);
        assert_eq!(core::mem::size_of::<Preemptor>(), 56);
        assert_eq!(core::mem::size_of::<ChildProcess>(), 32);
        assert_eq!(
            core::mem::size_of::<ThreadStats>(),
            4 + 4
                + 16
                + 4
                + 4
                + 8 * 22
                + 4
                + 4
                + 4 * 4
                + 4 * RUNQ_HIST_SLOTS
                + 4 * 4
                + 16
                + core::mem::size_of::<WakerRun>()
        );
        assert_eq!(
            core::mem::size_of::<WakerRun>(),
            8 + core::mem::size_of::<WakerStats>()
        );
        assert_eq!(core::mem::size_of::<WakerKey>(), 16);
        assert_eq!(
            core::mem::size_of::<WakerStats>(),
            4 + 4 + 16 + 8 * 3 + 4 * RUNQ_HIST_SLOTS
        );
        assert_eq!(core::mem::size_of::<Config>(), 55 * 4);
        assert_eq!(core::mem::size_of::<BatchBuf>(), 16 + BATCH_BYTES);
        assert_eq!(core::mem::size_of::<CounterSlice>(), 32 + 8 * PERF_SLOTS);
        assert_eq!(core::mem::size_of::<CudaThread>(), 72);
        assert_eq!(
            core::mem::size_of::<ThreadCounters>(),
            16 + 24 * PERF_SLOTS + 4 * 8 * PERF_SLOTS
        );
    }

    #[test]
    fn hist_slots_are_log2() {
        assert_eq!(hist_slot(0), 0);
        assert_eq!(hist_slot(1), 1);
        assert_eq!(hist_slot(2), 2);
        assert_eq!(hist_slot(3), 2);
        assert_eq!(hist_slot(1023), 10);
        assert_eq!(hist_slot(1024), 11);
        assert_eq!(hist_slot(u64::MAX), RUNQ_HIST_SLOTS - 1);
    }

    #[test]
    fn multiplexed_counts_are_extrapolated() {
        // Counted a quarter of the time: four times the raw count.
        assert_eq!(scale_for_multiplexing(1_000, 4_000, 1_000), 4_000);
        // Never multiplexed, or never running: the raw count.
        assert_eq!(scale_for_multiplexing(1_000, 4_000, 4_000), 1_000);
        assert_eq!(scale_for_multiplexing(0, 4_000, 0), 0);
        // A 10 ms slice at 5 GHz, counted half the time.
        assert_eq!(
            scale_for_multiplexing(25_000_000, 10_000_000, 5_000_000),
            50_000_000
        );
        // A 100 s slice (enabled over 2^32 ns) at 5 GHz, counted 3/4 of the time: within
        // a part per million of the exact value.
        let (delta, enabled, running) = (375_000_000_000u64, 100_000_000_000, 75_000_000_000);
        let exact = (delta as u128 * enabled as u128 / running as u128) as u64;
        let got = scale_for_multiplexing(delta, enabled, running);
        assert!(got.abs_diff(exact) <= exact / 1_000_000, "{got} vs {exact}");
        // Low rates (a few LLC misses) are not rounded away.
        assert_eq!(scale_for_multiplexing(3, 1_000_000, 500_000), 6);
    }

    #[test]
    fn kinds_round_trip_and_reject_unknown() {
        for k in 1..=15u32 {
            assert_eq!(EventKind::try_from(k).map(|e| e as u32), Ok(k));
        }
        assert_eq!(EventKind::try_from(0), Err(0));
        assert_eq!(EventKind::try_from(16), Err(16));
        for f in CudaFn::ALL {
            assert_eq!(CudaFn::try_from(f as u32), Ok(f));
        }
        assert!(CudaFn::try_from(CudaFn::ALL.len() as u32).is_err());
        assert_eq!(ThreadState::try_from(6), Err(6));
    }
}
