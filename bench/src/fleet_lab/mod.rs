//! The fleet lab (`cargo xtask run -- --fleet`, binary `limiter-fleet-lab`): three
//! allocator replicas electing their leader in one etcd, and three daemons on this
//! machine, each daemon on a veth pair of its own with traffic from a namespace, and a
//! live view of every host's share and state and every replica's role. This module is the
//! pure part — actions, scripts, per-second samples and the lines the plain mode prints —
//! tested directly; [`fleet`] runs the processes, [`view`] draws the terminal UI.

pub mod fleet;
pub mod view;

use std::{collections::VecDeque, fmt, time::Duration};

use anyhow::{bail, Context as _, Result};

/// The lab's fleet: how much traffic, which quota, and the fleet timings, scaled down so
/// that LEASED → STICKY → FAIL_OPEN takes tens of seconds instead of minutes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LabConfig {
    pub hosts: usize,
    /// Allocator replicas, one etcd for their election.
    pub replicas: usize,
    /// The replicas' `[election] ttl_ms`: how long a dead leader's etcd lease outlives it.
    pub election_ttl_ms: u64,
    /// The rule's global quota, packets/s.
    pub quota: u64,
    /// What each host's traffic source offers, packets/s.
    pub offered_per_host: u64,
    pub lease_ttl_ms: u64,
    pub report_interval_ms: u64,
    pub sticky_max_s: u64,
}

impl Default for LabConfig {
    fn default() -> LabConfig {
        LabConfig {
            hosts: 3,
            replicas: 3,
            election_ttl_ms: 2000,
            quota: 3000,
            offered_per_host: 2000,
            // Above election TTL + report interval (the allocator's config check): a
            // failover then fits in one lease and the hosts never leave LEASED.
            lease_ttl_ms: 3000,
            report_interval_ms: 500,
            sticky_max_s: 10,
        }
    }
}

impl LabConfig {
    /// The rule's burst: a tenth of a second of the quota (at least one packet).
    pub fn burst(&self) -> u64 {
        (self.quota / 10).max(1)
    }

    /// What the fleet admits while every host is leased: the quota, or all that is
    /// offered if that is less.
    pub fn expected_leased_rate(&self) -> u64 {
        self.quota.min(self.offered_per_host * self.hosts as u64)
    }

    /// What the replicas' config check requires: a leader's etcd lease (the election
    /// TTL) and a report interval must fit in one host lease.
    pub fn check(&self) -> Result<()> {
        if self.election_ttl_ms + self.report_interval_ms >= self.lease_ttl_ms {
            bail!(
                "a lease of {} ms is too short: it must exceed the election TTL ({} ms) plus \
                 the report interval ({} ms)",
                self.lease_ttl_ms,
                self.election_ttl_ms,
                self.report_interval_ms
            );
        }
        Ok(())
    }

    /// The line the lab prints first, which the tests read the expected figures from.
    pub fn describe(&self) -> String {
        format!(
            "config hosts={} replicas={} election_ttl_ms={} quota={} burst={} \
             offered_per_host={} lease_ttl_ms={} report_interval_ms={} sticky_max_s={}",
            self.hosts,
            self.replicas,
            self.election_ttl_ms,
            self.quota,
            self.burst(),
            self.offered_per_host,
            self.lease_ttl_ms,
            self.report_interval_ms,
            self.sticky_max_s
        )
    }
}

/// What a key, a script entry or a line on stdin asks the lab to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// SIGKILL the replica that leads now.
    Kill,
    /// Start the killed replicas again (same addresses, same configs).
    Restart,
    /// Cut host N (1-based) off the allocator.
    Partition(usize),
    /// Reconnect host N.
    Heal(usize),
    /// Partition host N if it is connected, heal it if it is cut off (keys `1`..`3`).
    Toggle(usize),
    Quit,
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::Kill => write!(f, "kill"),
            Action::Restart => write!(f, "restart"),
            Action::Partition(n) => write!(f, "partition {n}"),
            Action::Heal(n) => write!(f, "heal {n}"),
            Action::Toggle(n) => write!(f, "toggle {n}"),
            Action::Quit => write!(f, "quit"),
        }
    }
}

