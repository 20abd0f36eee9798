//! Any bytes given to `tracer report` as a trace file: the reader must answer with a recording
//! or an error, never a panic, and never allocate without bound (libFuzzer's -malloc_limit_mb
//! catches that).

#![no_main]

use libfuzzer_sys::fuzz_target;
use tracer::trace::{reader, recover};

fuzz_target!(|data: &[u8]| {
    if let Ok(contents) = reader::read_from(data, data.len() as u64, "fuzz input") {
        // What `tracer report` does next: rebuild the recording and summarize it.
        let rec = recover::into_recording(contents, true);
        let _ = tracer::analysis::analyze(&rec);
    }
});
