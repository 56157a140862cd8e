//! `cargo xtask run -- --fleet` runs this lab: three allocator replicas on one etcd and
//! three daemons with traffic. Scripted (kill, restart, partition, heal), it must show a
//! killed leader replaced by another replica while every host stays LEASED, and, once
//! every replica is down, the share ladder — STICKY once a lease lapses, FAIL_OPEN after
//! sticky_max, LEASED again after the restart — with the fleet admitting its quota while
//! leased, and leave nothing behind.
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
    // The lab's fleet for this run: the three hosts offer more than the quota. A lease of
    // 4 s (reports every 500 ms) outlasts the replicas' 2 s election TTL and a report by
    // 1.5 s: with 3 s (0.5 s to spare), a failover beside CI's other lane and its soak
    // took 3 s and a host's share lapsed to sticky.
    let (quota, per_host, lease_ms, sticky_s) = (2400u64, 1500u64, 4000u64, 6u64);
    let lease = lease_ms as f64 / 1000.0;
    let sticky = sticky_s as f64;
    // Each `kill` kills the replica leading then: the first two leave one to take over,
    // the third is the last one up.
    let kills = [8.0, 15.0, 22.0];
    let kill = kills[2];
    let restart = kill + lease + sticky + 3.0;
    let partition = restart + 2.0 * lease + 1.0;
    let heal = partition + lease + 2.0;
    let duration = (heal + 2.0 * lease + 1.0).ceil() as u64;
    let script = format!(
        "{}:kill,{}:kill,{kill}:kill,{restart}:restart,{partition}:partition 2,{heal}:heal 2",
        kills[0], kills[1]
    );
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
    assert_eq!(num(&config, "replicas") as u64, 3);
    let election = num(&config, "election_ttl_ms") / 1000.0;
    let expected = (quota as f64).min(per_host as f64 * hosts as f64);

    let mut samples: BTreeMap<String, Samples> = BTreeMap::new();
    // (t, leader, replicas up) of each global line.
    let mut global: Vec<(f64, String, u64)> = Vec::new();
    // (t, replica, role, term) of each replica line.
    let mut replicas: Vec<(f64, String, String, u64)> = Vec::new();
    // (t, replica, term) of each kill.
    let mut killed: Vec<(f64, String, u64)> = Vec::new();
    for line in stdout.lines().filter(|l| l.starts_with("t=")) {
        let f = fields(line);
        if f.get("action").map(String::as_str) == Some("kill") {
            let name = f
                .get("replica")
                .unwrap_or_else(|| panic!("a kill that killed nothing: {line}"));
            killed.push((num(&f, "t"), name.clone(), num(&f, "term") as u64));
        }
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
        } else if let (Some(name), Some(role)) = (f.get("replica"), f.get("role")) {
            replicas.push((
                num(&f, "t"),
                name.clone(),
                role.clone(),
                num(&f, "term") as u64,
            ));
        } else if let Some(leader) = f.get("leader") {
            global.push((num(&f, "t"), leader.clone(), num(&f, "replicas_up") as u64));
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
        leased_from + 2.0 < kills[0],
        "leased only at {leased_from} s (the first kill is at {} s): {stdout}",
        kills[0]
    );
    let (from, to) = (leased_from + 1.0, kills[0] - 0.1);
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

    // Each kill killed the leader of the moment, and another replica (a higher term)
    // took over within the election TTL and a little, while every host stayed LEASED.
    assert_eq!(killed.len(), 3, "{stdout}");
    let names: Vec<&str> = killed.iter().map(|k| k.1.as_str()).collect();
    assert!(
        names[0] != names[1] && names[1] != names[2] && names[0] != names[2],
        "the kills did not each kill a new leader: {names:?}"
    );
    for pair in killed.windows(2) {
        let ((at, name, term), next) = (&pair[0], &pair[1].0);
        let took_over = replicas
            .iter()
            .find(|r| r.0 > *at && r.1 != *name && r.2 == "leader")
            .unwrap_or_else(|| panic!("no replica led after {name} was killed at {at} s"));
        eprintln!(
            "killed {name} (term {term}) at {at} s: {} leads at term {} by {} s",
            took_over.1, took_over.3, took_over.0
        );
        assert!(took_over.3 > *term, "term {} after {term}", took_over.3);
        assert!(
            took_over.0 <= at + election + 3.0,
            "{} led only at {} s",
            took_over.1,
            took_over.0
        );
        for r in replicas
            .iter()
            .filter(|r| r.0 > *at && r.0 < restart && r.1 == *name)
        {
            assert_eq!(r.2, "down", "{name} at {} s, killed at {at} s", r.0);
        }
        for (host, s) in &samples {
            for x in s.0.iter().filter(|x| x.0 > *at && x.0 < *next) {
                assert_eq!(
                    x.1, "leased",
                    "{host} at {} s: the leader was killed at {at} s",
                    x.0
                );
            }
        }
    }
    let (from, to) = (kills[0], kill - 0.1);
    let through: f64 = samples
        .values()
        .map(|s| {
            let ((t0, p0), (t1, p1)) = (s.passed_at(from), s.passed_at(to));
            (p1 - p0) as f64 / (t1 - t0)
        })
        .sum();
    eprintln!("through two failovers ({from} s to {to} s): admitted {through:.0}/s");
    assert!(
        (through - expected).abs() <= 0.05 * expected,
        "the fleet admitted {through:.0}/s through the failovers, expected {expected}"
    );

    // Every replica down: STICKY once each lease lapses, FAIL_OPEN sticky_max later.
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
    assert!(
        global
            .iter()
            .any(|(t, leader, up)| *t > kill && *t < restart && leader == "none" && *up == 0),
        "no second with every replica down"
    );

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
    let etcd_line = stdout
        .lines()
        .find(|l| l.starts_with("lab: etcd "))
        .expect("etcd line");
    let dir = &fields(etcd_line)["dir"];
    assert!(!Path::new(dir).exists(), "the lab's directory {dir} left");
    pids.push(fields(etcd_line)["etcd_pid"].clone());
    let replica_pids: Vec<String> = stdout
        .lines()
        .filter(|l| l.contains("replica_pid="))
        .map(|l| fields(l)["replica_pid"].clone())
        .collect();
    // Three started, three killed and three restarted.
    assert!(replica_pids.len() >= 6, "{replica_pids:?}");
    pids.extend(replica_pids);
    for pid in pids {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).into_owned();
        assert!(
            !cmdline.contains("limiter") && !cmdline.contains("etcd"),
            "process {pid} ({cmdline}) still runs"
        );
    }
}
