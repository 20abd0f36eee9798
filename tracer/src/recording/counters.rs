//! Perf counters in the recording: per-thread totals from the kernel, and per-thread time bins
//! built from the per-slice deltas on the ring buffer.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tracer_common::{CounterSlice, PERF_SLOTS, PerfSlot, ThreadCounters};

/// A counter's name in the summary.
pub fn slot_name(slot: PerfSlot) -> &'static str {
    match slot {
        PerfSlot::Cycles => "cycles",
        PerfSlot::Instructions => "instructions",
        PerfSlot::LlcReferences => "llc_references",
        PerfSlot::LlcMisses => "llc_misses",
        PerfSlot::CpuClock => "cpu_clock_ns",
        PerfSlot::ContextSwitches => "context_switches",
        PerfSlot::CpuMigrations => "cpu_migrations",
    }
}

/// The names of the counters in `mask`, in slot order.
pub fn slot_names(mask: u32) -> Vec<&'static str> {
    PerfSlot::ALL
        .iter()
        .filter(|&&s| mask & (1 << s as u32) != 0)
        .map(|&s| slot_name(s))
        .collect()
}

/// One thread's totals, by `PerfSlot`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CounterTotals {
    /// Deltas scaled for multiplexing (enabled / running), as perf stat reports them.
    pub scaled: [u64; PERF_SLOTS],
    pub raw: [u64; PERF_SLOTS],
    /// Time the counters were enabled and running during the thread's slices (ns).
    pub enabled_ns: [u64; PERF_SLOTS],
    pub running_ns: [u64; PERF_SLOTS],
}

impl From<&ThreadCounters> for CounterTotals {
    fn from(c: &ThreadCounters) -> Self {
        Self {
            scaled: c.scaled,
            raw: c.raw,
            enabled_ns: c.enabled,
            running_ns: c.running,
        }
    }
}

/// At most this many bins over a recording: beyond it the bins are widened (doubled until it
/// fits), so that `--bin 1ns`, or a long `run`, cannot grow the recording without bound. At the
/// default 10 ms, 10,000 bins cover 100 s.
pub const MAX_BINS: u64 = 10_000;

/// Per-thread counter values in fixed-width time bins from the window start.
#[derive(Debug, Clone, Default)]
pub struct CounterBins {
    pub bin_ns: u64,
    /// The width asked for, when the bins had to be widened past it.
    pub widened_from_ns: Option<u64>,
    pub start_ns: u64,
    /// tid -> bin index -> values by slot.
    pub threads: BTreeMap<u32, BTreeMap<u64, [f64; PERF_SLOTS]>>,
}

/// Merges pairs of adjacent bins: the bins of twice the width.
pub fn widen<T: Copy>(bins: &mut BTreeMap<u64, T>, merge: impl Fn(&mut T, T)) {
    let old = std::mem::take(bins);
    for (b, v) in old {
        match bins.entry(b / 2) {
            std::collections::btree_map::Entry::Vacant(e) => {
                e.insert(v);
            }
            std::collections::btree_map::Entry::Occupied(mut e) => merge(e.get_mut(), v),
        }
    }
}

impl CounterBins {
    pub fn new(start_ns: u64, bin_ns: u64) -> Self {
        Self {
            bin_ns: bin_ns.max(1),
            widened_from_ns: None,
            start_ns,
            threads: BTreeMap::new(),
        }
    }

    /// The bin of time `t`, widening every bin first if `t` lies past `MAX_BINS` of them.
    pub fn bin_of(&mut self, t: u64) -> u64 {
        loop {
            let b = t.saturating_sub(self.start_ns) / self.bin_ns;
            if b < MAX_BINS {
                return b;
            }
            self.widened_from_ns.get_or_insert(self.bin_ns);
            self.bin_ns = self.bin_ns.saturating_mul(2);
            for bins in self.threads.values_mut() {
                widen(bins, |a, b| {
                    for (x, y) in a.iter_mut().zip(b) {
                        *x += y;
                    }
                });
            }
        }
    }

