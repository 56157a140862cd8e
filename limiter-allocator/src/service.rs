//! The gRPC service. A report passes, in this order (each step cheap, none under the
//! state lock but the last two): the sender's identity (the host id must be the host
//! the connection's client certificate names: PERMISSION_DENIED), the connection's report rate
//! (RESOURCE_EXHAUSTED), validation (INVALID_ARGUMENT), then under the lock the host
//! table (fleet full, or the host's own report rate: RESOURCE_EXHAUSTED) and only then the
//! allocation, the one step that costs O(hosts log hosts). So a flood costs a bucket
//! check per report, and real hosts' reports wait for nothing but other real reports.
//!
//! With replicas, the role is checked under the state lock, just before the allocation:
//! a follower (or a leader past its lease's margin) refuses with UNAVAILABLE and names
//! the leader it knows in the `limiter-leader` metadata; the host follows it if it is
//! one of its own listed addresses. Followers redirect rather than forward: a follower
//! is never on a report's path, so its failure delays nobody, and no report takes two
//! hops.

use std::sync::{
    atomic::{AtomicU64, Ordering},
    Arc, Mutex,
};

use limiter_proto::{
    pb::{allocator_server::Allocator, ReportReply, ReportRequest},
    validate,
};
use tonic::{transport::server::TlsConnectInfo, Request, Response, Status};

use crate::{
    election::{Leadership, Role},
    hosts::Refusal,
    limits::LogBudget,
    listener::ConnInfo,
    now_ns,
    state::State,
};

/// Reports refused before they reach the state, by reason (the metrics).
#[derive(Debug, Default)]
pub struct Refused {
    pub identity: AtomicU64,
    pub connection_rate: AtomicU64,
    pub invalid: AtomicU64,
    /// Reports to a replica that is not the leader (redirected).
    pub not_leader: AtomicU64,
}

/// Why a report is refused, for the log budget.
#[derive(Clone, Copy)]
enum Kind {
    Identity,
    Rate,
    Invalid,
    FleetFull,
    NotLeader,
}

pub struct Service {
    pub state: Arc<Mutex<State>>,
    pub refused: Arc<Refused>,
    pub max_reports_per_s: u64,
    pub leadership: Arc<Mutex<Leadership>>,
    /// One budget per kind: a flood of one kind does not hide the others.
    logs: Mutex<[LogBudget; 5]>,
}

impl Service {
    pub fn new(
        state: Arc<Mutex<State>>,
        refused: Arc<Refused>,
        max_reports_per_s: u64,
        leadership: Arc<Mutex<Leadership>>,
    ) -> Self {
        Service {
            state,
            refused,
            max_reports_per_s,
            leadership,
            logs: Mutex::new(std::array::from_fn(|_| LogBudget::new(10_000_000_000, 5))),
        }
    }

    /// Logs a refusal within its budget (5 lines per 10 s per kind; the held-back count
    /// goes with the next line).
    fn log(&self, kind: Kind, peer: &str, host: &str, message: &str) {
        let admitted = self
            .logs
            .lock()
            .ok()
            .and_then(|mut logs| logs[kind as usize].admit(now_ns()));
        if let Some(held_back) = admitted {
            let host = loggable(host);
            tracing::warn!(%peer, %host, held_back, "report refused: {message}");
        }
    }
}

/// A host id as it may be logged: its first 64 characters, everything but printable ASCII
/// escaped (`\n`, `\u{1b}`, `\u{202e}`). A refused report's host id is whatever the
/// sender put there, unvalidated: raw, a newline would forge a log line and a terminal
/// escape hide one.
fn loggable(host: &str) -> String {
    let mut out = String::new();
    for c in host.chars().take(64) {
        if c.is_ascii_graphic() && c != '\\' {
            out.push(c);
        } else {
            out.extend(c.escape_default());
        }
    }
    out
}

impl Service {
    /// UNAVAILABLE, naming the leader when one is known.
    fn not_leader(&self, leader: Option<std::net::SocketAddr>, peer: &str, host: &str) -> Status {
        self.refused.not_leader.fetch_add(1, Ordering::Relaxed);
        let message = match leader {
            Some(l) => format!("this allocator replica is not the leader; the leader is {l}"),
            None => "this allocator replica is not the leader, and no leader is known \
                     (an election is under way, or etcd is unreachable)"
                .to_string(),
        };
        self.log(Kind::NotLeader, peer, host, &message);
        let mut status = Status::unavailable(message);
        if let Some(value) = leader.and_then(|l| l.to_string().parse().ok()) {
            status
                .metadata_mut()
                .insert(limiter_proto::LEADER_METADATA, value);
        }
        status
    }
}

