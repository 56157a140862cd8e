//! `xdp_share = "libxdp"`: the limiter as one component of libxdp's multi-program
//! dispatcher (xdp-tools' `lib/libxdp/protocol.org`, version 2), so it shares an
//! interface's XDP hook with xdp-loader, xdp-filter and anything else that speaks the
//! protocol.
//!
//! The protocol, in short: the hook runs a dispatcher program (`xdp_dispatcher`) that
//! calls up to ten stub functions in turn; each component is an freplace
//! (BPF_PROG_TYPE_EXT) program linked over one stub, in run-priority order, and the next
//! one runs while a component returns an action in its chain-call bitmap. The components'
//! programs and links are pinned under `<bpffs>/xdp/dispatch-<ifindex>-<dispatcher id>/`
//! (`prog<N>-prog`, `prog<N>-link`) so they outlive the process that linked them. A change
//! (a component joins or leaves) never edits the running dispatcher: a new one is built
//! with the new list, every remaining component is linked to it as well (freplace
//! programs may be linked to several targets), it replaces the old one on the interface
//! in one netlink request that names the old one (XDP_FLAGS_REPLACE), and only then are
//! the old pins removed. So no frame ever meets a half-built chain, and a writer that lost
//! a race finds out (EEXIST) and starts over. Writers serialise on `flock` of
//! `<bpffs>/xdp`, as libxdp does.
//!
//! Which component is the limiter's is read from the kernel, not remembered: an EXT
//! program using this pin_dir's CONTROL map (as for TC filters).

use std::{
    fs,
    os::{
        fd::{AsFd as _, AsRawFd as _, OwnedFd},
        unix::fs::DirBuilderExt as _,
    },
    path::{Path, PathBuf},
};

use aya::{
    include_bytes_aligned,
    maps::{Array, Map, MapData},
    programs::{links::FdLink, Extension, ProgramFd, ProgramInfo, Xdp},
    EbpfLoader,
};
use limiter_common::dispatcher::{
    chain_call_bits, DispatcherConfig, CONFIG_SYMBOL, MAGIC, MAX_COMPONENTS, PROGRAM_FLAG_FRAGS,
    PROGRAM_NAME, STUB_NAMES, STUB_RETVAL, VERSION,
};

use crate::{
    attach::{
        netlink::{
            self, XdpAttached, XDP_FLAGS_DRV_MODE, XDP_FLAGS_SKB_MODE, XDP_FLAGS_UPDATE_IF_NOEXIST,
        },
        tc_filter,
    },
    config::XdpMode as ConfigXdpMode,
    error::Error,
    host::loaded::program_info,
};

/// The limiter's dispatcher (limiter-ebpf's `dispatcher`), built by build.rs.
pub static DISPATCHER_OBJECT: &[u8] =
    include_bytes_aligned!(concat!(env!("OUT_DIR"), "/dispatcher.bpf.o"));

/// `1 << XDP_PASS`: the limiter's component hands on what it passes, nothing else.
pub const CHAIN_ON_PASS: u32 = 1 << 2;
/// How often a change that lost a race to another writer is tried again.
const ATTEMPTS: usize = 5;
/// BPF_F_RDONLY_PROG: a `.rodata` map.
const RDONLY_PROG: u32 = 1 << 7;

/// libxdp's state directory: `<bpffs>/xdp`, where `LIBXDP_BPFFS` overrides the bpffs
/// (as libxdp reads it).
pub fn state_dir() -> PathBuf {
    let root = std::env::var_os("LIBXDP_BPFFS")
        .map_or_else(|| PathBuf::from("/sys/fs/bpf"), PathBuf::from);
    root.join("xdp")
}

fn dispatch_dir(ifindex: u32, dispatcher_id: u32) -> PathBuf {
    state_dir().join(format!("dispatch-{ifindex}-{dispatcher_id}"))
}

/// One component of a dispatcher, as the kernel and the pins say.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Component {
    /// Position in the run order (0 runs first).
    pub slot: usize,
    pub program_id: u32,
    pub name: String,
    pub run_prio: u32,
    /// The XDP actions on which the next component runs (without the stub bit).
    pub chain_call_actions: u32,
    pub frags: bool,
    /// A build of this limiter (on this pin_dir's maps).
    pub limiter: bool,
}

impl Component {
    /// "XDP_PASS, XDP_DROP" for `chain_call_actions`.
    pub fn chain_on(&self) -> String {
        const ACTIONS: [&str; 5] = [
            "XDP_ABORTED",
            "XDP_DROP",
            "XDP_PASS",
            "XDP_TX",
            "XDP_REDIRECT",
        ];
        let names: Vec<&str> = ACTIONS
            .iter()
            .enumerate()
            .filter(|(bit, _)| self.chain_call_actions & (1 << bit) != 0)
            .map(|(_, name)| *name)
            .collect();
        if names.is_empty() {
            "nothing".into()
        } else {
            names.join(", ")
        }
    }
}

