//! Metering and the verdict: a frame must conform to the rule's per-source limit and to
//! its aggregate limit. Buckets (and the per-source sketch's cells) are single u64s
//! updated by compare-and-swap with the GCRA step from limiter-common, so concurrent CPUs
//! never over-admit.

use core::intrinsics::{atomic_cxchg, atomic_xadd, AtomicOrdering};

use aya_ebpf::{
    bindings::xdp_action,
    helpers::{bpf_ktime_get_ns, generated::bpf_jiffies64},
};
use limiter_common::{
    abi::{
        rule_index, AddrWords, RuleConfig, RuleCounters, SourceKey, RULE_CANARY,
        RULE_CLOSED_UNTIL_LAPSE, RULE_FAIL_STATIC, RULE_HAS_AGGREGATE, RULE_HAS_PER_SOURCE,
        RULE_IN_USE, RULE_SHADOW, RULE_SOURCES_ASIDE, RULE_TICK_CLOCK, UNIT_BYTES, UNIT_SYN,
    },
    canary,
    clock::TickClock,
    drop::DropReason,
    gcra::{self, Limit},
    share::ShareState,
    sketch::{self, SketchCounters},
};

use crate::{count_global, maps, monitor};

/// CAS attempts before a frame is passed unmetered (and counted as `contended`). Each
/// failed attempt means another CPU just updated the bucket; running out takes sustained
/// contention far beyond what the rates we meter produce.
const CAS_ATTEMPTS: usize = 8;

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

/// What the meters read of a frame: one struct whatever the frame's kind, family or
/// build, built only where a rule meters (nothing the meter needs is carried through the
/// parser and the classifier, where every value the verifier knows multiplies its states).
#[repr(C)]
pub struct MeterInput {
    pub generation: u32,
    pub slot: u32,
    pub family: u32,
    /// `METER_SYN`, `METER_REFUSE`, and with `METER_REFUSE` the reason
    /// (`limiter_common::drop::DropReason`) shifted by `METER_REASON_SHIFT`.
    pub flags: u32,
    pub packets: u64,
    pub bytes: u64,
    pub src: AddrWords,
}

/// The frame is a TCP SYN without ACK.
pub const METER_SYN: u32 = 1;
/// Refused without metering (decide.rs: a frame that could carry a datagram past the
/// rule).
pub const METER_REFUSE: u32 = 2;
/// Where `MeterInput::flags` carries a refusal's reason.
pub const METER_REASON_SHIFT: u32 = 8;

/// The verdict of the rule in `input.slot` on a frame; a refusal's carries
/// `monitor::REFUSED` and its reason (`monitor::refused`).
#[inline(always)]
pub fn meter(input: &MeterInput) -> u32 {
    let size = Size {
        packets: input.packets,
        bytes: input.bytes,
    };
    // Only a missing map entry fails (fixed-size arrays: it cannot happen): pass.
    meter_rule(input, size).unwrap_or(xdp_action::XDP_PASS)
}

