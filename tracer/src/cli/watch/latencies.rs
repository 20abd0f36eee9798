//! `watch --latencies`: the log is read from where the last window left it, not again from
//! its start. A server's log grows for as long as the watch runs (1,000 requests/s make 1 GiB
//! in about four hours): read whole every window, its cost grew with it, and past the size
//! `attach` accepts no window had requests at all. What was there before the watch began is
//! no window's and is skipped (its clock lines still count). A log renamed away (rotated) is
//! read to its end before the new one at the path is read from its start; one truncated in place
//! (copytruncate) is read from its start. A malformed line costs that line, not the window nor
//! the ones after.

use std::{
    fs::File,
    io::{BufRead as _, BufReader, Read as _, Seek as _, SeekFrom},
    os::unix::fs::{FileExt as _, MetadataExt as _, OpenOptionsExt as _},
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result, bail};

use crate::recording::{
    Recording,
    latency_log::{LogParser, PendingSpans, is_whole_record, to_kernel_tids},
    requests::RequestSet,
};

/// At most this much of the log is read for one window (some 3.5 million requests); the rest
/// waits for the next, so that one window's reading stays bounded in time and memory.
const MAX_READ: u64 = 256 << 20;
/// How many of the first and last bytes read are compared to tell a log truncated and written
/// again.
const SEEN: usize = 64;

pub struct LogTail {
    path: PathBuf,
    /// The file being read (kept open: a rotation renames it, and the server may write to it
    /// until it reopens its log).
    cur: Option<Cursor>,
    parser: LogParser,
    pending: PendingSpans,
}

/// Where the reading of one file stands.
struct Cursor {
    file: File,
    /// (device, inode).
    id: (u64, u64),
    /// Past the last whole line read.
    offset: u64,
    /// The file's first bytes and the last ones read (up to SEEN each): a log truncated in
    /// place and written again past `offset` by the next reading no longer has them there.
    head: Vec<u8>,
    seen: Vec<u8>,
    /// A whole record was read without its newline, which the next reading begins with.
    glued: bool,
    /// Within a line longer than MAX_READ, skipped to its end.
    skipping: bool,
}

fn id_of(f: &File) -> Result<(u64, u64)> {
    let m = f.metadata()?;
    Ok((m.dev(), m.ino()))
}

impl Cursor {
    fn new(file: File) -> Result<Self> {
        Ok(Self {
            id: id_of(&file)?,
            file,
            offset: 0,
            head: Vec::new(),
            seen: Vec::new(),
            glued: false,
            skipping: false,
        })
    }

    /// Whether the file still holds what was read of it: not cut short, its first and last
    /// bytes read still where they were.
    fn intact(&self) -> Result<bool> {
        let same = |bytes: &[u8], at: u64| {
            let mut now = vec![0; bytes.len()];
            self.file.read_exact_at(&mut now, at).is_ok() && now == bytes
        };
        Ok(self.file.metadata()?.len() >= self.offset
            && same(&self.head, 0)
            && same(&self.seen, self.offset - self.seen.len() as u64))
    }

    fn advance(&mut self, bytes: &[u8]) {
        if self.head.len() < SEEN {
            let n = (SEEN - self.head.len()).min(bytes.len());
            self.head.extend_from_slice(&bytes[..n]);
        }
        self.offset += bytes.len() as u64;
        self.seen.extend_from_slice(bytes);
        let cut = self.seen.len().saturating_sub(SEEN);
        self.seen.drain(..cut);
    }

    /// Reads what was appended since the last reading, up to MAX_READ, a line at a time;
    /// whether it stopped at that limit, with more to read.
    fn read(
        &mut self,
        parser: &mut LogParser,
        each: &mut dyn FnMut(&mut LogParser, &str),
    ) -> Result<bool> {
        let mut f = self.file.try_clone()?;
        f.seek(SeekFrom::Start(self.offset))?;
        let mut r = BufReader::with_capacity(1 << 16, f.take(MAX_READ));
        let mut buf = Vec::new();
        loop {
            buf.clear();
            let n = r.read_until(b'\n', &mut buf)?;
            let whole = buf.last() == Some(&b'\n');
            let at_limit = r.get_ref().limit() == 0;
            if n == 0 {
                return Ok(at_limit);
            }
            if !whole && at_limit {
                if n as u64 == MAX_READ {
                    // One line longer than a whole reading: no server's record.
                    eprintln!(
                        "tracer: the latency log has a line longer than {} MiB: skipped",
                        MAX_READ >> 20
                    );
                    self.advance(&buf);
                    self.skipping = true;
                }
                return Ok(true);
            }
            let line = String::from_utf8_lossy(buf.strip_suffix(b"\n").unwrap_or(&buf));
            // (`trim`: a CRLF writer's `\r` comes with it.)
            if std::mem::take(&mut self.glued) && whole && line.trim().is_empty() {
                // The newline of a record read whole last time.
                self.advance(&buf);
                continue;
            }
            if std::mem::take(&mut self.skipping) {
                self.advance(&buf);
                parser.skip("");
                continue;
            }
            if !whole {
                // A record still being written is read whole next time; one that is whole
                // already (a writer that ends its lines late) is read now.
                if !is_whole_record(&line) {
                    return Ok(false);
                }
                self.glued = true;
            }
            self.advance(&buf);
            each(parser, &line);
        }
    }
}

