//! Allocator capacity: how many host reports a second one allocator handles on one core.
//!
//! No network: the real allocator state ([`limiter_allocator::state::State`]) is driven
//! directly, as the gRPC service does it (`limiter-allocator/src/service.rs`): for each
//! report `State::admit` (the host table) and then `State::handle` (the allocation and the
//! host's grants). Only those two calls are timed; building the request and reading the
//! grants back into the host's `held` happen outside the clock.
//!
//! The simulated fleet: `hosts` hosts (`host-0000`, …) each report every rule once per
//! report interval (1 s), spread evenly over the second, with a demand per rule that
//! differs between hosts and moves a little each second, and the share it holds (its last
//! grant). Each rule's quota is below the fleet's demand for it, so every allocation
//! water-fills and some hosts are saturated. The allocator starts at 0 and learns for a
//! lease TTL (3 s); the fleet's reports begin a second before that ends, so every host and
//! rule is in the state when it does (this warm-up is untimed, and runs for every shape
//! at once, a thread each), and nothing is timed before it is over: what is measured is
//! the reallocation past learning, each report water-filling every rule it carries.
//!
//! A round is a run of consecutive reports in that schedule: a whole simulated second
//! (every host once) where that fits the round's time budget, else as many reports as
//! fit it (from the cost of the first reports after learning). The figures: reports/s
//! (the inverse of the mean time per report), rule-reports/s (× rules), and the ratio to
//! what the shape requires: one report per host per second, i.e. `hosts` reports/s and
//! `hosts × rules` rule-reports/s.
//!
//! Sharded shapes (`groups` > 1): the rules are split between the groups (rule `r` to
//! group `r % groups`), and the state measured is the first group's leader: it knows
//! every rule's quota and the whole assignment (`State::shard_as`, `State::assign`), and
//! each host's report carries only its rules, as hosts route them
//! (`limiter_fleet::shard`). Such a leader must carry `hosts × rules / groups`
//! rule-reports/s.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context as _, Result};
use limiter_allocator::{config::Quota, hosts::HostLimits, state::State};
use limiter_fleet::share::{DEFAULT_LEASE_TTL_MS, DEFAULT_REPORT_INTERVAL_MS};
use limiter_proto::pb::{ReportReply, ReportRequest, RuleReport};

use crate::stats::Spread;

/// Nanoseconds a second.
const S: u64 = 1_000_000_000;
/// The allocator's defaults: a lease lasts 3 s, hosts report every second.
pub const LEASE_TTL: Duration = Duration::from_millis(DEFAULT_LEASE_TTL_MS);
pub const REPORT_INTERVAL: Duration = Duration::from_millis(DEFAULT_REPORT_INTERVAL_MS);
/// Mean demand per host and rule is ~500/s; each rule's quota is this much per host, so
/// the fleet asks ~1.25× the quota of every rule.
const QUOTA_PER_HOST: u64 = 400;

/// A fleet to allocate for: `hosts` hosts, each reporting `rules` rules, sharded over
/// `groups` groups of allocators (1: not sharded).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub hosts: usize,
    pub rules: usize,
    pub groups: usize,
}

impl Shape {
    /// What one allocator (one group's leader) must carry for this fleet: one report per
    /// host per second.
    pub fn required_reports_per_s(self) -> f64 {
        self.hosts as f64
    }

    pub fn required_rule_reports_per_s(self) -> f64 {
        (self.hosts * self.leader_rules()) as f64
    }

    /// The rules one leader grants: those of the first group.
    pub fn leader_rules(self) -> usize {
        self.rules.div_ceil(self.groups.max(1))
    }

    pub fn label(self) -> String {
        let fleet = format!(
            "{} hosts × {} rules",
            thousands(self.hosts as u64),
            thousands(self.rules as u64)
        );
        if self.groups > 1 {
            format!(
                "{fleet}, {} groups ({} rules a leader)",
                self.groups,
                thousands(self.leader_rules() as u64)
            )
        } else {
            fleet
        }
    }
}

/// The shapes of `cargo xtask bench -- allocator-capacity`: the third is the requirement
/// (500 hosts × 10,000 rules) for one leader, the last three the same fleet sharded over
/// two, three and four groups (one leader: 5,000, 3,334 and 2,500 rules).
pub const SHAPES: [Shape; 6] = [
    Shape {
        hosts: 500,
        rules: 1_000,
        groups: 1,
    },
    Shape {
        hosts: 5_000,
        rules: 100,
        groups: 1,
    },
    REQUIRED,
    Shape {
        groups: 2,
        ..REQUIRED
    },
    Shape {
        groups: 3,
        ..REQUIRED
    },
    Shape {
        groups: 4,
        ..REQUIRED
    },
];

