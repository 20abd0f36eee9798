//! `tracer watch`: the programs stay attached and a window closes every interval, each with
//! its own verdict (a line, or a JSON document per line), the Prometheus series, and the
//! flight recorder's triggers. The windows' accounts are what the kernel's running totals
//! moved by (`recording::window`), so they add up to the whole run.

mod flight;
mod latencies;
mod otlp;
mod out;
mod serve;

use std::{net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use anyhow::Result;
use clap::Args;

use super::args::{RecordArgs, TargetArgs};
use crate::{
    analysis::{Report, analyze_after},
    recording::{EndReason, Recording, printable},
    render::{prometheus::Metrics, serde_name},
    session::{CUT_LAG, FlightStore, Session, SessionOptions, Wake, runtime},
    sources::{process, targets::Targets},
};

#[derive(Debug, Args)]
pub struct WatchArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    /// Close a window every INTERVAL (at least 1s), each with its own verdict.
    #[arg(long, short, default_value = "10s", value_parser = parse_interval)]
    pub interval: Duration,
    /// Stop after N windows (default: until Ctrl-C, SIGTERM, or the process given exits).
    #[arg(long, short, value_parser = clap::value_parser!(u64).range(1..))]
    pub count: Option<u64>,
    /// Serve the series at http://ADDR/metrics for Prometheus (docs/METRICS.md), e.g.
    /// 127.0.0.1:9464; `POST /trigger` there triggers the flight recorder.
    #[arg(long, value_name = "ADDR", value_parser = parse_listen)]
    pub prometheus: Option<SocketAddr>,
    /// Send the same series, and a span for each window whose verdict is not `none`, to an
    /// OpenTelemetry collector as OTLP/HTTP protobuf (ENDPOINT/v1/metrics, /v1/traces), e.g.
    /// http://127.0.0.1:4318 (docs/METRICS.md).
    #[arg(long, value_name = "ENDPOINT")]
    pub otlp: Option<String>,
    /// Append the window lines (or JSON lines) to FILE instead of standard output; SIGHUP
    /// reopens it (log rotation).
    #[arg(long, value_name = "FILE")]
    pub log: Option<PathBuf>,
    /// Flight recorder: hold the timeline of the last DUR (whole windows) in memory, and write
    /// it to a trace file in --flight-dir when triggered: SIGUSR1, `POST /trigger` on the
    /// --prometheus address, a window whose verdict is not `none`, or one whose p99 is over
    /// --trigger-p99.
    #[arg(long, value_name = "DUR", value_parser = crate::units::parse_duration)]
    pub keep: Option<Duration>,
    /// The flight recorder's memory ceiling, in MiB: past it the oldest records go, and a
    /// file holds only the windows whose records are all there (it says so).
    #[arg(long, value_name = "MIB", default_value_t = 256, requires = "keep",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub keep_max_mib: u64,
    /// Where the flight recorder writes (tracer-PID-TIME.trace, and .windows.jsonl beside it).
    #[arg(long, value_name = "DIR", default_value = ".", requires = "keep")]
    pub flight_dir: PathBuf,
    /// Trigger the flight recorder when a window's request p99 is over DUR.
    #[arg(long, value_name = "DUR", requires = "keep", value_parser = crate::units::parse_duration)]
    pub trigger_p99: Option<Duration>,
    /// Write flight-recorder files only when asked (SIGUSR1, POST /trigger), not for a
    /// window's verdict or p99.
    #[arg(long, requires = "keep")]
    pub no_auto_trigger: bool,
    /// At most one flight-recorder file per DUR: a storm of triggers writes one.
    #[arg(long, value_name = "DUR", default_value = "5m", requires = "keep",
          value_parser = crate::units::parse_duration)]
    pub trigger_every: Duration,
    /// At most N flight-recorder files in all.
    #[arg(long, value_name = "N", default_value_t = 20, requires = "keep",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub max_files: u64,
    #[command(flatten)]
    pub record: RecordArgs,
}

fn parse_interval(s: &str) -> Result<Duration, String> {
    let d = crate::units::parse_duration(s)?;
    if d < Duration::from_secs(1) {
        return Err("must be at least 1s (a window needs time to say anything)".into());
    }
    Ok(d)
}

