//! `xdp_share = "libxdp"` against Debian's xdp-tools (libxdp's own implementation of the
//! multi-program protocol): xdp-filter and the limiter on one interface's XDP hook, each
//! loaded by its own tool, each enforcing, in the order of their run priorities, and each
//! surviving the other's unload, restart or upgrade.
//!
//! libxdp's dispatcher needs freplace links, which this machine's kernel refuses: these
//! tests run in the guests of `cargo xtask test --kernel` (Debian's 6.1 and 6.12). On a
//! kernel that refuses freplace, [`a_kernel_without_freplace_gets_a_clear_error`] checks
//! what the operator is told instead.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

mod common;

use std::{path::Path, process::Command, time::Duration};

use common::{join, Lab};
use limiter_tests::{rx::RxCounter, scenario::udp_to_host, traffic::SendPlan};
use serde_json::Value;

const WEB: &str = "[[rules]]\nname = \"web\"\ndst = \"198.18.0.2/32\"\ndst_port = 9\n\
                   proto = \"udp\"\nrate = 2000\nburst = 200\n";
/// xdp-filter drops UDP to this port.
const FILTERED_PORT: u16 = 7;

fn run(tool: &str, args: &[&str]) -> String {
    let out = Command::new(tool).args(args).output().unwrap_or_else(|e| {
        panic!("{tool} is missing ({e}): `cargo xtask setup` installs xdp-tools")
    });
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{tool} {args:?} failed: {text}");
    text
}

/// libxdp's state directory: removed at the end when the test made it.
struct LibxdpState {
    made: bool,
}

impl LibxdpState {
    fn new() -> LibxdpState {
        LibxdpState {
            made: !Path::new("/sys/fs/bpf/xdp").exists(),
        }
    }
}

impl Drop for LibxdpState {
    fn drop(&mut self) {
        if self.made {
            let _ = std::fs::remove_dir("/sys/fs/bpf/xdp");
        }
    }
}

/// xdp-filter on an interface, unloaded on drop.
struct XdpFilter {
    iface: String,
    loaded: bool,
}

impl XdpFilter {
    fn load(iface: &str) -> XdpFilter {
        run("xdp-filter", &["load", iface, "--mode", "native"]);
        let f = XdpFilter {
            iface: iface.to_string(),
            loaded: true,
        };
        run(
            "xdp-filter",
            &[
                "port",
                &FILTERED_PORT.to_string(),
                "--proto",
                "udp",
                "--mode",
                "dst",
            ],
        );
        f
    }

    fn unload(&mut self) {
        run("xdp-filter", &["unload", &self.iface]);
        self.loaded = false;
    }

    /// (frames xdp-filter saw, frames it dropped): its aggregate per-action statistics.
    fn seen_and_dropped(&self) -> (u64, u64) {
        let status = run("xdp-filter", &["status"]);
        let count = |action: &str| -> u64 {
            status
                .lines()
                .find(|l| l.trim_start().starts_with(action))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("no {action} count in:\n{status}"))
        };
        let (pass, drop) = (count("XDP_PASS"), count("XDP_DROP"));
        (pass + drop, drop)
    }
}

impl Drop for XdpFilter {
    fn drop(&mut self) {
        if self.loaded {
            let _ = Command::new("xdp-filter")
                .args(["unload", &self.iface])
                .output();
        }
    }
}

/// The programs `xdp-loader status` lists for `iface`, in run order (its table lists
/// the dispatcher, then each component with its priority).
fn components(iface: &str) -> Vec<String> {
    let status = run("xdp-loader", &["status", iface]);
    status
        .lines()
        .filter_map(|l| {
            let l = l.trim_start_matches([' ', '=', '>']).trim();
            let name = l
                .split_whitespace()
                .find(|w| w.starts_with("limiter") || w.starts_with("xdpfilt"))?;
            Some(name.to_string())
        })
        .collect()
}

fn plan(rate: u64, duration: Duration, pair: &limiter_tests::netns::VethPair) -> SendPlan {
    SendPlan {
        frames: vec![
            udp_to_host(pair, 9, 64),
            udp_to_host(pair, FILTERED_PORT, 64),
        ],
        rate: Some(rate),
        count: (rate as f64 * duration.as_secs_f64()) as u64,
        duration: duration + Duration::from_secs(2),
        cpu: None,
    }
}

fn counter(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or_else(|| panic!("no {key} in {v}"))
}

#[test]
fn the_limiter_joins_xdp_filter_and_both_enforce() {
    assert!(
        limiter_tests::in_guest(),
        "libxdp's dispatcher needs freplace: run with `cargo xtask test --kernel 6.1 -- sharing`"
    );
    let _state = LibxdpState::new();
    let lab = Lab::with_settings(WEB, "native", "xdp_share = \"libxdp\"");
    let filter = XdpFilter::load(&lab.pair.host);
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

    let status = lab.json(&["status", "--json"]);
    eprintln!("{status:#}");
    let (seen0, dropped0) = filter.seen_and_dropped();
    let sent = join(lab.send_in_background(plan(20_000, Duration::from_secs(2), &lab.pair)));
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
