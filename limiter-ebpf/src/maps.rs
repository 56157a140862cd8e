//! The program's maps. BTF-defined so `bpftool map dump` shows field names; the daemon
//! pins them under pin_dir by these names (limiter_common::abi::map_name). Their sizes
//! and flags come from the one table of maps (`limiter_common::maps::MAPS`), and the
//! asserts below hold each declaration's kind, key and value types to its row.

use core::mem::size_of;

use aya_ebpf::{
    btf_maps::{Array, HashMap, LpmTrie, LruHashMap, PerCpuArray, ProgramArray, RingBuf},
    macros::btf_map,
};
use limiter_common::{
    abi::{
        map_name, AggBucket, Bucket, Control, FragmentKey, FragmentRecord, GlobalCounters, Handoff,
        HandoffCounters, HeaderCounters, HostEntry, PrefixRules, RuleConfig, RuleCpuState,
        SynCounters, TunnelConfig, TunnelCounters, DEFAULT_MAX_SOURCES,
    },
    drop::{DropEvent, MonitorConfig, MonitorCounters, MonitorState, ReasonCounters},
    maps::{map_spec, MapKind, BPF_F_MMAPABLE, BPF_F_NO_PREALLOC},
    sketch::{SketchCounters, SketchMeta},
};

/// The entries of the map `name` in the table (the sketch's for the default
/// `max_sources`: the loader sets it from the config).
const fn entries(name: &str) -> usize {
    map_spec(name).max_entries(DEFAULT_MAX_SOURCES) as usize
}

/// The `map_flags` of the map `name` in the table.
const fn flags(name: &str) -> usize {
    map_spec(name).flags as usize
}

/// Fails the build unless the declaration of `name` (its kind, key type `K`, value type
/// `V` and flags) is the table's row.
const fn declared<K, V>(name: &str, kind: MapKind, declared_flags: usize) {
    let row = map_spec(name);
    assert!(
        row.kind.bpf_map_type() == kind.bpf_map_type(),
        "map kind differs from the table"
    );
    let (key, value) = match kind {
        // The kernel's LPM key: a u32 prefix length before the address.
        MapKind::LpmTrie => (size_of::<u32>() + size_of::<K>(), size_of::<V>()),
        MapKind::ProgArray => (size_of::<u32>(), size_of::<u32>()),
        MapKind::RingBuf => (0, 0),
        _ => (size_of::<K>(), size_of::<V>()),
    };
    assert!(
        row.key_size as usize == key,
        "key size differs from the table"
    );
    assert!(
        row.value_size as usize == value,
        "value size differs from the table"
    );
    assert!(
        row.flags as usize == declared_flags,
        "flags differ from the table"
    );
}

// The table's flags are the kernel's.
const _: () = assert!(BPF_F_MMAPABLE as usize == aya_ebpf::bindings::BPF_F_MMAPABLE as usize);
const _: () = assert!(BPF_F_NO_PREALLOC as usize == aya_ebpf::bindings::BPF_F_NO_PREALLOC as usize);

