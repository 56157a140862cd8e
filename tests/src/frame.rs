//! Packet crafting for tests: exact Ethernet frames, well formed or deliberately broken.
//!
//! [`FrameBuilder`] lays out a frame (Ethernet, 0..N VLAN tags, IPv4/IPv6/ARP/any
//! EtherType, TCP/UDP/ICMP or an opaque protocol, extension headers, options, fragments)
//! and fills in every length and checksum. The free functions then break one field of
//! the built bytes on purpose ([`set_ipv4_ihl`], [`set_ipv4_total_len`],
//! [`set_ipv4_checksum`]) or rewrite addresses cheaply for a traffic generator
//! ([`with_ipv4_src`], [`with_ipv6_src`], …), keeping every checksum valid.
//!
//! Frames carry no FCS: the bytes are what `BPF_PROG_TEST_RUN`, a veth pair or an
//! `AF_PACKET` socket hands to the XDP program, so `frame_len(64)` is 64 bytes from the
//! destination MAC to the last payload byte.
//!
//! ```
//! use std::net::Ipv4Addr;
//! use limiter_tests::frame::{FrameBuilder, TCP_SYN};
//!
//! let syn = FrameBuilder::ipv4(Ipv4Addr::new(198, 18, 0, 1), Ipv4Addr::new(198, 18, 0, 2))
//!     .vlan(0x8100, 10)
//!     .tcp(40000, 80, TCP_SYN)
//!     .frame_len(64)
//!     .build();
//! assert_eq!(syn.len(), 64);
//! ```

use std::{
    fmt,
    net::{Ipv4Addr, Ipv6Addr},
};

/// TCP flag FIN.
pub const TCP_FIN: u8 = 0x01;
/// TCP flag SYN.
pub const TCP_SYN: u8 = 0x02;
/// TCP flag RST.
pub const TCP_RST: u8 = 0x04;
/// TCP flag PSH.
pub const TCP_PSH: u8 = 0x08;
/// TCP flag ACK.
pub const TCP_ACK: u8 = 0x10;
/// TCP flag URG.
pub const TCP_URG: u8 = 0x20;
/// TCP flag ECE.
pub const TCP_ECE: u8 = 0x40;
/// TCP flag CWR.
pub const TCP_CWR: u8 = 0x80;

/// EtherType of IPv4.
pub const ETH_P_IP: u16 = 0x0800;
/// EtherType of ARP.
pub const ETH_P_ARP: u16 = 0x0806;
/// EtherType of IPv6.
pub const ETH_P_IPV6: u16 = 0x86dd;
/// TPID of an 802.1Q (customer) VLAN tag.
pub const ETH_P_8021Q: u16 = 0x8100;
/// TPID of an 802.1ad (service, QinQ outer) VLAN tag.
pub const ETH_P_8021AD: u16 = 0x88a8;
/// Legacy pre-802.1ad QinQ TPID, still seen on some switches.
pub const ETH_P_QINQ1: u16 = 0x9100;
/// EtherType of LLDP.
pub const ETH_P_LLDP: u16 = 0x88cc;

/// IP protocol number of ICMP.
pub const IPPROTO_ICMP: u8 = 1;
/// IP protocol number of TCP.
pub const IPPROTO_TCP: u8 = 6;
/// IP protocol number of UDP.
pub const IPPROTO_UDP: u8 = 17;
/// IPv6 Hop-by-Hop Options header.
pub const IPPROTO_HOPOPTS: u8 = 0;
/// IPv6 Routing header.
pub const IPPROTO_ROUTING: u8 = 43;
/// IPv6 Fragment header.
pub const IPPROTO_FRAGMENT: u8 = 44;
/// IP Authentication Header.
pub const IPPROTO_AH: u8 = 51;
/// ICMPv6.
pub const IPPROTO_ICMPV6: u8 = 58;
/// IPv6 "No Next Header".
pub const IPPROTO_NONE: u8 = 59;
/// IPv6 Destination Options header.
pub const IPPROTO_DSTOPTS: u8 = 60;
/// Protocol number reserved for experimentation (RFC 3692): the builder's default L4.
pub const IPPROTO_EXPERIMENT: u8 = 253;

/// Ethernet header without tags: two MACs and the EtherType.
pub const ETH_HLEN: usize = 14;
/// One VLAN tag: TPID and TCI.
pub const VLAN_HLEN: usize = 4;
/// IPv4 header without options.
pub const IPV4_HLEN: usize = 20;
/// IPv6 fixed header.
pub const IPV6_HLEN: usize = 40;
/// TCP header without options (the builder never adds options).
pub const TCP_HLEN: usize = 20;
/// UDP header.
pub const UDP_HLEN: usize = 8;
/// ICMP / ICMPv6 echo header (type, code, checksum, identifier, sequence).
pub const ICMP_ECHO_HLEN: usize = 8;
/// ARP body for Ethernet/IPv4.
pub const ARP_LEN: usize = 28;

/// Default source MAC (locally administered).
pub const DEFAULT_SRC_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
/// Default destination MAC (locally administered).
pub const DEFAULT_DST_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];
/// Broadcast MAC, the default destination of [`FrameBuilder::arp`].
pub const BROADCAST_MAC: [u8; 6] = [0xff; 6];

/// TTL / hop limit unless [`FrameBuilder::ttl`] says otherwise.
pub const DEFAULT_TTL: u8 = 64;
/// IPv4 Identification (and IPv6 fragment Identification) unless
/// [`FrameBuilder::ip_id`] says otherwise.
pub const DEFAULT_IP_ID: u16 = 0x1234;

/// TPIDs that [`l3_offset`] and the mutators treat as a VLAN tag to skip.
pub const VLAN_TPIDS: [u16; 3] = [ETH_P_8021Q, ETH_P_8021AD, ETH_P_QINQ1];

