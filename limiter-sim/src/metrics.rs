//! What a run records (per rule: 1 s totals, and a 100 ms series for tracked rules) and
//! the figures computed from it: overshoot, false drops, time to converge.

use std::{ops::Range, time::Duration};

use limiter_fleet::share::{FailMode, ShareState};

use crate::{bucket::Counts, scenario::Scenario};

/// Slots of a tick's per-state arrays: one per share state, the standalone one always
/// empty (every simulated rule is a fleet rule).
pub const STATE_SLOTS: usize = ShareState::ALL.len();

/// A state's slot in a tick's per-state arrays: its value in the map ABI.
pub fn state_index(s: ShareState) -> usize {
    s as usize
}

/// One rule over one tick (100 ms) of a tracked rule.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tick {
    pub offered: u64,
    pub admitted: u64,
    /// Admitted by hosts that never had a grant (BOOTSTRAP, or FAIL_OPEN after it).
    pub bootstrap_admitted: u64,
    /// Shares that started (BOOTSTRAP: a rule's first frame on a host) in the tick.
    pub joins: u32,
    /// Hosts in each state (indexed by [`state_index`]) at the end of the tick.
    pub hosts: [u32; STATE_SLOTS],
    /// Sum of the shares hosts in each state hold (for FAIL_OPEN: the share kept, not
    /// enforced).
    pub shares: [u64; STATE_SLOTS],
}

impl Tick {
    /// The rate the fleet enforces at most (shares of every state but FAIL_OPEN).
    pub fn enforced(&self) -> u64 {
        self.shares[state_index(ShareState::Bootstrap)]
            + self.shares[state_index(ShareState::Leased)]
            + self.shares[state_index(ShareState::Sticky)]
    }
}

#[derive(Clone, Debug)]
pub struct RuleSeries {
    pub name: String,
    pub quota: u64,
    pub burst: u64,
    pub fail_mode: FailMode,
    pub tracked: bool,
    /// `seconds[i]` covers `[i s, i+1 s)`.
    pub seconds: Vec<Counts>,
    /// Tracked rules only: `ticks[i]` covers `[i, i+1)` ticks.
    pub ticks: Vec<Tick>,
    /// Tracked rules only, at the end of each second: the fraction of the quota held by
    /// the wrong hosts, `Σ |share − ideal| ÷ 2 quota`, where `ideal` is the max-min fair
    /// allocation of the quota over the hosts' true offered rates (FAIL_OPEN hosts count
    /// with what they admit).
    pub misplaced: Vec<f64>,
}

#[derive(Clone, Debug, Default)]
pub struct AllocatorStats {
    /// Reports that reached the allocator, per second.
    pub reports: Vec<u64>,
    pub early_reports: u64,
    /// Closed shares that rejoined (BOOTSTRAP) on refusals after their lease lapsed.
    pub rejoins: u64,
    pub lost_reports: u64,
    pub grants: u64,
    /// Grant computations (one per rule per batch of reports).
    pub computations: u64,
}

#[derive(Clone, Debug)]
pub struct Run {
    pub scenario: Scenario,
    pub rules: Vec<RuleSeries>,
    pub allocator: AllocatorStats,
    pub tick_ns: u64,
    /// Frames offered over the run, all rules.
    pub frames: u64,
    pub wall: Duration,
}

impl Run {
    pub fn rule(&self, name: &str) -> Option<&RuleSeries> {
        self.rules.iter().find(|r| r.name == name)
    }

    /// Seconds that are statistics (after the warm-up).
    pub fn measured(&self) -> Range<usize> {
        let from = (self.scenario.warmup / crate::time::NS_PER_S) as usize;
        let to = (self.scenario.duration / crate::time::NS_PER_S) as usize;
        from..to
    }
}

/// How far and how long admitted exceeded the quota, over 1 s windows.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Overshoot {
    /// Largest (admitted − quota) / quota, percent (negative: never reached the quota).
    pub max_pct: f64,
    /// Second at which it happened.
    pub at: usize,
    /// Seconds above the quota by more than the tolerance.
    pub secs_over: usize,
    /// Longest run of such seconds.
    pub longest: usize,
}

