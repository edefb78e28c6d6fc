//! The import graph of `src/`: no circle between the crate's top-level
//! modules, and the leaves stay leaves.
//!
//! Reads every `src/**/*.rs` (without comments and `#[cfg(test)]`
//! modules), takes each `crate::a::...` path (in `use` lines and inline,
//! grouped `crate::{a, b}` too) as an edge from the file's top-level module
//! to `a`, and fails on a cycle. `cargo test --test module_graph --
//! --nocapture` prints the graph.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Files that must import nothing from the crate (the recording side of
/// metrics: the read path calls it, so it may call nothing back).
const LEAVES: &[&str] = &[
    "src/metrics.rs",
    "src/units.rs",
    "src/epoch.rs",
    "src/concurrency.rs",
    "src/logging.rs",
    "src/private_dir.rs",
];

/// Modules that may import only these (observability knows the engine only
/// through the snapshot parts the engine fills).
const AT_MOST: &[(&str, &[&str])] = &[
    ("stats", &["units"]),
    ("metrics", &["stats", "units"]),
    // (locate: the `where` request names what it asks, `locate::Asked`.)
    ("control", &["locate", "logging", "prefetch", "sys"]),
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The top-level module a file belongs to (`src/cache/disk.rs` -> `cache`);
/// None for the binaries.
fn module_of(rel: &Path) -> Option<String> {
    let parts: Vec<String> = rel
        .iter()
        .map(|c| c.to_string_lossy().into_owned())
        .collect();
    match parts.as_slice() {
        [src, f] if src == "src" => match f.strip_suffix(".rs")? {
            "main" | "lib" => None,
            m => Some(m.to_owned()),
        },
        [src, bin, ..] if src == "src" && bin == "bin" => None,
        [src, dir, ..] if src == "src" => Some(dir.clone()),
        _ => None,
    }
}

/// The file's code without comments and without `#[cfg(test)] mod ...`
/// blocks (test code may import what the product must not).
fn product_code(text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let t = line.trim_start();
        if t.starts_with("#[cfg(test)]") {
            let next = lines.peek().map(|l| l.trim_start()).unwrap_or("");
            if next.starts_with("mod ") || next.starts_with("pub mod ") {
                // Skip to the end of the block: braces balance.
                let mut depth = 0i32;
                let mut opened = false;
                for l in lines.by_ref() {
                    let code = l.split("//").next().unwrap_or("");
                    depth += code.matches('{').count() as i32;
                    depth -= code.matches('}').count() as i32;
                    opened |= code.contains('{');
                    if opened && depth <= 0 {
                        break;
                    }
                }
            }
            continue;
        }
        if t.starts_with("//") {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

fn ident(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// Top-level names inside a `{...}` group that starts at `s[0]`.
fn group_names(s: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut depth = 0;
    let mut item_start = true;
    for (i, c) in s.char_indices() {
        match c {
            '{' => {
                depth += 1;
                if depth == 1 {
                    item_start = true;
                    continue;
                }
            }
            '}' => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            ',' if depth == 1 => {
                item_start = true;
                continue;
            }
            _ => {}
        }
        if depth == 1 && item_start && !c.is_whitespace() {
            item_start = false;
            let n = ident(&s[i..]);
            if !n.is_empty() && n != "self" {
                names.push(n.to_owned());
            }
        }
    }
    names
}

/// The top-level modules this code names through `crate::`.
fn crate_refs(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        let before = rest[..i].chars().last();
        rest = &rest[i + "crate::".len()..];
        // `$crate::` in macros, or a longer identifier ending in "crate".
        if before.is_some_and(|c| c == '$' || c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        if rest.starts_with('{') {
            out.extend(group_names(rest));
        } else {
            let n = ident(rest);
            if !n.is_empty() {
                out.insert(n.to_owned());
            }
        }
    }
    out
}

struct Graph {
    /// module -> modules it imports (itself excluded)
    edges: BTreeMap<String, BTreeSet<String>>,
    /// files that import something from the crate -> what
    file_refs: BTreeMap<String, BTreeSet<String>>,
}

fn graph() -> Graph {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    files.sort();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut file_refs = BTreeMap::new();
    for f in files {
        let rel = f.strip_prefix(root).unwrap().to_owned();
        let text = std::fs::read_to_string(&f).unwrap();
        let refs = crate_refs(&product_code(&text));
        file_refs.insert(rel.display().to_string(), refs.clone());
        let Some(m) = module_of(&rel) else { continue };
        let e = edges.entry(m.clone()).or_default();
        e.extend(refs.into_iter().filter(|r| *r != m));
    }
    Graph { edges, file_refs }
}

/// Strongly connected components with more than one module (Tarjan).
fn cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct T<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        next: usize,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        t.index.insert(v, t.next);
        t.low.insert(v, t.next);
        t.next += 1;
        t.stack.push(v);
        t.on_stack.insert(v);
        let succ: Vec<&'a str> = t
            .edges
            .get(v)
            .map(|s| s.iter().map(String::as_str).collect())
            .unwrap_or_default();
        for w in succ {
            if !t.index.contains_key(w) {
                visit(t, w);
                let lw = t.low[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if t.on_stack.contains(w) {
                let iw = t.index[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = Vec::new();
            loop {
                let w = t.stack.pop().unwrap();
                t.on_stack.remove(w);
                comp.push(w.to_owned());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                t.out.push(comp);
            }
        }
    }
    let mut t = T {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !t.index.contains_key(v.as_str()) {
            visit(&mut t, v);
        }
    }
    t.out
}

/// A shortest circle through `from` inside `comp` (for the message).
fn circle(edges: &BTreeMap<String, BTreeSet<String>>, comp: &[String], from: &str) -> String {
    let inside: BTreeSet<&str> = comp.iter().map(String::as_str).collect();
    let mut prev: BTreeMap<&str, &str> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([from]);
    while let Some(v) = queue.pop_front() {
        for w in edges.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !inside.contains(w) || prev.contains_key(w) {
                continue;
            }
            prev.insert(w, v);
            if w == from {
                let mut path = vec![from];
                let mut cur = v;
                while cur != from {
                    path.push(cur);
                    cur = prev[cur];
                }
                path.push(from);
                path.reverse();
                return path.join(" -> ");
            }
            queue.push_back(w);
        }
    }
    String::new()
}

#[test]
fn no_import_circle_between_modules() {
    let g = graph();
    println!("module graph of src/ (top-level modules, product code):");
    for (m, to) in &g.edges {
        let to: Vec<&str> = to.iter().map(String::as_str).collect();
        println!("  {m} -> {}", to.join(", "));
    }
    let found = cycles(&g.edges);
    let msgs: Vec<String> = found
        .iter()
        .map(|c| format!("{{{}}}: e.g. {}", c.join(", "), circle(&g.edges, c, &c[0])))
        .collect();
    for m in &msgs {
        println!("CIRCLE {m}");
    }
    assert!(msgs.is_empty(), "import circles in src/: {msgs:#?}");
}

#[test]
fn leaves_import_nothing_from_the_crate() {
    let g = graph();
    for leaf in LEAVES {
        let refs = g
            .file_refs
            .get(*leaf)
            .unwrap_or_else(|| panic!("{leaf} is gone: update LEAVES"));
        assert!(refs.is_empty(), "{leaf} imports {refs:?} from the crate");
    }
}

#[test]
fn observability_and_the_command_line_keep_their_place() {
    let g = graph();
    for (m, allowed) in AT_MOST {
        let extra: Vec<&String> = g.edges[*m]
            .iter()
            .filter(|d| !allowed.contains(&d.as_str()))
            .collect();
        assert!(extra.is_empty(), "{m} imports {extra:?}");
    }
    // The command line sits on top: nothing in the library imports it.
    for (m, to) in &g.edges {
        assert!(m == "cli" || !to.contains("cli"), "{m} imports cli");
    }
}

#[test]
fn the_scanner_sees_every_form_of_path() {
    let code = product_code(
        "use crate::a::B;\nuse crate::{b, c::{D, E}, self};\n// crate::comment\n\
         fn f() { crate::d::g(); $crate::x; my_crate::y; }\n\
         #[cfg(test)]\nmod tests {\n    use crate::t;\n    fn f() { if x { } }\n}\n\
         fn h() -> crate::e::F { todo!() }\n",
    );
    let refs: Vec<String> = crate_refs(&code).into_iter().collect();
    assert_eq!(refs, ["a", "b", "c", "d", "e"]);
    let mut edges = BTreeMap::new();
    for (a, b) in [("x", "y"), ("y", "z"), ("z", "x"), ("z", "w")] {
        edges
            .entry(a.to_owned())
            .or_insert_with(BTreeSet::new)
            .insert(b.to_owned());
    }
    let c = cycles(&edges);
    assert_eq!(c, [vec!["x".to_owned(), "y".into(), "z".into()]]);
    assert_eq!(circle(&edges, &c[0], "x"), "x -> y -> z -> x");
}
