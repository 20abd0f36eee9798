//! `cargo xtask`: set-up, build, demo, scenarios, test and lint automation.
//!
//! Every command that needs the eBPF toolchain runs `setup` first, which installs only what is
//! missing and says what it does, so `cargo xtask demo` and `cargo xtask test` work on a fresh
//! Debian 12 machine.

mod bench;
mod dist;
mod fuzz;
mod scenarios;
mod setup;
mod vmtest;

use std::{
    path::PathBuf,
    process::{Command, ExitCode},
};

use anyhow::{Context as _, Result, bail};
use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "cargo xtask")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Install what building and testing need, if missing (apt packages, nightly + rust-src,
    /// bpf-linker against LLVM 22).
    Setup,
    /// Build the tracer (release).
    Build,
    /// Build and run `tracer demo`, passing the remaining arguments on.
    Demo {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Run the whole test suite (needs root: the tests load BPF programs).
    Test {
        /// Extra arguments for `cargo test` (e.g. a test name filter).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// cargo fmt --check, then clippy on the host crates and, separately, on the eBPF crate.
    Lint,
    /// Regenerate docs/summary.schema.json and docs/demo.schema.json from the Rust types.
    Schema,
    /// Measure the tracer's overhead against perf sched record and bpftrace (BENCHMARKS.md).
    Bench(bench::BenchArgs),
    /// Fuzz the trace-file reader (cargo-fuzz, libFuzzer) for a bounded time.
    Fuzz {
        /// How long to fuzz.
        #[arg(long, default_value_t = 300)]
        seconds: u64,
    },
    /// Run every `tracer demo` scenario and print expected vs verdict, and the accuracy.
    Scenarios {
        /// Runs of each scenario (interleaved).
        #[arg(long, default_value_t = 1)]
        repeat: u32,
        /// Include the GPU scenarios (default: when nvidia-smi finds a GPU).
        #[arg(long)]
        gpu: Option<bool>,
    },
    /// Boot Debian's distro kernels (5.10, 6.1, 6.1-rt, 6.12) under QEMU's software emulation
    /// with virtme-ng, the host's root filesystem shared read-only, and run the tracer there:
    /// doctor, exact counts per probe mode, the cpu-contention demo; and the running kernel
    /// natively. Builds the release binary and the count checks; caches under target/vmtest.
    Vmtest(vmtest::VmtestArgs),
    /// Build what a machine without Rust installs: the release binary linked against glibc
    /// 2.28 (cargo-zigbuild), its man pages and completions, a tarball and a .deb under
    /// target/dist; --installtest installs the .deb in a clean Debian 12 chroot and runs it.
    Dist(dist::DistArgs),
}

pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

pub fn is_root() -> bool {
    // Root without libc: /proc/self/status "Uid:" real, effective, ...
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|e| e == "0"))
        })
        .unwrap_or(false)
}

/// Runs a command, echoing it, and fails if it fails.
pub fn run(cmd: &mut Command) -> Result<()> {
    eprintln!("xtask: $ {}", render(cmd));
    let status = cmd
        .status()
        .with_context(|| format!("starting {}", render(cmd)))?;
    if !status.success() {
        bail!("`{}` failed ({status})", render(cmd));
    }
    Ok(())
}

/// A Python venv at `venv` with `package` installed from PyPI, unless `ready` already holds;
/// `ready` must hold after the install. `who` prefixes what is said.
pub fn pip_venv(
    who: &str,
    venv: &std::path::Path,
    package: &str,
    ready: impl Fn() -> bool,
) -> Result<()> {
    if ready() {
        return Ok(());
    }
    eprintln!("{who}: installing {package} in {}", venv.display());
    run(Command::new("python3").arg("-m").arg("venv").arg(venv))?;
    run(Command::new(venv.join("bin/pip")).args(["install", "-q", package]))?;
    if !ready() {
        bail!(
            "pip installed {package} in {} but it does not work",
            venv.display()
        );
    }
    Ok(())
}

