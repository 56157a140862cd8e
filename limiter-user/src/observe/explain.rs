//! `limiter explain`: which rule a frame meets, which buckets it is metered by, their
//! state right now, recent drops, and whether a frame sent now would pass. The bucket
//! arithmetic is the kernel's own (limiter-common), evaluated without consuming anything.

use std::net::IpAddr;

use limiter_common::{
    abi::{
        addr_words, AddrWords, RuleConfig, SourceKey, CONTROL_BYPASS, RULE_CANARY,
        RULE_CLOSED_UNTIL_LAPSE, RULE_FAIL_STATIC, RULE_HAS_AGGREGATE, RULE_HAS_PER_SOURCE,
        RULE_SHADOW, RULE_SOURCES_ASIDE, RULE_SOURCES_SATURATED, UNIT_BYTES, UNIT_SYN,
    },
    canary,
    drop::DropReason,
    gcra::{self, Limit},
    share::ShareState,
    sketch,
};
use serde::{Deserialize, Serialize};

use crate::{
    bpf::maps::Maps,
    config::{Percent, Proto, Unit},
    error::Error,
    observe::stats::share_state_at,
    policy::ruleset::{self, RuleTable},
};

/// A frame to explain.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ExplainQuery {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub dst_port: Option<u16>,
    /// tcp | udp | icmp | any (`any`: a protocol no rule names, e.g. GRE).
    pub proto: Proto,
    /// Frame length for bytes rules.
    pub frame_len: u32,
    /// For TCP: a SYN without ACK (what `syn` rules meter).
    pub syn: bool,
}

/// One bucket as of now.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct BucketView {
    /// "rule" for the aggregate; the masked source prefix for a per-source bucket.
    pub key: String,
    pub rate: u64,
    pub burst: u64,
    /// Units a frame could take right now (0 when the bucket is empty).
    pub available: u64,
    /// Milliseconds until the bucket is full again.
    pub refill_ms: u64,
    /// Would the frame conform to this bucket now?
    pub conforms: bool,
    /// A closed limit (a fleet share of 0): nothing passes until a grant opens it.
    #[serde(default)]
    pub closed: bool,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Explanation {
    pub query: ExplainQuery,
    /// The rule the frame meets (null: no rule, the frame passes unmetered).
    pub rule: Option<String>,
    pub slot: Option<u32>,
    pub mode: Option<String>,
    /// A canary rule (`enforce_percent` below 100): its percentage and whether this
    /// source is in it (its refusals drop) or not (they pass as would-drops).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary: Option<CanaryView>,
    pub unit: Option<String>,
    pub share_state: Option<String>,
    pub aggregate: Option<BucketView>,
    pub per_source: Option<BucketView>,
    /// A flood saturates the rule's per-source cells (honest sources under their limit
    /// are refused too), and whether the per-source limit stands aside meanwhile
    /// (`on_saturation`): then what it refuses goes on to the aggregate.
    #[serde(default)]
    pub sources_saturated: bool,
    #[serde(default)]
    pub sources_aside: bool,
    /// Fleet mode: what is left of the share's credit while its lease holds (frames the
    /// aggregate bucket refuses pass on it); 0 otherwise.
    #[serde(default)]
    pub credit: u64,
    pub dropped_total: u64,
    pub dropped_last_10s: u64,
    pub dropped_last_60s: u64,
    /// "pass" or "drop": what happens to such a frame sent now.
    pub verdict: String,
    pub reason: String,
    /// The reason the program would count a refusal of such a frame under
    /// (`DropReason::label`, as `stats --json`'s `reasons` and the metrics' `reason`);
    /// null when it would pass unrefused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drop_reason: Option<String>,
    /// What runs at each interface's hook around the limiter: where a frame it passes
    /// goes next (filled in by the daemon).
    #[serde(default)]
    pub hooks: Vec<HookChain>,
    /// Where a frame the limiter passes goes next, per interface (`next_program`,
    /// `join_program_array`); empty: the stack.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub then: Vec<String>,
}

/// Where a source stands in a rule's canary.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct CanaryView {
    pub enforce_percent: Percent,
    /// The source (masked to the rule's source prefix) is in the canary: the rule's
    /// refusals of it drop.
    pub enforced: bool,
}

impl CanaryView {
    /// "enforced: in the 5 % canary" / "would-drop only: outside the 5 % canary".
    fn describe(&self) -> String {
        if self.enforced {
            format!("enforced: in the {} % canary", self.enforce_percent)
        } else {
            format!(
                "would-drop only: outside the {} % canary",
                self.enforce_percent
            )
        }
    }
}

