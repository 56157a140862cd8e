//! The fleet in virtual time: hosts running one [`Share`] and one kernel bucket per rule
//! they see, an allocator running one [`RuleAllocator`] per rule, and the reports and
//! grants between them.
//!
//! Time advances in 1 ms steps. Events (demand changes, reports, grants, the allocator
//! going down or up) happen on step boundaries. Traffic is simulated lazily per
//! (rule, host) pair: a pair's frames are offered up to `now` whenever something is
//! about to change for it (a grant, a report, a demand change) and at every metrics tick
//! (100 ms for tracked rules, 1 s for the others); in between nothing touches it, so
//! the cost is per frame (low rates) or per tick (dense rates), not per step.

use std::{
    cmp::Reverse,
    collections::{BinaryHeap, VecDeque},
    time::Instant,
};

use anyhow::{Context as _, Result};
use limiter_fleet::{
    alloc::{allocate, Report, RuleAllocator, Usage},
    quiet::Quiet,
    share::{Enforcement, Grant, Share, ShareState, FAIL_OPEN_RETRY_MS},
};

use crate::{
    bucket::{Arrivals, Bucket, Counts, Verdict},
    metrics::{state_index, AllocatorStats, RuleSeries, Run, Tick},
    rng::Rng,
    scenario::{ns, Action, CreditMode, Scenario, ShareStart, Tenant},
    time::{MS, NS_PER_S, STEP},
};

pub const TICK: u64 = 100 * MS;

/// The hosts' and the allocator's clock reads this at scenario time 0. The allocator
/// starts at clock 0, so by scenario time 0 it is past its start-up learning period
/// (restarts are events). But it has heard no report for 60 s, and since limiter-fleet
/// f8c2187 an allocator that heard nothing for a lease TTL learns again: each rule's
/// first report puts it back into learning for one lease TTL, during which hosts in
/// BOOTSTRAP (held 0) get no grant. Every scenario starts that way, inside its warm-up.
pub const EPOCH: u64 = 60 * NS_PER_S;

/// One rule on one host.
struct Pair {
    host: u32,
    /// This host's share of the rule's traffic, relative to the others.
    weight: f64,
    arrivals: Arrivals,
    /// `None` until the share starts (see [`ShareStart`]).
    share: Option<Share>,
    bucket: Option<Bucket>,
    /// Has had a grant: what it admitted before counts as the bootstrap phase.
    granted: bool,
    /// Frames have been offered up to here.
    t: u64,
    /// First-frame event queued.
    pending: bool,
    since_report: Counts,
    last_report: u64,
    tick: Counts,
    tick_bootstrap: u64,
    /// The last grant's credit: re-armed when a report fails while the lease holds, so
    /// the credit does not stop for a leader's gap.
    last_credit: u64,
    /// The bucket's `credited` at the last report.
    credited_at_report: u64,
    /// The share started in the current tick.
    tick_joined: bool,
    /// Offered since the share started: what the daemon reads from its counters.
    offered_total: u64,
    /// Whether the demand last reported left (`limiter_fleet::quiet`).
    quiet: Quiet,
    /// A FAIL_OPEN retry is queued: it replaces the interval's report (the daemon's next
    /// report is the retry).
    retrying: bool,
}

impl Pair {
    /// Offers the frames arriving in `[self.t, to)` under what the share enforces, split
    /// at the FAIL_OPEN deadline.
    fn advance(&mut self, to: u64) {
        if to <= self.t {
            return;
        }
        let (Some(share), Some(bucket)) = (&self.share, &mut self.bucket) else {
            self.t = to;
            return;
        };
        while self.t < to {
            let fail_open_at = share.deadlines().1;
            let end = if fail_open_at > self.t && fail_open_at < to {
                fail_open_at
            } else {
                to
            };
            let verdict = match share.enforcement(self.t) {
                Enforcement::Open => Verdict::Open,
                Enforcement::Limit { .. } => Verdict::Meter(bucket),
            };
            let c = self.arrivals.run(self.t, end, verdict);
            if !self.granted {
                self.tick_bootstrap += c.admitted;
            }
            self.since_report.add(c);
            self.offered_total += c.offered;
            self.tick.add(c);
            self.t = end;
        }
    }

