//! What operators' tools read from the daemon: its logs (no colour unless stderr is a
//! terminal, `--log-format json` one object a line) and its metrics (Prometheus naming,
//! checked by `promtool check metrics`). Real binary on a veth pair; the allocator's
//! endpoint, and the daemon's in fleet mode, are checked in fleet.rs.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

mod common;

use std::{
    fs::File,
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant, SystemTime},
};

use common::{metrics, Lab, LIMITER};
use limiter_tests::prometheus::{assert_promtool_clean, samples};

const ESC: u8 = 0x1b;

fn web_lab() -> Lab {
    Lab::new("[[rules]]\nname = \"web\"\ndst = \"198.18.0.2/32\"\nrate = 100\nburst = 10\n")
}

/// SIGTERM to `pid` (a process this test started), then waits for `child` (bounded).
fn stop(child: &mut Child, pid: i32) {
    // SAFETY: signalling a process this test started, by its id.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    while child.try_wait().unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "the daemon did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs the lab's daemon with `extra` arguments, stderr to `log`, until it serves; then
/// stops it.
fn run_logging_to(lab: &Lab, extra: &[&str], log: &Path) {
    let mut child = Command::new(LIMITER)
        .args(extra)
        .args(["run", "--config"])
        .arg(&lab.config)
        .env_remove("NO_COLOR")
        .env("RUST_LOG", "info")
        .stderr(Stdio::from(File::create(log).unwrap()))
        .spawn()
        .expect("starting limiter run");
    let pid = child.id() as i32;
    lab.wait_ready();
    stop(&mut child, pid);
}

#[test]
fn text_logs_are_coloured_on_a_terminal_only() {
    let lab = web_lab();
    // stderr a file (as under journald): no escape code at all.
    let log = lab.dir.path().join("pipe.log");
    run_logging_to(&lab, &[], &log);
    let text = std::fs::read(&log).unwrap();
    assert!(
        String::from_utf8_lossy(&text).contains("INFO"),
        "no log line: {}",
        String::from_utf8_lossy(&text)
    );
    assert!(
        !text.contains(&ESC),
        "escape codes on a pipe: {:?}",
        String::from_utf8_lossy(&text)
    );

    // The same daemon on a terminal (script(1) gives it a pty): coloured.
    let out = lab.dir.path().join("pty.log");
    let command = format!(
        "env -u NO_COLOR RUST_LOG=info {} run --config {}",
        LIMITER.path().display(),
        lab.config.display()
    );
    let mut script = Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .stdin(Stdio::null())
        .stdout(Stdio::from(File::create(&out).unwrap()))
        .spawn()
        .expect("script (util-linux)");
    lab.wait_ready();
    // The daemon is script's child (through env, which execs it).
    let children =
        std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", script.id())).unwrap();
    let daemon: i32 = children
        .split_whitespace()
        .next()
        .expect("script has no child")
        .parse()
        .unwrap();
    stop(&mut script, daemon);
    let text = std::fs::read(&out).unwrap();
    assert!(
        text.windows(2).any(|w| w == [ESC, b'[']),
        "no colour on a terminal: {:?}",
        String::from_utf8_lossy(&text)
    );
}

#[test]
fn json_logs_are_one_object_a_line() {
    let lab = web_lab();
    let log = lab.dir.path().join("json.log");
    run_logging_to(&lab, &["--log-format", "json"], &log);
    // And a failure, said the same way (the option is global: after the subcommand too).
    let failed = Command::new(LIMITER)
        .args(["run", "--log-format", "json", "--config"])
        .arg(lab.dir.path().join("absent.toml"))
        .output()
        .unwrap();
    assert!(!failed.status.success());
    let mut text = std::fs::read_to_string(&log).unwrap();
    text.push_str(&String::from_utf8_lossy(&failed.stderr));
    let mut levels = Vec::new();
    for line in text.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}"));
        for key in ["timestamp", "level", "target"] {
            assert!(v[key].is_string(), "no {key} in {line}");
        }
        assert!(v["fields"]["message"].is_string(), "no message in {line}");
        levels.push(v["level"].as_str().unwrap().to_string());
    }
    assert!(levels.iter().any(|l| l == "INFO"), "{text}");
    assert_eq!(levels.last().map(String::as_str), Some("ERROR"), "{text}");
    assert!(text.contains("cannot read config"), "{text}");
    assert!(!text.as_bytes().contains(&ESC));
}

#[test]
fn metrics_follow_prometheus_conventions_and_promtool_finds_nothing() {
    let lab = Lab::new(
        "[[rules]]\nname = \"web\"\ndst = \"198.18.0.2/32\"\nrate = 100\nburst = 10\n\
         [[rules]]\nname = \"bulk\"\ndst = \"198.18.0.3/32\"\nunit = \"bytes\"\nrate = 1000000\nburst = 100000\n\
         [[rules]]\nname = \"syn\"\ndst = \"198.18.0.4/32\"\nunit = \"syn\"\nrate = 50\nburst = 5\n",
    );
    let before = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let daemon = lab.start();
    let text = metrics(&lab);
    assert_promtool_clean("the daemon (standalone)", &text);
    let all = samples(&text);
    let value = |name: &str, labels: &str| {
        all.iter()
            .find(|(n, l, _)| n == name && l == labels)
            .map(|s| s.2)
            .unwrap_or_else(|| panic!("no {name}{{{labels}}} in\n{text}"))
    };
    // One series a unit: no label says what the number counts.
    assert!(!text.contains("unit=\""), "{text}");
    assert_eq!(
        value("limiter_rule_rate_packets_per_second", "rule=\"web\""),
        100.0
    );
    assert_eq!(value("limiter_rule_burst_packets", "rule=\"web\""), 10.0);
    assert_eq!(
        value("limiter_rule_rate_bytes_per_second", "rule=\"bulk\""),
        1e6
    );
    assert_eq!(value("limiter_rule_burst_bytes", "rule=\"bulk\""), 1e5);
    assert_eq!(
        value("limiter_rule_rate_syn_packets_per_second", "rule=\"syn\""),
        50.0
    );
    assert!(all
        .iter()
        .all(|(n, l, _)| !n.starts_with("limiter_rule_rate_bytes") || l == "rule=\"bulk\""));
    // The build, as `--version` says it.
    let version = Command::new(LIMITER).arg("--version").output().unwrap();
    let version = String::from_utf8_lossy(&version.stdout);
    let version = version.trim().rsplit(' ').next().unwrap();
    assert_eq!(
        value("limiter_build_info", &format!("version=\"{version}\"")),
        1.0
    );
    let started = value("process_start_time_seconds", "");
    let after = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(
        started >= before - 1.0 && started <= after,
        "started {started}, test window {before}..{after}"
    );
    // Every family is announced with HELP and TYPE, counters end in _total.
    for (name, _, _) in &all {
        assert!(
            text.contains(&format!("# HELP {name} ")),
            "no HELP for {name}"
        );
        let counter = text.contains(&format!("# TYPE {name} counter"));
        assert_eq!(counter, name.ends_with("_total"), "{name}");
    }
    daemon.stop();
}
