//! The docs held to the code, no kernel needed: docs/config.md is what the schema rows
//! generate, and the two binaries' shared timings take the same ranges.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

use std::{
    fs,
    path::{Path, PathBuf},
};

use limiter_config::{Key, Section};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

const CONFIG_MD: &str = "docs/config.md";
/// Set to write docs/config.md instead of comparing it.
const WRITE_DOCS: &str = "LIMITER_WRITE_DOCS";
const REGENERATE: &str = "LIMITER_WRITE_DOCS=1 cargo test --release --lib --bins config_reference";

/// docs/config.md as the rows of both binaries' schemas write it.
fn config_reference() -> String {
    format!(
        "# Config reference\n\n\
         <!-- Generated from the schema rows (limiter-user/src/config/schema.rs,\n\
         limiter-allocator/src/config.rs); do not edit. Regenerate with\n\
         {REGENERATE} -->\n\n\
         Every key of both config files, from the rows the checkers read: a key missing \
         here does not exist. **applies at**: `reload` takes effect at `limiter reload` \
         (or SIGHUP); `restart` at the next start (a reload leaves the running value \
         and says so). The allocator has no reload. The same text is in the man pages \
         `limiter.toml(5)` and `limiter-allocator.toml(5)`. Check a file with \
         `limiter check --config FILE` or `limiter-allocator check --config FILE`; \
         the annotated examples are `limiter.example.toml` and \
         `limiter-allocator.example.toml`.\n\n{}{}",
        limiter_user::config::schema::REFERENCE.markdown(),
        limiter_allocator::config::REFERENCE.markdown(),
    )
    .trim_end()
    .to_string()
        + "\n"
}

/// The checked-in reference is the generated one; when it is not, the message says the
/// command that regenerates it.
#[test]
fn config_reference_is_current() {
    let path = root().join(CONFIG_MD);
    let generated = config_reference();
    if std::env::var_os(WRITE_DOCS).is_some() {
        fs::write(&path, &generated).unwrap();
        return;
    }
    let checked_in = fs::read_to_string(&path).unwrap_or_default();
    if checked_in != generated {
        let first = checked_in
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(checked_in.lines().count().min(generated.lines().count()));
        panic!(
            "{CONFIG_MD} is stale (first difference at line {}): regenerate it with\n    {REGENERATE}",
            first + 1
        );
    }
}

/// The timings both binaries read (a daemon's `[fleet]` keys and the allocator's top
/// level) take the same bounds and defaults: a value one accepts the other does too.
#[test]
fn shared_timings_take_the_same_ranges() {
    use limiter_allocator::config as allocator;
    use limiter_user::config::schema as daemon;
    let pairs: [(&Key, &Key); 3] = [
        (&daemon::FLEET_SIZE, &allocator::FLEET_SIZE),
        (&daemon::FLEET_LEASE_TTL_MS, &allocator::LEASE_TTL_MS),
        (
            &daemon::FLEET_REPORT_INTERVAL_MS,
            &allocator::REPORT_INTERVAL_MS,
        ),
    ];
    let differ: Vec<String> = pairs
        .iter()
        .filter(|(d, a)| (d.name, d.kind, d.absent) != (a.name, a.kind, a.absent))
        .map(|(d, a)| {
            format!(
                "{}: limiter {:?} default {:?}, limiter-allocator {:?} default {:?}",
                d.name, d.kind, d.absent, a.kind, a.absent
            )
        })
        .collect();
    assert!(differ.is_empty(), "{}", differ.join("\n"));
}

/// Every section's rows say when a change applies, and the daemon's rules apply at a
/// reload while its other tables wait for a restart (what `reload` does).
#[test]
fn reference_rows_say_when_they_apply() {
    use limiter_config::{schema, Applies};
    use limiter_user::config::schema as daemon;
    let rules: &Section = &daemon::RULE_KEYS;
    assert!(rules.keys.iter().all(|k| k.applies == Applies::Reload));
    assert!(daemon::PER_SOURCE_KEYS
        .keys
        .iter()
        .all(|k| k.applies == Applies::Reload));
    for key in daemon::FLEET_KEYS.keys {
        let tls = ["ca", "cert", "key"].contains(&key.name);
        let expected = if tls {
            schema::TLS_FILE
        } else {
            Applies::Restart
        };
        assert_eq!(key.applies, expected, "[fleet] {}", key.name);
    }
    assert_eq!(daemon::RULES.applies, Applies::Reload);
    for key in [
        "xdp_mode",
        "pin_dir",
        "max_sources",
        "interfaces",
        "metrics",
        "fleet",
    ] {
        assert_eq!(
            daemon::TOP_KEYS.key(key).unwrap().applies,
            Applies::Restart,
            "{key}"
        );
    }
    let md = config_reference();
    assert!(
        md.contains("| `fleet_size` | integer | `500` | 1 to 4294967295 | restart |"),
        "{md}"
    );
}
