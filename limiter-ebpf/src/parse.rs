//! Cursor-style parser: each step checks bounds, reads one header and says what comes
//! next. Nothing here can fail the program: every error becomes a verdict of PASS plus
//! a counter in the caller.

use core::{arch::asm, mem::size_of};

use limiter_common::abi::{
    AddrWords, TunnelConfig, IPPROTO_TCP, IPPROTO_UDP, MAX_TUNNEL_UDP_PORTS, TUNNEL_GRE,
    TUNNEL_IP6, TUNNEL_IPIP,
};

const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
const ETH_P_8021Q: u16 = 0x8100;
const ETH_P_8021AD: u16 = 0x88a8;
/// VLAN tags the parser looks through (802.1Q and QinQ).
const MAX_VLAN_TAGS: usize = 2;
/// IPv6 extension headers the parser walks before giving up.
pub const MAX_IPV6_EXT_HEADERS: usize = 6;

const IPPROTO_HOPOPTS: u8 = 0;
const IPPROTO_ROUTING: u8 = 43;
const IPPROTO_FRAGMENT: u8 = 44;
const IPPROTO_AH: u8 = 51;
const IPPROTO_DSTOPTS: u8 = 60;
/// Tunnel protocols (outer IP protocol numbers).
const IPPROTO_IPIP: u8 = 4;
const IPPROTO_IPV6: u8 = 41;
const IPPROTO_GRE: u8 = 47;

const TCP_FLAG_SYN: u8 = 0x02;
const TCP_FLAG_ACK: u8 = 0x10;

/// Why a frame was not classified.
pub enum ParseError {
    /// Not IPv4/IPv6 (ARP, LLDP…).
    NonIp,
    /// Truncated or inconsistent headers: frames the host's stack would not deliver
    /// either (a frame shorter than its IP length, a header length below the minimum).
    Malformed,
    /// More VLAN tags than the parser walks: what they carry may be IP to a rule's
    /// destination, and the parser cannot see it.
    DeepVlan,
    /// A tunnel its interface decapsulates, in an outer first fragment that does not hold
    /// the whole inner headers: what the host reassembles and decapsulates cannot be
    /// known here.
    UnreadableTunnel,
}

/// Decapsulation on the frame's interface: `enabled` when some interface decapsulates
/// (`CONTROL_TUNNELS`), `lookup` gives this interface's encapsulations (called only for
/// a frame whose outer header could be one), `zero` is 0 at run time and unknown to the
/// verifier (`CONTROL_NEVER_SET`).
pub struct Tunnels<F: FnOnce() -> Option<TunnelConfig>> {
    pub enabled: bool,
    pub zero: u32,
    pub lookup: F,
}

/// How a frame relates to IP fragmentation (`Packet::kind`).
pub mod kind {
    /// A whole datagram (an IPv6 atomic fragment, offset 0 without more fragments, is one:
    /// RFC 6946).
    pub const WHOLE: u32 = 0;
    /// The first fragment of a datagram, with its whole transport header.
    pub const FIRST_FRAGMENT: u32 = 1;
    /// A later fragment of an IPv4 TCP or UDP datagram, or any IPv6 later fragment: no
    /// transport header, so its ports (IPv6: its protocol too) come from the first
    /// fragment's record.
    pub const LATER_FRAGMENT: u32 = 2;
    /// A later fragment of an IPv4 datagram without ports (ICMP, …): it classifies as it
    /// is. Only IPv4: there the protocol is in every fragment's IP header and part of the
    /// destination's reassembly key, so a fragment cannot claim another datagram's.
    pub const LATER_PORTLESS: u32 = 3;
    /// A first fragment without its whole transport header (IPv6: header chain).
    pub const TINY_FRAGMENT: u32 = 4;
    /// An IPv6 header chain the parser does not follow to its end (longer than it walks,
    /// or a second fragment header): the transport protocol is unknown.
    pub const LONG_CHAIN: u32 = 5;
}

