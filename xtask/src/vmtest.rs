//! `cargo xtask vmtest`: the tracer on other kernels. Boots Debian's distro kernels under QEMU's
//! software emulation (TCG: the CPU machine's /dev/kvm is paravirtual and cannot boot a stock
//! kernel) with virtme-ng, the host's root filesystem shared read-only, and runs
//! xtask/vmtest/guest.sh inside each guest: `tracer doctor`, an exact-count check per probe
//! mode (xtask/vmtest/exact.py) and the cpu-contention demo. The guest writes result.txt
//! (key=value lines) into a directory shared read-write; the host judges from that file alone
//! (`vng` exits 255 whatever happens in the guest) and prints a table.
//!
//! Everything lives under target/vmtest and is made once: a venv with virtme-ng, private apt
//! lists (the host's apt configuration is never touched), and each kernel's vmlinuz with the
//! modules a guest needs (9p, virtio, fuse/virtiofs, overlay, netfs, fscache and their
//! dependencies), unpacked from the .deb without installing it. A second run goes straight to
//! booting.
//!
//! It builds nothing: it takes the tracer binary (`--tracer`, default target/release/tracer)
//! and tracer-testload from the same directory.

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::{as_root, output, render, run, workspace_root};

#[derive(Debug, clap::Args)]
pub struct VmtestArgs {
    /// Kernels to boot, comma-separated: 5.10 (bullseye), 6.1, 6.1-rt (bookworm), 6.12
    /// (bookworm-backports); the newest package of each series is taken.
    #[arg(long, value_delimiter = ',', default_value = "5.10,6.1,6.1-rt,6.12")]
    pub kernels: Vec<String>,
    /// The tracer binary to test (tracer-testload is taken from the same directory).
    #[arg(long)]
    pub tracer: Option<PathBuf>,
    /// Outer limit for each guest, in seconds (boot, checks and power-off). guest.sh's own
    /// step deadlines add up to 430 s, so a hung step is named before this cuts the guest off.
    #[arg(long, default_value_t = 480)]
    pub timeout: u64,
    /// Guest vCPUs.
    #[arg(long, default_value_t = 2)]
    pub cpus: u32,
    /// Guest memory (QEMU's -m syntax).
    #[arg(long, default_value = "2G")]
    pub memory: String,
    /// How long the cpu-contention demo records in each guest (3 s under TCG once gave too few
    /// requests for a verdict on 6.1).
    #[arg(long, default_value = "10s")]
    pub demo_duration: String,
    /// Report a wrong cpu-contention verdict without failing (the counts and doctor stay
    /// strict): for kernels whose timing under emulation is not yet trusted (6.1-rt).
    #[arg(long)]
    pub demo_advisory: bool,
    /// Look up the newest kernel packages again (apt-get update of the private lists), instead
    /// of reusing the kernels already unpacked.
    #[arg(long)]
    pub refresh: bool,
}

const SERIES: [&str; 4] = ["5.10", "6.1", "6.1-rt", "6.12"];

/// The private sources list: bullseye for 5.10, bookworm (the host's release) for 6.1 and
/// 6.1-rt, bookworm-backports for 6.12, from the archives the host's own apt configuration
/// uses (its main archive and its security archive).
fn sources() -> Result<String> {
    let main = host_archive("/debian")?;
    let security = host_archive("/debian-security")?;
    let line = |uri: &str, suite: &str| {
        format!(
            "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] {uri} {suite} main\n"
        )
    };
    Ok([
        line(&main, "bullseye"),
        line(&security, "bullseye-security"),
        line(&main, "bookworm"),
        line(&security, "bookworm-security"),
        line(&main, "bookworm-backports"),
    ]
    .concat())
}

