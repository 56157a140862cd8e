//! The kernel test executables, run one at a time with each test's wall time, and the
//! table of the slowest at the end: where the suite's time goes, visible on every run.
//!
//! libtest prints a test's time only under `-Z unstable-options --report-time`, which a
//! stable-built test executable accepts when `RUSTC_BOOTSTRAP` is set in its own
//! environment. It is set for the executables only: in cargo's environment it would
//! change what rustc accepts, and cargo would rebuild everything.

use std::{
    io::{BufRead as _, BufReader},
    path::Path,
    process::Command,
};

use anyhow::{Context as _, Result};

/// The arguments that make libtest print each test's time.
pub const REPORT_TIME: [&str; 2] = ["-Zunstable-options", "--report-time"];

/// One test's wall time.
#[derive(Clone, Debug, PartialEq)]
pub struct Timing {
    pub file: String,
    pub test: String,
    pub secs: f64,
    pub passed: bool,
}

/// A test's result line with its time (`test NAME ... ok <1.234s>`), or `None`.
pub fn parse_line(file: &str, line: &str) -> Option<Timing> {
    let rest = line.strip_prefix("test ")?;
    let (test, outcome) = rest.split_once(" ... ")?;
    parse_outcome(file, test, outcome)
}

/// The name of a test whose result is not on its line (`test NAME ... ` and then the
/// logs its daemons wrote on the same pipe): the result comes on a later line.
pub fn pending_test(line: &str) -> Option<&str> {
    let rest = line.strip_prefix("test ")?;
    let (test, outcome) = rest.split_once(" ... ")?;
    (!outcome.trim_end().ends_with("s>")).then_some(test)
}

/// `ok <1.234s>` (or `FAILED <…>`) for `test`, when the result is on a line of its own.
pub fn parse_outcome(file: &str, test: &str, outcome: &str) -> Option<Timing> {
    let (status, time) = outcome.trim_end().rsplit_once(" <")?;
    let secs = time.strip_suffix("s>")?.parse().ok()?;
    Some(Timing {
        file: file.to_string(),
        test: test.to_string(),
        secs,
        passed: status == "ok",
    })
}

/// How a test executable's output is shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// Line by line as it comes.
    Live,
    /// Whole, when the executable ends: executables running side by side do not
    /// interleave their lines.
    Whole,
}

