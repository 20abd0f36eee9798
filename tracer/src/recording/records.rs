//! Ring buffer records: decoded defensively, by kind, from untrusted bytes.

use tracer_common::{CounterSlice, Event, EventKind};

/// One ring buffer record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Record {
    Event(Event),
    Counters(CounterSlice),
}

impl Record {
    /// When it happened (a counter slice: its end), CLOCK_MONOTONIC.
    pub fn ts_ns(&self) -> u64 {
        match self {
            Self::Event(e) => e.ts_ns,
            Self::Counters(c) => c.ts_ns,
        }
    }
}

/// Reads a `T` from the front of `bytes` if it is long enough.
fn read_pod<T: aya::Pod>(bytes: &[u8]) -> Option<T> {
    if bytes.len() < size_of::<T>() {
        return None;
    }
    // SAFETY: the length is checked above and T is Pod (plain integers, valid for any bits);
    // read_unaligned because the record's alignment is not guaranteed to match.
    Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
}

/// The bytes of a record, as the ring buffer carried them (for the trace file).
pub fn encode(rec: &Record) -> &[u8] {
    fn bytes<T>(v: &T) -> &[u8] {
        // SAFETY: T is a repr(C) struct of plain integers with explicit padding: every byte
        // is initialized and may be read as u8.
        unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), size_of::<T>()) }
    }
    match rec {
        Record::Event(e) => bytes(e),
        Record::Counters(c) => bytes(c),
    }
}

/// Splits records written back to back (a trace file's timeline) and decodes each; stops at
/// the first that does not decode.
pub fn split(mut bytes: &[u8]) -> impl Iterator<Item = Record> + '_ {
    std::iter::from_fn(move || {
        let rec = decode(bytes)?;
        bytes = &bytes[encode(&rec).len()..];
        Some(rec)
    })
}

/// Decodes one ring buffer record by its kind (at the same offset in both record types),
/// refusing anything of the wrong size or an unknown kind.
pub fn decode(bytes: &[u8]) -> Option<Record> {
    let kind = u32::from_le_bytes(bytes.get(12..16)?.try_into().ok()?);
    // The low byte is the kind; a switch-in keeps its wait code above it.
    match EventKind::try_from(kind & tracer_common::KIND_MASK).ok()? {
        EventKind::CounterSlice => read_pod::<CounterSlice>(bytes).map(Record::Counters),
        _ => read_pod::<Event>(bytes).map(Record::Event),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes_of<T>(v: &T) -> Vec<u8> {
        // SAFETY: viewing a plain-integer struct as bytes.
        unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), size_of::<T>()) }.to_vec()
    }

    #[test]
    fn records_decode_by_kind_and_short_ones_are_refused() {
        let ev = Event {
            ts_ns: 7,
            tid: 42,
            kind: EventKind::SwitchIn as u32,
            cpu: 3,
            aux: 9,
            value: 1000,
        };
        let mut unaligned = vec![0u8];
        unaligned.extend(bytes_of(&ev));
        assert_eq!(decode(&unaligned[1..]), Some(Record::Event(ev)));
        assert_eq!(decode(&bytes_of(&ev)[..31]), None);

        let slice = CounterSlice {
            ts_ns: 100,
            tid: 42,
            kind: EventKind::CounterSlice as u32,
            cpu: 1,
            valid: 0b101,
            start_ns: 50,
            values: [1, 0, 3, 0, 0, 0, 0],
        };
        let b = bytes_of(&slice);
        assert_eq!(decode(&b), Some(Record::Counters(slice)));
        // A counter record cut to the size of an event is not misread as an event.
        assert_eq!(decode(&b[..32]), None);
        // Records back to back split and decode in order.
        let mut both = bytes_of(&ev);
        both.extend(bytes_of(&slice));
        let recs: Vec<Record> = split(&both).collect();
        assert_eq!(recs, vec![Record::Event(ev), Record::Counters(slice)]);
        assert_eq!(encode(&recs[1]), &both[32..]);
        // Unknown kinds are refused.
        let mut bad = bytes_of(&ev);
        bad[12] = 99;
        assert_eq!(decode(&bad), None);
        // A switch-in's wait code (above the kind's byte) does not hide its kind.
        let coded = Event {
            kind: EventKind::SwitchIn as u32
                | (tracer_common::WaitCode::Migration as u32) << tracer_common::WAIT_CODE_SHIFT,
            ..ev
        };
        let Some(Record::Event(back)) = decode(&bytes_of(&coded)) else {
            panic!("a coded switch-in does not decode");
        };
        assert_eq!(back.event_kind(), Ok(EventKind::SwitchIn));
        assert_eq!(back.wait_code(), tracer_common::WaitCode::Migration);
    }
}
