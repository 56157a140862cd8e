//! Accuracy end to end, in native and in generic mode, and the key cases again with the TC
//! build (`xdp_mode = "tc"`): the real program attached to the host end of a veth pair,
//! real frames sent from the peer's namespace (AF_PACKET), the rule counters and a TC
//! ingress counter behind the limiter read afterwards (per-source counts in generic mode
//! come from an AF_PACKET receiver instead: see `SourceCount`).
//!
//! Expectations come from the scenario's own inputs only: the configured rate and burst,
//! what XDP saw offered (passed + dropped), and the time T over which the senders sent
//! (`union_span`: from just before the first `sendmmsg` to just after the last, a bound
//! on the time frames reached XDP, tight to the frames still in the veth rings when the
//! last sender returns). Each overload is checked against the exact limiter: passed
//! within 1 % of min(offered, rate × T + burst).
//!
//! The formula assumes the offer was steady. This machine's 2 CPUs are shared, and a
//! sender that is descheduled for longer than the bucket takes to fill gives the limiter
//! nothing to admit for a while, so it rightly admits less than the formula. Each sender
//! therefore records when it handed over each batch, and an independent floating-point
//! token-bucket model replays that time line to say what the limiter should have
//! admitted for the arrivals that really happened. A run is valid when the model agrees
//! with the formula (steady offer, within 0.5 %), saw every frame sent reach XDP, and,
//! below the rate, says nothing should drop; an invalid run is retried (`ATTEMPTS` times),
//! never counted as a pass. The limiter's figures must then match both the model and the
//! formula within 1 %.
//!
//! A frame list that repeats some entries more than others gives per-source or per-kind
//! offers with one `SendPlan`; which entry each frame was is known from the time line.
//!
//! Each scenario prints one summary line (offered/s, expected, passed, error %).
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

use std::{
    collections::HashMap,
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use limiter_common::abi::SourceKey;
use limiter_tests::{
    frame::{
        self, FrameBuilder, Ipv6Ext, ETH_HLEN, TCP_ACK, TCP_CWR, TCP_ECE, TCP_FIN, TCP_PSH,
        TCP_RST, TCP_SYN,
    },
    scenario::{
        self, for_each_frame, sent_of_entry, udp_to_host, Checks, Limited, ModelBucket, Premise,
        Run, SourceCount, HOST_V4, PEER_V4,
    },
    traffic::{SendPlan, BATCH},
};
use limiter_user::config::XdpMode;

/// How long each measured send lasts (at least 3 s, so that the burst is a small part of
/// what passes).
const SEND_FOR: Duration = Duration::from_millis(3200);
/// Frames still in the veth rings when the senders return are processed within
/// microseconds; wait this long before reading counters anyway.
const SETTLE: Duration = Duration::from_millis(200);
/// One AF_PACKET sender reaches ~0.57 M frames/s on this machine; an offer above this is
/// split over two senders pinned to CPUs 0 and 1 (on a 2-queue pair).
const ONE_SENDER_MAX: f64 = 400_000.0;
/// Attempts of a scenario whose traffic did not come out as planned (see the top).
const ATTEMPTS: u32 = 4;
/// How far the model may be from the formula for the offer to count as steady.
const STEADY: f64 = 0.005;

/// Burst that lets a paced sender below the rate lose nothing. The sender hands the
/// kernel `BATCH` frames per `sendmmsg`, so frames arrive `BATCH` at a time; and on this
/// shared machine its sleep can overshoot, after which it catches up back to back.
/// 100 ms of the rate on top covers a stall of ~100 ms at 0.9× the rate (the bucket
/// refills faster than a 0.9× offer drains it, so it is full before every batch).
fn jitter_burst(rate: u64, max_units_per_frame: u64, senders: u64) -> u64 {
    rate / 10 + senders * BATCH as u64 * max_units_per_frame
}

fn mode_name(mode: XdpMode) -> &'static str {
    match mode {
        XdpMode::Native => "native",
        XdpMode::Generic => "generic",
        XdpMode::Tc => "tc",
        XdpMode::Auto => "auto",
    }
}

fn ipv4(base: Ipv4Addr, i: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(base) + i)
}

fn pct(x: f64) -> f64 {
    x * 100.0
}

/// Relative difference of `got` from `want`.
fn rel(got: f64, want: f64) -> f64 {
    (got - want) / want.max(1.0)
}

#[derive(Clone, Copy)]
struct PlanLimits {
    count: u64,
    duration: Duration,
}

const TIMED: PlanLimits = PlanLimits {
    count: u64::MAX,
    duration: SEND_FOR,
};

/// `senders` senders sharing `fps` frames per second (`None`: as fast as they can), each
/// cycling through `frames`; with more than one, sender `i` is pinned to CPU `i`.
fn plans(
    frames: &[Vec<u8>],
    fps: Option<f64>,
    senders: usize,
    limits: PlanLimits,
) -> Vec<SendPlan> {
    (0..senders)
        .map(|i| SendPlan {
            frames: frames.to_vec(),
            rate: fps.map(|f| (f / senders as f64).round() as u64),
            count: limits.count,
            duration: limits.duration,
            cpu: (senders > 1).then_some(i),
        })
        .collect()
}

fn send(rig: &Limited, plans: Vec<SendPlan>) -> Run {
    Run::send(&rig.pair, plans, SETTLE).expect("sending")
}

fn with_retries(label: &str, attempt: impl FnMut() -> (Checks, Premise)) {
    scenario::with_retries(label, ATTEMPTS, attempt);
}

/// Checks that the model agrees with the formula, i.e. the offer was steady.
fn steady(model: f64, formula: f64, run: &Run) -> Premise {
    if rel(model, formula).abs() > STEADY {
        return Err(format!(
            "unsteady offer: the model of its time line admits {model:.0}, the formula \
             {formula:.0} ({:+.2} %); longest gap between batches {:?}",
            pct(rel(model, formula)),
            run.longest_gap()
        ));
    }
    Ok(())
}

