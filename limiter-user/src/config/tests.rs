//! The config checker's cases: what each key accepts and what each bad input is told.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

use std::path::{Path, PathBuf};

use ipnet::IpNet;
use limiter_common::{abi, gcra::LimitError};
use limiter_config::cases::ErrorCase;

use super::*;

const ORIGIN: &str = "/etc/limiter.toml";

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(text, Path::new(ORIGIN))
}

/// 1-based line of the first line of `text` containing `needle` (the n-th when
/// `nth > 0`).
fn line(text: &str, needle: &str, nth: usize) -> usize {
    text.lines()
        .enumerate()
        .filter(|(_, l)| l.contains(needle))
        .nth(nth)
        .map(|(i, _)| i + 1)
        .unwrap_or_else(|| panic!("{needle:?} not in test text"))
}

/// Asserts that the error (Display) has a line `ORIGIN:line:COLUMN: field ("rule"): …msg…`
/// (any column: the case tables below check columns exactly).
fn assert_problem(err: &ConfigError, line: usize, field: &str, rule: Option<&str>, msg: &str) {
    let rendered = err.to_string();
    let mut tail = format!(": {field}");
    if let Some(rule) = rule {
        tail.push_str(&format!(" ({rule:?})"));
    }
    tail.push_str(": ");
    let head = format!("{ORIGIN}:{line}:");
    let matches = |l: &str| {
        let Some(rest) = l.strip_prefix(&head) else {
            return false;
        };
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        digits > 0 && rest[digits..].starts_with(&tail) && l.contains(msg)
    };
    assert!(
        rendered.lines().any(matches),
        "expected a line {head}COLUMN{tail}…{msg:?} in:\n{rendered}"
    );
}

/// One bad input and what it is told: the only problem of `text`, at the position of the
/// `^` in it (removed before parsing), on `field` of `rule`, with a message containing
/// `message` ([`limiter_config::cases`], shared with the allocator's tests).
type Case = ErrorCase;

/// A case whose input is a top-level snippet.
fn top(name: &str, text: &str, field: &str, message: &str) -> Case {
    ErrorCase::new(name, text, field, message)
}

/// A case whose input is the body of the rule "contoso-web" (see [`rule`]).
fn in_rule(name: &str, body: &str, field: &str, message: &str) -> Case {
    ErrorCase::new(name, &rule(body), field, message).of("contoso-web")
}

/// Runs every case; a failure names each failing case and what it got.
fn run(cases: &[Case]) {
    limiter_config::cases::run(cases, ORIGIN, parse);
}

const FULL: &str = r#"
interfaces = ["eth0", "eth1"]
xdp_mode = "native"
pin_dir = "/sys/fs/bpf/lim"
control_socket = "/run/lim.sock"
metrics = "[::1]:9000"
max_sources = 4096
fleet_size = 3

[[rules]]
name = "contoso-web"
dst = "203.0.113.10/32"
dst_port = 443
proto = "tcp"
unit = "packets"
rate = 10000
burst = 2000
mode = "enforce"
fail_mode = "open"
[rules.per_source]
rate = 100
burst = 20
prefix_v4 = 24
prefix_v6 = 64

[[rules]]
name = "v6.bytes_1"
dst = "2001:db8::1"
unit = "bytes"
rate = 125_000_000
burst = 0x3000
mode = "shadow"
fail_mode = "static"

[[rules]]
name = "syn-guard"
dst = "198.18.0.0/15"
unit = "syn"
per_source = { rate = 5, burst = 10 }

[[rules]]
name = "ping"
dst = "2001:db8::/32"
proto = "icmp"
rate = 10
burst = 10
"#;

#[test]
fn full_example() {
    let c = parse(FULL).unwrap();
    assert_eq!(c.interfaces, ["eth0", "eth1"]);
    assert_eq!(c.xdp_mode, XdpMode::Native);
    assert_eq!(c.pin_dir, PathBuf::from("/sys/fs/bpf/lim"));
    assert_eq!(c.control_socket, PathBuf::from("/run/lim.sock"));
    assert_eq!(c.metrics, Some("[::1]:9000".parse().unwrap()));
    assert_eq!(c.max_sources, 4096);
    assert_eq!(c.fleet_size, 3);
    assert_eq!(c.rules.len(), 4);
    assert_eq!(
        c.rules[0],
        RuleSpec {
            name: "contoso-web".into(),
            dst: "203.0.113.10/32".parse().unwrap(),
            dst_port: Some(443),
            proto: Proto::Tcp,
            unit: Unit::Packets,
            aggregate: Some(RateSpec {
                rate: 10000,
                burst: 2000
            }),
            mode: Mode::Enforce,
            enforce: crate::config::Percent::ALL,
            fail_mode: FailMode::Open,
            per_source: Some(PerSourceSpec {
                rate: 100,
                burst: 20,
                prefix_v4: 24,
                prefix_v6: 64,
                on_saturation: OnSaturation::StandAside
            }),
        }
    );
    assert_eq!(
        c.rules[1],
        RuleSpec {
            name: "v6.bytes_1".into(),
            dst: "2001:db8::1/128".parse().unwrap(),
            dst_port: None,
            proto: Proto::Any,
            unit: Unit::Bytes,
            aggregate: Some(RateSpec {
                rate: 125_000_000,
                burst: 0x3000
            }),
            mode: Mode::Shadow,
            enforce: crate::config::Percent::ALL,
            fail_mode: FailMode::Static,
            per_source: None,
        }
    );
    assert_eq!(c.rules[2].unit, Unit::Syn);
    assert_eq!(c.rules[2].aggregate, None);
    assert_eq!(
        c.rules[2].per_source,
        Some(PerSourceSpec {
            rate: 5,
            burst: 10,
            prefix_v4: 32,
            prefix_v6: 64,
            on_saturation: OnSaturation::StandAside
        })
    );
    assert_eq!(c.rules[3].proto, Proto::Icmp);
}

#[test]
fn defaults() {
    let c = parse("").unwrap();
    assert_eq!(c, Config::default());
    assert_eq!(c.metrics, Some("127.0.0.1:9464".parse().unwrap()));
    assert_eq!(c.pin_dir, PathBuf::from("/sys/fs/bpf/limiter"));
    assert_eq!(c.control_socket, PathBuf::from("/run/limiter/limiter.sock"));
    assert_eq!(c.max_sources, 1_048_576);
    assert_eq!(c.fleet_size, 500);
    assert_eq!(c.xdp_mode, XdpMode::Auto);
    let c = parse("metrics = \"\"\ninterfaces = []\n").unwrap();
    assert_eq!(c.metrics, None);
    let c = parse("[[rules]]\nname = \"a\"\ndst = \"198.18.0.1\"\nrate = 1\nburst = 1\n").unwrap();
    let r = &c.rules[0];
    assert_eq!(
        (r.proto, r.unit, r.mode, r.fail_mode, r.dst_port),
        (
            Proto::Any,
            Unit::Packets,
            Mode::Enforce,
            FailMode::Open,
            None
        )
    );
    assert_eq!(r.dst, "198.18.0.1/32".parse::<IpNet>().unwrap());
}

