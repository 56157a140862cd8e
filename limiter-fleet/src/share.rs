//! The share state machine of one rule on one host (docs/design.md, "Fleet state machine").
//!
//! ```text
//!            grant                      lease TTL lapses           sticky_max passes
//! BOOTSTRAP ───────▶ LEASED ─────────────────────▶ STICKY ─────────────────────▶ FAIL_OPEN
//!     │                ▲  └── grant (renewal) ──┘    │ grant                      │ grant
//!     │                └─────────────────────────────┴────────────────────────────┘
//!     └── no grant for lease TTL + sticky_max (an LB that joined mid-outage) ──▶ FAIL_OPEN
//! ```
//!
//! A share's burst never falls below the rule's floor ([`Share::with_min_burst`]): the
//! largest single admission the data path meters (one unit for packets and SYNs at XDP;
//! one maximal frame in bytes; one GRO-built buffer at TC). "A burst of 1" below means one
//! such admission, and a grant's token (≤ 1) is worth one of them too. Without the floor
//! a `bytes` share of burst 1 admits no frame at all.
//!
//! `fail_mode = "static"` rules never reach FAIL_OPEN: they keep their last share (or the
//! bootstrap share) for the whole outage.
//!
//! A share of 0 (a zero grant: the host had no demand, or no room, when it reported) is
//! closed: the rule's aggregate becomes `Limit::CLOSED` and nothing passes. Once its
//! lease has lapsed (STICKY), a closed share that refuses frames rejoins: it runs at the
//! bootstrap rate (quota ÷ fleet_size, burst 1, one token) and asks for a grant, exactly
//! like a host that sees the rule for the first time mid-outage ([`Share::rejoin`]). It
//! keeps its fail-open deadline: the outage's time box does not restart. Deadlines are absolute times on the host's
//! monotonic clock, computed from relative TTLs on the wire, so wall-clock skew between
//! hosts and the allocator does not matter; the daemon writes them into the rule's map
//! entry, so the kernel fails open on time even when the daemon is dead.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// `fleet_size` unless the config says otherwise: the hosts a rule's quota is split over
/// while bootstrapping (quota ÷ fleet_size).
pub const DEFAULT_FLEET_SIZE: u32 = 500;
/// `lease_ttl_ms` unless the config says otherwise (daemon and allocator): how long a
/// grant is valid after it arrives.
pub const DEFAULT_LEASE_TTL_MS: u64 = 3_000;
/// `sticky_max_s` unless the config says otherwise: how long a lapsed lease's share is
/// kept before an `open` rule fails open.
pub const DEFAULT_STICKY_MAX_S: u64 = 300;
/// `report_interval_ms` unless the config says otherwise (daemon and allocator): how
/// often a host reports, and so renews its leases.
pub const DEFAULT_REPORT_INTERVAL_MS: u64 = 1_000;
/// The largest `lease_ttl_ms` and `report_interval_ms` either binary's config accepts (an
/// hour): the daemon and the allocator read the same timings, so a value one accepts the
/// other must too.
pub const MAX_FLEET_TIMING_MS: u64 = 3_600_000;

/// How soon a daemon with a share in FAIL_OPEN retries a failed report (ms), instead of a
/// report interval later: a FAIL_OPEN share passes everything until a report reaches an
/// allocator, so an allocator's return should be seen within this, not within an
/// interval. No faster than the daemons' early reports (limiter-proto's
/// `MIN_REPORT_SPACING_MS`), which the allocator's report rate limit allows for.
pub const FAIL_OPEN_RETRY_MS: u64 = 200;

/// Timings and fleet size; the defaults (the `DEFAULT_*` above) are the brief's (docs/design.md, "Fleet state machine").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShareParams {
    pub fleet_size: u32,
    /// A grant is valid this long after it arrives.
    pub lease_ttl: Duration,
    /// After the lease lapses, the last share is kept this long (then FAIL_OPEN for
    /// `open` rules).
    pub sticky_max: Duration,
    /// Reports (and so renewals) are sent this often.
    pub report_interval: Duration,
}

