//! The operator's side of a rollout, shipped in the package: the Grafana dashboard
//! (dist/grafana/limiter.json) and the Prometheus rules (dist/prometheus/). The dashboard
//! must import (its shape), the rules must load and fire as their unit tests say
//! (`promtool check rules`, `promtool test rules`), every alert must link its runbook
//! section, and every metric either queries must be one a real daemon or allocator
//! serves: a renamed metric fails here, not on an operator's blank panel.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

mod common;

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use common::{
    fleet::{daemon_config, free_port, scrape_text, Allocator, LEASE_MS, REPORT_MS},
    pki::Pki,
    Lab,
};
use limiter_tests::prometheus::samples;
use serde_json::Value;

/// Metrics the dashboard and the rules query that a change in flight adds (none now): a
/// branch that adds panels before its metrics lists them here, and whoever merges it
/// removes them. The live test fails if one of these is served already (so the list
/// cannot go stale) and for any other missing name.
const PENDING: &[&str] = &[];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn dashboard() -> Value {
    let path = root().join("dist/grafana/limiter.json");
    let text = std::fs::read_to_string(&path).unwrap();
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

// ---------------------------------------------------------------------------------------
// Metric names in PromQL.

/// Words of PromQL that are never a metric: binary operators, modifiers and literals.
const KEYWORDS: &[&str] = &[
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "atan2",
    "inf",
    "nan",
];

/// Aggregation operators, which may take their `by (…)` or `without (…)` clause before
/// their parenthesised argument (`sum by (rule) (…)`).
const AGGREGATIONS: &[&str] = &[
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
];

/// Keywords followed by a parenthesised list of label names (not an expression).
const LABEL_LISTS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

/// One vector selector of a query: the metric and its label matchers (label, operator,
/// value as written).
#[derive(Debug, PartialEq)]
struct Selector {
    metric: String,
    matchers: Vec<(String, String, String)>,
}

/// The metric names `expr` selects: [`promql_selectors`]'s.
fn promql_metric_names(expr: &str) -> BTreeSet<String> {
    promql_selectors(expr)
        .into_iter()
        .map(|s| s.metric)
        .collect()
}

/// The selectors of `expr`. The rule: an identifier (`[A-Za-z_:][A-Za-z0-9_:]*`) is a
/// metric name unless it is
/// - followed by `(` (a function or an aggregation: `rate`, `sum`, `vector`), or an
///   aggregation ([`AGGREGATIONS`]) followed by `by` or `without`,
/// - a keyword ([`KEYWORDS`]), or inside the label list after `by`, `without`, `on`,
///   `ignoring`, `group_left`, `group_right`,
/// - inside `{…}` (label matchers), `[…]` (ranges, subqueries) or a string literal,
/// - a Grafana variable (`$rule`, `${DS_PROMETHEUS}`, `$__rate_interval`),
/// - part of a number or a duration (`1e6`, `5m`: a token that starts with a digit).
///
/// A `{…}` right after a metric name holds that selector's matchers.
fn promql_selectors(expr: &str) -> Vec<Selector> {
    let chars: Vec<char> = expr.chars().collect();
    let ident_start = |c: char| c.is_ascii_alphabetic() || c == '_' || c == ':';
    let ident_char = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut selectors: Vec<Selector> = Vec::new();
    let mut i = 0;
    // Set after a LABEL_LISTS keyword: the next `(…)` holds label names.
    let mut label_list_next = false;
    // Set right after a metric name: a `{` next holds its matchers.
    let mut after_metric = false;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
            continue;
        }
        let named = after_metric;
        after_metric = false;
        if c == '"' || c == '\'' || c == '`' {
            i += 1;
            while i < chars.len() && chars[i] != c {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
        } else if c == '{' || c == '[' {
            let close = if c == '{' { '}' } else { ']' };
            let start = i + 1;
            while i < chars.len() && chars[i] != close {
                // Strings inside matchers may hold a closing brace.
                if chars[i] == '"' {
                    i += 1;
                    while i < chars.len() && chars[i] != '"' {
                        i += if chars[i] == '\\' { 2 } else { 1 };
                    }
                }
                i += 1;
            }
            if c == '{' && named {
                let inner: String = chars[start..i.min(chars.len())].iter().collect();
                if let Some(last) = selectors.last_mut() {
                    last.matchers = label_matchers(&inner);
                }
            }
            i += 1;
        } else if c == '(' && label_list_next {
            label_list_next = false;
            while i < chars.len() && chars[i] != ')' {
                i += 1;
            }
            i += 1;
        } else if c == '$' {
            i += 1;
            while i < chars.len() && (ident_char(chars[i]) || "{}".contains(chars[i])) {
                i += 1;
            }
        } else if c.is_ascii_digit()
            || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit))
        {
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                i += 1;
            }
        } else if ident_start(c) {
            let start = i;
            while i < chars.len() && ident_char(chars[i]) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let mut next = i;
            while next < chars.len() && chars[next].is_whitespace() {
                next += 1;
            }
            let rest: String = chars[next..].iter().take(8).collect();
            let clause_first = AGGREGATIONS.contains(&word.as_str())
                && ["by", "without"].iter().any(|k| {
                    rest.strip_prefix(k)
                        .is_some_and(|r| r.starts_with(|c: char| c == '(' || c.is_whitespace()))
                });
            let called = chars.get(next) == Some(&'(') || clause_first;
            if LABEL_LISTS.contains(&word.as_str()) {
                label_list_next = called;
            } else if !called && !KEYWORDS.contains(&word.as_str()) {
                selectors.push(Selector {
                    metric: word,
                    matchers: Vec::new(),
                });
                after_metric = true;
            }
        } else {
            i += 1;
        }
    }
    selectors
}

