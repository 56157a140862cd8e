//! The processes and links of the fleet lab: etcd and the allocator replicas electing
//! their leader in it, a relay per host and replica (the lab's partition switch), and the
//! hosts — each a veth pair of the harness with the real daemon on its near end and a
//! traffic source in its namespace. Everything is removed on drop, processes ended by
//! their pid.

use std::{
    io::{Read as _, Write as _},
    net::{Ipv4Addr, Shutdown, TcpListener, TcpStream},
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};
use limiter_common::share::ShareState;
use limiter_tests::{
    etcd::Etcd,
    frame::FrameBuilder,
    netns::{ifindex, spawn_in_netns, VethPair},
    pki::Pki,
    scenario::PinDir,
    traffic::{send, PacketSocket, SendPlan},
};
use limiter_user::{bpf::maps::Maps, observe::stats::share_state_at};

use super::{lease_age, HostReading, LabConfig, ReplicaReading};

/// The rule the lab's tenant has, and the address its traffic goes to.
pub const RULE: &str = "web";
pub const VIP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 10);
const SOURCE: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 1);

fn free_port() -> Result<u16> {
    free_port_on(Ipv4Addr::LOCALHOST)
}

fn free_port_on(ip: Ipv4Addr) -> Result<u16> {
    Ok(TcpListener::bind((ip, 0))
        .and_then(|l| l.local_addr())
        .with_context(|| format!("finding a free port on {ip}"))?
        .port())
}

/// A global quota of one rule, as the replicas' `[[quotas]]` list it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Quota {
    pub rule: String,
    pub rate: u64,
    pub burst: u64,
    /// `packets`, `bytes` or `syn`: the rule's unit in the daemons' configs.
    pub unit: &'static str,
}

/// What a replica's config says beyond its ports and certificates: where it listens,
/// the fleet timings, the quotas.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllocatorSpec {
    pub listen: Ipv4Addr,
    pub lease_ttl_ms: u64,
    pub report_interval_ms: u64,
    pub election_ttl_ms: u64,
    pub fleet_size: usize,
    pub quotas: Vec<Quota>,
}

impl AllocatorSpec {
    /// The fleet lab's: loopback, its one rule.
    pub fn lab(c: &LabConfig) -> AllocatorSpec {
        AllocatorSpec {
            listen: Ipv4Addr::LOCALHOST,
            lease_ttl_ms: c.lease_ttl_ms,
            report_interval_ms: c.report_interval_ms,
            election_ttl_ms: c.election_ttl_ms,
            fleet_size: c.hosts,
            quotas: vec![Quota {
                rule: RULE.to_string(),
                rate: c.quota,
                burst: c.burst(),
                unit: "packets",
            }],
        }
    }
}

/// The last lines of `log`, for an error about the process writing it.
pub fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

/// A child that gets `signal` if the lab dies without cleaning up (SIGKILL of the lab).
pub fn spawn_tied(cmd: &mut Command, signal: libc::c_int) -> std::io::Result<Child> {
    // SAFETY: prctl is async-signal-safe; it only sets this child's parent-death signal.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, signal as libc::c_ulong) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    };
    // A process group of its own: a Ctrl-C at the terminal reaches the lab, which ends
    // its children in order, not every process at once.
    cmd.process_group(0).spawn()
}

/// SIGKILL `child` by its pid, and reap it.
pub fn kill(child: &mut Child) {
    // SAFETY: signalling a process this lab started, by its id; not yet reaped, so the
    // pid is still ours.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGKILL) };
    let _ = child.wait();
}

/// One allocator replica: its config (with `[election]`), its process, its metrics.
pub struct Allocator {
    /// `alloc-1`…
    pub name: String,
    binary: PathBuf,
    config: PathBuf,
    log: PathBuf,
    /// The address it listens on (gRPC), with `port`.
    pub listen: Ipv4Addr,
    pub port: u16,
    pub metrics_port: u16,
    /// The etcd endpoint it elects through (a loopback address of its own).
    pub etcd: String,
    child: Option<Child>,
}

impl Allocator {
    /// Writes replica `n`'s config (1-based) and starts it: the lab's one rule, on
    /// loopback.
    pub fn new(
        n: usize,
        binary: PathBuf,
        dir: &Path,
        pki: &Pki,
        c: &LabConfig,
        etcd: String,
    ) -> Result<Allocator> {
        Allocator::with(n, binary, dir, pki, &AllocatorSpec::lab(c), etcd)
    }

