//! Attaching the CUDA uprobes to the libcuda.so a running target has mapped: no restart, no
//! injection, no environment variable. The library is found in /proc/PID/maps and opened
//! through /proc/PID/root, so a target in another mount namespace (a container) works too.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use aya::{
    Ebpf,
    programs::{
        UProbe,
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeLink, UProbeScope},
    },
};
use tracer_common::CudaFn;

use super::elf;
use crate::recording::Capability;

/// The first mapped library of `pid` whose file name starts with `prefix`, as a path this
/// process can open, and as the target sees it.
pub(super) fn find_library(pid: u32, prefix: &str) -> Option<(PathBuf, String)> {
    let [found] = find_libraries(pid, [prefix]);
    found
}

/// `find_library` for several prefixes from one reading of the maps, which a large server's
/// are (a PyTorch process maps thousands of files) and which are polled every second.
fn find_libraries<const N: usize>(pid: u32, prefixes: [&str; N]) -> [Option<(PathBuf, String)>; N] {
    let mut found = [const { None }; N];
    let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else {
        return found;
    };
    for path in maps.lines().filter_map(|l| l.split_whitespace().nth(5)) {
        let Some(name) = Path::new(path).file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        for (prefix, slot) in prefixes.iter().zip(found.iter_mut()) {
            if slot.is_none() && name.starts_with(prefix) {
                *slot = Some((
                    PathBuf::from(format!("/proc/{pid}/root{path}")),
                    path.to_string(),
                ));
            }
        }
    }
    found
}

/// The size of `pid`'s executable mappings but its program's text (`VmLib`, kB: the libraries'
/// code, and any JIT code), which mapping a library raises.
fn mapped_code_kb(pid: u32) -> Option<u64> {
    procfs::process::Process::new(pid as i32)
        .ok()?
        .status()
        .ok()?
        .vmlib
}

/// The libcuda.so mapped by `pid` (opened path, path as the target sees it).
pub fn find_libcuda(pid: u32) -> Option<(PathBuf, String)> {
    find_library(pid, "libcuda.so")
}

/// The host's libcuda.so.1, as the dynamic linker finds it: the library a member that
/// initializes CUDA during the window will map (in this tool's mount namespace).
fn host_libcuda() -> Option<(PathBuf, String)> {
    let cache = std::process::Command::new("ldconfig")
        .arg("-p")
        .output()
        .ok();
    let listed = cache.and_then(|o| {
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter(|l| l.trim_start().starts_with("libcuda.so.1 "))
            .filter_map(|l| l.rsplit("=> ").next().map(|p| p.trim().to_string()))
            .find(|p| Path::new(p).exists())
    });
    let known = [
        "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
        "/usr/lib64/libcuda.so.1",
        "/usr/local/nvidia/lib64/libcuda.so.1",
    ];
    listed
        .or_else(|| {
            known
                .iter()
                .find(|p| Path::new(p).exists())
                .map(|p| p.to_string())
        })
        .map(|p| (PathBuf::from(&p), p))
}

/// A library file, known by device and inode: the same file through a symlink, another mount
/// namespace or another member is probed once.
type FileId = (u64, u64);