    /// The report a host sends now: offered per second since its last report, and the
    /// share it holds (as limiter-user reports it: 0 in BOOTSTRAP and FAIL_OPEN).
    fn report(&mut self, now: u64, quiet: bool) -> Option<(Report, Usage)> {
        let share = self.share.as_ref()?;
        let elapsed = now.saturating_sub(self.last_report).max(1);
        let demand =
            u128::from(self.since_report.offered) * u128::from(NS_PER_S) / u128::from(elapsed);
        let demand = u64::try_from(demand).unwrap_or(u64::MAX);
        let demand = if quiet {
            // Seen at every metrics tick, and here too (untracked rules are seen once a
            // second only: a silence would be measured from the whole second).
            self.quiet.observe(self.offered_total, now);
            self.quiet.demand(self.since_report.offered, demand, now)
        } else {
            demand
        };
        let held = match share.state(now) {
            ShareState::Leased | ShareState::Sticky => share.rate(),
            ShareState::Standalone | ShareState::Bootstrap | ShareState::FailOpen => 0,
        };
        let credited = self.bucket.as_ref().map_or(0, |b| b.credited);
        let usage = Usage {
            admitted: self.since_report.admitted,
            denials: self.since_report.dropped(),
            credited: credited - self.credited_at_report,
            credit: self.last_credit,
        };
        self.credited_at_report = credited;
        self.since_report = Counts::default();
        self.last_report = now;
        Some((Report { demand, held }, usage))
    }
}

struct Rule {
    tenant: Tenant,
    pairs: Vec<Pair>,
    allocator: RuleAllocator,
    series: RuleSeries,
    second: Counts,
}

struct InFlight<T> {
    at: u64,
    rule: u32,
    pair: u32,
    msg: T,
}

pub struct Fleet {
    sc: Scenario,
    rules: Vec<Rule>,
    names: Vec<String>,
    /// (rule, pair) by report phase group.
    groups: Vec<Vec<(u32, u32)>>,
    first_frames: BinaryHeap<Reverse<(u64, u32, u32)>>,
    /// FAIL_OPEN retries due: (at, rule, pair).
    retries: BinaryHeap<Reverse<(u64, u32, u32)>>,
    /// The retries' loop-tick jitter.
    jitter: Rng,
    reports: VecDeque<InFlight<(Report, Option<Usage>)>>,
    grants: VecDeque<InFlight<Grant>>,
    allocator_up: bool,
    stats: AllocatorStats,
    batch: Vec<(u32, u32)>,
    frames: u64,
}

fn new_allocator(t: &Tenant, sc: &Scenario, now: u64) -> RuleAllocator {
    let mut r = RuleAllocator::new(t.quota, t.burst, sc.params.lease_ttl, now);
    r.refresh_ns = limiter_fleet::alloc::refresh_for(sc.params.report_interval);
    if sc.credit != CreditMode::Off {
        r.credit_cap =
            limiter_fleet::alloc::credit_cap_for(t.quota, sc.params.report_interval, sc.credit_pct);
    }
    r.credit_idle_unused = sc.credit_idle_unused;
    if sc.learning_joiners {
        r.learning_joiner_share = Share::bootstrap_rate(t.quota, sc.params.fleet_size);
        r.fleet_size = sc.params.fleet_size;
    }
    r
}

