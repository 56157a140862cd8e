//! The figures each scenario is run for, and the design's claims (docs/design.md: the
//! share states and their numbers under Fleet state machine, the allocator's guarantees
//! under What the allocator guarantees) checked against them.

use limiter_fleet::share::ShareState;

use crate::{
    bootstrap::{bootstrap_frames_per_joiner, grant_latency, joins_per_s_for, BOOTSTRAP_CLAIM_PCT},
    metrics::{
        convergence, drops, max_share_sum, overshoot, pct_over, settling, state_index, state_span,
        Drops, Overshoot, RuleSeries, Run, Tick,
    },
    scenario::{Action, Scenario},
    time::{MS, NS_PER_S},
};

/// Tolerance for "within the quota": the fleet tests on real daemons use 2 %.
pub const TOLERANCE_PCT: f64 = 2.0;
/// A shift has converged when admitted stays on target this many seconds.
pub const HOLD_SECS: usize = 3;

fn secs(ns: u64) -> usize {
    (ns / NS_PER_S) as usize
}

fn ticks_per_s(run: &Run) -> usize {
    (NS_PER_S / run.tick_ns) as usize
}

/// (down, up) times of the allocator in a scenario.
pub fn outages(sc: &Scenario) -> Vec<(u64, u64)> {
    let mut v = Vec::new();
    let mut down = None;
    for e in &sc.events {
        match e.action {
            Action::AllocatorDown => down = Some(e.at),
            Action::AllocatorUp { .. } => {
                if let Some(d) = down.take() {
                    v.push((d, e.at));
                }
            }
            Action::Demand { .. } => {}
        }
    }
    if let Some(d) = down {
        v.push((d, sc.duration));
    }
    v
}

/// Seconds affected by an outage: from the allocator going down until a lease TTL and
/// two report intervals after it is back.
pub fn outage_seconds(sc: &Scenario) -> Vec<bool> {
    let n = secs(sc.duration) + 1;
    let settle =
        sc.params.lease_ttl.as_nanos() as u64 + 2 * sc.params.report_interval.as_nanos() as u64;
    let mut v = vec![false; n];
    for (d, u) in outages(sc) {
        let (a, b) = (secs(d).min(n), secs(u + settle).min(n));
        v[a..b].iter_mut().for_each(|x| *x = true);
    }
    v
}

/// The general figures of one rule in one run.
#[derive(Clone, Debug)]
pub struct RuleFigures {
    pub rule: String,
    pub quota: u64,
    /// Over the seconds with the allocator up (after the warm-up).
    pub overshoot_up: Overshoot,
    /// Over the outage seconds, if any.
    pub overshoot_outage: Option<Overshoot>,
    pub drops_up: Drops,
    /// Mean admitted ÷ quota over seconds with offered ≥ 105 % of the quota, allocator up.
    pub saturated_admitted_pct: Option<f64>,
    /// Largest sum of enforced shares ÷ quota, allocator up (tracked rules), percent.
    pub enforced_peak_pct: Option<f64>,
}

pub fn rule_figures(run: &Run, r: &RuleSeries) -> RuleFigures {
    let out = outage_seconds(&run.scenario);
    let measured = run.measured();
    let up: Vec<usize> = measured
        .clone()
        .filter(|&i| !out.get(i).copied().unwrap_or(false))
        .collect();
    let down: Vec<usize> = measured
        .filter(|&i| out.get(i).copied().unwrap_or(false))
        .collect();
    let over = |idx: &[usize]| -> Overshoot {
        let sel: Vec<_> = idx
            .iter()
            .filter_map(|&i| r.seconds.get(i).copied())
            .collect();
        overshoot(&sel, r.quota, 0..sel.len(), TOLERANCE_PCT)
    };
    let mut drops_up = Drops::default();
    for &i in &up {
        drops_up.add(drops(&r.seconds, r.quota, i..i + 1));
    }
    let sat: Vec<f64> = up
        .iter()
        .filter_map(|&i| r.seconds.get(i))
        .filter(|c| c.offered as f64 >= r.quota as f64 * 1.05)
        .map(|c| c.admitted as f64 / r.quota as f64 * 100.0)
        .collect();
    let tps = ticks_per_s(run);
    let enforced_peak_pct = r.tracked.then(|| {
        up.iter()
            .flat_map(|&i| r.ticks.get(i * tps..(i + 1) * tps).unwrap_or_default())
            .map(|t| t.enforced() as f64 / r.quota as f64 * 100.0)
            .fold(0.0, f64::max)
    });
    RuleFigures {
        rule: r.name.clone(),
        quota: r.quota,
        overshoot_up: over(&up),
        overshoot_outage: (!down.is_empty()).then(|| over(&down)),
        drops_up,
        saturated_admitted_pct: (!sat.is_empty())
            .then(|| sat.iter().sum::<f64>() / sat.len() as f64),
        enforced_peak_pct,
    }
}

/// After each shift of the scenario: report intervals until the shares settle (the
/// misplaced fraction of the quota within 2 points of where it settles, for 3 s), and
/// until admitted is on target (within 2 % of `min(quota, offered)` for 3 s).
pub fn convergence_intervals(run: &Run, r: &RuleSeries) -> Vec<(u64, Option<f64>, Option<f64>)> {
    let interval = run.scenario.params.report_interval.as_secs_f64();
    let shifts = &run.scenario.shifts;
    shifts
        .iter()
        .enumerate()
        .map(|(i, &at)| {
            let end = shifts.get(i + 1).copied().unwrap_or(run.scenario.duration);
            let (from, to) = (secs(at), secs(end));
            let settled = to.saturating_sub(30).max(from + 10)..to;
            let shares = settling(
                &r.misplaced,
                from,
                settled,
                HOLD_SECS,
                TOLERANCE_PCT / 100.0,
            );
            let admitted = convergence(&r.seconds, r.quota, from, HOLD_SECS, TOLERANCE_PCT);
            (
                at,
                shares.map(|s| s as f64 / interval),
                admitted.map(|s| s as f64 / interval),
            )
        })
        .collect()
}