/// What the classifier and the meters need from a frame.
#[derive(Clone, Copy)]
pub struct Packet {
    /// 4 or 6.
    pub family: u32,
    /// `kind::*`.
    pub kind: u32,
    /// L4 protocol (after IPv6 extension headers).
    pub proto: u8,
    /// The frame carries an L4 header with ports (TCP/UDP, not a non-first fragment).
    pub has_ports: bool,
    /// TCP SYN without ACK.
    pub syn: bool,
    /// Destination port, host order (valid with `has_ports`).
    pub dst_port: u16,
    /// Fragment identification (fragments only; IPv4's 16 bits widened).
    pub frag_id: u32,
    /// Fragment offset in 8-byte units (later fragments); for a first fragment, where
    /// its payload ends in the same units.
    pub frag_offset: u32,
    /// Addresses (limiter_common::abi::AddrWords); IPv4 uses the first word.
    pub src: AddrWords,
    pub dst: AddrWords,
}

/// A bounds-checked read position in the frame.
struct Cursor {
    pos: usize,
    end: usize,
}

impl Cursor {
    /// The one accessor: a pointer to a `T` at the cursor, if the whole `T` is in the
    /// frame; advances past it.
    #[inline(always)]
    fn take<T>(&mut self) -> Result<*const T, ParseError> {
        let start = self.pos;
        self.skip(size_of::<T>())?;
        Ok(start as *const T)
    }

    /// Skips `len` bytes (the rest of a variable-length header).
    #[inline(always)]
    fn skip(&mut self, len: usize) -> Result<(), ParseError> {
        if self.pos + len > self.end {
            return Err(ParseError::Malformed);
        }
        self.pos += len;
        Ok(())
    }

    /// Whether the headers read so far, from `ip` on, run past the IP datagram's own
    /// length `datagram_len` (`walked`: the result of reading them). They do if they
    /// were read and end beyond it (what follows the datagram in the frame is padding,
    /// which the destination ignores), or if the frame ran out and the frame holds the
    /// whole datagram. A frame that ran out before the datagram's end is truncated.
    #[inline(always)]
    fn past_datagram(
        &self,
        ip: usize,
        datagram_len: usize,
        walked: Result<(), ParseError>,
    ) -> Result<bool, ParseError> {
        match walked {
            Ok(()) => Ok(self.pos - ip > datagram_len),
            Err(ParseError::Malformed) if self.end - ip >= datagram_len => Ok(true),
            Err(e) => Err(e),
        }
    }
}

/// One 32-bit load from the frame, whatever the address's alignment (IP headers sit 2
/// bytes off a word after Ethernet). Rust and LLVM's BPF backend would turn a misaligned
/// read into four byte loads, shifts and ors; the kernel allows misaligned packet loads
/// on this architecture, and x86-64 does them at full speed. `at` must come from
/// [`Cursor::take`] with at least `offset + 4` bytes in the frame (the verifier checks
/// it too).
#[inline(always)]
fn load32<const OFFSET: i16>(at: usize) -> u32 {
    let value: u64;
    // SAFETY: a read of 4 bytes inside the frame, bounds-checked by the caller.
    unsafe {
        asm!(
            "{v} = *(u32 *)({p} + {off})",
            v = out(reg) value,
            p = in(reg) at,
            off = const OFFSET,
            options(pure, readonly, nostack, preserves_flags),
        )
    };
    value as u32
}

/// [`load32`] for 16 bits.
#[inline(always)]
fn load16<const OFFSET: i16>(at: usize) -> u16 {
    let value: u64;
    // SAFETY: as for load32, 2 bytes.
    unsafe {
        asm!(
            "{v} = *(u16 *)({p} + {off})",
            v = out(reg) value,
            p = in(reg) at,
            off = const OFFSET,
            options(pure, readonly, nostack, preserves_flags),
        )
    };
    value as u16
}

/// A big-endian 16-bit field read with [`load16`].
#[inline(always)]
fn be16_at<const OFFSET: i16>(at: usize) -> u16 {
    u16::from_be_bytes(load16::<OFFSET>(at).to_ne_bytes())
}

#[repr(C)]
struct EthHdr {
    dst: [u8; 6],
    src: [u8; 6],
    ethertype: [u8; 2],
}

#[repr(C)]
struct VlanHdr {
    tci: [u8; 2],
    ethertype: [u8; 2],
}

#[repr(C)]
struct Ipv4Hdr {
    version_ihl: u8,
    tos: u8,
    total_len: [u8; 2],
    id: [u8; 2],
    frag_off: [u8; 2],
    ttl: u8,
    proto: u8,
    check: [u8; 2],
    src: [u8; 4],
    dst: [u8; 4],
}