/// The payload byte at index `i`: `i` modulo 256, so a payload shows where it was cut.
pub fn pattern_byte(i: usize) -> u8 {
    (i % 256) as u8
}

/// An IPv6 extension header for [`FrameBuilder::ipv6_ext`].
///
/// Each variant has a fixed layout; [`Ipv6Ext::wire_len`] gives its size and
/// [`Ipv6Ext::protocol`] the Next Header value that announces it. The builder chains
/// Next Header values in the order the headers were pushed, the last one announcing the
/// L4 protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ipv6Ext {
    /// Hop-by-Hop Options (0): Hdr Ext Len 0, 8 bytes, one PadN option.
    HopByHop,
    /// Hop-by-Hop Options with Hdr Ext Len `n`: `(n + 1) * 8` bytes of padding options.
    HopByHopLen(u8),
    /// Routing (43): a Segment Routing Header (type 4) listing one segment, the IPv6
    /// destination, with Segments Left 0 (so the destination is final). Hdr Ext Len 2,
    /// 24 bytes.
    Routing,
    /// Fragment (44), 8 bytes: `offset` in 8-byte units (13 bits), `more` = M flag,
    /// Identification from [`FrameBuilder::ip_id`]. With `offset != 0` the frame is a
    /// non-first fragment: nothing after this header is laid out but the payload (no
    /// later extension header, no L4 header).
    Fragment {
        /// Fragment Offset, 8-byte units, at most 0x1fff.
        offset: u16,
        /// The M (more fragments) flag.
        more: bool,
    },
    /// Destination Options (60): Hdr Ext Len 0, 8 bytes, one PadN option.
    DestOpts,
    /// Destination Options with Hdr Ext Len `n`: `(n + 1) * 8` bytes of padding options.
    DestOptsLen(u8),
    /// Authentication Header (51): Payload Len 4, i.e. `(4 + 2) * 4` = 24 bytes: SPI,
    /// sequence number and a 12-byte ICV (zeros).
    Ah,
}

impl Ipv6Ext {
    /// The Next Header value that announces this header.
    pub fn protocol(self) -> u8 {
        match self {
            Ipv6Ext::HopByHop | Ipv6Ext::HopByHopLen(_) => IPPROTO_HOPOPTS,
            Ipv6Ext::Routing => IPPROTO_ROUTING,
            Ipv6Ext::Fragment { .. } => IPPROTO_FRAGMENT,
            Ipv6Ext::DestOpts | Ipv6Ext::DestOptsLen(_) => IPPROTO_DSTOPTS,
            Ipv6Ext::Ah => IPPROTO_AH,
        }
    }

    /// Size of the header on the wire, in bytes.
    pub fn wire_len(self) -> usize {
        match self {
            Ipv6Ext::HopByHop | Ipv6Ext::DestOpts => 8,
            Ipv6Ext::HopByHopLen(n) | Ipv6Ext::DestOptsLen(n) => (usize::from(n) + 1) * 8,
            Ipv6Ext::Routing => 24,
            Ipv6Ext::Fragment { .. } => 8,
            Ipv6Ext::Ah => 24,
        }
    }

    /// Appends the header, announcing `next` and using `dst` as the SRH segment.
    fn write(self, f: &mut Vec<u8>, next: u8, dst: &Ipv6Addr, id: u16) {
        match self {
            Ipv6Ext::HopByHop | Ipv6Ext::DestOpts => write_options(f, next, 0),
            Ipv6Ext::HopByHopLen(n) | Ipv6Ext::DestOptsLen(n) => write_options(f, next, n),
            Ipv6Ext::Routing => {
                // Next Header, Hdr Ext Len, Routing Type 4 (SRH), Segments Left,
                // Last Entry, Flags, Tag (2), then one 16-byte segment.
                f.extend_from_slice(&[next, 2, 4, 0, 0, 0, 0, 0]);
                f.extend_from_slice(&dst.octets());
            }
            Ipv6Ext::Fragment { offset, more } => {
                let word = ((offset & 0x1fff) << 3) | u16::from(more);
                f.extend_from_slice(&[next, 0]);
                put16(f, word);
                f.extend_from_slice(&u32::from(id).to_be_bytes());
            }
            Ipv6Ext::Ah => {
                f.extend_from_slice(&[next, 4, 0, 0]);
                f.extend_from_slice(&0x0000_0100_u32.to_be_bytes()); // SPI
                f.extend_from_slice(&1_u32.to_be_bytes()); // sequence number
                f.extend_from_slice(&[0; 12]); // ICV (HMAC-SHA1-96 sized)
            }
        }
    }
}

/// Appends a Hop-by-Hop / Destination Options header of Hdr Ext Len `len`, its option
/// area filled with PadN options (and one Pad1 where a single byte is left).
fn write_options(f: &mut Vec<u8>, next: u8, len: u8) {
    f.extend_from_slice(&[next, len]);
    let mut left = (usize::from(len) + 1) * 8 - 2;
    while left > 0 {
        if left == 1 {
            f.push(0); // Pad1
            left = 0;
        } else {
            let chunk = left.min(257);
            let data = chunk - 2;
            f.push(1); // PadN
            f.push(data as u8); // data <= 255 by the min above
            f.resize(f.len() + data, 0);
            left -= chunk;
        }
    }
}

/// The layer after Ethernet (and tags).
#[derive(Clone, Debug, PartialEq, Eq)]
enum L3 {
    Ipv4 { src: Ipv4Addr, dst: Ipv4Addr },
    Ipv6 { src: Ipv6Addr, dst: Ipv6Addr },
    Arp { spa: Ipv4Addr, tpa: Ipv4Addr },
    Raw { ethertype: u16, body: Vec<u8> },
}

impl L3 {
    fn ethertype(&self) -> u16 {
        match self {
            L3::Ipv4 { .. } => ETH_P_IP,
            L3::Ipv6 { .. } => ETH_P_IPV6,
            L3::Arp { .. } => ETH_P_ARP,
            L3::Raw { ethertype, .. } => *ethertype,
        }
    }
}

