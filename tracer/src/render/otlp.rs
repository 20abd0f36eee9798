//! `tracer watch --otlp`: the series `--prometheus` serves, as OTLP requests (the message
//! types opentelemetry-proto generates from the official .proto files), and one span per
//! window whose verdict is not `none`, its evidence as attributes, so that a trace backend can
//! put it beside the server's own request spans. Pure: the exposition text and the reports in,
//! requests out; `cli/watch/otlp.rs` sends them.
//!
//! The metrics are read back from the OpenMetrics text the Prometheus registry writes rather
//! than kept twice: one set of counters, so the two exports cannot disagree. Counters become
//! cumulative monotonic sums, gauges gauges, histograms explicit-bucket histograms, each data
//! point from the first window's start to the end of the window just closed.

use std::collections::BTreeMap;

use opentelemetry_proto::tonic::{
    collector::{metrics::v1::ExportMetricsServiceRequest, trace::v1::ExportTraceServiceRequest},
    common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value},
    metrics::v1::{
        AggregationTemporality, Gauge, Histogram, HistogramDataPoint, Metric, NumberDataPoint,
        ResourceMetrics, ScopeMetrics, Sum, metric, number_data_point,
    },
    resource::v1::Resource,
    trace::v1::{ResourceSpans, ScopeSpans, Span, span::SpanKind},
};

use super::serde_name;
use crate::{
    analysis::{Report, verdict::Primary},
    recording::Recording,
};

/// How many of a window's causes the span carries (the verdict ranks them).
const SPAN_CAUSES: usize = 3;

/// Attributes: the exporting process and its target, the same on every request.
pub type Attributes = Vec<(String, String)>;

/// A sample's labels, in the text's order.
type Labels = Vec<(String, String)>;

/// A sample line: its name, labels and value.
type Sample = (String, Labels, f64);

/// A histogram's samples of one label set: (le, cumulative count) buckets, sum, count.
#[derive(Default)]
struct Buckets {
    le: Vec<(f64, f64)>,
    sum: f64,
    count: f64,
}

/// A metric family of the exposition: `# TYPE`, `# HELP`, `# UNIT` and its samples.
#[derive(Debug, Default)]
struct Family {
    kind: String,
    help: String,
    unit: String,
    /// In the text's order.
    samples: Vec<Sample>,
}

/// The families of an OpenMetrics text exposition, by name. Only what prometheus-client
/// writes is understood (no timestamps, no exemplars); anything else is skipped.
fn parse(text: &str) -> BTreeMap<String, Family> {
    let mut families: BTreeMap<String, Family> = BTreeMap::new();
    for line in text.lines() {
        if let Some(meta) = line.strip_prefix("# ") {
            let mut parts = meta.splitn(3, ' ');
            let (Some(what), Some(name)) = (parts.next(), parts.next()) else {
                continue;
            };
            let rest = parts.next().unwrap_or("").to_string();
            let f = families.entry(name.to_string()).or_default();
            match what {
                "TYPE" => f.kind = rest,
                "HELP" => f.help = rest,
                "UNIT" => f.unit = rest,
                _ => {}
            }
            continue;
        }
        let Some((name, labels, value)) = sample(line) else {
            continue;
        };
        // The family: the sample's name, or it less the suffix its type adds.
        let family = ["", "_total", "_bucket", "_sum", "_count"]
            .iter()
            .filter_map(|sfx| name.strip_suffix(sfx))
            .find(|f| families.contains_key(*f))
            .map(str::to_string);
        if let Some(f) = family.and_then(|f| families.get_mut(&f)) {
            f.samples.push((name, labels, value));
        }
    }
    families
}

