//! End to end: the program attached to a veth end, real frames sent from the peer's
//! namespace, the admitted count checked against rate × time + burst, and the counters
//! checked against what the receiver saw.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

use std::{path::Path, time::Duration};

use limiter_tests::{
    netns::{ip, VethPair},
    scenario::{first_build, flood, flood_timed, load_for, model_admits, udp_to_host, PinDir},
    tools,
    traffic::SendPlan,
};
use limiter_user::{
    attach::program::{AttachedMode, LoadOptions, Program},
    config::{Config, XdpMode},
    daemon::apply_rules,
    host::object::Variant,
};

/// The rule's rate and burst (a tenth in an emulated guest, which cannot offer 2 × 20 k/s).
fn rate_and_burst() -> (u64, u64) {
    (
        limiter_tests::guest_scale(20_000),
        limiter_tests::guest_scale(500),
    )
}

fn rate_is_enforced(mode: XdpMode, expected_mode: AttachedMode, expected_variant: Variant) {
    let (rate, burst) = rate_and_burst();
    let pair = VethPair::new(1).expect("creating the veth pair");
    let pins = PinDir::new();
    let config = Config::parse(
        &format!(
            "[[rules]]\nname = \"e2e\"\ndst = \"198.18.0.2/32\"\nproto = \"udp\"\n\
             rate = {rate}\nburst = {burst}\n"
        ),
        Path::new("<e2e>"),
    )
    .unwrap();
    let mut program = load_for(mode, &pins).unwrap();
    let mut maps = program.maps().unwrap();
    let table = apply_rules(&mut maps, &config).unwrap();
    let slot = table.slots["e2e"];
    let attachment = program.attach(&pair.host, mode).expect("attaching");
    assert_eq!(attachment.mode, expected_mode);
    assert_eq!(attachment.variant, expected_variant);
    // A socket receiver sees frames before TC ingress: behind the TC build, what passed
    // is counted by a TC counter attached after it (tcx runs programs in attach order).
    let rx = (mode == XdpMode::Tc)
        .then(|| limiter_tests::rx::RxCounter::attach(&pair.host).expect("TC counter"));

    let plan = SendPlan {
        frames: vec![udp_to_host(&pair, 9, 64)],
        rate: None,
        count: 2_000_000,
        duration: Duration::from_secs(3),
        cpu: None,
    };
    let (timed, received) = flood_timed(&pair, plan).expect("sending");
    let c = maps.rule_counters(slot).unwrap();
    let passed_downstream = match &rx {
        Some(rx) => rx.totals().expect("reading the TC counter").packets,
        None => received.matched,
    };

    // What one bucket admits of the frames as they were sent: rate × time + burst while
    // the offer stays above the rate, less where a descheduled sender (an emulated
    // guest) offered nothing for longer than the burst lasts.
    let expected = model_admits(std::slice::from_ref(&timed), rate, burst, |_| true) as f64;
    let sent = timed.report;
    let span = sent.span.as_secs_f64();
    let offered = (c.passed_packets + c.dropped_packets) as f64 / span;
    eprintln!(
        "{mode:?}: sent {} in {span:.3}s ({:.0}/s), XDP saw {:.0}/s, passed {} \
         (expected {expected:.0}), dropped {}, receiver {} (socket drops {}), \
         downstream {passed_downstream}",
        sent.sent,
        sent.frames_per_second(),
        offered,
        c.passed_packets,
        c.dropped_packets,
        received.matched,
        received.socket_drops
    );
    assert!(
        offered > 2.0 * rate as f64,
        "the offer ({offered:.0}/s) must be well above the rate for this test to mean anything"
    );
    let error = (c.passed_packets as f64 - expected).abs() / expected;
    assert!(
        error < 0.01,
        "passed {} vs rate × time + burst = {expected:.0}: off by {:.2} %",
        c.passed_packets,
        error * 100.0
    );
    assert!(c.passed_packets + c.dropped_packets <= sent.sent);
    // The receiver's count stands in for the downstream one only without a TC counter;
    // with one (tc mode) the packet socket, which sees frames before tc ingress, gets
    // the whole flood and may overflow without making any figure here wrong.
    if rx.is_none() {
        assert_eq!(
            received.socket_drops, 0,
            "the receiver lost frames: count is unreliable"
        );
    }
    // Exact in every run on a quiet machine; once, while another process flooded other
    // veth pairs at over 1 M frames/s, the receiver saw one frame more than the counter
    // in both modes (cause not found yet, see the closing note of that session).
    assert!(
        passed_downstream.abs_diff(c.passed_packets) <= 1,
        "frames received {passed_downstream} vs the passed counter {}",
        c.passed_packets
    );
    assert_eq!(c.passed_bytes, c.passed_packets * 64);
    program.detach(attachment).unwrap();
}

