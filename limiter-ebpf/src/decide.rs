//! From a parsed frame to a verdict: the rule it belongs to, then that rule's meters.
//!
//! A whole datagram is classified by its own headers. A frame that does not show what its
//! datagram is gets the verdict that holds for the datagram the destination reassembles
//! (README, "What each kind of frame gets"): a first fragment is metered like a whole
//! datagram and leaves a record of its ports; later fragments are
//! classified with that record; what could slip a datagram past a rule without the rule
//! seeing it — a first fragment without its transport header, a second first fragment
//! that disagrees with the record, a later fragment without a record whose rule depends
//! on ports, one that overwrites the first fragment's headers, an IPv6 header chain the
//! parser does not follow — is refused by the most specific rule the datagram could
//! belong to. The destination never completes a datagram whose first fragment was
//! refused, so it receives no more whole datagrams than the rule admits.

use aya_ebpf::{bindings::xdp_action, helpers::bpf_ktime_get_ns};
use limiter_common::{
    abi::{
        fragment_clock, fragment_record_fresh, FragmentKey, FragmentRecord, HeaderCounters,
        PrefixRules,
    },
    drop::DropReason,
};

use crate::{
    classify, count_global, maps,
    meter::{self, Size},
    monitor,
    parse::{kind, Packet},
};

const BPF_ANY: u64 = 0;

/// What a frame gets from the rules that cover its destination.
enum Action {
    /// Metered by the rule in this slot.
    Meter(u32),
    /// Refused without metering (it could carry a datagram past the rule): the rule's
    /// slot, and the reason above `REASON_SHIFT` ([`refusal`]). One word: an enum with
    /// a second field made LLVM pack a value the verifier knows as a pointer.
    Refuse(u32),
    /// No rule: passed.
    Unmatched,
}

#[inline(always)]
pub fn decide(generation: u32, pkt: &Packet, size: impl Fn() -> Size) -> Result<u32, ()> {
    let (slot, refuse) = match action(generation, pkt) {
        Action::Meter(slot) => (slot, 0),
        Action::Refuse(refusal) => (
            refusal & SLOT_MASK,
            meter::METER_REFUSE | (refusal >> REASON_SHIFT) << meter::METER_REASON_SHIFT,
        ),
        Action::Unmatched => return Ok(unmatched()),
    };
    // The frame's size only now: the multi-buffer build reads it with a helper call, the
    // TC build from its socket buffer (carried through the parser and the classifier, the
    // ranges the verifier knows of it kept their states apart: 640 k instructions
    // processed instead of 88 k).
    let size = size();
    let input = meter::MeterInput {
        generation,
        slot,
        family: pkt.family,
        flags: refuse | if pkt.syn { meter::METER_SYN } else { 0 },
        packets: size.packets,
        bytes: size.bytes,
        src: pkt.src,
    };
    let result = meter::meter(&input);
    if result & monitor::REFUSED != 0 {
        monitor::stash(
            generation,
            slot,
            result,
            &monitor::Headers {
                family: pkt.family,
                proto: u32::from(pkt.proto),
                src: &pkt.src,
                dst: &pkt.dst,
                dst_port: if pkt.has_ports { pkt.dst_port } else { 0 },
            },
        );
    }
    Ok(result)
}

/// Where [`Action::Refuse`] carries the reason.
const REASON_SHIFT: u32 = 16;
/// Its slot (at most `MAX_RULES`, below `1 << REASON_SHIFT`).
const SLOT_MASK: u32 = (1 << REASON_SHIFT) - 1;
const _: () = assert!(limiter_common::abi::MAX_RULES <= SLOT_MASK);

/// [`Action::Refuse`] of `slot` for `reason`.
#[inline(always)]
fn refusal(slot: u32, reason: DropReason) -> Action {
    Action::Refuse(slot | (reason as u32) << REASON_SHIFT)
}

