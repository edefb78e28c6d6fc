//! The docs stay true: tests that fail when the pages and the code drift
//! apart, whoever changes either.
//!
//! - Every option of `locafs mount --help` is in docs/operations.md's
//!   options table and in packaging/locafs.example.toml (as a key, but for
//!   `--config`, `-o` and `--daemon`, which a file cannot hold), and
//!   nothing else is; README.md's table names only real options; `-o`
//!   takes every option the file does.
//! - The example file holds true defaults: where a key's `Default:` text
//!   begins with the value shown, mounting with that key gives exactly the
//!   configuration of mounting without it.
//! - Every message the docs quote is one the code can print. The
//!   convention the test reads (docs/architecture.md, "Docs that stay
//!   true"): a message of locafs is quoted as inline code, either starting
//!   with `locafs: ` (a line on stderr), or right after "says", "logs",
//!   "prints", "reads" or "log line"; a line of a fenced block that starts
//!   with `locafs: ` is one too. What the OS, a store or a path puts into
//!   a message is written `...` or as a metavariable in capitals (N, MNT,
//!   FILE); numbers, paths and URLs are examples. Each literal piece
//!   between those must fit a string literal of the product code (src/
//!   outside test modules, the benches, the test kit, the packaging's
//!   scripts and Python package), a format string's `{}` standing for
//!   anything.
//! - docs/architecture.md's table of rooms names every file under src/.
//! - The kernel's `max_background` for a mount is the figure the memory
//!   docs give (tuning.md's table, which the budget reserves).

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The options `locafs mount --help` lists: `--long` names, and `-o`
/// (help and version left out).
fn help_options() -> BTreeSet<String> {
    let out = Command::new(bin())
        .args(["mount", "--help"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let mut set = BTreeSet::new();
    for line in text.lines() {
        let t = line.trim_start();
        if !t.starts_with('-') || line.len() - t.len() > 6 {
            continue;
        }
        let head = t.split("  ").next().unwrap_or(t);
        let long = head
            .split([',', ' '])
            .find_map(|w| w.strip_prefix("--"))
            .map(|n| format!("--{n}"));
        match long {
            Some(n) if n == "--help" || n == "--version" => {}
            Some(n) => {
                set.insert(n);
            }
            None => {
                set.insert(head.split_whitespace().next().unwrap().to_owned());
            }
        }
    }
    assert!(set.len() > 20 && set.contains("-o") && set.contains("--cache-dir"));
    set
}

/// The options named in the first column of the table rows of `text`
/// (`--name` and `-o` inside backquotes).
fn table_options(text: &str) -> BTreeSet<String> {
    let mut set = BTreeSet::new();
    for line in text.lines().filter(|l| l.starts_with('|')) {
        let first = line.split('|').nth(1).unwrap_or("");
        for code in first.split('`').skip(1).step_by(2) {
            for w in code.split([' ', '/', ',']) {
                let w = w.trim();
                if (w.starts_with("--") && w.len() > 2) || w == "-o" {
                    set.insert(w.trim_end_matches('=').to_owned());
                }
            }
        }
    }
    set
}

/// The part of `text` from the line `heading` to the next heading of the
/// same or a higher level.
fn section<'a>(text: &'a str, heading: &str) -> &'a str {
    let start = text
        .find(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("no {heading:?}"))
        + 1;
    let level = heading.split(' ').next().unwrap();
    let rest = &text[start + heading.len()..];
    let end = (1..=level.len())
        .filter_map(|n| rest.find(&format!("\n{} ", "#".repeat(n))))
        .min()
        .unwrap_or(rest.len());
    &text[start..start + heading.len() + end]
}

/// One key of the example file: its value as written and the comment
/// lines above it (the block it shares with the keys right after it).
struct Key {
    name: String,
    value: String,
    comment: String,
}

fn example_keys() -> Vec<Key> {
    let text = read("packaging/locafs.example.toml");
    let mut keys = Vec::new();
    let mut comment = String::new();
    for line in text.lines() {
        let t = line.trim();
        if t.is_empty() {
            comment.clear();
            continue;
        }
        let body = t.trim_start_matches('#').trim_start();
        let is_key = body.split_once(" = ").is_some_and(|(k, _)| {
            !k.is_empty() && k.chars().all(|c| c.is_ascii_lowercase() || c == '-')
        });
        if is_key {
            let (k, v) = body.split_once(" = ").unwrap();
            keys.push(Key {
                name: k.to_owned(),
                value: v.to_owned(),
                comment: comment.clone(),
            });
        } else if t.starts_with('#') {
            comment.push_str(body);
            comment.push(' ');
        }
    }
    keys
}

