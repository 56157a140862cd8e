//! Map keys and values shared by the XDP program and the daemon.
//!
//! Layout rules: `#[repr(C)]`, explicit padding fields, `u32` flags instead of `bool`.
//! Size assertions at the bottom of the file pin every layout; the daemon additionally
//! refuses pinned maps whose key/value sizes differ from these.

use crate::{clock::TickClock, gcra::Limit, share::ShareState};

/// Rule slots. A slot is stable for a rule name across reloads, so its bucket and
/// counters continue.
pub const MAX_RULES: u32 = 1024;
/// Rule-table generations: one live, one being built (see [`Control::generation`]).
pub const GENERATIONS: u32 = 2;
/// Prefix entries per address family per generation.
pub const MAX_PREFIXES: u32 = 16384;
/// Rules that can apply to one destination prefix (its own and every covering prefix).
pub const MAX_CANDIDATES: usize = 16;
/// Default capacity of the per-source bucket map (`max_sources`).
pub const DEFAULT_MAX_SOURCES: u32 = 1_048_576;

/// Map names: the ELF symbols of the XDP object and the file names under `pin_dir`.
pub mod map_name {
    pub const CONTROL: &str = "CONTROL";
    pub const RULES: &str = "RULES";
    pub const PREFIXES_V4_0: &str = "PREFIXES_V4_0";
    pub const PREFIXES_V4_1: &str = "PREFIXES_V4_1";
    pub const PREFIXES_V6_0: &str = "PREFIXES_V6_0";
    pub const PREFIXES_V6_1: &str = "PREFIXES_V6_1";
    pub const AGG_BUCKETS: &str = "AGG_BUCKETS";
    /// The per-source LRU of earlier versions: no longer created. An upgrade reads a
    /// pinned one once, to carry its sources' state into the sketch.
    pub const SRC_BUCKETS: &str = "SRC_BUCKETS";
    /// Per-source GCRA cells (limiter_common::sketch): `ROWS × width` TATs.
    pub const SRC_SKETCH: &str = "SRC_SKETCH";
    /// The sketch's seed and width (limiter_common::sketch::SketchMeta).
    pub const SKETCH_META: &str = "SKETCH_META";
    /// Per-CPU sketch counters (limiter_common::sketch::SketchCounters).
    pub const SKETCH_COUNTS: &str = "SKETCH_COUNTS";
    pub const RULE_COUNTERS: &str = "RULE_COUNTERS";
    pub const GLOBAL_COUNTERS: &str = "GLOBAL_COUNTERS";
    pub const HOSTS: &str = "HOSTS";
    pub const FRAGMENTS: &str = "FRAGMENTS";
    pub const HEADER_COUNTERS: &str = "HEADER_COUNTERS";
    pub const RULE_SYNS: &str = "RULE_SYNS";
    /// The tail-call handoff's settings ([`super::Handoff`]).
    pub const HANDOFF: &str = "HANDOFF";
    /// Frames passed because the next program was missing, per CPU.
    pub const HANDOFF_COUNTS: &str = "HANDOFF_COUNTS";
    /// The prog array the single-buffer build tail-calls into (or the LB's own array:
    /// the daemon points this name at its pin). A prog array belongs to one program type
    /// and one `xdp.frags` flag, hence one array per XDP build.
    pub const HANDOFF_LINEAR: &str = "HANDOFF_LINEAR";
    /// The same for the multi-buffer (`xdp.frags`) build.
    pub const HANDOFF_MULTI: &str = "HANDOFF_MULTI";
    /// Encapsulations decapsulated per interface ([`super::TunnelConfig`], by ifindex).
    pub const TUNNELS: &str = "TUNNELS";
    /// Tunnelled frames, per CPU ([`super::TunnelCounters`]).
    pub const TUNNEL_COUNTS: &str = "TUNNEL_COUNTS";
    /// Refusals by rule slot and reason, per CPU ([`crate::drop::ReasonCounters`]; one
    /// more entry, [`crate::drop::NO_RULE`], for refusals no rule decides).
    pub const DROP_REASONS: &str = "DROP_REASONS";
    /// Sampled refusals ([`crate::drop::DropEvent`]), a BPF ring buffer.
    pub const DROP_EVENTS: &str = "DROP_EVENTS";
    /// The sampling budget ([`crate::drop::MonitorConfig`]), written by the daemon.
    pub const MONITOR: &str = "MONITOR";
    /// Sampling counters, per CPU ([`crate::drop::MonitorCounters`]).
    pub const MONITOR_COUNTS: &str = "MONITOR_COUNTS";
    /// The program's own per-CPU sampling state ([`crate::drop::MonitorState`]): this
    /// second's budget, and the refusal the current run stashed for its event.
    pub const MONITOR_STATE: &str = "MONITOR_STATE";

    /// Every map the program owns, in a stable order: the rows of the table of maps
    /// ([`crate::maps::MAPS`]), in this order.
    pub const ALL: [&str; 27] = [
        CONTROL,
        RULES,
        PREFIXES_V4_0,
        PREFIXES_V4_1,
        PREFIXES_V6_0,
        PREFIXES_V6_1,
        AGG_BUCKETS,
        SRC_SKETCH,
        SKETCH_META,
        SKETCH_COUNTS,
        RULE_COUNTERS,
        GLOBAL_COUNTERS,
        HOSTS,
        FRAGMENTS,
        HEADER_COUNTERS,
        RULE_SYNS,
        HANDOFF,
        HANDOFF_COUNTS,
        HANDOFF_LINEAR,
        HANDOFF_MULTI,
        TUNNELS,
        TUNNEL_COUNTS,
        DROP_REASONS,
        DROP_EVENTS,
        MONITOR,
        MONITOR_COUNTS,
        MONITOR_STATE,
    ];
}

