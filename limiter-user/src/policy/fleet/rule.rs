//! One fleet rule on this host ([`FleetRule`]): its share, its reports' baseline, what a
//! grant or a rejoin queues for its bucket, and its credit ([`CreditLedger`]).

use std::time::Duration;

use limiter_common::{
    abi::{RuleConfig, RULE_CLOSED_UNTIL_LAPSE},
    gcra::Limit,
};
use limiter_fleet::share::{Grant, Share, ShareParams, ShareState};
use limiter_proto::pb::{RuleGrant, RuleReport};

use super::{min_share_burst, takes_credit, RuleTotals};
use crate::config::{RateSpec, RuleSpec, Unit, XdpMode};

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

/// Why a grant was refused.
pub(super) fn check_grant(unit: Unit, share: &Share, g: &RuleGrant) -> Result<(), String> {
    if g.rate == 0 {
        // A closed share: `Limit::CLOSED`, nothing to compile.
        return Ok(());
    }
    Limit::new(unit.granularity(), g.rate, g.burst.max(share.min_burst()))
        .map(|_| ())
        .map_err(|e| format!("rate {} burst {}: {e}", g.rate, g.burst))
}

/// One fleet rule on this host: its share and all that is kept of it between reports and
/// installs. It lives and goes as one: a rule a reload removes, or whose unit changes,
/// leaves nothing behind (no tokens or credit queued for a bucket that is no longer its).
#[derive(Clone)]
pub(super) struct FleetRule {
    pub(super) share: Share,
    /// The share's unit (a rule whose unit changes starts a new share).
    pub(super) unit: Unit,
    /// The rule's counter totals at its last report, and when that was: with sharded
    /// allocators, a rule's reports go to its group on that group's schedule.
    pub(super) last_report: Option<(RuleTotals, u64)>,
    /// The units its bucket holds when a grant (or a rejoin) takes it over, until the
    /// daemon writes them ([`super::FleetState::take_pending_tokens`]).
    pub(super) pending_tokens: Option<u64>,
    /// The credit to write into its bucket (a grant's, or a re-arm), replacing what is
    /// left: [`super::FleetState::credit_written`] after the write.
    pub(super) pending_credit: Option<u64>,
    /// Its [`CreditLedger`], from its first credit look or grant (credit-taking units).
    pub(super) credit: Option<CreditLedger>,
    /// A closed share that rejoined: its group's report goes at once (its grant request).
    pub(super) asking: bool,
}

impl FleetRule {
    /// A new rule (or one whose unit changed): the bootstrap share, counted anew.
    pub(super) fn bootstrap(
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
    pub(super) fn enforced(&self) -> RateSpec {
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
    pub(super) fn annotate(&self, entry: &mut RuleConfig, now: u64) {
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
    pub(super) fn denials(&self, totals: Option<&RuleTotals>) -> u64 {
        let refused = totals.map_or(0, |t| t.refused);
        let last = self.last_report.map_or(refused, |(s, _)| s.refused);
        refused.saturating_sub(last)
    }

    /// The rule's report from its counter totals `sample`: demand per second since its
    /// own last report, and the credit it spent. Counts from here on.
    pub(super) fn report(&mut self, name: &str, sample: RuleTotals, now: u64) -> RuleReport {
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
    pub(super) fn rejoin(&mut self, denials: u64, now: u64) -> bool {
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
    pub(super) fn apply(&mut self, g: &RuleGrant, now: u64) -> Result<(), String> {
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
    pub(super) fn rearm_credit(&mut self, interval: u64, now: u64) {
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