#[test]
fn every_mount_option_is_in_the_options_table_and_the_example_file_and_nothing_else() {
    let help = help_options();

    let ops = read("docs/operations.md");
    let table = section(&ops, "## Options");
    let in_table = table_options(table);
    let missing: Vec<_> = help.difference(&in_table).collect();
    let extra: Vec<_> = in_table.difference(&help).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "docs/operations.md's options table: missing {missing:?}, not options {extra:?}"
    );
    // One table: a blank line would end it, and the rows after it would
    // show as text.
    let rows: Vec<usize> = table
        .lines()
        .enumerate()
        .filter(|(_, l)| l.starts_with('|'))
        .map(|(i, _)| i)
        .collect();
    assert!(
        rows.windows(2).all(|w| w[1] == w[0] + 1),
        "docs/operations.md's options table is cut in pieces"
    );

    let readme = read("README.md");
    let in_readme = table_options(&readme);
    let bogus: Vec<_> = in_readme.difference(&help).collect();
    assert!(bogus.is_empty(), "README.md's table names {bogus:?}");

    let keys: BTreeSet<String> = example_keys().into_iter().map(|k| k.name).collect();
    let mut expected: BTreeSet<String> = help
        .iter()
        .filter(|o| !["--config", "-o", "--daemon"].contains(&o.as_str()))
        .map(|o| o.trim_start_matches('-').to_owned())
        .collect();
    expected.insert("source".into());
    expected.insert("mountpoint".into());
    let missing: Vec<_> = expected.difference(&keys).collect();
    let extra: Vec<_> = keys.difference(&expected).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "packaging/locafs.example.toml: missing {missing:?}, not options {extra:?}"
    );
}

#[test]
fn the_example_file_parses_and_holds_the_true_defaults() {
    use locafs::mount::config::{read_config, resolve, MountFlags, MountRequest};
    let keys = example_keys();
    let d = tempfile::tempdir().unwrap();
    let (src, mnt, cache) = (d.path().join("s"), d.path().join("m"), d.path().join("c"));
    for p in [&src, &mnt] {
        std::fs::create_dir(p).unwrap();
    }
    let secret = d.path().join("secret");
    std::fs::write(&secret, locafs::peer::tls::generate_secret().unwrap()).unwrap();
    // Owner-only, as a secret must be (a readable one is refused).
    std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let peer = format!("127.0.0.1:{}", free_udp_port());
    // What a key needs beside it to be accepted at all.
    let bases: [(&str, String); 3] = [
        ("a directory", String::new()),
        (
            "the peer cache",
            format!(
                "listen = \"{peer}\"\npeers = \"{peer}\"\ncluster-secret-file = \"{}\"\n",
                secret.display()
            ),
        ),
        ("an object store", String::new()),
    ];
    let conf = d.path().join("k.toml");
    let resolve_with = |base: usize, body: &str| {
        std::fs::write(&conf, format!("{}{body}", bases[base].1)).unwrap();
        let object = base == 2;
        let cfg = resolve(&MountRequest {
            source: Some(if object {
                PathBuf::from("s3://bucket/prefix")
            } else {
                src.clone()
            }),
            mountpoint: Some(mnt.clone()),
            flags: MountFlags {
                cache_dir: Some(cache.clone()),
                ..Default::default()
            },
            config: Some(conf.clone()),
            ..Default::default()
        });
        cfg.map(|mut c| {
            c.dataset_dir_created = false;
            format!("{c:?}")
        })
        .map_err(|e| e.0)
    };

    // Every key line, uncommented, is a valid file.
    let all: String = keys
        .iter()
        .map(|k| format!("{} = {}\n", k.name, k.value))
        .collect();
    std::fs::write(&conf, &all).unwrap();
    read_config(&conf).unwrap_or_else(|e| panic!("the example with every key: {e}"));

    let mut checked = Vec::new();
    for k in &keys {
        let one = format!("{} = {}\n", k.name, k.value);
        std::fs::write(&conf, &one).unwrap();
        read_config(&conf).unwrap_or_else(|e| panic!("{}: {e}", one.trim()));
        let default = k
            .comment
            .split_once("Default: ")
            .map(|(_, d)| d.trim())
            .unwrap_or_else(|| panic!("{}: no \"Default:\" in its comment", k.name));
        let shown = k.value.trim_matches('"');
        let claims_default = default.starts_with(shown)
            && default[shown.len()..]
                .chars()
                .next()
                .is_none_or(|c| matches!(c, '.' | ' ' | ','));
        if !claims_default || k.name == "source" || k.name == "mountpoint" {
            continue;
        }
        if k.name == "cache-dir" {
            // The flag the comparison mounts with would hide it.
            if rustix::process::geteuid().is_root() {
                assert_eq!(
                    Path::new(shown),
                    locafs::mount::config::default_cache_dir(),
                    "cache-dir"
                );
                checked.push(k.name.clone());
            }
            continue;
        }
        let base = (0..bases.len())
            .find(|&b| resolve_with(b, &one).is_ok())
            .unwrap_or_else(|| {
                panic!(
                    "{}: refused with any other options: {:?}",
                    one.trim(),
                    resolve_with(0, &one)
                )
            });
        let without = resolve_with(base, "").unwrap();
        let with = resolve_with(base, &one).unwrap();
        assert_eq!(
            with,
            without,
            "{} (over {}) is not the default: the mount differs",
            one.trim(),
            bases[base].0
        );
        checked.push(k.name.clone());
    }
    // The file does show defaults, and the check above is not vacuous: a
    // wrong one is caught.
    assert!(checked.len() >= 15, "only {checked:?}");
    let wrong = "memory-cache = \"128MiB\"\n";
    assert_ne!(resolve_with(0, wrong), resolve_with(0, ""));
}

