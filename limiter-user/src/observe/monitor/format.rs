//! An event as a line of text (what `limiter monitor` prints) and as a JSON object
//! (`--json`, one a line). Both take the names the reader resolved (rule, interface) and
//! the wall-clock time, so they stay pure.

use std::net::IpAddr;

use serde_json::{json, Value};

use super::event::{proto_name, tcp_flag_names, Event, Fragment, Verdict};

/// The rule an event names, as resolved from the `RULES` map.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RuleName {
    /// A refusal no rule decides (deep VLAN stacks, unreadable tunnels).
    None,
    Named(String),
    /// The slot holds no rule in the event's generation any more (reloaded twice since).
    Gone {
        slot: u32,
    },
}

impl RuleName {
    /// The name, when there is one.
    pub fn name(&self) -> Option<&str> {
        match self {
            RuleName::Named(n) => Some(n),
            _ => None,
        }
    }
}

/// What the reader knows about an event beyond its bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Context {
    pub rule: RuleName,
    /// The interface's name; `None` if the index names none (gone since).
    pub interface: Option<String>,
    /// The event's time on the wall clock, ns since the Unix epoch.
    pub wall_ns: i128,
}

/// `HH:MM:SS.micros` of a wall-clock time, UTC.
pub fn time_of_day(wall_ns: i128) -> String {
    let secs = wall_ns.div_euclid(1_000_000_000);
    let micros = wall_ns.rem_euclid(1_000_000_000) / 1000;
    let day = secs.rem_euclid(86_400);
    format!(
        "{:02}:{:02}:{:02}.{micros:06}",
        day / 3600,
        day / 60 % 60,
        day % 60
    )
}

/// RFC 3339, UTC, nanoseconds: `2026-12-04T17:52:03.123456789Z`.
pub fn rfc3339(wall_ns: i128) -> String {
    let secs = wall_ns.div_euclid(1_000_000_000);
    let nanos = wall_ns.rem_euclid(1_000_000_000);
    let days = secs.div_euclid(86_400);
    let day = secs.rem_euclid(86_400);
    // Days since 1970-01-01 to a civil date (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i128::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{nanos:09}Z",
        day / 3600,
        day / 60 % 60,
        day % 60
    )
}

/// `DROP`, `WOULD-DROP`, or the unknown code.
pub fn verdict_word(v: Verdict) -> String {
    match v {
        Verdict::Dropped => "DROP".into(),
        Verdict::WouldDrop => "WOULD-DROP".into(),
        Verdict::Unknown(code) => format!("VERDICT-{code}"),
    }
}

fn reason_text(e: &Event) -> String {
    match e.reason {
        Ok(r) => r.describe().to_string(),
        Err(code) => format!("reason {code}"),
    }
}

fn endpoint(addr: IpAddr, port: Option<u16>) -> String {
    match (addr, port) {
        (IpAddr::V4(a), Some(p)) => format!("{a}:{p}"),
        (IpAddr::V4(a), None) => a.to_string(),
        (IpAddr::V6(a), Some(p)) => format!("[{a}]:{p}"),
        (IpAddr::V6(a), None) => format!("[{a}]"),
    }
}

/// One line, as an operator reads `cilium monitor`:
/// `17:52:03.123456 DROP (per-source limit) rule web: 198.51.100.7:5123 -> 198.18.0.10:443 tcp SYN, 60 bytes, eth1 q3`.
pub fn line(e: &Event, cx: &Context) -> String {
    let rule = match &cx.rule {
        RuleName::None => "no rule".to_string(),
        RuleName::Named(n) => format!("rule {n}"),
        RuleName::Gone { slot } => format!("rule slot {slot} (reloaded since)"),
    };
    let flow = match (e.src, e.dst) {
        (Some(s), Some(d)) => {
            let mut flow = format!(
                "{} -> {} {}",
                endpoint(s, e.src_port),
                endpoint(d, e.dst_port),
                proto_name(e.proto)
            );
            if let Some(flags) = e.tcp_flags {
                let names = tcp_flag_names(flags);
                if !names.is_empty() {
                    flow.push(' ');
                    flow.push_str(&names.join("|"));
                }
            }
            if e.fragment != Fragment::No {
                flow.push_str(" frag");
            }
            flow
        }
        _ => "addresses not read".to_string(),
    };
    let iface = cx
        .interface
        .clone()
        .unwrap_or_else(|| format!("ifindex {}", e.ifindex));
    format!(
        "{} {} ({}) {rule}: {flow}, {} bytes, {iface} q{}",
        time_of_day(cx.wall_ns),
        verdict_word(e.verdict),
        reason_text(e),
        e.frame_len,
        e.rx_queue
    )
}

