//! Per-source structures measured side by side by the bench (`limiter-bench
//! prog-test-run`), each behind the same minimal program: read the IPv4 source of a
//! 64-byte frame, build the limiter's source key, meter it with the limiter's GCRA step
//! (rate 1/s, burst 1: a new source passes, a known one drops). Only the structure
//! differs, so the rows compare what a new source costs in each against what a known
//! one costs in the same. Maps are tiny here; the bench sizes them at load time.
//!
//! - `cand_lru`: BPF_MAP_TYPE_LRU_HASH, one LRU list for all CPUs (the limiter before
//!   the sketch);
//! - `cand_lru_nocommon`: the same with BPF_F_NO_COMMON_LRU (a free list and LRU per CPU);
//! - `cand_lru_percpu`: BPF_MAP_TYPE_LRU_PERCPU_HASH (a bucket per source and CPU: a
//!   source's limit becomes per CPU; measured for its cost only);
//! - `cand_hash`: a preallocated BPF_MAP_TYPE_HASH (no eviction: full means no new
//!   source gets a bucket);
//! - `cand_sketch`: the limiter's sketch of GCRA cells (limiter_common::sketch);
//! - `cand_sketch_line`: the same cells, a source's two in one cache line (a line picked
//!   by the hash, one cell in each half of it): one cache and TLB miss per new source
//!   instead of two, for more correlated collisions.

use core::intrinsics::{atomic_cxchg, AtomicOrdering};

use aya_ebpf::{
    bindings::{xdp_action, BPF_F_NO_COMMON_LRU},
    btf_maps::{Array, HashMap, LruHashMap, LruPerCpuHashMap},
    helpers::generated::bpf_ktime_get_coarse_ns,
    macros::{btf_map, xdp},
    programs::XdpContext,
};
use limiter_common::{
    abi::{Bucket, SourceKey},
    gcra::{self, Limit, TICKS_PER_SECOND},
    sketch::{self, SketchMeta},
};

/// Overridden by the bench.
const ENTRIES: usize = 64;
const NO_COMMON_LRU: usize = BPF_F_NO_COMMON_LRU as usize;
const BPF_NOEXIST: u64 = 1;

/// Rate 1/s, burst 1, as `gcra::Limit::new(Event, 1, 1)` compiles it.
const COST: u64 = TICKS_PER_SECOND;
const TOLERANCE: u64 = TICKS_PER_SECOND;
const LIMIT: Limit = Limit {
    interval: TICKS_PER_SECOND << gcra::FRAC_BITS,
    tolerance: TOLERANCE,
};

#[btf_map]
static CAND_LRU: LruHashMap<SourceKey, Bucket, ENTRIES> = LruHashMap::new();
#[btf_map]
static CAND_LRU_NOCOM: LruHashMap<SourceKey, Bucket, ENTRIES, NO_COMMON_LRU> = LruHashMap::new();
#[btf_map]
static CAND_LRU_PCPU: LruPerCpuHashMap<SourceKey, Bucket, ENTRIES> = LruPerCpuHashMap::new();
#[btf_map]
static CAND_HASH: HashMap<SourceKey, Bucket, ENTRIES> = HashMap::new();
#[btf_map]
static CAND_SKETCH: Array<Bucket, ENTRIES> = Array::new();
#[btf_map]
static CAND_SKETCH_META: Array<SketchMeta, 1> = Array::new();
/// Page-aligned (BPF_F_MMAPABLE), so 8-cell groups are cache lines.
#[btf_map]
static CAND_SKETCH_LINE: Array<Bucket, ENTRIES, PAGE_ALIGNED> = Array::new();
const PAGE_ALIGNED: usize = aya_ebpf::bindings::BPF_F_MMAPABLE as usize;

const ETH_HLEN: usize = 14;
const IPV4_SRC_OFFSET: usize = ETH_HLEN + 12;

#[inline(always)]
fn source_key(ctx: &XdpContext) -> Option<SourceKey> {
    let (data, end) = (ctx.data(), ctx.data_end());
    if data + IPV4_SRC_OFFSET + 4 > end {
        return None;
    }
    // SAFETY: bounds checked just above.
    let src = unsafe { *((data + IPV4_SRC_OFFSET) as *const u32) };
    Some(SourceKey::masked_words(0, 4, &[src, 0, 0, 0], 32, 128))
}

#[inline(always)]
fn now() -> u64 {
    // SAFETY: a helper without arguments.
    gcra::ticks_from_ns(unsafe { bpf_ktime_get_coarse_ns() })
}

