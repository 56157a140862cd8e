//! `cargo xtask run -- --fleet` runs this lab: an allocator and three daemons with
//! traffic. Scripted (kill, restart, partition, heal), it must show the share ladder —
//! LEASED, STICKY once a lease lapses, FAIL_OPEN after sticky_max, LEASED again — with
//! the fleet admitting its quota while leased, and leave nothing behind.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

use std::{collections::BTreeMap, path::Path, process::Command};

use limiter_tests::binaries::LIMITER_FLEET_LAB;

/// One `key=value` line of the lab's plain output.
type Fields = BTreeMap<String, String>;

fn fields(line: &str) -> Fields {
    line.split_whitespace()
        .filter_map(|w| w.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn num(f: &Fields, key: &str) -> f64 {
    f.get(key)
        .unwrap_or_else(|| panic!("no {key} in {f:?}"))
        .parse()
        .unwrap_or_else(|_| panic!("{key} is not a number in {f:?}"))
}

/// A host's samples (t, state, passed, dropped), in time order.
#[derive(Default)]
struct Samples(Vec<(f64, String, u64, u64)>);

impl Samples {
    fn state_at(&self, t: f64) -> &str {
        &self.0.iter().rev().find(|s| s.0 <= t).expect("a sample").1
    }

    /// The first sample at or after `from` in `state`.
    fn first(&self, state: &str, from: f64) -> Option<f64> {
        self.0
            .iter()
            .find(|s| s.0 >= from && s.1 == state)
            .map(|s| s.0)
    }

    fn passed_at(&self, t: f64) -> (f64, u64) {
        let s = self.0.iter().rev().find(|s| s.0 <= t).expect("a sample");
        (s.0, s.2)
    }
}

#[test]
fn the_fleet_lab_walks_the_share_ladder_and_back_and_cleans_up() {
    // The lab's fleet for this run: the three hosts offer more than the quota.
    let (quota, per_host, lease_ms, sticky_s) = (2400u64, 1500u64, 2000u64, 6u64);
    let lease = lease_ms as f64 / 1000.0;
    let sticky = sticky_s as f64;
    let kill = 8.0;
    let restart = kill + lease + sticky + 3.0;
    let partition = restart + 2.0 * lease + 1.0;
    let heal = partition + lease + 2.0;
    let duration = (heal + 2.0 * lease + 1.0).ceil() as u64;
    let script = format!("{kill}:kill,{restart}:restart,{partition}:partition 2,{heal}:heal 2");
    let out = Command::new(LIMITER_FLEET_LAB)
        .args(["--duration", &duration.to_string(), "--script", &script])
        .args(["--quota", &quota.to_string()])
        .args(["--rate-per-host", &per_host.to_string()])
        .args(["--lease-ms", &lease_ms.to_string()])
        .args(["--sticky-max-s", &sticky_s.to_string()])
        .output()
        .expect("running limiter-fleet-lab");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "lab failed: {stdout}\n{stderr}");

    // What the lab says it ran, and what that makes the fleet admit while leased.
    let config = fields(
        stdout
            .lines()
            .find(|l| l.starts_with("lab: config "))
            .unwrap_or_else(|| panic!("no config line in {stdout}")),
    );
    let hosts = num(&config, "hosts") as usize;
    assert_eq!(num(&config, "quota") as u64, quota);
    assert_eq!(num(&config, "lease_ttl_ms") as u64, lease_ms);
    assert_eq!(num(&config, "sticky_max_s") as u64, sticky_s);
    let expected = (quota as f64).min(per_host as f64 * hosts as f64);

    let mut samples: BTreeMap<String, Samples> = BTreeMap::new();
    let mut allocator: Vec<(f64, String)> = Vec::new();
    for line in stdout.lines().filter(|l| l.starts_with("t=")) {
        let f = fields(line);
        if f.contains_key("action") {
            continue; // `t=… action=partition host=lb-2 …`: not a sample
        }
        if let (Some(host), Some(state)) = (f.get("host"), f.get("state")) {
            samples.entry(host.clone()).or_default().0.push((
                num(&f, "t"),
                state.clone(),
                num(&f, "passed") as u64,
                num(&f, "dropped") as u64,
            ));
        } else if let Some(state) = f.get("allocator") {
            allocator.push((num(&f, "t"), state.clone()));
        }
    }
    assert_eq!(samples.len(), hosts, "a line per host: {stdout}");
    let at_all = |t: f64| -> Vec<&str> { samples.values().map(|s| s.state_at(t)).collect() };

    // LEASED before the kill, admitting the quota.
    let leased_from = samples
        .values()
        .map(|s| s.first("leased", 0.0).expect("never leased"))
        .fold(0.0, f64::max);
    assert!(
        leased_from + 2.0 < kill,
        "leased only at {leased_from} s (the kill is at {kill} s): {stdout}"
    );
    let (from, to) = (leased_from + 1.0, kill - 0.1);
    let admitted: f64 = samples
        .values()
        .map(|s| {
            let ((t0, p0), (t1, p1)) = (s.passed_at(from), s.passed_at(to));
            (p1 - p0) as f64 / (t1 - t0)
        })
        .sum();
    eprintln!("leased at {leased_from} s; admitted {admitted:.0}/s, expected {expected}");
    assert!(
        (admitted - expected).abs() <= 0.05 * expected,
        "the fleet admitted {admitted:.0}/s while leased, expected {expected} (quota {quota})"
    );
    assert!(
        at_all(to).iter().all(|s| *s == "leased"),
        "{:?}",
        at_all(to)
    );

    // The allocator down: STICKY once each lease lapses, FAIL_OPEN sticky_max later.
    for (name, s) in &samples {
        let sticky_at = s
            .first("sticky", kill)
            .unwrap_or_else(|| panic!("{name} never sticky"));
        let open_at = s
            .first("fail_open", kill)
            .unwrap_or_else(|| panic!("{name} never fail_open"));
        eprintln!("{name}: sticky at {sticky_at} s, fail_open at {open_at} s (kill at {kill} s)");
        assert!(
            sticky_at <= kill + lease + 1.5,
            "{name} sticky at {sticky_at}"
        );
        assert!(
            open_at >= kill + sticky - 0.5 && open_at <= kill + lease + sticky + 1.5,
            "{name} fail_open at {open_at}: sticky_max {sticky} s after a lease of {lease} s"
        );
        // Failing open drops nothing.
        let open: Vec<_> =
            s.0.iter()
                .filter(|x| x.0 >= open_at && x.0 < restart)
                .collect();
        assert!(open.len() >= 2, "{name}: too short a FAIL_OPEN to check");
        assert_eq!(
            open.first().unwrap().3,
            open.last().unwrap().3,
            "{name} dropped in fail_open"
        );
    }
    assert!(allocator
        .iter()
        .any(|(t, a)| *t > kill && *t < restart && a == "down"));

    // Back: LEASED again within two leases of the restart.
    for (name, s) in &samples {
        let back = s
            .first("leased", restart)
            .unwrap_or_else(|| panic!("{name} not leased again"));
        assert!(
            back <= restart + 2.0 * lease + 1.5,
            "{name} leased again only at {back}"
        );
    }

    // Host 2 cut off: it alone goes STICKY, and LEASED again once healed.
    let cut = &samples["lb-2"];
    let cut_sticky = cut
        .first("sticky", partition)
        .expect("lb-2 not sticky when partitioned");
    assert!(
        cut_sticky <= partition + lease + 1.5 && cut_sticky < heal,
        "lb-2 sticky at {cut_sticky}"
    );
    for name in ["lb-1", "lb-3"] {
        for x in samples[name]
            .0
            .iter()
            .filter(|x| x.0 > partition && x.0 < heal)
        {
            assert_eq!(x.1, "leased", "{name} at {} s while lb-2 was cut off", x.0);
        }
    }
    let healed = cut
        .first("leased", heal)
        .expect("lb-2 not leased after the heal");
    eprintln!(
        "lb-2: sticky {:.1} s after its partition, leased {:.1} s after the heal",
        cut_sticky - partition,
        healed - heal
    );

    // Nothing left behind: namespaces, links, pins, processes, the lab's directory.
    assert!(stdout.contains("lab: cleaned up"), "{stdout}");
    let netns = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let netns = String::from_utf8_lossy(&netns.stdout);
    let mut pids = Vec::new();
    for line in stdout.lines().filter(|l| l.starts_with("lab: host ")) {
        let f = fields(line);
        assert!(
            !netns.contains(&f["namespace"]),
            "namespace {} left",
            f["namespace"]
        );
        assert!(
            !Path::new(&format!("/sys/class/net/{}", f["veth"])).exists(),
            "{} left",
            f["veth"]
        );
        assert!(!Path::new(&f["pins"]).exists(), "pins {} left", f["pins"]);
        assert!(
            !Path::new(&f["socket"]).exists(),
            "socket {} left",
            f["socket"]
        );
        pids.push(f["daemon_pid"].clone());
    }
    assert_eq!(pids.len(), hosts);
    let alloc_line = stdout
        .lines()
        .find(|l| l.starts_with("lab: allocator "))
        .expect("allocator line");
    let dir = &fields(alloc_line)["dir"];
    assert!(!Path::new(dir).exists(), "the lab's directory {dir} left");
    for line in stdout.lines().filter(|l| l.contains("allocator_pid=")) {
        pids.push(fields(line)["allocator_pid"].clone());
    }
    for pid in pids {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&cmdline).contains("limiter"),
            "process {pid} ({}) still runs",
            String::from_utf8_lossy(&cmdline)
        );
    }
}