/// Hosts joining a saturated rule from `at` (at once, or one after another) with the
/// allocator up.
#[derive(Clone, Copy, Debug, Default)]
pub struct JoinFigures {
    pub joiners: u32,
    /// Most shares started in any one second.
    pub joins_peak_s: u32,
    /// Frames admitted by hosts before their first grant, in all.
    pub bootstrap_admitted: u64,
    /// The same as a percentage of one second of the quota.
    pub bootstrap_pct: f64,
    /// The bound per joiner, `1 + ⌊r_b × L⌋` frames.
    pub per_joiner_bound: u64,
    /// `joiners × per_joiner_bound ÷ quota`, percent.
    pub bound_pct: f64,
    /// Largest bootstrap-admitted count in one second, percent of the quota.
    pub bootstrap_peak_s_pct: f64,
    /// Largest per-second bound (joiners that were in BOOTSTRAP during the second ×
    /// the bound per joiner), percent of the quota.
    pub bound_peak_s_pct: f64,
    /// Every second's bootstrap-admitted count is within that second's bound.
    pub within_bound: bool,
    /// Largest 1 s overshoot of the whole rule (admitted over quota) in the window.
    pub peak_pct: f64,
    pub secs_over: usize,
    /// Largest sum of enforced shares ÷ quota in the window, percent.
    pub enforced_peak_pct: f64,
    /// Largest sum of LEASED and STICKY shares (grants in force, a zero grant closed:
    /// 0) ÷ quota in the window, percent.
    pub granted_peak_pct: f64,
    /// Largest admitted over a 100 ms tick, as a rate, over the quota, percent.
    pub tick_peak_pct: f64,
    /// From the first join until no host is in BOOTSTRAP, s (to the end of the first
    /// tick with none).
    pub bootstrap_secs: f64,
}

/// The last demand change (the last joiner).
pub fn last_change(sc: &Scenario) -> Option<u64> {
    sc.events
        .iter()
        .filter(|e| e.at > 0 && matches!(e.action, Action::Demand { .. }))
        .map(|e| e.at)
        .max()
}

pub fn join_figures(run: &Run, r: &RuleSeries, at: u64) -> JoinFigures {
    let sc = &run.scenario;
    let tps = ticks_per_s(run);
    let from = secs(at);
    let to = secs(last_change(sc).unwrap_or(at).max(at)) + 10;
    let ticks = r.ticks.get(from * tps..to * tps).unwrap_or_default();
    let bootstrap_admitted: u64 = ticks.iter().map(|t| t.bootstrap_admitted).sum();
    let o = overshoot(&r.seconds, r.quota, from..to, TOLERANCE_PCT);
    let b = state_index(ShareState::Bootstrap);
    let bootstrap_ticks = ticks
        .iter()
        .position(|t| t.hosts[b] == 0)
        .unwrap_or(ticks.len());
    let per = bootstrap_frames_per_joiner(r.quota, sc.params.fleet_size, sc.rtt);
    let latency_ticks = grant_latency(sc.rtt).div_ceil(run.tick_ns) as usize;
    let pct = |v: u64| v as f64 / r.quota as f64 * 100.0;
    let mut within_bound = true;
    let (mut boot_peak, mut bound_peak, mut joins_peak) = (0u64, 0u64, 0u32);
    for s in from..to {
        let count = |f: fn(&Tick) -> u64, a: usize, b: usize| -> u64 {
            r.ticks.get(a..b).unwrap_or_default().iter().map(f).sum()
        };
        let boot = count(|t| t.bootstrap_admitted, s * tps, (s + 1) * tps);
        // Shares that started in this second or within a grant latency before it.
        let joined = count(
            |t| u64::from(t.joins),
            (s * tps).saturating_sub(latency_ticks),
            (s + 1) * tps,
        );
        let bound = joined * per;
        within_bound &= boot <= bound;
        boot_peak = boot_peak.max(boot);
        bound_peak = bound_peak.max(bound);
        joins_peak = joins_peak.max(
            r.ticks
                .get(s * tps..(s + 1) * tps)
                .unwrap_or_default()
                .iter()
                .map(|t| t.joins)
                .sum(),
        );
    }
    let joiners: u32 = ticks.iter().map(|t| t.joins).sum();
    let (l, st) = (
        state_index(ShareState::Leased),
        state_index(ShareState::Sticky),
    );
    JoinFigures {
        // States are sampled at the end of each tick: the joiners left BOOTSTRAP during the
        // first tick that ends with none (an upper bound).
        bootstrap_secs: (bootstrap_ticks + usize::from(bootstrap_ticks < ticks.len())) as f64
            * run.tick_ns as f64
            / NS_PER_S as f64,
        joiners,
        joins_peak_s: joins_peak,
        bootstrap_admitted,
        bootstrap_pct: pct(bootstrap_admitted),
        per_joiner_bound: per,
        bound_pct: pct(u64::from(joiners) * per),
        bootstrap_peak_s_pct: pct(boot_peak),
        bound_peak_s_pct: pct(bound_peak),
        within_bound,
        peak_pct: o.max_pct,
        secs_over: o.secs_over,
        enforced_peak_pct: ticks.iter().map(|t| pct(t.enforced())).fold(0.0, f64::max),
        granted_peak_pct: ticks
            .iter()
            .map(|t| pct(t.shares[l] + t.shares[st]))
            .fold(0.0, f64::max),
        tick_peak_pct: ticks
            .iter()
            .map(|t| pct_over((t.admitted * tps as u64) as f64, r.quota))
            .fold(f64::NEG_INFINITY, f64::max),
    }
}

