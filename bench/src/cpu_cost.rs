//! Figure 2: CPU time per frame at a fixed paced offer, below saturation, for the
//! limiter, nftables doing the same job, a plain XDP_DROP and no filter at all, on the
//! same veth with the same generator.
//!
//! Cost per frame = (busy CPU time of the whole machine from /proc/stat, all CPUs, user +
//! system + irq + softirq, minus the idle reference load × wall time) ÷ frames. The
//! generator's own cost is in every row, so the differences to the XDP_DROP row are the
//! figures that compare filters. A second reading counts only this process's threads and
//! `ksoftirqd` (scheduler runtime, exact): what the machine did besides is other load. A
//! sample with more than [`DISTURBED`] CPUs of it is disturbed and left out of the
//! /proc/stat figure. The limiter-vs-nftables verdicts use the second reading: /proc/stat
//! is tick-sampled here and strays even when undisturbed (see [`CostTable::verdicts`]).

use std::{
    thread::sleep,
    time::{Duration, Instant},
};

use anyhow::{ensure, Context as _, Result};
use limiter_tests::netns::VethPair;

use super::{
    cpu::{self, CpuSample, OwnSample},
    gen::{self, Backend, Offer},
    host::{Installed, LinkStats, Setup, Verdicts},
    nft::NftLimit,
    stats::Spread,
    twice, udp_frames, FRAME_LEN, SENDER_CPUS,
};

/// Frames per second per sender (two senders: 300k frames/s in all).
pub const RATE_PER_SENDER: u64 = 150_000;
/// Sources the frames come from, in turn (one per call on the live path).
pub const SOURCES: u32 = 256;
/// Aggregate rule: almost everything at 300k/s is over it.
pub const AGG_RATE: u64 = 1000;
pub const AGG_BURST: u64 = 100;
/// Per-source rule: 256 sources × 10/s pass, the rest is over.
pub const SRC_RATE: u64 = 10;
pub const SRC_BURST: u64 = 10;

pub const ROUNDS: usize = 3;
const WARMUP: Duration = Duration::from_millis(300);
const WINDOW: Duration = Duration::from_millis(1000);
const TAIL: Duration = Duration::from_millis(150);
/// AF_PACKET senders send 4 ms worth of frames per wake-up: waking costs a lot in this
/// VM, and it is the generator's cost, the same in every row, but it varies.
const LUMP: Duration = Duration::from_millis(4);
const IDLE_WINDOW: Duration = Duration::from_millis(500);
/// Other load (CPUs) that marks a sample disturbed: in the idle reference, or beside the
/// measurement beyond the idle reference.
pub const DISTURBED: f64 = 0.05;
/// Samples a figure needs: undisturbed ones for /proc/stat (it is tick-sampled: one is
/// too noisy), valid ones for the own reading.
pub const MIN_CLEAN: usize = 2;
/// A limiting row must drop at least this fraction of what it saw.
const MIN_DROPPED: f64 = 0.95;

/// What a row limits, for pairing limiter and nftables rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Job {
    None,
    Aggregate,
    PerSource,
}

/// One measured window.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    pub frames_per_second: f64,
    /// Machine-wide busy time minus the idle reference, per frame.
    pub machine_ns: f64,
    /// This process and ksoftirqd, per frame (scheduler runtime, exact).
    pub own_ns: f64,
    /// The same, tick-sampled.
    pub own_tick_ns: f64,
    /// CPUs busy with something else than this measurement (machine busy minus this
    /// process and ksoftirqd).
    pub other_load: f64,
    /// The idle reference load of the round.
    pub idle: f64,
    /// Fraction of the frames seen that the row's rule dropped (limiting rows).
    pub dropped: Option<f64>,
}

impl Sample {
    /// Other work ran: in the idle reference or beside the measurement.
    pub fn disturbed(&self) -> bool {
        self.idle > DISTURBED || self.other_load > self.idle + DISTURBED
    }
}

