//! The allocator's config file (TOML), read by the checker the daemon uses
//! ([`limiter_config`]): every problem at once, by file, line, column and field. Its keys
//! are the rows of [`TOP_KEYS`], [`TLS_KEYS`] and [`QUOTA_KEYS`].
//!
//! ```toml
//! listen = "0.0.0.0:7443"
//! metrics = "127.0.0.1:9465"          # "" disables
//! control_socket = "/run/limiter-allocator/allocator.sock"
//! lease_ttl_ms = 3000
//! report_interval_ms = 1000
//! max_hosts = 1024                    # hosts that may report at once (see README)
//! max_connections = 2048              # default: 2 × max_hosts
//! max_connections_per_ip = 16
//! handshake_timeout_ms = 2000
//! max_reports_per_s = 10              # per host and per connection (default: 2 × a daemon's most)
//! [tls]
//! ca = "/etc/limiter/ca.pem"          # signs the daemons' client certificates
//! cert = "/etc/limiter/allocator.pem"
//! key = "/etc/limiter/allocator.key"
//! [[quotas]]
//! rule = "contoso-web"                # the rule name in the daemons' configs
//! rate = 10000                        # global quota per second, in the rule's unit
//! burst = 2000
//! unit = "packets"                    # the rule's unit in the daemons' configs (its metrics say it)
//! ```

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::{Path, PathBuf},
};

use anyhow::{bail, Result};
use limiter_common::gcra::{Granularity, Limit, LimitError};
use limiter_config::{
    config_enum,
    schema::TLS_FILE,
    section,
    toml::de::{DeTable, DeValue},
    Absent::{Int, Required, Str, Unset},
    Applies::Restart,
    At, Checker, ConfigError,
    Kind::{self, Integer, SocketAddr as Address, Table, Tables},
    Value,
};
use limiter_fleet::{
    alloc::DEFAULT_CREDIT_PCT,
    share::{
        DEFAULT_FLEET_SIZE, DEFAULT_LEASE_TTL_MS, DEFAULT_REPORT_INTERVAL_MS, MAX_FLEET_TIMING_MS,
    },
};
use limiter_proto::MIN_REPORT_SPACING_MS;
use serde::Deserialize;

/// Default `metrics` listen address.
pub const DEFAULT_METRICS: &str = "127.0.0.1:9465";
/// Default `control_socket` (and `quota`'s `--socket`).
pub const DEFAULT_CONTROL_SOCKET: &str = "/run/limiter-allocator/allocator.sock";
/// About twice the daemon's default `fleet_size`: set it to your fleet's size with a margin.
pub const DEFAULT_MAX_HOSTS: u64 = 1024;
const _: () = assert!(DEFAULT_MAX_HOSTS >= 2 * DEFAULT_FLEET_SIZE as u64);
/// Default `[election] name`.
pub const DEFAULT_ELECTION_NAME: &str = "limiter-allocator";
/// Default `[election] ttl_ms`: etcd's shortest lease at its default heartbeat (it
/// raises shorter ones to 2 s).
pub const DEFAULT_ELECTION_TTL_MS: u64 = 2000;
pub const MIN_ELECTION_TTL_MS: u64 = 1000;
/// The bound of each connection and host count.
const MAX_COUNT: u64 = 1_000_000;
/// A rate or a burst: any count here, then held to the limit arithmetic's bounds.
const COUNT: Kind = Integer {
    min: 0,
    max: u64::MAX,
};

/// The reference of the allocator's file (docs/config.md, `limiter-allocator.toml(5)`).
pub const REFERENCE: limiter_config::reference::Reference = limiter_config::reference::Reference {
    binary: "limiter-allocator",
    page: "limiter-allocator.toml",
    path: "/etc/limiter/allocator.toml",
    about: "configuration of the fleet's quota allocator: its listener, quotas and replicas",
    schema: &TOP_KEYS,
    see_also: &[
        "limiter-allocator(8)",
        "limiter-allocator-run(8)",
        "limiter-allocator-check(8)",
        "limiter.toml(5)",
    ],
};

section! {
    /// The top level of the allocator's file.
    TOP_KEYS = "", Restart {
        LISTEN = "listen", Required, Address, "the gRPC address (mutual TLS)";
        METRICS = "metrics", Str(DEFAULT_METRICS), Address, "Prometheus listen address; \"\" disables";
        CONTROL_SOCKET = "control_socket", Str(DEFAULT_CONTROL_SOCKET), Kind::Path, "the control socket";
        LEASE_TTL_MS = "lease_ttl_ms", Int(DEFAULT_LEASE_TTL_MS), Integer { min: 1, max: MAX_FLEET_TIMING_MS }, "how long a grant is valid";
        REPORT_INTERVAL_MS = "report_interval_ms", Int(DEFAULT_REPORT_INTERVAL_MS), Integer { min: 1, max: MAX_FLEET_TIMING_MS }, "how often hosts report";
        FLEET_SIZE = "fleet_size", Unset("each host's own, from its reports"), Integer { min: 1, max: u32::MAX as u64 }, "while a rule learns, a host that holds nothing gets quota / fleet_size at once; unset, the fleet_size each host reports (at least the hosts heard from); set, this one for all, and hosts whose own differs are told";
        CREDIT_PCT = "credit_pct", Int(DEFAULT_CREDIT_PCT), Integer { min: 0, max: 100 }, "each rule's credit cap, in % of what its quota admits in one report interval: quota the fleet left unused, lent to hosts that refused frames; 0: no credit";
        MAX_HOSTS = "max_hosts", Int(DEFAULT_MAX_HOSTS), Integer { min: 1, max: MAX_COUNT }, "hosts known at once";
        MAX_CONNECTIONS = "max_connections", Unset("2 × max_hosts"), Integer { min: 1, max: MAX_COUNT }, "open gRPC connections";
        MAX_CONNECTIONS_PER_IP = "max_connections_per_ip", Int(16), Integer { min: 1, max: MAX_COUNT }, "open connections from one address";
        HANDSHAKE_TIMEOUT_MS = "handshake_timeout_ms", Int(2000), Integer { min: 1, max: 60_000 }, "TLS and the first report within this";
        MAX_REPORTS_PER_S = "max_reports_per_s", Unset("2 × a daemon's most"), COUNT, "reports per second per host and per connection: at least what a healthy daemon sends at report_interval_ms";
        TLS = "tls", Required, Table(&TLS_KEYS), "the allocator's certificate and the CA of the hosts'";
        QUOTAS = "quotas", Unset("no quotas"), Tables(&QUOTA_KEYS), "global quotas by rule name";
        ELECTION = "election", Unset("one allocator, no etcd"), Table(&ELECTION_KEYS), "replicas: the etcd cluster they elect a leader in";
    }
}