limiter_tests::test_rows! {
    native_mode_enforces_the_rate =>
        rate_is_enforced(XdpMode::Native, AttachedMode::Native, Variant::Linear);
    generic_mode_enforces_the_rate =>
        rate_is_enforced(XdpMode::Generic, AttachedMode::Generic, Variant::MultiBuffer);
    /// The TC build at TC ingress (`xdp_mode = "tc"`) enforces the same rule.
    tc_mode_enforces_the_rate => rate_is_enforced(XdpMode::Tc, AttachedMode::Tc, Variant::Tc);
}

/// On an interface whose MTU needs several buffers per frame, the kernel refuses the
/// linear build; native mode then runs the multi-buffer build, which meters whole frames
/// (bytes rule, frames longer than a page).
#[test]
fn jumbo_mtu_runs_the_multi_buffer_build() {
    const FRAME: u64 = 8000;
    const BURST_FRAMES: u64 = 50;
    let pair = VethPair::new(1).expect("creating the veth pair");
    ip(&["link", "set", "dev", &pair.host, "mtu", "9000"]).unwrap();
    ip(&[
        "-n", &pair.ns, "link", "set", "dev", &pair.peer, "mtu", "9000",
    ])
    .unwrap();
    let config = Config::parse(
        &format!(
            "[[rules]]\nname = \"jumbo\"\ndst = \"198.18.0.2/32\"\nproto = \"udp\"\n\
             unit = \"bytes\"\nrate = 1000\nburst = {}\n",
            FRAME * BURST_FRAMES
        ),
        Path::new("<e2e>"),
    )
    .unwrap();
    // The linear build, as the daemon's native start: the kernel refuses to attach it
    // at this MTU, and the multi-buffer build is verified and attached instead.
    let mut program = Program::load_builds(
        &LoadOptions {
            pin_dir: None,
            max_sources: 1024,
            handoff_array: None,
        },
        first_build(XdpMode::Native),
    )
    .expect("loading the program");
    let mut maps = program.maps().unwrap();
    let table = apply_rules(&mut maps, &config).unwrap();
    let slot = table.slots["jumbo"];
    let attachment = program
        .attach(&pair.host, XdpMode::Native)
        .expect("attaching");
    assert_eq!(attachment.mode, AttachedMode::Native);
    assert_eq!(attachment.variant, Variant::MultiBuffer);

    let plan = SendPlan {
        frames: vec![udp_to_host(&pair, 9, FRAME as usize)],
        rate: None,
        count: 4 * BURST_FRAMES,
        duration: Duration::from_secs(3),
        cpu: None,
    };
    let (sent, received) = flood(&pair, plan).expect("sending");
    let c = maps.rule_counters(slot).unwrap();
    eprintln!(
        "jumbo: sent {}, passed {} ({} bytes), dropped {} ({} bytes), received {}",
        sent.sent,
        c.passed_packets,
        c.passed_bytes,
        c.dropped_packets,
        c.dropped_bytes,
        received.matched
    );
    assert_eq!(c.passed_packets + c.dropped_packets, sent.sent);
    assert_eq!(
        c.passed_bytes,
        c.passed_packets * FRAME,
        "whole frames metered"
    );
    assert_eq!(c.dropped_bytes, c.dropped_packets * FRAME);
    // The burst holds BURST_FRAMES whole frames; the 1000 B/s refill adds none in 3 s.
    assert_eq!(c.passed_packets, BURST_FRAMES);
    assert_eq!(received.matched, c.passed_packets);
    program.detach(attachment).unwrap();
}

/// Maps are pinned under pin_dir and named so `bpftool map dump pinned` shows fields.
#[test]
fn maps_are_pinned_with_btf() {
    let pins = PinDir::new();
    // The maps alone (no build verified), as a daemon sharing the hook through libxdp
    // starts: the loader creates and pins every map before any program is loaded.
    let _program = Program::load_builds(
        &LoadOptions {
            pin_dir: Some(pins.path.clone()),
            max_sources: 1024,
            handoff_array: None,
        },
        &[],
    )
    .expect("loading the program");
    for name in limiter_common::abi::map_name::ALL {
        assert!(pins.path.join(name).exists(), "{name} is not pinned");
    }
    // The map carries BTF: bpftool names the value's fields.
    let entries = tools::bpftool_map_dump_pinned(&pins.path.join("CONTROL")).unwrap();
    let value = &entries
        .first()
        .unwrap_or_else(|| panic!("CONTROL has no entry: {entries:?}"))["formatted"]["value"];
    assert!(
        value.get("generation").is_some() && value.get("flags").is_some(),
        "bpftool shows no field names: {entries:?}"
    );
    // The per-frame entries sit on cache-line boundaries: page-aligned values
    // (BPF_F_MMAPABLE) of whole cache lines.
    const BPF_F_MMAPABLE: u32 = 1 << 10;
    for name in ["RULES", "HOSTS", "AGG_BUCKETS"] {
        let info = aya::maps::MapInfo::from_pin(pins.path.join(name)).expect("map info");
        assert_ne!(
            info.map_flags() & BPF_F_MMAPABLE,
            0,
            "{name} is not page-aligned"
        );
        assert_eq!(
            info.value_size() % 64,
            0,
            "{name} values are not whole lines"
        );
    }
}
