//! The validated configuration: what [`Config::parse`] returns, its enums (spelled as in
//! the file) and the named defaults the schema rows ([`super::schema`]) refer to.

use std::{
    fmt,
    net::SocketAddr,
    path::{Path, PathBuf},
};

use ipnet::IpNet;
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
/// Longest rule name in bytes (the map keeps [`abi::RULE_NAME_LEN`] bytes, NUL padded).
pub const MAX_RULE_NAME_LEN: usize = abi::RULE_NAME_LEN - 1;

/// A validated configuration file.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Interfaces to attach to; may be empty (then `--iface` supplies them).
    pub interfaces: Vec<String>,
    pub xdp_mode: XdpMode,
    pub xdp_share: XdpShare,
    /// Run priority in a libxdp dispatcher (`xdp_share = "libxdp"`).
    pub xdp_priority: u32,
    /// What `xdp_share = "libxdp"` does on a kernel that refuses freplace.
    pub xdp_share_fallback: XdpShareFallback,
    pub pin_dir: PathBuf,
    pub control_socket: PathBuf,
    /// Prometheus listen address; `None` when `metrics = ""`.
    pub metrics: Option<SocketAddr>,
    /// Capacity of the per-source bucket map.
    pub max_sources: u32,
    pub fleet_size: u32,
    /// Rules in file order.
    pub rules: Vec<RuleSpec>,
    /// `[fleet]`: the allocator this host reports to; `None` = standalone (the configured
    /// rates apply locally and no share state machine runs).
    pub fleet: Option<FleetSpec>,
    /// `next_program` / `join_program_array`: where frames the limiter passes go next;
    /// `None`: to the stack, as without a handoff.
    pub handoff: Option<HandoffSpec>,
}

/// The tail-call handoff to the program that runs after the limiter (a load balancer
/// that owns the hook, or Katran's root array in shared mode).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandoffSpec {
    /// `next_program = "PIN"`: the program pinned at PIN. The daemon keeps it in a
    /// one-slot array of its own and follows the pin when it names another program.
    Program(PathBuf),
    /// `next_program = "PIN:INDEX"`: slot INDEX of the LB's prog array pinned at PIN.
    /// The limiter tail-calls through the LB's array itself, so a program the LB puts in
    /// the slot gets the next frame.
    Slot { array: PathBuf, index: u32 },
    /// `join_program_array = "PIN:INDEX"`: the limiter goes into slot INDEX of the LB's
    /// root array (the LB's root program calls it) and calls on to the slots after it.
    /// Nothing is attached to an interface: the LB's root program is there.
    Join { array: PathBuf, index: u32 },
}

impl HandoffSpec {
    /// The config key that set it.
    pub fn key(&self) -> &'static str {
        match self {
            HandoffSpec::Program(_) | HandoffSpec::Slot { .. } => "next_program",
            HandoffSpec::Join { .. } => "join_program_array",
        }
    }

    /// The LB's prog array the program must use in place of its own, if any.
    pub fn lb_array(&self) -> Option<&Path> {
        match self {
            HandoffSpec::Program(_) => None,
            HandoffSpec::Slot { array, .. } | HandoffSpec::Join { array, .. } => Some(array),
        }
    }
}

impl fmt::Display for HandoffSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HandoffSpec::Program(pin) => write!(f, "{} = \"{}\"", self.key(), pin.display()),
            HandoffSpec::Slot { array, index } | HandoffSpec::Join { array, index } => {
                write!(f, "{} = \"{}:{index}\"", self.key(), array.display())
            }
        }
    }
}

/// `[fleet]`: where the allocator is and how to reach it. With a fleet, a rule's `rate`
/// and `burst` are its *global* quota, split across hosts by the allocator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetSpec {
    /// The groups of allocators, in order (never empty): `[fleet] allocator` is one
    /// group named `""`; `[[fleet.groups]]` are sharded allocators, each group granting
    /// its own rules (a rule not yet routed is reported to the first).
    pub groups: Vec<AllocatorGroup>,
    /// The name in the allocator's certificate.
    pub server_name: String,
    /// This host's fleet-unique id (default: the hostname); `limiter run` refuses to start
    /// unless it is a name of `cert` (`fleet::check_host_identity`).
    pub host_id: String,
    /// CA that signs the allocator's certificate; this host's client certificate and key.
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Local address for allocator traffic (default: chosen by the kernel).
    pub bind: Option<std::net::IpAddr>,
    pub lease_ttl_ms: u64,
    pub sticky_max_s: u64,
    pub report_interval_ms: u64,
}

