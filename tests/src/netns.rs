//! Network namespaces and veth pairs that the tests create and always remove.
//!
//! Layout: the limited end (`host`) stays in the root namespace, where the test process
//! and its bpffs live; the peer (`peer`) sits in a namespace of its own, where traffic is
//! sent from. Frames end at `host`: forwarding is never enabled, and frames sent to the
//! host's MAC with a TEST-NET destination have nowhere to go.

use std::{
    fs::File,
    os::fd::AsRawFd,
    process::Command,
    sync::atomic::{AtomicU32, Ordering},
};

use anyhow::{bail, Context as _, Result};

static NEXT_ID: AtomicU32 = AtomicU32::new(0);

/// Runs `ip` with `args`; fails with its stderr.
pub fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("running `ip` (iproute2 missing? `cargo xtask setup` installs it)")?;
    if !out.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Fails with a clear message unless the test runs as root.
pub fn require_root() -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("this test needs root (it loads XDP programs and creates network namespaces)");
    }
    Ok(())
}

/// A veth pair, `host` in the root namespace and `peer` in namespace `ns`.
pub struct VethPair {
    pub ns: String,
    pub host: String,
    pub peer: String,
    pub host_mac: [u8; 6],
    pub peer_mac: [u8; 6],
}

impl VethPair {
    /// Creates namespace and pair with `queues` RX/TX queues on each end (one CPU can
    /// run XDP per RX queue).
    pub fn new(queues: u32) -> Result<VethPair> {
        require_root()?;
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        // Interface names are at most 15 bytes.
        let tag = format!("{:x}{:x}", pid % 0xfffff, id);
        let pair = VethPair {
            ns: format!("limtest-{tag}"),
            host: format!("lh{tag}"),
            peer: format!("lp{tag}"),
            host_mac: [0x02, 0x4c, 0x48, 0, (id >> 8) as u8, id as u8],
            peer_mac: [0x02, 0x4c, 0x50, 0, (id >> 8) as u8, id as u8],
        };
        // From here on, Drop removes whatever was created, also on a failed step.
        ip(&["netns", "add", &pair.ns])?;
        let q = queues.to_string();
        ip(&[
            "link",
            "add",
            &pair.host,
            "numtxqueues",
            &q,
            "numrxqueues",
            &q,
            "address",
            &mac_str(pair.host_mac),
            "type",
            "veth",
            "peer",
            "name",
            &pair.peer,
            "numtxqueues",
            &q,
            "numrxqueues",
            &q,
            "address",
            &mac_str(pair.peer_mac),
            "netns",
            &pair.ns,
        ])?;
        for (ns, dev) in [(None, &pair.host), (Some(&pair.ns), &pair.peer)] {
            let mut args = Vec::new();
            if let Some(ns) = ns {
                args.extend(["-n", ns.as_str()]);
            }
            // No IPv6 autoconfiguration chatter: every frame on the link is the test's.
            let sysctl = format!("/proc/sys/net/ipv6/conf/{dev}/disable_ipv6");
            match ns {
                None => {
                    std::fs::write(&sysctl, "1").with_context(|| format!("writing {sysctl}"))?
                }
                Some(ns) => in_netns(ns, move || {
                    std::fs::write(&sysctl, "1").with_context(|| format!("writing {sysctl}"))
                })??,
            }
            args.extend(["link", "set", dev.as_str(), "up"]);
            ip(&args)?;
        }
        ip(&["-n", &pair.ns, "link", "set", "lo", "up"])?;
        Ok(pair)
    }

    /// Interface index of `host` (root namespace).
    pub fn host_ifindex(&self) -> Result<u32> {
        ifindex(&self.host)
    }
}

impl Drop for VethPair {
    fn drop(&mut self) {
        // Deleting the host end deletes the pair; deleting the namespace deletes anything
        // left inside. Errors are ignored: each may already be gone.
        let _ = Command::new("ip")
            .args(["link", "del", &self.host])
            .output();
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).output();
    }
}

fn mac_str(mac: [u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Interface index of `name` in the calling thread's network namespace.
pub fn ifindex(name: &str) -> Result<u32> {
    let c = std::ffi::CString::new(name).context("interface name contains NUL")?;
    // SAFETY: valid C string.
    let idx = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if idx == 0 {
        bail!("no interface {name}: {}", std::io::Error::last_os_error());
    }
    Ok(idx)
}

/// Runs `f` on a fresh thread that has entered network namespace `ns` (setns affects
/// only the calling thread, so the test's own thread never moves). Sockets created in
/// `f` stay bound to `ns` for their lifetime.
pub fn spawn_in_netns<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<std::thread::JoinHandle<Result<T>>> {
    let path = format!("/var/run/netns/{ns}");
    let file = File::open(&path).with_context(|| format!("opening {path}"))?;
    Ok(std::thread::spawn(move || {
        // SAFETY: a valid namespace fd; CLONE_NEWNET moves only this thread.
        if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            bail!("setns into {path}: {}", std::io::Error::last_os_error());
        }
        Ok(f())
    }))
}

/// [`spawn_in_netns`] and wait for the result.
pub fn in_netns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> Result<T> {
    spawn_in_netns(ns, f)?
        .join()
        .map_err(|_| anyhow::anyhow!("thread in netns {ns} panicked"))?
}
