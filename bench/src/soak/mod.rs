//! The soak (`cargo xtask soak`, binary `limiter-soak`): a dress rehearsal on this
//! machine. Three load-balancer namespaces (nftables NAT on two, HAProxy on the third) in
//! front of nginx backends, the limiter's daemon on each LB's ingress in fleet mode with
//! three allocator replicas on etcd, real clients (wrk, curl), real attack tools (hping3),
//! a fault a minute, and a report with PASS/FAIL lines.
//!
//! This module is the pure part — the rehearsal's rules and rates, the seeded fault
//! schedule, percentiles, the bounds an attack is held to — tested directly; the
//! submodules run processes ([`topology`], [`services`], [`daemons`], [`traffic`],
//! [`attacks`], [`faults`]), sample ([`measure`]) and judge and write ([`report`]).

pub mod attacks;
pub mod daemons;
pub mod faults;
pub mod measure;
pub mod report;
pub mod rig;
pub mod services;
pub mod topology;
pub mod traffic;

use std::time::Duration;

/// How long and how hard: the rates are scaled for a 2-core machine (docs/soak.md says
/// how they scale).
#[derive(Clone, Debug, PartialEq)]
pub struct SoakConfig {
    /// Minutes of the soak phase (limiter on, attacks, a fault a minute).
    pub minutes: u64,
    /// Minutes after it with the limiters detached and nftables guarding the LBs: the
    /// same attacks, side by side (no fault).
    pub nft_minutes: u64,
    pub seed: u64,
    /// The baseline phase before it: no attack, no limiter ([`SoakConfig::baseline_for`]
    /// unless `--baseline-s` says otherwise).
    pub baseline: Duration,
    /// Settling between the limiter's start and the first minute.
    pub settle: Duration,
    /// wrk connections per LB, each sending a request every `wrk_delay_ms`.
    pub wrk_connections: u32,
    pub wrk_delay_ms: u32,
    /// New connections per second per LB (curl, each from another source).
    pub curl_per_s: u32,
    /// hping3 SYN flood, UDP flood and fragment flood, packets (datagrams) per second.
    pub syn_flood_pps: u32,
    pub udp_flood_pps: u32,
    pub frag_flood_pps: u32,
    /// The abuser's wrk connections (each request a new connection, as fast as it can).
    pub abuser_connections: u32,
    /// Into each minute, when the attacks start and for how long they run.
    pub attack_start: Duration,
    pub attack_length: Duration,
    /// Into each minute, when its fault starts.
    pub fault_at: Duration,
    /// Fleet timings, scaled down as in the fleet lab: a partition of 20 s reaches
    /// FAIL_OPEN (lease + sticky_max < 20 s).
    pub lease_ttl_ms: u64,
    pub report_interval_ms: u64,
    pub election_ttl_ms: u64,
    pub sticky_max_s: u64,
    pub partition: Duration,
}

impl Default for SoakConfig {
    fn default() -> SoakConfig {
        SoakConfig {
            minutes: 60,
            nft_minutes: 1,
            seed: 36,
            baseline: SoakConfig::baseline_for(60),
            settle: Duration::from_secs(10),
            wrk_connections: 2,
            wrk_delay_ms: 40,
            curl_per_s: 4,
            syn_flood_pps: 2000,
            udp_flood_pps: 2000,
            frag_flood_pps: 300,
            abuser_connections: 4,
            attack_start: Duration::from_secs(5),
            attack_length: Duration::from_secs(40),
            fault_at: Duration::from_secs(15),
            lease_ttl_ms: 3000,
            report_interval_ms: 500,
            election_ttl_ms: 2000,
            sticky_max_s: 10,
            partition: Duration::from_secs(20),
        }
    }
}

impl SoakConfig {
    /// The baseline for a soak of `minutes`: 5 s a minute, from 60 s to 5 minutes. A p99
    /// is the 1 % tail: a baseline of 30 s had ≈ 360 new connections, whose p99 is their
    /// fourth worst — too few to compare a soak's p99 with.
    pub fn baseline_for(minutes: u64) -> Duration {
        Duration::from_secs((minutes * 5).clamp(60, 300))
    }

    /// Legitimate requests per second offered in all (wrk and curl over every LB).
    pub fn legit_rate(&self, lbs: usize) -> f64 {
        let wrk = f64::from(self.wrk_connections) * 1000.0 / f64::from(self.wrk_delay_ms.max(1));
        (wrk + f64::from(self.curl_per_s)) * lbs as f64
    }
}

/// The rehearsal's rule of a kind of traffic, the same on every LB (the VIPs share one
/// prefix), with its fleet quota.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleSpec {
    pub name: &'static str,
    pub dst_port: Option<u16>,
    pub proto: &'static str,
    pub unit: &'static str,
    /// The fleet's quota (the allocator's `[[quotas]]`, the daemons' rule rate).
    pub rate: u64,
    pub burst: u64,
    /// A per-source limit (rate, burst), per LB: it needs no allocator.
    pub per_source: Option<(u64, u64)>,
}

/// The service port's rule: new connections (SYNs) to port 80, per source and for the
/// fleet; the other TCP ports' SYNs; UDP. Legitimate traffic stays far below each.
pub fn rules() -> Vec<RuleSpec> {
    vec![
        RuleSpec {
            name: "web",
            dst_port: Some(80),
            proto: "tcp",
            unit: "syn",
            rate: 600,
            burst: 200,
            per_source: Some((10, 20)),
        },
        RuleSpec {
            name: "vip-syn",
            dst_port: None,
            proto: "tcp",
            unit: "syn",
            rate: 300,
            burst: 100,
            per_source: None,
        },
        RuleSpec {
            name: "vip-udp",
            dst_port: None,
            proto: "udp",
            unit: "packets",
            rate: 300,
            burst: 100,
            per_source: None,
        },
    ]
}