/// The chain at one interface's hook.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct HookChain {
    pub interface: String,
    pub chain: Vec<crate::policy::hook::ChainEntry>,
}

/// "at IFACE: 1. …" lines for [`render`].
fn render_hooks(hooks: &[HookChain]) -> String {
    let mut out = String::new();
    for h in hooks {
        out += &format!("at {}:\n", h.interface);
        for (n, e) in h.chain.iter().enumerate() {
            out += &format!(
                "  {}. {} (id {}){}: {}\n",
                n + 1,
                e.name,
                e.program_id,
                if e.limiter { " <- the limiter" } else { "" },
                e.how
            );
        }
    }
    out
}

fn proto_number(proto: Proto, v6: bool) -> u8 {
    // `any` in a query means "some other protocol": 253 is reserved for experiments.
    ruleset::ip_proto(proto, v6).unwrap_or(253)
}

/// The rate (units per second, rounded) a compiled limit enforces, for display.
fn rate_of(limit: &Limit) -> u64 {
    if limit.interval == 0 {
        return 0;
    }
    let scaled = u128::from(gcra::TICKS_PER_SECOND) << gcra::FRAC_BITS;
    let interval = u128::from(limit.interval);
    u64::try_from((scaled + interval / 2) / interval).unwrap_or(u64::MAX)
}

/// A bucket's state at `now` (ticks), pure.
pub fn bucket_view(
    key: String,
    rate: u64,
    burst: u64,
    limit: &Limit,
    tat: u64,
    now: u64,
    units: u64,
) -> BucketView {
    if limit.is_closed() {
        return BucketView {
            key,
            rate: 0,
            burst: 0,
            available: 0,
            refill_ms: 0,
            conforms: false,
            closed: true,
        };
    }
    let ahead = tat.wrapping_sub(now);
    let used = if tat == 0 || (ahead as i64) <= 0 {
        0
    } else {
        ahead.min(limit.tolerance)
    };
    let unit_cost = limit.cost(1).max(1);
    let available = (limit.tolerance - used) / unit_cost;
    BucketView {
        key,
        rate,
        burst,
        available,
        refill_ms: gcra::ns_from_ticks(used) / 1_000_000,
        conforms: gcra::conform(tat, now, limit.cost(units), limit.tolerance).admit,
        closed: false,
    }
}

/// The address family of a source, as the program's `MeterInput` has it.
fn family_of(src: IpAddr) -> u32 {
    if src.is_ipv6() {
        6
    } else {
        4
    }
}

/// A source's address as the program holds it: words, network order, IPv4 first.
fn src_words(src: IpAddr) -> AddrWords {
    let mut bytes = [0u8; 16];
    match src {
        IpAddr::V4(a) => bytes[..4].copy_from_slice(&a.octets()),
        IpAddr::V6(a) => bytes = a.octets(),
    }
    addr_words(&bytes)
}

fn source_label(query: &ExplainQuery, rule: &RuleConfig) -> String {
    match query.src {
        IpAddr::V4(a) => format!(
            "{}/{}",
            mask_v4(a, rule.source_prefix_v4),
            rule.source_prefix_v4
        ),
        IpAddr::V6(a) => {
            let key = SourceKey::masked(0, 6, &a.octets(), 32, rule.source_prefix_v6);
            format!(
                "{}/{}",
                std::net::Ipv6Addr::from(key.addr),
                rule.source_prefix_v6
            )
        }
    }
}

fn mask_v4(a: std::net::Ipv4Addr, prefix: u32) -> std::net::Ipv4Addr {
    let mut src = [0u8; 16];
    src[..4].copy_from_slice(&a.octets());
    let key = SourceKey::masked(0, 4, &src, prefix, 128);
    std::net::Ipv4Addr::new(key.addr[0], key.addr[1], key.addr[2], key.addr[3])
}

/// Explains `query` against the live `table` and the buckets in `maps`. `recent` gives
/// (drops in the last 10 s, in the last 60 s) for a rule name and its drop total.
pub fn explain(
    table: &RuleTable,
    maps: &Maps,
    query: &ExplainQuery,
    recent: impl Fn(&str, u64) -> (u64, u64),
) -> Result<Explanation, Error> {
    let mut out = explain_metered(table, maps, query, recent)?;
    // The kill switch comes before everything the program does.
    if maps.control()?.flags & CONTROL_BYPASS != 0 {
        out.reason = format!(
            "the CONTROL bypass bit is set: every frame passes unclassified and unmetered \
             (without it: {}, {})",
            out.verdict, out.reason
        );
        out.verdict = "pass".into();
    }
    Ok(out)
}