fn all_seen(seen: u64, run: &Run) -> Premise {
    if seen != run.sent {
        return Err(format!(
            "XDP saw {seen} of the {} frames sent (lost in the veth before XDP)",
            run.sent
        ));
    }
    Ok(())
}

// ---- rates: packets 1,000/s and 100,000/s, bytes 100 Mbit/s; offered 0.9×, 2×, 10× ----

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Unit {
    Packets,
    Bytes,
}

/// Frame lengths sent under each unit: a bytes rule gets a mix, so the cost per frame
/// varies.
fn frame_lens(unit: Unit) -> &'static [usize] {
    match unit {
        Unit::Packets => &[64],
        Unit::Bytes => &[200, 1400, 600, 1000],
    }
}

/// One rule metered in `unit` at `rate`, offered `factor` × the rate for [`SEND_FOR`]:
/// passed within 1 % of min(offered at XDP, rate × T + burst); below the rate, nothing
/// dropped at all; the receiver behind XDP saw exactly what the counters say passed.
fn rate_case(mode: XdpMode, unit: Unit, rate: u64, factor: f64) -> (Checks, Premise) {
    let lens = frame_lens(unit);
    let (unit_name, units_per_frame, max_units) = match unit {
        Unit::Packets => ("packets", 1.0, 1),
        Unit::Bytes => (
            "bytes",
            lens.iter().sum::<usize>() as f64 / lens.len() as f64,
            *lens.iter().max().unwrap() as u64,
        ),
    };
    let units_of = |entry: usize| match unit {
        Unit::Packets => 1,
        Unit::Bytes => lens[entry] as u64,
    };
    let fps = factor * rate as f64 / units_per_frame;
    let senders = if fps > ONE_SENDER_MAX { 2 } else { 1 };
    let burst = jitter_burst(rate, max_units, senders as u64);
    let config = format!(
        "[[rules]]\nname = \"r\"\ndst = \"198.18.0.2/32\"\nproto = \"udp\"\n\
         unit = \"{unit_name}\"\nrate = {rate}\nburst = {burst}\n"
    );
    let rig = Limited::new(2, mode, &config, None).expect("setting up");
    let frames: Vec<Vec<u8>> = lens.iter().map(|&l| udp_to_host(&rig.pair, 9, l)).collect();
    let run = send(&rig, plans(&frames, Some(fps), senders, TIMED));
    let t = run.t;
    let c = rig.counters("r").unwrap();
    let rx = rig.rx.totals().unwrap();
    let (passed, dropped) = match unit {
        Unit::Packets => (c.passed_packets, c.dropped_packets),
        Unit::Bytes => (c.passed_bytes, c.dropped_bytes),
    };
    let offered = passed + dropped;
    let bound = rate as f64 * t + burst as f64;
    let formula = (offered as f64).min(bound);
    let mut bucket = ModelBucket::new(rate, burst);
    let (mut model, mut model_offered) = (0u64, 0u64);
    for_each_frame(&run.reports, |at, _, entry| {
        let cost = units_of(entry);
        model_offered += cost;
        if bucket.offer(at, cost as f64) {
            model += cost;
        }
    });
    let offered_rate = offered as f64 / t;
    let label = format!("[{}] {unit_name} {rate}/s ×{factor}", mode_name(mode));
    eprintln!(
        "{label}: offered {offered_rate:.0}/s at XDP ({:.2}× rate, {senders} sender(s)), \
         T {t:.3} s, burst {burst}, expected min(offered, rate × T + burst) = {formula:.0} \
         (model {model}), passed {passed}, error {:+.3} %, dropped {dropped}",
        offered_rate / rate as f64,
        pct(rel(passed as f64, formula)),
    );

    let premise = all_seen(c.passed_packets + c.dropped_packets, &run)
        .and_then(|()| {
            if factor < 1.0 && model != model_offered {
                Err(format!(
                    "the model drops {} {unit_name}: a sender stall (longest gap {:?}) \
                     ended in a catch-up burst larger than the bucket",
                    model_offered - model,
                    run.longest_gap()
                ))
            } else {
                Ok(())
            }
        })
        .and_then(|()| steady(model as f64, formula, &run))
        .and_then(|()| {
            // Over the rate, the offer must be clearly over it: at least half-way from
            // the rate to the nominal factor, and at most 4× (three frames of four
            // refused): two senders planning 1 M frames/s offered 4.5–5.2× with CI's
            // emulated guest beside them, even at a lower priority, and the checks below
            // are as strict at 4× as at 10×.
            let floor = (1.0 + (factor - 1.0) / 2.0).min(4.0);
            if factor > 1.0 && offered_rate < floor * rate as f64 {
                Err(format!(
                    "offered only {:.2}× the rate (want ≥ {floor:.1}×)",
                    offered_rate / rate as f64
                ))
            } else {
                Ok(())
            }
        });

    let mut checks = Checks::new();
    checks.check(t >= 3.0, || format!("{label}: sent for only {t:.3} s"));
    if factor < 1.0 {
        checks.check(offered_rate <= rate as f64, || {
            format!("{label}: offered {offered_rate:.0}/s is not below the rate")
        });
        checks.check(dropped == 0, || {
            format!("{label}: {dropped} {unit_name} dropped although offered below the rate")
        });
    }
    checks.check(rel(passed as f64, formula).abs() < 0.01, || {
        format!(
            "{label}: passed {passed} vs min(offered, rate × T + burst) = {formula:.0}: \
             {:+.3} %",
            pct(rel(passed as f64, formula))
        )
    });
    checks.check(rel(passed as f64, model as f64).abs() < 0.01, || {
        format!(
            "{label}: passed {passed} vs the model's {model}: {:+.3} %",
            pct(rel(passed as f64, model as f64))
        )
    });
    let rx_bytes = rig.rx_bytes_for(c.passed_bytes, c.passed_packets, ETH_HLEN as u64);
    checks.check(
        rx.packets == c.passed_packets && rx.bytes == rx_bytes,
        || {
            format!(
                "{label}: receiver saw {} frames / {} bytes, counters say {} / {} (TC sees \
             {rx_bytes})",
                rx.packets, rx.bytes, c.passed_packets, c.passed_bytes
            )
        },
    );
    (checks, premise)
}