/// The rules' `[[rules]]` TOML for a daemon, with every VIP in `dst`; `per_source_scale`
/// scales the per-source rates (a reload with changed quotas).
pub fn rules_toml(rules: &[RuleSpec], dst: &str, per_source_scale: u64) -> String {
    let mut text = String::new();
    for r in rules {
        text.push_str(&format!(
            "[[rules]]\nname = \"{}\"\ndst = \"{dst}\"\nproto = \"{}\"\nunit = \"{}\"\n\
             rate = {}\nburst = {}\nfail_mode = \"open\"\n",
            r.name, r.proto, r.unit, r.rate, r.burst
        ));
        if let Some(port) = r.dst_port {
            text.push_str(&format!("dst_port = {port}\n"));
        }
        if let Some((rate, burst)) = r.per_source {
            text.push_str(&format!(
                "[rules.per_source]\nrate = {}\nburst = {}\n",
                rate * per_source_scale,
                burst * per_source_scale
            ));
        }
        text.push('\n');
    }
    text
}

/// A small seeded generator (xorshift64*): the fault schedule and the attacks' targets
/// repeat with `--seed`.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        // Never zero (xorshift's fixed point); a seed of 0 is as good as any other.
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }

    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i + 1);
            items.swap(i, j);
        }
    }
}

/// The `p`-th percentile (0–100) of `values` by nearest rank; `None` when empty.
pub fn percentile(values: &[f64], p: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    if sorted.is_empty() {
        return None;
    }
    sorted.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// What a rule may admit over `seconds` seconds of samples outside fail-open windows,
/// made of `segments` unbroken stretches: its rate for each second, and a full burst at
/// the start of each stretch on each host (a host's share carries a burst of its own, and
/// a bucket left alone through a window refills).
pub fn rule_bound(rate: u64, burst: u64, seconds: f64, segments: usize, hosts: usize) -> f64 {
    rate as f64 * seconds + (burst as f64) * (segments * hosts) as f64
}

/// The number of unbroken runs of `true` in `included`.
pub fn segments(included: &[bool]) -> usize {
    included
        .iter()
        .zip(std::iter::once(&false).chain(included.iter()))
        .filter(|(now, before)| **now && !**before)
        .count()
}

/// Whether `addr` lies in 198.19.128.0/17, where the floods' sources are confined.
pub fn in_spoof_range(addr: std::net::Ipv4Addr) -> bool {
    let o = addr.octets();
    o[0] == 198 && o[1] == 19 && o[2] >= 128
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]
    use super::*;

    #[test]
    fn the_baseline_grows_with_the_soak_within_bounds() {
        assert_eq!(SoakConfig::baseline_for(3), Duration::from_secs(60));
        assert_eq!(SoakConfig::baseline_for(30), Duration::from_secs(150));
        assert_eq!(SoakConfig::baseline_for(60), Duration::from_secs(300));
        assert_eq!(SoakConfig::baseline_for(600), Duration::from_secs(300));
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), Some(50.0));
        assert_eq!(percentile(&v, 99.0), Some(99.0));
        assert_eq!(percentile(&v, 100.0), Some(100.0));
        assert_eq!(percentile(&v, 0.0), Some(1.0));
        assert_eq!(percentile(&[], 50.0), None);
        assert_eq!(percentile(&[3.0, 1.0, 2.0], 50.0), Some(2.0));
    }

    #[test]
    fn segments_count_unbroken_runs() {
        assert_eq!(segments(&[]), 0);
        assert_eq!(segments(&[true, true]), 1);
        assert_eq!(segments(&[true, false, true, true, false]), 2);
        assert_eq!(segments(&[false, false]), 0);
    }

    #[test]
    fn the_bound_grows_with_time_and_gaps() {
        assert_eq!(rule_bound(300, 100, 60.0, 1, 3), 18_300.0);
        assert_eq!(rule_bound(300, 100, 50.0, 2, 3), 15_600.0);
    }

    #[test]
    fn the_spoof_range_is_198_19_128_0_17() {
        assert!(in_spoof_range("198.19.128.0".parse().unwrap()));
        assert!(in_spoof_range("198.19.255.255".parse().unwrap()));
        assert!(!in_spoof_range("198.19.127.255".parse().unwrap()));
        assert!(!in_spoof_range("198.18.200.1".parse().unwrap()));
        assert!(!in_spoof_range("8.8.8.8".parse().unwrap()));
    }

    #[test]
    fn the_same_seed_shuffles_the_same_way() {
        let mut a: Vec<u32> = (0..10).collect();
        let mut b = a.clone();
        Rng::new(7).shuffle(&mut a);
        Rng::new(7).shuffle(&mut b);
        assert_eq!(a, b);
        let mut sorted = a.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..10).collect::<Vec<_>>());
    }

    #[test]
    fn the_rules_toml_is_a_config_the_daemon_accepts() {
        let text = format!(
            "interfaces = [\"eth1\"]\n{}",
            rules_toml(&rules(), "198.18.10.0/29", 1)
        );
        let config = limiter_user::config::Config::parse(&text, std::path::Path::new("soak.toml"))
            .unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(config.rules.len(), rules().len());
        let doubled = rules_toml(&rules(), "198.18.10.0/29", 2);
        assert!(doubled.contains("rate = 20\n"));
    }
}
