//! The whole rehearsal's processes, in the order they are torn down (fields drop in
//! declaration order): attacks, clients, daemons, HAProxy, nginx, the replicas and etcd,
//! then the namespaces. Also where faults are applied and healed, and samples taken.

use std::{
    collections::BTreeMap,
    fs::File,
    os::fd::AsRawFd as _,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};
use limiter_tests::pki::Pki;

use super::{
    attacks::{self, Attacks},
    daemons::LbDaemon,
    faults::{Fault, FaultRecord},
    measure::{self, LeakSample, Second},
    rules,
    services::{self, Haproxy, Nginx},
    topology::{backend, Topology, ALLOCATOR_ADDR},
    traffic::Clients,
    RuleSpec, SoakConfig,
};
use crate::fleet_lab::fleet::{AllocatorSpec, Allocators, Quota};

/// Something to undo at a moment: a fault's end.
enum Heal {
    RestartReplicas,
    ResumeEtcd,
    Unpartition(usize),
    ReloadBack,
}

pub struct Rig {
    pub c: SoakConfig,
    pub epoch: Instant,
    pub dir: PathBuf,
    pub rules: Vec<RuleSpec>,
    pub attacks: Attacks,
    pub clients: Option<Clients>,
    pub daemons: Vec<LbDaemon>,
    haproxy: Option<Haproxy>,
    /// Two per LB: LB n's are at 2(n-1) and 2(n-1)+1.
    nginx: Vec<Nginx>,
    pub allocators: Allocators,
    pub topo: Topology,
    pub faults: Vec<FaultRecord>,
    heals: Vec<(Instant, usize, Heal)>,
    /// Whether the per-source limits are doubled now (a reload fault in force).
    pub reloaded: bool,
    pub confinement_frames: usize,
}

