//! The daemon's side of the fleet: one share state machine per rule with an aggregate
//! limit, reports built from the counters, grants applied to the rule table.
//!
//! A rule's `rate`/`burst` in the config are its global quota. What the kernel enforces
//! is the host's share: quota ÷ fleet_size with burst 1 while bootstrapping, then the
//! granted share. The share state and its deadlines go into the rule's map entry; the
//! kernel applies FAIL_OPEN on its own clock, so it happens on time even if this daemon
//! is dead.
//!
//! A grant of rate 0 is a closed share, shown as rate 0: its entry carries
//! `RULE_CLOSED_UNTIL_LAPSE` and, as its aggregate, the bootstrap share (quota ÷
//! fleet_size, burst 1). The kernel refuses everything until the lease lapses and then
//! meters the bootstrap share, as for a host joining mid-outage, on its own clock even
//! with this daemon dead. A lapsed closed share that refuses frames also rejoins here
//! (`Share::rejoin`): this daemon notices the refusals on its 50 ms poll, rewrites the
//! rule in BOOTSTRAP with one token and asks for a grant at once.

use std::{collections::BTreeMap, time::Duration};

use limiter_common::abi::{
    RULE_CLOSED_UNTIL_LAPSE, SHARE_BOOTSTRAP, SHARE_FAIL_OPEN, SHARE_LEASED, SHARE_STANDALONE,
    SHARE_STICKY,
};
use limiter_fleet::share::{FailMode, Grant, Share, ShareParams, ShareState};
use limiter_proto::pb::{ReportReply, ReportRequest, RuleReport};

use crate::{
    config::{self, FleetSpec, RateSpec, RuleSpec},
    ruleset::RuleTable,
};

pub use limiter_fleet::clock::monotonic_ns;

pub fn share_params(spec: &FleetSpec, fleet_size: u32) -> ShareParams {
    ShareParams {
        fleet_size,
        lease_ttl: Duration::from_millis(spec.lease_ttl_ms),
        sticky_max: Duration::from_secs(spec.sticky_max_s),
        report_interval: Duration::from_millis(spec.report_interval_ms),
    }
}

fn abi_state(state: ShareState) -> u32 {
    match state {
        ShareState::Bootstrap => SHARE_BOOTSTRAP,
        ShareState::Leased => SHARE_LEASED,
        ShareState::Sticky => SHARE_STICKY,
        ShareState::FailOpen => SHARE_FAIL_OPEN,
    }
}

fn fail_mode(rule: &RuleSpec) -> FailMode {
    match rule.fail_mode {
        config::FailMode::Open => FailMode::Open,
        config::FailMode::Static => FailMode::Static,
    }
}

/// Counter totals of one rule at the last report.
#[derive(Clone, Copy, Debug, Default)]
struct Sample {
    offered: u64,
    dropped: u64,
}

pub struct FleetState {
    pub spec: FleetSpec,
    params: ShareParams,
    shares: BTreeMap<String, Share>,
    last: BTreeMap<String, Sample>,
    last_at: u64,
    /// Rules that left BOOTSTRAP or FAIL_OPEN, with the grant's token count, for the bucket.
    pub pending_tokens: BTreeMap<String, u64>,
    /// A closed share rejoined: report at once (its grant request).
    asking: bool,
}

impl FleetState {
    pub fn new(spec: FleetSpec, fleet_size: u32, rules: &[RuleSpec], now: u64) -> FleetState {
        let mut fleet = FleetState {
            params: share_params(&spec, fleet_size),
            spec,
            shares: BTreeMap::new(),
            last: BTreeMap::new(),
            last_at: now,
            pending_tokens: BTreeMap::new(),
            asking: false,
        };
        fleet.sync_rules(rules, now);
        fleet
    }

    /// After a (re)load: new rules bootstrap, removed ones go, quotas follow the file.
    pub fn sync_rules(&mut self, rules: &[RuleSpec], now: u64) {
        let fleet_rules: BTreeMap<&str, (&RateSpec, &RuleSpec)> = rules
            .iter()
            .filter_map(|r| r.aggregate.as_ref().map(|a| (r.name.as_str(), (a, r))))
            .collect();
        self.shares
            .retain(|name, _| fleet_rules.contains_key(name.as_str()));
        for (name, (quota, rule)) in fleet_rules {
            match self.shares.get_mut(name) {
                Some(share) => share.set_quota(quota.rate),
                None => {
                    let share = Share::bootstrap(quota.rate, fail_mode(rule), self.params, now);
                    self.shares.insert(name.to_string(), share);
                }
            }
        }
    }

