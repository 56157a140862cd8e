//! `xdp_share = "libxdp"` against Debian's xdp-tools (libxdp's own implementation of the
//! multi-program protocol): xdp-filter and the limiter on one interface's XDP hook, each
//! loaded by its own tool, each enforcing, in the order of their run priorities, and each
//! surviving the other's unload, restart or upgrade.
//!
//! libxdp's dispatcher needs freplace links, which this machine's kernel refuses: the
//! tests that need it are `#[ignore]`d on the host (listed as such, with the reason) and
//! run in the guests of `cargo xtask test --kernel` (Debian's 6.1 and 6.12), which pass
//! `--include-ignored`. The others run everywhere: what an operator is told where
//! freplace is refused, and when the hook holds a program that is not a dispatcher.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

mod common;

use std::{process::Command, time::Duration};

use common::{join, join_timed, two_ports, Lab};
use limiter_tests::{
    rx::RxCounter,
    scenario::model_admits,
    tools,
    xdp_tools::{libxdp_installs_a_dispatcher, run, LibxdpState, XdpFilter},
};
use serde_json::Value;

const WEB: &str = "[[rules]]\nname = \"web\"\ndst = \"198.18.0.2/32\"\ndst_port = 9\n\
                   proto = \"udp\"\nrate = 2000\nburst = 200\n";
/// xdp-filter drops UDP to this port.
const FILTERED_PORT: u16 = 7;

/// One component as `xdp-loader status` lists it: libxdp's own reading of the dispatcher
/// (its configuration and pins), in run order.
#[derive(Debug)]
struct LoaderRow {
    prio: u32,
    name: String,
    chain_actions: String,
}

fn loader_rows(iface: &str) -> Vec<LoaderRow> {
    let status = run("xdp-loader", &["status", iface]);
    status
        .lines()
        .filter(|l| l.trim_start().starts_with("=>"))
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            assert!(
                w.len() >= 6,
                "unexpected xdp-loader line {l:?} in:\n{status}"
            );
            LoaderRow {
                prio: w[1].parse().unwrap_or_else(|_| panic!("priority in {l:?}")),
                name: w[2].to_string(),
                chain_actions: w[5..].join(" "),
            }
        })
        .collect()
}

/// The component names `xdp-loader status` lists for `iface`, in run order.
fn components(iface: &str) -> Vec<String> {
    loader_rows(iface).into_iter().map(|r| r.name).collect()
}

fn counter(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or_else(|| panic!("no {key} in {v}"))
}

