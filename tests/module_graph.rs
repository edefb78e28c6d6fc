//! The import graph of `src/`: no circle at any depth (between the
//! subsystems at the root, between the modules of each folder), the
//! subsystems in their layers, the leaves stay leaves, and clap only in the
//! command line; the test kit (src/testing) stays out of the product; and
//! no product function longer than [`MAX_FN_LINES`].
//!
//! Reads every `src/**/*.rs` (without comments and `#[cfg(test)]`
//! modules), takes each `crate::a::b::...`, `super::...` and `self::...`
//! path (in `use` lines and inline, grouped `crate::{a, b}` too) and
//! resolves it to the deepest module it names. A file in module `x::y::z`
//! naming module `x::w::v` is an edge `y -> w` inside folder `x`: each
//! folder's graph must be free of circles (a parent's `mod.rs` is the
//! folder's shared vocabulary: its children may use it, and it is no node).
//! `cargo test --test module_graph -- --nocapture` prints the graphs.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Files that must import nothing from the crate (the recording side of
/// metrics: the read path calls it, so it may call nothing back).
const LEAVES: &[&str] = &[
    "src/obs/metrics/mod.rs",
    "src/sys/units.rs",
    "src/meta/epoch.rs",
    "src/read/concurrency.rs",
    "src/obs/logging.rs",
    "src/sys/private_dir.rs",
    "src/sys/shm.rs",
];

/// The subsystems from the ground up: each may import only those before it
/// (docs/architecture.md draws them). `cache` and `meta` share a layer:
/// neither imports the other.
const LAYERS: &[&[&str]] = &[
    &["sys"],
    &["obs"],
    &["source"],
    &["cache", "meta"],
    &["read"],
    &["peer"],
    &["fs"],
    &["mount"],
    &["cli"],
];

/// Modules that may import only these (observability knows the engine only
/// through the snapshot parts the engine fills).
const AT_MOST: &[(&str, &[&str])] = &[
    ("obs::stats", &["sys::units"]),
    ("obs::metrics", &["obs::stats", "sys::units"]),
    // (locate: the `where` request names what it asks, `locate::Asked`;
    // `fs` names the control xattr.)
    (
        "mount::control",
        &[
            "fs",
            "obs::logging",
            "peer::locate",
            "peer",
            "read::prefetch",
            "sys",
        ],
    ),
];

/// The test kit's fakes (src/testing): compiled into tests only, outside
/// the layers. It may import the subsystems it fakes; nothing in the
/// product may import it.
const KIT: &str = "testing";
const KIT_FAKES: &[&str] = &["source", "cache"];

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

/// The module a file is (`src/cache/disk/mod.rs` -> `cache::disk`,
/// `src/read/reader.rs` -> `read::reader`); None for lib.rs and the
/// binaries.
fn module_of(rel: &Path) -> Option<Vec<String>> {
    let parts: Vec<String> = rel
        .iter()
        .map(|c| c.to_string_lossy().into_owned())
        .collect();
    let (first, rest) = parts.split_first()?;
    if first != "src" || rest.first().is_some_and(|d| d == "bin") {
        return None;
    }
    let mut m = rest.to_vec();
    let last = m.pop()?;
    match last.strip_suffix(".rs")? {
        "mod" => {}
        // (the binary's root, src/cli/main.rs, is no module of the library)
        "main" => return None,
        "lib" if m.is_empty() => return None,
        stem => m.push(stem.to_owned()),
    }
    (!m.is_empty()).then_some(m)
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

/// The paths of a use tree (`a::b`, `a::{b, c::{d, self}}`, `a::*`) that
/// starts at `s`, below `base`: `self` is the path so far, `super` its
/// parent.
fn tree(s: &str, base: Vec<String>, out: &mut Vec<Vec<String>>) {
    let s = s.trim_start();
    if let Some(inner) = s.strip_prefix('{') {
        let (mut depth, mut start) = (1, 0);
        for (i, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        tree(&inner[start..i], base, out);
                        return;
                    }
                }
                ',' if depth == 1 => {
                    tree(&inner[start..i], base.clone(), out);
                    start = i + 1;
                }
                _ => {}
            }
        }
        return;
    }
    let id = ident(s);
    let mut base = base;
    match id {
        // `*`, or the end of a group's item.
        "" => {
            out.push(base);
            return;
        }
        "self" => {}
        "super" => {
            base.pop();
        }
        _ => base.push(id.to_owned()),
    }
    match s[id.len()..].strip_prefix("::") {
        Some(rest) => tree(rest, base, out),
        None => out.push(base),
    }
}