const _: () = {
    use map_name as n;
    use MapKind::{Array as A, Hash as H, LpmTrie as L, LruHash as Lru, PerCpuArray as P};
    declared::<u32, Control>(n::CONTROL, A, 0);
    declared::<u32, RuleConfig>(n::RULES, A, flags(n::RULES));
    declared::<[u8; 4], PrefixRules>(n::PREFIXES_V4_0, L, flags(n::PREFIXES_V4_0));
    declared::<[u8; 4], PrefixRules>(n::PREFIXES_V4_1, L, flags(n::PREFIXES_V4_1));
    declared::<[u8; 16], PrefixRules>(n::PREFIXES_V6_0, L, flags(n::PREFIXES_V6_0));
    declared::<[u8; 16], PrefixRules>(n::PREFIXES_V6_1, L, flags(n::PREFIXES_V6_1));
    declared::<u32, AggBucket>(n::AGG_BUCKETS, A, flags(n::AGG_BUCKETS));
    declared::<u32, Bucket>(n::SRC_SKETCH, A, flags(n::SRC_SKETCH));
    declared::<u32, SketchMeta>(n::SKETCH_META, A, 0);
    declared::<u32, SketchCounters>(n::SKETCH_COUNTS, P, 0);
    declared::<u32, RuleCpuState>(n::RULE_COUNTERS, P, 0);
    declared::<u32, GlobalCounters>(n::GLOBAL_COUNTERS, P, 0);
    declared::<u32, HostEntry>(n::HOSTS, A, flags(n::HOSTS));
    declared::<FragmentKey, FragmentRecord>(n::FRAGMENTS, Lru, 0);
    declared::<u32, HeaderCounters>(n::HEADER_COUNTERS, P, 0);
    declared::<u32, SynCounters>(n::RULE_SYNS, P, 0);
    declared::<u32, Handoff>(n::HANDOFF, A, 0);
    declared::<u32, HandoffCounters>(n::HANDOFF_COUNTS, P, 0);
    declared::<u32, u32>(n::HANDOFF_LINEAR, MapKind::ProgArray, 0);
    declared::<u32, u32>(n::HANDOFF_MULTI, MapKind::ProgArray, 0);
    declared::<u32, TunnelConfig>(n::TUNNELS, H, 0);
    declared::<u32, TunnelCounters>(n::TUNNEL_COUNTS, P, 0);
    declared::<u32, ReasonCounters>(n::DROP_REASONS, P, 0);
    declared::<(), DropEvent>(n::DROP_EVENTS, MapKind::RingBuf, 0);
    declared::<u32, MonitorConfig>(n::MONITOR, A, 0);
    declared::<u32, MonitorCounters>(n::MONITOR_COUNTS, P, 0);
    declared::<u32, MonitorState>(n::MONITOR_STATE, P, 0);
};

#[btf_map]
pub static CONTROL: Array<Control, { entries(map_name::CONTROL) }> = Array::new();

#[btf_map]
pub static RULES: Array<RuleConfig, { entries(map_name::RULES) }, { flags(map_name::RULES) }> =
    Array::new();

#[btf_map]
pub static PREFIXES_V4_0: LpmTrie<
    [u8; 4],
    PrefixRules,
    { entries(map_name::PREFIXES_V4_0) },
    { flags(map_name::PREFIXES_V4_0) },
> = LpmTrie::new();
#[btf_map]
pub static PREFIXES_V4_1: LpmTrie<
    [u8; 4],
    PrefixRules,
    { entries(map_name::PREFIXES_V4_1) },
    { flags(map_name::PREFIXES_V4_1) },
> = LpmTrie::new();
#[btf_map]
pub static PREFIXES_V6_0: LpmTrie<
    [u8; 16],
    PrefixRules,
    { entries(map_name::PREFIXES_V6_0) },
    { flags(map_name::PREFIXES_V6_0) },
> = LpmTrie::new();
#[btf_map]
pub static PREFIXES_V6_1: LpmTrie<
    [u8; 16],
    PrefixRules,
    { entries(map_name::PREFIXES_V6_1) },
    { flags(map_name::PREFIXES_V6_1) },
> = LpmTrie::new();

/// Aggregate buckets by rule slot: never evicted.
#[btf_map]
pub static AGG_BUCKETS: Array<
    AggBucket,
    { entries(map_name::AGG_BUCKETS) },
    { flags(map_name::AGG_BUCKETS) },
> = Array::new();

/// Per-source GCRA cells (limiter_common::sketch): nothing to insert, nothing to evict.
/// Mappable, so the daemon clears a rule's region with a memset, not a syscall a cell.
#[btf_map]
pub static SRC_SKETCH: Array<
    Bucket,
    { entries(map_name::SRC_SKETCH) },
    { flags(map_name::SRC_SKETCH) },
> = Array::new();

#[btf_map]
pub static SKETCH_META: Array<SketchMeta, { entries(map_name::SKETCH_META) }> = Array::new();

#[btf_map]
pub static SKETCH_COUNTS: PerCpuArray<SketchCounters, { entries(map_name::SKETCH_COUNTS) }> =
    PerCpuArray::new();