/// One line of a backend's table.
#[derive(Clone, Debug)]
pub struct CostRow {
    pub label: &'static str,
    pub job: Job,
    pub is_nft: bool,
    pub is_xdp_drop: bool,
    /// The limiter's TC build (compared with nftables on its own).
    pub is_limiter_tc: bool,
    setup: Setup,
    pub samples: Vec<Sample>,
    /// Samples that failed their checks even when measured again (e.g. other load kept
    /// the generator from its offer), with why.
    pub failures: Vec<String>,
}

impl CostRow {
    /// Machine-wide ns/frame over the undisturbed samples; `None` unless at least
    /// [`MIN_CLEAN`] samples were undisturbed by other load.
    pub fn machine_ns(&self) -> Option<Spread> {
        let values: Vec<f64> = self
            .samples
            .iter()
            .filter(|s| !s.disturbed())
            .map(|s| s.machine_ns)
            .collect();
        if values.len() < MIN_CLEAN {
            return None;
        }
        Spread::of(&values)
    }

    /// This process and ksoftirqd, ns/frame, over every sample.
    /// Fails unless [`MIN_CLEAN`] samples passed their checks.
    pub fn own_ns(&self) -> Result<Spread> {
        let values: Vec<f64> = self.samples.iter().map(|s| s.own_ns).collect();
        ensure!(
            values.len() >= MIN_CLEAN,
            "{}: {} valid sample(s) of {ROUNDS}; failed: {}",
            self.label,
            values.len(),
            self.failures.join("; ")
        );
        Spread::of(&values).with_context(|| format!("no CPU-cost sample for {}", self.label))
    }

    pub fn disturbed_samples(&self) -> usize {
        self.samples.iter().filter(|s| s.disturbed()).count()
    }
}

/// One backend's table.
#[derive(Clone, Debug)]
pub struct CostTable {
    pub backend: Backend,
    pub rows: Vec<CostRow>,
    /// Idle reference load (CPUs) of each round.
    pub idle: Vec<f64>,
}

/// A limiter-vs-nftables comparison (medians).
#[derive(Clone, Debug)]
pub struct Verdict {
    pub job: Job,
    /// Which build of the limiter: "XDP" or "TC".
    pub build: &'static str,
    pub limiter_ns: f64,
    pub nft_ns: f64,
    pub xdp_drop_ns: f64,
    /// The larger half-range (max − min) / 2 of the two rows' samples.
    pub noise_ns: f64,
}

impl Verdict {
    pub fn met(&self) -> bool {
        self.limiter_ns < self.nft_ns
    }

    /// The difference is smaller than the rows' own spread.
    pub fn within_noise(&self) -> bool {
        (self.limiter_ns - self.nft_ns).abs() <= self.noise_ns
    }
}

fn half_range(a: &Spread, b: &Spread) -> f64 {
    ((a.max - a.min) / 2.0).max((b.max - b.min) / 2.0)
}

impl CostTable {
    pub fn row(&self, pred: impl Fn(&CostRow) -> bool) -> Option<&CostRow> {
        self.rows.iter().find(|r| pred(r))
    }

    pub fn xdp_drop(&self) -> Result<&CostRow> {
        self.row(|r| r.is_xdp_drop).context("no XDP_DROP row")
    }

    /// Limiter vs nftables for each job both rows were measured for, on the own-runtime
    /// reading: exact, and blind to other load. (The /proc/stat reading is tick-sampled
    /// at 250 Hz here, and the generators' periodic sleeps alias with the tick: even
    /// undisturbed it strays by ±100 ns per frame, most on the live path.)
    pub fn verdicts(&self) -> Result<Vec<Verdict>> {
        let drop = self.xdp_drop()?;
        let mut out = Vec::new();
        for job in [Job::Aggregate, Job::PerSource] {
            for (build, is_tc) in [("XDP", false), ("TC", true)] {
                let limiter = self.row(|r| r.job == job && !r.is_nft && r.is_limiter_tc == is_tc);
                let nft = self.row(|r| r.job == job && r.is_nft);
                let (Some(l), Some(n)) = (limiter, nft) else {
                    continue;
                };
                // A row without enough valid samples is reported INVALID on its own.
                let (Ok(l), Ok(n), Ok(d)) = (l.own_ns(), n.own_ns(), drop.own_ns()) else {
                    continue;
                };
                out.push(Verdict {
                    job,
                    build,
                    limiter_ns: l.median,
                    nft_ns: n.median,
                    xdp_drop_ns: d.median,
                    noise_ns: half_range(&l, &n),
                });
            }
        }
        Ok(out)
    }
}

