//! Fragmented SYNs from outside, reassembled by this host's own stack: the program on a
//! veth end (native XDP, and the TC build), a `unit = "syn"` rule on the host end's
//! address, datagrams sent from the peer's namespace, and what the stack reassembled
//! read from its own counter (`Ip: ReasmOKs` in /proc/net/snmp; the host end has the
//! rule's address, so the fragments are delivered locally).
//!
//! - The split-header attack: each SYN split so that its first fragment carries only
//!   8 bytes of TCP (ports, no flags) and the rest follows at offset 8. The stack
//!   reassembles SYNs from them; the rule must admit no more of them than its rate and
//!   burst (the code before this test let thousands through).
//! - Honest fragmented SYNs (a first fragment with the whole TCP header): the rule's
//!   rate passes, whole.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

use std::{net::IpAddr, path::Path, time::Duration};

use limiter_tests::{
    evasion::{frames_between, Datagram, Disguise, Piece, IPPROTO_TCP, TCP_SYN},
    netns::{ifindex, ip, spawn_in_netns, VethPair},
    scenario::{PinDir, HOST_V4, PEER_V4},
    traffic::{send, PacketSocket, SendPlan},
};
use limiter_user::{
    attach::program::{LoadOptions, Program},
    config::{Config, XdpMode},
    daemon::apply_rules,
};

const RATE: u64 = 50;
const BURST: u64 = 10;
const DATAGRAMS: u32 = 3000;

/// The host stack's reassembled datagrams (all namespaces' counters are per namespace:
/// this is the root one, where the host end lives).
fn reassembled() -> u64 {
    let snmp = std::fs::read_to_string("/proc/net/snmp").expect("reading /proc/net/snmp");
    let mut ip = snmp.lines().filter(|l| l.starts_with("Ip:"));
    let (names, values) = (
        ip.next().expect("Ip: header"),
        ip.next().expect("Ip: values"),
    );
    let at = names
        .split_whitespace()
        .position(|n| n == "ReasmOKs")
        .expect("no ReasmOKs in /proc/net/snmp");
    values.split_whitespace().nth(at).unwrap().parse().unwrap()
}

/// A SYN to the host end's port 443 in two fragments, the first holding `first` bytes
/// of the TCP segment (20-byte header and 16 bytes of data).
fn syn_in_two(pair: &VethPair, id: u32, first: usize) -> Vec<Vec<u8>> {
    let d = Datagram {
        src: IpAddr::V4(PEER_V4),
        dst: IpAddr::V4(HOST_V4),
        proto: IPPROTO_TCP,
        dst_port: 443,
        flags: TCP_SYN,
        data_len: 16,
        id,
    };
    let disguise = Disguise {
        pieces: vec![
            Piece {
                offset: 0,
                len: first,
                more: true,
                rewrite: None,
                next: None,
            },
            Piece {
                offset: first,
                len: 36 - first,
                more: false,
                rewrite: None,
                next: None,
            },
        ],
        ..Disguise::default()
    };
    frames_between(&d, &disguise, pair.peer_mac, pair.host_mac)
}

/// Sends `DATAGRAMS` SYNs split at `first` bytes; returns (datagrams the stack
/// reassembled, what the rule admits over the sending time).
fn attack(mode: XdpMode, first: usize) -> (u64, f64) {
    let pair = VethPair::new(1).expect("creating the veth pair");
    ip(&["addr", "add", &format!("{HOST_V4}/32"), "dev", &pair.host]).unwrap();
    // The stack's reverse-path check then finds the sender on this link.
    ip(&["route", "add", &format!("{PEER_V4}/32"), "dev", &pair.host]).unwrap();
    let pins = PinDir::new();
    let config = Config::parse(
        &format!(
            "[[rules]]\nname = \"syn\"\ndst = \"{HOST_V4}/32\"\ndst_port = 443\nproto = \"tcp\"\n\
             unit = \"syn\"\nrate = {RATE}\nburst = {BURST}\n"
        ),
        Path::new("<fragments>"),
    )
    .unwrap();
    let mut program = Program::load(&LoadOptions {
        pin_dir: Some(pins.path.clone()),
        max_sources: 1024,
        handoff_array: None,
    })
    .expect("loading the program");
    let mut maps = program.maps().unwrap();
    apply_rules(&mut maps, &config).unwrap();
    let attachment = program.attach(&pair.host, mode).expect("attaching");
    let frames: Vec<Vec<u8>> = (0..DATAGRAMS)
        .flat_map(|id| syn_in_two(&pair, id, first))
        .collect();
    let count = frames.len() as u64;
    let before = reassembled();
    let peer = pair.peer.clone();
    let sender = spawn_in_netns(&pair.ns, move || {
        let socket = PacketSocket::bind(ifindex(&peer)?, false)?;
        send(
            &socket,
            &SendPlan {
                frames,
                rate: Some(2000),
                count,
                duration: Duration::from_secs(10),
                cpu: None,
            },
        )
    })
    .unwrap();
    let sent = sender.join().unwrap().unwrap().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let got = reassembled() - before;
    program.detach(attachment).unwrap();
    assert_eq!(sent.sent, count, "not every frame was sent");
    let admits = RATE as f64 * sent.span.as_secs_f64() + BURST as f64;
    eprintln!(
        "{mode:?}, first fragment {first} bytes of TCP: {DATAGRAMS} SYNs in {:.2}s, \
         {got} reassembled, the rule admits {admits:.0}",
        sent.span.as_secs_f64()
    );
    (got, admits)
}

fn tiny_first_fragments_get_no_syn_past(mode: XdpMode) {
    let (got, admits) = attack(mode, 8);
    assert!(
        got as f64 <= admits,
        "{mode:?}: {got} fragmented SYNs reassembled, the rule admits {admits:.0}"
    );
}

fn honest_fragments_pass_at_the_rate(mode: XdpMode) {
    let (got, admits) = attack(mode, 24);
    assert!(
        got as f64 <= admits + 1.0,
        "{mode:?}: {got} reassembled, the rule admits {admits:.0}"
    );
    assert!(
        got as f64 >= 0.8 * admits,
        "{mode:?}: only {got} honest fragmented SYNs reassembled, the rule admits {admits:.0}"
    );
}

limiter_tests::test_rows! {
    native_tiny_first_fragments_get_no_syn_past_a_syn_rule =>
        tiny_first_fragments_get_no_syn_past(XdpMode::Native);
    tc_tiny_first_fragments_get_no_syn_past_a_syn_rule =>
        tiny_first_fragments_get_no_syn_past(XdpMode::Tc);
    native_honest_fragmented_syns_pass_at_the_rate =>
        honest_fragments_pass_at_the_rate(XdpMode::Native);
    tc_honest_fragmented_syns_pass_at_the_rate => honest_fragments_pass_at_the_rate(XdpMode::Tc);
}
