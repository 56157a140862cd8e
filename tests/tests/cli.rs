//! The `limiter` binary as an operator runs it: `run` on a veth end, `status` with each
//! rule's mode (a canary's share of sources), `stats --json` from the pinned maps,
//! SIGTERM, a restart that keeps the counters, and a bad config.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

use std::{
    path::Path,
    process::{Child, Command, Output},
    time::{Duration, Instant},
};

use limiter_tests::{
    binaries::LIMITER,
    netns::VethPair,
    scenario::{flood, udp_to_host, write_config, PinDir},
    traffic::SendPlan,
};
use serde_json::Value;

struct Daemon(Child);

impl Daemon {
    fn start(config: &Path) -> Daemon {
        let child = Command::new(LIMITER)
            .args(["run", "--config"])
            .arg(config)
            .spawn()
            .expect("starting limiter run");
        Daemon(child)
    }

    /// SIGTERM, then wait (bounded) for a clean exit.
    fn stop(mut self) {
        let pid = self.0.id() as i32;
        // SAFETY: signalling the child we started, by its id.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = self.0.try_wait().unwrap() {
                assert!(status.success(), "limiter exited with {status}");
                return;
            }
            assert!(Instant::now() < deadline, "limiter did not exit on SIGTERM");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn limiter(args: &[&str]) -> Output {
    Command::new(LIMITER)
        .args(args)
        .output()
        .expect("running limiter")
}

fn stats(pins: &Path) -> Value {
    let out = limiter(&["stats", "--json", "--pin-dir", pins.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "stats failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("stats --json prints JSON")
}

/// Waits until the daemon answers on its socket (pins and links may be an earlier
/// daemon's: they outlive it).
fn wait_ready(socket: &Path, iface: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let ready = limiter(&["status", "--socket", socket.to_str().unwrap()])
            .status
            .success()
            && xdp_attached(iface);
        if ready {
            return;
        }
        assert!(Instant::now() < deadline, "daemon not ready after 20 s");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn xdp_attached(iface: &str) -> bool {
    let out = Command::new("ip")
        .args(["-d", "link", "show", "dev", iface])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).contains("prog/xdp")
}

#[test]
fn run_stats_stop_restart() {
    let pair = VethPair::new(1).unwrap();
    let pins = PinDir::new();
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        &format!(
            "interfaces = [\"{}\"]\nxdp_mode = \"native\"\npin_dir = \"{}\"\nmetrics = \"\"\n\
             control_socket = \"{}\"\n\
             \n[[rules]]\nname = \"cli-rule\"\ndst = \"198.18.0.2/32\"\nrate = 1000\nburst = 100\n\
             \n[[rules]]\nname = \"cli-canary\"\ndst = \"198.18.0.3/32\"\nrate = 1000\nburst = 100\n\
             enforce_percent = 2.5\n",
            pair.host,
            pins.path.display(),
            dir.path().join("limiter.sock").display()
        ),
    )
    .unwrap();

    let daemon = Daemon::start(&config);
    wait_ready(&dir.path().join("limiter.sock"), &pair.host);
    status_shows_each_rules_mode(&dir.path().join("limiter.sock"));
    let plan = SendPlan {
        frames: vec![udp_to_host(&pair, 9, 100)],
        rate: Some(20_000),
        count: 20_000,
        duration: Duration::from_secs(2),
        cpu: None,
    };
    let (sent, received) = flood(&pair, plan).unwrap();

    let report = stats(&pins.path);
    let rules = report["rules"].as_array().expect("rules array");
    assert_eq!(rules.len(), 2);
    let rule = rules
        .iter()
        .find(|r| r["name"] == "cli-rule")
        .expect("cli-rule in stats");
    let mut keys: Vec<&str> = rule
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "burst",
            "dropped_bytes",
            "dropped_packets",
            "enforce_percent",
            "mode",
            "name",
            "passed_bytes",
            "passed_packets",
            "rate",
            "reasons",
            "refused_early_bytes",
            "refused_early_packets",
            "sources_aside",
            "sources_false_limit_ppm",
            "sources_saturated",
            "state",
            "would_drop_bytes",
            "would_drop_packets"
        ]
    );
    assert_eq!(rule["name"], "cli-rule");
    assert_eq!(rule["mode"], "enforce");
    assert_eq!(rule["state"], "standalone");
    assert_eq!(rule["rate"], 1000);
    assert_eq!(rule["burst"], 100);
    let passed = rule["passed_packets"].as_u64().unwrap();
    let dropped = rule["dropped_packets"].as_u64().unwrap();
    assert_eq!(
        passed, received.matched,
        "passed counter vs frames received"
    );
    assert!(dropped > 0 && passed + dropped <= sent.sent);
    assert_eq!(rule["passed_bytes"].as_u64().unwrap(), passed * 100);
    for key in ["malformed", "non_ip", "unmatched", "insert_failures"] {
        assert!(report["global"][key].is_u64(), "global.{key} missing");
    }