/// The transport layer of an IP frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum L4 {
    Tcp { sport: u16, dport: u16, flags: u8 },
    Udp { sport: u16, dport: u16 },
    IcmpEcho,
    Raw(u8),
}

impl L4 {
    /// The protocol number; ICMP depends on the IP version.
    fn protocol(self, v6: bool) -> u8 {
        match self {
            L4::Tcp { .. } => IPPROTO_TCP,
            L4::Udp { .. } => IPPROTO_UDP,
            L4::IcmpEcho if v6 => IPPROTO_ICMPV6,
            L4::IcmpEcho => IPPROTO_ICMP,
            L4::Raw(p) => p,
        }
    }

    /// Whether the builder lays out a header (and checksum) for it.
    fn has_header(self) -> bool {
        !matches!(self, L4::Raw(_))
    }

    /// Appends the header with zero length and checksum fields.
    fn write(self, f: &mut Vec<u8>, v6: bool) {
        match self {
            L4::Tcp {
                sport,
                dport,
                flags,
            } => {
                put16(f, sport);
                put16(f, dport);
                f.extend_from_slice(&1_u32.to_be_bytes()); // sequence number
                let ack = u32::from(flags & TCP_ACK != 0);
                f.extend_from_slice(&ack.to_be_bytes());
                f.push(((TCP_HLEN / 4) as u8) << 4); // data offset, no options
                f.push(flags);
                put16(f, 64240); // window
                put16(f, 0); // checksum
                put16(f, 0); // urgent pointer
            }
            L4::Udp { sport, dport } => {
                put16(f, sport);
                put16(f, dport);
                put16(f, 0); // length
                put16(f, 0); // checksum
            }
            L4::IcmpEcho => {
                f.push(if v6 { 128 } else { 8 }); // echo request
                f.push(0); // code
                put16(f, 0); // checksum
                put16(f, 1); // identifier
                put16(f, 1); // sequence
            }
            L4::Raw(_) => {}
        }
    }

    /// Fills length and checksum of the segment `seg` (header + payload), given the
    /// folded-or-not sum of the pseudo-header (0 for ICMPv4, which has none).
    fn finish(self, seg: &mut [u8], pseudo: u32) {
        match self {
            L4::Tcp { .. } => {
                let c = checksum(seg, pseudo);
                seg[16..18].copy_from_slice(&c.to_be_bytes());
            }
            L4::Udp { .. } => {
                let len = u16::try_from(seg.len()).unwrap_or(u16::MAX);
                seg[4..6].copy_from_slice(&len.to_be_bytes());
                let c = match checksum(seg, pseudo) {
                    0 => 0xffff, // RFC 768: a computed 0 is sent as all ones
                    c => c,
                };
                seg[6..8].copy_from_slice(&c.to_be_bytes());
            }
            L4::IcmpEcho => {
                let c = checksum(seg, pseudo);
                seg[2..4].copy_from_slice(&c.to_be_bytes());
            }
            L4::Raw(_) => {}
        }
    }
}

/// How much payload goes after the last header.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Payload {
    Len(usize),
    FrameLen(usize),
    Bytes(Vec<u8>),
}

/// Where the layers of a built frame start, as byte offsets from the first byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Offsets {
    /// The L3 header (IPv4, IPv6, ARP or the raw EtherType body), after all tags.
    pub l3: usize,
    /// The L4 header (TCP/UDP/ICMP), if the frame has one: `None` for non-IP frames,
    /// [`FrameBuilder::proto`] frames and non-first fragments.
    pub l4: Option<usize>,
    /// The payload: the first byte after the last header. Equals the frame length when
    /// the payload is empty.
    pub payload: usize,
}

/// Builds one Ethernet frame, layer by layer; see the [module docs](self).
///
/// Start from [`ipv4`](Self::ipv4), [`ipv6`](Self::ipv6), [`arp`](Self::arp) or
/// [`ethertype`](Self::ethertype), chain the options, then [`build`](Self::build). The
/// builder is a value: clone it to make variants of one template. Options that do not
/// apply to the frame's family (say [`ipv6_ext`](Self::ipv6_ext) on IPv4, or
/// [`tcp`](Self::tcp) on ARP) are ignored.
///
/// Defaults: MACs [`DEFAULT_SRC_MAC`] → [`DEFAULT_DST_MAC`] (ARP: → broadcast), no VLAN
/// tag, TTL/hop limit 64, IPv4 Identification 0x1234, no IPv4 flags, and for IP an
/// opaque L4 of protocol [`IPPROTO_EXPERIMENT`] (253) with an empty payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrameBuilder {
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
    /// (TPID, TCI), outermost first.
    tags: Vec<(u16, u16)>,
    l3: L3,
    l4: L4,
    payload: Payload,
    ttl: u8,
    ip_id: u16,
    ipv4_option_words: u8,
    ipv4_frag_offset: u16,
    ipv4_more_fragments: bool,
    ipv6_exts: Vec<Ipv6Ext>,
}

impl FrameBuilder {
    fn new(l3: L3) -> Self {
        FrameBuilder {
            src_mac: DEFAULT_SRC_MAC,
            dst_mac: DEFAULT_DST_MAC,
            tags: Vec::new(),
            l3,
            l4: L4::Raw(IPPROTO_EXPERIMENT),
            payload: Payload::Len(0),
            ttl: DEFAULT_TTL,
            ip_id: DEFAULT_IP_ID,
            ipv4_option_words: 0,
            ipv4_frag_offset: 0,
            ipv4_more_fragments: false,
            ipv6_exts: Vec::new(),
        }
    }

    /// An IPv4 frame from `src` to `dst` (EtherType 0x0800, 20-byte header).
    pub fn ipv4(src: Ipv4Addr, dst: Ipv4Addr) -> Self {
        Self::new(L3::Ipv4 { src, dst })
    }

