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
//!
//! Every share's burst keeps the rule's floor ([`min_share_burst`]): "burst 1" and "one
//! token" mean one admission of the rule's unit, so a `bytes` share admits a full frame
//! and a share at TC a GRO-built buffer. Demand is reported in the rule's unit (bytes,
//! SYNs or packets offered: [`offered_units`]).
//!
//! A grant is checked before it is stored ([`FleetState::apply_from`]): one whose share does
//! not compile (rate above the maximum, a burst that takes over a year to refill) is
//! refused and counted (the daemon logs it), and the rule keeps what it had; its TTL is clamped to
//! `MAX_GRANT_TTL_LEASES` lease TTLs. A restart within a lease resumes the share the
//! rule's pinned entry holds ([`FleetState::resume`]).
//!
//! A grant's credit (quota the fleet left unused, README "Accuracy vs burst, and the
//! credit") goes into the rule's `AggBucket::credit`, replacing what is left of the last;
//! the program spends it on frames the bucket refuses while the lease holds.
//! [`CreditLedger`] works out from that word what was admitted on credit, for the
//! report. Byte rules get no credit: their refusals are counted in frames.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use limiter_common::abi::{RuleConfig, RuleCounters, RULE_CLOSED_UNTIL_LAPSE, RULE_IN_USE};
use limiter_fleet::{
    shard::{Learned, Routing},
    share::{HeldShare, Share, ShareParams, ShareState},
};
use limiter_proto::pb::{ReportReply, ReportRequest, RuleGrant};

use crate::{
    config::{
        FleetSpec, RateSpec, RuleSpec, Unit, XdpMode, GRO_MAX_BYTES, GRO_MAX_SEGMENTS,
        MIN_BYTES_BURST,
    },
    policy::ruleset::RuleTable,
};

mod rule;

pub use self::rule::CreditLedger;
use self::rule::{check_grant, FleetRule};

pub fn share_params(spec: &FleetSpec, fleet_size: u32) -> ShareParams {
    ShareParams {
        fleet_size,
        lease_ttl: Duration::from_millis(spec.lease_ttl_ms),
        sticky_max: Duration::from_secs(spec.sticky_max_s),
        report_interval: Duration::from_millis(spec.report_interval_ms),
    }
}

/// The smallest burst a share of `rule` may run at, in its unit: one admission as the
/// data path meters it — one packet or SYN at XDP, one maximal frame (the burst the
/// config requires of a bytes rule, [`MIN_BYTES_BURST`]) in bytes; at TC one GRO-built
/// buffer (what `Config::tc_burst_warnings` names), but never above the rule's own
/// configured burst (the operator's choice, warned about at load). A SYN is never
/// coalesced.
pub fn min_share_burst(rule: &RuleSpec, xdp_mode: XdpMode) -> u64 {
    let tc = xdp_mode == XdpMode::Tc;
    let (xdp_floor, tc_floor) = match rule.unit {
        Unit::Bytes => (MIN_BYTES_BURST, GRO_MAX_BYTES),
        Unit::Packets => (1, GRO_MAX_SEGMENTS),
        Unit::Syn => (1, 1),
    };
    if !tc {
        return xdp_floor;
    }
    let configured = rule.aggregate.map_or(tc_floor, |a| a.burst);
    tc_floor.min(configured).max(xdp_floor)
}

/// A rule's offered load in its unit from its counter totals: what reached the aggregate
/// stage. Packets and bytes offered are passed + dropped (shadow mode counts its
/// would-drops as passed); a syn rule passes its other packets unmetered, so its SYNs
/// come from their own counter (`RULE_SYNS`). Frames refused before the aggregate (by
/// the per-source limit, or unmetered: `refused_early_*`) are left out: a flood the
/// host refuses anyway must not win it quota the other hosts' honest traffic needs.
pub fn offered_units(unit: Unit, counters: &RuleCounters, syns: u64) -> u64 {
    match unit {
        Unit::Packets => counters
            .passed_packets
            .wrapping_add(counters.dropped_packets)
            .wrapping_sub(counters.refused_early_packets),
        Unit::Bytes => counters
            .passed_bytes
            .wrapping_add(counters.dropped_bytes)
            .wrapping_sub(counters.refused_early_bytes),
        Unit::Syn => syns.wrapping_sub(counters.refused_early_packets),
    }
}

