//! Starting the daemon: a sequence of named steps ([`StartStep`]) under a [`Rollback`]
//! that, dropped before [`Rollback::commit`], undoes everything the steps did so far. A
//! start that fails at any step leaves the pins, links, filters, dispatcher entries and
//! taken programs as they were before it, and its control socket gone (the socket's
//! lock file stays, as after every run: limiter-instance says why).
//!
//! Two kinds of change are not put back, and come last for that reason: an earlier
//! daemon's link adopted at [`StartStep::Attach`] keeps running this start's program
//! (its pin and its hook stay, enforcing), and what [`StartStep::DetachUnconfigured`]
//! and [`StartStep::Prune`] remove (what the config no longer has) stays removed. Hooks an
//! earlier run took over and this config no longer takes are given back
//! ([`StartStep::GiveBack`]), which is what a failed start would do next anyway.

use std::{
    collections::{BTreeMap, BTreeSet},
    ffi::OsString,
    fs,
    path::{Path, PathBuf},
    time::Instant,
};

use limiter_common::abi::{Handoff, CONTROL_BYPASS};
use limiter_fleet::clock::monotonic_ns;

use super::{apply_tunnels, relink::LinkWatch, Daemon, History, OWNER};
use crate::{
    attach::{
        handoff::{self, HandoffControl},
        program::{unpin_link, LinkOrigin, LoadOptions, Program},
        takeover,
    },
    bpf::pins,
    config::{Bypass, Config, HandoffSpec, XdpMode, XdpShare, XdpShareFallback},
    error::Error,
    host::object::Variant,
    policy::{fleet::FleetState, ruleset::RuleTable, saturation::Gate},
};

/// The steps of a start, in the order they run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StartStep {
    /// The capabilities the daemon needs (a daemon without them changes nothing).
    Privilege,
    /// The control socket claimed (a second daemon changes nothing).
    ClaimSocket,
    /// Nothing of someone else's where a link pin goes; the kernel's features; the LB's
    /// array.
    Preflight,
    /// Every build the hooks run loaded and verified, the maps pinned or adopted.
    Load,
    /// Hooks an earlier run took over and this config no longer takes, given back.
    GiveBack,
    /// The tail-call fallback's plan: the programs whose hooks it takes, pinned.
    Takeover,
    /// Where passed frames go: the handoff's arrays and slots.
    Handoff,
    /// The fleet's pinned shares resumed; rules, tunnels, the monitor, bypass and the
    /// handoff written to the maps.
    Install,
    /// The programs pinned before any hook runs them.
    PinPrograms,
    /// Every configured interface's hook.
    Attach,
    /// The LB's root array joined (`join_program_array`).
    Join,
    /// Interfaces no longer configured detached.
    DetachUnconfigured,
    /// An earlier daemon's program pins removed.
    Prune,
}

impl StartStep {
    /// Every step, in order.
    pub const ALL: [StartStep; 13] = [
        StartStep::Privilege,
        StartStep::ClaimSocket,
        StartStep::Preflight,
        StartStep::Load,
        StartStep::GiveBack,
        StartStep::Takeover,
        StartStep::Handoff,
        StartStep::Install,
        StartStep::PinPrograms,
        StartStep::Attach,
        StartStep::Join,
        StartStep::DetachUnconfigured,
        StartStep::Prune,
    ];
}

/// The fault-injection seam (`--features fault-injection`, for tests only): fails the
/// start right after one step has done its work, so a test can see that the start
/// undoes it and every step before.
#[cfg(feature = "fault-injection")]
pub mod fault {
    use std::cell::Cell;

    use super::StartStep;
    use crate::error::Error;

    thread_local! {
        /// The step after which this thread's starts fail (tests run side by side in
        /// threads: each arms its own).
        static FAIL_AFTER: Cell<Option<StartStep>> = const { Cell::new(None) };
    }

    /// Fails every start this thread makes after `step` (`None`: no more faults).
    pub fn fail_after(step: Option<StartStep>) {
        FAIL_AFTER.set(step);
    }

    pub(super) fn check(step: StartStep) -> Result<(), Error> {
        if FAIL_AFTER.get() == Some(step) {
            return Err(Error::Io {
                what: format!("starting, after the step {step:?}"),
                source: std::io::Error::other("fault injected (test build)"),
            });
        }
        Ok(())
    }
}

#[cfg(not(feature = "fault-injection"))]
mod fault {
    use super::StartStep;
    use crate::error::Error;

