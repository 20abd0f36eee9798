//! Where the window lines go: standard output, or a log file appended to and reopened at
//! SIGHUP (logrotate moves it away, then signals).

use std::{
    fs::File,
    io::Write as _,
    os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _},
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result};

/// A log that is there must be a regular file: appending to a device or a FIFO is not a log.
pub fn check(path: &Path) -> Result<()> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("--log {}", path.display())),
        Ok(m) if m.file_type().is_file() => Ok(()),
        Ok(m) => {
            let what = if m.is_dir() {
                "a directory"
            } else if m.file_type().is_symlink() {
                "a symbolic link"
            } else if m.file_type().is_fifo() {
                "a FIFO"
            } else {
                "not a regular file"
            };
            Err(crate::error::TracerError::Usage {
                message: format!(
                    "--log {}: it is {what}; give a regular file's path (it is appended to)",
                    path.display()
                ),
            }
            .into())
        }
    }
}

/// Where the windows go. A log that cannot be written (a full disk) costs the window, not
/// the watch: the exporter and the flight recorder go on, the next window is tried, and the
/// run fails at its end with how many windows the log lacks. A window that could not be
/// written whole is taken back out, so the log stays whole lines.
pub struct Out {
    path: Option<PathBuf>,
    file: Option<File>,
    /// Windows the log lacks, and whether the last one was among them.
    lost: u64,
    failing: bool,
    /// The log was made by this run (not one appended to).
    made: bool,
}

/// Opens the log for appending, making it if it is not there: (the file, whether it was made).
fn open(path: &Path) -> Result<(File, bool)> {
    check(path)?;
    let opts = |create_new: bool| {
        let mut o = std::fs::OpenOptions::new();
        o.append(true)
            .create_new(create_new)
            // The windows name the target's processes with their command lines, which may
            // carry secrets: not for every user (0640, as system logs are).
            .mode(0o640)
            // Checked above; a symlink put there since is not followed.
            .custom_flags(libc::O_NOFOLLOW);
        o
    };
    let made = match opts(true).open(path) {
        // A log made here is the user's who ran sudo, as the other outputs are; one that
        // was there keeps its owner and mode.
        Ok(f) => {
            crate::trace::output::own_by_invoker(&f);
            Ok((f, true))
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            opts(false).open(path).map(|f| (f, false))
        }
        Err(e) => Err(e),
    };
    made.with_context(|| format!("opening the log {}", path.display()))
}

/// Appends `bytes` whole or not at all.
fn append(f: &mut File, bytes: &[u8]) -> std::io::Result<()> {
    let before = f.metadata()?.len();
    f.write_all(bytes).inspect_err(|_| {
        let _ = f.set_len(before);
    })
}

impl Out {
    pub fn open(path: Option<&Path>) -> Result<Self> {
        let opened = path.map(open).transpose()?;
        Ok(Self {
            path: path.map(Path::to_path_buf),
            made: opened.as_ref().is_some_and(|o| o.1),
            file: opened.map(|o| o.0),
            lost: 0,
            failing: false,
        })
    }

    /// The watch could not start: a log this run made, still empty, goes, so a start that
    /// failed (the probes refused, a signal handler) leaves no file behind.
    pub fn abandon(self) {
        use std::os::unix::fs::MetadataExt as _;
        let (Some(p), Some(f)) = (&self.path, &self.file) else {
            return;
        };
        // Still the file made here (not one put at the path since), and empty.
        if let (true, Ok(ours), Ok(there)) = (self.made, f.metadata(), std::fs::metadata(p))
            && (ours.dev(), ours.ino()) == (there.dev(), there.ino())
            && ours.len() == 0
        {
            let _ = std::fs::remove_file(p);
        }
    }

    /// Reopens the log by its path (a no-op on standard output). One that cannot be opened
    /// (its directory gone) leaves the one open before in use, and says so.
    pub fn reopen(&mut self) {
        if let Some(p) = &self.path {
            match open(p) {
                Ok((f, _)) => self.file = Some(f),
                Err(e) => eprintln!(
                    "tracer: SIGHUP: {e:#}; the windows still go to the log open before (SIGHUP \
                     again to retry)"
                ),
            }
        }
    }

    pub fn line(&mut self, text: &str) -> Result<()> {
        let text = crate::recording::terminal_safe(text) + "\n";
        self.put(text.into_owned().into_bytes())
    }

