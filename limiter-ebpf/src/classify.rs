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
            maps::PREFIXES_V4_0.get(&key)
        } else {
            maps::PREFIXES_V4_1.get(&key)
        }
    } else {
        let key = Key::new(128, addr_bytes(&pkt.dst));
        if generation & 1 == 0 {
            maps::PREFIXES_V6_0.get(&key)
        } else {
            maps::PREFIXES_V6_1.get(&key)
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

/// The rule of a packet whose headers are all known: the first candidate that matches
/// ([`Candidate::matches`](limiter_common::abi::Candidate::matches), the daemon's
/// definition too).
#[inline(always)]
pub fn first_match(rules: &PrefixRules, pkt: &Packet) -> Option<u32> {
    let count = rules.count as usize;
    let port = pkt.has_ports.then_some(pkt.dst_port);
    for i in 0..MAX_CANDIDATES {
        if i >= count {
            break;
        }
        let c = &rules.candidates[i];
        if c.matches(port, pkt.proto) {
            return Some(u32::from(c.slot));
        }
    }
    None
}

/// For a frame that does not show its datagram's ports (a fragment without its
/// transport header) or protocol (`PROTO_UNKNOWN`): the most specific rule the datagram
/// could belong to, and whether it is the only one (the rule asks for no port, and for
/// no protocol the frame hides). `None`: no rule could match it.
#[inline(always)]
pub fn first_possible(rules: &PrefixRules, pkt: &Packet) -> Option<(u32, bool)> {
    let count = rules.count as usize;
    let proto_known = pkt.proto != PROTO_UNKNOWN;
    let may_have_ports = !proto_known || pkt.proto == IPPROTO_TCP || pkt.proto == IPPROTO_UDP;
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
        if wants_proto && proto_known && c.proto != pkt.proto {
            continue;
        }
        let only = !wants_port && !(wants_proto && !proto_known);
        return Some((u32::from(c.slot), only));
    }
    None
}
