use std::path::PathBuf;

use anyhow::{bail, Context as _};
use limiter_user::{config::Config, daemon::Daemon};
use tokio::{
    signal::unix::{signal, SignalKind},
    sync::broadcast,
    task::JoinSet,
};

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Configuration file (TOML).
    #[arg(long)]
    config: PathBuf,
    /// Interface to attach to (repeatable); overrides the config's `interfaces`.
    #[arg(long = "iface")]
    ifaces: Vec<String>,
}

pub fn execute(args: RunArgs) -> anyhow::Result<()> {
    let config = Config::load(&args.config)?;
    let ifaces = if args.ifaces.is_empty() {
        config.interfaces.clone()
    } else {
        args.ifaces
    };
    if ifaces.is_empty() {
        bail!(
            "no interface to attach to: set `interfaces` in {} or pass --iface",
            args.config.display()
        );
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(serve(config, ifaces))
}

async fn serve(config: Config, ifaces: Vec<String>) -> anyhow::Result<()> {
    let mut daemon = Daemon::start(&config, &ifaces)?;
    let (shutdown_tx, _) = broadcast::channel::<()>(1);
    let mut signals = JoinSet::new();
    for kind in [SignalKind::interrupt(), SignalKind::terminate()] {
        let tx = shutdown_tx.clone();
        let mut stream = signal(kind).context("installing a signal handler")?;
        signals.spawn(async move {
            stream.recv().await;
            tracing::info!(signal = ?kind, "shutting down");
            let _ = tx.send(());
        });
    }
    let mut shutdown = shutdown_tx.subscribe();
    let _ = shutdown.recv().await;
    signals.abort_all();
    daemon.stop()?;
    Ok(())
}