/// The requirement: 500 hosts × 10,000 rules.
pub const REQUIRED: Shape = Shape {
    hosts: 500,
    rules: 10_000,
    groups: 1,
};

/// How much to measure.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    /// Measured rounds (odd: the median is one round).
    pub rounds: usize,
    /// Time budget of a round's timed calls.
    pub round_budget: Duration,
    /// Timed reports after learning, untimed for the figures, to size the rounds.
    pub calibration: Duration,
}

impl Plan {
    /// The benchmark's: 5 rounds of ≤ 1 s each per shape.
    pub const BENCH: Plan = Plan {
        rounds: 5,
        round_budget: Duration::from_millis(1000),
        calibration: Duration::from_millis(300),
    };

    /// The unit tests': tiny rounds.
    #[cfg(test)]
    const TEST: Plan = Plan {
        rounds: 5,
        round_budget: Duration::from_millis(20),
        calibration: Duration::from_millis(5),
    };
}

/// One measured round.
#[derive(Clone, Copy, Debug)]
pub struct Round {
    pub reports: usize,
    /// Time in `admit` + `handle`, summed over the round's reports.
    pub elapsed: Duration,
}

impl Round {
    pub fn reports_per_s(&self) -> f64 {
        self.reports as f64 / self.elapsed.as_secs_f64()
    }
}

/// What one shape measured.
#[derive(Clone, Debug)]
pub struct Capacity {
    pub shape: Shape,
    pub rounds: Vec<Round>,
    /// Reports before the first timed one (the learning period and the calibration).
    pub warmup_reports: usize,
    /// Wall time of the warm-up (building the fleet, the learning period) and of the rest.
    pub warmup: Duration,
    pub timing: Duration,
    /// Grants handed out in the measured rounds, and those with a share above 0.
    pub grants: u64,
    pub open_grants: u64,
    /// The simulated times of the first and the last measured report (s since the
    /// allocator started).
    pub simulated_s: (f64, f64),
}

impl Capacity {
    pub fn reports_per_s(&self) -> Option<Spread> {
        let v: Vec<f64> = self.rounds.iter().map(Round::reports_per_s).collect();
        Spread::of(&v)
    }

    pub fn rule_reports_per_s(&self) -> Option<Spread> {
        let rules = self.shape.rules as f64;
        self.reports_per_s().map(|s| s.scale(rules))
    }

    /// Measured ÷ required (the same for reports and rule-reports).
    pub fn ratio(&self) -> Option<Spread> {
        let required = self.shape.required_reports_per_s();
        self.reports_per_s().map(|s| s.scale(1.0 / required))
    }

    /// µs per report: the inverse of reports/s (so min and max swap).
    pub fn us_per_report(&self) -> Option<Spread> {
        let v: Vec<f64> = self
            .rounds
            .iter()
            .map(|r| 1e6 / r.reports_per_s())
            .collect();
        Spread::of(&v)
    }

    /// Reports per round (all rounds have the same count).
    pub fn reports_per_round(&self) -> usize {
        self.rounds.first().map_or(0, |r| r.reports)
    }
}

/// The simulated fleet and the allocator state it reports to.
struct Fleet {
    shape: Shape,
    state: State,
    names: Vec<String>,
    /// The one request, rewritten for each report (rule names stay).
    request: ReportRequest,
    /// What each host holds of each rule: its last grant (`host * rules + rule`).
    held: Vec<u64>,
    /// Reports in the schedule so far, from 0 s (the fleet's first is at
    /// [`first_report`]): the next is host `sent % hosts` in second `sent / hosts`.
    sent: usize,
}

/// What one report did.
struct Handled {
    elapsed: Duration,
    now: u64,
    grants: usize,
    open_grants: usize,
}

