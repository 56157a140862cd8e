//! The tree reads bottom-up. In every crate of the workspace no module reaches, directly
//! or through others, a module that imports it (nor, inside a directory module such as
//! limiter-user's `config/`, a submodule a sibling that imports it); and limiter-user's modules keep to the
//! layers its lib.rs lists (an import goes to the module's own layer or one below).
//!
//! The scan is textual, like a reader's: a module names another when its code writes
//! `crate::other::…`, or `other` inside a `use crate::{…};` statement. Test modules
//! count (a low module whose tests need a high one reads as depending on it); comments
//! and doc links do not (a doc may point anywhere).

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
};

type Graph = BTreeMap<String, BTreeSet<String>>;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap_or_else(|| panic!("{} has no parent", env!("CARGO_MANIFEST_DIR")))
        .to_path_buf()
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The workspace's member directories, from its Cargo.toml's `members = [...]`.
fn members() -> Vec<PathBuf> {
    let root = workspace();
    let manifest = read(&root.join("Cargo.toml"));
    let list = manifest
        .split_once("\nmembers = [")
        .and_then(|(_, rest)| rest.split_once(']'))
        .map(|(list, _)| list)
        .unwrap_or_else(|| panic!("no `members = [...]` in the workspace Cargo.toml"));
    list.split('"')
        .skip(1)
        .step_by(2)
        .map(|m| root.join(m))
        .collect()
}

/// The modules a crate root declares (`mod x;`, `pub mod x;`, `pub(crate) mod x;`).
fn declared_modules(root_text: &str) -> Vec<String> {
    root_text
        .lines()
        .filter_map(|line| {
            let line = line.trim_start();
            let rest = line
                .strip_prefix("pub mod ")
                .or_else(|| line.strip_prefix("pub(crate) mod "))
                .or_else(|| line.strip_prefix("mod "))?;
            let name = rest.strip_suffix(';')?;
            name.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_')
                .then(|| name.to_string())
        })
        .collect()
}

/// A module's source: `m.rs` and everything under `m/`, or `m/mod.rs` and its siblings.
fn module_text(src: &Path, m: &str) -> String {
    let mut text = String::new();
    let file = src.join(format!("{m}.rs"));
    if file.exists() {
        text += &read(&file);
    }
    let mut dirs = vec![src.join(m)];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries {
            let path = entry
                .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
                .path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                text += &read(&path);
            }
        }
    }
    assert!(
        !text.is_empty(),
        "module {m}: no {m}.rs or {m}/ under {}",
        src.display()
    );
    text
}

/// Whether `text` names module `m`: `crate::m::` or `crate::m;` anywhere, or `m` as a
/// path segment of a `use crate::…;` statement.
fn names_module(text: &str, m: &str) -> bool {
    if text.contains(&format!("crate::{m}::")) || text.contains(&format!("crate::{m};")) {
        return true;
    }
    text.split("use crate::").skip(1).any(|rest| {
        let statement = rest.split(';').next().unwrap_or("");
        statement
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .any(|word| word == m)
    })
}