#[repr(C)]
struct Ipv6Hdr {
    version_class_flow: [u8; 4],
    payload_len: [u8; 2],
    next_header: u8,
    hop_limit: u8,
    src: [u8; 16],
    dst: [u8; 16],
}

/// First two bytes of every walkable extension header.
#[repr(C)]
struct ExtHdr {
    next_header: u8,
    len: u8,
}

#[repr(C)]
struct FragHdr {
    next_header: u8,
    reserved: u8,
    offset_flags: [u8; 2],
    id: [u8; 4],
}

#[repr(C)]
struct UdpHdr {
    src_port: [u8; 2],
    dst_port: [u8; 2],
    len: [u8; 2],
    check: [u8; 2],
}

#[inline(always)]
fn be16(b: [u8; 2]) -> u16 {
    u16::from_be_bytes(b)
}

/// Parses Ethernet, up to two VLAN tags, a tunnel the interface decapsulates
/// ([`decapsulate`]), IPv4 or IPv6 (with extension headers), and the TCP/UDP ports of
/// the frame in `data..data_end` (the packet pointers of an XDP or TC
/// context), and hands the packet to `on_packet`. A continuation rather than a
/// returned `Packet`: each family gets its own inlined copy of what follows, where the
/// family is a constant (IPv4 code never handles the zero words of a 16-byte address)
/// and the packet stays in registers instead of being spilled at a join of the two.
///
/// Transport headers are read within the datagram's own length, never from padding
/// after it, which the destination ignores (a first fragment cannot pretend to hold
/// flags that only a later fragment supplies).
#[inline(always)]
pub fn parse<R, F: FnOnce() -> Option<TunnelConfig>>(
    data: usize,
    data_end: usize,
    tunnels: Tunnels<F>,
    on_packet: impl FnOnce(&Packet) -> R,
) -> Result<R, ParseError> {
    let mut cur = Cursor {
        pos: data,
        end: data_end,
    };
    let eth = cur.take::<EthHdr>()? as usize;
    let mut ethertype = be16_at::<12>(eth);
    for _ in 0..MAX_VLAN_TAGS {
        if ethertype != ETH_P_8021Q && ethertype != ETH_P_8021AD {
            break;
        }
        let vlan = cur.take::<VlanHdr>()? as usize;
        ethertype = be16_at::<2>(vlan);
    }
    match ethertype {
        ETH_P_IP | ETH_P_IPV6 => {}
        // A third tag: we cannot see what it carries, and it may be IP trying to slip past.
        ETH_P_8021Q | ETH_P_8021AD => return Err(ParseError::DeepVlan),
        _ => return Err(ParseError::NonIp),
    }
    let mut outer_first_fragment = false;
    if tunnels.enabled {
        if let Some(inner) = decapsulate(&mut cur, ethertype, tunnels.lookup)? {
            ethertype = inner.ethertype;
            outer_first_fragment = inner.first_fragment;
            crate::count_tunnels(|t| &mut t.decapsulated);
        }
    }
    // Every way here (0-2 VLAN tags, a tunnel or none) leaves a different constant
    // offset, and the verifier would walk the L3 parser and everything after it once for
    // each. Shifted by a zero it cannot know, the offset becomes one unknown value below
    // 512 (the deepest header here ends at 206), and the paths meet in one state.
    let offset = (cur.pos - data).wrapping_shl(tunnels.zero) & 0x1ff;
    cur.pos = data + offset;
    let outer_first_fragment = u32::from(outer_first_fragment).wrapping_shl(tunnels.zero) != 0;
    let inner_error = |e| match e {
        ParseError::Malformed if outer_first_fragment => ParseError::UnreadableTunnel,
        e => e,
    };
    if ethertype == ETH_P_IP {
        let pkt = parse_ipv4(&mut cur).map_err(inner_error)?;
        Ok(on_packet(&pkt))
    } else {
        let pkt = parse_ipv6(&mut cur).map_err(inner_error)?;
        Ok(on_packet(&pkt))
    }
}

