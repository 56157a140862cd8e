//! The fleet's real processes for the suites that run one (fleet.rs, replicas.rs): the
//! allocator, daemon configs, traffic through each daemon's veth pair, and what the
//! daemons and the allocator say (share states, counters, metrics).

use std::{
    collections::BTreeMap,
    net::{Ipv4Addr, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command},
    time::{Duration, Instant},
};

use limiter_tests::{frame::FrameBuilder, scenario::PEER_V4, tools, traffic::SendPlan};
use limiter_user::bpf::maps::Maps;

use super::{pki::Pki, Lab, LIMITER};

pub const QUOTA: u64 = 3000;
/// The burst of `web` and `cap` in the allocators' and the hosts' configs.
pub const BURST: u64 = 300;
pub const LEASE_MS: u64 = 1500;
pub const REPORT_MS: u64 = 300;
pub const STICKY_S: u64 = 3;

/// [`super::free_port`]: never the same port twice in one test process.
pub fn free_port() -> u16 {
    super::free_port()
}

pub struct Allocator {
    pub child: Option<Child>,
    pub config: PathBuf,
    pub port: u16,
}

impl Allocator {
    pub fn binary() -> PathBuf {
        let path = Path::new(LIMITER).with_file_name("limiter-allocator");
        assert!(
            path.exists(),
            "{} is missing: `cargo xtask test` builds it (cargo build --release -p limiter-allocator)",
            path.display()
        );
        path
    }

    pub fn new(dir: &Path, pki: &Pki) -> Allocator {
        Self::with_metrics(dir, pki, None)
    }

    pub fn with_metrics(dir: &Path, pki: &Pki, metrics: Option<u16>) -> Allocator {
        Self::timed(dir, pki, metrics, LEASE_MS, REPORT_MS)
    }

    pub fn timed(
        dir: &Path,
        pki: &Pki,
        metrics: Option<u16>,
        lease_ms: u64,
        report_ms: u64,
    ) -> Allocator {
        Self::configured(dir, pki, metrics, lease_ms, report_ms, "")
    }

    /// An allocator whose config ends with `tables` (such as an `[election]` table).
    pub fn configured(
        dir: &Path,
        pki: &Pki,
        metrics: Option<u16>,
        lease_ms: u64,
        report_ms: u64,
        tables: &str,
    ) -> Allocator {
        Self::configured_with(dir, pki, metrics, lease_ms, report_ms, "", tables)
    }

    /// An allocator whose config has the top-level `settings` (such as peer bounds) and
    /// ends with `tables`.
    pub fn configured_with(
        dir: &Path,
        pki: &Pki,
        metrics: Option<u16>,
        lease_ms: u64,
        report_ms: u64,
        settings: &str,
        tables: &str,
    ) -> Allocator {
        Self::build(
            dir,
            pki,
            metrics,
            (lease_ms, report_ms),
            0,
            settings,
            tables,
        )
    }

    /// [`Allocator::configured`] with `fleet_size` (the joiner's share: quota ÷ it).
    pub fn sized(
        dir: &Path,
        pki: &Pki,
        metrics: Option<u16>,
        (lease_ms, report_ms): (u64, u64),
        fleet_size: u32,
        tables: &str,
    ) -> Allocator {
        Self::build(
            dir,
            pki,
            metrics,
            (lease_ms, report_ms),
            fleet_size,
            "",
            tables,
        )
    }

    /// An allocator of `fleet_size` (0: none in its file, so it uses the hosts' own)
    /// whose config has the top-level `settings` and ends with `tables`.
    pub fn build(
        dir: &Path,
        pki: &Pki,
        metrics: Option<u16>,
        (lease_ms, report_ms): (u64, u64),
        fleet_size: u32,
        settings: &str,
        tables: &str,
    ) -> Allocator {
        let port = free_port();
        let metrics = metrics.map_or(String::new(), |p| format!("127.0.0.1:{p}"));
        let fleet_size = if fleet_size == 0 {
            String::new()
        } else {
            format!("fleet_size = {fleet_size}\n")
        };
        let server = pki.pair("allocator");
        let config = dir.join("allocator.toml");
        std::fs::write(
            &config,
            format!(
                "listen = \"127.0.0.1:{port}\"\nmetrics = \"{metrics}\"\ncontrol_socket = \"{}\"\n\
                 lease_ttl_ms = {lease_ms}\nreport_interval_ms = {report_ms}\n{fleet_size}\
                 {settings}\n[tls]\nca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\n\
                 [[quotas]]\nrule = \"web\"\nrate = {QUOTA}\nburst = {BURST}\n\
                 [[quotas]]\nrule = \"cap\"\nrate = {QUOTA}\nburst = {BURST}\n{tables}",
                dir.join("allocator.sock").display(),
                pki.ca().display(),
                server.cert.display(),
                server.key.display()
            ),
        )
        .unwrap();
        let mut a = Allocator {
            child: None,
            config,
            port,
        };
        a.start();
        a
    }