/// What the rules that cover the frame's destination do with it (a first fragment's
/// record is written here, before the meter).
#[inline(always)]
fn action(generation: u32, pkt: &Packet) -> Action {
    let Some(rules) = classify::candidates(generation, pkt) else {
        if pkt.kind != kind::WHOLE {
            count_kind(pkt.kind);
        }
        return Action::Unmatched;
    };
    if pkt.kind == kind::WHOLE {
        matched(classify::first_match_inline(rules, pkt))
    } else {
        count_kind(pkt.kind);
        partial(rules, pkt)
    }
}

#[inline(always)]
fn matched(slot: Option<u32>) -> Action {
    match slot {
        Some(slot) => Action::Meter(slot),
        None => Action::Unmatched,
    }
}

/// Every kind but a whole datagram, whose destination the rules cover. The meters see
/// the frame itself: a later fragment is never a SYN (a datagram's SYN is metered with
/// its first fragment).
#[inline(always)]
fn partial(rules: &PrefixRules, pkt: &Packet) -> Action {
    match pkt.kind {
        kind::FIRST_FRAGMENT => {
            let now = fragment_now();
            if contradicts_record(pkt, now) {
                // A second first fragment under the identification of a datagram that
                // may still be in reassembly, with other headers: the destination keeps
                // the first one (a later offset-0 fragment is a duplicate or an overlap
                // to it), so passing this one could only let the later fragments ride
                // on headers the destination never uses.
                count_headers(|h| &mut h.overlapping_fragments);
                let mut datagram = *pkt;
                datagram.has_ports = false;
                return refuse(
                    rules,
                    classify::first_match(rules, pkt),
                    &datagram,
                    DropReason::OverlappingFragment,
                );
            }
            remember_first(pkt, now);
            matched(classify::first_match(rules, pkt))
        }
        kind::LATER_PORTLESS => matched(classify::first_match(rules, pkt)),
        kind::LATER_FRAGMENT => later_fragment(rules, pkt),
        // Tiny fragments and unfollowed chains: no legitimate sender needs them, and what
        // the destination would make of them cannot be known here.
        _ => match classify::first_possible(rules, pkt) {
            Some((slot, _)) => refusal(
                slot,
                if pkt.kind == kind::TINY_FRAGMENT {
                    DropReason::TinyFragment
                } else {
                    DropReason::LongHeaderChain
                },
            ),
            None => Action::Unmatched,
        },
    }
}

#[inline(always)]
fn later_fragment(rules: &PrefixRules, pkt: &Packet) -> Action {
    let key = fragment_key(pkt);
    // Copied out at once, by volatile loads: every field is loaded here, on every path.
    // With plain loads LLVM leaves a field unloaded on paths where it is dead and still
    // spills its register there, which the verifier refuses (seen in the libxdp build).
    // SAFETY: a map value pointer the lookup just returned.
    let record = maps::FRAGMENTS
        .get_ptr(&key)
        .map(|p| unsafe { core::ptr::read_volatile(p) });
    let Some(record) = record else {
        // Its first fragment did not pass here (refused, not seen yet, or never sent).
        return match classify::first_possible(rules, pkt) {
            // The rule does not depend on what the first fragment would show.
            Some((slot, true)) => Action::Meter(slot),
            Some((slot, false)) => {
                count_headers(|h| &mut h.orphan_fragments);
                refusal(slot, DropReason::OrphanFragment)
            }
            None => Action::Unmatched,
        };
    };
    let mut datagram = *pkt;
    datagram.proto = record.proto;
    datagram.has_ports = record.has_ports != 0;
    datagram.dst_port = record.dst_port;
    let slot = classify::first_match(rules, &datagram);
    if pkt.frag_offset < u32::from(record.first_end) {
        // It would overwrite part of the first fragment — the headers it was classified
        // by (RFC 1858's overlapping fragments), ports included where IPv6 extension
        // headers come first. Refused by the first fragment's rule, or by any rule the
        // rewritten datagram could belong to.
        count_headers(|h| &mut h.overlapping_fragments);
        datagram.has_ports = false;
        return refuse(rules, slot, &datagram, DropReason::OverlappingFragment);
    }
    matched(slot)
}

