//! Figure 3: what the limiter admits against what it is configured to admit, on real
//! frames over the veth pair (AF_PACKET senders, paced smoothly, two CPUs):
//! - each rate offered at 2× from an idle (full) bucket: admitted ÷ what an exact token
//!   bucket admits from the arrivals as sampled every 10 ms — rate × T + burst, T the span
//!   from the first frame sent to the last, unless a sender stalled;
//! - a sweep of the offered rate from 0.25× to 4× a 100k/s rule (admitted vs offered);
//! - a burst timeline: a rule with a large burst hit from idle at 2× its rate, its passed
//!   counter sampled every 20 ms.
//!
//! Every run checks that the rule counted every frame the interface received, that a TC
//! ingress counter behind XDP saw exactly what the rule passed, and that no frame went
//! unmetered (`contended`, `insert_failures`).

use std::{
    thread::sleep,
    time::{Duration, Instant},
};

use anyhow::{ensure, Context as _, Result};
use limiter_common::abi::RuleCounters;
use limiter_tests::{
    fixture::{self, Snapshot},
    netns::VethPair,
    rx::RxCounter,
};

use super::{
    gen::{self, Backend, Offer, Sent},
    host::{Installed, LinkStats, Setup, RULE_NAME},
    twice, udp_frames, FRAME_LEN, SENDER_CPUS,
};

/// The target the bench holds it to: admitted within 1 % of what the rule allows.
pub const TARGET: f64 = 0.01;
/// A paced sender's largest lump: smooth enough for the smallest burst used (20 ms).
const LUMP: Duration = Duration::from_millis(1);
const TABLE_DURATION: Duration = Duration::from_millis(2000);
const SWEEP_DURATION: Duration = Duration::from_millis(1500);
/// The sweep's rule.
pub const SWEEP_RATE: u64 = 100_000;
pub const SWEEP_BURST: u64 = 2_000;
pub const SWEEP_MULTIPLES: [f64; 9] = [0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0];
/// The burst timeline's rule and offer.
pub const BURST_RATE: u64 = 50_000;
pub const BURST_BURST: u64 = 50_000;
const BURST_DURATION: Duration = Duration::from_millis(2500);
pub const BURST_SAMPLE: Duration = Duration::from_millis(20);
/// How often the other runs sample the arrivals, for the exact limiter's expectation.
pub const TRACE_EVERY: Duration = Duration::from_millis(10);
/// Frame length for the bytes rule: 100 Mbit/s is then 12,500 frames/s.
const BYTES_FRAME_LEN: usize = 1000;

/// A rule of the accuracy table.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub label: &'static str,
    pub bytes: bool,
    /// Units (packets or bytes) per second.
    pub rate: u64,
    pub burst: u64,
    pub frame_len: usize,
}

impl Case {
    /// Frames per second the rule admits.
    pub fn frame_rate(&self) -> f64 {
        if self.bytes {
            self.rate as f64 / self.frame_len as f64
        } else {
            self.rate as f64
        }
    }

    fn limits(&self) -> String {
        let unit = if self.bytes { "bytes" } else { "packets" };
        format!(
            "unit = \"{unit}\"\nrate = {}\nburst = {}",
            self.rate, self.burst
        )
    }
}

/// The rates of the table: bursts are 20 ms of the rate.
pub fn cases() -> Vec<Case> {
    let packets = |label, rate: u64| Case {
        label,
        bytes: false,
        rate,
        burst: rate / 50,
        frame_len: FRAME_LEN,
    };
    vec![
        packets("1k packets/s", 1_000),
        packets("10k packets/s", 10_000),
        packets("100k packets/s", 100_000),
        packets("500k packets/s", 500_000),
        Case {
            label: "100 Mbit/s (bytes, 1000-byte frames)",
            bytes: true,
            rate: 12_500_000,
            burst: 250_000,
            frame_len: BYTES_FRAME_LEN,
        },
    ]
}

