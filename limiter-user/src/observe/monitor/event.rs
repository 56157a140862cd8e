//! A [`DropEvent`] as the kernel wrote it, decoded into what an operator reads: the
//! addresses as addresses, the reason and verdict by name, and what the kernel left out
//! (ports it had no need of, TCP flags, whether the frame is a fragment) read from the
//! snapped bytes of the frame.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use limiter_common::drop::{
    DropEvent, DropReason, EVENT_DROPPED, EVENT_WOULD_DROP, MAX_SNAP_LEN, NO_RULE,
};

/// What happened to the frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Dropped,
    /// Passed, counted as a would-drop (shadow mode, or a source outside a canary).
    WouldDrop,
    /// A code this build does not know (a newer program's).
    Unknown(u32),
}

impl Verdict {
    fn from_code(code: u32) -> Verdict {
        match code {
            EVENT_DROPPED => Verdict::Dropped,
            EVENT_WOULD_DROP => Verdict::WouldDrop,
            other => Verdict::Unknown(other),
        }
    }

    /// The JSON name: `dropped`, `would_drop`, `unknown`.
    pub fn label(self) -> &'static str {
        match self {
            Verdict::Dropped => "dropped",
            Verdict::WouldDrop => "would_drop",
            Verdict::Unknown(_) => "unknown",
        }
    }
}

/// Whether the frame is an IP fragment, as its snapped headers show.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fragment {
    /// Not a fragment, or the headers were not in the snapped bytes.
    No,
    /// The first fragment (offset 0, more to come): it carries the transport header.
    First,
    /// A later fragment: no transport header, hence no ports.
    Later,
}

/// TCP flag bits, in header order, with the names operators read.
pub const TCP_FLAG_NAMES: [(u8, &str); 8] = [
    (0x02, "SYN"),
    (0x10, "ACK"),
    (0x01, "FIN"),
    (0x04, "RST"),
    (0x08, "PSH"),
    (0x20, "URG"),
    (0x40, "ECE"),
    (0x80, "CWR"),
];

/// The names of the TCP flags set in `flags`, SYN first.
pub fn tcp_flag_names(flags: u8) -> Vec<&'static str> {
    TCP_FLAG_NAMES
        .iter()
        .filter(|(bit, _)| flags & bit != 0)
        .map(|(_, name)| *name)
        .collect()
}

/// A decoded drop event. Addresses are `None` when the kernel did not read them (a VLAN
/// stack deeper than it walks); ports `None` when the frame shows none.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// CLOCK_MONOTONIC ns, as the kernel stamped it.
    pub time_ns: u64,
    pub ifindex: u32,
    pub rx_queue: u32,
    /// The rule's slot and generation; `None` for refusals no rule decides.
    pub rule_slot: Option<(u32, u32)>,
    /// The reason, or the code of one this build does not know.
    pub reason: Result<DropReason, u32>,
    pub verdict: Verdict,
    pub src: Option<IpAddr>,
    pub dst: Option<IpAddr>,
    pub proto: u8,
    pub src_port: Option<u16>,
    pub dst_port: Option<u16>,
    /// TCP flags, when the snapped bytes hold the TCP header of the classified packet.
    pub tcp_flags: Option<u8>,
    pub fragment: Fragment,
    pub frame_len: u32,
    /// The frame's first bytes, from its Ethernet header.
    pub data: Vec<u8>,
}

/// Reads an event from a ring buffer record: `None` if it is shorter than a
/// [`DropEvent`] (a record of another layout).
pub fn parse_record(bytes: &[u8]) -> Option<DropEvent> {
    if bytes.len() < std::mem::size_of::<DropEvent>() {
        return None;
    }
    // SAFETY: the length is checked above, DropEvent is plain old data (integers only:
    // every bit pattern is a value), and read_unaligned needs no alignment.
    Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<DropEvent>()) })
}

fn address(family: u32, words: &[u32; 4]) -> Option<IpAddr> {
    // The words hold the address bytes in network order, as the frame had them.
    let mut bytes = [0u8; 16];
    for (i, w) in words.iter().enumerate() {
        bytes[i * 4..i * 4 + 4].copy_from_slice(&w.to_ne_bytes());
    }
    match family {
        4 => Some(IpAddr::V4(Ipv4Addr::new(
            bytes[0], bytes[1], bytes[2], bytes[3],
        ))),
        6 => Some(IpAddr::V6(Ipv6Addr::from(bytes))),
        _ => None,
    }
}

