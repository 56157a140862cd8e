//! Metering and the verdict: a frame must conform to the rule's per-source limit and to
//! its aggregate limit. Buckets are single u64s updated by compare-and-swap with the
//! GCRA step from limiter-common, so concurrent CPUs never over-admit.

use core::intrinsics::{atomic_cxchg, atomic_xadd, AtomicOrdering};

use aya_ebpf::{
    bindings::xdp_action,
    helpers::{bpf_ktime_get_ns, generated::bpf_jiffies64},
};
use limiter_common::{
    abi::{
        rule_index, Bucket, RuleCounters, SourceKey, RULE_CLOSED_UNTIL_LAPSE, RULE_FAIL_STATIC,
        RULE_HAS_AGGREGATE, RULE_HAS_PER_SOURCE, RULE_IN_USE, RULE_SHADOW, RULE_TICK_CLOCK,
        UNIT_BYTES, UNIT_SYN,
    },
    clock::TickClock,
    gcra::{self, Limit},
};

use crate::{count_global, maps, parse::Packet};

/// CAS attempts before a frame is passed unmetered (and counted as `contended`). Each
/// failed attempt means another CPU just updated the bucket; running out takes sustained
/// contention far beyond what the rates we meter produce.
const CAS_ATTEMPTS: usize = 8;

const BPF_NOEXIST: u64 = 1;
const EEXIST: i32 = 17;

enum Outcome {
    Admit,
    Reject,
    /// The bucket could not be updated; the frame is not metered by it.
    Unmetered,
}

/// How much one run of the program carries: one frame at XDP; at TC, one socket buffer,
/// which GRO may have built from several packets (all metered, passed or dropped together).
#[derive(Clone, Copy)]
pub struct Size {
    pub packets: u64,
    pub bytes: u64,
}

/// The verdict of the rule in `slot` on a frame; with `refuse_unmetered`, refused
/// without metering (decide.rs: a frame that could carry a datagram past the rule).
#[inline(always)]
pub fn meter(
    generation: u32,
    slot: u32,
    pkt: &Packet,
    size: Size,
    refuse_unmetered: bool,
) -> Result<u32, ()> {
    let rule = maps::RULES.get(rule_index(generation, slot)).ok_or(())?;
    let cpu_state = maps::RULE_COUNTERS.get_ptr_mut(slot).ok_or(())?;
    // SAFETY: per-CPU value, touched only by this CPU's program run.
    let cpu_state = unsafe { &mut *cpu_state };
    let counters = &mut cpu_state.counters;
    let flags = rule.flags;
    if flags & RULE_IN_USE == 0 {
        return Ok(pass(counters, size));
    }
    if refuse_unmetered {
        return Ok(refuse(counters, size, flags));
    }
    let units = match rule.unit {
        UNIT_SYN if !pkt.syn => return Ok(pass(counters, size)),
        UNIT_BYTES => size.bytes,
        // A SYN is never coalesced: one connection attempt. Counted as offered here, on
        // the SYN path alone, for the fleet's demand in SYNs.
        UNIT_SYN => {
            count_syn(slot);
            1
        }
        _ => size.packets,
    };
    let precise = flags & RULE_TICK_CLOCK == 0;
    // A closed share refuses everything: its lease deadline needs no precise clock.
    let closed = flags & RULE_CLOSED_UNTIL_LAPSE != 0;
    let mut now_ns = if precise && !closed {
        precise_ns()
    } else {
        tick_ns(&mut cpu_state.clock)
    };
    // FAIL_OPEN is applied here, on the kernel's clock, so it happens on time even when
    // the daemon is dead.
    let fail_open_at = rule.fail_open_at_ns;
    if fail_open_at != 0
        && flags & RULE_FAIL_STATIC == 0
        && (now_ns.wrapping_sub(fail_open_at) as i64) >= 0
    {
        return Ok(pass(counters, size));
    }
    // A zero share refuses everything until its lease lapses, without touching a bucket;
    // then the aggregate (the bootstrap share) meters, as for a host joining mid-outage.
    if closed {
        if (now_ns.wrapping_sub(rule.lease_expires_ns) as i64) < 0 {
            return Ok(refuse(counters, size, flags));
        }
        if precise {
            now_ns = precise_ns();
        }
    }
    let now = gcra::ticks_from_ns(now_ns);

    let mut source_charge: Option<(*mut u64, u64)> = None;
    let mut conforms = true;
    if flags & RULE_HAS_PER_SOURCE != 0 {
        let limit = &rule.per_source;
        let cost = limit.cost(units);
        let key = SourceKey::masked_words(
            slot,
            pkt.family,
            &pkt.src,
            rule.source_prefix_v4,
            rule.source_prefix_v6,
        );
        match meter_source(&key, now, cost, limit) {
            (Outcome::Admit, tat) => source_charge = tat.map(|p| (p, cost)),
            (Outcome::Reject, _) => conforms = false,
            (Outcome::Unmetered, _) => {}
        }
    }
    if conforms && flags & RULE_HAS_AGGREGATE != 0 {
        let limit = &rule.aggregate;
        let bucket = maps::AGG_BUCKETS.get_ptr_mut(slot).ok_or(())?;
        // SAFETY: array values live as long as the map; `tat` is only touched atomically
        // or by aligned 8-byte loads.
        let tat = unsafe { &raw mut (*bucket).bucket.tat };
        if let Outcome::Reject = step(tat, now, limit.cost(units), limit.tolerance) {
            conforms = false;
            // The source's bucket paid for a frame the aggregate refused: give it back,
            // so a source is not starved by congestion that others caused.
            if let Some((source_tat, cost)) = source_charge {
                unsafe {
                    atomic_xadd::<u64, u64, { AtomicOrdering::SeqCst }>(
                        source_tat,
                        cost.wrapping_neg(),
                    )
                };
            }
        }
    }

    if conforms {
        return Ok(pass(counters, size));
    }
    Ok(refuse(counters, size, flags))
}

