//! Latency logs (`--latencies`): JSON lines a server writes, one per request. Parsed a line at
//! a time, so that `attach` reads the whole file once at the end and `tracer watch` only what
//! the server appended since its last window (`cli::watch::latencies`), with the requests that
//! end in a later window held for it here.

use anyhow::{Context as _, Result, bail};
use serde::Deserialize;

use super::requests::{RequestSet, RequestSource, RequestSpan};

/// A line's fields; others (a server's own: path, status, model) are let be.
#[derive(Debug, Deserialize)]
struct LogLine {
    #[serde(default)]
    clock: Option<String>,
    #[serde(default)]
    start_ns: Option<u64>,
    #[serde(default)]
    end_ns: Option<u64>,
    #[serde(default)]
    tid: Option<u32>,
    #[serde(default)]
    id: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Clock {
    #[default]
    Monotonic,
    Realtime,
}

fn parse_clock(s: &str) -> Result<Clock> {
    match s {
        "monotonic" => Ok(Clock::Monotonic),
        "realtime" => Ok(Clock::Realtime),
        other => bail!("unknown clock {other:?}: write \"monotonic\" or \"realtime\""),
    }
}

/// What a latency log carries from line to line: the clock its last `{"clock": ..}` line named
/// (monotonic until one does; a request line may also carry its own), and the line number, for
/// the messages.
#[derive(Debug, Default)]
pub struct LogParser {
    clock: Clock,
    line: u64,
}

impl LogParser {
    /// A new file at the log's path (it was rotated): numbered from 1, on its own clock.
    pub fn restart(&mut self) {
        *self = Self::default();
    }

    /// The next line, without its newline: a request, as a span on CLOCK_MONOTONIC (realtime
    /// times moved with `realtime_minus_monotonic_ns`, measured while recording), or none for
    /// a blank line or one that names the clock.
    pub fn line(
        &mut self,
        line: &str,
        realtime_minus_monotonic_ns: i64,
    ) -> Result<Option<RequestSpan>> {
        self.line += 1;
        let n = self.line;
        // A file written by a Windows-minded tool may begin with a byte-order mark.
        let line = if n == 1 {
            line.trim_start_matches('\u{feff}')
        } else {
            line
        };
        let line = line.trim();
        if line.is_empty() {
            return Ok(None);
        }
        let l: LogLine = serde_json::from_str(line).with_context(|| {
            format!(
                "line {n}: not a latency record ({line:.80}); each line must be \
                 {{\"start_ns\": N, \"end_ns\": N, \"tid\": N}} or {{\"clock\": \"realtime\"}}"
            )
        })?;
        let line_clock = match &l.clock {
            Some(c) => parse_clock(c).with_context(|| format!("line {n}"))?,
            None => self.clock,
        };
        let (Some(s), Some(e)) = (l.start_ns, l.end_ns) else {
            if l.clock.is_some() && l.start_ns.is_none() && l.end_ns.is_none() {
                self.clock = line_clock;
                return Ok(None);
            }
            bail!("line {n}: a request needs both start_ns and end_ns");
        };
        let Some(tid) = l.tid else {
            bail!(
                "line {n}: no \"tid\": the thread that served the request is needed to \
                 decompose its time (gettid() in the server)"
            );
        };
        if e < s {
            bail!("line {n}: end_ns {e} is before start_ns {s}");
        }
        let to_mono = |t: u64| -> u64 {
            match line_clock {
                Clock::Monotonic => t,
                Clock::Realtime => (t as i128 - realtime_minus_monotonic_ns as i128).max(0) as u64,
            }
        };
        Ok(Some(RequestSpan {
            start_ns: to_mono(s),
            end_ns: to_mono(e),
            tid,
            id: l.id,
        }))
    }

