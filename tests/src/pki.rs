//! A throwaway PKI for fleets run on this machine (the fleet tests, the fleet lab): a CA,
//! the allocator's server certificate, host client certificates `lb-1`…`lb-3`, and a rogue
//! CA with a client certificate of its own.

use std::{
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

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

const TEST_CA: &str = "limiter test CA";

fn ca(name: &str) -> Result<(CertificateParams, KeyPair, String)> {
    let key = KeyPair::generate().context("generating a CA key")?;
    let params = ca_params(name)?;
    let pem = params
        .self_signed(&key)
        .context("self-signing the CA")?
        .pem();
    Ok((params, key, pem))
}

fn ca_params(name: &str) -> Result<CertificateParams> {
    let mut params = CertificateParams::new(Vec::<String>::new()).context("CA parameters")?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    Ok(params)
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
        let (params, key, pem) = ca(TEST_CA)?;
        write(&pki.ca(), &pem)?;
        // Kept for renewals ([`Pki::renew`]).
        write(&dir.join("ca.key"), &key.serialize_pem())?;
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

    /// Issues `file`'s certificate again with a new key, valid from a minute ago for
    /// `validity`, as a short-lived PKI renews it (`allocator`: the allocator's server
    /// certificate; any other file: the client certificate of the host of that name).
    /// Written over the old files in place, the certificate first, so for a moment the
    /// certificate on disk does not match the key. Returns when it expires.
    pub fn renew(&self, file: &str, validity: Duration) -> Result<SystemTime> {
        let (name, usage) = match file {
            "allocator" => ("limiter-allocator", ExtendedKeyUsagePurpose::ServerAuth),
            host => (host, ExtendedKeyUsagePurpose::ClientAuth),
        };
        let ca_key = std::fs::read_to_string(self.dir.join("ca.key")).context("the CA's key")?;
        let ca_key = KeyPair::from_pem(&ca_key).context("the CA's key")?;
        let issuer = Issuer::new(ca_params(TEST_CA)?, ca_key);
        let now = SystemTime::now();
        let since_epoch = now.duration_since(SystemTime::UNIX_EPOCH)?;
        let epoch = rcgen::date_time_ymd(1970, 1, 1);
        let expiry = now + validity;
        self.issue(&issuer, file, &[name.to_string()], vec![usage], |params| {
            params.not_before = epoch + since_epoch.saturating_sub(Duration::from_secs(60));
            params.not_after = epoch + since_epoch + validity;
        })?;
        Ok(expiry)
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
        self.issue(issuer, file, names, usages, |_| {})
    }

    /// A leaf certificate, its parameters `adjust`ed last (rcgen's default validity: from
    /// 1975 to 4096).
    fn issue(
        &self,
        issuer: &Issuer<'_, KeyPair>,
        file: &str,
        names: &[String],
        usages: Vec<ExtendedKeyUsagePurpose>,
        adjust: impl FnOnce(&mut CertificateParams),
    ) -> Result<()> {
        let name = names.first().map_or("", String::as_str);
        let key = KeyPair::generate().context("generating a leaf key")?;
        let mut params = CertificateParams::new(names.to_vec()).context("leaf parameters")?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = usages;
        adjust(&mut params);
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
