//! The fleet with real processes: an allocator and three daemons, each daemon on its own
//! veth pair with traffic through it, talking mutual-TLS gRPC over loopback. Times are
//! scaled down by configuration (lease 1.5 s, reports every 300 ms, STICKY for 3 s).
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

mod common;

use std::{
    net::Ipv4Addr,
    process::Command,
    time::{Duration, Instant},
};

use common::{fleet::*, join, pki::Pki, start_all, wait_for, Lab, Sender};
use limiter_tests::{
    frame::FrameBuilder,
    netns::{ifindex, spawn_in_netns},
    scenario::PEER_V4,
    traffic::{PacketSocket, SendPlan, SendReport},
};

#[test]
fn the_fleet_shares_the_quota_and_degrades_on_schedule() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let mut allocator = Allocator::new(dir.path(), &pki);
    let labs = hosts(3, &pki, allocator.port);
    let mut daemons = start_all(&labs);
    let all: Vec<&Lab> = labs.iter().collect();
    // Each host is offered 2000/s per rule: 6000/s fleet-wide against a 3000/s quota.
    let senders: Vec<_> = labs
        .iter()
        .map(|lab| lab.send_stoppable(traffic(lab, 2000, Duration::from_secs(16))))
        .collect();

    let leased_after = wait_state(&all, "web", "leased", Duration::from_secs(8));
    let status = labs[0].json(&["status", "--json"]);
    assert_eq!(status["allocator"], format!("127.0.0.1:{}", allocator.port));
    let web = status["shares"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["rule"] == "web")
        .unwrap();
    assert_eq!(
        web["state"], "leased",
        "status shows the share state: {status}"
    );
    std::thread::sleep(Duration::from_secs(1));
    let rate = admitted_rate(&all, "web", Duration::from_secs(3));
    eprintln!("leased after {leased_after:?}; global admitted {rate:.0}/s vs quota {QUOTA}");
    assert!(
        (rate - QUOTA as f64).abs() <= 0.02 * QUOTA as f64,
        "admitted {rate:.0}/s"
    );

    // The allocator dies: STICKY once the lease lapses, still at the last shares.
    allocator.kill();
    let killed = Instant::now();
    wait_state(
        &all,
        "web",
        "sticky",
        Duration::from_millis(LEASE_MS + 1500),
    );
    let sticky_at = killed.elapsed();
    assert_eq!(states(&labs[0])["cap"], "sticky");
    let sticky_rate = admitted_rate(&all, "web", Duration::from_millis(1000));
    eprintln!("sticky after {sticky_at:?}: admitted {sticky_rate:.0}/s");
    assert!(
        sticky_rate <= QUOTA as f64 * 1.02,
        "sticky shares exceed the quota: {sticky_rate:.0}"
    );
    // A daemon killed mid-outage: its kernel still fails open on schedule.
    daemons.pop().unwrap().kill9();

    // FAIL_OPEN for the open rule after sticky_max; the static cap holds.
    let open_after = wait_state(&all, "web", "fail_open", Duration::from_secs(STICKY_S + 3));
    eprintln!("fail_open {:?} after the allocator died", killed.elapsed());
    // Not before its schedule: the lease runs from the last grant, which came up to a
    // report interval (and a round trip) before the kill; sticky_max from the lease's end.
    assert!(
        killed.elapsed() >= Duration::from_millis(LEASE_MS + STICKY_S * 1000 - REPORT_MS - 50),
        "fail_open {:?} after the kill, sticky {sticky_at:?} after it",
        killed.elapsed()
    );
    let _ = open_after;
    let web_before = counters(&all, "web");
    let cap_before = counters(&all, "cap");
    std::thread::sleep(Duration::from_millis(700));
    let web_after = counters(&all, "web");
    let cap_after = counters(&all, "cap");
    for (i, (b, a)) in web_before.iter().zip(&web_after).enumerate() {
        assert_eq!(a.1, b.1, "host {i} still drops web frames in FAIL_OPEN");
    }
    let cap_dropped: u64 = cap_after
        .iter()
        .zip(&cap_before)
        .map(|(a, b)| a.1 - b.1)
        .sum();
    assert!(cap_dropped > 0, "the static cap stopped limiting");
    assert!(labs.iter().all(|l| states(l)["cap"] == "sticky"));

    // The allocator comes back: LEASED again, and no burst over the quota. While it
    // learns, the FAIL_OPEN hosts (holding nothing) get a joiner's share (quota ÷ the
    // fleet_size of 3 the hosts report: the allocator's file names none) with their
    // first report, so they stop passing everything after
    // one report interval, not after the lease TTL of learning: the first second stays
    // within 10 % of the quota (they offer 4000/s).
    allocator.start();
    let live: Vec<&Lab> = labs.iter().take(2).collect();
    let returned = admitted_rate(&live, "web", Duration::from_millis(1000));
    eprintln!("the first second after the allocator's return: {returned:.0}/s");
    assert!(
        returned <= QUOTA as f64 * 1.10,
        "{returned:.0}/s in the first second after the allocator's return"
    );
    wait_state(
        &live,
        "web",
        "leased",
        Duration::from_millis(LEASE_MS * 2 + 2000),
    );
    let recovered = admitted_rate(&live, "web", Duration::from_millis(1500));
    eprintln!("recovered: two live hosts admit {recovered:.0}/s");
    assert!(
        recovered <= QUOTA as f64 * 1.02,
        "over quota after recovery: {recovered:.0}"
    );
    for s in senders {
        s.stop();
    }
    for d in daemons {
        d.stop();
    }
}

/// An allocator whose file names another fleet_size than the hosts' sizes a joiner's
/// share by its own, and says so in every reply: the host shows it (status, metric) and
/// the allocator counts the reports that disagree. Old code: nothing compared them (a
/// fleet of 4 against the default 500 ran at quota ÷ 500 for a lease TTL unnoticed).
#[test]
fn an_allocator_naming_another_fleet_size_is_reported_by_the_hosts() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let metrics_port = free_port();
    let allocator = Allocator::sized(
        dir.path(),
        &pki,
        Some(metrics_port),
        (LEASE_MS, REPORT_MS),
        500,
        "",
    );
    let lab = Lab::new(&daemon_config("lb-1", &pki, allocator.port, "lb-1"));
    let daemon = lab.start();
    let start = Instant::now();
    let disagreement = loop {
        let status = lab.json(&["status", "--json"]);
        let d = status["fleet"]["fleet_size_disagreement"].clone();
        if !d.is_null() {
            break d;
        }
        assert!(
            start.elapsed() < Duration::from_secs(8),
            "no fleet_size disagreement in the status: {status}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(
        disagreement,
        serde_json::json!({"host": 3, "allocator": 500}),
        "the daemon's config has fleet_size = 3"
    );
    assert_eq!(
        scrape(lab.metrics_port)["limiter_fleet_size_disagreement"],
        1.0
    );
    assert!(scrape(metrics_port)["limiter_allocator_fleet_size_disagreements_total"] >= 1.0);
    daemon.stop();
}

#[test]
fn a_client_certificate_from_another_ca_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let allocator = Allocator::new(dir.path(), &pki);
    let good = Lab::new(&daemon_config("lb-1", &pki, allocator.port, "lb-1"));
    let rogue = Lab::new(&daemon_config("lb-rogue", &pki, allocator.port, "rogue"));
    let (g, r) = (good.start(), rogue.start());
    wait_state(&[&good], "web", "leased", Duration::from_secs(8));
    std::thread::sleep(Duration::from_millis(3 * REPORT_MS));
    assert_eq!(
        states(&rogue)["web"],
        "bootstrap",
        "the rogue host got a grant"
    );
    g.stop();
    r.stop();
}

