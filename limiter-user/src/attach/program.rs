//! Loading the program (its XDP builds and its TC build) with its maps (pinned or
//! private) and attaching it.

use std::{
    ffi::CString,
    fs,
    os::unix::fs::{DirBuilderExt, PermissionsExt},
    path::{Path, PathBuf},
};

use aya::{
    maps::MapInfo,
    programs::{
        links::{FdLink, PinnedLink},
        tc::{NlOptions, SchedClassifierLink, SchedClassifierLinkId, TcAttachOptions, TcHandle},
        xdp::{XdpLink, XdpLinkId},
        Extension, SchedClassifier, TcAttachType, Xdp, XdpMode,
    },
    Ebpf, EbpfLoader,
};
use limiter_common::{
    abi::{map_name, PROGRAM_NAME_LIBXDP, PROGRAM_NAME_TC},
    maps::{map_spec, MAPS},
};

use crate::{
    attach::{libxdp, netlink::ifindex_of, tc_filter},
    bpf::{maps::Maps, pins::link_pin_path},
    config::XdpMode as ConfigXdpMode,
    error::Error,
    host::{
        kernel,
        object::{AlignedObject, Variant, OBJECT},
    },
    policy::hook::ChainEntry,
};

const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// How to load the program.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Pin (or adopt) every map under this directory; `None` keeps them private to this
    /// process (tests, benchmarks).
    pub pin_dir: Option<PathBuf>,
    /// Capacity of the per-source bucket map.
    pub max_sources: u32,
    /// The LB's pinned prog array that the single-buffer build tail-calls through in
    /// place of its own `HANDOFF_LINEAR` (`next_program = "PIN:INDEX"`,
    /// `join_program_array`). Checked to be a prog array before load
    /// ([`crate::attach::handoff::check_lb_array`]): the loader never creates a map there.
    pub handoff_array: Option<PathBuf>,
}

/// The loaded program and its maps.
pub struct Program {
    ebpf: Ebpf,
    /// What [`Program::attach_shared`] loads the libxdp component from: the object and
    /// the load options (the component is the linear build loaded as an freplace
    /// program, from a second copy of the object on the same pinned maps).
    object: AlignedObject,
    opts: LoadOptions,
    /// The component, once loaded (one program, linked into every interface's
    /// dispatcher).
    component: Option<Ebpf>,
    /// The build generic mode runs (multi-buffer unless a handoff needs the other).
    generic_build: Variant,
}

/// The mode an interface was attached in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttachedMode {
    Native,
    Generic,
    /// TC ingress (a tcx link; before Linux 6.6 a cls_bpf filter), not XDP.
    Tc,
}

impl AttachedMode {
    pub fn as_str(self) -> &'static str {
        match self {
            AttachedMode::Native => "native",
            AttachedMode::Generic => "generic",
            AttachedMode::Tc => "tc",
        }
    }
}

/// How an interface came to run this program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkOrigin {
    /// A new bpf_link, pinned.
    Created,
    /// A link pinned by an earlier daemon, switched to this program atomically.
    Adopted,
}

/// One interface running the program: through a pinned bpf_link (it lives as long as
/// its pin), a cls_bpf filter or a netlink attachment in place of a taken program (they
/// live on the interface), or a component of the interface's libxdp dispatcher (pinned
/// under libxdp's directory); none lives only as long as this process, so enforcement
/// survives the daemon. Tests alone make process-local ones ([`Program::attach`]).
pub struct Attachment {
    pub iface: String,
    /// The mode requested for a new link (an adopted link keeps the mode it was made in).
    pub mode: AttachedMode,
    /// The build of the program the link runs.
    pub variant: Variant,
    pub origin: LinkOrigin,
    /// Where the link is pinned; `None` for a process-local attachment.
    pub pin: Option<PathBuf>,
    link: AttachedLink,
}

enum AttachedLink {
    /// Pinned: this fd is just a handle, the pin keeps the link.
    Pinned(FdLink),
    /// Process-local: owned by the program, detached with it.
    Local(XdpLinkId),
    LocalTc(SchedClassifierLinkId),
    /// A cls_bpf filter at [`tc_filter::PRIORITY`]/[`tc_filter::HANDLE`] of this
    /// interface (kernels without tcx): it lives on the interface, not in a pin.
    Filter {
        ifindex: u32,
    },
    /// The same for the life of this program object only (tests).
    LocalFilter {
        ifindex: u32,
        id: SchedClassifierLinkId,
    },
    /// A component of the libxdp dispatcher of this interface (`xdp_share = "libxdp"`):
    /// pinned under libxdp's state directory, found again through the CONTROL map.
    Component {
        ifindex: u32,
        control_id: u32,
    },
    /// Attached through netlink in place of the program that held the hook, or alone
    /// (`xdp_share_fallback = "tail-call"`): it lives on the interface, and `taken` is
    /// the pin of the program it took the hook from.
    Netlink {
        ifindex: u32,
        control_id: u32,
        pin_dir: PathBuf,
        taken: Option<PathBuf>,
    },
}

/// A link just made, not yet pinned or handed back to its program.
enum NewLink {
    Xdp(XdpLink),
    Tc(SchedClassifierLink),
}

impl NewLink {
    fn into_fd_link(self) -> Result<FdLink, String> {
        match self {
            NewLink::Xdp(l) => FdLink::try_from(l).map_err(|e| e.to_string()),
            NewLink::Tc(l) => FdLink::try_from(l).map_err(|e| e.to_string()),
        }
    }
}

impl Attachment {
    /// Id of the program a pinned link (or the limiter's filter) runs now.
    pub fn program_id(&self) -> Result<u32, Error> {
        if let AttachedLink::Filter { ifindex } | AttachedLink::LocalFilter { ifindex, .. } =
            &self.link
        {
            return tc_filter::ingress_filters(*ifindex)
                .ok()
                .and_then(|fs| {
                    fs.into_iter().find(|f| {
                        f.priority == tc_filter::PRIORITY && f.handle == tc_filter::HANDLE
                    })
                })
                .and_then(|f| f.program_id)
                .ok_or_else(|| Error::Link {
                    what: format!("reading the filter of {}", self.iface),
                    reason: "no limiter filter at its slot".into(),
                });
        }
        if let AttachedLink::Component {
            ifindex,
            control_id,
        } = &self.link
        {
            return match libxdp::inspect(&self.iface, *ifindex, Some(*control_id))? {
                libxdp::Hook::Dispatcher(d) => d
                    .components
                    .iter()
                    .find(|c| c.limiter)
                    .map(|c| c.program_id)
                    .ok_or_else(|| Error::Link {
                        what: format!("reading the dispatcher of {}", self.iface),
                        reason: "the limiter is no longer one of its components".into(),
                    }),
                _ => Err(Error::Link {
                    what: format!("reading the XDP hook of {}", self.iface),
                    reason: "no libxdp dispatcher runs there any more".into(),
                }),
            };
        }
        if let AttachedLink::Netlink {
            ifindex,
            control_id,
            ..
        } = &self.link
        {
            return match crate::attach::takeover::inspect(&self.iface, *ifindex, Some(*control_id))?
            {
                crate::attach::takeover::Found::Ours { program_id, .. } => Ok(program_id),
                _ => Err(Error::Link {
                    what: format!("reading the XDP hook of {}", self.iface),
                    reason: "the limiter's program is no longer there".into(),
                }),
            };
        }
        let AttachedLink::Pinned(link) = &self.link else {
            return Err(Error::Link {
                what: format!("reading the link of {}", self.iface),
                reason: "not a pinned link".into(),
            });
        };
        link.info()
            .map(|i| i.program_id())
            .map_err(|e| Error::Link {
                what: format!("reading the link of {}", self.iface),
                reason: e.to_string(),
            })
    }
}

