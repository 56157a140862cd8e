//! Hostile frames and what a destination makes of them, for the evasion fuzz test
//! (tests/evasion.rs).
//!
//! [`Datagram`] is what a sender wants delivered; [`Disguise`] is how it dresses it up —
//! VLAN tags, IPv4 options, IPv6 extension headers, padding, truncation, lying length
//! fields, fragments of any size, order and overlap, and IPv6 later fragments whose own
//! Next Header lies (the destination reads the datagram's from the first fragment only). [`Destination`] is an
//! independent model of a receiving stack: it parses frames with no walk bounds and
//! reassembles fragments *generously* (overlaps resolved first-wins or last-wins instead
//! of discarded, as Linux does), so a datagram counts as delivered whenever some real
//! stack could deliver it. The model shares no code with the XDP program's parser.

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

// The wire's numbers, as the frame builder names them (the model shares the names, not
// the XDP program's parser).
use crate::frame::{
    ETH_P_IP, ETH_P_IPV6, IPPROTO_DSTOPTS, IPPROTO_FRAGMENT, IPPROTO_HOPOPTS, IPPROTO_ROUTING,
};
pub use crate::frame::{IPPROTO_ICMP, IPPROTO_ICMPV6, IPPROTO_TCP, IPPROTO_UDP, TCP_ACK, TCP_SYN};

pub const IPPROTO_GRE: u8 = 47;
const TPIDS: [u16; 2] = [0x8100, 0x88a8];

/// The simulator's seeded generator (SplitMix64), with the draws the generators need.
#[derive(Clone, Debug)]
pub struct Rng(limiter_sim::rng::Rng);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(limiter_sim::rng::Rng::new(seed))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.0.unit() <= p
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

/// What the sender wants delivered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Datagram {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub proto: u8,
    pub dst_port: u16,
    /// TCP flags.
    pub flags: u8,
    pub data_len: usize,
    /// IPv4 and IPv6 Identification for fragments.
    pub id: u32,
}

impl Datagram {
    /// The transport header and data: the part of the datagram that fragments split.
    pub fn transport(&self) -> Vec<u8> {
        let mut t = Vec::new();
        match self.proto {
            IPPROTO_TCP => {
                t.extend_from_slice(&40000u16.to_be_bytes());
                t.extend_from_slice(&self.dst_port.to_be_bytes());
                t.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0x50, self.flags, 0xff, 0xff]);
                t.extend_from_slice(&[0, 0, 0, 0]);
            }
            IPPROTO_UDP => {
                t.extend_from_slice(&40000u16.to_be_bytes());
                t.extend_from_slice(&self.dst_port.to_be_bytes());
                let len = (8 + self.data_len).min(0xffff) as u16;
                t.extend_from_slice(&len.to_be_bytes());
                t.extend_from_slice(&[0, 0]);
            }
            IPPROTO_ICMP | IPPROTO_ICMPV6 => t.extend_from_slice(&[8, 0, 0, 0, 0, 1, 0, 1]),
            _ => {}
        }
        t.extend((0..self.data_len).map(|i| (i * 7 + 3) as u8));
        t
    }

    pub fn is_v6(&self) -> bool {
        self.dst.is_ipv6()
    }
}

/// An IPv6 extension header to put in the chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ext {
    HopByHop,
    DestOpts,
    /// Routing header type 4 with Segments Left 0 (the destination is final).
    Routing,
}

impl Ext {
    fn protocol(self) -> u8 {
        match self {
            Ext::HopByHop => IPPROTO_HOPOPTS,
            Ext::DestOpts => IPPROTO_DSTOPTS,
            Ext::Routing => IPPROTO_ROUTING,
        }
    }
}

/// One fragment of a datagram's fragmentable part: bytes `offset..offset + len` (a
/// multiple of 8 for `offset`), with the M flag, and optionally its own bytes instead of
/// the datagram's (an overlap that rewrites what the first fragment said).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Piece {
    pub offset: usize,
    pub len: usize,
    pub more: bool,
    pub rewrite: Option<Vec<u8>>,
    /// IPv6: the Next Header this fragment's Fragment header claims instead of the
    /// datagram's (a lie in a later fragment; a destination reads the first fragment's).
    pub next: Option<u8>,
}

