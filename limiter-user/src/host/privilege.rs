//! What the daemon needs from the kernel's capability model, checked before anything
//! changes, so that a daemon started with too little says which capability it lacks
//! instead of a raw EPERM (or, worse, a verifier refusal that reads like a bug).
//!
//! Measured on Linux 6.18 and on Debian 12's 6.1 (README, "Running under systemd"):
//! `limiter run` in every exclusive mode (native, generic, tc, fleet), its first start
//! and its restarts over what an earlier daemon attached, needs exactly CAP_BPF,
//! CAP_NET_ADMIN and CAP_PERFMON; `limiter stats` needs none as root (the pins are root's
//! files). `xdp_share = "libxdp"` needs CAP_SYS_ADMIN as well: the dispatcher on the hook
//! (the limiter's or another tool's) is read by its program id, which the kernel opens
//! only for CAP_SYS_ADMIN, as libxdp itself does. CAP_SYS_ADMIN stands in for CAP_BPF and
//! CAP_PERFMON (the kernel's bpf_capable/perfmon_capable accept it, and kernels before
//! 5.8 know no other).

use std::{fmt, path::PathBuf};

/// One capability the daemon may need, with why (what the kernel refuses without it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Capability {
    NetAdmin,
    SysAdmin,
    Perfmon,
    Bpf,
}

impl Capability {
    /// The bit number in the kernel's capability sets (linux/capability.h).
    pub const fn number(self) -> u32 {
        match self {
            Capability::NetAdmin => 12,
            Capability::SysAdmin => 21,
            Capability::Perfmon => 38,
            Capability::Bpf => 39,
        }
    }

    /// The name systemd's `CapabilityBoundingSet=` and capabilities(7) use.
    pub const fn name(self) -> &'static str {
        match self {
            Capability::NetAdmin => "CAP_NET_ADMIN",
            Capability::SysAdmin => "CAP_SYS_ADMIN",
            Capability::Perfmon => "CAP_PERFMON",
            Capability::Bpf => "CAP_BPF",
        }
    }

    /// What the daemon does that the kernel refuses without this capability.
    pub const fn needed_for(self) -> &'static str {
        match self {
            Capability::Bpf => "creating the BPF maps and loading the XDP program",
            Capability::Perfmon => {
                "the verifier's acceptance of the program (without it the kernel verifies \
                 as for an unprivileged loader and refuses the program's bounded loops)"
            }
            Capability::NetAdmin => {
                "loading a network program (XDP, tc) and attaching it to the interfaces"
            }
            Capability::SysAdmin => {
                "mounting bpffs, and opening a program by its id: the libxdp dispatcher on \
                 the hook (xdp_share = \"libxdp\"), a hook another program holds \
                 (xdp_share_fallback = \"tail-call\")"
            }
        }
    }
}

impl fmt::Display for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The capabilities `limiter run` needs in every exclusive mode (measured, see the
/// module doc).
pub const DAEMON: [Capability; 3] = [Capability::Bpf, Capability::NetAdmin, Capability::Perfmon];

/// What `limiter run` with `xdp_share = "libxdp"` needs: CAP_SYS_ADMIN (which covers
/// CAP_BPF and CAP_PERFMON) and CAP_NET_ADMIN.
pub const DAEMON_LIBXDP: [Capability; 4] = [
    Capability::Bpf,
    Capability::NetAdmin,
    Capability::Perfmon,
    Capability::SysAdmin,
];

/// A capability set, as the kernel's bit mask (`CapEff:` in /proc/PID/status).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CapSet(pub u64);

impl CapSet {
    pub fn has(self, cap: Capability) -> bool {
        self.0 & (1u64 << cap.number()) != 0
    }

    /// This process's effective set, from /proc/self/status.
    pub fn effective() -> std::io::Result<CapSet> {
        let status = std::fs::read_to_string("/proc/self/status")?;
        parse_effective(&status).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "no CapEff line in /proc/self/status",
            )
        })
    }
}

/// The `CapEff:` mask of a /proc/PID/status text.
pub fn parse_effective(status: &str) -> Option<CapSet> {
    let line = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
    u64::from_str_radix(line.trim(), 16).ok().map(CapSet)
}

/// What of [`DAEMON`] `caps` lacks: CAP_SYS_ADMIN covers CAP_BPF and CAP_PERFMON, as the
/// kernel's checks accept it for both.
pub fn missing_for_daemon(caps: CapSet) -> Vec<Capability> {
    missing_of(caps, &DAEMON)
}

/// What of [`DAEMON_LIBXDP`] `caps` lacks (CAP_SYS_ADMIN covering the two it covers).
pub fn missing_for_libxdp(caps: CapSet) -> Vec<Capability> {
    missing_of(caps, &DAEMON_LIBXDP)
}

fn missing_of(caps: CapSet, needed: &[Capability]) -> Vec<Capability> {
    needed
        .iter()
        .copied()
        .filter(|&cap| {
            let covered = matches!(cap, Capability::Bpf | Capability::Perfmon)
                && caps.has(Capability::SysAdmin);
            !caps.has(cap) && !covered
        })
        .collect()
}

