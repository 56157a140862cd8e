//! Packet-verdict tables through BPF_PROG_TEST_RUN: the real program in the real kernel,
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]
//! one crafted frame per row, the expected verdict and the expected counter changes.

use std::net::{Ipv4Addr, Ipv6Addr};

use limiter_common::{
    abi::{GlobalCounters, HeaderCounters, RuleCounters, TunnelCounters},
    drop::{DropReason, ReasonCounters},
};
use limiter_fleet::clock::monotonic_ns;
use limiter_tests::{
    fixture::{self, delta, Loaded},
    frame::{self, FrameBuilder, Ipv6Ext, ETH_P_8021AD, ETH_P_8021Q, ETH_P_LLDP, TCP_ACK, TCP_SYN},
};
use limiter_user::host::object::Variant;

const XDP_ABORTED: u32 = 0;
const XDP_DROP: u32 = 1;
const XDP_PASS: u32 = 2;

/// The rule set every table row runs against. Rules that must never drop have a burst
/// no row can exhaust.
const RULES: &str = r#"
[[rules]]
name = "web-tcp443"
dst = "198.18.1.10/32"
dst_port = 443
proto = "tcp"
rate = 1000
burst = 100000

[[rules]]
name = "host-any"
dst = "198.18.1.10/32"
rate = 1000
burst = 100000

[[rules]]
name = "host-udp"
dst = "198.18.1.10/32"
proto = "udp"
rate = 1000
burst = 100000

[[rules]]
name = "host-8080"
dst = "198.18.1.10/32"
dst_port = 8080
rate = 1000
burst = 100000

[[rules]]
name = "subnet-udp"
dst = "198.18.1.0/24"
proto = "udp"
rate = 1000
burst = 100000

[[rules]]
name = "fleet-any"
dst = "198.18.0.0/15"
rate = 1000
burst = 100000

[[rules]]
name = "syn-guard"
dst = "198.18.2.20/32"
proto = "tcp"
unit = "syn"
rate = 1
burst = 1

[[rules]]
name = "tiny"
dst = "198.18.3.30/32"
rate = 1
burst = 1

[[rules]]
name = "tiny-shadow"
dst = "198.18.4.40/32"
rate = 1
burst = 1
mode = "shadow"

[[rules]]
name = "per-source"
dst = "198.18.5.50/32"
[rules.per_source]
rate = 1
burst = 1

[[rules]]
name = "bytes"
dst = "198.18.6.60/32"
unit = "bytes"
rate = 1518
burst = 3000

[[rules]]
name = "v6-host"
dst = "2001:db8::10/128"
rate = 1000
burst = 100000

[[rules]]
name = "v6-dns"
dst = "2001:db8::53/128"
dst_port = 53
proto = "udp"
rate = 1000
burst = 100000

[[rules]]
name = "v6-bytes443"
dst = "2001:db8::60/128"
dst_port = 443
proto = "udp"
unit = "bytes"
rate = 1518
burst = 100000

[[rules]]
name = "v6-icmp"
dst = "2001:db8::/32"
proto = "icmp"
rate = 1000
burst = 100000
"#;

/// Which counter a row expects to move.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    /// Rule `name`: packets passed, dropped, would-drop over all runs of the row.
    Rule(&'static str, u64, u64, u64),
    Malformed,
    NonIp,
    Unmatched,
    /// No rule and no global counter.
    None,
}

struct Row {
    what: String,
    frame: Vec<u8>,
    runs: u32,
    verdict: u32,
    expect: Expect,
    /// Header counters the row moves (fragments, refused tricks); zero unless said.
    headers: HeaderCounters,
    /// Of the rule's refusals, those before its aggregate (per source, or unmetered).
    early: u64,
    /// Tunnel counters the row moves; zero unless said.
    tunnels: TunnelCounters,
    /// Why the row's refusals are refused: its rule's dropped and would-drop packets are
    /// expected under this reason in `DROP_REASONS` (a row without a rule: under
    /// `NO_RULE`, every run dropped). A refusing row must name it.
    reason: Option<DropReason>,
}

fn row(what: impl Into<String>, frame: Vec<u8>, verdict: u32, expect: Expect) -> Row {
    Row {
        what: what.into(),
        frame,
        runs: 1,
        verdict,
        expect,
        headers: HeaderCounters::default(),
        early: 0,
        tunnels: TunnelCounters::default(),
        reason: None,
    }
}

impl Row {
    /// Expects these header counters to move by `runs` each.
    fn counting(mut self, fields: &[fn(&mut HeaderCounters) -> &mut u64]) -> Row {
        for field in fields {
            *field(&mut self.headers) += u64::from(self.runs);
        }
        self
    }

    /// Expects the frame to be classified by its inner header.
    fn decapsulated(mut self) -> Row {
        self.tunnels.decapsulated += u64::from(self.runs);
        self
    }

    /// Expects the row's refusals to be counted under `reason`.
    fn because(mut self, reason: DropReason) -> Row {
        self.reason = Some(reason);
        self
    }

    /// Expects `n` of the rule's refusals to come before its aggregate (per source, or
    /// refused unmetered): no demand for a fleet share.
    fn refused_early(mut self, n: u64) -> Row {
        self.early = n;
        self
    }
}

fn fragments(h: &mut HeaderCounters) -> &mut u64 {
    &mut h.fragments
}
fn tiny(h: &mut HeaderCounters) -> &mut u64 {
    &mut h.tiny_fragments
}
fn orphan(h: &mut HeaderCounters) -> &mut u64 {
    &mut h.orphan_fragments
}
fn overlapping(h: &mut HeaderCounters) -> &mut u64 {
    &mut h.overlapping_fragments
}
fn long_chain(h: &mut HeaderCounters) -> &mut u64 {
    &mut h.long_header_chains
}
fn deep_vlan(h: &mut HeaderCounters) -> &mut u64 {
    &mut h.deep_vlan_stacks
}

fn repeated(what: &str, frame: Vec<u8>, runs: u32, verdict: u32, expect: Expect) -> Row {
    Row {
        runs,
        ..row(what, frame, verdict, expect)
    }
}

fn v4(dst: [u8; 4]) -> FrameBuilder {
    FrameBuilder::ipv4(Ipv4Addr::new(198, 19, 200, 1), Ipv4Addr::from(dst))
}

fn v6(dst: &str) -> FrameBuilder {
    let dst: Ipv6Addr = dst.parse().unwrap_or(Ipv6Addr::UNSPECIFIED);
    FrameBuilder::ipv6(
        "2001:db8:ffff::1".parse().unwrap_or(Ipv6Addr::UNSPECIFIED),
        dst,
    )
}

const WEB: [u8; 4] = [198, 18, 1, 10];
const PASS_WEB: Expect = Expect::Rule("web-tcp443", 1, 0, 0);
const PASS_HOST: Expect = Expect::Rule("host-any", 1, 0, 0);
const PASS_V6: Expect = Expect::Rule("v6-host", 1, 0, 0);

fn parser_rows() -> Vec<Row> {
    let mut rows = Vec::new();
    for words in 0..=10 {
        rows.push(row(
            format!("IPv4 IHL {}", 5 + words),
            v4(WEB).ipv4_options(words).tcp(40000, 443, TCP_ACK).build(),
            XDP_PASS,
            PASS_WEB,
        ));
    }
    for ihl in [0u8, 4] {
        let mut f = v4(WEB).tcp(40000, 443, TCP_ACK).build();
        frame::set_ipv4_ihl(&mut f, ihl).unwrap();
        rows.push(row(
            format!("IPv4 IHL {ihl}"),
            f,
            XDP_PASS,
            Expect::Malformed,
        ));
    }
    let mut f = v4(WEB).ipv4_options(2).tcp(40000, 443, TCP_ACK).build();
    frame::set_ipv4_total_len(&mut f, 24).unwrap();
    rows.push(row(
        "IPv4 total length 24 < IHL 7 header",
        f,
        XDP_PASS,
        Expect::Malformed,
    ));
    let mut f = v4(WEB).tcp(40000, 443, TCP_ACK).build();
    let l3 = frame::l3_offset(&f).unwrap();
    f[l3] = 0x65;
    rows.push(row(
        "IPv4 ethertype, version 6 header",
        f,
        XDP_PASS,
        Expect::Malformed,
    ));
    rows.push(row(
        "IPv4 TCP header cut short",
        {
            let mut f = v4(WEB).tcp(40000, 443, TCP_ACK).build();
            let l4 = frame::l3_offset(&f).unwrap() + 20;
            f.truncate(l4 + 10);
            f
        },
        XDP_PASS,
        Expect::Malformed,
    ));
    let exts = [
        ("hop-by-hop", Ipv6Ext::HopByHop),
        ("routing", Ipv6Ext::Routing),
        (
            "fragment (first)",
            Ipv6Ext::Fragment {
                offset: 0,
                more: true,
            },
        ),
        ("destination options", Ipv6Ext::DestOpts),
        ("AH", Ipv6Ext::Ah),
        ("long hop-by-hop", Ipv6Ext::HopByHopLen(20)),
    ];
    for (name, ext) in exts {
        let r = row(
            format!("IPv6 {name} then UDP"),
            v6("2001:db8::10").ipv6_ext(ext).udp(5353, 53).build(),
            XDP_PASS,
            PASS_V6,
        );
        rows.push(if matches!(ext, Ipv6Ext::Fragment { .. }) {
            r.counting(&[fragments])
        } else {
            r
        });
    }
    rows.push(
        row(
            "IPv6 later fragment without a record, port-less rule: metered as it is",
            v6("2001:db8::10")
                .ip_id(0x6001)
                .ipv6_ext(Ipv6Ext::Fragment {
                    offset: 10,
                    more: false,
                })
                .udp(5353, 53)
                .payload_len(32)
                .build(),
            XDP_PASS,
            PASS_V6,
        )
        .counting(&[fragments]),
    );
    let mut six = v6("2001:db8::10");
    for _ in 0..6 {
        six = six.ipv6_ext(Ipv6Ext::DestOpts);
    }
    rows.push(row(
        "IPv6 six extension headers (the walk bound)",
        six.clone().udp(5353, 53).build(),
        XDP_PASS,
        PASS_V6,
    ));
    rows.push(
        row(
            "IPv6 seven extension headers (beyond the walk bound): refused",
            six.ipv6_ext(Ipv6Ext::DestOpts).udp(5353, 53).build(),
            XDP_DROP,
            Expect::Rule("v6-host", 0, 1, 0),
        )
        .counting(&[long_chain])
        .because(DropReason::LongHeaderChain)
        .refused_early(1),
    );
    rows.push(row(
        "802.1Q",
        v4(WEB)
            .vlan(ETH_P_8021Q, 10)
            .tcp(40000, 443, TCP_ACK)
            .build(),
        XDP_PASS,
        PASS_WEB,
    ));
    rows.push(row(
        "QinQ",
        v4(WEB)
            .vlan(ETH_P_8021AD, 100)
            .vlan(ETH_P_8021Q, 10)
            .tcp(40000, 443, TCP_ACK)
            .build(),
        XDP_PASS,
        PASS_WEB,
    ));
    rows.push(
        row(
            "three VLAN tags: dropped (the destination cannot be seen)",
            v4(WEB)
                .vlan(ETH_P_8021AD, 100)
                .vlan(ETH_P_8021Q, 10)
                .vlan(ETH_P_8021Q, 11)
                .tcp(40000, 443, TCP_ACK)
                .build(),
            XDP_DROP,
            Expect::None,
        )
        .counting(&[deep_vlan])
        .because(DropReason::DeepVlan),
    );
    rows.push(row(
        "ARP",
        FrameBuilder::arp().build(),
        XDP_PASS,
        Expect::NonIp,
    ));
    rows.push(row(
        "LLDP",
        FrameBuilder::ethertype(ETH_P_LLDP, &[0x02, 0x07, 0x04]).build(),
        XDP_PASS,
        Expect::NonIp,
    ));
    rows.push(row(
        "IPv6 in 802.1Q",
        v6("2001:db8::10").vlan(ETH_P_8021Q, 7).udp(1, 2).build(),
        XDP_PASS,
        PASS_V6,
    ));
    rows.push(row(
        "9000-byte frame",
        v4(WEB).tcp(40000, 80, TCP_ACK).frame_len(9000).build(),
        XDP_PASS,
        PASS_HOST,
    ));
    rows
}