/// Where the inner IP header of a tunnel starts (the cursor stands there).
struct Inner {
    /// The inner header's family as an ethertype.
    ethertype: u16,
    /// The outer datagram is an IPv4 first fragment: the rest of the inner datagram is
    /// in fragments that show no inner header.
    first_fragment: bool,
}

#[inline(always)]
fn is_tunnel_proto(proto: u8) -> bool {
    matches!(
        proto,
        IPPROTO_IPIP | IPPROTO_IPV6 | IPPROTO_GRE | IPPROTO_UDP
    )
}

/// The outer IP header and the tunnel header after it, when the frame's interface
/// decapsulates that encapsulation: moves the cursor to the inner IP header. `None`
/// (cursor unmoved): the frame is classified by its outer header, as everywhere else.
/// The outer header is only read here; the one parse of the frame's L3/L4 headers
/// (outer or inner) comes after. An outer IPv4 later fragment is not decapsulated (it
/// carries no inner header; the outer destination's rules see it), nor is an outer
/// IPv6 header followed by extension headers (README, "Tunnels").
#[inline(always)]
fn decapsulate(
    cur: &mut Cursor,
    ethertype: u16,
    lookup: impl FnOnce() -> Option<TunnelConfig>,
) -> Result<Option<Inner>, ParseError> {
    let mut at = Cursor {
        pos: cur.pos,
        end: cur.end,
    };
    let (proto, first_fragment) = if ethertype == ETH_P_IP {
        let Ok(ip) = at.take::<Ipv4Hdr>() else {
            return Ok(None);
        };
        let ip = ip as usize;
        let [version_ihl, _, _, _] = load32::<0>(ip).to_ne_bytes();
        let [_, _, frag_hi, frag_lo] = load32::<4>(ip).to_ne_bytes();
        let [_, proto, _, _] = load32::<8>(ip).to_ne_bytes();
        let header_len = usize::from(version_ihl & 0x0f) * 4;
        let frag_off = u16::from_be_bytes([frag_hi, frag_lo]);
        if !is_tunnel_proto(proto)
            || version_ihl >> 4 != 4
            || header_len < size_of::<Ipv4Hdr>()
            || frag_off & IPV4_OFFSET_MASK != 0
            || at.skip(header_len - size_of::<Ipv4Hdr>()).is_err()
        {
            return Ok(None);
        }
        (proto, frag_off & IPV4_MORE_FRAGMENTS != 0)
    } else {
        let Ok(ip) = at.take::<Ipv6Hdr>() else {
            return Ok(None);
        };
        let [first, _, _, _] = load32::<0>(ip as usize).to_ne_bytes();
        let [_, _, next, _] = load32::<4>(ip as usize).to_ne_bytes();
        if first >> 4 != 6 || !is_tunnel_proto(next) {
            return Ok(None);
        }
        (next, false)
    };
    let Some(config) = lookup() else {
        return Ok(None);
    };
    let inner = match proto {
        IPPROTO_IPIP if config.flags & TUNNEL_IPIP != 0 => Ok(Some(ETH_P_IP)),
        IPPROTO_IPV6 if config.flags & TUNNEL_IP6 != 0 => Ok(Some(ETH_P_IPV6)),
        IPPROTO_GRE if config.flags & TUNNEL_GRE != 0 => gre(&mut at),
        IPPROTO_UDP => udp_tunnel(&mut at, &config),
        _ => Ok(None),
    };
    match inner {
        Ok(Some(ethertype)) => {
            cur.pos = at.pos;
            Ok(Some(Inner {
                ethertype,
                first_fragment,
            }))
        }
        Ok(None) => Ok(None),
        // The tunnel header itself is cut off by the end of an outer first fragment.
        Err(_) if first_fragment => Err(ParseError::UnreadableTunnel),
        // A truncated frame: the outer parse finds it malformed.
        Err(_) => Ok(None),
    }
}

#[repr(C)]
struct GreHdr {
    flags_version: [u8; 2],
    protocol: [u8; 2],
}

const GRE_CHECKSUM: u16 = 0x8000;
const GRE_ROUTING: u16 = 0x4000;
const GRE_KEY: u16 = 0x2000;
const GRE_SEQUENCE: u16 = 0x1000;
const GRE_VERSION: u16 = 0x0007;

