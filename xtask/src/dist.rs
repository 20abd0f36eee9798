//! `cargo xtask dist`: what a machine without Rust installs. The release binary (the eBPF
//! object embedded) linked against glibc 2.28 with cargo-zigbuild and the `ziglang` package
//! from PyPI, so it runs on Debian 11+, Ubuntu 20.04+ and RHEL 8+ (it dlopens libnvidia-ml,
//! which rules out a static musl binary); its man pages and shell completions (`tracer
//! generate`); a tarball and a .deb (cargo-deb). `--installtest` then installs the .deb in a
//! clean Debian 12 root filesystem (debootstrap, no Rust in it) and runs the tracer there.
//!
//! The tools are installed once: cargo-zigbuild and cargo-deb with `cargo install`, ziglang
//! in a venv under target/dist/tools; the root filesystem is cached under target/dist.

mod installtest;

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};
use clap::Args;

use crate::{cargo, run, setup, workspace_root};

#[derive(Debug, Args)]
pub struct DistArgs {
    /// Then install the .deb in a clean Debian 12 root filesystem (no Rust there) and run
    /// `tracer --version`, `tracer doctor` and a 2-second `tracer attach` in it.
    #[arg(long)]
    pub installtest: bool,
}

/// The oldest glibc the binary may need: Debian 11 has 2.31, Ubuntu 20.04 2.31, RHEL 8 2.28.
const GLIBC: (u32, u32) = (2, 28);
const TARGET: &str = "x86_64-unknown-linux-gnu";
/// Pinned like bpf-linker: the versions this was written and checked with.
/// Each crate installs a program of its own name.
const CARGO_TOOLS: [(&str, &str); 2] = [("cargo-zigbuild", "0.24.1"), ("cargo-deb", "3.8.0")];
const ZIGLANG: &str = "ziglang==0.15.1";

pub fn dir() -> PathBuf {
    workspace_root().join("target/dist")
}

pub fn dist(args: &DistArgs) -> Result<()> {
    setup::ensure()?;
    let tools = tools()?;
    let bin = build(&tools)?;
    check_glibc(&bin)?;
    let version = version(&bin)?;
    let generated = dir().join("generated");
    if generated.exists() {
        fs::remove_dir_all(&generated)?;
    }
    run(Command::new(&bin)
        .arg("generate")
        .arg("--out")
        .arg(&generated))?;
    let tarball = tarball(&bin, &generated, &version)?;
    let deb = deb()?;
    eprintln!("dist: {}\ndist: {}", tarball.display(), deb.display());
    if args.installtest {
        installtest::install_and_run(&deb)?;
    }
    Ok(())
}

/// The PATH entry that puts the venv's python (with ziglang) first: cargo-zigbuild runs
/// `python3 -m ziglang` when no `zig` is on PATH.
fn tools() -> Result<PathBuf> {
    for (krate, version) in CARGO_TOOLS {
        let have = Command::new(krate)
            .arg("--version")
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(version));
        if !have {
            eprintln!("dist: installing {krate} {version} (cargo install)");
            run(Command::new("cargo").args(["install", "--locked", krate, "--version", version]))?;
        }
    }
    let venv = dir().join("tools/venv");
    let python = venv.join("bin/python3");
    // cargo-zigbuild runs `python3 -m ziglang`: that must work.
    crate::pip_venv("dist", &venv, ZIGLANG, || {
        Command::new(&python)
            .args(["-m", "ziglang", "version"])
            .output()
            .is_ok_and(|o| o.status.success())
    })?;
    Ok(venv.join("bin"))
}

fn build(tools: &Path) -> Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut paths = vec![tools.to_path_buf()];
    paths.extend(std::env::split_paths(&path));
    let glibc = format!("{TARGET}.{}.{}", GLIBC.0, GLIBC.1);
    // Not stripped by the linker: zig's takes rustc's default `--strip-debug` for a full strip,
    // which also drops the symbol table. The symbols are what a backtrace names functions
    // by, and what `tracer demo` finds its own server's request markers by (uprobes on
    // `tracer_request_start`/`_end`): the debug information alone is stripped below.
    run(cargo()
        .env("PATH", std::env::join_paths(paths)?)
        .env("CARGO_PROFILE_RELEASE_STRIP", "none")
        .args(["zigbuild", "--release", "-p", "tracer", "--target", &glibc]))?;
    let bin = workspace_root().join(format!("target/{TARGET}/release/tracer"));
    // In place, and idempotent: a build that relinks nothing leaves the binary as it was.
    run(Command::new("objcopy").arg("--strip-debug").arg(&bin))
        .context("objcopy --strip-debug (binutils) on the release binary")?;
    Ok(bin)
}

