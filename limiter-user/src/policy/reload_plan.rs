//! What a reload changes, rule by rule, and whose state starts over: printed by `limiter
//! reload --dry-run` (instead of reloading) and by `limiter reload` (after). Pure: the
//! daemon gives it the rules before and after, the slots the new rules get and the
//! sketch's region plan (`crate::policy::sketch_regions`), as the install would compute them.

use std::collections::BTreeMap;

use limiter_config::ConfigWord as _;
use serde::Serialize;

use crate::{
    config::{Config, FailModeWord, MonitorKeys, RateSpec, RuleSpec},
    policy::sketch_regions::RegionPlan,
};

/// A reload's effect on the rules.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct ReloadPlan {
    /// Rules only in the new file.
    pub added: Vec<String>,
    /// Rules only in the running table.
    pub removed: Vec<String>,
    /// Rules in both whose keys differ.
    pub changed: Vec<RuleChange>,
    /// Rules in both, the same.
    pub unchanged: usize,
    /// State that starts over: a new rule's aggregate bucket and counters, and the
    /// per-source state of the rules whose part of the sketch is cleared.
    pub restarts: Vec<Restart>,
    /// Rules whose `limiter quota set` override the reload drops (the file's rate and
    /// burst apply again).
    pub quota_overrides_dropped: Vec<String>,
    /// Settings other than rules that the reload changes (`tunnels.IFACE`, `bypass`,
    /// `monitor.*`), as the file spells them.
    pub settings: Vec<SettingChange>,
}

/// A setting's value before and after, as the config file spells it (`-`: not set).
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct SettingChange {
    /// `tunnels.IFACE`, `bypass` or `monitor.KEY`.
    pub setting: String,
    pub from: String,
    pub to: String,
}

/// The `[monitor]` keys a reload changes: written to the program's `MONITOR` at once,
/// nothing starts over.
fn monitor_changes(before: &MonitorKeys, after: &MonitorKeys) -> Vec<SettingChange> {
    let mut changes = Vec::new();
    for (setting, from, to) in [
        (
            "monitor.events_per_sec",
            before.events_per_sec,
            after.events_per_sec,
        ),
        ("monitor.snap_len", before.snap_len, after.snap_len),
    ] {
        if from != to {
            changes.push(SettingChange {
                setting: setting.to_string(),
                from: from.to_string(),
                to: to.to_string(),
            });
        }
    }
    changes
}

/// One rule's changed keys.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct RuleChange {
    pub rule: String,
    pub keys: Vec<KeyChange>,
}

/// A key's value before and after, as the config file spells it.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct KeyChange {
    pub key: &'static str,
    pub from: String,
    pub to: String,
}

/// A rule's state that starts over, and why.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Restart {
    pub rule: String,
    /// `aggregate` (its bucket, with a full burst, and its counters from zero) or
    /// `per_source` (every source's bucket: each source gets its burst once).
    pub state: &'static str,
    pub why: String,
}

/// `(key, value)` of each key of `rule` a reload compares, spelled as in the file
/// (`-` for a key that is not set).
fn keys(rule: &RuleSpec) -> Vec<(&'static str, String)> {
    let unset = || "-".to_string();
    let per_source = rule.per_source.as_ref();
    vec![
        ("dst", rule.dst.to_string()),
        (
            "dst_port",
            rule.dst_port.map_or_else(unset, |p| p.to_string()),
        ),
        ("proto", rule.proto.spelling().to_string()),
        ("unit", rule.unit.spelling().to_string()),
        (
            "rate",
            rule.aggregate.map_or_else(unset, |a| a.rate.to_string()),
        ),
        (
            "burst",
            rule.aggregate.map_or_else(unset, |a| a.burst.to_string()),
        ),
        ("mode", rule.mode.spelling().to_string()),
        ("enforce_percent", rule.enforce.to_string()),
        (
            "fail_mode",
            FailModeWord(rule.fail_mode).spelling().to_string(),
        ),
        (
            "per_source.rate",
            per_source.map_or_else(unset, |p| p.rate.to_string()),
        ),
        (
            "per_source.burst",
            per_source.map_or_else(unset, |p| p.burst.to_string()),
        ),
        (
            "per_source.prefix_v4",
            per_source.map_or_else(unset, |p| p.prefix_v4.to_string()),
        ),
        (
            "per_source.prefix_v6",
            per_source.map_or_else(unset, |p| p.prefix_v6.to_string()),
        ),
        (
            "per_source.on_saturation",
            per_source.map_or_else(unset, |p| p.on_saturation.spelling().to_string()),
        ),
    ]
}

/// The rules' keys that differ between `before` and `after`.
fn changed_keys(before: &RuleSpec, after: &RuleSpec) -> Vec<KeyChange> {
    keys(before)
        .into_iter()
        .zip(keys(after))
        .filter(|((_, from), (_, to))| from != to)
        .map(|((key, from), (_, to))| KeyChange { key, from, to })
        .collect()
}