#[inline(always)]
fn meter_rule(input: &MeterInput, size: Size) -> Result<u32, ()> {
    let slot = input.slot;
    let refuse_unmetered = input.flags & METER_REFUSE != 0;
    let rule = maps::RULES
        .get(rule_index(input.generation, slot))
        .ok_or(())?;
    let cpu_state = maps::RULE_COUNTERS.get_ptr_mut(slot).ok_or(())?;
    // SAFETY: per-CPU value, touched only by this CPU's program run.
    let cpu_state = unsafe { &mut *cpu_state };
    let counters = &mut cpu_state.counters;
    let mut flags = rule.flags;
    if flags & RULE_IN_USE == 0 {
        return Ok(pass(counters, size));
    }
    if refuse_unmetered {
        if rule.unit != UNIT_SYN {
            refused_early(counters, size);
        }
        let reason = (input.flags >> METER_REASON_SHIFT) & 0xff;
        return Ok(refuse(counters, size, flags, slot, reason));
    }
    let units = match rule.unit {
        UNIT_SYN if input.flags & METER_SYN == 0 => return Ok(pass(counters, size)),
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
    // the daemon is dead. It opens the fleet's share, the aggregate: a per-source limit
    // needs no allocator and keeps holding.
    let fail_open_at = rule.fail_open_at_ns;
    if fail_open_at != 0
        && flags & RULE_FAIL_STATIC == 0
        && (now_ns.wrapping_sub(fail_open_at) as i64) >= 0
    {
        if flags & RULE_HAS_PER_SOURCE == 0 {
            return Ok(pass(counters, size));
        }
        flags &= !RULE_HAS_AGGREGATE;
    }
    // A zero share refuses everything until its lease lapses, without touching a bucket;
    // then the aggregate (the bootstrap share) meters, as for a host joining mid-outage.
    if closed {
        if (now_ns.wrapping_sub(rule.lease_expires_ns) as i64) < 0 {
            return Ok(refuse(
                counters,
                size,
                canary_flags(rule, input, flags),
                slot,
                DropReason::ShareClosed as u32,
            ));
        }
        if precise {
            now_ns = precise_ns();
        }
    }
    let now = gcra::ticks_from_ns(now_ns);

    // The cells that admitted the frame (null: none), and what they were charged.
    let mut charged: Charged = [core::ptr::null_mut(); sketch::ROWS as usize];
    let mut source_cost = 0;
    let mut conforms = true;
    let mut reason = DropReason::Aggregate as u32;
    if flags & RULE_HAS_PER_SOURCE != 0 {
        let limit = &rule.per_source;
        let cost = limit.cost(units);
        let key = SourceKey::masked_words(
            slot,
            input.family,
            &input.src,
            rule.source_prefix_v4,
            rule.source_prefix_v6,
        );
        let aside = flags & RULE_SOURCES_ASIDE != 0;
        match meter_source(
            &key,
            now,
            cost,
            limit,
            rule.sketch_region,
            aside,
            &mut charged,
        ) {
            Outcome::Admit => source_cost = cost,
            Outcome::Reject => {
                conforms = false;
                reason = DropReason::PerSource as u32;
                refused_early(counters, size);
            }
            Outcome::Unmetered => {}
        }
    }
    if conforms && flags & RULE_HAS_AGGREGATE != 0 {
        let limit = &rule.aggregate;
        let bucket = maps::AGG_BUCKETS.get_ptr_mut(slot).ok_or(())?;
        // SAFETY: array values live as long as the map; `tat` is only touched atomically
        // or by aligned 8-byte loads.
        let tat = unsafe { &raw mut (*bucket).bucket.tat };
        let tolerance = limit.tolerance;
        let reset_beyond = tolerance + gcra::CLOCK_SKEW_MARGIN;
        if let Outcome::Reject = step(tat, now, limit.cost(units), tolerance, reset_beyond) {
            // The fleet's credit admits what the bucket refuses, while the lease holds
            // (a share past its deadline is the allocator's no longer: no credit).
            let leased = (now_ns.wrapping_sub(rule.lease_expires_ns) as i64) < 0;
            // SAFETY: as `tat`: the word after it in the same map value.
            let credit = unsafe { &raw mut (*bucket).credit };
            if !(leased && spend_credit(credit, units)) {
                conforms = false;
                // A fleet rule's aggregate is this host's share of the fleet's.
                if rule.share_state != ShareState::Standalone as u32 {
                    reason = DropReason::ShareSpent as u32;
                }
                // The source's cells paid for a frame the aggregate refused: give it
                // back, so a source is not starved by congestion that others caused.
                if source_cost != 0 {
                    refund(&charged, source_cost);
                }
            }
        }
    }

    if conforms {
        return Ok(pass(counters, size));
    }
    Ok(refuse(
        counters,
        size,
        canary_flags(rule, input, flags),
        slot,
        reason,
    ))
}

/// `flags` for a refusal by the rule's limits: with the shadow bit added when the rule is
/// a canary and the source is outside it, so the frame passes as a would-drop. Evasions
/// refused before the meters (`METER_REFUSE`) do not come here: no honest sender
/// produces one, so a canary drops them as a fully enforcing rule does.
#[inline(always)]
fn canary_flags(rule: &RuleConfig, input: &MeterInput, flags: u32) -> u32 {
    if enforced(rule, input) {
        flags
    } else {
        flags | RULE_SHADOW
    }
}

/// Whether the rule enforces for the frame's source (limiter_common::canary: keyed by
/// the sketch's secret seed). Read only when a frame is refused.
#[inline(always)]
fn enforced(rule: &RuleConfig, input: &MeterInput) -> bool {
    if rule.flags & RULE_CANARY == 0 {
        return true;
    }
    // A fixed-size array: the lookup cannot fail; if it did, the rule enforces.
    let Some(meta) = maps::SKETCH_META.get(0) else {
        return true;
    };
    canary::enforced(rule, &meta.seed, input.family, &input.src)
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

/// A frame refused before the aggregate: no demand for the fleet's share.
#[inline(always)]
fn refused_early(counters: &mut RuleCounters, size: Size) {
    counters.refused_early_packets = counters.refused_early_packets.wrapping_add(size.packets);
    counters.refused_early_bytes = counters.refused_early_bytes.wrapping_add(size.bytes);
}

/// A frame over the rule's limits: dropped, or passed and counted in shadow mode; counted
/// under `reason` too, in the same packets (a TC run's `gso_segs`), so a rule's reasons
/// add up to its dropped and would-drop packets.
#[inline(always)]
fn refuse(counters: &mut RuleCounters, size: Size, flags: u32, slot: u32, reason: u32) -> u32 {
    if flags & RULE_SHADOW != 0 {
        counters.would_drop_packets = counters.would_drop_packets.wrapping_add(size.packets);
        counters.would_drop_bytes = counters.would_drop_bytes.wrapping_add(size.bytes);
        monitor::count_reason(slot, reason, true, size.packets);
        return monitor::refused(pass(counters, size), reason);
    }
    counters.dropped_packets = counters.dropped_packets.wrapping_add(size.packets);
    counters.dropped_bytes = counters.dropped_bytes.wrapping_add(size.bytes);
    monitor::count_reason(slot, reason, false, size.packets);
    monitor::refused(xdp_action::XDP_DROP, reason)
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

/// One GCRA step applied to a bucket with compare-and-swap (`reset_beyond`: see
/// `gcra::conform_within`; a rule's own bucket uses `tolerance + CLOCK_SKEW_MARGIN`).
#[inline(always)]
fn step(tat: *mut u64, now: u64, cost: u64, tolerance: u64, reset_beyond: u64) -> Outcome {
    for _ in 0..CAS_ATTEMPTS {
        // SAFETY: `tat` points into a map value; aligned 8-byte loads are atomic.
        let old = unsafe { core::ptr::read_volatile(tat) };
        let next = gcra::conform_within(old, now, cost, tolerance, reset_beyond);
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

/// Takes `units` from the fleet's credit (limiter_common::abi::AggBucket) by
/// compare-and-swap; false when less is left (nothing taken) or the swap kept losing
/// races (counted as `contended`: the frame is refused, never admitted twice).
#[inline(always)]
fn spend_credit(credit: *mut u64, units: u64) -> bool {
    for _ in 0..CAS_ATTEMPTS {
        // SAFETY: `credit` points into a map value; aligned 8-byte loads are atomic.
        let old = unsafe { core::ptr::read_volatile(credit) };
        if old < units {
            return false;
        }
        // SeqCst: the result is read, so it must be the fetching BPF_CMPXCHG.
        let (_, swapped) = unsafe {
            atomic_cxchg::<u64, { AtomicOrdering::SeqCst }, { AtomicOrdering::SeqCst }>(
                credit,
                old,
                old - units,
            )
        };
        if swapped {
            return true;
        }
    }
    count_global(|g| &mut g.contended);
    false
}

// meter_source reads a source's cells as a pair.
const _: () = assert!(sketch::ROWS == 2);

/// The cells a source was charged in, for a refund (null: not charged).
type Charged = [*mut u64; sketch::ROWS as usize];

/// Meters one source in the sketch (limiter_common::sketch): the least advanced of its
/// cells decides, by the usual compare-and-swap step; an admitted frame is then charged to
/// the other cell too, admitting or not, so both stay upper bounds of the source's own
/// bucket. On admission `charged` holds both cells (for the aggregate's refund). With
/// `aside` (the rule's cells are saturated: they refuse honest sources too) a refusal
/// reads as unmetered, leaving the frame to the aggregate; it charged nothing either way.
#[inline(always)]
fn meter_source(
    key: &SourceKey,
    now: u64,
    cost: u64,
    limit: &Limit,
    region: u32,
    aside: bool,
    charged: &mut Charged,
) -> Outcome {
    let Some(meta) = maps::SKETCH_META.get(0) else {
        return Outcome::Unmetered;
    };
    let mask = meta.width_mask;
    let seed = meta.seed;
    if mask == 0 {
        // Not set up yet: the daemon writes the seed before any rule.
        count_global(|g| &mut g.sketch_unseeded);
        return Outcome::Unmetered;
    }
    let hash = sketch::hash(&seed, key, limit);
    let (Some(first), Some(second)) = (
        maps::SRC_SKETCH.get_ptr_mut(sketch::cell_index(hash, 0, mask, region)),
        maps::SRC_SKETCH.get_ptr_mut(sketch::cell_index(hash, 1, mask, region)),
    ) else {
        return Outcome::Unmetered;
    };
    // SAFETY: array values live as long as the map; touched atomically or by aligned
    // 8-byte loads.
    let (first, second) = unsafe { (&raw mut (*first).tat, &raw mut (*second).tat) };
    let (tat_first, tat_second) = unsafe {
        (
            core::ptr::read_volatile(first),
            core::ptr::read_volatile(second),
        )
    };
    let (decider, other) = if sketch::lead(tat_second, now) < sketch::lead(tat_first, now) {
        (second, first)
    } else {
        (first, second)
    };
    match step(
        decider,
        now,
        cost,
        limit.tolerance,
        sketch::CELL_RESET_BEYOND,
    ) {
        Outcome::Admit => {}
        Outcome::Reject => {
            count_sketch(|c| &mut c.refused);
            // The same state as an unmetered frame's from here on: no path of its own
            // for the verifier to walk.
            return if aside {
                Outcome::Unmetered
            } else {
                Outcome::Reject
            };
        }
        Outcome::Unmetered => return Outcome::Unmetered,
    }
    charge(other, now, cost);
    if sketch::at_rest(tat_first, now) && sketch::at_rest(tat_second, now) {
        count_sketch(|c| &mut c.new_sources);
    }
    *charged = [decider, other];
    Outcome::Admit
}

/// Charges a cell that did not decide (`sketch::charge_cell`), by compare-and-swap. Lost
/// races past `CAS_ATTEMPTS` leave the charge out and are counted as `contended`.
#[inline(always)]
fn charge(tat: *mut u64, now: u64, cost: u64) {
    for _ in 0..CAS_ATTEMPTS {
        // SAFETY: `tat` points into a map value; aligned 8-byte loads are atomic.
        let old = unsafe { core::ptr::read_volatile(tat) };
        let next = sketch::charge_cell(old, now, cost);
        // SeqCst: the result is read, so it must be the fetching BPF_CMPXCHG.
        let (_, swapped) = unsafe {
            atomic_cxchg::<u64, { AtomicOrdering::SeqCst }, { AtomicOrdering::SeqCst }>(
                tat, old, next,
            )
        };
        if swapped {
            return;
        }
    }
    count_global(|g| &mut g.contended);
}

/// Gives back `cost` to every cell charged for a frame that was refused after all.
#[inline(always)]
fn refund(charged: &Charged, cost: u64) {
    for &tat in charged {
        if !tat.is_null() {
            // SAFETY: a pointer into SRC_SKETCH taken in this run.
            unsafe {
                atomic_xadd::<u64, u64, { AtomicOrdering::SeqCst }>(tat, cost.wrapping_neg())
            };
        }
    }
}

/// Increments one sketch counter on this CPU.
#[inline(always)]
fn count_sketch(field: impl FnOnce(&mut SketchCounters) -> &mut u64) {
    if let Some(c) = maps::SKETCH_COUNTS.get_ptr_mut(0) {
        // SAFETY: a per-CPU array value, touched only by this CPU's program run.
        let counter = field(unsafe { &mut *c });
        *counter = counter.wrapping_add(1);
    }
}
