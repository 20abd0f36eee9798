//! `watch --latencies`: the log is read from where the last window left it, not again from
//! its start. A server's log grows for as long as the watch runs (1,000 requests/s make 1 GiB
//! in about four hours): read whole every window, its cost grew with it, and past the size
//! `attach` accepts no window had requests at all. What was there before the watch began is
//! no window's and is skipped (its clock lines still count); a rotated or truncated log is read
//! from its start; a malformed line costs that line, not the window nor the ones after.

use std::{
    fs::File,
    io::{BufRead as _, BufReader, Read as _, Seek as _, SeekFrom},
    os::unix::fs::{MetadataExt as _, OpenOptionsExt as _},
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result, bail};

use crate::recording::{
    Recording,
    latency_log::{LogParser, PendingSpans},
    requests::RequestSet,
};

/// At most this much of the log is read for one window (some 3.5 million requests); the rest
/// waits for the next, so that one window's reading stays bounded in time and memory.
const MAX_READ: u64 = 256 << 20;
/// How many of the last bytes read are compared to tell a log truncated and written again.
const SEEN: usize = 64;

pub struct LogTail {
    path: PathBuf,
    /// The file read so far (device, inode), and how far: past its last whole line.
    file: Option<(u64, u64)>,
    offset: u64,
    /// The last bytes read (up to SEEN): a log truncated in place and written again past
    /// `offset` by the next reading no longer has them there.
    seen: Vec<u8>,
    /// A whole record was read without its newline, which the next reading begins with.
    glued: bool,
    parser: LogParser,
    pending: PendingSpans,
}

impl LogTail {
    /// Starts at the log's end as it is now: what it holds is from before the watch.
    pub fn open(path: &Path) -> Result<Self> {
        let mut tail = Self {
            path: path.to_owned(),
            file: None,
            offset: 0,
            seen: Vec::new(),
            glued: false,
            parser: LogParser::default(),
            pending: PendingSpans::default(),
        };
        // The whole history, however large: it is only scanned for clock lines. A line longer
        // than a reading's limit ends the scan, where it stands.
        loop {
            let at = tail.offset;
            if !tail.read(|p, line| p.skip(line))? || tail.offset == at {
                break;
            }
        }
        Ok(tail)
    }

    /// The requests of the window `rec`: those appended since the last window, with those
    /// held from it. The lines that could not be read are reported, with their count.
    pub fn window(&mut self, rec: &Recording) -> Result<RequestSet> {
        let offset = rec.host.realtime_minus_monotonic_ns;
        let (mut spans, mut bad) = (Vec::new(), Vec::new());
        let read = self.read(|p, line| match p.line(line, offset) {
            Ok(span) => spans.extend(span),
            Err(e) => bad.push(e),
        });
        for s in spans {
            self.pending.push(s);
        }
        // What was read before an error (the file gone, say) still counts.
        let set = self.pending.take(
            (rec.start_ns, rec.end_ns),
            crate::sources::clock::monotonic_ns(),
        );
        read?;
        if let Some(first) = bad.first() {
            eprintln!(
                "tracer: the latency log {}: {} line(s) left out of this window, the first: \
                 {first:#}",
                self.path.display(),
                bad.len()
            );
        }
        set.with_context(|| format!("{}", self.path.display()))
    }

    /// Reads what was appended since the last reading, up to MAX_READ; whether it stopped
    /// there with more to read.
    fn read(&mut self, mut each: impl FnMut(&mut LogParser, &str)) -> Result<bool> {
        let mut f = open(&self.path)?;
        let meta = f.metadata()?;
        let id = (meta.dev(), meta.ino());
        // Another file at the path (rotated), or this one cut short (copytruncate).
        if self.file != Some(id) || meta.len() < self.offset || !self.still_there(&f)? {
            (self.file, self.offset, self.glued) = (Some(id), 0, false);
            self.seen.clear();
            self.parser.restart();
        }
        f.seek(SeekFrom::Start(self.offset))?;
        let mut r = BufReader::with_capacity(1 << 16, f.take(MAX_READ));
        let mut buf = Vec::new();
        loop {
            buf.clear();
            let n = r.read_until(b'\n', &mut buf)? as u64;
            let whole = buf.last() == Some(&b'\n');
            let line = String::from_utf8_lossy(buf.strip_suffix(b"\n").unwrap_or(&buf));
            if n == 0 || (!whole && r.get_ref().limit() == 0) {
                // The end, or the reading's limit (maybe in the middle of a line).
                return Ok(r.get_ref().limit() == 0);
            }
            if std::mem::take(&mut self.glued) && whole && line.is_empty() {
                // The newline of a record read whole last time.
                self.advance(&buf);
                continue;
            }
            if !whole {
                // A record still being written is read whole next time; one that is whole
                // already (a writer that ends its lines late) is read now.
                if serde_json::from_str::<serde::de::IgnoredAny>(line.trim()).is_err() {
                    return Ok(false);
                }
                self.glued = true;
            }
            self.advance(&buf);
            each(&mut self.parser, &line);
        }
    }