fn rate_matrix(mode: XdpMode, unit: Unit, rate: u64) {
    for factor in [0.9, 2.0, 10.0] {
        let label = format!("[{}] {unit:?} {rate}/s ×{factor}", mode_name(mode));
        with_retries(&label, || rate_case(mode, unit, rate, factor));
    }
}

limiter_tests::test_rows! {
    native_packets_1k => rate_matrix(XdpMode::Native, Unit::Packets, 1_000);
    native_packets_100k => rate_matrix(XdpMode::Native, Unit::Packets, 100_000);
    /// 100 Mbit/s = 12.5 MB/s of frame bytes (L2 header included, as XDP sees them).
    native_bytes_100mbit => rate_matrix(XdpMode::Native, Unit::Bytes, 100_000_000 / 8);
    generic_packets_1k => rate_matrix(XdpMode::Generic, Unit::Packets, 1_000);
    generic_packets_100k => rate_matrix(XdpMode::Generic, Unit::Packets, 100_000);
    generic_bytes_100mbit => rate_matrix(XdpMode::Generic, Unit::Bytes, 100_000_000 / 8);
    /// The TC build at TC ingress meters frames that arrive as socket buffers.
    tc_packets_100k => rate_matrix(XdpMode::Tc, Unit::Packets, 100_000);
    /// At TC ingress a frame's length includes its Ethernet header, as at XDP.
    tc_bytes_100mbit => rate_matrix(XdpMode::Tc, Unit::Bytes, 100_000_000 / 8);
}

// ---- one key from two CPUs at once ---------------------------------------------------

/// Two unpaced senders pinned to CPUs 0 and 1 on a 2-queue pair, so XDP runs on both CPUs
/// at once and both update the same aggregate bucket: passed ≤ 1.01 × (rate × T + burst)
/// and ≥ 0.99 × (the CAS keeps them from over-admitting), and both CPUs' counters moved.
fn two_cpus(mode: XdpMode, rate: u64) -> (Checks, Premise) {
    let burst = jitter_burst(rate, 1, 2);
    let config = format!(
        "[[rules]]\nname = \"r\"\ndst = \"198.18.0.2/32\"\nproto = \"udp\"\n\
         rate = {rate}\nburst = {burst}\n"
    );
    let rig = Limited::new(2, mode, &config, None).expect("setting up");
    let frames = vec![udp_to_host(&rig.pair, 9, 64)];
    let run = send(&rig, plans(&frames, None, 2, TIMED));
    let t = run.t;
    let per_cpu = rig
        .maps
        .rule_counters_per_cpu(rig.slot("r").unwrap())
        .unwrap();
    let c = rig.counters("r").unwrap();
    let g = rig.maps.global_counters().unwrap();
    let rx = rig.rx.totals().unwrap();
    let offered = c.passed_packets + c.dropped_packets;
    let bound = rate as f64 * t + burst as f64;
    let formula = (offered as f64).min(bound);
    let mut bucket = ModelBucket::new(rate, burst);
    let mut model = 0u64;
    for_each_frame(&run.reports, |at, _, _| {
        model += u64::from(bucket.offer(at, 1.0))
    });
    let ratio = c.passed_packets as f64 / bound;
    let label = format!("[{}] two CPUs, {rate}/s", mode_name(mode));
    let cpu_line: Vec<String> = per_cpu
        .iter()
        .enumerate()
        .map(|(i, c)| format!("cpu{i} {}+{}", c.passed_packets, c.dropped_packets))
        .collect();
    eprintln!(
        "{label}: offered {:.0}/s at XDP ({:.0} + {:.0}/s sent), T {t:.3} s, burst {burst}, \
         expected rate × T + burst = {bound:.0} (model {model}), passed {}, error {:+.3} %, \
         dropped {}, contended {}, per CPU passed+dropped: {}",
        offered as f64 / t,
        run.reports[0].report.frames_per_second(),
        run.reports[1].report.frames_per_second(),
        c.passed_packets,
        pct(ratio - 1.0),
        c.dropped_packets,
        g.contended,
        cpu_line.join(", ")
    );
    // Both senders sent at the same time, so the CPUs really competed.
    let (a, b) = (&run.reports[0], &run.reports[1]);
    let overlap = a
        .finished
        .min(b.finished)
        .saturating_duration_since(a.started.max(b.started));
    let premise = all_seen(offered, &run)
        .and_then(|()| steady(model as f64, formula, &run))
        .and_then(|()| {
            if (offered as f64) < 1.5 * bound {
                Err(format!("offered only {:.0}/s", offered as f64 / t))
            } else if overlap.as_secs_f64() < 0.9 * t {
                Err(format!(
                    "the senders overlapped only {overlap:?} of {t:.3} s"
                ))
            } else {
                Ok(())
            }
        });
    let mut checks = Checks::new();
    // XDP ran on both CPUs, each admitting a real share of the frames.
    for cpu in 0..2 {
        let p = per_cpu.get(cpu).map_or(0, |c| c.passed_packets);
        checks.check(p as f64 >= 0.1 * c.passed_packets as f64, || {
            format!(
                "{label}: CPU {cpu} passed only {p} of {}: XDP did not run on both CPUs",
                c.passed_packets
            )
        });
    }
    checks.check((0.99..=1.01).contains(&ratio), || {
        format!(
            "{label}: passed {} vs rate × T + burst = {bound:.0} ({:+.3} %)",
            c.passed_packets,
            pct(ratio - 1.0)
        )
    });
    checks.check(
        rel(c.passed_packets as f64, model as f64).abs() < 0.01,
        || {
            format!(
                "{label}: passed {} vs the model's {model}",
                c.passed_packets
            )
        },
    );
    checks.check(rx.packets == c.passed_packets, || {
        format!(
            "{label}: receiver saw {}, passed counter {}",
            rx.packets, c.passed_packets
        )
    });
    (checks, premise)
}

