//! PID namespaces. Inside a container the tool's /proc shows the container's PIDs, while the
//! scheduler programs filter on `task->tgid` and NVML reports PIDs, both of the initial
//! namespace. Resolving `-p 1` in the container's /proc and handing 1 to the programs traced
//! the host's PID 1 instead, and showed the real target as a foreign preemptor. Here the
//! namespace of the tool's /proc is found, and its tasks are listed with both IDs by a BPF task
//! iterator (tracer-ebpf `pidns.rs`), run when the target is resolved and again when its threads
//! are named at the end.

use std::{
    collections::BTreeMap, io::Read as _, os::unix::fs::MetadataExt as _, path::Path, sync::Mutex,
};

use anyhow::{Context as _, Result, anyhow};
use aya::{
    Btf, Ebpf, EbpfLoader,
    maps::HashMap,
    programs::{Iter, ProgramError},
};
use tracer_common::{Config, PidNsIds};

use super::ebpf::layout::{PidNsOffsets, VMLINUX_BTF};

/// The initial PID namespace's inode, fixed by the kernel (PROC_PID_INIT_INO,
/// include/linux/proc_ns.h).
pub const INIT_PID_NS_INODE: u64 = 0xEFFF_FFFC;

/// The inode of the PID namespace whose PIDs this tool's /proc shows: that of the namespace's
/// init (its PID 1), which is where /proc was mounted from. None in the initial namespace.
pub fn proc_namespace() -> Option<u64> {
    let ino = ["/proc/1/ns/pid", "/proc/self/ns/pid"]
        .iter()
        .find_map(|p| std::fs::metadata(p).ok())?
        .ino();
    (ino != INIT_PID_NS_INODE).then_some(ino)
}

/// The IDs of one task, as the kernel numbers them (the initial namespace).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostIds {
    pub tid: u32,
    pub tgid: u32,
}

#[derive(Default)]
struct Ids {
    /// From the latest scan only: a namespace TID may have been reused since an older one.
    to_host: BTreeMap<u32, HostIds>,
    /// From every scan: a thread that exited after one is still named.
    to_ns: BTreeMap<u32, u32>,
}

/// The tool's PID namespace, with a loaded task iterator to list it.
pub struct PidNamespace {
    pub inode: u64,
    ebpf: Mutex<Ebpf>,
    ids: Mutex<Ids>,
}

impl std::fmt::Debug for PidNamespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PidNamespace({})", self.inode)
    }
}

fn needs_btf(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow!(
        "this tool runs inside a PID namespace (a container): to translate its PIDs to the \
         kernel's it lists the namespace with a BPF task iterator, which needs the kernel's BTF \
         and Linux 5.8+ ({e}); run the tracer from the host's PID namespace instead"
    )
}

impl PidNamespace {
    /// Loads the task iterator for the namespace `inode` and lists it once.
    pub fn open(inode: u64) -> Result<Self> {
        let path = Path::new(VMLINUX_BTF);
        let offsets = PidNsOffsets::from_btf_file(path).map_err(needs_btf)?;
        let btf = Btf::from_sys_fs().map_err(needs_btf)?;
        let mut config = Config::zeroed();
        offsets.apply(&mut config);
        config.pidns_inum = u32::try_from(inode).context("PID namespace inode")?;
        let mut ebpf = EbpfLoader::new()
            .btf(Some(&btf))
            .override_global("CONFIG", &config, true)
            // Only the iterator runs: every other map at its smallest.
            .map_max_entries("CPU_WAIT", 1)
            .map_max_entries("EVENTS", 4096)
            .map_max_entries("THREAD_SLOTS", 1)
            .load(super::ebpf::OBJECT)
            .map_err(|e| anyhow!("loading the PID namespace iterator: {e}"))?;
        let prog: &mut Iter = ebpf
            .program_mut("pidns_tasks")
            .context("program pidns_tasks")?
            .try_into()?;
        prog.load("task", &btf)
            .map_err(|e: ProgramError| needs_btf(e))?;
        let ns = Self {
            inode,
            ebpf: Mutex::new(ebpf),
            ids: Mutex::default(),
        };
        ns.scan()?;
        Ok(ns)
    }

    /// Lists the namespace's tasks again.
    pub fn scan(&self) -> Result<()> {
        let mut ebpf = self.ebpf.lock().expect("no panics while held");
        let mut map: HashMap<_, u32, PidNsIds> =
            HashMap::try_from(ebpf.map_mut("PIDNS_IDS").context("PIDNS_IDS map")?)?;
        let stale: Vec<u32> = map.keys().flatten().collect();
        for k in stale {
            let _ = map.remove(&k);
        }
        let prog: &mut Iter = ebpf
            .program_mut("pidns_tasks")
            .context("program pidns_tasks")?
            .try_into()?;
        let link = prog.attach()?;
        let link = prog.take_link(link)?;
        // Reading the iterator's file runs the program over every task; it writes nothing.
        let mut file = link.into_file()?;
        let mut sink = Vec::new();
        file.read_to_end(&mut sink)
            .context("running the PID namespace iterator")?;
        let map: HashMap<_, u32, PidNsIds> =
            HashMap::try_from(ebpf.map("PIDNS_IDS").context("PIDNS_IDS map")?)?;
        let mut ids = self.ids.lock().expect("no panics while held");
        ids.to_host.clear();
        for (tid, v) in map.iter().flatten() {
            ids.to_host.insert(v.ns_tid, HostIds { tid, tgid: v.tgid });
            ids.to_ns.insert(tid, v.ns_tid);
        }
        Ok(())
    }

    /// The kernel's IDs of the task `ns_tid` of this namespace, listing it again if it is new.
    pub fn host_of(&self, ns_tid: u32) -> Option<HostIds> {
        let found = self.ids.lock().ok()?.to_host.get(&ns_tid).copied();
        if found.is_some() {
            return found;
        }
        self.scan().ok()?;
        self.ids.lock().ok()?.to_host.get(&ns_tid).copied()
    }

    /// The TID in this namespace of the task the kernel calls `host_tid`, if it is in it.
    pub fn ns_of(&self, host_tid: u32) -> Option<u32> {
        self.ids.lock().ok()?.to_ns.get(&host_tid).copied()
    }

    /// Every task seen in the namespace: kernel TID -> namespace TID.
    pub fn table(&self) -> BTreeMap<u32, u32> {
        self.ids
            .lock()
            .map(|ids| ids.to_ns.clone())
            .unwrap_or_default()
    }
}
