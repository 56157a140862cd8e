//! A spoofed flood that saturates one rule's part of the per-source sketch: the real
//! daemon (`limiter run`, native XDP on a veth pair) notices, marks the rule saturated
//! (`stats --json`, the metrics), and with `on_saturation = "stand-aside"` its honest
//! sources lose no more than the path itself loses; with "enforce" they are refused
//! (which shows the measurement can fail). After the flood the rule goes back.
//!
//! The flood: one sender on CPU 0, as fast as it goes, cycling through 65,536 forged
//! sources (each far under its limit) at a rule of `max_sources = 4096` with a per-source
//! limit of 10/s: F / W frames/s a cell, far above R, exhausts most cells. Once the
//! daemon says the rule is saturated, a second sender sends honest sources at half their
//! limit to that rule and, interleaved in the same list, as many control sources at the
//! same rate to a port no rule covers: the control sources' loss is the path's own
//! (the veth under the flood), measured in the same run. A TC-ingress counter behind
//! the limiter counts what passed, per source.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

mod common;

use std::{
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use common::{join_timed, metrics, Lab};
use limiter_tests::{
    frame,
    rx::RxCounter,
    scenario::{sent_of_entry, udp_to_host, with_retries, Checks, Premise},
    traffic::SendPlan,
};

const MAX_SOURCES: u32 = 4096;
const FORGED: u32 = 65_536;
/// Forged sources: 198.19.0.0/16.
const FORGED_BASE: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 0);
const HONEST: u32 = 64;
const HONEST_BASE: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 0);
const CONTROL_BASE: Ipv4Addr = Ipv4Addr::new(198, 18, 2, 0);
/// The flooded rule's per-source limit and burst; honest sources send at half of it.
const RATE: u64 = 10;
const BURST: u64 = 10;
const FLOODED_PORT: u16 = 9;
/// No rule covers it: what reaches the counter there is what the path delivers.
const CONTROL_PORT: u16 = 10;
/// How long the honest sources send, once the rule is saturated.
const HONEST_FOR: Duration = Duration::from_secs(4);
/// How long the flood lasts: time to be seen saturated, then the honest sending.
const FLOOD_FOR: Duration = Duration::from_secs(7);
/// The rule must read saturated within this of the flood's start.
const SATURATED_WITHIN: Duration = Duration::from_millis(2500);
/// ... and clear again within this of its end (the cells drain, then a calm spell).
const CLEAR_WITHIN: Duration = Duration::from_secs(15);

fn ipv4(base: Ipv4Addr, i: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(base) + i)
}

fn rules(policy: &str) -> String {
    format!(
        "[[rules]]\nname = \"flooded\"\ndst = \"198.18.0.2/32\"\ndst_port = {FLOODED_PORT}\n\
         proto = \"udp\"\n[rules.per_source]\nrate = {RATE}\nburst = {BURST}\n\
         on_saturation = \"{policy}\"\n"
    )
}

/// The rule's `stats --json` entry: (saturated, stands aside, false-limit ppm).
fn saturation(lab: &Lab) -> (bool, bool, u64) {
    let r = lab.rule_stats("flooded");
    (
        r["sources_saturated"].as_bool().expect("sources_saturated"),
        r["sources_aside"].as_bool().expect("sources_aside"),
        r["sources_false_limit_ppm"]
            .as_u64()
            .expect("sources_false_limit_ppm"),
    )
}

