//! Command-line interface: one module per subcommand. `run` is the daemon; the others
//! ask it over the control socket, except `stats`, `top` and `monitor`, which read the
//! pinned maps directly (they work even when the daemon is down).

mod bypass;
mod check;
mod detach;
mod explain;
mod monitor;
mod quota;
mod reload;
mod run;
mod stats;
mod status;
mod top;

use std::path::PathBuf;

use anyhow::Context as _;
use clap::{CommandFactory as _, Parser, Subcommand};
use limiter_service::cli_docs::{self, CompletionsArgs, ManPagesArgs};
use limiter_user::config::{DEFAULT_CONTROL_SOCKET, DEFAULT_PIN_DIR};

/// limiter: a kernel-path packet rate limiter for load-balancer fleets.
#[derive(Debug, Parser)]
#[command(
    name = "limiter",
    version,
    about,
    after_help = limiter_service::exit::HELP
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    pub log: limiter_service::logging::LogArgs,
}

impl Cli {
    /// `check` exits 0 or 1 only (see [`limiter_service::exit::Exit`]).
    pub fn is_check(&self) -> bool {
        matches!(self.command, Command::Check(_))
    }
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Load the XDP program, apply the config's rules, attach, and serve until
    /// SIGINT/SIGTERM (SIGHUP reloads the config).
    Run(run::RunArgs),
    /// Show the daemon's interfaces, links, rule generation and uptime.
    Status(status::StatusArgs),
    /// Print per-rule and global counters read from the pinned maps.
    Stats(stats::StatsArgs),
    /// A live view of the pinned maps: per rule, passed/dropped/would-drop per second,
    /// the rate in force and the share state; `t` shows totals, `q` quits.
    Top(top::TopArgs),
    /// The sampled refusals as they happen, one line each (or `--json`, `--pcap`): what
    /// is dropped, by which rule and why. Reads the pinned maps; no daemon needed.
    Monitor(monitor::MonitorArgs),
    /// List or change rule quotas at runtime.
    #[command(subcommand)]
    Quota(quota::QuotaCommand),
    /// Re-read the config file; an invalid file changes nothing. Prints the rules added,
    /// removed and changed, and whose buckets start over (`--dry-run`: only prints it).
    Reload(reload::ReloadArgs),
    /// Why was I throttled? The rule a frame meets, its buckets, recent drops, and
    /// whether a frame sent now would pass.
    Explain(explain::ExplainArgs),
    /// Detach from every interface and remove every pin (maps and counters too).
    Detach(detach::DetachArgs),
    /// The kill switch: `on` passes every frame unmetered at once, `off` enforces again
    /// (through the daemon, or the pinned maps when none runs); no argument shows it.
    Bypass(bypass::BypassArgs),
    /// Check a config file as `run` and `reload` would, changing nothing: exit status 0
    /// when it would be accepted, 1 with every problem (file, line, field) when not.
    Check(check::CheckArgs),
    /// Print a shell completion script, e.g. `limiter completions bash`.
    Completions(CompletionsArgs),
    /// Write the man pages into a directory (packaging: `cargo xtask dist`).
    #[command(hide = true)]
    ManPages(ManPagesArgs),
}

/// `--socket`, shared by the commands that talk to the daemon.
#[derive(Debug, clap::Args)]
pub struct SocketArg {
    /// The daemon's control socket (the config's `control_socket`).
    #[arg(long, default_value = DEFAULT_CONTROL_SOCKET)]
    pub socket: PathBuf,
}

/// `--pin-dir`, for the commands that read pins directly.
#[derive(Debug, clap::Args)]
pub struct PinDirArg {
    /// Directory of the pinned maps (the config's `pin_dir`).
    #[arg(long, default_value = DEFAULT_PIN_DIR)]
    pub pin_dir: PathBuf,
}

pub fn execute(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Run(args) => run::execute(args),
        Command::Status(args) => status::execute(args),
        Command::Stats(args) => stats::execute(args),
        Command::Top(args) => top::execute(args),
        Command::Monitor(args) => monitor::execute(args),
        Command::Quota(cmd) => quota::execute(cmd),
        Command::Reload(args) => reload::execute(args),
        Command::Explain(args) => explain::execute(args),
        Command::Detach(args) => detach::execute(args),
        Command::Bypass(args) => bypass::execute(args),
        Command::Check(args) => check::execute(args),
        Command::Completions(args) => {
            cli_docs::write_completions(Cli::command(), args.shell, &mut std::io::stdout());
            Ok(())
        }
        Command::ManPages(args) => cli_docs::write_man_pages(Cli::command(), &args.dir)
            .and_then(|()| {
                limiter_user::config::schema::REFERENCE
                    .write_man_page(env!("CARGO_PKG_VERSION"), &args.dir)
            })
            .with_context(|| format!("writing man pages into {}", args.dir.display())),
    }
}

/// Prints `value` as JSON on one line.
pub fn print_json(value: &serde_json::Value) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string(value)?);
    Ok(())
}