impl Attachment {
    /// What holds the program on the interface, for `status`.
    pub fn hook(&self) -> String {
        match (&self.link, self.mode) {
            (AttachedLink::Filter { .. } | AttachedLink::LocalFilter { .. }, _) => format!(
                "cls_bpf filter at clsact ingress, priority {}, handle {:#x}",
                tc_filter::PRIORITY,
                tc_filter::HANDLE
            ),
            (AttachedLink::Component { .. }, _) => "libxdp dispatcher component".into(),
            (AttachedLink::Netlink { taken: Some(_), .. }, _) => {
                "netlink, in place of the program it took the hook from".into()
            }
            (AttachedLink::Netlink { taken: None, .. }, _) => "netlink".into(),
            (_, AttachedMode::Tc) => "tcx link".into(),
            _ => "bpf_link".into(),
        }
    }
}

impl Attachment {
    /// What runs at the hook of this interface, in order (empty if it cannot be read).
    pub fn chain(&self) -> Vec<ChainEntry> {
        match &self.link {
            AttachedLink::Component {
                ifindex,
                control_id,
            } => match libxdp::inspect(&self.iface, *ifindex, Some(*control_id)) {
                Ok(libxdp::Hook::Dispatcher(d)) => libxdp::chain(&d),
                _ => Vec::new(),
            },
            AttachedLink::Netlink { taken, .. } => {
                let Ok(id) = self.program_id() else {
                    return Vec::new();
                };
                let taken = taken
                    .as_ref()
                    .and_then(|pin| Some((pin, aya::programs::ProgramInfo::from_pin(pin).ok()?)));
                let mut chain = vec![ChainEntry {
                    program_id: id,
                    name: self.variant.program_name().into(),
                    limiter: true,
                    how: match &taken {
                        Some((_, info)) => format!(
                            "on the hook through netlink ({} mode) in place of program {} \
                             (xdp_share_fallback: this kernel refuses freplace); every frame \
                             it passes goes to that program by tail call",
                            self.mode.as_str(),
                            info.id()
                        ),
                        None => format!(
                            "alone on the hook through netlink ({} mode; xdp_share_fallback: \
                             this kernel refuses freplace); what it passes goes to the stack",
                            self.mode.as_str()
                        ),
                    },
                }];
                if let Some((pin, info)) = taken {
                    chain.push(ChainEntry {
                        program_id: info.id(),
                        name: info.name_as_str().unwrap_or("?").to_string(),
                        limiter: false,
                        how: format!(
                            "called by the limiter (tail call; pinned at {}); its verdict is \
                             the frame's",
                            pin.display()
                        ),
                    });
                }
                chain
            }
            _ => self
                .program_id()
                .map(|id| {
                    vec![ChainEntry {
                        program_id: id,
                        name: self.variant.program_name().into(),
                        limiter: true,
                        how: format!(
                            "alone at the hook ({}); what it passes goes to the stack",
                            self.hook()
                        ),
                    }]
                })
                .unwrap_or_default(),
        }
    }
}

/// Refuses pinned maps whose layout differs from this build's (the table of maps):
/// reusing them blindly would let the program read one struct as another.
pub fn check_pinned_layout(pin_dir: &Path, max_sources: u32) -> Result<(), Error> {
    for map in &MAPS {
        let (name, key_size, value_size) = (map.name, map.key_size, map.value_size);
        let max_entries = map.max_entries(max_sources);
        let path = pin_dir.join(name);
        if fs::symlink_metadata(&path).is_err() {
            continue;
        }
        // Someone else's object under one of our names is neither adopted nor replaced.
        crate::bpf::pins::check_ours(&path, crate::bpf::pins::PinName::Map(name)).map_err(
            |why| Error::PinInTheWay {
                path: path.clone(),
                why,
            },
        )?;
        let info = MapInfo::from_pin(&path).map_err(|e| Error::Map {
            what: format!("reading pinned map {}", path.display()),
            source: e,
        })?;
        let found = (info.key_size(), info.value_size(), info.max_entries());
        if found != (key_size, value_size, max_entries) {
            return Err(Error::PinnedLayout {
                path,
                expected: (key_size, value_size, max_entries),
                found,
            });
        }
    }
    Ok(())
}

/// Makes sure `pin_dir` exists on a bpf filesystem, mounting bpffs at /sys/fs/bpf when
/// it is missing and the directory lives there. A directory it creates is mode 0700; an
/// existing one (`/sys/fs/bpf` itself, say) keeps its mode: each pin is 0600 anyway.
pub fn prepare_pin_dir(pin_dir: &Path) -> Result<(), Error> {
    let bpffs_root = Path::new("/sys/fs/bpf");
    if pin_dir.starts_with(bpffs_root) && !is_bpffs(bpffs_root) {
        mount_bpffs(bpffs_root)?;
    }
    match fs::metadata(pin_dir) {
        Ok(m) if m.is_dir() => {}
        Ok(m) => {
            return Err(Error::PinInTheWay {
                path: pin_dir.to_path_buf(),
                why: format!(
                    "{}, not a directory",
                    limiter_instance::kind_of(m.file_type())
                ),
            })
        }
        Err(_) => {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(pin_dir)
                .map_err(|e| Error::Io {
                    what: format!("creating pin directory {}", pin_dir.display()),
                    source: e,
                })?;
            fs::set_permissions(pin_dir, fs::Permissions::from_mode(0o700)).map_err(|e| {
                Error::Io {
                    what: format!("setting mode 0700 on {}", pin_dir.display()),
                    source: e,
                }
            })?;
        }
    }
    if !is_bpffs(pin_dir) {
        return Err(Error::NotBpffs(pin_dir.to_path_buf()));
    }
    Ok(())
}

