//! The top throttled sources (`limiter top --sources`): which sources and source
//! prefixes (/24 for IPv4, /64 for IPv6) the sampled refusals of a recent window came
//! from, each with its estimated share of the refusals and that estimate's standard
//! error. Pure: events in, a ranking and its screen out.
//!
//! What a sample can tell: the heavy hitters among *refused* frames (drops and
//! would-drops), not among the traffic that passed. With n samples a share p has
//! standard error sqrt(p(1-p)/n), and a source below about 1/n of the refusals is
//! likely absent from the sample altogether.

use std::{collections::HashMap, net::IpAddr};

use ipnet::IpNet;

/// The prefix a source is grouped under: its /24 (IPv4) or /64 (IPv6).
pub fn prefix_of(addr: IpAddr) -> IpNet {
    let len = if addr.is_ipv4() { 24 } else { 64 };
    // A length within the family's bits: never fails.
    IpNet::new(addr, len).map_or_else(|_| IpNet::from(addr), |n| n.trunc())
}

/// A source or prefix and its part of the sample.
#[derive(Clone, Debug, PartialEq)]
pub struct Share {
    pub key: IpNet,
    pub samples: u64,
    /// Estimated share of refusals, 0..=1.
    pub share: f64,
    /// Standard error of `share`: sqrt(p(1-p)/n).
    pub std_error: f64,
}

/// The ranking of one window.
#[derive(Clone, Debug, PartialEq)]
pub struct Top {
    /// Sampled refusals in the window (with a source address).
    pub samples: u64,
    pub sources: Vec<Share>,
    pub prefixes: Vec<Share>,
}

/// The sampled refusals' sources over a sliding window of `span_ns`.
#[derive(Clone, Debug)]
pub struct Window {
    span_ns: u64,
    /// (CLOCK_MONOTONIC ns, source); roughly in time order (CPUs interleave).
    events: Vec<(u64, IpAddr)>,
}

impl Window {
    pub fn new(span_ns: u64) -> Window {
        Window {
            span_ns,
            events: Vec::new(),
        }
    }

    pub fn push(&mut self, time_ns: u64, src: IpAddr) {
        self.events.push((time_ns, src));
    }

    /// Forgets the events older than the window at `now_ns`.
    pub fn expire(&mut self, now_ns: u64) {
        let cutoff = now_ns.saturating_sub(self.span_ns);
        self.events.retain(|(t, _)| *t >= cutoff);
    }

    pub fn len(&self) -> usize {
        self.events.len()
    }

    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// The `n` heaviest sources and prefixes, heaviest first (ties by address).
    pub fn top(&self, n: usize) -> Top {
        let samples = self.events.len() as u64;
        let mut by_source: HashMap<IpNet, u64> = HashMap::new();
        let mut by_prefix: HashMap<IpNet, u64> = HashMap::new();
        for (_, src) in &self.events {
            *by_source.entry(IpNet::from(*src)).or_default() += 1;
            *by_prefix.entry(prefix_of(*src)).or_default() += 1;
        }
        Top {
            samples,
            sources: ranked(by_source, samples, n),
            prefixes: ranked(by_prefix, samples, n),
        }
    }
}

fn ranked(counts: HashMap<IpNet, u64>, samples: u64, n: usize) -> Vec<Share> {
    let mut all: Vec<(IpNet, u64)> = counts.into_iter().collect();
    all.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    all.truncate(n);
    all.into_iter()
        .map(|(key, count)| {
            let (share, std_error) = estimate(count, samples);
            Share {
                key,
                samples: count,
                share,
                std_error,
            }
        })
        .collect()
}

/// The share `count / samples` and its standard error sqrt(p(1-p)/n).
pub fn estimate(count: u64, samples: u64) -> (f64, f64) {
    if samples == 0 {
        return (0.0, 0.0);
    }
    let n = samples as f64;
    let p = count as f64 / n;
    (p, (p * (1.0 - p) / n).sqrt())
}

fn table(title: &str, rows: &[Share]) -> Vec<String> {
    let mut out = vec![format!(
        "{title:<44} {:>8} {:>8} {:>8}",
        "SAMPLES", "SHARE", "±SE"
    )];
    for r in rows {
        let key = if r.key.prefix_len() == r.key.max_prefix_len() {
            r.key.addr().to_string()
        } else {
            r.key.to_string()
        };
        out.push(format!(
            "{key:<44} {:>8} {:>7.1}% {:>7.1}%",
            r.samples,
            r.share * 100.0,
            r.std_error * 100.0
        ));
    }
    out
}