/// What holds an interface's XDP hook (netlink-attached; a bpf_link is [`Hook::Other`]
/// too, since netlink cannot replace it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Hook {
    Empty,
    Dispatcher(Dispatcher),
    Other {
        program_id: u32,
        name: String,
        mode: XdpAttached,
    },
}

/// A libxdp dispatcher running on an interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dispatcher {
    pub program_id: u32,
    pub mode: XdpAttached,
    pub config: DispatcherConfig,
    pub components: Vec<Component>,
}

/// The lock every libxdp writer takes on `<bpffs>/xdp` (released when dropped).
pub struct Lock {
    _dir: OwnedFd,
}

impl Lock {
    pub fn acquire() -> Result<Lock, Error> {
        let dir = state_dir();
        let io = |what: String| move |e| Error::Io { what, source: e };
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(io(format!(
                "creating libxdp's state directory {}",
                dir.display()
            )))?;
        let file = fs::File::open(&dir).map_err(io(format!("opening {}", dir.display())))?;
        let fd = OwnedFd::from(file);
        // SAFETY: flock(2) on a descriptor this function owns.
        if unsafe { libc::flock(fd.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(io(format!("locking {}", dir.display()))(
                std::io::Error::last_os_error(),
            ));
        }
        Ok(Lock { _dir: fd })
    }
}

/// What holds the XDP hook of `ifindex`; `control_id` marks the limiter's components.
pub fn inspect(iface: &str, ifindex: u32, control_id: Option<u32>) -> Result<Hook, Error> {
    let Some((program_id, mode)) = netlink::xdp_program(ifindex).map_err(|e| Error::Io {
        what: format!("reading the XDP program of {iface}"),
        source: e,
    })?
    else {
        return Ok(Hook::Empty);
    };
    let Some(info) = program_info(program_id) else {
        // Replaced between the two reads: the caller's attempt fails on EEXIST and
        // starts over.
        return Ok(Hook::Other {
            program_id,
            name: "(gone)".into(),
            mode,
        });
    };
    let name = info.name_as_str().unwrap_or("").to_string();
    let map_ids = info.map_ids().ok().flatten().unwrap_or_default();
    if name != PROGRAM_NAME || map_ids.len() != 1 || info.btf_id().is_none() {
        return Ok(Hook::Other {
            program_id,
            name,
            mode,
        });
    }
    let sharing = |reason: String| Error::Sharing {
        iface: iface.to_string(),
        reason,
    };
    let config = read_config(map_ids[0]).map_err(|why| {
        sharing(format!(
            "the XDP program {program_id} is named {PROGRAM_NAME} but is not a libxdp \
             dispatcher the limiter can read: {why}"
        ))
    })?;
    if config.magic != MAGIC || config.dispatcher_version != VERSION {
        return Err(sharing(format!(
            "dispatcher {program_id} is libxdp dispatcher version {} (magic {}); the limiter \
             speaks version {VERSION} (libxdp 1.2 and later) and does not replace older ones, \
             as newer libxdp does not: unload its programs with xdp-loader first",
            config.dispatcher_version, config.magic
        )));
    }
    let dir = dispatch_dir(ifindex, program_id);
    let mut components = Vec::new();
    for slot in 0..usize::from(config.num_progs_enabled).min(MAX_COMPONENTS) {
        let pin = dir.join(format!("prog{slot}-prog"));
        let info = ProgramInfo::from_pin(&pin).map_err(|e| {
            sharing(format!(
                "dispatcher {program_id} has {} components but {} cannot be read ({e}): \
                 another tool is changing it or left it half-built; see `xdp-loader status`",
                config.num_progs_enabled,
                pin.display()
            ))
        })?;
        let id = info.id();
        components.push(Component {
            slot,
            program_id: id,
            name: info.name_as_str().unwrap_or("").to_string(),
            run_prio: config.run_prios[slot],
            chain_call_actions: config.chain_call_actions[slot] & !(1 << STUB_RETVAL),
            frags: config.program_flags[slot] & PROGRAM_FLAG_FRAGS != 0,
            limiter: control_id.is_some_and(|c| tc_filter::program_uses_map(id, c)),
        });
    }
    Ok(Hook::Dispatcher(Dispatcher {
        program_id,
        mode,
        config,
        components,
    }))
}

fn read_config(map_id: u32) -> Result<DispatcherConfig, String> {
    let data = MapData::from_id(map_id).map_err(|e| e.to_string())?;
    let info = data.info().map_err(|e| e.to_string())?;
    let size = std::mem::size_of::<DispatcherConfig>() as u32;
    if info.key_size() != 4
        || info.value_size() != size
        || info.max_entries() != 1
        || info.map_flags() & RDONLY_PROG == 0
    {
        return Err(format!(
            "its map is not a read-only 1-entry configuration of {size} bytes (key {}, \
             value {}, entries {}, flags {:#x})",
            info.key_size(),
            info.value_size(),
            info.max_entries(),
            info.map_flags()
        ));
    }
    let array: Array<MapData, DispatcherConfig> =
        Array::try_from(Map::Array(data)).map_err(|e| e.to_string())?;
    array.get(&0, 0).map_err(|e| e.to_string())
}

/// One entry of a dispatcher to build: an existing component carried over, or the
/// limiter's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Planned {
    pub name: String,
    pub run_prio: u32,
    pub chain_call_actions: u32,
    pub frags: bool,
    /// The slot in the running dispatcher; `None` for the limiter's new component.
    pub from_slot: Option<usize>,
}