/// A rule's refusals that count for the fleet (early reports, the credit): those of the
/// aggregate stage, not the per-source limit's or the unmetered ones ([`offered_units`]).
pub fn refused_frames(counters: &RuleCounters) -> u64 {
    counters
        .dropped_packets
        .saturating_sub(counters.refused_early_packets)
}

/// The report interval an allocator's reply asks for, held to [200 ms, lease TTL / 2]:
/// an allocator (or anything holding a certificate the host trusts for it) asking for
/// 1 ms would have the host report in a busy loop, and one asking for an hour would let
/// every lease lapse between two reports.
pub fn clamp_report_interval(asked_ms: u64, lease_ttl_ms: u64) -> Duration {
    let most = (lease_ttl_ms / 2).max(limiter_proto::MIN_REPORT_SPACING_MS);
    Duration::from_millis(asked_ms.clamp(limiter_proto::MIN_REPORT_SPACING_MS, most))
}

/// One rule's counter totals as the fleet reads them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RuleTotals {
    /// Offered load so far, in the rule's unit ([`offered_units`]).
    pub offered: u64,
    /// Frames refused so far.
    pub refused: u64,
    /// What is left of the rule's credit now (`AggBucket::credit`); `None` for a rule
    /// without credit, or a word the daemon could not read (its report then carries no
    /// credit counts, so the allocator grants it none).
    pub credit_left: Option<u64>,
}

/// Whether rules of `unit` take the fleet's credit: its refusals and its unit are both
/// frames (packets, SYNs), so "admitted on credit, at most what it refused" is one count.
pub fn takes_credit(unit: Unit) -> bool {
    unit != Unit::Bytes
}

/// A grant or a pinned share the fleet state would not take, and why. The state only
/// says so; the daemon logs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub rule: String,
    pub reason: String,
}

/// What [`FleetState::apply_from`] did besides installing grants.
#[derive(Debug, Default)]
pub struct Applied {
    /// Grants refused (their share does not compile).
    pub refused: Vec<Refusal>,
    /// Rules now reported to another group: (rule, group).
    pub moved: Vec<(String, String)>,
    /// Rules a group said another group grants, naming a group this host does not list:
    /// (rule, group); they are reported to the first group.
    pub unknown: Vec<(String, String)>,
    /// The allocator's configured `fleet_size` now differs from this host's, and did not
    /// before (or named another): (this host's, the allocator's).
    pub fleet_size_disagrees: Option<(u32, u32)>,
}

#[derive(Clone)]
pub struct FleetState {
    spec: FleetSpec,
    params: ShareParams,
    xdp_mode: XdpMode,
    /// Every fleet rule (each rule with an aggregate limit), by name.
    rules: BTreeMap<String, FleetRule>,
    /// Which group of allocators each rule is reported to (sharded allocators; one group
    /// without).
    routing: Routing,
    /// Grants refused because their share does not compile, since start.
    grants_refused: u64,
    /// Reports that reached no allocator (or no leader), since start.
    report_failures: u64,
    /// The client TLS files of each group's connections (for their failed reloads).
    tls: Vec<Arc<limiter_proto::ClientTls>>,
    /// This host's `fleet_size` (its bootstrap share is quota ÷ it), sent in reports.
    fleet_size: u32,
    /// The `fleet_size` the allocator's configuration names, from its last reply that
    /// named one (`None`: it sizes a joiner by this host's own).
    allocator_fleet_size: Option<u32>,
}

impl FleetState {
    pub fn new(
        spec: FleetSpec,
        fleet_size: u32,
        xdp_mode: XdpMode,
        rules: &[RuleSpec],
        now: u64,
    ) -> FleetState {
        let routing = Routing::new(spec.groups.iter().map(|g| g.name.clone()).collect());
        let mut fleet = FleetState {
            params: share_params(&spec, fleet_size),
            spec,
            xdp_mode,
            rules: BTreeMap::new(),
            routing,
            grants_refused: 0,
            report_failures: 0,
            tls: Vec::new(),
            fleet_size,
            allocator_fleet_size: None,
        };
        fleet.sync_rules(rules, now);
        fleet
    }

    /// The `[fleet]` section this state runs.
    pub fn spec(&self) -> &FleetSpec {
        &self.spec
    }