section! {
    /// `[election]`: replicas elect their leader in etcd and keep the quotas there.
    ELECTION_KEYS = "[election]", Restart {
        ELECTION_ETCD = "etcd", Required, Kind::Other("a list of \"host:port\", \"http://host:port\" or \"https://host:port\""), "the etcd cluster's client endpoints";
        ELECTION_ADVERTISE = "advertise", Unset("listen, unless it is a wildcard"), Address, "the address hosts reach this replica at (followers name it in redirects)";
        ELECTION_NAME = "name", Str(DEFAULT_ELECTION_NAME), Kind::String, "the allocator group: its election and its keys in etcd";
        ELECTION_TTL_MS = "ttl_ms", Int(DEFAULT_ELECTION_TTL_MS), Integer { min: MIN_ELECTION_TTL_MS, max: 60_000 }, "the leader's etcd lease (whole seconds)";
        ELECTION_CA = "ca", Unset("plain http to etcd"), Kind::Path, "TLS to etcd: the CA that signs etcd's server certificates";
        ELECTION_CERT = "cert", Unset("no client certificate"), Kind::Path, "this replica's client certificate (etcd's --client-cert-auth)";
        ELECTION_KEY = "key", Unset("no client certificate"), Kind::Path, "the client certificate's key";
        ELECTION_SHARDS = "shards", Unset("no sharding: the group grants every rule it has a quota for"), Kind::String, "sharding: the etcd prefix of the rule → group assignment (the same in every group)";
    }
}

section! {
    /// `[tls]`.
    TLS_KEYS = "[tls]", Restart => #[derive(Clone, Debug, PartialEq, Eq)] struct TlsConfig {
        TLS_CA = "ca" => ca: PathBuf, Required, Kind::Path, "signs the hosts' client certificates", TLS_FILE;
        TLS_CERT = "cert" => cert: PathBuf, Required, Kind::Path, "the allocator's certificate", TLS_FILE;
        TLS_KEY = "key" => key: PathBuf, Required, Kind::Path, "its key", TLS_FILE;
    }
}

section! {
    /// One `[[quotas]]` entry.
    QUOTA_KEYS = "[[quotas]]", Restart {
        QUOTA_RULE = "rule", Required, Kind::String, "the rule name in the daemons' configs";
        QUOTA_RATE = "rate", Required, COUNT, "global quota per second, in the rule's unit: 1 to 10^12";
        QUOTA_BURST = "burst", Required, COUNT, "global burst: at least 1, refilled within a year at rate";
        QUOTA_UNIT = "unit", Str(QuotaUnit::Packets.as_str()), Kind::Word(QuotaUnit::SPELLINGS), "the rule's unit in the daemons' configs: what the quota's metrics are named by";
    }
}

config_enum!(
    /// A quota's unit: the rule's `unit` in the daemons' configs. The allocator splits
    /// numbers alike in any unit; its metrics name the unit, so that no sum adds bytes to
    /// packets.
    QuotaUnit, "unit" {
        Packets = "packets",
        Bytes = "bytes",
        /// TCP SYNs (packets).
        Syn = "syn",
    }
);

/// The most reports per second a healthy daemon sends with this report interval: one per
/// interval, or one per `MIN_REPORT_SPACING_MS` when its early reports come as fast as
/// they may.
pub fn daemon_max_reports_per_s(report_interval_ms: u64) -> u64 {
    1000u64.div_ceil(report_interval_ms.clamp(1, MIN_REPORT_SPACING_MS))
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct Quota {
    pub rule: String,
    pub rate: u64,
    pub burst: u64,
}

#[derive(Clone, Debug)]
pub struct Config {
    pub listen: SocketAddr,
    pub metrics: Option<SocketAddr>,
    pub control_socket: PathBuf,
    pub lease_ttl_ms: u64,
    pub report_interval_ms: u64,
    /// While a rule learns (after a start or a failover), a host holding nothing of it
    /// (a joiner, or a host gone FAIL_OPEN in a long outage) is granted quota ÷ fleet_size
    /// at once, what a joiner enforces by itself. `None`: each host's own `fleet_size`,
    /// from its reports (the one number is written once, in the daemons' files).
    pub fleet_size: Option<u32>,
    /// Each rule's credit cap in % of what its quota admits in one report interval
    /// (`limiter_fleet::alloc::credit_cap_for`); 0: no credit.
    pub credit_pct: u64,
    pub limits: PeerLimits,
    pub tls: TlsConfig,
    pub quotas: Vec<Quota>,
    /// Each quota's unit (`[[quotas]] unit`), by rule; a quota set at runtime for a rule
    /// not in the file counts packets.
    pub units: std::collections::HashMap<String, QuotaUnit>,
    /// Replicas: `None` runs one allocator on its own, as before etcd.
    pub election: Option<Election>,
}

/// `[election]`: this replica's part in its group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Election {
    /// etcd client endpoints, each `http://host:port`, or each `https://host:port`
    /// with `tls`.
    pub etcd: Vec<String>,
    /// TLS to etcd; `None`: plain http.
    pub tls: Option<EtcdTls>,
    /// What followers name in redirects: a `[fleet] allocator` entry of the hosts.
    pub advertise: SocketAddr,
    /// The group: the election is `<name>/leader`, the quotas `<name>/quotas/<rule>`.
    pub name: String,
    pub ttl_ms: u64,
    /// Sharding (`[election] shards`): the etcd prefix under which `<shards>/<rule>` names
    /// the group that grants the rule. `None`: this group grants every rule it has a
    /// quota for.
    pub shards: Option<String>,
}

/// `[election] ca`, `cert` and `key`: etcd's server certificate is checked against `ca`;
/// `identity` (certificate, key) is presented when etcd asks for a client certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdTls {
    pub ca: PathBuf,
    pub identity: Option<(PathBuf, PathBuf)>,
}

/// What one peer may cost the allocator (README, "Fleet mode": what a rogue or broken
/// peer gets).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerLimits {
    /// Hosts known at once (reported within a lease TTL); newcomers beyond are refused.
    pub max_hosts: usize,
    /// Open TCP connections, handshaking or not; more are closed at accept.
    pub max_connections: usize,
    /// Open TCP connections from one source address.
    pub max_connections_per_ip: usize,
    /// A TLS handshake not done by then is dropped.
    pub handshake_timeout_ms: u64,
    /// Reports per second per host and per connection (also the burst).
    pub max_reports_per_s: u64,
}

