//! The docs held to the code, no kernel needed: docs/config.md is what the schema rows
//! generate, the two binaries' shared timings take the same ranges, and every relative
//! link and anchor of README.md and docs/*.md resolves.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

use std::{
    collections::{BTreeMap, BTreeSet},
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
/// `fleet_size` takes the same bounds; the allocator's is unset by default, so it uses
/// each host's own (reported) rather than a second copy of the number.
#[test]
fn shared_timings_take_the_same_ranges() {
    use limiter_allocator::config as allocator;
    use limiter_user::config::schema as daemon;
    assert_eq!(daemon::FLEET_SIZE.kind, allocator::FLEET_SIZE.kind);
    assert!(
        matches!(
            allocator::FLEET_SIZE.absent,
            limiter_config::Absent::Unset(_)
        ),
        "the allocator's fleet_size has a default of its own: {:?}",
        allocator::FLEET_SIZE.absent
    );
    let pairs: [(&Key, &Key); 2] = [
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

/// The docs checked for links: README.md and every docs/*.md.
fn doc_files() -> Vec<PathBuf> {
    let mut files = vec![root().join("README.md")];
    let mut docs: Vec<PathBuf> = fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

/// Lines outside fenced code blocks, numbered from 1.
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push((i + 1, line));
        }
    }
    out
}

/// The heading anchors GitHub gives a Markdown file: the heading's text lowercased, every
/// character but letters, digits, `-`, `_` and spaces dropped, spaces made `-`; a repeated
/// slug gets `-1`, `-2`, ...
pub fn heading_anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut anchors = BTreeSet::new();
    for (_, line) in prose_lines(text) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if hashes == 0 || hashes > 6 || !line[hashes..].starts_with(' ') {
            continue;
        }
        let slug = slug(&rendered(line[hashes..].trim()));
        let n = seen.entry(slug.clone()).or_insert(0);
        anchors.insert(if *n == 0 {
            slug.clone()
        } else {
            format!("{slug}-{n}")
        });
        *n += 1;
    }
    anchors
}

/// A heading's text as rendered: code spans' backticks and links' targets gone.
fn rendered(heading: &str) -> String {
    let mut out = String::new();
    let mut rest = heading;
    while let Some(start) = rest.find('[') {
        out.push_str(&rest[..start]);
        let after = &rest[start + 1..];
        match after
            .find("](")
            .and_then(|mid| after[mid..].find(')').map(|end| (mid, mid + end)))
        {
            Some((mid, end)) => {
                out.push_str(&after[..mid]);
                rest = &after[end + 1..];
            }
            None => {
                out.push('[');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out.replace('`', "")
}

fn slug(text: &str) -> String {
    text.to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The inline links `[text](target)` of a line, code spans left out.
fn links(line: &str) -> Vec<String> {
    let prose: String = line
        .split('`')
        .enumerate()
        .filter(|(i, _)| i % 2 == 0)
        .map(|(_, part)| part)
        .collect::<Vec<_>>()
        .join(" ");
    let mut found = Vec::new();
    let mut rest = prose.as_str();
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let Some(end) = after.find(')') else { break };
        let target = after[..end].split_whitespace().next().unwrap_or("");
        found.push(target.to_string());
        rest = &after[end..];
    }
    found
}

/// What is wrong with the relative links of `file`, each as `FILE:LINE: ...`.
fn broken_links(file: &Path) -> Vec<String> {
    let text = fs::read_to_string(file).unwrap();
    let shown = file
        .strip_prefix(root())
        .unwrap_or(file)
        .display()
        .to_string();
    let mut broken = Vec::new();
    for (n, line) in prose_lines(&text) {
        for target in links(line) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) = target.split_once('#').unwrap_or((&target, ""));
            let dest = if path.is_empty() {
                file.to_path_buf()
            } else {
                file.parent().unwrap().join(path)
            };
            if !dest.exists() {
                broken.push(format!("{shown}:{n}: {target}: no file {path}"));
                continue;
            }
            if anchor.is_empty() {
                continue;
            }
            let anchors = heading_anchors(&fs::read_to_string(&dest).unwrap_or_default());
            if !anchors.contains(anchor) {
                broken.push(format!(
                    "{shown}:{n}: {target}: no heading #{anchor} in {}",
                    dest.strip_prefix(root()).unwrap_or(&dest).display()
                ));
            }
        }
    }
    broken
}

/// Every relative link of README.md and docs/*.md names a file that exists, and every
/// `#anchor` a heading of its target.
#[test]
fn every_relative_link_and_anchor_resolves() {
    let files = doc_files();
    assert!(files.len() > 2, "docs/ holds no Markdown: {files:?}");
    let broken: Vec<String> = files.iter().flat_map(|f| broken_links(f)).collect();
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

/// The checker itself: a missing file, a missing anchor and a link inside code are told
/// apart from good ones; slugs as GitHub makes them.
#[test]
fn the_link_checker_finds_what_is_broken() {
    assert_eq!(
        heading_anchors(
            "# A\n## Where it refuses: `xdp_share_fallback = \"tail-call\"`\n```\n# not\n```\n## A\n### [Link](x.md) & more\n"
        ),
        [
            "a",
            "a-1",
            "link--more",
            "where-it-refuses-xdp_share_fallback--tail-call"
        ]
        .map(String::from)
        .into()
    );
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("b.md"), "# Title\n## Two words\n").unwrap();
    let a = dir.path().join("a.md");
    fs::write(
        &a,
        "[ok](b.md#two-words) [ok](#here) [web](https://x.invalid/#y)\n# Here\n\
         [gone](c.md) [bad](b.md#nope) `[code](c.md)`\n```\n[fenced](d.md)\n```\n",
    )
    .unwrap();
    let broken = broken_links(&a);
    assert_eq!(broken.len(), 2, "{broken:?}");
    assert!(broken[0].ends_with(":3: c.md: no file c.md"), "{broken:?}");
    assert!(
        broken[1].contains(":3: b.md#nope: no heading #nope in"),
        "{broken:?}"
    );
}