    /// After a (re)load: new rules bootstrap, removed ones go (whole), quotas follow the
    /// file. A rule whose unit changed bootstraps anew (its share was counted in another
    /// unit). The caller commits this only with the rules it installs: a rejected reload
    /// keeps the state from before it (`Daemon::reload` restores a copy).
    pub fn sync_rules(&mut self, rules: &[RuleSpec], now: u64) {
        let fleet_rules: BTreeMap<&str, (&RateSpec, &RuleSpec)> = rules
            .iter()
            .filter_map(|r| r.aggregate.as_ref().map(|a| (r.name.as_str(), (a, r))))
            .collect();
        self.rules.retain(|name, kept| {
            fleet_rules
                .get(name.as_str())
                .is_some_and(|(_, r)| r.unit == kept.unit)
        });
        let kept = &self.rules;
        self.routing.retain(|name| kept.contains_key(name));
        for (name, (quota, rule)) in fleet_rules {
            match self.rules.get_mut(name) {
                Some(kept) => kept.share.set_quota(quota.rate),
                None => {
                    let new = FleetRule::bootstrap(rule, quota, self.params, self.xdp_mode, now);
                    self.rules.insert(name.to_string(), new);
                }
            }
        }
    }

    /// At start: a rule still in BOOTSTRAP whose pinned entry (`pinned`, the live rules
    /// by name, from an earlier daemon) holds a lease or a lapsed one of the same unit
    /// resumes that share ([`Share::resume`]): a restart within the lease changes
    /// nothing. Returns the rules resumed, and the pinned shares that do not compile
    /// (those rules bootstrap).
    pub fn resume(
        &mut self,
        rules: &[RuleSpec],
        pinned: &BTreeMap<String, RuleConfig>,
        now: u64,
    ) -> (Vec<String>, Vec<Refusal>) {
        let mut resumed = Vec::new();
        let mut refused = Vec::new();
        for rule in rules {
            let (Some(fleet_rule), Some(entry), Some(quota)) = (
                self.rules.get_mut(&rule.name),
                pinned.get(&rule.name),
                rule.aggregate,
            ) else {
                continue;
            };
            let held_state = matches!(
                ShareState::try_from(entry.share_state),
                Ok(ShareState::Leased | ShareState::Sticky)
            );
            if fleet_rule.share.state(now) != ShareState::Bootstrap
                || !held_state
                || entry.flags & RULE_IN_USE == 0
                || entry.unit != rule.unit.abi()
            {
                continue;
            }
            let closed = entry.flags & RULE_CLOSED_UNTIL_LAPSE != 0;
            let held = HeldShare {
                rate: if closed { 0 } else { entry.rate },
                burst: if closed { 0 } else { entry.burst },
                lease_expires: entry.lease_expires_ns,
                fail_open_at: entry.fail_open_at_ns,
            };
            let floor = fleet_rule.share.min_burst();
            let Some(share) =
                Share::resume(quota.rate, rule.fail_mode, self.params, floor, held, now)
            else {
                continue;
            };
            let grant = RuleGrant {
                rule: rule.name.clone(),
                rate: share.rate(),
                burst: share.burst(),
                ..RuleGrant::default()
            };
            if let Err(reason) = check_grant(rule.unit, &share, &grant) {
                refused.push(Refusal {
                    rule: rule.name.clone(),
                    reason,
                });
                continue;
            }
            fleet_rule.share = share;
            resumed.push(rule.name.clone());
        }
        (resumed, refused)
    }

    /// The rules whose bucket a grant (or a rejoin) takes over since the last call, with
    /// the units it holds then: the daemon writes them into the buckets.
    pub fn take_pending_tokens(&mut self) -> BTreeMap<String, u64> {
        self.rules
            .iter_mut()
            .filter_map(|(name, r)| r.pending_tokens.take().map(|t| (name.clone(), t)))
            .collect()
    }

    /// The credits to write into rules' buckets since the last call (a grant's, or a
    /// re-arm), each replacing what is left; [`FleetState::credit_written`] after each.
    pub fn take_pending_credit(&mut self) -> BTreeMap<String, u64> {
        self.rules
            .iter_mut()
            .filter_map(|(name, r)| r.pending_credit.take().map(|c| (name.clone(), c)))
            .collect()
    }

    /// Grants refused since start (their share did not compile).
    pub fn grants_refused(&self) -> u64 {
        self.grants_refused
    }

