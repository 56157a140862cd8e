//! The builder checked against etherparse, an outside parser that shares no code with it.
//!
//! [`assert_reads_back`] builds a frame, reads it layer by layer with etherparse's slices
//! (Ethernet, each VLAN tag, IPv4 or IPv6 with its extension headers, TCP/UDP/ICMP),
//! asserts every field the builder was asked for and recomputes every checksum with
//! etherparse. The property tests feed it arbitrary builders. Where etherparse cannot
//! express a frame (frames broken on purpose: a forged IHL or Total Length, lengths past
//! 16 bits, headers in an order RFC 8200 forbids), the test says so and asserts what
//! etherparse reports instead: an error of the right kind.
//!
//! etherparse 0.21 at least: before 0.20.3 it read the IPv6 Fragment header's offset and
//! M flag from the wrong bits (etherparse issue 150), and `known_frames` pins the
//! layout RFC 8200 gives.

use std::ops::Range;

use etherparse::{
    checksum::Sum16BitWords,
    err::{ipv4::SliceError as Ipv4SliceError, ipv6_exts, Layer},
    ArpHardwareId, ArpOperation, ArpPacketSlice, EtherType, Ethernet2Slice, Icmpv4Slice,
    Icmpv4Type, Icmpv6Slice, Icmpv6Type, IpAuthHeaderSlice, IpNumber, Ipv4HeaderSlice, Ipv4Slice,
    Ipv6ExtensionSlice, Ipv6ExtensionsSlice, Ipv6FragmentHeaderSlice, Ipv6HeaderSlice,
    Ipv6RawExtHeaderSlice, SingleVlanSlice, SlicedPacket, TcpSlice, TransportSlice, UdpSlice,
};
use proptest::prelude::*;

use super::*;

/// The extension headers `exts` holds, each read with etherparse's checked slice.
///
/// Not `exts.into_iter()`: etherparse 0.21's iterator reads every header unchecked and
/// follows the last header's Next Header past the end of a chain that `from_slice_lax`
/// cut short (after a non-first fragment, or at an error) — out-of-bounds reads that
/// crashed this test binary (SIGSEGV) about one run in ten.
fn ext_headers<'a>(exts: &Ipv6ExtensionsSlice<'a>) -> Vec<Ipv6ExtensionSlice<'a>> {
    let mut headers = Vec::new();
    let (mut next, mut rest) = (exts.first_header(), exts.slice());
    while let Some(kind) = next.filter(|_| !rest.is_empty()) {
        let (header, len, after) = match kind {
            IpNumber::IPV6_HEADER_HOP_BY_HOP
            | IpNumber::IPV6_ROUTE_HEADER
            | IpNumber::IPV6_DESTINATION_OPTIONS => {
                let Ok(s) = Ipv6RawExtHeaderSlice::from_slice(rest) else {
                    break;
                };
                let header = match kind {
                    IpNumber::IPV6_HEADER_HOP_BY_HOP => Ipv6ExtensionSlice::HopByHop(s.clone()),
                    IpNumber::IPV6_ROUTE_HEADER => Ipv6ExtensionSlice::Routing(s.clone()),
                    _ => Ipv6ExtensionSlice::DestinationOptions(s.clone()),
                };
                (header, s.slice().len(), s.next_header())
            }
            IpNumber::IPV6_FRAGMENTATION_HEADER => {
                let Ok(s) = Ipv6FragmentHeaderSlice::from_slice(rest) else {
                    break;
                };
                let (len, after) = (s.slice().len(), s.next_header());
                (Ipv6ExtensionSlice::Fragment(s), len, after)
            }
            IpNumber::AUTHENTICATION_HEADER => {
                let Ok(s) = IpAuthHeaderSlice::from_slice(rest) else {
                    break;
                };
                let (len, after) = (s.slice().len(), s.next_header());
                (Ipv6ExtensionSlice::Authentication(s), len, after)
            }
            _ => break,
        };
        headers.push(header);
        rest = &rest[len..];
        next = Some(after);
    }
    headers
}

const A4: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
const B4: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
const A6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1);
const B6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 2);

fn v4() -> FrameBuilder {
    FrameBuilder::ipv4(A4, B4)
}

fn v6() -> FrameBuilder {
    FrameBuilder::ipv6(A6, B6)
}

/// Where `part` (a sub-slice of `frame`) starts in `frame`.
fn offset_in(frame: &[u8], part: &[u8]) -> usize {
    let at = (part.as_ptr() as usize).wrapping_sub(frame.as_ptr() as usize);
    assert!(at <= frame.len(), "not a part of the frame");
    at
}

/// The payload bytes the builder was asked for, given the length of the headers (and of
/// a raw EtherType body) before it. Written from the builder's documentation: pattern
/// bytes are `i % 256`.
fn expected_payload(b: &FrameBuilder, headers: usize) -> Vec<u8> {
    let n = match &b.payload {
        Payload::Bytes(bytes) => return bytes.clone(),
        Payload::Len(n) => *n,
        Payload::FrameLen(n) => n.saturating_sub(headers),
    };
    (0..n).map(|i| (i % 256) as u8).collect()
}

/// The VLAN tags etherparse reads, (TPID, TCI) outermost first, the EtherType after them
/// and the offset of the header it announces. Each tag is sliced on its own with
/// [`SingleVlanSlice`], for any number of them.
fn read_l2(f: &[u8]) -> (Vec<(u16, u16)>, u16, usize) {
    let eth = Ethernet2Slice::from_slice_without_fcs(f)
        .unwrap_or_else(|e| panic!("etherparse: Ethernet: {e}"));
    let mut ether_type = eth.ether_type();
    let mut rest = eth.payload_slice();
    let mut tags = Vec::new();
    while [
        EtherType::VLAN_TAGGED_FRAME,
        EtherType::PROVIDER_BRIDGING,
        EtherType::VLAN_DOUBLE_TAGGED_FRAME,
    ]
    .contains(&ether_type)
    {
        let tag = SingleVlanSlice::from_slice(rest)
            .unwrap_or_else(|e| panic!("etherparse: VLAN tag {}: {e}", tags.len()));
        let tci = (u16::from(tag.priority_code_point().value()) << 13)
            | (u16::from(tag.drop_eligible_indicator()) << 12)
            | tag.vlan_identifier().value();
        tags.push((ether_type.0, tci));
        ether_type = tag.ether_type();
        rest = tag.payload_slice();
    }
    (tags, ether_type.0, offset_in(f, rest))
}

/// The checksum etherparse computes for an L4 segment, next to the one on the wire.
struct Checksum {
    wire: u16,
    computed: u16,
}