fn rows(backend: Backend) -> Vec<CostRow> {
    let live = backend == Backend::Live;
    let row = |label, job, setup: Setup| CostRow {
        label,
        job,
        is_nft: matches!(setup, Setup::Nft { .. }),
        is_xdp_drop: matches!(setup, Setup::XdpDrop),
        is_limiter_tc: matches!(setup, Setup::LimiterTc { .. }),
        setup,
        samples: Vec::new(),
        failures: Vec::new(),
    };
    let agg = NftLimit::Aggregate {
        rate: AGG_RATE,
        burst: AGG_BURST,
    };
    let per_source = NftLimit::PerSource {
        rate: SRC_RATE,
        burst: SRC_BURST,
    };
    let reference = if live {
        row("XDP_PASS, the stack drops", Job::None, Setup::XdpPass)
    } else {
        row("nothing attached, the stack drops", Job::None, Setup::Stack)
    };
    let mut rows = vec![
        reference,
        row("plain XDP_DROP", Job::None, Setup::XdpDrop),
        row(
            "limiter, aggregate rule",
            Job::Aggregate,
            Setup::Limiter {
                limits: format!("rate = {AGG_RATE}\nburst = {AGG_BURST}"),
            },
        ),
        row(
            "limiter, per-source rule",
            Job::PerSource,
            Setup::Limiter {
                limits: format!("[rules.per_source]\nrate = {SRC_RATE}\nburst = {SRC_BURST}"),
            },
        ),
        row(
            if live {
                "nftables limit (behind XDP_PASS)"
            } else {
                "nftables limit"
            },
            Job::Aggregate,
            Setup::Nft {
                limit: agg,
                xdp_pass: live,
            },
        ),
        row(
            if live {
                "nftables per-source meter (behind XDP_PASS)"
            } else {
                "nftables per-source meter"
            },
            Job::PerSource,
            Setup::Nft {
                limit: per_source,
                xdp_pass: live,
            },
        ),
    ];
    if !live {
        // Frames born as socket buffers: the TC build, and what any TC program starts
        // from (no XDP program, so no veth copy into a page).
        rows.push(row(
            "limiter at TC ingress (`xdp_mode = \"tc\"`), aggregate rule",
            Job::Aggregate,
            Setup::LimiterTc {
                limits: format!("rate = {AGG_RATE}\nburst = {AGG_BURST}"),
            },
        ));
        rows.push(row(
            "limiter at TC ingress, per-source rule",
            Job::PerSource,
            Setup::LimiterTc {
                limits: format!("[rules.per_source]\nrate = {SRC_RATE}\nburst = {SRC_BURST}"),
            },
        ));
        rows.push(row(
            "plain TC ingress drop, no XDP (reference)",
            Job::None,
            Setup::TcDrop,
        ));
    }
    rows
}

/// Measures both backends.
pub fn measure(pair: &VethPair) -> Result<Vec<CostTable>> {
    let softirqd = cpu::softirqd_pids()?;
    Backend::ALL
        .iter()
        .map(|&backend| measure_backend(pair, backend, &softirqd))
        .collect()
}

fn measure_backend(pair: &VethPair, backend: Backend, softirqd: &[u32]) -> Result<CostTable> {
    let mut table = CostTable {
        backend,
        rows: rows(backend),
        idle: Vec::new(),
    };
    let frames = udp_frames(pair, SOURCES, FRAME_LEN)?;
    for _ in 0..ROUNDS {
        let idle = cpu::idle_load(IDLE_WINDOW)?;
        table.idle.push(idle);
        for row in &mut table.rows {
            match twice(|| run_once(pair, backend, &frames, &row.setup, idle, softirqd)) {
                Ok(sample) => row.samples.push(sample),
                Err(e) => row.failures.push(format!("{e:#}")),
            }
        }
    }
    Ok(table)
}