/// The first archive URI in the host's apt sources (deb822 `.sources` files or one-line
/// `.list` files) whose path ends with `suffix`.
pub(crate) fn host_archive(suffix: &str) -> Result<String> {
    let mut files: Vec<PathBuf> = fs::read_dir("/etc/apt/sources.list.d")
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    files.retain(|p| p.extension().is_some_and(|x| x == "sources" || x == "list"));
    files.push("/etc/apt/sources.list".into());
    let texts: Vec<String> = files
        .iter()
        .map(|p| fs::read_to_string(p).unwrap_or_default())
        .collect();
    texts
        .iter()
        .flat_map(|t| t.lines())
        .filter_map(|l| {
            let l = l.trim();
            l.strip_prefix("URIs:").map(str::trim).or_else(|| {
                l.strip_prefix("deb ")
                    .and_then(|r| r.split_whitespace().find(|w| w.contains("://")))
            })
        })
        .flat_map(str::split_whitespace)
        .find(|u| u.trim_end_matches('/').ends_with(suffix))
        .map(String::from)
        .with_context(|| format!("no archive ending in {suffix} in the host's apt sources"))
}

/// Modules a virtme-ng guest needs (root on 9p or virtiofs, the console, the overlays on the
/// read-only root); their dependencies are added from `modinfo -F depends`.
const GUEST_MODULES: [&str; 18] = [
    "9p",
    "9pnet",
    "9pnet_virtio",
    "fuse",
    "virtiofs",
    "overlay",
    "netfs",
    "fscache",
    "virtio",
    "virtio_ring",
    "virtio_pci",
    "virtio_pci_modern_dev",
    "virtio_pci_legacy_dev",
    "virtio_mmio",
    "virtio_console",
    "virtio_blk",
    "virtio_balloon",
    "virtio_rng",
];

/// Index files kept beside the modules (depmod regenerates the rest).
const MODULE_INDEXES: [&str; 3] = [
    "modules.builtin",
    "modules.builtin.modinfo",
    "modules.order",
];

/// Host programs the guests need, with the Debian package that has each.
const HOST_TOOLS: [(&str, &str); 6] = [
    ("qemu-system-x86_64", "qemu-system-x86"),
    // virtme-ng builds its initramfs from a static busybox.
    ("busybox", "busybox-static"),
    ("/usr/sbin/modinfo", "kmod"),
    ("/usr/sbin/depmod", "kmod"),
    ("dpkg-deb", "dpkg"),
    // virtme-ng reads the kernel's version with file(1).
    ("file", "file"),
];

/// The exact-count modes of guest.sh: auto (tp_btf where BTF allows), `--probes classic`,
/// and `--btf /nonexistent/vmlinux` (no BTF: the classic fallback).
const MODES: [&str; 3] = ["auto", "classic", "nobtf"];

fn dir() -> PathBuf {
    workspace_root().join("target/vmtest")
}

