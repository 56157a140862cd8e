//! The config file's checker: walks toml's spanned tree ([`limiter_config::Checker`]),
//! reading each key by its schema row ([`super::schema`]) and reporting every problem
//! with its line, column and field path, then the checks that relate keys (ambiguous
//! rules, keys that need another). Nothing here changes the system: [`Config::parse`]
//! reads only the kernel's hostname (the default `fleet.host_id`).

use std::{
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
    ops::{Deref, DerefMut, Range},
    path::{Path, PathBuf},
};

use ipnet::IpNet;
use limiter_common::{
    abi,
    gcra::{Limit, LimitError},
};
use limiter_config::{
    toml::{
        de::{DeTable, DeValue},
        Spanned,
    },
    Absent, At, Checker, ConfigError, Value,
};

use super::{schema::*, types::*, words::*};

impl Config {
    /// Reads and validates the config file at `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = limiter_config::read_file(path)?;
        Config::parse(&text, path)
    }

    /// Validates `text`; `origin` names the file in error messages.
    pub fn parse(text: &str, origin: &Path) -> Result<Config, ConfigError> {
        let root = Checker::parse(text, origin)?;
        let mut walk = Walk(Checker::new(text));
        let config = walk.config(root.get_ref());
        walk.0.finish(origin).map(|()| config)
    }
}

impl Default for Config {
    /// The configuration of an empty file: every key at its schema row's default.
    fn default() -> Self {
        defaults()
    }
}

/// The configuration of an empty file: what every schema row says an absent key means.
fn defaults() -> Config {
    Walk(Checker::new("")).config(&DeTable::new())
}

/// `[monitor]` as an absent table has it (no row of its is required).
fn monitor_defaults() -> MonitorKeys {
    let mut empty = Checker::new("");
    MonitorKeys::read(&mut empty, &DeTable::new(), 0..0, "monitor").unwrap_or(MonitorKeys {
        events_per_sec: 0,
        snap_len: limiter_common::drop::MAX_SNAP_LEN as u32,
    })
}

/// The top level's plain keys as an empty file has them (no row of theirs is required).
fn top_key_defaults() -> TopKeys {
    let mut empty = Checker::new("");
    TopKeys::read(&mut empty, &DeTable::new(), 0..0, "").unwrap_or_else(|| {
        unreachable!(
            "every plain top-level row has a default (the schema's tests read an empty file)"
        )
    })
}

/// The limiter's walk over a file, on the shared checker (whose readers it calls as its
/// own).
struct Walk<'t>(Checker<'t>);

impl<'t> Deref for Walk<'t> {
    type Target = Checker<'t>;

    fn deref(&self) -> &Checker<'t> {
        &self.0
    }
}

impl DerefMut for Walk<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

/// What the cross-rule checks need to know about a rule, valid or not: a rule with a
/// bad burst still claims its name and its (dst, dst_port, proto).
struct RuleSite {
    index: usize,
    /// Where the rule's table starts.
    header_at: Range<usize>,
    /// The name, when it is a string.
    name: Option<String>,
    /// Where its name is (the header when it has none).
    name_at: Range<usize>,
    /// (dst, dst_port, proto), when all three parsed.
    key: Option<MatchKey>,
}

type MatchKey = (IpNet, Option<u16>, Proto);