/// Name of the multi-buffer-aware (`xdp.frags`) build of the XDP program in the object.
pub const PROGRAM_NAME: &str = "limiter";
/// Name of the single-buffer build of the same program (no `frags`: the frame length is
/// the linear length, no helper call).
pub const PROGRAM_NAME_LINEAR: &str = "limiter_linear";
/// Name of the single-buffer build as a libxdp dispatcher component (`xdp_share =
/// "libxdp"`; at most 15 bytes, the kernel's limit for program names).
pub const PROGRAM_NAME_LIBXDP: &str = "limiter_libxdp";
/// Name of the TC-ingress build (`xdp_mode = "tc"`).
pub const PROGRAM_NAME_TC: &str = "limiter_tc";

/// The single entry of `CONTROL`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Control {
    /// Live rule-table generation (0 or 1). The daemon fills the other one, then flips
    /// this word: a packet reads it once, so it never sees half a rule set.
    pub generation: u32,
    /// `CONTROL_*` bits.
    pub flags: u32,
}

/// Kill switch: pass every frame without classifying or counting it.
pub const CONTROL_BYPASS: u32 = 1 << 0;
/// Some interface decapsulates (`TUNNELS` has entries): only then does a frame whose
/// outer header could be a tunnel cost a lookup of its interface.
pub const CONTROL_TUNNELS: u32 = 1 << 1;
/// Never set. The program reads it as a zero the verifier cannot know, to make where the
/// inner IP header starts a value the verifier does not track: the paths through the
/// Ethernet, VLAN and tunnel headers then meet in one state before the L3 parser instead
/// of each verifying it again.
pub const CONTROL_NEVER_SET: u32 = 1 << 31;

/// Interfaces with an entry in `TUNNELS` at most.
pub const MAX_TUNNEL_INTERFACES: u32 = 64;
/// UDP ports (FOU or GUE) one interface decapsulates at most.
pub const MAX_TUNNEL_UDP_PORTS: usize = 4;
/// `TunnelConfig::flags`: IPv4 in IP (protocol 4), in IPv4 or IPv6.
pub const TUNNEL_IPIP: u32 = 1 << 0;
/// IPv6 in IP (protocol 41): 6in4 and IPv6 in IPv6.
pub const TUNNEL_IP6: u32 = 1 << 1;
/// GRE (protocol 47) carrying IPv4 or IPv6, version 0, with or without checksum, key and
/// sequence number.
pub const TUNNEL_GRE: u32 = 1 << 2;

/// What one interface decapsulates (`TUNNELS`, keyed by ifindex). A frame arriving on
/// an interface without an entry is classified by its outer header.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TunnelConfig {
    /// `TUNNEL_*` bits.
    pub flags: u32,
    /// Bit `i`: `udp_ports[i]` carries GUE (a GUE header, version 0 or 1); clear: FOU
    /// (the inner IP header right after the UDP header).
    pub gue_ports: u32,
    /// UDP destination ports that carry a tunnel, host order; 0: unused.
    pub udp_ports: [u16; MAX_TUNNEL_UDP_PORTS],
}

/// Most consecutive slots of a handoff array the program tries, in order, for a frame
/// it passes (Katran's root tries its slots the same way). Each try is one
/// `bpf_tail_call`; a try that finds its slot empty costs a few instructions.
pub const MAX_HANDOFF_SLOTS: u32 = 4;

/// The single entry of `HANDOFF`: where a frame the XDP builds pass goes next. The TC
/// build never reads it (a tail call into an XDP program from TC is refused).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Handoff {
    /// First slot of the handoff array to try.
    pub first: u32,
    /// How many consecutive slots to try from `first` (at most [`MAX_HANDOFF_SLOTS`]);
    /// 0: no handoff, frames the limiter passes go to the stack (today's behaviour).
    pub slots: u32,
}

/// `HANDOFF_COUNTS[0]`, one copy per CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HandoffCounters {
    /// Frames the limiter passed whose handoff found no program in any slot it tried
    /// (removed, not yet installed, or of an incompatible build): passed to the stack
    /// (fail open). A frame handed over is not counted: a tail call does not return.
    pub missing: u64,
}

impl HandoffCounters {
    pub fn accumulate(&mut self, other: &HandoffCounters) {
        self.missing = self.missing.wrapping_add(other.missing);
    }
}

/// `RULES` holds `GENERATIONS * MAX_RULES` entries; this is the index of a slot in a
/// generation.
#[inline(always)]
pub const fn rule_index(generation: u32, slot: u32) -> u32 {
    (generation & 1) * MAX_RULES + slot
}

/// Unit in which a rule meters traffic.
pub const UNIT_PACKETS: u32 = 0;
/// Frame length as seen by XDP, L2 header included.
pub const UNIT_BYTES: u32 = 1;
/// TCP SYN without ACK; other packets of the rule pass unmetered.
pub const UNIT_SYN: u32 = 2;

