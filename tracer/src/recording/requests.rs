//! Requests of the target: from its marker functions (uprobes, paired here) or from a latency
//! log it wrote (parsed in `latency_log.rs`, read from its file by `sources::latency_log`). Either way, spans on CLOCK_MONOTONIC with the
//! thread that finished each request.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use tracer_common::{Event, EventKind};

/// One request: its start and end on CLOCK_MONOTONIC and the thread that served it (the one
/// that ended it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestSpan {
    pub start_ns: u64,
    pub end_ns: u64,
    pub tid: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<u64>,
}

impl RequestSpan {
    pub fn wall_ns(&self) -> u64 {
        self.end_ns.saturating_sub(self.start_ns)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RequestSource {
    /// Uprobes on the target's request-start and request-end functions.
    Markers,
    /// A latency log given with --latencies.
    File,
}

/// The requests of a recording, and those that could not be used. A trace file's final frame
/// holds them when they came from a latency log (`Recording::requests`); from markers they are
/// rebuilt from its records.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RequestSet {
    pub source: RequestSource,
    /// Requests that ended in the window, in order of their end: begun in it, or (a watch's)
    /// in the window before.
    pub spans: Vec<RequestSpan>,
    /// Ends without a start (begun before the recording, or more than a window back) and
    /// starts without an end (still in flight at its close); from a file, requests not wholly
    /// inside the window (a watch's: not begun in it or the one before), or written late.
    pub unpaired: u64,
}

impl RequestSet {
    /// From a latency log, not markers.
    pub fn from_log(&self) -> bool {
        self.source == RequestSource::File
    }
}

/// Whether a recording's requests are left out of its serialized form: none, or from markers,
/// which the records carry.
pub fn rebuilt(set: &Option<RequestSet>) -> bool {
    !set.as_ref().is_some_and(RequestSet::from_log)
}

/// Starts not yet ended: by request id, and by thread (innermost last).
pub type Open = (HashMap<u64, u64>, HashMap<u32, Vec<u64>>);

/// Pairs marker calls into requests: by request id when the markers carry one (a request may
/// start on one thread and end on another), else per thread, the innermost open start.
#[derive(Debug, Default)]
pub struct Pairing {
    by_id: HashMap<u64, u64>,
    by_thread: HashMap<u32, Vec<u64>>,
    pub spans: Vec<RequestSpan>,
    /// Ends without a start (thread, id, time): begun before the recording, or in the window
    /// before, whose starts `adopt` brings.
    orphans: Vec<(u32, Option<u64>, u64)>,
    /// Any marker call was seen.
    pub seen: bool,
}

impl Pairing {
    pub fn on_event(&mut self, ev: &Event) {
        let has_id = ev.aux == 1;
        match ev.event_kind() {
            Ok(EventKind::RequestStart) => {
                self.seen = true;
                if has_id {
                    self.by_id.insert(ev.value, ev.ts_ns);
                } else {
                    self.by_thread.entry(ev.tid).or_default().push(ev.ts_ns);
                }
            }
            Ok(EventKind::RequestEnd) => {
                self.seen = true;
                let start = if has_id {
                    self.by_id.remove(&ev.value)
                } else {
                    self.by_thread.get_mut(&ev.tid).and_then(Vec::pop)
                };
                match start {
                    Some(start_ns) => self.spans.push(RequestSpan {
                        start_ns,
                        end_ns: ev.ts_ns,
                        tid: ev.tid,
                        id: has_id.then_some(ev.value),
                    }),
                    None => self
                        .orphans
                        .push((ev.tid, has_id.then_some(ev.value), ev.ts_ns)),
                }
            }
            _ => {}
        }
    }

    /// The starts still open since `since` (by id, by thread), taken out: they end in a later
    /// window. Older ones stay, open (counted as unpaired): a request that spans three windows
    /// or more is no window's to decompose.
    pub fn take_open(&mut self, since: u64) -> Open {
        let mut by_id = HashMap::new();
        self.by_id.retain(|&id, &mut start| {
            let keep = start < since;
            if !keep {
                by_id.insert(id, start);
            }
            keep
        });
        let mut by_thread = HashMap::new();
        for (&tid, starts) in self.by_thread.iter_mut() {
            // Innermost last: the older ones are at the bottom.
            let from = starts.partition_point(|&s| s < since);
            let moved: Vec<u64> = starts.drain(from..).collect();
            if !moved.is_empty() {
                by_thread.insert(tid, moved);
            }
        }
        (by_id, by_thread)
    }

