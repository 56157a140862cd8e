//! The tail-call handoff with the real daemon: a stand-in load balancer (limiter-ebpf
//! `standin_lb.rs`: it counts what it sees and answers XDP_TX, a verdict of its own) runs
//! after the limiter on a veth end, with real frames from the peer. What the limiter passes
//! reaches the LB, what it drops does not; an LB program replaced gets the frames, one
//! removed makes frames pass to the stack (fail open), counted, and `limiter status` says
//! so. Then Katran's shared mode: the LB's root program calls the limiter from its array.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

mod common;

use std::time::Duration;

use aya::programs::XdpMode;
use common::{join, Lab};
use limiter_tests::{
    handoff::{StandinLb, LB, LB_V2, ROOT},
    rx::RxCounter,
    scenario::{udp_to_host, PinDir},
    traffic::SendPlan,
};
use serde_json::Value;

const RULE: &str = "[[rules]]\nname = \"web\"\ndst = \"198.18.0.2/32\"\nproto = \"udp\"\nrate = 500\nburst = 100\n";

/// A pin directory for the LB's objects (made on bpffs; removed on drop).
fn lb_pins() -> PinDir {
    let dir = PinDir::new();
    limiter_user::attach::program::prepare_pin_dir(&dir.path).unwrap();
    dir
}

/// 2000 frames in 0.5 s at the host: over the rule's 500/s + 100, so some are dropped.
fn burst(lab: &Lab) {
    let plan = SendPlan {
        frames: vec![udp_to_host(&lab.pair, 9, 64)],
        rate: Some(4000),
        count: 2000,
        duration: Duration::from_secs(3),
        cpu: None,
    };
    let sent = join(lab.send_in_background(plan));
    assert_eq!(sent.sent, 2000);
    std::thread::sleep(Duration::from_millis(200));
}

