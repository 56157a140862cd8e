//! `cargo xtask run -- --fleet`: the fleet on this machine. Three allocator replicas
//! electing their leader in one etcd, and three daemons, each on a veth pair of its own
//! with traffic from a namespace and listing the three replicas, one tenant rule whose
//! global quota the three hosts' traffic exceeds, and fleet timings scaled down (lease
//! 3 s, reports every 0.5 s, election TTL 2 s, sticky_max 10 s) so that a failover and
//! the share ladder LEASED → STICKY → FAIL_OPEN and back play out in tens of seconds.
//!
//! In a terminal: a live view with keys (`k` kill the leading replica, `r` restart the
//! killed ones, `1`–`3` partition/heal a host, `q`/Ctrl-C quit). Otherwise, or with `--plain`/`--script`: one
//! plain line a second per host and one for the fleet, actions from `--script
//! "5:kill,20:restart,30:partition 2,40:heal 2"` and from stdin lines (`kill`, `restart`,
//! `partition N`, `heal N`, `quit`). `--duration S` stops after S seconds. Everything it
//! creates is removed on the way out, also on SIGTERM, errors and panics.

use std::{
    collections::VecDeque,
    io::{BufRead as _, IsTerminal as _},
    path::PathBuf,
    process::ExitCode,
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc, Arc,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};
use limiter_bench::fleet_lab::{
    fleet::{sibling, Allocators, Host},
    global_line, leader_change, parse_script, transition,
    view::{Screen, Terminal},
    Action, History, HostReading, HostSecond, LabConfig, ReplicaReading,
};
use limiter_tests::pki::Pki;

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

struct Options {
    config: LabConfig,
    duration: Option<Duration>,
    script: Vec<(Duration, Action)>,
    plain: bool,
}

const USAGE: &str = "usage: limiter-fleet-lab [--duration SECONDS] [--script \"T:ACTION,...\"] \
                     [--plain] [--quota N] [--rate-per-host N] [--sticky-max-s N] [--lease-ms N]";

fn options() -> Result<Options> {
    let mut o = Options {
        config: LabConfig::default(),
        duration: None,
        script: Vec::new(),
        plain: false,
    };
    let mut script = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |what: &str| {
            args.next()
                .with_context(|| format!("{arg} needs {what}; {USAGE}"))
        };
        let number = |text: String, arg: &str| -> Result<u64> {
            text.parse()
                .ok()
                .filter(|n| *n > 0)
                .with_context(|| format!("{arg} {text:?}: not a positive whole number"))
        };
        match arg.as_str() {
            "--duration" => {
                let v = value("SECONDS")?;
                o.duration = Some(Duration::from_secs(number(v, &arg)?));
            }
            "--script" => script = Some(value("a script")?),
            "--plain" => o.plain = true,
            "--quota" => o.config.quota = number(value("N")?, &arg)?,
            "--rate-per-host" => o.config.offered_per_host = number(value("N")?, &arg)?,
            "--sticky-max-s" => o.config.sticky_max_s = number(value("N")?, &arg)?,
            "--lease-ms" => {
                // Reports six times a lease, as the defaults do (3000 ms, 500 ms).
                o.config.lease_ttl_ms = number(value("MILLISECONDS")?, &arg)?.max(6);
                o.config.report_interval_ms = o.config.lease_ttl_ms / 6;
            }
            "--fleet" => {} // as xtask passes it on
            _ => bail!("unknown argument {arg:?}; {USAGE}"),
        }
    }
    o.config.check().context("--lease-ms")?;
    if let Some(script) = script {
        o.script = parse_script(&script, o.config.hosts).context("--script")?;
        o.plain = true;
    }
    if !std::io::stdout().is_terminal() {
        o.plain = true;
    }
    Ok(o)
}

/// The traffic sources; stopped and joined on drop (before the hosts go).
struct Senders {
    running: Arc<AtomicBool>,
    threads: Vec<JoinHandle<Result<Result<()>>>>,
}

