//! The files the tool writes (trace, HTML, Perfetto): which paths it accepts, how a finished
//! file takes its place, and who owns it.
//!
//! Every output is written beside its path and renamed over it when complete. A rename
//! replaces whatever the path named, so the path must be absent or a regular file: as root,
//! `-o /dev/null` once replaced the system's /dev/null with a 0600 regular file. Devices,
//! FIFOs, sockets, directories and symbolic links are refused before anything is recorded,
//! and checked again just before the rename.

use std::{
    fs::File,
    os::unix::{
        ffi::OsStrExt as _,
        fs::{FileTypeExt as _, OpenOptionsExt as _},
    },
    path::{Path, PathBuf},
};

use anyhow::{Result, bail};

use crate::error::TracerError;

/// `PATH.tmp`, beside `PATH`.
pub fn temp_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".tmp");
    PathBuf::from(s)
}

/// What an existing path is, in words, when it is not something an output may replace.
fn not_replaceable(path: &Path) -> Option<&'static str> {
    let ft = std::fs::symlink_metadata(path).ok()?.file_type();
    (!ft.is_file()).then(|| describe(ft))
}

/// A file type, in words.
pub(super) fn describe(ft: std::fs::FileType) -> &'static str {
    if ft.is_file() {
        "a regular file"
    } else if ft.is_symlink() {
        "a symbolic link"
    } else if ft.is_dir() {
        "a directory"
    } else if ft.is_char_device() {
        "a character device"
    } else if ft.is_block_device() {
        "a block device"
    } else if ft.is_fifo() {
        "a FIFO"
    } else if ft.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}

/// What an output holds: a file the tool wrote of the same kind (an earlier recording's
/// trace, page or Perfetto file) may be replaced by a new one; any other file may not (`-o
/// serve.py` would have put a trace where the server's source was).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Trace,
    Html,
    Perfetto,
    /// Files meant to be regenerated in place (man pages, completions).
    Any,
}

/// In the `<head>` of every HTML page the tool writes (render/html/page.html).
pub const HTML_GENERATOR: &str = r#"<meta name="generator" content="tracer">"#;

impl Kind {
    /// The output a command-line flag names.
    pub fn of_flag(flag: &str) -> Self {
        match flag {
            "--html" => Kind::Html,
            "--perfetto" => Kind::Perfetto,
            "--output" => Kind::Trace,
            _ => Kind::Any,
        }
    }

    fn what(self) -> &'static str {
        match self {
            Kind::Trace => "a trace file",
            Kind::Html => "an HTML report",
            Kind::Perfetto => "a Perfetto trace",
            Kind::Any => "a file",
        }
    }

    /// Whether a file beginning with `head` (its first bytes, up to 1 KiB) is one the tool
    /// wrote as this kind.
    fn wrote(self, head: &[u8]) -> bool {
        match self {
            Kind::Trace => head.starts_with(&super::format::MAGIC),
            Kind::Html => {
                head.starts_with(b"<!DOCTYPE html>")
                    && head
                        .windows(HTML_GENERATOR.len())
                        .any(|w| w == HTML_GENERATOR.as_bytes())
            }
            // render/perfetto.rs's first packet: its timestamp, our sequence (1), then the
            // clock snapshot.
            Kind::Perfetto => {
                let varint_end = |at: usize| {
                    let n = head.get(at..)?.iter().position(|b| b & 0x80 == 0)?;
                    Some(at + n + 1)
                };
                let Some(after_len) = (head.first() == Some(&0x0a))
                    .then(|| varint_end(1))
                    .flatten()
                else {
                    return false;
                };
                head.get(after_len) == Some(&0x40)
                    && varint_end(after_len + 1)
                        .and_then(|i| head.get(i..i + 3))
                        .is_some_and(|b| b == [0x50, 0x01, 0x32])
            }
            Kind::Any => true,
        }
    }
}

/// Refuses a path that exists and is not a regular file, or is a non-empty file that is not
/// `kind` as the tool writes it.
pub fn check_replaceable(path: &Path, kind: Kind) -> Result<()> {
    if let Some(what) = not_replaceable(path) {
        bail!(
            "{} is {what}; the tracer writes only regular files (it would replace this one): \
             give the path of a new or regular file",
            path.display()
        );
    }
    if let Some(why) = foreign(path, kind) {
        bail!(
            "{} exists and {why}: the tracer replaces only its own outputs; remove it first or \
             give another path",
            path.display()
        );
    }
    Ok(())
}

