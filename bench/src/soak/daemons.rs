//! The limiter's daemon on each LB: `nsenter --net=/run/netns/LB limiter run --config …`
//! (not `ip netns exec`, whose private /sys would hide /sys/fs/bpf), on the LB's
//! `ingress`, its pins under a directory of this run, its control socket in the run's
//! directory, in fleet mode with the three replicas. Its rules' state and counters are
//! read from the pins (what the kernel enforces, whatever the daemon is doing).

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};
use limiter_tests::pki::Pki;
use limiter_user::{bpf::maps::Maps, observe::stats::share_state_at};

use super::{rules_toml, topology::in_ns, RuleSpec, SoakConfig};
use crate::fleet_lab::fleet::{kill, spawn_tied, tail};

/// One rule on one host at one moment.
#[derive(Clone, Debug, PartialEq)]
pub struct RuleReading {
    /// `leased`, `sticky`, `fail_open`, `bootstrap`…
    pub state: &'static str,
    /// The share in force (units/s).
    pub share: u64,
    /// Units admitted so far: SYNs for a `syn` rule, packets otherwise.
    pub admitted: u64,
    pub dropped: u64,
}

pub struct LbDaemon {
    /// `lb-1`… (its certificate's name).
    pub name: String,
    ns: String,
    binary: PathBuf,
    pub config: PathBuf,
    pub pins: PathBuf,
    pub socket: PathBuf,
    log: PathBuf,
    child: Option<Child>,
    maps: Option<Maps>,
    rules: Vec<RuleSpec>,
    /// Text of the config before the rules (restart-only keys, `[fleet]` after).
    head: String,
    fleet: String,
}

impl LbDaemon {
    /// Writes LB `n`'s config; does not start it.
    #[allow(clippy::too_many_arguments, reason = "the config's parts")]
    pub fn new(
        n: usize,
        ns: &str,
        binary: &Path,
        dir: &Path,
        tag: &str,
        pki: &Pki,
        allocators: &[String],
        c: &SoakConfig,
        rules: &[RuleSpec],
    ) -> Result<LbDaemon> {
        let name = format!("lb-{n}");
        let pins = PathBuf::from(format!("/sys/fs/bpf/limiter-soak-{tag}-lb{n}"));
        let socket = dir.join(format!("{name}.sock"));
        let tls = pki.pair(&name);
        let head = format!(
            "interfaces = [\"ingress\"]\nxdp_mode = \"native\"\npin_dir = \"{}\"\n\
             control_socket = \"{}\"\nmetrics = \"\"\nfleet_size = {}\n\n",
            pins.display(),
            socket.display(),
            allocators.len().max(1)
        );
        let fleet = format!(
            "[fleet]\nallocator = [{}]\nhost_id = \"{name}\"\nca = \"{}\"\ncert = \"{}\"\n\
             key = \"{}\"\nlease_ttl_ms = {}\nreport_interval_ms = {}\nsticky_max_s = {}\n",
            allocators
                .iter()
                .map(|a| format!("\"{a}\""))
                .collect::<Vec<_>>()
                .join(", "),
            pki.ca().display(),
            tls.cert.display(),
            tls.key.display(),
            c.lease_ttl_ms,
            c.report_interval_ms,
            c.sticky_max_s
        );
        let d = LbDaemon {
            config: dir.join(format!("{name}.toml")),
            log: dir.join(format!("{name}.log")),
            name,
            ns: ns.to_string(),
            binary: binary.to_path_buf(),
            pins,
            socket,
            child: None,
            maps: None,
            rules: rules.to_vec(),
            head,
            fleet,
        };
        d.write_config(1)?;
        Ok(d)
    }

    /// The config with the per-source rates × `scale` (a reload with changed quotas).
    pub fn write_config(&self, scale: u64) -> Result<()> {
        let text = format!(
            "{}{}{}",
            self.head,
            rules_toml(&self.rules, super::topology::VIP_PREFIX, scale),
            self.fleet
        );
        std::fs::write(&self.config, text)
            .with_context(|| format!("writing {}", self.config.display()))
    }