    #[expect(clippy::unnecessary_wraps, reason = "the test build's seam fails here")]
    pub(super) const fn check(_: StartStep) -> Result<(), Error> {
        Ok(())
    }
}

/// What a start has changed so far. Dropped before [`Rollback::commit`], it undoes it,
/// last change first.
struct Rollback {
    pin_dir: PathBuf,
    /// pin_dir's entries before the start; `None` when it did not exist.
    pins_before: Option<BTreeSet<OsString>>,
    /// The takeover's plan once its programs are pinned.
    takeover: Option<takeover::Plan>,
    /// The daemon once it holds the program, its maps and its socket.
    daemon: Option<Daemon>,
    committed: bool,
}

impl Rollback {
    fn new(pin_dir: &Path) -> Rollback {
        Rollback {
            pin_dir: pin_dir.to_path_buf(),
            pins_before: entries(pin_dir),
            takeover: None,
            daemon: None,
            committed: false,
        }
    }

    /// The start keeps what it did: returns the daemon.
    fn commit(mut self) -> Result<Daemon, Error> {
        self.committed = true;
        self.daemon.take().ok_or_else(|| Error::Io {
            what: "starting: committed before the daemon was made".to_string(),
            source: std::io::Error::other("no daemon"),
        })
    }
}

impl Drop for Rollback {
    fn drop(&mut self) {
        if self.committed {
            return;
        }
        if let Some(mut daemon) = self.daemon.take() {
            if let Some((array, index)) = daemon.handoff.joined() {
                if let Err(e) = handoff::leave_slot(array, index) {
                    tracing::warn!("undoing the start: {e}");
                }
            }
            for a in std::mem::take(&mut daemon.attachments).into_iter().rev() {
                // An adopted link was there before: it stays (running this program).
                if a.origin == LinkOrigin::Created {
                    let iface = a.iface.clone();
                    match unpin_link(a) {
                        Ok(()) => tracing::info!(%iface, "undoing the start: detached"),
                        Err(e) => tracing::warn!(%iface, "undoing the start: {e}"),
                    }
                }
            }
            // The program, its maps' descriptors and the control socket go here.
            drop(daemon);
        }
        if let Some(plan) = &self.takeover {
            plan.undo(&self.pin_dir);
        }
        remove_new_pins(&self.pin_dir, self.pins_before.as_ref());
    }
}

/// The names in `dir`; `None` when it cannot be read (it does not exist).
fn entries(dir: &Path) -> Option<BTreeSet<OsString>> {
    let read = fs::read_dir(dir).ok()?;
    Some(read.filter_map(|e| e.ok().map(|e| e.file_name())).collect())
}

/// Removes what a failed start pinned under `pin_dir`: every entry of a name the limiter
/// pins under that was not in `before` (pin_dir may be shared), and the directory itself
/// when it did not exist before and is empty now.
fn remove_new_pins(pin_dir: &Path, before: Option<&BTreeSet<OsString>>) {
    for name in entries(pin_dir).unwrap_or_default() {
        let ours = name.to_str().and_then(pins::parse_name).is_some();
        if !ours || before.is_some_and(|b| b.contains(&name)) {
            continue;
        }
        let path = pin_dir.join(&name);
        match fs::remove_file(&path) {
            Ok(()) => tracing::info!(pin = %path.display(), "undoing the start: unpinned"),
            Err(e) => tracing::warn!(pin = %path.display(), "undoing the start: {e}"),
        }
    }
    if before.is_none() {
        let _ = fs::remove_dir(pin_dir);
    }
}

impl Daemon {
    /// Loads the program with maps pinned under `pin_dir` (adopting the maps of an
    /// earlier daemon: buckets and counters continue), installs the rules, then runs it
    /// on every interface through pinned links (adopting earlier links atomically).
    pub fn start(config_path: &Path, config: Config, ifaces: &[String]) -> Result<Daemon, Error> {
        Daemon::start_with_object(config_path, config, ifaces, None)
    }