impl Fleet {
    fn new(shape: Shape) -> Result<Fleet> {
        ensure!(
            shape.hosts > 0 && shape.rules > 0,
            "an empty shape: {shape:?}"
        );
        let rule_names: Vec<String> = (0..shape.rules).map(|r| format!("rule-{r:05}")).collect();
        let quota = QUOTA_PER_HOST * shape.hosts as u64;
        let quotas: Vec<Quota> = rule_names
            .iter()
            .map(|rule| Quota {
                rule: rule.clone(),
                rate: quota,
                burst: (quota / 10).max(1),
            })
            .collect();
        let limits = HostLimits {
            max_hosts: shape.hosts + 1,
            ttl_ns: ns(LEASE_TTL),
            // Each host reports once a second; ten times that is never refused.
            rate: 10,
            burst: 10,
        };
        let mut state = State::new(&quotas, LEASE_TTL, REPORT_INTERVAL, limits, 0);
        let groups = shape.groups.max(1);
        if groups > 1 {
            state.shard_as("group-0");
            for (r, rule) in rule_names.iter().enumerate() {
                state.assign(rule, Some(&format!("group-{}", r % groups)), 0);
            }
        }
        let request = ReportRequest {
            version: limiter_proto::VERSION,
            host: String::new(),
            rules: rule_names
                .into_iter()
                .step_by(groups)
                .map(|rule| RuleReport {
                    rule,
                    demand: 0,
                    held: 0,
                    ..RuleReport::default()
                })
                .collect(),
            fleet_size: 0,
        };
        Ok(Fleet {
            shape,
            state,
            names: (0..shape.hosts).map(|h| format!("host-{h:04}")).collect(),
            request,
            held: vec![0; shape.hosts * shape.leader_rules()],
            sent: 0,
        })
    }

    /// The simulated time of report number `sent`: host `h` reports at `h / hosts` into
    /// each second.
    fn time_of(&self, sent: usize) -> u64 {
        let (second, host) = (sent / self.shape.hosts, sent % self.shape.hosts);
        second as u64 * ns(REPORT_INTERVAL)
            + host as u64 * ns(REPORT_INTERVAL) / self.shape.hosts as u64
    }

    /// The next report: written outside the clock, `admit` + `handle` timed, the grants
    /// read back into what the host holds.
    fn report(&mut self) -> Result<Handled> {
        let (second, host) = (self.sent / self.shape.hosts, self.sent % self.shape.hosts);
        let now = self.time_of(self.sent);
        let rules = self.shape.leader_rules();
        let held = &self.held[host * rules..(host + 1) * rules];
        for (r, (report, &held)) in self.request.rules.iter_mut().zip(held).enumerate() {
            report.demand = demand(host, r, second);
            report.held = held;
        }
        self.request.host.clone_from(&self.names[host]);
        let started = Instant::now();
        let admitted = self.state.admit(&self.request.host, now);
        let reply = admitted.map(|()| self.state.handle(&self.request, now));
        let elapsed = started.elapsed();
        let reply = reply.map_err(|refusal| {
            anyhow::anyhow!(
                "the allocator refused {}'s report at {:.3} s: {refusal:?}",
                self.request.host,
                now as f64 / S as f64
            )
        })?;
        self.sent += 1;
        let open_grants = self.read_back(host, &reply)?;
        Ok(Handled {
            elapsed,
            now,
            grants: reply.grants.len(),
            open_grants,
        })
    }

    /// Sets what `host` holds from `reply` (grants come in the request's rule order,
    /// rules without a grant left out); returns the grants with a share above 0.
    fn read_back(&mut self, host: usize, reply: &ReportReply) -> Result<usize> {
        ensure!(
            reply.elsewhere.is_empty(),
            "{} rules of {}'s report are another group's",
            reply.elsewhere.len(),
            self.request.host
        );
        let rules = self.shape.leader_rules();
        let held = &mut self.held[host * rules..(host + 1) * rules];
        let mut next = 0;
        let mut open = 0;
        for grant in &reply.grants {
            let offset = self.request.rules[next..]
                .iter()
                .position(|r| r.rule == grant.rule)
                .with_context(|| format!("a grant for rule {:?}, not in the report", grant.rule))?;
            next += offset;
            held[next] = grant.rate;
            open += usize::from(grant.rate > 0);
            next += 1;
        }
        Ok(open)
    }
}

/// The fleet's first reports: one report interval before the learning period (one lease
/// TTL from the allocator's start at 0) ends, so every host has reported once, holding
/// nothing, when it is over. Earlier reports would change nothing the allocator keeps
/// (while it learns it grants nothing to a host that holds nothing, so what hosts hold
/// stays 0) and cost minutes for the large shapes.
fn first_report() -> u64 {
    ns(LEASE_TTL).saturating_sub(ns(REPORT_INTERVAL))
}

