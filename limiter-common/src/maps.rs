//! The program's maps, once: name, kind, key and value sizes, flags and size. The kernel
//! crate's declarations take their sizes and flags from this table and assert their key
//! and value types against it; the daemon checks pinned maps against it, pins each map by
//! its name, and opens them by it (`limiter-user`'s `Maps::build`).

use core::mem::size_of;

use crate::{
    abi::{
        map_name, AggBucket, Bucket, Control, FragmentKey, FragmentRecord, GlobalCounters, Handoff,
        HandoffCounters, HeaderCounters, HostEntry, PrefixRules, RuleConfig, RuleCpuState,
        SynCounters, TunnelConfig, TunnelCounters, GENERATIONS, HOST_SLOTS, MAX_FRAGMENT_RECORDS,
        MAX_PREFIXES, MAX_RULES, MAX_TUNNEL_INTERFACES,
    },
    drop::{MonitorConfig, MonitorCounters, MonitorState, ReasonCounters, DROP_EVENTS_BYTES},
    sketch::{self, SketchCounters, SketchMeta},
};

/// `BPF_F_NO_PREALLOC` (include/uapi/linux/bpf.h): LPM tries must not preallocate.
pub const BPF_F_NO_PREALLOC: u32 = 1;
/// `BPF_F_MMAPABLE`: page-aligned values, so entries sized in whole cache lines start on
/// one, and the daemon can map the array (a memset clears a rule's sketch region).
pub const BPF_F_MMAPABLE: u32 = 1 << 10;

/// The kernel's kind of a map (`enum bpf_map_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapKind {
    Array,
    PerCpuArray,
    /// Keys are a `u32` prefix length and the address.
    LpmTrie,
    Hash,
    LruHash,
    /// Keys are `u32` slots, values `u32` program fds (ids when read back).
    ProgArray,
    /// No keys or values: its size is in bytes.
    RingBuf,
}

impl MapKind {
    /// The kernel's number for this kind (`BPF_MAP_TYPE_*`).
    pub const fn bpf_map_type(self) -> u32 {
        match self {
            MapKind::Hash => 1,
            MapKind::Array => 2,
            MapKind::ProgArray => 3,
            MapKind::PerCpuArray => 6,
            MapKind::LruHash => 9,
            MapKind::LpmTrie => 11,
            MapKind::RingBuf => 27,
        }
    }
}

/// How many entries a map holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entries {
    Fixed(u32),
    /// `sketch::cells_for(max_sources)`: set at load from the config.
    SketchCells,
}

/// One of the program's maps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapSpec {
    /// The ELF symbol and the file name under `pin_dir` ([`map_name`]).
    pub name: &'static str,
    pub kind: MapKind,
    pub key_size: u32,
    pub value_size: u32,
    pub entries: Entries,
    /// `map_flags`: [`BPF_F_NO_PREALLOC`], [`BPF_F_MMAPABLE`] or none.
    pub flags: u32,
    /// Whether the first pinned layout had it: maps added since may be missing from an
    /// older daemon's pins, which `limiter stats` still reads (without what they hold).
    pub in_first_layout: bool,
}

impl MapSpec {
    /// Its entries for a daemon configured with `max_sources`.
    pub const fn max_entries(&self, max_sources: u32) -> u32 {
        match self.entries {
            Entries::Fixed(n) => n,
            Entries::SketchCells => sketch::cells_for(max_sources),
        }
    }
}

#[expect(
    clippy::cast_possible_truncation,
    reason = "every map type is a few hundred bytes at most"
)]
const fn size<T>() -> u32 {
    size_of::<T>() as u32
}

const fn spec(
    name: &'static str,
    kind: MapKind,
    key_size: u32,
    value_size: u32,
    entries: Entries,
    flags: u32,
    in_first_layout: bool,
) -> MapSpec {
    MapSpec {
        name,
        kind,
        key_size,
        value_size,
        entries,
        flags,
        in_first_layout,
    }
}

use Entries::{Fixed, SketchCells};
use MapKind::{Array, Hash, LpmTrie, LruHash, PerCpuArray, ProgArray, RingBuf};

/// An array index or a hash's `u32` key (an ifindex).
const U32: u32 = size::<u32>();
/// An LPM trie's key: the prefix length, then the address.
const V4_KEY: u32 = U32 + 4;
const V6_KEY: u32 = U32 + 16;
const MMAP: u32 = BPF_F_MMAPABLE;

