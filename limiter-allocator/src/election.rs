//! Who grants: the leader's view of its own etcd lease, without I/O.
//!
//! A replica leads only while it can prove its election lease is alive. etcd counts a
//! lease's TTL from when it receives a keepalive, which is after the replica sent it, so
//! the lease lives at least until `sent + ttl` of the last acknowledged keepalive. The
//! replica stops granting at `sent + 2/3 ttl`: a third of the TTL is left for clocks that
//! run at slightly different rates and for the grant in flight, and no successor can win
//! before the lease is gone. Grants carry the term (the etcd revision at which the leader
//! won), so a host that hears a deposed leader late ignores it (`limiter_fleet::failover`).
//!
//! The service asks [`Leadership::leading`] at every report, with the time: a replica
//! whose election task is stuck (etcd unreachable, a campaign call hanging) stops
//! granting on the clock, not when the task notices.

use std::net::SocketAddr;

/// A replica's role, as the report path and the metrics see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// No `[election]`: the only allocator, always granting, term 0.
    Alone,
    /// Granting under this term until the lease margin passes.
    Leader { term: u64 },
    /// Refusing reports; naming the leader when one is known.
    Follower { leader: Option<SocketAddr> },
}

impl Role {
    /// The term grants carry in this role (0 alone; a follower grants none).
    pub fn term(self) -> u64 {
        match self {
            Role::Leader { term } => term,
            Role::Alone | Role::Follower { .. } => 0,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Alone => "alone",
            Role::Leader { .. } => "leader",
            Role::Follower { .. } => "follower",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Leadership {
    /// `None`: no election (`Role::Alone`).
    ttl_ns: Option<u64>,
    /// Send time of the newest keepalive etcd acknowledged for the current lease.
    lease_sent: Option<u64>,
    /// The term won with the current lease, if won.
    term: Option<u64>,
    /// The leader etcd names (its advertised address), for redirects.
    leader: Option<SocketAddr>,
    advertise: Option<SocketAddr>,
    /// Counters for the metrics.
    pub elections_won: u64,
    pub step_downs: u64,
    /// Whether the last call to etcd succeeded.
    pub etcd_reachable: bool,
    /// Why the last etcd session failed, while etcd is unreachable (`status` shows it).
    pub etcd_error: Option<String>,
}

impl Leadership {
    /// The only allocator: always leads, term 0.
    pub fn alone() -> Leadership {
        Leadership {
            ttl_ns: None,
            lease_sent: None,
            term: None,
            leader: None,
            advertise: None,
            elections_won: 0,
            step_downs: 0,
            etcd_reachable: false,
            etcd_error: None,
        }
    }

    /// A replica with this election TTL, advertising `advertise`: a follower until it
    /// wins.
    pub fn replica(ttl_ns: u64, advertise: SocketAddr) -> Leadership {
        Leadership {
            ttl_ns: Some(ttl_ns),
            advertise: Some(advertise),
            ..Leadership::alone()
        }
    }

    /// How long after a keepalive's send time the replica may grant on it.
    pub fn margin_ns(&self) -> Option<u64> {
        self.ttl_ns.map(|ttl| ttl / 3 * 2)
    }

    /// A lease was granted, or a keepalive on it acknowledged with a TTL left; `sent`
    /// is when the request left. Stale acknowledgements do not move the deadline back.
    pub fn lease_alive(&mut self, sent: u64) {
        self.lease_sent = Some(self.lease_sent.map_or(sent, |s| s.max(sent)));
    }

    /// The lease is gone (etcd said so, or the replica gave it up): a new one starts
    /// from nothing, and whatever was won with the old one is lost.
    pub fn lease_lost(&mut self) {
        if self.term.take().is_some() {
            self.step_downs += 1;
        }
        self.lease_sent = None;
    }

    /// Until when (ns) the current lease proves leadership.
    pub fn deadline(&self) -> Option<u64> {
        Some(self.lease_sent? + self.margin_ns()?)
    }

    /// The campaign with the current lease returned at `now` with `term`: leads, unless
    /// the lease's margin has already passed (the campaign outlived the proof), in
    /// which case it returns false and the caller must give the lease up.
    pub fn won(&mut self, term: u64, now: u64) -> bool {
        if self.ttl_ns.is_none() || self.deadline().is_none_or(|d| now >= d) {
            return false;
        }
        self.term = Some(term);
        self.leader = self.advertise;
        self.elections_won += 1;
        true
    }

    /// Whether the margin has passed while leading: the caller steps down.
    pub fn expired(&self, now: u64) -> bool {
        self.term.is_some() && self.deadline().is_none_or(|d| now >= d)
    }

    /// etcd names this leader (None: no one leads).
    pub fn observed(&mut self, leader: Option<SocketAddr>) {
        if self.term.is_none() {
            self.leader = leader;
        }
    }

    /// The role at `now`: the report path grants only on `Leader` and `Alone`.
    pub fn role(&self, now: u64) -> Role {
        if self.ttl_ns.is_none() {
            return Role::Alone;
        }
        match (self.term, self.deadline()) {
            (Some(term), Some(deadline)) if now < deadline => Role::Leader { term },
            _ => Role::Follower {
                leader: self.leader.filter(|l| Some(*l) != self.advertise),
            },
        }
    }

    /// The term grants carry when granting at `now`, `None` when this replica must not.
    pub fn leading(&self, now: u64) -> Option<u64> {
        match self.role(now) {
            Role::Alone => Some(0),
            Role::Leader { term } => Some(term),
            Role::Follower { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

    use proptest::prelude::*;

    use super::*;

    const S: u64 = 1_000_000_000;
    const TTL: u64 = 3 * S;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    #[test]
    fn alone_always_grants_at_term_zero() {
        let l = Leadership::alone();
        assert_eq!(l.leading(0), Some(0));
        assert_eq!(l.leading(u64::MAX), Some(0));
        assert_eq!(l.role(5).as_str(), "alone");
    }

    #[test]
    fn a_leader_grants_until_two_thirds_of_the_ttl_after_its_last_acknowledged_send() {
        let mut l = Leadership::replica(TTL, addr(1));
        assert_eq!(l.leading(0), None, "a replica starts as a follower");
        l.lease_alive(10 * S);
        assert!(l.won(7, 10 * S + 1));
        assert_eq!(l.leading(11 * S), Some(7));
        assert_eq!(l.leading(12 * S - 1), Some(7));
        assert_eq!(l.leading(12 * S), None, "stops at sent + 2/3 ttl");
        assert!(l.expired(12 * S));
        // A keepalive acknowledged later extends it; an older acknowledgement does not
        // shorten it.
        l.lease_alive(11 * S);
        l.lease_alive(10 * S);
        assert_eq!(l.leading(13 * S - 1), Some(7));
        assert_eq!(l.leading(13 * S), None);
        l.lease_lost();
        assert_eq!(l.leading(11 * S), None);
        assert_eq!(l.step_downs, 1);
    }

    #[test]
    fn a_campaign_that_returns_after_the_margin_does_not_lead() {
        let mut l = Leadership::replica(TTL, addr(1));
        assert!(!l.won(3, 0), "no lease: no leadership");
        l.lease_alive(0);
        assert!(!l.won(3, 2 * S), "won at the deadline");
        assert_eq!(l.leading(2 * S), None);
    }

    #[test]
    fn a_follower_redirects_to_the_leader_etcd_names_never_to_itself() {
        let mut l = Leadership::replica(TTL, addr(1));
        l.observed(Some(addr(2)));
        assert_eq!(
            l.role(0),
            Role::Follower {
                leader: Some(addr(2))
            }
        );
        // etcd still names this replica (its old key outlives its step-down).
        l.observed(Some(addr(1)));
        assert_eq!(l.role(0), Role::Follower { leader: None });
    }

    #[derive(Debug, Clone)]
    enum Event {
        /// A keepalive sent `ago` ns before now is acknowledged.
        Alive {
            ago: u64,
        },
        Lost,
        Won {
            term: u64,
        },
        Advance {
            by: u64,
        },
    }

    fn event() -> impl Strategy<Value = Event> {
        prop_oneof![
            (0..TTL).prop_map(|ago| Event::Alive { ago }),
            Just(Event::Lost),
            (1..1000u64).prop_map(|term| Event::Won { term }),
            (0..2 * TTL).prop_map(|by| Event::Advance { by }),
        ]
    }

    proptest! {
        /// Whatever etcd acknowledges and whenever campaigns return, a replica grants
        /// only before etcd could have expired its lease: `now` is below the newest
        /// acknowledged send time plus the TTL (by a third of it).
        #[test]
        fn never_grants_once_the_lease_may_have_expired(
            events in proptest::collection::vec(event(), 1..60)
        ) {
            let mut l = Leadership::replica(TTL, addr(1));
            let mut now = TTL;
            let mut newest_sent: Option<u64> = None;
            for e in events {
                match e {
                    Event::Alive { ago } => {
                        let sent = now.saturating_sub(ago);
                        l.lease_alive(sent);
                        newest_sent = Some(newest_sent.map_or(sent, |s| s.max(sent)));
                    }
                    Event::Lost => {
                        l.lease_lost();
                        newest_sent = None;
                    }
                    Event::Won { term } => {
                        l.won(term, now);
                    }
                    Event::Advance { by } => now += by,
                }
                if l.leading(now).is_some() {
                    let sent = newest_sent.expect("leading without a lease");
                    prop_assert!(now + TTL / 3 <= sent + TTL, "granting at {now}, lease sent {sent}");
                }
            }
        }
    }
}
