//! A host's fleet identity, taken from its client certificate.
//!
//! One certificate is one host. Its name is the certificate's first DNS subjectAltName
//! that is a valid host id (RFC 6125 names a peer by its SANs, not its subject; issuing
//! tools put the name asked for first, aliases after); a certificate without any DNS SAN
//! is named by its subject common name instead. Valid host ids are 1-253 bytes of
//! `[A-Za-z0-9._-]` (wildcards and other forms name no single host). A host reports
//! under that name, nothing else: a certificate with 32 names is still one host, so a
//! few certificates cannot fill `max_hosts` for everyone else.

use x509_parser::{extensions::GeneralName, prelude::FromDer as _};

use crate::{valid_name, MAX_HOST_LEN};

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

/// The host a DER certificate names (see the module doc).
pub fn cert_host_name(der: &[u8]) -> Result<String, IdentityError> {
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
    candidates
        .into_iter()
        .find(|name| valid_name(name, MAX_HOST_LEN))
        .map(str::to_string)
        .ok_or(IdentityError::NoName)
}

/// [`cert_host_name`] of the first certificate in a PEM file's contents.
pub fn pem_cert_host_name(pem: &[u8]) -> Result<String, IdentityError> {
    for block in x509_parser::pem::Pem::iter_from_buffer(pem) {
        let block = block.map_err(|_| IdentityError::NoPem)?;
        if block.label == "CERTIFICATE" {
            return cert_host_name(&block.contents);
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
    fn the_first_dns_san_names_the_host_and_the_cn_only_without_one() {
        let c = cert(Some("ignored"), &[dns("lb-1"), dns("lb-1.example.net")]);
        assert_eq!(cert_host_name(&c), Ok("lb-1".to_string()));
        // A wildcard names no host: the first valid name does.
        let c = cert(None, &[dns("*.example.net"), dns("lb-2"), dns("lb-3")]);
        assert_eq!(cert_host_name(&c), Ok("lb-2".to_string()));
        assert_eq!(
            cert_host_name(&cert(Some("lb-7"), &[])),
            Ok("lb-7".to_string())
        );
        // An IP SAN is no DNS SAN: the CN names the host.
        let ip = SanType::IpAddress("198.18.0.1".parse().unwrap());
        assert_eq!(
            cert_host_name(&cert(Some("lb-8"), &[ip])),
            Ok("lb-8".to_string())
        );
    }

    /// A certificate with 32 names is one host (before, any of its 32 names).
    #[test]
    fn a_certificate_of_many_names_is_one_host() {
        let sans: Vec<SanType> = (0..32).map(|i| dns(&format!("lb-{i}"))).collect();
        assert_eq!(cert_host_name(&cert(None, &sans)), Ok("lb-0".to_string()));
    }

    #[test]
    fn a_certificate_naming_no_valid_host_is_refused() {
        assert_eq!(cert_host_name(&cert(None, &[])), Err(IdentityError::NoName));
        // A wildcard names no single host; the CN is not consulted once a DNS SAN exists.
        assert_eq!(
            cert_host_name(&cert(Some("lb-1"), &[dns("*.example.net")])),
            Err(IdentityError::NoName)
        );
        assert!(matches!(
            cert_host_name(b"not a certificate"),
            Err(IdentityError::Der(_))
        ));
        assert_eq!(
            pem_cert_host_name(b"nothing here"),
            Err(IdentityError::NoPem)
        );
    }

    #[test]
    fn pem_files_are_read() {
        let key = KeyPair::generate().unwrap();
        let params = CertificateParams::new(vec!["lb-2".to_string()]).unwrap();
        let pem = params.self_signed(&key).unwrap().pem();
        let text = format!("{}\n{pem}", key.serialize_pem());
        assert_eq!(pem_cert_host_name(text.as_bytes()), Ok("lb-2".to_string()));
    }
}
