//! Frame-level damage in real traces: a flipped header byte, frames after the end or from
//! another trace, a decompression bomb (issue 13, items 16 and 10). Each is refused at its
//! byte offset, with what precedes it recovered.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use tracer_tests::{Finished, Testload, Tracer, require_root, run_tracer, serial, tracer_bin};

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

/// Issue 13 (16): frames after the end frame, or from another trace, were merged silently.
/// Each is refused at its offset, saying what is wrong, and what precedes it is recovered.
#[test]
fn frames_after_the_end_or_from_another_trace_are_refused() {
    let _guard = serial();
    require_root();
    let dir = scratch("appended");
    let one = record_busy(&dir);
    let whole = report_bytes(&dir, "whole.trace", &one);
    assert!(whole.status.success(), "{}", whole.stderr);
    let doc = whole.json();
    let frames = bytes::frames(&one);
    let (fin, end) = (frames[frames.len() - 2], frames[frames.len() - 1]);
    assert_eq!(
        (fin.kind, end.kind),
        (5, 6),
        "it ends with the final and end frames"
    );
    let rec = *frames
        .iter()
        .find(|f| f.kind == 2)
        .expect("a records frame");
    let records = &one[rec.offset..rec.offset + rec.len];
    // As the tracer leaves a file when it is killed before the final frame.
    let partial = &one[..fin.offset];
    let cases = [
        (
            "a whole trace appended to a finished one",
            [&one[..], &one[..]].concat(),
            one.len(),
            "after the end frame",
        ),
        (
            "another trace's frames appended to a finished one",
            [&one[..], &one[16..]].concat(),
            one.len(),
            "after the end frame",
        ),
        (
            "a trace appended to an unfinished one",
            [partial, &one[16..]].concat(),
            partial.len(),
            "a second metadata frame",
        ),
        (
            "a whole trace appended to an unfinished one",
            [partial, &one[..]].concat(),
            partial.len(),
            "another trace file's header",
        ),
        (
            "a frame between the final and end frames",
            [&one[..end.offset], records, &one[end.offset..]].concat(),
            end.offset,
            "after the final frame",
        ),
    ];
    for (i, (what, bytes, offset, why)) in cases.into_iter().enumerate() {
        let out = report_bytes(&dir, &format!("appended{i}.trace"), &bytes);
        assert_eq!(out.status.code(), Some(1), "{what}: {}", out.stderr);
        let at = format!("unexpected data at byte {offset}: ");
        assert!(
            out.stderr.contains(&at) && out.stderr.contains(why),
            "{what}: {}",
            out.stderr
        );
        if offset > fin.offset {
            assert_eq!(
                out.json(),
                doc,
                "{what}: the recording before it is read whole"
            );
        } else {
            assert_eq!(out.json()["end_reason"], "unfinished", "{what}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The file of issue 13 (10) in the header layout of `version`: the fuzzer seed's metadata
/// frame, then 40 zstd frames of 256 MiB of zeros, about 330 KB in all. Returns it and where
/// its first zstd frame starts.
fn bomb(version: u32) -> (Vec<u8>, usize) {
    let seed_path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds/sleeper.trace");
    let seed = std::fs::read(seed_path).unwrap();
    let meta = bytes::frames(&seed)[0];
    assert_eq!(meta.kind, 1);
    let hlen = bytes::header_len(bytes::version(&seed));
    let payload = &seed[meta.offset + hlen..meta.offset + meta.len];
    let mut v = seed[..bytes::FILE_HEADER].to_vec();
    v[8..12].copy_from_slice(&version.to_le_bytes());
    v.extend(bytes::frame(
        version,
        1,
        false,
        payload,
        payload.len() as u32,
    ));
    let first = v.len();
    let zeros = bytes::zstd_zeros(256 << 20);
    for _ in 0..40 {
        v.extend(bytes::frame(version, 2, true, &zeros, 256 << 20));
    }
    (v, first)
}

/// Runs `tracer report FILE`; returns its exit code, its stderr and its peak RSS in bytes
/// (wait4's rusage of the child). Its address space is capped at 4 GiB so that a reader
/// without a bound fails rather than take the machine's memory (the bomb holds 10 GiB).
fn report_peak_rss(path: &Path) -> (Option<i32>, String, u64) {
    use std::os::unix::process::CommandExt;
    let err = path.with_extension("stderr");
    let mut cmd = Command::new(tracer_bin());
    cmd.arg("report")
        .arg(path)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err).unwrap());
    // SAFETY: setrlimit is async-signal-safe, and this closure only calls it.
    unsafe {
        cmd.pre_exec(|| {
            let cap = libc::rlimit {
                rlim_cur: 4 << 30,
                rlim_max: 4 << 30,
            };
            match libc::setrlimit(libc::RLIMIT_AS, &cap) {
                0 => Ok(()),
                _ => Err(std::io::Error::last_os_error()),
            }
        });
    }
    // Waited for by wait4 below, which gives its rusage too.
    let pid = cmd.spawn().expect("run tracer").id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: rusage is plain data, filled in by wait4.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: pid is our child, not yet waited for; the pointers are to live locals.
    assert_eq!(unsafe { libc::wait4(pid, &mut status, 0, &mut usage) }, pid);
    let code = libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
    // ru_maxrss is in KiB on Linux.
    let rss = usage.ru_maxrss as u64 * 1024;
    (code, std::fs::read_to_string(&err).unwrap(), rss)
}

/// Issue 13 (10): `report` of a 331 KB trace of 40 zstd frames of 256 MiB of zeros used more
/// than 6 GB. Refused in both header layouts (version 3 declares the decompressed length,
/// version 2 is stopped while decompressing), saying why, in little memory.
#[test]
fn a_decompression_bomb_is_refused_in_bounded_memory() {
    let _guard = serial();
    let dir = scratch("bomb");
    for version in [2, 3] {
        let (file, first) = bomb(version);
        assert!(file.len() < 340_000, "{}", file.len());
        let path = dir.join(format!("bomb-v{version}.trace"));
        std::fs::write(&path, &file).unwrap();
        let (code, stderr, rss) = report_peak_rss(&path);
        eprintln!("version {version}: peak RSS {} MiB", rss >> 20);
        assert!(
            rss < 300 << 20,
            "version {version}: peak RSS {} MiB; {stderr}",
            rss >> 20
        );
        assert_eq!(code, Some(1), "version {version}: {stderr}");
        for says in [
            &format!("frame at byte {first}: the trace would decompress to more than")[..],
            "not written by tracer, or is damaged",
        ] {
            assert!(stderr.contains(says), "version {version}: {stderr}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
