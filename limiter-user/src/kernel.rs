//! What the running kernel offers the daemon, found out at start.
//!
//! Distribution kernels run on LB fleets (Debian 12's 6.1, its 6.12 backport), so the
//! daemon cannot assume this machine's kernel: each feature it relies on is checked here
//! once, and the caller either uses a working equivalent or refuses with an error that
//! names the feature and the kernel that has it.

use std::fmt;

/// A kernel version as major.minor.patch (Debian's and Ubuntu's package version where the
/// release string hides it: `6.1.0-57-amd64` is 6.1.170).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl Version {
    pub const fn new(major: u32, minor: u32, patch: u32) -> Version {
        Version {
            major,
            minor,
            patch,
        }
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// tcx links (BPF_LINK_TYPE_TCX) for the TC build: Linux 6.6.
pub const TCX: Version = Version::new(6, 6, 0);

/// The running kernel's version, as aya reads it (Debian's and Ubuntu's package version
/// first). `None` if it cannot be read.
pub fn running() -> Option<Version> {
    let v = aya::util::KernelVersion::current().ok()?;
    parse(&v.to_string())
}

/// `major.minor.patch` (what aya's `KernelVersion` displays).
pub fn parse(s: &str) -> Option<Version> {
    let mut parts = s.trim().splitn(3, '.').map(str::parse::<u32>);
    Some(Version::new(
        parts.next()?.ok()?,
        parts.next()?.ok()?,
        parts.next()?.ok()?,
    ))
}

/// Whether the running kernel has tcx links (else the TC build runs as a cls_bpf filter
/// under a clsact qdisc). `LIMITER_TC_HOOK=cls_bpf` takes the filter path on any kernel:
/// the tests use it to run that path on this machine's kernel too.
pub fn has_tcx() -> bool {
    if std::env::var_os(TC_HOOK_ENV).is_some_and(|v| v == "cls_bpf") {
        return false;
    }
    running().is_some_and(|v| v >= TCX)
}

/// The environment variable [`has_tcx`] reads.
pub const TC_HOOK_ENV: &str = "LIMITER_TC_HOOK";

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use super::*;

    #[test]
    fn versions_parse_and_order() {
        assert_eq!(parse("6.1.170"), Some(Version::new(6, 1, 170)));
        assert_eq!(parse("6.1"), None);
        assert_eq!(parse("x.1.2"), None);
        assert!(parse("6.5.255").unwrap() < TCX);
        assert!(parse("6.12.117").unwrap() >= TCX);
        assert_eq!(TCX.to_string(), "6.6.0");
    }
}