/// How the sender dresses a datagram up.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Disguise {
    pub vlan_tags: usize,
    pub ipv4_option_words: usize,
    /// IPv6 extension headers before the transport header; with fragments, the first
    /// `unfragmentable` of them come before the fragment header.
    pub exts: Vec<Ext>,
    pub unfragmentable: usize,
    /// Fragments to send, in order; empty: the datagram whole.
    pub pieces: Vec<Piece>,
    /// Bytes of junk after the IP datagram (in every frame).
    pub padding: usize,
    /// Cut every frame to this many bytes, if shorter.
    pub truncate: Option<usize>,
    /// Overwrite the IP length field (IPv4 Total Length, IPv6 Payload Length) with a
    /// value this much smaller (a lie), if it stays ≥ the IP header.
    pub shrink_length: usize,
}

/// [`frames`] between two MAC addresses.
pub fn frames_between(
    d: &Datagram,
    g: &Disguise,
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
) -> Vec<Vec<u8>> {
    let mut out = frames(d, g);
    for f in &mut out {
        f[..6].copy_from_slice(&dst_mac);
        f[6..12].copy_from_slice(&src_mac);
    }
    out
}

/// The frames a datagram becomes under a disguise.
pub fn frames(d: &Datagram, g: &Disguise) -> Vec<Vec<u8>> {
    if g.pieces.is_empty() {
        let body = if d.is_v6() {
            chain(&g.exts, d.proto, &d.transport())
        } else {
            d.transport()
        };
        return vec![finish(frame(d, g, &body, None, &[]), g)];
    }
    // IPv6: the extension headers before the fragment header, and the first header of
    // the fragmentable part.
    let n = if d.is_v6() {
        g.unfragmentable.min(g.exts.len())
    } else {
        0
    };
    let unfrag_exts = &g.exts[..n];
    let first_next = g
        .exts
        .get(n)
        .filter(|_| d.is_v6())
        .map_or(d.proto, |e| e.protocol());
    let fragmentable = frames_body(d, g);
    g.pieces
        .iter()
        .map(|p| {
            let mut bytes: Vec<u8> = fragmentable
                .get(p.offset..(p.offset + p.len).min(fragmentable.len()))
                .unwrap_or(&[])
                .to_vec();
            if let Some(r) = &p.rewrite {
                bytes = r.clone();
            }
            let frag = FragInfo {
                offset: p.offset,
                more: p.more,
                next: p.next.unwrap_or(first_next),
            };
            finish(frame(d, g, &bytes, Some(frag), unfrag_exts), g)
        })
        .collect()
}

struct FragInfo {
    offset: usize,
    more: bool,
    /// IPv6: the first header of the fragmentable part.
    next: u8,
}

/// Extension headers followed by the transport (IPv6 body or fragmentable part).
fn chain(exts: &[Ext], proto: u8, transport: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, e) in exts.iter().enumerate() {
        let next = exts.get(i + 1).map_or(proto, |n| n.protocol());
        match e {
            Ext::HopByHop | Ext::DestOpts => out.extend_from_slice(&[next, 0, 1, 4, 0, 0, 0, 0]),
            Ext::Routing => {
                out.extend_from_slice(&[next, 2, 4, 0, 0, 0, 0, 0]);
                out.extend_from_slice(&[0x20, 0x01, 0x0d, 0xb8]);
                out.extend_from_slice(&[0; 12]);
            }
        }
    }
    out.extend_from_slice(transport);
    out
}

