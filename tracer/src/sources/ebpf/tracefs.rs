//! The classic tracepoints' record offsets, from the tracefs `format` files (for the fallback
//! where tp_btf cannot be used), and tracefs itself: found, mounted if it is not, or said to be
//! unreadable with the capability to add.

use std::{
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result, anyhow, bail};
use tracer_common::Config;

/// One field of a classic tracepoint record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field {
    pub offset: u32,
    pub size: u32,
}

/// Parses a tracefs `format` file and returns the field named `name`.
pub fn format_field(format: &str, name: &str) -> Option<Field> {
    format.lines().find_map(|line| {
        let line = line.trim();
        let decl = line.strip_prefix("field:")?.split(';').next()?;
        // "char prev_comm[16]" / "pid_t prev_pid": the name is the last word, minus any array.
        let field_name = decl.split_whitespace().last()?.split('[').next()?;
        if field_name != name {
            return None;
        }
        let value = |key: &str| -> Option<u32> {
            line.split(';')
                .find_map(|part| part.trim().strip_prefix(key))
                .and_then(|v| v.trim().parse().ok())
        };
        Some(Field {
            offset: value("offset:")?,
            size: value("size:")?,
        })
    })
}

/// tracefs as this process finds it.
#[derive(Debug)]
pub enum Tracefs {
    /// Mounted, its event formats readable.
    At(PathBuf),
    /// Mounted (/proc/self/mounts says so) but not readable by this user: recent kernels
    /// make tracefs root's, mode 0700, and CAP_BPF with CAP_PERFMON does not open it.
    Unreadable {
        at: PathBuf,
        error: String,
    },
    NotMounted,
}

impl Tracefs {
    /// What is wrong, in words, and what to do; None when it is usable.
    pub fn problem(&self) -> Option<String> {
        match self {
            Tracefs::At(_) => None,
            Tracefs::Unreadable { at, error } => Some(format!(
                "mounted at {} but not readable by this user ({error}): run as root, or add \
                 CAP_DAC_READ_SEARCH to CAP_BPF and CAP_PERFMON",
                at.display()
            )),
            Tracefs::NotMounted => Some(
                "not mounted (the tracer mounts it itself as root, or: mount -t tracefs nodev \
                 /sys/kernel/tracing)"
                    .into(),
            ),
        }
    }
}

/// The mount points of tracefs in this mount namespace.
fn tracefs_mounts() -> Vec<PathBuf> {
    let mounts = fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split(' ');
            let (point, kind) = (f.nth(1)?, f.next()?);
            // Octal escapes (\040 for a space) are left as they are: such a mount point is
            // only looked at, never parsed further.
            (kind == "tracefs").then(|| PathBuf::from(point))
        })
        .collect()
}

/// Where tracefs is: the usual places first, then anywhere /proc/self/mounts shows it. A
/// place that cannot be read is "unreadable" only where tracefs is mounted there: a
/// not-mounted /sys/kernel/debug/tracing inside a 0700 debugfs is refused just the same.
pub fn find_tracefs() -> Tracefs {
    let mounted = tracefs_mounts();
    let mut candidates: Vec<PathBuf> = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"]
        .into_iter()
        .map(PathBuf::from)
        .collect();
    for m in &mounted {
        if !candidates.contains(m) {
            candidates.push(m.clone());
        }
    }
    let mut unreadable = None;
    for p in candidates {
        match fs::metadata(p.join("events")) {
            Ok(m) if m.is_dir() => return Tracefs::At(p),
            Ok(_) => {}
            Err(e) if mounted.contains(&p) && unreadable.is_none() => {
                unreadable = Some(Tracefs::Unreadable {
                    at: p,
                    error: e.to_string(),
                });
            }
            Err(_) => {}
        }
    }
    unreadable.unwrap_or(Tracefs::NotMounted)
}