/// `IP:PORT`, or `HOST:PORT` resolved now (`localhost:9464`): the first address it names.
fn parse_listen(s: &str) -> Result<SocketAddr, String> {
    if let Ok(a) = s.parse() {
        return Ok(a);
    }
    let why = "give IP:PORT or HOST:PORT, e.g. 127.0.0.1:9464 (0.0.0.0:9464 for every interface)";
    match std::net::ToSocketAddrs::to_socket_addrs(s) {
        Ok(mut addrs) => addrs
            .next()
            .ok_or_else(|| format!("{s} names no address: {why}")),
        Err(e) => Err(format!("{e}: {why}")),
    }
}

pub fn run(args: WatchArgs) -> Result<()> {
    if args.record.outputs.need_timeline() {
        return Err(crate::error::TracerError::Usage {
            message: "--html and --perfetto draw one recording: give -o FILE to keep the run, \
                      then `tracer report FILE --html PAGE`"
                .into(),
        }
        .into());
    }
    if args.trigger_p99.is_some() && !args.record.requests.wanted() {
        return Err(crate::error::TracerError::Usage {
            message: "--trigger-p99 needs requests to take a p99 of: give --latencies FILE or \
                      --request-start/--request-end"
                .into(),
        }
        .into());
    }
    if let Some(e) = &args.otlp {
        otlp::check_endpoint(e)?;
    }
    if let Some(p) = &args.log {
        out::check(p)?;
        if let Some(l) = &args.record.requests.latencies {
            crate::trace::output::check_not_inputs(&[("--log", p)], &[("the latency log", l)])?;
        }
        // The trace is renamed over its path at the end: a log there would be lost whole.
        if let Some(o) = &args.record.output {
            crate::trace::output::check_not_inputs(&[("--output", o)], &[("the --log", p)])?;
        }
    }
    // After the log's own checks: naming it as the trace too is a usage error, said first.
    args.record.check_inputs_and_outputs(false)?;
    // A watch reads its log window by window; the run's trace file is assembled apart from
    // them and holds none of its requests (the flight recorder's files do).
    if let (Some(o), Some(l), false) = (
        &args.record.output,
        &args.record.requests.latencies,
        args.record.quiet,
    ) {
        eprintln!(
            "tracer: {} will hold the run, not the latency log's requests: `tracer report {} \
             --latencies {}` joins them (--keep's files hold them)",
            o.display(),
            o.display(),
            l.display()
        );
    }
    if args.keep.is_some() {
        check_flight_dir(&args.flight_dir)?;
    }
    let targets = args.target.resolve(&args.record)?;
    let mut opts = args.record.session_options(None);
    opts.progress = false;
    opts.flight = args.keep.map(|_| (args.keep_max_mib as usize) << 20);
    opts.windows = true;
    // Joined per window, as the server appends to it (`latencies::LogTail`).
    opts.latencies = None;
    let each = crate::units::given(args.interval);
    opts.until = Some(match args.count {
        Some(n) => format!("for {n} windows of {each}"),
        None if args.target.cgroup.is_some() && args.target.pid.is_empty() => {
            format!("in windows of {each} until stopped")
        }
        None => format!("in windows of {each} until it exits"),
    });
    runtime()?.block_on(watch(&args, &targets, &opts))
}

/// The flight recorder writes only when the bad minute comes, maybe days later: a directory
/// it cannot write to must fail now, not then. A file is created, not asked about as the other
/// outputs' directories are (`trace::output::check_path`, access(2)): access sees a read-only
/// mount and the permission bits, but not an immutable directory or a file system out of
/// inodes, which a run of days can meet. An unnamed file (O_TMPFILE) where the file system has
/// them: nothing to collide with, and nothing left if the tool is killed; else a name of this
/// process and moment.
fn check_flight_dir(dir: &std::path::Path) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt as _;
    if !dir.is_dir() {
        return Err(crate::error::TracerError::Usage {
            message: format!(
                "--flight-dir {}: not a directory; give a directory the tracer can write to",
                dir.display()
            ),
        }
        .into());
    }
    let unnamed = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_TMPFILE)
        .open(dir);
    let made = match unnamed {
        Err(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::EISDIR)) => {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            let probe = dir.join(format!(".tracer-probe-{}-{nanos}", std::process::id()));
            let made = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&probe);
            if made.is_ok() {
                let _ = std::fs::remove_file(&probe);
            }
            made
        }
        other => other,
    };
    made.map(drop).map_err(|e| {
        anyhow::anyhow!(
            "--flight-dir {}: cannot create a file there ({e}); give a directory the tracer can \
             write to",
            dir.display()
        )
    })
}

