//! The daemon's state and every operation on it: start (load or adopt the program and
//! its pins), reload, quota changes, status, stats, explain, stop and detach. It is
//! synchronous and knows nothing of the async runtime: the service loops above it
//! ([`crate::serve::service`] and the control socket, metrics and fleet reports it runs) lock it
//! and call in here.

pub mod relink;
pub mod reload_keys;
pub mod start;

use std::{
    collections::{BTreeMap, VecDeque},
    os::unix::net::UnixListener,
    path::PathBuf,
    time::{Duration, Instant},
};

use limiter_common::{abi::CONTROL_BYPASS, gcra};
use limiter_fleet::{clock::monotonic_ns, share::ShareState};
use limiter_instance::Instance;
use limiter_proto::pb::{ReportReply, ReportRequest};
use serde::Serialize;

use crate::{
    attach::{
        handoff::{HandoffControl, HandoffStatus, JoinedSlot},
        program::{unpin_link, AttachedMode, Attachment, LinkOrigin, Program},
        teardown::{self, Cleanup},
    },
    bpf::{grace, maps::Maps, pins},
    config::{Bypass, Config, OnSaturation, RateSpec, RuleSpec, Unit, XdpShare, XdpShareFallback},
    daemon::relink::{Action, LinkWatch},
    error::Error,
    host::object::Variant,
    observe::{
        explain::{self, ExplainQuery, Explanation},
        stats::{self, StatsReport},
    },
    policy::{
        fleet::{offered_units, refused_frames, takes_credit, FleetState, RuleTotals},
        ruleset::{self, RuleTable},
        saturation::{self, Gate, Transition},
    },
};

/// Compiles `rules`, keeping the slots the live table already gives them, and installs
/// them atomically. Returns the installed table.
pub fn install_rules(maps: &mut Maps, rules: &[RuleSpec]) -> Result<RuleTable, Error> {
    install_annotated(maps, rules, |_| {})
}

/// [`install_rules`], letting `annotate` adjust the compiled entries (fleet state and
/// deadlines) before they go live.
///
/// A rule that takes over the slot of a live rule (one removed in the same change) comes
/// in one grace period later: first the table without it goes live, then, once no frame
/// is still decided with the old table ([`grace`]), its slot is cleared and the whole
/// table goes live. Cleared any earlier, the removed rule's last frames would meet a
/// fresh bucket and be counted as the new rule's.
fn install_annotated(
    maps: &mut Maps,
    rules: &[RuleSpec],
    annotate: impl Fn(&mut RuleTable),
) -> Result<RuleTable, Error> {
    let previous = maps.live_slots()?;
    let slots = ruleset::assign_slots(&previous, rules)?;
    let taking_over = ruleset::taking_over(&previous, &slots);
    if !taking_over.is_empty() {
        let interim_rules: Vec<RuleSpec> = rules
            .iter()
            .filter(|r| !taking_over.contains(&r.name))
            .cloned()
            .collect();
        let mut interim = ruleset::compile(&interim_rules, &slots)?;
        annotate(&mut interim);
        maps.install(&interim)?;
        grace::wait_for_running_programs().map_err(|source| Error::Io {
            what: "waiting for program runs on the replaced rule table to finish".into(),
            source,
        })?;
    }
    let mut table = ruleset::compile(rules, &slots)?;
    annotate(&mut table);
    maps.install(&table)?;
    Ok(table)
}

/// [`install_rules`] for a whole config.
pub fn apply_rules(maps: &mut Maps, config: &Config) -> Result<RuleTable, Error> {
    install_rules(maps, &config.rules)
}

/// Writes what each `[[tunnels]]` interface decapsulates into the program's `TUNNELS`,
/// keyed by the interface's index now (an interface that does not exist is an error).
pub fn apply_tunnels(maps: &mut Maps, config: &Config) -> Result<(), Error> {
    let mut entries = BTreeMap::new();
    for tunnel in &config.tunnels {
        let ifindex = crate::attach::netlink::ifindex_of(&tunnel.interface)?;
        entries.insert(ifindex, tunnel.to_abi());
    }
    maps.set_tunnels(&entries)
}

