//! Replicated allocators with real processes: Debian's etcd, three `limiter-allocator`
//! replicas electing their leader in it, and three daemons with traffic through their
//! veth pairs, each listing the three replicas. Times are scaled down by configuration:
//! election TTL 2 s (etcd's shortest), lease 3 s, reports every 500 ms.
//!
//! Each replica reaches etcd at a loopback address of its own (127.0.0.11, .12, .13, all
//! served by the one etcd member), so nftables can cut one replica off from etcd and
//! leave the others.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

mod common;

use std::{
    collections::BTreeMap,
    net::Ipv4Addr,
    process::Command,
    time::{Duration, Instant},
};

use common::{fleet::*, join, pki::Pki, Daemon, Lab};
use limiter_tests::{etcd::Etcd, traffic::SendReport};

const LEASE: u64 = 3000;
const REPORT: u64 = 500;
const ELECTION_TTL: u64 = 2000;
/// Per rule and host: 2 × 2,000/s offered against a 3,000/s quota.
const OFFERED: u64 = 2000;

/// Dropped in this order: the replicas, then etcd (which they would log losing).
struct Group {
    replicas: Vec<Allocator>,
    etcd: Etcd,
    metrics: Vec<u16>,
    _dirs: Vec<tempfile::TempDir>,
}

/// One loopback address per replica, for it alone to reach etcd at.
fn loopbacks(n: usize) -> Vec<Ipv4Addr> {
    (0..n)
        .map(|i| Ipv4Addr::new(127, 0, 0, 11 + i as u8))
        .collect()
}

impl Group {
    fn new(pki: &Pki, dir: &std::path::Path, n: usize) -> Group {
        let etcd = Etcd::start(dir, &loopbacks(n)).unwrap_or_else(|e| panic!("{e:#}"));
        Group::over(pki, etcd, n, |_| String::new())
    }

    /// `n` replicas on `etcd`, replica `i`'s `[election]` table ending with `extra(i)`.
    fn over(pki: &Pki, etcd: Etcd, n: usize, extra: impl Fn(usize) -> String) -> Group {
        let mut replicas = Vec::new();
        let mut metrics = Vec::new();
        let mut dirs = Vec::new();
        for i in 0..n {
            let d = tempfile::tempdir().unwrap();
            let m = free_port();
            let election = format!(
                "[election]\netcd = [\"{}\"]\nttl_ms = {ELECTION_TTL}\n{}",
                etcd.endpoint(i),
                extra(i)
            );
            replicas.push(Allocator::configured(
                d.path(),
                pki,
                Some(m),
                LEASE,
                REPORT,
                &election,
            ));
            metrics.push(m);
            dirs.push(d);
        }
        Group {
            etcd,
            replicas,
            metrics,
            _dirs: dirs,
        }
    }

    /// Each running replica's (leader gauge, term); `None` for a stopped one.
    fn roles(&self) -> Vec<Option<(bool, u64)>> {
        self.replicas
            .iter()
            .zip(&self.metrics)
            .map(|(r, &m)| {
                r.child.as_ref()?;
                let s = scrape(m);
                Some((
                    s["limiter_allocator_leader"] == 1.0,
                    s["limiter_allocator_term"] as u64,
                ))
            })
            .collect()
    }

