//! Hostile and broken peers of the allocator, with real processes: the real
//! `limiter-allocator` over mutual TLS on loopback, a real daemon where a host's admitted
//! traffic is measured, and gRPC / raw TCP / raw TLS clients playing the attacker.
//! Times are scaled down as in tests/fleet.rs (lease 1.5 s, reports every 300 ms).
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

mod common;

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream},
    path::Path,
    process::{Child, Command, Stdio},
    sync::Arc,
    time::{Duration, Instant},
};

use common::{join, pki::Pki, Lab, LIMITER};
use limiter_proto::pb::{allocator_client::AllocatorClient, ReportReply, ReportRequest};
use limiter_tests::{frame::FrameBuilder, scenario::PEER_V4, traffic::SendPlan};
use limiter_user::bpf::maps::Maps;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tonic::{
    transport::{Channel, Endpoint},
    Code,
};

const QUOTA: u64 = 3000;
const LEASE_MS: u64 = 1500;
const REPORT_MS: u64 = 300;

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A `limiter-allocator run` process with rule "web" (quota 3000/s) and `extra` config
/// lines (the peer bounds under test).
struct Allocator {
    child: Child,
    port: u16,
    metrics: u16,
}

impl Allocator {
    fn start(dir: &Path, pki: &Pki, extra: &str) -> Allocator {
        let binary = Path::new(LIMITER).with_file_name("limiter-allocator");
        assert!(
            binary.exists(),
            "{} is missing: build it first (cargo build --release -p limiter-allocator)",
            binary.display()
        );
        let (port, metrics) = (free_port(), free_port());
        let server = pki.pair("allocator");
        let config = dir.join("allocator.toml");
        std::fs::write(
            &config,
            format!(
                "listen = \"127.0.0.1:{port}\"\nmetrics = \"127.0.0.1:{metrics}\"\n\
                 control_socket = \"{}\"\nlease_ttl_ms = {LEASE_MS}\nreport_interval_ms = {REPORT_MS}\n\
                 {extra}\n[tls]\nca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\n\
                 [[quotas]]\nrule = \"web\"\nrate = {QUOTA}\nburst = 300\n",
                dir.join("allocator.sock").display(),
                pki.ca().display(),
                server.cert.display(),
                server.key.display()
            ),
        )
        .unwrap();
        let child = Command::new(&binary)
            .args(["run", "--config"])
            .arg(&config)
            .spawn()
            .expect("starting limiter-allocator");
        let a = Allocator {
            child,
            port,
            metrics,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", metrics)).is_err() {
            assert!(Instant::now() < deadline, "allocator did not listen");
            std::thread::sleep(Duration::from_millis(20));
        }
        a
    }

    fn scrape(&self) -> BTreeMap<String, f64> {
        use std::io::{Read as _, Write as _};
        let mut stream = TcpStream::connect(("127.0.0.1", self.metrics)).unwrap();
        stream.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
        let mut text = String::new();
        stream.read_to_string(&mut text).unwrap();
        let body = text.split_once("\r\n\r\n").unwrap().1;
        body.lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .map(|l| {
                let (k, v) = l.rsplit_once(' ').unwrap();
                (k.to_string(), v.parse().unwrap())
            })
            .collect()
    }
}