/// Reads the L4 header the builder laid out at the start of `seg` (the bytes the IP
/// length fields cover after all IP headers) and asserts its fields; returns where its
/// payload starts and the checksum pair. `pseudo` is the pseudo-header (source,
/// destination) for etherparse's checksum functions.
fn assert_l4(l4: L4, seg: &[u8], pseudo: Pseudo, what: &str) -> (usize, Checksum) {
    match l4 {
        L4::Tcp {
            sport,
            dport,
            flags,
        } => {
            let tcp = TcpSlice::from_slice(seg).unwrap_or_else(|e| panic!("{what}: TCP: {e}"));
            assert_eq!(
                (tcp.source_port(), tcp.destination_port()),
                (sport, dport),
                "{what}: TCP ports"
            );
            let bits = [
                (TCP_FIN, tcp.fin()),
                (TCP_SYN, tcp.syn()),
                (TCP_RST, tcp.rst()),
                (TCP_PSH, tcp.psh()),
                (TCP_ACK, tcp.ack()),
                (TCP_URG, tcp.urg()),
                (TCP_ECE, tcp.ece()),
                (TCP_CWR, tcp.cwr()),
            ];
            for (bit, set) in bits {
                assert_eq!(set, flags & bit != 0, "{what}: TCP flag {bit:#04x}");
            }
            assert!(!tcp.ns(), "{what}: TCP NS");
            assert_eq!(tcp.data_offset(), 5, "{what}: TCP data offset");
            assert_eq!(tcp.sequence_number(), 1, "{what}: TCP sequence number");
            assert_eq!(
                tcp.acknowledgment_number(),
                u32::from(flags & TCP_ACK != 0),
                "{what}: TCP acknowledgement number"
            );
            assert_eq!(
                (tcp.window_size(), tcp.urgent_pointer()),
                (64240, 0),
                "{what}: TCP window and urgent pointer"
            );
            let header = tcp.to_header();
            let computed = match pseudo {
                Pseudo::V4(ip) => header.calc_checksum_ipv4_raw(ip.0, ip.1, tcp.payload()),
                Pseudo::V6(ip) => header.calc_checksum_ipv6_raw(ip.0, ip.1, tcp.payload()),
            }
            .unwrap();
            let wire = tcp.checksum();
            (offset_in(seg, tcp.payload()), Checksum { wire, computed })
        }
        L4::Udp { sport, dport } => {
            // `from_slice` also checks that the UDP Length fits what IP carries.
            let udp = UdpSlice::from_slice(seg).unwrap_or_else(|e| panic!("{what}: UDP: {e}"));
            assert_eq!(
                (udp.source_port(), udp.destination_port()),
                (sport, dport),
                "{what}: UDP ports"
            );
            assert_eq!(usize::from(udp.length()), seg.len(), "{what}: UDP length");
            let header = udp.to_header();
            let computed = match pseudo {
                Pseudo::V4(ip) => header.calc_checksum_ipv4_raw(ip.0, ip.1, udp.payload()),
                Pseudo::V6(ip) => header.calc_checksum_ipv6_raw(ip.0, ip.1, udp.payload()),
            }
            .unwrap();
            let wire = udp.checksum();
            (offset_in(seg, udp.payload()), Checksum { wire, computed })
        }
        L4::IcmpEcho => match pseudo {
            Pseudo::V4(_) => {
                let icmp =
                    Icmpv4Slice::from_slice(seg).unwrap_or_else(|e| panic!("{what}: ICMP: {e}"));
                let echo = etherparse::IcmpEchoHeader { id: 1, seq: 1 };
                assert_eq!(
                    icmp.icmp_type(),
                    Icmpv4Type::EchoRequest(echo),
                    "{what}: ICMP type"
                );
                assert_eq!(icmp.code_u8(), 0, "{what}: ICMP code");
                let computed = icmp.icmp_type().calc_checksum(icmp.payload());
                let wire = icmp.checksum();
                (offset_in(seg, icmp.payload()), Checksum { wire, computed })
            }
            Pseudo::V6(ip) => {
                let icmp =
                    Icmpv6Slice::from_slice(seg).unwrap_or_else(|e| panic!("{what}: ICMPv6: {e}"));
                let echo = etherparse::IcmpEchoHeader { id: 1, seq: 1 };
                assert_eq!(
                    icmp.icmp_type(),
                    Icmpv6Type::EchoRequest(echo),
                    "{what}: ICMPv6 type"
                );
                let computed = icmp
                    .icmp_type()
                    .calc_checksum(ip.0, ip.1, icmp.payload())
                    .unwrap();
                let wire = icmp.checksum();
                (offset_in(seg, icmp.payload()), Checksum { wire, computed })
            }
        },
        L4::Raw(_) => unreachable!("a raw protocol has no L4 header"),
    }
}

#[derive(Clone, Copy)]
enum Pseudo {
    V4(([u8; 4], [u8; 4])),
    V6(([u8; 16], [u8; 16])),
}

/// Asserts the IPv4 header at `f[l3..]` holds what `b` asked for; returns the segment
/// after it (what Total Length covers) and whether an L4 header is laid out.
fn assert_ipv4<'f>(
    b: &FrameBuilder,
    f: &'f [u8],
    l3: usize,
    src: Ipv4Addr,
    dst: Ipv4Addr,
    what: &str,
) -> (&'f [u8], bool) {
    let ip = Ipv4Slice::from_slice(&f[l3..]).unwrap_or_else(|e| panic!("{what}: IPv4: {e}"));
    let h = ip.header();
    let words = usize::from(b.ipv4_option_words);
    assert_eq!(usize::from(h.ihl()), 5 + words, "{what}: IHL");
    assert!(
        h.options().iter().all(|&o| o == 1) && h.options().len() == 4 * words,
        "{what}: IPv4 options are {} NOPs: {:?}",
        4 * words,
        h.options()
    );
    assert_eq!(
        usize::from(h.total_len()),
        f.len() - l3,
        "{what}: Total Length"
    );
    assert_eq!(h.identification(), b.ip_id, "{what}: Identification");
    assert!(!h.dont_fragment(), "{what}: DF");
    assert_eq!(
        (h.fragments_offset().value(), h.more_fragments()),
        (b.ipv4_frag_offset, b.ipv4_more_fragments),
        "{what}: fragment offset and MF"
    );
    assert_eq!(h.ttl(), b.ttl, "{what}: TTL");
    assert_eq!(
        h.protocol(),
        IpNumber(b.l4.protocol(false)),
        "{what}: protocol"
    );
    assert_eq!(
        (h.source_addr(), h.destination_addr()),
        (src, dst),
        "{what}: addresses"
    );
    assert_eq!(
        h.header_checksum(),
        h.to_header().calc_header_checksum(),
        "{what}: IPv4 header checksum"
    );
    assert_eq!(
        ip.payload().fragmented,
        b.ipv4_frag_offset != 0 || b.ipv4_more_fragments,
        "{what}: etherparse's view of fragmentation"
    );
    (
        ip.payload().payload,
        b.ipv4_frag_offset == 0 && b.l4.has_header(),
    )
}

/// What a non-first fragment header ends: etherparse reads on through a fragment's
/// payload as if the headers after the Fragment header were there (they are only in
/// the first fragment), so the chain is compared up to it.
fn is_non_first_fragment(e: &Ipv6Ext) -> bool {
    matches!(e, Ipv6Ext::Fragment { offset, .. } if *offset != 0)
}

/// Asserts the IPv6 header and extension chain at `f[l3..]` hold what `b` asked for;
/// returns the segment after the chain and whether an L4 header is laid out.
fn assert_ipv6<'f>(
    b: &FrameBuilder,
    f: &'f [u8],
    l3: usize,
    src: Ipv6Addr,
    dst: Ipv6Addr,
    what: &str,
) -> (&'f [u8], bool) {
    let h = Ipv6HeaderSlice::from_slice(&f[l3..]).unwrap_or_else(|e| panic!("{what}: IPv6: {e}"));
    assert_eq!(
        (h.traffic_class(), h.flow_label().value()),
        (0, 0),
        "{what}: traffic class and flow label"
    );
    assert_eq!(
        usize::from(h.payload_length()),
        f.len() - l3 - IPV6_HLEN,
        "{what}: Payload Length"
    );
    assert_eq!(h.hop_limit(), b.ttl, "{what}: hop limit");
    assert_eq!(
        (h.source_addr(), h.destination_addr()),
        (src, dst),
        "{what}: addresses"
    );
    let proto = b.l4.protocol(true);
    // The chain the builder lays out: up to and including a non-first fragment.
    let cut = b
        .ipv6_exts
        .iter()
        .position(is_non_first_fragment)
        .map_or(b.ipv6_exts.len(), |i| i + 1);
    let chain = &b.ipv6_exts[..cut];
    let announced = |i: usize| b.ipv6_exts.get(i).map_or(proto, |e| e.protocol());
    assert_eq!(
        h.next_header(),
        IpNumber(announced(0)),
        "{what}: Next Header"
    );

    let body = &f[l3 + IPV6_HLEN..];
    let (exts, _, after, error) = Ipv6ExtensionsSlice::from_slice_lax(h.next_header(), body);
    let read = ext_headers(&exts);
    let non_first = chain.last().is_some_and(is_non_first_fragment);
    let trailing = cut < b.ipv6_exts.len();
    if trailing {
        // Headers after a non-first fragment's Fragment header: see
        // `is_non_first_fragment`; etherparse's reading of the payload is not compared.
        assert!(read.len() >= chain.len(), "{what}: extension headers read");
    } else {
        assert!(error.is_none(), "{what}: extension headers: {error:?}");
        assert_eq!(read.len(), chain.len(), "{what}: extension headers read");
    }
    let mut at = 0;
    for (i, (ext, got)) in chain.iter().zip(&read).enumerate() {
        let what = format!("{what}: extension header {i} ({ext:?})");
        let (len, next) = match (ext, got) {
            (Ipv6Ext::HopByHop | Ipv6Ext::HopByHopLen(_), Ipv6ExtensionSlice::HopByHop(s))
            | (
                Ipv6Ext::DestOpts | Ipv6Ext::DestOptsLen(_),
                Ipv6ExtensionSlice::DestinationOptions(s),
            ) => {
                assert_padding_options(s.payload(), &what);
                (s.slice().len(), s.next_header())
            }
            (Ipv6Ext::Routing, Ipv6ExtensionSlice::Routing(s)) => {
                // Routing Type 4 (SRH), Segments Left 0, Last Entry 0, Flags 0, Tag 0,
                // then the one segment: the destination.
                let p = s.payload();
                assert_eq!(&p[..6], &[4, 0, 0, 0, 0, 0], "{what}: SRH fields");
                assert_eq!(&p[6..], &dst.octets(), "{what}: SRH segment");
                (s.slice().len(), s.next_header())
            }
            (Ipv6Ext::Fragment { offset, more }, Ipv6ExtensionSlice::Fragment(s)) => {
                assert_eq!(
                    (s.fragment_offset().value(), s.more_fragments()),
                    (*offset, *more),
                    "{what}: offset and M"
                );
                assert_eq!(
                    s.identification(),
                    u32::from(b.ip_id),
                    "{what}: Identification"
                );
                (s.slice().len(), s.next_header())
            }
            (Ipv6Ext::Ah, Ipv6ExtensionSlice::Authentication(s)) => {
                assert_eq!(
                    (s.spi(), s.sequence_number(), s.raw_icv()),
                    (0x100, 1, &[0; 12][..]),
                    "{what}: SPI, sequence number, ICV"
                );
                (s.slice().len(), s.next_header())
            }
            (want, got) => panic!("{what}: etherparse read {got:?}, not {want:?}"),
        };
        assert_eq!(len, ext.wire_len(), "{what}: length");
        assert_eq!(next, IpNumber(announced(i + 1)), "{what}: Next Header");
        at += len;
    }
    let l4 = !non_first && b.l4.has_header();
    if !trailing {
        assert_eq!(offset_in(body, after), at, "{what}: end of the chain");
    }
    (&body[at..], l4)
}

