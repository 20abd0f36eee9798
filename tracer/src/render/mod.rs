//! Renderers: turn an analysis result into what people read.

mod gpu_text;
mod held_up;
pub mod html;
pub mod otlp;
pub mod perfetto;
pub mod prometheus;
mod ranks;
pub mod text;
pub mod verdict;

use std::io::Write;

use serde_json::ser::{CompactFormatter, Formatter, PrettyFormatter};

use crate::analysis::Report;

/// Writes the `--json` document, the summary as one JSON object and a newline, as it is
/// serialized: at 20,000 threads it is 30 MB, which held as a string was a quarter of the
/// tracer's peak RSS (issue 13). Strings are made safe for a terminal (`TerminalSafe`).
pub fn write_json(s: &impl serde::Serialize, out: impl Write) -> std::io::Result<()> {
    let mut out = std::io::BufWriter::new(out);
    let mut ser =
        serde_json::Serializer::with_formatter(&mut out, TerminalSafe(PrettyFormatter::new()));
    s.serialize(&mut ser)?;
    writeln!(out)?;
    out.flush()
}

/// A serde enum's name as the JSON document writes it (`scheduling`, `same_process`).
pub fn serde_name(v: &impl serde::Serialize) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|x| x.as_str().map(String::from))
        .unwrap_or_default()
}

/// The same document on one line (`tracer watch --json`: JSON lines, a document per window).
pub fn write_json_line(s: &impl serde::Serialize, out: impl Write) -> std::io::Result<()> {
    let mut out = std::io::BufWriter::new(out);
    let mut ser = serde_json::Serializer::with_formatter(&mut out, TerminalSafe(CompactFormatter));
    s.serialize(&mut ser)?;
    writeln!(out)?;
    out.flush()
}

/// serde_json escapes the C0 controls in strings but writes DEL, the C1 controls and the
/// bidirectional overrides as they are, and a terminal acts on some of them (a thread can name
/// itself anything). This formatter writes those as `\uXXXX` too, which means the same
/// character to any JSON reader.
struct TerminalSafe<F>(F);

impl<F: Formatter> Formatter for TerminalSafe<F> {
    fn write_string_fragment<W: ?Sized + Write>(
        &mut self,
        w: &mut W,
        fragment: &str,
    ) -> std::io::Result<()> {
        let mut rest = fragment;
        while let Some(i) = rest.find(|c| crate::recording::unsafe_for_terminals(c, false)) {
            w.write_all(&rest.as_bytes()[..i])?;
            let c = rest[i..].chars().next().expect("found at i");
            write!(w, "\\u{:04x}", c as u32)?;
            rest = &rest[i + c.len_utf8()..];
        }
        w.write_all(rest.as_bytes())
    }

    // The rest is the inner formatter's.
    fn begin_array<W: ?Sized + Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.0.begin_array(w)
    }
    fn end_array<W: ?Sized + Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.0.end_array(w)
    }
    fn begin_array_value<W: ?Sized + Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        self.0.begin_array_value(w, first)
    }
    fn end_array_value<W: ?Sized + Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.0.end_array_value(w)
    }
    fn begin_object<W: ?Sized + Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.0.begin_object(w)
    }
    fn end_object<W: ?Sized + Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.0.end_object(w)
    }
    fn begin_object_key<W: ?Sized + Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        self.0.begin_object_key(w, first)
    }
    fn begin_object_value<W: ?Sized + Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.0.begin_object_value(w)
    }
    fn end_object_value<W: ?Sized + Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.0.end_object_value(w)
    }
}

/// The JSON Schema of the `--json` document (docs/summary.schema.json is this, committed).
pub fn json_schema() -> String {
    schema_of::<Report>("tracer summary (tracer attach/run/report --json)")
}

/// The JSON Schema of `T` as it is written. schemars describes what deserializes by default:
/// a field serde skips when empty (`skip_serializing_if`) was then required though absent
/// from the document, and an `Option` without `default` was optional though always written
/// (as null). The serialize contract describes the document we print (issue 13).
pub fn schema_of<T: schemars::JsonSchema>(title: &str) -> String {
    let mut schema = schemars::generate::SchemaSettings::draft2020_12()
        .for_serialize()
        .into_generator()
        .into_root_schema_for::<T>();
    schema.insert("title".into(), title.into());
    serde_json::to_string_pretty(&schema).expect("a schema always serializes") + "\n"
}
