//! USDT probes (SystemTap SDT notes) of CPython's garbage collector, `python:gc__start` and
//! `python:gc__done`: found in the interpreter's `.note.stapsdt` notes, attached as uprobes at
//! their addresses, their argument's place passed in the attach cookie. CPython guards each
//! probe with a semaphore, a counter in its data that the probe site tests: the probe only
//! fires while it is non-zero, so it is raised in each traced process (through
//! /proc/PID/mem, as the kernel's own uprobe reference counter would, which aya does not set)
//! and lowered again when the probes are detached.

use std::{
    fs::{File, OpenOptions},
    os::unix::fs::FileExt as _,
    path::Path,
};

use anyhow::{Context as _, Result, anyhow, bail};
use aya::{
    Ebpf,
    programs::{
        UProbe,
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeLink, UProbeScope},
    },
};
use object::{Object as _, ObjectSection as _, ObjectSegment as _};
use tracer_common::{GC_ARG_NONE, GC_DONE, GC_START, gc_cookie};

/// One SDT probe: its file offset (for the uprobe), its semaphore's link-time address (0:
/// none), and its first argument's spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SdtProbe {
    pub name: String,
    pub offset: u64,
    pub semaphore: u64,
    pub arg: String,
}

/// `python` provider probes named `names` in the ELF file at `path`.
pub fn find(path: &Path, names: &[&str]) -> Result<Vec<SdtProbe>> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    // SAFETY: read-only, private mapping; a file replaced underneath only fails the parse.
    let map = unsafe { memmap2::Mmap::map(&file) }?;
    let obj = object::File::parse(&*map).with_context(|| format!("parsing {}", path.display()))?;
    let notes = obj
        .section_by_name(".note.stapsdt")
        .ok_or_else(|| anyhow!("{} has no USDT notes (.note.stapsdt)", path.display()))?;
    let data = notes.data()?;
    // Prelinking moves the code: the notes' base says where .stapsdt.base was at link time.
    let base = obj.section_by_name(".stapsdt.base").map(|s| s.address());
    let mut out = Vec::new();
    let mut at = 0usize;
    let u32_at = |d: &[u8], i: usize| -> Option<u32> {
        Some(u32::from_le_bytes(d.get(i..i + 4)?.try_into().ok()?))
    };
    let u64_at = |d: &[u8], i: usize| -> Option<u64> {
        Some(u64::from_le_bytes(d.get(i..i + 8)?.try_into().ok()?))
    };
    while let (Some(namesz), Some(descsz)) = (u32_at(data, at), u32_at(data, at + 4)) {
        let (namesz, descsz) = (namesz as usize, descsz as usize);
        let desc_at = at + 12 + namesz.next_multiple_of(4);
        let next = desc_at + descsz.next_multiple_of(4);
        let desc = data.get(desc_at..desc_at + descsz).unwrap_or(&[]);
        at = next;
        let (Some(pc), Some(link_base), Some(sem)) =
            (u64_at(desc, 0), u64_at(desc, 8), u64_at(desc, 16))
        else {
            continue;
        };
        let mut strings = desc.get(24..).unwrap_or(&[]).split(|&b| b == 0);
        let provider = String::from_utf8_lossy(strings.next().unwrap_or(&[]));
        let name = String::from_utf8_lossy(strings.next().unwrap_or(&[])).into_owned();
        let args = String::from_utf8_lossy(strings.next().unwrap_or(&[])).into_owned();
        if provider != "python" || !names.contains(&name.as_str()) {
            continue;
        }
        let pc = match base {
            Some(b) => pc.wrapping_add(b).wrapping_sub(link_base),
            None => pc,
        };
        let offset = obj
            .segments()
            .find_map(|s| {
                let (off, len) = s.file_range();
                let a = s.address();
                (pc >= a && pc < a + len).then(|| pc - a + off)
            })
            .ok_or_else(|| anyhow!("{name}'s address {pc:#x} is in no segment"))?;
        out.push(SdtProbe {
            name,
            offset,
            semaphore: sem,
            arg: args.split_whitespace().next().unwrap_or("").to_string(),
        });
    }
    Ok(out)
}