    /// The control socket (`quota`, `status`).
    pub fn socket(&self) -> PathBuf {
        self.config.with_file_name("allocator.sock")
    }

    pub fn start(&mut self) {
        let child = Command::new(Self::binary())
            .args(["run", "--config"])
            .arg(&self.config)
            .spawn()
            .expect("starting limiter-allocator");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "allocator did not listen");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Allocator {
    fn drop(&mut self) {
        self.kill();
    }
}

pub fn daemon_config(host: &str, pki: &Pki, port: u16, cert: &str) -> String {
    daemon_config_timed(host, pki, port, cert, LEASE_MS, REPORT_MS)
}

pub fn daemon_config_timed(
    host: &str,
    pki: &Pki,
    port: u16,
    cert: &str,
    lease_ms: u64,
    report_ms: u64,
) -> String {
    let pair = pki.pair(cert);
    format!(
        "fleet_size = 3\n\
         [[rules]]\nname = \"web\"\ndst = \"198.18.0.2/32\"\nrate = {QUOTA}\nburst = {BURST}\nfail_mode = \"open\"\n\
         [[rules]]\nname = \"cap\"\ndst = \"198.18.0.3/32\"\nrate = {QUOTA}\nburst = {BURST}\nfail_mode = \"static\"\n\
         [fleet]\nallocator = \"127.0.0.1:{port}\"\nhost_id = \"{host}\"\nca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\n\
         lease_ttl_ms = {lease_ms}\nreport_interval_ms = {report_ms}\nsticky_max_s = {STICKY_S}\n",
        pki.ca().display(),
        pair.cert.display(),
        pair.key.display()
    )
}

/// Frames to both rules' destinations, from the lab's peer.
pub fn traffic(lab: &Lab, rate_per_rule: u64, duration: Duration) -> SendPlan {
    let frame = |dst: Ipv4Addr| {
        FrameBuilder::ipv4(PEER_V4, dst)
            .macs(lab.pair.peer_mac, lab.pair.host_mac)
            .udp(1, 9)
            .frame_len(64)
            .build()
    };
    SendPlan {
        frames: vec![
            frame(Ipv4Addr::new(198, 18, 0, 2)),
            frame(Ipv4Addr::new(198, 18, 0, 3)),
        ],
        rate: Some(2 * rate_per_rule),
        count: 2 * rate_per_rule * duration.as_secs(),
        duration: duration + Duration::from_secs(2),
        cpu: None,
    }
}

/// One frame to the `web` rule's destination, from the lab's peer.
pub fn web_frame(lab: &Lab) -> Vec<u8> {
    FrameBuilder::ipv4(PEER_V4, Ipv4Addr::new(198, 18, 0, 2))
        .macs(lab.pair.peer_mac, lab.pair.host_mac)
        .udp(1, 9)
        .frame_len(64)
        .build()
}

/// (passed, dropped) of `rule` on each lab, read from the pins.
pub fn counters(labs: &[&Lab], rule: &str) -> Vec<(u64, u64)> {
    labs.iter()
        .map(|lab| {
            let maps = Maps::from_pins(&lab.pins.path).unwrap();
            let slot = maps.live_slots().unwrap()[rule];
            let c = maps.rule_counters(slot).unwrap();
            (c.passed_packets, c.dropped_packets)
        })
        .collect()
}

pub fn states(lab: &Lab) -> BTreeMap<String, String> {
    let stats = lab.json(&["stats", "--json"]);
    stats["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["name"].as_str().unwrap().to_string(),
                r["state"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

pub fn wait_state(labs: &[&Lab], rule: &str, state: &str, within: Duration) -> Duration {
    let start = Instant::now();
    loop {
        if labs.iter().all(|l| states(l)[rule] == state) {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < within,
            "{rule} not {state} after {within:?}: {:?}",
            labs.iter().map(|l| states(l)).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Global admitted rate of `rule` over `window`.
pub fn admitted_rate(labs: &[&Lab], rule: &str, window: Duration) -> f64 {
    let before = passed_at(labs, rule);
    std::thread::sleep(window);
    rate_between(&before, &passed_at(labs, rule))
}

/// The fleet's admitted rate between two [`passed_at`] readings: each host's frames over
/// its own two readings' interval. Timed from before the first reading or after the
/// last, a reading slowed by a loaded machine (the host suite runs in lanes beside CI's
/// guest) counted frames outside the interval and made a rate 3.5 % too high.
pub fn rate_between(before: &[(u64, Instant)], after: &[(u64, Instant)]) -> f64 {
    before
        .iter()
        .zip(after)
        .map(|((b, b_at), (a, a_at))| (a - b) as f64 / (*a_at - *b_at).as_secs_f64())
        .sum()
}

/// `rule`'s passed frames on each lab, each with when it was read (the middle of its
/// reading).
pub fn passed_at(labs: &[&Lab], rule: &str) -> Vec<(u64, Instant)> {
    labs.iter()
        .map(|lab| {
            let start = Instant::now();
            let passed = counters(&[lab], rule)[0].0;
            (passed, start + start.elapsed() / 2)
        })
        .collect()
}

/// [`hosts`] with their own lease TTL and report interval (ms).
pub fn timed_hosts(n: usize, pki: &Pki, port: u16, lease_ms: u64, report_ms: u64) -> Vec<Lab> {
    (1..=n)
        .map(|i| {
            let host = format!("lb-{i}");
            Lab::new(&daemon_config_timed(
                &host, pki, port, &host, lease_ms, report_ms,
            ))
        })
        .collect()
}

/// `n` hosts lb-1…lb-n, each with its own veth pair, pins and socket, and its own
/// client certificate.
pub fn hosts(n: usize, pki: &Pki, port: u16) -> Vec<Lab> {
    (1..=n)
        .map(|i| {
            Lab::new(&daemon_config(
                &format!("lb-{i}"),
                pki,
                port,
                &format!("lb-{i}"),
            ))
        })
        .collect()
}

pub fn daemon_config_bound(host: &str, pki: &Pki, port: u16, bind: &str) -> String {
    format!(
        "{}bind = \"{bind}\"\n",
        daemon_config(host, pki, port, host)
    )
}

/// The `web` share (rate in force) on `lab`.
pub fn web_share(lab: &Lab) -> u64 {
    lab.rule_stats("web")["rate"].as_u64().unwrap()
}

/// The `web` shares in force on `labs` at one instant. Read one host after another, a
/// sum can take one host's share from before a grant and another's from after it (530 +
/// 584 + 1,942 = 3,056 of 3,000, read beside CI's other tests while the shares moved),
/// so the hosts are read in sweeps until two sweeps in a row agree: each host then held
/// its share from its reading in the first to its reading in the second, and every
/// reading of the first came before every reading of the second, so at the moment
/// between the sweeps every host held the share returned. Fails if the shares do not
/// hold still for two sweeps within 5 s (grants come once a report interval a host).
pub fn web_shares(labs: &[Lab]) -> Vec<u64> {
    let start = Instant::now();
    let mut last: Vec<u64> = labs.iter().map(web_share).collect();
    loop {
        let now: Vec<u64> = labs.iter().map(web_share).collect();
        if now == last {
            return now;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "web's shares did not hold still for two readings in a row within 5 s \
             (the last two: {last:?}, {now:?})"
        );
        last = now;
    }
}

/// Waits until `lab`'s `web` share is `rate`: a freshly started allocator learns for a
/// lease TTL, granting a host that holds nothing only a joiner's share meanwhile, and
/// splits the quota at the first report after that. Fails after `within`.
pub fn wait_web_share(lab: &Lab, rate: u64, within: Duration) {
    let start = Instant::now();
    loop {
        let share = web_share(lab);
        if share == rate {
            return;
        }
        assert!(
            start.elapsed() < within,
            "web's share is {share}/s, not {rate}/s, after {within:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// An nftables table that drops one host's traffic to the allocator; removed on drop.
pub struct Partition(pub String);

impl Partition {
    /// Drops `source`'s packets to TCP `port`.
    pub fn new(source: &str, port: u16) -> Partition {
        Self::dropping(&[format!("ip saddr {source} tcp dport {port}")])
    }

    /// Drops locally sent packets matching any of `matches` (nft rule expressions).
    pub fn dropping(matches: &[String]) -> Partition {
        // Unique in the process too, so that tests of one file may run side by side.
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let table = format!("limtest_part_{}_{n}", std::process::id());
        let mut script = format!(
            "add table inet {table}\n\
             add chain inet {table} out {{ type filter hook output priority 0; }}\n"
        );
        for m in matches {
            script.push_str(&format!("add rule inet {table} out {m} drop\n"));
        }
        tools::nft(&["-f", "-"], Some(&script))
            .unwrap_or_else(|e| panic!("nft refused the partition rules: {e:#}"));
        Partition(table)
    }
}

impl Drop for Partition {
    fn drop(&mut self) {
        let _ = tools::nft(&["delete", "table", "inet", &self.0], None);
    }
}

/// The body of one GET /metrics on the loopback `port`.
pub fn scrape_text(port: u16) -> String {
    use std::io::{Read as _, Write as _};
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    text.split_once("\r\n\r\n").unwrap().1.to_string()
}

pub fn scrape(port: u16) -> BTreeMap<String, f64> {
    scrape_text(port)
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (k, v) = l.rsplit_once(' ').unwrap();
            (k.to_string(), v.parse().unwrap())
        })
        .collect()
}
