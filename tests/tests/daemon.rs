//! The daemon as operators live with it: kill -9 and restart, upgrades through the pinned
//! link, reloads (bad then good, by command and by SIGHUP), quota changes under traffic,
//! the root-only control socket, explain, and the metrics endpoint. Real binary, real
//! program on a veth end, real frames.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

mod common;

use std::{
    io::{Read as _, Write as _},
    net::{Ipv4Addr, TcpStream},
    os::unix::{fs::PermissionsExt, process::CommandExt},
    process::Command,
    time::{Duration, Instant},
};

use common::{join, join_timed, Lab, LIMITER};
use limiter_tests::{
    frame::{with_ipv4_src, FrameBuilder},
    rx::RxCounter,
    scenario::{model_admits, udp_to_host, HOST_V4, PEER_V4},
    tools,
    traffic::SendPlan,
};
use limiter_user::bpf::maps::Maps;

fn plan(frames: Vec<Vec<u8>>, rate: u64, duration: Duration) -> SendPlan {
    SendPlan {
        frames,
        rate: Some(rate),
        count: (rate as f64 * duration.as_secs_f64()) as u64,
        duration: duration + Duration::from_secs(2),
        cpu: None,
    }
}

fn within(actual: f64, expected: f64, tolerance: f64) -> bool {
    (actual - expected).abs() <= expected * tolerance
}

#[test]
fn kill_9_mid_traffic_then_restart_never_opens_a_gap() {
    let lab = Lab::new(
        "[[rules]]\nname = \"web\"\ndst = \"198.18.0.2/32\"\nproto = \"udp\"\nrate = 2000\nburst = 200\n",
    );
    let rx = RxCounter::attach(&lab.pair.host).unwrap();
    let daemon = lab.start();
    let sender = lab.send_timed_in_background(plan(
        vec![udp_to_host(&lab.pair, 9, 64)],
        20_000,
        Duration::from_secs(4),
    ));
    std::thread::sleep(Duration::from_secs(1));
    daemon.kill9();
    assert!(
        lab.attached_program().is_some(),
        "enforcement stopped with the daemon"
    );
    std::thread::sleep(Duration::from_secs(1));
    let restarted = lab.start();
    let sent = join_timed(sender);
    std::thread::sleep(Duration::from_millis(200));

    let web = lab.rule_stats("web");
    let passed = web["passed_packets"].as_u64().unwrap();
    let dropped = web["dropped_packets"].as_u64().unwrap();
    // What one bucket admits of the frames as they were sent (a sender descheduled
    // while the new daemon loads offers nothing meanwhile).
    let expected = model_admits(std::slice::from_ref(&sent), 2000, 200, |_| true) as f64;
    let sent = sent.report;
    eprintln!(
        "sent {} in {:.2}s: passed {passed} (expected {expected:.0}), dropped {dropped}",
        sent.sent,
        sent.span.as_secs_f64()
    );
    // One bucket the whole time: across the kill and the restart, rate × time + burst.
    assert!(
        within(passed as f64, expected, 0.01),
        "passed {passed}, expected {expected:.0}"
    );
    // Every frame met the program (the counters are continuous)…
    assert_eq!(passed + dropped, sent.sent);
    // …and nothing got through unmetered.
    assert_eq!(rx.totals().unwrap().packets, passed);
    restarted.stop();
}