impl Drop for Senders {
    fn drop(&mut self) {
        self.running.store(false, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// The lab's directory (configs, certificates, sockets, logs); removed on drop.
struct LabDir(PathBuf);

impl Drop for LabDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Where the view's lines go: the terminal UI or plain lines on stdout.
enum Output {
    Terminal(Terminal),
    Plain,
}

struct Lab {
    config: LabConfig,
    // Dropped in this order: traffic first, then the daemons, then the replicas and etcd.
    senders: Senders,
    hosts: Vec<Host>,
    allocators: Allocators,
    started: Instant,
    events: VecDeque<String>,
    plain: bool,
}

impl Lab {
    fn event(&mut self, text: String) {
        let line = format!("t={:.1} {text}", self.started.elapsed().as_secs_f64());
        if self.plain {
            println!("{line}");
        }
        self.events.push_back(line);
        while self.events.len() > 5 {
            self.events.pop_front();
        }
    }

    fn apply(&mut self, action: Action) -> Result<()> {
        match action {
            Action::Kill => {
                let readings = self.allocators.readings();
                let leading = readings.iter().position(|r| r.up && r.leader);
                let killed = leading.and_then(|i| {
                    let r = &mut self.allocators.replicas[i];
                    Some((r.name.clone(), r.kill()?, readings[i].term))
                });
                let left = readings.iter().filter(|r| r.up).count().saturating_sub(1);
                match killed {
                    Some((name, pid, term)) => self.event(format!(
                        "action=kill replica={name} replica_pid={pid} term={term} \
                         signal=SIGKILL ({})",
                        if left > 0 {
                            format!("the leader; {left} left to elect the next")
                        } else {
                            "the last one up; hosts keep their leases until they lapse".into()
                        }
                    )),
                    None => self.event(format!(
                        "action=kill: no replica leads now ({} of {} up): nothing killed",
                        readings.iter().filter(|r| r.up).count(),
                        readings.len()
                    )),
                }
            }
            Action::Restart => {
                // A restart that fails (its port taken meanwhile) is shown, not fatal: the
                // fleet runs on with the replicas it has, as it would.
                let mut started = Vec::new();
                let mut failed = Vec::new();
                for r in &mut self.allocators.replicas {
                    if r.pid().is_some() {
                        continue;
                    }
                    match r.start() {
                        Ok(pid) => started.push(format!("{} replica_pid={pid}", r.name)),
                        Err(e) => failed.push(format!("{}: {e:#}", r.name)),
                    }
                }
                if started.is_empty() && failed.is_empty() {
                    self.event("action=restart: every replica is running".into());
                }
                for s in started {
                    self.event(format!(
                        "action=restart replica={s} (it joins the election)"
                    ));
                }
                for f in failed {
                    self.event(format!("action=restart failed: {f}"));
                }
            }
            Action::Partition(n) | Action::Heal(n) | Action::Toggle(n) => {
                let host = &self.hosts[n - 1];
                let cut = match action {
                    Action::Partition(_) => true,
                    Action::Heal(_) => false,
                    _ => !host.is_cut(),
                };
                host.set_cut(cut);
                let name = host.name.clone();
                self.event(format!(
                    "action={} host={name} ({})",
                    if cut { "partition" } else { "heal" },
                    if cut {
                        "its connections to every replica closed, new ones refused"
                    } else {
                        "its allocator traffic flows again"
                    }
                ));
            }
            Action::Quit => STOP.store(true, Ordering::Relaxed),
        }
        Ok(())
    }

    fn readings(&self) -> Result<Vec<HostReading>> {
        let ttl = Duration::from_millis(self.config.lease_ttl_ms);
        self.hosts.iter().map(|h| h.reading(ttl)).collect()
    }
}

fn stdin_actions(hosts: usize) -> mpsc::Receiver<Result<Action>> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if line.trim().is_empty() {
                continue;
            }
            if tx.send(Action::parse(&line, hosts)).is_err() {
                break;
            }
        }
    });
    rx
}

