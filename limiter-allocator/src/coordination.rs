//! The replicas' coordination in etcd: the election of the leader and the quotas.
//!
//! Keys of a group named `name` (`[election] name`):
//! - `<name>/leader/…`: etcd's election (one key per candidate, on its lease; the oldest
//!   leads; its value is the candidate's advertised address);
//! - `<name>/quotas/<rule>`: `{"rate":…,"burst":…}`, one per rule;
//! - with sharding (`[election] shards = "<shards>"`, the same prefix in every group):
//!   `<shards>/<rule>` = the name of the group that grants the rule. Shared by the
//!   groups; a group grants only the rules assigned to it, and names the owner of the
//!   others in its replies (`elsewhere`). The config file's `[[quotas]]` seed the
//!   assignment of each of its rules to this group where the rule has none yet (the same
//!   version-0 transaction as the quotas); `shard assign` moves a rule, and every replica
//!   of every group watches the prefix.
//!
//! The quotas live in etcd: `quota set` on any replica writes there, every replica
//! watches the prefix, and a restart reads them back. The config file's `[[quotas]]` only
//! seed a rule whose key is absent (a transaction on the key's version being 0): once a
//! key exists, etcd's value wins over the file, and a file that says otherwise is
//! logged, not applied. Without etcd, quotas cannot change (refused, with the reason).
//!
//! With `[election] ca`, the replica reaches etcd over TLS: etcd's certificate must be
//! signed by that CA and name the endpoint's host, and `cert`/`key` answer etcd's
//! `--client-cert-auth`.
//!
//! Each session connects, seeds, loads, then watches, renews its election lease every
//! third of the TTL and campaigns; the first failure ends the session (the replica steps
//! down if it led), and the next session starts half a second later. The proof of
//! leadership itself is [`crate::election::Leadership`], checked on every report.

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::{anyhow, bail, Context as _, Result};
use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, Identity,
    TlsOptions, Txn, TxnOp, WatchOptions,
};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::{
    config::{check_quota, Election, EtcdTls, Quota},
    election::Leadership,
    now_ns,
    state::State,
};

/// How long one etcd request (not the campaign, which waits its turn) may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// Between a failed session and the next.
const RETRY: Duration = Duration::from_millis(500);

/// A quota as stored in etcd (the rule is the key's last part).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct StoredQuota {
    pub rate: u64,
    pub burst: u64,
}

pub fn quota_prefix(name: &str) -> String {
    format!("{name}/quotas/")
}

pub fn election_name(name: &str) -> String {
    format!("{name}/leader")
}

/// The assignment's keys: `<shards>/<rule>`.
pub fn shard_prefix(shards: &str) -> String {
    format!("{shards}/")
}

/// A rule's assignment as stored in etcd: (rule, group), or what is wrong with it.
pub fn decode_assignment(
    prefix: &str,
    key: &[u8],
    value: &[u8],
) -> Result<(String, String), String> {
    let key = std::str::from_utf8(key).map_err(|_| "the key is not UTF-8".to_string())?;
    let rule = key
        .strip_prefix(prefix)
        .ok_or_else(|| format!("{key:?} is not under {prefix:?}"))?;
    if !limiter_proto::valid_rule_name(rule) {
        return Err(format!("{key}: {rule:?} is not a rule name"));
    }
    let group = std::str::from_utf8(value)
        .ok()
        .filter(|g| limiter_proto::valid_rule_name(g))
        .ok_or_else(|| {
            format!(
                "{key}: {:?} is not a group name (1-{} bytes of [A-Za-z0-9._-])",
                String::from_utf8_lossy(&value[..value.len().min(80)]),
                limiter_proto::MAX_RULE_LEN
            )
        })?;
    Ok((rule.to_string(), group.to_string()))
}