/// Asserts that an options header's option area is exactly filled with Pad1/PadN options
/// of zeros. (etherparse 0.16 keeps the option area raw, so this walks it.)
fn assert_padding_options(area: &[u8], what: &str) {
    let mut i = 0;
    while i < area.len() {
        match area[i] {
            0 => i += 1,
            1 => {
                let n = usize::from(area[i + 1]);
                assert!(
                    area[i + 2..i + 2 + n].iter().all(|&b| b == 0),
                    "{what}: PadN"
                );
                i += 2 + n;
            }
            t => panic!("{what}: option type {t}, not padding"),
        }
    }
    assert_eq!(i, area.len(), "{what}: options overrun the header");
}

/// What etherparse read from a built frame: where each layer starts.
#[derive(Debug)]
struct Read {
    frame: Vec<u8>,
    offsets: Offsets,
}

/// Builds `b`, reads the frame with etherparse and asserts every field the builder was
/// asked for: MACs, VLAN tags, EtherType, the IPv4 header (IHL and options, lengths,
/// Identification, fragment offset and MF, TTL, protocol, addresses, checksum) or the
/// IPv6 header and its extension chain, the L4 header and its checksum, and the payload.
/// Returns the frame and the offsets etherparse found, which must be the builder's.
///
/// Frames whose IP length does not fit 16 bits (the builder saturates those fields) are
/// not for this function; see `oversized_lengths_saturate`.
fn assert_reads_back(b: &FrameBuilder, what: &str) -> Read {
    let (f, built_offsets) = b.build_with_offsets();
    assert_eq!(f, b.build(), "{what}: build and build_with_offsets agree");
    let eth = Ethernet2Slice::from_slice_without_fcs(&f)
        .unwrap_or_else(|e| panic!("{what}: Ethernet: {e}"));
    assert_eq!(
        (eth.destination(), eth.source()),
        (b.dst_mac, b.src_mac),
        "{what}: MACs"
    );
    let (tags, ether_type, l3) = read_l2(&f);
    // Tags up to the first TPID etherparse does not know; that one is the EtherType, and
    // the rest of the frame its payload.
    let known = b
        .tags
        .iter()
        .take_while(|(tpid, _)| VLAN_TPIDS.contains(tpid))
        .count();
    assert_eq!(tags, b.tags[..known], "{what}: VLAN tags");
    assert_eq!(
        l3_ethertype(&f),
        Some((ether_type, l3)),
        "{what}: l3_ethertype"
    );
    if known < b.tags.len() {
        assert_eq!(ether_type, b.tags[known].0, "{what}: unknown TPID");
        return Read {
            frame: f,
            offsets: built_offsets,
        };
    }
    assert_eq!(ether_type, b.l3.ethertype(), "{what}: EtherType");

    let (l4, payload) = match b.l3 {
        L3::Raw { ref body, .. } => {
            assert_eq!(&f[l3..l3 + body.len()], &body[..], "{what}: body");
            (None, l3 + body.len())
        }
        L3::Arp { spa, tpa } => {
            let arp =
                ArpPacketSlice::from_slice(&f[l3..]).unwrap_or_else(|e| panic!("{what}: ARP: {e}"));
            assert_eq!(
                (arp.hw_addr_type(), arp.proto_addr_type(), arp.operation()),
                (
                    ArpHardwareId::ETHERNET,
                    EtherType::IPV4,
                    ArpOperation::REQUEST
                ),
                "{what}: ARP types and operation"
            );
            assert_eq!(
                (arp.sender_hw_addr(), arp.sender_protocol_addr()),
                (&b.src_mac[..], &spa.octets()[..]),
                "{what}: ARP sender"
            );
            assert_eq!(
                (arp.target_hw_addr(), arp.target_protocol_addr()),
                (&[0; 6][..], &tpa.octets()[..]),
                "{what}: ARP target"
            );
            (None, l3 + arp.slice().len())
        }
        L3::Ipv4 { src, dst } => {
            let (seg, has_l4) = assert_ipv4(b, &f, l3, src, dst, what);
            let pseudo = Pseudo::V4((src.octets(), dst.octets()));
            l4_and_payload(b, &f, seg, has_l4, pseudo, what)
        }
        L3::Ipv6 { src, dst } => {
            let (seg, has_l4) = assert_ipv6(b, &f, l3, src, dst, what);
            let pseudo = Pseudo::V6((src.octets(), dst.octets()));
            l4_and_payload(b, &f, seg, has_l4, pseudo, what)
        }
    };
    assert_eq!(
        &f[payload..],
        &expected_payload(b, payload)[..],
        "{what}: payload"
    );
    let offsets = Offsets { l3, l4, payload };
    assert_eq!(built_offsets, offsets, "{what}: offsets");
    assert_eq!(b.header_len(), payload, "{what}: header_len");
    assert_whole_frame_agrees(b, &f, what);
    Read { frame: f, offsets }
}

/// Reads the L4 header (if one is laid out) from the IP segment `seg` and checks its
/// checksum; returns the L4 offset and the payload offset in `f`.
fn l4_and_payload(
    b: &FrameBuilder,
    f: &[u8],
    seg: &[u8],
    has_l4: bool,
    pseudo: Pseudo,
    what: &str,
) -> (Option<usize>, usize) {
    let start = offset_in(f, seg);
    if !has_l4 {
        return (None, start);
    }
    let (payload, sum) = assert_l4(b.l4, seg, pseudo, what);
    assert_eq!(sum.wire, sum.computed, "{what}: L4 checksum");
    (Some(start), start + payload)
}

/// etherparse's one-call parse of the whole frame agrees on the transport layer: present
/// (and of the builder's kind) unless the IP payload is fragmented. It slices at most two
/// VLAN tags and an opaque protocol has no header to find, so those frames are left out.
fn assert_whole_frame_agrees(b: &FrameBuilder, f: &[u8], what: &str) {
    if b.tags.len() > 2 || !b.l4.has_header() || matches!(b.l3, L3::Arp { .. } | L3::Raw { .. }) {
        return;
    }
    let non_first = b.ipv6_exts.iter().position(is_non_first_fragment);
    if non_first.is_some_and(|i| i + 1 < b.ipv6_exts.len()) {
        return; // etherparse reads the fragment's payload as the next header
    }
    let p = SlicedPacket::from_ethernet(f).unwrap_or_else(|e| panic!("{what}: etherparse: {e}"));
    let fragmented = p.is_ip_payload_fragmented();
    let want_fragmented = match b.l3 {
        L3::Ipv4 { .. } => b.ipv4_frag_offset != 0 || b.ipv4_more_fragments,
        _ => b
            .ipv6_exts
            .iter()
            .any(|e| matches!(e, Ipv6Ext::Fragment { offset, more } if *offset != 0 || *more)),
    };
    assert_eq!(fragmented, want_fragmented, "{what}: fragmented");
    match (&p.transport, b.l4) {
        (None, _) if fragmented => {}
        (Some(TransportSlice::Tcp(_)), L4::Tcp { .. })
        | (Some(TransportSlice::Udp(_)), L4::Udp { .. })
        | (Some(TransportSlice::Icmpv4(_) | TransportSlice::Icmpv6(_)), L4::IcmpEcho) => {}
        (got, want) => panic!("{what}: etherparse's transport {got:?}, builder's {want:?}"),
    }
}

// ---- layouts ----------------------------------------------------------------------