/// The run order of a dispatcher made of `existing` without the limiter's components,
/// plus the limiter's at `priority` when `join`: by run priority, then by name, an
/// existing program before a new one on a tie (libxdp's `cmp_xdp_programs`).
pub fn plan(existing: &[Component], join: Option<u32>) -> Result<Vec<Planned>, String> {
    let mut out: Vec<Planned> = existing
        .iter()
        .filter(|c| !c.limiter)
        .map(|c| Planned {
            name: c.name.clone(),
            run_prio: c.run_prio,
            chain_call_actions: c.chain_call_actions,
            frags: c.frags,
            from_slot: Some(c.slot),
        })
        .collect();
    if let Some(priority) = join {
        out.push(Planned {
            name: limiter_common::abi::PROGRAM_NAME_LIBXDP.into(),
            run_prio: priority,
            chain_call_actions: CHAIN_ON_PASS,
            frags: false,
            from_slot: None,
        });
    }
    if out.len() > MAX_COMPONENTS {
        return Err(format!(
            "the dispatcher would need {} slots; libxdp's has {MAX_COMPONENTS}",
            out.len()
        ));
    }
    // Stable: existing components keep their relative order on a full tie.
    out.sort_by(|a, b| {
        (a.run_prio, &a.name, a.from_slot.is_none()).cmp(&(
            b.run_prio,
            &b.name,
            b.from_slot.is_none(),
        ))
    });
    Ok(out)
}

/// The configuration of a dispatcher running `plan` in order. It is loaded without
/// frags unless every component has them (the limiter's never does, see [`plan`]).
pub fn config_for(plan: &[Planned]) -> DispatcherConfig {
    let mut c = DispatcherConfig::EMPTY;
    c.magic = MAGIC;
    c.dispatcher_version = VERSION;
    c.num_progs_enabled = plan.len().min(MAX_COMPONENTS) as u8;
    c.is_xdp_frags = 0;
    for (slot, p) in plan.iter().take(MAX_COMPONENTS).enumerate() {
        c.chain_call_actions[slot] = chain_call_bits(p.chain_call_actions);
        c.run_prios[slot] = p.run_prio;
        c.program_flags[slot] = if p.frags { PROGRAM_FLAG_FRAGS } else { 0 };
    }
    c
}

/// The stub slot `slot` of a dispatcher of `n` components is linked over: with one,
/// libxdp replaces the dispatcher's main function itself (no call per frame).
pub fn target_function(n: usize, slot: usize) -> &'static str {
    if n == 1 {
        PROGRAM_NAME
    } else {
        STUB_NAMES[slot.min(MAX_COMPONENTS - 1)]
    }
}

/// The outcome of a change.
#[derive(Clone, Debug)]
pub struct Installed {
    /// The dispatcher now on the interface (`None`: the last component left, the hook is
    /// empty).
    pub dispatcher_id: Option<u32>,
    pub mode: Option<XdpAttached>,
    pub components: Vec<Component>,
    /// The limiter had a component there already, which this change replaced.
    pub replaced_limiter: bool,
}

/// Makes the limiter's component `ours` (an [`Extension`], loaded or not) a component of
/// the dispatcher of `iface` at `priority`, replacing the limiter's earlier component if
/// there is one (a restart or upgrade: the swap is atomic), or installs a new dispatcher
/// when the hook is empty.
pub fn join(
    iface: &str,
    ifindex: u32,
    mode: ConfigXdpMode,
    priority: u32,
    control_id: u32,
    ours: &mut Extension,
) -> Result<Installed, Error> {
    change(iface, ifindex, mode, Some((priority, ours)), control_id)
}

