//! What the rehearsal samples: every second, each rule's state and admitted units on
//! every LB (from the pins) and the leading replica's granted sums (its metrics); every
//! 10 s, the leak sample: RSS and open descriptors of every daemon, replica and etcd
//! (/proc), the BPF programs, maps and links the daemons hold (their descriptors),
//! the pins, and etcd's keys.

use std::{
    collections::BTreeMap,
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    time::Duration,
};

use anyhow::{bail, Context as _, Result};

use super::daemons::RuleReading;

/// One second of the fleet.
#[derive(Clone, Debug, Default)]
pub struct Second {
    pub t: f64,
    /// Per LB (index 0 = lb-1): rule → reading; empty when it could not be read.
    pub hosts: Vec<BTreeMap<String, RuleReading>>,
    /// The leading replica's granted sum per rule, when one leads and answers.
    pub granted: BTreeMap<String, u64>,
    pub leader: Option<String>,
}

impl Second {
    /// Whether any LB's share of `rule` was failing open.
    pub fn fail_open(&self, rule: &str) -> bool {
        self.hosts
            .iter()
            .any(|h| h.get(rule).is_some_and(|r| r.state == "fail_open"))
    }

    /// The LB's units admitted so far by `rule`.
    pub fn admitted(&self, lb: usize, rule: &str) -> Option<u64> {
        self.hosts.get(lb)?.get(rule).map(|r| r.admitted)
    }
}

/// `limiter_allocator_leader` and each rule's `limiter_allocator_granted_*` from a
/// replica's metrics page.
pub fn parse_allocator_metrics(text: &str) -> (bool, BTreeMap<String, u64>) {
    let mut leader = false;
    let mut granted = BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((name, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        if name == "limiter_allocator_leader" {
            leader = value == 1.0;
        } else if name.starts_with("limiter_allocator_granted_") {
            if let Some(rule) = name
                .split_once("rule=\"")
                .and_then(|(_, rest)| rest.split_once('"'))
                .map(|(rule, _)| rule.to_string())
            {
                granted.insert(rule, value as u64);
            }
        }
    }
    (leader, granted)
}

/// A process's resident memory (KiB) and open descriptors, from /proc.
pub fn proc_usage(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
    Some((rss, fds))
}

/// The machine's CPU time so far, in clock ticks: (busy, softirq, total), from the
/// first line of /proc/stat. Busy is everything but idle and iowait.
pub fn cpu_times() -> Option<(u64, u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    parse_cpu_line(stat.lines().next()?)
}

/// `cpu  user nice system idle iowait irq softirq steal …` → (busy, softirq, total).
pub fn parse_cpu_line(line: &str) -> Option<(u64, u64, u64)> {
    let v: Vec<u64> = line
        .strip_prefix("cpu ")?
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    // Guest time is already counted in user.
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3)? + v.get(4)?;
    Some((total - idle, *v.get(6)?, total))
}

/// Between two [`cpu_times`] readings: (busy %, softirq %) of the machine.
pub fn cpu_share(a: (u64, u64, u64), b: (u64, u64, u64)) -> (f64, f64) {
    let total = b.2.saturating_sub(a.2).max(1) as f64;
    (
        100.0 * b.0.saturating_sub(a.0) as f64 / total,
        100.0 * b.1.saturating_sub(a.1) as f64 / total,
    )
}

/// One leak sample.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LeakSample {
    pub t: f64,
    /// (name, pid, RSS KiB, fds) of each daemon, replica and etcd that runs.
    pub processes: Vec<(String, u32, u64, u64)>,
    /// BPF programs, maps and links held by the daemons' processes.
    pub progs: u64,
    pub maps: u64,
    pub links: u64,
    /// Pin files under the run's pin directories.
    pub pins: u64,
    /// Keys in etcd (every prefix).
    pub etcd_keys: Option<u64>,
}

/// The distinct BPF programs, maps and links `pids` hold open, by the ids their
/// descriptors' fdinfo names (`prog_id:`, `map_id:`, `link_id:`): what the daemons hold,
/// not what other processes on the machine load.
pub fn bpf_held(pids: &[u32]) -> (u64, u64, u64) {
    let mut ids: [std::collections::BTreeSet<u64>; 3] = Default::default();
    for pid in pids {
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
            continue;
        };
        for fd in fds.flatten() {
            let Ok(text) = std::fs::read_to_string(fd.path()) else {
                continue;
            };
            if let Some((kind, id)) = bpf_object(&text) {
                ids[kind].insert(id);
            }
        }
    }
    (
        ids[0].len() as u64,
        ids[1].len() as u64,
        ids[2].len() as u64,
    )
}