    pub fn json(&mut self, doc: &impl serde::Serialize) -> Result<()> {
        let mut bytes = Vec::new();
        crate::render::write_json_line(doc, &mut bytes)?;
        self.put(bytes)
    }

    fn put(&mut self, bytes: Vec<u8>) -> Result<()> {
        let (Some(f), Some(path)) = (self.file.as_mut(), &self.path) else {
            let mut out = std::io::stdout().lock();
            return out
                .write_all(&bytes)
                .and_then(|()| out.flush())
                .context("writing the window to standard output");
        };
        match append(f, &bytes) {
            Ok(()) if self.failing => {
                self.failing = false;
                eprintln!(
                    "tracer: the log {} is written again ({} windows are missing from it)",
                    path.display(),
                    self.lost
                );
            }
            Ok(()) => {}
            Err(e) => {
                self.lost += 1;
                if !std::mem::replace(&mut self.failing, true) {
                    eprintln!(
                        "tracer: writing the window to the log {}: {e}; the watch goes on and \
                         tries again at the next window",
                        path.display()
                    );
                }
            }
        }
        Ok(())
    }

    /// At the end: an error if windows are missing from the log.
    pub fn finish(&self) -> Result<()> {
        match (&self.path, self.lost) {
            (Some(p), n) if n > 0 => {
                anyhow::bail!(
                    "{n} windows could not be written to the log {}",
                    p.display()
                )
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_is_appended_to_and_reopened_by_its_path() {
        let dir = std::env::temp_dir().join(format!("tracer-log-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("watch.log");
        let _ = std::fs::remove_file(&log);
        let mut out = Out::open(Some(&log)).unwrap();
        out.line("one").unwrap();
        // logrotate: moved away, then SIGHUP.
        let rotated = dir.join("watch.log.1");
        std::fs::rename(&log, &rotated).unwrap();
        out.line("two").unwrap();
        out.reopen();
        out.line("three").unwrap();
        assert_eq!(std::fs::read_to_string(&rotated).unwrap(), "one\ntwo\n");
        assert_eq!(std::fs::read_to_string(&log).unwrap(), "three\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Its directory gone at SIGHUP: the open log stays in use. A window the disk has no room
    /// for is left out whole, and the watch ends failing with the count.
    #[test]
    fn a_log_that_fails_costs_windows_not_the_watch() {
        let dir = std::env::temp_dir().join(format!("tracer-log-gone-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("watch.log");
        let mut out = Out::open(Some(&log)).unwrap();
        let held = std::fs::OpenOptions::new().read(true).open(&log).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        out.reopen();
        out.line("one").unwrap();
        let mut text = String::new();
        std::io::Read::read_to_string(&mut &held, &mut text).unwrap();
        assert_eq!(text, "one\n");
        assert!(out.finish().is_ok());
        // No room: /dev/full fails every write, as a full disk does.
        out.file = Some(
            std::fs::OpenOptions::new()
                .write(true)
                .open("/dev/full")
                .unwrap(),
        );
        out.line("two").unwrap();
        out.line("three").unwrap();
        let e = out.finish().unwrap_err();
        assert!(
            format!("{e}").starts_with("2 windows could not be written"),
            "{e}"
        );
    }

    /// A start that failed removes the log it made, and only that: one that was there, or
    /// one with a window in it, stays.
    #[test]
    fn a_failed_start_leaves_no_log_it_made() {
        let dir = std::env::temp_dir().join(format!("tracer-log-start-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("watch.log");
        Out::open(Some(&log)).unwrap().abandon();
        assert!(!log.exists());
        std::fs::write(&log, "").unwrap();
        Out::open(Some(&log)).unwrap().abandon();
        assert!(log.exists(), "a log that was there is the user's");
        std::fs::remove_file(&log).unwrap();
        let mut out = Out::open(Some(&log)).unwrap();
        out.line("one").unwrap();
        out.abandon();
        assert_eq!(std::fs::read_to_string(&log).unwrap(), "one\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_log_that_is_not_a_regular_file_is_refused() {
        let err = check(Path::new("/dev/null")).unwrap_err();
        assert!(format!("{err:#}").contains("not a regular file"), "{err:#}");
        assert!(check(Path::new("/tmp")).is_err());
    }
}
