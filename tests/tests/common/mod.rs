//! Running the `limiter` binary as an operator would, against a veth pair the test owns.
#![allow(dead_code, reason = "each test file uses a different part")]

pub mod fleet;
pub mod pki;

use std::{
    collections::BTreeSet,
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, Command, Output},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

pub use limiter_tests::binaries::LIMITER;
use limiter_tests::{
    netns::{ifindex, spawn_in_netns, VethPair},
    scenario::{send_timed, PinDir, TimedReport},
    traffic::{send, send_until, PacketSocket, SendPlan, SendReport},
};
use serde_json::Value;

/// Everything one daemon instance needs, removed on drop.
pub struct Lab {
    pub pair: VethPair,
    pub pins: PinDir,
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
    pub socket: PathBuf,
    pub metrics_port: u16,
    /// `xdp_mode` of the config ("native" unless made with [`Lab::with_mode`]).
    pub xdp_mode: &'static str,
    /// More top-level keys (TOML lines), e.g. `xdp_share`.
    pub settings: String,
}

/// A loopback TCP port nobody listens on now, and one this test process has not handed
/// out before: a port is only taken when the process it is for starts, so two calls in a
/// row could get the same one (a replica's metrics port came back as its gRPC port: its
/// metrics could not listen and the test read gRPC as metrics).
pub fn free_port() -> u16 {
    static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free loopback port");
        if HANDED_OUT
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(port)
        {
            return port;
        }
    }
}

impl Lab {
    /// A veth pair, a pin dir, and a config with `rules` (TOML `[[rules]]` text).
    pub fn new(rules: &str) -> Lab {
        Lab::with_mode(rules, "native")
    }

    /// The same with another `xdp_mode`.
    pub fn with_mode(rules: &str, xdp_mode: &'static str) -> Lab {
        Lab::with_settings(rules, xdp_mode, "")
    }

    /// The same with more top-level keys.
    pub fn with_settings(rules: &str, xdp_mode: &'static str, settings: &str) -> Lab {
        let pair = VethPair::new(1).expect("creating the veth pair");
        let pins = PinDir::new();
        let dir = tempfile::tempdir().expect("temp dir");
        let socket = dir.path().join("run/limiter.sock");
        let metrics_port = free_port();
        let config = dir.path().join("limiter.toml");
        let lab = Lab {
            pair,
            pins,
            dir,
            config,
            socket,
            metrics_port,
            xdp_mode,
            settings: settings.to_string(),
        };
        lab.write_config(rules);
        lab
    }

    /// Rewrites the config with other rules (same interface, pins, socket, metrics).
    pub fn write_config(&self, rules: &str) {
        let text = format!(
            "interfaces = [\"{}\"]\nxdp_mode = \"{}\"\n{}\npin_dir = \"{}\"\n\
             control_socket = \"{}\"\nmetrics = \"127.0.0.1:{}\"\n\n{rules}",
            self.pair.host,
            self.xdp_mode,
            self.settings,
            self.pins.path.display(),
            self.socket.display(),
            self.metrics_port
        );
        std::fs::write(&self.config, text).expect("writing the config");
    }

    pub fn start(&self) -> Daemon {
        let daemon = self.spawn();
        self.wait_ready();
        daemon
    }

    /// `limiter run` on this lab's config, without waiting for it to answer.
    fn spawn(&self) -> Daemon {
        let child = Command::new(LIMITER)
            .args(["run", "--config"])
            .arg(&self.config)
            .spawn()
            .expect("starting limiter run");
        Daemon(child)
    }

