//! Shell completions and man pages generated from a binary's clap command, so that what
//! the shell offers and what `man` says are the options the binary parses, never a copy
//! that drifts. Both binaries expose them the same way: `completions SHELL` (visible, for
//! users) and a hidden `man-pages DIR` (for `cargo xtask dist`).

use std::{
    fs,
    io::{self, Write},
    path::{Path, PathBuf},
};

pub use clap_complete::Shell;

/// `completions SHELL`: the completion script for `SHELL` on stdout.
#[derive(Debug, clap::Args)]
pub struct CompletionsArgs {
    /// The shell to complete for (bash, zsh, fish, elvish, powershell).
    pub shell: Shell,
}

/// `man-pages DIR` (hidden): one roff page per command and subcommand into `DIR`, and
/// the config file's page in section 5 (`limiter.toml.5`).
#[derive(Debug, clap::Args)]
pub struct ManPagesArgs {
    /// Directory to write `NAME.8`, `NAME-SUBCOMMAND.8` and `FILE.5` into (created if missing).
    pub dir: PathBuf,
}

/// Writes the completion script of `cmd` for `shell` to `out`.
pub fn write_completions(mut cmd: clap::Command, shell: Shell, out: &mut dyn Write) {
    let name = cmd.get_name().to_string();
    clap_complete::generate(shell, &mut cmd, name, out);
}

/// The manual section of both binaries' pages: 8, system administration commands and
/// daemons, where bpftool, xdp-loader and ip put theirs (an operator's tool run as root).
pub const MAN_SECTION: &str = "8";

/// Writes a man page for `cmd` and each of its visible subcommands, recursively, into
/// `dir`: `NAME.8`, `NAME-SUBCOMMAND.8`, ... (clap_mangen titles each page by its full
/// name, as `man limiter-quota-set` finds it).
pub fn write_man_pages(cmd: clap::Command, dir: &Path) -> io::Result<()> {
    fn write(cmd: clap::Command, dir: &Path) -> io::Result<()> {
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()).cloned() {
            write(sub, dir)?;
        }
        clap_mangen::Man::new(cmd)
            .section(MAN_SECTION)
            .generate_to(dir)
            .map(drop)
    }
    fs::create_dir_all(dir)?;
    let mut cmd = cmd.disable_help_subcommand(true);
    // Full names (`demo quota list`) for every subcommand, as clap_mangen::generate_to does.
    cmd.build();
    write(cmd, dir)
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser, Subcommand};

    use super::*;

    /// A CLI shaped like the binaries': nested subcommands and a hidden one.
    #[derive(Debug, Parser)]
    #[command(name = "demo", version, about = "demo tool")]
    struct Demo {
        #[command(subcommand)]
        command: DemoCommand,
    }

    #[derive(Debug, Subcommand)]
    enum DemoCommand {
        /// Runs.
        Run {
            #[arg(long)]
            config: PathBuf,
        },
        #[command(subcommand)]
        Quota(QuotaCommand),
        #[command(hide = true)]
        Secret,
    }

    #[derive(Debug, Subcommand)]
    enum QuotaCommand {
        /// Lists.
        List,
    }

    #[test]
    fn man_pages_name_every_visible_subcommand_and_skip_hidden_ones() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        write_man_pages(Demo::command(), dir.path())?;
        let mut names = Vec::new();
        for entry in fs::read_dir(dir.path())? {
            names.push(entry?.file_name().to_string_lossy().into_owned());
        }
        names.sort();
        assert_eq!(
            names,
            ["demo-quota-list.8", "demo-quota.8", "demo-run.8", "demo.8"]
        );
        let list = fs::read_to_string(dir.path().join("demo-quota-list.8"))?;
        assert!(list.contains(".TH demo-quota-list 8"), "{list}");
        assert!(
            list.contains("demo quota list"),
            "the synopsis names the full command: {list}"
        );
        let run = fs::read_to_string(dir.path().join("demo-run.8"))?;
        assert!(run.contains("config"), "{run}");
        Ok(())
    }

    #[test]
    fn bash_completion_registers_the_binary_name() {
        let mut out = Vec::new();
        write_completions(Demo::command(), Shell::Bash, &mut out);
        let script = String::from_utf8_lossy(&out);
        assert!(script.contains("complete -F _demo"), "{script}");
    }
}
