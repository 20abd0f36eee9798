//! The end of every command that has a recording: the latency log joined in, the summary on
//! stdout, the HTML and Perfetto files. Every output is attempted even when another failed (a
//! closed stdout must not cost the files, nor a bad latency log the summary), and the command
//! then fails with what went wrong.

use std::{io::Write as _, path::Path};

use anyhow::{Context as _, Result};

use super::args::OutputArgs;
use crate::trace::output::Kind;
use crate::{
    analysis::{Report, analyze},
    recording::Recording,
    render,
};

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

/// The latency log still to be joined into `rec`: none where the session joined it already
/// (a recording with a trace file holds its requests; a second reading could differ by a
/// record the server wrote late).
pub fn unjoined<'a>(rec: &Recording, log: Option<&'a Path>) -> Option<&'a Path> {
    log.filter(|_| !rec.requests.as_ref().is_some_and(|r| r.from_log()))
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
        let loaded = crate::sources::latency_log::load(rec, path);
        if loaded.is_err() {
            eprintln!(
                "tracer: the latency log could not be used: {}",
                match rec.requests.as_ref().filter(|r| r.from_log()) {
                    Some(_) => "the summary below has the requests the trace file holds",
                    None => "the summary below has no request verdict",
                }
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
