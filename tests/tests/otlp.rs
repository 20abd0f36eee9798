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
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use opentelemetry_proto::tonic::{
    collector::{
        metrics::v1::{
            ExportMetricsPartialSuccess, ExportMetricsServiceRequest, ExportMetricsServiceResponse,
        },
        trace::v1::ExportTraceServiceRequest,
    },
    common::v1::{KeyValue, any_value::Value as Any},
    metrics::v1::{metric::Data, number_data_point::Value as Number},
};
use prost::Message;
use serde_json::Value;
use tracer_tests::{
    BUSY_TWO_THIRDS, Finished, Kill, Tracer, require_root, run_delay, run_tracer, serial,
};

/// A request the receiver took: its path, its body, when.
type Request = (String, Vec<u8>, Instant);
type Received = Arc<Mutex<Vec<Request>>>;

const TAKEN: &[u8] =
    b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n";

/// An OTLP/HTTP receiver on a free loopback port: every POST's path and body, answered 200
/// with an empty (valid) response message.
fn receiver() -> (u16, Received) {
    receiver_answering(|_, _| TAKEN.to_vec())
}

/// The same, answering the Nth request (from 0, over all connections) to PATH as `answer` says.
fn receiver_answering(
    answer: impl Fn(usize, &str) -> Vec<u8> + Send + Sync + 'static,
) -> (u16, Received) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a free port");
    let port = listener.local_addr().unwrap().port();
    let got: Received = Arc::default();
    let g = Arc::clone(&got);
    let answer = Arc::new(answer);
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let (g, a) = (Arc::clone(&g), Arc::clone(&answer));
            std::thread::spawn(move || serve(conn, &g, &*a));
        }
    });
    (port, got)
}

/// Requests on one (keep-alive) connection until it closes.
fn serve(
    conn: TcpStream,
    got: &Mutex<Vec<(String, Vec<u8>, Instant)>>,
    answer: &dyn Fn(usize, &str) -> Vec<u8>,
) {
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
        let n = {
            let mut g = got.lock().unwrap();
            g.push((path.clone(), body, Instant::now()));
            g.len() - 1
        };
        let _ = out.write_all(&answer(n, &path));
    }
}

/// An HTTP response with a protobuf body and extra header lines.
fn answer(status: &str, headers: &str, body: &[u8]) -> Vec<u8> {
    let mut r = format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/x-protobuf\r\n{headers}\
         Content-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    r.extend_from_slice(body);
    r
}

/// `google.rpc.Status`, the body of an OTLP/HTTP failure (its code and message).
#[derive(Clone, PartialEq, prost::Message)]
struct Status {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
}