/// What the rule's buckets would do with the frame, as if bypass were off.
fn explain_metered(
    table: &RuleTable,
    maps: &Maps,
    query: &ExplainQuery,
    recent: impl Fn(&str, u64) -> (u64, u64),
) -> Result<Explanation, Error> {
    let v6 = query.dst.is_ipv6();
    let proto = proto_number(query.proto, v6);
    let port = matches!(query.proto, Proto::Tcp | Proto::Udp)
        .then_some(query.dst_port)
        .flatten();
    let mut out = Explanation {
        query: query.clone(),
        rule: None,
        slot: None,
        mode: None,
        canary: None,
        unit: None,
        share_state: None,
        aggregate: None,
        per_source: None,
        sources_saturated: false,
        sources_aside: false,
        credit: 0,
        dropped_total: 0,
        dropped_last_10s: 0,
        dropped_last_60s: 0,
        verdict: "pass".into(),
        reason: "no rule matches this destination: the frame passes unmetered".into(),
        drop_reason: None,
        hooks: Vec::new(),
        then: Vec::new(),
    };
    let Some(slot) = ruleset::classify(table, query.dst, port, proto) else {
        return Ok(out);
    };
    let rule = table
        .rule(slot)
        .ok_or_else(|| Error::UnknownRule(format!("slot {slot}")))?;
    let name = table.name_of(slot).unwrap_or("?").to_string();
    let counters = maps.rule_counters(slot)?;
    let (last10, last60) = recent(&name, counters.dropped_packets);
    out.rule = Some(name);
    out.slot = Some(slot);
    out.mode = Some(
        if rule.flags & RULE_SHADOW != 0 {
            "shadow"
        } else {
            "enforce"
        }
        .into(),
    );
    if rule.flags & RULE_CANARY != 0 {
        // As the program decides at a refusal: the sketch's seed keys the hash.
        let seed = maps.sketch_meta_as_is()?.seed;
        out.canary = Some(CanaryView {
            enforce_percent: Percent::of_rule(rule),
            enforced: canary::enforced(rule, &seed, family_of(query.src), &src_words(query.src)),
        });
    }
    out.unit = Some(
        Unit::from_abi(rule.unit)
            .unwrap_or(Unit::Packets)
            .as_str()
            .into(),
    );
    let now_ns = limiter_fleet::clock::monotonic_ns();
    // As of now: a lapsed lease reads STICKY, as `limiter stats` shows it.
    out.share_state = Some(share_state_at(rule, now_ns).as_str().into());
    out.dropped_total = counters.dropped_packets;
    out.dropped_last_10s = last10;
    out.dropped_last_60s = last60;

    if rule.unit == UNIT_SYN && !(query.proto == Proto::Tcp && query.syn) {
        out.reason = "the rule meters only TCP SYNs (new connections); this frame is not one and passes unmetered".into();
        return Ok(out);
    }
    // As the kernel: FAIL_OPEN opens the aggregate (the fleet's share); a per-source limit
    // keeps holding.
    let failed_open = rule.fail_open_at_ns != 0
        && rule.flags & RULE_FAIL_STATIC == 0
        && now_ns.wrapping_sub(rule.fail_open_at_ns) as i64 >= 0;
    if failed_open && rule.flags & RULE_HAS_PER_SOURCE == 0 {
        out.reason = "the rule's share has expired (fail_mode open): everything passes".into();
        return Ok(out);
    }
    let now = gcra::ticks_from_ns(now_ns);
    let units = if rule.unit == UNIT_BYTES {
        u64::from(query.frame_len)
    } else {
        1
    };
    if rule.flags & RULE_HAS_PER_SOURCE != 0 {
        let src: [u8; 16] = match query.src {
            IpAddr::V4(a) => {
                let mut s = [0u8; 16];
                s[..4].copy_from_slice(&a.octets());
                s
            }
            IpAddr::V6(a) => a.octets(),
        };
        let family = if query.src.is_ipv6() { 6 } else { 4 };
        let key = SourceKey::masked(
            slot,
            family,
            &src,
            rule.source_prefix_v4,
            rule.source_prefix_v6,
        );
        // The source's least advanced cell decides (count-min's min over the rows);
        // cells never used read as a full bucket. The region is the live record's: the
        // install chose it.
        let entry = maps.live_rule(slot)?;
        out.sources_saturated = entry.flags & RULE_SOURCES_SATURATED != 0;
        out.sources_aside = entry.flags & RULE_SOURCES_ASIDE != 0;
        let live = RuleConfig {
            sketch_region: entry.sketch_region,
            ..*rule
        };
        let tat = maps
            .source_cells(&key, &live)?
            .map_or(0, |cells| deciding_tat(&cells, now));
        out.per_source = Some(bucket_view(
            source_label(query, rule),
            rule.source_rate,
            rule.source_burst,
            &rule.per_source,
            tat,
            now,
            units,
        ));
    }
    if rule.flags & RULE_HAS_AGGREGATE != 0 && !failed_open {
        let tat = maps.aggregate_bucket(slot)?.tat;
        // As the program: the credit while the lease holds (unreadable: none).
        if (now_ns.wrapping_sub(rule.lease_expires_ns) as i64) < 0 {
            out.credit = maps.credit_left(slot).unwrap_or(0);
        }
        // A zero share is closed until its lease lapses (then the kernel meters the
        // bootstrap share the entry carries).
        let zero_share = rule.flags & RULE_CLOSED_UNTIL_LAPSE != 0;
        let closed = zero_share && (now_ns.wrapping_sub(rule.lease_expires_ns) as i64) < 0;
        // Lapsed, it meters the bootstrap share its entry carries (burst 1); the entry's
        // display rate is the share's 0.
        let (rate, burst) = if zero_share && !closed {
            (rate_of(&rule.aggregate), 1)
        } else {
            (rule.rate, rule.burst)
        };
        out.aggregate = Some(bucket_view(
            "rule".into(),
            rate,
            burst,
            if closed {
                &Limit::CLOSED
            } else {
                &rule.aggregate
            },
            tat,
            now,
            units,
        ));
    }
    let refused_by = [
        ("per-source", &out.per_source),
        ("aggregate", &out.aggregate),
    ]
    .iter()
    .filter(|(_, b)| b.as_ref().is_some_and(|b| !b.conforms))
    .map(|(what, _)| *what)
    // A per-source limit standing aside refuses nothing (the kernel: meter.rs).
    .filter(|what| !(out.sources_aside && *what == "per-source"))
    .collect::<Vec<_>>();
    let shadow = rule.flags & RULE_SHADOW != 0;
    let on_credit = refused_by == ["aggregate"] && out.credit >= units;
    let (verdict, reason) = match (refused_by.is_empty(), shadow) {
        (true, _) => ("pass", "the frame conforms to every limit of the rule".to_string()),
        (false, _) if on_credit => (
            "pass",
            format!(
                "over the aggregate limit, admitted on the fleet's credit ({} left: quota \
                 the other hosts left unused, lent by the allocator until the next grant)",
                out.credit
            ),
        ),
        (false, true) => (
            "pass",
            format!(
                "over the {} limit, but the rule is in shadow mode: it passes and counts as would-drop",
                refused_by.join(" and ")
            ),
        ),
        (false, false) => match out.canary.filter(|c| !c.enforced) {
            Some(c) => (
                "pass",
                format!(
                    "over the {} limit, but the source is outside the rule's {} % canary: it \
                     passes and counts as would-drop",
                    refused_by.join(" and "),
                    c.enforce_percent
                ),
            ),
            None => ("drop", format!("over the {} limit", refused_by.join(" and "))),
        },
    };
    let reason = if failed_open {
        format!(
            "{reason} (the rule's share has expired, fail_mode open: the aggregate stands \
             aside, the per-source limit holds)"
        )
    } else if out.aggregate.as_ref().is_some_and(|b| b.closed) {
        format!(
            "{reason}: this host's share of the rule's global quota is 0 (closed: the \
             allocator had no room for it, or it had no demand, at its last report); \
             refusals on it ask the allocator for a share"
        )
    } else {
        reason
    };
    let reason = match (out.sources_aside, out.sources_saturated) {
        (true, _) => format!(
            "{reason}; a flood saturates the rule's per-source cells, so its per-source limit \
             stands aside (on_saturation = \"stand-aside\") and the aggregate alone holds"
        ),
        (false, true) => format!(
            "{reason}; a flood saturates the rule's per-source cells, which refuse honest \
             sources too (on_saturation = \"enforce\")"
        ),
        (false, false) => reason,
    };
    // As the kernel (meter.rs): the per-source limit refuses first; the aggregate's
    // refusal is a closed share's, a fleet share's, or a standalone rule's own.
    out.drop_reason = match refused_by.first() {
        _ if on_credit => None,
        None => None,
        Some(&"per-source") => Some(DropReason::PerSource),
        Some(_) if out.aggregate.as_ref().is_some_and(|b| b.closed) => {
            Some(DropReason::ShareClosed)
        }
        Some(_) if rule.share_state != ShareState::Standalone as u32 => {
            Some(DropReason::ShareSpent)
        }
        Some(_) => Some(DropReason::Aggregate),
    }
    .map(|r| r.label().to_string());
    out.verdict = verdict.into();
    out.reason = reason;
    Ok(out)
}

