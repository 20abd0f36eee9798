//! The target set process by process: who was traced, when each joined and left, and what its
//! threads add up to. Pure.

use serde::Serialize;

use std::collections::BTreeMap;

use crate::recording::{ProcessRecord, Recording, ThreadRecord, threads::ThreadTotals};

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct ProcessSummary {
    /// The kernel's PID (TGID).
    pub pid: u32,
    /// Its parent when it joined (0 when unknown).
    pub ppid: u32,
    pub comm: String,
    pub cmdline: Vec<String>,
    /// What it is for in the service, from its process title and command line
    /// (`api_server`, `engine_core_dp0`, `worker_tp0`, `scheduler_tp0`, `detokenizer`,
    /// `router`, `shard_1`, ...), else its command name (analysis/roles.rs).
    pub role: String,
    /// Named on the command line (not brought in as a descendant).
    pub given: bool,
    /// Its CPU cgroup (the v2 path, or the v1 cpu controller's), when known.
    pub cgroup: Option<String>,
    /// The CPython interpreter it runs (its libpython mapped, or an executable named
    /// python3.N), and how that was found; null for anything else.
    pub python: Option<crate::recording::pauses::Python>,
    /// When it was forked, if inside the window (null: it was there at the start).
    pub joined_ns: Option<u64>,
    /// When its last thread exited, if inside the window (null: it outlived the window).
    pub left_ns: Option<u64>,
    /// Its threads seen in the window.
    pub threads: u64,
    /// Its threads' totals added up.
    #[serde(flatten)]
    pub totals: ThreadTotals,
}

/// Every process of the set: those given first, in their order, then the others by on-CPU
/// time, largest first. A recording from before process trees lists none: its target alone,
/// with all the threads.
pub fn summarize(rec: &Recording) -> Vec<ProcessSummary> {
    let mut out = each(rec);
    // Stable: the processes given keep the order they were given in.
    out.sort_by(|a, b| {
        b.given.cmp(&a.given).then_with(|| match a.given {
            true => std::cmp::Ordering::Equal,
            false => b
                .totals
                .time
                .oncpu_ns
                .cmp(&a.totals.time.oncpu_ns)
                .then(a.pid.cmp(&b.pid)),
        })
    });
    out
}

fn each(rec: &Recording) -> Vec<ProcessSummary> {
    let listed: Vec<ProcessRecord> = if rec.processes.is_empty() {
        vec![ProcessRecord {
            pid: rec.target.pid,
            ppid: 0,
            comm: rec.target.comm.clone(),
            cmdline: rec.target.cmdline.clone(),
            given: true,
            joined_ns: None,
            cgroup: None,
            python: None,
        }]
    } else {
        rec.processes.clone()
    };
    // Threads of files from before process trees carry no process (0): all the target's.
    let alone = listed.len() == 1;
    let mut by_process: BTreeMap<u32, Vec<&ThreadRecord>> = BTreeMap::new();
    for t in &rec.threads {
        let pid = if alone && t.pid == 0 {
            listed[0].pid
        } else {
            t.pid
        };
        by_process.entry(pid).or_default().push(t);
    }
    let mut listed = listed;
    // Threads of a process the recording does not list (it joined beyond what the kernel
    // side could note, `losses.child_map_full`): listed from its threads, never left out.
    for (&pid, threads) in &by_process {
        if pid != 0 && !listed.iter().any(|p| p.pid == pid) {
            listed.push(ProcessRecord {
                pid,
                ppid: 0,
                comm: threads[0].comm.clone(),
                cmdline: vec![],
                given: false,
                joined_ns: threads.iter().filter_map(|t| t.created_ns).min(),
                cgroup: None,
                python: None,
            });
        }
    }
    listed
        .into_iter()
        .map(|p| {
            let mine = by_process.remove(&p.pid).unwrap_or_default();
            let mut totals = ThreadTotals::default();
            for t in &mine {
                totals += t.totals;
            }
            let left_ns = mine
                .iter()
                .map(|t| t.exited_ns)
                .collect::<Option<Vec<u64>>>()
                .filter(|e| !e.is_empty())
                .and_then(|e| e.into_iter().max());
            // The name the kernel last gave its main thread: a child is named after its parent
            // until it execs.
            let comm = mine
                .iter()
                .find(|t| t.tid == p.pid)
                .map_or(p.comm, |t| t.comm.clone());
            ProcessSummary {
                pid: p.pid,
                ppid: p.ppid,
                role: super::roles::role_of(&comm, &p.cmdline),
                comm,
                cmdline: p.cmdline,
                given: p.given,
                cgroup: p.cgroup,
                python: p.python,
                joined_ns: p.joined_ns,
                left_ns,
                threads: mine.len() as u64,
                totals,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recording::testutil::{recording, thread};

    #[test]
    fn threads_add_up_per_process_and_a_process_leaves_with_its_last_thread() {
        let mut a = thread(1, 100, 10, &[10]);
        a.pid = 100;
        let mut b = thread(2, 200, 20, &[20]);
        b.pid = 200;
        b.exited_ns = Some(5_000);
        let mut c = thread(3, 300, 30, &[30]);
        c.pid = 200;
        c.exited_ns = Some(7_000);
        let mut rec = recording(vec![a, b, c], vec![]);
        rec.processes = vec![
            ProcessRecord {
                pid: 100,
                ppid: 1,
                comm: "api".into(),
                cmdline: vec![],
                given: true,
                joined_ns: None,
                cgroup: None,
                python: None,
            },
            ProcessRecord {
                pid: 200,
                ppid: 100,
                comm: "engine".into(),
                cmdline: vec![],
                given: false,
                joined_ns: Some(1_000),
                cgroup: None,
                python: None,
            },
        ];
        let p = summarize(&rec);
        assert_eq!((p[0].threads, p[0].left_ns), (1, None));
        assert_eq!(p[1].threads, 2);
        assert_eq!(p[1].totals.time.oncpu_ns, 500);
        assert_eq!(p[1].left_ns, Some(7_000));
        assert!(rec.is_member(200) && !rec.is_member(300));
        // A thread of a process the recording does not list (the kernel's map of joined
        // processes was full): its process is listed from it, not dropped.
        let mut d = thread(4, 400, 0, &[]);
        d.pid = 300;
        rec.threads.push(d);
        let p = summarize(&rec);
        let extra = p.iter().find(|p| p.pid == 300).expect("listed");
        assert_eq!((extra.threads, extra.totals.time.oncpu_ns), (1, 400));
    }

    #[test]
    fn the_processes_given_keep_their_order_and_the_others_go_busiest_first() {
        let on = |tid, pid, ns| {
            let mut t = thread(tid, ns, 0, &[]);
            t.pid = pid;
            t
        };
        let mut rec = recording(
            vec![
                on(1, 300, 10),
                on(2, 100, 20),
                on(3, 400, 5),
                on(4, 500, 50),
            ],
            vec![],
        );
        let process = |pid, given| ProcessRecord {
            pid,
            ppid: 0,
            comm: String::new(),
            cmdline: vec![],
            given,
            joined_ns: None,
            cgroup: None,
            python: None,
        };
        rec.processes = vec![
            process(300, true),
            process(100, true),
            process(400, false),
            process(500, false),
        ];
        let order: Vec<u32> = summarize(&rec).iter().map(|p| p.pid).collect();
        assert_eq!(order, vec![300, 100, 500, 400]);
    }
}
