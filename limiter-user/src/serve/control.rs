//! The daemon's control socket: its requests and what each does. The transport (one
//! JSON request per connection, one JSON reply, root peers only, size limit and timeouts)
//! is limiter_service::control, shared with the allocator. Unix socket, mode 0600, so
//! only root can question or change the daemon. `limiter_instance::claim` binds it when
//! the daemon starts: a directory it creates is 0700, an existing one keeps its mode,
//! and nothing but a dead socket at the path is ever replaced.

use std::{
    path::Path,
    sync::{Arc, Mutex},
};

pub use limiter_service::control::{ControlError, Reply};
use limiter_service::notify::Notifier;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::{net::UnixListener, sync::broadcast};

use crate::{daemon::Daemon, observe::explain::ExplainQuery, serve::shutdown::Shutdown};

/// Who answers on this socket, for the client's errors.
const OWNER: &str = "limiter daemon";

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Request {
    Status,
    Stats,
    QuotaList,
    QuotaSet {
        rule: String,
        rate: u64,
        burst: Option<u64>,
    },
    Reload,
    /// What `Reload` would do, changing nothing.
    ReloadDryRun,
    /// Set (`on`) or clear the kill switch.
    Bypass {
        on: bool,
    },
    Explain(ExplainQuery),
    /// Detach from every interface, remove every pin, and exit.
    Detach,
}

/// Sends `request` to the daemon at `socket` and returns its data.
pub fn call(socket: &Path, request: &Request) -> Result<Value, ControlError> {
    limiter_service::control::call(socket, OWNER, request)
}

/// Serves the control socket the daemon claimed ([`crate::daemon::Daemon::take_control_listener`])
/// on the async runtime.
pub fn listen(listener: std::os::unix::net::UnixListener) -> Result<UnixListener, crate::Error> {
    let io = |what: &str, source| crate::Error::Io {
        what: what.to_string(),
        source,
    };
    listener
        .set_nonblocking(true)
        .map_err(|e| io("making the control socket non-blocking", e))?;
    UnixListener::from_std(listener).map_err(|e| io("serving the control socket", e))
}

/// Serves requests until shutdown, each connection on a task of its own
/// (`limiter_service::control::serve`): a client that sends nothing holds only its own
/// connection. Requests take the daemon's lock one at a time; each is a few map
/// operations.
pub async fn serve(
    listener: UnixListener,
    daemon: Arc<Mutex<Daemon>>,
    shutdown: broadcast::Sender<Shutdown>,
    notifier: Arc<Notifier>,
) {
    let mut stop = shutdown.subscribe();
    let handle = move |request: Request| {
        let reply = respond(request, &daemon, &shutdown, &notifier);
        async move { reply }
    };
    limiter_service::control::serve(listener, handle, async move {
        let _ = stop.recv().await;
    })
    .await;
}

/// One request's reply; a reload is bracketed by the notify protocol's RELOADING and
/// READY, as SIGHUP's is.
fn respond(
    request: Request,
    daemon: &Arc<Mutex<Daemon>>,
    shutdown: &broadcast::Sender<Shutdown>,
    notifier: &Notifier,
) -> Reply {
    if request == Request::Reload {
        notifier.reloading();
    }
    let reply = dispatch(request.clone(), daemon, shutdown);
    if request == Request::Reload {
        let status = daemon.lock().map_or_else(
            |_| "daemon state poisoned".to_string(),
            |d| d.readiness_status(),
        );
        notifier.ready(&status);
    }
    reply
}

fn to_reply<T: Serialize>(result: Result<T, crate::Error>) -> Reply {
    match result {
        Ok(value) => Reply::data(value),
        // The client exits with the status of the error's type (a kernel that refused a
        // reload is not a bad request).
        Err(e) => Reply::refused_as(
            e.to_string(),
            limiter_service::exit::classify(&e, &crate::exit_status),
        ),
    }
}

fn dispatch(
    request: Request,
    daemon: &Arc<Mutex<Daemon>>,
    shutdown: &broadcast::Sender<Shutdown>,
) -> Reply {
    let Ok(mut d) = daemon.lock() else {
        return Reply::refused_as(
            "daemon state is poisoned; restart the daemon",
            limiter_service::exit::Exit::Failure,
        );
    };
    match request {
        Request::Status => to_reply(d.status()),
        Request::Stats => to_reply(d.stats()),
        Request::QuotaList => to_reply(Ok(d.quotas())),
        Request::QuotaSet { rule, rate, burst } => to_reply(d.set_quota(&rule, rate, burst)),
        Request::Reload => to_reply(d.reload()),
        Request::ReloadDryRun => to_reply(d.reload_dry_run()),
        Request::Bypass { on } => to_reply(d.set_bypass(on, "limiter bypass")),
        Request::Explain(query) => to_reply(d.explain(&query)),
        Request::Detach => {
            let _ = shutdown.send(Shutdown::Detach);
            to_reply(Ok("detaching"))
        }
    }
}