/// An allocator outage from `down` to `up`, with joiners at `joiners`.
#[derive(Clone, Copy, Debug, Default)]
pub struct OutageFigures {
    /// Largest sum of STICKY shares during the outage ÷ quota, percent.
    pub sticky_sum_pct: f64,
    /// How long hosts stayed STICKY (first to last tick with a STICKY host), s.
    pub sticky_secs: f64,
    /// From the outage start to the first FAIL_OPEN host, s (None: none failed open).
    pub fail_open_after: Option<f64>,
    /// Largest 1 s overshoot between the joiners' arrival and the first FAIL_OPEN (or the
    /// end of the outage), percent; and the excess over the quota in frames per second.
    pub joiner_peak_pct: f64,
    pub joiner_excess: u64,
    /// Largest sum of enforced shares in that window ÷ quota, percent.
    pub joiner_enforced_pct: f64,
    /// How long the joiners stayed in BOOTSTRAP (until FAIL_OPEN or a grant), s.
    pub joiner_bootstrap_secs: f64,
    /// Most hosts in FAIL_OPEN at once during the outage.
    pub fail_open_hosts: u32,
    /// From the allocator's return until every host is LEASED, s.
    pub released_after: Option<f64>,
    /// Largest 1 s overshoot once every host is LEASED again, percent.
    pub after_peak_pct: f64,
    /// Largest 1 s overshoot between the return and every host being LEASED, percent.
    pub return_peak_pct: f64,
    /// Largest enforced-share sum after the return ÷ quota, percent.
    pub after_enforced_pct: f64,
    /// Largest sum of granted shares in force (LEASED + STICKY) after the return ÷ quota,
    /// percent: over 100 % is an over-grant.
    pub after_granted_pct: f64,
}

pub fn outage_figures(
    run: &Run,
    r: &RuleSeries,
    down: u64,
    joiners: Option<u64>,
    up: u64,
) -> OutageFigures {
    let tps = ticks_per_s(run);
    let t = |ns: u64| (ns / run.tick_ns) as usize;
    let (d, u) = (t(down), t(up));
    let tick_s = run.tick_ns as f64 / NS_PER_S as f64;
    let fo = state_index(ShareState::FailOpen);
    let first_fail_open = r
        .ticks
        .get(d..u)
        .unwrap_or_default()
        .iter()
        .position(|x| x.hosts[fo] > 0)
        .map(|i| d + i);
    let sticky = state_span(&r.ticks, ShareState::Sticky, d..u);
    let mut f = OutageFigures {
        sticky_sum_pct: max_share_sum(&r.ticks, ShareState::Sticky, d..u) as f64 / r.quota as f64
            * 100.0,
        // The first host to lapse is the first to fail open: its STICKY period.
        sticky_secs: match (sticky, first_fail_open) {
            (Some((a, _)), Some(b)) => (b - a) as f64 * tick_s,
            (Some((a, b)), None) => (b + 1 - a) as f64 * tick_s,
            _ => 0.0,
        },
        fail_open_after: first_fail_open.map(|i| (i - d) as f64 * tick_s),
        fail_open_hosts: r
            .ticks
            .get(d..u)
            .unwrap_or_default()
            .iter()
            .map(|x| x.hosts[fo])
            .max()
            .unwrap_or(0),
        ..OutageFigures::default()
    };
    if let Some(j) = joiners {
        let end = first_fail_open.filter(|&i| i > t(j)).unwrap_or(u);
        // Whole seconds strictly inside [joiners, end).
        let (s0, s1) = (secs(j), end / tps);
        let o = overshoot(&r.seconds, r.quota, s0..s1, TOLERANCE_PCT);
        f.joiner_peak_pct = o.max_pct;
        f.joiner_excess = r
            .seconds
            .get(s0..s1)
            .unwrap_or_default()
            .iter()
            .map(|c| c.admitted.saturating_sub(r.quota))
            .max()
            .unwrap_or(0);
        f.joiner_enforced_pct = r
            .ticks
            .get(t(j)..end)
            .unwrap_or_default()
            .iter()
            .map(|x| x.enforced() as f64 / r.quota as f64 * 100.0)
            .fold(0.0, f64::max);
        let b = state_index(ShareState::Bootstrap);
        let boot_end = r
            .ticks
            .iter()
            .enumerate()
            .skip(t(j) + 1)
            .find(|(_, x)| x.hosts[b] == 0)
            .map_or(r.ticks.len(), |(i, _)| i);
        f.joiner_bootstrap_secs = (boot_end - t(j)) as f64 * tick_s;
    }
    let leased = state_index(ShareState::Leased);
    let all_leased = r
        .ticks
        .iter()
        .enumerate()
        .skip(u)
        .find(|(_, x)| x.hosts[leased] > 0 && x.hosts[leased] == x.hosts.iter().sum::<u32>())
        .map(|(i, _)| i);
    if let Some(i) = all_leased {
        f.released_after = Some((i + 1 - u) as f64 * tick_s);
        let from = i.div_ceil(tps) + 1;
        f.return_peak_pct = overshoot(&r.seconds, r.quota, secs(up)..from, TOLERANCE_PCT).max_pct;
        f.after_peak_pct =
            overshoot(&r.seconds, r.quota, from..r.seconds.len(), TOLERANCE_PCT).max_pct;
    }
    let after = r.ticks.get(u..).unwrap_or_default();
    let pct = |v: u64| v as f64 / r.quota as f64 * 100.0;
    f.after_enforced_pct = after.iter().map(|x| pct(x.enforced())).fold(0.0, f64::max);
    let (l, s) = (
        state_index(ShareState::Leased),
        state_index(ShareState::Sticky),
    );
    f.after_granted_pct = after
        .iter()
        .map(|x| pct(x.shares[l] + x.shares[s]))
        .fold(0.0, f64::max);
    f
}

