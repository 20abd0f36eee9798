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
use crate::{
    analysis::{Report, analyze},
    recording::{Recording, requests::parse_latency_log},
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
    let set = parse_latency_log(
        &text,
        rec.host.realtime_minus_monotonic_ns,
        (rec.start_ns, rec.end_ns),
    )
    .with_context(|| format!("{}", path.display()))?;
    rec.requests = Some(set);
    Ok(())
}

/// Writes to stdout, reporting a closed or full stdout as an error instead of panicking.
pub fn stdout(text: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .context("writing the summary to standard output")
}

/// Streams a JSON document to stdout (`render::write_json`), with `stdout`'s errors.
pub fn stdout_json(doc: &impl serde::Serialize) -> Result<()> {
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
        failures.keep(write_output(path, &render::perfetto::render(rec)));
    }
    if let Some(path) = &outputs.html {
        failures.keep(write_output(
            path,
            render::html::render(rec, report).as_bytes(),
        ));
    }
    failures.into_result()
}

fn write_output(path: &Path, bytes: &[u8]) -> Result<()> {
    crate::trace::writer::write_atomic(path, bytes)?;
    eprintln!("tracer: wrote {}", path.display());
    Ok(())
}
