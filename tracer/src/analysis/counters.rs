//! Perf counter figures: IPC, MPKI and the rest, per thread, per process and per time bin.

use serde::Serialize;
use tracer_common::{PERF_SLOTS, PerfSlot};

use crate::recording::{Recording, counters::CounterTotals};

/// Counter values and the ratios derived from them. A field is null when its counter was not
/// measured (no PMU, not requested), never zero for "unknown".
#[derive(Debug, Clone, Default, PartialEq, Serialize, schemars::JsonSchema)]
pub struct CounterValues {
    pub cycles: Option<u64>,
    pub instructions: Option<u64>,
    pub llc_references: Option<u64>,
    pub llc_misses: Option<u64>,
    pub cpu_clock_ns: Option<u64>,
    pub context_switches: Option<u64>,
    pub cpu_migrations: Option<u64>,
    /// Instructions per cycle.
    pub ipc: Option<f64>,
    /// LLC misses per thousand instructions.
    pub mpki: Option<f64>,
    /// LLC misses per LLC reference.
    pub llc_miss_ratio: Option<f64>,
}

/// Instructions per cycle.
pub fn ipc(instructions: u64, cycles: u64) -> Option<f64> {
    (cycles > 0).then(|| instructions as f64 / cycles as f64)
}

/// Misses per thousand instructions.
pub fn mpki(misses: u64, instructions: u64) -> Option<f64> {
    (instructions > 0).then(|| misses as f64 * 1000.0 / instructions as f64)
}

impl CounterValues {
    /// From values by slot, of which the slots in `mask` were measured.
    pub fn from_slots(v: &[u64; PERF_SLOTS], mask: u32) -> Self {
        let get = |s: PerfSlot| (mask & (1 << s as u32) != 0).then(|| v[s as usize]);
        let cycles = get(PerfSlot::Cycles);
        let instructions = get(PerfSlot::Instructions);
        let llc_references = get(PerfSlot::LlcReferences);
        let llc_misses = get(PerfSlot::LlcMisses);
        Self {
            cycles,
            instructions,
            llc_references,
            llc_misses,
            cpu_clock_ns: get(PerfSlot::CpuClock),
            context_switches: get(PerfSlot::ContextSwitches),
            cpu_migrations: get(PerfSlot::CpuMigrations),
            ipc: instructions.zip(cycles).and_then(|(i, c)| ipc(i, c)),
            mpki: llc_misses.zip(instructions).and_then(|(m, i)| mpki(m, i)),
            llc_miss_ratio: llc_misses
                .zip(llc_references)
                .and_then(|(m, r)| (r > 0).then(|| m as f64 / r as f64)),
        }
    }
}

/// One thread's counters over the window.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct ThreadCounterSummary {
    #[serde(flatten)]
    pub values: CounterValues,
    /// Fraction of the time the hardware counters actually counted (running / enabled, the
    /// lowest over the hardware events). Below 1 the PMU was multiplexed and the values are
    /// extrapolated, as perf stat does.
    pub multiplexing_ratio: Option<f64>,
}

pub fn thread_summary(t: &CounterTotals, mask: u32) -> ThreadCounterSummary {
    let hardware = [
        PerfSlot::Cycles,
        PerfSlot::Instructions,
        PerfSlot::LlcReferences,
        PerfSlot::LlcMisses,
    ];
    let multiplexing_ratio = hardware
        .iter()
        .filter(|&&s| mask & (1 << s as u32) != 0 && t.enabled_ns[s as usize] > 0)
        .map(|&s| t.running_ns[s as usize] as f64 / t.enabled_ns[s as usize] as f64)
        .reduce(f64::min);
    ThreadCounterSummary {
        values: CounterValues::from_slots(&t.scaled, mask),
        multiplexing_ratio,
    }
}

/// Counter values in one time bin.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct CounterBin {
    pub start_ns: u64,
    #[serde(flatten)]
    pub values: CounterValues,
}

fn round(v: &[f64; PERF_SLOTS]) -> [u64; PERF_SLOTS] {
    v.map(|x| x.round() as u64)
}

/// The series of one thread, bins with activity only.
pub fn thread_series(rec: &Recording, tid: u32) -> Vec<CounterBin> {
    let Some(bins) = rec.counter_bins.threads.get(&tid) else {
        return vec![];
    };
    bins.iter()
        .map(|(&b, v)| CounterBin {
            start_ns: rec.counter_bins.start_ns + b * rec.counter_bins.bin_ns,
            values: CounterValues::from_slots(&round(v), rec.counter_mask),
        })
        .collect()
}

/// The process's series: all threads added up per bin.
pub fn process_series(rec: &Recording) -> Vec<CounterBin> {
    let mut sums: std::collections::BTreeMap<u64, [f64; PERF_SLOTS]> = Default::default();
    for bins in rec.counter_bins.threads.values() {
        for (&b, v) in bins {
            let cell = sums.entry(b).or_insert([0.0; PERF_SLOTS]);
            for (sum, x) in cell.iter_mut().zip(v) {
                *sum += x;
            }
        }
    }
    sums.iter()
        .map(|(&b, v)| CounterBin {
            start_ns: rec.counter_bins.start_ns + b * rec.counter_bins.bin_ns,
            values: CounterValues::from_slots(&round(v), rec.counter_mask),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios() {
        assert_eq!(ipc(3_000, 2_000), Some(1.5));
        assert_eq!(ipc(1, 0), None);
        assert_eq!(mpki(50, 100_000), Some(0.5));
        assert_eq!(mpki(5, 0), None);
    }

    #[test]
    fn unmeasured_slots_are_null_not_zero() {
        let v = [2_000, 3_000, 400, 100, 0, 0, 0];
        let hw = 0b1111;
        let c = CounterValues::from_slots(&v, hw);
        assert_eq!(c.ipc, Some(1.5));
        assert_eq!(c.mpki, Some(100.0 * 1000.0 / 3000.0));
        assert_eq!(c.llc_miss_ratio, Some(0.25));
        assert_eq!(c.cpu_clock_ns, None);
        // Without the LLC events: no MPKI, and it says so with null.
        let c = CounterValues::from_slots(&v, 0b0011);
        assert_eq!((c.llc_misses, c.mpki), (None, None));
        assert!(c.ipc.is_some());
        let c = CounterValues::from_slots(&v, 0);
        assert_eq!(c, CounterValues::default());
    }

    #[test]
    fn multiplexing_ratio_is_the_worst_hardware_event() {
        let t = CounterTotals {
            scaled: [200, 300, 0, 0, 0, 0, 0],
            raw: [100, 150, 0, 0, 0, 0, 0],
            enabled_ns: [1000, 1000, 0, 0, 1000, 0, 0],
            running_ns: [500, 800, 0, 0, 1000, 0, 0],
        };
        let s = thread_summary(&t, 0b1_0011);
        assert_eq!(s.multiplexing_ratio, Some(0.5));
        assert_eq!(s.values.cycles, Some(200));
        // Software slots only: no hardware event, no ratio.
        assert_eq!(thread_summary(&t, 0b1_0000).multiplexing_ratio, None);
    }
}
