//! The design's numbers (docs/design.md, Fleet state machine), computed by the simulator at
//! 500 hosts with the sticky period shortened to 20 s (and Contoso/Directory only) so that
//! the runs fit in CI.

use limiter_sim::{
    bootstrap::joins_per_s_for,
    claims::{join_figures, outage_figures, outage_window, outages, rule_figures},
    fleet::simulate,
    metrics::Run,
    report,
    scenario::{self, Knobs, Scenario, CONTOSO},
    time::{MS, S},
};

#[expect(
    clippy::unwrap_used,
    reason = "test helper: a failed run fails the test"
)]
fn run(sc: &Scenario) -> Run {
    simulate(sc).unwrap()
}

#[expect(
    clippy::unwrap_used,
    reason = "test helper: every scenario has its events"
)]
fn event_at(sc: &Scenario, label: &str) -> u64 {
    sc.events
        .iter()
        .find(|e| e.label.as_deref().is_some_and(|l| l.contains(label)))
        .unwrap()
        .at
}

#[test]
fn outage_with_460_joiners() {
    let k = Knobs::quick();
    let sc = scenario::outage(&k);
    let r = run(&sc);
    let (down, up) = outages(&sc)[0];
    let joiners = event_at(&sc, "joiners");
    let contoso = r.rule("contoso").unwrap();
    let f = outage_figures(&r, contoso, down, Some(joiners), up);
    // Sticky shares alone sum to at most the quota.
    assert!(f.sticky_sum_pct <= 100.0, "{f:?}");
    assert!(f.sticky_sum_pct > 99.0, "{f:?}");
    // 460 joiners × 20/s on top: enforced shares at exactly quota + 9,200 (+92 %), and
    // admitted no more than that (Poisson arrivals at burst-1 buckets admit a little less).
    assert!((191.5..=192.5).contains(&f.joiner_enforced_pct), "{f:?}");
    assert!(f.joiner_peak_pct <= 92.0 + 1.0, "{f:?}");
    assert!(f.joiner_peak_pct >= 75.0, "{f:?}");
    // Time-boxed: STICKY lasts the sticky period, the joiners' BOOTSTRAP lease TTL + it.
    let sticky = k.params.sticky_max.as_secs_f64();
    let ttl = k.params.lease_ttl.as_secs_f64();
    assert!(
        (sticky - 0.2..=sticky + 0.2).contains(&f.sticky_secs),
        "{f:?}"
    );
    assert!(f.joiner_bootstrap_secs <= sticky + ttl + 0.2, "{f:?}");
    assert!(f.fail_open_after.unwrap() <= ttl + sticky + 1.1, "{f:?}");
    // Back: every host LEASED within the restarted allocator's learning TTL (plus a
    // report), then within the quota.
    assert!(f.released_after.unwrap() <= ttl + 1.5, "{f:?}");
    assert!(f.after_peak_pct <= 2.0, "{f:?}");
    assert!(f.after_granted_pct <= 100.0, "{f:?}");

    // Directory (static) never fails open; its 50 joiners add 50 × 4,000 = +10 %.
    let d = r.rule("directory").unwrap();
    let g = outage_figures(&r, d, down, Some(joiners), up);
    assert_eq!(g.fail_open_hosts, 0, "{g:?}");
    assert!(g.sticky_sum_pct <= 100.0, "{g:?}");
    assert!((9.0..=10.5).contains(&g.joiner_peak_pct), "{g:?}");
}

/// Hosts in FAIL_OPEN retry 200 ms after each failed report, so on the allocator's
/// return they stop passing everything within a few hundred milliseconds rather than
/// within a report interval.
#[test]
fn fail_open_hosts_find_the_returning_allocator_within_a_retry() {
    let k = Knobs::quick();
    let figures = |retry: bool| {
        let mut sc = scenario::outage(&k);
        sc.fail_open_retry = retry;
        let r = run(&sc);
        let (down, up) = outages(&sc)[0];
        let joiners = event_at(&sc, "joiners");
        outage_figures(&r, r.rule("contoso").unwrap(), down, Some(joiners), up)
    };
    let (with, without) = (figures(true), figures(false));
    assert!(with.fail_open_hosts > 400, "{with:?}");
    // All LEASED within the retry, its round trip and a metrics tick (0.1 s steps).
    assert!(with.released_after.unwrap() <= 0.5, "{with:?}");
    assert!(without.released_after.unwrap() >= 0.9, "{without:?}");
    // The second of the return: +469 % without, about a third of that with.
    assert!(
        with.return_peak_pct < without.return_peak_pct / 2.0,
        "{with:?} {without:?}"
    );
}

