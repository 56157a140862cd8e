//! Abuse: 10 × `max_sources` distinct spoofed sources sprayed at rules that have both an
//! aggregate and a per-source limit, with a well-behaved source (below its per-source
//! rate) and a known heavy source (over it) mixed in. Native mode; one program, its maps
//! pinned so the per-source sketch can be opened and measured from its pin.
//!
//! Phase A — churn with room: one sender (on CPU 0) sprays ~160k new sources/s through the
//! per-source sketch while the rule's aggregate has room to spare. Nothing may go wrong
//! for the known sources: the well-behaved one loses nothing, and the heavy one is held
//! to its own rate × T + burst: never above it (within 1 %), which shows churn bought it
//! nothing (the LRU of earlier versions could evict its bucket, which came back full),
//! and below it by no more than the spoofed load its cells share (collisions only ever
//! make a source stricter).
//!
//! Phase B — aggregate saturated: the senders spray as fast as they go at a rule whose
//! aggregate is far below that; once from one CPU, once from both CPUs at once. The aggregate stays exact (within 1 % of
//! rate × T + burst). The well-behaved source is *not* guaranteed its rate here, and
//! cannot be: the aggregate is the tenant's whole share, every frame of the rule
//! competes for it in arrival order, and a spoofed frame is indistinguishable from a
//! legitimate one, so reserving aggregate capacity for "good" sources would mean
//! trusting source addresses the attacker chooses. What it gets is its proportional
//! share: the same fraction of its frames passes as of everyone's (checked, to within
//! 5 standard deviations of a binomial draw).
//!
//! Throughout: the per-source sketch keeps its size (`max_entries`) and its memory does
//! not grow (`bpftool map show`); its busy cells are counted from the pinned map and
//! reported, and so are `insert_failures` (frames that found no sketch set up: 0).
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

use std::{
    collections::HashMap,
    net::Ipv4Addr,
    path::Path,
    time::{Duration, Instant},
};

use limiter_common::{
    abi::{map_name, Bucket},
    gcra, sketch,
};
use limiter_tests::{
    frame,
    scenario::{
        for_each_frame, udp_to_host, with_retries, Checks, Limited, ModelBucket, PinDir, Premise,
        Run,
    },
    tools,
    traffic::{SendPlan, BATCH},
};
use limiter_user::config::XdpMode;

/// Capacity of the per-source map: small, so 10× of it is a quick spray.
const MAX_SOURCES: u32 = 4096;
const SPOOFED: u32 = 10 * MAX_SOURCES;
/// Spoofed sources: 198.19.0.0 + i, i < 40,960 (inside 198.18.0.0/15).
const SPOOFED_BASE: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 0);
const GOOD: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 1);
const HEAVY: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 2);
/// Per-source limit of both rules.
const SRC_RATE: u64 = 2_000;
/// 100 ms of the per-source rate: the well-behaved source sends evenly at half its rate,
/// so a pacing stall of d seconds lumps 1,000 × d of its frames together.
const SRC_BURST: u64 = 200;
/// Phase A's aggregate: far above what is offered (it must never refuse anything).
const ROOMY_RATE: u64 = 1_000_000;
/// Phase B's aggregate.
const TIGHT_RATE: u64 = 100_000;
const SEND_FOR: Duration = Duration::from_millis(3200);
const SETTLE: Duration = Duration::from_millis(200);
const ATTEMPTS: u32 = 4;
const STEADY: f64 = 0.005;

fn config() -> String {
    let rule = |name: &str, port: u16, rate: u64| {
        format!(
            "[[rules]]\nname = \"{name}\"\ndst = \"198.18.0.2/32\"\ndst_port = {port}\n\
             proto = \"udp\"\nrate = {rate}\nburst = {}\n[rules.per_source]\n\
             rate = {SRC_RATE}\nburst = {SRC_BURST}\n",
            burst_of(rate)
        )
    };
    format!(
        "max_sources = {MAX_SOURCES}\n{}{}",
        rule("roomy", 1000, ROOMY_RATE),
        rule("tight", 2000, TIGHT_RATE)
    )
}

/// Aggregate bursts: 100 ms of the rate plus one sender batch, as in the accuracy tests.
fn burst_of(rate: u64) -> u64 {
    rate / 10 + BATCH as u64
}

fn spoofed(i: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(SPOOFED_BASE) + i)
}

fn pct(x: f64) -> f64 {
    x * 100.0
}

fn rel(got: f64, want: f64) -> f64 {
    (got - want) / want.max(1.0)
}

/// Who sent an entry of the frame list.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Who {
    Spoofed,
    Good,
    Heavy,
}