const WHY_BOOTSTRAP: &str = "The share states' own rules bound what bootstrap adds: each joiner \
admits its one token plus one frame per bootstrap interval until its grant arrives, \
`1 + ⌊r_b × L⌋` frames (r_b = quota ÷ fleet_size, L = the grant latency), and a first grant \
of 0 (the old leases hold the quota) takes over without a token. So J joiners within a \
second add at most `J × (1 + ⌊r_b × L⌋) ÷ quota` of a second of quota: joiners arriving \
together exceed ~0.9 % as soon as J × (1 + ⌊r_b × L⌋) > 0.9 % of the quota, whatever the \
allocator does (their single tokens alone are J ÷ quota). The ~0.9 % holds for joins spread \
over time (rolling joins, as a key reaches new LBs) at up to the rate shown.";

const WHY_REJOIN: &str = "A zero grant is a closed limit (nothing passes). When its lease lapses \
the host holds no part of the quota, exactly like a host that has not seen the rule, and the \
design budgets such hosts: each may add quota ÷ fleet_size while the allocator is away \
(time-boxed for open rules, until recovery for STATIC ones). So a lapsed closed share that \
refuses frames rejoins as a joiner (BOOTSTRAP at quota ÷ fleet_size, burst 1, one token, its \
fail-open deadline unchanged). Sticky shares still sum to at most the quota (closed ones count \
0), and the hosts that add quota ÷ fleet_size are at most the hosts holding no share, which is \
what the +92 % worst case counts. Pure STICKY would refuse all of the rule's traffic on those \
hosts until FAIL_OPEN, and for the whole outage on a STATIC rule: a limiter outage turned into \
an outage of the service.";

const WHY_PARTITION: &str = "An allocator that expired every host while cut off would hand the \
first reporters their full targets while the other hosts still enforce STICKY shares it no \
longer counts; it learns again (renews what hosts hold) after a lease TTL without any \
report, as a restarted one does.";

const WHY_ZERO_SHARE: &str = "A host with no room gets a grant of rate 0, enforced as a closed \
limit (nothing passes; none of the quota), so it stays LEASED; without a grant its lease would \
lapse with the allocator up, keep its old share as STICKY (uncounted by the allocator) and then \
fail open. A zero grant to a host without demand says saturated: false, so its first refusals \
send a report at once; it gets a real share as soon as the hosts holding the quota have \
renewed (their next reports).";

const WHY_ACCURACY: &str = "Each host's bucket gets burst × share ÷ quota tokens. At ≈ 20 \
frames/s per host Poisson arrivals overflow a bucket of a few tokens (a host whose share \
equals its mean demand refuses a fraction of the order of 1 ÷ (tokens + 1)), while quota \
left unused on other hosts cannot be borrowed: shares are hard per-host limits whose sum is \
the quota. Re-splitting the same global burst or adding headroom for hosts below the water \
level does not recover it when demand exceeds the quota (there is no spare quota, and a unit \
moved to a host below the level is used less than on a host above it); only more tokens per \
host do — see the burst sweep. What remains at large bursts is the noise of one-second \
demand measurements at ≈ 20 frames (shares follow the measured, not the true, demand). Size \
a fleet rule's global burst at the number of hosts × the tokens the sweep shows.";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Holds,
    Fails,
}

#[derive(Clone, Debug)]
pub struct Claim {
    pub source: &'static str,
    pub claim: String,
    pub scenario: String,
    pub expected: String,
    pub simulated: String,
    pub verdict: Verdict,
    /// The mechanism behind a failure (shown only when the claim fails).
    pub why: &'static str,
}

fn verdict(ok: bool) -> Verdict {
    if ok {
        Verdict::Holds
    } else {
        Verdict::Fails
    }
}

fn find<'a>(runs: &'a [Run], name: &str) -> Option<(&'a Run, &'a RuleSeries)> {
    let run = runs.iter().find(|r| r.scenario.name == name)?;
    Some((run, run.rule("contoso")?))
}

/// The first demand change after time 0 (the joiners, the shift).
pub fn first_change(sc: &Scenario) -> Option<u64> {
    sc.events
        .iter()
        .find(|e| e.at > 0 && matches!(e.action, Action::Demand { .. }))
        .map(|e| e.at)
}