/// One group of allocators: its name (`""` for `[fleet] allocator`) and its replicas'
/// gRPC addresses, `address:port`, in the order they are tried (never empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocatorGroup {
    pub name: String,
    pub allocators: Vec<SocketAddr>,
}

impl FleetSpec {
    /// Every allocator address of every group, for display: `a, b` for one unnamed
    /// group, `g1: a, b; g2: c` for sharded groups.
    pub fn allocators_text(&self) -> String {
        self.groups
            .iter()
            .map(|g| {
                let list = g
                    .allocators
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ");
                if g.name.is_empty() {
                    list
                } else {
                    format!("{}: {list}", g.name)
                }
            })
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// One `[[rules]]` entry, validated: every limit compiles, names are unique and no two
/// rules have the same (dst, dst_port, proto).
#[derive(Debug, Clone, PartialEq)]
pub struct RuleSpec {
    pub name: String,
    /// Destination prefix with no host bits set (a bare address is /32 or /128).
    pub dst: IpNet,
    /// `None` = any port. Never set together with [`Proto::Icmp`].
    pub dst_port: Option<u16>,
    pub proto: Proto,
    pub unit: Unit,
    /// `rate`/`burst`: the aggregate limit of the rule.
    pub aggregate: Option<RateSpec>,
    pub mode: Mode,
    pub fail_mode: FailMode,
    pub per_source: Option<PerSourceSpec>,
}

impl RuleSpec {
    /// Granularity of this rule's limits ([`Granularity::Byte`] for unit bytes).
    pub fn granularity(&self) -> Granularity {
        self.unit.granularity()
    }
}

/// A rate in units per second and a burst in units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateSpec {
    pub rate: u64,
    pub burst: u64,
}

/// Sources are bucketed by their /32 in IPv4 unless `prefix_v4` says otherwise.
pub const DEFAULT_PREFIX_V4: u8 = 32;
/// Sources are bucketed by their /64 in IPv6 unless `prefix_v6` says otherwise: a /64 is
/// what one subscriber (one LAN, one SLAAC host) gets, so bucketing by /128 would hand
/// anyone with a /64 2^64 fresh buckets.
pub const DEFAULT_PREFIX_V6: u8 = 64;

/// `[rules.per_source]`: a limit per source address (or per source prefix).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PerSourceSpec {
    pub rate: u64,
    pub burst: u64,
    /// Source prefix length that keys a bucket, IPv4 (0..=32).
    pub prefix_v4: u8,
    /// Source prefix length that keys a bucket, IPv6 (0..=128).
    pub prefix_v6: u8,
}

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

impl Config {
    /// In `tc` mode, one line per limit whose burst is below a GRO-built buffer (such a
    /// buffer costs more than the whole bucket holds and is never admitted); empty in
    /// the XDP modes, where a run is one frame.
    pub fn tc_burst_warnings(&self) -> Vec<String> {
        if self.xdp_mode != XdpMode::Tc {
            return Vec::new();
        }
        let mut out = Vec::new();
        for rule in &self.rules {
            let (largest, what) = match rule.unit {
                Unit::Bytes => (GRO_MAX_BYTES, "bytes"),
                Unit::Packets => (GRO_MAX_SEGMENTS, "packets"),
                // A SYN is never coalesced.
                Unit::Syn => continue,
            };
            let limits = [
                ("burst", rule.aggregate.map(|a| a.burst)),
                ("per_source burst", rule.per_source.map(|p| p.burst)),
            ];
            for (field, burst) in limits {
                if let Some(burst) = burst.filter(|&b| b < largest) {
                    out.push(format!(
                        "rule {}: {field} {burst} is below a GRO-built buffer ({largest} {what}); \
                         in tc mode such a buffer is metered whole and never admitted: raise the \
                         burst, or turn GRO off on the interface (ethtool -K IFACE gro off)",
                        rule.name
                    ));
                }
            }
        }
        out
    }
}
