//! What a simulation runs: the fleet, its tenants (rules), demand traces and allocator
//! events. The built-in scenarios are the design's failure situations (docs/design.md);
//! [`Knobs`] shrinks them for tests.

use std::{ops::Range, time::Duration};

use limiter_fleet::share::{FailMode, ShareParams};

use crate::{
    bootstrap::{joins_per_s_for, BOOTSTRAP_CLAIM_PCT},
    rng::Rng,
    time::{MS, S},
};

/// One rule: a tenant's global quota, split across the hosts that see its traffic.
#[derive(Clone, Debug)]
pub struct Tenant {
    pub name: String,
    /// Global quota, packets per second.
    pub quota: u64,
    /// Global burst (the allocator hands each host its proportional part).
    pub burst: u64,
    pub fail_mode: FailMode,
    /// Keep a 100 ms time series (plots, per-state figures); others get 1 s totals.
    pub tracked: bool,
}

#[derive(Clone, Debug)]
pub enum Action {
    /// From now on, each host in `hosts` is offered `rate` × its weight per second.
    Demand {
        tenant: usize,
        hosts: Range<u32>,
        rate: f64,
    },
    /// The allocator stops answering (reports are lost).
    AllocatorDown,
    /// The allocator answers again; `restart`: it lost its state (a new process, which
    /// learns for one lease TTL), otherwise it was only cut off (a partition).
    AllocatorUp { restart: bool },
}

#[derive(Clone, Debug)]
pub struct Event {
    pub at: u64,
    pub action: Action,
    /// Shown on plots and in the report when set.
    pub label: Option<String>,
}

/// When a host's share of a rule starts (BOOTSTRAP with its deadlines).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShareStart {
    /// The design's model of a joiner (a rule this host has not seen yet): at the rule's
    /// first frame on the host, which asks for a grant at once, claiming the bootstrap rate
    /// as demand.
    FirstFrame,
    /// The daemon as limiter-user implements it: every configured rule bootstraps when
    /// the daemon starts (here: at time 0 on every host of the rule's pool) and is
    /// reported on the timer, idle or not.
    DaemonStart,
}

/// How a grant's credit (`Grant::credit`, quota left unused reassigned to hosts that
/// refused frames) reaches a host's bucket; `Off`: the allocator grants none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CreditMode {
    Off,
    /// A bank beside the bucket, spent one frame per refusal (a kernel counter).
    Bank,
    /// Tokens added to the bucket (its TAT moved back), at most up to its burst: what
    /// the kernel's bucket holds today.
    Tokens,
}

impl CreditMode {
    pub fn name(self) -> &'static str {
        match self {
            CreditMode::Off => "off",
            CreditMode::Bank => "bank",
            CreditMode::Tokens => "tokens",
        }
    }
}