/// Takes the limiter's component out of the dispatcher of `iface`; the last component out
/// takes the dispatcher with it. Nothing to do when the limiter has no component there.
pub fn leave(iface: &str, ifindex: u32, control_id: u32) -> Result<Option<Installed>, Error> {
    // A read only, to spare a rebuild: `change` reads the hook again under the lock.
    match inspect(iface, ifindex, Some(control_id))? {
        Hook::Dispatcher(d) if d.components.iter().any(|c| c.limiter) => {}
        _ => return Ok(None),
    }
    change(iface, ifindex, ConfigXdpMode::Auto, None, control_id).map(Some)
}

fn change(
    iface: &str,
    ifindex: u32,
    mode: ConfigXdpMode,
    mut ours: Option<(u32, &mut Extension)>,
    control_id: u32,
) -> Result<Installed, Error> {
    let sharing = |reason: String| Error::Sharing {
        iface: iface.to_string(),
        reason,
    };
    let _lock = Lock::acquire()?;
    let mut last = None;
    for _ in 0..ATTEMPTS {
        let hook = inspect(iface, ifindex, Some(control_id))?;
        let old = match hook {
            Hook::Empty => None,
            Hook::Dispatcher(d) => Some(d),
            Hook::Other {
                program_id,
                name,
                mode,
            } => {
                return Err(sharing(format!(
                    "the XDP hook runs program {program_id} ({name}, {}) that is not a \
                     libxdp dispatcher, so nothing can join it. If it is a load balancer that \
                     owns the hook, hand frames to it with next_program or join_program_array; \
                     if it is a libxdp user's single program (libxdp's choice where the kernel \
                     refuses freplace), xdp_share_fallback = \"tail-call\" lets the limiter \
                     take its place and tail-call it (docs/sharing.md, \"Sharing the XDP hook\"); if \
                     it is the limiter's own link from xdp_share = \"exclusive\", run \
                     `limiter detach` first",
                    mode.as_str()
                )))
            }
        };
        if old.as_ref().is_some_and(|d| d.mode == XdpAttached::Other) {
            return Err(sharing(
                "the dispatcher runs offloaded or in several modes at once; the limiter \
                 shares native and generic hooks only"
                    .into(),
            ));
        }
        let existing = old.as_ref().map_or(&[][..], |d| &d.components[..]);
        let replaced_limiter = existing.iter().any(|c| c.limiter);
        let planned = plan(existing, ours.as_ref().map(|(p, _)| *p)).map_err(sharing)?;
        if planned.is_empty() {
            let Some(old) = &old else {
                return Ok(Installed {
                    dispatcher_id: None,
                    mode: None,
                    components: Vec::new(),
                    replaced_limiter: false,
                });
            };
            match detach_dispatcher(iface, ifindex, old) {
                Ok(()) => {
                    return Ok(Installed {
                        dispatcher_id: None,
                        mode: None,
                        components: Vec::new(),
                        replaced_limiter: true,
                    })
                }
                Err(Attempt::Raced(e)) => last = Some(e),
                Err(Attempt::Failed(e)) => return Err(e),
            }
            continue;
        }
        let flags =
            match &old {
                Some(d) => vec![d.mode.flag()],
                None => match mode {
                    ConfigXdpMode::Native => vec![XDP_FLAGS_DRV_MODE],
                    ConfigXdpMode::Generic => vec![XDP_FLAGS_SKB_MODE],
                    ConfigXdpMode::Auto => vec![XDP_FLAGS_DRV_MODE, XDP_FLAGS_SKB_MODE],
                    ConfigXdpMode::Tc => return Err(sharing(
                        "xdp_share = \"libxdp\" shares the XDP hook; xdp_mode = \"tc\" does not \
                         use it"
                            .into(),
                    )),
                },
            };
        match build(
            iface,
            ifindex,
            old.as_ref(),
            &planned,
            &flags,
            ours.as_mut().map(|(_, e)| &mut **e),
        ) {
            Ok(installed) => {
                return Ok(Installed {
                    replaced_limiter,
                    ..installed
                })
            }
            Err(Attempt::Raced(e)) => last = Some(e),
            Err(Attempt::Failed(e)) => return Err(e),
        }
    }
    Err(sharing(format!(
        "another writer changed the XDP hook {ATTEMPTS} times while the limiter was \
         changing it{}",
        last.map(|e| format!(" (last: {e})")).unwrap_or_default()
    )))
}

