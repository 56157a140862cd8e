//! The TOML configuration file (the README's "Configuration"; key names are a contract).
//!
//! The file is parsed into toml's spanned document tree ([`toml::de::DeTable`], whose keys
//! and values are [`toml::Spanned`]) and then walked by hand rather than through
//! `#[derive(Deserialize)]`: serde stops at the first unknown key or wrong type, while an
//! operator fixing a config wants every problem at once. Every problem carries the byte
//! offset of the key or value it is about, turned into a 1-based line number, and the
//! dotted field path (`rules[1].per_source.burst`). Nothing here touches the system:
//! [`Config::parse`] is pure, [`Config::load`] only reads the file.

use std::{
    collections::BTreeMap,
    fmt,
    net::{IpAddr, SocketAddr},
    ops::Range,
    path::{Path, PathBuf},
    str::FromStr,
};

use ipnet::IpNet;
use limiter_common::{
    abi,
    gcra::{Granularity, Limit, LimitError},
};
pub use limiter_fleet::share::FailMode;
use limiter_fleet::share::{
    DEFAULT_LEASE_TTL_MS, DEFAULT_REPORT_INTERVAL_MS, DEFAULT_STICKY_MAX_S,
};
use toml::{
    de::{DeTable, DeValue},
    Spanned,
};

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

/// Splits `PIN` or `PIN:INDEX` (pure). A suffix after the last ':' made only of digits
/// is the INDEX; anything else is part of the path. `index_required`: PIN alone is an
/// error (join_program_array).
pub fn parse_pin_index(text: &str, index_required: bool) -> Result<(PathBuf, Option<u32>), String> {
    let (pin, index) = match text.rsplit_once(':') {
        Some((pin, digits)) if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) => {
            let index = digits
                .parse::<u32>()
                .map_err(|_| format!("INDEX {digits} is not a slot number (0 to {})", u32::MAX))?;
            (pin, Some(index))
        }
        _ => (text, None),
    };
    if pin.is_empty() {
        return Err("the pin path is empty".into());
    }
    if pin.contains('\0') {
        return Err("the pin path contains a NUL byte".into());
    }
    if !pin.starts_with('/') {
        return Err(format!(
            "\"{pin}\" is not an absolute path (a pin on a bpf filesystem, such as \
             /sys/fs/bpf/katran/root_array)"
        ));
    }
    if index_required && index.is_none() {
        return Err(format!(
            "\"{text}\" has no slot: expected \"PIN:INDEX\", e.g. \"{pin}:0\""
        ));
    }
    Ok((PathBuf::from(pin), index))
}

/// `[fleet]`: where the allocator is and how to reach it. With a fleet, a rule's `rate`
/// and `burst` are its *global* quota, split across hosts by the allocator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetSpec {
    /// The allocator's gRPC address, `address:port`.
    pub allocator: SocketAddr,
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

impl Default for Config {
    /// The configuration of an empty file.
    fn default() -> Self {
        Config {
            interfaces: Vec::new(),
            xdp_mode: XdpMode::Auto,
            xdp_share: XdpShare::Exclusive,
            xdp_priority: DEFAULT_XDP_PRIORITY,
            xdp_share_fallback: XdpShareFallback::None,
            pin_dir: PathBuf::from(DEFAULT_PIN_DIR),
            control_socket: PathBuf::from(DEFAULT_CONTROL_SOCKET),
            metrics: DEFAULT_METRICS.parse().ok(),
            max_sources: abi::DEFAULT_MAX_SOURCES,
            fleet_size: DEFAULT_FLEET_SIZE,
            rules: Vec::new(),
            fleet: None,
            handoff: None,
        }
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

/// A value the config spells as one of a fixed set of words.
pub trait ConfigWord: Copy + 'static {
    /// The key it is the value of, for messages.
    const KEY: &'static str;

    /// Every value, in the order the config documents them.
    fn all() -> &'static [Self];

    /// The spelling in the config file.
    fn spelling(self) -> &'static str;

    /// The value spelled `s`; else a message naming the key, `s` and every spelling.
    fn from_spelling(s: &str) -> Result<Self, String> {
        Self::all()
            .iter()
            .copied()
            .find(|v| v.spelling() == s)
            .ok_or_else(|| unknown_value(Self::KEY, s, Self::all().iter().map(|v| v.spelling())))
    }
}

/// Defines a config enum: its variants, their config spellings, `as_str`, `Display`,
/// `FromStr` and the list of all spellings (for error messages).
macro_rules! config_enum {
    ($(#[$meta:meta])* $name:ident, $what:literal { $($(#[$vmeta:meta])* $variant:ident = $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name {
            $($(#[$vmeta])* $variant),+
        }

        impl $name {
            /// Every value, in the order the config documents them.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The spelling in the config file.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text),+
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl ConfigWord for $name {
            const KEY: &'static str = $what;

            fn all() -> &'static [Self] {
                $name::ALL
            }

            fn spelling(self) -> &'static str {
                self.as_str()
            }
        }

        impl FromStr for $name {
            type Err = String;

            fn from_str(s: &str) -> Result<Self, String> {
                $name::from_spelling(s)
            }
        }
    };
}

fn unknown_value<'a>(what: &str, got: &str, expected: impl Iterator<Item = &'a str>) -> String {
    let expected: Vec<String> = expected.map(|s| format!("\"{s}\"")).collect();
    format!(
        "unknown {what} \"{got}\"; expected one of {}",
        expected.join(", ")
    )
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

/// `fail_mode`: the fleet's own type (limiter_fleet::share::FailMode), spelled here.
impl ConfigWord for FailMode {
    const KEY: &'static str = "fail_mode";

    fn all() -> &'static [Self] {
        FailMode::ALL
    }

    fn spelling(self) -> &'static str {
        self.as_str()
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

/// One thing wrong with a config file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// 1-based line in the file.
    pub line: usize,
    /// Dotted path of the field, e.g. `rules[1].per_source.burst`.
    pub field: String,
    /// Name of the rule the field belongs to, when known.
    pub rule: Option<String>,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.field)?;
        if let Some(rule) = &self.rule {
            write!(f, " ({rule:?})")?;
        }
        write!(f, ": {}", self.message)
    }
}

/// Why a config file was rejected. Its `Display` names the file and line of each problem.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{}: cannot read config: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML; `message` is the toml crate's report.
    #[error("{}", syntax_display(path, *line, message))]
    Syntax {
        path: PathBuf,
        /// 1-based line, when the parser reported a position.
        line: Option<usize>,
        message: String,
    },
    /// The file is TOML but breaks the config's rules; every problem found, by line.
    #[error("{}", invalid_display(path, problems))]
    Invalid {
        path: PathBuf,
        problems: Vec<Problem>,
    },
}

impl ConfigError {
    /// The problems of an `Invalid` config (empty for the other kinds).
    pub fn problems(&self) -> &[Problem] {
        match self {
            ConfigError::Invalid { problems, .. } => problems,
            ConfigError::Read { .. } | ConfigError::Syntax { .. } => &[],
        }
    }
}

fn syntax_display(path: &Path, line: Option<usize>, message: &str) -> String {
    match line {
        Some(line) => format!("{}:{line}: {message}", path.display()),
        None => format!("{}: {message}", path.display()),
    }
}

fn invalid_display(path: &Path, problems: &[Problem]) -> String {
    let lines: Vec<String> = problems
        .iter()
        .map(|p| format!("{}:{}: {p}", path.display(), p.line))
        .collect();
    lines.join("\n")
}

/// The largest socket buffer GRO builds: 64 KiB and (as segments) 64 packets. In `tc`
/// mode one buffer is metered whole, so a burst below it refuses such buffers always.
pub const GRO_MAX_BYTES: u64 = 65_536;
pub const GRO_MAX_SEGMENTS: u64 = 64;

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
    /// Reads and validates the config file at `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Config::parse(&text, path)
    }

    /// Validates `text`; `origin` names the file in error messages.
    pub fn parse(text: &str, origin: &Path) -> Result<Config, ConfigError> {
        let root = DeTable::parse(text).map_err(|err| {
            let line = err.span().map(|span| line_of(text, span.start));
            ConfigError::Syntax {
                path: origin.to_path_buf(),
                line,
                message: err.to_string().trim_end().to_string(),
            }
        })?;
        let mut checker = Checker {
            text,
            problems: Vec::new(),
        };
        let config = checker.config(root.get_ref());
        if checker.problems.is_empty() {
            Ok(config)
        } else {
            let mut problems = checker.problems;
            problems.sort_by_key(|p| p.line);
            Err(ConfigError::Invalid {
                path: origin.to_path_buf(),
                problems,
            })
        }
    }
}

/// 1-based line of byte `offset` in `text`.
fn line_of(text: &str, offset: usize) -> usize {
    let end = offset.min(text.len());
    text.as_bytes()[..end]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

type Value<'i> = Spanned<DeValue<'i>>;

/// Where a problem is and what it belongs to.
#[derive(Clone, Copy)]
struct At<'a> {
    path: &'a str,
    rule: Option<&'a str>,
}

impl<'a> At<'a> {
    fn field(&self, path: &'a str) -> At<'a> {
        At {
            path,
            rule: self.rule,
        }
    }
}

struct Checker<'t> {
    text: &'t str,
    problems: Vec<Problem>,
}

