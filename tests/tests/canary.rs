//! Canary enforcement (`enforce_percent`) through BPF_PROG_TEST_RUN: the real program in
//! the real kernel, one crafted frame per run, 10,000 distinct sources over the limit.
//!
//! - The share of sources whose refusals drop is the configured percentage, within 4
//!   binomial standard deviations; every other refusal passes and is counted as a
//!   would-drop, and the rule's counters say exactly that.
//! - Each source's verdict is the one limiter-common's `canary::enforced` computes from the
//!   rule's entry and the sketch's seed: what `limiter explain` says.
//! - A per-source rule keyed by /64 puts a whole /64 in or out.
//! - Evasions refused before the limits drop for every source of a canary.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

use std::net::{Ipv4Addr, Ipv6Addr};

use limiter_common::{
    abi::{addr_words, AddrWords},
    canary,
};
use limiter_tests::{
    fixture::{self, Loaded},
    frame::{self, with_ipv4_src, with_ipv6_src, FrameBuilder, TCP_ACK},
};
use limiter_user::host::object::Variant;

const XDP_DROP: u32 = 1;
const XDP_PASS: u32 = 2;

const SOURCES: u32 = 10_000;

const DST_V4: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 1);
const DST_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0xffff, 0, 0, 0, 0, 1);

fn v4_words(a: Ipv4Addr) -> AddrWords {
    let mut bytes = [0u8; 16];
    bytes[..4].copy_from_slice(&a.octets());
    addr_words(&bytes)
}

/// Distinct IPv4 sources in 198.18.0.0/15, skipping the network's first addresses.
fn v4_source(i: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from_be_bytes([198, 18, 0, 0]) + 16 + i)
}

/// Host `host` of the `i`-th /64 under 2001:db8:1::/48.
fn v6_source(i: u32, host: u16) -> Ipv6Addr {
    Ipv6Addr::new(0x2001, 0xdb8, 1, i as u16, 0, 0, 0x51, host)
}

/// What the rule named `name` says about a source, by limiter-common's function: the
/// same entry and seed the program reads.
fn enforced_by_common(loaded: &Loaded, name: &str, family: u32, src: &AddrWords) -> bool {
    let slot = loaded.table.slots[name];
    let rule = loaded.table.rule(slot).expect("the rule's entry");
    let seed = loaded.maps.sketch_meta_as_is().expect("SKETCH_META").seed;
    canary::enforced(rule, &seed, family, src)
}

/// `count` of `n` within 4 binomial standard deviations of `p`.
fn assert_binomial(count: u32, n: u32, p: f64, what: &str) {
    let expected = f64::from(n) * p;
    let sd = (f64::from(n) * p * (1.0 - p)).sqrt();
    assert!(
        (f64::from(count) - expected).abs() <= 4.0 * sd + 1.0,
        "{what}: {count} of {n} sources dropped, expected {expected:.0} ± {:.0} (4 σ)",
        4.0 * sd
    );
}