/// The daemon was denied something: which capabilities it lacks (or, for a file, that it
/// is not root's), and that nothing changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PermissionError {
    #[error(
        "{doing} needs {} (this process has {}): {}. Nothing was changed. Under systemd the \
         unit's CapabilityBoundingSet= and AmbientCapabilities= must grant them; by hand, run \
         as root",
        names(missing),
        have,
        reasons(missing)
    )]
    MissingCapabilities {
        doing: String,
        missing: Vec<Capability>,
        /// The effective set, by name, for the message.
        have: String,
    },
    #[error(
        "{doing}: permission denied on {}: it belongs to root (run as root; no capability \
         is needed for it as root)",
        path.display()
    )]
    NotRoot { doing: String, path: PathBuf },
    /// The kernel refused with EPERM an operation that needs `cap`.
    #[error("{doing}: the kernel refused it (EPERM): it needs {cap} ({})", cap.needed_for())]
    Refused { doing: String, cap: Capability },
}

fn names(caps: &[Capability]) -> String {
    caps.iter().map(|c| c.name()).collect::<Vec<_>>().join(", ")
}

fn reasons(caps: &[Capability]) -> String {
    caps.iter()
        .map(|c| format!("{} is for {}", c.name(), c.needed_for()))
        .collect::<Vec<_>>()
        .join("; ")
}

/// The effective set by name: the capabilities this module knows, or "none of them".
pub fn describe(caps: CapSet) -> String {
    let known: Vec<&str> = [
        Capability::Bpf,
        Capability::NetAdmin,
        Capability::Perfmon,
        Capability::SysAdmin,
    ]
    .into_iter()
    .filter(|&c| caps.has(c))
    .map(Capability::name)
    .collect();
    if known.is_empty() {
        "none of CAP_BPF, CAP_NET_ADMIN, CAP_PERFMON, CAP_SYS_ADMIN".to_string()
    } else {
        known.join(", ")
    }
}

/// Refuses to start, before anything is claimed, loaded or attached, when the effective
/// set lacks what the daemon needs (`libxdp`: with `xdp_share = "libxdp"`). An
/// unreadable set is not a refusal: the kernel's own errors then say what is missing.
pub fn check_daemon(libxdp: bool) -> Result<(), PermissionError> {
    let Ok(caps) = CapSet::effective() else {
        return Ok(());
    };
    let (missing, doing) = if libxdp {
        (
            missing_for_libxdp(caps),
            "starting the daemon with xdp_share = \"libxdp\"",
        )
    } else {
        (missing_for_daemon(caps), "starting the daemon")
    };
    if missing.is_empty() {
        return Ok(());
    }
    Err(PermissionError::MissingCapabilities {
        doing: doing.to_string(),
        missing,
        have: describe(caps),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use proptest::prelude::*;

    use super::*;

    fn set(caps: &[Capability]) -> CapSet {
        CapSet(caps.iter().fold(0, |m, c| m | (1u64 << c.number())))
    }

    #[test]
    fn reads_the_effective_mask() {
        let status = "Name:\tlimiter\nCapInh:\t0000000000000000\nCapPrm:\t000000c000001000\n\
                      CapEff:\t000000c000001000\nCapBnd:\t000000c000001000\n";
        let caps = parse_effective(status).unwrap();
        assert_eq!(missing_for_daemon(caps), Vec::<Capability>::new());
        assert_eq!(describe(caps), "CAP_BPF, CAP_NET_ADMIN, CAP_PERFMON");
        assert_eq!(parse_effective("Name:\tx\n"), None);
    }

    #[test]
    fn each_one_missing_is_named() {
        for cap in DAEMON {
            let rest: Vec<Capability> = DAEMON.into_iter().filter(|&c| c != cap).collect();
            assert_eq!(missing_for_daemon(set(&rest)), vec![cap]);
        }
    }

    #[test]
    fn sys_admin_stands_in_for_bpf_and_perfmon_but_not_net_admin() {
        assert_eq!(
            missing_for_daemon(set(&[Capability::SysAdmin])),
            vec![Capability::NetAdmin]
        );
        assert!(missing_for_daemon(set(&[Capability::SysAdmin, Capability::NetAdmin])).is_empty());
    }

    #[test]
    fn the_message_names_what_is_missing_and_why() {
        let e = PermissionError::MissingCapabilities {
            doing: "starting the daemon".into(),
            missing: vec![Capability::Perfmon],
            have: describe(set(&[Capability::Bpf, Capability::NetAdmin])),
        };
        let text = e.to_string();
        assert!(
            text.contains("needs CAP_PERFMON (this process has CAP_BPF, CAP_NET_ADMIN)"),
            "{text}"
        );
        assert!(text.contains("verifier"), "{text}");
    }

    #[test]
    fn libxdp_needs_sys_admin_which_covers_bpf_and_perfmon() {
        assert_eq!(missing_for_libxdp(set(&DAEMON)), vec![Capability::SysAdmin]);
        assert!(missing_for_libxdp(set(&[Capability::SysAdmin, Capability::NetAdmin])).is_empty());
        assert_eq!(
            missing_for_libxdp(set(&[Capability::SysAdmin])),
            vec![Capability::NetAdmin]
        );
    }

    proptest! {
        /// Whatever else a set holds, the daemon's check passes exactly when the kernel's
        /// own rule would: NET_ADMIN, and BPF and PERFMON each or SYS_ADMIN for both.
        #[test]
        fn missing_is_empty_exactly_when_the_kernel_would_allow(mask in any::<u64>()) {
            let caps = CapSet(mask);
            let admin = caps.has(Capability::SysAdmin);
            let allowed = caps.has(Capability::NetAdmin)
                && (admin || caps.has(Capability::Bpf))
                && (admin || caps.has(Capability::Perfmon));
            prop_assert_eq!(missing_for_daemon(caps).is_empty(), allowed);
        }
    }
}