    daemon.stop();
    assert!(
        xdp_attached(&pair.host),
        "enforcement must outlive the daemon"
    );

    // A restart adopts the pinned maps: the totals continue.
    let daemon = Daemon::start(&config);
    wait_ready(&dir.path().join("limiter.sock"), &pair.host);
    let again = stats(&pins.path);
    let again = again["rules"]
        .as_array()
        .and_then(|rules| rules.iter().find(|r| r["name"] == "cli-rule"))
        .expect("cli-rule in stats after the restart");
    assert_eq!(again["passed_packets"].as_u64().unwrap(), passed);
    assert_eq!(again["dropped_packets"].as_u64().unwrap(), dropped);
    daemon.stop();
}

/// `status` (JSON and text) gives each rule's mode; the canary's says for which share of
/// its sources it drops, as `stats --json` does.
fn status_shows_each_rules_mode(socket: &Path) {
    let socket = socket.to_str().unwrap();
    let out = limiter(&["status", "--json", "--socket", socket]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status: Value = serde_json::from_slice(&out.stdout).expect("status --json prints JSON");
    let share = |name: &str| {
        status["shares"]
            .as_array()
            .and_then(|shares| shares.iter().find(|s| s["rule"] == name).cloned())
            .unwrap_or_else(|| panic!("no {name} in status --json's shares: {status}"))
    };
    let (rule, canary) = (share("cli-rule"), share("cli-canary"));
    assert_eq!(
        (&rule["mode"], &rule["enforce_percent"]),
        (&"enforce".into(), &100.into())
    );
    assert_eq!(canary["mode"], "enforce", "{canary}");
    assert_eq!(canary["enforce_percent"].as_f64(), Some(2.5), "{canary}");
    assert_eq!(canary["state"], "standalone", "{canary}");

    let out = limiter(&["status", "--socket", socket]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("rule {name}: ")))
            .unwrap_or_else(|| panic!("no line for rule {name} in\n{text}"))
    };
    assert!(line("cli-rule").ends_with(", enforce"), "{text}");
    assert!(
        line("cli-canary")
            .contains("canary 2.5 % (enforced for 2.5 % of sources, would-drop for the rest)"),
        "{text}"
    );
}

#[test]
fn bad_config_is_refused_with_file_line_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        "interfaces = [\"lo-never-used\"]\n\n[[rules]]\nname = \"x\"\ndst = \"198.18.0.0/15\"\nrate = 10\n",
    )
    .unwrap();
    let out = limiter(&["run", "--config", config.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("{}:6", config.display())) && err.contains("burst"),
        "error does not name file, line and field: {err}"
    );
}

#[test]
fn stats_without_a_daemon_says_so() {
    let out = limiter(&[
        "stats",
        "--json",
        "--pin-dir",
        "/sys/fs/bpf/limiter-does-not-exist",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no pinned limiter maps"), "{err}");
}