    /// A line written before a watch began: no window's, so only a line that may name the
    /// clock is parsed (it holds for the lines after it), and a bad one is no window's error.
    pub fn skip(&mut self, line: &str) {
        if line.contains("\"clock\"") {
            let _ = self.line(line, 0);
        } else {
            self.line += 1;
        }
    }
}

/// Whether a last line that has no newline yet is a whole record (a writer that ends its lines
/// late), not one a buffered writer is still in the middle of.
pub fn is_whole_record(line: &str) -> bool {
    serde_json::from_str::<serde::de::IgnoredAny>(line).is_ok()
}

/// Parses a whole latency log (see `LogParser`) for the window `[start, end]`: requests not
/// wholly inside it are counted, not kept.
pub fn parse_latency_log(
    text: &str,
    realtime_minus_monotonic_ns: i64,
    window: (u64, u64),
) -> Result<RequestSet> {
    let (set, malformed) = parse_latency_log_lenient(text, realtime_minus_monotonic_ns, window)?;
    match malformed {
        Some((_, first)) => Err(first),
        None => Ok(set),
    }
}

/// `parse_latency_log`, where a malformed request line costs that line, as in a watch: the
/// requests, and how many lines were left out with the first one's error. A line naming a
/// clock the tool does not know is still an error (the lines after it would be read on the
/// wrong clock), and so is a log of which no line is a request (not a latency log at all).
pub fn parse_latency_log_lenient(
    text: &str,
    realtime_minus_monotonic_ns: i64,
    window: (u64, u64),
) -> Result<(RequestSet, Option<(u64, anyhow::Error)>)> {
    let mut parser = LogParser::default();
    let mut spans = Vec::new();
    let mut malformed: Option<(u64, anyhow::Error)> = None;
    for line in text.lines() {
        match parser.line(line, realtime_minus_monotonic_ns) {
            Ok(span) => spans.extend(span),
            Err(e) if line.contains("\"clock\"") => return Err(e),
            Err(e) => match &mut malformed {
                Some((n, _)) => *n += 1,
                None => malformed = Some((1, e)),
            },
        }
    }
    if spans.is_empty()
        && let Some((_, first)) = malformed
    {
        return Err(first.context("no line of the log is a request"));
    }
    let (inside, outside): (Vec<_>, Vec<_>) = spans
        .into_iter()
        .partition(|s| s.start_ns >= window.0 && s.end_ns <= window.1);
    if inside.is_empty() && !outside.is_empty() {
        bail!(
            "none of the {} requests in the log lies inside the recording's window; check that \
             the log's clock is the one its \"clock\" line states",
            outside.len()
        );
    }
    Ok((set(inside, outside.len() as u64), malformed))
}

/// Moves a log's thread IDs to the kernel's, where the tool runs in a PID namespace of its own
/// (`ns`, the recording's): a server there logs the IDs gettid() gives it, which are the
/// namespace's, while the recording names threads by the kernel's.
pub fn to_kernel_tids(set: &mut RequestSet, ns: Option<&super::PidNamespaceIds>) {
    let Some(ns) = ns else { return };
    let kernel: std::collections::HashMap<u32, u32> =
        ns.ids.iter().map(|(&k, &n)| (n, k)).collect();
    for s in &mut set.spans {
        if let Some(&k) = kernel.get(&s.tid) {
            s.tid = k;
        }
    }
}

fn set(mut spans: Vec<RequestSpan>, unpaired: u64) -> RequestSet {
    spans.sort_by_key(|s| s.end_ns);
    RequestSet {
        source: RequestSource::File,
        spans,
        unpaired,
    }
}

/// No request read at `now` can have ended later than this after it: the server writes a
/// request once it has ended. The slack covers a realtime log's conversion (the offset is
/// measured once per window, and NTP may slew the clock meanwhile).
const FUTURE_SLACK_NS: u64 = 1_000_000_000;

/// Requests read from a log that grows while a watch runs, each waiting for the window it ends
/// in: a window is read a moment after it closed, by when the server may have logged requests
/// of the next one.
#[derive(Debug, Default)]
pub struct PendingSpans {
    spans: Vec<RequestSpan>,
    /// The start of the window taken last: a request that began before it spans three
    /// windows or more, and is no window's to decompose. None before the first: a request
    /// that ended before the window is from before the watch (logged while the probes were
    /// attached), no window's to count.
    last_start: Option<u64>,
}

impl PendingSpans {
    pub fn push(&mut self, span: RequestSpan) {
        self.spans.push(span);
    }

