//! Compiles validated rules into the kernel's tables (pure: no maps, no I/O).
//!
//! The program classifies a packet with one longest-prefix lookup in the prefix table of
//! its family, then scans that entry's candidates in order and takes the first that
//! matches (see [`abi::PrefixRules`]). For that to implement "most specific wins"
//! (docs/design.md, "Data path", step 2), the entry of every distinct rule prefix `P` lists
//! every rule whose prefix contains `P` — `P`'s own rules and those of all covering
//! prefixes — most specific first. A packet whose longest matching prefix is `P` can
//! only be matched by such rules, so the scan never needs a second lookup.
//!
//! ## Ports
//!
//! The program extracts a destination port only from TCP and UDP headers of first
//! fragments; every other packet (ICMP, other protocols, non-first fragments) has no
//! port. A candidate with `MATCH_PORT` only matches a packet that has a port equal to
//! it ([`Candidate::matches`], which the program calls too). So a rule with `dst_port` and `proto = "any"` matches TCP and UDP only, without a
//! separate encoding: "has no port" can never equal a port. [`classify`] models this by
//! ignoring the port it is given for protocols other than TCP and UDP.
//!
//! ## Slots
//!
//! Every rule lives in a slot (`0..MAX_RULES`) that indexes `RULES`, the aggregate
//! buckets and the counters. [`assign_slots`] keeps a name's slot across reloads, so its
//! bucket and counters continue. A new rule takes the lowest slot no rule holds, live or
//! new, and its bucket and counters are reset before the table goes live. Only when
//! every other slot is taken does it take the slot of a rule removed in the same change:
//! such a slot changes owner only once no frame is still decided with the table that
//! gave it to the removed rule ([`taking_over`] names those rules;
//! `daemon::install_rules` brings them in a grace period later).

use std::{
    cmp::Reverse,
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use ipnet::IpNet;
use limiter_common::{
    abi::{
        self, Candidate, PrefixRules, RuleConfig, IPPROTO_ICMP, IPPROTO_ICMPV6, IPPROTO_TCP,
        IPPROTO_UDP, MATCH_PORT, MATCH_PROTO,
    },
    gcra::{Limit, LimitError},
    share::ShareState,
};

use crate::config::{FailMode, Mode, Percent, Proto, RuleSpec};

/// One entry of a prefix table (an LPM trie key and its value). `addr` is in network
/// byte order with the bits past `prefix_len` zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefixEntry<const N: usize> {
    pub prefix_len: u32,
    pub addr: [u8; N],
    pub rules: PrefixRules,
}

impl<const N: usize> PrefixEntry<N> {
    /// Whether `addr` (network byte order) lies under this entry's prefix.
    pub fn contains(&self, addr: &[u8; N]) -> bool {
        prefix_contains(&self.addr, self.prefix_len, addr)
    }

    /// The entry's candidates (the first `count`).
    pub fn candidates(&self) -> &[Candidate] {
        let count = (self.rules.count as usize).min(abi::MAX_CANDIDATES);
        &self.rules.candidates[..count]
    }
}

/// A compiled rule set: what one generation of the kernel's tables holds.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RuleTable {
    /// `RULES` entries by slot, sorted by slot. Slots not listed are empty.
    pub rules: Vec<(u32, RuleConfig)>,
    /// IPv4 prefix table, sorted by (prefix_len, addr).
    pub v4: Vec<PrefixEntry<4>>,
    /// IPv6 prefix table, sorted by (prefix_len, addr).
    pub v6: Vec<PrefixEntry<16>>,
    /// Rule name → slot.
    pub slots: BTreeMap<String, u32>,
}

impl RuleTable {
    /// Name of the rule in `slot`.
    pub fn name_of(&self, slot: u32) -> Option<&str> {
        self.slots
            .iter()
            .find(|(_, &s)| s == slot)
            .map(|(name, _)| name.as_str())
    }

    /// The compiled rule in `slot`.
    pub fn rule(&self, slot: u32) -> Option<&RuleConfig> {
        self.rules
            .binary_search_by_key(&slot, |(s, _)| *s)
            .ok()
            .map(|i| &self.rules[i].1)
    }
}

/// The exact-address table of one generation (`HOSTS`), built from a rule table's host
/// prefixes (/32, /128): each sits within [`abi::HOST_PROBES`] slots of its home slot,
/// the probe sequence the program follows (`limiter_common::abi::host_index`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostTable {
    /// One entry per slot of a generation; `family == 0` is empty.
    pub slots: Vec<abi::HostEntry>,
    /// Host prefixes with no free slot within reach: only the prefix tries hold them
    /// (the program consults the trie on every miss, so they still match).
    pub unplaced: usize,
}

impl HostTable {
    /// Places every host prefix of `table`, in table order.
    pub fn build(table: &RuleTable) -> HostTable {
        let mut t = HostTable {
            slots: vec![abi::HostEntry::default(); abi::HOST_SLOTS as usize],
            unplaced: 0,
        };
        let v4 = table.v4.iter().filter(|e| e.prefix_len == 32).map(|e| {
            let mut addr = [0u8; 16];
            addr[..4].copy_from_slice(&e.addr);
            (4, addr, e.rules)
        });
        let v6 = table
            .v6
            .iter()
            .filter(|e| e.prefix_len == 128)
            .map(|e| (6, e.addr, e.rules));
        for (family, addr, rules) in v4.chain(v6) {
            let home = abi::host_home(family, &addr);
            let free = (0..abi::HOST_PROBES)
                .map(|probe| abi::host_index(0, home, probe) as usize)
                .find(|&i| t.slots[i].family == 0);
            match free {
                Some(i) => {
                    t.slots[i] = abi::HostEntry {
                        family,
                        addr,
                        rules,
                        ..Default::default()
                    }
                }
                None => t.unplaced += 1,
            }
        }
        t
    }

    /// What the program finds for a destination: the entry's candidates, or `None` (a
    /// miss, answered by the prefix trie). Follows the program's probe sequence.
    pub fn lookup(&self, family: u32, addr: &[u8; 16]) -> Option<&PrefixRules> {
        let home = abi::host_home(family, addr);
        for probe in 0..abi::HOST_PROBES {
            let entry = &self.slots[abi::host_index(0, home, probe) as usize];
            if entry.family == 0 {
                return None;
            }
            if entry.family == family && entry.addr == *addr {
                return Some(&entry.rules);
            }
        }
        None
    }
}