/// The schedule's reports before [`first_report`], never sent.
fn skipped(shape: Shape) -> usize {
    (first_report() / ns(REPORT_INTERVAL)) as usize * shape.hosts
}

/// A fleet of `shape` whose every host has reported once during the learning period;
/// its next report is the first past learning. Untimed.
fn warm_up(shape: Shape) -> Result<Warm> {
    let started = Instant::now();
    let mut fleet = Fleet::new(shape)?;
    fleet.sent = skipped(shape);
    let learned = ns(LEASE_TTL);
    while fleet.time_of(fleet.sent) < learned {
        let h = fleet.report()?;
        ensure!(
            h.grants == 0,
            "{} got {} grants while the allocator learns",
            fleet.request.host,
            h.grants
        );
    }
    Ok(Warm {
        fleet,
        took: started.elapsed(),
    })
}

/// A fleet past its warm-up, and how long that took.
struct Warm {
    fleet: Fleet,
    took: Duration,
}

/// Measures one shape: warm-up, calibration, then `plan.rounds` rounds. Fails if the
/// state refuses a report, or a measured report comes back without a grant for every rule
/// (past learning each rule grants, if only a share of 0), or no grant opens a share.
pub fn measure(shape: Shape, plan: Plan) -> Result<Capacity> {
    time(warm_up(shape)?, plan)
}

/// [`measure`] for each of `shapes`: the warm-ups in parallel (a thread each, untimed),
/// then the measurements one after the other on this thread, after `before_timing` (the
/// benchmark pins the thread to its CPU there).
pub fn measure_all(
    shapes: &[Shape],
    plan: Plan,
    before_timing: impl FnOnce() -> Result<()>,
) -> Result<Vec<Capacity>> {
    let warm: Vec<Result<Warm>> = std::thread::scope(|scope| {
        let threads: Vec<_> = shapes
            .iter()
            .map(|&shape| scope.spawn(move || warm_up(shape)))
            .collect();
        threads
            .into_iter()
            .map(|t| {
                t.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a warm-up thread panicked")))
            })
            .collect()
    });
    before_timing()?;
    warm.into_iter()
        .map(|w| {
            let w = w?;
            let shape = w.fleet.shape;
            eprintln!(
                "allocator capacity: {} (warmed up in {:.1} s)…",
                shape.label(),
                w.took.as_secs_f64()
            );
            time(w, plan).with_context(|| shape.label())
        })
        .collect()
}

/// The timed part of [`measure`].
fn time(warm: Warm, plan: Plan) -> Result<Capacity> {
    ensure!(plan.rounds > 0, "no rounds");
    let started = Instant::now();
    let Warm { mut fleet, took } = warm;
    let shape = fleet.shape;
    // Calibration: the first reports past learning, their cost sizes the rounds. Not the
    // very first: it computes every rule's allocation at once (each is then reused for
    // half a report interval), and sized from it the largest shape's rounds were a few
    // reports long, too short to include the periodic recomputation they pay for.
    fleet.report()?;
    let (mut spent, mut counted) = (Duration::ZERO, 0usize);
    while counted < shape.hosts && spent < plan.calibration {
        spent += fleet.report()?.elapsed;
        counted += 1;
    }
    let per_report = spent.as_secs_f64() / counted.max(1) as f64;
    let fit = (plan.round_budget.as_secs_f64() / per_report.max(1e-9)) as usize;
    let per_round = fit.clamp(1, shape.hosts);
    let warmup_reports = fleet.sent - skipped(shape);

    let mut rounds = Vec::with_capacity(plan.rounds);
    let (mut grants, mut open_grants, mut first, mut last) = (0u64, 0u64, None, 0u64);
    for _ in 0..plan.rounds {
        let mut round = Round {
            reports: 0,
            elapsed: Duration::ZERO,
        };
        for _ in 0..per_round {
            let h = fleet.report()?;
            ensure!(
                h.grants == shape.leader_rules(),
                "{} got {} grants for {} rules at {:.3} s, past learning",
                fleet.request.host,
                h.grants,
                shape.leader_rules(),
                h.now as f64 / S as f64
            );
            round.reports += 1;
            round.elapsed += h.elapsed;
            grants += h.grants as u64;
            open_grants += h.open_grants as u64;
            first.get_or_insert(h.now);
            last = h.now;
        }
        ensure!(
            round.elapsed > Duration::ZERO,
            "a round of {} reports took no measurable time",
            round.reports
        );
        rounds.push(round);
    }
    let state = &fleet.state;
    ensure!(
        state.refused_fleet_full == 0 && state.refused_host_rate == 0,
        "the allocator refused reports: {} for a full fleet, {} over the host rate",
        state.refused_fleet_full,
        state.refused_host_rate
    );
    let handled = fleet.sent - skipped(shape);
    ensure!(
        state.reports == handled as u64,
        "{handled} reports sent, {} handled",
        state.reports
    );
    ensure!(open_grants > 0, "no measured grant opened a share");
    Ok(Capacity {
        shape,
        rounds,
        warmup_reports,
        warmup: took,
        timing: started.elapsed(),
        grants,
        open_grants,
        simulated_s: (first.unwrap_or(0) as f64 / S as f64, last as f64 / S as f64),
    })
}

