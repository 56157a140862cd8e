//! The services behind the VIPs: nginx backends (two per LB), the load balancers —
//! nftables NAT round robin (`dnat to numgen inc mod 2 map …`) on all but the last LB,
//! HAProxy in TCP mode on the last — and each LB's counters of what reached its stack
//! after the limiter (a netdev ingress table: it sees frames before reassembly, after
//! XDP). This machine's kernel has no IPVS (`ipvsadm`: "Protocol not available"), so the
//! kernel NAT load balancer is nftables' instead; its data path (conntrack, DNAT, the
//! backends' return route through the LB) is the one IPVS NAT uses.

use std::{
    net::{Ipv4Addr, SocketAddr, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};
use limiter_tests::netns::in_netns;

use super::{
    topology::{backend, in_ns, run, vip, ABUSER, SPOOF_RANGE, VIP_PREFIX},
    RuleSpec,
};
use crate::fleet_lab::fleet::{kill, spawn_tied, tail};

/// Fails naming the Debian package when `program` is not installed.
pub fn require(program: &str, package: &str) -> Result<()> {
    let found = std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|d| d.join(program).is_file()))
        .unwrap_or(false);
    if !found {
        bail!("{program} is missing: install Debian's {package} (`cargo xtask setup` does)");
    }
    Ok(())
}

/// Every tool the rehearsal runs, with its package.
pub const TOOLS: &[(&str, &str)] = &[
    ("nginx", "nginx"),
    ("haproxy", "haproxy"),
    ("wrk", "wrk"),
    ("curl", "curl"),
    ("hping3", "hping3"),
    ("nft", "nftables"),
    ("tcpdump", "tcpdump"),
    ("bpftool", "bpftool"),
    ("nsenter", "util-linux"),
];