/// What the cross-rule checks need to know about a rule, valid or not: a rule with a
/// bad burst still claims its name and its (dst, dst_port, proto).
struct RuleSite {
    index: usize,
    header_line: usize,
    /// The name, when it is a string.
    name: Option<String>,
    name_line: usize,
    /// (dst, dst_port, proto), when all three parsed.
    key: Option<MatchKey>,
}

type MatchKey = (IpNet, Option<u16>, Proto);

const TOP_KEYS: &[&str] = &[
    "interfaces",
    "xdp_mode",
    "xdp_share",
    "xdp_priority",
    "xdp_share_fallback",
    "pin_dir",
    "control_socket",
    "metrics",
    "max_sources",
    "fleet_size",
    "rules",
    "fleet",
    "next_program",
    "join_program_array",
];

const FLEET_KEYS: &[&str] = &[
    "allocator",
    "server_name",
    "host_id",
    "ca",
    "cert",
    "key",
    "bind",
    "lease_ttl_ms",
    "sticky_max_s",
    "report_interval_ms",
];

const RULE_KEYS: &[&str] = &[
    "name",
    "dst",
    "dst_port",
    "proto",
    "unit",
    "rate",
    "burst",
    "mode",
    "fail_mode",
    "per_source",
];

const PER_SOURCE_KEYS: &[&str] = &["rate", "burst", "prefix_v4", "prefix_v6"];