/// Opens an existing path the tool may replace, to look inside: never through a symbolic
/// link, and without blocking should it be a FIFO.
pub(super) fn open_to_look(path: &Path) -> std::io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
}

/// Why an existing regular file may not be replaced by output `kind`, if it may not.
fn foreign(path: &Path, kind: Kind) -> Option<String> {
    if kind == Kind::Any {
        return None;
    }
    let mut head = Vec::with_capacity(1024);
    let read = open_to_look(path)
        .and_then(|f| std::io::Read::read_to_end(&mut std::io::Read::take(f, 1024), &mut head));
    match read {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => Some(format!("cannot be read to tell what it is ({e})")),
        Ok(_) if head.is_empty() || kind.wrote(&head) => None,
        Ok(_) => Some(format!("is not {} this tool wrote", kind.what())),
    }
}

/// The directory a relative or absolute output path lands in.
fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Checks one output path: replaceable by `kind`, in a directory that exists and can be
/// written.
pub fn check_path(path: &Path, kind: Kind) -> Result<()> {
    if path.as_os_str().is_empty() {
        bail!("an output path is empty: give a file name");
    }
    check_replaceable(path, kind)?;
    let dir = parent_dir(path);
    if !dir.is_dir() {
        bail!(
            "cannot write {}: {} is not a directory (check that the directory exists and is \
             writable)",
            path.display(),
            dir.display()
        );
    }
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes())?;
    // SAFETY: access reads the NUL-terminated path we own.
    if unsafe { libc::access(c.as_ptr(), libc::W_OK) } != 0 {
        bail!(
            "cannot write {}: {} ({}; check that the directory exists and is writable)",
            path.display(),
            dir.display(),
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

/// Where a path points, for telling whether two flags name the same file: its directory
/// resolved, and its own name as given (the file itself may not exist yet).
fn identity(path: &Path) -> PathBuf {
    let dir = std::fs::canonicalize(parent_dir(path)).unwrap_or_else(|_| parent_dir(path).into());
    match path.file_name() {
        Some(name) => dir.join(name),
        None => dir,
    }
}

/// Checks every output of one command before anything is recorded: each path, and no two
/// naming the same file (nor one naming another's temporary file, `PATH.tmp`). Giving the
/// same file twice is a usage error.
pub fn check_all(outputs: &[(&str, &Path)]) -> Result<()> {
    let ids: Vec<(&str, PathBuf)> = outputs.iter().map(|(f, p)| (*f, identity(p))).collect();
    for (i, (flag_a, a)) in ids.iter().enumerate() {
        for (flag_b, b) in &ids[i + 1..] {
            let tmp_of = |x: &Path, y: &Path| temp_path(x) == y;
            if a == b || tmp_of(a, b) || tmp_of(b, a) {
                return Err(TracerError::Usage {
                    message: format!(
                        "{flag_a} and {flag_b} name the same file ({}): give each output its \
                         own path",
                        a.display()
                    ),
                }
                .into());
            }
        }
    }
    // After the usage errors: each path, as a file.
    for (flag, path) in outputs {
        check_path(path, Kind::of_flag(flag))?;
    }
    Ok(())
}

/// Whether writing output `out` would destroy `input`: the same path, the same file under
/// another name (a hard link, or a symbolic link to it), or the output's temporary file, which
/// is created beside it and renamed over it.
fn destroys(out: &Path, input: &Path) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    let (o, i) = (identity(out), identity(input));
    let file = |p: &Path| std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()));
    let same = |a: &Path| file(a).is_some() && file(a) == file(input);
    o == i || temp_path(&o) == i || same(out) || same(&temp_path(out))
}

/// Refuses an output that would write over one of the command's inputs (the trace `report`
/// reads, a latency log): the finished output is renamed over its path, and the input would
/// be lost. A usage error, found before anything is read or recorded.
pub fn check_not_inputs(outputs: &[(&str, &Path)], inputs: &[(&str, &Path)]) -> Result<()> {
    for (flag, out) in outputs {
        if let Some((what, input)) = inputs.iter().find(|(_, i)| destroys(out, i)) {
            return Err(TracerError::Usage {
                message: format!(
                    "{flag} {} would write over {what} {}, which this command reads: give the \
                     output another path",
                    out.display(),
                    input.display()
                ),
            }
            .into());
        }
    }
    Ok(())
}

