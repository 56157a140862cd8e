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
use limiter_user::config::XdpMode as ConfigXdpMode;

use super::{
    gen::{self, Backend, Offer},
    host::{Limiter, LinkStats},
};
use crate::{
    frame::FrameBuilder,
    netns::VethPair,
    scenario::{HOST_V4, PEER_V4},
};

/// How long the flood runs.
const WINDOW: Duration = Duration::from_secs(6);
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

/// One flood measurement.
#[derive(Clone, Debug)]
pub struct FloodRun {
    /// "random sources" or "known sources".
    pub flood: &'static str,
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
    /// rate × the heavy sender's span + burst: the most it may get.
    pub heavy_bound: f64,
}

impl FloodRun {
    pub fn good_drop_share(&self) -> f64 {
        self.good_dropped as f64 / (self.good_passed + self.good_dropped).max(1) as f64
    }
}

fn config(max_sources: u32) -> String {
    let rule = |name: &str, dst: String, port: u16, rate: u64, burst: u64| {
        format!(
            "[[rules]]\nname = \"{name}\"\ndst = \"{dst}\"\ndst_port = {port}\nproto = \"udp\"\n\
             [rules.per_source]\nrate = {rate}\nburst = {burst}\n\n"
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

/// One run: the flood (`random`: a new source each frame; else the same two templates
/// with their fixed sources) on CPU 0, the good and heavy sources on CPU 1.
pub fn run_once(pair: &VethPair, max_sources: u32, random: bool) -> Result<FloodRun> {
    let limiter = Limiter::attach(&pair.host, &config(max_sources), ConfigXdpMode::Native)
        .context("attaching the limiter")?;
    let flood = Offer {
        backend: if random {
            Backend::LiveSpray
        } else {
            Backend::Live
        },
        frames: vec![
            udp4(pair, Ipv4Addr::new(198, 19, 0, 1), FLOOD_PORT),
            udp6(pair, PEER_V6, FLOOD_PORT),
        ],
        rate_per_sender: None,
        lump: Duration::ZERO,
        duration: WINDOW,
        cpus: vec![super::SENDER_CPUS[0]],
    };
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
    let delta = crate::fixture::delta(&before, &after);
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
        flood: if random {
            "random sources"
        } else {
            "known sources"
        },
        max_sources,
        flood_per_second: flooded as f64 / span,
        link_per_second: link.rx_packets as f64 / span,
        good_sent: good_sent.frames,
        good_passed: good.passed_packets,
        good_dropped: good.dropped_packets,
        heavy_sent: heavy_sent.frames,
        heavy_passed: heavy.passed_packets,
        heavy_bound: HEAVY_RATE as f64 * heavy_sent.span().as_secs_f64() + HEAVY_BURST as f64,
    })
}

/// The flood at each `max_sources`, random and known sources, `rounds` times each.
pub fn measure(pair: &VethPair, sizes: &[u32], rounds: usize) -> Result<Vec<FloodRun>> {
    let mut runs = Vec::new();
    for &size in sizes {
        for _ in 0..rounds {
            for random in [false, true] {
                let run = run_once(pair, size, random)
                    .with_context(|| format!("flood, max_sources {size}, random {random}"))?;
                eprintln!(
                    "  flood ({}, max_sources {size}): {:.2} M frames/s through the limiter; \
                     good source {}/{} dropped ({:.3} %); heavy source {} passed of {} \
                     sent, bound {:.0}",
                    run.flood,
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

/// The Markdown report of [`measure`].
pub fn markdown(runs: &[FloodRun], kernel: &str) -> String {
    let mut out = String::from("# limiter: a spoofed-source flood, end to end\n\n");
    out += &format!(
        "- kernel {kernel}; the flood: live frames as fast as one CPU sends them, alternating \
         IPv4 (random sources of 198.18.0.0/15) and IPv6 (random /64s of 2001:db8::/32), \
         to two rules with a per-source limit of 10/s; on the other CPU a good source sends \
         {GOOD_SENDS}/s under its {GOOD_RATE}/s (burst {GOOD_BURST}) and a heavy one lumps \
         of {} every {} ms against {HEAVY_RATE}/s (burst {HEAVY_BURST}); {} s each; counted \
         by the limiter's rules\n\n",
        HEAVY_SENDS * HEAVY_LUMP.as_millis() as u64 / 1000,
        HEAVY_LUMP.as_millis(),
        WINDOW.as_secs()
    );
    out += "| flood | max_sources | flood frames/s at the limiter | host end frames/s | good source dropped | heavy passed / bound |\n|---|---:|---:|---:|---:|---:|\n";
    for r in runs {
        out += &format!(
            "| {} | {} | {:.2} M | {:.2} M | {} of {} ({:.3} %) | {} / {:.0}{} |\n",
            r.flood,
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
    out
}