impl Drop for Allocator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A gRPC client holding certificate `cert` of the test PKI, from `local` (default: the
/// kernel's choice).
fn client(pki: &Pki, cert: &str, port: u16, local: Option<IpAddr>) -> AllocatorClient<Channel> {
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
        .timeout(Duration::from_secs(2))
        .local_address(local)
        .connect_lazy();
    AllocatorClient::new(channel)
}

fn report(host: &str, demand: u64, held: u64) -> ReportRequest {
    ReportRequest::one_rule(host, "web", demand, held)
}

fn web_rate(reply: &ReportReply) -> Option<u64> {
    reply
        .grants
        .iter()
        .find(|g| g.rule == "web")
        .map(|g| g.rate)
}

/// Tally of gRPC outcomes by code, with one message per code.
#[derive(Default, Debug)]
struct Outcomes {
    by_code: BTreeMap<String, (u64, String)>,
}

impl Outcomes {
    fn add(&mut self, r: &Result<tonic::Response<ReportReply>, tonic::Status>) {
        let (code, message) = match r {
            Ok(_) => (Code::Ok, String::new()),
            Err(s) => (s.code(), s.message().to_string()),
        };
        let e = self
            .by_code
            .entry(format!("{code:?}"))
            .or_insert((0, message));
        e.0 += 1;
    }

    fn count(&self, code: Code) -> u64 {
        self.by_code.get(&format!("{code:?}")).map_or(0, |e| e.0)
    }

    fn message(&self, code: Code) -> &str {
        self.by_code
            .get(&format!("{code:?}"))
            .map_or("", |e| e.1.as_str())
    }

    fn total(&self) -> u64 {
        self.by_code.values().map(|e| e.0).sum()
    }
}

fn daemon_config(host: &str, pki: &Pki, port: u16, cert: &str) -> String {
    let pair = pki.pair(cert);
    format!(
        "fleet_size = 3\n\
         [[rules]]\nname = \"web\"\ndst = \"198.18.0.2/32\"\nrate = {QUOTA}\nburst = 300\nfail_mode = \"open\"\n\
         [fleet]\nallocator = \"127.0.0.1:{port}\"\nhost_id = \"{host}\"\nca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\n\
         lease_ttl_ms = {LEASE_MS}\nreport_interval_ms = {REPORT_MS}\nsticky_max_s = 30\n",
        pki.ca().display(),
        pair.cert.display(),
        pair.key.display()
    )
}

/// `rate` frames per second to the web rule's destination for `duration`.
fn web_traffic(lab: &Lab, rate: u64, duration: Duration) -> SendPlan {
    let frame = FrameBuilder::ipv4(PEER_V4, Ipv4Addr::new(198, 18, 0, 2))
        .macs(lab.pair.peer_mac, lab.pair.host_mac)
        .udp(1, 9)
        .frame_len(64)
        .build();
    SendPlan {
        frames: vec![frame],
        rate: Some(rate),
        count: rate * duration.as_secs(),
        duration: duration + Duration::from_secs(2),
        cpu: None,
    }
}

/// Frames passed per second by the web rule over `window`, from the pinned counters.
fn admitted_rate(lab: &Lab, window: Duration) -> f64 {
    let passed = || {
        let maps = Maps::from_pins(&lab.pins.path).unwrap();
        let slot = maps.live_slots().unwrap()["web"];
        maps.rule_counters(slot).unwrap().passed_packets
    };
    // Each reading timed at its middle (see common::fleet::admitted_rate).
    let timed = || {
        let start = Instant::now();
        let n = passed();
        (n, start + start.elapsed() / 2)
    };
    let (before, before_at) = timed();
    std::thread::sleep(window);
    let (after, after_at) = timed();
    (after - before) as f64 / (after_at - before_at).as_secs_f64()
}

fn wait_leased(lab: &Lab, within: Duration) {
    let deadline = Instant::now() + within;
    while lab.rule_stats("web")["state"] != "leased" {
        assert!(
            Instant::now() < deadline,
            "web not leased within {within:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// (a) A client with a VALID certificate (lb-3's) reports as 300 made-up hosts with huge
/// demand. Before this fix the allocator believed every host id and split the quota 301
/// ways (measured from outside: the real host went from 1,999/s to 6/s). Now each report
/// is refused with PERMISSION_DENIED and the real host, alone on the rule, keeps its
/// share.
#[test]
fn a_valid_certificate_cannot_report_as_made_up_hosts() {
    const OFFERED: u64 = 2000;
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let allocator = Allocator::start(dir.path(), &pki, "");
    let lab = Lab::new(&daemon_config("lb-1", &pki, allocator.port, "lb-1"));
    let daemon = lab.start();
    let sender = lab.send_in_background(web_traffic(&lab, OFFERED, Duration::from_secs(14)));
    wait_leased(&lab, Duration::from_secs(8));
    // Alone on the rule once the allocator has learnt: the whole quota.
    common::fleet::wait_web_share(&lab, QUOTA, Duration::from_millis(LEASE_MS + 3000));
    std::thread::sleep(Duration::from_secs(1));
    let before = admitted_rate(&lab, Duration::from_secs(2));

    let port = allocator.port;
    let rogue_pki = pki.pair("lb-3");
    assert!(rogue_pki.cert.exists());
    let ca = pki.ca();
    let rogue = std::thread::spawn(move || {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        runtime.block_on(async move {
            let pki = Pki {
                dir: ca.parent().unwrap().to_path_buf(),
            };
            let mut c = client(&pki, "lb-3", port, None);
            let mut outcomes = Outcomes::default();
            let end = Instant::now() + Duration::from_secs(6);
            while Instant::now() < end {
                for i in 0..300 {
                    let r = c
                        .report(report(&format!("fake-{i}"), 1_000_000_000, 0))
                        .await;
                    outcomes.add(&r);
                }
                tokio::time::sleep(Duration::from_millis(REPORT_MS)).await;
            }
            outcomes
        })
    });
    std::thread::sleep(Duration::from_millis(2500));
    let during = admitted_rate(&lab, Duration::from_secs(2));
    let share = lab.rule_stats("web")["rate"].as_u64().unwrap();
    let outcomes = rogue.join().unwrap();
    let metrics = allocator.scrape();
    eprintln!(
        "real host admitted {before:.0}/s before, {during:.0}/s during the attack (share \
         {share}); rogue reports: {outcomes:?}"
    );
    join(sender);
    daemon.stop();

    assert!(outcomes.total() >= 300, "the rogue sent {outcomes:?}");
    assert_eq!(
        outcomes.count(Code::PermissionDenied),
        outcomes.total(),
        "every made-up host must be refused: {outcomes:?}"
    );
    let message = outcomes.message(Code::PermissionDenied);
    assert!(
        message.contains("lb-3") && message.contains("fake-"),
        "the refusal names the claim and the certificate's identity: {message}"
    );
    assert_eq!(
        share, QUOTA,
        "alone on the rule, the host keeps the whole quota"
    );
    assert!(
        before >= OFFERED as f64 * 0.95,
        "before the attack the host admitted {before:.0}/s of {OFFERED}"
    );
    assert!(
        during >= before * 0.95,
        "during the attack the host admitted {during:.0}/s, {before:.0}/s before"
    );
    assert_eq!(
        metrics["limiter_allocator_refused_reports_total{reason=\"identity\"}"],
        outcomes.total() as f64
    );
}

/// The daemon refuses to start with a host_id that is not its certificate's identity.
#[test]
fn a_daemon_whose_host_id_is_not_its_certificates_does_not_start() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let lab = Lab::new(&daemon_config("lb-2", &pki, free_port(), "lb-1"));
    let mut child = Command::new(LIMITER)
        .args(["run", "--config"])
        .arg(&lab.config)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("limiter run with a mismatched host_id kept running");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!status.success(), "{stderr}");
    assert!(
        stderr.contains("\"lb-2\"") && stderr.contains("lb-1") && stderr.contains("host_id"),
        "the error names the host id, the certificate's names and the key: {stderr}"
    );
    assert!(
        lab.attached_program().is_none(),
        "nothing is attached by a daemon that refused to start"
    );
}

/// (b) With max_hosts = 2 and lb-1, lb-2 reporting, lb-3 (valid certificate, its own
/// identity) is refused with RESOURCE_EXHAUSTED naming the bound; the known hosts keep
/// their grants; once lb-2 has stopped reporting for a lease TTL, lb-3 gets its place.
#[test]
fn a_full_fleet_refuses_newcomers_and_keeps_its_hosts() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let allocator = Allocator::start(dir.path(), &pki, "max_hosts = 2");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let mut a = client(&pki, "lb-1", allocator.port, None);
        let mut b = client(&pki, "lb-2", allocator.port, None);
        let mut c = client(&pki, "lb-3", allocator.port, None);
        // Past the allocator's start-up learning, both hosts hold real grants.
        let (mut held_a, mut held_b) = (0, 0);
        let mut grants = (None, None);
        for _ in 0..10 {
            let ra = a
                .report(report("lb-1", 1000, held_a))
                .await
                .unwrap()
                .into_inner();
            let rb = b
                .report(report("lb-2", 1000, held_b))
                .await
                .unwrap()
                .into_inner();
            held_a = web_rate(&ra).unwrap_or(0);
            held_b = web_rate(&rb).unwrap_or(0);
            grants = (web_rate(&ra), web_rate(&rb));
            tokio::time::sleep(Duration::from_millis(REPORT_MS)).await;
        }
        let steady = grants;
        assert!(steady.0.is_some() && steady.1.is_some(), "{steady:?}");

        let mut newcomer = Outcomes::default();
        for _ in 0..5 {
            newcomer.add(&c.report(report("lb-3", 1_000_000, 0)).await);
            let ra = a.report(report("lb-1", 1000, held_a)).await;
            let rb = b.report(report("lb-2", 1000, held_b)).await;
            grants = (
                ra.ok().and_then(|r| web_rate(&r.into_inner())),
                rb.ok().and_then(|r| web_rate(&r.into_inner())),
            );
            assert_eq!(grants, steady, "the known hosts' grants moved");
            tokio::time::sleep(Duration::from_millis(REPORT_MS)).await;
        }
        eprintln!("known hosts' grants {steady:?}; newcomer: {newcomer:?}");
        assert_eq!(newcomer.count(Code::ResourceExhausted), 5, "{newcomer:?}");
        let message = newcomer.message(Code::ResourceExhausted);
        assert!(
            message.contains("max_hosts = 2") && message.contains("lb-3"),
            "{message}"
        );
        assert_eq!(
            allocator.scrape()["limiter_allocator_refused_reports_total{reason=\"fleet_full\"}"],
            5.0
        );

        // lb-2 stops; a lease TTL later it has left and lb-3 is admitted, while lb-1 goes
        // on. lb-2 coming back finds no room.
        let left = Instant::now();
        while left.elapsed() < Duration::from_millis(LEASE_MS + 2 * REPORT_MS) {
            a.report(report("lb-1", 1000, held_a)).await.unwrap();
            tokio::time::sleep(Duration::from_millis(REPORT_MS)).await;
        }
        assert!(c.report(report("lb-3", 1000, 0)).await.is_ok());
        let back = b.report(report("lb-2", 1000, 0)).await.unwrap_err();
        assert_eq!(back.code(), Code::ResourceExhausted, "{back:?}");
        assert_eq!(allocator.scrape()["limiter_allocator_known_hosts"], 2.0);
    });
}

