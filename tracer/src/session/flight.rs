//! The flight recorder (`tracer watch --keep`): the timeline records of the last stretch of
//! the run, held in memory in chunks, and written with the windows that cover them to a trace
//! file `tracer report` reads, when something triggers it.

use std::{
    collections::VecDeque,
    path::{Path, PathBuf},
};

use anyhow::Result;

use super::Session;
use crate::{
    recording::{
        Recording,
        records::{encode, split},
    },
    trace::TraceMeta,
    trace::writer::TraceWriter,
};

/// Records are appended to chunks of about this size; whole chunks are dropped as they age
/// out, so holding a record costs nothing beyond its bytes.
const CHUNK_BYTES: usize = 64 << 10;

struct Chunk {
    /// The latest record's time in it (records arrive grouped by CPU, not in time order).
    max_ts: u64,
    bytes: Vec<u8>,
}

pub struct FlightRing {
    chunks: VecDeque<Chunk>,
    held: usize,
    /// At most this many bytes held (`--keep-max-mib`): past it the oldest chunks go early.
    cap: usize,
    /// The latest record time in a chunk that went early: records up to it may be missing,
    /// those after it are all here (a chunk holds no record later than its `max_ts`).
    evicted_to: Option<u64>,
}

impl FlightRing {
    pub fn new(cap: usize) -> Self {
        Self {
            chunks: VecDeque::new(),
            held: 0,
            cap: cap.max(CHUNK_BYTES),
            evicted_to: None,
        }
    }

    pub fn push(&mut self, ts: u64, record: &[u8]) {
        let fits = self
            .chunks
            .back()
            .is_some_and(|c| c.bytes.len() + record.len() <= CHUNK_BYTES);
        if !fits {
            self.chunks.push_back(Chunk {
                max_ts: 0,
                bytes: Vec::with_capacity(CHUNK_BYTES),
            });
        }
        let c = self.chunks.back_mut().expect("one was pushed");
        c.max_ts = c.max_ts.max(ts);
        c.bytes.extend_from_slice(record);
        self.held += record.len();
        while self.held > self.cap && self.chunks.len() > 1 {
            let c = self.chunks.pop_front().expect("more than one");
            self.held -= c.bytes.len();
            self.evicted_to = Some(self.evicted_to.unwrap_or(0).max(c.max_ts));
        }
    }

    /// Records after this time are all held; before it, some went to the memory ceiling.
    pub fn complete_after(&self) -> Option<u64> {
        self.evicted_to
    }

    /// Drops the chunks whose every record is older than `t`.
    pub fn forget_before(&mut self, t: u64) {
        while let Some(c) = self.chunks.front() {
            if c.max_ts >= t {
                break;
            }
            self.held -= c.bytes.len();
            self.chunks.pop_front();
        }
    }

    /// Bytes of records held.
    pub fn held(&self) -> usize {
        self.held
    }
}

/// Where the flight recorder's files are written from: the session while it runs, and what
/// it hands over when it ends (`Held`), so that the last window can trigger a file too. Each
/// gives its ring and the file's description; the rest is the same for both.
pub trait FlightStore {
    /// The records held (None: no flight recorder).
    fn ring(&self) -> Option<&FlightRing>;
    fn ring_mut(&mut self) -> Option<&mut FlightRing>;
    /// The trace file's description, as of now.
    fn meta(&self) -> TraceMeta;
    /// The first process given, by the PID this tool's /proc knows it by (files are named so).
    fn flight_pid(&self) -> u32;

    /// The time after which every record is held (None: all it was asked to keep).
    fn flight_complete_after(&self) -> Option<u64> {
        self.ring().and_then(FlightRing::complete_after)
    }

    /// Bytes of records held.
    fn flight_bytes(&self) -> usize {
        self.ring().map_or(0, FlightRing::held)
    }

    /// Lets the records before `t` go.
    fn flight_forget_before(&mut self, t: u64) {
        if let Some(r) = self.ring_mut() {
            r.forget_before(t);
        }
    }

    /// Writes `rec` (the kept windows, merged) to `path` with the records of its span.
    fn write_flight(&self, path: &Path, rec: &Recording) -> Result<PathBuf> {
        let ring = self.ring().expect("the flight recorder is on (--keep)");
        let mut meta = self.meta();
        meta.start_ns = rec.start_ns;
        let mut w = TraceWriter::create(path)?;
        w.meta(&meta);
        for c in &ring.chunks {
            for r in split(&c.bytes) {
                if (rec.start_ns..=rec.end_ns).contains(&r.ts_ns()) {
                    w.record(encode(&r));
                }
            }
        }
        w.finish(rec)
    }
}

/// The flight recorder's records and the trace file's description, kept past the session's
/// end.
pub struct Held {
    ring: FlightRing,
    meta: TraceMeta,
    pid: u32,
}

impl Session<'_> {
    /// Hands the flight recorder over, once the last records are in it.
    pub(super) fn take_flight(&mut self) -> Option<Held> {
        let ring = self.flight.take()?;
        Some(Held {
            ring,
            meta: self.meta(),
            pid: self.flight_pid(),
        })
    }
}

impl FlightStore for Session<'_> {
    fn ring(&self) -> Option<&FlightRing> {
        self.flight.as_ref()
    }

    fn ring_mut(&mut self) -> Option<&mut FlightRing> {
        self.flight.as_mut()
    }

    fn meta(&self) -> TraceMeta {
        super::trace_meta(
            self.targets.primary(),
            &self.host,
            &self.probes,
            0,
            self.opts.bin.as_nanos() as u64,
            self.initial.clone(),
        )
    }

    fn flight_pid(&self) -> u32 {
        self.targets.primary().proc_pid
    }
}

impl FlightStore for Held {
    fn ring(&self) -> Option<&FlightRing> {
        Some(&self.ring)
    }

    fn ring_mut(&mut self) -> Option<&mut FlightRing> {
        Some(&mut self.ring)
    }

    fn meta(&self) -> TraceMeta {
        self.meta.clone()
    }

    fn flight_pid(&self) -> u32 {
        self.pid
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_chunks_age_out() {
        let mut ring = FlightRing::new(usize::MAX);
        let rec = [0u8; 32];
        // 3 chunks' worth, times 0..n.
        let n = 3 * CHUNK_BYTES / 32;
        for t in 0..n as u64 {
            ring.push(t, &rec);
        }
        assert_eq!(ring.held(), n * 32);
        ring.forget_before(CHUNK_BYTES as u64 / 32 + 5);
        assert_eq!(
            ring.held(),
            2 * CHUNK_BYTES,
            "the first chunk went, the second stays"
        );
        ring.forget_before(u64::MAX);
        assert_eq!(ring.held(), 0);
        assert_eq!(ring.complete_after(), None, "nothing went early");
    }

    #[test]
    fn the_ceiling_drops_the_oldest_chunks_and_says_from_when() {
        let mut ring = FlightRing::new(2 * CHUNK_BYTES);
        let rec = [0u8; 32];
        let per_chunk = (CHUNK_BYTES / 32) as u64;
        for t in 0..5 * per_chunk {
            ring.push(t, &rec);
        }
        assert!(ring.held() <= 2 * CHUNK_BYTES, "{}", ring.held());
        let after = ring.complete_after().expect("chunks went early");
        // Everything after `after` is held: 5 chunks pushed, at most 2 held.
        assert_eq!(after, 3 * per_chunk - 1);
        assert_eq!(ring.held() as u64, (5 * per_chunk - after - 1) * 32);
    }
}