fn classification_rows() -> Vec<Row> {
    let udp_net = [198, 18, 1, 77];
    vec![
        row(
            "exact port and proto",
            v4(WEB).tcp(1, 443, TCP_ACK).build(),
            XDP_PASS,
            PASS_WEB,
        ),
        row(
            "other port falls back to the prefix's any-port rule",
            v4(WEB).tcp(1, 80, TCP_ACK).build(),
            XDP_PASS,
            PASS_HOST,
        ),
        row(
            "exact proto beats any proto",
            v4(WEB).udp(1, 443).build(),
            XDP_PASS,
            Expect::Rule("host-udp", 1, 0, 0),
        ),
        row(
            "exact port beats exact proto (UDP)",
            v4(WEB).udp(1, 8080).build(),
            XDP_PASS,
            Expect::Rule("host-8080", 1, 0, 0),
        ),
        row(
            "exact port, any proto (TCP)",
            v4(WEB).tcp(1, 8080, TCP_ACK).build(),
            XDP_PASS,
            Expect::Rule("host-8080", 1, 0, 0),
        ),
        row(
            "ICMP has no port: the host's any-proto rule",
            v4(WEB).icmp_echo().build(),
            XDP_PASS,
            PASS_HOST,
        ),
        row(
            "longer prefix wins (/24 UDP over /15)",
            v4(udp_net).udp(1, 53).build(),
            XDP_PASS,
            Expect::Rule("subnet-udp", 1, 0, 0),
        ),
        row(
            "covering prefix when the longer one's rules don't fit (TCP in the UDP /24)",
            v4(udp_net).tcp(1, 53, TCP_ACK).build(),
            XDP_PASS,
            Expect::Rule("fleet-any", 1, 0, 0),
        ),
        row(
            "the /15's upper half",
            v4([198, 19, 7, 7]).udp(1, 53).build(),
            XDP_PASS,
            Expect::Rule("fleet-any", 1, 0, 0),
        ),
        row(
            "outside every rule",
            v4([198, 20, 0, 1]).udp(1, 53).build(),
            XDP_PASS,
            Expect::Unmatched,
        ),
        row(
            "ICMPv6 under an icmp rule",
            v6("2001:db8::99").icmp_echo().build(),
            XDP_PASS,
            Expect::Rule("v6-icmp", 1, 0, 0),
        ),
        row(
            "UDP to the same v6 /32 is not icmp",
            v6("2001:db8::99").udp(1, 53).build(),
            XDP_PASS,
            Expect::Unmatched,
        ),
        row(
            "v6 host rule",
            v6("2001:db8::10").tcp(1, 22, TCP_SYN).build(),
            XDP_PASS,
            PASS_V6,
        ),
    ]
}

/// Rows that depend on bucket state; they run in order, after the stateless ones.
fn metering_rows() -> Vec<Row> {
    let syn_host = [198, 18, 2, 20];
    let per_source = |src: [u8; 4]| {
        FrameBuilder::ipv4(Ipv4Addr::from(src), Ipv4Addr::new(198, 18, 5, 50))
            .udp(1, 53)
            .build()
    };
    vec![
        row(
            "first SYN under a syn rule (burst 1)",
            v4(syn_host).tcp(1, 443, TCP_SYN).build(),
            XDP_PASS,
            Expect::Rule("syn-guard", 1, 0, 0),
        ),
        row(
            "second SYN is over the limit",
            v4(syn_host).tcp(2, 443, TCP_SYN).build(),
            XDP_DROP,
            Expect::Rule("syn-guard", 0, 1, 0),
        )
        .because(DropReason::Aggregate),
        repeated(
            "SYN-ACK is not metered",
            v4(syn_host).tcp(1, 443, TCP_SYN | TCP_ACK).build(),
            10,
            XDP_PASS,
            Expect::Rule("syn-guard", 10, 0, 0),
        ),
        repeated(
            "ACK is not metered",
            v4(syn_host).tcp(1, 443, TCP_ACK).build(),
            10,
            XDP_PASS,
            Expect::Rule("syn-guard", 10, 0, 0),
        ),
        repeated(
            "enforce: burst 1, then drops",
            v4([198, 18, 3, 30]).udp(1, 53).build(),
            5,
            XDP_DROP,
            Expect::Rule("tiny", 1, 4, 0),
        )
        .because(DropReason::Aggregate),
        repeated(
            "shadow: passes all, counts would-drop",
            v4([198, 18, 4, 40]).udp(1, 53).build(),
            5,
            XDP_PASS,
            Expect::Rule("tiny-shadow", 5, 0, 4),
        )
        .because(DropReason::Aggregate),
        repeated(
            "per-source: source A over its limit",
            per_source([198, 19, 0, 1]),
            3,
            XDP_DROP,
            Expect::Rule("per-source", 1, 2, 0),
        )
        .refused_early(2)
        .because(DropReason::PerSource),
        row(
            "per-source: source B has its own bucket",
            per_source([198, 19, 0, 2]),
            XDP_PASS,
            Expect::Rule("per-source", 1, 0, 0),
        ),
        repeated(
            "bytes: 1000-byte frames against a 3000-byte burst",
            v4([198, 18, 6, 60]).udp(1, 53).frame_len(1000).build(),
            4,
            XDP_DROP,
            Expect::Rule("bytes", 3, 1, 0),
        )
        .because(DropReason::Aggregate),
    ]
}

/// Sets an IPv6 frame's Payload Length.
fn set_ipv6_payload_len(frame: &mut [u8], len: u16) {
    let l3 = frame::l3_offset(frame).unwrap();
    frame[l3 + 4..l3 + 6].copy_from_slice(&len.to_be_bytes());
}

/// A fragment of datagram `id` to 2001:db8::60 (rule `v6-bytes443`) at `offset`.
fn v6_tail_target(id: u16, offset: u16, more: bool) -> FrameBuilder {
    v6("2001:db8::60")
        .ip_id(id)
        .ipv6_ext(Ipv6Ext::Fragment { offset, more })
}

