//! Cursor-style parser: each step checks bounds, reads one header and says what comes
//! next. Nothing here can fail the program: every error becomes a verdict of PASS plus
//! a counter in the caller.

use core::mem::size_of;

use aya_ebpf::programs::XdpContext;
use limiter_common::abi::{IPPROTO_TCP, IPPROTO_UDP};

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

const TCP_FLAG_SYN: u8 = 0x02;
const TCP_FLAG_ACK: u8 = 0x10;

/// Why a frame was not classified.
pub enum ParseError {
    /// Not IPv4/IPv6 (ARP, LLDP…).
    NonIp,
    /// Truncated or inconsistent headers, more VLAN tags or IPv6 extension headers than
    /// the parser walks.
    Malformed,
}

/// What the classifier and the meters need from a frame.
pub struct Packet {
    /// 4 or 6.
    pub family: u32,
    /// L4 protocol (after IPv6 extension headers).
    pub proto: u8,
    /// The frame carries an L4 header with ports (TCP/UDP, not a non-first fragment).
    pub has_ports: bool,
    /// TCP SYN without ACK.
    pub syn: bool,
    /// Destination port, host order (valid with `has_ports`).
    pub dst_port: u16,
    /// Addresses, network order; IPv4 uses the first 4 bytes.
    pub src: [u8; 16],
    pub dst: [u8; 16],
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
        if start + size_of::<T>() > self.end {
            return Err(ParseError::Malformed);
        }
        self.pos = start + size_of::<T>();
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

/// Ports and flags of TCP (the first 14 bytes).
#[repr(C)]
struct TcpHead {
    src_port: [u8; 2],
    dst_port: [u8; 2],
    seq: [u8; 4],
    ack: [u8; 4],
    offset: u8,
    flags: u8,
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

/// Parses Ethernet, up to two VLAN tags, IPv4 or IPv6 (with extension headers), and the
/// TCP/UDP ports.
#[inline(always)]
pub fn parse(ctx: &XdpContext) -> Result<Packet, ParseError> {
    let mut cur = Cursor {
        pos: ctx.data(),
        end: ctx.data_end(),
    };
    let eth = cur.take::<EthHdr>()?;
    let mut ethertype = be16(unsafe { (*eth).ethertype });
    for _ in 0..MAX_VLAN_TAGS {
        if ethertype != ETH_P_8021Q && ethertype != ETH_P_8021AD {
            break;
        }
        let vlan = cur.take::<VlanHdr>()?;
        ethertype = be16(unsafe { (*vlan).ethertype });
    }
    match ethertype {
        ETH_P_IP => parse_ipv4(&mut cur),
        ETH_P_IPV6 => parse_ipv6(&mut cur),
        // A third tag: we cannot see what it carries, and it may be IP trying to slip past.
        ETH_P_8021Q | ETH_P_8021AD => Err(ParseError::Malformed),
        _ => Err(ParseError::NonIp),
    }
}

#[inline(always)]
fn parse_ipv4(cur: &mut Cursor) -> Result<Packet, ParseError> {
    let ip = cur.take::<Ipv4Hdr>()?;
    let (version_ihl, total_len, frag_off, proto, src4, dst4) = unsafe {
        (
            (*ip).version_ihl,
            be16((*ip).total_len),
            be16((*ip).frag_off),
            (*ip).proto,
            (*ip).src,
            (*ip).dst,
        )
    };
    let header_len = usize::from(version_ihl & 0x0f) * 4;
    if version_ihl >> 4 != 4 || header_len < size_of::<Ipv4Hdr>() {
        return Err(ParseError::Malformed);
    }
    if usize::from(total_len) < header_len {
        return Err(ParseError::Malformed);
    }
    cur.skip(header_len - size_of::<Ipv4Hdr>())?;
    let mut pkt = Packet {
        family: 4,
        proto,
        has_ports: false,
        syn: false,
        dst_port: 0,
        src: v4_in_16(src4),
        dst: v4_in_16(dst4),
    };
    let non_first_fragment = frag_off & 0x1fff != 0;
    if !non_first_fragment {
        parse_l4(cur, &mut pkt)?;
    }
    Ok(pkt)
}

/// An IPv4 address in the first 4 bytes of 16, the rest zero. Built from words: a zeroed
/// array with 4 bytes copied in compiles to a call of the object's `memset` (a BPF-to-BPF
/// call, ≈ 10 ns each here).
#[inline(always)]
fn v4_in_16(addr: [u8; 4]) -> [u8; 16] {
    let words = [u32::from_ne_bytes(addr), 0, 0, 0];
    // SAFETY: [u32; 4] and [u8; 16] have the same size; every bit pattern is valid.
    unsafe { core::mem::transmute::<[u32; 4], [u8; 16]>(words) }
}

#[inline(always)]
fn parse_ipv6(cur: &mut Cursor) -> Result<Packet, ParseError> {
    let ip = cur.take::<Ipv6Hdr>()?;
    let (first, mut next) = unsafe { ((*ip).version_class_flow[0], (*ip).next_header) };
    if first >> 4 != 6 {
        return Err(ParseError::Malformed);
    }
    let mut pkt = Packet {
        family: 6,
        proto: 0,
        has_ports: false,
        syn: false,
        dst_port: 0,
        src: unsafe { (*ip).src },
        dst: unsafe { (*ip).dst },
    };
    let mut non_first_fragment = false;
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
                let (nh, offset) =
                    unsafe { ((*frag).next_header, be16((*frag).offset_flags) >> 3) };
                next = nh;
                if offset != 0 {
                    non_first_fragment = true;
                    done = true;
                    break;
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
        return Err(ParseError::Malformed);
    }
    pkt.proto = next;
    if !non_first_fragment {
        parse_l4(cur, &mut pkt)?;
    }
    Ok(pkt)
}

#[inline(always)]
fn is_extension_header(next: u8) -> bool {
    matches!(
        next,
        IPPROTO_HOPOPTS | IPPROTO_ROUTING | IPPROTO_DSTOPTS | IPPROTO_AH | IPPROTO_FRAGMENT
    )
}

#[inline(always)]
fn parse_l4(cur: &mut Cursor, pkt: &mut Packet) -> Result<(), ParseError> {
    match pkt.proto {
        IPPROTO_TCP => {
            let tcp = cur.take::<TcpHead>()?;
            let (port, flags) = unsafe { (be16((*tcp).dst_port), (*tcp).flags) };
            pkt.has_ports = true;
            pkt.dst_port = port;
            pkt.syn = flags & (TCP_FLAG_SYN | TCP_FLAG_ACK) == TCP_FLAG_SYN;
        }
        IPPROTO_UDP => {
            let udp = cur.take::<UdpHdr>()?;
            pkt.has_ports = true;
            pkt.dst_port = be16(unsafe { (*udp).dst_port });
        }
        _ => {}
    }
    Ok(())
}
