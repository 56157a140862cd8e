//! Which changed keys a reload leaves for the next start (pure): a reload installs the
//! rules, and the handoff when it stays within the arrays the program was loaded with;
//! every other key waits. The schema rows say the same for docs/config.md's "applies
//! at" column (`limiter_config::Applies`), and the test below holds the two together.

use crate::{
    attach::handoff,
    config::{Config, HandoffSpec},
};

/// The keys whose change between `old` and `new` only takes effect at the next start, in
/// the order `reload` reports them.
pub fn restart_keys(old: &Config, new: &Config) -> Vec<&'static str> {
    let mut keys = Vec::new();
    if !handoff::live_change(old.handoff.as_ref(), new.handoff.as_ref()) {
        keys.push(
            new.handoff
                .as_ref()
                .or(old.handoff.as_ref())
                .map_or("next_program", HandoffSpec::key),
        );
    }
    let changed: [(&'static str, bool); 11] = [
        ("pin_dir", new.pin_dir != old.pin_dir),
        ("max_sources", new.max_sources != old.max_sources),
        ("interfaces", new.interfaces != old.interfaces),
        ("xdp_share", new.xdp_share != old.xdp_share),
        ("xdp_priority", new.xdp_priority != old.xdp_priority),
        (
            "xdp_share_fallback",
            new.xdp_share_fallback != old.xdp_share_fallback,
        ),
        ("xdp_mode", new.xdp_mode != old.xdp_mode),
        ("control_socket", new.control_socket != old.control_socket),
        ("metrics", new.metrics != old.metrics),
        ("fleet", new.fleet != old.fleet),
        ("fleet_size", new.fleet_size != old.fleet_size),
    ];
    keys.extend(changed.iter().filter(|(_, c)| *c).map(|(k, _)| *k));
    keys
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use std::path::Path;

    use limiter_config::Applies;

    use super::*;
    use crate::config::schema::TOP_KEYS;

    fn parse(text: &str) -> Config {
        Config::parse(text, Path::new("/etc/limiter.toml")).unwrap()
    }

    const RULE: &str = "[[rules]]\nname = \"r\"\ndst = \"198.18.0.0/15\"\nrate = 10\nburst = 10\n";
    const FLEET: &str = "[fleet]\nallocator = \"198.18.0.1:7443\"\nca = \"/c\"\ncert = \"/c\"\nkey = \"/k\"\nhost_id = \"h\"\n";

    /// Each top-level key: a file, and the same file with that key changed.
    fn changes() -> Vec<(&'static str, String, String)> {
        vec![
            (
                "interfaces",
                "interfaces = [\"a\"]\n".into(),
                "interfaces = [\"b\"]\n".into(),
            ),
            ("xdp_mode", String::new(), "xdp_mode = \"tc\"\n".into()),
            (
                "xdp_share",
                String::new(),
                "xdp_share = \"libxdp\"\n".into(),
            ),
            (
                "xdp_priority",
                "xdp_share = \"libxdp\"\n".into(),
                "xdp_share = \"libxdp\"\nxdp_priority = 3\n".into(),
            ),
            (
                "xdp_share_fallback",
                "xdp_share = \"libxdp\"\n".into(),
                "xdp_share = \"libxdp\"\nxdp_share_fallback = \"tail-call\"\n".into(),
            ),
            (
                "pin_dir",
                String::new(),
                "pin_dir = \"/sys/fs/bpf/other\"\n".into(),
            ),
            (
                "control_socket",
                String::new(),
                "control_socket = \"/run/x.sock\"\n".into(),
            ),
            ("metrics", String::new(), "metrics = \"\"\n".into()),
            ("max_sources", String::new(), "max_sources = 4096\n".into()),
            ("fleet_size", String::new(), "fleet_size = 7\n".into()),
            ("bypass", String::new(), "bypass = \"on\"\n".into()),
            (
                "tunnels",
                String::new(),
                "[[tunnels]]\ninterface = \"eth1\"\ndecapsulate = [\"ipip\"]\n".into(),
            ),
            (
                "monitor",
                String::new(),
                "[monitor]\nevents_per_sec = 100\n".into(),
            ),
            ("rules", String::new(), RULE.into()),
            ("fleet", RULE.into(), format!("{RULE}{FLEET}")),
            (
                "next_program",
                "next_program = \"/sys/fs/bpf/lb/a\"\n".into(),
                "next_program = \"/sys/fs/bpf/lb/b\"\n".into(),
            ),
            (
                "join_program_array",
                String::new(),
                "join_program_array = \"/sys/fs/bpf/lb/root:0\"\n".into(),
            ),
        ]
    }

    /// What a reload does with each top-level key is what its schema row says: a key the
    /// row calls `restart` is reported as waiting, a `reload` key is not, and a `Partly`
    /// key (`next_program`) reloads within one array and waits across arrays. A new row
    /// fails here until it is given a change to try.
    #[test]
    fn reload_waits_for_exactly_the_keys_the_schema_calls_restart() {
        let changes = changes();
        let mut failed = Vec::new();
        for key in TOP_KEYS.keys {
            let Some((_, old, new)) = changes.iter().find(|(k, _, _)| *k == key.name) else {
                failed.push(format!("{}: no change to try", key.name));
                continue;
            };
            let waits = restart_keys(&parse(old), &parse(new));
            let expected: Vec<&str> = match key.applies {
                Applies::Restart => vec![key.name],
                Applies::Reload | Applies::Partly(_) => vec![],
            };
            if waits != expected {
                failed.push(format!(
                    "{}: the row says {:?}, a reload waits for {waits:?}",
                    key.name, key.applies
                ));
            }
        }
        assert!(failed.is_empty(), "{}", failed.join("\n"));
        // next_program across arrays (PIN → PIN:INDEX) waits, as its row says.
        assert_eq!(
            restart_keys(
                &parse("next_program = \"/sys/fs/bpf/lb/a\"\n"),
                &parse("next_program = \"/sys/fs/bpf/jmp:2\"\n")
            ),
            ["next_program"]
        );
        // Nothing changed, nothing waits.
        assert!(restart_keys(&parse(RULE), &parse(RULE)).is_empty());
    }
}
