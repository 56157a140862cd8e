//! The daemon as a service: the async runtime's tasks around one [`Daemon`]. Signals
//! (SIGINT/SIGTERM end it, SIGHUP reloads), the counters' history and the handoff's
//! follow-up every second, the per-source saturation check four times a second, the
//! control socket ([`crate::serve::control::serve`]), the metrics endpoint
//! ([`crate::serve::metrics::serve`]) and the fleet reports
//! ([`crate::serve::reporter::report_loop`]). Every task subscribes to one [`Shutdown`]
//! broadcast; when it fires they stop, and the daemon stops the way it says.
//!
//! systemd hears of it ([`Notifier`], `Type=notify`): `READY=1` once the control socket
//! serves (every interface is attached before [`run`] is called), `RELOADING=1` then
//! `READY=1` around a reload, `STOPPING=1` on the way out.
//!
//! A task that fails (the metrics port taken, the allocator's endpoint unusable) logs and
//! ends alone: enforcement is the kernel's and carries on without it.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use limiter_service::notify::Notifier;
use tokio::{
    signal::unix::{signal, SignalKind},
    sync::broadcast,
    task::JoinSet,
};

use crate::{
    daemon::Daemon,
    error::Error,
    serve::{control, metrics, reporter, shutdown::Shutdown},
};

/// How long a metrics scrape in flight may keep the daemon's state shared at exit.
const RELEASE_DEADLINE: Duration = Duration::from_secs(2);

fn io(what: &str) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        what: what.to_string(),
        source,
    }
}

/// Serves `daemon` until a signal or `limiter detach`, then stops it: on SIGINT/SIGTERM
/// enforcement stays in the kernel (unless `detach_on_exit`), on `limiter detach` every
/// pin goes. `notifier` hears `READY=1` once everything serves.
pub async fn run(daemon: Daemon, detach_on_exit: bool, notifier: Notifier) -> Result<(), Error> {
    let notifier = Arc::new(notifier);
    let socket_path = daemon.config().control_socket.clone();
    let metrics_addr = daemon.config().metrics;
    let fleet_spec = daemon.config().fleet.clone();
    let daemon = Arc::new(Mutex::new(daemon));
    let (shutdown, mut shutdown_rx) = broadcast::channel::<Shutdown>(4);
    let mut tasks = JoinSet::new();

    for kind in [SignalKind::interrupt(), SignalKind::terminate()] {
        let tx = shutdown.clone();
        let mut stream = signal(kind).map_err(io("installing a signal handler"))?;
        tasks.spawn(async move {
            stream.recv().await;
            tracing::info!(signal = ?kind, "shutting down");
            let _ = tx.send(Shutdown::Exit);
        });
    }
    let mut hangup = signal(SignalKind::hangup()).map_err(io("installing the SIGHUP handler"))?;
    let (d, n) = (Arc::clone(&daemon), Arc::clone(&notifier));
    tasks.spawn(async move {
        while hangup.recv().await.is_some() {
            n.reloading();
            let result = d.lock().map(|mut d| d.reload());
            match result {
                Ok(Ok(r)) => tracing::info!(rules = r.rules, "SIGHUP: config reloaded"),
                Ok(Err(e)) => tracing::error!("SIGHUP: reload refused, rules unchanged: {e}"),
                Err(_) => tracing::error!("SIGHUP: daemon state poisoned"),
            }
            n.ready(&ready_status(&d));
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
                if let Err(e) = d.watch_bypass() {
                    tracing::warn!("reading the bypass bit: {e}");
                }
                d.watch_joined();
            }
        }
    });
    // Saturated per-source rules stand aside (or enforce again) within a check of the
    // flood's start (or a calm spell after its end).
    let d = Arc::clone(&daemon);
    tasks.spawn(async move {
        let mut tick = tokio::time::interval(crate::daemon::SATURATION_CHECK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if let Ok(mut d) = d.lock() {
                if let Err(e) = d.check_saturation() {
                    tracing::warn!("checking the per-source sketch for saturation: {e}");
                }
            }
        }
    });
    // A configured interface deleted and created again gets the program again.
    let d = Arc::clone(&daemon);
    tasks.spawn(async move {
        if let Err(e) = watch_links(d).await {
            tracing::error!(
                "watching the interfaces stopped: an interface created again is not attached \
                 again until the daemon restarts: {e}"
            );
        }
    });
    let listener = daemon
        .lock()
        .map_err(|_| Error::Service("daemon state poisoned".into()))?
        .take_control_listener()
        .ok_or_else(|| Error::Service("the control socket was already taken".into()))?;
    let listener = control::listen(listener)?;
    tracing::info!(socket = %socket_path.display(), "control socket listening");
    tasks.spawn(control::serve(
        listener,
        Arc::clone(&daemon),
        shutdown.clone(),
        Arc::clone(&notifier),
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
        tracing::info!(allocator = %spec.allocators_text(), host = %spec.host_id, "fleet mode: reporting to the allocator");
        // One report loop per group of allocators (one without sharding).
        for group in 0..spec.groups.len() {
            let (d, tx, spec) = (Arc::clone(&daemon), shutdown.clone(), spec.clone());
            tasks.spawn(async move {
                // The report loop ends only on a local fault; enforcement carries on, and
                // the shares age through STICKY and FAIL_OPEN in the kernel on their
                // deadlines.
                if let Err(e) = reporter::report_loop(d, spec, group, tx).await {
                    tracing::error!("fleet reporting stopped: {e}");
                }
            });
        }
    }
    // The interfaces were attached by Daemon::start and the control socket's accept loop
    // is spawned: a client that connects from now on is answered.
    notifier.ready(&ready_status(&daemon));
    let reason = shutdown_rx.recv().await.unwrap_or(Shutdown::Exit);
    notifier.stopping();
    let _ = shutdown.send(reason);
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    let daemon = release(daemon).await?;
    // Either way the daemon removes its control socket last (if it is still its own):
    // `limiter detach` waits for the socket to go as the sign that all is done.
    match reason {
        Shutdown::Detach => daemon.detach_all().map(|cleanup| {
            tracing::info!(
                pins = cleanup.removed.len(),
                filters = cleanup.removed_filters.len(),
                left = cleanup.left.len(),
                "detached and removed the limiter's pins"
            );
        }),
        Shutdown::Exit => daemon.stop(detach_on_exit),
    }
}

