//! The target's cgroup CPU bandwidth limit and throttling counters, on cgroup v2 (`cpu.max`,
//! `cpu.stat`) and v1 (`cpu.cfs_quota_us`, `cpu.cfs_period_us`, `cpu.stat`). Hosts differ: our
//! CPU machine is hybrid with the cpu controller on v1, the GPU machine pure v2.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use crate::recording::cgroup::{CgroupSample, CgroupVersion, CpuCgroup, CpuLimit, Throttling};

const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// cgroup v1's and v2's filesystem magics (include/uapi/linux/magic.h).
pub const CGROUP_SUPER_MAGIC: i64 = 0x0027_e0eb;
pub const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;

/// The magic of the file system `path` is on (statfs), if it can be read.
pub fn fs_magic(path: &Path) -> Option<i64> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: statfs fills the zeroed struct we own.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    (unsafe { libc::statfs(c.as_ptr(), &mut st) } == 0).then_some(st.f_type as i64)
}

pub fn version() -> CgroupVersion {
    if fs_magic(Path::new(CGROUP_ROOT)) == Some(CGROUP2_SUPER_MAGIC) {
        CgroupVersion::V2
    } else if Path::new(CGROUP_ROOT).join("unified").is_dir() {
        CgroupVersion::Hybrid
    } else {
        CgroupVersion::V1
    }
}

/// Parses `cpu.max` ("max 100000" or "50000 100000").
pub fn parse_cpu_max(s: &str) -> Option<(u64, u64)> {
    let mut it = s.split_whitespace();
    let quota = it.next()?;
    let period: u64 = it.next()?.parse().ok()?;
    if quota == "max" {
        return None;
    }
    Some((quota.parse().ok()?, period))
}

/// Parses `cpu.stat`; v2 reports `throttled_usec`, v1 `throttled_time` in ns.
pub fn parse_cpu_stat(s: &str) -> Throttling {
    let mut t = Throttling::default();
    for line in s.lines() {
        let mut it = line.split_whitespace();
        let (Some(k), Some(v)) = (it.next(), it.next().and_then(|v| v.parse::<u64>().ok())) else {
            continue;
        };
        match k {
            "nr_periods" => t.nr_periods = v,
            "nr_throttled" => t.nr_throttled = v,
            "throttled_usec" => t.throttled_ns = v * 1000,
            "throttled_time" => t.throttled_ns = v,
            _ => {}
        }
    }
    t
}

/// The cgroup path of `pid` for the cpu controller: the v2 line ("0::/x") on v2, else the v1
/// line that lists `cpu` among its controllers.
/// The CPU cgroup of `pid` ("/system.slice/x.service"): v2's, or the v1 cpu controller's.
pub fn cgroup_name(pid: u32) -> Option<String> {
    cgroup_of(pid, version()).map(|(_, name)| name)
}

fn cgroup_of(pid: u32, version: CgroupVersion) -> Option<(PathBuf, String)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let rel = path.trim_start_matches('/');
        match version {
            CgroupVersion::V2 if controllers.is_empty() => {
                return Some((Path::new(CGROUP_ROOT).join(rel), path.to_string()));
            }
            CgroupVersion::Hybrid | CgroupVersion::V1
                if controllers.split(',').any(|c| c == "cpu") =>
            {
                return Some((
                    Path::new(CGROUP_ROOT).join("cpu").join(rel),
                    path.to_string(),
                ));
            }
            _ => {}
        }
    }
    None
}

fn read(p: &Path) -> Option<String> {
    std::fs::read_to_string(p).ok()
}

