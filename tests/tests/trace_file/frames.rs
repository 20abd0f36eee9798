//! Frame-level damage in real traces: a flipped header byte (issue 13, item 16) is refused at
//! its frame's byte offset, with what precedes it recovered.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use tracer_tests::{Finished, Testload, Tracer, require_root, run_tracer, serial};

use super::{bytes, scratch};

/// Records the mixed workload for more than a flush interval (so that the file has several
/// records frames) and returns the trace's bytes.
fn record_busy(dir: &Path) -> Vec<u8> {
    let mut load = Testload::spawn(&["mixed", "2"]);
    let pid = load.pid.to_string();
    let trace = dir.join("busy.trace");
    let tracer = Tracer::start(&[
        "attach",
        "--pid",
        &pid,
        "--duration",
        "60s",
        "-o",
        trace.to_str().unwrap(),
    ]);
    let until = Instant::now() + Duration::from_millis(1500);
    while Instant::now() < until {
        load.send("go");
        load.expect("done");
    }
    tracer.signal(libc::SIGINT);
    let out = tracer.finish(Duration::from_secs(30));
    assert!(out.status.success(), "{}", out.stderr);
    std::fs::read(&trace).unwrap()
}

/// Writes `bytes` to `dir/name` and runs `tracer report --json` on it.
fn report_bytes(dir: &Path, name: &str, bytes: &[u8]) -> Finished {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    run_tracer(&["report", path.to_str().unwrap(), "--json"])
}

/// Issue 13 (16): a frame's kind and flags were outside its checksum; one flipped byte
/// dropped a third of the wait classes, and `report` exited 0. Now flipping any header byte
/// of a frame is found at its offset, and the frames before it are recovered.
#[test]
fn every_byte_of_a_frame_header_is_checked() {
    let _guard = serial();
    require_root();
    let dir = scratch("headers");
    let one = record_busy(&dir);
    let hlen = bytes::header_len(bytes::version(&one));
    // Its low bit: the kind 2 becomes 3 (GPU), the zstd flag is cleared, a reserved bit set,
    // a length or the checksum changed; and the payload's last byte.
    let rec = *bytes::frames(&one)
        .iter()
        .find(|f| f.kind == 2)
        .expect("a records frame");
    for i in (0..hlen).chain([rec.len - 1]) {
        let mut bad = one.clone();
        bad[rec.offset + i] ^= 1;
        let out = report_bytes(&dir, &format!("flip{i}.trace"), &bad);
        let what = format!("frame byte {i}: {}", out.stderr);
        assert_eq!(out.status.code(), Some(1), "{what}");
        assert!(
            out.stderr.contains(&format!("at byte {}", rec.offset)),
            "{what}"
        );
        assert_eq!(out.json()["end_reason"], "unfinished", "{what}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