/// `text` without its comment lines.
fn code_only(text: &str) -> String {
    text.lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The import graph of the crate rooted at `root` (lib.rs or main.rs).
fn graph_of(root: &Path) -> Graph {
    let src = root
        .parent()
        .unwrap_or_else(|| panic!("{}", root.display()));
    let modules = declared_modules(&read(root));
    let texts: BTreeMap<&str, String> = modules
        .iter()
        .map(|m| (m.as_str(), code_only(&module_text(src, m))))
        .collect();
    texts
        .iter()
        .map(|(module, text)| {
            let named = modules
                .iter()
                .filter(|m| m.as_str() != *module && names_module(text, m))
                .cloned()
                .collect();
            (module.to_string(), named)
        })
        .collect()
}

/// The import graph among the submodules of the directory module `m/` of the crate
/// whose source is `src` (declared in `m/mod.rs`): a submodule names a sibling by
/// `super::sibling`, in a `use super::{…};` statement, or by `crate::m::sibling`.
/// `None` when `m` is a file module.
fn submodule_graph(src: &Path, m: &str) -> Option<Graph> {
    let dir = src.join(m);
    let root = dir.join("mod.rs");
    if !root.exists() {
        return None;
    }
    let modules = declared_modules(&read(&root));
    let texts: BTreeMap<&str, String> = modules
        .iter()
        .map(|s| (s.as_str(), code_only(&module_text(&dir, s))))
        .collect();
    let names_sibling = |text: &str, s: &str| {
        let as_crate = text.replace(&format!("crate::{m}::"), "super::");
        as_crate.contains(&format!("super::{s}::"))
            || as_crate.contains(&format!("super::{s};"))
            || as_crate.split("use super::").skip(1).any(|rest| {
                rest.split(';')
                    .next()
                    .unwrap_or("")
                    .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .any(|word| word == s)
            })
    };
    Some(
        texts
            .iter()
            .map(|(module, text)| {
                let named = modules
                    .iter()
                    .filter(|s| s.as_str() != *module && names_sibling(text, s))
                    .cloned()
                    .collect();
                (module.to_string(), named)
            })
            .collect(),
    )
}

/// A cycle through `at`, if one is reachable from it.
fn cycle_from(
    graph: &Graph,
    at: &str,
    path: &mut Vec<String>,
    done: &mut BTreeSet<String>,
) -> Option<Vec<String>> {
    if let Some(i) = path.iter().position(|m| m == at) {
        let mut cycle = path[i..].to_vec();
        cycle.push(at.to_string());
        return Some(cycle);
    }
    if done.contains(at) {
        return None;
    }
    path.push(at.to_string());
    for next in graph.get(at).into_iter().flatten() {
        if let Some(c) = cycle_from(graph, next, path, done) {
            return Some(c);
        }
    }
    path.pop();
    done.insert(at.to_string());
    None
}

fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|m| cycle_from(graph, m, &mut Vec::new(), &mut done))
}

/// The layers a crate root's opening comment lists: items `//! N. …` (continued on
/// indented `//!` lines), each naming its modules in backticks.
fn listed_layers(root_text: &str) -> Vec<BTreeSet<String>> {
    let mut layers: Vec<BTreeSet<String>> = Vec::new();
    for line in root_text.lines().map_while(|l| l.strip_prefix("//!")) {
        let body = line.trim_start();
        let starts = body
            .split_once(". ")
            .is_some_and(|(n, _)| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()));
        if starts {
            layers.push(BTreeSet::new());
        } else if !line.starts_with("    ") || body.is_empty() {
            continue;
        }
        let Some(layer) = layers.last_mut() else {
            continue;
        };
        layer.extend(body.split('`').skip(1).step_by(2).map(str::to_string));
    }
    layers
}

/// Every import that goes up a layer, and every module no layer places.
fn layer_violations(graph: &Graph, layers: &[BTreeSet<String>]) -> Vec<String> {
    let layer_of = |m: &str| layers.iter().position(|l| l.contains(m));
    let mut problems = Vec::new();
    for (module, imports) in graph {
        let Some(own) = layer_of(module) else {
            problems.push(format!("module {module} is in no layer"));
            continue;
        };
        for import in imports {
            match layer_of(import) {
                Some(theirs) if theirs > own => problems.push(format!(
                    "{module} (layer {}) imports {import} (layer {})",
                    own + 1,
                    theirs + 1
                )),
                _ => {}
            }
        }
    }
    for listed in layers.iter().flatten() {
        if !graph.contains_key(listed) {
            problems.push(format!("the layers list {listed}, which is not a module"));
        }
    }
    problems
}