#[test]
fn closed_shares_that_see_demand_mid_outage_run_as_joiners() {
    let k = Knobs::quick();
    for moves in [false, true] {
        let sc = scenario::outage_idle(&k, true, moves);
        let r = run(&sc);
        let (down, up) = outages(&sc)[0];
        let at = event_at(&sc, "closed shares");
        let contoso = r.rule("contoso").unwrap();
        let f = outage_figures(&r, contoso, down, Some(at), up);
        // The idle hosts held zero grants (closed), which count nothing as STICKY.
        assert!(f.sticky_sum_pct <= 100.0, "{f:?}");
        // Each of the 460 adds quota ÷ 500 at most: ≤ +92 %, time-boxed (the rejoined
        // shares keep their fail-open deadline: no later than the others').
        assert!(f.joiner_peak_pct <= 92.0 + 1.0, "{f:?}");
        assert!((191.5..=192.5).contains(&f.joiner_enforced_pct), "{f:?}");
        let sticky = k.params.sticky_max.as_secs_f64();
        let ttl = k.params.lease_ttl.as_secs_f64();
        assert!(f.fail_open_after.unwrap() <= ttl + sticky + 1.1, "{f:?}");
        assert!(f.joiner_bootstrap_secs <= sticky + ttl + 0.2, "{f:?}");
        assert!(f.released_after.unwrap() <= ttl + 1.5, "{f:?}");
        assert!(f.after_granted_pct <= 100.0, "{f:?}");
        // Directory (static) never fails open; its 50 closed hosts add ≤ +10 %.
        let g = outage_figures(&r, r.rule("directory").unwrap(), down, Some(at), up);
        assert_eq!(g.fail_open_hosts, 0, "{g:?}");
        assert!((9.0..=10.5).contains(&g.joiner_peak_pct), "{g:?}");
        assert!(r.allocator.rejoins >= 460 + 50, "{:?}", r.allocator);

        // Pure STICKY, for comparison: the closed shares admit nothing until FAIL_OPEN,
        // and Directory's 50 for the whole outage.
        let pure = run(&scenario::outage_idle(&k, false, moves));
        let (w, o) = (outage_window(&r).unwrap(), outage_window(&pure).unwrap());
        assert_eq!(pure.allocator.rejoins, 0);
        assert!(
            o.directory.0 <= 100.5 && w.directory.0 >= 109.0,
            "{w:?} {o:?}"
        );
        if moves {
            // Contoso's traffic left the hosts holding the quota: pure STICKY admits
            // (almost) nothing, the rejoined hosts ~20/s each (burst 1 under Poisson).
            assert!(o.contoso.0 < 1.0, "{o:?}");
            assert!((80.0..=92.0).contains(&w.contoso.0), "{w:?}");
            assert!(w.contoso.2 < o.contoso.2, "{w:?} {o:?}");
        } else {
            assert!((99.0..=100.5).contains(&o.contoso.0), "{o:?}");
        }
    }
}

#[test]
fn joiners_with_the_allocator_up() {
    let k = Knobs::quick();
    let sc = scenario::join(&k);
    let r = run(&sc);
    let at = event_at(&sc, "join");
    let contoso = r.rule("contoso").unwrap();
    let j = join_figures(&r, contoso, at);
    assert_eq!(j.joiners, 460, "{j:?}");
    // A joiner admits at most its token plus one frame per bootstrap interval until its
    // grant (50 ms + a 1 ms step): 1 + ⌊20 × 0.051⌋ = 2 frames; in every second, at most
    // that times the joiners bootstrapping in it.
    assert_eq!(j.per_joiner_bound, 2);
    assert!(j.within_bound, "{j:?}");
    assert!(j.bootstrap_admitted >= 460, "one token each: {j:?}");
    assert!(j.bootstrap_admitted <= 2 * 460, "{j:?}");
    // They leave BOOTSTRAP with their first grant, within the first 100 ms tick.
    assert!(j.bootstrap_secs <= 0.1 + 1e-9, "{j:?}");
    // Their first grants are 0 (the old leases hold the quota): closed, so the grants in
    // force never exceed the quota.
    assert!(j.granted_peak_pct <= 100.0 + 1e-9, "{j:?}");
    // Nothing but bootstrap comes on top of the quota.
    assert!(j.peak_pct <= j.bootstrap_peak_s_pct, "{j:?}");
    // The design's ~0.9 % cannot hold for 460 at once: their tokens alone are 4.6 %.
    assert!(j.bootstrap_peak_s_pct > 0.9, "{j:?}");
}

