//! The rehearsal's network, all in namespaces it creates (`sk<pid>-…`) and deletes on
//! drop: `net` (the Internet: forwards between the others), `cl` (clients), `at`
//! (attackers), `ctl` (etcd and the allocator replicas), and per LB `lbN` (the limiter on
//! its `ingress`, the load balancer, a management link to `ctl`) and `beN` (its nginx
//! backends, whose default route goes back through the LB). Forwarding is enabled only
//! inside `net` and the LBs; no interface of the root namespace is touched.
//!
//! Addresses (all in 198.18.0.0/15):
//! - VIP of LB N: 198.18.10.N (on the LB's lo; every VIP is in 198.18.10.0/29);
//! - `net` ↔ LB N: 198.18.2N.0/24 (net .1, LB .2); `net` ↔ `cl`: 198.18.40.0/24;
//!   `net` ↔ `at`: 198.18.41.0/24 (the abuser is `at`'s own 198.18.41.2);
//! - clients' sources: 198.18.64.0/24 (a local route in `cl`: curl binds any of them);
//! - LB N ↔ its backends: 198.18.3N.0/24 (LB .1, nginx on .11 and .12);
//! - management: `ctl` ↔ LB N on 198.19.1.4N/30, the replicas on 198.19.0.1 (`ctl`'s lo);
//! - the floods' spoofed sources: 198.19.128.0/17, rewritten so on `at`'s egress and
//!   blackholed in `net` and every LB, so no reply goes anywhere.

use std::{
    net::Ipv4Addr,
    process::{Command, Output},
};

use anyhow::{bail, Context as _, Result};
use limiter_tests::netns::ip;

pub const VIP_PREFIX: &str = "198.18.10.0/29";
pub const CLIENT_SOURCES: &str = "198.18.64.0/24";
pub const ABUSER: Ipv4Addr = Ipv4Addr::new(198, 18, 41, 2);
pub const SPOOF_RANGE: &str = "198.19.128.0/17";
pub const ALLOCATOR_ADDR: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 1);

/// LB `n`'s VIP (1-based).
pub fn vip(n: usize) -> Ipv4Addr {
    Ipv4Addr::new(198, 18, 10, n as u8)
}

/// Backend `k` (0 or 1) of LB `n`.
pub fn backend(n: usize, k: usize) -> Ipv4Addr {
    Ipv4Addr::new(198, 18, 30 + n as u8, 11 + k as u8)
}

/// Client source `k` of 198.18.64.0/24 (1..=254).
pub fn client_source(k: usize) -> Ipv4Addr {
    Ipv4Addr::new(198, 18, 64, (k % 254 + 1) as u8)
}

/// The namespaces of one run; deleted on drop (their links with them).
pub struct Topology {
    pub tag: String,
    pub lbs: usize,
    made: Vec<String>,
}