#[derive(Clone, Debug)]
pub struct Scenario {
    pub name: String,
    pub title: String,
    pub about: String,
    pub duration: u64,
    pub hosts: u32,
    pub params: ShareParams,
    /// Report → allocator → grant round trip (the grant arrives this long after the
    /// report is sent; each way takes half).
    pub rtt: u64,
    /// Hosts report on `phase_groups` evenly spaced phases of the report interval
    /// (daemons start at different times). The allocator computes once per batch.
    pub phase_groups: u32,
    /// Shortest gap between two reports of a pair when the second is an out-of-cycle
    /// report (denials on an unsaturated lease).
    pub early_report_gap: u64,
    pub share_start: ShareStart,
    /// A closed share whose lease lapsed rejoins on refusals (`Share::rejoin`, what
    /// limiter-user does); `false` models pure STICKY (it stays closed), for comparison.
    pub rejoin: bool,
    /// Per-host rates above this are simulated as dense streams (closed form).
    pub dense_above: f64,
    /// Host weights are uniform in [1 - spread, 1 + spread]: hosts see unequal traffic.
    pub weight_spread: f64,
    pub tenants: Vec<Tenant>,
    pub events: Vec<Event>,
    /// Times after which the time to converge is measured.
    pub shifts: Vec<u64>,
    /// Statistics ignore the first seconds (a cold start: every host bootstraps at once).
    pub warmup: u64,
    pub seed: u64,
    /// The credit (see [`CreditMode`]).
    pub credit: CreditMode,
    /// The allocator's `credit_cap` in percent of what the rule's quota admits in one
    /// report interval (`limiter_fleet::alloc::credit_cap_for`).
    pub credit_pct: u64,
    /// While learning, the allocator grants a host that holds nothing (BOOTSTRAP,
    /// FAIL_OPEN) the bootstrap share (`RuleAllocator::learning_joiner_share`).
    pub learning_joiners: bool,
    /// `RuleAllocator::credit_idle_unused`: every host's unused share counts towards
    /// the credit, even one whose demand fell (a loser, for comparison).
    pub credit_idle_unused: bool,
    /// A host whose report fails re-arms its last grant's credit while the lease holds
    /// (`false`: the credit stops until the next grant, for comparison).
    pub credit_rearm: bool,
    /// A host with a share in FAIL_OPEN retries a failed report
    /// `limiter_fleet::share::FAIL_OPEN_RETRY_MS` after the failure (a round trip after
    /// it sent it), plus up to the daemon's 50 ms loop tick, instead of at its next
    /// interval, as the daemon does (`false`: once a report interval, for comparison).
    pub fail_open_retry: bool,
    /// A candidate the daemon does not run yet: a host whose demand left (nothing
    /// offered for as long as its last reported demand takes to bring 24 frames, at
    /// least 500 ms: `limiter_fleet::quiet`) reports at once, with demand 0, and again
    /// at once if frames come back (`false`: the daemon's behaviour).
    pub quiet_reports: bool,
}

/// Scales the built-in scenarios: the defaults are the design's (docs/design.md, Fleet
/// state machine); tests shrink the sticky period and durations and drop the background
/// tenants.
#[derive(Clone, Debug)]
pub struct Knobs {
    pub params: ShareParams,
    /// Directory plus a few dozen small tenants alongside Contoso.
    pub background: bool,
    pub steady_duration: u64,
    /// Simulated time before a scenario's first event (the fleet settles).
    pub lead: u64,
    /// Simulated time after the last event of a scenario.
    pub tail: u64,
    pub rtt: u64,
    pub seed: u64,
    pub credit: CreditMode,
    pub credit_pct: u64,
    pub learning_joiners: bool,
}

impl Default for Knobs {
    fn default() -> Self {
        Knobs {
            params: ShareParams::default(),
            background: true,
            steady_duration: 3600 * S,
            lead: 120 * S,
            tail: 180 * S,
            rtt: 50 * MS,
            seed: 11,
            credit: CreditMode::Bank,
            credit_pct: limiter_fleet::alloc::DEFAULT_CREDIT_PCT,
            learning_joiners: true,
        }
    }
}

impl Knobs {
    /// Small enough for unit tests in a debug build: a 20 s sticky period, Contoso (and
    /// Directory) only.
    pub fn quick() -> Knobs {
        Knobs {
            params: ShareParams {
                sticky_max: Duration::from_secs(20),
                ..ShareParams::default()
            },
            background: false,
            steady_duration: 60 * S,
            lead: 20 * S,
            tail: 30 * S,
            ..Knobs::default()
        }
    }

    fn sticky(&self) -> u64 {
        ns(self.params.sticky_max)
    }

    fn ttl(&self) -> u64 {
        ns(self.params.lease_ttl)
    }
}

pub fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

pub const CONTOSO: usize = 0;
pub const DIRECTORY: usize = 1;

fn base_tenants() -> Vec<Tenant> {
    vec![
        Tenant {
            name: "contoso".into(),
            quota: 10_000,
            burst: 2_000,
            fail_mode: FailMode::Open,
            tracked: true,
        },
        Tenant {
            name: "directory".into(),
            quota: 2_000_000,
            burst: 200_000,
            fail_mode: FailMode::Static,
            tracked: true,
        },
    ]
}

