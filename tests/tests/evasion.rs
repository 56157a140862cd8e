//! The evasion fuzz test: random header stacks, lengths, fragment offsets, options and
//! extension chains through BPF_PROG_TEST_RUN on every build of the program, checked
//! against a model of what a receiving stack makes of them (limiter_tests::evasion).
//!
//! 1. Single frames (whole datagrams under every disguise): the verdict and the counter
//!    the model says the invariant requires — metered by the rule the datagram's own
//!    headers select, or passed when no stack would deliver it, or refused where the
//!    program cannot see what it carries (a VLAN stack or an IPv6 chain deeper than it
//!    walks), counted by a rule the datagram could belong to.
//! 2. Attacks: datagrams to rule destinations, each fragmented, overlapped, reordered,
//!    duplicated, decorated at random, all their frames interleaved; the frames the
//!    program passes go to a generous reassembler (overlaps resolved first-wins and
//!    last-wins, as some stack might). The invariant: no rule's destination receives
//!    more whole datagrams (SYNs, for a syn rule) than the rule admits — its burst plus
//!    its rate over the case. Honest datagrams sent alongside (fragmented in order, to a
//!    rule with room and to a destination no rule covers) are all delivered.
//!
//! `cargo xtask test` runs a bounded number of cases with a fresh seed each time (it is
//! printed; `LIMITER_FUZZ_SEED` repeats a run); `cargo xtask fuzz --cases N` runs more.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    time::Instant,
};

use limiter_tests::{
    evasion::{
        self, frames, honest_disguise, hostile_disguise, Datagram, Destination, Overlap, Rng, Seen,
        IPPROTO_GRE, IPPROTO_ICMP, IPPROTO_ICMPV6, IPPROTO_TCP, IPPROTO_UDP, TCP_ACK, TCP_SYN,
    },
    fixture::{self, delta, Loaded},
};
use limiter_user::{host::object::Variant, policy::ruleset};

const XDP_DROP: u32 = 1;
const XDP_PASS: u32 = 2;
/// Shortest frame a TC test run takes (see verdicts.rs).
const TC_MIN_FRAME: usize = 54;

