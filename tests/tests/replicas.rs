//! Replicated allocators with real processes: Debian's etcd, three `limiter-allocator`
//! replicas electing their leader in it, and three daemons with traffic through their
//! veth pairs, each listing the three replicas. Times are scaled down by configuration:
//! election TTL 2 s (etcd's shortest), lease 4 s, reports every 500 ms.
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
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use common::{fleet::*, pki::Pki, start_all, wait_for, Daemon, Lab, Sender};
use limiter_fleet::alloc::DEFAULT_CREDIT_PCT;
use limiter_proto::pb::{allocator_client::AllocatorClient, ReportRequest};
use limiter_tests::etcd::Etcd;
use tonic::transport::{Channel, Endpoint};

/// 1.5 s above the election TTL and a report: a failover (the dead leader's key
/// expiring, another replica elected, each host's next report answered) must fit in
/// it with room for scheduling delay. At 3 s, with the soak's test form and CI's guest
/// running beside this file, a killed leader's hosts went
/// sticky before the new leader's first grant
/// (`a_killed_leader_is_replaced_and_no_host_leaves_leased`).
const LEASE: u64 = 4000;
/// The window a steady rate is read over to within 2 %: each host's count is timed at the
/// middle of its reading, and beside CI's other lanes a reading takes up to ≈ 100 ms, so
/// over 2 s the rate was uncertain by ≈ ±2.5 % (after a move whose 2 s windows peaked at
/// 3,018/s, the end's 2 s window read 3,069/s of a 3,000/s quota); over 6 s, ≈ ±0.8 %.
const STEADY_WINDOW: Duration = Duration::from_secs(6);
const REPORT: u64 = 500;
const ELECTION_TTL: u64 = 2000;
/// Per rule and host: 2 × 2,000/s offered against a 3,000/s quota.
const OFFERED: u64 = 2000;

/// The metrics of the replica whose endpoint is on `port`, once it listens: a started
/// replica listens for hosts first (what `Allocator::start` waits for) and opens its
/// metrics a moment later, longer on a loaded machine.
fn scrape_replica(port: u16) -> BTreeMap<String, f64> {
    wait_for(
        &format!("a replica's metrics endpoint on 127.0.0.1:{port} to listen"),
        Duration::from_secs(10),
        || std::net::TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string()),
    );
    scrape(port)
}

/// Every port the harness hands out for a listener (replicas' gRPC and metrics, daemons'
/// metrics) is a different one: the kernel hands a port just closed out again (146 of
/// 2,000 in a row here), and a replica given its metrics port as its gRPC port served
/// gRPC where the test read metrics.
#[test]
fn the_harness_never_hands_out_a_port_twice() {
    let mut seen = std::collections::BTreeSet::new();
    for i in 0..2000 {
        let port = free_port();
        assert!(
            seen.insert(port),
            "port {port} handed out again at call {i}"
        );
    }
}

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

    /// `n` replicas with the top-level `settings` (peer bounds) in their files.
    fn bounded(pki: &Pki, dir: &std::path::Path, n: usize, settings: &str) -> Group {
        let etcd = Etcd::start(dir, &loopbacks(n)).unwrap_or_else(|e| panic!("{e:#}"));
        let (Members { replicas, metrics }, dirs) =
            replicas_on(pki, &etcd, 0..n, settings, |_| String::new());
        Group {
            etcd,
            replicas,
            metrics,
            _dirs: dirs,
        }
    }

    /// `n` replicas on `etcd`, replica `i`'s `[election]` table ending with `extra(i)`.
    fn over(pki: &Pki, etcd: Etcd, n: usize, extra: impl Fn(usize) -> String) -> Group {
        let (Members { replicas, metrics }, dirs) = replicas_on(pki, &etcd, 0..n, "", extra);
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
                let s = scrape_replica(m);
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
    senders: Vec<Sender>,
}

impl Traffic {
    fn start(labs: &[Lab], secs: u64) -> Traffic {
        let daemons = start_all(labs);
        let senders = labs
            .iter()
            .map(|lab| lab.send_stoppable(traffic(lab, OFFERED, Duration::from_secs(secs))))
            .collect();
        let all: Vec<&Lab> = labs.iter().collect();
        wait_state(&all, "web", "leased", Duration::from_secs(10));
        Traffic { daemons, senders }
    }

