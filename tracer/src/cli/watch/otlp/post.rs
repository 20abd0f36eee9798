//! One OTLP/HTTP post and what the collector made of it, by the protocol's rules
//! (opentelemetry-proto's specification, "OTLP/HTTP Response"): 2xx is taken, perhaps with a
//! partial success that rejected some of it (not to be sent again); 429, 502, 503 and 504 are
//! worth trying again, after `Retry-After` when the collector gives one, else after a backoff;
//! any other status is final. A request that got no answer (refused connection, timeout) is
//! worth trying again too.

use std::time::{Duration, SystemTime};

use opentelemetry_proto::tonic::collector::{
    metrics::v1::ExportMetricsServiceResponse, trace::v1::ExportTraceServiceResponse,
};
use prost::Message;

/// A post that takes longer has failed.
pub const TIMEOUT: Duration = Duration::from_secs(3);
/// The longest wait a collector's `Retry-After` is taken for: the metrics are cumulative, so
/// waiting longer only loses resolution, and a stray date far ahead must not silence the
/// export for good.
pub const MOST_ASKED: Duration = Duration::from_secs(300);
/// What an error body is cut to, in characters.
const SAID: usize = 200;

/// The two request kinds, for their response messages.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Path {
    Metrics,
    Traces,
}

impl Path {
    pub fn as_str(self) -> &'static str {
        match self {
            Path::Metrics => "/v1/metrics",
            Path::Traces => "/v1/traces",
        }
    }
}

#[derive(Debug, PartialEq)]
pub enum Answer {
    /// Taken; what a partial success said, when it said anything.
    Taken(Option<String>),
    /// Worth trying again: after `asked` when the collector said how long (capped at
    /// `MOST_ASKED`), else after a backoff of the sender's choosing.
    Retry {
        asked: Option<Duration>,
        why: String,
    },
    /// Final: not to be sent again.
    Refused(String),
}

/// `google.rpc.Status`, the body OTLP/HTTP puts on a failure (only the fields said here).
#[derive(Clone, PartialEq, Message)]
struct Status {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
}

pub fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_global(Some(TIMEOUT))
        // Statuses are answers to classify here, not errors.
        .http_status_as_error(false)
        // No proxy from the environment: the collector is meant to be on the node, and
        // HTTPS_PROXY would otherwise take plain-http posts off it.
        .proxy(None)
        .build()
        .into()
}

/// Posts `body` to `url`, all of it (the answer's body too) within `limit`.
pub fn post(agent: &ureq::Agent, url: &str, path: Path, body: &[u8], limit: Duration) -> Answer {
    let sent = agent
        .post(url)
        .config()
        .timeout_global(Some(limit))
        .build()
        .header("Content-Type", "application/x-protobuf")
        .send(body);
    let mut r = match sent {
        Ok(r) => r,
        // No answer, or none that made sense: a collector restarting, or a network that is
        // down for now.
        Err(
            e @ (ureq::Error::Io(_)
            | ureq::Error::Timeout(_)
            | ureq::Error::ConnectionFailed
            | ureq::Error::HostNotFound
            | ureq::Error::Protocol(_)
            | ureq::Error::BodyStalled),
        ) => {
            return Answer::Retry {
                asked: None,
                why: e.to_string(),
            };
        }
        // What trying again would not change (a URL it cannot use, redirects).
        Err(e) => return Answer::Refused(e.to_string()),
    };
    let status = r.status().as_u16();
    let asked = r
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| retry_after(v, SystemTime::now()));
    let body = r
        .body_mut()
        .with_config()
        .limit(64 << 10)
        .read_to_vec()
        .unwrap_or_default();
    classify(status, asked, path, &body)
}

fn classify(status: u16, asked: Option<Duration>, path: Path, body: &[u8]) -> Answer {
    match status {
        200..=299 => Answer::Taken(partial(path, body)),
        429 | 502 | 503 | 504 => Answer::Retry {
            asked,
            why: format!("HTTP {status}{}", said(body)),
        },
        _ => Answer::Refused(format!("HTTP {status}{}", said(body))),
    }
}

/// `Retry-After` as delay-seconds or an HTTP-date (RFC 9110), at most `MOST_ASKED`. No wait
/// (0, or a date already past) is as if none was asked, so the backoff applies: trying again
/// at once, again and again, would flood a collector that is struggling.
fn retry_after(v: &str, now: SystemTime) -> Option<Duration> {
    let v = v.trim();
    let wait = match v.parse::<u64>() {
        Ok(s) => Duration::from_secs(s),
        Err(_) => {
            let at = httpdate::parse_http_date(v).ok()?;
            at.duration_since(now).unwrap_or_default()
        }
    };
    (!wait.is_zero()).then(|| wait.min(MOST_ASKED))
}

