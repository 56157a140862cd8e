//! A spoofed-source flood, end to end: live frames with a random source each
//! (`traffic_tx_spray`: random IPv4 sources of 198.18.0.0/15 and random IPv6 /64s of
//! 2001:db8::/32) at the generator's full rate on one CPU, while on the other CPU a
//! well-behaved source sends under its per-source rate and a heavy one sends lumps over
//! it. Everything is counted at the limiter (its rules' counters), since the veth path
//! itself loses frames under such a flood whatever program runs.
//!
//! What it shows: the well-behaved source's frames the limiter dropped (target < 0.1 %),
//! what the heavy source got against its rate × time + one burst (never above), and the
//! flood's frames/s through the limiter next to the same flood from a few known sources
//! (the new-source path against the established one, on live frames).

use std::{
    net::{Ipv4Addr, Ipv6Addr},
    thread::sleep,
    time::Duration,
};

use anyhow::{ensure, Context as _, Result};
use limiter_tests::{
    frame::FrameBuilder,
    netns::VethPair,
    scenario::{HOST_V4, PEER_V4},
};
use limiter_user::config::XdpMode as ConfigXdpMode;

use super::{
    gen::{self, Backend, Offer},
    host::{Limiter, LinkStats},
};

/// How long the flood runs.
const WINDOW: Duration = Duration::from_secs(6);
/// The longest timer tick a kernel has (CONFIG_HZ=100), in seconds: the limiter's cached
/// clock lags true time by at most one.
const LONGEST_TICK: f64 = 0.010;
/// Destination ports of the three rules.
const FLOOD_PORT: u16 = 7;
const GOOD_PORT: u16 = 8;
const HEAVY_PORT: u16 = 9;
/// Per-source limits: the good source sends at half of its rate; the heavy one sends
/// lumps of 10 every 20 ms (500/s) against 100/s with a burst of 10.
const GOOD_RATE: u64 = 1000;
const GOOD_BURST: u64 = 100;
const GOOD_SENDS: u64 = 500;
const HEAVY_RATE: u64 = 100;
const HEAVY_BURST: u64 = 10;
const HEAVY_SENDS: u64 = 500;
const HEAVY_LUMP: Duration = Duration::from_millis(20);
const HOST_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 2);
const PEER_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 1, 0, 0, 0, 1);
/// Not the host end's address: what the limiter passes, the stack drops (frames end at
/// the veth).
const NOT_THE_HOST: [u8; 6] = [0x02, 0, 0, 0, 0, 0x99];

/// Where the flood's sources come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sources {
    /// Two fixed sources (198.18.0.0 and 2001:db8::/64, from the same generator with
    /// its random word masked to 0): their cells stay cached.
    Known,
    /// A fixed set of 131,072 (2^16 IPv4, 2^16 IPv6 /64s), each seen every few ms: an
    /// established working set past the caches.
    Established,
    /// A new random source every frame.
    Random,
}

impl Sources {
    pub const ALL: [Sources; 3] = [Sources::Known, Sources::Established, Sources::Random];

    pub fn label(self) -> &'static str {
        match self {
            Sources::Known => "2 known sources",
            Sources::Established => "131,072 established sources",
            Sources::Random => "random sources",
        }
    }
}

/// One flood measurement.
#[derive(Clone, Debug)]
pub struct FloodRun {
    pub sources: Sources,
    pub max_sources: u32,
    /// Flood frames/s the limiter ran on (its flood rules' counters over the window).
    pub flood_per_second: f64,
    /// Frames/s the host end received (XDP ran on each).
    pub link_per_second: f64,
    pub good_sent: u64,
    pub good_passed: u64,
    pub good_dropped: u64,
    pub heavy_sent: u64,
    pub heavy_passed: u64,
    /// rate × (the heavy sender's span + one timer tick) + burst: the most it may get (the
    /// limiter's tick clock observes time up to a tick late).
    pub heavy_bound: f64,
}

impl FloodRun {
    pub fn good_drop_share(&self) -> f64 {
        self.good_dropped as f64 / (self.good_passed + self.good_dropped).max(1) as f64
    }
}