fn have(program: &str) -> bool {
    if program.starts_with('/') {
        return Path::new(program).exists();
    }
    Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn host_tools() -> Result<()> {
    let mut missing: Vec<&str> = HOST_TOOLS
        .iter()
        .filter(|(probe, _)| !have(probe))
        .map(|(_, pkg)| *pkg)
        .collect();
    // The venv module's ensurepip is packaged apart (python3-venv).
    if !Command::new("python3")
        .args(["-c", "import ensurepip"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
    {
        missing.push("python3-venv");
    }
    missing.sort_unstable();
    missing.dedup();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!("vmtest: installing {} (apt)", missing.join(", "));
    run(as_root("apt-get").args(["update", "-q"]))?;
    run(as_root("apt-get")
        .env("DEBIAN_FRONTEND", "noninteractive")
        .args(["install", "-y", "-q", "--no-install-recommends"])
        .args(&missing))
}

fn venv() -> Result<PathBuf> {
    let venv = dir().join("venv");
    let vng = venv.join("bin/vng");
    crate::pip_venv("vmtest", &venv, "virtme-ng", || vng.exists())?;
    Ok(venv)
}

/// apt-get / apt-cache with the private sources list and state under target/vmtest/apt.
fn apt(program: &str) -> Command {
    let a = dir().join("apt");
    let mut c = Command::new(program);
    for (key, path) in [
        ("Dir::Etc::SourceList", a.join("sources.list")),
        ("Dir::Etc::SourceParts", PathBuf::from("/dev/null")),
        ("Dir::State::Lists", a.join("lists")),
        ("Dir::Cache", a.join("cache")),
        ("Dir::Cache::Archives", a.join("archives")),
    ] {
        c.arg("-o").arg(format!("{key}={}", path.display()));
    }
    // Downloads land in target/: no need for the _apt user's sandbox.
    c.args(["-o", "APT::Sandbox::User=root"]);
    c
}

fn apt_lists(refresh: bool) -> Result<()> {
    let a = dir().join("apt");
    for sub in ["lists/partial", "archives/partial", "cache"] {
        fs::create_dir_all(a.join(sub))?;
    }
    let sources = a.join("sources.list");
    let want = self::sources()?;
    let changed = fs::read_to_string(&sources).ok().as_deref() != Some(want.as_str());
    if changed {
        fs::write(&sources, &want)?;
    }
    let fetched = fs::read_dir(a.join("lists"))?
        .flatten()
        .any(|e| e.file_name().to_string_lossy().ends_with("_Packages"));
    if refresh || changed || !fetched {
        eprintln!(
            "vmtest: fetching the package lists (private apt state in {})",
            a.display()
        );
        run(apt("apt-get").args(["update", "-q"]))?;
    }
    Ok(())
}

/// Whether `name` is the (signed) image package of the kernel series `series`.
fn is_series(series: &str, name: &str) -> bool {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let abi = |prefix: &str, suffix: &str| {
        name.strip_prefix(prefix)
            .and_then(|r| r.strip_suffix(suffix))
            .is_some_and(digits)
    };
    match series {
        "5.10" => abi("linux-image-5.10.0-", "-amd64"),
        "6.1" => abi("linux-image-6.1.0-", "-amd64"),
        "6.1-rt" => abi("linux-image-6.1.0-", "-rt-amd64"),
        // linux-image-6.12.95+deb12-amd64, linux-image-6.12.90+deb12.1-amd64
        "6.12" => name
            .strip_prefix("linux-image-6.12.")
            .and_then(|r| r.strip_suffix("-amd64"))
            .is_some_and(|r| {
                r.starts_with(|c: char| c.is_ascii_digit())
                    && r.contains("+deb")
                    && !r.contains('-')
            }),
        _ => false,
    }
}

/// Version order of package names: digit runs compare as numbers.
fn version_key(name: &str) -> Vec<(String, u64)> {
    let mut key = Vec::new();
    let mut rest = name;
    while !rest.is_empty() {
        let split = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let (text, tail) = rest.split_at(split);
        let end = tail
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(tail.len());
        let (num, tail) = tail.split_at(end);
        key.push((text.to_string(), num.parse().unwrap_or(0)));
        rest = tail;
    }
    key
}

/// The newest image package of `series` in the private lists.
fn newest_package(series: &str) -> Result<String> {
    let names = output(apt("apt-cache").args(["pkgnames", "linux-image-"]))?;
    names
        .lines()
        .filter(|n| is_series(series, n))
        .max_by_key(|n| version_key(n))
        .map(str::to_string)
        .with_context(|| format!("no linux-image package of series {series} in the lists"))
}

/// Downloads `package`, unpacks it, and keeps vmlinuz and the guest's modules under
/// target/vmtest/kernels/KVER. Returns KVER.
fn unpack_kernel(package: &str) -> Result<String> {
    let kver = package
        .strip_prefix("linux-image-")
        .context("not an image package")?
        .to_string();
    let dest = dir().join("kernels").join(&kver);
    if dest.join(format!("boot/vmlinuz-{kver}")).exists() {
        return Ok(kver);
    }
    let work = dir().join("download");
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&work)?;
    eprintln!("vmtest: downloading {package}");
    run(apt("apt-get")
        .current_dir(&work)
        .args(["download", "-q", package]))?;
    let deb = fs::read_dir(&work)?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .context("apt-get download left no .deb")?;
    let full = work.join("root");
    run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&full))?;
    let _ = fs::remove_dir_all(&dest);
    trim(&full, &dest, &kver)?;
    fs::remove_dir_all(&work)?;
    Ok(kver)
}