/// The limit set directly on `dir`, if any.
fn limit_at(dir: &Path, version: CgroupVersion, name: &str) -> Option<CpuLimit> {
    let (quota, period) = match version {
        CgroupVersion::V2 => parse_cpu_max(&read(&dir.join("cpu.max"))?)?,
        _ => {
            let quota: i64 = read(&dir.join("cpu.cfs_quota_us"))?.trim().parse().ok()?;
            let period: u64 = read(&dir.join("cpu.cfs_period_us"))?.trim().parse().ok()?;
            if quota < 0 {
                return None;
            }
            (quota as u64, period)
        }
    };
    Some(CpuLimit {
        cgroup: name.to_string(),
        dir: dir.to_path_buf(),
        quota_us: quota,
        period_us: period,
        cpus: quota as f64 / period.max(1) as f64,
    })
}

/// Where the hierarchy holding the cpu controller is mounted.
pub fn cpu_root(version: CgroupVersion) -> PathBuf {
    match version {
        CgroupVersion::V2 => PathBuf::from(CGROUP_ROOT),
        _ => Path::new(CGROUP_ROOT).join("cpu"),
    }
}

/// The target's CPU cgroup, its limits (walking up to the root) and throttling counters.
pub fn cpu_cgroup(pid: u32) -> Option<CpuCgroup> {
    let version = version();
    let (path, name) = cgroup_of(pid, version)?;
    let root = cpu_root(version);
    let mut limits = Vec::new();
    let mut dir = path.clone();
    let mut cg = name.clone();
    loop {
        if let Some(l) = limit_at(&dir, version, &cg) {
            limits.push(l);
        }
        if dir == root || !dir.starts_with(&root) {
            break;
        }
        dir = match dir.parent() {
            Some(p) => p.to_path_buf(),
            None => break,
        };
        cg = match cg.rsplit_once('/') {
            Some((parent, _)) if !parent.is_empty() => parent.to_string(),
            _ => "/".to_string(),
        };
    }
    let throttling = read(&path.join("cpu.stat")).map(|s| parse_cpu_stat(&s));
    Some(CpuCgroup {
        version,
        path,
        name,
        limits,
        throttling,
    })
}

/// Where the v2 (unified) hierarchy is mounted: the root on v2, `unified` beside v1's
/// controllers on a hybrid host. `bpf_get_current_cgroup_id` gives a task's cgroup there.
pub fn unified_root() -> Option<PathBuf> {
    match version() {
        CgroupVersion::V2 => Some(PathBuf::from(CGROUP_ROOT)),
        CgroupVersion::Hybrid => Some(Path::new(CGROUP_ROOT).join("unified")),
        CgroupVersion::V1 => None,
    }
}

/// The v2 cgroup of `pid` ("/user.slice/..."), from the "0::" line of /proc/PID/cgroup.
pub fn cgroup2_of(pid: u32) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(str::to_string)
}

/// The paths of the v2 cgroups with these ids: a cgroup's id is its directory's inode
/// (kernfs), so the hierarchy is walked once and each directory's inode looked up. At most
/// `MAX_CGROUP_DIRS` directories are visited.
pub fn cgroup2_paths(ids: &BTreeSet<u64>) -> BTreeMap<u64, String> {
    use std::os::unix::fs::MetadataExt as _;
    const MAX_CGROUP_DIRS: usize = 100_000;
    let mut out = BTreeMap::new();
    let Some(root) = unified_root() else {
        return out;
    };
    let mut stack = vec![root.clone()];
    let mut seen = 0;
    while let Some(dir) = stack.pop() {
        seen += 1;
        if seen > MAX_CGROUP_DIRS || out.len() == ids.len() {
            break;
        }
        if let Ok(m) = std::fs::metadata(&dir)
            && ids.contains(&m.ino())
        {
            let rel = dir.strip_prefix(&root).unwrap_or(&dir);
            out.insert(m.ino(), format!("/{}", rel.display()));
        }
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        stack.extend(
            entries
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path()),
        );
    }
    out
}

/// Reads the `cpu.stat` of the target's cgroup and of each limited ancestor on demand: the
/// throttling series of a recording.
pub struct ThrottleProbe {
    stat: StatFile,
    limited: Vec<StatFile>,
    pub cgroup: CpuCgroup,
}