/// Human-readable form.
pub fn render(e: &Explanation) -> String {
    let mut out = render_verdict(e);
    if e.verdict == "pass" {
        for then in &e.then {
            out += &format!("then: {then}\n");
        }
    }
    out + &render_hooks(&e.hooks)
}

fn render_verdict(e: &Explanation) -> String {
    let q = &e.query;
    let port = q.dst_port.map(|p| format!(":{p}")).unwrap_or_default();
    let mut out = format!(
        "frame: {} -> {}{port} ({})\n",
        q.src,
        q.dst,
        q.proto.as_str()
    );
    let Some(rule) = &e.rule else {
        return out + &format!("verdict: {} ({})\n", e.verdict, e.reason);
    };
    out += &format!(
        "rule: {rule} (slot {}, {}, unit {}, share {})\n",
        e.slot.unwrap_or(0),
        e.mode.as_deref().unwrap_or("?"),
        e.unit.as_deref().unwrap_or("?"),
        e.share_state.as_deref().unwrap_or("?")
    );
    if let Some(c) = &e.canary {
        out += &format!("canary: {}\n", c.describe());
    }
    for (what, b) in [("per-source", &e.per_source), ("aggregate", &e.aggregate)] {
        if let Some(b) = b.as_ref().filter(|b| b.closed) {
            out += &format!(
                "{what} bucket {}: closed (share 0/s: nothing passes until a grant), {}\n",
                b.key,
                if b.conforms { "conforms" } else { "EXCEEDED" }
            );
        } else if let Some(b) = b {
            out += &format!(
                "{what} bucket {}: rate {}/s burst {}, {} available now, full again in {} ms, {}\n",
                b.key,
                b.rate,
                b.burst,
                b.available,
                b.refill_ms,
                if b.conforms { "conforms" } else { "EXCEEDED" }
            );
        }
    }
    if e.credit > 0 {
        out += &format!(
            "fleet credit: {} left (spent on frames the aggregate bucket refuses)\n",
            e.credit
        );
    }
    out += &format!(
        "drops: {} in the last 10 s, {} in the last 60 s, {} in total\n",
        e.dropped_last_10s, e.dropped_last_60s, e.dropped_total
    );
    let refusal = e
        .drop_reason
        .as_deref()
        .and_then(|label| DropReason::ALL.into_iter().find(|r| r.label() == label))
        .map(|r| {
            let refuse = if e.verdict == "drop" {
                "refuses"
            } else {
                "would refuse"
            };
            format!("{refuse}: {}\n", r.describe())
        })
        .unwrap_or_default();
    out + &refusal + &format!("verdict now: {} ({})\n", e.verdict, e.reason)
}