#[btf_map]
pub static RULE_COUNTERS: PerCpuArray<RuleCpuState, { entries(map_name::RULE_COUNTERS) }> =
    PerCpuArray::new();

#[btf_map]
pub static GLOBAL_COUNTERS: PerCpuArray<GlobalCounters, { entries(map_name::GLOBAL_COUNTERS) }> =
    PerCpuArray::new();

/// Exact-address tables, one per generation (limiter_common::abi::HostEntry).
#[btf_map]
pub static HOSTS: Array<HostEntry, { entries(map_name::HOSTS) }, { flags(map_name::HOSTS) }> =
    Array::new();

/// First fragments in flight: the ports their later fragments are classified with.
#[btf_map]
pub static FRAGMENTS: LruHashMap<FragmentKey, FragmentRecord, { entries(map_name::FRAGMENTS) }> =
    LruHashMap::new();

#[btf_map]
pub static HEADER_COUNTERS: PerCpuArray<HeaderCounters, { entries(map_name::HEADER_COUNTERS) }> =
    PerCpuArray::new();

/// SYNs each `unit = "syn"` rule metered, per CPU, by slot (the fleet's demand in SYNs).
#[btf_map]
pub static RULE_SYNS: PerCpuArray<SynCounters, { entries(map_name::RULE_SYNS) }> =
    PerCpuArray::new();

/// Where frames the XDP builds pass go next (limiter_common::abi::Handoff). New in the
/// handoff's version: a daemon upgrade creates it, every older map keeps its layout.
#[btf_map]
pub static HANDOFF: Array<Handoff, { entries(map_name::HANDOFF) }> = Array::new();

#[btf_map]
pub static HANDOFF_COUNTS: PerCpuArray<HandoffCounters, { entries(map_name::HANDOFF_COUNTS) }> =
    PerCpuArray::new();

/// The kernel gives a prog array to the type and `xdp.frags` flag of the first program
/// that uses it and refuses tail calls across either: one array per XDP build. One slot
/// in the daemon's own arrays; an LB's array pinned elsewhere takes this name's place at
/// load time (its size is the LB's).
#[btf_map]
pub static HANDOFF_LINEAR: ProgramArray<{ entries(map_name::HANDOFF_LINEAR) }> =
    ProgramArray::new();

#[btf_map]
pub static HANDOFF_MULTI: ProgramArray<{ entries(map_name::HANDOFF_MULTI) }> = ProgramArray::new();

/// What each interface decapsulates, by ifindex (limiter_common::abi::TunnelConfig).
/// Looked up only when `CONTROL_TUNNELS` is set and the outer header could be a tunnel.
#[btf_map]
pub static TUNNELS: HashMap<u32, TunnelConfig, { entries(map_name::TUNNELS) }> = HashMap::new();

#[btf_map]
pub static TUNNEL_COUNTS: PerCpuArray<TunnelCounters, { entries(map_name::TUNNEL_COUNTS) }> =
    PerCpuArray::new();

/// Refusals by rule slot and reason; the entry after the last slot (`NO_RULE`) holds the
/// refusals no rule decides.
#[btf_map]
pub static DROP_REASONS: PerCpuArray<ReasonCounters, { entries(map_name::DROP_REASONS) }> =
    PerCpuArray::new();

/// Sampled refusals, read by `limiter monitor`.
#[btf_map]
pub static DROP_EVENTS: RingBuf<DropEvent, { entries(map_name::DROP_EVENTS) }> = RingBuf::new();

#[btf_map]
pub static MONITOR: Array<MonitorConfig, { entries(map_name::MONITOR) }> = Array::new();

#[btf_map]
pub static MONITOR_COUNTS: PerCpuArray<MonitorCounters, { entries(map_name::MONITOR_COUNTS) }> =
    PerCpuArray::new();

#[btf_map]
pub static MONITOR_STATE: PerCpuArray<MonitorState, { entries(map_name::MONITOR_STATE) }> =
    PerCpuArray::new();