    /// Takes in the starts left open by the window before: the ends that came first meet
    /// theirs, the rest wait below this window's own (they are older).
    pub fn adopt(&mut self, (mut by_id, mut by_thread): Open) {
        self.orphans.sort_by_key(|o| o.2);
        self.orphans.retain(|&(tid, id, end_ns)| {
            let start = match id {
                Some(id) => by_id.remove(&id),
                None => by_thread.get_mut(&tid).and_then(Vec::pop),
            };
            let Some(start_ns) = start else { return true };
            self.spans.push(RequestSpan {
                start_ns,
                end_ns,
                tid,
                id,
            });
            false
        });
        for (id, start) in by_id {
            self.by_id.entry(id).or_insert(start);
        }
        for (tid, mut older) in by_thread.into_iter().filter(|(_, v)| !v.is_empty()) {
            let mine = self.by_thread.entry(tid).or_default();
            older.append(mine);
            *mine = older;
        }
    }

    /// The requests that ended by `end_ns`.
    pub fn finish(mut self, end_ns: u64) -> RequestSet {
        let open = self.by_id.len() + self.by_thread.values().map(Vec::len).sum::<usize>();
        let late = self.spans.iter().filter(|s| s.end_ns > end_ns).count();
        self.spans.retain(|s| s.end_ns <= end_ns);
        // Ends arrive by CPU, not quite in time order; the analysis reads them in order.
        self.spans.sort_by_key(|s| s.end_ns);
        RequestSet {
            source: RequestSource::Markers,
            spans: self.spans,
            unpaired: (self.orphans.len() + open + late) as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(ts: u64, tid: u32, kind: EventKind, id: Option<u64>) -> Event {
        Event {
            ts_ns: ts,
            tid,
            kind: kind as u32,
            cpu: 0,
            aux: id.is_some() as u32,
            value: id.unwrap_or(0),
        }
    }

    #[test]
    fn pairs_by_id_across_threads_and_per_thread_without() {
        use EventKind::*;
        let mut p = Pairing::default();
        for e in [
            ev(10, 1, RequestStart, Some(7)),
            ev(12, 1, RequestStart, Some(8)),
            ev(30, 2, RequestEnd, Some(8)),
            ev(40, 3, RequestEnd, Some(7)),
            ev(45, 3, RequestEnd, Some(99)), // began before the window
            ev(50, 4, RequestStart, None),
            ev(55, 4, RequestStart, None),
            ev(60, 4, RequestEnd, None),
            ev(70, 4, RequestEnd, None),
            ev(80, 5, RequestStart, None), // still open
        ] {
            p.on_event(&e);
        }
        let set = p.finish(65);
        let got: Vec<(u64, u64, u32)> = set
            .spans
            .iter()
            .map(|s| (s.start_ns, s.end_ns, s.tid))
            .collect();
        // (50, 70) ended after the window's end: dropped and counted.
        assert_eq!(got, vec![(12, 30, 2), (10, 40, 3), (55, 60, 4)]);
        assert_eq!(set.unpaired, 3);
    }

    /// A watch's windows: starts still open at the cut move to the next window's pairing,
    /// whose ends that arrived first (the cut's lag) meet them; the older start of a thread
    /// waits below the newer ones. Starts from before the closing window stay there, open.
    #[test]
    fn open_starts_move_to_the_next_window() {
        use EventKind::*;
        let mut first = Pairing::default();
        for e in [
            ev(5, 5, RequestStart, None), // carried in already: a third window is too many
            ev(6, 6, RequestStart, Some(9)), // likewise
            ev(10, 1, RequestStart, Some(7)),
            ev(20, 2, RequestStart, None),
            ev(30, 3, RequestStart, None),
        ] {
            first.on_event(&e);
        }
        let mut next = Pairing::default();
        for e in [
            ev(110, 4, RequestEnd, Some(7)), // arrived before the hand-over
            ev(120, 3, RequestStart, None),
        ] {
            next.on_event(&e);
        }
        next.adopt(first.take_open(8));
        assert_eq!(
            first.finish(100).unpaired,
            2,
            "the two from before 8 stay, open"
        );
        for e in [
            ev(130, 3, RequestEnd, None),
            ev(140, 3, RequestEnd, None),
            ev(150, 2, RequestEnd, None),
        ] {
            next.on_event(&e);
        }
        let set = next.finish(200);
        let got: Vec<(u64, u64, u32)> = set
            .spans
            .iter()
            .map(|s| (s.start_ns, s.end_ns, s.tid))
            .collect();
        assert_eq!(
            got,
            vec![(10, 110, 4), (120, 130, 3), (30, 140, 3), (20, 150, 2)]
        );
        assert_eq!(set.unpaired, 0);
    }
}
