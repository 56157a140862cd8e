//! The control socket: one JSON request per connection, one JSON reply. Unix socket,
//! mode 0600, and the peer must be root (SO_PEERCRED), so only root can question or
//! change the daemon. `limiter_instance::claim` binds it (when the daemon starts): a
//! directory it creates is 0700, an existing one keeps its mode, and nothing but a dead
//! socket at the path is ever replaced.

use std::{
    io::{BufRead as _, BufReader, Write as _},
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::{
    io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _},
    net::UnixListener,
    sync::broadcast,
};

use crate::{daemon::Daemon, explain::ExplainQuery};

/// Longest request accepted (a request is a few hundred bytes).
const MAX_REQUEST: u64 = 64 * 1024;
const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);

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
    Explain(ExplainQuery),
    /// Detach from every interface, remove every pin, and exit.
    Detach,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Reply {
    pub ok: bool,
    #[serde(default)]
    pub data: Value,
    #[serde(default)]
    pub error: Option<String>,
}

/// How the daemon should end, as told by a signal or a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shutdown {
    /// SIGINT/SIGTERM: exit; enforcement stays unless --detach-on-exit.
    Exit,
    /// `limiter detach`: detach everywhere, remove every pin, exit.
    Detach,
}

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error(
        "no limiter daemon is listening at {0} (is `limiter run` running? another control_socket?)"
    )]
    NotRunning(PathBuf),
    #[error("permission denied on {0}: the control socket is for root only")]
    PermissionDenied(PathBuf),
    #[error("talking to the daemon at {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the daemon sent a reply that is not JSON: {0}")]
    BadReply(String),
    #[error("{0}")]
    Refused(String),
}

/// Sends `request` to the daemon at `socket` and returns its data.
pub fn call(socket: &Path, request: &Request) -> Result<Value, ControlError> {
    let io = |source| ControlError::Io {
        path: socket.to_path_buf(),
        source,
    };
    let mut stream = UnixStream::connect(socket).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => {
            ControlError::NotRunning(socket.to_path_buf())
        }
        std::io::ErrorKind::PermissionDenied => {
            ControlError::PermissionDenied(socket.to_path_buf())
        }
        _ => io(e),
    })?;
    stream.set_read_timeout(Some(CLIENT_TIMEOUT)).map_err(io)?;
    stream.set_write_timeout(Some(CLIENT_TIMEOUT)).map_err(io)?;
    let mut line =
        serde_json::to_vec(request).map_err(|e| ControlError::BadReply(e.to_string()))?;
    line.push(b'\n');
    stream.write_all(&line).map_err(io)?;
    let mut reply = String::new();
    BufReader::new(stream).read_line(&mut reply).map_err(io)?;
    let reply: Reply = serde_json::from_str(&reply)
        .map_err(|e| ControlError::BadReply(format!("{e}: {reply:?}")))?;
    if reply.ok {
        Ok(reply.data)
    } else {
        Err(ControlError::Refused(
            reply
                .error
                .unwrap_or_else(|| "refused without a reason".into()),
        ))
    }
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

/// Serves requests until shutdown. Requests are handled one at a time: each is a few
/// map operations.
pub async fn serve(
    listener: UnixListener,
    daemon: Arc<Mutex<Daemon>>,
    shutdown: broadcast::Sender<Shutdown>,
) {
    let mut stop = shutdown.subscribe();
    loop {
        tokio::select! {
            _ = stop.recv() => return,
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let reply = handle(stream, &daemon, &shutdown).await;
                if let Err(e) = reply {
                    tracing::debug!(error = %e, "control connection failed");
                }
            }
        }
    }
}

async fn handle(
    stream: tokio::net::UnixStream,
    daemon: &Arc<Mutex<Daemon>>,
    shutdown: &broadcast::Sender<Shutdown>,
) -> std::io::Result<()> {
    let root = stream.peer_cred().map(|c| c.uid() == 0).unwrap_or(false);
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    let mut reader = tokio::io::BufReader::new(read.take(MAX_REQUEST));
    let read = tokio::time::timeout(CLIENT_TIMEOUT, reader.read_line(&mut line)).await;
    let reply = match (root, read) {
        (false, _) => refuse("the control socket is for root only".into()),
        (true, Err(_)) => refuse("timed out waiting for the request".into()),
        (true, Ok(Err(e))) => refuse(format!("reading the request: {e}")),
        (true, Ok(Ok(_))) => match serde_json::from_str::<Request>(&line) {
            Err(e) => refuse(format!("malformed request: {e}")),
            Ok(request) => dispatch(request, daemon, shutdown),
        },
    };
    let mut bytes = serde_json::to_vec(&reply).unwrap_or_else(|_| b"{\"ok\":false}".to_vec());
    bytes.push(b'\n');
    write.write_all(&bytes).await?;
    write.shutdown().await
}

fn refuse(error: String) -> Reply {
    Reply {
        ok: false,
        data: Value::Null,
        error: Some(error),
    }
}

fn to_reply<T: Serialize>(result: Result<T, crate::Error>) -> Reply {
    match result.map(|v| serde_json::to_value(v)) {
        Ok(Ok(data)) => Reply {
            ok: true,
            data,
            error: None,
        },
        Ok(Err(e)) => refuse(format!("encoding the reply: {e}")),
        Err(e) => refuse(e.to_string()),
    }
}

fn dispatch(
    request: Request,
    daemon: &Arc<Mutex<Daemon>>,
    shutdown: &broadcast::Sender<Shutdown>,
) -> Reply {
    let Ok(mut d) = daemon.lock() else {
        return refuse("daemon state is poisoned; restart the daemon".into());
    };
    match request {
        Request::Status => to_reply(d.status()),
        Request::Stats => to_reply(d.stats()),
        Request::QuotaList => to_reply(Ok(d.quotas())),
        Request::QuotaSet { rule, rate, burst } => to_reply(d.set_quota(&rule, rate, burst)),
        Request::Reload => to_reply(d.reload()),
        Request::Explain(query) => to_reply(d.explain(&query)),
        Request::Detach => {
            let _ = shutdown.send(Shutdown::Detach);
            to_reply(Ok("detaching"))
        }
    }
}