limiter_tests::test_rows! {
    /// Admits 300k/s: much CAS traffic on the one bucket.
    native_two_cpus_one_key =>
        with_retries("[native] two CPUs", || two_cpus(XdpMode::Native, 300_000));
    /// Generic mode costs an skb copy per frame here, so its two senders offer only
    /// ~0.4-0.6 M/s: the rule admits 150k/s.
    generic_two_cpus_one_key =>
        with_retries("[generic] two CPUs", || two_cpus(XdpMode::Generic, 150_000));
    tc_two_cpus_one_key => with_retries("[tc] two CPUs", || two_cpus(XdpMode::Tc, 300_000));
}

// ---- 1,000 sources under a per-source limit -------------------------------------------

/// 1,000 sources under a per-source limit (no aggregate): half offered 0.5× their rate,
/// half 5×. Every source is limited on its own: none passes more than rate × T + burst,
/// each heavy one passes what the model of its own arrivals admits (±1 frame, 1 %), all
/// heavy ones together within 1 % of the formula over each one's own span (its first
/// frame to its last), and the light ones lose nothing.
fn per_source(mode: XdpMode) -> (Checks, Premise) {
    const SOURCES: u32 = 1000;
    const RATE: u64 = 50;
    // 200 ms of the rate: a light source sends one frame every 40 ms, evenly spread, so
    // a pacing stall of d seconds lumps 25 × d of its frames together; 10 covers 0.4 s.
    const BURST: u64 = 10;
    const ROUNDS: u32 = 10; // heavy : light = 5 : 0.5 = 10 : 1
    let base = Ipv4Addr::new(198, 18, 16, 0);
    // The per-source sketch sized as the README says for 500 sources held at their
    // limit: a light source is limited only if both its cells hold a heavy one,
    // (1 - e^(-500/2^18))^2 ≈ 4e-6 per source; at 4096 cells a row that is 1.3 %, and
    // about 8 of the 500 light sources lost nearly everything.
    let config = format!(
        "max_sources = 262144\n[[rules]]\nname = \"r\"\ndst = \"198.18.0.2/32\"\n\
         proto = \"udp\"\n[rules.per_source]\nrate = {RATE}\nburst = {BURST}\n"
    );
    let rig = Limited::new(1, mode, &config, None).expect("setting up");
    let template = udp_to_host(&rig.pair, 9, 64);
    let light = |i: u32| i < SOURCES / 2;
    // The list: ROUNDS rounds; each has every heavy source once and a tenth of the light
    // ones, one light frame after every ROUNDS heavy ones, so each source's frames are
    // evenly spaced in time.
    let mut list: Vec<u32> = Vec::new();
    let per_round = SOURCES / 2 / ROUNDS;
    for round in 0..ROUNDS {
        for h in 0..SOURCES / 2 {
            list.push(SOURCES / 2 + h);
            if h % ROUNDS == ROUNDS - 1 {
                list.push(round * per_round + h / ROUNDS);
            }
        }
    }
    let frames: Vec<Vec<u8>> = list
        .iter()
        .map(|&i| {
            let mut f = template.clone();
            frame::with_ipv4_src(&mut f, ipv4(base, i)).unwrap();
            f
        })
        .collect();
    let fps = f64::from(SOURCES / 2) * (0.5 + 5.0) * RATE as f64;
    let counter = SourceCount::start(&rig).unwrap();
    let run = send(&rig, plans(&frames, Some(fps), 1, TIMED));
    let t = run.t;
    let c = rig.counters("r").unwrap();
    let rx_by_src = counter.finish(&rig).unwrap();
    let rx_of = |i: u32| rx_by_src.get(&ipv4(base, i)).copied().unwrap_or(0);
    let mut sent_by: HashMap<u32, u64> = HashMap::new();
    let mut model_by: HashMap<u32, u64> = HashMap::new();
    let mut buckets: HashMap<u32, ModelBucket> = HashMap::new();
    let mut span_by: HashMap<u32, (Instant, Instant)> = HashMap::new();
    for_each_frame(&run.reports, |at, _, entry| {
        let i = list[entry];
        *sent_by.entry(i).or_default() += 1;
        span_by.entry(i).or_insert((at, at)).1 = at;
        let admitted = buckets
            .entry(i)
            .or_insert_with(|| ModelBucket::new(RATE, BURST))
            .offer(at, 1.0);
        *model_by.entry(i).or_default() += u64::from(admitted);
    });
    let bound = RATE as f64 * t + BURST as f64;
    let label = format!("[{}] {SOURCES} sources at {RATE}/s each", mode_name(mode));
    // The sketch's false limit, which the README prices: a source none of whose cells is
    // its own shares every bucket it is metered by with other sources (at 2^18 cells a
    // row, ≈ 1.5e-5 a source; a heavy source passed 89 of its model's 169 in a CI run).
    // Such a source is held to the rate's bound, not to its own model: with one cell its
    // own, that cell is the least advanced and decides, as its own bucket would. Its
    // cells are the program's, from the seed in the pinned SKETCH_META.
    let slot = rig.slot("r").unwrap();
    let rule = rig.maps.live_rules().unwrap()[&slot];
    let cells_of = |i: u32| -> Vec<u32> {
        let mut src = [0u8; 16];
        src[..4].copy_from_slice(&ipv4(base, i).octets());
        let key = SourceKey::masked(slot, 4, &src, rule.source_prefix_v4, rule.source_prefix_v6);
        let cells = rig.maps.source_cells(&key, &rule).unwrap();
        cells
            .expect("a per-source sketch")
            .iter()
            .map(|c| c.0)
            .collect()
    };
    let cells: Vec<Vec<u32>> = (0..SOURCES).map(cells_of).collect();
    let mut sources_in: HashMap<u32, u32> = HashMap::new();
    for c in cells.iter().flatten() {
        *sources_in.entry(*c).or_default() += 1;
    }
    let shares_every_cell = |i: u32| cells[i as usize].iter().all(|c| sources_in[c] > 1);
    let collided: Vec<Ipv4Addr> = (0..SOURCES)
        .filter(|&i| shares_every_cell(i))
        .map(|i| ipv4(base, i))
        .collect();
    let mut checks = Checks::new();
    let (mut heavy_passed, mut heavy_formula, mut heavy_model, mut heavy_lost) =
        (0u64, 0f64, 0u64, 0u64);
    let (mut light_sent, mut light_passed, mut light_model_lost) = (0u64, 0u64, 0u64);
    let (mut max_heavy, mut min_heavy) = (0u64, u64::MAX);
    for i in 0..SOURCES {
        let (s, p, m) = (sent_by[&i], rx_of(i), model_by[&i]);
        checks.check(p as f64 <= bound, || {
            format!(
                "{label}: source {} passed {p} > rate × T + burst = {bound:.1}",
                ipv4(base, i)
            )
        });
        if light(i) {
            light_sent += s;
            light_passed += p;
            light_model_lost += s - m;
            checks.check(p == s || shares_every_cell(i), || {
                format!(
                    "{label}: light source {} sent {s}, passed {p}",
                    ipv4(base, i)
                )
            });
        } else {
            // The formula over the source's own span, its first frame to its last, in
            // whole frames: with ~170 frames a source, the fraction alone is 0.3 %.
            let (first, last) = span_by[&i];
            let own =
                (RATE as f64 * last.duration_since(first).as_secs_f64() + BURST as f64).floor();
            heavy_passed += p;
            heavy_formula += (s as f64).min(own);
            heavy_model += m;
            heavy_lost += s - p.min(s);
            max_heavy = max_heavy.max(p);
            min_heavy = min_heavy.min(p);
            let own_model = p.abs_diff(m) as f64 <= 1.0 + 0.01 * m as f64;
            checks.check(own_model || shares_every_cell(i), || {
                format!(
                    "{label}: heavy source {} passed {p} of {s}, the model of its arrivals \
                     {m}",
                    ipv4(base, i)
                )
            });
        }
    }
    let error = rel(heavy_passed as f64, heavy_formula);
    eprintln!(
        "[{}] {SOURCES} sources, per-source {RATE}/s burst {BURST}: offered {:.0}/s \
         ({} light at {:.0}/s, {} heavy at {:.0}/s), T {t:.3} s; light: sent {light_sent}, \
         passed {light_passed}; heavy: expected {heavy_formula:.0} (model {heavy_model}; \
         each ≤ {bound:.1}), passed {heavy_passed} (each {min_heavy}..={max_heavy}), \
         error {:+.3} %; dropped {}; sources with no cell of their own: {collided:?}",
        mode_name(mode),
        run.sent as f64 / t,
        SOURCES / 2,
        0.5 * RATE as f64,
        SOURCES / 2,
        5.0 * RATE as f64,
        pct(error),
        c.dropped_packets
    );
    let premise = all_seen(c.passed_packets + c.dropped_packets, &run)
        .and_then(|()| {
            if light_model_lost > 0 {
                Err(format!(
                    "the model drops {light_model_lost} light frames (longest gap {:?})",
                    run.longest_gap()
                ))
            } else {
                Ok(())
            }
        })
        .and_then(|()| steady(heavy_model as f64, heavy_formula, &run));
    checks.check(error.abs() < 0.01, || {
        format!(
            "{label}: heavy sources passed {heavy_passed}, expected {heavy_formula:.0} \
             ({:+.3} %)",
            pct(error)
        )
    });
    // Light sources lose frames only with no cell of their own (checked per source above).
    let light_lost = light_sent - light_passed.min(light_sent);
    checks.check(c.dropped_packets == heavy_lost + light_lost, || {
        format!(
            "{label}: dropped counter {} but heavy sources lost {heavy_lost} and light ones \
             {light_lost}",
            c.dropped_packets
        )
    });
    checks.check(light_passed + heavy_passed == c.passed_packets, || {
        format!(
            "{label}: receiver {} vs passed counter {}",
            light_passed + heavy_passed,
            c.passed_packets
        )
    });
    (checks, premise)
}