/// A grant's TTL is clamped to this many configured lease TTLs
/// ([`ShareParams::max_grant_ttl`]): an allocator (or whoever speaks for it) cannot pin a
/// share, a closed one above all, for longer than a few missed renewals.
pub const MAX_GRANT_TTL_LEASES: u32 = 4;

impl ShareParams {
    /// The longest lease a grant may set: [`MAX_GRANT_TTL_LEASES`] lease TTLs.
    pub fn max_grant_ttl(&self) -> Duration {
        self.lease_ttl.saturating_mul(MAX_GRANT_TTL_LEASES)
    }
}

impl Default for ShareParams {
    fn default() -> Self {
        ShareParams {
            fleet_size: DEFAULT_FLEET_SIZE,
            lease_ttl: Duration::from_millis(DEFAULT_LEASE_TTL_MS),
            sticky_max: Duration::from_secs(DEFAULT_STICKY_MAX_S),
            report_interval: Duration::from_millis(DEFAULT_REPORT_INTERVAL_MS),
        }
    }
}

/// The states of the machine above are the map's share states: a [`Share`] is never
/// `Standalone` (a rule without a share is).
pub use limiter_common::share::ShareState;

/// Behaviour during a long allocator outage: a rule's `fail_mode` in the daemon's config
/// (the spellings are [`FailMode::as_str`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailMode {
    /// After sticky_max without a grant, allow everything.
    Open,
    /// Keep the last share for the whole outage.
    Static,
}

impl FailMode {
    /// Every value, in the order the config documents them.
    pub const ALL: &'static [FailMode] = &[FailMode::Open, FailMode::Static];

    /// The spelling in the config file.
    pub const fn as_str(self) -> &'static str {
        match self {
            FailMode::Open => "open",
            FailMode::Static => "static",
        }
    }
}

/// What the allocator hands a host for one rule. Times are relative.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    /// Share of the global quota, units per second.
    pub rate: u64,
    pub burst: u64,
    /// Tokens the bucket holds when the grant takes over (≤ 1 for a first grant: a
    /// grant never hands out a fresh burst).
    pub tokens: u64,
    pub ttl: Duration,
    /// Demand exceeds the share: denials are expected and need no early report.
    pub saturated: bool,
    /// Frames this host may admit beyond its bucket until its next grant (which
    /// replaces what is left of it): quota the fleet left unused, reassigned to a host
    /// that refused frames (`alloc::RuleAllocator::credit_cap`). Spent only on frames
    /// the bucket refuses, so it never overflows; not part of the share (`rate`), so
    /// shares in force still sum to at most the quota. 0 without credit.
    #[serde(default)]
    pub credit: u64,
}

impl Grant {
    /// A share of 0: the host enforces a closed limit (nothing passes).
    pub fn closed(&self) -> bool {
        self.rate == 0
    }
}

/// What the host enforces for the rule right now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Enforcement {
    /// A GCRA limit of `rate` per second with `burst`; `rate` 0 is closed (nothing
    /// passes: `Limit::CLOSED`).
    Limit { rate: u64, burst: u64 },
    /// Everything passes (FAIL_OPEN).
    Open,
}

/// One rule's share on one host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Share {
    pub quota: u64,
    pub fail_mode: FailMode,
    pub params: ShareParams,
    state: ShareState,
    rate: u64,
    burst: u64,
    saturated: bool,
    /// When the current lease (or the bootstrap period) lapses, ns.
    lease_expires: u64,
    /// When an `open` rule fails open, ns; `None` for static rules.
    fail_open_at: Option<u64>,
    /// The smallest burst this rule's share may have, in its unit (one admission: see the
    /// module doc); 1 unless [`Share::with_min_burst`] says otherwise.
    min_burst: u64,
}