/// (passes of every kind, drops, handoff_missing) from `limiter stats --json`.
fn counters(lab: &Lab) -> (u64, u64, u64) {
    let s = lab.json(&["stats", "--json"]);
    let g = &s["global"];
    let web = s["rules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "web")
        .unwrap();
    let n = |v: &Value| v.as_u64().unwrap();
    let passes =
        n(&web["passed_packets"]) + n(&g["unmatched"]) + n(&g["non_ip"]) + n(&g["malformed"]);
    (passes, n(&web["dropped_packets"]), n(&g["handoff_missing"]))
}

fn iface_handoff(lab: &Lab) -> Value {
    let status = lab.json(&["status", "--json"]);
    status["interfaces"][0]["handoff"].clone()
}

/// Waits (bounded) until the daemon's once-a-second look at the pin shows `want`.
fn wait_for_program(lab: &Lab, want: Option<u32>) -> Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let h = iface_handoff(lab);
        if h["program_id"].as_u64().map(|v| v as u32) == want {
            return h;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "status still shows {h} (wanted program {want:?})"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn next_program_pin_gets_what_the_limiter_passes_and_follows_the_pin() {
    let mut lb = StandinLb::load().unwrap();
    let pins = lb_pins();
    let pin = pins.path.join("lb_prog");
    lb.pin_program(LB, &pin).unwrap();
    let lab = Lab::new(&format!("next_program = \"{}\"\n\n{RULE}", pin.display()));
    // TC ingress runs after XDP: it counts what reached the stack.
    let rx = RxCounter::attach(&lab.pair.host).unwrap();
    let daemon = lab.start();

    let h = iface_handoff(&lab);
    assert_eq!(
        h["program_id"].as_u64(),
        Some(u64::from(lb.id(LB).unwrap())),
        "{h}"
    );
    assert_eq!(h["program_name"], LB, "{h}");
    assert!(h["missing"].is_null(), "{h}");
    let explain = [
        "explain",
        "--src",
        "198.18.0.1",
        "--dst",
        "198.18.0.2:9",
        "--proto",
        "udp",
    ];
    let text = lab.ok(&explain);
    assert!(
        text.contains(&format!(
            "then: {}: tail call through {} slot 0 to program {} (standin_lb)",
            lab.pair.host,
            lab.pins.path.join("HANDOFF_LINEAR").display(),
            lb.id(LB).unwrap()
        )),
        "{text}"
    );

    burst(&lab);
    let (passes, drops, missing) = counters(&lab);
    eprintln!(
        "LB: limiter passed {passes}, dropped {drops}; LB saw {}",
        lb.seen(LB).unwrap()
    );
    assert!(drops > 0 && passes >= 100, "passes {passes}, drops {drops}");
    assert_eq!(
        lb.seen(LB).unwrap(),
        passes,
        "the LB saw exactly what the limiter passed"
    );
    assert_eq!(missing, 0);
    assert_eq!(rx.totals().unwrap().packets, 0, "a frame bypassed the LB");

    // The LB upgrades: a new program at the same pin gets the frames from then on.
    std::fs::remove_file(&pin).unwrap();
    lb.pin_program(LB_V2, &pin).unwrap();
    wait_for_program(&lab, Some(lb.id(LB_V2).unwrap()));
    let seen_v1 = lb.seen(LB).unwrap();
    let (p0, _, _) = counters(&lab);
    burst(&lab);
    let (p1, _, missing) = counters(&lab);
    assert_eq!(
        lb.seen(LB_V2).unwrap(),
        p1 - p0,
        "the replacement saw every pass"
    );
    assert_eq!(
        lb.seen(LB).unwrap(),
        seen_v1,
        "the replaced program saw nothing more"
    );
    assert_eq!(missing, 0);

    // The LB goes away: frames pass to the stack (fail open), counted, and status says so.
    std::fs::remove_file(&pin).unwrap();
    let h = wait_for_program(&lab, None);
    assert!(
        h["missing"]
            .as_str()
            .unwrap()
            .contains("no program pinned at"),
        "{h}"
    );
    burst(&lab);
    let (p2, _, missing) = counters(&lab);
    assert_eq!(
        missing,
        p2 - p1,
        "every pass without a next program is counted"
    );
    assert_eq!(
        rx.totals().unwrap().packets,
        p2 - p1,
        "they reached the stack"
    );
    assert_eq!(
        iface_handoff(&lab)["missing_frames"].as_u64(),
        Some(missing)
    );
    let text = lab.ok(&["status"]);
    assert!(text.contains("MISSING: no program pinned at"), "{text}");
    let text = lab.ok(&explain);
    assert!(
        text.contains("the stack: the next program is MISSING"),
        "{text}"
    );
    let metrics = common::metrics(&lab);
    assert!(
        metrics.contains(&format!(
            "limiter_handoff_missing_packets_total {missing}\n"
        )),
        "{metrics}"
    );
    daemon.stop();
}

#[test]
fn next_program_slot_uses_the_lbs_array_so_a_replacement_applies_at_once() {
    let mut lb = StandinLb::load().unwrap();
    let pins = lb_pins();
    let array = pins.path.join("root_array");
    lb.pin_root_array(&array).unwrap();
    let (lb_fd, v2_fd) = (
        lb.fd(LB).unwrap().try_clone().unwrap(),
        lb.fd(LB_V2).unwrap().try_clone().unwrap(),
    );
    lb.root_array().unwrap().set(1, &lb_fd, 0).unwrap();
    let lab = Lab::new(&format!(
        "next_program = \"{}:1\"\n\n{RULE}",
        array.display()
    ));
    let rx = RxCounter::attach(&lab.pair.host).unwrap();
    let daemon = lab.start();
    let h = iface_handoff(&lab);
    assert_eq!(h["how"], "LB array slot", "{h}");
    assert_eq!(
        h["program_id"].as_u64(),
        Some(u64::from(lb.id(LB).unwrap())),
        "{h}"
    );

    burst(&lab);
    let (p0, drops, _) = counters(&lab);
    assert!(drops > 0);
    assert_eq!(lb.seen(LB).unwrap(), p0);

    // The LB replaces its program in the slot: no daemon involved, the next frame goes
    // there.
    lb.root_array().unwrap().set(1, &v2_fd, 0).unwrap();
    burst(&lab);
    let (p1, _, _) = counters(&lab);
    assert_eq!(lb.seen(LB_V2).unwrap(), p1 - p0);
    assert_eq!(lb.seen(LB).unwrap(), p0);

    // The LB empties the slot: fail open at once, counted.
    lb.root_array().unwrap().clear_index(&1).unwrap();
    burst(&lab);
    let (p2, _, missing) = counters(&lab);
    assert_eq!(missing, p2 - p1);
    assert_eq!(rx.totals().unwrap().packets, p2 - p1);
    let h = iface_handoff(&lab);
    assert!(h["program_id"].is_null(), "{h}");
    assert!(
        h["missing"].as_str().unwrap().contains("slot 1 empty"),
        "{h}"
    );
    daemon.stop();
    // The LB's array is the LB's: the limiter never removed or replaced its pin.
    assert!(array.exists());
}

/// A pin that is not a prog array is refused before anything is loaded, by name.
#[test]
fn next_program_slot_on_something_else_is_refused_and_changes_nothing() {
    let mut lb = StandinLb::load().unwrap();
    let pins = lb_pins();
    let prog = pins.path.join("lb_prog");
    lb.pin_program(LB, &prog).unwrap();
    let lab = Lab::new(&format!(
        "next_program = \"{}:0\"\n\n{RULE}",
        prog.display()
    ));
    let out = std::process::Command::new(common::LIMITER)
        .args(["run", "--config"])
        .arg(&lab.config)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("next_program") && stderr.contains("not a pinned BPF map"),
        "{stderr}"
    );
    assert!(lab.attached_program().is_none(), "something was attached");
    let missing = pins.path.join("nothing_here");
    lab.write_config(&format!(
        "next_program = \"{}:0\"\n\n{RULE}",
        missing.display()
    ));
    let out = std::process::Command::new(common::LIMITER)
        .args(["run", "--config"])
        .arg(&lab.config)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("is the LB running?"), "{stderr}");
    assert!(
        !missing.exists(),
        "the loader created a map at the LB's path"
    );
}

