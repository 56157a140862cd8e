//! What operators' tools read from the daemon: its logs (no colour unless stderr is a
//! terminal, `--log-format json` one object a line), its metrics (Prometheus naming,
//! checked by `promtool check metrics`) and why each rule refused (the drop reasons in
//! `stats --json` and the metrics, over real frames). Real binary on a veth pair; the allocator's
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

/// Why each rule refused, end to end: a daemon on a veth pair, real frames over three
/// rules' limits, then `stats --json` and a scrape.
///
/// - `per-source` (a per-source limit and an aggregate): one heavy source over its own
///   limit, then sixteen light ones under it whose sum is over the aggregate: its drops
///   are `per_source` and `aggregate`, nothing else;
/// - `aggregate` (an aggregate only): its drops are `aggregate` alone;
/// - `shadow` (the first one's limits in shadow mode, the same traffic): its would-drops
///   carry the same two reasons, and it drops nothing.
///
/// Per rule the reasons add up to the rule's counters; each metric series
/// `limiter_rule_{dropped,would_drop}_packets_total{rule,reason}` is the JSON's figure;
/// no series names a source.
#[test]
fn drop_reasons_add_up_and_the_metrics_say_what_stats_says() {
    use std::net::Ipv4Addr;

    use limiter_tests::{frame::with_ipv4_src, scenario::udp_to_host, traffic::SendPlan};

    let limits = "rate = 500\nburst = 50\n[rules.per_source]\nrate = 200\nburst = 20\n";
    let lab = Lab::new(&format!(
        "[[rules]]\nname = \"per-source\"\ndst = \"198.18.0.2/32\"\ndst_port = 11\n\
         proto = \"udp\"\n{limits}\n\
         [[rules]]\nname = \"aggregate\"\ndst = \"198.18.0.2/32\"\ndst_port = 12\n\
         proto = \"udp\"\nrate = 200\nburst = 20\n\n\
         [[rules]]\nname = \"shadow\"\ndst = \"198.18.0.2/32\"\ndst_port = 13\n\
         proto = \"udp\"\nmode = \"shadow\"\n{limits}"
    ));
    let daemon = lab.start();
    let heavy = Ipv4Addr::new(198, 18, 7, 200);
    let light = |i: u8| Ipv4Addr::new(198, 18, 7, i);
    let from = |src: Ipv4Addr, port: u16| {
        let mut f = udp_to_host(&lab.pair, port, 64);
        with_ipv4_src(&mut f, src).unwrap();
        f
    };
    // First the heavy source alone, 800/s to each port: four times the per-source rate
    // (the aggregates of ports 11 and 13 have room for what the per-source limit lets
    // through), four times port 12's aggregate. Then the light ones, 100/s each to
    // ports 11 and 13: half the per-source rate, 1,600/s together, three times the
    // aggregate. (Together, the aggregate's refusals would give the heavy source's
    // cells back what they charged, and it could stay under its own limit.)
    // `rounds` of `frames` in turn, `each` frames/s of every one.
    let send = |frames: Vec<Vec<u8>>, each: u64, rounds: u64| {
        let cycle = frames.len() as u64;
        let plan = SendPlan {
            frames,
            rate: Some(each * cycle),
            count: rounds * cycle,
            duration: Duration::from_secs(5),
            cpu: None,
        };
        let sent = common::join(lab.send_in_background(plan));
        assert_eq!(sent.sent, rounds * cycle, "every frame of the plan sent");
    };
    let (heavy_rounds, light_rounds) = (800, 100);
    send(
        vec![from(heavy, 11), from(heavy, 12), from(heavy, 13)],
        800,
        heavy_rounds,
    );
    let lights = |port: u16| (1..=16).map(move |i| (light(i), port));
    send(
        lights(11)
            .chain(lights(13))
            .map(|(src, port)| from(src, port))
            .collect(),
        100,
        light_rounds,
    );
    std::thread::sleep(Duration::from_millis(300));

    let stats = lab.json(&["stats", "--json"]);
    let text = metrics(&lab);
    let all = samples(&text);
    let rule = |name: &str| {
        stats["rules"]
            .as_array()
            .and_then(|rules| rules.iter().find(|r| r["name"] == name).cloned())
            .unwrap_or_else(|| panic!("no rule {name} in {stats}"))
    };
    let series = |family: &str, name: &str| -> Vec<(String, f64)> {
        let prefix = format!("rule=\"{name}\",reason=\"");
        all.iter()
            .filter(|(n, _, _)| n == family)
            .filter_map(|(_, labels, v)| {
                let reason = labels.strip_prefix(&prefix)?.strip_suffix('"')?;
                Some((reason.to_string(), *v))
            })
            .collect()
    };
    // The reasons of `name` with packets under `key`, as stats --json says them.
    let reasons = |name: &str, key: &str| -> Vec<(String, u64)> {
        let r = rule(name);
        r["reasons"]
            .as_object()
            .unwrap_or_else(|| panic!("no reasons in {r}"))
            .iter()
            .map(|(reason, c)| (reason.clone(), c[key].as_u64().unwrap()))
            .filter(|(_, n)| *n > 0)
            .collect()
    };
    let check = |name: &str, key: &str, family: &str, want: &[&str]| {
        let r = rule(name);
        let total = r[key].as_u64().unwrap();
        let json = reasons(name, key);
        eprintln!("{name}: {key} {total}, by reason {json:?}");
        let found: Vec<&str> = json.iter().map(|(reason, _)| reason.as_str()).collect();
        assert_eq!(found, want, "{name}'s reasons for {key}: {r}");
        assert_eq!(
            json.iter().map(|(_, n)| n).sum::<u64>(),
            total,
            "{name}'s reasons add up to {key}: {r}"
        );
        let scraped = series(family, name);
        for (reason, n) in &json {
            assert!(
                scraped.contains(&(reason.clone(), *n as f64)),
                "{family}{{rule=\"{name}\",reason=\"{reason}\"}} is not {n}: {scraped:?}"
            );
        }
        // Every other series of the rule is 0 (`aggregate` is always there).
        for (reason, v) in &scraped {
            if !json.iter().any(|(r, _)| r == reason) {
                assert_eq!(*v, 0.0, "{family}{{rule=\"{name}\",reason=\"{reason}\"}}");
            }
        }
    };
    let dropped = "limiter_rule_dropped_packets_total";
    let would = "limiter_rule_would_drop_packets_total";
    check(
        "per-source",
        "dropped_packets",
        dropped,
        &["aggregate", "per_source"],
    );
    check("aggregate", "dropped_packets", dropped, &["aggregate"]);
    check(
        "shadow",
        "would_drop_packets",
        would,
        &["aggregate", "per_source"],
    );
    // The shadow rule drops nothing: every frame sent to it passed, counted once.
    let shadow = rule("shadow");
    assert_eq!(shadow["dropped_packets"], 0, "{shadow}");
    assert_eq!(
        shadow["passed_packets"].as_u64(),
        Some(heavy_rounds + light_rounds * 16),
        "{shadow}"
    );
    check("shadow", "dropped_packets", dropped, &[]);
    // The enforcing rules would-drop nothing.
    check("per-source", "would_drop_packets", would, &[]);
    check("aggregate", "would_drop_packets", would, &[]);

    // No series names a source: no label is an address, none holds one sent here.
    for (name, labels, _) in &all {
        for pair in labels.split("\",").filter(|p| !p.is_empty()) {
            let key = pair.split('=').next().unwrap_or("");
            assert!(
                !["source", "src", "address", "addr", "ip", "client"].contains(&key),
                "{name}{{{labels}}} labels a source"
            );
        }
    }
    for src in std::iter::once(heavy).chain((1..=16).map(light)) {
        assert!(
            !text.contains(&src.to_string()),
            "the scrape names the source {src}:\n{text}"
        );
    }
    daemon.stop();
}
