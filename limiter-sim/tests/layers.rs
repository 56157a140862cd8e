//! The simulator's modules import one another one way: no module reaches, directly or
//! through others, a module that imports it. A cycle (claims ↔ scenario was one) is
//! reported with the modules on it.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::Path,
};

/// Every `src/*.rs` module but the crate roots, with the crate modules it names.
fn imports() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut texts = BTreeMap::new();
    for entry in fs::read_dir(&src).unwrap_or_else(|e| panic!("{}: {e}", src.display())) {
        let path = entry
            .unwrap_or_else(|e| panic!("{}: {e}", src.display()))
            .path();
        let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
        if path.extension().is_some_and(|e| e == "rs") && stem != "lib" && stem != "main" {
            let text =
                fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            texts.insert(stem.to_string(), text);
        }
    }
    let names: Vec<String> = texts.keys().cloned().collect();
    texts
        .iter()
        .map(|(module, text)| {
            let named = names
                .iter()
                .filter(|m| *m != module && names_module(text, m))
                .cloned()
                .collect();
            (module.clone(), named)
        })
        .collect()
}

/// Whether `text` names module `m`: `crate::m` anywhere, or `m` as a path segment in a
/// `use crate::…;` statement.
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

/// A cycle through `at`, if one is reachable from it.
fn cycle_from(
    graph: &BTreeMap<String, BTreeSet<String>>,
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

fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|m| cycle_from(graph, m, &mut Vec::new(), &mut done))
}

#[test]
fn modules_import_one_way() {
    let graph = imports();
    // The scan sees the imports it must: report draws on claims, claims on scenario.
    assert!(graph["report"].contains("claims") && graph["claims"].contains("scenario"));
    if let Some(cycle) = find_cycle(&graph) {
        panic!("import cycle: {}", cycle.join(" → "));
    }
}

#[test]
fn the_cycle_finder_finds_a_cycle() {
    let edges = [("a", "b"), ("b", "c"), ("c", "a"), ("d", "a")];
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, to) in edges {
        graph.entry(from.into()).or_default().insert(to.into());
    }
    let cycle = find_cycle(&graph).unwrap_or_default();
    assert_eq!(cycle, ["a", "b", "c", "a"]);
    graph.entry("c".into()).or_default().remove("a");
    assert_eq!(find_cycle(&graph), None);
}