/// Every module file under `dir`, by module name (`-` read as `_`, as modprobe does).
fn module_files(dir: &Path, found: &mut BTreeMap<String, PathBuf>) -> Result<()> {
    for e in fs::read_dir(dir)?.flatten() {
        let path = e.path();
        if e.file_type()?.is_dir() {
            module_files(&path, found)?;
        } else {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some((stem, _)) = name.split_once(".ko") {
                found.insert(stem.replace('-', "_"), path);
            }
        }
    }
    Ok(())
}

/// Copies vmlinuz, GUEST_MODULES with their dependencies and the index files from the
/// unpacked package `full` to `dest`, then runs depmod there.
fn trim(full: &Path, dest: &Path, kver: &str) -> Result<()> {
    let src_mods = ["lib/modules", "usr/lib/modules"]
        .iter()
        .map(|d| full.join(d).join(kver))
        .find(|d| d.exists())
        .context("the package has no modules directory")?;
    let dest_mods = dest.join("lib/modules").join(kver);
    fs::create_dir_all(dest.join("boot"))?;
    fs::create_dir_all(&dest_mods)?;
    let vmlinuz = format!("boot/vmlinuz-{kver}");
    fs::copy(full.join(&vmlinuz), dest.join(&vmlinuz)).context("copying vmlinuz")?;
    for index in MODULE_INDEXES {
        if src_mods.join(index).exists() {
            fs::copy(src_mods.join(index), dest_mods.join(index))?;
        }
    }
    let mut all = BTreeMap::new();
    module_files(&src_mods, &mut all)?;
    let mut queue: VecDeque<String> = GUEST_MODULES.iter().map(|m| m.to_string()).collect();
    let mut kept = BTreeSet::new();
    while let Some(name) = queue.pop_front() {
        let name = name.replace('-', "_");
        let Some(path) = all.get(&name) else {
            continue; // built in, or not in this kernel
        };
        if !kept.insert(name) {
            continue;
        }
        let deps = output(
            Command::new("/usr/sbin/modinfo")
                .args(["-F", "depends"])
                .arg(path),
        )?;
        queue.extend(
            deps.trim()
                .split(',')
                .filter(|d| !d.is_empty())
                .map(str::to_string),
        );
        let to = dest_mods.join(path.strip_prefix(&src_mods)?);
        fs::create_dir_all(to.parent().expect("a module's directory"))?;
        fs::copy(path, &to)?;
    }
    eprintln!(
        "vmtest: kept {} of {} modules of {kver}: {}",
        kept.len(),
        all.len(),
        kept.iter().cloned().collect::<Vec<_>>().join(" ")
    );
    run(Command::new("/usr/sbin/depmod")
        .arg("-b")
        .arg(dest)
        .arg(kver))
}

/// The kernel release of `series`, unpacked: the one cached (kernels/SERIES.release) unless
/// `refresh`, else the newest in the lists.
fn kernel(series: &str, refresh: bool, lists_ready: &mut bool) -> Result<String> {
    let kernels = dir().join("kernels");
    fs::create_dir_all(&kernels)?;
    let pointer = kernels.join(format!("{series}.release"));
    if !refresh && let Ok(kver) = fs::read_to_string(&pointer) {
        let kver = kver.trim();
        if kernels
            .join(kver)
            .join(format!("boot/vmlinuz-{kver}"))
            .exists()
        {
            return Ok(kver.to_string());
        }
    }
    if !*lists_ready {
        apt_lists(refresh)?;
        *lists_ready = true;
    }
    let package = newest_package(series)?;
    let kver = unpack_kernel(&package)?;
    fs::write(&pointer, format!("{kver}\n"))?;
    Ok(kver)
}

struct Outcome {
    series: String,
    kver: String,
    seconds: f64,
    result: BTreeMap<String, String>,
    failures: Vec<String>,
    /// What the first boot failed, when this is the second.
    first_boot: Vec<String>,
}

