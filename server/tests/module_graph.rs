//! The modules of `server/src` import one way only: no module reaches back into one that
//! reaches it, file by file, and the top-level layers keep the order `lib.rs` documents.
//!
//! A module's references are every `crate::…` and `super::…` path in its code and comments
//! (an intra-doc link is a reference too), its `use` trees, and the modules it declares. Unit
//! test modules (`mod tests`, `tests.rs`) are left out: nothing imports them, so they cannot
//! close a cycle, and they may reach anything they test.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The top-level modules, each importing only from those after it. `testing` (test doubles)
/// sits above the layers it assembles.
const LAYERS: [&str; 7] = [
    "startup",
    "cli",
    "testing",
    "transport",
    "service",
    "scheduler",
    "metrics",
];

/// A module by its path from the crate root; the root is the empty path.
type Module = Vec<String>;

type Graph = BTreeMap<Module, BTreeSet<Module>>;

fn source_files(dir: &Path, files: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            source_files(&path, files);
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
}

/// The module a file holds; `None` for the binary and for test modules.
fn module_of(src: &Path, file: &Path) -> Option<Module> {
    let relative = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Module = relative
        .iter()
        .map(|part| part.to_string_lossy().into_owned())
        .collect();
    match parts.last().map(String::as_str) {
        Some("main" | "tests") => return None,
        Some("lib") if parts.len() == 1 => parts.clear(),
        Some("mod") => {
            parts.pop();
        }
        _ => {}
    }
    Some(parts)
}

/// `text` without its unit test modules: a `#[cfg(test)]` module with a body runs to the end
/// of the file in this crate, and a `mod tests;` line only declares one.
fn without_tests(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let mut kept = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim() == "#[cfg(test)]" {
            let next = lines.get(i + 1).map_or("", |l| l.trim());
            if next.contains("mod ") && next.ends_with('{') {
                break;
            }
            if next.contains("mod ") && next.ends_with(';') {
                i += 2;
                continue;
            }
        }
        kept.push(lines[i]);
        i += 1;
    }
    kept.join("\n")
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Every path that `use` statements in `text` bring in, groups expanded:
/// `use crate::a::{b, c::d};` gives `crate::a::b` and `crate::a::c::d`.
fn use_paths(text: &str) -> Vec<String> {
    let mut paths = Vec::new();
    let mut rest = text;
    while let Some(at) = find_use(rest) {
        let statement = &rest[at..];
        let end = statement.find(';').unwrap_or(statement.len());
        let tree = statement[4..end]
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        expand(&tree, "", &mut paths);
        rest = &statement[end..];
    }
    paths
}

/// Where the next `use ` statement starts (after `pub`, `pub(...)` or at a line's start).
fn find_use(text: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(found) = text[from..].find("use ") {
        let at = from + found;
        let before = text[..at].trim_end_matches(' ');
        let starts_item = before.is_empty()
            || before.ends_with('\n')
            || before.ends_with("pub")
            || before.ends_with(')') && before.contains("pub(");
        let in_comment = text[..at]
            .rsplit('\n')
            .next()
            .is_some_and(|line| line.contains("//"));
        if starts_item && !in_comment {
            return Some(at);
        }
        from = at + 4;
    }
    None
}

fn expand(tree: &str, prefix: &str, paths: &mut Vec<String>) {
    let tree = tree.trim();
    if tree.is_empty() {
        return;
    }
    let Some(open) = tree.find('{') else {
        let path = tree.split(" as ").next().unwrap_or(tree);
        paths.push(format!("{prefix}{path}"));
        return;
    };
    let head = format!("{prefix}{}", &tree[..open]);
    let inner = &tree[open + 1..tree.rfind('}').unwrap()];
    let mut depth = 0;
    let mut start = 0;
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                expand(&inner[start..i], &head, paths);
                start = i + 1;
            }
            _ => {}
        }
    }
    expand(&inner[start..], &head, paths);
}

/// Every `crate::…` and `super::…` path written in `text`, in code or comments.
fn written_paths(text: &str) -> Vec<String> {
    let mut paths = Vec::new();
    for root in ["crate::", "super::"] {
        let mut from = 0;
        while let Some(found) = text[from..].find(root) {
            let at = from + found;
            from = at + root.len();
            if text[..at].ends_with(is_ident) || text[..at].ends_with("::") {
                continue;
            }
            let mut end = at + root.len();
            loop {
                let segment = text[end..]
                    .find(|c: char| !is_ident(c))
                    .unwrap_or(text.len() - end);
                end += segment;
                if segment > 0
                    && text[end..].starts_with("::")
                    && text[end + 2..].starts_with(is_ident)
                {
                    end += 2;
                } else {
                    break;
                }
            }
            paths.push(text[at..end].to_string());
        }
    }
    paths
}

/// The module `path` names, written in `module`: the longest known module it starts with.
fn resolve(path: &str, module: &Module, modules: &BTreeSet<Module>) -> Option<Module> {
    let mut segments: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
    let mut base: Module = match segments.first() {
        Some(&"crate") => Vec::new(),
        Some(&"super") => module.clone(),
        Some(&"self") => module.clone(),
        // A path relative to `module`: one of its own child modules, or something else.
        Some(first) if modules.contains(&child(module, first)) => module.clone(),
        _ => return None,
    };
    while let Some(&first) = segments.first() {
        match first {
            "crate" | "self" => {}
            "super" => {
                base.pop();
            }
            _ => break,
        }
        segments.remove(0);
    }
    for segment in segments {
        let deeper = child(&base, segment);
        if !modules.contains(&deeper) {
            break;
        }
        base = deeper;
    }
    Some(base)
}