fn config(max_sources: u32) -> String {
    let rule = |name: &str, dst: String, port: u16, rate: u64, burst: u64| {
        // The flood rules' aggregate is exhausted within the first 100 frames: all but
        // 1,000 flood frames a second are dropped whatever their source, so the flood
        // rates compare the limiter's work for new and established sources, not the
        // stack's for frames passed (a new source passes its per-source limit; an
        // established one is held at it). Its burst keeps the rule on the tick clock.
        let aggregate = if name.starts_with("flood") {
            "rate = 1000\nburst = 100\n"
        } else {
            ""
        };
        format!(
            "[[rules]]\nname = \"{name}\"\ndst = \"{dst}\"\ndst_port = {port}\nproto = \"udp\"\n\
             {aggregate}[rules.per_source]\nrate = {rate}\nburst = {burst}\n\n"
        )
    };
    format!(
        "max_sources = {max_sources}\n\n{}{}{}{}",
        rule("flood4", format!("{HOST_V4}/32"), FLOOD_PORT, 10, 5),
        rule("flood6", format!("{HOST_V6}/128"), FLOOD_PORT, 10, 5),
        rule(
            "good",
            format!("{HOST_V4}/32"),
            GOOD_PORT,
            GOOD_RATE,
            GOOD_BURST
        ),
        rule(
            "heavy",
            format!("{HOST_V4}/32"),
            HEAVY_PORT,
            HEAVY_RATE,
            HEAVY_BURST
        ),
    )
}

fn udp4(pair: &VethPair, src: Ipv4Addr, port: u16) -> Vec<u8> {
    FrameBuilder::ipv4(src, HOST_V4)
        .macs(pair.peer_mac, NOT_THE_HOST)
        .udp(40000, port)
        .frame_len(super::FRAME_LEN)
        .build()
}

fn udp6(pair: &VethPair, src: Ipv6Addr, port: u16) -> Vec<u8> {
    FrameBuilder::ipv6(src, HOST_V6)
        .macs(pair.peer_mac, NOT_THE_HOST)
        .udp(40000, port)
        .frame_len(86)
        .build()
}

/// The flood from `sources`, flat out, to both flood rules (an IPv4 and an IPv6 template
/// whose sources the generator rewrites).
fn flood_offer(pair: &VethPair, sources: Sources, duration: Duration, cpus: Vec<usize>) -> Offer {
    Offer {
        backend: match sources {
            Sources::Known => Backend::LiveSpraySet(0),
            Sources::Established => Backend::LiveSpraySet(0xFFFF),
            Sources::Random => Backend::LiveSpray,
        },
        frames: vec![
            udp4(pair, Ipv4Addr::new(198, 19, 0, 1), FLOOD_PORT),
            udp6(pair, PEER_V6, FLOOD_PORT),
        ],
        rate_per_sender: None,
        lump: Duration::ZERO,
        duration,
        cpus,
    }
}

/// One run: the flood from `sources` on CPU 0, the good and heavy sources on CPU 1.
pub fn run_once(pair: &VethPair, max_sources: u32, sources: Sources) -> Result<FloodRun> {
    let limiter = Limiter::attach(&pair.host, &config(max_sources), ConfigXdpMode::Native)
        .context("attaching the limiter")?;
    let flood = flood_offer(pair, sources, WINDOW, vec![super::SENDER_CPUS[0]]);
    let paced = |port: u16, rate: u64, lump: Duration, src: Ipv4Addr| Offer {
        backend: Backend::Live,
        frames: vec![udp4(pair, src, port)],
        rate_per_sender: Some(rate),
        lump,
        duration: WINDOW,
        cpus: vec![super::SENDER_CPUS[1]],
    };
    let before = limiter.snapshot()?;
    let link_before = LinkStats::read(&pair.host)?;
    let flooding = gen::spawn(pair, &flood)?;
    let good = gen::spawn(
        pair,
        &paced(GOOD_PORT, GOOD_SENDS, Duration::from_millis(2), PEER_V4),
    )?;
    let heavy = gen::spawn(
        pair,
        &paced(
            HEAVY_PORT,
            HEAVY_SENDS,
            HEAVY_LUMP,
            Ipv4Addr::new(198, 18, 0, 3),
        ),
    )?;
    let flood_sent = flooding.join()?;
    let good_sent = good.join()?;
    let heavy_sent = heavy.join()?;
    sleep(Duration::from_millis(100));
    let after = limiter.snapshot()?;
    let link = LinkStats::read(&pair.host)?.since(&link_before);
    let delta = limiter_tests::fixture::delta(&before, &after);
    let rule = |name: &str| {
        delta
            .rules
            .get(name)
            .copied()
            .with_context(|| format!("no rule {name} in the counters"))
    };
    let (flood4, flood6, good, heavy) = (
        rule("flood4")?,
        rule("flood6")?,
        rule("good")?,
        rule("heavy")?,
    );
    let flooded = flood4.passed_packets
        + flood4.dropped_packets
        + flood6.passed_packets
        + flood6.dropped_packets;
    ensure!(flooded > 0, "no flood frame reached the limiter");
    ensure!(
        good.passed_packets + good.dropped_packets <= good_sent.frames
            && heavy.passed_packets + heavy.dropped_packets <= heavy_sent.frames,
        "a rule counted more frames than were sent"
    );
    let span = flood_sent.span().as_secs_f64().max(1e-3);
    Ok(FloodRun {
        sources,
        max_sources,
        flood_per_second: flooded as f64 / span,
        link_per_second: link.rx_packets as f64 / span,
        good_sent: good_sent.frames,
        good_passed: good.passed_packets,
        good_dropped: good.dropped_packets,
        heavy_sent: heavy_sent.frames,
        heavy_passed: heavy.passed_packets,
        heavy_bound: HEAVY_RATE as f64 * (heavy_sent.span().as_secs_f64() + LONGEST_TICK)
            + HEAVY_BURST as f64,
    })
}

