//! Renderers: turn an analysis result into what people read.

pub mod html;
pub mod perfetto;
pub mod text;
pub mod verdict;

use crate::analysis::summary::Summary;

/// The `--json` document: the summary, as one JSON object.
pub fn json(s: &Summary) -> String {
    json_terminal_safe(
        &serde_json::to_string_pretty(s).expect("the summary is plain data and always serializes"),
    )
}

/// serde_json escapes the C0 controls but writes DEL, the C1 controls and bidirectional
/// overrides as they are, and a terminal acts on some of them. They can only occur inside
/// strings, where `\uXXXX` means the same character.
pub fn json_terminal_safe(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        // The newlines are the pretty-printer's own; inside strings serde escaped them.
        if crate::recording::unsafe_for_terminals(c, true) {
            out.push_str(&format!("\\u{:04x}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
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