#[test]
#[ignore = "needs freplace links, which this machine's kernel refuses: runs in the guests of `cargo xtask test --kernel`"]
fn the_limiter_joins_xdp_filter_and_both_enforce() {
    assert!(
        limiter_tests::in_guest(),
        "libxdp's dispatcher needs freplace: run with `cargo xtask test --kernel 6.1 -- sharing`"
    );
    let _state = LibxdpState::new();
    let lab = Lab::with_settings(WEB, "native", "xdp_share = \"libxdp\"");
    let filter = XdpFilter::load(&lab.pair.host, FILTERED_PORT);
    let rx = RxCounter::attach(&lab.pair.host).unwrap();
    let daemon = lab.start();
    let order = components(&lab.pair.host);
    eprintln!("{}", run("xdp-loader", &["status", &lab.pair.host]));
    assert_eq!(order.len(), 2, "{order:?}");
    assert!(
        order[0].starts_with("limiter"),
        "the limiter runs first: {order:?}"
    );
    assert!(order[1].starts_with("xdpfilt"), "{order:?}");
    // libxdp reads the run configuration back from the limiter's dispatcher: both at
    // priority 10 (xdp-filter's carried over from the dispatcher libxdp built), both
    // chaining on XDP_PASS.
    let rows = loader_rows(&lab.pair.host);
    for row in &rows {
        assert_eq!(
            (row.prio, row.chain_actions.as_str()),
            (10, "XDP_PASS"),
            "{rows:?}"
        );
    }

    // status and explain show the chain: dispatcher, the limiter, xdp-filter.
    let status = lab.json(&["status", "--json"]);
    let chain = status["interfaces"][0]["chain"]
        .as_array()
        .expect("a chain")
        .clone();
    let names: Vec<&str> = chain.iter().map(|e| e["name"].as_str().unwrap()).collect();
    assert_eq!(names[0], "xdp_dispatcher", "{status:#}");
    assert!(
        names[1].starts_with("limiter") && chain[1]["limiter"] == true,
        "{status:#}"
    );
    assert!(
        names[2].starts_with("xdpfilt") && chain[2]["limiter"] == false,
        "{status:#}"
    );
    let how = chain[1]["how"].as_str().unwrap();
    assert!(
        how.contains("run priority 10")
            && how.contains("on XDP_PASS the frame goes to component 2"),
        "{how}"
    );
    let text = lab.ok(&["status"]);
    assert!(text.contains("<- the limiter"), "{text}");
    let explained = lab.ok(&[
        "explain",
        "--src",
        "198.18.0.1",
        "--dst",
        "198.18.0.2:9",
        "--proto",
        "udp",
    ]);
    assert!(
        explained.contains("xdpfilt") && explained.contains("<- the limiter"),
        "{explained}"
    );
    let (seen0, dropped0) = filter.seen_and_dropped();
    let sent = join(lab.send_in_background(two_ports(
        &lab.pair,
        FILTERED_PORT,
        20_000,
        Duration::from_secs(2),
    )));
    std::thread::sleep(Duration::from_millis(200));
    let (seen, dropped) = filter.seen_and_dropped();
    let (seen, dropped) = (seen - seen0, dropped - dropped0);
    let web = lab.rule_stats("web");
    let passed = counter(&web, "passed_packets");
    let limited = counter(&web, "dropped_packets");
    let filtered = sent.sent / 2;
    eprintln!(
        "sent {}: limiter passed {passed} dropped {limited}; xdp-filter saw {seen} dropped \
         {dropped}; the stack got {}",
        sent.sent,
        rx.totals().unwrap().packets
    );
    // The limiter metered every frame to its port…
    assert_eq!(passed + limited, sent.sent - filtered);
    assert!(limited > 0, "the limiter never limited: {web}");
    // …what it dropped never reached xdp-filter, which dropped every frame to its port…
    assert_eq!(dropped, filtered);
    assert!(
        seen >= passed + filtered && seen <= passed + filtered + 20,
        "xdp-filter saw {seen}"
    );
    // …and the stack got exactly what both passed.
    assert_eq!(rx.totals().unwrap().packets, passed);
    daemon.stop();
}

/// Sends `rate` frames/s for `secs` (half to the limiter's port, half to xdp-filter's)
/// and returns (frames sent to each port).
fn send_both(lab: &Lab, rate: u64, secs: u64) -> u64 {
    let sent = join(lab.send_in_background(two_ports(
        &lab.pair,
        FILTERED_PORT,
        rate,
        Duration::from_secs(secs),
    )));
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(sent.sent % 2, 0, "an even count alternates the two frames");
    sent.sent / 2
}

fn unmatched(lab: &Lab) -> u64 {
    counter(&lab.json(&["stats", "--json"])["global"], "unmatched")
}