/// Every claim the runs at hand can check.
pub fn claims(runs: &[Run]) -> Vec<Claim> {
    let mut v = Vec::new();
    for run in runs.iter().filter(|r| r.scenario.name.starts_with("join-")) {
        let (Some(r), Some(at)) = (run.rule("contoso"), first_change(&run.scenario)) else {
            continue;
        };
        let sc = &run.scenario;
        let j = join_figures(run, r, at);
        let rtt_ms = sc.rtt / 1_000_000;
        let rolling = sc.name.starts_with("join-rolling");
        let how = if rolling {
            format!(
                "{} joiners, at most {} in a second",
                j.joiners, j.joins_peak_s
            )
        } else {
            format!("{} joiners at once", j.joiners)
        };
        v.push(Claim {
            source: "design: BOOTSTRAP (derived)",
            claim: format!(
                "Bootstrap adds at most joiners × (1 + ⌊r_b × L⌋) frames ({how}, grant \
                 latency L = {rtt_ms} ms + 1 ms step)"
            ),
            scenario: sc.name.clone(),
            expected: format!(
                "≤ {} frames per joiner; per second ≤ {:.2} % of quota",
                j.per_joiner_bound, j.bound_peak_s_pct
            ),
            simulated: format!(
                "{} frames in BOOTSTRAP ({:.2} per joiner); most in one second {:.2} % of \
                 quota; 1 s peak of the rule {:+.1} %; grants in force ≤ {:.1} % of quota",
                j.bootstrap_admitted,
                j.bootstrap_admitted as f64 / f64::from(j.joiners.max(1)),
                j.bootstrap_peak_s_pct,
                j.peak_pct,
                j.granted_peak_pct
            ),
            verdict: verdict(j.within_bound),
            why: "",
        });
        let per_s = joins_per_s_for(BOOTSTRAP_CLAIM_PCT, r.quota, sc.params.fleet_size, sc.rtt);
        if sc.rtt == 50 * MS && (!rolling || j.joins_peak_s <= per_s + 1) {
            // What bootstrap adds in any second, and what the whole rule admitted over the
            // quota in any second.
            let ok =
                j.bootstrap_peak_s_pct <= BOOTSTRAP_CLAIM_PCT && j.peak_pct <= BOOTSTRAP_CLAIM_PCT;
            v.push(Claim {
                source: "design: BOOTSTRAP",
                claim: if rolling {
                    format!(
                        "With a grant inside 50 ms, bootstrap adds at most ~0.9 % overshoot — \
                         for joins at ≤ {per_s}/s (rolling)"
                    )
                } else {
                    "With a grant inside 50 ms, bootstrap adds at most ~0.9 % overshoot — \
                     460 joiners at once"
                        .into()
                },
                scenario: sc.name.clone(),
                expected: format!(
                    "≤ ~{BOOTSTRAP_CLAIM_PCT} % of a second of quota (the bound: {:.2} %)",
                    j.bound_peak_s_pct
                ),
                simulated: format!(
                    "bootstrap admitted at most {:.2} % of quota in a second; 1 s peak of the \
                     rule {:+.2} %",
                    j.bootstrap_peak_s_pct, j.peak_pct
                ),
                verdict: verdict(ok),
                why: WHY_BOOTSTRAP,
            });
        }
    }
    for (run, r) in ["outage", "outage-idle", "outage-move", "outage+noretry"]
        .into_iter()
        .filter_map(|n| find(runs, n))
    {
        let sc = &run.scenario;
        let (down, up) = outages(sc).first().copied().unwrap_or((0, sc.duration));
        let joiners = first_change(sc);
        let f = outage_figures(run, r, down, joiners, up);
        let sticky_max = sc.params.sticky_max.as_secs_f64();
        let ttl = sc.params.lease_ttl.as_secs_f64();
        v.push(Claim {
            source: "design: STICKY",
            claim: "Sticky shares alone sum to at most the quota".into(),
            scenario: sc.name.clone(),
            expected: "≤ 100 %".into(),
            simulated: format!("max Σ STICKY shares = {:.1} % of quota", f.sticky_sum_pct),
            verdict: verdict(f.sticky_sum_pct <= 100.0),
            why: "",
        });
        let bound = 460.0 * 20.0 / r.quota as f64 * 100.0;
        v.push(Claim {
            source: "design: STICKY",
            claim: "Outage worst case: 460 joiners × 20 = 9,200/s, +92 %".into(),
            scenario: sc.name.clone(),
            expected: format!("≤ +{bound:.0} % (9,200/s over)"),
            simulated: format!(
                "admitted {:+.1} % ({}/s over); enforced shares {:.0} % of quota",
                f.joiner_peak_pct, f.joiner_excess, f.joiner_enforced_pct
            ),
            verdict: verdict(f.joiner_peak_pct <= bound + 1.0),
            why: "",
        });
        v.push(Claim {
            source: "design: STICKY/FAIL_OPEN",
            claim: "… for ≤ 5 min, then FAIL_OPEN (open rules)".into(),
            scenario: sc.name.clone(),
            expected: format!("STICKY ≤ {sticky_max:.0} s; joiners' BOOTSTRAP ≤ {:.0} s", sticky_max + ttl),
            simulated: format!(
                "STICKY {:.1} s; first FAIL_OPEN {:.1} s after the outage began; joiners in BOOTSTRAP {:.1} s",
                f.sticky_secs,
                f.fail_open_after.unwrap_or(f64::NAN),
                f.joiner_bootstrap_secs
            ),
            verdict: verdict(
                f.sticky_secs <= sticky_max + 0.2 && f.joiner_bootstrap_secs <= sticky_max + ttl + 0.2,
            ),
            why: "",
        });
        if let Some(d) = run.rule("directory") {
            let g = outage_figures(run, d, down, joiners, up);
            let bound = 100.0 * 50.0 / f64::from(sc.params.fleet_size);
            v.push(Claim {
                source: "design: FAIL_OPEN",
                claim: "STATIC caps (Directory) keep their last shares for the whole outage".into(),
                scenario: sc.name.clone(),
                expected: format!("0 hosts FAIL_OPEN; ≤ +{bound:.0} % (50 joiners × 4,000/s)"),
                simulated: format!(
                    "{} hosts FAIL_OPEN; Σ STICKY ≤ {:.1} % of quota; admitted {:+.1} % with joiners",
                    g.fail_open_hosts, g.sticky_sum_pct, g.joiner_peak_pct
                ),
                verdict: verdict(g.fail_open_hosts == 0 && g.sticky_sum_pct <= 100.0 && g.joiner_peak_pct <= bound + 1.0),
                why: "",
            });
        }
        v.push(Claim {
            source: "allocator",
            claim: "Allocator back → LEASED again without a burst over quota (restarted allocator)"
                .into(),
            scenario: sc.name.clone(),
            expected: format!("LEASED within a lease TTL + interval; then ≤ +{TOLERANCE_PCT:.0} %"),
            simulated: format!(
                "all LEASED {:.1} s after the return (meanwhile {:+.0} %, {}); then {:+.1} %",
                f.released_after.unwrap_or(f64::NAN),
                f.return_peak_pct,
                if !sc.learning_joiners {
                    "hosts that never had a grant get none while the new allocator learns, \
                     and stay FAIL_OPEN"
                } else if sc.fail_open_retry {
                    "in the second of the return: a host in FAIL_OPEN passes everything until \
                     a report reaches the allocator (it retries 200 ms after each failure; the \
                     grant comes a round trip later), then runs at a joiner's share while it learns"
                } else {
                    "in the second of the return: a host in FAIL_OPEN passes everything until \
                     its next report, up to an interval later, reaches the allocator, then \
                     runs at a joiner's share while it learns"
                },
                f.after_peak_pct
            ),
            verdict: verdict(
                f.released_after.is_some_and(|s| s <= ttl + 1.5)
                    && f.after_peak_pct <= TOLERANCE_PCT,
            ),
            why: "",
        });
    }
    for (with, without) in [
        ("outage-idle", "outage-idle-sticky"),
        ("outage-move", "outage-move-sticky"),
    ] {
        let (Some(a), Some(b)) = (
            runs.iter().find(|r| r.scenario.name == with),
            runs.iter().find(|r| r.scenario.name == without),
        ) else {
            continue;
        };
        let (Some(w), Some(o)) = (outage_window(a), outage_window(b)) else {
            continue;
        };
        let bound = 460.0 * 20.0 / 10_000.0 * 100.0;
        v.push(Claim {
            source: "design: closed shares",
            claim: "A closed share that sees demand mid-outage adds at most what a joiner adds \
                    (quota ÷ fleet_size), instead of refusing everything until FAIL_OPEN \
                    (STATIC: until recovery)"
                .into(),
            scenario: format!("{with} vs {without}"),
            expected: format!(
                "Contoso ≤ +{bound:.0} % over the quota; fewer false drops than pure STICKY"
            ),
            simulated: format!(
                "Contoso admitted {:.1} % of quota (peak {:+.1} %), false drops {:.1} % of \
                 offered, vs {:.1} % ({:+.1} %), {:.1} %; Directory {:.1} % of quota, false \
                 drops {:.1} %, vs {:.1} %, {:.1} %",
                w.contoso.0,
                w.contoso.1,
                w.contoso.2,
                o.contoso.0,
                o.contoso.1,
                o.contoso.2,
                w.directory.0,
                w.directory.2,
                o.directory.0,
                o.directory.2
            ),
            verdict: verdict(
                w.contoso.1 <= bound + 1.0
                    && w.contoso.2 <= o.contoso.2
                    && w.directory.2 <= o.directory.2,
            ),
            why: WHY_REJOIN,
        });
    }
    for (name, what) in [("partition", "partitioned"), ("restart", "restarted")] {
        if let Some((run, r)) = find(runs, name) {
            let sc = &run.scenario;
            let (down, up) = outages(sc).first().copied().unwrap_or((0, sc.duration));
            let f = outage_figures(run, r, down, None, up);
            v.push(Claim {
                source: if name == "restart" {
                    "allocator: restart"
                } else {
                    "allocator: partition"
                },
                claim: format!("A {what} allocator does not over-grant when it is back"),
                scenario: sc.name.clone(),
                expected: format!("granted shares in force ≤ {:.0} % of quota", 100.0 + TOLERANCE_PCT),
                simulated: format!(
                    "granted shares in force peak at {:.0} % of quota (with bootstrap shares {:.0} %); \
                     admitted then {:+.1} %; all LEASED after {:.1} s",
                    f.after_granted_pct,
                    f.after_enforced_pct,
                    f.after_peak_pct,
                    f.released_after.unwrap_or(f64::NAN)
                ),
                verdict: verdict(f.after_granted_pct <= 100.0 + TOLERANCE_PCT),
                why: if name == "partition" { WHY_PARTITION } else { "" },
            });
        }
    }
    if let Some((run, r)) = find(runs, "failover") {
        let sc = &run.scenario;
        let (down, up) = outages(sc).first().copied().unwrap_or((0, sc.duration));
        let f = outage_figures(run, r, down, None, up);
        let before = r
            .seconds
            .get(secs(down).saturating_sub(10)..secs(down))
            .unwrap_or_default();
        let steady =
            before.iter().map(|c| c.admitted as f64).sum::<f64>() / before.len().max(1) as f64;
        // Every whole second from the crash until a lease TTL past the new leader's
        // learning period, against the admitted rate before the crash.
        let window = r
            .seconds
            .get(
                secs(down)
                    ..(secs(up + sc.params.lease_ttl.as_nanos() as u64) + 3).min(r.seconds.len()),
            )
            .unwrap_or_default();
        let pct = |c: &crate::bucket::Counts| (c.admitted as f64 / steady - 1.0) * 100.0;
        let lo = window.iter().map(pct).fold(f64::INFINITY, f64::min);
        let hi = window.iter().map(pct).fold(f64::NEG_INFINITY, f64::max);
        v.push(Claim {
            source: "allocator: replicas",
            claim: "A leader crash costs nothing: no host leaves LEASED, admitted stays \
                    within 2 % of its rate before the crash, no over-grant"
                .into(),
            scenario: sc.name.clone(),
            expected: format!(
                "no STICKY host; admitted within ±{TOLERANCE_PCT:.0} % of before; granted ≤ {:.0} % of quota",
                100.0 + TOLERANCE_PCT
            ),
            simulated: format!(
                "STICKY for {:.1} s; admitted {lo:+.1} % to {hi:+.1} % of its rate before the \
                 crash ({:.1} % of quota); granted shares in force peak at {:.0} % of quota",
                f.sticky_secs,
                steady / r.quota as f64 * 100.0,
                f.after_granted_pct
            ),
            verdict: verdict(
                f.sticky_secs == 0.0
                    && lo >= -TOLERANCE_PCT
                    && hi <= TOLERANCE_PCT
                    && f.after_granted_pct <= 100.0 + TOLERANCE_PCT,
            ),
            why: "",
        });
    }
    for name in ["shift", "flash"] {
        if let Some((run, r)) = find(runs, name) {
            let c = convergence_intervals(run, r);
            let n = |x: &Option<f64>| x.map_or("never".to_string(), |i| format!("{i:.0}"));
            let shown: Vec<String> = c
                .iter()
                .map(|(at, s, a)| {
                    format!(
                        "shift at {} s: shares {}, admitted {}",
                        at / NS_PER_S,
                        n(s),
                        n(a)
                    )
                })
                .collect();
            v.push(Claim {
                source: "allocator",
                claim: "Shares follow a demand shift within 3 report intervals".into(),
                scenario: run.scenario.name.clone(),
                expected: "shares settle in ≤ 3 intervals".into(),
                simulated: format!("{} (intervals)", shown.join("; ")),
                verdict: verdict(c.iter().all(|(_, s, _)| s.is_some_and(|i| i <= 3.0))),
                why: WHY_ZERO_SHARE,
            });
        }
    }
    let sweep = burst_sweep(runs);
    let enough = sweep
        .iter()
        .find(|p| (100.0 - TOLERANCE_PCT..=100.0 + TOLERANCE_PCT).contains(&p.admitted_pct));
    let condition = enough.map_or("no burst of the sweep".to_string(), |p| {
        format!(
            "per-host burst ≥ {:.0} tokens (global burst ≥ {} over {} hosts at ≈ {:.0}/s each)",
            p.tokens_per_host, p.burst, p.hosts, p.offered_per_host
        )
    });
    for (run, r) in ["steady"]
        .into_iter()
        .map(str::to_string)
        .chain(enough.map(|p| p.scenario.clone()))
        .filter_map(|n| find(runs, &n))
    {
        let f = rule_figures(run, r);
        let pct = f.saturated_admitted_pct.unwrap_or(f64::NAN);
        let hosts = run.scenario.hosts.max(1);
        v.push(Claim {
            source: "allocator",
            claim: format!(
                "Global admitted within 2 % of the quota when demand exceeds it — holds for \
                 {condition}"
            ),
            scenario: run.scenario.name.clone(),
            expected: "98–102 % of quota".into(),
            simulated: format!(
                "{pct:.1} % (Contoso, {} hosts, global burst {} ≈ {:.0} tokens per host); \
                 false drops {:.1} % of offered",
                hosts,
                r.burst,
                r.burst as f64 / f64::from(hosts),
                f.drops_up.false_pct_of_offered()
            ),
            verdict: verdict((100.0 - TOLERANCE_PCT..=100.0 + TOLERANCE_PCT).contains(&pct)),
            why: WHY_ACCURACY,
        });
    }
    if let Some((run, r)) = find(runs, "idle") {
        if let Some(at) = first_change(&run.scenario) {
            let tps = ticks_per_s(run);
            let before = r.ticks.get(secs(at) * tps - 1).copied().unwrap_or_default();
            let open = before.hosts[state_index(ShareState::FailOpen)];
            let leased = before.hosts[state_index(ShareState::Leased)];
            let o = overshoot(&r.seconds, r.quota, secs(at)..secs(at) + 10, TOLERANCE_PCT);
            v.push(Claim {
                source: "DESIGN LEASED",
                claim: "With the allocator up, a rule's share is LEASED (renewed by each report)"
                    .into(),
                scenario: run.scenario.name.clone(),
                expected: "idle hosts LEASED; a traffic shift stays near the quota".into(),
                simulated: format!(
                    "before the traffic arrives: {leased} hosts LEASED, {open} FAIL_OPEN; then \
                     {:+.0} % (1 s peak), {} s over the quota",
                    o.max_pct, o.secs_over
                ),
                verdict: verdict(open == 0 && o.max_pct <= 92.0 + 1.0),
                why: WHY_ZERO_SHARE,
            });
        }
    }
    v
}