/// The `--json` object of an event. The field names are part of the user contract
/// (docs/operations.md, "limiter monitor").
pub fn json(e: &Event, cx: &Context) -> Value {
    json!({
        "time": rfc3339(cx.wall_ns),
        "monotonic_ns": e.time_ns,
        "verdict": e.verdict.label(),
        "reason": e.reason.ok().map(|r| r.label()),
        "reason_code": match e.reason { Ok(r) => r as u32, Err(code) => code },
        "rule": cx.rule.name(),
        "rule_slot": e.rule_slot.map(|(slot, _)| slot),
        "interface": cx.interface,
        "ifindex": e.ifindex,
        "rx_queue": e.rx_queue,
        "family": e.src.map(|a| if a.is_ipv4() { 4 } else { 6 }),
        "proto": e.proto,
        "proto_name": proto_name(e.proto),
        "src": e.src.map(|a| a.to_string()),
        "dst": e.dst.map(|a| a.to_string()),
        "src_port": e.src_port,
        "dst_port": e.dst_port,
        "tcp_flags": e.tcp_flags.map(tcp_flag_names),
        "fragment": match e.fragment {
            Fragment::No => None,
            Fragment::First => Some("first"),
            Fragment::Later => Some("later"),
        },
        "frame_len": e.frame_len,
        "snap_len": e.data.len(),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use limiter_common::drop::{DropReason, EVENT_DROPPED, EVENT_WOULD_DROP, NO_RULE};

    use super::*;
    use crate::observe::monitor::event::{
        decode,
        frames::{build, L4},
        raw_event,
    };

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn syn_event(verdict: u32) -> Event {
        let (s, d) = (ip("198.51.100.7"), ip("198.18.0.10"));
        let frame = build(
            s,
            d,
            &[],
            L4::Tcp {
                sport: 5123,
                dport: 443,
                flags: 0x02,
            },
            (0, false),
            6,
        );
        decode(&raw_event(
            &frame,
            s,
            d,
            6,
            (0, 443),
            DropReason::PerSource,
            verdict,
            4,
        ))
    }

    fn cx(rule: RuleName) -> Context {
        Context {
            rule,
            interface: Some("eth1".into()),
            // 2026-12-04T17:52:03.123456789Z
            wall_ns: 1_796_406_723_123_456_789,
        }
    }

    #[test]
    fn a_line_reads_like_the_operators_example() {
        let line = line(
            &syn_event(EVENT_DROPPED),
            &cx(RuleName::Named("web".into())),
        );
        assert_eq!(
            line,
            "17:52:03.123456 DROP (per-source limit) rule web: 198.51.100.7:5123 -> \
             198.18.0.10:443 tcp SYN, 60 bytes, eth1 q3"
        );
        let would = super::line(
            &syn_event(EVENT_WOULD_DROP),
            &cx(RuleName::Named("web".into())),
        );
        assert!(would.contains(" WOULD-DROP (per-source limit) "), "{would}");
    }

    #[test]
    fn ipv6_fragments_rules_gone_and_no_rule_read_as_such() {
        let (s, d) = (ip("2001:db8::7"), ip("2001:db8::10"));
        let frame = build(
            s,
            d,
            &[],
            L4::Udp {
                sport: 1000,
                dport: 53,
            },
            (0, true),
            30,
        );
        let e = decode(&raw_event(
            &frame,
            s,
            d,
            17,
            (1000, 53),
            DropReason::TinyFragment,
            EVENT_DROPPED,
            1,
        ));
        let l = line(&e, &cx(RuleName::Gone { slot: 1 }));
        assert!(
            l.contains(
                "rule slot 1 (reloaded since): [2001:db8::7]:1000 -> [2001:db8::10]:53 udp frag,"
            ),
            "{l}"
        );
        let mut deep = raw_event(
            &frame,
            s,
            d,
            17,
            (0, 0),
            DropReason::DeepVlan,
            EVENT_DROPPED,
            NO_RULE,
        );
        deep.family = 0;
        let l = line(
            &decode(&deep),
            &Context {
                interface: None,
                ..cx(RuleName::None)
            },
        );
        assert!(
            l.contains("DROP (deep VLAN stack) no rule: addresses not read, "),
            "{l}"
        );
        assert!(l.ends_with("ifindex 7 q3"), "{l}");
    }

    #[test]
    fn json_has_every_documented_field() {
        let v = json(
            &syn_event(EVENT_DROPPED),
            &cx(RuleName::Named("web".into())),
        );
        assert_eq!(v["time"], "2026-12-04T17:52:03.123456789Z");
        assert_eq!(v["verdict"], "dropped");
        assert_eq!(v["reason"], "per_source");
        assert_eq!(v["reason_code"], 1);
        assert_eq!(v["rule"], "web");
        assert_eq!(v["rule_slot"], 4);
        assert_eq!(v["interface"], "eth1");
        assert_eq!(v["family"], 4);
        assert_eq!(v["proto_name"], "tcp");
        assert_eq!(v["src"], "198.51.100.7");
        assert_eq!(v["dst"], "198.18.0.10");
        assert_eq!(v["src_port"], 5123);
        assert_eq!(v["dst_port"], 443);
        assert_eq!(v["tcp_flags"], json!(["SYN"]));
        assert_eq!(v["fragment"], Value::Null);
        assert_eq!(v["frame_len"], 60);
        assert_eq!(v["snap_len"], 60);
        // The documented list is the object's keys, no more, no fewer.
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(|k| k.as_str()).collect();
        let mut documented = super::super::JSON_FIELDS.to_vec();
        documented.sort_unstable();
        let mut keys = keys;
        keys.sort_unstable();
        assert_eq!(keys, documented);
    }

    #[test]
    fn icmp_has_no_ports() {
        let (s, d) = (ip("198.51.100.7"), ip("198.18.0.10"));
        let frame = build(s, d, &[], L4::Icmp, (0, false), 0);
        let e = decode(&raw_event(
            &frame,
            s,
            d,
            1,
            (0, 0),
            DropReason::Aggregate,
            EVENT_DROPPED,
            0,
        ));
        let l = line(&e, &cx(RuleName::Named("ping".into())));
        assert!(
            l.contains("rule ping: 198.51.100.7 -> 198.18.0.10 icmp, 42 bytes"),
            "{l}"
        );
    }

    #[test]
    fn civil_dates_across_eras() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000000000Z");
        assert_eq!(
            rfc3339(951_782_400_000_000_000),
            "2000-02-29T00:00:00.000000000Z"
        );
        assert_eq!(rfc3339(-1), "1969-12-31T23:59:59.999999999Z");
        assert_eq!(time_of_day(86_399_999_999_999), "23:59:59.999999");
    }
}