/// The flood at each `max_sources`, random and known sources, `rounds` times each.
pub fn measure(pair: &VethPair, sizes: &[u32], rounds: usize) -> Result<Vec<FloodRun>> {
    let mut runs = Vec::new();
    for &size in sizes {
        for _ in 0..rounds {
            for sources in Sources::ALL {
                let run = run_once(pair, size, sources).with_context(|| {
                    format!("flood from {}, max_sources {size}", sources.label())
                })?;
                eprintln!(
                    "  flood ({}, max_sources {size}): {:.2} M frames/s through the limiter; \
                     good source {}/{} dropped ({:.3} %); heavy source {} passed of {} \
                     sent, bound {:.0}",
                    run.sources.label(),
                    run.flood_per_second / 1e6,
                    run.good_dropped,
                    run.good_passed + run.good_dropped,
                    100.0 * run.good_drop_share(),
                    run.heavy_passed,
                    run.heavy_sent,
                    run.heavy_bound
                );
                runs.push(run);
            }
        }
    }
    Ok(runs)
}

/// The flood alone on both CPUs (`SENDER_CPUS`), no other sender: frames/s through the
/// limiter's flood rules over the window, the new-source path against the established
/// one with two CPUs metering the same cells.
pub fn two_cpu_rate(pair: &VethPair, max_sources: u32, sources: Sources) -> Result<f64> {
    let limiter = Limiter::attach(&pair.host, &config(max_sources), ConfigXdpMode::Native)
        .context("attaching the limiter")?;
    let flood = flood_offer(pair, sources, WINDOW / 2, super::SENDER_CPUS.to_vec());
    let before = limiter.snapshot()?;
    let sent = gen::spawn(pair, &flood)?.join()?;
    sleep(Duration::from_millis(100));
    let after = limiter.snapshot()?;
    let delta = limiter_tests::fixture::delta(&before, &after);
    let mut flooded = 0;
    for name in ["flood4", "flood6"] {
        let c = delta
            .rules
            .get(name)
            .with_context(|| format!("no rule {name} in the counters"))?;
        flooded += c.passed_packets + c.dropped_packets;
    }
    ensure!(flooded > 0, "no flood frame reached the limiter");
    Ok(flooded as f64 / sent.span().as_secs_f64().max(1e-3))
}

/// [`two_cpu_rate`] for each size and kind of sources, `rounds` times.
pub fn measure_two_cpus(
    pair: &VethPair,
    sizes: &[u32],
    rounds: usize,
) -> Result<Vec<(u32, Sources, f64)>> {
    let mut out = Vec::new();
    for &size in sizes {
        for _ in 0..rounds {
            for sources in Sources::ALL {
                let rate = two_cpu_rate(pair, size, sources).with_context(|| {
                    format!("two-CPU flood from {}, max_sources {size}", sources.label())
                })?;
                eprintln!(
                    "  flood on two CPUs ({}, max_sources {size}): {:.2} M frames/s",
                    sources.label(),
                    rate / 1e6
                );
                out.push((size, sources, rate));
            }
        }
    }
    Ok(out)
}