#[test]
fn enum_spellings_round_trip() {
    for m in XdpMode::ALL {
        assert_eq!(m.as_str().parse::<XdpMode>(), Ok(*m));
    }
    for p in Proto::ALL {
        assert_eq!(p.as_str().parse::<Proto>(), Ok(*p));
    }
    for u in Unit::ALL {
        assert_eq!(u.as_str().parse::<Unit>(), Ok(*u));
    }
    assert_eq!(Mode::Shadow.as_str(), "shadow");
    assert_eq!(FailMode::Static.as_str(), "static");
    assert!("TCP".parse::<Proto>().is_err());
}

/// A rule body with placeholders replaced; every test below changes one thing.
fn rule(extra: &str) -> String {
    format!("# leading comment\n\n[[rules]]\nname = \"contoso-web\"\n{extra}\n")
}

#[test]
fn name_and_dst_required() {
    let text = "\n[[rules]]\nrate = 1\nburst = 1\n";
    let err = parse(text).unwrap_err();
    assert_eq!(err.problems().len(), 2, "{err}");
    assert_problem(&err, 2, "rules[0].name", None, "name is required");
    assert_problem(&err, 2, "rules[0].dst", None, "dst is required");
}

#[test]
fn duplicate_names() {
    let text = "[[rules]]\nname = \"a\"\ndst = \"198.18.0.0/16\"\nrate = 1\nburst = 1\n\
                [[rules]]\nname = \"a\"\ndst = \"198.19.0.0/16\"\nrate = 1\nburst = 1\n";
    let err = parse(text).unwrap_err();
    assert_eq!(err.problems().len(), 1, "{err}");
    assert_problem(
        &err,
        7,
        "rules[1].name",
        Some("a"),
        "already used by rules[0] (line 2)",
    );
}

/// A per-source rule that names no prefix buckets IPv6 sources by their /64 (what
/// that does to the buckets: ruleset's `per_source_buckets_an_ipv6_subscriber_by_its_64`).
#[test]
fn per_source_prefixes_default_to_32_and_64() {
    let c = parse(
        "[[rules]]\nname = \"v6-subscribers\"\ndst = \"2001:db8::10\"\n\
         [rules.per_source]\nrate = 10\nburst = 10\n",
    )
    .unwrap();
    let spec = c.rules[0].per_source.unwrap();
    assert_eq!((spec.prefix_v4, spec.prefix_v6), (32, 64));
}

#[test]
fn per_source_errors() {
    let text = rule(
        "dst = \"198.18.0.0/15\"\n[rules.per_source]\nburst = 5\nprefix_v4 = 33\nprefix_v6 = 129",
    );
    let err = parse(&text).unwrap_err();
    assert_eq!(err.problems().len(), 3, "{err}");
    assert_problem(
        &err,
        line(&text, "[rules.per_source]", 0),
        "rules[0].per_source.rate",
        Some("contoso-web"),
        "rate is required",
    );
    assert_problem(
        &err,
        line(&text, "prefix_v4", 0),
        "rules[0].per_source.prefix_v4",
        Some("contoso-web"),
        "between 0 and 32",
    );
    assert_problem(
        &err,
        line(&text, "prefix_v6", 0),
        "rules[0].per_source.prefix_v6",
        Some("contoso-web"),
        "between 0 and 128",
    );
}

/// `on_saturation` defaults to standing aside (a saturated sketch must not refuse honest
/// sources), takes "enforce", and refuses any other word naming file, line and field.
#[test]
fn per_source_on_saturation() {
    let text = |extra: &str| {
        format!(
            "[[rules]]\nname = \"flooded\"\ndst = \"198.18.0.0/15\"\n\
             [rules.per_source]\nrate = 10\nburst = 10\n{extra}"
        )
    };
    let spec = |extra: &str| parse(&text(extra)).unwrap().rules[0].per_source.unwrap();
    assert_eq!(spec("").on_saturation, OnSaturation::StandAside);
    assert_eq!(
        spec("on_saturation = \"enforce\"\n").on_saturation,
        OnSaturation::Enforce
    );
    assert_eq!(
        spec("on_saturation = \"stand-aside\"\n").on_saturation,
        OnSaturation::StandAside
    );
    let bad = text("on_saturation = \"refuse\"\n");
    let err = parse(&bad).unwrap_err();
    assert_eq!(err.problems().len(), 1, "{err}");
    assert_problem(
        &err,
        line(&bad, "on_saturation", 0),
        "rules[0].per_source.on_saturation",
        Some("flooded"),
        "stand-aside",
    );
}

#[test]
fn unknown_keys() {
    let text = "fleetsize = 3\n[[rules]]\nname = \"a\"\ndst = \"198.18.0.0/15\"\nrate = 1\nburst = 1\nratee = 3\n\
                [rules.per_source]\nrate = 1\nburst = 1\nprefix = 24\n";
    let err = parse(text).unwrap_err();
    assert_eq!(err.problems().len(), 3, "{err}");
    assert_problem(&err, 1, "fleetsize", None, "unknown key \"fleetsize\"");
    assert_problem(
        &err,
        7,
        "rules[0].ratee",
        Some("a"),
        "unknown key \"ratee\"",
    );
    assert_problem(
        &err,
        11,
        "rules[0].per_source.prefix",
        Some("a"),
        "unknown key \"prefix\"",
    );
}

#[test]
fn ambiguous_rules() {
    let text = "[[rules]]\nname = \"first\"\ndst = \"203.0.113.10\"\ndst_port = 443\nproto = \"tcp\"\nrate = 1\nburst = 1\n\n\
                [[rules]]\nname = \"second\"\ndst = \"203.0.113.10/32\"\ndst_port = 443\nproto = \"tcp\"\nrate = 2\nburst = 2\n\n\
                [[rules]]\nname = \"third\"\ndst = \"203.0.113.10/32\"\ndst_port = 443\nproto = \"any\"\nrate = 2\nburst = 2\n";
    let err = parse(text).unwrap_err();
    assert_eq!(err.problems().len(), 1, "{err}");
    assert_problem(
        &err,
        line(text, "[[rules]]", 1),
        "rules[1]",
        Some("second"),
        "rules[0] (\"first\", line 1)",
    );
    assert!(err.to_string().contains("ambiguous"));
}