impl Fleet {
    pub fn new(sc: &Scenario) -> Result<Fleet> {
        let mut seen = vec![vec![false; sc.hosts as usize]; sc.tenants.len()];
        for e in &sc.events {
            if let Action::Demand { tenant, hosts, .. } = &e.action {
                let row = seen
                    .get_mut(*tenant)
                    .with_context(|| format!("event for unknown tenant {tenant}"))?;
                for h in hosts.clone() {
                    *row.get_mut(h as usize)
                        .with_context(|| format!("host {h} beyond the fleet of {}", sc.hosts))? =
                        true;
                }
            }
        }
        let mut weight_rng = Rng::new(sc.seed ^ 0x5eed);
        let weights: Vec<Vec<f64>> = (0..sc.tenants.len())
            .map(|_| {
                (0..sc.hosts)
                    .map(|_| weight_rng.range(1.0 - sc.weight_spread, 1.0 + sc.weight_spread))
                    .collect()
            })
            .collect();
        let groups_n = sc.phase_groups.max(1) as usize;
        let mut groups = vec![Vec::new(); groups_n];
        let mut rules = Vec::new();
        for (ri, t) in sc.tenants.iter().enumerate() {
            let mut pairs = Vec::new();
            for h in 0..sc.hosts {
                if !seen[ri][h as usize] {
                    continue;
                }
                groups[h as usize % groups_n].push((ri as u32, pairs.len() as u32));
                pairs.push(Pair {
                    host: h,
                    weight: weights[ri][h as usize],
                    arrivals: Arrivals::new(
                        Rng::derive(sc.seed, ri as u64, u64::from(h)),
                        sc.dense_above,
                    ),
                    share: None,
                    bucket: None,
                    granted: false,
                    t: EPOCH,
                    pending: false,
                    since_report: Counts::default(),
                    last_report: EPOCH,
                    tick: Counts::default(),
                    tick_bootstrap: 0,
                    credited_at_report: 0,
                    last_credit: 0,
                    tick_joined: false,
                    retrying: false,
                    offered_total: 0,
                    quiet: Quiet::default(),
                });
            }
            rules.push(Rule {
                tenant: t.clone(),
                pairs,
                allocator: new_allocator(t, sc, 0),
                series: RuleSeries {
                    name: t.name.clone(),
                    quota: t.quota,
                    burst: t.burst,
                    fail_mode: t.fail_mode,
                    tracked: t.tracked,
                    seconds: Vec::new(),
                    ticks: Vec::new(),
                    misplaced: Vec::new(),
                },
                second: Counts::default(),
            });
        }
        Ok(Fleet {
            sc: sc.clone(),
            rules,
            names: (0..sc.hosts).map(|h| format!("lb{h:03}")).collect(),
            groups,
            first_frames: BinaryHeap::new(),
            retries: BinaryHeap::new(),
            jitter: Rng::new(sc.seed ^ 0x7e7a),
            reports: VecDeque::new(),
            grants: VecDeque::new(),
            allocator_up: true,
            stats: AllocatorStats::default(),
            batch: Vec::new(),
            frames: 0,
        })
    }

    /// Every configured rule bootstraps when the daemons start, and each daemon reports
    /// at once.
    fn start_daemons(&mut self, now: u64) -> Result<()> {
        for r in 0..self.rules.len() {
            for p in 0..self.rules[r].pairs.len() {
                self.bootstrap(r as u32, p as u32, now)?;
                self.send_report(r as u32, p as u32, now, false);
            }
        }
        Ok(())
    }

    fn bootstrap(&mut self, r: u32, p: u32, at: u64) -> Result<()> {
        let rule = &mut self.rules[r as usize];
        let t = &rule.tenant;
        let pair = &mut rule.pairs[p as usize];
        let share = Share::bootstrap(t.quota, t.fail_mode, self.sc.params, at);
        pair.bucket = Some(
            Bucket::new(share.rate(), share.burst())
                .with_context(|| format!("bootstrap bucket of {}", t.name))?,
        );
        pair.share = Some(share);
        pair.credited_at_report = 0;
        pair.tick_joined = true;
        pair.t = at;
        pair.last_report = at;
        pair.since_report = Counts::default();
        Ok(())
    }