/// Polls until the rule's saturation reads `want`; how long it took, or `None`.
fn wait_saturated(lab: &Lab, want: bool, within: Duration) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < within {
        if saturation(lab).0 == want {
            return Some(start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

fn metric(text: &str, name: &str) -> Option<f64> {
    let prefix = format!("{name}{{rule=\"flooded\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.parse().ok())
}

/// Loss of a group of sources: 1 − passed / sent.
fn loss(passed: u64, sent: u64) -> f64 {
    1.0 - passed as f64 / sent.max(1) as f64
}

struct Outcome {
    honest_loss: f64,
    control_loss: f64,
    /// Frames each group sent.
    sent: u64,
}

/// One run under `policy`; checks what holds whatever the policy (the rule reads
/// saturated during the flood and clear after it, in stats and metrics) and returns the
/// losses for the caller's policy-specific check.
fn flood_with_honest_sources(policy: &str, checks: &mut Checks) -> Result<Outcome, String> {
    let lab = Lab::with_settings(
        &rules(policy),
        "native",
        &format!("max_sources = {MAX_SOURCES}"),
    );
    let daemon = lab.start();
    let rx = RxCounter::attach(&lab.pair.host).expect("attaching the counter");
    let (saturated, _, ppm) = saturation(&lab);
    checks.check(!saturated, || {
        format!("[{policy}] saturated before any traffic ({ppm} ppm)")
    });

    let with_src = |port: u16, src: Ipv4Addr| {
        let mut f = udp_to_host(&lab.pair, port, 64);
        frame::with_ipv4_src(&mut f, src).unwrap();
        f
    };
    let forged: Vec<Vec<u8>> = (0..FORGED)
        .map(|i| with_src(FLOODED_PORT, ipv4(FORGED_BASE, i)))
        .collect();
    let started = Instant::now();
    let flood = lab.send_timed_in_background(SendPlan {
        frames: forged,
        rate: None,
        count: u64::MAX,
        duration: FLOOD_FOR,
        cpu: Some(0),
    });
    let Some(took) = wait_saturated(&lab, true, SATURATED_WITHIN) else {
        let report = join_timed(flood);
        return Err(format!(
            "the rule did not read saturated within {SATURATED_WITHIN:?} of the flood's \
             start ({:.0} frames/s sent)",
            report.report.frames_per_second()
        ));
    };
    let (_, aside, ppm) = saturation(&lab);
    eprintln!("[{policy}] saturated {took:?} after the flood started: {ppm} ppm, aside {aside}");
    checks.check(aside == (policy == "stand-aside"), || {
        format!("[{policy}] sources_aside reads {aside} while saturated")
    });
    let text = metrics(&lab);
    checks.check(
        metric(&text, "limiter_rule_sources_saturated") == Some(1.0),
        || format!("[{policy}] limiter_rule_sources_saturated is not 1 while saturated"),
    );
    checks.check(
        metric(&text, "limiter_rule_sources_false_limit_ratio").is_some_and(|r| r >= 0.01),
        || format!("[{policy}] limiter_rule_sources_false_limit_ratio below the entry threshold"),
    );

    // Honest and control sources alternate in one list: the same sender, the same path.
    let list: Vec<Vec<u8>> = (0..HONEST)
        .flat_map(|i| {
            [
                with_src(FLOODED_PORT, ipv4(HONEST_BASE, i)),
                with_src(CONTROL_PORT, ipv4(CONTROL_BASE, i)),
            ]
        })
        .collect();
    let len = list.len();
    let honest = lab.send_timed_in_background(SendPlan {
        frames: list,
        rate: Some(2 * u64::from(HONEST) * RATE / 2),
        count: u64::MAX,
        duration: HONEST_FOR,
        cpu: Some(1),
    });
    let honest = join_timed(honest);
    let honest_done = started.elapsed();
    let flood = join_timed(flood);
    std::thread::sleep(Duration::from_millis(100));
    let passed = rx.per_source().expect("reading the counter");
    let (mut honest_sent, mut honest_passed, mut control_sent, mut control_passed) = (0, 0, 0, 0);
    for i in 0..HONEST {
        let sent_of = |k: u32| sent_of_entry(honest.report.sent, len, k as usize);
        let passed_of = |base| passed.get(&ipv4(base, i)).copied().unwrap_or(0);
        honest_sent += sent_of(2 * i);
        control_sent += sent_of(2 * i + 1);
        honest_passed += passed_of(HONEST_BASE).min(sent_of(2 * i));
        control_passed += passed_of(CONTROL_BASE).min(sent_of(2 * i + 1));
    }
    let (honest_loss, control_loss) = (
        loss(honest_passed, honest_sent),
        loss(control_passed, control_sent),
    );
    eprintln!(
        "[{policy}] flood {:.0} frames/s from {FORGED} forged sources into {MAX_SOURCES} \
         cells a row (per-source {RATE}/s); honest sources at {}/s: sent {honest_sent}, \
         passed {honest_passed} (loss {:.1} %); control: sent {control_sent}, passed \
         {control_passed} (the path's loss {:.1} %)",
        flood.report.frames_per_second(),
        RATE / 2,
        honest_loss * 100.0,
        control_loss * 100.0
    );

    // The flood is over: the rule goes back once its cells drain and a calm spell passes.
    let cleared = wait_saturated(&lab, false, CLEAR_WITHIN);
    eprintln!("[{policy}] clear again {cleared:?} after the flood ended");
    checks.check(cleared.is_some(), || {
        format!(
            "[{policy}] still saturated {CLEAR_WITHIN:?} after the flood ({} ppm)",
            saturation(&lab).2
        )
    });
    let text = metrics(&lab);
    checks.check(
        metric(&text, "limiter_rule_sources_saturated") == Some(0.0),
        || format!("[{policy}] limiter_rule_sources_saturated is not 0 after the flood"),
    );
    let transitions = metric(&text, "limiter_rule_sources_saturation_transitions_total");
    checks.check(transitions == Some(2.0), || {
        format!("[{policy}] {transitions:?} saturation transitions, expected 2 (in, out)")
    });
    daemon.stop();

    if honest_done + Duration::from_millis(200) > FLOOD_FOR {
        return Err(format!(
            "the honest sources finished {honest_done:?} after the flood started, not within \
             its {FLOOD_FOR:?}"
        ));
    }
    let planned = (HONEST_FOR.as_secs_f64() * (RATE / 2) as f64) as u64 * u64::from(HONEST);
    if honest_sent < planned * 9 / 10 {
        return Err(format!(
            "the honest sender sent {honest_sent} of {planned} frames"
        ));
    }
    if control_loss > 0.6 {
        return Err(format!(
            "the path lost {:.1} % of the control frames: too little left to compare",
            control_loss * 100.0
        ));
    }
    Ok(Outcome {
        honest_loss,
        control_loss,
        sent: honest_sent,
    })
}

/// Statistical slack for comparing two losses over `n` frames each: 4 standard
/// deviations of the difference of two binomial shares, plus 2 points.
fn slack(loss: f64, n: u64) -> f64 {
    let p = loss.clamp(0.05, 0.95);
    0.02 + 4.0 * (2.0 * p * (1.0 - p) / n.max(1) as f64).sqrt()
}

#[test]
fn honest_sources_of_a_saturated_rule_lose_only_what_the_path_loses() {
    with_retries("stand-aside", 3, || {
        let mut checks = Checks::new();
        let premise: Premise = flood_with_honest_sources("stand-aside", &mut checks).map(|o| {
            let allowed = o.control_loss + slack(o.control_loss, o.sent);
            checks.check(o.honest_loss <= allowed, || {
                format!(
                    "honest sources of the saturated rule lost {:.1} %, the path {:.1} % \
                     (allowed up to {:.1} %)",
                    o.honest_loss * 100.0,
                    o.control_loss * 100.0,
                    allowed * 100.0
                )
            });
        });
        (checks, premise)
    });
}

/// The same flood with `on_saturation = "enforce"`: the per-source limit keeps refusing,
/// and the honest sources lose far more than the path (what every rule did before).
#[test]
fn with_enforce_a_saturated_rule_refuses_its_honest_sources() {
    with_retries("enforce", 3, || {
        let mut checks = Checks::new();
        let premise: Premise = flood_with_honest_sources("enforce", &mut checks).map(|o| {
            let floor = o.control_loss + 0.25;
            checks.check(o.honest_loss >= floor, || {
                format!(
                    "with enforce, honest sources lost {:.1} %, the path {:.1} %: expected at \
                     least {:.1} %",
                    o.honest_loss * 100.0,
                    o.control_loss * 100.0,
                    floor * 100.0
                )
            });
        });
        (checks, premise)
    });
}