/// The words of `addr` as the kernel writes them (for tests and fixtures).
pub fn address_words(addr: IpAddr) -> [u32; 4] {
    let mut bytes = [0u8; 16];
    match addr {
        IpAddr::V4(a) => bytes[..4].copy_from_slice(&a.octets()),
        IpAddr::V6(a) => bytes.copy_from_slice(&a.octets()),
    }
    let mut words = [0u32; 4];
    for (i, w) in words.iter_mut().enumerate() {
        *w = u32::from_ne_bytes([
            bytes[i * 4],
            bytes[i * 4 + 1],
            bytes[i * 4 + 2],
            bytes[i * 4 + 3],
        ]);
    }
    words
}

/// Decodes `raw`. Ports the kernel left at 0, the TCP flags and the fragment state are
/// read from the snapped bytes, but only when the snapped IP header is the one the
/// kernel classified (same addresses and protocol): a tunnelled frame's outer header
/// does not lend its ports to the inner one.
pub fn decode(raw: &DropEvent) -> Event {
    let snap = (raw.snap_len as usize).min(MAX_SNAP_LEN);
    let data = raw.data[..snap].to_vec();
    let src = address(raw.family, &raw.src);
    let dst = address(raw.family, &raw.dst);
    let proto = raw.proto as u8;
    let parsed = parse_headers(&data);
    let matching = parsed
        .as_ref()
        .filter(|h| Some(h.src) == src && Some(h.dst) == dst && h.proto == proto);
    let nonzero = |p: u16| (p != 0).then_some(p);
    let from_snap = |f: fn(&Headers) -> Option<u16>| matching.and_then(f);
    let has_ports = matches!(proto, PROTO_TCP | PROTO_UDP | PROTO_SCTP | PROTO_UDPLITE);
    let (src_port, dst_port) = if has_ports {
        (
            nonzero(raw.src_port).or_else(|| from_snap(|h| h.ports.map(|p| p.0))),
            nonzero(raw.dst_port).or_else(|| from_snap(|h| h.ports.map(|p| p.1))),
        )
    } else {
        (None, None)
    };
    Event {
        time_ns: raw.time_ns,
        ifindex: raw.ifindex,
        rx_queue: raw.rx_queue,
        rule_slot: (raw.slot != NO_RULE).then_some((raw.slot, raw.generation)),
        reason: DropReason::from_code(raw.reason).ok_or(raw.reason),
        verdict: Verdict::from_code(raw.verdict),
        src,
        dst,
        proto,
        src_port,
        dst_port,
        tcp_flags: matching.and_then(|h| h.tcp_flags),
        fragment: matching.map_or(Fragment::No, |h| h.fragment),
        frame_len: raw.frame_len,
        data,
    }
}

pub const PROTO_ICMP: u8 = 1;
pub const PROTO_TCP: u8 = 6;
pub const PROTO_UDP: u8 = 17;
pub const PROTO_ICMPV6: u8 = 58;
pub const PROTO_SCTP: u8 = 132;
pub const PROTO_UDPLITE: u8 = 136;

/// The usual name of an IP protocol, or its number.
pub fn proto_name(proto: u8) -> String {
    match proto {
        PROTO_ICMP => "icmp".into(),
        PROTO_TCP => "tcp".into(),
        PROTO_UDP => "udp".into(),
        PROTO_ICMPV6 => "icmp6".into(),
        PROTO_SCTP => "sctp".into(),
        PROTO_UDPLITE => "udplite".into(),
        47 => "gre".into(),
        4 => "ipip".into(),
        41 => "ipv6-in-ip".into(),
        50 => "esp".into(),
        other => format!("proto {other}"),
    }
}

