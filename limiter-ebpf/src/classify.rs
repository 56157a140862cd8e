//! Most specific rule for a packet: the candidates of its destination — from the
//! exact-address table when the destination is itself a rule prefix (/32, /128), else
//! from one longest-prefix lookup in the live generation's trie — then the first of them
//! (already ordered most specific first by the daemon) whose port and protocol fit.
//! Frames whose ports (or protocol) only a reassembled datagram shows get the most
//! specific rule they could belong to instead ([`first_possible`]).

use aya_ebpf::maps::lpm_trie::Key;
use limiter_common::abi::{
    addr_bytes, host_home_words, host_index, AddrWords, HostEntry, PrefixRules, HOST_PROBES,
    IPPROTO_TCP, IPPROTO_UDP, MAX_CANDIDATES,
};

use crate::{
    maps,
    parse::{Packet, PROTO_UNKNOWN},
};

/// Keeps the map lookup just before it at a call site of its own. LLVM merges the two
/// generations' lookups into one call with the map chosen before it; the verifier then
/// finds two maps at one call, cannot bind it to the trie's own lookup function and leaves
/// the generic helper, an indirect call (≈ 10 ns on every frame whose destination is no
/// rule's host, measured here). Instructions that differ (by a comment) cannot be merged;
/// one register move each. Not a comment alone: the kernel refuses the line information
/// of an instruction that is not there.
macro_rules! own_call_site {
    ($map:literal) => {{
        let mut mark = 0u64;
        // SAFETY: a move of a register to itself.
        unsafe {
            core::arch::asm!(
                concat!("{0} = {0} # ", $map),
                inout(reg) mark,
                options(nomem, nostack, preserves_flags),
            )
        };
        let _ = mark;
    }};
}

/// The rules whose destination prefix covers the packet's destination, most specific
/// first; `None` when no rule covers it.
#[inline(always)]
pub fn candidates(generation: u32, pkt: &Packet) -> Option<&'static PrefixRules> {
    if let Some(rules) = exact(generation, pkt) {
        return Some(rules);
    }
    if pkt.family == 4 {
        let key = Key::new(32, pkt.dst[0].to_ne_bytes());
        if generation & 1 == 0 {
            let rules = maps::PREFIXES_V4_0.get(&key);
            own_call_site!("PREFIXES_V4_0");
            rules
        } else {
            let rules = maps::PREFIXES_V4_1.get(&key);
            own_call_site!("PREFIXES_V4_1");
            rules
        }
    } else {
        let key = Key::new(128, addr_bytes(&pkt.dst));
        if generation & 1 == 0 {
            let rules = maps::PREFIXES_V6_0.get(&key);
            own_call_site!("PREFIXES_V6_0");
            rules
        } else {
            let rules = maps::PREFIXES_V6_1.get(&key);
            own_call_site!("PREFIXES_V6_1");
            rules
        }
    }
}

/// The exact-address table's entry for the destination: array reads the verifier
/// inlines, no helper call. `None` sends the lookup to the trie.
#[inline(always)]
fn exact(generation: u32, pkt: &Packet) -> Option<&'static PrefixRules> {
    let home = host_home_words(pkt.family, &pkt.dst);
    let words = if pkt.family == 4 { 1 } else { 4 };
    for probe in 0..HOST_PROBES {
        let entry = maps::HOSTS.get(host_index(generation, home, probe))?;
        if entry.family == 0 {
            return None;
        }
        if entry.family == pkt.family && same_words(entry_addr(entry), &pkt.dst, words) {
            return Some(&entry.rules);
        }
    }
    None
}

/// The entry's address as words: `addr` sits 4 bytes into a 4-aligned struct (map
/// values are 8-aligned), so word loads of it are aligned.
#[inline(always)]
fn entry_addr(entry: &HostEntry) -> &AddrWords {
    // SAFETY: same size, alignment 4 as argued above, every bit pattern valid.
    unsafe { &*(&raw const entry.addr).cast::<AddrWords>() }
}

/// The first `words` words of two addresses are equal.
#[inline(always)]
fn same_words(a: &AddrWords, b: &AddrWords, words: usize) -> bool {
    for w in 0..4 {
        if w >= words {
            break;
        }
        if a[w] != b[w] {
            return false;
        }
    }
    true
}