fn frame(
    d: &Datagram,
    g: &Disguise,
    body: &[u8],
    frag: Option<FragInfo>,
    unfrag: &[Ext],
) -> Vec<u8> {
    let mut f = vec![0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2];
    for i in 0..g.vlan_tags {
        f.extend_from_slice(&TPIDS[i % 2].to_be_bytes());
        f.extend_from_slice(&(10 + i as u16).to_be_bytes());
    }
    match (d.src, d.dst) {
        (IpAddr::V4(src), IpAddr::V4(dst)) => {
            f.extend_from_slice(&ETH_P_IP.to_be_bytes());
            let ihl = 5 + g.ipv4_option_words;
            let total = (ihl * 4 + body.len()).min(0xffff);
            let total = shrink(total, g.shrink_length, ihl * 4);
            let mut frag_word = 0u16;
            if let Some(fr) = &frag {
                frag_word = ((fr.offset / 8) as u16 & 0x1fff) | if fr.more { 0x2000 } else { 0 };
            }
            f.push(0x40 | ihl as u8);
            f.push(0);
            f.extend_from_slice(&(total as u16).to_be_bytes());
            f.extend_from_slice(&(d.id as u16).to_be_bytes());
            f.extend_from_slice(&frag_word.to_be_bytes());
            f.extend_from_slice(&[64, d.proto, 0, 0]);
            f.extend_from_slice(&src.octets());
            f.extend_from_slice(&dst.octets());
            f.extend(std::iter::repeat_n(1u8, g.ipv4_option_words * 4));
            // A real stack checks the header checksum before anything else.
            let header = f.len() - ihl * 4;
            let check = crate::frame::internet_checksum(&f[header..]);
            f[header + 10..header + 12].copy_from_slice(&check.to_be_bytes());
            f.extend_from_slice(body);
        }
        (IpAddr::V6(src), IpAddr::V6(dst)) => {
            f.extend_from_slice(&ETH_P_IPV6.to_be_bytes());
            let mut payload = Vec::new();
            let first = match &frag {
                Some(fr) => {
                    let exts: Vec<u8> = {
                        let mut v = Vec::new();
                        for (i, e) in unfrag.iter().enumerate() {
                            let next = unfrag.get(i + 1).map_or(IPPROTO_FRAGMENT, |n| n.protocol());
                            v.extend_from_slice(&chain(&[*e], next, &[]));
                        }
                        v
                    };
                    payload.extend_from_slice(&exts);
                    let word = (((fr.offset / 8) as u16 & 0x1fff) << 3) | u16::from(fr.more);
                    payload.extend_from_slice(&[fr.next, 0]);
                    payload.extend_from_slice(&word.to_be_bytes());
                    payload.extend_from_slice(&d.id.to_be_bytes());
                    payload.extend_from_slice(body);
                    unfrag.first().map_or(IPPROTO_FRAGMENT, |e| e.protocol())
                }
                None => {
                    // The body starts with the chain (or the transport).
                    payload.extend_from_slice(body);
                    g.exts.first().map_or(d.proto, |e| e.protocol())
                }
            };
            let len = shrink(payload.len().min(0xffff), g.shrink_length, 0);
            f.extend_from_slice(&[0x60, 0, 0, 0]);
            f.extend_from_slice(&(len as u16).to_be_bytes());
            f.extend_from_slice(&[first, 64]);
            f.extend_from_slice(&src.octets());
            f.extend_from_slice(&dst.octets());
            f.extend_from_slice(&payload);
        }
        _ => unreachable!("mixed families"),
    }
    f
}

fn shrink(len: usize, by: usize, floor: usize) -> usize {
    if by == 0 || len < by || len - by < floor.max(1) {
        len
    } else {
        len - by
    }
}

fn finish(mut f: Vec<u8>, g: &Disguise) -> Vec<u8> {
    f.extend((0..g.padding).map(|i| (0xa5 ^ i) as u8));
    if let Some(n) = g.truncate {
        f.truncate(n.max(14));
    }
    f
}

/// What a destination received whole: enough to classify it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivered {
    pub dst: IpAddr,
    pub proto: u8,
    /// TCP/UDP destination port.
    pub dst_port: Option<u16>,
    /// TCP SYN without ACK.
    pub syn: bool,
}

/// A parsed frame, as a stack without walk bounds sees it.
#[derive(Clone, Debug)]
pub enum Seen {
    /// Not something the stack delivers (not IP, truncated, inconsistent).
    Nothing,
    Whole(Delivered),
    Fragment(Fragment),
}

#[derive(Clone, Debug)]
pub struct Fragment {
    pub key: (IpAddr, IpAddr, u32, u8),
    pub offset: usize,
    pub more: bool,
    pub data: Vec<u8>,
    /// The protocol announced for the fragmentable part (IPv4: the transport; IPv6: its
    /// first header).
    pub next: u8,
    pub dst: IpAddr,
}

/// How a generous reassembler resolves overlapping bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Overlap {
    FirstWins,
    LastWins,
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

/// Parses a frame: any number of VLAN tags (as if nested VLAN devices existed), IPv4
/// or IPv6 with any chain of extension headers.
pub fn parse_frame(f: &[u8]) -> Seen {
    let mut at = 12;
    let Some(mut ethertype) = be16(f, at) else {
        return Seen::Nothing;
    };
    at += 2;
    while TPIDS.contains(&ethertype) {
        let Some(inner) = be16(f, at + 2) else {
            return Seen::Nothing;
        };
        ethertype = inner;
        at += 4;
    }
    let ip = &f[at.min(f.len())..];
    match ethertype {
        ETH_P_IP => parse_v4(ip),
        ETH_P_IPV6 => parse_v6(ip),
        _ => Seen::Nothing,
    }
}

