//! The program's maps. BTF-defined so `bpftool map dump` shows field names; the daemon
//! pins them under pin_dir by these names (limiter_common::abi::map_name).

use aya_ebpf::{
    btf_maps::{Array, HashMap, LpmTrie, LruHashMap, PerCpuArray, ProgramArray, RingBuf},
    macros::btf_map,
};
use limiter_common::{
    abi::{
        AggBucket, Bucket, Control, FragmentKey, FragmentRecord, GlobalCounters, Handoff,
        HandoffCounters, HeaderCounters, HostEntry, PrefixRules, RuleConfig, RuleCpuState,
        SynCounters, TunnelConfig, TunnelCounters, DEFAULT_MAX_SOURCES, GENERATIONS, HOST_SLOTS,
        MAX_FRAGMENT_RECORDS, MAX_PREFIXES, MAX_RULES, MAX_TUNNEL_INTERFACES,
    },
    drop::{
        DropEvent, MonitorConfig, MonitorCounters, MonitorState, ReasonCounters, DROP_EVENTS_BYTES,
    },
    sketch::{self, SketchCounters, SketchMeta},
};

const RULE_ENTRIES: usize = (GENERATIONS * MAX_RULES) as usize;
const SLOTS: usize = MAX_RULES as usize;
const HOST_ENTRIES: usize = (GENERATIONS * HOST_SLOTS) as usize;
const PREFIXES: usize = MAX_PREFIXES as usize;
/// Overridden at load time with `sketch::cells_for(max_sources)`.
const SKETCH_CELLS: usize = sketch::cells_for(DEFAULT_MAX_SOURCES) as usize;
/// Page-aligned values, so entries sized in whole cache lines start on one.
const PAGE_ALIGNED: usize = aya_ebpf::bindings::BPF_F_MMAPABLE as usize;
/// LPM tries must not preallocate.
const NO_PREALLOC: usize = aya_ebpf::bindings::BPF_F_NO_PREALLOC as usize;

#[btf_map]
pub static CONTROL: Array<Control, 1> = Array::new();

#[btf_map]
pub static RULES: Array<RuleConfig, RULE_ENTRIES, PAGE_ALIGNED> = Array::new();

#[btf_map]
pub static PREFIXES_V4_0: LpmTrie<[u8; 4], PrefixRules, PREFIXES, NO_PREALLOC> = LpmTrie::new();
#[btf_map]
pub static PREFIXES_V4_1: LpmTrie<[u8; 4], PrefixRules, PREFIXES, NO_PREALLOC> = LpmTrie::new();
#[btf_map]
pub static PREFIXES_V6_0: LpmTrie<[u8; 16], PrefixRules, PREFIXES, NO_PREALLOC> = LpmTrie::new();
#[btf_map]
pub static PREFIXES_V6_1: LpmTrie<[u8; 16], PrefixRules, PREFIXES, NO_PREALLOC> = LpmTrie::new();

/// Aggregate buckets by rule slot: never evicted.
#[btf_map]
pub static AGG_BUCKETS: Array<AggBucket, SLOTS, PAGE_ALIGNED> = Array::new();

/// Per-source GCRA cells (limiter_common::sketch): nothing to insert, nothing to evict.
/// Mappable, so the daemon clears a rule's region with a memset, not a syscall a cell.
#[btf_map]
pub static SRC_SKETCH: Array<Bucket, SKETCH_CELLS, PAGE_ALIGNED> = Array::new();

#[btf_map]
pub static SKETCH_META: Array<SketchMeta, 1> = Array::new();

#[btf_map]
pub static SKETCH_COUNTS: PerCpuArray<SketchCounters, 1> = PerCpuArray::new();

#[btf_map]
pub static RULE_COUNTERS: PerCpuArray<RuleCpuState, SLOTS> = PerCpuArray::new();

#[btf_map]
pub static GLOBAL_COUNTERS: PerCpuArray<GlobalCounters, 1> = PerCpuArray::new();

/// Exact-address tables, one per generation (limiter_common::abi::HostEntry).
#[btf_map]
pub static HOSTS: Array<HostEntry, HOST_ENTRIES, PAGE_ALIGNED> = Array::new();

/// First fragments in flight: the ports their later fragments are classified with.
#[btf_map]
pub static FRAGMENTS: LruHashMap<FragmentKey, FragmentRecord, { MAX_FRAGMENT_RECORDS as usize }> =
    LruHashMap::new();

#[btf_map]
pub static HEADER_COUNTERS: PerCpuArray<HeaderCounters, 1> = PerCpuArray::new();

/// SYNs each `unit = "syn"` rule metered, per CPU, by slot (the fleet's demand in SYNs).
#[btf_map]
pub static RULE_SYNS: PerCpuArray<SynCounters, SLOTS> = PerCpuArray::new();

/// Where frames the XDP builds pass go next (limiter_common::abi::Handoff). New in the
/// handoff's version: a daemon upgrade creates it, every older map keeps its layout.
#[btf_map]
pub static HANDOFF: Array<Handoff, 1> = Array::new();

#[btf_map]
pub static HANDOFF_COUNTS: PerCpuArray<HandoffCounters, 1> = PerCpuArray::new();

/// The kernel gives a prog array to the type and `xdp.frags` flag of the first program
/// that uses it and refuses tail calls across either: one array per XDP build. One slot
/// in the daemon's own arrays; an LB's array pinned elsewhere takes this name's place at
/// load time (its size is the LB's).
#[btf_map]
pub static HANDOFF_LINEAR: ProgramArray<1> = ProgramArray::new();

#[btf_map]
pub static HANDOFF_MULTI: ProgramArray<1> = ProgramArray::new();

/// What each interface decapsulates, by ifindex (limiter_common::abi::TunnelConfig).
/// Looked up only when `CONTROL_TUNNELS` is set and the outer header could be a tunnel.
#[btf_map]
pub static TUNNELS: HashMap<u32, TunnelConfig, { MAX_TUNNEL_INTERFACES as usize }> = HashMap::new();

#[btf_map]
pub static TUNNEL_COUNTS: PerCpuArray<TunnelCounters, 1> = PerCpuArray::new();

/// Refusals by rule slot and reason; the entry after the last slot (`NO_RULE`) holds the
/// refusals no rule decides.
#[btf_map]
pub static DROP_REASONS: PerCpuArray<ReasonCounters, { SLOTS + 1 }> = PerCpuArray::new();

/// Sampled refusals, read by `limiter monitor`.
#[btf_map]
pub static DROP_EVENTS: RingBuf<DropEvent, { DROP_EVENTS_BYTES as usize }> = RingBuf::new();

#[btf_map]
pub static MONITOR: Array<MonitorConfig, 1> = Array::new();

#[btf_map]
pub static MONITOR_COUNTS: PerCpuArray<MonitorCounters, 1> = PerCpuArray::new();

#[btf_map]
pub static MONITOR_STATE: PerCpuArray<MonitorState, 1> = PerCpuArray::new();