/// One layout: the builder, and where its layers must start (spelled out from the header
/// sizes, so a wrong size in the builder and in the reader cannot cancel out).
struct Layout {
    name: &'static str,
    b: FrameBuilder,
    len: usize,
    l3: usize,
    l4: Option<usize>,
    payload: usize,
}

fn layouts() -> Vec<Layout> {
    use Ipv6Ext::*;
    let first_fragment = Fragment {
        offset: 0,
        more: true,
    };
    let mut v6_all = v6().udp(1, 2);
    for e in [
        HopByHop,
        Routing,
        DestOpts,
        Ah,
        first_fragment,
        DestOptsLen(3),
    ] {
        v6_all = v6_all.ipv6_ext(e);
    }
    let row = |name, b, len, l3, l4, payload| Layout {
        name,
        b,
        len,
        l3,
        l4,
        payload,
    };
    vec![
        row("v4 default", v4(), 34, 14, None, 34),
        row("v4 tcp", v4().tcp(1, 2, TCP_SYN), 54, 14, Some(34), 54),
        row("v4 udp", v4().udp(1, 2), 42, 14, Some(34), 42),
        row("v4 icmp", v4().icmp_echo(), 42, 14, Some(34), 42),
        row(
            "v4 proto 47",
            v4().proto(47).payload_len(3),
            37,
            14,
            None,
            34,
        ),
        row(
            "v4 tcp payload",
            v4().tcp(1, 2, TCP_ACK).payload_len(100),
            154,
            14,
            Some(34),
            54,
        ),
        row(
            "v4 tcp vlan",
            v4().vlan(ETH_P_8021Q, 10).tcp(1, 2, TCP_SYN),
            58,
            18,
            Some(38),
            58,
        ),
        row(
            "v4 udp qinq",
            v4().vlan(ETH_P_8021AD, 100).vlan(ETH_P_8021Q, 10).udp(1, 2),
            50,
            22,
            Some(42),
            50,
        ),
        row(
            "v4 udp triple tag",
            v4().vlan(ETH_P_8021AD, 1)
                .vlan(ETH_P_8021Q, 2)
                .vlan(ETH_P_8021Q, 3)
                .udp(1, 2),
            54,
            26,
            Some(46),
            54,
        ),
        row(
            "v4 options 10",
            v4().ipv4_options(10).tcp(1, 2, TCP_SYN),
            94,
            14,
            Some(74),
            94,
        ),
        row(
            "v4 non-first fragment",
            v4().tcp(1, 2, TCP_SYN)
                .ipv4_fragment(3, true)
                .payload_len(16),
            50,
            14,
            None,
            34,
        ),
        row(
            "v4 first fragment",
            v4().tcp(1, 2, TCP_SYN)
                .ipv4_fragment(0, true)
                .payload_len(16),
            70,
            14,
            Some(34),
            54,
        ),
        row("v6 default", v6(), 54, 14, None, 54),
        row("v6 tcp", v6().tcp(1, 2, TCP_SYN), 74, 14, Some(54), 74),
        row("v6 udp", v6().udp(1, 2), 62, 14, Some(54), 62),
        row("v6 icmp", v6().icmp_echo(), 62, 14, Some(54), 62),
        row(
            "v6 hbh tcp vlan",
            v6().vlan(ETH_P_8021Q, 7)
                .ipv6_ext(HopByHop)
                .tcp(1, 2, TCP_SYN),
            86,
            18,
            Some(66),
            86,
        ),
        row("v6 all exts", v6_all, 14 + 40 + 104 + 8, 14, Some(158), 166),
        row(
            "v6 non-first fragment",
            v6().ipv6_ext(Fragment {
                offset: 5,
                more: false,
            })
            .ipv6_ext(DestOpts)
            .tcp(1, 2, TCP_SYN)
            .payload_len(10),
            72,
            14,
            None,
            62,
        ),
        row("arp", FrameBuilder::arp(), 42, 14, None, 42),
        row(
            "arp padded",
            FrameBuilder::arp().frame_len(60),
            60,
            14,
            None,
            42,
        ),
        row(
            "arp tagged",
            FrameBuilder::arp().vlan(ETH_P_8021Q, 5),
            46,
            18,
            None,
            46,
        ),
        row(
            "lldp",
            FrameBuilder::ethertype(ETH_P_LLDP, &[1, 2, 3, 4, 5]),
            19,
            14,
            None,
            19,
        ),
    ]
}

#[test]
fn layouts_of_every_variant() {
    for c in layouts() {
        let read = assert_reads_back(&c.b, c.name);
        assert_eq!(read.frame.len(), c.len, "{}: length", c.name);
        assert_eq!(
            read.offsets,
            Offsets {
                l3: c.l3,
                l4: c.l4,
                payload: c.payload
            },
            "{}: offsets",
            c.name
        );
        assert_eq!(l3_offset(&read.frame), Some(c.l3), "{}: l3_offset", c.name);
    }
}

#[test]
fn defaults_and_macs() {
    let defaults = v4();
    assert_eq!(
        (defaults.src_mac, defaults.dst_mac),
        (DEFAULT_SRC_MAC, DEFAULT_DST_MAC)
    );
    assert_eq!(
        (defaults.ttl, defaults.ip_id, defaults.l4),
        (64, 0x1234, L4::Raw(IPPROTO_EXPERIMENT))
    );
    let f = assert_reads_back(&defaults, "defaults").frame;
    let h = Ipv4HeaderSlice::from_slice(&f[14..]).unwrap();
    assert_eq!(
        (h.ttl(), h.identification(), h.protocol()),
        (64, 0x1234, IpNumber(253))
    );
    let custom = v4()
        .macs([1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12])
        .ttl(3)
        .ip_id(99);
    let f = assert_reads_back(&custom, "custom").frame;
    let eth = Ethernet2Slice::from_slice_without_fcs(&f).unwrap();
    assert_eq!(
        (eth.source(), eth.destination()),
        ([1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12])
    );
    assert_reads_back(&v6().ttl(7), "v6 hop limit");
}

#[test]
fn tcp_udp_icmp_fields() {
    let rows = [
        ("v4 syn-ack", v4().tcp(40000, 80, TCP_SYN | TCP_ACK)),
        ("v6 syn", v6().tcp(1, 443, TCP_SYN)),
        ("v4 all flags", v4().tcp(1, 2, 0xff).payload_len(3)),
        ("v4 no flags", v4().tcp(65535, 0, 0)),
        ("v4 udp", v4().udp(53, 5353).payload_len(5)),
        ("v6 udp", v6().udp(0, 65535).payload_len(5)),
        ("v4 icmp", v4().icmp_echo().payload_len(7)),
        ("v6 icmp", v6().icmp_echo().payload_len(7)),
    ];
    for (name, b) in rows {
        assert_reads_back(&b, name);
    }
    let consts = [
        TCP_FIN, TCP_SYN, TCP_RST, TCP_PSH, TCP_ACK, TCP_URG, TCP_ECE, TCP_CWR,
    ];
    assert_eq!(consts.iter().fold(0, |a, b| a | b), 0xff);
}

#[test]
fn proto_lays_out_no_l4_header() {
    // "TCP" without a TCP header: the payload follows the IP header at once.
    let read = assert_reads_back(&v4().proto(IPPROTO_TCP).payload_len(3), "v4 proto tcp");
    assert_eq!(
        read.offsets,
        Offsets {
            l3: 14,
            l4: None,
            payload: 34
        }
    );
    // What etherparse makes of it: a TCP header cut short.
    let err = SlicedPacket::from_ethernet(&read.frame).unwrap_err();
    assert!(
        matches!(&err, etherparse::err::packet::SliceError::Len(l) if l.layer == Layer::TcpHeader),
        "{err:?}"
    );
    let read = assert_reads_back(&v6().proto(IPPROTO_UDP), "v6 proto udp");
    assert_eq!((read.frame.len(), read.offsets.l4), (54, None));
}

#[test]
fn payload_is_pattern_or_given_bytes() {
    assert_reads_back(&v4().udp(1, 2).payload_len(600), "pattern");
    assert_reads_back(&v6().tcp(1, 2, 0).payload(&[9, 8, 7]), "bytes");
    // The last of payload_len / payload / frame_len wins.
    for (b, len) in [
        (v4().payload(&[1]).payload_len(2), 36),
        (v4().frame_len(100).payload_len(2), 36),
        (v4().payload_len(2).frame_len(100), 100),
        (v4().payload_len(2).payload(&[7]), 35),
    ] {
        assert_eq!(assert_reads_back(&b, "last wins").frame.len(), len, "{b:?}");
    }
}

