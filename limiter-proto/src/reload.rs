//! Mutual-TLS files re-read for new handshakes, so that renewed certificates (short-lived
//! ones above all) take effect without a restart, on both ends.
//!
//! Every handshake asks [`Reloading::current`] for its configuration. That looks at the
//! three files' (mtime, size, inode) and re-reads them only when one changed since the
//! last read, so a handshake costs three `stat`s. A change that does not make a whole
//! configuration (a file mid-write, unparsable, missing, or a key that does not match
//! its certificate because the certificate was written first) keeps the last good
//! configuration in force: it is logged and counted once per state of the files, and the
//! next change is read again. Connections already open keep the configuration they
//! were made with; TLS checks certificates only in a handshake.

use std::{
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex, PoisonError,
    },
    time::SystemTime,
};

use crate::{TlsError, TlsFiles};

/// What identifies one state of a file without reading it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    mtime: SystemTime,
    size: u64,
    inode: u64,
}

/// The stamps of the CA, certificate and key files (`None`: the file could not be
/// looked at, a state of its own).
type Stamps = [Option<Stamp>; 3];

fn stamp(path: &Path) -> Option<Stamp> {
    // Not `symlink_metadata`: a rotation that swaps a symbolic link (as Kubernetes
    // secrets do) changes what the link points to.
    let meta = std::fs::metadata(path).ok()?;
    Some(Stamp {
        mtime: meta.modified().ok()?,
        size: meta.len(),
        inode: meta.ino(),
    })
}

/// The paths of one end's PEM files (owned: a reloader outlives the configuration).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsPaths {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl TlsPaths {
    pub fn files(&self) -> TlsFiles<'_> {
        TlsFiles {
            ca: &self.ca,
            cert: &self.cert,
            key: &self.key,
        }
    }

    fn stamps(&self) -> Stamps {
        [stamp(&self.ca), stamp(&self.cert), stamp(&self.key)]
    }
}

type Build<T> = Box<dyn Fn(&TlsFiles<'_>) -> Result<T, TlsError> + Send + Sync>;

struct Cache<T> {
    good: Arc<T>,
    /// The files' stamps when `good` was read.
    good_stamps: Stamps,
    /// The files' stamps when they last failed to make a configuration: not read again
    /// (nor logged again) until they change.
    bad_stamps: Option<Stamps>,
}

/// A TLS configuration built from files, rebuilt when they change; the last good one
/// stays in force while they make none.
pub struct Reloading<T> {
    paths: TlsPaths,
    /// Which end, in logs: "server" or "client".
    side: &'static str,
    build: Build<T>,
    cache: Mutex<Cache<T>>,
    failures: AtomicU64,
    reloads: AtomicU64,
}

impl<T> std::fmt::Debug for Reloading<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloading")
            .field("paths", &self.paths)
            .field("side", &self.side)
            .finish_non_exhaustive()
    }
}

impl<T> Reloading<T> {
    /// Reads the files once: an error here (at start) is the caller's to report.
    pub fn new(
        paths: TlsPaths,
        side: &'static str,
        build: impl Fn(&TlsFiles<'_>) -> Result<T, TlsError> + Send + Sync + 'static,
    ) -> Result<Reloading<T>, TlsError> {
        let good_stamps = paths.stamps();
        let good = Arc::new(build(&paths.files())?);
        Ok(Reloading {
            paths,
            side,
            build: Box::new(build),
            cache: Mutex::new(Cache {
                good,
                good_stamps,
                bad_stamps: None,
            }),
            failures: AtomicU64::new(0),
            reloads: AtomicU64::new(0),
        })
    }

    /// The configuration for a new handshake: the files' current one, or the last good
    /// one when they make none now.
    pub fn current(&self) -> Arc<T> {
        // Stamped before reading: a write during the read changes the stamp again, so the
        // next handshake reads the files again.
        let stamps = self.paths.stamps();
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        if stamps == cache.good_stamps || Some(stamps) == cache.bad_stamps {
            return Arc::clone(&cache.good);
        }
        // A file that cannot be looked at fails the read, with its reason.
        let built = (self.build)(&self.paths.files());
        match built {
            Ok(config) => {
                cache.good = Arc::new(config);
                cache.good_stamps = stamps;
                cache.bad_stamps = None;
                self.reloads.fetch_add(1, Ordering::Relaxed);
                tracing::info!(
                    side = self.side,
                    cert = %self.paths.cert.display(),
                    "mutual-TLS files changed: new handshakes use them"
                );
            }
            Err(e) => {
                cache.bad_stamps = Some(stamps);
                self.failures.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    side = self.side,
                    "mutual-TLS files changed but make no valid configuration (a file \
                     mid-rotation, say): new handshakes keep the last good one: {e}"
                );
            }
        }
        Arc::clone(&cache.good)
    }

    /// Changes of the files that made no valid configuration (each state counted once).
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// Changes of the files taken into use.
    pub fn reloads(&self) -> u64 {
        self.reloads.load(Ordering::Relaxed)
    }
}

/// The allocator's end: [`crate::server_config`] of the current files.
pub type ServerTls = Reloading<rustls::ServerConfig>;

/// The daemon's end: [`crate::client_config`] of the current files.
pub type ClientTls = Reloading<rustls::ClientConfig>;

/// Server side, re-read for every new handshake (see the module doc).
pub fn server_tls_reloading(paths: TlsPaths) -> Result<ServerTls, TlsError> {
    Reloading::new(paths, "server", crate::server_config)
}