/// Fragments and the tricks they allow, in order: rows leave records that later rows
/// (same identification) rely on. Rules `web-tcp443` and `host-8080` make the ports of
/// 198.18.1.10's datagrams matter; `v6-dns` those of 2001:db8::53.
fn fragment_rows() -> Vec<Row> {
    let web = |id: u16| v4(WEB).ip_id(id);
    let mut rows = vec![
        row(
            "IPv4 first fragment: classified by its ports",
            web(0x100)
                .ipv4_fragment(0, true)
                .tcp(40000, 443, TCP_ACK)
                .payload_len(64)
                .build(),
            XDP_PASS,
            PASS_WEB,
        )
        .counting(&[fragments]),
        row(
            "IPv4 later fragment: classified by its first fragment's record",
            web(0x100)
                .ipv4_fragment(11, false)
                .tcp(40000, 443, TCP_ACK)
                .payload_len(64)
                .build(),
            XDP_PASS,
            PASS_WEB,
        )
        .counting(&[fragments]),
        row(
            "IPv4 later fragment overlapping the first one's headers (offset 1): refused",
            web(0x100)
                .ipv4_fragment(1, false)
                .tcp(40000, 443, TCP_ACK)
                .payload_len(64)
                .build(),
            XDP_DROP,
            Expect::Rule("web-tcp443", 0, 1, 0),
        )
        .counting(&[fragments, overlapping])
        .because(DropReason::OverlappingFragment)
        .refused_early(1),
        row(
            "IPv4 later fragment, first never seen, ports matter: refused (orphan)",
            web(0x101)
                .ipv4_fragment(11, false)
                .tcp(40000, 443, TCP_ACK)
                .payload_len(64)
                .build(),
            XDP_DROP,
            Expect::Rule("web-tcp443", 0, 1, 0),
        )
        .counting(&[fragments, orphan])
        .because(DropReason::OrphanFragment)
        .refused_early(1),
        row(
            "IPv4 first fragment of an unmatched port: passes, leaves a record",
            web(0x102)
                .ipv4_fragment(0, true)
                .udp(40000, 9)
                .payload_len(64)
                .build(),
            XDP_PASS,
            Expect::Rule("host-udp", 1, 0, 0),
        )
        .counting(&[fragments]),
        row(
            "IPv4 later fragment of it: the record's rule",
            web(0x102)
                .ipv4_fragment(9, false)
                .udp(40000, 9)
                .payload_len(64)
                .build(),
            XDP_PASS,
            Expect::Rule("host-udp", 1, 0, 0),
        )
        .counting(&[fragments]),
        row(
            "IPv4 later ICMP fragment: no ports, classified as it is",
            web(0x103)
                .ipv4_fragment(20, false)
                .proto(1)
                .payload_len(64)
                .build(),
            XDP_PASS,
            PASS_HOST,
        )
        .counting(&[fragments]),
        row(
            "IPv4 later fragment to a destination no rule covers",
            v4([198, 20, 0, 1])
                .ipv4_fragment(11, false)
                .tcp(1, 443, TCP_SYN)
                .payload_len(64)
                .build(),
            XDP_PASS,
            Expect::Unmatched,
        )
        .counting(&[fragments]),
        row(
            "IPv6 first fragment: classified by its ports",
            v6("2001:db8::53")
                .ip_id(0x200)
                .ipv6_ext(Ipv6Ext::Fragment {
                    offset: 0,
                    more: true,
                })
                .udp(5353, 53)
                .payload_len(64)
                .build(),
            XDP_PASS,
            Expect::Rule("v6-dns", 1, 0, 0),
        )
        .counting(&[fragments]),
        row(
            "IPv6 later fragment: the record's rule",
            v6("2001:db8::53")
                .ip_id(0x200)
                .ipv6_ext(Ipv6Ext::Fragment {
                    offset: 9,
                    more: false,
                })
                .udp(5353, 53)
                .payload_len(64)
                .build(),
            XDP_PASS,
            Expect::Rule("v6-dns", 1, 0, 0),
        )
        .counting(&[fragments]),
        row(
            "IPv6 later fragment without a record, ports matter: refused (orphan)",
            v6("2001:db8::53")
                .ip_id(0x201)
                .ipv6_ext(Ipv6Ext::Fragment {
                    offset: 9,
                    more: false,
                })
                .udp(5353, 53)
                .payload_len(64)
                .build(),
            XDP_DROP,
            Expect::Rule("v6-dns", 0, 1, 0),
        )
        .counting(&[fragments, orphan])
        .because(DropReason::OrphanFragment)
        .refused_early(1),
        row(
            "IPv6 first fragment to a bytes rule's port",
            v6_tail_target(0x210, 0, true)
                .udp(5353, 443)
                .payload_len(64)
                .build(),
            XDP_PASS,
            Expect::Rule("v6-bytes443", 1, 0, 0),
        )
        .counting(&[fragments]),
    ];
    // Later fragments of it whose own Fragment header claims another Next Header: the
    // destination takes the datagram's from its first fragment (offset 0) only, so each
    // is charged to the first fragment's rule, bytes included.
    for (claim, nh) in [("no next header (59)", 59u8), ("ICMPv6", 58), ("TCP", 6)] {
        rows.push(
            row(
                format!("IPv6 later fragment claiming {claim}: the first fragment's rule"),
                v6_tail_target(0x210, 9, true)
                    .proto(nh)
                    .payload_len(64)
                    .build(),
                XDP_PASS,
                Expect::Rule("v6-bytes443", 1, 0, 0),
            )
            .counting(&[fragments]),
        );
        rows.push(
            row(
                format!("IPv6 later fragment claiming {claim}, no record, ports matter: refused (orphan)"),
                v6_tail_target(0x211, 9, false).proto(nh).payload_len(64).build(),
                XDP_DROP,
                Expect::Rule("v6-bytes443", 0, 1, 0),
            )
            .counting(&[fragments, orphan])
        .because(DropReason::OrphanFragment)
            .refused_early(1),
        );
    }
    rows.extend([row(
        "IPv6 atomic fragment (offset 0, no more): a whole datagram",
        v6("2001:db8::53")
            .ipv6_ext(Ipv6Ext::Fragment {
                offset: 0,
                more: false,
            })
            .udp(5353, 53)
            .build(),
        XDP_PASS,
        Expect::Rule("v6-dns", 1, 0, 0),
    )]);
    // A decoy: a second first fragment under the identification of a datagram in
    // reassembly, to another port. The destination keeps the first one, so the later
    // fragments are its datagram's.
    let first_443 = || {
        web(0x120)
            .ipv4_fragment(0, true)
            .tcp(40000, 443, TCP_ACK)
            .payload_len(64)
    };
    rows.extend([
        row(
            "IPv4 first fragment to :443",
            first_443().build(),
            XDP_PASS,
            PASS_WEB,
        )
        .counting(&[fragments]),
        row(
            "IPv4 second first fragment, same identification, another port: refused",
            web(0x120)
                .ipv4_fragment(0, true)
                .tcp(40000, 9, TCP_ACK)
                .payload_len(64)
                .build(),
            XDP_DROP,
            Expect::Rule("host-any", 0, 1, 0),
        )
        .counting(&[fragments, overlapping])
        .because(DropReason::OverlappingFragment)
        .refused_early(1),
        row(
            "IPv4 later fragment after the decoy: the first fragment's rule",
            web(0x120)
                .ipv4_fragment(11, false)
                .tcp(40000, 443, TCP_ACK)
                .payload_len(64)
                .build(),
            XDP_PASS,
            PASS_WEB,
        )
        .counting(&[fragments]),
        row(
            "IPv4 first fragment again, same headers (a duplicate): metered",
            first_443().build(),
            XDP_PASS,
            PASS_WEB,
        )
        .counting(&[fragments]),
        row(
            "IPv6 first fragment to :443",
            v6_tail_target(0x220, 0, true)
                .udp(5353, 443)
                .payload_len(64)
                .build(),
            XDP_PASS,
            Expect::Rule("v6-bytes443", 1, 0, 0),
        )
        .counting(&[fragments]),
        row(
            "IPv6 second first fragment, same identification, ICMPv6: refused",
            v6_tail_target(0x220, 0, true)
                .proto(58)
                .payload_len(64)
                .build(),
            XDP_DROP,
            Expect::Rule("v6-icmp", 0, 1, 0),
        )
        .counting(&[fragments, overlapping])
        .because(DropReason::OverlappingFragment)
        .refused_early(1),
        row(
            "IPv6 later fragment after the decoy: the first fragment's rule",
            v6_tail_target(0x220, 9, false)
                .proto(58)
                .payload_len(64)
                .build(),
            XDP_PASS,
            Expect::Rule("v6-bytes443", 1, 0, 0),
        )
        .counting(&[fragments]),
    ]);
    // A first fragment holding 8 bytes of TCP (ports, no flags); its Total Length says
    // so, and the frame ends there or is padded with a whole TCP header's worth of bytes
    // that the destination ignores.
    for padded in [false, true] {
        let mut f = web(0x104)
            .ipv4_fragment(0, true)
            .tcp(40000, 443, TCP_ACK)
            .build();
        let l3 = frame::l3_offset(&f).unwrap();
        frame::set_ipv4_total_len(&mut f, 20 + 8).unwrap();
        if !padded {
            f.truncate(l3 + 28);
        }
        rows.push(
            row(
                format!("IPv4 tiny first fragment (8 bytes of TCP, padded: {padded}): refused"),
                f,
                XDP_DROP,
                Expect::Rule("web-tcp443", 0, 1, 0),
            )
            .counting(&[fragments, tiny])
            .because(DropReason::TinyFragment)
            .refused_early(1),
        );
    }
    let mut f = v4([198, 20, 0, 1])
        .ipv4_fragment(0, true)
        .tcp(40000, 443, TCP_SYN)
        .build();
    frame::set_ipv4_total_len(&mut f, 20 + 8).unwrap();
    rows.push(
        row(
            "IPv4 tiny first fragment to a destination no rule covers: passed",
            f,
            XDP_PASS,
            Expect::Unmatched,
        )
        .counting(&[fragments, tiny]),
    );
    // A whole datagram (not a fragment) whose TCP header lies in the padding: the
    // destination drops it as truncated.
    let mut f = v4(WEB).tcp(40000, 443, TCP_SYN).build();
    frame::set_ipv4_total_len(&mut f, 20 + 8).unwrap();
    rows.push(row(
        "IPv4 whole datagram, TCP header only in the padding: malformed",
        f,
        XDP_PASS,
        Expect::Malformed,
    ));
    // An IPv6 first fragment whose header chain goes on past it (RFC 7112).
    let mut f = v6("2001:db8::53")
        .ip_id(0x202)
        .ipv6_ext(Ipv6Ext::Fragment {
            offset: 0,
            more: true,
        })
        .ipv6_ext(Ipv6Ext::DestOpts)
        .udp(5353, 53)
        .payload_len(64)
        .build();
    set_ipv6_payload_len(&mut f, 8 + 8);
    rows.push(
        row(
            "IPv6 first fragment without its whole header chain: refused",
            f,
            XDP_DROP,
            Expect::Rule("v6-dns", 0, 1, 0),
        )
        .counting(&[fragments, tiny])
        .because(DropReason::TinyFragment)
        .refused_early(1),
    );
    rows
}

fn check(loaded: &Loaded, row: &Row) -> Result<(), String> {
    let before = loaded.snapshot().map_err(|e| e.to_string())?;
    let (verdict, _) = loaded
        .run_repeat(&row.frame, row.runs)
        .map_err(|e| format!("{e:#}"))?;
    let after = loaded.snapshot().map_err(|e| e.to_string())?;
    let d = delta(&before, &after);
    let len = row.frame.len() as u64;
    let mut want_global = GlobalCounters::default();
    let mut want_rule: Option<(&str, RuleCounters)> = None;
    let runs = u64::from(row.runs);
    match row.expect {
        Expect::Rule(name, passed, dropped, would_drop) => {
            want_rule = Some((
                name,
                RuleCounters {
                    passed_packets: passed,
                    passed_bytes: passed * len,
                    dropped_packets: dropped,
                    dropped_bytes: dropped * len,
                    would_drop_packets: would_drop,
                    would_drop_bytes: would_drop * len,
                    refused_early_packets: row.early,
                    refused_early_bytes: row.early * len,
                },
            ))
        }
        Expect::Malformed => want_global.malformed = runs,
        Expect::NonIp => want_global.non_ip = runs,
        Expect::Unmatched => want_global.unmatched = runs,
        Expect::None => {}
    }
    let mut problems = Vec::new();
    if verdict != row.verdict {
        problems.push(format!("verdict {verdict}, expected {}", row.verdict));
    }
    if d.global != want_global {
        problems.push(format!("global {:?}, expected {want_global:?}", d.global));
    }
    if d.tunnels != row.tunnels {
        problems.push(format!(
            "tunnels {:?}, expected {:?}",
            d.tunnels, row.tunnels
        ));
    }
    if d.headers != row.headers {
        problems.push(format!(
            "headers {:?}, expected {:?}",
            d.headers, row.headers
        ));
    }
    for (name, counters) in &d.rules {
        let want = match want_rule {
            Some((n, c)) if n == name => c,
            _ => RuleCounters::default(),
        };
        if *counters != want {
            problems.push(format!("rule {name}: {counters:?}, expected {want:?}"));
        }
    }
    problems.extend(reason_problems(row, &d));
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!("{}: {}", row.what, problems.join("; ")))
    }
}

/// What the row's reason counters should have done, and the invariant every row keeps:
/// a rule's reasons add up to its dropped and would-drop packets.
fn reason_problems(row: &Row, d: &fixture::Snapshot) -> Vec<String> {
    let mut problems = Vec::new();
    let mut want_rule: Option<(&str, ReasonCounters)> = None;
    let mut want_no_rule = ReasonCounters::default();
    match (row.expect, row.reason) {
        (Expect::Rule(name, _, dropped, would_drop), Some(reason)) => {
            let mut want = ReasonCounters::default();
            want.dropped_packets[reason as usize] = dropped;
            want.would_drop_packets[reason as usize] = would_drop;
            want_rule = Some((name, want));
        }
        (Expect::Rule(_, _, dropped, would_drop), None) if dropped + would_drop > 0 => {
            problems.push("the row refuses but names no reason".to_string());
        }
        (_, Some(reason)) => {
            want_no_rule.dropped_packets[reason as usize] = u64::from(row.runs);
        }
        _ => {}
    }
    for (name, reasons) in &d.reasons {
        let want = match want_rule {
            Some((n, c)) if n == name => c,
            _ => ReasonCounters::default(),
        };
        if *reasons != want {
            problems.push(format!(
                "rule {name} reasons: {:?}, expected {:?}",
                reasons.nonzero().collect::<Vec<_>>(),
                want.nonzero().collect::<Vec<_>>()
            ));
        }
        let counters = d.rules.get(name).copied().unwrap_or_default();
        if reasons.dropped_total() != counters.dropped_packets
            || reasons.would_drop_total() != counters.would_drop_packets
        {
            problems.push(format!(
                "rule {name}: reasons add up to {} dropped / {} would-drop, the rule counted \
                 {} / {}",
                reasons.dropped_total(),
                reasons.would_drop_total(),
                counters.dropped_packets,
                counters.would_drop_packets
            ));
        }
    }
    if d.no_rule != want_no_rule {
        problems.push(format!(
            "no-rule reasons: {:?}, expected {:?}",
            d.no_rule.nonzero().collect::<Vec<_>>(),
            want_no_rule.nonzero().collect::<Vec<_>>()
        ));
    }
    problems
}