#[test]
fn frame_len_is_exact() {
    use Ipv6Ext::*;
    let builders = [
        v4(),
        v4().tcp(1, 2, TCP_SYN).vlan(ETH_P_8021Q, 1),
        v4().udp(1, 2).ipv4_options(4),
        v4().icmp_echo().vlan(ETH_P_8021AD, 1).vlan(ETH_P_8021Q, 2),
        v4().proto(47).ipv4_fragment(100, false),
        v6().udp(1, 2),
        v6().tcp(1, 2, TCP_ACK).ipv6_ext(HopByHop).ipv6_ext(Routing),
        v6().icmp_echo().vlan(ETH_P_8021Q, 9),
        FrameBuilder::arp(),
        FrameBuilder::ethertype(ETH_P_LLDP, &[0; 20]),
    ];
    for b in &builders {
        for n in [60, 64, 65, 128, 1514, 9000, 65535 + 14] {
            let read = assert_reads_back(&b.clone().frame_len(n), &format!("{n}: {b:?}"));
            assert_eq!(read.frame.len(), n.max(b.header_len()), "{b:?}");
        }
    }
    // Headers longer than the asked length: nothing is cut.
    let big = v6()
        .ipv6_ext(HopByHop)
        .ipv6_ext(Routing)
        .ipv6_ext(Ah)
        .tcp(1, 2, TCP_SYN);
    let read = assert_reads_back(&big.clone().frame_len(64), "long headers");
    assert_eq!(read.frame.len(), 14 + 40 + 8 + 24 + 24 + 20);
    assert_eq!(read.frame.len(), big.header_len());
}

/// Lengths past 16 bits are written as 0xffff. No reader can take such a frame as it
/// is: etherparse reads the 0xffff bytes IPv4 says, then finds the UDP Length (0xffff
/// too) longer than what is left of them.
#[test]
fn oversized_lengths_saturate() {
    let f = v4().udp(1, 2).payload_len(70_000).build();
    let ip = Ipv4Slice::from_slice(&f[14..]).unwrap();
    assert_eq!(ip.header().total_len(), 0xffff);
    let udp = UdpSlice::from_slice_lax(ip.payload().payload).unwrap();
    assert_eq!(udp.length(), 0xffff);
    let err = UdpSlice::from_slice(ip.payload().payload).unwrap_err();
    assert_eq!(err.layer, Layer::UdpPayload, "{err:?}");
    let f = v6().payload_len(70_000).build();
    let h = Ipv6HeaderSlice::from_slice(&f[14..]).unwrap();
    assert_eq!(h.payload_length(), 0xffff);
}

// ---- L2 ---------------------------------------------------------------------------

#[test]
fn vlan_tags_in_order() {
    let rows = [
        (
            "three tags",
            v4().vlan(ETH_P_8021AD, 100)
                .vlan(ETH_P_8021Q, 10)
                .vlan(ETH_P_8021Q, 4095)
                .udp(1, 2),
        ),
        // A raw TCI keeps PCP and DEI.
        ("raw tci", v6().vlan_tci(ETH_P_8021Q, 0xe00a)),
        ("legacy 0x9100", v4().vlan(ETH_P_QINQ1, 5)),
        // An unknown TPID is not skipped: it is the EtherType.
        ("unknown tpid", v4().vlan(0x9200, 5)),
    ];
    for (name, b) in rows {
        assert_reads_back(&b, name);
    }
    let f = v4().vlan(0x9200, 5).build();
    assert_eq!(read_l2(&f), (vec![], 0x9200, 14));
    assert_eq!(l3_ethertype(&f), Some((0x9200, 14)));
    // Two tags are what etherparse's one-call parse takes: it agrees on both.
    let f = v4()
        .vlan(ETH_P_8021AD, 100)
        .vlan_tci(ETH_P_8021Q, 0x300a)
        .build();
    let p = SlicedPacket::from_ethernet(&f).unwrap();
    let Some(etherparse::VlanSlice::DoubleVlan(d)) = p.vlan() else {
        panic!("{:?}", p.vlan());
    };
    assert_eq!(
        (
            d.outer.vlan_identifier().value(),
            d.inner.vlan_identifier().value(),
            d.inner.priority_code_point().value(),
            d.inner.drop_eligible_indicator()
        ),
        (100, 10, 1, true)
    );
}

#[test]
#[should_panic(expected = "12 bits")]
fn vlan_id_out_of_range_panics() {
    let _ = v4().vlan(ETH_P_8021Q, 4096);
}

/// `l3_offset` on frames cut inside the tags: etherparse agrees the frame ends there.
#[test]
fn l3_offset_on_short_frames() {
    assert_eq!(l3_offset(&[]), None);
    assert_eq!(l3_offset(&[0; 13]), None);
    assert_eq!(l3_offset(&[0; 14]), Some(14));
    let f = v4().vlan(ETH_P_8021Q, 1).build();
    assert_eq!(l3_offset(&f[..17]), None);
    let err = SingleVlanSlice::from_slice(&f[14..17]).unwrap_err();
    assert_eq!(err.layer, Layer::VlanHeader);
    assert_eq!(l3_offset(&f[..18]), Some(18));
    assert!(Ethernet2Slice::from_slice_without_fcs(&f[..13]).is_err());
}

#[test]
fn arp_requests() {
    assert_reads_back(
        &FrameBuilder::arp().macs([2, 0, 0, 0, 0, 9], BROADCAST_MAC),
        "arp",
    );
    let f = assert_reads_back(&FrameBuilder::arp_request(B4, A4), "arp_request").frame;
    assert_eq!(f.len(), 14 + ARP_LEN);
    let eth = Ethernet2Slice::from_slice_without_fcs(&f).unwrap();
    assert_eq!(
        (eth.destination(), eth.ether_type()),
        (BROADCAST_MAC, EtherType::ARP)
    );
}

#[test]
fn raw_ethertype_exact_bytes() {
    let b = FrameBuilder::ethertype(ETH_P_LLDP, &[0xaa, 0xbb]).vlan(ETH_P_8021Q, 0x123);
    let f = assert_reads_back(&b, "lldp").frame;
    let p = SlicedPacket::from_ethernet(&f).unwrap();
    let payload = p.ether_payload().unwrap();
    assert_eq!(
        (payload.ether_type, payload.payload),
        (EtherType(ETH_P_LLDP), &[0xaa, 0xbb][..])
    );
}

// ---- IPv4 -------------------------------------------------------------------------

#[test]
fn ipv4_options_set_ihl() {
    for words in 0..=10 {
        let b = v4()
            .vlan(ETH_P_8021Q, 3)
            .ipv4_options(words)
            .tcp(7, 8, TCP_SYN)
            .payload_len(3);
        let read = assert_reads_back(&b, &format!("{words} option words"));
        assert_eq!(read.offsets.l4, Some(18 + 20 + 4 * words));
    }
}

#[test]
#[should_panic(expected = "IHL")]
fn ipv4_options_out_of_range_panics() {
    let _ = v4().ipv4_options(11);
}

#[test]
fn ipv4_fragments() {
    for (offset, more) in [
        (0, true),
        (0, false),
        (1, true),
        (185, false),
        (0x1fff, true),
    ] {
        for l4 in [v4().tcp(1, 2, TCP_SYN), v4().udp(1, 2), v4().icmp_echo()] {
            let b = l4.ipv4_fragment(offset, more).ip_id(0xbeef).payload_len(24);
            let read = assert_reads_back(&b, &format!("offset {offset} MF {more}"));
            let non_first = offset != 0;
            assert_eq!(read.offsets.l4.is_none(), non_first, "{b:?}");
        }
    }
}

// ---- IPv6 -------------------------------------------------------------------------

#[test]
fn ipv6_extension_chain() {
    use Ipv6Ext::*;
    let chains: Vec<Vec<Ipv6Ext>> = vec![
        vec![],
        vec![HopByHop],
        vec![Routing],
        vec![DestOpts],
        vec![Ah],
        vec![Fragment {
            offset: 0,
            more: true,
        }],
        vec![HopByHopLen(1), DestOptsLen(160)],
        vec![
            HopByHop,
            DestOpts,
            Routing,
            Fragment {
                offset: 0,
                more: false,
            },
            Ah,
            DestOptsLen(32),
        ],
        vec![HopByHopLen(31), DestOptsLen(255), DestOptsLen(0)],
    ];
    for chain in &chains {
        for l4 in [
            v6().tcp(1, 2, TCP_SYN),
            v6().udp(1, 2),
            v6().icmp_echo(),
            v6().proto(IPPROTO_NONE),
        ] {
            let mut b = l4.vlan(ETH_P_8021Q, 2).payload_len(11);
            for e in chain {
                b = b.ipv6_ext(*e);
            }
            let read = assert_reads_back(&b, &format!("{chain:?}"));
            let ext_end = 18 + 40 + chain.iter().map(|e| e.wire_len()).sum::<usize>();
            assert_eq!(read.offsets.l4.unwrap_or(ext_end), ext_end);
        }
    }
}