/// A GRE header (RFC 2784, RFC 2890) carrying IPv4 or IPv6. Version 1 (PPTP) and the
/// routing bit are not decapsulated, as by Linux.
#[inline(always)]
fn gre(at: &mut Cursor) -> Result<Option<u16>, ParseError> {
    let gre = at.take::<GreHdr>()? as usize;
    let flags = be16_at::<0>(gre);
    let protocol = be16_at::<2>(gre);
    if flags & (GRE_ROUTING | GRE_VERSION) != 0 {
        return Ok(None);
    }
    // Each of checksum (with its reserved half), key and sequence number is a word.
    let words = usize::from(flags & GRE_CHECKSUM != 0)
        + usize::from(flags & GRE_KEY != 0)
        + usize::from(flags & GRE_SEQUENCE != 0);
    at.skip(words * 4)?;
    Ok(match protocol {
        ETH_P_IP => Some(ETH_P_IP),
        ETH_P_IPV6 => Some(ETH_P_IPV6),
        _ => None,
    })
}

/// GUE version 0's control-message bit (in its first byte).
const GUE_CONTROL: u8 = 0x20;

/// A UDP datagram to one of the interface's FOU or GUE ports.
#[inline(always)]
fn udp_tunnel(at: &mut Cursor, config: &TunnelConfig) -> Result<Option<u16>, ParseError> {
    let udp = at.take::<UdpHdr>()? as usize;
    let port = be16_at::<2>(udp);
    let mut gue = None;
    for i in 0..MAX_TUNNEL_UDP_PORTS {
        if port != 0 && config.udp_ports[i] == port {
            gue = Some(config.gue_ports & (1 << i) != 0);
            break;
        }
    }
    let Some(gue) = gue else {
        return Ok(None);
    };
    let mut peek = Cursor {
        pos: at.pos,
        end: at.end,
    };
    let first = peek.take::<[u8; 2]>()?;
    // SAFETY: two bytes inside the frame, just checked.
    let [lead, proto] = unsafe { *first };
    // FOU, and GUE version 1: the inner IP header comes right away (its version says
    // which).
    if !gue || lead >> 6 == 1 {
        return Ok(match lead >> 4 {
            4 => Some(ETH_P_IP),
            6 => Some(ETH_P_IPV6),
            _ => None,
        });
    }
    // GUE version 0: a 4-byte header, `hlen` words of options, then the protocol
    // `proto`. Control messages carry no inner datagram.
    if lead >> 6 != 0 || lead & GUE_CONTROL != 0 {
        return Ok(None);
    }
    at.skip(4 + usize::from(lead & 0x1f) * 4)?;
    Ok(match proto {
        IPPROTO_IPIP => Some(ETH_P_IP),
        IPPROTO_IPV6 => Some(ETH_P_IPV6),
        _ => None,
    })
}

/// `Packet::proto` when the parser could not find the transport protocol (a reserved
/// number, never a rule's).
pub const PROTO_UNKNOWN: u8 = 255;

/// IPv4 fragment offset bits and "more fragments" flag.
const IPV4_OFFSET_MASK: u16 = 0x1fff;
const IPV4_MORE_FRAGMENTS: u16 = 0x2000;

/// An IP length field as a byte count: 0 (a GSO buffer larger than 64 KiB, BIG TCP)
/// counts as 65536, past the end of any frame; without a branch, so the verifier
/// follows one path.
#[inline(always)]
fn length_field(len: u16) -> usize {
    (usize::from(len).wrapping_add(0xffff) & 0xffff) + 1
}