#[test]
fn no_crate_has_an_import_cycle() {
    let mut scanned = Vec::new();
    for member in members() {
        for root in ["src/lib.rs", "src/main.rs"] {
            let root = member.join(root);
            if !root.exists() {
                continue;
            }
            let graph = graph_of(&root);
            if let Some(cycle) = find_cycle(&graph) {
                panic!("{}: import cycle: {}", root.display(), cycle.join(" → "));
            }
            // One level down: the submodules of a directory module among themselves.
            let src = member.join("src");
            for m in graph.keys() {
                let Some(inner) = submodule_graph(&src, m) else {
                    continue;
                };
                if let Some(cycle) = find_cycle(&inner) {
                    panic!(
                        "{}: import cycle inside {m}/: {}",
                        root.display(),
                        cycle.join(" → ")
                    );
                }
                scanned.push((src.join(m).join("mod.rs"), inner));
            }
            scanned.push((root, graph));
        }
    }
    // The scan sees the imports it must: the simulator's report draws on its claims, the
    // daemon on its maps.
    let sees = |crate_root: &str, from: &str, to: &str| {
        scanned.iter().any(|(root, graph)| {
            root.ends_with(crate_root) && graph.get(from).is_some_and(|g| g.contains(to))
        })
    };
    assert!(sees("limiter-sim/src/lib.rs", "report", "claims"));
    assert!(sees("limiter-user/src/lib.rs", "daemon", "maps"));
    // And inside a directory module: the config's checker reads its types.
    assert!(sees("limiter-user/src/config/mod.rs", "check", "types"));
}

#[test]
fn limiter_user_keeps_to_its_layers() {
    let root = workspace().join("limiter-user/src/lib.rs");
    let layers = listed_layers(&read(&root));
    assert!(layers.len() >= 3, "{}: no layer list found", root.display());
    let problems = layer_violations(&graph_of(&root), &layers);
    assert!(
        problems.is_empty(),
        "{} lists the layers; the code says:\n  {}",
        root.display(),
        problems.join("\n  ")
    );
}

/// The modules limiter-user's layer list calls pure: they compute, and the daemon does
/// the I/O (maps, files, logs) with what they return.
const PURE: [&str; 4] = ["fleet", "reload_plan", "ruleset", "sketch_regions"];

#[test]
fn limiter_users_pure_modules_do_no_io() {
    let src = workspace().join("limiter-user/src");
    for m in PURE {
        let code = code_only(&module_text(&src, m));
        for io in [
            "tracing::",
            "fs::",
            "aya::",
            "tokio::",
            "Maps",
            "monotonic_ns",
        ] {
            assert!(!code.contains(io), "{m}, listed as pure, uses {io}");
        }
    }
}

fn graph(edges: &[(&str, &str)]) -> Graph {
    let mut graph = Graph::new();
    for (from, to) in edges {
        graph
            .entry(from.to_string())
            .or_default()
            .insert(to.to_string());
        graph.entry(to.to_string()).or_default();
    }
    graph
}

#[test]
fn the_cycle_finder_finds_a_cycle() {
    let mut g = graph(&[("a", "b"), ("b", "c"), ("c", "a"), ("d", "a")]);
    assert_eq!(find_cycle(&g).unwrap_or_default(), ["a", "b", "c", "a"]);
    g.entry("c".into()).or_default().remove("a");
    assert_eq!(find_cycle(&g), None);
}

#[test]
fn the_layer_check_finds_an_import_that_goes_up() {
    let text = "//! Intro.\n//!\n//! 1. Low: `a`,\n//!    `b`.\n//! 2. High: `c`.\n\npub mod a;\n";
    let layers = listed_layers(text);
    assert_eq!(layers.len(), 2);
    let ok = graph(&[("c", "a"), ("b", "a")]);
    assert_eq!(layer_violations(&ok, &layers), Vec::<String>::new());
    let up = graph(&[("c", "a"), ("b", "c")]);
    assert_eq!(
        layer_violations(&up, &layers),
        ["b (layer 1) imports c (layer 2)"]
    );
    let unplaced = graph(&[("c", "a"), ("b", "a"), ("d", "a")]);
    assert_eq!(
        layer_violations(&unplaced, &layers),
        ["module d is in no layer"]
    );
}

#[test]
fn declared_modules_are_read_from_the_root() {
    let root = "pub mod a;\nmod b;\npub(crate) mod c;\nmod tests {\n}\n// mod d;\n";
    assert_eq!(declared_modules(root), ["a", "b", "c"]);
}