impl LogTail {
    /// Starts at the log's end as it is now: what it holds is from before the watch.
    pub fn open(path: &Path) -> Result<Self> {
        let mut tail = Self {
            path: path.to_owned(),
            cur: None,
            parser: LogParser::default(),
            pending: PendingSpans::default(),
        };
        // The whole history, however large: it is only scanned for clock lines.
        while tail.read(&mut |p, line| p.skip(line))? {}
        Ok(tail)
    }

    /// The requests of the window `rec`: those appended since the last window, with those
    /// held from it. A line that cannot be read is reported and costs only itself; a log that
    /// cannot be read (gone while rotated) is reported, and the window keeps what was read.
    pub fn window(&mut self, rec: &Recording) -> Result<RequestSet> {
        let offset = rec.host.realtime_minus_monotonic_ns;
        let (mut spans, mut bad, mut first_bad) = (Vec::new(), 0, None);
        let read = self.read(&mut |p, line| match p.line(line, offset) {
            Ok(span) => spans.extend(span),
            Err(e) => {
                bad += 1;
                first_bad.get_or_insert(e);
            }
        });
        for s in spans {
            self.pending.push(s);
        }
        if let Err(e) = read {
            eprintln!("tracer: {e:#}: this window has the requests read before");
        }
        if let Some(first) = first_bad {
            eprintln!(
                "tracer: the latency log {}: {bad} line(s) left out of this window, the first: \
                 {first:#}",
                self.path.display(),
            );
        }
        let mut set = self
            .pending
            .take(
                (rec.start_ns, rec.end_ns),
                crate::sources::clock::monotonic_ns(),
            )
            .with_context(|| format!("{}", self.path.display()))?;
        to_kernel_tids(&mut set, rec.pid_namespace.as_ref());
        Ok(set)
    }

    /// Reads what was appended since the last reading (up to MAX_READ); whether there may be
    /// more. Another file at the path now (the log was rotated), or none: what the server
    /// wrote to the one open before since the last reading is read first.
    fn read(&mut self, each: &mut dyn FnMut(&mut LogParser, &str)) -> Result<bool> {
        let at_path = open(&self.path);
        let moved = match (&self.cur, &at_path) {
            (Some(c), Ok(f)) => id_of(f)? != c.id,
            (Some(_), Err(_)) => true,
            (None, _) => false,
        };
        if moved && let Some(c) = self.cur.as_mut() {
            while c.read(&mut self.parser, each)? {}
        }
        let f = at_path?;
        match self.cur.as_mut() {
            Some(c) if !moved && c.intact()? => {}
            _ => {
                // A new file, or this one cut short: from its start, on its own clock.
                self.cur = Some(Cursor::new(f)?);
                self.parser.restart();
            }
        }
        let c = self.cur.as_mut().expect("set above");
        c.read(&mut self.parser, each)
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
        // Rotated: what the server wrote to the old file after the last reading is read
        // before the new one, which is monotonic until it says otherwise.
        let old = dir.join("lat.jsonl.1");
        std::fs::rename(&path, &old).unwrap();
        append(&old, &format!("{}\n", req(1_003_050, 1_003_060)));
        std::fs::write(&path, format!("{}\n", req(3_100, 3_200))).unwrap();
        assert_eq!(window(&mut tail, 3_000, 4_000), (vec![3_050, 3_100], 0));
        // Truncated in place (copytruncate), and written past where the reading was.
        std::fs::write(
            &path,
            format!("{}\n{}\n", req(4_100, 4_200), req(4_300, 4_400)),
        )
        .unwrap();
        assert_eq!(window(&mut tail, 4_000, 5_000), (vec![4_100, 4_300], 0));
        // A request read for a later window, then the log gone (mid-rotation): the window
        // still has it.
        append(&path, &format!("{}\n", req(5_100, 5_200)));
        assert_eq!(window(&mut tail, 4_000, 5_000).0, Vec::<u64>::new());
        std::fs::remove_file(&path).unwrap();
        assert_eq!(window(&mut tail, 5_000, 6_000), (vec![5_100], 0));
        // A line longer than a reading's limit is skipped, not read for ever.
        std::fs::write(&path, "").unwrap();
        let long = "x".repeat(MAX_READ as usize + 10);
        append(&path, &format!("{long}\n{}\n", req(6_100, 6_200)));
        assert_eq!(window(&mut tail, 6_000, 7_000).0, Vec::<u64>::new());
        assert_eq!(window(&mut tail, 6_000, 7_000).0, vec![6_100]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
