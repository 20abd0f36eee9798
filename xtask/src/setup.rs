//! Idempotent set-up: checks each tool the build and the tests need, installs only what is
//! missing, and says what it is doing. Versions are the ones ../shared/PLATFORM.md found to
//! work: the nightly toolchain with rust-src (aya-build compiles the eBPF crate with
//! `-Z build-std=core`), and bpf-linker built against LLVM 22 (its LLVM must be at least
//! nightly rustc's, 22.1).

use std::process::{Command, Stdio};

use anyhow::{Result, bail};

use crate::{is_root, run};

/// Debian packages: LLVM 22 for bpf-linker, bpftool (the BTF cross-check test and BPF
/// inspection), stress-ng (disturbances), linux-perf (perf stat cross-checks), protoc
/// (decodes the Perfetto output in the tests), Chromium (renders the HTML output in the
/// tests), a C compiler (the stand-in libcuda), bpftrace (runqlat.bt, the bench's peer),
/// Python's venv (the Perfetto test installs Perfetto's published protos in one), Prometheus
/// (the export test scrapes `tracer watch` with the real server), qemu, seabios and a static
/// busybox (`vmtest` boots other kernels; virtme-ng builds its initramfs with busybox),
/// debootstrap and binutils (`dist --installtest`'s clean Debian root, its glibc check). A probe is a
/// program, a path, or a shell command (with a space) that succeeds when the package is there.
const APT_PACKAGES: [(&str, &str); 16] = [
    ("llvm-22-dev", "/usr/lib/llvm-22/bin/llvm-config"),
    ("bpftool", "bpftool"),
    ("stress-ng", "stress-ng"),
    ("linux-perf", "perf"),
    ("protobuf-compiler", "protoc"),
    ("chromium", "chromium"),
    ("gcc", "cc"),
    ("bpftrace", "bpftrace"),
    ("python3-venv", "python3 -c 'import ensurepip'"),
    ("prometheus", "prometheus"),
    ("qemu-system-x86", "qemu-system-x86_64"),
    ("seabios", "/usr/share/seabios/bios.bin"),
    ("busybox-static", "busybox"),
    ("kmod", "/sbin/depmod"),
    ("debootstrap", "debootstrap"),
    ("binutils", "objdump"),
];

fn have(program: &str) -> bool {
    if program.starts_with('/') {
        return std::path::Path::new(program).exists();
    }
    let probe = if program.contains(' ') {
        program.to_string()
    } else {
        format!("command -v {program}")
    };
    Command::new("sh")
        .args(["-c", &probe])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn output(cmd: &mut Command) -> Option<String> {
    let out = cmd.stderr(Stdio::null()).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

fn root_cmd(program: &str) -> Command {
    if is_root() {
        Command::new(program)
    } else {
        let mut c = Command::new("sudo");
        c.arg(program);
        c
    }
}

fn apt() -> Result<()> {
    let missing: Vec<&str> = APT_PACKAGES
        .iter()
        .filter(|(_, probe)| !have(probe))
        .map(|(pkg, _)| *pkg)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!("setup: installing {} (apt)", missing.join(", "));
    run(root_cmd("apt-get").args(["update", "-q"]))?;
    run(root_cmd("apt-get")
        .env("DEBIAN_FRONTEND", "noninteractive")
        .args(["install", "-y", "-q", "--no-install-recommends"])
        .args(&missing))
}

fn nightly() -> Result<()> {
    let has_nightly =
        output(Command::new("rustup").args(["run", "nightly", "rustc", "--version"])).is_some();
    let has_src = output(Command::new("rustup").args([
        "component",
        "list",
        "--installed",
        "--toolchain",
        "nightly",
    ]))
    .is_some_and(|s| s.lines().any(|l| l.starts_with("rust-src")));
    if has_nightly && has_src {
        return Ok(());
    }
    if !has_nightly {
        eprintln!("setup: installing the nightly toolchain with rust-src (rustup)");
        run(Command::new("rustup").args([
            "toolchain",
            "install",
            "nightly",
            "--profile",
            "minimal",
            "--component",
            "rust-src",
        ]))
    } else {
        eprintln!("setup: adding rust-src to the nightly toolchain (rustup)");
        run(Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", "nightly"]))
    }
}

/// bpf-linker linked against LLVM 22: an older one fails with obscure linker errors.
fn bpf_linker_ok() -> bool {
    let Some(path) = output(Command::new("sh").args(["-c", "command -v bpf-linker"])) else {
        return false;
    };
    output(Command::new("ldd").arg(path.trim())).is_some_and(|l| l.contains("libLLVM.so.22"))
}

fn bpf_linker() -> Result<()> {
    if bpf_linker_ok() {
        return Ok(());
    }
    eprintln!("setup: building bpf-linker against LLVM 22 (cargo install, about a minute)");
    run(Command::new("cargo")
        .env("LLVM_PREFIX", "/usr/lib/llvm-22")
        .args([
            "install",
            "--locked",
            "--force",
            "bpf-linker",
            "--version",
            "0.13.0",
        ])
        .args(["--no-default-features", "--features", "llvm-22"]))?;
    if !bpf_linker_ok() {
        bail!("bpf-linker was installed but is not on PATH (add ~/.cargo/bin to PATH)");
    }
    Ok(())
}

pub fn ensure() -> Result<()> {
    apt()?;
    nightly()?;
    bpf_linker()?;
    Ok(())
}