impl Action {
    /// `kill`, `restart`, `partition N`, `heal N`, `quit`, with N a host of `1..=hosts`.
    pub fn parse(text: &str, hosts: usize) -> Result<Action> {
        let words: Vec<&str> = text.split_whitespace().collect();
        let host = |word: Option<&&str>| -> Result<usize> {
            let word = word.with_context(|| format!("{text:?}: which host? (1 to {hosts})"))?;
            match word.parse::<usize>() {
                Ok(n) if (1..=hosts).contains(&n) => Ok(n),
                _ => bail!("{text:?}: no host {word:?} (hosts are 1 to {hosts})"),
            }
        };
        let action = match words.first() {
            Some(&"kill") => Action::Kill,
            Some(&"restart") => Action::Restart,
            Some(&"partition") => Action::Partition(host(words.get(1))?),
            Some(&"heal") => Action::Heal(host(words.get(1))?),
            Some(&"quit") => Action::Quit,
            _ => bail!("{text:?} is not an action: kill, restart, partition N, heal N or quit"),
        };
        let arity = match action {
            Action::Partition(_) | Action::Heal(_) => 2,
            _ => 1,
        };
        if words.len() > arity {
            bail!("{text:?}: unexpected {:?} after the action", words[arity]);
        }
        Ok(action)
    }

    /// The action of a key of the live view.
    pub fn of_key(key: char, hosts: usize) -> Option<Action> {
        match key {
            'k' => Some(Action::Kill),
            'r' => Some(Action::Restart),
            'q' => Some(Action::Quit),
            d => d
                .to_digit(10)
                .map(|n| n as usize)
                .filter(|n| (1..=hosts).contains(n))
                .map(Action::Toggle),
        }
    }
}

/// `--script "5:kill,20:restart,30:partition 2,40:heal 2"`: actions at seconds since the
/// view started, in time order.
pub fn parse_script(text: &str, hosts: usize) -> Result<Vec<(Duration, Action)>> {
    let mut script = Vec::new();
    for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (at, action) = entry
            .split_once(':')
            .with_context(|| format!("script entry {entry:?}: expected SECONDS:ACTION"))?;
        let secs: f64 = at
            .trim()
            .parse()
            .ok()
            .filter(|s: &f64| s.is_finite() && *s >= 0.0)
            .with_context(|| {
                format!("script entry {entry:?}: {at:?} is not a number of seconds")
            })?;
        let action =
            Action::parse(action, hosts).with_context(|| format!("script entry {entry:?}"))?;
        script.push((Duration::from_secs_f64(secs), action));
    }
    script.sort_by_key(|(at, _)| *at);
    Ok(script)
}

/// One host as read from its pinned maps at one moment.
#[derive(Clone, Debug, PartialEq)]
pub struct HostReading {
    /// `bootstrap`, `leased`, `sticky`, `fail_open` (limiter_user::observe::stats::share_state_at).
    pub state: &'static str,
    /// The share in force, packets/s.
    pub share: u64,
    /// Time since the lease was granted or last renewed: lease TTL minus what is left of
    /// it (negative left: lapsed). `None` before the first grant.
    pub lease_age: Option<Duration>,
    pub passed: u64,
    pub dropped: u64,
}

/// A host's line of one second: the reading and its counters' rates since the last one.
#[derive(Clone, Debug, PartialEq)]
pub struct HostSecond {
    pub name: String,
    pub reading: HostReading,
    pub passed_per_s: f64,
    pub dropped_per_s: f64,
    pub partitioned: bool,
}

impl HostSecond {
    pub fn new(
        name: &str,
        before: Option<&HostReading>,
        now: HostReading,
        elapsed: Duration,
        partitioned: bool,
    ) -> HostSecond {
        let secs = elapsed.as_secs_f64().max(1e-3);
        let rate = |now: u64, before: Option<u64>| {
            before.map_or(0.0, |b| now.saturating_sub(b) as f64 / secs)
        };
        HostSecond {
            name: name.to_string(),
            passed_per_s: rate(now.passed, before.map(|b| b.passed)),
            dropped_per_s: rate(now.dropped, before.map(|b| b.dropped)),
            reading: now,
            partitioned,
        }
    }

    /// `t=12.0 host=lb-1 state=leased share=1000 lease_age_ms=310 passed=… dropped=…
    /// passed_per_s=1000 dropped_per_s=1000 link=ok`: the plain mode's line.
    pub fn plain_line(&self, t: Duration) -> String {
        format!(
            "t={:.1} host={} state={} share={} lease_age_ms={} passed={} dropped={} \
             passed_per_s={:.0} dropped_per_s={:.0} link={}",
            t.as_secs_f64(),
            self.name,
            self.reading.state,
            self.reading.share,
            self.reading
                .lease_age
                .map_or("none".to_string(), |a| a.as_millis().to_string()),
            self.reading.passed,
            self.reading.dropped,
            self.passed_per_s,
            self.dropped_per_s,
            if self.partitioned {
                "partitioned"
            } else {
                "ok"
            }
        )
    }
}