/// Assigns each of `rules` to `group` where the rule has no assignment yet.
pub async fn seed_assignment(
    client: &mut Client,
    prefix: &str,
    rules: &[String],
    group: &str,
) -> Result<()> {
    for rule in rules {
        let key = format!("{prefix}{rule}");
        let txn = Txn::new()
            .when([Compare::version(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key.clone(), group, None)]);
        let reply = within("seeding a rule's assignment", client.txn(txn)).await?;
        if reply.succeeded() {
            tracing::info!(%rule, %group, "rule assigned to this group in etcd (it had no group)");
        }
    }
    Ok(())
}

/// The valid assignment under the prefix and the revision it was read at (invalid
/// entries are logged and left out: their rules are granted by no group).
pub async fn load_assignment(
    client: &mut Client,
    prefix: &str,
) -> Result<(HashMap<String, String>, i64)> {
    let reply = within(
        "reading the rules' assignment to groups",
        client.get(prefix, Some(GetOptions::new().with_prefix())),
    )
    .await?;
    let revision = reply.header().map_or(0, |h| h.revision());
    let mut out = HashMap::new();
    for kv in reply.kvs() {
        match decode_assignment(prefix, kv.key(), kv.value()) {
            Ok((rule, group)) => {
                out.insert(rule, group);
            }
            Err(e) => tracing::error!("ignored a rule's assignment in etcd: {e}"),
        }
    }
    Ok((out, revision))
}

/// `shard assign`: `rule` moves to `group`, refused unless that group has a quota for
/// it in etcd (a rule moved to a group without one would be granted by nobody).
pub async fn assign(election: &Election, shards: &str, rule: &str, group: &str) -> Result<()> {
    let mut client = connect(election).await?;
    let key = format!("{}{rule}", shard_prefix(shards));
    let quota = format!("{}{rule}", quota_prefix(group));
    let txn = Txn::new()
        .when([Compare::version(quota.clone(), CompareOp::Greater, 0)])
        .and_then([TxnOp::put(key, group, None)]);
    let reply = within("writing the rule's assignment", client.txn(txn)).await?;
    if !reply.succeeded() {
        bail!(
            "group {group:?} has no quota for rule {rule:?} in etcd ({quota} is absent): set one \
             first with `limiter-allocator quota set` on a replica of that group (or list the \
             rule in its [[quotas]]), so the rule is never left without a group that grants it"
        );
    }
    Ok(())
}

/// `shard list`: the assignment etcd holds, by rule.
pub async fn list_assignment(election: &Election, shards: &str) -> Result<Vec<(String, String)>> {
    let mut client = connect(election).await?;
    let (map, _) = load_assignment(&mut client, &shard_prefix(shards)).await?;
    let mut out: Vec<(String, String)> = map.into_iter().collect();
    out.sort();
    Ok(out)
}

/// The quota a key and value of the prefix hold, or what is wrong with them: a value
/// written to etcd by hand is held to `quota set`'s checks before any replica uses it.
pub fn decode(prefix: &str, key: &[u8], value: &[u8]) -> Result<Quota, String> {
    let key = std::str::from_utf8(key).map_err(|_| "the key is not UTF-8".to_string())?;
    let rule = key
        .strip_prefix(prefix)
        .ok_or_else(|| format!("{key:?} is not under {prefix:?}"))?;
    let stored: StoredQuota = serde_json::from_slice(value).map_err(|e| {
        format!(
            "{key}: {e} (expected {{\"rate\": N, \"burst\": N}}, got {:?})",
            String::from_utf8_lossy(&value[..value.len().min(80)])
        )
    })?;
    let quota = Quota {
        rule: rule.to_string(),
        rate: stored.rate,
        burst: stored.burst,
    };
    check_quota(&quota).map_err(|e| format!("{key}: {e}"))?;
    Ok(quota)
}

pub fn encode(quota: &Quota) -> Result<Vec<u8>> {
    Ok(serde_json::to_vec(&StoredQuota {
        rate: quota.rate,
        burst: quota.burst,
    })?)
}