    /// Writes replica `n`'s config from `spec` and starts it.
    pub fn with(
        n: usize,
        binary: PathBuf,
        dir: &Path,
        pki: &Pki,
        spec: &AllocatorSpec,
        etcd: String,
    ) -> Result<Allocator> {
        let name = format!("alloc-{n}");
        let (port, metrics_port) = (free_port_on(spec.listen)?, free_port()?);
        let server = pki.pair("allocator");
        let config = dir.join(format!("{name}.toml"));
        // `advertise` stays the listen address (the default): what a follower names in
        // its redirect. The fleet lab's hosts do not list it — each host lists its own
        // relays, the partition switch — so a host ignores the redirect (and logs that it
        // did) and tries the next relay of its list 200 ms later, round robin, until the
        // leader answers: at most two refusals, well within a lease. A redirect can name
        // only one address, and there are three relays to each replica, one per host.
        let quotas: String = spec
            .quotas
            .iter()
            .map(|q| {
                format!(
                    "[[quotas]]\nrule = \"{}\"\nrate = {}\nburst = {}\nunit = \"{}\"\n",
                    q.rule, q.rate, q.burst, q.unit
                )
            })
            .collect();
        std::fs::write(
            &config,
            format!(
                "listen = \"{}:{port}\"\nmetrics = \"127.0.0.1:{metrics_port}\"\n\
                 control_socket = \"{}\"\nlease_ttl_ms = {}\nreport_interval_ms = {}\n\
                 fleet_size = {}\n\
                 [tls]\nca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\n\
                 {quotas}\
                 [election]\netcd = [\"{etcd}\"]\nttl_ms = {}\n",
                spec.listen,
                dir.join(format!("{name}.sock")).display(),
                spec.lease_ttl_ms,
                spec.report_interval_ms,
                spec.fleet_size,
                pki.ca().display(),
                server.cert.display(),
                server.key.display(),
                spec.election_ttl_ms
            ),
        )
        .with_context(|| format!("writing {}", config.display()))?;
        let mut a = Allocator {
            log: dir.join(format!("{name}.log")),
            name,
            binary,
            config,
            listen: spec.listen,
            port,
            metrics_port,
            etcd,
            child: None,
        };
        a.start()?;
        Ok(a)
    }

    /// Starts it (again) on the same address; returns once it listens.
    pub fn start(&mut self) -> Result<u32> {
        if let Some(pid) = self.pid() {
            return Ok(pid);
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| format!("opening {}", self.log.display()))?;
        let child = spawn_tied(
            Command::new(&self.binary)
                .args(["run", "--config"])
                .arg(&self.config)
                .stdout(Stdio::null())
                .stderr(log),
            libc::SIGKILL,
        )
        .with_context(|| format!("starting {}", self.binary.display()))?;
        let pid = child.id();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect((self.listen, self.port)).is_err() {
            if Instant::now() > deadline || self.pid().is_none() {
                self.kill();
                bail!(
                    "{} did not listen on {}:{} within 10 s; its log:\n{}",
                    self.name,
                    self.listen,
                    self.port,
                    tail(&self.log)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(pid)
    }

    /// Its pid while it runs (a process that exited is reaped here).
    pub fn pid(&mut self) -> Option<u32> {
        let child = self.child.as_mut()?;
        match child.try_wait() {
            Ok(None) => Some(child.id()),
            _ => {
                self.child = None;
                None
            }
        }
    }

    /// SIGKILL, by pid: no goodbye to the hosts or etcd, as when its machine dies.
    pub fn kill(&mut self) -> Option<u32> {
        let mut child = self.child.take()?;
        let pid = child.id();
        kill(&mut child);
        Some(pid)
    }

    pub fn reading(&mut self) -> ReplicaReading {
        let pid = self.pid();
        let Some(metrics) = pid.and_then(|_| self.metrics().ok()) else {
            return ReplicaReading::down(&self.name, pid);
        };
        let value = |name: &str, rule: bool| {
            metrics
                .lines()
                .filter(|l| !l.starts_with('#'))
                // A prefix: the family may carry a unit suffix.
                .find(|l| {
                    l.starts_with(name)
                        && (!rule || l.contains(&format!("rule=\"{RULE}\"")))
                        && (rule || l.split_whitespace().next() == Some(name))
                })
                .and_then(|l| l.split_whitespace().last()?.parse::<f64>().ok())
                .map(|v| v as u64)
        };
        ReplicaReading {
            name: self.name.clone(),
            pid,
            up: true,
            leader: value("limiter_allocator_leader", false) == Some(1),
            term: value("limiter_allocator_term", false).unwrap_or(0),
            etcd_reachable: value("limiter_allocator_etcd_reachable", false).map(|v| v == 1),
            granted: value("limiter_allocator_granted", true),
            hosts: value("limiter_allocator_hosts", true),
        }
    }

    /// Its /metrics page (from the calling thread's network namespace).
    pub fn metrics(&self) -> Result<String> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.metrics_port))?;
        stream.set_read_timeout(Some(Duration::from_millis(500)))?;
        stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: lab\r\nConnection: close\r\n\r\n")?;
        let mut response = String::new();
        stream.read_to_string(&mut response)?;
        match response.split_once("\r\n\r\n") {
            Some((_, body)) => Ok(body.to_string()),
            None => bail!("no HTTP body"),
        }
    }
}

