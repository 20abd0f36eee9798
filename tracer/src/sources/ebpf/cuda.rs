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
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|path| {
            Path::new(path)
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(prefix))
        })
        .map(|path| {
            (
                PathBuf::from(format!("/proc/{pid}/root{path}")),
                path.to_string(),
            )
        })
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
        for &pid in pids {
            if self.done.contains(&pid) {
                continue;
            }
            let runtime = find_library(pid, "libcudart.so");
            let driver = find_libcuda(pid);
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
