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
/// `replicas` runs two tests at a time ([`TWO_AT_A_TIME`]: ≈ 185 s one at a time), and
/// with `fleet_peers` (≈ 55 s) here too the two lanes take about as long as each other
/// (≈ 385 s; the busy lane's files took 376 s in CI).
pub const WAITING: &[&str] = &["replicas", "soak", "fleet_peers"];

/// Files whose tests run two at a time; every other file's run one at a time. Each of
/// `replicas`' tests starts a fleet of its own (etcd and its replicas, daemons on veth
/// pairs of their own, loopback ports never handed out twice in the process, nftables
/// cuts named per test) and spends most of its time waiting on leases and elections:
/// two side by side take about half as long. Its sums of shares read from several
/// daemons are read as one snapshot (`web_shares`), so that a neighbour slowing the
/// readings cannot make them straddle a grant. `fleet` was tried too (143 s became
/// 81), but its check that three saturated hosts admit the quota within 2 % read
/// 2,920/s of 3,000 while the test beside it started its daemons: a host's bucket
/// holds 100 ms of its share, and senders that stall longer give it nothing to admit.
pub const TWO_AT_A_TIME: &[&str] = &["replicas"];

/// libtest's `--test-threads` for `file`.
pub fn test_threads(file: &str) -> usize {
    if TWO_AT_A_TIME.contains(&file) {
        2
    } else {
        1
    }
}

/// Files that need the CPUs to themselves: they run last, one at a time, in this order,
/// so that the most sensitive run latest, when CI's guest beside the host suite has most
/// likely ended. `accuracy` offers 1 M frames/s from both CPUs and checks what passed
/// against a model of the arrivals (with the guest beside all of it, its two-CPU rows
/// failed their premise; beside part of it they pass, or an attempt is retried).
/// `fleet` checks admitted rates against shares to ±2 % with paced senders and has no
/// premise to retry on: run first, beside a guest slowed by a loaded machine, one of
/// its hosts admitted 769 frames/s of a 1,000/s share, so it runs last.
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
    fn only_the_files_named_run_two_tests_at_a_time() {
        for file in TWO_AT_A_TIME {
            assert_eq!(test_threads(file), 2, "{file}");
        }
        for file in ["accuracy", "soak", "new_file"] {
            assert_eq!(test_threads(file), 1, "{file}");
        }
    }

    #[test]
    fn no_file_is_in_two_lists() {
        assert!(WAITING.iter().all(|f| !ALONE.contains(f)));
    }
}