limiter_tests::test_rows! {
    native_per_source_1000_sources =>
        with_retries("[native] per source", || per_source(XdpMode::Native));
    generic_per_source_1000_sources =>
        with_retries("[generic] per source", || per_source(XdpMode::Generic));
    tc_per_source_1000_sources => with_retries("[tc] per source", || per_source(XdpMode::Tc));
}

// ---- syn unit --------------------------------------------------------------------------

/// A SYN flood at 10× a connection-rate limit, interleaved with established-flow packets
/// of the same rule (ACK, PSH|ACK, FIN|ACK, RST, RST|ACK, SYN|ACK: none is a SYN without
/// ACK): SYNs pass within 1 % of rate × T + burst, every other packet passes.
fn syn_flood(mode: XdpMode) -> (Checks, Premise) {
    // Passed frames stay under the generic-mode receiver's ~100k/s: 5k SYNs + 25k others.
    const RATE: u64 = 5_000;
    const SYN_SOURCES: u32 = 256;
    const EST_SOURCES: u32 = 128;
    const EST_FLAGS: [u8; 6] = [
        TCP_ACK,
        TCP_PSH | TCP_ACK,
        TCP_FIN | TCP_ACK,
        TCP_RST,
        TCP_RST | TCP_ACK,
        TCP_SYN | TCP_ACK,
    ];
    let burst = jitter_burst(RATE, 1, 1);
    let syn_base = Ipv4Addr::new(198, 18, 32, 0);
    let est_base = Ipv4Addr::new(198, 18, 33, 0);
    let config = format!(
        "[[rules]]\nname = \"conn\"\ndst = \"198.18.0.2/32\"\ndst_port = 80\n\
         proto = \"tcp\"\nunit = \"syn\"\nrate = {RATE}\nburst = {burst}\n"
    );
    let rig = Limited::new(1, mode, &config, None).expect("setting up");
    let (peer_mac, host_mac) = (rig.pair.peer_mac, rig.pair.host_mac);
    let tcp = |src: Ipv4Addr, sport: u16, flags: u8| {
        FrameBuilder::ipv4(src, HOST_V4)
            .macs(peer_mac, host_mac)
            .tcp(sport, 80, flags)
            .frame_len(64)
            .build()
    };
    // Blocks of two SYNs (plain, and with ECE|CWR as ECN-capable clients send them) and
    // one established-flow packet: SYNs are 2/3 of the offer.
    let mut frames = Vec::new();
    let mut is_syn = Vec::new();
    for k in 0..EST_SOURCES {
        for j in 0..2 {
            let i = 2 * k + j;
            let flags = if j == 0 {
                TCP_SYN
            } else {
                TCP_SYN | TCP_ECE | TCP_CWR
            };
            frames.push(tcp(ipv4(syn_base, i), 1024 + i as u16, flags));
            is_syn.push(true);
        }
        frames.push(tcp(
            ipv4(est_base, k),
            40000 + k as u16,
            EST_FLAGS[k as usize % EST_FLAGS.len()],
        ));
        is_syn.push(false);
    }
    assert_eq!(frames.len() as u32, SYN_SOURCES + EST_SOURCES);
    let fps = 10.0 * RATE as f64 * 1.5;
    let counter = SourceCount::start(&rig).unwrap();
    let run = send(&rig, plans(&frames, Some(fps), 1, TIMED));
    let t = run.t;
    let c = rig.counters("conn").unwrap();
    let rx_by_src = counter.finish(&rig).unwrap();
    let (mut syn_sent, mut est_sent, mut model) = (0u64, 0u64, 0u64);
    let mut bucket = ModelBucket::new(RATE, burst);
    for_each_frame(&run.reports, |at, _, entry| {
        if is_syn[entry] {
            syn_sent += 1;
            model += u64::from(bucket.offer(at, 1.0));
        } else {
            est_sent += 1;
        }
    });
    let rx_sum = |base: Ipv4Addr, n: u32| -> u64 {
        (0..n)
            .map(|i| rx_by_src.get(&ipv4(base, i)).copied().unwrap_or(0))
            .sum()
    };
    let syn_passed = rx_sum(syn_base, SYN_SOURCES);
    let est_passed = rx_sum(est_base, EST_SOURCES);
    let syn_offered = syn_passed + c.dropped_packets;
    let bound = RATE as f64 * t + burst as f64;
    let formula = (syn_offered as f64).min(bound);
    let error = rel(syn_passed as f64, formula);
    let label = format!("[{}] syn {RATE}/s", mode_name(mode));
    eprintln!(
        "{label}: SYNs offered {:.0}/s at XDP, T {t:.3} s, burst {burst}, expected \
         {formula:.0} (model {model}), passed {syn_passed}, error {:+.3} %, dropped {}; \
         established: sent {est_sent} ({:.0}/s), passed {est_passed}",
        syn_offered as f64 / t,
        pct(error),
        c.dropped_packets,
        est_sent as f64 / t
    );
    let premise = all_seen(c.passed_packets + c.dropped_packets, &run)
        .and_then(|()| steady(model as f64, formula, &run))
        .and_then(|()| {
            if (syn_offered as f64) < 5.0 * RATE as f64 * t {
                Err(format!("SYNs offered only {:.0}/s", syn_offered as f64 / t))
            } else {
                Ok(())
            }
        });
    let mut checks = Checks::new();
    checks.check(syn_offered == syn_sent, || {
        format!("{label}: SYNs passed + dropped = {syn_offered}, SYNs sent {syn_sent}")
    });
    checks.check(est_passed == est_sent, || {
        format!("{label}: established-flow packets: sent {est_sent}, passed {est_passed}")
    });
    checks.check(c.passed_packets == syn_passed + est_passed, || {
        format!(
            "{label}: passed counter {} vs receiver {syn_passed} SYN + {est_passed} other",
            c.passed_packets
        )
    });
    checks.check(error.abs() < 0.01, || {
        format!(
            "{label}: SYNs passed {syn_passed} vs min(offered, rate × T + burst) = \
             {formula:.0} ({:+.3} %)",
            pct(error)
        )
    });
    checks.check(rel(syn_passed as f64, model as f64).abs() < 0.01, || {
        format!("{label}: SYNs passed {syn_passed} vs the model's {model}")
    });
    (checks, premise)
}

