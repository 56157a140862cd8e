//! The order of the kernel test files on a 2-CPU machine: three lanes side by side, then
//! the files whose checks need the CPUs to themselves, one at a time, last, after CI's
//! guest leg has ended ([`ALONE_AFTER_PID`]; senders offering 1 M frames/s from both
//! CPUs, delays and rates measured against report intervals).
//!
//! The third lane ([`PRIORITY`]) holds a file that needs little CPU but needs it on time,
//! at a lower nice value than the others. The second lane holds the files whose time is mostly waiting on leases and elections
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
/// one of two CI runs (2,418 and 2,470/s on an idle machine): a new leader renewed each
/// host's credit at every grant of its learning period (fixed in limiter-fleet's
/// `alloc`). It stays one at a time because CI is CPU-bound throughout (both CPUs busy
/// from the build to the end of `accuracy`, the 6.1 guest taking what the lanes leave):
/// a shorter lane gives the guest less time beside it. `fleet` two at a time: 143 s became 81, but its check that
/// three saturated hosts admit their quota within 2 % read 2,920/s of 3,000 while the
/// test beside it started its daemons (a host's bucket holds 100 ms of its share, and
/// senders that stall longer give it nothing to admit).
pub const WAITING: &[&str] = &["replicas", "soak"];

/// Files that need the CPUs to themselves: they run last, one at a time, in this order,
/// after CI's guest has ended ([`ALONE_AFTER_PID`]; before that wait, the most sensitive
/// ran latest so that the guest had most likely ended). `accuracy` offers 1 M frames/s from both CPUs and checks what passed
/// against a model of the arrivals (with the guest beside all of it, its two-CPU rows
/// failed their premise; beside part of it they pass, or an attempt is retried).
/// (`replicas` and `fleet` run one test at a time: see [`WAITING`].)
pub const ALONE: &[&str] = &["abuse", "saturation", "scrape_load", "accuracy"];

/// Files that run in a third lane beside the other two, their processes (the test
/// executable and every daemon, allocator and sender it starts) at [`PRIORITY_NICE`].
/// `fleet` checks admitted rates against shares to ±2 % with paced senders and has no
/// premise to retry on, but uses a fifth of a CPU: among the files that ran alone it was
/// the last and took 142 s of CI at 0.22 CPUs (`/proc/stat`). At nice 0 it could not run
/// beside other work: beside a guest slowed by a loaded machine one of its hosts admitted
/// 769 frames/s of a 1,000/s share, and two of its tests side by side read 2,920/s of
/// 3,000 while one started its daemons. At −5 the scheduler gives its runnable threads
/// three times the weight of a lane's or CI's guest's (nice 0), so
/// what it needs it gets when it needs it; what it leaves goes to the others.
pub const PRIORITY: &[&str] = &["fleet"];

/// The nice value of the [`PRIORITY`] lane.
pub const PRIORITY_NICE: i32 = -5;

