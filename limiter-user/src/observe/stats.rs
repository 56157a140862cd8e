//! Counters and rule state as operators read them (`limiter stats`).

use std::collections::BTreeMap;

use limiter_common::{
    abi::{
        GlobalCounters, HeaderCounters, RuleConfig, RuleCounters, TunnelCounters, CONTROL_BYPASS,
        RULE_FAIL_STATIC, RULE_HAS_AGGREGATE, RULE_HAS_PER_SOURCE, RULE_SHADOW, RULE_SOURCES_ASIDE,
        RULE_SOURCES_SATURATED,
    },
    drop::{MonitorCounters, ReasonCounters, NO_RULE},
    share::ShareState,
};
use serde::Serialize;

use crate::{
    bpf::maps::Maps,
    config::{Mode, Percent},
    error::Error,
};

/// `limiter stats --json`: the shape is part of the user contract (docs/operations.md, "CLI").
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
    #[serde(serialize_with = "spelled")]
    pub mode: Mode,
    /// The share of sources whose refusals the rule drops, in percent: 100 in enforce
    /// mode, 0 in shadow mode, a canary's `enforce_percent` (the rest pass as would-drop).
    pub enforce_percent: Percent,
    /// standalone | bootstrap | leased | sticky | fail_open ([`ShareState::as_str`])
    #[serde(serialize_with = "spelled")]
    pub state: ShareState,
    /// Aggregate rate and burst in the rule's unit; null without an aggregate limit.
    pub rate: Option<u64>,
    pub burst: Option<u64>,
    /// The kernel's counters, flattened: `passed_packets` … `would_drop_bytes`.
    #[serde(flatten)]
    pub counters: RuleCounters,
    /// Whether a flood has saturated the rule's part of the per-source sketch (the
    /// daemon's gate, recorded in the rule's entry); null without a per-source limit.
    pub sources_saturated: Option<bool>,
    /// Whether the per-source limit stands aside meanwhile (`on_saturation =
    /// "stand-aside"`): what it refuses goes on to the aggregate.
    pub sources_aside: bool,
    /// Estimated share of fresh sources under their limit that the rule's cells refuse
    /// now, in parts per million (a sample of its cells); null without a per-source limit.
    pub sources_false_limit_ppm: Option<u64>,
    /// Why the rule refused: per reason (`DropReason::label`), its dropped and
    /// would-drop packets; only the reasons that refused anything.
    pub reasons: BTreeMap<&'static str, ReasonCount>,
}

/// One reason's refusals.
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq, Eq)]
pub struct ReasonCount {
    pub dropped_packets: u64,
    pub would_drop_packets: u64,
}

/// The non-zero reasons of `counters`, by label.
pub fn reason_map(counters: &ReasonCounters) -> BTreeMap<&'static str, ReasonCount> {
    counters
        .nonzero()
        .map(|(reason, dropped_packets, would_drop_packets)| {
            (
                reason.label(),
                ReasonCount {
                    dropped_packets,
                    would_drop_packets,
                },
            )
        })
        .collect()
}

/// `stats --json`'s `global`: one flat object. The kernel's counter structs are
/// flattened into it, so their field names are the JSON's and are listed once.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct GlobalStats {
    #[serde(flatten)]
    pub counters: GlobalCounters,
    /// Fragments and header evasions ([`HeaderCounters`]).
    #[serde(flatten)]
    pub headers: HeaderCounters,
    /// Frames of configured tunnels ([`TunnelCounters`]): classified by their inner
    /// header, or dropped because the outer first fragment does not hold it.
    pub tunnels: TunnelCounters,
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
    /// Frames dropped before any rule could see them (deep VLAN stacks, unreadable
    /// tunnels), by reason; only the reasons that dropped anything.
    pub no_rule_reasons: BTreeMap<&'static str, ReasonCount>,
    /// Sampled drop events (`[monitor]`): written, skipped (this CPU's budget for the
    /// second spent), lost (the ring buffer full).
    pub monitor: MonitorCounters,
}