#[test]
fn cross_rule_checks_see_invalid_rules() {
    // Rule 0 is invalid (no burst), yet rule 1 still collides with its name and rule 2
    // with its match; rule 2's per_source is checked although its unit is wrong.
    let text = r#"[[rules]]
name = "a"
dst = "198.18.0.0/16"
dst_port = 80
proto = "tcp"
rate = 5

[[rules]]
name = "a"
dst = "198.19.0.0/16"
rate = 1
burst = 1

[[rules]]
name = "c"
dst = "198.18.0.0/16"
dst_port = 80
proto = "tcp"
unit = "frames"
per_source = { rate = 1, burst = 1, prefix = 8 }
"#;
    let err = parse(text).unwrap_err();
    assert_eq!(err.problems().len(), 5, "{err}");
    assert_problem(&err, 6, "rules[0].burst", Some("a"), "burst is required");
    assert_problem(
        &err,
        9,
        "rules[1].name",
        Some("a"),
        "already used by rules[0] (line 2)",
    );
    assert_problem(
        &err,
        14,
        "rules[2]",
        Some("c"),
        "ambiguous: rules[0] (\"a\", line 1)",
    );
    assert_problem(
        &err,
        19,
        "rules[2].unit",
        Some("c"),
        "unknown unit \"frames\"",
    );
    assert_problem(
        &err,
        20,
        "rules[2].per_source.prefix",
        Some("c"),
        "unknown key",
    );
    for l in err.to_string().lines() {
        assert!(l.starts_with("/etc/limiter.toml:"), "{l}");
    }
}

#[test]
fn inline_rules_array() {
    let text = "rules = [\n  { name = \"x\", dst = \"2001:db8::/48\", rate = 3, burst = 4 },\n  { name = \"y\", dst = \"2001:db8::/64\" },\n]\n";
    let err = parse(text).unwrap_err();
    assert_eq!(err.problems().len(), 1, "{err}");
    assert_problem(&err, 3, "rules[1]", Some("y"), "needs an aggregate limit");
    let ok = text.replace("/64\" }", "/64\", per_source = { rate = 1, burst = 1 } }");
    let c = parse(&ok).unwrap();
    assert_eq!(c.rules.len(), 2);
    assert_eq!(c.rules[0].aggregate, Some(RateSpec { rate: 3, burst: 4 }));
}

#[test]
fn top_level_errors() {
    let text = "interfaces = \"eth0\"\nmetrics = \"localhost\"\nmax_sources = 0\nfleet_size = 0\npin_dir = \"\"\n";
    let err = parse(text).unwrap_err();
    assert_eq!(err.problems().len(), 5, "{err}");
    assert_problem(&err, 1, "interfaces", None, "expected an array");
    assert_problem(&err, 2, "metrics", None, "not an address:port");
    assert_problem(&err, 3, "max_sources", None, "between 1 and 16777216");
    assert_problem(&err, 4, "fleet_size", None, "between 1 and");
    assert_problem(&err, 5, "pin_dir", None, "must not be empty");
    assert_eq!(
        parse("max_sources = 16777216\n").unwrap().max_sources,
        1 << 24
    );
    let text = "interfaces = [\"eth0\", \"a/b\", \"eth0\", \"waytoolonginterface\"]\n";
    let err = parse(text).unwrap_err();
    assert_eq!(err.problems().len(), 3, "{err}");
    assert_problem(&err, 1, "interfaces[1]", None, "not a valid interface name");
    assert_problem(&err, 1, "interfaces[2]", None, "listed twice");
    assert_problem(&err, 1, "interfaces[3]", None, "longer than 15");
}

#[test]
fn too_many_rules() {
    let mut text = String::new();
    for i in 0..=abi::MAX_RULES {
        text.push_str(&format!(
            "[[rules]]\nname = \"r{i}\"\ndst = \"198.18.{}.{}\"\nrate = 1\nburst = 1\n",
            i / 256,
            i % 256
        ));
    }
    let err = parse(&text).unwrap_err();
    assert_eq!(err.problems().len(), 1, "{err}");
    let header_line = abi::MAX_RULES as usize * 5 + 1;
    assert_problem(&err, header_line, "rules", None, "at most 1024 rules");
}

#[test]
fn all_problems_reported_together() {
    let text = r#"xdp_mode = "fast"

[[rules]]
name = "one"
dst = "10.0.0.1/8"
rate = 5

[[rules]]
name = "two"
dst = "198.18.0.0/15"
proto = "udp"
unit = "syn"
per_source = { rate = 0, burst = 1 }
"#;
    let err = parse(text).unwrap_err();
    let problems = err.problems();
    assert_eq!(problems.len(), 5, "{err}");
    assert_problem(&err, 1, "xdp_mode", None, "unknown xdp_mode");
    assert_problem(
        &err,
        5,
        "rules[0].dst",
        Some("one"),
        "did you mean \"10.0.0.0/8\"",
    );
    assert_problem(&err, 6, "rules[0].burst", Some("one"), "burst is required");
    assert_problem(&err, 12, "rules[1].unit", Some("two"), "requires proto");
    assert_problem(
        &err,
        13,
        "rules[1].per_source.rate",
        Some("two"),
        "at least 1 per second",
    );
    // Sorted by line, one line per problem.
    let lines: Vec<usize> = problems.iter().map(|p| p.line).collect();
    assert_eq!(lines, [1, 5, 6, 12, 13]);
    assert_eq!(err.to_string().lines().count(), 5);
}

#[test]
fn syntax_error_has_line() {
    let text = "interfaces = [\"eth0\"]\n\n[[rules]]\nname = = \"x\"\n";
    let err = parse(text).unwrap_err();
    let ConfigError::Syntax { line, column, .. } = &err else {
        panic!("expected a syntax error, got {err:?}");
    };
    assert_eq!((*line, *column), (Some(4), Some(8)));
    let rendered = err.to_string();
    assert!(
        rendered.starts_with("/etc/limiter.toml:4:8: "),
        "{rendered}"
    );
    assert!(rendered.contains("line 4"), "{rendered}");
    let text = "a = 1\nrules = 2\nrules = 3\n";
    let err = parse(text).unwrap_err();
    assert!(
        err.to_string().starts_with("/etc/limiter.toml:3:1: "),
        "{err}"
    );
}

#[test]
fn load_reads_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limiter.toml");
    std::fs::write(&path, FULL).unwrap();
    assert_eq!(Config::load(&path).unwrap(), parse(FULL).unwrap());
    std::fs::write(&path, "max_sources = 0\n").unwrap();
    let err = Config::load(&path).unwrap_err();
    assert!(
        err.to_string()
            .starts_with(&format!("{}:1:15: max_sources", path.display())),
        "{err}"
    );
    let missing = dir.path().join("missing.toml");
    let err = Config::load(&missing).unwrap_err();
    assert!(matches!(err, ConfigError::Read { .. }));
    assert!(err.to_string().contains("missing.toml"), "{err}");
}

