//! The OTLP side of `tracer watch --otlp`: each window's requests (`render::otlp`) posted as
//! OTLP/HTTP protobuf to ENDPOINT/v1/metrics and ENDPOINT/v1/traces, on a thread of its own
//! (ureq, blocking) so that a slow or absent collector never holds up the recording loop.
//! The metrics are cumulative, so a request lost to a full queue or a failed post costs
//! resolution, not counts: the next one carries the totals.

use std::{
    hash::{BuildHasher, RandomState},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
        mpsc::{Receiver, SyncSender, TrySendError, sync_channel},
    },
    thread::JoinHandle,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use anyhow::Result;
use prost::Message;

use crate::{
    analysis::Report,
    error::TracerError,
    recording::Recording,
    render::otlp::{self, Attributes},
    sources::targets::Targets,
};

/// Requests waiting for the collector; past this a window's requests are dropped (said once).
const QUEUE: usize = 8;
/// A post that takes longer has failed.
const TIMEOUT: Duration = Duration::from_secs(3);

type Request = (&'static str, Vec<u8>);

pub struct Otlp {
    queue: Option<SyncSender<Request>>,
    thread: Option<JoinHandle<()>>,
    /// Set when the watch ends: a failure then drops what is left instead of waiting out
    /// each post's timeout.
    closing: Arc<AtomicBool>,
    attributes: Attributes,
    start_ns: u64,
    full_said: bool,
    ids: RandomState,
    spans: u64,
}

/// `http://host:port` (a path, if any, is the prefix of /v1/...), as OTEL_EXPORTER_OTLP_ENDPOINT.
pub fn check_endpoint(endpoint: &str) -> Result<String> {
    let usage = |why: &str| TracerError::Usage {
        message: format!(
            "--otlp {endpoint}: {why}; give the collector's OTLP/HTTP address, e.g. \
             http://127.0.0.1:4318"
        ),
    };
    let Some(rest) = endpoint.strip_prefix("http://") else {
        return Err(if endpoint.starts_with("https://") {
            usage("https is not built in (no TLS); send to a local collector over http")
        } else {
            usage("not an http:// URL")
        }
        .into());
    };
    if rest.is_empty() || rest.starts_with('/') {
        return Err(usage("no host").into());
    }
    Ok(endpoint.trim_end_matches('/').to_string())
}

impl Otlp {
    pub fn start(endpoint: &str, targets: &Targets) -> Result<Self> {
        let base = check_endpoint(endpoint)?;
        let (tx, rx) = sync_channel(QUEUE);
        let closing = Arc::new(AtomicBool::new(false));
        let c = Arc::clone(&closing);
        let thread = std::thread::Builder::new()
            .name("tracer-otlp".into())
            .spawn(move || post_all(&base, &rx, &c))?;
        Ok(Self {
            queue: Some(tx),
            thread: Some(thread),
            closing,
            attributes: attributes(targets),
            start_ns: now_ns(),
            full_said: false,
            ids: RandomState::new(),
            spans: 0,
        })
    }

    /// A closed window: the series as they stand (`exposition`, the Prometheus text), and a
    /// span if its verdict is not `none`.
    pub fn window(&mut self, exposition: &str, rec: &Recording, report: &Report) {
        let m = otlp::metrics_request(exposition, &self.attributes, self.start_ns, now_ns());
        self.send("/v1/metrics", m.encode_to_vec());
        self.spans += 1;
        let id = |k: u64| {
            self.ids
                .hash_one((self.start_ns, self.spans, k))
                .to_le_bytes()
        };
        let mut trace = [0u8; 16];
        trace[..8].copy_from_slice(&id(0));
        trace[8..].copy_from_slice(&id(1));
        if let Some(t) = otlp::window_span(rec, report, &self.attributes, (trace, id(2))) {
            self.send("/v1/traces", t.encode_to_vec());
        }
    }

    fn send(&mut self, path: &'static str, body: Vec<u8>) {
        let Some(q) = &self.queue else { return };
        match q.try_send((path, body)) {
            Ok(()) => self.full_said = false,
            Err(TrySendError::Full(_)) if !self.full_said => {
                self.full_said = true;
                eprintln!(
                    "tracer: OTLP: {QUEUE} requests wait for the collector; this window's \
                     are dropped (the next metrics request has the totals)"
                );
            }
            Err(_) => {}
        }
    }
}

impl Drop for Otlp {
    /// What is queued is still sent (the last window's included), then the thread ends.
    fn drop(&mut self) {
        self.closing.store(true, Ordering::Relaxed);
        self.queue.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn post_all(base: &str, rx: &Receiver<Request>, closing: &AtomicBool) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(TIMEOUT))
        .build()
        .into();
    let mut failing = false;
    while let Ok((path, body)) = rx.recv() {
        let url = format!("{base}{path}");
        let r = agent
            .post(&url)
            .header("Content-Type", "application/x-protobuf")
            .send(&body[..]);
        match r {
            Ok(_) if failing => {
                failing = false;
                eprintln!("tracer: OTLP: {url} takes requests again");
            }
            Ok(_) => {}
            Err(e) => {
                if !failing {
                    eprintln!(
                        "tracer: OTLP: posting to {url} failed: {e} (trying again next window)"
                    );
                }
                failing = true;
                if closing.load(Ordering::Relaxed) {
                    // Ending: do not wait out a timeout for each request left.
                    while rx.try_recv().is_ok() {}
                    return;
                }
            }
        }
    }
}

/// The resource: this tracer and what it watches.
fn attributes(targets: &Targets) -> Attributes {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let target = match &targets.cgroup {
        Some(c) => format!("cgroup {}", c.given),
        None => {
            let t = targets.primary();
            format!(
                "PID {} ({})",
                t.proc_pid,
                crate::recording::printable(&t.comm)
            )
        }
    };
    vec![
        ("service.name".into(), "tracer".into()),
        ("service.version".into(), env!("CARGO_PKG_VERSION").into()),
        ("host.name".into(), host.trim().into()),
        ("tracer.target".into(), target),
    ]
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::check_endpoint;

    #[test]
    fn endpoints_are_checked() {
        assert_eq!(
            check_endpoint("http://127.0.0.1:4318/").expect("valid"),
            "http://127.0.0.1:4318"
        );
        for bad in [
            "https://collector:4318",
            "127.0.0.1:4318",
            "http://",
            "http:///v1",
        ] {
            let e = check_endpoint(bad).expect_err(bad).to_string();
            assert!(
                e.contains("--otlp") && e.contains("http://127.0.0.1:4318"),
                "{e}"
            );
        }
    }
}
