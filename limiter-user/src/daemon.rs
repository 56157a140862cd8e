//! The daemon's state and every operation on it: start (load or adopt the program and
//! its pins), reload, quota changes, status, stats, explain, stop and detach. The async
//! plumbing (signals, control socket, metrics) lives in the binary and calls in here.

use std::{
    collections::{BTreeMap, VecDeque},
    fs::{self, File},
    os::{fd::AsRawFd, unix::fs::DirBuilderExt},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use serde::Serialize;

use crate::{
    config::{Config, RateSpec, RuleSpec, Unit},
    error::Error,
    explain::{self, ExplainQuery, Explanation},
    maps::Maps,
    program::{remove_pins, unpin_link, Attachment, LinkOrigin, LoadOptions, Program},
    ruleset::{self, RuleTable},
    stats::{self, StatsReport},
};

/// Compiles `rules`, keeping the slots the live table already gives them, and installs
/// them atomically. Returns the installed table.
pub fn install_rules(maps: &mut Maps, rules: &[RuleSpec]) -> Result<RuleTable, Error> {
    let previous = maps.live_slots()?;
    let slots = ruleset::assign_slots(&previous, rules)?;
    let table = ruleset::compile(rules, &slots)?;
    maps.install(&table)?;
    Ok(table)
}

/// [`install_rules`] for a whole config.
pub fn apply_rules(maps: &mut Maps, config: &Config) -> Result<RuleTable, Error> {
    install_rules(maps, &config.rules)
}

/// The config's rules with runtime quota overrides applied (pure).
pub fn effective_rules(config: &Config, overrides: &BTreeMap<String, RateSpec>) -> Vec<RuleSpec> {
    config
        .rules
        .iter()
        .map(|rule| {
            let mut rule = rule.clone();
            if let Some(o) = overrides.get(&rule.name) {
                rule.aggregate = Some(o.clone());
            }
            rule
        })
        .collect()
}

/// Checks a quota change against the same limits the config file is held to.
pub fn validate_quota(rule: &RuleSpec, quota: &RateSpec) -> Result<(), String> {
    limiter_common::gcra::Limit::new(rule.unit.granularity(), quota.rate, quota.burst)
        .map_err(|e| format!("rule {:?}: {e}", rule.name))?;
    if rule.unit == Unit::Bytes && quota.burst < crate::config::MIN_BYTES_BURST {
        return Err(format!(
            "rule {:?}: a bytes burst must be at least {} (one full frame)",
            rule.name,
            crate::config::MIN_BYTES_BURST
        ));
    }
    Ok(())
}

/// One rule's quota as `limiter quota list` shows it.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct QuotaEntry {
    pub rule: String,
    pub unit: &'static str,
    /// Aggregate rate/burst in force (null: the rule has only a per-source limit).
    pub rate: Option<u64>,
    pub burst: Option<u64>,
    /// "config" or "override" (set at runtime with `limiter quota set`).
    pub source: &'static str,
}

/// `limiter status`.
#[derive(Clone, Debug, Serialize)]
pub struct Status {
    pub pid: u32,
    pub uptime_seconds: u64,
    pub config: PathBuf,
    pub pin_dir: PathBuf,
    pub generation: u32,
    pub rules: usize,
    pub overrides: usize,
    pub interfaces: Vec<InterfaceStatus>,
}

#[derive(Clone, Debug, Serialize)]
pub struct InterfaceStatus {
    pub name: String,
    pub mode: &'static str,
    /// "created" or "adopted" (switched over from an earlier daemon's link).
    pub link: &'static str,
    pub pin: Option<PathBuf>,
    pub program_id: Option<u32>,
}

/// What a reload did.
#[derive(Clone, Debug, Serialize)]
pub struct ReloadReport {
    pub rules: usize,
    /// Keys that changed in the file but only take effect at the next start.
    pub needs_restart: Vec<&'static str>,
}

/// Per-rule drop counters sampled once a second, for "recent drops".
#[derive(Default)]
struct History {
    samples: VecDeque<(Instant, BTreeMap<String, u64>)>,
}

const HISTORY_SPAN: Duration = Duration::from_secs(61);

impl History {
    fn record(&mut self, now: Instant, drops: BTreeMap<String, u64>) {
        self.samples.push_back((now, drops));
        while self
            .samples
            .front()
            .is_some_and(|(t, _)| now.duration_since(*t) > HISTORY_SPAN)
        {
            self.samples.pop_front();
        }
    }