/// Longest frame BPF_PROG_TEST_RUN hands the linear build (one 4 KiB page less XDP
/// headroom and skb_shared_info); longer ones need the multi-buffer build, which runs
/// every row.
const LINEAR_MAX_FRAME: usize = 4096 - 256 - 320;

/// Shortest frame BPF_PROG_TEST_RUN runs an XDP program on: an Ethernet header.
const XDP_MIN_FRAME: usize = 14;
/// Shortest frame it runs a TC program on: it refuses IPv4 frames shorter than an IPv4
/// header after Ethernet (34 bytes) and IPv6 ones shorter than an IPv6 header (54);
/// the XDP builds run the same parser on every truncation.
const TC_MIN_FRAME: usize = 54;

/// Runs every row on every build of the program (both XDP builds, the TC build, and the
/// libxdp component's build, run here as a plain XDP program), each with maps of its own.
fn run_table(rows: &[Row]) {
    run_table_with(RULES, rows);
}

/// [`run_table`] with another config.
fn run_table_with(config: &str, rows: &[Row]) {
    run_table_prepared(config, rows, |_| {});
}

/// [`run_table_with`], with `prepare` run on each build's maps once the config's rules
/// are installed, before the rows (the fleet's state, as the daemon writes it).
fn run_table_prepared(config: &str, rows: &[Row], prepare: impl Fn(&mut Loaded)) {
    let mut failures = Vec::new();
    for variant in Variant::ALL.into_iter().chain([Variant::Libxdp]) {
        let mut loaded = fixture::load_build(config, variant)
            .expect("loading the program's build with the test rules");
        prepare(&mut loaded);
        let rows: Vec<&Row> = rows
            .iter()
            .filter(|r| match variant {
                Variant::MultiBuffer => true,
                Variant::Linear | Variant::Libxdp => r.frame.len() <= LINEAR_MAX_FRAME,
                Variant::Tc => (TC_MIN_FRAME..=LINEAR_MAX_FRAME).contains(&r.frame.len()),
            })
            .collect();
        assert!(
            !rows.is_empty(),
            "no rows for the {} build",
            variant.as_str()
        );
        failures.extend(
            rows.iter()
                .filter_map(|r| check(&loaded, r).err())
                .map(|e| format!("{} build: {e}", variant.as_str())),
        );
    }
    assert!(
        failures.is_empty(),
        "{} rows failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Decapsulation on the interface BPF_PROG_TEST_RUN runs frames as arriving on (the
/// loopback device, for XDP and TC test runs alike).
const TUNNELS: &str = r#"
[[tunnels]]
interface = "lo"
decapsulate = ["ipip", "6in4", "gre", "fou:5555", "gue:6080"]
"#;

/// The tunnel endpoint's addresses: in 198.18.0.0/15 (rule "fleet-any" covers it) and in
/// 2001:db8::/32 (only an ICMP rule covers it).
const ENDPOINT_V4: [u8; 4] = [198, 19, 100, 1];
const ENDPOINT_V6: &str = "2001:db8:100::1";

/// The inner datagrams: TCP to the web rule, UDP to the IPv6 host rule.
fn inner_web() -> Vec<u8> {
    frame::ip_datagram(&v4(WEB).tcp(40000, 443, TCP_ACK).payload_len(32).build()).to_vec()
}
fn inner_v6() -> Vec<u8> {
    frame::ip_datagram(&v6("2001:db8::10").udp(40000, 9000).payload_len(32).build()).to_vec()
}

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

/// Every encapsulation, and what goes with it, with decapsulation on (`decapsulating`) or
/// off on the frames' interface: on, a frame is classified by its inner header; off, by
/// its outer one, as before.
fn tunnel_rows(decapsulating: bool) -> Vec<Row> {
    const IPPROTO_IPIP: u8 = 4;
    const IPPROTO_IPV6: u8 = 41;
    const IPPROTO_GRE: u8 = 47;
    let outer_v4 = || v4(ENDPOINT_V4);
    let outer_v6 = || v6(ENDPOINT_V6);
    let fleet = Expect::Rule("fleet-any", 1, 0, 0);
    let (web, v6_host) = (inner_web(), inner_v6());
    // (what, frame, verdict and counters on, off)
    let cases: Vec<(&str, Vec<u8>, Expect, Expect)> = vec![
        (
            "IPIP, IPv4 in IPv4",
            outer_v4().proto(IPPROTO_IPIP).payload(&web).build(),
            PASS_WEB,
            fleet,
        ),
        (
            "IPIP, IPv4 in IPv6",
            outer_v6().proto(IPPROTO_IPIP).payload(&web).build(),
            PASS_WEB,
            Expect::Unmatched,
        ),
        (
            "6in4, IPv6 in IPv4",
            outer_v4().proto(IPPROTO_IPV6).payload(&v6_host).build(),
            PASS_V6,
            fleet,
        ),
        (
            "IPv6 in IPv6",
            outer_v6().proto(IPPROTO_IPV6).payload(&v6_host).build(),
            PASS_V6,
            Expect::Unmatched,
        ),
        (
            "IPIP with outer IPv4 options",
            outer_v4()
                .ipv4_options(3)
                .proto(IPPROTO_IPIP)
                .payload(&web)
                .build(),
            PASS_WEB,
            fleet,
        ),
        (
            "IPIP behind a VLAN tag",
            outer_v4()
                .vlan(ETH_P_8021Q, 7)
                .proto(IPPROTO_IPIP)
                .payload(&web)
                .build(),
            PASS_WEB,
            fleet,
        ),
        (
            "GRE, IPv4 in IPv4",
            outer_v4()
                .proto(IPPROTO_GRE)
                .payload(&cat(&[
                    &frame::gre_header(frame::GRE_IPV4, false, None, None),
                    &web,
                ]))
                .build(),
            PASS_WEB,
            fleet,
        ),
        (
            "GRE with checksum, key and sequence number, IPv6 in IPv4",
            outer_v4()
                .proto(IPPROTO_GRE)
                .payload(&cat(&[
                    &frame::gre_header(frame::GRE_IPV6, true, Some(7), Some(1)),
                    &v6_host,
                ]))
                .build(),
            PASS_V6,
            fleet,
        ),
        (
            "GRE, IPv4 in IPv6",
            outer_v6()
                .proto(IPPROTO_GRE)
                .payload(&cat(&[
                    &frame::gre_header(frame::GRE_IPV4, false, Some(9), None),
                    &web,
                ]))
                .build(),
            PASS_WEB,
            Expect::Unmatched,
        ),
        (
            "FOU on a configured port, IPv4 inside",
            outer_v4().udp(40001, 5555).payload(&web).build(),
            PASS_WEB,
            fleet,
        ),
        (
            "FOU on a configured port, IPv6 inside IPv6",
            outer_v6().udp(40001, 5555).payload(&v6_host).build(),
            PASS_V6,
            Expect::Unmatched,
        ),
        (
            "GUE version 0 on a configured port, IPv4 inside",
            outer_v4()
                .udp(40001, 6080)
                .payload(&cat(&[&frame::gue_header(IPPROTO_IPIP), &web]))
                .build(),
            PASS_WEB,
            fleet,
        ),
        (
            "GUE version 1 (direct IP) on a configured port, IPv6 inside",
            outer_v4().udp(40001, 6080).payload(&v6_host).build(),
            PASS_V6,
            fleet,
        ),
        (
            "IPIP to the bytes rule: the whole frame, outer headers too, is counted",
            outer_v4()
                .proto(IPPROTO_IPIP)
                .payload(frame::ip_datagram(
                    &v4([198, 18, 6, 60]).udp(40000, 53).payload_len(100).build(),
                ))
                .build(),
            Expect::Rule("bytes", 1, 0, 0),
            fleet,
        ),
    ];
    let mut rows: Vec<Row> = cases
        .into_iter()
        .map(|(what, frame, on, off)| {
            if decapsulating {
                row(format!("{what}: inner header"), frame, XDP_PASS, on).decapsulated()
            } else {
                row(format!("{what}: outer header"), frame, XDP_PASS, off)
            }
        })
        .collect();

    // Classified by the outer header whether or not the interface decapsulates.
    rows.push(row(
        "FOU-shaped UDP to a port not configured: outer header",
        outer_v4().udp(40001, 5556).payload(&web).build(),
        XDP_PASS,
        fleet,
    ));
    rows.push(row(
        "GRE version 1 (PPTP): outer header",
        outer_v4()
            .proto(IPPROTO_GRE)
            .payload(&cat(&[&[0x00, 0x01, 0x08, 0x00], &web[..]]))
            .build(),
        XDP_PASS,
        fleet,
    ));
    rows.push(row(
        "GUE control message: outer header",
        outer_v4()
            .udp(40001, 6080)
            .payload(&cat(&[&[0x20, 0, 0, 0], &web[..]]))
            .build(),
        XDP_PASS,
        fleet,
    ));
    rows.push(
        row(
            "IPIP outer later fragment: no inner header, classified by the outer one",
            outer_v4()
                .ipv4_fragment(20, false)
                .proto(IPPROTO_IPIP)
                .payload_len(64)
                .build(),
            XDP_PASS,
            fleet,
        )
        .counting(&[fragments]),
    );

    // An outer first fragment: the inner headers in it are the datagram's.
    let first = outer_v4()
        .ipv4_fragment(0, true)
        .proto(IPPROTO_IPIP)
        .payload(&web);
    // The same with only 12 bytes of the inner IPv4 header, then 28 (the inner header
    // whole, 8 bytes of its TCP header), then a GRE header cut short.
    let cut_inner_ip = outer_v4()
        .ipv4_fragment(0, true)
        .proto(IPPROTO_IPIP)
        .payload(&web[..12]);
    let cut_inner_tcp = outer_v4()
        .ipv4_fragment(0, true)
        .proto(IPPROTO_IPIP)
        .payload(&web[..28]);
    let cut_gre = outer_v4()
        .ipv4_fragment(0, true)
        .proto(IPPROTO_GRE)
        .payload(&frame::gre_header(frame::GRE_IPV4, false, Some(1), None)[..6]);
    if decapsulating {
        rows.push(
            row(
                "IPIP outer first fragment holding the inner headers: inner header",
                first.build(),
                XDP_PASS,
                PASS_WEB,
            )
            .decapsulated(),
        );
        for (what, builder) in [
            ("inner IPv4 header cut", &cut_inner_ip),
            ("inner TCP header cut", &cut_inner_tcp),
        ] {
            let mut r = row(
                format!("IPIP outer first fragment, {what}: unreadable, refused"),
                builder.build(),
                XDP_DROP,
                Expect::None,
            )
            .decapsulated();
            r.tunnels.unreadable += 1;
            r.reason = Some(DropReason::UnreadableTunnel);
            rows.push(r);
        }
        let mut r = row(
            "GRE outer first fragment, GRE header cut: unreadable, refused",
            cut_gre.build(),
            XDP_DROP,
            Expect::None,
        );
        r.tunnels.unreadable += 1;
        r.reason = Some(DropReason::UnreadableTunnel);
        rows.push(r);
        // A whole outer datagram whose inner one runs past it: the host drops it too.
        let mut cut = web.clone();
        cut.truncate(30);
        rows.push(
            row(
                "IPIP whole outer datagram, inner TCP header cut: malformed",
                outer_v4().proto(IPPROTO_IPIP).payload(&cut).build(),
                XDP_PASS,
                Expect::Malformed,
            )
            .decapsulated(),
        );
        // An inner tiny fragment is refused by the inner destination's rule.
        let tiny_inner = frame::ip_datagram(
            &v4(WEB)
                .ipv4_fragment(0, true)
                .tcp(40000, 443, TCP_ACK)
                .build(),
        )[..28]
            .to_vec();
        let mut tiny_inner = tiny_inner;
        // Its total length says what is there: a whole (tiny) first fragment.
        tiny_inner[2..4].copy_from_slice(&28u16.to_be_bytes());
        rows.push(
            row(
                "IPIP carrying an inner tiny first fragment: refused by the inner rule",
                outer_v4().proto(IPPROTO_IPIP).payload(&tiny_inner).build(),
                XDP_DROP,
                Expect::Rule("web-tcp443", 0, 1, 0),
            )
            .decapsulated()
            .counting(&[fragments, tiny])
            .because(DropReason::TinyFragment)
            .refused_early(1),
        );
    } else {
        // Each its own datagram (identification): under one, the first record wins and
        // the next first fragment, with other headers, would be refused as overlapping.
        for (id, builder) in (0x2000u16..).zip([&first, &cut_inner_ip, &cut_inner_tcp, &cut_gre]) {
            rows.push(
                row(
                    "tunnel in an outer first fragment, not decapsulated: outer header",
                    builder.clone().ip_id(id).build(),
                    XDP_PASS,
                    fleet,
                )
                .counting(&[fragments]),
            );
        }
    }
    rows
}

#[test]
fn tunnel_table_decapsulating() {
    run_table_with(&format!("{RULES}{TUNNELS}"), &tunnel_rows(true));
}

#[test]
fn tunnel_table_not_decapsulating() {
    run_table(&tunnel_rows(false));
}

#[test]
fn parser_table() {
    run_table(&parser_rows());
}

#[test]
fn classification_table() {
    run_table(&classification_rows());
}

#[test]
fn metering_table() {
    run_table(&metering_rows());
}

/// Fleet rules, their state written as the daemon writes it ([`install_fleet_state`]),
/// beside standalone rules that are not in the fleet. Every aggregate is in bytes at
/// 1 B/s: a bucket emptied at install refills a 64-byte frame in a minute, so no row
/// meets a token that came back while the table ran.
const FLEET_RULES: &str = r#"
fleet_size = 1000

[fleet]
allocator = "127.0.0.1:1"
ca = "ca.pem"
cert = "cert.pem"
key = "key.pem"
host_id = "lb-verdicts"
lease_ttl_ms = 3600000
sticky_max_s = 3600

[[rules]]
name = "closed"
dst = "198.18.10.1/32"
unit = "bytes"
rate = 1000
burst = 2000

[[rules]]
name = "closed-shadow"
dst = "198.18.10.2/32"
unit = "bytes"
rate = 1000
burst = 2000
mode = "shadow"

[[rules]]
name = "closed-per-source"
dst = "198.18.10.3/32"
unit = "bytes"
rate = 1000
burst = 2000
[rules.per_source]
rate = 100000
burst = 100000

[[rules]]
name = "spent"
dst = "198.18.10.4/32"
unit = "bytes"
rate = 1000
burst = 2000

[[rules]]
name = "spent-shadow"
dst = "198.18.10.5/32"
unit = "bytes"
rate = 1000
burst = 2000
mode = "shadow"

[[rules]]
name = "spent-per-source"
dst = "198.18.10.6/32"
unit = "bytes"
rate = 1000
burst = 2000
[rules.per_source]
rate = 100000
burst = 100000

[[rules]]
name = "bootstrap"
dst = "198.18.10.7/32"
unit = "bytes"
rate = 1000
burst = 2000

[[rules]]
name = "standalone"
dst = "198.18.10.8/32"
unit = "bytes"
rate = 1
burst = 2000

[[rules]]
name = "standalone-shadow"
dst = "198.18.10.9/32"
unit = "bytes"
rate = 1
burst = 2000
mode = "shadow"
"#;

/// Rules of [`FLEET_RULES`] the allocator grants 0: closed until the lease lapses.
const CLOSED: [&str; 3] = ["closed", "closed-shadow", "closed-per-source"];
/// Rules it grants 1 B/s with no token: the share is spent from the start.
const SPENT: [&str; 3] = ["spent", "spent-shadow", "spent-per-source"];
/// Rules outside the fleet: their aggregate is their own, emptied at install as well.
const STANDALONE: [&str; 2] = ["standalone", "standalone-shadow"];

/// The fleet's state in `loaded`'s rule entries and buckets, written as the daemon
/// writes it (`Daemon::reinstall`): a [`FleetState`] of the config's `[fleet]` takes
/// the allocator's reply; the rules are shaped by it, compiled, annotated with its
/// states and deadlines, and installed; a grant that takes over a bucket sets its
/// tokens. The fleet holds every rule of [`FLEET_RULES`] with an aggregate but the
/// standalone ones (a daemon makes every aggregate rule a fleet rule; these stand for
/// another host's): `bootstrap` gets no grant and stays in its bootstrap share.
fn install_fleet_state(loaded: &mut Loaded) {
    use limiter_common::{gcra, share::ShareState};
    use limiter_proto::pb::{ReportReply, RuleGrant};
    use limiter_user::policy::{fleet::FleetState, ruleset};

    let config = &loaded.config;
    let fleet_rules: Vec<_> = config
        .rules
        .iter()
        .filter(|r| !STANDALONE.contains(&r.name.as_str()))
        .cloned()
        .collect();
    let now = monotonic_ns();
    let spec = config.fleet.clone().expect("FLEET_RULES has [fleet]");
    let mut fleet = FleetState::new(spec, config.fleet_size, config.xdp_mode, &fleet_rules, now);
    let grant = |rule: &str, rate: u64| RuleGrant {
        rule: rule.to_string(),
        rate,
        burst: 1518,
        tokens: 0,
        ttl_ms: 3_600_000,
        ..RuleGrant::default()
    };
    let reply = ReportReply {
        grants: CLOSED
            .iter()
            .map(|r| grant(r, 0))
            .chain(SPENT.iter().map(|r| grant(r, 1)))
            .collect(),
        report_interval_ms: 1_000,
        ..ReportReply::default()
    };
    let refused = fleet.apply_from(0, &reply, now).refused;
    assert!(refused.is_empty(), "grants refused: {refused:?}");

    let shaped = fleet.shape(&config.rules);
    let slots = ruleset::assign_slots(&loaded.maps.live_slots().unwrap(), &shaped).unwrap();
    let mut table = ruleset::compile(&shaped, &slots).unwrap();
    fleet.annotate(&mut table, now);
    loaded.maps.install(&table).unwrap();
    let at = gcra::ticks_from_ns(now);
    let empty = |rule: &str| (rule.to_string(), 0);
    let takeovers = fleet.take_pending_tokens();
    for (rule, tokens) in takeovers
        .into_iter()
        .chain(STANDALONE.iter().map(|r| empty(r)))
    {
        let slot = table.slots[&rule];
        let entry = table.rule(slot).expect("the rule's entry");
        let tat = gcra::tat_with_tokens(&entry.aggregate, at, tokens);
        loaded.maps.set_aggregate_tat(slot, tat).unwrap();
    }
    let state = |rule: &str| {
        let entry = table.rule(table.slots[rule]).expect("the rule's entry");
        ShareState::try_from(entry.share_state).ok()
    };
    for rule in CLOSED.iter().chain(&SPENT) {
        assert_eq!(state(rule), Some(ShareState::Leased), "{rule}");
    }
    assert_eq!(state("bootstrap"), Some(ShareState::Bootstrap));
    for rule in STANDALONE {
        assert_eq!(state(rule), Some(ShareState::Standalone), "{rule}");
    }
    loaded.table = table;
}

/// Why a fleet rule refuses: its share closed (granted 0) or spent (the aggregate bucket
/// at this host's share is empty); a standalone rule's aggregate refusal stays
/// `aggregate`. Shadow rules count the same reasons as would-drops (and pass the frame,
/// counted as passed too).
fn fleet_rows() -> Vec<Row> {
    // 64 bytes: long enough for the TC build's test runs too.
    let to = |host: u8| v4([198, 18, 10, host]).udp(1, 53).frame_len(64).build();
    let from = |src: [u8; 4], host: u8| {
        FrameBuilder::ipv4(Ipv4Addr::from(src), Ipv4Addr::new(198, 18, 10, host))
            .udp(1, 53)
            .frame_len(64)
            .build()
    };
    // A bootstrap share: quota ÷ fleet_size = 1 B/s, the smallest burst of a bytes
    // share; a frame of 1000 bytes takes the burst's one frame.
    let big = v4([198, 18, 10, 7]).udp(1, 53).frame_len(1000).build();
    vec![
        repeated(
            "closed share: refused",
            to(1),
            5,
            XDP_DROP,
            Expect::Rule("closed", 0, 5, 0),
        )
        .because(DropReason::ShareClosed),
        repeated(
            "closed share, shadow: would-drop",
            to(2),
            5,
            XDP_PASS,
            Expect::Rule("closed-shadow", 5, 0, 5),
        )
        .because(DropReason::ShareClosed),
        repeated(
            "closed share before a per-source limit with room",
            from([198, 19, 10, 3], 3),
            5,
            XDP_DROP,
            Expect::Rule("closed-per-source", 0, 5, 0),
        )
        .because(DropReason::ShareClosed),
        repeated(
            "spent share: refused",
            to(4),
            5,
            XDP_DROP,
            Expect::Rule("spent", 0, 5, 0),
        )
        .because(DropReason::ShareSpent),
        repeated(
            "spent share, shadow: would-drop",
            to(5),
            5,
            XDP_PASS,
            Expect::Rule("spent-shadow", 5, 0, 5),
        )
        .because(DropReason::ShareSpent),
        repeated(
            "spent share after a per-source limit with room",
            from([198, 19, 10, 6], 6),
            5,
            XDP_DROP,
            Expect::Rule("spent-per-source", 0, 5, 0),
        )
        .because(DropReason::ShareSpent),
        repeated(
            "bootstrap share: its burst's one frame, then spent",
            big,
            5,
            XDP_DROP,
            Expect::Rule("bootstrap", 1, 4, 0),
        )
        .because(DropReason::ShareSpent),
        repeated(
            "standalone aggregate: refused as aggregate",
            to(8),
            5,
            XDP_DROP,
            Expect::Rule("standalone", 0, 5, 0),
        )
        .because(DropReason::Aggregate),
        repeated(
            "standalone aggregate, shadow: would-drop as aggregate",
            to(9),
            5,
            XDP_PASS,
            Expect::Rule("standalone-shadow", 5, 0, 5),
        )
        .because(DropReason::Aggregate),
    ]
}

#[test]
fn fleet_share_table() {
    run_table_prepared(FLEET_RULES, &fleet_rows(), install_fleet_state);
}

#[test]
fn fragment_table() {
    run_table(&fragment_rows());
}

/// Every prefix of every frame in the tables (decapsulating): the program never aborts and never
/// fails; frames too short for the kernel to run (below an Ethernet header) are refused
/// by BPF_PROG_TEST_RUN itself. The multi-buffer build and the TC build (up to the
/// longest frame a TC test run takes).
#[test]
fn truncation_sweep_never_aborts() {
    let mut frames: Vec<Vec<u8>> = parser_rows().into_iter().map(|r| r.frame).collect();
    frames.extend(classification_rows().into_iter().map(|r| r.frame));
    frames.extend(metering_rows().into_iter().map(|r| r.frame));
    frames.extend(fragment_rows().into_iter().map(|r| r.frame));
    frames.extend(tunnel_rows(true).into_iter().map(|r| r.frame));
    // With decapsulation on, so the tunnels' prefixes cut every header of both layers.
    let config = format!("{RULES}{TUNNELS}");
    for variant in [Variant::MultiBuffer, Variant::Tc] {
        let loaded =
            fixture::load_build(&config, variant).expect("loading the program with the test rules");
        let (shortest, longest) = match variant {
            Variant::Tc => (TC_MIN_FRAME, LINEAR_MAX_FRAME),
            _ => (XDP_MIN_FRAME, usize::MAX),
        };
        let mut ran = 0u64;
        let mut aborted = Vec::new();
        for f in &frames {
            // The 9000-byte frame: every 7th prefix keeps the sweep quick and still
            // crosses each header boundary of the first few hundred bytes.
            let step = if f.len() > 2000 { 7 } else { 1 };
            for len in (0..=f.len().min(longest)).step_by(step) {
                match loaded.run(&f[..len]) {
                    Ok(XDP_ABORTED) => aborted.push(len),
                    Ok(v) => {
                        assert!(
                            v == XDP_PASS || v == XDP_DROP,
                            "{} build: verdict {v} at length {len}",
                            variant.as_str()
                        );
                        ran += 1;
                    }
                    Err(e) => assert!(
                        len < shortest,
                        "{} build: test run refused a {len}-byte frame: {e:#}",
                        variant.as_str()
                    ),
                }
            }
        }
        assert!(
            aborted.is_empty(),
            "{} build: aborted at lengths {aborted:?}",
            variant.as_str()
        );
        assert!(
            ran > 1000,
            "{} build: only {ran} prefixes ran",
            variant.as_str()
        );
    }
}

/// A record older than the destination's reassembly timeout no longer speaks for a
/// datagram: a new first fragment under the same identification (a busy sender's 16-bit
/// IPv4 identification comes round again) replaces it; a fresh one is kept.
#[test]
fn a_stale_fragment_record_is_replaced_a_fresh_one_is_kept() {
    use limiter_common::abi::{fragment_clock, fragment_record_life, FragmentKey};
    let key = FragmentKey {
        family: 4,
        proto: 6,
        id: 0x130,
        src: [u32::from_ne_bytes([198, 19, 200, 1]), 0, 0, 0],
        dst: [u32::from_ne_bytes(WEB), 0, 0, 0],
    };
    let first = |port: u16| {
        v4(WEB)
            .ip_id(0x130)
            .ipv4_fragment(0, true)
            .tcp(40000, port, TCP_ACK)
            .payload_len(64)
            .build()
    };
    for variant in Variant::ALL {
        let v = variant.as_str();
        let mut loaded = fixture::load_build(RULES, variant).expect("loading the program");
        assert_eq!(loaded.run(&first(443)).unwrap(), XDP_PASS, "{v}");
        let mut record = loaded
            .maps
            .fragment_record(&key)
            .unwrap()
            .expect("a record");
        assert_eq!((record.dst_port, record.proto), (443, 6), "{v}");
        let now = fragment_clock(monotonic_ns());
        // Fresh (as old as the timeout allows): a first fragment to another port is refused.
        record.passed_at = now.wrapping_sub(fragment_record_life(4) - 1);
        loaded.maps.set_fragment_record(&key, &record).unwrap();
        assert_eq!(
            loaded.run(&first(9)).unwrap(),
            XDP_DROP,
            "{v}: fresh record"
        );
        assert_eq!(
            loaded.maps.fragment_record(&key).unwrap(),
            Some(record),
            "{v}"
        );
        // Stale: replaced by the new datagram's first fragment, which passes.
        record.passed_at = now.wrapping_sub(fragment_record_life(4) + 2);
        loaded.maps.set_fragment_record(&key, &record).unwrap();
        assert_eq!(
            loaded.run(&first(9)).unwrap(),
            XDP_PASS,
            "{v}: stale record"
        );
        let replaced = loaded
            .maps
            .fragment_record(&key)
            .unwrap()
            .expect("a record");
        assert_eq!(replaced.dst_port, 9, "{v}: the new datagram's record");
    }
}

/// A flood of first fragments to one destination does not take the records of another's
/// datagrams in flight before the bound the README states for the kernel's LRU ("What
/// each kind of frame gets"). Then, past the table's size, a record is evicted and its
/// datagram's later fragment refused: the test can tell.
#[test]
fn a_first_fragment_flood_to_one_vip_keeps_another_vips_records() {
    use limiter_common::abi::MAX_FRAGMENT_RECORDS;
    let config = "[[rules]]\nname = \"a-roomy\"\ndst = \"198.18.30.2/32\"\ndst_port = 443\nproto = \"udp\"\n\
                  rate = 1\nburst = 1000000\n\
                  [[rules]]\nname = \"b\"\ndst = \"198.18.31.1/32\"\ndst_port = 53\nproto = \"udp\"\n\
                  rate = 1\nburst = 1000000\n";
    let b_first = |id: u16| {
        v4([198, 18, 31, 1])
            .ip_id(id)
            .ipv4_fragment(0, true)
            .udp(40000, 53)
            .payload_len(64)
            .build()
    };
    let b_tail = |id: u16| {
        v4([198, 18, 31, 1])
            .ip_id(id)
            .ipv4_fragment(9, false)
            .udp(40000, 53)
            .payload_len(64)
            .build()
    };
    // First fragments from distinct sources (distinct datagrams) to `dst`.
    let flood = |loaded: &Loaded, dst: [u8; 4], count: u32| {
        let mut f = v4(dst)
            .ipv4_fragment(0, true)
            .udp(40000, 443)
            .payload_len(64)
            .build();
        for i in 0..count {
            let src = std::net::Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 19, 0, 0)) + i);
            frame::with_ipv4_src(&mut f, src).unwrap();
            loaded.run(&f).unwrap();
        }
    };
    let tail_metered = |loaded: &Loaded, id: u16| {
        let before = loaded.snapshot().unwrap();
        let verdict = loaded.run(&b_tail(id)).unwrap();
        let d = delta(&before, &loaded.snapshot().unwrap());
        (
            verdict,
            d.rules["b"].passed_packets,
            d.headers.orphan_fragments,
        )
    };
    let possible = std::fs::read_to_string("/sys/devices/system/cpu/possible").unwrap();
    let cpus = possible
        .trim()
        .split(',')
        .map(|r| match r.split_once('-') {
            Some((a, b)) => b.parse::<u32>().unwrap() - a.parse::<u32>().unwrap() + 1,
            None => 1,
        })
        .sum::<u32>();
    // The bound the README states: the table's size less what the kernel's LRU may hold
    // aside per CPU (up to 128 free and 128 pending entries each, bpf_lru_list.c).
    let safe = MAX_FRAGMENT_RECORDS - (2 * cpus) * 128;
    for variant in Variant::ALL {
        let v = variant.as_str();
        let loaded = fixture::load_build(config, variant).expect("loading the program");
        // As many first fragments as the bound on this host's CPUs.
        assert_eq!(loaded.run(&b_first(2)).unwrap(), XDP_PASS, "{v}");
        flood(&loaded, [198, 18, 30, 2], safe);
        assert_eq!(
            tail_metered(&loaded, 2),
            (XDP_PASS, 1, 0),
            "{v}: B's later fragment after {safe} passed first fragments to A ({cpus} CPUs)"
        );
        // Past the table's size: evicted, and the later fragment is an orphan.
        assert_eq!(loaded.run(&b_first(3)).unwrap(), XDP_PASS, "{v}");
        flood(&loaded, [198, 18, 30, 2], 2 * MAX_FRAGMENT_RECORDS);
        assert_eq!(
            tail_metered(&loaded, 3),
            (XDP_DROP, 0, 1),
            "{v}: B's later fragment after {} passed first fragments to A",
            2 * MAX_FRAGMENT_RECORDS
        );
    }
}

