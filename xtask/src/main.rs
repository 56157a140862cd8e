//! `cargo xtask <task>`: the project's own commands. Every task that builds runs `setup`
//! first, so a fresh machine needs nothing but this repository.

mod bench;
mod setup;

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _, Result};
use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "xtask")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Debug, Subcommand)]
enum Task {
    /// Install what this machine lacks: nightly rust-src, LLVM 22, bpf-linker, bpftool,
    /// iproute2, nftables. Idempotent; quick when everything is present.
    Setup,
    /// Build the XDP program and the `limiter` binary (release).
    Build,
    /// Build, then run the daemon: `cargo xtask run -- --config F --iface IF`.
    Run {
        /// Arguments for `limiter run`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Run every test: host unit/property tests, then the kernel tests (root).
    Test,
    /// BPF_PROG_TEST_RUN cost per frame against a trivial XDP program (a benchmark).
    Bench,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.task {
        Task::Setup => setup::run(),
        Task::Build => {
            setup::run()?;
            build()
        }
        Task::Run { args } => {
            if args.is_empty() {
                bail!(
                    "usage: cargo xtask run -- --config FILE [--iface IF]...\n\
                     (limiter.example.toml in the repository is a starting point)"
                );
            }
            setup::run()?;
            build()?;
            let binary = workspace_root()?.join("target/release/limiter");
            let mut cmd = Command::new(binary);
            cmd.arg("run").args(&args);
            run_cmd(&mut cmd)
        }
        Task::Test => {
            setup::run()?;
            test()
        }
        Task::Bench => {
            setup::run()?;
            bench::run()
        }
    }
}

pub fn workspace_root() -> Result<PathBuf> {
    let manifest = std::env::var("CARGO_MANIFEST_DIR").context("CARGO_MANIFEST_DIR not set")?;
    Path::new(&manifest)
        .parent()
        .map(Path::to_path_buf)
        .context("xtask has no parent directory")
}

pub fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    if let Ok(root) = workspace_root() {
        cmd.current_dir(root);
    }
    cmd
}

pub fn run_cmd(cmd: &mut Command) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("could not start {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

fn build() -> Result<()> {
    run_cmd(cargo().args(["build", "--release", "--package", "limiter-user"]))
}

fn test() -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc_geteuid() } != 0 {
        bail!(
            "the kernel tests load XDP programs and create network namespaces: \
             run `cargo xtask test` as root"
        );
    }
    // Host tests of pure logic first: they fail fast and need nothing from the kernel.
    run_cmd(cargo().args([
        "test",
        "--release",
        "--workspace",
        "--exclude",
        "limiter-tests",
    ]))?;
    // Kernel tests one at a time: they time real traffic on a 2-CPU machine.
    run_cmd(cargo().args([
        "test",
        "--release",
        "--package",
        "limiter-tests",
        "--",
        "--test-threads=1",
    ]))
}

unsafe extern "C" {
    #[link_name = "geteuid"]
    fn libc_geteuid() -> u32;
}