/// The limiter's CAS step (meter.rs), without the contention counter.
#[inline(always)]
fn step(tat: *mut u64, now: u64, reset_beyond: u64) -> bool {
    for _ in 0..8 {
        // SAFETY: `tat` points into a map value; aligned 8-byte loads are atomic.
        let old = unsafe { core::ptr::read_volatile(tat) };
        let next = gcra::conform_within(old, now, COST, TOLERANCE, reset_beyond);
        if next.tat == old {
            return next.admit;
        }
        // SAFETY: as above; SeqCst for the fetching BPF_CMPXCHG.
        let (_, swapped) = unsafe {
            atomic_cxchg::<u64, { AtomicOrdering::SeqCst }, { AtomicOrdering::SeqCst }>(
                tat, old, next.tat,
            )
        };
        if swapped {
            return next.admit;
        }
    }
    true
}

#[inline(always)]
fn verdict(admit: bool) -> u32 {
    if admit {
        xdp_action::XDP_PASS
    } else {
        xdp_action::XDP_DROP
    }
}

/// Lookup, else insert a bucket whose first frame this is (meter.rs before the sketch).
macro_rules! hashed_candidate {
    ($name:ident, $map:ident) => {
        #[xdp]
        pub fn $name(ctx: XdpContext) -> u32 {
            let Some(key) = source_key(&ctx) else {
                return xdp_action::XDP_PASS;
            };
            let now = now();
            if let Some(bucket) = $map.get_ptr_mut(&key) {
                // SAFETY: a map value.
                let tat = unsafe { &raw mut (*bucket).tat };
                return verdict(step(tat, now, TOLERANCE + gcra::CLOCK_SKEW_MARGIN));
            }
            let first = gcra::conform(0, now, COST, TOLERANCE);
            // A failed insert (full, raced) passes unmetered, as the limiter did.
            let _ = $map.insert(&key, Bucket { tat: first.tat }, BPF_NOEXIST);
            verdict(first.admit)
        }
    };
}

hashed_candidate!(cand_lru, CAND_LRU);
hashed_candidate!(cand_lru_nocommon, CAND_LRU_NOCOM);
hashed_candidate!(cand_lru_percpu, CAND_LRU_PCPU);
hashed_candidate!(cand_hash, CAND_HASH);

/// The limiter's sketch step (meter.rs): the least advanced cell decides, the other is
/// charged too when the frame is admitted.
#[inline(always)]
fn meter_cells(first: Option<*mut Bucket>, second: Option<*mut Bucket>, now: u64) -> u32 {
    let (Some(first), Some(second)) = (first, second) else {
        return xdp_action::XDP_PASS;
    };
    // SAFETY: map values.
    let (first, second) = unsafe { (&raw mut (*first).tat, &raw mut (*second).tat) };
    let (a, b) = unsafe {
        (
            core::ptr::read_volatile(first),
            core::ptr::read_volatile(second),
        )
    };
    let (decider, other) = if sketch::lead(b, now) < sketch::lead(a, now) {
        (second, first)
    } else {
        (first, second)
    };
    if !step(decider, now, sketch::CELL_RESET_BEYOND) {
        return xdp_action::XDP_DROP;
    }
    for _ in 0..8 {
        // SAFETY: as above.
        let old = unsafe { core::ptr::read_volatile(other) };
        let next = sketch::charge_cell(old, now, COST);
        let (_, swapped) = unsafe {
            atomic_cxchg::<u64, { AtomicOrdering::SeqCst }, { AtomicOrdering::SeqCst }>(
                other, old, next,
            )
        };
        if swapped {
            break;
        }
    }
    xdp_action::XDP_PASS
}

#[xdp]
pub fn cand_sketch_line(ctx: XdpContext) -> u32 {
    let Some(key) = source_key(&ctx) else {
        return xdp_action::XDP_PASS;
    };
    let Some(meta) = CAND_SKETCH_META.get(0) else {
        return xdp_action::XDP_PASS;
    };
    let now = now();
    let hash = sketch::hash(&meta.seed, &key, &LIMIT);
    // ROWS * width cells = lines of 8; a line, then a cell in each half.
    let lines_mask = (meta.width_mask + 1) / 4 - 1;
    let line = (hash as u32 & lines_mask) * 8;
    let a = line + ((hash >> 32) as u32 & 3);
    let b = line + 4 + ((hash >> 34) as u32 & 3);
    meter_cells(
        CAND_SKETCH_LINE.get_ptr_mut(a),
        CAND_SKETCH_LINE.get_ptr_mut(b),
        now,
    )
}

#[xdp]
pub fn cand_sketch(ctx: XdpContext) -> u32 {
    let Some(key) = source_key(&ctx) else {
        return xdp_action::XDP_PASS;
    };
    let Some(meta) = CAND_SKETCH_META.get(0) else {
        return xdp_action::XDP_PASS;
    };
    let now = now();
    let hash = sketch::hash(&meta.seed, &key, &LIMIT);
    meter_cells(
        CAND_SKETCH.get_ptr_mut(sketch::cell_index(
            hash,
            0,
            meta.width_mask,
            sketch::WHOLE_ROW,
        )),
        CAND_SKETCH.get_ptr_mut(sketch::cell_index(
            hash,
            1,
            meta.width_mask,
            sketch::WHOLE_ROW,
        )),
        now,
    )
}