/// A few dozen smaller tenants with quotas from 100/s to 6,300/s, each seen by 10 to
/// 100 hosts, offered 50 % to 150 % of its quota; every fourth is a static cap.
fn background(seed: u64, hosts: u32) -> (Vec<Tenant>, Vec<(Range<u32>, f64)>) {
    let mut rng = Rng::new(seed ^ 0xbac6);
    let mut tenants = Vec::new();
    let mut traffic = Vec::new();
    for i in 0..30 {
        let quota = 10f64.powf(rng.range(2.0, 3.8)).round() as u64;
        let n = (rng.range(10.0, 100.0) as u32).min(hosts);
        let start = (rng.range(0.0, f64::from(hosts - n))) as u32;
        let load = rng.range(0.5, 1.5);
        tenants.push(Tenant {
            name: format!("tenant-{i:02}"),
            quota,
            burst: (quota / 5).max(1),
            fail_mode: if i % 4 == 3 {
                FailMode::Static
            } else {
                FailMode::Open
            },
            tracked: false,
        });
        traffic.push((start..start + n, quota as f64 * load / f64::from(n)));
    }
    (tenants, traffic)
}

pub(crate) fn demand(at: u64, tenant: usize, hosts: Range<u32>, rate: f64) -> Event {
    Event {
        at,
        action: Action::Demand {
            tenant,
            hosts,
            rate,
        },
        label: None,
    }
}

fn labelled(mut e: Event, label: &str) -> Event {
    e.label = Some(label.to_string());
    e
}

pub(crate) fn allocator(at: u64, action: Action, label: &str) -> Event {
    labelled(
        Event {
            at,
            action,
            label: None,
        },
        label,
    )
}

impl Scenario {
    pub(crate) fn new(k: &Knobs, name: &str, title: &str, about: &str) -> Scenario {
        Scenario {
            name: name.into(),
            title: title.into(),
            about: about.into(),
            duration: 0,
            hosts: 500,
            params: k.params,
            rtt: k.rtt,
            phase_groups: 10,
            early_report_gap: 200 * MS,
            share_start: ShareStart::FirstFrame,
            rejoin: true,
            dense_above: 250.0,
            weight_spread: 0.5,
            tenants: base_tenants(),
            events: Vec::new(),
            shifts: Vec::new(),
            warmup: 10 * S,
            seed: k.seed,
            credit: k.credit,
            credit_pct: k.credit_pct,
            learning_joiners: k.learning_joiners,
            credit_idle_unused: false,
            credit_rearm: true,
            fail_open_retry: true,
            quiet_reports: false,
        }
    }

    /// Directory on `hosts` at `rate` each and the background tenants at t = 0.
    fn with_background(mut self, k: &Knobs, directory: Range<u32>, rate: f64) -> Scenario {
        if !k.background {
            return self;
        }
        self.events.push(demand(0, DIRECTORY, directory, rate));
        let (tenants, traffic) = background(k.seed, self.hosts);
        let first = self.tenants.len();
        self.tenants.extend(tenants);
        for (i, (hosts, rate)) in traffic.into_iter().enumerate() {
            self.events.push(demand(0, first + i, hosts, rate));
        }
        self
    }

    pub(crate) fn finish(mut self, duration: u64) -> Scenario {
        self.duration = duration;
        self.events.sort_by_key(|e| e.at);
        self
    }

    pub fn tenant(&self, name: &str) -> Option<usize> {
        self.tenants.iter().position(|t| t.name == name)
    }
}

/// One hour of steady demand: Contoso offered 120 % of its quota on all 500 hosts,
/// Directory 80 % of its cap, the background tenants as generated.
pub fn steady(k: &Knobs) -> Scenario {
    let mut s = Scenario::new(
        k,
        "steady",
        "Steady demand",
        "All 500 hosts see Contoso (offered ≈ 12,000/s against 10,000/s) and Directory \
         (≈ 1.6 M/s against 2 M/s), plus the background tenants; nothing changes.",
    );
    s.events.push(demand(0, CONTOSO, 0..500, 24.0));
    s.with_background(k, 0..500, 3_200.0)
        .finish(k.steady_duration)
}

