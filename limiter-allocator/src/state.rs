//! The allocator's state: one `RuleAllocator` per rule, fed by reports, producing
//! grants. No I/O here; the service and the control socket call in with `now`.

use std::{collections::HashMap, fmt::Write as _, time::Duration};

use limiter_fleet::alloc::{self, Report, RuleAllocator, Usage};
use limiter_proto::pb::{ReportReply, ReportRequest, RuleElsewhere, RuleGrant};

use crate::{
    config::{Quota, QuotaUnit},
    hosts::{HostLimits, HostTable, Refusal},
};

pub struct State {
    /// By name, hashed: a report looks up every rule it carries, thousands per report
    /// in a large fleet; listings sort.
    rules: HashMap<String, RuleAllocator>,
    hosts: HostTable,
    lease_ttl: Duration,
    report_interval: Duration,
    /// When this state began learning what hosts hold: the start, or the election won.
    learning_from: u64,
    pub reports: u64,
    /// Reports refused by the host table: a newcomer to a full fleet, a host over its
    /// report rate.
    pub refused_fleet_full: u64,
    pub refused_host_rate: u64,
    /// The term the grants carry: the election's, 0 without one.
    pub term: u64,
    /// Sharding (`[election] shards`): `None` grants every rule with a quota.
    shards: Option<Shards>,
    /// How a host that holds nothing (a joiner, or FAIL_OPEN after a long outage) is
    /// granted while a rule learns.
    fleet_size: JoinerSizing,
    /// Reports whose `fleet_size` differs from this allocator's configured one.
    pub fleet_size_disagreements: u64,
    /// Each rule's credit cap in % of what its quota admits in one report interval
    /// (`alloc::credit_cap_for`); 0: no credit.
    credit_pct: u64,
    /// Each rule's unit (`[[quotas]] unit`; a rule not named there counts packets, as
    /// a daemon's rule does): the metrics of its quota and grants say it.
    units: HashMap<String, QuotaUnit>,
    /// Reports of a rule in another unit than this allocator's (its hosts count bytes,
    /// its quota says packets, or the other way round).
    pub unit_disagreements: u64,
}

/// How metric names say a quota's unit (as the daemon's do): a rate in packets/s and one
/// in bytes/s never share a name.
pub const fn unit_name(unit: QuotaUnit) -> &'static str {
    match unit {
        QuotaUnit::Packets => "packets",
        QuotaUnit::Bytes => "bytes",
        QuotaUnit::Syn => "syn_packets",
    }
}

/// How a learning allocator sizes the share of a host that holds nothing: the
/// `fleet_size` the hosts enforce quota ÷ fleet_size by in BOOTSTRAP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JoinerSizing {
    /// Nothing while a rule learns (the host stays in BOOTSTRAP or FAIL_OPEN).
    Off,
    /// The allocator's own `fleet_size`: quota ÷ it for every host; a host whose own
    /// differs is told so in each reply.
    Configured(u32),
    /// No `fleet_size` in the allocator's file: each host's own, from its reports, at
    /// least the hosts heard from (a host that predates the field: the daemons'
    /// default), so that no number has to be written twice.
    Reported,
}

impl JoinerSizing {
    /// The share for a host that reports no fleet_size, of `quota`.
    fn default_share(self, quota: u64) -> u64 {
        match self {
            JoinerSizing::Off => 0,
            JoinerSizing::Configured(n) => limiter_fleet::share::Share::bootstrap_rate(quota, n),
            JoinerSizing::Reported => limiter_fleet::share::Share::bootstrap_rate(
                quota,
                limiter_fleet::share::DEFAULT_FLEET_SIZE,
            ),
        }
    }

    /// What a reply says (0: none configured).
    fn configured(self) -> u32 {
        match self {
            JoinerSizing::Configured(n) => n,
            JoinerSizing::Off | JoinerSizing::Reported => 0,
        }
    }
}

/// Sharding: this group's name and the rule → group assignment (as read from etcd).
#[derive(Clone, Debug, Default)]
struct Shards {
    group: String,
    assignment: HashMap<String, String>,
    /// When a rule moved here from another group: hosts may hold that group's grants,
    /// so a quota that arrives after the move still learns from then.
    moved_in: HashMap<String, u64>,
}

impl State {
    pub fn new(
        quotas: &[Quota],
        lease_ttl: Duration,
        report_interval: Duration,
        hosts: HostLimits,
        now: u64,
    ) -> State {
        let rules = quotas
            .iter()
            .map(|q| {
                let mut r = RuleAllocator::new(q.rate, q.burst, lease_ttl, now);
                r.refresh_ns = alloc::refresh_for(report_interval);
                r.gather_ns = alloc::gather_for(report_interval);
                (q.rule.clone(), r)
            })
            .collect();
        State {
            rules,
            hosts: HostTable::new(hosts),
            lease_ttl,
            report_interval,
            learning_from: now,
            reports: 0,
            refused_fleet_full: 0,
            refused_host_rate: 0,
            term: 0,
            shards: None,
            fleet_size: JoinerSizing::Off,
            fleet_size_disagreements: 0,
            credit_pct: 0,
            units: HashMap::new(),
            unit_disagreements: 0,
        }
    }