/// A target sharing CPU 0 with a hog, so that every window has a cause (and a span).
fn hogged_target() -> (Kill, Kill) {
    let target =
        Kill::group(Command::new("taskset").args(["-c", "0", "python3", "-c", BUSY_TWO_THIRDS]));
    let hog =
        Kill::group(Command::new("taskset").args(["-c", "0", "python3", "-c", "while True: pass"]));
    std::thread::sleep(Duration::from_millis(300));
    (target, hog)
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
    let (target, _hog) = hogged_target();
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
        .filter(|(p, ..)| p == "/v1/metrics")
        .map(|(_, b, _)| ExportMetricsServiceRequest::decode(b.as_slice()).expect("decodes"))
        .collect();
    let spans: Vec<ExportTraceServiceRequest> = got
        .iter()
        .filter(|(p, ..)| p == "/v1/traces")
        .map(|(_, b, _)| ExportTraceServiceRequest::decode(b.as_slice()).expect("decodes"))
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
    assert_eq!(
        done.stdout.lines().count(),
        3,
        "every window still reported"
    );
    // Nothing was exported, which the exit says.
    assert_eq!(done.status.code(), Some(1), "{}", done.stderr);
    assert!(
        done.stderr
            .contains("took none of the requests of the watch's 3 windows"),
        "{}",
        done.stderr
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
    let done = tracer.finish(Duration::from_secs(40));
    let after = exited_after_last_window(&done.stdout);
    assert_eq!(
        done.status.code(),
        Some(1),
        "nothing exported: {}",
        done.stderr
    );
    assert_eq!(
        done.stdout.lines().count(),
        4,
        "every window still reported"
    );
    assert!(done.stderr.contains("OTLP: posting to"), "{}", done.stderr);
    // The end's 5 s bound posts too (one in flight when the watch ended included), and a
    // margin for detaching.
    eprintln!("exited {after:?} after the last window's end");
    assert!(after < Duration::from_secs(7), "{after:?}: {}", done.stderr);
    assert!(!held.lock().unwrap().is_empty(), "the tracer connected");
}

/// How long after the last window's end (its JSON line's, in Unix time) the watch exited:
/// called as soon as `finish` returns.
fn exited_after_last_window(stdout: &str) -> Duration {
    let exited = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let last: Value = serde_json::from_str(stdout.lines().last().expect("a window")).unwrap();
    let end =
        last["end_ns"].as_i64().unwrap() + last["realtime_minus_monotonic_ns"].as_i64().unwrap();
    exited.saturating_sub(Duration::from_nanos(end as u64))
}

/// The windows of a `--json` watch, and the Unix start of those with a cause (their spans').
fn caused_starts(stdout: &str) -> (usize, Vec<u64>) {
    let windows: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    let caused = windows
        .iter()
        .filter(|w| w["verdict"]["primary"] != "none")
        .map(|w| {
            (w["start_ns"].as_i64().unwrap() + w["realtime_minus_monotonic_ns"].as_i64().unwrap())
                as u64
        })
        .collect();
    (windows.len(), caused)
}

/// A watch of `count` 1-s windows of a hogged target that posts to a receiver answering as
/// `answer` says: the tracer's output (it exited 0, with every window), the Unix starts of the
/// windows with a cause (there is one at least), and what the receiver got.
fn watch_hogged(
    count: usize,
    answer: impl Fn(usize, &str) -> Vec<u8> + Send + Sync + 'static,
) -> (Finished, Vec<u64>, Vec<Request>) {
    let (target, _hog) = hogged_target();
    let (port, got) = receiver_answering(answer);
    let (pid, url) = (target.id().to_string(), format!("http://127.0.0.1:{port}"));
    let n = count.to_string();
    let tracer = Tracer::start(&[
        "watch", "-p", &pid, "-i", "1s", "--count", &n, "--no-gpu", "--json", "--otlp", &url,
    ]);
    let done = tracer.finish(Duration::from_secs(60));
    assert!(done.status.success(), "{}", done.stderr);
    let (windows, caused) = caused_starts(&done.stdout);
    assert_eq!(windows, count, "{}", done.stderr);
    assert!(!caused.is_empty(), "the hog gave a cause");
    let got = got.lock().unwrap().clone();
    (done, caused, got)
}

fn span_start(body: &[u8]) -> u64 {
    let req = ExportTraceServiceRequest::decode(body).expect("decodes");
    req.resource_spans[0].scope_spans[0].spans[0].start_time_unix_nano
}

/// A collector that cannot take a request now (429 with `Retry-After: 2` for the first
/// metrics, 503 without it for the first span) is waited for as it asks, then for the 1-s
/// backoff, and nothing is lost: the refused span comes again and every window's span is
/// taken once.
#[test]
fn a_collector_that_says_wait_is_waited_for_and_nothing_is_lost() {
    let _guard = serial();
    require_root();
    let slow = Status {
        code: 8,
        message: "slow down".into(),
    }
    .encode_to_vec();
    let (metrics, traces) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let (done, caused, got) = watch_hogged(6, move |_, path| {
        let first = |n: &AtomicUsize| n.fetch_add(1, Ordering::SeqCst) == 0;
        match path {
            "/v1/metrics" if first(&metrics) => {
                answer("429 Too Many Requests", "Retry-After: 2\r\n", &slow)
            }
            "/v1/traces" if first(&traces) => answer("503 Service Unavailable", "", b""),
            _ => TAKEN.to_vec(),
        }
    });
    let first_span = got
        .iter()
        .position(|(p, ..)| p == "/v1/traces")
        .expect("a span");
    assert!(first_span > 0 && first_span + 1 < got.len(), "{got:?}");
    // Nothing posted in the 2 s asked for, nor in the 1-s backoff after the 503.
    let gap = |i: usize| got[i + 1].2 - got[i].2;
    assert!(gap(0) >= Duration::from_millis(1950), "{:?}", gap(0));
    assert!(
        gap(first_span) >= Duration::from_millis(950),
        "{:?}",
        gap(first_span)
    );
    // Every window's span taken once; the refused one was sent again.
    let mut taken: Vec<u64> = got
        .iter()
        .enumerate()
        .filter(|&(i, (p, ..))| p == "/v1/traces" && i != first_span)
        .map(|(_, (_, b, _))| span_start(b))
        .collect();
    taken.sort_unstable();
    assert_eq!(taken, caused);
    // Each failure streak (the 429, then the 503 after metrics were taken) is said once,
    // with the collector's reason, and so is its end.
    let said = |s: &str| done.stderr.matches(s).count();
    assert_eq!(said("OTLP: posting to"), 2, "{}", done.stderr);
    assert_eq!(said("takes requests again"), 2, "{}", done.stderr);
    assert_eq!(
        said("/v1/metrics failed: HTTP 429: slow down; trying again in 2s, as it asked"),
        1,
        "{}",
        done.stderr
    );
    assert_eq!(
        said("/v1/traces failed: HTTP 503; trying again in 1s"),
        1,
        "{}",
        done.stderr
    );
}

/// A partial success and a final refusal (400) are said once however often they repeat, and
/// neither request is sent again.
#[test]
fn refusals_and_partial_successes_are_said_once_and_not_sent_again() {
    let _guard = serial();
    require_root();
    let partial = ExportMetricsServiceResponse {
        partial_success: Some(ExportMetricsPartialSuccess {
            rejected_data_points: 3,
            error_message: "too many series".into(),
        }),
    }
    .encode_to_vec();
    let bad = Status {
        code: 3,
        message: "span too large".into(),
    }
    .encode_to_vec();
    let (done, caused, got) = watch_hogged(3, move |_, path| {
        if path == "/v1/metrics" {
            answer("200 OK", "", &partial)
        } else {
            answer("400 Bad Request", "", &bad)
        }
    });
    let count = |path: &str| got.iter().filter(|(p, ..)| p == path).count();
    // At most one a window (a newer one replaces one not yet sent), none again.
    assert!((1..=3).contains(&count("/v1/metrics")), "{got:?}");
    assert_eq!(count("/v1/traces"), caused.len(), "one a span, none again");
    let said = |s: &str| done.stderr.matches(s).count();
    assert_eq!(
        said("rejected 3 data points: too many series"),
        1,
        "{}",
        done.stderr
    );
    assert_eq!(
        said("refused a request: HTTP 400: span too large; it is not sent again"),
        1,
        "{}",
        done.stderr
    );
    assert_eq!(
        said("posting to"),
        0,
        "not a failure to retry: {}",
        done.stderr
    );
}

/// A wait the collector asks for that ends after the end's bound is not waited for: the watch
/// ends at once, says what was not sent and why, and posts nothing in the wait.
#[test]
fn a_wait_past_the_end_is_not_waited_for() {
    let _guard = serial();
    require_root();
    let target = Kill::group(Command::new("python3").args(["-c", BUSY_TWO_THIRDS]));
    let (port, got) =
        receiver_answering(|_, _| answer("503 Service Unavailable", "Retry-After: 60\r\n", b""));
    let (pid, url) = (target.id().to_string(), format!("http://127.0.0.1:{port}"));
    let tracer = Tracer::start(&[
        "watch", "-p", &pid, "-i", "1s", "--count", "2", "--no-gpu", "--json", "--otlp", &url,
    ]);
    let done = tracer.finish(Duration::from_secs(60));
    let after = exited_after_last_window(&done.stdout);
    assert_eq!(
        done.status.code(),
        Some(1),
        "nothing exported: {}",
        done.stderr
    );
    assert_eq!(
        done.stdout.lines().count(),
        2,
        "every window still reported"
    );
    assert_eq!(got.lock().unwrap().len(), 1, "nothing posted in the wait");
    assert!(
        done.stderr.contains("at the end the last metrics")
            && done
                .stderr
                .contains("were not sent: the collector asked to wait 60s"),
        "{}",
        done.stderr
    );
    // Given up at once: not the minute asked for, nor the 5 s the end may take; what is left
    // is detaching and exiting.
    eprintln!("exited {after:?} after the last window's end");
    assert!(after < Duration::from_secs(3), "{after:?}");
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