    /// [`Daemon::start`] with another BPF object than the one built in (`limiter run
    /// --bpf-object`, for testing and for trying a rebuilt program before an upgrade).
    /// All or nothing: a start that fails undoes what it did ([`Rollback`]).
    pub fn start_with_object(
        config_path: &Path,
        config: Config,
        ifaces: &[String],
        bpf_object: Option<&Path>,
    ) -> Result<Daemon, Error> {
        let mut rollback = Rollback::new(&config.pin_dir);
        let done = fault::check;
        // Before anything else: a daemon without the capabilities it needs says which,
        // and changes nothing.
        crate::host::privilege::check_daemon(config.xdp_share == XdpShare::Libxdp)?;
        done(StartStep::Privilege)?;
        // First, so a second daemon, or something in the socket's way, changes nothing.
        let claimed = limiter_instance::claim(&config.control_socket, OWNER)?;
        for dir in &claimed.report.created_dirs {
            tracing::info!(dir = %dir.display(), "created the control socket's directory (mode 0700)");
        }
        if claimed.report.replaced_stale {
            tracing::info!(socket = %config.control_socket.display(), "replaced a stale control socket");
        }
        done(StartStep::ClaimSocket)?;
        preflight(&config, ifaces)?;
        done(StartStep::Preflight)?;
        let (mut program, handoff_array) = load(&config, bpf_object)?;
        let maps = program.maps()?;
        done(StartStep::Load)?;
        // Hooks taken over by an earlier run that this config no longer takes (the
        // interface left the config, or the fallback is off) go back to their programs
        // before anything else is attached.
        let fallback = config.xdp_share == XdpShare::Libxdp
            && config.xdp_share_fallback == XdpShareFallback::TailCall;
        let keep: &[String] = if fallback { ifaces } else { &[] };
        let given_back = takeover::give_back_unconfigured(&config.pin_dir, keep)?;
        for (_, done) in &given_back {
            tracing::warn!("{done} (not taken over in this config)");
        }
        done(StartStep::GiveBack)?;
        // Where the kernel refuses freplace, the fallback's plan: which hooks are taken
        // over, and the program they held, which then gets the frames the limiter passes.
        let takeover = if fallback {
            rollback
                .takeover
                .insert(takeover::plan(&config.pin_dir, ifaces)?)
                .clone()
        } else {
            takeover::Plan::default()
        };
        done(StartStep::Takeover)?;
        let handoff_spec = takeover
            .handoff(&config.pin_dir)
            .or_else(|| config.handoff.clone());
        let handoff = HandoffControl::new(
            handoff_spec,
            &config.pin_dir,
            program.take_handoff_arrays(handoff_array),
        )?;
        // A slot outside the LB's array is refused before anything changes.
        let handoff_plan = handoff.plan()?;
        done(StartStep::Handoff)?;
        let now = monotonic_ns();
        let mut fleet = config.fleet.clone().map(|spec| {
            FleetState::new(spec, config.fleet_size, config.xdp_mode, &config.rules, now)
        });
        if let Some(fleet) = &mut fleet {
            // An earlier daemon's shares, from the pinned rule entries: a restart within
            // a lease resumes it instead of bootstrapping.
            let pinned: BTreeMap<String, limiter_common::abi::RuleConfig> = maps
                .live_rules()?
                .into_values()
                .map(|r| (String::from_utf8_lossy(r.name_bytes()).into_owned(), r))
                .collect();
            let (resumed, refused) = fleet.resume(&config.rules, &pinned, now);
            for rule in resumed {
                tracing::info!(%rule, "resumed the share the pinned rule entry holds");
            }
            for r in refused {
                tracing::warn!(rule = %r.rule, "pinned share not resumed: {}", r.reason);
            }
        }
        // A rule the pinned entries mark saturated stays so across a restart (a flood in
        // progress); the first checks say whether it still is.
        let saturation = maps
            .live_rules()?
            .into_values()
            .filter(|r| r.flags & limiter_common::abi::RULE_SOURCES_SATURATED != 0)
            .map(|r| {
                (
                    String::from_utf8_lossy(r.name_bytes()).into_owned(),
                    Gate::resumed(true),
                )
            })
            .collect();
        let daemon = rollback.daemon.insert(Daemon {
            saturation,
            saturation_phase: 0,
            config_path: config_path.to_path_buf(),
            config,
            overrides: BTreeMap::new(),
            program,
            maps,
            table: RuleTable::default(),
            attachments: Vec::new(),
            started: Instant::now(),
            history: History::default(),
            fleet,
            installed_states: BTreeMap::new(),
            control_listener: Some(claimed.listener),
            detached_unconfigured: given_back.into_iter().map(|(iface, _)| iface).collect(),
            handoff,
            links: BTreeMap::new(),
            instance: Some(claimed.instance),
            bypass_seen: false,
            joined_holds: None,
        });
        daemon.install(handoff_plan)?;
        done(StartStep::Install)?;
        // Pinned before any hook runs them: a daemon killed from here on leaves programs
        // its successor recognises on the hooks without CAP_SYS_ADMIN.
        daemon.program.pin_programs(&daemon.config.pin_dir)?;
        done(StartStep::PinPrograms)?;
        for iface in ifaces {
            daemon.attach_at_start(iface, &takeover)?;
        }
        done(StartStep::Attach)?;
        if let Some(spec) = daemon.handoff.spec().cloned() {
            if matches!(spec, HandoffSpec::Join { .. }) {
                let fd = daemon.program.program_fd(Variant::Linear)?;
                daemon.handoff.join(fd)?;
            }
            tracing::info!(handoff = %spec, first_slot = handoff_plan.first, slots = handoff_plan.slots, "frames the limiter passes are handed over");
        }
        done(StartStep::Join)?;
        // Every hook runs this daemon's programs now. A build first loaded above (a hook
        // taken over) was pinned then, and is kept.
        let running = daemon.program.pin_programs(&daemon.config.pin_dir)?;
        // What the config no longer has goes last: nothing after it can fail.
        daemon.detach_unconfigured(ifaces)?;
        done(StartStep::DetachUnconfigured)?;
        // An earlier daemon's pins go.
        pins::prune_programs(&daemon.config.pin_dir, &running);
        if daemon.maps.control()?.flags & CONTROL_BYPASS != 0 {
            tracing::warn!(
                "CONTROL bypass is set: every frame passes unclassified, unmetered and \
                 uncounted until `limiter bypass off` clears it"
            );
        }
        done(StartStep::Prune)?;
        rollback.commit()
    }