/// A global function's `Option` answer, a scalar: `FOUND` with the slot in the low bits.
const FOUND: u64 = 1 << 32;
/// `limiter_first_possible`: the rule is the only one the datagram could belong to.
const ONLY: u64 = 1 << 33;
/// `limiter_first_match`'s `port` argument: the packet shows a port (in the low bits).
const HAS_PORT: u32 = 1 << 16;

/// The rule of a packet whose headers are all known: the first candidate that matches
/// ([`Candidate::matches`](limiter_common::abi::Candidate::matches), the daemon's
/// definition too).
#[inline(always)]
pub fn first_match(rules: &PrefixRules, pkt: &Packet) -> Option<u32> {
    let port = if pkt.has_ports {
        HAS_PORT | u32::from(pkt.dst_port)
    } else {
        0
    };
    let found = limiter_first_match(rules, port, u32::from(pkt.proto));
    (found & FOUND != 0).then_some(found as u32)
}

/// [`first_match`] inlined, without a call: for a whole datagram, the hot path, where the
/// call would cost more than the verifier saves (a call and its return cost ≈ 7 ns here).
#[inline(always)]
pub fn first_match_inline(rules: &PrefixRules, pkt: &Packet) -> Option<u32> {
    let port = pkt.has_ports.then_some(pkt.dst_port);
    scan_match(rules, port, pkt.proto)
}

#[inline(always)]
fn scan_match(rules: &PrefixRules, port: Option<u16>, proto: u8) -> Option<u32> {
    let count = rules.count as usize;
    for i in 0..MAX_CANDIDATES {
        if i >= count {
            break;
        }
        let c = &rules.candidates[i];
        if c.matches(port, proto) {
            return Some(u32::from(c.slot));
        }
    }
    None
}

/// [`first_match`] as a global BPF function: the scan of the candidates is verified once,
/// whichever map the candidates came from and whatever the caller knows about the packet,
/// instead of once for each (the verifier walks a loop's every round for every state that
/// reaches it).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn limiter_first_match(rules: *const PrefixRules, port: u32, proto: u32) -> u64 {
    // SAFETY: the verifier passes a pointer to a whole `PrefixRules` or null.
    let Some(rules) = (unsafe { rules.as_ref() }) else {
        return 0;
    };
    let port = (port & HAS_PORT != 0).then_some(port as u16);
    scan_match(rules, port, proto as u8).map_or(0, |slot| FOUND | u64::from(slot))
}

/// For a frame that does not show its datagram's ports (a fragment without its
/// transport header) or protocol (`PROTO_UNKNOWN`): the most specific rule the datagram
/// could belong to, and whether it is the only one (the rule asks for no port, and for
/// no protocol the frame hides). `None`: no rule could match it.
#[inline(always)]
pub fn first_possible(rules: &PrefixRules, pkt: &Packet) -> Option<(u32, bool)> {
    let found = limiter_first_possible(rules, u32::from(pkt.proto));
    (found & FOUND != 0).then_some((found as u32, found & ONLY != 0))
}

/// [`first_possible`] as a global BPF function, as [`limiter_first_match`].
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn limiter_first_possible(rules: *const PrefixRules, proto: u32) -> u64 {
    // SAFETY: the verifier passes a pointer to a whole `PrefixRules` or null.
    let Some(rules) = (unsafe { rules.as_ref() }) else {
        return 0;
    };
    let proto = proto as u8;
    let count = rules.count as usize;
    let proto_known = proto != PROTO_UNKNOWN;
    let may_have_ports = !proto_known || proto == IPPROTO_TCP || proto == IPPROTO_UDP;
    for i in 0..MAX_CANDIDATES {
        if i >= count {
            break;
        }
        let c = &rules.candidates[i];
        let wants_port = c.wants_port();
        let wants_proto = c.wants_proto();
        if wants_port && !may_have_ports {
            continue;
        }
        if wants_proto && proto_known && c.proto != proto {
            continue;
        }
        let only = !wants_port && !(wants_proto && !proto_known);
        return FOUND | u64::from(c.slot) | if only { ONLY } else { 0 };
    }
    0
}