/// Every path this code names from the crate, made absolute: `crate::...`,
/// and `super::...` / `self::...` from module `here`.
fn crate_paths(code: &str, here: &[String]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for (i, _) in code.match_indices("::") {
        let head_start = code[..i]
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .map_or(0, |j| j + 1);
        let head = &code[head_start..i];
        let before = code[..head_start].chars().last();
        // `$crate::` in macros; the second `super` of `super::super::`.
        if before.is_some_and(|c| c == '$' || c == ':') {
            continue;
        }
        let base = match head {
            "crate" => Vec::new(),
            "self" => here.to_vec(),
            "super" => here[..here.len().saturating_sub(1)].to_vec(),
            _ => continue,
        };
        tree(&code[i + 2..], base, &mut out);
    }
    out
}

/// The top-level modules this code names through `crate::`.
fn crate_refs(code: &str) -> BTreeSet<String> {
    crate_paths(code, &[])
        .into_iter()
        .filter_map(|p| p.first().cloned())
        .collect()
}

struct Graph {
    /// folder ("" for `src/`) -> its modules -> the modules of the same
    /// folder they import
    folders: BTreeMap<String, BTreeMap<String, BTreeSet<String>>>,
    /// file -> the modules it imports from the crate (each path cut to the
    /// deepest module it names; its own module left out)
    file_refs: BTreeMap<String, BTreeSet<String>>,
    /// file -> its module (`read::reader`)
    file_module: BTreeMap<String, String>,
}

fn graph() -> Graph {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    files.sort();
    let rels: Vec<PathBuf> = files
        .iter()
        .map(|f| f.strip_prefix(root).unwrap().to_owned())
        .collect();
    let modules: BTreeSet<Vec<String>> = rels.iter().filter_map(|r| module_of(r)).collect();
    let mut g = Graph {
        folders: BTreeMap::new(),
        file_refs: BTreeMap::new(),
        file_module: BTreeMap::new(),
    };
    for (f, rel) in files.iter().zip(&rels) {
        let text = std::fs::read_to_string(f).unwrap();
        let here = module_of(rel).unwrap_or_default();
        let mut refs = BTreeSet::new();
        // The kit is no part of the product's graph (its own test below).
        let kit = here.first().is_some_and(|m| m == KIT);
        for mut p in crate_paths(&product_code(&text), &here) {
            // Cut to the deepest module (`cache::disk::DiskCache` ->
            // `cache::disk`); an item of lib.rs names none.
            while !p.is_empty() && !modules.contains(&p) {
                p.pop();
            }
            if p.is_empty() || p == here {
                continue;
            }
            refs.insert(p.join("::"));
            if here.is_empty() || kit || p[0] == KIT {
                continue;
            }
            let c = here.iter().zip(&p).take_while(|(a, b)| a == b).count();
            if c < here.len() && c < p.len() {
                g.folders
                    .entry(here[..c].join("::"))
                    .or_default()
                    .entry(here[c].clone())
                    .or_default()
                    .insert(p[c].clone());
            }
        }
        if !here.is_empty() && !kit {
            for c in 0..here.len() {
                g.folders
                    .entry(here[..c].join("::"))
                    .or_default()
                    .entry(here[c].clone())
                    .or_default();
            }
        }
        let key = rel.display().to_string();
        g.file_module.insert(key.clone(), here.join("::"));
        g.file_refs.insert(key, refs);
    }
    g
}

