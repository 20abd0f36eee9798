//! What the analysis returns: the summary, finished, and the verdict judged on it, side by
//! side. This is also the `--json` document; its fields keep the order they always had (the
//! target, then the verdict, then the rest of the summary).

use serde::Serialize;

use super::{summary::Summary, verdict::Verdict};

#[derive(Debug, Clone)]
pub struct Report {
    pub summary: Summary,
    pub verdict: Verdict,
}

// The summary's identifying fields first, the verdict, then the rest of the summary (whose own
// serialization leaves those fields out).
/// What tracer found in one recording: the target, the verdict, and the summary it was judged
/// on.
#[derive(Serialize, schemars::JsonSchema)]
#[schemars(rename = "Summary")]
struct ReportDoc<'a> {
    schema_version: u32,
    tracer_version: &'a str,
    pid: u32,
    comm: &'a str,
    cmdline: &'a [String],
    /// Which cause explains the jitter, with the evidence: what to act on.
    verdict: &'a Verdict,
    #[serde(flatten)]
    summary: &'a Summary,
}

impl<'a> From<&'a Report> for ReportDoc<'a> {
    fn from(r: &'a Report) -> Self {
        let s = &r.summary;
        Self {
            schema_version: s.schema_version,
            tracer_version: &s.tracer_version,
            pid: s.pid,
            comm: &s.comm,
            cmdline: &s.cmdline,
            verdict: &r.verdict,
            summary: s,
        }
    }
}

impl Serialize for Report {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        ReportDoc::from(self).serialize(s)
    }
}

impl schemars::JsonSchema for Report {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        ReportDoc::schema_name()
    }

    fn json_schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
        ReportDoc::json_schema(g)
    }
}