    /// Ends the traffic (what a test measured is behind it) and the daemons.
    fn stop(self) {
        for s in self.senders {
            s.stop();
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

    // Each reading timed at its middle (it asks every daemon in turn).
    let read = || {
        let start = Instant::now();
        let total = admitted_total(&all);
        (total, start + start.elapsed() / 2)
    };
    let (before, before_at) = read();
    g.replicas[leader].kill();
    let span = Duration::from_millis(3 * LEASE);
    hold_leased_and_one_leader(&g, &all, span, "after the leader was killed");
    let (after, after_at) = read();
    let through = (after - before) as f64 / (after_at - before_at).as_secs_f64();
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

/// Peers that never complete a handshake, `per_source` connections from each of
/// `sources` to each of `ports`; a connection the allocator closes is opened again 500 ms
/// later. Until stopped.
struct Flood {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl Flood {
    fn start(ports: &[u16], sources: &[Ipv4Addr], per_source: usize) -> Flood {
        let stop = Arc::new(AtomicBool::new(false));
        let targets: Vec<(u16, Ipv4Addr)> = ports
            .iter()
            .flat_map(|&p| sources.iter().map(move |&s| (p, s)))
            .collect();
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let mut tasks = Vec::new();
                for (port, source) in targets {
                    for _ in 0..per_source {
                        tasks.push(tokio::spawn(hold_a_place(port, source, Arc::clone(&flag))));
                    }
                }
                for t in tasks {
                    t.await.unwrap();
                }
            });
        });
        Flood { stop, thread }
    }

    fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap();
    }
}