/// One row of the accuracy table.
#[derive(Clone, Debug)]
pub struct CaseResult {
    pub case: Case,
    /// Offered ÷ rate, from what reached XDP over the span.
    pub offered_multiple: f64,
    /// Units admitted.
    pub admitted: u64,
    /// What an exact limiter admits from the arrivals as measured (see `Outcome::exact`).
    pub expected: f64,
    /// min(offered, rate × T + burst): the same for a perfectly continuous overload.
    pub continuous: f64,
}

impl CaseResult {
    pub fn ratio(&self) -> f64 {
        self.admitted as f64 / self.expected
    }

    pub fn met(&self) -> bool {
        (self.ratio() - 1.0).abs() <= TARGET
    }
}

/// One point of the sweep.
#[derive(Clone, Copy, Debug)]
pub struct SweepPoint {
    pub multiple: f64,
    /// Frames/s that reached XDP, and frames/s the rule passed.
    pub offered: f64,
    pub admitted: f64,
    /// What an exact limiter admits from the measured arrivals, per second: with a
    /// steady offer, min(offered, rate + burst / T).
    pub ideal: f64,
    pub dropped: u64,
}

/// The burst timeline: cumulative frames at each sample, from the first frame sent.
#[derive(Clone, Debug, Default)]
pub struct Timeline {
    /// (seconds, offered so far, admitted so far)
    pub points: Vec<(f64, u64, u64)>,
    pub span: f64,
}

impl Timeline {
    /// min(offered, burst + rate × t): what an exact limiter admits by `t`.
    pub fn ideal(t: f64, offered: u64) -> f64 {
        (offered as f64).min(BURST_BURST as f64 + BURST_RATE as f64 * t)
    }
}

/// All of figure 3; a point that could not be measured holds its error.
pub struct Accuracy {
    pub cases: Vec<Result<CaseResult>>,
    pub sweep: Vec<Result<SweepPoint>>,
    pub timeline: Result<Timeline>,
}

pub fn measure(pair: &VethPair) -> Accuracy {
    let cases = cases()
        .into_iter()
        .map(|case| {
            twice(|| measure_case(pair, case)).with_context(|| format!("accuracy, {}", case.label))
        })
        .collect();
    let sweep = SWEEP_MULTIPLES
        .iter()
        .map(|&m| twice(|| measure_sweep_point(pair, m)).with_context(|| format!("sweep at {m}×")))
        .collect();
    let timeline = measure_timeline(pair).context("burst timeline");
    Accuracy {
        cases,
        sweep,
        timeline,
    }
}

/// One run of a single-rule limiter from a full bucket, the senders paced at
/// `rate_per_sender`; arrivals and the passed counter sampled every `every`.
struct Run {
    limits: String,
    frame_len: usize,
    rate_per_sender: u64,
    duration: Duration,
    every: Duration,
}

/// One sample taken while the senders run: (when, frames that reached XDP so far, frames
/// the rule passed so far).
type Sample = (Instant, u64, u64);

/// What a run measured, checked.
struct Outcome {
    sent: Sent,
    /// Frames that reached XDP.
    seen: u64,
    rule: RuleCounters,
    trace: Vec<Sample>,
    /// When the senders had finished (the last arrivals are counted by then).
    finished: Instant,
}

impl Outcome {
    fn span(&self) -> f64 {
        self.sent.span().as_secs_f64()
    }

    /// The samples taken while frames were being sent.
    fn inside(&self) -> Vec<Sample> {
        self.trace
            .iter()
            .copied()
            .filter(|(at, _, _)| *at >= self.sent.first && *at <= self.sent.last)
            .collect()
    }