/// Of a source's sketch cells (index, TAT), the one that decides its next frame: the
/// least advanced (limiter_common::sketch; cells at rest first).
fn deciding_tat(cells: &[(u32, u64)], now: u64) -> u64 {
    cells
        .iter()
        .map(|&(_, tat)| tat)
        .min_by_key(|&tat| sketch::lead(tat, now))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    /// The least advanced cell decides (it is the tightest upper bound of the source's
    /// own bucket); a cell at rest decides before any other.
    #[test]
    fn the_least_advanced_cell_decides() {
        let now = 1u64 << 40;
        let second = gcra::ticks_from_ns(1_000_000_000);
        assert_eq!(
            deciding_tat(&[(0, now + 10 * second), (7, now + second)], now),
            now + second
        );
        assert_eq!(deciding_tat(&[(0, now + second), (7, 0)], now), 0);
        assert_eq!(
            deciding_tat(&[(0, now - second), (7, now + second)], now),
            now - second
        );
    }

    use limiter_common::gcra::Granularity;

    use super::*;

    #[test]
    fn bucket_view_reads_the_tat() {
        let limit = Limit::new(Granularity::Event, 10, 5).unwrap();
        let now = 1 << 50;
        let full = bucket_view("rule".into(), 10, 5, &limit, 0, now, 1);
        assert_eq!(
            (full.available, full.refill_ms, full.conforms),
            (5, 0, true)
        );
        let empty = bucket_view("rule".into(), 10, 5, &limit, now + limit.tolerance, now, 1);
        assert_eq!(
            (empty.available, empty.refill_ms, empty.conforms),
            (0, 500, false)
        );
        let two_used = bucket_view(
            "rule".into(),
            10,
            5,
            &limit,
            now + 2 * limit.cost(1),
            now,
            1,
        );
        assert_eq!(
            (two_used.available, two_used.refill_ms, two_used.conforms),
            (3, 200, true)
        );
    }

    #[test]
    fn compiled_limits_read_back_as_their_rate() {
        for rate in [1, 20, 999, 10_000, 2_000_000] {
            let l = Limit::new(gcra::Granularity::Event, rate, 1).unwrap();
            assert_eq!(rate_of(&l), rate);
        }
        let bytes = Limit::new(gcra::Granularity::Byte, 12_500_000, 1518).unwrap();
        assert_eq!(rate_of(&bytes), 12_500_000);
    }

    #[test]
    fn a_closed_share_reads_closed_not_about_to_refill() {
        let now = 1 << 50;
        // Whatever the bucket held (fresh, idle, full under an earlier share).
        for tat in [0, now - (1 << 40), now + (1 << 30)] {
            let b = bucket_view("rule".into(), 0, 0, &Limit::CLOSED, tat, now, 1);
            assert!(b.closed && !b.conforms, "{b:?}");
            assert_eq!((b.rate, b.available, b.refill_ms), (0, 0, 0));
        }
        let e = Explanation {
            query: ExplainQuery {
                src: "198.18.0.1".parse().unwrap(),
                dst: "198.18.0.10".parse().unwrap(),
                dst_port: None,
                proto: Proto::Udp,
                frame_len: 64,
                syn: false,
            },
            rule: Some("contoso".into()),
            slot: Some(0),
            mode: Some("enforce".into()),
            canary: None,
            unit: Some("packets".into()),
            share_state: Some("leased".into()),
            aggregate: Some(bucket_view("rule".into(), 0, 0, &Limit::CLOSED, 0, now, 1)),
            per_source: None,
            sources_saturated: false,
            sources_aside: false,
            credit: 0,
            dropped_total: 0,
            dropped_last_10s: 0,
            dropped_last_60s: 0,
            verdict: "drop".into(),
            reason: "over the aggregate limit".into(),
            drop_reason: Some("share_closed".into()),
            hooks: Vec::new(),
            then: vec!["eth0: tail call to program 7 (lb)".into()],
        };
        let text = render(&e);
        assert!(
            text.contains("aggregate bucket rule: closed (share 0/s"),
            "{text}"
        );
        assert!(!text.contains("full again"), "{text}");
        assert!(text.contains("refuses: fleet share closed\n"), "{text}");
        assert!(!text.contains("fleet credit"), "{text}");
        let credited = Explanation {
            credit: 12,
            ..e.clone()
        };
        assert!(
            render(&credited).contains("fleet credit: 12 left"),
            "{}",
            render(&credited)
        );
        assert!(
            !text.contains("then:"),
            "a dropped frame goes nowhere: {text}"
        );
        let pass = Explanation {
            verdict: "pass".into(),
            ..e
        };
        assert!(
            render(&pass).ends_with("then: eth0: tail call to program 7 (lb)\n"),
            "{}",
            render(&pass)
        );
    }

    /// The canary line of `explain`, both ways.
    #[test]
    fn the_canary_line_says_whether_the_source_is_enforced() {
        let view = |enforced| CanaryView {
            enforce_percent: Percent(5_000),
            enforced,
        };
        assert_eq!(view(true).describe(), "enforced: in the 5 % canary");
        assert_eq!(
            view(false).describe(),
            "would-drop only: outside the 5 % canary"
        );
        let json = serde_json::to_string(&view(false)).unwrap();
        assert_eq!(json, r#"{"enforce_percent":5,"enforced":false}"#);
        assert_eq!(
            serde_json::from_str::<CanaryView>(&json).unwrap(),
            view(false)
        );
    }
}