/// The screen: the two tables and what the numbers can and cannot say.
pub fn render(top: &Top, window_s: f64, lost: Option<&str>) -> Vec<String> {
    let mut out = vec![format!(
        "Top throttled sources, last {window_s} s: {} sampled refusals (drops and would-drops)",
        top.samples
    )];
    if let Some(lost) = lost {
        out.push(lost.to_string());
    }
    out.push(String::new());
    out.extend(table("SOURCE", &top.sources));
    out.push(String::new());
    out.extend(table("SOURCE PREFIX (/24, /64)", &top.prefixes));
    out.push(String::new());
    out.push(
        "Shares are estimates from a sample of refused frames: with n samples a share p \
         has standard error sqrt(p(1-p)/n)."
            .to_string(),
    );
    let floor = if top.samples == 0 {
        "no samples yet".to_string()
    } else {
        format!("{:.2}%", 100.0 / top.samples as f64)
    };
    out.push(format!(
        "They rank heavy hitters among refused frames, not passed traffic; a source below \
         ~1/n of refusals ({floor} here) may be missing."
    ));
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use proptest::prelude::*;

    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn heavy_hitters_rank_first_with_their_error() {
        let mut w = Window::new(10_000_000_000);
        for i in 0..60u64 {
            w.push(i, ip("198.51.100.7"));
        }
        for i in 0..30u64 {
            w.push(i, ip("198.51.100.8"));
        }
        for i in 0..10u64 {
            w.push(i, ip("2001:db8:1:2::9"));
        }
        let top = w.top(2);
        assert_eq!(top.samples, 100);
        assert_eq!(top.sources.len(), 2, "truncated to n");
        assert_eq!(
            top.sources[0].key,
            "198.51.100.7/32".parse::<IpNet>().unwrap()
        );
        assert_eq!(top.sources[0].samples, 60);
        let (p, se) = estimate(60, 100);
        assert_eq!(top.sources[0].share, p);
        assert!((se - (0.6f64 * 0.4 / 100.0).sqrt()).abs() < 1e-12);
        assert_eq!(
            top.prefixes[0].key,
            "198.51.100.0/24".parse::<IpNet>().unwrap()
        );
        assert_eq!(top.prefixes[0].samples, 90);
        assert_eq!(
            prefix_of(ip("2001:db8:1:2::9")),
            "2001:db8:1:2::/64".parse::<IpNet>().unwrap()
        );
        let screen = render(&top, 10.0, None).join("\n");
        assert!(screen.contains("198.51.100.7 "), "{screen}");
        assert!(screen.contains("198.51.100.0/24"), "{screen}");
        assert!(screen.contains("60.0%"), "{screen}");
        assert!(screen.contains("(1.00% here)"), "{screen}");
        assert!(screen.contains("not passed traffic"), "{screen}");
    }

    #[test]
    fn events_leave_the_window() {
        let mut w = Window::new(1_000);
        w.push(100, ip("198.51.100.1"));
        w.push(1_500, ip("198.51.100.2"));
        w.push(900, ip("198.51.100.3")); // out of order, another CPU's
        w.expire(2_000);
        assert_eq!(w.len(), 1);
        assert_eq!(w.top(5).sources[0].key.addr(), ip("198.51.100.2"));
        w.expire(10_000);
        assert!(w.is_empty());
        assert_eq!(w.top(5).samples, 0);
    }

    proptest! {
        /// Counts add up to the sample, a prefix holds exactly its sources' samples,
        /// rankings are heaviest first, and every error is within the binomial bound.
        #[test]
        fn rankings_account_for_every_sample(
            sources in proptest::collection::vec((0u8..4, 0u8..6, any::<bool>()), 1..300)
        ) {
            let mut w = Window::new(u64::MAX);
            for (i, (net, host, v6)) in sources.iter().enumerate() {
                let addr = if *v6 {
                    IpAddr::from([0x2001, 0xdb8, 0, u16::from(*net), 0, 0, 0, u16::from(*host)])
                } else {
                    IpAddr::from([198, 51, *net, *host])
                };
                w.push(i as u64, addr);
            }
            let top = w.top(usize::MAX);
            let n = sources.len() as u64;
            prop_assert_eq!(top.samples, n);
            prop_assert_eq!(top.sources.iter().map(|s| s.samples).sum::<u64>(), n);
            prop_assert_eq!(top.prefixes.iter().map(|s| s.samples).sum::<u64>(), n);
            for p in &top.prefixes {
                let inside: u64 = top.sources.iter()
                    .filter(|s| p.key.contains(&s.key.addr())).map(|s| s.samples).sum();
                prop_assert_eq!(inside, p.samples);
            }
            for rows in [&top.sources, &top.prefixes] {
                prop_assert!(rows.windows(2).all(|w| w[0].samples >= w[1].samples));
                for r in rows.iter() {
                    prop_assert!((0.0..=1.0).contains(&r.share));
                    prop_assert!(r.std_error <= 0.5 / (n as f64).sqrt() + 1e-12);
                }
            }
        }
    }
}