    /// Runs the scenario to its end.
    pub fn run(mut self) -> Result<Run> {
        let started = Instant::now();
        if self.sc.share_start == ShareStart::DaemonStart {
            self.start_daemons(EPOCH)?;
        }
        let interval = ns(self.sc.params.report_interval).max(STEP);
        // Phases on whole steps, so that every group's time comes.
        let phase = (interval / self.groups.len() as u64 / STEP).max(1) * STEP;
        let mut next_event = 0;
        let mut now = EPOCH;
        while now <= EPOCH + self.sc.duration {
            let elapsed = now - EPOCH;
            while let Some(e) = self.sc.events.get(next_event).filter(|e| e.at <= elapsed) {
                let action = e.action.clone();
                next_event += 1;
                self.apply(&action, now)?;
            }
            self.first_frames(now)?;
            self.retries(now);
            self.deliver_grants(now)?;
            let rem = elapsed % interval;
            if rem.is_multiple_of(phase) {
                let g = (rem / phase) as usize;
                if g < self.groups.len() {
                    let group = std::mem::take(&mut self.groups[g]);
                    for &(r, p) in &group {
                        if !self.rules[r as usize].pairs[p as usize].retrying {
                            self.send_report(r, p, now, false);
                        }
                    }
                    self.groups[g] = group;
                }
            }
            self.allocator(now);
            if elapsed > 0 && elapsed.is_multiple_of(TICK) {
                self.flush(now, elapsed.is_multiple_of(NS_PER_S))?;
            }
            now += STEP;
        }
        let rules = self.rules.into_iter().map(|r| r.series).collect();
        Ok(Run {
            scenario: self.sc,
            rules,
            allocator: self.stats,
            tick_ns: TICK,
            frames: self.frames,
            wall: started.elapsed(),
        })
    }

    fn apply(&mut self, action: &Action, now: u64) -> Result<()> {
        match action {
            Action::Demand {
                tenant,
                hosts,
                rate,
            } => {
                let rule = self
                    .rules
                    .get_mut(*tenant)
                    .with_context(|| format!("demand for unknown tenant {tenant}"))?;
                for (pi, pair) in rule.pairs.iter_mut().enumerate() {
                    if !hosts.contains(&pair.host) {
                        continue;
                    }
                    pair.advance(now);
                    pair.arrivals.set_rate(rate * pair.weight, now);
                    if self.sc.share_start == ShareStart::FirstFrame
                        && pair.share.is_none()
                        && !pair.pending
                    {
                        if let Some(at) = pair.arrivals.first_arrival(now) {
                            pair.pending = true;
                            self.first_frames
                                .push(Reverse((at, *tenant as u32, pi as u32)));
                        }
                    }
                }
            }
            Action::AllocatorDown => self.allocator_up = false,
            Action::AllocatorUp { restart } => {
                self.allocator_up = true;
                if *restart {
                    for r in &mut self.rules {
                        r.allocator = new_allocator(&r.tenant, &self.sc, now);
                    }
                }
            }
        }
        Ok(())
    }

    /// A host sees a rule's first frame: BOOTSTRAP, and a report at once.
    fn first_frames(&mut self, now: u64) -> Result<()> {
        while let Some(&Reverse((at, r, p))) = self.first_frames.peek() {
            if at > now {
                break;
            }
            self.first_frames.pop();
            let pair = &mut self.rules[r as usize].pairs[p as usize];
            pair.pending = false;
            if pair.share.is_some() || pair.arrivals.rate <= 0.0 {
                continue;
            }
            self.bootstrap(r, p, at)?;
            self.send_report(r, p, now, true);
        }
        Ok(())
    }

    /// FAIL_OPEN retries that are due: the pair reports again if it still fails open
    /// (a grant since moved it out).
    fn retries(&mut self, now: u64) {
        while let Some(&Reverse((at, r, p))) = self.retries.peek() {
            if at > now {
                break;
            }
            self.retries.pop();
            let pair = &mut self.rules[r as usize].pairs[p as usize];
            pair.retrying = false;
            let still = pair
                .share
                .as_ref()
                .is_some_and(|s| s.state(now) == ShareState::FailOpen);
            if still {
                self.send_report(r, p, now, false);
            }
        }
    }