/// Hands the daemon every link event netlink reports (and checks 4 times a second,
/// events or not: the kernel drops events when the socket's buffer overflows).
async fn watch_links(daemon: Arc<Mutex<Daemon>>) -> Result<(), Error> {
    let monitor = crate::attach::netlink::LinkMonitor::open()
        .map_err(io("opening a netlink socket for link events"))?;
    // SAFETY: the monitor owns its socket for its whole life and always returns that
    // descriptor; the AsyncFd owns the monitor.
    let events = unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(monitor, tokio::io::Interest::READABLE)
    }
    .map_err(|e| Error::Io {
        what: "registering the netlink socket for link events".into(),
        source: std::io::Error::from(e),
    })?;
    loop {
        let mut deleted = Vec::new();
        tokio::select! {
            ready = events.readable() => {
                let mut guard = ready.map_err(io("waiting for link events"))?;
                let drained = guard.get_inner().drain().map_err(io("reading link events"))?;
                guard.clear_ready();
                deleted.extend(drained.events.iter().filter(|e| e.deleted).map(|e| e.ifindex));
            }
            _ = tokio::time::sleep(Duration::from_millis(250)) => {}
        }
        if let Ok(mut d) = daemon.lock() {
            d.watch_links(&deleted);
        }
    }
}

/// What `systemctl status` shows beside "active" ([`Daemon::readiness_status`]).
pub(crate) fn ready_status(daemon: &Mutex<Daemon>) -> String {
    daemon.lock().map_or_else(
        |_| "daemon state poisoned".to_string(),
        |d| d.readiness_status(),
    )
}

/// The daemon back from the tasks that shared it. A metrics scrape may hold it for the
/// moment of one render.
async fn release(mut shared: Arc<Mutex<Daemon>>) -> Result<Daemon, Error> {
    let deadline = Instant::now() + RELEASE_DEADLINE;
    let daemon = loop {
        match Arc::try_unwrap(shared) {
            Ok(daemon) => break daemon,
            Err(back) if Instant::now() < deadline => {
                shared = back;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(_) => return Err(Error::Service("daemon state still shared at exit".into())),
        }
    };
    daemon
        .into_inner()
        .map_err(|_| Error::Service("daemon state poisoned".into()))
}
