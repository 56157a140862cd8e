//! A real etcd (Debian's etcd-server) for the allocator replicas' tests and the fleet
//! lab: one member on loopback ports of its own, its data in a directory the caller
//! owns, killed on drop. Several loopback addresses serve the same member, so a test can
//! cut one replica off from etcd (nftables on that address) and leave the others.
//! [`Etcd::start_tls`] serves clients over TLS and asks them for a certificate
//! (`--client-cert-auth`), as a production cluster would.

use std::{
    net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

pub use crate::pki::EtcdTls;

pub const ETCD: &str = "/usr/bin/etcd";

pub struct Etcd {
    child: Option<Child>,
    data: PathBuf,
    /// Client addresses, one per loopback address asked for.
    pub clients: Vec<SocketAddr>,
    peer: SocketAddr,
    tls: Option<EtcdTls>,
}

fn free_port(ip: Ipv4Addr) -> Result<u16> {
    Ok(TcpListener::bind((ip, 0))
        .context("finding a free port")?
        .local_addr()?
        .port())
}

impl Etcd {
    /// Starts etcd with its data under `dir`, serving clients on one port at each of
    /// `addresses` (loopback addresses such as 127.0.0.11). Fails, naming what is
    /// missing, when Debian's etcd-server is not installed.
    pub fn start(dir: &Path, addresses: &[Ipv4Addr]) -> Result<Etcd> {
        Etcd::started(dir, addresses, None)
    }

    /// Like [`Etcd::start`], over TLS with `tls`'s files, refusing clients without a
    /// certificate its CA signed.
    pub fn start_tls(dir: &Path, addresses: &[Ipv4Addr], tls: EtcdTls) -> Result<Etcd> {
        Etcd::started(dir, addresses, Some(tls))
    }

    fn started(dir: &Path, addresses: &[Ipv4Addr], tls: Option<EtcdTls>) -> Result<Etcd> {
        if !Path::new(ETCD).exists() {
            bail!("{ETCD} is missing: `cargo xtask setup` installs Debian's etcd-server");
        }
        let port = free_port(addresses[0])?;
        let clients = addresses
            .iter()
            .map(|&ip| SocketAddr::from((ip, port)))
            .collect();
        let peer = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port(Ipv4Addr::LOCALHOST)?));
        let mut etcd = Etcd {
            child: None,
            data: dir.join("etcd"),
            clients,
            peer,
            tls,
        };
        etcd.resume()?;
        Ok(etcd)
    }

    fn scheme(&self) -> &'static str {
        if self.tls.is_some() {
            "https"
        } else {
            "http"
        }
    }

    /// `http://addr:port` (`https://` over TLS) for client address `i`, as
    /// `[election] etcd` lists them.
    pub fn endpoint(&self, i: usize) -> String {
        format!("{}://{}", self.scheme(), self.clients[i])
    }

    /// Starts (again) over the same data directory.
    pub fn resume(&mut self) -> Result<()> {
        let urls: Vec<String> = (0..self.clients.len()).map(|i| self.endpoint(i)).collect();
        let peer = format!("http://{}", self.peer);
        let mut command = Command::new(ETCD);
        if let Some(tls) = &self.tls {
            command
                .arg(format!("--cert-file={}", tls.server.cert.display()))
                .arg(format!("--key-file={}", tls.server.key.display()))
                .arg(format!("--trusted-ca-file={}", tls.ca.display()))
                .arg("--client-cert-auth");
        }
        let child = command
            .arg("--name=limtest")
            .arg(format!("--data-dir={}", self.data.display()))
            .arg(format!("--listen-client-urls={}", urls.join(",")))
            .arg(format!("--advertise-client-urls={}", urls[0]))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=limtest={peer}"))
            .arg("--log-level=error")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {ETCD}"))?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(15);
        while !self.healthy() {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                bail!("etcd exited at start: {status}");
            }
            if Instant::now() > deadline {
                bail!("etcd did not become healthy within 15 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// Whether etcd answers `/health` with a leader.
    pub fn healthy(&self) -> bool {
        use std::io::{Read as _, Write as _};
        if self.tls.is_some() {
            return self
                .curl(&["-sS", "--max-time", "1"], "/health")
                .is_ok_and(|text| text.contains("\"health\":\"true\""));
        }
        let Ok(mut stream) =
            TcpStream::connect_timeout(&self.clients[0], Duration::from_millis(200))
        else {
            return false;
        };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
        if stream.write_all(b"GET /health HTTP/1.0\r\n\r\n").is_err() {
            return false;
        }
        let mut text = String::new();
        let _ = stream.read_to_string(&mut text);
        text.contains("\"health\":\"true\"")
    }

    /// Writes `value` at `key` through etcd's JSON gateway (what an operator's etcdctl
    /// put would do).
    pub fn put(&self, key: &str, value: &str) -> Result<()> {
        let body = format!(
            "{{\"key\":\"{}\",\"value\":\"{}\"}}",
            base64(key)?,
            base64(value)?
        );
        self.curl(
            &["-sS", "--max-time", "5", "-X", "POST", "-d", &body],
            "/v3/kv/put",
        )
        .map(drop)
    }

    /// curl with `args` at `path` of the first client address (with the client
    /// certificate over TLS); its output.
    fn curl(&self, args: &[&str], path: &str) -> Result<String> {
        let mut command = Command::new("curl");
        command.args(args);
        if let Some(tls) = &self.tls {
            command
                .arg("--cacert")
                .arg(&tls.ca)
                .arg("--cert")
                .arg(&tls.client.cert)
                .arg("--key")
                .arg(&tls.client.key);
        }
        let out = command
            .arg(format!("{}{path}", self.endpoint(0)))
            .output()
            .context("running curl")?;
        if !out.status.success() {
            bail!("curl: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Its process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Stops etcd (SIGKILL: an outage, not a clean stop).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill();
    }
}

/// coreutils' base64 of `text`, for the gateway's JSON.
fn base64(text: &str) -> Result<String> {
    use std::io::Write as _;
    let mut child = Command::new("base64")
        .arg("-w0")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("running base64")?;
    child
        .stdin
        .take()
        .context("base64's stdin")?
        .write_all(text.as_bytes())?;
    let out = child.wait_with_output()?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
