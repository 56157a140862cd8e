//! Splitting a rule's global quota across hosts by demand: max-min fair shares
//! (water-filling) whose sum never exceeds the quota, unused quota handed out evenly as
//! headroom, and `saturated` where demand exceeds the share.
//!
//! [`RuleAllocator`] keeps per-host demand for one rule and produces grants; a freshly
//! started allocator spends one lease TTL learning what hosts already hold before it
//! reallocates, so a restart never over-grants.
//!
//! What a host says it holds is a claim, not a fact: any certificate of the fleet's CA
//! can say it holds the whole quota. A claim counts for at most the quota, and while
//! learning for at most what an allocation over the reported demands could have granted
//! it (its max-min fair share). For the first report interval of learning, while not
//! every host has spoken yet, no claim is weighed against the others: each host's lease
//! is extended at what it says it holds, outside the allocator's sums, so the first host
//! to reach a new leader cannot claim the quota before the others have reported theirs,
//! and nobody's lease lapses meanwhile.

use std::{collections::BTreeMap, time::Duration};

use crate::share::Grant;

/// One host's share of a rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allocation {
    pub share: u64,
    pub saturated: bool,
}

/// Max-min fair allocation of `quota` over `demands` (units per second).
///
/// Hosts are served in order of increasing demand; each gets its demand or an equal
/// split of what is left, whichever is smaller. What remains when every demand is met is
/// spread evenly over all hosts as headroom (so a host's growing demand is absorbed until
/// its next report). The shares always sum to exactly `quota` (or 0 without hosts).
///
/// A share may be 0 (a host without demand while the others' demand exceeds the quota):
/// the host enforces it as a closed limit (`Limit::CLOSED`, nothing passes), so what
/// the hosts enforce sums to the quota exactly.
pub fn allocate(quota: u64, demands: &[u64]) -> Vec<Allocation> {
    let n = demands.len();
    let mut shares = vec![0u64; n];
    if n == 0 {
        return Vec::new();
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&i| demands[i]);
    let mut remaining = quota;
    for (served, &i) in order.iter().enumerate() {
        let fair = remaining / (n - served) as u64;
        let give = demands[i].min(fair);
        shares[i] = give;
        remaining -= give;
    }
    // Headroom: the rest, evenly; the indivisible remainder one unit each to the hosts
    // with the largest demand (the last served).
    let each = remaining / n as u64;
    let extra = (remaining % n as u64) as usize;
    for s in &mut shares {
        *s += each;
    }
    for &i in order.iter().rev().take(extra) {
        shares[i] += 1;
    }
    shares
        .iter()
        .zip(demands)
        .map(|(&share, &demand)| Allocation {
            share,
            saturated: demand > share,
        })
        .collect()
}

/// Jain's fairness index over how well each host's demand is met (share ÷ demand, capped
/// at 1): 1.0 when every host is served in the same proportion.
pub fn fairness_index(demands: &[u64], allocations: &[Allocation]) -> f64 {
    let xs: Vec<f64> = demands
        .iter()
        .zip(allocations)
        .filter(|(d, _)| **d > 0)
        .map(|(d, a)| (a.share as f64 / *d as f64).min(1.0))
        .collect();
    if xs.is_empty() {
        return 1.0;
    }
    let sum: f64 = xs.iter().sum();
    let squares: f64 = xs.iter().map(|x| x * x).sum();
    sum * sum / (xs.len() as f64 * squares)
}

/// What a host said in its report for one rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Report {
    /// Offered load (passed + dropped) per second over the last interval.
    pub demand: u64,
    /// The share the host says it enforces now (0 while bootstrapping): a claim,
    /// counted for at most the quota.
    pub held: u64,
}

/// What a host counted for a rule since its previous report (the credit's input).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Frames admitted (its credit included).
    pub admitted: u64,
    /// Frames refused.
    pub denials: u64,
    /// Frames admitted on credit (refused by the bucket, admitted by the credit).
    pub credited: u64,
    /// The credit of the host's last grant (which a learning allocator renews, as it
    /// renews shares).
    pub credit: u64,
}

/// Frame-nanoseconds per frame: the credit's level is kept in frames × 10⁻⁹ so that
/// `share × elapsed` needs no rounding.
const FRAME: i128 = 1_000_000_000;

#[derive(Clone, Copy, Debug)]
struct HostState {
    /// This host's part of the last allocation (outside learning).
    target: Allocation,
    /// Smoothed demand, the allocation's input.
    demand: u64,
    /// The demand as last reported (unsmoothed).
    reported: u64,
    /// What it says it holds, at most the quota.
    held: u64,
    last_report: u64,
    /// The share last granted to this host (outstanding until its lease lapses); `None`
    /// while it holds no grant (BOOTSTRAP, or no grant while learning).
    granted: Option<u64>,
    /// Frames it refused in its last reported interval (0 without usage).
    denials: u64,
    /// The shares it held since its last report, integrated over time (frame-ns) up
    /// to `held_since`: what it could use, against which its usage is measured.
    entitled: i128,
    held_since: u64,
    /// Whether it held a positive share through its whole current interval (its grant
    /// before the last one was positive too): only then does its usage say what a bucket
    /// of that share wastes (a host that just took over from BOOTSTRAP or a closed share
    /// starts with at most one token, and its grant reached it half a round trip late).
    steady: bool,
    /// Its last grant was a joiner's share while learning (burst 1).
    joiner: bool,
    /// The credit it said its last grant carried.
    credit_held: u64,
    /// The `fleet_size` it reported (its own bootstrap divisor); 0: none (a host that
    /// predates the field).
    fleet_size: u32,
    /// The credit of its last grant (its bucket's credit, at most: it may have spent
    /// some; the next grant replaces it).
    credit: u64,
    /// What its last report raised the credit level by (frame-ns, after the clamp).
    raised: i128,
    /// The `learning_until` of the learning period in which this allocator renewed the
    /// credit the host said it held (0: none). A credit is renewed once a learning
    /// period: each grant's credit replaces what is left in the bucket, so a renewal at
    /// every grant would hand the same credit out again every report interval.
    renewed_in: u64,
}

impl HostState {
    /// What this host enforces under its grant (a zero grant is closed: nothing).
    fn enforced(&self) -> u64 {
        self.granted.unwrap_or(0)
    }

    /// The share it enforces: its grant, or before this allocator granted it one, what
    /// it said it holds (an earlier allocator's grant).
    fn in_force(&self) -> u64 {
        self.granted.unwrap_or(self.held)
    }

    /// What it may enforce now: what it said it holds (an earlier allocator's grant, or
    /// this one's before the host has it) or this allocator's last grant, the larger.
    fn claim(&self) -> u64 {
        self.held.max(self.enforced())
    }

    /// A host with demand that enforces no share: it said it holds nothing (BOOTSTRAP,
    /// FAIL_OPEN, a lease lapsed) and its last grant from this allocator, if any, was not
    /// a zero grant (closed: it admits nothing). What it admits is outside every share.
    /// A host whose first positive grant is on its way counts until it reports holding it.
    fn joining(&self) -> bool {
        self.demand > 0 && self.held == 0 && self.granted != Some(0)
    }

    /// Adds the share held since `held_since` to `entitled` (before the share changes,
    /// and at a report).
    fn entitle(&mut self, now: u64) {
        let held = i128::from(now.saturating_sub(self.held_since));
        self.entitled += i128::from(self.in_force()) * held;
        self.held_since = now;
    }
}

/// One rule's allocation state in the allocator.
#[derive(Clone, Debug)]
pub struct RuleAllocator {
    pub quota: u64,
    /// Global burst; each host's burst is its proportional part of it.
    pub burst: u64,
    pub lease_ttl: Duration,
    /// Until this time (ns) the allocator only renews what hosts hold.
    learning_until: u64,
    /// How long learning gathers claims before it weighs any against the others (ns):
    /// one report interval, in which every live host reports; meanwhile a host's lease
    /// is extended as it is. 0: no gathering.
    pub gather_ns: u64,
    /// The last report for the rule; `None` before the first one since the rule was
    /// added to a running allocator (nobody can hold a share of it: no need to learn).
    last_heard: Option<u64>,
    hosts: BTreeMap<String, HostState>,
    /// The allocation is recomputed at most this often (ns), unless hosts join or
    /// lapse or the quota changes; 0 recomputes it at every grant. Recomputing costs
    /// O(hosts log hosts); at every report of every host that is O(hosts²) a second
    /// per rule, which one core cannot carry for a large fleet. A share computed from
    /// demands up to this old is still capped by what the others hold, so the shares in
    /// force never sum above the quota either way.
    pub refresh_ns: u64,
    /// When the hosts' `target`s were computed, and with which quota; `None` when a
    /// host joined or lapsed since, or the rule is learning.
    computed: Option<(u64, u64)>,
    /// Sums over the hosts, kept as grants and reports change them.
    enforced_sum: u64,
    /// While learning: Σ of the claims each capped by the host's fair share (its
    /// `target`), as of the last allocation.
    fair_held_sum: u64,
    /// While learning: Σ of what each host may enforce ([`HostState::claim`]), from
    /// which a renewal lifted above what a host holds takes its room.
    claimed_sum: u64,
    /// No host lapses before this (a lower bound: the oldest report plus the TTL).
    next_expiry: u64,
    /// The most credit (frames) the fleet may hold at once; 0: no credit. See
    /// [`RuleAllocator::report_usage`].
    pub credit_cap: u64,
    /// The credit level (frame-nanoseconds): quota the fleet left unused, net of what it
    /// admitted beyond its shares, clamped to `[0, min(credit_cap, denials_sum)]`.
    credit_level: i128,
    /// Σ of the hosts' last reported denials.
    denials_sum: u64,
    /// Hosts with demand that enforce no share ([`HostState::joining`]: BOOTSTRAP,
    /// FAIL_OPEN): no credit is granted while there are any, since their bootstrap frames
    /// are outside every share (the design's bootstrap budget) and a credit must not add
    /// to them. A host waiting on a zero grant (closed) admits nothing and does not count:
    /// one such host stopped every credit of a flash crowd for a second (−15 %).
    joining: usize,
    /// Whether a host's unused share counts towards the level even when its demand fell
    /// well below the share (a candidate that lost in the accuracy comparison, kept for the simulator's comparison:
    /// hosts a demand shift leaves idle then wind the level up, and the fleet overshoots
    /// once the shares have followed the shift).
    pub credit_idle_unused: bool,
    /// Σ of the hosts' `credit`: the credit outstanding, at most `credit_cap`.
    credit_sum: u64,
    /// Carried remainder of the credit split (so rounding loses nothing).
    credit_carry: u128,
    /// The hosts' demands together exceed the quota (at the last allocation).
    oversubscribed: bool,
    /// While learning, a host that holds nothing (BOOTSTRAP, or FAIL_OPEN after an
    /// outage longer than sticky_max) is granted this (the hosts' bootstrap share,
    /// quota ÷ fleet_size) with one token, capped like every grant by what the others
    /// hold, instead of nothing: a FAIL_OPEN host is limited at once rather than pass
    /// everything for the learning period. 0: it gets nothing while learning.
    pub learning_joiner_share: u64,
    /// Whether a joiner's share while learning comes from the host's own report: quota ÷
    /// the `fleet_size` it reported, divided by at least the hosts this allocator hears
    /// from (a host that claims a small fleet gains nothing once the others report), so
    /// that the hosts' and the allocator's divisors cannot disagree. A host that reported
    /// none gets `learning_joiner_share`. false: `learning_joiner_share` for every host
    /// (the allocator's own `fleet_size`).
    pub joiner_from_reports: bool,
    /// The fleet's size as the allocator's file sets it (0: none; with
    /// `joiner_from_reports`, the largest the hosts report). A learning allocator that
    /// hears from that many hosts knows every share in force, and may lift a renewal
    /// into the room their claims leave.
    pub fleet_size: u32,
    /// While learning: the hosts heard from are at least the fleet's size.
    fleet_heard: bool,
}