    /// [`StartStep::Install`]: rules first, so no frame meets the program without them;
    /// the config's kill switch and where passed frames go before the program runs
    /// anywhere new.
    fn install(&mut self, handoff_plan: Handoff) -> Result<(), Error> {
        self.reinstall()?;
        apply_tunnels(&mut self.maps, &self.config)?;
        self.maps.set_monitor_config(self.config.monitor.to_abi())?;
        self.bypass_seen = self.maps.control()?.flags & CONTROL_BYPASS != 0;
        if self.config.bypass == Bypass::On && !self.bypass_seen {
            self.set_bypass(true, "the config's bypass = \"on\"")?;
        }
        self.handoff.follow()?;
        if self.handoff.spec().is_none() {
            self.handoff.clear_own();
        }
        self.maps.set_handoff(handoff_plan)?;
        let generic_build = self.handoff.generic_build();
        self.program.set_generic_build(generic_build);
        for warning in self.config.tc_burst_warnings() {
            tracing::warn!("{warning}");
        }
        tracing::info!(
            rules = self.table.rules.len(),
            fleet = self.fleet.is_some(),
            "rules installed"
        );
        Ok(())
    }

    /// [`StartStep::Attach`] on one interface, as `xdp_share` and the takeover's plan say.
    fn attach_at_start(&mut self, iface: &str, takeover: &takeover::Plan) -> Result<(), Error> {
        let (mode, pin_dir) = (self.config.xdp_mode, &self.config.pin_dir);
        let a = match self.config.xdp_share {
            XdpShare::Exclusive => self.program.attach_pinned(iface, mode, pin_dir)?,
            XdpShare::Libxdp => match takeover.step(iface) {
                takeover::Step::Join => {
                    self.program
                        .attach_shared(iface, mode, self.config.xdp_priority)?
                }
                step => {
                    let taken = (takeover.handing.as_deref() == Some(iface))
                        .then(|| pins::taken_pin_path(pin_dir, iface));
                    // The build whose prog array took the taken program (its xdp.frags
                    // flag decides); alone, the single-buffer build first, as a link
                    // would.
                    let variants: Vec<Variant> = if taken.is_some() || mode == XdpMode::Generic {
                        vec![self.handoff.generic_build()]
                    } else {
                        Variant::XDP.to_vec()
                    };
                    self.program
                        .attach_netlink(iface, &step, mode, &variants, taken)?
                }
            },
        };
        let how = match a.origin {
            LinkOrigin::Created => "attached",
            LinkOrigin::Adopted => {
                "adopted the earlier daemon's hook (program replaced atomically)"
            }
        };
        tracing::info!(
            iface = %a.iface,
            mode = a.mode.as_str(),
            program = a.variant.program_name(),
            hook = %a.hook(),
            "{how}"
        );
        // In the attachments first, so a failure below still undoes the link.
        let iface = a.iface.clone();
        self.attachments.push(a);
        let ifindex = crate::attach::netlink::ifindex_of(&iface)?;
        let kind = crate::attach::netlink::link(ifindex)
            .ok()
            .flatten()
            .and_then(|l| l.kind);
        self.links.insert(iface, LinkWatch::attached(ifindex, kind));
        Ok(())
    }
}