/// The settings other than rules that differ between the running config and the next
/// one and that a reload applies: each interface's `[[tunnels]]` (`-`: none), `bypass`,
/// and the `[monitor]` keys.
pub fn setting_changes(running: &Config, next: &Config) -> Vec<SettingChange> {
    let tunnels = |c: &Config| -> BTreeMap<String, String> {
        c.tunnels
            .iter()
            .map(|t| {
                let list: Vec<String> = t.decapsulate.iter().map(|e| format!("\"{e}\"")).collect();
                (
                    format!("tunnels.{}", t.interface),
                    format!("[{}]", list.join(", ")),
                )
            })
            .collect()
    };
    let (before, after) = (tunnels(running), tunnels(next));
    let mut keys: Vec<&String> = before.keys().chain(after.keys()).collect();
    keys.sort();
    keys.dedup();
    let unset = "-".to_string();
    let mut changes: Vec<SettingChange> = keys
        .into_iter()
        .filter_map(|key| {
            let from = before.get(key).unwrap_or(&unset);
            let to = after.get(key).unwrap_or(&unset);
            (from != to).then(|| SettingChange {
                setting: key.clone(),
                from: from.clone(),
                to: to.clone(),
            })
        })
        .collect();
    if running.bypass != next.bypass {
        changes.push(SettingChange {
            setting: "bypass".to_string(),
            from: running.bypass.as_str().to_string(),
            to: next.bypass.as_str().to_string(),
        });
    }
    changes.extend(monitor_changes(&running.monitor, &next.monitor));
    changes
}