    pub fn is_fleet_rule(&self, name: &str) -> bool {
        self.shares.contains_key(name)
    }

    /// The rules as this host enforces them: each fleet rule's aggregate is its share.
    /// A closed share (rate 0) is compiled as the bootstrap share it rejoins at (quota ÷
    /// fleet_size, burst 1); [`FleetState::annotate`] marks it closed until its lease
    /// lapses, so the kernel refuses everything until then and runs it as a joiner after.
    pub fn shape(&self, rules: &[RuleSpec]) -> Vec<RuleSpec> {
        rules
            .iter()
            .map(|r| {
                let mut r = r.clone();
                if let Some(share) = self.shares.get(&r.name) {
                    r.aggregate = Some(if share.rate() == 0 {
                        RateSpec {
                            rate: share.rejoin_rate(),
                            burst: 1,
                        }
                    } else {
                        RateSpec {
                            rate: share.rate(),
                            burst: share.burst(),
                        }
                    });
                }
                r
            })
            .collect()
    }

    /// Writes each fleet rule's state and deadlines into its map entry.
    pub fn annotate(&self, table: &mut RuleTable, now: u64) {
        for (slot, rule) in &mut table.rules {
            let name = table
                .slots
                .iter()
                .find(|(_, s)| *s == slot)
                .map(|(n, _)| n.as_str());
            match name.and_then(|n| self.shares.get(n)) {
                Some(share) => {
                    rule.share_state = abi_state(share.state(now));
                    (rule.lease_expires_ns, rule.fail_open_at_ns) = share.deadlines();
                    if share.rate() == 0 {
                        // A zero grant: nothing passes until the lease lapses, then the
                        // bootstrap share `shape` compiled (FAIL_OPEN still overrides it
                        // on its deadline). Shown as rate 0, burst 0.
                        rule.flags |= RULE_CLOSED_UNTIL_LAPSE;
                        rule.rate = 0;
                        rule.burst = 0;
                    }
                }
                None => {
                    rule.share_state = SHARE_STANDALONE;
                    (rule.lease_expires_ns, rule.fail_open_at_ns) = (0, 0);
                }
            }
        }
    }

    /// Every fleet rule's state now; a change calls for a reinstall.
    pub fn states(&self, now: u64) -> BTreeMap<String, ShareState> {
        self.shares
            .iter()
            .map(|(n, s)| (n.clone(), s.state(now)))
            .collect()
    }

    /// The report for this interval from counter totals (offered = passed + dropped).
    pub fn report(&mut self, totals: &BTreeMap<String, (u64, u64)>, now: u64) -> ReportRequest {
        let elapsed = now.saturating_sub(self.last_at).max(1) as f64 / 1e9;
        let mut rules = Vec::new();
        for (name, share) in &self.shares {
            let (offered, dropped) = totals.get(name).copied().unwrap_or_default();
            let last = self
                .last
                .get(name)
                .copied()
                .unwrap_or(Sample { offered, dropped });
            let held = match share.state(now) {
                ShareState::Leased | ShareState::Sticky => share.rate(),
                _ => 0,
            };
            rules.push(RuleReport {
                rule: name.clone(),
                demand: (offered.saturating_sub(last.offered) as f64 / elapsed) as u64,
                held,
                denials: dropped.saturating_sub(last.dropped),
            });
            self.last.insert(name.clone(), Sample { offered, dropped });
        }
        self.last_at = now;
        self.asking = false;
        ReportRequest {
            version: limiter_proto::VERSION,
            host: self.spec.host_id.clone(),
            rules,
        }
    }

    /// Refusals since the last report, per the counter totals.
    fn denials(&self, name: &str, totals: &BTreeMap<String, (u64, u64)>) -> u64 {
        let dropped = totals.get(name).map_or(0, |t| t.1);
        let last = self.last.get(name).map_or(dropped, |s| s.dropped);
        dropped.saturating_sub(last)
    }

    /// Whether refusals since the last report call for an early one, or a closed share
    /// rejoined and asks for its grant.
    pub fn wants_early_report(&self, totals: &BTreeMap<String, (u64, u64)>, now: u64) -> bool {
        self.asking
            || self
                .shares
                .iter()
                .any(|(name, share)| share.wants_early_report(self.denials(name, totals), now))
    }