/// The slot holds a rule.
pub const RULE_IN_USE: u32 = 1 << 0;
/// Pass everything, count what enforce mode would drop.
pub const RULE_SHADOW: u32 = 1 << 1;
/// `aggregate` is a limit (else the rule has no aggregate limit).
pub const RULE_HAS_AGGREGATE: u32 = 1 << 2;
/// `per_source` is a limit.
pub const RULE_HAS_PER_SOURCE: u32 = 1 << 3;
/// fail_mode = "static": keep the last share for the whole allocator outage.
pub const RULE_FAIL_STATIC: u32 = 1 << 4;
/// A fleet share of zero: nothing passes until `lease_expires_ns`. After it (the lease
/// lapsed: the allocator, or this host's daemon, is gone) `aggregate` applies, which the
/// daemon sets to the bootstrap share (quota ÷ fleet_size, burst 1): the host then runs as
/// one joining the rule mid-outage (docs/design.md, "Fleet state machine"), on the kernel's clock, daemon or no daemon.
/// FAIL_OPEN still overrides it on its deadline.
pub const RULE_CLOSED_UNTIL_LAPSE: u32 = 1 << 5;
/// Every limit of the rule may be metered on the per-tick cached clock
/// ([`RuleConfig::tick_clock_ok`], set by the daemon when it compiles the rule). Without
/// it the program reads the precise clock: the safe default, never the wrong one.
pub const RULE_TICK_CLOCK: u32 = 1 << 6;
/// The rule's part of the per-source sketch is saturated: a flood has exhausted so many of
/// its cells that honest sources under their limit are refused (the daemon's estimate,
/// limiter-user's `saturation`). A record for readers (`stats`, `explain`); the program
/// does not read it.
pub const RULE_SOURCES_SATURATED: u32 = 1 << 7;
/// The per-source limit stands aside: a frame it refuses is not refused for that, and goes
/// on to the aggregate limit. Set by the daemon while the rule is saturated and its
/// `on_saturation` is "stand-aside". A refused frame charges no cell either way, so the
/// cells evolve as they do when the limit enforces.
pub const RULE_SOURCES_ASIDE: u32 = 1 << 8;
/// The rule enforces for a fraction of its sources only (`enforce_percent` below 100):
/// a refused frame of a source outside the canary ([`crate::canary`], by
/// `canary_threshold`) passes and is counted as a would-drop, as in shadow mode.
pub const RULE_CANARY: u32 = 1 << 9;

/// Bytes of a rule name kept in the map (NUL padded); config validation enforces it.
pub const RULE_NAME_LEN: usize = 64;

/// One rule of one generation (`RULES[rule_index(gen, slot)]`).
///
/// Everything a frame reads sits in the first 64 bytes, and entries are 192 bytes in a
/// page-aligned (`BPF_F_MMAPABLE`) array: metering a frame touches one cache line of
/// its rule, not two or three (the fields used for display follow).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RuleConfig {
    /// `RULE_*` bits.
    pub flags: u32,
    /// `UNIT_*`.
    pub unit: u32,
    /// Aggregate limit (valid when `RULE_HAS_AGGREGATE`).
    pub aggregate: Limit,
    /// Per-source limit (valid when `RULE_HAS_PER_SOURCE`).
    pub per_source: Limit,
    /// Source prefix length that keys a per-source bucket, IPv4 (0..=32).
    pub source_prefix_v4: u32,
    /// Source prefix length that keys a per-source bucket, IPv6 (0..=128).
    pub source_prefix_v6: u32,
    /// CLOCK_MONOTONIC ns after which the lease has lapsed (STICKY); 0 = no lease.
    pub lease_expires_ns: u64,
    /// CLOCK_MONOTONIC ns after which a fail_mode=open rule passes everything
    /// (FAIL_OPEN); 0 = never.
    pub fail_open_at_ns: u64,
    /// [`ShareState`] as last written by the daemon (standalone rules: `Standalone`, and
    /// their deadlines are zero).
    pub share_state: u32,
    /// The rule's part of the per-source sketch (limiter_common::sketch::region); 0: every
    /// cell. In the second cache line: read only by frames of per-source rules.
    pub sketch_region: u32,
    /// Configured aggregate rate and burst, in units per second / units (for display).
    pub rate: u64,
    pub burst: u64,
    /// Configured per-source rate and burst (for display).
    pub source_rate: u64,
    pub source_burst: u64,
    /// Rule name, UTF-8, NUL padded.
    pub name: [u8; RULE_NAME_LEN],
    /// With [`RULE_CANARY`]: a source is enforced when its canary point is below this
    /// (`crate::canary::threshold`, 0..=2^32). In the third cache line: read only on
    /// the refusal path.
    pub canary_threshold: u64,
    /// Pads the entry to three cache lines (no implicit padding: the type is `Pod`).
    pub _pad: [u8; 16],
}

impl RuleConfig {
    /// Whether each of the rule's limits may be metered on the per-tick cached clock
    /// (limiter_common::clock): the condition for [`RULE_TICK_CLOCK`].
    pub const fn tick_clock_ok(&self) -> bool {
        (self.flags & RULE_HAS_AGGREGATE == 0 || self.aggregate.tick_clock_ok())
            && (self.flags & RULE_HAS_PER_SOURCE == 0 || self.per_source.tick_clock_ok())
    }

    pub const EMPTY: RuleConfig = RuleConfig {
        flags: 0,
        unit: UNIT_PACKETS,
        aggregate: Limit::NONE,
        per_source: Limit::NONE,
        source_prefix_v4: 32,
        source_prefix_v6: 128,
        lease_expires_ns: 0,
        fail_open_at_ns: 0,
        share_state: ShareState::Standalone as u32,
        sketch_region: 0,
        rate: 0,
        burst: 0,
        source_rate: 0,
        source_burst: 0,
        name: [0; RULE_NAME_LEN],
        canary_threshold: 0,
        _pad: [0; 16],
    };

    /// The rule name up to the first NUL (lossy: the daemon only writes UTF-8).
    pub fn name_bytes(&self) -> &[u8] {
        let end = self
            .name
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(RULE_NAME_LEN);
        &self.name[..end]
    }
}

impl Default for RuleConfig {
    fn default() -> Self {
        Self::EMPTY
    }
}

/// The candidate's destination port must equal the packet's.
pub const MATCH_PORT: u8 = 1 << 0;
/// The candidate's protocol must equal the packet's.
pub const MATCH_PROTO: u8 = 1 << 1;

/// Protocol numbers the classifier matches on. `icmp` rules match ICMP in IPv4 and
/// ICMPv6 in IPv6: the compiler writes the family's number into the candidate.
pub const IPPROTO_ICMP: u8 = 1;
pub const IPPROTO_TCP: u8 = 6;
pub const IPPROTO_UDP: u8 = 17;
pub const IPPROTO_ICMPV6: u8 = 58;