impl Walk<'_> {
    fn config(&mut self, root: &DeTable<'_>) -> Config {
        self.unknown_keys(root, &TOP_KEYS, At::top(""));
        let top = At::top;

        let interfaces = match root.get(INTERFACES.name) {
            Some(value) => self.interfaces(value),
            None => Vec::new(),
        };
        // A wrong plain key is reported and its row's default stands in for the checks
        // below (the config then never leaves the checker).
        let keys = TopKeys::read_or(&mut self.0, root, 0..0, "", &top_key_defaults());
        let (xdp_mode, xdp_share) = (keys.xdp_mode, keys.xdp_share);
        if xdp_share == XdpShare::Libxdp && xdp_mode == XdpMode::Tc {
            if let Some(value) = root.get("xdp_share") {
                self.report(
                    value.span(),
                    top("xdp_share"),
                    "xdp_share = \"libxdp\" shares the XDP hook, and xdp_mode = \"tc\" does not \
                     use it: choose xdp_mode auto, native or generic, or xdp_share = \"exclusive\"",
                );
            }
        }
        if xdp_share != XdpShare::Libxdp {
            if let Some(value) = root.get("xdp_priority") {
                self.report(
                    value.span(),
                    top("xdp_priority"),
                    "xdp_priority is the run priority in a libxdp dispatcher: it needs \
                     xdp_share = \"libxdp\"",
                );
            }
            if let Some(value) = root.get("xdp_share_fallback") {
                self.report(
                    value.span(),
                    top("xdp_share_fallback"),
                    "xdp_share_fallback says what xdp_share = \"libxdp\" does where the \
                     kernel refuses freplace: it needs xdp_share = \"libxdp\"",
                );
            }
        }
        let metrics = self.metrics(root);
        let rules = match root.get(RULES.name) {
            Some(value) => self.rules(value),
            None => Vec::new(),
        };
        let fleet = root.get(FLEET.name).and_then(|value| self.fleet(value));
        let tunnels = match root.get(TUNNELS.name) {
            Some(value) => self.tunnels(value),
            None => Vec::new(),
        };
        let monitor = match root.get(MONITOR.name) {
            Some(value) => self.monitor(value),
            None => monitor_defaults(),
        };
        let mut config = Config {
            keys,
            interfaces,
            metrics,
            rules,
            fleet,
            handoff: None,
            tunnels,
            monitor,
        };
        config.handoff = self.handoff(root, &config);
        config
    }

    /// `metrics`: an address, or `""` for none.
    fn metrics(&mut self, root: &DeTable<'_>) -> Option<SocketAddr> {
        let default = || match METRICS.absent {
            Absent::Str(addr) => addr.parse().ok(),
            _ => None,
        };
        let Some(value) = root.get(METRICS.name) else {
            return default();
        };
        let s = self.string(value, At::top("metrics"))?;
        if s.is_empty() {
            return None;
        }
        match s.parse::<SocketAddr>() {
            Ok(addr) => Some(addr),
            Err(_) => {
                self.report(
                    value.span(),
                    At::top("metrics"),
                    format!(
                        "\"{s}\" is not an address:port such as \"{DEFAULT_METRICS}\" \
                         or \"[::1]:9464\" (use \"\" to disable metrics)"
                    ),
                );
                default()
            }
        }
    }

    fn handoff(&mut self, root: &DeTable<'_>, config: &Config) -> Option<HandoffSpec> {
        let top = |path| At { path, rule: None };
        let next = root.get("next_program");
        let join = root.get("join_program_array");
        if let (Some(_), Some(join)) = (next, join) {
            self.report(
                join.span(),
                top("join_program_array"),
                "set together with next_program: choose one (next_program: the limiter runs \
                 on the hook and calls the LB; join_program_array: the LB's root program \
                 calls the limiter)",
            );
            return None;
        }
        let (key, value) = match (next, join) {
            (Some(v), None) => ("next_program", v),
            (None, Some(v)) => ("join_program_array", v),
            _ => return None,
        };
        let text = self.string(value, top(key))?;
        let spec = match parse_pin_index(text, key == "join_program_array") {
            Ok((pin, None)) => HandoffSpec::Program(pin),
            Ok((array, Some(index))) if key == "next_program" => HandoffSpec::Slot { array, index },
            Ok((array, Some(index))) => HandoffSpec::Join { array, index },
            Err(message) => {
                self.report(value.span(), top(key), message);
                return None;
            }
        };
        if config.xdp_mode == XdpMode::Tc {
            self.report(
                value.span(),
                top(key),
                "not with xdp_mode = \"tc\": the TC build cannot tail-call an XDP program \
                 (the kernel refuses calls across program types); use xdp_mode \"auto\", \
                 \"native\" or \"generic\"",
            );
            return None;
        }
        if config.xdp_share == XdpShare::Libxdp {
            self.report(
                value.span(),
                top(key),
                "not with xdp_share = \"libxdp\": in a libxdp dispatcher the next component \
                 gets what the limiter passes; a tail call would skip it. Use one way of \
                 sharing: the dispatcher (xdp_share) or the handoff (this key)",
            );
            return None;
        }
        if matches!(spec, HandoffSpec::Join { .. }) && !config.interfaces.is_empty() {
            self.report(
                value.span(),
                top(key),
                "not with interfaces: the LB's root program runs on the interfaces and calls \
                 the limiter from its array; attaching the limiter too would meter every \
                 frame twice (leave interfaces empty)",
            );
            return None;
        }
        Some(spec)
    }

    /// `[monitor]`: its keys' bounds are the schema's (a wrong one is reported and the
    /// defaults stand in).
    fn monitor(&mut self, value: &Value<'_>) -> MonitorKeys {
        let DeValue::Table(table) = value.get_ref() else {
            self.report(
                value.span(),
                At::top("monitor"),
                format!("expected a table, found {}", value.get_ref().type_str()),
            );
            return monitor_defaults();
        };
        self.unknown_keys(table, &MONITOR_KEYS, At::top("monitor"));
        MonitorKeys::read_or(
            &mut self.0,
            table,
            value.span(),
            "monitor",
            &monitor_defaults(),
        )
    }

    fn fleet(&mut self, value: &Value<'_>) -> Option<FleetSpec> {
        let top = |path| At { path, rule: None };
        let DeValue::Table(table) = value.get_ref() else {
            self.report(
                value.span(),
                top("fleet"),
                format!("expected a table, found {}", value.get_ref().type_str()),
            );
            return None;
        };
        self.unknown_keys(table, &FLEET_KEYS, At::top("fleet"));
        let before = self.count();
        let keys = FleetKeys::read(&mut self.0, table, value.span(), "fleet");
        let groups = match (table.get("allocator"), table.get("groups")) {
            (Some(v), None) => self
                .allocator_addresses(v, "fleet.allocator")
                .map(|allocators| {
                    vec![AllocatorGroup {
                        name: String::new(),
                        allocators,
                    }]
                }),
            (None, Some(v)) => self.allocator_groups(v),
            (Some(_), Some(v)) => {
                self.report(
                    v.span(),
                    top("fleet.groups"),
                    "groups and allocator are mutually exclusive: list the allocators either \
                     in allocator (one group) or in [[fleet.groups]] (sharded allocators)",
                );
                None
            }
            (None, None) => {
                self.report(
                    value.span(),
                    top("fleet.allocator"),
                    "allocator is required in [fleet] (or [[fleet.groups]], for sharded \
                     allocators)",
                );
                None
            }
        };
        let host_id = match table.get("host_id") {
            Some(v) => self.string(v, top("fleet.host_id")).map(str::to_string),
            None => Some(default_host_id()),
        };
        if let (Some(id), Some(v)) = (&host_id, table.get("host_id")) {
            if let Err(e) = check_rule_name(id) {
                self.report(
                    v.span(),
                    top("fleet.host_id"),
                    e.replace("rule name", "host id"),
                );
            }
        }
        let bind = match table.get("bind") {
            Some(v) => self
                .string(v, top("fleet.bind"))
                .and_then(|s| match s.parse() {
                    Ok(ip) => Some(Some(ip)),
                    Err(_) => {
                        self.report(
                            v.span(),
                            top("fleet.bind"),
                            format!("\"{s}\" is not an IP address"),
                        );
                        None
                    }
                }),
            None => Some(None),
        };
        if let Some(FleetKeys {
            lease_ttl_ms: ttl,
            report_interval_ms: interval,
            ..
        }) = keys
        {
            if interval >= ttl {
                let at = table
                    .get("report_interval_ms")
                    .map_or(value.span(), |v| v.span());
                self.report(at, top("fleet.report_interval_ms"), format!("must be below lease_ttl_ms ({ttl}) so leases are renewed before they lapse"));
            }
        }
        if self.count() != before {
            return None;
        }
        Some(FleetSpec {
            keys: keys?,
            groups: groups?,
            host_id: host_id?,
            bind: bind?,
        })
    }

    /// `[[fleet.groups]]`: each group's name (unique, a rule name's alphabet) and
    /// allocators (as `[fleet] allocator`); an address in two groups is refused.
    fn allocator_groups(&mut self, value: &Value<'_>) -> Option<Vec<AllocatorGroup>> {
        let items = self.non_empty_array(
            value,
            At::top("fleet.groups"),
            "an array of tables ([[fleet.groups]])",
            "groups",
            "group",
        )?;
        let before = self.count();
        let mut groups: Vec<AllocatorGroup> = Vec::new();
        // Where each name and address was first given, for the duplicate's message.
        let mut names: BTreeMap<String, usize> = BTreeMap::new();
        let mut addresses: BTreeMap<SocketAddr, usize> = BTreeMap::new();
        for (i, item) in items.iter().enumerate() {
            let prefix = format!("fleet.groups[{i}]");
            let DeValue::Table(table) = item.get_ref() else {
                self.report(
                    item.span(),
                    At::top(&prefix),
                    format!("expected a table, found {}", item.get_ref().type_str()),
                );
                continue;
            };
            self.unknown_keys(table, &FLEET_GROUP_KEYS, At::top(&prefix));
            let name_path = format!("{prefix}.name");
            let name = match table.get("name") {
                Some(v) => match self.string(v, At::top(&name_path)) {
                    Some(n) => match check_rule_name(n) {
                        Err(e) => {
                            self.report(
                                v.span(),
                                At::top(&name_path),
                                e.replace("rule name", "group name"),
                            );
                            None
                        }
                        Ok(()) => match names.get(n) {
                            Some(first) => {
                                self.report(
                                    v.span(),
                                    At::top(&name_path),
                                    format!("group {n:?} is listed twice (first in fleet.groups[{first}])"),
                                );
                                None
                            }
                            None => {
                                names.insert(n.to_string(), i);
                                Some(n.to_string())
                            }
                        },
                    },
                    None => None,
                },
                None => {
                    self.report(
                        item.span(),
                        At::top(&name_path),
                        "name is required in [[fleet.groups]] (the group's [election] name)",
                    );
                    None
                }
            };
            let allocator_path = format!("{prefix}.allocator");
            let allocators = match table.get("allocator") {
                Some(v) => self.allocator_addresses(v, &allocator_path),
                None => {
                    self.report(
                        item.span(),
                        At::top(&allocator_path),
                        "allocator is required in [[fleet.groups]] (the group's replicas' addresses)",
                    );
                    None
                }
            };
            if let Some(list) = &allocators {
                for a in list {
                    if let Some(first) = addresses.get(a) {
                        let span = table.get("allocator").map_or(item.span(), |v| v.span());
                        self.report(
                            span,
                            At::top(&allocator_path),
                            format!(
                                "{a} is also in fleet.groups[{first}]: an allocator belongs \
                                 to one group"
                            ),
                        );
                    } else {
                        addresses.insert(*a, i);
                    }
                }
            }
            if let (Some(name), Some(allocators)) = (name, allocators) {
                groups.push(AllocatorGroup { name, allocators });
            }
        }
        (self.count() == before).then_some(groups)
    }

    /// `[fleet] allocator` (or a group's): one address, or the replicas' addresses in
    /// the order they are tried (replicated allocators). Each is checked; one listed twice
    /// is refused. `field` names the key in errors.
    fn allocator_addresses(&mut self, value: &Value<'_>, field: &str) -> Option<Vec<SocketAddr>> {
        let (items, array): (Vec<&Value<'_>>, bool) = match value.get_ref() {
            DeValue::Array(items) => (items.iter().collect(), true),
            _ => (vec![value], false),
        };
        if array && items.is_empty() {
            self.report(
                value.span(),
                At::top(field),
                "allocator is an empty list: name at least one address:port",
            );
            return None;
        }
        let mut out: Vec<SocketAddr> = Vec::new();
        let mut valid = true;
        for (i, item) in items.iter().enumerate() {
            let path = if array {
                format!("{field}[{i}]")
            } else {
                field.to_string()
            };
            let Some(text) = self.string(item, At::top(&path)) else {
                valid = false;
                continue;
            };
            match text.parse::<SocketAddr>() {
                Ok(a) if out.contains(&a) => {
                    self.report(
                        item.span(),
                        At::top(&path),
                        format!("\"{text}\" is listed twice"),
                    );
                    valid = false;
                }
                Ok(a) => out.push(a),
                Err(_) => {
                    self.report(
                        item.span(),
                        At::top(&path),
                        format!("\"{text}\" is not an address:port such as \"198.18.0.1:7443\""),
                    );
                    valid = false;
                }
            }
        }
        valid.then_some(out)
    }

    fn interfaces(&mut self, value: &Value<'_>) -> Vec<String> {
        let at = At {
            path: "interfaces",
            rule: None,
        };
        let Some(items) = self.array(value, at, "an array of interface names") else {
            return Vec::new();
        };
        let mut names: Vec<String> = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let path = format!("interfaces[{i}]");
            let Some(name) = self.string(item, at.field(&path)) else {
                continue;
            };
            if let Err(why) = check_interface_name(name) {
                self.report(item.span(), at.field(&path), why);
            } else if names.iter().any(|n| n == name) {
                self.report(
                    item.span(),
                    at.field(&path),
                    format!("interface \"{name}\" is listed twice"),
                );
            } else {
                names.push(name.to_string());
            }
        }
        names
    }

    /// `[[tunnels]]`: one entry an interface, each naming at least one encapsulation.
    fn tunnels(&mut self, value: &Value<'_>) -> Vec<TunnelSpec> {
        let at = At::top("tunnels");
        let Some(items) = self.array(value, at, "an array of tables ([[tunnels]])") else {
            return Vec::new();
        };
        let mut out: Vec<TunnelSpec> = Vec::new();
        for (index, item) in items.iter().enumerate() {
            let prefix = format!("tunnels[{index}]");
            let Some(table) = self.table(item, At::top(&prefix)) else {
                continue;
            };
            self.unknown_keys(table, &TUNNEL_KEYS, At::top(&prefix));
            if index >= abi::MAX_TUNNEL_INTERFACES as usize {
                self.report(
                    item.span(),
                    At::top(&prefix),
                    format!(
                        "at most {} interfaces decapsulate",
                        abi::MAX_TUNNEL_INTERFACES
                    ),
                );
            }
            let iface_path = format!("{prefix}.interface");
            let interface = match table.get(TUNNEL_INTERFACE.name) {
                Some(v) => self.string(v, At::top(&iface_path)).and_then(|name| {
                    if let Err(why) = check_interface_name(name) {
                        self.report(v.span(), At::top(&iface_path), why);
                        None
                    } else if out.iter().any(|t| t.interface == name) {
                        self.report(
                            v.span(),
                            At::top(&iface_path),
                            format!("interface \"{name}\" has a [[tunnels]] entry already"),
                        );
                        None
                    } else {
                        Some(name.to_string())
                    }
                }),
                None => {
                    self.report(item.span(), At::top(&iface_path), "interface is required");
                    None
                }
            };
            let list_path = format!("{prefix}.decapsulate");
            let decapsulate = match table.get(TUNNEL_DECAPSULATE.name) {
                Some(v) => self.encapsulations(v, &list_path),
                None => {
                    self.report(item.span(), At::top(&list_path), "decapsulate is required");
                    None
                }
            };
            if let (Some(interface), Some(decapsulate)) = (interface, decapsulate) {
                out.push(TunnelSpec {
                    interface,
                    decapsulate,
                });
            }
        }
        out
    }

    fn encapsulations(&mut self, value: &Value<'_>, path: &str) -> Option<Vec<Encapsulation>> {
        let at = At::top(path);
        let items = self.non_empty_array(
            value,
            at,
            "an array of encapsulations",
            "decapsulate",
            "encapsulation",
        )?;
        let mut out: Vec<Encapsulation> = Vec::new();
        let mut valid = true;
        for (i, item) in items.iter().enumerate() {
            let item_path = format!("{path}[{i}]");
            let Some(word) = self.string(item, at.field(&item_path)) else {
                valid = false;
                continue;
            };
            match Encapsulation::parse(word) {
                Ok(e)
                    if out.contains(&e)
                        || e.udp_port()
                            .is_some_and(|p| out.iter().any(|o| o.udp_port() == Some(p))) =>
                {
                    self.report(
                        item.span(),
                        at.field(&item_path),
                        format!("\"{word}\" is listed twice"),
                    );
                    valid = false;
                }
                Ok(e) => out.push(e),
                Err(why) => {
                    self.report(item.span(), at.field(&item_path), why);
                    valid = false;
                }
            }
        }
        let ports = out.iter().filter(|e| e.udp_port().is_some()).count();
        if ports > abi::MAX_TUNNEL_UDP_PORTS {
            self.report(
                value.span(),
                at,
                format!(
                    "at most {} UDP ports (fou, gue) an interface, found {ports}",
                    abi::MAX_TUNNEL_UDP_PORTS
                ),
            );
            valid = false;
        }
        valid.then_some(out)
    }

    fn rules(&mut self, value: &Value<'_>) -> Vec<RuleSpec> {
        let at = At {
            path: "rules",
            rule: None,
        };
        let Some(items) = self.array(value, at, "an array of tables ([[rules]])") else {
            return Vec::new();
        };
        if items.len() > abi::MAX_RULES as usize {
            let span = items
                .get(abi::MAX_RULES as usize)
                .map_or_else(|| value.span(), Spanned::span);
            self.report(
                span,
                at,
                format!(
                    "at most {} rules are supported, found {}",
                    abi::MAX_RULES,
                    items.len()
                ),
            );
        }
        let mut rules: Vec<RuleSpec> = Vec::new();
        let mut sites: Vec<RuleSite> = Vec::new();
        for (index, item) in items.iter().enumerate() {
            let (rule, site) = self.rule(index, item);
            rules.extend(rule);
            sites.extend(site);
        }
        self.cross_rule_checks(&sites);
        rules
    }

    fn cross_rule_checks(&mut self, sites: &[RuleSite]) {
        let mut by_name: BTreeMap<&str, &RuleSite> = BTreeMap::new();
        let mut by_match: BTreeMap<MatchKey, &RuleSite> = BTreeMap::new();
        for site in sites {
            let Some(name) = site.name.as_deref() else {
                continue;
            };
            if let Some(first) = by_name.get(name) {
                let message = format!(
                    "name \"{name}\" is already used by rules[{}] (line {}); rule names must be \
                     unique",
                    first.index,
                    self.line(first.name_at.start)
                );
                let path = format!("rules[{}].name", site.index);
                self.report(
                    site.name_at.clone(),
                    At {
                        path: &path,
                        rule: Some(name),
                    },
                    message,
                );
            } else {
                by_name.insert(name, site);
            }

            let Some(key) = site.key else {
                continue;
            };
            if let Some(first) = by_match.get(&key) {
                let (dst, port, proto) = key;
                let port = port.map_or_else(|| "any".to_string(), |p| p.to_string());
                let message = format!(
                    "ambiguous: rules[{}] ({:?}, line {}) and this rule both match dst {dst}, \
                     dst_port {port}, proto {proto}; a packet must match one most specific \
                     rule, so merge them or make one more specific",
                    first.index,
                    first.name.as_deref().unwrap_or_default(),
                    self.line(first.header_at.start),
                );
                let path = format!("rules[{}]", site.index);
                self.report(
                    site.header_at.clone(),
                    At {
                        path: &path,
                        rule: Some(name),
                    },
                    message,
                );
            } else {
                by_match.insert(key, site);
            }
        }
    }

    /// Parses and checks one rule. The spec is `None` when any of its fields is wrong (the
    /// problems are recorded); the site is `None` when the rule is not even a table.
    fn rule(&mut self, index: usize, value: &Value<'_>) -> (Option<RuleSpec>, Option<RuleSite>) {
        let prefix = format!("rules[{index}]");
        let DeValue::Table(table) = value.get_ref() else {
            self.report(
                value.span(),
                At {
                    path: &prefix,
                    rule: None,
                },
                format!("expected a table, found {}", value.get_ref().type_str()),
            );
            return (None, None);
        };
        let before = self.count();
        let header_span = value.span();

        // The name first: every other problem of the rule is labelled with it.
        let name_path = format!("{prefix}.name");
        let name_value = table.get("name");
        let name: Option<&str> = match name_value {
            Some(v) => match v.get_ref() {
                DeValue::String(s) => Some(s.as_ref()),
                _ => None,
            },
            None => None,
        };
        let at = At {
            path: &prefix,
            rule: name,
        };
        self.unknown_keys(table, &RULE_KEYS, at);
        let name_at = match name_value {
            Some(v) => {
                if let Some(s) = self.string(v, at.field(&name_path)) {
                    if let Err(why) = check_rule_name(s) {
                        self.report(v.span(), at.field(&name_path), why);
                    }
                }
                v.span()
            }
            None => {
                self.report(
                    header_span.clone(),
                    at.field(&name_path),
                    "name is required",
                );
                header_span.clone()
            }
        };

        let field = |key: &str| format!("{prefix}.{key}");
        let dst_path = field("dst");
        let dst = match table.get("dst") {
            Some(v) => self
                .string(v, at.field(&dst_path))
                .and_then(|s| match parse_dst(s) {
                    Ok(net) => Some(net),
                    Err(why) => {
                        self.report(v.span(), at.field(&dst_path), why);
                        None
                    }
                }),
            None => {
                self.report(
                    header_span.clone(),
                    at.field(&dst_path),
                    "dst is required (a destination prefix such as \"203.0.113.0/24\")",
                );
                None
            }
        };
        let port_path = field("dst_port");
        let port_value = table.get("dst_port");
        let dst_port = self
            .integer_key(table, &RULE_DST_PORT, at.field(&port_path))
            .and_then(|p| u16::try_from(p).ok());
        let proto_path = field("proto");
        let proto: Option<Proto> = self.word_key(table, &RULE_PROTO, at.field(&proto_path));
        let unit_path = field("unit");
        let unit_value = table.get("unit");
        let unit: Option<Unit> = self.word_key(table, &RULE_UNIT, at.field(&unit_path));
        let mode_path = field("mode");
        let mode: Option<Mode> = self.word_key(table, &RULE_MODE, at.field(&mode_path));
        let enforce_path = field("enforce_percent");
        let enforce_value = table.get(RULE_ENFORCE_PERCENT.name);
        let enforce = match enforce_value {
            Some(v) => self.percent(v, at.field(&enforce_path)),
            None => Some(Percent::ALL),
        };
        if let (Some(v), Some(Mode::Shadow)) = (enforce_value, mode) {
            self.report(
                v.span(),
                at.field(&enforce_path),
                "enforce_percent is not allowed with mode \"shadow\": shadow mode drops for \
                 no source, enforce_percent drops for that share of them (a canary, in mode \
                 \"enforce\"); keep one",
            );
        }
        let fail_path = field("fail_mode");
        let fail_mode: Option<FailMode> = self
            .word_key::<FailModeWord>(table, &RULE_FAIL_MODE, at.field(&fail_path))
            .map(|word| word.0);

        if let (Some(port_value), Some(Proto::Icmp)) = (port_value, proto) {
            self.report(
                port_value.span(),
                at.field(&port_path),
                "dst_port is not allowed with proto \"icmp\" (ICMP has no ports)",
            );
        }
        if let (Some(Unit::Syn), Some(proto @ (Proto::Udp | Proto::Icmp))) = (unit, proto) {
            let span = unit_value.map_or_else(|| header_span.clone(), Spanned::span);
            self.report(
                span,
                at.field(&unit_path),
                format!("unit \"syn\" requires proto \"tcp\" or \"any\", not \"{proto}\""),
            );
        }

        // Aggregate limit.
        let rate_path = field("rate");
        let burst_path = field("burst");
        let rate_value = table.get("rate");
        let burst_value = table.get("burst");
        let rate = self.integer_key(table, &RULE_RATE, at.field(&rate_path));
        let burst = self.integer_key(table, &RULE_BURST, at.field(&burst_path));
        match (rate_value, burst_value) {
            (Some(rate_value), None) => self.report(
                rate_value.span(),
                at.field(&burst_path),
                "burst is required when rate is set",
            ),
            (None, Some(burst_value)) => self.report(
                burst_value.span(),
                at.field(&burst_path),
                "burst is not allowed without rate (the aggregate limit needs both)",
            ),
            _ => {}
        }
        let aggregate = match (rate_value, rate, burst_value, burst, unit) {
            (Some(rv), Some(rate), Some(bv), Some(burst), Some(unit)) => self
                .limit(
                    unit,
                    (rv, rate, at.field(&rate_path)),
                    (bv, burst, at.field(&burst_path)),
                )
                .map(|()| RateSpec { rate, burst }),
            _ => None,
        };

        // Per-source limit.
        let per_path = field("per_source");
        let per_source_value = table.get("per_source");
        let per_source =
            per_source_value.and_then(|v| self.per_source(v, at.field(&per_path), unit));

        if rate_value.is_none() && per_source_value.is_none() {
            self.report(
                header_span.clone(),
                at,
                "a rule needs an aggregate limit (rate and burst), a [rules.per_source] \
                 limit, or both",
            );
        }

        let port_ok = port_value.is_none() || dst_port.is_some();
        let site = RuleSite {
            index,
            header_at: header_span.clone(),
            name: name.map(str::to_string),
            name_at,
            key: match (dst, proto) {
                (Some(dst), Some(proto)) if port_ok => Some((dst, dst_port, proto)),
                _ => None,
            },
        };
        if self.count() != before {
            return (None, Some(site));
        }
        let spec = || -> Option<RuleSpec> {
            Some(RuleSpec {
                name: name?.to_string(),
                dst: dst?,
                dst_port,
                proto: proto?,
                unit: unit?,
                aggregate,
                mode: mode?,
                enforce: enforce?,
                fail_mode: fail_mode?,
                per_source,
            })
        };
        (spec(), Some(site))
    }

    /// `enforce_percent`: a number from 0 to 100 (an integer or a float, three decimals
    /// at most), read from its spelling so that 2.5 is exactly 2.5.
    fn percent(&mut self, value: &Value<'_>, at: At<'_>) -> Option<Percent> {
        let text = match value.get_ref() {
            DeValue::Integer(int) if int.radix() == 10 => int.as_str(),
            DeValue::Float(float) => float.as_str(),
            other => {
                self.report(
                    value.span(),
                    at,
                    format!(
                        "expected a number from 0 to 100 (such as 5 or 2.5), found {}",
                        other.type_str()
                    ),
                );
                return None;
            }
        };
        match Percent::parse(text) {
            Ok(percent) => Some(percent),
            Err(why) => {
                self.report(value.span(), at, why);
                None
            }
        }
    }

    /// Checks that a rate/burst pair compiles in `unit`; reports on the offending field.
    fn limit(
        &mut self,
        unit: Unit,
        (rate_value, rate, rate_at): (&Value<'_>, u64, At<'_>),
        (burst_value, burst, burst_at): (&Value<'_>, u64, At<'_>),
    ) -> Option<()> {
        if unit == Unit::Bytes && burst < MIN_BYTES_BURST {
            self.report(
                burst_value.span(),
                burst_at,
                format!(
                    "in unit \"bytes\" the burst must be at least {MIN_BYTES_BURST} (one full \
                     Ethernet frame; a larger frame than the burst could never pass), got {burst}"
                ),
            );
            return None;
        }
        match Limit::new(unit.granularity(), rate, burst) {
            Ok(_) => Some(()),
            Err(err @ (LimitError::RateZero | LimitError::RateTooHigh)) => {
                self.report(rate_value.span(), rate_at, err.to_string());
                None
            }
            Err(err @ (LimitError::BurstZero | LimitError::BurstTooLong)) => {
                self.report(burst_value.span(), burst_at, err.to_string());
                None
            }
        }
    }

    /// `unit` is `None` when the rule's unit is invalid: the limit is then not checked.
    fn per_source(
        &mut self,
        value: &Value<'_>,
        at: At<'_>,
        unit: Option<Unit>,
    ) -> Option<PerSourceSpec> {
        let table = self.table(value, at)?;
        let prefix = at.path;
        self.unknown_keys(table, &PER_SOURCE_KEYS, at);
        let before = self.count();
        let field = |key: &str| format!("{prefix}.{key}");
        let (rate_path, burst_path) = (field("rate"), field("burst"));
        let (v4_path, v6_path) = (field("prefix_v4"), field("prefix_v6"));

        let rate_value = table.get("rate");
        let burst_value = table.get("burst");
        let rate = match rate_value {
            Some(_) => self.integer_key(table, &PER_SOURCE_RATE, at.field(&rate_path)),
            None => {
                self.report(value.span(), at.field(&rate_path), "rate is required");
                None
            }
        };
        let burst = match burst_value {
            Some(_) => self.integer_key(table, &PER_SOURCE_BURST, at.field(&burst_path)),
            None => {
                self.report(value.span(), at.field(&burst_path), "burst is required");
                None
            }
        };
        let prefix_v4 = self.integer_key(table, &PER_SOURCE_PREFIX_V4, at.field(&v4_path));
        let prefix_v6 = self.integer_key(table, &PER_SOURCE_PREFIX_V6, at.field(&v6_path));
        let saturation_path = field("on_saturation");
        let on_saturation: Option<OnSaturation> =
            self.word_key(table, &PER_SOURCE_ON_SATURATION, at.field(&saturation_path));
        if let (Some(rv), Some(rate), Some(bv), Some(burst), Some(unit)) =
            (rate_value, rate, burst_value, burst, unit)
        {
            self.limit(
                unit,
                (rv, rate, at.field(&rate_path)),
                (bv, burst, at.field(&burst_path)),
            );
        }
        if self.count() != before {
            return None;
        }
        Some(PerSourceSpec {
            rate: rate?,
            burst: burst?,
            prefix_v4: u8::try_from(prefix_v4?).ok()?,
            prefix_v6: u8::try_from(prefix_v6?).ok()?,
            on_saturation: on_saturation?,
        })
    }
}