fn parse_v4(ip: &[u8]) -> Seen {
    if ip.len() < 20 || ip[0] >> 4 != 4 {
        return Seen::Nothing;
    }
    let ihl = usize::from(ip[0] & 0xf) * 4;
    let total = usize::from(be16(ip, 2).unwrap_or(0));
    if ihl < 20 || total < ihl || ip.len() < total {
        return Seen::Nothing;
    }
    let dst = IpAddr::V4(Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]));
    let src = IpAddr::V4(Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]));
    let proto = ip[9];
    let word = be16(ip, 6).unwrap_or(0);
    let offset = usize::from(word & 0x1fff) * 8;
    let more = word & 0x2000 != 0;
    let payload = &ip[ihl..total];
    if offset == 0 && !more {
        return transport(dst, proto, payload).map_or(Seen::Nothing, Seen::Whole);
    }
    Seen::Fragment(Fragment {
        key: (src, dst, u32::from(be16(ip, 4).unwrap_or(0)), proto),
        offset,
        more,
        data: payload.to_vec(),
        next: proto,
        dst,
    })
}

fn parse_v6(ip: &[u8]) -> Seen {
    if ip.len() < 40 || ip[0] >> 4 != 6 {
        return Seen::Nothing;
    }
    let len = usize::from(be16(ip, 4).unwrap_or(0));
    if len == 0 || ip.len() < 40 + len {
        return Seen::Nothing;
    }
    let mut octets = [0u8; 16];
    octets.copy_from_slice(&ip[24..40]);
    let dst = IpAddr::V6(Ipv6Addr::from(octets));
    octets.copy_from_slice(&ip[8..24]);
    let src = IpAddr::V6(Ipv6Addr::from(octets));
    let payload = &ip[40..40 + len];
    let mut next = ip[6];
    let mut at = 0;
    loop {
        match next {
            IPPROTO_HOPOPTS | IPPROTO_ROUTING | IPPROTO_DSTOPTS => {
                let (Some(&nh), Some(&l)) = (payload.get(at), payload.get(at + 1)) else {
                    return Seen::Nothing;
                };
                next = nh;
                at += (usize::from(l) + 1) * 8;
            }
            IPPROTO_FRAGMENT => {
                let Some(h) = payload.get(at..at + 8) else {
                    return Seen::Nothing;
                };
                let word = u16::from_be_bytes([h[2], h[3]]);
                let (offset, more) = (usize::from(word >> 3) * 8, word & 1 != 0);
                let id = u32::from_be_bytes([h[4], h[5], h[6], h[7]]);
                let data = payload[at + 8..].to_vec();
                if offset == 0 && !more {
                    // Atomic fragment: processed in isolation (RFC 6946).
                    next = h[0];
                    at += 8;
                    continue;
                }
                return Seen::Fragment(Fragment {
                    key: (src, dst, id, 0),
                    offset,
                    more,
                    data,
                    next: h[0],
                    dst,
                });
            }
            _ => break,
        }
        if at > payload.len() {
            return Seen::Nothing;
        }
    }
    transport(dst, next, &payload[at.min(payload.len())..]).map_or(Seen::Nothing, Seen::Whole)
}

/// The transport of a whole datagram: delivered if its header is complete.
fn transport(dst: IpAddr, proto: u8, t: &[u8]) -> Option<Delivered> {
    match proto {
        IPPROTO_TCP if t.len() >= 20 => Some(Delivered {
            dst,
            proto,
            dst_port: be16(t, 2),
            syn: t[13] & (TCP_SYN | TCP_ACK) == TCP_SYN,
        }),
        IPPROTO_UDP if t.len() >= 8 => Some(Delivered {
            dst,
            proto,
            dst_port: be16(t, 2),
            syn: false,
        }),
        IPPROTO_TCP | IPPROTO_UDP => None,
        _ => Some(Delivered {
            dst,
            proto,
            dst_port: None,
            syn: false,
        }),
    }
}

/// The receiving stack: whole datagrams as they come, fragments reassembled.
pub struct Destination {
    overlap: Overlap,
    queues: BTreeMap<(IpAddr, IpAddr, u32, u8), Vec<Fragment>>,
    pub delivered: Vec<Delivered>,
}

impl Destination {
    pub fn new(overlap: Overlap) -> Destination {
        Destination {
            overlap,
            queues: BTreeMap::new(),
            delivered: Vec::new(),
        }
    }