/// A Hop-by-Hop header anywhere but first is against RFC 8200; the builder lays it out
/// as asked (the XDP parser must cope), and etherparse refuses it.
#[test]
fn ipv6_hop_by_hop_after_another_header() {
    use Ipv6Ext::*;
    let f = v6()
        .ipv6_ext(DestOptsLen(255))
        .ipv6_ext(HopByHopLen(31))
        .udp(1, 2)
        .build();
    let (exts, _, _, error) =
        Ipv6ExtensionsSlice::from_slice_lax(IpNumber::IPV6_DESTINATION_OPTIONS, &f[54..]);
    assert!(
        matches!(
            ext_headers(&exts).first(),
            Some(Ipv6ExtensionSlice::DestinationOptions(_))
        ),
        "{exts:?}"
    );
    assert!(
        matches!(
            error,
            Some((
                ipv6_exts::HeaderSliceError::Content(ipv6_exts::HeaderError::HopByHopNotAtStart),
                _
            ))
        ),
        "{error:?}"
    );
}

#[test]
fn ipv6_non_first_fragment_stops_the_chain() {
    use Ipv6Ext::*;
    let b = v6()
        .ipv6_ext(HopByHop)
        .ipv6_ext(Fragment {
            offset: 0x1fff,
            more: true,
        })
        .ipv6_ext(DestOpts)
        .udp(1, 2)
        .ip_id(7)
        .payload_len(9);
    let read = assert_reads_back(&b, "non-first fragment");
    assert_eq!(read.offsets.l4, None);
    assert_eq!(read.offsets.payload, 14 + 40 + 16);
    // etherparse reads on into the fragment's payload as if the Destination Options
    // the Fragment header announces were there; they are not (they travel in the first
    // fragment), so it finds a header longer than the 9 bytes left.
    let err = Ipv6ExtensionsSlice::from_slice(IpNumber::IPV6_HEADER_HOP_BY_HOP, &read.frame[54..])
        .unwrap_err();
    assert!(
        matches!(&err, ipv6_exts::HeaderSliceError::Len(l) if l.required_len > 9),
        "{err:?}"
    );
    assert_reads_back(
        &v6().ipv6_ext(Fragment {
            offset: 3,
            more: false,
        }),
        "offset 3",
    );
}

#[test]
#[should_panic(expected = "13 bits")]
fn ipv6_fragment_offset_out_of_range_panics() {
    let _ = v6().ipv6_ext(Ipv6Ext::Fragment {
        offset: 0x2000,
        more: false,
    });
}

// ---- checksums --------------------------------------------------------------------

#[test]
fn internet_checksum_known_answer() {
    // RFC 1071-style example header (192.168.0.1 -> 192.168.0.199, UDP, DF).
    let mut h = [
        0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8, 0x00,
        0x01, 0xc0, 0xa8, 0x00, 0xc7,
    ];
    assert_eq!(internet_checksum(&h), 0xb861);
    h[10] = 0xb8;
    h[11] = 0x61;
    assert_eq!(internet_checksum(&h), 0);
    // Odd length: the last byte is padded with zero.
    assert_eq!(internet_checksum(&[0x01]), !0x0100);
    assert_eq!(internet_checksum(&[]), 0xffff);
}

/// Frames checked once, byte for byte, against an outside packet library (scapy 2.8,
/// which built the same packets from scratch and recomputed every length and checksum
/// of these bytes).
#[test]
fn known_frames() {
    use Ipv6Ext::*;
    let cases = [
        (
            v4().tcp(40000, 80, TCP_SYN).payload_len(5),
            "02000000000202000000000108004500002d123400004006dc6fc6120001c61200029c4000500000\
             0001000000005002faf0862f00000001020304",
        ),
        (
            v4().tcp(40000, 80, TCP_SYN | TCP_ACK)
                .vlan(0x88a8, 5)
                .vlan(0x8100, 6)
                .ipv4_options(3)
                .payload_len(33),
            "02000000000202000000000188a8000581000006080048000055123400004006d341c6120001c612\
             00020101010101010101010101019c40005000000001000000015012faf07b050000000102030405\
             060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f20",
        ),
        (
            v6().icmp_echo()
                .ipv6_ext(Ah)
                .ipv6_ext(Fragment {
                    offset: 0,
                    more: true,
                })
                .payload_len(9),
            "02000000000202000000000186dd600000000031334020010db80000000000000000000000012001\
             0db80000000000000000000000022c04000000000100000000010000000000000000000000003a00\
             0001000012348000102d00010001000102030405060708",
        ),
        (
            v6().udp(7, 8).ipv6_ext(Routing).payload_len(9),
            "02000000000202000000000186dd6000000000292b4020010db80000000000000000000000012001\
             0db8000000000000000000000002110204000000000020010db80000000000000000000000020007\
             000800119038000102030405060708",
        ),
    ];
    for (b, want) in cases {
        let hex: String = b.build().iter().map(|x| format!("{x:02x}")).collect();
        assert_eq!(hex, want, "{b:?}");
    }
}

#[test]
fn checksums_over_all_l4_and_sizes() {
    use Ipv6Ext::*;
    for n in [0, 1, 2, 3, 17, 1000, 1001] {
        for tags in 0..=2 {
            let bs = [
                v4().tcp(1, 2, TCP_SYN | TCP_PSH),
                v4().udp(3, 4),
                v4().icmp_echo(),
                v4().udp(3, 4).ipv4_options(3),
                v6().tcp(1, 2, TCP_FIN),
                v6().udp(3, 4),
                v6().icmp_echo(),
                v6().icmp_echo().ipv6_ext(Routing).ipv6_ext(Ah),
            ];
            for mut b in bs {
                for t in 0..tags {
                    b = b.vlan(ETH_P_8021Q, t);
                }
                let read = assert_reads_back(&b.payload_len(n), &format!("{n} bytes"));
                assert!(read.offsets.l4.is_some());
            }
        }
    }
}

/// The UDP checksum field of `f`, whose UDP header is at `l4`, as etherparse reads it.
fn udp_checksum(f: &[u8], l4: usize) -> u16 {
    UdpSlice::from_slice(&f[l4..]).unwrap().checksum()
}

/// A payload chosen so the UDP sum is all ones: the computed checksum 0 must go on the
/// wire as 0xffff (RFC 768; etherparse computes it so too).
#[test]
fn udp_zero_checksum_is_sent_as_ffff() {
    for b in [v4().udp(1000, 2000), v6().udp(1000, 2000)] {
        let read = assert_reads_back(&b.clone().payload(&[0, 0]), "zeros");
        let l4 = read.offsets.l4.unwrap();
        let c = udp_checksum(&read.frame, l4);
        let read = assert_reads_back(&b.payload(&c.to_be_bytes()), "all ones");
        assert_eq!(udp_checksum(&read.frame, l4), 0xffff);
    }
    // The same through an incremental rewrite: a template from another source,
    // rewritten to the source whose sum is all ones.
    let src4 = Ipv4Addr::new(203, 0, 113, 9);
    let f = FrameBuilder::ipv4(src4, B4)
        .udp(1, 2)
        .payload(&[0, 0])
        .build();
    let c = udp_checksum(&f, 34).to_be_bytes();
    let want = FrameBuilder::ipv4(src4, B4).udp(1, 2).payload(&c);
    let mut f = v4().udp(1, 2).payload(&c).build();
    with_ipv4_src(&mut f, src4).unwrap();
    assert_eq!(udp_checksum(&f, 34), 0xffff);
    assert_eq!(f, assert_reads_back(&want, "rewritten v4").frame);
    let src6 = Ipv6Addr::new(0x2001, 0xdb8, 9, 9, 9, 9, 9, 9);
    let f = FrameBuilder::ipv6(src6, B6)
        .udp(1, 2)
        .payload(&[0, 0])
        .build();
    let c = udp_checksum(&f, 54).to_be_bytes();
    let want = FrameBuilder::ipv6(src6, B6).udp(1, 2).payload(&c);
    let mut f = v6().udp(1, 2).payload(&c).build();
    with_ipv6_src(&mut f, src6).unwrap();
    assert_eq!(udp_checksum(&f, 54), 0xffff);
    assert_eq!(f, assert_reads_back(&want, "rewritten v6").frame);
}

// ---- mutators ---------------------------------------------------------------------