/// The kernel's hostname, the default fleet host id.
fn default_host_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| check_rule_name(s).is_ok())
        .unwrap_or_else(|| "localhost".to_string())
}

/// 1..=63 bytes of `[A-Za-z0-9._-]` (`limiter_common::rule_name`: the fleet protocol
/// holds names to the same grammar).
fn check_rule_name(name: &str) -> Result<(), String> {
    limiter_common::rule_name::check(name).map_err(|p| p.to_string())
}

/// The kernel's rule for interface names (`dev_valid_name`).
fn check_interface_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("interface name must not be empty".to_string());
    }
    if name.len() > 15 {
        return Err(format!("interface name \"{name}\" is longer than 15 bytes"));
    }
    if name == "."
        || name == ".."
        || name
            .chars()
            .any(|c| c == '/' || c == ':' || c.is_whitespace())
    {
        return Err(format!("\"{name}\" is not a valid interface name"));
    }
    Ok(())
}

/// A prefix such as `203.0.113.0/24`, or a bare address (/32 or /128). Host bits must be
/// clear: `203.0.113.10/24` is most likely a typo, so it is rejected with the network form.
pub fn parse_dst(text: &str) -> Result<IpNet, String> {
    let text = text.trim();
    if text.contains('/') {
        let net: IpNet = text.parse().map_err(|_| {
            format!(
                "\"{text}\" is not a prefix; expected an IPv4 or IPv6 prefix such as \
                 \"203.0.113.0/24\" or \"2001:db8::/32\", or a bare address"
            )
        })?;
        if net.trunc() != net {
            return Err(format!(
                "\"{text}\" has host bits set; did you mean \"{}\"?",
                net.trunc()
            ));
        }
        Ok(net)
    } else {
        let addr: IpAddr = text.parse().map_err(|_| {
            format!(
                "\"{text}\" is not an address or prefix; expected an IPv4 or IPv6 prefix such \
                 as \"203.0.113.0/24\" or \"2001:db8::/32\", or a bare address"
            )
        })?;
        Ok(IpNet::from(addr))
    }
}
/// Splits `PIN` or `PIN:INDEX` (pure). A suffix after the last ':' made only of digits
/// is the INDEX; anything else is part of the path. `index_required`: PIN alone is an
/// error (join_program_array).
pub fn parse_pin_index(text: &str, index_required: bool) -> Result<(PathBuf, Option<u32>), String> {
    let (pin, index) = match text.rsplit_once(':') {
        Some((pin, digits)) if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) => {
            let index = digits
                .parse::<u32>()
                .map_err(|_| format!("INDEX {digits} is not a slot number (0 to {})", u32::MAX))?;
            (pin, Some(index))
        }
        _ => (text, None),
    };
    if pin.is_empty() {
        return Err("the pin path is empty".into());
    }
    if pin.contains('\0') {
        return Err("the pin path contains a NUL byte".into());
    }
    if !pin.starts_with('/') {
        return Err(format!(
            "\"{pin}\" is not an absolute path (a pin on a bpf filesystem, such as \
             /sys/fs/bpf/katran/root_array)"
        ));
    }
    if index_required && index.is_none() {
        return Err(format!(
            "\"{text}\" has no slot: expected \"PIN:INDEX\", e.g. \"{pin}:0\""
        ));
    }
    Ok((PathBuf::from(pin), index))
}