/// One rule that may apply to addresses under a prefix.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Candidate {
    /// Rule slot.
    pub slot: u16,
    /// Destination port, host byte order (valid with `MATCH_PORT`).
    pub port: u16,
    /// IP protocol number (valid with `MATCH_PROTO`).
    pub proto: u8,
    /// `MATCH_*` bits.
    pub match_flags: u8,
    pub _pad: u16,
}

impl Candidate {
    /// The candidate asks for a destination port ([`MATCH_PORT`]).
    #[inline(always)]
    pub const fn wants_port(&self) -> bool {
        self.match_flags & MATCH_PORT != 0
    }

    /// The candidate asks for an IP protocol ([`MATCH_PROTO`]).
    #[inline(always)]
    pub const fn wants_proto(&self) -> bool {
        self.match_flags & MATCH_PROTO != 0
    }

    /// Whether a packet to destination port `port` (`None`: the packet shows no port,
    /// e.g. ICMP or a later fragment) with IP protocol `proto` fits the candidate. The
    /// one definition of a match: the XDP program's classifier and the daemon's
    /// (`explain`, the reference classifier) both call it. "No port" never equals a port.
    #[inline(always)]
    pub const fn matches(&self, port: Option<u16>, proto: u8) -> bool {
        (!self.wants_port() || matches!(port, Some(p) if self.port == p))
            && (!self.wants_proto() || self.proto == proto)
    }
}

/// Value of a prefix-table (LPM trie) entry: every rule whose destination prefix covers
/// this prefix, most specific first (longest prefix, then exact port, then exact
/// protocol). The program takes the first candidate that matches the packet, so the
/// longest-prefix lookup plus one ordered scan implements "most specific wins".
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefixRules {
    pub count: u32,
    pub candidates: [Candidate; MAX_CANDIDATES],
}

/// Slots per generation of the exact-address table (`HOSTS`): a power of two, at least
/// four times [`MAX_RULES`] (a rule has one destination), so probe chains stay short.
pub const HOST_SLOTS: u32 = 4096;
/// Slots a lookup in `HOSTS` tries from an address's home slot before it gives up. The
/// daemon places an address only within these; one it cannot place (never seen short of
/// crafted collisions) lives in the prefix tries alone, which every miss consults.
pub const HOST_PROBES: u32 = 8;

/// One slot of the exact-address table: a destination that is itself a rule prefix
/// (/32, /128) and the same candidates its prefix-trie entry holds. The program looks a
/// destination up here first, with inlined array reads instead of the trie's helper call
/// and walk (≈ 10 ns); a miss falls through to the trie.
///
/// Entries are 192 bytes in a page-aligned (`BPF_F_MMAPABLE`) array, so a probe reads one
/// cache line: the address, the candidate count and the first five candidates.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostEntry {
    /// 4 or 6; 0 = an empty slot (ends a probe chain).
    pub family: u32,
    /// Network byte order; IPv4 uses the first 4 bytes, the rest zero.
    pub addr: [u8; 16],
    pub rules: PrefixRules,
    /// Pads the entry to three cache lines (no implicit padding: the type is `Pod`).
    pub _pad: [u32; 10],
}

/// An address as the XDP program holds it: its four 32-bit words in network byte order,
/// each as a native-endian load of those bytes reads it (one load per word, no byte
/// shuffling). IPv4 uses the first word, the rest zero.
pub type AddrWords = [u32; 4];

/// The words of a 16-byte address (network order; IPv4 in the first 4 bytes).
#[inline(always)]
pub fn addr_words(addr: &[u8; 16]) -> AddrWords {
    let w = |i: usize| u32::from_ne_bytes([addr[i], addr[i + 1], addr[i + 2], addr[i + 3]]);
    [w(0), w(4), w(8), w(12)]
}

/// The 16 bytes of an address held as words (the inverse of [`addr_words`]).
#[inline(always)]
pub fn addr_bytes(words: &AddrWords) -> [u8; 16] {
    // SAFETY: [u32; 4] and [u8; 16] have the same size; every bit pattern is valid.
    unsafe { core::mem::transmute::<AddrWords, [u8; 16]>(*words) }
}

/// Home slot (0..HOST_SLOTS) of a destination in the exact-address table. A
/// multiplicative hash over the address words: cheap in the kernel, and the daemon
/// places entries with this same function. Native byte order (no swaps in the kernel):
/// the daemon and the program always run on the same machine.
#[inline(always)]
pub fn host_home(family: u32, addr: &[u8; 16]) -> u32 {
    host_home_words(family, &addr_words(addr))
}

/// [`host_home`] of an address held as words (what the XDP program computes).
#[inline(always)]
pub fn host_home_words(family: u32, w: &AddrWords) -> u32 {
    let folded = if family == 4 {
        w[0]
    } else {
        w[0] ^ w[1].rotate_left(8) ^ w[2].rotate_left(16) ^ w[3].rotate_left(24)
    };
    (folded ^ family).wrapping_mul(0x9E37_79B1) >> (32 - HOST_SLOTS.trailing_zeros())
}

/// `HOSTS` index of the `probe`-th slot tried for a destination whose home is `home`.
#[inline(always)]
pub const fn host_index(generation: u32, home: u32, probe: u32) -> u32 {
    (generation & 1) * HOST_SLOTS + ((home + probe) & (HOST_SLOTS - 1))
}

/// GCRA state: theoretical arrival time in ticks (see [`crate::gcra`]), updated by CAS.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bucket {
    pub tat: u64,
}

