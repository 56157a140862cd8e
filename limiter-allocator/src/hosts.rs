//! The fleet's host table: which hosts may report, bounded by `max_hosts`, each with its
//! own report-rate bucket. Pure; the service calls in with `now`.
//!
//! A host is known while it has reported within a lease TTL — the same horizon after which
//! the allocation forgets it and its share lapses. A newcomer is admitted only while fewer
//! than `max_hosts` hosts are known: nobody is evicted for it. A host that stopped
//! reporting for a lease TTL has left; it comes back as a newcomer, if there is room.

use std::collections::BTreeMap;

use crate::limits::ReportBucket;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostLimits {
    pub max_hosts: usize,
    /// A host unheard for this long (ns) has left.
    pub ttl_ns: u64,
    /// Reports per second per host, and the burst.
    pub rate: u64,
    pub burst: u64,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// `max_hosts` hosts are known and this one is not among them.
    FleetFull { max_hosts: usize },
    /// The host reports faster than its bucket allows.
    RateLimited { rate: u64 },
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    last_report: u64,
    bucket: ReportBucket,
}

#[derive(Debug)]
pub struct HostTable {
    limits: HostLimits,
    hosts: BTreeMap<String, Entry>,
}

impl HostTable {
    pub fn new(limits: HostLimits) -> HostTable {
        HostTable {
            limits,
            hosts: BTreeMap::new(),
        }
    }

    pub fn limits(&self) -> HostLimits {
        self.limits
    }

    /// Whether `host`'s report at `now` may be handled; an admitted report counts as the
    /// host's last. O(log hosts), except for a newcomer finding the table full, which
    /// first drops the hosts that left (O(hosts)).
    pub fn admit(&mut self, host: &str, now: u64) -> Result<(), Refusal> {
        let ttl = self.limits.ttl_ns;
        if let Some(e) = self.hosts.get_mut(host) {
            if now.saturating_sub(e.last_report) <= ttl {
                if !e.bucket.allow(now) {
                    return Err(Refusal::RateLimited {
                        rate: self.limits.rate,
                    });
                }
                e.last_report = now;
                return Ok(());
            }
            // It left and is back: a newcomer like any other.
            self.hosts.remove(host);
        }
        if self.hosts.len() >= self.limits.max_hosts {
            self.hosts
                .retain(|_, e| now.saturating_sub(e.last_report) <= ttl);
            if self.hosts.len() >= self.limits.max_hosts {
                return Err(Refusal::FleetFull {
                    max_hosts: self.limits.max_hosts,
                });
            }
        }
        let mut bucket = ReportBucket::new(self.limits.rate, self.limits.burst);
        bucket.allow(now);
        self.hosts.insert(
            host.to_string(),
            Entry {
                last_report: now,
                bucket,
            },
        );
        Ok(())
    }

    /// Hosts heard within a lease TTL of `now`.
    pub fn known(&self, now: u64) -> usize {
        self.hosts
            .values()
            .filter(|e| now.saturating_sub(e.last_report) <= self.limits.ttl_ns)
            .count()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const S: u64 = 1_000_000_000;

    fn table(max_hosts: usize) -> HostTable {
        HostTable::new(HostLimits {
            max_hosts,
            ttl_ns: 3 * S,
            rate: 10,
            burst: 10,
        })
    }

    #[test]
    fn a_full_fleet_refuses_newcomers_and_keeps_its_hosts() {
        let mut t = table(2);
        assert_eq!(t.admit("a", 0), Ok(()));
        assert_eq!(t.admit("b", 0), Ok(()));
        assert_eq!(t.admit("c", S), Err(Refusal::FleetFull { max_hosts: 2 }));
        // Known hosts go on reporting, however many newcomers knock.
        for i in 0..100 {
            let _ = t.admit(&format!("x{i}"), S);
        }
        assert_eq!(t.admit("a", 2 * S), Ok(()));
        assert_eq!(t.admit("b", 2 * S), Ok(()));
        assert_eq!(t.known(2 * S), 2);
        // b stops reporting; a lease TTL later it has left and c gets its place.
        assert_eq!(t.admit("a", 5 * S), Ok(()));
        assert_eq!(t.admit("c", 5 * S + 1), Ok(()));
        // b is back: no room now.
        assert_eq!(
            t.admit("b", 5 * S + 2),
            Err(Refusal::FleetFull { max_hosts: 2 })
        );
    }

    #[test]
    fn a_host_reporting_too_fast_is_refused_and_others_are_not() {
        let mut t = table(8);
        let allowed = (0..100).filter(|_| t.admit("flood", S).is_ok()).count();
        assert_eq!(allowed, 10, "the burst");
        assert_eq!(t.admit("flood", S), Err(Refusal::RateLimited { rate: 10 }));
        assert_eq!(t.admit("calm", S), Ok(()));
        assert_eq!(t.admit("flood", S + S / 10), Ok(()));
    }

    proptest! {
        /// Whatever the sequence of reports, the table never holds more than max_hosts
        /// live hosts, and a live host is never refused as "fleet full".
        #[test]
        fn the_bound_holds_and_live_hosts_stay(
            max in 1usize..6,
            steps in prop::collection::vec((0u8..12, 0u64..2 * S), 1..300),
        ) {
            let mut t = table(max);
            let mut now = 0;
            for (host, gap) in steps {
                now += gap;
                let name = format!("h{host}");
                let live_before = t.hosts.get(&name)
                    .is_some_and(|e| now - e.last_report <= 3 * S);
                let r = t.admit(&name, now);
                if live_before {
                    let full = matches!(r, Err(Refusal::FleetFull { .. }));
                    prop_assert!(!full, "live host {} refused as fleet full", name);
                }
                prop_assert!(t.known(now) <= max);
            }
        }
    }
}