    pub fn receive(&mut self, frame: &[u8]) {
        match parse_frame(frame) {
            Seen::Nothing => {}
            Seen::Whole(d) => self.delivered.push(d),
            Seen::Fragment(frag) => {
                let key = frag.key;
                let queue = self.queues.entry(key).or_default();
                queue.push(frag);
                if let Some(d) = reassemble(queue, self.overlap) {
                    self.queues.remove(&key);
                    self.delivered.push(d);
                }
            }
        }
    }
}

/// A datagram, once the fragments cover it from 0 to a last fragment's end.
fn reassemble(queue: &[Fragment], overlap: Overlap) -> Option<Delivered> {
    let last = queue
        .iter()
        .filter(|f| !f.more)
        .map(|f| f.offset + f.data.len())
        .max()?;
    let first = queue.iter().find(|f| f.offset == 0)?;
    let mut bytes: Vec<Option<u8>> = vec![None; last];
    let order: Vec<&Fragment> = match overlap {
        Overlap::FirstWins => queue.iter().collect(),
        Overlap::LastWins => queue.iter().rev().collect(),
    };
    for f in order {
        // Fragments with more to come carry whole 8-byte units (Linux trims the rest).
        let len = if f.more {
            f.data.len() / 8 * 8
        } else {
            f.data.len()
        };
        for (i, b) in f.data[..len].iter().enumerate() {
            if let Some(slot) = bytes.get_mut(f.offset + i) {
                if slot.is_none() {
                    *slot = Some(*b);
                }
            }
        }
    }
    let whole: Option<Vec<u8>> = bytes.into_iter().collect();
    let whole = whole?;
    // The fragmentable part: IPv6 may start with more extension headers.
    let mut next = first.next;
    let mut at = 0;
    while matches!(next, IPPROTO_HOPOPTS | IPPROTO_ROUTING | IPPROTO_DSTOPTS) {
        let (&nh, &l) = (whole.get(at)?, whole.get(at + 1)?);
        next = nh;
        at += (usize::from(l) + 1) * 8;
    }
    transport(first.dst, next, whole.get(at..)?)
}

/// Bytes of the fragmentable part under a disguise.
pub fn fragmentable_len(d: &Datagram, g: &Disguise) -> usize {
    let transport = d.transport().len();
    if d.is_v6() {
        let n = g.unfragmentable.min(g.exts.len());
        transport + g.exts[n..].iter().map(|e| ext_len(*e)).sum::<usize>()
    } else {
        transport
    }
}

fn ext_len(e: Ext) -> usize {
    match e {
        Ext::HopByHop | Ext::DestOpts => 8,
        Ext::Routing => 24,
    }
}

/// Where a datagram's transport header starts in its fragmentable part, and its
/// length (0 for protocols without one the classifier reads).
fn transport_span(d: &Datagram, g: &Disguise) -> (usize, usize) {
    let start = fragmentable_len(d, g) - d.transport().len();
    let len = match d.proto {
        IPPROTO_TCP => 20,
        IPPROTO_UDP => 8,
        _ => 0,
    };
    (start, len)
}

const EXTS: [Ext; 3] = [Ext::HopByHop, Ext::DestOpts, Ext::Routing];

/// Up to `most` random IPv6 extension headers, split at random around the fragment
/// header.
fn random_chain(rng: &mut Rng, g: &mut Disguise, most: u64) {
    let n = rng.below(most + 1) as usize;
    g.exts = (0..n).map(|_| *rng.pick(&EXTS)).collect();
    g.unfragmentable = rng.below(n as u64 + 1) as usize;
}

/// Fragments of a fragmentable part of `len` bytes: in order, each but the last a
/// multiple of 8, the first holding at least `first_min` bytes.
pub fn honest_pieces(rng: &mut Rng, len: usize, first_min: usize) -> Vec<Piece> {
    let mut pieces = Vec::new();
    let mut at = 0;
    while at < len {
        let floor = if at == 0 {
            first_min.div_ceil(8) * 8
        } else {
            8
        };
        let size = (floor + 8 * rng.below(8) as usize).min(len - at);
        let more = at + size < len;
        let size = if more { size / 8 * 8 } else { size };
        if size == 0 {
            break;
        }
        pieces.push(Piece {
            offset: at,
            len: size,
            more,
            rewrite: None,
            next: None,
        });
        at += size;
    }
    pieces
}