/// Mounts tracefs at /sys/kernel/tracing (needs CAP_SYS_ADMIN).
pub fn mount_tracefs() -> Result<PathBuf> {
    let target = c"/sys/kernel/tracing";
    // SAFETY: all pointers are valid NUL-terminated strings; data may be null for tracefs.
    let rc = unsafe {
        libc::mount(
            c"nodev".as_ptr(),
            target.as_ptr(),
            c"tracefs".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        bail!(
            "mount -t tracefs nodev /sys/kernel/tracing failed: {}",
            std::io::Error::last_os_error()
        );
    }
    match find_tracefs() {
        Tracefs::At(root) => Ok(root),
        other => bail!(
            "tracefs mounted, but {}",
            other.problem().unwrap_or_default()
        ),
    }
}

/// Fills the classic-tracepoint offsets of `config` from the format files under `tracefs`.
pub fn apply_classic_formats(tracefs: &Path, config: &mut Config) -> Result<()> {
    let read = |event: &str| -> Result<String> {
        let path = tracefs.join("events").join(event).join("format");
        fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))
    };
    let need = |format: &str, event: &str, field: &str| -> Result<Field> {
        format_field(format, field).ok_or_else(|| anyhow!("{event} has no field {field}"))
    };
    let switch = read("sched/sched_switch")?;
    let prev_state = need(&switch, "sched_switch", "prev_state")?;
    config.switch_prev_state_off = prev_state.offset;
    config.switch_prev_state_size = prev_state.size;
    config.switch_next_pid_off = need(&switch, "sched_switch", "next_pid")?.offset;
    config.switch_next_comm_off = need(&switch, "sched_switch", "next_comm")?.offset;

    let wakeup = read("sched/sched_wakeup")?;
    config.wakeup_pid_off = need(&wakeup, "sched_wakeup", "pid")?.offset;
    config.wakeup_cpu_off = need(&wakeup, "sched_wakeup", "target_cpu")?.offset;
    config.wakeup_comm_off = need(&wakeup, "sched_wakeup", "comm")?.offset;
    // sched_wakeup_new shares the sched_wakeup_template record (include/trace/events/sched.h).
    let wakeup_new = read("sched/sched_wakeup_new")?;
    if format_field(&wakeup_new, "pid") != format_field(&wakeup, "pid") {
        bail!("sched_wakeup_new and sched_wakeup records differ; classic fallback unsupported");
    }

    let migrate = read("sched/sched_migrate_task")?;
    config.migrate_pid_off = need(&migrate, "sched_migrate_task", "pid")?.offset;
    config.migrate_orig_cpu_off = need(&migrate, "sched_migrate_task", "orig_cpu")?.offset;
    config.migrate_dest_cpu_off = need(&migrate, "sched_migrate_task", "dest_cpu")?.offset;

    let exec = read("sched/sched_process_exec")?;
    config.exec_pid_off = need(&exec, "sched_process_exec", "pid")?.offset;
    config.exec_old_pid_off = need(&exec, "sched_process_exec", "old_pid")?.offset;

    let newtask = read("task/task_newtask")?;
    config.newtask_pid_off = need(&newtask, "task_newtask", "pid")?.offset;
    config.newtask_comm_off = need(&newtask, "task_newtask", "comm")?.offset;
    let flags = need(&newtask, "task_newtask", "clone_flags")?;
    if flags.size != 8 {
        bail!(
            "task_newtask clone_flags is {} bytes, expected 8",
            flags.size
        );
    }
    config.newtask_flags_off = flags.offset;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    // A format file as Linux 6.18 prints it (trimmed).
    const SWITCH: &str = "name: sched_switch
ID: 322
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:char prev_comm[16];\toffset:8;\tsize:16;\tsigned:0;
\tfield:pid_t prev_pid;\toffset:24;\tsize:4;\tsigned:1;
\tfield:long prev_state;\toffset:32;\tsize:8;\tsigned:1;
\tfield:char next_comm[16];\toffset:40;\tsize:16;\tsigned:0;
\tfield:pid_t next_pid;\toffset:56;\tsize:4;\tsigned:1;
";

    #[test]
    fn parses_fields_and_arrays() {
        assert_eq!(
            format_field(SWITCH, "prev_state"),
            Some(Field {
                offset: 32,
                size: 8
            })
        );
        assert_eq!(
            format_field(SWITCH, "next_comm"),
            Some(Field {
                offset: 40,
                size: 16
            })
        );
        assert_eq!(
            format_field(SWITCH, "next_pid"),
            Some(Field {
                offset: 56,
                size: 4
            })
        );
        // A prefix of a real name is not a match.
        assert_eq!(format_field(SWITCH, "next"), None);
        assert_eq!(format_field(SWITCH, "pid"), None);
    }
}
