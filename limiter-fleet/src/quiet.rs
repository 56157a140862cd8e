//! A demand that left, told before the next report: a candidate the simulator measures
//! (`Scenario::quiet_reports`, README "Accuracy candidates"); the daemon does not run it.
//!
//! The allocator gives a departed demand's share away at once (`alloc`), but it hears
//! of the departure only at the host's next report: up to a report interval after the
//! traffic stopped, and a report whose interval straddles the stop still counts the
//! frames before it. Until then the hosts the demand moved to refuse frames against
//! a quota nobody uses. A [`Quiet`] watches one rule on one host: once the host has
//! offered nothing for as long as its last reported demand takes to bring
//! [`QUIET_FRAMES`] frames, its demand has left, and the host reports at once, with
//! demand 0.
//!
//! Only for rules counted in frames (packets, SYNs): a byte count says nothing about
//! how many frames a gap should have held.

/// Frames the last reported demand must have been expected to bring in the silence.
/// Poisson arrivals leave such a gap once in 10¹⁰ windows (e^-24); the allocator's own
/// test for a demand that left uses the same count.
pub const QUIET_FRAMES: u64 = 24;

/// The shortest silence taken as a demand that left (ns). A demand that fell to a tenth
/// (a flash crowd's end: 120/s to 12/s) looks like one that left for a while; at 12/s a
/// 500 ms silence comes once in e⁶ ≈ 400 windows, a 200 ms one once in 11, and at 200 ms
/// the simulator's flash crowd lost several points more in the seconds after its end.
pub const QUIET_MIN_NS: u64 = 500_000_000;

const NS_PER_S: u64 = 1_000_000_000;

/// One rule's offered count as last seen, and since when it has not moved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Quiet {
    /// The offered total last observed.
    offered: u64,
    /// When it last moved (caller's clock, ns).
    active_at: u64,
    /// The demand (per second) of the last report if it counted [`QUIET_FRAMES`] or
    /// more; else 0 (nothing to go by).
    armed: u64,
    /// The last report said the demand left, at this offered total.
    told_at: Option<u64>,
}

impl Quiet {
    pub fn new(now: u64) -> Quiet {
        Quiet {
            offered: 0,
            active_at: now,
            armed: 0,
            told_at: None,
        }
    }

    /// Records the rule's offered total (frames since any fixed start) seen at `now`.
    pub fn observe(&mut self, offered_total: u64, now: u64) {
        if offered_total != self.offered {
            self.offered = offered_total;
            self.active_at = now;
        }
    }

    /// How long a silence must last to say the last reported demand left; `None` when
    /// that report counted fewer than [`QUIET_FRAMES`] frames: a rate from a few frames
    /// says little, least of all an early report's, which follows a burst.
    pub fn window(&self) -> Option<u64> {
        (self.armed > 0).then(|| {
            let ns = u128::from(QUIET_FRAMES) * u128::from(NS_PER_S) / u128::from(self.armed);
            u64::try_from(ns).unwrap_or(u64::MAX).max(QUIET_MIN_NS)
        })
    }

    /// Whether the demand last reported has left: nothing offered for its window.
    pub fn left(&self, now: u64) -> bool {
        self.window()
            .is_some_and(|w| now.saturating_sub(self.active_at) >= w)
    }

    /// The demand to report now, given what was offered since the last report (frames)
    /// and its rate: 0 if it left (the rate since the last report still counts the
    /// frames before the silence). Remembered as the demand reported.
    pub fn demand(&mut self, offered: u64, offered_rate: u64, now: u64) -> u64 {
        let left = self.left(now);
        self.told_at = left.then_some(self.offered);
        let demand = if left { 0 } else { offered_rate };
        self.armed = if offered >= QUIET_FRAMES { demand } else { 0 };
        demand
    }

    /// Whether frames came since a report said the demand left: it had only fallen (a
    /// silence can be a slow demand's), and the next report, at once, says so.
    pub fn resumed(&self) -> bool {
        self.told_at.is_some_and(|at| at != self.offered)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn a_silence_worth_24_frames_of_the_last_demand_is_a_departure() {
        let mut q = Quiet::new(0);
        q.observe(100, 10 * MS);
        assert_eq!(
            q.demand(30, 30, 10 * MS),
            30,
            "traffic: reported as counted"
        );
        // 30 frames/s: 24 frames in 800 ms.
        assert_eq!(q.window(), Some(800 * MS));
        q.observe(130, 300 * MS);
        assert!(!q.left(1_099 * MS));
        assert!(q.left(1_100 * MS));
        assert!(!q.resumed());
        assert_eq!(
            q.demand(20, 20, 1_100 * MS),
            0,
            "the rate still counts the frames before"
        );
        assert!(
            !q.left(10_000 * MS),
            "told once: a demand of 0 has nothing to leave"
        );
        assert!(!q.resumed());
        q.observe(131, 10_000 * MS);
        assert!(
            q.resumed(),
            "a frame after the report: the demand had only fallen"
        );
        q.demand(1, 5, 10_200 * MS);
        assert!(!q.resumed(), "said so");
    }

    #[test]
    fn frames_reset_the_silence() {
        let mut q = Quiet::new(0);
        q.demand(30, 30, 0);
        q.observe(5, 350 * MS);
        q.observe(6, 700 * MS);
        assert!(!q.left(1_499 * MS));
        assert!(q.left(1_500 * MS));
    }

    #[test]
    fn a_fast_demand_still_waits_the_shortest_silence() {
        let mut q = Quiet::new(0);
        q.demand(1_000_000, 1_000_000, 0);
        assert_eq!(q.window(), Some(QUIET_MIN_NS));
        assert!(!q.left(QUIET_MIN_NS - 1));
        assert!(q.left(QUIET_MIN_NS));
    }

    #[test]
    fn a_rate_from_fewer_than_24_frames_arms_nothing() {
        let mut q = Quiet::new(0);
        // An early report 200 ms after the last, just after a burst: 20 frames, 100/s.
        q.demand(QUIET_FRAMES - 4, 100, 0);
        assert_eq!(q.window(), None);
        assert!(!q.left(u64::MAX));
    }

    #[test]
    fn nothing_reported_nothing_to_leave() {
        let q = Quiet::new(0);
        assert_eq!(q.window(), None);
        assert!(!q.left(u64::MAX));
    }

    #[test]
    fn a_slow_demand_waits_longer_than_an_interval() {
        let mut q = Quiet::new(0);
        q.demand(24, 2, 0);
        assert_eq!(q.window(), Some(12_000 * MS), "24 frames at 2/s");
        assert!(!q.left(11_999 * MS));
    }
}