/// Runs `exe` (the test target `file`) from `dir` with `args`, one test at a time, its
/// stdout and stderr (the daemons' logs) in one stream shown as `output` says; returns
/// whether it passed and the timings it printed.
pub fn run(
    exe: &Path,
    file: &str,
    dir: &Path,
    args: &[String],
    output: Output,
) -> Result<(bool, Vec<Timing>)> {
    let mut cmd = Command::new(exe);
    // As cargo runs a test: from its package's directory, with that package's manifest
    // directory, not xtask's.
    for (key, _) in std::env::vars_os() {
        if key.to_str().is_some_and(|k| {
            k.starts_with("CARGO_PKG_")
                || k.starts_with("CARGO_MANIFEST_")
                || k == "CARGO_CRATE_NAME"
        }) {
            cmd.env_remove(key);
        }
    }
    let (reader, writer) = std::io::pipe().context("creating a pipe for the test's output")?;
    cmd.current_dir(dir)
        .env("CARGO_MANIFEST_DIR", dir)
        .env("RUSTC_BOOTSTRAP", "1")
        .arg("--test-threads=1")
        .args(REPORT_TIME)
        .args(args)
        .stdout(writer.try_clone().context("duplicating the pipe")?)
        .stderr(writer);
    let header = format!("\n     Running {file} ({})", exe.display());
    let mut whole = String::new();
    match output {
        Output::Live => println!("{header}"),
        Output::Whole => whole.push_str(&format!("{header}\n")),
    }
    let mut child = cmd
        .spawn()
        .with_context(|| format!("could not start {}", exe.display()))?;
    // The parent's copies of the write end go with `cmd`.
    drop(cmd);
    // Lines through a thread: a process the tests left running with the pipe open (a
    // leak a test should not have) must not hold the run forever once the executable
    // has exited.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(reader).lines() {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut timings = Vec::new();
    let mut pending: Option<String> = None;
    let mut exited = None;
    let mut quiet_since = None;
    loop {
        match rx.recv_timeout(std::time::Duration::from_millis(100)) {
            Ok(line) => {
                let line = line.with_context(|| format!("reading {file}'s output"))?;
                match output {
                    Output::Live => println!("{line}"),
                    Output::Whole => {
                        whole.push_str(&line);
                        whole.push('\n');
                    }
                }
                match parse_line(file, &line) {
                    Some(t) => timings.push(t),
                    None => {
                        if let Some(test) = pending_test(&line) {
                            pending = Some(test.to_string());
                        } else if let Some(test) = &pending {
                            // The result after the logs: the line's end, e.g. `ok <0.5s>`.
                            let tail = line.rsplit(' ').take(2).collect::<Vec<_>>();
                            if let [time, status] = tail[..] {
                                if let Some(t) =
                                    parse_outcome(file, test, &format!("{status} {time}"))
                                {
                                    timings.push(t);
                                    pending = None;
                                }
                            }
                        }
                    }
                }
                quiet_since = None;
                continue;
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
        }
        if exited.is_none() {
            exited = child
                .try_wait()
                .with_context(|| format!("waiting for {}", exe.display()))?;
        }
        if exited.is_some() {
            let since = *quiet_since.get_or_insert_with(std::time::Instant::now);
            if since.elapsed() > std::time::Duration::from_secs(2) {
                let note = format!(
                    "xtask: {file} exited but a process it started still holds its output open \
                     (a leak): no longer read"
                );
                match output {
                    Output::Live => println!("{note}"),
                    Output::Whole => whole.push_str(&format!("{note}\n")),
                }
                break;
            }
        }
    }
    let status = match exited {
        Some(status) => status,
        None => child
            .wait()
            .with_context(|| format!("waiting for {}", exe.display()))?,
    };
    if output == Output::Whole {
        print!("{whole}");
    }
    Ok((status.success(), timings))
}

/// The slowest `n` tests and each file's total, as printed at the end of a run.
pub fn table(timings: &[Timing], n: usize) -> String {
    let mut by_time: Vec<&Timing> = timings.iter().collect();
    by_time.sort_by(|a, b| b.secs.total_cmp(&a.secs));
    let total: f64 = timings.iter().map(|t| t.secs).sum();
    let mut out = format!(
        "time per test: the slowest {} of {} ({total:.0} s in all)\n",
        n.min(by_time.len()),
        timings.len()
    );
    for t in by_time.iter().take(n) {
        out.push_str(&format!(
            "  {:>7.1} s  {}::{}{}\n",
            t.secs,
            t.file,
            t.test,
            if t.passed { "" } else { "  FAILED" }
        ));
    }
    let mut files: Vec<(String, f64)> = Vec::new();
    for t in timings {
        match files.iter_mut().find(|(f, _)| *f == t.file) {
            Some((_, s)) => *s += t.secs,
            None => files.push((t.file.clone(), t.secs)),
        }
    }
    files.sort_by(|a, b| b.1.total_cmp(&a.1));
    out.push_str("time per file:\n");
    for (file, secs) in files {
        out.push_str(&format!("  {secs:>7.1} s  {file}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_result_lines_libtest_prints_with_report_time() {
        let t = parse_line("fleet", "test a::quota_holds ... ok <12.345s>").unwrap();
        assert_eq!(
            (t.test.as_str(), t.secs, t.passed),
            ("a::quota_holds", 12.345, true)
        );
        let t = parse_line("fleet", "test b ... FAILED <0.500s>").unwrap();
        assert!(!t.passed);
        assert_eq!(parse_line("fleet", "test b ... ok"), None);
        assert_eq!(parse_line("fleet", "test b ... ignored, needs ipip"), None);
        assert_eq!(parse_line("fleet", "running 3 tests"), None);
        // A result after its daemons' log lines, on the same pipe.
        assert_eq!(
            pending_test("test c ... 2026-12-04T22:49:58Z INFO started"),
            Some("c")
        );
        assert_eq!(pending_test("test c ... ok <1.000s>"), None);
        let t = parse_outcome("fleet", "c", "FAILED <7.142s>").unwrap();
        assert!(!t.passed && t.secs == 7.142);
    }

    /// stdout and stderr in one stream, and a process left holding it (a leak) does not
    /// hold the run once the executable has exited.
    #[test]
    fn output_is_read_whole_and_a_leaked_process_does_not_hold_the_run() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = std::env::temp_dir().join(format!("xtask-timed-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let exe = dir.join("fake-test");
        let pid_file = dir.join("leaked.pid");
        std::fs::write(
            &exe,
            format!(
                "#!/bin/sh\necho 'test a ... ok <1.500s>'\necho 'a daemon log line' >&2\n\
                 sleep 30 &\necho $! > {}\nexit 0\n",
                pid_file.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        let start = std::time::Instant::now();
        let (passed, timings) = run(&exe, "fake", &dir, &[], Output::Whole).unwrap();
        let took = start.elapsed();
        if let Ok(pid) = std::fs::read_to_string(&pid_file) {
            let _ = Command::new("kill").arg(pid.trim()).status();
        }
        let _ = std::fs::remove_dir_all(&dir);
        assert!(passed);
        assert_eq!(timings.len(), 1);
        assert_eq!(timings[0].secs, 1.5);
        assert!(
            took < std::time::Duration::from_secs(10),
            "held {took:?} by the leaked process"
        );
    }

    #[test]
    fn the_table_puts_the_slowest_first_and_sums_each_file() {
        let t = |file: &str, test: &str, secs| Timing {
            file: file.into(),
            test: test.into(),
            secs,
            passed: true,
        };
        let table = table(&[t("a", "x", 1.0), t("b", "y", 5.0), t("a", "z", 2.0)], 2);
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[1].ends_with("b::y"), "{table}");
        assert!(lines[2].ends_with("a::z"), "{table}");
        assert_eq!(lines.len(), 6, "{table}");
        assert!(lines[4].contains("5.0 s  b"), "{table}");
        assert!(lines[5].contains("3.0 s  a"), "{table}");
    }
}