    /// An IPv6 frame from `src` to `dst` (EtherType 0x86dd, 40-byte header).
    pub fn ipv6(src: Ipv6Addr, dst: Ipv6Addr) -> Self {
        Self::new(L3::Ipv6 { src, dst })
    }

    /// A real ARP request ("who has 198.18.0.2? tell 198.18.0.1"), broadcast, 42 bytes;
    /// the sender hardware address follows [`macs`](Self::macs).
    pub fn arp() -> Self {
        Self::arp_request(Ipv4Addr::new(198, 18, 0, 1), Ipv4Addr::new(198, 18, 0, 2))
    }

    /// An ARP request from sender address `spa` for target address `tpa`, broadcast.
    pub fn arp_request(spa: Ipv4Addr, tpa: Ipv4Addr) -> Self {
        let mut b = Self::new(L3::Arp { spa, tpa });
        b.dst_mac = BROADCAST_MAC;
        b
    }

    /// A frame of any EtherType (LLDP 0x88cc, a made-up one…) whose body is exactly
    /// `payload`. [`payload_len`](Self::payload_len) and [`frame_len`](Self::frame_len)
    /// append pattern bytes after it.
    pub fn ethertype(ethertype: u16, payload: &[u8]) -> Self {
        Self::new(L3::Raw {
            ethertype,
            body: payload.to_vec(),
        })
    }

    /// Sets the source and destination MACs.
    pub fn macs(mut self, src: [u8; 6], dst: [u8; 6]) -> Self {
        self.src_mac = src;
        self.dst_mac = dst;
        self
    }

    /// Pushes a VLAN tag with TPID `tpid` (0x8100, 0x88a8, or anything, to test how
    /// unknown TPIDs are handled) and VLAN ID `vid`, PCP and DEI 0. Tags are laid out in
    /// call order, outermost first: `.vlan(0x88a8, 100).vlan(0x8100, 10)` is QinQ.
    ///
    /// # Panics
    /// If `vid` does not fit 12 bits; use [`vlan_tci`](Self::vlan_tci) for a raw TCI.
    pub fn vlan(self, tpid: u16, vid: u16) -> Self {
        assert!(vid <= 0x0fff, "VLAN ID {vid} does not fit 12 bits");
        self.vlan_tci(tpid, vid)
    }

    /// Pushes a VLAN tag with a raw 16-bit TCI (PCP, DEI and VID as given).
    pub fn vlan_tci(mut self, tpid: u16, tci: u16) -> Self {
        self.tags.push((tpid, tci));
        self
    }

    /// TCP from `sport` to `dport` with `flags` (`TCP_SYN | TCP_ACK`…): a 20-byte header,
    /// sequence number 1, acknowledgement number 1 if `TCP_ACK` else 0, window 64240.
    pub fn tcp(mut self, sport: u16, dport: u16, flags: u8) -> Self {
        self.l4 = L4::Tcp {
            sport,
            dport,
            flags,
        };
        self
    }

    /// UDP from `sport` to `dport`.
    pub fn udp(mut self, sport: u16, dport: u16) -> Self {
        self.l4 = L4::Udp { sport, dport };
        self
    }

    /// An echo request: ICMP type 8 on IPv4, ICMPv6 type 128 on IPv6; identifier 1,
    /// sequence 1.
    pub fn icmp_echo(mut self) -> Self {
        self.l4 = L4::IcmpEcho;
        self
    }

    /// IP protocol (IPv6: last Next Header) `proto` with no L4 header: everything after
    /// the IP header(s) is payload. `proto(6)` makes a "TCP" packet without a TCP header.
    pub fn proto(mut self, proto: u8) -> Self {
        self.l4 = L4::Raw(proto);
        self
    }

    /// `n` payload bytes after the last header, filled with [`pattern_byte`]. Replaces
    /// an earlier [`frame_len`](Self::frame_len) or [`payload`](Self::payload).
    pub fn payload_len(mut self, n: usize) -> Self {
        self.payload = Payload::Len(n);
        self
    }

    /// Exactly these payload bytes after the last header. Replaces an earlier
    /// [`payload_len`](Self::payload_len) or [`frame_len`](Self::frame_len).
    pub fn payload(mut self, bytes: &[u8]) -> Self {
        self.payload = Payload::Bytes(bytes.to_vec());
        self
    }

    /// Pads the payload (pattern bytes) so the whole frame, destination MAC to last
    /// byte and no FCS, is `n` bytes: 60 or 64 for minimum-size tests, 1514, 9000…
    /// If the headers alone are longer than `n` the payload is empty and the frame is
    /// longer than `n` (it is never cut; truncate the built `Vec` to make a truncated
    /// frame). Replaces an earlier [`payload_len`](Self::payload_len) or
    /// [`payload`](Self::payload).
    pub fn frame_len(mut self, n: usize) -> Self {
        self.payload = Payload::FrameLen(n);
        self
    }

    /// IPv4 TTL or IPv6 hop limit.
    pub fn ttl(mut self, ttl: u8) -> Self {
        self.ttl = ttl;
        self
    }

    /// IPv4 Identification; also the IPv6 Fragment header's Identification.
    pub fn ip_id(mut self, id: u16) -> Self {
        self.ip_id = id;
        self
    }

    /// IPv4 options: `words` 32-bit words of NOP (0x01), so IHL = 5 + `words`.
    ///
    /// # Panics
    /// If `words > 10` (IHL is 4 bits); use [`set_ipv4_ihl`] on the built frame for an
    /// impossible IHL.
    pub fn ipv4_options(mut self, words: usize) -> Self {
        assert!(words <= 10, "{words} option words do not fit IHL");
        self.ipv4_option_words = words as u8;
        self
    }