/// The outermost IP header of a frame and what follows it, as far as the bytes go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Headers {
    /// 802.1Q/802.1ad tags crossed, outermost first (VLAN ids).
    pub vlans: Vec<u16>,
    pub src: IpAddr,
    pub dst: IpAddr,
    /// The transport protocol (after IPv6 extension headers).
    pub proto: u8,
    pub fragment: Fragment,
    /// (source, destination), when the transport header's first four bytes are there.
    pub ports: Option<(u16, u16)>,
    pub tcp_flags: Option<u8>,
}

const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86DD;
const ETH_P_8021Q: u16 = 0x8100;
const ETH_P_8021AD: u16 = 0x88A8;
/// Tags crossed before giving up: more than any real stack, few enough to stay cheap.
const MAX_VLANS: usize = 8;
/// IPv6 extension headers walked before giving up.
const MAX_EXTENSIONS: usize = 8;

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

/// Parses an Ethernet frame's first bytes: VLAN tags, the IPv4 or IPv6 header (with
/// its extension headers), and the transport header's ports and TCP flags when the
/// bytes hold them and the packet is not a later fragment. `None` when the frame is not
/// IP or its IP header is cut short.
pub fn parse_headers(frame: &[u8]) -> Option<Headers> {
    let mut ethertype = be16(frame, 12)?;
    let mut at = 14;
    let mut vlans = Vec::new();
    while ethertype == ETH_P_8021Q || ethertype == ETH_P_8021AD {
        if vlans.len() == MAX_VLANS {
            return None;
        }
        vlans.push(be16(frame, at)? & 0x0fff);
        ethertype = be16(frame, at + 2)?;
        at += 4;
    }
    let (src, dst, mut proto, fragment, mut l4) = match ethertype {
        ETH_P_IP => {
            let ip = frame.get(at..at + 20)?;
            if ip[0] >> 4 != 4 {
                return None;
            }
            let ihl = usize::from(ip[0] & 0x0f) * 4;
            if ihl < 20 {
                return None;
            }
            let frag = u16::from_be_bytes([ip[6], ip[7]]);
            let offset = frag & 0x1fff;
            let more = frag & 0x2000 != 0;
            let fragment = match (offset, more) {
                (0, false) => Fragment::No,
                (0, true) => Fragment::First,
                _ => Fragment::Later,
            };
            let src = IpAddr::V4(Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]));
            let dst = IpAddr::V4(Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]));
            (src, dst, ip[9], fragment, at + ihl)
        }
        ETH_P_IPV6 => {
            let ip = frame.get(at..at + 40)?;
            if ip[0] >> 4 != 6 {
                return None;
            }
            let mut s = [0u8; 16];
            let mut d = [0u8; 16];
            s.copy_from_slice(&ip[8..24]);
            d.copy_from_slice(&ip[24..40]);
            (
                IpAddr::V6(Ipv6Addr::from(s)),
                IpAddr::V6(Ipv6Addr::from(d)),
                ip[6],
                Fragment::No,
                at + 40,
            )
        }
        _ => return None,
    };
    let mut fragment = fragment;
    if src.is_ipv6() {
        // Walk the extension headers the bytes hold; stop (no ports) where they end.
        let mut walked = 0;
        let mut complete = true;
        loop {
            match proto {
                // Hop-by-hop, routing, destination options: (len + 1) * 8 bytes.
                0 | 43 | 60 => {
                    let (Some(next), Some(len)) = (frame.get(l4), frame.get(l4 + 1)) else {
                        complete = false;
                        break;
                    };
                    proto = *next;
                    l4 += (usize::from(*len) + 1) * 8;
                }
                // Fragment header: 8 bytes, offset and M flag in bytes 2..4.
                44 => {
                    let (Some(next), Some(field)) = (frame.get(l4), be16(frame, l4 + 2)) else {
                        complete = false;
                        break;
                    };
                    fragment = match (field >> 3, field & 1 != 0) {
                        (0, false) => fragment,
                        (0, true) => Fragment::First,
                        _ => Fragment::Later,
                    };
                    proto = *next;
                    l4 += 8;
                }
                // Authentication header: (len + 2) * 4 bytes.
                51 => {
                    let (Some(next), Some(len)) = (frame.get(l4), frame.get(l4 + 1)) else {
                        complete = false;
                        break;
                    };
                    proto = *next;
                    l4 += (usize::from(*len) + 2) * 4;
                }
                _ => break,
            }
            walked += 1;
            if walked > MAX_EXTENSIONS {
                complete = false;
                break;
            }
        }
        if !complete {
            return Some(Headers {
                vlans,
                src,
                dst,
                proto,
                fragment,
                ports: None,
                tcp_flags: None,
            });
        }
    }
    let transport = fragment != Fragment::Later;
    let has_ports = matches!(proto, PROTO_TCP | PROTO_UDP | PROTO_SCTP | PROTO_UDPLITE);
    let ports = (transport && has_ports)
        .then(|| Some((be16(frame, l4)?, be16(frame, l4 + 2)?)))
        .flatten();
    let tcp_flags = (transport && proto == PROTO_TCP)
        .then(|| frame.get(l4 + 13).copied())
        .flatten();
    Some(Headers {
        vlans,
        src,
        dst,
        proto,
        fragment,
        ports,
        tcp_flags,
    })
}

