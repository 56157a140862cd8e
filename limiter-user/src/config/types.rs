//! The validated configuration: what [`Config::parse`] returns. Its plain keys are the
//! fields of the schema's generated structs ([`TopKeys`], [`FleetKeys`]), the rest its
//! own; the words and defaults are in `words`.

use std::{
    fmt,
    net::SocketAddr,
    ops::{Deref, DerefMut},
    path::{Path, PathBuf},
};

use ipnet::IpNet;
use limiter_common::{abi, gcra::Granularity};

use super::{
    schema::{FleetKeys, MonitorKeys, TopKeys},
    words::*,
};

/// A validated configuration file.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The top level's plain keys, one schema row each (`xdp_mode`, `pin_dir`,
    /// `fleet_size`, ...), read as `config.xdp_mode` through `Deref`.
    pub keys: TopKeys,
    /// Interfaces to attach to; may be empty (then `--iface` supplies them).
    pub interfaces: Vec<String>,
    /// Prometheus listen address; `None` when `metrics = ""`.
    pub metrics: Option<SocketAddr>,
    /// Rules in file order.
    pub rules: Vec<RuleSpec>,
    /// `[fleet]`: the allocator this host reports to; `None` = standalone (the configured
    /// rates apply locally and no share state machine runs).
    pub fleet: Option<FleetSpec>,
    /// `next_program` / `join_program_array`: where frames the limiter passes go next;
    /// `None`: to the stack, as without a handoff.
    pub handoff: Option<HandoffSpec>,
    /// `[[tunnels]]`: interfaces whose tunnelled frames are classified by the inner
    /// header; none by default.
    pub tunnels: Vec<TunnelSpec>,
    /// `[monitor]`: the sampling budget (off by default).
    pub monitor: MonitorKeys,
}

impl MonitorKeys {
    /// What the program reads (`MONITOR[0]`).
    pub fn to_abi(&self) -> limiter_common::drop::MonitorConfig {
        limiter_common::drop::MonitorConfig {
            events_per_sec: self.events_per_sec,
            snap_len: self.snap_len,
        }
    }
}

/// One `[[tunnels]]` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TunnelSpec {
    pub interface: String,
    pub decapsulate: Vec<Encapsulation>,
}

/// An encapsulation the program can see through (`decapsulate`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encapsulation {
    /// IPv4 in IPv4 or IPv6 (IP protocol 4).
    Ipip,
    /// IPv6 in IPv4 (6in4, sit) or IPv6 (IP protocol 41).
    SixInFour,
    /// GRE carrying IPv4 or IPv6 (IP protocol 47).
    Gre,
    /// Foo-over-UDP to this port: the inner IP header right after the UDP header.
    Fou(u16),
    /// Generic UDP Encapsulation (GUE, version 0 or 1) to this port.
    Gue(u16),
}

impl Encapsulation {
    /// What `decapsulate` accepts, for messages.
    pub const SPELLINGS: &'static str = "\"ipip\", \"6in4\", \"gre\", \"fou:PORT\" or \"gue:PORT\"";

    /// Reads one item of `decapsulate`.
    pub fn parse(word: &str) -> Result<Encapsulation, String> {
        let port = |p: &str| match p.parse::<u16>() {
            Ok(0) | Err(_) => Err(format!("\"{word}\": the port must be 1-65535")),
            Ok(port) => Ok(port),
        };
        match word.split_once(':') {
            None => match word {
                "ipip" => Ok(Encapsulation::Ipip),
                "6in4" => Ok(Encapsulation::SixInFour),
                "gre" => Ok(Encapsulation::Gre),
                _ => Err(format!("\"{word}\" is not one of {}", Self::SPELLINGS)),
            },
            Some(("fou", p)) => port(p).map(Encapsulation::Fou),
            Some(("gue", p)) => port(p).map(Encapsulation::Gue),
            Some(_) => Err(format!("\"{word}\" is not one of {}", Self::SPELLINGS)),
        }
    }

    /// The UDP port it takes, if any.
    pub fn udp_port(self) -> Option<u16> {
        match self {
            Encapsulation::Fou(p) | Encapsulation::Gue(p) => Some(p),
            _ => None,
        }
    }
}