/// Whether module `m` is `prefix` or inside it.
fn under(m: &str, prefix: &str) -> bool {
    m == prefix || m.starts_with(&format!("{prefix}::"))
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
fn no_import_circle_at_any_depth() {
    let g = graph();
    let mut msgs = Vec::new();
    for (folder, edges) in &g.folders {
        let name = if folder.is_empty() { "src" } else { folder };
        println!("{name}:");
        for (m, to) in edges {
            let to: Vec<&str> = to.iter().map(String::as_str).collect();
            println!("  {m} -> {}", to.join(", "));
        }
        for c in cycles(edges) {
            msgs.push(format!(
                "in {name}: {{{}}}: e.g. {}",
                c.join(", "),
                circle(edges, &c, &c[0])
            ));
        }
    }
    for m in &msgs {
        println!("CIRCLE {m}");
    }
    assert!(msgs.is_empty(), "import circles in src/: {msgs:#?}");
}

#[test]
fn the_subsystems_keep_their_layers() {
    let g = graph();
    let top = &g.folders[""];
    let layer_of = |m: &str| LAYERS.iter().position(|l| l.contains(&m));
    for m in top.keys() {
        assert!(
            layer_of(m).is_some(),
            "src/{m} is in no layer: add it to LAYERS and docs/architecture.md"
        );
    }
    assert!(top.len() <= 10, "{} subsystems at the root", top.len());
    // A newcomer meets at most a dozen entries at the root of src/.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let entries: Vec<String> = std::fs::read_dir(&root)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        entries.len() <= 12,
        "{} entries at the root of src/: {entries:?}",
        entries.len()
    );
    for (m, to) in top {
        let lm = layer_of(m).unwrap();
        for t in to {
            let lt = layer_of(t).unwrap();
            assert!(lt < lm, "{m} imports {t}, which is not below it");
        }
    }
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
        let mut seen = false;
        for (file, refs) in &g.file_refs {
            if !under(&g.file_module[file], m) {
                continue;
            }
            seen = true;
            let extra: Vec<&String> = refs
                .iter()
                .filter(|t| !under(t, m) && !allowed.iter().any(|a| under(t, a)))
                .collect();
            assert!(extra.is_empty(), "{file} ({m}) imports {extra:?}");
        }
        assert!(seen, "no file of {m}: update AT_MOST");
    }
    // The command line sits on top: nothing in the library imports it, and
    // only it knows clap (the library's options are plain types).
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for (file, refs) in &g.file_refs {
        let m = &g.file_module[file];
        if under(m, "cli") || m.is_empty() {
            continue;
        }
        assert!(!refs.iter().any(|t| under(t, "cli")), "{file} imports cli");
        let code = product_code(&std::fs::read_to_string(root.join(file)).unwrap());
        assert!(
            !code.contains("clap::") && !code.contains("use clap"),
            "{file} uses clap: only src/cli may"
        );
    }
}

/// The longest a product function may be, in lines from its `fn` to its
/// closing brace: past it, a function does several things, and each should
/// be named.
const MAX_FN_LINES: usize = 150;

/// Each function of this code: its name, first line (1-based) and length
/// in lines. A function ends at the first closing brace at its own
/// indentation (rustfmt's layout).
fn functions(code: &str) -> Vec<(String, usize, usize)> {
    let lines: Vec<&str> = code.lines().collect();
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let t = l.trim_start();
        let indent = l.len() - t.len();
        let mut words = t.split_whitespace().peekable();
        while words.peek().is_some_and(|w| {
            w.starts_with("pub") || ["async", "const", "unsafe", "extern"].contains(w)
        }) {
            words.next();
        }
        if words.next() != Some("fn") {
            continue;
        }
        let name = ident(words.next().unwrap_or("")).to_owned();
        // A declaration without a body (a trait's) ends in `;` before `{`.
        let Some(open) =
            (i..lines.len()).find(|&j| lines[j].contains('{') || lines[j].ends_with(';'))
        else {
            continue;
        };
        if !lines[open].contains('{') {
            continue;
        }
        let close = (open..lines.len()).find(|&j| {
            let l = lines[j];
            l.len() > indent && l[..indent].trim().is_empty() && l[indent..].starts_with('}')
        });
        if let Some(close) = close {
            out.push((name, i + 1, close - i + 1));
        }
    }
    out
}