/// `label op "value", …` (the inside of a selector's braces).
fn label_matchers(inner: &str) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    let mut rest = inner.trim();
    while !rest.is_empty() {
        let label_end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        let label = rest[..label_end].to_string();
        rest = rest[label_end..].trim_start();
        let op = ["=~", "!~", "!=", "="]
            .into_iter()
            .find(|op| rest.starts_with(op))
            .unwrap_or_else(|| panic!("no matcher operator in {{{inner}}}"));
        rest = rest[op.len()..].trim_start();
        let quote = rest.chars().next().expect("a matcher without a value");
        let mut value = String::new();
        let mut chars = rest[1..].char_indices();
        let mut end = rest.len();
        while let Some((k, ch)) = chars.next() {
            if ch == '\\' {
                if let Some((_, escaped)) = chars.next() {
                    value.push(escaped);
                }
            } else if ch == quote {
                end = k + 2;
                break;
            } else {
                value.push(ch);
            }
        }
        out.push((label, op.to_string(), value));
        rest = rest[end..]
            .trim_start()
            .trim_start_matches(',')
            .trim_start();
    }
    out
}

/// The metric names a templating variable's query selects: Grafana's
/// `label_values(QUERY, LABEL)` names a label after the query, which PromQL would read
/// as a metric, so only QUERY is read.
fn variable_query_metric_names(query: &str) -> BTreeSet<String> {
    variable_query_selectors(query)
        .into_iter()
        .map(|s| s.metric)
        .collect()
}

/// [`variable_query_metric_names`]'s selectors.
fn variable_query_selectors(query: &str) -> Vec<Selector> {
    let query = query.trim();
    match query
        .strip_prefix("label_values(")
        .and_then(|q| q.strip_suffix(')'))
    {
        Some(args) => match args.rsplit_once(',') {
            Some((selector, _label)) => promql_selectors(selector),
            None => Vec::new(), // label_values(LABEL): every series, no metric.
        },
        None => promql_selectors(query),
    }
}