/// Contoso's demand (15,000/s) moves from hosts 0–249 to 250–499, and back after longer
/// than the sticky period.
pub fn shift(k: &Knobs) -> Scenario {
    let first = k.lead;
    let back = first + k.sticky() + k.lead / 2;
    let mut s = Scenario::new(
        k,
        "shift",
        "Demand shift",
        "Contoso's 15,000/s moves from hosts 0–249 to hosts 250–499, then back after \
         longer than the sticky period (the hosts left idle meanwhile hold no traffic).",
    );
    s.events.push(demand(0, CONTOSO, 0..250, 60.0));
    s.events.push(labelled(
        demand(first, CONTOSO, 0..250, 0.0),
        "demand moves to hosts 250–499",
    ));
    s.events.push(demand(first, CONTOSO, 250..500, 60.0));
    s.events.push(labelled(
        demand(back, CONTOSO, 0..250, 60.0),
        "demand moves back to hosts 0–249",
    ));
    s.events.push(demand(back, CONTOSO, 250..500, 0.0));
    s.shifts = vec![first, back];
    s.with_background(k, 0..500, 3_200.0)
        .finish(back + k.tail.min(2 * k.lead))
}

/// Contoso below its quota on all hosts; then 10× on 50 of them for three minutes.
pub fn flash(k: &Knobs) -> Scenario {
    let start = k.lead;
    let end = start + k.tail;
    let mut s = Scenario::new(
        k,
        "flash",
        "Flash crowd",
        "Contoso offered ≈ 6,000/s over 500 hosts (under its quota: the rest is \
         headroom); then 10× on hosts 0–49 (≈ 11,400/s in all), then back.",
    );
    s.events.push(demand(0, CONTOSO, 0..500, 12.0));
    s.events.push(labelled(
        demand(start, CONTOSO, 0..50, 120.0),
        "10× on 50 hosts",
    ));
    s.events.push(labelled(
        demand(end, CONTOSO, 0..50, 12.0),
        "flash crowd ends",
    ));
    s.shifts = vec![start, end];
    s.with_background(k, 0..500, 3_200.0).finish(end + k.tail)
}

/// Contoso on 40 hosts (250/s each = the quota); 460 hosts start seeing it at once with
/// the allocator up: the bootstrap overshoot with a grant inside `rtt`.
pub fn join(k: &Knobs) -> Scenario {
    let at = k.lead / 2;
    let mut s = Scenario::new(
        k,
        "join",
        "460 joiners, allocator up",
        "Contoso on hosts 0–39 (300/s offered each, 250/s granted), then hosts 40–499 \
         start receiving 200/s each: they bootstrap at 20/s with 1 token and ask for a \
         grant at once.",
    );
    s.name = format!("join-{}ms", k.rtt / MS);
    s.events.push(demand(0, CONTOSO, 0..40, 300.0));
    s.events.push(labelled(
        demand(at, CONTOSO, 40..500, 200.0),
        "460 hosts join",
    ));
    s.weight_spread = 0.0;
    s.shifts = vec![at];
    s.with_background(k, 0..500, 3_200.0)
        .finish(at + k.tail.min(60 * S))
}

