//! A host's side of replicated allocators: which replica it reports to, and which
//! replies it lets take effect.
//!
//! Replicas elect one leader in etcd; the leader's grants carry its term (the etcd
//! revision at which it won, so a later leader's is larger). Two rules keep a host safe
//! from replicas that are wrong or lie:
//! - [`TermFence`]: a reply whose term is below the highest the host has applied is
//!   ignored, so a deposed leader that has not noticed yet never overrides its successor;
//! - [`Replicas`]: a follower's redirect is followed only to an address of the host's
//!   own list, so a replica cannot steer hosts to an allocator the operator never named.

/// The highest term applied so far; replies from lower terms are refused.
///
/// Unless none was applied for `reset_after` (one lease TTL): a deposed leader steps down
/// within its election TTL, which is shorter, so a lower term that is all the host hears
/// for that long comes from a term space that started over (an etcd cluster rebuilt from
/// nothing restarts its revisions), not from a leader that missed its deposition. Without
/// this, such a rebuild would leave every host refusing every grant until restarted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TermFence {
    highest: u64,
    /// When a reply was last admitted (caller's clock, ns); `None`: never.
    admitted_at: Option<u64>,
    reset_after: u64,
}

impl TermFence {
    pub fn new(reset_after_ns: u64) -> TermFence {
        TermFence {
            highest: 0,
            admitted_at: None,
            reset_after: reset_after_ns,
        }
    }

    /// Whether a reply of `term` arriving at `now` may take effect; if so, `term`
    /// becomes the floor. Term 0 (an allocator without election) is admitted only while
    /// no elected leader has been heard from (or after a reset).
    pub fn admit(&mut self, term: u64, now: u64) -> bool {
        let stale = self
            .admitted_at
            .is_some_and(|at| now.saturating_sub(at) >= self.reset_after);
        if term < self.highest && !stale {
            return false;
        }
        self.highest = term;
        self.admitted_at = Some(now);
        true
    }

    pub fn highest(&self) -> u64 {
        self.highest
    }
}

/// The allocator addresses a host may report to, in its configured order, and the one
/// it reports to now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replicas<A> {
    list: Vec<A>,
    current: usize,
}

impl<A: PartialEq> Replicas<A> {
    /// `list` must not be empty (the config checker refuses an empty list).
    pub fn new(list: Vec<A>) -> Replicas<A> {
        Replicas { list, current: 0 }
    }

    pub fn current(&self) -> usize {
        self.current
    }

    pub fn list(&self) -> &[A] {
        &self.list
    }

    /// After a failed call without a redirect: the next address, round robin.
    pub fn failed(&mut self) -> usize {
        if !self.list.is_empty() {
            self.current = (self.current + 1) % self.list.len();
        }
        self.current
    }

    /// A follower named `leader`: switch to it if it is in the list and say so;
    /// otherwise (not one of ours, or where we are already) try the next one.
    pub fn redirected(&mut self, leader: &A) -> Redirect {
        match self.list.iter().position(|a| a == leader) {
            Some(i) if i != self.current => {
                self.current = i;
                Redirect::Followed(i)
            }
            Some(_) => Redirect::Next(self.failed()),
            None => Redirect::Unlisted(self.failed()),
        }
    }
}

/// What [`Replicas::redirected`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Redirect {
    /// Now reporting to this index, the named leader.
    Followed(usize),
    /// The redirect named the replica that refused: the next one instead.
    Next(usize),
    /// The named leader is not in the host's list: ignored, the next one instead.
    Unlisted(usize),
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const TTL: u64 = 3_000_000_000;

    #[test]
    fn a_lower_term_is_refused_an_equal_or_higher_one_admitted() {
        let mut fence = TermFence::new(TTL);
        assert!(fence.admit(0, 0));
        assert!(fence.admit(7, 1));
        assert!(fence.admit(7, 2));
        assert!(!fence.admit(6, 3));
        assert!(
            !fence.admit(0, 4),
            "an unelected allocator after an elected leader"
        );
        assert!(fence.admit(9, 5));
        assert_eq!(fence.highest(), 9);
    }

    #[test]
    fn a_term_space_that_started_over_is_accepted_after_a_lease_ttl() {
        let mut fence = TermFence::new(TTL);
        assert!(fence.admit(900, 0));
        assert!(!fence.admit(3, TTL - 1));
        assert!(
            fence.admit(3, TTL),
            "a lower term heard alone for a lease TTL"
        );
        assert!(!fence.admit(2, TTL + 1), "the new floor holds again");
    }

    #[test]
    fn redirects_stay_within_the_list() {
        let mut r = Replicas::new(vec!["a", "b", "c"]);
        assert_eq!(r.redirected(&"c"), Redirect::Followed(2));
        assert_eq!(r.current(), 2);
        assert_eq!(r.redirected(&"evil"), Redirect::Unlisted(0));
        assert_eq!(r.redirected(&"a"), Redirect::Next(1));
        assert_eq!(r.failed(), 2);
        assert_eq!(r.failed(), 0);
    }

    proptest! {
        /// Whatever order replies arrive in, within a lease TTL of each other the
        /// admitted terms never decrease, and every reply at or above the running
        /// maximum is admitted.
        #[test]
        fn admitted_terms_never_decrease(
            replies in proptest::collection::vec((0u64..20, 0u64..TTL / 2), 0..60),
        ) {
            let mut fence = TermFence::new(TTL);
            let mut max = 0u64;
            let mut last_admitted = 0u64;
            let mut now = 0u64;
            let mut last_at = 0u64;
            for (t, gap) in replies {
                now += gap;
                let stale = now - last_at >= TTL && last_admitted > 0;
                let admitted = fence.admit(t, now);
                prop_assert_eq!(admitted, t >= max || stale);
                if admitted {
                    prop_assert!(t >= last_admitted || stale);
                    last_admitted = t;
                    last_at = now;
                    max = t;
                }
            }
        }

        /// Whatever a replica names, the host only ever reports to an address of its
        /// own list.
        #[test]
        fn the_current_replica_is_always_listed(
            n in 1usize..6,
            events in proptest::collection::vec(proptest::option::of(0usize..12), 0..40),
        ) {
            let list: Vec<usize> = (0..n).collect();
            let mut r = Replicas::new(list.clone());
            for e in events {
                match e {
                    Some(named) => { r.redirected(&named); }
                    None => { r.failed(); }
                }
                prop_assert!(r.current() < n);
                prop_assert!(list.contains(&r.list()[r.current()]));
            }
        }
    }
}