/// A client of the group's etcd cluster (requests fail, rather than wait, on a member
/// that has lost its cluster's leader).
pub async fn connect(election: &Election) -> Result<Client> {
    let mut options = ConnectOptions::new()
        .with_connect_timeout(REQUEST_TIMEOUT)
        .with_keep_alive(Duration::from_millis(election.ttl_ms / 3), REQUEST_TIMEOUT)
        .with_keep_alive_while_idle(true)
        .with_require_leader(true);
    if let Some(tls) = &election.tls {
        options = options.with_tls(tls_options(tls)?);
    }
    within(
        "connecting to etcd",
        Client::connect(&election.etcd, Some(options)),
    )
    .await
    .with_context(|| format!("etcd at {}", election.etcd.join(", ")))
}

/// The TLS files of `[election]`, read (each error names its file and key). Read again
/// on every session, so replaced certificates take effect without a restart.
pub fn tls_options(tls: &EtcdTls) -> Result<TlsOptions> {
    let read = |path: &std::path::Path, key: &str| {
        std::fs::read(path).with_context(|| format!("reading election.{key} {}", path.display()))
    };
    let mut options = TlsOptions::new().ca_certificate(Certificate::from_pem(read(&tls.ca, "ca")?));
    if let Some((cert, key)) = &tls.identity {
        options = options.identity(Identity::from_pem(read(cert, "cert")?, read(key, "key")?));
    }
    Ok(options)
}

/// `e` and its sources: etcd-client's own text of a failed TLS handshake is only
/// "transport error", and the reason (an unknown CA, a name mismatch) is below it.
fn chain(e: &etcd_client::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = s.source();
    }
    text
}