#[test]
fn promql_metric_names_skip_functions_labels_keywords_and_variables() {
    let names = promql_metric_names(
        "sum by (rule, reason) (rate(limiter_rule_dropped_packets_total{instance=~\"$instance\",rule=\"a{b}\"}[$__rate_interval])) \
         / on (rule) group_left(instance) max without (state) (limiter_rule_share_state offset 5m) > bool 1e6 \
         or vector(0) unless absent(up) and on () (count(x:y:rate5m) > 0) ${DS_PROMETHEUS}",
    );
    let expected: BTreeSet<String> = [
        "limiter_rule_dropped_packets_total",
        "limiter_rule_share_state",
        "up",
        "x:y:rate5m",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(names, expected);
    assert_eq!(
        variable_query_metric_names(
            "label_values(limiter_rule_passed_packets_total{instance=~\"$instance\"}, rule)"
        ),
        BTreeSet::from(["limiter_rule_passed_packets_total".to_string()])
    );
    // Matchers belong to the selector they follow, values unquoted and unescaped.
    let m = |l: &str, op: &str, v: &str| (l.to_string(), op.to_string(), v.to_string());
    assert_eq!(
        promql_selectors(
            "rate(a{x=\"1\", y=~\"p|q\",z!=\"a\\\"}\"}[5m]) / b {w!~'v'} + c offset 1d"
        ),
        vec![
            Selector {
                metric: "a".into(),
                matchers: vec![m("x", "=", "1"), m("y", "=~", "p|q"), m("z", "!=", "a\"}")],
            },
            Selector {
                metric: "b".into(),
                matchers: vec![m("w", "!~", "v")],
            },
            Selector {
                metric: "c".into(),
                matchers: vec![],
            },
        ]
    );
}

// ---------------------------------------------------------------------------------------
// The dashboard.

/// Every panel, rows' nested panels included.
fn panels(dashboard: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for p in dashboard["panels"].as_array().expect("panels") {
        out.push(p);
        if let Some(nested) = p["panels"].as_array() {
            out.extend(nested);
        }
    }
    out
}

/// Each panel's title and its queries' expressions.
fn panel_queries(dashboard: &Value) -> Vec<(String, Vec<String>)> {
    panels(dashboard)
        .into_iter()
        .filter(|p| p["type"] != "row")
        .map(|p| {
            let exprs = p["targets"]
                .as_array()
                .map(|t| {
                    t.iter()
                        .filter_map(|t| t["expr"].as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default();
            (p["title"].as_str().unwrap_or("").to_string(), exprs)
        })
        .collect()
}

/// Each templating variable's name and query.
fn variables(dashboard: &Value) -> Vec<(String, String)> {
    dashboard["templating"]["list"]
        .as_array()
        .expect("templating.list")
        .iter()
        .map(|v| {
            let query = v["query"]["query"]
                .as_str()
                .or(v["query"].as_str())
                .unwrap_or("");
            (
                v["name"].as_str().expect("a variable's name").to_string(),
                query.to_string(),
            )
        })
        .collect()
}

/// Every `datasource` value anywhere in `v`, with its JSON path.
fn datasources<'a>(v: &'a Value, path: &str, out: &mut Vec<(String, &'a Value)>) {
    match v {
        Value::Object(map) => {
            for (k, child) in map {
                let here = format!("{path}.{k}");
                if k == "datasource" {
                    out.push((here.clone(), child));
                }
                datasources(child, &here, out);
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                datasources(child, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

#[test]
fn the_dashboard_is_shaped_as_grafana_imports_it() {
    let d = dashboard();
    let mut problems = Vec::new();

    // An exported dashboard: a datasource input the import asks for, no fixed id.
    let schema = d["schemaVersion"].as_u64().unwrap_or(0);
    if !(36..=41).contains(&schema) {
        problems.push(format!(
            "schemaVersion {schema}: not a Grafana 9 to 12 dashboard"
        ));
    }
    if !d["id"].is_null() {
        problems.push(format!("id {} (an export has null)", d["id"]));
    }
    for key in ["uid", "title"] {
        if d[key].as_str().is_none_or(str::is_empty) {
            problems.push(format!("no {key}"));
        }
    }
    let inputs: BTreeMap<String, &Value> = d["__inputs"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|i| (i["name"].as_str().unwrap_or("").to_string(), i))
                .collect()
        })
        .unwrap_or_default();
    match inputs.get("DS_PROMETHEUS") {
        Some(i) if i["type"] == "datasource" && i["pluginId"] == "prometheus" => {}
        other => problems.push(format!(
            "__inputs has no prometheus datasource DS_PROMETHEUS: {other:?}"
        )),
    }

    // Every datasource reference resolves to a declared input (or Grafana's own, for
    // the built-in annotations).
    let mut refs = Vec::new();
    datasources(&d, "", &mut refs);
    for (path, ds) in &refs {
        let uid = ds["uid"].as_str().unwrap_or("");
        let resolves = match uid.strip_prefix("${").and_then(|u| u.strip_suffix('}')) {
            Some(input) => inputs.contains_key(input) && ds["type"] == "prometheus",
            None => uid == "-- Grafana --" && ds["type"] == "grafana",
        };
        if !resolves {
            problems.push(format!("{path}: datasource {ds} is no declared input"));
        }
    }
    // ${…} anywhere else must be declared too.
    let text = serde_json::to_string(&d).unwrap();
    for piece in text.split("${").skip(1) {
        let name = piece.split('}').next().unwrap_or("");
        if !inputs.contains_key(name) && !variables(&d).iter().any(|(v, _)| v == name) {
            problems.push(format!("${{{name}}} is neither an input nor a variable"));
        }
    }

    // Panels: unique ids, on the 24-column grid without overlapping, each of their
    // types required, each query with a unique refId.
    let all = panels(&d);
    let mut ids = BTreeSet::new();
    let mut boxes: Vec<(String, [u64; 4])> = Vec::new();
    let required: BTreeSet<&str> = d["__requires"]
        .as_array()
        .map(|r| {
            r.iter()
                .filter(|x| x["type"] == "panel")
                .filter_map(|x| x["id"].as_str())
                .collect()
        })
        .unwrap_or_default();
    for p in &all {
        let title = p["title"].as_str().unwrap_or("?").to_string();
        match p["id"].as_u64() {
            Some(id) if id > 0 => {
                if !ids.insert(id) {
                    problems.push(format!("panel id {id} twice ({title})"));
                }
            }
            _ => problems.push(format!("panel {title} has no positive id")),
        }
        let kind = p["type"].as_str().unwrap_or("");
        if kind != "row" && !required.contains(kind) {
            problems.push(format!("panel type {kind} ({title}) not in __requires"));
        }
        let g = &p["gridPos"];
        let grid = ["x", "y", "w", "h"].map(|k| g[k].as_u64());
        let [Some(x), Some(y), Some(w), Some(h)] = grid else {
            problems.push(format!("panel {title}: gridPos {g}"));
            continue;
        };
        if w == 0 || h == 0 || x + w > 24 {
            problems.push(format!("panel {title}: gridPos {g} off the grid"));
        }
        for (other, [ox, oy, ow, oh]) in &boxes {
            if x < ox + ow && *ox < x + w && y < oy + oh && *oy < y + h {
                problems.push(format!("panels {title} and {other} overlap"));
            }
        }
        boxes.push((title.clone(), [x, y, w, h]));
        if kind != "row" {
            let targets = p["targets"].as_array().cloned().unwrap_or_default();
            if targets.is_empty() {
                problems.push(format!("panel {title} queries nothing"));
            }
            let mut refs = BTreeSet::new();
            for t in &targets {
                if t["expr"].as_str().is_none_or(|e| e.trim().is_empty()) {
                    problems.push(format!("panel {title}: a target without expr"));
                }
                if !refs.insert(t["refId"].as_str().unwrap_or("").to_string()) {
                    problems.push(format!("panel {title}: refId {} twice", t["refId"]));
                }
            }
        }
    }

    // Templating: a host and a rule to choose, and every $variable a query uses declared.
    let vars: BTreeSet<String> = variables(&d).into_iter().map(|(n, _)| n).collect();
    for needed in ["instance", "rule"] {
        if !vars.contains(needed) {
            problems.push(format!("no templating variable {needed}"));
        }
    }
    let builtins = ["__rate_interval", "__interval", "__range"];
    let mut queries: Vec<String> = panel_queries(&d).into_iter().flat_map(|(_, e)| e).collect();
    queries.extend(variables(&d).into_iter().map(|(_, q)| q));
    for q in &queries {
        for piece in q.split('$').skip(1) {
            let name: String = piece
                .trim_start_matches('{')
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !vars.contains(&name) && !builtins.contains(&name.as_str()) {
                problems.push(format!("${name} in {q:?} is not a variable"));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Each panel query with Grafana's variables replaced as Grafana would (an interval, a
/// regex matching everything), for a PromQL parser.
fn as_promql(expr: &str) -> String {
    let mut out = expr
        .replace("$__rate_interval", "1m")
        .replace("$__interval", "1m")
        .replace("$__range", "1h");
    for var in ["instance", "rule", "allocator"] {
        out = out.replace(&format!("${var}"), ".*");
    }
    out
}

#[test]
fn every_dashboard_query_parses_as_promql() {
    // Prometheus's own parser: each query as a recording rule that promtool checks.
    let mut file = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (n, (title, exprs)) in panel_queries(&dashboard()).into_iter().enumerate() {
        for (k, expr) in exprs.iter().enumerate() {
            let expr = serde_json::to_string(&as_promql(expr)).unwrap();
            file.push_str(&format!(
                "      # {}\n      - record: dashboard:panel_{n}_{k}\n        expr: {expr}\n",
                title.replace('\n', " ")
            ));
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dashboard.rules.yml");
    std::fs::write(&path, &file).unwrap();
    let (ok, said) = promtool(&["check", "rules", path.to_str().unwrap()]);
    assert!(
        ok,
        "promtool check rules on the dashboard's queries:\n{said}\n{file}"
    );
}

// ---------------------------------------------------------------------------------------
// The rules.

fn rules_dir() -> PathBuf {
    root().join("dist/prometheus")
}

/// One alerting or recording rule of limiter.rules.yml, as the file lays it out.
#[derive(Debug, Default)]
struct Rule {
    alert: Option<String>,
    record: Option<String>,
    expr: String,
    annotations: BTreeMap<String, String>,
}

/// The rules of limiter.rules.yml, read by its own layout (no YAML parser in the
/// workspace; promtool, above, is the one that judges the YAML): a rule starts at
/// `- alert:` or `- record:`, keys are one a line, `expr: |` takes the more indented
/// lines after it, values may be double-quoted.
fn rules() -> Vec<Rule> {
    let text = std::fs::read_to_string(rules_dir().join("limiter.rules.yml")).unwrap();
    let unquote = |v: &str| {
        let v = v.trim();
        v.strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .map_or(v.to_string(), |v| v.replace("\\\"", "\""))
    };
    let mut out: Vec<Rule> = Vec::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        let trimmed = trimmed.strip_prefix("- ").unwrap_or(trimmed);
        let Some((key, value)) = trimmed.split_once(':') else {
            continue;
        };
        match key {
            "alert" | "record" => {
                let mut rule = Rule::default();
                if key == "alert" {
                    rule.alert = Some(unquote(value));
                } else {
                    rule.record = Some(unquote(value));
                }
                out.push(rule);
            }
            "expr" => {
                let rule = out.last_mut().expect("expr outside a rule");
                if value.trim() == "|" {
                    while let Some(next) = lines.peek() {
                        let more = next.len() - next.trim_start().len();
                        if next.trim().is_empty() || more <= indent {
                            break;
                        }
                        rule.expr.push_str(next.trim());
                        rule.expr.push('\n');
                        lines.next();
                    }
                } else {
                    rule.expr = unquote(value);
                }
            }
            "summary" | "description" | "runbook_url" => {
                if let Some(rule) = out.last_mut() {
                    rule.annotations.insert(key.to_string(), unquote(value));
                }
            }
            _ => {}
        }
    }
    out
}

/// promtool, or a failure naming the package to install (never a skip).
fn promtool(args: &[&str]) -> (bool, String) {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(rules_dir())
        .output()
        .unwrap_or_else(|e| {
            panic!("promtool: {e}; install it: apt-get install prometheus (cargo xtask setup does)")
        });
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), said)
}

#[test]
fn the_rules_load_and_each_alert_fires_and_stays_quiet_as_its_unit_test_says() {
    let (ok, said) = promtool(&["check", "rules", "limiter.rules.yml"]);
    assert!(ok, "promtool check rules:\n{said}");
    let (ok, said) = promtool(&["test", "rules", "limiter.rules.test.yml"]);
    assert!(ok, "promtool test rules:\n{said}");

    // Each alert is tested both ways: some eval_time expects it, and one expects nothing.
    let tests = std::fs::read_to_string(rules_dir().join("limiter.rules.test.yml")).unwrap();
    let mut expected: BTreeMap<String, (bool, bool)> = BTreeMap::new();
    let mut lines = tests.lines().peekable();
    while let Some(line) = lines.next() {
        if let Some(name) = line.trim().strip_prefix("alertname:") {
            let fires = lines
                .peek()
                .is_some_and(|next| !next.trim().starts_with("exp_alerts: []"));
            let seen = expected.entry(name.trim().to_string()).or_default();
            if fires {
                seen.0 = true;
            } else {
                seen.1 = true;
            }
        }
    }
    for rule in rules() {
        if let Some(alert) = rule.alert {
            assert_eq!(
                expected.get(&alert),
                Some(&(true, true)),
                "{alert}: limiter.rules.test.yml must expect it to fire somewhere and to stay quiet somewhere (fires, quiet)"
            );
        }
    }
}

/// GitHub's anchor of a heading: lower case, punctuation dropped, spaces to dashes.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

#[test]
fn every_alert_says_what_and_links_its_runbook_section() {
    let runbooks = std::fs::read_to_string(root().join("docs/runbooks.md")).unwrap();
    let anchors: BTreeSet<String> = runbooks
        .lines()
        .filter_map(|l| l.strip_prefix('#'))
        .map(|l| anchor(l.trim_start_matches('#')))
        .collect();
    let mut alerts = 0;
    for rule in rules() {
        let Some(alert) = &rule.alert else { continue };
        alerts += 1;
        for key in ["summary", "description", "runbook_url"] {
            assert!(
                rule.annotations.get(key).is_some_and(|v| !v.is_empty()),
                "{alert} has no {key}"
            );
        }
        let url = &rule.annotations["runbook_url"];
        let (page, section) = url.split_once('#').expect("runbook_url without an anchor");
        assert!(
            page.ends_with("/docs/runbooks.md"),
            "{alert}: {url} is not docs/runbooks.md"
        );
        assert!(
            anchors.contains(section),
            "{alert}: docs/runbooks.md has no section #{section}"
        );
    }
    assert!(alerts >= 8, "{alerts} alerts");
}

// ---------------------------------------------------------------------------------------
// Every name queried is served.

/// Every selector the dashboard's panels and variables and the rules query, with where
/// (recording rules' names resolved to what they query).
fn queried_selectors() -> Vec<(Selector, String)> {
    let d = dashboard();
    let mut out = Vec::new();
    for (title, exprs) in panel_queries(&d) {
        for e in exprs {
            out.extend(
                promql_selectors(&e)
                    .into_iter()
                    .map(|s| (s, format!("panel {title:?}"))),
            );
        }
    }
    for (var, query) in variables(&d) {
        out.extend(
            variable_query_selectors(&query)
                .into_iter()
                .map(|s| (s, format!("variable ${var}"))),
        );
    }
    let rules = rules();
    let recorded: BTreeSet<String> = rules.iter().filter_map(|r| r.record.clone()).collect();
    for rule in &rules {
        let by = rule.alert.as_ref().map_or_else(
            || format!("record {:?}", rule.record),
            |a| format!("alert {a}"),
        );
        assert!(!rule.expr.trim().is_empty(), "{by} has no expr");
        out.extend(
            promql_selectors(&rule.expr)
                .into_iter()
                .filter(|s| !recorded.contains(&s.metric))
                .map(|s| (s, by.clone())),
        );
    }
    out
}

/// Every metric name queried, with where.
fn queried_metrics() -> BTreeMap<String, BTreeSet<String>> {
    let mut wanted: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (selector, by) in queried_selectors() {
        wanted.entry(selector.metric).or_default().insert(by);
    }
    wanted
}

/// Labels a series gets from Prometheus's scrape, not from the endpoint: `instance` and
/// `job` always, `group` where the operator labels sharded allocators' targets.
const TARGET_LABELS: &[&str] = &["instance", "job", "group"];

/// What one scrape serves: each sample name with its series' labels.
type Served = BTreeMap<String, Vec<BTreeMap<String, String>>>;

fn served(text: &str, into: &mut Served) {
    for (name, labels, _) in samples(text) {
        let labels = label_matchers(&labels)
            .into_iter()
            .map(|(label, _, value)| (label, value))
            .collect();
        into.entry(name).or_default().push(labels);
    }
}

/// What a selector asks of the served series that they do not have: a label none of
/// its series carries, or a value none has (`label="value"`, or each word of
/// `label=~"a|b"`). Matchers with a Grafana variable select what the user picks.
fn unmatched(selector: &Selector, series: &[BTreeMap<String, String>]) -> Vec<String> {
    let mut out = Vec::new();
    for (label, op, value) in &selector.matchers {
        if TARGET_LABELS.contains(&label.as_str()) || value.contains('$') {
            continue;
        }
        if !series.iter().any(|s| s.contains_key(label)) {
            out.push(format!("{} has no label {label}", selector.metric));
            continue;
        }
        let words: Vec<&str> = match op.as_str() {
            "=" => vec![value.as_str()],
            "=~" if value
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '|') =>
            {
                value.split('|').collect()
            }
            _ => Vec::new(),
        };
        for word in words {
            if !series
                .iter()
                .any(|s| s.get(label).map(String::as_str) == Some(word))
            {
                out.push(format!(
                    "{} has no series with {label}=\"{word}\"",
                    selector.metric
                ));
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------------------
// Every name served follows the naming rules.

/// The families of one scrape: name → (TYPE, HELP).
fn families(text: &str) -> BTreeMap<String, (String, String)> {
    let mut out: BTreeMap<String, (String, String)> = BTreeMap::new();
    for line in text.lines() {
        let mut words = line.splitn(4, ' ');
        match (words.next(), words.next(), words.next(), words.next()) {
            (Some("#"), Some("TYPE"), Some(name), Some(kind)) => {
                out.entry(name.to_string()).or_default().0 = kind.trim().to_string();
            }
            (Some("#"), Some("HELP"), Some(name), help) => {
                out.entry(name.to_string()).or_default().1 = help.unwrap_or("").to_string();
            }
            _ => {}
        }
    }
    out
}

/// What in `text` (one binary's scrape, `what` names it) breaks the metric naming rules
/// docs/operations.md states (Prometheus's practice):
/// - every sample's family has HELP and TYPE;
/// - a counter ends in `_total`, nothing else does;
/// - a counter of frames (its HELP starts "Frames") says `packets`, one of bytes (HELP
///   "Bytes") says `bytes`; a rate (`_per_second`) and anything "in the rule's unit" says
///   which unit, in the name: no `unit` label, so no sum adds bytes to packets;
/// - base units: seconds and bytes, never milli-, kilo-, percent;
/// - one name per meaning: process age is `process_start_time_seconds` (no `_uptime_`),
///   and refusals are `refused` (two names that differ only by a synonym are one meaning).
fn naming_problems(what: &str, text: &str) -> Vec<String> {
    let families = families(text);
    let mut problems = Vec::new();
    let unit = |name: &str| name.contains("_packets") || name.contains("_bytes");
    for (name, labels, _) in samples(text) {
        if !families
            .get(&name)
            .is_some_and(|(kind, help)| !kind.is_empty() && !help.is_empty())
        {
            problems.push(format!("{what}: {name} has no HELP and TYPE of its own"));
        }
        if label_matchers(&labels).iter().any(|(l, _, _)| l == "unit") {
            problems.push(format!(
                "{what}: {name} has a unit label (the unit goes in the name)"
            ));
        }
    }
    let mut meanings: BTreeMap<String, &str> = BTreeMap::new();
    for (name, (kind, help)) in &families {
        let bad = |why: &str| format!("{what}: {name} ({kind}): {why}");
        match (kind.as_str(), name.ends_with("_total")) {
            ("counter", false) => problems.push(bad("a counter must end in _total")),
            ("counter", true) => {}
            (_, true) => problems.push(bad("only counters end in _total")),
            _ => {}
        }
        if kind == "counter" && help.starts_with("Frames") && !name.contains("_packets") {
            problems.push(bad(
                "counts frames (its HELP says so) but does not say _packets",
            ));
        }
        if kind == "counter" && help.starts_with("Bytes") && !name.contains("_bytes") {
            problems.push(bad(
                "counts bytes (its HELP says so) but does not say _bytes",
            ));
        }
        if name.ends_with("_per_second") && !unit(name) {
            problems.push(bad(
                "a rate that does not say of what (_packets_per_second, _bytes_per_second)",
            ));
        }
        if help.contains("rule's unit") && !unit(name) {
            problems.push(bad("in the rule's unit, which its name does not say"));
        }
        for word in ["milli", "_ms", "kilo", "mega", "percent"] {
            if name.contains(word) {
                problems.push(bad(&format!("{word}: not a base unit")));
            }
        }
        if name.contains("_uptime") {
            problems.push(bad("duplicates process_start_time_seconds"));
        }
        let meaning = name
            .replace("rejected", "refused")
            .replace("denied", "refused");
        if let Some(other) = meanings.insert(meaning, name) {
            problems.push(bad(&format!(
                "means what {other} means: one name per meaning"
            )));
        }
    }
    if !families.contains_key("process_start_time_seconds") {
        problems.push(format!("{what}: no process_start_time_seconds"));
    }
    problems
}

#[test]
fn the_naming_rules_catch_each_kind_of_bad_name() {
    let good = "# HELP limiter_rule_passed_packets_total Frames the rule passed.\n\
                # TYPE limiter_rule_passed_packets_total counter\n\
                limiter_rule_passed_packets_total{rule=\"a\"} 1\n\
                # HELP x_quota_bytes_per_second Quota, in the rule's unit.\n\
                # TYPE x_quota_bytes_per_second gauge\nx_quota_bytes_per_second{rule=\"a\"} 1\n\
                # HELP process_start_time_seconds Start.\n\
                # TYPE process_start_time_seconds gauge\nprocess_start_time_seconds 1\n";
    assert_eq!(naming_problems("good", good), Vec::<String>::new());
    let family = |name: &str, kind: &str, help: &str, labels: &str| {
        format!("{good}# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{labels} 1\n")
    };
    for (text, why) in [
        (family("x_frames", "counter", "Frames.", ""), "_total"),
        (family("x_up_total", "gauge", "Up.", ""), "only counters"),
        (
            family("x_malformed_total", "counter", "Frames unread.", ""),
            "_packets",
        ),
        (family("x_cut_total", "counter", "Bytes cut.", ""), "_bytes"),
        (
            family("x_quota_per_second", "gauge", "Quota.", ""),
            "of what",
        ),
        (
            family("x_credit", "gauge", "Credit in the rule's unit.", ""),
            "rule's unit",
        ),
        (
            family(
                "x_rate_packets_per_second",
                "gauge",
                "Rate.",
                "{unit=\"bytes\"}",
            ),
            "unit label",
        ),
        (
            family("x_delay_milliseconds", "gauge", "Delay.", ""),
            "base unit",
        ),
        (
            family("x_uptime_seconds", "gauge", "Up.", ""),
            "process_start_time_seconds",
        ),
        (
            family("x_refused_reports_total", "counter", "Refused.", "")
                + &family("x_rejected_reports_total", "counter", "Rejected.", ""),
            "one name per meaning",
        ),
        (format!("{good}x_bare 1\n"), "no HELP and TYPE"),
        (
            good.replace("process_start_time_seconds", "process_start"),
            "no process_start_time_seconds",
        ),
    ] {
        let problems = naming_problems("bad", &text);
        assert!(
            problems.iter().any(|p| p.contains(why)),
            "{why:?} not found in {problems:?}"
        );
    }
}

/// Every metric the dashboard and the rules query is served by one of a fleet daemon
/// (fleet metrics, interfaces), a standalone daemon joined into a stand-in LB's root
/// array with a per-source rule and a rule of each unit (the joined slot, saturation
/// gauges, rates in force), and the allocator with a quota of each unit; and every name
/// those three serve follows the naming rules ([`naming_problems`]).
#[test]
fn every_metric_queried_is_served_by_a_daemon_or_the_allocator() {
    let wanted = queried_metrics();
    assert!(wanted.len() > 40, "only {} metrics queried", wanted.len());

    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let allocator_metrics = free_port();
    // A quota of each unit: quotas and grants are served under their unit only.
    let allocator = Allocator::configured(
        dir.path(),
        &pki,
        Some(allocator_metrics),
        LEASE_MS,
        REPORT_MS,
        "[[quotas]]\nrule = \"bulk\"\nrate = 1000000\nburst = 100000\nunit = \"bytes\"\n\
         [[quotas]]\nrule = \"syn\"\nrate = 50\nburst = 5\nunit = \"syn\"\n",
    );
    let fleet = Lab::new(&daemon_config("lb-1", &pki, allocator.port, "lb-1"));
    let fleet_daemon = fleet.start();
    let joined = joined::JoinedDaemon::start();

    // Per-rule gauges appear once a host has reported: read until every name is there
    // or the deadline passes, then name what is missing.
    let deadline = Instant::now() + Duration::from_secs(15);
    let selectors = queried_selectors();
    let missing = loop {
        let mut have = Served::new();
        served(&scrape_text(fleet.metrics_port), &mut have);
        served(&scrape_text(joined.lab.metrics_port), &mut have);
        served(&scrape_text(allocator_metrics), &mut have);
        let pending_served: Vec<&&str> =
            PENDING.iter().filter(|p| have.contains_key(**p)).collect();
        assert!(
            pending_served.is_empty(),
            "{pending_served:?} are served now: remove them from PENDING in tests/tests/dashboard.rs"
        );
        let mut missing: Vec<String> = wanted
            .iter()
            .filter(|(name, _)| !have.contains_key(*name) && !PENDING.contains(&name.as_str()))
            .map(|(name, by)| {
                format!(
                    "{name} (queried by {})",
                    by.iter().cloned().collect::<Vec<_>>().join(", ")
                )
            })
            .collect();
        for (selector, by) in &selectors {
            if let Some(series) = have.get(&selector.metric) {
                missing.extend(
                    unmatched(selector, series)
                        .into_iter()
                        .map(|m| format!("{m} (queried by {by})")),
                );
            }
        }
        missing.sort();
        missing.dedup();
        if missing.is_empty() || Instant::now() > deadline {
            break missing;
        }
        std::thread::sleep(Duration::from_millis(300));
    };
    let mut naming = Vec::new();
    for (what, port) in [
        ("the fleet daemon", fleet.metrics_port),
        ("the joined daemon", joined.lab.metrics_port),
        ("the allocator", allocator_metrics),
    ] {
        naming.extend(naming_problems(what, &scrape_text(port)));
    }
    drop(joined);
    fleet_daemon.stop();
    drop(allocator);
    assert!(
        naming.is_empty(),
        "metric names that break the naming rules (docs/operations.md, Metrics):\n{}",
        naming.join("\n")
    );
    assert!(
        missing.is_empty(),
        "metrics, labels or values queried that no daemon or allocator serves:\n{}",
        missing.join("\n")
    );
}

mod joined {
    use aya::programs::XdpMode;
    use limiter_tests::{
        handoff::{StandinLb, LB, ROOT},
        scenario::PinDir,
    };

    use super::{common::Daemon, Lab};

    /// A per-source rule (the saturation gauges are per-source rules' only), and a rule
    /// of each other unit (a rate in force is served under its rules' unit only).
    const RULES: &str = "[[rules]]\nname = \"web\"\ndst = \"198.18.0.2/32\"\nrate = 500\nburst = 100\n\
                         [rules.per_source]\nrate = 50\nburst = 10\n\
                         [[rules]]\nname = \"bulk\"\ndst = \"198.18.0.3/32\"\nunit = \"bytes\"\nrate = 1000000\nburst = 100000\n\
                         [[rules]]\nname = \"syn\"\ndst = \"198.18.0.4/32\"\nunit = \"syn\"\nrate = 50\nburst = 5\n";

    /// A standalone daemon in `join_program_array` mode (Katran's shared mode: the LB's
    /// root program on the interface calls the limiter's slot), serving metrics.
    pub struct JoinedDaemon {
        pub lab: Lab,
        daemon: Option<Daemon>,
        // Kept for the daemon's life: the LB's programs and their pins.
        _lb: StandinLb,
        _lb_pins: PinDir,
    }

    impl JoinedDaemon {
        pub fn start() -> JoinedDaemon {
            let mut lb = StandinLb::load().unwrap();
            let lb_pins = PinDir::new();
            limiter_user::attach::program::prepare_pin_dir(&lb_pins.path).unwrap();
            let array = lb_pins.path.join("root_array");
            lb.pin_root_array(&array).unwrap();
            let lb_fd = lb.fd(LB).unwrap().try_clone().unwrap();
            lb.root_array().unwrap().set(1, &lb_fd, 0).unwrap();
            let lab = Lab::new(RULES);
            // No interfaces: the LB's root program is on the hook.
            let text = format!(
                "xdp_mode = \"native\"\npin_dir = \"{}\"\ncontrol_socket = \"{}\"\n\
                 metrics = \"127.0.0.1:{}\"\njoin_program_array = \"{}:0\"\n\n{RULES}",
                lab.pins.path.display(),
                lab.socket.display(),
                lab.metrics_port,
                array.display()
            );
            std::fs::write(&lab.config, text).unwrap();
            lb.program_mut(ROOT)
                .unwrap()
                .attach(&lab.pair.host, XdpMode::Driver)
                .unwrap();
            let daemon = lab.start();
            JoinedDaemon {
                lab,
                daemon: Some(daemon),
                _lb: lb,
                _lb_pins: lb_pins,
            }
        }
    }

    impl Drop for JoinedDaemon {
        fn drop(&mut self) {
            if let Some(d) = self.daemon.take() {
                d.stop();
            }
        }
    }
}