    /// The requests of the window `[start, end]`, with the log read up to `now`
    /// (CLOCK_MONOTONIC): those that ended in it, some begun in the window before (the
    /// analysis decomposes their earlier part there). Those that began earlier still (or
    /// before the watch), ended before the window (written late) or end after `now` (another
    /// clock) are counted as unpaired; those that end after the window wait for the next. A
    /// window with none of its own but some written late or on another clock is an error that
    /// says which: its requests are not what the log holds.
    pub fn take(&mut self, (start, end): (u64, u64), now: u64) -> Result<RequestSet> {
        let (mut inside, mut late, mut future, mut early) = (Vec::new(), 0u64, 0u64, 0u64);
        let from = self.last_start.unwrap_or(start);
        let begun = self.last_start.is_some();
        self.spans.retain(|s| {
            if s.end_ns > now.saturating_add(FUTURE_SLACK_NS) {
                future += 1;
            } else if s.end_ns > end {
                return true;
            } else if s.end_ns < start {
                late += u64::from(begun);
            } else if s.start_ns < from {
                early += 1;
            } else {
                inside.push(*s);
            }
            false
        });
        self.last_start = Some(start);
        if inside.is_empty() && future > 0 {
            bail!(
                "the {future} requests read for this window end after the time they were read: \
                 check that the log's clock is the one its \"clock\" line states"
            );
        }
        if inside.is_empty() && late > 0 {
            bail!(
                "the {late} requests read for this window all ended before it began: the server \
                 writes its log late (flush it after each request) or on another clock than its \
                 \"clock\" line states"
            );
        }
        Ok(set(inside, late + future + early))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_logs_parse_and_convert_clocks() {
        let text = "\n{\"start_ns\": 100, \"end_ns\": 200, \"tid\": 5}\n\
                    {\"clock\": \"realtime\"}\n\
                    {\"start_ns\": 1100, \"end_ns\": 1300, \"tid\": 6, \"id\": 3}\n\
                    {\"start_ns\": 9000, \"end_ns\": 9100, \"tid\": 6}\n";
        let set = parse_latency_log(text, 1000, (0, 1000)).unwrap();
        assert_eq!(set.spans.len(), 2);
        assert_eq!((set.spans[1].start_ns, set.spans[1].end_ns), (100, 300));
        assert_eq!(set.spans[1].id, Some(3));
        assert_eq!(set.unpaired, 1);
        // A byte-order mark, and fields of the server's own.
        let text = "\u{feff}{\"start_ns\": 1, \"end_ns\": 2, \"tid\": 5, \"path\": \"/v1\"}\n";
        assert_eq!(parse_latency_log(text, 0, (0, 10)).unwrap().spans.len(), 1);
    }

    #[test]
    fn bad_latency_logs_say_what_is_wrong() {
        let err = |t: &str| format!("{:#}", parse_latency_log(t, 0, (0, 1000)).unwrap_err());
        assert!(err("{\"start_ns\": 1, \"end_ns\": 2}").contains("tid"));
        assert!(err("{\"start_ns\": 5, \"end_ns\": 2, \"tid\": 1}").contains("before"));
        assert!(err("\ngarbage").contains("line 2"));
        assert!(err("{\"clock\": \"tai\"}").contains("unknown clock"));
        assert!(err("{\"start_ns\": 5000, \"end_ns\": 6000, \"tid\": 1}").contains("window"));
    }

    /// Leniently, a malformed request line costs itself; an unknown clock, or a file with no
    /// request at all, is still an error.
    #[test]
    fn a_malformed_line_costs_only_itself() {
        let text = "{\"start_ns\": 1, \"end_ns\": 2, \"tid\": 5}\n\
                    garbage\n{\"start_ns\": 9, \"end_ns\": 3, \"tid\": 5}\n\
                    {\"start_ns\": 4, \"end_ns\": 6, \"tid\": 5}\n";
        let (set, malformed) = parse_latency_log_lenient(text, 0, (0, 10)).unwrap();
        assert_eq!(set.spans.len(), 2);
        let (n, first) = malformed.unwrap();
        assert_eq!(n, 2);
        assert!(format!("{first:#}").contains("line 2"), "{first:#}");
        let err = |t: &str| {
            format!(
                "{:#}",
                parse_latency_log_lenient(t, 0, (0, 10)).unwrap_err()
            )
        };
        assert!(err("garbage\nmore\n").contains("no line of the log is a request"));
        let clock = "{\"start_ns\": 1, \"end_ns\": 2, \"tid\": 5}\n{\"clock\": \"tai\"}\n";
        assert!(err(clock).contains("unknown clock"));
    }

    /// Lines skipped as history still set the clock and count toward the line numbers.
    #[test]
    fn history_keeps_the_clock_and_the_line_numbers() {
        let mut p = LogParser::default();
        for l in ["garbage", "{\"clock\": \"realtime\"}", "{\"start_ns\": 1}"] {
            p.skip(l);
        }
        let span = p.line(r#"{"start_ns": 1500, "end_ns": 1700, "tid": 2}"#, 1000);
        assert_eq!(span.unwrap().unwrap().start_ns, 500);
        let e = p.line("nope", 0).unwrap_err();
        assert!(format!("{e:#}").starts_with("line 5:"), "{e:#}");
        p.restart();
        let span = p.line(r#"{"start_ns": 1500, "end_ns": 1700, "tid": 2}"#, 1000);
        assert_eq!(
            span.unwrap().unwrap().start_ns,
            1500,
            "a new file's own clock"
        );
    }

    fn span(start_ns: u64, end_ns: u64) -> RequestSpan {
        RequestSpan {
            start_ns,
            end_ns,
            tid: 1,
            id: None,
        }
    }

    /// Each request read goes to exactly one window, or is counted once as unpaired: the one
    /// that ends after the window waits for the next, one across its start is the window's it
    /// ends in; one written late and one from the future are counted.
    #[test]
    fn each_request_goes_to_the_window_it_ends_in() {
        let mut p = PendingSpans::default();
        // The first is from before the watch.
        for s in [
            span(500, 800),
            span(1_000, 1_500),
            span(1_900, 2_500),
            span(2_100, 2_200),
        ] {
            p.push(s);
        }
        let w1 = p.take((1_000, 2_000), 2_600).unwrap();
        assert_eq!((w1.spans.len(), w1.unpaired), (1, 0));
        // Read for the second window: a late one of the first, and one 2 s in the future.
        for s in [
            span(1_100, 1_200),
            span(2_300, 2_900),
            span(3_000, 2_000_004_000),
        ] {
            p.push(s);
        }
        let w2 = p.take((2_000, 3_000), 3_100).unwrap();
        let got: Vec<_> = w2.spans.iter().map(|s| s.start_ns).collect();
        // Across the edge (1_900) too: the analysis decomposes it on both windows.
        assert_eq!(got, vec![2_100, 1_900, 2_300]);
        // Written late (1_100), from the future.
        assert_eq!(w2.unpaired, 2);
        // Begun two windows back: no window's.
        p.push(span(1_500, 3_500));
        assert_eq!(p.take((3_000, 4_000), 4_100).unwrap().unpaired, 1);
        assert!(p.spans.is_empty());
        // A window with nothing of its own but requests written late says so.
        p.push(span(3_500, 3_600));
        let e = p.take((4_000, 5_000), 5_100).unwrap_err();
        assert!(format!("{e}").contains("ended before it began"), "{e}");
        // An empty window is no error: the server had no requests.
        assert_eq!(p.take((5_000, 6_000), 6_100).unwrap().spans.len(), 0);
    }

    /// A tool in a PID namespace of its own reads the namespace's thread IDs from the log and
    /// names them as the kernel does; an ID it has no mapping for stays.
    #[test]
    fn namespace_thread_ids_become_the_kernels() {
        let mut set = parse_latency_log(
            "{\"start_ns\": 1, \"end_ns\": 2, \"tid\": 7}\n{\"start_ns\": 3, \"end_ns\": 4, \"tid\": 9}\n",
            0,
            (0, 10),
        )
        .unwrap();
        let ns = super::super::PidNamespaceIds {
            inode: 1,
            ids: [(4007, 7)].into_iter().collect(),
        };
        to_kernel_tids(&mut set, Some(&ns));
        let tids: Vec<u32> = set.spans.iter().map(|s| s.tid).collect();
        assert_eq!(tids, vec![4007, 9]);
    }
}