/// Overshoot over `range` of `seconds`; a second counts as over when admitted exceeds
/// the quota by more than `tolerance_pct`.
pub fn overshoot(
    seconds: &[Counts],
    quota: u64,
    range: Range<usize>,
    tolerance_pct: f64,
) -> Overshoot {
    let mut o = Overshoot {
        max_pct: f64::NEG_INFINITY,
        ..Overshoot::default()
    };
    let mut run = 0;
    let limit = quota as f64 * (1.0 + tolerance_pct / 100.0);
    for i in range {
        let Some(c) = seconds.get(i) else { break };
        let pct = pct_over(c.admitted as f64, quota);
        if pct > o.max_pct {
            o.max_pct = pct;
            o.at = i;
        }
        if c.admitted as f64 > limit {
            o.secs_over += 1;
            run += 1;
            o.longest = o.longest.max(run);
        } else {
            run = 0;
        }
    }
    if o.max_pct == f64::NEG_INFINITY {
        o.max_pct = 0.0;
    }
    o
}

pub fn pct_over(rate: f64, quota: u64) -> f64 {
    (rate - quota as f64) / quota as f64 * 100.0
}

/// Drops the quota had room for.
///
/// In a 1 s window where the rule's fleet-wide admitted count `a` is below the quota
/// `Q`, a perfect global limiter would have admitted up to `Q - a` more frames; the
/// false drops of that window are `min(dropped, Q - a)`. Windows at or above the quota
/// have none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Drops {
    pub offered: u64,
    pub dropped: u64,
    pub false_drops: u64,
}

impl Drops {
    pub fn false_pct_of_offered(&self) -> f64 {
        if self.offered == 0 {
            0.0
        } else {
            self.false_drops as f64 * 100.0 / self.offered as f64
        }
    }

    pub fn add(&mut self, o: Drops) {
        self.offered += o.offered;
        self.dropped += o.dropped;
        self.false_drops += o.false_drops;
    }
}

pub fn drops(seconds: &[Counts], quota: u64, range: Range<usize>) -> Drops {
    let mut d = Drops::default();
    for c in seconds.get(range).unwrap_or_default() {
        d.offered += c.offered;
        d.dropped += c.dropped();
        d.false_drops += c.dropped().min(quota.saturating_sub(c.admitted));
    }
    d
}

/// Whether a second is on target: admitted within `tol_pct` of `min(quota, offered)`
/// (what a perfect global limiter admits) and not above the quota by more than that.
fn on_target(c: &Counts, quota: u64, tol_pct: f64) -> bool {
    let ideal = quota.min(c.offered) as f64;
    let a = c.admitted as f64;
    a >= ideal * (1.0 - tol_pct / 100.0) && a <= quota as f64 * (1.0 + tol_pct / 100.0)
}

/// Seconds from `from` until admitted is on target (see [`on_target`]) for `hold`
/// consecutive seconds; `None` if it never is before the data ends.
pub fn convergence(
    seconds: &[Counts],
    quota: u64,
    from: usize,
    hold: usize,
    tol_pct: f64,
) -> Option<usize> {
    let mut run = 0;
    for (i, c) in seconds.iter().enumerate().skip(from) {
        if on_target(c, quota, tol_pct) {
            run += 1;
            if run == hold {
                return Some(i + 1 - hold - from);
            }
        } else {
            run = 0;
        }
    }
    None
}

/// Seconds from `from` until the misplaced fraction of the quota settles: within
/// `slack` (a fraction of the quota) of its median over `settled` (the last seconds
/// before the next change), for `hold` consecutive seconds.
pub fn settling(
    misplaced: &[f64],
    from: usize,
    settled: Range<usize>,
    hold: usize,
    slack: f64,
) -> Option<usize> {
    let mut tail: Vec<f64> = misplaced.get(settled).unwrap_or_default().to_vec();
    if tail.is_empty() {
        return None;
    }
    tail.sort_by(f64::total_cmp);
    let target = tail[tail.len() / 2] + slack;
    let mut run = 0;
    for (i, &m) in misplaced.iter().enumerate().skip(from) {
        if m <= target {
            run += 1;
            if run == hold {
                return Some(i + 1 - hold - from);
            }
        } else {
            run = 0;
        }
    }
    None
}

