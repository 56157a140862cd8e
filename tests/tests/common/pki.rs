//! A throwaway PKI for the fleet tests: a CA, the allocator's server certificate, host
//! client certificates, and a rogue CA with a client certificate of its own.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

pub struct Pki {
    pub dir: PathBuf,
}

/// (certificate, key) paths.
pub struct Pair {
    pub cert: PathBuf,
    pub key: PathBuf,
}

fn ca(name: &str) -> (CertificateParams, KeyPair, String) {
    let key = KeyPair::generate().expect("CA key");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let pem = params.self_signed(&key).expect("CA cert").pem();
    (params, key, pem)
}

impl Pki {
    pub fn new(dir: &Path) -> Pki {
        let pki = Pki {
            dir: dir.to_path_buf(),
        };
        let (params, key, pem) = ca("limiter test CA");
        std::fs::write(pki.ca(), pem).expect("writing ca.pem");
        let issuer = Issuer::new(params, key);
        pki.leaf(
            &issuer,
            "allocator",
            "limiter-allocator",
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        for host in ["lb-1", "lb-2", "lb-3"] {
            pki.leaf(&issuer, host, host, ExtendedKeyUsagePurpose::ClientAuth);
        }
        let (rogue_params, rogue_key, rogue_pem) = ca("rogue CA");
        std::fs::write(dir.join("rogue-ca.pem"), rogue_pem).expect("writing rogue-ca.pem");
        let rogue = Issuer::new(rogue_params, rogue_key);
        pki.leaf(
            &rogue,
            "rogue",
            "lb-rogue",
            ExtendedKeyUsagePurpose::ClientAuth,
        );
        pki
    }

    fn leaf(
        &self,
        issuer: &Issuer<'_, KeyPair>,
        file: &str,
        name: &str,
        usage: ExtendedKeyUsagePurpose,
    ) {
        let key = KeyPair::generate().expect("leaf key");
        let mut params = CertificateParams::new(vec![name.to_string()]).expect("leaf params");
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![usage];
        let cert = params.signed_by(&key, issuer).expect("signing");
        std::fs::write(self.dir.join(format!("{file}.pem")), cert.pem()).expect("writing cert");
        std::fs::write(self.dir.join(format!("{file}.key")), key.serialize_pem())
            .expect("writing key");
    }

    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    pub fn pair(&self, file: &str) -> Pair {
        Pair {
            cert: self.dir.join(format!("{file}.pem")),
            key: self.dir.join(format!("{file}.key")),
        }
    }
}
