//! The attacks, from the attackers' namespace, each bounded in count and time: hping3 SYN
//! floods (random sources, to a port of the VIP no service listens on), UDP floods,
//! fragment floods, and a per-source abuser (wrk from the namespace's one address, every
//! request on a new connection to port 80, as fast as it can). Each minute they hit
//! another LB (the seeded schedule moves them).
//!
//! **Confinement.** `--rand-source` picks any IPv4 address; an nftables rule on the
//! attackers' egress rewrites every source but the abuser's into 198.19.128.0/17
//! (`ip saddr set ip saddr & 0.0.127.255 | 198.19.128.0`, checksums updated), and that
//! range is blackholed in `net` and in every LB, so replies die there.
//! [`check_confinement`] captures what leaves the namespace and fails the run unless every
//! source is in range.

use std::{
    net::Ipv4Addr,
    process::{Child, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

use super::{
    in_spoof_range,
    services::nft,
    topology::{in_ns, vip, ABUSER},
    SoakConfig,
};
use crate::fleet_lab::fleet::{kill, spawn_tied};

/// The egress rewrite on the attackers' `wan`.
pub fn confine(ns: &str) -> Result<()> {
    nft(
        ns,
        &format!(
            "table netdev soak_confine {{\n chain egress {{\n  type filter hook egress device \"wan\" priority 0;\n\
             meta protocol ip ip saddr != {ABUSER} ip saddr set ip saddr & 0.0.127.255 | 198.19.128.0\n }}\n}}\n"
        ),
    )
}

/// `program` in the attackers' namespace at the lowest CPU priority (nice 19): on this
/// machine the attackers share the LBs' two cores, where in the field they run on
/// machines of their own; niced, they cost the LBs and clients the least CPU they can
/// while still offering many times every quota.
fn attacker(ns: &str, program: &str) -> std::process::Command {
    let mut cmd = in_ns(ns, "nice");
    cmd.args(["-n", "19", program]);
    cmd
}

/// The kinds of attack, as the report names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Attack {
    SynFlood,
    UdpFlood,
    FragFlood,
    Abuser,
}

impl Attack {
    pub const ALL: [Attack; 4] = [
        Attack::SynFlood,
        Attack::UdpFlood,
        Attack::FragFlood,
        Attack::Abuser,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Attack::SynFlood => "syn-flood",
            Attack::UdpFlood => "udp-flood",
            Attack::FragFlood => "frag-flood",
            Attack::Abuser => "abuser",
        }
    }

    /// The LB counter ([`super::services::COUNTERS`]) of what it got through.
    pub fn counter(self) -> &'static str {
        match self {
            Attack::SynFlood => "flood_syn",
            Attack::UdpFlood => "flood_udp",
            Attack::FragFlood => "flood_frag",
            Attack::Abuser => "abuser_syn",
        }
    }

    /// The rule that holds it.
    pub fn rule(self) -> &'static str {
        match self {
            Attack::SynFlood => "vip-syn",
            Attack::UdpFlood | Attack::FragFlood => "vip-udp",
            Attack::Abuser => "web",
        }
    }

    /// hping3's microseconds between packets for `pps`.
    fn interval(pps: u32) -> String {
        format!("u{}", 1_000_000 / pps.max(1))
    }

    /// The command that runs it against LB `lb` for `length`.
    fn command(
        self,
        ns: &str,
        lb: usize,
        c: &SoakConfig,
        length: Duration,
    ) -> std::process::Command {
        let count = |pps: u32| (u64::from(pps) * length.as_secs()).max(1).to_string();
        let target = vip(lb).to_string();
        match self {
            Attack::SynFlood => {
                let mut cmd = attacker(ns, "hping3");
                cmd.args(["-q", "-S", "-p", "443", "--rand-source", "-i"])
                    .arg(Attack::interval(c.syn_flood_pps))
                    .args(["-c", &count(c.syn_flood_pps), &target]);
                cmd
            }
            Attack::UdpFlood => {
                let mut cmd = attacker(ns, "hping3");
                cmd.args([
                    "-q",
                    "--udp",
                    "-p",
                    "9999",
                    "-d",
                    "64",
                    "--rand-source",
                    "-i",
                ])
                .arg(Attack::interval(c.udp_flood_pps))
                .args(["-c", &count(c.udp_flood_pps), &target]);
                cmd
            }
            Attack::FragFlood => {
                // 96 bytes of data in 16-byte fragments: 7 frames a datagram.
                let mut cmd = attacker(ns, "hping3");
                cmd.args(["-q", "--udp", "-p", "53", "-d", "96", "-f", "-m", "16"])
                    .args(["--rand-source", "-i"])
                    .arg(Attack::interval(c.frag_flood_pps))
                    .args(["-c", &count(c.frag_flood_pps), &target]);
                cmd
            }
            Attack::Abuser => {
                let mut cmd = attacker(ns, "wrk");
                cmd.args(["-t1", &format!("-c{}", c.abuser_connections)])
                    .arg(format!("-d{}s", length.as_secs().max(1)))
                    .args(["--timeout", "2s", "-H", "Connection: close"])
                    .arg(format!("http://{target}/"));
                cmd
            }
        }
    }
}

/// An attack running: its process and when it must have ended.
pub struct Running {
    pub attack: Attack,
    pub lb: usize,
    pub from: f64,
    deadline: Instant,
    child: Option<Child>,
}

