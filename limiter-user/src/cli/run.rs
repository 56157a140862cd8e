use std::{
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::{bail, Context as _};
use limiter_user::{
    config::Config,
    control::{self, Shutdown},
    daemon::Daemon,
    metrics,
};
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
    let config = Config::load(&args.config)?;
    if let Some(spec) = &config.fleet {
        limiter_user::fleet::check_host_identity(spec)?;
    }
    let ifaces = if args.ifaces.is_empty() {
        config.interfaces.clone()
    } else {
        args.ifaces.clone()
    };
    let joins = matches!(
        config.handoff,
        Some(limiter_user::config::HandoffSpec::Join { .. })
    );
    if ifaces.is_empty() && !joins {
        bail!(
            "no interface to attach to: set `interfaces` in {} or pass --iface",
            args.config.display()
        );
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(serve(args, config, ifaces))
}

async fn serve(args: RunArgs, config: Config, ifaces: Vec<String>) -> anyhow::Result<()> {
    let socket_path = config.control_socket.clone();
    let metrics_addr = config.metrics;
    let fleet_spec = config.fleet.clone();
    let daemon =
        Daemon::start_with_object(&args.config, config, &ifaces, args.bpf_object.as_deref())?;
    let daemon = Arc::new(Mutex::new(daemon));
    let (shutdown, mut shutdown_rx) = broadcast::channel::<Shutdown>(4);
    let mut tasks = JoinSet::new();

    for kind in [SignalKind::interrupt(), SignalKind::terminate()] {
        let tx = shutdown.clone();
        let mut stream = signal(kind).context("installing a signal handler")?;
        tasks.spawn(async move {
            stream.recv().await;
            tracing::info!(signal = ?kind, "shutting down");
            let _ = tx.send(Shutdown::Exit);
        });
    }
    let mut hangup = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;
    let d = Arc::clone(&daemon);
    tasks.spawn(async move {
        while hangup.recv().await.is_some() {
            let result = d.lock().map(|mut d| d.reload());
            match result {
                Ok(Ok(r)) => tracing::info!(rules = r.rules, "SIGHUP: config reloaded"),
                Ok(Err(e)) => tracing::error!("SIGHUP: reload refused, rules unchanged: {e}"),
                Err(_) => tracing::error!("SIGHUP: daemon state poisoned"),
            }
        }
    });
    let d = Arc::clone(&daemon);
    tasks.spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tick.tick().await;
            if let Ok(mut d) = d.lock() {
                if let Err(e) = d.record_history() {
                    tracing::warn!("sampling counters: {e}");
                }
                if let Err(e) = d.follow_handoff() {
                    tracing::warn!("following next_program: {e}");
                }
            }
        }
    });
    let listener = daemon
        .lock()
        .map_err(|_| anyhow::anyhow!("daemon state poisoned"))?
        .take_control_listener()
        .context("the control socket was already taken")?;
    let listener = control::listen(listener)?;
    tracing::info!(socket = %socket_path.display(), "control socket listening");
    tasks.spawn(control::serve(
        listener,
        Arc::clone(&daemon),
        shutdown.clone(),
    ));
    if let Some(addr) = metrics_addr {
        let (d, tx) = (Arc::clone(&daemon), shutdown.clone());
        tasks.spawn(async move {
            // A metrics failure must not stop enforcement: log it and carry on.
            if let Err(e) = metrics::serve(addr, d, tx).await {
                tracing::error!("metrics endpoint disabled: {e}");
            }
        });
    }

    if let Some(spec) = fleet_spec {
        tracing::info!(allocator = %spec.allocator, host = %spec.host_id, "fleet mode: reporting to the allocator");
        let (d, tx) = (Arc::clone(&daemon), shutdown.clone());
        tasks.spawn(async move {
            // The report loop ends only on a local fault; enforcement carries on, and the
            // shares age through STICKY and FAIL_OPEN in the kernel on their deadlines.
            if let Err(e) = limiter_user::fleet::report_loop(d, spec, tx).await {
                tracing::error!("fleet reporting stopped: {e}");
            }
        });
    }
    let reason = shutdown_rx.recv().await.unwrap_or(Shutdown::Exit);
    let _ = shutdown.send(reason);
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    // A metrics scrape may hold the state for the moment of one render.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    let mut shared = daemon;
    let daemon = loop {
        match Arc::try_unwrap(shared) {
            Ok(daemon) => break daemon,
            Err(back) if std::time::Instant::now() < deadline => {
                shared = back;
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
            Err(_) => anyhow::bail!("daemon state still shared at exit"),
        }
    };
    let daemon = daemon
        .into_inner()
        .map_err(|_| anyhow::anyhow!("daemon state poisoned"))?;
    // Either way the daemon removes its control socket last (if it is still its own):
    // `limiter detach` waits for the socket to go as the sign that all is done.
    let result = match reason {
        Shutdown::Detach => daemon.detach_all().map(|cleanup| {
            tracing::info!(
                pins = cleanup.removed.len(),
                filters = cleanup.removed_filters.len(),
                left = cleanup.left.len(),
                "detached and removed the limiter's pins"
            );
        }),
        Shutdown::Exit => daemon.stop(args.detach_on_exit),
    };
    Ok(result?)
}