/// In tc mode a burst below a GRO-built buffer is named; SYN rules and XDP modes
/// are not.
#[test]
fn tc_mode_warns_of_bursts_below_a_gro_buffer() {
    let text = |mode: &str| {
        format!(
            "xdp_mode = \"{mode}\"\n\
             [[rules]]\nname = \"small\"\ndst = \"198.18.0.1/32\"\nrate = 1000\nburst = 20\n\
             [[rules]]\nname = \"big\"\ndst = \"198.18.0.2/32\"\nrate = 1000\nburst = 64\n\
             [[rules]]\nname = \"bytes\"\ndst = \"198.18.0.3/32\"\nunit = \"bytes\"\n\
             rate = 1000000\nburst = 3000\n\
             [[rules]]\nname = \"syn\"\ndst = \"198.18.0.4/32\"\nunit = \"syn\"\nrate = 10\nburst = 5\n"
        )
    };
    let tc = Config::parse(&text("tc"), Path::new("t.toml")).unwrap();
    let warnings = tc.tc_burst_warnings();
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert!(
        warnings[0].starts_with("rule small: burst 20 "),
        "{warnings:?}"
    );
    assert!(
        warnings[1].starts_with("rule bytes: burst 3000 "),
        "{warnings:?}"
    );
    let native = Config::parse(&text("native"), Path::new("t.toml")).unwrap();
    assert!(native.tc_burst_warnings().is_empty());
}

#[test]
fn handoff_keys_parse() {
    let c = parse("next_program = \"/sys/fs/bpf/lb/prog\"\n").unwrap();
    assert_eq!(
        c.handoff,
        Some(HandoffSpec::Program("/sys/fs/bpf/lb/prog".into()))
    );
    let c = parse("next_program = \"/sys/fs/bpf/katran/root_array:1\"\n").unwrap();
    assert_eq!(
        c.handoff,
        Some(HandoffSpec::Slot {
            array: "/sys/fs/bpf/katran/root_array".into(),
            index: 1
        })
    );
    let c = parse("join_program_array = \"/sys/fs/bpf/katran/root_array:0\"\n").unwrap();
    assert_eq!(
        c.handoff,
        Some(HandoffSpec::Join {
            array: "/sys/fs/bpf/katran/root_array".into(),
            index: 0
        })
    );
    // A ':' followed by something other than digits is part of the path.
    let c = parse("next_program = \"/sys/fs/bpf/a:b\"\n").unwrap();
    assert_eq!(
        c.handoff,
        Some(HandoffSpec::Program("/sys/fs/bpf/a:b".into()))
    );
    assert_eq!(parse("").unwrap().handoff, None);
}

#[test]
fn handoff_problems_come_with_the_others() {
    let text = "max_sources = 0\nnext_program = \"relative\"\n";
    let err = parse(text).unwrap_err();
    assert_eq!(err.problems().len(), 2, "{err}");
    assert_problem(&err, 2, "next_program", None, "absolute");
}

/// The rule's limits: what a rate and a burst are told, alone or together.
#[test]
fn limit_cases() {
    let x64 = "x".repeat(64);
    let mut cases = vec![
        in_rule("burst required with rate", "dst = \"203.0.113.10\"\nrate = ^10", "rules[0].burst", "burst is required when rate is set"),
        in_rule("burst without rate", "dst = \"203.0.113.10\"\nburst = ^10\nper_source = { rate = 1, burst = 1 }", "rules[0].burst", "not allowed without rate"),
        top("no limit at all", "# leading comment\n\n^[[rules]]\nname = \"contoso-web\"\ndst = \"203.0.113.10\"\n", "rules[0]", "needs an aggregate limit").of("contoso-web"),
        in_rule("bytes burst below a frame", "dst = \"198.18.0.0/15\"\nunit = \"bytes\"\nrate = 1000000\nburst = ^1517", "rules[0].burst", "at least 1518"),
        in_rule("bytes per-source burst below a frame", "dst = \"198.18.0.0/15\"\nunit = \"bytes\"\n[rules.per_source]\nrate = 1000000\nburst = ^100", "rules[0].per_source.burst", "at least 1518"),
        in_rule("rate zero", "dst = \"198.18.0.0/15\"\nrate = ^0\nburst = 5", "rules[0].rate", &LimitError::RateZero.to_string()),
        in_rule("rate too high", "dst = \"198.18.0.0/15\"\nrate = ^1000000000001\nburst = 5", "rules[0].rate", &LimitError::RateTooHigh.to_string()),
        in_rule("burst zero", "dst = \"198.18.0.0/15\"\nrate = 5\nburst = ^0", "rules[0].burst", &LimitError::BurstZero.to_string()),
        in_rule("burst too long", "dst = \"198.18.0.0/15\"\n[rules.per_source]\nrate = 1\nburst = ^100000000", "rules[0].per_source.burst", &LimitError::BurstTooLong.to_string()),
        in_rule("negative rate", "dst = \"198.18.0.0/15\"\nrate = ^-5\nburst = 5", "rules[0].rate", "must be at least 0, got -5"),
        in_rule("float rate", "dst = \"198.18.0.0/15\"\nrate = ^1.5\nburst = 5", "rules[0].rate", "expected an integer, found float"),
        in_rule("per_source without burst", "dst = \"198.18.0.0/15\"\nper_source = ^{ rate = 5 }", "rules[0].per_source.burst", "burst is required"),
        in_rule("per_source not a table", "dst = \"198.18.0.0/15\"\nper_source = ^5", "rules[0].per_source", "expected a table"),
    ];
    for (name, bad, message) in [
        ("empty name", "", "must not be empty"),
        ("name with a space", "has space", "only letters, digits"),
        ("name not ASCII", "ünïcode", "only letters, digits"),
        ("name too long", x64.as_str(), "at most 63"),
    ] {
        cases.push(
            top(
                name,
                &format!(
                    "[[rules]]\nname = ^\"{bad}\"\ndst = \"198.18.0.0/15\"\nrate = 1\nburst = 1\n"
                ),
                "rules[0].name",
                message,
            )
            .of(bad),
        );
    }
    run(&cases);
}