/// The attacks of the run; every process ended by its pid on drop.
#[derive(Default)]
pub struct Attacks {
    pub running: Vec<Running>,
    /// (attack, lb, from, to): s since the run's epoch.
    pub log: Vec<(Attack, usize, f64, f64)>,
}

impl Attacks {
    /// Launches every attack against `lb` for `length`.
    pub fn launch(
        &mut self,
        ns: &str,
        lb: usize,
        c: &SoakConfig,
        length: Duration,
        epoch: Instant,
    ) -> Result<()> {
        for attack in Attack::ALL {
            let child = spawn_tied(
                attack
                    .command(ns, lb, c, length)
                    .stdout(Stdio::null())
                    .stderr(Stdio::null()),
                libc::SIGKILL,
            )
            .with_context(|| format!("starting {}", attack.name()))?;
            self.running.push(Running {
                attack,
                lb,
                from: epoch.elapsed().as_secs_f64(),
                deadline: Instant::now() + length + Duration::from_secs(2),
                child: Some(child),
            });
        }
        Ok(())
    }

    /// Ends the attacks past their deadline (or all with `all`), and logs them.
    pub fn reap(&mut self, epoch: Instant, all: bool) {
        let now = Instant::now();
        let t = epoch.elapsed().as_secs_f64();
        for r in &mut self.running {
            let Some(child) = r.child.as_mut() else {
                continue;
            };
            let exited = !matches!(child.try_wait(), Ok(None));
            if exited || all || now > r.deadline {
                if let Some(mut c) = r.child.take() {
                    kill(&mut c);
                }
                self.log.push((r.attack, r.lb, r.from, t));
            }
        }
        self.running.retain(|r| r.child.is_some());
    }
}

impl Drop for Attacks {
    fn drop(&mut self) {
        for r in &mut self.running {
            if let Some(mut c) = r.child.take() {
                kill(&mut c);
            }
        }
    }
}

/// Sends a few of each flood at LB 1 while tcpdump captures what leaves the attackers'
/// namespace (on `net`'s end of the link); fails unless every source but the abuser's is
/// in 198.19.128.0/17. Returns the number of frames checked.
pub fn check_confinement(net_ns: &str, at_ns: &str, dir: &std::path::Path) -> Result<usize> {
    let capture = dir.join("confinement.txt");
    let out = std::fs::File::create(&capture)?;
    let mut dump = spawn_tied(
        in_ns(net_ns, "tcpdump")
            .args(["-l", "-n", "-q", "-i", "at", "-c", "400"])
            .arg(format!("ip and not host {ABUSER}"))
            .stdout(out)
            .stderr(Stdio::null()),
        libc::SIGKILL,
    )
    .context("starting tcpdump")?;
    std::thread::sleep(Duration::from_millis(1500));
    let c = SoakConfig {
        syn_flood_pps: 1000,
        udp_flood_pps: 1000,
        frag_flood_pps: 200,
        ..SoakConfig::default()
    };
    for attack in [Attack::SynFlood, Attack::UdpFlood, Attack::FragFlood] {
        let mut cmd = attack.command(at_ns, 1, &c, Duration::from_secs(1));
        let status = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .with_context(|| format!("running {}", attack.name()))?;
        // hping3 exits 1 when no reply came: every reply here is blackholed.
        if status.code().is_none_or(|c| c > 1) {
            bail!("{} exited {status}", attack.name());
        }
    }
    std::thread::sleep(Duration::from_millis(1000));
    // SAFETY: our child, not yet reaped.
    unsafe { libc::kill(dump.id() as libc::pid_t, libc::SIGINT) };
    let _ = dump.wait();
    let text = std::fs::read_to_string(&capture)?;
    let sources = sources_of(&text);
    if sources.len() < 100 {
        bail!(
            "the confinement check captured {} frames from the attackers (at least 100 were \
             sent); see {}",
            sources.len(),
            capture.display()
        );
    }
    if let Some(bad) = sources.iter().find(|s| !in_spoof_range(**s)) {
        bail!(
            "a flood's source {bad} left the attackers' namespace outside 198.19.128.0/17: \
             the egress rewrite does not hold (see {})",
            capture.display()
        );
    }
    Ok(sources.len())
}

/// The source address of every IPv4 line of `tcpdump -n -q`'s output.
pub fn sources_of(text: &str) -> Vec<Ipv4Addr> {
    text.lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            // `12:00:00.000000 IP 198.19.200.1.2345 > 198.18.10.1.443: tcp 0`
            words.find(|w| *w == "IP")?;
            let src = words.next()?;
            let parts: Vec<&str> = src.split('.').collect();
            parts.get(..4)?.join(".").parse().ok()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]
    use super::*;

    #[test]
    fn sources_from_tcpdump_lines() {
        let text = "03:21:16.345894 IP 198.19.243.86.1856 > 198.18.10.1.443: tcp 0\n\
                    03:21:16.345894 IP 198.19.200.1 > 198.18.10.1: udp\n\
                    tcpdump: verbose output suppressed\n";
        assert_eq!(
            sources_of(text),
            vec![
                "198.19.243.86".parse::<Ipv4Addr>().unwrap(),
                "198.19.200.1".parse().unwrap()
            ]
        );
    }
}
