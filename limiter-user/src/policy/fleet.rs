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

use limiter_common::{
    abi::{RuleConfig, RuleCounters, RULE_CLOSED_UNTIL_LAPSE, RULE_IN_USE},
    gcra::Limit,
};
use limiter_fleet::{
    shard::{Learned, Routing},
    share::{Grant, HeldShare, Share, ShareParams, ShareState},
};
use limiter_proto::pb::{ReportReply, ReportRequest, RuleGrant, RuleReport};

use crate::{
    config::{
        FleetSpec, RateSpec, RuleSpec, Unit, XdpMode, GRO_MAX_BYTES, GRO_MAX_SEGMENTS,
        MIN_BYTES_BURST,
    },
    policy::ruleset::RuleTable,
};

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

/// One rule's credit as this host wrote and read it: the program only ever lowers the
/// word, so what it admitted on credit between two looks is how far the word fell.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CreditLedger {
    /// The credit of the last grant (reported back: a learning allocator renews it).
    pub granted: u64,
    /// The word as last written or read; `None` before the first look (a word a
    /// restarted daemon finds pinned is not counted as spent).
    armed: Option<u64>,
    /// When the grant's credit was last written (a re-arm waits a report interval).
    written_at: u64,
    /// Admitted on credit since the last report.
    credited: u64,
    /// Admitted on credit since start.
    pub total: u64,
}

impl CreditLedger {
    /// The word reads `left` now.
    pub fn observe(&mut self, left: u64) {
        if let Some(armed) = self.armed {
            let spent = armed.saturating_sub(left);
            self.credited = self.credited.saturating_add(spent);
            self.total = self.total.saturating_add(spent);
        }
        self.armed = Some(left);
    }

    /// `credit` was written, and the word held `left` just before.
    pub fn written(&mut self, credit: u64, left: u64, now: u64) {
        self.observe(left);
        self.armed = Some(credit);
        self.written_at = now;
    }

    /// What was admitted on credit since the last call.
    pub fn take_credited(&mut self) -> u64 {
        std::mem::take(&mut self.credited)
    }
}

/// A grant or a pinned share the fleet state would not take, and why. The state only
/// says so; the daemon logs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub rule: String,
    pub reason: String,
}

