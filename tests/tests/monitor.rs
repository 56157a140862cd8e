//! `limiter monitor` as an operator runs it during a flood: a real daemon enforcing on a
//! veth pair, traffic over the limit, and the monitor reading the program's sampled
//! refusals from the pinned ring buffer: as NDJSON, as text lines and as a pcapng file
//! read back by tshark and tcpdump, with the right rule, reason, addresses and lengths;
//! filters that leave out what they should; a second reader warned; and the same events
//! once the daemon has exited (the program and its pins stay).
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

mod common;

use std::{
    path::Path,
    process::{Command, Output, Stdio},
    time::Duration,
};

use common::{Lab, LIMITER};
use limiter_common::drop::MonitorConfig;
use limiter_tests::{
    scenario::{udp_to_host, HOST_V4, PEER_V4},
    traffic::SendPlan,
};
use limiter_user::bpf::maps::Maps;
use serde_json::Value;

const RATE: u64 = 2_000;
const OFFERED: u64 = 10_000;
const FRAME_LEN: usize = 64;

fn web_lab() -> Lab {
    Lab::new(&format!(
        "[[rules]]\nname = \"web\"\ndst = \"198.18.0.2/32\"\nproto = \"udp\"\nrate = {RATE}\n\
         burst = 200\n"
    ))
}

/// `limiter monitor --pin-dir <lab's> ARGS`, run to its end.
fn monitor(lab: &Lab, args: &[&str]) -> Output {
    Command::new(LIMITER)
        .arg("monitor")
        .arg("--pin-dir")
        .arg(&lab.pins.path)
        .args(args)
        .output()
        .expect("running limiter monitor")
}