/// `name{a="b",c="d"} value`. Label values come unescaped from prometheus-client, and
/// `prometheus.rs` keeps quotes, backslashes and line breaks out of them.
fn sample(line: &str) -> Option<Sample> {
    let (head, value) = line.rsplit_once(' ')?;
    let value: f64 = value.parse().ok()?;
    let Some((name, labels)) = head.split_once('{') else {
        return Some((head.to_string(), Vec::new(), value));
    };
    let mut out = Vec::new();
    let mut rest = labels.strip_suffix('}')?;
    while let Some((key, after)) = rest.split_once("=\"") {
        let (v, after) = after.split_once('"')?;
        out.push((key.trim_start_matches(',').to_string(), v.to_string()));
        rest = after;
    }
    Some((name.to_string(), out, value))
}

fn kv(key: &str, value: any_value::Value) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue { value: Some(value) }),
        ..Default::default()
    }
}

fn string(key: &str, value: &str) -> KeyValue {
    kv(key, any_value::Value::StringValue(value.to_string()))
}

fn labels(l: &[(String, String)]) -> Vec<KeyValue> {
    l.iter().map(|(k, v)| string(k, v)).collect()
}

fn resource(attributes: &Attributes) -> Resource {
    Resource {
        attributes: labels(attributes),
        ..Default::default()
    }
}

fn scope() -> InstrumentationScope {
    InstrumentationScope {
        name: "tracer".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        ..Default::default()
    }
}

