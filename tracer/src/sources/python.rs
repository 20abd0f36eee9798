//! CPython in the target's processes: whether a process runs it (its mapped libpython, or an
//! executable named python3.N), and where its USDT probes for garbage collection are.

use std::path::PathBuf;

use crate::recording::pauses::Python;

/// "3.11" from "libpython3.11.so.1.0", "python3.11", "libpython3.12d.so".
fn version_in(name: &str) -> Option<String> {
    let rest = name
        .strip_prefix("libpython")
        .or_else(|| name.strip_prefix("python"))?;
    let v: String = rest
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    let v = v.trim_end_matches('.');
    (v.starts_with('3') && v.contains('.')).then(|| v.to_string())
}

/// The CPython interpreter process `proc_pid` (its /proc number) runs: the libpython it maps
/// (the interpreter then lives there), else its executable when named python3.N (a statically
/// linked interpreter, as Debian's and pyenv's builds are). None for anything else.
pub fn detect(proc_pid: u32) -> Option<Python> {
    let maps = std::fs::read_to_string(format!("/proc/{proc_pid}/maps")).ok()?;
    for line in maps.lines() {
        let Some(path) = line.split_whitespace().nth(5) else {
            continue;
        };
        let name = path.rsplit('/').next().unwrap_or(path);
        if name.starts_with("libpython")
            && name.contains(".so")
            && let Some(version) = version_in(name)
        {
            return Some(Python {
                version,
                path: path.into(),
                how: format!("{name} mapped"),
            });
        }
    }
    let exe = std::fs::read_link(format!("/proc/{proc_pid}/exe")).ok()?;
    let name = exe.file_name()?.to_str()?;
    let version = version_in(name)?;
    Some(Python {
        version,
        path: exe.to_str()?.into(),
        how: format!("executable {name}"),
    })
}

/// The interpreter's file as this tool can open it: through the process's root, so a
/// container's file is found where the process sees it.
pub fn host_path(proc_pid: u32, p: &Python) -> PathBuf {
    PathBuf::from(format!("/proc/{proc_pid}/root{}", p.path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_come_from_the_file_names() {
        assert_eq!(version_in("libpython3.11.so.1.0").as_deref(), Some("3.11"));
        assert_eq!(version_in("python3.12").as_deref(), Some("3.12"));
        assert_eq!(version_in("libpython3.12d.so").as_deref(), Some("3.12"));
        assert_eq!(version_in("python3"), None);
        assert_eq!(version_in("pythonista"), None);
    }

    #[test]
    fn this_machines_python_is_found() {
        let mut child = std::process::Command::new("/usr/bin/python3")
            .args(["-c", "import time; time.sleep(5)"])
            .spawn()
            .expect("python3");
        std::thread::sleep(std::time::Duration::from_millis(300));
        let p = detect(child.id());
        child.kill().ok();
        child.wait().ok();
        let p = p.expect("a CPython process");
        assert!(p.version.starts_with("3."), "{p:?}");
    }
}