/// Latencies of reports from lb-1 every report interval for `span`.
async fn timed_reports(c: &mut AllocatorClient<Channel>, span: Duration) -> Vec<Duration> {
    let mut latencies = Vec::new();
    let end = Instant::now() + span;
    while Instant::now() < end {
        let start = Instant::now();
        let r = c.report(report("lb-1", 1000, 0)).await;
        latencies.push(start.elapsed());
        assert!(r.is_ok(), "the real host's report failed: {r:?}");
        tokio::time::sleep(Duration::from_millis(REPORT_MS)).await;
    }
    latencies
}

fn worst(l: &[Duration]) -> Duration {
    l.iter().copied().max().unwrap_or_default()
}

/// (c) One valid host (lb-2) floods reports as itself over two connections, four calls in
/// flight on each. Its reports beyond max_reports_per_s are refused with
/// RESOURCE_EXHAUSTED (at most burst + rate × time get through), and the real host's
/// reports are answered within its report interval all along.
#[test]
fn a_report_flood_is_rate_limited_and_real_hosts_are_answered() {
    const RATE: u64 = 10;
    const FLOOD: Duration = Duration::from_secs(4);
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let allocator = Allocator::start(dir.path(), &pki, &format!("max_reports_per_s = {RATE}"));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut real = client(&pki, "lb-1", allocator.port, None);
        let baseline = timed_reports(&mut real, Duration::from_secs(2)).await;

        let started = Instant::now();
        let mut flooders = Vec::new();
        for _ in 0..2 {
            let conn = client(&pki, "lb-2", allocator.port, None);
            for _ in 0..4 {
                let mut c = conn.clone();
                flooders.push(tokio::spawn(async move {
                    let mut outcomes = Outcomes::default();
                    while started.elapsed() < FLOOD {
                        outcomes.add(&c.report(report("lb-2", 1_000_000, 0)).await);
                    }
                    outcomes
                }));
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let during = timed_reports(&mut real, FLOOD - Duration::from_secs(1)).await;
        let mut flood = Outcomes::default();
        for f in flooders {
            for (code, (n, message)) in f.await.unwrap().by_code {
                let e = flood.by_code.entry(code).or_insert((0, message));
                e.0 += n;
            }
        }
        let elapsed = started.elapsed();
        eprintln!(
            "flood over {elapsed:?}: {flood:?}; real host's report latency: worst {:?} \
             before, worst {:?} during the flood ({} reports)",
            worst(&baseline),
            worst(&during),
            during.len()
        );
        let bound = RATE + RATE * elapsed.as_millis() as u64 / 1000 + 1;
        assert!(
            flood.count(Code::Ok) <= bound,
            "{} flood reports were handled, at most {bound} may be: {flood:?}",
            flood.count(Code::Ok)
        );
        assert_eq!(
            flood.count(Code::Ok) + flood.count(Code::ResourceExhausted),
            flood.total(),
            "{flood:?}"
        );
        assert!(
            flood.count(Code::ResourceExhausted) > 10 * bound,
            "{flood:?}"
        );
        assert!(
            flood
                .message(Code::ResourceExhausted)
                .contains("max_reports_per_s"),
            "{flood:?}"
        );
        assert!(
            worst(&during) < Duration::from_millis(REPORT_MS),
            "a real host's report took {:?} during the flood",
            worst(&during)
        );
        let m = allocator.scrape();
        let refused = m["limiter_allocator_refused_reports_total{reason=\"connection_rate\"}"]
            + m["limiter_allocator_refused_reports_total{reason=\"host_rate\"}"];
        assert_eq!(refused, flood.count(Code::ResourceExhausted) as f64);
    });
}