/// Frames for tests: Ethernet (optionally tagged) + IP + transport, as a sender builds
/// them. Shared by the modules' tests.
#[cfg(test)]
pub(crate) mod frames {
    use std::net::IpAddr;

    /// What a test frame carries after its IP header.
    #[derive(Clone, Copy, Debug)]
    pub enum L4 {
        Tcp { sport: u16, dport: u16, flags: u8 },
        Udp { sport: u16, dport: u16 },
        Icmp,
    }

    /// An Ethernet frame from `src` to `dst` with `vlans` tags; `frag`: (offset in
    /// 8-byte units, more fragments).
    pub fn build(
        src: IpAddr,
        dst: IpAddr,
        vlans: &[u16],
        l4: L4,
        frag: (u16, bool),
        payload: usize,
    ) -> Vec<u8> {
        let mut f = vec![0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2];
        for v in vlans {
            f.extend_from_slice(&0x8100u16.to_be_bytes());
            f.extend_from_slice(&v.to_be_bytes());
        }
        let (proto, mut transport) = match l4 {
            L4::Tcp {
                sport,
                dport,
                flags,
            } => {
                let mut t = vec![0u8; 20];
                t[0..2].copy_from_slice(&sport.to_be_bytes());
                t[2..4].copy_from_slice(&dport.to_be_bytes());
                t[12] = 5 << 4;
                t[13] = flags;
                (6u8, t)
            }
            L4::Udp { sport, dport } => {
                let mut t = vec![0u8; 8];
                t[0..2].copy_from_slice(&sport.to_be_bytes());
                t[2..4].copy_from_slice(&dport.to_be_bytes());
                (17u8, t)
            }
            L4::Icmp => (
                if src.is_ipv4() { 1 } else { 58 },
                vec![8, 0, 0, 0, 0, 0, 0, 0],
            ),
        };
        transport.extend(std::iter::repeat_n(0xab, payload));
        if frag.0 != 0 {
            // A later fragment carries payload only.
            transport = vec![0xcd; transport.len()];
        }
        match (src, dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                f.extend_from_slice(&0x0800u16.to_be_bytes());
                let total = 20 + transport.len();
                let mut ip = vec![0x45, 0];
                ip.extend_from_slice(&(total as u16).to_be_bytes());
                ip.extend_from_slice(&[0x12, 0x34]);
                let field = frag.0 | if frag.1 { 0x2000 } else { 0 };
                ip.extend_from_slice(&field.to_be_bytes());
                ip.extend_from_slice(&[64, proto, 0, 0]);
                ip.extend_from_slice(&s.octets());
                ip.extend_from_slice(&d.octets());
                f.extend(ip);
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                f.extend_from_slice(&0x86DDu16.to_be_bytes());
                let fragmented = frag != (0, false);
                let ext = if fragmented { 8 } else { 0 };
                let mut ip = vec![0x60, 0, 0, 0];
                ip.extend_from_slice(&((transport.len() + ext) as u16).to_be_bytes());
                ip.push(if fragmented { 44 } else { proto });
                ip.push(64);
                ip.extend_from_slice(&s.octets());
                ip.extend_from_slice(&d.octets());
                if fragmented {
                    let field = (frag.0 << 3) | u16::from(frag.1);
                    ip.extend_from_slice(&[proto, 0]);
                    ip.extend_from_slice(&field.to_be_bytes());
                    ip.extend_from_slice(&[0, 0, 0, 1]);
                }
                f.extend(ip);
            }
            _ => panic!("mixed families"),
        }
        f.extend(transport);
        f
    }
}