impl Checker<'_> {
    fn report(&mut self, span: Range<usize>, at: At<'_>, message: impl Into<String>) {
        self.problems.push(Problem {
            line: line_of(self.text, span.start),
            field: at.path.to_string(),
            rule: at.rule.map(str::to_string),
            message: message.into(),
        });
    }

    /// Reports keys of `table` that are not in `known`; `prefix` is the table's path.
    fn unknown_keys(
        &mut self,
        table: &DeTable<'_>,
        known: &[&str],
        prefix: &str,
        rule: Option<&str>,
    ) {
        for (key, _) in table.iter() {
            let key_str: &str = key.get_ref();
            if !known.contains(&key_str) {
                let path = if prefix.is_empty() {
                    key_str.to_string()
                } else {
                    format!("{prefix}.{key_str}")
                };
                self.report(
                    key.span(),
                    At { path: &path, rule },
                    format!(
                        "unknown key \"{key_str}\"; expected one of: {}",
                        known.join(", ")
                    ),
                );
            }
        }
    }

    fn string<'v>(&mut self, value: &'v Value<'_>, at: At<'_>) -> Option<&'v str> {
        match value.get_ref() {
            DeValue::String(s) => Some(s.as_ref()),
            other => {
                self.report(
                    value.span(),
                    at,
                    format!("expected a string, found {}", other.type_str()),
                );
                None
            }
        }
    }

    /// An integer in `min..=max`.
    fn integer(&mut self, value: &Value<'_>, at: At<'_>, min: u64, max: u64) -> Option<u64> {
        let DeValue::Integer(int) = value.get_ref() else {
            self.report(
                value.span(),
                at,
                format!("expected an integer, found {}", value.get_ref().type_str()),
            );
            return None;
        };
        let parsed = i128::from_str_radix(int.as_str(), int.radix()).ok();
        match parsed {
            Some(n) if n >= i128::from(min) && n <= i128::from(max) => u64::try_from(n).ok(),
            _ => {
                let shown = parsed.map_or_else(|| int.to_string(), |n| n.to_string());
                let range = if max == u64::MAX {
                    format!("at least {min}")
                } else {
                    format!("between {min} and {max}")
                };
                self.report(value.span(), at, format!("must be {range}, got {shown}"));
                None
            }
        }
    }

    fn enumeration<E: ConfigWord>(&mut self, value: &Value<'_>, at: At<'_>) -> Option<E> {
        let s = self.string(value, at)?;
        match E::from_spelling(s) {
            Ok(v) => Some(v),
            Err(message) => {
                self.report(value.span(), at, message);
                None
            }
        }
    }

    fn path(&mut self, value: &Value<'_>, at: At<'_>) -> Option<PathBuf> {
        let s = self.string(value, at)?;
        if s.is_empty() {
            self.report(value.span(), at, "must not be empty");
            return None;
        }
        Some(PathBuf::from(s))
    }

    fn config(&mut self, root: &DeTable<'_>) -> Config {
        let mut config = Config::default();
        self.unknown_keys(root, TOP_KEYS, "", None);
        let top = |path| At { path, rule: None };

        if let Some(value) = root.get("interfaces") {
            config.interfaces = self.interfaces(value);
        }
        if let Some(value) = root.get("xdp_mode") {
            if let Some(mode) = self.enumeration(value, top("xdp_mode")) {
                config.xdp_mode = mode;
            }
        }
        if let Some(value) = root.get("xdp_share") {
            if let Some(share) = self.enumeration(value, top("xdp_share")) {
                config.xdp_share = share;
            }
        }
        if let Some(value) = root.get("xdp_priority") {
            if let Some(n) = self.integer(value, top("xdp_priority"), 0, u64::from(u32::MAX)) {
                config.xdp_priority = u32::try_from(n).unwrap_or(u32::MAX);
            }
        }
        if let Some(value) = root.get("xdp_share_fallback") {
            if let Some(fallback) = self.enumeration(value, top("xdp_share_fallback")) {
                config.xdp_share_fallback = fallback;
            }
        }
        if config.xdp_share == XdpShare::Libxdp && config.xdp_mode == XdpMode::Tc {
            if let Some(value) = root.get("xdp_share") {
                self.report(
                    value.span(),
                    top("xdp_share"),
                    "xdp_share = \"libxdp\" shares the XDP hook, and xdp_mode = \"tc\" does not \
                     use it: choose xdp_mode auto, native or generic, or xdp_share = \"exclusive\"",
                );
            }
        }
        if config.xdp_share != XdpShare::Libxdp {
            if let Some(value) = root.get("xdp_priority") {
                self.report(
                    value.span(),
                    top("xdp_priority"),
                    "xdp_priority is the run priority in a libxdp dispatcher: it needs \
                     xdp_share = \"libxdp\"",
                );
            }
            if let Some(value) = root.get("xdp_share_fallback") {
                self.report(
                    value.span(),
                    top("xdp_share_fallback"),
                    "xdp_share_fallback says what xdp_share = \"libxdp\" does where the \
                     kernel refuses freplace: it needs xdp_share = \"libxdp\"",
                );
            }
        }
        if let Some(value) = root.get("pin_dir") {
            if let Some(path) = self.path(value, top("pin_dir")) {
                config.pin_dir = path;
            }
        }
        if let Some(value) = root.get("control_socket") {
            if let Some(path) = self.path(value, top("control_socket")) {
                config.control_socket = path;
            }
        }
        if let Some(value) = root.get("metrics") {
            if let Some(s) = self.string(value, top("metrics")) {
                if s.is_empty() {
                    config.metrics = None;
                } else {
                    match s.parse::<SocketAddr>() {
                        Ok(addr) => config.metrics = Some(addr),
                        Err(_) => self.report(
                            value.span(),
                            top("metrics"),
                            format!(
                                "\"{s}\" is not an address:port such as \"{DEFAULT_METRICS}\" \
                                 or \"[::1]:9464\" (use \"\" to disable metrics)"
                            ),
                        ),
                    }
                }
            }
        }
        if let Some(value) = root.get("max_sources") {
            if let Some(n) = self.integer(value, top("max_sources"), 1, u64::from(MAX_MAX_SOURCES))
            {
                config.max_sources = u32::try_from(n).unwrap_or(MAX_MAX_SOURCES);
            }
        }
        if let Some(value) = root.get("fleet_size") {
            if let Some(n) = self.integer(value, top("fleet_size"), 1, u64::from(u32::MAX)) {
                config.fleet_size = u32::try_from(n).unwrap_or(u32::MAX);
            }
        }
        if let Some(value) = root.get("rules") {
            config.rules = self.rules(value);
        }
        if let Some(value) = root.get("fleet") {
            config.fleet = self.fleet(value);
        }
        config.handoff = self.handoff(root, &config);
        config
    }

    /// `next_program` and `join_program_array` (at most one of them), checked against
    /// the keys they depend on.
    fn handoff(&mut self, root: &DeTable<'_>, config: &Config) -> Option<HandoffSpec> {
        let top = |path| At { path, rule: None };
        let next = root.get("next_program");
        let join = root.get("join_program_array");
        if let (Some(_), Some(join)) = (next, join) {
            self.report(
                join.span(),
                top("join_program_array"),
                "set together with next_program: choose one (next_program: the limiter runs \
                 on the hook and calls the LB; join_program_array: the LB's root program \
                 calls the limiter)",
            );
            return None;
        }
        let (key, value) = match (next, join) {
            (Some(v), None) => ("next_program", v),
            (None, Some(v)) => ("join_program_array", v),
            _ => return None,
        };
        let text = self.string(value, top(key))?;
        let spec = match parse_pin_index(text, key == "join_program_array") {
            Ok((pin, None)) => HandoffSpec::Program(pin),
            Ok((array, Some(index))) if key == "next_program" => HandoffSpec::Slot { array, index },
            Ok((array, Some(index))) => HandoffSpec::Join { array, index },
            Err(message) => {
                self.report(value.span(), top(key), message);
                return None;
            }
        };
        if config.xdp_mode == XdpMode::Tc {
            self.report(
                value.span(),
                top(key),
                "not with xdp_mode = \"tc\": the TC build cannot tail-call an XDP program \
                 (the kernel refuses calls across program types); use xdp_mode \"auto\", \
                 \"native\" or \"generic\"",
            );
            return None;
        }
        if config.xdp_share == XdpShare::Libxdp {
            self.report(
                value.span(),
                top(key),
                "not with xdp_share = \"libxdp\": in a libxdp dispatcher the next component \
                 gets what the limiter passes; a tail call would skip it. Use one way of \
                 sharing: the dispatcher (xdp_share) or the handoff (this key)",
            );
            return None;
        }
        if matches!(spec, HandoffSpec::Join { .. }) && !config.interfaces.is_empty() {
            self.report(
                value.span(),
                top(key),
                "not with interfaces: the LB's root program runs on the interfaces and calls \
                 the limiter from its array; attaching the limiter too would meter every \
                 frame twice (leave interfaces empty)",
            );
            return None;
        }
        Some(spec)
    }

    fn fleet(&mut self, value: &Value<'_>) -> Option<FleetSpec> {
        let top = |path| At { path, rule: None };
        let DeValue::Table(table) = value.get_ref() else {
            self.report(
                value.span(),
                top("fleet"),
                format!("expected a table, found {}", value.get_ref().type_str()),
            );
            return None;
        };
        self.unknown_keys(table, FLEET_KEYS, "fleet", None);
        let before = self.problems.len();
        let required_path =
            |this: &mut Self, key: &'static str, path: &'static str| match table.get(key) {
                Some(v) => this.path(v, top(path)),
                None => {
                    this.report(
                        value.span(),
                        top(path),
                        format!("{key} is required in [fleet]"),
                    );
                    None
                }
            };
        let ca = required_path(self, "ca", "fleet.ca");
        let cert = required_path(self, "cert", "fleet.cert");
        let key = required_path(self, "key", "fleet.key");
        let allocator = match table.get("allocator") {
            Some(v) => {
                self.string(v, top("fleet.allocator"))
                    .and_then(|s| match s.parse::<SocketAddr>() {
                        Ok(a) => Some(a),
                        Err(_) => {
                            self.report(
                                v.span(),
                                top("fleet.allocator"),
                                format!(
                                    "\"{s}\" is not an address:port such as \"198.18.0.1:7443\""
                                ),
                            );
                            None
                        }
                    })
            }
            None => {
                self.report(
                    value.span(),
                    top("fleet.allocator"),
                    "allocator is required in [fleet]",
                );
                None
            }
        };
        let server_name = match table.get("server_name") {
            Some(v) => self.string(v, top("fleet.server_name")).map(str::to_string),
            None => Some("limiter-allocator".to_string()),
        };
        let host_id = match table.get("host_id") {
            Some(v) => self.string(v, top("fleet.host_id")).map(str::to_string),
            None => Some(default_host_id()),
        };
        if let (Some(id), Some(v)) = (&host_id, table.get("host_id")) {
            if let Err(e) = check_rule_name(id) {
                self.report(
                    v.span(),
                    top("fleet.host_id"),
                    e.replace("rule name", "host id"),
                );
            }
        }
        let bind = match table.get("bind") {
            Some(v) => self
                .string(v, top("fleet.bind"))
                .and_then(|s| match s.parse() {
                    Ok(ip) => Some(Some(ip)),
                    Err(_) => {
                        self.report(
                            v.span(),
                            top("fleet.bind"),
                            format!("\"{s}\" is not an IP address"),
                        );
                        None
                    }
                }),
            None => Some(None),
        };
        let ms =
            |this: &mut Self, key: &'static str, path: &'static str, default: u64, max: u64| {
                match table.get(key) {
                    Some(v) => this.integer(v, top(path), 1, max),
                    None => Some(default),
                }
            };
        let lease_ttl_ms = ms(
            self,
            "lease_ttl_ms",
            "fleet.lease_ttl_ms",
            DEFAULT_LEASE_TTL_MS,
            3_600_000,
        );
        let sticky_max_s = ms(
            self,
            "sticky_max_s",
            "fleet.sticky_max_s",
            DEFAULT_STICKY_MAX_S,
            86_400 * 30,
        );
        let report_interval_ms = ms(
            self,
            "report_interval_ms",
            "fleet.report_interval_ms",
            DEFAULT_REPORT_INTERVAL_MS,
            3_600_000,
        );
        if let (Some(ttl), Some(interval)) = (lease_ttl_ms, report_interval_ms) {
            if interval >= ttl {
                let at = table
                    .get("report_interval_ms")
                    .map_or(value.span(), |v| v.span());
                self.report(at, top("fleet.report_interval_ms"), format!("must be below lease_ttl_ms ({ttl}) so leases are renewed before they lapse"));
            }
        }
        if self.problems.len() != before {
            return None;
        }
        Some(FleetSpec {
            allocator: allocator?,
            server_name: server_name?,
            host_id: host_id?,
            ca: ca?,
            cert: cert?,
            key: key?,
            bind: bind?,
            lease_ttl_ms: lease_ttl_ms?,
            sticky_max_s: sticky_max_s?,
            report_interval_ms: report_interval_ms?,
        })
    }

    fn interfaces(&mut self, value: &Value<'_>) -> Vec<String> {
        let at = At {
            path: "interfaces",
            rule: None,
        };
        let DeValue::Array(items) = value.get_ref() else {
            self.report(
                value.span(),
                at,
                format!(
                    "expected an array of interface names, found {}",
                    value.get_ref().type_str()
                ),
            );
            return Vec::new();
        };
        let mut names: Vec<String> = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let path = format!("interfaces[{i}]");
            let Some(name) = self.string(item, at.field(&path)) else {
                continue;
            };
            if let Err(why) = check_interface_name(name) {
                self.report(item.span(), at.field(&path), why);
            } else if names.iter().any(|n| n == name) {
                self.report(
                    item.span(),
                    at.field(&path),
                    format!("interface \"{name}\" is listed twice"),
                );
            } else {
                names.push(name.to_string());
            }
        }
        names
    }

    fn rules(&mut self, value: &Value<'_>) -> Vec<RuleSpec> {
        let at = At {
            path: "rules",
            rule: None,
        };
        let DeValue::Array(items) = value.get_ref() else {
            self.report(
                value.span(),
                at,
                format!(
                    "expected an array of tables ([[rules]]), found {}",
                    value.get_ref().type_str()
                ),
            );
            return Vec::new();
        };
        if items.len() > abi::MAX_RULES as usize {
            let span = items
                .get(abi::MAX_RULES as usize)
                .map_or_else(|| value.span(), Spanned::span);
            self.report(
                span,
                at,
                format!(
                    "at most {} rules are supported, found {}",
                    abi::MAX_RULES,
                    items.len()
                ),
            );
        }
        let mut rules: Vec<RuleSpec> = Vec::new();
        let mut sites: Vec<RuleSite> = Vec::new();
        for (index, item) in items.iter().enumerate() {
            let (rule, site) = self.rule(index, item);
            rules.extend(rule);
            sites.extend(site);
        }
        self.cross_rule_checks(&sites);
        rules
    }

    fn cross_rule_checks(&mut self, sites: &[RuleSite]) {
        let mut by_name: BTreeMap<&str, &RuleSite> = BTreeMap::new();
        let mut by_match: BTreeMap<MatchKey, &RuleSite> = BTreeMap::new();
        for site in sites {
            let Some(name) = site.name.as_deref() else {
                continue;
            };
            if let Some(first) = by_name.get(name) {
                let message = format!(
                    "name \"{name}\" is already used by rules[{}] (line {}); rule names must be \
                     unique",
                    first.index, first.name_line
                );
                self.problems.push(Problem {
                    line: site.name_line,
                    field: format!("rules[{}].name", site.index),
                    rule: Some(name.to_string()),
                    message,
                });
            } else {
                by_name.insert(name, site);
            }

            let Some(key) = site.key else {
                continue;
            };
            if let Some(first) = by_match.get(&key) {
                let (dst, port, proto) = key;
                let port = port.map_or_else(|| "any".to_string(), |p| p.to_string());
                let message = format!(
                    "ambiguous: rules[{}] ({:?}, line {}) and this rule both match dst {dst}, \
                     dst_port {port}, proto {proto}; a packet must match one most specific \
                     rule, so merge them or make one more specific",
                    first.index,
                    first.name.as_deref().unwrap_or_default(),
                    first.header_line,
                );
                self.problems.push(Problem {
                    line: site.header_line,
                    field: format!("rules[{}]", site.index),
                    rule: Some(name.to_string()),
                    message,
                });
            } else {
                by_match.insert(key, site);
            }
        }
    }

    /// Parses and checks one rule. The spec is `None` when any of its fields is wrong (the
    /// problems are recorded); the site is `None` when the rule is not even a table.
    fn rule(&mut self, index: usize, value: &Value<'_>) -> (Option<RuleSpec>, Option<RuleSite>) {
        let prefix = format!("rules[{index}]");
        let DeValue::Table(table) = value.get_ref() else {
            self.report(
                value.span(),
                At {
                    path: &prefix,
                    rule: None,
                },
                format!("expected a table, found {}", value.get_ref().type_str()),
            );
            return (None, None);
        };
        let before = self.problems.len();
        let header_span = value.span();
        let header_line = line_of(self.text, header_span.start);

        // The name first: every other problem of the rule is labelled with it.
        let name_path = format!("{prefix}.name");
        let name_value = table.get("name");
        let name: Option<&str> = match name_value {
            Some(v) => match v.get_ref() {
                DeValue::String(s) => Some(s.as_ref()),
                _ => None,
            },
            None => None,
        };
        let at = At {
            path: &prefix,
            rule: name,
        };
        self.unknown_keys(table, RULE_KEYS, &prefix, name);
        let name_line = match name_value {
            Some(v) => {
                if let Some(s) = self.string(v, at.field(&name_path)) {
                    if let Err(why) = check_rule_name(s) {
                        self.report(v.span(), at.field(&name_path), why);
                    }
                }
                line_of(self.text, v.span().start)
            }
            None => {
                self.report(
                    header_span.clone(),
                    at.field(&name_path),
                    "name is required",
                );
                header_line
            }
        };

        let field = |key: &str| format!("{prefix}.{key}");
        let dst_path = field("dst");
        let dst = match table.get("dst") {
            Some(v) => self
                .string(v, at.field(&dst_path))
                .and_then(|s| match parse_dst(s) {
                    Ok(net) => Some(net),
                    Err(why) => {
                        self.report(v.span(), at.field(&dst_path), why);
                        None
                    }
                }),
            None => {
                self.report(
                    header_span.clone(),
                    at.field(&dst_path),
                    "dst is required (a destination prefix such as \"203.0.113.0/24\")",
                );
                None
            }
        };
        let port_path = field("dst_port");
        let port_value = table.get("dst_port");
        let dst_port = port_value
            .and_then(|v| self.integer(v, at.field(&port_path), 1, u64::from(u16::MAX)))
            .and_then(|p| u16::try_from(p).ok());
        let proto_path = field("proto");
        let proto_value = table.get("proto");
        let proto: Option<Proto> = match proto_value {
            Some(v) => self.enumeration(v, at.field(&proto_path)),
            None => Some(Proto::Any),
        };
        let unit_path = field("unit");
        let unit_value = table.get("unit");
        let unit: Option<Unit> = match unit_value {
            Some(v) => self.enumeration(v, at.field(&unit_path)),
            None => Some(Unit::Packets),
        };
        let mode_path = field("mode");
        let mode: Option<Mode> = match table.get("mode") {
            Some(v) => self.enumeration(v, at.field(&mode_path)),
            None => Some(Mode::Enforce),
        };
        let fail_path = field("fail_mode");
        let fail_mode: Option<FailMode> = match table.get("fail_mode") {
            Some(v) => self.enumeration(v, at.field(&fail_path)),
            None => Some(FailMode::Open),
        };

        if let (Some(port_value), Some(Proto::Icmp)) = (port_value, proto) {
            self.report(
                port_value.span(),
                at.field(&port_path),
                "dst_port is not allowed with proto \"icmp\" (ICMP has no ports)",
            );
        }
        if let (Some(Unit::Syn), Some(proto @ (Proto::Udp | Proto::Icmp))) = (unit, proto) {
            let span = unit_value.map_or_else(|| header_span.clone(), Spanned::span);
            self.report(
                span,
                at.field(&unit_path),
                format!("unit \"syn\" requires proto \"tcp\" or \"any\", not \"{proto}\""),
            );
        }

        // Aggregate limit.
        let rate_path = field("rate");
        let burst_path = field("burst");
        let rate_value = table.get("rate");
        let burst_value = table.get("burst");
        let rate = rate_value.and_then(|v| self.integer(v, at.field(&rate_path), 0, u64::MAX));
        let burst = burst_value.and_then(|v| self.integer(v, at.field(&burst_path), 0, u64::MAX));
        match (rate_value, burst_value) {
            (Some(rate_value), None) => self.report(
                rate_value.span(),
                at.field(&burst_path),
                "burst is required when rate is set",
            ),
            (None, Some(burst_value)) => self.report(
                burst_value.span(),
                at.field(&burst_path),
                "burst is not allowed without rate (the aggregate limit needs both)",
            ),
            _ => {}
        }
        let aggregate = match (rate_value, rate, burst_value, burst, unit) {
            (Some(rv), Some(rate), Some(bv), Some(burst), Some(unit)) => self
                .limit(
                    unit,
                    (rv, rate, at.field(&rate_path)),
                    (bv, burst, at.field(&burst_path)),
                )
                .map(|()| RateSpec { rate, burst }),
            _ => None,
        };

        // Per-source limit.
        let per_path = field("per_source");
        let per_source_value = table.get("per_source");
        let per_source =
            per_source_value.and_then(|v| self.per_source(v, at.field(&per_path), unit));

        if rate_value.is_none() && per_source_value.is_none() {
            self.report(
                header_span,
                at,
                "a rule needs an aggregate limit (rate and burst), a [rules.per_source] \
                 limit, or both",
            );
        }

        let port_ok = port_value.is_none() || dst_port.is_some();
        let site = RuleSite {
            index,
            header_line,
            name: name.map(str::to_string),
            name_line,
            key: match (dst, proto) {
                (Some(dst), Some(proto)) if port_ok => Some((dst, dst_port, proto)),
                _ => None,
            },
        };
        if self.problems.len() != before {
            return (None, Some(site));
        }
        let spec = || -> Option<RuleSpec> {
            Some(RuleSpec {
                name: name?.to_string(),
                dst: dst?,
                dst_port,
                proto: proto?,
                unit: unit?,
                aggregate,
                mode: mode?,
                fail_mode: fail_mode?,
                per_source,
            })
        };
        (spec(), Some(site))
    }

    /// Checks that a rate/burst pair compiles in `unit`; reports on the offending field.
    fn limit(
        &mut self,
        unit: Unit,
        (rate_value, rate, rate_at): (&Value<'_>, u64, At<'_>),
        (burst_value, burst, burst_at): (&Value<'_>, u64, At<'_>),
    ) -> Option<()> {
        if unit == Unit::Bytes && burst < MIN_BYTES_BURST {
            self.report(
                burst_value.span(),
                burst_at,
                format!(
                    "in unit \"bytes\" the burst must be at least {MIN_BYTES_BURST} (one full \
                     Ethernet frame; a larger frame than the burst could never pass), got {burst}"
                ),
            );
            return None;
        }
        match Limit::new(unit.granularity(), rate, burst) {
            Ok(_) => Some(()),
            Err(err @ (LimitError::RateZero | LimitError::RateTooHigh)) => {
                self.report(rate_value.span(), rate_at, err.to_string());
                None
            }
            Err(err @ (LimitError::BurstZero | LimitError::BurstTooLong)) => {
                self.report(burst_value.span(), burst_at, err.to_string());
                None
            }
        }
    }

    /// `unit` is `None` when the rule's unit is invalid: the limit is then not checked.
    fn per_source(
        &mut self,
        value: &Value<'_>,
        at: At<'_>,
        unit: Option<Unit>,
    ) -> Option<PerSourceSpec> {
        let DeValue::Table(table) = value.get_ref() else {
            self.report(
                value.span(),
                at,
                format!("expected a table, found {}", value.get_ref().type_str()),
            );
            return None;
        };
        let prefix = at.path;
        self.unknown_keys(table, PER_SOURCE_KEYS, prefix, at.rule);
        let before = self.problems.len();
        let field = |key: &str| format!("{prefix}.{key}");
        let (rate_path, burst_path) = (field("rate"), field("burst"));
        let (v4_path, v6_path) = (field("prefix_v4"), field("prefix_v6"));

        let rate_value = table.get("rate");
        let burst_value = table.get("burst");
        let rate = match rate_value {
            Some(v) => self.integer(v, at.field(&rate_path), 0, u64::MAX),
            None => {
                self.report(value.span(), at.field(&rate_path), "rate is required");
                None
            }
        };
        let burst = match burst_value {
            Some(v) => self.integer(v, at.field(&burst_path), 0, u64::MAX),
            None => {
                self.report(value.span(), at.field(&burst_path), "burst is required");
                None
            }
        };
        let prefix_v4 = match table.get("prefix_v4") {
            Some(v) => self.integer(v, at.field(&v4_path), 0, 32),
            None => Some(u64::from(DEFAULT_PREFIX_V4)),
        };
        let prefix_v6 = match table.get("prefix_v6") {
            Some(v) => self.integer(v, at.field(&v6_path), 0, 128),
            None => Some(u64::from(DEFAULT_PREFIX_V6)),
        };
        if let (Some(rv), Some(rate), Some(bv), Some(burst), Some(unit)) =
            (rate_value, rate, burst_value, burst, unit)
        {
            self.limit(
                unit,
                (rv, rate, at.field(&rate_path)),
                (bv, burst, at.field(&burst_path)),
            );
        }
        if self.problems.len() != before {
            return None;
        }
        Some(PerSourceSpec {
            rate: rate?,
            burst: burst?,
            prefix_v4: u8::try_from(prefix_v4?).ok()?,
            prefix_v6: u8::try_from(prefix_v6?).ok()?,
        })
    }
}