    /// Reports that reached no allocator since start.
    pub fn report_failures(&self) -> u64 {
        self.report_failures
    }

    /// Counts a report that reached no allocator.
    pub fn report_failed(&mut self) {
        self.report_failures += 1;
    }

    /// (this host's `fleet_size`, the allocator's) when the allocator's configuration
    /// names another one than this host's.
    pub fn fleet_size_disagreement(&self) -> Option<(u32, u32)> {
        self.allocator_fleet_size
            .filter(|&n| n != self.fleet_size)
            .map(|n| (self.fleet_size, n))
    }

    /// Counts the failed reloads of `tls` (a group's connections') in
    /// [`FleetState::tls_reload_failures`].
    pub fn watch_tls(&mut self, tls: Arc<limiter_proto::ClientTls>) {
        self.tls.push(tls);
    }

    /// Changes of the TLS files that made no valid configuration, since start (every
    /// group's connections read them apart, so each counts them).
    pub fn tls_reload_failures(&self) -> u64 {
        self.tls.iter().map(|t| t.failures()).sum()
    }

    /// Counts `n` more refused grants (a restored copy keeps the count).
    pub fn add_refused(&mut self, n: u64) {
        self.grants_refused += n;
    }

    pub fn is_fleet_rule(&self, name: &str) -> bool {
        self.rules.contains_key(name)
    }

    /// The rules as this host enforces them: each fleet rule's aggregate is its share
    /// (a closed one as the bootstrap share it rejoins at: [`FleetState::annotate`]
    /// marks it closed until its lease lapses, so the kernel refuses everything until
    /// then and runs it as a joiner after).
    pub fn shape(&self, rules: &[RuleSpec]) -> Vec<RuleSpec> {
        rules
            .iter()
            .map(|r| {
                let mut r = r.clone();
                if let Some(fleet_rule) = self.rules.get(&r.name) {
                    r.aggregate = Some(fleet_rule.enforced());
                }
                r
            })
            .collect()
    }

    /// Writes each fleet rule's state and deadlines into its map entry.
    pub fn annotate(&self, table: &mut RuleTable, now: u64) {
        for (slot, entry) in &mut table.rules {
            let name = table
                .slots
                .iter()
                .find(|(_, s)| *s == slot)
                .map(|(n, _)| n.as_str());
            match name.and_then(|n| self.rules.get(n)) {
                Some(fleet_rule) => fleet_rule.annotate(entry, now),
                None => {
                    entry.share_state = ShareState::Standalone.into();
                    (entry.lease_expires_ns, entry.fail_open_at_ns) = (0, 0);
                }
            }
        }
    }

    /// Every fleet rule's state now; a change calls for a reinstall.
    pub fn states(&self, now: u64) -> BTreeMap<String, ShareState> {
        self.rules
            .iter()
            .map(|(n, r)| (n.clone(), r.share.state(now)))
            .collect()
    }

    /// The group of allocators each rule is reported to.
    pub fn routing(&self) -> &Routing {
        &self.routing
    }

    /// Whether any fleet rule is reported to `group` now.
    pub fn has_rules_for(&self, group: usize) -> bool {
        self.rules
            .keys()
            .any(|name| self.routing.group_of(name) == group)
    }

    /// The report to group `group` (an index of `spec.groups`) from counter totals: the
    /// rules routed to it ([`Routing`]); demand is each rule's offered load in its unit
    /// ([`RuleTotals::offered`]) per second since its own last report.
    pub fn report_to(
        &mut self,
        group: usize,
        totals: &BTreeMap<String, RuleTotals>,
        now: u64,
    ) -> ReportRequest {
        let routing = &self.routing;
        let rules = self
            .rules
            .iter_mut()
            .filter(|(name, _)| routing.group_of(name) == group)
            .map(|(name, r)| r.report(name, totals.get(name).copied().unwrap_or_default(), now))
            .collect();
        ReportRequest {
            version: limiter_proto::VERSION,
            host: self.spec.host_id.clone(),
            rules,
            fleet_size: self.fleet_size,
        }
    }