/// A raw TCP connection to the allocator from `local`.
async fn raw_tcp(local: IpAddr, port: u16) -> tokio::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(local, 0)).unwrap();
    socket
        .connect(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port))
        .await
        .unwrap()
}

/// Whether the peer closed `stream` within `within` (EOF or an error; data it sent
/// before closing is read past).
async fn closed_within<S: tokio::io::AsyncRead + Unpin>(stream: &mut S, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

/// A TLS connection with lb-2's certificate that sends the HTTP/2 preface and then
/// nothing, and reads nothing.
async fn silent_tls(pki: &Pki, local: IpAddr, port: u16) -> impl tokio::io::AsyncRead + Unpin {
    use rustls::pki_types::{pem::PemObject as _, CertificateDer, PrivateKeyDer, ServerName};
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(pki.ca()).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let pair = pki.pair("lb-2");
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&pair.cert)
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let key = PrivateKeyDer::from_pem_file(&pair.key).unwrap();
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_client_auth_cert(chain, key)
    .unwrap();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = raw_tcp(local, port).await;
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("limiter-allocator").unwrap(), tcp)
        .await
        .expect("TLS handshake with a valid certificate");
    tls.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .await
        .unwrap();
    tls.flush().await.unwrap();
    tls
}

/// (d) Slow and silent clients: idle TCP connections, one that completes TLS and HTTP/2's
/// preface and then neither sends nor reads. Connections beyond max_connections_per_ip
/// are closed at once, and beyond max_connections the oldest still in its TLS handshake
/// is closed for the newcomer; the silent ones are closed after
/// handshake_timeout_ms; a real host's reports are answered promptly all along, and a new
/// host can connect while one source holds its whole per-address allowance.
#[test]
fn silent_and_excess_connections_delay_nobody() {
    const HANDSHAKE_MS: u64 = 1000;
    const PER_IP: usize = 4;
    const MAX: usize = 11;
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let allocator = Allocator::start(
        dir.path(),
        &pki,
        &format!(
            "max_connections = {MAX}\nmax_connections_per_ip = {PER_IP}\n\
             handshake_timeout_ms = {HANDSHAKE_MS}"
        ),
    );
    let port = allocator.port;
    let ip = |last: u8| IpAddr::V4(Ipv4Addr::new(127, 0, 0, last));
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let mut real = client(&pki, "lb-1", port, Some(ip(1)));
        let baseline = timed_reports(&mut real, Duration::from_secs(1)).await;
        // Open: the real host (1) + the silent TLS peer (1) + PER_IP idle ones from each
        // of .2 and .3.
        let opened = Instant::now();
        let mut tls = silent_tls(&pki, ip(6), port).await;
        let mut idle = Vec::new();
        for source in [2, 3] {
            for _ in 0..PER_IP {
                idle.push(raw_tcp(ip(source), port).await);
            }
        }
        // One more from .2: over its per-address allowance, closed at once.
        let mut over_ip = raw_tcp(ip(2), port).await;
        assert!(
            closed_within(&mut over_ip, Duration::from_millis(500)).await,
            "a connection beyond max_connections_per_ip was kept open"
        );
        // A new host from another address still gets in, and a report through.
        let mut newcomer = client(&pki, "lb-3", port, Some(ip(4)));
        let started = Instant::now();
        newcomer.report(report("lb-3", 10, 0)).await.unwrap();
        let newcomer_latency = started.elapsed();
        // Now MAX are open: one more from anywhere takes the place of the oldest one still
        // in its TLS handshake (the first idle one), which is closed at once.
        let mut over_total = raw_tcp(ip(5), port).await;
        assert!(
            closed_within(&mut idle[0], Duration::from_millis(500)).await,
            "the oldest handshaking connection was kept open beyond max_connections"
        );
        assert!(
            !closed_within(&mut over_total, Duration::ZERO).await,
            "the newcomer was closed instead of the oldest handshaking connection"
        );
        // ... and not before it: another idle one is still open now, unless that much passed.
        let still_open = !closed_within(&mut idle[1], Duration::ZERO).await;
        let held_for = opened.elapsed();
        assert!(
            still_open || held_for >= Duration::from_millis(HANDSHAKE_MS),
            "an idle connection was closed {held_for:?} after connecting"
        );
        let during = timed_reports(&mut real, Duration::from_millis(800)).await;
        // The silent ones are closed after handshake_timeout_ms (TLS done or not).
        let mut all_closed = true;
        for s in &mut idle {
            all_closed &= closed_within(s, Duration::from_millis(HANDSHAKE_MS + 1500)).await;
        }
        let tls_closed = closed_within(&mut tls, Duration::from_millis(HANDSHAKE_MS + 1500)).await;
        let closed_after = opened.elapsed();
        eprintln!(
            "real host's reports: worst {:?} before, {:?} with the slots held; newcomer's \
             first report {newcomer_latency:?}; silent ones open for {held_for:?} at least, \
             all closed {closed_after:?} after they connected",
            worst(&baseline),
            worst(&during),
        );
        assert!(
            closed_after >= Duration::from_millis(HANDSHAKE_MS),
            "closed before handshake_timeout_ms: {closed_after:?}"
        );
        assert!(
            all_closed,
            "idle TCP connections were kept open past the handshake timeout"
        );
        assert!(tls_closed, "a TLS peer that sends nothing was kept open");
        assert!(
            worst(&during) < Duration::from_millis(REPORT_MS),
            "{during:?}"
        );
        assert!(
            newcomer_latency < Duration::from_secs(1),
            "{newcomer_latency:?}"
        );
        // The freed places take new connections.
        let mut again = client(&pki, "lb-2", port, Some(ip(2)));
        again.report(report("lb-2", 10, 0)).await.unwrap();
        let m = allocator.scrape();
        assert_eq!(
            m["limiter_allocator_connections_refused_total{limit=\"max_connections_per_ip\"}"],
            1.0
        );
        assert_eq!(
            m["limiter_allocator_connections_refused_total{limit=\"max_connections\"}"],
            0.0
        );
        assert_eq!(m["limiter_allocator_connections_evicted_total"], 1.0);
    });
}

