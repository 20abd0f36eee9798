//! Quantiles of run-queue waits: exact-ish from the timeline samples (HDR histogram, 2
//! significant digits) when every wait reached userspace, else from the kernel's log2 histogram.

use serde::Serialize;

use crate::recording::WaitSamples;

/// Where a thread's wait quantiles come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum QuantileSource {
    /// Every wait, from the timeline: within 1 %.
    Events,
    /// Some events were dropped: the kernel's log2 histogram, interpolated within a power of two.
    KernelLog2,
    /// No complete wait in the window.
    None,
}

/// The `q`-quantile (0..=1) of a log2 histogram whose slot `i` holds values in
/// `[2^(i-1), 2^i)` (slot 0: zero), interpolated linearly inside the slot and capped at `max`.
pub fn log2_quantile(hist: &[u32], q: f64, max: u64) -> Option<u64> {
    let total: u64 = hist.iter().map(|&c| c as u64).sum();
    if total == 0 {
        return None;
    }
    // The rank of the wanted sample, 1-based, as HDR histograms count it.
    let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
    let mut seen = 0u64;
    for (slot, &count) in hist.iter().enumerate() {
        let count = count as u64;
        if count == 0 {
            continue;
        }
        if seen + count >= rank {
            if slot == 0 {
                return Some(0);
            }
            let lo = 1u64 << (slot - 1);
            let hi = if slot >= 63 { u64::MAX } else { 1u64 << slot };
            let frac = (rank - seen) as f64 / count as f64;
            let value = lo as f64 + frac * (hi - lo) as f64;
            return Some((value as u64).min(max.max(lo)));
        }
        seen += count;
    }
    Some(max)
}

/// p50, p99 and the source, for a thread (or a merged set) with `complete_waits` waits known to
/// the kernel.
pub fn wait_quantiles(
    samples: &WaitSamples,
    log2: &[u32],
    complete_waits: u64,
    max: u64,
) -> (Option<u64>, Option<u64>, QuantileSource) {
    if complete_waits == 0 {
        return (None, None, QuantileSource::None);
    }
    if samples.len() == complete_waits {
        let q = |v: f64| Some(samples.value_at_quantile(v).min(max));
        return (q(0.50), q(0.99), QuantileSource::Events);
    }
    (
        log2_quantile(log2, 0.50, max),
        log2_quantile(log2, 0.99, max),
        QuantileSource::KernelLog2,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log2_quantile_interpolates_inside_a_slot() {
        // 100 waits all in slot 11: [1024, 2048).
        let mut hist = vec![0u32; 40];
        hist[11] = 100;
        assert_eq!(log2_quantile(&hist, 0.5, u64::MAX), Some(1024 + 512));
        assert_eq!(log2_quantile(&hist, 1.0, u64::MAX), Some(2048));
        // Capped at the true maximum the kernel recorded.
        assert_eq!(log2_quantile(&hist, 1.0, 1500), Some(1500));
    }

    #[test]
    fn log2_quantile_walks_slots() {
        let mut hist = vec![0u32; 40];
        hist[1] = 98; // the value 1
        hist[20] = 2; // [2^19, 2^20)
        assert_eq!(log2_quantile(&hist, 0.5, u64::MAX), Some(1));
        let p99 = log2_quantile(&hist, 0.99, u64::MAX).unwrap();
        assert!((1 << 19..=1 << 20).contains(&p99), "{p99}");
        assert_eq!(log2_quantile(&[0; 40], 0.5, 0), None);
    }

    #[test]
    fn samples_are_used_only_when_complete() {
        let mut s = WaitSamples::default();
        for v in 1..=100u64 {
            s.record(v * 1000);
        }
        let mut hist = vec![0u32; 40];
        hist[17] = 100;
        let (p50, p99, src) = wait_quantiles(&s, &hist, 100, 100_000);
        assert_eq!(src, QuantileSource::Events);
        let p50 = p50.unwrap();
        assert!((49_500..=50_500).contains(&p50), "{p50}");
        assert!((98_500..=100_000).contains(&p99.unwrap()));
        // One wait missing from the timeline: fall back to the kernel's histogram.
        let (_, _, src) = wait_quantiles(&s, &hist, 101, 100_000);
        assert_eq!(src, QuantileSource::KernelLog2);
        assert_eq!(wait_quantiles(&s, &hist, 0, 0).2, QuantileSource::None);
    }
}