/// A [`DropEvent`] for `frame`, as the kernel would write it (tests).
#[cfg(test)]
#[allow(
    clippy::too_many_arguments,
    reason = "one fixture, every field named at the call"
)]
pub(crate) fn raw_event(
    frame: &[u8],
    src: IpAddr,
    dst: IpAddr,
    proto: u8,
    ports: (u16, u16),
    reason: DropReason,
    verdict: u32,
    slot: u32,
) -> DropEvent {
    let snap = frame.len().min(MAX_SNAP_LEN);
    let mut data = [0u8; MAX_SNAP_LEN];
    data[..snap].copy_from_slice(&frame[..snap]);
    DropEvent {
        time_ns: 1_000_000_000,
        ifindex: 7,
        rx_queue: 3,
        slot,
        generation: 1,
        reason: reason as u32,
        verdict,
        family: if src.is_ipv4() { 4 } else { 6 },
        proto: u32::from(proto),
        src: address_words(src),
        dst: address_words(dst),
        src_port: ports.0,
        dst_port: ports.1,
        frame_len: frame.len() as u32,
        snap_len: snap as u32,
        _pad: 0,
        data,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use proptest::prelude::*;

    use super::{
        frames::{build, L4},
        *,
    };

    fn v4(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn ports_and_flags_come_from_the_snap_when_the_kernel_gave_none() {
        let (s, d) = (v4("198.51.100.7"), v4("198.18.0.10"));
        let frame = build(
            s,
            d,
            &[],
            L4::Tcp {
                sport: 5123,
                dport: 443,
                flags: 0x02,
            },
            (0, false),
            6,
        );
        let raw = raw_event(
            &frame,
            s,
            d,
            6,
            (0, 443),
            DropReason::PerSource,
            EVENT_DROPPED,
            2,
        );
        let e = decode(&raw);
        assert_eq!(e.src, Some(s));
        assert_eq!(e.dst, Some(d));
        assert_eq!(e.src_port, Some(5123), "read from the snap");
        assert_eq!(e.dst_port, Some(443));
        assert_eq!(e.tcp_flags, Some(0x02));
        assert_eq!(tcp_flag_names(e.tcp_flags.unwrap()), ["SYN"]);
        assert_eq!(e.fragment, Fragment::No);
        assert_eq!(e.rule_slot, Some((2, 1)));
        assert_eq!(e.reason, Ok(DropReason::PerSource));
        assert_eq!(e.verdict, Verdict::Dropped);
        assert_eq!(e.frame_len as usize, frame.len());
    }

    #[test]
    fn ipv6_behind_two_vlan_tags_is_read_through() {
        let (s, d) = (v4("2001:db8::7"), v4("2001:db8:1::10"));
        let frame = build(
            s,
            d,
            &[100, 200],
            L4::Udp {
                sport: 53000,
                dport: 53,
            },
            (0, false),
            10,
        );
        let h = parse_headers(&frame).unwrap();
        assert_eq!(h.vlans, [100, 200]);
        assert_eq!((h.src, h.dst, h.proto), (s, d, 17));
        assert_eq!(h.ports, Some((53000, 53)));
        assert_eq!(h.tcp_flags, None);
        let e = decode(&raw_event(
            &frame,
            s,
            d,
            17,
            (0, 0),
            DropReason::Aggregate,
            EVENT_WOULD_DROP,
            0,
        ));
        assert_eq!((e.src_port, e.dst_port), (Some(53000), Some(53)));
        assert_eq!(e.verdict, Verdict::WouldDrop);
    }

    #[test]
    fn fragments_are_told_apart_and_later_ones_have_no_ports() {
        for (s, d) in [
            (v4("198.51.100.7"), v4("198.18.0.10")),
            (v4("2001:db8::7"), v4("2001:db8::10")),
        ] {
            let udp = L4::Udp {
                sport: 1000,
                dport: 2000,
            };
            let first = parse_headers(&build(s, d, &[], udp, (0, true), 40)).unwrap();
            assert_eq!(first.fragment, Fragment::First, "{s}");
            assert_eq!(first.ports, Some((1000, 2000)), "{s}");
            assert_eq!(first.proto, 17);
            let later = build(s, d, &[], udp, (185, false), 40);
            let parsed = parse_headers(&later).unwrap();
            assert_eq!(parsed.fragment, Fragment::Later, "{s}");
            assert_eq!(parsed.ports, None, "{s}: payload bytes are not ports");
            let e = decode(&raw_event(
                &later,
                s,
                d,
                17,
                (0, 0),
                DropReason::OrphanFragment,
                EVENT_DROPPED,
                1,
            ));
            assert_eq!(
                (e.src_port, e.dst_port, e.fragment),
                (None, None, Fragment::Later)
            );
        }
    }

    #[test]
    fn an_outer_header_that_is_not_the_classified_one_lends_nothing() {
        // The kernel classified an inner packet (a tunnel): the snap's outer header has
        // other addresses, and its ports must not be shown as the inner packet's.
        let (outer_s, outer_d) = (v4("198.18.0.1"), v4("198.18.0.2"));
        let frame = build(
            outer_s,
            outer_d,
            &[],
            L4::Udp {
                sport: 4789,
                dport: 4789,
            },
            (0, false),
            60,
        );
        let (inner_s, inner_d) = (v4("198.51.100.9"), v4("198.18.0.10"));
        let e = decode(&raw_event(
            &frame,
            inner_s,
            inner_d,
            17,
            (0, 53),
            DropReason::Aggregate,
            EVENT_DROPPED,
            0,
        ));
        assert_eq!((e.src_port, e.dst_port), (None, Some(53)));
        assert_eq!(e.tcp_flags, None);
    }

    #[test]
    fn events_without_a_rule_or_addresses_and_unknown_codes_decode() {
        let frame = [0u8; 60];
        let mut raw = raw_event(
            &frame,
            v4("198.51.100.7"),
            v4("198.18.0.10"),
            6,
            (0, 0),
            DropReason::DeepVlan,
            EVENT_DROPPED,
            NO_RULE,
        );
        raw.family = 0;
        raw.reason = 99;
        raw.verdict = 7;
        let e = decode(&raw);
        assert_eq!(e.rule_slot, None);
        assert_eq!((e.src, e.dst), (None, None));
        assert_eq!(e.reason, Err(99));
        assert_eq!(e.verdict, Verdict::Unknown(7));
    }

    #[test]
    fn a_record_is_read_at_any_alignment_and_short_ones_are_refused() {
        let s = v4("198.51.100.7");
        let raw = raw_event(&[0u8; 60], s, s, 17, (1, 2), DropReason::Aggregate, 0, 0);
        // SAFETY (test): DropEvent is plain old data.
        let bytes = unsafe {
            std::slice::from_raw_parts(
                (&raw as *const DropEvent).cast::<u8>(),
                std::mem::size_of::<DropEvent>(),
            )
        };
        let mut shifted = vec![0u8; 1];
        shifted.extend_from_slice(bytes);
        assert_eq!(parse_record(&shifted[1..]), Some(raw));
        assert_eq!(parse_record(&bytes[..bytes.len() - 1]), None);
    }

    proptest! {
        /// Whatever the bytes, parsing neither panics nor reads past them, and a frame
        /// cut anywhere never yields ports that are not the frame's.
        #[test]
        fn any_bytes_parse_without_panic(bytes in proptest::collection::vec(any::<u8>(), 0..160)) {
            let _ = parse_headers(&bytes);
        }

        #[test]
        fn a_cut_frame_never_invents_ports(cut in 0usize..80, sport in 1u16.., dport in 1u16.., tags in 0usize..3) {
            let vlans = vec![5u16; tags];
            let frame = build(v4("198.51.100.7"), v4("198.18.0.10"), &vlans,
                L4::Udp { sport, dport }, (0, false), 20);
            let cut = cut.min(frame.len());
            if let Some(h) = parse_headers(&frame[..cut]) {
                prop_assert!(h.ports.is_none() || h.ports == Some((sport, dport)));
            }
        }
    }
}
