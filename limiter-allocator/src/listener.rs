//! The gRPC listener: accepts TCP connections within the configured bounds, runs each
//! TLS handshake in a task of its own under a timeout (the accept loop never waits on a
//! peer), and hands the authenticated connections to tonic.
//!
//! Bounds: `max_connections` open connections in all and `max_connections_per_ip` from
//! one source address, counted from accept to close, handshaking or not. A connection
//! beyond the per-address bound is closed at once, counted. When all `max_connections`
//! places are taken, a newcomer takes the place of the oldest connection still in its TLS
//! handshake, which is closed (evicted, counted); only when every place is held by a peer
//! that completed mutual TLS is the newcomer closed instead. So peers without a valid
//! certificate, however many addresses they come from, never keep one that has one out:
//! a host's handshake (a round trip and a signature) completes long before a flood could
//! open `max_connections` newer ones, and once done its place is never taken. Reserving
//! places for authenticated peers instead would not help: before its handshake nobody can
//! be told apart, so a flood that fills the handshaking places would still keep every new
//! host (a host after a failover, say) from ever presenting its certificate.
//!
//! A connection that has not sent a report within `handshake_timeout_ms` of its accept is
//! closed too (TLS done or not: a peer that completes the handshake and then says nothing
//! holds no place). Each connection carries its own report-rate bucket and, once it has
//! presented a certificate, the host names the certificate vouches for.
//!
//! Each handshake uses the TLS files of the moment (`limiter_proto::reload`): a renewed
//! certificate, key or CA is in use from the next connection on, without a restart.

use std::{
    collections::{BTreeSet, HashMap},
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

use limiter_proto::{cert_host_name, IdentityError, ServerTls};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{TcpListener, TcpStream},
    sync::{mpsc, oneshot},
};
use tokio_rustls::{server::TlsStream, TlsAcceptor};
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
    /// Closed in their TLS handshake to make room for a newcomer.
    pub evicted: AtomicU64,
    /// Open and still in their TLS handshake.
    pub handshaking: AtomicU64,
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

/// Which connections hold the places of the connection bounds, and which of them are
/// still in their TLS handshake, oldest first (the first to be evicted). Pure.
#[derive(Debug)]
pub struct ConnTable {
    max_connections: usize,
    max_per_ip: usize,
    next_id: u64,
    open: HashMap<u64, IpAddr>,
    /// Ids are handed out in accept order, so the first is the oldest.
    handshaking: BTreeSet<u64>,
    per_ip: HashMap<IpAddr, usize>,
}

/// A connection let in: its id, and the handshaking one it took the place of.
#[derive(Debug, PartialEq, Eq)]
pub struct Admitted {
    pub id: u64,
    pub evicted: Option<u64>,
}

impl ConnTable {
    pub fn new(limits: &PeerLimits) -> ConnTable {
        ConnTable {
            max_connections: limits.max_connections,
            max_per_ip: limits.max_connections_per_ip,
            next_id: 0,
            open: HashMap::new(),
            handshaking: BTreeSet::new(),
            per_ip: HashMap::new(),
        }
    }

    /// Lets a connection from `ip` in, handshaking, evicting the oldest handshaking one
    /// when every place is taken; or names the bound that refuses it.
    pub fn admit(&mut self, ip: IpAddr) -> Result<Admitted, &'static str> {
        if self.per_ip.get(&ip).copied().unwrap_or(0) >= self.max_per_ip {
            return Err("max_connections_per_ip");
        }
        let mut evicted = None;
        if self.open.len() >= self.max_connections {
            let Some(oldest) = self.handshaking.first().copied() else {
                return Err("max_connections");
            };
            self.release(oldest);
            evicted = Some(oldest);
        }
        let id = self.next_id;
        self.next_id += 1;
        self.open.insert(id, ip);
        self.handshaking.insert(id);
        *self.per_ip.entry(ip).or_insert(0) += 1;
        Ok(Admitted { id, evicted })
    }

    /// Connection `id` completed its handshake: its place can no longer be taken. False
    /// when it is not open any more (evicted in the meantime).
    pub fn authenticated(&mut self, id: u64) -> bool {
        self.handshaking.remove(&id)
    }

    /// Connection `id` closed (nothing if it was evicted already).
    pub fn release(&mut self, id: u64) {
        let Some(ip) = self.open.remove(&id) else {
            return;
        };
        self.handshaking.remove(&id);
        if let Some(n) = self.per_ip.get_mut(&ip) {
            *n -= 1;
            if *n == 0 {
                self.per_ip.remove(&ip);
            }
        }
    }

    pub fn open(&self) -> usize {
        self.open.len()
    }

    pub fn handshaking(&self) -> usize {
        self.handshaking.len()
    }
}

