//! Builds the eBPF object (`tracer-ebpf`) with aya-build and leaves it in OUT_DIR, where
//! `include_bytes_aligned!` embeds it in the binary. Needs the nightly toolchain with rust-src
//! and bpf-linker: `cargo xtask setup` installs both.

use anyhow::{Context as _, anyhow};
use aya_build::Toolchain;

fn main() -> anyhow::Result<()> {
    let cargo_metadata::Metadata { packages, .. } = cargo_metadata::MetadataCommand::new()
        .no_deps()
        .exec()
        .context("cargo metadata")?;
    let ebpf = packages
        .into_iter()
        .find(|p| p.name.as_str() == "tracer-ebpf")
        .ok_or_else(|| anyhow!("tracer-ebpf package not found in the workspace"))?;
    let root_dir = ebpf
        .manifest_path
        .parent()
        .ok_or_else(|| anyhow!("tracer-ebpf manifest has no parent directory"))?;
    // aya-build skips the eBPF build under AYA_BUILD_SKIP=1 (used by `cargo xtask clippy` so
    // lints run without bpf-linker); leave an empty object so include_bytes still compiles.
    let out = std::path::PathBuf::from(std::env::var_os("OUT_DIR").context("OUT_DIR")?);
    let object = out.join("tracer-probes");
    if !object.exists() {
        std::fs::write(&object, []).context("placeholder eBPF object")?;
    }
    // aya-build watches the eBPF crate's directory; the shared types are compiled into the
    // object too.
    let common = root_dir
        .parent()
        .map(|ws| ws.join("tracer-common"))
        .ok_or_else(|| anyhow!("workspace root"))?;
    println!("cargo:rerun-if-changed={common}");
    // aya-build relays every line the nested cargo prints as a cargo warning; a quiet nested
    // cargo keeps builds free of warnings that are not warnings (errors still come through).
    // SAFETY: build scripts are single-threaded.
    unsafe { std::env::set_var("CARGO_TERM_QUIET", "true") };
    git_commit(root_dir.as_std_path());
    aya_build::build_ebpf(
        [aya_build::Package {
            name: ebpf.name.as_str(),
            root_dir: root_dir.as_str(),
            ..Default::default()
        }],
        Toolchain::default(),
    )
    .context(
        "building the eBPF programs failed; `cargo xtask setup` installs what they need \
         (nightly + rust-src, bpf-linker built against LLVM 22)",
    )?;
    ebpf_id(&object);
    Ok(())
}

/// `TRACER_GIT_COMMIT`: the commit the binary was built from (`-dirty` with uncommitted
/// changes; `unknown` outside a git checkout, as in a source tarball).
fn git_commit(ebpf_dir: &std::path::Path) {
    let ws = ebpf_dir.parent().unwrap_or(ebpf_dir);
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .arg("-C")
            .arg(ws)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let commit = match git(&["rev-parse", "--short=12", "HEAD"]) {
        Some(c) => {
            let dirty = git(&["status", "--porcelain", "--untracked-files=no"])
                .is_some_and(|s| !s.is_empty());
            if dirty { format!("{c}-dirty") } else { c }
        }
        None => "unknown".into(),
    };
    println!("cargo:rustc-env=TRACER_GIT_COMMIT={commit}");
    for f in ["HEAD", "index"] {
        let p = ws.join(".git").join(f);
        if p.exists() {
            println!("cargo:rerun-if-changed={}", p.display());
        }
    }
}

/// `TRACER_EBPF_ID`: the first 16 hex digits of the embedded eBPF object's SHA-256, which
/// says which programs a binary (and a trace file it wrote) carried.
fn ebpf_id(object: &std::path::Path) {
    use sha2::Digest as _;
    let bytes = std::fs::read(object).unwrap_or_default();
    let hash = sha2::Sha256::digest(&bytes);
    let hex: String = hash.iter().take(8).map(|b| format!("{b:02x}")).collect();
    println!("cargo:rustc-env=TRACER_EBPF_ID={hex}");
}