impl Drop for Allocator {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The replicas and the etcd they elect their leader in. Dropped in this order: the
/// replicas, then etcd.
pub struct Allocators {
    pub replicas: Vec<Allocator>,
    pub etcd: Etcd,
}

impl Allocators {
    /// Starts etcd, serving one loopback address per replica (127.0.0.11, .12, …, as the
    /// replica tests do), and the replicas, each electing through its own address.
    pub fn new(binary: &Path, dir: &Path, pki: &Pki, c: &LabConfig) -> Result<Allocators> {
        Allocators::with(binary, dir, pki, c.replicas, &AllocatorSpec::lab(c))
    }

    /// `replicas` replicas configured by `spec`, and their etcd (on loopback addresses
    /// of the calling thread's network namespace).
    pub fn with(
        binary: &Path,
        dir: &Path,
        pki: &Pki,
        replicas: usize,
        spec: &AllocatorSpec,
    ) -> Result<Allocators> {
        let addresses: Vec<Ipv4Addr> = (0..replicas)
            .map(|i| Ipv4Addr::new(127, 0, 0, 11 + i as u8))
            .collect();
        let etcd = Etcd::start(dir, &addresses).context("starting etcd")?;
        let mut started = Vec::new();
        for i in 0..replicas {
            started.push(Allocator::with(
                i + 1,
                binary.to_path_buf(),
                dir,
                pki,
                spec,
                etcd.endpoint(i),
            )?);
        }
        Ok(Allocators {
            replicas: started,
            etcd,
        })
    }

    pub fn ports(&self) -> Vec<u16> {
        self.replicas.iter().map(|r| r.port).collect()
    }

    pub fn readings(&mut self) -> Vec<ReplicaReading> {
        self.replicas.iter_mut().map(Allocator::reading).collect()
    }

    /// The replica that leads now (by its `limiter_allocator_leader` gauge).
    pub fn leader(&mut self) -> Option<usize> {
        self.readings().iter().position(|r| r.up && r.leader)
    }

