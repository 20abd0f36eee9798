//! `tracer watch --otlp`: a receiver here takes the OTLP/HTTP requests and decodes them with
//! the message types generated from the official OpenTelemetry .proto files
//! (opentelemetry-proto), while a CPU hog shares the target's CPU. The metrics must be the
//! windows' own figures (the JSON lines of the same run) and the scheduling cause must have
//! risen by the wait the hog injected, as the kernel's /proc account of the target measures
//! it; each window whose verdict is not `none` must come as one span with its evidence.

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::{TcpListener, TcpStream},
    process::Command,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use opentelemetry_proto::tonic::{
    collector::{metrics::v1::ExportMetricsServiceRequest, trace::v1::ExportTraceServiceRequest},
    common::v1::{KeyValue, any_value::Value as Any},
    metrics::v1::{metric::Data, number_data_point::Value as Number},
};
use prost::Message;
use serde_json::Value;
use tracer_tests::{BUSY_TWO_THIRDS, Kill, Tracer, require_root, run_delay, run_tracer, serial};

type Received = Arc<Mutex<Vec<(String, Vec<u8>)>>>;

/// An OTLP/HTTP receiver on a free loopback port: every POST's path and body, answered 200
/// with an empty (valid) response message.
fn receiver() -> (u16, Received) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a free port");
    let port = listener.local_addr().unwrap().port();
    let got: Received = Arc::default();
    let g = Arc::clone(&got);
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let g = Arc::clone(&g);
            std::thread::spawn(move || serve(conn, &g));
        }
    });
    (port, got)
}

/// Requests on one (keep-alive) connection until it closes.
fn serve(conn: TcpStream, got: &Mutex<Vec<(String, Vec<u8>)>>) {
    let mut out = conn.try_clone().expect("a second handle");
    let mut r = BufReader::new(conn);
    loop {
        let mut first = String::new();
        if r.read_line(&mut first).unwrap_or(0) == 0 {
            return;
        }
        let path = first.split_whitespace().nth(1).unwrap_or("").to_string();
        let mut length = 0;
        loop {
            let mut h = String::new();
            r.read_line(&mut h).expect("a header");
            if h.trim().is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                length = v.trim().parse().expect("a length");
            }
        }
        let mut body = vec![0; length];
        r.read_exact(&mut body).expect("the body");
        got.lock().unwrap().push((path, body));
        let _ = out.write_all(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n",
        );
    }
}

fn string(kvs: &[KeyValue], key: &str) -> Option<String> {
    kvs.iter()
        .find(|k| k.key == key)
        .and_then(|k| match k.value.as_ref()?.value.as_ref()? {
            Any::StringValue(s) => Some(s.clone()),
            _ => None,
        })
}

/// The sum of a cumulative counter's points whose `label` is `value` (all with None).
fn counter(req: &ExportMetricsServiceRequest, name: &str, label: Option<(&str, &str)>) -> f64 {
    let m = req.resource_metrics[0].scope_metrics[0]
        .metrics
        .iter()
        .find(|m| m.name == name)
        .unwrap_or_else(|| panic!("no {name}"));
    let Some(Data::Sum(s)) = &m.data else {
        panic!("{name} is not a sum")
    };
    assert!(s.is_monotonic, "{name}");
    s.data_points
        .iter()
        .filter(|p| label.is_none_or(|(k, v)| string(&p.attributes, k).as_deref() == Some(v)))
        .map(|p| match p.value {
            Some(Number::AsDouble(d)) => d,
            Some(Number::AsInt(i)) => i as f64,
            None => 0.0,
        })
        .sum()
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("a number: {v}"))
}