/// `computed` moved back so that the allocation is recomputed at the next grant, or a
/// sixteenth of `refresh_ns` after the last computation if that was later: hosts that
/// flap between idle and busy cost at most 16 allocations per refresh period, not one
/// per report.
fn recompute_soon(computed: Option<(u64, u64)>, refresh_ns: u64, now: u64) -> Option<(u64, u64)> {
    let step = refresh_ns / 16;
    computed.map(|(at, quota)| {
        let due = now.max(at.saturating_add(step));
        (at.min(due.saturating_sub(refresh_ns)), quota)
    })
}

/// While learning: renew what a host holds, at most its fair share (its `target`: no
/// allocator could have granted it more for the demands reported, so a larger claim is a
/// lie or a stale lease), scaled down if together these holdings (`fair_held_sum`) exceed
/// the quota; a host holding nothing gets `joiner` (a joiner's share, quota ÷ fleet_size;
/// 0: none, it stays in BOOTSTRAP or FAIL_OPEN until learning ends). A host holding less
/// than a joiner's share gets up to that share within its fair share, as one holding
/// nothing would (else a renewal that fell with a low first demand stays there for the
/// lease TTL); [`RuleAllocator::capped_grant`] takes that lift from the room the claims
/// leave. While gathering, a holding is extended as it is.
fn renewal(
    h: &HostState,
    fair_held_sum: u64,
    quota: u64,
    joiner: u64,
    gathering: bool,
) -> Allocation {
    let held = h.held.min(h.target.share);
    let share = if h.held == 0 {
        joiner
    } else if gathering {
        // Its lease extended as it is ([`RuleAllocator::capped_grant`]).
        h.held
    } else if fair_held_sum > quota {
        (u128::from(held) * u128::from(quota) / u128::from(fair_held_sum)) as u64
    } else {
        h.held.max(joiner).min(h.target.share)
    };
    Allocation {
        share,
        saturated: h.demand > share,
    }
}

/// A learning allocator's share for a host that holds nothing: quota ÷ the `fleet_size`
/// the host reported, at least ÷ the `hosts` heard from, when `from_reports` and the
/// host reported one; otherwise `configured` (quota ÷ the allocator's own `fleet_size`,
/// or 0: none).
fn joiner_share(
    from_reports: bool,
    configured: u64,
    quota: u64,
    reported: u32,
    hosts: usize,
) -> u64 {
    if !from_reports || reported == 0 {
        return configured;
    }
    let divisor = reported.max(u32::try_from(hosts).unwrap_or(u32::MAX));
    crate::share::Share::bootstrap_rate(quota, divisor)
}

/// The `refresh_ns` the allocator (and the simulator, which models it) uses: half a
/// report interval, so each host's grant comes from an allocation at most half an
/// interval older than the others' latest reports.
pub fn refresh_for(report_interval: Duration) -> u64 {
    ns(report_interval) / 2
}

/// The `gather_ns` the allocator uses: one report interval, in which every live host
/// reports (a host that lost its leader tries the next replica after 200 ms).
pub fn gather_for(report_interval: Duration) -> u64 {
    ns(report_interval)
}

/// The credit cap by default: 30 % of what the quota admits in one report interval
/// (README, "Accuracy vs burst, and the credit": the simulator's fleets at 2 tokens per
/// host need it to admit their quota).
pub const DEFAULT_CREDIT_PCT: u64 = 30;

