//! One self-contained HTML page: the verdict first, then every series of the recording on one
//! zoomable time axis. The page is a template with its script and styles and the vendored
//! uPlot library (`tracer/assets/uplot`, which draws the axes, scales, zoom and cursor of every
//! chart) inlined, and the data embedded once as JSON (`data.rs`): it opens without network
//! access.

mod data;

use crate::{analysis::report::Report, recording::Recording};

const TEMPLATE: &str = include_str!("page.html");
const PAGE_JS: &str = include_str!("page.js");
const PAGE_CSS: &str = include_str!("page.css");
const UPLOT_JS: &str = include_str!("../../../assets/uplot/uPlot.iife.min.js");
const UPLOT_CSS: &str = include_str!("../../../assets/uplot/uPlot.min.css");

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// JSON inside a `<script>` element: `</script>` (or `<!--`) in a string must not end it.
fn script_json(v: &impl serde::Serialize) -> String {
    serde_json::to_string(v)
        .unwrap_or_else(|e| format!("{{\"error\":{:?}}}", e.to_string()))
        .replace('<', "\\u003c")
}

pub fn render(rec: &Recording, r: &Report) -> String {
    let s = &r.summary;
    let title = format!("tracer: PID {} ({})", s.pid, s.comm);
    let page = data::build(rec, r);
    // One pass over the template: the data is inserted last, so nothing in it is taken for a
    // placeholder.
    TEMPLATE
        .replace("{{TITLE}}", &esc(&title))
        .replacen("{{UPLOT_CSS}}", UPLOT_CSS, 1)
        .replacen("{{PAGE_CSS}}", PAGE_CSS, 1)
        .replacen("{{UPLOT_JS}}", UPLOT_JS, 1)
        .replacen("{{PAGE_JS}}", PAGE_JS, 1)
        .replacen("{{DATA}}", &script_json(&page), 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_json_cannot_end_its_script_element() {
        let j = script_json(&serde_json::json!({"comm": "</script><script>alert(1)"}));
        assert!(!j.contains("</script"), "{j}");
        let back: serde_json::Value = serde_json::from_str(&j).unwrap();
        assert_eq!(back["comm"], "</script><script>alert(1)");
    }
}
