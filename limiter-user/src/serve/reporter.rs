//! The fleet report loop: this host's reports to the allocator and its grants back,
//! over mutual TLS (limiter_proto). What a report holds and what a grant does is the
//! fleet state's ([`crate::policy::fleet`]); this module only carries them, on deadlines, and
//! checks at start that the allocator will know this host by its name. With replicated
//! allocators it reports to one replica of `[fleet] allocator` at a time, follows a
//! follower's redirect only within that list, and applies no reply of an older term
//! than one it applied ([`limiter_fleet::failover`]). With sharded allocators
//! (`[[fleet.groups]]`) one loop runs per group, each with its own replicas and term
//! fence, and reports the rules routed to its group ([`limiter_fleet::shard`]).

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex, MutexGuard},
    time::{Duration, Instant},
};

use limiter_fleet::{
    failover::{Redirect, Replicas, TermFence},
    share::FAIL_OPEN_RETRY_MS,
};
use limiter_proto::{pb::allocator_client::AllocatorClient, TlsConnector};
use tokio::sync::broadcast;
use tonic::transport::Endpoint;

use crate::{config::FleetSpec, daemon::Daemon, error::Error, serve::shutdown::Shutdown};

// A FAIL_OPEN daemon's retries stay within what the allocator's report rate limit allows
// a daemon (its early reports' spacing).
const _: () = assert!(FAIL_OPEN_RETRY_MS >= limiter_proto::MIN_REPORT_SPACING_MS);

/// The host id must be the host this host's client certificate names (its first DNS SAN,
/// or its CN without any): the allocator refuses reports under any other name. Checked at
/// start, so a mismatch stops the daemon with this error instead of every report being
/// refused.
pub fn check_host_identity(spec: &FleetSpec) -> Result<(), Error> {
    let cert = spec.cert.display();
    let pem = std::fs::read(&spec.cert)
        .map_err(|e| Error::Fleet(format!("reading fleet.cert {cert}: {e}")))?;
    let name = limiter_proto::pem_cert_host_name(&pem)
        .map_err(|e| Error::Fleet(format!("fleet.cert {cert}: {e}")))?;
    if name == spec.host_id {
        return Ok(());
    }
    Err(Error::Fleet(format!(
        "fleet.host_id {:?} (default: the hostname) is not the host the client certificate \
         {cert} names ({name}: its first DNS subjectAltName, or its CN without one): the \
         allocator refuses reports under any other name; set host_id to it",
        spec.host_id,
    )))
}

fn lock(d: &Mutex<Daemon>) -> Result<MutexGuard<'_, Daemon>, Error> {
    d.lock()
        .map_err(|_| Error::Fleet("daemon state poisoned".into()))
}

