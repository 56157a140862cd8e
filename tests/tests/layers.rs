//! The tree reads bottom-up. In every crate of the workspace no module reaches, directly
//! or through others, a module that imports it (nor, inside a directory module such as
//! limiter-user's `config/` or `observe/monitor/`, at any depth, a submodule a sibling
//! that imports it); and limiter-user's top-level modules, its folders by layer, keep to
//! the order its lib.rs declares them in (an import goes to the module itself or to one
//! declared above it).
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

/// The import graph among the submodules of the directory module at `path` (its
/// segments below the crate root, declared in `path/mod.rs`) of the crate whose source
/// is `src`: a submodule names a sibling by `super::sibling`, in a `use super::{…};`
/// statement, or by `crate::path::sibling`. `None` when the module is a file module.
fn submodule_graph(src: &Path, path: &[String]) -> Option<Graph> {
    let dir = path.iter().fold(src.to_path_buf(), |d, s| d.join(s));
    let root = dir.join("mod.rs");
    if !root.exists() {
        return None;
    }
    let modules = declared_modules(&read(&root));
    let texts: BTreeMap<&str, String> = modules
        .iter()
        .map(|s| (s.as_str(), code_only(&module_text(&dir, s))))
        .collect();
    let in_crate = format!("crate::{}::", path.join("::"));
    let names_sibling = |text: &str, s: &str| {
        let as_crate = text.replace(&in_crate, "super::");
        as_crate.contains(&format!("super::{s}::"))
            || as_crate.contains(&format!("super::{s};"))
            || as_crate.split("use super::").skip(1).any(|rest| {
                rest.split(';')
                    .next()
                    .unwrap_or("")
                    .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .any(|word| word == s)
            })
            || use_crate_paths(text).iter().any(|p| {
                p.strip_prefix(&in_crate)
                    .is_some_and(|p| p == s || p.starts_with(&format!("{s}::")))
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

/// The paths every `use crate::…;` statement of `text` imports, its groups expanded:
/// `use crate::{a::{b, c}, d};` gives `crate::a::b`, `crate::a::c` and `crate::d`.
fn use_crate_paths(text: &str) -> Vec<String> {
    fn expand(prefix: &str, tree: &str, out: &mut Vec<String>) {
        let tree = tree.trim();
        match tree.split_once('{') {
            Some((head, rest)) if rest.ends_with('}') => {
                let inner = &rest[..rest.len() - 1];
                let (mut depth, mut start) = (0, 0);
                for (i, c) in inner.char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => depth -= 1,
                        ',' if depth == 0 => {
                            expand(&format!("{prefix}{head}"), &inner[start..i], out);
                            start = i + 1;
                        }
                        _ => {}
                    }
                }
                expand(&format!("{prefix}{head}"), &inner[start..], out);
            }
            _ if !tree.is_empty() => out.push(format!("{prefix}{tree}")),
            _ => {}
        }
    }
    let mut out = Vec::new();
    for rest in text.split("use crate::").skip(1) {
        let statement: String = rest
            .split(';')
            .next()
            .unwrap_or("")
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect();
        expand("crate::", &statement, &mut out);
    }
    out
}

/// Every directory module under `path` (itself included when it is one), each with the
/// import graph among its submodules.
fn directory_graphs(src: &Path, path: Vec<String>, out: &mut Vec<(Vec<String>, Graph)>) {
    let Some(graph) = submodule_graph(src, &path) else {
        return;
    };
    for m in graph.keys() {
        let mut inner = path.clone();
        inner.push(m.clone());
        directory_graphs(src, inner, out);
    }
    out.push((path, graph));
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

/// Every import of a module declared later than the importer (`order` is the crate
/// root's declaration order), and every module the order does not place.
fn order_violations(graph: &Graph, order: &[String]) -> Vec<String> {
    let place = |m: &str| order.iter().position(|o| o == m);
    let mut problems = Vec::new();
    for (module, imports) in graph {
        let Some(own) = place(module) else {
            problems.push(format!("module {module} is not declared"));
            continue;
        };
        for import in imports {
            if let Some(theirs) = place(import).filter(|&theirs| theirs > own) {
                problems.push(format!(
                    "{module} (declared {}.) imports {import} (declared {}.)",
                    own + 1,
                    theirs + 1
                ));
            }
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
            // Every level down: the submodules of a directory module among themselves.
            let src = member.join("src");
            let mut inner = Vec::new();
            for m in graph.keys() {
                directory_graphs(&src, vec![m.clone()], &mut inner);
            }
            for (path, inner) in inner {
                let dir = path.join("/");
                if let Some(cycle) = find_cycle(&inner) {
                    panic!(
                        "{}: import cycle inside {dir}/: {}",
                        root.display(),
                        cycle.join(" → ")
                    );
                }
                scanned.push((src.join(&dir).join("mod.rs"), inner));
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
    assert!(sees("limiter-user/src/lib.rs", "daemon", "bpf"));
    // And inside a directory module: the config's checker reads its types; two levels
    // down, the monitor's formats read its events.
    assert!(sees("limiter-user/src/config/mod.rs", "check", "types"));
    assert!(sees(
        "limiter-user/src/attach/mod.rs",
        "teardown",
        "takeover"
    ));
    assert!(sees(
        "limiter-user/src/observe/monitor/mod.rs",
        "format",
        "event"
    ));
}

#[test]
fn limiter_user_keeps_to_its_layers() {
    let root = workspace().join("limiter-user/src/lib.rs");
    let order = declared_modules(&read(&root));
    assert!(
        order.len() >= 5,
        "{}: declares {} modules; its folders by layer are gone",
        root.display(),
        order.len()
    );
    let graph = graph_of(&root);
    for m in &order {
        assert!(
            submodule_graph(&root.with_file_name(""), std::slice::from_ref(m)).is_some()
                || m == "error",
            "{}: {m} is a file; each layer is a folder (m/mod.rs)",
            root.display()
        );
    }
    let problems = order_violations(&graph, &order);
    assert!(
        problems.is_empty(),
        "{} declares the layers in order; the code says:\n  {}",
        root.display(),
        problems.join("\n  ")
    );
}

/// limiter-user's pure layer: its modules compute, and the daemon does the I/O (maps,
/// files, logs) with what they return.
const PURE: &str = "policy";

#[test]
fn limiter_users_pure_layer_does_no_io() {
    let src = workspace().join("limiter-user/src");
    let code = code_only(&module_text(&src, PURE));
    for io in [
        "tracing::",
        "fs::",
        "aya::",
        "tokio::",
        "Maps",
        "monotonic_ns",
    ] {
        if let Some(line) = code.lines().find(|l| l.contains(io)) {
            panic!("{PURE}/, the pure layer, uses {io}: {}", line.trim());
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
fn the_order_check_finds_an_import_that_goes_down_the_list() {
    let order: Vec<String> = ["a", "b", "c"].map(String::from).into();
    let ok = graph(&[("c", "a"), ("b", "a")]);
    assert_eq!(order_violations(&ok, &order), Vec::<String>::new());
    let down = graph(&[("c", "a"), ("a", "c")]);
    assert_eq!(
        order_violations(&down, &order),
        ["a (declared 1.) imports c (declared 3.)"]
    );
    let unplaced = graph(&[("c", "a"), ("b", "a"), ("d", "a")]);
    assert_eq!(
        order_violations(&unplaced, &order),
        ["module d is not declared"]
    );
}

#[test]
fn use_statements_are_expanded() {
    let text = "use crate::{\n    a::{b, c::{d, e}},\n    f,\n};\nuse crate::g::h;\n";
    assert_eq!(
        use_crate_paths(text),
        [
            "crate::a::b",
            "crate::a::c::d",
            "crate::a::c::e",
            "crate::f",
            "crate::g::h"
        ]
    );
}

#[test]
fn declared_modules_are_read_from_the_root() {
    let root = "pub mod a;\nmod b;\npub(crate) mod c;\nmod tests {\n}\n// mod d;\n";
    assert_eq!(declared_modules(root), ["a", "b", "c"]);
}
