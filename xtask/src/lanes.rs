//! Which kernel test files run side by side on a 2-CPU machine, and which alone.
//!
//! Most of the suite's time is waiting: fleet tests wait on leases, report intervals and
//! elections, and use little CPU while they do. Those run in a lane of their own beside
//! the others. The files whose checks need the CPUs to themselves (senders offering
//! 1 M frames/s from both CPUs, delays measured against a report interval) run last,
//! alone: beside anything else their premises fail (the accuracy suite offered 3.8× a
//! rate where it plans 10× with qemu beside it, and failed CI).

/// Files whose time is waiting on the fleet's clocks (leases, elections, report
/// intervals): they run in the second lane.
pub const WAITING: &[&str] = &["fleet_lab", "fleet_peers", "replicas"];

/// Files that need the CPUs to themselves: they run after both lanes, one at a time.
/// `fleet` times convergence against the report interval and sums shares read from
/// three daemons one after another: beside the busy lane, the reads straddled a grant
/// and their sum passed the quota (530 + 584 + 1,942 = 3,056 of 3,000 while the shares
/// moved).
pub const ALONE: &[&str] = &["abuse", "accuracy", "fleet", "saturation", "scrape_load"];

/// The files of one run, by lane, each in the order given.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan<'a> {
    /// The second lane: [`WAITING`].
    pub waiting: Vec<&'a str>,
    /// The first lane: every other file (a file not named here lands in it).
    pub busy: Vec<&'a str>,
    /// After both lanes: [`ALONE`].
    pub alone: Vec<&'a str>,
}

pub fn plan<'a>(files: &[&'a str]) -> Plan<'a> {
    let mut plan = Plan::default();
    for &file in files {
        if WAITING.contains(&file) {
            plan.waiting.push(file);
        } else if ALONE.contains(&file) {
            plan.alone.push(file);
        } else {
            plan.busy.push(file);
        }
    }
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
        assert_eq!(plan.waiting, ["fleet_lab", "replicas"]);
        assert_eq!(plan.alone, ["accuracy", "fleet", "scrape_load"]);
        assert_eq!(plan.busy, ["cli", "new_file"]);
        let mut all: Vec<&str> = [plan.waiting, plan.busy, plan.alone].concat();
        all.sort_unstable();
        assert_eq!(all, files);
    }

    #[test]
    fn no_file_is_in_two_lists() {
        assert!(WAITING.iter().all(|f| !ALONE.contains(f)));
    }
}
