//! Command-line interface: one module per subcommand.

mod run;
mod stats;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// limiter: a kernel-path packet rate limiter for load-balancer fleets.
#[derive(Debug, Parser)]
#[command(name = "limiter", version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Load the XDP program, apply the config's rules, attach, and run until SIGINT/SIGTERM.
    Run(run::RunArgs),
    /// Print per-rule and global counters read from the pinned maps.
    Stats(stats::StatsArgs),
}

/// Where to find the pinned maps when no config is given.
pub const DEFAULT_PIN_DIR: &str = "/sys/fs/bpf/limiter";

/// `--pin-dir`, shared by the read commands.
#[derive(Debug, clap::Args)]
pub struct PinDirArg {
    /// Directory of the pinned maps (the config's `pin_dir`).
    #[arg(long, default_value = DEFAULT_PIN_DIR)]
    pub pin_dir: PathBuf,
}

pub fn execute(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Run(args) => run::execute(args),
        Command::Stats(args) => stats::execute(args),
    }
}
