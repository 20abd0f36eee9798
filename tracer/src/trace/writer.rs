//! Writing a trace file as the recording goes: the timeline about once a second (a crash loses
//! at most the last second), into `PATH.tmp` created 0600 and never through a symbolic link;
//! renamed to `PATH` only once complete, so `PATH` is never half-written.

use std::{
    fs::{File, OpenOptions},
    io::{BufWriter, Write},
    os::{fd::AsRawFd as _, unix::fs::OpenOptionsExt},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, anyhow, bail};

use super::{
    TraceMeta,
    format::{FrameKind, write_frame, write_header},
    output::Kind,
};
use crate::recording::{Recording, cgroup::CgroupSample, gpu::GpuPoll};

/// How often buffered timeline records are written out.
const FLUSH_EVERY: Duration = Duration::from_secs(1);
/// Or sooner, when this much is buffered.
const FLUSH_BYTES: usize = 4 << 20;

pub struct TraceWriter {
    /// None once finished.
    out: Option<BufWriter<File>>,
    tmp: PathBuf,
    path: PathBuf,
    records: Vec<u8>,
    gpu: Vec<GpuPoll>,
    cgroup: Vec<CgroupSample>,
    last_flush: Instant,
    /// The first write error: later writes are skipped, `finish` reports it.
    failed: Option<String>,
    /// The window's description is written (`meta`): from then on the file holds a recording.
    opened: bool,
}

fn cbor<T: serde::Serialize>(v: &T) -> Vec<u8> {
    let mut out = Vec::new();
    ciborium::into_writer(v, &mut out).expect("in-memory CBOR encoding cannot fail");
    out
}

impl TraceWriter {
    /// Creates `PATH.tmp` for writing. Fails, saying what to do, if `PATH` is a directory or a
    /// symbolic link, if a `PATH.tmp` is left from an interrupted recording, or if the
    /// directory is not writable.
    pub fn create(path: &Path) -> Result<Self> {
        super::output::check_replaceable(path, Kind::Trace)?;
        let tmp = super::output::temp_path(path);
        let file = match create_temp(&tmp) {
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                leftover(&tmp)?;
                create_temp(&tmp)
            }
            r => r,
        }
        .map_err(|e| {
            anyhow!(
                "cannot write the trace file {}: {e} (check that the directory exists and is \
                 writable)",
                tmp.display()
            )
        })?;
        // Held until the file is finished or the tracer dies: another tracer given the same
        // path can tell a live recording from a leftover.
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            bail!(
                "another tracer is writing {} now: wait for it to finish, or give another path",
                tmp.display()
            );
        }
        super::output::own_by_invoker(&file);
        let mut out = BufWriter::new(file);
        if let Err(e) = write_header(&mut out).and_then(|()| out.flush()) {
            // Nothing recorded yet (a full disk, say): no leftover to stand in the way.
            let _ = std::fs::remove_file(&tmp);
            return Err(e).with_context(|| format!("writing {}", tmp.display()));
        }
        Ok(Self {
            out: Some(out),
            tmp,
            path: path.to_path_buf(),
            records: Vec::new(),
            gpu: Vec::new(),
            cgroup: Vec::new(),
            last_flush: Instant::now(),
            failed: None,
            opened: false,
        })
    }

    fn frame(&mut self, kind: FrameKind, payload: &[u8], zstd: bool) {
        let Some(out) = self.out.as_mut().filter(|_| self.failed.is_none()) else {
            return;
        };
        if let Err(e) = write_frame(out, kind, payload, zstd) {
            self.failed = Some(e.to_string());
        }
    }

    pub fn meta(&mut self, meta: &TraceMeta) {
        self.opened = true;
        self.frame(FrameKind::Meta, &cbor(meta), false);
        // Out now: a tracer killed in its first second leaves a file `report` can name.
        self.flush();
    }

    /// Buffers one raw ring-buffer record.
    pub fn record(&mut self, bytes: &[u8]) {
        self.records.extend_from_slice(bytes);
    }

    pub fn gpu_polls(&mut self, polls: &[GpuPoll]) {
        self.gpu.extend_from_slice(polls);
    }

    pub fn cgroup(&mut self, s: CgroupSample) {
        self.cgroup.push(s);
    }

    /// Writes out what is buffered if a second has passed or the buffer is large.
    pub fn maybe_flush(&mut self) {
        if self.last_flush.elapsed() >= FLUSH_EVERY || self.records.len() >= FLUSH_BYTES {
            self.flush();
        }
    }

    /// Writes out everything buffered and hands it to the kernel: a crash of the tracer after
    /// this loses nothing of it.
    pub fn flush(&mut self) {
        if !self.records.is_empty() {
            let records = std::mem::take(&mut self.records);
            self.frame(FrameKind::Records, &records, true);
        }
        if !self.gpu.is_empty() {
            let gpu = cbor(&std::mem::take(&mut self.gpu));
            self.frame(FrameKind::Gpu, &gpu, true);
        }
        if !self.cgroup.is_empty() {
            let c = cbor(&std::mem::take(&mut self.cgroup));
            self.frame(FrameKind::Cgroup, &c, false);
        }
        if self.failed.is_none()
            && let Some(out) = self.out.as_mut()
            && let Err(e) = out.flush()
        {
            self.failed = Some(e.to_string());
        }
        self.last_flush = Instant::now();
    }

    /// Writes the final frames, syncs, and renames `PATH.tmp` to `PATH`.
    pub fn finish(mut self, rec: &Recording) -> Result<PathBuf> {
        let _deferred = crate::signals::Deferred::new();
        self.flush();
        self.frame(FrameKind::Final, &cbor(rec), true);
        self.frame(FrameKind::End, &[], false);
        self.flush();
        if let Some(e) = self.failed.take() {
            bail!(
                "writing the trace failed: {e}; what was written is in {} (`tracer report {}` \
                 reads it)",
                self.tmp.display(),
                self.tmp.display()
            );
        }
        let out = self.out.take().context("trace already finished")?;
        let file = out.into_inner().map_err(|e| anyhow!("{}", e.error()))?;
        file.sync_all()
            .with_context(|| format!("syncing {}", self.tmp.display()))?;
        super::output::rename_into_place(&self.tmp, &self.path, Kind::Trace)?;
        // The rename itself is durable once the directory is synced.
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty())
            && let Ok(d) = File::open(dir)
        {
            let _ = d.sync_all();
        }
        Ok(self.path.clone())
    }

    /// The temporary file's path (where a partial trace stays if the tracer dies).
    pub fn temp(&self) -> &Path {
        &self.tmp
    }
}