/// Destinations that are rule prefixes are found in the exact-address table; one that
/// found no slot there (nine addresses crafted to share a home slot, one more than a
/// lookup probes) is still classified, by the prefix trie — on every build.
#[test]
fn exact_table_overflow_falls_back_to_the_trie() {
    let home = |a: [u8; 4]| {
        let mut addr = [0u8; 16];
        addr[..4].copy_from_slice(&a);
        limiter_common::abi::host_home(4, &addr)
    };
    let base = u32::from(Ipv4Addr::new(198, 18, 0, 1));
    let target = home(Ipv4Addr::from(base).octets());
    let addrs: Vec<[u8; 4]> = (0..1u32 << 17)
        .map(|i| Ipv4Addr::from(base + i).octets())
        .filter(|&a| home(a) == target)
        .take(limiter_common::abi::HOST_PROBES as usize + 1)
        .collect();
    let config: String = addrs
        .iter()
        .enumerate()
        .map(|(i, a)| {
            format!(
                "[[rules]]\nname = \"h{i}\"\ndst = \"{}/32\"\nrate = 1\nburst = {}\n",
                Ipv4Addr::from(*a),
                i + 1
            )
        })
        .collect();
    for variant in Variant::ALL {
        let loaded = fixture::load_build(&config, variant).expect("loading the program");
        let before = loaded.snapshot().unwrap();
        for (i, a) in addrs.iter().enumerate() {
            // Rule h{i} has a burst of i + 1: i + 2 frames pass i + 1 and drop one.
            for _ in 0..i + 2 {
                loaded.run(&v4(*a).udp(1, 53).build()).unwrap();
            }
        }
        let d = delta(&before, &loaded.snapshot().unwrap());
        assert_eq!(d.global.unmatched, 0, "{} build", variant.as_str());
        for i in 0..addrs.len() {
            let c = d.rules[&format!("h{i}")];
            assert_eq!(
                (c.passed_packets, c.dropped_packets),
                (i as u64 + 1, 1),
                "rule h{i}, {} build",
                variant.as_str()
            );
        }
    }
}