fn seed() -> u64 {
    std::env::var("LIMITER_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        })
}

fn cases(default: u64) -> u64 {
    std::env::var("LIMITER_FUZZ_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn runs_on(variant: Variant, frame: &[u8]) -> bool {
    variant != Variant::Tc || frame.len() >= TC_MIN_FRAME
}

const V4_RULED: Ipv4Addr = Ipv4Addr::new(198, 18, 20, 1);
const V4_NET: Ipv4Addr = Ipv4Addr::new(198, 18, 24, 77);
const V4_OPEN: Ipv4Addr = Ipv4Addr::new(198, 18, 21, 1);
const V4_ROOMY: Ipv4Addr = Ipv4Addr::new(198, 18, 22, 1);
const V6_RULED: &str = "2001:db8::20";
const V6_NET: &str = "2001:db8:3::77";
const V6_OPEN: &str = "2001:db8:1::1";
const V6_ROOMY: &str = "2001:db8:2::1";
const PORTS: [u16; 5] = [443, 53, 80, 9, 8080];

/// Rules whose verdicts depend on ports and protocols, for both families; `burst` and
/// `rate` for all but the roomy ones, which never refuse. The ruled hosts have no
/// catch-all rule: what their port rules miss is unmatched, as on an LB host that
/// limits one service (which is where a fragment that hides its ports gains most).
fn rules(rate: u64, burst: u64) -> String {
    format!(
        r#"
[[rules]]
name = "syn443"
dst = "198.18.20.1/32"
dst_port = 443
proto = "tcp"
unit = "syn"
rate = {rate}
burst = {burst}

[[rules]]
name = "dns"
dst = "198.18.20.1/32"
dst_port = 53
proto = "udp"
rate = {rate}
burst = {burst}

[[rules]]
name = "host"
dst = "198.18.20.1/32"
proto = "udp"
rate = {rate}
burst = {burst}

[[rules]]
name = "net"
dst = "198.18.24.0/24"
rate = {rate}
burst = {burst}

[[rules]]
name = "v6syn443"
dst = "2001:db8::20/128"
dst_port = 443
proto = "tcp"
unit = "syn"
rate = {rate}
burst = {burst}

[[rules]]
name = "v6dns"
dst = "2001:db8::20/128"
dst_port = 53
rate = {rate}
burst = {burst}

[[rules]]
name = "v6net"
dst = "2001:db8:3::/112"
proto = "tcp"
rate = {rate}
burst = {burst}

[[rules]]
name = "roomy"
dst = "198.18.22.1/32"
dst_port = 80
proto = "tcp"
rate = 1000000
burst = 100000000

[[rules]]
name = "v6roomy"
dst = "2001:db8:2::1/128"
rate = 1000000
burst = 100000000
"#
    )
}

fn random_datagram(rng: &mut Rng, dsts: &[IpAddr]) -> Datagram {
    let dst = *rng.pick(dsts);
    let src = if dst.is_ipv6() {
        IpAddr::V6(Ipv6Addr::new(
            0x2001,
            0xdb8,
            0xffff,
            0,
            0,
            0,
            0,
            1 + rng.below(4) as u16,
        ))
    } else {
        IpAddr::V4(Ipv4Addr::new(198, 19, 0, 1 + rng.below(4) as u8))
    };
    let icmp = if dst.is_ipv6() {
        IPPROTO_ICMPV6
    } else {
        IPPROTO_ICMP
    };
    let proto = *rng.pick(&[
        IPPROTO_TCP,
        IPPROTO_TCP,
        IPPROTO_TCP,
        IPPROTO_UDP,
        IPPROTO_UDP,
        icmp,
        IPPROTO_GRE,
    ]);
    Datagram {
        src,
        dst,
        proto,
        dst_port: if rng.chance(0.8) {
            *rng.pick(&PORTS)
        } else {
            rng.below(65536) as u16
        },
        flags: if rng.chance(0.7) { TCP_SYN } else { TCP_ACK },
        data_len: rng.below(160) as usize,
        id: rng.next_u64() as u32,
    }
}

fn v6(s: &str) -> IpAddr {
    IpAddr::V6(s.parse().unwrap())
}

/// What the invariant requires of one whole frame.
#[derive(Debug, PartialEq, Eq)]
enum Required {
    /// Passed and metered by this rule (by name), or by none.
    Pass(Option<String>),
    /// Passed: no stack delivers it, so its counters are free.
    PassAny,
    /// Dropped; counted by one of these rules (none: by no rule).
    Drop(Vec<String>),
}

/// IPv6 extension headers the program walks (limiter-ebpf parse.rs).
const WALKED_EXTS: usize = 6;
/// VLAN tags the program walks.
const WALKED_TAGS: usize = 2;

fn required(frame: &[u8], loaded: &Loaded) -> Required {
    let table = &loaded.table;
    let name = |slot: Option<u32>| slot.and_then(|s| table.name_of(s)).map(str::to_string);
    let possible = |dst: IpAddr, proto: Option<u8>| -> Vec<String> {
        let protos: Vec<u8> = match proto {
            Some(p) => vec![p],
            None => vec![
                IPPROTO_TCP,
                IPPROTO_UDP,
                IPPROTO_ICMP,
                IPPROTO_ICMPV6,
                IPPROTO_GRE,
            ],
        };
        let mut out = Vec::new();
        for p in protos {
            for port in PORTS.iter().copied().chain([1]) {
                if let Some(n) = name(ruleset::classify(table, dst, Some(port), p)) {
                    if !out.contains(&n) {
                        out.push(n);
                    }
                }
            }
        }
        out
    };
    // Tags: the program refuses a frame that announces more than it walks.
    let mut at = 12;
    let mut ethertype = u16::from_be_bytes([frame[12], frame[13]]);
    at += 2;
    let mut tags = 0;
    while ethertype == 0x8100 || ethertype == 0x88a8 {
        if tags == WALKED_TAGS {
            return Required::Drop(Vec::new());
        }
        if frame.len() < at + 4 {
            return Required::PassAny;
        }
        ethertype = u16::from_be_bytes([frame[at + 2], frame[at + 3]]);
        at += 4;
        tags += 1;
    }
    // An IPv6 chain longer than the program walks, read within the frame as it does.
    if ethertype == 0x86dd && frame.len() >= at + 40 && frame[at] >> 4 == 6 {
        let dst = {
            let mut o = [0u8; 16];
            o.copy_from_slice(&frame[at + 24..at + 40]);
            IpAddr::V6(Ipv6Addr::from(o))
        };
        let mut next = frame[at + 6];
        let mut pos = at + 40;
        let mut walked = 0;
        while matches!(next, 0 | 43 | 60 | 51 | 44) && walked < WALKED_EXTS {
            let step = match next {
                44 => 8,
                51 => frame
                    .get(pos + 1)
                    .map_or(usize::MAX, |l| (usize::from(*l) + 2) * 4),
                _ => frame
                    .get(pos + 1)
                    .map_or(usize::MAX, |l| (usize::from(*l) + 1) * 8),
            };
            if next == 44 || frame.len() < pos.saturating_add(step) {
                break;
            }
            next = frame[pos];
            pos += step;
            walked += 1;
        }
        if walked == WALKED_EXTS && matches!(next, 0 | 43 | 60 | 51 | 44) {
            let rules = possible(dst, None);
            return if rules.is_empty() {
                Required::Pass(None)
            } else {
                Required::Drop(rules)
            };
        }
    }
    match evasion::parse_frame(frame) {
        Seen::Whole(d) => {
            Required::Pass(name(ruleset::classify(table, d.dst, d.dst_port, d.proto)))
        }
        Seen::Nothing => Required::PassAny,
        Seen::Fragment(_) => unreachable!("single frames are whole datagrams"),
    }
}

fn check_single(loaded: &Loaded, frame: &[u8]) -> Result<(), String> {
    let want = required(frame, loaded);
    let before = loaded.snapshot().map_err(|e| e.to_string())?;
    let verdict = loaded.run(frame).map_err(|e| format!("{e:#}"))?;
    let d = delta(&before, &loaded.snapshot().map_err(|e| e.to_string())?);
    let moved: Vec<(&String, u64, u64)> = d
        .rules
        .iter()
        .filter(|(_, c)| c.passed_packets + c.dropped_packets > 0)
        .map(|(n, c)| (n, c.passed_packets, c.dropped_packets))
        .collect();
    let ok = match &want {
        Required::Pass(None) => verdict == XDP_PASS && moved.is_empty(),
        Required::Pass(Some(rule)) => verdict == XDP_PASS && moved == [(rule, 1, 0)],
        Required::PassAny => verdict == XDP_PASS && moved.iter().all(|m| m.2 == 0),
        Required::Drop(rules) => {
            verdict == XDP_DROP
                && match moved.as_slice() {
                    [] => rules.is_empty(),
                    [(n, 0, 1)] => rules.contains(n),
                    _ => false,
                }
        }
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "required {want:?}, got verdict {verdict} with rule counters {moved:?}; frame {}",
            hex(frame)
        ))
    }
}