/// What a 2xx's partial success said: rejected items, or a warning (the spec lets a collector
/// send one with nothing rejected). An empty or undecodable body is a full success.
fn partial(path: Path, body: &[u8]) -> Option<String> {
    let (rejected, message, what) = match path {
        Path::Metrics => {
            let p = ExportMetricsServiceResponse::decode(body)
                .ok()?
                .partial_success?;
            (p.rejected_data_points, p.error_message, "data points")
        }
        Path::Traces => {
            let p = ExportTraceServiceResponse::decode(body)
                .ok()?
                .partial_success?;
            (p.rejected_spans, p.error_message, "spans")
        }
    };
    let message = printable(&message);
    match (rejected, message.is_empty()) {
        (0, true) => None,
        (0, false) => Some(format!("took everything, with a warning: {message}")),
        (n, _) => Some(format!("rejected {n} {what}: {message}")),
    }
}

/// A failure body as words: the `google.rpc.Status` message, else the body when it is text.
fn said(body: &[u8]) -> String {
    let text = match Status::decode(body) {
        Ok(s) if !s.message.is_empty() => s.message,
        _ => match std::str::from_utf8(body) {
            Ok(t) => t.to_string(),
            Err(_) => String::new(),
        },
    };
    let text = printable(&text);
    if text.is_empty() {
        String::new()
    } else {
        format!(": {text}")
    }
}

/// One line, no control characters, at most `SAID` characters.
fn printable(s: &str) -> String {
    let one: String = s
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .chars()
        .filter(|c| !c.is_control())
        .collect();
    match one.char_indices().nth(SAID) {
        Some((i, _)) => format!("{}...", &one[..i]),
        None => one,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsPartialSuccess;

    #[test]
    fn statuses_are_classified_as_the_protocol_says() {
        let s = Status {
            code: 8,
            message: "over quota".into(),
        }
        .encode_to_vec();
        for code in [429, 502, 503, 504] {
            assert_eq!(
                classify(code, Some(Duration::from_secs(2)), Path::Traces, &s),
                Answer::Retry {
                    asked: Some(Duration::from_secs(2)),
                    why: format!("HTTP {code}: over quota")
                }
            );
        }
        for code in [400, 401, 404, 413, 500] {
            assert!(matches!(
                classify(code, None, Path::Metrics, b"bad\n request"),
                Answer::Refused(m) if m == format!("HTTP {code}: bad request")
            ));
        }
        assert_eq!(classify(200, None, Path::Metrics, b""), Answer::Taken(None));
        assert_eq!(
            classify(204, None, Path::Traces, &[0xff, 0x00]),
            Answer::Taken(None)
        );
    }

    #[test]
    fn a_partial_success_is_said() {
        let body = |n, m: &str| {
            ExportMetricsServiceResponse {
                partial_success: Some(ExportMetricsPartialSuccess {
                    rejected_data_points: n,
                    error_message: m.into(),
                }),
            }
            .encode_to_vec()
        };
        assert_eq!(
            partial(Path::Metrics, &body(3, "too many series")),
            Some("rejected 3 data points: too many series".into())
        );
        assert_eq!(
            partial(Path::Metrics, &body(0, "slow down")),
            Some("took everything, with a warning: slow down".into())
        );
        assert_eq!(partial(Path::Metrics, &body(0, "")), None);
        // The same wire shape: a span count under the traces path.
        assert_eq!(
            partial(Path::Traces, &body(2, "x")),
            Some("rejected 2 spans: x".into())
        );
    }

    #[test]
    fn retry_after_in_seconds_or_a_date() {
        let now = httpdate::parse_http_date("Fri, 04 Dec 2026 20:00:00 GMT").unwrap();
        assert_eq!(retry_after(" 7 ", now), Some(Duration::from_secs(7)));
        assert_eq!(
            retry_after("Fri, 04 Dec 2026 20:00:30 GMT", now),
            Some(Duration::from_secs(30))
        );
        assert_eq!(retry_after("Fri, 04 Dec 2026 19:00:00 GMT", now), None);
        assert_eq!(retry_after("0", now), None);
        assert_eq!(retry_after("86400", now), Some(MOST_ASKED));
        assert_eq!(retry_after("soon", now), None);
    }

    #[test]
    fn bodies_are_cut_to_one_printable_line() {
        let long = "x".repeat(500);
        assert_eq!(printable(&long).len(), SAID + 3);
        assert_eq!(printable("a\u{1b}[31m\nb"), "a[31m b");
    }
}