#[test]
fn no_product_function_is_longer_than_the_bound() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    let mut long = Vec::new();
    for f in files {
        let code = product_code(&std::fs::read_to_string(&f).unwrap());
        for (name, _, len) in functions(&code) {
            if len > MAX_FN_LINES {
                let rel = f.strip_prefix(root).unwrap().display().to_string();
                long.push(format!("{rel}: {name} is {len} lines"));
            }
        }
    }
    assert!(
        long.is_empty(),
        "functions over {MAX_FN_LINES} lines (cut them into named steps): {long:#?}"
    );
}

#[test]
fn the_function_scanner_measures_bodies() {
    let code = "pub(crate) async fn a(\n    x: u8,\n) -> u8 {\n    x\n}\n\
                trait T {\n    fn decl(&self);\n    fn b(&self) {\n        if true {\n        }\n    }\n}\n";
    // (the trait's declaration has no body: no function)
    assert_eq!(
        functions(code),
        [("a".to_owned(), 1, 5), ("b".to_owned(), 8, 4)]
    );
}

#[test]
fn the_test_kit_fakes_its_subsystems_and_no_product_module_imports_it() {
    let g = graph();
    let mut seen = false;
    for (file, refs) in &g.file_refs {
        if under(&g.file_module[file], KIT) {
            seen = true;
            let extra: Vec<&String> = refs
                .iter()
                .filter(|t| !under(t, KIT) && !KIT_FAKES.iter().any(|f| under(t, f)))
                .collect();
            assert!(
                extra.is_empty(),
                "{file} (the test kit) imports {extra:?}: only what it fakes ({KIT_FAKES:?})"
            );
        } else {
            assert!(
                !refs.iter().any(|t| under(t, KIT)),
                "{file} imports the test kit: only tests may"
            );
        }
    }
    assert!(seen, "no file of src/{KIT}: update KIT");
    // The binaries name the library as `locafs::`.
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    for f in files {
        let code = product_code(&std::fs::read_to_string(&f).unwrap());
        assert!(
            !code.contains(&format!("locafs::{KIT}")),
            "{} imports the test kit",
            f.display()
        );
    }
    // Compiled only into tests: unit tests, or the feature that only the
    // crate's dev-dependency on itself turns on.
    let lib = std::fs::read_to_string(root.join("src/lib.rs")).unwrap();
    assert!(
        lib.contains(&format!(
            "#[cfg(any(test, feature = \"{KIT}\"))]\npub mod {KIT};"
        )),
        "src/lib.rs declares the test kit for tests only"
    );
    let manifest: toml::Table =
        toml::from_str(&std::fs::read_to_string(root.join("Cargo.toml")).unwrap()).unwrap();
    let features = manifest["features"].as_table().unwrap();
    assert_eq!(features[KIT].as_array().map(Vec::len), Some(0));
    let default = features.get("default").and_then(|d| d.as_array());
    assert!(
        default.is_none_or(|d| d.iter().all(|f| f.as_str() != Some(KIT))),
        "the test kit is on by default"
    );
    for (name, dep) in manifest["dependencies"].as_table().unwrap() {
        let on = dep.get("features").and_then(|f| f.as_array());
        assert!(
            name != "locafs" && on.is_none_or(|f| f.iter().all(|x| x.as_str() != Some(KIT))),
            "a normal dependency turns the test kit on"
        );
    }
    let dev = &manifest["dev-dependencies"]["locafs"]["features"];
    assert!(dev
        .as_array()
        .unwrap()
        .iter()
        .any(|f| f.as_str() == Some(KIT)));
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
    let here = ["x".to_owned(), "y".to_owned()];
    let deep = crate_paths(
        "use super::z::{W, self};\nuse super::super::q::*;\nfn f() { self::k::f(); }\n\
         use crate::{a::{b::C, d}, e};\n",
        &here,
    );
    let deep: Vec<String> = deep.iter().map(|p| p.join("::")).collect();
    assert_eq!(
        deep,
        ["x::z::W", "x::z", "q", "x::y::k::f", "a::b::C", "a::d", "e"]
    );
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