impl fmt::Display for Encapsulation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Encapsulation::Ipip => f.write_str("ipip"),
            Encapsulation::SixInFour => f.write_str("6in4"),
            Encapsulation::Gre => f.write_str("gre"),
            Encapsulation::Fou(p) => write!(f, "fou:{p}"),
            Encapsulation::Gue(p) => write!(f, "gue:{p}"),
        }
    }
}

impl TunnelSpec {
    /// The program's entry for this interface (`TUNNELS`). The checker has held the UDP
    /// ports to `abi::MAX_TUNNEL_UDP_PORTS`.
    pub fn to_abi(&self) -> abi::TunnelConfig {
        let mut config = abi::TunnelConfig::default();
        let mut ports = 0;
        for e in &self.decapsulate {
            match e {
                Encapsulation::Ipip => config.flags |= abi::TUNNEL_IPIP,
                Encapsulation::SixInFour => config.flags |= abi::TUNNEL_IP6,
                Encapsulation::Gre => config.flags |= abi::TUNNEL_GRE,
                Encapsulation::Fou(port) | Encapsulation::Gue(port) => {
                    if ports < abi::MAX_TUNNEL_UDP_PORTS {
                        config.udp_ports[ports] = *port;
                        if matches!(e, Encapsulation::Gue(_)) {
                            config.gue_ports |= 1 << ports;
                        }
                        ports += 1;
                    }
                }
            }
        }
        config
    }
}

// A config's plain keys are its own fields to every reader: the split into a generated
// struct is how the schema declares them once, not a layer readers should see.
impl Deref for Config {
    type Target = TopKeys;

    fn deref(&self) -> &TopKeys {
        &self.keys
    }
}

impl DerefMut for Config {
    fn deref_mut(&mut self) -> &mut TopKeys {
        &mut self.keys
    }
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
    /// The plain keys of `[fleet]`, one schema row each (`ca`, `lease_ttl_ms`, ...), read
    /// as `fleet.ca` through `Deref`.
    pub keys: FleetKeys,
    /// The groups of allocators, in order (never empty): `[fleet] allocator` is one
    /// group named `""`; `[[fleet.groups]]` are sharded allocators, each group granting
    /// its own rules (a rule not yet routed is reported to the first).
    pub groups: Vec<AllocatorGroup>,
    /// This host's fleet-unique id (default: the hostname); `limiter run` refuses to start
    /// unless it is a name of `cert` (`fleet::check_host_identity`).
    pub host_id: String,
    /// Local address for allocator traffic (default: chosen by the kernel).
    pub bind: Option<std::net::IpAddr>,
}

impl Deref for FleetSpec {
    type Target = FleetKeys;

    fn deref(&self) -> &FleetKeys {
        &self.keys
    }
}

impl DerefMut for FleetSpec {
    fn deref_mut(&mut self) -> &mut FleetKeys {
        &mut self.keys
    }
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
    /// `enforce_percent`: the share of sources the rule enforces for ([`Percent::ALL`]
    /// when absent; below it, a canary). Never below `ALL` with [`Mode::Shadow`].
    pub enforce: Percent,
    pub fail_mode: FailMode,
    pub per_source: Option<PerSourceSpec>,
}

impl RuleSpec {
    /// Granularity of this rule's limits ([`Granularity::Byte`] for unit bytes).
    pub fn granularity(&self) -> Granularity {
        self.unit.granularity()
    }
}

/// A percentage in thousandths (`enforce_percent = 2.5` is `Percent(2500)`): exact, so
/// the config, the kernel's threshold and what `stats` prints agree to the digit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Percent(pub u32);

impl Percent {
    /// 100 %.
    pub const ALL: Percent = Percent(limiter_common::canary::ALL);

