//! The order of the kernel test files on a 2-CPU machine: two lanes side by side, then
//! the files whose checks need the CPUs to themselves, one at a time, last, when CI's
//! guest leg beside them has usually ended (senders offering 1 M frames/s from both CPUs,
//! delays and rates measured against report intervals).
//!
//! The second lane holds the files whose time is mostly waiting on leases and elections
//! ([`WAITING`]); it took the host suite from ≈ 1,000 s to 744 s. Two timed
//! checks failed beside the busy lane in the first rehearsals, and each was made robust
//! before the lanes came back: a share sum read across three daemons straddled a grant
//! (sums of shares are now read as one snapshot, `web_shares` in the fleet tests'
//! common module), and `replicas`' admitted rate read 2.6 % over its quota (each
//! reading is now timed at its middle, not from before or after it).

/// Files whose time is waiting on the fleet's clocks (leases, elections, report
/// intervals), beside the others.
/// `soak` (≈ 4 min in its test form) is mostly waiting too: its traffic is a few hundred
/// requests/s and its floods a few thousand packets/s at nice 19; the goals it asserts
/// are counts and bounds, not timings (its latency goal is printed, not asserted).
/// `fleet_lab` and `fleet_peers` (≈ 1 min each) wait as well, but run in the busy lane:
/// with `soak` here the two lanes take about as long as each other (with `fleet_peers`
/// here they took 474 and 389 s in CI, ≈ 421 and ≈ 442 s without).
///
/// Every file runs its tests one at a time. `replicas` two at a time was tried (each
/// test starts its own etcd, replicas and daemons, then mostly waits): 185 s became
/// 101–113 s and it passed in all three runs, but `fleet_lab` in the busy lane beside it
/// read 2,647 frames/s admitted through two failovers against a 2,400/s quota (± 5 %) in
/// one of two CI runs (2,418 and 2,470/s on an idle machine); until that is understood
/// the extra load stays out. `fleet` two at a time: 143 s became 81, but its check that
/// three saturated hosts admit their quota within 2 % read 2,920/s of 3,000 while the
/// test beside it started its daemons (a host's bucket holds 100 ms of its share, and
/// senders that stall longer give it nothing to admit).
pub const WAITING: &[&str] = &["replicas", "soak"];

/// Files that need the CPUs to themselves: they run last, one at a time, in this order,
/// so that the most sensitive run latest, when CI's guest beside the host suite has most
/// likely ended. `accuracy` offers 1 M frames/s from both CPUs and checks what passed
/// against a model of the arrivals (with the guest beside all of it, its two-CPU rows
/// failed their premise; beside part of it they pass, or an attempt is retried).
/// `fleet` checks admitted rates against shares to ±2 % with paced senders and has no
/// premise to retry on: run first, beside a guest slowed by a loaded machine, one of
/// its hosts admitted 769 frames/s of a 1,000/s share, so it runs last.
/// (`replicas` and `fleet` run one test at a time: see [`WAITING`].)
pub const ALONE: &[&str] = &["abuse", "saturation", "scrape_load", "accuracy", "fleet"];

/// The files of one run, by lane, each in the order given.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan<'a> {
    /// [`WAITING`].
    pub waiting: Vec<&'a str>,
    /// Every other file (a file not named here lands here), first.
    pub busy: Vec<&'a str>,
    /// [`ALONE`], last, in [`ALONE`]'s order.
    pub alone: Vec<&'a str>,
}

pub fn plan<'a>(files: &[&'a str]) -> Plan<'a> {
    let mut plan = Plan::default();
    for &file in files {
        if WAITING.contains(&file) {
            plan.waiting.push(file);
        } else if !ALONE.contains(&file) {
            plan.busy.push(file);
        }
    }
    plan.alone = ALONE
        .iter()
        .filter_map(|alone| files.iter().find(|&&f| f == *alone).copied())
        .collect();
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_runs_once_and_a_new_one_lands_in_the_busy_lane() {
        let files = [
            "accuracy",
            "cli",
            "fleet",
            "fleet_lab",
            "new_file",
            "replicas",
            "scrape_load",
        ];
        let plan = plan(&files);
        assert_eq!(plan.waiting, ["replicas"]);
        // In ALONE's order, not the files'.
        let at = |f: &&str| ALONE.iter().position(|a| a == f);
        assert!(
            plan.alone.windows(2).all(|w| at(&w[0]) < at(&w[1])),
            "{:?}",
            plan.alone
        );
        let mut alone = plan.alone.clone();
        alone.sort_unstable();
        assert_eq!(alone, ["accuracy", "fleet", "scrape_load"]);
        assert_eq!(plan.busy, ["cli", "fleet_lab", "new_file"]);
        let mut all: Vec<&str> = [plan.waiting, plan.busy, plan.alone].concat();
        all.sort_unstable();
        assert_eq!(all, files);
    }

    #[test]
    fn no_file_is_in_two_lists() {
        assert!(WAITING.iter().all(|f| !ALONE.contains(f)));
    }
}
