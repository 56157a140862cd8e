//! The gRPC listener: accepts TCP connections within the configured bounds and hands
//! them to tonic, which runs each TLS handshake in a task of its own under a timeout
//! (the accept loop never waits on a peer).
//!
//! Bounds: `max_connections` open connections in all and `max_connections_per_ip` from
//! one source address, counted from accept to close, handshaking or not; a connection
//! beyond either is closed at once, counted. A connection that has not sent a report
//! within `handshake_timeout_ms` of its accept is closed too (TLS done or not: a peer
//! that completes the handshake and then says nothing holds no place). Each connection
//! carries its own report-rate bucket and, once it has presented a certificate, the host
//! names the certificate vouches for.

use std::{
    collections::HashMap,
    future::Future as _,
    io,
    net::{IpAddr, SocketAddr},
    pin::Pin,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex, OnceLock,
    },
    task::{Context, Poll},
    time::Duration,
};

use limiter_proto::{cert_host_name, IdentityError};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{TcpListener, TcpStream},
    sync::mpsc,
};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::Connected;

use crate::{config::PeerLimits, limits::ReportBucket, now_ns};

/// Connection counters for the metrics.
#[derive(Debug, Default)]
pub struct ConnStats {
    pub open: AtomicU64,
    pub accepted: AtomicU64,
    /// Closed at accept: `max_connections` reached.
    pub refused_total: AtomicU64,
    /// Closed at accept: `max_connections_per_ip` reached for the source.
    pub refused_per_ip: AtomicU64,
}

/// What one connection carries into every request on it.
#[derive(Debug)]
pub struct ConnState {
    pub remote: Option<SocketAddr>,
    /// A report arrived on this connection (the service sets it).
    pub reported: std::sync::atomic::AtomicBool,
    /// Reports on this connection (per host there is another, in the host table).
    pub bucket: Mutex<ReportBucket>,
    name: OnceLock<Result<String, IdentityError>>,
}

impl ConnState {
    /// The host the connection's client certificate names (parsed once per connection;
    /// the chain's first certificate is the client's own).
    pub fn host_name(&self, leaf: Option<&[u8]>) -> &Result<String, IdentityError> {
        self.name.get_or_init(|| match leaf {
            Some(der) => cert_host_name(der),
            None => Err(IdentityError::NoName),
        })
    }
}

/// tonic's connect info for a [`LimitedConn`] (it wraps it with the peer certificates).
#[derive(Clone, Debug)]
pub struct ConnInfo(pub Arc<ConnState>);

/// Frees the connection's places in the counts when it closes.
struct Slot {
    stats: Arc<ConnStats>,
    per_ip: Arc<Mutex<HashMap<IpAddr, usize>>>,
    ip: Option<IpAddr>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.stats.open.fetch_sub(1, Ordering::Relaxed);
        if let (Some(ip), Ok(mut per_ip)) = (self.ip, self.per_ip.lock()) {
            if let Some(n) = per_ip.get_mut(&ip) {
                *n -= 1;
                if *n == 0 {
                    per_ip.remove(&ip);
                }
            }
        }
    }
}

/// An accepted TCP connection holding its places in the connection bounds.
pub struct LimitedConn {
    io: TcpStream,
    info: ConnInfo,
    /// Until the first report: when the connection is closed without one.
    first_report_by: Option<Pin<Box<tokio::time::Sleep>>>,
    _slot: Slot,
}

impl Connected for LimitedConn {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> ConnInfo {
        self.info.clone()
    }
}

impl AsyncRead for LimitedConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.info.0.reported.load(Ordering::Relaxed) {
            self.first_report_by = None;
        } else if let Some(deadline) = self.first_report_by.as_mut() {
            // Polled with the socket, so the deadline wakes this reader of a silent peer.
            if deadline.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no report within handshake_timeout_ms of connecting",
                )));
            }
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for LimitedConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// Whether a connection from `ip` fits the bounds, given the counts now.
pub fn admits(limits: &PeerLimits, open: u64, from_ip: usize) -> Result<(), &'static str> {
    if open >= limits.max_connections as u64 {
        Err("max_connections")
    } else if from_ip >= limits.max_connections_per_ip {
        Err("max_connections_per_ip")
    } else {
        Ok(())
    }
}