/// A fleet share of zero (`RULE_CLOSED_UNTIL_LAPSE`): everything is refused while the
/// lease runs; after it lapses the entry's aggregate (the bootstrap share, burst 1)
/// meters, daemon or no daemon; FAIL_OPEN overrides both on its deadline.
#[test]
fn a_closed_share_refuses_until_its_lease_lapses_then_meters_as_a_joiner() {
    use limiter_common::abi::RULE_CLOSED_UNTIL_LAPSE;
    const HOUR: u64 = 3_600_000_000_000;
    let frame = v4([198, 18, 9, 10]).udp(1, 53).build();
    // 20/s, burst 1 (50 ms) meters on the tick clock once lapsed; 1000/s, burst 1 (1 ms)
    // on the precise one.
    for rate in [20u64, 1000] {
        let config = format!(
            "[[rules]]\nname = \"fleet\"\ndst = \"198.18.9.10/32\"\nrate = {rate}\nburst = 1\n"
        );
        for variant in Variant::ALL {
            let mut loaded = fixture::load_build(&config, variant).expect("loading the program");
            let run = |loaded: &mut Loaded, lease_expires_ns: u64, fail_open_at_ns: u64| {
                let mut table = loaded.table.clone();
                let rule = &mut table.rules[0].1;
                rule.flags |= RULE_CLOSED_UNTIL_LAPSE;
                rule.lease_expires_ns = lease_expires_ns;
                rule.fail_open_at_ns = fail_open_at_ns;
                loaded.maps.install(&table).unwrap();
                let before = loaded.snapshot().unwrap();
                let started = std::time::Instant::now();
                for _ in 0..100 {
                    loaded.run(&frame).unwrap();
                }
                let elapsed = started.elapsed();
                let c = delta(&before, &loaded.snapshot().unwrap()).rules["fleet"];
                (c.passed_packets, c.dropped_packets, elapsed)
            };
            let now = monotonic_ns();
            let v = format!("{}, {rate}/s", variant.as_str());
            let (passed, dropped, _) = run(&mut loaded, now + HOUR, 0);
            assert_eq!((passed, dropped), (0, 100), "{v}: leased, closed");
            let (passed, dropped, _) = run(&mut loaded, now + HOUR, now - 1);
            assert_eq!((passed, dropped), (100, 0), "{v}: FAIL_OPEN");
            // Lapsed: the bootstrap share's one token (the bucket was never touched while
            // closed), then the rate over the run's duration.
            let (passed, dropped, elapsed) = run(&mut loaded, now - 1, 0);
            let most = 1 + (rate as f64 * elapsed.as_secs_f64()).ceil() as u64;
            assert!(
                passed >= 1 && passed <= most && passed + dropped == 100,
                "{v}: lapsed, a joiner: {passed} passed (at most {most}), {dropped} dropped"
            );
        }
    }
}