/// Largest sum of the shares of hosts in `state`, over ticks in `range`.
pub fn max_share_sum(ticks: &[Tick], state: ShareState, range: Range<usize>) -> u64 {
    ticks
        .get(range)
        .unwrap_or_default()
        .iter()
        .map(|t| t.shares[state_index(state)])
        .max()
        .unwrap_or(0)
}

/// Ticks in `range` with at least one host in `state`: (first, last), if any.
pub fn state_span(
    ticks: &[Tick],
    state: ShareState,
    range: Range<usize>,
) -> Option<(usize, usize)> {
    let i = state_index(state);
    let start = range.start;
    let hits = ticks.get(range).unwrap_or_default();
    let first = hits.iter().position(|t| t.hosts[i] > 0)?;
    let last = hits.iter().rposition(|t| t.hosts[i] > 0)?;
    Some((start + first, start + last))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(v: &[(u64, u64)]) -> Vec<Counts> {
        v.iter()
            .map(|&(offered, admitted)| Counts { offered, admitted })
            .collect()
    }

    #[test]
    fn overshoot_counts_runs_over_the_tolerance() {
        let s = secs(&[(200, 100), (200, 150), (200, 101), (200, 130), (200, 90)]);
        let o = overshoot(&s, 100, 0..5, 2.0);
        assert_eq!(o.max_pct, 50.0);
        assert_eq!(o.at, 1);
        assert_eq!((o.secs_over, o.longest), (2, 1));
        let o = overshoot(&s, 100, 1..4, 0.5);
        assert_eq!((o.secs_over, o.longest), (3, 3));
    }

    #[test]
    fn false_drops_are_drops_the_quota_had_room_for() {
        // Under quota with drops: false = min(dropped, Q - admitted).
        let s = secs(&[(120, 90), (95, 80), (300, 100), (50, 50)]);
        let d = drops(&s, 100, 0..4);
        assert_eq!(d.dropped, 30 + 15 + 200);
        assert_eq!(d.false_drops, 10 + 15);
        assert_eq!(d.offered, 565);
    }

    #[test]
    fn convergence_needs_a_steady_run() {
        let s = secs(&[
            (200, 50),
            (200, 99),
            (200, 70),
            (200, 99),
            (200, 100),
            (50, 49),
            (200, 60),
        ]);
        assert_eq!(convergence(&s, 100, 0, 3, 2.0), Some(3));
        assert_eq!(convergence(&s, 100, 0, 4, 2.0), None);
    }

    #[test]
    fn settling_is_measured_against_the_new_steady_state() {
        let m = [0.05, 0.5, 0.3, 0.12, 0.07, 0.06, 0.08, 0.05, 0.06, 0.07];
        // Settled level: the median of m[6..10] = 0.07; with 0.02 of slack, m[4..7] are
        // all within it: 3 s after the shift at 1.
        assert_eq!(settling(&m, 1, 6..10, 3, 0.02), Some(3));
        // Without slack, 0.08 at 6 breaks the run; m[7..10] is the first.
        assert_eq!(settling(&m, 1, 6..10, 3, 0.0), Some(6));
        assert_eq!(settling(&m, 1, 20..30, 3, 0.02), None);
    }

    #[test]
    fn share_sums_and_spans() {
        let mut t = vec![Tick::default(); 5];
        let sticky = state_index(ShareState::Sticky);
        t[1].hosts[sticky] = 3;
        t[1].shares[sticky] = 90;
        t[3].hosts[sticky] = 1;
        t[3].shares[sticky] = 120;
        assert_eq!(max_share_sum(&t, ShareState::Sticky, 0..3), 90);
        assert_eq!(max_share_sum(&t, ShareState::Sticky, 0..5), 120);
        assert_eq!(state_span(&t, ShareState::Sticky, 0..5), Some((1, 3)));
        assert_eq!(state_span(&t, ShareState::FailOpen, 0..5), None);
        assert_eq!(t[1].enforced(), 90);
    }
}
