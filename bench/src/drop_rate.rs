//! Figure 1: frames per second the limiter drops on the host end of the veth pair, as a
//! ratio to a plain XDP_DROP program fed by the same generator on the same path. Two
//! senders, one per CPU, as fast as they go; the rate is what XDP processed (the host
//! end's `rx_packets`) over a window after a warm-up. Each round runs XDP_DROP and the
//! limiter back to back; the figure is the median of the per-round ratios.
//!
//! Each round also runs the limiter sampling its refusals at [`SAMPLING_BUDGET`] events
//! per second and CPU, the ring buffer drained by a thread (`limiter monitor`'s path): a
//! flood's frames past each second's first events meet a spent budget. That run must
//! write no more than the budget allows, skip the rest as counted, and lose none.
//!
//! A second ratio divides by CPU time (scheduler runtime of this process and ksoftirqd)
//! instead of wall time: frames per CPU-second, which neither other load on the machine
//! nor the live-frames generator's idle gaps distort. A round with other load beside it
//! is marked disturbed and left out when undisturbed rounds exist.

use std::{
    thread::sleep,
    time::{Duration, Instant},
};

use anyhow::{ensure, Context as _, Result};
use limiter_tests::netns::VethPair;

use super::{
    cpu::{self, CpuSample, OwnSample},
    gen::{self, Backend, Offer},
    host::{Installed, LinkStats, SamplingTally, Setup},
    stats::Spread,
    udp_frames, FRAME_LEN, SENDER_CPUS,
};

const ROUNDS: usize = 3;
const WARMUP: Duration = Duration::from_millis(400);
const WINDOW: Duration = Duration::from_millis(1200);
/// The senders run a little past the window, so it never sees them stop.
const TAIL: Duration = Duration::from_millis(200);
/// The target the bench holds it to: the limiter drops at least this fraction of XDP_DROP's rate.
pub const TARGET: f64 = 0.9;
/// The limiter's rule for this figure: almost every frame is over it.
pub const RULE: &str = "rate = 1000\nburst = 100";
/// Other load (CPUs) beside a run that marks its round disturbed.
pub const DISTURBED: f64 = 0.1;
/// Sources the flood comes from, in turn (the rule has no per-source limit: for it, and
/// for XDP_DROP, they are the same frames; for sampling, events with many sources).
pub const FLOOD_SOURCES: u32 = 4096;
/// Events per second and CPU the sampling run allows (`[monitor] events_per_sec`).
pub const SAMPLING_BUDGET: u32 = 1_000;

/// One measurement window.
#[derive(Clone, Copy, Debug)]
pub struct Run {
    pub frames_per_second: f64,
    /// Frames per CPU-second of this process and ksoftirqd.
    pub frames_per_cpu_second: f64,
    /// CPUs busy with other work than this measurement.
    pub other_load: f64,
}

/// XDP_DROP, the limiter, and the limiter sampling its refusals, back to back.
#[derive(Clone, Copy, Debug)]
pub struct Round {
    pub xdp_drop: Run,
    pub limiter: Run,
    pub sampling: Run,
}

impl Round {
    pub fn disturbed(&self) -> bool {
        [self.xdp_drop, self.limiter, self.sampling]
            .iter()
            .any(|run| run.other_load > DISTURBED)
    }

    /// Sampling on ÷ off, frames per second.
    pub fn sampling_ratio(&self) -> f64 {
        self.sampling.frames_per_second / self.limiter.frames_per_second
    }

    /// Sampling on ÷ off, frames per CPU-second.
    pub fn sampling_cpu_ratio(&self) -> f64 {
        self.sampling.frames_per_cpu_second / self.limiter.frames_per_cpu_second
    }

    pub fn ratio(&self) -> f64 {
        self.limiter.frames_per_second / self.xdp_drop.frames_per_second
    }

    pub fn cpu_ratio(&self) -> f64 {
        self.limiter.frames_per_cpu_second / self.xdp_drop.frames_per_cpu_second
    }
}

/// One generator backend's result.
#[derive(Clone, Debug)]
pub struct DropRateRow {
    pub backend: Backend,
    pub rounds: Vec<Round>,
    /// Fraction of the frames sent that reached XDP, lowest over all runs.
    pub min_delivered: f64,
}

impl DropRateRow {
    /// The rounds the figures use (undisturbed ones if any), and whether all were
    /// disturbed.
    pub fn used(&self) -> (Vec<Round>, bool) {
        let clean: Vec<Round> = self
            .rounds
            .iter()
            .copied()
            .filter(|r| !r.disturbed())
            .collect();
        if clean.is_empty() {
            (self.rounds.clone(), true)
        } else {
            (clean, false)
        }
    }

    fn spread(&self, f: impl Fn(&Round) -> f64) -> Result<Spread> {
        let values: Vec<f64> = self.used().0.iter().map(f).collect();
        Spread::of(&values).context("no drop-rate measurement")
    }

    pub fn xdp_drop(&self) -> Result<Spread> {
        self.spread(|r| r.xdp_drop.frames_per_second)
    }

    pub fn limiter(&self) -> Result<Spread> {
        self.spread(|r| r.limiter.frames_per_second)
    }

    pub fn ratio(&self) -> Result<Spread> {
        self.spread(Round::ratio)
    }

    pub fn cpu_ratio(&self) -> Result<Spread> {
        self.spread(Round::cpu_ratio)
    }

    pub fn sampling(&self) -> Result<Spread> {
        self.spread(|r| r.sampling.frames_per_second)
    }

    pub fn sampling_ratio(&self) -> Result<Spread> {
        self.spread(Round::sampling_ratio)
    }

    pub fn sampling_cpu_ratio(&self) -> Result<Spread> {
        self.spread(Round::sampling_cpu_ratio)
    }