/// Why a rule set cannot be compiled. Config validation rules most of these out; they
/// guard callers that build [`RuleSpec`]s by hand.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RulesetError {
    #[error("{count} rules; at most {} are supported", abi::MAX_RULES)]
    TooManyRules { count: usize },
    #[error("rule name {0:?} is used twice")]
    DuplicateName(String),
    #[error("rule name {name:?} is {len} bytes; at most {} are allowed", abi::RULE_NAME_LEN - 1)]
    NameTooLong { name: String, len: usize },
    #[error("rule {0:?} has no slot")]
    MissingSlot(String),
    #[error("rule {name:?} has slot {slot}, outside 0..{}", abi::MAX_RULES)]
    SlotOutOfRange { name: String, slot: u32 },
    #[error("rules {first:?} and {second:?} both have slot {slot}")]
    SlotConflict {
        slot: u32,
        first: String,
        second: String,
    },
    #[error("rule {rule:?}: {field}: {error}")]
    Limit {
        rule: String,
        /// `rate` or `per_source`.
        field: &'static str,
        error: LimitError,
    },
    #[error("rule {rule:?}: per-source prefix /{prefix_len} is too long for {family}")]
    SourcePrefix {
        rule: String,
        family: &'static str,
        prefix_len: u8,
    },
    #[error("rules {first:?} and {second:?} have the same dst, dst_port and proto")]
    Ambiguous { first: String, second: String },
    #[error(
        "destination {prefix} is covered by {} rules ({}); at most {} rules may apply to one \
         destination (its own prefix and every covering prefix)",
        rules.len(),
        rules.join(", "),
        abi::MAX_CANDIDATES
    )]
    TooManyCandidates { prefix: IpNet, rules: Vec<String> },
    #[error(
        "{count} distinct {family} destination prefixes; at most {} are supported",
        abi::MAX_PREFIXES
    )]
    TooManyPrefixes { family: &'static str, count: usize },
}

/// Assigns a slot to every rule: a name keeps its slot from `previous` (the live table's);
/// a new name takes the lowest slot below `MAX_RULES` that no rule holds, in `rules` or
/// in `previous`, or, when there is none, the lowest one a rule removed in this change
/// gives up (see the module doc). New names are served in `rules` order.
pub fn assign_slots(
    previous: &BTreeMap<String, u32>,
    rules: &[RuleSpec],
) -> Result<BTreeMap<String, u32>, RulesetError> {
    if rules.len() > abi::MAX_RULES as usize {
        return Err(RulesetError::TooManyRules { count: rules.len() });
    }
    let mut names: BTreeSet<&str> = BTreeSet::new();
    if let Some(twice) = rules.iter().find(|r| !names.insert(&r.name)) {
        return Err(RulesetError::DuplicateName(twice.name.clone()));
    }
    let mut slots: BTreeMap<String, u32> = BTreeMap::new();
    let mut owners: BTreeMap<u32, &str> = BTreeMap::new();
    for rule in rules {
        let Some(&slot) = previous.get(&rule.name) else {
            continue;
        };
        if slot >= abi::MAX_RULES {
            return Err(RulesetError::SlotOutOfRange {
                name: rule.name.clone(),
                slot,
            });
        }
        if let Some(first) = owners.insert(slot, &rule.name) {
            return Err(RulesetError::SlotConflict {
                slot,
                first: first.to_string(),
                second: rule.name.clone(),
            });
        }
        slots.insert(rule.name.clone(), slot);
    }
    // A new name takes a slot no live rule holds, so that no slot changes hands while the
    // live table can still meter with it; only when every other slot is taken does it
    // take one a rule removed in this change gives up ([`taking_over`]).
    let live: BTreeSet<u32> = previous.values().copied().collect();
    for rule in rules {
        if slots.contains_key(&rule.name) {
            continue;
        }
        let unowned = |s: &u32| !owners.contains_key(s);
        // rules.len() <= MAX_RULES, so an unowned slot below MAX_RULES always exists.
        let Some(slot) = (0..abi::MAX_RULES)
            .find(|s| unowned(s) && !live.contains(s))
            .or_else(|| (0..abi::MAX_RULES).find(unowned))
        else {
            return Err(RulesetError::TooManyRules { count: rules.len() });
        };
        owners.insert(slot, &rule.name);
        slots.insert(rule.name.clone(), slot);
    }
    Ok(slots)
}

/// The rules of `slots` that take over a slot another rule holds in `previous` (a rule
/// removed in the same change): names, sorted.
pub fn taking_over(
    previous: &BTreeMap<String, u32>,
    slots: &BTreeMap<String, u32>,
) -> BTreeSet<String> {
    let owner: BTreeMap<u32, &str> = previous.iter().map(|(n, s)| (*s, n.as_str())).collect();
    slots
        .iter()
        .filter(|(name, slot)| owner.get(slot).is_some_and(|o| o != name))
        .map(|(name, _)| name.clone())
        .collect()
}

/// The IP protocol number a rule's candidate matches in a family (`None` = any).
pub fn ip_proto(proto: Proto, v6: bool) -> Option<u8> {
    match proto {
        Proto::Tcp => Some(IPPROTO_TCP),
        Proto::Udp => Some(IPPROTO_UDP),
        Proto::Icmp if v6 => Some(IPPROTO_ICMPV6),
        Proto::Icmp => Some(IPPROTO_ICMP),
        Proto::Any => None,
    }
}

/// Builds the `RULES` entry of one rule (standalone share state, no deadlines).
pub fn rule_config(rule: &RuleSpec) -> Result<RuleConfig, RulesetError> {
    let granularity = rule.unit.granularity();
    let mut config = RuleConfig::EMPTY;
    config.flags = abi::RULE_IN_USE;
    if rule.mode == Mode::Shadow {
        config.flags |= abi::RULE_SHADOW;
    }
    // A canary: the rest of the refusals pass as would-drops (limiter_common::canary).
    if rule.enforce < Percent::ALL {
        config.flags |= abi::RULE_CANARY;
        config.canary_threshold = limiter_common::canary::threshold(rule.enforce.0);
    }
    if rule.fail_mode == FailMode::Static {
        config.flags |= abi::RULE_FAIL_STATIC;
    }
    config.unit = rule.unit.abi();
    let limit_error = |field, error| RulesetError::Limit {
        rule: rule.name.clone(),
        field,
        error,
    };
    if let Some(aggregate) = rule.aggregate {
        config.aggregate = Limit::new(granularity, aggregate.rate, aggregate.burst)
            .map_err(|e| limit_error("rate", e))?;
        config.flags |= abi::RULE_HAS_AGGREGATE;
        config.rate = aggregate.rate;
        config.burst = aggregate.burst;
    }
    if let Some(per_source) = rule.per_source {
        config.per_source = Limit::new(granularity, per_source.rate, per_source.burst)
            .map_err(|e| limit_error("per_source", e))?;
        config.flags |= abi::RULE_HAS_PER_SOURCE;
        config.source_rate = per_source.rate;
        config.source_burst = per_source.burst;
        for (family, len, max) in [
            ("IPv4", per_source.prefix_v4, 32),
            ("IPv6", per_source.prefix_v6, 128),
        ] {
            if len > max {
                return Err(RulesetError::SourcePrefix {
                    rule: rule.name.clone(),
                    family,
                    prefix_len: len,
                });
            }
        }
        config.source_prefix_v4 = u32::from(per_source.prefix_v4);
        config.source_prefix_v6 = u32::from(per_source.prefix_v6);
    }
    if config.tick_clock_ok() {
        config.flags |= abi::RULE_TICK_CLOCK;
    }
    config.share_state = ShareState::Standalone.into();
    let name = rule.name.as_bytes();
    if name.len() >= abi::RULE_NAME_LEN {
        return Err(RulesetError::NameTooLong {
            name: rule.name.clone(),
            len: name.len(),
        });
    }
    config.name[..name.len()].copy_from_slice(name);
    Ok(config)
}