    /// Sends a pair's report; `first`: the bootstrap request, which claims the
    /// bootstrap rate as demand (nothing has been measured yet).
    fn send_report(&mut self, r: u32, p: u32, now: u64, first: bool) {
        let rule = &mut self.rules[r as usize];
        let fleet = self.sc.params.fleet_size;
        let pair = &mut rule.pairs[p as usize];
        if pair.share.is_none() {
            return;
        }
        pair.advance(now);
        if let (Some(share), Some(bucket)) = (&pair.share, &mut pair.bucket) {
            // A report that fails (the allocator unreachable: a leader's crash) re-arms
            // the last grant's credit while its lease holds, as the next grant would
            // have (the simulator knows at once; the daemon when the call fails).
            if self.sc.credit == CreditMode::Bank
                && self.sc.credit_rearm
                && !first
                && !self.allocator_up
                && share.state(now) == ShareState::Leased
            {
                bucket.credit = pair.last_credit;
            }
        }
        // A daemon whose share fails open retries a failed report FAIL_OPEN_RETRY_MS
        // after the failure (a round trip: the refused connection), on its 50 ms loop:
        // due then plus up to 50 ms, so the hosts' retries do not line up.
        let retry = self.sc.fail_open_retry
            && !pair.retrying
            && pair
                .share
                .as_ref()
                .is_some_and(|s| s.state(now) == ShareState::FailOpen);
        let Some((mut report, usage)) = pair.report(now, self.sc.quiet_reports) else {
            return;
        };
        if retry {
            pair.retrying = true;
            let tick = (self.jitter.unit() * (50 * MS) as f64) as u64;
            let at = now + self.sc.rtt + FAIL_OPEN_RETRY_MS * MS + tick;
            self.retries.push(Reverse((at, r, p)));
        }
        if first {
            report.demand = Share::bootstrap_rate(rule.tenant.quota, fleet);
        }
        self.reports.push_back(InFlight {
            at: now + self.sc.rtt / 2,
            rule: r,
            pair: p,
            msg: (report, (!first).then_some(usage)),
        });
    }

    /// Reports that reached the allocator: recorded, then each reporter answered with
    /// its grant, if it gets one (`grants_for`: what limiter-allocator's `grant_for`
    /// per report gives, with one allocation per rule per batch).
    fn allocator(&mut self, now: u64) {
        self.batch.clear();
        while let Some(m) = self.reports.front().filter(|m| m.at <= now) {
            let (r, p, (report, usage)) = (m.rule, m.pair, m.msg);
            self.reports.pop_front();
            if !self.allocator_up {
                self.stats.lost_reports += 1;
                continue;
            }
            let rule = &mut self.rules[r as usize];
            let host = rule.pairs[p as usize].host as usize;
            rule.allocator
                .report_usage(&self.names[host], report, usage, now);
            let second = ((now - EPOCH) / NS_PER_S) as usize;
            if self.stats.reports.len() <= second {
                self.stats.reports.resize(second + 1, 0);
            }
            self.stats.reports[second] += 1;
            self.batch.push((r, p));
        }
        if self.batch.is_empty() {
            return;
        }
        self.batch.sort_unstable();
        let mut i = 0;
        while i < self.batch.len() {
            let r = self.batch[i].0;
            let end = i + self.batch[i..].iter().take_while(|b| b.0 == r).count();
            let rule = &mut self.rules[r as usize];
            let hosts: Vec<&str> = self.batch[i..end]
                .iter()
                .map(|&(_, p)| self.names[rule.pairs[p as usize].host as usize].as_str())
                .collect();
            let grants = rule.allocator.grants_for(&hosts, now);
            self.stats.computations += 1;
            for (&(_, p), g) in self.batch[i..end].iter().zip(grants) {
                if let Some(g) = g {
                    self.stats.grants += 1;
                    self.grants.push_back(InFlight {
                        at: now + self.sc.rtt - self.sc.rtt / 2,
                        rule: r,
                        pair: p,
                        msg: g,
                    });
                }
            }
            i = end;
        }
    }