/// Like [`join`], but the 460 hosts start seeing Contoso one after another, `per_s` a
/// second (rolling joins: how a key reaches new LBs in practice), with a 50 ms round trip.
pub fn join_rolling(k: &Knobs, per_s: u32) -> Scenario {
    let at = k.lead / 2;
    let per_s = per_s.max(1);
    let gap = S / u64::from(per_s);
    let mut s = Scenario::new(
        k,
        "join-rolling",
        &format!("460 rolling joiners, {per_s} a second, allocator up"),
        &format!(
            "Contoso on hosts 0–39 (300/s offered each, 250/s granted), then hosts 40–499 \
             start receiving 200/s each, one every {:.1} ms ({per_s} a second): each \
             bootstraps at 20/s with 1 token and asks for a grant at once.",
            gap as f64 / MS as f64
        ),
    );
    s.name = format!("join-rolling-{per_s}");
    s.events.push(demand(0, CONTOSO, 0..40, 300.0));
    for (i, h) in (40..500u32).enumerate() {
        let e = demand(at + i as u64 * gap, CONTOSO, h..h + 1, 200.0);
        s.events.push(if i == 0 {
            labelled(e, &format!("joins begin ({per_s}/s)"))
        } else {
            e
        });
    }
    s.weight_spread = 0.0;
    s.shifts = vec![at];
    s.with_background(k, 0..500, 3_200.0)
        .finish(at + 460 * gap + k.tail.min(60 * S))
}

/// The design's worst case: the allocator dies, then 460 hosts that never saw Contoso
/// start receiving its traffic; Directory (static) gets 50 joiners too.
pub fn outage(k: &Knobs) -> Scenario {
    let down = k.lead;
    let joiners = down + k.sticky() / 5;
    let up = down + k.sticky() * 12 / 5;
    let mut s = Scenario::new(
        k,
        "outage",
        "Allocator outage with joiners",
        "Contoso on hosts 0–39 (300/s offered, 250/s granted each) and Directory on \
         hosts 0–449 (4,800/s each: 2.16 M/s against 2 M/s); the allocator dies; later hosts 40–499 start receiving Contoso (200/s each) and \
         hosts 450–499 Directory; the allocator comes back (a restarted process) after \
         longer than the sticky period.",
    );
    s.events.push(demand(0, CONTOSO, 0..40, 300.0));
    s.events.push(demand(0, DIRECTORY, 0..450, 4_800.0));
    s.events
        .push(allocator(down, Action::AllocatorDown, "allocator down"));
    s.events.push(labelled(
        demand(joiners, CONTOSO, 40..500, 200.0),
        "joiners: 460 Contoso, 50 Directory",
    ));
    s.events.push(demand(joiners, DIRECTORY, 450..500, 4_800.0));
    s.events.push(allocator(
        up,
        Action::AllocatorUp { restart: true },
        "allocator back (restarted)",
    ));
    s.weight_spread = 0.0;
    s.shifts = vec![up];
    // Directory carries its own demand here; only the small tenants are background.
    if k.background {
        let (tenants, traffic) = background(k.seed, s.hosts);
        let first = s.tenants.len();
        s.tenants.extend(tenants);
        for (i, (hosts, rate)) in traffic.into_iter().enumerate() {
            s.events.push(demand(0, first + i, hosts, rate));
        }
    }
    s.finish(up + k.tail)
}

/// The allocator is cut off (but keeps running) for a minute: shorter than the sticky
/// period, so every host goes STICKY and comes back.
pub fn partition(k: &Knobs) -> Scenario {
    let down = k.lead;
    let up = down + k.sticky() / 5;
    let mut s = Scenario::new(
        k,
        "partition",
        "Allocator partitioned",
        "Contoso on all 500 hosts (≈ 12,000/s offered); the allocator is unreachable for \
         a fifth of the sticky period (hosts go STICKY, none fail open), then reachable \
         again with its state intact.",
    );
    s.events.push(demand(0, CONTOSO, 0..500, 24.0));
    s.events
        .push(allocator(down, Action::AllocatorDown, "allocator cut off"));
    s.events.push(allocator(
        up,
        Action::AllocatorUp { restart: false },
        "allocator reachable",
    ));
    s.shifts = vec![up];
    s.with_background(k, 0..500, 3_200.0).finish(up + k.tail)
}

