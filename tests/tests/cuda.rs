//! CUDA wait accounting by uprobes, on a stand-in libcuda (tests/fakecuda) so that it runs on
//! machines without a GPU: the probes attach to a library a running process has mapped, count
//! kernel launches, and time synchronizing calls. The real library is checked on the GPU
//! machine (docs/GPU.md).

use std::{path::PathBuf, process::Command, time::Duration};

use tracer_tests::{
    Testload, Tracer, attach_json, field, require_root, run_tracer, serial, thread_json, u,
};

/// Builds the stand-in as `libcuda.so.1` in a fresh directory.
fn fake_libcuda() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tracer-fakecuda-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let lib = dir.join("libcuda.so.1");
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fakecuda/fakecuda.c");
    let status = Command::new("cc")
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(&lib)
        .arg(&src)
        .status()
        .expect("a C compiler (cc)");
    assert!(status.success(), "building {}", src.display());
    lib
}

#[test]
fn synchronizing_calls_are_timed_and_launches_counted() {
    let _guard = serial();
    require_root();
    let lib = fake_libcuda();
    let mut load = Testload::spawn(&["cuda", lib.to_str().unwrap()]);
    load.settle();
    let pid = load.pid.to_string();
    // The library is mapped already: the probes attach to a running process.
    let tracer = Tracer::start(&["attach", "--pid", &pid, "--duration", "60s", "--json"]);
    load.send("go");
    let done = load.expect("done");
    tracer.signal(libc::SIGINT);
    let out = tracer.finish(Duration::from_secs(20));
    assert!(out.status.success(), "{}", out.stderr);
    let doc = out.json();
    let cuda_cap = &doc["capabilities"]["gpu"]["cuda"];
    assert_eq!(cuda_cap["available"], true, "{cuda_cap}");
    assert!(
        cuda_cap["reason"]
            .as_str()
            .unwrap()
            .contains("libcuda.so.1")
    );

    let worker = thread_json(&doc, load.tids[1]);
    let c = &worker["cuda"];
    let measured = |k: &str| field(&done, k).parse::<u64>().unwrap();
    assert_eq!(u(&c["launches"]), measured("launches"), "{c}");
    // Outermost calls only: cuMemcpyDtoH_v2 calls cuStreamSynchronize inside, which must not
    // count twice. The round began with a call left by longjmp: its return was never seen,
    // and every later call still counts (before the repair, none did).
    assert_eq!(u(&c["sync_calls"]), measured("syncs"), "{c}");
    assert_eq!(u(&c["lost_returns"]), 1, "{c}");
    assert_eq!(u(&doc["cuda"]["lost_returns"]), 1);
    // Time inside the calls, against the workload's own clock around them. The probes add a
    // few microseconds per call on each side (uprobe traps), and the workload's clock reads
    // sit just outside the probes: within 5 % plus 20 us per call.
    let sync_ns = u(&c["sync_ns"]);
    let own = measured("sync_ns");
    let calls = measured("syncs");
    assert!(
        sync_ns.abs_diff(own) <= own / 20 + 20_000 * calls,
        "probes {sync_ns} ns vs the workload's own {own} ns"
    );
    assert!(
        u(&c["sync_max_ns"]) >= 2_000_000,
        "the longest call sleeps 2 ms: {c}"
    );
    assert_eq!(u(&doc["cuda"]["launches"]), measured("launches"));
    // Other threads made no CUDA calls.
    assert!(thread_json(&doc, load.tids[0])["cuda"].is_null());
    let _ = std::fs::remove_dir_all(lib.parent().unwrap());
}

#[test]
fn a_library_mapped_during_the_window_is_probed_from_then_on() {
    let _guard = serial();
    require_root();
    let lib = fake_libcuda();
    let mut load = Testload::spawn(&["cuda-late", lib.to_str().unwrap()]);
    load.settle();
    let pid = load.pid.to_string();
    let tracer = Tracer::start(&["attach", "--pid", &pid, "--duration", "60s", "--json"]);
    load.send("open");
    load.expect("opened");
    // The tracer reads its members' maps once a second: two passes, with room to spare.
    std::thread::sleep(Duration::from_millis(2500));
    load.send("go");
    let done = load.expect("done");
    tracer.signal(libc::SIGINT);
    let out = tracer.finish(Duration::from_secs(20));
    assert!(out.status.success(), "{}", out.stderr);
    let doc = out.json();
    let cap = &doc["capabilities"]["gpu"]["cuda"];
    assert_eq!(cap["available"], true, "{cap}");
    // Probed on the file the process mapped after the attach (not there before "open").
    let reason = cap["reason"].as_str().unwrap();
    assert!(reason.contains(lib.to_str().unwrap()), "{cap}");
    let c = &thread_json(&doc, load.tids[1])["cuda"];
    let measured = |k: &str| field(&done, k).parse::<u64>().unwrap();
    assert_eq!(u(&c["launches"]), measured("launches"), "{c}");
    assert_eq!(u(&c["sync_calls"]), measured("syncs"), "{c}");
    let _ = std::fs::remove_dir_all(lib.parent().unwrap());
}

#[test]
fn a_process_without_cuda_is_said_to_be_one() {
    let _guard = serial();
    require_root();
    let load = Testload::spawn(&["mixed", "1"]);
    let doc = attach_json(load.pid, "300ms");
    let gpu = &doc["capabilities"]["gpu"];
    assert_eq!(gpu["cuda"]["available"], false);
    assert!(
        gpu["cuda"]["reason"]
            .as_str()
            .unwrap()
            .contains("not mapped"),
        "{gpu}"
    );
    // This machine has no NVIDIA driver: said, not an error.
    if !std::path::Path::new("/dev/nvidiactl").exists() {
        assert_eq!(gpu["available"], false);
        assert!(gpu["reason"].as_str().unwrap().contains("NVML"), "{gpu}");
        assert!(doc["gpu"].is_null());
    }
    assert_eq!(doc["cuda"]["measured"], false);
    let text = run_tracer(&[
        "attach",
        "--pid",
        &load.pid.to_string(),
        "--duration",
        "300ms",
    ]);
    assert!(
        text.stdout.contains("CUDA waits: not measured"),
        "{}",
        text.stdout
    );
}
