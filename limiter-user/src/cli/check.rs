//! `limiter check`: validates a config file the way `run` and `reload` would, without
//! loading, attaching or asking the daemon anything.

use std::{collections::BTreeMap, path::PathBuf};

use anyhow::Context as _;
use limiter_user::{config::Config, policy::ruleset};

#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    /// The config file to check (TOML).
    #[arg(long)]
    config: PathBuf,
    /// An interface `run` would be given (repeatable); as there, it overrides the
    /// config's `interfaces`.
    #[arg(long = "iface")]
    ifaces: Vec<String>,
}

/// Exit status 0 when the file would be accepted (warnings on stderr), else 1 with every
/// problem the checker finds, by file, line and field.
pub fn execute(args: CheckArgs) -> anyhow::Result<()> {
    let config = Config::load(&args.config)?;
    // What the loader checks after the file: slots, ambiguity, the per-prefix limit.
    let slots = ruleset::assign_slots(&BTreeMap::new(), &config.rules)
        .with_context(|| format!("{}: the rules", args.config.display()))?;
    let table = ruleset::compile(&config.rules, &slots)
        .with_context(|| format!("{}: the rules", args.config.display()))?;
    // Last: a file's own problems come first, whatever `run` is given.
    let ifaces = config
        .attach_targets(&args.ifaces)
        .with_context(|| args.config.display().to_string())?;
    for warning in config.tc_burst_warnings() {
        eprintln!("warning: {warning}");
    }
    println!(
        "{}: ok: {} rules; interfaces {}; xdp_mode {}, xdp_share {}; pin_dir {}; control \
         socket {}{}",
        args.config.display(),
        table.rules.len(),
        if ifaces.is_empty() {
            "none (joins the load balancer's program)".to_string()
        } else {
            ifaces.join(", ")
        },
        config.xdp_mode,
        config.xdp_share,
        config.pin_dir.display(),
        config.control_socket.display(),
        if config.fleet.is_some() {
            "; fleet mode"
        } else {
            ""
        }
    );
    Ok(())
}
