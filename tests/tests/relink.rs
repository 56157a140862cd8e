//! An interface deleted and created again under its name (a driver reset, `ip link
//! del` / `add`) is limited again without a restart: the real daemon on a veth pair,
//! the limited end deleted and made again (also with an MTU the linear build cannot
//! take).
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

mod common;

use std::time::{Duration, Instant};

use common::{join, metrics, Lab};
use limiter_tests::{
    netns::{in_netns, ip, VethPair},
    scenario::udp_to_host,
    traffic::SendPlan,
};
use limiter_user::bpf::maps::Maps;

fn mac(m: [u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Makes the pair again, same names and addresses, the host end with `mtu`.
fn create_again(pair: &VethPair, mtu: u32) {
    let mtu = mtu.to_string();
    ip(&[
        "link",
        "add",
        &pair.host,
        "mtu",
        &mtu,
        "address",
        &mac(pair.host_mac),
        "type",
        "veth",
        "peer",
        "name",
        &pair.peer,
        "mtu",
        &mtu,
        "address",
        &mac(pair.peer_mac),
        "netns",
        &pair.ns,
    ])
    .unwrap();
    std::fs::write(
        format!("/proc/sys/net/ipv6/conf/{}/disable_ipv6", pair.host),
        "1",
    )
    .unwrap();
    let peer = pair.peer.clone();
    in_netns(&pair.ns, move || {
        std::fs::write(format!("/proc/sys/net/ipv6/conf/{peer}/disable_ipv6"), "1")
    })
    .unwrap()
    .unwrap();
    ip(&["link", "set", &pair.host, "up"]).unwrap();
    ip(&["-n", &pair.ns, "link", "set", &pair.peer, "up"]).unwrap();
}

/// (passed, dropped) of `web`.
fn web(lab: &Lab) -> (u64, u64) {
    let maps = Maps::from_pins(&lab.pins.path).unwrap();
    let c = maps
        .rule_counters(maps.live_slots().unwrap()["web"])
        .unwrap();
    (c.passed_packets, c.dropped_packets)
}

/// Sends 400 frames at 2000/s to `web` (100/s, burst 10); returns how many it dropped.
fn dropped_of_a_flood(lab: &Lab) -> u64 {
    let before = web(lab);
    join(lab.send_in_background(SendPlan {
        frames: vec![udp_to_host(&lab.pair, 9, 64)],
        rate: Some(2000),
        count: 400,
        duration: Duration::from_secs(3),
        cpu: None,
    }));
    std::thread::sleep(Duration::from_millis(200));
    web(lab).1 - before.1
}

/// The value of the sample `series` (name and labels) in the daemon's metrics.
fn sample(lab: &Lab, series: &str) -> Option<f64> {
    metrics(lab).lines().find_map(|l| {
        l.strip_prefix(series)
            .and_then(|v| v.trim().parse::<f64>().ok())
    })
}

fn wait_for(what: &str, within: Duration, mut ok: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !ok() {
        assert!(start.elapsed() < within, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    start.elapsed()
}

#[test]
fn an_interface_created_again_is_limited_again() {
    let lab =
        Lab::new("[[rules]]\nname = \"web\"\ndst = \"198.18.0.2/32\"\nrate = 100\nburst = 10\n");
    let daemon = lab.start();
    let attached = format!(
        "limiter_interface_attached{{interface=\"{}\",hook=\"xdp\"}}",
        lab.pair.host
    );
    let reattaches = format!(
        "limiter_interface_reattaches_total{{interface=\"{}\"}}",
        lab.pair.host
    );
    let iface = |lab: &Lab| lab.json(&["status", "--json"])["interfaces"][0].clone();
    assert_eq!(sample(&lab, &attached), Some(1.0));
    assert!(dropped_of_a_flood(&lab) > 300, "not limited at start");

    // Deleted: the metric and status say so.
    ip(&["link", "del", &lab.pair.host]).unwrap();
    wait_for(
        "attached 0 after the delete",
        Duration::from_secs(3),
        || sample(&lab, &attached) == Some(0.0),
    );
    assert_eq!(iface(&lab)["attached"], false, "{}", iface(&lab));

    // Created again: attached within a bounded time, counted, limited.
    create_again(&lab.pair, 1500);
    let took = wait_for("attached again", Duration::from_secs(4), || {
        sample(&lab, &attached) == Some(1.0)
    });
    eprintln!("attached again {took:?} after the interface came back");
    assert_eq!(sample(&lab, &reattaches), Some(1.0));
    let status = iface(&lab);
    assert_eq!(status["reattaches"], 1, "{status}");
    assert_eq!(status["program"], "limiter_linear", "{status}");
    assert_eq!(lab.json(&["status", "--json"])["reattaches"], 1);
    let dropped = dropped_of_a_flood(&lab);
    assert!(
        dropped > 300,
        "dropped only {dropped} of 400 after the re-attach"
    );

    // Created again with an MTU the linear build cannot take: the multi-buffer build
    // runs there.
    ip(&["link", "del", &lab.pair.host]).unwrap();
    create_again(&lab.pair, 9000);
    wait_for("attached at MTU 9000", Duration::from_secs(6), || {
        iface(&lab)["attached"] == true
    });
    let status = iface(&lab);
    assert_eq!(status["program"], "limiter", "{status}");
    assert_eq!(status["reattaches"], 2, "{status}");
    let dropped = dropped_of_a_flood(&lab);
    assert!(dropped > 300, "dropped only {dropped} of 400 at MTU 9000");
    daemon.stop();
}