/// [`StartStep::Preflight`]: what would refuse the start, found before anything is
/// loaded or pinned.
fn preflight(config: &Config, ifaces: &[String]) -> Result<(), Error> {
    if let Some(spec @ HandoffSpec::Join { array, .. }) = &config.handoff {
        if !ifaces.is_empty() {
            return Err(Error::Handoff {
                key: spec.key(),
                reason: format!(
                    "the LB's root program (array {}) runs on the interfaces and calls \
                     the limiter; attaching it to {} too would meter every frame twice \
                     (start without --iface and without interfaces)",
                    array.display(),
                    ifaces.join(", ")
                ),
            });
        }
    }
    // Someone else's object where a link of ours would go.
    for iface in ifaces {
        let pin = pins::link_pin_path(&config.pin_dir, iface);
        if fs::symlink_metadata(&pin).is_ok() {
            pins::check_ours(&pin, pins::PinName::Link(iface))
                .map_err(|why| Error::PinInTheWay { path: pin, why })?;
        }
    }
    // What this kernel offers: a mode it cannot run is refused by the feature's name and
    // the kernel version that has it.
    match crate::host::kernel::running() {
        Some(kernel) => {
            let support = crate::host::kernel::check(
                kernel,
                config.xdp_mode,
                &crate::host::kernel::Probes::run(),
            )?;
            tracing::info!(
                release = crate::host::kernel::release().unwrap_or_default(),
                xdp_mode = config.xdp_mode.as_str(),
                "{support}"
            );
        }
        // Not a reason to refuse: the loader's own errors name what is missing.
        None => tracing::warn!(
            release = crate::host::kernel::release().unwrap_or_default(),
            "could not read the kernel version: its features are not checked before loading"
        ),
    }
    // The LB's array is checked by the key that names it (the loader checks again).
    if let Some(spec) = &config.handoff {
        if let Some(array) = spec.lb_array() {
            handoff::check_lb_array(spec.key(), array)?;
        }
    }
    Ok(())
}

/// [`StartStep::Load`]: every build the hooks run, verified before a rule is written or
/// a link touched (a refused build changes nothing that runs), with the maps pinned or
/// adopted. Returns the program and whether the handoff uses the LB's array.
fn load(config: &Config, bpf_object: Option<&Path>) -> Result<(Program, bool), Error> {
    let load = LoadOptions {
        pin_dir: Some(config.pin_dir.clone()),
        max_sources: config.max_sources,
        handoff_array: config
            .handoff
            .as_ref()
            .and_then(|h| h.lb_array())
            .map(Path::to_path_buf),
    };
    let builds = crate::attach::program::builds_for(
        config.xdp_share,
        config.xdp_share_fallback,
        config.handoff.is_some(),
        config.xdp_mode,
    );
    let program = match bpf_object {
        None => Program::load_builds(&load, builds)?,
        Some(path) => {
            tracing::warn!(object = %path.display(), "loading a BPF object other than the built-in one");
            Program::load_object_builds(&load, Program::read_object(path)?.bytes(), builds)?
        }
    };
    if builds.is_empty() {
        tracing::info!("no build verified yet: the libxdp component is, as it joins");
    } else {
        let names: Vec<&str> = builds.iter().map(|b| b.as_str()).collect();
        tracing::info!(builds = %names.join(", "), "verified the builds the hooks run");
    }
    let lb_array = load.handoff_array.is_some();
    if lb_array {
        // An earlier run's own array (next_program = "PIN") must not keep the LB's old
        // program alive.
        let own = config
            .pin_dir
            .join(limiter_common::abi::map_name::HANDOFF_LINEAR);
        if fs::symlink_metadata(&own).is_ok() {
            let (_, mut array) = handoff::open_array(&own)?;
            let _ = array.clear_index(&0);
        }
    }
    Ok((program, lb_array))
}