/// Checks one quota (config file and `quota set` alike) against the bounds a daemon's
/// config holds a rule's rate and burst to (`limiter_common::gcra::Limit::new`): a rate
/// of 1 up to `MAX_RATE` per second, a burst of at least 1 that refills within a year.
/// The allocator does not know a rule's unit; whole units (packets, SYNs) are the
/// stricter case (a byte's cost rounds finer), so a quota that passes here gives every
/// host a share that compiles in any unit: a share's rate is at most the quota and its
/// burst the same fraction of the global burst.
pub fn check_quota(q: &Quota) -> Result<()> {
    if !limiter_proto::valid_rule_name(&q.rule) {
        bail!(
            "quota {:?}: a rule name must be 1-{} bytes of [A-Za-z0-9._-]",
            q.rule,
            limiter_proto::MAX_RULE_LEN
        );
    }
    if let Err(e) = Limit::new(Granularity::Event, q.rate, q.burst) {
        bail!(
            "quota {:?} (rate {}, burst {}): {e}",
            q.rule,
            q.rate,
            q.burst
        );
    }
    Ok(())
}

impl Config {
    /// Validates `text`; `origin` names the file in error messages.
    pub fn parse(text: &str, origin: &Path) -> Result<Config, ConfigError> {
        let root = Checker::parse(text, origin)?;
        let mut checker = Checker::new(text);
        let config = read(&mut checker, root.get_ref());
        checker.finish(origin)?;
        // Whenever the checker found nothing, every part was read.
        config.ok_or_else(|| ConfigError::Invalid {
            path: origin.to_path_buf(),
            problems: Vec::new(),
            more: 0,
        })
    }

    /// Reads and validates the config file at `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = limiter_config::read_file(path)?;
        Self::parse(&text, path)
    }
}

/// The config of `root`, when every key is right; the problems go to `c`.
fn read(c: &mut Checker<'_>, root: &DeTable<'_>) -> Option<Config> {
    c.unknown_keys(root, &TOP_KEYS, At::top(""));
    let top = |key: &limiter_config::Key| At::top(key.name);
    let listen = match root.get(LISTEN.name) {
        Some(value) => socket_addr(c, value, top(&LISTEN)),
        None => {
            c.report(
                0..0,
                top(&LISTEN),
                "listen is required (the gRPC address, such as \"0.0.0.0:7443\")",
            );
            None
        }
    };
    let metrics = match c.string_key(root, &METRICS, top(&METRICS)) {
        Some("") => Some(None),
        Some(s) => match s.parse() {
            Ok(addr) => Some(Some(addr)),
            Err(_) => {
                let span = root.get(METRICS.name).map_or(0..0, |v| v.span());
                c.report(
                    span,
                    top(&METRICS),
                    format!("metrics {s:?} is not address:port (\"\" disables metrics)"),
                );
                None
            }
        },
        None => None,
    };
    let control_socket = c.path_key(root, &CONTROL_SOCKET, top(&CONTROL_SOCKET));
    let lease_ttl_ms = c.integer_key(root, &LEASE_TTL_MS, top(&LEASE_TTL_MS));
    let report_interval_ms = c.integer_key(root, &REPORT_INTERVAL_MS, top(&REPORT_INTERVAL_MS));
    if let (Some(ttl), Some(interval)) = (lease_ttl_ms, report_interval_ms) {
        if interval >= ttl {
            let span = root
                .get(REPORT_INTERVAL_MS.name)
                .or(root.get(LEASE_TTL_MS.name))
                .map_or(0..0, |v| v.span());
            c.report(
                span,
                top(&REPORT_INTERVAL_MS),
                format!("need 0 < report_interval_ms < lease_ttl_ms (got {interval} and {ttl})"),
            );
        }
    }
    let fleet_size = match root.get(FLEET_SIZE.name) {
        Some(_) => {
            <u32 as limiter_config::FromRow>::read(c, root, &FLEET_SIZE, top(&FLEET_SIZE)).map(Some)
        }
        None => Some(None),
    };
    let credit_pct = <u64 as limiter_config::FromRow>::read(c, root, &CREDIT_PCT, top(&CREDIT_PCT));
    let limits = peer_limits(c, root, report_interval_ms);
    let tls = match root.get(TLS.name) {
        Some(value) => tls(c, value),
        None => {
            c.report(
                0..0,
                top(&TLS),
                "tls is required (a [tls] table with ca, cert and key)",
            );
            None
        }
    };
    let quotas = match root.get(QUOTAS.name) {
        Some(value) => quotas(c, value),
        None => Some((Vec::new(), Default::default())),
    };
    let election = match root.get(ELECTION.name) {
        Some(value) => election(c, value, listen, lease_ttl_ms, report_interval_ms).map(Some),
        None => Some(None),
    };
    let (quotas, units) = quotas?;
    Some(Config {
        listen: listen?,
        metrics: metrics?,
        control_socket: control_socket?,
        lease_ttl_ms: lease_ttl_ms?,
        report_interval_ms: report_interval_ms?,
        fleet_size: fleet_size?,
        credit_pct: credit_pct?,
        limits: limits?,
        tls: tls?,
        quotas,
        units,
        election: election?,
    })
}

fn election(
    c: &mut Checker<'_>,
    value: &Value<'_>,
    listen: Option<SocketAddr>,
    lease_ttl_ms: Option<u64>,
    report_interval_ms: Option<u64>,
) -> Option<Election> {
    let table = c.table(value, At::top("election"))?;
    c.unknown_keys(table, &ELECTION_KEYS, At::top("election"));
    let field = |key: &limiter_config::Key| format!("election.{}", key.name);
    let tls = etcd_tls(c, table, value);
    // Whether TLS was asked for, even if its files were misspelt: the endpoints are
    // checked against what the operator meant, not reported a second time.
    let wants_tls = table.get(ELECTION_CA.name).is_some();
    let etcd = match table.get(ELECTION_ETCD.name) {
        Some(v) => etcd_endpoints(c, v, wants_tls),
        None => {
            c.report(
                value.span(),
                At::top(&field(&ELECTION_ETCD)),
                "etcd is required in [election] (the etcd cluster's client endpoints, such as \
                 [\"10.0.0.1:2379\", \"10.0.0.2:2379\", \"10.0.0.3:2379\"])",
            );
            None
        }
    };
    let advertise = match table.get(ELECTION_ADVERTISE.name) {
        Some(v) => socket_addr(c, v, At::top(&field(&ELECTION_ADVERTISE))),
        None => match listen {
            Some(l) if l.ip().is_unspecified() => {
                c.report(
                    value.span(),
                    At::top(&field(&ELECTION_ADVERTISE)),
                    format!(
                        "advertise is required in [election] when listen ({l}) is a wildcard: \
                         the address hosts reach this replica at, as listed in their \
                         [fleet] allocator"
                    ),
                );
                None
            }
            other => other,
        },
    };
    let name_path = field(&ELECTION_NAME);
    let name = c
        .string_key(table, &ELECTION_NAME, At::top(&name_path))
        .map(str::to_string);
    let name = match name {
        // A rule name's alphabet and length: the group prefixes keys as a rule does.
        Some(n) if !limiter_proto::valid_rule_name(&n) => {
            let span = table
                .get(ELECTION_NAME.name)
                .map_or(value.span(), |v| v.span());
            c.report(
                span,
                At::top(&name_path),
                format!(
                    "name {n:?} must be 1-{} bytes of [A-Za-z0-9._-] (it prefixes the group's keys in etcd)",
                    limiter_proto::MAX_RULE_LEN
                ),
            );
            None
        }
        other => other,
    };
    let ttl_path = field(&ELECTION_TTL_MS);
    let ttl_ms = c.integer_key(table, &ELECTION_TTL_MS, At::top(&ttl_path));
    let ttl_span = table
        .get(ELECTION_TTL_MS.name)
        .map_or(value.span(), |v| v.span());
    let ttl_ms = match ttl_ms {
        Some(t) if !t.is_multiple_of(1000) => {
            c.report(
                ttl_span.clone(),
                At::top(&ttl_path),
                format!("ttl_ms = {t} is not whole seconds: etcd leases are granted in seconds"),
            );
            None
        }
        other => other,
    };
    if let (Some(ttl), Some(lease), Some(interval)) = (ttl_ms, lease_ttl_ms, report_interval_ms) {
        if ttl + interval >= lease {
            c.report(
                ttl_span,
                At::top(&ttl_path),
                format!(
                    "ttl_ms ({ttl}) + report_interval_ms ({interval}) must be below lease_ttl_ms \
                     ({lease}): a leader that crashes is replaced up to ttl_ms later, and a \
                     host's grant can be report_interval_ms old by then, so the hosts' \
                     shares would lapse before the next leader renews them; raise \
                     lease_ttl_ms to at least {}",
                    ttl + interval + 1
                ),
            );
        }
    }
    let shards = shards_prefix(c, table, name.as_deref());
    Some(Election {
        etcd: etcd?,
        tls: tls?,
        advertise: advertise?,
        name: name?,
        ttl_ms: ttl_ms?,
        shards: shards?,
    })
}