    /// Grants that reached their host: the share is LEASED; the bucket takes the new
    /// rate and burst and keeps its TAT, except when the grant takes over
    /// ([`Share::takes_over`]: out of BOOTSTRAP, FAIL_OPEN, a zero grant or a burst of
    /// 1), where the grant's token count (≤ 1; 0 for a
    /// zero grant) is set: a grant never hands out a fresh burst. This is what
    /// limiter-user does.
    fn deliver_grants(&mut self, now: u64) -> Result<()> {
        let credit = self.sc.credit;
        while let Some(m) = self.grants.front().filter(|m| m.at <= now) {
            let (r, p, grant) = (m.rule, m.pair, m.msg);
            self.grants.pop_front();
            let pair = &mut self.rules[r as usize].pairs[p as usize];
            pair.advance(now);
            let (Some(share), Some(bucket)) = (&mut pair.share, &mut pair.bucket) else {
                continue;
            };
            let takes_over = share.takes_over(&grant, now);
            share.on_grant(&grant, now);
            bucket
                .set_limit(share.rate(), share.burst())
                .context("applying a grant")?;
            if takes_over {
                bucket.set_tokens(now, grant.tokens.min(1));
            }
            match credit {
                CreditMode::Off => {}
                CreditMode::Bank => bucket.credit = grant.credit,
                CreditMode::Tokens => {
                    bucket.add_tokens(now, grant.credit);
                }
            }
            pair.granted = true;
            pair.last_credit = grant.credit;
        }
        Ok(())
    }

    /// A metrics tick: every tracked rule's pairs are brought up to `now` and summed
    /// (and the others' too on whole seconds); out-of-cycle reports go out.
    ///
    /// A closed share whose lease lapsed and that refused frames since its last report
    /// rejoins ([`Share::rejoin`]: BOOTSTRAP, one token) and asks for a grant at once, as
    /// the daemon does on its 50 ms poll (here at the metrics tick).
    fn flush(&mut self, now: u64, whole_second: bool) -> Result<()> {
        let gap = self.sc.early_report_gap;
        let rejoin = self.sc.rejoin;
        let quiet = self.sc.quiet_reports;
        let mut early = Vec::new();
        let mut rejoined = Vec::new();
        for (ri, rule) in self.rules.iter_mut().enumerate() {
            if !rule.tenant.tracked && !whole_second {
                continue;
            }
            let mut tick = Tick::default();
            for (pi, pair) in rule.pairs.iter_mut().enumerate() {
                pair.advance(now);
                pair.quiet.observe(pair.offered_total, now);
                tick.offered += pair.tick.offered;
                tick.admitted += pair.tick.admitted;
                tick.bootstrap_admitted += pair.tick_bootstrap;
                tick.joins += u32::from(pair.tick_joined);
                pair.tick = Counts::default();
                pair.tick_bootstrap = 0;
                pair.tick_joined = false;
                let Some(share) = &pair.share else { continue };
                let state = share.state(now);
                let i = state_index(state);
                tick.hosts[i] += 1;
                tick.shares[i] += share.rate();
                if state == ShareState::Leased
                    && (share.wants_early_report(pair.since_report.dropped(), now)
                        || quiet && (pair.quiet.left(now) || pair.quiet.resumed()))
                    && now - pair.last_report >= gap
                {
                    early.push((ri as u32, pi as u32));
                }
                let denials = pair.since_report.dropped();
                if rejoin && state == ShareState::Sticky && share.rate() == 0 && denials > 0 {
                    if let (Some(share), Some(bucket)) = (&mut pair.share, &mut pair.bucket) {
                        if share.rejoin(denials, now) {
                            rejoined.push((ri as u32, pi as u32));
                            bucket.set_limit(share.rate(), share.burst())?;
                            bucket.set_tokens(now, 1);
                            // From here it is a joiner: what it admits is bootstrap.
                            pair.granted = false;
                            pair.tick_joined = true;
                        }
                    }
                }
            }
            self.frames += tick.offered;
            rule.second.add(Counts {
                offered: tick.offered,
                admitted: tick.admitted,
            });
            if rule.tenant.tracked {
                rule.series.ticks.push(tick);
            }
            if whole_second {
                rule.series.seconds.push(rule.second);
                rule.second = Counts::default();
                if rule.tenant.tracked {
                    let m = misplaced(rule, now);
                    rule.series.misplaced.push(m);
                }
            }
        }
        self.stats.early_reports += early.len() as u64;
        for (r, p) in early {
            self.send_report(r, p, now, false);
        }
        self.stats.rejoins += rejoined.len() as u64;
        for (r, p) in rejoined {
            self.send_report(r, p, now, true);
        }
        Ok(())
    }
}