/// Compiles `rules` with the slots from [`assign_slots`].
pub fn compile(
    rules: &[RuleSpec],
    slots: &BTreeMap<String, u32>,
) -> Result<RuleTable, RulesetError> {
    if rules.len() > abi::MAX_RULES as usize {
        return Err(RulesetError::TooManyRules { count: rules.len() });
    }
    let mut table = RuleTable::default();
    let mut owners: BTreeMap<u32, &str> = BTreeMap::new();
    let mut by_match: BTreeMap<(IpNet, Option<u16>, Proto), &str> = BTreeMap::new();
    // (rule, slot) in input order.
    let mut placed: Vec<(&RuleSpec, u32)> = Vec::with_capacity(rules.len());
    for rule in rules {
        if table.slots.contains_key(&rule.name) {
            return Err(RulesetError::DuplicateName(rule.name.clone()));
        }
        let slot = *slots
            .get(&rule.name)
            .ok_or_else(|| RulesetError::MissingSlot(rule.name.clone()))?;
        if slot >= abi::MAX_RULES {
            return Err(RulesetError::SlotOutOfRange {
                name: rule.name.clone(),
                slot,
            });
        }
        if let Some(first) = owners.insert(slot, &rule.name) {
            return Err(RulesetError::SlotConflict {
                slot,
                first: first.to_string(),
                second: rule.name.clone(),
            });
        }
        let key = (rule.dst.trunc(), rule.dst_port, rule.proto);
        if let Some(first) = by_match.insert(key, &rule.name) {
            return Err(RulesetError::Ambiguous {
                first: first.to_string(),
                second: rule.name.clone(),
            });
        }
        table.rules.push((slot, rule_config(rule)?));
        table.slots.insert(rule.name.clone(), slot);
        placed.push((rule, slot));
    }
    table.rules.sort_by_key(|(slot, _)| *slot);

    let prefixes: BTreeSet<IpNet> = placed.iter().map(|(rule, _)| rule.dst.trunc()).collect();
    for prefix in prefixes {
        let rules = prefix_rules(&placed, prefix)?;
        match prefix {
            IpNet::V4(net) => table.v4.push(PrefixEntry {
                prefix_len: u32::from(net.prefix_len()),
                addr: net.network().octets(),
                rules,
            }),
            IpNet::V6(net) => table.v6.push(PrefixEntry {
                prefix_len: u32::from(net.prefix_len()),
                addr: net.network().octets(),
                rules,
            }),
        }
    }
    for (family, count) in [("IPv4", table.v4.len()), ("IPv6", table.v6.len())] {
        if count > abi::MAX_PREFIXES as usize {
            return Err(RulesetError::TooManyPrefixes { family, count });
        }
    }
    table.v4.sort_by_key(|e| (e.prefix_len, e.addr));
    table.v6.sort_by_key(|e| (e.prefix_len, e.addr));
    Ok(table)
}

/// The candidates of the entry for `prefix`: every rule whose prefix contains it, most
/// specific first.
fn prefix_rules(placed: &[(&RuleSpec, u32)], prefix: IpNet) -> Result<PrefixRules, RulesetError> {
    let v6 = matches!(prefix, IpNet::V6(_));
    let mut covering: Vec<(&RuleSpec, u32)> = placed
        .iter()
        .filter(|(rule, _)| rule.dst.trunc().contains(&prefix))
        .copied()
        .collect();
    // Most specific first. Two rules with equal keys differ in port or protocol (the
    // identical triple is rejected as ambiguous), so no packet can match both and their
    // relative order is irrelevant; the slot only makes the output deterministic.
    covering.sort_by_key(|(rule, slot)| {
        (
            Reverse(rule.dst.prefix_len()),
            Reverse(rule.dst_port.is_some()),
            Reverse(rule.proto != Proto::Any),
            *slot,
        )
    });
    if covering.len() > abi::MAX_CANDIDATES {
        return Err(RulesetError::TooManyCandidates {
            prefix,
            rules: covering.iter().map(|(r, _)| r.name.clone()).collect(),
        });
    }
    let mut rules = PrefixRules::default();
    for (i, (rule, slot)) in covering.iter().enumerate() {
        let mut candidate = Candidate {
            // slot < MAX_RULES (1024), checked by compile.
            slot: u16::try_from(*slot).unwrap_or(u16::MAX),
            ..Candidate::default()
        };
        if let Some(port) = rule.dst_port {
            candidate.port = port;
            candidate.match_flags |= MATCH_PORT;
        }
        if let Some(proto) = ip_proto(rule.proto, v6) {
            candidate.proto = proto;
            candidate.match_flags |= MATCH_PROTO;
        }
        rules.candidates[i] = candidate;
    }
    rules.count = covering.len() as u32;
    Ok(rules)
}

/// Whether the first `prefix_len` bits of `net` and `addr` agree.
fn prefix_contains<const N: usize>(net: &[u8; N], prefix_len: u32, addr: &[u8; N]) -> bool {
    let bits = (prefix_len as usize).min(N * 8);
    let whole = bits / 8;
    if net[..whole] != addr[..whole] {
        return false;
    }
    let rest = bits % 8;
    if rest == 0 {
        return true;
    }
    let mask = 0xffu8 << (8 - rest);
    (net[whole] & mask) == (addr[whole] & mask)
}

fn longest<'t, const N: usize>(
    entries: &'t [PrefixEntry<N>],
    addr: &[u8; N],
) -> Option<&'t PrefixEntry<N>> {
    entries
        .iter()
        .filter(|e| e.contains(addr))
        .max_by_key(|e| e.prefix_len)
}