    /// Reads a decimal number of percent, `0` to `100` with up to three decimals, as
    /// TOML spells an integer or a float (underscores allowed). Exponents, signs other
    /// than `+`, `inf` and `nan` are refused: a percentage is written plainly.
    pub fn parse(text: &str) -> Result<Percent, String> {
        let plain: String = text.chars().filter(|&c| c != '_').collect();
        let digits = plain.strip_prefix('+').unwrap_or(&plain);
        let range = || format!("must be between 0 and 100, got {text}");
        if digits.starts_with('-') {
            return Err(range());
        }
        let (whole, fraction) = digits.split_once('.').unwrap_or((digits, ""));
        let is_digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
        if whole.is_empty() || !is_digits(whole) || !is_digits(fraction) {
            return Err(format!(
                "write the percentage as a plain decimal such as 5 or 2.5, got {text}"
            ));
        }
        let (kept, rest) = fraction.split_at(fraction.len().min(3));
        if rest.bytes().any(|b| b != b'0') {
            return Err(format!(
                "at most three decimals (0.001 % is the smallest step), got {text}"
            ));
        }
        let whole: u64 = whole.trim_start_matches('0').parse().unwrap_or(0);
        if whole > 100 {
            return Err(range());
        }
        let thousandths: u64 = format!("{kept:0<3}").parse().unwrap_or(0);
        let value = whole * 1000 + thousandths;
        if value > u64::from(Self::ALL.0) {
            return Err(range());
        }
        Ok(Percent(value as u32))
    }

    /// The share as a ratio, 0 to 1.
    pub fn ratio(self) -> f64 {
        f64::from(self.0) / f64::from(Self::ALL.0)
    }
}

impl fmt::Display for Percent {
    /// As the config spells it: `5`, `2.5`, `0.125`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (whole, thousandths) = (self.0 / 1000, self.0 % 1000);
        if thousandths == 0 {
            return write!(f, "{whole}");
        }
        let fraction = format!("{thousandths:03}");
        write!(f, "{whole}.{}", fraction.trim_end_matches('0'))
    }
}

impl serde::Serialize for Percent {
    /// A JSON number: an integer when whole (`100`, `5`), else a decimal (`2.5`).
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.0.is_multiple_of(1000) {
            s.serialize_u32(self.0 / 1000)
        } else {
            s.serialize_f64(f64::from(self.0) / 1000.0)
        }
    }
}

impl<'de> serde::Deserialize<'de> for Percent {
    /// A JSON number, rounded to thousandths and held to 0..=100.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let value = <f64 as serde::Deserialize>::deserialize(d)?;
        if !(0.0..=100.0).contains(&value) {
            return Err(serde::de::Error::custom(format!(
                "a percentage must be between 0 and 100, got {value}"
            )));
        }
        Ok(Percent((value * 1000.0).round() as u32))
    }
}

impl Percent {
    /// The share of sources a rule's entry enforces for: none in shadow mode, the
    /// canary's percentage, or all.
    pub fn of_rule(rule: &abi::RuleConfig) -> Percent {
        if rule.flags & abi::RULE_SHADOW != 0 {
            Percent(0)
        } else if rule.flags & abi::RULE_CANARY != 0 {
            Percent(limiter_common::canary::milli_percent(rule.canary_threshold))
        } else {
            Percent::ALL
        }
    }
}

/// A rate in units per second and a burst in units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateSpec {
    pub rate: u64,
    pub burst: u64,
}

/// `[rules.per_source]`: a limit per source address (or per source prefix).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PerSourceSpec {
    pub rate: u64,
    pub burst: u64,
    /// Source prefix length that keys a bucket, IPv4 (0..=32).
    pub prefix_v4: u8,
    /// Source prefix length that keys a bucket, IPv6 (0..=128).
    pub prefix_v6: u8,
    /// What the limit does while the rule's part of the sketch is saturated.
    pub on_saturation: OnSaturation,
}

impl Config {
    /// The interfaces `run` attaches to: `--iface` (`overrides`) when given, else the
    /// config's `interfaces`. `check` asks the same, so both refuse a config that names
    /// none (the packaged one, until edited) unless it joins a load balancer's program.
    pub fn attach_targets(&self, overrides: &[String]) -> Result<Vec<String>, NoInterface> {
        let ifaces = if overrides.is_empty() {
            self.interfaces.clone()
        } else {
            overrides.to_vec()
        };
        let joins = matches!(self.handoff, Some(HandoffSpec::Join { .. }));
        if ifaces.is_empty() && !joins {
            return Err(NoInterface);
        }
        Ok(ifaces)
    }

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

/// A config that names no interface to attach to, with no `--iface` either: bad input
/// (exit status 3), which a restart cannot fix.
#[derive(Debug, thiserror::Error)]
#[error(
    "no interface to attach to: set `interfaces` (e.g. interfaces = [\"eth1\"]) or pass \
     --iface, or join a load balancer's program (`join_program_array`)"
)]
pub struct NoInterface;