limiter_tests::test_rows! {
    native_syn_flood => with_retries("[native] syn", || syn_flood(XdpMode::Native));
    generic_syn_flood => with_retries("[generic] syn", || syn_flood(XdpMode::Generic));
}

// ---- shadow mode -------------------------------------------------------------------------

struct ShadowRun {
    passed: u64,
    dropped: u64,
    would_drop: u64,
    rx: u64,
    run: Run,
    model_refused: u64,
}

/// The same traffic (a fixed count, paced at 2× the rate) against the rule in `rule_mode`.
fn shadow_run(mode: XdpMode, rule_mode: &str, rate: u64, burst: u64, count: u64) -> ShadowRun {
    let config = format!(
        "[[rules]]\nname = \"r\"\ndst = \"198.18.0.2/32\"\nproto = \"udp\"\n\
         rate = {rate}\nburst = {burst}\nmode = \"{rule_mode}\"\n"
    );
    let rig = Limited::new(1, mode, &config, None).expect("setting up");
    let frames = vec![udp_to_host(&rig.pair, 9, 64)];
    let limits = PlanLimits {
        count,
        duration: Duration::from_secs(20),
    };
    let fps = count as f64 / SEND_FOR.as_secs_f64();
    let run = send(&rig, plans(&frames, Some(fps), 1, limits));
    let c = rig.counters("r").unwrap();
    let mut bucket = ModelBucket::new(rate, burst);
    let mut model_refused = 0u64;
    for_each_frame(&run.reports, |at, _, _| {
        model_refused += u64::from(!bucket.offer(at, 1.0));
    });
    ShadowRun {
        passed: c.passed_packets,
        dropped: c.dropped_packets,
        would_drop: c.would_drop_packets,
        rx: rig.rx.totals().unwrap().packets,
        run,
        model_refused,
    }
}