/// The table, and how to close each handshaking connection (dropping its sender).
struct Shared {
    table: ConnTable,
    evict: HashMap<u64, oneshot::Sender<()>>,
}

type SharedTable = Arc<Mutex<Shared>>;

impl Shared {
    fn publish(&self, stats: &ConnStats) {
        stats
            .open
            .store(self.table.open() as u64, Ordering::Relaxed);
        stats
            .handshaking
            .store(self.table.handshaking() as u64, Ordering::Relaxed);
    }
}

/// Frees the connection's places in the counts when it closes.
struct Slot {
    stats: Arc<ConnStats>,
    shared: SharedTable,
    id: u64,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Ok(mut shared) = self.shared.lock() {
            shared.table.release(self.id);
            shared.evict.remove(&self.id);
            shared.publish(&self.stats);
        }
    }
}

/// An accepted TCP connection holding its places in the connection bounds.
pub struct LimitedConn {
    io: TcpStream,
    info: ConnInfo,
    /// Until the first report: when the connection is closed without one.
    first_report_by: Option<Pin<Box<tokio::time::Sleep>>>,
    slot: Slot,
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

/// Accepts connections on `listener` until the stream is dropped, and yields those that
/// complete mutual TLS with `tls` (its files' configuration at their handshake).
pub fn incoming(
    listener: TcpListener,
    limits: PeerLimits,
    stats: Arc<ConnStats>,
    tls: Arc<ServerTls>,
) -> ReceiverStream<Result<TlsStream<LimitedConn>, io::Error>> {
    // tonic takes each connection at once; a full queue means it is not keeping up, and
    // the newcomer is closed rather than waited on.
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(accept_loop(listener, limits, stats, tls, tx));
    ReceiverStream::new(rx)
}

async fn accept_loop(
    listener: TcpListener,
    limits: PeerLimits,
    stats: Arc<ConnStats>,
    tls: Arc<ServerTls>,
    tx: mpsc::Sender<Result<TlsStream<LimitedConn>, io::Error>>,
) {
    let shared: SharedTable = Arc::new(Mutex::new(Shared {
        table: ConnTable::new(&limits),
        evict: HashMap::new(),
    }));
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
        let (evict, evicted_rx) = oneshot::channel();
        let (slot, evicted) = {
            let Ok(mut guard) = shared.lock() else {
                return;
            };
            let admitted = guard.table.admit(ip);
            match admitted {
                Ok(Admitted { id, evicted }) => {
                    // Dropping its sender wakes the evicted handshake, which closes.
                    let evicted = evicted.map(|old| guard.evict.remove(&old)).is_some();
                    guard.evict.insert(id, evict);
                    guard.publish(&stats);
                    let slot = Slot {
                        stats: Arc::clone(&stats),
                        shared: Arc::clone(&shared),
                        id,
                    };
                    (slot, evicted)
                }
                Err(limit) => {
                    drop(guard);
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
        if evicted {
            stats.evicted.fetch_add(1, Ordering::Relaxed);
            if let Some(held_back) = log.admit(now_ns()) {
                tracing::warn!(
                    %remote,
                    held_back,
                    "max_connections reached: the oldest connection still in its TLS \
                     handshake closed for this one"
                );
            }
        }
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
            slot,
        };
        tokio::spawn(handshake(
            conn,
            // In the task: the files are looked at (and re-read, if changed) off the
            // accept loop.
            Arc::clone(&tls),
            evicted_rx,
            Arc::clone(&shared),
            Arc::clone(&stats),
            tx.clone(),
        ));
    }
}

/// Runs one connection's TLS handshake (bounded by the connection's own deadline, its
/// first report within `handshake_timeout_ms`) unless it is evicted first, and hands the
/// authenticated connection to tonic.
async fn handshake(
    conn: LimitedConn,
    tls: Arc<ServerTls>,
    evicted: oneshot::Receiver<()>,
    shared: SharedTable,
    stats: Arc<ConnStats>,
    tx: mpsc::Sender<Result<TlsStream<LimitedConn>, io::Error>>,
) {
    let id = conn.slot.id;
    let remote = conn.info.0.remote;
    let acceptor = TlsAcceptor::from(tls.current());
    let tls = tokio::select! {
        done = acceptor.accept(conn) => match done {
            Ok(tls) => tls,
            Err(e) => {
                tracing::debug!(?remote, "TLS handshake failed: {e}");
                return;
            }
        },
        // Dropping the handshake closes the connection.
        _ = evicted => return,
    };
    {
        let Ok(mut guard) = shared.lock() else {
            return;
        };
        if !guard.table.authenticated(id) {
            return;
        }
        guard.evict.remove(&id);
        guard.publish(&stats);
    }
    if let Err(mpsc::error::TrySendError::Full(_)) = tx.try_send(Ok(tls)) {
        tracing::warn!(?remote, "connection closed: the server is not keeping up");
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn limits(max_connections: usize, max_connections_per_ip: usize) -> PeerLimits {
        PeerLimits {
            max_hosts: 4,
            max_connections,
            max_connections_per_ip,
            handshake_timeout_ms: 1000,
            max_reports_per_s: 10,
        }
    }

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 1, last])
    }