/// Sets the calling thread's nice value, which the processes it starts from then on
/// inherit (Linux keeps it per thread). Lowering it needs CAP_SYS_NICE (`cargo xtask
/// test` runs as root); a refusal is an error that names the value.
pub fn set_thread_nice(nice: i32) -> anyhow::Result<()> {
    unsafe extern "C" {
        fn setpriority(which: i32, who: u32, prio: i32) -> i32;
    }
    const PRIO_PROCESS: i32 = 0;
    // SAFETY: plain integers; PRIO_PROCESS with `who` 0 is the calling thread on Linux.
    if unsafe { setpriority(PRIO_PROCESS, 0, nice) } != 0 {
        return Err(anyhow::anyhow!(
            "setting the {PRIORITY:?} lane's nice value to {nice}: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// `LIMITER_ALONE_AFTER_PID`: a process (CI's 6.1 guest) the [`ALONE`] files wait for,
/// so that none runs beside its emulation. With both CPUs busy from the build to the end
/// of the lanes, the guest (then at nice 10, on what the lanes left) ran past them on a slow
/// machine and beside `abuse`, whose two-CPU flood then saw one CPU meter 103 k of 1.3 M
/// frames and failed; on a fast machine it ends before the lanes do and nothing waits.
pub const ALONE_AFTER_PID: &str = "LIMITER_ALONE_AFTER_PID";

/// The longest the [`ALONE`] files wait for that process: a bound for a hung guest (its
/// own run fails then), not a speed check.
pub const ALONE_WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(40 * 60);

/// The process [`ALONE_AFTER_PID`] names, if set; a value that is no process id is an
/// error that names it.
pub fn alone_after() -> anyhow::Result<Option<u32>> {
    match std::env::var(ALONE_AFTER_PID) {
        Err(std::env::VarError::NotPresent) => Ok(None),
        Ok(v) => parse_pid(&v),
        Err(e) => Err(anyhow::anyhow!("{ALONE_AFTER_PID}: {e}")),
    }
}

fn parse_pid(v: &str) -> anyhow::Result<Option<u32>> {
    let v = v.trim();
    if v.is_empty() {
        return Ok(None);
    }
    match v.parse::<u32>() {
        Ok(pid) if pid > 0 => Ok(Some(pid)),
        _ => Err(anyhow::anyhow!(
            "{ALONE_AFTER_PID}={v:?} is not a process id (a positive number, as `$!` gives)"
        )),
    }
}

/// Whether process `pid` still runs: it exists and is not a zombie (an ended child its
/// parent has not reaped yet).
pub fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            // The state follows the command name, which is in parentheses and may hold
            // any byte: after the last ')'.
            let rest = &stat[stat.rfind(')')? + 1..];
            rest.split_whitespace().next().map(|state| state != "Z")
        })
        .unwrap_or(false)
}

/// Waits until `pid` no longer runs, at most `max`, saying what it waits for and how
/// long it waited.
pub fn wait_for_exit(pid: u32, max: std::time::Duration) {
    if !running(pid) {
        return;
    }
    println!(
        "\nxtask: waiting for process {pid} ({ALONE_AFTER_PID}, CI's 6.1 guest) to end \
         before the files that need the CPUs to themselves"
    );
    let started = std::time::Instant::now();
    while running(pid) && started.elapsed() < max {
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    if running(pid) {
        println!(
            "xtask: process {pid} still runs after {} s; going on beside it",
            started.elapsed().as_secs()
        );
    } else {
        println!(
            "xtask: process {pid} ended; waited {} s",
            started.elapsed().as_secs()
        );
    }
}

/// Rows of [`ALONE`] files that need neither CPU to themselves: they run first in the
/// [`PRIORITY`] lane (beside the others, at its nice value), and the rest of their
/// file alone as before. Each is a substring of test names, as libtest's filters take
/// them; the alone run skips the same substrings, so every test runs once whatever its
/// name (a row renamed out of these runs alone, where it always ran; a pattern that
/// matches no test is an error, [`check_light_parts`]).
/// `accuracy`'s 1,000/s rows offer at most 10,000 frames/s from one paced sender, and
/// its malformed rows count frames, not rates: ≈ 28 s of the ≈ 150 s it ran alone, at
/// 0.3 CPUs.
pub const LIGHT_ROWS: &[(&str, &[&str])] = &[("accuracy", &["_packets_1k", "_malformed_"])];

/// One test executable's run: the file, and the filters passed to it (none: every test).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Part<'a> {
    pub file: &'a str,
    pub args: Vec<String>,
    /// One of [`LIGHT_ROWS`]: named rows, which must match some test.
    pub light: bool,
}

impl<'a> Part<'a> {
    fn whole(file: &'a str) -> Part<'a> {
        Part {
            file,
            args: Vec::new(),
            light: false,
        }
    }

    /// `file` and, when it has some, its filters: how the run names it.
    pub fn label(&self) -> String {
        if self.args.is_empty() {
            self.file.to_string()
        } else {
            format!("{} ({})", self.file, self.args.join(" "))
        }
    }
}

/// The files of one run, by lane, each in the order given.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan<'a> {
    /// [`WAITING`].
    pub waiting: Vec<Part<'a>>,
    /// The [`LIGHT_ROWS`] of the [`ALONE`] files, then [`PRIORITY`].
    pub priority: Vec<Part<'a>>,
    /// Every other file (a file not named here lands here), first.
    pub busy: Vec<Part<'a>>,
    /// [`ALONE`], last, in [`ALONE`]'s order, without their [`LIGHT_ROWS`].
    pub alone: Vec<Part<'a>>,
}

pub fn plan<'a>(files: &[&'a str]) -> Plan<'a> {
    let mut plan = Plan::default();
    for &file in files {
        if WAITING.contains(&file) {
            plan.waiting.push(Part::whole(file));
        } else if PRIORITY.contains(&file) {
            plan.priority.push(Part::whole(file));
        } else if !ALONE.contains(&file) {
            plan.busy.push(Part::whole(file));
        }
    }
    let mut light = Vec::new();
    for &file in ALONE {
        if !files.contains(&file) {
            continue;
        }
        match LIGHT_ROWS.iter().find(|(f, _)| *f == file) {
            Some((_, rows)) => {
                light.push(Part {
                    file,
                    args: rows.iter().map(|r| r.to_string()).collect(),
                    light: true,
                });
                plan.alone.push(Part {
                    file,
                    args: rows
                        .iter()
                        .flat_map(|r| ["--skip".to_string(), r.to_string()])
                        .collect(),
                    light: false,
                });
            }
            None => plan.alone.push(Part::whole(file)),
        }
    }
    // The light rows first: `fleet`'s first test (4 tokens a host, admitted against the
    // quota to ±2 %) then starts after the burst of the lanes' and the guest's start
    // (every lane starting daemons and etcd, qemu booting), beside which it read 97.3 %
    // once.
    light.append(&mut plan.priority);
    plan.priority = light;
    plan
}