    /// Waits until the daemon answers on its socket.
    pub fn wait_ready(&self) {
        // Under TCG emulation a start (the verifier's work, mostly) takes 20-30 s.
        let limit = if limiter_tests::in_guest() { 120 } else { 20 };
        let deadline = Instant::now() + Duration::from_secs(limit);
        while !self.limiter(&["status", "--json"]).status.success() {
            assert!(
                Instant::now() < deadline,
                "daemon not ready after {limit} s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Runs a client command against this lab's socket.
    pub fn limiter(&self, args: &[&str]) -> Output {
        let mut cmd = Command::new(LIMITER);
        cmd.args(args);
        if matches!(args.first(), Some(&"stats")) {
            cmd.arg("--pin-dir").arg(&self.pins.path);
        } else {
            cmd.arg("--socket").arg(&self.socket);
        }
        if matches!(args.first(), Some(&"detach")) {
            cmd.arg("--pin-dir").arg(&self.pins.path);
        }
        cmd.output().expect("running limiter")
    }

    /// Runs a client command that must succeed; returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.limiter(args);
        assert!(
            out.status.success(),
            "limiter {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn json(&self, args: &[&str]) -> Value {
        serde_json::from_str(&self.ok(args)).expect("JSON output")
    }

    /// The stats entry of rule `name`.
    pub fn rule_stats(&self, name: &str) -> Value {
        let stats = self.json(&["stats", "--json"]);
        stats["rules"]
            .as_array()
            .and_then(|rules| rules.iter().find(|r| r["name"] == name).cloned())
            .unwrap_or_else(|| panic!("no rule {name} in {stats}"))
    }

    pub fn attached_program(&self) -> Option<u32> {
        let out = Command::new("ip")
            .args(["-d", "link", "show", "dev", &self.pair.host])
            .output()
            .expect("ip");
        let text = String::from_utf8_lossy(&out.stdout);
        let at = text.find("prog/xdp id ")?;
        text[at + 12..].split_whitespace().next()?.parse().ok()
    }

    /// `limiter run` on this config that must fail: its stderr (killed after 30 s).
    pub fn run_must_fail(&self) -> String {
        let mut child = Command::new(LIMITER)
            .args(["run", "--config"])
            .arg(&self.config)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("starting limiter run");
        // A refusal can come after the builds are verified, which takes tens of seconds
        // under a guest's emulation on a loaded machine (a 6.1 run took over 30 s).
        let wait = if limiter_tests::in_guest() { 180 } else { 30 };
        let deadline = Instant::now() + Duration::from_secs(wait);
        loop {
            if let Some(status) = child.try_wait().expect("waiting") {
                let mut err = String::new();
                std::io::Read::read_to_string(child.stderr.as_mut().expect("stderr"), &mut err)
                    .expect("reading stderr");
                assert!(!status.success(), "limiter run succeeded: {err}");
                return err;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("limiter run kept running for {wait} s where it must refuse");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Sends `plan` from the peer on a thread of its own.
    pub fn send_in_background(
        &self,
        plan: SendPlan,
    ) -> std::thread::JoinHandle<anyhow::Result<anyhow::Result<SendReport>>> {
        let peer = self.pair.peer.clone();
        spawn_in_netns(&self.pair.ns, move || {
            let socket = PacketSocket::bind(ifindex(&peer)?, false)?;
            send(&socket, &plan)
        })
        .expect("starting the sender")
    }

    /// [`Lab::send_in_background`] that the test can end before the plan runs out
    /// ([`Sender::stop`]), so that it does not wait for traffic it no longer measures.
    pub fn send_stoppable(&self, plan: SendPlan) -> Sender {
        let peer = self.pair.peer.clone();
        Sender::spawn(&self.pair.ns, move |stop| {
            let socket = PacketSocket::bind(ifindex(&peer)?, false)?;
            send_until(&socket, &plan, stop)
        })
    }

    /// [`Lab::send_poisson_in_background`] that the test can end early ([`Sender::stop`]).
    pub fn send_poisson_stoppable(
        &self,
        frames: Vec<Vec<u8>>,
        rate: f64,
        duration: Duration,
        seed: u64,
    ) -> Sender {
        let peer = self.pair.peer.clone();
        Sender::spawn(&self.pair.ns, move |stop| {
            let socket = PacketSocket::bind(ifindex(&peer)?, false)?;
            limiter_tests::traffic::send_poisson_until(&socket, &frames, rate, duration, seed, stop)
        })
    }

    /// `frames` from the peer as a Poisson process ([`limiter_tests::traffic::send_poisson`]).
    pub fn send_poisson_in_background(
        &self,
        frames: Vec<Vec<u8>>,
        rate: f64,
        duration: Duration,
        seed: u64,
    ) -> std::thread::JoinHandle<anyhow::Result<anyhow::Result<SendReport>>> {
        let peer = self.pair.peer.clone();
        spawn_in_netns(&self.pair.ns, move || {
            let socket = PacketSocket::bind(ifindex(&peer)?, false)?;
            limiter_tests::traffic::send_poisson(&socket, &frames, rate, duration, seed)
        })
        .expect("starting the sender")
    }

    /// [`Lab::send_in_background`], recording when each batch went out, so that a test
    /// can model what the meter should have admitted of the arrivals that really
    /// happened ([`limiter_tests::scenario::model_admits`]): a sender descheduled while
    /// a restarted daemon loads its program (seconds in an emulated guest) offers
    /// nothing in that time, and its bucket refills only up to its burst.
    pub fn send_timed_in_background(
        &self,
        plan: SendPlan,
    ) -> std::thread::JoinHandle<anyhow::Result<anyhow::Result<TimedReport>>> {
        let peer = self.pair.peer.clone();
        spawn_in_netns(&self.pair.ns, move || {
            let socket = PacketSocket::bind(ifindex(&peer)?, false)?;
            send_timed(&socket, &plan)
        })
        .expect("starting the sender")
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        // Whatever a test left attached or pinned goes (the veth goes with the pair).
        let _ = Command::new(LIMITER)
            .args(["detach", "--socket"])
            .arg(&self.socket)
            .arg("--pin-dir")
            .arg(&self.pins.path)
            .output();
    }
}

/// Polls `probe` every 20 ms until it returns `Ok`, and returns that; fails after
/// `within`, naming `what` was waited for and the probe's last `Err` (what it saw).
pub fn wait_for<T>(
    what: &str,
    within: Duration,
    mut probe: impl FnMut() -> Result<T, String>,
) -> T {
    let start = Instant::now();
    loop {
        match probe() {
            Ok(v) => return v,
            Err(seen) => assert!(
                start.elapsed() < within,
                "waited {within:?} for {what}; last seen: {seen}"
            ),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A daemon on each of `labs`, started together, once every one answers: their starts
/// (seconds each, mostly the verifier's) overlap instead of adding up.
pub fn start_all<'a>(labs: impl IntoIterator<Item = &'a Lab>) -> Vec<Daemon> {
    let labs: Vec<&Lab> = labs.into_iter().collect();
    let daemons: Vec<Daemon> = labs.iter().map(|lab| lab.spawn()).collect();
    for lab in &labs {
        lab.wait_ready();
    }
    daemons
}

/// `rate` frames/s for `duration`, alternating UDP to port 9 (the `web` rule of the
/// sharing tests) and UDP to `other_port` (another program's rule).
pub fn two_ports(pair: &VethPair, other_port: u16, rate: u64, duration: Duration) -> SendPlan {
    SendPlan {
        frames: vec![
            limiter_tests::scenario::udp_to_host(pair, 9, 64),
            limiter_tests::scenario::udp_to_host(pair, other_port, 64),
        ],
        rate: Some(rate),
        count: (rate as f64 * duration.as_secs_f64()) as u64,
        duration: duration + Duration::from_secs(2),
        cpu: None,
    }
}

pub fn join(
    handle: std::thread::JoinHandle<anyhow::Result<anyhow::Result<SendReport>>>,
) -> SendReport {
    handle
        .join()
        .expect("sender thread")
        .expect("sender in netns")
        .expect("sending")
}

/// [`join`] for [`Lab::send_timed_in_background`].
pub fn join_timed(
    handle: std::thread::JoinHandle<anyhow::Result<anyhow::Result<TimedReport>>>,
) -> TimedReport {
    handle
        .join()
        .expect("sender thread")
        .expect("sender in netns")
        .expect("sending")
}

/// Traffic from a lab's peer on a thread of its own, ended by [`Sender::stop`] (or when
/// dropped, e.g. by a failing test) or when its plan runs out.
pub struct Sender {
    stop: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<anyhow::Result<anyhow::Result<SendReport>>>>,
}

impl Sender {
    fn spawn(
        ns: &str,
        send: impl FnOnce(&AtomicBool) -> anyhow::Result<SendReport> + Send + 'static,
    ) -> Sender {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let handle = spawn_in_netns(ns, move || send(&flag)).expect("starting the sender");
        Sender {
            stop,
            handle: Some(handle),
        }
    }

    /// Ends the traffic now; what was sent until then (a sender that failed fails the test).
    pub fn stop(mut self) -> SendReport {
        self.stop.store(true, Ordering::Relaxed);
        join(self.handle.take().expect("a sender is joined once"))
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// A `limiter run` process; killed if a test fails before stopping it.
pub struct Daemon(pub Child);

impl Daemon {
    pub fn pid(&self) -> i32 {
        self.0.id() as i32
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: signalling the child this test started, by its id.
        assert_eq!(unsafe { libc::kill(self.pid(), sig) }, 0);
    }

    /// SIGTERM, then wait (bounded) for a clean exit.
    pub fn stop(mut self) {
        self.signal(libc::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = self.0.try_wait().expect("waiting") {
                assert!(status.success(), "limiter exited with {status}");
                return;
            }
            assert!(Instant::now() < deadline, "limiter did not exit on SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL: no cleanup at all.
    pub fn kill9(mut self) {
        self.signal(libc::SIGKILL);
        let _ = self.0.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn pin_exists(pins: &Path, name: &str) -> bool {
    pins.join(name).exists()
}

/// The body of one GET /metrics.
pub fn metrics(lab: &Lab) -> String {
    use std::io::{Read as _, Write as _};
    let mut stream =
        std::net::TcpStream::connect(("127.0.0.1", lab.metrics_port)).expect("metrics endpoint");
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("metrics request");
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .expect("metrics response");
    response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or_default()
}