/// What a rule matches: dst, dst_port, proto, unit, mode, fail_mode.
#[test]
fn match_cases() {
    let limit = "\nrate = 1\nburst = 1";
    let r = |body: &str| format!("{body}{limit}");
    let mut cases = vec![
        in_rule(
            "dst v4 host bits",
            &r("dst = ^\"203.0.113.10/24\""),
            "rules[0].dst",
            "host bits set; did you mean \"203.0.113.0/24\"?",
        ),
        in_rule(
            "dst v6 host bits",
            &r("dst = ^\"2001:db8::1/32\""),
            "rules[0].dst",
            "did you mean \"2001:db8::/32\"?",
        ),
        in_rule(
            "dst prefix too long",
            &r("dst = ^\"203.0.113.0/33\""),
            "rules[0].dst",
            "is not a prefix",
        ),
        in_rule(
            "dst a name",
            &r("dst = ^\"example.com\""),
            "rules[0].dst",
            "is not an address or prefix",
        ),
        in_rule(
            "dst not a string",
            &r("dst = ^3"),
            "rules[0].dst",
            "expected a string, found integer",
        ),
        in_rule(
            "port with icmp",
            &r("dst = \"198.18.0.0/15\"\nproto = \"icmp\"\ndst_port = ^7"),
            "rules[0].dst_port",
            "not allowed with proto \"icmp\"",
        ),
        in_rule(
            "unknown proto",
            &r("dst = \"198.18.0.0/15\"\nproto = ^\"sctp\""),
            "rules[0].proto",
            "unknown proto \"sctp\"; expected one of \"tcp\", \"udp\", \"icmp\", \"any\"",
        ),
        in_rule(
            "unknown unit",
            &r("dst = \"198.18.0.0/15\"\nunit = ^\"bits\""),
            "rules[0].unit",
            "unknown unit \"bits\"",
        ),
        in_rule(
            "unknown mode",
            &r("dst = \"198.18.0.0/15\"\nmode = ^\"dry-run\""),
            "rules[0].mode",
            "unknown mode",
        ),
        in_rule(
            "fail_mode not a string",
            &r("dst = \"198.18.0.0/15\"\nfail_mode = ^true"),
            "rules[0].fail_mode",
            "expected a string, found boolean",
        ),
        in_rule(
            "unknown fail_mode",
            &r("dst = \"198.18.0.0/15\"\nfail_mode = ^\"closed\""),
            "rules[0].fail_mode",
            "unknown fail_mode \"closed\"; expected one of \"open\", \"static\"",
        ),
    ];
    for port in ["0", "65536", "-1"] {
        cases.push(in_rule(
            "port out of range",
            &r(&format!("dst = \"198.18.0.0/15\"\ndst_port = ^{port}")),
            "rules[0].dst_port",
            "between 1 and 65535",
        ));
    }
    for proto in ["udp", "icmp"] {
        cases.push(in_rule(
            "syn without tcp",
            &r(&format!(
                "dst = \"198.18.0.0/15\"\nproto = \"{proto}\"\nunit = ^\"syn\""
            )),
            "rules[0].unit",
            "requires proto \"tcp\" or \"any\"",
        ));
    }
    run(&cases);
}

/// The top-level keys, the XDP hook's sharing and the handoff.
#[test]
fn top_level_cases() {
    run(&[
        top(
            "unknown xdp_mode",
            "\n\nxdp_mode = ^\"offload\"\n",
            "xdp_mode",
            "unknown xdp_mode \"offload\"",
        ),
        top(
            "max_sources too large",
            "max_sources = ^268435457\n",
            "max_sources",
            "between 1 and 16777216",
        ),
        top(
            "rules a table",
            "\n^[rules]\nname = \"x\"\n",
            "rules",
            "expected an array of tables",
        ),
        top(
            "unknown xdp_share",
            "xdp_share = ^\"shared\"\n",
            "xdp_share",
            "unknown xdp_share \"shared\"; expected one of \"exclusive\", \"libxdp\"",
        ),
        top(
            "negative priority",
            "xdp_share = \"libxdp\"\nxdp_priority = ^-1\n",
            "xdp_priority",
            "between 0 and 4294967295",
        ),
        top(
            "unknown fallback",
            "xdp_share = \"libxdp\"\nxdp_share_fallback = ^\"tailcall\"\n",
            "xdp_share_fallback",
            "unknown xdp_share_fallback \"tailcall\"; expected one of \"none\", \"tail-call\"",
        ),
        // Without libxdp sharing there is nothing to fall back from.
        top(
            "fallback without libxdp",
            "xdp_share_fallback = ^\"tail-call\"\n",
            "xdp_share_fallback",
            "needs xdp_share = \"libxdp\"",
        ),
        // A priority without sharing would be silently ignored: refused.
        top(
            "priority without libxdp",
            "\nxdp_priority = ^5\n",
            "xdp_priority",
            "needs xdp_share = \"libxdp\"",
        ),
        top(
            "libxdp with tc",
            "xdp_mode = \"tc\"\n\nxdp_share = ^\"libxdp\"\n",
            "xdp_share",
            "xdp_mode = \"tc\" does not use it",
        ),
        top(
            "handoff with libxdp",
            "xdp_share = \"libxdp\"\nnext_program = ^\"/sys/fs/bpf/lb\"\n",
            "next_program",
            "not with xdp_share = \"libxdp\"",
        ),
        top(
            "relative pin",
            "\n\nnext_program = ^\"lb/prog\"\n",
            "next_program",
            "not an absolute path",
        ),
        top(
            "slot out of range",
            "next_program = ^\"/sys/fs/bpf/arr:4294967296\"\n",
            "next_program",
            "not a slot number",
        ),
        top(
            "join without slot",
            "join_program_array = ^\"/sys/fs/bpf/arr\"\n",
            "join_program_array",
            "has no slot",
        ),
        top(
            "empty pin",
            "join_program_array = ^\":3\"\n",
            "join_program_array",
            "pin path is empty",
        ),
        top(
            "pin not a string",
            "next_program = ^7\n",
            "next_program",
            "expected a string",
        ),
        top(
            "both handoffs",
            "next_program = \"/sys/fs/bpf/p\"\njoin_program_array = ^\"/sys/fs/bpf/a:0\"\n",
            "join_program_array",
            "choose one",
        ),
        top(
            "next_program in tc",
            "xdp_mode = \"tc\"\nnext_program = ^\"/sys/fs/bpf/p\"\n",
            "next_program",
            "TC build cannot tail-call",
        ),
        top(
            "join in tc",
            "xdp_mode = \"tc\"\njoin_program_array = ^\"/sys/fs/bpf/a:0\"\n",
            "join_program_array",
            "TC build",
        ),
        top(
            "join with interfaces",
            "interfaces = [\"eth0\"]\njoin_program_array = ^\"/sys/fs/bpf/a:0\"\n",
            "join_program_array",
            "twice",
        ),
    ]);
}