/// The allocator restarts (state lost, down for a few seconds) while 50 hosts join.
pub fn restart(k: &Knobs) -> Scenario {
    let down = k.lead;
    let up = down + 5 * S;
    let mut s = Scenario::new(
        k,
        "restart",
        "Allocator restart",
        "Contoso on hosts 0–449 (≈ 11,700/s offered); the allocator restarts (down 5 s, \
         state lost) and learns for one lease TTL; hosts 450–499 start receiving \
         Contoso during the learning period.",
    );
    s.events.push(demand(0, CONTOSO, 0..450, 26.0));
    s.events
        .push(allocator(down, Action::AllocatorDown, "allocator stops"));
    s.events.push(allocator(
        up,
        Action::AllocatorUp { restart: true },
        "allocator restarted",
    ));
    s.events.push(labelled(
        demand(up + k.ttl() / 3, CONTOSO, 450..500, 26.0),
        "50 joiners",
    ));
    s.shifts = vec![up];
    s.with_background(k, 0..500, 3_200.0).finish(up + k.tail)
}

/// Replicated allocators: the leader crashes and a follower takes over once the dead
/// leader's election lease lapses in etcd (2 s, shorter than the hosts' lease TTL). The
/// new leader starts empty and learns for one lease TTL, as a restarted allocator does.
pub const FAILOVER_GAP_S: u64 = 2;

pub fn failover(k: &Knobs) -> Scenario {
    let down = k.lead;
    let up = down + FAILOVER_GAP_S * S;
    let mut s = Scenario::new(
        k,
        "failover",
        "Allocator leader crash (replicas)",
        "Contoso on hosts 0–449 (≈ 11,700/s offered); the leader of three replicated \
         allocators crashes; its election lease lapses in etcd after 2 s, a follower wins, \
         starts without state and learns for one lease TTL while hosts move to it.",
    );
    s.events.push(demand(0, CONTOSO, 0..450, 26.0));
    s.events
        .push(allocator(down, Action::AllocatorDown, "leader crashes"));
    s.events.push(allocator(
        up,
        Action::AllocatorUp { restart: true },
        "a follower leads",
    ));
    s.shifts = vec![up];
    s.with_background(k, 0..500, 3_200.0).finish(up + k.tail)
}

/// The daemon as implemented: Contoso configured on all 500 hosts from time 0, traffic
/// on 40 of them (saturated, so the idle hosts' share is 0); after longer than
/// lease TTL + sticky period the traffic spreads to the other 460.
pub fn idle(k: &Knobs) -> Scenario {
    let at = k.ttl() + k.sticky() + k.lead / 2;
    let mut s = Scenario::new(
        k,
        "idle",
        "Idle hosts, then traffic (daemon model)",
        "Shares start when the daemon starts, as limiter-user does: Contoso is configured \
         on all 500 hosts, but only hosts 0–39 get traffic (300/s each, saturating the \
         quota). The idle hosts report demand 0. Later, hosts 40–499 start receiving \
         200/s each, with the allocator up.",
    );
    s.share_start = ShareStart::DaemonStart;
    s.events.push(demand(0, CONTOSO, 0..40, 300.0));
    s.events.push(demand(0, CONTOSO, 40..500, 0.0));
    s.events.push(labelled(
        demand(at, CONTOSO, 40..500, 200.0),
        "traffic reaches hosts 40–499",
    ));
    s.weight_spread = 0.0;
    s.shifts = vec![at];
    s.finish(at + k.tail.min(60 * S))
}