/// The share state as of `now_ns`: the entry's state advanced by its own deadlines, so a
/// lapsed lease reads STICKY and an expired open rule FAIL_OPEN on time, exactly when the
/// kernel acts on them, even if the daemon that wrote the entry is gone. A value no
/// state has (only this daemon writes the entry: never seen) reads as standalone.
pub fn share_state_at(rule: &RuleConfig, now_ns: u64) -> ShareState {
    let written = ShareState::try_from(rule.share_state);
    if written == Ok(ShareState::Standalone) {
        return ShareState::Standalone;
    }
    let passed = |deadline: u64| deadline != 0 && now_ns.wrapping_sub(deadline) as i64 >= 0;
    if passed(rule.fail_open_at_ns) && rule.flags & RULE_FAIL_STATIC == 0 {
        return ShareState::FailOpen;
    }
    if written == Ok(ShareState::Leased) && passed(rule.lease_expires_ns) {
        return ShareState::Sticky;
    }
    written.unwrap_or(ShareState::Standalone)
}

fn rule_stats(
    rule: &RuleConfig,
    maps: &Maps,
    slot: u32,
    sample_cells: u32,
) -> Result<RuleStats, Error> {
    let c = maps.rule_counters(slot)?;
    let has_aggregate = rule.flags & RULE_HAS_AGGREGATE != 0;
    let per_source = rule.flags & RULE_HAS_PER_SOURCE != 0;
    let false_limits = if per_source {
        let now = limiter_common::gcra::ticks_from_ns(limiter_fleet::clock::monotonic_ns());
        let sample = maps.saturation_sample(rule, now, sample_cells, 0)?;
        Some((sample.false_limit_ratio() * 1e6).round() as u64)
    } else {
        None
    };
    Ok(RuleStats {
        name: String::from_utf8_lossy(rule.name_bytes()).into_owned(),
        mode: if rule.flags & RULE_SHADOW != 0 {
            Mode::Shadow
        } else {
            Mode::Enforce
        },
        enforce_percent: Percent::of_rule(rule),
        state: share_state_at(rule, limiter_fleet::clock::monotonic_ns()),
        rate: has_aggregate.then_some(rule.rate),
        burst: has_aggregate.then_some(rule.burst),
        counters: RuleCounters {
            passed_packets: c.passed_packets,
            passed_bytes: c.passed_bytes,
            dropped_packets: c.dropped_packets,
            dropped_bytes: c.dropped_bytes,
            would_drop_packets: c.would_drop_packets,
            would_drop_bytes: c.would_drop_bytes,
            refused_early_packets: c.refused_early_packets,
            refused_early_bytes: c.refused_early_bytes,
        },
        sources_saturated: per_source.then_some(rule.flags & RULE_SOURCES_SATURATED != 0),
        sources_aside: per_source && rule.flags & RULE_SOURCES_ASIDE != 0,
        sources_false_limit_ppm: false_limits,
        reasons: reason_map(&maps.reason_counters(slot)?),
    })
}

/// Reads every live rule's counters and the global counters.
pub fn collect(maps: &Maps) -> Result<StatsReport, Error> {
    collect_for(maps, &maps.live_rules()?)
}

/// [`collect`] for the rules `rules` (by slot) as their owner installed them: the
/// daemon's metrics read the counters off its lock, with the table it holds.
pub fn collect_for(maps: &Maps, rules: &BTreeMap<u32, RuleConfig>) -> Result<StatsReport, Error> {
    let sample_cells = crate::policy::saturation::cells_per_rule(
        rules
            .values()
            .filter(|r| r.flags & RULE_HAS_PER_SOURCE != 0)
            .count(),
    );
    let rules = rules
        .iter()
        .map(|(slot, rule)| rule_stats(rule, maps, *slot, sample_cells))
        .collect::<Result<Vec<_>, _>>()?;
    let g = maps.global_counters()?;
    let h = maps.header_counters()?;
    let sketch = maps.sketch_counters()?;
    let fill = maps.sketch_busy(limiter_common::gcra::ticks_from_ns(
        limiter_fleet::clock::monotonic_ns(),
    ))?;
    Ok(StatsReport {
        rules,
        bypass: maps.control()?.flags & CONTROL_BYPASS != 0,
        global: GlobalStats {
            counters: g,
            headers: h,
            tunnels: maps.tunnel_counters()?,
            handoff_missing: maps.handoff_counters()?.missing,
            new_sources: sketch.new_sources,
            source_refusals: sketch.refused,
            sketch_busy_ppm: (fill.ratio() * 1e6).round() as u64,
            no_rule_reasons: reason_map(&maps.reason_counters(NO_RULE)?),
            monitor: maps.monitor_counters()?,
        },
    })
}