enum Attempt {
    /// The hook changed under the attempt: read it again and start over.
    Raced(String),
    Failed(Error),
}

fn link_err(iface: &str, what: String) -> impl FnOnce(String) -> Attempt + '_ {
    move |reason| {
        Attempt::Failed(Error::Link {
            what: format!("{iface}: {what}"),
            reason,
        })
    }
}

/// Builds a dispatcher running `planned`, links and pins every component, and swaps it
/// in for `old` (or installs it on an empty hook).
fn build(
    iface: &str,
    ifindex: u32,
    old: Option<&Dispatcher>,
    planned: &[Planned],
    flags: &[u32],
    ours: Option<&mut Extension>,
) -> Result<Installed, Attempt> {
    let config = config_for(planned);
    let mut loader = EbpfLoader::new();
    loader.override_global(CONFIG_SYMBOL, &config, true);
    let mut ebpf = loader
        .load(DISPATCHER_OBJECT)
        .map_err(|e| link_err(iface, "loading the dispatcher object".into())(e.to_string()))?;
    let dispatcher: &mut Xdp = ebpf
        .program_mut(PROGRAM_NAME)
        .and_then(|p| p.try_into().ok())
        .ok_or(Attempt::Failed(Error::DispatcherNotInObject(PROGRAM_NAME)))?;
    dispatcher
        .load()
        .map_err(|e| link_err(iface, "loading the dispatcher".into())(describe(&e)))?;
    let dispatcher_fd: ProgramFd = dispatcher
        .fd()
        .and_then(|fd| fd.try_clone().map_err(Into::into))
        .map_err(|e| link_err(iface, "the dispatcher's descriptor".into())(e.to_string()))?;
    let dispatcher_id = dispatcher
        .info()
        .map_err(|e| link_err(iface, "the dispatcher's id".into())(e.to_string()))?
        .id();
    let dir = dispatch_dir(ifindex, dispatcher_id);
    let result = link_components(
        iface,
        &dir,
        old.map(|d| (ifindex, d)),
        planned,
        &dispatcher_fd,
        ours,
    )
    .and_then(|components| {
        swap(iface, ifindex, old, &dispatcher_fd, flags).map(|mode| Installed {
            dispatcher_id: Some(dispatcher_id),
            mode: Some(mode),
            components,
            replaced_limiter: false,
        })
    });
    match result {
        Ok(installed) => {
            if let Some(old) = old {
                // The old dispatcher is off the hook: its pins only keep it alive.
                remove_dir(&dispatch_dir(ifindex, old.program_id));
            }
            Ok(installed)
        }
        Err(e) => {
            remove_dir(&dir);
            Err(e)
        }
    }
}

/// Links each planned component over its stub of the new dispatcher and pins program and
/// link under `dir`.
fn link_components(
    iface: &str,
    dir: &Path,
    old: Option<(u32, &Dispatcher)>,
    planned: &[Planned],
    dispatcher: &ProgramFd,
    mut ours: Option<&mut Extension>,
) -> Result<Vec<Component>, Attempt> {
    fs::DirBuilder::new()
        .mode(0o700)
        .create(dir)
        .map_err(|e| link_err(iface, format!("creating {}", dir.display()))(e.to_string()))?;
    let n = planned.len();
    let mut components = Vec::new();
    for (slot, p) in planned.iter().enumerate() {
        let target = target_function(n, slot);
        let link_pin = dir.join(format!("prog{slot}-link"));
        let prog_pin = dir.join(format!("prog{slot}-prog"));
        let mut foreign: Extension;
        let ext: &mut Extension = match p.from_slot {
            Some(from) => {
                let Some((ifindex, d)) = old else {
                    return Err(Attempt::Failed(Error::AttachPlan {
                        iface: iface.to_string(),
                        what: "the plan keeps a component of the old libxdp dispatcher, \
                               but there is no old dispatcher",
                    }));
                };
                let pin = dispatch_dir(ifindex, d.program_id).join(format!("prog{from}-prog"));
                foreign = Extension::from_pin(&pin)
                    .map_err(|e| Attempt::Raced(format!("{} went away: {e}", pin.display())))?;
                &mut foreign
            }
            None => match ours.as_deref_mut() {
                Some(e) => e,
                None => {
                    return Err(Attempt::Failed(Error::AttachPlan {
                        iface: iface.to_string(),
                        what: "the plan links the limiter's libxdp component, but it is \
                               not loaded",
                    }))
                }
            },
        };
        let what = format!("linking {} over {target} of the new dispatcher", p.name);
        let link_id = if p.from_slot.is_none() && ext.fd().is_err() {
            ext.load(
                dispatcher
                    .try_clone()
                    .map_err(|e| link_err(iface, what.clone())(e.to_string()))?,
                target,
            )
            .map_err(|e| {
                link_err(
                    iface,
                    format!("loading {} as a dispatcher component", p.name),
                )(freplace_refused(&e))
            })?;
            ext.attach()
        } else {
            ext.attach_to_program(dispatcher, target)
        }
        .map_err(|e| link_err(iface, what.clone())(freplace_refused(&e)))?;
        let link = ext
            .take_link(link_id)
            .map_err(|e| link_err(iface, what.clone())(e.to_string()))?;
        let link = FdLink::from(link);
        link.pin(&link_pin).map_err(|e| {
            link_err(iface, format!("pinning {}", link_pin.display()))(e.to_string())
        })?;
        ext.pin(&prog_pin).map_err(|e| {
            link_err(iface, format!("pinning {}", prog_pin.display()))(e.to_string())
        })?;
        let info = ext
            .info()
            .map_err(|e| link_err(iface, what.clone())(e.to_string()))?;
        components.push(Component {
            slot,
            program_id: info.id(),
            name: p.name.clone(),
            run_prio: p.run_prio,
            chain_call_actions: p.chain_call_actions,
            frags: p.frags,
            limiter: p.from_slot.is_none(),
        });
    }
    Ok(components)
}