/// A share as a rule's pinned map entry holds it (an earlier daemon's lease), for
/// [`Share::resume`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeldShare {
    pub rate: u64,
    pub burst: u64,
    /// Absolute deadlines on the host's monotonic clock, ns (0 = none).
    pub lease_expires: u64,
    pub fail_open_at: u64,
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Share {
    /// A rule this host has no grant for: quota ÷ fleet_size with a burst of 1 (one
    /// admission: the floor, once [`Share::with_min_burst`] sets it).
    pub fn bootstrap(quota: u64, fail_mode: FailMode, params: ShareParams, now: u64) -> Share {
        let lease_expires = now.saturating_add(ns(params.lease_ttl));
        let mut share = Share {
            quota,
            fail_mode,
            params,
            state: ShareState::Bootstrap,
            rate: Self::bootstrap_rate(quota, params.fleet_size),
            burst: 1,
            saturated: false,
            lease_expires,
            fail_open_at: None,
            min_burst: 1,
        };
        share.fail_open_at = share.fail_open_deadline(lease_expires);
        share
    }

    /// Sets the rule's burst floor (at least 1): the largest single admission its data
    /// path meters, in the rule's unit. Every burst the share runs at (bootstrap, a
    /// grant, a rejoin) is raised to it, and a token is worth that many units.
    pub fn with_min_burst(mut self, min_burst: u64) -> Share {
        self.min_burst = min_burst.max(1);
        self.burst = self.burst.max(self.min_burst);
        self
    }

    /// A share an earlier daemon on this host held when it stopped (the rule's pinned
    /// entry), resumed as LEASED with its rate, burst and deadlines: the state then
    /// follows those deadlines (STICKY once the lease lapsed, FAIL_OPEN on its deadline)
    /// exactly as the kernel applied them while no daemon ran. Deadlines beyond what a
    /// grant arriving `now` could set are pulled in (a corrupt or hostile entry cannot
    /// pin a share for longer), and an `open` rule always has a fail-open deadline.
    /// `None` if the entry cannot be a share of this rule (burst 0 with a rate, no lease).
    pub fn resume(
        quota: u64,
        fail_mode: FailMode,
        params: ShareParams,
        min_burst: u64,
        held: HeldShare,
        now: u64,
    ) -> Option<Share> {
        if held.lease_expires == 0 || (held.rate > 0 && held.burst == 0) {
            return None;
        }
        let lease_expires = held
            .lease_expires
            .min(now.saturating_add(ns(params.max_grant_ttl())));
        let mut share = Share::bootstrap(quota, fail_mode, params, now).with_min_burst(min_burst);
        share.state = ShareState::Leased;
        share.rate = held.rate;
        share.burst = held.burst.max(share.min_burst);
        share.lease_expires = lease_expires;
        let latest = share.fail_open_deadline(lease_expires);
        share.fail_open_at = match (latest, held.fail_open_at) {
            (Some(latest), held) if held != 0 => Some(latest.min(held)),
            (latest, _) => latest,
        };
        Some(share)
    }

    /// The floor of this share's burst (see [`Share::with_min_burst`]).
    pub fn min_burst(&self) -> u64 {
        self.min_burst
    }

    /// Units a bucket holds when a grant carrying `tokens` takes over: at most one token,
    /// and a token is one admission ([`Share::min_burst`] units).
    pub fn token_units(&self, tokens: u64) -> u64 {
        tokens.min(1) * self.min_burst
    }

    /// quota ÷ fleet_size, at least 1/s (a bootstrap share of zero would block the rule).
    pub fn bootstrap_rate(quota: u64, fleet_size: u32) -> u64 {
        (quota / u64::from(fleet_size.max(1))).max(1)
    }

    fn fail_open_deadline(&self, lease_expires: u64) -> Option<u64> {
        match self.fail_mode {
            FailMode::Open => Some(lease_expires.saturating_add(ns(self.params.sticky_max))),
            FailMode::Static => None,
        }
    }

    /// A grant arrived at `now`: LEASED until now + ttl, the TTL clamped to
    /// [`ShareParams::max_grant_ttl`]; the burst raised to the floor.
    pub fn on_grant(&mut self, grant: &Grant, now: u64) {
        self.state = ShareState::Leased;
        self.rate = grant.rate;
        self.burst = grant.burst.max(self.min_burst);
        self.saturated = grant.saturated;
        let ttl = grant.ttl.min(self.params.max_grant_ttl());
        self.lease_expires = now.saturating_add(ns(ttl));
        self.fail_open_at = self.fail_open_deadline(self.lease_expires);
    }

    /// Whether `grant`, arriving at `now`, takes over the rule's bucket with the grant's
    /// token count (≤ 1) instead of keeping its state (the TAT): the bucket was not
    /// metering a granted share (BOOTSTRAP, FAIL_OPEN, a closed share), or the grant
    /// lifts a share out of a burst of 1 (its floor). A grant never hands out a fresh
    /// burst.
    ///
    /// Why a burst of 1: GCRA keeps a bucket's fill as time (TAT − now), and a renewal
    /// keeps the TAT. A saturated bucket of burst 1 swings between empty and full (each
    /// frame costs its whole tolerance), so under a larger rate and burst the same TAT is
    /// on average half the new burst: a share grown from 1/s to 88/s would get up to 88
    /// tokens at once. It held at most one token (one admission), so resetting it to the
    /// grant's count loses at most one.
    pub fn takes_over(&self, grant: &Grant, now: u64) -> bool {
        match self.state(now) {
            // (Never Standalone: that would be a bucket without a granted share too.)
            ShareState::Standalone | ShareState::Bootstrap | ShareState::FailOpen => true,
            ShareState::Leased | ShareState::Sticky => {
                self.rate == 0 || (self.burst <= self.min_burst && grant.burst > self.min_burst)
            }
        }
    }

    /// The global quota changed (config reload): bootstrap rate follows it; a lease
    /// keeps its share until the allocator says otherwise.
    pub fn set_quota(&mut self, quota: u64) {
        self.quota = quota;
        if self.state == ShareState::Bootstrap {
            self.rate = Self::bootstrap_rate(quota, self.params.fleet_size);
        }
    }

    /// The state at `now` (advances LEASED → STICKY → FAIL_OPEN on the deadlines).
    pub fn state(&self, now: u64) -> ShareState {
        if self.fail_open_at.is_some_and(|t| now >= t) {
            return ShareState::FailOpen;
        }
        match self.state {
            ShareState::Leased if now >= self.lease_expires => ShareState::Sticky,
            s => s,
        }
    }

    pub fn enforcement(&self, now: u64) -> Enforcement {
        match self.state(now) {
            ShareState::FailOpen => Enforcement::Open,
            _ => Enforcement::Limit {
                rate: self.rate,
                burst: self.burst,
            },
        }
    }

    /// (lease_expires_ns, fail_open_at_ns) for the rule's map entry; 0 = none.
    pub fn deadlines(&self) -> (u64, u64) {
        (self.lease_expires, self.fail_open_at.unwrap_or(0))
    }

    /// Whether denials since the last report call for a report now, out of cycle: the
    /// grant said the share covers demand, yet frames are being refused. A zero grant to
    /// a host without demand says `saturated: false`, so a closed share's first
    /// refusals ask for a real share at once.
    pub fn wants_early_report(&self, denials: u64, now: u64) -> bool {
        denials > 0 && !self.saturated && self.state(now) == ShareState::Leased
    }

    /// Whether the host enforces a closed limit now (a zero grant, LEASED or STICKY).
    pub fn closed(&self, now: u64) -> bool {
        self.rate == 0 && matches!(self.state(now), ShareState::Leased | ShareState::Sticky)
    }

    /// Refusals (`denials` since the last report) on a closed share whose lease has lapsed:
    /// the host sees demand for a rule it holds no share of, with no allocator to ask — the
    /// position of a host that joins the rule mid-outage. The design (docs/design.md, Fleet
    /// state machine) counts each such host as adding quota ÷ fleet_size for at most the
    /// sticky period (STATIC rules: until recovery), so it runs as a joiner does: BOOTSTRAP
    /// at quota ÷ fleet_size with a burst of 1 (the caller sets one token) and a grant
    /// request at once. Its fail-open deadline stays (the outage's time box does not
    /// restart); a grant takes over from BOOTSTRAP as usual. Returns whether it rejoined.
    ///
    /// Keeping it closed instead (pure STICKY) would refuse all of the rule's traffic
    /// on this host until FAIL_OPEN — for the whole outage on a STATIC rule: a limiter
    /// outage turned into an outage of the service behind it.
    pub fn rejoin(&mut self, denials: u64, now: u64) -> bool {
        if denials == 0 || self.rate != 0 || self.state(now) != ShareState::Sticky {
            return false;
        }
        self.state = ShareState::Bootstrap;
        self.rate = Self::bootstrap_rate(self.quota, self.params.fleet_size);
        self.burst = self.min_burst;
        self.saturated = false;
        true
    }

    pub fn rate(&self) -> u64 {
        self.rate
    }

    /// The bootstrap rate this share runs at when it rejoins (quota ÷ fleet_size): what
    /// a closed share's rule entry carries for the kernel to apply once the lease lapses.
    pub fn rejoin_rate(&self) -> u64 {
        Self::bootstrap_rate(self.quota, self.params.fleet_size)
    }

    pub fn burst(&self) -> u64 {
        self.burst
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn grant(rate: u64) -> Grant {
        Grant {
            rate,
            burst: rate / 10,
            tokens: 1,
            ttl: Duration::from_secs(3),
            saturated: false,
            credit: 0,
        }
    }

    #[test]
    fn contoso_bootstraps_at_quota_over_fleet_size_with_burst_one() {
        let s = Share::bootstrap(10_000, FailMode::Open, ShareParams::default(), 0);
        assert_eq!(s.state(0), ShareState::Bootstrap);
        assert_eq!(s.enforcement(0), Enforcement::Limit { rate: 20, burst: 1 });
    }

    #[test]
    fn the_failure_ladder_runs_on_time() {
        let mut s = Share::bootstrap(10_000, FailMode::Open, ShareParams::default(), 0);
        s.on_grant(&grant(250), S / 20);
        let granted = S / 20;
        assert_eq!(s.state(granted), ShareState::Leased);
        assert_eq!(
            s.enforcement(granted),
            Enforcement::Limit {
                rate: 250,
                burst: 25
            }
        );
        // Renewed each second: stays leased.
        s.on_grant(&grant(250), granted + S);
        let renewed = granted + S;
        assert_eq!(s.state(renewed + 3 * S - 1), ShareState::Leased);
        // 3 s without renewal: STICKY, same share.
        assert_eq!(s.state(renewed + 3 * S), ShareState::Sticky);
        assert_eq!(
            s.enforcement(renewed + 3 * S),
            Enforcement::Limit {
                rate: 250,
                burst: 25
            }
        );
        // 5 min after that: FAIL_OPEN.
        assert_eq!(s.state(renewed + 303 * S - 1), ShareState::Sticky);
        assert_eq!(s.state(renewed + 303 * S), ShareState::FailOpen);
        assert_eq!(s.enforcement(renewed + 303 * S), Enforcement::Open);
        assert_eq!(s.deadlines(), (renewed + 3 * S, renewed + 303 * S));
        // The allocator comes back: LEASED again.
        s.on_grant(&grant(300), renewed + 400 * S);
        assert_eq!(s.state(renewed + 400 * S), ShareState::Leased);
    }

    #[test]
    fn static_rules_hold_their_share_forever() {
        let mut s = Share::bootstrap(2_000_000, FailMode::Static, ShareParams::default(), 0);
        s.on_grant(&grant(4000), 0);
        let years = 10 * 365 * 24 * 3600 * S;
        assert_eq!(s.state(years), ShareState::Sticky);
        assert_eq!(
            s.enforcement(years),
            Enforcement::Limit {
                rate: 4000,
                burst: 400
            }
        );
        assert_eq!(s.deadlines().1, 0);
    }

    #[test]
    fn joiners_mid_outage_are_time_boxed_too() {
        let s = Share::bootstrap(10_000, FailMode::Open, ShareParams::default(), 7 * S);
        assert_eq!(s.state(7 * S + 303 * S - 1), ShareState::Bootstrap);
        assert_eq!(s.state(7 * S + 303 * S), ShareState::FailOpen);
        let s = Share::bootstrap(10_000, FailMode::Static, ShareParams::default(), 0);
        assert_eq!(s.state(u64::MAX / 2), ShareState::Bootstrap);
    }

    #[test]
    fn early_reports_only_for_unsaturated_leases() {
        let mut s = Share::bootstrap(10_000, FailMode::Open, ShareParams::default(), 0);
        assert!(!s.wants_early_report(5, 0));
        s.on_grant(&grant(250), 0);
        assert!(!s.wants_early_report(0, 1));
        assert!(s.wants_early_report(5, 1));
        s.on_grant(
            &Grant {
                saturated: true,
                ..grant(250)
            },
            2,
        );
        assert!(!s.wants_early_report(5, 3));
    }

    #[test]
    fn grants_take_over_from_bootstrap_fail_open_zero_grants_and_a_burst_of_one() {
        let mut s = Share::bootstrap(10_000, FailMode::Open, ShareParams::default(), 0);
        let g = grant(250);
        assert!(s.takes_over(&g, 0));
        s.on_grant(&grant(0), 0);
        assert_eq!(s.rate(), 0, "a zero grant is closed");
        assert_eq!(s.enforcement(1), Enforcement::Limit { rate: 0, burst: 1 });
        assert!(s.closed(1));
        assert!(
            s.takes_over(&g, 1),
            "a closed share is not metering a share"
        );
        s.on_grant(&g, S);
        assert!(!s.takes_over(&g, S + 1), "a renewal keeps the bucket");
        assert!(!s.takes_over(&g, S + 3 * S), "STICKY keeps it too");
        assert!(s.takes_over(&g, S + 303 * S), "FAIL_OPEN did not meter");
        // A share of burst 1 (rate 5 → burst 0, floored) growing to burst 25 takes over;
        // a renewal at burst 1 keeps the bucket.
        s.on_grant(&grant(5), 400 * S);
        assert_eq!(s.burst(), 1);
        assert!(!s.takes_over(&grant(9), 400 * S + 1));
        assert!(s.takes_over(&g, 400 * S + 1));
    }

    #[test]
    fn a_closed_share_asks_at_its_first_refusal() {
        let mut s = Share::bootstrap(10_000, FailMode::Open, ShareParams::default(), 0);
        // A zero grant to a host without demand: not saturated.
        s.on_grant(&grant(0), 0);
        assert!(!s.wants_early_report(0, 1));
        assert!(s.wants_early_report(1, 1));
        // A zero grant to a host with demand (no room yet) is saturated: no early report.
        s.on_grant(
            &Grant {
                saturated: true,
                ..grant(0)
            },
            2,
        );
        assert!(!s.wants_early_report(1, 3));
    }

    #[test]
    fn a_lapsed_closed_share_rejoins_like_a_joiner_on_refusals() {
        let p = ShareParams::default();
        let mut s = Share::bootstrap(10_000, FailMode::Open, p, 0);
        s.on_grant(&grant(0), S);
        let (_, fail_open_at) = s.deadlines();
        assert_eq!(fail_open_at, S + 303 * S);
        // LEASED: the allocator is there to ask (an early report), no rejoin.
        assert!(!s.rejoin(5, 2 * S));
        // STICKY without refusals: stays closed.
        assert!(!s.rejoin(0, 5 * S));
        assert!(s.closed(5 * S));
        // STICKY with refusals: BOOTSTRAP at quota ÷ fleet_size, burst 1.
        assert!(s.rejoin(5, 5 * S));
        assert_eq!(s.state(5 * S), ShareState::Bootstrap);
        assert!(!s.closed(5 * S));
        assert_eq!(
            s.enforcement(5 * S),
            Enforcement::Limit { rate: 20, burst: 1 }
        );
        assert!(!s.rejoin(5, 6 * S), "only once");
        // The outage's time box does not restart.
        assert_eq!(s.deadlines().1, fail_open_at);
        assert_eq!(s.state(fail_open_at), ShareState::FailOpen);
        // A grant takes over from it as from any BOOTSTRAP.
        assert!(s.takes_over(&grant(250), 10 * S));
        s.on_grant(&grant(250), 10 * S);
        assert_eq!(s.state(10 * S), ShareState::Leased);

        // A positive STICKY share keeps its share (pure STICKY); FAIL_OPEN stays open.
        let mut s = Share::bootstrap(10_000, FailMode::Open, p, 0);
        s.on_grant(&grant(250), 0);
        assert!(!s.rejoin(5, 4 * S));
        assert_eq!(s.state(4 * S), ShareState::Sticky);
        let mut s = Share::bootstrap(10_000, FailMode::Open, p, 0);
        s.on_grant(&grant(0), 0);
        assert!(!s.rejoin(5, 303 * S));
        assert_eq!(s.state(303 * S), ShareState::FailOpen);

        // STATIC: rejoins, and holds the bootstrap share until the allocator is back.
        let mut s = Share::bootstrap(2_000_000, FailMode::Static, p, 0);
        s.on_grant(&grant(0), 0);
        assert!(s.rejoin(1, 10 * S));
        let years = 10 * 365 * 24 * 3600 * S;
        assert_eq!(s.state(years), ShareState::Bootstrap);
        assert_eq!(
            s.enforcement(years),
            Enforcement::Limit {
                rate: 4000,
                burst: 1
            }
        );
    }

    /// Every burst a share runs at keeps the rule's floor, for each unit's floor (packets
    /// and SYNs at XDP: 1; bytes: one maximal frame; at TC: one GRO buffer), through
    /// BOOTSTRAP, LEASED (a grant of a smaller burst), STICKY and a rejoin.
    #[test]
    fn every_state_keeps_the_burst_floor_of_the_unit() {
        let p = ShareParams::default();
        for floor in [1, 1518, 64, 65_536] {
            let mut s =
                Share::bootstrap(250_000 * 500, FailMode::Static, p, 0).with_min_burst(floor);
            assert_eq!(s.state(0), ShareState::Bootstrap);
            assert_eq!(
                s.enforcement(0),
                Enforcement::Limit {
                    rate: 250_000,
                    burst: floor
                }
            );
            assert_eq!(s.token_units(1), floor, "a token is one admission");
            assert_eq!(s.token_units(7), floor, "never more than one");
            assert_eq!(s.token_units(0), 0);
            // A grant whose proportional burst is below the floor is raised to it.
            let small = Grant {
                rate: 300,
                burst: 1,
                tokens: 1,
                ttl: Duration::from_secs(3),
                saturated: false,
                credit: 0,
            };
            assert!(s.takes_over(&small, S));
            s.on_grant(&small, S);
            assert_eq!(s.state(S), ShareState::Leased);
            assert_eq!(s.burst(), floor);
            assert_eq!(s.state(4 * S), ShareState::Sticky);
            assert_eq!(
                s.enforcement(4 * S),
                Enforcement::Limit {
                    rate: 300,
                    burst: floor
                }
            );
            // A renewal at the floor keeps the bucket; a grant above it takes over.
            assert!(!s.takes_over(&small, 2 * S));
            let big = Grant {
                burst: floor * 10,
                ..small
            };
            assert!(s.takes_over(&big, 2 * S));
            // A zero grant, lapsed, refusing: rejoins at the bootstrap share and the floor.
            s.on_grant(&Grant { rate: 0, ..small }, 10 * S);
            assert!(s.rejoin(3, 14 * S));
            assert_eq!(
                s.enforcement(14 * S),
                Enforcement::Limit {
                    rate: 250_000,
                    burst: floor
                }
            );
        }
    }

    /// A grant's TTL is clamped: a zero grant with a one-day TTL closes the rule for at
    /// most `MAX_GRANT_TTL_LEASES` lease TTLs, not a day.
    #[test]
    fn a_grant_ttl_is_clamped_to_a_few_lease_ttls() {
        let p = ShareParams::default();
        let mut s = Share::bootstrap(10_000, FailMode::Open, p, 0);
        let day = Grant {
            rate: 0,
            burst: 1,
            tokens: 0,
            ttl: Duration::from_secs(86_400),
            saturated: true,
            credit: 0,
        };
        s.on_grant(&day, S);
        let max = ns(p.max_grant_ttl());
        assert_eq!(max, u64::from(MAX_GRANT_TTL_LEASES) * 3 * S);
        assert_eq!(s.deadlines().0, S + max);
        assert!(s.closed(S + max - 1));
        assert_eq!(s.state(S + max), ShareState::Sticky);
        assert!(
            s.rejoin(1, S + max),
            "refusals reopen it once the clamped lease lapsed"
        );
        // A TTL within the bound is kept as is.
        s.on_grant(&grant(250), 100 * S);
        assert_eq!(s.deadlines().0, 103 * S);
    }

    /// A restart resumes the lease its pinned entry holds (rate, burst, deadlines), moves
    /// to STICKY and FAIL_OPEN on those deadlines, and never trusts deadlines beyond what
    /// a grant could set.
    #[test]
    fn a_resumed_share_keeps_its_lease_and_deadlines() {
        let p = ShareParams::default();
        let held = HeldShare {
            rate: 3_000,
            burst: 300,
            lease_expires: 12 * S,
            fail_open_at: 312 * S,
        };
        let s = Share::resume(10_000, FailMode::Open, p, 1, held, 10 * S).unwrap();
        assert_eq!(s.state(10 * S), ShareState::Leased);
        assert_eq!(
            s.enforcement(10 * S),
            Enforcement::Limit {
                rate: 3_000,
                burst: 300
            }
        );
        assert_eq!(s.deadlines(), (12 * S, 312 * S));
        assert_eq!(s.state(12 * S), ShareState::Sticky);
        assert_eq!(s.state(312 * S), ShareState::FailOpen);
        // A renewal keeps the (pinned) bucket.
        assert!(!s.takes_over(&grant(3_000), 11 * S));
        // Deadlines past a grant's reach are pulled in; a static rule has none to fail open.
        let far = HeldShare {
            lease_expires: u64::MAX,
            fail_open_at: 0,
            ..held
        };
        let s = Share::resume(10_000, FailMode::Open, p, 1, far, 10 * S).unwrap();
        let max = ns(p.max_grant_ttl());
        assert_eq!(s.deadlines(), (10 * S + max, 10 * S + max + 300 * S));
        let s = Share::resume(10_000, FailMode::Static, p, 1518, far, 10 * S).unwrap();
        assert_eq!(s.deadlines().1, 0);
        // A closed share resumes closed; an entry without a lease is no share.
        let closed = HeldShare {
            rate: 0,
            burst: 0,
            ..held
        };
        let s = Share::resume(10_000, FailMode::Open, p, 1, closed, 10 * S).unwrap();
        assert!(s.closed(10 * S));
        let none = HeldShare {
            lease_expires: 0,
            ..held
        };
        assert!(Share::resume(10_000, FailMode::Open, p, 1, none, 10 * S).is_none());
    }

    #[test]
    fn bootstrap_never_rounds_to_zero() {
        assert_eq!(Share::bootstrap_rate(10, 500), 1);
        assert_eq!(Share::bootstrap_rate(10_000, 0), 10_000);
    }
}