/// Accepts connections on `listener` until the stream is dropped.
pub fn incoming(
    listener: TcpListener,
    limits: PeerLimits,
    stats: Arc<ConnStats>,
) -> ReceiverStream<Result<LimitedConn, io::Error>> {
    // tonic takes each connection at once (handshakes run in tasks of their own); a full
    // queue means it is not keeping up, and the newcomer is closed rather than waited on.
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(accept_loop(listener, limits, stats, tx));
    ReceiverStream::new(rx)
}

async fn accept_loop(
    listener: TcpListener,
    limits: PeerLimits,
    stats: Arc<ConnStats>,
    tx: mpsc::Sender<Result<LimitedConn, io::Error>>,
) {
    let per_ip: Arc<Mutex<HashMap<IpAddr, usize>>> = Arc::default();
    let mut log = crate::limits::LogBudget::new(10_000_000_000, 5);
    loop {
        let (io, remote) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // Out of descriptors, mostly: wait a little instead of spinning.
                if let Some(held_back) = log.admit(now_ns()) {
                    tracing::warn!(held_back, "accepting a connection: {e}");
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let ip = remote.ip().to_canonical();
        let slot = {
            let Ok(mut counts) = per_ip.lock() else {
                return;
            };
            let from_ip = counts.get(&ip).copied().unwrap_or(0);
            match admits(&limits, stats.open.load(Ordering::Relaxed), from_ip) {
                Ok(()) => {
                    *counts.entry(ip).or_insert(0) += 1;
                    stats.open.fetch_add(1, Ordering::Relaxed);
                    Slot {
                        stats: Arc::clone(&stats),
                        per_ip: Arc::clone(&per_ip),
                        ip: Some(ip),
                    }
                }
                Err(limit) => {
                    let counter = match limit {
                        "max_connections" => &stats.refused_total,
                        _ => &stats.refused_per_ip,
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                    if let Some(held_back) = log.admit(now_ns()) {
                        tracing::warn!(%remote, held_back, "connection closed: {limit} reached");
                    }
                    drop(io);
                    continue;
                }
            }
        };
        stats.accepted.fetch_add(1, Ordering::Relaxed);
        let _ = io.set_nodelay(true);
        let rate = limits.max_reports_per_s;
        let conn = LimitedConn {
            io,
            info: ConnInfo(Arc::new(ConnState {
                remote: Some(remote),
                reported: std::sync::atomic::AtomicBool::new(false),
                bucket: Mutex::new(ReportBucket::new(rate, rate)),
                name: OnceLock::new(),
            })),
            first_report_by: Some(Box::pin(tokio::time::sleep(Duration::from_millis(
                limits.handshake_timeout_ms,
            )))),
            _slot: slot,
        };
        match tx.try_send(Ok(conn)) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                if let Some(held_back) = log.admit(now_ns()) {
                    tracing::warn!(%remote, held_back, "connection closed: the server is not keeping up");
                }
            }
            Err(mpsc::error::TrySendError::Closed(_)) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bounds_name_the_limit_reached() {
        let limits = PeerLimits {
            max_hosts: 4,
            max_connections: 3,
            max_connections_per_ip: 2,
            handshake_timeout_ms: 1000,
            max_reports_per_s: 10,
        };
        assert_eq!(admits(&limits, 0, 0), Ok(()));
        assert_eq!(admits(&limits, 2, 1), Ok(()));
        assert_eq!(admits(&limits, 2, 2), Err("max_connections_per_ip"));
        assert_eq!(admits(&limits, 3, 0), Err("max_connections"));
    }
}