/// The part's report (`target/bench/allocator-capacity.md`, and on stdout): a row per
/// shape, then the verdict for the requirement (the last shape). `machine`: kernel, CPU
/// and the CPU the timing ran on.
pub fn markdown(results: &[Capacity], plan: Plan, machine: &str) -> String {
    let mut out = String::from(
        "# limiter: allocator capacity, one core

",
    );
    out += &format!(
        "- {machine}; the real allocator state (`limiter_allocator::state::State`) driven \
         directly, no network: per report `admit` (the host table) then `handle` (every \
         rule's allocation and the host's grant), as the gRPC service calls them; only \
         those two calls are timed, on one thread\n\
         - the fleet: every host reports every rule once a second (a report interval), \
         spread over the second, with a demand per rule of 1–1,000/s (±10 % a second) and \
         the share it holds (its last grant); each rule's quota is {QUOTA_PER_HOST}/s per \
         host (the fleet asks ~1.25× of it); lease TTL {} s: the allocator learns for the \
         first {} s, the fleet's first reports arrive in its last second, nothing before \
         the end of learning is timed\n\
         - a round: consecutive reports of the schedule, a whole simulated second where it \
         fits {} s of timed calls, else what fits (sized from the first reports past \
         learning); {} rounds, median (min–max)\n\
         - required: one report per host per second, so hosts reports/s and hosts × rules \
         rule-reports/s; the ratio is measured ÷ required (≥ 1: one allocator carries the \
         fleet on one core)\n\n",
        LEASE_TTL.as_secs(),
        LEASE_TTL.as_secs(),
        plan.round_budget.as_secs_f64(),
        plan.rounds,
    );
    out += "| fleet | reports a round | µs per report | reports/s | rule-reports/s | \
            required rule-reports/s | measured ÷ required | ns per rule-report |\n\
            |---|---:|---:|---:|---:|---:|---:|---:|\n";
    for c in results {
        let (Some(us), Some(rps), Some(rule), Some(ratio)) = (
            c.us_per_report(),
            c.reports_per_s(),
            c.rule_reports_per_s(),
            c.ratio(),
        ) else {
            continue;
        };
        let per_cell = us.scale(1e3 / c.shape.leader_rules() as f64);
        out += &format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} |\n",
            c.shape.label(),
            c.reports_per_round(),
            spread_thousands(us),
            spread(rps, 1, ""),
            spread_thousands(rule),
            thousands(c.shape.required_rule_reports_per_s() as u64),
            spread(ratio, 4, "×"),
            spread(per_cell, 0, ""),
        );
    }
    out += "\nA rule's allocation (water-filling over its hosts, O(hosts log hosts)) is \
            recomputed at most every half report interval and at once when a host joins or \
            lapses (`RuleAllocator::refresh_ns`); between, a rule-report is a lookup and the \
            host's grant capped by the others' sum, kept as grants change. The last column is \
            what one rule of a report costs, the allocation's share included.\n";
    let requirement = results
        .iter()
        .find(|c| c.shape == REQUIRED)
        .or_else(|| results.iter().rev().find(|c| c.shape.groups <= 1));
    if let Some(c) = requirement {
        if let Some(ratio) = c.ratio() {
            let verdict = if ratio.min >= 1.0 {
                "Yes"
            } else if ratio.max >= 1.0 {
                "Not in every round"
            } else {
                "No, it can NOT"
            };
            out += &format!(
                "\nCan one leader carry {} on one core ({} reports/s of {} rules, {} \
                 rule-reports/s)? {verdict}: measured ÷ required = {}, one report takes {} µs \
                 (it would need ≤ {} µs).\n",
                c.shape.label(),
                thousands(c.shape.hosts as u64),
                thousands(c.shape.rules as u64),
                thousands(c.shape.required_rule_reports_per_s() as u64),
                spread(ratio, 4, "×"),
                c.us_per_report().map_or_else(String::new, spread_thousands),
                thousands((1e6 / c.shape.required_reports_per_s()) as u64),
            );
        }
    }
    out += &groups_needed(results);
    out += &format!(
        "\nThe protocol caps a report at {} rules (`limiter_proto::MAX_RULES_PER_REPORT`); \
         the state takes any number, so the shapes above carry every rule in one report, \
         and a fleet with more rules would send several reports a second per host carrying \
         the same rule-reports.\n",
        thousands(limiter_proto::MAX_RULES_PER_REPORT as u64)
    );
    let warmup: Vec<String> = results
        .iter()
        .map(|c| {
            format!(
                "{} {:.1} s ({} reports)",
                c.shape.label(),
                c.warmup.as_secs_f64(),
                thousands(c.warmup_reports as u64)
            )
        })
        .collect();
    out += &format!(
        "\nWarm-ups (in parallel, before any timing; the learning period, then the \
         reports that sized the rounds): {}.\n",
        warmup.join("; ")
    );
    out
}