/// What a reload from the running rules (`live`, the quota overrides applied) to `next`
/// (the file's) does. `overrides`: the running `quota set` overrides (a reload drops
/// them); `regions`: the sketch's plan for `next`, by the slots `next_slots` gives the
/// new rules; `per_source_rules`: how many per-source rules run now (the sketch's cut).
pub fn plan(
    live: &[RuleSpec],
    next: &[RuleSpec],
    overrides: &BTreeMap<String, RateSpec>,
    next_slots: &BTreeMap<String, u32>,
    regions: &RegionPlan,
    per_source_rules: usize,
) -> ReloadPlan {
    let before: BTreeMap<&str, &RuleSpec> = live.iter().map(|r| (r.name.as_str(), r)).collect();
    let after: BTreeMap<&str, &RuleSpec> = next.iter().map(|r| (r.name.as_str(), r)).collect();
    let mut p = ReloadPlan::default();
    for (name, rule) in &after {
        match before.get(name) {
            None => {
                p.added.push((*name).to_string());
                p.restarts.push(Restart {
                    rule: (*name).to_string(),
                    state: "aggregate",
                    why: "new rule".into(),
                });
            }
            Some(old) => {
                let keys = changed_keys(old, rule);
                if keys.is_empty() {
                    p.unchanged += 1;
                } else {
                    p.changed.push(RuleChange {
                        rule: (*name).to_string(),
                        keys,
                    });
                }
            }
        }
    }
    p.removed = before
        .keys()
        .filter(|name| !after.contains_key(*name))
        .map(|name| (*name).to_string())
        .collect();
    p.quota_overrides_dropped = overrides
        .keys()
        .filter(|name| before.contains_key(name.as_str()))
        .cloned()
        .collect();
    let next_per_source = next.iter().filter(|r| r.per_source.is_some()).count();
    let by_slot: BTreeMap<u32, &str> = next_slots.iter().map(|(n, s)| (*s, n.as_str())).collect();
    for (slot, region) in &regions.regions {
        if !regions.cleared.contains(region) {
            continue;
        }
        let Some(name) = by_slot.get(slot) else {
            continue;
        };
        let limit = |r: &RuleSpec| {
            r.per_source
                .map(|p| (p.rate, p.burst, p.prefix_v4, p.prefix_v6))
        };
        let why = match (before.get(name), after.get(name)) {
            // A new rule: its whole state is new, said once above.
            (None, _) | (_, None) => continue,
            (Some(old), _) if old.per_source.is_none() => "per-source limit added".to_string(),
            (Some(old), Some(new)) if limit(old) != limit(new) => {
                "per-source limit changed".to_string()
            }
            _ => format!(
                "the sketch is cut anew for {next_per_source} per-source rules (was \
                 {per_source_rules})"
            ),
        };
        p.restarts.push(Restart {
            rule: (*name).to_string(),
            state: "per_source",
            why,
        });
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn rules(toml: &str) -> Vec<RuleSpec> {
        Config::parse(toml, std::path::Path::new("test.toml"))
            .unwrap()
            .rules
    }

    const BASE: &str = r#"
interfaces = ["veth0"]
[[rules]]
name = "web"
dst = "198.18.0.10/32"
dst_port = 443
proto = "tcp"
rate = 1000
burst = 100
[rules.per_source]
rate = 10
burst = 5
[[rules]]
name = "dns"
dst = "198.18.0.53/32"
proto = "udp"
rate = 500
burst = 50
"#;

    /// A canary widened at a reload is a changed key, as the file spells it; nothing
    /// restarts (the canary is a threshold in the rule's entry).
    #[test]
    fn a_changed_enforce_percent_is_listed() {
        let before = rules(BASE);
        let after = rules(&BASE.replacen("rate = 500", "rate = 500\nenforce_percent = 2.5", 1));
        let p = plan(
            &before,
            &after,
            &BTreeMap::new(),
            &BTreeMap::new(),
            &RegionPlan::default(),
            1,
        );
        assert_eq!(p.changed.len(), 1, "{p:?}");
        assert_eq!(
            p.changed[0].keys,
            [KeyChange {
                key: "enforce_percent",
                from: "100".into(),
                to: "2.5".into()
            }]
        );
        assert!(p.restarts.is_empty(), "{p:?}");
    }

    #[test]
    fn rules_added_removed_and_changed_are_listed_with_their_keys() {
        let before = rules(BASE);
        let after = rules(
            &BASE
                .replace("rate = 500", "rate = 800")
                .replace("name = \"dns\"", "name = \"dns2\""),
        );
        let p = plan(
            &before,
            &after,
            &BTreeMap::new(),
            &BTreeMap::new(),
            &RegionPlan::default(),
            1,
        );
        assert_eq!(p.added, ["dns2"]);
        assert_eq!(p.removed, ["dns"]);
        assert!(p.changed.is_empty());
        assert_eq!(p.unchanged, 1);
        assert_eq!(
            p.restarts,
            [Restart {
                rule: "dns2".into(),
                state: "aggregate",
                why: "new rule".into()
            }]
        );

        let after = rules(&BASE.replace("rate = 500", "rate = 800"));
        let mut overrides = BTreeMap::new();
        overrides.insert(
            "web".to_string(),
            RateSpec {
                rate: 2000,
                burst: 100,
            },
        );
        let p = plan(
            &before,
            &after,
            &overrides,
            &BTreeMap::new(),
            &RegionPlan::default(),
            1,
        );
        assert_eq!(
            p.changed,
            [RuleChange {
                rule: "dns".into(),
                keys: vec![KeyChange {
                    key: "rate",
                    from: "500".into(),
                    to: "800".into()
                }]
            }]
        );
        // A rate change keeps the bucket: nothing restarts.
        assert!(p.restarts.is_empty());
        assert_eq!(p.quota_overrides_dropped, ["web"]);
    }

    #[test]
    fn cleared_sketch_regions_name_their_rules_and_why() {
        let before = rules(BASE);
        let after = rules(&BASE.replace("rate = 10\n", "rate = 20\n"));
        let slots: BTreeMap<String, u32> = [("web".to_string(), 0), ("dns".to_string(), 1)].into();
        let regions = RegionPlan {
            regions: [(0, 7)].into(),
            cleared: vec![7],
        };
        let p = plan(&before, &after, &BTreeMap::new(), &slots, &regions, 1);
        assert_eq!(
            p.restarts,
            [Restart {
                rule: "web".into(),
                state: "per_source",
                why: "per-source limit changed".into()
            }]
        );
        assert_eq!(p.changed[0].keys[0].key, "per_source.rate");
        // The same rules, the sketch cut anew (another per-source rule elsewhere).
        let p = plan(&before, &before, &BTreeMap::new(), &slots, &regions, 2);
        assert_eq!(
            p.restarts[0].why,
            "the sketch is cut anew for 1 per-source rules (was 2)"
        );
    }

    #[test]
    fn tunnel_and_bypass_changes_are_listed_as_the_file_spells_them() {
        let config = |toml: &str| Config::parse(toml, std::path::Path::new("test.toml")).unwrap();
        let base = "interfaces = [\"eth1\", \"eth2\"]\n";
        let before = config(&format!(
            "{base}[[tunnels]]\ninterface = \"eth1\"\ndecapsulate = [\"ipip\"]\n"
        ));
        let after = config(&format!(
            "{base}bypass = \"on\"\n[[tunnels]]\ninterface = \"eth2\"\ndecapsulate = [\"gre\", \"fou:5555\"]\n"
        ));
        let changes = setting_changes(&before, &after);
        let shown: Vec<String> = changes
            .iter()
            .map(|c| format!("{}: {} -> {}", c.setting, c.from, c.to))
            .collect();
        assert_eq!(
            shown,
            [
                "tunnels.eth1: [\"ipip\"] -> -",
                "tunnels.eth2: - -> [\"gre\", \"fou:5555\"]",
                "bypass: off -> on",
            ]
        );
        assert!(setting_changes(&after, &after).is_empty());
    }
}