fn file_id(path: &Path) -> Option<FileId> {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// The CUDA probes attached so far, and the files they are on.
#[derive(Default)]
pub struct CudaProbes {
    pub links: Vec<UProbeLink>,
    /// The functions probed (the others are absent from the libraries).
    pub functions: Vec<CudaFn>,
    files: Vec<FileId>,
    /// Each file probed, in words: "PATH (function, ...)".
    seen: Vec<String>,
    /// Members whose libcuda is probed: their maps need no more reading.
    done: std::collections::BTreeSet<u32>,
    /// Each member's executable mappings but its program's (`VmLib`, kB) when its maps were
    /// last read: they are read again only when that changed, as a library mapped since
    /// changes it (and so does JIT code, which only costs a reading).
    code_kb: std::collections::BTreeMap<u32, u64>,
    /// Why the probes cover what they cover, beyond the files listed.
    note: String,
}

impl CudaProbes {
    /// Attaches to every `CudaFn` the file exports (`is_runtime`: libcudart's), unless the
    /// file is probed already. Returns whether it was new.
    fn attach_file(
        &mut self,
        ebpf: &mut Ebpf,
        path: &Path,
        shown: &str,
        is_runtime: bool,
    ) -> Result<bool> {
        let Some(id) = file_id(path) else {
            return Ok(false);
        };
        if self.files.contains(&id) {
            return Ok(false);
        }
        self.files.push(id);
        let wanted: Vec<CudaFn> = CudaFn::ALL
            .into_iter()
            .filter(|f| f.runtime() == is_runtime)
            .collect();
        let names: Vec<&str> = wanted.iter().map(|f| f.symbol()).collect();
        let offsets = elf::symbol_offsets(path, &names)?;
        let mut probed = Vec::new();
        for f in wanted {
            let Some(&offset) = offsets.get(f.symbol()) else {
                continue;
            };
            let enter = entry_program(f);
            // The return probe first: a call entered between the two attachments then has
            // its return seen and its entry not, which the return program ignores; the other
            // way round its return would go unseen, and the thread's calls with it until the
            // entry program notices (tracer-common `CudaThread::sync_sp`).
            let mut probes = vec![];
            if f.synchronizes() {
                probes.push("cuda_call_exit");
            }
            probes.push(enter.as_str());
            for name in probes {
                let prog: &mut UProbe = ebpf
                    .program_mut(name)
                    .with_context(|| format!("program {name}"))?
                    .try_into()?;
                let point = UProbeAttachPoint {
                    location: UProbeAttachLocation::AbsoluteOffset(offset),
                    cookie: None,
                };
                let id = prog
                    .attach(point, path, UProbeScope::AllProcesses)
                    .with_context(|| format!("uprobe on {shown}:{}", f.symbol()))?;
                self.links.push(prog.take_link(id)?);
            }
            if !self.functions.contains(&f) {
                self.functions.push(f);
            }
            probed.push(f.symbol());
        }
        self.seen.push(format!("{shown} ({})", probed.join(", ")));
        Ok(true)
    }

    /// Probes the CUDA libraries members `pids` (this tool's numbering) have mapped that are
    /// not probed yet: a member that initializes CUDA during the window, from a runtime of
    /// its own (a Python environment's libcudart), is covered from then on. Returns what was
    /// added, in words.
    pub fn add_mapped(&mut self, ebpf: &mut Ebpf, pids: &[u32]) -> Result<Vec<String>> {
        let mut added = Vec::new();
        // Only the PIDs polled now: a watch of a server that forks for days would keep every
        // child's, and a PID reused would start from another process's.
        self.code_kb.retain(|pid, _| pids.contains(pid));
        for &pid in pids {
            if self.done.contains(&pid) {
                continue;
            }
            // Polled every second, and a large server's maps are thousands of lines, read
            // under its memory map's lock; /proc/PID/status is a few counters.
            let code = mapped_code_kb(pid);
            if code.is_some() && self.code_kb.get(&pid) == code.as_ref() {
                continue;
            }
            if let Some(kb) = code {
                self.code_kb.insert(pid, kb);
            }
            let [runtime, driver] = find_libraries(pid, ["libcudart.so", "libcuda.so"]);
            let mapped_driver = driver.is_some();
            for (lib, is_runtime) in [(runtime, true), (driver, false)] {
                let Some((path, shown)) = lib else { continue };
                if self.attach_file(ebpf, &path, &shown, is_runtime)? {
                    added.push(format!("{shown} (mapped by PID {pid})"));
                }
            }
            // The runtime loads the driver: with the driver mapped, both are in.
            if mapped_driver {
                self.done.insert(pid);
            }
        }
        Ok(added)
    }

    /// What the probes measure, or why they do not.
    pub fn capability(&self) -> Capability {
        if self.seen.is_empty() {
            return Capability {
                available: false,
                reason: self.note.clone(),
            };
        }
        let available = self.functions.iter().any(|f| f.synchronizes());
        Capability {
            available,
            reason: match available {
                true => format!("uprobes on {}{}", self.seen.join("; "), self.note),
                false => format!(
                    "no synchronizing CUDA call exported by {}",
                    self.seen.join("; ")
                ),
            },
        }
    }
}

/// The entry program of function `f`: one per function, since attach cookies (which could
/// tell one program which function it was entered from) exist only from Linux 5.15.
fn entry_program(f: CudaFn) -> String {
    format!("cuda_enter_{}", f as u32)
}

/// Every CUDA program: the entries, then the return probe.
pub fn program_names() -> Vec<String> {
    let mut names: Vec<String> = CudaFn::ALL.into_iter().map(entry_program).collect();
    names.push("cuda_call_exit".into());
    names
}

/// Loads the CUDA programs and attaches them to every function in `CudaFn` that libcuda
/// (driver API) or libcudart (runtime API) exports (the return probe on the synchronizing
/// ones), in each distinct library file the members (`pids`, this tool's numbering) have
/// mapped. Probes fire for any process using the files (a per-process uprobe would only
/// follow the thread it was opened on); the programs keep the target set's threads only, so
/// a member that maps the same file later is covered. With no member on CUDA yet, the host's
/// libcuda is probed, for one that initializes it during the window (`add_mapped` adds the
/// runtime it brings).
pub fn attach(ebpf: &mut Ebpf, pids: &[u32]) -> Result<CudaProbes> {
    for name in &program_names() {
        let prog: &mut UProbe = ebpf
            .program_mut(name)
            .with_context(|| format!("program {name}"))?
            .try_into()?;
        prog.load().with_context(|| format!("loading {name}"))?;
    }
    let mut probes = CudaProbes::default();
    probes.add_mapped(ebpf, pids)?;
    if probes.seen.is_empty() {
        match host_libcuda() {
            Some((path, shown)) => {
                probes.attach_file(ebpf, &path, &shown, false)?;
                probes.note = format!(
                    "; no member had initialized CUDA yet ({}): the host's library is probed, \
                     and a runtime library a member maps in the window is added when it does",
                    members_named(pids)
                );
            }
            None => {
                probes.note = format!(
                    "libcuda.so is not mapped in {}, and the host has none (ldconfig -p): GPU \
                     waits are not measured",
                    members_named(pids)
                );
            }
        }
    }
    Ok(probes)
}

/// "PID 12", "any of PIDs 12, 13, 14".
fn members_named(pids: &[u32]) -> String {
    match pids {
        [one] => format!("PID {one}"),
        many => format!(
            "any of PIDs {}",
            many.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_reading_of_the_maps_finds_each_library_and_the_code_size_moves_with_a_mapping() {
        let me = std::process::id();
        let [libc, none] = find_libraries(me, ["libc.so", "libnot-mapped-anywhere"]);
        let (opened, shown) = libc.expect("the test binary maps libc");
        assert!(shown.contains("libc.so") && opened.starts_with(format!("/proc/{me}/root")));
        assert_eq!(none, None);
        assert_eq!(find_library(me, "libc.so").map(|l| l.1), Some(shown));
        // An executable mapping of a file, as the dynamic linker makes for a library, raises
        // VmLib: the gate that keeps the maps from being read every second.
        let before = mapped_code_kb(me).expect("VmLib");
        let file = std::fs::File::open(std::env::current_exe().unwrap()).unwrap();
        let len = 4 << 20;
        // SAFETY: a fresh private read-only mapping of a file this process opened, unmapped
        // below; nothing reads it.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_EXEC,
                libc::MAP_PRIVATE,
                std::os::fd::AsRawFd::as_raw_fd(&file),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        let after = mapped_code_kb(me).expect("VmLib");
        // SAFETY: the mapping made above, of that length.
        unsafe { libc::munmap(p, len) };
        assert!(
            after >= before + 4096 - 64,
            "VmLib {before} kB -> {after} kB"
        );
    }
}