/// Each side unloads with its own tool while the other keeps enforcing; the order follows
/// the run priorities, and a restart at another priority moves the limiter.
#[test]
#[ignore = "needs freplace links, which this machine's kernel refuses: runs in the guests of `cargo xtask test --kernel`"]
fn each_side_unloads_without_stopping_the_other() {
    assert!(
        limiter_tests::in_guest(),
        "run with `cargo xtask test --kernel 6.1 -- sharing`"
    );
    let _state = LibxdpState::new();
    let lab = Lab::with_settings(WEB, "native", "xdp_share = \"libxdp\"");
    let first = XdpFilter::load(&lab.pair.host, FILTERED_PORT);
    let daemon = lab.start();
    assert_eq!(components(&lab.pair.host).len(), 2);

    // xdp-filter leaves through xdp-loader (libxdp rebuilds the dispatcher around the
    // limiter's component): the limiter keeps enforcing, frames to the filtered port now
    // reach the stack through it.
    let status = run("xdp-loader", &["status", &lab.pair.host]);
    let filter_id = status
        .lines()
        .find(|l| l.contains("xdpfilt"))
        .and_then(|l| {
            l.split_whitespace()
                .find_map(|w| w.parse::<u32>().ok().filter(|&n| n > 10))
        })
        .unwrap_or_else(|| panic!("no xdpfilt program id in {status}"));
    run(
        "xdp-loader",
        &["unload", &lab.pair.host, "--id", &filter_id.to_string()],
    );
    first.forget();
    assert_eq!(components(&lab.pair.host), ["limiter_libxdp"]);
    let before = lab.rule_stats("web");
    let unmatched0 = unmatched(&lab);
    let each = send_both(&lab, 10_000, 1);
    let web = lab.rule_stats("web");
    let metered = counter(&web, "passed_packets") + counter(&web, "dropped_packets")
        - counter(&before, "passed_packets")
        - counter(&before, "dropped_packets");
    assert_eq!(
        metered, each,
        "the limiter stopped metering when xdp-filter left"
    );
    assert!(counter(&web, "dropped_packets") > counter(&before, "dropped_packets"));
    assert!(unmatched(&lab) - unmatched0 >= each);

    // xdp-filter joins again (libxdp adds it to the limiter's dispatcher); then the
    // limiter restarts at a priority after xdp-filter's 10: now xdp-filter sees frames
    // first, and what it drops never reaches the limiter.
    let _ = Command::new("xdp-filter")
        .args(["unload", &lab.pair.host])
        .output();
    let _ = Command::new("rm")
        .args(["-rf", "/sys/fs/bpf/xdp-filter"])
        .output();
    let mut filter = XdpFilter::load(&lab.pair.host, FILTERED_PORT);
    assert_eq!(components(&lab.pair.host)[0], "limiter_libxdp");
    daemon.stop();
    lab.write_config(WEB);
    let text = std::fs::read_to_string(&lab.config).unwrap();
    std::fs::write(
        &lab.config,
        text.replace(
            "xdp_share = \"libxdp\"",
            "xdp_share = \"libxdp\"\nxdp_priority = 60",
        ),
    )
    .unwrap();
    let daemon = lab.start();
    let order = components(&lab.pair.host);
    assert!(
        order[0].starts_with("xdpfilt") && order[1] == "limiter_libxdp",
        "{order:?}"
    );
    let prios: Vec<u32> = loader_rows(&lab.pair.host).iter().map(|r| r.prio).collect();
    assert_eq!(prios, [10, 60], "the priority libxdp reads back");
    let unmatched0 = unmatched(&lab);
    let (_, dropped0) = filter.seen_and_dropped();
    let each = send_both(&lab, 10_000, 1);
    let (_, dropped) = filter.seen_and_dropped();
    assert_eq!(dropped - dropped0, each);
    assert!(
        unmatched(&lab) - unmatched0 < 20,
        "frames xdp-filter dropped reached the limiter"
    );

    // The limiter leaves (`limiter detach`): xdp-filter keeps enforcing alone.
    drop(daemon);
    lab.ok(&["detach"]);
    assert_eq!(components(&lab.pair.host).len(), 1);
    assert!(components(&lab.pair.host)[0].starts_with("xdpfilt"));
    let (_, dropped0) = filter.seen_and_dropped();
    let each = send_both(&lab, 10_000, 1);
    let (_, dropped) = filter.seen_and_dropped();
    assert_eq!(
        dropped - dropped0,
        each,
        "xdp-filter stopped when the limiter left"
    );
    filter.unload();
}