#[test]
fn o_takes_every_option_the_file_does() {
    for k in example_keys() {
        if k.name == "source" || k.name == "mountpoint" {
            continue;
        }
        let name = k.name.replace('-', "_");
        let opt = match k.value.as_str() {
            "true" | "false" => name,
            v => format!("{name}={}", v.trim_matches('"')),
        };
        locafs::mount::config::parse_o(std::slice::from_ref(&opt))
            .unwrap_or_else(|e| panic!("-o {opt}: {e}"));
    }
}

/// A Rust file's code without `#[cfg(test)] mod` blocks.
fn product_code(text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        if line.trim_start().starts_with("#[cfg(test)]") {
            let next = lines.peek().map(|l| l.trim_start()).unwrap_or("");
            if next.starts_with("mod ") || next.starts_with("pub mod ") {
                let (mut depth, mut opened) = (0i32, false);
                for l in lines.by_ref() {
                    let code = l.split("//").next().unwrap_or("");
                    depth += code.matches('{').count() as i32;
                    depth -= code.matches('}').count() as i32;
                    opened |= code.contains('{');
                    if opened && depth <= 0 {
                        break;
                    }
                }
                continue;
            }
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// The string literals of Rust code, escapes and line continuations
/// resolved as the compiler does (`\` at the end of a line eats the
/// newline and the next line's indentation).
fn string_literals(code: &str) -> Vec<String> {
    let b: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            '/' if b.get(i + 1) == Some(&'/') => {
                while i < b.len() && b[i] != '\n' {
                    i += 1;
                }
            }
            '\'' => {
                // A char literal ('"', '\\') or a lifetime: skip it.
                if b.get(i + 1) == Some(&'\\') {
                    i += 4;
                } else if b.get(i + 2) == Some(&'\'') {
                    i += 3;
                } else {
                    i += 1;
                }
            }
            '"' => {
                let mut s = String::new();
                i += 1;
                while i < b.len() && b[i] != '"' {
                    if b[i] == '\\' && i + 1 < b.len() {
                        i += 1;
                        match b[i] {
                            '\n' => {
                                while i + 1 < b.len() && b[i + 1].is_whitespace() {
                                    i += 1;
                                }
                            }
                            'n' => s.push('\n'),
                            't' => s.push('\t'),
                            c => s.push(c),
                        }
                    } else {
                        s.push(b[i]);
                    }
                    i += 1;
                }
                out.push(s);
                i += 1;
            }
            _ => i += 1,
        }
    }
    out
}

