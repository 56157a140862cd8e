//! Counters and rule state as operators read them (`limiter stats`).

use limiter_common::abi::{
    RuleConfig, CONTROL_BYPASS, RULE_HAS_AGGREGATE, RULE_SHADOW, SHARE_BOOTSTRAP, SHARE_FAIL_OPEN,
    SHARE_LEASED, SHARE_STICKY,
};
use serde::Serialize;

use crate::{error::Error, maps::Maps};

/// `limiter stats --json`: the shape is part of the user contract (DESIGN.md).
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct StatsReport {
    pub rules: Vec<RuleStats>,
    pub global: GlobalStats,
    /// `CONTROL` bypass bit: every frame passes unclassified, unmetered and uncounted
    /// (so every counter stands still).
    pub bypass: bool,
}

#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct RuleStats {
    pub name: String,
    /// enforce | shadow
    pub mode: &'static str,
    /// standalone | bootstrap | leased | sticky | fail_open
    pub state: &'static str,
    /// Aggregate rate and burst in the rule's unit; null without an aggregate limit.
    pub rate: Option<u64>,
    pub burst: Option<u64>,
    pub passed_packets: u64,
    pub passed_bytes: u64,
    pub dropped_packets: u64,
    pub dropped_bytes: u64,
    pub would_drop_packets: u64,
    pub would_drop_bytes: u64,
}

#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct GlobalStats {
    pub malformed: u64,
    pub non_ip: u64,
    pub unmatched: u64,
    pub insert_failures: u64,
    pub contended: u64,
    /// IP fragments seen (first and later ones).
    pub fragments: u64,
    /// First fragments without the whole transport header (IPv6: header chain): refused.
    pub tiny_fragments: u64,
    /// Later fragments whose first fragment did not pass and whose rule depends on ports:
    /// refused.
    pub orphan_fragments: u64,
    /// Later fragments overlapping the first fragment's headers: refused.
    pub overlapping_fragments: u64,
    /// IPv6 header chains longer than the program walks: refused where a rule covers the
    /// destination.
    pub long_header_chains: u64,
    /// Frames with more VLAN tags than the program walks: dropped.
    pub deep_vlan_stacks: u64,
    /// Frames the limiter passed whose next program (`next_program`,
    /// `join_program_array`) was missing: passed to the stack instead (fail open).
    pub handoff_missing: u64,
    /// Frames from sources the per-source sketch held no state for (every cell of theirs
    /// at rest): new sources, or sources back after idling longer than a burst's refill.
    /// Its rate is the new sources per second.
    pub new_sources: u64,
    /// Frames refused by a per-source limit.
    pub source_refusals: u64,
    /// Estimated share of the sketch's cells holding state now, in parts per million
    /// (a sample of 4096 cells).
    pub sketch_busy_ppm: u64,
}

/// The share state as of `now_ns`: the entry's state advanced by its own deadlines, so a
/// lapsed lease reads STICKY and an expired open rule FAIL_OPEN on time, exactly when the
/// kernel acts on them, even if the daemon that wrote the entry is gone.
pub fn share_state_at(rule: &RuleConfig, now_ns: u64) -> u32 {
    if rule.share_state == limiter_common::abi::SHARE_STANDALONE {
        return rule.share_state;
    }
    let passed = |deadline: u64| deadline != 0 && now_ns.wrapping_sub(deadline) as i64 >= 0;
    if passed(rule.fail_open_at_ns) && rule.flags & limiter_common::abi::RULE_FAIL_STATIC == 0 {
        return SHARE_FAIL_OPEN;
    }
    if rule.share_state == SHARE_LEASED && passed(rule.lease_expires_ns) {
        return SHARE_STICKY;
    }
    rule.share_state
}

/// Name of a `SHARE_*` state.
pub fn share_state_name(state: u32) -> &'static str {
    match state {
        SHARE_BOOTSTRAP => "bootstrap",
        SHARE_LEASED => "leased",
        SHARE_STICKY => "sticky",
        SHARE_FAIL_OPEN => "fail_open",
        _ => "standalone",
    }
}

