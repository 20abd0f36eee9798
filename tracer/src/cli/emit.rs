//! The end of every command that has a recording: the latency log joined in, the summary on
//! stdout, the HTML and Perfetto files. Every output is attempted even when another failed (a
//! closed stdout must not cost the files, nor a bad latency log the summary), and the command
//! then fails with what went wrong.

use std::{
    io::{Read as _, Write as _},
    path::Path,
};

use anyhow::{Context as _, Result, bail};

use super::args::OutputArgs;
use crate::trace::output::Kind;
use crate::{
    analysis::{Report, analyze},
    recording::{
        Recording,
        latency_log::{is_whole_record, parse_latency_log_lenient, to_kernel_tids},
    },
    render,
};

/// A latency log larger than this is refused: a million requests take about 70 MB.
const MAX_LATENCY_LOG: u64 = 1 << 30;

/// Reads the latency log into the recording's requests.
pub fn load_latencies(rec: &mut Recording, path: &Path) -> Result<()> {
    super::args::check_latency_log(path, false)?;
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

/// Writes to stdout, reporting a closed or full stdout as an error instead of panicking.
/// SIGINT and SIGTERM wait for the end of the document, as for a file: a reader must never
/// get half of one (a reader that stops reading holds the tool until it is killed).
pub fn stdout(text: &str) -> Result<()> {
    let _deferred = crate::signals::Deferred::new();
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .context("writing the summary to standard output")
}

/// Streams a JSON document to stdout (`render::write_json`), with `stdout`'s errors.
pub fn stdout_json(doc: &impl serde::Serialize) -> Result<()> {
    let _deferred = crate::signals::Deferred::new();
    render::write_json(doc, std::io::stdout().lock())
        .context("writing the summary to standard output")
}

/// Errors of several outputs, reported together once every output was tried.
#[derive(Default)]
pub struct Failures(Vec<anyhow::Error>);

impl Failures {
    pub fn keep(&mut self, r: Result<()>) {
        if let Err(e) = r {
            self.0.push(e);
        }
    }

    pub fn into_result(self) -> Result<()> {
        let mut it = self.0.into_iter();
        let Some(first) = it.next() else {
            return Ok(());
        };
        let rest: Vec<String> = it.map(|e| format!("{e:#}")).collect();
        if rest.is_empty() {
            return Err(first);
        }
        Err(anyhow::anyhow!("{first:#}; and {}", rest.join("; ")))
    }
}

/// Joins the latency log in (if any), prints the recording (text or JSON) and writes the
/// files `outputs` asks for.
pub fn print_recording(
    rec: &mut Recording,
    json: bool,
    outputs: &OutputArgs,
    latencies: Option<&Path>,
) -> Result<()> {
    let mut failures = Failures::default();
    if let Some(path) = latencies {
        let loaded = load_latencies(rec, path);
        if loaded.is_err() {
            eprintln!(
                "tracer: the latency log could not be used: the summary below has no request \
                 verdict"
            );
        }
        failures.keep(loaded);
    }
    let report = analyze(rec);
    failures.keep(if json {
        stdout_json(&report)
    } else {
        stdout(&crate::recording::terminal_safe(&render::text::render(
            &report,
        )))
    });
    failures.keep(write_outputs(rec, &report, outputs));
    if let Some(e) = &rec.output_error {
        failures.keep(Err(anyhow::anyhow!("{e}")));
    }
    failures.into_result()
}

/// Writes the Perfetto and HTML files `outputs` asks for; a file that fails does not stop the
/// other.
pub fn write_outputs(rec: &Recording, report: &Report, outputs: &OutputArgs) -> Result<()> {
    let mut failures = Failures::default();
    if let Some(path) = &outputs.perfetto {
        failures.keep(write_output(
            path,
            &render::perfetto::render(rec),
            Kind::Perfetto,
        ));
    }
    if let Some(path) = &outputs.html {
        failures.keep(write_output(
            path,
            render::html::render(rec, report).as_bytes(),
            Kind::Html,
        ));
    }
    failures.into_result()
}

fn write_output(path: &Path, bytes: &[u8], kind: Kind) -> Result<()> {
    crate::trace::writer::write_atomic(path, bytes, kind)?;
    eprintln!("tracer: wrote {}", path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loaded(text: &str) -> Result<Recording> {
        let path = std::env::temp_dir().join(format!("tracer-emit-{}.jsonl", std::process::id()));
        std::fs::write(&path, text).unwrap();
        let mut rec = crate::recording::testutil::recording(vec![], vec![]);
        let r = load_latencies(&mut rec, &path);
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