/// FAIL_OPEN opens the fleet's share (the aggregate), not the per-source limit, which
/// needs no allocator: each source keeps its burst and no more. A `static` rule keeps its
/// aggregate too.
#[test]
fn fail_open_leaves_per_source_limits_in_force() {
    use limiter_common::abi::RULE_FAIL_STATIC;
    const HOUR: u64 = 3_600_000_000_000;
    // The aggregate admits one frame an hour; each source five, then one a second.
    let config = "[[rules]]\nname = \"fleet\"\ndst = \"198.18.9.11/32\"\nrate = 1\nburst = 1\n\
                  [rules.per_source]\nrate = 1\nburst = 5\n";
    let from = |src: [u8; 4]| {
        FrameBuilder::ipv4(Ipv4Addr::from(src), Ipv4Addr::new(198, 18, 9, 11))
            .udp(1, 53)
            .build()
    };
    for variant in Variant::ALL {
        let mut loaded = fixture::load_build(config, variant).expect("loading the program");
        let mut run = |fail_open_at_ns: u64, extra_flags: u32, sources: [[u8; 4]; 2]| {
            let mut table = loaded.table.clone();
            let rule = &mut table.rules[0].1;
            rule.flags |= extra_flags;
            rule.lease_expires_ns = monotonic_ns() + HOUR;
            rule.fail_open_at_ns = fail_open_at_ns;
            loaded.maps.install(&table).unwrap();
            // The aggregate's bucket full again: one frame.
            loaded.maps.set_aggregate_tat(0, 0).unwrap();
            let before = loaded.snapshot().unwrap();
            for src in sources {
                for _ in 0..100 {
                    loaded.run(&from(src)).unwrap();
                }
            }
            let c = delta(&before, &loaded.snapshot().unwrap()).rules["fleet"];
            (c.passed_packets, c.dropped_packets)
        };
        let v = variant.as_str();
        let past = monotonic_ns() - 1;
        assert_eq!(
            run(past, 0, [[198, 19, 1, 1], [198, 19, 1, 2]]),
            (10, 190),
            "{v}: FAIL_OPEN, two sources: each its per-source burst of 5"
        );
        assert_eq!(
            run(0, 0, [[198, 19, 2, 1], [198, 19, 2, 2]]),
            (1, 199),
            "{v}: leased: the aggregate's one token"
        );
        assert_eq!(
            run(past, RULE_FAIL_STATIC, [[198, 19, 3, 1], [198, 19, 3, 2]]),
            (1, 199),
            "{v}: static past its deadline keeps the aggregate"
        );
    }
}

/// With a rate too low to refill during the run, exactly `burst` frames pass out of
/// burst + 1000.
#[test]
fn exactly_burst_frames_pass() {
    for (unit, burst, frame_len) in [("packets", 500u64, 64usize), ("bytes", 64 * 500, 64)] {
        let config = format!(
            "[[rules]]\nname = \"exact\"\ndst = \"198.18.9.9/32\"\nunit = \"{unit}\"\nrate = 1\nburst = {burst}\n"
        );
        let loaded =
            fixture::load_build(&config, Variant::MultiBuffer).expect("loading the program");
        let f = v4([198, 18, 9, 9]).udp(1, 53).frame_len(frame_len).build();
        let frames = if unit == "bytes" {
            burst / frame_len as u64
        } else {
            burst
        };
        let (verdict, _) = loaded
            .run_repeat(&f, (frames + 1000) as u32)
            .expect("test run");
        let c = loaded.snapshot().expect("counters").rules["exact"];
        assert_eq!(verdict, XDP_DROP, "{unit}");
        assert_eq!(c.passed_packets, frames, "{unit}: passed");
        assert_eq!(c.dropped_packets, 1000, "{unit}: dropped");
    }
}

/// Installing rule tables while frames are being classified: every frame meets a whole
/// table (old or new), never an empty or half-written one.
#[test]
fn rule_table_swaps_are_atomic() {
    let table_a =
        "[[rules]]\nname = \"a\"\ndst = \"198.18.7.0/24\"\nrate = 1000\nburst = 1000000\n";
    let table_b = "[[rules]]\nname = \"b\"\ndst = \"198.18.7.7/32\"\nproto = \"udp\"\nrate = 1000\nburst = 1000000\n\
                   [[rules]]\nname = \"c\"\ndst = \"198.18.0.0/16\"\nrate = 1000\nburst = 1000000\n";
    let mut loaded =
        fixture::load_build(table_a, Variant::MultiBuffer).expect("loading the program");
    let configs: Vec<_> = [table_a, table_b]
        .iter()
        .map(|t| limiter_user::config::Config::parse(t, std::path::Path::new("<swap>")).unwrap())
        .collect();
    let f = v4([198, 18, 7, 7]).udp(1, 53).build();
    let before = loaded.maps.global_counters().unwrap();
    let runs_per_call = 20_000u32;
    let calls = 50u64;
    let swaps = std::thread::scope(|s| {
        let program = &loaded.program;
        let frame = &f;
        let runner = s.spawn(move || {
            for _ in 0..calls {
                let mut opts = aya::programs::TestRunOptions::new();
                opts.data_in = Some(frame);
                opts.repeat = runs_per_call;
                aya::programs::TestRun::test_run(program.xdp().unwrap(), opts).unwrap();
            }
        });
        let mut swaps = 0u64;
        while !runner.is_finished() {
            let config = &configs[(swaps % 2) as usize];
            limiter_user::daemon::apply_rules(&mut loaded.maps, config).unwrap();
            swaps += 1;
        }
        runner.join().unwrap();
        swaps
    });
    let after = loaded.maps.global_counters().unwrap();
    assert!(swaps >= 10, "only {swaps} swaps happened during the runs");
    assert_eq!(
        after.unmatched - before.unmatched,
        0,
        "frames saw an incomplete rule table during {swaps} swaps"
    );
}

/// `RULE_SYNS` counts the SYNs a syn rule meets (passed or dropped: what it was offered)
/// and nothing else: not a syn rule's other packets (passed unmetered, counted as passed),
/// not SYNs to a packets rule. The fleet reports a syn rule's demand from it.
#[test]
fn syn_rules_count_the_syns_they_meter_and_nothing_else() {
    const SYN: u8 = 0x02;
    const ACK: u8 = 0x10;
    let config = "[[rules]]\nname = \"syn\"\ndst = \"198.18.9.11/32\"\nproto = \"tcp\"\n\
                  unit = \"syn\"\nrate = 1\nburst = 3\n\
                  [[rules]]\nname = \"pkts\"\ndst = \"198.18.9.12/32\"\nrate = 1\nburst = 3\n";
    for variant in Variant::ALL {
        let loaded = fixture::load_build(config, variant).expect("loading the program");
        let v = variant.as_str();
        let syns = |loaded: &Loaded, rule: &str| {
            let slot = loaded.table.slots[rule];
            loaded.maps.rule_syns(slot).unwrap()
        };
        let to = |dst: [u8; 4], flags: u8| v4(dst).tcp(1000, 443, flags).build();
        let before = loaded.snapshot().unwrap();
        for _ in 0..10 {
            loaded.run(&to([198, 18, 9, 11], SYN)).unwrap();
        }
        for _ in 0..7 {
            loaded.run(&to([198, 18, 9, 11], ACK)).unwrap();
            loaded.run(&to([198, 18, 9, 11], SYN | ACK)).unwrap();
            loaded.run(&to([198, 18, 9, 12], SYN)).unwrap();
        }
        let c = delta(&before, &loaded.snapshot().unwrap()).rules["syn"];
        assert_eq!(syns(&loaded, "syn"), 10, "{v}: the SYNs offered");
        assert_eq!(
            (c.passed_packets, c.dropped_packets),
            (3 + 14, 7),
            "{v}: burst 3 of 10 SYNs, the 14 others unmetered"
        );
        assert_eq!(
            syns(&loaded, "pkts"),
            0,
            "{v}: a packets rule counts no SYNs"
        );
    }
}

