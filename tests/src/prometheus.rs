//! Prometheus text as an operator's tools read it: `promtool check metrics` (Debian's
//! `prometheus` package; `cargo xtask setup` installs it), and the families a scrape
//! announces.

use std::{
    io::Write as _,
    process::{Command, Stdio},
};

/// What `promtool check metrics` says of `text` (its lint problems; empty when none),
/// and whether it exited 0.
///
/// # Panics
/// When promtool is missing: the test cannot check what it means to, so it fails (never
/// a skip), naming the package to install.
#[allow(
    clippy::expect_used,
    reason = "a test helper: a failure fails the test"
)]
pub fn promtool_check(text: &str) -> (bool, String) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("promtool: {e}; install it: apt-get install prometheus (cargo xtask setup does)")
        });
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(text.as_bytes())
            .expect("writing the scrape to promtool");
    }
    let out = child.wait_with_output().expect("waiting for promtool");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), said.trim().to_string())
}

/// Asserts promtool reports nothing on `text` (`what` names the endpoint in the message).
///
/// # Panics
/// When promtool complains or fails.
pub fn assert_promtool_clean(what: &str, text: &str) {
    let (ok, said) = promtool_check(text);
    assert!(
        ok && said.is_empty(),
        "promtool check metrics on {what}: {said}\n--- the scrape:\n{text}"
    );
}

/// One sample line: (name, labels as written between the braces, value).
pub fn samples(text: &str) -> Vec<(String, String, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (name, labels) = match series.split_once('{') {
                Some((n, rest)) => (n, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            Some((name.to_string(), labels.to_string(), value.parse().ok()?))
        })
        .collect()
}