    /// Waits until one replica leads; returns it.
    pub fn wait_leader(&mut self, within: Duration) -> Result<usize> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(i) = self.leader() {
                return Ok(i);
            }
            if Instant::now() > deadline {
                bail!(
                    "no allocator replica leads after {within:?} (etcd at {}); {}'s log:\n{}",
                    self.etcd.endpoint(0),
                    self.replicas.first().map_or("?", |r| r.name.as_str()),
                    self.replicas
                        .first()
                        .map_or(String::new(), |r| tail(&r.log))
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A TCP relay on loopback between one host and one allocator replica: the lab's switch
/// for partitioning that host (one relay per replica, all cut at once). Cut, it closes the host's connections and refuses new ones
/// (the allocator never hears from it); healed, it relays again. It touches no
/// namespace and no firewall of this machine.
pub struct Relay {
    pub port: u16,
    cut: Arc<AtomicBool>,
    streams: Arc<Mutex<Vec<TcpStream>>>,
}

impl Relay {
    pub fn new(upstream: u16) -> Result<Relay> {
        let listener = TcpListener::bind("127.0.0.1:0").context("binding a relay port")?;
        let port = listener.local_addr()?.port();
        let cut = Arc::new(AtomicBool::new(false));
        let streams = Arc::new(Mutex::new(Vec::new()));
        let (c, s) = (Arc::clone(&cut), Arc::clone(&streams));
        std::thread::spawn(move || {
            for down in listener.incoming().flatten() {
                if c.load(Ordering::Relaxed) {
                    continue; // dropped: closed at once
                }
                let Ok(up) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    continue; // the replica is down: the host sees its connection close
                };
                let _ = relay_pair(down, up, &s);
            }
        });
        Ok(Relay { port, cut, streams })
    }

    pub fn is_cut(&self) -> bool {
        self.cut.load(Ordering::Relaxed)
    }

    pub fn set_cut(&self, cut: bool) {
        self.cut.store(cut, Ordering::Relaxed);
        if cut {
            let mut streams = self.streams.lock().unwrap_or_else(|e| e.into_inner());
            for s in streams.drain(..) {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
    }
}

fn relay_pair(down: TcpStream, up: TcpStream, streams: &Mutex<Vec<TcpStream>>) -> Result<()> {
    {
        let mut streams = streams.lock().unwrap_or_else(|e| e.into_inner());
        // Forget connections that have ended (a shut-down clone is harmless to keep,
        // but the list would grow with every reconnect).
        streams.retain(|s| s.peer_addr().is_ok());
        streams.push(down.try_clone()?);
        streams.push(up.try_clone()?);
    }
    for (mut from, mut to) in [(down.try_clone()?, up.try_clone()?), (up, down)] {
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut from, &mut to);
            let _ = from.shutdown(Shutdown::Both);
            let _ = to.shutdown(Shutdown::Both);
        });
    }
    Ok(())
}

/// One load balancer host: a veth pair (near end here, where the daemon attaches; far
/// end in a namespace, where its traffic comes from), its pins, socket and daemon.
pub struct Host {
    pub name: String,
    binary: PathBuf,
    pub socket: PathBuf,
    log: PathBuf,
    daemon: Option<Child>,
    maps: Option<Maps>,
    /// One per replica, in the replicas' order: the host's `[fleet] allocator` list.
    pub relays: Vec<Relay>,
    pub pins: PinDir,
    pub pair: VethPair,
}

impl Host {
    /// Creates the pair and pins, writes the config and starts the daemon.
    pub fn new(
        n: usize,
        binary: PathBuf,
        dir: &Path,
        pki: &Pki,
        replica_ports: &[u16],
        c: &LabConfig,
    ) -> Result<Host> {
        let name = format!("lb-{n}");
        let pair = VethPair::new(1).with_context(|| format!("{name}: creating its veth pair"))?;
        let relays = replica_ports
            .iter()
            .map(|&port| Relay::new(port))
            .collect::<Result<Vec<Relay>>>()?;
        let list: Vec<String> = relays
            .iter()
            .map(|r| format!("\"127.0.0.1:{}\"", r.port))
            .collect();
        let pins = PinDir::new();
        let socket = dir.join(format!("{name}.sock"));
        let config = dir.join(format!("{name}.toml"));
        let tls = pki.pair(&name);
        std::fs::write(
            &config,
            format!(
                "interfaces = [\"{}\"]\nxdp_mode = \"native\"\npin_dir = \"{}\"\n\
                 control_socket = \"{}\"\nmetrics = \"\"\nfleet_size = {}\n\n\
                 [[rules]]\nname = \"{RULE}\"\ndst = \"{VIP}/32\"\nrate = {}\nburst = {}\n\
                 fail_mode = \"open\"\n\n\
                 [fleet]\nallocator = [{}]\nhost_id = \"{name}\"\nca = \"{}\"\n\
                 cert = \"{}\"\nkey = \"{}\"\nlease_ttl_ms = {}\nreport_interval_ms = {}\n\
                 sticky_max_s = {}\n",
                pair.host,
                pins.path.display(),
                socket.display(),
                c.hosts,
                c.quota,
                c.burst(),
                list.join(", "),
                pki.ca().display(),
                tls.cert.display(),
                tls.key.display(),
                c.lease_ttl_ms,
                c.report_interval_ms,
                c.sticky_max_s
            ),
        )
        .with_context(|| format!("writing {}", config.display()))?;
        let log = dir.join(format!("{name}.log"));
        let mut host = Host {
            name,
            binary,
            socket,
            log,
            daemon: None,
            maps: None,
            relays,
            pins,
            pair,
        };
        let out = std::fs::File::create(&host.log)
            .with_context(|| format!("creating {}", host.log.display()))?;
        host.daemon = Some(
            spawn_tied(
                Command::new(&host.binary)
                    .args(["run", "--config"])
                    .arg(&config)
                    .stdout(Stdio::null())
                    .stderr(out),
                libc::SIGTERM,
            )
            .with_context(|| format!("starting {}", host.binary.display()))?,
        );
        Ok(host)
    }