/// Reference model of the kernel's classifier: the slot of the rule a packet to
/// `dst` (`dst_port`, IP protocol `proto`) belongs to, or `None` (unmatched).
///
/// Takes the longest-prefix entry containing `dst` in its family's table, then the first
/// of its candidates that matches. Like the program's parser, it treats only TCP and UDP
/// packets as having a port: `dst_port` is ignored for every other protocol. Pass `None`
/// for a TCP/UDP non-first fragment.
pub fn classify(table: &RuleTable, dst: IpAddr, dst_port: Option<u16>, proto: u8) -> Option<u32> {
    let port = if proto == IPPROTO_TCP || proto == IPPROTO_UDP {
        dst_port
    } else {
        None
    };
    let candidates = match dst {
        IpAddr::V4(addr) => longest(&table.v4, &addr.octets())?.candidates(),
        IpAddr::V6(addr) => longest(&table.v6, &addr.octets())?.candidates(),
    };
    candidates
        .iter()
        .find(|c| c.matches(port, proto))
        .map(|c| u32::from(c.slot))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::net::{Ipv4Addr, Ipv6Addr};

    use proptest::prelude::*;

    use super::*;
    use crate::config::{OnSaturation, PerSourceSpec, RateSpec, Unit};

    fn spec(name: &str, dst: &str, port: Option<u16>, proto: Proto) -> RuleSpec {
        RuleSpec {
            name: name.to_string(),
            dst: crate::config::parse_dst(dst).unwrap(),
            dst_port: port,
            proto,
            unit: Unit::Packets,
            aggregate: Some(RateSpec {
                rate: 100,
                burst: 10,
            }),
            mode: Mode::Enforce,
            enforce: crate::config::Percent::ALL,
            fail_mode: FailMode::Open,
            per_source: None,
        }
    }

    fn build(rules: &[RuleSpec]) -> RuleTable {
        let slots = assign_slots(&BTreeMap::new(), rules).unwrap();
        compile(rules, &slots).unwrap()
    }

    /// Name of the rule a packet classifies to.
    fn which(table: &RuleTable, dst: &str, port: Option<u16>, proto: u8) -> Option<String> {
        classify(table, dst.parse().unwrap(), port, proto)
            .map(|slot| table.name_of(slot).unwrap().to_string())
    }

    const TCP: u8 = IPPROTO_TCP;
    const UDP: u8 = IPPROTO_UDP;

    #[test]
    fn longest_prefix_beats_port() {
        let t = build(&[
            spec("wide-443", "198.18.0.0/16", Some(443), Proto::Tcp),
            spec("narrow-any", "198.18.1.0/24", None, Proto::Any),
        ]);
        assert_eq!(
            which(&t, "198.18.1.5", Some(443), TCP).as_deref(),
            Some("narrow-any")
        );
        assert_eq!(
            which(&t, "198.18.2.5", Some(443), TCP).as_deref(),
            Some("wide-443")
        );
        assert_eq!(which(&t, "198.18.2.5", Some(80), TCP), None);
        assert_eq!(which(&t, "198.19.1.5", Some(443), TCP), None);
    }

    #[test]
    fn port_beats_proto() {
        let t = build(&[
            spec("tcp-any-port", "198.18.1.0/24", None, Proto::Tcp),
            spec("any-proto-80", "198.18.1.0/24", Some(80), Proto::Any),
            spec("catch-all", "198.18.1.0/24", None, Proto::Any),
        ]);
        assert_eq!(
            which(&t, "198.18.1.1", Some(80), TCP).as_deref(),
            Some("any-proto-80")
        );
        assert_eq!(
            which(&t, "198.18.1.1", Some(80), UDP).as_deref(),
            Some("any-proto-80")
        );
        assert_eq!(
            which(&t, "198.18.1.1", Some(81), TCP).as_deref(),
            Some("tcp-any-port")
        );
        assert_eq!(
            which(&t, "198.18.1.1", Some(81), UDP).as_deref(),
            Some("catch-all")
        );
        // Order in the table: port, then proto, then neither.
        let entry = &t.v4[0];
        let order: Vec<&str> = entry
            .candidates()
            .iter()
            .map(|c| t.name_of(u32::from(c.slot)).unwrap())
            .collect();
        assert_eq!(order, ["any-proto-80", "tcp-any-port", "catch-all"]);
        assert_eq!(entry.candidates()[0].match_flags, MATCH_PORT);
        assert_eq!(entry.candidates()[0].port, 80);
        assert_eq!(entry.candidates()[1].match_flags, MATCH_PROTO);
        assert_eq!(entry.candidates()[1].proto, IPPROTO_TCP);
        assert_eq!(entry.candidates()[2].match_flags, 0);
    }

    #[test]
    fn covering_prefix_is_the_fallback() {
        let t = build(&[
            spec("web", "198.18.1.0/24", Some(443), Proto::Tcp),
            spec("tenant", "198.18.0.0/15", None, Proto::Any),
            spec("elsewhere", "198.19.0.0/16", None, Proto::Any),
        ]);
        // The /24 entry carries its own rule, then the covering /15 rule.
        let entry = t.v4.iter().find(|e| e.prefix_len == 24).unwrap();
        assert_eq!(entry.addr, [198, 18, 1, 0]);
        let names: Vec<&str> = entry
            .candidates()
            .iter()
            .map(|c| t.name_of(u32::from(c.slot)).unwrap())
            .collect();
        assert_eq!(names, ["web", "tenant"]);
        assert_eq!(
            which(&t, "198.18.1.1", Some(443), TCP).as_deref(),
            Some("web")
        );
        assert_eq!(
            which(&t, "198.18.1.1", Some(80), TCP).as_deref(),
            Some("tenant")
        );
        assert_eq!(
            which(&t, "198.18.1.1", Some(443), UDP).as_deref(),
            Some("tenant")
        );
        assert_eq!(
            which(&t, "198.19.7.7", None, 47).as_deref(),
            Some("elsewhere")
        );
        assert_eq!(which(&t, "198.20.0.1", None, TCP), None);
        assert_eq!(which(&t, "2001:db8::1", None, TCP), None);
        // Entries sorted by prefix length.
        let lens: Vec<u32> = t.v4.iter().map(|e| e.prefix_len).collect();
        assert_eq!(lens, [15, 16, 24]);
    }

    #[test]
    fn port_rules_need_a_port() {
        let t = build(&[spec("dns", "198.18.0.0/15", Some(53), Proto::Any)]);
        assert_eq!(
            which(&t, "198.18.0.1", Some(53), UDP).as_deref(),
            Some("dns")
        );
        assert_eq!(
            which(&t, "198.18.0.1", Some(53), TCP).as_deref(),
            Some("dns")
        );
        // Non-first fragment: no port.
        assert_eq!(which(&t, "198.18.0.1", None, UDP), None);
        // Protocols without ports never match, whatever port the caller passes.
        assert_eq!(which(&t, "198.18.0.1", Some(53), IPPROTO_ICMP), None);
        assert_eq!(which(&t, "198.18.0.1", Some(53), 132), None);
    }

    #[test]
    fn icmp_encoding_per_family() {
        let t = build(&[
            spec("ping4", "198.18.0.0/15", None, Proto::Icmp),
            spec("ping6", "2001:db8::/32", None, Proto::Icmp),
        ]);
        let c4 = t.v4[0].candidates()[0];
        assert_eq!((c4.proto, c4.match_flags), (IPPROTO_ICMP, MATCH_PROTO));
        let c6 = t.v6[0].candidates()[0];
        assert_eq!((c6.proto, c6.match_flags), (IPPROTO_ICMPV6, MATCH_PROTO));
        assert_eq!(t.v6[0].prefix_len, 32);
        assert_eq!(
            t.v6[0].addr,
            "2001:db8::".parse::<Ipv6Addr>().unwrap().octets()
        );
        assert_eq!(
            which(&t, "198.18.0.1", None, IPPROTO_ICMP).as_deref(),
            Some("ping4")
        );
        assert_eq!(which(&t, "198.18.0.1", None, IPPROTO_ICMPV6), None);
        assert_eq!(
            which(&t, "2001:db8::1", None, IPPROTO_ICMPV6).as_deref(),
            Some("ping6")
        );
        assert_eq!(which(&t, "2001:db8::1", None, IPPROTO_ICMP), None);
    }

    #[test]
    fn rule_configs() {
        let mut bytes = spec("bytes-rule", "2001:db8::/32", Some(443), Proto::Tcp);
        bytes.unit = Unit::Bytes;
        bytes.mode = Mode::Shadow;
        bytes.fail_mode = FailMode::Static;
        bytes.aggregate = Some(RateSpec {
            rate: 1_000_000,
            burst: 3000,
        });
        bytes.per_source = Some(PerSourceSpec {
            rate: 10_000,
            burst: 1518,
            prefix_v4: 24,
            prefix_v6: 64,
            on_saturation: OnSaturation::StandAside,
        });
        let mut syn = spec("syn", "198.18.0.0/15", None, Proto::Tcp);
        syn.unit = Unit::Syn;
        syn.aggregate = None;
        syn.per_source = Some(PerSourceSpec {
            rate: 5,
            burst: 7,
            prefix_v4: 32,
            prefix_v6: 128,
            on_saturation: OnSaturation::StandAside,
        });
        let t = build(&[bytes, syn]);
        assert_eq!(t.slots["bytes-rule"], 0);
        assert_eq!(t.slots["syn"], 1);
        assert_eq!(t.rules.iter().map(|(s, _)| *s).collect::<Vec<_>>(), [0, 1]);

        let b = t.rule(0).unwrap();
        assert_eq!(
            b.flags,
            abi::RULE_IN_USE
                | abi::RULE_SHADOW
                | abi::RULE_FAIL_STATIC
                | abi::RULE_HAS_AGGREGATE
                | abi::RULE_HAS_PER_SOURCE
        );
        assert_eq!(b.unit, abi::UNIT_BYTES);
        assert_eq!(
            b.aggregate,
            Limit::new(limiter_common::gcra::Granularity::Byte, 1_000_000, 3000).unwrap()
        );
        assert_eq!(
            b.per_source,
            Limit::new(limiter_common::gcra::Granularity::Byte, 10_000, 1518).unwrap()
        );
        assert_eq!(
            (b.rate, b.burst, b.source_rate, b.source_burst),
            (1_000_000, 3000, 10_000, 1518)
        );
        assert_eq!((b.source_prefix_v4, b.source_prefix_v6), (24, 64));
        assert_eq!(b.share_state, u32::from(ShareState::Standalone));
        assert_eq!((b.lease_expires_ns, b.fail_open_at_ns), (0, 0));
        assert_eq!(b.name_bytes(), b"bytes-rule");
        assert!(b.name[10..].iter().all(|&x| x == 0));

        let s = t.rule(1).unwrap();
        // 7 SYNs at 5/s hold far more than a tick: the per-tick clock meters it.
        assert_eq!(
            s.flags,
            abi::RULE_IN_USE | abi::RULE_HAS_PER_SOURCE | abi::RULE_TICK_CLOCK
        );
        assert_eq!(s.unit, abi::UNIT_SYN);
        assert_eq!(s.aggregate, Limit::NONE);
        assert_eq!(
            s.per_source,
            Limit::new(limiter_common::gcra::Granularity::Event, 5, 7).unwrap()
        );
        assert_eq!((s.rate, s.burst), (0, 0));
        assert_eq!(s.name_bytes(), b"syn");

        let mut long = spec(&"n".repeat(63), "198.18.0.0/15", None, Proto::Any);
        assert_eq!(rule_config(&long).unwrap().name_bytes().len(), 63);
        long.name.push('n');
        assert!(matches!(
            rule_config(&long),
            Err(RulesetError::NameTooLong { len: 64, .. })
        ));
    }

    /// The program meters on the per-tick clock only rules whose every limit holds at
    /// least 33.6 ms of its rate (limiter_common::gcra::TICK_CLOCK_MIN_TOLERANCE).
    #[test]
    fn tick_clock_flag_needs_every_limit_to_hold_a_tick() {
        let rate = |rate, burst| Some(RateSpec { rate, burst });
        let per_source = |rate, burst| {
            Some(PerSourceSpec {
                rate,
                burst,
                prefix_v4: 32,
                prefix_v6: 128,
                on_saturation: OnSaturation::StandAside,
            })
        };
        // (aggregate, per source, expected): bursts of 100 ms and 10 ms of their rate.
        let cases = [
            (rate(1000, 100), None, true),
            (rate(1000, 10), None, false),
            (None, per_source(10, 1), true),
            (None, per_source(1000, 10), false),
            (rate(1000, 100), per_source(10, 1), true),
            (rate(1000, 100), per_source(1000, 10), false),
            (rate(1000, 10), per_source(10, 1), false),
        ];
        for (aggregate, per_source, expected) in cases {
            let mut rule = spec("r", "198.18.0.1/32", None, Proto::Any);
            rule.aggregate = aggregate;
            rule.per_source = per_source;
            let config = rule_config(&rule).unwrap();
            assert_eq!(
                config.flags & abi::RULE_TICK_CLOCK != 0,
                expected,
                "aggregate {aggregate:?}, per source {per_source:?}"
            );
        }
    }

    #[test]
    fn slots_are_stable() {
        let first = [
            spec("a", "198.18.0.1", None, Proto::Any),
            spec("b", "198.18.0.2", None, Proto::Any),
            spec("c", "198.18.0.3", None, Proto::Any),
        ];
        let s1 = assign_slots(&BTreeMap::new(), &first).unwrap();
        assert_eq!(
            s1,
            BTreeMap::from([("a".into(), 0), ("b".into(), 1), ("c".into(), 2)])
        );

        // b removed, d and e added, order changed: a and c keep theirs; b's slot is still
        // live, so d and e take slots no rule holds.
        let second = [
            spec("c", "198.18.0.3", None, Proto::Any),
            spec("d", "198.18.0.4", None, Proto::Any),
            spec("a", "198.18.0.1", Some(80), Proto::Tcp), // changed, same name
            spec("e", "198.18.0.5", None, Proto::Any),
        ];
        let s2 = assign_slots(&s1, &second).unwrap();
        assert_eq!(
            s2,
            BTreeMap::from([
                ("a".into(), 0),
                ("c".into(), 2),
                ("d".into(), 3),
                ("e".into(), 4)
            ])
        );
        assert!(taking_over(&s1, &s2).is_empty());
        let t = compile(&second, &s2).unwrap();
        assert_eq!(t.slots, s2);
        assert_eq!(which(&t, "198.18.0.1", Some(80), TCP).as_deref(), Some("a"));
        assert_eq!(t.rule(0).unwrap().name_bytes(), b"a");

        // Recompiling with the same rules is a fixed point.
        assert_eq!(assign_slots(&s2, &second).unwrap(), s2);
        // Old slots are kept even when low slots are free.
        let third = [
            spec("e", "198.18.0.5", None, Proto::Any),
            spec("f", "198.18.0.6", None, Proto::Any),
        ];
        let s3 = assign_slots(&s2, &third).unwrap();
        assert_eq!(s3, BTreeMap::from([("e".into(), 4), ("f".into(), 1)]));
    }

    /// A slot changes hands in one change only when every other slot is taken.
    #[test]
    fn a_live_slot_is_taken_over_only_from_a_full_table() {
        let rule = |i: u32| {
            spec(
                &format!("r{i}"),
                &format!("198.18.{}.{}", i / 256, i % 256),
                None,
                Proto::Any,
            )
        };
        let full: Vec<RuleSpec> = (0..abi::MAX_RULES).map(rule).collect();
        let live = assign_slots(&BTreeMap::new(), &full).unwrap();
        // r5 goes, "new" comes: 1023 kept rules and every slot live.
        let mut next: Vec<RuleSpec> = full.iter().filter(|r| r.name != "r5").cloned().collect();
        next.push(spec("new", "198.19.0.1", None, Proto::Any));
        let slots = assign_slots(&live, &next).unwrap();
        assert_eq!(slots["new"], live["r5"]);
        assert_eq!(
            taking_over(&live, &slots),
            BTreeSet::from(["new".to_string()])
        );
        // One slot free beside the live ones: "new" takes it, and no slot changes hands.
        let mut live = live;
        live.remove("r1000");
        next.retain(|r| r.name != "r1000");
        let slots = assign_slots(&live, &next).unwrap();
        assert_eq!(slots["new"], 1000);
        assert!(taking_over(&live, &slots).is_empty());
    }

    #[test]
    fn slot_errors() {
        let rules = [
            spec("a", "198.18.0.1", None, Proto::Any),
            spec("a", "198.18.0.2", None, Proto::Any),
        ];
        assert_eq!(
            assign_slots(&BTreeMap::new(), &rules),
            Err(RulesetError::DuplicateName("a".into()))
        );
        let rules = [
            spec("a", "198.18.0.1", None, Proto::Any),
            spec("b", "198.18.0.2", None, Proto::Any),
        ];
        let corrupt = BTreeMap::from([("a".into(), 4), ("b".into(), 4)]);
        assert!(matches!(
            assign_slots(&corrupt, &rules),
            Err(RulesetError::SlotConflict { slot: 4, .. })
        ));
        assert!(matches!(
            compile(&rules, &corrupt),
            Err(RulesetError::SlotConflict { slot: 4, .. })
        ));
        let out = BTreeMap::from([("a".into(), abi::MAX_RULES)]);
        assert!(matches!(
            assign_slots(&out, &rules),
            Err(RulesetError::SlotOutOfRange { .. })
        ));
        let partial = BTreeMap::from([("a".into(), 0)]);
        assert_eq!(
            compile(&rules, &partial),
            Err(RulesetError::MissingSlot("b".into()))
        );
        let ambiguous = [
            spec("a", "198.18.0.1", None, Proto::Any),
            spec("b", "198.18.0.1/32", None, Proto::Any),
        ];
        let slots = assign_slots(&BTreeMap::new(), &ambiguous).unwrap();
        assert!(matches!(
            compile(&ambiguous, &slots),
            Err(RulesetError::Ambiguous { .. })
        ));
        // A full table: every slot taken.
        let many: Vec<RuleSpec> = (0..abi::MAX_RULES)
            .map(|i| {
                spec(
                    &format!("r{i}"),
                    &format!("198.18.{}.{}", i / 256, i % 256),
                    None,
                    Proto::Any,
                )
            })
            .collect();
        let slots = assign_slots(&BTreeMap::new(), &many).unwrap();
        assert_eq!(
            slots.values().copied().collect::<BTreeSet<_>>().len(),
            abi::MAX_RULES as usize
        );
        assert!(slots.values().all(|&s| s < abi::MAX_RULES));
        let mut too_many = many;
        too_many.push(spec("extra", "198.19.0.0/16", None, Proto::Any));
        assert!(matches!(
            assign_slots(&BTreeMap::new(), &too_many),
            Err(RulesetError::TooManyRules { .. })
        ));
    }

    #[test]
    fn candidate_overflow() {
        // 17 rules that all apply to 198.18.0.0/31: its own and 16 covering prefixes.
        let rules: Vec<RuleSpec> = (15..=31)
            .map(|len| {
                spec(
                    &format!("len{len}"),
                    &format!("198.18.0.0/{len}"),
                    None,
                    Proto::Any,
                )
            })
            .collect();
        let slots = assign_slots(&BTreeMap::new(), &rules).unwrap();
        let err = compile(&rules, &slots).unwrap_err();
        let RulesetError::TooManyCandidates {
            prefix,
            rules: names,
        } = &err
        else {
            panic!("{err:?}");
        };
        assert_eq!(*prefix, "198.18.0.0/31".parse::<IpNet>().unwrap());
        assert_eq!(names.len(), 17);
        assert_eq!(names[0], "len31");
        let text = err.to_string();
        assert!(
            text.contains("198.18.0.0/31") && text.contains("len15") && text.contains("len31"),
            "{text}"
        );
        // Sixteen fit.
        let rules = &rules[1..];
        let t = compile(rules, &assign_slots(&BTreeMap::new(), rules).unwrap()).unwrap();
        assert_eq!(t.v4.last().unwrap().rules.count, 16);
        assert_eq!(which(&t, "198.18.0.1", None, TCP).as_deref(), Some("len31"));
        assert_eq!(which(&t, "198.18.0.2", None, TCP).as_deref(), Some("len30"));
        assert_eq!(which(&t, "198.19.0.2", None, TCP).as_deref(), None);
    }

    #[test]
    fn prefix_containment_bits() {
        assert!(prefix_contains(&[198, 18, 0, 0], 15, &[198, 19, 255, 255]));
        assert!(!prefix_contains(&[198, 18, 0, 0], 15, &[198, 20, 0, 0]));
        assert!(prefix_contains(&[0, 0, 0, 0], 0, &[1, 2, 3, 4]));
        assert!(prefix_contains(&[1, 2, 3, 4], 32, &[1, 2, 3, 4]));
        assert!(!prefix_contains(&[1, 2, 3, 4], 32, &[1, 2, 3, 5]));
    }

    // ---- property test: classify == brute-force oracle over the rule list ----

    /// The contract, stated directly on the rule list: among rules whose prefix contains
    /// dst, whose port (if any) equals the packet's and whose proto (if not any) equals
    /// the packet's, the one with the greatest (prefix_len, has_port, has_proto).
    fn oracle(rules: &[RuleSpec], dst: IpAddr, port: Option<u16>, proto: u8) -> Option<&RuleSpec> {
        let port = if proto == TCP || proto == UDP {
            port
        } else {
            None
        };
        let key = |r: &RuleSpec| {
            (
                r.dst.prefix_len(),
                r.dst_port.is_some(),
                r.proto != Proto::Any,
            )
        };
        let matching: Vec<&RuleSpec> = rules
            .iter()
            .filter(|r| r.dst.contains(&dst))
            .filter(|r| r.dst_port.is_none() || r.dst_port == port)
            .filter(|r| ip_proto(r.proto, dst.is_ipv6()).is_none_or(|p| p == proto))
            .collect();
        let best = matching.iter().copied().max_by_key(|r| key(r))?;
        let ties = matching.iter().filter(|r| key(r) == key(best)).count();
        assert_eq!(
            ties, 1,
            "two rules equally specific for {dst} {port:?} {proto}"
        );
        Some(best)
    }

    const V4_BASE: u32 = 0xC612_0000; // 198.18.0.0/15
    const V6_BASE: u128 = 0x2001_0db8 << 96; // 2001:db8::/32
    const V4_LENS: [u8; 8] = [15, 16, 20, 24, 28, 30, 31, 32];
    const V6_LENS: [u8; 8] = [32, 33, 48, 64, 96, 120, 127, 128];
    const PORTS: [Option<u16>; 4] = [None, Some(53), Some(80), Some(443)];
    const PROTOS: [Proto; 4] = [Proto::Tcp, Proto::Udp, Proto::Icmp, Proto::Any];
    const PACKET_PROTOS: [u8; 6] = [TCP, UDP, IPPROTO_ICMP, IPPROTO_ICMPV6, 47, 132];

    fn addr_of(v6: bool, v4_bases: &[u32], v6_bases: &[u128], base: usize, jitter: u128) -> IpAddr {
        if v6 {
            let a = v6_bases[base % v6_bases.len()] ^ (jitter & ((1 << 96) - 1));
            IpAddr::V6(Ipv6Addr::from(V6_BASE | (a & ((1 << 96) - 1))))
        } else {
            let a = v4_bases[base % v4_bases.len()] ^ (jitter as u32 & 0x1_ffff);
            IpAddr::V4(Ipv4Addr::from(V4_BASE | (a & 0x1_ffff)))
        }
    }

    /// Jitter masks: same address, a few low bits, a wider range, anything in the block.
    fn jitter() -> impl Strategy<Value = u128> {
        prop_oneof![
            Just(0u128),
            any::<u8>().prop_map(u128::from),
            any::<u16>().prop_map(u128::from),
            any::<u128>(),
        ]
    }

    /// Addresses in 198.18.0.0/15 whose exact-address home slot is the same.
    fn colliding_v4(count: usize) -> Vec<Ipv4Addr> {
        let home = |a: Ipv4Addr| {
            let mut addr = [0u8; 16];
            addr[..4].copy_from_slice(&a.octets());
            abi::host_home(4, &addr)
        };
        let base = u32::from(Ipv4Addr::new(198, 18, 0, 1));
        let target = home(Ipv4Addr::from(base));
        (0..1 << 17)
            .map(|i| Ipv4Addr::from(base + i))
            .filter(|&a| home(a) == target)
            .take(count)
            .collect()
    }

    #[test]
    fn host_table_overflow_is_left_to_the_trie() {
        let addrs = colliding_v4(abi::HOST_PROBES as usize + 1);
        assert_eq!(addrs.len(), abi::HOST_PROBES as usize + 1);
        let rules: Vec<RuleSpec> = addrs
            .iter()
            .enumerate()
            .map(|(i, a)| spec(&format!("h{i}"), &format!("{a}/32"), None, Proto::Any))
            .collect();
        let t = build(&rules);
        let hosts = HostTable::build(&t);
        assert_eq!(hosts.unplaced, 1);
        for (i, a) in addrs.iter().enumerate() {
            let mut addr = [0u8; 16];
            addr[..4].copy_from_slice(&a.octets());
            let found = hosts.lookup(4, &addr);
            if i < abi::HOST_PROBES as usize {
                let slot = found.expect("placed within reach").candidates[0].slot;
                assert_eq!(t.name_of(u32::from(slot)), Some(format!("h{i}").as_str()));
            } else {
                assert!(found.is_none(), "the last one does not fit");
            }
            // The program's fallback still classifies it.
            assert_eq!(
                which(&t, &a.to_string(), None, UDP).as_deref(),
                Some(format!("h{i}").as_str())
            );
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// The program's lookup order (exact-address table, then the trie on a miss) gives
        /// every destination the candidates the trie alone would: a hit is always the
        /// destination's own host prefix, whose trie entry is the longest match.
        #[test]
        fn host_table_agrees_with_the_trie(
            hosts in prop::collection::vec((any::<bool>(), 0u32..(1 << 17), any::<u128>()), 1..300),
            wide in prop::collection::vec((0u32..(1 << 17), 8u8..31), 0..20),
            probes in prop::collection::vec((any::<bool>(), 0usize..300, any::<bool>(), 0u32..(1 << 17)), 64),
        ) {
            let base = u32::from(Ipv4Addr::new(198, 18, 0, 0));
            let host_addr = |&(v6, v4, v6a): &(bool, u32, u128)| -> IpAddr {
                if v6 {
                    IpAddr::V6(Ipv6Addr::from((0x2001_0db8u128 << 96) | (v6a >> 32)))
                } else {
                    IpAddr::V4(Ipv4Addr::from(base + v4))
                }
            };
            let mut seen = BTreeSet::new();
            let mut rules = Vec::new();
            for (i, h) in hosts.iter().enumerate() {
                let a = host_addr(h);
                if seen.insert(a) {
                    let len = if a.is_ipv4() { 32 } else { 128 };
                    rules.push(spec(&format!("h{i}"), &format!("{a}/{len}"), None, Proto::Any));
                }
            }
            for (i, &(v4, len)) in wide.iter().enumerate() {
                let net = IpNet::new(IpAddr::V4(Ipv4Addr::from(base + v4)), len).unwrap().trunc();
                if rules.iter().all(|r| r.dst != net) {
                    let mut rule = spec(&format!("w{i}"), "198.18.0.0/15", None, Proto::Any);
                    rule.dst = net;
                    rules.push(rule);
                }
            }
            let t = build(&rules);
            let table = HostTable::build(&t);
            let placed = table.slots.iter().filter(|e| e.family != 0).count();
            prop_assert_eq!(placed + table.unplaced, seen.len());
            for &(use_host, i, v6, v4) in &probes {
                let dst = if use_host {
                    host_addr(&hosts[i % hosts.len()])
                } else if v6 {
                    IpAddr::V6(Ipv6Addr::from((0x2001_0db8u128 << 96) | u128::from(v4)))
                } else {
                    IpAddr::V4(Ipv4Addr::from(base + v4))
                };
                let (family, addr, trie) = match dst {
                    IpAddr::V4(a) => {
                        let mut addr = [0u8; 16];
                        addr[..4].copy_from_slice(&a.octets());
                        (4, addr, longest(&t.v4, &a.octets()).map(|e| e.rules))
                    }
                    IpAddr::V6(a) => (6, a.octets(), longest(&t.v6, &a.octets()).map(|e| e.rules)),
                };
                if let Some(hit) = table.lookup(family, &addr) {
                    prop_assert_eq!(Some(*hit), trie, "{}", dst);
                } else {
                    // A miss is right unless the destination was placed.
                    let placed_here =
                        table.slots.iter().any(|e| e.family == family && e.addr == addr);
                    prop_assert!(!placed_here, "{} placed but not found", dst);
                }
            }
        }

        #[test]
        fn classify_matches_oracle(
            v4_bases in prop::collection::vec(0u32..(1 << 17), 3),
            v6_bases in prop::collection::vec(any::<u128>(), 3),
            raw_rules in prop::collection::vec(
                (any::<bool>(), 0usize..3, 0usize..8, 0usize..4, 0usize..4), 1..14),
            packets in prop::collection::vec(
                (any::<bool>(), 0usize..3, jitter(), 0usize..5, 0usize..6), 64),
            previous_offset in 0u32..4,
        ) {
            let mut rules: Vec<RuleSpec> = Vec::new();
            for (i, &(v6, base, len, port, proto)) in raw_rules.iter().enumerate() {
                let addr = addr_of(v6, &v4_bases, &v6_bases, base, 0);
                let len = if v6 { V6_LENS[len] } else { V4_LENS[len] };
                let proto = PROTOS[proto];
                let port = if proto == Proto::Icmp { None } else { PORTS[port] };
                let dst = IpNet::new(addr, len).unwrap().trunc();
                // Skip rules that would make the set ambiguous (config rejects those).
                if rules.iter().any(|r| r.dst == dst && r.dst_port == port && r.proto == proto) {
                    continue;
                }
                let mut rule = spec(&format!("r{i}"), "198.18.0.0/15", port, proto);
                rule.dst = dst;
                rules.push(rule);
            }
            // Some rules carry a slot from an earlier generation.
            let previous: BTreeMap<String, u32> = rules
                .iter()
                .enumerate()
                .filter(|(i, _)| i % 2 == 0)
                .map(|(i, r)| (r.name.clone(), i as u32 * 3 + previous_offset))
                .collect();
            let slots = assign_slots(&previous, &rules).unwrap();
            for (name, slot) in &previous {
                prop_assert_eq!(slots[name], *slot);
            }
            let table = compile(&rules, &slots).unwrap();
            for &(v6, base, jitter, port, proto) in &packets {
                let dst = addr_of(v6, &v4_bases, &v6_bases, base, jitter);
                let port = [None, Some(53), Some(80), Some(443), Some(8080)][port];
                let proto = PACKET_PROTOS[proto];
                let got = classify(&table, dst, port, proto);
                let want = oracle(&rules, dst, port, proto).map(|r| slots[&r.name]);
                prop_assert_eq!(got, want, "dst {} port {:?} proto {}", dst, port, proto);
            }
        }
    }

    /// A per-source rule that names no prefix buckets IPv6 sources by their /64: every
    /// address of one subscriber's /64 meets the same bucket, another /64 its own.
    #[test]
    fn per_source_buckets_an_ipv6_subscriber_by_its_64() {
        let c = crate::config::Config::parse(
            "[[rules]]\nname = \"v6-subscribers\"\ndst = \"2001:db8::10\"\n\
             [rules.per_source]\nrate = 10\nburst = 10\n",
            std::path::Path::new("test.toml"),
        )
        .unwrap();
        let slots = assign_slots(&BTreeMap::new(), &c.rules).unwrap();
        let table = compile(&c.rules, &slots).unwrap();
        let rule = table.rule(slots["v6-subscribers"]).unwrap();
        let key = |addr: &str| {
            let addr: std::net::Ipv6Addr = addr.parse().unwrap();
            limiter_common::abi::SourceKey::masked(
                0,
                6,
                &addr.octets(),
                rule.source_prefix_v4,
                rule.source_prefix_v6,
            )
        };
        // Rotating through the low 64 bits (privacy addresses, or an attacker walking its
        // own /64) finds no fresh bucket.
        let home = key("2001:db8:1:2::1");
        for other in [
            "2001:db8:1:2::2",
            "2001:db8:1:2:ffff:ffff:ffff:ffff",
            "2001:db8:1:2:8000::",
        ] {
            assert_eq!(key(other), home, "{other} left its /64's bucket");
        }
        assert_ne!(
            key("2001:db8:1:3::1"),
            home,
            "another /64 shares the bucket"
        );
    }

    /// `enforce_percent` below 100 makes the entry a canary with the percentage's
    /// threshold; 100 (the default) leaves the entry as an enforcing rule's.
    #[test]
    fn enforce_percent_compiles_to_the_canary_threshold() {
        let mut rule = spec("r", "198.18.0.1/32", None, Proto::Any);
        let full = rule_config(&rule).unwrap();
        assert_eq!(full.flags & abi::RULE_CANARY, 0);
        assert_eq!(Percent::of_rule(&full), Percent::ALL);
        for thousandths in [0, 1, 2_500, 5_000, 99_999] {
            rule.enforce = Percent(thousandths);
            let canary = rule_config(&rule).unwrap();
            assert_ne!(canary.flags & abi::RULE_CANARY, 0, "{thousandths}");
            assert_eq!(
                canary.canary_threshold,
                limiter_common::canary::threshold(thousandths)
            );
            assert_eq!(Percent::of_rule(&canary), Percent(thousandths));
        }
    }
}
