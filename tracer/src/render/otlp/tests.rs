use prost::Message;

use super::*;
use crate::{
    analysis::analyze,
    recording::testutil::{recording, thread},
    render::prometheus::Metrics,
};

fn attrs() -> Attributes {
    vec![("service.name".into(), "tracer".into())]
}

fn text_value(a: &AnyValue) -> String {
    match a.value.as_ref() {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        v => format!("{v:?}"),
    }
}

fn attr(kvs: &[KeyValue], key: &str) -> Option<String> {
    kvs.iter()
        .find(|k| k.key == key)
        .and_then(|k| k.value.as_ref())
        .map(text_value)
}

/// Two windows of a thread that waited 2 µs and 3 ms for a CPU: the series --prometheus
/// serves, through the protobuf encoding and back.
#[test]
fn the_exposition_becomes_otlp_metrics() {
    let mut t = thread(4242, 9_000, 1_000, &[2_000, 3_000_000]);
    t.pid = 100;
    let rec = recording(vec![t], vec![]);
    let report = analyze(&rec);
    let m = Metrics::new();
    m.add(&rec, &report);
    m.add(&rec, &report);
    let req = metrics_request(&m.encode(), &attrs(), 1_000, 2_000);
    let bytes = req.encode_to_vec();
    let back = ExportMetricsServiceRequest::decode(bytes.as_slice()).expect("decodes");
    assert_eq!(back, req);
    let rm = &back.resource_metrics[0];
    assert_eq!(
        attr(
            &rm.resource.as_ref().expect("a resource").attributes,
            "service.name"
        )
        .as_deref(),
        Some("tracer")
    );
    let metrics = &rm.scope_metrics[0].metrics;
    let get = |name: &str| {
        metrics
            .iter()
            .find(|x| x.name == name)
            .unwrap_or_else(|| panic!("no {name} in {metrics:#?}"))
    };
    let Some(metric::Data::Sum(sum)) = &get("tracer_attributed_seconds").data else {
        panic!("a sum");
    };
    assert!(sum.is_monotonic);
    assert_eq!(
        sum.aggregation_temporality,
        AggregationTemporality::Cumulative as i32
    );
    let p = &sum.data_points[0];
    assert_eq!(attr(&p.attributes, "cause").as_deref(), Some("scheduling"));
    assert_eq!(
        attr(&p.attributes, "mechanism_id").as_deref(),
        Some("run_queue_contention")
    );
    assert_eq!((p.start_time_unix_nano, p.time_unix_nano), (1_000, 2_000));
    let Some(number_data_point::Value::AsDouble(v)) = p.value else {
        panic!("a double");
    };
    assert!((v - 2e-6).abs() < 1e-12, "{v}");
    assert_eq!(get("tracer_attributed_seconds").unit, "s");
    let Some(metric::Data::Histogram(h)) = &get("tracer_runqueue_wait_seconds").data else {
        panic!("a histogram");
    };
    let p = &h.data_points[0];
    assert_eq!(p.count, 4);
    assert_eq!(p.bucket_counts.iter().sum::<u64>(), 4);
    assert_eq!(p.bucket_counts.len(), p.explicit_bounds.len() + 1);
    assert!(attr(&p.attributes, "le").is_none());
    // 2 µs lands in (1.024 µs, 2.048 µs], 3 ms in (2.097 ms, 4.194 ms].
    let at = |bound: f64| {
        let i = p
            .explicit_bounds
            .iter()
            .position(|b| (b - bound).abs() < 1e-12)
            .expect("the bound");
        p.bucket_counts[i]
    };
    assert_eq!((at(0.000002048), at(0.004194304)), (2, 2));
    assert!(matches!(
        get("tracer_resident_memory_bytes").data,
        Some(metric::Data::Gauge(_))
    ));
    assert_eq!(get("tracer_resident_memory_bytes").unit, "By");
    // Every family of the exposition is there, and no thread ID anywhere.
    let families = m
        .encode()
        .lines()
        .filter(|l| l.starts_with("# TYPE"))
        .count();
    assert_eq!(metrics.len(), families);
    assert!(!format!("{back:?}").contains("4242"));
}

#[test]
fn sample_lines_are_read() {
    let (name, labels, v) = sample(r#"x_total{a="q u",b="c:d/e"} 2.5"#).expect("a sample");
    assert_eq!(name, "x_total");
    assert_eq!(
        labels,
        vec![
            ("a".to_string(), "q u".to_string()),
            ("b".to_string(), "c:d/e".to_string())
        ]
    );
    assert_eq!(v, 2.5);
    assert_eq!(sample("y 1").map(|s| s.2), Some(1.0));
    assert!(sample("# EOF").is_none());
    // A family whose name another's starts with keeps its own samples.
    let f = parse("# TYPE a counter\n# TYPE a_b gauge\na_total 1\na_b 2\na_b_total 3\n# EOF\n");
    assert_eq!(f["a"].samples.len(), 1);
    assert_eq!(f["a_b"].samples.len(), 2);
}

#[test]
fn a_window_with_a_cause_is_a_span_and_one_without_is_none() {
    let mut t = thread(4242, 9_000, 1_000, &[2_000, 3_000_000]);
    t.pid = 100;
    let rec = recording(vec![t], vec![]);
    let report = analyze(&rec);
    assert_ne!(report.verdict.primary, Primary::None);
    let req = window_span(&rec, &report, &attrs(), ([7; 16], [9; 8])).expect("a span");
    let span = &req.resource_spans[0].scope_spans[0].spans[0];
    assert_eq!(span.trace_id, vec![7; 16]);
    assert_eq!(
        attr(&span.attributes, "tracer.verdict.primary").as_deref(),
        Some("scheduling")
    );
    assert_eq!(
        attr(&span.attributes, "tracer.cause.0.mechanism_id").as_deref(),
        Some("run_queue_contention")
    );
    assert!(attr(&span.attributes, "tracer.cause.0.evidence").is_some());
    let off = rec.host.realtime_minus_monotonic_ns as i128;
    assert_eq!(
        span.start_time_unix_nano as i128,
        (rec.start_ns as i128 + off).max(0)
    );
    assert!(span.end_time_unix_nano >= span.start_time_unix_nano);

    let quiet = recording(vec![thread(4243, 9_000, 0, &[])], vec![]);
    let report = analyze(&quiet);
    assert_eq!(report.verdict.primary, Primary::None);
    assert!(window_span(&quiet, &report, &attrs(), ([1; 16], [1; 8])).is_none());
}
