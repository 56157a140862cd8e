//! The config's words and named defaults: the enums a key is spelled as (`xdp_mode =
//! "native"`), their [`ConfigWord`] spellings, and the constants the schema rows
//! ([`super::schema`]) give as defaults and bounds. The bottom of `config/`: the schema
//! and the validated types both build on it.

use limiter_common::{abi, gcra::Granularity};
use limiter_config::{config_enum, ConfigWord};
pub use limiter_fleet::share::FailMode;

/// Default `pin_dir`.
pub const DEFAULT_PIN_DIR: &str = "/sys/fs/bpf/limiter";
/// Default `control_socket`.
pub const DEFAULT_CONTROL_SOCKET: &str = "/run/limiter/limiter.sock";
/// Default `metrics` listen address.
pub const DEFAULT_METRICS: &str = "127.0.0.1:9464";
/// Default `fleet_size` (docs/design.md, "Fleet state machine": quota ÷ fleet_size while bootstrapping).
pub use limiter_fleet::share::DEFAULT_FLEET_SIZE;
/// Largest accepted `max_sources`: 2^24 cells in each of the per-source sketch's two
/// rows, 256 MiB of kernel memory (16 bytes a source).
pub const MAX_MAX_SOURCES: u32 = 1 << 24;
/// Smallest burst in unit `bytes`: one full Ethernet frame (1500 + 14 header + 4 VLAN
/// tag). A frame larger than the burst could never conform.
pub const MIN_BYTES_BURST: u64 = 1518;
/// Sources are bucketed by their /32 in IPv4 unless `prefix_v4` says otherwise.
pub const DEFAULT_PREFIX_V4: u8 = 32;
/// Sources are bucketed by their /64 in IPv6 unless `prefix_v6` says otherwise: a /64 is
/// what one subscriber (one LAN, one SLAAC host) gets, so bucketing by /128 would hand
/// anyone with a /64 2^64 fresh buckets.
pub const DEFAULT_PREFIX_V6: u8 = 64;

config_enum!(
    /// How the XDP program is attached.
    XdpMode, "xdp_mode" {
        /// Native (driver) mode if the driver supports it, else generic.
        Auto = "auto",
        Native = "native",
        Generic = "generic",
        /// Not XDP: the same program at TC ingress, for frames that arrive as socket
        /// buffers (veth fed by the stack, NICs without native XDP), where XDP would cost
        /// a copy of every frame.
        Tc = "tc",
    }
);

config_enum!(
    /// Whether the limiter has the interface's XDP hook to itself.
    XdpShare, "xdp_share" {
        /// The limiter's own bpf_link: nothing else runs at the hook (the default).
        Exclusive = "exclusive",
        /// A component of libxdp's multi-program dispatcher, shared with xdp-loader,
        /// xdp-filter and other libxdp users; the limiter installs the dispatcher when the
        /// hook is empty.
        Libxdp = "libxdp",
    }
);

config_enum!(
    /// What `xdp_share = "libxdp"` does where the kernel refuses freplace links, without
    /// which no libxdp dispatcher runs.
    XdpShareFallback, "xdp_share_fallback" {
        /// Refuse to start, naming the kernel's refusal (the default).
        None = "none",
        /// Take the hook: pin the program found there, run the limiter in its place,
        /// and tail-call it for every frame the limiter passes (one interface only).
        TailCall = "tail-call",
    }
);

/// Default `xdp_priority`: libxdp's run priority of the limiter's component (lower runs
/// first; libxdp's default for a program that names none is 50).
pub const DEFAULT_XDP_PRIORITY: u32 = 10;

config_enum!(
    /// The kill switch in the config (`bypass`): the `CONTROL` bypass bit, which passes
    /// every frame unclassified, unmetered and uncounted.
    Bypass, "bypass" {
        /// Enforce; a switch set by `limiter bypass on` (or by hand) stays set: a reload
        /// never clears an operator's emergency switch.
        Off = "off",
        /// Set the bit at start and at every reload.
        On = "on",
    }
);

config_enum!(
    /// Protocol a rule matches.
    Proto, "proto" {
        Tcp = "tcp",
        Udp = "udp",
        /// ICMP in IPv4, ICMPv6 in IPv6.
        Icmp = "icmp",
        Any = "any",
    }
);

config_enum!(
    /// What a rule meters.
    Unit, "unit" {
        Packets = "packets",
        /// Frame length as XDP sees it, L2 header included.
        Bytes = "bytes",
        /// TCP SYN without ACK (new connections); other packets are not metered.
        Syn = "syn",
    }
);

config_enum!(
    /// Whether a rule drops.
    Mode, "mode" {
        Enforce = "enforce",
        /// Pass everything, count what enforce would drop.
        Shadow = "shadow",
    }
);

config_enum!(
    /// What a rule's per-source limit does while the rule's part of the sketch is
    /// saturated (crate::policy::saturation: a flood has filled its cells so that honest sources
    /// under their limit are refused).
    OnSaturation, "on_saturation" {
        /// The per-source limit stands aside: what it would refuse goes on to the
        /// aggregate limit, which keeps holding (the default: a saturated sketch makes the
        /// limiter less accurate, never refuses honest traffic).
        StandAside = "stand-aside",
        /// The per-source limit keeps refusing, honest sources in saturated cells too
        /// (abuse rules whose operators prefer refusals).
        Enforce = "enforce",
    }
);

/// `fail_mode` as the config spells it: the fleet's own type
/// (limiter_fleet::share::FailMode, whose crate knows no config) in a wrapper the
/// checker's [`ConfigWord`] can be implemented for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailModeWord(pub FailMode);

impl FailModeWord {
    const ALL: &'static [FailModeWord] =
        &[FailModeWord(FailMode::Open), FailModeWord(FailMode::Static)];
}

const _: () = assert!(FailModeWord::ALL.len() == FailMode::ALL.len());

impl ConfigWord for FailModeWord {
    const KEY: &'static str = "fail_mode";

    fn all() -> &'static [Self] {
        FailModeWord::ALL
    }

    fn spelling(self) -> &'static str {
        self.0.as_str()
    }
}

impl Unit {
    /// Granularity of limits in this unit.
    pub const fn granularity(self) -> Granularity {
        match self {
            Unit::Bytes => Granularity::Byte,
            Unit::Packets | Unit::Syn => Granularity::Event,
        }
    }

    /// The unit a rule's map entry holds (`abi::UNIT_*`); `None` for a value no unit has.
    pub fn from_abi(abi: u32) -> Option<Unit> {
        Unit::ALL.iter().copied().find(|u| u.abi() == abi)
    }

    /// The unit as a rule's map entry holds it (`abi::UNIT_*`).
    pub const fn abi(self) -> u32 {
        match self {
            Unit::Packets => abi::UNIT_PACKETS,
            Unit::Bytes => abi::UNIT_BYTES,
            Unit::Syn => abi::UNIT_SYN,
        }
    }
}

/// The largest socket buffer GRO builds: 64 KiB and (as segments) 64 packets. In `tc`
/// mode one buffer is metered whole, so a burst below it refuses such buffers always.
pub const GRO_MAX_BYTES: u64 = 65_536;
pub const GRO_MAX_SEGMENTS: u64 = 64;

// The control socket carries protocols as their config spelling.
impl serde::Serialize for Proto {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> serde::Deserialize<'de> for Proto {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = <String as serde::Deserialize>::deserialize(deserializer)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}
