//! Most specific rule for a packet: one longest-prefix lookup in the live generation's
//! table, then the first of its candidates (already ordered most specific first by the
//! daemon) whose port and protocol fit.

use aya_ebpf::maps::lpm_trie::Key;
use limiter_common::abi::{PrefixRules, MATCH_PORT, MATCH_PROTO, MAX_CANDIDATES};

use crate::{maps, parse::Packet};

#[inline(always)]
pub fn classify(generation: u32, pkt: &Packet) -> Option<u32> {
    let rules = if pkt.family == 4 {
        let key = Key::new(32, [pkt.dst[0], pkt.dst[1], pkt.dst[2], pkt.dst[3]]);
        if generation & 1 == 0 {
            maps::PREFIXES_V4_0.get(&key)
        } else {
            maps::PREFIXES_V4_1.get(&key)
        }
    } else {
        let key = Key::new(128, pkt.dst);
        if generation & 1 == 0 {
            maps::PREFIXES_V6_0.get(&key)
        } else {
            maps::PREFIXES_V6_1.get(&key)
        }
    }?;
    first_match(rules, pkt)
}

#[inline(always)]
fn first_match(rules: &PrefixRules, pkt: &Packet) -> Option<u32> {
    let count = rules.count as usize;
    for i in 0..MAX_CANDIDATES {
        if i >= count {
            break;
        }
        let c = &rules.candidates[i];
        if c.match_flags & MATCH_PORT != 0 && (!pkt.has_ports || c.port != pkt.dst_port) {
            continue;
        }
        if c.match_flags & MATCH_PROTO != 0 && c.proto != pkt.proto {
            continue;
        }
        return Some(u32::from(c.slot));
    }
    None
}