#[test]
fn rolling_joins_keep_the_designs_bootstrap_figure() {
    let k = Knobs::quick();
    let q = 10_000;
    let per_s = joins_per_s_for(0.9, q, k.params.fleet_size, 50 * MS);
    assert_eq!(
        per_s, 45,
        "0.9 % of 10,000 = 90 frames = 45 joiners × 2 frames"
    );
    let sc = scenario::join_rolling(&k, per_s);
    let r = run(&sc);
    let at = event_at(&sc, "joins begin");
    let contoso = r.rule("contoso").unwrap();
    assert_eq!(contoso.quota, q);
    let j = join_figures(&r, contoso, at);
    assert_eq!(j.joiners, 460, "{j:?}");
    assert!(j.joins_peak_s <= per_s + 1, "{j:?}");
    assert!(j.within_bound, "{j:?}");
    assert!(j.bootstrap_peak_s_pct <= 0.9, "{j:?}");
    assert!(j.peak_pct <= 0.9, "{j:?}");
    assert!(j.granted_peak_pct <= 100.0 + 1e-9, "{j:?}");
}

#[test]
fn a_restarted_allocator_does_not_over_grant() {
    let k = Knobs::quick();
    let sc = scenario::restart(&k);
    let r = run(&sc);
    let (down, up) = outages(&sc)[0];
    let f = outage_figures(&r, r.rule("contoso").unwrap(), down, None, up);
    // Shares in force never exceed the quota after the restart (the 50 joiners' first
    // grants are 0: closed).
    assert!(f.after_granted_pct <= 100.0 + 1e-9, "{f:?}");
    assert!(f.released_after.unwrap() <= 2.0, "{f:?}");
}

#[test]
fn with_a_burst_of_a_second_admitted_tracks_the_quota() {
    let k = Knobs::quick();
    let mut sc = scenario::with_contoso_burst(scenario::steady(&k), 10_000, 60 * S);
    sc.tenants.truncate(CONTOSO + 1);
    let r = run(&sc);
    let f = rule_figures(&r, r.rule("contoso").unwrap());
    let pct = f.saturated_admitted_pct.unwrap();
    // The fleet admits its quota within 2 % (the credit moves what hosts leave unused).
    assert!((98.0..=102.0).contains(&pct), "{f:?}");
    // The credit level integrates the noise of one-second counts, so single seconds run
    // a little over (README, Accuracy vs burst: up to +3.9 % at 10-100 tokens a host);
    // a second far over would be a credit granted twice.
    assert!(f.overshoot_up.max_pct <= 5.0, "{f:?}");
}

#[test]
fn admitted_grows_with_the_per_host_burst_and_the_credit_closes_the_gap() {
    // Poisson arrivals at ≈ 24/s per host: without the credit, 2 tokens per host lose far
    // more than 20; with it (the default cap), 2 tokens admit the quota.
    let k = Knobs::quick();
    let pct = |burst: u64, credit: bool| -> f64 {
        let mut sc = scenario::with_contoso_burst(scenario::steady(&k), burst, 60 * S);
        sc.tenants.truncate(CONTOSO + 1);
        if !credit {
            sc.credit = scenario::CreditMode::Off;
        }
        let r = run(&sc);
        rule_figures(&r, r.rule("contoso").unwrap())
            .saturated_admitted_pct
            .unwrap()
    };
    let (small, large) = (pct(1_000, false), pct(10_000, false));
    assert!(small < 90.0, "{small}");
    assert!(large > small + 10.0, "{small} {large}");
    let credited = pct(1_000, true);
    assert!((98.0..=102.0).contains(&credited), "{credited}");
}

#[test]
fn the_report_is_written() {
    let k = Knobs::quick();
    let mut sc = scenario::outage(&k);
    sc.tenants.truncate(CONTOSO + 1);
    sc.events.retain(|e| match &e.action {
        scenario::Action::Demand { tenant, .. } => *tenant == CONTOSO,
        _ => true,
    });
    let runs = vec![run(&sc)];
    let dir = std::env::temp_dir().join(format!("limiter-sim-test-{}", std::process::id()));
    report::write(&dir, &runs, std::time::Duration::from_secs(1), "test").unwrap();
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(md.contains("| scenario |"));
    assert!(md.contains("460 joiners × 20"));
    assert!(md.contains("![") && dir.join("outage-contoso.svg").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}