/// A rule's `credit_cap`: `pct` % of what its quota admits in one report interval. What
/// the credit makes up is a fraction of the quota (what small buckets overflow while
/// others refuse frames), so its cap is one too, whatever the rule's burst.
pub fn credit_cap_for(quota: u64, report_interval: Duration, pct: u64) -> u64 {
    let frames =
        u128::from(quota) * report_interval.as_nanos() * u128::from(pct) / (100 * 1_000_000_000);
    u64::try_from(frames).unwrap_or(u64::MAX)
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl RuleAllocator {
    /// A rule known to an allocator that started at `now`: hosts may hold shares that an
    /// earlier allocator process granted, so it learns for one lease TTL (and again
    /// whenever it heard no report for a lease TTL).
    pub fn new(quota: u64, burst: u64, lease_ttl: Duration, now: u64) -> RuleAllocator {
        RuleAllocator {
            quota,
            burst,
            lease_ttl,
            learning_until: now.saturating_add(ns(lease_ttl)),
            gather_ns: 0,
            last_heard: Some(now),
            hosts: BTreeMap::new(),
            refresh_ns: 0,
            computed: None,
            enforced_sum: 0,
            fair_held_sum: 0,
            claimed_sum: 0,
            next_expiry: u64::MAX,
            credit_cap: 0,
            credit_level: 0,
            denials_sum: 0,
            credit_idle_unused: false,
            joining: 0,
            credit_sum: 0,
            credit_carry: 0,
            oversubscribed: true,
            learning_joiner_share: 0,
            joiner_from_reports: false,
            fleet_size: 0,
            fleet_heard: false,
        }
    }

    /// A rule added at `now` to an allocator that started at `started` (`quota set` for a
    /// rule it did not have): no host holds a grant of it from this process, so it
    /// allocates from its first report — unless the process itself is still within its
    /// start-up lease TTL, when an earlier process's grants may still be in force.
    pub fn added(
        quota: u64,
        burst: u64,
        lease_ttl: Duration,
        started: u64,
        now: u64,
    ) -> RuleAllocator {
        let mut r = RuleAllocator::new(quota, burst, lease_ttl, started);
        r.last_heard = None;
        if !r.learning(now) {
            r.learning_until = 0;
        }
        r
    }

    /// Whether the allocator is still learning what hosts hold.
    pub fn learning(&self, now: u64) -> bool {
        now < self.learning_until
    }

    /// Whether learning still gathers the hosts' claims, renewing none: the first
    /// `gather_ns` of the learning period.
    fn gathering(&self, now: u64) -> bool {
        let start = self.learning_until.saturating_sub(ns(self.lease_ttl));
        self.learning(now) && now < start.saturating_add(self.gather_ns)
    }

    /// Records a report. Demand is smoothed over the last two reports (their mean, but
    /// never below the newest): growth is seen at once, a drop counts fully from the
    /// second report that shows it, and one noisy interval moves a share by half.
    pub fn report(&mut self, host: &str, report: Report, now: u64) {
        self.report_usage(host, report, None, now);
    }

    /// [`RuleAllocator::report`] with what the host admitted and refused since its last
    /// report: the input of the credit (DRL's "unused share reassigned").
    ///
    /// Each host's bucket wastes tokens whenever it is full (at a few tokens per host,
    /// Poisson arrivals overflow often), while others refuse frames: the fleet admits
    /// less than its quota. The allocator keeps a credit level, a virtual global bucket
    /// of `credit_cap` frames: each report adds what the host left unused of the share it
    /// was granted (`share × elapsed − admitted`, negative when it admitted more, its
    /// credit included), and the level is clamped to `[0, min(credit_cap, Σ denials)]`
    /// (never more credit than frames the fleet refused in its last intervals). Grants
    /// to saturated hosts that refused frames carry their part of the level as a credit
    /// (in proportion to their shares, at most what each refused): one-time frames
    /// beyond the bucket, replaced by the next grant. Shares (rates) are untouched, so
    /// they still sum to at most the quota; the credits outstanding sum to at most the
    /// level, so at most `credit_cap`. The level is an integrator of the fleet's
    /// shortfall: over n report intervals the fleet admits at most n × quota × interval
    /// + the level at the start + the buckets' bursts.
    pub fn report_usage(&mut self, host: &str, report: Report, usage: Option<Usage>, now: u64) {
        // A host whose demand left (its count below an eighth of a demand that had it
        // expect 24 frames or more: Poisson counts fall that far once in 10⁸ intervals)
        // gives its share up at once rather than over two reports, feeds no credit, and
        // the allocation is recomputed at the next grant: the hosts the demand moved to
        // get it at their next report, one interval sooner.
        let left = self.hosts.get(host).is_some_and(|h| {
            let expected = u128::from(h.demand) * u128::from(now.saturating_sub(h.last_report));
            expected >= 24 * FRAME as u128 && u128::from(report.demand) * 8 < u128::from(h.demand)
        });
        if let (Some(u), Some(h)) = (usage, self.hosts.get_mut(host)) {
            // What the bucket refused: a credit spent on a frame does not make it less
            // wanted (else the credit would cap itself).
            let refused = u.denials.saturating_add(u.credited);
            self.denials_sum = self.denials_sum - h.denials + refused;
            h.denials = refused;
            h.credit_held = u.credit;
            // Learning too: the level only bounds credits, which are not shares, and a
            // new leader would otherwise drop to what the buckets alone admit.
            if self.credit_cap > 0 {
                h.entitle(now);
                if h.steady {
                    let mut unused = h.entitled - i128::from(u.admitted) * FRAME;
                    // Offered below an eighth of its share: its demand fell (a host a
                    // shift left idle, a flash crowd gone), and the allocation moves that
                    // share within a few intervals by itself; a credit for it too would
                    // overshoot once it has. Short of that, what it left unused is what
                    // its bucket wasted, or a share above its demand (one-second counts
                    // of a few frames, early reports after a burst), to be reassigned.
                    let entitled = u64::try_from(h.entitled / FRAME).unwrap_or(0);
                    let offered = u.admitted.saturating_add(u.denials);
                    let fell = left || offered.saturating_mul(8) < entitled;
                    let mut level = self.credit_level;
                    if !self.credit_idle_unused && fell {
                        unused = unused.min(0);
                        // What it left unused in the interval before was most likely
                        // the same fall, seen in part (its demand left mid-interval),
                        // not a bucket's waste: taken back, else that stale credit is
                        // handed out once the shares have followed the shift.
                        level -= h.raised;
                    }
                    let top = if self.oversubscribed {
                        i128::from(self.credit_cap.min(self.denials_sum)) * FRAME
                    } else {
                        i128::from(self.credit_cap) * FRAME
                    };
                    let raised = (level + unused).clamp(0, top);
                    h.raised = (raised - self.credit_level).max(0);
                    self.credit_level = raised;
                }
            }
        } else if usage.is_none() {
            if let Some(h) = self.hosts.get_mut(host) {
                self.denials_sum -= h.denials;
                h.denials = 0;
            }
        }
        if let Some(h) = self.hosts.get_mut(host) {
            h.entitled = 0;
            h.held_since = now;
        }
        if self
            .last_heard
            .is_some_and(|t| now.saturating_sub(t) > ns(self.lease_ttl))
        {
            self.learning_until = now.saturating_add(ns(self.lease_ttl));
            self.computed = None;
            self.credit_level = 0;
        }
        self.last_heard = Some(now);
        self.next_expiry = self.next_expiry.min(now.saturating_add(ns(self.lease_ttl)));
        // A claim above the quota is no share any allocator granted.
        let report = Report {
            held: report.held.min(self.quota),
            ..report
        };
        match self.hosts.get_mut(host) {
            Some(h) => {
                let was = h.joining();
                // A demand that comes back after a report of none (the hosts a shift
                // returns to) is reallocated at the next grant too, else it waits up to
                // a refresh for its share; if worth 24 frames since the last report,
                // so that a trickle flapping between 0 and 1 frame a second does not.
                let back = h.demand == 0
                    && u128::from(report.demand) * u128::from(now.saturating_sub(h.last_report))
                        >= 24 * FRAME as u128;
                if back {
                    self.computed = recompute_soon(self.computed, self.refresh_ns, now);
                }
                h.demand = if left {
                    self.computed = recompute_soon(self.computed, self.refresh_ns, now);
                    report.demand
                } else {
                    report.demand.max(h.reported / 2 + report.demand / 2)
                };
                h.held = report.held;
                self.joining = self.joining + usize::from(h.joining()) - usize::from(was);
                h.reported = report.demand;
                h.last_report = now;
            }
            None => {
                self.joining += usize::from(report.demand > 0 && report.held == 0);
                self.denials_sum += usage.map_or(0, |u| u.denials.saturating_add(u.credited));
                self.computed = None;
                self.hosts.insert(
                    host.to_string(),
                    HostState {
                        target: Allocation {
                            share: 0,
                            saturated: false,
                        },
                        demand: report.demand,
                        reported: report.demand,
                        held: report.held,
                        last_report: now,
                        granted: None,
                        denials: usage.map_or(0, |u| u.denials.saturating_add(u.credited)),
                        entitled: 0,
                        held_since: now,
                        steady: false,
                        joiner: false,
                        credit_held: usage.map_or(0, |u| u.credit),
                        credit: 0,
                        raised: 0,
                        renewed_in: 0,
                        fleet_size: 0,
                    },
                );
            }
        }
    }

    /// The `fleet_size` `host` reported with its last report (0: none), read by a
    /// learning allocator with [`RuleAllocator::joiner_from_reports`]. A host not known
    /// (no report of this rule yet) is not added.
    pub fn set_reported_fleet_size(&mut self, host: &str, fleet_size: u32) {
        if let Some(h) = self.hosts.get_mut(host) {
            h.fleet_size = fleet_size;
        }
    }

    /// The share a host holding nothing is granted while learning
    /// ([`RuleAllocator::learning_joiner_share`], [`RuleAllocator::joiner_from_reports`]).
    fn joiner_share(&self, h: &HostState) -> u64 {
        joiner_share(
            self.joiner_from_reports,
            self.learning_joiner_share,
            self.quota,
            h.fleet_size,
            self.hosts.len(),
        )
    }

    /// Forgets hosts whose last report is older than a lease: their grant has lapsed.
    pub fn expire(&mut self, now: u64) {
        if now <= self.next_expiry {
            return;
        }
        let ttl = ns(self.lease_ttl);
        let before = self.hosts.len();
        self.hosts
            .retain(|_, h| now.saturating_sub(h.last_report) <= ttl);
        if self.hosts.len() != before {
            self.computed = None;
            self.enforced_sum = self.hosts.values().map(HostState::enforced).sum();
            self.denials_sum = self.hosts.values().map(|h| h.denials).sum();
            self.joining = self.hosts.values().filter(|h| h.joining()).count();
            self.credit_sum = self.hosts.values().map(|h| h.credit).sum();
        }
        self.next_expiry = self
            .hosts
            .values()
            .map(|h| h.last_report.saturating_add(ttl))
            .min()
            .unwrap_or(u64::MAX);
    }

    /// The credit level, in frames (see [`RuleAllocator::report_usage`]).
    pub fn credit_level(&self) -> u64 {
        u64::try_from(self.credit_level / FRAME).unwrap_or(0)
    }

    pub fn hosts(&self) -> usize {
        self.hosts.len()
    }

    /// Host names in the order of [`RuleAllocator::demands`].
    pub fn host_names(&self) -> Vec<String> {
        self.hosts.keys().cloned().collect()
    }

    /// Smoothed demand per host (the allocation's input).
    pub fn demands(&self) -> Vec<u64> {
        self.hosts.values().map(|h| h.demand).collect()
    }

    /// The grant for `host` (which just reported), or `None` while it can have no share.
    ///
    /// Hosts get their grants one report at a time, so the target allocation is capped
    /// by what the other hosts still hold: the shares in force never sum above the
    /// quota, even while a demand shift moves quota between hosts (a growing host gets
    /// its full share once the shrinking ones have renewed with theirs, within one report
    /// interval).
    ///
    /// A host that arrives while the others hold the whole quota, or whose demand is 0
    /// while theirs exceeds it, gets a zero grant: it stays LEASED (an open rule does not
    /// fail open under a healthy allocator) and enforces a closed limit (nothing passes).
    /// Such a grant says `saturated: false` when the host reported no demand, so its
    /// first refusals send a report at once; it says `saturated: true` when the host has
    /// demand and merely waits for the others' renewals to make room.
    pub fn grant_for(&mut self, host: &str, now: u64) -> Option<Grant> {
        self.expire(now);
        let learning = self.learning(now);
        self.refresh(now, learning);
        self.capped_grant(host, learning, now)
    }

    /// [`RuleAllocator::grant_for`] for several hosts whose reports arrived together:
    /// one allocation, then each host in turn capped by what the others hold — the same
    /// grants as calling `grant_for` for each in order, without recomputing the
    /// allocation per host (the simulator's batches of simultaneous reports).
    pub fn grants_for(&mut self, hosts: &[&str], now: u64) -> Vec<Option<Grant>> {
        self.expire(now);
        let learning = self.learning(now);
        self.refresh(now, learning);
        hosts
            .iter()
            .map(|host| self.capped_grant(host, learning, now))
            .collect()
    }

    fn capped_grant(&mut self, host: &str, learning: bool, now: u64) -> Option<Grant> {
        let gathering = self.gathering(now);
        let (quota, fair_held_sum, enforced_sum) =
            (self.quota, self.fair_held_sum, self.enforced_sum);
        let joiner_share = self.joiner_share(self.hosts.get(host)?);
        let h = self.hosts.get_mut(host)?;
        if gathering && h.held > 0 {
            // Not every host has reported what it holds yet, so no claim is weighed
            // against the others (the first to reach a new leader could claim the
            // quota). The host's lease is extended at what it says it holds (at most the
            // quota: the share an earlier allocator granted an honest host), outside this
            // allocator's sums, so it changes nobody else's grant and the host stays
            // leased through a failover.
            let (share, saturated) = (h.held, h.demand > h.held);
            // It held this share through the interval it reports next (an earlier
            // leader's grant): its usage feeds the level, which must count what the
            // renewed credit admits before it grants more.
            h.entitle(now);
            h.steady = !h.joiner;
            let credit = self.renew_credit(host);
            let g = self.grant(Allocation { share, saturated });
            return Some(Grant {
                tokens: 0,
                credit,
                ..g
            });
        }
        let target = if learning {
            renewal(h, fair_held_sum, quota, joiner_share, gathering)
        } else {
            h.target
        };
        let own = h.enforced();
        let others = enforced_sum - own;
        let mut share = target.share.min(quota.saturating_sub(others));
        if learning && h.held > 0 {
            // A renewal lifted above what the host holds (to a joiner's share) comes out
            // of the room every host's claim leaves (the shares an earlier allocator
            // granted are in force beside this one's until their leases are renewed), and
            // only once the whole fleet has been heard from: a host not heard from may
            // hold that room.
            let held = renewal(h, fair_held_sum, quota, 0, gathering).share;
            let room = if self.fleet_heard {
                quota.saturating_sub(self.claimed_sum.saturating_sub(h.claim()))
            } else {
                0
            };
            share = share.min(held.max(room));
        }
        // While learning, a host holding nothing gets no zero grant (it stays in
        // BOOTSTRAP or FAIL_OPEN), nor does anyone while gathering (it keeps its lease);
        // a claim with no room left is closed as outside learning.
        let granted = (share > 0 || !learning || (h.held > 0 && !gathering)).then_some(share);
        // The token a grant takes over with: one for a host that held no grant (its
        // bootstrap token, as the brief has it: docs/design.md), none after a zero grant
        // (the host had its token in BOOTSTRAP already) and none for a zero grant (closed).
        let tokens = u64::from(h.granted.is_none() && share > 0);
        let joiner = learning && h.held == 0;
        h.entitle(now);
        let was = h.joining();
        // A joiner's share while learning (burst 1, as BOOTSTRAP) is not steady: its
        // usage says nothing of what a granted burst wastes.
        h.steady = h.in_force() > 0 && share > 0 && !joiner && !h.joiner;
        h.joiner = joiner;
        let claim = h.claim();
        h.granted = granted;
        if learning {
            // Kept through a batch of grants (`refresh` sums it once per batch); outside
            // learning it is not read, and not kept.
            self.claimed_sum = self
                .claimed_sum
                .saturating_sub(claim)
                .saturating_add(h.claim());
        }
        self.joining = self.joining + usize::from(h.joining()) - usize::from(was);
        let saturated = h.demand > share;
        self.enforced_sum = others + granted.unwrap_or(0);
        let renew = learning && share > 0 && !joiner && h.renewed_in != self.learning_until;
        let credit = if renew {
            // Learning: what the host holds is renewed, its credit too (an earlier
            // leader's level, which this one has not measured yet), within the cap, once:
            // the next grants' credits come from the level this allocator measures from
            // the reports (which count what the renewed credit admitted), as outside
            // learning.
            self.renew_credit(host)
        } else {
            let mut credit = 0;
            if share > 0 && self.joining == 0 && !self.oversubscribed {
                // Every demand is met and quota is left over, yet small buckets still refuse
                // the peaks of random arrivals (a fleet at 60 % of its quota refused 4.6 % of
                // what it offered), at random hosts, so a credit for last interval's refusals
                // lands where none come next. Each host gets its part of the level by share
                // instead, at most one burst of its own: a bucket twice as deep, while the
                // spare quota pays for it. A fleet-wide surge spends at most the global
                // burst of it.
                let level = u128::try_from(self.credit_level / FRAME).unwrap_or(0);
                let q = u128::from(self.quota.max(1));
                let n = level * u128::from(share) + self.credit_carry.min(q - 1);
                self.credit_carry = n % q;
                let burst = u128::from(self.burst) * u128::from(share) / q;
                credit = u64::try_from((n / q).min(level).min(burst)).unwrap_or(u64::MAX);
            } else if share > 0 && h.denials > 0 && self.joining == 0 {
                // The host's part of the level, in proportion to what it refused among what
                // the fleet refused, and at most that.
                let level = u128::try_from(self.credit_level / FRAME).unwrap_or(0);
                let d = u128::from(self.denials_sum.max(h.denials));
                // (The carry of a split by another sum is below that sum, not this one.)
                let n = level * u128::from(h.denials) + self.credit_carry.min(d - 1);
                self.credit_carry = n % d;
                credit = u64::try_from((n / d).min(level))
                    .unwrap_or(u64::MAX)
                    .min(h.denials);
            }
            // The credit outstanding (this one replacing the host's last) stays within
            // the cap, whatever the level did since the others' grants, and within the
            // level: the others' credits of this round are in the level until their
            // reports say they were spent, so a part of the whole level would hand them
            // out twice (and the level, clamped at 0 once the reports come, would forget
            // it).
            let others_credit = self.credit_sum - h.credit;
            let level = u64::try_from(self.credit_level / FRAME).unwrap_or(0);
            credit = credit
                .min(self.credit_cap.saturating_sub(others_credit))
                .min(level.saturating_sub(others_credit));
            h.credit = credit;
            self.credit_sum = others_credit + credit;
            credit
        };
        // A joiner's share while learning runs as BOOTSTRAP does (burst 1): the grant
        // only limits a FAIL_OPEN host at once and keeps a BOOTSTRAP one as it was.
        granted.map(|share| {
            let g = self.grant(Allocation { share, saturated });
            Grant {
                tokens,
                credit,
                burst: if joiner { 1 } else { g.burst },
                ..g
            }
        })
    }

    /// Shares in force now (granted and not lapsed), summed: never above the quota (a
    /// zero grant is closed and counts 0).
    pub fn outstanding(&mut self, now: u64) -> u64 {
        self.expire(now);
        self.enforced_sum
    }

    /// Recomputes the hosts' targets when they are stale: a host joined or lapsed, the
    /// quota changed, or `refresh_ns` has passed. While learning they cap what each
    /// host's claim renews (`fair_held_sum`).
    fn refresh(&mut self, now: u64, learning: bool) {
        if learning {
            // The claims change at every report; their capped sum is cheap to keep
            // current, the targets are refreshed as outside learning.
            self.reallocate(now);
            self.fair_held_sum = self
                .hosts
                .values()
                .fold(0, |sum, h| sum.saturating_add(h.held.min(h.target.share)));
            self.claimed_sum = self
                .hosts
                .values()
                .fold(0, |sum, h| sum.saturating_add(h.claim()));
            let size = if self.joiner_from_reports {
                self.hosts.values().map(|h| h.fleet_size).max().unwrap_or(0)
            } else {
                self.fleet_size
            };
            self.fleet_heard = size > 0 && self.hosts.len() >= size as usize;
            return;
        }
        self.reallocate(now);
    }

    fn reallocate(&mut self, now: u64) {
        let fresh = self.computed.is_some_and(|(at, quota)| {
            quota == self.quota && now.saturating_sub(at) < self.refresh_ns
        });
        if fresh {
            return;
        }
        let demands: Vec<u64> = self.hosts.values().map(|h| h.demand).collect();
        // Saturating: a demand is a report's claim, u64::MAX included, and a wrapped sum
        // would call a fleet asking for everything undersubscribed.
        self.oversubscribed = demands.iter().fold(0u64, |s, d| s.saturating_add(*d)) > self.quota;
        for (h, a) in self.hosts.values_mut().zip(allocate(self.quota, &demands)) {
            h.target = a;
        }
        self.computed = Some((now, self.quota));
    }

    fn targets(&mut self, now: u64) -> Vec<Allocation> {
        let learning = self.learning(now);
        let gathering = self.gathering(now);
        self.refresh(now, learning);
        let (fair_held_sum, quota) = (self.fair_held_sum, self.quota);
        self.hosts
            .values()
            .map(|h| {
                if learning {
                    renewal(h, fair_held_sum, quota, self.joiner_share(h), gathering)
                } else {
                    // The share of the last allocation; saturated by the host's demand
                    // now (the allocation may be half an interval old).
                    Allocation {
                        share: h.target.share,
                        saturated: h.demand > h.target.share,
                    }
                }
            })
            .collect()
    }

    /// The target allocation of every live host, in the order of
    /// [`RuleAllocator::host_names`] (shares of 0 included: an idle host's is not
    /// saturated).
    pub fn allocations(&mut self, now: u64) -> Vec<Allocation> {
        self.expire(now);
        self.targets(now)
    }

    /// The target grants for every live host, by host name (before the outstanding
    /// cap of [`RuleAllocator::grant_for`]): the allocation as the fleet converges to it.
    pub fn grants(&mut self, now: u64) -> BTreeMap<String, Grant> {
        self.expire(now);
        let allocations = self.targets(now);
        let names: Vec<&String> = self.hosts.keys().collect();
        names
            .into_iter()
            .zip(allocations)
            .filter(|(_, a)| a.share > 0)
            .map(|(name, a)| (name.clone(), self.grant(a)))
            .collect()
    }

    /// While learning: the credit `host` said its last grant carried, renewed once a
    /// learning period (`HostState::renewed_in`; 0 for a second grant in the same period)
    /// and within what the cap leaves, counted in the credit outstanding; the level starts
    /// at least at the credits renewed (the earlier leader's level).
    fn renew_credit(&mut self, host: &str) -> u64 {
        let (cap, period) = (self.credit_cap, self.learning_until);
        let Some(h) = self.hosts.get_mut(host) else {
            return 0;
        };
        let claimed = if h.renewed_in == period {
            0
        } else {
            h.credit_held.min(cap)
        };
        let others = self.credit_sum - h.credit;
        let credit = claimed.min(cap.saturating_sub(others));
        h.credit = credit;
        h.renewed_in = period;
        self.credit_sum = others + credit;
        self.credit_level = self.credit_level.max(i128::from(self.credit_sum) * FRAME);
        credit
    }

    fn grant(&self, a: Allocation) -> Grant {
        let burst =
            (u128::from(self.burst) * u128::from(a.share) / u128::from(self.quota.max(1))) as u64;
        Grant {
            rate: a.share,
            burst: burst.max(1),
            // A zero grant is closed: no token.
            tokens: u64::from(a.share > 0),
            credit: 0,
            ttl: self.lease_ttl,
            saturated: a.saturated,
        }
    }

    /// Sum of the shares the last grants handed out, for the `sum of grants vs quota`
    /// metric.
    pub fn granted_sum(grants: &BTreeMap<String, Grant>) -> u64 {
        grants.values().map(|g| g.rate).sum()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// With `refresh_ns`, the allocation is reused until it passes, and recomputed at
    /// once when a host joins; the grants then are those of an allocator that
    /// recomputes at every grant.
    #[test]
    fn a_reused_allocation_is_recomputed_on_a_join_and_after_refresh() {
        const S: u64 = 1_000_000_000;
        let ttl = Duration::from_secs(3);
        let t = 4 * S;
        // Added to a running allocator: no learning.
        let mut cached = RuleAllocator::added(1000, 100, ttl, 0, t);
        cached.refresh_ns = S;
        let mut exact = RuleAllocator::added(1000, 100, ttl, 0, t);
        let both = |r: &mut RuleAllocator, host: &str, demand: u64, now: u64| {
            r.report(host, Report { demand, held: 0 }, now);
            r.grant_for(host, now).map(|g| g.rate)
        };
        for r in [&mut cached, &mut exact] {
            assert_eq!(both(r, "a", 900, t), Some(1000));
            // b joins: recomputed at once (a holds the quota: b waits at 0).
            assert_eq!(both(r, "b", 100, t + 1), Some(0));
            assert_eq!(both(r, "a", 900, t + 2), Some(900));
            assert_eq!(both(r, "b", 100, t + 3), Some(100));
        }
        // a's demand falls, b's grows: the cached allocation still holds a at 900 (and
        // b's grant stays capped by what a holds) until a second has passed.
        assert_eq!(both(&mut cached, "a", 100, t + 4), Some(900));
        assert_ne!(both(&mut exact, "a", 100, t + 4), Some(900));
        assert_eq!(both(&mut cached, "b", 900, t + 5), Some(100));
        let later = t + S + 10;
        for r in [&mut cached, &mut exact] {
            r.report(
                "a",
                Report {
                    demand: 100,
                    held: 0,
                },
                later,
            );
            r.report(
                "b",
                Report {
                    demand: 900,
                    held: 0,
                },
                later,
            );
        }
        let g = |r: &mut RuleAllocator| {
            let a = r.grant_for("a", later).map(|g| g.rate);
            let b = r.grant_for("b", later).map(|g| g.rate);
            (a, b)
        };
        assert_eq!(g(&mut cached), g(&mut exact));
        assert_eq!(cached.outstanding(later), exact.outstanding(later));
    }

    #[test]
    fn water_filling() {
        let a = allocate(100, &[10, 50, 80]);
        let shares: Vec<u64> = a.iter().map(|a| a.share).collect();
        assert_eq!(shares, [10, 45, 45]);
        assert_eq!(
            a.iter().map(|a| a.saturated).collect::<Vec<_>>(),
            [false, true, true]
        );
        // Everyone satisfied: the rest is headroom, evenly.
        let a = allocate(100, &[10, 20, 30]);
        assert_eq!(a.iter().map(|a| a.share).collect::<Vec<_>>(), [23, 33, 44]);
        assert!(a.iter().all(|a| !a.saturated));
        assert!(allocate(100, &[]).is_empty());
    }

    #[test]
    fn contoso_split_over_500_hosts() {
        let a = allocate(10_000, &vec![30; 500]);
        assert!(a.iter().all(|a| a.share == 20 && a.saturated));
    }

    #[test]
    fn a_restarted_allocator_renews_what_hosts_hold_for_one_ttl() {
        let ttl = Duration::from_secs(3);
        let mut r = RuleAllocator::new(1000, 100, ttl, 0);
        r.report(
            "a",
            Report {
                demand: 900,
                held: 300,
            },
            1,
        );
        r.report(
            "b",
            Report {
                demand: 900,
                held: 300,
            },
            1,
        );
        r.report(
            "new",
            Report {
                demand: 900,
                held: 0,
            },
            1,
        );
        let g = r.grants(2);
        assert_eq!(g["a"].rate, 300);
        assert_eq!(g["b"].rate, 300);
        assert!(
            !g.contains_key("new"),
            "no grant while learning for a host holding nothing"
        );
        // Holdings above the quota are scaled down, never over-granted.
        r.report(
            "c",
            Report {
                demand: 900,
                held: 800,
            },
            2,
        );
        assert!(RuleAllocator::granted_sum(&r.grants(2)) <= 1000);
        // After the TTL: max-min fair.
        let g = r.grants(3_000_000_001);
        assert_eq!(RuleAllocator::granted_sum(&g), 1000);
    }

    /// The fleet lab's start (a fresh fleet, its first leader learning) for a fleet of
    /// `fleet_size` of which three hosts report: lb-2's sender started late, so its first
    /// interval offered 380/s, and its renewal (what it holds, at most its fair share)
    /// fell with it. Returns (the joiner's share, lb-2's fallen grant, every host's grant
    /// after its demand was back for three reports, all still learning).
    fn learning_start(fleet_size: u32) -> (u64, u64, Vec<u64>) {
        let s = 1_000_000_000u64;
        let (quota, hosts) = (2400u64, ["lb-1", "lb-2", "lb-3"]);
        let mut r = RuleAllocator::new(quota, 240, Duration::from_secs(4), 0);
        r.gather_ns = s / 2;
        r.fleet_size = fleet_size;
        r.learning_joiner_share = crate::share::Share::bootstrap_rate(quota, fleet_size);
        let joiner = r.learning_joiner_share;
        // Joining: nobody holds anything, each gets the joiner's share.
        for h in hosts {
            r.report(h, Report { demand: 0, held: 0 }, s / 10);
        }
        for h in hosts {
            assert_eq!(r.grant_for(h, s / 10).map(|g| g.rate), Some(joiner));
        }
        let mut t = 6 * s / 10;
        for (h, demand) in [("lb-1", 1500), ("lb-2", 380), ("lb-3", 1500)] {
            r.report(
                h,
                Report {
                    demand,
                    held: joiner,
                },
                t,
            );
        }
        let mut held: Vec<u64> = hosts
            .iter()
            .map(|h| r.grant_for(h, t).map_or(0, |g| g.rate))
            .collect();
        let fallen = held[1];
        for _ in 0..3 {
            t += s / 2;
            assert!(r.learning(t));
            for (h, held) in hosts.iter().zip(&held) {
                r.report(
                    h,
                    Report {
                        demand: 1500,
                        held: *held,
                    },
                    t,
                );
            }
            held = hosts
                .iter()
                .map(|h| r.grant_for(h, t).map_or(0, |g| g.rate))
                .collect();
        }
        assert!(r.learning(t));
        (joiner, fallen, held)
    }

    /// Once its demand is back, a learning allocator that has heard from the whole
    /// fleet grants a host at least what it would grant one holding nothing (the
    /// joiner's share, within its fair share and the room the others' claims leave).
    /// Before, a renewal could only fall while learning: the host stayed at its low
    /// share for the rest of the lease TTL while the others could not use the rest (the
    /// fleet lab admitted 2,260/s of its 2,400 over its first seconds).
    #[test]
    fn a_learning_renewal_below_a_joiners_share_rises_back_to_it() {
        let (joiner, fallen, g) = learning_start(3);
        assert!(
            fallen <= 380,
            "a renewal is within the fair share: {fallen}"
        );
        assert!(
            g.iter().all(|&share| share >= joiner),
            "every host at least a joiner's {joiner} while learning: {g:?}"
        );
        assert!(g.iter().sum::<u64>() <= 2400, "{g:?}");
    }

    /// A host not heard from may hold the room the others' claims leave (an earlier
    /// leader's grant): with a fourth host in the fleet silent, nothing is lifted.
    #[test]
    fn a_learning_renewal_is_not_lifted_before_the_whole_fleet_is_heard() {
        let (_, fallen, g) = learning_start(4);
        assert_eq!(g[1], fallen, "{g:?}");
    }

    #[test]
    fn a_demand_drop_counts_fully_from_its_second_report() {
        let mut r = RuleAllocator::new(3000, 300, Duration::from_secs(3), 0);
        // Learning ends at 3 s; reports from then on (not after a TTL of silence).
        let t = 3_000_000_000;
        for (host, d) in [("a", 2500), ("b", 500), ("c", 500)] {
            r.report(host, Report { demand: d, held: 0 }, t);
        }
        for (host, d) in [("a", 500), ("b", 500), ("c", 2500)] {
            r.report(host, Report { demand: d, held: 0 }, t + 1);
        }
        // One report in: a is at the mean (1500), c already at 2500.
        assert_eq!(r.grants(t + 1)["c"].rate, 1250);
        for (host, d) in [("a", 500), ("b", 500), ("c", 2500)] {
            r.report(host, Report { demand: d, held: 0 }, t + 2);
        }
        let g = r.grants(t + 2);
        assert_eq!((g["a"].rate, g["b"].rate, g["c"].rate), (500, 500, 2000));
    }

    /// A host whose demand left (its count far below a share of 16 frames or more)
    /// gives the share up at its first report that shows it, and the host the demand
    /// moved to gets it at its own report in the same round; a share too small to tell a
    /// fall from Poisson noise still counts a drop over two reports.
    #[test]
    fn a_host_whose_demand_left_gives_its_share_up_at_once() {
        const S: u64 = 1_000_000_000;
        for (quota, a_then, b_then) in [(1000, 0, 1000), (20, 10, 10)] {
            let mut r = RuleAllocator::added(quota, 100, Duration::from_secs(3), 0, 10 * S);
            let t = 10 * S;
            for host in ["a", "b"] {
                r.report(
                    host,
                    Report {
                        demand: quota,
                        held: 0,
                    },
                    t,
                );
            }
            let half = quota / 2;
            for host in ["a", "b"] {
                assert_eq!(r.grant_for(host, t).map(|g| g.rate), Some(half));
            }
            r.report(
                "a",
                Report {
                    demand: 0,
                    held: half,
                },
                t + S,
            );
            r.report(
                "b",
                Report {
                    demand: quota,
                    held: half,
                },
                t + S,
            );
            let a = r.grant_for("a", t + S).map(|g| g.rate);
            let b = r.grant_for("b", t + S).map(|g| g.rate);
            assert_eq!((a, b), (Some(a_then), Some(b_then)), "quota {quota}");
        }
    }

    /// After a demand left (or came back), the allocation is recomputed at the next
    /// grant, so the host the demand moved to gets the share at its very next report;
    /// but at most once per sixteenth of `refresh_ns`, so a host flapping between idle
    /// and busy cannot make every report cost an allocation.
    #[test]
    fn a_departure_is_reallocated_at_the_next_grant_at_most_16_times_a_refresh() {
        const S: u64 = 1_000_000_000;
        const MS: u64 = 1_000_000;
        let mut r = RuleAllocator::added(1000, 100, Duration::from_secs(3), 0, 10 * S);
        r.refresh_ns = S / 2;
        let t = 10 * S;
        let busy = |held| Report { demand: 1000, held };
        for host in ["a", "b"] {
            r.report(host, busy(0), t);
        }
        for host in ["a", "b"] {
            assert_eq!(r.grant_for(host, t).map(|g| g.rate), Some(500));
        }
        r.report(
            "a",
            Report {
                demand: 0,
                held: 500,
            },
            t + S,
        );
        r.report("b", busy(500), t + S + MS);
        assert_eq!(
            r.grant_for("b", t + S + MS).map(|g| g.rate),
            Some(500),
            "a still holds its share: nothing more to give yet"
        );
        assert_eq!(r.grant_for("a", t + S + MS).map(|g| g.rate), Some(0));
        r.report("b", busy(500), t + S + 2 * MS);
        assert_eq!(
            r.grant_for("b", t + S + 2 * MS).map(|g| g.rate),
            Some(1000),
            "the next report gets the share a gave up, not a refresh later"
        );

        let due = |computed: Option<(u64, u64)>, now: u64| {
            computed.is_some_and(|(at, _)| now.saturating_sub(at) >= S / 2)
        };
        let last = t + 3 * S;
        assert!(due(
            recompute_soon(Some((last, 1000)), S / 2, last + S / 32),
            last + S / 32
        ));
        let soon = recompute_soon(Some((last, 1000)), S / 2, last + MS);
        assert!(
            !due(soon, last + S / 32 - 1),
            "computed 1 ms ago: not before 1/16 of 500 ms"
        );
        assert!(due(soon, last + S / 32));
        assert_eq!(recompute_soon(None, S / 2, last), None, "already due");
    }

    /// A demand back from none is reallocated at the next grant if it is worth 24
    /// frames since the host's last report; a trickle waits for the refresh.
    #[test]
    fn a_demand_back_from_none_is_reallocated_unless_a_trickle() {
        const S: u64 = 1_000_000_000;
        for (demand, moved) in [(10, false), (100, true)] {
            let mut r = RuleAllocator::added(1000, 100, Duration::from_secs(3), 0, 10 * S);
            r.refresh_ns = S / 2;
            let t = 10 * S;
            for host in ["a", "b"] {
                let demand = if host == "a" { 0 } else { 1000 };
                r.report(host, Report { demand, held: 0 }, t);
                r.grant_for(host, t);
            }
            let computed = r.computed;
            r.report("a", Report { demand, held: 0 }, t + S / 4);
            // A quarter of a second: 2.5 frames at 10/s, 25 at 100/s.
            assert_eq!(r.computed != computed, moved, "demand {demand}");
        }
    }

    /// What a host's report added to the credit level is taken back when its next
    /// report shows its demand fell: the first report after a shift sees the fall in
    /// part (the demand left mid-interval), which is not a bucket's waste.
    #[test]
    fn a_fall_takes_back_what_its_first_glimpse_added_to_the_credit() {
        const S: u64 = 1_000_000_000;
        let mut r = RuleAllocator::added(1000, 100, Duration::from_secs(3), 0, 10 * S);
        r.credit_cap = 1000;
        let usage = |admitted, denials| Usage {
            admitted,
            denials,
            credited: 0,
            credit: 0,
        };
        let held = |demand| Report { demand, held: 500 };
        let mut t = 10 * S;
        for _ in 0..2 {
            for host in ["a", "b"] {
                r.report_usage(host, held(700), Some(usage(500, 200)), t);
            }
            for host in ["a", "b"] {
                r.grant_for(host, t);
            }
            t += S;
        }
        assert_eq!(r.credit_level(), 0, "both used their shares");
        r.report_usage("b", held(900), Some(usage(500, 400)), t);
        // a's demand left half-way through the interval.
        r.report_usage("a", held(250), Some(usage(250, 0)), t);
        assert_eq!(r.credit_level(), 250);
        for host in ["a", "b"] {
            r.grant_for(host, t);
        }
        t += S;
        r.report_usage("a", held(0), Some(usage(0, 0)), t);
        assert_eq!(r.credit_level(), 0, "the glimpse of the fall is taken back");
    }

    #[test]
    fn a_batch_of_grants_equals_one_grant_per_report() {
        let mut one = RuleAllocator::new(1000, 100, Duration::from_secs(3), 0);
        let t = 4_000_000_000;
        for (i, (demand, held)) in [(900, 0), (100, 0), (400, 300), (0, 0)].iter().enumerate() {
            one.report(
                &format!("h{i}"),
                Report {
                    demand: *demand,
                    held: *held,
                },
                t,
            );
        }
        let mut batch = one.clone();
        let hosts = ["h2", "h0", "h3", "h1", "nobody"];
        let singles: Vec<_> = hosts.iter().map(|h| one.grant_for(h, t)).collect();
        assert_eq!(batch.grants_for(&hosts, t), singles);
        assert_eq!(batch.outstanding(t), one.outstanding(t));
    }

    #[test]
    fn an_allocator_that_heard_nobody_for_a_lease_learns_again() {
        // Cut off from every host for longer than a lease: they are all STICKY at their
        // old shares, so it renews what they hold before reallocating.
        let mut r = RuleAllocator::new(1000, 100, Duration::from_secs(3), 0);
        let s = 1_000_000_000;
        r.report(
            "a",
            Report {
                demand: 900,
                held: 0,
            },
            3 * s,
        );
        assert!(!r.learning(3 * s));
        r.report(
            "a",
            Report {
                demand: 900,
                held: 400,
            },
            9 * s,
        );
        assert!(r.learning(9 * s));
        assert_eq!(r.grant_for("a", 9 * s).map(|g| g.rate), Some(400));
        assert!(!r.learning(12 * s));
    }

    #[test]
    fn a_host_with_no_room_gets_a_zero_grant_not_silence() {
        // Without a grant its lease would lapse and an open rule fail open while the
        // allocator is healthy; a zero share keeps it leased, closed, until others shrink.
        let mut r = RuleAllocator::new(1000, 100, Duration::from_secs(3), 0);
        let t = 3_000_000_000;
        r.report(
            "a",
            Report {
                demand: 1000,
                held: 0,
            },
            t,
        );
        assert_eq!(r.grant_for("a", t).map(|g| g.rate), Some(1000));
        r.report("b", Report { demand: 0, held: 0 }, t);
        let b = r.grant_for("b", t).expect("a grant");
        assert_eq!((b.rate, b.tokens), (0, 0));
        // No demand: not saturated, so its first refusals send a report at once.
        assert!(!b.saturated);
        // Closed counts nothing: the quota exactly.
        assert_eq!(r.outstanding(t), 1000);
        // b's demand appears (its early report): no room until a renews, so another zero
        // grant, saturated this time (it waits for a, no need to report again).
        r.report(
            "b",
            Report {
                demand: 400,
                held: 0,
            },
            t + 1,
        );
        let b = r.grant_for("b", t + 1).expect("a grant");
        assert_eq!((b.rate, b.saturated), (0, true));
        assert_eq!(r.outstanding(t + 1), 1000);
        // a renews down to its fair share; b's next report gets the room a left, with
        // no token (it had its token in BOOTSTRAP).
        r.report(
            "a",
            Report {
                demand: 1000,
                held: 1000,
            },
            t + 2,
        );
        assert_eq!(r.grant_for("a", t + 2).map(|g| g.rate), Some(600));
        r.report(
            "b",
            Report {
                demand: 400,
                held: 0,
            },
            t + 3,
        );
        let b = r.grant_for("b", t + 3).expect("a grant");
        assert_eq!((b.rate, b.tokens, b.saturated), (400, 0, false));
        assert_eq!(r.outstanding(t + 3), 1000);
    }

    #[test]
    fn idle_hosts_of_a_saturated_rule_get_nothing() {
        // The idle hosts' shares are 0 (closed), none of the quota goes to them.
        let a = allocate(1000, &[5000, 0, 0]);
        assert_eq!(a.iter().map(|a| a.share).collect::<Vec<_>>(), [1000, 0, 0]);
        assert!(a[0].saturated && !a[1].saturated && !a[2].saturated);
        let a = allocate(2, &[5000, 0, 0]);
        assert_eq!(a.iter().map(|a| a.share).collect::<Vec<_>>(), [2, 0, 0]);
    }

    #[test]
    fn silent_hosts_expire_after_a_lease() {
        let mut r = RuleAllocator::new(1000, 100, Duration::from_secs(3), 0);
        let report = Report {
            demand: 10,
            held: 0,
        };
        r.report("a", report, 0);
        r.report("b", report, 2_000_000_000);
        r.report("b", report, 4_000_000_000);
        let g = r.grants(4_000_000_000);
        assert_eq!(g.keys().collect::<Vec<_>>(), ["b"]);
        assert_eq!(g["b"].rate, 1000);
    }

    /// The cap is a share of an interval's quota, in whole frames, without overflow.
    #[test]
    fn the_credit_cap_is_a_percentage_of_an_intervals_quota() {
        let second = Duration::from_secs(1);
        assert_eq!(credit_cap_for(10_000, second, DEFAULT_CREDIT_PCT), 3_000);
        assert_eq!(credit_cap_for(3_000, Duration::from_millis(300), 30), 270);
        assert_eq!(credit_cap_for(10_000, second, 0), 0);
        assert_eq!(credit_cap_for(1, Duration::from_millis(100), 30), 0);
        assert_eq!(credit_cap_for(u64::MAX, second, 100), u64::MAX);
        assert_eq!(credit_cap_for(u64::MAX, 2 * second, 100), u64::MAX);
    }

    /// Two saturated hosts: one wastes part of its share (its bucket overflowed), the
    /// other refuses frames. The credit level takes what was left unused, at most the
    /// cap and what the fleet refused; the refusing host's next grant carries it, at
    /// most what it refused; shares are untouched.
    #[test]
    fn unused_quota_is_credited_to_a_host_that_refused_frames() {
        const S: u64 = 1_000_000_000;
        let mut r = RuleAllocator::added(1000, 100, Duration::from_secs(3), 0, 10 * S);
        r.credit_cap = 100;
        let busy = Report {
            demand: 700,
            held: 0,
        };
        let mut t = 10 * S;
        for host in ["a", "b"] {
            r.report(host, busy, t);
        }
        assert_eq!(
            r.grant_for("a", t).map(|g| (g.rate, g.credit)),
            Some((500, 0))
        );
        assert_eq!(
            r.grant_for("b", t).map(|g| (g.rate, g.credit)),
            Some((500, 0))
        );
        // Second grants: both held 500 since their first (a steady interval from now on).
        t += S;
        for host in ["a", "b"] {
            r.report_usage(
                host,
                Report {
                    demand: 700,
                    held: 500,
                },
                Some(Usage {
                    admitted: 500,
                    denials: 200,
                    credited: 0,
                    credit: 0,
                }),
                t,
            );
            assert_eq!(r.grant_for(host, t).map(|g| g.credit), Some(0));
        }
        assert_eq!(r.credit_level(), 0);
        // a admitted 440 of its 500 (60 wasted), refusing 260; b admitted 500.
        t += S;
        r.report_usage(
            "a",
            Report {
                demand: 700,
                held: 500,
            },
            Some(Usage {
                admitted: 440,
                denials: 260,
                credited: 0,
                credit: 0,
            }),
            t,
        );
        assert_eq!(r.credit_level(), 60);
        r.report_usage(
            "b",
            Report {
                demand: 700,
                held: 500,
            },
            Some(Usage {
                admitted: 500,
                denials: 30,
                credited: 0,
                credit: 0,
            }),
            t,
        );
        assert_eq!(r.credit_level(), 60);
        let a = r.grant_for("a", t).expect("a grant");
        let b = r.grant_for("b", t).expect("a grant");
        // In proportion to what each refused (260 : 30), at most that.
        assert_eq!((a.rate, b.rate), (500, 500));
        assert_eq!(a.credit + b.credit, 60, "{a:?} {b:?}");
        assert!(a.credit <= 260 && b.credit <= 30 && b.credit > 0);
        assert_eq!(r.outstanding(t), 1000);
        // A lot left unused: the level stops at the cap.
        t += S;
        r.report_usage(
            "a",
            Report {
                demand: 700,
                held: 500,
            },
            Some(Usage {
                admitted: 100,
                denials: 600,
                credited: 0,
                credit: 0,
            }),
            t,
        );
        assert_eq!(r.credit_level(), 100);
        // Nothing refused anywhere: no credit at all.
        t += S;
        for host in ["a", "b"] {
            r.report_usage(
                host,
                Report {
                    demand: 400,
                    held: 500,
                },
                Some(Usage {
                    admitted: 400,
                    denials: 0,
                    credited: 0,
                    credit: 0,
                }),
                t,
            );
        }
        assert_eq!(r.credit_level(), 0);
        assert_eq!(r.grant_for("a", t).map(|g| g.credit), Some(0));
    }

    /// A host whose demand fell well below its share (a shift left it idle) does not
    /// feed the credit: the allocation moves its share by itself.
    #[test]
    fn a_host_whose_demand_fell_feeds_no_credit() {
        const S: u64 = 1_000_000_000;
        let mut r = RuleAllocator::added(1000, 100, Duration::from_secs(3), 0, 10 * S);
        r.credit_cap = 1000;
        let mut t = 10 * S;
        for _ in 0..2 {
            for host in ["a", "b"] {
                r.report_usage(
                    host,
                    Report {
                        demand: 700,
                        held: 500,
                    },
                    Some(Usage {
                        admitted: 500,
                        denials: 200,
                        credited: 0,
                        credit: 0,
                    }),
                    t,
                );
            }
            for host in ["a", "b"] {
                r.grant_for(host, t);
            }
            t += S;
        }
        r.report_usage(
            "a",
            Report {
                demand: 0,
                held: 500,
            },
            Some(Usage::default()),
            t,
        );
        r.report_usage(
            "b",
            Report {
                demand: 900,
                held: 500,
            },
            Some(Usage {
                admitted: 500,
                denials: 400,
                credited: 0,
                credit: 0,
            }),
            t,
        );
        assert_eq!(r.credit_level(), 0);
        // Counted as every host's unused (the loser kept for comparison): 500.
        r.credit_idle_unused = true;
        t += S;
        r.report_usage(
            "a",
            Report {
                demand: 0,
                held: 500,
            },
            Some(Usage::default()),
            t,
        );
        assert_eq!(r.credit_level(), 400, "capped by what the fleet refused");
    }

    /// Two hosts holding 500 each of 1000 that admitted `admitted` and refused
    /// `denials` over steady intervals (their second grant on), at `t`.
    fn two_steady_hosts(
        r: &mut RuleAllocator,
        demand: u64,
        admitted: u64,
        denials: u64,
        t: &mut u64,
    ) {
        for host in ["a", "b"] {
            r.report(host, Report { demand, held: 0 }, *t);
        }
        for host in ["a", "b"] {
            r.grant_for(host, *t);
        }
        for _ in 0..2 {
            *t += 1_000_000_000;
            for host in ["a", "b"] {
                let usage = Usage {
                    admitted,
                    denials,
                    credited: 0,
                    credit: 0,
                };
                r.report_usage(host, Report { demand, held: 500 }, Some(usage), *t);
            }
            for host in ["a", "b"] {
                r.grant_for(host, *t);
            }
        }
    }

    /// A host in BOOTSTRAP (holding nothing, no grant yet) stops the credit: its frames
    /// are outside every share. Once it waits on a zero grant (closed: it admits
    /// nothing), the credit flows again.
    #[test]
    fn a_bootstrapping_host_stops_the_credit_and_a_closed_one_does_not() {
        const S: u64 = 1_000_000_000;
        let mut r = RuleAllocator::added(1000, 100, Duration::from_secs(3), 0, 10 * S);
        r.credit_cap = 100;
        let mut t = 10 * S;
        two_steady_hosts(&mut r, 700, 440, 260, &mut t);
        assert_eq!(r.credit_level(), 100);
        r.report(
            "c",
            Report {
                demand: 300,
                held: 0,
            },
            t,
        );
        let mut closed = r.clone();
        assert_eq!(
            r.grant_for("a", t).map(|g| g.credit),
            Some(0),
            "c is bootstrapping"
        );
        // The others still hold the quota: c's grant is closed.
        let c = closed.grant_for("c", t).map(|g| (g.rate, g.credit));
        assert_eq!(c, Some((0, 0)));
        let a = closed.grant_for("a", t).map(|g| g.credit);
        assert!(a.is_some_and(|c| c > 0), "c is closed: {a:?}");
    }

    /// With every demand met and quota to spare, each host gets credit in proportion to
    /// its share, whether or not it refused frames in its last interval, and at most its
    /// own burst.
    #[test]
    fn with_quota_to_spare_every_host_gets_credit_up_to_its_burst() {
        const S: u64 = 1_000_000_000;
        let mut r = RuleAllocator::added(1000, 100, Duration::from_secs(3), 0, 10 * S);
        r.credit_cap = 300;
        let mut t = 10 * S;
        two_steady_hosts(&mut r, 300, 280, 0, &mut t);
        assert_eq!(r.credit_level(), 300, "both left 220 of 500 unused");
        for host in ["a", "b"] {
            let g = r.grant_for(host, t).expect("a grant");
            // 150 by share, at most its burst of 100 × 500 ÷ 1000.
            assert_eq!((g.rate, g.burst, g.credit), (500, 50, 50), "{host}");
        }
    }

    /// A new leader renews the credit each host says its last grant carried once, not at
    /// every grant of its learning period: a grant's credit replaces what is left in the
    /// bucket, so renewed at every report the same credit was admitted again every
    /// interval (the fleet lab's three hosts admitted 2,647/s of a 2,400/s quota through
    /// two failovers, 10 % over). After the renewal the credits come from the level this
    /// allocator measures, so over the learning period they add up to at most the cap
    /// (the renewal) and what the hosts left unused of their shares.
    #[test]
    fn a_learning_allocator_renews_a_credit_once() {
        const S: u64 = 1_000_000_000;
        let (quota, interval, demand) = (2400u64, S / 2, 1500u64);
        let ttl = Duration::from_secs(4);
        // Per host and report: frames of its share it left unused.
        for unused in [0u64, 20, 150] {
            let mut r = RuleAllocator::new(quota, 240, ttl, 0);
            r.gather_ns = interval;
            r.credit_cap = credit_cap_for(quota, Duration::from_nanos(interval), 30);
            let hosts = ["a", "b", "c"];
            // What an earlier leader granted: the quota split, and a credit each.
            let (mut held, mut credit) = ([quota / 3; 3], [r.credit_cap / 3; 3]);
            let (mut granted, mut unused_sum, mut renewals) = (0u64, 0u64, 0u32);
            let mut t = 1;
            while r.learning(t) {
                for (i, host) in hosts.iter().enumerate() {
                    // It admitted its share but `unused`, and spent the whole credit.
                    let share = held[i] * interval / S;
                    let usage = Usage {
                        admitted: share - unused + credit[i],
                        denials: demand * interval / S - share,
                        credited: credit[i],
                        credit: credit[i],
                    };
                    let report = Report {
                        demand,
                        held: held[i],
                    };
                    r.report_usage(host, report, Some(usage), t);
                    unused_sum += unused;
                    let g = r.grant_for(host, t).expect("a grant");
                    granted += g.credit;
                    renewals += u32::from(g.credit > 0 && g.credit == credit[i]);
                    (held[i], credit[i]) = (g.rate, g.credit);
                }
                t += interval;
            }
            assert!(
                renewals >= 3,
                "every host's credit was renewed once ({unused})"
            );
            assert!(
                granted <= r.credit_cap + unused_sum,
                "{unused} unused a report: {granted} frames of credit granted while \
                 learning, cap {} + {unused_sum} unused",
                r.credit_cap
            );
            assert!(RuleAllocator::granted_sum(&r.grants(t)) <= quota);
        }
    }

    /// A restarted allocator learning: a host holding nothing (FAIL_OPEN after a long
    /// outage, or BOOTSTRAP) gets the joiner's share with one token at once, capped by
    /// what the others hold; the holders are renewed; nothing sums above the quota.
    #[test]
    fn a_learning_allocator_grants_a_joiners_share_to_hosts_that_hold_nothing() {
        let ttl = Duration::from_secs(3);
        let mut r = RuleAllocator::new(1000, 100, ttl, 0);
        r.learning_joiner_share = 20;
        assert!(r.learning(1));
        r.report(
            "holder",
            Report {
                demand: 900,
                held: 970,
            },
            1,
        );
        assert_eq!(r.grant_for("holder", 1).map(|g| g.rate), Some(970));
        for (i, want) in [(0, 20), (1, 10), (2, 0)] {
            let host = format!("open{i}");
            r.report(
                &host,
                Report {
                    demand: 500,
                    held: 0,
                },
                2,
            );
            let g = r.grant_for(&host, 2);
            assert_eq!(
                g.map(|g| (g.rate, g.tokens)),
                (want > 0).then_some((want, 1))
            );
        }
        assert_eq!(r.outstanding(2), 1000);
        // Without it (the default), such a host gets nothing while learning.
        let mut r = RuleAllocator::new(1000, 100, ttl, 0);
        r.report(
            "open",
            Report {
                demand: 500,
                held: 0,
            },
            2,
        );
        assert_eq!(r.grant_for("open", 2), None);
    }

    /// With `joiner_from_reports` a joiner's share while learning is quota ÷ the
    /// fleet_size the host itself reported (what it enforces in BOOTSTRAP), divided by at
    /// least the hosts heard from; a host that reported none gets the configured share.
    /// Old rule (one configured share for all): the hosts of a fleet of 4 got 2/s each
    /// from an allocator left at its default of 500.
    #[test]
    fn a_joiners_share_comes_from_its_reported_fleet_size_and_the_hosts_heard() {
        let ttl = Duration::from_secs(3);
        let joining = Report {
            demand: 500,
            held: 0,
        };
        let grant = |r: &mut RuleAllocator, host: &str, fleet_size: u32| {
            r.report(host, joining, 2);
            r.set_reported_fleet_size(host, fleet_size);
            r.grant_for(host, 2).map(|g| g.rate)
        };
        let mut r = RuleAllocator::new(1000, 100, ttl, 0);
        r.learning_joiner_share = crate::share::Share::bootstrap_rate(1000, 500);
        r.joiner_from_reports = true;
        assert!(r.learning(2));
        assert_eq!(grant(&mut r, "lb-1", 4), Some(250));
        // A host that predates the field: the allocator's own divisor.
        assert_eq!(grant(&mut r, "old", 0), Some(2));
        assert_eq!(grant(&mut r, "lb-2", 4), Some(250));
        // Claiming a fleet of one gains nothing over the hosts already heard from (4).
        assert_eq!(grant(&mut r, "liar", 1), Some(250));
        assert!(r.outstanding(2) <= 1000);
        // Off: every joiner gets the configured share, whatever it reports.
        let mut r = RuleAllocator::new(1000, 100, ttl, 0);
        r.learning_joiner_share = crate::share::Share::bootstrap_rate(1000, 500);
        assert_eq!(grant(&mut r, "lb-1", 4), Some(2));
    }

    /// One lying host (`liar`, which claims to hold `claim` and demands `liar_demand`)
    /// and two honest hosts (demands `honest`, each claiming its last grant) report every
    /// second, in the order `orders` gives each round: first to a leader past learning
    /// until the shares settle, then to its successor (a new `RuleAllocator`, learning,
    /// gathering for one interval). Returns the fair shares of the two honest hosts and
    /// every grant each got from the successor, with whether it came while gathering.
    #[expect(clippy::type_complexity, reason = "test helper")]
    fn lying_host_through_a_leader_kill(
        quota: u64,
        liar_demand: u64,
        claim: u64,
        honest: [u64; 2],
        orders: &[[usize; 3]],
        joiner: u64,
    ) -> ([u64; 2], Vec<[Vec<Option<u64>>; 2]>) {
        const S: u64 = 1_000_000_000;
        let ttl = Duration::from_secs(3);
        let names = ["liar", "lb-2", "lb-3"];
        let demands = [liar_demand, honest[0], honest[1]];
        let mut held = [0u64; 3];
        let mut round =
            |r: &mut RuleAllocator, order: &[usize; 3], t: u64, grants: &mut Vec<Option<u64>>| {
                for &i in order {
                    let claim = if i == 0 { claim } else { held[i] };
                    r.report(
                        names[i],
                        Report {
                            demand: demands[i],
                            held: claim,
                        },
                        t,
                    );
                    let g = r.grant_for(names[i], t).map(|g| g.rate);
                    if let Some(rate) = g {
                        held[i] = rate;
                    }
                    grants.push(g);
                }
            };
        let mut t = 10 * S;
        let mut old = RuleAllocator::added(quota, quota / 10 + 1, ttl, 0, t);
        old.refresh_ns = S / 2;
        for _ in 0..8 {
            round(&mut old, &[0, 1, 2], t, &mut Vec::new());
            t += S;
        }
        // The leader is killed; its successor wins the election 2 s later.
        t += 2 * S;
        let mut new = RuleAllocator::new(quota, quota / 10 + 1, ttl, t);
        new.refresh_ns = S / 2;
        new.gather_ns = S;
        new.learning_joiner_share = joiner;
        let mut seen = Vec::new();
        for order in orders {
            let mut grants = Vec::new();
            round(&mut new, order, t, &mut grants);
            let by_host = |k: usize| {
                order
                    .iter()
                    .zip(&grants)
                    .filter(|(&i, _)| i == k)
                    .map(|(_, g)| *g)
                    .collect()
            };
            seen.push([by_host(1), by_host(2)]);
            t += S / 2;
        }
        let fair = allocate(quota, &demands);
        ([fair[1].share, fair[2].share], seen)
    }

    /// A host claiming 100 × the quota right after an election, reporting first: the
    /// honest hosts keep their fair shares (before, it was granted the whole quota and
    /// they 9/s of their 1000/s for a lease TTL).
    #[test]
    fn a_lying_host_cannot_claim_the_quota_from_a_new_leader() {
        let orders = vec![[0, 1, 2]; 8];
        let (fair, seen) =
            lying_host_through_a_leader_kill(3000, 300_000, 300_000, [2000, 2000], &orders, 100);
        assert_eq!(fair, [1000, 1000]);
        for (k, round) in seen.iter().enumerate() {
            for (host, grants) in round.iter().enumerate() {
                for g in grants {
                    // The first interval is the successor's gathering: leases extended
                    // as they are; after it, renewals weighed against the others.
                    assert!(
                        g.is_some_and(|rate| rate >= fair[host] - 100),
                        "round {k}, honest host {host} granted {g:?} of a fair {}: {seen:?}",
                        fair[host]
                    );
                }
            }
        }
    }

    /// Claims of any size, even u64::MAX from several hosts, never overflow a sum.
    #[test]
    fn claims_of_any_size_overflow_nothing() {
        let mut r = RuleAllocator::new(3000, 300, Duration::from_secs(3), 0);
        for i in 0..8 {
            let host = format!("h{i}");
            r.report(
                &host,
                Report {
                    demand: u64::MAX,
                    held: u64::MAX,
                },
                1,
            );
            let g = r.grant_for(&host, 1);
            assert!(g.is_none_or(|g| g.rate <= 3000), "{g:?}");
        }
        assert!(r.outstanding(1) <= 3000);
        r.expire(10_000_000_000);
        assert_eq!(r.hosts(), 0);
        // Demands whose sum wraps (u64::MAX + 2 = 1 in release builds, which CI runs):
        // still oversubscribed.
        let mut r = RuleAllocator::new(3000, 300, Duration::from_secs(3), 0);
        for (host, demand) in [("a", u64::MAX), ("b", 2)] {
            r.report(host, Report { demand, held: 0 }, 1);
        }
        r.grant_for("a", 1);
        assert!(
            r.oversubscribed,
            "a fleet asking for everything is oversubscribed"
        );
    }

    proptest! {

        /// Hosts reporting usage in any order, shares and demands moving: every credit is
        /// at most what its host refused (while demand exceeds the quota; else at most
        /// its burst); the level never exceeds the cap nor what the hosts left unused of
        /// their shares (net, since it was last 0); the credits outstanding (each host's
        /// last) sum to at most the cap, and to at most the level when one is granted; the
        /// shares in force stay within the quota.
        #[test]
        fn credits_stay_within_what_was_left_unused(
            quota in 1u64..20_000,
            cap in 1u64..5_000,
            n in 1usize..8,
            rounds in prop::collection::vec(
                prop::collection::vec((0u64..3_000, 0u64..3_000, 0u64..500), 8), 1..25),
        ) {
            const S: u64 = 1_000_000_000;
            let mut r = RuleAllocator::added(quota, quota / 5 + 1, Duration::from_secs(3), 0, 10 * S);
            r.credit_cap = cap;
            let mut t = 10 * S;
            let mut rate = vec![0u64; n];
            let mut outstanding = vec![0u64; n];
            // Σ (share × elapsed − admitted) over every report since the level was 0,
            // positive parts only: an upper bound of what may be credited.
            let mut unused_since_zero: i128 = 0;
            for round in &rounds {
                for i in 0..n {
                    let (demand, admitted, denials) = round[i];
                    let host = format!("h{i}");
                    let before = r.credit_level();
                    r.report_usage(&host, Report { demand, held: rate[i] }, Some(Usage { admitted, denials, credited: 0, credit: 0 }), t);
                    let e = i128::from(rate[i]) - i128::from(admitted);
                    unused_since_zero = if before == 0 { e.max(0) } else { unused_since_zero + e.max(0) };
                    let level = r.credit_level();
                    prop_assert!(level <= cap);
                    prop_assert!(i128::from(level) <= unused_since_zero, "{} > {}", level, unused_since_zero);
                    if let Some(g) = r.grant_for(&host, t) {
                        if r.oversubscribed {
                            prop_assert!(g.credit <= denials, "credit {} > refused {}", g.credit, denials);
                        } else {
                            prop_assert!(g.credit <= g.burst, "credit {} > burst {}", g.credit, g.burst);
                        }
                        prop_assert!(g.credit <= level);
                        outstanding[i] = g.credit;
                        rate[i] = g.rate;
                    }
                    prop_assert!(rate.iter().sum::<u64>() <= quota);
                    let credits: u64 = outstanding.iter().sum();
                    prop_assert!(credits <= cap, "credits outstanding {} > cap {}", credits, cap);
                    // A credit granted keeps those outstanding within the level: the
                    // others' are in it until their reports say they were spent.
                    if outstanding[i] > 0 {
                        prop_assert!(credits <= level, "credits outstanding {} > level {}", credits, level);
                    }
                }
                t += S;
            }
        }
        /// One host lying about what it holds (any claim, any demand) and two honest
        /// hosts, through a leader kill, reporting in any order: every grant to an honest
        /// host is at least its fair share minus the liar's bootstrap share (what it may
        /// take as a joiner), and every report gets one (no lease lapses).
        #[test]
        fn a_liar_costs_honest_hosts_at_most_its_bootstrap_share(
            quota in 30u64..1_000_000,
            liar_demand in 0u64..100_000_000,
            claim in prop_oneof![Just(0u64), Just(u64::MAX), 0u64..100_000_000],
            honest in (1u64..2_000_000, 1u64..2_000_000),
            orders in prop::collection::vec(
                prop_oneof![Just([0, 1, 2]), Just([1, 0, 2]), Just([1, 2, 0]), Just([2, 1, 0])], 8),
            fleet_size in 3u64..1000,
        ) {
            let joiner = quota / fleet_size;
            let (fair, seen) = lying_host_through_a_leader_kill(
                quota, liar_demand, claim, [honest.0, honest.1], &orders, joiner);
            for (k, round) in seen.iter().enumerate() {
                for (host, grants) in round.iter().enumerate() {
                    for g in grants {
                        prop_assert!(
                            g.is_some_and(|rate| rate + joiner >= fair[host]),
                            "round {}, honest host {} granted {:?} of a fair {} (bootstrap {}): {:?}",
                            k, host, g, fair[host], joiner, seen
                        );
                    }
                }
            }
        }

        #[test]
        fn shares_are_max_min_fair_and_never_exceed_the_quota(
            quota in 0u64..10_000_000,
            demands in prop::collection::vec(0u64..1_000_000, 0..600),
        ) {
            let a = allocate(quota, &demands);
            let n = demands.len() as u64;
            let total: u64 = a.iter().map(|a| a.share).sum();
            prop_assert!(total <= quota);
            if n > 0 {
                prop_assert_eq!(total, quota);
            }
            for (d, a) in demands.iter().zip(&a) {
                prop_assert_eq!(a.saturated, *d > a.share);
                // Nobody gets less than its demand or an equal split.
                prop_assert!(a.share >= (*d).min(quota / n.max(1)));
            }
            // Max-min: nobody holds more than a saturated host (beyond one unit of rounding).
            let top_saturated = a.iter().filter(|a| a.saturated).map(|a| a.share).min();
            if let Some(level) = top_saturated {
                for (d, x) in demands.iter().zip(&a) {
                    prop_assert!(x.share <= level + 1 || x.share <= *d, "{} > {}", x.share, level);
                }
            }
        }

        /// Hosts reporting one at a time in any order, joining at any round, demands
        /// moving between them (many of them 0); each host enforces its grant, a zero
        /// grant as a closed limit (0). The enforced shares never sum above the quota,
        /// whatever the order; a token comes only with a host's first positive grant;
        /// a zero grant to a host without demand says `saturated: false` (so its first
        /// refusals report at once); and `outstanding()` is the hosts' own sum.
        #[test]
        fn enforced_shares_stay_within_the_quota(
            quota in 1u64..100_000,
            joins in prop::collection::vec(0usize..4, 1..8),
            rounds in prop::collection::vec(
                (prop::collection::vec(prop_oneof![Just(0u64), 0u64..50_000], 8), any::<u64>()),
                1..20),
            refresh in prop_oneof![Just(0u64), 0u64..2_000_000_000],
        ) {
            // Whether the allocation is recomputed at every grant or reused for up to
            // `refresh`, the shares in force stay within the quota.
            let mut r = RuleAllocator::new(quota, quota / 10 + 1, Duration::from_secs(3), 0);
            r.refresh_ns = refresh;
            let mut now = 4_000_000_000u64;
            let n = joins.len();
            // The rate each host enforces, as the hosts see it (None: BOOTSTRAP).
            let mut enforced: Vec<Option<u64>> = vec![None; n];
            let mut had_token = vec![false; n];
            let last = rounds.last().map(|(d, _)| d.clone()).unwrap_or_default();
            let settle = (0..3).map(|i| (last.clone(), i as u64));
            let all: Vec<(Vec<u64>, u64)> = rounds.iter().cloned().chain(settle).collect();
            for (round, (demands, seed)) in all.iter().enumerate() {
                let mut order: Vec<usize> = (0..n).filter(|&i| joins[i] <= round).collect();
                // A permutation from the seed.
                for i in (1..order.len()).rev() {
                    order.swap(i, (seed.rotate_left(i as u32 * 7) % (i as u64 + 1)) as usize);
                }
                for &i in &order {
                    let host = format!("h{i}");
                    let held = enforced[i].unwrap_or(0);
                    let demand = demands[i];
                    r.report(&host, Report { demand, held }, now);
                    let g = r.grant_for(&host, now);
                    if let Some(g) = g {
                        enforced[i] = Some(g.rate);
                        if g.tokens > 0 {
                            prop_assert!(!had_token[i], "a second token for h{}", i);
                            prop_assert!(g.rate > 0 && g.tokens == 1);
                            had_token[i] = true;
                        }
                        if g.rate == 0 && r.hosts.get(&host).is_some_and(|h| h.demand == 0) {
                            prop_assert!(!g.saturated, "a zero grant without demand is saturated");
                        }
                    }
                    let sum: u64 = enforced.iter().map(|e| e.unwrap_or(0)).sum();
                    prop_assert!(sum <= quota, "{} > {}", sum, quota);
                    prop_assert_eq!(r.outstanding(now), sum);
                    now += 60_000_000;
                }
            }
        }

        #[test]
        fn grants_never_sum_above_the_quota(
            quota in 1u64..1_000_000,
            hosts in prop::collection::vec((0u64..100_000, 0u64..100_000), 1..200),
            now in 0u64..10_000_000_000,
        ) {
            let mut r = RuleAllocator::new(quota, quota / 10 + 1, Duration::from_secs(3), 0);
            for (i, (demand, held)) in hosts.iter().enumerate() {
                r.report(&format!("h{i}"), Report { demand: *demand, held: *held }, now);
            }
            prop_assert!(RuleAllocator::granted_sum(&r.grants(now)) <= quota);
        }
    }
}