    /// Makes the IPv4 packet a fragment: Fragment Offset `offset_8byte_units` (13 bits)
    /// and the MF flag. With a non-zero offset the packet is a non-first fragment: no L4
    /// header is laid out, only payload (the protocol field still names the L4). With
    /// offset 0 and `more_fragments` it is a first fragment: the L4 header is there, its
    /// checksum covering only this fragment's bytes.
    ///
    /// # Panics
    /// If `offset_8byte_units > 0x1fff`.
    pub fn ipv4_fragment(mut self, offset_8byte_units: u16, more_fragments: bool) -> Self {
        assert!(
            offset_8byte_units <= 0x1fff,
            "fragment offset {offset_8byte_units} does not fit 13 bits"
        );
        self.ipv4_frag_offset = offset_8byte_units;
        self.ipv4_more_fragments = more_fragments;
        self
    }

    /// Appends an IPv6 extension header after the ones pushed before; see [`Ipv6Ext`]
    /// for layouts. Next Header values are chained at build time.
    ///
    /// # Panics
    /// If a [`Ipv6Ext::Fragment`] offset does not fit 13 bits.
    pub fn ipv6_ext(mut self, ext: Ipv6Ext) -> Self {
        if let Ipv6Ext::Fragment { offset, .. } = ext {
            assert!(
                offset <= 0x1fff,
                "fragment offset {offset} does not fit 13 bits"
            );
        }
        self.ipv6_exts.push(ext);
        self
    }

    /// The frame's bytes, with every length field (IPv4 Total Length, IPv6 Payload
    /// Length, UDP Length) and checksum (IPv4 header; TCP, UDP, ICMPv6 with their
    /// pseudo-header; ICMP) computed. Lengths that overflow their 16-bit field are
    /// written as 0xffff.
    pub fn build(&self) -> Vec<u8> {
        self.build_with_offsets().0
    }

    /// The headers' size: the frame length with an empty payload.
    pub fn header_len(&self) -> usize {
        self.build_with_offsets().1.payload
    }

    /// [`build`](Self::build), plus where each layer starts.
    pub fn build_with_offsets(&self) -> (Vec<u8>, Offsets) {
        let mut f = Vec::with_capacity(128);
        f.extend_from_slice(&self.dst_mac);
        f.extend_from_slice(&self.src_mac);
        for &(tpid, tci) in &self.tags {
            put16(&mut f, tpid);
            put16(&mut f, tci);
        }
        put16(&mut f, self.l3.ethertype());
        let l3 = f.len();
        let (l4, payload) = match &self.l3 {
            L3::Raw { body, .. } => {
                f.extend_from_slice(body);
                (None, f.len())
            }
            L3::Arp { spa, tpa } => {
                put16(&mut f, 1); // hardware type: Ethernet
                put16(&mut f, ETH_P_IP); // protocol type
                f.extend_from_slice(&[6, 4]); // address lengths
                put16(&mut f, 1); // operation: request
                f.extend_from_slice(&self.src_mac);
                f.extend_from_slice(&spa.octets());
                f.extend_from_slice(&[0; 6]);
                f.extend_from_slice(&tpa.octets());
                (None, f.len())
            }
            L3::Ipv4 { src, dst } => return self.build_ipv4(f, l3, src, dst),
            L3::Ipv6 { src, dst } => return self.build_ipv6(f, l3, src, dst),
        };
        self.append_payload(&mut f);
        (f, Offsets { l3, l4, payload })
    }

    fn append_payload(&self, f: &mut Vec<u8>) {
        let n = match &self.payload {
            Payload::Bytes(bytes) => {
                f.extend_from_slice(bytes);
                return;
            }
            Payload::Len(n) => *n,
            Payload::FrameLen(n) => n.saturating_sub(f.len()),
        };
        f.extend((0..n).map(pattern_byte));
    }

    fn build_ipv4(
        &self,
        mut f: Vec<u8>,
        l3: usize,
        src: &Ipv4Addr,
        dst: &Ipv4Addr,
    ) -> (Vec<u8>, Offsets) {
        let hlen = IPV4_HLEN + 4 * usize::from(self.ipv4_option_words);
        let proto = self.l4.protocol(false);
        let frag = (self.ipv4_frag_offset & 0x1fff) | (u16::from(self.ipv4_more_fragments) << 13);
        f.push(0x40 | (hlen / 4) as u8);
        f.push(0); // TOS
        put16(&mut f, 0); // total length, below
        put16(&mut f, self.ip_id);
        put16(&mut f, frag);
        f.push(self.ttl);
        f.push(proto);
        put16(&mut f, 0); // checksum, below
        f.extend_from_slice(&src.octets());
        f.extend_from_slice(&dst.octets());
        f.resize(l3 + hlen, 1); // NOP options
        let l4 = (self.ipv4_frag_offset == 0 && self.l4.has_header()).then_some(f.len());
        if l4.is_some() {
            self.l4.write(&mut f, false);
        }
        let payload = f.len();
        self.append_payload(&mut f);

        let total = u16::try_from(f.len() - l3).unwrap_or(u16::MAX);
        f[l3 + 2..l3 + 4].copy_from_slice(&total.to_be_bytes());
        let c = checksum(&f[l3..l3 + hlen], 0);
        f[l3 + 10..l3 + 12].copy_from_slice(&c.to_be_bytes());
        if let Some(off) = l4 {
            let seg = &mut f[off..];
            let pseudo = match self.l4 {
                L4::IcmpEcho => 0,
                _ => pseudo_v4(src, dst, proto, seg.len()),
            };
            self.l4.finish(seg, pseudo);
        }
        (f, Offsets { l3, l4, payload })
    }