/// Refuses an input that is not a regular file (a FIFO would block the tool, a directory or
/// device is not a file it wrote), saying what it is; `what` names it in the message.
pub fn check_input(what: &str, path: &Path) -> Result<()> {
    let meta =
        std::fs::metadata(path).map_err(|e| anyhow::anyhow!("{what} {}: {e}", path.display()))?;
    if !meta.is_file() {
        let kind = describe(meta.file_type());
        bail!(
            "{what} {} is {kind}, not a regular file: give the path of the file itself",
            path.display()
        );
    }
    Ok(())
}

/// Renames a finished temporary file over `path`, unless `path` became something other than
/// a regular file, or another file than `kind` the tool wrote, since it was checked. The
/// temporary file is left where it is on failure: it holds the output.
pub fn rename_into_place(tmp: &Path, path: &Path, kind: Kind) -> Result<()> {
    if let Some(what) = not_replaceable(path) {
        bail!(
            "{} became {what} while the tracer ran; it was not replaced, and the output is in {}",
            path.display(),
            tmp.display()
        );
    }
    if let Some(why) = foreign(path, kind) {
        bail!(
            "{} appeared while the tracer ran and {why}; it was not replaced, and the output is \
             in {}",
            path.display(),
            tmp.display()
        );
    }
    std::fs::rename(tmp, path)
        .map_err(|e| anyhow::anyhow!("renaming {} to {}: {e}", tmp.display(), path.display()))
}

/// The user who ran the tool through sudo, when it runs as root that way.
fn invoker() -> Option<(libc::uid_t, libc::gid_t)> {
    // SAFETY: geteuid has no arguments and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let id = |var: &str| std::env::var(var).ok()?.parse::<u32>().ok();
    let (uid, gid) = (id("SUDO_UID")?, id("SUDO_GID")?);
    (uid != 0).then_some((uid, gid))
}