/// kill -9, restart and upgrade of the limiter under traffic: every frame metered by
/// both programs throughout, one bucket across all of it.
#[test]
#[ignore = "needs freplace links, which this machine's kernel refuses: runs in the guests of `cargo xtask test --kernel`"]
fn kill_9_restart_and_upgrade_keep_both_enforcing() {
    assert!(
        limiter_tests::in_guest(),
        "run with `cargo xtask test --kernel 6.1 -- sharing`"
    );
    let _state = LibxdpState::new();
    let lab = Lab::with_settings(WEB, "native", "xdp_share = \"libxdp\"");
    let filter = XdpFilter::load(&lab.pair.host, FILTERED_PORT);
    let rx = RxCounter::attach(&lab.pair.host).unwrap();
    let daemon = lab.start();
    let first = lab.json(&["status", "--json"])["interfaces"][0]["program_id"]
        .as_u64()
        .unwrap();
    let (_, dropped0) = filter.seen_and_dropped();
    let sender = lab.send_timed_in_background(two_ports(
        &lab.pair,
        FILTERED_PORT,
        8_000,
        Duration::from_secs(5),
    ));
    std::thread::sleep(Duration::from_secs(1));
    daemon.kill9();
    assert_eq!(
        components(&lab.pair.host).len(),
        2,
        "the chain fell apart with the daemon"
    );
    std::thread::sleep(Duration::from_millis(500));
    let restarted = lab.start();
    let status = lab.json(&["status", "--json"]);
    assert_eq!(status["interfaces"][0]["link"], "adopted", "{status:#}");
    let second = status["interfaces"][0]["program_id"].as_u64().unwrap();
    assert_ne!(first, second, "the component was not replaced");
    std::thread::sleep(Duration::from_millis(500));
    // Upgrade: a clean stop and a new daemon with its own program.
    restarted.stop();
    let upgraded = lab.start();
    let third = lab.json(&["status", "--json"])["interfaces"][0]["program_id"]
        .as_u64()
        .unwrap();
    assert_ne!(second, third);
    let sent = join_timed(sender);
    std::thread::sleep(Duration::from_millis(200));
    for old in [first, second] {
        assert!(
            !tools::bpftool_prog_loaded(u32::try_from(old).unwrap()).unwrap(),
            "component {old} is still loaded"
        );
    }
    assert_eq!(components(&lab.pair.host).len(), 2);

    let web = lab.rule_stats("web");
    let passed = counter(&web, "passed_packets");
    let limited = counter(&web, "dropped_packets");
    let (_, dropped) = filter.seen_and_dropped();
    let each = sent.report.sent / 2;
    // What the web rule's bucket admits of its frames (entry 0, port 9) as they were
    // sent, stalls included.
    let expected = model_admits(std::slice::from_ref(&sent), 2000, 200, |entry| entry == 0) as f64;
    let sent = sent.report;
    eprintln!("sent {each} per port in {:.2}s: limiter passed {passed} (expected {expected:.0}) dropped {limited}; xdp-filter dropped {}", sent.span.as_secs_f64(), dropped - dropped0);
    assert_eq!(passed + limited, each, "frames the limiter did not meter");
    assert_eq!(dropped - dropped0, each, "frames xdp-filter did not see");
    assert!(
        (passed as f64 - expected).abs() <= expected * 0.02,
        "passed {passed}, expected {expected:.0}"
    );
    assert_eq!(rx.totals().unwrap().packets, passed);
    upgraded.stop();
}

/// The other way round: the limiter finds the hook empty and installs its own
/// dispatcher; xdp-filter (libxdp) recognises it, joins it, and both enforce.
#[test]
#[ignore = "needs freplace links, which this machine's kernel refuses: runs in the guests of `cargo xtask test --kernel`"]
fn xdp_filter_joins_the_dispatcher_the_limiter_installed() {
    assert!(
        limiter_tests::in_guest(),
        "run with `cargo xtask test --kernel 6.1 -- sharing`"
    );
    let _state = LibxdpState::new();
    let lab = Lab::with_settings(WEB, "native", "xdp_share = \"libxdp\"");
    let daemon = lab.start();
    assert_eq!(components(&lab.pair.host), ["limiter_libxdp"]);
    let ours = lab.attached_program().expect("a dispatcher");
    let filter = XdpFilter::load(&lab.pair.host, FILTERED_PORT);
    let order = components(&lab.pair.host);
    assert!(
        order.len() == 2 && order[0] == "limiter_libxdp" && order[1].starts_with("xdpfilt"),
        "{order:?}"
    );
    assert_ne!(
        lab.attached_program(),
        Some(ours),
        "libxdp did not build a new dispatcher"
    );
    let before = lab.rule_stats("web");
    let (_, dropped0) = filter.seen_and_dropped();
    let each = send_both(&lab, 10_000, 1);
    let web = lab.rule_stats("web");
    let (_, dropped) = filter.seen_and_dropped();
    let metered = counter(&web, "passed_packets") + counter(&web, "dropped_packets")
        - counter(&before, "passed_packets")
        - counter(&before, "dropped_packets");
    assert_eq!(
        metered, each,
        "the limiter stopped metering when xdp-filter joined"
    );
    assert_eq!(dropped - dropped0, each);
    // The limiter's status reads the dispatcher libxdp built.
    let status = lab.json(&["status", "--json"]);
    assert_eq!(
        status["interfaces"][0]["chain"].as_array().map(Vec::len),
        Some(3),
        "{status:#}"
    );
    drop(filter);
    daemon.stop();
}