    /// Drops of `rule` over (about) the last `window`, from the oldest sample in it.
    fn drops_within(&self, rule: &str, now_total: u64, now: Instant, window: Duration) -> u64 {
        self.samples
            .iter()
            .find(|(t, _)| now.duration_since(*t) <= window)
            .and_then(|(_, m)| m.get(rule))
            .map_or(0, |old| now_total.saturating_sub(*old))
    }
}

/// Takes the single-instance lock next to the control socket.
fn lock_instance(control_socket: &Path) -> Result<File, Error> {
    let dir = control_socket.parent().unwrap_or(Path::new("/"));
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| Error::Io {
            what: format!("creating {}", dir.display()),
            source: e,
        })?;
    let path = control_socket.with_extension("lock");
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| Error::Io {
            what: format!("opening {}", path.display()),
            source: e,
        })?;
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(Error::AlreadyRunning(path));
    }
    Ok(file)
}

pub struct Daemon {
    config_path: PathBuf,
    config: Config,
    overrides: BTreeMap<String, RateSpec>,
    program: Program,
    maps: Maps,
    table: RuleTable,
    attachments: Vec<Attachment>,
    started: Instant,
    history: History,
    _lock: File,
}

impl Daemon {
    /// Loads the program with maps pinned under `pin_dir` (adopting the maps of an
    /// earlier daemon: buckets and counters continue), installs the rules, then runs it
    /// on every interface through pinned links (adopting earlier links atomically).
    pub fn start(config_path: &Path, config: Config, ifaces: &[String]) -> Result<Daemon, Error> {
        let lock = lock_instance(&config.control_socket)?;
        let mut program = Program::load(&LoadOptions {
            pin_dir: Some(config.pin_dir.clone()),
            max_sources: config.max_sources,
        })?;
        let mut maps = program.maps()?;
        let table = apply_rules(&mut maps, &config)?;
        tracing::info!(rules = table.rules.len(), "rules installed");
        let mut attachments = Vec::new();
        for iface in ifaces {
            let a = program.attach_pinned(iface, config.xdp_mode, &config.pin_dir)?;
            let how = match a.origin {
                LinkOrigin::Created => "attached",
                LinkOrigin::Adopted => "adopted the pinned link (program replaced atomically)",
            };
            tracing::info!(iface = %a.iface, mode = a.mode.as_str(), "{how}");
            attachments.push(a);
        }
        Ok(Daemon {
            config_path: config_path.to_path_buf(),
            config,
            overrides: BTreeMap::new(),
            program,
            maps,
            table,
            attachments,
            started: Instant::now(),
            history: History::default(),
            _lock: lock,
        })
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn maps(&self) -> &Maps {
        &self.maps
    }

    pub fn program(&self) -> &Program {
        &self.program
    }

    fn rule_spec(&self, name: &str) -> Result<&RuleSpec, Error> {
        self.config
            .rules
            .iter()
            .find(|r| r.name == name)
            .ok_or_else(|| Error::UnknownRule(name.to_string()))
    }

    fn reinstall(&mut self) -> Result<(), Error> {
        let rules = effective_rules(&self.config, &self.overrides);
        self.table = install_rules(&mut self.maps, &rules)?;
        Ok(())
    }

    /// Re-reads the config file. A file that fails validation changes nothing (the error
    /// names file, line and field); a valid one is installed atomically, keeping the
    /// bucket state of every rule that stays. Runtime quota overrides end: the file is
    /// the source of truth.
    pub fn reload(&mut self) -> Result<ReloadReport, Error> {
        let new = Config::load(&self.config_path)?;
        let rules = effective_rules(&new, &BTreeMap::new());
        let table = install_rules(&mut self.maps, &rules)?;
        let old = &self.config;
        let mut needs_restart = Vec::new();
        if new.pin_dir != old.pin_dir {
            needs_restart.push("pin_dir");
        }
        if new.max_sources != old.max_sources {
            needs_restart.push("max_sources");
        }
        if new.interfaces != old.interfaces {
            needs_restart.push("interfaces");
        }
        if new.xdp_mode != old.xdp_mode {
            needs_restart.push("xdp_mode");
        }
        if new.control_socket != old.control_socket {
            needs_restart.push("control_socket");
        }
        if new.metrics != old.metrics {
            needs_restart.push("metrics");
        }
        self.config = new;
        self.overrides.clear();
        self.table = table;
        tracing::info!(rules = self.table.rules.len(), "config reloaded");
        Ok(ReloadReport {
            rules: self.table.rules.len(),
            needs_restart,
        })
    }

    /// Changes a rule's aggregate rate (and burst) at once, keeping its bucket and every
    /// other rule's. Lasts until the next reload or restart.
    pub fn set_quota(
        &mut self,
        rule: &str,
        rate: u64,
        burst: Option<u64>,
    ) -> Result<QuotaEntry, Error> {
        let spec = self.rule_spec(rule)?;
        let burst = match (burst, &spec.aggregate) {
            (Some(b), _) => b,
            (None, Some(current)) => self.overrides.get(rule).unwrap_or(current).burst,
            (None, None) => {
                return Err(Error::Quota(format!(
                    "rule {rule:?} has no aggregate limit yet: give --burst too"
                )));
            }
        };
        let quota = RateSpec { rate, burst };
        validate_quota(spec, &quota).map_err(Error::Quota)?;
        let previous = self.overrides.insert(rule.to_string(), quota);
        if let Err(e) = self.reinstall() {
            match previous {
                Some(p) => self.overrides.insert(rule.to_string(), p),
                None => self.overrides.remove(rule),
            };
            return Err(e);
        }
        tracing::info!(%rule, rate, burst, "quota set");
        self.quotas()
            .into_iter()
            .find(|q| q.rule == rule)
            .ok_or_else(|| Error::UnknownRule(rule.to_string()))
    }

    pub fn quotas(&self) -> Vec<QuotaEntry> {
        self.config
            .rules
            .iter()
            .map(|r| {
                let (spec, source) = match self.overrides.get(&r.name) {
                    Some(o) => (Some(o), "override"),
                    None => (r.aggregate.as_ref(), "config"),
                };
                QuotaEntry {
                    rule: r.name.clone(),
                    unit: r.unit.as_str(),
                    rate: spec.map(|s| s.rate),
                    burst: spec.map(|s| s.burst),
                    source,
                }
            })
            .collect()
    }

    pub fn status(&self) -> Result<Status, Error> {
        Ok(Status {
            pid: std::process::id(),
            uptime_seconds: self.started.elapsed().as_secs(),
            config: self.config_path.clone(),
            pin_dir: self.config.pin_dir.clone(),
            generation: self.maps.control()?.generation,
            rules: self.table.rules.len(),
            overrides: self.overrides.len(),
            interfaces: self
                .attachments
                .iter()
                .map(|a| InterfaceStatus {
                    name: a.iface.clone(),
                    mode: a.mode.as_str(),
                    link: match a.origin {
                        LinkOrigin::Created => "created",
                        LinkOrigin::Adopted => "adopted",
                    },
                    pin: a.pin.clone(),
                    program_id: a.program_id().ok(),
                })
                .collect(),
        })
    }

    pub fn stats(&self) -> Result<StatsReport, Error> {
        stats::collect(&self.maps)
    }

    /// Samples per-rule drops (call once a second) for "recent drops" in explain.
    pub fn record_history(&mut self) -> Result<(), Error> {
        let mut drops = BTreeMap::new();
        for (name, slot) in &self.table.slots {
            drops.insert(
                name.clone(),
                self.maps.rule_counters(*slot)?.dropped_packets,
            );
        }
        self.history.record(Instant::now(), drops);
        Ok(())
    }

    /// "Why was I throttled?"
    pub fn explain(&self, query: &ExplainQuery) -> Result<Explanation, Error> {
        let now = Instant::now();
        let recent = |rule: &str, total: u64| {
            (
                self.history
                    .drops_within(rule, total, now, Duration::from_secs(10)),
                self.history
                    .drops_within(rule, total, now, Duration::from_secs(60)),
            )
        };
        explain::explain(&self.table, &self.maps, query, recent)
    }

    /// Stops the daemon. Enforcement stays (links and maps pinned) unless `detach`.
    pub fn stop(self, detach: bool) -> Result<(), Error> {
        if detach {
            for a in self.attachments {
                let iface = a.iface.clone();
                unpin_link(a)?;
                tracing::info!(%iface, "detached");
            }
        } else {
            tracing::info!("exiting; enforcement continues through the pinned links");
        }
        Ok(())
    }

    /// Detaches from every interface and removes every pin (maps and counters included).
    pub fn detach_all(self) -> Result<Vec<PathBuf>, Error> {
        let pin_dir = self.config.pin_dir.clone();
        drop(self);
        remove_pins(&pin_dir)
    }
}