/// A rule's aggregate bucket (`AGG_BUCKETS[slot]`): one cache line each, in a page-aligned
/// (`BPF_F_MMAPABLE`) array, so CPUs admitting frames of different rules never write the
/// same line (eight 8-byte buckets to a line bounced it between them).
///
/// `credit` is the fleet's credit (the allocator's `RuleGrant.credit`, in the rule's
/// unit): what the rule may admit beyond its bucket, spent by compare-and-swap only on
/// frames the bucket refuses, only while the share's lease holds. The daemon replaces it
/// on each grant through the array's shared mapping, so it never writes the TAT's word.
/// It took the first word of the padding: a pinned array of an earlier build has the
/// same size and reads as no credit.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AggBucket {
    pub bucket: Bucket,
    pub credit: u64,
    pub _pad: [u64; 6],
}

/// Byte offsets of [`AggBucket`]'s atomically updated words (the daemon's mapping).
pub const AGG_BUCKET_TAT_OFFSET: usize = core::mem::offset_of!(AggBucket, bucket);
pub const AGG_BUCKET_CREDIT_OFFSET: usize = core::mem::offset_of!(AggBucket, credit);
const _: () = assert!(core::mem::size_of::<AggBucket>() == 64);

impl AggBucket {
    pub const fn new(tat: u64) -> AggBucket {
        AggBucket {
            bucket: Bucket { tat },
            credit: 0,
            _pad: [0; 6],
        }
    }
}

/// Key of a per-source bucket: the rule slot and the masked source address.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SourceKey {
    pub slot: u32,
    /// 4 or 6.
    pub family: u32,
    /// Masked source address, network byte order; IPv4 uses the first 4 bytes.
    pub addr: [u8; 16],
}

impl SourceKey {
    /// The bucket key of a source: the rule slot plus the source address (network order,
    /// IPv4 in the first 4 bytes) masked to the rule's prefix length for its family.
    /// `limiter explain` builds keys with this, the XDP program with [`Self::masked_words`].
    pub fn masked(
        slot: u32,
        family: u32,
        src: &[u8; 16],
        prefix_v4: u32,
        prefix_v6: u32,
    ) -> SourceKey {
        Self::masked_words(slot, family, &addr_words(src), prefix_v4, prefix_v6)
    }

    /// [`Self::masked`] of a source held as words.
    #[inline(always)]
    pub fn masked_words(
        slot: u32,
        family: u32,
        src: &AddrWords,
        prefix_v4: u32,
        prefix_v6: u32,
    ) -> SourceKey {
        SourceKey {
            slot,
            family,
            addr: addr_bytes(&masked_source(family, src, prefix_v4, prefix_v6)),
        }
    }
}

/// A source address (words, network order) masked to the prefix length for its family:
/// what a rule's per-source bucket and its canary key on.
#[inline(always)]
pub fn masked_source(family: u32, src: &AddrWords, prefix_v4: u32, prefix_v6: u32) -> AddrWords {
    let (prefix, words) = if family == 4 {
        (prefix_v4, 1)
    } else {
        (prefix_v6, 4)
    };
    // Every word is computed (zero past the family's address): an array zeroed first
    // and then filled compiles to a `memset` call in the XDP program.
    let mut masked = [0u32; 4];
    for (w, out) in masked.iter_mut().enumerate() {
        let bits_before = (w * 32) as u32;
        let mask: u32 = if w >= words || prefix <= bits_before {
            0
        } else if prefix >= bits_before + 32 {
            u32::MAX
        } else {
            u32::MAX << (32 - (prefix - bits_before))
        };
        // The word holds network order as a native load reads it: the network-order
        // mask in the same representation is `mask.to_be()`.
        *out = src[w] & mask.to_be();
    }
    masked
}

/// What each CPU keeps per rule (`RULE_COUNTERS`, a per-CPU array by slot): the rule's
/// counters and the CPU's cached clock for it. One per-CPU lookup serves both (each map
/// lookup costs spills and reloads around it in the program).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RuleCpuState {
    pub counters: RuleCounters,
    /// This CPU's cached CLOCK_MONOTONIC reading for this rule (limiter_common::clock),
    /// refreshed at its first frame of each jiffy; not a counter.
    pub clock: TickClock,
}