/// A program that is not a libxdp dispatcher holds the hook (here the test's own, through
/// a bpf_link): with either xdp_share the limiter refuses, names it, says what to do,
/// and leaves it running.
#[test]
fn a_program_that_is_not_a_dispatcher_is_named_and_left_alone() {
    let _state = LibxdpState::new();
    let mut lab = Lab::with_settings(WEB, "native", "xdp_share = \"libxdp\"");
    let mut ebpf = aya::Ebpf::load(limiter_user::host::object::BASELINE_OBJECT).unwrap();
    let prog: &mut aya::programs::Xdp = ebpf
        .program_mut("baseline_pass")
        .unwrap()
        .try_into()
        .unwrap();
    prog.load().unwrap();
    prog.attach(&lab.pair.host, aya::programs::XdpMode::Default)
        .unwrap();
    let before = lab
        .attached_program()
        .expect("the test's program is attached");
    let err = lab.run_must_fail();
    assert!(
        err.contains("baseline_pass") && err.contains("not a libxdp dispatcher"),
        "{err}"
    );
    assert!(err.contains("next_program"), "{err}");
    lab.settings.clear();
    lab.write_config(WEB);
    let err = lab.run_must_fail();
    assert!(
        err.contains("baseline_pass") && err.contains("xdp_share = \"exclusive\" needs it free"),
        "{err}"
    );
    assert_eq!(
        lab.attached_program(),
        Some(before),
        "the program at the hook was touched"
    );
    assert!(
        !std::fs::read_dir("/sys/fs/bpf/xdp")
            .map(|d| d.count() > 0)
            .unwrap_or(false),
        "dispatcher pins left behind"
    );
}

/// Where libxdp falls back to a single program (freplace refused), the limiter says why
/// and what to use instead, and leaves nothing behind; where libxdp installs its
/// dispatcher, so does the limiter.
#[test]
fn where_freplace_is_refused_the_operator_is_told_what_to_do() {
    let _state = LibxdpState::new();
    let freplace = libxdp_installs_a_dispatcher();
    let mut lab = Lab::with_settings(WEB, "native", "xdp_share = \"libxdp\"");
    if freplace {
        // With or without the fallback: a kernel that accepts freplace gets a dispatcher.
        for settings in [
            "xdp_share = \"libxdp\"",
            "xdp_share = \"libxdp\"\nxdp_share_fallback = \"tail-call\"",
        ] {
            lab.settings = settings.to_string();
            lab.write_config(WEB);
            let daemon = lab.start();
            assert_eq!(components(&lab.pair.host), ["limiter_libxdp"], "{settings}");
            assert!(run("xdp-loader", &["status", &lab.pair.host]).contains("xdp_dispatcher"));
            daemon.stop();
            lab.ok(&["detach"]);
        }
    } else {
        let err = lab.run_must_fail();
        eprintln!("{err}");
        assert!(
            err.contains("refuses freplace")
                && err.contains("next_program")
                && err.contains("xdp_share_fallback = \"tail-call\""),
            "{err}"
        );
    }
    assert_eq!(lab.attached_program(), None, "the hook is not empty");
    let left: Vec<_> = std::fs::read_dir("/sys/fs/bpf/xdp")
        .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "left behind: {left:?}");
}