fn files_under(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            files_under(&p, out);
        } else {
            out.push(p);
        }
    }
}

/// Every text locafs can print from: the string literals of src/ (outside
/// tests), of the benches (benchmarks.md quotes their output) and of the
/// test kit (which prints SKIPPED), and the packaging's scripts and Python
/// package.
fn printable_texts() -> Vec<String> {
    let mut files = Vec::new();
    for dir in ["src", "benches", "tests/common"] {
        files_under(&repo().join(dir), &mut files);
    }
    let mut texts = Vec::new();
    for f in files
        .iter()
        .filter(|f| f.extension().is_some_and(|e| e == "rs"))
    {
        let code = product_code(&std::fs::read_to_string(f).unwrap());
        texts.extend(string_literals(&code));
    }
    let mut pk = Vec::new();
    files_under(&repo().join("packaging"), &mut pk);
    for f in pk {
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        if name.ends_with(".py") || name.ends_with(".sh") || name == "mount.fuse.locafs" {
            texts.push(std::fs::read_to_string(&f).unwrap());
        }
    }
    texts
}

/// A quoted message's literal pieces: the runs of words between
/// placeholders (`...`, numbers, metavariables in capitals, example paths
/// and URLs), keeping those with a word of three letters or more.
fn literal_pieces(msg: &str) -> Vec<String> {
    let msg = msg.strip_prefix("locafs: ").unwrap_or(msg);
    let placeholder = |w: &str| {
        let core = w.trim_matches(|c: char| !c.is_alphanumeric() && c != '.' && c != '…');
        core.contains("...")
            || core.contains('…')
            // A metavariable: `<test>`, `<reason>`.
            || (w.starts_with('<') && w.trim_end_matches([':', ',', ';', '.']).ends_with('>'))
            || core.contains("://")
            || w.trim_start_matches(['(', '"', '\'']).starts_with('/')
            || core
                .trim_end_matches(['s', '%', 'x'])
                .parse::<f64>()
                .is_ok()
            || (core.chars().any(|c| c.is_ascii_uppercase())
                && core
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
    };
    let mut pieces = vec![Vec::new()];
    for w in msg.split_whitespace() {
        if placeholder(w) {
            pieces.push(Vec::new());
        } else {
            pieces.last_mut().unwrap().push(w);
        }
    }
    pieces
        .into_iter()
        .map(|p| p.join(" "))
        .filter(|p| p.split(|c: char| !c.is_alphabetic()).any(|w| w.len() >= 3))
        .collect()
}

/// The messages the docs quote, by the convention of this file's header:
/// (file, message).
fn quoted_messages() -> Vec<(String, String)> {
    let mut docs = Vec::new();
    files_under(&repo().join("docs"), &mut docs);
    docs.push(repo().join("README.md"));
    files_under(&repo().join("packaging"), &mut docs);
    docs.retain(|p| p.extension().is_some_and(|e| e == "md"));
    let mut out = Vec::new();
    for f in docs {
        let rel = f.strip_prefix(repo()).unwrap().display().to_string();
        let text = std::fs::read_to_string(&f).unwrap();
        let mut in_fence = false;
        let mut prose = String::new();
        for line in text.lines() {
            if line.trim_start().starts_with("```") {
                in_fence = !in_fence;
                prose.push('\n');
                continue;
            }
            if in_fence {
                if let Some(m) = line.trim_start().strip_prefix("locafs: ") {
                    out.push((rel.clone(), format!("locafs: {m}")));
                }
                prose.push('\n');
            } else {
                prose.push_str(line);
                prose.push('\n');
            }
        }
        // Inline code spans (they may wrap a line).
        let parts: Vec<&str> = prose.split('`').collect();
        for i in (1..parts.len()).step_by(2) {
            let code = parts[i].split_whitespace().collect::<Vec<_>>().join(" ");
            let before = parts[i - 1]
                .split_whitespace()
                .rev()
                .take(2)
                .collect::<Vec<_>>();
            let verb = before.first().is_some_and(|w| {
                ["says", "logs", "prints", "reads"].contains(&w.trim_end_matches(':'))
            }) || (before.first() == Some(&"line") && before.get(1) == Some(&"log"));
            if code.starts_with("locafs: ") || verb {
                out.push((rel.clone(), code));
            }
        }
    }
    out
}

/// Whether `piece` can be part of what the format string `template`
/// prints: its literal segments in order, anything where the template has
/// a `{...}` hole; `piece` starts inside a segment and may end inside one
/// or in a hole.
fn fits_template(piece: &str, template: &str) -> bool {
    if template.contains(piece) {
        return true;
    }
    // The literal segments between holes ("" before a leading hole and
    // after a trailing one); `{{` and `}}` are no holes.
    let mut segs = vec![String::new()];
    let mut chars = template.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                segs.last_mut().unwrap().push('{');
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
                segs.last_mut().unwrap().push('}');
            }
            '{' => {
                for c in chars.by_ref() {
                    if c == '}' {
                        break;
                    }
                }
                segs.push(String::new());
            }
            c => segs.last_mut().unwrap().push(c),
        }
    }
    if segs.len() < 2 {
        return false;
    }
    for i in 0..segs.len() {
        let first = &segs[i];
        // Every way `piece` can start with the end of segment i.
        for cut in (0..=first.len()).filter(|&k| first.is_char_boundary(k)) {
            // The piece starts in literal text, not in a hole (a hole
            // holds anything, and proves nothing).
            let tail = &first[cut..];
            if tail.is_empty() {
                continue;
            }
            let Some(mut rest) = piece.strip_prefix(tail) else {
                continue;
            };
            let mut ok = false;
            for (j, seg) in segs.iter().enumerate().skip(i + 1) {
                if rest.is_empty() {
                    ok = true;
                    break;
                }
                match rest.find(seg.as_str()).filter(|_| !seg.is_empty()) {
                    Some(at) => rest = &rest[at + seg.len()..],
                    None => {
                        // The piece ends in a hole, or inside this segment.
                        ok = seg.is_empty() && j + 1 == segs.len()
                            || (0..rest.len())
                                .filter(|&k| rest.is_char_boundary(k))
                                .any(|k| seg.starts_with(&rest[k..]));
                        break;
                    }
                }
            }
            if ok || rest.is_empty() {
                return true;
            }
        }
    }
    false
}

