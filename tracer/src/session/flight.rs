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

#[derive(Default)]
pub struct FlightRing {
    chunks: VecDeque<Chunk>,
    held: usize,
}

impl FlightRing {
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

impl Session<'_> {
    /// Writes `rec` (the kept windows, merged) to `path` with the records of its span.
    pub fn write_flight(&self, path: &Path, rec: &Recording) -> Result<PathBuf> {
        let ring = self
            .flight
            .as_ref()
            .expect("the flight recorder is on (--keep)");
        let mut w = TraceWriter::create(path)?;
        w.meta(&super::trace_meta(
            self.targets.primary(),
            &self.host,
            &self.probes,
            rec.start_ns,
            self.opts.bin.as_nanos() as u64,
            self.initial.clone(),
        ));
        for c in &ring.chunks {
            for r in split(&c.bytes) {
                if (rec.start_ns..=rec.end_ns).contains(&r.ts_ns()) {
                    w.record(encode(&r));
                }
            }
        }
        w.finish(rec)
    }

    /// Bytes the flight recorder holds (0 without one).
    pub fn flight_bytes(&self) -> usize {
        self.flight.as_ref().map_or(0, FlightRing::held)
    }

    /// Lets the records before `t` go.
    pub fn flight_forget_before(&mut self, t: u64) {
        if let Some(f) = self.flight.as_mut() {
            f.forget_before(t);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_chunks_age_out() {
        let mut ring = FlightRing::default();
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
    }
}