/// The design's outage worst case in the daemon model: Contoso and Directory are
/// configured on all 500 hosts from time 0, so the hosts without traffic hold zero
/// grants (closed shares) when the allocator dies; later the traffic reaches them (and,
/// with `moves`, Contoso's leaves hosts 0–39). With `rejoin` (what limiter-user does)
/// each lapsed closed share that refuses frames runs at the bootstrap rate, as a joiner
/// would; without it (pure STICKY) it stays closed.
pub fn outage_idle(k: &Knobs, rejoin: bool, moves: bool) -> Scenario {
    let down = k.lead;
    let joiners = down + k.sticky() / 5;
    let up = down + k.sticky() * 12 / 5;
    let name = match (moves, rejoin) {
        (false, true) => "outage-idle",
        (false, false) => "outage-idle-sticky",
        (true, true) => "outage-move",
        (true, false) => "outage-move-sticky",
    };
    let what = if moves {
        "Contoso's traffic moves from hosts 0–39 to 40–499"
    } else {
        "traffic reaches the closed shares"
    };
    let how = if rejoin {
        "closed shares rejoin (bootstrap rate)"
    } else {
        "closed shares stay closed (pure STICKY, for comparison)"
    };
    let mut s = Scenario::new(
        k,
        name,
        &format!("Allocator outage, {what}; {how}"),
        &format!(
            "Daemon model: Contoso and Directory configured on all 500 hosts from the \
             start; Contoso's traffic on hosts 0–39 (300/s each), Directory's on hosts \
             0–449 (4,800/s each), so the other hosts hold zero grants (closed). The \
             allocator dies; later hosts 40–499 start receiving Contoso (200/s each){} and \
             hosts 450–499 Directory; the allocator comes back (restarted) after longer \
             than the sticky period. {}.",
            if moves {
                ", which hosts 0–39 no longer get"
            } else {
                ""
            },
            if rejoin {
                "A lapsed closed share that refuses frames runs at quota ÷ fleet_size with \
                 a burst of 1, as a joiner does"
            } else {
                "Closed shares stay closed until FAIL_OPEN (Directory: until the allocator \
                 is back)"
            }
        ),
    );
    s.name = name.into();
    s.rejoin = rejoin;
    s.share_start = ShareStart::DaemonStart;
    s.events.push(demand(0, CONTOSO, 0..40, 300.0));
    s.events.push(demand(0, CONTOSO, 40..500, 0.0));
    s.events.push(demand(0, DIRECTORY, 0..450, 4_800.0));
    s.events.push(demand(0, DIRECTORY, 450..500, 0.0));
    s.events
        .push(allocator(down, Action::AllocatorDown, "allocator down"));
    s.events.push(labelled(
        demand(joiners, CONTOSO, 40..500, 200.0),
        "traffic reaches the closed shares: 460 Contoso, 50 Directory",
    ));
    if moves {
        s.events.push(demand(joiners, CONTOSO, 0..40, 0.0));
    }
    s.events.push(demand(joiners, DIRECTORY, 450..500, 4_800.0));
    s.events.push(allocator(
        up,
        Action::AllocatorUp { restart: true },
        "allocator back (restarted)",
    ));
    s.weight_spread = 0.0;
    s.shifts = vec![up];
    s.finish(up + k.tail)
}

/// `base` for Contoso alone (no background), with a global burst of `burst`: how much
/// of the quota a per-host bucket's burst decides.
pub fn with_contoso_burst(mut base: Scenario, burst: u64, duration: u64) -> Scenario {
    base.name = if burst.is_multiple_of(1000) {
        format!("{}-burst{}k", base.name, burst / 1000)
    } else {
        format!("{}-burst{burst}", base.name)
    };
    base.title = format!("{} (Contoso burst {burst})", base.title);
    base.about = format!(
        "{} Here Contoso's global burst is {burst} (per host: burst × share ÷ quota), and \
         only Contoso runs.",
        base.about
    );
    base.tenants[CONTOSO].burst = burst;
    base.events.retain(|e| match &e.action {
        Action::Demand { tenant, .. } => *tenant == CONTOSO,
        _ => true,
    });
    base.tenants.truncate(2);
    base.duration = base.duration.min(duration);
    base
}

/// A variant of `base` for the accuracy comparisons: credit by `credit` with a cap of
/// `cap_pct` % of an interval's quota, and whether the allocator grants a joiner's share while
/// learning; named `base+LABEL`.
pub fn variant(
    mut base: Scenario,
    label: &str,
    credit: CreditMode,
    cap_pct: u64,
    joiners: bool,
) -> Scenario {
    base.credit = credit;
    base.credit_pct = cap_pct;
    base.learning_joiners = joiners;
    base.name = format!("{}+{label}", base.name);
    base.title = format!("{} ({label})", base.title);
    base
}