/// Shadow mode passes everything (the receiver sees every frame sent) and counts as
/// would-drop what enforce mode drops for the same traffic, within 1 %.
fn shadow(mode: XdpMode) -> (Checks, Premise) {
    const RATE: u64 = 20_000;
    let burst = jitter_burst(RATE, 1, 1);
    let count = (2.0 * RATE as f64 * SEND_FOR.as_secs_f64()) as u64;
    let enforce = shadow_run(mode, "enforce", RATE, burst, count);
    let shadow = shadow_run(mode, "shadow", RATE, burst, count);
    let label = format!("[{}] shadow {RATE}/s", mode_name(mode));
    let mut checks = Checks::new();
    let mut premise = Ok(());
    for (name, r, refused) in [
        ("enforce", &enforce, enforce.dropped),
        ("shadow", &shadow, shadow.would_drop),
    ] {
        let offered = r.passed + r.dropped;
        let t = r.run.t;
        let formula = offered as f64 - (RATE as f64 * t + burst as f64);
        let error = rel(refused as f64, formula);
        eprintln!(
            "{label} ({name}): offered {:.0}/s, T {t:.3} s, burst {burst}, refused (dropped \
             or would-drop) {refused}, expected offered - (rate × T + burst) = {formula:.0} \
             (model {}), error {:+.3} %, passed {}, receiver {}",
            offered as f64 / t,
            r.model_refused,
            pct(error),
            r.passed,
            r.rx
        );
        premise = premise
            .and_then(|()| all_seen(offered, &r.run))
            .and_then(|()| steady(r.model_refused as f64, formula, &r.run));
        checks.check(r.run.sent == count, || {
            format!("{label} ({name}): sent {} of {count}", r.run.sent)
        });
        checks.check(error.abs() < 0.01, || {
            format!("{label} ({name}): refused {refused}, expected {formula:.0}")
        });
        checks.check(r.rx == r.passed, || {
            format!("{label} ({name}): receiver {} vs passed {}", r.rx, r.passed)
        });
    }
    checks.check(shadow.dropped == 0 && shadow.rx == shadow.run.sent, || {
        format!(
            "{label}: shadow dropped {}; receiver saw {} of {}",
            shadow.dropped, shadow.rx, shadow.run.sent
        )
    });
    checks.check(enforce.would_drop == 0, || {
        format!("{label}: enforce counted {} would-drop", enforce.would_drop)
    });
    let diff = rel(shadow.would_drop as f64, enforce.dropped as f64);
    eprintln!(
        "{label}: would-drop {} vs enforce dropped {}: {:+.3} %",
        shadow.would_drop,
        enforce.dropped,
        pct(diff)
    );
    checks.check(diff.abs() < 0.01, || {
        format!(
            "{label}: would-drop {} vs enforce dropped {} ({:+.3} %)",
            shadow.would_drop,
            enforce.dropped,
            pct(diff)
        )
    });
    (checks, premise)
}

limiter_tests::test_rows! {
    native_shadow_counts_what_enforce_drops =>
        with_retries("[native] shadow", || shadow(XdpMode::Native));
    generic_shadow_counts_what_enforce_drops =>
        with_retries("[generic] shadow", || shadow(XdpMode::Generic));
}

// ---- malformed frames through the wire -----------------------------------------------

