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

pub struct Out {
    path: Option<PathBuf>,
    file: Option<File>,
}

fn open(path: &Path) -> Result<File> {
    check(path)?;
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o644)
        // Checked above; a symlink put there since is not followed.
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .with_context(|| format!("opening the log {}", path.display()))
}

impl Out {
    pub fn open(path: Option<&Path>) -> Result<Self> {
        Ok(Self {
            path: path.map(Path::to_path_buf),
            file: path.map(open).transpose()?,
        })
    }

    /// Reopens the log by its path (a no-op on standard output).
    pub fn reopen(&mut self) -> Result<()> {
        if let Some(p) = &self.path {
            self.file = Some(open(p)?);
        }
        Ok(())
    }

    pub fn line(&mut self, text: &str) -> Result<()> {
        let text = crate::recording::terminal_safe(text) + "\n";
        match self.file.as_mut() {
            Some(f) => f
                .write_all(text.as_bytes())
                .context("writing the window to the log"),
            None => crate::cli::emit::stdout(&text),
        }
    }

    pub fn json(&mut self, doc: &impl serde::Serialize) -> Result<()> {
        match self.file.as_mut() {
            Some(f) => {
                crate::render::write_json_line(doc, f).context("writing the window to the log")
            }
            None => crate::render::write_json_line(doc, std::io::stdout().lock())
                .context("writing the window to standard output"),
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
        out.reopen().unwrap();
        out.line("three").unwrap();
        assert_eq!(std::fs::read_to_string(&rotated).unwrap(), "one\ntwo\n");
        assert_eq!(std::fs::read_to_string(&log).unwrap(), "three\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_log_that_is_not_a_regular_file_is_refused() {
        let err = check(Path::new("/dev/null")).unwrap_err();
        assert!(format!("{err:#}").contains("not a regular file"), "{err:#}");
        assert!(check(Path::new("/tmp")).is_err());
    }
}