/// The pt_regs slot of an x86-64 register name, 64-bit or a narrower alias.
fn slot(reg: &str) -> Option<u64> {
    let r = reg.trim_start_matches('%');
    let table: [(&[&str], u64); 16] = [
        (&["r15", "r15d", "r15w", "r15b"], 0),
        (&["r14", "r14d", "r14w", "r14b"], 1),
        (&["r13", "r13d", "r13w", "r13b"], 2),
        (&["r12", "r12d", "r12w", "r12b"], 3),
        (&["rbp", "ebp", "bp"], 4),
        (&["rbx", "ebx", "bx", "bl"], 5),
        (&["r11", "r11d", "r11w", "r11b"], 6),
        (&["r10", "r10d", "r10w", "r10b"], 7),
        (&["r9", "r9d", "r9w", "r9b"], 8),
        (&["r8", "r8d", "r8w", "r8b"], 9),
        (&["rax", "eax", "ax", "al"], 10),
        (&["rcx", "ecx", "cx", "cl"], 11),
        (&["rdx", "edx", "dx", "dl"], 12),
        (&["rsi", "esi", "si", "sil"], 13),
        (&["rdi", "edi", "di", "dil"], 14),
        (&["rsp", "esp", "sp"], 19),
    ];
    table
        .iter()
        .find(|(names, _)| names.contains(&r))
        .map(|(_, s)| *s)
}

/// The cookie for a probe of `kind` whose argument spec is `arg` (`-4@%edi`, `-8@112(%rsp)`);
/// an argument in another form (a constant, an indexed address) is not read.
pub fn cookie(kind: u64, arg: &str) -> u64 {
    let none = gc_cookie(kind, GC_ARG_NONE, false, 0, 0);
    if !cfg!(target_arch = "x86_64") {
        return none;
    }
    let Some((size, place)) = arg.split_once('@') else {
        return none;
    };
    let size = size
        .trim_start_matches('-')
        .parse::<u64>()
        .unwrap_or(8)
        .min(8);
    if let Some(s) = place.starts_with('%').then(|| slot(place)).flatten() {
        return gc_cookie(kind, s, false, size, 0);
    }
    if let Some((off, rest)) = place.split_once('(')
        && let Some(reg) = rest.strip_suffix(')')
        && let Some(s) = slot(reg)
        && let Ok(off) = if off.is_empty() {
            Ok(0)
        } else {
            off.parse::<i32>()
        }
    {
        return gc_cookie(kind, s, true, size, off);
    }
    none
}

/// A semaphore raised in one process, lowered when dropped.
pub struct Semaphore {
    proc_pid: u32,
    address: u64,
}

impl Semaphore {
    fn add(proc_pid: u32, address: u64, delta: i32) -> Result<()> {
        let mem = OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/{proc_pid}/mem"))?;
        let mut b = [0u8; 2];
        mem.read_exact_at(&mut b, address)?;
        let v = (u16::from_le_bytes(b) as i32 + delta).clamp(0, u16::MAX as i32) as u16;
        mem.write_all_at(&v.to_le_bytes(), address)?;
        Ok(())
    }

    /// Raises the semaphore at link-time address `sem` of the file `path` (as the process
    /// sees it: `shown`) in process `proc_pid`: where the file is loaded there, from its maps.
    pub fn raise(proc_pid: u32, shown: &str, path: &Path, sem: u64) -> Result<Self> {
        let file = File::open(path)?;
        // SAFETY: as in `find`.
        let map = unsafe { memmap2::Mmap::map(&file) }?;
        let obj = object::File::parse(&*map)?;
        // A position-independent file is loaded at a bias: its first mapping (file offset 0)
        // starts at the bias plus the first segment's address.
        let bias = if obj.kind() == object::ObjectKind::Dynamic {
            let maps = std::fs::read_to_string(format!("/proc/{proc_pid}/maps"))?;
            let start = maps
                .lines()
                .find_map(|l| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    (f.len() >= 6 && f[5] == shown && u64::from_str_radix(f[2], 16) == Ok(0))
                        .then(|| u64::from_str_radix(f[0].split('-').next()?, 16).ok())
                        .flatten()
                })
                .ok_or_else(|| anyhow!("{shown} is not mapped in PID {proc_pid}"))?;
            let first = obj.segments().map(|s| s.address()).min().unwrap_or(0);
            start - first
        } else {
            0
        };
        let address = bias + sem;
        Self::add(proc_pid, address, 1)
            .with_context(|| format!("raising the USDT semaphore in PID {proc_pid}"))?;
        Ok(Self { proc_pid, address })
    }
}

impl Drop for Semaphore {
    fn drop(&mut self) {
        // The process may be gone: nothing to lower then.
        let _ = Self::add(self.proc_pid, self.address, -1);
    }
}

/// The GC probes attached to one interpreter file, and the semaphores raised for them.
pub struct GcProbes {
    pub links: Vec<UProbeLink>,
    /// The semaphores' link-time addresses, and those raised.
    pub sems: Vec<u64>,
    pub semaphores: Vec<Semaphore>,
    /// Where the file's probes keep their argument, `[gc__start, gc__done]`, for `GC_ARGS`.
    pub args: [u64; 2],
}