/// Every map the program owns, in [`map_name::ALL`]'s order.
pub const MAPS: [MapSpec; 27] = [
    spec(
        map_name::CONTROL,
        Array,
        U32,
        size::<Control>(),
        Fixed(1),
        0,
        true,
    ),
    spec(
        map_name::RULES,
        Array,
        U32,
        size::<RuleConfig>(),
        Fixed(GENERATIONS * MAX_RULES),
        MMAP,
        true,
    ),
    spec(
        map_name::PREFIXES_V4_0,
        LpmTrie,
        V4_KEY,
        size::<PrefixRules>(),
        Fixed(MAX_PREFIXES),
        BPF_F_NO_PREALLOC,
        true,
    ),
    spec(
        map_name::PREFIXES_V4_1,
        LpmTrie,
        V4_KEY,
        size::<PrefixRules>(),
        Fixed(MAX_PREFIXES),
        BPF_F_NO_PREALLOC,
        true,
    ),
    spec(
        map_name::PREFIXES_V6_0,
        LpmTrie,
        V6_KEY,
        size::<PrefixRules>(),
        Fixed(MAX_PREFIXES),
        BPF_F_NO_PREALLOC,
        true,
    ),
    spec(
        map_name::PREFIXES_V6_1,
        LpmTrie,
        V6_KEY,
        size::<PrefixRules>(),
        Fixed(MAX_PREFIXES),
        BPF_F_NO_PREALLOC,
        true,
    ),
    spec(
        map_name::AGG_BUCKETS,
        Array,
        U32,
        size::<AggBucket>(),
        Fixed(MAX_RULES),
        MMAP,
        true,
    ),
    spec(
        map_name::SRC_SKETCH,
        Array,
        U32,
        size::<Bucket>(),
        SketchCells,
        MMAP,
        true,
    ),
    spec(
        map_name::SKETCH_META,
        Array,
        U32,
        size::<SketchMeta>(),
        Fixed(1),
        0,
        true,
    ),
    spec(
        map_name::SKETCH_COUNTS,
        PerCpuArray,
        U32,
        size::<SketchCounters>(),
        Fixed(1),
        0,
        true,
    ),
    spec(
        map_name::RULE_COUNTERS,
        PerCpuArray,
        U32,
        size::<RuleCpuState>(),
        Fixed(MAX_RULES),
        0,
        true,
    ),
    spec(
        map_name::GLOBAL_COUNTERS,
        PerCpuArray,
        U32,
        size::<GlobalCounters>(),
        Fixed(1),
        0,
        true,
    ),
    spec(
        map_name::HOSTS,
        Array,
        U32,
        size::<HostEntry>(),
        Fixed(GENERATIONS * HOST_SLOTS),
        MMAP,
        true,
    ),
    spec(
        map_name::FRAGMENTS,
        LruHash,
        size::<FragmentKey>(),
        size::<FragmentRecord>(),
        Fixed(MAX_FRAGMENT_RECORDS),
        0,
        false,
    ),
    spec(
        map_name::HEADER_COUNTERS,
        PerCpuArray,
        U32,
        size::<HeaderCounters>(),
        Fixed(1),
        0,
        false,
    ),
    spec(
        map_name::RULE_SYNS,
        PerCpuArray,
        U32,
        size::<SynCounters>(),
        Fixed(MAX_RULES),
        0,
        true,
    ),
    spec(
        map_name::HANDOFF,
        Array,
        U32,
        size::<Handoff>(),
        Fixed(1),
        0,
        false,
    ),
    spec(
        map_name::HANDOFF_COUNTS,
        PerCpuArray,
        U32,
        size::<HandoffCounters>(),
        Fixed(1),
        0,
        false,
    ),
    // One slot in the daemon's own arrays; an LB's array pinned elsewhere takes this
    // name's place at load time (its size is the LB's).
    spec(
        map_name::HANDOFF_LINEAR,
        ProgArray,
        U32,
        U32,
        Fixed(1),
        0,
        false,
    ),
    spec(
        map_name::HANDOFF_MULTI,
        ProgArray,
        U32,
        U32,
        Fixed(1),
        0,
        false,
    ),
    spec(
        map_name::TUNNELS,
        Hash,
        U32,
        size::<TunnelConfig>(),
        Fixed(MAX_TUNNEL_INTERFACES),
        0,
        false,
    ),
    spec(
        map_name::TUNNEL_COUNTS,
        PerCpuArray,
        U32,
        size::<TunnelCounters>(),
        Fixed(1),
        0,
        false,
    ),
    // One more entry than rule slots: `drop::NO_RULE`, refusals no rule decides.
    spec(
        map_name::DROP_REASONS,
        PerCpuArray,
        U32,
        size::<ReasonCounters>(),
        Fixed(MAX_RULES + 1),
        0,
        false,
    ),
    spec(
        map_name::DROP_EVENTS,
        RingBuf,
        0,
        0,
        Fixed(DROP_EVENTS_BYTES),
        0,
        false,
    ),
    spec(
        map_name::MONITOR,
        Array,
        U32,
        size::<MonitorConfig>(),
        Fixed(1),
        0,
        false,
    ),
    spec(
        map_name::MONITOR_COUNTS,
        PerCpuArray,
        U32,
        size::<MonitorCounters>(),
        Fixed(1),
        0,
        false,
    ),
    spec(
        map_name::MONITOR_STATE,
        PerCpuArray,
        U32,
        size::<MonitorState>(),
        Fixed(1),
        0,
        false,
    ),
];

/// The row of the map named `name`; at compile time, a name the table lacks fails the
/// build.
pub const fn map_spec(name: &str) -> &'static MapSpec {
    let mut i = 0;
    while i < MAPS.len() {
        if str_eq(MAPS[i].name, name) {
            return &MAPS[i];
        }
        i += 1;
    }
    panic!("no such map in limiter_common::maps::MAPS")
}

const fn str_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

// The table and the name list are one set, in one order.
const _: () = {
    let mut i = 0;
    while i < MAPS.len() {
        assert!(str_eq(MAPS[i].name, map_name::ALL[i]));
        i += 1;
    }
    assert!(MAPS.len() == map_name::ALL.len());
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_has_its_row() {
        for name in map_name::ALL {
            assert_eq!(map_spec(name).name, name);
        }
    }

    #[test]
    fn only_the_sketch_is_sized_by_the_config() {
        for m in MAPS {
            assert_eq!(
                m.entries == Entries::SketchCells,
                m.name == map_name::SRC_SKETCH,
                "{}",
                m.name
            );
            assert!(
                m.max_entries(crate::abi::DEFAULT_MAX_SOURCES) > 0,
                "{}",
                m.name
            );
        }
    }
}