/// `[fleet]`: each key's problem at its own position.
#[test]
fn fleet_cases() {
    let fleet = |extra: &str| {
        format!(
            "[fleet]\nallocator = \"198.18.0.1:7443\"\nca = \"/c\"\ncert = \"/c\"\nkey = \"/k\"\n{extra}\n"
        )
    };
    run(&[
        top("allocator missing", "^[fleet]\nca = \"/c\"\ncert = \"/c\"\nkey = \"/k\"\n", "fleet.allocator", "allocator is required in [fleet]"),
        top("allocator not an address", "[fleet]\nallocator = ^\"lb\"\nca = \"/c\"\ncert = \"/c\"\nkey = \"/k\"\n", "fleet.allocator", "is not an address:port"),
        top("allocator an empty list", "[fleet]\nallocator = ^[]\nca = \"/c\"\ncert = \"/c\"\nkey = \"/k\"\n", "fleet.allocator", "allocator is an empty list"),
        top("allocator replica not an address", "[fleet]\nallocator = [\"127.0.0.1:1\", ^\"lb\"]\nca = \"/c\"\ncert = \"/c\"\nkey = \"/k\"\n", "fleet.allocator[1]", "is not an address:port"),
        top("allocator replica listed twice", "[fleet]\nallocator = [\"127.0.0.1:1\", ^\"127.0.0.1:1\"]\nca = \"/c\"\ncert = \"/c\"\nkey = \"/k\"\n", "fleet.allocator[1]", "is listed twice"),
        top("allocator replica not a string", "[fleet]\nallocator = [^7]\nca = \"/c\"\ncert = \"/c\"\nkey = \"/k\"\n", "fleet.allocator[0]", "string"),
        top("empty ca", "[fleet]\nallocator = \"198.18.0.1:7443\"\nca = ^\"\"\ncert = \"/c\"\nkey = \"/k\"\n", "fleet.ca", "must not be empty"),
        top("bad host id", &fleet("host_id = ^\"lb 17\""), "fleet.host_id", "only letters, digits"),
        top("bad bind", &fleet("bind = ^\"lb\""), "fleet.bind", "is not an IP address"),
        top("zero ttl", &fleet("lease_ttl_ms = ^0"), "fleet.lease_ttl_ms", "between 1 and 3600000"),
        top("interval not below ttl", &fleet("lease_ttl_ms = 1000\nreport_interval_ms = ^1000"), "fleet.report_interval_ms", "must be below lease_ttl_ms (1000)"),
        top("unknown fleet key", &fleet("^ttl = 3"), "fleet.ttl", "unknown key \"ttl\"; expected one of: allocator, groups, server_name, host_id, ca, cert, key, bind, lease_ttl_ms, sticky_max_s, report_interval_ms"),
    ]);
}

/// `[[fleet.groups]]` (sharded allocators): each problem at its own position.
#[test]
fn fleet_group_cases() {
    let base = "[fleet]\nca = \"/c\"\ncert = \"/c\"\nkey = \"/k\"\n";
    let group = |name: &str, allocator: &str| {
        format!("[[fleet.groups]]\nname = {name}\nallocator = {allocator}\n")
    };
    let a = group("\"a\"", "[\"127.0.0.1:1\", \"127.0.0.1:2\"]");
    run(&[
        top(
            "groups and allocator",
            &format!("[fleet]\nallocator = \"127.0.0.1:9\"\nca = \"/c\"\ncert = \"/c\"\nkey = \"/k\"\n^{a}"),
            "fleet.groups",
            "groups and allocator are mutually exclusive",
        ),
        top(
            "group name listed twice",
            &format!("{base}{a}{}", group("^\"a\"", "\"127.0.0.1:3\"")),
            "fleet.groups[1].name",
            "group \"a\" is listed twice (first in fleet.groups[0])",
        ),
        top(
            "bad group name",
            &format!("{base}{}", group("^\"a b\"", "\"127.0.0.1:3\"")),
            "fleet.groups[0].name",
            "name contains ' '; only letters, digits",
        ),
        top(
            "an address in two groups",
            &format!("{base}{a}{}", group("\"b\"", "^[\"127.0.0.1:2\"]")),
            "fleet.groups[1].allocator",
            "127.0.0.1:2 is also in fleet.groups[0]",
        ),
        top(
            "group address not an address",
            &format!("{base}{}", group("\"a\"", "[^\"lb\"]")),
            "fleet.groups[0].allocator[0]",
            "is not an address:port",
        ),
        top(
            "group without allocator",
            &format!("{base}^[[fleet.groups]]\nname = \"a\"\n"),
            "fleet.groups[0].allocator",
            "allocator is required in [[fleet.groups]]",
        ),
        top(
            "group without name",
            &format!("{base}^[[fleet.groups]]\nallocator = \"127.0.0.1:1\"\n"),
            "fleet.groups[0].name",
            "name is required in [[fleet.groups]]",
        ),
        top(
            "unknown group key",
            &format!("{base}{a}^leader = 1\n"),
            "fleet.groups[0].leader",
            "unknown key",
        ),
    ]);
    let text = format!("{base}{a}{}", group("\"b\"", "\"127.0.0.1:3\""));
    let spec = parse(&text).unwrap().fleet.unwrap();
    assert_eq!(
        spec.groups,
        [
            AllocatorGroup {
                name: "a".into(),
                allocators: vec![
                    "127.0.0.1:1".parse().unwrap(),
                    "127.0.0.1:2".parse().unwrap()
                ],
            },
            AllocatorGroup {
                name: "b".into(),
                allocators: vec!["127.0.0.1:3".parse().unwrap()],
            },
        ]
    );
    assert_eq!(
        spec.allocators_text(),
        "a: 127.0.0.1:1, 127.0.0.1:2; b: 127.0.0.1:3"
    );
}

/// A case that fails says which: the runner's own check.
#[test]
fn a_failing_case_names_itself() {
    let wrong = top(
        "the wrong field",
        "max_sources = ^0\n",
        "fleet_size",
        "between",
    );
    let why = std::panic::catch_unwind(|| run(&[wrong]))
        .expect_err("a wrong case passed")
        .downcast::<String>()
        .expect("a message");
    assert!(
        why.contains("1 of 1 cases failed:\nthe wrong field: expected"),
        "{why}"
    );
}

/// The exact rendering of docs/configuration.md's example: file, line, column, field, rule.
#[test]
fn the_readme_example_renders_exactly() {
    let err = parse(&rule("dst = \"203.0.113.10\"\nrate = 10")).unwrap_err();
    assert_eq!(
        err.to_string(),
        "/etc/limiter.toml:6:8: rules[0].burst (\"contoso-web\"): burst is required when rate is set"
    );
}