impl GcProbes {
    /// Raises the semaphores in another process of the same interpreter file (loaded at its
    /// own place there).
    pub fn raise_in(&mut self, proc_pid: u32, shown: &str, path: &Path) -> Result<()> {
        for &s in &self.sems.clone() {
            self.semaphores
                .push(Semaphore::raise(proc_pid, shown, path, s)?);
        }
        Ok(())
    }
}

/// Attaches `gc_start` and `gc_done` to the GC probes of the interpreter at `path` (`shown`
/// as process `proc_pid` sees it) and raises their semaphores in that process.
pub fn attach_gc(ebpf: &mut Ebpf, proc_pid: u32, shown: &str, path: &Path) -> Result<GcProbes> {
    let probes = find(path, &["gc__start", "gc__done"])?;
    if probes.len() < 2 {
        bail!("{shown} has no gc__start/gc__done USDT probes");
    }
    let mut out = GcProbes {
        links: vec![],
        sems: vec![],
        semaphores: vec![],
        args: [cookie(GC_START, ""), cookie(GC_DONE, "")],
    };
    for p in &probes {
        let (kind, name) = if p.name == "gc__done" {
            (GC_DONE, "gc_done")
        } else {
            (GC_START, "gc_start")
        };
        out.args[kind as usize] = cookie(kind, &p.arg);
        let prog: &mut UProbe = ebpf
            .program_mut(name)
            .with_context(|| format!("program {name}"))?
            .try_into()?;
        if prog.fd().is_err() {
            prog.load().map_err(|e| {
                // The verifier's log, when there is one, is for a developer, not this note.
                let e = e.to_string();
                let e = e
                    .split(". Verifier output")
                    .next()
                    .unwrap_or(&e)
                    .to_string();
                anyhow!("loading the GC probe {name}: {e}")
            })?;
        }
        let point = UProbeAttachPoint {
            location: UProbeAttachLocation::AbsoluteOffset(p.offset),
            cookie: None,
        };
        let id = prog
            .attach(point, path, UProbeScope::AllProcesses)
            .with_context(|| format!("uprobe on {shown}:{}", p.name))?;
        out.links.push(prog.take_link(id)?);
    }
    // A probe without a semaphore always fires; each distinct semaphore is raised once.
    let mut sems: Vec<u64> = probes
        .iter()
        .map(|p| p.semaphore)
        .filter(|&s| s != 0)
        .collect();
    sems.dedup();
    out.sems = sems;
    out.raise_in(proc_pid, shown, path)?;
    Ok(out)
}

/// Tells the GC programs where process `pid`'s probes keep their argument; `default` makes it
/// also what a process without an entry of its own (forked from a member later) uses.
pub fn set_gc_args(ebpf: &mut Ebpf, pid: u32, args: [u64; 2], default: bool) -> Result<()> {
    let mut map: aya::maps::HashMap<_, u32, [u64; 2]> =
        aya::maps::HashMap::try_from(ebpf.map_mut("GC_ARGS").context("GC_ARGS map")?)?;
    map.insert(pid, args, 0)?;
    if default {
        map.insert(0, args, 0)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argument_specs_become_cookies() {
        if !cfg!(target_arch = "x86_64") {
            return;
        }
        assert_eq!(
            cookie(GC_DONE, "-8@%r12"),
            gc_cookie(GC_DONE, 3, false, 8, 0)
        );
        assert_eq!(
            cookie(GC_START, "-4@112(%rsp)"),
            gc_cookie(GC_START, 19, true, 4, 112)
        );
        assert_eq!(
            cookie(GC_START, "-4@-20(%rbp)"),
            gc_cookie(GC_START, 4, true, 4, -20)
        );
        assert_eq!(
            cookie(GC_START, "4@%edi"),
            gc_cookie(GC_START, 14, false, 4, 0)
        );
        assert_eq!(
            cookie(GC_START, "4@$5"),
            gc_cookie(GC_START, GC_ARG_NONE, false, 0, 0)
        );
    }

    #[test]
    fn this_machines_python_has_the_gc_probes() {
        let p = Path::new("/usr/bin/python3");
        if !p.exists() {
            return;
        }
        let found = find(
            &std::fs::canonicalize(p).unwrap(),
            &["gc__start", "gc__done"],
        )
        .unwrap();
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found.iter().all(|f| f.offset > 0 && f.semaphore > 0));
    }
}