/// Runs `cmd`; fails with its stderr.
pub fn run(cmd: &mut Command) -> Result<Output> {
    let out = cmd
        .output()
        .with_context(|| format!("running {:?}", cmd.get_program()))?;
    if !out.status.success() {
        bail!(
            "{:?} {:?}: {}",
            cmd.get_program(),
            cmd.get_args().collect::<Vec<_>>(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out)
}

/// `nsenter --net=/run/netns/NS PROGRAM`: a program in namespace `ns` (nsenter execs
/// it, so the child's pid is the program's; unlike `ip netns exec` it leaves /sys, and
/// so /sys/fs/bpf, as it is).
pub fn in_ns(ns: &str, program: &str) -> Command {
    let mut cmd = Command::new("nsenter");
    cmd.arg(format!("--net=/run/netns/{ns}")).arg(program);
    cmd
}

impl Topology {
    /// Creates every namespace, link, address and route.
    pub fn new(lbs: usize) -> Result<Topology> {
        limiter_tests::netns::require_root()?;
        let tag = format!("sk{:x}", std::process::id() % 0xfffff);
        let mut t = Topology {
            tag,
            lbs,
            made: Vec::new(),
        };
        t.build().context("building the soak's namespaces")?;
        Ok(t)
    }

    pub fn ns(&self, role: &str) -> String {
        format!("{}-{role}", self.tag)
    }

    pub fn ctl(&self) -> String {
        self.ns("ctl")
    }

    pub fn lb(&self, n: usize) -> String {
        self.ns(&format!("lb{n}"))
    }

    pub fn be(&self, n: usize) -> String {
        self.ns(&format!("be{n}"))
    }

    fn add_ns(&mut self, ns: &str) -> Result<()> {
        ip(&["netns", "add", ns])?;
        self.made.push(ns.to_string());
        ip(&["-n", ns, "link", "set", "lo", "up"])?;
        // No IPv6 chatter on the links: every frame is the rehearsal's.
        for key in ["all", "default"] {
            sysctl(ns, &format!("net.ipv6.conf.{key}.disable_ipv6=1"))?;
        }
        Ok(())
    }

    /// A veth from `a` (named `a_name`, address `a_addr`) to `b`.
    fn link(
        &self,
        a: &str,
        a_name: &str,
        a_addr: &str,
        b: &str,
        b_name: &str,
        b_addr: &str,
    ) -> Result<()> {
        ip(&[
            "-n", a, "link", "add", a_name, "type", "veth", "peer", "name", b_name, "netns", b,
        ])?;
        for (ns, name, addr) in [(a, a_name, a_addr), (b, b_name, b_addr)] {
            ip(&["-n", ns, "addr", "add", addr, "dev", name])?;
            ip(&["-n", ns, "link", "set", "dev", name, "up"])?;
        }
        Ok(())
    }

    fn build(&mut self) -> Result<()> {
        let (net, cl, at, ctl) = (self.ns("net"), self.ns("cl"), self.ns("at"), self.ctl());
        for ns in [&net, &cl, &at, &ctl] {
            self.add_ns(ns)?;
        }
        sysctl(&net, "net.ipv4.ip_forward=1")?;
        self.link(&net, "cl", "198.18.40.1/24", &cl, "wan", "198.18.40.2/24")?;
        self.link(&net, "at", "198.18.41.1/24", &at, "wan", "198.18.41.2/24")?;
        ip(&["-n", &cl, "route", "add", "default", "via", "198.18.40.1"])?;
        ip(&[
            "-n",
            &cl,
            "route",
            "add",
            "local",
            CLIENT_SOURCES,
            "dev",
            "lo",
        ])?;
        ip(&["-n", &at, "route", "add", "default", "via", "198.18.41.1"])?;
        ip(&[
            "-n",
            &net,
            "route",
            "add",
            CLIENT_SOURCES,
            "via",
            "198.18.40.2",
        ])?;
        ip(&["-n", &net, "route", "add", "blackhole", SPOOF_RANGE])?;
        ip(&[
            "-n",
            &ctl,
            "addr",
            "add",
            &format!("{ALLOCATOR_ADDR}/32"),
            "dev",
            "lo",
        ])?;
        for n in 1..=self.lbs {
            let (lb, be) = (self.lb(n), self.be(n));
            self.add_ns(&lb)?;
            self.add_ns(&be)?;
            sysctl(&lb, "net.ipv4.ip_forward=1")?;
            let i = 20 + n;
            self.link(
                &net,
                &format!("lb{n}"),
                &format!("198.18.{i}.1/24"),
                &lb,
                "ingress",
                &format!("198.18.{i}.2/24"),
            )?;
            ip(&[
                "-n",
                &net,
                "route",
                "add",
                &format!("{}/32", vip(n)),
                "via",
                &format!("198.18.{i}.2"),
            ])?;
            ip(&[
                "-n",
                &lb,
                "addr",
                "add",
                &format!("{}/32", vip(n)),
                "dev",
                "lo",
            ])?;
            for to in [CLIENT_SOURCES, "198.18.40.0/24", "198.18.41.0/24"] {
                ip(&[
                    "-n",
                    &lb,
                    "route",
                    "add",
                    to,
                    "via",
                    &format!("198.18.{i}.1"),
                ])?;
            }
            ip(&["-n", &lb, "route", "add", "blackhole", SPOOF_RANGE])?;
            let b = 30 + n;
            self.link(
                &lb,
                "backend",
                &format!("198.18.{b}.1/24"),
                &be,
                "front",
                &format!("{}/24", backend(n, 0)),
            )?;
            ip(&[
                "-n",
                &be,
                "addr",
                "add",
                &format!("{}/24", backend(n, 1)),
                "dev",
                "front",
            ])?;
            ip(&[
                "-n",
                &be,
                "route",
                "add",
                "default",
                "via",
                &format!("198.18.{b}.1"),
            ])?;
            let m = 4 * n as u8;
            self.link(
                &ctl,
                &format!("lb{n}"),
                &format!("198.19.1.{}/30", m + 1),
                &lb,
                "mgmt",
                &format!("198.19.1.{}/30", m + 2),
            )?;
            ip(&[
                "-n",
                &lb,
                "route",
                "add",
                &format!("{ALLOCATOR_ADDR}/32"),
                "via",
                &format!("198.19.1.{}", m + 1),
            ])?;
        }
        Ok(())
    }

    /// Cuts LB `n` off from the allocators (its management link down), or heals it.
    pub fn set_partitioned(&self, n: usize, cut: bool) -> Result<()> {
        let lb = self.lb(n);
        ip(&[
            "-n",
            &lb,
            "link",
            "set",
            "dev",
            "mgmt",
            if cut { "down" } else { "up" },
        ])?;
        if !cut {
            // The route through the link went with it.
            let m = 4 * n as u8;
            let _ = ip(&[
                "-n",
                &lb,
                "route",
                "replace",
                &format!("{ALLOCATOR_ADDR}/32"),
                "via",
                &format!("198.19.1.{}", m + 1),
            ]);
        }
        Ok(())
    }

    /// Every namespace's name (for the report).
    pub fn namespaces(&self) -> &[String] {
        &self.made
    }
}

/// `sysctl -w KEY=VALUE` inside `ns` (the namespace's own net.* tree).
pub fn sysctl(ns: &str, assignment: &str) -> Result<()> {
    run(in_ns(ns, "sysctl").args(["-q", "-w", assignment])).map(drop)
}

impl Drop for Topology {
    fn drop(&mut self) {
        // Deleting a namespace deletes its links (and their peers); what ran inside was
        // ended before.
        for ns in self.made.iter().rev() {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
    }
}
