//! The control socket's transport, typed: one JSON request per connection (one line),
//! one JSON reply ([`Reply`]). The peer must be root (SO_PEERCRED), a request is at most
//! [`MAX_REQUEST`] bytes and must arrive within [`TIMEOUT`]; the client waits as long
//! for the reply. Each binary has its own request enum and serves it with [`serve`]:
//! every connection on a task of its own, so a client that sends nothing holds only its
//! own connection, for at most [`TIMEOUT`]. `limiter_instance::claim` binds the socket.

use std::{
    future::Future,
    io::{BufRead as _, BufReader, Write as _},
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use serde::{de::DeserializeOwned, Deserialize, Serialize};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _};

use crate::exit::Exit;

/// Longest request accepted (a request is a few hundred bytes).
pub const MAX_REQUEST: u64 = 64 * 1024;
/// How long either side waits for the other.
#[cfg(not(test))]
pub const TIMEOUT: Duration = Duration::from_secs(10);
/// The unit tests below wait for a silent client's timeout: 2 s instead of 10.
#[cfg(test)]
pub const TIMEOUT: Duration = Duration::from_secs(2);
/// Connections served at once; more wait in the listen backlog. A request is a few map
/// operations or one etcd call: a handful of operators and scripts never come near it,
/// and a local root flood holds at most this many tasks.
pub const MAX_CONNECTIONS: usize = 16;

/// The answer to one request.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Reply {
    pub ok: bool,
    #[serde(default)]
    pub data: Value,
    #[serde(default)]
    pub error: Option<String>,
    /// A refusal's exit status for the client (limiter_service::exit), chosen by the
    /// server from its error's type; absent: bad input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_status: Option<u8>,
}

impl Reply {
    pub fn data<T: Serialize>(value: T) -> Reply {
        match serde_json::to_value(value) {
            Ok(data) => Reply {
                ok: true,
                data,
                error: None,
                exit_status: None,
            },
            Err(e) => Reply::refused(format!("encoding the reply: {e}")),
        }
    }

    pub fn refused(reason: impl Into<String>) -> Reply {
        Reply {
            ok: false,
            data: Value::Null,
            error: Some(reason.into()),
            exit_status: None,
        }
    }

    /// A refusal the client exits with `status` for (the kernel refused a reload, say).
    pub fn refused_as(reason: impl Into<String>, status: Exit) -> Reply {
        Reply {
            exit_status: Some(status.code()),
            ..Reply::refused(reason)
        }
    }
}

