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
    process::{Command, Stdio},
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
    let (status, time) = outcome.trim_end().rsplit_once(" <")?;
    let secs = time.strip_suffix("s>")?.parse().ok()?;
    Some(Timing {
        file: file.to_string(),
        test: test.to_string(),
        secs,
        passed: status == "ok",
    })
}

/// Runs `exe` (the test target `file`) from `dir` with `args`, one test at a time, echoing
/// its output; returns whether it passed and the timings it printed.
pub fn run(exe: &Path, file: &str, dir: &Path, args: &[String]) -> Result<(bool, Vec<Timing>)> {
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
    cmd.current_dir(dir)
        .env("CARGO_MANIFEST_DIR", dir)
        .env("RUSTC_BOOTSTRAP", "1")
        .arg("--test-threads=1")
        .args(REPORT_TIME)
        .args(args)
        .stdout(Stdio::piped());
    println!("\n     Running {file} ({})", exe.display());
    let mut child = cmd
        .spawn()
        .with_context(|| format!("could not start {}", exe.display()))?;
    let stdout = child.stdout.take().context("no stdout pipe")?;
    let mut timings = Vec::new();
    for line in BufReader::new(stdout).lines() {
        let line = line.with_context(|| format!("reading {file}'s output"))?;
        println!("{line}");
        timings.extend(parse_line(file, &line));
    }
    let status = child
        .wait()
        .with_context(|| format!("waiting for {}", exe.display()))?;
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