/// Per source of the flood test's rule: frames per second and burst.
const PER_SOURCE: u64 = 50;

/// `daemon_config` with a per-source limit on the web rule.
fn daemon_config_per_source(host: &str, pki: &Pki, port: u16) -> String {
    let config = daemon_config(host, pki, port, host);
    let marker = "fail_mode = \"open\"\n";
    assert!(config.contains(marker), "{config}");
    config.replacen(
        marker,
        &format!("{marker}[rules.per_source]\nrate = {PER_SOURCE}\nburst = 10\n"),
        1,
    )
}

/// `rate` frames per second to the web rule's destination, round robin over `sources`
/// source addresses (198.19.k.1), for `duration`.
fn web_traffic_from(lab: &Lab, sources: u8, rate: u64, duration: Duration) -> SendPlan {
    let frames = (0..sources)
        .map(|k| {
            FrameBuilder::ipv4(Ipv4Addr::new(198, 19, k, 1), Ipv4Addr::new(198, 18, 0, 2))
                .macs(lab.pair.peer_mac, lab.pair.host_mac)
                .udp(1, 9)
                .frame_len(64)
                .build()
        })
        .collect();
    SendPlan {
        frames,
        rate: Some(rate),
        count: rate * duration.as_secs(),
        duration: duration + Duration::from_secs(2),
        cpu: None,
    }
}

