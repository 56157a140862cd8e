//! A host's fleet identity, taken from its client certificate.
//!
//! The identity is the certificate's DNS subjectAltName entries (RFC 6125 names a peer by
//! its SANs, not its subject); a certificate without any DNS SAN is named by its subject
//! common name instead. Only names that are valid host ids count (1-253 bytes of
//! `[A-Za-z0-9._-]`: wildcards and other forms name no single host). A host reports
//! under one of these names, nothing else: what a report may claim is what the fleet's
//! CA signed.

use x509_parser::{extensions::GeneralName, prelude::FromDer as _};

use crate::{valid_name, MAX_HOST_LEN};

/// Most names taken from one certificate (a certificate is at most a TLS record chain;
/// this keeps what the allocator stores per connection small all the same).
pub const MAX_NAMES: usize = 32;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IdentityError {
    #[error("the client certificate is not valid DER X.509: {0}")]
    Der(String),
    #[error("no CERTIFICATE block in PEM")]
    NoPem,
    #[error(
        "the certificate names no host: it needs a DNS subjectAltName (or, without one, a \
         subject CN) of 1-{MAX_HOST_LEN} bytes of [A-Za-z0-9._-]"
    )]
    NoName,
}

/// The host ids a DER certificate vouches for (see the module doc), in certificate order.
pub fn cert_host_names(der: &[u8]) -> Result<Vec<String>, IdentityError> {
    let (_, cert) = x509_parser::certificate::X509Certificate::from_der(der)
        .map_err(|e| IdentityError::Der(e.to_string()))?;
    let san = cert
        .subject_alternative_name()
        .map_err(|e| IdentityError::Der(e.to_string()))?;
    let dns: Vec<&str> = san
        .map(|ext| {
            ext.value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    GeneralName::DNSName(s) => Some(*s),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    let candidates: Vec<&str> = if dns.is_empty() {
        cert.subject()
            .iter_common_name()
            .filter_map(|cn| cn.as_str().ok())
            .collect()
    } else {
        dns
    };
    let mut names: Vec<String> = Vec::new();
    for name in candidates {
        if valid_name(name, MAX_HOST_LEN) && !names.iter().any(|n| n == name) {
            names.push(name.to_string());
        }
        if names.len() == MAX_NAMES {
            break;
        }
    }
    if names.is_empty() {
        return Err(IdentityError::NoName);
    }
    Ok(names)
}

/// [`cert_host_names`] of the first certificate in a PEM file's contents.
pub fn pem_cert_host_names(pem: &[u8]) -> Result<Vec<String>, IdentityError> {
    for block in x509_parser::pem::Pem::iter_from_buffer(pem) {
        let block = block.map_err(|_| IdentityError::NoPem)?;
        if block.label == "CERTIFICATE" {
            return cert_host_names(&block.contents);
        }
    }
    Err(IdentityError::NoPem)
}

#[cfg(test)]
mod tests {
    use rcgen::{CertificateParams, DnType, KeyPair, SanType};

    use super::*;

    fn cert(cn: Option<&str>, sans: &[SanType]) -> Vec<u8> {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        if let Some(cn) = cn {
            params.distinguished_name.push(DnType::CommonName, cn);
        }
        params.subject_alt_names = sans.to_vec();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    fn dns(s: &str) -> SanType {
        SanType::DnsName(s.try_into().unwrap())
    }

    #[test]
    fn the_dns_sans_name_the_host_and_the_cn_only_without_them() {
        let c = cert(Some("ignored"), &[dns("lb-1"), dns("lb-1.example.net")]);
        assert_eq!(
            cert_host_names(&c),
            Ok(vec!["lb-1".to_string(), "lb-1.example.net".to_string()])
        );
        assert_eq!(
            cert_host_names(&cert(Some("lb-7"), &[])),
            Ok(vec!["lb-7".to_string()])
        );
        // An IP SAN is no DNS SAN: the CN names the host.
        let ip = SanType::IpAddress("198.18.0.1".parse().unwrap());
        assert_eq!(
            cert_host_names(&cert(Some("lb-8"), &[ip])),
            Ok(vec!["lb-8".to_string()])
        );
    }

    #[test]
    fn a_certificate_naming_no_valid_host_is_refused() {
        assert_eq!(
            cert_host_names(&cert(None, &[])),
            Err(IdentityError::NoName)
        );
        // A wildcard names no single host; the CN is not consulted once a DNS SAN exists.
        assert_eq!(
            cert_host_names(&cert(Some("lb-1"), &[dns("*.example.net")])),
            Err(IdentityError::NoName)
        );
        assert!(matches!(
            cert_host_names(b"not a certificate"),
            Err(IdentityError::Der(_))
        ));
        assert_eq!(
            pem_cert_host_names(b"nothing here"),
            Err(IdentityError::NoPem)
        );
    }

    #[test]
    fn pem_files_are_read() {
        let key = KeyPair::generate().unwrap();
        let params = CertificateParams::new(vec!["lb-2".to_string()]).unwrap();
        let pem = params.self_signed(&key).unwrap().pem();
        let text = format!("{}\n{pem}", key.serialize_pem());
        assert_eq!(
            pem_cert_host_names(text.as_bytes()),
            Ok(vec!["lb-2".to_string()])
        );
    }
}