#[tonic::async_trait]
impl Allocator for Service {
    async fn report(
        &self,
        request: Request<ReportRequest>,
    ) -> Result<Response<ReportReply>, Status> {
        let info = request
            .extensions()
            .get::<TlsConnectInfo<ConnInfo>>()
            .cloned()
            .ok_or_else(|| Status::unauthenticated("no TLS client certificate"))?;
        let conn = Arc::clone(&info.get_ref().0);
        conn.reported.store(true, Ordering::Relaxed);
        let peer = conn
            .remote
            .map_or_else(|| "?".to_string(), |a| a.to_string());
        let certs = info.peer_certs();
        let leaf = certs.as_ref().and_then(|c| c.first()).map(|c| c.as_ref());
        let report = request.into_inner();
        match conn.host_name(leaf) {
            Ok(name) if *name == report.host => {}
            Ok(name) => {
                self.refused.identity.fetch_add(1, Ordering::Relaxed);
                let message = format!(
                    "host id {:?} is not this client certificate's identity ({name}, its \
                     first DNS subjectAltName, or its CN without one): a host reports only \
                     as itself, one certificate one host",
                    report.host.chars().take(64).collect::<String>(),
                );
                self.log(Kind::Identity, &peer, &report.host, &message);
                return Err(Status::permission_denied(message));
            }
            Err(e) => {
                self.refused.identity.fetch_add(1, Ordering::Relaxed);
                let message = e.to_string();
                self.log(Kind::Identity, &peer, &report.host, &message);
                return Err(Status::permission_denied(message));
            }
        }
        let allowed = conn
            .bucket
            .lock()
            .map(|mut b| b.allow(now_ns()))
            .unwrap_or(false);
        if !allowed {
            self.refused.connection_rate.fetch_add(1, Ordering::Relaxed);
            let message = format!(
                "more than {} reports per second on this connection (max_reports_per_s)",
                self.max_reports_per_s
            );
            self.log(Kind::Rate, &peer, &report.host, &message);
            return Err(Status::resource_exhausted(message));
        }
        if let Err(e) = validate(&report) {
            self.refused.invalid.fetch_add(1, Ordering::Relaxed);
            self.log(Kind::Invalid, &peer, &report.host, &e.to_string());
            return Err(Status::invalid_argument(e.to_string()));
        }
        let now = now_ns();
        let admitted = {
            let mut state = self
                .state
                .lock()
                .map_err(|_| Status::internal("allocator state poisoned"))?;
            let role = self
                .leadership
                .lock()
                .map_err(|_| Status::internal("allocator leadership poisoned"))?
                .role(now);
            if let Role::Follower { leader } = role {
                drop(state);
                return Err(self.not_leader(leader, &peer, &report.host));
            }
            state
                .admit(&report.host, now)
                .map(|()| state.handle(&report, now))
        };
        match admitted {
            Ok(reply) => {
                // When each report was answered, for whoever needs the cadence (the
                // scrape-load test reads it with RUST_LOG=limiter_allocator=debug).
                tracing::debug!(host = %report.host, rules = report.rules.len(), "report granted");
                Ok(Response::new(reply))
            }
            Err(refusal) => {
                let (kind, message) = match refusal {
                    Refusal::FleetFull { max_hosts } => (
                        Kind::FleetFull,
                        format!(
                            "the fleet is full: {max_hosts} hosts reported within the last \
                             lease TTL (max_hosts = {max_hosts}); host {:?} is refused until \
                             one of them stops reporting",
                            report.host
                        ),
                    ),
                    Refusal::RateLimited { rate } => (
                        Kind::Rate,
                        format!(
                            "host {:?} sends more than {rate} reports per second \
                             (max_reports_per_s)",
                            report.host
                        ),
                    ),
                };
                self.log(kind, &peer, &report.host, &message);
                Err(Status::resource_exhausted(message))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::loggable;

    /// A host id with a newline, a forged log line, a terminal escape and a bidi
    /// override is logged escaped, on one line.
    #[test]
    fn a_refused_host_id_is_logged_escaped() {
        let hostile = "lb-1\n2026-12-04T00:00:00Z INFO forged\x1b[2K\u{202e}x";
        let logged = loggable(hostile);
        assert!(
            logged.chars().all(|c| c.is_ascii_graphic() || c == ' '),
            "{logged:?}"
        );
        assert_eq!(
            logged,
            "lb-1\\n2026-12-04T00:00:00Z INFO forged\\u{1b}[2K\\u{202e}x"
        );
        assert_eq!(loggable("lb-1"), "lb-1");
        assert_eq!(loggable(&"a".repeat(300)).len(), 64);
    }
}