/// A `cpu.stat` kept open and read from its start at each sample: one system call at every
/// tick of a recording that may run for days, where opening it by its path took six (the
/// lookup, a size probe, three reads and the close), and cold, 0.1-0.3 ms a tick on a VM. A
/// cgroup removed since reads as an error, as its path would (ENODEV).
struct StatFile {
    path: PathBuf,
    file: Option<std::fs::File>,
}

impl StatFile {
    fn open(path: PathBuf) -> Self {
        let file = std::fs::File::open(&path).ok();
        Self { path, file }
    }

    fn read(&self) -> Option<Throttling> {
        use std::os::unix::fs::FileExt as _;
        // cpu.stat is a few hundred bytes (v2 adds usage and burst lines): a read from the
        // start that fills the buffer is retried by path, whole, rather than cut short.
        let mut buf = [0u8; 4096];
        let n = self.file.as_ref()?.read_at(&mut buf, 0).ok()?;
        if n == buf.len() {
            return read(&self.path).map(|s| parse_cpu_stat(&s));
        }
        Some(parse_cpu_stat(std::str::from_utf8(&buf[..n]).ok()?))
    }
}

impl ThrottleProbe {
    pub fn new(pid: u32) -> Option<Self> {
        let cgroup = cpu_cgroup(pid)?;
        let stat = StatFile::open(cgroup.path.join("cpu.stat"));
        stat.file.as_ref()?;
        let limited = cgroup
            .limits
            .iter()
            .map(|l| StatFile::open(l.dir.join("cpu.stat")))
            .collect();
        Some(Self {
            stat,
            limited,
            cgroup,
        })
    }

    pub fn sample(&self, t_ns: u64) -> Option<CgroupSample> {
        Some(CgroupSample {
            t_ns,
            throttling: self.stat.read()?,
            // A cgroup that went away reads as never throttled.
            limited: self
                .limited
                .iter()
                .map(|f| f.read().unwrap_or_default())
                .collect(),
        })
    }
}

/// One `ThrottleProbe` per distinct cgroup of the members, the first member's first, with the
/// members in each.
pub struct ThrottleSet(pub Vec<(ThrottleProbe, Vec<u32>)>);

impl ThrottleSet {
    /// `pids`: the members, as this tool's /proc numbers them, and as the kernel does.
    pub fn new(pids: &[(u32, u32)]) -> Self {
        let mut set: Vec<(ThrottleProbe, Vec<u32>)> = Vec::new();
        for &(proc_pid, pid) in pids {
            let Some(p) = ThrottleProbe::new(proc_pid) else {
                continue;
            };
            match set.iter_mut().find(|(q, _)| q.cgroup.path == p.cgroup.path) {
                Some((_, members)) => members.push(pid),
                None => set.push((p, vec![pid])),
            }
        }
        Self(set)
    }

    /// The first member's cgroup, which the trace file streams for recovery.
    pub fn first(&self) -> Option<&ThrottleProbe> {
        self.0.first().map(|(p, _)| p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cpu_max_and_stat_of_both_versions() {
        assert_eq!(parse_cpu_max("max 100000\n"), None);
        assert_eq!(parse_cpu_max("50000 100000\n"), Some((50_000, 100_000)));
        let v2 = "usage_usec 10\nnr_periods 7\nnr_throttled 3\nthrottled_usec 1500\n";
        assert_eq!(
            parse_cpu_stat(v2),
            Throttling {
                nr_periods: 7,
                nr_throttled: 3,
                throttled_ns: 1_500_000
            }
        );
        let v1 = "nr_periods 7\nnr_throttled 3\nthrottled_time 1500\n";
        assert_eq!(parse_cpu_stat(v1).throttled_ns, 1500);
    }

    #[test]
    fn finds_this_process_cgroup() {
        let cg = cpu_cgroup(std::process::id()).expect("every process has a cpu cgroup");
        assert!(cg.path.is_dir(), "{}", cg.path.display());
        assert_eq!(cg.version, version());
    }
}