/// One rule during an outage with traffic on closed shares: (mean admitted ÷ quota %,
/// largest 1 s overshoot %, false drops % of offered).
pub type OutageWindow = (f64, f64, f64);

/// Contoso and Directory from the traffic's arrival on the closed shares until the first
/// FAIL_OPEN or the allocator's return (whole seconds, the first one skipped).
#[derive(Clone, Copy, Debug)]
pub struct OutageWindows {
    pub contoso: OutageWindow,
    pub directory: OutageWindow,
}

pub fn outage_window(run: &Run) -> Option<OutageWindows> {
    let sc = &run.scenario;
    let (_, up) = outages(sc).first().copied()?;
    let at = first_change(sc)?;
    let c = run.rule("contoso")?;
    let d = run.rule("directory")?;
    let tps = ticks_per_s(run);
    let fo = state_index(ShareState::FailOpen);
    let first_fail_open = c
        .ticks
        .iter()
        .enumerate()
        .skip((at / run.tick_ns) as usize)
        .find(|(_, x)| x.hosts[fo] > 0)
        .map(|(i, _)| i / tps);
    let end = first_fail_open.unwrap_or(secs(up)).min(secs(up));
    let range = secs(at) + 1..end;
    let figures = |r: &RuleSeries| -> OutageWindow {
        let sel = r.seconds.get(range.clone()).unwrap_or_default();
        let admitted: u64 = sel.iter().map(|c| c.admitted).sum();
        let mean = admitted as f64 / sel.len().max(1) as f64 / r.quota as f64 * 100.0;
        let o = overshoot(&r.seconds, r.quota, range.clone(), TOLERANCE_PCT);
        let dr = drops(&r.seconds, r.quota, range.clone());
        (mean, o.max_pct, dr.false_pct_of_offered())
    };
    Some(OutageWindows {
        contoso: figures(c),
        directory: figures(d),
    })
}