fn run(o: Options) -> Result<()> {
    let c = o.config.clone();
    let limiter = sibling("limiter", "limiter-user")?;
    let allocator_binary = sibling("limiter-allocator", "limiter-allocator")?;
    if !std::path::Path::new(limiter_tests::etcd::ETCD).exists() {
        bail!(
            "{} is missing: `cargo xtask setup` installs Debian's etcd-server",
            limiter_tests::etcd::ETCD
        );
    }
    limiter_tests::netns::require_root()?;
    let dir =
        LabDir(std::env::temp_dir().join(format!("limiter-fleet-lab-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).with_context(|| format!("creating {}", dir.0.display()))?;
    println!("lab: {}", c.describe());
    let pki = Pki::create(&dir.0)?;
    let mut allocators = Allocators::new(&allocator_binary, &dir.0, &pki, &c)?;
    let first = allocators.wait_leader(Duration::from_secs(15))?;
    let ports = allocators.ports();
    let mut hosts = Vec::new();
    for n in 1..=c.hosts {
        hosts.push(Host::new(n, limiter.clone(), &dir.0, &pki, &ports, &c)?);
    }
    let mut lab = Lab {
        config: c.clone(),
        senders: Senders {
            running: Arc::new(AtomicBool::new(true)),
            threads: Vec::new(),
        },
        hosts,
        allocators,
        started: Instant::now(),
        events: VecDeque::new(),
        plain: o.plain,
    };
    for h in &mut lab.hosts {
        h.wait_ready(Duration::from_secs(60))?;
    }
    println!(
        "lab: etcd endpoints={} etcd_pid={} dir={}",
        (0..c.replicas)
            .map(|i| lab.allocators.etcd.endpoint(i))
            .collect::<Vec<_>>()
            .join(","),
        lab.allocators.etcd.pid().unwrap_or(0),
        dir.0.display()
    );
    for (i, r) in lab.allocators.replicas.iter_mut().enumerate() {
        let pid = r.pid().unwrap_or(0);
        println!(
            "lab: replica {} listen=127.0.0.1:{} metrics=127.0.0.1:{} etcd={} replica_pid={}{}",
            r.name,
            r.port,
            r.metrics_port,
            r.etcd,
            pid,
            if i == first { " (leads)" } else { "" }
        );
    }
    for h in &lab.hosts {
        println!(
            "lab: host {} namespace={} veth={} ({} -> {}) pins={} socket={} daemon_pid={} \
             relays={}",
            h.name,
            h.pair.ns,
            h.pair.host,
            h.pair.peer,
            h.pair.host,
            h.pins.path.display(),
            h.socket.display(),
            h.daemon_pid().unwrap_or(0),
            h.relays
                .iter()
                .map(|r| format!("127.0.0.1:{}", r.port))
                .collect::<Vec<_>>()
                .join(",")
        );
    }
    for h in &lab.hosts {
        let running = Arc::clone(&lab.senders.running);
        lab.senders
            .threads
            .push(h.send(c.offered_per_host, running)?);
    }
    let stdin = o.plain.then(|| stdin_actions(c.hosts));
    let mut output = if o.plain {
        Output::Plain
    } else {
        Output::Terminal(Terminal::new()?)
    };

    lab.started = Instant::now();
    let mut script = o.script.into_iter().peekable();
    let mut history = History::default();
    let mut before = lab.readings()?;
    let mut replicas_before: Vec<ReplicaReading> = lab.allocators.readings();
    if let Some(l) = limiter_bench::fleet_lab::leader(&replicas_before) {
        let text = format!("leader: {} (term {})", l.name, l.term);
        lab.event(text);
    }
    let mut last = Instant::now();
    let mut next_tick = last + Duration::from_secs(1);
    while !STOP.load(Ordering::Relaxed) && o.duration.is_none_or(|d| lab.started.elapsed() < d) {
        // Actions due: the script's, stdin's, keys'.
        while let Some((_, action)) = script.next_if(|(at, _)| lab.started.elapsed() >= *at) {
            lab.apply(action)?;
        }
        if let Some(rx) = &stdin {
            while let Ok(action) = rx.try_recv() {
                match action {
                    Ok(action) => lab.apply(action)?,
                    Err(e) => lab.event(format!("stdin: {e:#}")),
                }
            }
        }
        let wait = next_tick.saturating_duration_since(Instant::now());
        match &mut output {
            Output::Terminal(term) => {
                if let Some(action) = term.key(wait.min(Duration::from_millis(100)), c.hosts)? {
                    lab.apply(action)?;
                }
            }
            Output::Plain => std::thread::sleep(wait.min(Duration::from_millis(100))),
        }
        if Instant::now() < next_tick {
            continue;
        }
        next_tick += Duration::from_secs(1);

        let now = lab.readings()?;
        let elapsed = last.elapsed();
        last = Instant::now();
        let t = lab.started.elapsed();
        let seconds: Vec<HostSecond> = lab
            .hosts
            .iter()
            .zip(now.iter().cloned())
            .zip(&before)
            .map(|((h, r), b)| HostSecond::new(&h.name, Some(b), r, elapsed, h.is_cut()))
            .collect();
        for (s, b) in seconds.iter().zip(&before) {
            if let Some(change) = transition(&s.name, Some(b), &s.reading) {
                lab.event(change);
            }
        }
        before = now;
        let admitted: f64 = seconds.iter().map(|s| s.passed_per_s).sum();
        history.push(t, admitted);
        let replicas = lab.allocators.readings();
        if let Some(change) = leader_change(&replicas_before, &replicas) {
            lab.event(change);
        }
        replicas_before = replicas.clone();
        match &mut output {
            Output::Plain => {
                for s in &seconds {
                    println!("{}", s.plain_line(t));
                }
                for r in &replicas {
                    println!("{}", r.plain_line(t));
                }
                println!("{}", global_line(t, admitted, c.quota, &replicas));
            }
            Output::Terminal(term) => term.draw(&Screen {
                config: &c,
                t,
                hosts: &seconds,
                replicas: &replicas,
                admitted,
                history: &history,
                events: &lab.events,
            })?,
        }
    }
    drop(output);
    let Lab {
        senders,
        hosts,
        allocators,
        ..
    } = lab;
    drop(senders);
    let names: Vec<String> = hosts
        .iter()
        .map(|h| format!("{} {} {}", h.pair.ns, h.pair.host, h.pins.path.display()))
        .collect();
    drop(hosts);
    drop(allocators);
    drop(dir);
    println!(
        "lab: cleaned up (daemons, replicas and etcd ended, namespaces, veths and pins \
         removed: {})",
        names.join(", ")
    );
    Ok(())
}

fn main() -> ExitCode {
    // SAFETY: installing a handler that only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
    let result = options().and_then(run);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("limiter-fleet-lab: {e:#}");
            ExitCode::FAILURE
        }
    }
}