/// The kernel's hostname, the default fleet host id.
fn default_host_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| check_rule_name(s).is_ok())
        .unwrap_or_else(|| "localhost".to_string())
}

/// 1..=63 bytes of `[A-Za-z0-9._-]`.
fn check_rule_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("name must not be empty".to_string());
    }
    if name.len() > MAX_RULE_NAME_LEN {
        return Err(format!(
            "name is {} bytes long; at most {MAX_RULE_NAME_LEN} are allowed",
            name.len()
        ));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!(
            "name contains {bad:?}; only letters, digits, '.', '_' and '-' are allowed"
        ));
    }
    Ok(())
}

/// The kernel's rule for interface names (`dev_valid_name`).
fn check_interface_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("interface name must not be empty".to_string());
    }
    if name.len() > 15 {
        return Err(format!("interface name \"{name}\" is longer than 15 bytes"));
    }
    if name == "."
        || name == ".."
        || name
            .chars()
            .any(|c| c == '/' || c == ':' || c.is_whitespace())
    {
        return Err(format!("\"{name}\" is not a valid interface name"));
    }
    Ok(())
}

/// A prefix such as `203.0.113.0/24`, or a bare address (/32 or /128). Host bits must be
/// clear: `203.0.113.10/24` is most likely a typo, so it is rejected with the network form.
pub fn parse_dst(text: &str) -> Result<IpNet, String> {
    let text = text.trim();
    if text.contains('/') {
        let net: IpNet = text.parse().map_err(|_| {
            format!(
                "\"{text}\" is not a prefix; expected an IPv4 or IPv6 prefix such as \
                 \"203.0.113.0/24\" or \"2001:db8::/32\", or a bare address"
            )
        })?;
        if net.trunc() != net {
            return Err(format!(
                "\"{text}\" has host bits set; did you mean \"{}\"?",
                net.trunc()
            ));
        }
        Ok(net)
    } else {
        let addr: IpAddr = text.parse().map_err(|_| {
            format!(
                "\"{text}\" is not an address or prefix; expected an IPv4 or IPv6 prefix such \
                 as \"203.0.113.0/24\" or \"2001:db8::/32\", or a bare address"
            )
        })?;
        Ok(IpNet::from(addr))
    }
}

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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    const ORIGIN: &str = "/etc/limiter.toml";

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, Path::new(ORIGIN))
    }

    /// 1-based line of the first line of `text` containing `needle` (the n-th when
    /// `nth > 0`).
    fn line(text: &str, needle: &str, nth: usize) -> usize {
        text.lines()
            .enumerate()
            .filter(|(_, l)| l.contains(needle))
            .nth(nth)
            .map(|(i, _)| i + 1)
            .unwrap_or_else(|| panic!("{needle:?} not in test text"))
    }

    /// Asserts that the error (Display) has a line `ORIGIN:line: field ("rule"): …msg…`.
    fn assert_problem(err: &ConfigError, line: usize, field: &str, rule: Option<&str>, msg: &str) {
        let rendered = err.to_string();
        let mut head = format!("{ORIGIN}:{line}: {field}");
        if let Some(rule) = rule {
            head.push_str(&format!(" ({rule:?})"));
        }
        head.push_str(": ");
        assert!(
            rendered
                .lines()
                .any(|l| l.starts_with(&head) && l.contains(msg)),
            "expected a line starting {head:?} containing {msg:?} in:\n{rendered}"
        );
    }

    fn only_problem(text: &str, needle: &str, field: &str, rule: Option<&str>, msg: &str) {
        let err = parse(text).unwrap_err();
        assert_eq!(err.problems().len(), 1, "{err}");
        assert_problem(&err, line(text, needle, 0), field, rule, msg);
    }

    const FULL: &str = r#"