/// A program error with its causes (aya's errors keep the errno in their source).
fn describe(e: &aya::programs::ProgramError) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(&format!(": {s}"));
        source = s.source();
    }
    text
}

/// What an EPERM from linking an freplace program means.
fn freplace_refused(e: &aya::programs::ProgramError) -> String {
    let text = describe(e);
    if text.contains("Operation not permitted") || text.contains("os error 1)") {
        format!(
            "{text}: this kernel refuses freplace (BPF_PROG_TYPE_EXT) links, so no libxdp \
             dispatcher can run here (xdp-loader falls back to a single program on such a \
             kernel too). Use the tail-call handoff instead: xdp_share_fallback = \
             \"tail-call\" (the limiter takes the hook and tail-calls what held it), or \
             next_program / join_program_array (docs/sharing.md, \"Sharing the XDP hook\")"
        )
    } else {
        text
    }
}

/// Whether this kernel refuses freplace, found by loading a dispatcher and a trivial
/// component over its first stub (neither attached anywhere): the kernel's refusal,
/// `None` when it accepts. Any failure counts as a refusal, since a component that cannot
/// load here could not join a dispatcher either.
pub fn freplace_refusal() -> Option<String> {
    let probe = || -> Result<(), String> {
        let config = config_for(&[]);
        let mut loader = EbpfLoader::new();
        loader.override_global(CONFIG_SYMBOL, &config, true);
        let mut ebpf = loader
            .load(DISPATCHER_OBJECT)
            .map_err(|e| format!("loading the dispatcher object: {e}"))?;
        let dispatcher: &mut Xdp = ebpf
            .program_mut(PROGRAM_NAME)
            .and_then(|p| p.try_into().ok())
            .ok_or("the dispatcher object has no dispatcher")?;
        dispatcher
            .load()
            .map_err(|e| format!("loading the dispatcher: {}", describe(&e)))?;
        let target = dispatcher
            .fd()
            .and_then(|fd| fd.try_clone().map_err(Into::into))
            .map_err(|e| e.to_string())?;
        let mut component = EbpfLoader::new()
            .extension(PROBE_COMPONENT)
            .load(crate::host::object::BASELINE_OBJECT)
            .map_err(|e| format!("loading the probe object: {e}"))?;
        let ext: &mut Extension = component
            .program_mut(PROBE_COMPONENT)
            .and_then(|p| p.try_into().ok())
            .ok_or("the probe object has no component")?;
        ext.load(target, STUB_NAMES[0])
            .map_err(|e| format!("loading an freplace program: {}", describe(&e)))
    };
    probe().err()
}