/// The MODE column of `stats` and `top`: `enforce`, `shadow`, or a canary's
/// `canary 2.5%`.
pub fn mode_text(r: &RuleStats) -> String {
    if r.is_canary() {
        format!("canary {}%", r.enforce_percent)
    } else {
        r.mode.to_string()
    }
}

impl RuleStats {
    /// Enforcing for some of its sources only (`enforce_percent` below 100): the others'
    /// refusals pass as would-drops.
    pub fn is_canary(&self) -> bool {
        self.mode == Mode::Enforce && self.enforce_percent < Percent::ALL
    }
}

/// `title: name value name value …`, a line.
fn line(title: &str, counters: &[(&str, u64)]) -> String {
    let pairs: Vec<String> = counters.iter().map(|(n, v)| format!("{n} {v}")).collect();
    format!("{title}: {}\n", pairs.join(" "))
}

/// Writes a word (a mode, a share state) as users read it: its spelling, `"enforce"`,
/// `"leased"`.
fn spelled<S: serde::Serializer>(word: &impl std::fmt::Display, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(word)
}

/// A fixed-width table for terminals.
pub fn render_table(report: &StatsReport) -> String {
    let mut out = format!(
        "{:<24} {:<12} {:<10} {:>12} {:>14} {:>14} {:>14}\n",
        "RULE", "MODE", "STATE", "RATE", "PASSED", "DROPPED", "WOULD_DROP"
    );
    for r in &report.rules {
        let rate = r.rate.map_or_else(|| "-".to_string(), |v| v.to_string());
        out.push_str(&format!(
            "{:<24} {:<12} {:<10} {:>12} {:>14} {:>14} {:>14}\n",
            r.name,
            mode_text(r),
            r.state.as_str(),
            rate,
            r.counters.passed_packets,
            r.counters.dropped_packets,
            r.counters.would_drop_packets
        ));
    }
    for r in report
        .rules
        .iter()
        .filter(|r| r.sources_saturated == Some(true))
    {
        out.push_str(&format!(
            "SATURATED: rule {}'s per-source cells refuse about {:.2}% of fresh sources under \
             their limit; {}\n",
            r.name,
            r.sources_false_limit_ppm.unwrap_or(0) as f64 / 1e4,
            if r.sources_aside {
                "its per-source limit stands aside (the aggregate keeps holding)"
            } else {
                "its per-source limit keeps refusing (on_saturation = \"enforce\")"
            }
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
    for r in report.rules.iter().filter(|r| !r.reasons.is_empty()) {
        out.push_str(&reasons_line(&format!("reasons {}", r.name), &r.reasons));
    }
    if !g.no_rule_reasons.is_empty() {
        out.push_str(&reasons_line("reasons (no rule)", &g.no_rule_reasons));
    }
    out.push_str(&line("global", &g.counters.named()));
    out.push_str(&line("headers", &g.headers.named()));
    out.push_str(&line("tunnels", &g.tunnels.named()));
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
    out.push_str(&format!(
        "monitor: sampled {} skipped (budget) {} lost (buffer full) {}\n",
        g.monitor.sampled, g.monitor.skipped_budget, g.monitor.lost_full
    ));
    out
}

/// `title (dropped/would-drop): reason d/w …`, a line.
fn reasons_line(title: &str, reasons: &BTreeMap<&'static str, ReasonCount>) -> String {
    let pairs: Vec<String> = reasons
        .iter()
        .map(|(r, c)| format!("{r} {}/{}", c.dropped_packets, c.would_drop_packets))
        .collect();
    format!("{title} (dropped/would-drop): {}\n", pairs.join(" "))
}

#[cfg(test)]
mod tests {
    use limiter_common::share::ShareState::{self, *};

    use super::*;

    const S: u64 = 1_000_000_000;

    fn entry(state: u32, lease_expires_ns: u64, fail_open_at_ns: u64, flags: u32) -> RuleConfig {
        RuleConfig {
            share_state: state,
            lease_expires_ns,
            fail_open_at_ns,
            flags,
            ..RuleConfig::EMPTY
        }
    }

    /// The state read at 10 s from entries written earlier: each deadline moves the
    /// state on its own, as the kernel acts on it, and a value no state has reads as
    /// standalone (its deadlines still apply, as in the kernel).
    #[test]
    fn the_written_state_advances_by_its_own_deadlines() {
        let now = 10 * S;
        let static_rule = RULE_FAIL_STATIC;
        #[rustfmt::skip]
        let cases: [(&str, RuleConfig, ShareState); 11] = [
            ("standalone ignores deadlines",   entry(0, S, S, 0),                     Standalone),
            ("bootstrap before its deadlines", entry(1, 20 * S, 30 * S, 0),           Bootstrap),
            ("bootstrap past fail-open",       entry(1, S, 2 * S, 0),                 FailOpen),
            ("leased within its lease",        entry(2, 11 * S, 40 * S, 0),           Leased),
            ("leased, lease lapsed",           entry(2, 9 * S, 40 * S, 0),            Sticky),
            ("leased, lapsing right now",      entry(2, now, 40 * S, 0),              Sticky),
            ("leased, no fail-open (static)",  entry(2, 9 * S, 0, 0),                 Sticky),
            ("static never fails open",        entry(3, S, 2 * S, static_rule),       Sticky),
            ("fail-open deadline passed",      entry(2, S, 5 * S, 0),                 FailOpen),
            ("an unknown value",               entry(9, S, 40 * S, 0),                Standalone),
            ("an unknown value past fail-open", entry(9, S, 5 * S, 0),                FailOpen),
        ];
        for (what, rule, want) in cases {
            assert_eq!(share_state_at(&rule, now), want, "{what}");
        }
    }
}

#[cfg(test)]
mod json_tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

    use super::*;

    /// `stats --json` is a user contract: the shape docs/operations.md shows is the shape
    /// printed, key for key and in order (the kernel's counter structs flattened into
    /// `global`).
    #[test]
    fn stats_json_is_the_documented_example() {
        let doc = include_str!("../../../docs/operations.md");
        let start = doc
            .find("`stats --json` prints:\n\n```json\n")
            .expect("docs/operations.md: the stats --json example");
        let block = &doc[start..];
        let block = &block[block.find("{").unwrap()..block.find("\n```\n").unwrap()];
        let shown: String = block.split_whitespace().collect();
        let report = StatsReport {
            rules: vec![RuleStats {
                name: "contoso-web".into(),
                mode: Mode::Enforce,
                enforce_percent: crate::config::Percent::ALL,
                state: ShareState::Standalone,
                rate: Some(10_000),
                burst: Some(2_000),
                counters: RuleCounters {
                    passed_packets: 0,
                    passed_bytes: 0,
                    dropped_packets: 0,
                    dropped_bytes: 0,
                    would_drop_packets: 0,
                    would_drop_bytes: 0,
                    refused_early_packets: 0,
                    refused_early_bytes: 0,
                },
                sources_saturated: Some(false),
                sources_aside: false,
                sources_false_limit_ppm: Some(0),
                reasons: BTreeMap::from([(
                    "aggregate",
                    ReasonCount {
                        dropped_packets: 0,
                        would_drop_packets: 0,
                    },
                )]),
            }],
            global: GlobalStats {
                counters: GlobalCounters::default(),
                headers: HeaderCounters::default(),
                tunnels: TunnelCounters::default(),
                handoff_missing: 0,
                new_sources: 0,
                source_refusals: 0,
                sketch_busy_ppm: 0,
                no_rule_reasons: BTreeMap::new(),
                monitor: MonitorCounters::default(),
            },
            bypass: false,
        };
        assert_eq!(serde_json::to_string(&report).unwrap(), shown);
    }
}
