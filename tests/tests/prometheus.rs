//! `tracer watch --prometheus`, scraped by a real Prometheus server (Debian's package, started
//! here on loopback with its own configuration and storage, stopped at the end) while a CPU
//! hog shares the target's CPU. The scheduling cause's counter, as Prometheus stored it, must
//! have risen by the run-queue wait the hog injected, which the kernel's own account of the
//! target (/proc/PID/schedstat's run delay) measures independently; and no series may carry a
//! thread or request ID.

use std::{
    io::{Read as _, Write as _},
    net::{TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;
use tracer_tests::{BUSY_TWO_THIRDS, Kill, Tracer, require_root, run_delay, serial};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// GET `path` from 127.0.0.1:`port`; the body.
fn get(port: u16, path: &str) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut all = String::new();
    s.read_to_string(&mut all).ok()?;
    let (head, body) = all.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.")
        .then(|| head.split_whitespace().nth(1) == Some("200"))
        .filter(|ok| *ok)
        .map(|_| body.to_string())
}

/// The status `method path` gets from 127.0.0.1:`port`, and the body.
fn ask(port: u16, method: &str, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
    let mut all = String::new();
    s.read_to_string(&mut all).unwrap();
    let (head, body) = all.split_once("\r\n\r\n").unwrap_or((&all, ""));
    let code = head.split_whitespace().nth(1).and_then(|c| c.parse().ok());
    (code.unwrap_or(0), body.to_string())
}

/// A PromQL instant query's result vector.
fn query(port: u16, promql: &str) -> Vec<Value> {
    let q: String = promql
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'_' | b'.' | b'-' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect();
    let body = get(port, &format!("/api/v1/query?query={q}")).expect("Prometheus answers");
    let v: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(v["status"], "success", "{body}");
    v["data"]["result"].as_array().cloned().unwrap_or_default()
}

fn value(sample: &Value) -> f64 {
    sample["value"][1]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("a value")
}

struct Prometheus {
    _server: Kill,
    port: u16,
    dir: PathBuf,
}

impl Prometheus {
    fn start(dir: &Path, target: u16) -> Self {
        let port = free_port();
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\nscrape_configs:\n  \
                 - job_name: tracer\n    static_configs:\n      - targets: ['127.0.0.1:{target}']\n"
            ),
        )
        .unwrap();
        let server = Kill::group(
            Command::new("prometheus")
                .arg(format!("--config.file={}", config.display()))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    dir.join("data").display()
                ))
                .arg(format!("--web.listen-address=127.0.0.1:{port}"))
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(dir.join("prometheus.log")).unwrap()),
        );
        let p = Self {
            _server: server,
            port,
            dir: dir.to_path_buf(),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while get(port, "/-/ready").is_none() {
            assert!(
                Instant::now() < deadline,
                "Prometheus did not start: {}",
                std::fs::read_to_string(p.dir.join("prometheus.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        p
    }
}

#[test]
fn prometheus_scrapes_the_scheduling_cause_the_hog_injected() {
    let _guard = serial();
    require_root();
    let dir = std::env::temp_dir().join(format!("tracer-prom-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // The target and a hog on the same CPU.
    let target =
        Kill::group(Command::new("taskset").args(["-c", "0", "python3", "-c", BUSY_TWO_THIRDS]));
    let _hog =
        Kill::group(Command::new("taskset").args(["-c", "0", "python3", "-c", "while True: pass"]));
    std::thread::sleep(Duration::from_millis(300));
    let exporter = free_port();
    let pid = target.id().to_string();
    let addr = format!("127.0.0.1:{exporter}");
    let tracer = Tracer::start(&[
        "watch",
        "-p",
        &pid,
        "-i",
        "2s",
        "--no-gpu",
        "--prometheus",
        &addr,
    ]);
    let prom = Prometheus::start(&dir, exporter);
    let (t0, delay0) = (Instant::now(), run_delay(target.id()));
    std::thread::sleep(Duration::from_secs(30));
    let (elapsed, delay) = (t0.elapsed(), run_delay(target.id()) - delay0);

    let up = query(prom.port, "up{job=\"tracer\"}");
    assert_eq!(up.len(), 1, "{up:?}");
    assert_eq!(value(&up[0]), 1.0, "Prometheus parsed the exposition");
    let sched = query(
        prom.port,
        "sum(tracer_attributed_seconds_total{cause=\"scheduling\"})",
    );
    let recorded = query(prom.port, "tracer_recorded_seconds_total");
    let (sched, recorded) = (value(&sched[0]), value(&recorded[0]));
    // What /proc says the target waited over the windows Prometheus has seen (the scrape
    // after the last window it saw): its wait rate over the test times their length.
    let injected = delay as f64 / 1e9 / elapsed.as_secs_f64() * recorded;
    assert!(recorded >= 20.0, "windows seen: {recorded} s");
    // The hog's share on a loaded CI host varies (0.23 to 0.4 of the time seen): a tenth
    // is enough for the comparison below to mean something.
    assert!(
        injected > 0.1 * recorded,
        "the hog made it wait: {injected} s"
    );
    // Tolerance: the counter is the contention part of the run-queue wait (waits charged to
    // the idle task or after a forced move are other causes), and /proc's rate is over the
    // test, not the windows; 15 % covers both.
    assert!(
        (0.85 * injected..=1.15 * injected).contains(&sched),
        "scheduling counter {sched:.2} s against {injected:.2} s injected ({recorded} s \
         recorded)"
    );

    // No thread or request IDs: the labels every series has are these, and no others.
    let labels: Value = serde_json::from_str(&get(prom.port, "/api/v1/labels").unwrap()).unwrap();
    let allowed = [
        "__name__",
        "instance",
        "job",
        "cause",
        "mechanism_id",
        "process_role",
        "waker",
        "gpu",
        "uuid",
        "policy",
        "primary",
        "le",
    ];
    for l in labels["data"].as_array().unwrap() {
        let l = l.as_str().unwrap();
        assert!(allowed.contains(&l), "label {l} on an exported series");
    }
    let values = query(prom.port, "{job=\"tracer\"}");
    let tid = target.id().to_string();
    for s in &values {
        for (k, v) in s["metric"].as_object().unwrap() {
            assert!(
                v.as_str() != Some(&tid) && !k.contains("tid"),
                "an ID as a label: {s}"
            );
        }
    }
    // HEAD as GET without the body; a trigger without a flight recorder says there is none.
    let (code, body) = ask(exporter, "HEAD", "/metrics");
    assert_eq!((code, body.as_str()), (200, ""));
    let (code, body) = ask(exporter, "POST", "/trigger");
    assert_eq!(code, 409, "{body}");
    assert!(body.contains("--keep"), "{body}");
    tracer.signal(libc::SIGINT);
    let out = tracer.finish(Duration::from_secs(20));
    assert!(out.status.success(), "{}", out.stderr);
    drop(prom);
    let _ = std::fs::remove_dir_all(&dir);
}