/// Gives a file the tool just created to the user who ran it through sudo: `sudo tracer ...
/// -o rec.trace` should leave a file that user can read (it stays 0600). Without sudo, or
/// when that fails (a filesystem without ownership), the file stays the tool's.
pub fn own_by_invoker(file: &File) {
    if let Some((uid, gid)) = invoker() {
        use std::os::fd::AsRawFd as _;
        // SAFETY: fchown on a descriptor we own; failure leaves the file as it was.
        let _ = unsafe { libc::fchown(file.as_raw_fd(), uid, gid) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("tracer-output-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn an_output_may_not_replace_an_input_under_any_name() {
        let d = scratch("inputs");
        let trace = d.join("rec.trace");
        std::fs::write(&trace, b"x").unwrap();
        let hard = d.join("hard");
        std::fs::hard_link(&trace, &hard).unwrap();
        let soft = d.join("soft");
        std::os::unix::fs::symlink(&trace, &soft).unwrap();
        let dotted = d.join(".").join("rec.trace");
        let partial = d.join("rec.trace.tmp");
        std::fs::write(&partial, b"x").unwrap();
        let input = [("the trace", trace.as_path())];
        for out in [&trace, &dotted, &hard] {
            let err = check_not_inputs(&[("--html", out)], &input).unwrap_err();
            assert!(
                err.to_string().contains("would write over the trace"),
                "{err}"
            );
        }
        // The input read through a link to it, or a recording's leftover read while its final
        // path is written (whose temporary file it is).
        assert!(check_not_inputs(&[("--html", &trace)], &[("the trace", &soft)]).is_err());
        assert!(check_not_inputs(&[("--html", &trace)], &[("the trace", &partial)]).is_err());
        // Another file is fine, existing or not.
        check_not_inputs(&[("--html", &d.join("page.html"))], &input).unwrap();
        check_not_inputs(&[("--html", &partial)], &input).unwrap();
        let fifo = d.join("p");
        let c = std::ffi::CString::new(fifo.as_os_str().as_bytes()).unwrap();
        // SAFETY: mkfifo reads the path we own.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let err = check_input("the trace", &fifo).unwrap_err().to_string();
        assert!(err.contains("a FIFO, not a regular file"), "{err}");
        let err = check_input("the trace", &d).unwrap_err().to_string();
        assert!(err.contains("a directory"), "{err}");
        check_input("the trace", &soft).unwrap();
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn only_absent_paths_and_regular_files_are_accepted() {
        let d = scratch("kinds");
        let regular = d.join("f");
        std::fs::write(&regular, b"x").unwrap();
        check_path(&regular, Kind::Any).unwrap();
        check_path(&d.join("new"), Kind::Any).unwrap();
        let link = d.join("l");
        std::os::unix::fs::symlink(&regular, &link).unwrap();
        let err = check_path(&link, Kind::Any).unwrap_err().to_string();
        assert!(err.contains("symbolic link"), "{err}");
        let err = check_path(&d, Kind::Any).unwrap_err().to_string();
        assert!(err.contains("a directory"), "{err}");
        let fifo = d.join("p");
        let c = std::ffi::CString::new(fifo.as_os_str().as_bytes()).unwrap();
        // SAFETY: mkfifo reads the path we own.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let err = check_path(&fifo, Kind::Any).unwrap_err().to_string();
        assert!(err.contains("a FIFO"), "{err}");
        let err = check_path(Path::new("/dev/null"), Kind::Any)
            .unwrap_err()
            .to_string();
        assert!(err.contains("character device"), "{err}");
        let err = check_path(&d.join("missing/x"), Kind::Any)
            .unwrap_err()
            .to_string();
        assert!(err.contains("not a directory"), "{err}");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn an_existing_file_is_replaced_only_by_its_own_kind() {
        let d = scratch("foreign");
        let source = d.join("serve.py");
        std::fs::write(&source, b"import time\n").unwrap();
        for kind in [Kind::Trace, Kind::Html, Kind::Perfetto] {
            let err = check_path(&source, kind).unwrap_err().to_string();
            assert!(err.contains("exists and is not"), "{err}");
            assert!(
                err.contains("remove it first or give another path"),
                "{err}"
            );
        }
        check_path(&source, Kind::Any).unwrap();
        // Empty, or what the tool writes: replaced.
        let empty = d.join("empty");
        std::fs::write(&empty, b"").unwrap();
        check_path(&empty, Kind::Trace).unwrap();
        let trace = d.join("rec.trace");
        std::fs::write(&trace, super::super::format::MAGIC).unwrap();
        check_path(&trace, Kind::Trace).unwrap();
        assert!(check_path(&trace, Kind::Html).is_err());
        let rec = crate::recording::testutil::recording(vec![], vec![]);
        let report = crate::analysis::analyze(&rec);
        let page = d.join("page.html");
        std::fs::write(&page, crate::render::html::render(&rec, &report)).unwrap();
        check_path(&page, Kind::Html).unwrap();
        assert!(check_path(&page, Kind::Perfetto).is_err());
        let pf = d.join("rec.pftrace");
        std::fs::write(&pf, crate::render::perfetto::render(&rec)).unwrap();
        check_path(&pf, Kind::Perfetto).unwrap();
        assert!(check_path(&pf, Kind::Trace).is_err());
        // Another HTML page is not ours.
        std::fs::write(&page, b"<!DOCTYPE html><html><body>mine</body></html>").unwrap();
        assert!(check_path(&page, Kind::Html).is_err());
        // Checked again at the rename: a file that appeared meanwhile stays.
        let tmp = d.join("x.tmp");
        std::fs::write(&tmp, b"new").unwrap();
        let err = rename_into_place(&tmp, &source, Kind::Trace)
            .unwrap_err()
            .to_string();
        assert!(err.contains("appeared while the tracer ran"), "{err}");
        assert_eq!(std::fs::read(&source).unwrap(), b"import time\n");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn the_same_file_twice_is_a_usage_error() {
        let d = scratch("twice");
        let a = d.join("x");
        let same = d.join(".").join("x");
        let err = check_all(&[("--output", &a), ("--html", &same)]).unwrap_err();
        assert!(
            matches!(err.downcast_ref(), Some(TracerError::Usage { .. })),
            "{err}"
        );
        let tmp = d.join("x.tmp");
        assert!(check_all(&[("--output", &a), ("--perfetto", &tmp)]).is_err());
        check_all(&[("--output", &a), ("--html", &d.join("y"))]).unwrap();
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_path_that_became_a_device_is_not_replaced() {
        let d = scratch("rename");
        let tmp = d.join("t");
        std::fs::write(&tmp, b"data").unwrap();
        let err = rename_into_place(&tmp, Path::new("/dev/null"), Kind::Any)
            .unwrap_err()
            .to_string();
        assert!(err.contains("was not replaced"), "{err}");
        assert!(tmp.exists(), "the output stays in its temporary file");
        let dst = d.join("final");
        rename_into_place(&tmp, &dst, Kind::Any).unwrap();
        assert_eq!(std::fs::read(&dst).unwrap(), b"data");
        let _ = std::fs::remove_dir_all(&d);
    }
}