fn rule_stats(rule: &RuleConfig, maps: &Maps, slot: u32) -> Result<RuleStats, Error> {
    let c = maps.rule_counters(slot)?;
    let has_aggregate = rule.flags & RULE_HAS_AGGREGATE != 0;
    Ok(RuleStats {
        name: String::from_utf8_lossy(rule.name_bytes()).into_owned(),
        mode: if rule.flags & RULE_SHADOW != 0 {
            "shadow"
        } else {
            "enforce"
        },
        state: share_state_name(share_state_at(rule, crate::fleet::monotonic_ns())),
        rate: has_aggregate.then_some(rule.rate),
        burst: has_aggregate.then_some(rule.burst),
        passed_packets: c.passed_packets,
        passed_bytes: c.passed_bytes,
        dropped_packets: c.dropped_packets,
        dropped_bytes: c.dropped_bytes,
        would_drop_packets: c.would_drop_packets,
        would_drop_bytes: c.would_drop_bytes,
    })
}

/// Reads every live rule's counters and the global counters.
pub fn collect(maps: &Maps) -> Result<StatsReport, Error> {
    let rules = maps
        .live_rules()?
        .iter()
        .map(|(slot, rule)| rule_stats(rule, maps, *slot))
        .collect::<Result<Vec<_>, _>>()?;
    let g = maps.global_counters()?;
    let h = maps.header_counters()?;
    let sketch = maps.sketch_counters()?;
    let fill = maps.sketch_busy(limiter_common::gcra::ticks_from_ns(
        crate::fleet::monotonic_ns(),
    ))?;
    Ok(StatsReport {
        rules,
        bypass: maps.control()?.flags & CONTROL_BYPASS != 0,
        global: GlobalStats {
            malformed: g.malformed,
            non_ip: g.non_ip,
            unmatched: g.unmatched,
            insert_failures: g.insert_failures,
            contended: g.contended,
            fragments: h.fragments,
            tiny_fragments: h.tiny_fragments,
            orphan_fragments: h.orphan_fragments,
            overlapping_fragments: h.overlapping_fragments,
            long_header_chains: h.long_header_chains,
            deep_vlan_stacks: h.deep_vlan_stacks,
            handoff_missing: maps.handoff_counters()?.missing,
            new_sources: sketch.new_sources,
            source_refusals: sketch.refused,
            sketch_busy_ppm: (fill.ratio() * 1e6).round() as u64,
        },
    })
}

/// A fixed-width table for terminals.
pub fn render_table(report: &StatsReport) -> String {
    let mut out = format!(
        "{:<24} {:<8} {:<10} {:>12} {:>14} {:>14} {:>14}\n",
        "RULE", "MODE", "STATE", "RATE", "PASSED", "DROPPED", "WOULD_DROP"
    );
    for r in &report.rules {
        let rate = r.rate.map_or_else(|| "-".to_string(), |v| v.to_string());
        out.push_str(&format!(
            "{:<24} {:<8} {:<10} {:>12} {:>14} {:>14} {:>14}\n",
            r.name,
            r.mode,
            r.state,
            rate,
            r.passed_packets,
            r.dropped_packets,
            r.would_drop_packets
        ));
    }
    if report.bypass {
        out.push_str(
            "BYPASS ON: every frame passes unclassified, unmetered and uncounted (CONTROL flags \
             bit 0); these counters stand still\n",
        );
    } else {
        out.push_str("bypass: off\n");
    }
    let g = &report.global;
    out.push_str(&format!(
        "global: malformed {} non_ip {} unmatched {} insert_failures {} contended {}\n",
        g.malformed, g.non_ip, g.unmatched, g.insert_failures, g.contended
    ));
    out.push_str(&format!(
        "headers: fragments {} tiny_fragments {} orphan_fragments {} overlapping_fragments {} \
         long_header_chains {} deep_vlan_stacks {}\n",
        g.fragments,
        g.tiny_fragments,
        g.orphan_fragments,
        g.overlapping_fragments,
        g.long_header_chains,
        g.deep_vlan_stacks
    ));
    out.push_str(&format!(
        "handoff: next program missing {}\n",
        g.handoff_missing
    ));
    out.push_str(&format!(
        "sources: new {} refused {} sketch cells busy {:.2}%\n",
        g.new_sources,
        g.source_refusals,
        g.sketch_busy_ppm as f64 / 1e4
    ));
    out
}