/// The longest `[election] shards` prefix.
pub const MAX_SHARDS_PREFIX: usize = 200;

/// Whether `prefix` may be `[election] shards`: 1-200 bytes of `[A-Za-z0-9._-/]`, not
/// ending in `/` (a rule's key is `<prefix>/<rule>`).
pub fn valid_shards_prefix(prefix: &str) -> bool {
    !prefix.is_empty()
        && prefix.len() <= MAX_SHARDS_PREFIX
        && !prefix.ends_with('/')
        && prefix
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-/".contains(&b))
}

/// `[election] shards`: `Some(None)` when absent; `None` after a problem.
fn shards_prefix(
    c: &mut Checker<'_>,
    table: &DeTable<'_>,
    name: Option<&str>,
) -> Option<Option<String>> {
    let path = format!("election.{}", ELECTION_SHARDS.name);
    let Some(v) = table.get(ELECTION_SHARDS.name) else {
        return Some(None);
    };
    let text = c.string_key(table, &ELECTION_SHARDS, At::top(&path))?;
    let span = v.span();
    let problem = if !valid_shards_prefix(text) {
        Some(format!(
            "shards {text:?} must be 1-{MAX_SHARDS_PREFIX} bytes of [A-Za-z0-9._-/], not ending \
             in \"/\" (the etcd prefix of the rule → group assignment, such as \"limiter/shards\")"
        ))
    } else if name.is_some_and(|n| text == n || text.starts_with(&format!("{n}/"))) {
        Some(format!(
            "shards {text:?} is inside this group's own keys ({:?}): use a prefix every group \
             shares, such as \"limiter/shards\"",
            name.unwrap_or_default()
        ))
    } else {
        None
    };
    match problem {
        Some(p) => {
            c.report(span, At::top(&path), p);
            None
        }
        None => Some(Some(text.to_string())),
    }
}

/// `[election] ca`, `cert`, `key`: `Some(None)` without TLS; `None` after a problem.
fn etcd_tls(
    c: &mut Checker<'_>,
    table: &DeTable<'_>,
    value: &Value<'_>,
) -> Option<Option<EtcdTls>> {
    let path = |c: &mut Checker<'_>, key: &limiter_config::Key| {
        let at = format!("election.{}", key.name);
        table
            .get(key.name)
            .map(|_| c.path_key(table, key, At::top(&at)).ok_or(()))
            .transpose()
    };
    let (ca, cert, key) = (
        path(c, &ELECTION_CA),
        path(c, &ELECTION_CERT),
        path(c, &ELECTION_KEY),
    );
    let (Ok(ca), Ok(cert), Ok(key)) = (ca, cert, key) else {
        return None;
    };
    let missing = |c: &mut Checker<'_>, absent: &limiter_config::Key, why: &str| {
        c.report(
            value.span(),
            At::top(&format!("election.{}", absent.name)),
            why.to_string(),
        );
    };
    let identity = match (cert, key) {
        (Some(cert), Some(key)) => Some((cert, key)),
        (None, None) => None,
        (Some(_), None) => {
            missing(
                c,
                &ELECTION_KEY,
                "key is required in [election] with cert (the client certificate's key)",
            );
            return None;
        }
        (None, Some(_)) => {
            missing(
                c,
                &ELECTION_CERT,
                "cert is required in [election] with key (the client certificate it belongs to)",
            );
            return None;
        }
    };
    match (ca, identity) {
        (Some(ca), identity) => Some(Some(EtcdTls { ca, identity })),
        (None, None) => Some(None),
        (None, Some(_)) => {
            missing(
                c,
                &ELECTION_CA,
                "ca is required in [election] with cert and key: a client certificate \
                 goes only to an etcd whose server certificate this CA signed",
            );
            None
        }
    }
}

/// `[election] etcd`: a non-empty list of endpoints, none twice, all over TLS when `tls`
/// (`[election] ca` is set) and none otherwise.
fn etcd_endpoints(c: &mut Checker<'_>, value: &Value<'_>, tls: bool) -> Option<Vec<String>> {
    let at = At::top("election.etcd");
    let items = c.non_empty_array(
        value,
        at,
        "a list of endpoints such as [\"10.0.0.1:2379\"]",
        "etcd",
        "endpoint",
    )?;
    let mut out: Vec<String> = Vec::new();
    let mut valid = true;
    for (i, item) in items.iter().enumerate() {
        let path = format!("election.etcd[{i}]");
        let Some(text) = c.string(item, At::top(&path)) else {
            valid = false;
            continue;
        };
        match etcd_endpoint(text, tls) {
            Ok(url) if out.contains(&url) => {
                c.report(
                    item.span(),
                    At::top(&path),
                    format!("{text:?} is listed twice"),
                );
                valid = false;
            }
            Ok(url) => out.push(url),
            Err(why) => {
                c.report(item.span(), At::top(&path), format!("{text:?}: {why}"));
                valid = false;
            }
        }
    }
    valid.then_some(out)
}