/// The sharded shapes' verdicts, and how many groups (a leader, a core each) the
/// requirement needs: the fewest measured whose leader carried its part in every round
/// (per-rule cost depends on how many rules a leader holds, so no extrapolation).
fn groups_needed(results: &[Capacity]) -> String {
    let mut out = String::new();
    let mut carried: Vec<(usize, bool, bool)> = Vec::new();
    for c in results {
        let Some(ratio) = c.ratio() else {
            continue;
        };
        if (c.shape.hosts, c.shape.rules) == (REQUIRED.hosts, REQUIRED.rules) {
            carried.push((c.shape.groups, ratio.min >= 1.0, ratio.median >= 1.0));
        }
        if c.shape.groups <= 1 {
            continue;
        }
        let verdict = if ratio.min >= 1.0 {
            "Yes"
        } else if ratio.max >= 1.0 {
            "Not in every round"
        } else {
            "No"
        };
        out += &format!(
            "\nSharded over {} groups, does each leader carry its part of {} hosts × {} rules \
             ({} reports/s of {} rules, {} rule-reports/s)? {verdict}: measured ÷ required = \
             {}.\n",
            c.shape.groups,
            thousands(c.shape.hosts as u64),
            thousands(c.shape.rules as u64),
            thousands(c.shape.hosts as u64),
            thousands(c.shape.leader_rules() as u64),
            thousands(c.shape.required_rule_reports_per_s() as u64),
            spread(ratio, 4, "×"),
        );
    }
    carried.sort();
    if carried.len() > 1 {
        let every = carried.iter().find(|c| c.1).map(|c| c.0);
        let median = carried.iter().find(|c| c.2).map(|c| c.0);
        let measured: Vec<String> = carried.iter().map(|c| c.0.to_string()).collect();
        out += &format!(
            "\nGroups (leaders, a core each) {} hosts × {} rules needs, of those measured \
             ({}): {}.\n",
            thousands(REQUIRED.hosts as u64),
            thousands(REQUIRED.rules as u64),
            measured.join(", "),
            match (every, median) {
                (Some(n), _) => format!("{n}, carried in every round"),
                (None, Some(n)) =>
                    format!("{n} in the median round, not in every round (more for a margin)"),
                (None, None) => "more than any measured".to_string(),
            }
        );
    }
    out
}

/// `median (min–max)`, whole numbers with thousands separators.
fn spread_thousands(s: Spread) -> String {
    let n = |v: f64| thousands(v.round() as u64);
    format!("{} ({}–{})", n(s.median), n(s.min), n(s.max))
}

/// `median (min–max)` with `digits` decimals and a unit after each figure.
fn spread(s: Spread, digits: usize, unit: &str) -> String {
    format!(
        "{:.digits$}{unit} ({:.digits$}–{:.digits$}{unit})",
        s.median, s.min, s.max
    )
}