fn stdout_ok(out: &Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn tool(name: &str, args: &[&str]) -> String {
    let out = Command::new(name).args(args).output().unwrap_or_else(|e| {
        panic!("{name} is needed to read the capture back (apt-get install {name}): {e}")
    });
    assert!(
        out.status.success(),
        "{name} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Every event is one of the flood's frames refused by the web rule's aggregate limit.
fn assert_flood_event(v: &Value, lab: &Lab) {
    assert_eq!(v["rule"], "web", "{v}");
    assert_eq!(v["reason"], "aggregate", "{v}");
    assert_eq!(v["verdict"], "dropped", "{v}");
    assert_eq!(v["src"], PEER_V4.to_string(), "{v}");
    assert_eq!(v["dst"], HOST_V4.to_string(), "{v}");
    assert_eq!(v["src_port"], 40000, "{v}");
    assert_eq!(v["dst_port"], 9, "{v}");
    assert_eq!(v["proto_name"], "udp", "{v}");
    assert_eq!(v["frame_len"], FRAME_LEN, "{v}");
    assert_eq!(v["interface"], lab.pair.host, "{v}");
    assert_eq!(v["family"], 4, "{v}");
}

/// The number after `after` in a monitor's exit summary.
fn counter(stderr: &str, after: &str) -> u64 {
    let (_, rest) = stderr
        .split_once(after)
        .unwrap_or_else(|| panic!("{after}: {stderr}"));
    rest.split_whitespace().next().unwrap().parse().unwrap()
}

fn json_events(out: &Output, what: &str) -> Vec<Value> {
    stdout_ok(out, what)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{what}: {e}: {l}")))
        .collect()
}

fn check_capture(path: &Path, packets: usize) {
    let file = path.to_str().unwrap();
    let fields = tool(
        "tshark",
        &[
            "-r",
            file,
            "-T",
            "fields",
            "-E",
            "separator=;",
            "-e",
            "ip.src",
            "-e",
            "ip.dst",
            "-e",
            "udp.srcport",
            "-e",
            "udp.dstport",
            "-e",
            "frame.len",
            "-e",
            "frame.cap_len",
            "-e",
            "frame.comment",
        ],
    );
    let lines: Vec<&str> = fields.lines().collect();
    assert_eq!(lines.len(), packets, "{fields}");
    let want = format!(
        "{PEER_V4};{HOST_V4};40000;9;{FRAME_LEN};{FRAME_LEN};limiter verdict=dropped \
         reason=aggregate rule=web"
    );
    for line in lines {
        assert_eq!(line, want);
    }
    let dump = tool("tcpdump", &["-nn", "-r", file]);
    assert_eq!(dump.lines().count(), packets, "{dump}");
    for line in dump.lines() {
        assert!(
            line.contains(&format!("{PEER_V4}.40000 > {HOST_V4}.9: UDP")),
            "{dump}"
        );
    }
}

#[test]
fn monitor_shows_the_real_refusals_as_json_text_and_pcapng_with_and_without_the_daemon() {
    let lab = web_lab();
    let daemon = lab.start();
    Maps::from_pins(&lab.pins.path)
        .unwrap()
        .set_monitor_config(MonitorConfig {
            events_per_sec: 200,
            snap_len: 128,
        })
        .unwrap();
    let duration = Duration::from_secs(60);
    let sender = lab.send_stoppable(SendPlan {
        frames: vec![udp_to_host(&lab.pair, 9, FRAME_LEN)],
        rate: Some(OFFERED),
        count: OFFERED * duration.as_secs(),
        duration,
        cpu: None,
    });

    let out = monitor(&lab, &["--json", "--count", "20", "--duration", "20s"]);
    let events = json_events(&out, "monitor --json");
    assert_eq!(events.len(), 20, "--count 20");
    for e in &events {
        assert_flood_event(e, &lab);
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("20 events shown") && stderr.contains("refusals sampled"),
        "the exit summary with the sampling counters: {stderr}"
    );
    // The counters are the kernel's: at least the events shown were sampled since the
    // start.
    assert!(counter(&stderr, "since start: ") >= 20, "{stderr}");

    let text = stdout_ok(
        &monitor(&lab, &["--count", "3", "--duration", "20s"]),
        "text",
    );
    assert_eq!(text.lines().count(), 3, "{text}");
    for line in text.lines() {
        let want = format!(
            " DROP (aggregate limit) rule web: {PEER_V4}:40000 -> {HOST_V4}:9 udp, \
             {FRAME_LEN} bytes, {} q",
            lab.pair.host
        );
        assert!(line.contains(&want), "{line}\nwanted: {want}");
    }

    let dir = tempfile::tempdir().unwrap();
    let capture = dir.path().join("drops.pcapng");
    let pcap_out = monitor(
        &lab,
        &[
            "--pcap",
            capture.to_str().unwrap(),
            "--count",
            "10",
            "--duration",
            "20s",
        ],
    );
    stdout_ok(&pcap_out, "--pcap");
    check_capture(&capture, 10);

    // Filters: what the flood is not, none; what it is, all.
    for (args, what) in [
        (["--reason", "per_source"], "another reason"),
        (["--source", "198.51.100.0/24"], "another source prefix"),
        (["--rule", "dns"], "another rule"),
    ] {
        let mut all = vec!["--json", "--duration", "2s"];
        all.extend(args);
        let out = monitor(&lab, &all);
        assert_eq!(stdout_ok(&out, what), "", "{what}: nothing shown");
        // Two seconds of a flood five times over the budget (200 a second per CPU): the
        // refusals went on being sampled, filtered out here, and many were not sampled.
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(counter(&stderr, "since start: ") >= 200, "{what}: {stderr}");
        assert!(
            counter(&stderr, "refusals sampled, ") > 1000,
            "{what}: {stderr}"
        );
    }
    let out = monitor(
        &lab,
        &[
            "--json",
            "--count",
            "2",
            "--duration",
            "20s",
            "--source",
            "198.18.0.0/15",
            "--reason",
            "aggregate",
            "--rule",
            "web",
        ],
    );
    assert_eq!(json_events(&out, "matching filters").len(), 2);

    // A second reader at once is told that the two split the events.
    let mut first = Command::new(LIMITER)
        .args(["monitor", "--duration", "10s", "--pin-dir"])
        .arg(&lab.pins.path)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting the first monitor");
    std::thread::sleep(Duration::from_millis(500));
    let second = monitor(&lab, &["--count", "1", "--duration", "5s"]);
    // SAFETY: signalling the child this test started, by its id.
    unsafe { libc::kill(first.id() as i32, libc::SIGTERM) };
    let status = first.wait().expect("waiting for the first monitor");
    assert!(status.success(), "SIGTERM ends a monitor cleanly: {status}");
    let warning = String::from_utf8_lossy(&second.stderr);
    assert!(
        warning.contains("split the events"),
        "the second reader is warned: {warning}"
    );

    // No daemon: the program keeps running on its pinned link, and the monitor reads
    // the pins alone (rule names too).
    daemon.stop();
    let out = monitor(&lab, &["--json", "--count", "5", "--duration", "20s"]);
    let events = json_events(&out, "monitor without the daemon");
    assert_eq!(events.len(), 5);
    for e in &events {
        assert_flood_event(e, &lab);
    }
    let sent = sender.stop();
    eprintln!("sent {} frames", sent.sent);
}

/// A tmux server of the test's own (its socket named after the process), running
/// `command` in a 120x40 terminal; killed on drop.
struct Pane(String);

impl Pane {
    fn start(command: &str) -> Pane {
        let pane = Pane(format!("limiter-monitor-test-{}", std::process::id()));
        let out = pane
            .tmux(&[
                "new-session",
                "-d",
                "-s",
                "m",
                "-x",
                "120",
                "-y",
                "40",
                command,
            ])
            .unwrap_or_else(|e| {
                panic!("tmux is needed to run `limiter top --sources` (apt-get install tmux): {e}")
            });
        assert!(
            out.status.success(),
            "tmux: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        pane
    }

    fn tmux(&self, args: &[&str]) -> std::io::Result<Output> {
        Command::new("tmux")
            .args(["-L", &self.0, "-f", "/dev/null"])
            .args(args)
            .output()
    }

    fn screen(&self) -> String {
        let out = self.tmux(&["capture-pane", "-p", "-t", "m"]).unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Pane {
    /// Quits the command with `q`, as an operator does, and kills it if it has not gone
    /// within 2 s, so that a failing test leaks nothing (`top.rs` checks that a terminal
    /// hanging up ends it too).
    fn drop(&mut self) {
        let pid = self
            .tmux(&["list-panes", "-t", "m", "-F", "#{pane_pid}"])
            .ok()
            .and_then(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .trim()
                    .parse::<i32>()
                    .ok()
            });
        let _ = self.tmux(&["send-keys", "-t", "m", "q"]);
        if let Some(pid) = pid {
            let deadline = std::time::Instant::now() + Duration::from_secs(2);
            // SAFETY: signal 0 only checks that the process exists.
            while unsafe { libc::kill(pid, 0) } == 0 && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            // SAFETY: the pane's own process, started by this test.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        let _ = self.tmux(&["kill-server"]);
    }
}

/// `top --sources` in a terminal over a flood from one source: that source and its /24
/// hold every sample, and the screen states the sampling error and its caveats.
#[test]
fn top_sources_ranks_the_flooding_source_with_its_error() {
    let lab = web_lab();
    let _daemon = lab.start();
    Maps::from_pins(&lab.pins.path)
        .unwrap()
        .set_monitor_config(MonitorConfig {
            events_per_sec: 200,
            snap_len: 128,
        })
        .unwrap();
    let duration = Duration::from_secs(30);
    let sender = lab.send_stoppable(SendPlan {
        frames: vec![udp_to_host(&lab.pair, 9, FRAME_LEN)],
        rate: Some(OFFERED),
        count: OFFERED * duration.as_secs(),
        duration,
        cpu: None,
    });
    let pane = Pane::start(&format!(
        "{} top --sources --window 5 --interval 0.5 --pin-dir {}; sleep 60",
        LIMITER.path().display(),
        lab.pins.path.display()
    ));
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let screen = loop {
        let screen = pane.screen();
        let row = |key: &str| {
            screen
                .lines()
                .find(|l| l.starts_with(&format!("{key} ")))
                .map(|l| l.split_whitespace().map(str::to_string).collect::<Vec<_>>())
        };
        if let (Some(source), Some(prefix)) = (row(&PEER_V4.to_string()), row("198.18.0.0/24")) {
            let samples: u64 = source[1].parse().unwrap();
            if samples >= 50 {
                assert_eq!(source[2], "100.0%", "one source: every sample\n{screen}");
                assert_eq!(source[3], "0.0%", "p = 1 has no error\n{screen}");
                assert_eq!(
                    prefix[1], source[1],
                    "its /24 holds the same samples\n{screen}"
                );
                break screen;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no ranking of {PEER_V4} after 15 s:\n{screen}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    eprintln!("{screen}");
    assert!(screen.contains("sqrt(p(1-p)/n)"), "{screen}");
    assert!(screen.contains("not passed traffic"), "{screen}");
    sender.stop();
}

#[test]
fn an_unknown_reason_is_refused_naming_the_valid_ones() {
    let out = Command::new(LIMITER)
        .args(["monitor", "--reason", "per-source"])
        .output()
        .expect("running limiter monitor");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    for label in ["aggregate", "per_source", "share_spent", "deep_vlan"] {
        assert!(stderr.contains(label), "{label} missing from: {stderr}");
    }
}