/// The config's rules with runtime quota overrides applied (pure).
pub fn effective_rules(config: &Config, overrides: &BTreeMap<String, RateSpec>) -> Vec<RuleSpec> {
    config
        .rules
        .iter()
        .map(|rule| {
            let mut rule = rule.clone();
            if let Some(o) = overrides.get(&rule.name) {
                rule.aggregate = Some(*o);
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
    /// Each rule's share state and the rate it enforces now (fleet mode: its share).
    pub shares: Vec<ShareStatus>,
    /// The allocator this host reports to (fleet mode).
    pub allocator: Option<String>,
    /// The daemon's fleet counters (fleet mode).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fleet: Option<FleetCounters>,
    /// `CONTROL` bypass bit: every frame passes without being classified, metered or
    /// counted. No limiter command sets it (README, "Inspecting with bpftool").
    pub bypass: bool,
    /// Interfaces whose link pins this daemon found at start although they are no longer
    /// configured: it detached them and removed their pins.
    pub detached_unconfigured: Vec<String>,
    /// Times the program was attached again to an interface deleted and created again
    /// under its name, every interface, since the daemon started.
    pub reattaches: u64,
    /// `join_program_array`: the LB's root array calls the limiter (no interface is
    /// attached), and how the limiter calls on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub joined: Option<HandoffStatus>,
}

/// Fleet counters of this daemon process (since it started; not in the pinned maps).
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
pub struct FleetCounters {
    /// Grants refused because their share does not compile in the rule's unit.
    pub grants_refused: u64,
    /// Frames admitted on the fleet's credit (beyond the buckets), every rule.
    pub credited: u64,
    /// Reports that reached no allocator (every group).
    pub report_failures: u64,
    /// Changes of the fleet TLS files that made no valid configuration (the last good
    /// one stays in use).
    pub tls_reload_failures: u64,
    /// The allocator's configuration names another `fleet_size` than this host's: what
    /// a joiner's share is sized by while the allocator learns disagrees with what this
    /// host enforces by itself in BOOTSTRAP. `None`: they agree, or the allocator uses
    /// this host's own.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fleet_size_disagreement: Option<FleetSizeDisagreement>,
}

/// This host's `fleet_size` and the allocator's, when they differ.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
pub struct FleetSizeDisagreement {
    pub host: u32,
    pub allocator: u32,
}

#[derive(Clone, Debug, Serialize)]
pub struct ShareStatus {
    pub rule: String,
    /// enforce | shadow, as `stats --json` says it.
    pub mode: &'static str,
    /// The share of sources whose refusals drop, in percent: 100 in enforce mode, 0 in
    /// shadow mode, a canary's `enforce_percent` (the rest pass as would-drops).
    pub enforce_percent: crate::config::Percent,
    pub state: &'static str,
    pub rate: Option<u64>,
    pub burst: Option<u64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct InterfaceStatus {
    pub name: String,
    pub mode: &'static str,
    /// The build running there: "limiter_linear" (single-buffer frames), "limiter"
    /// (multi-buffer aware) or "limiter_tc" (TC ingress).
    pub program: &'static str,
    /// "created" or "adopted" (switched over from an earlier daemon's link).
    pub link: &'static str,
    pub pin: Option<PathBuf>,
    pub program_id: Option<u32>,
    /// What holds the program there: "bpf_link", "tcx link", the cls_bpf filter's
    /// slot (TC mode on kernels without tcx), or "libxdp dispatcher component".
    pub hook: String,
    /// What runs at the hook, in order, the limiter among them, and how each hands a
    /// frame on (read from the kernel when asked).
    pub chain: Vec<crate::policy::hook::ChainEntry>,
    /// Where frames the limiter passes go (`next_program`); absent: the stack.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub handoff: Option<HandoffStatus>,
    /// Why the program cannot be found running there: the interface is gone or was
    /// created again (the daemon attaches to it again, retrying while that fails), or
    /// someone removed the program from the hook (frames pass unmetered until the
    /// daemon restarts).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
    /// Whether the program runs on the device that has this name now.
    pub attached: bool,
    /// Times the program was attached again to a device created under this name.
    pub reattaches: u64,
    /// Attempts to attach again that failed (retried, at most every 30 s).
    pub reattach_failures: u64,
}

/// One interface as the metrics show it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InterfaceState {
    pub name: String,
    /// "xdp" or "tc": the hook the program runs at.
    pub hook: &'static str,
    pub attached: bool,
    pub reattaches: u64,
}

/// What a reload did.
#[derive(Clone, Debug, Serialize)]
pub struct ReloadReport {
    pub rules: usize,
    /// Keys that changed in the file but only take effect at the next start.
    pub needs_restart: Vec<&'static str>,
    /// What the reload changed rule by rule, and whose state started over.
    pub plan: crate::policy::reload_plan::ReloadPlan,
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

/// How often [`Daemon::check_saturation`] runs: a flood that saturates a rule refuses its
/// honest sources for at most about this long before the per-source limit stands aside.
pub const SATURATION_CHECK: Duration = Duration::from_millis(250);

/// One rule's saturation gate, for the metrics.
#[derive(Clone, Debug, PartialEq)]
pub struct RuleSaturation {
    pub rule: String,
    pub saturated: bool,
    /// The last estimate: the share of fresh sources under their limit refused.
    pub false_limit_ratio: f64,
    /// Times the rule became saturated or clear since the daemon started.
    pub transitions: u64,
}

/// The flags each saturated rule's entry gets, by name: always
/// [`RULE_SOURCES_SATURATED`](limiter_common::abi::RULE_SOURCES_SATURATED), and
/// [`RULE_SOURCES_ASIDE`](limiter_common::abi::RULE_SOURCES_ASIDE) unless the rule's
/// `on_saturation` is "enforce".
fn saturation_flags(rules: &[RuleSpec], gates: &BTreeMap<String, Gate>) -> BTreeMap<String, u32> {
    use limiter_common::abi::{RULE_SOURCES_ASIDE, RULE_SOURCES_SATURATED};
    rules
        .iter()
        .filter_map(|r| {
            let per_source = r.per_source?;
            gates.get(&r.name).filter(|g| g.saturated())?;
            let aside = match per_source.on_saturation {
                OnSaturation::StandAside => RULE_SOURCES_ASIDE,
                OnSaturation::Enforce => 0,
            };
            Some((r.name.clone(), RULE_SOURCES_SATURATED | aside))
        })
        .collect()
}

/// Sets `flags` (by rule name) in the compiled table's entries.
fn mark_saturated(table: &mut RuleTable, flags: &BTreeMap<String, u32>) {
    for (name, bits) in flags {
        let Some(&slot) = table.slots.get(name) else {
            continue;
        };
        if let Some((_, rule)) = table.rules.iter_mut().find(|(s, _)| *s == slot) {
            rule.flags |= bits;
        }
    }
}

/// The owner named in the control socket's refusals.
const OWNER: &str = "limiter daemon";

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
    fleet: Option<FleetState>,
    /// Share states at the last install (a change calls for a reinstall).
    installed_states: BTreeMap<String, ShareState>,
    /// The control socket's listener until the binary takes it to serve.
    control_listener: Option<UnixListener>,
    /// Interfaces detached at start because they are no longer configured.
    detached_unconfigured: Vec<String>,
    /// The tail-call handoff (`next_program`, `join_program_array`).
    handoff: HandoffControl,
    /// Per rule with a per-source limit (by name): whether a flood saturates its part of
    /// the sketch ([`Daemon::check_saturation`]).
    saturation: BTreeMap<String, Gate>,
    /// Where the next saturation check starts sampling in each part (checks read
    /// different cells).
    saturation_phase: u32,
    /// Each attached interface's device, and when to attach again to a device created
    /// under its name.
    links: BTreeMap<String, LinkWatch>,
    /// The claimed control socket and its lock. Dropped last (see [`Daemon::detach_all`]):
    /// the socket disappears only when everything else is done.
    instance: Option<Instance>,
    /// The `CONTROL` bypass bit as this daemon last saw or set it: a change made
    /// elsewhere (bpftool, `limiter bypass` without the daemon) is logged once seen.
    bypass_seen: bool,
    /// `join_program_array`: whether the joined slot held the limiter at the last
    /// check ([`Daemon::watch_joined`]); `None` when not joined.
    joined_holds: Option<bool>,
}

/// What `limiter bypass on|off` did.
#[derive(Clone, Debug, Serialize)]
pub struct BypassReport {
    pub bypass: bool,
    /// Whether the bit changed (it may have been so already).
    pub changed: bool,
    /// The config says `bypass = "on"`: a `bypass off` lasts until the next start or
    /// reload, which sets it again.
    pub config_on: bool,
}

impl Daemon {
    /// Detaches the interfaces whose link pins (the limiter's) are under `pin_dir` but
    /// which are no longer configured: the config (or `--iface`) says where the limiter
    /// enforces, and a link left from an earlier config would keep enforcing unseen.
    fn detach_unconfigured(&mut self, ifaces: &[String]) -> Result<(), Error> {
        for (iface, pin) in pins::limiter_links(&self.config.pin_dir)? {
            if ifaces.contains(&iface) {
                continue;
            }
            std::fs::remove_file(&pin).map_err(|e| Error::Io {
                what: format!("removing the link pin {}", pin.display()),
                source: e,
            })?;
            tracing::warn!(
                %iface,
                pin = %pin.display(),
                "detached: the interface is no longer configured (its link pin is removed)"
            );
            self.detached_unconfigured.push(iface);
        }
        let control = crate::attach::tc_filter::control_map_id(&self.config.pin_dir);
        for (iface, ifindex) in crate::attach::libxdp::joined_interfaces(&self.config.pin_dir)? {
            let keep = ifaces.contains(&iface) && self.config.xdp_share == XdpShare::Libxdp;
            let Some(control) = control.filter(|_| !keep) else {
                continue;
            };
            crate::attach::libxdp::leave(&iface, ifindex, control)?;
            tracing::warn!(
                %iface,
                "left the interface's libxdp dispatcher: the interface is no longer \
                 configured, or xdp_share is no longer \"libxdp\""
            );
            self.detached_unconfigured.push(iface);
        }
        Ok(())
    }

    /// Follows the configured interfaces' devices (call on every link event netlink
    /// reports, and a few times a second): a device deleted is said once; a device
    /// created under the name of one the program ran on gets the program again, in the
    /// configured mode, at most once a second per interface, a failed attempt retried
    /// with a growing back-off. `deleted`: the indexes of devices netlink said were
    /// deleted since the last call. Never fails: what fails is logged and retried.
    pub fn watch_links(&mut self, deleted: &[u32]) {
        let now = Instant::now();
        let names: Vec<String> = self.links.keys().cloned().collect();
        for iface in names {
            let current = crate::attach::netlink::ifindex_of(&iface).ok();
            let Some(watch) = self.links.get_mut(&iface) else {
                continue;
            };
            let mut gone = false;
            for &ifindex in deleted {
                gone |= watch.deleted(ifindex);
            }
            let action = watch.observe(current, now);
            if gone || action == Action::Lost {
                tracing::warn!(
                    %iface,
                    "the interface was deleted: the limiter attaches again to a device created under its name"
                );
            }
            if let Action::Attach { ifindex } = action {
                self.reattach(&iface, ifindex, now);
            }
        }
    }

    /// Attaches to `iface` again (device `ifindex`), as [`Daemon::start`] did.
    fn reattach(&mut self, iface: &str, ifindex: u32, now: Instant) {
        let link = crate::attach::netlink::link(ifindex).ok().flatten();
        let (kind, mtu) = (
            link.as_ref().and_then(|l| l.kind.clone()),
            link.as_ref().and_then(|l| l.mtu),
        );
        let attached = self.attach_again(iface);
        let Some(watch) = self.links.get_mut(iface) else {
            return;
        };
        match attached {
            Ok(a) => {
                if watch.kind != kind {
                    tracing::warn!(
                        %iface,
                        was = watch.kind.as_deref().unwrap_or("a physical device"),
                        now = kind.as_deref().unwrap_or("a physical device"),
                        "the name belongs to another kind of device now: attached to it, as the config names it"
                    );
                }
                tracing::warn!(
                    %iface,
                    ifindex,
                    mtu,
                    mode = a.mode.as_str(),
                    program = a.variant.program_name(),
                    hook = %a.hook(),
                    "attached again to the interface created under this name"
                );
                watch.succeeded(ifindex, kind, now);
                // The device has a new index: its tunnels follow it.
                if let Err(e) = apply_tunnels(&mut self.maps, &self.config) {
                    tracing::warn!(%iface, error = %e, "could not move the interface's tunnels to its new index");
                }
                match self.attachments.iter_mut().find(|old| old.iface == iface) {
                    // The old one's descriptor closes: its link went with its device.
                    Some(old) => *old = a,
                    None => self.attachments.push(a),
                }
            }
            Err(e) => {
                let retry = watch.failed(e.to_string(), now);
                tracing::error!(
                    %iface,
                    ifindex,
                    mtu,
                    kind = kind.as_deref().unwrap_or("physical"),
                    retry_in_s = retry.as_secs(),
                    "attaching to the interface created under this name failed: frames on it pass unmetered until an attempt succeeds: {e}"
                );
            }
        }
    }

    /// One attach to `iface` in the configured mode (a hook of its own: with
    /// `xdp_share = "libxdp"` a dispatcher, or the hook alone where the kernel refuses
    /// freplace and the fallback allows it).
    fn attach_again(&mut self, iface: &str) -> Result<Attachment, Error> {
        let mode = self.config.xdp_mode;
        match self.config.xdp_share {
            XdpShare::Exclusive => self
                .program
                .attach_pinned(iface, mode, &self.config.pin_dir),
            XdpShare::Libxdp => match crate::attach::libxdp::freplace_refusal() {
                None => self
                    .program
                    .attach_shared(iface, mode, self.config.xdp_priority),
                Some(_) if self.config.xdp_share_fallback == XdpShareFallback::TailCall => {
                    let variants: Vec<Variant> = if mode == crate::config::XdpMode::Generic {
                        vec![self.handoff.generic_build()]
                    } else {
                        Variant::XDP.to_vec()
                    };
                    self.program.attach_netlink(
                        iface,
                        &crate::attach::takeover::Step::Alone,
                        mode,
                        &variants,
                        None,
                    )
                }
                Some(why) => Err(Error::Sharing {
                    iface: iface.to_string(),
                    reason: format!(
                        "this kernel refuses freplace ({why}) and xdp_share_fallback does not allow taking the hook"
                    ),
                }),
            },
        }
    }

    /// Each attached interface: whether the program runs on its device now.
    pub fn interface_states(&self) -> Vec<InterfaceState> {
        self.attachments
            .iter()
            .map(|a| {
                let watch = self.links.get(&a.iface);
                InterfaceState {
                    name: a.iface.clone(),
                    hook: if a.mode == AttachedMode::Tc {
                        "tc"
                    } else {
                        "xdp"
                    },
                    attached: watch.is_none_or(LinkWatch::is_attached),
                    reattaches: watch.map_or(0, |w| w.reattaches),
                }
            })
            .collect()
    }

    /// The bound control socket, once (the binary serves it).
    pub fn take_control_listener(&mut self) -> Option<UnixListener> {
        self.control_listener.take()
    }

    /// What systemd shows beside "active" (`STATUS=` of the readiness protocol): the
    /// interfaces the program runs on now, each with its mode, and the rule count.
    pub fn readiness_status(&self) -> String {
        let ifaces = if self.attachments.is_empty() {
            "no interface of its own (joined the LB's program)".to_string()
        } else {
            self.attachments
                .iter()
                .map(|a| format!("{} ({})", a.iface, a.mode.as_str()))
                .collect::<Vec<_>>()
                .join(", ")
        };
        format!(
            "enforcing {} rules on {ifaces}; control socket {}",
            self.table.rules.len(),
            self.config.control_socket.display()
        )
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

    /// The rules installed now, by slot (a copy: the metrics read their counters after
    /// letting the daemon go).
    pub fn installed_rules(&self) -> BTreeMap<u32, limiter_common::abi::RuleConfig> {
        self.table.rules.iter().copied().collect()
    }

    fn rule_spec(&self, name: &str) -> Result<&RuleSpec, Error> {
        self.config
            .rules
            .iter()
            .find(|r| r.name == name)
            .ok_or_else(|| Error::UnknownRule(name.to_string()))
    }

    fn reinstall(&mut self) -> Result<(), Error> {
        let now = monotonic_ns();
        let mut rules = effective_rules(&self.config, &self.overrides);
        if let Some(fleet) = &self.fleet {
            rules = fleet.shape(&rules);
        }
        let fleet = &self.fleet;
        let saturated = saturation_flags(&rules, &self.saturation);
        self.table = install_annotated(&mut self.maps, &rules, |table| {
            if let Some(fleet) = fleet {
                fleet.annotate(table, now);
            }
            mark_saturated(table, &saturated);
        })?;
        if let Some(fleet) = &mut self.fleet {
            self.installed_states = fleet.states(now);
            // A first grant takes over with its token count, not a fresh burst.
            for (rule, tokens) in fleet.take_pending_tokens() {
                let (Some(slot), Some(config)) = (
                    self.table.slots.get(&rule).copied(),
                    self.table
                        .slots
                        .get(&rule)
                        .and_then(|s| self.table.rule(*s)),
                ) else {
                    continue;
                };
                let tat =
                    gcra::tat_with_tokens(&config.aggregate, gcra::ticks_from_ns(now), tokens);
                self.maps.set_aggregate_tat(slot, tat)?;
            }
        }
        self.write_credits(now);
        Ok(())
    }

    /// Samples each per-source rule's part of the sketch and feeds its gate
    /// (crate::policy::saturation; call every [`SATURATION_CHECK`]). A rule that becomes saturated
    /// or clear is logged and the table reinstalled with its flags: its per-source limit
    /// stands aside, or enforces again (`on_saturation`).
    pub fn check_saturation(&mut self) -> Result<(), Error> {
        let now_ns = monotonic_ns();
        let now = gcra::ticks_from_ns(now_ns);
        let at = Instant::now();
        let per_source: Vec<(String, u32)> = self
            .table
            .slots
            .iter()
            .filter(|(_, slot)| {
                self.table
                    .rule(**slot)
                    .is_some_and(|r| r.flags & limiter_common::abi::RULE_HAS_PER_SOURCE != 0)
            })
            .map(|(name, slot)| (name.clone(), *slot))
            .collect();
        self.saturation
            .retain(|name, _| per_source.iter().any(|(n, _)| n == name));
        let cells = saturation::cells_per_rule(per_source.len());
        let phase = self.saturation_phase;
        self.saturation_phase = self.saturation_phase.wrapping_add(0x9E37_79B9);
        let mut changed = false;
        for (name, slot) in per_source {
            // The live entry: its region is the one the install chose.
            let live = self.maps.live_rule(slot)?;
            let ratio = self
                .maps
                .saturation_sample(&live, now, cells, phase)?
                .false_limit_ratio();
            let gate = self.saturation.entry(name.clone()).or_default();
            match gate.feed(ratio, at) {
                Some(Transition::Entered) => {
                    changed = true;
                    tracing::warn!(
                        rule = %name,
                        false_limit_ratio = ratio,
                        "per-source cells saturated: a flood exhausts so many of them that \
                         honest sources under their limit are refused"
                    );
                }
                Some(Transition::Left) => {
                    changed = true;
                    tracing::warn!(
                        rule = %name,
                        false_limit_ratio = ratio,
                        "per-source cells no longer saturated: the per-source limit enforces"
                    );
                }
                None => {}
            }
        }
        if changed {
            self.reinstall()?;
        }
        Ok(())
    }

    /// Each per-source rule's saturation as the daemon's gates see it (metrics).
    pub fn saturation(&self) -> Vec<RuleSaturation> {
        self.saturation
            .iter()
            .map(|(rule, gate)| RuleSaturation {
                rule: rule.clone(),
                saturated: gate.saturated(),
                false_limit_ratio: gate.ratio(),
                transitions: gate.transitions(),
            })
            .collect()
    }

    /// Writes the fleet's pending credits into their rules' buckets
    /// ([`FleetState::take_pending_credit`]), each replacing what was left, which the
    /// ledger counts as spent or not. A credit is an extra, so a write that fails is logged and dropped: the
    /// shares were installed, and the rule runs on its bucket alone until the next grant.
    fn write_credits(&mut self, now: u64) {
        let Some(fleet) = &mut self.fleet else {
            return;
        };
        for (rule, credit) in fleet.take_pending_credit() {
            let Some(&slot) = self.table.slots.get(&rule) else {
                continue;
            };
            match self.maps.swap_credit(slot, credit) {
                Ok(left) => fleet.credit_written(&rule, credit, left, now),
                Err(e) => tracing::warn!(%rule, "writing the fleet credit failed: {e}"),
            }
        }
    }

    /// The fleet TLS files of a group's connections, counted in the fleet counters.
    pub fn fleet_watch_tls(&mut self, tls: std::sync::Arc<limiter_proto::ClientTls>) {
        if let Some(fleet) = &mut self.fleet {
            fleet.watch_tls(tls);
        }
    }

    /// A report to group `group` failed: counted (`limiter_fleet_report_failures_total`),
    /// and rules whose lease holds get their last grant's credit again, at most once a
    /// report interval (`FleetState::rearm_credit`).
    pub fn fleet_report_failed(&mut self, group: usize) {
        let now = monotonic_ns();
        if let Some(fleet) = &mut self.fleet {
            fleet.report_failed();
            fleet.rearm_credit(group, now);
        }
        self.write_credits(now);
    }

    /// The fleet report for this interval to group `group` of allocators (0 without
    /// sharding); `None` in standalone mode.
    pub fn fleet_report(&mut self, group: usize) -> Result<Option<ReportRequest>, Error> {
        let totals = self.fleet_totals()?;
        let now = monotonic_ns();
        Ok(self
            .fleet
            .as_mut()
            .map(|f| f.report_to(group, &totals, now)))
    }

    /// Whether a fleet rule reported to group `group` is in FAIL_OPEN now.
    pub fn fleet_fails_open(&self, group: usize) -> bool {
        self.fleet
            .as_ref()
            .is_some_and(|f| f.fails_open_to(group, monotonic_ns()))
    }

    /// Whether any fleet rule is reported to group `group` now.
    pub fn fleet_has_rules_for(&self, group: usize) -> bool {
        self.fleet.as_ref().is_some_and(|f| f.has_rules_for(group))
    }

    /// Each rule's offered load in its unit and its refusals (counter totals).
    fn fleet_totals(&self) -> Result<BTreeMap<String, RuleTotals>, Error> {
        let units: BTreeMap<&str, Unit> = self
            .config
            .rules
            .iter()
            .map(|r| (r.name.as_str(), r.unit))
            .collect();
        let mut totals = BTreeMap::new();
        for (name, slot) in &self.table.slots {
            let Some(&unit) = units.get(name.as_str()) else {
                continue;
            };
            let c = self.maps.rule_counters(*slot)?;
            let syns = if unit == Unit::Syn {
                self.maps.rule_syns(*slot)?
            } else {
                0
            };
            totals.insert(
                name.clone(),
                RuleTotals {
                    offered: offered_units(unit, &c, syns),
                    refused: refused_frames(&c),
                    // Unreadable: the report says nothing of the credit (no credit for
                    // the rule) rather than fail.
                    credit_left: if takes_credit(unit) {
                        self.maps.credit_left(*slot).ok()
                    } else {
                        None
                    },
                },
            );
        }
        Ok(totals)
    }

    /// The daemon's fleet counters; `None` in standalone mode.
    pub fn fleet_counters(&self) -> Option<FleetCounters> {
        self.fleet.as_ref().map(|f| FleetCounters {
            grants_refused: f.grants_refused(),
            credited: f.credited_total(),
            report_failures: f.report_failures(),
            tls_reload_failures: f.tls_reload_failures(),
            fleet_size_disagreement: f
                .fleet_size_disagreement()
                .map(|(host, allocator)| FleetSizeDisagreement { host, allocator }),
        })
    }

    /// Whether refusals on an unsaturated share call for an early report.
    pub fn fleet_wants_early_report(&self, group: usize) -> Result<bool, Error> {
        let Some(fleet) = &self.fleet else {
            return Ok(false);
        };
        Ok(fleet.wants_early_report_to(group, &self.fleet_totals()?, monotonic_ns()))
    }

    /// Applies the allocator's grants (each checked first: `FleetState::apply_from`) and
    /// installs the new shares. If the install fails the fleet state goes back to what
    /// is installed.
    /// `group`: the group of allocators that replied (0 without sharding). Returns the
    /// rules a group named an unlisted group for (the caller logs them, rate-limited).
    pub fn fleet_apply(
        &mut self,
        group: usize,
        reply: &ReportReply,
    ) -> Result<Vec<(String, String)>, Error> {
        let Some(fleet) = &mut self.fleet else {
            return Ok(Vec::new());
        };
        let mut before = fleet.clone();
        let applied = fleet.apply_from(group, reply, monotonic_ns());
        for r in &applied.refused {
            tracing::warn!(rule = %r.rule, "grant refused, the share stays as it was: {}", r.reason);
        }
        for (rule, to) in &applied.moved {
            tracing::info!(%rule, group = %to, "the allocators say another group grants this rule: reporting it there");
        }
        if let Some((own, allocator)) = applied.fleet_size_disagrees {
            tracing::warn!(
                fleet_size = own,
                allocator_fleet_size = allocator,
                "the allocator's fleet_size differs from this host's: while it learns (after \
                 a start or a failover) it grants a joiner quota / {allocator}, while this host \
                 enforces quota / {own} by itself; set both to the fleet's size, or remove \
                 fleet_size from the allocator's file so it uses the hosts'"
            );
        }
        if let Err(e) = self.reinstall() {
            before.add_refused(applied.refused.len() as u64);
            self.fleet = Some(before);
            return Err(e);
        }
        Ok(applied.unknown)
    }

    /// Reinstalls when a share changed state on its own (lease lapsed, fail open) or a
    /// lapsed closed share rejoined on refusals (`FleetState::rejoin`), so the map
    /// entries and everything reading them show it.
    pub fn fleet_tick(&mut self) -> Result<(), Error> {
        if self.fleet.is_none() {
            return Ok(());
        }
        let totals = self.fleet_totals()?;
        let now = monotonic_ns();
        let rejoined = self
            .fleet
            .as_mut()
            .map(|f| f.rejoin(&totals, now))
            .unwrap_or_default();
        for rule in &rejoined {
            tracing::info!(
                %rule,
                "closed share refusing frames with its lease lapsed: bootstrap rate until a grant"
            );
        }
        let rejoined = !rejoined.is_empty();
        let changed = self
            .fleet
            .as_ref()
            .is_some_and(|f| f.states(now) != self.installed_states);
        if rejoined || changed {
            self.reinstall()?;
        }
        Ok(())
    }

    /// Re-reads the config file. A file that fails validation changes nothing (the error
    /// names file, line and field); a valid one is installed atomically, keeping the
    /// bucket state of every rule that stays. Runtime quota overrides end: the file is
    /// the source of truth. A rejected reload changes no share either: the fleet state
    /// is restored as it was.
    pub fn reload(&mut self) -> Result<ReloadReport, Error> {
        let new = Config::load(&self.config_path)?;
        let handoff_live =
            crate::attach::handoff::live_change(self.config.handoff.as_ref(), new.handoff.as_ref());
        if handoff_live {
            // A slot outside the LB's array: refused before the rules change.
            self.handoff.plan_for(new.handoff.as_ref())?;
        }
        let plan = self.plan_for(&new)?;
        let old_fleet = self.fleet.clone();
        if let Some(fleet) = &mut self.fleet {
            fleet.sync_rules(&new.rules, monotonic_ns());
        }
        // Only the rules change now; every other key waits for a restart.
        let mut merged = self.config.clone();
        merged.rules = new.rules.clone();
        let old_config = std::mem::replace(&mut self.config, merged);
        let old_overrides = std::mem::take(&mut self.overrides);
        if let Err(e) = self.reinstall() {
            self.config = old_config;
            self.overrides = old_overrides;
            self.fleet = old_fleet;
            return Err(e);
        }
        for warning in self.config.tc_burst_warnings() {
            tracing::warn!("{warning}");
        }
        let old = &old_config;
        if handoff_live {
            if new.handoff != old_config.handoff {
                self.apply_handoff(new.handoff.clone())?;
                tracing::info!(handoff = ?new.handoff.as_ref().map(ToString::to_string), "reload: handoff changed");
            }
            self.config.handoff = new.handoff.clone();
        }
        let needs_restart = crate::daemon::reload_keys::restart_keys(old, &new);
        if let Some(slot @ (JoinedSlot::Empty { .. } | JoinedSlot::Other { .. })) =
            self.handoff.joined_slot()
        {
            // The operator's way to put the limiter back where another tool wrote. The
            // rules are installed by now: a failure here is logged, not the reload's.
            let problem = slot.problem().unwrap_or_default();
            let rejoined = self
                .program
                .program_fd(Variant::Linear)
                .and_then(|fd| self.handoff.join(fd));
            match rejoined {
                Ok(()) => {
                    tracing::warn!("reload: the limiter written back into its slot ({problem})")
                }
                Err(e) => tracing::error!("reload: writing the limiter back into its slot: {e}"),
            }
            self.watch_joined();
        }
        self.config.keys.bypass = new.bypass;
        let bypass = self.maps.control()?.flags & CONTROL_BYPASS != 0;
        match (new.bypass, bypass) {
            (Bypass::On, false) => {
                self.set_bypass(true, "the config's bypass = \"on\" (reload)")?;
            }
            (Bypass::Off, true) => tracing::warn!(
                "bypass stays on: the config's bypass = \"off\" never clears the switch; \
                 `limiter bypass off` does"
            ),
            _ => {}
        }
        if new.tunnels != old_config.tunnels {
            // Live: a frame meets the old encapsulations or the new ones.
            apply_tunnels(&mut self.maps, &new)?;
            self.config.tunnels = new.tunnels.clone();
            tracing::info!(tunnels = new.tunnels.len(), "reload: tunnels changed");
        }
        if new.monitor != old_config.monitor {
            // Live: the next refusal reads the new budget.
            self.maps.set_monitor_config(new.monitor.to_abi())?;
            self.config.monitor = new.monitor;
            tracing::info!(
                events_per_sec = new.monitor.events_per_sec,
                snap_len = new.monitor.snap_len,
                "reload: monitor changed"
            );
        }
        tracing::info!(
            rules = self.table.rules.len(),
            added = plan.added.len(),
            removed = plan.removed.len(),
            changed = plan.changed.len(),
            restarted = plan.restarts.len(),
            "config reloaded"
        );
        Ok(ReloadReport {
            rules: self.table.rules.len(),
            needs_restart,
            plan,
        })
    }

    /// Sets or clears the `CONTROL` bypass bit (the kill switch) at once, logged with
    /// `by` (who asked). Every interface and hook of this daemon's program reads it at
    /// the next frame.
    pub fn set_bypass(&mut self, on: bool, by: &str) -> Result<BypassReport, Error> {
        let changed = self.maps.set_bypass(on)?;
        self.bypass_seen = on;
        let config_on = self.config.bypass == Bypass::On;
        match (on, changed) {
            (true, true) => tracing::warn!(
                by,
                "bypass on: every frame passes unclassified, unmetered and uncounted \
                 until `limiter bypass off`"
            ),
            (false, true) => tracing::warn!(by, "bypass off: enforcing again"),
            _ => tracing::info!(by, bypass = on, "bypass unchanged"),
        }
        Ok(BypassReport {
            bypass: on,
            changed,
            config_on,
        })
    }

    /// Checks that the joined slot of the LB's root array still holds the limiter (call
    /// once a second): another tool that writes the slot makes the LB dispatch past the
    /// limiter. Logged at each change; shown by `status` and the metrics.
    pub fn watch_joined(&mut self) {
        let Some(slot) = self.handoff.joined_slot() else {
            self.joined_holds = None;
            return;
        };
        let holds = slot.holds_limiter();
        if self.joined_holds != Some(holds) {
            match slot.problem() {
                Some(problem) => tracing::error!("{problem}"),
                None if self.joined_holds.is_some() => {
                    tracing::info!("the joined slot holds the limiter again")
                }
                None => {}
            }
        }
        self.joined_holds = Some(holds);
    }

    /// Whether the joined slot held the limiter at the last check (`None`: not joined).
    pub fn joined_holds(&self) -> Option<bool> {
        self.joined_holds
    }

    /// Logs a change of the bypass bit made outside this daemon (call once a second).
    pub fn watch_bypass(&mut self) -> Result<(), Error> {
        let on = self.maps.control()?.flags & CONTROL_BYPASS != 0;
        if on != self.bypass_seen {
            self.bypass_seen = on;
            if on {
                tracing::warn!(
                    "bypass switched on outside the daemon: every frame passes \
                     unclassified, unmetered and uncounted until `limiter bypass off`"
                );
            } else {
                tracing::warn!("bypass switched off outside the daemon: enforcing again");
            }
        }
        Ok(())
    }

    /// What [`Daemon::reload`] would do with the config file as it is now, without
    /// changing anything: the same checks (a file the reload would refuse is refused
    /// here with the same error), the rules added, removed and changed, whose state
    /// would start over, and the keys that wait for a restart.
    pub fn reload_dry_run(&self) -> Result<ReloadReport, Error> {
        let new = Config::load(&self.config_path)?;
        let handoff_live =
            crate::attach::handoff::live_change(self.config.handoff.as_ref(), new.handoff.as_ref());
        if handoff_live {
            self.handoff.plan_for(new.handoff.as_ref())?;
        }
        let plan = self.plan_for(&new)?;
        Ok(ReloadReport {
            rules: new.rules.len(),
            needs_restart: crate::daemon::reload_keys::restart_keys(&self.config, &new),
            plan,
        })
    }

    /// [`crate::policy::reload_plan::plan`] from the running rules to `new`'s, with the slots
    /// and the sketch's regions the install would give them.
    fn plan_for(&self, new: &Config) -> Result<crate::policy::reload_plan::ReloadPlan, Error> {
        let live = effective_rules(&self.config, &self.overrides);
        let slots = ruleset::assign_slots(&self.maps.live_slots()?, &new.rules)?;
        let table = ruleset::compile(&new.rules, &slots)?;
        let (regions, per_source) = crate::bpf::maps::region_plan(&self.maps.live_rules()?, &table);
        let mut plan = crate::policy::reload_plan::plan(
            &live,
            &new.rules,
            &self.overrides,
            &slots,
            &regions,
            per_source,
        );
        plan.settings = crate::policy::reload_plan::setting_changes(&self.config, new);
        Ok(plan)
    }

    /// Points the handoff at `spec` (same arrays: [`crate::attach::handoff::live_change`]). The
    /// new program goes into its slot first, then HANDOFF changes: no frame meets a
    /// half-made handoff.
    fn apply_handoff(&mut self, spec: Option<crate::config::HandoffSpec>) -> Result<(), Error> {
        let previous = self.handoff.spec().cloned();
        self.handoff.set_spec(spec);
        let plan = match self.handoff.plan() {
            Ok(plan) => plan,
            Err(e) => {
                self.handoff.set_spec(previous);
                self.handoff.follow()?;
                return Err(e);
            }
        };
        self.handoff.follow()?;
        self.maps.set_handoff(plan)?;
        Ok(())
    }

    /// Re-reads `next_program`'s pin (call once a second): an LB that replaced its
    /// program at the pin gets the next frames; a pin that is gone empties the slot, so
    /// frames pass (and are counted) instead of going to a program the LB removed.
    pub fn follow_handoff(&mut self) -> Result<(), Error> {
        self.handoff.follow().map(|_| ())
    }

    /// Changes a rule's aggregate rate (and burst) at once, keeping its bucket and every
    /// other rule's. Lasts until the next reload or restart.
    pub fn set_quota(
        &mut self,
        rule: &str,
        rate: u64,
        burst: Option<u64>,
    ) -> Result<QuotaEntry, Error> {
        if self.fleet.as_ref().is_some_and(|f| f.is_fleet_rule(rule)) {
            return Err(Error::Quota(format!(
                "rule {rule:?} takes its share from the allocator: change its global quota with \
                 `limiter-allocator quota set`"
            )));
        }
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
        let handoff = self.maps.handoff()?;
        let missing = self.maps.handoff_counters()?.missing;
        let shares = stats::collect(&self.maps)?
            .rules
            .into_iter()
            .map(|r| ShareStatus {
                rule: r.name,
                mode: r.mode.as_str(),
                enforce_percent: r.enforce_percent,
                state: r.state.as_str(),
                rate: r.rate,
                burst: r.burst,
            })
            .collect();
        Ok(Status {
            shares,
            fleet: self.fleet_counters(),
            allocator: self.fleet.as_ref().map(|f| f.spec().allocators_text()),
            bypass: self.maps.control()?.flags & CONTROL_BYPASS != 0,
            detached_unconfigured: self.detached_unconfigured.clone(),
            reattaches: self.links.values().map(|w| w.reattaches).sum(),
            joined: match self.handoff.spec() {
                Some(crate::config::HandoffSpec::Join { .. }) => self
                    .handoff
                    .status(Variant::Linear, handoff, missing)
                    .map(|mut h| {
                        let slot = self.handoff.joined_slot();
                        h.slot_holds_limiter = slot.as_ref().map(JoinedSlot::holds_limiter);
                        if let Some(problem) = slot.and_then(|s| s.problem()) {
                            h.warning = Some(problem);
                        }
                        h
                    }),
                _ => None,
            },
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
                .map(|a| {
                    let watch = self.links.get(&a.iface);
                    let attached = watch.is_none_or(LinkWatch::is_attached);
                    let running = if attached {
                        a.program_id().map_err(|e| e.to_string())
                    } else {
                        Err(match watch.and_then(|w| w.last_error.as_deref()) {
                            Some(e) => format!(
                                "the interface was created again and attaching to it failed (retried): {e}"
                            ),
                            None => "the interface was deleted (or created again): the limiter attaches to a device created under its name"
                                .to_string(),
                        })
                    };
                    InterfaceStatus {
                        name: a.iface.clone(),
                        mode: a.mode.as_str(),
                        program: a.variant.program_name(),
                        link: match a.origin {
                            LinkOrigin::Created => "created",
                            LinkOrigin::Adopted => "adopted",
                        },
                        pin: a.pin.clone(),
                        program_id: running.as_ref().ok().copied(),
                        hook: a.hook(),
                        chain: a.chain(),
                        handoff: self.handoff.status(a.variant, handoff, missing),
                        problem: running.err(),
                        attached,
                        reattaches: watch.map_or(0, |w| w.reattaches),
                        reattach_failures: watch.map_or(0, |w| w.failures),
                    }
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
        let mut e = explain::explain(&self.table, &self.maps, query, recent)?;
        e.hooks = self
            .attachments
            .iter()
            .map(|a| explain::HookChain {
                interface: a.iface.clone(),
                chain: a.chain(),
            })
            .collect();
        e.then = self.handoff_chain()?;
        Ok(e)
    }

    /// Where frames the limiter passes go next, one line per interface (or the joined
    /// slot), for `explain`; empty without a handoff (the stack).
    fn handoff_chain(&self) -> Result<Vec<String>, Error> {
        let handoff = self.maps.handoff()?;
        let missing = self.maps.handoff_counters()?.missing;
        let line = |h: HandoffStatus| match (h.program_id, h.missing) {
            (Some(id), _) => format!(
                "tail call through {} slot {} to program {id} ({})",
                h.array,
                h.first_slot,
                h.program_name.unwrap_or_else(|| "?".into())
            ),
            (None, why) => format!(
                "the stack: the next program is MISSING ({})",
                why.unwrap_or_default()
            ),
        };
        if let Some(crate::config::HandoffSpec::Join { array, index }) = self.handoff.spec() {
            return Ok(self
                .handoff
                .status(Variant::Linear, handoff, missing)
                .map(|h| {
                    format!(
                        "the LB's root array {} calls the limiter from slot {index}; then {}",
                        array.display(),
                        line(h)
                    )
                })
                .into_iter()
                .collect());
        }
        Ok(self
            .attachments
            .iter()
            .filter_map(|a| {
                self.handoff
                    .status(a.variant, handoff, missing)
                    .map(|h| format!("{}: {}", a.iface, line(h)))
            })
            .collect())
    }

    /// Stops the daemon. Enforcement stays (links and maps pinned) unless `detach`.
    pub fn stop(self, detach: bool) -> Result<(), Error> {
        if let Some((array, index)) = self.handoff.joined() {
            if detach {
                if crate::attach::handoff::leave_slot(array, index)? {
                    tracing::info!(array = %array.display(), index, "left the LB's root array");
                }
            } else {
                tracing::info!(array = %array.display(), index, "exiting; the LB's root array keeps calling the limiter");
            }
        }
        if detach {
            for a in self.attachments {
                let iface = a.iface.clone();
                unpin_link(a)?;
                tracing::info!(%iface, "detached");
            }
        } else {
            tracing::info!("exiting; enforcement continues through the pinned links and the hooks the limiter holds");
        }
        Ok(())
    }

    /// Detaches from every interface and removes every pin (maps and counters included).
    /// The control socket goes last: `limiter detach` waits for it as the sign that all
    /// is done.
    pub fn detach_all(mut self) -> Result<Cleanup, Error> {
        let pin_dir = self.config.pin_dir.clone();
        let instance = self.instance.take();
        drop(self);
        let cleanup = teardown::remove_pins(&pin_dir);
        drop(instance);
        cleanup
    }
}