/// The mean of `lab`'s web share sampled every 100 ms over `window`.
fn mean_share(lab: &Lab, window: Duration) -> f64 {
    let start = Instant::now();
    let mut samples = Vec::new();
    while start.elapsed() < window {
        samples.push(lab.rule_stats("web")["rate"].as_u64().unwrap() as f64);
        std::thread::sleep(Duration::from_millis(100));
    }
    samples.iter().sum::<f64>() / samples.len() as f64
}

/// Three hosts with a per-source limit of 50/s on the web rule, each offered 600/s from
/// 20 sources (30/s each): demand 1,800/s of a 3,000/s quota, so each holds 1,000/s
/// (its demand and a third of the spare). Then one spoofed source floods lb-1 with
/// 6,000/s: its per-source limit refuses all but 50/s of it, before the aggregate.
/// Those refusals are no demand for the fleet's quota: lb-2's and lb-3's shares stay
/// within 5 %. (When demand counted every frame offered, lb-1 asked for 6,600/s and
/// the water-filling cut the others to their 600/s of demand, −40 %.)
#[test]
fn a_flood_the_per_source_limit_refuses_wins_no_quota() {
    const HONEST: u64 = 600;
    const FLOOD: u64 = 6000;
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let allocator = Allocator::start(dir.path(), &pki, "");
    let labs: Vec<Lab> = ["lb-1", "lb-2", "lb-3"]
        .iter()
        .map(|h| Lab::new(&daemon_config_per_source(h, &pki, allocator.port)))
        .collect();
    let daemons: Vec<_> = labs.iter().map(Lab::start).collect();
    let senders: Vec<_> = labs
        .iter()
        .map(|lab| {
            lab.send_in_background(web_traffic_from(lab, 20, HONEST, Duration::from_secs(16)))
        })
        .collect();
    for lab in &labs {
        wait_leased(lab, Duration::from_secs(8));
    }
    // Past the allocator's learning: the split follows demand.
    std::thread::sleep(Duration::from_millis(LEASE_MS + 6 * REPORT_MS));
    let before: Vec<f64> = labs
        .iter()
        .map(|l| mean_share(l, Duration::from_millis(1500)))
        .collect();

    let dropped = |lab: &Lab| {
        let maps = Maps::from_pins(&lab.pins.path).unwrap();
        let slot = maps.live_slots().unwrap()["web"];
        maps.rule_counters(slot).unwrap().dropped_packets
    };
    let dropped_before = dropped(&labs[0]);
    let flood =
        labs[0].send_in_background(web_traffic_from(&labs[0], 1, FLOOD, Duration::from_secs(5)));
    std::thread::sleep(Duration::from_millis(8 * REPORT_MS));
    let during: Vec<f64> = labs
        .iter()
        .map(|l| mean_share(l, Duration::from_millis(1500)))
        .collect();
    let refused = dropped(&labs[0]) - dropped_before;
    join(flood);
    for s in senders {
        join(s);
    }
    for d in daemons {
        d.stop();
    }
    eprintln!(
        "shares before the flood {before:.0?}, during it {during:.0?}; lb-1 refused {refused} \
         frames meanwhile"
    );
    assert!(
        refused > FLOOD * 3,
        "the flood was refused per source: {refused} frames refused"
    );
    for i in 1..3 {
        assert!(
            (during[i] - before[i]).abs() <= before[i] * 0.05,
            "lb-{}'s share moved from {:.0}/s to {:.0}/s under a flood at lb-1 (shares before \
             {before:.0?}, during {during:.0?})",
            i + 1,
            before[i],
            during[i]
        );
    }
}

