//! The library's typed error: every variant says what was being done.

use std::path::PathBuf;

use crate::{config::ConfigError, ruleset::RulesetError};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Ruleset(#[from] RulesetError),
    #[error("this build has no XDP program (built with LIMITER_EBPF_SKIP=1); rebuild without it")]
    NoObject,
    #[error("the object has no XDP program named `limiter`")]
    NoProgram,
    #[error("loading the eBPF object: {0}")]
    Load(#[source] Box<aya::EbpfError>),
    /// The verifier refused a build: which one, on which kernel, and the log's end.
    #[error("{0}")]
    Refused(Box<crate::verifier::Refusal>),
    /// The running kernel lacks something the configured mode needs.
    #[error(transparent)]
    MissingFeature(#[from] crate::kernel::MissingFeature),
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
    Permission(#[from] crate::privilege::PermissionError),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// Whether this is a refusal for want of privilege (a capability, or root), whatever
    /// layer found it: the binaries give it its own exit code.
    pub fn is_permission_denied(&self) -> bool {
        match self {
            Error::Permission(_) => true,
            Error::Io { source, .. } => source.kind() == std::io::ErrorKind::PermissionDenied,
            _ => false,
        }
    }
}
