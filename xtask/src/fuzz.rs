//! `cargo xtask fuzz`: libFuzzer (cargo-fuzz) on the trace-file reader, seeded with a real
//! trace, for a bounded time. A crash or an allocation over the limit fails the run and leaves
//! the input in fuzz/artifacts/.

use std::process::Command;

use anyhow::Result;

use crate::{run, setup, workspace_root};

/// An input that makes the reader allocate more than this fails: lengths in a file must be
/// checked before they are trusted. A frame holds at most 256 MiB, compressed or not; a
/// vector growing to that may reserve twice as much.
const MALLOC_LIMIT_MB: u32 = 1024;

pub fn fuzz(seconds: u64) -> Result<()> {
    setup::ensure()?;
    let have = Command::new("rustup")
        .args(["run", "nightly", "cargo", "fuzz", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !have {
        eprintln!("setup: installing cargo-fuzz (cargo install)");
        run(Command::new("cargo").args(["install", "cargo-fuzz", "--locked"]))?;
    }
    let root = workspace_root();
    let corpus = root.join("fuzz/corpus/trace_reader");
    std::fs::create_dir_all(&corpus)?;
    let mut cmd = Command::new("rustup");
    cmd.current_dir(&root)
        .args(["run", "nightly", "cargo", "fuzz", "run", "trace_reader"])
        .arg(&corpus)
        .arg(root.join("fuzz/seeds"))
        .arg("--")
        .arg(format!("-max_total_time={seconds}"))
        .arg(format!("-malloc_limit_mb={MALLOC_LIMIT_MB}"))
        .arg("-rss_limit_mb=2048")
        // The reader needs no eBPF object; skipping it keeps the sanitizer flags away from
        // the BPF build.
        .env("AYA_BUILD_SKIP", "1");
    run(&mut cmd)
}