/// One point of the burst sweep: `steady` with Contoso alone at one global burst.
#[derive(Clone, Debug)]
pub struct SweepPoint {
    pub scenario: String,
    pub burst: u64,
    pub hosts: u32,
    pub tokens_per_host: f64,
    /// Mean offered per host, frames per second.
    pub offered_per_host: f64,
    /// Mean admitted ÷ quota over the seconds with offered ≥ 105 % of the quota.
    pub admitted_pct: f64,
    pub false_pct: f64,
    /// Largest 1 s overshoot, percent.
    pub overshoot_pct: f64,
}

/// The `steady-burst*` runs at hand, by increasing burst.
pub fn burst_sweep(runs: &[Run]) -> Vec<SweepPoint> {
    let mut v: Vec<SweepPoint> = runs
        .iter()
        .filter(|r| r.scenario.name.starts_with("steady-burst") && !r.scenario.name.contains('+'))
        .filter_map(|run| {
            let r = run.rule("contoso")?;
            let f = rule_figures(run, r);
            let measured = run.measured();
            let n = measured.len().max(1) as f64;
            let offered: u64 = r
                .seconds
                .get(measured)
                .unwrap_or_default()
                .iter()
                .map(|c| c.offered)
                .sum();
            let hosts = run.scenario.hosts.max(1);
            Some(SweepPoint {
                scenario: run.scenario.name.clone(),
                burst: r.burst,
                hosts,
                tokens_per_host: r.burst as f64 / f64::from(hosts),
                offered_per_host: offered as f64 / n / f64::from(hosts),
                admitted_pct: f.saturated_admitted_pct?,
                false_pct: f.drops_up.false_pct_of_offered(),
                overshoot_pct: f.overshoot_up.max_pct,
            })
        })
        .collect();
    v.sort_by_key(|p| p.burst);
    v
}