/// Reports to group `group` of allocators (an index of `spec.groups`; 0 without
/// sharding) until shutdown: every report interval, and early when an unsaturated share
/// refuses frames (at most every 200 ms). Every call has a deadline; a failed call changes
/// nothing: shares move to STICKY and FAIL_OPEN on their deadlines. The first group's
/// loop also ages the shares (`fleet_tick`); another group's sends nothing while no rule
/// is routed to it.
pub async fn report_loop(
    daemon: Arc<Mutex<Daemon>>,
    spec: FleetSpec,
    group: usize,
    shutdown: broadcast::Sender<Shutdown>,
) -> Result<(), Error> {
    let Some(allocators) = spec.groups.get(group).map(|g| g.allocators.clone()) else {
        return Err(Error::Fleet(format!(
            "no allocator group {group} configured"
        )));
    };
    let group_name = spec.groups[group].name.clone();
    // The TLS files are read again for the handshake of every new connection once
    // they change: a renewed certificate is presented at the next reconnect (an
    // allocator's restart, a failover), with no restart of the daemon.
    let tls = Arc::new(
        limiter_proto::client_tls_reloading(limiter_proto::TlsPaths {
            ca: spec.ca.clone(),
            cert: spec.cert.clone(),
            key: spec.key.clone(),
        })
        .map_err(|e| Error::Fleet(e.to_string()))?,
    );
    lock(&daemon)?.fleet_watch_tls(Arc::clone(&tls));
    let deadline = Duration::from_millis(spec.report_interval_ms.clamp(100, 2000) / 2);
    // One lazy channel per replica: a switch costs no reconnect to one used before.
    let mut clients = Vec::with_capacity(allocators.len());
    for address in &allocators {
        let connector = TlsConnector::new(Arc::clone(&tls), &spec.server_name, *address, spec.bind)
            .map_err(|e| Error::Fleet(format!("allocator endpoint {address}: {e}")))?;
        // The connector does TLS: the URI only names the HTTP/2 authority.
        let endpoint = Endpoint::from_shared(format!("http://{address}"))
            .map_err(|e| Error::Fleet(format!("allocator endpoint {address}: {e}")))?
            .connect_timeout(deadline)
            .timeout(deadline);
        clients.push(
            AllocatorClient::new(endpoint.connect_with_connector_lazy(connector))
                .max_decoding_message_size(limiter_proto::MAX_MESSAGE_BYTES)
                .max_encoding_message_size(limiter_proto::MAX_MESSAGE_BYTES),
        );
    }
    let mut replicas = Replicas::new(allocators.clone());
    // Rules a group named an unlisted group for: logged at most every 10 s.
    let mut unknown_logged: Option<Instant> = None;
    let mut unknown_held_back = 0u64;
    let mut fence = TermFence::new(spec.lease_ttl_ms.saturating_mul(1_000_000));
    let mut interval = Duration::from_millis(spec.report_interval_ms);
    let mut next = Instant::now();
    let mut last_sent = Instant::now() - interval;
    let mut failures = 0u64;
    let mut tick_failures = 0u64;
    let mut stop = shutdown.subscribe();
    loop {
        // Every 50 ms (early reports, the shares' ticks), and on the report's deadline
        // itself rather than up to a tick after it.
        let tick = Duration::from_millis(50);
        let nap = match next.saturating_duration_since(Instant::now()) {
            // Due already (a group with nothing to report): the tick, not a spin.
            Duration::ZERO => tick,
            due => due.min(tick),
        };
        tokio::select! {
            _ = stop.recv() => return Ok(()),
            _ = tokio::time::sleep(nap) => {}
        }
        // A share that failed open after the last failed report is retried from then on
        // every 200 ms, not an interval after that report: it passes everything until a
        // report gets through.
        if failures > 0 && lock(&daemon)?.fleet_fails_open(group) {
            next = next.min(last_sent + Duration::from_millis(FAIL_OPEN_RETRY_MS));
        }
        let early = last_sent.elapsed()
            >= Duration::from_millis(limiter_proto::MIN_REPORT_SPACING_MS)
            && lock(&daemon)?.fleet_wants_early_report(group)?;
        let idle = group > 0 && !lock(&daemon)?.fleet_has_rules_for(group);
        if (Instant::now() >= next || early) && !idle {
            let Some(report) = lock(&daemon)?.fleet_report(group)? else {
                return Ok(());
            };
            last_sent = Instant::now();
            next = last_sent + interval;
            let at = replicas.current();
            let Some(client) = clients.get_mut(at) else {
                return Err(Error::Fleet("no allocator address configured".into()));
            };
            match client.report(report).await {
                Ok(reply) => {
                    let reply = reply.into_inner();
                    if failures > 0 {
                        tracing::info!(after = failures, allocator = %allocators[at], group = %group_name, "allocator reachable again");
                    }
                    failures = 0;
                    // A deposed leader's late reply must not override its successor's.
                    if !fence.admit(reply.term, limiter_fleet::clock::monotonic_ns()) {
                        tracing::warn!(
                            term = reply.term,
                            highest = fence.highest(),
                            allocator = %allocators[at],
                            group = %group_name,
                            "ignored grants of an older leader's term"
                        );
                        replicas.failed();
                    } else {
                        if reply.report_interval_ms > 0 {
                            interval = crate::policy::fleet::clamp_report_interval(
                                reply.report_interval_ms,
                                spec.lease_ttl_ms,
                            );
                        }
                        // A failure to install the shares is this host's problem, not the
                        // allocator's: log it and keep reporting (the shares in force
                        // stay, and move to STICKY on their deadlines).
                        match lock(&daemon)?.fleet_apply(group, &reply) {
                            Err(e) => {
                                tracing::warn!("installing the allocator's grants failed: {e}");
                            }
                            Ok(unknown) if !unknown.is_empty() => {
                                let due = unknown_logged
                                    .is_none_or(|t| t.elapsed() >= Duration::from_secs(10));
                                if due {
                                    let (rule, named) = &unknown[0];
                                    tracing::warn!(
                                        %rule,
                                        named_group = %named,
                                        rules = unknown.len(),
                                        held_back = unknown_held_back,
                                        allocator = %allocators[at],
                                        "the allocators say a group this host does not list in \
                                         [[fleet.groups]] grants these rules: they stay with \
                                         the first group"
                                    );
                                    unknown_logged = Some(Instant::now());
                                    unknown_held_back = 0;
                                } else {
                                    unknown_held_back += 1;
                                }
                            }
                            Ok(_) => {}
                        }
                    }
                }
                Err(status) => {
                    let leader = status
                        .metadata()
                        .get(limiter_proto::LEADER_METADATA)
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.parse::<SocketAddr>().ok());
                    let from = allocators[at];
                    let followed = match leader.map(|l| (l, replicas.redirected(&l))) {
                        Some((leader, Redirect::Followed(_))) => {
                            tracing::info!(%from, %leader, "following the allocators' leader");
                            true
                        }
                        Some((leader, Redirect::Unlisted(_))) => {
                            tracing::warn!(%from, %leader, group = %group_name, "a replica named a leader that is not in its group's allocator list: ignored");
                            false
                        }
                        Some((_, Redirect::Next(_))) => false,
                        None => {
                            replicas.failed();
                            false
                        }
                    };
                    // A follower named the leader: asked again at once, not after an
                    // interval, so a failover costs one round trip, and no failure.
                    if followed {
                        next = Instant::now();
                    } else {
                        failures += 1;
                        // Counted, and the credit of the last grant again while the lease
                        // holds: a leader's crash must not cut it for the gap.
                        lock(&daemon)?.fleet_report_failed(group);
                    }
                    // The first failure and then one in 30: an outage must not flood logs.
                    if !followed && (failures == 1 || failures.is_multiple_of(30)) {
                        tracing::warn!(
                            failures,
                            allocator = %from,
                            group = %group_name,
                            "report to the allocator failed: {}",
                            status.message()
                        );
                    }
                    // With replicas, the next one is tried soon rather than an interval
                    // later: the shares in force keep their deadlines meanwhile. So is it
                    // while a share fails open: it passes everything until a report gets
                    // through, so a returning allocator is found within 200 ms, not within
                    // an interval (one call at a time, within the allocator's rate limit).
                    let soon = if followed {
                        None
                    } else if lock(&daemon)?.fleet_fails_open(group) {
                        Some(FAIL_OPEN_RETRY_MS)
                    } else {
                        (allocators.len() > 1).then_some(limiter_proto::MIN_REPORT_SPACING_MS)
                    };
                    if let Some(ms) = soon {
                        next = Instant::now() + Duration::from_millis(ms);
                    }
                }
            }
        }
        // Like a failed install of grants, a failed tick must not end reporting: the
        // shares in force stay, the kernel keeps their deadlines, the next tick retries.
        // One loop ticks: the shares are the same whichever group grants them.
        if group > 0 {
            continue;
        }
        if let Err(e) = lock(&daemon)?.fleet_tick() {
            tick_failures += 1;
            if tick_failures == 1 || tick_failures.is_multiple_of(100) {
                tracing::warn!(
                    failures = tick_failures,
                    "updating the fleet shares failed: {e}"
                );
            }
        }
    }
}