/// An aggregate rule in bytes, 1 byte/s: once a warm-up source has taken its burst, a
/// frame refills in about a minute, so every frame of the test is refused, and it drops
/// for the sources in the canary only.
fn aggregate_canary(variant: Variant, percent: &str, p: f64) {
    let config = format!(
        "[[rules]]\nname = \"canary\"\ndst = \"{DST_V4}/32\"\nunit = \"bytes\"\n\
         rate = 1\nburst = 1518\nenforce_percent = {percent}\n"
    );
    let loaded = fixture::load_build(&config, variant).expect("loading the program");
    let mut f = FrameBuilder::ipv4(Ipv4Addr::new(198, 18, 0, 1), DST_V4)
        .udp(1, 53)
        .build();
    // Takes the burst (1518 bytes: about 25 frames), from outside the sources below.
    for _ in 0..100 {
        loaded.run(&f).unwrap();
    }
    let warm = loaded.snapshot().unwrap();
    let w = &warm.rules["canary"];
    assert!(
        w.dropped_packets + w.would_drop_packets > 0,
        "the warm-up exhausted the burst: {w:?}"
    );
    let before = loaded.snapshot().unwrap();
    let mut dropped = 0;
    let mut disagree = Vec::new();
    for i in 0..SOURCES {
        let src = v4_source(i);
        with_ipv4_src(&mut f, src).unwrap();
        let verdict = loaded.run(&f).unwrap();
        let expected = if enforced_by_common(&loaded, "canary", 4, &v4_words(src)) {
            XDP_DROP
        } else {
            XDP_PASS
        };
        if verdict != expected {
            disagree.push((src, verdict, expected));
        }
        dropped += u32::from(verdict == XDP_DROP);
    }
    assert!(
        disagree.is_empty(),
        "{} sources' verdicts differ from limiter-common's canary (source, verdict, \
         expected), first: {:?}",
        disagree.len(),
        &disagree[..disagree.len().min(5)]
    );
    assert_binomial(dropped, SOURCES, p, &format!("{variant:?} at {percent} %"));
    let after = loaded.snapshot().unwrap();
    let delta = fixture::delta(&before, &after);
    let c = &delta.rules["canary"];
    assert_eq!(
        (c.passed_packets, c.dropped_packets, c.would_drop_packets),
        (
            u64::from(SOURCES - dropped),
            u64::from(dropped),
            u64::from(SOURCES - dropped)
        ),
        "every refusal outside the canary is a would-drop (passed, dropped, would-drop)"
    );
}

#[test]
fn a_5_percent_canary_drops_for_5_percent_of_sources() {
    aggregate_canary(Variant::MultiBuffer, "5", 0.05);
}

#[test]
fn a_2_5_percent_canary_drops_for_2_5_percent_of_sources_linear_build() {
    aggregate_canary(Variant::Linear, "2.5", 0.025);
}

#[test]
fn a_50_percent_canary_on_the_tc_build() {
    aggregate_canary(Variant::Tc, "50", 0.5);
}

#[test]
fn zero_percent_drops_for_no_source_and_100_for_every_source() {
    aggregate_canary(Variant::MultiBuffer, "0", 0.0);
    aggregate_canary(Variant::MultiBuffer, "100", 1.0);
}