/// The TC build (`xdp_mode = "tc"`) through the same life: a kill -9 under traffic leaves
/// it enforcing through its pinned tcx link, a restart adopts that link (program swapped in
/// place), and one bucket holds the rate across both.
#[test]
fn tc_mode_survives_kill_9_and_adopts_its_link() {
    let lab = Lab::with_mode(
        "[[rules]]\nname = \"web\"\ndst = \"198.18.0.2/32\"\nproto = \"udp\"\nrate = 2000\nburst = 200\n",
        "tc",
    );
    let daemon = lab.start();
    let status = lab.json(&["status", "--json"]);
    let iface = &status["interfaces"][0];
    assert_eq!(iface["mode"], "tc", "{status}");
    assert_eq!(iface["program"], "limiter_tc", "{status}");
    let first = iface["program_id"].as_u64().expect("a program id");
    // tcx runs programs in attach order: this counter sees what the limiter passed.
    let rx = RxCounter::attach(&lab.pair.host).unwrap();
    let sender = lab.send_timed_in_background(plan(
        vec![udp_to_host(&lab.pair, 9, 64)],
        20_000,
        Duration::from_secs(4),
    ));
    std::thread::sleep(Duration::from_secs(1));
    daemon.kill9();
    std::thread::sleep(Duration::from_secs(1));
    let restarted = lab.start();
    let status = lab.json(&["status", "--json"]);
    let iface = &status["interfaces"][0];
    assert_eq!(iface["link"], "adopted", "{status}");
    assert_ne!(
        iface["program_id"].as_u64(),
        Some(first),
        "the program was not replaced"
    );
    let sent = join_timed(sender);
    std::thread::sleep(Duration::from_millis(200));

    let web = lab.rule_stats("web");
    let passed = web["passed_packets"].as_u64().unwrap();
    let dropped = web["dropped_packets"].as_u64().unwrap();
    // What one bucket admits of the frames as they were sent (a sender descheduled
    // while the new daemon loads offers nothing meanwhile).
    let expected = model_admits(std::slice::from_ref(&sent), 2000, 200, |_| true) as f64;
    let sent = sent.report;
    eprintln!(
        "tc: sent {} in {:.2}s: passed {passed} (expected {expected:.0}), dropped {dropped}",
        sent.sent,
        sent.span.as_secs_f64()
    );
    assert!(
        within(passed as f64, expected, 0.01),
        "passed {passed}, expected {expected:.0}"
    );
    // Metered throughout (the pinned link outlived the daemon), nothing unmetered.
    assert_eq!(passed + dropped, sent.sent);
    assert_eq!(rx.totals().unwrap().packets, passed);
    restarted.stop();
}

#[test]
fn upgrade_through_the_pinned_link_loses_nothing() {
    let lab = Lab::new(
        "[[rules]]\nname = \"web\"\ndst = \"198.18.0.2/32\"\nrate = 10000000\nburst = 10000000\n",
    );
    let rx = RxCounter::attach(&lab.pair.host).unwrap();
    let old = lab.start();
    let old_program = lab.attached_program().expect("attached");
    let sender = lab.send_in_background(plan(
        vec![udp_to_host(&lab.pair, 9, 64)],
        20_000,
        Duration::from_secs(3),
    ));
    std::thread::sleep(Duration::from_secs(1));
    // SIGTERM leaves the program running through its pinned link; the new daemon loads
    // its own program and swaps it into that link in one bpf_link_update.
    old.stop();
    let new = lab.start();
    let new_program = lab.attached_program().expect("attached");
    let sent = join(sender);
    std::thread::sleep(Duration::from_millis(200));

    assert_ne!(old_program, new_program, "the program was not replaced");
    let status = lab.json(&["status", "--json"]);
    assert_eq!(status["interfaces"][0]["link"], "adopted");
    assert_eq!(status["interfaces"][0]["program_id"], new_program);
    // The old program is gone: no second program, no second link.
    assert!(
        !tools::bpftool_prog_loaded(old_program).unwrap(),
        "program {old_program} is still loaded"
    );
    let links = tools::bpftool_links().unwrap();
    let running = |prog: u32| links.iter().filter(|l| l.prog_id == prog).count();
    assert_eq!(running(new_program), 1, "links running the new program");
    assert_eq!(
        running(old_program),
        0,
        "links still running the old program"
    );

    let web = lab.rule_stats("web");
    let passed = web["passed_packets"].as_u64().unwrap();
    eprintln!(
        "sent {}, passed {passed}, received {}",
        sent.sent,
        rx.totals().unwrap().packets
    );
    assert_eq!(
        passed, sent.sent,
        "frames lost or unmetered during the upgrade"
    );
    assert_eq!(rx.totals().unwrap().packets, sent.sent);
    new.stop();
}

