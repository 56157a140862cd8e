//! The library's typed error: every variant says what was being done.

use std::path::PathBuf;

use limiter_service::exit::Exit;

use crate::{config::ConfigError, policy::ruleset::RulesetError};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Ruleset(#[from] RulesetError),
    #[error("this build has no XDP program (built with LIMITER_EBPF_SKIP=1); rebuild without it")]
    NoObject,
    /// A build of the limiter's program is missing from the eBPF object this binary
    /// carries (or is not of its program type): the binary, not the host, is at fault.
    #[error(
        "the eBPF object built into this binary has no {} build of the limiter (program \
         `{}`): this binary is incomplete or damaged; install the limiter again",
        .0.as_str(),
        .0.program_name()
    )]
    ProgramNotInObject(crate::host::object::Variant),
    /// The libxdp component build is asked for while it is not loaded: it is loaded only
    /// to share a hook through libxdp.
    #[error(
        "the limiter's libxdp component is not loaded: it is loaded only for an interface \
         with xdp_share = \"libxdp\""
    )]
    ComponentNotLoaded,
    /// The libxdp dispatcher this binary carries has no dispatcher program.
    #[error(
        "the libxdp dispatcher built into this binary has no XDP program `{0}`: this \
         binary is incomplete or damaged; install the limiter again"
    )]
    DispatcherNotInObject(&'static str),
    /// The attach code met a case its own plan rules out: a bug, not the operator's doing.
    #[error(
        "{iface}: {what}; this is a bug in the limiter (please report it with the log), \
         the interface's XDP hook was left as it was"
    )]
    AttachPlan { iface: String, what: &'static str },
    #[error("loading the eBPF object: {0}")]
    Load(#[source] Box<aya::EbpfError>),
    /// The verifier refused a build: which one, on which kernel, and the log's end.
    #[error("{0}")]
    Refused(Box<crate::host::verifier::Refusal>),
    /// The running kernel lacks something the configured mode needs.
    #[error(transparent)]
    MissingFeature(#[from] crate::host::kernel::MissingFeature),
    #[error("{what}: {source}")]
    Program {
        what: String,
        #[source]
        source: Box<aya::programs::ProgramError>,
    },
    #[error("{what}: {source}")]
    Map {
        what: String,
        #[source]
        source: aya::maps::MapError,
    },
    #[error("{what}: {reason}")]
    Link { what: String, reason: String },
    /// The XDP hook of an interface cannot be shared as configured (`xdp_share`): what
    /// holds it, and what the operator can do.
    #[error("{iface}: {reason}")]
    Sharing { iface: String, reason: String },
    /// A table that gives a live rule's slot to another rule while the live table can
    /// still meter with it (see `daemon::install_rules`).
    #[error(
        "rule slot {slot} is live for rule {live:?}: rule {new:?} can take it only from a \
         table without {live:?}, once no frame runs on the old one"
    )]
    SlotInUse {
        slot: u32,
        live: String,
        new: String,
    },
    #[error("no rule named {0:?}")]
    UnknownRule(String),
    #[error("{0}")]
    Quota(String),
    #[error("fleet: {0}")]
    Fleet(String),
    /// The service runner's own state (a poisoned lock, a task still holding the daemon).
    #[error("{0}")]
    Service(String),
    /// `next_program` / `join_program_array`: the LB's pin or slot is not usable.
    #[error("{key}: {reason}")]
    Handoff { key: &'static str, reason: String },
    /// The control socket or its lock: another daemon runs, or something is in the way.
    #[error(transparent)]
    Instance(#[from] limiter_instance::ClaimError),
    #[error("map {0} is missing from the object or pin directory")]
    MissingMap(&'static str),
    #[error(
        "pinned map {path} does not match this build (key/value/entries: expected {expected:?}, \
         found {found:?}); it was made by another version or another max_sources. \
         Run `limiter detach` to remove the old pins, then start again"
    )]
    PinnedLayout {
        path: PathBuf,
        expected: (u32, u32, u32),
        found: (u32, u32, u32),
    },
    #[error(
        "{} is in the way: {why}. The limiter adopts and removes only pins it created: move \
         it away or choose another pin_dir",
        path.display()
    )]
    PinInTheWay { path: PathBuf, why: String },
    #[error("{0} is not on a bpf filesystem (mount -t bpf bpf /sys/fs/bpf)")]
    NotBpffs(PathBuf),
    #[error("no pinned limiter maps under {0}: is the daemon running with this pin_dir?")]
    NotPinned(PathBuf),
    /// The daemon lacks a capability, or a client is not root: which, and what for.
    #[error(transparent)]
    Permission(#[from] crate::host::privilege::PermissionError),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

/// The exit status (limiter_service::exit) of the daemon's own error types, by type, and
/// of the control socket's (limiter_service::control); I/O errors (a permission the
/// kernel refused) are limiter_service::exit's. `None`: ask the next cause.
pub fn exit_status(e: &(dyn std::error::Error + 'static)) -> Option<Exit> {
    if let Some(status) = limiter_service::control::exit_status(e) {
        return Some(status);
    }
    if e.is::<ConfigError>() || e.is::<RulesetError>() || e.is::<crate::config::NoInterface>() {
        return Some(Exit::BadInput);
    }
    if e.is::<crate::host::kernel::MissingFeature>() {
        return Some(Exit::KernelRefused);
    }
    let e = e.downcast_ref::<Error>()?;
    match e {
        Error::Config(_) | Error::Ruleset(_) | Error::UnknownRule(_) | Error::Quota(_) => {
            Some(Exit::BadInput)
        }
        Error::Load(_)
        | Error::Refused(_)
        | Error::MissingFeature(_)
        | Error::Program { .. }
        | Error::Link { .. }
        | Error::Sharing { .. } => Some(Exit::KernelRefused),
        Error::Permission(_) => Some(Exit::KernelRefused),
        Error::NotPinned(_) => Some(Exit::NotRunning),
        // Their sources (an I/O error, a map's) may say more: a permission, say.
        Error::Map { .. } | Error::Io { .. } | Error::Instance(_) => None,
        Error::NoObject
        | Error::ProgramNotInObject(_)
        | Error::ComponentNotLoaded
        | Error::DispatcherNotInObject(_)
        | Error::AttachPlan { .. }
        | Error::Fleet(_)
        | Error::Service(_)
        | Error::Handoff { .. }
        | Error::MissingMap(_)
        | Error::PinnedLayout { .. }
        | Error::PinInTheWay { .. }
        | Error::NotBpffs(_)
        | Error::SlotInUse { .. } => Some(Exit::Failure),
    }
}