/// Why a [`call`] got no data.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("no {owner} is listening at {path} (is it running? another control_socket?)")]
    NotRunning { path: PathBuf, owner: &'static str },
    #[error("permission denied on {0}: the control socket is for root only")]
    PermissionDenied(PathBuf),
    #[error("talking to the {owner} at {path}: {source}")]
    Io {
        path: PathBuf,
        owner: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("the {owner} sent a reply that is not one: {reply}")]
    BadReply { owner: &'static str, reply: String },
    #[error("{0}")]
    Refused(String),
    /// A refusal whose exit status the server chose ([`Reply::refused_as`]).
    #[error("{reason}")]
    RefusedAs { reason: String, status: Exit },
}

/// The exit status (limiter_service::exit) of a control-socket failure, for the binaries'
/// classifiers; `None` for other errors, and for an I/O failure (its source may say more).
pub fn exit_status(e: &(dyn std::error::Error + 'static)) -> Option<Exit> {
    match e.downcast_ref::<ControlError>()? {
        ControlError::NotRunning { .. } => Some(Exit::NotRunning),
        ControlError::PermissionDenied(_) => Some(Exit::KernelRefused),
        ControlError::Refused(_) => Some(Exit::BadInput),
        ControlError::RefusedAs { status, .. } => Some(*status),
        ControlError::Io { .. } => None,
        ControlError::BadReply { .. } => Some(Exit::Failure),
    }
}

/// Sends `request` to the `owner` ("limiter daemon", "limiter-allocator") at `socket`
/// and returns its data, or its refusal as [`ControlError::Refused`].
pub fn call<R: Serialize>(
    socket: &Path,
    owner: &'static str,
    request: &R,
) -> Result<Value, ControlError> {
    let io = |source| ControlError::Io {
        path: socket.to_path_buf(),
        owner,
        source,
    };
    let mut stream = UnixStream::connect(socket).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => {
            ControlError::NotRunning {
                path: socket.to_path_buf(),
                owner,
            }
        }
        std::io::ErrorKind::PermissionDenied => {
            ControlError::PermissionDenied(socket.to_path_buf())
        }
        _ => io(e),
    })?;
    stream.set_read_timeout(Some(TIMEOUT)).map_err(io)?;
    stream.set_write_timeout(Some(TIMEOUT)).map_err(io)?;
    let mut line = serde_json::to_vec(request).map_err(|e| ControlError::BadReply {
        owner,
        reply: format!("encoding the request: {e}"),
    })?;
    line.push(b'\n');
    stream.write_all(&line).map_err(io)?;
    let mut reply = String::new();
    BufReader::new(stream).read_line(&mut reply).map_err(io)?;
    let reply: Reply = serde_json::from_str(&reply).map_err(|e| ControlError::BadReply {
        owner,
        reply: format!("{e}: {reply:?}"),
    })?;
    if reply.ok {
        Ok(reply.data)
    } else {
        let reason = reply
            .error
            .unwrap_or_else(|| "refused without a reason".into());
        let status = reply
            .exit_status
            .and_then(|code| Exit::ALL.into_iter().find(|e| e.code() == code));
        Err(match status {
            Some(status) => ControlError::RefusedAs { reason, status },
            None => ControlError::Refused(reason),
        })
    }
}

