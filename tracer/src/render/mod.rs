//! Renderers: turn an analysis result into what people read.

pub mod text;

use crate::analysis::summary::Summary;

/// The `--json` document: the summary, as one JSON object.
pub fn json(s: &Summary) -> String {
    serde_json::to_string_pretty(s).expect("the summary is plain data and always serializes")
}