/// What the removed single-problem tests also checked: the accepted neighbours.
#[test]
fn values_next_to_the_refused_ones_are_accepted() {
    let limit = "\nrate = 1\nburst = 1";
    let ok =
        rule(&format!("dst = \"198.18.0.0/15\"{limit}")).replace("contoso-web", &"x".repeat(63));
    parse(&ok).unwrap();
    let net = parse(&rule(&format!("dst = \"2001:db8::\"{limit}")))
        .unwrap()
        .rules[0]
        .dst;
    assert_eq!(net, "2001:db8::/128".parse::<IpNet>().unwrap());
    for proto in ["tcp", "any"] {
        parse(&rule(&format!(
            "dst = \"198.18.0.0/15\"\nproto = \"{proto}\"\nunit = \"syn\"{limit}"
        )))
        .unwrap();
    }
    parse(&rule(
        "dst = \"198.18.0.0/15\"\nunit = \"bytes\"\nrate = 1000000\nburst = 1518",
    ))
    .unwrap();
    for mode in FailMode::ALL {
        let text = rule(&format!(
            "dst = \"198.18.0.0/15\"\nfail_mode = \"{}\"{limit}",
            mode.as_str()
        ));
        assert_eq!(parse(&text).unwrap().rules[0].fail_mode, *mode);
    }
    let c = parse("").unwrap();
    assert_eq!(
        (c.xdp_share, c.xdp_priority, c.xdp_share_fallback),
        (
            XdpShare::Exclusive,
            DEFAULT_XDP_PRIORITY,
            XdpShareFallback::None
        )
    );
    let c = parse("xdp_share = \"libxdp\"\nxdp_priority = 3\n").unwrap();
    assert_eq!((c.xdp_share, c.xdp_priority), (XdpShare::Libxdp, 3));
    let c = parse("xdp_share = \"libxdp\"\nxdp_share_fallback = \"tail-call\"\n").unwrap();
    assert_eq!(c.xdp_share_fallback, XdpShareFallback::TailCall);
    assert_eq!(
        parse("max_sources = 16777216\n").unwrap().max_sources,
        1 << 24
    );
}

/// Every section of the schema, with a minimal valid file around a key of it: the key's
/// line goes where `{}` is.
fn sections() -> [(&'static limiter_config::Section, &'static str, &'static str); 5] {
    [
        (&schema::TOP_KEYS, "{}\n", ""),
        (
            &schema::FLEET_KEYS,
            "[fleet]\nallocator = \"198.18.0.1:7443\"\nca = \"/c\"\ncert = \"/c\"\nkey = \"/k\"\n{}\n",
            "fleet.",
        ),
        (
            &schema::RULE_KEYS,
            "[[rules]]\nname = \"r\"\ndst = \"198.18.0.0/15\"\nrate = 1\nburst = 1\n{}\n",
            "rules[0].",
        ),
        (
            &schema::PER_SOURCE_KEYS,
            "[[rules]]\nname = \"r\"\ndst = \"198.18.0.0/15\"\n[rules.per_source]\nrate = 1\nburst = 1\n{}\n",
            "rules[0].per_source.",
        ),
        (
            &schema::TUNNEL_KEYS,
            "[[tunnels]]\ninterface = \"eth1\"\ndecapsulate = [\"ipip\"]\n{}\n",
            "tunnels[0].",
        ),
    ]
}

#[test]
fn tunnels_are_read_and_checked() {
    let c = parse(
        "[[tunnels]]\ninterface = \"eth1\"\ndecapsulate = [\"ipip\", \"6in4\", \"gre\", \"fou:5555\", \"gue:6080\"]\n",
    )
    .unwrap();
    assert_eq!(c.tunnels.len(), 1);
    let t = c.tunnels[0].to_abi();
    assert_eq!(
        t.flags,
        abi::TUNNEL_IPIP | abi::TUNNEL_IP6 | abi::TUNNEL_GRE
    );
    assert_eq!(t.udp_ports, [5555, 6080, 0, 0]);
    assert_eq!(t.gue_ports, 0b10);
    assert!(parse("").unwrap().tunnels.is_empty(), "off by default");

    let bad = [
        (
            "decapsulate = [\"vxlan\"]",
            "tunnels[0].decapsulate[0]",
            "is not one of",
        ),
        (
            "decapsulate = [\"fou:0\"]",
            "tunnels[0].decapsulate[0]",
            "1-65535",
        ),
        (
            "decapsulate = [\"gre\", \"gre\"]",
            "tunnels[0].decapsulate[1]",
            "listed twice",
        ),
        (
            "decapsulate = [\"fou:1\", \"gue:1\"]",
            "tunnels[0].decapsulate[1]",
            "listed twice",
        ),
        ("decapsulate = []", "tunnels[0].decapsulate", "empty list"),
        (
            "decapsulate = [\"fou:1\", \"fou:2\", \"fou:3\", \"fou:4\", \"gue:5\"]",
            "tunnels[0].decapsulate",
            "at most 4 UDP ports",
        ),
    ];
    for (line, field, message) in bad {
        let err = parse(&format!("[[tunnels]]\ninterface = \"eth1\"\n{line}\n")).unwrap_err();
        assert!(
            err.problems()
                .iter()
                .any(|p| p.field == field && p.message.contains(message)),
            "{line}: {err}"
        );
    }
    let err = parse(
        "[[tunnels]]\ninterface = \"eth1\"\ndecapsulate = [\"ipip\"]\n[[tunnels]]\ninterface = \"eth1\"\ndecapsulate = [\"gre\"]\n",
    )
    .unwrap_err();
    assert!(
        err.problems()
            .iter()
            .any(|p| p.field == "tunnels[1].interface" && p.message.contains("already")),
        "{err}"
    );
}

/// Each row of the schema is read: a value of the wrong type at any key is refused on
/// that key's field (a row no code reads would let it pass, or call it unknown).
#[test]
fn every_row_of_the_schema_is_read() {
    let mut failed = Vec::new();
    for (section, around, prefix) in sections() {
        parse(&around.replace("{}", "")).unwrap();
        for key in section.keys {
            // The key's own line replaces a line that sets it, if the file has one.
            let own = format!("\n{} = ", key.name);
            let base: String = around
                .lines()
                .filter(|l| !format!("\n{l}").starts_with(&own))
                .map(|l| format!("{l}\n"))
                .collect();
            let text = base.replace("{}", &format!("{} = true", key.name));
            let field = format!("{prefix}{}", key.name);
            match parse(&text) {
                Ok(_) => failed.push(format!("{field}: `{} = true` accepted", key.name)),
                Err(err) => {
                    if !err
                        .problems()
                        .iter()
                        .any(|p| p.field == field && !p.message.starts_with("unknown key"))
                    {
                        failed.push(format!("{field}: not refused on its field:\n{err}"));
                    }
                }
            }
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// The annotated examples, docs/configuration.md's with docs/fleet.md's `[fleet]`, and
/// `limiter.example.toml` show every key of the schema, each with its default where it
/// has one.
#[test]
fn the_configuration_docs_and_the_example_show_every_key_with_its_default() {
    for (name, doc) in [
        (
            "docs/configuration.md and docs/fleet.md",
            concat!(
                include_str!("../../../docs/configuration.md"),
                include_str!("../../../docs/fleet.md")
            ),
        ),
        (
            "limiter.example.toml",
            include_str!("../../../limiter.example.toml"),
        ),
    ] {
        let gaps = schema::TOP_KEYS.documentation_gaps(doc);
        assert!(gaps.is_empty(), "{name}:\n{}", gaps.join("\n"));
    }
}

/// Hostile files each get a clear error and no panic: 10,000 bad rules, a file beyond
/// the size cap, bytes that are not UTF-8, tables nested 10,000 deep.
#[test]
fn hostile_files_get_clear_errors() {
    // 10,000 problems: the first MAX_PROBLEMS in full, sorted, then the count of the rest.
    let text: String = (0..10_000)
        .map(|i| format!("[[rules]]\nname = \"r{i}\"\ndst = \"198.18.0.0/15\"\nrate = 5\n"))
        .collect();
    let err = parse(&text).unwrap_err();
    let shown = err.problems();
    assert_eq!(shown.len(), limiter_config::MAX_PROBLEMS, "{err}");
    assert!(shown
        .windows(2)
        .all(|w| (w[0].line, w[0].column) <= (w[1].line, w[1].column)));
    let rendered = err.to_string();
    let last = rendered.lines().last().unwrap();
    // Each rule: too many rules (one), no burst (10,000), ambiguous (9,999).
    let total = 1 + 10_000 + 9_999;
    assert_eq!(
        last,
        format!(
            "{ORIGIN}: {} more problems not shown (the first {} are above)",
            total - shown.len(),
            shown.len()
        )
    );

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limiter.toml");
    // Larger than the cap (sparse: no disk used): refused before it is parsed.
    let file = std::fs::File::create(&path).unwrap();
    file.set_len(limiter_config::MAX_CONFIG_BYTES + 1).unwrap();
    let err = Config::load(&path).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "{}: the config is larger than 16 MiB; is this the right file?",
            path.display()
        )
    );
    // Not UTF-8: the line and column of the first bad byte.
    std::fs::write(
        &path,
        b"xdp_mode = \"native\"\n[[rules]]\nname = \"w\xffb\"\n",
    )
    .unwrap();
    let err = Config::load(&path).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "{}:3:10: not UTF-8 text: byte 0xff at offset 39 (a config file is UTF-8)",
            path.display()
        )
    );
    // Nested 10,000 deep, by inline tables, arrays or a dotted table header: the
    // parser's depth limit refuses each (no stack overflow, in parsing or dropping).
    let inline = format!("x = {}1{}\n", "{ a = ".repeat(10_000), " }".repeat(10_000));
    let arrays = format!("x = {}1{}\n", "[".repeat(10_000), "]".repeat(10_000));
    let dotted = format!("[{}]\n", vec!["a"; 10_000].join("."));
    for text in [inline, arrays, dotted] {
        let err = parse(&text).unwrap_err();
        assert!(matches!(err, ConfigError::Syntax { .. }), "{err}");
        assert!(
            err.to_string().starts_with(ORIGIN) && err.to_string().contains("recursion"),
            "{err}"
        );
    }
}