/// Malformed frames of several kinds, sent among well-formed frames of rules that drop
/// almost everything (1/s, burst 1, so a malformed frame misread as a matching packet
/// would most likely be dropped): every malformed frame (one no stack would deliver)
/// passes and reaches the receiver,
/// `malformed` counts exactly them, and the well-formed ones are metered as usual.
fn malformed(mode: XdpMode) {
    const ROUNDS: u64 = 2000;
    let config = "[[rules]]\nname = \"v4\"\ndst = \"198.18.0.0/15\"\nrate = 1\nburst = 1\n\
                  [[rules]]\nname = \"v6\"\ndst = \"2001:db8::/32\"\nrate = 1\nburst = 1\n";
    let rig = Limited::new(1, mode, config, None).expect("setting up");
    let (peer_mac, host_mac) = (rig.pair.peer_mac, rig.pair.host_mac);
    let v4 = || FrameBuilder::ipv4(PEER_V4, HOST_V4).macs(peer_mac, host_mac);
    let v6 = || {
        FrameBuilder::ipv6(
            "2001:db8::1".parse().unwrap(),
            "2001:db8::2".parse().unwrap(),
        )
        .macs(peer_mac, host_mac)
    };
    let broken = |mut f: Vec<u8>, op: &dyn Fn(&mut Vec<u8>)| {
        op(&mut f);
        f
    };
    let mut six_exts = v6();
    for _ in 0..6 {
        six_exts = six_exts.ipv6_ext(Ipv6Ext::DestOpts);
    }
    // (kind, frame, malformed?)
    let cases: Vec<(&str, Vec<u8>, bool)> = vec![
        (
            "IPv4 IHL 4",
            broken(v4().tcp(40000, 80, TCP_ACK).build(), &|f| {
                frame::set_ipv4_ihl(f, 4).unwrap()
            }),
            true,
        ),
        (
            "IPv4 IHL 0",
            broken(v4().udp(40000, 53).build(), &|f| {
                frame::set_ipv4_ihl(f, 0).unwrap()
            }),
            true,
        ),
        (
            "IPv4 total length 24 < IHL 7 header",
            broken(v4().ipv4_options(2).udp(40000, 53).build(), &|f| {
                frame::set_ipv4_total_len(f, 24).unwrap()
            }),
            true,
        ),
        (
            "IPv4 TCP header cut short",
            broken(v4().tcp(40000, 80, TCP_SYN).build(), &|f| {
                f.truncate(frame::l3_offset(f).unwrap() + 20 + 10)
            }),
            true,
        ),
        // A chain longer than the walk is not malformed: a stack delivers it, so its
        // rule refuses it (README, "What each kind of frame gets"); it counts among the
        // rule's frames. (Three VLAN tags, dropped without a rule, are in the verdict
        // tables and the evasion fuzz test.)
        (
            "IPv6 seven extension headers (refused by its rule)",
            six_exts
                .clone()
                .ipv6_ext(Ipv6Ext::DestOpts)
                .udp(40000, 53)
                .build(),
            false,
        ),
        ("IPv4 UDP (control)", v4().udp(40000, 53).build(), false),
        (
            "IPv6 six extension headers (control)",
            six_exts.udp(40000, 53).build(),
            false,
        ),
    ];
    let frames: Vec<Vec<u8>> = cases.iter().map(|(_, f, _)| f.clone()).collect();
    let count = ROUNDS * frames.len() as u64;
    let limits = PlanLimits {
        count,
        duration: Duration::from_secs(20),
    };
    let run = send(&rig, plans(&frames, Some(40_000.0), 1, limits));
    let sent = run.sent;
    let c4 = rig.counters("v4").unwrap();
    let c6 = rig.counters("v6").unwrap();
    let g = rig.maps.global_counters().unwrap();
    let rx = rig.rx.totals().unwrap();
    let sent_where = |malformed: bool, v6: Option<bool>| -> u64 {
        cases
            .iter()
            .enumerate()
            .filter(|(_, (name, _, m))| {
                *m == malformed && v6.is_none_or(|v6| name.starts_with("IPv6") == v6)
            })
            .map(|(pos, _)| sent_of_entry(sent, frames.len(), pos))
            .sum()
    };
    let malformed_sent = sent_where(true, None);
    let v4_sent = sent_where(false, Some(false));
    let v6_sent = sent_where(false, Some(true));
    let passed = c4.passed_packets + c6.passed_packets;
    let label = format!("[{}] malformed", mode_name(mode));
    eprintln!(
        "{label}: {} kinds, {sent} frames sent ({:.0}/s over {:.3} s): malformed sent \
         {malformed_sent}, counted {}; well-formed v4 {v4_sent} → passed {} dropped {}, v6 \
         {v6_sent} → passed {} dropped {}; receiver {} (expected {}); non_ip {}, unmatched {}",
        cases.iter().filter(|c| c.2).count(),
        sent as f64 / run.t,
        run.t,
        g.malformed,
        c4.passed_packets,
        c4.dropped_packets,
        c6.passed_packets,
        c6.dropped_packets,
        rx.packets,
        malformed_sent + passed,
        g.non_ip,
        g.unmatched,
    );
    let mut checks = Checks::new();
    checks.check(sent == count, || format!("{label}: sent {sent} of {count}"));
    checks.check(g.malformed == malformed_sent, || {
        format!(
            "{label}: malformed counter {} vs {malformed_sent} malformed frames sent",
            g.malformed
        )
    });
    checks.check(
        c4.passed_packets + c4.dropped_packets == v4_sent
            && c6.passed_packets + c6.dropped_packets == v6_sent,
        || format!("{label}: well-formed frames were not all metered by their rule"),
    );
    checks.check(c4.dropped_packets > 0 && c6.dropped_packets > 0, || {
        format!("{label}: the rules dropped nothing: they were not live")
    });
    // Everything not dropped by a rule reached the receiver: no malformed frame was
    // dropped or aborted.
    checks.check(rx.packets == malformed_sent + passed, || {
        format!(
            "{label}: receiver saw {}, expected {malformed_sent} malformed + {passed} passed",
            rx.packets
        )
    });
    checks.check(g.non_ip == 0 && g.unmatched == 0, || {
        format!(
            "{label}: non_ip {} unmatched {}: frames were misread",
            g.non_ip, g.unmatched
        )
    });
    checks.finish();
}

limiter_tests::test_rows! {
    native_malformed_frames_pass_and_are_counted => malformed(XdpMode::Native);
    generic_malformed_frames_pass_and_are_counted => malformed(XdpMode::Generic);
}