    /// What an exact token bucket (`rate` and `burst` in units, full when the first
    /// frame is sent) admits from the arrivals as sampled, each interval's arrivals taken
    /// as evenly spread over the part of it in which frames were sent: fluid, so a
    /// fraction of a frame per interval off at most. When the offer stays above the rate
    /// this is min(offered, rate × T + burst); when a sender stalls (other load on the
    /// machine), the bucket refills and loses tokens like the real one, and this
    /// accounts for it.
    fn exact(&self, rate: f64, burst: f64, units_per_frame: f64) -> f64 {
        let (first, last) = (self.sent.first, self.sent.last);
        // Sending time between two instants.
        let sending = |a: Instant, b: Instant| {
            b.min(last)
                .saturating_duration_since(a.max(first))
                .as_secs_f64()
        };
        let mut tokens = burst;
        let mut admitted = 0.0;
        let mut previous: Option<(Instant, u64)> = None;
        let points = self
            .trace
            .iter()
            .map(|&(at, seen, _)| (at, seen))
            .chain(std::iter::once((self.finished, self.seen)));
        for (at, seen) in points {
            let (refill, arrived) = match previous {
                None => (0.0, seen),
                Some((t0, seen0)) => (rate * sending(t0, at), seen.saturating_sub(seen0)),
            };
            let arrived = arrived as f64 * units_per_frame;
            let took = arrived.min(tokens + refill);
            admitted += took;
            tokens = (tokens + refill - took).min(burst);
            previous = Some((at, seen));
        }
        admitted
    }
}

fn run(pair: &VethPair, run: Run) -> Result<Outcome> {
    let installed = Installed::new(
        &pair.host,
        &Setup::Limiter {
            limits: run.limits.clone(),
        },
    )?;
    let limiter = installed.limiter().context("no limiter installed")?;
    let rx = RxCounter::attach(&pair.host).context("attaching the TC receive counter")?;
    let before = (
        limiter.snapshot()?,
        LinkStats::read(&pair.host)?,
        rx.totals()?,
    );
    let offer = Offer {
        backend: Backend::AfPacket,
        frames: udp_frames(pair, 1, run.frame_len)?,
        rate_per_sender: Some(run.rate_per_sender),
        lump: LUMP,
        duration: run.duration,
        cpus: SENDER_CPUS.to_vec(),
    };
    let running = gen::spawn(pair, &offer)?;
    let passed = |snapshot: &Snapshot| {
        snapshot
            .rules
            .get(RULE_NAME)
            .map_or(0, |r| r.passed_packets)
    };
    let passed_before = passed(&before.0);
    let trace = sample_while(run.duration + run.every, run.every, || {
        let seen = LinkStats::read(&pair.host)?.since(&before.1).rx_packets;
        Ok((seen, passed(&limiter.snapshot()?) - passed_before))
    })?;
    let sent = running.join()?;
    let finished = Instant::now();
    sleep(Duration::from_millis(50));
    let delta = fixture::delta(&before.0, &limiter.snapshot()?);
    let seen = LinkStats::read(&pair.host)?.since(&before.1).rx_packets;
    let received = rx.totals()?;
    let rule = *delta
        .rules
        .get(RULE_NAME)
        .context("no counters for the rule")?;
    check(&sent, seen, &rule, &delta.global)?;
    let rx_packets = received.packets - before.2.packets;
    ensure!(
        rx_packets == rule.passed_packets,
        "TC behind XDP received {rx_packets} frames, the rule passed {}",
        rule.passed_packets
    );
    Ok(Outcome {
        sent,
        seen,
        rule,
        trace,
        finished,
    })
}

/// Calls `read` every `every` for `duration`, timestamping what it returns.
fn sample_while(
    duration: Duration,
    every: Duration,
    mut read: impl FnMut() -> Result<(u64, u64)>,
) -> Result<Vec<Sample>> {
    let start = Instant::now();
    let mut next = start;
    let mut samples = Vec::new();
    while start.elapsed() < duration {
        let at = Instant::now();
        let (seen, passed) = read()?;
        samples.push((at, seen, passed));
        next += every;
        sleep(next.saturating_duration_since(Instant::now()));
    }
    Ok(samples)
}