/// The frame list: blocks of `per_block` spoofed frames (consecutive sources, so the
/// whole list goes through all 40,960 once) with `good` and `heavy` frames of the known
/// sources spread evenly through each block.
fn frame_list(template: &[u8], per_block: u32, good: u32, heavy: u32) -> (Vec<Vec<u8>>, Vec<Who>) {
    let mut knowns: Vec<(Who, Ipv4Addr)> = Vec::new();
    knowns.extend(std::iter::repeat_n(
        (Who::Heavy, HEAVY),
        (heavy / 2) as usize,
    ));
    knowns.extend(std::iter::repeat_n((Who::Good, GOOD), good as usize));
    knowns.extend(std::iter::repeat_n(
        (Who::Heavy, HEAVY),
        (heavy - heavy / 2) as usize,
    ));
    let every = per_block / (knowns.len() as u32 + 1);
    let (mut frames, mut who) = (Vec::new(), Vec::new());
    for block in 0..SPOOFED / per_block {
        let mut k = 0;
        for j in 0..per_block {
            frames.push(with_src(template, spoofed(block * per_block + j)));
            who.push(Who::Spoofed);
            if (j + 1) % every == 0 && k < knowns.len() {
                frames.push(with_src(template, knowns[k].1));
                who.push(knowns[k].0);
                k += 1;
            }
        }
    }
    (frames, who)
}

fn with_src(template: &[u8], src: Ipv4Addr) -> Vec<u8> {
    let mut f = template.to_vec();
    frame::with_ipv4_src(&mut f, src).unwrap();
    f
}

/// `bytes_memlock` of a pinned map as `bpftool -j map show pinned` reports it (the
/// kernel's own accounting of the map's memory), and its `max_entries`.
fn map_memory(path: &Path) -> (u64, u64) {
    let map = tools::bpftool_map_show_pinned(path).unwrap();
    (map.bytes_memlock, map.max_entries)
}

/// Cells of the pinned per-source sketch holding state now.
fn busy_cells(path: &Path) -> u64 {
    let data = aya::maps::MapData::from_pin(path).expect("opening the pinned SRC_SKETCH");
    let map = aya::maps::Map::from_map_data(data).unwrap();
    let cells: aya::maps::Array<_, Bucket> =
        aya::maps::Array::try_from(map).expect("SRC_SKETCH as an array");
    let now = gcra::ticks_from_ns(limiter_fleet::clock::monotonic_ns());
    cells
        .iter()
        .filter(|c| !sketch::at_rest(c.as_ref().unwrap().tat, now))
        .count() as u64
}

/// How far below its own rate × T + burst a source at its limit may end up, relative:
/// its deciding cell also carries the spoofed frames hashed to it, about `spoofed_rate
/// / width` a second on average; three times that, plus the 1 % of the measurement.
fn collision_slack(spoofed_rate: f64) -> f64 {
    let width = f64::from(sketch::width_for(MAX_SOURCES));
    3.0 * spoofed_rate / width / SRC_RATE as f64 + 0.01
}

struct Phase {
    run: Run,
    who: Vec<Who>,
}