/// The fleet's credit (`AggBucket::credit`): frames the aggregate bucket refuses pass
/// while credit is left and the share's lease holds, one unit each; never once the lease
/// lapsed, and never for a frame its source's own limit refused.
#[test]
fn a_credit_admits_what_the_bucket_refuses_while_the_lease_holds() {
    const HOUR: u64 = 3_600_000_000_000;
    const BURST: u64 = 5;
    const CREDIT: u64 = 7;
    const FRAMES: u32 = 20;
    let frame = v4([198, 18, 9, 11]).udp(1, 53).build();
    // (case, per-source limit, lease deadline relative to now (s), expected passed,
    // expected credit left)
    type Case = (&'static str, Option<u64>, i64, u64, u64);
    let cases: [Case; 3] = [
        ("leased", None, 3600, BURST + CREDIT, 0),
        ("lapsed", None, -1, BURST, CREDIT),
        // The source's limit (3) refuses before the aggregate is asked: no credit spent.
        ("source over its limit", Some(3), 3600, 3, CREDIT),
    ];
    for (case, per_source, lease_s, passed_expected, left_expected) in cases {
        let per_source = per_source
            .map(|b| format!("[rules.per_source]\nrate = 1\nburst = {b}\n"))
            .unwrap_or_default();
        let config = format!(
            "[[rules]]\nname = \"fleet\"\ndst = \"198.18.9.11/32\"\nrate = 1\nburst = {BURST}\n{per_source}"
        );
        for variant in Variant::ALL {
            let v = format!("{case}, {} build", variant.as_str());
            let mut loaded = fixture::load_build(&config, variant).expect("loading the program");
            let now = monotonic_ns();
            let mut table = loaded.table.clone();
            let slot = table.slots["fleet"];
            table.rules[0].1.lease_expires_ns = if lease_s > 0 {
                now + HOUR
            } else {
                now - 1_000_000_000
            };
            loaded.maps.install(&table).unwrap();
            assert_eq!(loaded.maps.swap_credit(slot, CREDIT).unwrap(), 0, "{v}");
            let before = loaded.snapshot().unwrap();
            for _ in 0..FRAMES {
                loaded.run(&frame).unwrap();
            }
            let c = delta(&before, &loaded.snapshot().unwrap()).rules["fleet"];
            assert_eq!(
                (c.passed_packets, c.dropped_packets),
                (passed_expected, u64::from(FRAMES) - passed_expected),
                "{v}: passed, dropped"
            );
            assert_eq!(
                loaded.maps.credit_left(slot).unwrap(),
                left_expected,
                "{v}: credit left"
            );
        }
    }
}

/// `limiter explain` says what the program does with the credit: with the bucket empty,
/// a frame passes on credit while some is left and the lease holds, and is dropped once
/// it is spent.
#[test]
fn explain_agrees_with_the_program_about_the_credit() {
    use limiter_user::{
        config::Proto,
        observe::explain::{self, ExplainQuery},
    };
    const HOUR: u64 = 3_600_000_000_000;
    let frame = v4([198, 18, 9, 12]).udp(1, 53).build();
    let config = "[[rules]]\nname = \"fleet\"\ndst = \"198.18.9.12/32\"\nrate = 1\nburst = 2\n";
    let mut loaded =
        fixture::load_build(config, Variant::MultiBuffer).expect("loading the program");
    let mut table = loaded.table.clone();
    let slot = table.slots["fleet"];
    table.rules[0].1.lease_expires_ns = monotonic_ns() + HOUR;
    loaded.maps.install(&table).unwrap();
    let query = ExplainQuery {
        src: "198.18.0.1".parse().unwrap(),
        dst: "198.18.9.12".parse().unwrap(),
        dst_port: Some(53),
        proto: Proto::Udp,
        frame_len: 64,
        syn: false,
    };
    let explain = |loaded: &Loaded| {
        let e = explain::explain(&table, &loaded.maps, &query, |_, _| (0, 0)).unwrap();
        (e.verdict, e.credit, e.reason)
    };
    // The burst of 2, then nothing left: explain and the program both drop.
    for _ in 0..2 {
        assert_eq!(loaded.run(&frame).unwrap(), XDP_PASS);
    }
    assert_eq!(explain(&loaded).0, "drop");
    assert_eq!(loaded.run(&frame).unwrap(), XDP_DROP);
    // A credit of 2: explain says pass on credit, the program passes two frames.
    loaded.maps.swap_credit(slot, 2).unwrap();
    for left in [2, 1] {
        let (verdict, credit, reason) = explain(&loaded);
        assert_eq!((verdict.as_str(), credit), ("pass", left), "{reason}");
        assert!(reason.contains("fleet's credit"), "{reason}");
        assert_eq!(loaded.run(&frame).unwrap(), XDP_PASS, "{left} left");
    }
    assert_eq!(explain(&loaded).0, "drop");
    assert_eq!(loaded.run(&frame).unwrap(), XDP_DROP);
}

/// Sampling under a flood of refusals writes at most its budget (`events_per_sec` per CPU
/// per second: BPF_PROG_TEST_RUN runs every repetition on one CPU), counts the rest as
/// skipped, and each event says what the program refused: the reason, the rule's slot
/// and generation, the addresses and ports, and the frame's first bytes. With sampling
/// off, nothing is written or counted. Every build.
#[test]
fn sampling_writes_at_most_its_budget_and_says_what_was_refused() {
    use limiter_common::drop::{DropEvent, MonitorConfig, EVENT_DROPPED, EVENT_WOULD_DROP};
    const BUDGET: u32 = 5;
    const RUNS: u32 = 200;
    let config = "[[rules]]\nname = \"flooded\"\ndst = \"198.18.7.70/32\"\nrate = 1\nburst = 1\n\
                  [[rules]]\nname = \"watched\"\ndst = \"198.18.7.71/32\"\nrate = 1\nburst = 1\n\
                  mode = \"shadow\"\n";
    for variant in Variant::ALL.into_iter().chain([Variant::Libxdp]) {
        let mut loaded = fixture::load_build(config, variant).expect("loading the program");
        let v = variant.as_str();
        let mut ring = loaded
            .maps
            .take_drop_events()
            .expect("the program has no DROP_EVENTS");
        let frame = FrameBuilder::ipv4(Ipv4Addr::new(198, 19, 7, 1), Ipv4Addr::new(198, 18, 7, 70))
            .udp(4242, 53)
            .frame_len(100)
            .build();
        // Off (the default): refusals are counted, nothing is sampled.
        loaded.run_repeat(&frame, 20).unwrap();
        assert_eq!(
            ring.next().map(|_| ()),
            None,
            "{v}: an event with sampling off"
        );
        assert_eq!(
            loaded.maps.monitor_counters().unwrap(),
            Default::default(),
            "{v}: sampling off counts nothing"
        );
        loaded
            .maps
            .set_monitor_config(MonitorConfig {
                events_per_sec: BUDGET,
                snap_len: 64,
            })
            .unwrap();
        let started = std::time::Instant::now();
        let (verdict, _) = loaded.run_repeat(&frame, RUNS).unwrap();
        let seconds = started.elapsed().as_secs() + 1;
        assert_eq!(verdict, XDP_DROP, "{v}: sampling changed the verdict");
        let mut events = Vec::new();
        while let Some(item) = ring.next() {
            assert_eq!(item.len(), size_of::<DropEvent>(), "{v}: an event's size");
            // SAFETY: as many bytes as a DropEvent, which is made only of integers.
            events.push(unsafe { std::ptr::read_unaligned(item.as_ptr().cast::<DropEvent>()) });
        }
        let counts = loaded.maps.monitor_counters().unwrap();
        // The budget may restart once within the run if it crosses a second's edge.
        let most = u64::from(BUDGET) * (seconds + 1);
        assert!(
            !events.is_empty() && events.len() as u64 <= most,
            "{v}: {} events for a budget of {BUDGET}/s over at most {seconds} s",
            events.len()
        );
        assert_eq!(counts.sampled, events.len() as u64, "{v}: sampled vs read");
        assert_eq!(
            counts.sampled + counts.skipped_budget + counts.lost_full,
            u64::from(RUNS),
            "{v}: every refusal is sampled or counted as not ({counts:?})"
        );
        let slot = loaded.table.slots["flooded"];
        let generation = loaded.maps.control().unwrap().generation;
        let snap = 64.min(frame.len() / 8 * 8);
        for e in &events {
            let want = DropEvent {
                time_ns: e.time_ns,
                ifindex: e.ifindex,
                rx_queue: e.rx_queue,
                slot,
                generation,
                reason: DropReason::Aggregate as u32,
                verdict: EVENT_DROPPED,
                family: 4,
                proto: 17,
                src: [u32::from_ne_bytes([198, 19, 7, 1]), 0, 0, 0],
                dst: [u32::from_ne_bytes([198, 18, 7, 70]), 0, 0, 0],
                src_port: 0,
                dst_port: 53,
                frame_len: frame.len() as u32,
                snap_len: snap as u32,
                _pad: 0,
                data: e.data,
            };
            assert_eq!(*e, want, "{v}: the event");
            assert_eq!(&e.data[..snap], &frame[..snap], "{v}: the snap bytes");
            assert_ne!(e.ifindex, 0, "{v}: no interface");
        }
        // A shadow rule's refusals are sampled as would-drops, and pass.
        let shadow =
            FrameBuilder::ipv4(Ipv4Addr::new(198, 19, 7, 2), Ipv4Addr::new(198, 18, 7, 71))
                .tcp(1000, 80, TCP_ACK)
                .build();
        std::thread::sleep(std::time::Duration::from_millis(1100));
        let (verdict, _) = loaded.run_repeat(&shadow, 3).unwrap();
        assert_eq!(verdict, XDP_PASS, "{v}: a shadow refusal passes");
        let e = ring.next().map(|item| {
            // SAFETY: as above.
            unsafe { std::ptr::read_unaligned(item.as_ptr().cast::<DropEvent>()) }
        });
        let e = e.unwrap_or_else(|| panic!("{v}: no event for a would-drop"));
        assert_eq!(
            (e.slot, e.verdict, e.proto, e.dst_port),
            (loaded.table.slots["watched"], EVENT_WOULD_DROP, 6, 80),
            "{v}: the would-drop's event"
        );
    }
}