/// Per size: the ratio range (min–max over rounds) of `base` frames/s to random ones.
fn ratio_rows(rates: &[(u32, Sources, f64)]) -> String {
    let mut out = String::from(
        "| max_sources | vs 2 known sources | vs 131,072 established sources |\n|---:|---:|---:|\n",
    );
    let sizes: std::collections::BTreeSet<u32> = rates.iter().map(|r| r.0).collect();
    for size in sizes {
        let rate = |sources: Sources| -> Vec<f64> {
            rates
                .iter()
                .filter(|r| r.0 == size && r.1 == sources)
                .map(|r| r.2)
                .collect()
        };
        let random = rate(Sources::Random);
        let ratios = |base: &[f64]| {
            let r: Vec<f64> = base
                .iter()
                .zip(&random)
                .filter(|(_, &n)| n > 0.0)
                .map(|(b, n)| b / n)
                .collect();
            if r.is_empty() {
                return "–".to_string();
            }
            let lo = r.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = r.iter().copied().fold(0.0, f64::max);
            format!("{lo:.2}–{hi:.2}×")
        };
        out += &format!(
            "| {size} | {} | {} |\n",
            ratios(&rate(Sources::Known)),
            ratios(&rate(Sources::Established))
        );
    }
    out
}

/// The Markdown report of [`measure`].
pub fn markdown(runs: &[FloodRun], two_cpus: &[(u32, Sources, f64)], kernel: &str) -> String {
    let mut out = String::from("# limiter: a spoofed-source flood, end to end\n\n");
    out += &format!(
        "- kernel {kernel}; the flood: live frames as fast as one CPU sends them, alternating \
         IPv4 (random sources of 198.18.0.0/15) and IPv6 (random /64s of 2001:db8::/32), \
         to two rules with a per-source limit of 10/s and an exhausted aggregate (1,000/s, \
         burst 100: all but 1,000 flood frames a second are dropped, so the rates compare \
         the limiter's work, not the stack's for passed frames); on the other CPU a good source sends \
         {GOOD_SENDS}/s under its {GOOD_RATE}/s (burst {GOOD_BURST}) and a heavy one lumps \
         of {} every {} ms against {HEAVY_RATE}/s (burst {HEAVY_BURST}); {} s each; counted \
         by the limiter's rules; the flood comes from 2 known sources, from a fixed set of \
         131,072 (2^16 IPv4 of 198.18.0.0/16, 2^16 IPv6 /64s), or from a new random source \
         each frame\n\n",
        HEAVY_SENDS * HEAVY_LUMP.as_millis() as u64 / 1000,
        HEAVY_LUMP.as_millis(),
        WINDOW.as_secs()
    );
    out += "| flood | max_sources | flood frames/s at the limiter | host end frames/s | good source dropped | heavy passed / bound |\n|---|---:|---:|---:|---:|---:|\n";
    for r in runs {
        out += &format!(
            "| {} | {} | {:.2} M | {:.2} M | {} of {} ({:.3} %) | {} / {:.0}{} |\n",
            r.sources.label(),
            r.max_sources,
            r.flood_per_second / 1e6,
            r.link_per_second / 1e6,
            r.good_dropped,
            r.good_passed + r.good_dropped,
            100.0 * r.good_drop_share(),
            r.heavy_passed,
            r.heavy_bound,
            if r.heavy_passed as f64 > r.heavy_bound {
                " **over**"
            } else {
                ""
            }
        );
    }
    out += "\nWhat a new source costs against an established one on live frames, one CPU \
            flooding (the flood's frames/s from the established sources ÷ from random ones, \
            per round; cost per frame is the inverse of the rate: the target is \
            ≤ 1.5×):\n\n";
    let one_cpu: Vec<(u32, Sources, f64)> = runs
        .iter()
        .map(|r| (r.max_sources, r.sources, r.flood_per_second))
        .collect();
    out += &ratio_rows(&one_cpu);
    if !two_cpus.is_empty() {
        out += &format!(
            "\nThe same with the flood alone on both CPUs ({} s a run; frames/s: {}):\n\n",
            (WINDOW / 2).as_secs(),
            two_cpus
                .iter()
                .map(|(size, sources, rate)| format!(
                    "{} at {size} {:.2} M",
                    sources.label(),
                    rate / 1e6
                ))
                .collect::<Vec<_>>()
                .join("; ")
        );
        out += &ratio_rows(two_cpus);
    }
    out
}