/// A dispatcher for `n` components, each at priority 10 and chaining on XDP_PASS,
/// loaded but attached nowhere and pinned nowhere: for measuring what the dispatcher
/// costs (BPF_PROG_TEST_RUN on its main function, with components linked over
/// [`target_function`]`(n, slot)`).
pub fn unattached_dispatcher(n: usize) -> Result<aya::Ebpf, Error> {
    let planned: Vec<Planned> = (0..n.min(MAX_COMPONENTS))
        .map(|slot| Planned {
            name: format!("component{slot}"),
            run_prio: crate::config::DEFAULT_XDP_PRIORITY,
            chain_call_actions: CHAIN_ON_PASS,
            frags: false,
            from_slot: None,
        })
        .collect();
    let config = config_for(&planned);
    let mut loader = EbpfLoader::new();
    loader.override_global(CONFIG_SYMBOL, &config, true);
    let load = |what: &str, e: String| Error::Link {
        what: format!("loading {what}"),
        reason: e,
    };
    let mut ebpf = loader
        .load(DISPATCHER_OBJECT)
        .map_err(|e| load("the dispatcher object", e.to_string()))?;
    let dispatcher: &mut Xdp = ebpf
        .program_mut(PROGRAM_NAME)
        .and_then(|p| p.try_into().ok())
        .ok_or(Error::DispatcherNotInObject(PROGRAM_NAME))?;
    dispatcher
        .load()
        .map_err(|e| load("the dispatcher", describe(&e)))?;
    Ok(ebpf)
}

/// The trivial program [`freplace_refusal`] loads as a component.
const PROBE_COMPONENT: &str = "baseline_pass";

/// Puts the new dispatcher on the hook: in place of `old` with XDP_FLAGS_REPLACE, or on
/// an empty hook with XDP_FLAGS_UPDATE_IF_NOEXIST, trying `flags` (modes) in order.
fn swap(
    iface: &str,
    ifindex: u32,
    old: Option<&Dispatcher>,
    new: &ProgramFd,
    flags: &[u32],
) -> Result<XdpAttached, Attempt> {
    let old_fd = match old {
        Some(d) => Some(dispatcher_fd(d)?),
        None => None,
    };
    let mut last = String::new();
    for &flag in flags {
        let extra = if old.is_none() {
            XDP_FLAGS_UPDATE_IF_NOEXIST
        } else {
            0
        };
        match netlink::set_xdp(
            ifindex,
            new.as_fd().as_raw_fd(),
            flag | extra,
            old_fd.as_ref().map(|fd| fd.as_fd().as_raw_fd()),
        ) {
            Ok(()) => {
                return Ok(if flag == XDP_FLAGS_DRV_MODE {
                    XdpAttached::Native
                } else {
                    XdpAttached::Generic
                })
            }
            Err(e) if matches!(e.raw_os_error(), Some(libc::EEXIST) | Some(libc::EBUSY)) => {
                return Err(Attempt::Raced(format!("attaching the dispatcher: {e}")))
            }
            Err(e) => last = e.to_string(),
        }
    }
    Err(Attempt::Failed(Error::Link {
        what: format!("{iface}: attaching the dispatcher"),
        reason: last,
    }))
}

/// A descriptor of the running dispatcher `d`, for the request that must name it; gone
/// since it was read: another writer replaced it.
fn dispatcher_fd(d: &Dispatcher) -> Result<ProgramFd, Attempt> {
    program_info(d.program_id)
        .and_then(|p| p.fd().ok())
        .ok_or_else(|| Attempt::Raced(format!("dispatcher {} went away", d.program_id)))
}

fn detach_dispatcher(iface: &str, ifindex: u32, old: &Dispatcher) -> Result<(), Attempt> {
    let old_fd = dispatcher_fd(old)?;
    match netlink::set_xdp(
        ifindex,
        -1,
        old.mode.flag(),
        Some(old_fd.as_fd().as_raw_fd()),
    ) {
        Ok(()) => {
            remove_dir(&dispatch_dir(ifindex, old.program_id));
            Ok(())
        }
        Err(e) if matches!(e.raw_os_error(), Some(libc::EEXIST) | Some(libc::EBUSY)) => {
            Err(Attempt::Raced(format!("detaching the dispatcher: {e}")))
        }
        Err(e) => Err(Attempt::Failed(Error::Link {
            what: format!("{iface}: detaching the dispatcher"),
            reason: e.to_string(),
        })),
    }
}

/// Removes a dispatcher's pin directory (best effort: what cannot go is logged; a left
/// pin keeps only an idle program alive).
fn remove_dir(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        if let Err(e) = fs::remove_file(entry.path()) {
            tracing::warn!(path = %entry.path().display(), error = %e, "could not unpin");
        }
    }
    if let Err(e) = fs::remove_dir(dir) {
        tracing::warn!(path = %dir.display(), error = %e, "could not remove");
    }
}