fn is_bpffs(path: &Path) -> bool {
    let Ok(c) = CString::new(path.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid NUL-terminated path and a zeroed out-struct of the right type.
    let rc = unsafe { libc::statfs(c.as_ptr(), &mut st) };
    rc == 0 && st.f_type as i64 == BPF_FS_MAGIC
}

fn mount_bpffs(at: &Path) -> Result<(), Error> {
    let target = CString::new(at.as_os_str().as_encoded_bytes())
        .map_err(|_| Error::NotBpffs(at.to_path_buf()))?;
    let fstype = c"bpf";
    // SAFETY: all pointers are valid NUL-terminated strings; no data argument.
    let rc = unsafe {
        libc::mount(
            fstype.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        let source = std::io::Error::last_os_error();
        let what = format!("mounting bpffs at {}", at.display());
        if source.raw_os_error() == Some(libc::EPERM) {
            return Err(Error::Permission(
                crate::host::privilege::PermissionError::Refused {
                    doing: format!(
                        "{what} (mount it beforehand, as systemd does at boot, or grant it)"
                    ),
                    cap: crate::host::privilege::Capability::SysAdmin,
                },
            ));
        }
        return Err(Error::Io { what, source });
    }
    tracing::info!(path = %at.display(), "mounted bpffs");
    Ok(())
}

impl Program {
    /// Loads the program into the kernel (verifier included) and creates or adopts its
    /// maps. Nothing is attached yet.
    pub fn load(opts: &LoadOptions) -> Result<Program, Error> {
        Program::load_object(opts, OBJECT)
    }

    /// [`Program::load`] with another object than the one built in (`limiter run
    /// --bpf-object`: tests of a refused build, and trying a rebuilt program before an
    /// upgrade). Its maps must have this build's layout.
    ///
    /// Nothing here changes what runs: pinned maps are opened (never recreated or
    /// written) and missing ones created, and every build is verified before the caller
    /// writes a rule or touches a link. A build the verifier refuses is an
    /// [`Error::Refused`] carrying the log's end and the kernel version.
    pub fn load_object(opts: &LoadOptions, object: &[u8]) -> Result<Program, Error> {
        Program::load_object_builds(opts, object, &Variant::ALL)
    }

    /// [`Program::load`] verifying only `builds` (of [`Variant::ALL`]): the daemon's
    /// start, which verifies the builds its hooks run ([`builds_for`]), and
    /// BPF_PROG_TEST_RUN tables that run one build on maps of their own. Each build left
    /// out saves its verifier time (seconds under emulation). One left out is loaded
    /// (verified) when first attached or put in a prog array.
    pub fn load_builds(opts: &LoadOptions, builds: &[Variant]) -> Result<Program, Error> {
        Program::load_object_builds(opts, OBJECT, builds)
    }

    /// [`Program::load_object`] verifying only `builds`, as [`Program::load_builds`].
    pub fn load_object_builds(
        opts: &LoadOptions,
        object: &[u8],
        builds: &[Variant],
    ) -> Result<Program, Error> {
        if object.is_empty() {
            return Err(Error::NoObject);
        }
        let mut loader = EbpfLoader::new();
        let sketch = map_spec(map_name::SRC_SKETCH);
        loader.map_max_entries(sketch.name, sketch.max_entries(opts.max_sources));
        if let Some(dir) = &opts.pin_dir {
            prepare_pin_dir(dir)?;
            check_pinned_layout(dir, opts.max_sources)?;
            for map in &MAPS {
                loader.map_pin_path(map.name, dir.join(map.name));
            }
        }
        let lb_array = match &opts.handoff_array {
            Some(array) => {
                // Last one wins: the LB's array replaces the daemon's own.
                let checked = crate::attach::handoff::check_lb_array("next_program", array)?;
                loader.map_pin_path(map_name::HANDOFF_LINEAR, array.as_path());
                Some((array, checked))
            }
            None => None,
        };
        let mut ebpf = loader.load(object).map_err(|e| Error::Load(Box::new(e)))?;
        if let Some((path, checked)) = lb_array {
            // The loader creates and pins a map where none is: had the LB's pin gone
            // between the check and the load, that would be ours at the LB's path.
            let opened = ebpf.map(map_name::HANDOFF_LINEAR).and_then(|m| match m {
                aya::maps::Map::ProgramArray(d) => d.info().ok().map(|i| i.id()),
                _ => None,
            });
            if opened != Some(checked.id) {
                if MapInfo::from_pin(path).is_ok_and(|i| Some(i.id()) == opened) {
                    let _ = fs::remove_file(path);
                }
                return Err(Error::Handoff {
                    key: "next_program",
                    reason: format!(
                        "the prog array at {} changed while the program loaded (the LB \
                         restarting?): start again",
                        path.display()
                    ),
                });
            }
        }
        for variant in Variant::XDP {
            if !builds.contains(&variant) {
                continue;
            }
            // Before 5.18 the kernel refuses the frags flag: only the linear build runs
            // (kernel::check refuses the modes that need the other).
            if variant == Variant::MultiBuffer && !crate::host::kernel::has_frags() {
                tracing::warn!(
                    "this kernel has no XDP multi-buffer (Linux 5.18): the multi-buffer \
                     build is not loaded"
                );
                continue;
            }
            xdp_mut(&mut ebpf, variant)?;
        }
        if builds.contains(&Variant::Tc) {
            tc_mut(&mut ebpf)?;
        }
        Ok(Program {
            ebpf,
            object: AlignedObject::from_bytes(object),
            opts: opts.clone(),
            component: None,
            generic_build: Variant::MultiBuffer,
        })
    }

    /// Reads an object file for [`Program::load_object`] into memory aligned for the
    /// ELF parser (it reads headers in place, as `include_bytes_aligned!` allows).
    pub fn read_object(path: &Path) -> Result<AlignedObject, Error> {
        let bytes = fs::read(path).map_err(|e| Error::Io {
            what: format!("reading the BPF object {}", path.display()),
            source: e,
        })?;
        Ok(AlignedObject::from_bytes(&bytes))
    }

    /// The multi-buffer build (it runs on any frame), e.g. for BPF_PROG_TEST_RUN.
    pub fn xdp(&self) -> Result<&Xdp, Error> {
        self.xdp_variant(Variant::MultiBuffer)
    }

    /// Loads (verifies) a build [`Program::load`] leaves out as a plain XDP program: the
    /// libxdp component's build, so that the verdict tables run its code too (the daemon
    /// loads it only as an freplace component, see [`Program::attach_shared`]).
    pub fn load_as_xdp(&mut self, variant: Variant) -> Result<(), Error> {
        xdp_mut(&mut self.ebpf, variant).map(|_| ())
    }

    /// One build of the program.
    pub fn xdp_variant(&self, variant: Variant) -> Result<&Xdp, Error> {
        self.ebpf
            .program(variant.program_name())
            .and_then(|p| <&Xdp>::try_from(p).ok())
            .ok_or(Error::ProgramNotInObject(variant))
    }

    /// The TC build.
    pub fn tc(&self) -> Result<&SchedClassifier, Error> {
        self.ebpf
            .program(PROGRAM_NAME_TC)
            .and_then(|p| <&SchedClassifier>::try_from(p).ok())
            .ok_or(Error::ProgramNotInObject(Variant::Tc))
    }

    /// Pins every build loaded for the hooks as `prog_<id>` under `pin_dir`, so that a
    /// restarted daemon recognises them on its links and filters without CAP_SYS_ADMIN
    /// ([`crate::bpf::pins`]); returns their ids, which [`crate::bpf::pins::prune_programs`] keeps.
    pub fn pin_programs(&self, pin_dir: &Path) -> Result<Vec<u32>, Error> {
        use std::os::fd::AsFd as _;
        let mut ids = Vec::new();
        for variant in Variant::ALL {
            let (info, fd) = match variant {
                Variant::Tc => (self.tc()?.info(), self.tc()?.fd()),
                v => match self.xdp_variant(v) {
                    Ok(xdp) => (xdp.info(), xdp.fd()),
                    Err(_) => continue,
                },
            };
            // A build this kernel did not load (multi-buffer before 5.18) has no fd.
            let (Ok(info), Ok(fd)) = (info, fd) else {
                continue;
            };
            crate::bpf::pins::pin_program(pin_dir, info.id(), fd.as_fd())?;
            ids.push(info.id());
        }
        Ok(ids)
    }

    /// Kernel information on one build (run counts and time, verifier figures).
    pub fn info(&self, variant: Variant) -> Result<aya::programs::ProgramInfo, Error> {
        let info = match variant {
            Variant::Tc => self.tc()?.info(),
            Variant::Libxdp => self
                .component
                .as_ref()
                .ok_or(Error::ComponentNotLoaded)?
                .program(PROGRAM_NAME_LIBXDP)
                .and_then(|p| <&Extension>::try_from(p).ok())
                .ok_or(Error::ProgramNotInObject(Variant::Libxdp))?
                .info(),
            v => self.xdp_variant(v)?.info(),
        };
        info.map_err(|e| Error::Program {
            what: format!("reading the info of {}", variant.program_name()),
            source: Box::new(e),
        })
    }

    /// Instructions the verifier processed for the largest build, if the kernel reports it.
    pub fn verified_instructions(&self) -> Option<u32> {
        Variant::ALL
            .iter()
            .filter_map(|&v| self.info(v).ok()?.verified_instruction_count())
            .max()
    }

    /// Takes the handoff's prog arrays out of the object: `[HANDOFF_LINEAR,
    /// HANDOFF_MULTI]`, `None` for one that is the LB's array (`handoff_array`).
    pub fn take_handoff_arrays(&mut self, lb_array: bool) -> [Option<aya::maps::MapData>; 2] {
        let mut take = |name| match self.ebpf.take_map(name) {
            Some(aya::maps::Map::ProgramArray(data)) => Some(data),
            _ => None,
        };
        let linear = take(map_name::HANDOFF_LINEAR);
        let multi = take(map_name::HANDOFF_MULTI);
        [if lb_array { None } else { linear }, multi]
    }

    /// Runs `variant` in generic mode instead of the multi-buffer build: a handoff to
    /// plain XDP programs (Katran's) needs the single-buffer build, whose prog array the
    /// kernel lets tail-call them; generic mode then linearizes multi-buffer socket
    /// buffers for it, as it would for the LB alone.
    pub fn set_generic_build(&mut self, variant: Variant) {
        if matches!(variant, Variant::Linear | Variant::MultiBuffer) {
            self.generic_build = variant;
        }
    }

    /// The descriptor of one XDP build (for a prog array slot, or a hook taken over
    /// through netlink). A build not loaded yet is loaded (verified) and, where the maps
    /// are pinned, pinned as `prog_<id>` before it runs anywhere, as
    /// [`Program::pin_programs`] pins the others.
    pub fn program_fd(&mut self, variant: Variant) -> Result<&aya::programs::ProgramFd, Error> {
        use std::os::fd::AsFd as _;
        let loaded = is_loaded(&self.ebpf, variant);
        let prog = xdp_mut(&mut self.ebpf, variant)?;
        if let (false, Some(dir)) = (loaded, &self.opts.pin_dir) {
            if let (Ok(info), Ok(fd)) = (prog.info(), prog.fd()) {
                crate::bpf::pins::pin_program(dir, info.id(), fd.as_fd())?;
            }
        }
        prog.fd().map_err(|e| Error::Program {
            what: format!("reading the descriptor of {}", variant.program_name()),
            source: Box::new(e),
        })
    }

    /// Takes the maps out of the object for reading and writing. With pins, an earlier
    /// version's per-source LRU is looked for, for the first install to carry into the
    /// sketch (`Maps::find_earlier_lru`; a failure is logged: less accurate, never less
    /// available).
    pub fn maps(&mut self) -> Result<Maps, Error> {
        let mut maps = Maps::from_ebpf(&mut self.ebpf)?;
        if let Some(dir) = &self.opts.pin_dir {
            if let Err(e) = maps.find_earlier_lru(dir) {
                tracing::warn!(
                    "per-source state of the earlier version not carried over (every source \
                     starts with its burst): {e}"
                );
            }
        }
        Ok(maps)
    }

    /// Runs the program on `iface` through a bpf_link pinned under `pin_dir`.
    ///
    /// If an earlier daemon pinned a link for `iface`, the link is switched to this
    /// program with one atomic bpf_link_update: no frame goes unmetered, none is lost,
    /// and no second program or link is left behind. Otherwise a new link is created
    /// (`Auto`: native mode, else generic) and pinned.
    pub fn attach_pinned(
        &mut self,
        iface: &str,
        mode: ConfigXdpMode,
        pin_dir: &Path,
    ) -> Result<Attachment, Error> {
        if mode == ConfigXdpMode::Tc && !kernel::has_tcx() {
            return self.attach_filter(iface, pin_dir);
        }
        let attachment = self.attach_link(iface, mode, pin_dir)?;
        // A filter of ours left from a run in TC mode on a kernel without tcx would
        // meter every frame a second time, unseen: it goes once the link runs.
        remove_filters(iface, pin_dir, |_| true)?;
        Ok(attachment)
    }

    fn attach_link(
        &mut self,
        iface: &str,
        mode: ConfigXdpMode,
        pin_dir: &Path,
    ) -> Result<Attachment, Error> {
        let pin = link_pin_path(pin_dir, iface);
        if fs::symlink_metadata(&pin).is_ok() {
            // Only a link of ours is switched over, or replaced when that fails.
            crate::bpf::pins::check_ours(&pin, crate::bpf::pins::PinName::Link(iface)).map_err(
                |why| Error::PinInTheWay {
                    path: pin.clone(),
                    why,
                },
            )?;
            match self.adopt(iface, &pin, mode) {
                Ok(attachment) => return Ok(attachment),
                // A link whose interface went away, or of the other hook (XDP vs TC):
                // ours, and of no use as it is.
                Err(e) => {
                    tracing::warn!(%iface, error = %e, "pinned link unusable; replacing it");
                    fs::remove_file(&pin).map_err(|e| Error::Io {
                        what: format!("removing the unusable link {}", pin.display()),
                        source: e,
                    })?;
                }
            }
        }
        if mode != ConfigXdpMode::Tc {
            refuse_taken_hook(iface)?;
        }
        let (link, mode, variant) = self.attach_new(iface, mode)?;
        let link = link.into_fd_link().map_err(|reason| Error::Link {
            what: format!("taking the link of {iface}"),
            reason,
        })?;
        let pinned = link.pin(&pin).map_err(|e| Error::Link {
            what: format!("pinning the link of {iface} at {}", pin.display()),
            reason: e.to_string(),
        })?;
        Ok(Attachment {
            iface: iface.to_string(),
            mode,
            variant,
            origin: LinkOrigin::Created,
            pin: Some(pin),
            link: AttachedLink::Pinned(pinned.into()),
        })
    }

    /// The TC build as a cls_bpf filter in the limiter's slot of `iface`'s clsact ingress
    /// (kernels without tcx). A filter of ours already there (an earlier daemon's) gets
    /// this program in place; an empty slot gets a new filter (and the interface a
    /// clsact qdisc if it has none); a slot held by someone else's filter is refused.
    fn attach_filter(&mut self, iface: &str, pin_dir: &Path) -> Result<Attachment, Error> {
        let ifindex = ifindex_of(iface)?;
        let ours = |f: &tc_filter::Filter| {
            f.program_id
                .is_some_and(|id| tc_filter::program_is_ours(pin_dir, id))
        };
        // No clsact qdisc yet: no filters.
        let filters = tc_filter::ingress_filters(ifindex).unwrap_or_default();
        let at_slot = filters
            .iter()
            .find(|f| f.priority == tc_filter::PRIORITY && f.handle == tc_filter::HANDLE);
        let prog = tc_mut(&mut self.ebpf)?;
        let attach_err = |what: String| {
            move |e: aya::programs::ProgramError| Error::Program {
                what,
                source: Box::new(e),
            }
        };
        let (id, origin) = match at_slot {
            Some(f) if ours(f) => {
                let link = SchedClassifierLink::attached(
                    iface,
                    TcAttachType::Ingress,
                    tc_filter::PRIORITY,
                    TcHandle::from(tc_filter::HANDLE),
                    None,
                )
                .map_err(|e| Error::Io {
                    what: format!("finding {iface}"),
                    source: e,
                })?;
                let id = prog.attach_to_link(link).map_err(attach_err(format!(
                    "replacing the program of {iface}'s {}",
                    f.describe()
                )))?;
                (id, LinkOrigin::Adopted)
            }
            Some(f) => {
                return Err(Error::Link {
                    what: format!("attaching {PROGRAM_NAME_TC} to {iface}"),
                    reason: format!(
                        "the {} belongs to someone else (program {}, name {:?}); the \
                         limiter replaces only its own filter there",
                        f.describe(),
                        f.program_id.map_or("?".to_string(), |id| id.to_string()),
                        f.name.as_deref().unwrap_or("?")
                    ),
                })
            }
            None => (add_filter(prog, iface)?, LinkOrigin::Created),
        };
        let link = prog.take_link(id).map_err(|e| Error::Program {
            what: format!("taking the filter of {iface}"),
            source: Box::new(e),
        })?;
        // Dropping aya's handle would delete the filter: it must outlive this process,
        // as a pinned link does. It holds no descriptor, so forgetting it leaks nothing.
        std::mem::forget(link);
        // Filters of ours in other slots (an older build's, a failed attempt's) go now
        // that ours runs; so does a pinned XDP link of ours on this interface, which
        // would meter every frame twice.
        remove_filters(iface, pin_dir, |f| {
            f.priority != tc_filter::PRIORITY || f.handle != tc_filter::HANDLE
        })?;
        let pin = link_pin_path(pin_dir, iface);
        if fs::symlink_metadata(&pin).is_ok()
            && crate::bpf::pins::check_ours(&pin, crate::bpf::pins::PinName::Link(iface)).is_ok()
        {
            fs::remove_file(&pin).map_err(|e| Error::Io {
                what: format!(
                    "removing the link pin {} (the filter replaces it)",
                    pin.display()
                ),
                source: e,
            })?;
            tracing::warn!(%iface, pin = %pin.display(), "removed the link pinned by an earlier daemon in another mode: the filter replaces it");
        }
        Ok(Attachment {
            iface: iface.to_string(),
            mode: AttachedMode::Tc,
            variant: Variant::Tc,
            origin,
            pin: None,
            link: AttachedLink::Filter { ifindex },
        })
    }

    /// Switches the pinned link to this program: the linear build first (except in
    /// generic mode), the multi-buffer one when the kernel refuses it (an MTU that needs
    /// several buffers per frame).
    fn adopt(&mut self, iface: &str, pin: &Path, mode: ConfigXdpMode) -> Result<Attachment, Error> {
        let generic = [self.generic_build];
        let candidates: &[Variant] = match mode {
            ConfigXdpMode::Generic => &generic,
            ConfigXdpMode::Tc => &[Variant::Tc],
            _ => &Variant::XDP,
        };
        let mut refused = Vec::new();
        for &variant in candidates {
            match self.adopt_as(pin, variant) {
                Ok(link) => {
                    return Ok(Attachment {
                        iface: iface.to_string(),
                        mode: match mode {
                            ConfigXdpMode::Generic => AttachedMode::Generic,
                            ConfigXdpMode::Tc => AttachedMode::Tc,
                            _ => AttachedMode::Native,
                        },
                        variant,
                        origin: LinkOrigin::Adopted,
                        pin: Some(pin.to_path_buf()),
                        link: AttachedLink::Pinned(link),
                    });
                }
                Err(e) => refused.push(format!("{}: {e}", variant.as_str())),
            }
        }
        Err(Error::Link {
            what: format!("switching the program of {}", pin.display()),
            reason: refused.join("; "),
        })
    }

    fn adopt_as(&mut self, pin: &Path, variant: Variant) -> Result<FdLink, Error> {
        let link_err = |what: &str, e: String| Error::Link {
            what: format!("{what} {}", pin.display()),
            reason: e,
        };
        let pinned = PinnedLink::from_pin(pin).map_err(|e| link_err("opening", e.to_string()))?;
        let fd_link: FdLink = pinned.into();
        if variant == Variant::Tc {
            let tc_link = SchedClassifierLink::try_from(fd_link)
                .map_err(|e| link_err("reading", e.to_string()))?;
            let prog = tc_mut(&mut self.ebpf)?;
            let id = prog
                .attach_to_link(tc_link)
                .map_err(|e| link_err("switching the program of", e.to_string()))?;
            let link = prog
                .take_link(id)
                .map_err(|e| link_err("taking", e.to_string()))?;
            return FdLink::try_from(link).map_err(|e| link_err("taking", e.to_string()));
        }
        let xdp_link =
            XdpLink::try_from(fd_link).map_err(|e| link_err("reading", e.to_string()))?;
        let prog = xdp_mut(&mut self.ebpf, variant)?;
        let id = prog
            .attach_to_link(xdp_link)
            .map_err(|e| link_err("switching the program of", e.to_string()))?;
        let link = prog
            .take_link(id)
            .map_err(|e| link_err("taking", e.to_string()))?;
        FdLink::try_from(link).map_err(|e| link_err("taking", e.to_string()))
    }

    /// A new link: native mode with the linear build, else native with the multi-buffer
    /// build, else (`Auto`) generic mode with the multi-buffer build; `Tc`: the TC build
    /// at TC ingress.
    fn attach_new(
        &mut self,
        iface: &str,
        mode: ConfigXdpMode,
    ) -> Result<(NewLink, AttachedMode, Variant), Error> {
        let native = |ebpf: &mut Ebpf| -> Result<(XdpLink, Variant), Error> {
            match attach_one(ebpf, Variant::Linear, iface, XdpMode::Driver) {
                Ok(link) => Ok((link, Variant::Linear)),
                Err(linear) if !kernel::has_frags() => Err(Error::Link {
                    what: format!("attaching to {iface} in native mode"),
                    reason: format!(
                        "{linear}; the multi-buffer build that would run there instead \
                         needs XDP multi-buffer (Linux 5.18), which this kernel lacks: \
                         lower the MTU to one buffer per frame"
                    ),
                }),
                Err(linear) => {
                    tracing::info!(%iface, error = %linear, "linear build refused; trying the multi-buffer build");
                    attach_one(ebpf, Variant::MultiBuffer, iface, XdpMode::Driver)
                        .map(|link| (link, Variant::MultiBuffer))
                }
            }
        };
        let generic_build = self.generic_build;
        let generic = |ebpf: &mut Ebpf| -> Result<(NewLink, AttachedMode, Variant), Error> {
            attach_one(ebpf, generic_build, iface, XdpMode::Skb)
                .map(|link| (NewLink::Xdp(link), AttachedMode::Generic, generic_build))
        };
        Ok(match mode {
            ConfigXdpMode::Native => {
                let (link, variant) = native(&mut self.ebpf)?;
                (NewLink::Xdp(link), AttachedMode::Native, variant)
            }
            ConfigXdpMode::Generic => generic(&mut self.ebpf)?,
            ConfigXdpMode::Auto => match native(&mut self.ebpf) {
                Ok((link, variant)) => (NewLink::Xdp(link), AttachedMode::Native, variant),
                Err(native) => {
                    tracing::warn!(%iface, error = %native, "native XDP failed; using generic");
                    generic(&mut self.ebpf)?
                }
            },
            ConfigXdpMode::Tc => (
                NewLink::Tc(attach_tc(&mut self.ebpf, iface)?),
                AttachedMode::Tc,
                Variant::Tc,
            ),
        })
    }

    /// Attaches to `iface` for the life of this program object only (tests,
    /// benchmarks): the link is not pinned.
    pub fn attach(&mut self, iface: &str, mode: ConfigXdpMode) -> Result<Attachment, Error> {
        if mode == ConfigXdpMode::Tc && !kernel::has_tcx() {
            let ifindex = ifindex_of(iface)?;
            let id = add_filter(tc_mut(&mut self.ebpf)?, iface)?;
            return Ok(Attachment {
                iface: iface.to_string(),
                mode: AttachedMode::Tc,
                variant: Variant::Tc,
                origin: LinkOrigin::Created,
                pin: None,
                link: AttachedLink::LocalFilter { ifindex, id },
            });
        }
        let (link, mode, variant) = self.attach_new(iface, mode)?;
        let keep_err = |e: aya::programs::ProgramError| Error::Program {
            what: format!("keeping the link of {iface}"),
            source: Box::new(e),
        };
        // Hand the link back to the program, which detaches it when dropped.
        let link = match link {
            NewLink::Xdp(link) => AttachedLink::Local(
                xdp_mut(&mut self.ebpf, variant)?
                    .attach_to_link(link)
                    .map_err(keep_err)?,
            ),
            NewLink::Tc(link) => AttachedLink::LocalTc(
                tc_mut(&mut self.ebpf)?
                    .attach_to_link(link)
                    .map_err(keep_err)?,
            ),
        };
        Ok(Attachment {
            iface: iface.to_string(),
            mode,
            variant,
            origin: LinkOrigin::Created,
            pin: None,
            link,
        })
    }

    /// Detaches an attachment made by [`Program::attach`] (pinned ones: [`unpin_link`]).
    pub fn detach(&mut self, attachment: Attachment) -> Result<(), Error> {
        let detach_err = |e: aya::programs::ProgramError| Error::Program {
            what: format!("detaching from {}", attachment.iface),
            source: Box::new(e),
        };
        match attachment.link {
            AttachedLink::Local(id) => xdp_mut(&mut self.ebpf, attachment.variant)?
                .detach(id)
                .map_err(detach_err),
            AttachedLink::LocalTc(id) | AttachedLink::LocalFilter { id, .. } => {
                tc_mut(&mut self.ebpf)?.detach(id).map_err(detach_err)
            }
            AttachedLink::Pinned(_)
            | AttachedLink::Filter { .. }
            | AttachedLink::Component { .. }
            | AttachedLink::Netlink { .. } => unpin_link(attachment),
        }
    }

    /// Puts one XDP build on the hook of `iface` through netlink as `step` says
    /// (`xdp_share_fallback = "tail-call"`): in place of the program there, or alone.
    /// `variants`: the builds to try, in order (the handoff decides which one can
    /// tail-call the taken program); `taken`: that program's pin.
    pub fn attach_netlink(
        &mut self,
        iface: &str,
        step: &crate::attach::takeover::Step,
        mode: ConfigXdpMode,
        variants: &[Variant],
        taken: Option<PathBuf>,
    ) -> Result<Attachment, Error> {
        let pin_dir = self.opts.pin_dir.clone().ok_or_else(|| Error::Sharing {
            iface: iface.to_string(),
            reason: "taking the hook over needs the maps pinned (pin_dir)".into(),
        })?;
        let control_id =
            tc_filter::control_map_id(&pin_dir).ok_or_else(|| Error::NotPinned(pin_dir.clone()))?;
        let ifindex = ifindex_of(iface)?;
        let mut refused = Vec::new();
        for &variant in variants {
            let fd = self.program_fd(variant)?;
            match crate::attach::takeover::attach(iface, ifindex, step, mode, fd) {
                Ok(attached) => {
                    return Ok(Attachment {
                        iface: iface.to_string(),
                        mode: match attached {
                            crate::attach::netlink::XdpAttached::Generic => AttachedMode::Generic,
                            _ => AttachedMode::Native,
                        },
                        variant,
                        origin: if matches!(step, crate::attach::takeover::Step::Adopt { .. }) {
                            LinkOrigin::Adopted
                        } else {
                            LinkOrigin::Created
                        },
                        pin: None,
                        link: AttachedLink::Netlink {
                            ifindex,
                            control_id,
                            pin_dir,
                            taken,
                        },
                    })
                }
                // A race or a hook netlink cannot change: another build fares no better.
                Err(e @ Error::Sharing { .. }) => return Err(e),
                Err(e) => refused.push(format!("{}: {e}", variant.as_str())),
            }
        }
        Err(Error::Link {
            what: format!("putting the limiter on the XDP hook of {iface}"),
            reason: refused.join("; "),
        })
    }

    /// The libxdp component's build ([`Variant::Libxdp`]) as an freplace program on the
    /// maps pinned under `pin_dir` (this program's), not loaded yet: the kernel verifies
    /// it against the dispatcher it is first linked to.
    pub fn component(&mut self, pin_dir: &Path) -> Result<&mut Extension, Error> {
        if self.component.is_none() {
            let mut loader = EbpfLoader::new();
            let sketch = map_spec(map_name::SRC_SKETCH);
            loader.map_max_entries(sketch.name, sketch.max_entries(self.opts.max_sources));
            for map in &MAPS {
                loader.map_pin_path(map.name, pin_dir.join(map.name));
            }
            loader.extension(PROGRAM_NAME_LIBXDP);
            self.component = Some(
                loader
                    .load(self.object.bytes())
                    .map_err(|e| Error::Load(Box::new(e)))?,
            );
        }
        self.component
            .as_mut()
            .and_then(|c| c.program_mut(PROGRAM_NAME_LIBXDP))
            .and_then(|p| p.try_into().ok())
            .ok_or(Error::ProgramNotInObject(Variant::Libxdp))
    }

    /// Makes the limiter a component of `iface`'s libxdp dispatcher at run priority
    /// `priority` (`xdp_share = "libxdp"`), or installs a dispatcher when the hook is
    /// empty. A component an earlier daemon left there is replaced in the same atomic
    /// swap of dispatchers (restart, upgrade). Needs pinned maps: the component is a
    /// second load of the program, and shares the maps through their pins.
    pub fn attach_shared(
        &mut self,
        iface: &str,
        mode: ConfigXdpMode,
        priority: u32,
    ) -> Result<Attachment, Error> {
        let pin_dir = self.opts.pin_dir.clone().ok_or_else(|| Error::Sharing {
            iface: iface.to_string(),
            reason: "a dispatcher component needs the maps pinned (pin_dir)".into(),
        })?;
        let control_id =
            tc_filter::control_map_id(&pin_dir).ok_or_else(|| Error::NotPinned(pin_dir.clone()))?;
        let ifindex = ifindex_of(iface)?;
        let ext = self.component(&pin_dir)?;
        let installed = libxdp::join(iface, ifindex, mode, priority, control_id, ext)?;
        Ok(Attachment {
            iface: iface.to_string(),
            mode: match installed.mode {
                Some(crate::attach::netlink::XdpAttached::Generic) => AttachedMode::Generic,
                _ => AttachedMode::Native,
            },
            variant: Variant::Libxdp,
            origin: if installed.replaced_limiter {
                LinkOrigin::Adopted
            } else {
                LinkOrigin::Created
            },
            pin: installed
                .dispatcher_id
                .map(|id| libxdp::state_dir().join(format!("dispatch-{ifindex}-{id}"))),
            link: AttachedLink::Component {
                ifindex,
                control_id,
            },
        })
    }
}

/// With `xdp_share = "exclusive"` the limiter needs the XDP hook to itself: another
/// program there (a load balancer, a libxdp dispatcher) is named, with what to do,
/// rather than reported as the kernel's EBUSY.
fn refuse_taken_hook(iface: &str) -> Result<(), Error> {
    let ifindex = ifindex_of(iface)?;
    let hook = libxdp::inspect(iface, ifindex, None)?;
    let reason = match hook {
        libxdp::Hook::Empty => return Ok(()),
        libxdp::Hook::Dispatcher(d) => format!(
            "the XDP hook runs a libxdp dispatcher (program {}) with {}: set xdp_share = \
             \"libxdp\" to join it as one more component",
            d.program_id,
            d.components
                .iter()
                .map(|c| format!("{} (id {}, priority {})", c.name, c.program_id, c.run_prio))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        libxdp::Hook::Other {
            program_id, name, ..
        } => format!(
            "the XDP hook runs program {program_id} ({name}), and xdp_share = \"exclusive\" \
             needs it free. If that program owns the hook (a load balancer), run the limiter \
             in front of it with next_program or join_program_array; if it is a libxdp \
             user's, use xdp_share = \"libxdp\" (docs/sharing.md, \"Sharing the XDP hook\")"
        ),
    };
    Err(Error::Sharing {
        iface: iface.to_string(),
        reason,
    })
}

/// Stops enforcement on the interface behind `attachment` by removing its pin; the link
/// goes away with its last file descriptor.
pub fn unpin_link(attachment: Attachment) -> Result<(), Error> {
    if let AttachedLink::Component {
        ifindex,
        control_id,
    } = attachment.link
    {
        return libxdp::leave(&attachment.iface, ifindex, control_id).map(|_| ());
    }
    if let AttachedLink::Netlink {
        ifindex,
        control_id,
        pin_dir,
        ..
    } = &attachment.link
    {
        return crate::attach::takeover::give_back(
            pin_dir,
            &attachment.iface,
            *ifindex,
            *control_id,
        )
        .map(|done| {
            if let Some(done) = done {
                tracing::info!("{done}");
            }
        });
    }
    if let AttachedLink::Filter { .. } = attachment.link {
        let filter = tc_filter::Filter {
            priority: tc_filter::PRIORITY,
            handle: tc_filter::HANDLE,
            name: None,
            program_id: None,
        };
        return tc_filter::remove(&attachment.iface, &filter).map_err(|reason| Error::Link {
            what: format!("removing the {} of {}", filter.describe(), attachment.iface),
            reason,
        });
    }
    let Some(pin) = &attachment.pin else {
        return Ok(());
    };
    fs::remove_file(pin).map_err(|e| Error::Io {
        what: format!("removing {}", pin.display()),
        source: e,
    })
}

/// Adds the TC build as a new filter in the limiter's slot of `iface`'s clsact ingress,
/// adding the qdisc first if the interface has none.
fn add_filter(prog: &mut SchedClassifier, iface: &str) -> Result<SchedClassifierLinkId, Error> {
    // An interface with a clsact (or ingress) qdisc refuses a second one; the attach
    // below says whether the hook is there.
    let qdisc = aya::programs::tc::qdisc_add_clsact(iface);
    prog.attach_with_options(
        iface,
        TcAttachType::Ingress,
        TcAttachOptions::Netlink(NlOptions {
            priority: tc_filter::PRIORITY,
            handle: TcHandle::from(tc_filter::HANDLE),
            classid: None,
        }),
    )
    .map_err(|e| Error::Link {
        what: format!("adding a cls_bpf filter for {PROGRAM_NAME_TC} to {iface}"),
        reason: match &qdisc {
            Ok(()) => e.to_string(),
            Err(q) => format!("{e} (adding a clsact qdisc first: {q})"),
        },
    })
}

/// Removes the limiter's filters (on `pin_dir`'s maps) from `iface` that `which` selects.
fn remove_filters(
    iface: &str,
    pin_dir: &Path,
    which: impl Fn(&tc_filter::Filter) -> bool,
) -> Result<(), Error> {
    let Ok(ifindex) = ifindex_of(iface) else {
        return Ok(());
    };
    let filters = tc_filter::limiter_filters_on(ifindex, pin_dir).unwrap_or_default();
    for f in filters.iter().filter(|f| which(f)) {
        tc_filter::remove(iface, f).map_err(|reason| Error::Link {
            what: format!("removing the limiter's {} from {iface}", f.describe()),
            reason,
        })?;
        tracing::warn!(%iface, filter = %f.describe(), "removed a filter an earlier daemon left: it would meter every frame a second time");
    }
    Ok(())
}

/// A load error of one build: the verifier's refusal with its log and the kernel
/// version, or (for anything else aya reports) the error as it is.
fn refused(variant: Variant, e: aya::programs::ProgramError) -> Error {
    match e {
        aya::programs::ProgramError::LoadError {
            io_error,
            verifier_log,
        } => Error::Refused(Box::new(crate::host::verifier::Refusal::new(
            variant.program_name(),
            variant.as_str(),
            crate::host::kernel::running(),
            crate::host::kernel::release(),
            &io_error,
            &verifier_log.to_string(),
        ))),
        e => Error::Program {
            what: format!("loading (verifying) the program {}", variant.program_name()),
            source: Box::new(e),
        },
    }
}

/// The builds the daemon verifies at start, before a rule is written or a link touched:
/// the ones its hooks run. `tc` mode runs the TC build alone; the XDP modes the two XDP
/// builds (native mode falls back to the multi-buffer build where the MTU needs it,
/// generic mode runs the one the handoff allows). `xdp_share = "libxdp"` loads a
/// component of its own when it joins a dispatcher and needs none of them, unless the
/// tail-call fallback may take a hook over or a handoff is configured: those put an XDP
/// build on a hook or in a prog array, and a build loaded after the handoff's arrays
/// were set up was refused (EINVAL, after the verifier had passed it), so they are
/// verified first, as in the XDP modes. The keys that decide need a restart to change: a
/// reload never needs another build. Each build left out is a verifier run saved (200 k
/// instructions; seconds under emulation).
pub fn builds_for(
    share: crate::config::XdpShare,
    fallback: crate::config::XdpShareFallback,
    handoff: bool,
    mode: ConfigXdpMode,
) -> &'static [Variant] {
    use crate::config::{XdpShare, XdpShareFallback};
    match (share, mode) {
        (XdpShare::Libxdp, _) if fallback == XdpShareFallback::None && !handoff => &[],
        (_, ConfigXdpMode::Tc) => &[Variant::Tc],
        _ => &Variant::XDP,
    }
}

/// Whether `variant` is loaded (has a descriptor).
fn is_loaded(ebpf: &Ebpf, variant: Variant) -> bool {
    ebpf.program(variant.program_name())
        .is_some_and(|p| p.fd().is_ok())
}

/// One XDP build, loaded (verified) first if it is not yet.
fn xdp_mut(ebpf: &mut Ebpf, variant: Variant) -> Result<&mut Xdp, Error> {
    let prog = ebpf
        .program_mut(variant.program_name())
        .and_then(|p| <&mut Xdp>::try_from(p).ok())
        .ok_or(Error::ProgramNotInObject(variant))?;
    if prog.fd().is_err() {
        prog.load().map_err(|e| refused(variant, e))?;
    }
    Ok(prog)
}

/// The TC build, loaded (verified) first if it is not yet.
fn tc_mut(ebpf: &mut Ebpf) -> Result<&mut SchedClassifier, Error> {
    let prog = ebpf
        .program_mut(PROGRAM_NAME_TC)
        .and_then(|p| <&mut SchedClassifier>::try_from(p).ok())
        .ok_or(Error::ProgramNotInObject(Variant::Tc))?;
    if prog.fd().is_err() {
        prog.load().map_err(|e| refused(Variant::Tc, e))?;
    }
    Ok(prog)
}

/// Attaches the TC build to `iface`'s ingress (a tcx link, kernel 6.6 and later) and
/// takes the link out of the program's keeping.
fn attach_tc(ebpf: &mut Ebpf, iface: &str) -> Result<SchedClassifierLink, Error> {
    let prog = tc_mut(ebpf)?;
    let id = prog
        .attach(iface, TcAttachType::Ingress)
        .map_err(|e| Error::Program {
            what: format!("attaching {PROGRAM_NAME_TC} to {iface} TC ingress"),
            source: Box::new(e),
        })?;
    prog.take_link(id).map_err(|e| Error::Program {
        what: format!("taking the link of {iface}"),
        source: Box::new(e),
    })
}

/// Attaches one build to `iface` and takes the link out of the program's keeping.
fn attach_one(
    ebpf: &mut Ebpf,
    variant: Variant,
    iface: &str,
    m: XdpMode,
) -> Result<XdpLink, Error> {
    let prog = xdp_mut(ebpf, variant)?;
    let id = prog.attach(iface, m).map_err(|e| Error::Program {
        what: format!(
            "attaching {} to {iface} in {m:?} mode",
            variant.program_name()
        ),
        source: Box::new(e),
    })?;
    prog.take_link(id).map_err(|e| Error::Program {
        what: format!("taking the link of {iface}"),
        source: Box::new(e),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{XdpShare, XdpShareFallback};

    #[test]
    fn the_daemon_verifies_the_builds_its_hooks_run() {
        let none = XdpShareFallback::None;
        for mode in [
            ConfigXdpMode::Native,
            ConfigXdpMode::Generic,
            ConfigXdpMode::Auto,
        ] {
            // Native falls back to the multi-buffer build; generic runs either.
            assert_eq!(
                builds_for(XdpShare::Exclusive, none, false, mode),
                &Variant::XDP,
                "{mode:?}"
            );
            assert_eq!(
                builds_for(XdpShare::Exclusive, none, true, mode),
                &Variant::XDP,
                "{mode:?}"
            );
        }
        assert_eq!(
            builds_for(XdpShare::Exclusive, none, false, ConfigXdpMode::Tc),
            &[Variant::Tc]
        );
        for mode in [ConfigXdpMode::Native, ConfigXdpMode::Generic] {
            assert!(
                builds_for(XdpShare::Libxdp, none, false, mode).is_empty(),
                "{mode:?}"
            );
            // A hook the fallback takes over, or a handoff: the XDP builds first.
            assert_eq!(
                builds_for(XdpShare::Libxdp, XdpShareFallback::TailCall, false, mode),
                &Variant::XDP,
                "{mode:?}"
            );
            assert_eq!(
                builds_for(XdpShare::Libxdp, none, true, mode),
                &Variant::XDP,
                "{mode:?}"
            );
        }
    }
}