/// Runs a command and returns its stdout; its stderr goes to ours.
pub fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("starting {}", render(cmd)))?;
    if !out.status.success() {
        bail!("`{}` failed ({})", render(cmd), out.status);
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

pub(crate) fn render(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

pub fn cargo() -> Command {
    let mut c = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    c.current_dir(workspace_root());
    c
}

/// A command run as root: directly when we are root, else through sudo.
pub fn as_root(program: impl AsRef<std::ffi::OsStr>) -> Command {
    if is_root() {
        Command::new(program)
    } else {
        let mut c = Command::new("sudo");
        c.arg("-E").arg(program);
        c
    }
}

fn demo(args: &[String]) -> Result<()> {
    setup::ensure()?;
    run(cargo().args(["build", "--release", "-p", "tracer"]))?;
    let bin = workspace_root().join("target/release/tracer");
    if !is_root() {
        eprintln!("xtask: the demo loads BPF programs; running it through sudo");
    }
    run(as_root(bin).arg("demo").args(args))
}

fn test(args: &[String]) -> Result<()> {
    setup::ensure()?;
    // The integration tests run the tracer binary and the test workload: build them first,
    // the tracer in release (what users run; a debug build's built-in workload is too jittery
    // for the quiet scenario).
    run(cargo().args(["build", "--bins"]))?;
    run(cargo().args(["build", "--release", "-p", "tracer"]))?;
    let mut cmd = cargo();
    cmd.args(["test", "--no-fail-fast"]).args(args);
    cmd.env("TRACER_BIN", workspace_root().join("target/release/tracer"));
    if !is_root() {
        eprintln!("xtask: the tests load BPF programs; running the test binaries through sudo");
        cmd.env("CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER", "sudo -E");
    }
    // Tests share the CPUs and the kernel's tracepoints: one at a time.
    cmd.args(["--", "--test-threads=1"]);
    run(&mut cmd)?;
    // The benchmark is not a timed test; the suite only checks that it runs (a quick round).
    if args.is_empty() {
        bench::bench(&bench::BenchArgs {
            rounds: 1,
            loops: 0,
            quick: true,
            many_threads_only: false,
            watch_only: false,
            soak_s: 0,
            tracer: None,
        })?;
        // And that the trace reader survives a short fuzzing run.
        fuzz::fuzz(30)?;
    }
    Ok(())
}

fn lint() -> Result<()> {
    setup::ensure()?;
    run(cargo().args(["fmt", "--all", "--check"]))?;
    run(cargo().args(["clippy", "--all-targets", "--", "-D", "warnings"]))?;
    // The eBPF crate only means anything for the bpfel target, with nightly's build-std.
    let mut ebpf = Command::new("rustup");
    ebpf.current_dir(workspace_root().join("tracer-ebpf"))
        .args(["run", "nightly", "cargo", "clippy", "-Z", "build-std=core"])
        .args(["--target", "bpfel-unknown-none", "-p", "tracer-ebpf", "--"])
        .args(["-D", "warnings"])
        .env(
            "CARGO_ENCODED_RUSTFLAGS",
            "--cfg=bpf_target_arch=\"x86_64\"",
        )
        .env(
            "CARGO_TARGET_DIR",
            workspace_root().join("target/ebpf-clippy"),
        );
    run(&mut ebpf)
}

/// The `--json` documents (`tracer schema DOCUMENT`, the tracer's `cli::Document`), each
/// committed as docs/DOCUMENT.schema.json.
const DOCUMENTS: [&str; 2] = ["summary", "demo"];

fn schema() -> Result<()> {
    setup::ensure()?;
    for doc in DOCUMENTS {
        let out = cargo()
            .args(["run", "--quiet", "-p", "tracer", "--", "schema", doc])
            .output()
            .with_context(|| format!("running tracer schema {doc}"))?;
        if !out.status.success() {
            bail!(
                "tracer schema {doc} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let path = workspace_root().join(format!("docs/{doc}.schema.json"));
        std::fs::write(&path, &out.stdout)
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("xtask: wrote {}", path.display());
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Cmd::Setup => setup::ensure(),
        Cmd::Build => {
            setup::ensure().and_then(|()| run(cargo().args(["build", "--release", "-p", "tracer"])))
        }
        Cmd::Demo { args } => demo(&args),
        Cmd::Test { args } => test(&args),
        Cmd::Lint => lint(),
        Cmd::Schema => schema(),
        Cmd::Scenarios { repeat, gpu } => scenarios::scenarios(repeat, gpu),
        Cmd::Bench(args) => bench::bench(&args),
        Cmd::Fuzz { seconds } => fuzz::fuzz(seconds),
        Cmd::Vmtest(args) => vmtest::vmtest(&args),
        Cmd::Dist(args) => dist::dist(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