fn hex(f: &[u8]) -> String {
    f.iter().map(|b| format!("{b:02x}")).collect()
}

fn all_dsts() -> Vec<IpAddr> {
    vec![
        IpAddr::V4(V4_RULED),
        IpAddr::V4(V4_NET),
        IpAddr::V4(V4_OPEN),
        v6(V6_RULED),
        v6(V6_NET),
        v6(V6_OPEN),
    ]
}

/// Whole datagrams under hostile disguises (no fragments), one frame at a time.
#[test]
fn single_frames_get_the_verdict_the_model_requires() {
    let seed = seed();
    let n = cases(3000) * 10;
    println!("seed {seed}, {n} frames per build (LIMITER_FUZZ_SEED, LIMITER_FUZZ_CASES)");
    let dsts = all_dsts();
    let mut failures = Vec::new();
    for variant in Variant::ALL {
        let loaded = fixture::load_build(&rules(1_000_000, 1_000_000_000), variant)
            .expect("loading the program");
        let mut rng = Rng::new(seed);
        let mut ran = 0;
        for _ in 0..n {
            let d = random_datagram(&mut rng, &dsts);
            let mut g = hostile_disguise(&mut rng, &d);
            g.pieces.clear();
            for f in frames(&d, &g) {
                if !runs_on(variant, &f) {
                    continue;
                }
                ran += 1;
                if let Err(e) = check_single(&loaded, &f) {
                    failures.push(format!("{} build: {d:?} {g:?}: {e}", variant.as_str()));
                }
            }
        }
        assert!(
            ran > n / 2,
            "{} build: only {ran} frames ran",
            variant.as_str()
        );
    }
    assert!(
        failures.is_empty(),
        "seed {seed}: {} frames failed, first ones:\n{}",
        failures.len(),
        failures
            .iter()
            .take(8)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// Rules of the attack cases: a small burst, refilled slowly.
const BURST: u64 = 3;
const RATE: u64 = 1;

/// Fragmented, overlapped, reordered attacks: no rule's destination gets more whole
/// datagrams than the rule admits; honest datagrams alongside all arrive.
#[test]
fn fragments_and_decorations_get_no_datagram_past_a_rule() {
    let seed = seed();
    let n = cases(3000);
    println!("seed {seed}, {n} cases per build (LIMITER_FUZZ_SEED, LIMITER_FUZZ_CASES)");
    // Mostly the ruled hosts.
    let attack_dsts = [
        all_dsts(),
        vec![IpAddr::V4(V4_RULED), v6(V6_RULED)],
        vec![IpAddr::V4(V4_RULED), v6(V6_RULED)],
    ]
    .concat();
    let honest_dsts = [
        IpAddr::V4(V4_OPEN),
        IpAddr::V4(V4_ROOMY),
        v6(V6_OPEN),
        v6(V6_ROOMY),
    ];
    let mut failures = Vec::new();
    let mut delivered_attacks = 0u64;
    for variant in Variant::ALL {
        let mut loaded =
            fixture::load_build(&rules(RATE, BURST), variant).expect("loading the program");
        let slots: Vec<u32> = loaded.table.slots.values().copied().collect();
        let mut rng = Rng::new(seed);
        let mut honest_ids = 0u32;
        for case in 0..n {
            for &slot in &slots {
                loaded.maps.set_aggregate_tat(slot, 0).unwrap();
            }
            // Honest datagrams use identifications of their own, so that an attack can
            // only collide with them by guessing, and each its own, as a sender's counter
            // does not come round in the seconds a build's cases take: the program keeps
            // a datagram's first record for the destination's reassembly timeout, and
            // refuses another first fragment under its identification until then.
            let mut honest: Vec<(Datagram, Vec<Vec<u8>>)> = (0..rng.below(6) + 2)
                .map(|_| {
                    let mut d = random_datagram(&mut rng, &honest_dsts);
                    // Past 2^15 of them (long fuzz runs), from other IPv4 sources.
                    d.id = 0x8000 | (honest_ids & 0x7fff);
                    if let IpAddr::V4(src) = d.src {
                        let [a, b, _, host] = src.octets();
                        d.src = IpAddr::V4(Ipv4Addr::new(a, b, (honest_ids >> 15) as u8, host));
                    }
                    honest_ids += 1;
                    // Something to carry: an empty IPv6 payload reads as a jumbogram.
                    d.data_len = d.data_len.max(8);
                    if d.dst == IpAddr::V4(V4_ROOMY) {
                        d.proto = IPPROTO_TCP;
                        d.dst_port = 80;
                    }
                    let g = honest_disguise(&mut rng, &d);
                    (d.clone(), frames(&d, &g))
                })
                .collect();
            honest.retain(|(_, fs)| fs.iter().all(|f| runs_on(variant, f)));
            // One attack a case, repeated: a datagram and a disguise, sent as several
            // datagrams (fresh identifications) — enough that a disguise that works gets
            // more of them through than the rule admits.
            let mut template = random_datagram(&mut rng, &attack_dsts);
            if rng.chance(0.5) {
                // Aimed at a port rule of a ruled host: where hiding ports or flags pays.
                template.dst = *rng.pick(&[IpAddr::V4(V4_RULED), v6(V6_RULED)]);
                template.src = random_datagram(&mut rng, &[template.dst]).src;
                template.proto = *rng.pick(&[IPPROTO_TCP, IPPROTO_UDP]);
                template.dst_port = *rng.pick(&[443, 53]);
            }
            let disguise = hostile_disguise(&mut rng, &template);
            let attacks: Vec<Vec<Vec<u8>>> = (0..BURST * 3 + rng.below(8))
                .map(|_| {
                    let mut d = template.clone();
                    d.id = rng.next_u64() as u32 & !0x8000;
                    frames(&d, &disguise)
                })
                .collect();
            // Interleave every datagram's frames, each datagram's in its own order.
            let mut queues: Vec<std::collections::VecDeque<Vec<u8>>> = attacks
                .into_iter()
                .chain(honest.iter().map(|(_, fs)| fs.clone()))
                .map(Into::into)
                .collect();
            let mut passed = Vec::new();
            let started = Instant::now();
            while !queues.is_empty() {
                let i = rng.below(queues.len() as u64) as usize;
                let Some(f) = queues[i].pop_front() else {
                    queues.swap_remove(i);
                    continue;
                };
                if !runs_on(variant, &f) {
                    continue;
                }
                match loaded.run(&f) {
                    Ok(XDP_PASS) => passed.push(f),
                    Ok(XDP_DROP) => {}
                    Ok(v) => failures.push(format!("{} build: verdict {v}", variant.as_str())),
                    Err(e) => failures.push(format!("{} build: {e:#}", variant.as_str())),
                }
            }
            let allowed = BURST + RATE * started.elapsed().as_secs() + RATE;
            for overlap in [Overlap::FirstWins, Overlap::LastWins] {
                let mut dst = Destination::new(overlap);
                for f in &passed {
                    dst.receive(f);
                }
                let mut per_rule: BTreeMap<String, u64> = BTreeMap::new();
                for d in &dst.delivered {
                    let Some(slot) = ruleset::classify(&loaded.table, d.dst, d.dst_port, d.proto)
                    else {
                        continue;
                    };
                    let name = loaded.table.name_of(slot).unwrap().to_string();
                    let syn_rule = name.contains("syn");
                    if name.contains("roomy") || (syn_rule && !d.syn) {
                        continue;
                    }
                    *per_rule.entry(name).or_default() += 1;
                }
                for (rule, got) in &per_rule {
                    delivered_attacks += got;
                    if *got > allowed {
                        failures.push(format!(
                            "{} build, case {case}, {overlap:?}: rule {rule} admits {allowed}, \
                             its destination got {got} whole datagrams ({template:?} {disguise:?})",
                            variant.as_str()
                        ));
                    }
                }
                // Every honest datagram arrived (the overlap policy does not matter to
                // them); counted by what they are.
                for (h, _) in &honest {
                    let arrived = dst.delivered.iter().any(|d| {
                        d.dst == h.dst
                            && d.proto == h.proto
                            && (d.dst_port.is_none() || d.dst_port == Some(h.dst_port))
                    });
                    if !arrived {
                        failures.push(format!(
                            "{} build, case {case}: honest datagram {h:?} was not delivered",
                            variant.as_str()
                        ));
                    }
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "seed {seed}: {} failures, first ones:\n{}",
        failures.len(),
        failures
            .iter()
            .take(8)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    // The attacks are not all refused outright: the bound is met by metering.
    assert!(
        delivered_attacks > 0,
        "seed {seed}: no attack datagram was ever delivered"
    );
}