/// Moves the calling thread into namespace `ns` (only this thread: setns(CLONE_NEWNET)).
fn enter(ns: &str) -> Result<()> {
    let path = format!("/run/netns/{ns}");
    let file = File::open(&path).with_context(|| format!("opening {path}"))?;
    // SAFETY: a valid namespace fd; CLONE_NEWNET moves only the calling thread.
    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        bail!("setns into {path}: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

impl Rig {
    /// Builds the network, the services, the allocators (running, a leader elected) and
    /// the daemons' configs (not started: the baseline runs without the limiter). The
    /// calling thread is moved into the `ctl` namespace, where the replicas and etcd run
    /// and are sampled from.
    pub fn new(c: SoakConfig, limiter: &Path, allocator: &Path, dir: &Path) -> Result<Rig> {
        for (program, package) in services::TOOLS {
            services::require(program, package)?;
        }
        if !Path::new(limiter_tests::etcd::ETCD).exists() {
            bail!(
                "{} is missing: install Debian's etcd-server (`cargo xtask setup` does)",
                limiter_tests::etcd::ETCD
            );
        }
        let epoch = Instant::now();
        let topo = Topology::new(3)?;
        enter(&topo.ctl())?;
        let pki = Pki::create(dir)?;
        let mut nginx = Vec::new();
        for n in 1..=topo.lbs {
            for k in 0..2 {
                nginx.push(Nginx::start(
                    &format!("nginx-lb{n}-{k}"),
                    &topo.be(n),
                    backend(n, k),
                    dir,
                )?);
            }
            services::nft_lb(&topo.lb(n), n, n < topo.lbs)?;
        }
        let haproxy = Some(Haproxy::start(&topo.lb(topo.lbs), topo.lbs, dir)?);
        attacks::confine(&topo.ns("at"))?;
        let confinement_frames = attacks::check_confinement(&topo.ns("net"), &topo.ns("at"), dir)
            .context("the floods' source confinement")?;
        let rules = rules();
        let spec = AllocatorSpec {
            listen: ALLOCATOR_ADDR,
            lease_ttl_ms: c.lease_ttl_ms,
            report_interval_ms: c.report_interval_ms,
            election_ttl_ms: c.election_ttl_ms,
            fleet_size: topo.lbs,
            quotas: rules
                .iter()
                .map(|r| Quota {
                    rule: r.name.to_string(),
                    rate: r.rate,
                    burst: r.burst,
                    unit: r.unit,
                })
                .collect(),
        };
        let mut allocators = Allocators::with(allocator, dir, &pki, 3, &spec)?;
        allocators.wait_leader(Duration::from_secs(20))?;
        let addresses: Vec<String> = allocators
            .replicas
            .iter()
            .map(|r| format!("{}:{}", r.listen, r.port))
            .collect();
        let mut daemons = Vec::new();
        for n in 1..=topo.lbs {
            daemons.push(LbDaemon::new(
                n,
                &topo.lb(n),
                limiter,
                dir,
                &topo.tag,
                &pki,
                &addresses,
                &c,
                &rules,
            )?);
        }
        Ok(Rig {
            c,
            epoch,
            dir: dir.to_path_buf(),
            rules,
            attacks: Attacks::default(),
            clients: None,
            daemons,
            haproxy,
            nginx,
            allocators,
            topo,
            faults: Vec::new(),
            heals: Vec::new(),
            reloaded: false,
            confinement_frames,
        })
    }

    pub fn t(&self) -> f64 {
        self.epoch.elapsed().as_secs_f64()
    }

    /// Starts the legitimate load.
    pub fn start_clients(&mut self) -> Result<()> {
        self.clients = Some(Clients::start(
            &self.topo.ns("cl"),
            self.topo.lbs,
            &self.c,
            &self.dir,
            self.epoch,
        )?);
        Ok(())
    }

    /// Ends the clients' wrk segments (a phase or minute begins).
    pub fn cut(&self) {
        if let Some(c) = &self.clients {
            c.cut();
        }
    }

    /// Starts every daemon (the limiter attaches to every LB's ingress).
    pub fn start_limiters(&mut self) -> Result<()> {
        for d in &mut self.daemons {
            d.start()?;
        }
        Ok(())
    }

    /// Applies `fault` to LB `lb` (or the fleet), recording it; its healing is scheduled.
    pub fn begin(&mut self, fault: Fault, lb: usize) -> Result<()> {
        let from = self.t();
        let index = self.faults.len();
        let now = Instant::now();
        let ten = Duration::from_secs(10);
        let (target, note, heal) = match fault {
            Fault::LeaderKill => {
                let leader = self.allocators.leader();
                match leader.and_then(|i| {
                    let r = &mut self.allocators.replicas[i];
                    Some((r.name.clone(), r.kill()?))
                }) {
                    Some((name, pid)) => (
                        name,
                        format!("SIGKILL pid {pid}; restarted 10 s later"),
                        Some((now + ten, Heal::RestartReplicas)),
                    ),
                    None => ("none".into(), "no replica led: nothing killed".into(), None),
                }
            }
            Fault::EtcdRestart => {
                let pid = self.allocators.etcd.pid().unwrap_or(0);
                self.allocators.etcd.kill();
                (
                    "etcd".into(),
                    format!("SIGKILL pid {pid}; started again 10 s later"),
                    Some((now + ten, Heal::ResumeEtcd)),
                )
            }
            Fault::DaemonKill => {
                let d = &mut self.daemons[lb - 1];
                let old = d.kill().unwrap_or(0);
                let new = d.start()?;
                (
                    d.name.clone(),
                    format!("SIGKILL pid {old}; `limiter run` again: pid {new}"),
                    None,
                )
            }
            Fault::Upgrade => {
                let d = &mut self.daemons[lb - 1];
                let old = d.stop().unwrap_or(0);
                let new = d.start()?;
                (
                    d.name.clone(),
                    format!("SIGTERM pid {old}; `limiter run` over the same pins: pid {new}"),
                    None,
                )
            }
            Fault::Reload => {
                self.reload(2)?;
                (
                    "every LB".into(),
                    "per-source limits doubled, `limiter reload`; halved back 20 s later".into(),
                    Some((now + 2 * ten, Heal::ReloadBack)),
                )
            }
            Fault::Partition => {
                self.topo.set_partitioned(lb, true)?;
                (
                    format!("lb-{lb}"),
                    format!("management link down for {} s", self.c.partition.as_secs()),
                    Some((now + self.c.partition, Heal::Unpartition(lb))),
                )
            }
            Fault::BackendRestart => {
                let n = &mut self.nginx[2 * (lb - 1)];
                n.restart()?;
                (
                    n.name.clone(),
                    format!("SIGQUIT, started again: pid {}", n.pid().unwrap_or(0)),
                    None,
                )
            }
        };
        let to = heal.is_none().then(|| self.t());
        if let Some((at, h)) = heal {
            self.heals.push((at, index, h));
        }
        self.faults.push(FaultRecord {
            fault,
            target,
            from,
            to,
            note,
        });
        Ok(())
    }

    fn reload(&mut self, scale: u64) -> Result<()> {
        for d in &self.daemons {
            d.write_config(scale)?;
            d.reload()?;
        }
        self.reloaded = scale != 1;
        Ok(())
    }

    /// Heals what is due (or everything, with `all`).
    pub fn heal(&mut self, all: bool) -> Result<()> {
        let now = Instant::now();
        let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.heals)
            .into_iter()
            .partition(|(at, _, _)| all || *at <= now);
        self.heals = later;
        for (_, index, heal) in due {
            match heal {
                Heal::RestartReplicas => {
                    for r in &mut self.allocators.replicas {
                        if r.pid().is_none() {
                            r.start()?;
                        }
                    }
                }
                Heal::ResumeEtcd => self.allocators.etcd.resume()?,
                Heal::Unpartition(lb) => self.topo.set_partitioned(lb, false)?,
                Heal::ReloadBack => self.reload(1)?,
            }
            let t = self.t();
            if let Some(f) = self.faults.get_mut(index) {
                f.to = Some(t);
            }
        }
        Ok(())
    }

    /// One second's sample.
    pub fn second(&mut self) -> Second {
        let t = self.t();
        let hosts = self
            .daemons
            .iter_mut()
            .map(|d| d.readings().unwrap_or_default())
            .collect();
        let mut granted = BTreeMap::new();
        let mut leader = None;
        for r in &mut self.allocators.replicas {
            if r.pid().is_none() {
                continue;
            }
            if let Ok(text) = r.metrics() {
                let (leads, g) = measure::parse_allocator_metrics(&text);
                if leads {
                    leader = Some(r.name.clone());
                    granted = g;
                    break;
                }
            }
        }
        Second {
            t,
            hosts,
            granted,
            leader,
        }
    }

    /// One leak sample.
    pub fn leak_sample(&mut self) -> LeakSample {
        let mut processes = Vec::new();
        let mut daemon_pids = Vec::new();
        for d in &mut self.daemons {
            if let Some(pid) = d.pid() {
                daemon_pids.push(pid);
                if let Some((rss, fds)) = measure::proc_usage(pid) {
                    processes.push((d.name.clone(), pid, rss, fds));
                }
            }
        }
        for r in &mut self.allocators.replicas {
            if let Some(pid) = r.pid() {
                if let Some((rss, fds)) = measure::proc_usage(pid) {
                    processes.push((r.name.clone(), pid, rss, fds));
                }
            }
        }
        if let Some(pid) = self.allocators.etcd.pid() {
            if let Some((rss, fds)) = measure::proc_usage(pid) {
                processes.push(("etcd".into(), pid, rss, fds));
            }
        }
        let (progs, maps, links) = measure::bpf_held(&daemon_pids);
        LeakSample {
            t: self.t(),
            progs,
            maps,
            links,
            pins: self.daemons.iter().map(|d| d.pin_count() as u64).sum(),
            etcd_keys: measure::etcd_keys(self.allocators.etcd.clients[0]).ok(),
            processes,
        }
    }

    /// Each LB's counters of what reached its stack.
    pub fn lb_counters(&self) -> Vec<BTreeMap<String, u64>> {
        (1..=self.topo.lbs)
            .map(|n| {
                services::read_counters(&self.topo.lb(n))
                    .map(|v| v.into_iter().collect())
                    .unwrap_or_default()
            })
            .collect()
    }

    /// What the report says about the processes.
    pub fn describe(&mut self) -> Vec<String> {
        let mut lines = vec![format!("namespaces: {}", self.topo.namespaces().join(" "))];
        for d in &mut self.daemons {
            let pid = d.pid().unwrap_or(0);
            lines.push(format!(
                "{}: pid {pid}, pins {}, socket {}",
                d.name,
                d.pins.display(),
                d.socket.display()
            ));
        }
        for r in &mut self.allocators.replicas {
            let pid = r.pid().unwrap_or(0);
            lines.push(format!("{}: {}:{} pid {pid}", r.name, r.listen, r.port));
        }
        for n in &self.nginx {
            lines.push(format!("{}: pid {}", n.name, n.pid().unwrap_or(0)));
        }
        if let Some(h) = &self.haproxy {
            lines.push(format!(
                "haproxy (lb-{}): pid {}",
                self.topo.lbs,
                h.pid().unwrap_or(0)
            ));
        }
        lines
    }
}