    /// Lapsed closed shares that refused frames since the last report rejoin
    /// (`Share::rejoin`: BOOTSTRAP at quota ÷ fleet_size, burst 1) with one token, and
    /// the next report goes out at once. Returns whether any did (the rules need a
    /// reinstall).
    pub fn rejoin(&mut self, totals: &BTreeMap<String, (u64, u64)>, now: u64) -> bool {
        let denials: Vec<(String, u64)> = self
            .shares
            .keys()
            .map(|name| (name.clone(), self.denials(name, totals)))
            .collect();
        let mut any = false;
        for (name, d) in denials {
            if self.shares.get_mut(&name).is_some_and(|s| s.rejoin(d, now)) {
                tracing::info!(
                    rule = %name,
                    "closed share refusing frames with its lease lapsed: bootstrap rate until \
                     a grant"
                );
                self.pending_tokens.insert(name, 1);
                any = true;
            }
        }
        self.asking |= any;
        any
    }

    /// Applies the allocator's grants.
    pub fn apply(&mut self, reply: &ReportReply, now: u64) {
        for g in &reply.grants {
            let Some(share) = self.shares.get_mut(&g.rule) else {
                continue;
            };
            let grant = Grant {
                rate: g.rate,
                burst: g.burst,
                tokens: g.tokens,
                ttl: Duration::from_millis(g.ttl_ms),
                saturated: g.saturated,
            };
            // Out of BOOTSTRAP, FAIL_OPEN, a zero grant or a burst of 1 the bucket's TAT
            // means no share's fill: the grant takes over with its token count (≤ 1; 0
            // for a zero grant), never a fresh burst (`Share::takes_over`).
            if share.takes_over(&grant, now) {
                self.pending_tokens.insert(g.rule.clone(), g.tokens.min(1));
            }
            share.on_grant(&grant, now);
        }
    }
}

/// The host id must be a name of this host's client certificate (its DNS SANs, or its CN
/// without any): the allocator refuses reports under any other name. Checked at start, so
/// a mismatch stops the daemon with this error instead of every report being refused.
pub fn check_host_identity(spec: &FleetSpec) -> Result<(), crate::Error> {
    let cert = spec.cert.display();
    let pem = std::fs::read(&spec.cert)
        .map_err(|e| crate::Error::Fleet(format!("reading fleet.cert {cert}: {e}")))?;
    let names = limiter_proto::pem_cert_host_names(&pem)
        .map_err(|e| crate::Error::Fleet(format!("fleet.cert {cert}: {e}")))?;
    if names.contains(&spec.host_id) {
        return Ok(());
    }
    Err(crate::Error::Fleet(format!(
        "fleet.host_id {:?} (default: the hostname) is not a name of the client certificate \
         {cert} ({}): the allocator refuses reports under any other name; set host_id to one \
         of them",
        spec.host_id,
        names.join(", ")
    )))
}

fn lock(
    d: &std::sync::Mutex<crate::daemon::Daemon>,
) -> Result<std::sync::MutexGuard<'_, crate::daemon::Daemon>, crate::Error> {
    d.lock()
        .map_err(|_| crate::Error::Fleet("daemon state poisoned".into()))
}