/// Why a grant was refused.
fn check_grant(unit: Unit, share: &Share, g: &RuleGrant) -> Result<(), String> {
    if g.rate == 0 {
        // A closed share: `Limit::CLOSED`, nothing to compile.
        return Ok(());
    }
    Limit::new(unit.granularity(), g.rate, g.burst.max(share.min_burst()))
        .map(|_| ())
        .map_err(|e| format!("rate {} burst {}: {e}", g.rate, g.burst))
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

/// One fleet rule on this host: its share and all that is kept of it between reports and
/// installs. It lives and goes as one: a rule a reload removes, or whose unit changes,
/// leaves nothing behind (no tokens or credit queued for a bucket that is no longer its).
#[derive(Clone)]
struct FleetRule {
    share: Share,
    /// The share's unit (a rule whose unit changes starts a new share).
    unit: Unit,
    /// The rule's counter totals at its last report, and when that was: with sharded
    /// allocators, a rule's reports go to its group on that group's schedule.
    last_report: Option<(RuleTotals, u64)>,
    /// The units its bucket holds when a grant (or a rejoin) takes it over, until the
    /// daemon writes them ([`FleetState::take_pending_tokens`]).
    pending_tokens: Option<u64>,
    /// The credit to write into its bucket (a grant's, or a re-arm), replacing what is
    /// left: [`FleetState::credit_written`] after the write.
    pending_credit: Option<u64>,
    /// Its [`CreditLedger`], from its first credit look or grant (credit-taking units).
    credit: Option<CreditLedger>,
    /// A closed share that rejoined: its group's report goes at once (its grant request).
    asking: bool,
}

impl FleetRule {
    /// A new rule (or one whose unit changed): the bootstrap share, counted anew.
    fn bootstrap(
        rule: &RuleSpec,
        quota: &RateSpec,
        params: ShareParams,
        xdp_mode: XdpMode,
        now: u64,
    ) -> FleetRule {
        FleetRule {
            share: Share::bootstrap(quota.rate, rule.fail_mode, params, now)
                .with_min_burst(min_share_burst(rule, xdp_mode)),
            unit: rule.unit,
            last_report: None,
            pending_tokens: None,
            pending_credit: None,
            credit: None,
            asking: false,
        }
    }

    /// The aggregate this host enforces: its share. A closed share (rate 0) is compiled
    /// as the bootstrap share it rejoins at (quota ÷ fleet_size, burst 1);
    /// [`FleetRule::annotate`] marks it closed until its lease lapses.
    fn enforced(&self) -> RateSpec {
        let share = &self.share;
        if share.rate() == 0 {
            RateSpec {
                rate: share.rejoin_rate(),
                burst: share.min_burst(),
            }
        } else {
            RateSpec {
                rate: share.rate(),
                burst: share.burst(),
            }
        }
    }

    /// Writes the share's state and deadlines into the rule's map entry.
    fn annotate(&self, entry: &mut RuleConfig, now: u64) {
        let share = &self.share;
        entry.share_state = share.state(now).into();
        (entry.lease_expires_ns, entry.fail_open_at_ns) = share.deadlines();
        if share.rate() == 0 {
            // A zero grant: nothing passes until the lease lapses, then the bootstrap
            // share `enforced` compiled (FAIL_OPEN still overrides it on its deadline).
            // Shown as rate 0, burst 0.
            entry.flags |= RULE_CLOSED_UNTIL_LAPSE;
            entry.rate = 0;
            entry.burst = 0;
        }
    }

    /// Refusals since the last report, from the rule's counter totals (`None`: none read).
    fn denials(&self, totals: Option<&RuleTotals>) -> u64 {
        let refused = totals.map_or(0, |t| t.refused);
        let last = self.last_report.map_or(refused, |(s, _)| s.refused);
        refused.saturating_sub(last)
    }

    /// The rule's report from its counter totals `sample`: demand per second since its
    /// own last report, and the credit it spent. Counts from here on.
    fn report(&mut self, name: &str, sample: RuleTotals, now: u64) -> RuleReport {
        let (last, at) = self.last_report.unwrap_or((sample, now));
        let elapsed = now.saturating_sub(at).max(1) as f64 / 1e9;
        let held = match self.share.state(now) {
            ShareState::Leased | ShareState::Sticky => self.share.rate(),
            _ => 0,
        };
        let offered = sample.offered.saturating_sub(last.offered);
        let denials = sample.refused.saturating_sub(last.refused);
        let (mut admitted, mut credited, mut credit) = (None, None, None);
        if let (Some(left), true) = (sample.credit_left, takes_credit(self.unit)) {
            let ledger = self.credit.get_or_insert_with(CreditLedger::default);
            ledger.observe(left);
            admitted = Some(offered.saturating_sub(denials));
            credited = Some(ledger.take_credited());
            credit = Some(ledger.granted);
        }
        self.last_report = Some((sample, now));
        self.asking = false;
        RuleReport {
            rule: name.to_string(),
            demand: (offered as f64 / elapsed) as u64,
            held,
            denials,
            admitted,
            credited,
            credit,
            unit: self.unit.as_str().to_string(),
        }
    }

    /// A lapsed closed share refusing `denials` frames rejoins with one token and asks
    /// for its grant at once; whether it did.
    fn rejoin(&mut self, denials: u64, now: u64) -> bool {
        if !self.share.rejoin(denials, now) {
            return false;
        }
        self.pending_tokens = Some(self.share.token_units(1));
        self.asking = true;
        true
    }

    /// Takes grant `g` (why not, if its share does not compile in the rule's unit: the
    /// rule then keeps what it had). Its credit replaces what is left of the last (0
    /// too); a grant that takes the bucket over queues its token count.
    fn apply(&mut self, g: &RuleGrant, now: u64) -> Result<(), String> {
        check_grant(self.unit, &self.share, g)?;
        let takes_credit = takes_credit(self.unit);
        let grant = Grant {
            rate: g.rate,
            burst: g.burst,
            tokens: g.tokens,
            ttl: Duration::from_millis(g.ttl_ms),
            saturated: g.saturated,
            credit: if takes_credit { g.credit } else { 0 },
        };
        if takes_credit {
            self.pending_credit = Some(grant.credit);
            self.credit
                .get_or_insert_with(CreditLedger::default)
                .granted = grant.credit;
        }
        // Out of BOOTSTRAP, FAIL_OPEN, a zero grant or a burst of 1 the bucket's TAT
        // means no share's fill: the grant takes over with its token count (≤ 1; 0 for
        // a zero grant), never a fresh burst (`Share::takes_over`).
        if self.share.takes_over(&grant, now) {
            self.pending_tokens = Some(self.share.token_units(g.tokens));
        }
        self.share.on_grant(&grant, now);
        Ok(())
    }

    /// Queues the last grant's credit again if the lease holds, the grant had one and
    /// it was written at least `interval` ns ago.
    fn rearm_credit(&mut self, interval: u64, now: u64) {
        let Some(ledger) = &self.credit else {
            return;
        };
        if self.share.state(now) == ShareState::Leased
            && ledger.granted > 0
            && now.saturating_sub(ledger.written_at) >= interval
        {
            self.pending_credit = Some(ledger.granted);
        }
    }
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
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use limiter_proto::pb::RuleGrant;

    use super::*;
    use crate::{
        config::{FailMode, Mode, Proto},
        policy::ruleset,
    };

    const S: u64 = 1_000_000_000;

    /// What is queued for the buckets, without taking it.
    impl FleetState {
        fn pending_tokens(&self) -> BTreeMap<String, u64> {
            self.clone().take_pending_tokens()
        }

        fn pending_credit(&self) -> BTreeMap<String, u64> {
            self.clone().take_pending_credit()
        }
    }

    fn rule(fail_mode: FailMode) -> RuleSpec {
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
            enforce: crate::config::Percent::ALL,
            fail_mode,
            per_source: None,
        }
    }

    fn spec() -> FleetSpec {
        FleetSpec {
            keys: crate::config::FleetKeys {
                server_name: "allocator".into(),
                ca: "ca.pem".into(),
                cert: "cert.pem".into(),
                key: "key.pem".into(),
                lease_ttl_ms: 3_000,
                sticky_max_s: 300,
                report_interval_ms: 1_000,
            },
            groups: vec![crate::config::AllocatorGroup {
                name: String::new(),
                allocators: vec!["127.0.0.1:1".parse().unwrap()],
            }],
            host_id: "lb001".into(),
            bind: None,
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
                credit: 0,
            }],
            report_interval_ms: 1_000,
            term: 0,
            elsewhere: Vec::new(),
            fleet_size: 0,
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
        let rules = [rule(FailMode::Open)];
        let mut fleet = FleetState::new(spec(), 500, XdpMode::Auto, &rules, 0);
        let t = installed(&fleet, &rules, 0);
        let (_, c) = t.rules[0];
        assert_eq!(
            (c.rate, c.burst, c.share_state),
            (20, 1, u32::from(ShareState::Bootstrap))
        );
        assert_eq!(c.flags & RULE_CLOSED_UNTIL_LAPSE, 0);
        let bootstrap = c.aggregate;

        fleet.apply_from(0, &reply(0, false), S);
        let t = installed(&fleet, &rules, S);
        let (_, c) = t.rules[0];
        // Closed until the lease lapses; then the bootstrap share applies.
        assert_ne!(c.flags & RULE_CLOSED_UNTIL_LAPSE, 0);
        assert_eq!(c.aggregate, bootstrap);
        assert!(c.lease_expires_ns > S);
        assert_eq!(
            (c.rate, c.burst, c.share_state),
            (0, 0, u32::from(ShareState::Leased))
        );
        assert_ne!(c.flags & limiter_common::abi::RULE_HAS_AGGREGATE, 0);
        // Out of BOOTSTRAP: no token.
        assert_eq!(fleet.pending_tokens().get("contoso"), Some(&0));
        // Reported as holding 0.
        let r = fleet.report_to(0, &BTreeMap::new(), S + S / 2);
        assert_eq!(r.rules[0].held, 0);

        // A real grant afterwards takes over (its token count) and opens the limit.
        let _ = fleet.take_pending_tokens();
        fleet.apply_from(0, &reply(250, true), 2 * S);
        assert_eq!(fleet.pending_tokens().get("contoso"), Some(&0));
        let t = installed(&fleet, &rules, 2 * S);
        let (_, c) = t.rules[0];
        assert_eq!(c.flags & RULE_CLOSED_UNTIL_LAPSE, 0);
        assert_eq!((c.rate, c.burst), (250, 25));
    }

    /// Reports carry this host's fleet_size; a reply naming another one is said once
    /// (the daemon logs it) and stays in the status until a reply names none or the same.
    #[test]
    fn the_allocators_fleet_size_is_compared_with_the_hosts() {
        let rules = [rule(FailMode::Open)];
        let mut fleet = FleetState::new(spec(), 4, XdpMode::Auto, &rules, 0);
        assert_eq!(fleet.report_to(0, &BTreeMap::new(), S).fleet_size, 4);
        let named = |n: u32| ReportReply {
            fleet_size: n,
            ..reply(250, false)
        };
        assert_eq!(fleet.apply_from(0, &named(0), S).fleet_size_disagrees, None);
        assert_eq!(fleet.fleet_size_disagreement(), None);
        assert_eq!(
            fleet.apply_from(0, &named(500), S).fleet_size_disagrees,
            Some((4, 500))
        );
        // Said once, shown while it lasts.
        assert_eq!(
            fleet.apply_from(0, &named(500), S).fleet_size_disagrees,
            None
        );
        assert_eq!(fleet.fleet_size_disagreement(), Some((4, 500)));
        assert_eq!(fleet.apply_from(0, &named(4), S).fleet_size_disagrees, None);
        assert_eq!(fleet.fleet_size_disagreement(), None);
        assert_eq!(
            fleet.apply_from(0, &named(500), S).fleet_size_disagrees,
            Some((4, 500))
        );
        assert_eq!(fleet.apply_from(0, &named(0), S).fleet_size_disagrees, None);
        assert_eq!(fleet.fleet_size_disagreement(), None);
    }

    #[test]
    fn refusals_on_a_closed_unsaturated_share_report_at_once() {
        let rules = [rule(FailMode::Open)];
        let mut fleet = FleetState::new(spec(), 500, XdpMode::Auto, &rules, 0);
        fleet.apply_from(0, &reply(0, false), S);
        let totals = |dropped: u64| {
            BTreeMap::from([(
                "contoso".to_string(),
                RuleTotals {
                    offered: dropped,
                    refused: dropped,
                    credit_left: None,
                },
            )])
        };
        let _ = fleet.report_to(0, &totals(0), S);
        assert!(!fleet.wants_early_report_to(0, &totals(0), S + 1));
        assert!(fleet.wants_early_report_to(0, &totals(3), S + 1));
        // Leased: the allocator is there to ask, no rejoin.
        assert!(fleet.rejoin(&totals(3), S + 1).is_empty());
    }

    #[test]
    fn a_lapsed_closed_share_rejoins_at_the_bootstrap_rate_on_refusals() {
        for fail_mode in [FailMode::Open, FailMode::Static] {
            let rules = [rule(fail_mode)];
            let mut fleet = FleetState::new(spec(), 500, XdpMode::Auto, &rules, 0);
            fleet.apply_from(0, &reply(0, false), S);
            let _ = fleet.take_pending_tokens();
            let totals = |dropped: u64| {
                BTreeMap::from([(
                    "contoso".to_string(),
                    RuleTotals {
                        offered: dropped,
                        refused: dropped,
                        credit_left: None,
                    },
                )])
            };
            let _ = fleet.report_to(0, &totals(0), 4 * S);
            // STICKY (lease lapsed at 4 s), no refusals: stays closed.
            assert!(fleet.rejoin(&totals(0), 5 * S).is_empty());
            let t = installed(&fleet, &rules, 5 * S);
            assert_ne!(t.rules[0].1.flags & RULE_CLOSED_UNTIL_LAPSE, 0);
            // Refusals: BOOTSTRAP at 10,000 ÷ 500 with one token, and a report at once.
            assert_eq!(fleet.rejoin(&totals(7), 5 * S), ["contoso"]);
            assert_eq!(fleet.pending_tokens().get("contoso"), Some(&1));
            assert!(fleet.wants_early_report_to(0, &totals(7), 5 * S));
            let t = installed(&fleet, &rules, 5 * S);
            let (_, c) = t.rules[0];
            assert_eq!(
                (c.rate, c.burst, c.share_state),
                (20, 1, u32::from(ShareState::Bootstrap))
            );
            // The fail-open deadline did not move (static: none).
            let want = match fail_mode {
                FailMode::Open => S + 303 * S,
                FailMode::Static => 0,
            };
            assert_eq!(c.fail_open_at_ns, want);
            let r = fleet.report_to(0, &totals(7), 5 * S);
            assert_eq!(r.rules[0].held, 0, "held like a joiner");
            assert!(!fleet.wants_early_report_to(0, &totals(7), 5 * S + 1));
        }
    }

    /// A rule of its own destination (198.18.1.N, N from the name's first byte).
    fn unit_rule(name: &str, unit: Unit, rate: u64, burst: u64) -> RuleSpec {
        let host = name.as_bytes()[0];
        RuleSpec {
            name: name.into(),
            dst: crate::config::parse_dst(&format!("198.18.1.{host}/32")).unwrap(),
            unit,
            aggregate: Some(RateSpec { rate, burst }),
            ..rule(FailMode::Static)
        }
    }

    fn grant_reply(rule: &str, rate: u64, burst: u64, tokens: u64, ttl_ms: u64) -> ReportReply {
        ReportReply {
            grants: vec![RuleGrant {
                rule: rule.into(),
                rate,
                burst,
                tokens,
                ttl_ms,
                saturated: false,
                credit: 0,
            }],
            report_interval_ms: 1_000,
            term: 0,
            elsewhere: Vec::new(),
            fleet_size: 0,
        }
    }

    fn entry<'t>(t: &'t RuleTable, name: &str) -> &'t RuleConfig {
        t.rule(t.slots[name]).unwrap()
    }

    /// The floors: what each unit's share runs at, installed, through BOOTSTRAP, LEASED
    /// (a grant below the floor), STICKY and a rejoin, at XDP and at TC. Old code: burst
    /// 1 everywhere, so a bytes share admitted no frame (cost(frame) > tolerance).
    #[test]
    fn installed_shares_keep_the_floor_of_their_unit_in_every_state() {
        let cases = [
            (Unit::Packets, XdpMode::Auto, 1),
            (Unit::Syn, XdpMode::Auto, 1),
            (Unit::Bytes, XdpMode::Auto, MIN_BYTES_BURST),
            (Unit::Packets, XdpMode::Tc, GRO_MAX_SEGMENTS),
            (Unit::Syn, XdpMode::Tc, 1),
            (Unit::Bytes, XdpMode::Tc, GRO_MAX_BYTES),
        ];
        for (unit, mode, floor) in cases {
            let rules = [unit_rule("r", unit, 125_000_000, 1_000_000)];
            assert_eq!(min_share_burst(&rules[0], mode), floor);
            let mut fleet = FleetState::new(spec(), 500, mode, &rules, 0);
            let t = installed(&fleet, &rules, 0);
            let c = entry(&t, "r");
            assert_eq!(
                (c.rate, c.burst),
                (250_000, floor),
                "{unit} {mode} bootstrap"
            );
            // A maximal admission of the unit fits the installed bucket.
            assert!(c.aggregate.cost(floor) <= c.aggregate.tolerance);
            // A grant whose burst is below the floor: LEASED at the floor.
            fleet.apply_from(0, &grant_reply("r", 300_000, 1, 1, 3_000), S);
            assert_eq!(
                fleet.pending_tokens().get("r"),
                Some(&floor),
                "one token = one admission"
            );
            let t = installed(&fleet, &rules, S);
            let c = entry(&t, "r");
            assert_eq!(
                (c.burst, c.share_state),
                (floor, u32::from(ShareState::Leased))
            );
            let t = installed(&fleet, &rules, 5 * S);
            let c = entry(&t, "r");
            assert_eq!(
                (c.burst, c.share_state),
                (floor, u32::from(ShareState::Sticky))
            );
            // Zero grant, lapsed, refusing: rejoins at the bootstrap share and the floor.
            let _ = fleet.take_pending_tokens();
            fleet.apply_from(0, &grant_reply("r", 0, 0, 0, 3_000), 6 * S);
            let t = installed(&fleet, &rules, 6 * S);
            assert_eq!(
                entry(&t, "r").aggregate,
                Limit::new(unit.granularity(), 250_000, floor).unwrap(),
                "closed: the bootstrap share it rejoins at, at the floor"
            );
            let refused = |n: u64| {
                BTreeMap::from([(
                    "r".to_string(),
                    RuleTotals {
                        offered: n,
                        refused: n,
                        credit_left: None,
                    },
                )])
            };
            let _ = fleet.report_to(0, &refused(0), 9 * S);
            assert_eq!(fleet.rejoin(&refused(4), 10 * S), ["r"]);
            assert_eq!(fleet.pending_tokens().get("r"), Some(&floor));
            let t = installed(&fleet, &rules, 10 * S);
            let c = entry(&t, "r");
            assert_eq!(
                (c.rate, c.burst, c.share_state),
                (250_000, floor, u32::from(ShareState::Bootstrap))
            );
        }
        // At TC a configured burst below a GRO buffer caps the floor (it is warned about),
        // but never below one maximal frame.
        let small = unit_rule("r", Unit::Bytes, 1_000_000, 20_000);
        assert_eq!(min_share_burst(&small, XdpMode::Tc), 20_000);
        let tiny = unit_rule("r", Unit::Packets, 1_000, 8);
        assert_eq!(min_share_burst(&tiny, XdpMode::Tc), 8);
    }

    /// Frames refused before the aggregate (per source, or unmetered) are no demand, nor
    /// refusals that count for the fleet. Old code: a flood refused per source counted
    /// in full.
    #[test]
    fn frames_refused_before_the_aggregate_are_no_demand() {
        let c = RuleCounters {
            passed_packets: 10,
            passed_bytes: 10_000,
            dropped_packets: 90,
            dropped_bytes: 90_000,
            refused_early_packets: 85,
            refused_early_bytes: 85_000,
            ..RuleCounters::default()
        };
        assert_eq!(offered_units(Unit::Packets, &c, 0), 15);
        assert_eq!(offered_units(Unit::Bytes, &c, 0), 15_000);
        assert_eq!(offered_units(Unit::Syn, &c, 88), 3);
        assert_eq!(refused_frames(&c), 5);
    }

    /// Demand is the offered load in the rule's unit: bytes for bytes rules, SYNs (their
    /// own counter) for syn rules, packets otherwise. Old code: packets for every unit.
    #[test]
    fn demand_is_reported_in_the_rule_unit() {
        let c = RuleCounters {
            passed_packets: 10,
            passed_bytes: 10_000,
            dropped_packets: 5,
            dropped_bytes: 5_000,
            would_drop_packets: 0,
            would_drop_bytes: 0,
            refused_early_packets: 0,
            refused_early_bytes: 0,
        };
        assert_eq!(offered_units(Unit::Packets, &c, 3), 15);
        assert_eq!(offered_units(Unit::Bytes, &c, 3), 15_000);
        assert_eq!(offered_units(Unit::Syn, &c, 3), 3);
        let rules = [unit_rule("r", Unit::Bytes, 1_000_000, 10_000)];
        let mut fleet = FleetState::new(spec(), 500, XdpMode::Auto, &rules, 0);
        let at = |c: &RuleCounters| {
            BTreeMap::from([(
                "r".to_string(),
                RuleTotals {
                    offered: offered_units(Unit::Bytes, c, 0),
                    refused: c.dropped_packets,
                    credit_left: None,
                },
            )])
        };
        let _ = fleet.report_to(0, &at(&RuleCounters::default()), 0);
        let r = fleet.report_to(0, &at(&c), 2 * S);
        assert_eq!(r.rules[0].demand, 7_500, "bytes per second");
        assert_eq!(r.rules[0].denials, 5, "frames");
        // No credit for a bytes rule: its refusals are frames, its shares bytes.
        assert_eq!(
            (r.rules[0].admitted, r.rules[0].credited, r.rules[0].credit),
            (None, None, None)
        );
    }

    fn totals(offered: u64, refused: u64, credit_left: u64) -> BTreeMap<String, RuleTotals> {
        BTreeMap::from([(
            "contoso".to_string(),
            RuleTotals {
                offered,
                refused,
                credit_left: Some(credit_left),
            },
        )])
    }

    fn credit_reply(credit: u64) -> ReportReply {
        let mut r = reply(1_000, true);
        r.grants[0].credit = credit;
        r
    }

    /// A grant's credit is queued for the bucket (every grant replaces the last, 0 too);
    /// the report says what was admitted, what of it on credit (how far the word fell,
    /// across writes) and the last grant's credit.
    #[test]
    fn a_grants_credit_is_written_and_what_was_spent_of_it_is_reported() {
        let rules = [rule(FailMode::Open)];
        let mut fleet = FleetState::new(spec(), 500, XdpMode::Auto, &rules, 0);
        let first = fleet.report_to(0, &totals(0, 0, 0), 0);
        assert_eq!(
            (
                first.rules[0].admitted,
                first.rules[0].credited,
                first.rules[0].credit
            ),
            (Some(0), Some(0), Some(0))
        );
        fleet.apply_from(0, &credit_reply(40), S / 10);
        assert_eq!(fleet.pending_credit().get("contoso"), Some(&40));
        // The daemon swaps it in; the word held 0.
        let _ = fleet.take_pending_credit();
        fleet.credit_written("contoso", 40, 0, S / 10);
        // 30 of it spent when the next grant replaces it with 10.
        fleet.apply_from(0, &credit_reply(10), S / 2);
        assert_eq!(fleet.pending_credit().get("contoso"), Some(&10));
        fleet.credit_written("contoso", 10, 10, S / 2);
        // 4 of the second spent by the report: 34 credited of 1,200 admitted.
        let r = fleet.report_to(0, &totals(1_500, 300, 6), S);
        assert_eq!(
            (r.rules[0].admitted, r.rules[0].credited, r.rules[0].credit),
            (Some(1_200), Some(34), Some(10))
        );
        assert_eq!(r.rules[0].denials, 300);
        // Nothing spent since: nothing credited again.
        let r = fleet.report_to(0, &totals(1_500, 300, 6), 2 * S);
        assert_eq!(r.rules[0].credited, Some(0));
        assert_eq!(fleet.credited_total(), 34);
        // A zero-credit grant still replaces what is left.
        fleet.apply_from(0, &credit_reply(0), 2 * S);
        assert_eq!(fleet.pending_credit().get("contoso"), Some(&0));
    }

    /// A restarted daemon finds a credit word pinned: not counted as spent at its first
    /// look, only what falls from there.
    #[test]
    fn a_pinned_credit_word_is_not_counted_as_spent() {
        let rules = [rule(FailMode::Open)];
        let mut fleet = FleetState::new(spec(), 500, XdpMode::Auto, &rules, 0);
        let r = fleet.report_to(0, &totals(0, 0, 25), 0);
        assert_eq!(r.rules[0].credited, Some(0));
        let r = fleet.report_to(0, &totals(100, 0, 20), S);
        assert_eq!(r.rules[0].credited, Some(5));
        // A word the daemon could not read: no counts at all (the allocator then grants
        // no credit), rather than a guess or a failed report.
        let mut unreadable = totals(200, 0, 0);
        if let Some(t) = unreadable.get_mut("contoso") {
            t.credit_left = None;
        }
        let r = fleet.report_to(0, &unreadable, 2 * S);
        assert_eq!(
            (r.rules[0].admitted, r.rules[0].credited, r.rules[0].credit),
            (None, None, None)
        );
        // Spending seen at the next readable look is counted from the last one.
        let r = fleet.report_to(0, &totals(300, 0, 18), 3 * S);
        assert_eq!(r.rules[0].credited, Some(2));
    }

    /// A failed report re-arms the last grant's credit while the lease holds, at most
    /// once a report interval; not after the lease lapsed, not without a credit.
    #[test]
    fn a_failed_report_rearms_the_credit_while_the_lease_holds() {
        let rules = [rule(FailMode::Open)];
        let mut fleet = FleetState::new(spec(), 500, XdpMode::Auto, &rules, 0);
        fleet.apply_from(0, &credit_reply(40), S);
        let _ = fleet.take_pending_credit();
        fleet.credit_written("contoso", 40, 0, S);
        fleet.rearm_credit(0, S + S / 2);
        assert!(
            fleet.pending_credit().is_empty(),
            "within an interval of the write"
        );
        fleet.rearm_credit(1, 2 * S);
        assert!(fleet.pending_credit().is_empty(), "another group's failure");
        fleet.rearm_credit(0, 2 * S);
        assert_eq!(fleet.pending_credit().get("contoso"), Some(&40));
        let _ = fleet.take_pending_credit();
        fleet.credit_written("contoso", 40, 12, 2 * S);
        // The lease (3 s from the grant at 1 s) lapsed at 4 s: STICKY spends no credit.
        fleet.rearm_credit(0, 4 * S + 1);
        assert!(fleet.pending_credit().is_empty(), "lease lapsed");
        // A grant without credit: nothing to re-arm.
        fleet.apply_from(0, &credit_reply(0), 5 * S);
        let _ = fleet.take_pending_credit();
        fleet.credit_written("contoso", 0, 0, 5 * S);
        fleet.rearm_credit(0, 7 * S);
        assert!(fleet.pending_credit().is_empty(), "no credit granted");
    }

    /// A grant that does not compile is refused before it is stored: counted, the rule
    /// keeps its share, the other grants of the reply apply, and what is installed still
    /// compiles. Old code stored it, so the next compile failed (and the report loop,
    /// which propagated that error, stopped for good).
    #[test]
    fn a_grant_that_does_not_compile_is_refused_and_counted() {
        let rules = [
            unit_rule("a", Unit::Packets, 10_000, 1_000),
            unit_rule("b", Unit::Bytes, 1_000_000, 10_000),
        ];
        let mut fleet = FleetState::new(spec(), 500, XdpMode::Auto, &rules, 0);
        fleet.apply_from(0, &grant_reply("a", 500, 50, 1, 3_000), 0);
        let before = entry(&installed(&fleet, &rules, 0), "a").aggregate;
        let bad = [(limiter_common::gcra::MAX_RATE + 1, 50), (1_000, u64::MAX)];
        for (i, (rate, burst)) in bad.into_iter().enumerate() {
            let mut reply = grant_reply("a", rate, burst, 1, 3_000);
            reply
                .grants
                .push(grant_reply("b", 4_000, 4_000, 1, 3_000).grants[0].clone());
            let refused = fleet.apply_from(0, &reply, S).refused;
            assert_eq!(refused.len(), 1, "{refused:?}");
            assert_eq!(refused[0].rule, "a");
            assert_eq!(fleet.grants_refused(), i as u64 + 1);
            let shaped = fleet.shape(&rules);
            let slots = ruleset::assign_slots(&BTreeMap::new(), &shaped).unwrap();
            let t = ruleset::compile(&shaped, &slots).expect("the installed rules still compile");
            assert_eq!(entry(&t, "a").aggregate, before, "the rule keeps its share");
            assert_eq!(entry(&t, "b").rate, 4_000, "the good grant applied");
        }
    }

    /// A zero grant with a one-day TTL closes the rule for `MAX_GRANT_TTL_LEASES` lease
    /// TTLs at most. Old code: for a day.
    #[test]
    fn a_zero_grant_with_a_long_ttl_closes_the_rule_for_a_few_leases_at_most() {
        let rules = [rule(FailMode::Open)];
        let mut fleet = FleetState::new(spec(), 500, XdpMode::Auto, &rules, 0);
        fleet.apply_from(0, &grant_reply("contoso", 0, 0, 0, 86_400_000), S);
        let t = installed(&fleet, &rules, S);
        let c = entry(&t, "contoso");
        assert_ne!(c.flags & RULE_CLOSED_UNTIL_LAPSE, 0);
        let max = u64::from(limiter_fleet::share::MAX_GRANT_TTL_LEASES) * spec().lease_ttl_ms;
        assert_eq!(c.lease_expires_ns, S + max * 1_000_000);
    }

    /// A restart reads the pinned entries: a rule that was LEASED resumes its share and
    /// deadlines (closed ones stay closed); one whose unit changed, or that was in
    /// BOOTSTRAP, bootstraps.
    #[test]
    fn a_restart_resumes_the_pinned_lease() {
        let rules = [
            unit_rule("a", Unit::Packets, 10_000, 1_000),
            unit_rule("b", Unit::Bytes, 1_000_000, 10_000),
            unit_rule("c", Unit::Packets, 10_000, 1_000),
            unit_rule("d", Unit::Packets, 10_000, 1_000),
        ];
        let mut old = FleetState::new(spec(), 500, XdpMode::Auto, &rules, 0);
        let mut reply = grant_reply("a", 3_000, 300, 1, 3_000);
        reply
            .grants
            .push(grant_reply("b", 400_000, 1, 1, 3_000).grants[0].clone());
        reply
            .grants
            .push(grant_reply("c", 0, 0, 0, 3_000).grants[0].clone());
        old.apply_from(0, &reply, S);
        let t = installed(&old, &rules, S);
        let pinned: BTreeMap<String, RuleConfig> = t
            .slots
            .iter()
            .map(|(n, s)| (n.clone(), *t.rule(*s).unwrap()))
            .collect();

        let mut changed = rules.clone();
        changed[3].unit = Unit::Syn;
        let mut new = FleetState::new(spec(), 500, XdpMode::Auto, &changed, 2 * S);
        let (resumed, _) = new.resume(&changed, &pinned, 2 * S);
        assert_eq!(resumed, ["a", "b", "c"]);
        let states = new.states(2 * S);
        assert_eq!(states["a"], ShareState::Leased);
        assert_eq!(states["d"], ShareState::Bootstrap);
        let t = installed(&new, &changed, 2 * S);
        let a = entry(&t, "a");
        assert_eq!((a.rate, a.burst), (3_000, 300));
        assert_eq!(a.lease_expires_ns, 4 * S, "the lease's own deadline");
        assert_eq!(entry(&t, "b").burst, MIN_BYTES_BURST);
        assert_ne!(
            entry(&t, "c").flags & RULE_CLOSED_UNTIL_LAPSE,
            0,
            "closed stays closed"
        );
        assert!(
            new.pending_tokens().is_empty(),
            "the pinned bucket continues"
        );
        // Past the lease: STICKY, as the kernel already applied it.
        assert_eq!(new.states(4 * S)["a"], ShareState::Sticky);
        let r = new.report_to(0, &BTreeMap::new(), 3 * S);
        assert_eq!(r.rules[0].held, 3_000, "reported as held");
    }

    /// A rule a reload removes goes whole, and one whose unit changed starts anew: none
    /// of the old share's tokens or credit is queued for a bucket afterwards. Old code:
    /// `sync_rules` pruned each per-rule collection by hand but `pending_tokens`, so a
    /// grant's tokens queued before the reload survived it, and a rule whose unit changed
    /// had its fresh bucket taken over with the old share's tokens (in the old unit).
    #[test]
    fn a_rule_removed_or_changed_by_a_reload_leaves_nothing_queued() {
        let rules = [
            unit_rule("a", Unit::Packets, 10_000, 1_000),
            unit_rule("b", Unit::Packets, 10_000, 1_000),
            unit_rule("c", Unit::Packets, 10_000, 1_000),
        ];
        let mut fleet = FleetState::new(spec(), 500, XdpMode::Auto, &rules, 0);
        let mut reply = grant_reply("a", 3_000, 300, 1, 3_000);
        for rule in ["b", "c"] {
            reply
                .grants
                .push(grant_reply(rule, 3_000, 300, 1, 3_000).grants[0].clone());
        }
        for grant in &mut reply.grants {
            grant.credit = 40;
        }
        // Out of BOOTSTRAP: each grant takes its bucket over and brings a credit.
        fleet.apply_from(0, &reply, S);
        // The reload (its reinstall not yet run): `a` removed, `b` now counts SYNs.
        let mut reloaded = vec![rules[1].clone(), rules[2].clone()];
        reloaded[0].unit = Unit::Syn;
        fleet.sync_rules(&reloaded, 2 * S);
        let queued = |m: BTreeMap<String, u64>| m.into_keys().collect::<Vec<_>>();
        assert_eq!(queued(fleet.take_pending_tokens()), ["c"], "tokens");
        assert_eq!(queued(fleet.take_pending_credit()), ["c"], "credit");
        assert_eq!(fleet.states(2 * S)["b"], ShareState::Bootstrap);
    }

    /// The allocator's report interval is held to [200 ms, lease TTL / 2]. Old code: any
    /// value was taken as it came (1 ms: a report every 50 ms poll).
    #[test]
    fn the_allocators_report_interval_is_clamped() {
        assert_eq!(clamp_report_interval(1, 3_000), Duration::from_millis(200));
        assert_eq!(
            clamp_report_interval(1_000, 3_000),
            Duration::from_millis(1_000)
        );
        assert_eq!(
            clamp_report_interval(3_600_000, 3_000),
            Duration::from_millis(1_500)
        );
        // A lease shorter than two spacings: the spacing wins.
        assert_eq!(
            clamp_report_interval(5_000, 300),
            Duration::from_millis(200)
        );
    }

    /// A rule group a moved to group b: b's grant is in force, and a late reply of a
    /// granting the rule changes nothing. Old code: a's late grant replaced b's.
    #[test]
    fn a_late_grant_of_the_group_a_rule_left_changes_nothing() {
        use limiter_proto::pb::RuleElsewhere;
        let mut spec = spec();
        spec.groups = ["a", "b"]
            .iter()
            .enumerate()
            .map(|(i, name)| crate::config::AllocatorGroup {
                name: (*name).into(),
                allocators: vec![format!("127.0.0.1:{}", i + 1).parse().unwrap()],
            })
            .collect();
        let rules = [rule(FailMode::Open)];
        let mut fleet = FleetState::new(spec, 500, XdpMode::Auto, &rules, 0);
        let mut moved = reply(0, false);
        moved.grants.clear();
        moved.elsewhere = vec![RuleElsewhere {
            rule: "contoso".into(),
            group: "b".into(),
        }];
        fleet.apply_from(0, &moved, S);
        fleet.apply_from(1, &reply(4_000, false), 2 * S);
        let held =
            |fleet: &mut FleetState, t| fleet.report_to(1, &BTreeMap::new(), t).rules[0].held;
        assert_eq!(held(&mut fleet, 2 * S), 4_000);
        fleet.apply_from(0, &reply(9_000, false), 3 * S);
        assert_eq!(held(&mut fleet, 3 * S), 4_000, "b's grant stays in force");
    }

    #[test]
    fn sharded_rules_are_reported_to_the_group_that_grants_them() {
        use limiter_proto::pb::RuleElsewhere;
        let mut spec = spec();
        spec.groups = vec![
            crate::config::AllocatorGroup {
                name: "a".into(),
                allocators: vec!["127.0.0.1:1".parse().unwrap()],
            },
            crate::config::AllocatorGroup {
                name: "b".into(),
                allocators: vec!["127.0.0.1:2".parse().unwrap()],
            },
        ];
        let rules = [rule(FailMode::Open)];
        let mut fleet = FleetState::new(spec, 500, XdpMode::Auto, &rules, 0);
        let totals = |offered: u64| {
            BTreeMap::from([(
                "contoso".to_string(),
                RuleTotals {
                    offered,
                    refused: 0,
                    credit_left: None,
                },
            )])
        };
        // Not routed yet: the first group.
        assert!(fleet.has_rules_for(0) && !fleet.has_rules_for(1));
        assert!(fleet.report_to(1, &totals(0), 0).rules.is_empty());
        assert_eq!(fleet.report_to(0, &totals(0), 0).rules.len(), 1);
        // Group a says b grants it: reported to b only, its demand over the time since
        // its own last report (to a).
        let mut moved = reply(0, false);
        moved.grants.clear();
        moved.elsewhere = vec![RuleElsewhere {
            rule: "contoso".into(),
            group: "b".into(),
        }];
        let applied = fleet.apply_from(0, &moved, S);
        assert_eq!(applied.moved, [("contoso".to_string(), "b".to_string())]);
        assert!(fleet.report_to(0, &totals(1000), 2 * S).rules.is_empty());
        let to_b = fleet.report_to(1, &totals(1000), 2 * S);
        assert_eq!(to_b.rules[0].demand, 500);
        // A late word of a about it changes nothing; b naming a group the host does not
        // list sends it back to the first group, and says so.
        moved.elsewhere[0].group = "c".into();
        assert!(fleet.apply_from(0, &moved, 3 * S).unknown.is_empty());
        assert!(fleet.has_rules_for(1));
        let applied = fleet.apply_from(1, &moved, 3 * S);
        assert_eq!(applied.unknown, [("contoso".to_string(), "c".to_string())]);
        assert!(fleet.has_rules_for(0) && !fleet.has_rules_for(1));
    }
}