    fn leaders(&self) -> Vec<(usize, u64)> {
        self.roles()
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.filter(|r| r.0).map(|r| (i, r.1)))
            .collect()
    }

    /// The one leader, once there is exactly one; fails after `within`.
    fn wait_leader(&self, within: Duration) -> (usize, u64) {
        let start = Instant::now();
        loop {
            let leaders = self.leaders();
            if let [one] = leaders[..] {
                return one;
            }
            assert!(
                start.elapsed() < within,
                "no single leader after {within:?}: {:?}",
                self.roles()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `[fleet] allocator` listing every replica.
    fn allocator_list(&self) -> String {
        let ports: Vec<String> = self
            .replicas
            .iter()
            .map(|r| format!("\"127.0.0.1:{}\"", r.port))
            .collect();
        format!("allocator = [{}]", ports.join(", "))
    }

    /// Three daemons, each listing every replica.
    fn hosts(&self, pki: &Pki) -> Vec<Lab> {
        (1..=3)
            .map(|i| {
                let host = format!("lb-{i}");
                let one =
                    daemon_config_timed(&host, pki, self.replicas[0].port, &host, LEASE, REPORT);
                let single = format!("allocator = \"127.0.0.1:{}\"", self.replicas[0].port);
                assert!(one.contains(&single), "{one}");
                Lab::new(&one.replace(&single, &self.allocator_list()))
            })
            .collect()
    }

    fn quota(&self, i: usize, args: &[&str]) -> std::process::Output {
        Command::new(Allocator::binary())
            .arg("quota")
            .args(args)
            .arg("--socket")
            .arg(self.replicas[i].socket())
            .output()
            .unwrap()
    }

    /// `limiter-allocator status` of replica `i`.
    fn status(&self, i: usize) -> serde_json::Value {
        let out = Command::new(Allocator::binary())
            .args(["status", "--socket"])
            .arg(self.replicas[i].socket())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "status: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// `quota list` on replica `i`: rule → (rate, burst).
    fn quotas(&self, i: usize) -> BTreeMap<String, (u64, u64)> {
        let out = self.quota(i, &["list"]);
        assert!(
            out.status.success(),
            "quota list: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        list.as_array()
            .unwrap()
            .iter()
            .map(|q| {
                (
                    q["rule"].as_str().unwrap().to_string(),
                    (q["rate"].as_u64().unwrap(), q["burst"].as_u64().unwrap()),
                )
            })
            .collect()
    }
}

/// Samples every 50 ms for `span`: every host's every share stays leased, and no two
/// replicas lead at once. Returns the samples taken.
fn hold_leased_and_one_leader(g: &Group, labs: &[&Lab], span: Duration, what: &str) -> usize {
    let until = Instant::now() + span;
    let mut samples = 0;
    while Instant::now() < until {
        for lab in labs {
            let now = states(lab);
            assert!(
                now.values().all(|s| s == "leased"),
                "{what}: a share left leased: {now:?} (replicas {:?})",
                g.roles()
            );
        }
        let leaders = g.leaders();
        assert!(
            leaders.len() <= 1,
            "{what}: two replicas lead at once: {leaders:?}"
        );
        samples += 1;
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(samples > 10, "{what}: only {samples} samples");
    samples
}

/// The three daemons running, each with traffic for `secs` seconds, all `leased`.
struct Traffic {
    daemons: Vec<Daemon>,
    senders: Vec<std::thread::JoinHandle<anyhow::Result<anyhow::Result<SendReport>>>>,
}

impl Traffic {
    fn start(labs: &[Lab], secs: u64) -> Traffic {
        let daemons = labs.iter().map(Lab::start).collect();
        let senders = labs
            .iter()
            .map(|lab| lab.send_in_background(traffic(lab, OFFERED, Duration::from_secs(secs))))
            .collect();
        let all: Vec<&Lab> = labs.iter().collect();
        wait_state(&all, "web", "leased", Duration::from_secs(10));
        Traffic { daemons, senders }
    }

    fn stop(self) {
        for s in self.senders {
            join(s);
        }
        for d in self.daemons {
            d.stop();
        }
    }
}

fn admitted_total(labs: &[&Lab]) -> u64 {
    counters(labs, "web").iter().map(|c| c.0).sum()
}

#[test]
fn a_killed_leader_is_replaced_and_no_host_leaves_leased() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let mut g = Group::new(&pki, dir.path(), 3);
    let (leader, term) = g.wait_leader(Duration::from_secs(10));
    let labs = g.hosts(&pki);
    let running = Traffic::start(&labs, 22);
    let all: Vec<&Lab> = labs.iter().collect();
    // Past the leader's learning period: its shares follow demand.
    std::thread::sleep(Duration::from_millis(LEASE + 2 * REPORT));
    let steady = admitted_rate(&all, "web", Duration::from_secs(3));

    let before = admitted_total(&all);
    let killed_at = Instant::now();
    g.replicas[leader].kill();
    let span = Duration::from_millis(3 * LEASE);
    hold_leased_and_one_leader(&g, &all, span, "after the leader was killed");
    let through = (admitted_total(&all) - before) as f64 / killed_at.elapsed().as_secs_f64();
    let (next, next_term) = g.wait_leader(Duration::from_secs(1));
    eprintln!(
        "leader {leader} (term {term}) killed; replica {next} leads at term {next_term}; \
         admitted {steady:.0}/s before, {through:.0}/s over the {span:?} after (quota {QUOTA}/s)"
    );
    assert_ne!(next, leader);
    assert!(next_term > term, "term {next_term} after {term}");
    assert!(
        (through - QUOTA as f64).abs() <= QUOTA as f64 * 0.02,
        "admitted {through:.0}/s through the failover, quota {QUOTA}/s (before: {steady:.0}/s)"
    );
    running.stop();
}

#[test]
fn a_leader_cut_off_from_etcd_steps_down_before_another_leads() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let g = Group::new(&pki, dir.path(), 3);
    let (leader, term) = g.wait_leader(Duration::from_secs(10));
    let labs = g.hosts(&pki);
    let running = Traffic::start(&labs, 16);
    let all: Vec<&Lab> = labs.iter().collect();

    let cut_address = g.etcd.clients[leader];
    let cut = Partition::dropping(&[
        format!(
            "ip daddr {} tcp dport {}",
            cut_address.ip(),
            cut_address.port()
        ),
        format!(
            "ip saddr {} tcp sport {}",
            cut_address.ip(),
            cut_address.port()
        ),
    ]);
    let cut_at = Instant::now();
    // Sampled every 50 ms: the old leader's gauge drops before any other rises.
    let mut stepped_down = None;
    let mut next = None;
    while cut_at.elapsed() < Duration::from_secs(10) && next.is_none() {
        let roles = g.roles();
        let leading: Vec<usize> = (0..3).filter(|&i| roles[i].is_some_and(|r| r.0)).collect();
        assert!(leading.len() <= 1, "two replicas lead at once: {roles:?}");
        if stepped_down.is_none() && !leading.contains(&leader) {
            stepped_down = Some(cut_at.elapsed());
        }
        if let Some(&other) = leading.iter().find(|&&i| i != leader) {
            assert!(
                stepped_down.is_some(),
                "replica {other} leads while {leader} still does"
            );
            next = Some((other, roles[other].unwrap().1, cut_at.elapsed()));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let stepped_down = stepped_down.expect("the cut-off leader never stepped down");
    let (other, other_term, took) = next.expect("no other replica leads within 10 s");
    eprintln!(
        "leader {leader} (term {term}) cut off from etcd: stepped down after {stepped_down:?}, \
         replica {other} leads at term {other_term} after {took:?}"
    );
    // It stops at 2/3 of the TTL after its last acknowledged keepalive, which is at most
    // a third of the TTL old when the cut starts.
    assert!(
        stepped_down <= Duration::from_millis(ELECTION_TTL * 2 / 3 + 300),
        "{stepped_down:?}"
    );
    assert!(other_term > term);
    hold_leased_and_one_leader(
        &g,
        &all,
        Duration::from_millis(LEASE),
        "after the new leader won",
    );
    drop(cut);
    // Back in touch with etcd, the old leader follows: the new one keeps leading.
    std::thread::sleep(Duration::from_millis(2 * ELECTION_TTL));
    assert_eq!(g.leaders(), vec![(other, other_term)], "{:?}", g.roles());
    hold_leased_and_one_leader(
        &g,
        &all,
        Duration::from_millis(LEASE),
        "after the cut healed",
    );
    running.stop();
}

#[test]
fn quota_changes_need_etcd_and_survive_its_restart() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let mut g = Group::new(&pki, dir.path(), 3);
    let (leader, term) = g.wait_leader(Duration::from_secs(10));
    let follower = (leader + 1) % 3;
    // `status` names each replica's role, and the follower the leader it redirects to.
    let status = |i: usize| g.status(i);
    let (l, f) = (status(leader), status(follower));
    assert_eq!(
        (l["role"].as_str(), l["term"].as_u64()),
        (Some("leader"), Some(term)),
        "{l}"
    );
    assert_eq!(f["role"], "follower", "{f}");
    assert_eq!(f["etcd_reachable"], true, "{f}");
    let leader_addr = format!("127.0.0.1:{}", g.replicas[leader].port);
    let deadline = Instant::now() + Duration::from_secs(3);
    while status(follower)["leader"].as_str() != Some(leader_addr.as_str()) {
        assert!(
            Instant::now() < deadline,
            "the follower does not name the leader: {}",
            status(follower)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        g.quotas(follower)["web"],
        (QUOTA, 300),
        "seeded from the config file"
    );
    let ok = g.quota(
        follower,
        &["set", "web", "--rate", "2000", "--burst", "200"],
    );
    assert!(
        ok.status.success(),
        "quota set on a follower: {}",
        String::from_utf8_lossy(&ok.stderr)
    );

    g.etcd.kill();
    let refused = g.quota(follower, &["set", "web", "--rate", "1000"]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success(),
        "quota set with etcd down succeeded"
    );
    assert!(
        stderr.contains("quota not changed") && stderr.contains("etcd"),
        "the refusal does not say what happened: {stderr}"
    );
    let listed = g.quota(leader, &["list"]);
    assert!(!listed.status.success());
    assert!(String::from_utf8_lossy(&listed.stderr).contains("etcd"));
    // No leader can prove its lease: none grants.
    std::thread::sleep(Duration::from_millis(ELECTION_TTL));
    assert_eq!(
        g.leaders(),
        vec![],
        "a replica leads without etcd: {:?}",
        g.roles()
    );

    g.etcd.resume().unwrap();
    g.wait_leader(Duration::from_secs(15));
    for i in 0..3 {
        assert_eq!(
            g.quotas(i)["web"],
            (2000, 200),
            "replica {i} after etcd's restart"
        );
    }
    // A restarted replica reads etcd's quota, not its config file's 3000.
    g.replicas[follower].kill();
    g.replicas[follower].start();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let m = scrape(g.metrics[follower]);
        if m.get("limiter_allocator_quota_per_second{rule=\"web\"}") == Some(&2000.0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the restarted replica's quotas: {m:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // A value written to etcd by hand that no daemon could enforce is ignored.
    g.etcd
        .put("limiter-allocator/quotas/web", "{\"rate\":0,\"burst\":1}")
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    for i in 0..3 {
        let m = scrape(g.metrics[i]);
        assert_eq!(
            m["limiter_allocator_quota_per_second{rule=\"web\"}"], 2000.0,
            "replica {i}"
        );
    }
}

#[test]
fn quota_set_on_a_follower_reaches_the_fleet_and_a_full_restart_never_over_grants() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let mut g = Group::new(&pki, dir.path(), 3);
    let (leader, _) = g.wait_leader(Duration::from_secs(10));
    let labs = g.hosts(&pki);
    let running = Traffic::start(&labs, 24);
    let all: Vec<&Lab> = labs.iter().collect();
    std::thread::sleep(Duration::from_millis(LEASE));

    let follower = (leader + 2) % 3;
    let out = g.quota(follower, &["set", "web", "--rate", "1500"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::thread::sleep(Duration::from_millis(4 * REPORT));
    let rate = admitted_rate(&all, "web", Duration::from_secs(2));
    eprintln!("after quota set 1500 on follower {follower}: admitted {rate:.0}/s");
    assert!(
        (rate - 1500.0).abs() <= 1500.0 * 0.02,
        "admitted {rate:.0}/s"
    );

    // Every replica at once: the new leader learns what hosts hold before it grants
    // anew, so the shares in force never sum above the quota.
    for r in &mut g.replicas {
        r.kill();
    }
    for r in &mut g.replicas {
        r.start();
    }
    let until = Instant::now() + Duration::from_millis(2 * LEASE);
    let mut peak = 0;
    while Instant::now() < until {
        let sum: u64 = labs.iter().map(web_share).sum();
        peak = peak.max(sum);
        assert!(sum <= 1500, "shares in force sum to {sum}/s, quota 1500/s");
        std::thread::sleep(Duration::from_millis(50));
    }
    let (new_leader, term) = g.wait_leader(Duration::from_secs(5));
    eprintln!("every replica restarted: replica {new_leader} leads at term {term}; shares in force peaked at {peak}/s");
    wait_state(&all, "web", "leased", Duration::from_secs(5));
    assert_eq!(g.quotas(new_leader)["web"].0, 1500);
    running.stop();
}

/// etcd over TLS that asks for client certificates, as a production cluster is run:
/// replicas given its CA and a client certificate elect a leader and keep the quotas
/// there; a replica that trusts another CA (so an impostor etcd, which that CA would
/// sign, cannot steer it either) never leads, refuses quota changes, and its `status`
/// says why.
#[test]
fn over_tls_etcd_is_verified_and_a_replica_that_cannot_verify_it_never_leads() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let addresses = loopbacks(3);
    let names: Vec<String> = addresses.iter().map(Ipv4Addr::to_string).collect();
    let tls = Pki::etcd(dir.path(), &names).unwrap();
    let etcd =
        Etcd::start_tls(dir.path(), &addresses, tls.clone()).unwrap_or_else(|e| panic!("{e:#}"));
    assert!(
        etcd.endpoint(0).starts_with("https://"),
        "{}",
        etcd.endpoint(0)
    );
    let other_ca = pki.dir.join("rogue-ca.pem");
    let g = Group::over(&pki, etcd, 3, |i| {
        let ca = if i == 2 { &other_ca } else { &tls.ca };
        format!(
            "ca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\n",
            ca.display(),
            tls.client.cert.display(),
            tls.client.key.display()
        )
    });
    let (leader, term) = g.wait_leader(Duration::from_secs(15));
    assert_ne!(leader, 2, "the replica that cannot verify etcd leads");
    assert!(term > 0);
    let follower = 1 - leader;
    let status = g.status(leader);
    assert_eq!(
        (
            status["etcd_tls"].as_bool(),
            status["etcd_reachable"].as_bool()
        ),
        (Some(true), Some(true)),
        "{status}"
    );

    // A quota set through the follower is written over TLS and reaches the leader by its
    // watch.
    let ok = g.quota(
        follower,
        &["set", "web", "--rate", "2500", "--burst", "250"],
    );
    assert!(
        ok.status.success(),
        "quota set over TLS: {}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let start = Instant::now();
    while g.quotas(leader).get("web") != Some(&(2500, 250)) {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the leader never saw the quota set through the follower: {:?}",
            g.quotas(leader)
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // The replica trusting another CA: not leading, etcd unreachable, and why.
    let start = Instant::now();
    let status = loop {
        let s = g.status(2);
        if s["etcd_error"].is_string() {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no etcd error after 10 s: {s}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    eprintln!("the replica trusting another CA: {status}");
    assert_eq!(status["role"].as_str(), Some("follower"), "{status}");
    assert_eq!(status["etcd_reachable"].as_bool(), Some(false), "{status}");
    let why = status["etcd_error"]
        .as_str()
        .unwrap_or_default()
        .to_lowercase();
    assert!(
        why.contains("certificate") || why.contains("issuer"),
        "the error does not name the certificate: {why}"
    );
    let refused = g.quota(2, &["set", "web", "--rate", "1"]);
    assert!(
        !refused.status.success(),
        "quota set without etcd succeeded"
    );
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("etcd"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    assert_eq!(g.quotas(leader).get("web"), Some(&(2500, 250)));
    assert_eq!(g.leaders().len(), 1, "{:?}", g.roles());
}