/// Reports to the allocator until shutdown: every report interval, and early when an
/// unsaturated share refuses frames (at most every 200 ms). Every call has a deadline; a
/// failed call changes nothing: shares move to STICKY and FAIL_OPEN on their deadlines.
pub async fn report_loop(
    daemon: std::sync::Arc<std::sync::Mutex<crate::daemon::Daemon>>,
    spec: FleetSpec,
    shutdown: tokio::sync::broadcast::Sender<crate::control::Shutdown>,
) -> Result<(), crate::Error> {
    use limiter_proto::pb::allocator_client::AllocatorClient;
    use std::time::Instant;
    use tonic::transport::Endpoint;

    let tls = limiter_proto::client_tls(
        &limiter_proto::TlsFiles {
            ca: &spec.ca,
            cert: &spec.cert,
            key: &spec.key,
        },
        &spec.server_name,
    )
    .map_err(|e| crate::Error::Fleet(e.to_string()))?;
    let deadline = Duration::from_millis(spec.report_interval_ms.clamp(100, 2000) / 2);
    let endpoint = Endpoint::from_shared(format!("https://{}", spec.allocator))
        .and_then(|e| e.tls_config(tls))
        .map_err(|e| crate::Error::Fleet(format!("allocator endpoint {}: {e}", spec.allocator)))?
        .connect_timeout(deadline)
        .timeout(deadline)
        .local_address(spec.bind);
    let mut client = AllocatorClient::new(endpoint.connect_lazy())
        .max_decoding_message_size(limiter_proto::MAX_MESSAGE_BYTES)
        .max_encoding_message_size(limiter_proto::MAX_MESSAGE_BYTES);
    let mut interval = Duration::from_millis(spec.report_interval_ms);
    let mut next = Instant::now();
    let mut last_sent = Instant::now() - interval;
    let mut failures = 0u64;
    let mut stop = shutdown.subscribe();
    loop {
        tokio::select! {
            _ = stop.recv() => return Ok(()),
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
        let early = last_sent.elapsed()
            >= Duration::from_millis(limiter_proto::MIN_REPORT_SPACING_MS)
            && lock(&daemon)?.fleet_wants_early_report()?;
        if Instant::now() >= next || early {
            let Some(report) = lock(&daemon)?.fleet_report()? else {
                return Ok(());
            };
            last_sent = Instant::now();
            next = last_sent + interval;
            match client.report(report).await {
                Ok(reply) => {
                    let reply = reply.into_inner();
                    if reply.report_interval_ms > 0 {
                        interval = Duration::from_millis(reply.report_interval_ms);
                    }
                    if failures > 0 {
                        tracing::info!(after = failures, "allocator reachable again");
                    }
                    failures = 0;
                    lock(&daemon)?.fleet_apply(&reply)?;
                }
                Err(status) => {
                    failures += 1;
                    // The first failure and then one in 30: an outage must not flood logs.
                    if failures == 1 || failures.is_multiple_of(30) {
                        tracing::warn!(
                            failures,
                            "report to the allocator failed: {}",
                            status.message()
                        );
                    }
                }
            }
        }
        lock(&daemon)?.fleet_tick()?;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use limiter_proto::pb::RuleGrant;

    use super::*;
    use crate::{
        config::{FailMode as ConfigFailMode, Mode, Proto, Unit},
        ruleset,
    };

    const S: u64 = 1_000_000_000;

    fn rule(fail_mode: ConfigFailMode) -> RuleSpec {
        RuleSpec {
            name: "contoso".into(),
            dst: crate::config::parse_dst("198.18.0.10/32").unwrap(),
            dst_port: None,
            proto: Proto::Any,
            unit: Unit::Packets,
            aggregate: Some(RateSpec {
                rate: 10_000,
                burst: 2_000,
            }),
            mode: Mode::Enforce,
            fail_mode,
            per_source: None,
        }
    }

    fn spec() -> FleetSpec {
        FleetSpec {
            allocator: "127.0.0.1:1".parse().unwrap(),
            server_name: "allocator".into(),
            host_id: "lb001".into(),
            ca: "ca.pem".into(),
            cert: "cert.pem".into(),
            key: "key.pem".into(),
            bind: None,
            lease_ttl_ms: 3_000,
            sticky_max_s: 300,
            report_interval_ms: 1_000,
        }
    }

    fn reply(rate: u64, saturated: bool) -> ReportReply {
        ReportReply {
            grants: vec![RuleGrant {
                rule: "contoso".into(),
                rate,
                burst: rate / 10,
                tokens: 0,
                ttl_ms: 3_000,
                saturated,
            }],
            report_interval_ms: 1_000,
        }
    }

    /// What the daemon installs: shape, compile, annotate.
    fn installed(fleet: &FleetState, rules: &[RuleSpec], now: u64) -> RuleTable {
        let shaped = fleet.shape(rules);
        let slots = ruleset::assign_slots(&BTreeMap::new(), &shaped).unwrap();
        let mut table = ruleset::compile(&shaped, &slots).unwrap();
        fleet.annotate(&mut table, now);
        table
    }

    #[test]
    fn a_zero_grant_installs_a_closed_limit_shown_as_rate_0() {
        let rules = [rule(ConfigFailMode::Open)];
        let mut fleet = FleetState::new(spec(), 500, &rules, 0);
        let t = installed(&fleet, &rules, 0);
        let (_, c) = t.rules[0];
        assert_eq!((c.rate, c.burst, c.share_state), (20, 1, SHARE_BOOTSTRAP));
        assert_eq!(c.flags & RULE_CLOSED_UNTIL_LAPSE, 0);
        let bootstrap = c.aggregate;

        fleet.apply(&reply(0, false), S);
        let t = installed(&fleet, &rules, S);
        let (_, c) = t.rules[0];
        // Closed until the lease lapses; then the bootstrap share applies.
        assert_ne!(c.flags & RULE_CLOSED_UNTIL_LAPSE, 0);
        assert_eq!(c.aggregate, bootstrap);
        assert!(c.lease_expires_ns > S);
        assert_eq!((c.rate, c.burst, c.share_state), (0, 0, SHARE_LEASED));
        assert_ne!(c.flags & limiter_common::abi::RULE_HAS_AGGREGATE, 0);
        // Out of BOOTSTRAP: no token.
        assert_eq!(fleet.pending_tokens.get("contoso"), Some(&0));
        // Reported as holding 0.
        let r = fleet.report(&BTreeMap::new(), S + S / 2);
        assert_eq!(r.rules[0].held, 0);

        // A real grant afterwards takes over (its token count) and opens the limit.
        fleet.pending_tokens.clear();
        fleet.apply(&reply(250, true), 2 * S);
        assert_eq!(fleet.pending_tokens.get("contoso"), Some(&0));
        let t = installed(&fleet, &rules, 2 * S);
        let (_, c) = t.rules[0];
        assert_eq!(c.flags & RULE_CLOSED_UNTIL_LAPSE, 0);
        assert_eq!((c.rate, c.burst), (250, 25));
    }

    #[test]
    fn refusals_on_a_closed_unsaturated_share_report_at_once() {
        let rules = [rule(ConfigFailMode::Open)];
        let mut fleet = FleetState::new(spec(), 500, &rules, 0);
        fleet.apply(&reply(0, false), S);
        let totals = |dropped: u64| BTreeMap::from([("contoso".to_string(), (dropped, dropped))]);
        let _ = fleet.report(&totals(0), S);
        assert!(!fleet.wants_early_report(&totals(0), S + 1));
        assert!(fleet.wants_early_report(&totals(3), S + 1));
        // Leased: the allocator is there to ask, no rejoin.
        assert!(!fleet.rejoin(&totals(3), S + 1));
    }

    #[test]
    fn a_lapsed_closed_share_rejoins_at_the_bootstrap_rate_on_refusals() {
        for fail_mode in [ConfigFailMode::Open, ConfigFailMode::Static] {
            let rules = [rule(fail_mode)];
            let mut fleet = FleetState::new(spec(), 500, &rules, 0);
            fleet.apply(&reply(0, false), S);
            fleet.pending_tokens.clear();
            let totals =
                |dropped: u64| BTreeMap::from([("contoso".to_string(), (dropped, dropped))]);
            let _ = fleet.report(&totals(0), 4 * S);
            // STICKY (lease lapsed at 4 s), no refusals: stays closed.
            assert!(!fleet.rejoin(&totals(0), 5 * S));
            let t = installed(&fleet, &rules, 5 * S);
            assert_ne!(t.rules[0].1.flags & RULE_CLOSED_UNTIL_LAPSE, 0);
            // Refusals: BOOTSTRAP at 10,000 ÷ 500 with one token, and a report at once.
            assert!(fleet.rejoin(&totals(7), 5 * S));
            assert_eq!(fleet.pending_tokens.get("contoso"), Some(&1));
            assert!(fleet.wants_early_report(&totals(7), 5 * S));
            let t = installed(&fleet, &rules, 5 * S);
            let (_, c) = t.rules[0];
            assert_eq!((c.rate, c.burst, c.share_state), (20, 1, SHARE_BOOTSTRAP));
            // The fail-open deadline did not move (static: none).
            let want = match fail_mode {
                ConfigFailMode::Open => S + 303 * S,
                ConfigFailMode::Static => 0,
            };
            assert_eq!(c.fail_open_at_ns, want);
            let r = fleet.report(&totals(7), 5 * S);
            assert_eq!(r.rules[0].held, 0, "held like a joiner");
            assert!(!fleet.wants_early_report(&totals(7), 5 * S + 1));
        }
    }
}