/// One run of the accuracy comparison: a scenario run with a candidate that lost, or
/// without a winner (`base+LABEL`), beside the same scenario with the winners.
#[derive(Clone, Debug)]
pub struct CandidatePoint {
    pub scenario: String,
    pub base: String,
    /// What `admitted_pct` etc. are of: the variant, then the base run (the winners).
    pub admitted_pct: [Option<f64>; 2],
    pub false_pct: [f64; 2],
    pub overshoot_pct: [f64; 2],
    /// The lowest second's admitted ÷ quota among the seconds offered ≥ 105 % of it.
    pub lowest_pct: [Option<f64>; 2],
    /// Report intervals until admitted is back within 2 % after each shift (`None`:
    /// never), variant then base.
    pub admitted_back: [Vec<Option<f64>>; 2],
}

/// Every `base+LABEL` run against its `base` run, in run order.
pub fn candidates(runs: &[Run]) -> Vec<CandidatePoint> {
    let figures = |run: &Run| {
        let r = run.rule("contoso")?;
        let f = rule_figures(run, r);
        let back = convergence_intervals(run, r)
            .into_iter()
            .map(|(_, _, a)| a)
            .collect();
        let lowest = r
            .seconds
            .get(run.measured())
            .unwrap_or_default()
            .iter()
            .filter(|c| c.offered * 100 >= r.quota * 105)
            .map(|c| c.admitted as f64 / r.quota.max(1) as f64 * 100.0)
            .reduce(f64::min);
        Some((
            f.saturated_admitted_pct,
            f.drops_up.false_pct_of_offered(),
            f.overshoot_up.max_pct,
            lowest,
            back,
        ))
    };
    runs.iter()
        .filter_map(|run| {
            let (base, _) = run.scenario.name.split_once('+')?;
            let b = runs.iter().find(|x| x.scenario.name == base)?;
            let (va, vf, vo, vl, vb) = figures(run)?;
            let (ba, bf, bo, bl, bb) = figures(b)?;
            Some(CandidatePoint {
                scenario: run.scenario.name.clone(),
                base: base.to_string(),
                admitted_pct: [va, ba],
                false_pct: [vf, bf],
                overshoot_pct: [vo, bo],
                lowest_pct: [vl, bl],
                admitted_back: [vb, bb],
            })
        })
        .collect()
}