/// One etcd endpoint as etcd-client takes it: `https://host:port` with `tls`,
/// `http://host:port` without. A bare `host:port` takes the scheme `tls` calls for; an
/// explicit one that disagrees is refused, so an election is never sent in clear text
/// to one member of a cluster the operator secured.
pub fn etcd_endpoint(text: &str, tls: bool) -> Result<String, String> {
    let rest = match (text.strip_prefix("https://"), text.strip_prefix("http://")) {
        (Some(_), _) if !tls => {
            return Err(
                "https:// needs [election] ca, the CA that signs etcd's server \
                        certificates"
                    .into(),
            )
        }
        (_, Some(_)) if tls => {
            return Err(
                "http:// while [election] ca is set: every etcd endpoint is \
                        reached over TLS or none is (give https://host:port or host:port)"
                    .into(),
            )
        }
        (Some(rest), _) | (_, Some(rest)) => rest,
        (None, None) => text,
    };
    let (host, port) = rest
        .rsplit_once(':')
        .ok_or("not host:port, such as \"10.0.0.1:2379\"")?;
    let host_ok = !host.is_empty()
        && host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-.:".contains(&b));
    if !host_ok || port.parse::<u16>().map_or(true, |p| p == 0) {
        return Err("not host:port, such as \"10.0.0.1:2379\"".into());
    }
    let scheme = if tls { "https" } else { "http" };
    Ok(format!("{scheme}://{rest}"))
}

fn socket_addr(c: &mut Checker<'_>, value: &Value<'_>, at: At<'_>) -> Option<SocketAddr> {
    let s = c.string(value, at)?;
    match s.parse() {
        Ok(addr) => Some(addr),
        Err(_) => {
            c.report(
                value.span(),
                at,
                format!("{s:?} is not address:port, such as \"0.0.0.0:7443\""),
            );
            None
        }
    }
}

fn peer_limits(
    c: &mut Checker<'_>,
    root: &DeTable<'_>,
    report_interval_ms: Option<u64>,
) -> Option<PeerLimits> {
    let top = |key: &limiter_config::Key| At::top(key.name);
    let count = |c: &mut Checker<'_>, key| {
        c.integer_key(root, key, top(key))
            .and_then(|n| usize::try_from(n).ok())
    };
    let max_hosts = count(c, &MAX_HOSTS);
    let max_connections = match root.get(MAX_CONNECTIONS.name) {
        Some(_) => count(c, &MAX_CONNECTIONS),
        None => max_hosts.map(|hosts| 2 * hosts),
    };
    let max_connections_per_ip = count(c, &MAX_CONNECTIONS_PER_IP);
    let handshake_timeout_ms =
        c.integer_key(root, &HANDSHAKE_TIMEOUT_MS, top(&HANDSHAKE_TIMEOUT_MS));
    let max_reports_per_s = match (root.get(MAX_REPORTS_PER_S.name), report_interval_ms) {
        (Some(value), Some(interval)) => {
            let daemon_max = daemon_max_reports_per_s(interval);
            let n = c.integer_key(root, &MAX_REPORTS_PER_S, top(&MAX_REPORTS_PER_S))?;
            if n < daemon_max {
                c.report(
                    value.span(),
                    top(&MAX_REPORTS_PER_S),
                    format!(
                        "max_reports_per_s = {n} would refuse a healthy host's reports: with \
                         report_interval_ms = {interval} a daemon sends up to {daemon_max} per second"
                    ),
                );
                return None;
            }
            Some(n)
        }
        (Some(_), None) => c.integer_key(root, &MAX_REPORTS_PER_S, top(&MAX_REPORTS_PER_S)),
        (None, interval) => interval.map(|i| 2 * daemon_max_reports_per_s(i)),
    };
    Some(PeerLimits {
        max_hosts: max_hosts?,
        max_connections: max_connections?,
        max_connections_per_ip: max_connections_per_ip?,
        handshake_timeout_ms: handshake_timeout_ms?,
        max_reports_per_s: max_reports_per_s?.min(MAX_COUNT),
    })
}

fn tls(c: &mut Checker<'_>, value: &Value<'_>) -> Option<TlsConfig> {
    let table = c.table(value, At::top("tls"))?;
    c.unknown_keys(table, &TLS_KEYS, At::top("tls"));
    TlsConfig::read(c, table, value.span(), "tls")
}

/// The `[[quotas]]` and each one's unit, by rule.
type Quotas = (Vec<Quota>, std::collections::HashMap<String, QuotaUnit>);

