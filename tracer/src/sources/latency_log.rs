//! The latency log (`--latencies`) read from its file into a recording's requests, and checked
//! before anything is recorded (the parsing is `recording::latency_log`'s). Here, not in the
//! CLI: a recording with a trace file holds its requests, so the session reads the log before
//! it finishes the file.

use std::{io::Read as _, path::Path};

use anyhow::{Context as _, Result, bail};

use crate::recording::{
    Recording,
    latency_log::{is_whole_record, parse_latency_log_lenient, to_kernel_tids},
};

/// Checks, before anything is recorded, that a latency log can be read when the recording
/// ends: a regular file (a FIFO would block the tool, a device could be endless), or for `run`
/// one the command has yet to create, in a directory that exists.
pub fn check(path: &Path, may_not_exist: bool) -> Result<()> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => std::fs::File::open(path)
            .map(drop)
            .with_context(|| format!("the latency log {} cannot be read", path.display())),
        Ok(_) => bail!(
            "the latency log {} is not a regular file: give the file the server writes its \
             request latencies to",
            path.display()
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && may_not_exist => {
            let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
            match dir {
                Some(d) if !d.is_dir() => {
                    bail!("the latency log's directory {} does not exist", d.display())
                }
                _ => Ok(()),
            }
        }
        Err(e) => Err(e).with_context(|| format!("the latency log {}", path.display())),
    }
}

/// A latency log larger than this is refused: a million requests take about 70 MB.
const MAX_LATENCY_LOG: u64 = 1 << 30;

/// Reads the latency log into the recording's requests.
pub fn load(rec: &mut Recording, path: &Path) -> Result<()> {
    check(path, false)?;
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_LATENCY_LOG + 1).read_to_string(&mut text))
        .with_context(|| format!("reading the latency log {}", path.display()))?;
    if text.len() as u64 > MAX_LATENCY_LOG {
        bail!(
            "the latency log {} is larger than {} GiB: give a log of the recorded window only",
            path.display(),
            MAX_LATENCY_LOG >> 30
        );
    }
    // A server appending through a buffer leaves half a line at the end while it writes: a
    // last line with no newline that is not JSON yet is that record, still being written (a
    // watch reads it whole at its next window); anything else malformed is still an error.
    if !text.ends_with('\n') {
        let cut = text.rfind('\n').map_or(0, |i| i + 1);
        if !is_whole_record(&text[cut..]) {
            text.truncate(cut);
        }
    }
    let (mut set, malformed) = parse_latency_log_lenient(
        &text,
        rec.host.realtime_minus_monotonic_ns,
        (rec.start_ns, rec.end_ns),
    )
    .with_context(|| format!("{}", path.display()))?;
    if let Some((n, first)) = malformed {
        eprintln!(
            "tracer: the latency log {}: {n} line(s) left out, the first: {first:#}",
            path.display()
        );
    }
    to_kernel_tids(&mut set, rec.pid_namespace.as_ref());
    rec.requests = Some(set);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loaded(text: &str) -> Result<Recording> {
        let path =
            std::env::temp_dir().join(format!("tracer-latency-log-{}.jsonl", std::process::id()));
        std::fs::write(&path, text).unwrap();
        let mut rec = crate::recording::testutil::recording(vec![], vec![]);
        let r = load(&mut rec, &path);
        let _ = std::fs::remove_file(&path);
        r.map(|()| rec)
    }

    /// A record still being written at the end of the log is left for the next reading; a
    /// whole last record without its newline counts; a malformed line elsewhere costs itself,
    /// and a log with no request at all is an error.
    #[test]
    fn a_record_still_being_written_is_left_out() {
        let one = r#"{"start_ns": 2000, "end_ns": 3000, "tid": 7}"#;
        let two = r#"{"start_ns": 4000, "end_ns": 5000, "tid": 7}"#;
        let spans = |t: &str| loaded(t).unwrap().requests.unwrap().spans.len();
        assert_eq!(spans(&format!("{one}\n{two}\n")), 2);
        assert_eq!(spans(&format!("{one}\n{two}")), 2);
        assert_eq!(spans(&format!("{one}\n{{\"start_ns\": 40")), 1);
        assert_eq!(spans(&format!("{{\"start_ns\": 40\n{one}\n")), 1);
        assert!(loaded("{\"start_ns\": 40\n\n").is_err());
    }
}
