//! A throwaway PKI for fleets run on this machine (the fleet tests, the fleet lab): a CA,
//! the allocator's server certificate, host client certificates `lb-1`…`lb-3`, and a rogue
//! CA with a client certificate of its own.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

pub struct Pki {
    pub dir: PathBuf,
}

/// (certificate, key) paths.
#[derive(Clone, Debug)]
pub struct Pair {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// The PEM files of an etcd served over TLS ([`Pki::etcd`] makes them; `crate::etcd`
/// serves with them).
#[derive(Clone, Debug)]
pub struct EtcdTls {
    /// Signs the server's and the clients' certificates.
    pub ca: PathBuf,
    pub server: Pair,
    /// A client certificate etcd accepts.
    pub client: Pair,
}

fn ca(name: &str) -> Result<(CertificateParams, KeyPair, String)> {
    let key = KeyPair::generate().context("generating a CA key")?;
    let mut params = CertificateParams::new(Vec::<String>::new()).context("CA parameters")?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let pem = params
        .self_signed(&key)
        .context("self-signing the CA")?
        .pem();
    Ok((params, key, pem))
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

impl Pki {
    /// Makes the PKI in `dir`.
    ///
    /// # Panics
    /// When it cannot be made (the test suites' constructor; [`Pki::create`] returns the
    /// error).
    pub fn new(dir: &Path) -> Pki {
        Pki::create(dir).unwrap_or_else(|e| panic!("making the test PKI: {e:#}"))
    }

    /// Makes the PKI in `dir`.
    pub fn create(dir: &Path) -> Result<Pki> {
        let pki = Pki {
            dir: dir.to_path_buf(),
        };
        let (params, key, pem) = ca("limiter test CA")?;
        write(&pki.ca(), &pem)?;
        let issuer = Issuer::new(params, key);
        pki.leaf(
            &issuer,
            "allocator",
            "limiter-allocator",
            ExtendedKeyUsagePurpose::ServerAuth,
        )?;
        for host in ["lb-1", "lb-2", "lb-3"] {
            pki.leaf(&issuer, host, host, ExtendedKeyUsagePurpose::ClientAuth)?;
        }
        // One certificate of 32 names (lb-m0 … lb-m31): still one host.
        let many: Vec<String> = (0..32).map(|i| format!("lb-m{i}")).collect();
        pki.leaf_for(
            &issuer,
            "many-names",
            &many,
            vec![ExtendedKeyUsagePurpose::ClientAuth],
        )?;
        let (rogue_params, rogue_key, rogue_pem) = ca("rogue CA")?;
        write(&dir.join("rogue-ca.pem"), &rogue_pem)?;
        let rogue = Issuer::new(rogue_params, rogue_key);
        pki.leaf(
            &rogue,
            "rogue",
            "lb-rogue",
            ExtendedKeyUsagePurpose::ClientAuth,
        )?;
        Ok(pki)
    }

    /// A CA of etcd's own in `dir` (etcd's cluster is secured apart from the fleet's),
    /// its server certificate for `names` (IP addresses become IP SANs), and one client
    /// certificate.
    pub fn etcd(dir: &Path, names: &[String]) -> Result<EtcdTls> {
        let pki = Pki {
            dir: dir.to_path_buf(),
        };
        let (params, key, pem) = ca("etcd test CA")?;
        let ca = dir.join("etcd-ca.pem");
        write(&ca, &pem)?;
        let issuer = Issuer::new(params, key);
        // etcd's gRPC gateway dials etcd itself with the server certificate, so it is a
        // client certificate too.
        pki.leaf_for(
            &issuer,
            "etcd-server",
            names,
            vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        )?;
        pki.leaf(
            &issuer,
            "etcd-client",
            "limiter-allocator",
            ExtendedKeyUsagePurpose::ClientAuth,
        )?;
        Ok(EtcdTls {
            ca,
            server: pki.pair("etcd-server"),
            client: pki.pair("etcd-client"),
        })
    }

    fn leaf(
        &self,
        issuer: &Issuer<'_, KeyPair>,
        file: &str,
        name: &str,
        usage: ExtendedKeyUsagePurpose,
    ) -> Result<()> {
        self.leaf_for(issuer, file, &[name.to_string()], vec![usage])
    }

    fn leaf_for(
        &self,
        issuer: &Issuer<'_, KeyPair>,
        file: &str,
        names: &[String],
        usages: Vec<ExtendedKeyUsagePurpose>,
    ) -> Result<()> {
        let name = names.first().map_or("", String::as_str);
        let key = KeyPair::generate().context("generating a leaf key")?;
        let mut params = CertificateParams::new(names.to_vec()).context("leaf parameters")?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = usages;
        let cert = params
            .signed_by(&key, issuer)
            .with_context(|| format!("signing the certificate of {name}"))?;
        write(&self.dir.join(format!("{file}.pem")), &cert.pem())?;
        write(&self.dir.join(format!("{file}.key")), &key.serialize_pem())
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
