//! One thread's run-queue waits, as individual samples from the timeline, for exact-ish
//! quantiles (analysis/quantiles.rs).
//!
//! The HDR histogram (1 ns to 2^40 ns at 2 significant digits) is 4,352 counters, 34 KiB, per
//! thread, and a recording of a process with 20,000 threads held two of them per thread (one
//! in the record, a fresh one left in the collector): 1.4 GB, although most threads of such a
//! process wait a few times in a window. So the values themselves are kept until they would
//! take as much room as the histogram; only then is the histogram made. Both give the same
//! quantiles.

use std::sync::LazyLock;

use hdrhistogram::Histogram;

/// Most values kept one by one: 32 KiB, less than one histogram.
const MAX_VALUES: usize = 4096;
/// The histogram's highest value: about 18 minutes.
const HIGH: u64 = 1 << 40;

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, HIGH, 2).expect("static histogram bounds")
}

/// An empty histogram of the shape every thread's has: the precision the kept values are
/// reported at.
static SHAPE: LazyLock<Histogram<u64>> = LazyLock::new(histogram);

#[derive(Debug, Clone, Default)]
pub struct WaitSamples {
    /// The samples, while there are at most `MAX_VALUES` and no histogram.
    values: Vec<u64>,
    hist: Option<Box<Histogram<u64>>>,
}

impl WaitSamples {
    pub fn record(&mut self, ns: u64) {
        // What the histogram records for a value outside its range.
        let ns = ns.clamp(1, HIGH);
        match &mut self.hist {
            Some(h) => h.saturating_record(ns),
            None if self.values.len() < MAX_VALUES => self.values.push(ns),
            None => self.histogram_mut().saturating_record(ns),
        }
    }

    pub fn len(&self) -> u64 {
        self.hist
            .as_ref()
            .map_or(self.values.len() as u64, |h| h.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Adds `other`'s samples to these.
    pub fn merge(&mut self, other: &WaitSamples) {
        match &other.hist {
            Some(h) => {
                // Same bounds on both sides: adding cannot fail.
                let _ = self.histogram_mut().add(h.as_ref());
            }
            None => other.values.iter().for_each(|&v| self.record(v)),
        }
    }

    /// The value at quantile `q` (0..=1) as the histogram gives it: the sample of that rank,
    /// reported as the highest value equivalent to it at 2 significant digits. 0 when empty.
    pub fn value_at_quantile(&self, q: f64) -> u64 {
        if let Some(h) = &self.hist {
            return h.value_at_quantile(q);
        }
        let n = self.values.len();
        if n == 0 {
            return 0;
        }
        // The rank HdrHistogram counts to (`value_at_quantile`): ceil(q * n), at least 1.
        let rank = ((q.min(1.0) * n as f64).ceil() as usize).clamp(1, n);
        let mut v = self.values.clone();
        let (_, &mut x, _) = v.select_nth_unstable(rank - 1);
        if q == 0.0 {
            SHAPE.lowest_equivalent(x)
        } else {
            SHAPE.highest_equivalent(x)
        }
    }

    /// The histogram, made from the values kept so far if there is none yet.
    fn histogram_mut(&mut self) -> &mut Histogram<u64> {
        let values = std::mem::take(&mut self.values);
        self.hist.get_or_insert_with(|| {
            let mut h = Box::new(histogram());
            values.iter().for_each(|&v| h.saturating_record(v));
            h
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a plain histogram of the same shape says, for comparison.
    fn reference(values: &[u64]) -> Histogram<u64> {
        let mut h = histogram();
        values.iter().for_each(|&v| h.saturating_record(v.max(1)));
        h
    }

    fn values(n: u64) -> Vec<u64> {
        // Spread over five decades, not in order, some equal.
        (0..n)
            .map(|i| (i * 7919 % 1000 + 1) * 10u64.pow((i % 5) as u32))
            .collect()
    }

    #[test]
    fn few_waits_keep_no_histogram() {
        let mut s = WaitSamples::default();
        for v in values(3) {
            s.record(v);
        }
        assert!(s.hist.is_none(), "3 waits made a 34 KiB histogram");
        assert_eq!(s.len(), 3);
        // Taking the samples out of the collector leaves an empty value, not a new histogram.
        assert!(std::mem::take(&mut s).hist.is_none());
        assert!(s.hist.is_none() && s.values.capacity() == 0);
    }

    #[test]
    fn quantiles_are_the_histograms_before_and_after_it_is_made() {
        for n in [
            1,
            2,
            3,
            10,
            99,
            1000,
            MAX_VALUES as u64,
            MAX_VALUES as u64 + 1,
            9000,
        ] {
            let vals = values(n);
            let mut s = WaitSamples::default();
            vals.iter().for_each(|&v| s.record(v));
            assert_eq!(s.hist.is_some(), n > MAX_VALUES as u64, "{n}");
            let h = reference(&vals);
            for q in [0.0, 0.01, 0.5, 0.9, 0.99, 0.999, 1.0] {
                assert_eq!(
                    s.value_at_quantile(q),
                    h.value_at_quantile(q),
                    "n={n} q={q}"
                );
            }
            assert_eq!(s.len(), h.len());
        }
        assert_eq!(WaitSamples::default().value_at_quantile(0.5), 0);
    }

    #[test]
    fn merging_adds_every_sample() {
        let (a, b) = (values(3000), values(2000));
        let mut merged = WaitSamples::default();
        for part in [&a, &b] {
            let mut s = WaitSamples::default();
            part.iter().for_each(|&v| s.record(v));
            merged.merge(&s);
        }
        // And a thread that already had a histogram.
        let big = values(5000);
        let mut s = WaitSamples::default();
        big.iter().for_each(|&v| s.record(v));
        merged.merge(&s);
        let all: Vec<u64> = a.iter().chain(&b).chain(&big).copied().collect();
        let h = reference(&all);
        assert_eq!(merged.len(), h.len());
        for q in [0.5, 0.99] {
            assert_eq!(merged.value_at_quantile(q), h.value_at_quantile(q));
        }
    }
}