interfaces = ["eth0", "eth1"]
xdp_mode = "native"
pin_dir = "/sys/fs/bpf/lim"
control_socket = "/run/lim.sock"
metrics = "[::1]:9000"
max_sources = 4096
fleet_size = 3

[[rules]]
name = "contoso-web"
dst = "203.0.113.10/32"
dst_port = 443
proto = "tcp"
unit = "packets"
rate = 10000
burst = 2000
mode = "enforce"
fail_mode = "open"
[rules.per_source]
rate = 100
burst = 20
prefix_v4 = 24
prefix_v6 = 64

[[rules]]
name = "v6.bytes_1"
dst = "2001:db8::1"
unit = "bytes"
rate = 125_000_000
burst = 0x3000
mode = "shadow"
fail_mode = "static"

[[rules]]
name = "syn-guard"
dst = "198.18.0.0/15"
unit = "syn"
per_source = { rate = 5, burst = 10 }

[[rules]]
name = "ping"
dst = "2001:db8::/32"
proto = "icmp"
rate = 10
burst = 10
"#;

    #[test]
    fn full_example() {
        let c = parse(FULL).unwrap();
        assert_eq!(c.interfaces, ["eth0", "eth1"]);
        assert_eq!(c.xdp_mode, XdpMode::Native);
        assert_eq!(c.pin_dir, PathBuf::from("/sys/fs/bpf/lim"));
        assert_eq!(c.control_socket, PathBuf::from("/run/lim.sock"));
        assert_eq!(c.metrics, Some("[::1]:9000".parse().unwrap()));
        assert_eq!(c.max_sources, 4096);
        assert_eq!(c.fleet_size, 3);
        assert_eq!(c.rules.len(), 4);
        assert_eq!(
            c.rules[0],
            RuleSpec {
                name: "contoso-web".into(),
                dst: "203.0.113.10/32".parse().unwrap(),
                dst_port: Some(443),
                proto: Proto::Tcp,
                unit: Unit::Packets,
                aggregate: Some(RateSpec {
                    rate: 10000,
                    burst: 2000
                }),
                mode: Mode::Enforce,
                fail_mode: FailMode::Open,
                per_source: Some(PerSourceSpec {
                    rate: 100,
                    burst: 20,
                    prefix_v4: 24,
                    prefix_v6: 64
                }),
            }
        );
        assert_eq!(
            c.rules[1],
            RuleSpec {
                name: "v6.bytes_1".into(),
                dst: "2001:db8::1/128".parse().unwrap(),
                dst_port: None,
                proto: Proto::Any,
                unit: Unit::Bytes,
                aggregate: Some(RateSpec {
                    rate: 125_000_000,
                    burst: 0x3000
                }),
                mode: Mode::Shadow,
                fail_mode: FailMode::Static,
                per_source: None,
            }
        );
        assert_eq!(c.rules[2].unit, Unit::Syn);
        assert_eq!(c.rules[2].aggregate, None);
        assert_eq!(
            c.rules[2].per_source,
            Some(PerSourceSpec {
                rate: 5,
                burst: 10,
                prefix_v4: 32,
                prefix_v6: 64
            })
        );
        assert_eq!(c.rules[3].proto, Proto::Icmp);
    }

    #[test]
    fn defaults() {
        let c = parse("").unwrap();
        assert_eq!(c, Config::default());
        assert_eq!(c.metrics, Some("127.0.0.1:9464".parse().unwrap()));
        assert_eq!(c.pin_dir, PathBuf::from("/sys/fs/bpf/limiter"));
        assert_eq!(c.control_socket, PathBuf::from("/run/limiter/limiter.sock"));
        assert_eq!(c.max_sources, 1_048_576);
        assert_eq!(c.fleet_size, 500);
        assert_eq!(c.xdp_mode, XdpMode::Auto);
        let c = parse("metrics = \"\"\ninterfaces = []\n").unwrap();
        assert_eq!(c.metrics, None);
        let c =
            parse("[[rules]]\nname = \"a\"\ndst = \"198.18.0.1\"\nrate = 1\nburst = 1\n").unwrap();
        let r = &c.rules[0];
        assert_eq!(
            (r.proto, r.unit, r.mode, r.fail_mode, r.dst_port),
            (
                Proto::Any,
                Unit::Packets,
                Mode::Enforce,
                FailMode::Open,
                None
            )
        );
        assert_eq!(r.dst, "198.18.0.1/32".parse::<IpNet>().unwrap());
    }

    #[test]
    fn enum_spellings_round_trip() {
        for m in XdpMode::ALL {
            assert_eq!(m.as_str().parse::<XdpMode>(), Ok(*m));
        }
        for p in Proto::ALL {
            assert_eq!(p.as_str().parse::<Proto>(), Ok(*p));
        }
        for u in Unit::ALL {
            assert_eq!(u.as_str().parse::<Unit>(), Ok(*u));
        }
        assert_eq!(Mode::Shadow.as_str(), "shadow");
        assert_eq!(FailMode::Static.as_str(), "static");
        assert!("TCP".parse::<Proto>().is_err());
    }

    /// `fail_mode` is the fleet's type (limiter_fleet::share::FailMode) read through
    /// [`ConfigWord`]: every spelling reads back as its value, and a wrong one gets the
    /// message every config enum gives.
    #[test]
    fn fail_mode_is_read_with_the_fleets_spellings() {
        for mode in FailMode::ALL {
            let text = rule(&format!(
                "dst = \"198.18.0.0/15\"\nfail_mode = \"{mode}\"\nrate = 1\nburst = 1",
                mode = mode.as_str()
            ));
            assert_eq!(parse(&text).unwrap().rules[0].fail_mode, *mode);
        }
        let text = rule("dst = \"198.18.0.0/15\"\nfail_mode = \"closed\"\nrate = 1\nburst = 1");
        only_problem(
            &text,
            "fail_mode",
            "rules[0].fail_mode",
            Some("contoso-web"),
            "unknown fail_mode \"closed\"; expected one of \"open\", \"static\"",
        );
    }

    /// A rule body with placeholders replaced; every test below changes one thing.
    fn rule(extra: &str) -> String {
        format!("# leading comment\n\n[[rules]]\nname = \"contoso-web\"\n{extra}\n")
    }

    #[test]
    fn burst_required_with_rate() {
        let text = rule("dst = \"203.0.113.10\"\nrate = 10");
        only_problem(
            &text,
            "rate = 10",
            "rules[0].burst",
            Some("contoso-web"),
            "burst is required when rate is set",
        );
        // The exact rendering of the contract's example.
        let err = parse(&text).unwrap_err();
        assert_eq!(
            err.to_string(),
            "/etc/limiter.toml:6: rules[0].burst (\"contoso-web\"): burst is required when rate is set"
        );
    }

    #[test]
    fn burst_forbidden_without_rate() {
        let text = rule("dst = \"203.0.113.10\"\nburst = 10\nper_source = { rate = 1, burst = 1 }");
        only_problem(
            &text,
            "burst = 10",
            "rules[0].burst",
            Some("contoso-web"),
            "not allowed without rate",
        );
    }

    #[test]
    fn rule_needs_a_limit() {
        let text = rule("dst = \"203.0.113.10\"");
        only_problem(
            &text,
            "[[rules]]",
            "rules[0]",
            Some("contoso-web"),
            "needs an aggregate limit",
        );
    }

    #[test]
    fn name_and_dst_required() {
        let text = "\n[[rules]]\nrate = 1\nburst = 1\n";
        let err = parse(text).unwrap_err();
        assert_eq!(err.problems().len(), 2, "{err}");
        assert_problem(&err, 2, "rules[0].name", None, "name is required");
        assert_problem(&err, 2, "rules[0].dst", None, "dst is required");
    }

    #[test]
    fn bad_names() {
        for (name, msg) in [
            ("", "must not be empty"),
            ("has space", "only letters, digits"),
            ("ünïcode", "only letters, digits"),
            (&"x".repeat(64), "at most 63"),
        ] {
            let text =
                rule("dst = \"198.18.0.0/15\"\nrate = 1\nburst = 1").replace("contoso-web", name);
            only_problem(&text, "name =", "rules[0].name", Some(name), msg);
        }
        let ok = rule("dst = \"198.18.0.0/15\"\nrate = 1\nburst = 1")
            .replace("contoso-web", &"x".repeat(63));
        parse(&ok).unwrap();
    }

    #[test]
    fn duplicate_names() {
        let text = "[[rules]]\nname = \"a\"\ndst = \"198.18.0.0/16\"\nrate = 1\nburst = 1\n\
                    [[rules]]\nname = \"a\"\ndst = \"198.19.0.0/16\"\nrate = 1\nburst = 1\n";
        let err = parse(text).unwrap_err();
        assert_eq!(err.problems().len(), 1, "{err}");
        assert_problem(
            &err,
            7,
            "rules[1].name",
            Some("a"),
            "already used by rules[0] (line 2)",
        );
    }

    #[test]
    fn dst_errors() {
        let base = |dst: &str| rule(&format!("dst = \"{dst}\"\nrate = 1\nburst = 1"));
        only_problem(
            &base("203.0.113.10/24"),
            "dst =",
            "rules[0].dst",
            Some("contoso-web"),
            "host bits set; did you mean \"203.0.113.0/24\"?",
        );
        only_problem(
            &base("2001:db8::1/32"),
            "dst =",
            "rules[0].dst",
            Some("contoso-web"),
            "did you mean \"2001:db8::/32\"?",
        );
        only_problem(
            &base("203.0.113.0/33"),
            "dst =",
            "rules[0].dst",
            Some("contoso-web"),
            "is not a prefix",
        );
        only_problem(
            &base("example.com"),
            "dst =",
            "rules[0].dst",
            Some("contoso-web"),
            "is not an address or prefix",
        );
        let text = rule("dst = 3\nrate = 1\nburst = 1");
        only_problem(
            &text,
            "dst =",
            "rules[0].dst",
            Some("contoso-web"),
            "expected a string, found integer",
        );
        let net = parse(&base("2001:db8::")).unwrap().rules[0].dst;
        assert_eq!(net, "2001:db8::/128".parse::<IpNet>().unwrap());
    }

    #[test]
    fn port_errors() {
        for port in ["0", "65536", "-1"] {
            let text = rule(&format!(
                "dst = \"198.18.0.0/15\"\ndst_port = {port}\nrate = 1\nburst = 1"
            ));
            only_problem(
                &text,
                "dst_port",
                "rules[0].dst_port",
                Some("contoso-web"),
                "between 1 and 65535",
            );
        }
        let text =
            rule("dst = \"198.18.0.0/15\"\nproto = \"icmp\"\ndst_port = 7\nrate = 1\nburst = 1");
        only_problem(
            &text,
            "dst_port",
            "rules[0].dst_port",
            Some("contoso-web"),
            "not allowed with proto \"icmp\"",
        );
    }

    #[test]
    fn enum_errors() {
        let text = rule("dst = \"198.18.0.0/15\"\nproto = \"sctp\"\nrate = 1\nburst = 1");
        only_problem(
            &text,
            "proto",
            "rules[0].proto",
            Some("contoso-web"),
            "unknown proto \"sctp\"; expected one of \"tcp\", \"udp\", \"icmp\", \"any\"",
        );
        let text = rule("dst = \"198.18.0.0/15\"\nunit = \"bits\"\nrate = 1\nburst = 1");
        only_problem(
            &text,
            "unit",
            "rules[0].unit",
            Some("contoso-web"),
            "unknown unit \"bits\"",
        );
        let text = rule("dst = \"198.18.0.0/15\"\nmode = \"dry-run\"\nrate = 1\nburst = 1");
        only_problem(
            &text,
            "mode",
            "rules[0].mode",
            Some("contoso-web"),
            "unknown mode",
        );
        let text = rule("dst = \"198.18.0.0/15\"\nfail_mode = true\nrate = 1\nburst = 1");
        only_problem(
            &text,
            "fail_mode",
            "rules[0].fail_mode",
            Some("contoso-web"),
            "expected a string, found boolean",
        );
        let text = "\n\nxdp_mode = \"offload\"\n";
        only_problem(
            text,
            "xdp_mode",
            "xdp_mode",
            None,
            "unknown xdp_mode \"offload\"",
        );
    }

    #[test]
    fn xdp_share_and_priority() {
        let c = parse("").unwrap();
        assert_eq!(
            (c.xdp_share, c.xdp_priority),
            (XdpShare::Exclusive, DEFAULT_XDP_PRIORITY)
        );
        let c = parse("xdp_share = \"libxdp\"\nxdp_priority = 3\n").unwrap();
        assert_eq!((c.xdp_share, c.xdp_priority), (XdpShare::Libxdp, 3));
        only_problem(
            "xdp_share = \"shared\"\n",
            "xdp_share",
            "xdp_share",
            None,
            "unknown xdp_share \"shared\"; expected one of \"exclusive\", \"libxdp\"",
        );
        only_problem(
            "xdp_share = \"libxdp\"\nxdp_priority = -1\n",
            "xdp_priority",
            "xdp_priority",
            None,
            "between 0 and 4294967295",
        );
        let c = parse("xdp_share = \"libxdp\"\nxdp_share_fallback = \"tail-call\"\n").unwrap();
        assert_eq!(c.xdp_share_fallback, XdpShareFallback::TailCall);
        assert_eq!(
            parse("").unwrap().xdp_share_fallback,
            XdpShareFallback::None
        );
        only_problem(
            "xdp_share = \"libxdp\"\nxdp_share_fallback = \"tailcall\"\n",
            "xdp_share_fallback",
            "xdp_share_fallback",
            None,
            "unknown xdp_share_fallback \"tailcall\"; expected one of \"none\", \"tail-call\"",
        );
        // Without libxdp sharing there is nothing to fall back from.
        only_problem(
            "xdp_share_fallback = \"tail-call\"\n",
            "xdp_share_fallback",
            "xdp_share_fallback",
            None,
            "needs xdp_share = \"libxdp\"",
        );
        // A priority without sharing would be silently ignored: refused.
        only_problem(
            "\nxdp_priority = 5\n",
            "xdp_priority",
            "xdp_priority",
            None,
            "needs xdp_share = \"libxdp\"",
        );
        only_problem(
            "xdp_share = \"libxdp\"\nnext_program = \"/sys/fs/bpf/lb\"\n",
            "next_program",
            "next_program",
            None,
            "not with xdp_share = \"libxdp\"",
        );
        let err = parse("xdp_mode = \"tc\"\n\nxdp_share = \"libxdp\"\n").unwrap_err();
        assert_problem(
            &err,
            3,
            "xdp_share",
            None,
            "xdp_mode = \"tc\" does not use it",
        );
    }

    #[test]
    fn syn_requires_tcp_or_any() {
        for proto in ["udp", "icmp"] {
            let text = rule(&format!(
                "dst = \"198.18.0.0/15\"\nproto = \"{proto}\"\nunit = \"syn\"\nrate = 1\nburst = 1"
            ));
            only_problem(
                &text,
                "unit =",
                "rules[0].unit",
                Some("contoso-web"),
                "requires proto \"tcp\" or \"any\"",
            );
        }
        for proto in ["tcp", "any"] {
            let text = rule(&format!(
                "dst = \"198.18.0.0/15\"\nproto = \"{proto}\"\nunit = \"syn\"\nrate = 1\nburst = 1"
            ));
            parse(&text).unwrap();
        }
    }

    #[test]
    fn bytes_bursts_hold_a_frame() {
        let text = rule("dst = \"198.18.0.0/15\"\nunit = \"bytes\"\nrate = 1000000\nburst = 1517");
        only_problem(
            &text,
            "burst = 1517",
            "rules[0].burst",
            Some("contoso-web"),
            "at least 1518",
        );
        let text = rule("dst = \"198.18.0.0/15\"\nunit = \"bytes\"\n[rules.per_source]\nrate = 1000000\nburst = 100");
        only_problem(
            &text,
            "burst = 100",
            "rules[0].per_source.burst",
            Some("contoso-web"),
            "at least 1518",
        );
        let text = rule("dst = \"198.18.0.0/15\"\nunit = \"bytes\"\nrate = 1000000\nburst = 1518");
        parse(&text).unwrap();
    }

    #[test]
    fn limit_errors_use_gcra_text() {
        let text = rule("dst = \"198.18.0.0/15\"\nrate = 0\nburst = 5");
        only_problem(
            &text,
            "rate = 0",
            "rules[0].rate",
            Some("contoso-web"),
            &LimitError::RateZero.to_string(),
        );
        let text = rule("dst = \"198.18.0.0/15\"\nrate = 1000000000001\nburst = 5");
        only_problem(
            &text,
            "rate =",
            "rules[0].rate",
            Some("contoso-web"),
            &LimitError::RateTooHigh.to_string(),
        );
        let text = rule("dst = \"198.18.0.0/15\"\nrate = 5\nburst = 0");
        only_problem(
            &text,
            "burst = 0",
            "rules[0].burst",
            Some("contoso-web"),
            &LimitError::BurstZero.to_string(),
        );
        let text = rule("dst = \"198.18.0.0/15\"\n[rules.per_source]\nrate = 1\nburst = 100000000");
        only_problem(
            &text,
            "burst = 1000",
            "rules[0].per_source.burst",
            Some("contoso-web"),
            &LimitError::BurstTooLong.to_string(),
        );
        let text = rule("dst = \"198.18.0.0/15\"\nrate = -5\nburst = 5");
        only_problem(
            &text,
            "rate = -5",
            "rules[0].rate",
            Some("contoso-web"),
            "must be at least 0, got -5",
        );
        let text = rule("dst = \"198.18.0.0/15\"\nrate = 1.5\nburst = 5");
        only_problem(
            &text,
            "rate = 1.5",
            "rules[0].rate",
            Some("contoso-web"),
            "expected an integer, found float",
        );
    }

    /// A per-source rule that names no prefix buckets IPv6 sources by their /64 (what
    /// that does to the buckets: ruleset's `per_source_buckets_an_ipv6_subscriber_by_its_64`).
    #[test]
    fn per_source_prefixes_default_to_32_and_64() {
        let c = parse(
            "[[rules]]\nname = \"v6-subscribers\"\ndst = \"2001:db8::10\"\n\
             [rules.per_source]\nrate = 10\nburst = 10\n",
        )
        .unwrap();
        let spec = c.rules[0].per_source.unwrap();
        assert_eq!((spec.prefix_v4, spec.prefix_v6), (32, 64));
    }

    #[test]
    fn per_source_errors() {
        let text = rule("dst = \"198.18.0.0/15\"\n[rules.per_source]\nburst = 5\nprefix_v4 = 33\nprefix_v6 = 129");
        let err = parse(&text).unwrap_err();
        assert_eq!(err.problems().len(), 3, "{err}");
        assert_problem(
            &err,
            line(&text, "[rules.per_source]", 0),
            "rules[0].per_source.rate",
            Some("contoso-web"),
            "rate is required",
        );
        assert_problem(
            &err,
            line(&text, "prefix_v4", 0),
            "rules[0].per_source.prefix_v4",
            Some("contoso-web"),
            "between 0 and 32",
        );
        assert_problem(
            &err,
            line(&text, "prefix_v6", 0),
            "rules[0].per_source.prefix_v6",
            Some("contoso-web"),
            "between 0 and 128",
        );
        let text = rule("dst = \"198.18.0.0/15\"\nper_source = { rate = 5 }");
        only_problem(
            &text,
            "per_source",
            "rules[0].per_source.burst",
            Some("contoso-web"),
            "burst is required",
        );
        let text = rule("dst = \"198.18.0.0/15\"\nper_source = 5");
        only_problem(
            &text,
            "per_source",
            "rules[0].per_source",
            Some("contoso-web"),
            "expected a table",
        );
    }

    #[test]
    fn unknown_keys() {
        let text = "fleetsize = 3\n[[rules]]\nname = \"a\"\ndst = \"198.18.0.0/15\"\nrate = 1\nburst = 1\nratee = 3\n\
                    [rules.per_source]\nrate = 1\nburst = 1\nprefix = 24\n";
        let err = parse(text).unwrap_err();
        assert_eq!(err.problems().len(), 3, "{err}");
        assert_problem(&err, 1, "fleetsize", None, "unknown key \"fleetsize\"");
        assert_problem(
            &err,
            7,
            "rules[0].ratee",
            Some("a"),
            "unknown key \"ratee\"",
        );
        assert_problem(
            &err,
            11,
            "rules[0].per_source.prefix",
            Some("a"),
            "unknown key \"prefix\"",
        );
    }

    #[test]
    fn ambiguous_rules() {
        let text = "[[rules]]\nname = \"first\"\ndst = \"203.0.113.10\"\ndst_port = 443\nproto = \"tcp\"\nrate = 1\nburst = 1\n\n\
                    [[rules]]\nname = \"second\"\ndst = \"203.0.113.10/32\"\ndst_port = 443\nproto = \"tcp\"\nrate = 2\nburst = 2\n\n\
                    [[rules]]\nname = \"third\"\ndst = \"203.0.113.10/32\"\ndst_port = 443\nproto = \"any\"\nrate = 2\nburst = 2\n";
        let err = parse(text).unwrap_err();
        assert_eq!(err.problems().len(), 1, "{err}");
        assert_problem(
            &err,
            line(text, "[[rules]]", 1),
            "rules[1]",
            Some("second"),
            "rules[0] (\"first\", line 1)",
        );
        assert!(err.to_string().contains("ambiguous"));
    }

    #[test]
    fn cross_rule_checks_see_invalid_rules() {
        // Rule 0 is invalid (no burst), yet rule 1 still collides with its name and rule 2
        // with its match; rule 2's per_source is checked although its unit is wrong.
        let text = r#"[[rules]]
name = "a"
dst = "198.18.0.0/16"
dst_port = 80
proto = "tcp"
rate = 5

[[rules]]
name = "a"
dst = "198.19.0.0/16"
rate = 1
burst = 1

[[rules]]
name = "c"
dst = "198.18.0.0/16"
dst_port = 80
proto = "tcp"
unit = "frames"
per_source = { rate = 1, burst = 1, prefix = 8 }
"#;
        let err = parse(text).unwrap_err();
        assert_eq!(err.problems().len(), 5, "{err}");
        assert_problem(&err, 6, "rules[0].burst", Some("a"), "burst is required");
        assert_problem(
            &err,
            9,
            "rules[1].name",
            Some("a"),
            "already used by rules[0] (line 2)",
        );
        assert_problem(
            &err,
            14,
            "rules[2]",
            Some("c"),
            "ambiguous: rules[0] (\"a\", line 1)",
        );
        assert_problem(
            &err,
            19,
            "rules[2].unit",
            Some("c"),
            "unknown unit \"frames\"",
        );
        assert_problem(
            &err,
            20,
            "rules[2].per_source.prefix",
            Some("c"),
            "unknown key",
        );
        for l in err.to_string().lines() {
            assert!(l.starts_with("/etc/limiter.toml:"), "{l}");
        }
    }

    #[test]
    fn inline_rules_array() {
        let text = "rules = [\n  { name = \"x\", dst = \"2001:db8::/48\", rate = 3, burst = 4 },\n  { name = \"y\", dst = \"2001:db8::/64\" },\n]\n";
        let err = parse(text).unwrap_err();
        assert_eq!(err.problems().len(), 1, "{err}");
        assert_problem(&err, 3, "rules[1]", Some("y"), "needs an aggregate limit");
        let ok = text.replace("/64\" }", "/64\", per_source = { rate = 1, burst = 1 } }");
        let c = parse(&ok).unwrap();
        assert_eq!(c.rules.len(), 2);
        assert_eq!(c.rules[0].aggregate, Some(RateSpec { rate: 3, burst: 4 }));
    }

    #[test]
    fn top_level_errors() {
        let text = "interfaces = \"eth0\"\nmetrics = \"localhost\"\nmax_sources = 0\nfleet_size = 0\npin_dir = \"\"\n";
        let err = parse(text).unwrap_err();
        assert_eq!(err.problems().len(), 5, "{err}");
        assert_problem(&err, 1, "interfaces", None, "expected an array");
        assert_problem(&err, 2, "metrics", None, "not an address:port");
        assert_problem(&err, 3, "max_sources", None, "between 1 and 16777216");
        assert_problem(&err, 4, "fleet_size", None, "between 1 and");
        assert_problem(&err, 5, "pin_dir", None, "must not be empty");
        let text = "max_sources = 268435457\n";
        only_problem(
            text,
            "max_sources",
            "max_sources",
            None,
            "between 1 and 16777216",
        );
        assert_eq!(
            parse("max_sources = 16777216\n").unwrap().max_sources,
            1 << 24
        );
        let text = "interfaces = [\"eth0\", \"a/b\", \"eth0\", \"waytoolonginterface\"]\n";
        let err = parse(text).unwrap_err();
        assert_eq!(err.problems().len(), 3, "{err}");
        assert_problem(&err, 1, "interfaces[1]", None, "not a valid interface name");
        assert_problem(&err, 1, "interfaces[2]", None, "listed twice");
        assert_problem(&err, 1, "interfaces[3]", None, "longer than 15");
        let text = "\n[rules]\nname = \"x\"\n";
        only_problem(
            text,
            "[rules]",
            "rules",
            None,
            "expected an array of tables",
        );
    }

    #[test]
    fn too_many_rules() {
        let mut text = String::new();
        for i in 0..=abi::MAX_RULES {
            text.push_str(&format!(
                "[[rules]]\nname = \"r{i}\"\ndst = \"198.18.{}.{}\"\nrate = 1\nburst = 1\n",
                i / 256,
                i % 256
            ));
        }
        let err = parse(&text).unwrap_err();
        assert_eq!(err.problems().len(), 1, "{err}");
        let header_line = abi::MAX_RULES as usize * 5 + 1;
        assert_problem(&err, header_line, "rules", None, "at most 1024 rules");
    }

    #[test]
    fn all_problems_reported_together() {
        let text = r#"xdp_mode = "fast"

[[rules]]
name = "one"
dst = "10.0.0.1/8"
rate = 5

[[rules]]
name = "two"
dst = "198.18.0.0/15"
proto = "udp"
unit = "syn"
per_source = { rate = 0, burst = 1 }
"#;
        let err = parse(text).unwrap_err();
        let problems = err.problems();
        assert_eq!(problems.len(), 5, "{err}");
        assert_problem(&err, 1, "xdp_mode", None, "unknown xdp_mode");
        assert_problem(
            &err,
            5,
            "rules[0].dst",
            Some("one"),
            "did you mean \"10.0.0.0/8\"",
        );
        assert_problem(&err, 6, "rules[0].burst", Some("one"), "burst is required");
        assert_problem(&err, 12, "rules[1].unit", Some("two"), "requires proto");
        assert_problem(
            &err,
            13,
            "rules[1].per_source.rate",
            Some("two"),
            "at least 1 per second",
        );
        // Sorted by line, one line per problem.
        let lines: Vec<usize> = problems.iter().map(|p| p.line).collect();
        assert_eq!(lines, [1, 5, 6, 12, 13]);
        assert_eq!(err.to_string().lines().count(), 5);
    }

    #[test]
    fn syntax_error_has_line() {
        let text = "interfaces = [\"eth0\"]\n\n[[rules]]\nname = = \"x\"\n";
        let err = parse(text).unwrap_err();
        let ConfigError::Syntax { line, .. } = &err else {
            panic!("expected a syntax error, got {err:?}");
        };
        assert_eq!(*line, Some(4));
        let rendered = err.to_string();
        assert!(rendered.starts_with("/etc/limiter.toml:4: "), "{rendered}");
        assert!(rendered.contains("line 4"), "{rendered}");
        let text = "a = 1\nrules = 2\nrules = 3\n";
        let err = parse(text).unwrap_err();
        assert!(
            err.to_string().starts_with("/etc/limiter.toml:3: "),
            "{err}"
        );
    }

    #[test]
    fn load_reads_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("limiter.toml");
        std::fs::write(&path, FULL).unwrap();
        assert_eq!(Config::load(&path).unwrap(), parse(FULL).unwrap());
        std::fs::write(&path, "max_sources = 0\n").unwrap();
        let err = Config::load(&path).unwrap_err();
        assert!(
            err.to_string()
                .starts_with(&format!("{}:1: max_sources", path.display())),
            "{err}"
        );
        let missing = dir.path().join("missing.toml");
        let err = Config::load(&missing).unwrap_err();
        assert!(matches!(err, ConfigError::Read { .. }));
        assert!(err.to_string().contains("missing.toml"), "{err}");
    }

    /// In tc mode a burst below a GRO-built buffer is named; SYN rules and XDP modes
    /// are not.
    #[test]
    fn tc_mode_warns_of_bursts_below_a_gro_buffer() {
        let text = |mode: &str| {
            format!(
                "xdp_mode = \"{mode}\"\n\
                 [[rules]]\nname = \"small\"\ndst = \"198.18.0.1/32\"\nrate = 1000\nburst = 20\n\
                 [[rules]]\nname = \"big\"\ndst = \"198.18.0.2/32\"\nrate = 1000\nburst = 64\n\
                 [[rules]]\nname = \"bytes\"\ndst = \"198.18.0.3/32\"\nunit = \"bytes\"\n\
                 rate = 1000000\nburst = 3000\n\
                 [[rules]]\nname = \"syn\"\ndst = \"198.18.0.4/32\"\nunit = \"syn\"\nrate = 10\nburst = 5\n"
            )
        };
        let tc = Config::parse(&text("tc"), Path::new("t.toml")).unwrap();
        let warnings = tc.tc_burst_warnings();
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(
            warnings[0].starts_with("rule small: burst 20 "),
            "{warnings:?}"
        );
        assert!(
            warnings[1].starts_with("rule bytes: burst 3000 "),
            "{warnings:?}"
        );
        let native = Config::parse(&text("native"), Path::new("t.toml")).unwrap();
        assert!(native.tc_burst_warnings().is_empty());
    }

    #[test]
    fn handoff_keys_parse() {
        let c = parse("next_program = \"/sys/fs/bpf/lb/prog\"\n").unwrap();
        assert_eq!(
            c.handoff,
            Some(HandoffSpec::Program("/sys/fs/bpf/lb/prog".into()))
        );
        let c = parse("next_program = \"/sys/fs/bpf/katran/root_array:1\"\n").unwrap();
        assert_eq!(
            c.handoff,
            Some(HandoffSpec::Slot {
                array: "/sys/fs/bpf/katran/root_array".into(),
                index: 1
            })
        );
        let c = parse("join_program_array = \"/sys/fs/bpf/katran/root_array:0\"\n").unwrap();
        assert_eq!(
            c.handoff,
            Some(HandoffSpec::Join {
                array: "/sys/fs/bpf/katran/root_array".into(),
                index: 0
            })
        );
        // A ':' followed by something other than digits is part of the path.
        let c = parse("next_program = \"/sys/fs/bpf/a:b\"\n").unwrap();
        assert_eq!(
            c.handoff,
            Some(HandoffSpec::Program("/sys/fs/bpf/a:b".into()))
        );
        assert_eq!(parse("").unwrap().handoff, None);
    }

    #[test]
    fn handoff_errors_name_line_and_field() {
        let text = "\n\nnext_program = \"lb/prog\"\n";
        only_problem(
            text,
            "next_program",
            "next_program",
            None,
            "not an absolute path",
        );
        let text = "next_program = \"/sys/fs/bpf/arr:4294967296\"\n";
        only_problem(
            text,
            "next_program",
            "next_program",
            None,
            "not a slot number",
        );
        let text = "join_program_array = \"/sys/fs/bpf/arr\"\n";
        only_problem(
            text,
            "join_program_array",
            "join_program_array",
            None,
            "has no slot",
        );
        let text = "join_program_array = \":3\"\n";
        only_problem(
            text,
            "join_program_array",
            "join_program_array",
            None,
            "pin path is empty",
        );
        let text = "next_program = 7\n";
        only_problem(
            text,
            "next_program",
            "next_program",
            None,
            "expected a string",
        );
        let text = "next_program = \"/sys/fs/bpf/p\"\njoin_program_array = \"/sys/fs/bpf/a:0\"\n";
        only_problem(
            text,
            "join_program_array",
            "join_program_array",
            None,
            "choose one",
        );
        let text = "xdp_mode = \"tc\"\nnext_program = \"/sys/fs/bpf/p\"\n";
        only_problem(
            text,
            "next_program",
            "next_program",
            None,
            "TC build cannot tail-call",
        );
        let text = "xdp_mode = \"tc\"\njoin_program_array = \"/sys/fs/bpf/a:0\"\n";
        only_problem(
            text,
            "join_program_array",
            "join_program_array",
            None,
            "TC build",
        );
        let text = "interfaces = [\"eth0\"]\njoin_program_array = \"/sys/fs/bpf/a:0\"\n";
        only_problem(
            text,
            "join_program_array",
            "join_program_array",
            None,
            "twice",
        );
    }

    #[test]
    fn handoff_problems_come_with_the_others() {
        let text = "max_sources = 0\nnext_program = \"relative\"\n";
        let err = parse(text).unwrap_err();
        assert_eq!(err.problems().len(), 2, "{err}");
        assert_problem(&err, 2, "next_program", None, "absolute");
    }
}