    /// Spreads a slice's deltas over the bins it overlaps, in proportion to the overlap: the
    /// counters are only known at the slice's ends, so a uniform rate in between is the least
    /// biased assumption.
    pub fn add(&mut self, s: &CounterSlice) {
        let start = s.start_ns.max(self.start_ns);
        let end = s.ts_ns;
        if end <= start || s.valid == 0 {
            return;
        }
        let len = (s.ts_ns - s.start_ns) as f64;
        let last = self.bin_of(end - 1);
        let first = (start - self.start_ns) / self.bin_ns;
        let bins = self.threads.entry(s.tid).or_default();
        for b in first..=last {
            let b_start = self.start_ns + b * self.bin_ns;
            let b_end = b_start + self.bin_ns;
            let overlap = (end.min(b_end) - start.max(b_start)) as f64;
            let share = overlap / len;
            let cell = bins.entry(b).or_insert([0.0; PERF_SLOTS]);
            for (k, v) in cell.iter_mut().enumerate() {
                if s.valid & (1 << k) != 0 {
                    *v += s.values[k] as f64 * share;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use tracer_common::EventKind;

    use super::*;

    fn slice(
        tid: u32,
        start: u64,
        end: u64,
        values: [u64; PERF_SLOTS],
        valid: u32,
    ) -> CounterSlice {
        CounterSlice {
            ts_ns: end,
            tid,
            kind: EventKind::CounterSlice as u32,
            cpu: 0,
            valid,
            start_ns: start,
            values,
        }
    }

    #[test]
    fn a_slice_is_spread_over_the_bins_it_overlaps() {
        let mut bins = CounterBins::new(1000, 100);
        // 1050..1250: a quarter in bin 0, half in bin 1, a quarter in bin 2.
        bins.add(&slice(7, 1050, 1250, [400, 800, 0, 0, 0, 0, 0], 0b11));
        let t = &bins.threads[&7];
        assert_eq!(t.len(), 3);
        assert_eq!(t[&0][0], 100.0);
        assert_eq!(t[&1][0], 200.0);
        assert_eq!(t[&2][1], 200.0);
        // Slot 2 was not measured: nothing was added for it.
        assert_eq!(t[&1][2], 0.0);
        let total: f64 = t.values().map(|v| v[1]).sum();
        assert_eq!(total, 800.0);
    }

    #[test]
    fn bins_are_widened_to_stay_within_the_limit() {
        // 1 ns bins over 3 * MAX_BINS ns: widened twice, to 4 ns.
        let mut bins = CounterBins::new(0, 1);
        bins.add(&slice(1, 0, 10, [10, 0, 0, 0, 0, 0, 0], 1));
        bins.add(&slice(1, 10, 3 * MAX_BINS, [300, 0, 0, 0, 0, 0, 0], 1));
        assert_eq!(bins.bin_ns, 4);
        assert_eq!(bins.widened_from_ns, Some(1));
        let t = &bins.threads[&1];
        assert!(t.len() as u64 <= MAX_BINS, "{}", t.len());
        let total: f64 = t.values().map(|v| v[0]).sum();
        assert!((total - 310.0).abs() < 1e-6, "{total}");
        // The first slice's 10 ns now fill bins 0 and 1 (and part of 2) of 4 ns each.
        assert!((t[&0][0] - 4.0).abs() < 1e-9, "{:?}", t[&0]);
    }

    #[test]
    fn the_part_before_the_window_is_dropped() {
        let mut bins = CounterBins::new(1000, 100);
        // Half of this slice precedes the window.
        bins.add(&slice(1, 900, 1100, [200, 0, 0, 0, 0, 0, 0], 1));
        assert_eq!(bins.threads[&1][&0][0], 100.0);
        bins.add(&slice(2, 500, 900, [200, 0, 0, 0, 0, 0, 0], 1));
        assert!(!bins.threads.contains_key(&2));
    }
}