#[inline(always)]
fn parse_ipv4(cur: &mut Cursor) -> Result<Packet, ParseError> {
    let ip = cur.take::<Ipv4Hdr>()? as usize;
    let [version_ihl, _tos, len_hi, len_lo] = load32::<0>(ip).to_ne_bytes();
    let [id_hi, id_lo, frag_hi, frag_lo] = load32::<4>(ip).to_ne_bytes();
    let [_ttl, proto, _, _] = load32::<8>(ip).to_ne_bytes();
    let total_len = length_field(u16::from_be_bytes([len_hi, len_lo]));
    let frag_off = u16::from_be_bytes([frag_hi, frag_lo]);
    let (src, dst) = (load32::<12>(ip), load32::<16>(ip));
    let header_len = usize::from(version_ihl & 0x0f) * 4;
    if version_ihl >> 4 != 4 || header_len < size_of::<Ipv4Hdr>() {
        return Err(ParseError::Malformed);
    }
    if total_len < header_len {
        return Err(ParseError::Malformed);
    }
    cur.skip(header_len - size_of::<Ipv4Hdr>())?;
    let offset = frag_off & IPV4_OFFSET_MASK;
    let mut pkt = Packet {
        family: 4,
        kind: kind::WHOLE,
        proto,
        has_ports: false,
        syn: false,
        dst_port: 0,
        frag_id: u32::from(u16::from_be_bytes([id_hi, id_lo])),
        frag_offset: 0,
        src: [src, 0, 0, 0],
        dst: [dst, 0, 0, 0],
    };
    if offset != 0 {
        pkt.kind = later_kind(proto);
        pkt.frag_offset = u32::from(offset);
        return Ok(pkt);
    }
    if frag_off & IPV4_MORE_FRAGMENTS != 0 {
        pkt.kind = kind::FIRST_FRAGMENT;
        pkt.frag_offset = ((total_len - header_len) / 8) as u32;
    }
    let walked = parse_l4(cur, &mut pkt);
    if cur.past_datagram(ip, total_len, walked)? {
        cut_short(&mut pkt)?;
    }
    Ok(pkt)
}

/// The kind of an IPv4 later fragment of protocol `next`.
#[inline(always)]
fn later_kind(next: u8) -> u32 {
    if next == IPPROTO_TCP || next == IPPROTO_UDP || is_extension_header(next) {
        kind::LATER_FRAGMENT
    } else {
        kind::LATER_PORTLESS
    }
}

/// The IPv6 fragment header's "more fragments" flag (in the offset word).
const IPV6_MORE_FRAGMENTS: u16 = 1;

#[inline(always)]
fn parse_ipv6(cur: &mut Cursor) -> Result<Packet, ParseError> {
    let ip = cur.take::<Ipv6Hdr>()? as usize;
    let [first, _, _, _] = load32::<0>(ip).to_ne_bytes();
    let [len_hi, len_lo, next, _hop_limit] = load32::<4>(ip).to_ne_bytes();
    if first >> 4 != 6 {
        return Err(ParseError::Malformed);
    }
    let datagram_len = size_of::<Ipv6Hdr>() + length_field(u16::from_be_bytes([len_hi, len_lo]));
    let mut pkt = Packet {
        family: 6,
        kind: kind::WHOLE,
        proto: PROTO_UNKNOWN,
        has_ports: false,
        syn: false,
        dst_port: 0,
        frag_id: 0,
        frag_offset: 0,
        src: [
            load32::<8>(ip),
            load32::<12>(ip),
            load32::<16>(ip),
            load32::<20>(ip),
        ],
        dst: [
            load32::<24>(ip),
            load32::<28>(ip),
            load32::<32>(ip),
            load32::<36>(ip),
        ],
    };
    let walked = walk_ipv6(cur, &mut pkt, next, ip, datagram_len);
    if pkt.kind == kind::LATER_FRAGMENT {
        // It stopped at the fragment header, read in full.
        walked?;
        return Ok(pkt);
    }
    if cur.past_datagram(ip, datagram_len, walked)? {
        cut_short(&mut pkt)?;
    }
    Ok(pkt)
}

