//! How numbers are shown to a person, in one style everywhere: the text summary, the verdict's
//! sentences, notices and errors (the JSON carries the raw numbers). A value and its unit with
//! no space between, to three significant digits: "850ns", "12.3µs", "4.50ms", "1.23s";
//! "85%", "4.2%"; "42.7MB". Before, four formatters disagreed ("15 us" beside "14.6µs", "85 %"
//! beside "12.3%" in one summary). Imports nothing of the crate: every layer may use it.

use std::time::Duration;

/// Three significant digits of `v` (at least 1), no more decimals than that needs.
fn sig3(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// A duration in nanoseconds: "850ns", "12.3µs", "4.50ms", "1.23s", "125s".
pub fn dur(ns: u64) -> String {
    dur_f(ns as f64)
}

/// The same for a mean or an estimate.
pub fn dur_f(ns: f64) -> String {
    let ns = ns.max(0.0);
    // Rounding can carry a value into the next unit ("999.6µs" is "1.00ms").
    if ns < 999.5 {
        format!("{ns:.0}ns")
    } else if ns < 999_500.0 {
        format!("{}µs", sig3(ns / 1e3))
    } else if ns < 999_500_000.0 {
        format!("{}ms", sig3(ns / 1e6))
    } else {
        format!("{}s", sig3(ns / 1e9))
    }
}

/// An optional duration, "-" when absent (a table cell).
pub fn opt_dur(ns: Option<u64>) -> String {
    ns.map_or_else(|| "-".into(), dur)
}

/// A share (0.0 to 1.0) as a percentage: "85%", "4.2%", "0.0%".
pub fn pct(share: f64) -> String {
    let p = share * 100.0;
    if p.abs() >= 9.95 {
        format!("{p:.0}%")
    } else {
        format!("{p:.1}%")
    }
}

/// A size in bytes: "512B", "4.00kB", "42.7MB", "1.51GB" (decimal units, as `ps` and the
/// kernel's meminfo do not agree on binary ones).
pub fn size(bytes: u64) -> String {
    let b = bytes as f64;
    if bytes < 1000 {
        format!("{bytes}B")
    } else if b < 999_500.0 {
        format!("{}kB", sig3(b / 1e3))
    } else if b < 999_500_000.0 {
        format!("{}MB", sig3(b / 1e6))
    } else {
        format!("{}GB", sig3(b / 1e9))
    }
}

/// A duration as a person gave it: "10s", "1.5s", "250ms".
pub fn given(d: Duration) -> String {
    let ms = d.as_millis();
    if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else if ms >= 1000 {
        format!("{:.1}s", d.as_secs_f64())
    } else {
        format!("{ms}ms")
    }
}

/// A duration on the command line: seconds ("1.5") or with a unit ("500ms", "2m"); more than
/// zero and at most a day.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = if let Ok(secs) = s.parse::<f64>() {
        if !secs.is_finite() || secs < 0.0 {
            return Err(format!("invalid duration {s:?}"));
        }
        // Checked before converting: `Duration::from_secs_f64` panics past u64 seconds.
        Duration::try_from_secs_f64(secs).map_err(|_| "the duration must be at most 24h")?
    } else {
        humantime::parse_duration(s)
            .map_err(|e| format!("invalid duration {s:?} ({e}); write e.g. 10s, 500ms, 2m"))?
    };
    if d.is_zero() {
        return Err("the duration must be longer than zero".into());
    }
    if d > Duration::from_secs(24 * 3600) {
        return Err("the duration must be at most 24h".into());
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_have_three_significant_digits_and_carry_into_the_next_unit() {
        assert_eq!(dur(850), "850ns");
        assert_eq!(dur(15_000), "15.0µs");
        assert_eq!(dur(14_600), "14.6µs");
        assert_eq!(dur(4_500_000), "4.50ms");
        assert_eq!(dur(1_234_000_000), "1.23s");
        assert_eq!(dur(999_600), "1.00ms");
        assert_eq!(dur(125_000_000_000), "125s");
        assert_eq!(opt_dur(None), "-");
    }

    #[test]
    fn shares_and_sizes() {
        assert_eq!(pct(0.85), "85%");
        assert_eq!(pct(0.123), "12%");
        assert_eq!(pct(0.042), "4.2%");
        assert_eq!(pct(0.0), "0.0%");
        assert_eq!(pct(1.0), "100%");
        assert_eq!(size(42_700_000), "42.7MB");
        assert_eq!(size(512), "512B");
        assert_eq!(size(1_514_600_000), "1.51GB");
    }

    #[test]
    fn durations_given_and_parsed() {
        assert_eq!(given(Duration::from_secs(10)), "10s");
        assert_eq!(given(Duration::from_millis(1500)), "1.5s");
        assert_eq!(given(Duration::from_millis(250)), "250ms");
        assert!(parse_duration("0").is_err());
    }

    #[test]
    fn durations_on_the_command_line() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("-1").is_err());
        assert!(parse_duration("ten").is_err());
        assert!(parse_duration("25h").is_err());
        // Past what a Duration holds: an error, not a panic.
        assert!(parse_duration("1e300").is_err());
        assert!(parse_duration("99999999999999999999y").is_err());
    }
}