/// One flooding peer: connects from `source`, sends nothing, and reconnects 500 ms after
/// each close.
async fn hold_a_place(port: u16, source: Ipv4Addr, stop: Arc<AtomicBool>) {
    use tokio::io::AsyncReadExt as _;
    let target = std::net::SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    while !stop.load(Ordering::Relaxed) {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind((source, 0).into()).unwrap();
        if let Ok(mut stream) = socket.connect(target).await {
            let mut buf = [0u8; 512];
            while !stop.load(Ordering::Relaxed) {
                let read = tokio::time::timeout(Duration::from_millis(100), stream.read(&mut buf));
                if let Ok(Ok(0) | Err(_)) = read.await {
                    break;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Peers without a certificate take every connection place of every replica from 40
/// loopback addresses (80 connections for 24 places) and take each place back as soon as
/// it frees; the hosts still get in, and after the leader is killed into its successor:
/// every share stays leased.
#[test]
fn a_connection_flood_from_many_addresses_keeps_no_host_from_the_new_leader() {
    const MAX: usize = 24;
    // The three hosts connect from 127.0.0.1, each to a follower and the leader.
    const PER_IP: usize = 6;
    const SOURCES: u8 = 40;
    const PER_SOURCE: usize = 2;
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let mut g = Group::bounded(
        &pki,
        dir.path(),
        3,
        &format!("max_connections = {MAX}\nmax_connections_per_ip = {PER_IP}\n"),
    );
    let (leader, _) = g.wait_leader(Duration::from_secs(10));
    let ports: Vec<u16> = g.replicas.iter().map(|r| r.port).collect();
    let sources: Vec<Ipv4Addr> = (1..=SOURCES).map(|i| Ipv4Addr::new(127, 0, 1, i)).collect();
    let flood = Flood::start(&ports, &sources, PER_SOURCE);
    // Every place of every replica is taken before any host connects.
    let start = Instant::now();
    while !g
        .metrics
        .iter()
        .all(|&m| scrape_replica(m)["limiter_allocator_connections"] == MAX as f64)
    {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the flood did not take every place"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let labs = g.hosts(&pki);
    let running = Traffic::start(&labs, 20);
    let all: Vec<&Lab> = labs.iter().collect();
    hold_leased_and_one_leader(&g, &all, Duration::from_millis(LEASE), "flooded");
    g.replicas[leader].kill();
    hold_leased_and_one_leader(
        &g,
        &all,
        Duration::from_millis(3 * LEASE),
        "flooded, after the leader was killed",
    );
    let (next, _) = g.wait_leader(Duration::from_secs(1));
    let m = scrape_replica(g.metrics[next]);
    let evicted = m["limiter_allocator_connections_evicted_total"];
    let refused = m["limiter_allocator_connections_refused_total{limit=\"max_connections\"}"];
    eprintln!(
        "new leader {next}: {} connections open ({} handshaking), {evicted} evicted in their \
         handshake, {refused} refused for max_connections",
        m["limiter_allocator_connections"], m["limiter_allocator_connections_handshaking"]
    );
    assert!(evicted > 0.0, "the flood never had to be evicted");
    assert_eq!(
        m["limiter_allocator_connections"], MAX as f64,
        "the flood no longer held the other places"
    );
    flood.stop();
    running.stop();
}

/// A replica whose etcd is reached in plain text says so in its log at start.
#[test]
fn plaintext_etcd_is_warned_about_at_start() {
    use std::io::{BufRead as _, BufReader};
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    // Nothing listens on port 1: the warning comes before any etcd session.
    let election = format!("[election]\netcd = [\"127.0.0.1:1\"]\nttl_ms = {ELECTION_TTL}\n");
    let mut written = Allocator::configured(dir.path(), &pki, None, LEASE, REPORT, &election);
    written.kill();
    let mut child = Command::new(Allocator::binary())
        .args(["run", "--config"])
        .arg(&written.config)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen = Vec::new();
    let warning = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) if line.contains("WARN") && line.contains("plain text") => break Some(line),
            Ok(line) => seen.push(line),
            Err(_) => break None,
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    let warning = warning.unwrap_or_else(|| panic!("no plain-text etcd warning in: {seen:#?}"));
    for what in ["quotas", "election", "127.0.0.1:1"] {
        assert!(warning.contains(what), "{what:?} not in {warning}");
    }
}

/// A gRPC client of replica `port` holding certificate `cert` of the test PKI.
fn grpc_client(pki: &Pki, cert: &str, port: u16) -> AllocatorClient<Channel> {
    let pair = pki.pair(cert);
    let tls = limiter_proto::client_tls(
        &limiter_proto::TlsFiles {
            ca: &pki.ca(),
            cert: &pair.cert,
            key: &pair.key,
        },
        "limiter-allocator",
    )
    .unwrap();
    let channel = Endpoint::from_shared(format!("https://127.0.0.1:{port}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .timeout(Duration::from_secs(1))
        .connect_lazy();
    AllocatorClient::new(channel)
}

/// One host played over gRPC: a client per replica, the replica it reports to (the next
/// one after a failure, as a daemon does) and what it reports as held.
struct Reporter {
    host: &'static str,
    clients: Vec<AllocatorClient<Channel>>,
    at: usize,
    held: u64,
}

impl Reporter {
    /// One report (to the replicas in turn until one grants, at most once each): the
    /// web grant and the term it came with, `None` when no replica answered with one.
    async fn report(&mut self, demand: u64, claim: Option<u64>) -> Option<(Option<u64>, u64)> {
        for _ in 0..self.clients.len() {
            let req = ReportRequest::one_rule(self.host, "web", demand, claim.unwrap_or(self.held));
            match self.clients[self.at].report(req).await {
                Ok(reply) => {
                    let reply = reply.into_inner();
                    let rate = reply
                        .grants
                        .iter()
                        .find(|g| g.rule == "web")
                        .map(|g| g.rate);
                    if let Some(rate) = rate {
                        self.held = rate;
                    }
                    return Some((rate, reply.term));
                }
                Err(_) => self.at = (self.at + 1) % self.clients.len(),
            }
        }
        None
    }
}

/// One certificate (lb-1's) reports holding 100 × the quota with a huge demand, through
/// a leader kill, reporting first in every round so that it reaches the new leader
/// first; lb-2 and lb-3 report a demand of 2,000/s each and hold what they were granted.
/// Their fair share is 1,000/s (3,000/s over three hosts wanting more), the liar's
/// bootstrap share 100/s (fleet_size 30): every grant they get, before the kill and from
/// the new leader, is at least 900/s. Before the claims were capped, the new leader
/// granted the liar the whole quota and the honest hosts 9/s for a lease TTL.
#[test]
fn a_host_lying_about_what_it_holds_cannot_take_the_quota_from_a_new_leader() {
    const FLEET_SIZE: u32 = 30;
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let etcd = Etcd::start(dir.path(), &loopbacks(3)).unwrap_or_else(|e| panic!("{e:#}"));
    let (Members { replicas, metrics }, dirs) =
        replicas_sized(&pki, &etcd, 0..3, FLEET_SIZE, |_| String::new());
    let mut g = Group {
        replicas,
        etcd,
        metrics,
        _dirs: dirs,
    };
    let (leader, term) = g.wait_leader(Duration::from_secs(10));
    let floor = QUOTA / 3 - QUOTA / u64::from(FLEET_SIZE);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let ports: Vec<u16> = g.replicas.iter().map(|r| r.port).collect();
    let mut hosts: Vec<Reporter> = ["lb-1", "lb-2", "lb-3"]
        .into_iter()
        .map(|host| Reporter {
            host,
            clients: runtime
                .block_on(async { ports.iter().map(|&p| grpc_client(&pki, host, p)).collect() }),
            at: leader,
            held: 0,
        })
        .collect();
    // A round every report interval, the liar first; the honest hosts' grants with the
    // term they came with.
    let round = |hosts: &mut Vec<Reporter>, log: &mut Vec<(usize, u64, u64)>| {
        runtime.block_on(async {
            hosts[0].report(100 * QUOTA, Some(100 * QUOTA)).await;
            for (i, h) in hosts.iter_mut().enumerate().skip(1) {
                if let Some((Some(rate), term)) = h.report(2 * QUOTA / 3, None).await {
                    log.push((i, rate, term));
                }
            }
        });
        std::thread::sleep(Duration::from_millis(REPORT));
    };
    // Past the first leader's learning: the shares settle at the fair split.
    let mut before = Vec::new();
    let settle = Instant::now();
    while settle.elapsed() < Duration::from_millis(LEASE + 3 * REPORT) {
        before.clear();
        round(&mut hosts, &mut before);
    }
    assert!(
        before.len() == 2 && before.iter().all(|&(_, rate, _)| rate >= floor),
        "the honest hosts' shares before the kill: {before:?} (at least {floor}/s each)"
    );

    g.replicas[leader].kill();
    let killed = Instant::now();
    let mut after = Vec::new();
    while killed.elapsed() < Duration::from_millis(ELECTION_TTL + 2 * LEASE) {
        round(&mut hosts, &mut after);
    }
    let (next, next_term) = g.wait_leader(Duration::from_secs(1));
    let from_next: Vec<&(usize, u64, u64)> =
        after.iter().filter(|&&(_, _, t)| t == next_term).collect();
    let least = from_next.iter().map(|g| g.1).min();
    eprintln!(
        "leader {leader} (term {term}) killed, replica {next} leads at term {next_term}: \
         {} grants to the honest hosts from it, the least {least:?}/s (fair 1000/s, floor {floor}/s)",
        from_next.len()
    );
    assert!(
        from_next.len() >= 2 * 4,
        "the new leader granted the honest hosts only {} times: {after:?}",
        from_next.len()
    );
    for &(host, rate, t) in &after {
        assert!(
            rate >= floor,
            "lb-{} was granted {rate}/s at term {t}, below its fair share minus the liar's \
             bootstrap share ({floor}/s): {after:?}",
            host + 1
        );
    }
}

/// Drops the traffic between a replica and the etcd address it alone uses (both ways),
/// until dropped.
fn cut_off_from_etcd(address: std::net::SocketAddr) -> Partition {
    let (ip, port) = (address.ip(), address.port());
    Partition::dropping(&[
        format!("ip daddr {ip} tcp dport {port}"),
        format!("ip saddr {ip} tcp sport {port}"),
    ])
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

    let cut = cut_off_from_etcd(g.etcd.clients[leader]);
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
        let m = scrape_replica(g.metrics[follower]);
        if m.get("limiter_allocator_quota_packets_per_second{rule=\"web\"}") == Some(&2000.0) {
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
        let m = scrape_replica(g.metrics[i]);
        assert_eq!(
            m["limiter_allocator_quota_packets_per_second{rule=\"web\"}"], 2000.0,
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
    let running = Traffic::start(&labs, 28);
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
    let rate = admitted_rate(&all, "web", STEADY_WINDOW);
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
        let sum: u64 = web_shares(&labs).iter().sum();
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

/// Replicas started on `etcd`, replica `i` (of `ids`) reaching it at its own endpoint,
/// each with metrics, and its `[election]` table ending with `extra(i)`; with the
/// directories that hold their files.
fn replicas_on(
    pki: &Pki,
    etcd: &Etcd,
    ids: std::ops::Range<usize>,
    settings: &str,
    extra: impl Fn(usize) -> String,
) -> (Members, Vec<tempfile::TempDir>) {
    replicas_built(pki, etcd, ids, 3, settings, extra)
}

/// [`replicas_on`] with the replicas' `fleet_size`.
fn replicas_sized(
    pki: &Pki,
    etcd: &Etcd,
    ids: std::ops::Range<usize>,
    fleet_size: u32,
    extra: impl Fn(usize) -> String,
) -> (Members, Vec<tempfile::TempDir>) {
    replicas_built(pki, etcd, ids, fleet_size, "", extra)
}

fn replicas_built(
    pki: &Pki,
    etcd: &Etcd,
    ids: std::ops::Range<usize>,
    fleet_size: u32,
    settings: &str,
    extra: impl Fn(usize) -> String,
) -> (Members, Vec<tempfile::TempDir>) {
    let mut replicas = Vec::new();
    let mut metrics = Vec::new();
    let mut dirs = Vec::new();
    for i in ids {
        let d = tempfile::tempdir().unwrap();
        let m = free_port();
        let election = format!(
            "[election]\netcd = [\"{}\"]\nttl_ms = {ELECTION_TTL}\n{}",
            etcd.endpoint(i),
            extra(i)
        );
        replicas.push(Allocator::build(
            d.path(),
            pki,
            Some(m),
            (LEASE, REPORT),
            fleet_size,
            settings,
            &election,
        ));
        metrics.push(m);
        dirs.push(d);
    }
    (Members { replicas, metrics }, dirs)
}

/// The etcd prefix of the sharded tests' rule → group assignment.
const SHARDS: &str = "limiter/shards";
/// The sharded tests' two groups: `web` is the first's, `cap` the second's.
const GROUPS: [&str; 2] = ["alloc-a", "alloc-b"];
const RULES: [&str; 2] = ["web", "cap"];

/// Two groups of two replicas on one etcd (group `k`'s replicas reach it at loopback
/// addresses 2k and 2k+1), every replica with both quotas in its file; the assignment
/// written before any starts (`web` → alloc-a, `cap` → alloc-b), so the file's seeds
/// change nothing. Dropped in order: the groups, then etcd.
struct Sharded {
    groups: Vec<Members>,
    etcd: Etcd,
    _dirs: Vec<tempfile::TempDir>,
}

/// One group's replicas and their metrics ports.
struct Members {
    replicas: Vec<Allocator>,
    metrics: Vec<u16>,
}

impl Members {
    fn scrape(&self, i: usize) -> BTreeMap<String, f64> {
        scrape_replica(self.metrics[i])
    }

    fn leaders(&self) -> Vec<usize> {
        (0..self.replicas.len())
            .filter(|&i| {
                self.replicas[i].child.is_some()
                    && self.scrape(i)["limiter_allocator_leader"] == 1.0
            })
            .collect()
    }

    fn wait_leader(&self, within: Duration) -> usize {
        let start = Instant::now();
        loop {
            if let [one] = self.leaders()[..] {
                return one;
            }
            assert!(
                start.elapsed() < within,
                "no single leader after {within:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn list(&self) -> String {
        let ports: Vec<String> = self
            .replicas
            .iter()
            .map(|r| format!("\"127.0.0.1:{}\"", r.port))
            .collect();
        format!("[{}]", ports.join(", "))
    }
}

impl Sharded {
    fn new(pki: &Pki, dir: &std::path::Path) -> Sharded {
        let etcd = Etcd::start(dir, &loopbacks(4)).unwrap_or_else(|e| panic!("{e:#}"));
        for (rule, group) in RULES.iter().zip(GROUPS) {
            etcd.put(&format!("{SHARDS}/{rule}"), group).unwrap();
        }
        let mut groups = Vec::new();
        let mut dirs = Vec::new();
        for (k, name) in GROUPS.iter().enumerate() {
            let (members, d) = replicas_on(pki, &etcd, 2 * k..2 * k + 2, "", |_| {
                format!("name = \"{name}\"\nshards = \"{SHARDS}\"\n")
            });
            groups.push(members);
            dirs.extend(d);
        }
        Sharded {
            groups,
            etcd,
            _dirs: dirs,
        }
    }

    /// The fleet every sharded test starts from: each group with its leader, three daemons
    /// with `secs` of traffic, both rules' shares leased and settled, and each group's
    /// leader granting its own rule and nothing of the other's.
    fn running(pki: &Pki, dir: &std::path::Path, secs: u64) -> (Sharded, Vec<Lab>, Traffic) {
        let s = Sharded::new(pki, dir);
        for g in &s.groups {
            g.wait_leader(Duration::from_secs(10));
        }
        let labs = s.hosts(pki);
        let running = Traffic::start(&labs, secs);
        let all: Vec<&Lab> = labs.iter().collect();
        wait_state(&all, "cap", "leased", Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(LEASE + 2 * REPORT));
        s.check_ownership(&BTreeMap::from([("web", 0), ("cap", 1)]));
        (s, labs, running)
    }

    /// Three daemons, each listing both groups in `[[fleet.groups]]`.
    fn hosts(&self, pki: &Pki) -> Vec<Lab> {
        (1..=3)
            .map(|i| {
                let host = format!("lb-{i}");
                let port = self.groups[0].replicas[0].port;
                let one = daemon_config_timed(&host, pki, port, &host, LEASE, REPORT);
                let single = format!("allocator = \"127.0.0.1:{port}\"\n");
                assert!(one.contains(&single), "{one}");
                let mut config = one.replace(&single, "");
                for (name, members) in GROUPS.iter().zip(&self.groups) {
                    config.push_str(&format!(
                        "[[fleet.groups]]\nname = \"{name}\"\nallocator = {}\n",
                        members.list()
                    ));
                }
                Lab::new(&config)
            })
            .collect()
    }

    /// `limiter-allocator shard …` on replica `i` of group `k`.
    fn shard(&self, k: usize, i: usize, args: &[&str]) -> std::process::Output {
        Command::new(Allocator::binary())
            .arg("shard")
            .args(args)
            .arg("--socket")
            .arg(self.groups[k].replicas[i].socket())
            .output()
            .unwrap()
    }

    /// Each group's leader grants its own rules and nothing of the other group's (its
    /// metrics: the rule assigned, granted; the other's unassigned, nothing granted).
    fn check_ownership(&self, owner: &BTreeMap<&str, usize>) {
        for (k, members) in self.groups.iter().enumerate() {
            let leaders = members.leaders();
            assert_eq!(leaders.len(), 1, "group {k}: leaders {leaders:?}");
            let m = members.scrape(leaders[0]);
            for rule in RULES {
                let assigned = m[&format!("limiter_allocator_assigned{{rule=\"{rule}\"}}")];
                let granted =
                    m[&format!("limiter_allocator_granted_packets_per_second{{rule=\"{rule}\"}}")];
                if owner[rule] == k {
                    assert_eq!(assigned, 1.0, "group {k} does not own {rule}");
                    assert!(granted > 0.0, "group {k} grants nothing of its {rule}");
                } else {
                    assert_eq!(assigned, 0.0, "group {k} owns {rule}");
                    assert_eq!(
                        granted, 0.0,
                        "group {k} grants {rule}, group {}'s",
                        owner[rule]
                    );
                }
            }
        }
    }
}

/// Samples every 50 ms for `span`: every host's every share stays leased, and no group
/// has two leaders at once.
fn hold_leased_one_leader_per_group(s: &Sharded, labs: &[&Lab], span: Duration, what: &str) {
    let until = Instant::now() + span;
    let mut samples = 0;
    while Instant::now() < until {
        for lab in labs {
            let now = states(lab);
            assert!(
                now.values().all(|s| s == "leased"),
                "{what}: a share left leased: {now:?}"
            );
        }
        for (k, g) in s.groups.iter().enumerate() {
            let leaders = g.leaders();
            assert!(
                leaders.len() <= 1,
                "{what}: group {k} has two leaders: {leaders:?}"
            );
        }
        samples += 1;
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(samples > 10, "{what}: only {samples} samples");
}

fn admitted_totals(labs: &[&Lab]) -> [u64; 2] {
    RULES.map(|rule| counters(labs, rule).iter().map(|c| c.0).sum())
}

/// Sharded allocators: two groups on one etcd, `web` granted by one and `cap` by the
/// other; each group's leader killed in turn. No host leaves `leased` for either rule,
/// each rule's admitted rate stays within 2 % of its quota through each failover, no
/// group ever has two leaders, and neither leader grants the other group's rule.
#[test]
fn sharded_groups_each_fail_over_and_no_host_leaves_leased() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let (mut s, labs, running) = Sharded::running(&pki, dir.path(), 30);
    let all: Vec<&Lab> = labs.iter().collect();
    let owner = BTreeMap::from([("web", 0), ("cap", 1)]);

    for (k, group) in GROUPS.iter().enumerate() {
        let leader = s.groups[k].wait_leader(Duration::from_secs(1));
        // Each reading's time is the middle of the reading (it asks every daemon in
        // turn): timed from before or after it, a slow reading on a loaded machine made
        // the rate 2.6 % too high.
        let read = || {
            let start = Instant::now();
            let totals = admitted_totals(&all);
            (totals, start + start.elapsed() / 2)
        };
        let (before, before_at) = read();
        s.groups[k].replicas[leader].kill();
        let what = format!("after group {group}'s leader was killed");
        hold_leased_one_leader_per_group(&s, &all, Duration::from_millis(3 * LEASE), &what);
        let (after, after_at) = read();
        let secs = (after_at - before_at).as_secs_f64();
        let through = [0, 1].map(|r| (after[r] - before[r]) as f64 / secs);
        let next = s.groups[k].wait_leader(Duration::from_secs(1));
        eprintln!(
            "group {group} leader {leader} killed, replica {next} leads; admitted web {:.0}/s, \
             cap {:.0}/s over {secs:.1} s (quota {QUOTA}/s each)",
            through[0], through[1]
        );
        assert_ne!(next, leader);
        for (rule, rate) in RULES.iter().zip(through) {
            assert!(
                (rate - QUOTA as f64).abs() <= QUOTA as f64 * 0.02,
                "{what}: {rule} admitted {rate:.0}/s, quota {QUOTA}/s"
            );
        }
        s.check_ownership(&owner);
        // The killed replica back, a follower: the next kill has a successor.
        s.groups[k].replicas[leader].start();
    }
    running.stop();
}

/// `shard assign` moves `web` from alloc-a to alloc-b under traffic: the new group's
/// leader renews what hosts hold for a lease TTL before it reallocates, so the shares in
/// force never sum above the quota and the admitted rate never rises above it by more
/// than 2 %; at the end it is within 2 % of it, and alloc-a grants `web` no more. `shard`
/// works on any replica, refuses bad names, a group without a quota for the rule, and
/// any change while etcd is down.
#[test]
fn shard_assign_moves_a_rule_under_traffic_without_over_granting() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    // Traffic for the set-up, the move's three lease TTLs and the steady window after.
    let (mut s, labs, running) = Sharded::running(&pki, dir.path(), 26);
    let all: Vec<&Lab> = labs.iter().collect();

    // On a follower of the group that gives the rule up.
    let follower = 1 - s.groups[0].wait_leader(Duration::from_secs(1));
    let out = s.shard(0, follower, &["assign", "web", GROUPS[1]]);
    assert!(
        out.status.success(),
        "shard assign: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let moved_at = Instant::now();
    let mut peak_share = 0;
    let mut peak_rate = 0.0f64;
    // Each host's count timed at the middle of its own reading: timed from after
    // reading all three, a slow reading beside CI's other lanes counted frames outside
    // the window.
    let mut last = passed_at(&all, "web");
    while moved_at.elapsed() < Duration::from_millis(3 * LEASE) {
        let sum: u64 = web_shares(&labs).iter().sum();
        peak_share = peak_share.max(sum);
        assert!(
            sum <= QUOTA,
            "web's shares in force sum to {sum}/s, quota {QUOTA}/s"
        );
        if last[0].1.elapsed() >= Duration::from_secs(2) {
            let now = passed_at(&all, "web");
            let rate = rate_between(&last, &now);
            peak_rate = peak_rate.max(rate);
            // The fleet's bound (docs/fleet.md, "The credit"): over a window of `dt`, at
            // most QUOTA × dt + the global burst + credit_pct % of one report interval's
            // quota. A move re-grants every share; while the shares in force sum below
            // the quota the unused part becomes credit, and a host's bucket is resized
            // with its share. (A 2 % bound on 2 s windows, which this check once was, is
            // tighter than what the fleet promises: beside CI's other lanes two windows
            // read 3,101/s and 3,068/s.)
            let dt = last
                .iter()
                .zip(&now)
                .map(|((_, b), (_, a))| (*a - *b).as_secs_f64())
                .fold(f64::INFINITY, f64::min);
            let credit_cap = (QUOTA * REPORT / 1000) as f64 * DEFAULT_CREDIT_PCT as f64 / 100.0;
            let bound = QUOTA as f64 + (BURST as f64 + credit_cap) / dt;
            assert!(
                rate <= bound,
                "web admitted {rate:.0}/s over {dt:.2} s during the move, above the fleet's \
                 bound of {bound:.0}/s (quota {QUOTA}/s, burst {BURST}, credit cap \
                 {credit_cap:.0})"
            );
            last = now;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let end = admitted_rate(&all, "web", STEADY_WINDOW);
    eprintln!(
        "web moved to {}: shares in force peaked at {peak_share}/s, admitted peaked at \
         {peak_rate:.0}/s (2 s windows), {end:.0}/s at the end (quota {QUOTA}/s)",
        GROUPS[1]
    );
    assert!(
        (end - QUOTA as f64).abs() <= QUOTA as f64 * 0.02,
        "web admitted {end:.0}/s after the move, quota {QUOTA}/s"
    );
    assert!(labs.iter().all(|l| states(l)["web"] == "leased"));
    s.check_ownership(&BTreeMap::from([("web", 1), ("cap", 1)]));
    running.stop();

    // `shard list` on any replica of either group.
    let out = s.shard(1, 0, &["list"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        list,
        serde_json::json!([
            { "rule": "cap", "group": GROUPS[1] },
            { "rule": "web", "group": GROUPS[1] },
        ])
    );
    let refused = |s: &Sharded, args: &[&str], what: &[&str]| {
        let out = s.shard(0, 0, args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "shard {args:?} succeeded");
        for w in what {
            assert!(stderr.contains(w), "shard {args:?}: {stderr}");
        }
    };
    refused(&s, &["assign", "a b", GROUPS[0]], &["rule name"]);
    refused(&s, &["assign", "web", "alloc/c"], &["group name"]);
    refused(&s, &["assign", "web", "alloc-c"], &["no quota", "alloc-c"]);
    s.etcd.kill();
    refused(
        &s,
        &["assign", "web", GROUPS[0]],
        &["rule not moved", "etcd"],
    );
    refused(&s, &["list"], &["etcd"]);
}

/// The shares in force of `rule` (rates), summed over `labs`.
fn shares_in_force(labs: &[&Lab], rule: &str) -> u64 {
    labs.iter()
        .map(|lab| lab.rule_stats(rule)["rate"].as_u64().unwrap())
        .sum()
}

/// Sharded allocators, the etcd failures of one group: its leader cut off from etcd
/// (nftables) steps down before its group's other replica leads, while the other group
/// keeps its leader and no host leaves `leased` for either rule; then every replica of
/// both groups restarted at once: the new leaders learn what hosts hold, so neither
/// rule's shares in force ever sum above its quota, and each group grants its own rule
/// again.
#[test]
fn a_sharded_leader_cut_off_from_etcd_steps_down_and_a_full_restart_never_over_grants() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let (mut s, labs, running) = Sharded::running(&pki, dir.path(), 40);
    let all: Vec<&Lab> = labs.iter().collect();
    let owner = BTreeMap::from([("web", 0), ("cap", 1)]);
    let leaders: Vec<usize> = s
        .groups
        .iter()
        .map(|g| g.wait_leader(Duration::from_secs(1)))
        .collect();

    // Group 0's leader reaches etcd at loopback address 2 × 0 + its index.
    let cut = cut_off_from_etcd(s.etcd.clients[leaders[0]]);
    let cut_at = Instant::now();
    let mut stepped_down = None;
    let mut next = None;
    while cut_at.elapsed() < Duration::from_secs(10) && next.is_none() {
        let a = s.groups[0].leaders();
        assert!(a.len() <= 1, "group {} has two leaders: {a:?}", GROUPS[0]);
        if stepped_down.is_none() && !a.contains(&leaders[0]) {
            stepped_down = Some(cut_at.elapsed());
        }
        if let Some(&other) = a.iter().find(|&&i| i != leaders[0]) {
            assert!(
                stepped_down.is_some(),
                "replica {other} leads while the cut-off one does"
            );
            next = Some((other, cut_at.elapsed()));
        }
        assert_eq!(
            s.groups[1].leaders(),
            [leaders[1]],
            "group {}'s leader changed over the other group's cut",
            GROUPS[1]
        );
        for lab in &all {
            let now = states(lab);
            assert!(
                now.values().all(|s| s == "leased"),
                "a share left leased during the cut: {now:?}"
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let stepped_down = stepped_down.expect("the cut-off leader never stepped down");
    let (other, took) = next.expect("no other replica of the cut-off group leads within 10 s");
    eprintln!(
        "group {} leader {} cut off from etcd: stepped down after {stepped_down:?}, replica \
         {other} leads after {took:?}; group {} kept its leader",
        GROUPS[0], leaders[0], GROUPS[1]
    );
    assert!(
        stepped_down <= Duration::from_millis(ELECTION_TTL * 2 / 3 + 300),
        "{stepped_down:?}"
    );
    hold_leased_one_leader_per_group(&s, &all, Duration::from_millis(LEASE), "after the cut");
    s.check_ownership(&owner);
    drop(cut);

    // Every replica of both groups at once.
    for g in &mut s.groups {
        for r in &mut g.replicas {
            r.kill();
        }
    }
    for g in &mut s.groups {
        for r in &mut g.replicas {
            r.start();
        }
    }
    let until = Instant::now() + Duration::from_millis(2 * LEASE);
    let mut peak = [0u64; 2];
    while Instant::now() < until {
        for (k, rule) in RULES.iter().enumerate() {
            let sum = shares_in_force(&all, rule);
            peak[k] = peak[k].max(sum);
            assert!(
                sum <= QUOTA,
                "after a full restart {rule}'s shares in force sum to {sum}/s, quota {QUOTA}/s"
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    for g in &s.groups {
        g.wait_leader(Duration::from_secs(5));
    }
    for rule in RULES {
        wait_state(&all, rule, "leased", Duration::from_secs(5));
    }
    std::thread::sleep(Duration::from_millis(LEASE + 2 * REPORT));
    eprintln!(
        "every replica of both groups restarted: shares in force peaked at web {}/s, cap {}/s \
         (quota {QUOTA}/s each)",
        peak[0], peak[1]
    );
    s.check_ownership(&owner);
    running.stop();
}