/// Defines a struct of `u64` counters, one copy per CPU in its map, from one list of
/// fields: `accumulate` (adds another CPU's copy), `since` (the change from an earlier
/// reading) and `named` (each field with its name, in order: what `limiter stats`,
/// `limiter top` and the tests list). Both wrap, as the kernel's increments do.
///
/// A field written `pub field: u64 as "name"` is named `name` where users see it (`named`,
/// `stats --json`): a counter renamed in the code keeps the name operators rely on.
macro_rules! counters {
    (@external $field:ident) => { stringify!($field) };
    (@external $field:ident $external:literal) => { $external };
    ($(#[$meta:meta])* pub struct $name:ident {
        $($(#[$fmeta:meta])* pub $field:ident: u64 $(as $external:literal)?,)+
    }) => {
        $(#[$meta])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        #[cfg_attr(feature = "user", derive(serde::Serialize))]
        pub struct $name {
            $(
                $(#[$fmeta])*
                $(#[cfg_attr(feature = "user", serde(rename = $external))])?
                pub $field: u64,
            )+
        }

        impl $name {
            /// How many counters there are.
            pub const COUNT: usize = [$(stringify!($field)),+].len();

            /// Adds another CPU's copy.
            pub fn accumulate(&mut self, other: &$name) {
                $(self.$field = self.$field.wrapping_add(other.$field);)+
            }

            /// What each counter gained since `before`.
            pub fn since(&self, before: &$name) -> $name {
                $name {
                    $($field: self.$field.wrapping_sub(before.$field),)+
                }
            }

            /// Each counter with its field name, in declaration order.
            pub fn named(&self) -> [(&'static str, u64); $name::COUNT] {
                [$((counters!(@external $field $($external)?), self.$field)),+]
            }
        }
    };
}

counters! {
    /// Per-rule counters (one copy per CPU in [`RuleCpuState`]).
    pub struct RuleCounters {
        pub passed_packets: u64,
        pub passed_bytes: u64,
        pub dropped_packets: u64,
        pub dropped_bytes: u64,
        pub would_drop_packets: u64,
        pub would_drop_bytes: u64,
        /// Of the frames above, those refused before the aggregate bucket: by the
        /// per-source limit, or refused unmetered (a frame that could carry a datagram
        /// past the rule); in shadow mode too. They are no demand for the rule's share (a
        /// spoofed flood refused per source must not win a host quota). A syn rule counts
        /// only SYNs here (its unmetered refusals are no SYNs it counted as offered).
        pub refused_early_packets: u64,
        pub refused_early_bytes: u64,
    }
}

/// SYNs a `unit = "syn"` rule metered (`RULE_SYNS`, a per-CPU array by slot): the rule's
/// offered load in its unit, which a fleet host reports as demand. The rule's
/// `passed_packets` cannot tell it: a syn rule passes its other packets unmetered and
/// counts them as passed. Only a SYN meeting a syn rule touches this map, so no other
/// frame pays for it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SynCounters {
    /// SYNs offered to the rule's limits (passed, dropped or would-drop alike).
    pub offered: u64,
}

counters! {
    /// Program-wide counters, one copy per CPU (`GLOBAL_COUNTERS[0]`).
    pub struct GlobalCounters {
        /// Frames the parser could not read (passed).
        pub malformed: u64,
        /// Frames that are not IPv4/IPv6 (passed).
        pub non_ip: u64,
        /// IP frames no rule matched (passed).
        pub unmatched: u64,
        /// Frames a per-source limit could not meter because the sketch was not set up
        /// yet (no seed written); metered by the aggregate only. Shown as
        /// `insert_failures`, the name it had when an LRU's inserts could fail (`stats`,
        /// and `limiter_source_insert_failed_packets_total`).
        pub sketch_unseeded: u64 as "insert_failures",
        /// Bucket updates that lost the CAS race too often and were passed.
        pub contended: u64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `named` (what `limiter stats` and `limiter top` list) gives a counter renamed in
    /// the code the name users see; the others keep their field's.
    #[test]
    fn counters_are_named_as_users_see_them() {
        let names = GlobalCounters::default().named().map(|(name, _)| name);
        assert_eq!(
            names,
            [
                "malformed",
                "non_ip",
                "unmatched",
                "insert_failures",
                "contended"
            ]
        );
    }

    /// The kernel keeps 15 bytes of a map's name, and pins are recognised as the
    /// limiter's by their map's name: a longer name would never match.
    #[test]
    fn map_names_fit_the_kernels_name_field() {
        for name in map_name::ALL {
            assert!(name.len() <= 15, "{name} is longer than 15 bytes");
        }
    }

    proptest::proptest! {
        /// A record is fresh for at least the destination's reassembly timeout after its
        /// stamp (30 s IPv4, 60 s IPv6: Linux's defaults), and stale once two clock units
        /// more have passed, until the clock wraps.
        #[test]
        fn a_record_outlives_the_reassembly_timeout_then_goes_stale(
            start in 0u64..1 << 62,
            elapsed in 0u64..19 * 3_600_000_000_000,
            v6 in proptest::bool::ANY,
        ) {
            let (family, timeout_ns) = if v6 { (6, 60_000_000_000) } else { (4, 30_000_000_000) };
            let fresh = fragment_record_fresh(
                family,
                fragment_clock(start),
                fragment_clock(start + elapsed),
            );
            if elapsed <= timeout_ns {
                proptest::prop_assert!(fresh, "stale after {elapsed} ns");
            }
            let unit = 1u64 << 30;
            if elapsed >= (u64::from(fragment_record_life(family)) + 2) * unit {
                proptest::prop_assert!(!fresh, "fresh after {elapsed} ns");
            }
        }
    }

    /// Every combination of what a candidate asks for against packets with and without
    /// a port, with the protocol equal or not. Expected verdicts are written from the
    /// rule ("asks for a port: the packet shows that port; asks for a protocol: the
    /// packet has it"), not from the code.
    #[test]
    fn candidates_match_exactly_what_they_ask_for() {
        let candidate = |match_flags: u8| Candidate {
            slot: 7,
            port: 443,
            proto: IPPROTO_TCP,
            match_flags,
            _pad: 0,
        };
        let any = candidate(0);
        let port = candidate(MATCH_PORT);
        let proto = candidate(MATCH_PROTO);
        let both = candidate(MATCH_PORT | MATCH_PROTO);
        #[rustfmt::skip]
        let cases: [(&str, Candidate, Option<u16>, u8, bool); 20] = [
            ("any: port and proto equal",        any,   Some(443), IPPROTO_TCP,  true),
            ("any: other port",                  any,   Some(80),  IPPROTO_TCP,  true),
            ("any: no port",                     any,   None,      IPPROTO_ICMP, true),
            ("any: other proto",                 any,   Some(443), IPPROTO_UDP,  true),
            ("any: port 0",                      any,   Some(0),   IPPROTO_UDP,  true),
            ("port: same port",                  port,  Some(443), IPPROTO_TCP,  true),
            ("port: same port, other proto",     port,  Some(443), IPPROTO_UDP,  true),
            ("port: other port",                 port,  Some(80),  IPPROTO_TCP,  false),
            ("port: no port never equals one",   port,  None,      IPPROTO_TCP,  false),
            ("port: port 0 is not 443",          port,  Some(0),   IPPROTO_TCP,  false),
            ("proto: same proto",                proto, Some(80),  IPPROTO_TCP,  true),
            ("proto: same proto, no port",       proto, None,      IPPROTO_TCP,  true),
            ("proto: other proto",               proto, Some(443), IPPROTO_UDP,  false),
            ("proto: ICMP is not TCP",           proto, None,      IPPROTO_ICMP, false),
            ("both: same port and proto",        both,  Some(443), IPPROTO_TCP,  true),
            ("both: other port",                 both,  Some(444), IPPROTO_TCP,  false),
            ("both: other proto",                both,  Some(443), IPPROTO_UDP,  false),
            ("both: no port",                    both,  None,      IPPROTO_TCP,  false),
            ("both: neither",                    both,  Some(80),  IPPROTO_UDP,  false),
            ("both: no port, other proto",       both,  None,      IPPROTO_ICMPV6, false),
        ];
        for (what, c, port, proto, want) in cases {
            assert_eq!(c.matches(port, proto), want, "{what}");
        }
    }

    /// A candidate that asks for port 0 matches a packet to port 0, and only packets
    /// that show a port: `None` is not a port 0 in disguise.
    #[test]
    fn port_zero_is_a_port_and_no_port_is_not_port_zero() {
        let c = Candidate {
            port: 0,
            match_flags: MATCH_PORT,
            ..Candidate::default()
        };
        assert!(c.matches(Some(0), IPPROTO_UDP));
        assert!(!c.matches(None, IPPROTO_UDP));
    }

    #[test]
    fn source_keys_mask_to_the_prefix() {
        let mut v4 = [0u8; 16];
        v4[..4].copy_from_slice(&[198, 18, 77, 200]);
        assert_eq!(
            SourceKey::masked(3, 4, &v4, 24, 128).addr[..4],
            [198, 18, 77, 0]
        );
        assert_eq!(
            SourceKey::masked(3, 4, &v4, 32, 128).addr[..4],
            [198, 18, 77, 200]
        );
        assert_eq!(SourceKey::masked(3, 4, &v4, 0, 128).addr, [0; 16]);
        assert_eq!(
            SourceKey::masked(3, 4, &v4, 17, 128).addr[..4],
            [198, 18, 0, 0]
        );
        let v6 = [
            0x20, 0x01, 0x0d, 0xb8, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,
        ];
        let k = SourceKey::masked(1, 6, &v6, 32, 48);
        assert_eq!(
            k.addr,
            [0x20, 0x01, 0x0d, 0xb8, 1, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(SourceKey::masked(1, 6, &v6, 32, 128).addr, v6);
        assert_eq!(
            SourceKey::masked(1, 6, &v6, 32, 70).addr[8],
            5 & 0b1111_1100
        );
    }
}

/// Datagrams whose first fragment is in flight (`FRAGMENTS` capacity). An entry is
/// written when a first fragment passes and read by the datagram's later fragments; the
/// table only has to outlive a datagram's fragments, which arrive within microseconds.
pub const MAX_FRAGMENT_RECORDS: u32 = 16384;

/// Key of a `FRAGMENTS` entry: the datagram, as the destination's stack reassembles it
/// (IPv4: source, destination, protocol, 16-bit identification; IPv6: source,
/// destination, 32-bit identification).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FragmentKey {
    /// 4 or 6.
    pub family: u16,
    /// IPv4: the header's protocol; IPv6: 0 (not part of the datagram's identity).
    pub proto: u16,
    pub id: u32,
    pub src: AddrWords,
    pub dst: AddrWords,
}

/// What a datagram's first fragment showed, for its later fragments, which carry no
/// transport header: they are classified with these ports. Written by the first
/// first fragment; while it is fresh ([`fragment_record_fresh`]) another first
/// fragment that disagrees with it is refused, as the destination keeps the first one.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FragmentRecord {
    /// Destination port, host order (valid with `has_ports`).
    pub dst_port: u16,
    /// Transport protocol found by the first fragment (after IPv6 extension headers).
    pub proto: u8,
    /// 1 when the transport header has ports (TCP, UDP).
    pub has_ports: u8,
    /// Where the first fragment's payload ends, in 8-byte fragment-offset units (at most
    /// 8,192): a later fragment starting before it would overwrite the headers the first
    /// one was classified by.
    pub first_end: u16,
    /// When a first fragment with these headers was last seen: [`fragment_clock`] of
    /// CLOCK_MONOTONIC. (The upper half of a `u32` `first_end` in earlier versions, so
    /// a record they left reads as stamped at 0: the layout, and pins, are unchanged.)
    pub passed_at: u16,
}

/// [`FragmentRecord::passed_at`]'s clock: CLOCK_MONOTONIC in units of 2^30 ns
/// (≈ 1.074 s), wrapping every 2^16 units (≈ 19.5 h).
#[inline(always)]
pub const fn fragment_clock(now_ns: u64) -> u16 {
    (now_ns >> 30) as u16
}

/// How long, in [`fragment_clock`] units, a record speaks for a datagram the destination
/// may still be reassembling: Linux keeps a reassembly queue at most `ipfrag_time`
/// (IPv4, 30 s by default) or `ip6frag_time` (IPv6, 60 s) after it starts, and drops the
/// queue's fragments when it restarts one (IPv4's `ipfrag_max_dist`). A record whose
/// stamp is older by more than this many units is older than that by more than
/// 28 × 1.074 s = 30.1 s (IPv4) or 56 × 1.074 s = 60.1 s (IPv6), whatever the rounding of
/// both readings.
pub const fn fragment_record_life(family: u32) -> u16 {
    if family == 4 {
        28
    } else {
        56
    }
}

/// Whether a record stamped `passed_at` may still describe a datagram in reassembly at
/// `now` (both [`fragment_clock`] readings). The clock wraps: a record left untouched
/// for a multiple of 19.5 h reads fresh again for a minute, which at worst refuses one
/// disagreeing first fragment under the same identification.
#[inline(always)]
pub const fn fragment_record_fresh(family: u32, passed_at: u16, now: u16) -> bool {
    now.wrapping_sub(passed_at) <= fragment_record_life(family)
}

counters! {
    /// Counters of frames whose headers needed more than the plain parse: fragments and the
    /// evasions the program refuses (README, "What each kind of frame gets"). One copy per
    /// CPU (`HEADER_COUNTERS[0]`); a map of its own, so that pins of builds without it are
    /// adopted as they are.
    pub struct HeaderCounters {
        /// IPv4 and IPv6 fragments (first and later ones).
        pub fragments: u64,
        /// First fragments that do not hold the whole transport header (RFC 1858, RFC 3128)
        /// or, for IPv6, the whole header chain (RFC 8200, RFC 7112): refused.
        pub tiny_fragments: u64,
        /// Later fragments whose first fragment did not pass here and whose rule depends on
        /// ports, which only the first fragment shows: refused.
        pub orphan_fragments: u64,
        /// Later fragments that overlap the headers of the first one (RFC 1858): refused.
        pub overlapping_fragments: u64,
        /// IPv6 frames with a longer extension-header chain than the program walks: refused
        /// when a rule covers the destination.
        pub long_header_chains: u64,
        /// Frames with more VLAN tags than the program walks (it cannot see their
        /// destination): dropped.
        pub deep_vlan_stacks: u64,
    }
}

counters! {
    /// The single per-CPU entry of `TUNNEL_COUNTS`.
    pub struct TunnelCounters {
        /// Frames classified by their inner header.
        pub decapsulated: u64,
        /// Frames of an encapsulation their interface decapsulates whose outer datagram
        /// is a first fragment without the whole inner headers: dropped (README,
        /// "Tunnels").
        pub unreadable: u64,
    }
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: every type is #[repr(C)], Copy, made only of integers, and has no padding
    // (the size assertions below prove the last part).
    unsafe impl aya::Pod for super::Control {}
    unsafe impl aya::Pod for super::RuleConfig {}
    unsafe impl aya::Pod for super::Candidate {}
    unsafe impl aya::Pod for super::PrefixRules {}
    unsafe impl aya::Pod for super::Bucket {}
    unsafe impl aya::Pod for super::AggBucket {}
    unsafe impl aya::Pod for super::SourceKey {}
    unsafe impl aya::Pod for super::RuleCounters {}
    unsafe impl aya::Pod for super::GlobalCounters {}
    unsafe impl aya::Pod for super::RuleCpuState {}
    unsafe impl aya::Pod for super::HostEntry {}
    unsafe impl aya::Pod for super::FragmentKey {}
    unsafe impl aya::Pod for super::FragmentRecord {}
    unsafe impl aya::Pod for super::HeaderCounters {}
    unsafe impl aya::Pod for super::SynCounters {}
    unsafe impl aya::Pod for super::Handoff {}
    unsafe impl aya::Pod for super::HandoffCounters {}
    unsafe impl aya::Pod for super::TunnelConfig {}
    unsafe impl aya::Pod for super::TunnelCounters {}
}

// No implicit padding anywhere: each size equals the sum of its fields.
const _: () = {
    use core::mem::size_of;
    assert!(size_of::<Control>() == 8);
    assert!(size_of::<Handoff>() == 8);
    assert!(size_of::<HandoffCounters>() == 8);
    assert!(size_of::<TunnelConfig>() == 4 + 4 + 2 * MAX_TUNNEL_UDP_PORTS);
    assert!(size_of::<TunnelCounters>() == 16);
    assert!(size_of::<Limit>() == 16);
    assert!(size_of::<RuleConfig>() == 4 * 6 + 16 * 2 + 8 * 7 + RULE_NAME_LEN + 16);
    assert!(size_of::<RuleConfig>().is_multiple_of(64));
    // What a frame reads fits in the entry's first cache line.
    assert!(core::mem::offset_of!(RuleConfig, fail_open_at_ns) + 8 == 64);
    // The canary threshold is read on the refusal path only: off the first line, aligned.
    assert!(core::mem::offset_of!(RuleConfig, canary_threshold) >= 128);
    assert!(core::mem::offset_of!(RuleConfig, canary_threshold).is_multiple_of(8));
    assert!(size_of::<Candidate>() == 8);
    assert!(size_of::<PrefixRules>() == 4 + 8 * MAX_CANDIDATES);
    assert!(size_of::<Bucket>() == 8);
    assert!(size_of::<AggBucket>() == 64);
    assert!(size_of::<SourceKey>() == 24);
    assert!(size_of::<RuleCounters>() == 64);
    assert!(size_of::<GlobalCounters>() == 40);
    assert!(size_of::<FragmentKey>() == 2 + 2 + 4 + 16 + 16);
    assert!(size_of::<FragmentRecord>() == 8);
    // Where a first fragment's payload ends, in 8-byte units, fits `first_end`.
    assert!(65536 / 8 <= u16::MAX as usize);
    assert!(size_of::<HeaderCounters>() == 6 * 8);
    assert!(size_of::<SynCounters>() == 8);
    assert!(size_of::<TickClock>() == 16);
    assert!(size_of::<RuleCpuState>() == 80);
    assert!(size_of::<HostEntry>() == 4 + 16 + size_of::<PrefixRules>() + 40);
    assert!(size_of::<HostEntry>().is_multiple_of(64));
    // The program reads a slot's address as aligned words.
    assert!(core::mem::offset_of!(HostEntry, addr).is_multiple_of(4));
    assert!(core::mem::align_of::<HostEntry>() >= 4);
    assert!(HOST_SLOTS.is_power_of_two() && HOST_SLOTS >= 4 * MAX_RULES);
    // LPM values sit right after a 4-byte IPv4 key: they must not need more alignment.
    assert!(core::mem::align_of::<PrefixRules>() <= 4);
};