    pub fn disturbed_rounds(&self) -> usize {
        self.rounds.iter().filter(|r| r.disturbed()).count()
    }

    /// The ratio the target is judged on, and what it is: frames per wall-clock second
    /// from undisturbed rounds; when every round was disturbed, frames per CPU-second
    /// (other load takes wall time from the senders, not CPU time).
    pub fn target_ratio(&self) -> Result<(f64, &'static str)> {
        if self.used().1 {
            Ok((
                self.cpu_ratio()?.median,
                "per CPU-second: every round disturbed by other load",
            ))
        } else {
            Ok((self.ratio()?.median, "frames/s"))
        }
    }

    pub fn met(&self) -> Result<bool> {
        Ok(self.target_ratio()?.0 >= TARGET)
    }
}

/// Measures every backend.
pub fn measure(pair: &VethPair) -> Result<Vec<DropRateRow>> {
    let softirqd = cpu::softirqd_pids()?;
    Backend::ALL
        .iter()
        .map(|&backend| measure_backend(pair, backend, &softirqd))
        .collect()
}

fn measure_backend(pair: &VethPair, backend: Backend, softirqd: &[u32]) -> Result<DropRateRow> {
    let mut row = DropRateRow {
        backend,
        rounds: Vec::new(),
        min_delivered: 1.0,
    };
    let limiter = Setup::Limiter {
        limits: RULE.to_string(),
    };
    let sampling = Setup::LimiterSampling {
        limits: RULE.to_string(),
        events_per_sec: SAMPLING_BUDGET,
    };
    let mut measure = |setup: &Setup| {
        let (run, delivered) = run_once(pair, backend, setup, softirqd)
            .with_context(|| format!("drop rate, {}, {setup:?}", backend.label()))?;
        row.min_delivered = row.min_delivered.min(delivered);
        anyhow::Ok(run)
    };
    let mut rounds = Vec::new();
    for _ in 0..ROUNDS {
        let xdp_drop = measure(&Setup::XdpDrop)?;
        let limiter = measure(&limiter)?;
        let sampling = measure(&sampling)?;
        rounds.push(Round {
            xdp_drop,
            limiter,
            sampling,
        });
    }
    row.rounds = rounds;
    Ok(row)
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

/// One saturating run, and the fraction of the frames sent that reached XDP.
fn run_once(
    pair: &VethPair,
    backend: Backend,
    setup: &Setup,
    softirqd: &[u32],
) -> Result<(Run, f64)> {
    let mut installed = Installed::new(&pair.host, setup)?;
    let started = Instant::now();
    let verdicts_before = installed.verdicts()?;
    let link_before = LinkStats::read(&pair.host)?;
    let offer = Offer {
        backend,
        frames: udp_frames(pair, FLOOD_SOURCES, FRAME_LEN)?,
        rate_per_sender: None,
        lump: Duration::ZERO,
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
    ensure!(
        seen <= sent.frames && seen > 0,
        "XDP saw {seen} frames of {} sent",
        sent.frames
    );
    if let (Some(before), Some(after)) = (verdicts_before, installed.verdicts()?) {
        let counted = after.counted.zip(before.counted).map(|(a, b)| a - b);
        let dropped = after.dropped - before.dropped;
        ensure!(
            counted == Some(seen),
            "the rule counted {counted:?} frames, the interface {seen}"
        );
        ensure!(
            dropped as f64 >= 0.99 * seen as f64,
            "only {dropped} of {seen} frames dropped: not a drop rate"
        );
    }
    if let Some(tally) = installed.finish_sampling()? {
        check_sampling(
            &tally,
            dropped_since(&installed, verdicts_before)?,
            started.elapsed(),
        )?;
    }
    let frames = end.link.since(&start.link).rx_packets as f64;
    ensure!(frames > 0.0, "no frame reached XDP in the measuring window");
    let wall = end.at.duration_since(start.at).as_secs_f64();
    let own = end.own.since(&start.own);
    let busy = end.cpu.since(&start.cpu)?.cpu_seconds;
    let run = Run {
        frames_per_second: frames / wall,
        frames_per_cpu_second: frames / own,
        other_load: ((busy - own) / wall).max(0.0),
    };
    Ok((run, seen as f64 / sent.frames as f64))
}

/// The rule's drops since `before` (0 without a rule).
fn dropped_since(installed: &Installed, before: Option<crate::host::Verdicts>) -> Result<u64> {
    Ok(match (before, installed.verdicts()?) {
        (Some(before), Some(after)) => after.dropped - before.dropped,
        _ => 0,
    })
}

/// A sampling run kept its budget (per CPU and second: at most ceil(T) + 1 seconds of
/// the clock on each sender's CPU), counted every refusal it did not sample, lost none
/// with a reader draining the ring, and the reader read what was written.
fn check_sampling(tally: &SamplingTally, dropped: u64, elapsed: Duration) -> Result<()> {
    let c = tally.counters;
    let allowed = u64::from(SAMPLING_BUDGET) * SENDER_CPUS.len() as u64 * (elapsed.as_secs() + 2);
    ensure!(
        c.sampled > 0 && c.sampled <= allowed,
        "sampling wrote {} events in {elapsed:?}, its budget allows 1..={allowed}",
        c.sampled
    );
    ensure!(
        c.lost_full == 0,
        "{} events lost to a full ring buffer with a reader draining it",
        c.lost_full
    );
    ensure!(
        c.sampled + c.skipped_budget == dropped,
        "{} sampled + {} skipped for the budget, but the rule dropped {dropped}",
        c.sampled,
        c.skipped_budget
    );
    ensure!(
        tally.read == c.sampled,
        "the reader read {} events of {} written",
        tally.read,
        c.sampled
    );
    Ok(())
}