/// Client side, re-read for every new handshake (see the module doc).
pub fn client_tls_reloading(paths: TlsPaths) -> Result<ClientTls, TlsError> {
    Reloading::new(paths, "client", crate::client_config)
}

#[cfg(test)]
mod tests {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    };

    use super::*;

    struct Ca {
        issuer: Issuer<'static, KeyPair>,
        pem: String,
    }

    fn ca() -> Ca {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "reload test CA");
        let pem = params.self_signed(&key).unwrap().pem();
        Ca {
            issuer: Issuer::new(params, key),
            pem,
        }
    }

    /// (certificate PEM, key PEM) for `name`.
    fn leaf(ca: &Ca, name: &str) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec![name.to_string()]).unwrap();
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let cert = params.signed_by(&key, &ca.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    /// A reloader whose configuration is the name the certificate file's certificate
    /// names, built as the allocator's is (so a bad file fails as it would there).
    fn server(dir: &Path) -> Reloading<String> {
        let paths = TlsPaths {
            ca: dir.join("ca.pem"),
            cert: dir.join("cert.pem"),
            key: dir.join("key.pem"),
        };
        Reloading::new(paths, "server", |files| {
            crate::server_config(files)?;
            let pem = std::fs::read(files.cert).unwrap();
            Ok(crate::pem_cert_host_name(&pem).unwrap())
        })
        .unwrap()
    }

    fn write(dir: &Path, file: &str, text: &str) {
        std::fs::write(dir.join(file), text).unwrap();
    }

    fn setup(name: &str) -> (tempfile::TempDir, Ca, Reloading<String>) {
        let dir = tempfile::tempdir().unwrap();
        let ca = ca();
        let (cert, key) = leaf(&ca, name);
        write(dir.path(), "ca.pem", &ca.pem);
        write(dir.path(), "cert.pem", &cert);
        write(dir.path(), "key.pem", &key);
        let reloading = server(dir.path());
        (dir, ca, reloading)
    }

    #[test]
    fn a_renewed_pair_is_used_and_unchanged_files_are_not_read_again() {
        let (dir, ca, tls) = setup("one");
        assert_eq!(*tls.current(), "one");
        let first = tls.current();
        assert!(
            Arc::ptr_eq(&first, &tls.current()),
            "unchanged files read again"
        );
        // Renewed in place: the same inodes, written over.
        let (cert, key) = leaf(&ca, "second");
        write(dir.path(), "key.pem", &key);
        write(dir.path(), "cert.pem", &cert);
        assert_eq!(*tls.current(), "second");
        assert_eq!((tls.reloads(), tls.failures()), (1, 0));
        // Renewed by renaming new files over the old ones (new inodes).
        let (cert, key) = leaf(&ca, "third-one");
        write(dir.path(), "cert.new", &cert);
        write(dir.path(), "key.new", &key);
        std::fs::rename(dir.path().join("key.new"), dir.path().join("key.pem")).unwrap();
        std::fs::rename(dir.path().join("cert.new"), dir.path().join("cert.pem")).unwrap();
        assert_eq!(*tls.current(), "third-one");
        assert_eq!((tls.reloads(), tls.failures()), (2, 0));
    }

    #[test]
    fn a_partial_file_keeps_the_last_good_configuration_until_it_is_complete() {
        let (dir, ca, tls) = setup("one");
        let (cert, key) = leaf(&ca, "second");
        write(dir.path(), "key.pem", &key);
        // The certificate half written: the old pair stays (its key no longer matches,
        // but the configuration in force was built when it did).
        write(dir.path(), "cert.pem", &cert[..cert.len() / 2]);
        assert_eq!(*tls.current(), "one");
        assert_eq!(tls.failures(), 1);
        // Counted once per state of the files, not per handshake.
        assert_eq!(*tls.current(), "one");
        assert_eq!(tls.failures(), 1);
        // Gone for a moment (deleted, then written again): still the last good.
        std::fs::remove_file(dir.path().join("cert.pem")).unwrap();
        assert_eq!(*tls.current(), "one");
        assert_eq!(tls.failures(), 2);
        write(dir.path(), "cert.pem", &cert);
        assert_eq!(*tls.current(), "second");
        // An unparsable CA keeps the last good too.
        write(
            dir.path(),
            "ca.pem",
            "-----BEGIN CERTIFICATE-----\nnot base64\n",
        );
        assert_eq!(*tls.current(), "second");
        assert_eq!((tls.reloads(), tls.failures()), (1, 3));
    }

    #[test]
    fn a_key_that_does_not_match_its_certificate_keeps_the_last_good_pair() {
        let (dir, ca, tls) = setup("one");
        let (cert, key) = leaf(&ca, "second");
        // The certificate written first: for a moment it does not match the old key.
        write(dir.path(), "cert.pem", &cert);
        assert_eq!(*tls.current(), "one");
        assert_eq!(tls.failures(), 1);
        write(dir.path(), "key.pem", &key);
        assert_eq!(*tls.current(), "second");
        // Another certificate's key: refused, whatever it is.
        let (_, other_key) = leaf(&ca, "third-one");
        write(dir.path(), "key.pem", &other_key);
        assert_eq!(*tls.current(), "second");
        assert_eq!((tls.reloads(), tls.failures()), (1, 2));
    }
}