/// Fails when the binary asks for a glibc symbol version newer than GLIBC (the whole point
/// of the build), read from its dynamic symbol table.
fn check_glibc(bin: &Path) -> Result<()> {
    let table = crate::output(Command::new("objdump").arg("-T").arg(bin))
        .context("objdump -T (binutils) on the release binary")?;
    let newest = newest_glibc(&table)
        .context("the binary names no glibc symbol version: not a glibc binary?")?;
    if newest > GLIBC {
        bail!(
            "{} needs glibc {}.{}; the distribution's floor is {}.{}",
            bin.display(),
            newest.0,
            newest.1,
            GLIBC.0,
            GLIBC.1
        );
    }
    eprintln!(
        "dist: newest glibc symbol version needed: {}.{}",
        newest.0, newest.1
    );
    Ok(())
}

/// The newest `GLIBC_x.y[.z]` version in `objdump -T` output, as (x, y).
fn newest_glibc(table: &str) -> Option<(u32, u32)> {
    table
        .split_whitespace()
        .filter_map(|w| w.trim_matches(['(', ')']).strip_prefix("GLIBC_"))
        .filter_map(|v| {
            let mut parts = v.split('.').map(str::parse::<u32>);
            Some((
                parts.next()?.ok()?,
                parts.next().and_then(Result::ok).unwrap_or(0),
            ))
        })
        .max()
}

/// `tracer --version`'s version word (`tracer 0.1.0 (commit …)`).
fn version(bin: &Path) -> Result<String> {
    let out = crate::output(Command::new(bin).arg("--version")).context("tracer --version")?;
    out.split_whitespace()
        .nth(1)
        .map(String::from)
        .with_context(|| format!("unexpected `tracer --version` output: {out:?}"))
}

/// tracer-VERSION-x86_64-linux-gnu.tar.gz: a /usr/local-style tree (bin, share/man, the
/// completions where each shell looks for them, the README under share/doc), so that
/// `tar -xzf … -C /usr/local --strip-components=1` installs it.
fn tarball(bin: &Path, generated: &Path, version: &str) -> Result<PathBuf> {
    let name = format!("tracer-{version}-x86_64-linux-gnu");
    let stage = dir().join("stage");
    if stage.exists() {
        fs::remove_dir_all(&stage)?;
    }
    let root = stage.join(&name);
    let files: [(PathBuf, &str); 6] = [
        (bin.to_path_buf(), "bin/tracer"),
        (
            workspace_root().join("README.md"),
            "share/doc/tracer/README.md",
        ),
        (
            generated.join("completions/tracer"),
            "share/bash-completion/completions/tracer",
        ),
        (
            generated.join("completions/_tracer"),
            "share/zsh/site-functions/_tracer",
        ),
        (
            generated.join("completions/tracer.fish"),
            "share/fish/vendor_completions.d/tracer.fish",
        ),
        (generated.join("man1"), "share/man/man1"),
    ];
    for (from, to) in files {
        let to = root.join(to);
        fs::create_dir_all(to.parent().expect("a path under root"))?;
        run(Command::new("cp").arg("-r").arg(&from).arg(&to))?;
    }
    let tarball = dir().join(format!("{name}.tar.gz"));
    run(Command::new("tar")
        .arg("-C")
        .arg(&stage)
        .args(["--owner=0", "--group=0", "-czf"])
        .arg(&tarball)
        .arg(&name))?;
    Ok(tarball)
}

/// The .deb, from tracer/Cargo.toml's [package.metadata.deb] (the binary just built, the
/// generated man pages and completions).
fn deb() -> Result<PathBuf> {
    let out = crate::output(
        cargo()
            // The binary as built, whatever cargo-deb's default: its symbols stay (`build`).
            .args([
                "deb",
                "-p",
                "tracer",
                "--no-build",
                "--no-strip",
                "--target",
                TARGET,
            ])
            .arg("--output")
            .arg(dir()),
    )
    .context("cargo deb")?;
    // cargo-deb prints the package's path last.
    let deb = out
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| l.ends_with(".deb"))
        .map(PathBuf::from)
        .context("cargo deb named no .deb")?;
    if !deb.is_file() {
        bail!(
            "cargo deb said it wrote {}, which is not there",
            deb.display()
        );
    }
    Ok(deb)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_glibc_version_is_compared_numerically() {
        // Lines as binutils 2.40 prints them; 2.3.4 and 2.10 would sort wrongly as text.
        let table = "\
0000000000000000      DF *UND*  0000000000000000 (GLIBC_2.3.4) __memcpy_chk
0000000000000000      DF *UND*  0000000000000000 (GLIBC_2.10) sched_getcpu
0000000000000000      DF *UND*  0000000000000000  GLIBC_2.2.5 malloc
0000000000000000  w   DF *UND*  0000000000000000 (GLIBC_PRIVATE) __tunable_get_val
";
        assert_eq!(newest_glibc(table), Some((2, 10)));
        let newer = format!("{table}0000000000000000  DF *UND*  0 (GLIBC_2.34) pthread_create\n");
        assert!(newest_glibc(&newer).is_some_and(|v| v > GLIBC));
        assert_eq!(newest_glibc("no versions here"), None);
    }
}
