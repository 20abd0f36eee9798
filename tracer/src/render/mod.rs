//! Renderers: turn an analysis result into what people read.

pub mod html;
pub mod perfetto;
pub mod text;
pub mod verdict;

use std::io::Write;

use crate::analysis::summary::Summary;

/// Writes the `--json` document, the summary as one JSON object and a newline, as it is
/// serialized: at 20,000 threads it is 30 MB, which held as a string was a quarter of the
/// tracer's peak RSS (issue 13).
pub fn write_json(s: &Summary, out: impl Write) -> std::io::Result<()> {
    let mut out = std::io::BufWriter::new(out);
    serde_json::to_writer_pretty(&mut out, s)?;
    writeln!(out)?;
    out.flush()
}

/// The JSON Schema of the `--json` document (docs/summary.schema.json is this, committed).
pub fn json_schema() -> String {
    let mut schema = schemars::schema_for!(Summary);
    schema.insert(
        "title".into(),
        "tracer summary (tracer attach/run/report --json)".into(),
    );
    serde_json::to_string_pretty(&schema).expect("a schema always serializes") + "\n"
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_committed_schema_is_current() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/summary.schema.json");
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == super::json_schema(),
            "{} is out of date with the Summary type: regenerate it with `cargo xtask schema`",
            path.display()
        );
    }
}