/// Refused by `slot`, or else by the most specific rule `datagram` could belong to.
#[inline(always)]
fn refuse(rules: &PrefixRules, slot: Option<u32>, datagram: &Packet, reason: DropReason) -> Action {
    match slot.or_else(|| classify::first_possible(rules, datagram).map(|(s, _)| s)) {
        Some(slot) => refusal(slot, reason),
        None => Action::Unmatched,
    }
}

/// Whether a fresh record of this datagram (one that may still be in reassembly at the
/// destination) says other than this first fragment. One that agrees is a duplicate:
/// metered, and it refreshes the record.
#[inline(always)]
fn contradicts_record(pkt: &Packet, now: u16) -> bool {
    // Copied out at once, as in later_fragment.
    // SAFETY: a map value pointer the lookup just returned.
    let Some(record) = maps::FRAGMENTS
        .get_ptr(&fragment_key(pkt))
        .map(|p| unsafe { core::ptr::read_volatile(p) })
    else {
        return false;
    };
    fragment_record_fresh(pkt.family, record.passed_at, now)
        && record != first_record(pkt, record.passed_at)
}

/// A first fragment leaves its ports for the rest of its datagram. Only one that found
/// no fresh record, or one that agrees with it, gets here. Whether it passes does not
/// matter (the destination never completes a datagram without it): deciding after the
/// meters costs the verifier too much (see decide).
#[inline(always)]
fn remember_first(pkt: &Packet, now: u16) {
    let record = first_record(pkt, now);
    // A failed insert (no memory) leaves the later fragments to the orphan rule.
    let _ = maps::FRAGMENTS.insert(&fragment_key(pkt), &record, BPF_ANY);
}

#[inline(always)]
fn first_record(pkt: &Packet, passed_at: u16) -> FragmentRecord {
    FragmentRecord {
        dst_port: pkt.dst_port,
        proto: pkt.proto,
        has_ports: u8::from(pkt.has_ports),
        // At most 65536 / 8 (limiter_common::abi checks it fits).
        first_end: pkt.frag_offset as u16,
        passed_at,
    }
}

/// The records' clock (limiter_common::abi::fragment_clock); first fragments only.
#[inline(always)]
fn fragment_now() -> u16 {
    // SAFETY: a helper without arguments.
    fragment_clock(unsafe { bpf_ktime_get_ns() })
}

#[inline(always)]
fn fragment_key(pkt: &Packet) -> FragmentKey {
    FragmentKey {
        family: pkt.family as u16,
        proto: if pkt.family == 4 {
            u16::from(pkt.proto)
        } else {
            0
        },
        id: pkt.frag_id,
        src: pkt.src,
        dst: pkt.dst,
    }
}

#[inline(always)]
fn unmatched() -> u32 {
    count_global(|g| &mut g.unmatched);
    xdp_action::XDP_PASS
}

/// Counts a frame of a kind other than a whole datagram.
#[inline(always)]
fn count_kind(kind: u32) {
    match kind {
        kind::TINY_FRAGMENT => count_headers(|h| {
            h.fragments = h.fragments.wrapping_add(1);
            &mut h.tiny_fragments
        }),
        kind::LONG_CHAIN => count_headers(|h| &mut h.long_header_chains),
        _ => count_headers(|h| &mut h.fragments),
    }
}

/// Increments one header counter on this CPU.
#[inline(always)]
pub(crate) fn count_headers(field: impl FnOnce(&mut HeaderCounters) -> &mut u64) {
    if let Some(h) = maps::HEADER_COUNTERS.get_ptr_mut(0) {
        // SAFETY: a per-CPU array value, touched only by this CPU's program run.
        let counter = field(unsafe { &mut *h });
        *counter = counter.wrapping_add(1);
    }
}