fn quotas(c: &mut Checker<'_>, value: &Value<'_>) -> Option<Quotas> {
    let items = c.array(value, At::top("quotas"), "an array of tables ([[quotas]])")?;
    let mut quotas = Vec::new();
    let mut units = std::collections::HashMap::new();
    let mut first_at: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    let mut all_good = true;
    for (index, item) in items.iter().enumerate() {
        let prefix = format!("quotas[{index}]");
        let Some(table) = c.table(item, At::top(&prefix)) else {
            all_good = false;
            continue;
        };
        let before = c.count();
        let rule: Option<&str> = match table.get(QUOTA_RULE.name).map(|v| v.get_ref()) {
            Some(DeValue::String(s)) => Some(s.as_ref()),
            _ => None,
        };
        let at = At {
            path: &prefix,
            rule,
        };
        c.unknown_keys(table, &QUOTA_KEYS, at);
        let field = |key: &limiter_config::Key| format!("{prefix}.{}", key.name);
        let required = |c: &mut Checker<'_>, key: &limiter_config::Key| -> Option<u64> {
            let path = field(key);
            match table.get(key.name) {
                Some(_) => c.integer_key(table, key, at.field(&path)),
                None => {
                    c.report(
                        item.span(),
                        at.field(&path),
                        format!("{} is required in [[quotas]]", key.name),
                    );
                    None
                }
            }
        };
        let rate = required(c, &QUOTA_RATE);
        let burst = required(c, &QUOTA_BURST);
        let unit: Option<QuotaUnit> = c.word_key(table, &QUOTA_UNIT, at.field(&field(&QUOTA_UNIT)));
        let rule_path = field(&QUOTA_RULE);
        let rule = match table.get(QUOTA_RULE.name) {
            Some(v) => c.string(v, at.field(&rule_path)).map(|s| (s, v.span())),
            None => {
                c.report(
                    item.span(),
                    at.field(&rule_path),
                    "rule is required in [[quotas]] (the rule name in the daemons' configs)",
                );
                None
            }
        };
        if let (Some(rate), Some(burst)) = (rate, burst) {
            if let Err(err) = Limit::new(Granularity::Event, rate, burst) {
                let key = match err {
                    LimitError::RateZero | LimitError::RateTooHigh => &QUOTA_RATE,
                    LimitError::BurstZero | LimitError::BurstTooLong => &QUOTA_BURST,
                };
                let span = table.get(key.name).map_or(item.span(), |v| v.span());
                c.report(span, at.field(&field(key)), err.to_string());
            }
        }
        if let Some((name, span)) = &rule {
            if let Some(&(first, line)) = first_at.get(*name) {
                c.report(
                    span.clone(),
                    at.field(&rule_path),
                    format!("quota for rule {name:?} given twice (first in quotas[{first}], line {line})"),
                );
            } else {
                let line = c.line(span.start);
                first_at.insert(name.to_string(), (index, line));
            }
        }
        match (rule, rate, burst, unit) {
            (Some((rule, _)), Some(rate), Some(burst), Some(unit)) if c.count() == before => {
                quotas.push(Quota {
                    rule: rule.to_string(),
                    rate,
                    burst,
                });
                units.insert(rule.to_string(), unit);
            }
            _ => all_good = false,
        }
    }
    all_good.then_some((quotas, units))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

    use limiter_config::cases::ErrorCase;

    use super::*;

    const TLS: &str = "[tls]\nca = \"a\"\ncert = \"b\"\nkey = \"c\"\n";

    /// `quota set` and the file are held to a daemon config's bounds: a rate above
    /// `MAX_RATE` or a burst that takes over a year to refill is refused, naming the rule.
    /// Old code accepted any rate and burst above 0.
    #[test]
    fn quotas_have_the_upper_bounds_of_a_daemon_config() {
        use limiter_common::gcra::MAX_RATE;
        let q = |rate, burst| Quota {
            rule: "web".into(),
            rate,
            burst,
        };
        assert!(check_quota(&q(MAX_RATE, 1)).is_ok());
        assert!(check_quota(&q(10_000, 2_000)).is_ok());
        for (bad, what) in [
            (q(MAX_RATE + 1, 1), "at most"),
            (q(1, u64::MAX), "year"),
            (q(0, 1), "at least 1"),
            (q(1, 0), "at least 1"),
        ] {
            let e = check_quota(&bad).unwrap_err().to_string();
            assert!(e.contains("\"web\"") && e.contains(what), "{e}");
        }
    }

    #[test]
    fn parses_and_validates() {
        let ok = format!(
            "listen = \"127.0.0.1:7443\"\n{TLS}[[quotas]]\nrule = \"x\"\nrate = 10\nburst = 2\n"
        );
        let c = Config::parse(&ok, Path::new("a.toml")).unwrap();
        assert_eq!(c.quotas.len(), 1);
        assert_eq!(c.lease_ttl_ms, 3000);
        assert_eq!(c.credit_pct, DEFAULT_CREDIT_PCT);
        let off = format!("listen = \"127.0.0.1:7443\"\ncredit_pct = 0\n{TLS}");
        assert_eq!(
            Config::parse(&off, Path::new("a.toml")).unwrap().credit_pct,
            0
        );
        let bad = format!(
            "listen = \"127.0.0.1:7443\"\n{TLS}[[quotas]]\nrule = \"x\"\nrate = 0\nburst = 2\n"
        );
        let e = Config::parse(&bad, Path::new("a.toml"))
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            format!(
                "a.toml:8:8: quotas[0].rate (\"x\"): {}",
                LimitError::RateZero
            )
        );
        let unknown = format!("listen = \"127.0.0.1:7443\"\nfoo = 1\n{TLS}");
        let e = Config::parse(&unknown, Path::new("a.toml"))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(
                "a.toml:2:1: foo: unknown key \"foo\"; expected one of: listen, metrics,"
            ),
            "{e}"
        );
    }

    /// Every problem of the file at once, each by line, column and field (the old
    /// checker, serde's, stopped at the first).
    #[test]
    fn every_problem_is_reported_at_once() {
        let text = "listen = \"nowhere\"\nmax_hosts = 0\nhandshake_timeout_ms = 60001\n\
                    report_interval_ms = 5000\n[tls]\nca = \"a\"\ncert = 3\n\
                    [[quotas]]\nrule = \"x\"\nrate = 1\nburst = 0\n\
                    [[quotas]]\nrule = \"x\"\nrate = 1\nburst = 1\nbrust = 1\n";
        let err = Config::parse(text, Path::new("a.toml")).unwrap_err();
        let lines: Vec<String> = err.to_string().lines().map(str::to_string).collect();
        assert_eq!(
            lines,
            [
                "a.toml:1:10: listen: \"nowhere\" is not address:port, such as \"0.0.0.0:7443\"",
                "a.toml:2:13: max_hosts: must be between 1 and 1000000, got 0",
                "a.toml:3:24: handshake_timeout_ms: must be between 1 and 60000, got 60001",
                "a.toml:4:22: report_interval_ms: need 0 < report_interval_ms < lease_ttl_ms (got 5000 and 3000)",
                "a.toml:5:1: tls.key: key is required in [tls]",
                "a.toml:7:8: tls.cert: expected a string, found integer",
                &format!("a.toml:11:9: quotas[0].burst (\"x\"): {}", LimitError::BurstZero),
                "a.toml:13:8: quotas[1].rule (\"x\"): quota for rule \"x\" given twice (first in quotas[0], line 9)",
                "a.toml:16:1: quotas[1].brust (\"x\"): unknown key \"brust\"; expected one of: rule, rate, burst, unit",
            ]
        );
    }

    /// One bad input a row: its only problem, on that field, with that message.
    #[test]
    fn bad_inputs_each_get_their_problem() {
        let base = "listen = \"127.0.0.1:7443\"\n";
        let cases: &[(&str, &str, &str, &str)] = &[
            (
                "no listen",
                "metrics = \"\"\n",
                "listen",
                "listen is required",
            ),
            ("no tls", "", "tls", "tls is required"),
            (
                "credit_pct above its bound",
                "credit_pct = 101\n",
                "credit_pct",
                "must be between 0 and 100, got 101",
            ),
            (
                "credit_pct negative",
                "credit_pct = -1\n",
                "credit_pct",
                "must be between 0 and 100, got -1",
            ),
            (
                "metrics not an address",
                "metrics = \"local\"\n",
                "metrics",
                "metrics \"local\" is not address:port",
            ),
            (
                "empty socket",
                "control_socket = \"\"\n",
                "control_socket",
                "must not be empty",
            ),
            (
                "zero ttl",
                "lease_ttl_ms = 0\n",
                "lease_ttl_ms",
                "must be between 1 and 3600000, got 0",
            ),
            // The daemon's bounds: a timing one binary accepts, the other does too.
            (
                "ttl past an hour",
                "lease_ttl_ms = 3600001\n",
                "lease_ttl_ms",
                "must be between 1 and 3600000, got 3600001",
            ),
            (
                "interval past an hour",
                "report_interval_ms = 3600001\n",
                "report_interval_ms",
                "must be between 1 and 3600000, got 3600001",
            ),
            (
                "max_connections zero",
                "max_connections = 0\n",
                "max_connections",
                "must be between 1 and 1000000",
            ),
            (
                "per ip zero",
                "max_connections_per_ip = 0\n",
                "max_connections_per_ip",
                "must be between 1 and 1000000",
            ),
            (
                "handshake zero",
                "handshake_timeout_ms = 0\n",
                "handshake_timeout_ms",
                "must be between 1 and 60000",
            ),
            (
                "reports below a daemon's",
                "max_reports_per_s = 4\n",
                "max_reports_per_s",
                "would refuse a healthy host",
            ),
            (
                "hosts beyond u64",
                "max_hosts = 18446744073709551616\n",
                "max_hosts",
                "must be between 1 and 1000000",
            ),
            (
                "quotas a table",
                "[quotas]\nrule = \"x\"\n",
                "quotas",
                "expected an array of tables",
            ),
            (
                "quota without rule",
                "[[quotas]]\nrate = 1\nburst = 1\n",
                "quotas[0].rule",
                "rule is required",
            ),
            (
                "election without etcd",
                "lease_ttl_ms = 4000\n[election]\nttl_ms = 2000\n",
                "election.etcd",
                "etcd is required in [election]",
            ),
            (
                "election etcd empty",
                "lease_ttl_ms = 4000\n[election]\netcd = []\n",
                "election.etcd",
                "empty list",
            ),
            (
                "election etcd a string",
                "lease_ttl_ms = 4000\n[election]\netcd = \"127.0.0.1:2379\"\n",
                "election.etcd",
                "expected a list of endpoints",
            ),
            (
                "election etcd not host:port",
                "lease_ttl_ms = 4000\n[election]\netcd = [\"127.0.0.1:2379\", \"etcd\"]\n",
                "election.etcd[1]",
                "\"etcd\": not host:port",
            ),
            (
                "election etcd twice",
                "lease_ttl_ms = 4000\n[election]\netcd = [\"127.0.0.1:2379\", \"http://127.0.0.1:2379\"]\n",
                "election.etcd[1]",
                "listed twice",
            ),
            (
                "election etcd https without a ca",
                "lease_ttl_ms = 4000\n[election]\netcd = [\"https://127.0.0.1:2379\"]\n",
                "election.etcd[0]",
                "https:// needs [election] ca",
            ),
            (
                "election etcd http with a ca",
                "lease_ttl_ms = 4000\n[election]\netcd = [\"10.0.0.1:2379\", \"http://10.0.0.2:2379\"]\nca = \"ca.pem\"\n",
                "election.etcd[1]",
                "http:// while [election] ca is set",
            ),
            (
                "election cert without key",
                "lease_ttl_ms = 4000\n[election]\netcd = [\"127.0.0.1:2379\"]\nca = \"ca.pem\"\ncert = \"c.pem\"\n",
                "election.key",
                "key is required in [election] with cert",
            ),
            (
                "election key without cert",
                "lease_ttl_ms = 4000\n[election]\netcd = [\"127.0.0.1:2379\"]\nca = \"ca.pem\"\nkey = \"c.key\"\n",
                "election.cert",
                "cert is required in [election] with key",
            ),
            (
                "election client certificate without a ca",
                "lease_ttl_ms = 4000\n[election]\netcd = [\"127.0.0.1:2379\"]\ncert = \"c.pem\"\nkey = \"c.key\"\n",
                "election.ca",
                "ca is required in [election] with cert and key",
            ),
            (
                "election ca not a path",
                "lease_ttl_ms = 4000\n[election]\netcd = [\"127.0.0.1:2379\"]\nca = 7\n",
                "election.ca",
                "expected",
            ),
            (
                "election ttl not seconds",
                "lease_ttl_ms = 4000\n[election]\netcd = [\"127.0.0.1:2379\"]\nttl_ms = 1500\n",
                "election.ttl_ms",
                "not whole seconds",
            ),
            (
                "election ttl too long for the lease",
                "lease_ttl_ms = 4000\n[election]\netcd = [\"127.0.0.1:2379\"]\nttl_ms = 3000\n",
                "election.ttl_ms",
                "raise lease_ttl_ms to at least 4001",
            ),
            (
                "election name with a slash",
                "lease_ttl_ms = 4000\n[election]\netcd = [\"127.0.0.1:2379\"]\nname = \"a/b\"\n",
                "election.name",
                "must be 1-63 bytes of",
            ),
            (
                "election advertise not an address",
                "lease_ttl_ms = 4000\n[election]\netcd = [\"127.0.0.1:2379\"]\nadvertise = \"alloc-a\"\n",
                "election.advertise",
                "is not address:port",
            ),
            (
                "election shards with a space",
                "lease_ttl_ms = 4000\n[election]\netcd = [\"127.0.0.1:2379\"]\nshards = \"a b\"\n",
                "election.shards",
                "must be 1-200 bytes of",
            ),
            (
                "election shards ending in a slash",
                "lease_ttl_ms = 4000\n[election]\netcd = [\"127.0.0.1:2379\"]\nshards = \"limiter/\"\n",
                "election.shards",
                "not ending",
            ),
            (
                "election shards inside the group's keys",
                "lease_ttl_ms = 4000\n[election]\netcd = [\"127.0.0.1:2379\"]\nname = \"g\"\nshards = \"g/shards\"\n",
                "election.shards",
                "inside this group's own keys",
            ),
            (
                "election shards not a string",
                "lease_ttl_ms = 4000\n[election]\netcd = [\"127.0.0.1:2379\"]\nshards = 3\n",
                "election.shards",
                "expected",
            ),
            (
                "election unknown key",
                "lease_ttl_ms = 4000\n[election]\netcd = [\"127.0.0.1:2379\"]\nleader = true\n",
                "election.leader",
                "unknown key",
            ),
        ];
        let text = |name: &str, extra: &str| {
            let tls = if name == "no tls" { "" } else { TLS };
            let listen = if name == "no listen" { "" } else { base };
            // Tables come last in TOML: the [tls] table before any [[quotas]].
            format!(
                "{listen}{}{tls}{}",
                if extra.starts_with('[') { "" } else { extra },
                if extra.starts_with('[') { extra } else { "" }
            )
        };
        let mut rows: Vec<ErrorCase> = cases
            .iter()
            .map(|(name, extra, field, message)| {
                ErrorCase::new(name, &text(name, extra), field, message)
            })
            .collect();
        // A quota's problems name the quota's rule.
        let quota = "[[quotas]]\nrule = \"x\"\n";
        rows.extend([
            ErrorCase::new(
                "quota rate too high",
                &text("", &format!("{quota}rate = 1000000000001\nburst = 1\n")),
                "quotas[0].rate",
                "at most",
            )
            .of("x"),
            ErrorCase::new(
                "quota burst a year",
                &text("", &format!("{quota}rate = 1\nburst = 100000000\n")),
                "quotas[0].burst",
                "year",
            )
            .of("x"),
        ]);
        limiter_config::cases::run(&rows, "a.toml", |text| {
            Config::parse(text, Path::new("a.toml"))
        });
    }

    /// `[election]` with its defaults: advertise is listen, the name and TTL defaults; a
    /// wildcard listen needs advertise.
    #[test]
    fn an_election_table_with_its_defaults() {
        let text = format!(
            "listen = \"127.0.0.1:7443\"\nlease_ttl_ms = 4000\n{TLS}\
             [election]\netcd = [\"10.0.0.1:2379\", \"http://10.0.0.2:2379\"]\n"
        );
        let c = Config::parse(&text, Path::new("a.toml")).unwrap();
        assert_eq!(
            c.election,
            Some(Election {
                etcd: vec!["http://10.0.0.1:2379".into(), "http://10.0.0.2:2379".into()],
                tls: None,
                advertise: "127.0.0.1:7443".parse().unwrap(),
                name: DEFAULT_ELECTION_NAME.into(),
                ttl_ms: DEFAULT_ELECTION_TTL_MS,
                shards: None,
            })
        );
        let sharded = format!("{text}shards = \"limiter/shards\"\n");
        let c = Config::parse(&sharded, Path::new("a.toml")).unwrap();
        assert_eq!(
            c.election.and_then(|e| e.shards).as_deref(),
            Some("limiter/shards")
        );
        // With a ca, bare endpoints are reached over TLS; the client certificate is
        // optional.
        let secured = text.replace("\"http://10.0.0.2:2379\"", "\"https://10.0.0.2:2379\"")
            + "ca = \"/etc/etcd/ca.pem\"\n";
        let c = Config::parse(&secured, Path::new("a.toml")).unwrap();
        let e = c.election.unwrap();
        assert_eq!(e.etcd, ["https://10.0.0.1:2379", "https://10.0.0.2:2379"]);
        assert_eq!(
            e.tls,
            Some(EtcdTls {
                ca: "/etc/etcd/ca.pem".into(),
                identity: None
            })
        );
        let with_identity = secured + "cert = \"/etc/l/etcd.pem\"\nkey = \"/etc/l/etcd.key\"\n";
        let c = Config::parse(&with_identity, Path::new("a.toml")).unwrap();
        assert_eq!(
            c.election.and_then(|e| e.tls).and_then(|t| t.identity),
            Some(("/etc/l/etcd.pem".into(), "/etc/l/etcd.key".into()))
        );
        let wildcard = text.replace("127.0.0.1:7443", "0.0.0.0:7443");
        let e = Config::parse(&wildcard, Path::new("a.toml"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("election.advertise: advertise is required"),
            "{e}"
        );
        let given = format!("{wildcard}advertise = \"198.18.0.1:7443\"\n");
        let c = Config::parse(&given, Path::new("a.toml")).unwrap();
        assert_eq!(
            c.election.map(|e| e.advertise),
            Some("198.18.0.1:7443".parse().unwrap())
        );
        let plain = format!("listen = \"127.0.0.1:7443\"\n{TLS}");
        assert_eq!(
            Config::parse(&plain, Path::new("a.toml")).unwrap().election,
            None
        );
    }

    /// The example config shows every key of the schema, with its default where it has one.
    #[test]
    fn the_example_config_shows_every_key() {
        let text = include_str!("../../limiter-allocator.example.toml");
        assert_eq!(TOP_KEYS.documentation_gaps(text), Vec::<String>::new());
    }

    #[test]
    fn the_example_config_parses() {
        let text = include_str!("../../limiter-allocator.example.toml");
        let c = Config::parse(text, Path::new("limiter-allocator.example.toml")).unwrap();
        assert_eq!(c.limits.max_hosts, 1024);
        assert_eq!(c.limits.handshake_timeout_ms, 2000);
    }

    /// A quota's unit names its metrics: packets unless the table says otherwise, one of
    /// the daemon's words, anything else refused naming the key.
    #[test]
    fn a_quotas_unit_is_the_daemons_word_and_defaults_to_packets() {
        let base = format!("listen = \"127.0.0.1:7443\"\n{TLS}");
        let quota = |rule: &str, unit: &str| {
            format!("[[quotas]]\nrule = \"{rule}\"\nrate = 10\nburst = 5\n{unit}")
        };
        let text = format!(
            "{base}{}{}{}",
            quota("web", ""),
            quota("bulk", "unit = \"bytes\"\n"),
            quota("syn", "unit = \"syn\"\n")
        );
        let c = Config::parse(&text, Path::new("a.toml")).unwrap();
        let units: BTreeMap<&str, QuotaUnit> =
            c.units.iter().map(|(r, u)| (r.as_str(), *u)).collect();
        assert_eq!(
            units,
            BTreeMap::from([
                ("bulk", QuotaUnit::Bytes),
                ("syn", QuotaUnit::Syn),
                ("web", QuotaUnit::Packets)
            ])
        );
        let bad = format!("{base}{}", quota("web", "unit = \"frames\"\n"));
        let err = Config::parse(&bad, Path::new("a.toml"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("quotas[0].unit") && err.contains("bytes"),
            "{err}"
        );
    }

    #[test]
    fn peer_limits_default_from_the_fleet_and_are_checked() {
        let base = "listen = \"127.0.0.1:7443\"\n";
        let c = Config::parse(&format!("{base}{TLS}"), Path::new("a.toml")).unwrap();
        assert_eq!(
            c.limits,
            PeerLimits {
                max_hosts: 1024,
                max_connections: 2048,
                max_connections_per_ip: 16,
                handshake_timeout_ms: 2000,
                max_reports_per_s: 2 * daemon_max_reports_per_s(1000),
            }
        );
        assert_eq!(daemon_max_reports_per_s(1000), 5);
        assert_eq!(daemon_max_reports_per_s(100), 10);
        let c =
            Config::parse(&format!("{base}max_hosts = 10\n{TLS}"), Path::new("a.toml")).unwrap();
        assert_eq!((c.limits.max_hosts, c.limits.max_connections), (10, 20));
        for (bad, what) in [
            ("max_hosts = 0", "max_hosts: must be between"),
            ("max_connections = 0", "max_connections: must be between"),
            ("handshake_timeout_ms = 0", "handshake_timeout_ms"),
            ("max_reports_per_s = 4", "would refuse a healthy host"),
        ] {
            let e = Config::parse(&format!("{base}{bad}\n{TLS}"), Path::new("a.toml"))
                .unwrap_err()
                .to_string();
            assert!(e.contains(what) && e.contains("a.toml:2:"), "{bad}: {e}");
        }
    }
}