    /// Waits until the daemon answers on its socket, then opens its pins.
    pub fn wait_ready(&mut self, within: Duration) -> Result<()> {
        let deadline = Instant::now() + within;
        loop {
            let status = Command::new(&self.binary)
                .args(["status", "--socket"])
                .arg(&self.socket)
                .output()
                .context("running limiter status")?;
            if status.status.success() {
                break;
            }
            let exited = match self.daemon.as_mut() {
                Some(d) => d.try_wait()?.is_some(),
                None => true,
            };
            if exited || Instant::now() > deadline {
                bail!(
                    "{}: the daemon {} within {within:?}; its log:\n{}",
                    self.name,
                    if exited { "exited" } else { "did not answer" },
                    tail(&self.log)
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        self.maps = Some(
            Maps::from_pins(&self.pins.path)
                .with_context(|| format!("{}: opening {}", self.name, self.pins.path.display()))?,
        );
        Ok(())
    }

    /// Cut off from every replica (all its relays cut).
    pub fn is_cut(&self) -> bool {
        self.relays.iter().all(Relay::is_cut)
    }

    /// Cuts (or heals) all its relays at once: a partition of the host, not of one
    /// replica.
    pub fn set_cut(&self, cut: bool) {
        for r in &self.relays {
            r.set_cut(cut);
        }
    }

    pub fn daemon_pid(&self) -> Option<u32> {
        self.daemon.as_ref().map(Child::id)
    }

    /// The rule's state, share and counters from the pinned maps (what the kernel
    /// enforces, whatever the daemon is doing).
    pub fn reading(&self, ttl: Duration) -> Result<HostReading> {
        let maps = self
            .maps
            .as_ref()
            .with_context(|| format!("{}: not started", self.name))?;
        let slot = *maps
            .live_slots()?
            .get(RULE)
            .with_context(|| format!("{}: no rule {RULE} in its maps", self.name))?;
        let rule = maps.live_rule(slot)?;
        let counters = maps.rule_counters(slot)?;
        let now = limiter_fleet::clock::monotonic_ns();
        let state = share_state_at(&rule, now);
        // A bootstrap share holds no lease (its deadline is the rejoin's, not a grant's).
        let granted = !matches!(state, ShareState::Bootstrap | ShareState::Standalone);
        Ok(HostReading {
            state: state.as_str(),
            share: rule.rate,
            lease_age: granted
                .then(|| lease_age(rule.lease_expires_ns, now, ttl))
                .flatten(),
            passed: counters.passed_packets,
            dropped: counters.dropped_packets,
        })
    }

    /// Its traffic source: `rate` UDP frames/s to the VIP from its namespace, one
    /// second's plan after another, until `running` goes false.
    pub fn send(
        &self,
        rate: u64,
        running: Arc<AtomicBool>,
    ) -> Result<JoinHandle<Result<Result<()>>>> {
        let frame = FrameBuilder::ipv4(SOURCE, VIP)
            .macs(self.pair.peer_mac, self.pair.host_mac)
            .udp(40000, 9)
            .frame_len(64)
            .build();
        let peer = self.pair.peer.clone();
        spawn_in_netns(&self.pair.ns, move || -> Result<()> {
            let socket = PacketSocket::bind(ifindex(&peer)?, false)?;
            let plan = SendPlan {
                frames: vec![frame],
                rate: Some(rate),
                count: rate,
                duration: Duration::from_secs(1),
                cpu: None,
            };
            while running.load(Ordering::Relaxed) {
                send(&socket, &plan)?;
            }
            Ok(())
        })
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        // Close the maps, detach and unpin as the single-host lab does, then make sure the
        // daemon is gone; the pin dir and the pair (namespace, veth) go with the fields.
        self.maps = None;
        let _ = Command::new(&self.binary)
            .args(["detach", "--socket"])
            .arg(&self.socket)
            .arg("--pin-dir")
            .arg(&self.pins.path)
            .output();
        if let Some(mut d) = self.daemon.take() {
            kill(&mut d);
        }
    }
}

/// A binary beside this one (all live in target/<profile>/).
pub fn sibling(name: &str, package: &str) -> Result<PathBuf> {
    let me = std::env::current_exe().context("locating limiter-fleet-lab")?;
    let path = me.with_file_name(name);
    if !path.exists() {
        bail!(
            "{} is missing: build it with `cargo build --release -p {package}` \
             (`cargo xtask run -- --fleet` does)",
            path.display()
        );
    }
    Ok(path)
}