    #[test]
    fn a_full_table_evicts_the_oldest_handshake_and_never_an_authenticated_peer() {
        let mut t = ConnTable::new(&limits(3, 2));
        let a = t.admit(ip(1)).unwrap();
        assert_eq!(a.evicted, None);
        assert!(t.authenticated(a.id));
        let b = t.admit(ip(2)).unwrap();
        let c = t.admit(ip(2)).unwrap();
        assert_eq!(t.admit(ip(2)), Err("max_connections_per_ip"));
        // Full: the newcomer takes the place of b, the oldest still handshaking.
        let d = t.admit(ip(3)).unwrap();
        assert_eq!(d.evicted, Some(b.id));
        assert!(!t.authenticated(b.id), "an evicted connection is gone");
        assert!(t.authenticated(c.id) && t.authenticated(d.id));
        // Every place authenticated: now the newcomer is the one refused.
        assert_eq!(t.admit(ip(4)), Err("max_connections"));
        t.release(a.id);
        t.release(b.id);
        assert_eq!(t.open(), 2);
        assert_eq!(t.admit(ip(4)).map(|n| n.evicted), Ok(None));
    }

    #[derive(Clone, Debug)]
    enum Step {
        Connect(u8),
        Authenticate(usize),
        Close(usize),
    }

    proptest! {
        /// Whatever peers do: the bounds hold, an authenticated connection is never
        /// evicted, and a newcomer is refused for max_connections only when every place is
        /// held by an authenticated one.
        #[test]
        fn authenticated_peers_keep_their_places(
            max in 1usize..8,
            per_ip in 1usize..4,
            steps in prop::collection::vec(
                prop_oneof![
                    (0u8..6).prop_map(Step::Connect),
                    (0usize..64).prop_map(Step::Authenticate),
                    (0usize..64).prop_map(Step::Close),
                ],
                1..200,
            ),
        ) {
            let mut t = ConnTable::new(&limits(max, per_ip));
            // The model: open connections, whether authenticated, by source.
            let mut open: Vec<(u64, u8, bool)> = Vec::new();
            for step in steps {
                match step {
                    Step::Connect(src) => {
                        let all_auth = open.len() >= max && open.iter().all(|c| c.2);
                        let from = open.iter().filter(|c| c.1 == src).count();
                        match t.admit(ip(src)) {
                            Ok(Admitted { id, evicted }) => {
                                if let Some(old) = evicted {
                                    let at = open.iter().position(|c| c.0 == old).unwrap();
                                    prop_assert!(!open[at].2, "authenticated {} evicted", old);
                                    open.remove(at);
                                }
                                open.push((id, src, false));
                            }
                            Err("max_connections") => prop_assert!(all_auth),
                            Err(_) => prop_assert!(from >= per_ip),
                        }
                    }
                    Step::Authenticate(i) if !open.is_empty() => {
                        let i = i % open.len();
                        if !open[i].2 {
                            prop_assert!(t.authenticated(open[i].0));
                            open[i].2 = true;
                        }
                    }
                    Step::Close(i) if !open.is_empty() => {
                        let (id, _, _) = open.remove(i % open.len());
                        t.release(id);
                    }
                    _ => {}
                }
                prop_assert!(t.open() == open.len() && t.open() <= max);
                prop_assert_eq!(t.handshaking(), open.iter().filter(|c| !c.2).count());
                for src in 0..6 {
                    prop_assert!(open.iter().filter(|c| c.1 == src).count() <= per_ip);
                }
            }
        }
    }
}
