//! The allocator's config file (TOML).
//!
//! ```toml
//! listen = "0.0.0.0:7443"
//! metrics = "127.0.0.1:9465"          # "" disables
//! control_socket = "/run/limiter-allocator/allocator.sock"
//! lease_ttl_ms = 3000
//! report_interval_ms = 1000
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
    3000
}
fn default_interval() -> u64 {
    1000
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
    pub tls: TlsConfig,
    pub quotas: Vec<Quota>,
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
            tls: raw.tls,
            quotas: raw.quotas,
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
}