    /// Starts it (on its pins as they are: a restart takes the program and maps over);
    /// returns once `limiter status` answers.
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
            in_ns(&self.ns, &self.binary.to_string_lossy())
                .args(["run", "--config"])
                .arg(&self.config)
                .stdout(Stdio::null())
                .stderr(log),
            libc::SIGTERM,
        )
        .with_context(|| format!("{}: starting {}", self.name, self.binary.display()))?;
        let pid = child.id();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.answers() {
            if self.pid().is_none() || Instant::now() > deadline {
                bail!(
                    "{}: the daemon did not answer on {} ; its log:\n{}",
                    self.name,
                    self.socket.display(),
                    tail(&self.log)
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        self.maps = Some(
            Maps::from_pins(&self.pins)
                .with_context(|| format!("{}: opening {}", self.name, self.pins.display()))?,
        );
        Ok(pid)
    }

    fn answers(&self) -> bool {
        Command::new(&self.binary)
            .args(["status", "--socket"])
            .arg(&self.socket)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

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

    /// SIGKILL by pid: the program stays attached through its pinned link.
    pub fn kill(&mut self) -> Option<u32> {
        let mut child = self.child.take()?;
        let pid = child.id();
        kill(&mut child);
        Some(pid)
    }

    /// SIGTERM and wait: a clean stop (still enforcing), as an upgrade begins.
    pub fn stop(&mut self) -> Option<u32> {
        let child = self.child.take()?;
        let pid = child.id();
        super::services::stop(child, libc::SIGTERM, Duration::from_secs(10));
        Some(pid)
    }

    /// `limiter reload` of the config on disk.
    pub fn reload(&self) -> Result<()> {
        let out = Command::new(&self.binary)
            .args(["reload", "--socket"])
            .arg(&self.socket)
            .output()
            .context("running limiter reload")?;
        if !out.status.success() {
            bail!(
                "{}: limiter reload: {}",
                self.name,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    }

    /// Each rule's state, share and admitted units, from the pins.
    pub fn readings(&mut self) -> Result<BTreeMap<String, RuleReading>> {
        if self.maps.is_none() {
            self.maps = Some(Maps::from_pins(&self.pins)?);
        }
        let maps = self.maps.as_ref().context("no maps")?;
        let now = limiter_fleet::clock::monotonic_ns();
        let slots = maps.live_slots()?;
        let mut out = BTreeMap::new();
        for r in &self.rules {
            let Some(&slot) = slots.get(r.name) else {
                continue;
            };
            let rule = maps.live_rule(slot)?;
            let counters = maps.rule_counters(slot)?;
            let dropped = counters.dropped_packets;
            let admitted = if r.unit == "syn" {
                // A syn rule passes its other packets unmetered: what it admitted is the
                // SYNs it metered less those it dropped (a would-drop passes).
                maps.rule_syns(slot)?.saturating_sub(dropped)
            } else {
                counters.passed_packets
            };
            out.insert(
                r.name.to_string(),
                RuleReading {
                    state: share_state_at(&rule, now).as_str(),
                    share: rule.rate,
                    admitted,
                    dropped,
                },
            );
        }
        Ok(out)
    }

    /// Pin files under its pin directory.
    pub fn pin_count(&self) -> usize {
        count_files(&self.pins)
    }
}

fn count_files(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |entries| {
        entries
            .flatten()
            .map(|e| {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    count_files(&e.path())
                } else {
                    1
                }
            })
            .sum()
    })
}

impl LbDaemon {
    /// Stops enforcing: closes the maps, `limiter detach`, ends the daemon, removes the
    /// pins (the nftables minutes run without the limiter).
    pub fn detach(&mut self) {
        self.maps = None;
        let _ = Command::new(&self.binary)
            .args(["detach", "--socket"])
            .arg(&self.socket)
            .arg("--pin-dir")
            .arg(&self.pins)
            .output();
        if let Some(mut d) = self.child.take() {
            kill(&mut d);
        }
        let _ = std::fs::remove_dir_all(&self.pins);
    }
}

impl Drop for LbDaemon {
    fn drop(&mut self) {
        // Detach and unpin (as the labs do), and make sure it is gone.
        self.detach();
    }
}