/// Every sample of every host's shares until `until` (every 50 ms): the first that is
/// not leased, if any.
fn first_not_leased(labs: &[Lab], until: Instant) -> Option<String> {
    while Instant::now() < until {
        for (i, lab) in labs.iter().enumerate() {
            let now = states(lab);
            if now.values().any(|s| s != "leased") {
                return Some(format!("lb-{}: {now:?}", i + 1));
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

/// Whether a new connection to the allocator at `port` completes mutual TLS (with lb-1's
/// files of the moment): a report of an unknown protocol version must be answered with
/// INVALID_ARGUMENT, which only an authenticated peer gets.
fn handshake_completes(pki: &Pki, port: u16) -> Result<(), String> {
    use limiter_proto::pb::{allocator_client::AllocatorClient, ReportRequest};
    use tonic::transport::Endpoint;

    let pair = pki.pair("lb-1");
    let tls = limiter_proto::client_tls(
        &limiter_proto::TlsFiles {
            ca: &pki.ca(),
            cert: &pair.cert,
            key: &pair.key,
        },
        "limiter-allocator",
    )
    .unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let channel = Endpoint::from_shared(format!("https://127.0.0.1:{port}"))
            .unwrap()
            .tls_config(tls)
            .unwrap()
            .timeout(Duration::from_secs(2))
            .connect_lazy();
        let report = ReportRequest {
            version: 2,
            ..ReportRequest::one_rule("lb-1", "web", 1, 0)
        };
        match AllocatorClient::new(channel).report(report).await {
            Err(status) if status.code() == tonic::Code::InvalidArgument => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
}

/// Short-lived certificates renewed on disk under traffic: the allocator presents its
/// renewed certificate to new connections, and after a restart of the allocator past the
/// old certificates' expiry the daemons reconnect with theirs. No share ever leaves
/// LEASED. (Before, both ends read their files once at start: the running allocator
/// presented its expired certificate, and every daemon its own at the reconnect, so the
/// whole fleet went STICKY, then FAIL_OPEN.)
#[test]
fn renewed_certificates_are_used_from_the_next_handshake_without_a_restart() {
    // Long enough for the setup (a few seconds); every second of it is test time.
    const VALIDITY: Duration = Duration::from_secs(16);
    const LEASE: u64 = 3000;
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let mut expiry = std::time::SystemTime::now() + Duration::from_secs(3600);
    for file in ["allocator", "lb-1", "lb-2"] {
        expiry = expiry.min(pki.renew(file, VALIDITY).unwrap());
    }
    let metrics = free_port();
    let mut allocator = Allocator::timed(dir.path(), &pki, Some(metrics), LEASE, REPORT_MS);
    let labs = timed_hosts(2, &pki, allocator.port, LEASE, REPORT_MS);
    let daemons = start_all(&labs);
    let all: Vec<&Lab> = labs.iter().collect();
    let left = expiry.duration_since(std::time::SystemTime::now()).unwrap();
    // Through the expiry, the restart and the watch after it.
    let traffic_for = left + Duration::from_millis(2000 + 3 * LEASE + 1000);
    let senders: Vec<_> = labs
        .iter()
        .map(|lab| lab.send_stoppable(traffic(lab, 1000, traffic_for)))
        .collect();
    wait_state(&all, "web", "leased", Duration::from_secs(8));

    // A renewal gone wrong (half a certificate): new connections keep the last good one,
    // and the allocator counts it.
    let server = pki.pair("allocator");
    let good = std::fs::read_to_string(&server.cert).unwrap();
    std::fs::write(&server.cert, &good[..good.len() / 2]).unwrap();
    handshake_completes(&pki, allocator.port).expect("a half-written certificate on disk");
    let failures = "limiter_allocator_tls_reload_failures_total";
    assert_eq!(scrape(metrics).get(failures), Some(&1.0), "{failures}");
    std::fs::write(&server.cert, &good).unwrap();
    // Renewed under traffic, before the expiry, in place (the certificate first: a
    // handshake in between sees a key that does not match and keeps the old pair).
    for file in ["allocator", "lb-1", "lb-2"] {
        pki.renew(file, Duration::from_secs(120)).unwrap();
    }
    let left = expiry.duration_since(std::time::SystemTime::now()).unwrap();
    eprintln!("renewed {left:?} before the old certificates expire");
    assert!(
        left >= Duration::from_secs(3),
        "the setup took too long: raise VALIDITY"
    );
    let mut problems = Vec::new();
    // Held connections: nothing changes for them across the expiry.
    let past_expiry = Instant::now() + left + Duration::from_secs(2);
    if let Some(state) = first_not_leased(&labs, past_expiry) {
        problems.push(format!("before the restart, a share left leased: {state}"));
    }
    std::thread::sleep(past_expiry.saturating_duration_since(Instant::now()));
    // A new connection to the running allocator, which started with the old certificate.
    if let Err(e) = handshake_completes(&pki, allocator.port) {
        problems.push(format!(
            "a new connection to the running allocator failed past the expiry: {e}"
        ));
    }
    let reloads = scrape(metrics)
        .get("limiter_allocator_tls_reloads_total")
        .copied();
    if reloads.is_none_or(|n| n < 1.0) {
        problems.push(format!(
            "the allocator reloaded its files {reloads:?} times"
        ));
    }
    // The allocator restarts past the expiry: every daemon reconnects.
    allocator.kill();
    allocator.start();
    let restarted = Instant::now();
    if let Some(state) = first_not_leased(&labs, restarted + Duration::from_millis(3 * LEASE)) {
        problems.push(format!(
            "{:?} after the allocator's restart past the expiry, a share left leased: {state}",
            restarted.elapsed()
        ));
    }
    let ok = problems.is_empty();
    for s in senders {
        s.stop();
    }
    for d in daemons {
        d.stop();
    }
    assert!(ok, "{}", problems.join("\n"));
}

/// The host whose share is more than twice every other's, if any.
fn dominant(shares: &[u64]) -> Option<usize> {
    (0..shares.len()).find(|&i| {
        shares
            .iter()
            .enumerate()
            .all(|(j, s)| j == i || shares[i] > 2 * s)
    })
}

#[test]
fn shares_follow_a_demand_shift() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let allocator = Allocator::new(dir.path(), &pki);
    let labs = hosts(3, &pki, allocator.port);
    let daemons = start_all(&labs);
    let all: Vec<&Lab> = labs.iter().collect();
    wait_state(&all, "web", "leased", Duration::from_secs(8));
    // Phase 1: lb-1 is busy (2500/s), the others light (500/s). Phase 2: lb-3 is busy.
    let phase = Duration::from_secs(4);
    let plan = |lab: &Lab, rate: u64| {
        let mut p = traffic(lab, rate, phase);
        p.frames.truncate(1);
        p.rate = Some(rate);
        p.count = rate * phase.as_secs();
        p
    };
    let first: Vec<_> = [2500, 500, 500]
        .iter()
        .zip(&labs)
        .map(|(r, lab)| lab.send_stoppable(plan(lab, *r)))
        .collect();
    std::thread::sleep(Duration::from_secs(3));
    let before = web_shares(&labs);
    // Phase 1 ends where its shares were read.
    for s in first {
        s.stop();
    }
    let shifted = Instant::now();
    let second: Vec<_> = [500, 500, 2500]
        .iter()
        .zip(&labs)
        .map(|(r, lab)| lab.send_stoppable(plan(lab, *r)))
        .collect();
    let mut followed = None;
    while shifted.elapsed() < Duration::from_secs(3) {
        let shares = web_shares(&labs);
        if dominant(&shares) == Some(2) {
            followed = Some(shifted.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let after = web_shares(&labs);
    eprintln!("shares before {before:?}, after {after:?}, followed in {followed:?}");
    // The busy host holds the bulk of the quota (more than twice any other's share).
    assert_eq!(dominant(&before), Some(0), "phase 1 shares {before:?}");
    let followed = followed.expect("shares did not follow the shift within 3 s");
    // One interval for the new demand to be measured, then three to converge.
    assert!(
        followed <= Duration::from_millis(4 * REPORT_MS + 150),
        "followed in {followed:?} (report interval {REPORT_MS} ms)"
    );
    for (b, a) in before.iter().zip(&after) {
        assert!(*b <= QUOTA && *a <= QUOTA);
    }
    assert!(before.iter().sum::<u64>() <= QUOTA && after.iter().sum::<u64>() <= QUOTA);
    for s in second {
        s.stop();
    }
    for d in daemons {
        d.stop();
    }
}

#[test]
fn a_partitioned_host_degrades_on_schedule_while_the_others_stay_leased() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let allocator = Allocator::new(dir.path(), &pki);
    let labs: Vec<Lab> = (1..=3)
        .map(|i| {
            Lab::new(&daemon_config_bound(
                &format!("lb-{i}"),
                &pki,
                allocator.port,
                &format!("127.0.0.{}", i + 1),
            ))
        })
        .collect();
    let daemons = start_all(&labs);
    let all: Vec<&Lab> = labs.iter().collect();
    wait_state(&all, "web", "leased", Duration::from_secs(8));
    let cut = Partition::new("127.0.0.3", allocator.port);
    let cut_at = Instant::now();
    wait_state(
        &[&labs[1]],
        "web",
        "sticky",
        Duration::from_millis(LEASE_MS + 1500),
    );
    let sticky_at = cut_at.elapsed();
    wait_state(
        &[&labs[1]],
        "web",
        "fail_open",
        Duration::from_secs(STICKY_S + 3),
    );
    let open_at = cut_at.elapsed();
    eprintln!("partitioned host: sticky after {sticky_at:?}, fail_open after {open_at:?}");
    assert!(sticky_at <= Duration::from_millis(LEASE_MS + 500));
    assert!(open_at >= Duration::from_millis(STICKY_S * 1000));
    assert_eq!(
        states(&labs[1])["cap"],
        "sticky",
        "the static cap must hold"
    );
    assert_eq!(states(&labs[0])["web"], "leased");
    assert_eq!(states(&labs[2])["web"], "leased");
    drop(cut);
    wait_state(&[&labs[1]], "web", "leased", Duration::from_secs(5));
    for d in daemons {
        d.stop();
    }
}

#[test]
fn the_allocator_refuses_bad_peers_and_bad_reports() {
    use limiter_proto::pb::{allocator_client::AllocatorClient, ReportRequest, RuleReport};
    use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};

    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let allocator = Allocator::new(dir.path(), &pki);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let url = format!("https://127.0.0.1:{}", allocator.port);
    let report = |rules: usize, version: u32| ReportRequest {
        version,
        host: "lb-1".into(),
        rules: (0..rules)
            .map(|i| RuleReport {
                rule: if i == 0 {
                    "web".into()
                } else {
                    format!("r{i}")
                },
                demand: 100,
                held: 0,
                ..RuleReport::default()
            })
            .collect(),
        fleet_size: 0,
    };
    runtime.block_on(async {
        // No client certificate: the TLS handshake is refused.
        let no_cert = ClientTlsConfig::new()
            .domain_name("limiter-allocator")
            .ca_certificate(Certificate::from_pem(std::fs::read(pki.ca()).unwrap()));
        let channel = Endpoint::from_shared(url.clone())
            .unwrap()
            .tls_config(no_cert)
            .unwrap()
            .timeout(Duration::from_secs(2))
            .connect_lazy();
        let refused = AllocatorClient::new(channel).report(report(1, 1)).await;
        assert!(
            refused.is_err(),
            "a client without a certificate got an answer"
        );

        let pair = pki.pair("lb-1");
        let tls = limiter_proto::client_tls(
            &limiter_proto::TlsFiles {
                ca: &pki.ca(),
                cert: &pair.cert,
                key: &pair.key,
            },
            "limiter-allocator",
        )
        .unwrap();
        let channel = Endpoint::from_shared(url)
            .unwrap()
            .tls_config(tls)
            .unwrap()
            .connect_lazy();
        let mut client = AllocatorClient::new(channel).max_encoding_message_size(4 << 20);
        let bad_version = client.report(report(1, 2)).await.unwrap_err();
        assert_eq!(bad_version.code(), tonic::Code::InvalidArgument);
        assert!(
            bad_version.message().contains("version 2"),
            "{}",
            bad_version.message()
        );
        let too_many = client.report(report(2000, 1)).await.unwrap_err();
        assert_eq!(
            too_many.code(),
            tonic::Code::InvalidArgument,
            "{}",
            too_many.message()
        );
        let mut huge = report(1, 1);
        huge.host = "h".repeat(400_000);
        let oversized = client.report(huge).await.unwrap_err();
        assert!(
            matches!(
                oversized.code(),
                tonic::Code::OutOfRange | tonic::Code::ResourceExhausted
            ),
            "{oversized:?}"
        );
        // And the allocator is still serving.
        assert!(client.report(report(1, 1)).await.is_ok());
    });
}

#[test]
fn quota_changes_on_the_allocator_reach_the_fleet_and_metrics_show_it() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let metrics_port = free_port();
    // Both metrics ports taken at start (an old process that has not let go, another
    // exporter): neither process stops for it, and both listen once the port is free.
    let take = |port: u16| std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    let mut taken = vec![take(metrics_port)];
    let allocator = Allocator::with_metrics(dir.path(), &pki, Some(metrics_port));
    let labs = hosts(2, &pki, allocator.port);
    taken.push(take(labs[0].metrics_port));
    let daemons = start_all(&labs);
    let all: Vec<&Lab> = labs.iter().collect();
    // Long enough for the lease, the metrics ports' 5 s retry, the scrapes and the cut's
    // measurement under a loaded CI machine; checked below, not assumed.
    let sending = Duration::from_secs(20);
    let sent_from = Instant::now();
    let senders: Vec<_> = labs
        .iter()
        .map(|lab| lab.send_stoppable(traffic(lab, 2500, sending)))
        .collect();
    wait_state(&all, "web", "leased", Duration::from_secs(8));
    drop(taken);
    let freed = Instant::now();
    for port in [metrics_port, labs[0].metrics_port] {
        // Tried again every 5 s.
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                freed.elapsed() < Duration::from_secs(7),
                "nothing listens on metrics port {port} {:?} after it was freed",
                freed.elapsed()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    std::thread::sleep(Duration::from_millis(1000));
    // What operators' tools read: promtool finds nothing on the allocator's endpoint nor
    // on a daemon's in fleet mode (its share state, grants refused).
    limiter_tests::prometheus::assert_promtool_clean("the allocator", &scrape_text(metrics_port));
    limiter_tests::prometheus::assert_promtool_clean(
        "a daemon in fleet mode",
        &scrape_text(labs[0].metrics_port),
    );
    let m = scrape(metrics_port);
    assert!(
        m.iter()
            .any(|(k, &v)| k.starts_with("limiter_allocator_build_info{version=\"") && v == 1.0),
        "{m:?}"
    );
    assert!(m["process_start_time_seconds"] > 0.0);
    assert_eq!(
        m["limiter_allocator_quota_packets_per_second{rule=\"web\"}"],
        QUOTA as f64
    );
    let granted = m["limiter_allocator_granted_packets_per_second{rule=\"web\"}"];
    assert!(
        granted <= QUOTA as f64 && granted >= QUOTA as f64 * 0.9,
        "granted {granted}"
    );
    assert_eq!(m["limiter_allocator_hosts{rule=\"web\"}"], 2.0);
    // The allocator's file names no fleet_size: it uses the hosts' own, nobody disagrees.
    assert_eq!(m["limiter_allocator_fleet_size_disagreements_total"], 0.0);
    assert_eq!(
        scrape(labs[0].metrics_port)["limiter_fleet_size_disagreement"],
        0.0
    );
    let fairness = m["limiter_allocator_fairness{rule=\"web\"}"];
    assert!(fairness > 0.95, "two equal hosts, fairness {fairness}");

    let out = Command::new(Allocator::binary())
        .args(["quota", "set", "web", "--rate", "1500", "--socket"])
        .arg(dir.path().join("allocator.sock"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::thread::sleep(Duration::from_millis(4 * REPORT_MS));
    // Over 5 s, not 1.5: each host's count is timed at the middle of its reading, which
    // beside CI's other lanes takes up to ≈ 100 ms, so over 1.5 s the rate was uncertain
    // by more than the ±2 % checked (a CI run read 1,534/s).
    let rate = admitted_rate(&all, "web", Duration::from_secs(5));
    eprintln!(
        "after quota set 1500: admitted {rate:.0}/s, metrics granted before {granted}, \
         measured until {:?} into the traffic",
        sent_from.elapsed()
    );
    assert!(
        sent_from.elapsed() < sending,
        "the measurement ended {:?} after the traffic started, past its {sending:?}: \
         the admitted rate {rate:.0}/s includes time without traffic",
        sent_from.elapsed()
    );
    assert!(
        (rate - 1500.0).abs() <= 1500.0 * 0.02,
        "admitted {rate:.0}/s after the cut"
    );
    assert_eq!(
        scrape(metrics_port)["limiter_allocator_quota_packets_per_second{rule=\"web\"}"],
        1500.0
    );
    let bad = Command::new(Allocator::binary())
        .args(["quota", "set", "web", "--rate", "0", "--socket"])
        .arg(dir.path().join("allocator.sock"))
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("rate must be at least 1"));
    for s in senders {
        s.stop();
    }
    for d in daemons {
        d.stop();
    }
}

#[test]
fn refusals_on_an_unsaturated_share_send_a_report_at_once() {
    // One host, reporting every 2 s: alone, its share is the whole quota, and the grant
    // says `saturated: false` (it offers nothing). Offered twice the quota, it refuses
    // frames, so it reports at once instead of at its next report, up to 2 s later.
    const LEASE: u64 = 4500;
    const INTERVAL: u64 = 2000;
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let metrics_port = free_port();
    let allocator = Allocator::timed(dir.path(), &pki, Some(metrics_port), LEASE, INTERVAL);
    let lab = Lab::new(&daemon_config_timed(
        "lb-1",
        &pki,
        allocator.port,
        "lb-1",
        LEASE,
        INTERVAL,
    ));
    let daemon = lab.start();
    // The allocator learns for a lease TTL after its start (a joiner's share meanwhile),
    // then grants the whole quota at a report.
    wait_state(&[&lab], "web", "leased", Duration::from_secs(15));
    wait_web_share(&lab, QUOTA, Duration::from_millis(LEASE + 3 * INTERVAL));
    let reports = || scrape(metrics_port)["limiter_allocator_reports_total"];
    let saturated = || scrape(metrics_port)["limiter_allocator_saturated_hosts{rule=\"web\"}"];
    assert_eq!(saturated(), 0.0);
    // The phase of the regular reports: wait for one to land.
    let before = reports();
    let waiting = Instant::now();
    while reports() == before {
        assert!(waiting.elapsed() < Duration::from_millis(INTERVAL + 1000));
        std::thread::sleep(Duration::from_millis(10));
    }
    let regular = Instant::now();
    let after_regular = reports();
    // Without refusals nothing comes between two regular reports.
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(reports(), after_regular, "a report without refusals");
    let mut plan = traffic(&lab, 2 * QUOTA, Duration::from_secs(3));
    plan.frames.truncate(1);
    plan.rate = Some(2 * QUOTA);
    plan.count = 2 * QUOTA * 3;
    let sender = lab.send_stoppable(plan);
    // The next regular report is due INTERVAL after the last one; the early one comes
    // within the daemon's 200 ms gap and its 50 ms loop of the first refusals.
    while reports() == after_regular {
        assert!(
            regular.elapsed() < Duration::from_millis(INTERVAL - 300),
            "no report before the regular one, {:?} after it",
            regular.elapsed()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let early = regular.elapsed();
    // The allocator knows the demand now: the host is saturated at the whole quota.
    while saturated() != 1.0 {
        assert!(
            regular.elapsed() < Duration::from_millis(INTERVAL - 100),
            "the allocator did not learn the demand before the regular report"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    eprintln!(
        "early report {early:?} after the last regular one (traffic from 400 ms); \
         saturated at {:?}",
        regular.elapsed()
    );
    assert_eq!(web_share(&lab), QUOTA);
    sender.stop();
    daemon.stop();
    drop(allocator);
}

#[test]
fn a_zero_share_is_closed_and_its_first_refusals_ask_for_a_real_one() {
    // Two hosts reporting every 2 s. lb-1 offers three times the quota, lb-2 nothing: lb-2's
    // share is 0, enforced as a closed limit (nothing passes), shown as rate 0, leased.
    // Its grant says `saturated: false` (no demand), so when traffic reaches it, its
    // first refusals send a report at once; it gets a real share once lb-1 has renewed.
    const LEASE: u64 = 4500;
    const INTERVAL: u64 = 2000;
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let metrics_port = free_port();
    let allocator = Allocator::timed(dir.path(), &pki, Some(metrics_port), LEASE, INTERVAL);
    let labs = timed_hosts(2, &pki, allocator.port, LEASE, INTERVAL);
    let daemons = start_all(&labs);
    let all: Vec<&Lab> = labs.iter().collect();
    wait_state(&all, "web", "leased", Duration::from_secs(15));
    let web = |lab: &Lab, rate: u64, secs: u64| {
        let mut p = traffic(lab, rate, Duration::from_secs(secs));
        p.frames.truncate(1);
        p.rate = Some(rate);
        p.count = rate * secs;
        p
    };
    let busy = labs[0].send_stoppable(web(&labs[0], 3 * QUOTA, 16));
    // lb-2 closed: the whole quota on lb-1.
    let start = Instant::now();
    while !(web_share(&labs[1]) == 0 && web_share(&labs[0]) == QUOTA) {
        assert!(
            start.elapsed() < Duration::from_secs(8),
            "shares {:?}",
            labs.iter().map(web_share).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let stats = labs[1].rule_stats("web");
    assert_eq!(
        (&stats["state"], &stats["rate"], &stats["burst"]),
        (
            &serde_json::json!("leased"),
            &serde_json::json!(0),
            &serde_json::json!(0)
        ),
        "{stats}"
    );
    let explain = labs[1].json(&[
        "explain",
        "--src",
        "198.18.0.1",
        "--dst",
        "198.18.0.2:9",
        "--proto",
        "udp",
        "--json",
    ]);
    assert_eq!(explain["verdict"], "drop", "{explain}");
    assert_eq!(explain["aggregate"]["closed"], true, "{explain}");
    assert!(
        explain["reason"].as_str().unwrap().contains("share"),
        "{explain}"
    );
    let metric = |name: &str| scrape(metrics_port)[name];
    let granted = || metric("limiter_allocator_granted_packets_per_second{rule=\"web\"}");
    // The fairness index counts hosts with demand: 1 while only lb-1 has any.
    let fairness = || metric("limiter_allocator_fairness{rule=\"web\"}");
    // The allocator makes its rule metrics at most every 500 ms: the hosts can hold the
    // split before the metric shows it.
    wait_for(
        "the granted metric to count the zero share as nothing (the quota in all)",
        Duration::from_millis(2000),
        || match granted() {
            g if g == QUOTA as f64 => Ok(()),
            g => Err(format!("granted {g}/s of {QUOTA}")),
        },
    );
    // The metric reads lb-1's latest smoothed demand against its share; one report in which
    // the sender offered less than the quota (a sender descheduled on a busy machine) reads
    // unsaturated while the shares the hosts hold still show the split. lb-1 offers 3 × the
    // quota, so within two report intervals it must read saturated.
    let saturated = || metric("limiter_allocator_saturated_hosts{rule=\"web\"}");
    let start = Instant::now();
    while saturated() != 1.0 {
        assert!(
            start.elapsed() < Duration::from_millis(2 * INTERVAL + 1000),
            "lb-1 offers 3 × the quota and holds all of it, yet saturated_hosts is {} \
             after two report intervals",
            saturated()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(fairness(), 1.0);
    let reports_before = metric("limiter_allocator_reports_total");
    let (passed_before, dropped_before) = counters(&[&labs[1]], "web")[0];
    let mut first_dropped = None;
    let sent = Instant::now();
    let light = labs[1].send_stoppable(web(&labs[1], 500, 6));
    let mut closed_refused = 0;
    let mut asked = None;
    let share = loop {
        let s1 = web_share(&labs[1]);
        let (passed, dropped) = counters(&[&labs[1]], "web")[0];
        first_dropped.get_or_insert(dropped);
        let s2 = web_share(&labs[1]);
        if s1 == 0 && s2 == 0 {
            // Closed: nothing passes.
            assert_eq!(passed, passed_before, "a closed share let frames through");
            closed_refused = dropped;
        }
        if asked.is_none() && fairness() < 1.0 {
            asked = Some(sent.elapsed());
        }
        if s2 > 0 {
            break s2;
        }
        assert!(
            sent.elapsed() < Duration::from_millis(2 * INTERVAL + 1000),
            "no share for lb-2 {:?} after its traffic began",
            sent.elapsed()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let opened = sent.elapsed();
    // A share that opened within the first poll (the first refusal's report came back
    // within one CLI call, as fast as 30 ms): what lb-2 had refused by then, from a share
    // seen closed (rate 0, burst 0) just before the traffic began.
    if closed_refused == 0 {
        closed_refused = first_dropped.unwrap_or(dropped_before) - dropped_before;
    }
    // The allocator's rule metrics are made at most every 500 ms: a share that opens
    // within that age shows the demand that asked for it in the next make.
    while asked.is_none() && sent.elapsed() < opened + Duration::from_millis(1500) {
        if fairness() < 1.0 {
            asked = Some(sent.elapsed());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let asked = asked.expect("the allocator never saw lb-2's demand");
    eprintln!(
        "closed share: {closed_refused} frames refused while closed; the allocator saw the \
         demand {asked:?} after the traffic began ({} reports since), a share of {share}/s \
         after {opened:?}; granted {} of {QUOTA}",
        metric("limiter_allocator_reports_total") - reports_before,
        granted()
    );
    assert!(closed_refused > 0, "lb-2 never refused while closed");
    assert!(granted() <= QUOTA as f64);
    light.stop();
    busy.stop();
    for d in daemons {
        d.stop();
    }
    drop(allocator);
}

/// A config of one rule `web` (`rule` is its TOML body after the name) in a fleet whose
/// allocator is at `port`.
fn one_rule_config(pki: &Pki, port: u16, fleet_size: u32, rule: &str, timing: &str) -> String {
    let pair = pki.pair("lb-1");
    format!(
        "fleet_size = {fleet_size}\n\
         [[rules]]\nname = \"web\"\n{rule}\n\
         [fleet]\nallocator = \"127.0.0.1:{port}\"\nhost_id = \"lb-1\"\nca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\n\
         {timing}\n",
        pki.ca().display(),
        pair.cert.display(),
        pair.key.display()
    )
}

/// Sends `count` copies of `frame` from the lab's peer, one frame per system call, at
/// `rate` a second.
fn send_one_by_one(
    lab: &Lab,
    frame: Vec<u8>,
    rate: u64,
    count: u64,
) -> std::thread::JoinHandle<anyhow::Result<anyhow::Result<SendReport>>> {
    let peer = lab.pair.peer.clone();
    spawn_in_netns(&lab.pair.ns, move || {
        let socket = PacketSocket::bind(ifindex(&peer)?, false)?;
        let start = Instant::now();
        let mut sent = 0;
        while sent < count {
            let due = start + Duration::from_secs_f64(sent as f64 / rate as f64);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            sent += socket.send_batch(&[&frame])? as u64;
        }
        Ok(SendReport {
            sent,
            span: start.elapsed(),
        })
    })
    .expect("starting the sender")
}

/// A bytes rule with the allocator unreachable runs at its bootstrap share (quota ÷
/// fleet_size) with a burst of one maximal frame, so frames pass at that rate. Old code:
/// burst 1 byte, no frame ever fits: 0 of 2,400 1000-byte frames passed.
#[test]
fn a_bytes_rule_passes_at_its_bootstrap_share_with_the_allocator_unreachable() {
    // At XDP the floor is one maximal frame; at TC one GRO-built buffer.
    for (mode, floor) in [
        ("native", limiter_user::config::MIN_BYTES_BURST),
        ("tc", limiter_user::config::GRO_MAX_BYTES),
    ] {
        bytes_bootstrap_with_the_allocator_unreachable(mode, floor);
    }
}

fn bytes_bootstrap_with_the_allocator_unreachable(mode: &'static str, floor: u64) {
    const GLOBAL: u64 = 1_000_000;
    const FLEET: u32 = 4;
    const FRAME: u64 = 1000;
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    // Nothing listens there.
    let port = free_port();
    let lab = Lab::with_mode(
        &one_rule_config(
            &pki,
            port,
            FLEET,
            &format!(
                "dst = \"198.18.0.2/32\"\nunit = \"bytes\"\nrate = {GLOBAL}\nburst = 100000\n\
                 fail_mode = \"static\""
            ),
            "lease_ttl_ms = 1500\nreport_interval_ms = 300\n",
        ),
        mode,
    );
    let daemon = lab.start();
    let stats = lab.rule_stats("web");
    let share = GLOBAL / u64::from(FLEET);
    assert_eq!(stats["state"], "bootstrap", "{mode}: {stats}");
    assert_eq!(stats["rate"], share, "{mode}: {stats}");
    let frame = FrameBuilder::ipv4(PEER_V4, Ipv4Addr::new(198, 18, 0, 2))
        .macs(lab.pair.peer_mac, lab.pair.host_mac)
        .udp(1, 9)
        .frame_len(FRAME as usize)
        .build();
    // One frame per send, paced: a batch of 64 arriving at once would meet a bucket of
    // one frame (the bootstrap burst) and pass one frame a batch.
    let report = join(send_one_by_one(&lab, frame, 1200, 2400));
    let after = lab.rule_stats("web");
    let passed = after["passed_packets"].as_u64().unwrap();
    let dropped = after["dropped_packets"].as_u64().unwrap();
    // What the share admits over the send: its rate for the span, plus the burst (the
    // bucket of a fresh slot starts full).
    let expected = (share as f64 * report.span.as_secs_f64() + floor as f64) / FRAME as f64;
    eprintln!(
        "{mode}, allocator unreachable: {passed} of {} {FRAME}-byte frames passed in {:?} \
         at a bootstrap share of {share} B/s, burst {floor} (expected about {expected:.0}); \
         {dropped} dropped",
        report.sent, report.span
    );
    assert_eq!(passed + dropped, report.sent, "{mode}");
    assert!(
        passed as f64 >= 0.85 * expected && passed as f64 <= 1.05 * expected + 1.0,
        "{mode}: {passed} frames passed, the bootstrap share admits about {expected:.0}"
    );
    let stats = lab.rule_stats("web");
    assert_eq!(stats["state"], "bootstrap", "{mode}");
    assert_eq!(
        stats["burst"], floor,
        "{mode}: the floor of a bytes share; {stats}"
    );
    daemon.stop();
}

/// A syn rule reports its demand in SYNs, not packets: a host offering 6,000 ACKs and
/// 200 SYNs a second against a quota of 3,000 SYNs/s is not saturated; 6,000 SYNs a
/// second are. Old code reported packets (6,200/s: saturated).
#[test]
fn a_syn_rule_reports_its_demand_in_syns() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let metrics_port = free_port();
    let allocator = Allocator::with_metrics(dir.path(), &pki, Some(metrics_port));
    let lab = Lab::new(&one_rule_config(
        &pki,
        allocator.port,
        3,
        &format!(
            "dst = \"198.18.0.2/32\"\nproto = \"tcp\"\nunit = \"syn\"\nrate = {QUOTA}\n\
             burst = 300\nfail_mode = \"open\""
        ),
        &format!(
            "lease_ttl_ms = {LEASE_MS}\nreport_interval_ms = {REPORT_MS}\nsticky_max_s = 30\n"
        ),
    ));
    let daemon = lab.start();
    wait_state(&[&lab], "web", "leased", Duration::from_secs(8));
    let tcp = |flags: u8| {
        FrameBuilder::ipv4(PEER_V4, Ipv4Addr::new(198, 18, 0, 2))
            .macs(lab.pair.peer_mac, lab.pair.host_mac)
            .tcp(1000, 443, flags)
            .frame_len(64)
            .build()
    };
    const SYN: u8 = 0x02;
    const ACK: u8 = 0x10;
    let saturated = || scrape(metrics_port)["limiter_allocator_saturated_hosts{rule=\"web\"}"];
    // 30 ACKs to a SYN.
    let mut frames = vec![tcp(ACK); 30];
    frames.push(tcp(SYN));
    let mixed = lab.send_in_background(SendPlan {
        frames,
        rate: Some(6200),
        count: 6200 * 3,
        duration: Duration::from_secs(6),
        cpu: None,
    });
    std::thread::sleep(Duration::from_millis(1500));
    let mut seen = Vec::new();
    while !mixed.is_finished() {
        seen.push(saturated());
        std::thread::sleep(Duration::from_millis(100));
    }
    join(mixed);
    eprintln!("6,000 ACK/s + 200 SYN/s: saturated hosts over time {seen:?}");
    assert!(!seen.is_empty());
    assert!(
        seen.iter().all(|&s| s == 0.0),
        "demand counted the ACKs: {seen:?}"
    );
    // SYNs beyond the quota: saturated, so the SYNs are counted.
    let syns = lab.send_stoppable(SendPlan {
        frames: vec![tcp(SYN)],
        rate: Some(2 * QUOTA),
        count: 2 * QUOTA * 3,
        duration: Duration::from_secs(6),
        cpu: None,
    });
    let start = Instant::now();
    while saturated() != 1.0 {
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "{} SYN/s against {QUOTA}: not saturated",
            2 * QUOTA
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!("6,000 SYN/s: saturated after {:?}", start.elapsed());
    syns.stop();
    daemon.stop();
    drop(allocator);
}

/// 17 rules covering 198.18.0.2 (prefixes /16 to /32): valid TOML and fields, refused
/// when compiled (at most 16 rules apply to one destination).
fn seventeen_covering_rules() -> String {
    (16..=32u32)
        .map(|len| {
            let mask = u32::MAX << (32 - len);
            let net = Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 18, 0, 2)) & mask);
            format!("[[rules]]\nname = \"r{len}\"\ndst = \"{net}/{len}\"\nrate = 100\nburst = 10\n")
        })
        .collect()
}

fn lease_test_config(pki: &Pki, port: u16, lease_ms: u64) -> String {
    one_rule_config(
        pki,
        port,
        3,
        &format!("dst = \"198.18.0.2/32\"\nrate = {QUOTA}\nburst = 300\nfail_mode = \"open\""),
        &format!(
            "lease_ttl_ms = {lease_ms}\nreport_interval_ms = {REPORT_MS}\nsticky_max_s = 60\n"
        ),
    )
}

/// A reload refused after parsing (17 rules covering one destination) changes no share:
/// the rule it would have removed keeps its share and state. Old code brought it back
/// as BOOTSTRAP (quota ÷ fleet_size).
#[test]
fn a_rejected_reload_changes_no_share() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let mut allocator = Allocator::new(dir.path(), &pki);
    let lab = Lab::new(&lease_test_config(&pki, allocator.port, LEASE_MS));
    let daemon = lab.start();
    wait_state(&[&lab], "web", "leased", Duration::from_secs(8));
    // Alone on the rule: the whole quota.
    let start = Instant::now();
    while web_share(&lab) != QUOTA {
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "{}",
            web_share(&lab)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // No allocator from here on: nothing but the reload can change the share.
    allocator.kill();
    let good = std::fs::read_to_string(&lab.config).unwrap();
    let fleet_section = &good[good.find("[fleet]").unwrap()..];
    std::fs::write(
        &lab.config,
        format!(
            "{}\nfleet_size = 3\n{}{fleet_section}",
            &good[..good.find("fleet_size").unwrap()],
            seventeen_covering_rules()
        ),
    )
    .unwrap();
    let out = lab.limiter(&["reload"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the reload was accepted");
    eprintln!("reload refused: {}", err.trim());
    // The daemon's fleet loop runs every 50 ms: give it a few rounds to act on a change.
    std::thread::sleep(Duration::from_millis(400));
    let stats = lab.rule_stats("web");
    assert_ne!(stats["state"], "bootstrap", "{stats}");
    assert_eq!(stats["rate"], QUOTA, "{stats}");
    let status = lab.json(&["status", "--json"]);
    assert_eq!(status["rules"], 1, "{status}");
    daemon.stop();
}

/// A restart within the lease resumes the share it held: LEASED at the granted rate, not
/// BOOTSTRAP at quota ÷ fleet_size (old code), even with no allocator to ask.
#[test]
fn a_restart_within_the_lease_resumes_its_share() {
    // A lease long enough to outlast a restart.
    const LEASE: u64 = 8000;
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let mut allocator = Allocator::timed(dir.path(), &pki, None, LEASE, REPORT_MS);
    let lab = Lab::new(&lease_test_config(&pki, allocator.port, LEASE));
    let daemon = lab.start();
    wait_state(
        &[&lab],
        "web",
        "leased",
        Duration::from_secs(LEASE / 1000 + 5),
    );
    // The whole quota once the allocator has learnt (a lease TTL after its start).
    wait_web_share(&lab, QUOTA, Duration::from_millis(LEASE + 3000));
    allocator.kill();
    let granted = Instant::now();
    daemon.stop();
    let daemon = lab.start();
    let restarted = granted.elapsed();
    let stats = lab.rule_stats("web");
    eprintln!("restarted {restarted:?} after the last grant: {stats}");
    assert!(
        restarted < Duration::from_millis(LEASE),
        "the restart took longer than the lease"
    );
    assert_eq!(stats["state"], "leased", "{stats}");
    assert_eq!(stats["rate"], QUOTA, "{stats}");
    // The resumed lease lapses on its own deadline: STICKY, same share.
    wait_state(
        &[&lab],
        "web",
        "sticky",
        Duration::from_millis(LEASE + 1000),
    );
    assert_eq!(web_share(&lab), QUOTA);
    daemon.stop();
}

/// `limiter-allocator quota set` is held to the bounds of a daemon config: a rate above
/// the maximum or a burst that takes over a year to refill is refused with an error that
/// says so, and the quota stays. Old code accepted both.
#[test]
fn allocator_quota_set_refuses_what_no_daemon_could_enforce() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let _allocator = Allocator::new(dir.path(), &pki);
    let socket = dir.path().join("allocator.sock");
    let quota = |args: &[&str]| {
        Command::new(Allocator::binary())
            .arg("quota")
            .args(args)
            .arg("--socket")
            .arg(&socket)
            .output()
            .unwrap()
    };
    let too_fast = (limiter_common::gcra::MAX_RATE + 1).to_string();
    let too_long = u64::MAX.to_string();
    for (args, what) in [
        (vec!["set", "web", "--rate", too_fast.as_str()], "at most"),
        (
            vec!["set", "web", "--rate", "10", "--burst", too_long.as_str()],
            "year",
        ),
    ] {
        let out = quota(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} accepted");
        assert!(err.contains("\"web\"") && err.contains(what), "{err}");
    }
    let list = String::from_utf8_lossy(&quota(&["list"]).stdout).into_owned();
    assert!(
        list.contains(&format!("\"rate\":{QUOTA}")),
        "the quota changed: {list}"
    );
}

/// A bytes share granted a burst smaller than a frame (the allocator knows no units: a
/// global burst of 300 gives a host 300) still admits frames, leased and sticky: the
/// daemon raises every share's burst to one maximal frame. Old code enforced the 300-byte
/// burst: no 1000-byte frame passed while leased or sticky.
#[test]
fn a_bytes_share_with_a_grant_below_a_frame_passes_frames_leased_and_sticky() {
    const SHARE: u64 = 1_000_000;
    const FRAME: u64 = 1000;
    const SEND_RATE: u64 = 2400;
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let mut allocator = Allocator::new(dir.path(), &pki);
    let set = Command::new(Allocator::binary())
        .args([
            "quota",
            "set",
            "web",
            "--rate",
            &SHARE.to_string(),
            "--burst",
            "300",
        ])
        .arg("--socket")
        .arg(dir.path().join("allocator.sock"))
        .output()
        .unwrap();
    assert!(
        set.status.success(),
        "{}",
        String::from_utf8_lossy(&set.stderr)
    );
    let lab = Lab::new(&one_rule_config(
        &pki,
        allocator.port,
        3,
        &format!(
            "dst = \"198.18.0.2/32\"\nunit = \"bytes\"\nrate = {SHARE}\nburst = 100000\n\
             fail_mode = \"static\""
        ),
        &format!(
            "lease_ttl_ms = {LEASE_MS}\nreport_interval_ms = {REPORT_MS}\nsticky_max_s = 30\n"
        ),
    ));
    let daemon = lab.start();
    let start = Instant::now();
    while !(states(&lab)["web"] == "leased" && web_share(&lab) == SHARE) {
        assert!(
            start.elapsed() < Duration::from_secs(8),
            "{}",
            lab.rule_stats("web")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let floor = limiter_user::config::MIN_BYTES_BURST;
    assert_eq!(lab.rule_stats("web")["burst"], floor);
    let frame = FrameBuilder::ipv4(PEER_V4, Ipv4Addr::new(198, 18, 0, 2))
        .macs(lab.pair.peer_mac, lab.pair.host_mac)
        .udp(1, 9)
        .frame_len(FRAME as usize)
        .build();
    let sender = send_one_by_one(&lab, frame, SEND_RATE, SEND_RATE * 7);
    let passed = || lab.rule_stats("web")["passed_packets"].as_u64().unwrap();
    // Frames a second passed over `window`.
    let rate = |window: Duration| {
        let before = passed();
        let t = Instant::now();
        std::thread::sleep(window);
        (passed() - before) as f64 / t.elapsed().as_secs_f64()
    };
    std::thread::sleep(Duration::from_millis(300));
    let expected = (SHARE / FRAME) as f64;
    let leased = rate(Duration::from_millis(1500));
    allocator.kill();
    wait_state(
        &[&lab],
        "web",
        "sticky",
        Duration::from_millis(LEASE_MS + 1500),
    );
    let sticky = rate(Duration::from_millis(1500));
    eprintln!(
        "bytes share {SHARE} B/s, granted burst 300, enforced {floor}: {leased:.0} frames/s \
         leased, {sticky:.0} sticky, of {SEND_RATE}/s offered (the share admits {expected:.0})"
    );
    for (state, r) in [("leased", leased), ("sticky", sticky)] {
        assert!(
            r >= 0.85 * expected && r <= 1.05 * expected,
            "{state}: {r:.0} frames/s passed, the share admits {expected:.0}"
        );
    }
    assert_eq!(web_share(&lab), SHARE);
    join(sender);
    daemon.stop();
}

/// `[fleet] allocator` lists two allocators: the host reports to the first; when that one
/// dies, to the next, within one lease TTL, so no share of the host leaves `leased`
/// (the second, new to the host, renews what the host says it holds).
#[test]
fn a_host_fails_over_to_the_next_listed_allocator_without_leaving_leased() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let (first_dir, second_dir) = (dir.path().join("first"), dir.path().join("second"));
    std::fs::create_dir(&first_dir).unwrap();
    std::fs::create_dir(&second_dir).unwrap();
    let mut first = Allocator::new(&first_dir, &pki);
    let second = Allocator::new(&second_dir, &pki);
    let one = format!("allocator = \"127.0.0.1:{}\"", first.port);
    let config = daemon_config("lb-1", &pki, first.port, "lb-1");
    assert!(config.contains(&one), "{config}");
    let config = config.replace(
        &one,
        &format!(
            "allocator = [\"127.0.0.1:{}\", \"127.0.0.1:{}\"]",
            first.port, second.port
        ),
    );
    let lab = Lab::new(&config);
    let daemon = lab.start();
    wait_state(&[&lab], "web", "leased", Duration::from_secs(10));
    let status = lab.json(&["status", "--json"]);
    let listed = status["allocator"].to_string();
    assert!(
        listed.contains(&first.port.to_string()) && listed.contains(&second.port.to_string()),
        "status does not list both allocators: {status:#}"
    );

    first.kill();
    // Three lease TTLs without the first allocator: every sample leased.
    let until = Instant::now() + Duration::from_millis(3 * LEASE_MS);
    let mut samples = 0;
    while Instant::now() < until {
        let now = states(&lab);
        assert!(
            now.values().all(|s| s == "leased"),
            "a share left leased after the first allocator died: {now:?}"
        );
        samples += 1;
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(samples > 10, "only {samples} samples");
    drop(second);
    daemon.stop();
}

/// What the fleet admitted of `web` at small bursts, the most the shares in force
/// summed to while it was measured, and what the hosts admitted on credit meanwhile
/// (`limiter status --json` → `fleet.credited`, summed).
struct SmallBurstRun {
    admitted: f64,
    peak_in_force: u64,
    credited: u64,
}

/// Frames the hosts admitted on the fleet's credit so far, summed.
fn credited(labs: &[Lab]) -> u64 {
    labs.iter()
        .map(|l| {
            l.json(&["status", "--json"])["fleet"]["credited"]
                .as_u64()
                .expect("status --json has fleet.credited")
        })
        .sum()
}

/// The fleet's steady state at small bursts: a global burst of 12 over 3 hosts (4 tokens
/// a host), each host offered 40 % of the quota as Poisson arrivals (120 % in all). The
/// shares in force are sampled throughout the 6 s measured.
fn four_tokens_per_host() -> SmallBurstRun {
    const BURST: u64 = 12;
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let allocator = Allocator::new(dir.path(), &pki);
    let labs = hosts(3, &pki, allocator.port);
    let daemons = start_all(&labs);
    let all: Vec<&Lab> = labs.iter().collect();
    let out = Command::new(Allocator::binary())
        .args(["quota", "set", "web", "--rate"])
        .arg(QUOTA.to_string())
        .args(["--burst", &BURST.to_string(), "--socket"])
        .arg(allocator.socket())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let offered = QUOTA as f64 * 1.2 / 3.0;
    let run = Duration::from_secs(16);
    let senders: Vec<_> = labs
        .iter()
        .enumerate()
        .map(|(i, lab)| {
            lab.send_poisson_stoppable(vec![web_frame(lab)], offered, run, 17 + i as u64)
        })
        .collect();
    wait_state(&all, "web", "leased", Duration::from_secs(8));
    // Shares settle within a few report intervals of the first demand.
    std::thread::sleep(Duration::from_millis(10 * REPORT_MS));
    let bursts: Vec<u64> = labs
        .iter()
        .map(|l| l.rule_stats("web")["burst"].as_u64().unwrap())
        .collect();
    let before: u64 = counters(&all, "web").iter().map(|c| c.0).sum();
    let credited_before = credited(&labs);
    let start = Instant::now();
    let mut peak_in_force = 0;
    while start.elapsed() < Duration::from_secs(6) {
        let in_force: u64 = web_shares(&labs).iter().sum();
        peak_in_force = peak_in_force.max(in_force);
        std::thread::sleep(Duration::from_millis(100));
    }
    let after: u64 = counters(&all, "web").iter().map(|c| c.0).sum();
    let admitted = (after - before) as f64 / start.elapsed().as_secs_f64();
    let credited = credited(&labs) - credited_before;
    // Sent until here: the rate each sender kept is over its own span.
    let reports: Vec<_> = senders.into_iter().map(Sender::stop).collect();
    let sent: Vec<f64> = reports.iter().map(|r| r.frames_per_second()).collect();
    eprintln!(
        "bursts in force {bursts:?}; offered {sent:.0?}/s a host; admitted {admitted:.0}/s = \
         {:.1} % of the quota {QUOTA}, {credited} frames of it on credit; shares in force \
         peaked at {peak_in_force}/s",
        100.0 * admitted / QUOTA as f64
    );
    assert!(
        sent.iter().all(|&s| s > offered * 0.9),
        "the senders fell behind: {sent:.0?}/s, planned {offered:.0}/s"
    );
    for d in daemons {
        d.stop();
    }
    SmallBurstRun {
        admitted,
        peak_in_force,
        credited,
    }
}

/// Steady accuracy at small bursts: at 4 tokens a host the fleet admits 98-102 % of its
/// quota, the shares in force never sum above it, and the credit is what makes up the
/// difference (without it, 92.6 % and 93.7 % in two runs: each host's 4-token bucket
/// overflows in the gaps of Poisson arrivals; README, "Accuracy vs burst, and the
/// credit").
#[test]
fn at_four_tokens_per_host_the_fleet_admits_its_quota_and_no_more() {
    let run = four_tokens_per_host();
    let pct = 100.0 * run.admitted / QUOTA as f64;
    assert!(
        run.peak_in_force <= QUOTA,
        "shares in force summed to {}/s",
        run.peak_in_force
    );
    assert!(
        (98.0..=102.0).contains(&pct),
        "admitted {:.0}/s, {pct:.1} % of the quota",
        run.admitted
    );
    // The 6 s measured at ≈ 7 % of the quota wasted by the buckets.
    assert!(
        run.credited as f64 > QUOTA as f64 * 6.0 * 0.02,
        "only {} frames admitted on credit",
        run.credited
    );
}

/// A host whose shares fail open passes everything until a report gets through, so it
/// retries every `FAIL_OPEN_RETRY_MS` (200 ms) rather than once a report interval
/// (4 s here): the failures count at that pace while it fails open, and a returning
/// allocator is found within a retry, not within an interval.
#[test]
fn a_host_in_fail_open_retries_every_200_ms_and_finds_the_returning_allocator_at_once() {
    const LEASE: u64 = 5_000;
    const INTERVAL: u64 = 4_000;
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let mut allocator = Allocator::timed(dir.path(), &pki, None, LEASE, INTERVAL);
    let labs = timed_hosts(2, &pki, allocator.port, LEASE, INTERVAL);
    let daemons = start_all(&labs);
    let all: Vec<&Lab> = labs.iter().collect();
    wait_state(&all, "web", "leased", Duration::from_secs(10));

    allocator.kill();
    wait_state(
        &all,
        "web",
        "fail_open",
        Duration::from_millis(LEASE + STICKY_S * 1000 + INTERVAL),
    );
    let failures = |lab: &Lab| {
        lab.json(&["status", "--json"])["fleet"]["report_failures"]
            .as_u64()
            .expect("status --json has fleet.report_failures")
    };
    let before: Vec<u64> = labs.iter().map(failures).collect();
    let window = Instant::now();
    std::thread::sleep(Duration::from_millis(1600));
    let after: Vec<u64> = labs.iter().map(failures).collect();
    let elapsed = window.elapsed();
    for (i, (b, a)) in before.iter().zip(&after).enumerate() {
        eprintln!(
            "lb-{}: {} failed reports in {elapsed:?} of FAIL_OPEN",
            i + 1,
            a - b
        );
        // Every 200 ms: 8 in 1.6 s (once an interval: at most 1).
        assert!(
            a - b >= 5,
            "lb-{}: {} failed reports in {elapsed:?} of FAIL_OPEN",
            i + 1,
            a - b
        );
    }

    allocator.start();
    let found = wait_state(
        &all,
        "web",
        "leased",
        Duration::from_millis(INTERVAL + 2000),
    );
    eprintln!("both hosts leased {found:?} after the allocator listened again");
    assert!(
        found < Duration::from_millis(1200),
        "the returning allocator was found after {found:?} (interval {INTERVAL} ms)"
    );
    for d in daemons {
        d.stop();
    }
}