    /// What a rule's allocator takes from this state's settings: the joiner's share
    /// (`fleet_size`) and the credit cap (`credit_pct`), from its quota.
    fn tuning(&self) -> impl Fn(&mut RuleAllocator) {
        let (fleet_size, interval, pct) = (self.fleet_size, self.report_interval, self.credit_pct);
        move |r: &mut RuleAllocator| {
            r.learning_joiner_share = fleet_size.default_share(r.quota);
            r.joiner_from_reports = fleet_size == JoinerSizing::Reported;
            r.fleet_size = fleet_size.configured();
            r.credit_cap = alloc::credit_cap_for(r.quota, interval, pct);
        }
    }

    fn tune_all(&mut self) {
        let tune = self.tuning();
        self.rules.values_mut().for_each(tune);
    }

    /// Each rule's hosts may hold credits of up to `pct` % of what its quota admits in
    /// one report interval (quota the fleet left unused, lent to hosts that refused
    /// frames); 0 turns it off.
    pub fn set_credit_pct(&mut self, pct: u64) {
        self.credit_pct = pct;
        self.tune_all();
    }

    /// Each rule's unit (`[[quotas]] unit`); rules not in `units` count packets.
    pub fn set_units(&mut self, units: HashMap<String, QuotaUnit>) {
        self.units = units;
    }

    /// While a rule learns, hosts that hold nothing get quota ÷ the `fleet_size` of
    /// [`JoinerSizing`] (the share a joiner enforces by itself) at once.
    pub fn set_fleet_size(&mut self, fleet_size: JoinerSizing) {
        self.fleet_size = fleet_size;
        self.tune_all();
    }

    /// Sharding on: this state's group is `group`, and it grants only the rules the
    /// assignment gives it (none until [`State::assign`] or [`State::replace_assignment`]).
    pub fn shard_as(&mut self, group: &str) {
        self.shards = Some(Shards {
            group: group.to_string(),
            ..Shards::default()
        });
    }

    /// Whether this state grants `rule` (it may still have no quota for it): always
    /// without sharding, else when the rule is assigned to its group.
    pub fn owns(&self, rule: &str) -> bool {
        match &self.shards {
            None => true,
            Some(s) => s.assignment.get(rule) == Some(&s.group),
        }
    }