/// Phase A (see the top): churn with room on rule "roomy".
fn phase_a(rig: &Limited, srcs: &Path, checks: &mut Checks) -> Premise {
    // Per block: 160 spoofed, 1 good, 4 heavy; paced at 165k/s so the good source sends
    // 1,000/s (0.5× its rate), the heavy one 4,000/s (2×), the spray 160,000 new sources/s.
    let template = udp_to_host(&rig.pair, 1000, 64);
    let (frames, who) = frame_list(&template, 160, 1, 4);
    let fps = frames.len() as f64 / f64::from(SPOOFED / 160) * 1000.0;
    let run = Run::send(
        &rig.pair,
        vec![SendPlan {
            frames,
            rate: Some(fps.round() as u64),
            count: u64::MAX,
            duration: SEND_FOR,
            cpu: Some(0),
        }],
        SETTLE,
    )
    .expect("sending");
    let phase = Phase { run, who };
    let t = phase.run.t;
    let c = rig.counters("roomy").unwrap();
    let g = rig.maps.global_counters().unwrap();
    let rx = rig.rx.per_source().unwrap();
    let (mut sent, mut model) = (HashMap::<Who, u64>::new(), HashMap::<Who, u64>::new());
    let mut span: HashMap<Who, (Instant, Instant)> = HashMap::new();
    let mut known = HashMap::<Who, ModelBucket>::new();
    let mut aggregate = ModelBucket::new(ROOMY_RATE, burst_of(ROOMY_RATE));
    for_each_frame(&phase.run.reports, |at, _, entry| {
        let w = phase.who[entry];
        *sent.entry(w).or_default() += 1;
        span.entry(w).or_insert((at, at)).1 = at;
        // Spoofed sources never come back before they are evicted: each frame is a new
        // source with a full bucket. Known sources are metered by their own bucket, all
        // by the aggregate.
        let own = w == Who::Spoofed
            || known
                .entry(w)
                .or_insert_with(|| ModelBucket::new(SRC_RATE, SRC_BURST))
                .offer(at, 1.0);
        let admitted = own && aggregate.offer(at, 1.0);
        *model.entry(w).or_default() += u64::from(admitted);
    });
    let get = |m: &HashMap<Who, u64>, w| m.get(&w).copied().unwrap_or(0);
    let spoofed_seen = (0..SPOOFED)
        .filter(|&i| rx.contains_key(&spoofed(i)))
        .count();
    let spoofed_passed: u64 = (0..SPOOFED)
        .map(|i| rx.get(&spoofed(i)).copied().unwrap_or(0))
        .sum();
    let good_passed = rx.get(&GOOD).copied().unwrap_or(0);
    let heavy_passed = rx.get(&HEAVY).copied().unwrap_or(0);
    let (hf, hl) = span[&Who::Heavy];
    let heavy_formula = (SRC_RATE as f64 * hl.duration_since(hf).as_secs_f64() + SRC_BURST as f64)
        .floor()
        .min(get(&sent, Who::Heavy) as f64);
    let heavy_error = rel(heavy_passed as f64, heavy_formula);
    let busy = busy_cells(srcs);
    let slack = collision_slack(get(&sent, Who::Spoofed) as f64 / t);
    eprintln!(
        "[native] abuse A (churn, aggregate has room): offered {:.0}/s for {t:.3} s: \
         {SPOOFED} spoofed sources at {:.0}/s (seen passing: {spoofed_seen}, passed \
         {spoofed_passed} of {}); good at {:.0}/s: sent {}, passed {good_passed}; heavy \
         at {:.0}/s: expected {heavy_formula:.0} (model {}), passed {heavy_passed}, error \
         {:+.3} % (allowed +1 % to -{:.1} %); dropped {}; SRC_SKETCH busy cells \
         {busy}/{}; insert_failures {}, contended {}",
        phase.run.sent as f64 / t,
        get(&sent, Who::Spoofed) as f64 / t,
        get(&sent, Who::Spoofed),
        get(&sent, Who::Good) as f64 / t,
        get(&sent, Who::Good),
        get(&sent, Who::Heavy) as f64 / t,
        get(&model, Who::Heavy),
        pct(heavy_error),
        100.0 * slack,
        c.dropped_packets,
        sketch::cells_for(MAX_SOURCES),
        g.sketch_unseeded,
        g.contended,
    );
    let label = "[native] abuse A";
    checks.check(spoofed_seen == SPOOFED as usize, || {
        format!("{label}: only {spoofed_seen} of {SPOOFED} spoofed sources came through")
    });
    checks.check(spoofed_passed == get(&sent, Who::Spoofed), || {
        format!(
            "{label}: spoofed frames passed {spoofed_passed} of {}: the aggregate had room",
            get(&sent, Who::Spoofed)
        )
    });
    checks.check(good_passed == get(&sent, Who::Good), || {
        format!(
            "{label}: the well-behaved source sent {}, passed {good_passed}",
            get(&sent, Who::Good)
        )
    });
    checks.check(heavy_error < 0.01, || {
        format!(
            "{label}: the heavy source passed {heavy_passed}, its rate × T + burst is \
             {heavy_formula:.0} ({:+.3} %): the churn bought it frames",
            pct(heavy_error)
        )
    });
    checks.check(heavy_error > -slack, || {
        format!(
            "{label}: the heavy source passed {heavy_passed}, its rate × T + burst is \
             {heavy_formula:.0} ({:+.3} %): more than its cells' share of the spoofed \
             load ({:.1} %) held it back",
            pct(heavy_error),
            100.0 * slack
        )
    });
    checks.check(
        c.dropped_packets == get(&sent, Who::Heavy) - heavy_passed,
        || {
            format!(
                "{label}: dropped {}, but only the heavy source should lose frames ({})",
                c.dropped_packets,
                get(&sent, Who::Heavy) - heavy_passed
            )
        },
    );
    all_seen(c.passed_packets + c.dropped_packets, &phase.run)
        .and_then(|()| {
            let lost = get(&sent, Who::Good) - get(&model, Who::Good);
            if lost > 0 {
                return Err(format!(
                    "the model drops {lost} of the good source's frames (longest gap {:?})",
                    phase.run.longest_gap()
                ));
            }
            steady(get(&model, Who::Heavy) as f64, heavy_formula, &phase.run)
        })
        .and_then(|()| {
            let spray = get(&sent, Who::Spoofed) as f64 / t;
            if spray < 0.8 * 160_000.0 {
                return Err(format!("the spray reached only {spray:.0} sources/s"));
            }
            Ok(())
        })
}