/// The fraction of the quota held by the wrong hosts (see [`RuleSeries::misplaced`]).
fn misplaced(rule: &Rule, now: u64) -> f64 {
    let demands: Vec<u64> = rule
        .pairs
        .iter()
        .map(|p| p.arrivals.rate.round() as u64)
        .collect();
    let ideal = allocate(rule.tenant.quota, &demands);
    let off: u64 = rule
        .pairs
        .iter()
        .zip(&ideal)
        .map(|(p, a)| {
            let held = match &p.share {
                None => 0,
                Some(s) => match s.enforcement(now) {
                    Enforcement::Limit { rate, .. } => rate,
                    Enforcement::Open => p.arrivals.rate.round() as u64,
                },
            };
            held.abs_diff(a.share)
        })
        .sum();
    off as f64 / (2 * rule.tenant.quota.max(1)) as f64
}

/// Runs one scenario.
pub fn simulate(sc: &Scenario) -> Result<Run> {
    Fleet::new(sc)
        .with_context(|| format!("setting up scenario {}", sc.name))?
        .run()
        .with_context(|| format!("running scenario {}", sc.name))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use limiter_fleet::share::ShareParams;

    use super::*;
    use crate::{
        scenario::{allocator, demand, Knobs},
        time::S,
    };

    fn small(hosts: u32, quota: u64, rate: f64) -> Scenario {
        let k = Knobs {
            params: ShareParams {
                fleet_size: hosts,
                sticky_max: Duration::from_secs(10),
                ..ShareParams::default()
            },
            ..Knobs::quick()
        };
        let mut s = Scenario::new(&k, "small", "small", "");
        s.hosts = hosts;
        s.phase_groups = hosts;
        s.tenants.truncate(1);
        s.tenants[0].quota = quota;
        s.tenants[0].burst = quota;
        s.events.push(demand(0, 0, 0..hosts, rate));
        s
    }

    #[test]
    fn a_saturated_rule_admits_its_quota() {
        let run = simulate(&small(4, 400, 150.0).finish(40 * S)).unwrap();
        let r = &run.rules[0];
        let admitted: u64 = r.seconds[10..40].iter().map(|c| c.admitted).sum();
        let offered: u64 = r.seconds[10..40].iter().map(|c| c.offered).sum();
        assert!(offered > 30 * 500, "offered {offered}");
        let rate = admitted as f64 / 30.0;
        assert!((390.0..=404.0).contains(&rate), "admitted {rate}/s");
        // All LEASED; grants in force never above the quota (the allocator caps each
        // grant by what the others hold, so under noisy demand they sum to a bit less).
        for t in &r.ticks[100..] {
            assert_eq!(t.hosts[state_index(ShareState::Leased)], 4);
            assert!((300..=400).contains(&t.shares[state_index(ShareState::Leased)]));
        }
        assert!(run.allocator.grants > 0 && run.allocator.lost_reports == 0);
    }

    #[test]
    fn without_an_allocator_the_ladder_runs_on_time() {
        let mut s = small(3, 300, 50.0);
        // The learning period as it was: BOOTSTRAP hosts get nothing while it learns
        // (with `learning_joiners` they would be LEASED at the bootstrap share at once).
        s.learning_joiners = false;
        // The allocator goes down at 8 s, not 5 s: it heard no report for the 60 s before
        // the scenario (EPOCH), so since limiter-fleet f8c2187 the first report puts it
        // back into learning for a lease TTL, and BOOTSTRAP hosts (held 0) get no grant
        // while it learns. The hosts are first LEASED at 3.35–4.05 s, and a first grant
        // out of BOOTSTRAP sets ≤ 1 token, so the denials that follow send an early
        // report (host 0 at 4.2 s). By 7 s every host renews on its own timer again.
        s.events
            .push(allocator(8 * S, Action::AllocatorDown, "down"));
        let run = simulate(&s.finish(28 * S)).unwrap();
        let r = &run.rules[0];
        // ticks[i] ends at (i + 1) × 100 ms.
        let at = |t: f64, state: ShareState| {
            r.ticks[(t * 10.0).round() as usize - 1].hosts[state_index(state)]
        };
        // The start-up learning period: no grant yet, everyone still in BOOTSTRAP.
        assert_eq!(at(3.3, ShareState::Bootstrap), 3);
        // The hosts report at 7.0, 7.33 and 7.67 s (the reports at 8 s are lost) and get
        // their last grants 50 ms later; then a 3 s lease and a 10 s sticky period.
        assert_eq!(at(10.0, ShareState::Leased), 3);
        assert_eq!(at(10.2, ShareState::Sticky), 1);
        assert_eq!(at(10.5, ShareState::Sticky), 2);
        assert_eq!(at(10.8, ShareState::Sticky), 3);
        assert_eq!(at(19.9, ShareState::Sticky), 3);
        assert_eq!(at(20.8, ShareState::FailOpen), 3);
        // FAIL_OPEN admits everything offered.
        let c = r.seconds[23];
        assert_eq!(c.admitted, c.offered);
        assert!(run.allocator.lost_reports > 0);
    }

    #[test]
    fn a_learning_allocator_leases_joiners_at_the_bootstrap_share() {
        // The second case below with `learning_joiners`: the host's first report finds the
        // allocator learning and gets the bootstrap share (quota ÷ fleet_size = 100/s) at
        // once, LEASED, instead of waiting a lease TTL in BOOTSTRAP.
        let mut s = small(2, 200, 0.0);
        s.events.push(demand(2 * S, 0, 0..1, 50.0));
        let run = simulate(&s.finish(7 * S)).unwrap();
        let r = &run.rules[0];
        let state = |i: usize, state: ShareState| r.ticks[i].hosts[state_index(state)];
        // The first frame comes in the tick ending at 2.1 s, the grant a round trip later.
        let leased = (19..30)
            .find(|&i| state(i, ShareState::Leased) == 1)
            .unwrap();
        assert!(leased <= 21, "leased at tick {leased}");
        assert_eq!(r.ticks[leased].shares[state_index(ShareState::Leased)], 100);
        assert_eq!(state(29, ShareState::Bootstrap), 0);
    }

    #[test]
    fn a_first_frame_bootstraps_and_asks_at_once() {
        // Host 1 carries the rule from the start, so the allocator hears it every report
        // interval (as it hears every configured rule from limiter-user, idle or not);
        // host 0's first frame comes at 5 s, after the start-up learning period (see the
        // ladder test). It used to come at 2 s with no other traffic, but since
        // limiter-fleet f8c2187 a rule the allocator heard nothing about for a lease TTL
        // is learned again first: that case is the second run below.
        let mut s = small(2, 200, 0.0);
        // As in the ladder test: no joiner's share while learning.
        s.learning_joiners = false;
        s.events.push(demand(0, 0, 1..2, 20.0));
        s.events.push(demand(5 * S, 0, 0..1, 50.0));
        let run = simulate(&s.finish(7 * S)).unwrap();
        let r = &run.rules[0];
        let hosts = |i: usize| r.ticks[i].hosts;
        // Host 0 has nothing before its first frame; it is in BOOTSTRAP for about a
        // round trip (50 ms) after it; then LEASED (host 1 too).
        assert_eq!(hosts(49)[state_index(ShareState::Leased)], 1);
        assert_eq!(hosts(49).iter().sum::<u32>(), 1);
        let leased = (50..70)
            .find(|&i| hosts(i)[state_index(ShareState::Leased)] == 2)
            .unwrap();
        assert!(leased <= 52, "leased at tick {leased}");

        // The first report of the rule in 62 s (no host had a share before): the
        // allocator learns for a lease TTL from its arrival (62.025 s), and a host in
        // BOOTSTRAP holds nothing to renew, so no grant until the report after 65.025 s.
        let mut s = small(2, 200, 0.0);
        s.learning_joiners = false;
        s.events.push(demand(2 * S, 0, 0..1, 50.0));
        let run = simulate(&s.finish(7 * S)).unwrap();
        let r = &run.rules[0];
        let state = |i: usize, state: ShareState| r.ticks[i].hosts[state_index(state)];
        assert_eq!(state(19, ShareState::Bootstrap), 0);
        assert_eq!(state(20, ShareState::Bootstrap), 1);
        assert_eq!(state(59, ShareState::Bootstrap), 1);
        assert_eq!(state(60, ShareState::Leased), 1);
    }
}