/// What is wrong in a guest's result.txt (empty: every check passed).
fn judge(result: &BTreeMap<String, String>, kver: &str) -> Vec<String> {
    let get = |k: &str| result.get(k).map_or("-", String::as_str);
    let mut failures = Vec::new();
    if result.is_empty() {
        failures.push("no result.txt: the guest did not run the script".into());
        return failures;
    }
    if get("complete") != "yes" {
        failures.push("the guest script did not finish".into());
    }
    if get("uname") != kver {
        failures.push(format!("uname -r is {}, not {kver}", get("uname")));
    }
    if get("btf") != "yes" {
        failures.push("no /sys/kernel/btf/vmlinux".into());
    }
    if get("doctor_rc") != "0" {
        failures.push(format!("tracer doctor exited {}", get("doctor_rc")));
    }
    if get("doctor_counters") != "yes" {
        failures
            .push("the scheduler programs did not pass the verifier with the counter reads".into());
    }
    for mode in MODES {
        if get(&format!("exact_{mode}")) != "yes" {
            failures.push(format!(
                "{mode}: counts not exact (probe mode {}): {}",
                get(&format!("probe_{mode}")),
                get(&format!("exact_{mode}_error"))
            ));
        }
    }
    for mode in ["classic", "nobtf"] {
        let probe = get(&format!("probe_{mode}"));
        if probe != "classic" && probe != "-" {
            failures.push(format!("{mode}: probe mode {probe}, not classic"));
        }
    }
    if get("demo_primary") != "scheduling" || get("demo_primary") != get("demo_expected") {
        failures.push(format!(
            "demo cpu-contention: verdict {}, expected {} (rc {})",
            get("demo_primary"),
            get("demo_expected"),
            get("demo_rc")
        ));
    }
    failures
}

