//! The fleet protocol: generated gRPC types, the limits every report must respect, and
//! mutual-TLS configuration for both ends.

use std::path::Path;

use rustls::pki_types::{pem::PemObject as _, CertificateDer, PrivateKeyDer};
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

pub mod connector;
pub mod identity;
pub mod reload;

pub use connector::TlsConnector;
pub use identity::{cert_host_name, pem_cert_host_name, IdentityError};
pub use reload::{client_tls_reloading, server_tls_reloading, ClientTls, ServerTls, TlsPaths};

/// Generated from proto/fleet.proto.
pub mod pb {
    tonic::include_proto!("limiter.fleet.v1");
}

/// The protocol version this build speaks.
pub const VERSION: u32 = 1;
/// Largest encoded message either side accepts (a report of 1024 rules is ~50 KiB).
pub const MAX_MESSAGE_BYTES: usize = 256 * 1024;
/// Most rules one report may carry.
pub const MAX_RULES_PER_REPORT: usize = 1024;
/// The daemon sends reports at most this often (early reports on refusals wait this long
/// after the last one); the allocator's default report rate limit allows twice as many.
pub const MIN_REPORT_SPACING_MS: u64 = 200;
/// Longest host id and rule name.
pub const MAX_HOST_LEN: usize = 253;
pub const MAX_RULE_LEN: usize = limiter_common::rule_name::MAX_LEN;
/// The response metadata key in which a follower replica names the leader's address.
pub const LEADER_METADATA: &str = "limiter-leader";

impl pb::ReportRequest {
    /// A report in this build's protocol version of one rule's demand and held share,
    /// with no refusals, for a rule counting packets: what tests and tools that speak for
    /// one host send.
    pub fn one_rule(host: &str, rule: &str, demand: u64, held: u64) -> pb::ReportRequest {
        pb::ReportRequest {
            version: VERSION,
            host: host.into(),
            rules: vec![pb::RuleReport {
                rule: rule.into(),
                demand,
                held,
                unit: "packets".into(),
                ..pb::RuleReport::default()
            }],
            fleet_size: 0,
        }
    }
}

/// Why a report is refused (sent back as INVALID_ARGUMENT with this text).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ReportError {
    #[error("protocol version {0} is not supported (this allocator speaks {VERSION})")]
    Version(u32),
    #[error("host id must be 1-{MAX_HOST_LEN} bytes of [A-Za-z0-9._-], got {0:?}")]
    Host(String),
    #[error("a report may carry at most {MAX_RULES_PER_REPORT} rules, got {0}")]
    TooManyRules(usize),
    #[error("rule name must be 1-{MAX_RULE_LEN} bytes of [A-Za-z0-9._-], got {0:?}")]
    RuleName(String),
    #[error("rule {0:?} is reported twice")]
    DuplicateRule(String),
}

/// Whether `s` may name a rule: 1-[`MAX_RULE_LEN`] bytes of `[A-Za-z0-9._-]`
/// (`limiter_common::rule_name`, the daemon's config holds names to the same).
pub fn valid_rule_name(s: &str) -> bool {
    limiter_common::rule_name::check(s).is_ok()
}

fn valid_name(s: &str, max: usize) -> bool {
    !s.is_empty()
        && s.len() <= max
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Checks a decoded report before anything acts on it.
pub fn validate(report: &pb::ReportRequest) -> Result<(), ReportError> {
    if report.version != VERSION {
        return Err(ReportError::Version(report.version));
    }
    if !valid_name(&report.host, MAX_HOST_LEN) {
        return Err(ReportError::Host(report.host.chars().take(64).collect()));
    }
    if report.rules.len() > MAX_RULES_PER_REPORT {
        return Err(ReportError::TooManyRules(report.rules.len()));
    }
    let mut seen = std::collections::BTreeSet::new();
    for r in &report.rules {
        if !valid_name(&r.rule, MAX_RULE_LEN) {
            return Err(ReportError::RuleName(r.rule.chars().take(64).collect()));
        }
        if !seen.insert(r.rule.as_str()) {
            return Err(ReportError::DuplicateRule(r.rule.clone()));
        }
    }
    Ok(())
}

/// PEM files of one end of a mutual-TLS connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles<'a> {
    /// CA that signs the other end's certificate.
    pub ca: &'a Path,
    pub cert: &'a Path,
    pub key: &'a Path,
}

#[derive(Debug, thiserror::Error)]
#[error("reading {path}: {source}")]
pub struct TlsError {
    pub path: String,
    #[source]
    pub source: std::io::Error,
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError {
        path: path.display().to_string(),
        source,
    })
}

/// Server side: present `cert`, and require a client certificate signed by `ca`.
pub fn server_tls(files: &TlsFiles<'_>) -> Result<ServerTlsConfig, TlsError> {
    Ok(ServerTlsConfig::new()
        .identity(Identity::from_pem(read(files.cert)?, read(files.key)?))
        .client_ca_root(Certificate::from_pem(read(files.ca)?)))
}

fn invalid(path: &Path, what: impl std::fmt::Display) -> TlsError {
    TlsError {
        path: path.display().to_string(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string()),
    }
}

/// The PEM certificates of `path` (at least one).
fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(&read(path)?)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(path, format!("not PEM certificates: {e}")))?;
    if certs.is_empty() {
        return Err(invalid(path, "no PEM certificate in it"));
    }
    Ok(certs)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_slice(&read(path)?)
        .map_err(|e| invalid(path, format!("not a PEM private key: {e}")))
}