/// One SYN offered to syn rule `slot` (this CPU's copy: a plain add, as the other
/// per-CPU counters).
#[inline(always)]
fn count_syn(slot: u32) {
    if let Some(syns) = maps::RULE_SYNS.get_ptr_mut(slot) {
        // SAFETY: per-CPU value, touched only by this CPU's program run.
        let syns = unsafe { &mut *syns };
        syns.offered = syns.offered.wrapping_add(1);
    }
}

/// A frame over the rule's limits: dropped, or passed and counted in shadow mode.
#[inline(always)]
fn refuse(counters: &mut RuleCounters, size: Size, flags: u32) -> u32 {
    if flags & RULE_SHADOW != 0 {
        counters.would_drop_packets = counters.would_drop_packets.wrapping_add(size.packets);
        counters.would_drop_bytes = counters.would_drop_bytes.wrapping_add(size.bytes);
        return pass(counters, size);
    }
    counters.dropped_packets = counters.dropped_packets.wrapping_add(size.packets);
    counters.dropped_bytes = counters.dropped_bytes.wrapping_add(size.bytes);
    xdp_action::XDP_DROP
}

/// CLOCK_MONOTONIC in ns, precisely: a helper call (≈ 35 ns here).
#[inline(always)]
fn precise_ns() -> u64 {
    // SAFETY: a helper without arguments.
    unsafe { bpf_ktime_get_ns() }
}

/// CLOCK_MONOTONIC as this CPU read it at the rule's first frame of the current jiffy:
/// one inlined load and a compare on most frames (limiter_common::clock).
#[inline(always)]
fn tick_ns(clock: &mut TickClock) -> u64 {
    // SAFETY: a helper without arguments; the verifier inlines it into a load.
    let jiffies = unsafe { bpf_jiffies64() };
    clock.now(jiffies, precise_ns)
}

#[inline(always)]
fn pass(counters: &mut RuleCounters, size: Size) -> u32 {
    counters.passed_packets = counters.passed_packets.wrapping_add(size.packets);
    counters.passed_bytes = counters.passed_bytes.wrapping_add(size.bytes);
    xdp_action::XDP_PASS
}

/// One GCRA step applied to a bucket with compare-and-swap.
#[inline(always)]
fn step(tat: *mut u64, now: u64, cost: u64, tolerance: u64) -> Outcome {
    for _ in 0..CAS_ATTEMPTS {
        // SAFETY: `tat` points into a map value; aligned 8-byte loads are atomic.
        let old = unsafe { core::ptr::read_volatile(tat) };
        let next = gcra::conform(old, now, cost, tolerance);
        if next.tat == old {
            return if next.admit {
                Outcome::Admit
            } else {
                Outcome::Reject
            };
        }
        // SeqCst: the result is read, so it must be the fetching BPF_CMPXCHG.
        let (_, swapped) = unsafe {
            atomic_cxchg::<u64, { AtomicOrdering::SeqCst }, { AtomicOrdering::SeqCst }>(
                tat, old, next.tat,
            )
        };
        if swapped {
            return if next.admit {
                Outcome::Admit
            } else {
                Outcome::Reject
            };
        }
    }
    count_global(|g| &mut g.contended);
    Outcome::Unmetered
}

/// Meters one source; also returns its TAT pointer when it admitted (for a refund).
#[inline(always)]
fn meter_source(
    key: &SourceKey,
    now: u64,
    cost: u64,
    limit: &Limit,
) -> (Outcome, Option<*mut u64>) {
    for _ in 0..2 {
        if let Some(bucket) = maps::SRC_BUCKETS.get_ptr_mut(key) {
            let tat = unsafe { &raw mut (*bucket).tat };
            let outcome = step(tat, now, cost, limit.tolerance);
            return (outcome, Some(tat));
        }
        // A new source starts with a full bucket: this frame is its first.
        let first = gcra::conform(0, now, cost, limit.tolerance);
        match maps::SRC_BUCKETS.insert(key, Bucket { tat: first.tat }, BPF_NOEXIST) {
            Ok(()) => {
                let outcome = if first.admit {
                    Outcome::Admit
                } else {
                    Outcome::Reject
                };
                return (outcome, None);
            }
            // Another CPU created it first: meter against theirs.
            Err(e) if e == -EEXIST => continue,
            Err(_) => break,
        }
    }
    count_global(|g| &mut g.insert_failures);
    (Outcome::Unmetered, None)
}