    /// The assignment (rule, group), by rule; empty without sharding.
    pub fn assignment(&self) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = self
            .shards
            .iter()
            .flat_map(|s| s.assignment.iter())
            .map(|(r, g)| (r.clone(), g.clone()))
            .collect();
        out.sort();
        out
    }

    /// `rule` is now assigned to `group` (`None`: to no group). A rule that moves here
    /// from another group learns for one lease TTL (its hosts hold that group's
    /// grants: renewed, never added to); one that moves away is forgotten, so it learns
    /// again if it ever comes back. Without sharding, nothing happens.
    pub fn assign(&mut self, rule: &str, group: Option<&str>, now: u64) {
        let Some(shards) = &mut self.shards else {
            return;
        };
        let old = match group {
            Some(g) => shards.assignment.insert(rule.to_string(), g.to_string()),
            None => shards.assignment.remove(rule),
        };
        let was_mine = old.as_deref() == Some(shards.group.as_str());
        let is_mine = group == Some(shards.group.as_str());
        if was_mine == is_mine {
            return;
        }
        if is_mine && old.is_some() {
            shards.moved_in.insert(rule.to_string(), now);
        } else {
            shards.moved_in.remove(rule);
        }
        // Learning from `now` whichever way it moved: into this group, what hosts hold
        // comes from the other; out of it, the rule's hosts are no longer this group's.
        // A rule assigned here from no group was granted by nobody: no learning.
        let learn = !(is_mine && old.is_none());
        if let Some(r) = self.rules.get_mut(rule) {
            let mut fresh = if learn {
                RuleAllocator::new(r.quota, r.burst, self.lease_ttl, now)
            } else {
                RuleAllocator::added(r.quota, r.burst, self.lease_ttl, self.learning_from, now)
            };
            fresh.refresh_ns = r.refresh_ns;
            fresh.gather_ns = r.gather_ns;
            fresh.learning_joiner_share = r.learning_joiner_share;
            fresh.joiner_from_reports = r.joiner_from_reports;
            fresh.fleet_size = r.fleet_size;
            fresh.credit_cap = r.credit_cap;
            *r = fresh;
        }
    }

    /// Makes the assignment exactly `assignment` (rule → group), each change as by
    /// [`State::assign`].
    pub fn replace_assignment(&mut self, assignment: &HashMap<String, String>, now: u64) {
        let current: Vec<String> = self
            .shards
            .iter()
            .flat_map(|s| s.assignment.keys().cloned())
            .collect();
        for rule in current {
            if !assignment.contains_key(&rule) {
                self.assign(&rule, None, now);
            }
        }
        for (rule, group) in assignment {
            self.assign(rule, Some(group), now);
        }
    }

    /// Whether `host` may report now (the host table: `max_hosts`, its report rate);
    /// counts the refusals. Cheap: call it before [`State::handle`].
    pub fn admit(&mut self, host: &str, now: u64) -> Result<(), Refusal> {
        let result = self.hosts.admit(host, now);
        match result {
            Err(Refusal::FleetFull { .. }) => self.refused_fleet_full += 1,
            Err(Refusal::RateLimited { .. }) => self.refused_host_rate += 1,
            Ok(()) => {}
        }
        result
    }

    /// Takes a validated report; returns the host's grants. Rules without a quota get no
    /// grant (the host keeps bootstrapping them).
    pub fn handle(&mut self, req: &ReportRequest, now: u64) -> ReportReply {
        self.reports += 1;
        let configured = self.fleet_size.configured();
        if configured != 0 && req.fleet_size != 0 && req.fleet_size != configured {
            self.fleet_size_disagreements += 1;
        }
        let mut grants = Vec::new();
        let mut elsewhere = Vec::new();
        for r in &req.rules {
            if let Some(shards) = &self.shards {
                match shards.assignment.get(&r.rule) {
                    Some(g) if *g == shards.group => {}
                    Some(g) => {
                        elsewhere.push(RuleElsewhere {
                            rule: r.rule.clone(),
                            group: g.clone(),
                        });
                        continue;
                    }
                    // Assigned to no group: nobody grants it (the host bootstraps).
                    None => continue,
                }
            }
            let Some(rule) = self.rules.get_mut(&r.rule) else {
                continue;
            };
            // A host that predates the field says nothing; a word this version does not
            // know is no disagreement either.
            if let Ok(unit) = r.unit.parse::<QuotaUnit>() {
                if unit
                    != self
                        .units
                        .get(&r.rule)
                        .copied()
                        .unwrap_or(QuotaUnit::Packets)
                {
                    self.unit_disagreements += 1;
                }
            }
            // The credit's inputs only from a host that sends them: an absent count is
            // not a host that admitted nothing (limiter-proto's RuleReport).
            let usage = r.admitted.map(|admitted| Usage {
                admitted,
                denials: r.denials,
                credited: r.credited.unwrap_or(0),
                credit: r.credit.unwrap_or(0),
            });
            rule.report_usage(
                &req.host,
                Report {
                    demand: r.demand,
                    held: r.held,
                },
                usage,
                now,
            );
            rule.set_reported_fleet_size(&req.host, req.fleet_size);
            if let Some(g) = rule.grant_for(&req.host, now) {
                grants.push(RuleGrant {
                    rule: r.rule.clone(),
                    rate: g.rate,
                    burst: g.burst,
                    tokens: g.tokens,
                    ttl_ms: g.ttl.as_millis() as u64,
                    saturated: g.saturated,
                    credit: g.credit,
                });
            }
        }
        ReportReply {
            grants,
            report_interval_ms: self.report_interval.as_millis() as u64,
            term: self.term,
            elsewhere,
            fleet_size: configured,
        }
    }

    /// The state a newly elected leader starts from: the same quotas and bounds, every
    /// rule learning for one lease TTL from `now` (hosts may hold the previous leader's
    /// grants), no host known; the counters carry on (Prometheus counters never go down).
    pub fn restarted(&self, now: u64) -> State {
        let mut fresh = State::new(
            &self.quotas(),
            self.lease_ttl,
            self.report_interval,
            self.hosts.limits(),
            now,
        );
        fresh.learning_from = now;
        fresh.reports = self.reports;
        fresh.refused_fleet_full = self.refused_fleet_full;
        fresh.refused_host_rate = self.refused_host_rate;
        fresh.shards = self.shards.clone();
        fresh.fleet_size = self.fleet_size;
        fresh.fleet_size_disagreements = self.fleet_size_disagreements;
        fresh.credit_pct = self.credit_pct;
        fresh.units = self.units.clone();
        fresh.unit_disagreements = self.unit_disagreements;
        fresh.tune_all();
        fresh
    }

    /// Removes a rule's quota (deleted in etcd): its hosts get no grant for it, as for a
    /// rule never given a quota.
    pub fn remove_quota(&mut self, rule: &str) {
        self.rules.remove(rule);
    }

    /// Changes (or adds) a rule's global quota; hosts see it in their next grants.
    pub fn set_quota(&mut self, q: &Quota, now: u64) {
        let tune = self.tuning();
        match self.rules.get_mut(&q.rule) {
            Some(r) => {
                r.quota = q.rate;
                r.burst = q.burst;
                tune(r);
            }
            None => {
                // A new rule needs no learning: no host holds a share of it from this
                // process (unless the process is in its own start-up learning period, or
                // the rule moved here from another group since then).
                let from = self
                    .shards
                    .as_ref()
                    .and_then(|s| s.moved_in.get(&q.rule).copied())
                    .map_or(self.learning_from, |moved| moved.max(self.learning_from));
                let mut r = RuleAllocator::added(q.rate, q.burst, self.lease_ttl, from, now);
                r.refresh_ns = alloc::refresh_for(self.report_interval);
                r.gather_ns = alloc::gather_for(self.report_interval);
                tune(&mut r);
                self.rules.insert(q.rule.clone(), r);
            }
        }
    }

    /// Every rule's quota, by rule name.
    pub fn quotas(&self) -> Vec<Quota> {
        let mut quotas: Vec<Quota> = self
            .rules
            .iter()
            .map(|(rule, r)| Quota {
                rule: rule.clone(),
                rate: r.quota,
                burst: r.burst,
            })
            .collect();
        quotas.sort_by(|a, b| a.rule.cmp(&b.rule));
        quotas
    }

    /// Prometheus text: per rule the quota, the sum of live grants, hosts, saturated
    /// hosts and a fairness index; reports and rejected reports.
    pub fn metrics(&mut self, now: u64) -> String {
        let mut out = self.rule_metrics(now);
        out.push_str(&self.counter_metrics(now));
        out
    }

    /// The per-rule gauges: each rule's allocation as of `now`, which costs a pass over
    /// its hosts (a refresh of the allocation when it is due). The metrics endpoint
    /// makes these at most once a second, however often it is scraped.
    pub fn rule_metrics(&mut self, now: u64) -> String {
        let mut out = String::new();
        // In the rule's unit: one name per unit, so no sum adds bytes to packets.
        let unit_families = [
            (
                "quota",
                "_per_second",
                "Global quota of the rule, per second, in the unit of the name (the quota's unit).",
            ),
            (
                "granted",
                "_per_second",
                "Sum of the shares granted and not lapsed, per second, in the unit of the name (never above the quota; a zero share is closed and counts 0).",
            ),
            (
                "credit_level",
                "",
                "The credit level, in the unit of the name: quota the fleet left unused while hosts refused frames, lent to them as grants' credit (at most the cap).",
            ),
            (
                "credit_cap",
                "",
                "The most credit the rule's hosts hold at once, in the unit of the name: credit_pct % of what the quota admits in one report interval (0: no credit).",
            ),
        ];
        let families = [
            (
                "limiter_allocator_hosts",
                "Hosts with a live report for the rule.",
            ),
            (
                "limiter_allocator_saturated_hosts",
                "Hosts whose demand exceeds their share.",
            ),
            (
                "limiter_allocator_fairness",
                "Jain's fairness index of share/demand over hosts (1 = equal).",
            ),
            (
                "limiter_allocator_learning",
                "1 while a freshly started allocator only renews what hosts hold.",
            ),
            (
                "limiter_allocator_assigned",
                "1 when this allocator's group grants the rule (always, without sharding).",
            ),
        ];
        let mut rows: Vec<(QuotaUnit, [f64; 4], [f64; 5])> = Vec::new();
        let mut names: Vec<String> = self.rules.keys().cloned().collect();
        names.sort();
        for name in &names {
            let owned = f64::from(u8::from(self.owns(name)));
            let unit = self.units.get(name).copied().unwrap_or(QuotaUnit::Packets);
            let Some(r) = self.rules.get_mut(name) else {
                continue;
            };
            let allocations = r.allocations(now);
            let demands = r.demands();
            rows.push((
                unit,
                [
                    r.quota as f64,
                    r.outstanding(now) as f64,
                    r.credit_level() as f64,
                    r.credit_cap as f64,
                ],
                [
                    r.hosts() as f64,
                    allocations.iter().filter(|a| a.saturated).count() as f64,
                    alloc::fairness_index(&demands, &allocations),
                    f64::from(u8::from(r.learning(now))),
                    owned,
                ],
            ));
        }
        for &unit in QuotaUnit::ALL {
            for (k, (what, per, help)) in unit_families.iter().enumerate() {
                let name = format!("limiter_allocator_{what}_{}{per}", unit_name(unit));
                let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
                for (rule, (_, values, _)) in
                    names.iter().zip(&rows).filter(|(_, (u, _, _))| *u == unit)
                {
                    let _ = writeln!(out, "{name}{{rule=\"{rule}\"}} {}", values[k]);
                }
            }
        }
        for (k, (name, help)) in families.iter().enumerate() {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
            for (rule, (_, _, values)) in names.iter().zip(&rows) {
                let _ = writeln!(out, "{name}{{rule=\"{rule}\"}} {}", values[k]);
            }
        }
        out
    }

    /// The allocator-wide counters and gauges: cheap, read live at every scrape.
    pub fn counter_metrics(&self, now: u64) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# HELP limiter_allocator_reports_total Reports handled.\n\
             # TYPE limiter_allocator_reports_total counter\nlimiter_allocator_reports_total {}",
            self.reports
        );
        let limits = self.hosts.limits();
        let _ = writeln!(
            out,
            "# HELP limiter_allocator_known_hosts Hosts that reported within a lease TTL (at most max_hosts).\n\
             # TYPE limiter_allocator_known_hosts gauge\nlimiter_allocator_known_hosts {}\n\
             # HELP limiter_allocator_max_hosts The max_hosts bound.\n\
             # TYPE limiter_allocator_max_hosts gauge\nlimiter_allocator_max_hosts {}",
            self.hosts.known(now),
            limits.max_hosts
        );
        let _ = writeln!(
            out,
            "# HELP limiter_allocator_fleet_size_disagreements_total Reports whose host's \
             fleet_size differs from this allocator's configured fleet_size (the hosts are told \
             in the reply; a joiner's share while learning is quota / the allocator's).\n\
             # TYPE limiter_allocator_fleet_size_disagreements_total counter\n\
             limiter_allocator_fleet_size_disagreements_total {}",
            self.fleet_size_disagreements
        );
        let _ = writeln!(
            out,
            "# HELP limiter_allocator_unit_disagreements_total Reports of a rule in another unit \
             than its quota's ([[quotas]] unit, default packets): the quota and grants are read \
             in the hosts' unit, the metrics name the quota's.\n\
             # TYPE limiter_allocator_unit_disagreements_total counter\n\
             limiter_allocator_unit_disagreements_total {}",
            self.unit_disagreements
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;
    const LIMITS: HostLimits = HostLimits {
        max_hosts: 16,
        ttl_ns: 3 * S,
        rate: 10,
        burst: 10,
    };

    /// A state started at 0 with `web`'s quota of 1000/s (burst 100), lease 3 s,
    /// reports every second.
    fn web_state() -> State {
        let quotas = [Quota {
            rule: "web".into(),
            rate: 1000,
            burst: 100,
        }];
        State::new(
            &quotas,
            Duration::from_secs(3),
            Duration::from_secs(1),
            LIMITS,
            0,
        )
    }

    fn req(host: &str, demand: u64, held: u64) -> ReportRequest {
        ReportRequest::one_rule(host, "web", demand, held)
    }

    /// With the daemons' fleet_size, a learning allocator grants a host that holds
    /// nothing a joiner's share at once, never more than the others leave, and follows a
    /// quota change and a new leader's fresh state.
    #[test]
    fn a_learning_allocator_grants_a_joiners_share_with_fleet_size() {
        let mut s = web_state();
        s.set_fleet_size(JoinerSizing::Configured(4));
        let g = &s.handle(&req("a", 100, 0), S).grants[0];
        assert_eq!((g.rate, g.tokens), (250, 1));
        // b says it holds 900 (within its fair share of the demands reported: 900):
        // renewed, but only to what a's 250 leave of the quota; c then finds nothing left.
        assert_eq!(s.handle(&req("b", 900, 900), S).grants[0].rate, 750);
        let c = s.handle(&req("c", 900, 0), S);
        assert_eq!(c.grants.first().map_or(0, |g| g.rate), 0, "{c:?}");
        s.set_quota(
            &Quota {
                rule: "web".into(),
                rate: 4000,
                burst: 100,
            },
            S,
        );
        let mut leader = s.restarted(2 * S);
        assert_eq!(leader.handle(&req("d", 900, 0), 2 * S).grants[0].rate, 1000);
        // Off (fleet_size 0): nothing while learning, as before.
        leader.set_fleet_size(JoinerSizing::Off);
        assert!(leader.handle(&req("e", 900, 0), 2 * S).grants.is_empty());
    }

    /// Without a fleet_size of its own, a learning allocator sizes a joiner's share by
    /// the fleet_size the host reports (a host that reports none: the daemons' default),
    /// and its replies name none; with one, it uses its own, names it, and counts the
    /// reports of hosts that disagree.
    #[test]
    fn a_joiners_share_follows_the_hosts_fleet_size_unless_the_allocator_names_one() {
        let sized = |host: &str, fleet_size: u32| ReportRequest {
            fleet_size,
            ..req(host, 900, 0)
        };
        let mut s = web_state();
        s.set_fleet_size(JoinerSizing::Reported);
        let reply = s.handle(&sized("a", 4), S);
        assert_eq!((reply.grants[0].rate, reply.fleet_size), (250, 0));
        let old = s.handle(&sized("b", 0), S);
        assert_eq!(
            old.grants[0].rate,
            limiter_fleet::share::Share::bootstrap_rate(
                1000,
                limiter_fleet::share::DEFAULT_FLEET_SIZE
            )
        );
        assert_eq!(s.fleet_size_disagreements, 0);

        let mut s = web_state();
        s.set_fleet_size(JoinerSizing::Configured(10));
        let reply = s.handle(&sized("a", 4), S);
        assert_eq!((reply.grants[0].rate, reply.fleet_size), (100, 10));
        s.handle(&sized("b", 10), S);
        s.handle(&sized("c", 0), S);
        assert_eq!(s.fleet_size_disagreements, 1);
        assert!(s
            .counter_metrics(S)
            .contains("limiter_allocator_fleet_size_disagreements_total 1\n"));
        // A new leader keeps the sizing and the count.
        let leader = s.restarted(2 * S);
        assert_eq!(leader.fleet_size_disagreements, 1);
        let mut leader = leader;
        assert_eq!(leader.handle(&sized("d", 4), 2 * S).fleet_size, 10);
    }

    /// Two saturated hosts at 500/s each, each admitting 450 of them (a small bucket's
    /// waste) and refusing 50 a second, reporting every second from `from` to `to`
    /// (seconds); `usage`: whether they send the credit's counts. Returns each second's
    /// grants to (a, b).
    fn wasteful_fleet(
        s: &mut State,
        usage: bool,
        from: u64,
        to: u64,
    ) -> Vec<(RuleGrant, RuleGrant)> {
        let report = |host: &str, held: u64, credit: u64| {
            let mut r = req(host, 1000, held);
            r.rules[0].denials = 50;
            if usage {
                r.rules[0].admitted = Some(450);
                r.rules[0].credited = Some(0);
                r.rules[0].credit = Some(credit);
            }
            r
        };
        let mut held = (0, 0);
        let mut credit = (0, 0);
        let mut out = Vec::new();
        for t in from..=to {
            // (No grant while learning: a host that holds nothing waits.)
            let mut grant = |host: &str, held: u64, credit: u64| {
                let reply = s.handle(&report(host, held, credit), t * S);
                reply.grants.first().cloned().unwrap_or_default()
            };
            let a = grant("a", held.0, credit.0);
            let b = grant("b", held.1, credit.1);
            (held, credit) = ((a.rate, b.rate), (a.credit, b.credit));
            out.push((a, b));
        }
        out
    }

    /// The credit on the wire: hosts that send what they admitted and refused get what
    /// the fleet left unused of its quota, within `credit_pct` % of an interval's quota, as a
    /// grant's credit; hosts that do not (an earlier protocol) get none, and neither
    /// does a fleet with `credit_pct = 0`. Shares are the same either way.
    #[test]
    fn hosts_that_report_usage_get_the_unused_quota_as_credit() {
        let mut s = web_state();
        s.set_credit_pct(8);
        let grants = wasteful_fleet(&mut s, true, 0, 10);
        let (a, b) = grants.last().unwrap();
        assert_eq!((a.rate, b.rate), (500, 500));
        // 2 × 50/s left unused, 100 refused: the level fills to the cap (8 % of the
        // 1000 a 1 s interval admits) and is split by refusals.
        assert_eq!((a.credit, b.credit), (40, 40), "{grants:?}");
        let m = s.metrics(10 * S);
        assert!(
            m.contains("limiter_allocator_credit_level_packets{rule=\"web\"} 80\n"),
            "{m}"
        );
        assert!(
            m.contains("limiter_allocator_credit_cap_packets{rule=\"web\"} 80\n"),
            "{m}"
        );

        // Older hosts: no counts, no credit.
        let mut s = web_state();
        s.set_credit_pct(8);
        let old = wasteful_fleet(&mut s, false, 0, 10);
        assert!(
            old.iter().all(|(a, b)| a.credit == 0 && b.credit == 0),
            "{old:?}"
        );
        assert_eq!(old.last().map(|(a, b)| (a.rate, b.rate)), Some((500, 500)));

        // Off, and a quota change follows the setting (cap = 3 % of the new quota).
        let mut s = web_state();
        let off = wasteful_fleet(&mut s, true, 0, 10);
        assert!(
            off.iter().all(|(a, b)| a.credit == 0 && b.credit == 0),
            "{off:?}"
        );
        s.set_credit_pct(3);
        s.set_quota(
            &Quota {
                rule: "web".into(),
                rate: 2000,
                burst: 100,
            },
            10 * S,
        );
        let on = wasteful_fleet(&mut s, true, 11, 20);
        let (a, b) = on.last().unwrap();
        assert_eq!(a.credit + b.credit, 60, "{on:?}");
        // A new leader renews what hosts say they hold, credits too, within the cap.
        let mut leader = s.restarted(21 * S);
        let mut r = req("a", 1000, 500);
        r.rules[0].admitted = Some(450);
        r.rules[0].credit = Some(a.credit);
        let renewed = leader.handle(&r, 21 * S).grants[0].clone();
        assert_eq!((renewed.rate, renewed.credit), (500, a.credit));
    }

    #[test]
    fn grants_split_the_quota_by_demand_after_learning() {
        let mut s = web_state();
        // Learning: a host holding nothing gets no grant yet.
        assert!(s.handle(&req("a", 900, 0), S).grants.is_empty());
        let t = 4 * S;
        // a alone: the whole quota. b arrives while a holds it all: a zero share (it
        // stays leased) until a renews.
        assert_eq!(s.handle(&req("a", 900, 0), t).grants[0].rate, 1000);
        assert_eq!(s.handle(&req("b", 100, 0), t).grants[0].rate, 0);
        // The zero share is closed: the grants in force are the quota, not above it. An
        // idle host c gets a share of 0 too, and is not saturated (demand 0).
        assert_eq!(s.handle(&req("c", 0, 0), t).grants[0].rate, 0);
        let m = s.metrics(t);
        assert!(
            m.contains("limiter_allocator_granted_packets_per_second{rule=\"web\"} 1000\n"),
            "{m}"
        );
        assert!(
            m.contains("limiter_allocator_saturated_hosts{rule=\"web\"} 0\n"),
            "{m}"
        );
        // a renews at its fair share, which frees b's.
        let a = s.handle(&req("a", 900, 0), t);
        let b = s.handle(&req("b", 100, 0), t);
        assert_eq!((a.grants[0].rate, b.grants[0].rate), (900, 100));
        assert!(!a.grants[0].saturated && !b.grants[0].saturated);
        assert_eq!(a.grants[0].ttl_ms, 3000);
        let m = s.metrics(t);
        assert!(
            m.contains("limiter_allocator_granted_packets_per_second{rule=\"web\"} 1000"),
            "{m}"
        );
        assert!(m.contains("limiter_allocator_hosts{rule=\"web\"} 3"), "{m}");
    }

    /// Quotas and grants are named by the quota's unit (packets unless `[[quotas]] unit`
    /// says otherwise): never a rate of bytes under a name of packets; a host that reports
    /// another unit is counted, one that predates the field is not.
    #[test]
    fn quota_and_grant_metrics_name_the_quotas_unit() {
        let quota = "limiter_allocator_quota_";
        let mut s = web_state();
        let m = s.metrics(S);
        assert!(
            m.contains(&format!("{quota}packets_per_second{{rule=\"web\"}} 1000\n")),
            "{m}"
        );
        for unit in ["bytes", "syn"] {
            let mut s = web_state();
            s.set_units([("web".to_string(), unit.parse().unwrap())].into());
            let m = s.metrics(S);
            let name = if unit == "syn" { "syn_packets" } else { unit };
            assert!(
                m.contains(&format!("{quota}{name}_per_second{{rule=\"web\"}} 1000\n")),
                "{m}"
            );
            assert!(
                m.contains(&format!(
                    "limiter_allocator_granted_{name}_per_second{{rule=\"web\"}} 0\n"
                )),
                "{m}"
            );
            assert!(
                m.contains(&format!(
                    "limiter_allocator_credit_cap_{name}{{rule=\"web\"}} "
                )),
                "{m}"
            );
            assert!(!m.contains(&format!("{quota}packets_per_second{{")), "{m}");
        }
        let disagreements = |s: &mut State| {
            let m = s.metrics(S);
            m.lines()
                .find_map(|l| l.strip_prefix("limiter_allocator_unit_disagreements_total "))
                .map(|v| v.to_string())
                .unwrap_or_else(|| panic!("no disagreement counter in {m}"))
        };
        s.handle(&req("a", 100, 0), S);
        let mut old = req("b", 100, 0);
        old.rules[0].unit = String::new();
        s.handle(&old, S);
        assert_eq!(disagreements(&mut s), "0");
        let mut bytes = req("c", 100, 0);
        bytes.rules[0].unit = "bytes".into();
        s.handle(&bytes, S);
        assert_eq!(disagreements(&mut s), "1");
        // A new leader's state keeps the units and the count.
        let mut leader = s.restarted(2 * S);
        assert_eq!(disagreements(&mut leader), "1");
        let m = leader.metrics(2 * S);
        assert!(
            m.contains(&format!("{quota}packets_per_second{{rule=\"web\"}}")),
            "{m}"
        );
    }

    #[test]
    fn unknown_rules_get_no_grant_and_quota_changes_apply() {
        let mut s = State::new(
            &[],
            Duration::from_secs(3),
            Duration::from_secs(1),
            LIMITS,
            0,
        );
        assert!(s.handle(&req("a", 10, 0), 10 * S).grants.is_empty());
        s.set_quota(
            &Quota {
                rule: "web".into(),
                rate: 50,
                burst: 5,
            },
            10 * S,
        );
        let g = s.handle(&req("a", 10, 0), 10 * S);
        assert_eq!(g.grants[0].rate, 50);
    }

    #[test]
    fn a_rule_added_by_quota_set_grants_at_its_first_reports() {
        // The allocator has run for a minute; the rule is new: nobody holds a share of
        // it, so the first reports get real shares, not a lease TTL of learning (which
        // left every host in BOOTSTRAP for ~3 s).
        let mut s = State::new(
            &[],
            Duration::from_secs(3),
            Duration::from_secs(1),
            LIMITS,
            0,
        );
        let quota = Quota {
            rule: "web".into(),
            rate: 1000,
            burst: 100,
        };
        s.set_quota(&quota, 60 * S);
        let a = s.handle(&req("a", 900, 0), 60 * S + S / 2);
        assert_eq!(a.grants.len(), 1, "no grant: the new rule is learning");
        assert_eq!(a.grants[0].rate, 1000);
        let b = s.handle(&req("b", 100, 0), 60 * S + S / 2 + 1);
        assert_eq!(b.grants[0].rate, 0, "a holds the quota until it renews");
        let a = s.handle(&req("a", 900, 0), 61 * S + S / 2);
        assert_eq!(a.grants[0].rate, 900);
        let b = s.handle(&req("b", 100, 0), 61 * S + S / 2 + 1);
        assert_eq!(b.grants[0].rate, 100);
        let m = s.metrics(61 * S + S / 2 + 1);
        assert!(
            m.contains("limiter_allocator_learning{rule=\"web\"} 0"),
            "{m}"
        );

        // Added while the allocator itself is still learning (it restarted 1 s ago):
        // hosts may hold shares an earlier process granted, so it learns with the rest.
        let mut s = State::new(
            &[],
            Duration::from_secs(3),
            Duration::from_secs(1),
            LIMITS,
            0,
        );
        s.set_quota(&quota, S);
        assert!(s.handle(&req("a", 900, 0), 2 * S).grants.is_empty());
        assert_eq!(s.handle(&req("a", 900, 0), 3 * S + 1).grants[0].rate, 1000);
    }

    fn web(rate: u64) -> Quota {
        Quota {
            rule: "web".into(),
            rate,
            burst: 100,
        }
    }

    #[test]
    fn a_sharded_group_grants_only_its_rules_and_names_the_owner_of_the_others() {
        let mut s = State::new(
            &[web(1000)],
            Duration::from_secs(3),
            Duration::from_secs(1),
            LIMITS,
            0,
        );
        s.shard_as("a");
        // Not assigned: nobody grants it, nothing named.
        let r = s.handle(&req("h", 900, 0), 4 * S);
        assert!(r.grants.is_empty() && r.elsewhere.is_empty());
        s.assign("web", Some("b"), 4 * S);
        let r = s.handle(&req("h", 900, 0), 4 * S);
        assert!(r.grants.is_empty());
        assert_eq!(
            r.elsewhere,
            [RuleElsewhere {
                rule: "web".into(),
                group: "b".into()
            }]
        );
        assert!(s
            .metrics(4 * S)
            .contains("limiter_allocator_assigned{rule=\"web\"} 0"));
        // Unsharded, the same state grants it.
        let mut plain = State::new(
            &[web(1000)],
            Duration::from_secs(3),
            Duration::from_secs(1),
            LIMITS,
            0,
        );
        assert_eq!(plain.handle(&req("h", 900, 0), 3 * S).grants[0].rate, 1000);
        assert!(plain.owns("web"));
    }

    /// A rule moved in learns with the allocator's own joiner sizing: without a
    /// fleet_size in its file, a joiner's share follows the fleet_size the host reports
    /// (before, the move kept only the default share: quota ÷ the daemons' default).
    #[test]
    fn a_rule_moved_in_keeps_the_joiners_sizing_from_the_reports() {
        let mut s = web_state();
        s.set_fleet_size(JoinerSizing::Reported);
        s.shard_as("b");
        s.assign("web", Some("a"), 0);
        let t = 60 * S;
        s.assign("web", Some("b"), t);
        let joiner = ReportRequest {
            fleet_size: 4,
            ..req("j", 900, 0)
        };
        let g = &s.handle(&joiner, t + 1).grants[0];
        assert_eq!(
            g.rate,
            limiter_fleet::share::Share::bootstrap_rate(1000, 4),
            "{g:?}"
        );
    }

    #[test]
    fn a_rule_moved_in_renews_what_hosts_hold_for_a_lease_ttl_then_reallocates() {
        let mut s = State::new(
            &[web(1000)],
            Duration::from_secs(3),
            Duration::from_secs(1),
            LIMITS,
            0,
        );
        s.shard_as("b");
        s.assign("web", Some("a"), 0);
        // Long after start-up, the rule moves here from group a, whose grants the hosts
        // hold: x holds 700, y 300, z (a newcomer) nothing.
        let t = 60 * S;
        s.assign("web", Some("b"), t);
        assert!(s.owns("web"));
        let x = s.handle(&req("x", 900, 700), t + 1);
        let y = s.handle(&req("y", 900, 300), t + 2);
        let z = s.handle(&req("z", 900, 0), t + 3);
        assert_eq!(x.grants[0].rate, 700, "renewed, not reallocated");
        assert_eq!(y.grants[0].rate, 300);
        assert!(
            z.grants.is_empty(),
            "no grant while learning for a host holding nothing"
        );
        // After a lease TTL: the quota split by demand, never above it.
        let t = t + 3 * S + 1;
        let rates: Vec<u64> = ["x", "y", "z"]
            .iter()
            .map(|h| s.handle(&req(h, 900, 0), t).grants[0].rate)
            .collect();
        assert!(rates.iter().sum::<u64>() <= 1000, "{rates:?}");
        // Moved away: no grants, the owner named; moved back: learning again.
        s.assign("web", Some("a"), t);
        let r = s.handle(&req("x", 900, 333), t + 1);
        assert!(r.grants.is_empty() && r.elsewhere[0].group == "a");
        s.assign("web", Some("b"), t + 2);
        assert_eq!(s.handle(&req("x", 900, 333), t + 3).grants[0].rate, 333);
        // A state restarted by an election keeps the assignment.
        let fresh = s.restarted(t + 4);
        assert!(fresh.owns("web"));
        assert_eq!(fresh.assignment(), [("web".to_string(), "b".to_string())]);
    }

    #[test]
    fn a_quota_that_arrives_after_a_move_still_learns() {
        let mut s = State::new(
            &[],
            Duration::from_secs(3),
            Duration::from_secs(1),
            LIMITS,
            0,
        );
        s.shard_as("b");
        s.assign("web", Some("a"), 0);
        s.assign("web", Some("b"), 60 * S);
        s.set_quota(&web(1000), 60 * S + 1);
        assert_eq!(
            s.handle(&req("x", 900, 400), 60 * S + 2).grants[0].rate,
            400
        );
        assert!(s.handle(&req("y", 900, 0), 60 * S + 3).grants.is_empty());
        // A rule assigned here from no group was granted by nobody: no learning.
        let mut s = State::new(
            &[web(1000)],
            Duration::from_secs(3),
            Duration::from_secs(1),
            LIMITS,
            0,
        );
        s.shard_as("b");
        s.assign("web", Some("b"), 60 * S);
        assert_eq!(s.handle(&req("x", 900, 0), 60 * S + 1).grants[0].rate, 1000);
    }
}