/// One allocator replica as the lab sees it (its metrics).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaReading {
    /// `alloc-1`…
    pub name: String,
    /// Its process, while it runs.
    pub pid: Option<u32>,
    /// Its metrics answered.
    pub up: bool,
    /// `limiter_allocator_leader`.
    pub leader: bool,
    /// `limiter_allocator_term`: the term it leads in (0 when not leading).
    pub term: u64,
    /// `limiter_allocator_etcd_reachable`.
    pub etcd_reachable: Option<bool>,
    /// `limiter_allocator_granted_<unit>_per_second` of the rule: the sum of the shares in force.
    pub granted: Option<u64>,
    /// `limiter_allocator_hosts`.
    pub hosts: Option<u64>,
}

impl ReplicaReading {
    /// A replica that does not run (or does not answer).
    pub fn down(name: &str, pid: Option<u32>) -> ReplicaReading {
        ReplicaReading {
            name: name.to_string(),
            pid,
            up: false,
            leader: false,
            term: 0,
            etcd_reachable: None,
            granted: None,
            hosts: None,
        }
    }

    /// `leader`, `follower` or `down`.
    pub fn role(&self) -> &'static str {
        match (self.up, self.leader) {
            (false, _) => "down",
            (true, true) => "leader",
            (true, false) => "follower",
        }
    }

    /// `t=12.0 replica=alloc-1 role=leader term=7 etcd=ok pid=4242 granted=3000 hosts=3`.
    pub fn plain_line(&self, t: Duration) -> String {
        let opt = |v: Option<u64>| v.map_or("none".to_string(), |v| v.to_string());
        format!(
            "t={:.1} replica={} role={} term={} etcd={} pid={} granted={} hosts={}",
            t.as_secs_f64(),
            self.name,
            self.role(),
            self.term,
            match self.etcd_reachable {
                Some(true) => "ok",
                Some(false) => "unreachable",
                None => "none",
            },
            opt(self.pid.map(u64::from)),
            opt(self.granted),
            opt(self.hosts)
        )
    }
}

/// The replica that leads, if one does (the first, should two claim to).
pub fn leader(replicas: &[ReplicaReading]) -> Option<&ReplicaReading> {
    replicas.iter().find(|r| r.up && r.leader)
}

/// `alloc-2 (term 7)`, or `none`.
fn leader_name(replicas: &[ReplicaReading]) -> String {
    leader(replicas).map_or("none".to_string(), |r| {
        format!("{} (term {})", r.name, r.term)
    })
}

/// A change of leader worth a line in the event log: `leader: alloc-1 (term 5) → alloc-3
/// (term 9)`, `leader: alloc-3 (term 9) → none`.
pub fn leader_change(before: &[ReplicaReading], now: &[ReplicaReading]) -> Option<String> {
    let key = |r: &[ReplicaReading]| leader(r).map(|l| (l.name.clone(), l.term));
    (key(before) != key(now))
        .then(|| format!("leader: {} → {}", leader_name(before), leader_name(now)))
}

/// The fleet-wide line of one second: the admitted rate, and who leads (its granted sum
/// and hosts).
pub fn global_line(
    t: Duration,
    admitted_per_s: f64,
    quota: u64,
    replicas: &[ReplicaReading],
) -> String {
    let opt = |v: Option<u64>| v.map_or("none".to_string(), |v| v.to_string());
    let leading = leader(replicas);
    format!(
        "t={:.1} global admitted_per_s={admitted_per_s:.0} quota={quota} leader={} term={} \
         replicas_up={} allocator_granted={} allocator_hosts={}",
        t.as_secs_f64(),
        leading.map_or("none", |l| l.name.as_str()),
        leading.map_or(0, |l| l.term),
        replicas.iter().filter(|r| r.up).count(),
        opt(leading.and_then(|l| l.granted)),
        opt(leading.and_then(|l| l.hosts))
    )
}

/// The fleet's admitted rate over the last minute, one point a second.
#[derive(Clone, Debug, Default)]
pub struct History {
    points: VecDeque<(f64, f64)>,
}

impl History {
    pub const SPAN: Duration = Duration::from_secs(60);