/// etherparse's Internet checksum of `data`. `Sum16BitWords` sums the bytes as they lie in
/// memory, so its result goes back to the wire's byte order with `to_ne_bytes`.
fn etherparse_checksum(data: &[u8]) -> u16 {
    u16::from_be_bytes(
        Sum16BitWords::new()
            .add_slice(data)
            .ones_complement()
            .to_ne_bytes(),
    )
}

/// etherparse's ones'-complement sum over `range` of `f`: 0xffff over a header whose
/// checksum field is right.
fn ones_sum(f: &[u8], range: Range<usize>) -> u16 {
    !etherparse_checksum(&f[range])
}

/// A forged IHL is what etherparse cannot take as a frame: below 5 it refuses the header,
/// above the Total Length it refuses the packet; in between it reads the L4 header's
/// first bytes as options. The builder's job is that the IHL is the only defect: the
/// checksum stays right over the 20 bytes laid out, and no other byte changes.
#[test]
fn set_ipv4_ihl_only_breaks_ihl() {
    let f0 = v4()
        .vlan(ETH_P_8021Q, 1)
        .vlan(ETH_P_8021Q, 2)
        .tcp(1, 2, TCP_SYN)
        .build();
    for ihl in 0..=15 {
        let mut f = f0.clone();
        set_ipv4_ihl(&mut f, ihl).unwrap();
        assert_eq!(ones_sum(&f, 22..42), 0xffff, "IHL {ihl}: checksum");
        let diff: Vec<usize> = (0..f.len()).filter(|&i| f[i] != f0[i]).collect();
        assert!(
            diff.iter().all(|&i| i == 22 || i == 32 || i == 33),
            "IHL {ihl}: {diff:?}"
        );
        let read = Ipv4Slice::from_slice(&f[22..]);
        match ihl {
            0..=4 => assert!(
                matches!(
                    read,
                    Err(Ipv4SliceError::Header(
                        etherparse::err::ipv4::HeaderError::HeaderLengthSmallerThanHeader { .. }
                    ))
                ),
                "IHL {ihl}: {read:?}"
            ),
            // 40 bytes of IPv4 (header and TCP): a header of 44 bytes or more does not
            // fit.
            11..=15 => assert!(
                matches!(&read, Err(Ipv4SliceError::Len(_))),
                "IHL {ihl}: {read:?}"
            ),
            _ => {
                let ip = read.unwrap();
                let h = ip.header();
                assert_eq!(h.ihl(), ihl);
                assert_eq!(h.options(), &f[42..22 + 4 * usize::from(ihl)]);
            }
        }
    }
    let mut f = f0.clone();
    assert_eq!(set_ipv4_ihl(&mut f, 16), Err(FrameError::OutOfRange));
    assert_eq!(f, f0);
    let mut f = v6().build();
    assert_eq!(set_ipv4_ihl(&mut f, 5), Err(FrameError::NotIpv4));
    let mut f = f0[..41].to_vec();
    assert_eq!(set_ipv4_ihl(&mut f, 5), Err(FrameError::Truncated));
    assert_eq!(f, f0[..41]);
    assert_eq!(set_ipv4_ihl(&mut [0; 10], 5), Err(FrameError::Truncated));
    let mut arp = FrameBuilder::arp().build();
    assert_eq!(set_ipv4_ihl(&mut arp, 5), Err(FrameError::NotIpv4));
}

/// A Total Length below the header or past the frame is a length error to etherparse;
/// one inside the frame cuts the packet short. The header checksum stays right.
#[test]
fn set_ipv4_total_len_and_checksum() {
    let f0 = v4().udp(1, 2).payload_len(10).build();
    for len in [0, 19, 20, 40, 1500, 0xffff] {
        let mut f = f0.clone();
        set_ipv4_total_len(&mut f, len).unwrap();
        let h = Ipv4HeaderSlice::from_slice(&f[14..]).unwrap();
        assert_eq!(h.total_len(), len);
        assert_eq!(h.header_checksum(), h.to_header().calc_header_checksum());
        let read = Ipv4Slice::from_slice(&f[14..]);
        if usize::from(len) < IPV4_HLEN {
            assert!(
                matches!(&read, Err(Ipv4SliceError::Len(l)) if l.len_source == etherparse::LenSource::Ipv4HeaderTotalLen),
                "{len}: {read:?}"
            );
        } else if usize::from(len) > f.len() - 14 {
            assert!(
                matches!(&read, Err(Ipv4SliceError::Len(l)) if l.len_source == etherparse::LenSource::Slice),
                "{len}: {read:?}"
            );
        } else {
            assert_eq!(read.unwrap().payload().payload.len(), usize::from(len) - 20);
        }
    }
    let mut f = f0.clone();
    set_ipv4_checksum(&mut f, 0xdead).unwrap();
    let h = Ipv4HeaderSlice::from_slice(&f[14..]).unwrap();
    assert_eq!(h.header_checksum(), 0xdead);
    assert_ne!(h.to_header().calc_header_checksum(), 0xdead);
    assert_eq!(
        set_ipv4_total_len(&mut v6().build(), 1),
        Err(FrameError::NotIpv4)
    );
    assert_eq!(
        set_ipv4_checksum(&mut f0[..20].to_vec(), 1),
        Err(FrameError::Truncated)
    );
}

#[test]
fn address_rewrites_reject_other_families() {
    assert_eq!(
        with_ipv4_src(&mut v6().build(), A4),
        Err(FrameError::NotIpv4)
    );
    assert_eq!(
        with_ipv6_src(&mut v4().build(), A6),
        Err(FrameError::NotIpv6)
    );
    assert_eq!(
        with_ipv6_dst(&mut v6().build()[..50].to_vec(), A6),
        Err(FrameError::Truncated)
    );
    assert_eq!(
        with_ipv4_dst(&mut FrameBuilder::arp().build(), A4),
        Err(FrameError::NotIpv4)
    );
    assert_eq!(FrameError::NotIpv4.to_string(), "frame is not IPv4");
}

#[test]
fn rewrites_leave_unsent_udp_checksum_alone() {
    let mut f = v4().udp(1, 2).build();
    f[34 + 6] = 0;
    f[34 + 7] = 0;
    with_ipv4_src(&mut f, Ipv4Addr::new(10, 1, 2, 3)).unwrap();
    assert_eq!(udp_checksum(&f, 34), 0);
    let h = Ipv4HeaderSlice::from_slice(&f[14..]).unwrap();
    assert_eq!(h.source_addr(), Ipv4Addr::new(10, 1, 2, 3));
    assert_eq!(h.header_checksum(), h.to_header().calc_header_checksum());
}

#[test]
fn ipv6_dst_rewrite_skips_l4_with_pending_routing() {
    let b = v6().ipv6_ext(Ipv6Ext::Routing).tcp(1, 2, TCP_SYN);
    let mut f = b.build();
    f[54 + 3] = 1; // segments left: the pseudo-header uses the SRH's final segment
    let before = f.clone();
    with_ipv6_dst(&mut f, A6).unwrap();
    let h = Ipv6HeaderSlice::from_slice(&f[14..]).unwrap();
    assert_eq!(h.destination_addr(), A6);
    assert_eq!(&f[78..], &before[78..]);
}

// ---- properties -------------------------------------------------------------------

fn v4_template(
    kind: u8,
    src: Ipv4Addr,
    dst: Ipv4Addr,
    tags: u16,
    words: usize,
    frag: u16,
) -> FrameBuilder {
    let mut b = FrameBuilder::ipv4(src, dst);
    b = match kind {
        0 => b.tcp(40000, 80, TCP_SYN),
        1 => b.udp(5000, 53),
        2 => b.icmp_echo(),
        _ => b.proto(47),
    };
    for t in 0..tags {
        b = b.vlan(if t == 0 { ETH_P_8021AD } else { ETH_P_8021Q }, t);
    }
    b.ipv4_options(words)
        .ipv4_fragment(frag, frag.is_multiple_of(2))
}

fn v6_template(kind: u8, src: Ipv6Addr, dst: Ipv6Addr, tags: u16, chain: u8) -> FrameBuilder {
    use Ipv6Ext::*;
    let mut b = FrameBuilder::ipv6(src, dst);
    b = match kind {
        0 => b.tcp(40000, 80, TCP_SYN),
        1 => b.udp(5000, 53),
        2 => b.icmp_echo(),
        _ => b.proto(47),
    };
    for t in 0..tags {
        b = b.vlan(ETH_P_8021Q, t);
    }
    let exts: &[Ipv6Ext] = match chain {
        0 => &[],
        1 => &[HopByHop],
        2 => &[HopByHop, Routing, DestOptsLen(2), Ah],
        3 => &[Fragment {
            offset: 0,
            more: true,
        }],
        _ => &[
            DestOpts,
            Fragment {
                offset: 9,
                more: true,
            },
        ],
    };
    for e in exts {
        b = b.ipv6_ext(*e);
    }
    b
}