/// The extension-header chain and the transport header after it.
#[inline(always)]
fn walk_ipv6(
    cur: &mut Cursor,
    pkt: &mut Packet,
    mut next: u8,
    ip: usize,
    datagram_len: usize,
) -> Result<(), ParseError> {
    let mut done = false;
    for _ in 0..MAX_IPV6_EXT_HEADERS {
        match next {
            IPPROTO_HOPOPTS | IPPROTO_ROUTING | IPPROTO_DSTOPTS => {
                let ext = cur.take::<ExtHdr>()?;
                let (nh, len) = unsafe { ((*ext).next_header, (*ext).len) };
                cur.skip((usize::from(len) + 1) * 8 - size_of::<ExtHdr>())?;
                next = nh;
            }
            IPPROTO_AH => {
                let ext = cur.take::<ExtHdr>()?;
                let (nh, len) = unsafe { ((*ext).next_header, (*ext).len) };
                cur.skip((usize::from(len) + 2) * 4 - size_of::<ExtHdr>())?;
                next = nh;
            }
            IPPROTO_FRAGMENT => {
                let frag = cur.take::<FragHdr>()?;
                let (nh, offset_flags, id) = unsafe {
                    (
                        (*frag).next_header,
                        be16((*frag).offset_flags),
                        u32::from_be_bytes((*frag).id),
                    )
                };
                if pkt.kind != kind::WHOLE {
                    // Fragments nested in a fragment: a chain the parser does not follow.
                    pkt.kind = kind::LONG_CHAIN;
                    return Ok(());
                }
                next = nh;
                let offset = offset_flags >> 3;
                pkt.frag_id = id;
                if offset != 0 {
                    // Its own Next Header is not the datagram's: the destination takes
                    // that from the first fragment (RFC 8200 §4.5), so a later fragment
                    // could claim anything here. It is classified with the first
                    // fragment's record, as an IPv4 later fragment of TCP or UDP.
                    pkt.kind = kind::LATER_FRAGMENT;
                    pkt.frag_offset = u32::from(offset);
                    return Ok(());
                }
                if offset_flags & IPV6_MORE_FRAGMENTS != 0 {
                    // An atomic fragment (offset 0, no more) is a whole datagram (RFC 6946).
                    pkt.kind = kind::FIRST_FRAGMENT;
                    let fragmentable = (ip + datagram_len).saturating_sub(cur.pos);
                    pkt.frag_offset = (fragmentable / 8) as u32;
                }
            }
            _ => {
                done = true;
                break;
            }
        }
    }
    if !done && is_extension_header(next) {
        // Still inside the chain after the walk bound: we cannot find the L4 header.
        pkt.kind = kind::LONG_CHAIN;
        return Ok(());
    }
    pkt.proto = next;
    parse_l4(cur, pkt)
}

/// Headers that run past the datagram: in a first fragment, the fragment does not hold
/// what the destination will read from the reassembled datagram — the transport header
/// (RFC 1858, RFC 3128) or, for IPv6, the whole header chain (RFC 8200 §4.5, RFC 7112):
/// a tiny fragment. A whole datagram cut short is one the destination drops.
#[inline(always)]
fn cut_short(pkt: &mut Packet) -> Result<(), ParseError> {
    match pkt.kind {
        kind::FIRST_FRAGMENT => {
            pkt.kind = kind::TINY_FRAGMENT;
            Ok(())
        }
        // A chain the parser gave up on is refused whatever its length.
        kind::LONG_CHAIN => Ok(()),
        _ => Err(ParseError::Malformed),
    }
}

#[inline(always)]
fn is_extension_header(next: u8) -> bool {
    matches!(
        next,
        IPPROTO_HOPOPTS | IPPROTO_ROUTING | IPPROTO_DSTOPTS | IPPROTO_AH | IPPROTO_FRAGMENT
    )
}

/// The whole minimum TCP header (RFC 1858: a first fragment must hold at least the
/// flags; 20 bytes make every overlap with them start at fragment offset 1 or 2, which
/// the first fragment's record then refuses).
#[repr(C)]
struct TcpHdr {
    src_port: [u8; 2],
    dst_port: [u8; 2],
    seq: [u8; 4],
    ack: [u8; 4],
    offset: u8,
    flags: u8,
    window: [u8; 2],
    check: [u8; 2],
    urgent: [u8; 2],
}

#[inline(always)]
fn parse_l4(cur: &mut Cursor, pkt: &mut Packet) -> Result<(), ParseError> {
    match pkt.proto {
        IPPROTO_TCP => {
            let tcp = cur.take::<TcpHdr>()?;
            let (port, flags) = (be16_at::<2>(tcp as usize), unsafe { (*tcp).flags });
            pkt.has_ports = true;
            pkt.dst_port = port;
            pkt.syn = flags & (TCP_FLAG_SYN | TCP_FLAG_ACK) == TCP_FLAG_SYN;
        }
        IPPROTO_UDP => {
            let udp = cur.take::<UdpHdr>()? as usize;
            pkt.has_ports = true;
            pkt.dst_port = be16_at::<2>(udp);
        }
        _ => {}
    }
    Ok(())
}
