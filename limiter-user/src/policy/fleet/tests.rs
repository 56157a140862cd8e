#![allow(clippy::unwrap_used, clippy::expect_used)]

use limiter_common::gcra::Limit;
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
    let totals = |dropped: u64| refusing("contoso", dropped);
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
        let totals = |dropped: u64| refusing("contoso", dropped);
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
        let refused = |n: u64| refusing("r", n);
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

/// `rule`'s counter totals when all `n` frames it was offered were refused (no credit).
fn refusing(rule: &str, n: u64) -> BTreeMap<String, RuleTotals> {
    BTreeMap::from([(
        rule.to_string(),
        RuleTotals {
            offered: n,
            refused: n,
            credit_left: None,
        },
    )])
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
    let held = |fleet: &mut FleetState, t| fleet.report_to(1, &BTreeMap::new(), t).rules[0].held;
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