/// Server side as a rustls configuration (for a server that runs its handshakes itself):
/// present `cert`, require a client certificate signed by `ca`, speak HTTP/2.
pub fn server_config(files: &TlsFiles<'_>) -> Result<rustls::ServerConfig, TlsError> {
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let roots = read_roots(files.ca)?;
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        std::sync::Arc::new(roots),
        std::sync::Arc::clone(&provider),
    )
    .build()
    .map_err(|e| invalid(files.ca, e))?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid(files.cert, e))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(read_certs(files.cert)?, read_key(files.key)?)
        .map_err(|e| {
            invalid(
                files.key,
                format!("does not match {}: {e}", files.cert.display()),
            )
        })?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// The certificates of the CA file `path`, as trust roots.
fn read_roots(path: &Path) -> Result<rustls::RootCertStore, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in read_certs(path)? {
        roots
            .add(cert)
            .map_err(|e| invalid(path, format!("not a CA certificate: {e}")))?;
    }
    Ok(roots)
}

/// Client side as a rustls configuration (for a client that runs its handshakes
/// itself, [`TlsConnector`]): trust only `ca` for the server, present `cert`, speak
/// HTTP/2. What [`client_tls`] configures, stricter: a CA file with anything but
/// certificates in it is refused rather than skipped.
pub fn client_config(files: &TlsFiles<'_>) -> Result<rustls::ClientConfig, TlsError> {
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let roots = read_roots(files.ca)?;
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid(files.cert, e))?
        .with_root_certificates(roots)
        .with_client_auth_cert(read_certs(files.cert)?, read_key(files.key)?)
        .map_err(|e| {
            invalid(
                files.key,
                format!("does not match {}: {e}", files.cert.display()),
            )
        })?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// Client side: trust only `ca` for the server (named `server_name` in its
/// certificate) and present `cert`.
pub fn client_tls(files: &TlsFiles<'_>, server_name: &str) -> Result<ClientTlsConfig, TlsError> {
    Ok(ClientTlsConfig::new()
        .domain_name(server_name)
        .ca_certificate(Certificate::from_pem(read(files.ca)?))
        .identity(Identity::from_pem(read(files.cert)?, read(files.key)?)))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use prost::Message as _;

    use super::{pb::*, *};

    fn report(host: &str, rules: &[&str]) -> ReportRequest {
        ReportRequest {
            version: VERSION,
            host: host.into(),
            rules: rules
                .iter()
                .map(|r| RuleReport {
                    rule: (*r).into(),
                    demand: 10,
                    held: 5,
                    ..RuleReport::default()
                })
                .collect(),
            fleet_size: 0,
        }
    }

    #[test]
    fn validation_names_the_problem() {
        assert_eq!(validate(&report("lb-1", &["a", "b"])), Ok(()));
        assert_eq!(
            validate(&ReportRequest {
                version: 2,
                ..report("lb-1", &[])
            }),
            Err(ReportError::Version(2))
        );
        assert!(matches!(
            validate(&report("", &[])),
            Err(ReportError::Host(_))
        ));
        assert!(matches!(
            validate(&report("a b", &[])),
            Err(ReportError::Host(_))
        ));
        assert!(matches!(
            validate(&report("lb", &["x/y"])),
            Err(ReportError::RuleName(_))
        ));
        assert_eq!(
            validate(&report("lb", &["a", "a"])),
            Err(ReportError::DuplicateRule("a".into()))
        );
        let many: Vec<String> = (0..=MAX_RULES_PER_REPORT)
            .map(|i| format!("r{i}"))
            .collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        assert_eq!(
            validate(&report("lb", &many)),
            Err(ReportError::TooManyRules(MAX_RULES_PER_REPORT + 1))
        );
    }

    #[test]
    fn a_full_report_fits_the_message_limit() {
        let names: Vec<String> = (0..MAX_RULES_PER_REPORT)
            .map(|i| format!("{i:063}"))
            .collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let mut r = report(&"h".repeat(MAX_HOST_LEN), &names);
        for rule in &mut r.rules {
            (rule.demand, rule.held, rule.denials) = (u64::MAX, u64::MAX, u64::MAX);
            (rule.admitted, rule.credited, rule.credit) =
                (Some(u64::MAX), Some(u64::MAX), Some(u64::MAX));
        }
        assert!(r.encoded_len() < MAX_MESSAGE_BYTES, "{}", r.encoded_len());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]

        /// The decoder and the validator take any bytes without panicking.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..2048)) {
            if let Ok(r) = ReportRequest::decode(bytes.as_slice()) {
                let _ = validate(&r);
            }
        }

        /// Mutated valid reports: decode either fails or yields something validate judges.
        #[test]
        fn mutated_reports_never_panic(
            host in "[a-z0-9.-]{0,300}",
            rules in prop::collection::vec("[ -~]{0,80}", 0..40),
            flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..8),
        ) {
            let rules: Vec<&str> = rules.iter().map(String::as_str).collect();
            let mut bytes = report(&host, &rules).encode_to_vec();
            for (at, value) in flips {
                if !bytes.is_empty() {
                    let i = at.index(bytes.len());
                    bytes[i] = value;
                }
            }
            if let Ok(r) = ReportRequest::decode(bytes.as_slice()) {
                let _ = validate(&r);
            }
        }
    }
}
