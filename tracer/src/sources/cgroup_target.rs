//! `--cgroup PATH`: a cgroup and its descendants as the target set, as a container, a systemd
//! unit or a Kubernetes pod is traced. The path is a cgroup v2 directory or a v1 one (any
//! hierarchy: the cpu controller's, systemd's), absolute or relative to a cgroup mount. Each
//! cgroup is known to the kernel by its id, its directory's inode number (kernfs), within its
//! hierarchy (v1 hierarchies number their cgroups apart; the unified one is hierarchy 0).

use std::{
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
};

use super::cgroup::{CGROUP_SUPER_MAGIC, CGROUP2_SUPER_MAGIC, fs_magic};
use crate::error::TracerError;

#[derive(Debug, Clone)]
pub struct CgroupTarget {
    /// The directory, as this tool opens it.
    pub dir: PathBuf,
    /// As the user gave it.
    pub given: String,
    /// The hierarchy's id (0: the unified, v2 one).
    pub hierarchy: u32,
}

/// A cgroup file system mounted here: its mount point and, for v1, its controllers (or
/// `name=...`).
struct Mount {
    at: PathBuf,
    v2: bool,
    options: Vec<String>,
}

fn mounts() -> Vec<Mount> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            // ID PARENT MAJ:MIN ROOT POINT OPTIONS [TAGS...] - FSTYPE SOURCE SUPER_OPTIONS
            let (left, right) = l.split_once(" - ")?;
            let at = left.split_whitespace().nth(4)?;
            let mut r = right.split_whitespace();
            let fstype = r.next()?;
            let options = r.nth(1).unwrap_or("");
            matches!(fstype, "cgroup" | "cgroup2").then(|| Mount {
                at: PathBuf::from(at.replace("\\040", " ")),
                v2: fstype == "cgroup2",
                options: options.split(',').map(str::to_string).collect(),
            })
        })
        .collect()
}

/// The hierarchy id of the v1 mount with these options, from /proc/self/cgroup
/// ("ID:CONTROLLERS:PATH"): the controllers (or `name=...`) are the same set.
fn hierarchy_of(m: &Mount) -> Option<u32> {
    if m.v2 {
        return Some(0);
    }
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    text.lines().find_map(|l| {
        let mut it = l.splitn(3, ':');
        let id: u32 = it.next()?.parse().ok()?;
        let controllers = it.next()?;
        let all = controllers
            .split(',')
            .all(|c| !c.is_empty() && m.options.iter().any(|o| o == c));
        all.then_some(id)
    })
}

/// Finds the cgroup `given` names, or says why it is not one.
pub fn resolve(given: &str) -> Result<CgroupTarget, TracerError> {
    // An empty path (an unset shell variable, `--cgroup "$CG"`) would name the root: the whole
    // host, which nobody asks for by accident.
    if given.trim().is_empty() {
        return Err(TracerError::Usage {
            message: "--cgroup: the path is empty; give a cgroup directory (to record every \
                      process on the host, give / itself)"
                .into(),
        });
    }
    let all = mounts();
    let rel = given.trim_start_matches('/');
    // As given (absolute), then under the unified mount, then under the cpu controller's.
    let mut candidates: Vec<PathBuf> = Vec::new();
    if given.starts_with('/') {
        candidates.push(PathBuf::from(given));
    }
    let cpu = |m: &&Mount| !m.v2 && m.options.iter().any(|o| o == "cpu");
    for m in all.iter().filter(|m| m.v2).chain(all.iter().filter(cpu)) {
        candidates.push(m.at.join(rel));
    }
    let is_cgroup = |d: &Path| {
        matches!(fs_magic(d), Some(CGROUP_SUPER_MAGIC | CGROUP2_SUPER_MAGIC))
            && d.join("cgroup.procs").exists()
    };
    let dir = match candidates.iter().find(|c| c.is_dir() && is_cgroup(c)) {
        Some(d) => d.canonicalize().unwrap_or_else(|_| d.clone()),
        None => {
            let looked: Vec<String> = candidates.iter().map(|c| c.display().to_string()).collect();
            let message = match candidates.iter().find(|c| c.exists()) {
                Some(d) => format!(
                    "{} is not a cgroup (not a directory on a cgroup file system with a \
                     cgroup.procs): give a directory under {}",
                    d.display(),
                    all.first()
                        .map_or("/sys/fs/cgroup".into(), |m| m.at.display().to_string())
                ),
                None => format!(
                    "cgroup {given} does not exist (looked for {}): give a cgroup directory, \
                     e.g. /sys/fs/cgroup/system.slice/NAME.service, or a path relative to the \
                     cgroup mount (see /proc/PID/cgroup for a process's)",
                    looked.join(", ")
                ),
            };
            return Err(TracerError::Usage { message });
        }
    };
    let mount = all
        .iter()
        .filter(|m| dir.starts_with(&m.at))
        .max_by_key(|m| m.at.as_os_str().len());
    let hierarchy = mount
        .and_then(hierarchy_of)
        .ok_or_else(|| TracerError::Usage {
            message: format!(
                "{}: its cgroup hierarchy is not in /proc/self/cgroup, so processes moved into it \
             cannot be told apart from other hierarchies'",
                dir.display()
            ),
        })?;
    Ok(CgroupTarget {
        dir,
        given: given.to_string(),
        hierarchy,
    })
}

impl CgroupTarget {
    /// The cgroup and its descendants now.
    pub fn dirs(&self) -> Vec<PathBuf> {
        let mut out = vec![self.dir.clone()];
        let mut i = 0;
        while i < out.len() {
            if let Ok(rd) = std::fs::read_dir(&out[i]) {
                let mut subs: Vec<PathBuf> = rd
                    .flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path())
                    .collect();
                subs.sort();
                out.extend(subs);
            }
            i += 1;
        }
        out
    }

    /// The kernel's ids of `dirs`, with the hierarchy's.
    pub fn ids(&self, dirs: &[PathBuf]) -> Vec<(u64, u32)> {
        dirs.iter()
            .filter_map(|d| std::fs::metadata(d).ok())
            .map(|m| (m.ino(), self.hierarchy))
            .collect()
    }

    /// The processes in `dirs` (each once).
    pub fn pids(dirs: &[PathBuf]) -> Vec<u32> {
        let mut out: Vec<u32> = dirs
            .iter()
            .filter_map(|d| std::fs::read_to_string(d.join("cgroup.procs")).ok())
            .flat_map(|t| {
                t.lines()
                    .filter_map(|l| l.trim().parse().ok())
                    .collect::<Vec<u32>>()
            })
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_root_resolves_relative_to_the_mount_and_holds_this_process() {
        // Every host here mounts the unified hierarchy or the cpu controller's.
        let t = resolve("/").expect("the cgroup root");
        let dirs = t.dirs();
        assert_eq!(dirs[0], t.dir);
        assert_eq!(t.ids(&dirs).len(), dirs.len());
        let me = std::process::id();
        assert!(CgroupTarget::pids(&dirs).contains(&me));
        // The same directory given absolutely.
        let again = resolve(&t.dir.display().to_string()).unwrap();
        assert_eq!((again.dir, again.hierarchy), (t.dir, t.hierarchy));
    }

    #[test]
    fn a_path_that_is_not_a_cgroup_says_so() {
        let e = resolve("/tmp").unwrap_err().to_string();
        assert!(e.contains("is not a cgroup"), "{e}");
        let e = resolve("/no/such/cgroup-here").unwrap_err().to_string();
        assert!(e.contains("does not exist"), "{e}");
    }
}