#[test]
fn otlp_receives_the_windows_metrics_and_a_span_per_cause() {
    let _guard = serial();
    require_root();
    let target =
        Kill::group(Command::new("taskset").args(["-c", "0", "python3", "-c", BUSY_TWO_THIRDS]));
    let _hog =
        Kill::group(Command::new("taskset").args(["-c", "0", "python3", "-c", "while True: pass"]));
    std::thread::sleep(Duration::from_millis(300));
    let (port, got) = receiver();
    let pid = target.id().to_string();
    let url = format!("http://127.0.0.1:{port}");
    let (t0, delay0) = (Instant::now(), run_delay(target.id()));
    // A proxy in the environment is not used (the collector is on the node), and the
    // SDKs' resource variable adds to the resource.
    let tracer = Tracer::start_with_env(
        &[
            "watch", "-p", &pid, "-i", "2s", "--count", "5", "--no-gpu", "--json", "--otlp", &url,
        ],
        &[
            ("HTTP_PROXY", "http://127.0.0.1:9"),
            ("HTTPS_PROXY", "http://127.0.0.1:9"),
            ("ALL_PROXY", "http://127.0.0.1:9"),
            ("OTEL_RESOURCE_ATTRIBUTES", "k8s.node.name=node-7"),
        ],
    );
    let done = tracer.finish(Duration::from_secs(60));
    let (elapsed, delay) = (t0.elapsed(), run_delay(target.id()) - delay0);
    assert!(done.status.success(), "{}", done.stderr);
    let windows: Vec<Value> = done
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(windows.len(), 5, "{}", done.stderr);
    // The queue is flushed before the tracer exits: everything is here already.
    let got = got.lock().unwrap().clone();
    let metrics: Vec<ExportMetricsServiceRequest> = got
        .iter()
        .filter(|(p, _)| p == "/v1/metrics")
        .map(|(_, b)| ExportMetricsServiceRequest::decode(b.as_slice()).expect("decodes"))
        .collect();
    let spans: Vec<ExportTraceServiceRequest> = got
        .iter()
        .filter(|(p, _)| p == "/v1/traces")
        .map(|(_, b)| ExportTraceServiceRequest::decode(b.as_slice()).expect("decodes"))
        .collect();
    assert_eq!(metrics.len(), 5, "one metrics request a window");
    assert_eq!(
        got.len(),
        metrics.len() + spans.len(),
        "nothing else posted"
    );

    // The last request's totals are the windows' figures added up (the exposition prints
    // them to 6 decimals at least, hence 1 µs per window).
    let last = metrics.last().unwrap();
    let res = last.resource_metrics[0]
        .resource
        .as_ref()
        .expect("a resource");
    assert_eq!(
        string(&res.attributes, "service.name").as_deref(),
        Some("tracer")
    );
    assert_eq!(
        string(&res.attributes, "k8s.node.name").as_deref(),
        Some("node-7")
    );
    assert!(string(&res.attributes, "service.instance.id").is_some_and(|i| i.contains(&pid)));
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert_eq!(
        string(&res.attributes, "host.name").as_deref(),
        Some(host.trim())
    );
    // Every point from the first window's start to the last one's end.
    let unix = |w: &Value, k: &str| {
        (w[k].as_i64().unwrap() + w["realtime_minus_monotonic_ns"].as_i64().unwrap()) as u64
    };
    let m0 = &last.resource_metrics[0].scope_metrics[0].metrics[0];
    let Some(Data::Sum(sum)) = &m0.data else {
        panic!("{} is a counter", m0.name)
    };
    assert_eq!(
        (
            sum.data_points[0].start_time_unix_nano,
            sum.data_points[0].time_unix_nano
        ),
        (unix(&windows[0], "start_ns"), unix(&windows[4], "end_ns"))
    );
    let recorded: f64 = windows.iter().map(|w| f(&w["duration_ns"]) / 1e9).sum();
    assert!((counter(last, "tracer_recorded_seconds", None) - recorded).abs() < 5e-6);
    let sched: f64 = windows
        .iter()
        .flat_map(|w| {
            w["verdict"]["causes"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter(|c| c["cause"] == "scheduling")
        .map(|c| f(&c["attributed_ns"]) / 1e9)
        .sum();
    let exported = counter(
        last,
        "tracer_attributed_seconds",
        Some(("cause", "scheduling")),
    );
    assert!(
        (exported - sched).abs() < 5e-6,
        "{exported} exported, {sched} in the windows"
    );
    // Against the kernel's own account: what /proc says the target waited, at its rate over
    // the test, for the time the windows covered. Tolerance as in tests/prometheus.rs: the
    // cause is the contention part of the run-queue wait, and the rate is over the test.
    let injected = delay as f64 / 1e9 / elapsed.as_secs_f64() * recorded;
    eprintln!(
        "scheduling {exported:.3} s exported, {sched:.3} s in the windows, {injected:.3} s \
         injected by /proc over {recorded:.2} s; {} spans",
        spans.len()
    );
    assert!(
        injected > 0.1 * recorded,
        "the hog made it wait: {injected}"
    );
    assert!(
        (0.85 * injected..=1.15 * injected).contains(&exported),
        "scheduling {exported:.3} s exported against {injected:.3} s injected"
    );
    // The counters only grow from request to request.
    let series: Vec<f64> = metrics
        .iter()
        .map(|m| counter(m, "tracer_recorded_seconds", None))
        .collect();
    assert!(series.windows(2).all(|w| w[0] < w[1]), "{series:?}");

    // One span per window with a cause, in order, spanning it, with its evidence.
    let caused: Vec<&Value> = windows
        .iter()
        .filter(|w| w["verdict"]["primary"] != "none")
        .collect();
    assert!(!caused.is_empty(), "the hog gave a cause");
    assert_eq!(spans.len(), caused.len());
    for (req, w) in spans.iter().zip(&caused) {
        let span = &req.resource_spans[0].scope_spans[0].spans[0];
        assert_eq!(span.trace_id.len(), 16);
        assert_eq!(span.span_id.len(), 8);
        assert!(span.trace_id.iter().any(|b| *b != 0));
        let a = &span.attributes;
        assert_eq!(
            string(a, "tracer.verdict.primary").as_deref(),
            w["verdict"]["primary"].as_str()
        );
        let c0 = &w["verdict"]["causes"][0];
        assert_eq!(
            string(a, "tracer.cause.0.mechanism_id").as_deref(),
            c0["mechanism_id"].as_str()
        );
        assert_eq!(
            string(a, "tracer.cause.0.evidence").as_deref(),
            c0["evidence"].as_str()
        );
        let off = w["realtime_minus_monotonic_ns"].as_i64().unwrap();
        let at = |k: &str| (w[k].as_i64().unwrap() + off) as u64;
        assert_eq!(
            (span.start_time_unix_nano, span.end_time_unix_nano),
            (at("start_ns"), at("end_ns"))
        );
    }
    assert!(
        caused
            .iter()
            .any(|w| w["verdict"]["primary"] == "scheduling"),
        "the hog's cause named"
    );
}

#[test]
fn an_absent_collector_is_said_and_the_watch_goes_on() {
    let _guard = serial();
    require_root();
    // A port nobody listens on.
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let target = Kill::group(Command::new("python3").args(["-c", BUSY_TWO_THIRDS]));
    let pid = target.id().to_string();
    let url = format!("http://127.0.0.1:{port}");
    let tracer = Tracer::start(&[
        "watch", "-p", &pid, "-i", "1s", "--count", "3", "--no-gpu", "--json", "--otlp", &url,
    ]);
    let t0 = Instant::now();
    let done = tracer.finish(Duration::from_secs(30));
    assert!(done.status.success(), "{}", done.stderr);
    assert_eq!(
        done.stdout.lines().count(),
        3,
        "every window still reported"
    );
    assert_eq!(
        done.stderr.matches("OTLP: posting to").count(),
        1,
        "said once, not per window: {}",
        done.stderr
    );
    // Three 1-s windows; refused connections fail at once.
    assert!(t0.elapsed() < Duration::from_secs(8), "{:?}", t0.elapsed());
}

/// A collector that takes the connection and never answers: each post times out (3 s), and
/// the end is bounded (what is left after 5 s is given up), not a wait per request.
#[test]
fn a_collector_that_never_answers_does_not_hold_the_exit() {
    let _guard = serial();
    require_root();
    let listener = TcpListener::bind("127.0.0.1:0").expect("a free port");
    let port = listener.local_addr().unwrap().port();
    // Accepted and kept open, never read.
    let held = Arc::new(Mutex::new(Vec::new()));
    let h = Arc::clone(&held);
    std::thread::spawn(move || {
        for c in listener.incoming().flatten() {
            h.lock().unwrap().push(c);
        }
    });
    let target = Kill::group(Command::new("python3").args(["-c", BUSY_TWO_THIRDS]));
    let pid = target.id().to_string();
    let url = format!("http://127.0.0.1:{port}");
    let tracer = Tracer::start(&[
        "watch", "-p", &pid, "-i", "1s", "--count", "4", "--no-gpu", "--json", "--otlp", &url,
    ]);
    let t0 = Instant::now();
    let done = tracer.finish(Duration::from_secs(40));
    let took = t0.elapsed();
    assert!(done.status.success(), "{}", done.stderr);
    assert_eq!(
        done.stdout.lines().count(),
        4,
        "every window still reported"
    );
    assert!(done.stderr.contains("OTLP: posting to"), "{}", done.stderr);
    // 4 s of windows, then at most the 5-s flush and one post's 3-s timeout, and a margin.
    assert!(took < Duration::from_secs(15), "{took:?}: {}", done.stderr);
    assert!(!held.lock().unwrap().is_empty(), "the tracer connected");
}

#[test]
fn an_https_endpoint_is_refused_with_what_to_do() {
    let out = run_tracer(&["watch", "-p", "1", "--otlp", "https://collector:4318"]);
    assert!(!out.status.success());
    assert!(
        out.stderr.contains("https is not built in")
            && out.stderr.contains("http://127.0.0.1:4318"),
        "{}",
        out.stderr
    );
}
