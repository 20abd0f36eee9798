//! The flight recorder's side of the watch: the windows it keeps, what triggers a file, and
//! the rate limit that keeps a trigger storm from filling the disk.
//!
//! A trigger (SIGUSR1, `POST /trigger`, a window whose verdict is not `none`, a window whose
//! p99 is over `--trigger-p99`) writes at the close of the window it came in, so the file
//! holds that window and the ones before it, `--keep` in all: a trace file `tracer report`
//! reads, and beside it the windows' summaries as JSON lines.

use std::{
    collections::VecDeque,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::Result;

use crate::{
    analysis::Report,
    recording::{Recording, window::merge},
    session::FlightStore,
};

pub struct Settings {
    pub keep: Duration,
    /// The windows' length: `keep` is held as whole windows, as many as cover it.
    pub interval: Duration,
    pub dir: PathBuf,
    pub trigger_p99: Option<Duration>,
    /// Windows trigger files themselves (their verdict, their p99).
    pub auto: bool,
    pub every: Duration,
    pub max_files: u64,
}

pub struct Flight {
    s: Settings,
    /// The windows of the last `keep`, oldest first, with their summaries.
    windows: VecDeque<(Recording, String)>,
    /// A trigger came during the current window.
    pending: Option<&'static str>,
    last_file: Option<Instant>,
    files: u64,
    pub suppressed: u64,
}

impl Flight {
    pub fn new(s: Settings) -> Self {
        Self {
            s,
            windows: VecDeque::new(),
            pending: None,
            last_file: None,
            files: 0,
            suppressed: 0,
        }
    }

    /// SIGUSR1 or `POST /trigger`: a file at the close of this window.
    pub fn trigger(&mut self) {
        self.pending
            .get_or_insert("a trigger (SIGUSR1 or POST /trigger)");
    }

    /// Keeps a closed window, and writes a file if this window triggers one. Returns the
    /// path written.
    pub fn window(
        &mut self,
        session: &mut dyn FlightStore,
        rec: &Recording,
        report: &Report,
    ) -> Result<Option<PathBuf>> {
        let doc = serde_json::to_string(report)?;
        self.windows.push_back((rec.clone(), doc));
        // Whole windows, as many as cover `keep` (window lengths wander by milliseconds: by
        // count, not by their sum).
        let n = (self
            .s
            .keep
            .as_nanos()
            .div_ceil(self.s.interval.as_nanos().max(1)) as usize)
            .max(1);
        while self.windows.len() > n {
            self.windows.pop_front();
        }
        let oldest = self.windows.front().map_or(rec.start_ns, |w| w.0.start_ns);
        session.flight_forget_before(oldest);
        let auto = self.s.auto;
        let why = self.pending.take().or_else(|| {
            if !auto {
                None
            } else if report.verdict.primary != crate::analysis::verdict::Primary::None {
                Some("the window's verdict is not none")
            } else {
                let p99 = report.summary.requests.as_ref().map(|r| r.p99_ns);
                match (p99, self.s.trigger_p99) {
                    (Some(p), Some(limit)) if p > limit.as_nanos() as u64 => {
                        Some("the window's p99 is over --trigger-p99")
                    }
                    _ => None,
                }
            }
        });
        let Some(why) = why else { return Ok(None) };
        if let Some(refused) = self.refused() {
            self.suppressed += 1;
            eprintln!("tracer: flight recorder: {why}, but {refused}: no file");
            return Ok(None);
        }
        let path = self.write(session, rec)?;
        self.files += 1;
        self.last_file = Some(Instant::now());
        eprintln!(
            "tracer: flight recorder: {why}: wrote {} ({} windows, {})",
            path.display(),
            self.windows.len(),
            crate::units::dur(rec.end_ns - oldest)
        );
        Ok(Some(path))
    }

    /// Why no file may be written now, if so.
    fn refused(&self) -> Option<String> {
        if self.files >= self.s.max_files {
            return Some(format!(
                "{} files were written already (--max-files)",
                self.files
            ));
        }
        let last = self.last_file?;
        (last.elapsed() < self.s.every).then(|| {
            format!(
                "the last file was written {} ago (at most one every {}, --trigger-every)",
                crate::units::dur(last.elapsed().as_nanos() as u64),
                crate::units::given(self.s.every)
            )
        })
    }

    fn write(&self, session: &dyn FlightStore, last: &Recording) -> Result<PathBuf> {
        // Only windows whose records are all held (--keep-max-mib), and the last one in any
        // case, saying what it lacks.
        let after = session.flight_complete_after();
        let mut kept: Vec<&(Recording, String)> = self
            .windows
            .iter()
            .filter(|w| after.is_none_or(|t| w.0.start_ns > t))
            .collect();
        if kept.len() < self.windows.len() {
            let held = after.unwrap_or(0);
            eprintln!(
                "tracer: flight recorder: the records of the last {} exceeded --keep-max-mib: \
                 the file holds {} of {} windows{}",
                crate::units::given(self.s.keep),
                kept.len().max(1),
                self.windows.len(),
                if kept.is_empty() {
                    format!(
                        ", and the last lacks its records before {} into it",
                        crate::units::dur(held.saturating_sub(last.start_ns))
                    )
                } else {
                    String::new()
                }
            );
        }
        if kept.is_empty() {
            kept.extend(self.windows.back());
        }
        let recs: Vec<Recording> = kept.iter().map(|w| w.0.clone()).collect();
        let mut merged = merge(&recs).expect("the window just closed is kept");
        if let Some(t) = after.filter(|&t| t >= merged.start_ns) {
            // The last window alone, its records before `t` gone: the file says so.
            merged.timeline_missing_before_ns = Some(t.min(merged.end_ns));
        }
        let when = std::time::UNIX_EPOCH + Duration::from_nanos(last.host.unix_ns(last.end_ns));
        // 2026-12-02T07:12:30Z -> 20261202T071230Z: no colons in a file name.
        let stamp: String = humantime::format_rfc3339_seconds(when)
            .to_string()
            .chars()
            .filter(|c| !matches!(c, '-' | ':'))
            .collect();
        let base = format!("tracer-{}-{stamp}", session.flight_pid());
        let path = unused(&self.s.dir, &base);
        let written = session.write_flight(&path, &merged);
        // The merged copy and the writer's buffers are a peak beside the flight recorder's
        // own memory (15.5 MB for a minute of 50 threads, BENCHMARKS.md), which the allocator
        // would otherwise keep for good: hand it back.
        drop((merged, recs));
        // SAFETY: malloc_trim only releases free heap memory.
        unsafe { libc::malloc_trim(0) };
        let written = written?;
        let mut lines = String::new();
        for (_, doc) in kept {
            lines.push_str(doc);
            lines.push('\n');
        }
        // Beside a trace file at a path not taken: nothing of anyone's is there.
        crate::trace::writer::write_atomic(
            &written.with_extension("windows.jsonl"),
            lines.as_bytes(),
            crate::trace::output::Kind::Any,
        )?;
        Ok(written)
    }
}

/// `DIR/BASE.trace`, or `DIR/BASE-N.trace` for the first N not taken (two triggers in one
/// second each get a file).
fn unused(dir: &Path, base: &str) -> PathBuf {
    let mut p = dir.join(format!("{base}.trace"));
    let mut n = 1;
    while p.exists() {
        n += 1;
        p = dir.join(format!("{base}-{n}.trace"));
    }
    p
}