/// A certificate of 32 DNS names (lb-m0 … lb-m31) reports as each of them in turn, with
/// `max_hosts = 4`: it is one host, lb-m0 (its first name), and every other name is
/// refused with PERMISSION_DENIED, so lb-2 and lb-3 still find room. Before, the
/// certificate was up to 32 hosts: lb-m0 … lb-m3 filled the fleet and lb-2 was refused.
#[test]
fn a_certificate_of_many_names_is_one_host() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let allocator = Allocator::start(dir.path(), &pki, "max_hosts = 4");
    let port = allocator.port;
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (many, honest) = runtime.block_on(async {
        let mut c = client(&pki, "many-names", port, None);
        let mut outcomes = Outcomes::default();
        let mut accepted = Vec::new();
        for i in 0..32 {
            let host = format!("lb-m{i}");
            let r = c.report(report(&host, 1000, 0)).await;
            if r.is_ok() {
                accepted.push(host);
            }
            outcomes.add(&r);
            // Within the connection's report rate.
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
        let mut honest = Outcomes::default();
        for host in ["lb-2", "lb-3"] {
            let mut c = client(&pki, host, port, None);
            honest.add(&c.report(report(host, 1000, 0)).await);
        }
        ((outcomes, accepted), honest)
    });
    let (outcomes, accepted) = many;
    let known = allocator.scrape()["limiter_allocator_known_hosts"];
    eprintln!("the 32-name certificate: {outcomes:?}, accepted as {accepted:?}; lb-2, lb-3: {honest:?}; known hosts {known}");
    assert_eq!(
        accepted,
        ["lb-m0"],
        "one certificate, one host: {outcomes:?}"
    );
    assert_eq!(outcomes.count(Code::PermissionDenied), 31, "{outcomes:?}");
    assert!(
        outcomes.message(Code::PermissionDenied).contains("lb-m0"),
        "the refusal names the certificate's host: {outcomes:?}"
    );
    assert_eq!(
        honest.count(Code::Ok),
        2,
        "the other hosts find room: {honest:?}"
    );
    // lb-m0's last report may be over a lease TTL old by now: it has left.
    assert!((2.0..=3.0).contains(&known), "known hosts {known}");
}