fn check(
    sent: &Sent,
    seen: u64,
    rule: &RuleCounters,
    global: &limiter_common::abi::GlobalCounters,
) -> Result<()> {
    ensure!(
        seen <= sent.frames && seen as f64 >= 0.999 * sent.frames as f64,
        "{seen} of {} frames sent reached XDP",
        sent.frames
    );
    ensure!(
        rule.passed_packets + rule.dropped_packets == seen,
        "the rule counted {} passed + {} dropped, XDP saw {seen}",
        rule.passed_packets,
        rule.dropped_packets
    );
    ensure!(
        global.contended == 0 && global.sketch_unseeded == 0,
        "{} frames went unmetered (contended), {} insert failures",
        global.contended,
        global.sketch_unseeded
    );
    Ok(())
}

/// Rate at 2×, from a full bucket, for `TABLE_DURATION`.
fn measure_case(pair: &VethPair, case: Case) -> Result<CaseResult> {
    let per_sender = (2.0 * case.frame_rate() / SENDER_CPUS.len() as f64).round() as u64;
    let out = run(
        pair,
        Run {
            limits: case.limits(),
            frame_len: case.frame_len,
            rate_per_sender: per_sender,
            duration: TABLE_DURATION,
            every: TRACE_EVERY,
        },
    )?;
    let (admitted, offered) = if case.bytes {
        (
            out.rule.passed_bytes,
            out.rule.passed_bytes + out.rule.dropped_bytes,
        )
    } else {
        (out.rule.passed_packets, out.seen)
    };
    let span = out.span();
    let offered_multiple = offered as f64 / span / case.rate as f64;
    ensure!(
        offered_multiple >= 1.5,
        "offered only {offered_multiple:.2}× the rate (the senders fell short of 2×)"
    );
    let units_per_frame = if case.bytes {
        case.frame_len as f64
    } else {
        1.0
    };
    Ok(CaseResult {
        case,
        offered_multiple,
        admitted,
        expected: out.exact(case.rate as f64, case.burst as f64, units_per_frame),
        continuous: (case.rate as f64 * span + case.burst as f64).min(offered as f64),
    })
}

fn measure_sweep_point(pair: &VethPair, multiple: f64) -> Result<SweepPoint> {
    let total = SWEEP_RATE as f64 * multiple;
    let out = run(
        pair,
        Run {
            limits: format!("rate = {SWEEP_RATE}\nburst = {SWEEP_BURST}"),
            frame_len: FRAME_LEN,
            rate_per_sender: (total / SENDER_CPUS.len() as f64).round() as u64,
            duration: SWEEP_DURATION,
            every: TRACE_EVERY,
        },
    )?;
    let span = out.span();
    let offered = out.seen as f64 / span;
    ensure!(offered > 0.0, "nothing offered");
    let ideal = out.exact(SWEEP_RATE as f64, SWEEP_BURST as f64, 1.0) / span;
    Ok(SweepPoint {
        multiple,
        offered,
        admitted: out.rule.passed_packets as f64 / span,
        ideal,
        dropped: out.rule.dropped_packets,
    })
}

fn measure_timeline(pair: &VethPair) -> Result<Timeline> {
    let out = run(
        pair,
        Run {
            limits: format!("rate = {BURST_RATE}\nburst = {BURST_BURST}"),
            frame_len: FRAME_LEN,
            rate_per_sender: BURST_RATE,
            duration: BURST_DURATION,
            every: BURST_SAMPLE,
        },
    )?;
    let first = out.sent.first;
    let points: Vec<(f64, u64, u64)> = out
        .inside()
        .iter()
        .map(|&(at, seen, passed)| (at.duration_since(first).as_secs_f64(), seen, passed))
        .collect();
    ensure!(
        points.len() >= 50,
        "only {} samples of the passed counter",
        points.len()
    );
    let span = out.span();
    let expected = BURST_BURST as f64 + BURST_RATE as f64 * span;
    let error = out.rule.passed_packets as f64 / expected - 1.0;
    ensure!(
        error.abs() <= 0.05,
        "passed {} in {span:.3} s, expected {expected:.0} ({:+.2} %)",
        out.rule.passed_packets,
        error * 100.0
    );
    Ok(Timeline { points, span })
}
