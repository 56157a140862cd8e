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

/// Checks one quota (config file and `quota set` alike).
pub fn check_quota(q: &Quota) -> Result<()> {
    if q.rate == 0 {
        bail!("quota {:?}: rate must be at least 1 per second", q.rule);
    }
    if q.burst == 0 {
        bail!("quota {:?}: burst must be at least 1", q.rule);
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