/// Serves `listener` until `stop` completes: each connection on a task of its own (at
/// most [`MAX_CONNECTIONS`] at once) through [`serve_connection_async`], with `handle`
/// answering its request. A failed accept (out of descriptors) is retried 100 ms later,
/// not spun on. When `stop` completes, this waits for the connections in flight (each
/// bounded by [`TIMEOUT`]); dropping the future instead aborts them.
pub async fn serve<R, H, F>(
    listener: tokio::net::UnixListener,
    handle: H,
    stop: impl Future<Output = ()>,
) where
    R: DeserializeOwned + Send + 'static,
    H: Fn(R) -> F + Clone + Send + 'static,
    F: Future<Output = Reply> + Send + 'static,
{
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let mut connections = tokio::task::JoinSet::new();
    let mut accept_failures = 0u64;
    tokio::pin!(stop);
    loop {
        let accepted = tokio::select! {
            () = &mut stop => break,
            permit = Arc::clone(&slots).acquire_owned() => match permit {
                Ok(permit) => tokio::select! {
                    () = &mut stop => break,
                    accepted = listener.accept() => accepted.map(|(stream, _)| (stream, permit)),
                },
                Err(_) => break,
            },
        };
        match accepted {
            Ok((stream, permit)) => {
                let handle = handle.clone();
                connections.spawn(async move {
                    let served =
                        serve_connection_async(stream, async move |request| handle(request).await)
                            .await;
                    if let Err(e) = served {
                        tracing::debug!(error = %e, "control connection failed");
                    }
                    drop(permit);
                });
            }
            Err(e) => {
                // The first failure and then one in 100: running out of descriptors must
                // not also flood the log.
                accept_failures += 1;
                if accept_failures == 1 || accept_failures.is_multiple_of(100) {
                    tracing::warn!(error = %e, failures = accept_failures, "accepting a control connection failed");
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        while connections.try_join_next().is_some() {}
    }
    while connections.join_next().await.is_some() {}
}

/// Reads one request from `stream` and writes `handle`'s reply. Refused before `handle`
/// runs: a peer that is not root, a request not received within [`TIMEOUT`], longer than
/// [`MAX_REQUEST`], or not an `R`.
pub async fn serve_connection<R: DeserializeOwned>(
    stream: tokio::net::UnixStream,
    handle: impl FnOnce(R) -> Reply,
) -> std::io::Result<()> {
    serve_connection_async(stream, async |request| handle(request)).await
}

/// [`serve_connection`] with a handler that awaits (the allocator's, which asks etcd).
pub async fn serve_connection_async<R: DeserializeOwned>(
    stream: tokio::net::UnixStream,
    handle: impl AsyncFnOnce(R) -> Reply,
) -> std::io::Result<()> {
    let root = stream.peer_cred().map(|c| c.uid() == 0).unwrap_or(false);
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    let mut reader = tokio::io::BufReader::new(read.take(MAX_REQUEST));
    let read = tokio::time::timeout(TIMEOUT, reader.read_line(&mut line)).await;
    let reply = match (root, read) {
        (false, _) => Reply::refused_as("the control socket is for root only", Exit::KernelRefused),
        (true, Err(_)) => Reply::refused("timed out waiting for the request"),
        (true, Ok(Err(e))) => Reply::refused(format!("reading the request: {e}")),
        (true, Ok(Ok(_))) if !line.ends_with('\n') => Reply::refused(format!(
            "the request is not one line of at most {MAX_REQUEST} bytes"
        )),
        (true, Ok(Ok(_))) => match serde_json::from_str::<R>(&line) {
            Err(e) => Reply::refused(format!("malformed request: {e}")),
            Ok(request) => handle(request).await,
        },
    };
    let mut bytes = serde_json::to_vec(&reply).unwrap_or_else(|_| b"{\"ok\":false}".to_vec());
    bytes.push(b'\n');
    tokio::time::timeout(TIMEOUT, write.write_all(&bytes))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "writing the reply"))??;
    write.shutdown().await
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

    use super::*;

    #[derive(Debug, Serialize, Deserialize, PartialEq)]
    #[serde(tag = "cmd", rename_all = "snake_case")]
    enum Ask {
        Echo { text: String },
    }

    /// Serves one connection on `socket` in the background with an echoing handler.
    fn serve_once(socket: &Path) -> std::thread::JoinHandle<()> {
        let listener = std::os::unix::net::UnixListener::bind(socket).unwrap();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                listener.set_nonblocking(true).unwrap();
                let listener = tokio::net::UnixListener::from_std(listener).unwrap();
                let (stream, _) = listener.accept().await.unwrap();
                serve_connection(stream, |Ask::Echo { text }| Reply::data(text))
                    .await
                    .unwrap();
            });
        })
    }

    /// Serves `socket` with [`serve`] and an echoing handler until `stop` is sent.
    fn serve_until(
        socket: &Path,
        stop: tokio::sync::oneshot::Receiver<()>,
    ) -> std::thread::JoinHandle<()> {
        let listener = std::os::unix::net::UnixListener::bind(socket).unwrap();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                listener.set_nonblocking(true).unwrap();
                let listener = tokio::net::UnixListener::from_std(listener).unwrap();
                let echo = |Ask::Echo { text }| async move { Reply::data(text) };
                serve(listener, echo, async move {
                    let _ = stop.await;
                })
                .await;
            });
        })
    }

    #[test]
    fn a_client_that_sends_nothing_holds_only_its_own_connection() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("control.sock");
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let server = serve_until(&socket, stopped);
        let silent = UnixStream::connect(&socket).unwrap();
        let ask = |text: &str| {
            call(
                &socket,
                "test server",
                &Ask::Echo {
                    text: text.to_string(),
                },
            )
            .unwrap()
        };
        assert_eq!(ask("first"), Value::from("first"));
        assert_eq!(ask("second"), Value::from("second"));
        // Served one at a time, the requests would have waited for the silent client's
        // timeout, whose refusal would be in its socket by now.
        silent.set_nonblocking(true).unwrap();
        let mut byte = [0u8; 1];
        let read = std::io::Read::read(&mut &silent, &mut byte);
        assert!(
            read.as_ref()
                .is_err_and(|e| e.kind() == std::io::ErrorKind::WouldBlock),
            "the silent client was already answered ({read:?}): the requests after it waited \
             for it"
        );
        stop.send(()).unwrap();
        // In flight at the stop: the silent connection gets its timeout reply, then serve
        // returns.
        server.join().unwrap();
        silent.set_nonblocking(false).unwrap();
        let mut reply = String::new();
        BufReader::new(&silent).read_line(&mut reply).unwrap();
        let reply: Reply = serde_json::from_str(&reply).unwrap();
        assert!(
            reply
                .error
                .as_deref()
                .is_some_and(|e| e.contains("timed out")),
            "{reply:?}"
        );
    }

    #[test]
    fn a_typed_request_gets_its_reply() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("control.sock");
        let server = serve_once(&socket);
        let data = call(
            &socket,
            "test server",
            &Ask::Echo {
                text: "hello".into(),
            },
        )
        .unwrap();
        assert_eq!(data, Value::from("hello"));
        server.join().unwrap();
    }

    /// Sends raw bytes and reads the reply line.
    fn raw(socket: &Path, bytes: &[u8]) -> Reply {
        let mut stream = UnixStream::connect(socket).unwrap();
        let _ = stream.write_all(bytes);
        let mut reply = String::new();
        BufReader::new(stream).read_line(&mut reply).unwrap();
        serde_json::from_str(&reply).unwrap()
    }

    #[test]
    fn what_is_not_a_request_is_refused_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("control.sock");
        for (bytes, expected) in [
            (
                &b"{\"cmd\":\"delete_everything\"}\n"[..],
                "malformed request",
            ),
            (&b"not json\n"[..], "malformed request"),
        ] {
            let _ = std::fs::remove_file(&socket);
            let server = serve_once(&socket);
            let reply = raw(&socket, bytes);
            assert!(!reply.ok);
            assert!(
                reply.error.as_deref().unwrap().contains(expected),
                "{reply:?}"
            );
            server.join().unwrap();
        }
        // Longer than MAX_REQUEST: refused without reading the rest.
        let _ = std::fs::remove_file(&socket);
        let server = serve_once(&socket);
        let long = vec![b'x'; MAX_REQUEST as usize + 10];
        let reply = raw(&socket, &long);
        assert!(
            reply
                .error
                .as_deref()
                .unwrap()
                .contains("at most 65536 bytes"),
            "{reply:?}"
        );
        server.join().unwrap();
    }

    #[test]
    fn a_refusal_carries_the_status_the_server_chose() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("control.sock");
        let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        let server = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                listener.set_nonblocking(true).unwrap();
                let listener = tokio::net::UnixListener::from_std(listener).unwrap();
                let (stream, _) = listener.accept().await.unwrap();
                serve_connection(stream, |_: Ask| {
                    Reply::refused_as("the verifier refused", Exit::KernelRefused)
                })
                .await
                .unwrap();
            });
        });
        let e = call(&socket, "test server", &Ask::Echo { text: "x".into() }).unwrap_err();
        assert!(
            matches!(&e, ControlError::RefusedAs { reason, status: Exit::KernelRefused } if reason == "the verifier refused"),
            "{e:?}"
        );
        server.join().unwrap();
    }

    #[test]
    fn control_failures_have_their_exit_status() {
        let not_running = ControlError::NotRunning {
            path: PathBuf::from("/run/x.sock"),
            owner: "limiter daemon",
        };
        assert_eq!(exit_status(&not_running), Some(Exit::NotRunning));
        let refused = ControlError::Refused("no rule named \"x\"".into());
        assert_eq!(exit_status(&refused), Some(Exit::BadInput));
        let denied = ControlError::PermissionDenied(PathBuf::from("/run/x.sock"));
        assert_eq!(exit_status(&denied), Some(Exit::KernelRefused));
        assert_eq!(exit_status(&std::io::Error::other("x")), None);
    }

    #[test]
    fn no_server_names_the_owner() {
        let dir = tempfile::tempdir().unwrap();
        let e = call(
            &dir.path().join("nobody.sock"),
            "limiter-allocator",
            &Ask::Echo { text: "x".into() },
        )
        .unwrap_err();
        assert!(matches!(e, ControlError::NotRunning { .. }), "{e}");
        assert!(
            e.to_string().contains("no limiter-allocator is listening"),
            "{e}"
        );
    }
}