/// Demand of `host` for `rule` in `second`: 1..=1000 per host and rule (mean ~500),
/// ±10 % from one second to the next.
fn demand(host: usize, rule: usize, second: usize) -> u64 {
    let base = 1 + mix(host as u64, rule as u64, 0) % 1000;
    let wobble = 90 + mix(host as u64, rule as u64, 1 + second as u64) % 21;
    (base * wobble / 100).max(1)
}

/// A cheap deterministic hash (splitmix64 of the three words).
fn mix(a: u64, b: u64, c: u64) -> u64 {
    let mut z = a
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(b.wrapping_mul(0xC2B2_AE3D_27D4_EB4F))
        .wrapping_add(c.wrapping_mul(0x1656_67B1_9E37_79F9));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// `1234567` as `1,234,567`.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tiny_fleet_is_handled_and_granted() {
        let shape = Shape {
            hosts: 10,
            rules: 5,
            groups: 1,
        };
        let c = measure(shape, Plan::TEST).unwrap();
        assert_eq!(c.rounds.len(), 5);
        // A tiny fleet fits a round: every host once, a whole simulated second.
        assert_eq!(c.reports_per_round(), 10);
        assert_eq!(c.grants, 5 * 10 * 5);
        assert!(c.open_grants > 0);
        // Past learning: nothing measured before a lease TTL; a round a simulated second.
        assert!(c.simulated_s.0 >= 3.0, "{:?}", c.simulated_s);
        assert!(
            c.simulated_s.1 - c.simulated_s.0 >= 4.8,
            "{:?}",
            c.simulated_s
        );
        let r = c.ratio().unwrap();
        assert!(r.min > 0.0 && r.min <= r.median && r.median <= r.max);
    }

    #[test]
    fn held_shares_never_exceed_the_quota() {
        let shape = Shape {
            hosts: 10,
            rules: 5,
            groups: 1,
        };
        let mut fleet = warm_up(shape).unwrap().fleet;
        while fleet.time_of(fleet.sent) < 5 * S {
            fleet.report().unwrap();
        }
        // The shares hosts hold of a rule never sum above its quota, and after two
        // seconds past learning they hand out most of it.
        let quota = QUOTA_PER_HOST * shape.hosts as u64;
        for r in 0..shape.rules {
            let sum: u64 = (0..shape.hosts)
                .map(|h| fleet.held[h * shape.rules + r])
                .sum();
            assert!(
                sum <= quota && sum > quota / 2,
                "rule {r}: {sum} of {quota}"
            );
        }
    }

    #[test]
    fn the_report_says_whether_the_fleet_is_carried() {
        let shape = Shape {
            hosts: 10,
            rules: 5,
            groups: 1,
        };
        let c = measure(shape, Plan::TEST).unwrap();
        // One report per host while learning, the first past it (every rule allocated
        // at once, not counted), then the calibration: a whole second.
        assert_eq!(c.warmup_reports, 10 + 1 + 10);
        let md = markdown(&[c], Plan::TEST, "test");
        assert!(md.contains("| 10 hosts × 5 rules | 10 |"), "{md}");
        assert!(
            md.contains("Can one leader carry 10 hosts × 5 rules"),
            "{md}"
        );
        assert!(
            md.contains("? Yes: ") || md.contains("? No, it can NOT: "),
            "{md}"
        );
    }

    #[test]
    fn a_sharded_leader_is_measured_on_its_own_rules() {
        let shape = Shape {
            hosts: 10,
            rules: 6,
            groups: 2,
        };
        let c = measure(shape, Plan::TEST).unwrap();
        // Each report carries the leader's 3 rules, and each gets a grant.
        assert_eq!(c.grants, 5 * 10 * 3);
        let md = markdown(&[c], Plan::TEST, "test");
        assert!(
            md.contains("| 10 hosts × 6 rules, 2 groups (3 rules a leader) | 10 |"),
            "{md}"
        );
        assert!(md.contains("Sharded over 2 groups"), "{md}");
    }

    #[test]
    fn labels() {
        assert_eq!(thousands(5_000_000), "5,000,000");
        assert_eq!(thousands(500), "500");
        assert_eq!(SHAPES[2].label(), "500 hosts × 10,000 rules");
        assert_eq!(SHAPES[2].required_rule_reports_per_s(), 5e6);
        assert_eq!(
            SHAPES[3].label(),
            "500 hosts × 10,000 rules, 2 groups (5,000 rules a leader)"
        );
        assert_eq!(SHAPES[3].required_rule_reports_per_s(), 2.5e6);
    }
}