/// A disguise that no honest stack produces but every trick an attacker has: tiny first
/// fragments, overlaps that rewrite ports or flags, duplicates, reordering, loss, too
/// many tags or headers, padding, truncation and lying lengths.
pub fn hostile_disguise(rng: &mut Rng, d: &Datagram) -> Disguise {
    let mut g = Disguise::default();
    if rng.chance(0.15) {
        g.vlan_tags = rng.below(4) as usize;
    }
    if !d.is_v6() && rng.chance(0.3) {
        g.ipv4_option_words = rng.below(11) as usize;
    }
    if d.is_v6() && rng.chance(0.4) {
        random_chain(rng, &mut g, 8);
    }
    if rng.chance(0.2) {
        g.padding = rng.below(48) as usize;
    }
    if rng.chance(0.05) {
        g.truncate = Some(14 + rng.below(120) as usize);
    }
    if rng.chance(0.05) {
        g.shrink_length = 1 + rng.below(24) as usize;
    }
    if rng.chance(0.7) {
        let len = fragmentable_len(d, &g);
        let (start, tlen) = transport_span(d, &g);
        let first_min = if rng.chance(0.3) {
            // Tiny: the first fragment stops inside the chain or the transport header.
            1 + rng.below((start + tlen).max(1) as u64) as usize
        } else {
            start + tlen
        };
        let mut pieces = honest_pieces(rng, len, first_min.max(1));
        if pieces.is_empty() {
            return g;
        }
        let fragmentable: Vec<u8> = frames_body(d, &g);
        if rng.chance(0.35) {
            // An overlap rewriting the transport header: flags to SYN, or (at offset 0) the
            // destination port to another rule's.
            let offset = 8 * rng.below(3) as usize;
            let size = 8 * (1 + rng.below(3) as usize);
            let mut bytes: Vec<u8> = (offset..offset + size)
                .map(|i| fragmentable.get(i).copied().unwrap_or(0))
                .collect();
            let flags_at = start + 13;
            if (offset..offset + size).contains(&flags_at) {
                bytes[flags_at - offset] = TCP_SYN;
            }
            let port_at = start + 2;
            if (offset..offset + size - 1).contains(&port_at) {
                let port = *rng.pick(&[443u16, 53, 80, 9]);
                bytes[port_at - offset..port_at - offset + 2].copy_from_slice(&port.to_be_bytes());
            }
            let at = rng.below(pieces.len() as u64 + 1) as usize;
            pieces.insert(
                at,
                Piece {
                    offset,
                    len: size,
                    more: true,
                    rewrite: Some(bytes),
                    next: None,
                },
            );
        }
        if d.is_v6() && rng.chance(0.3) {
            // Later fragments that claim another Next Header than the datagram's: none
            // (59), ICMPv6, or another transport.
            let claim = *rng.pick(&[59u8, IPPROTO_ICMPV6, IPPROTO_TCP, IPPROTO_UDP]);
            for p in pieces.iter_mut().filter(|p| p.offset > 0) {
                p.next = Some(claim);
            }
        }
        if rng.chance(0.2) {
            let i = rng.below(pieces.len() as u64) as usize;
            let dup = pieces[i].clone();
            pieces.insert(rng.below(pieces.len() as u64 + 1) as usize, dup);
        }
        if rng.chance(0.3) {
            for i in (1..pieces.len()).rev() {
                pieces.swap(i, rng.below(i as u64 + 1) as usize);
            }
        }
        if pieces.len() > 1 && rng.chance(0.1) {
            pieces.remove(rng.below(pieces.len() as u64) as usize);
        }
        g.pieces = pieces;
    }
    g
}

/// A disguise an honest stack may produce: up to two tags, options, a short chain, in
/// order fragments whose first one holds every header (RFC 7112), padding.
pub fn honest_disguise(rng: &mut Rng, d: &Datagram) -> Disguise {
    let mut g = Disguise {
        vlan_tags: rng.below(3) as usize,
        ..Disguise::default()
    };
    if !d.is_v6() {
        g.ipv4_option_words = rng.below(4) as usize;
    } else {
        random_chain(rng, &mut g, 3);
    }
    if rng.chance(0.3) {
        g.padding = rng.below(32) as usize;
    }
    if rng.chance(0.6) {
        let (start, tlen) = transport_span(d, &g);
        g.pieces = honest_pieces(rng, fragmentable_len(d, &g), (start + tlen).max(8));
    }
    g
}

/// The fragmentable part's bytes.
fn frames_body(d: &Datagram, g: &Disguise) -> Vec<u8> {
    if d.is_v6() {
        let n = g.unfragmentable.min(g.exts.len());
        chain(&g.exts[n..], d.proto, &d.transport())
    } else {
        d.transport()
    }
}