fn boot(
    args: &VmtestArgs,
    venv: &Path,
    series: &str,
    kver: &str,
    tracer: &Path,
    testload: &Path,
) -> Result<Outcome> {
    let out = dir().join("out").join(kver);
    let _ = fs::remove_dir_all(&out);
    fs::create_dir_all(&out)?;
    let guest = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("vmtest/guest.sh");
    let exec = format!(
        "sh '{}' '{}' '{}' '{}' '{}'",
        guest.display(),
        tracer.display(),
        testload.display(),
        out.display(),
        args.demo_duration
    );
    let vmlinuz = dir()
        .join("kernels")
        .join(kver)
        .join(format!("boot/vmlinuz-{kver}"));
    // vng runs virtme-run from PATH.
    let path = format!(
        "{}:{}",
        venv.join("bin").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let console = fs::File::create(out.join("console.log"))?;
    let mut cmd = Command::new("timeout");
    cmd.current_dir(workspace_root())
        .env("PATH", path)
        .arg("--kill-after=10")
        .arg(args.timeout.to_string())
        .arg(venv.join("bin/vng"))
        .arg("--disable-kvm")
        // The kernel's log on the console: a frozen guest's last words (a soft lockup, an RCU
        // stall) are then in console.log, which a failure prints.
        .arg("--verbose")
        // TCG's TSC fails the kernel's stability checks, and the fallback, the HPET, is an
        // emulated device: every clock read (the tracer's clock helper at every traced event)
        // is an MMIO exit under QEMU's global lock. Guests then crawled under load and two of
        // two boots froze outright (no step's deadline fired) with the demo's four hogs.
        .args(["--append", "tsc=reliable clocksource=tsc"])
        // One host thread for all vCPUs (TCG's default runs one per vCPU). Attaching or
        // detaching a tracepoint program patches the kernel's text (a jump label, int3 first),
        // and with a thread per vCPU another vCPU can still run the old translation of the
        // patched bytes after the patch completed: two 6.12 boots of one CI run (2026-12-06)
        // died of "Oops: int3" at the sched_waking and sched_wakeup sites as a program was
        // attached or detached, while three boots of the same build passed on a quiet host.
        .arg("--qemu-opts=-accel tcg,thread=single")
        .arg("--run")
        .arg(&vmlinuz)
        .args(["--cpus", &args.cpus.to_string(), "--memory", &args.memory])
        .arg("--rwdir")
        .arg(&out)
        .arg("--exec")
        .arg(&exec)
        .stdin(Stdio::null())
        .stdout(console.try_clone()?)
        .stderr(console);
    eprintln!(
        "vmtest: booting {kver} (TCG, {} vCPUs, {}; console in {})",
        args.cpus,
        args.memory,
        out.join("console.log").display()
    );
    eprintln!("xtask: $ {}", render(&cmd));
    let start = Instant::now();
    // vng exits 255 whatever the guest did: judge from result.txt.
    let mut child = cmd.spawn().context("starting vng")?;
    let (status, frozen) = watch(&mut child, &out.join("result.txt"))?;
    let seconds = start.elapsed().as_secs_f64();
    let result: BTreeMap<String, String> = fs::read_to_string(out.join("result.txt"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let mut failures = judge(&result, kver);
    if args.demo_advisory {
        failures.retain(|f| {
            let demo = f.starts_with("demo ");
            if demo {
                eprintln!("vmtest: {kver}: {f} (advisory: not a failure with --demo-advisory)");
            }
            !demo
        });
    }
    if frozen {
        failures.push(format!(
            "the guest froze: result.txt unchanged for {} s (no step's own deadline fired)",
            STALL.as_secs()
        ));
    } else if matches!(status.code(), Some(124 | 137)) {
        failures.push(format!("the guest ran past {} s", args.timeout));
    }
    if !failures.is_empty() {
        show_logs(&out, &result);
    }
    Ok(Outcome {
        series: series.to_string(),
        kver: kver.to_string(),
        seconds,
        result,
        failures,
        first_boot: Vec::new(),
    })
}

/// How long result.txt may stay unchanged: the longest step's own deadline (the demo's 120 s)
/// and some. Past it the guest itself has stopped (seen in CI twice, each time while the
/// tracer attached its classic programs under emulation, on 5.10 and 6.1; the guest's own
/// `timeout` never fired), so waiting out the whole limit would tell nothing more.
const STALL: Duration = Duration::from_secs(150);

/// Waits for the guest, killing it when result.txt has not changed for `STALL`: its status,
/// and whether it was killed so.
fn watch(
    child: &mut std::process::Child,
    result: &Path,
) -> Result<(std::process::ExitStatus, bool)> {
    let stamp = || {
        fs::metadata(result)
            .ok()
            .map(|m| (m.len(), m.modified().ok()))
    };
    let (mut last, mut since) = (stamp(), Instant::now());
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok((status, false));
        }
        let now = stamp();
        if now != last {
            (last, since) = (now, Instant::now());
        } else if last.is_some() && since.elapsed() > STALL {
            // SIGTERM to `timeout`, which passes it on to vng and qemu.
            // SAFETY: kill(2) on our own child.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            return Ok((child.wait()?, true));
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// Prints the end of the logs a failed guest left, so that a CI log alone says what went
/// wrong: the step timings, each check's log and the console.
fn show_logs(out: &Path, result: &BTreeMap<String, String>) {
    let steps: Vec<String> = result
        .iter()
        .filter(|(k, _)| k.starts_with("t_") || k.ends_with("_rc"))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    eprintln!("vmtest: step starts and exit codes: {}", steps.join(" "));
    let mut names = vec!["doctor.txt".to_string()];
    names.extend(MODES.iter().map(|m| format!("exact-{m}.log")));
    names.extend(["demo.stderr".to_string(), "console.log".to_string()]);
    for name in names {
        let Ok(text) = fs::read_to_string(out.join(&name)) else {
            continue;
        };
        let lines: Vec<&str> = text.lines().collect();
        let tail = &lines[lines.len().saturating_sub(15)..];
        eprintln!("vmtest: --- {name} (last {} lines) ---", tail.len());
        for l in tail {
            eprintln!("    {l}");
        }
    }
}

fn table(outcomes: &[Outcome]) {
    let mut rows = vec![vec![
        "kernel".to_string(),
        "time".into(),
        "doctor".into(),
        "probe mode".into(),
        "counts exact: auto / classic / nobtf".into(),
        "demo verdict".into(),
        "result".into(),
    ]];
    for o in outcomes {
        let get = |k: &str| o.result.get(k).map_or("-", String::as_str).to_string();
        let doctor = match get("doctor_rc").as_str() {
            "0" => "ok".to_string(),
            "-" => "-".to_string(),
            rc => format!("exit {rc}"),
        };
        let exact = MODES
            .iter()
            .map(|m| {
                format!(
                    "{} ({})",
                    get(&format!("exact_{m}")),
                    get(&format!("probe_{m}"))
                )
            })
            .collect::<Vec<_>>()
            .join(" / ");
        rows.push(vec![
            format!("{} ({})", o.kver, o.series),
            if !o.first_boot.is_empty() {
                format!("{:.0} s (2nd boot: 1st failed)", o.seconds)
            } else {
                format!("{:.0} s", o.seconds)
            },
            doctor,
            get("probe_auto"),
            exact,
            get("demo_primary"),
            if o.failures.is_empty() {
                "PASS"
            } else {
                "FAIL"
            }
            .into(),
        ]);
    }
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|c| rows.iter().map(|r| r[c].len()).max().unwrap_or(0))
        .collect();
    for (i, row) in rows.iter().enumerate() {
        let line = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect::<Vec<_>>()
            .join(" | ");
        println!("{}", line.trim_end());
        if i == 0 {
            let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
            println!("{}", rule.join("-|-"));
        }
    }
    for o in outcomes {
        for f in &o.first_boot {
            println!("{}: 1st boot: {f}", o.kver);
        }
        for f in &o.failures {
            println!("{}: {f}", o.kver);
        }
    }
}

pub fn vmtest(args: &VmtestArgs) -> Result<()> {
    if args.tracer.is_none() {
        crate::setup::ensure()?;
        run(crate::cargo().args(["build", "--release", "-p", "tracer"]))?;
        run(crate::cargo().args([
            "build",
            "--release",
            "-p",
            "tracer-tests",
            "--bin",
            "tracer-testload",
        ]))?;
    }
    let tracer = args
        .tracer
        .clone()
        .unwrap_or_else(|| workspace_root().join("target/release/tracer"));
    let tracer = tracer
        .canonicalize()
        .with_context(|| format!("the tracer binary {} (build it first)", tracer.display()))?;
    let testload = tracer.with_file_name("tracer-testload");
    if !testload.exists() {
        bail!(
            "{} is missing (build tracer-testload first)",
            testload.display()
        );
    }
    for series in &args.kernels {
        if !SERIES.contains(&series.as_str()) {
            bail!("unknown kernel series {series} ({})", SERIES.join(", "));
        }
    }
    host_tools()?;
    let venv = venv()?;
    let mut lists_ready = false;
    let mut kernels = Vec::new();
    for series in &args.kernels {
        kernels.push((
            series.clone(),
            kernel(series, args.refresh, &mut lists_ready)?,
        ));
    }
    let mut outcomes = Vec::new();
    for (series, kver) in &kernels {
        let mut o = boot(args, &venv, series, kver, &tracer, &testload)?;
        if !o.failures.is_empty() {
            // Under emulation a guest has frozen outright (twice in CI, while the tracer
            // attached its classic programs: no step's own deadline fired) and a TCG clock has
            // read a quarter of the truth: one bad boot is said, with its logs (above) and in
            // the table, and the kernel booted once more; failing twice fails it.
            eprintln!(
                "vmtest: {kver}: the first boot failed ({}); booting it once more",
                o.failures.join("; ")
            );
            let first = o.failures;
            // The second boot starts from an empty output folder: keep the first's beside it.
            let out = dir().join("out");
            let kept = out.join(format!("{kver}.1st-boot"));
            let _ = fs::remove_dir_all(&kept);
            let _ = fs::rename(out.join(kver), &kept);
            o = boot(args, &venv, series, kver, &tracer, &testload)?;
            o.first_boot = first;
        }
        eprintln!(
            "vmtest: {kver}: {} in {:.0} s",
            if o.failures.is_empty() {
                "pass"
            } else {
                "FAIL"
            },
            o.seconds
        );
        outcomes.push(o);
    }
    table(&outcomes);
    println!(
        "guest outputs: {}/out/KERNEL (result.txt, doctor.txt, exact-*.json, demo.json, console.log; \
         KERNEL.1st-boot beside it after a retry)",
        dir().display()
    );
    let failed = outcomes.iter().filter(|o| !o.failures.is_empty()).count();
    if failed > 0 {
        bail!("{failed} of {} kernels failed a check", outcomes.len());
    }
    Ok(())
}