    fn build_ipv6(
        &self,
        mut f: Vec<u8>,
        l3: usize,
        src: &Ipv6Addr,
        dst: &Ipv6Addr,
    ) -> (Vec<u8>, Offsets) {
        let proto = self.l4.protocol(true);
        let exts = &self.ipv6_exts;
        let first = exts.first().map_or(proto, |e| e.protocol());
        f.extend_from_slice(&[0x60, 0, 0, 0]); // version, traffic class, flow label
        put16(&mut f, 0); // payload length, below
        f.push(first);
        f.push(self.ttl);
        f.extend_from_slice(&src.octets());
        f.extend_from_slice(&dst.octets());
        let mut non_first_fragment = false;
        for (i, ext) in exts.iter().enumerate() {
            let next = exts.get(i + 1).map_or(proto, |e| e.protocol());
            ext.write(&mut f, next, dst, self.ip_id);
            if matches!(ext, Ipv6Ext::Fragment { offset, .. } if *offset != 0) {
                non_first_fragment = true;
                break;
            }
        }
        let l4 = (!non_first_fragment && self.l4.has_header()).then_some(f.len());
        if l4.is_some() {
            self.l4.write(&mut f, true);
        }
        let payload = f.len();
        self.append_payload(&mut f);

        let plen = u16::try_from(f.len() - l3 - IPV6_HLEN).unwrap_or(u16::MAX);
        f[l3 + 4..l3 + 6].copy_from_slice(&plen.to_be_bytes());
        if let Some(off) = l4 {
            let seg = &mut f[off..];
            let pseudo = pseudo_v6(src, dst, proto, seg.len());
            self.l4.finish(seg, pseudo);
        }
        (f, Offsets { l3, l4, payload })
    }
}

fn put16(f: &mut Vec<u8>, v: u16) {
    f.extend_from_slice(&v.to_be_bytes());
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// Ones'-complement sum of `data` as big-endian 16-bit words (an odd last byte padded
/// with zero), added to `sum`, not folded.
fn sum_words(data: &[u8], mut sum: u32) -> u32 {
    let mut chunks = data.chunks_exact(2);
    for w in &mut chunks {
        sum += u32::from(u16::from_be_bytes([w[0], w[1]]));
        // Keep headroom: fold early on long (jumbo) inputs.
        if sum > 0xffff_0000 {
            sum = (sum & 0xffff) + (sum >> 16);
        }
    }
    if let [last] = chunks.remainder() {
        sum += u32::from(*last) << 8;
    }
    sum
}

/// Folds carries into the low 16 bits.
fn fold(mut sum: u32) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

/// The Internet checksum (RFC 1071) of `data` on top of a partial `sum` (a
/// pseudo-header's, or 0), with the checksum field inside `data` zeroed. Summing data
/// that already holds a correct checksum gives 0.
fn checksum(data: &[u8], sum: u32) -> u16 {
    !fold(sum_words(data, sum))
}

/// The Internet checksum (RFC 1071) of `data`: the ones' complement of the
/// ones'-complement sum of its 16-bit big-endian words, an odd last byte padded with a
/// zero. Over a header whose checksum field is correct it returns 0.
pub fn internet_checksum(data: &[u8]) -> u16 {
    checksum(data, 0)
}

fn pseudo_v4(src: &Ipv4Addr, dst: &Ipv4Addr, proto: u8, len: usize) -> u32 {
    let mut sum = sum_words(&src.octets(), 0);
    sum = sum_words(&dst.octets(), sum);
    sum += u32::from(proto);
    sum + u32::from(u16::try_from(len).unwrap_or(u16::MAX))
}

fn pseudo_v6(src: &Ipv6Addr, dst: &Ipv6Addr, proto: u8, len: usize) -> u32 {
    let mut sum = sum_words(&src.octets(), 0);
    sum = sum_words(&dst.octets(), sum);
    let len = u32::try_from(len).unwrap_or(u32::MAX);
    sum = sum_words(&len.to_be_bytes(), sum);
    sum + u32::from(proto)
}

/// RFC 1624 eqn. 3 incremental update: the checksum `check` after the 16-bit-aligned
/// bytes `old` of the covered data became `new` (same length, even).
fn checksum_update(check: u16, old: &[u8], new: &[u8]) -> u16 {
    let mut sum = u32::from(!check);
    for (o, n) in old.chunks_exact(2).zip(new.chunks_exact(2)) {
        sum += u32::from(!u16::from_be_bytes([o[0], o[1]]));
        sum += u32::from(u16::from_be_bytes([n[0], n[1]]));
    }
    !fold(sum)
}

/// Why a frame mutator could not do its job. Nothing is changed when one is returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameError {
    /// The frame ends before the header or field the function needs.
    Truncated,
    /// The EtherType after the VLAN tags is not IPv4 (0x0800).
    NotIpv4,
    /// The EtherType after the VLAN tags is not IPv6 (0x86dd).
    NotIpv6,
    /// The value does not fit its field.
    OutOfRange,
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FrameError::Truncated => "frame too short for the header",
            FrameError::NotIpv4 => "frame is not IPv4",
            FrameError::NotIpv6 => "frame is not IPv6",
            FrameError::OutOfRange => "value does not fit the field",
        })
    }
}

impl std::error::Error for FrameError {}

/// The EtherType after all VLAN tags ([`VLAN_TPIDS`]) and the offset of the header it
/// announces, or `None` if the frame ends first.
pub fn l3_ethertype(frame: &[u8]) -> Option<(u16, usize)> {
    let mut at = 12;
    loop {
        let ethertype = u16::from_be_bytes([*frame.get(at)?, *frame.get(at + 1)?]);
        if !VLAN_TPIDS.contains(&ethertype) {
            return Some((ethertype, at + 2));
        }
        at += VLAN_HLEN;
    }
}

/// The offset of the L3 (IP) header: after the Ethernet header and any number of VLAN
/// tags ([`VLAN_TPIDS`]). `None` if the frame ends inside the tags. Unlike the XDP
/// parser it has no tag limit: it says where L3 really is.
pub fn l3_offset(frame: &[u8]) -> Option<usize> {
    l3_ethertype(frame).map(|(_, at)| at)
}

