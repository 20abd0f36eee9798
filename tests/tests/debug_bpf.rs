//! `--debug-bpf`: the programs' own log of what should not happen, end to end through the
//! kernel (aya-log's ring) to stderr. A thread map of one entry (`TRACER_TEST_MAX_THREADS`)
//! and one direct-mapped slot make the workers' entries fail for real, as a service of more
//! than 16,384 threads would.

use std::time::Duration;

use tracer_tests::{Testload, Tracer, require_root, serial, u};

#[test]
fn a_full_thread_map_is_logged_with_its_threads_only_under_debug_bpf() {
    let _guard = serial();
    require_root();
    let mut load = Testload::spawn(&["mixed", "3"]);
    load.settle();
    let pid = load.pid.to_string();
    let env = [("TRACER_TEST_MAX_THREADS", "1")];
    let base = ["attach", "--pid", &pid, "--duration", "60s", "--json"];
    let tracers: Vec<Tracer> = [&["--debug-bpf"][..], &[]]
        .iter()
        .map(|extra| {
            let mut args = base.to_vec();
            args.extend_from_slice(&["--thread-slots", "1"]);
            args.extend_from_slice(extra);
            Tracer::start_with_env(&args, &env)
        })
        .collect();
    load.send("go");
    load.expect("done");
    tracers.iter().for_each(|t| t.signal(libc::SIGINT));
    let mut done = tracers
        .into_iter()
        .map(|t| t.finish(Duration::from_secs(60)));
    let (debug, plain) = (done.next().unwrap(), done.next().unwrap());
    for f in [&debug, &plain] {
        assert!(f.status.success(), "{}", f.stderr);
        assert!(
            u(&f.json()["losses"]["thread_map_full"]) > 0,
            "the map of one entry did not fill: {}",
            f.stdout
        );
    }
    // Every logged thread is one of the target's, named with its process; two threads at
    // most found room (the slot and the map's one entry), so at least two are logged.
    let logged: std::collections::BTreeSet<u32> = debug
        .stderr
        .lines()
        .filter_map(|l| l.strip_prefix("bpf: thread map full: tid "))
        .map(|rest| {
            let (tid, tail) = rest.split_once(' ').expect("tid then text");
            assert_eq!(tail, format!("of tgid {pid} is not tracked"), "{rest}");
            tid.parse().expect("a tid")
        })
        .collect();
    assert!(
        logged.len() >= 2,
        "{:?} of {:?}: {}",
        logged,
        load.tids,
        debug.stderr
    );
    assert!(
        logged.iter().all(|t| load.tids.contains(t)),
        "{logged:?} vs {:?}",
        load.tids
    );
    assert!(
        !plain.stderr.contains("bpf:"),
        "logged without --debug-bpf: {}",
        plain.stderr
    );
}