    pub fn push(&mut self, t: Duration, admitted: f64) {
        let t = t.as_secs_f64();
        self.points.push_back((t, admitted));
        while self
            .points
            .front()
            .is_some_and(|(first, _)| t - first > Self::SPAN.as_secs_f64())
        {
            self.points.pop_front();
        }
    }

    pub fn points(&self) -> Vec<(f64, f64)> {
        self.points.iter().copied().collect()
    }

    pub fn max(&self) -> f64 {
        self.points.iter().map(|p| p.1).fold(0.0, f64::max)
    }
}

/// A state change worth a line in the view's event log: `lb-2: leased → sticky`.
pub fn transition(name: &str, before: Option<&HostReading>, now: &HostReading) -> Option<String> {
    let before = before?;
    (before.state != now.state).then(|| format!("{name}: {} → {}", before.state, now.state))
}

/// The age of a lease that expires in `left_ns` (negative: lapsed) of a `ttl`; `None`
/// without a lease (`expires_ns` 0: never granted).
pub fn lease_age(expires_ns: u64, now_ns: u64, ttl: Duration) -> Option<Duration> {
    if expires_ns == 0 {
        return None;
    }
    let left_ns = expires_ns.wrapping_sub(now_ns) as i64;
    let age_ns = ttl.as_nanos() as i64 - left_ns;
    Some(Duration::from_nanos(age_ns.max(0) as u64))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;

    #[test]
    fn actions_parse_and_bad_ones_say_what_is_wrong() {
        assert_eq!(Action::parse("kill", 3).unwrap(), Action::Kill);
        assert_eq!(
            Action::parse(" partition 2 ", 3).unwrap(),
            Action::Partition(2)
        );
        assert_eq!(Action::parse("heal 3", 3).unwrap(), Action::Heal(3));
        let err = |t: &str| format!("{:#}", Action::parse(t, 3).unwrap_err());
        assert!(
            err("partition 4").contains("no host \"4\""),
            "{}",
            err("partition 4")
        );
        assert!(err("partition 0").contains("hosts are 1 to 3"));
        assert!(err("heal").contains("which host"));
        assert!(err("reboot").contains("not an action"));
        assert!(err("kill now").contains("unexpected \"now\""));
    }

    #[test]
    fn scripts_parse_in_time_order() {
        let s = parse_script("20:restart, 5:kill,30:partition 2,40.5:heal 2", 3).unwrap();
        assert_eq!(
            s,
            vec![
                (Duration::from_secs(5), Action::Kill),
                (Duration::from_secs(20), Action::Restart),
                (Duration::from_secs(30), Action::Partition(2)),
                (Duration::from_millis(40_500), Action::Heal(2)),
            ]
        );
        let err = |t: &str| format!("{:#}", parse_script(t, 3).unwrap_err());
        assert!(err("5 kill").contains("SECONDS:ACTION"));
        assert!(err("-1:kill").contains("not a number of seconds"));
        assert!(err("x:kill").contains("not a number of seconds"));
        assert!(err("5:partition 9").contains("script entry \"5:partition 9\""));
    }

    #[test]
    fn keys_map_to_actions_within_the_fleet() {
        assert_eq!(Action::of_key('k', 3), Some(Action::Kill));
        assert_eq!(Action::of_key('r', 3), Some(Action::Restart));
        assert_eq!(Action::of_key('2', 3), Some(Action::Toggle(2)));
        assert_eq!(Action::of_key('4', 3), None);
        assert_eq!(Action::of_key('0', 3), None);
        assert_eq!(Action::of_key('x', 3), None);
    }

    #[test]
    fn rates_are_counter_deltas_over_the_elapsed_time() {
        let reading = |passed, dropped| HostReading {
            state: "leased",
            share: 1000,
            lease_age: Some(Duration::from_millis(300)),
            passed,
            dropped,
        };
        let first = HostSecond::new("lb-1", None, reading(10, 5), Duration::from_secs(1), false);
        assert_eq!((first.passed_per_s, first.dropped_per_s), (0.0, 0.0));
        let r = HostSecond::new(
            "lb-1",
            Some(&reading(1000, 500)),
            reading(3000, 1500),
            Duration::from_secs(2),
            true,
        );
        assert_eq!((r.passed_per_s, r.dropped_per_s), (1000.0, 500.0));
        assert_eq!(
            r.plain_line(Duration::from_millis(12_040)),
            "t=12.0 host=lb-1 state=leased share=1000 lease_age_ms=300 passed=3000 \
             dropped=1500 passed_per_s=1000 dropped_per_s=500 link=partitioned"
        );
    }

    #[test]
    fn lease_age_counts_from_the_grant_and_past_the_lapse() {
        let ttl = Duration::from_secs(2);
        assert_eq!(lease_age(0, 5, ttl), None);
        // 1.5 s left of 2 s: granted 0.5 s ago.
        assert_eq!(
            lease_age(11_500_000_000, 10_000_000_000, ttl),
            Some(Duration::from_millis(500))
        );
        // Lapsed 1 s ago: granted 3 s ago.
        assert_eq!(
            lease_age(9_000_000_000, 10_000_000_000, ttl),
            Some(Duration::from_secs(3))
        );
    }

    #[test]
    fn history_keeps_the_last_minute() {
        let mut h = History::default();
        for s in 0..100 {
            h.push(Duration::from_secs(s), s as f64);
        }
        let p = h.points();
        assert_eq!(p.first().unwrap().0, 39.0);
        assert_eq!(p.last().unwrap().0, 99.0);
        assert_eq!(h.max(), 99.0);
    }

    fn replica(name: &str, leader: bool, term: u64) -> ReplicaReading {
        ReplicaReading {
            name: name.into(),
            pid: Some(4242),
            up: true,
            leader,
            term,
            etcd_reachable: Some(true),
            granted: leader.then_some(3000),
            hosts: leader.then_some(3),
        }
    }

    #[test]
    fn replicas_show_their_role_and_the_leader_changes_are_events() {
        let three = vec![
            replica("alloc-1", true, 5),
            replica("alloc-2", false, 0),
            replica("alloc-3", false, 0),
        ];
        assert_eq!(
            three.iter().map(ReplicaReading::role).collect::<Vec<_>>(),
            ["leader", "follower", "follower"]
        );
        assert_eq!(
            three[0].plain_line(Duration::from_millis(12_040)),
            "t=12.0 replica=alloc-1 role=leader term=5 etcd=ok pid=4242 granted=3000 hosts=3"
        );
        let killed = ReplicaReading::down("alloc-1", None);
        assert_eq!(killed.role(), "down");
        assert_eq!(
            killed.plain_line(Duration::from_secs(1)),
            "t=1.0 replica=alloc-1 role=down term=0 etcd=none pid=none granted=none hosts=none"
        );
        assert_eq!(
            global_line(Duration::from_secs(3), 2990.4, 3000, &three),
            "t=3.0 global admitted_per_s=2990 quota=3000 leader=alloc-1 term=5 replicas_up=3 \
             allocator_granted=3000 allocator_hosts=3"
        );

        assert_eq!(leader_change(&three, &three), None);
        let between = vec![
            killed.clone(),
            replica("alloc-2", false, 0),
            replica("alloc-3", false, 0),
        ];
        assert_eq!(
            leader_change(&three, &between).as_deref(),
            Some("leader: alloc-1 (term 5) → none")
        );
        let after = vec![
            killed,
            replica("alloc-2", false, 0),
            replica("alloc-3", true, 9),
        ];
        assert_eq!(
            leader_change(&between, &after).as_deref(),
            Some("leader: none → alloc-3 (term 9)")
        );
        assert_eq!(
            leader_change(&three, &after).as_deref(),
            Some("leader: alloc-1 (term 5) → alloc-3 (term 9)")
        );
        assert!(global_line(Duration::ZERO, 0.0, 3000, &between)
            .contains("leader=none term=0 replicas_up=2 allocator_granted=none"));
    }

    #[test]
    fn the_lease_must_outlast_an_election_and_a_report() {
        let c = LabConfig::default();
        c.check().unwrap();
        assert!(c.lease_ttl_ms > c.election_ttl_ms + c.report_interval_ms);
        let short = LabConfig {
            lease_ttl_ms: 2400,
            report_interval_ms: 400,
            ..LabConfig::default()
        };
        let err = format!("{:#}", short.check().unwrap_err());
        assert!(
            err.contains("2400 ms is too short") && err.contains("election TTL (2000 ms)"),
            "{err}"
        );
        assert!(c.describe().contains("replicas=3 election_ttl_ms=2000"));
    }

    #[test]
    fn the_expected_rate_is_the_quota_or_the_offer() {
        let c = LabConfig::default();
        assert_eq!(c.expected_leased_rate(), c.quota);
        let light = LabConfig {
            offered_per_host: 100,
            ..LabConfig::default()
        };
        assert_eq!(light.expected_leased_rate(), 300);
        assert!(c.describe().contains(&format!("quota={}", c.quota)));
    }
}