/// Writes `bytes` to `path` all at once: into a temporary file beside it (0600, never through
/// a symbolic link), then renamed over `path`, which must be absent, empty, or `kind` as the
/// tool writes it.
pub fn write_atomic(path: &Path, bytes: &[u8], kind: Kind) -> Result<()> {
    super::output::check_replaceable(path, kind)?;
    let _deferred = crate::signals::Deferred::new();
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp.{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let result = (|| -> std::io::Result<()> {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)?;
        super::output::own_by_invoker(&f);
        f.write_all(bytes)?;
        f.sync_all()
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        bail!("cannot write {}: {e}", path.display());
    }
    super::output::rename_into_place(&tmp, path, kind)
}

fn create_temp(tmp: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(tmp)
}

/// The header alone: what a recording killed before its first flush leaves.
const HEADER_BYTES: u64 = 16;

/// Decides what to do about a `PATH.tmp` that already exists. A live recording holds a lock
/// on it: refused. A leftover without a single frame holds nothing (the tracer was killed in
/// its first second): removed, with a notice. Anything else may hold a recording: the user is
/// told how to read it.
fn leftover(tmp: &Path) -> Result<()> {
    // Looked at before anything opens it: opening a FIFO would wait for a writer for ever
    // (signals cannot end an open blocked there), and a link or a directory holds no
    // recording of ours.
    let meta = std::fs::symlink_metadata(tmp)?;
    if !meta.file_type().is_file() {
        bail!(
            "{} exists and is {}, not a recording's temporary file: remove it or give another \
             path",
            tmp.display(),
            super::output::describe(meta.file_type())
        );
    }
    let open = || super::output::open_to_look(tmp);
    let busy = open().is_ok_and(|f| {
        // SAFETY: flock on a descriptor we own; it is released when `f` is dropped.
        unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) != 0 }
    });
    if busy {
        bail!(
            "another tracer is writing {} now: wait for it to finish, or give another path",
            tmp.display()
        );
    }
    let magic_or_nothing = || {
        let mut head = Vec::new();
        open()
            .and_then(|f| std::io::Read::read_to_end(&mut std::io::Read::take(f, 8), &mut head))
            .is_ok()
            && super::format::MAGIC.starts_with(&head)
    };
    let empty = meta.len() <= HEADER_BYTES && magic_or_nothing();
    // A tracer that has just created the file takes its lock microseconds later: a file
    // modified in the last second may be that one.
    let recent = meta
        .modified()
        .ok()
        .and_then(|m| m.elapsed().ok())
        .is_none_or(|age| age < Duration::from_secs(1));
    if empty && recent {
        bail!(
            "{} exists and is empty: another tracer may be starting to write it; if none is, \
             remove it",
            tmp.display()
        );
    }
    if empty {
        std::fs::remove_file(tmp)?;
        eprintln!(
            "tracer: removed {}, left empty by a recording that was stopped before it wrote \
             anything",
            tmp.display()
        );
        return Ok(());
    }
    bail!(
        "{} exists, left by an interrupted recording: read what it holds with `tracer report \
         {}`, then remove it",
        tmp.display(),
        tmp.display()
    )
}

impl Drop for TraceWriter {
    fn drop(&mut self) {
        // Not finished (an error path): keep what was recorded, complete frames only. Before
        // the window opened (`meta`) nothing was: a file of a header alone would only stand
        // in the next recording's way as a leftover, so it goes.
        if !self.opened {
            // Removed while still locked: once closed, another tracer given the same path could
            // take it for a leftover, replace it, and lose its own file to this removal.
            if let Some(out) = self.out.take() {
                let _ = std::fs::remove_file(&self.tmp);
                drop(out);
            }
            return;
        }
        self.flush();
    }
}