/// The IPv4 header's offset, if the frame is IPv4 and holds at least 20 bytes of it.
fn ipv4_at(frame: &[u8]) -> Result<usize, FrameError> {
    let (ethertype, at) = l3_ethertype(frame).ok_or(FrameError::Truncated)?;
    if ethertype != ETH_P_IP {
        return Err(FrameError::NotIpv4);
    }
    if frame.len() < at + IPV4_HLEN {
        return Err(FrameError::Truncated);
    }
    Ok(at)
}

/// The IPv6 header's offset, if the frame is IPv6 and holds its 40 bytes.
fn ipv6_at(frame: &[u8]) -> Result<usize, FrameError> {
    let (ethertype, at) = l3_ethertype(frame).ok_or(FrameError::Truncated)?;
    if ethertype != ETH_P_IPV6 {
        return Err(FrameError::NotIpv6);
    }
    if frame.len() < at + IPV6_HLEN {
        return Err(FrameError::Truncated);
    }
    Ok(at)
}

/// Writes `new` at `frame[at..]` (an even-aligned field of the IPv4 header at `l3`) and
/// updates the header checksum incrementally.
fn ipv4_patch(frame: &mut [u8], l3: usize, at: usize, new: &[u8]) {
    let old = frame[at..at + new.len()].to_vec();
    frame[at..at + new.len()].copy_from_slice(new);
    let check = checksum_update(be16(frame, l3 + 10), &old, new);
    frame[l3 + 10..l3 + 12].copy_from_slice(&check.to_be_bytes());
}

/// Rewrites the IPv4 IHL (header length in 32-bit words, 0..=15) of the frame's IPv4
/// header, found after any VLAN tags; nothing else moves, so an IHL that does not match
/// the laid-out options makes the L4 header appear elsewhere. The header checksum is
/// updated incrementally (RFC 1624), so it stays correct over the header's original
/// length and the IHL is the only defect.
///
/// # Errors
/// [`FrameError::OutOfRange`] if `ihl > 15`; [`FrameError::NotIpv4`] or
/// [`FrameError::Truncated`] if there is no 20-byte IPv4 header.
pub fn set_ipv4_ihl(frame: &mut [u8], ihl: u8) -> Result<(), FrameError> {
    if ihl > 15 {
        return Err(FrameError::OutOfRange);
    }
    let l3 = ipv4_at(frame)?;
    let word = [(frame[l3] & 0xf0) | ihl, frame[l3 + 1]];
    ipv4_patch(frame, l3, l3, &word);
    Ok(())
}

/// Rewrites the IPv4 Total Length, say larger than the frame (truncated packet) or
/// smaller than the header. The header checksum is updated incrementally (RFC 1624), so
/// the length is the only defect.
///
/// # Errors
/// [`FrameError::NotIpv4`] or [`FrameError::Truncated`] if there is no 20-byte IPv4
/// header.
pub fn set_ipv4_total_len(frame: &mut [u8], len: u16) -> Result<(), FrameError> {
    let l3 = ipv4_at(frame)?;
    ipv4_patch(frame, l3, l3 + 2, &len.to_be_bytes());
    Ok(())
}

/// Overwrites the IPv4 header checksum with `check`, to make a frame with a bad one.
///
/// # Errors
/// [`FrameError::NotIpv4`] or [`FrameError::Truncated`] if there is no 20-byte IPv4
/// header.
pub fn set_ipv4_checksum(frame: &mut [u8], check: u16) -> Result<(), FrameError> {
    let l3 = ipv4_at(frame)?;
    frame[l3 + 10..l3 + 12].copy_from_slice(&check.to_be_bytes());
    Ok(())
}

/// Where the checksum of a pseudo-header-covered L4 segment sits, if there is one to
/// keep right: `(offset of the checksum field, is UDP)`.
fn l4_checksum_field(frame: &[u8], proto: u8, l4: usize) -> Option<(usize, bool)> {
    let (at, udp) = match proto {
        IPPROTO_TCP => (l4 + 16, false),
        IPPROTO_UDP => (l4 + 6, true),
        IPPROTO_ICMPV6 => (l4 + 2, false),
        _ => return None,
    };
    (at + 2 <= frame.len()).then_some((at, udp))
}

/// Updates the L4 checksum at `at` for pseudo-header bytes `old` → `new`. A UDP checksum
/// of 0 (none sent) stays 0, and a UDP result of 0 is written as 0xffff.
fn l4_patch(frame: &mut [u8], at: usize, udp: bool, old: &[u8], new: &[u8]) {
    let check = be16(frame, at);
    if udp && check == 0 {
        return;
    }
    let mut check = checksum_update(check, old, new);
    if udp && check == 0 {
        check = 0xffff;
    }
    frame[at..at + 2].copy_from_slice(&check.to_be_bytes());
}

/// Rewrites an IPv4 address field (`field` = 12 for source, 16 for destination) and
/// fixes the checksums incrementally.
fn with_ipv4_addr(frame: &mut [u8], field: usize, addr: Ipv4Addr) -> Result<(), FrameError> {
    let l3 = ipv4_at(frame)?;
    let at = l3 + field;
    let old = [frame[at], frame[at + 1], frame[at + 2], frame[at + 3]];
    let new = addr.octets();
    ipv4_patch(frame, l3, at, &new);
    let ihl = usize::from(frame[l3] & 0x0f);
    let non_first_fragment = be16(frame, l3 + 6) & 0x1fff != 0;
    let proto = frame[l3 + 9];
    if ihl < 5 || non_first_fragment || proto == IPPROTO_ICMPV6 {
        return Ok(());
    }
    if let Some((check, udp)) = l4_checksum_field(frame, proto, l3 + ihl * 4) {
        l4_patch(frame, check, udp, &old, &new);
    }
    Ok(())
}