/// Any L4 the builder offers. Opaque protocols are those etherparse takes as opaque
/// too: not an IPv6 extension header or AH (it would parse the payload as one), nor TCP,
/// UDP, ICMP or ICMPv6.
fn any_l4() -> impl Strategy<Value = L4> {
    prop_oneof![
        (any::<u16>(), any::<u16>(), any::<u8>()).prop_map(|(sport, dport, flags)| L4::Tcp {
            sport,
            dport,
            flags
        }),
        (any::<u16>(), any::<u16>()).prop_map(|(sport, dport)| L4::Udp { sport, dport }),
        Just(L4::IcmpEcho),
        any::<u8>()
            .prop_filter("etherparse parses it", |p| ![
                IPPROTO_HOPOPTS,
                IPPROTO_ICMP,
                IPPROTO_TCP,
                IPPROTO_UDP,
                IPPROTO_ROUTING,
                IPPROTO_FRAGMENT,
                IPPROTO_AH,
                IPPROTO_ICMPV6,
                IPPROTO_DSTOPTS
            ]
            .contains(p))
            .prop_map(L4::Raw),
    ]
}

fn any_ipv6_ext() -> impl Strategy<Value = Ipv6Ext> {
    prop_oneof![
        Just(Ipv6Ext::DestOpts),
        any::<u8>().prop_map(Ipv6Ext::DestOptsLen),
        Just(Ipv6Ext::Routing),
        Just(Ipv6Ext::Ah),
        (0u16..=0x1fff, any::<bool>())
            .prop_map(|(offset, more)| Ipv6Ext::Fragment { offset, more }),
    ]
}

fn any_payload() -> impl Strategy<Value = Payload> {
    prop_oneof![
        (0usize..300).prop_map(Payload::Len),
        (0usize..300).prop_map(Payload::FrameLen),
        proptest::collection::vec(any::<u8>(), 0..64).prop_map(Payload::Bytes),
    ]
}

/// Any builder: IPv4 or IPv6 with every option the builder has, ARP, or a raw EtherType.
fn any_builder() -> impl Strategy<Value = FrameBuilder> {
    let tags = proptest::collection::vec(
        (prop::sample::select(VLAN_TPIDS.to_vec()), any::<u16>()),
        0..4,
    );
    let common = (
        any::<[u8; 6]>(),
        any::<[u8; 6]>(),
        tags,
        any_l4(),
        any_payload(),
        any::<u8>(),
        any::<u16>(),
    );
    let l3 = prop_oneof![
        (
            any::<[u8; 4]>(),
            any::<[u8; 4]>(),
            0u8..=10,
            prop_oneof![Just(0u16), 0u16..=0x1fff],
            any::<bool>()
        )
            .prop_map(|(s, d, words, offset, more)| (
                L3::Ipv4 {
                    src: s.into(),
                    dst: d.into()
                },
                words,
                offset,
                more,
                Vec::new()
            )),
        (
            any::<[u8; 16]>(),
            any::<[u8; 16]>(),
            proptest::option::of(any::<u8>()),
            proptest::collection::vec(any_ipv6_ext(), 0..4)
        )
            .prop_map(|(s, d, hop_by_hop, rest)| {
                let exts = hop_by_hop
                    .map(Ipv6Ext::HopByHopLen)
                    .into_iter()
                    .chain(rest)
                    .collect();
                (
                    L3::Ipv6 {
                        src: s.into(),
                        dst: d.into(),
                    },
                    0,
                    0,
                    false,
                    exts,
                )
            }),
        (any::<[u8; 4]>(), any::<[u8; 4]>()).prop_map(|(s, t)| (
            L3::Arp {
                spa: s.into(),
                tpa: t.into()
            },
            0,
            0,
            false,
            Vec::new()
        )),
        (
            any::<u16>().prop_filter("an IP, ARP or VLAN EtherType", |e| ![
                ETH_P_IP, ETH_P_IPV6, ETH_P_ARP
            ]
            .contains(e)
                && !VLAN_TPIDS.contains(e)),
            proptest::collection::vec(any::<u8>(), 0..32)
        )
            .prop_map(|(ethertype, body)| (
                L3::Raw { ethertype, body },
                0,
                0,
                false,
                Vec::new()
            )),
    ];
    (common, l3).prop_map(
        |((src_mac, dst_mac, tags, l4, payload, ttl, ip_id), (l3, words, offset, more, exts))| {
            FrameBuilder {
                src_mac,
                dst_mac,
                tags,
                l3,
                l4,
                payload,
                ttl,
                ip_id,
                ipv4_option_words: words,
                ipv4_frag_offset: offset,
                ipv4_more_fragments: more,
                ipv6_exts: exts,
            }
        },
    )
}

proptest! {
    /// Whatever the builder is asked for, etherparse reads back those very fields, and
    /// every length and checksum verifies.
    #[test]
    fn any_frame_reads_back(b in any_builder()) {
        assert_reads_back(&b, "any frame");
    }

    /// The builder's checksum is etherparse's ones'-complement checksum.
    #[test]
    fn internet_checksum_is_etherparses(data in proptest::collection::vec(any::<u8>(), 0..200)) {
        prop_assert_eq!(internet_checksum(&data), etherparse_checksum(&data));
    }

    /// Rewriting the source of a template gives the very bytes of a frame built with
    /// that source, which etherparse reads back.
    #[test]
    fn with_ipv4_src_matches_a_fresh_build(
        a in any::<[u8; 4]>(),
        c in any::<[u8; 4]>(),
        d in any::<[u8; 4]>(),
        kind in 0u8..4,
        tags in 0u16..=3,
        words in 0usize..=10,
        frag in prop_oneof![Just(0u16), 0u16..4],
        n in 0usize..80,
    ) {
        let (a, c, d) = (Ipv4Addr::from(a), Ipv4Addr::from(c), Ipv4Addr::from(d));
        let mut f = v4_template(kind, a, d, tags, words, frag).payload_len(n).build();
        with_ipv4_src(&mut f, c).unwrap();
        let want = v4_template(kind, c, d, tags, words, frag).payload_len(n);
        prop_assert_eq!(&f, &assert_reads_back(&want, "src").frame);
        with_ipv4_dst(&mut f, a).unwrap();
        let want = v4_template(kind, c, a, tags, words, frag).payload_len(n);
        prop_assert_eq!(&f, &assert_reads_back(&want, "dst").frame);
    }

    /// The same with payloads that make any checksum value, 0 and 0xffff included.
    #[test]
    fn with_ipv4_src_keeps_checksums_valid(
        a in any::<[u8; 4]>(),
        c in any::<[u8; 4]>(),
        kind in 0u8..3,
        payload in proptest::collection::vec(any::<u8>(), 0..40),
    ) {
        let b = v4_template(kind, Ipv4Addr::from(a), B4, 0, 0, 0).payload(&payload);
        let mut f = b.build();
        with_ipv4_src(&mut f, Ipv4Addr::from(c)).unwrap();
        let want = v4_template(kind, Ipv4Addr::from(c), B4, 0, 0, 0).payload(&payload);
        prop_assert_eq!(&f, &assert_reads_back(&want, "rewritten").frame);
    }

    #[test]
    fn with_ipv6_src_matches_a_fresh_build(
        a in any::<[u8; 16]>(),
        c in any::<[u8; 16]>(),
        d in any::<[u8; 16]>(),
        kind in 0u8..4,
        tags in 0u16..=2,
        chain in 0u8..5,
        payload in proptest::collection::vec(any::<u8>(), 0..40),
    ) {
        let (a, c, d) = (Ipv6Addr::from(a), Ipv6Addr::from(c), Ipv6Addr::from(d));
        let mut f = v6_template(kind, a, d, tags, chain).payload(&payload).build();
        with_ipv6_src(&mut f, c).unwrap();
        let want = v6_template(kind, c, d, tags, chain).payload(&payload);
        prop_assert_eq!(&f, &assert_reads_back(&want, "src").frame);
        with_ipv6_dst(&mut f, a).unwrap();
        // The SRH carries the destination as its segment; a fresh build would put the
        // new one there too, so compare everything but the segment.
        let want = assert_reads_back(&v6_template(kind, c, a, tags, chain).payload(&payload), "dst").frame;
        if chain == 2 {
            let srh = 14 + 4 * usize::from(tags) + IPV6_HLEN + 8;
            prop_assert_eq!(&f[..srh + 8], &want[..srh + 8]);
            prop_assert_eq!(&f[srh + 24..], &want[srh + 24..]);
        } else {
            prop_assert_eq!(&f, &want);
        }
    }
}