/// Katran's shared mode: the root program on the interface calls slot 0 (the limiter,
/// written there by the daemon), the limiter calls on to slot 1 (the LB). The slot
/// outlives the daemon; `limiter detach` empties it, and the root then reaches the LB
/// directly.
#[test]
fn join_program_array_root_calls_the_limiter_which_calls_the_lb() {
    let mut lb = StandinLb::load().unwrap();
    let pins = lb_pins();
    let array = pins.path.join("root_array");
    lb.pin_root_array(&array).unwrap();
    let lb_fd = lb.fd(LB).unwrap().try_clone().unwrap();
    lb.root_array().unwrap().set(1, &lb_fd, 0).unwrap();
    let lab = Lab::new(RULE);
    // No interfaces: the root program is on the hook.
    let text = format!(
        "xdp_mode = \"native\"\npin_dir = \"{}\"\ncontrol_socket = \"{}\"\nmetrics = \"\"\n\
         join_program_array = \"{}:0\"\n\n{RULE}",
        lab.pins.path.display(),
        lab.socket.display(),
        array.display()
    );
    std::fs::write(&lab.config, text).unwrap();
    let root = lb.program_mut(ROOT).unwrap();
    let _root_link = root.attach(&lab.pair.host, XdpMode::Driver).unwrap();
    let daemon = lab.start();

    let status = lab.json(&["status", "--json"]);
    let joined = &status["joined"];
    assert_eq!(joined["how"], "joined LB root array", "{status}");
    assert_eq!(joined["first_slot"], 1, "{status}");
    assert_eq!(
        joined["program_id"].as_u64(),
        Some(u64::from(lb.id(LB).unwrap())),
        "{status}"
    );
    assert!(status["interfaces"].as_array().unwrap().is_empty());
    let in_slot = limiter_tests::handoff::slot(&array, 0).unwrap();
    assert!(in_slot.is_some(), "the daemon did not write slot 0");

    burst(&lab);
    let (p0, d0, _) = counters(&lab);
    assert!(d0 > 0);
    assert_eq!(
        lb.seen(LB).unwrap(),
        p0,
        "the LB saw what the limiter passed"
    );
    assert_eq!(lb.seen(ROOT).unwrap(), 0, "the root fell through");
    assert_eq!(status["joined"]["slot_holds_limiter"], true, "{status}");

    // Another tool writes the slot (Katran's xdpdump does, in slot 0): the daemon sees
    // it within a second and says so; `limiter reload` writes the limiter back. Before,
    // nothing noticed.
    lb.root_array().unwrap().set(0, &lb_fd, 0).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    let lost = loop {
        let status = lab.json(&["status", "--json"]);
        if status["joined"]["slot_holds_limiter"] == false {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the overwritten slot is not reported: {status}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let warning = lost["joined"]["warning"].as_str().unwrap_or_default();
    assert!(
        warning.contains("slot 0 of") && warning.contains("not the limiter"),
        "{lost}"
    );
    let (p1, d1, _) = counters(&lab);
    burst(&lab);
    let (p2, d2, _) = counters(&lab);
    assert_eq!(
        p2 + d2,
        p1 + d1,
        "frames met the limiter past an overwritten slot"
    );
    lab.ok(&["reload"]);
    assert_eq!(limiter_tests::handoff::slot(&array, 0).unwrap(), in_slot);
    let status = lab.json(&["status", "--json"]);
    assert_eq!(status["joined"]["slot_holds_limiter"], true, "{status}");
    assert!(status["joined"]["warning"].is_null(), "{status}");

    // The daemon exits: the slot stays and the limiter keeps enforcing.
    daemon.stop();
    assert_eq!(limiter_tests::handoff::slot(&array, 0).unwrap(), in_slot);
    burst(&lab);
    let s = lab.json(&["stats", "--json"]);
    let web = s["rules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "web")
        .unwrap()
        .clone();
    assert!(
        web["dropped_packets"].as_u64().unwrap() > d0,
        "no enforcement after exit"
    );

    // limiter detach (no daemon): the slot goes with the pins; the root calls the LB.
    let out = lab.ok(&["detach"]);
    assert!(out.contains("removed the limiter from slot 0"), "{out}");
    assert_eq!(limiter_tests::handoff::slot(&array, 0).unwrap(), None);
    let before = lb.seen(LB).unwrap();
    burst(&lab);
    assert_eq!(
        lb.seen(LB).unwrap() - before,
        2000,
        "every frame reached the LB"
    );
}

/// `limiter reload` moves the handoff from one pinned program to another under traffic:
/// every frame the limiter passes goes to one of them (none to the stack, none counted
/// missing). A change to another array waits for a restart, and reload says so.
#[test]
fn reload_switches_next_program_under_traffic_and_names_what_needs_a_restart() {
    let mut lb = StandinLb::load().unwrap();
    let pins = lb_pins();
    let (pin_a, pin_b) = (pins.path.join("lb_a"), pins.path.join("lb_b"));
    lb.pin_program(LB, &pin_a).unwrap();
    lb.pin_program(LB_V2, &pin_b).unwrap();
    let lab = Lab::new(&format!("next_program = \"{}\"\n\n{RULE}", pin_a.display()));
    let rx = RxCounter::attach(&lab.pair.host).unwrap();
    let daemon = lab.start();
    let sender = lab.send_in_background(SendPlan {
        frames: vec![udp_to_host(&lab.pair, 9, 64)],
        rate: Some(4000),
        count: 6000,
        duration: Duration::from_secs(5),
        cpu: None,
    });
    std::thread::sleep(Duration::from_millis(500));
    lab.write_config(&format!("next_program = \"{}\"\n\n{RULE}", pin_b.display()));
    let out = lab.ok(&["reload"]);
    assert!(!out.contains("next start"), "{out}");
    let h = iface_handoff(&lab);
    assert_eq!(
        h["program_id"].as_u64(),
        Some(u64::from(lb.id(LB_V2).unwrap())),
        "{h}"
    );
    let sent = join(sender);
    assert_eq!(sent.sent, 6000);
    std::thread::sleep(Duration::from_millis(200));
    let (passes, drops, missing) = counters(&lab);
    let (a, b) = (lb.seen(LB).unwrap(), lb.seen(LB_V2).unwrap());
    eprintln!("passes {passes} drops {drops}: LB {a}, LB_V2 {b}");
    assert!(a > 0 && b > 0, "one side saw nothing: {a} / {b}");
    assert_eq!(a + b, passes, "a pass went elsewhere during the switch");
    assert_eq!(missing, 0);
    assert_eq!(rx.totals().unwrap().packets, 0);

    // Another array: the program was loaded with its own; reload says what waits.
    lb.pin_root_array(&pins.path.join("root_array")).unwrap();
    lab.write_config(&format!(
        "next_program = \"{}:0\"\n\n{RULE}",
        pins.path.join("root_array").display()
    ));
    let out = lab.ok(&["reload"]);
    assert!(
        out.contains("takes effect at the next start: next_program"),
        "{out}"
    );
    let h = iface_handoff(&lab);
    assert_eq!(
        h["program_id"].as_u64(),
        Some(u64::from(lb.id(LB_V2).unwrap())),
        "{h}"
    );
    daemon.stop();
}

/// kill -9 and a restart of the limiter under traffic, with `next_program = "PIN"`: the
/// pinned link and the pinned handoff arrays keep both programs working throughout.
/// Every frame is metered once (passed + dropped = sent) and every pass reaches the LB;
/// none goes to the stack, none is counted missing.
#[test]
fn kill_9_and_restart_under_traffic_keep_every_pass_going_to_the_lb() {
    let mut lb = StandinLb::load().unwrap();
    let pins = lb_pins();
    let pin = pins.path.join("lb_prog");
    lb.pin_program(LB, &pin).unwrap();
    let rule = "[[rules]]\nname = \"web\"\ndst = \"198.18.0.2/32\"\nproto = \"udp\"\nrate = 2000\nburst = 200\n";
    let lab = Lab::new(&format!("next_program = \"{}\"\n\n{rule}", pin.display()));
    let rx = RxCounter::attach(&lab.pair.host).unwrap();
    let daemon = lab.start();
    let sender = lab.send_in_background(SendPlan {
        frames: vec![udp_to_host(&lab.pair, 9, 64)],
        rate: Some(20_000),
        count: 80_000,
        duration: Duration::from_secs(6),
        cpu: None,
    });
    std::thread::sleep(Duration::from_secs(1));
    daemon.kill9();
    std::thread::sleep(Duration::from_secs(1));
    let restarted = lab.start();
    let sent = join(sender);
    std::thread::sleep(Duration::from_millis(200));
    let web = lab.rule_stats("web");
    let passed = web["passed_packets"].as_u64().unwrap();
    let dropped = web["dropped_packets"].as_u64().unwrap();
    let (passes, _, missing) = counters(&lab);
    eprintln!(
        "sent {}: passed {passed}, dropped {dropped}; LB saw {}",
        sent.sent,
        lb.seen(LB).unwrap()
    );
    assert_eq!(passed + dropped, sent.sent, "a frame went unmetered");
    assert_eq!(lb.seen(LB).unwrap(), passes, "a pass did not reach the LB");
    assert_eq!(missing, 0);
    assert_eq!(rx.totals().unwrap().packets, 0, "a frame bypassed the LB");
    restarted.stop();
}

/// Generic mode normally runs the multi-buffer build, which the kernel does not let
/// tail-call plain XDP programs; with the LB's array the daemon runs the single-buffer
/// build there instead, so the handoff works in generic mode too.
#[test]
fn generic_mode_runs_the_build_that_can_hand_over_to_plain_xdp() {
    let mut lb = StandinLb::load().unwrap();
    let pins = lb_pins();
    let array = pins.path.join("root_array");
    lb.pin_root_array(&array).unwrap();
    let lb_fd = lb.fd(LB).unwrap().try_clone().unwrap();
    lb.root_array().unwrap().set(1, &lb_fd, 0).unwrap();
    let lab = Lab::with_mode(
        &format!("next_program = \"{}:1\"\n\n{RULE}", array.display()),
        "generic",
    );
    let daemon = lab.start();
    let status = lab.json(&["status", "--json"]);
    let iface = &status["interfaces"][0];
    assert_eq!(iface["mode"], "generic", "{status}");
    assert_eq!(iface["program"], "limiter_linear", "{status}");
    assert_eq!(
        iface["handoff"]["program_id"].as_u64(),
        Some(u64::from(lb.id(LB).unwrap())),
        "{status}"
    );
    burst(&lab);
    let (passes, drops, missing) = counters(&lab);
    assert!(drops > 0);
    assert_eq!(lb.seen(LB).unwrap(), passes);
    assert_eq!(missing, 0);
    daemon.stop();
}

/// `next_program` naming the limiter itself (its own program pinned there) would meter
/// every frame again and again: refused, frames pass to the stack metered once, and
/// status says why.
#[test]
fn next_program_naming_the_limiter_itself_is_refused() {
    let pins = lb_pins();
    let pin = pins.path.join("lb_prog");
    let lab = Lab::new(&format!("next_program = \"{}\"\n\n{RULE}", pin.display()));
    let rx = RxCounter::attach(&lab.pair.host).unwrap();
    let daemon = lab.start();
    let own = lab.json(&["status", "--json"])["interfaces"][0]["program_id"]
        .as_u64()
        .unwrap();
    let out = std::process::Command::new("bpftool")
        .args(["prog", "pin", "id", &own.to_string()])
        .arg(&pin)
        .output()
        .expect("bpftool (cargo xtask setup installs it)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let h = loop {
        let h = iface_handoff(&lab);
        if h["missing"]
            .as_str()
            .is_some_and(|m| m.contains("is the limiter itself"))
        {
            break h;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "status still shows {h}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(h["program_id"].is_null(), "{h}");
    burst(&lab);
    let web = lab.rule_stats("web");
    let (passed, dropped) = (
        web["passed_packets"].as_u64().unwrap(),
        web["dropped_packets"].as_u64().unwrap(),
    );
    assert_eq!(passed + dropped, 2000, "a frame was metered more than once");
    let (passes, _, missing) = counters(&lab);
    assert_eq!(missing, passes);
    assert_eq!(rx.totals().unwrap().packets, passes);
    daemon.stop();
}

/// An LB restart that re-creates its array at the pin: the program still holds the old
/// array (frames keep going where they went), and status and the log say to restart the
/// limiter.
#[test]
fn an_lb_that_recreates_its_array_is_noticed() {
    let mut lb = StandinLb::load().unwrap();
    let pins = lb_pins();
    let array = pins.path.join("root_array");
    lb.pin_root_array(&array).unwrap();
    let lb_fd = lb.fd(LB).unwrap().try_clone().unwrap();
    lb.root_array().unwrap().set(1, &lb_fd, 0).unwrap();
    let lab = Lab::new(&format!(
        "next_program = \"{}:1\"\n\n{RULE}",
        array.display()
    ));
    let daemon = lab.start();
    assert!(iface_handoff(&lab)["warning"].is_null());
    // The LB restarts: a new array pinned at the same path.
    std::fs::remove_file(&array).unwrap();
    let mut restarted_lb = StandinLb::load().unwrap();
    restarted_lb.pin_root_array(&array).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let h = loop {
        let h = iface_handoff(&lab);
        if !h["warning"].is_null() {
            break h;
        }
        assert!(std::time::Instant::now() < deadline, "no warning in {h}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        h["warning"]
            .as_str()
            .unwrap()
            .contains("restart the limiter"),
        "{h}"
    );
    let text = lab.ok(&["status"]);
    assert!(
        text.contains("WARNING: the LB re-created its array"),
        "{text}"
    );
    daemon.stop();
}
