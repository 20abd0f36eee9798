//! `tracer generate --out DIR`: the shell completions (bash, zsh, fish) and man pages (one for
//! `tracer`, one for each visible subcommand) made from the CLI definition itself, so they
//! cannot drift from it. `cargo xtask dist` packages them; hidden from `--help`.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};
use clap::{Args, CommandFactory as _};
use clap_complete::Shell;

use crate::trace::writer::write_atomic;

#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// The directory to write into (created if missing): completions/ and man1/ under it.
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
}

/// The shells completions are written for, and where each expects its file's name.
const SHELLS: [(Shell, &str); 3] = [
    (Shell::Bash, "tracer"),
    (Shell::Zsh, "_tracer"),
    (Shell::Fish, "tracer.fish"),
];

pub fn run(args: GenerateArgs) -> Result<()> {
    let completions = args.out.join("completions");
    let man = args.out.join("man1");
    for dir in [&args.out, &completions, &man] {
        make_dir(dir)?;
    }
    let mut cmd = super::Cli::command();
    // Subcommands get their full names (`tracer attach`) in usage lines and man pages.
    cmd.build();
    for (shell, name) in SHELLS {
        let mut script = Vec::new();
        clap_complete::generate(shell, &mut cmd.clone(), "tracer", &mut script);
        write(&completions.join(name), &script)?;
    }
    write(&man.join("tracer.1"), &page(&cmd)?)?;
    // clap's own `help` subcommand needs no page of its own.
    let documented = |s: &&clap::Command| !s.is_hide_set() && s.get_name() != "help";
    for sub in cmd.get_subcommands().filter(documented) {
        let name = format!("tracer-{}.1", sub.get_name());
        write(&man.join(name), &page(sub)?)?;
    }
    Ok(())
}

fn page(cmd: &clap::Command) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    clap_mangen::Man::new(cmd.clone())
        .render(&mut out)
        .context("rendering a man page")?;
    Ok(out)
}

fn make_dir(dir: &Path) -> Result<()> {
    match std::fs::symlink_metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => bail!(
            "{} exists and is not a directory; give --out a directory or a new path",
            dir.display()
        ),
        Err(_) => std::fs::create_dir(dir)
            .with_context(|| format!("creating the directory {}", dir.display())),
    }
}

fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    write_atomic(path, bytes, crate::trace::output::Kind::Any)?;
    // write_atomic makes private files (traces hold other processes' data); these are for
    // everyone to read.
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644))
        .with_context(|| format!("making {} readable", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_and_completions_cover_the_visible_commands() {
        let out = std::env::temp_dir().join(format!("tracer-generate-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&out);
        run(GenerateArgs { out: out.clone() }).expect("generate");
        let read = |p: &str| std::fs::read_to_string(out.join(p)).unwrap_or_default();
        // Each visible subcommand has a page naming its options; hidden ones have none.
        assert!(read("man1/tracer.1").contains("attach"));
        assert!(read("man1/tracer-attach.1").contains("\\-\\-pid"));
        assert!(read("man1/tracer-watch.1").contains("\\-\\-prometheus"));
        assert!(!out.join("man1/tracer-workload.1").exists());
        assert!(!out.join("man1/tracer-help.1").exists());
        for (path, needle) in [
            ("completions/tracer", "--duration"),
            ("completions/_tracer", "--duration"),
            ("completions/tracer.fish", "duration"),
        ] {
            assert!(read(path).contains(needle), "{path} lacks {needle}");
        }
        // A file where the directory should be is refused, not replaced.
        let file = out.join("completions/tracer");
        let err = run(GenerateArgs { out: file.clone() }).expect_err("a file as --out");
        assert!(format!("{err:#}").contains("not a directory"), "{err:#}");
        assert!(std::fs::read_to_string(&file).is_ok_and(|s| s.contains("--duration")));
        std::fs::remove_dir_all(&out).expect("clean up");
    }
}