/// What every window goes to.
struct Sinks {
    out: out::Out,
    json: bool,
    latencies: Option<latencies::LogTail>,
    metrics: Arc<Metrics>,
    otlp: Option<otlp::Otlp>,
    windows: u64,
    flight: Option<flight::Flight>,
    /// The window before, while there are requests: one that began in it and ends in this one
    /// is decomposed on both.
    prev: Option<Recording>,
}

impl Sinks {
    /// A closed window to every sink; `flight`, where the flight recorder's records are (the
    /// session while it runs, what it handed over after).
    fn window(&mut self, mut rec: Recording, flight: Option<&mut dyn FlightStore>) -> Result<()> {
        if let Some(log) = self.latencies.as_mut() {
            match log.window(&rec) {
                Ok(set) => rec.requests = Some(set),
                Err(e) => {
                    eprintln!("tracer: the latency log could not be used for this window: {e:#}")
                }
            }
        }
        let report = analyze_after(&rec, self.prev.as_ref());
        self.metrics.set_rss(process::own_rss());
        self.metrics.add(&rec, &report);
        self.windows += 1;
        if let (Some(f), Some(s)) = (self.flight.as_mut(), flight) {
            self.metrics.set_flight_bytes(s.flight_bytes() as u64);
            if let Err(e) = f.window(s, &rec, &report) {
                // The watch goes on: the next trigger may find room.
                eprintln!("tracer: flight recorder: {e:#}");
            }
        }
        if let Some(o) = self.otlp.as_mut() {
            o.window(&self.metrics.encode(), &rec, &report);
        }
        let written = if self.json {
            self.out.json(&report)
        } else {
            self.out.line(&line(&rec, &report))
        };
        self.prev = rec.requests.is_some().then_some(rec);
        written
    }
}

async fn watch(args: &WatchArgs, targets: &Targets, opts: &SessionOptions) -> Result<()> {
    // The sinks that can be refused (an address in use, a log that cannot be opened) before
    // the probes: a refusal must not cost an attach, nor leave a trace file begun.
    let (trigger_tx, trigger_rx) = tokio::sync::mpsc::unbounded_channel();
    let metrics = Arc::new(Metrics::new());
    let exporter = match args.prometheus {
        Some(a) => Some(serve::Exporter::start(
            a,
            Arc::clone(&metrics),
            args.keep.is_some().then_some(trigger_tx),
        )?),
        None => None,
    };
    let out = out::Out::open(args.log.as_deref())?;
    // What can still refuse to start; the log made for a watch that did not start goes.
    let started = (|| {
        let latencies = match &args.record.requests.latencies {
            Some(p) => Some(latencies::LogTail::open(p)?),
            None => None,
        };
        let otlp = match &args.otlp {
            Some(e) => Some(otlp::Otlp::start(e, targets)?),
            None => None,
        };
        let mut session = Session::open(targets, opts, || Ok(()))?;
        session.handle_signals(trigger_rx)?;
        Ok((latencies, otlp, session))
    })();
    let (latencies, otlp, mut session) = match started {
        Ok(s) => s,
        Err(e) => {
            out.abandon();
            return Err(e);
        }
    };
    // Only a process given ends the watch by exiting; a cgroup's processes come and go.
    let given = session.targets().given;
    if given == 0 {
        session.ignore_target_exit();
    }
    if let (Some(e), false) = (&exporter, args.record.quiet) {
        eprintln!("tracer: serving http://{}/metrics", e.addr);
    }
    let mut sinks = Sinks {
        out,
        json: args.record.json,
        latencies,
        metrics,
        otlp,
        windows: 0,
        prev: None,
        flight: flight_recorder(args),
    };
    let end_reason = windows(args, &mut session, &mut sinks).await?;
    let mut finished = session.finish(end_reason).await?;
    drop(exporter);
    // The last windows keep and trigger as every other: a trigger that came just before the
    // end, or a last window that is not `none`, writes its file.
    let mut held = finished.flight.take();
    if let Some(c) = finished.cut {
        sinks.window(c, held.as_mut().map(|h| h as &mut dyn FlightStore))?;
    }
    sinks.window(
        finished.last,
        held.as_mut().map(|h| h as &mut dyn FlightStore),
    )?;
    if end_reason == EndReason::TargetExited && !args.record.quiet {
        let given = &targets.members[..targets.given];
        let who = match given {
            [t] => format!("PID {} ({})", t.proc_pid, printable(&t.comm)),
            _ => format!("the {} processes given", given.len()),
        };
        eprintln!(
            "tracer: {who} exited: the watch ends after {} windows (--cgroup follows a service \
             across restarts)",
            sinks.windows
        );
    }
    let written = sinks.out.finish();
    let exported = sinks.otlp.take().map(otlp::Otlp::finish).transpose();
    written.and(exported).map(|_| ())
}