/// A per-source rule keyed by /64: each /64 sends from two hosts, the second frame over
/// the /64's burst of 1. The second is dropped exactly when the /64 is in the canary
/// (both hosts agree with limiter-common's function).
#[test]
fn a_per_source_canary_puts_a_whole_prefix_in_or_out() {
    let config = format!(
        "max_sources = 1048576\n[[rules]]\nname = \"canary\"\ndst = \"{DST_V6}/128\"\n\
         enforce_percent = 10\n[rules.per_source]\nrate = 1\nburst = 1\nprefix_v6 = 64\n"
    );
    let loaded = fixture::load_build(&config, Variant::MultiBuffer).expect("loading the program");
    let mut f = FrameBuilder::ipv6(v6_source(0, 1), DST_V6)
        .udp(1, 53)
        .build();
    let before = loaded.snapshot().unwrap();
    let (mut dropped, mut first_refusals) = (0u32, 0u64);
    let mut disagree = Vec::new();
    for i in 0..SOURCES {
        let (first, second) = (v6_source(i, 1), v6_source(i, 2));
        let in_canary = enforced_by_common(&loaded, "canary", 6, &addr_words(&first.octets()));
        assert_eq!(
            in_canary,
            enforced_by_common(&loaded, "canary", 6, &addr_words(&second.octets())),
            "{first} and {second} are one /64"
        );
        with_ipv6_src(&mut f, first).unwrap();
        let first_verdict = loaded.run(&f).unwrap();
        with_ipv6_src(&mut f, second).unwrap();
        let second_verdict = loaded.run(&f).unwrap();
        // The first frame takes the /64's burst, unless its cells collide with others'
        // (rare at this sketch size); refused, it follows the canary too.
        if first_verdict == XDP_DROP {
            first_refusals += 1;
            if !in_canary {
                disagree.push((first, first_verdict));
            }
        }
        let expected = if in_canary { XDP_DROP } else { XDP_PASS };
        if second_verdict != expected {
            disagree.push((second, second_verdict));
        }
        dropped += u32::from(second_verdict == XDP_DROP);
    }
    assert!(
        disagree.is_empty(),
        "{} verdicts differ from limiter-common's canary, first: {:?}",
        disagree.len(),
        &disagree[..disagree.len().min(5)]
    );
    assert_binomial(dropped, SOURCES, 0.10, "/64s at 10 %");
    let delta = fixture::delta(&before, &loaded.snapshot().unwrap());
    let c = &delta.rules["canary"];
    // Every second frame is refused (a drop or a would-drop); so is a first frame whose
    // cells collided, which the verdict shows only inside the canary (outside, it passes
    // as a would-drop): those are few, at least the ones seen dropped.
    let refusals = c.dropped_packets + c.would_drop_packets;
    let first_refused = refusals.saturating_sub(u64::from(SOURCES));
    assert!(
        refusals >= u64::from(SOURCES) + first_refusals
            && first_refused <= u64::from(SOURCES) / 100,
        "{refusals} refusals: every second frame ({SOURCES}) and a few first frames (at least \
         {first_refusals}) are drops or would-drops"
    );
    assert_eq!(c.dropped_packets, u64::from(dropped) + first_refusals);
}

/// An evasion (a first fragment too short to hold the TCP header) is refused before the
/// limits: a 0 % canary, which passes every over-limit frame, still drops it, for every
/// source; an ordinary frame of the same sources passes.
#[test]
fn evasions_drop_for_every_source_of_a_canary() {
    let config = format!(
        "[[rules]]\nname = \"canary\"\ndst = \"{DST_V4}/32\"\nproto = \"tcp\"\n\
         dst_port = 443\nrate = 1\nburst = 1\nenforce_percent = 0\n"
    );
    let loaded = fixture::load_build(&config, Variant::MultiBuffer).expect("loading the program");
    let mut tiny = FrameBuilder::ipv4(v4_source(0), DST_V4)
        .ipv4_fragment(0, true)
        .tcp(40000, 443, TCP_ACK)
        .build();
    let l3 = frame::l3_offset(&tiny).unwrap();
    frame::set_ipv4_total_len(&mut tiny, 20 + 8).unwrap();
    tiny.truncate(l3 + 28);
    let mut whole = FrameBuilder::ipv4(v4_source(0), DST_V4)
        .tcp(40000, 443, TCP_ACK)
        .build();
    let before = loaded.snapshot().unwrap();
    let sources = 1000;
    for i in 0..sources {
        let src = v4_source(i);
        with_ipv4_src(&mut tiny, src).unwrap();
        with_ipv4_src(&mut whole, src).unwrap();
        assert_eq!(
            loaded.run(&tiny).unwrap(),
            XDP_DROP,
            "tiny fragment from {src}"
        );
        assert_eq!(
            loaded.run(&whole).unwrap(),
            XDP_PASS,
            "whole frame from {src}"
        );
    }
    let delta = fixture::delta(&before, &loaded.snapshot().unwrap());
    let c = &delta.rules["canary"];
    assert_eq!(
        c.dropped_packets,
        u64::from(sources),
        "the evasions, nothing else"
    );
    assert_eq!(c.passed_packets, u64::from(sources), "every whole frame");
    assert!(
        c.would_drop_packets >= u64::from(sources) / 2,
        "whole frames past the 1/s limit are would-drops: {c:?}"
    );
    assert_eq!(delta.headers.tiny_fragments, u64::from(sources));
}
