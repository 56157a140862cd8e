use std::path::PathBuf;

use anyhow::Context as _;
use limiter_user::{
    config::Config,
    daemon::Daemon,
    serve::{reporter, service},
};

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Configuration file (TOML).
    #[arg(long)]
    config: PathBuf,
    /// Interface to attach to (repeatable); overrides the config's `interfaces`.
    #[arg(long = "iface")]
    ifaces: Vec<String>,
    /// Detach from the interfaces on exit. By default enforcement continues through
    /// the pinned links after the daemon exits.
    #[arg(long)]
    detach_on_exit: bool,
    /// Load this BPF object instead of the built-in one (testing, and trying a rebuilt
    /// program before an upgrade: a build the verifier refuses changes nothing).
    #[arg(long, hide = true, value_name = "PATH")]
    bpf_object: Option<PathBuf>,
}

pub fn execute(args: RunArgs) -> anyhow::Result<()> {
    // First, while the process has one thread: the variable leaves the environment.
    let notifier = limiter_service::notify::Notifier::from_env();
    let config = Config::load(&args.config)?;
    if let Some(spec) = &config.fleet {
        reporter::check_host_identity(spec)?;
    }
    let ifaces = config
        .attach_targets(&args.ifaces)
        .with_context(|| args.config.display().to_string())?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let daemon =
        Daemon::start_with_object(&args.config, config, &ifaces, args.bpf_object.as_deref())?;
    Ok(runtime.block_on(service::run(daemon, args.detach_on_exit, notifier))?)
}