/// Rewrites the IPv4 source address of a frame (after any VLAN tags) and fixes, with
/// RFC 1624 incremental updates, the IPv4 header checksum and the TCP or UDP checksum
/// (their pseudo-header holds the source). A traffic generator builds one template and
/// varies its source for the cost of a few additions.
///
/// The L4 checksum is left alone where there is none to fix: a non-first fragment,
/// ICMP or another protocol, a UDP checksum of 0 (not sent), an IHL below 5, or a frame
/// that ends before the checksum field.
///
/// # Errors
/// [`FrameError::NotIpv4`] or [`FrameError::Truncated`] if there is no 20-byte IPv4
/// header.
pub fn with_ipv4_src(frame: &mut [u8], src: Ipv4Addr) -> Result<(), FrameError> {
    with_ipv4_addr(frame, 12, src)
}

/// [`with_ipv4_src`] for the destination address.
///
/// # Errors
/// As [`with_ipv4_src`].
pub fn with_ipv4_dst(frame: &mut [u8], dst: Ipv4Addr) -> Result<(), FrameError> {
    with_ipv4_addr(frame, 16, dst)
}

/// Walks the IPv6 extension headers from the fixed header at `l3`: the upper-layer
/// protocol, its offset, and whether a routing header still has segments left (then
/// the pseudo-header's destination is not the IPv6 destination). `None` for a
/// non-first fragment or a chain cut short by the end of the frame.
fn ipv6_upper_layer(frame: &[u8], l3: usize) -> Option<(u8, usize, bool)> {
    let mut next = frame[l3 + 6];
    let mut at = l3 + IPV6_HLEN;
    let mut routing_pending = false;
    // Bounded: each step advances at least 8 bytes of a finite frame, and at most this
    // many steps are taken anyway.
    for _ in 0..64 {
        let (nh, len) = (*frame.get(at)?, usize::from(*frame.get(at + 1)?));
        match next {
            IPPROTO_HOPOPTS | IPPROTO_DSTOPTS => at += (len + 1) * 8,
            IPPROTO_ROUTING => {
                routing_pending |= *frame.get(at + 3)? != 0;
                at += (len + 1) * 8;
            }
            IPPROTO_AH => at += (len + 2) * 4,
            IPPROTO_FRAGMENT => {
                if u16::from_be_bytes([*frame.get(at + 2)?, *frame.get(at + 3)?]) >> 3 != 0 {
                    return None;
                }
                at += 8;
            }
            _ => return Some((next, at, routing_pending)),
        }
        next = nh;
    }
    None
}

/// Rewrites an IPv6 address field (`field` = 8 for source, 24 for destination) and
/// fixes the L4 checksum incrementally.
fn with_ipv6_addr(frame: &mut [u8], field: usize, addr: Ipv6Addr) -> Result<(), FrameError> {
    let l3 = ipv6_at(frame)?;
    let at = l3 + field;
    let mut old = [0; 16];
    old.copy_from_slice(&frame[at..at + 16]);
    let new = addr.octets();
    frame[at..at + 16].copy_from_slice(&new);
    let Some((proto, l4, routing_pending)) = ipv6_upper_layer(frame, l3) else {
        return Ok(());
    };
    if field == 24 && routing_pending {
        return Ok(());
    }
    if let Some((check, udp)) = l4_checksum_field(frame, proto, l4) {
        l4_patch(frame, check, udp, &old, &new);
    }
    Ok(())
}

/// Rewrites the IPv6 source address of a frame (after any VLAN tags) and fixes the TCP,
/// UDP or ICMPv6 checksum incrementally (RFC 1624) through the extension headers. IPv6
/// has no header checksum. The L4 checksum is left alone for a non-first fragment,
/// another protocol, a UDP checksum of 0, or a frame that ends before the checksum.
///
/// # Errors
/// [`FrameError::NotIpv6`] or [`FrameError::Truncated`] if there is no 40-byte IPv6
/// header.
pub fn with_ipv6_src(frame: &mut [u8], src: Ipv6Addr) -> Result<(), FrameError> {
    with_ipv6_addr(frame, 8, src)
}

/// [`with_ipv6_src`] for the destination address. The L4 checksum is also left alone
/// when a routing header has segments left (its pseudo-header uses the final
/// destination, which is in the routing header).
///
/// # Errors
/// As [`with_ipv6_src`].
pub fn with_ipv6_dst(frame: &mut [u8], dst: Ipv6Addr) -> Result<(), FrameError> {
    with_ipv6_addr(frame, 24, dst)
}

#[cfg(test)]
#[allow(
    clippy::unwrap_used,
    reason = "a test fails loudly on a frame it cannot read"
)]
mod tests;

/// The IP datagram of a frame built without VLAN tags (the frame less its Ethernet
/// header): what a tunnel carries.
pub fn ip_datagram(frame: &[u8]) -> &[u8] {
    frame.get(ETH_HLEN..).unwrap_or_default()
}

/// GRE's protocol type for IPv4 and IPv6 (ethertypes).
pub const GRE_IPV4: u16 = ETH_P_IP;
pub const GRE_IPV6: u16 = ETH_P_IPV6;

/// A GRE header (RFC 2784/2890) with `protocol`, version 0, and the optional checksum
/// (zero), key and sequence words when given.
pub fn gre_header(protocol: u16, checksum: bool, key: Option<u32>, seq: Option<u32>) -> Vec<u8> {
    let flags = (u16::from(checksum) << 15)
        | (u16::from(key.is_some()) << 13)
        | (u16::from(seq.is_some()) << 12);
    let mut h = Vec::new();
    put16(&mut h, flags);
    put16(&mut h, protocol);
    if checksum {
        h.extend_from_slice(&[0; 4]);
    }
    for word in [key, seq].into_iter().flatten() {
        h.extend_from_slice(&word.to_be_bytes());
    }
    h
}

/// A GUE version 0 header (draft-ietf-intarea-gue) for inner protocol `proto` (4: IPv4,
/// 41: IPv6), no options.
pub fn gue_header(proto: u8) -> Vec<u8> {
    vec![0, proto, 0, 0]
}
