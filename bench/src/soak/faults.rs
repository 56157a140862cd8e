//! The faults, one a minute on a seeded schedule: every kind once in a shuffled order,
//! then again, so any three minutes see three different ones. Each has a start, an end
//! (when the rig healed it), and the LB or replica it hit.

use super::Rng;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fault {
    /// SIGKILL of the replica that leads; it is started again 10 s later.
    LeaderKill,
    /// etcd SIGKILLed, started again 10 s later over its data.
    EtcdRestart,
    /// An LB's daemon SIGKILLed and started again at once over its pins.
    DaemonKill,
    /// The per-source limits doubled in every LB's config, `limiter reload`; halved back
    /// at the end.
    Reload,
    /// An LB's management link down for the partition's length.
    Partition,
    /// An nginx backend stopped gracefully and started again.
    BackendRestart,
    /// An LB's daemon stopped (SIGTERM) and `limiter run` again over the same pins: the
    /// upgrade path (the same binary here: the run has one build).
    Upgrade,
}

impl Fault {
    pub const ALL: [Fault; 7] = [
        Fault::LeaderKill,
        Fault::EtcdRestart,
        Fault::DaemonKill,
        Fault::Reload,
        Fault::Partition,
        Fault::BackendRestart,
        Fault::Upgrade,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Fault::LeaderKill => "leader-kill",
            Fault::EtcdRestart => "etcd-restart",
            Fault::DaemonKill => "daemon-kill",
            Fault::Reload => "reload",
            Fault::Partition => "partition",
            Fault::BackendRestart => "backend-restart",
            Fault::Upgrade => "upgrade",
        }
    }
}

/// The fault of each minute (index 0 = the first soak minute) and the LB it hits.
pub fn schedule(seed: u64, minutes: u64, lbs: usize) -> Vec<(Fault, usize)> {
    let mut rng = Rng::new(seed);
    let mut out = Vec::new();
    while (out.len() as u64) < minutes {
        let mut round = Fault::ALL;
        rng.shuffle(&mut round);
        for f in round {
            if (out.len() as u64) < minutes {
                out.push((f, 1 + rng.below(lbs)));
            }
        }
    }
    out
}

/// A fault as it happened: s since the run's epoch.
#[derive(Clone, Debug, PartialEq)]
pub struct FaultRecord {
    pub fault: Fault,
    pub target: String,
    pub from: f64,
    pub to: Option<f64>,
    pub note: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schedule_repeats_with_its_seed_and_covers_every_fault() {
        assert_eq!(schedule(5, 20, 3), schedule(5, 20, 3));
        let s = schedule(5, 7, 3);
        let mut kinds: Vec<Fault> = s.iter().map(|(f, _)| *f).collect();
        kinds.sort();
        assert_eq!(kinds, Fault::ALL.to_vec());
        assert!(s.iter().all(|(_, lb)| (1..=3).contains(lb)));
    }

    #[test]
    fn any_three_minutes_see_three_faults() {
        for seed in 0..50 {
            let s = schedule(seed, 3, 3);
            assert_eq!(s.len(), 3);
            assert!(s[0].0 != s[1].0 && s[1].0 != s[2].0 && s[0].0 != s[2].0);
        }
    }

    #[test]
    fn another_seed_another_order() {
        assert!((0..10).any(|seed| schedule(seed, 7, 3) != schedule(seed + 1, 7, 3)));
    }
}