/// `enforce_percent`: 0 to 100 with up to three decimals, read exactly from its spelling;
/// absent, 100 (every source); never with mode "shadow".
#[test]
fn enforce_percent_values() {
    let with = |value: &str| {
        parse(&rule(&format!(
            "dst = \"198.18.0.0/15\"\nrate = 1\nburst = 1\nenforce_percent = {value}"
        )))
        .map(|c| c.rules[0].enforce)
    };
    for (spelled, thousandths, shown) in [
        ("0", 0, "0"),
        ("5", 5_000, "5"),
        ("2.5", 2_500, "2.5"),
        ("0.001", 1, "0.001"),
        ("0.125", 125, "0.125"),
        ("99.999", 99_999, "99.999"),
        ("100", 100_000, "100"),
        ("100.000", 100_000, "100"),
        ("1_0.5", 10_500, "10.5"),
        ("+7", 7_000, "7"),
        ("2.50000", 2_500, "2.5"),
    ] {
        let p = with(spelled).unwrap_or_else(|e| panic!("{spelled}: {e}"));
        assert_eq!(p, Percent(thousandths), "{spelled}");
        assert_eq!(p.to_string(), shown, "{spelled}");
        assert_eq!(
            Percent::parse(&p.to_string()),
            Ok(p),
            "{spelled} round trip"
        );
    }
    let absent = parse(&rule("dst = \"198.18.0.0/15\"\nrate = 1\nburst = 1")).unwrap();
    assert_eq!(absent.rules[0].enforce, Percent::ALL);
    assert_eq!(
        serde_json::to_string(&[Percent(2_500), Percent(5_000), Percent::ALL]).unwrap(),
        "[2.5,5,100]"
    );
}

#[test]
fn enforce_percent_cases() {
    let base = "dst = \"198.18.0.0/15\"\nrate = 1\nburst = 1\n";
    let case = |name: &str, value: &str, message: &str| {
        in_rule(
            name,
            &format!("{base}enforce_percent = ^{value}"),
            "rules[0].enforce_percent",
            message,
        )
    };
    run(&[
        case("above 100", "100.5", "must be between 0 and 100, got 100.5"),
        case("far above 100", "250", "must be between 0 and 100, got 250"),
        case("negative", "-1", "must be between 0 and 100, got -1"),
        case("four decimals", "2.5001", "at most three decimals"),
        case("an exponent", "5e-1", "plain decimal such as 5 or 2.5"),
        case("infinity", "inf", "plain decimal such as 5 or 2.5"),
        case("not a number", "nan", "plain decimal such as 5 or 2.5"),
        case("a string", "\"5\"", "expected a number from 0 to 100"),
        case("hexadecimal", "0x5", "expected a number from 0 to 100"),
        case(
            "a percent sign",
            "\"5%\"",
            "expected a number from 0 to 100",
        ),
        in_rule(
            "with shadow mode",
            &format!("{base}mode = \"shadow\"\nenforce_percent = ^5"),
            "rules[0].enforce_percent",
            "not allowed with mode \"shadow\"",
        ),
        in_rule(
            "0 with shadow mode too",
            &format!("{base}mode = \"shadow\"\nenforce_percent = ^0"),
            "rules[0].enforce_percent",
            "not allowed with mode \"shadow\"",
        ),
    ]);
}
