//! Garbage collections per thread of the CPython members.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::recording::Recording;

/// One thread's collections over the window.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct GcThread {
    pub pid: u32,
    pub tid: u32,
    pub collections: u64,
    pub total_ns: u64,
    pub max_ns: u64,
    /// The generation of the longest one.
    pub max_generation: Option<u32>,
    /// Collections of generations 0, 1 and 2.
    pub by_generation: [u64; 3],
}

pub fn summarize(rec: &Recording) -> Vec<GcThread> {
    let mut per: BTreeMap<(u32, u32), GcThread> = BTreeMap::new();
    for p in &rec.runtime_pauses {
        let g = per.entry((p.pid, p.tid)).or_insert(GcThread {
            pid: p.pid,
            tid: p.tid,
            collections: 0,
            total_ns: 0,
            max_ns: 0,
            max_generation: None,
            by_generation: [0; 3],
        });
        g.collections += 1;
        g.total_ns += p.ns();
        if p.ns() >= g.max_ns {
            g.max_ns = p.ns();
            g.max_generation = p.generation;
        }
        if let Some(n) = p
            .generation
            .and_then(|x| g.by_generation.get_mut(x as usize))
        {
            *n += 1;
        }
    }
    let mut v: Vec<GcThread> = per.into_values().collect();
    v.sort_by(|a, b| b.total_ns.cmp(&a.total_ns).then(a.tid.cmp(&b.tid)));
    v
}