fn child(module: &Module, name: &str) -> Module {
    let mut path = module.clone();
    path.push(name.to_string());
    path
}

/// The file-level graph of `server/src`: an edge from each module to each one it references.
fn module_graph() -> Graph {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    source_files(&src, &mut files);
    let sources: BTreeMap<Module, String> = files
        .iter()
        .filter_map(|file| {
            let module = module_of(&src, file)?;
            Some((module, std::fs::read_to_string(file).unwrap()))
        })
        .collect();
    let modules: BTreeSet<Module> = sources.keys().cloned().collect();
    let mut graph = Graph::new();
    for (module, text) in &sources {
        let code = without_tests(text);
        let mut edges: BTreeSet<Module> = modules
            .iter()
            .filter(|m| m.len() == module.len() + 1 && m.starts_with(module))
            .cloned()
            .collect();
        for path in use_paths(&code).into_iter().chain(written_paths(&code)) {
            if let Some(target) = resolve(&path, module, &modules) {
                if &target != module {
                    edges.insert(target);
                }
            }
        }
        graph.insert(module.clone(), edges);
    }
    graph
}

/// The graph with each module replaced by its top-level module (`crate` for the root).
fn top_level(graph: &Graph) -> BTreeMap<String, BTreeSet<String>> {
    let name = |m: &Module| m.first().cloned().unwrap_or_else(|| "crate".into());
    let mut top: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, targets) in graph {
        let entry = top.entry(name(from)).or_default();
        for target in targets {
            if name(target) != name(from) {
                entry.insert(name(target));
            }
        }
    }
    top
}

/// A cycle of `graph`, if it has one, as the nodes along it.
fn find_cycle<N: Ord + Clone>(graph: &BTreeMap<N, BTreeSet<N>>) -> Option<Vec<N>> {
    fn visit<N: Ord + Clone>(
        node: &N,
        graph: &BTreeMap<N, BTreeSet<N>>,
        done: &mut BTreeSet<N>,
        path: &mut Vec<N>,
    ) -> Option<Vec<N>> {
        if let Some(start) = path.iter().position(|n| n == node) {
            let mut cycle = path[start..].to_vec();
            cycle.push(node.clone());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.clone());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, done, path) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.clone());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut done, &mut Vec::new()))
}

fn show(module: &Module) -> String {
    if module.is_empty() {
        "crate".into()
    } else {
        module.join("::")
    }
}

#[test]
fn no_module_imports_back_from_one_that_imports_it() {
    let graph = module_graph();
    for (from, targets) in &graph {
        let targets: Vec<String> = targets.iter().map(show).collect();
        eprintln!("{} -> {}", show(from), targets.join(", "));
    }
    if let Some(cycle) = find_cycle(&graph) {
        let cycle: Vec<String> = cycle.iter().map(show).collect();
        panic!("modules import each other: {}", cycle.join(" -> "));
    }
    let top = top_level(&graph);
    if let Some(cycle) = find_cycle(&top) {
        panic!(
            "top-level modules import each other: {}",
            cycle.join(" -> ")
        );
    }
}

#[test]
fn the_top_level_modules_import_only_the_layers_below_them() {
    let top = top_level(&module_graph());
    for (from, targets) in &top {
        eprintln!(
            "{from} -> {}",
            targets.iter().cloned().collect::<Vec<_>>().join(", ")
        );
        if from == "crate" {
            continue;
        }
        let rank = |name: &str| {
            LAYERS
                .iter()
                .position(|layer| *layer == name)
                .unwrap_or_else(|| panic!("`{name}` is not in LAYERS: place it among the layers"))
        };
        for target in targets {
            assert!(
                target != "crate",
                "`{from}` reaches into the crate root: name the module instead"
            );
            assert!(
                rank(target) > rank(from),
                "`{from}` imports `{target}`, a layer above it ({LAYERS:?})"
            );
        }
    }
}

#[test]
fn the_check_sees_use_trees_paths_and_cycles() {
    let text = "use crate::a::{b, c::{d, e as f}};\npub(crate) use super::g;\n\
                // use crate::not_code;\nlet x = crate::h::i();\n/// [`crate::j`]\n";
    assert_eq!(
        use_paths(text),
        [
            "crate::a::b",
            "crate::a::c::d",
            "crate::a::c::e",
            "super::g"
        ]
    );
    assert!(written_paths(text).contains(&"crate::h::i".to_string()));
    assert!(written_paths(text).contains(&"crate::j".to_string()));
    let code = without_tests("fn a() {}\n#[cfg(test)]\nmod tests {\n    use crate::x;\n}\n");
    assert!(!code.contains("crate::x"));

    let modules: BTreeSet<Module> = [vec!["a".into()], vec!["a".into(), "b".into()]].into();
    let in_b = vec!["a".to_string(), "b".to_string()];
    assert_eq!(
        resolve("super::Thing", &in_b, &modules),
        Some(vec!["a".into()])
    );
    assert_eq!(
        resolve("crate::a::b::Thing", &in_b, &modules),
        Some(in_b.clone())
    );
    assert_eq!(resolve("b::Thing", &vec!["a".into()], &modules), Some(in_b));
    assert_eq!(resolve("std::sync::Arc", &vec!["a".into()], &modules), None);

    let acyclic: BTreeMap<u8, BTreeSet<u8>> =
        [(1, [2].into()), (2, [3].into()), (3, [].into())].into();
    assert_eq!(find_cycle(&acyclic), None);
    let cyclic: BTreeMap<u8, BTreeSet<u8>> =
        [(1, [2].into()), (2, [3].into()), (3, [1].into())].into();
    assert_eq!(find_cycle(&cyclic), Some(vec![1, 2, 3, 1]));
}