    fn advance(&mut self, bytes: &[u8]) {
        self.offset += bytes.len() as u64;
        self.seen.extend_from_slice(bytes);
        let cut = self.seen.len().saturating_sub(SEEN);
        self.seen.drain(..cut);
    }

    /// Whether the bytes last read are still where they were.
    fn still_there(&self, f: &File) -> Result<bool> {
        use std::os::unix::fs::FileExt as _;
        let mut now = vec![0; self.seen.len()];
        let at = self.offset - self.seen.len() as u64;
        Ok(f.read_exact_at(&mut now, at).is_ok() && now == self.seen)
    }
}

/// Opens the log without blocking, should the path have become a FIFO, and refuses anything
/// but a regular file.
fn open(path: &Path) -> Result<File> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .with_context(|| format!("the latency log {} cannot be read", path.display()))?;
    if !f.metadata()?.is_file() {
        bail!(
            "the latency log {} is no longer a regular file",
            path.display()
        );
    }
    Ok(f)
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use super::*;

    fn req(start_ns: u64, end_ns: u64) -> String {
        format!("{{\"start_ns\": {start_ns}, \"end_ns\": {end_ns}, \"tid\": 7}}")
    }

    fn append(path: &Path, text: &str) {
        let mut f = std::fs::OpenOptions::new().append(true).open(path).unwrap();
        f.write_all(text.as_bytes()).unwrap();
    }

    /// The window's start times of the requests it took, and its unpaired count.
    fn window(tail: &mut LogTail, start_ns: u64, end_ns: u64) -> (Vec<u64>, u64) {
        let mut rec = crate::recording::testutil::recording(vec![], vec![]);
        (rec.start_ns, rec.end_ns) = (start_ns, end_ns);
        rec.host.realtime_minus_monotonic_ns = 1_000_000;
        let set = tail.window(&rec).unwrap();
        (set.spans.iter().map(|s| s.start_ns).collect(), set.unpaired)
    }

    /// History is skipped (a bad line in it costs nothing, its clock line holds); each window
    /// reads only what was appended; a record still being written waits, a whole one without
    /// its newline is read once; a malformed line costs itself; a rotated or truncated log is
    /// read from its start, on its own clock.
    #[test]
    fn a_growing_log_is_read_once_from_where_it_was_left() {
        let dir = std::env::temp_dir().join(format!("tracer-tail-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("lat.jsonl");
        let history = format!("not json\n{{\"clock\": \"realtime\"}}\n{}\n", req(1, 2));
        std::fs::write(&path, history).unwrap();
        let mut tail = LogTail::open(&path).unwrap();
        // Realtime: 1_000_000 ahead of monotonic.
        append(
            &path,
            &format!(
                "{}\n{}\nbad\n{}",
                req(1_000_100, 1_000_200),
                req(1_000_300, 1_000_400),
                req(1_000_500, 1_000_600)
            ),
        );
        // The last record is whole without its newline: read now.
        assert_eq!(window(&mut tail, 0, 1_000), (vec![100, 300, 500], 0));
        append(
            &path,
            &format!("\n{}\n{{\"start_ns\": 100", req(1_001_100, 1_001_200)),
        );
        assert_eq!(window(&mut tail, 1_000, 2_000), (vec![1_100], 0));
        // The record being written is finished; one from before the window came late.
        append(
            &path,
            &format!(
                "2100, \"end_ns\": 1002200, \"tid\": 7}}\n{}\n",
                req(1_000_700, 1_000_800)
            ),
        );
        assert_eq!(window(&mut tail, 2_000, 3_000), (vec![2_100], 1));
        // Rotated: the new file is monotonic until it says otherwise.
        std::fs::rename(&path, dir.join("lat.jsonl.1")).unwrap();
        std::fs::write(&path, format!("{}\n", req(3_100, 3_200))).unwrap();
        assert_eq!(window(&mut tail, 3_000, 4_000), (vec![3_100], 0));
        // Truncated in place (copytruncate).
        std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        append(&path, &format!("{}\n", req(4_100, 4_200)));
        assert_eq!(window(&mut tail, 4_000, 5_000), (vec![4_100], 0));
        std::fs::remove_file(&path).unwrap();
        let mut rec = crate::recording::testutil::recording(vec![], vec![]);
        (rec.start_ns, rec.end_ns) = (5_000, 6_000);
        let e = tail.window(&rec).unwrap_err();
        assert!(format!("{e:#}").contains("cannot be read"), "{e:#}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