/// The chain a dispatcher runs: the dispatcher, then each component in order.
pub fn chain(d: &Dispatcher) -> Vec<crate::policy::hook::ChainEntry> {
    let n = d.components.len();
    let mut out = vec![crate::policy::hook::ChainEntry {
        program_id: d.program_id,
        name: PROGRAM_NAME.into(),
        limiter: false,
        how: format!(
            "libxdp dispatcher v{}, {} mode, {n} component(s)",
            d.config.dispatcher_version,
            d.mode.as_str()
        ),
    }];
    for c in &d.components {
        let next = if c.slot + 1 == n {
            "the stack".to_string()
        } else {
            format!("component {}", c.slot + 2)
        };
        out.push(crate::policy::hook::ChainEntry {
            program_id: c.program_id,
            name: c.name.clone(),
            limiter: c.limiter,
            how: format!(
                "component {} of {n} (over {}), run priority {}; on {} the frame goes to {next}",
                c.slot + 1,
                target_function(n, c.slot),
                c.run_prio,
                c.chain_on()
            ),
        });
    }
    out
}

/// Every interface of this namespace where the limiter (this pin_dir's) is a dispatcher
/// component: (name, ifindex).
pub fn joined_interfaces(pin_dir: &Path) -> Result<Vec<(String, u32)>, Error> {
    let Some(control) = tc_filter::control_map_id(pin_dir) else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for (iface, ifindex) in tc_filter::interfaces().map_err(|e| Error::Io {
        what: "listing interfaces".into(),
        source: e,
    })? {
        if let Ok(Hook::Dispatcher(d)) = inspect(&iface, ifindex, Some(control)) {
            if d.components.iter().any(|c| c.limiter) {
                out.push((iface, ifindex));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use super::*;

    fn component(slot: usize, name: &str, prio: u32, limiter: bool) -> Component {
        Component {
            slot,
            program_id: 100 + slot as u32,
            name: name.into(),
            run_prio: prio,
            chain_call_actions: CHAIN_ON_PASS,
            frags: false,
            limiter,
        }
    }

    #[test]
    fn the_limiter_joins_by_priority_and_replaces_its_earlier_component() {
        let existing = [
            component(0, "xdpfilt_dny_udp", 10, false),
            component(1, "limiter_libxdp", 20, true),
            component(2, "xdp_lb", 50, false),
        ];
        let p = plan(&existing, Some(5)).unwrap();
        let names: Vec<_> = p.iter().map(|p| (p.name.as_str(), p.from_slot)).collect();
        assert_eq!(
            names,
            [
                ("limiter_libxdp", None),
                ("xdpfilt_dny_udp", Some(0)),
                ("xdp_lb", Some(2))
            ]
        );
        // Leaving: the others keep their order.
        let p = plan(&existing, None).unwrap();
        assert_eq!(
            p.iter().map(|p| p.from_slot).collect::<Vec<_>>(),
            [Some(0), Some(2)]
        );
    }

    #[test]
    fn ties_go_by_name_then_existing_first() {
        let existing = [
            component(0, "limiter_libxdp", 10, false),
            component(1, "aaa", 10, false),
        ];
        let p = plan(&existing, Some(10)).unwrap();
        assert_eq!(
            p.iter()
                .map(|p| (p.name.as_str(), p.from_slot))
                .collect::<Vec<_>>(),
            [
                ("aaa", Some(1)),
                ("limiter_libxdp", Some(0)),
                ("limiter_libxdp", None)
            ]
        );
    }

    #[test]
    fn more_than_ten_components_is_refused() {
        let existing: Vec<_> = (0..10).map(|i| component(i, "x", 50, false)).collect();
        assert!(plan(&existing, None).is_ok());
        let err = plan(&existing, Some(1)).unwrap_err();
        assert!(err.contains("11 slots"), "{err}");
    }

    #[test]
    fn the_configuration_chains_on_the_stub_value_and_keeps_flags() {
        let mut existing = vec![component(0, "f", 30, false)];
        existing[0].frags = true;
        existing[0].chain_call_actions = CHAIN_ON_PASS | 1 << 1;
        let p = plan(&existing, Some(10)).unwrap();
        let c = config_for(&p);
        assert_eq!(
            (c.magic, c.dispatcher_version, c.num_progs_enabled),
            (MAGIC, VERSION, 2)
        );
        assert_eq!(c.chain_call_actions[0], CHAIN_ON_PASS | 1 << STUB_RETVAL);
        assert_eq!(
            c.chain_call_actions[1],
            CHAIN_ON_PASS | 1 << 1 | 1 << STUB_RETVAL
        );
        assert_eq!(&c.run_prios[..2], &[10, 30]);
        assert_eq!(&c.program_flags[..2], &[0, PROGRAM_FLAG_FRAGS]);
        assert_eq!(c.is_xdp_frags, 0);
        assert_eq!(target_function(1, 0), PROGRAM_NAME);
        assert_eq!(target_function(2, 1), "prog1");
    }
}