fn agg_tat(lab: &Lab, rule: &str) -> u64 {
    let maps = Maps::from_pins(&lab.pins.path).unwrap();
    let slot = maps.live_slots().unwrap()[rule];
    maps.aggregate_bucket(slot).unwrap().tat
}

#[test]
fn invalid_reload_changes_nothing_valid_reload_keeps_buckets() {
    let keep = "[[rules]]\nname = \"keep\"\ndst = \"198.18.0.2/32\"\nrate = 1\nburst = 3\n";
    let lab = Lab::new(keep);
    let daemon = lab.start();
    let (sent, _) = limiter_tests::scenario::flood(
        &lab.pair,
        plan(
            vec![udp_to_host(&lab.pair, 9, 64)],
            1000,
            Duration::from_millis(5),
        ),
    )
    .unwrap();
    assert!(sent.sent >= 4);
    let tat = agg_tat(&lab, "keep");
    assert_ne!(tat, 0, "the bucket was never used");

    // A rate without a burst: refused, naming file, line and field; nothing changes.
    lab.write_config(&format!(
        "{keep}\n[[rules]]\nname = \"bad\"\ndst = \"198.18.0.3/32\"\nrate = 5\n"
    ));
    let out = lab.limiter(&["reload"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    let line = std::fs::read_to_string(&lab.config)
        .unwrap()
        .lines()
        .position(|l| l.starts_with("rate = 5"))
        .unwrap()
        + 1;
    assert!(
        err.contains(&format!("{}:{line}", lab.config.display())) && err.contains("burst"),
        "{err}"
    );
    assert_eq!(lab.json(&["status", "--json"])["rules"], 1);
    // The same by SIGHUP: the daemon logs the refusal and keeps running as it was.
    daemon.signal(libc::SIGHUP);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(lab.json(&["status", "--json"])["rules"], 1);

    // A valid file: applied; the unchanged rule keeps its bucket.
    lab.write_config(&format!(
        "{keep}\n[[rules]]\nname = \"added\"\ndst = \"198.18.0.3/32\"\nrate = 5\nburst = 5\n"
    ));
    lab.ok(&["reload"]);
    assert_eq!(lab.json(&["status", "--json"])["rules"], 2);
    assert_eq!(
        agg_tat(&lab, "keep"),
        tat,
        "reload reset an unchanged rule's bucket"
    );
    // And by SIGHUP.
    lab.write_config(&format!(
        "{keep}\n[[rules]]\nname = \"added\"\ndst = \"198.18.0.3/32\"\nrate = 5\nburst = 5\n\
         \n[[rules]]\nname = \"third\"\ndst = \"198.18.0.4/32\"\nrate = 5\nburst = 5\n"
    ));
    daemon.signal(libc::SIGHUP);
    let deadline = Instant::now() + Duration::from_secs(5);
    while lab.json(&["status", "--json"])["rules"] != 3 {
        assert!(Instant::now() < deadline, "SIGHUP did not reload");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(agg_tat(&lab, "keep"), tat);
    daemon.stop();
}

/// `reload --dry-run` says what a reload would do and changes nothing; the reload then
/// does it and prints the same list. Adding a per-source rule cuts the sketch anew, so
/// the kept per-source rule's sources start over: both say so (before, `reload` printed
/// only "reloaded: N rules").
#[test]
fn reload_dry_run_lists_the_changes_and_changes_nothing() {
    let keep = |rate: u64| {
        format!(
            "[[rules]]\nname = \"keep\"\ndst = \"198.18.0.2/32\"\nrate = {rate}\nburst = 10\n\
             [rules.per_source]\nrate = 5\nburst = 5\n"
        )
    };
    let gone = "[[rules]]\nname = \"gone\"\ndst = \"198.18.0.5/32\"\nrate = 100\nburst = 10\n";
    let api = "[[rules]]\nname = \"api\"\ndst = \"198.18.0.6/32\"\nrate = 100\nburst = 10\n\
               [rules.per_source]\nrate = 5\nburst = 5\n";
    let lab = Lab::new(&format!("{}\n{gone}", keep(100)));
    let daemon = lab.start();
    let slots_before = Maps::from_pins(&lab.pins.path)
        .unwrap()
        .live_slots()
        .unwrap();
    lab.write_config(&format!("{}\n{api}", keep(200)));

    let dry = lab.json(&["reload", "--dry-run", "--json"]);
    let plan = &dry["plan"];
    assert_eq!(plan["added"], serde_json::json!(["api"]), "{dry}");
    assert_eq!(plan["removed"], serde_json::json!(["gone"]), "{dry}");
    assert_eq!(
        plan["changed"],
        serde_json::json!([{"rule": "keep", "keys": [{"key": "rate", "from": "100", "to": "200"}]}]),
        "{dry}"
    );
    let restarts = plan["restarts"].as_array().unwrap();
    assert!(
        restarts
            .contains(&serde_json::json!({"rule": "api", "state": "aggregate", "why": "new rule"})),
        "{dry}"
    );
    assert!(
        restarts.contains(&serde_json::json!({
            "rule": "keep",
            "state": "per_source",
            "why": "the sketch is cut anew for 2 per-source rules (was 1)"
        })),
        "{dry}"
    );
    // Nothing changed.
    assert_eq!(
        Maps::from_pins(&lab.pins.path)
            .unwrap()
            .live_slots()
            .unwrap(),
        slots_before
    );
    let text = lab.ok(&["reload", "--dry-run"]);
    assert!(
        text.starts_with("would reload: 2 rules (1 added, 1 removed, 1 changed, 0 unchanged)"),
        "{text}"
    );

    // The reload does it and prints the same list.
    let text = lab.ok(&["reload"]);
    assert!(
        text.starts_with("reloaded: 2 rules (1 added, 1 removed, 1 changed, 0 unchanged)"),
        "{text}"
    );
    for line in [
        "  + api\n",
        "  - gone\n",
        "  ~ keep: rate 100 -> 200\n",
        "  keep: per-source buckets start over (each source's burst once): the sketch is cut anew for 2 per-source rules (was 1)\n",
    ] {
        assert!(text.contains(line), "{line:?} not in:\n{text}");
    }
    let live = Maps::from_pins(&lab.pins.path)
        .unwrap()
        .live_slots()
        .unwrap();
    assert!(
        live.contains_key("api") && !live.contains_key("gone"),
        "{live:?}"
    );

    // A file the reload would refuse: the dry run refuses it the same way (exit 3).
    lab.write_config(&format!(
        "{}\n[[rules]]\nname = \"bad\"\ndst = \"198.18.0.7/32\"\nrate = 5\n",
        keep(200)
    ));
    let out = lab.limiter(&["reload", "--dry-run"]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("burst"),
        "{out:?}"
    );
    daemon.stop();
}

/// The kill switch: `limiter bypass on` passes every frame at once, unmetered and
/// uncounted, with or without the daemon; `off` enforces again; a file's bypass = "on"
/// sets it at reload, and a file's "off" never clears an operator's switch, nor does a
/// start. Before, the bit could only be set by hand with bpftool.
#[test]
fn bypass_passes_everything_at_once_with_or_without_the_daemon() {
    let rules = "[[rules]]\nname = \"web\"\ndst = \"198.18.0.2/32\"\nrate = 1\nburst = 1\n";
    let lab = Lab::new(rules);
    let daemon = lab.start();
    let pin_dir = lab.pins.path.to_str().unwrap().to_string();
    // 50 frames in 50 ms: (sent, received by the host, Δ passed, Δ dropped).
    let burst = || {
        let counters = || {
            let maps = Maps::from_pins(&lab.pins.path).unwrap();
            let slot = maps.live_slots().unwrap()["web"];
            let c = maps.rule_counters(slot).unwrap();
            (c.passed_packets, c.dropped_packets)
        };
        let before = counters();
        let (sent, received) = limiter_tests::scenario::flood(
            &lab.pair,
            plan(
                vec![udp_to_host(&lab.pair, 9, 64)],
                1000,
                Duration::from_millis(50),
            ),
        )
        .unwrap();
        let after = counters();
        (
            sent.sent,
            received.matched,
            after.0 - before.0,
            after.1 - before.1,
        )
    };
    let enforced = |(sent, received, passed, dropped): (u64, u64, u64, u64)| {
        assert!(
            sent >= 45 && dropped >= sent - 2 && received == passed,
            "{sent} {received} {passed} {dropped}"
        );
    };
    let bypassed = |(sent, received, passed, dropped): (u64, u64, u64, u64)| {
        assert!(
            sent >= 45 && received == sent && passed == 0 && dropped == 0,
            "{sent} {received} {passed} {dropped}"
        );
    };
    enforced(burst());

    let out = lab.ok(&["bypass", "on"]);
    assert!(out.starts_with("bypass on"), "{out}");
    assert_eq!(lab.json(&["status", "--json"])["bypass"], true);
    bypassed(burst());
    let out = lab.ok(&["bypass", "off"]);
    assert!(out.starts_with("bypass off"), "{out}");
    enforced(burst());

    // The file's switch: "on" sets it at reload; "off" does not clear it.
    lab.write_config(&format!("bypass = \"on\"\n{rules}"));
    lab.ok(&["reload"]);
    assert_eq!(lab.json(&["status", "--json"])["bypass"], true);
    bypassed(burst());
    lab.write_config(rules);
    lab.ok(&["reload"]);
    assert_eq!(
        lab.json(&["status", "--json"])["bypass"],
        true,
        "a reload cleared the switch"
    );
    lab.ok(&["bypass", "off"]);
    enforced(burst());

    // No daemon: the pins are the switch; the program keeps running on its links.
    daemon.stop();
    let out = lab.ok(&["bypass", "on", "--pin-dir", &pin_dir]);
    assert!(out.contains("no daemon answers"), "{out}");
    bypassed(burst());
    let out = lab.ok(&["bypass", "--pin-dir", &pin_dir]);
    assert!(out.starts_with("bypass on"), "{out}");
    // A start keeps it.
    let daemon = lab.start();
    assert_eq!(lab.json(&["status", "--json"])["bypass"], true);
    bypassed(burst());
    lab.ok(&["bypass", "off"]);
    enforced(burst());
    daemon.stop();
}

/// Passed-packet count of `rule`, read straight from the pins.
fn passed(maps: &Maps, slot: u32) -> u64 {
    maps.rule_counters(slot).unwrap().passed_packets
}

#[test]
fn quota_set_under_traffic_takes_effect_within_100_ms() {
    let lab = Lab::new(
        "[[rules]]\nname = \"web\"\ndst = \"198.18.0.2/32\"\nrate = 1000\nburst = 50\n\n\
         [[rules]]\nname = \"other\"\ndst = \"198.18.0.3/32\"\nrate = 1\nburst = 2\n",
    );
    let daemon = lab.start();
    let to_other = FrameBuilder::ipv4(PEER_V4, Ipv4Addr::new(198, 18, 0, 3))
        .macs(lab.pair.peer_mac, lab.pair.host_mac)
        .udp(1, 9)
        .frame_len(64)
        .build();
    limiter_tests::scenario::flood(
        &lab.pair,
        plan(vec![to_other], 1000, Duration::from_millis(4)),
    )
    .unwrap();
    let other_tat = agg_tat(&lab, "other");
    let maps = Maps::from_pins(&lab.pins.path).unwrap();
    let slots = maps.live_slots().unwrap();
    let (web, other) = (slots["web"], slots["other"]);
    let other_before = maps.rule_counters(other).unwrap();

    let sender = lab.send_in_background(plan(
        vec![udp_to_host(&lab.pair, 9, 64)],
        20_000,
        Duration::from_secs(3),
    ));
    std::thread::sleep(Duration::from_millis(1000));
    let (t0, p0) = (Instant::now(), passed(&maps, web));
    std::thread::sleep(Duration::from_millis(500));
    let before_rate = (passed(&maps, web) - p0) as f64 / t0.elapsed().as_secs_f64();
    lab.ok(&["quota", "set", "web", "--rate", "5000"]);
    let set_at = Instant::now();
    std::thread::sleep(Duration::from_millis(100));
    let (t1, p1) = (Instant::now(), passed(&maps, web));
    std::thread::sleep(Duration::from_millis(500));
    let after_rate = (passed(&maps, web) - p1) as f64 / t1.elapsed().as_secs_f64();
    join(sender);
    eprintln!(
        "before {before_rate:.0}/s, from {} ms after the change {after_rate:.0}/s",
        t1.duration_since(set_at).as_millis()
    );
    assert!(
        within(before_rate, 1000.0, 0.05),
        "before: {before_rate:.0}/s"
    );
    assert!(
        within(after_rate, 5000.0, 0.05),
        "100 ms after: {after_rate:.0}/s"
    );
    let quotas = lab.json(&["quota", "list", "--json"]);
    assert_eq!(quotas[0]["rate"], 5000);
    assert_eq!(quotas[0]["source"], "override");
    // The other rule's bucket and counters are untouched.
    assert_eq!(agg_tat(&lab, "other"), other_tat);
    assert_eq!(maps.rule_counters(other).unwrap(), other_before);
    // Bad quotas are refused with the reason.
    let out = lab.limiter(&["quota", "set", "nope", "--rate", "5"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("no rule named \"nope\""));
    let out = lab.limiter(&["quota", "set", "web", "--rate", "0"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("rate must be at least 1"));
    daemon.stop();
}

#[test]
fn control_socket_is_root_only() {
    let lab =
        Lab::new("[[rules]]\nname = \"web\"\ndst = \"198.18.0.2/32\"\nrate = 10\nburst = 10\n");
    let daemon = lab.start();
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&lab.socket), 0o600);
    assert_eq!(mode(lab.socket.parent().unwrap()), 0o700);
    // The binary itself may sit in a directory `nobody` cannot enter: use a copy.
    let copy = lab.dir.path().join("limiter-copy");
    std::fs::copy(LIMITER, &copy).unwrap();
    std::fs::set_permissions(lab.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = Command::new(&copy)
        .args(["status", "--socket"])
        .arg(&lab.socket)
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "an unprivileged user got an answer");
    assert!(err.contains("permission denied"), "{err}");
    daemon.stop();
}

#[test]
fn explain_tells_throttled_from_unthrottled() {
    let lab = Lab::new(
        "[[rules]]\nname = \"ps\"\ndst = \"198.18.0.2/32\"\nproto = \"udp\"\n\
         [rules.per_source]\nrate = 1\nburst = 2\n",
    );
    let daemon = lab.start();
    limiter_tests::scenario::flood(
        &lab.pair,
        plan(
            vec![udp_to_host(&lab.pair, 9, 64)],
            1000,
            Duration::from_millis(5),
        ),
    )
    .unwrap();
    let ps = lab.rule_stats("ps");
    let dropped = ps["dropped_packets"].as_u64().unwrap();
    assert!(dropped > 0);
    let throttled = lab.json(&[
        "explain",
        "--src",
        &PEER_V4.to_string(),
        "--dst",
        &format!("{HOST_V4}:9"),
        "--proto",
        "udp",
        "--json",
    ]);
    assert_eq!(throttled["rule"], "ps");
    assert_eq!(throttled["verdict"], "drop");
    assert_eq!(throttled["per_source"]["conforms"], false);
    assert_eq!(throttled["per_source"]["key"], format!("{PEER_V4}/32"));
    assert_eq!(throttled["dropped_total"], dropped);
    let calm = lab.json(&[
        "explain",
        "--src",
        "198.18.0.77",
        "--dst",
        &format!("{HOST_V4}:9"),
        "--proto",
        "udp",
        "--json",
    ]);
    assert_eq!(calm["verdict"], "pass");
    assert_eq!(calm["per_source"]["available"], 2);
    let text = lab.ok(&[
        "explain",
        "--src",
        &PEER_V4.to_string(),
        "--dst",
        &format!("{HOST_V4}:9"),
        "--proto",
        "udp",
    ]);
    assert!(
        text.contains("EXCEEDED") && text.contains("verdict now: drop"),
        "{text}"
    );
    let none = lab.json(&[
        "explain",
        "--src",
        "198.18.0.77",
        "--dst",
        "198.18.9.9",
        "--json",
    ]);
    assert!(none["rule"].is_null() && none["verdict"] == "pass");
    daemon.stop();
}

/// Parses Prometheus text: (name, labels, value) per sample; checks every sample's family
/// was announced with TYPE.
fn parse_prometheus(text: &str) -> Vec<(String, String, f64)> {
    let mut samples = Vec::new();
    for line in text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let (series, value) = line.rsplit_once(' ').expect("sample has a value");
        let (name, labels) = match series.split_once('{') {
            Some((n, l)) => (n, l.trim_end_matches('}')),
            None => (series, ""),
        };
        assert!(
            text.contains(&format!("# TYPE {name} ")),
            "{name} has no TYPE"
        );
        samples.push((
            name.to_string(),
            labels.to_string(),
            value.parse().expect("numeric value"),
        ));
    }
    samples
}

#[test]
fn metrics_endpoint_is_scraped_and_parsed() {
    let lab = Lab::new(
        "[[rules]]\nname = \"web\"\ndst = \"198.18.0.2/32\"\nrate = 100\nburst = 10\n\
         [rules.per_source]\nrate = 100\nburst = 100\n",
    );
    let daemon = lab.start();
    let template = udp_to_host(&lab.pair, 9, 64);
    let frames: Vec<Vec<u8>> = (1..=3u8)
        .map(|i| {
            let mut f = template.clone();
            with_ipv4_src(&mut f, Ipv4Addr::new(198, 18, 1, i)).unwrap();
            f
        })
        .collect();
    limiter_tests::scenario::flood(&lab.pair, plan(frames, 1000, Duration::from_millis(100)))
        .unwrap();

    // A scraper that connects and sends nothing holds no other up.
    let _idle = TcpStream::connect(("127.0.0.1", lab.metrics_port)).unwrap();
    let ask = |request: &[u8]| {
        let mut stream = TcpStream::connect(("127.0.0.1", lab.metrics_port)).unwrap();
        stream.write_all(request).unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        response
    };
    let started = std::time::Instant::now();
    let response = ask(b"GET /metrics?name[]=limiter_up HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the scrape waited {:?} behind an idle client",
        started.elapsed()
    );
    let head_only = ask(b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(
        head_only.starts_with("HTTP/1.1 200") && head_only.ends_with("\r\n\r\n"),
        "{head_only}"
    );
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("text/plain; version=0.0.4"));
    let samples = parse_prometheus(body);
    let value = |name: &str, labels: &str| {
        samples
            .iter()
            .find(|(n, l, _)| n == name && l == labels)
            .map(|s| s.2)
            .unwrap_or_else(|| panic!("no {name}{{{labels}}}"))
    };
    let web = lab.rule_stats("web");
    assert_eq!(
        value("limiter_rule_passed_packets_total", "rule=\"web\""),
        web["passed_packets"].as_f64().unwrap()
    );
    // One series per reason: their sum is the rule's dropped packets.
    let dropped: f64 = samples
        .iter()
        .filter(|(n, l, _)| {
            n == "limiter_rule_dropped_packets_total" && l.starts_with("rule=\"web\",reason=")
        })
        .map(|s| s.2)
        .sum();
    assert_eq!(dropped, web["dropped_packets"].as_f64().unwrap());
    value(
        "limiter_rule_dropped_packets_total",
        "rule=\"web\",reason=\"aggregate\"",
    );
    assert_eq!(
        value("limiter_rule_rate_packets_per_second", "rule=\"web\""),
        100.0
    );
    assert_eq!(
        value(
            "limiter_rule_share_state",
            "rule=\"web\",state=\"standalone\""
        ),
        1.0
    );
    assert_eq!(value("limiter_source_sketch_width", ""), 1_048_576.0);
    assert!(value("limiter_new_source_packets_total", "") >= 3.0);
    assert!(samples
        .iter()
        .any(|(n, _, _)| n == "limiter_malformed_packets_total"));
    daemon.stop();
}

#[test]
fn pinned_maps_of_another_layout_are_refused() {
    let rules = "[[rules]]\nname = \"web\"\ndst = \"198.18.0.2/32\"\nrate = 10\nburst = 10\n";
    let lab = Lab::new(rules);
    lab.start().stop();
    // Same pins, another per-source capacity: SRC_SKETCH no longer fits this config.
    lab.write_config(&format!("max_sources = 2048\n{rules}"));
    let out = Command::new(LIMITER)
        .args(["run", "--config"])
        .arg(&lab.config)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a mismatched pin was reused");
    assert!(
        err.contains("SRC_SKETCH")
            && err.contains("does not match")
            && err.contains("limiter detach"),
        "{err}"
    );
}

/// The shipped unit against the statuses the real daemon exits with: `limiter detach`
/// and a stop (SIGTERM) must leave it down, a crash (kill -9) must bring it back, and a
/// config it refuses (exit 3) must not be retried every second.
#[test]
fn the_shipped_unit_restarts_a_crash_but_not_a_detach_or_a_bad_config() {
    use limiter_tests::systemd_unit::{Reason, RestartPolicy};

    let unit = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../dist/limiter.service");
    let policy = RestartPolicy::parse(&std::fs::read_to_string(&unit).unwrap()).unwrap();
    let lab =
        Lab::new("[[rules]]\nname = \"web\"\ndst = \"198.18.0.2/32\"\nrate = 100\nburst = 100\n");
    let exit_of = |mut daemon: common::Daemon| {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = daemon.0.try_wait().expect("waiting") {
                return Reason::of(status);
            }
            assert!(Instant::now() < deadline, "the daemon did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    };

    let daemon = lab.start();
    let out = lab.limiter(&["detach"]);
    assert!(out.status.success(), "{out:?}");
    let detached = exit_of(daemon);
    let daemon = lab.start();
    daemon.signal(libc::SIGTERM);
    let stopped = exit_of(daemon);
    let daemon = lab.start();
    daemon.signal(libc::SIGKILL);
    let crashed = exit_of(daemon);
    std::fs::write(&lab.config, "interfaces = []\n").unwrap();
    let refused = Command::new(LIMITER)
        .args(["run", "--config"])
        .arg(&lab.config)
        .status()
        .map(Reason::of)
        .unwrap();
    for (what, how, restart) in [
        ("limiter detach", detached, false),
        ("SIGTERM", stopped, false),
        ("kill -9", crashed, true),
        ("a config with no interface", refused, false),
    ] {
        assert_eq!(
            policy.restarts(how),
            restart,
            "{}: after {what} the daemon ended with {how:?}; under {policy:?} systemd would {}",
            unit.display(),
            if restart {
                "leave it down"
            } else {
                "start it again"
            }
        );
    }
    let _ = lab.limiter(&["detach"]);
}