/// The exposition's families as OTLP metrics, each point covering `start_ns`..`now_ns` (Unix
/// time: the first window's start, the latest one's end).
pub fn metrics_request(
    exposition: &str,
    attributes: &Attributes,
    start_ns: u64,
    now_ns: u64,
) -> ExportMetricsServiceRequest {
    let point = |l: &[(String, String)], v: f64| NumberDataPoint {
        attributes: labels(l),
        start_time_unix_nano: start_ns,
        time_unix_nano: now_ns,
        value: Some(number_data_point::Value::AsDouble(v)),
        ..Default::default()
    };
    let mut metrics = Vec::new();
    for (name, f) in parse(exposition) {
        let data = match f.kind.as_str() {
            "counter" => metric::Data::Sum(Sum {
                data_points: f
                    .samples
                    .iter()
                    .filter(|(n, ..)| n.ends_with("_total"))
                    .map(|(_, l, v)| point(l, *v))
                    .collect(),
                aggregation_temporality: AggregationTemporality::Cumulative as i32,
                is_monotonic: true,
            }),
            "gauge" => metric::Data::Gauge(Gauge {
                data_points: f.samples.iter().map(|(_, l, v)| point(l, *v)).collect(),
            }),
            "histogram" => metric::Data::Histogram(Histogram {
                data_points: histogram_points(&name, &f, start_ns, now_ns),
                aggregation_temporality: AggregationTemporality::Cumulative as i32,
            }),
            _ => continue,
        };
        // UCUM, as OTLP has units.
        let unit = match f.unit.as_str() {
            "seconds" => "s".into(),
            "bytes" => "By".into(),
            "" if name.ends_with("_ratio") => "1".into(),
            "" if name.ends_with("_hertz") => "Hz".into(),
            u => u.into(),
        };
        metrics.push(Metric {
            name,
            description: f.help,
            unit,
            data: Some(data),
            ..Default::default()
        });
    }
    ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            resource: Some(resource(attributes)),
            scope_metrics: vec![ScopeMetrics {
                scope: Some(scope()),
                metrics,
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

/// A histogram's `_bucket` (cumulative, by `le`), `_sum` and `_count` samples, grouped by their
/// other labels, as OTLP points: per-bucket counts, the bounds without +Inf.
fn histogram_points(name: &str, f: &Family, start_ns: u64, now_ns: u64) -> Vec<HistogramDataPoint> {
    let mut points: BTreeMap<Labels, Buckets> = BTreeMap::new();
    for (n, l, v) in &f.samples {
        let key: Labels = l.iter().filter(|(k, _)| k != "le").cloned().collect();
        let p = points.entry(key).or_default();
        match n.strip_prefix(name) {
            Some("_bucket") => {
                let le = l.iter().find(|(k, _)| k == "le");
                if let Some(le) = le.and_then(|(_, v)| v.parse::<f64>().ok()) {
                    p.le.push((le, *v));
                }
            }
            Some("_sum") => p.sum = *v,
            Some("_count") => p.count = *v,
            _ => {}
        }
    }
    points
        .into_iter()
        .map(
            |(
                l,
                Buckets {
                    le: mut buckets,
                    sum,
                    count,
                },
            )| {
                buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
                let mut below = 0.0;
                let bucket_counts = buckets
                    .iter()
                    .map(|&(_, cumulative)| {
                        let n = (cumulative - below).max(0.0) as u64;
                        below = cumulative;
                        n
                    })
                    .collect();
                HistogramDataPoint {
                    attributes: labels(&l),
                    start_time_unix_nano: start_ns,
                    time_unix_nano: now_ns,
                    count: count as u64,
                    sum: Some(sum),
                    bucket_counts,
                    explicit_bounds: buckets
                        .iter()
                        .map(|b| b.0)
                        .filter(|b| b.is_finite())
                        .collect(),
                    ..Default::default()
                }
            },
        )
        .collect()
}

/// A span for a window whose verdict is not `none`, from its start to its end (Unix time),
/// with the verdict and its first causes as attributes; `ids` are the trace and span IDs.
pub fn window_span(
    rec: &Recording,
    report: &Report,
    attributes: &Attributes,
    ids: ([u8; 16], [u8; 8]),
) -> Option<ExportTraceServiceRequest> {
    let v = &report.verdict;
    if v.primary == Primary::None {
        return None;
    }
    let mut attrs = vec![
        string("tracer.verdict.primary", &serde_name(&v.primary)),
        string("tracer.verdict.headline", &v.headline),
        string("tracer.verdict.basis", &serde_name(&v.basis)),
        kv(
            "tracer.window.seconds",
            any_value::Value::DoubleValue(report.summary.duration_ns as f64 / 1e9),
        ),
    ];
    if let Some(q) = &report.summary.requests {
        // No request: no p99 to speak of (not 0).
        if q.requests > 0 {
            attrs.push(kv(
                "tracer.requests.p99_seconds",
                any_value::Value::DoubleValue(q.p99_ns as f64 / 1e9),
            ));
        }
        attrs.push(kv(
            "tracer.requests.count",
            any_value::Value::IntValue(q.requests as i64),
        ));
    }
    for (i, c) in v.causes.iter().take(SPAN_CAUSES).enumerate() {
        let key = |k: &str| format!("tracer.cause.{i}.{k}");
        attrs.push(string(&key("category"), &serde_name(&c.cause())));
        attrs.push(string(&key("mechanism_id"), c.mechanism.id()));
        attrs.push(string(&key("mechanism"), &c.mechanism.to_string()));
        attrs.push(kv(&key("share"), any_value::Value::DoubleValue(c.share)));
        attrs.push(string(&key("evidence"), &c.evidence));
        if let Some(a) = &c.acts_in {
            attrs.push(kv(
                &key("acts_in.pid"),
                any_value::Value::IntValue(a.pid as i64),
            ));
            attrs.push(string(&key("acts_in.role"), &a.role));
        }
    }
    let span = Span {
        trace_id: ids.0.to_vec(),
        span_id: ids.1.to_vec(),
        name: format!("tracer window: {}", serde_name(&v.primary)),
        kind: SpanKind::Internal as i32,
        start_time_unix_nano: rec.host.unix_ns(rec.start_ns),
        end_time_unix_nano: rec.host.unix_ns(rec.end_ns),
        attributes: attrs,
        ..Default::default()
    };
    Some(ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(resource(attributes)),
            scope_spans: vec![ScopeSpans {
                scope: Some(scope()),
                spans: vec![span],
                ..Default::default()
            }],
            ..Default::default()
        }],
    })
}

#[cfg(test)]
mod tests;
