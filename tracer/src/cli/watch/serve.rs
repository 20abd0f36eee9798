//! The exporter's HTTP side: `GET /metrics` for Prometheus, `POST /trigger` for the flight
//! recorder, on a thread of its own (tiny_http, blocking), so that a slow scraper never holds
//! up the recording loop.

use std::{net::SocketAddr, sync::Arc, thread::JoinHandle};

use anyhow::{Result, anyhow};
use tokio::sync::mpsc::UnboundedSender;

use crate::render::prometheus::Metrics;

/// OpenMetrics, which prometheus-client writes (`# EOF` last); Prometheus asks for it.
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

pub struct Exporter {
    server: Arc<tiny_http::Server>,
    thread: Option<JoinHandle<()>>,
    pub addr: SocketAddr,
}

impl Exporter {
    /// Listens on `addr` (port 0: any free port, which `addr` then says). `trigger`: where
    /// `POST /trigger` goes, when there is a flight recorder.
    pub fn start(
        addr: SocketAddr,
        metrics: Arc<Metrics>,
        trigger: Option<UnboundedSender<()>>,
    ) -> Result<Self> {
        let server = tiny_http::Server::http(addr).map_err(|e| {
            anyhow!("--prometheus {addr}: cannot listen there ({e}); give a free address:port")
        })?;
        let addr = server
            .server_addr()
            .to_ip()
            .ok_or_else(|| anyhow!("--prometheus {addr}: not an IP address"))?;
        let server = Arc::new(server);
        let s = Arc::clone(&server);
        let thread = std::thread::Builder::new()
            .name("tracer-http".into())
            .spawn(move || serve(&s, &metrics, trigger.as_ref()))?;
        Ok(Self {
            server,
            thread: Some(thread),
            addr,
        })
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        self.server.unblock();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(server: &tiny_http::Server, metrics: &Metrics, trigger: Option<&UnboundedSender<()>>) {
    use tiny_http::{Header, Method, Response};
    // `recv` fails once `unblock` was called.
    while let Ok(req) = server.recv() {
        let path = req.url().split('?').next().unwrap_or("").to_string();
        let response = match (req.method(), path.as_str()) {
            // HEAD: the same headers, no body (tiny_http leaves it out).
            (Method::Get | Method::Head, "/metrics") => Response::from_string(metrics.encode())
                .with_header(
                    Header::from_bytes("Content-Type", CONTENT_TYPE).expect("a valid header"),
                ),
            (Method::Post, "/trigger") => match trigger.map(|t| t.send(())) {
                Some(Ok(())) => Response::from_string(
                    "the flight recorder writes its trace file at the close of this window, \
                     unless --trigger-every or --max-files hold it back\n",
                )
                .with_status_code(202),
                Some(Err(_)) => {
                    Response::from_string("the watch is ending\n").with_status_code(503)
                }
                None => Response::from_string(
                    "no flight recorder: start the watch with --keep DUR to have one\n",
                )
                .with_status_code(409),
            },
            (Method::Get, "/") => Response::from_string(
                "tracer watch: GET /metrics (Prometheus), POST /trigger (flight recorder)\n",
            ),
            _ => Response::from_string("not found\n").with_status_code(404),
        };
        let _ = req.respond(response);
    }
}