    /// Whether, for the rules routed to group `group`, refusals since the last report
    /// call for an early one, or a closed share rejoined and asks for its grant.
    pub fn wants_early_report_to(
        &self,
        group: usize,
        totals: &BTreeMap<String, RuleTotals>,
        now: u64,
    ) -> bool {
        self.rules.iter().any(|(name, r)| {
            self.routing.group_of(name) == group
                && (r.asking || r.share.wants_early_report(r.denials(totals.get(name)), now))
        })
    }

    /// Whether a share routed to `group` is in FAIL_OPEN now: it passes everything
    /// until a report reaches an allocator, so the reporter retries at once rather than
    /// an interval later (`limiter_fleet::share::FAIL_OPEN_RETRY_MS`).
    pub fn fails_open_to(&self, group: usize, now: u64) -> bool {
        self.rules.iter().any(|(name, r)| {
            self.routing.group_of(name) == group && r.share.state(now) == ShareState::FailOpen
        })
    }

    /// Lapsed closed shares that refused frames since the last report rejoin
    /// (`Share::rejoin`: BOOTSTRAP at quota ÷ fleet_size, burst 1) with one token, and
    /// the next report goes out at once. Returns the rules that did (they need a
    /// reinstall).
    pub fn rejoin(&mut self, totals: &BTreeMap<String, RuleTotals>, now: u64) -> Vec<String> {
        self.rules
            .iter_mut()
            .filter_map(|(name, r)| {
                let denials = r.denials(totals.get(name));
                r.rejoin(denials, now).then(|| name.clone())
            })
            .collect()
    }

    /// `credit` was written into `rule`'s bucket, whose word held `left` just before.
    pub fn credit_written(&mut self, rule: &str, credit: u64, left: u64, now: u64) {
        if let Some(ledger) = self.rules.get_mut(rule).and_then(|r| r.credit.as_mut()) {
            ledger.written(credit, left, now);
        }
    }

    /// After a failed report to group `group`: each of its rules whose lease still holds
    /// gets its last grant's credit again, at most once a report interval (a leader's
    /// crash would otherwise cut the credit for its gap). Queued for
    /// [`FleetState::take_pending_credit`].
    pub fn rearm_credit(&mut self, group: usize, now: u64) {
        let interval = self.params.report_interval.as_nanos() as u64;
        for (name, r) in &mut self.rules {
            if self.routing.group_of(name) == group {
                r.rearm_credit(interval, now);
            }
        }
    }

    /// Frames admitted on credit since start, over every rule.
    pub fn credited_total(&self) -> u64 {
        self.rules
            .values()
            .filter_map(|r| r.credit.as_ref())
            .map(|l| l.total)
            .sum()
    }

    /// Applies the grants of a reply of group `group`, whose `elsewhere` routes rules to
    /// other groups ([`Routing::learn`]). Each grant is checked before it is stored: one
    /// whose share does not compile in the rule's unit is refused (logged, counted in
    /// [`FleetState::grants_refused`]) and the rule keeps what it had, so one bad grant
    /// neither blocks the others nor stops reporting.
    pub fn apply_from(&mut self, group: usize, reply: &ReportReply, now: u64) -> Applied {
        let mut applied = Applied::default();
        let named = (reply.fleet_size != 0).then_some(reply.fleet_size);
        if named != self.allocator_fleet_size {
            self.allocator_fleet_size = named;
            applied.fleet_size_disagrees = named
                .filter(|&n| n != self.fleet_size)
                .map(|n| (self.fleet_size, n));
        }
        for e in &reply.elsewhere {
            if !self.rules.contains_key(&e.rule) {
                continue;
            }
            match self.routing.learn(group, &e.rule, &e.group) {
                Learned::Moved(_) => applied.moved.push((e.rule.clone(), e.group.clone())),
                Learned::Unknown => applied.unknown.push((e.rule.clone(), e.group.clone())),
                Learned::Unchanged => {}
            }
        }
        for g in &reply.grants {
            // A grant of a group the rule is no longer routed to (a late reply of the
            // group it left) must not override the group that grants it now.
            if self.routing.group_of(&g.rule) != group {
                continue;
            }
            let Some(fleet_rule) = self.rules.get_mut(&g.rule) else {
                continue;
            };
            if let Err(reason) = fleet_rule.apply(g, now) {
                applied.refused.push(Refusal {
                    rule: g.rule.clone(),
                    reason,
                });
            }
        }
        self.grants_refused += applied.refused.len() as u64;
        applied
    }
}

#[cfg(test)]
mod tests;
