//! The OTLP side of `tracer watch --otlp`: each window's requests (`render::otlp`) posted as
//! OTLP/HTTP protobuf to ENDPOINT/v1/metrics and ENDPOINT/v1/traces, on a thread of its own
//! (ureq, blocking) so that a slow or absent collector never holds up the recording loop.
//! The metrics are cumulative, so only the latest request matters: it replaces one not yet
//! sent (a collector outage costs resolution, never counts), and at the end it is the one
//! request always tried. Spans wait in a bounded queue. What the collector answers is obeyed
//! as the protocol says (`post`): a request it could not take now is sent again after the
//! wait it asked for, or after a backoff; one it refused is not. The end is bounded too: what
//! is not sent within `FLUSH` is given up, and said.

use std::{
    collections::VecDeque,
    hash::{BuildHasher, RandomState},
    sync::{Arc, Condvar, Mutex},
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::Result;
use prost::Message;

use post::{Answer, Path};

use crate::{
    analysis::Report,
    error::TracerError,
    recording::Recording,
    render::otlp::{self, Attributes},
    sources::targets::Targets,
};

mod post;

/// Spans waiting for the collector; past this a window's span is dropped (said once a streak).
const SPANS: usize = 8;
/// At the end, how long what is left may take to send.
const FLUSH: Duration = Duration::from_secs(5);

/// What waits for the sender thread.
#[derive(Default)]
struct Pending {
    metrics: Option<Vec<u8>>,
    spans: VecDeque<Vec<u8>>,
    /// The watch ended: send what is here until this instant (`FLUSH` after the end), then stop.
    closing: Option<Instant>,
    /// Spans were dropped since the queue last emptied (said once).
    dropping: bool,
}

impl Pending {
    /// A window's span at the back of the queue, or one the collector could not take yet at
    /// its front; past `SPANS` the newest is dropped.
    fn push_span(&mut self, span: Vec<u8>, again: bool) {
        if again {
            self.spans.push_front(span);
        } else {
            self.spans.push_back(span);
        }
        if self.spans.len() > SPANS {
            self.spans.pop_back();
            if !self.dropping {
                eprintln!(
                    "tracer: OTLP: {SPANS} window spans wait for the collector; later ones are \
                     dropped until it catches up (the metrics keep their totals)"
                );
            }
            self.dropping = true;
        }
    }
}

type Shared = Arc<(Mutex<Pending>, Condvar)>;

pub struct Otlp {
    shared: Shared,
    /// The sender; it returns how many requests the collector took.
    thread: Option<JoinHandle<u64>>,
    /// The collector's base URL, for the end's message.
    base: String,
    /// What it watches, for the resource.
    target: String,
    /// The resource, from the first window (its host's name).
    attributes: Attributes,
    /// The first window's start (Unix ns): where every cumulative point starts.
    start_ns: u64,
    ids: RandomState,
    windows: u64,
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
    if rest.contains(['?', '#']) {
        return Err(usage("a query or fragment cannot prefix /v1/metrics").into());
    }
    let authority = rest.split('/').next().unwrap_or_default();
    if authority.contains('@') {
        // They would be sent in clear over http, and shown in every message naming the URL.
        return Err(usage("credentials in the URL are not supported").into());
    }
    if let Err(e) = endpoint.parse::<ureq::http::Uri>() {
        return Err(usage(&format!("not a valid URL ({e})")).into());
    }
    let base = endpoint.trim_end_matches('/');
    if let Some(signal) = ["/v1/metrics", "/v1/traces"]
        .into_iter()
        .find(|s| base.ends_with(s))
    {
        return Err(usage(&format!(
            "the tool appends /v1/metrics and /v1/traces itself (this one ends in {signal})"
        ))
        .into());
    }
    Ok(base.to_string())
}

impl Otlp {
    pub fn start(endpoint: &str, targets: &Targets) -> Result<Self> {
        let base = check_endpoint(endpoint)?;
        let shared: Shared = Arc::default();
        let s = Arc::clone(&shared);
        let b = base.clone();
        let thread = std::thread::Builder::new()
            .name("tracer-otlp".into())
            .spawn(move || post_all(&b, &s))?;
        Ok(Self {
            shared,
            thread: Some(thread),
            base,
            target: target(targets),
            attributes: Attributes::new(),
            start_ns: 0,
            ids: RandomState::new(),
            windows: 0,
        })
    }

    /// A closed window: the series as they stand (`exposition`, the Prometheus text), and a
    /// span if its verdict is not `none`.
    pub fn window(&mut self, exposition: &str, rec: &Recording, report: &Report) {
        if self.windows == 0 {
            self.start_ns = rec.host.unix_ns(rec.start_ns);
            self.attributes = attributes(&rec.host.hostname, &self.target);
        }
        self.windows += 1;
        let end = rec.host.unix_ns(rec.end_ns);
        let m = otlp::metrics_request(exposition, &self.attributes, self.start_ns, end);
        let id = |k: u64| self.ids.hash_one((self.windows, k)).to_le_bytes();
        let mut trace = [0u8; 16];
        trace[..8].copy_from_slice(&id(0));
        trace[8..].copy_from_slice(&id(1));
        let span = otlp::window_span(rec, report, &self.attributes, (trace, id(2)));
        let (lock, wake) = &*self.shared;
        let mut p = lock.lock().expect("not poisoned");
        p.metrics = Some(m.encode_to_vec());
        if let Some(t) = span {
            p.push_span(t.encode_to_vec(), false);
        }
        wake.notify_one();
    }
}

impl Otlp {
    /// Sends the latest metrics and the spans left (within `FLUSH`), then says whether the
    /// export reached the collector at all: a watch whose every request failed exported
    /// nothing, which is an error (its windows went to their other sinks all the same).
    pub fn finish(mut self) -> Result<()> {
        let taken = self.close();
        if self.windows > 0 && taken == Some(0) {
            anyhow::bail!(
                "OTLP: {} took none of the requests of the watch's {} windows, so nothing was                  exported: check that an OTLP/HTTP collector listens there",
                self.base,
                self.windows
            );
        }
        Ok(())
    }

    /// Ends the sender; how many requests the collector took (None: already ended, or the
    /// sender died).
    fn close(&mut self) -> Option<u64> {
        let (lock, wake) = &*self.shared;
        lock.lock().expect("not poisoned").closing = Some(Instant::now() + FLUSH);
        wake.notify_one();
        self.thread.take().and_then(|t| t.join().ok())
    }
}

impl Drop for Otlp {
    /// The latest metrics and the spans left are still sent (within `FLUSH`).
    fn drop(&mut self) {
        self.close();
    }
}

/// After a failure the collector named no wait for: 1 s, doubling to 32 s.
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MOST_BACKOFF: Duration = Duration::from_secs(32);

/// Whole seconds, rounded up, for a message.
fn secs(d: Duration) -> String {
    format!("{}s", d.as_secs() + u64::from(d.subsec_nanos() > 0))
}

/// Posts, and what they taught: when the next may go, and what has been said.
struct Sender {
    agent: ureq::Agent,
    base: String,
    backoff: Duration,
    /// No post before this; `true` when the collector asked for it (`Retry-After`), which is
    /// honoured at the end too, where a backoff of our own choosing is not.
    hold: Option<(Instant, bool)>,
    /// Failing since the collector last answered (said once).
    failing: bool,
    /// The last refusal or partial success said, per path: one that repeats every window is
    /// said once.
    said: [Option<String>; 2],
    /// Requests the collector took.
    taken: u64,
}

impl Sender {
    /// Posts one request within `limit`: `true` when it is worth sending again (the hold says
    /// when). `closing`: the watch has ended, so our own backoff will not be waited for.
    fn send(&mut self, path: Path, body: &[u8], limit: Duration, closing: bool) -> bool {
        let url = format!("{}{}", self.base, path.as_str());
        let answer = post::post(&self.agent, &url, path, body, limit);
        if !matches!(answer, Answer::Retry { .. }) {
            // It answered: a failure streak is over, whatever the answer.
            if self.failing && matches!(answer, Answer::Taken(_)) {
                eprintln!("tracer: OTLP: {url} takes requests again");
            }
            (self.failing, self.backoff, self.hold) = (false, FIRST_BACKOFF, None);
        }
        match answer {
            Answer::Taken(partial) => {
                self.taken += 1;
                match partial {
                    Some(p) => self.say(path, format!("tracer: OTLP: {url} {p}")),
                    None => self.said[path as usize] = None,
                }
                false
            }
            Answer::Retry { asked, why } => {
                let wait = asked.unwrap_or(self.backoff);
                if asked.is_none() {
                    self.backoff = (self.backoff * 2).min(MOST_BACKOFF);
                }
                self.hold = Some((Instant::now() + wait, asked.is_some()));
                if !self.failing {
                    let next = match (closing, asked) {
                        (true, None) => "not tried again: the watch is ending".to_string(),
                        (_, Some(_)) => format!("trying again in {}, as it asked", secs(wait)),
                        (false, None) => format!("trying again in {}", secs(wait)),
                    };
                    let kept = match path {
                        Path::Metrics => "the metrics keep their totals",
                        Path::Traces => "the spans wait in their queue",
                    };
                    eprintln!("tracer: OTLP: posting to {url} failed: {why}; {next} ({kept})");
                }
                self.failing = true;
                true
            }
            Answer::Refused(why) => {
                self.say(
                    path,
                    format!("tracer: OTLP: {url} refused a request: {why}; it is not sent again"),
                );
                false
            }
        }
    }

    fn say(&mut self, path: Path, line: String) {
        let said = &mut self.said[path as usize];
        if said.as_ref() != Some(&line) {
            eprintln!("{line}");
            *said = Some(line);
        }
    }

    /// How long to wait before the next post, if at all.
    fn wait(&self, closing: bool) -> Option<Duration> {
        let (until, asked) = self.hold?;
        let left = until.checked_duration_since(Instant::now())?;
        (asked || !closing).then_some(left)
    }
}

/// What was not sent at the end.
#[derive(Default)]
struct Unsent {
    metrics: bool,
    spans: usize,
}

impl Unsent {
    fn add(&mut self, path: Path) {
        match path {
            Path::Metrics => self.metrics = true,
            Path::Traces => self.spans += 1,
        }
    }

    /// What is still queued, given up with it.
    fn add_left(&mut self, p: &Pending) {
        self.metrics |= p.metrics.is_some();
        self.spans += p.spans.len();
    }

    fn say(&self, why: &str) {
        let spans = (self.spans > 0).then(|| format!("{} spans", self.spans));
        let what: Vec<String> = (self.metrics.then(|| "the last metrics".to_string()))
            .into_iter()
            .chain(spans)
            .collect();
        if !what.is_empty() {
            eprintln!(
                "tracer: OTLP: at the end {} were not sent: {why}",
                what.join(" and ")
            );
        }
    }
}

/// The next request to post (the metrics first: they are the totals, a span is one window),
/// once no wait holds it, with the end's deadline once the watch has ended; `None` when the
/// sender is done (what it gave up is said).
fn next(
    s: &Sender,
    shared: &Shared,
    unsent: &mut Unsent,
) -> Option<(Path, Vec<u8>, Option<Instant>)> {
    let (lock, wake) = &**shared;
    let mut p = lock.lock().expect("not poisoned");
    loop {
        let work = p.metrics.is_some() || !p.spans.is_empty();
        let wait = s.wait(p.closing.is_some());
        if let Some(end) = p.closing {
            if !work {
                unsent.say("the collector did not take them");
                return None;
            }
            if let Some(w) = wait.filter(|&w| Instant::now() + w > end) {
                unsent.add_left(&p);
                unsent.say(&format!("the collector asked to wait {}", secs(w)));
                return None;
            }
            if Instant::now() >= end {
                unsent.add_left(&p);
                unsent.say(&format!("the collector took over {}", secs(FLUSH)));
                return None;
            }
        }
        match (work, wait) {
            (true, None) => break,
            (_, Some(w)) => p = wake.wait_timeout(p, w).expect("not poisoned").0,
            (false, None) => p = wake.wait(p).expect("not poisoned"),
        }
    }
    let next = match p.metrics.take() {
        Some(m) => (Path::Metrics, m),
        None => (Path::Traces, p.spans.pop_front().expect("work")),
    };
    if p.spans.is_empty() {
        p.dropping = false;
    }
    Some((next.0, next.1, p.closing))
}

fn post_all(base: &str, shared: &Shared) -> u64 {
    let mut s = Sender {
        agent: post::agent(),
        base: base.to_string(),
        backoff: FIRST_BACKOFF,
        hold: None,
        failing: false,
        said: [None, None],
        taken: 0,
    };
    let mut unsent = Unsent::default();
    while let Some((path, body, end)) = next(&s, shared, &mut unsent) {
        // At the end a post gets what is left of the bound, so the exit is never later.
        let limit = end.map_or(post::TIMEOUT, |e| {
            e.saturating_duration_since(Instant::now())
                .min(post::TIMEOUT)
        });
        if !s.send(path, &body, limit, end.is_some()) {
            continue;
        }
        // Worth sending again: at the end (the watch may have ended during the post) only
        // after a wait the collector asked for, which `next` gives up on if it passes the
        // end's bound; before it, always.
        let mut p = shared.0.lock().expect("not poisoned");
        if p.closing.is_some() && !s.hold.is_some_and(|(_, asked)| asked) {
            // Metrics a newer request replaced are not missing.
            if !(path == Path::Metrics && p.metrics.is_some()) {
                unsent.add(path);
            }
            continue;
        }
        match path {
            // A newer one, if any, replaces it (cumulative).
            Path::Metrics => {
                p.metrics.get_or_insert(body);
            }
            Path::Traces => p.push_span(body, true),
        }
    }
    s.taken
}

/// What the watch follows, in words: `cgroup PATH` or `PID N (COMM)`.
fn target(targets: &Targets) -> String {
    match &targets.cgroup {
        Some(c) => format!("cgroup {}", c.given),
        None => {
            let t = targets.primary();
            format!(
                "PID {} ({})",
                t.proc_pid,
                crate::recording::printable(&t.comm)
            )
        }
    }
}

/// The resource: this tracer, its host (as the recording read its name) and what it watches.
fn attributes(host: &str, target: &str) -> Attributes {
    let (host, target) = (host.trim().to_string(), target.to_string());
    let mut a: Attributes = vec![
        ("service.name".into(), "tracer".into()),
        ("service.version".into(), env!("CARGO_PKG_VERSION").into()),
        // What tells one tracer's series from another's where the metrics become Prometheus
        // series (job = service.name, instance = service.instance.id).
        ("service.instance.id".into(), format!("{host}/{target}")),
        ("host.name".into(), host),
        ("tracer.target".into(), target),
    ];
    // The OpenTelemetry SDKs' variables, so a deployment can name the node (a pod's hostname
    // is the pod's) or the service as its other exporters do.
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let extra = env("OTEL_RESOURCE_ATTRIBUTES").unwrap_or_default();
    let pairs = extra.split(',').filter_map(|kv| kv.split_once('='));
    let named = env("OTEL_SERVICE_NAME").map(|v| ("service.name", v));
    for (k, v) in pairs
        .map(|(k, v)| (k.trim(), v.trim().to_string()))
        .chain(named)
    {
        match a.iter_mut().find(|(key, _)| key == k) {
            Some(kv) => kv.1 = v,
            None => a.push((k.to_string(), v)),
        }
    }
    a
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
        assert_eq!(
            check_endpoint("http://[::1]:4318/otlp").expect("valid"),
            "http://[::1]:4318/otlp"
        );
        for bad in [
            "https://collector:4318",
            "127.0.0.1:4318",
            "http://",
            "http:///v1",
            "http://h:4318?x=1",
            "http://[::1",
            "http://user:pw@collector:4318",
            "http://127.0.0.1:4318/v1/metrics",
        ] {
            let e = check_endpoint(bad).expect_err(bad).to_string();
            assert!(
                e.contains("--otlp") && e.contains("http://127.0.0.1:4318"),
                "{e}"
            );
        }
    }
}