/// Waits until `addr` accepts a TCP connection from namespace `ns`.
fn wait_listening(ns: &str, addr: SocketAddr, within: Duration) -> Result<()> {
    let deadline = Instant::now() + within;
    loop {
        let ok = in_netns(ns, move || {
            TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
        })?;
        if ok {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("nothing listens on {addr} in {ns} after {within:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One nginx serving `GET /` with a small page on `addr:80`, its files under `dir`.
pub struct Nginx {
    pub name: String,
    ns: String,
    addr: Ipv4Addr,
    prefix: PathBuf,
    child: Option<Child>,
}

impl Nginx {
    pub fn start(name: &str, ns: &str, addr: Ipv4Addr, dir: &Path) -> Result<Nginx> {
        let prefix = dir.join(name);
        std::fs::create_dir_all(prefix.join("tmp"))
            .with_context(|| format!("creating {}", prefix.display()))?;
        let conf = prefix.join("nginx.conf");
        let p = prefix.display();
        std::fs::write(
            &conf,
            format!(
                "user root;\nworker_processes 1;\npid {p}/nginx.pid;\nerror_log {p}/error.log warn;\n\
                 events {{ worker_connections 4096; }}\n\
                 http {{\n  access_log off;\n  client_body_temp_path {p}/tmp/body;\n\
                 proxy_temp_path {p}/tmp/proxy;\n  fastcgi_temp_path {p}/tmp/fastcgi;\n\
                 uwsgi_temp_path {p}/tmp/uwsgi;\n  scgi_temp_path {p}/tmp/scgi;\n\
                 keepalive_requests 1000000;\n\
                 server {{\n    listen {addr}:80 backlog=4096;\n    \
                 location / {{ return 200 \"{name} ok\\n\"; }}\n  }}\n}}\n"
            ),
        )
        .with_context(|| format!("writing {}", conf.display()))?;
        let mut n = Nginx {
            name: name.to_string(),
            ns: ns.to_string(),
            addr,
            prefix,
            child: None,
        };
        n.resume()?;
        Ok(n)
    }

    /// Starts it (again); returns once it listens.
    pub fn resume(&mut self) -> Result<()> {
        let conf = self.prefix.join("nginx.conf");
        let log = std::fs::File::create(self.prefix.join("stderr.log"))?;
        let child = spawn_tied(
            in_ns(&self.ns, "nginx")
                .arg("-c")
                .arg(&conf)
                .arg("-p")
                .arg(&self.prefix)
                .arg("-e")
                .arg(self.prefix.join("error.log"))
                .args(["-g", "daemon off;"])
                .stdout(Stdio::null())
                .stderr(log),
            libc::SIGKILL,
        )
        .with_context(|| format!("starting nginx {}", self.name))?;
        self.child = Some(child);
        wait_listening(
            &self.ns,
            SocketAddr::from((self.addr, 80)),
            Duration::from_secs(10),
        )
        .with_context(|| {
            format!(
                "nginx {}: {}",
                self.name,
                tail(&self.prefix.join("error.log"))
            )
        })
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Graceful stop (SIGQUIT: it finishes the requests it holds), then started again:
    /// a backend restarted under traffic.
    pub fn restart(&mut self) -> Result<()> {
        if let Some(c) = self.child.take() {
            stop(c, libc::SIGQUIT, Duration::from_secs(5));
        }
        self.resume()
    }
}

/// Ends `child` with `signal`, then SIGTERM, then SIGKILL, each given `grace`: an nginx
/// master ends its workers on SIGQUIT and SIGTERM, but a SIGKILL would leave them.
pub fn stop(mut child: Child, signal: libc::c_int, grace: Duration) {
    for sig in [signal, libc::SIGTERM] {
        // SAFETY: a process this rig started, not yet reaped: the pid is still ours.
        unsafe { libc::kill(child.id() as libc::pid_t, sig) };
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if !matches!(child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    kill(&mut child);
}

impl Drop for Nginx {
    fn drop(&mut self) {
        if let Some(c) = self.child.take() {
            stop(c, libc::SIGTERM, Duration::from_secs(2));
        }
    }
}

/// HAProxy in TCP mode on the VIP of LB `n`, health-checking its two backends.
pub struct Haproxy {
    child: Option<Child>,
}

impl Haproxy {
    pub fn start(ns: &str, n: usize, dir: &Path) -> Result<Haproxy> {
        let conf = dir.join(format!("haproxy-lb{n}.cfg"));
        std::fs::write(
            &conf,
            format!(
                "global\n  maxconn 4000\n\ndefaults\n  mode tcp\n  timeout connect 2s\n\
                 timeout client 30s\n  timeout server 30s\n\n\
                 frontend vip\n  bind {}:80 backlog 4096\n  default_backend web\n\n\
                 backend web\n  balance roundrobin\n  server b1 {}:80 check inter 1s\n  \
                 server b2 {}:80 check inter 1s\n",
                vip(n),
                backend(n, 0),
                backend(n, 1)
            ),
        )
        .with_context(|| format!("writing {}", conf.display()))?;
        let log = std::fs::File::create(dir.join(format!("haproxy-lb{n}.log")))?;
        let child = spawn_tied(
            in_ns(ns, "haproxy")
                .arg("-db")
                .arg("-f")
                .arg(&conf)
                .stdout(Stdio::null())
                .stderr(log),
            libc::SIGKILL,
        )
        .context("starting haproxy")?;
        let h = Haproxy { child: Some(child) };
        wait_listening(ns, SocketAddr::from((vip(n), 80)), Duration::from_secs(10))
            .context("haproxy")?;
        Ok(h)
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            kill(&mut c);
        }
    }
}

/// The counters each LB keeps of what reached its stack (after the limiter), by kind.
pub const COUNTERS: &[&str] = &[
    "abuser_syn",
    "flood_syn",
    "flood_udp",
    "flood_frag",
    "legit_syn",
];

/// LB `n`'s nftables: the NAT load balancer (`nat` true) and the counters.
pub fn nft_lb(ns: &str, n: usize, nat: bool) -> Result<()> {
    let mut text = format!(
        "table netdev soak_seen {{\n\
         counter abuser_syn {{}}\ncounter flood_syn {{}}\ncounter flood_udp {{}}\n\
         counter flood_frag {{}}\ncounter legit_syn {{}}\n\
         chain seen {{\n  type filter hook ingress device \"ingress\" priority 0;\n\
         ip saddr {SPOOF_RANGE} ip frag-off & 0x1fff != 0 counter name flood_frag accept\n\
         ip saddr {SPOOF_RANGE} ip frag-off & 0x2000 != 0 counter name flood_frag accept\n\
         ip saddr {SPOOF_RANGE} tcp flags & (syn | ack) == syn counter name flood_syn accept\n\
         ip saddr {SPOOF_RANGE} meta l4proto udp counter name flood_udp accept\n\
         ip saddr {ABUSER} tcp flags & (syn | ack) == syn counter name abuser_syn accept\n\
         ip saddr 198.18.64.0/24 tcp flags & (syn | ack) == syn counter name legit_syn accept\n\
         }}\n}}\n"
    );
    if nat {
        text.push_str(&format!(
            "table ip soak_lb {{\n chain balance {{\n  type nat hook prerouting priority dstnat;\n\
             ip daddr {} tcp dport 80 dnat to numgen inc mod 2 map {{ 0 : {}, 1 : {} }}\n }}\n}}\n",
            vip(n),
            backend(n, 0),
            backend(n, 1)
        ));
    }
    nft(ns, &text)
}

/// nftables doing the limiter's job on LB `ns`, the way an operator would without this
/// project: in a netdev ingress chain on `ingress` ahead of the counters (so they count
/// what it let through, before reassembly, as they do behind the limiter), a meter per
/// source for the service port's new connections and `limit` statements for the rest,
/// each fleet quota split statically over the `lbs` LBs (nftables has no allocator).
pub fn nft_guard(ns: &str, lbs: usize, rules: &[RuleSpec]) -> Result<()> {
    let share = |v: u64| (v / lbs.max(1) as u64).max(1);
    let mut chain = String::new();
    for r in rules {
        let matches = match (r.proto, r.dst_port) {
            (proto, None) => {
                // Not the ports of the more specific rules of its protocol (most
                // specific wins, as in the limiter).
                let taken: Vec<String> = rules
                    .iter()
                    .filter(|o| o.proto == proto)
                    .filter_map(|o| o.dst_port.map(|p| p.to_string()))
                    .collect();
                if taken.is_empty() || proto != "tcp" && proto != "udp" {
                    format!("meta l4proto {proto}")
                } else {
                    format!(
                        "meta l4proto {proto} {proto} dport != {{ {} }}",
                        taken.join(", ")
                    )
                }
            }
            (proto, Some(port)) => format!("{proto} dport {port}"),
        };
        let unit = if r.unit == "syn" {
            " tcp flags & (syn | ack) == syn"
        } else {
            ""
        };
        if let Some((rate, burst)) = r.per_source {
            chain.push_str(&format!(
                "    ip daddr {VIP_PREFIX} {matches}{unit} update @src_{} {{ ip saddr limit rate over \
                 {rate}/second burst {burst} packets }} counter drop\n",
                r.name.replace('-', "_")
            ));
        }
        chain.push_str(&format!(
            "    ip daddr {VIP_PREFIX} {matches}{unit} limit rate over {}/second burst {} packets \
             counter drop\n",
            share(r.rate),
            share(r.burst)
        ));
    }
    let sets: String = rules
        .iter()
        .filter(|r| r.per_source.is_some())
        .map(|r| {
            format!(
                "  set src_{} {{ type ipv4_addr; size 65536; flags dynamic,timeout; timeout 1m; }}\n",
                r.name.replace('-', "_")
            )
        })
        .collect();
    nft(
        ns,
        &format!(
            "table netdev soak_guard {{\n{sets}  chain guard {{\n    type filter hook ingress \
             device \"ingress\" priority -10; policy accept;\n{chain}  }}\n}}\n"
        ),
    )
}

/// A SYN proxy on LB `ns`'s VIP `vip`, as an operator adds one in front of a service the
/// LB terminates itself (HAProxy): SYNs to the VIP bypass conntrack and the kernel
/// answers them with a syncookie; only a client that completes the handshake reaches the
/// listener, and the flood's spoofed sources never do. Not on the NAT LBs: their DNAT
/// needs conntrack on the SYN, which `notrack` takes away. Behind the netdev guard and
/// the counters (prerouting and input run after ingress), so the counters still count
/// what the guard let through.
pub fn nft_synproxy(ns: &str, vip: std::net::Ipv4Addr) -> Result<()> {
    // A packet that matches no connection must be INVALID, not picked up mid-stream:
    // the proxy's ACK check relies on it.
    super::topology::sysctl(ns, "net.netfilter.nf_conntrack_tcp_loose=0")?;
    super::topology::sysctl(ns, "net.ipv4.tcp_syncookies=1")?;
    nft(
        ns,
        &format!(
            "table ip soak_synproxy {{\n\
             \x20 counter {SYNPROXY_COUNTER} {{}}\n\
             \x20 chain raw {{\n    type filter hook prerouting priority raw; policy accept;\n\
             \x20   ip daddr {vip} tcp flags & (syn | ack) == syn notrack\n  }}\n\
             \x20 chain proxy {{\n    type filter hook input priority filter; policy accept;\n\
             \x20   ip daddr {vip} meta l4proto tcp tcp flags & (syn | ack) == syn ct state untracked \
             counter name {SYNPROXY_COUNTER}\n\
             \x20   ip daddr {vip} meta l4proto tcp ct state invalid,untracked synproxy mss 1460 \
             wscale 7 timestamp sack-perm\n\
             \x20   ip daddr {vip} meta l4proto tcp ct state invalid drop\n  }}\n}}\n"
        ),
    )
}

/// The SYN proxy's counter: SYNs it answered with a syncookie.
const SYNPROXY_COUNTER: &str = "proxied_syn";

/// How many SYNs the SYN proxy on `ns` answered ([`nft_synproxy`]).
pub fn synproxy_answered(ns: &str) -> Result<u64> {
    let out =
        run(in_ns(ns, "nft").args(["-j", "list", "counters", "table", "ip", "soak_synproxy"]))?;
    parse_counters(&String::from_utf8_lossy(&out.stdout))?
        .into_iter()
        .find(|(name, _)| name == SYNPROXY_COUNTER)
        .map(|(_, packets)| packets)
        .with_context(|| format!("no counter {SYNPROXY_COUNTER} in {ns}'s soak_synproxy"))
}

/// Loads `text` into nftables in `ns`.
pub fn nft(ns: &str, text: &str) -> Result<()> {
    use std::io::Write as _;
    let mut child = in_ns(ns, "nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("running nft")?;
    child
        .stdin
        .take()
        .context("nft's stdin")?
        .write_all(text.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "nft in {ns}: {}\n{text}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// The LB's counters: packets per name of [`COUNTERS`].
pub fn read_counters(ns: &str) -> Result<Vec<(String, u64)>> {
    let out =
        run(in_ns(ns, "nft").args(["-j", "list", "counters", "table", "netdev", "soak_seen"]))?;
    parse_counters(&String::from_utf8_lossy(&out.stdout))
}

/// `nft -j list counters`' named counters: (name, packets).
pub fn parse_counters(json: &str) -> Result<Vec<(String, u64)>> {
    let v: serde_json::Value = serde_json::from_str(json).context("nft's JSON")?;
    let items = v
        .get("nftables")
        .and_then(|n| n.as_array())
        .context("nft's JSON has no nftables array")?;
    Ok(items
        .iter()
        .filter_map(|i| i.get("counter"))
        .filter_map(|c| {
            Some((
                c.get("name")?.as_str()?.to_string(),
                c.get("packets")?.as_u64()?,
            ))
        })
        .collect())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]
    use super::*;

    #[test]
    fn counters_from_nft_json() {
        let json = r#"{"nftables": [{"metainfo": {"version": "1.0.6"}},
          {"counter": {"family": "netdev", "name": "abuser_syn", "table": "soak_seen", "handle": 1, "packets": 12, "bytes": 720}},
          {"counter": {"family": "netdev", "name": "flood_udp", "table": "soak_seen", "handle": 2, "packets": 0, "bytes": 0}}]}"#;
        assert_eq!(
            parse_counters(json).unwrap(),
            vec![("abuser_syn".to_string(), 12), ("flood_udp".to_string(), 0)]
        );
        assert!(parse_counters("not json").is_err());
    }
}