#[test]
fn the_template_match_finds_pieces_across_holes_and_nothing_else() {
    let t = "--profile {name}: credential_process `{cmd}` (in {}) exited with {status}";
    assert!(fits_template("--profile corp: credential_process", t));
    assert!(fits_template(
        "profile corp: credential_process `aws-vault exec corp` (in /root/.aws/config) exited with",
        t
    ));
    assert!(fits_template("exited with", t));
    assert!(!fits_template("--profile corp: role_arn", t));
    assert!(!fits_template("credential_process exited", t));
    assert!(fits_template(
        "cache dir /c is in use by another",
        "cache dir {} is in use by another locafs mount (pid {})"
    ));
    assert!(!fits_template(
        "cache dir /c is locked by",
        "cache dir {} is in use by another locafs mount (pid {})"
    ));
}

#[test]
fn every_message_the_docs_quote_is_one_the_code_can_print() {
    let texts = printable_texts();
    let quoted = quoted_messages();
    assert!(quoted.len() >= 10, "{quoted:?}");
    let mut wrong = Vec::new();
    for (file, msg) in &quoted {
        let pieces = literal_pieces(msg);
        let missing: Vec<&String> = pieces
            .iter()
            .filter(|p| !texts.iter().any(|t| fits_template(p, t)))
            .collect();
        if !missing.is_empty() {
            wrong.push(format!("{file}: `{msg}`: not in the code: {missing:?}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "messages the docs quote that locafs cannot print:\n{}",
        wrong.join("\n")
    );
    // The check is not vacuous: a message nobody prints is caught.
    let made_up = literal_pieces("locafs: cache dir ...: locked by pid N");
    assert!(made_up
        .iter()
        .any(|p| !texts.iter().any(|t| fits_template(p, t))));
}

#[test]
fn the_module_table_names_every_source_file() {
    let arch = read("docs/architecture.md");
    let table = section(&arch, "## The rooms");
    let rows: Vec<(String, String)> = table
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            let mut cells = l.split('|').skip(1);
            (
                cells.next().unwrap_or("").to_owned(),
                cells.next().unwrap_or("").to_owned(),
            )
        })
        .collect();
    let mut files = Vec::new();
    files_under(&repo().join("src"), &mut files);
    let mut missing = Vec::new();
    for f in files
        .iter()
        .filter(|f| f.extension().is_some_and(|e| e == "rs"))
    {
        let rel = f.strip_prefix(repo().join("src")).unwrap();
        let rel_s = rel.display().to_string();
        let named = rows.iter().any(|(first, concern)| {
            first.contains(&format!("`{rel_s}`")) || concern.contains(&format!("`{rel_s}`"))
        });
        let in_folder_row = rel
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .is_some_and(|dir| {
                let dir = format!("`{}/`", dir.display());
                let name = format!("`{}`", rel.file_name().unwrap().to_string_lossy());
                rows.iter().any(|(first, concern)| {
                    first.contains(&dir)
                        && (rel.file_name().unwrap() == "mod.rs"
                            || concern.contains(&name)
                            || concern.contains(&format!("`{rel_s}`")))
                })
            });
        if !named && !in_folder_row {
            missing.push(rel_s);
        }
    }
    assert!(
        missing.is_empty(),
        "docs/architecture.md's module table does not name {missing:?}"
    );
}

/// The kernel's `max_background` for a locafs mount (the most background
/// requests, read-ahead reads among them, the kernel keeps in flight), read
/// from the FUSE control file system, is the figure docs/tuning.md gives
/// and the budget reserves room for.
#[test]
fn the_kernels_background_requests_are_what_the_memory_docs_say() {
    require_fuse!();
    let conns = Path::new("/sys/fs/fuse/connections");
    // Mounted, whether or not any FUSE connection exists yet (an empty
    // directory is what fusectl shows with no FUSE mount on the machine).
    let mounted = std::fs::read_to_string("/proc/self/mounts")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(1) == conns.to_str() && l.split(' ').nth(2) == Some("fusectl"));
    if !mounted {
        skip!(
            "fusectl is not mounted at {} (mount -t fusectl none {0})",
            conns.display()
        );
    }
    let tuning = read("docs/tuning.md");
    let line = tuning
        .lines()
        .find(|l| l.contains("kernel background requests"))
        .expect("docs/tuning.md gives the kernel's background requests");
    let said: u32 = line
        .split("kernel background requests")
        .next()
        .unwrap()
        .split(|c: char| !c.is_ascii_digit())
        .rfind(|w| !w.is_empty())
        .and_then(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("no number before it: {line}"));
    let sc = Scratch::with_sample_files();
    let _m = sc.mount(&[]);
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let dev = info
        .lines()
        .find(|l| l.split(' ').nth(4) == sc.mnt.to_str())
        .and_then(|l| l.split(' ').nth(2))
        .and_then(|d| d.split(':').nth(1))
        .expect("the mount's device")
        .to_owned();
    let max: u32 = std::fs::read_to_string(conns.join(&dev).join("max_background"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(max, said, "docs/tuning.md: {line}");
    let ops = read("docs/operations.md");
    assert!(
        ops.contains(&format!("{said} kernel background requests")),
        "docs/operations.md does not give the same figure"
    );
}

/// Every key of `locafs stats --json` is in docs/operations.md's list of
/// stable keys, and every `peer_*` key in docs/cluster.md's (a key nobody
/// documented, or one the docs lost, fails here).
#[test]
fn every_stats_key_is_documented() {
    require_fuse!();
    let sc = Scratch::with_sample_files();
    let _m = sc.mount(&[]);
    let v = stats_of(&sc.mnt);
    let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
    let ops = read("docs/operations.md");
    let start = ops
        .find("`locafs stats MNT [--json] [--watch]`")
        .expect("the stats paragraph");
    let para = &ops[start..start + ops[start..].find("\n\n").unwrap()];
    let documented: BTreeSet<&str> = para.split('`').skip(1).step_by(2).collect();
    let missing: Vec<_> = keys
        .iter()
        .filter(|k| !documented.contains(k.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/operations.md's stats keys lack {missing:?}"
    );
    let cluster = read("docs/cluster.md");
    let missing: Vec<_> = keys
        .iter()
        .filter(|k| k.starts_with("peer") && !cluster.contains(&format!("`{k}`")))
        .collect();
    assert!(missing.is_empty(), "docs/cluster.md lacks {missing:?}");
}