/// Credit caps (% of an interval's quota) the accuracy candidates compare with the
/// default.
pub const CREDIT_PCT_SWEEP: [u64; 4] = [10, 20, 40, 60];

/// Global bursts of the `steady` burst sweep (Contoso alone): 1 to 100 tokens per host.
pub const BURST_SWEEP: [u64; 7] = [500, 1_000, 2_000, 5_000, 10_000, 20_000, 50_000];

/// Rolling join rates run (joins per second): the most that keeps the design's ~0.9 %
/// by the bootstrap bound with a 50 ms grant ([`joins_per_s_for`]), and
/// twice that.
pub fn rolling_joins(k: &Knobs) -> [u32; 2] {
    let contoso = &base_tenants()[CONTOSO];
    let r = joins_per_s_for(
        BOOTSTRAP_CLAIM_PCT,
        contoso.quota,
        k.params.fleet_size,
        50 * MS,
    );
    [r, 2 * r]
}

/// Every built-in scenario, in report order.
pub fn all(k: &Knobs) -> Vec<Scenario> {
    let mut v = vec![steady(k), shift(k), flash(k)];
    for rtt in [10 * MS, 50 * MS, 200 * MS] {
        let mut kk = k.clone();
        kk.rtt = rtt;
        v.push(join(&kk));
    }
    for per_s in rolling_joins(k) {
        v.push(join_rolling(k, per_s));
    }
    v.extend([
        outage(k),
        outage_idle(k, true, false),
        outage_idle(k, false, false),
        outage_idle(k, true, true),
        outage_idle(k, false, true),
        partition(k),
        restart(k),
        failover(k),
        idle(k),
    ]);
    let short = 600 * S;
    for burst in BURST_SWEEP {
        v.push(with_contoso_burst(steady(k), burst, short));
    }
    v.push(with_contoso_burst(flash(k), 10_000, short));
    // Issue 17's candidates that lost, and the runs without the winners, against the
    // rows above (which run the winners: `Knobs::default`).
    let (credit, cap, joiners) = (k.credit, k.credit_pct, k.learning_joiners);
    let no_credit = |sc: Scenario| variant(sc, "nocredit", CreditMode::Off, 0, joiners);
    let all_unused = |sc: Scenario| {
        let mut sc = variant(sc, "all-unused", credit, cap, joiners);
        sc.credit_idle_unused = true;
        sc
    };
    for burst in [500, 1_000, 2_000] {
        let base = || with_contoso_burst(steady(k), burst, short);
        v.push(no_credit(base()));
        v.push(variant(base(), "tokens", CreditMode::Tokens, cap, joiners));
        for c in CREDIT_PCT_SWEEP {
            v.push(variant(
                base(),
                &format!("bank-{c}pct"),
                CreditMode::Bank,
                c,
                joiners,
            ));
        }
    }
    v.push(all_unused(with_contoso_burst(steady(k), 2_000, short)));
    for sc in [steady(k), shift(k), flash(k)] {
        v.push(no_credit(sc));
    }
    for sc in [shift(k), flash(k)] {
        v.push(all_unused(sc));
    }
    v.push(variant(
        flash(k),
        "bank-60pct",
        CreditMode::Bank,
        60,
        joiners,
    ));
    v.push(variant(outage(k), "nojoiners", credit, cap, false));
    let mut sc = variant(failover(k), "norearm", credit, cap, joiners);
    sc.credit_rearm = false;
    v.push(sc);
    let mut sc = variant(outage(k), "noretry", credit, cap, joiners);
    sc.fail_open_retry = false;
    v.push(sc);
    for sc in [shift(k), flash(k)] {
        let mut sc = variant(sc, "quiet", credit, cap, joiners);
        sc.quiet_reports = true;
        v.push(sc);
    }
    v
}