/// Phase B (see the top): aggregate saturated on rule "tight", from the senders pinned
/// to `cpus` (with two, a multi-queue NIC under attack: XDP runs on both CPUs, both
/// insert into the LRU map and update the same aggregate bucket).
fn phase_b(rig: &Limited, srcs: &Path, checks: &mut Checks, cpus: &[usize]) -> Premise {
    // Per block: 1,280 spoofed, 1 good: at the ≤ 1.1 M/s two senders reach, the good
    // source sends under 900/s, less than half its per-source rate.
    let template = udp_to_host(&rig.pair, 2000, 64);
    let (frames, who) = frame_list(&template, 1280, 1, 0);
    let before = rig.counters("tight").unwrap();
    let before_cpu = rig
        .maps
        .rule_counters_per_cpu(rig.slot("tight").unwrap())
        .unwrap();
    let g_before = rig.maps.global_counters().unwrap();
    let rx_before = rig.rx.per_source().unwrap();
    let plans = cpus
        .iter()
        .map(|&cpu| SendPlan {
            frames: frames.clone(),
            rate: None,
            count: u64::MAX,
            duration: SEND_FOR,
            cpu: Some(cpu),
        })
        .collect();
    let run = Run::send(&rig.pair, plans, SETTLE).expect("sending");
    let per_cpu: Vec<u64> = rig
        .maps
        .rule_counters_per_cpu(rig.slot("tight").unwrap())
        .unwrap()
        .iter()
        .zip(&before_cpu)
        .map(|(a, b)| {
            (a.passed_packets + a.dropped_packets) - (b.passed_packets + b.dropped_packets)
        })
        .collect();
    let t = run.t;
    let after = rig.counters("tight").unwrap();
    let g = rig.maps.global_counters().unwrap();
    let rx = rig.rx.per_source().unwrap();
    let passed = after.passed_packets - before.passed_packets;
    let dropped = after.dropped_packets - before.dropped_packets;
    let offered = passed + dropped;
    let burst = burst_of(TIGHT_RATE);
    let bound = TIGHT_RATE as f64 * t + burst as f64;
    let formula = (offered as f64).min(bound);
    let mut aggregate = ModelBucket::new(TIGHT_RATE, burst);
    let (mut model, mut good_sent) = (0u64, 0u64);
    for_each_frame(&run.reports, |at, _, entry| {
        good_sent += u64::from(who[entry] == Who::Good);
        model += u64::from(aggregate.offer(at, 1.0));
    });
    let rx_passed = |rx: &std::collections::BTreeMap<Ipv4Addr, u64>| -> u64 {
        rx.iter()
            .filter(|(src, _)| **src != GOOD && **src != HEAVY)
            .map(|(_, n)| n)
            .sum()
    };
    let spoofed_passed = rx_passed(&rx) - rx_passed(&rx_before);
    let good_passed =
        rx.get(&GOOD).copied().unwrap_or(0) - rx_before.get(&GOOD).copied().unwrap_or(0);

    let error = rel(passed as f64, formula);
    // Proportional share: each of the good source's frames passes with the probability
    // any frame does, p = passed / offered; over n frames the count is binomial, and 5
    // standard deviations bound it.
    let p = passed as f64 / offered as f64;
    let share_expected = p * good_sent as f64;
    let sigma = (good_sent as f64 * p * (1.0 - p)).sqrt();
    let busy = busy_cells(srcs);
    eprintln!(
        "[native] abuse B, {} CPU(s) (aggregate saturated): offered {:.0}/s at XDP for {t:.3} s \
         ({SPOOFED} spoofed sources), aggregate {TIGHT_RATE}/s burst {burst}: expected \
         {formula:.0} (model {model}), passed {passed}, error {:+.3} %, dropped {dropped}; \
         good source sent {good_sent} ({:.0}/s), passed {good_passed} (proportional share \
         {share_expected:.0} ± {:.0}); SRC_SKETCH busy cells {busy}/{}; \
         insert_failures {} (+{} this phase), contended {}; \
         frames metered per CPU {per_cpu:?}",
        cpus.len(),
        offered as f64 / t,
        pct(error),
        good_sent as f64 / t,
        5.0 * sigma,
        sketch::cells_for(MAX_SOURCES),
        g.sketch_unseeded,
        g.sketch_unseeded - g_before.sketch_unseeded,
        g.contended,
    );
    let label = format!("[native] abuse B, {} CPU(s)", cpus.len());
    checks.check(error.abs() < 0.01, || {
        format!(
            "{label}: aggregate passed {passed} vs min(offered, rate × T + burst) = \
             {formula:.0} ({:+.3} %)",
            pct(error)
        )
    });
    checks.check(rel(passed as f64, model as f64).abs() < 0.01, || {
        format!("{label}: aggregate passed {passed} vs the model's {model}")
    });
    checks.check(spoofed_passed + good_passed == passed, || {
        format!(
            "{label}: receiver saw {spoofed_passed} spoofed + {good_passed} good frames, \
             the passed counter says {passed}"
        )
    });
    checks.check(
        (good_passed as f64 - share_expected).abs() <= 5.0 * sigma.max(1.0),
        || {
            format!(
                "{label}: the good source passed {good_passed} of {good_sent}; its \
                 proportional share is {share_expected:.0} ± {:.0}",
                5.0 * sigma
            )
        },
    );
    for &cpu in cpus {
        let n = per_cpu.get(cpu).copied().unwrap_or(0);
        checks.check(n as f64 >= 0.1 * offered as f64, || {
            format!("{label}: CPU {cpu} metered only {n} of {offered} frames")
        });
    }
    all_seen(offered, &run)
        .and_then(|()| steady(model as f64, formula, &run))
        .and_then(|()| {
            if (offered as f64) < 2.0 * bound {
                return Err(format!(
                    "offered only {:.0}/s: not a saturating flood",
                    offered as f64 / t
                ));
            }
            if good_sent as f64 / t >= SRC_RATE as f64 {
                return Err("the good source sent above its per-source rate".into());
            }
            Ok(())
        })
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

fn steady(model: f64, formula: f64, run: &Run) -> Premise {
    if rel(model, formula).abs() > STEADY {
        return Err(format!(
            "unsteady offer: the model of its time line admits {model:.0}, the formula \
             {formula:.0}; longest gap between batches {:?}",
            run.longest_gap()
        ));
    }
    Ok(())
}

/// A phase: runs its traffic on the rig, records its checks, says whether its traffic
/// came out as planned.
type PhaseFn = dyn Fn(&Limited, &Path, &mut Checks) -> Premise;

/// A fresh rig (maps pinned), with the per-source map's capacity checked and its memory
/// read before `phases` run and after each.
fn spray(phases: &[&PhaseFn]) -> (Checks, Premise) {
    let pins = PinDir::new();
    let rig = Limited::new(2, XdpMode::Native, &config(), Some(&pins.path)).expect("setting up");
    let srcs = pins.path.join(map_name::SRC_SKETCH);
    let (mem_before, max_entries) = map_memory(&srcs);
    let mut checks = Checks::new();
    let cells = u64::from(sketch::cells_for(MAX_SOURCES));
    checks.check(max_entries == cells, || {
        format!("SRC_SKETCH has max_entries {max_entries}, {cells} for max_sources {MAX_SOURCES}")
    });
    let mut premise = Ok(());
    let mut memory = vec![mem_before];
    for phase in phases {
        premise = premise.and_then(|()| phase(&rig, &srcs, &mut checks));
        memory.push(map_memory(&srcs).0);
    }
    eprintln!(
        "[native] abuse: SRC_SKETCH memory (bpftool bytes_memlock) before and after each \
         phase: {memory:?}"
    );
    checks.check(memory.iter().all(|&m| m == mem_before), || {
        format!("SRC_SKETCH memory grew: {memory:?} bytes")
    });
    (checks, premise)
}

/// Phases A and B with one sender pinned to CPU 0.
#[test]
fn spoofed_churn_and_flood_from_one_cpu() {
    with_retries("[native] abuse, one CPU", ATTEMPTS, || {
        spray(&[&phase_a, &|rig, srcs, checks| {
            phase_b(rig, srcs, checks, &[0])
        }])
    });
}

/// Phase B from both CPUs at once.
#[test]
fn spoofed_flood_from_two_cpus() {
    with_retries("[native] abuse, two CPUs", ATTEMPTS, || {
        spray(&[&|rig, srcs, checks| phase_b(rig, srcs, checks, &[0, 1])])
    });
}