/// The flight recorder `--keep` asks for, with its triggers.
fn flight_recorder(args: &WatchArgs) -> Option<flight::Flight> {
    args.keep.map(|keep| {
        flight::Flight::new(flight::Settings {
            keep,
            interval: args.interval,
            dir: args.flight_dir.clone(),
            trigger_p99: args.trigger_p99,
            auto: !args.no_auto_trigger,
            every: args.trigger_every,
            max_files: args.max_files,
        })
    })
}

/// Cuts a window every interval and hands it to the sinks, until the count is reached, a
/// signal ends the run or the target exits (the reason). The last window is `finish`'s.
async fn windows(
    args: &WatchArgs,
    session: &mut Session<'_>,
    sinks: &mut Sinks,
) -> Result<EndReason> {
    let mut next = tokio::time::Instant::now() + args.interval;
    loop {
        match session.wait(Some(next)).await? {
            Wake::Deadline => {
                // The last window is the run's end: `finish` closes it exactly there.
                if args.count.is_some_and(|n| sinks.windows + 1 >= n) {
                    return Ok(EndReason::Duration);
                }
                session.begin_cut()?;
                if let Some(stop) = lag(session, sinks).await? {
                    return Ok(stop);
                }
                let rec = session.end_cut()?;
                sinks.window(rec, Some(session))?;
                next += args.interval;
            }
            Wake::Hangup => sinks.out.reopen(),
            Wake::Trigger => trigger(sinks),
            Wake::Interrupted => return Ok(EndReason::Interrupted),
            Wake::TargetExited => return Ok(EndReason::TargetExited),
        }
    }
}

/// While a cut window's last records arrive: the signals still act; one that ends the run
/// ends it here.
async fn lag(session: &mut Session<'_>, sinks: &mut Sinks) -> Result<Option<EndReason>> {
    let until = tokio::time::Instant::now() + CUT_LAG;
    loop {
        match session.wait(Some(until)).await? {
            Wake::Deadline => return Ok(None),
            Wake::Hangup => sinks.out.reopen(),
            Wake::Trigger => trigger(sinks),
            Wake::Interrupted => return Ok(Some(EndReason::Interrupted)),
            Wake::TargetExited => return Ok(Some(EndReason::TargetExited)),
        }
    }
}

fn trigger(sinks: &mut Sinks) {
    sinks.metrics.count_trigger();
    match sinks.flight.as_mut() {
        Some(f) => f.trigger(),
        None => eprintln!("tracer: trigger received, but there is no flight recorder (no --keep)"),
    }
}

/// A window in one line: when it ended, how long it was, the primary cause with its share,
/// the requests' p99 when known, and the top mechanism.
fn line(rec: &Recording, r: &Report) -> String {
    let (s, v) = (&r.summary, &r.verdict);
    let when = std::time::UNIX_EPOCH + Duration::from_nanos(rec.host.unix_ns(rec.end_ns));
    let mut out = format!(
        "{}  {:>6}  ",
        humantime::format_rfc3339_seconds(when),
        crate::units::dur(s.duration_ns)
    );
    match v.causes.first() {
        Some(c) => out.push_str(&format!(
            "{} {:.0}%",
            serde_name(&c.cause()),
            c.share * 100.0
        )),
        None => out.push_str(&serde_name(&v.primary)),
    }
    if let Some(q) = s.requests.as_ref().filter(|q| q.requests == 0) {
        out.push_str(&format!("  no requests ({} left out)", q.unpaired));
    } else if let Some(q) = &s.requests {
        out.push_str(&format!(
            "  p99 {} ({} requests)",
            crate::units::dur(q.p99_ns),
            q.requests
        ));
    }
    if let Some(c) = v.causes.first() {
        out.push_str(&format!("  {}: {}", c.mechanism.id(), c.mechanism));
        if let Some(a) = &c.acts_in {
            out.push_str(&format!(" (in {a})"));
        }
    }
    let l = &s.losses;
    if l.ringbuf_dropped + l.late_records > 0 {
        out.push_str(&format!(
            "  [{} records dropped, {} late]",
            l.ringbuf_dropped, l.late_records
        ));
    }
    out
}
