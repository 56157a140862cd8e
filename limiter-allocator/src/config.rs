//! The allocator's config file (TOML).
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
//! ```

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
};

use anyhow::{bail, Context as _, Result};
use limiter_fleet::share::{DEFAULT_FLEET_SIZE, DEFAULT_LEASE_TTL_MS, DEFAULT_REPORT_INTERVAL_MS};
use limiter_proto::MIN_REPORT_SPACING_MS;
use serde::Deserialize;

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    listen: SocketAddr,
    #[serde(default = "default_metrics")]
    metrics: String,
    #[serde(default = "default_socket")]
    control_socket: PathBuf,
    #[serde(default = "default_ttl")]
    lease_ttl_ms: u64,
    #[serde(default = "default_interval")]
    report_interval_ms: u64,
    #[serde(default = "default_max_hosts")]
    max_hosts: u64,
    max_connections: Option<u64>,
    #[serde(default = "default_per_ip")]
    max_connections_per_ip: u64,
    #[serde(default = "default_handshake")]
    handshake_timeout_ms: u64,
    max_reports_per_s: Option<u64>,
    tls: TlsConfig,
    #[serde(default)]
    quotas: Vec<Quota>,
}

fn default_metrics() -> String {
    "127.0.0.1:9465".into()
}
fn default_socket() -> PathBuf {
    PathBuf::from("/run/limiter-allocator/allocator.sock")
}
fn default_ttl() -> u64 {
    DEFAULT_LEASE_TTL_MS
}
fn default_interval() -> u64 {
    DEFAULT_REPORT_INTERVAL_MS
}
/// About twice the daemon's default `fleet_size`: set it to your fleet's size with a margin.
pub const DEFAULT_MAX_HOSTS: u64 = 1024;
const _: () = assert!(DEFAULT_MAX_HOSTS >= 2 * DEFAULT_FLEET_SIZE as u64);
fn default_max_hosts() -> u64 {
    DEFAULT_MAX_HOSTS
}
fn default_per_ip() -> u64 {
    16
}
fn default_handshake() -> u64 {
    2000
}
/// The most reports per second a healthy daemon sends with this report interval: one per
/// interval, or one per `MIN_REPORT_SPACING_MS` when its early reports come as fast as
/// they may.
pub fn daemon_max_reports_per_s(report_interval_ms: u64) -> u64 {
    1000u64.div_ceil(report_interval_ms.clamp(1, MIN_REPORT_SPACING_MS))
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
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
    pub limits: PeerLimits,
    pub tls: TlsConfig,
    pub quotas: Vec<Quota>,
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
    use limiter_common::gcra::{Granularity, Limit};
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
    pub fn parse(text: &str, origin: &Path) -> Result<Config> {
        let raw: Raw = toml::from_str(text).with_context(|| format!("{}", origin.display()))?;
        let metrics = match raw.metrics.as_str() {
            "" => None,
            s => Some(s.parse().with_context(|| {
                format!("{}: metrics {s:?} is not address:port", origin.display())
            })?),
        };
        if raw.lease_ttl_ms == 0
            || raw.report_interval_ms == 0
            || raw.report_interval_ms >= raw.lease_ttl_ms
        {
            bail!(
                "{}: need 0 < report_interval_ms < lease_ttl_ms (got {} and {})",
                origin.display(),
                raw.report_interval_ms,
                raw.lease_ttl_ms
            );
        }
        let limits = Self::limits(&raw).with_context(|| origin.display().to_string())?;
        let mut seen = std::collections::BTreeSet::new();
        for q in &raw.quotas {
            check_quota(q).with_context(|| origin.display().to_string())?;
            if !seen.insert(&q.rule) {
                bail!(
                    "{}: quota for rule {:?} given twice",
                    origin.display(),
                    q.rule
                );
            }
        }
        Ok(Config {
            listen: raw.listen,
            metrics,
            control_socket: raw.control_socket,
            lease_ttl_ms: raw.lease_ttl_ms,
            report_interval_ms: raw.report_interval_ms,
            limits,
            tls: raw.tls,
            quotas: raw.quotas,
        })
    }

    fn limits(raw: &Raw) -> Result<PeerLimits> {
        let count = |key: &str, v: u64| -> Result<usize> {
            if !(1..=1_000_000).contains(&v) {
                bail!("{key} must be between 1 and 1000000, got {v}");
            }
            usize::try_from(v).with_context(|| format!("{key} {v}"))
        };
        let max_hosts = count("max_hosts", raw.max_hosts)?;
        let max_connections = count(
            "max_connections",
            raw.max_connections.unwrap_or(2 * raw.max_hosts),
        )?;
        let max_connections_per_ip = count("max_connections_per_ip", raw.max_connections_per_ip)?;
        if !(1..=60_000).contains(&raw.handshake_timeout_ms) {
            bail!(
                "handshake_timeout_ms must be between 1 and 60000, got {}",
                raw.handshake_timeout_ms
            );
        }
        let daemon_max = daemon_max_reports_per_s(raw.report_interval_ms);
        let max_reports_per_s = raw.max_reports_per_s.unwrap_or(2 * daemon_max);
        if max_reports_per_s < daemon_max {
            bail!(
                "max_reports_per_s = {max_reports_per_s} would refuse a healthy host's reports: \
                 with report_interval_ms = {} a daemon sends up to {daemon_max} per second",
                raw.report_interval_ms
            );
        }
        Ok(PeerLimits {
            max_hosts,
            max_connections,
            max_connections_per_ip,
            handshake_timeout_ms: raw.handshake_timeout_ms,
            max_reports_per_s: max_reports_per_s.min(1_000_000),
        })
    }

    pub fn load(path: &Path) -> Result<Config> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        Self::parse(&text, path)
    }
}

#[cfg(test)]
mod tests {
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
        let bad = format!(
            "listen = \"127.0.0.1:7443\"\n{TLS}[[quotas]]\nrule = \"x\"\nrate = 0\nburst = 2\n"
        );
        let e = format!(
            "{:#}",
            Config::parse(&bad, Path::new("a.toml")).unwrap_err()
        );
        assert!(e.contains("a.toml") && e.contains("rate"), "{e}");
        let unknown = format!("listen = \"127.0.0.1:7443\"\nfoo = 1\n{TLS}");
        let e = format!(
            "{:#}",
            Config::parse(&unknown, Path::new("a.toml")).unwrap_err()
        );
        assert!(e.contains("foo") && e.contains("line 2"), "{e}");
    }

    #[test]
    fn the_example_config_parses() {
        let text = include_str!("../../limiter-allocator.example.toml");
        let c = Config::parse(text, Path::new("limiter-allocator.example.toml")).unwrap();
        assert_eq!(c.limits.max_hosts, 1024);
        assert_eq!(c.limits.handshake_timeout_ms, 2000);
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
            ("max_hosts = 0", "max_hosts must be between"),
            ("max_connections = 0", "max_connections must be between"),
            ("handshake_timeout_ms = 0", "handshake_timeout_ms"),
            ("max_reports_per_s = 4", "would refuse a healthy host"),
        ] {
            let e = format!(
                "{:#}",
                Config::parse(&format!("{base}{bad}\n{TLS}"), Path::new("a.toml")).unwrap_err()
            );
            assert!(e.contains(what) && e.contains("a.toml"), "{bad}: {e}");
        }
    }
}