/// Readings at one instant.
struct Mark {
    link: LinkStats,
    cpu: CpuSample,
    own: OwnSample,
    at: Instant,
}

impl Mark {
    fn read(iface: &str, softirqd: &[u32]) -> Result<Mark> {
        Ok(Mark {
            link: LinkStats::read(iface)?,
            cpu: CpuSample::read()?,
            own: OwnSample::read(softirqd)?,
            at: Instant::now(),
        })
    }
}

fn run_once(
    pair: &VethPair,
    backend: Backend,
    frames: &[Vec<u8>],
    setup: &Setup,
    idle: f64,
    softirqd: &[u32],
) -> Result<Sample> {
    let installed = Installed::new(&pair.host, setup)?;
    let verdicts_before = installed.verdicts()?;
    let link_before = LinkStats::read(&pair.host)?;
    let offer = Offer {
        backend,
        frames: frames.to_vec(),
        rate_per_sender: Some(RATE_PER_SENDER),
        lump: LUMP,
        duration: WARMUP + WINDOW + TAIL,
        cpus: SENDER_CPUS.to_vec(),
    };
    let running = gen::spawn(pair, &offer)?;
    sleep(WARMUP);
    let start = Mark::read(&pair.host, softirqd)?;
    sleep(WINDOW);
    let end = Mark::read(&pair.host, softirqd)?;
    let sent = running.join()?;
    sleep(Duration::from_millis(50));
    let seen = LinkStats::read(&pair.host)?.since(&link_before).rx_packets;
    let dropped = check_run(
        seen,
        sent.frames,
        verdicts_before,
        installed.verdicts()?,
        setup,
    )?;

    let wall = end.at.duration_since(start.at).as_secs_f64();
    let window_frames = end.link.since(&start.link).rx_packets;
    let offered = (RATE_PER_SENDER * SENDER_CPUS.len() as u64) as f64;
    let achieved = window_frames as f64 / wall;
    ensure!(
        (achieved - offered).abs() <= 0.2 * offered,
        "the offer was {offered:.0} frames/s but {achieved:.0}/s reached the interface: \
         the generator did not keep up, so this is not the paced figure"
    );
    let busy = end.cpu.since(&start.cpu)?.cpu_seconds;
    let own = end.own.since(&start.own);
    let own_ticks = end.own.ticks_since(&start.own)?;
    let per_frame = |cpu_seconds: f64| cpu_seconds / window_frames as f64 * 1e9;
    Ok(Sample {
        frames_per_second: achieved,
        machine_ns: per_frame(busy - idle * wall),
        own_ns: per_frame(own),
        own_tick_ns: per_frame(own_ticks),
        other_load: ((busy - own) / wall).max(0.0),
        idle,
        dropped,
    })
}

/// Frames arrived, and a limiting rule did the job it is measured for; returns the
/// fraction it dropped.
fn check_run(
    seen: u64,
    sent: u64,
    before: Option<Verdicts>,
    after: Option<Verdicts>,
    setup: &Setup,
) -> Result<Option<f64>> {
    ensure!(
        seen <= sent && seen as f64 >= 0.98 * sent as f64,
        "{seen} of {sent} frames sent reached the interface"
    );
    let (Some(before), Some(after)) = (before, after) else {
        return Ok(None);
    };
    if let (Some(a), Some(b)) = (after.counted, before.counted) {
        ensure!(
            a - b == seen,
            "the limiter's rule counted {} frames, the interface {seen}",
            a - b
        );
    }
    let dropped = (after.dropped - before.dropped) as f64 / seen as f64;
    ensure!(
        dropped >= MIN_DROPPED,
        "{setup:?} dropped only {:.1} % of the frames: it did not do the job measured",
        dropped * 100.0
    );
    Ok(Some(dropped))
}
