//! `tracer demo`: the built-in synthetic inference server under one injected cause (a
//! scenario), the tracer attached with uprobes on the server's request markers, and the
//! verdict set against the cause that was injected.

mod common;
mod cpu;
mod gpu;
mod python;
mod queue_check;
mod scenario;

use anyhow::Result;
use serde::Serialize;

pub use common::DemoArgs;

use common::{DemoPart, LatencyStats};

use crate::{analysis::Report, render, sources::privileges, units::dur};

/// The `demo --json` document: the summary, and beside it how the scenario went.
#[derive(Debug, Serialize, schemars::JsonSchema)]
struct DemoReport<'a> {
    #[serde(flatten)]
    report: &'a Report,
    demo: &'a DemoPart,
}

/// The JSON Schema of the `demo --json` document (docs/demo.schema.json is this, committed).
pub fn json_schema() -> String {
    render::schema_of::<DemoReport<'static>>(
        "tracer demo --json: the summary and the scenario's outcome",
    )
}

pub fn run(args: DemoArgs) -> Result<()> {
    privileges::check()?;
    args.record.check_inputs_and_outputs(false)?;
    let out = if args.scenario.gpu() {
        gpu::run(&args)?
    } else if args.scenario.python() {
        python::run(&args)?
    } else {
        cpu::run(&args)?
    };
    let mut failures = super::emit::Failures::default();
    failures.keep(if args.record.json {
        super::emit::stdout_json(&DemoReport {
            report: &out.report,
            demo: &out.part,
        })
    } else {
        let text = render::text::render(&out.report) + &part_text(&out.part, &out.report);
        super::emit::stdout(&crate::recording::terminal_safe(&text))
    });
    failures.keep(super::emit::write_outputs(
        &out.rec,
        &out.report,
        &args.record.outputs,
    ));
    failures.into_result()
}

fn part_text(p: &DemoPart, r: &Report) -> String {
    use std::fmt::Write as _;
    let mut out = String::from("\nRequest latency, as the server measured it:\n");
    let mut line = |name: &str, s: Option<LatencyStats>| match s {
        Some(s) => writeln!(
            out,
            "  {name:<26} p50 {:>9}  p99 {:>9}  max {:>9}  ({} requests)",
            dur(s.p50_ns),
            dur(s.p99_ns),
            dur(s.max_ns),
            s.requests
        ),
        None => writeln!(out, "  {name:<26} no requests completed"),
    };
    let _ = line("before the disturbance", p.latency_baseline);
    let _ = line("during the recording", p.latency_recorded);
    let _ = writeln!(
        out,
        "\nScenario {}: expected {}{}, got {} -> {}",
        p.scenario.name(),
        p.expected_primary.name(),
        p.expected_mechanism
            .map_or(String::new(), |m| format!(" ({m})")),
        r.verdict.primary.name(),
        if p.correct { "correct" } else { "WRONG" }
    );
    match &p.interference {
        Some(i) if i.pid == 0 => {
            let _ = writeln!(
                out,
                "  (disturbed from outside by {}: this run measured another disturbance than \
                 the injected one)",
                i.comm
            );
        }
        Some(i) => {
            let _ = writeln!(
                out,
                "  (the server waited mostly behind {} (PID {}), which the scenario did not \
                 start: this run measured another disturbance than the injected one)",
                i.comm, i.pid
            );
        }
        None => {}
    }
    if p.no_effect {
        let _ = writeln!(
            out,
            "  (the injected cause made no tail on this host: the server's p99 was no higher \
             than before the disturbance, or what it made was no tail by the verdict's rule (every \
             request slowed alike, or a few outliers), so there was no jitter of its making to \
             explain)"
        );
    }
    out
}