/// A [`LIGHT_ROWS`] run that ran no test is an error: its patterns name rows that are no
/// longer there (the rows still run, alone: nothing is lost but the time).
pub fn check_light_parts(part: &Part, tests_run: usize) -> anyhow::Result<()> {
    if part.light && tests_run == 0 {
        anyhow::bail!(
            "{}: no test matched; lanes::LIGHT_ROWS names rows {} no longer has",
            part.label(),
            part.file
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_runs_until_it_ends_and_a_zombie_counts_as_ended() {
        assert!(running(std::process::id()));
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep starts");
        assert!(running(child.id()));
        child.kill().expect("kill");
        // Killed, not reaped yet: a zombie, ended.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while running(child.id()) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(
            !running(child.id()),
            "a killed child still counts as running"
        );
        child.wait().expect("reaped");
        assert!(!running(child.id()));
        assert!(!running(u32::MAX));
        let started = std::time::Instant::now();
        wait_for_exit(child.id(), std::time::Duration::from_secs(60));
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
    }

    #[test]
    fn the_process_to_wait_for_is_a_positive_number_or_nothing() {
        assert_eq!(parse_pid("4242").unwrap(), Some(4242));
        assert_eq!(parse_pid(" 7\n").unwrap(), Some(7));
        assert_eq!(parse_pid("").unwrap(), None);
        for bad in ["0", "-1", "guest", "12x"] {
            let e = parse_pid(bad).unwrap_err().to_string();
            assert!(e.contains(ALONE_AFTER_PID) && e.contains(bad), "{e}");
        }
    }

    #[test]
    fn the_wait_is_bounded_for_a_process_that_never_ends() {
        let started = std::time::Instant::now();
        wait_for_exit(std::process::id(), std::time::Duration::from_millis(600));
        let waited = started.elapsed();
        assert!(
            waited >= std::time::Duration::from_millis(600),
            "{waited:?}"
        );
        assert!(waited < std::time::Duration::from_secs(5), "{waited:?}");
    }

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
        fn names<'a>(parts: &[Part<'a>]) -> Vec<&'a str> {
            parts.iter().map(|p| p.file).collect()
        }
        assert_eq!(names(&plan.waiting), ["replicas"]);
        // In ALONE's order, not the files'.
        let at = |f: &&str| ALONE.iter().position(|a| a == f);
        let alone = names(&plan.alone);
        assert!(alone.windows(2).all(|w| at(&w[0]) < at(&w[1])), "{alone:?}");
        let mut sorted = alone.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, ["accuracy", "scrape_load"]);
        assert_eq!(names(&plan.priority), ["accuracy", "fleet"]);
        assert_eq!(names(&plan.busy), ["cli", "fleet_lab", "new_file"]);
        // Every file whole once, but accuracy: its light rows beside the others, the rest
        // alone.
        let mut whole: Vec<&str> = [&plan.waiting, &plan.priority, &plan.busy, &plan.alone]
            .into_iter()
            .flatten()
            .filter(|p| p.args.is_empty())
            .map(|p| p.file)
            .collect();
        whole.sort_unstable();
        let mut expected: Vec<&str> = files.iter().copied().filter(|f| *f != "accuracy").collect();
        expected.sort_unstable();
        assert_eq!(whole, expected);
    }

    /// libtest runs a test when its name contains any filter, and skips it when it
    /// contains any `--skip` one: the light run and the alone run of a file take every
    /// test between them, each once, whatever the names.
    #[test]
    fn the_light_rows_and_the_rest_of_their_file_run_every_test_once() {
        let (file, rows) = LIGHT_ROWS[0];
        let plan = plan(&[file]);
        let light = &plan.priority[0];
        let rest = &plan.alone[0];
        assert!(light.light && !rest.light, "{plan:?}");
        let runs = |args: &[String], test: &str| -> bool {
            let mut filters = Vec::new();
            let mut skips = Vec::new();
            let mut it = args.iter();
            while let Some(a) = it.next() {
                if a == "--skip" {
                    skips.push(it.next().expect("--skip takes a pattern").as_str());
                } else {
                    filters.push(a.as_str());
                }
            }
            (filters.is_empty() || filters.iter().any(|f| test.contains(f)))
                && !skips.iter().any(|s| test.contains(s))
        };
        let names = [
            format!("native{}", rows[0]),
            format!("generic{}frames", rows[rows.len() - 1]),
            "native_packets_100k".to_string(),
            "tc_bytes_100mbit".to_string(),
            "renamed_row".to_string(),
        ];
        for name in &names {
            let (a, b) = (runs(&light.args, name), runs(&rest.args, name));
            assert!(a != b, "{name}: light run {a}, alone run {b}");
        }
        assert!(runs(&light.args, &names[0]) && runs(&light.args, &names[1]));
        let e = check_light_parts(light, 0).unwrap_err().to_string();
        assert!(e.contains("LIGHT_ROWS") && e.contains(file), "{e}");
        assert!(check_light_parts(light, 2).is_ok());
        assert!(check_light_parts(rest, 0).is_ok());
    }

    #[test]
    fn no_file_is_in_two_lists() {
        assert!(WAITING.iter().all(|f| !ALONE.contains(f)));
        assert!(PRIORITY
            .iter()
            .all(|f| !ALONE.contains(f) && !WAITING.contains(f)));
        // Light rows are rows of a file that otherwise runs alone.
        assert!(LIGHT_ROWS
            .iter()
            .all(|(f, rows)| ALONE.contains(f) && !rows.is_empty()));
    }

    /// The nice value set on a lane's thread is what the test executables it starts run
    /// at (a raise, which needs no privilege; the lane's lowering is the same call).
    #[test]
    fn a_lanes_nice_value_reaches_the_processes_it_starts() {
        let nice = std::thread::spawn(|| {
            set_thread_nice(7).expect("raising a thread's nice value");
            let out = std::process::Command::new("nice")
                .output()
                .expect("running nice");
            String::from_utf8_lossy(&out.stdout).trim().to_string()
        })
        .join()
        .expect("the thread");
        assert_eq!(nice, "7");
        // The other threads keep theirs.
        let out = std::process::Command::new("nice").output().expect("nice");
        assert_ne!(String::from_utf8_lossy(&out.stdout).trim(), "7");
    }
}