/// `fut` within [`REQUEST_TIMEOUT`], its error and a timeout both named by `what`.
async fn within<T>(
    what: &str,
    fut: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T> {
    match tokio::time::timeout(REQUEST_TIMEOUT, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(anyhow!("{what}: {}", chain(&e))),
        Err(_) => Err(anyhow!("{what}: no answer within {REQUEST_TIMEOUT:?}")),
    }
}

/// Writes each config quota whose key is absent; returns the file's quotas whose key
/// was present (etcd's value kept).
pub async fn seed(client: &mut Client, prefix: &str, quotas: &[Quota]) -> Result<Vec<Quota>> {
    let mut kept = Vec::new();
    for q in quotas {
        let key = format!("{prefix}{}", q.rule);
        let txn = Txn::new()
            .when([Compare::version(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key.clone(), encode(q)?, None)]);
        let reply = within("seeding a quota", client.txn(txn)).await?;
        if reply.succeeded() {
            tracing::info!(rule = %q.rule, rate = q.rate, burst = q.burst, "quota seeded into etcd from the config file");
        } else {
            kept.push(q.clone());
        }
    }
    Ok(kept)
}

/// Every valid quota under the prefix, and the revision they were read at. Invalid
/// entries are logged and left out.
pub async fn load(client: &mut Client, prefix: &str) -> Result<(Vec<Quota>, i64)> {
    let reply = within(
        "reading the quotas",
        client.get(prefix, Some(GetOptions::new().with_prefix())),
    )
    .await?;
    let revision = reply.header().map_or(0, |h| h.revision());
    let mut quotas = Vec::new();
    for kv in reply.kvs() {
        match decode(prefix, kv.key(), kv.value()) {
            Ok(q) => quotas.push(q),
            Err(e) => tracing::error!("ignored a quota in etcd: {e}"),
        }
    }
    Ok((quotas, revision))
}

/// `quota set` with replicas: the quota written to etcd (every replica applies it from
/// its watch). An error names etcd and says nothing changed.
pub async fn put_quota(election: &Election, quota: &Quota) -> Result<()> {
    let mut client = connect(election).await?;
    let key = format!("{}{}", quota_prefix(&election.name), quota.rule);
    within("writing the quota", client.put(key, encode(quota)?, None)).await?;
    // Sharded: a rule no group grants yet is this group's from now on.
    if let Some(shards) = &election.shards {
        seed_assignment(
            &mut client,
            &shard_prefix(shards),
            std::slice::from_ref(&quota.rule),
            &election.name,
        )
        .await?;
    }
    Ok(())
}

/// `quota list` with replicas: what etcd holds.
pub async fn list_quotas(election: &Election) -> Result<Vec<Quota>> {
    let mut client = connect(election).await?;
    Ok(load(&mut client, &quota_prefix(&election.name)).await?.0)
}

/// Makes the state's quotas exactly `quotas`: changed and new ones set, missing ones
/// removed.
fn replace_quotas(state: &Mutex<State>, quotas: &[Quota]) -> Result<()> {
    let mut state = state
        .lock()
        .map_err(|_| anyhow!("allocator state poisoned"))?;
    let now = now_ns();
    let wanted: BTreeMap<&str, &Quota> = quotas.iter().map(|q| (q.rule.as_str(), q)).collect();
    for old in state.quotas() {
        if !wanted.contains_key(old.rule.as_str()) {
            state.remove_quota(&old.rule);
        }
    }
    for q in quotas {
        state.set_quota(q, now);
    }
    Ok(())
}

/// One replica's coordination task.
pub struct Replica {
    pub election: Election,
    /// The config file's quotas (seeds).
    pub seed: Vec<Quota>,
    pub state: Arc<Mutex<State>>,
    pub leadership: Arc<Mutex<Leadership>>,
}

impl Replica {
    /// Runs sessions until `shutdown` turns true; then gives up the lease (a clean stop
    /// hands leadership over at once, not a TTL later).
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) {
        let mut failures = 0u64;
        let mut old_lease: Option<i64> = None;
        loop {
            let result = tokio::select! {
                r = self.session(&mut old_lease) => r,
                _ = shutdown.changed() => Ok(()),
            };
            self.step_down("session ended");
            if *shutdown.borrow() {
                if let Some(id) = old_lease {
                    if let Ok(mut client) = connect(&self.election).await {
                        let _ = within("revoking the lease", client.lease_revoke(id)).await;
                    }
                }
                return;
            }
            if let Err(e) = result {
                failures += 1;
                self.set_reachable(false);
                self.with_leadership(|l| l.etcd_error = Some(format!("{e:#}")));
                // The first failure and then one in 20: an outage must not flood logs.
                if failures == 1 || failures.is_multiple_of(20) {
                    tracing::warn!(failures, "etcd: {e:#}; not leading; retrying");
                }
            }
            tokio::time::sleep(RETRY).await;
        }
    }

    fn with_leadership<T>(&self, f: impl FnOnce(&mut Leadership) -> T) -> Option<T> {
        self.leadership.lock().ok().map(|mut l| f(&mut l))
    }

    fn set_reachable(&self, reachable: bool) {
        self.with_leadership(|l| {
            l.etcd_reachable = reachable;
            if reachable {
                l.etcd_error = None;
            }
        });
    }

    fn step_down(&self, why: &str) {
        let was = self.with_leadership(|l| {
            let was = l.leading(now_ns()).is_some() || l.expired(now_ns());
            l.lease_lost();
            was
        });
        if was == Some(true) {
            tracing::warn!(
                reason = why,
                "stepped down: no longer the allocators' leader"
            );
        }
    }

    async fn session(&self, old_lease: &mut Option<i64>) -> Result<()> {
        let e = &self.election;
        let mut client = connect(e).await?;
        // A lease of this process's previous session may still hold the election:
        // given up first, or no one leads until it expires.
        if let Some(id) = old_lease.take() {
            let _ = within("revoking the previous lease", client.lease_revoke(id)).await;
        }
        let prefix = quota_prefix(&e.name);
        let present = seed(&mut client, &prefix, &self.seed).await?;
        let (quotas, revision) = load(&mut client, &prefix).await?;
        for file in &present {
            if let Some(held) = quotas.iter().find(|q| q.rule == file.rule && *q != file) {
                tracing::info!(
                    rule = %file.rule,
                    file_rate = file.rate,
                    file_burst = file.burst,
                    etcd_rate = held.rate,
                    etcd_burst = held.burst,
                    "the config file's quota is not applied: etcd holds another, which wins once set (change it with `limiter-allocator quota set`)"
                );
            }
        }
        replace_quotas(&self.state, &quotas)?;
        let mut shard_watch = None;
        if let Some(shards) = &e.shards {
            let shard_prefix = shard_prefix(shards);
            let rules: Vec<String> = self.seed.iter().map(|q| q.rule.clone()).collect();
            seed_assignment(&mut client, &shard_prefix, &rules, &e.name).await?;
            let (assignment, revision) = load_assignment(&mut client, &shard_prefix).await?;
            {
                let mut state = self
                    .state
                    .lock()
                    .map_err(|_| anyhow!("allocator state poisoned"))?;
                state.replace_assignment(&assignment, now_ns());
            }
            let stream = within(
                "watching the rules' assignment",
                client.watch(
                    shard_prefix.clone(),
                    Some(
                        WatchOptions::new()
                            .with_prefix()
                            .with_start_revision(revision + 1),
                    ),
                ),
            )
            .await?;
            shard_watch = Some((shard_prefix, stream));
        }
        self.set_reachable(true);
        let mut watch = within(
            "watching the quotas",
            client.watch(
                prefix.clone(),
                Some(
                    WatchOptions::new()
                        .with_prefix()
                        .with_start_revision(revision + 1),
                ),
            ),
        )
        .await?;

        let ttl_s = i64::try_from(e.ttl_ms / 1000).unwrap_or(i64::MAX);
        let sent = now_ns();
        let lease = within(
            "granting the election lease",
            client.lease_grant(ttl_s, None),
        )
        .await?;
        if lease.ttl() != ttl_s {
            tracing::warn!(
                asked = ttl_s,
                granted = lease.ttl(),
                "etcd granted another election TTL than ttl_ms asks (etcd raises TTLs below its minimum)"
            );
        }
        let lease_id = lease.id();
        *old_lease = Some(lease_id);
        self.with_leadership(|l| l.lease_alive(sent));
        // Opening the stream sends a first keepalive and waits for its answer (etcd-client
        // consumes it): the lease was alive when that request left.
        let opened = now_ns();
        let (mut keeper, mut alive) =
            within("keeping the lease alive", client.lease_keep_alive(lease_id)).await?;
        self.with_leadership(|l| l.lease_alive(opened));
        // Send times of the keepalives sent since, in order: etcd answers each in turn.
        let mut in_flight: VecDeque<u64> = VecDeque::new();

        let name = election_name(&e.name);
        let mut campaigner = client.clone();
        let advertise = e.advertise.to_string();
        let campaign_name = name.clone();
        let campaign = async move {
            campaigner
                .campaign(campaign_name, advertise, lease_id)
                .await
        };
        tokio::pin!(campaign);
        let mut campaigning = true;
        let mut won_key: Option<Vec<u8>> = None;

        let period = Duration::from_millis(e.ttl_ms / 3);
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut observer = client.clone();
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    let now = now_ns();
                    if self.with_leadership(|l| l.expired(now)).unwrap_or(true) {
                        bail!("the election lease is not renewed: stepping down before it may expire");
                    }
                    if in_flight.len() >= 3 {
                        bail!("etcd acknowledges no keepalive");
                    }
                    in_flight.push_back(now);
                    within("renewing the election lease", keeper.keep_alive()).await?;
                    // Who leads, for followers' redirects; for the leader, a check that
                    // etcd still names its key (deleted by hand, it is not the leader).
                    let leader = within("reading the leader", observer.leader(name.clone())).await;
                    let leader_kv = leader.as_ref().ok().and_then(|r| r.kv());
                    if let Some(mine) = &won_key {
                        if leader.is_ok() && leader_kv.map(|kv| kv.key()) != Some(mine.as_slice()) {
                            bail!("etcd no longer names this replica's key as the leader's");
                        }
                    } else {
                        let addr = leader_kv.and_then(|kv| kv.value_str().ok()?.parse::<SocketAddr>().ok());
                        self.with_leadership(|l| l.observed(addr));
                    }
                }
                reply = alive.message() => {
                    let reply = reply
                        .map_err(|e| anyhow!("the lease's keepalive stream: {e}"))?
                        .ok_or_else(|| anyhow!("etcd closed the lease's keepalive stream"))?;
                    // An answer nobody asked for proves nothing about when.
                    let Some(sent) = in_flight.pop_front() else {
                        continue;
                    };
                    if reply.ttl() <= 0 {
                        bail!("etcd says the election lease has expired");
                    }
                    self.with_leadership(|l| l.lease_alive(sent));
                }
                won = &mut campaign, if campaigning => {
                    campaigning = false;
                    let won = won.map_err(|e| anyhow!("campaigning: {e}"))?;
                    let key = won
                        .leader()
                        .ok_or_else(|| anyhow!("etcd's campaign reply names no leader key"))?;
                    let term = u64::try_from(key.rev()).unwrap_or(0);
                    won_key = Some(key.key().to_vec());
                    self.lead(term)?;
                }
                event = watch.message() => {
                    let event = event
                        .map_err(|e| anyhow!("the quota watch: {e}"))?
                        .ok_or_else(|| anyhow!("etcd closed the quota watch"))?;
                    if event.canceled() {
                        bail!("etcd cancelled the quota watch: {}", event.cancel_reason());
                    }
                    self.apply(&prefix, event.events())?;
                }
                event = async {
                    match &mut shard_watch {
                        Some((_, stream)) => stream.message().await,
                        None => std::future::pending().await,
                    }
                } => {
                    let event = event
                        .map_err(|e| anyhow!("the assignment watch: {e}"))?
                        .ok_or_else(|| anyhow!("etcd closed the assignment watch"))?;
                    if event.canceled() {
                        bail!("etcd cancelled the assignment watch: {}", event.cancel_reason());
                    }
                    if let Some((shard_prefix, _)) = &shard_watch {
                        self.apply_assignment(shard_prefix, event.events())?;
                    }
                }
            }
        }
    }

    fn apply_assignment(&self, prefix: &str, events: &[etcd_client::Event]) -> Result<()> {
        let mut state = self
            .state
            .lock()
            .map_err(|_| anyhow!("allocator state poisoned"))?;
        let now = now_ns();
        let mine = &self.election.name;
        for ev in events {
            let Some(kv) = ev.kv() else { continue };
            match ev.event_type() {
                EventType::Put => match decode_assignment(prefix, kv.key(), kv.value()) {
                    Ok((rule, group)) => {
                        let was = state.owns(&rule);
                        state.assign(&rule, Some(&group), now);
                        if group == *mine && !was {
                            tracing::info!(%rule, "rule assigned to this group: learning what hosts hold for a lease TTL, then granting");
                        } else if group != *mine && was {
                            tracing::info!(%rule, %group, "rule moved to another group: no more grants here");
                        }
                    }
                    Err(e) => tracing::error!(
                        "ignored a rule's assignment written to etcd: {e}; the rule stays where it was"
                    ),
                },
                EventType::Delete => {
                    let key = String::from_utf8_lossy(kv.key());
                    if let Some(rule) = key.strip_prefix(prefix) {
                        tracing::info!(rule, "rule's assignment deleted in etcd: no group grants it");
                        state.assign(rule, None, now);
                    }
                }
            }
        }
        Ok(())
    }

    /// Won: a fresh state that learns what hosts hold for one lease TTL before it
    /// reallocates (they may hold the previous leader's grants), then leads.
    fn lead(&self, term: u64) -> Result<()> {
        let now = now_ns();
        {
            let mut state = self
                .state
                .lock()
                .map_err(|_| anyhow!("allocator state poisoned"))?;
            let fresh = state.restarted(now);
            *state = fresh;
            state.term = term;
            let won = self.with_leadership(|l| l.won(term, now)).unwrap_or(false);
            if !won {
                bail!("won the election after the lease's margin had passed");
            }
        }
        tracing::info!(term, advertise = %self.election.advertise, "leading the allocators");
        Ok(())
    }

    fn apply(&self, prefix: &str, events: &[etcd_client::Event]) -> Result<()> {
        let mut state = self
            .state
            .lock()
            .map_err(|_| anyhow!("allocator state poisoned"))?;
        let now = now_ns();
        for ev in events {
            let Some(kv) = ev.kv() else { continue };
            match ev.event_type() {
                EventType::Put => match decode(prefix, kv.key(), kv.value()) {
                    Ok(q) => {
                        tracing::info!(rule = %q.rule, rate = q.rate, burst = q.burst, "quota changed in etcd");
                        state.set_quota(&q, now);
                    }
                    Err(e) => tracing::error!(
                        "ignored a quota written to etcd: {e}; the rule keeps its quota"
                    ),
                },
                EventType::Delete => {
                    let rule = String::from_utf8_lossy(kv.key());
                    if let Some(rule) = rule.strip_prefix(prefix) {
                        tracing::info!(rule, "quota deleted in etcd: the rule gets no grants");
                        state.remove_quota(rule);
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

    use super::*;

    #[test]
    fn stored_quotas_round_trip_and_bad_ones_say_what_is_wrong() {
        let prefix = quota_prefix("g");
        let q = Quota {
            rule: "web".into(),
            rate: 1000,
            burst: 100,
        };
        assert_eq!(
            decode(&prefix, b"g/quotas/web", &encode(&q).unwrap()),
            Ok(q)
        );
        for (key, value, what) in [
            (
                &b"g/quotas/web"[..],
                &b"{\"rate\":0,\"burst\":1}"[..],
                "at least 1",
            ),
            (b"g/quotas/web", b"1000", "expected {\"rate\": N"),
            (
                b"g/quotas/web",
                b"{\"rate\":1,\"burst\":1,\"x\":1}",
                "unknown field",
            ),
            (b"g/quotas/a b", b"{\"rate\":1,\"burst\":1}", "rule name"),
            (b"other/web", b"{\"rate\":1,\"burst\":1}", "is not under"),
            (b"g/quotas/\xff", b"{\"rate\":1,\"burst\":1}", "not UTF-8"),
        ] {
            let e = decode(&prefix, key, value).unwrap_err();
            assert!(e.contains(what), "{e}");
        }
    }

    #[test]
    fn assignments_decode_and_bad_ones_say_what_is_wrong() {
        let prefix = shard_prefix("limiter/shards");
        assert_eq!(
            decode_assignment(&prefix, b"limiter/shards/web", b"alloc-a"),
            Ok(("web".to_string(), "alloc-a".to_string()))
        );
        for (key, value, what) in [
            (
                &b"limiter/shards/web"[..],
                &b"alloc a"[..],
                "is not a group name",
            ),
            (b"limiter/shards/web", b"", "is not a group name"),
            (b"limiter/shards/a b", b"alloc-a", "is not a rule name"),
            (b"other/web", b"alloc-a", "is not under"),
            (b"limiter/shards/\xff", b"alloc-a", "not UTF-8"),
        ] {
            let e = decode_assignment(&prefix, key, value).unwrap_err();
            assert!(e.contains(what), "{e}");
        }
    }
}