/// From a descriptor's fdinfo: (0 program, 1 map, 2 link; its id).
pub fn bpf_object(fdinfo: &str) -> Option<(usize, u64)> {
    let field = |name: &str| {
        fdinfo
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    // A link's fdinfo names its program too: the link first.
    if let Some(id) = field("link_id:") {
        return Some((2, id));
    }
    if let Some(id) = field("map_id:") {
        return Some((1, id));
    }
    field("prog_id:").map(|id| (0, id))
}

/// etcd's key count, through its JSON gateway at `addr` (from the calling thread's
/// namespace).
pub fn etcd_keys(addr: SocketAddr) -> Result<u64> {
    // Every key: from "\0" to "\0" (base64 AA==) is the whole keyspace.
    let body = r#"{"key":"AA==","range_end":"AA==","count_only":true}"#;
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(500))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    write!(
        s,
        "POST /v3/kv/range HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    parse_etcd_count(&text)
}

/// The `count` of etcd's range reply (absent: 0, as the gateway omits zero fields).
pub fn parse_etcd_count(reply: &str) -> Result<u64> {
    let body = reply.split_once("\r\n\r\n").map_or(reply, |(_, b)| b);
    let v: serde_json::Value = serde_json::from_str(body.trim()).context("etcd's range reply")?;
    if v.get("header").is_none() {
        bail!("etcd's range reply has no header: {body}");
    }
    Ok(match v.get("count") {
        Some(serde_json::Value::String(s)) => s.parse().context("etcd's count")?,
        Some(n) => n.as_u64().context("etcd's count")?,
        None => 0,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]
    use super::*;

    #[test]
    fn allocator_metrics_parsed() {
        let text = "# HELP x\nlimiter_allocator_leader 1\nlimiter_allocator_term 7\n\
                    limiter_allocator_granted_syn_per_second{rule=\"web\"} 600\n\
                    limiter_allocator_granted_packets_per_second{rule=\"vip-udp\"} 299.5\n";
        let (leader, granted) = parse_allocator_metrics(text);
        assert!(leader);
        assert_eq!(granted["web"], 600);
        assert_eq!(granted["vip-udp"], 299);
        assert!(!parse_allocator_metrics("limiter_allocator_leader 0\n").0);
    }

    #[test]
    fn bpf_objects_from_fdinfo() {
        let prog = "pos:\t0\nflags:\t02000002\nprog_type:\t6\nprog_tag:\tabc\nprog_id:\t41\n";
        let map = "pos:\t0\nmap_type:\t2\nmax_entries:\t1\nmap_id:\t7\n";
        let link = "pos:\t0\nlink_type:\txdp\nlink_id:\t3\nprog_tag:\tabc\nprog_id:\t41\n";
        assert_eq!(bpf_object(prog), Some((0, 41)));
        assert_eq!(bpf_object(map), Some((1, 7)));
        assert_eq!(bpf_object(link), Some((2, 3)));
        assert_eq!(bpf_object("pos:\t0\nflags:\t0100002\n"), None);
        // Our own descriptors: none of them BPF.
        assert_eq!(bpf_held(&[std::process::id()]), (0, 0, 0));
    }

    #[test]
    fn cpu_line_parsed() {
        let a = parse_cpu_line("cpu  100 0 50 800 50 0 10 0 0 0").unwrap();
        assert_eq!(a, (160, 10, 1010));
        let b = parse_cpu_line("cpu  200 0 100 1600 50 0 30 0 0 0").unwrap();
        let (busy, softirq) = cpu_share(a, b);
        assert!((busy - 100.0 * 170.0 / 970.0).abs() < 1e-9);
        assert!((softirq - 100.0 * 20.0 / 970.0).abs() < 1e-9);
        assert!(parse_cpu_line("cpu0 1 2 3").is_none());
        assert!(cpu_times().is_some());
    }

    #[test]
    fn etcd_count_parsed() {
        let reply = "HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n\
                     {\"header\":{\"revision\":\"5\"},\"count\":\"4\"}";
        assert_eq!(parse_etcd_count(reply).unwrap(), 4);
        assert_eq!(parse_etcd_count("{\"header\":{}}").unwrap(), 0);
        assert!(parse_etcd_count("{}").is_err());
    }

    #[test]
    fn our_own_usage_is_readable() {
        let (rss, fds) = proc_usage(std::process::id()).unwrap();
        assert!(rss > 0 && fds > 0);
    }
}
