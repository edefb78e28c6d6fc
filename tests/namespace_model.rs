//! The namespace's save/restore model (invariant 6: after a remount, no
//! entry that was deleted or replaced comes back). A real `Namespace` over a
//! real temp directory goes through random sequences of source changes
//! (files and directories created, replaced by new objects, deleted),
//! refreshes (lookups, directory listings, attribute checks, all of them
//! revalidated against the source), and saves + restores of its manifest.
//! After each restore the tree is exactly the one the namespace knew before
//! the save (walked without asking any source); after a full refresh it is
//! exactly the source's tree, and stays so through a save and an immutable
//! restore. A listing reads names and kinds only: an entry listed but never
//! stat-ed is "unknown" in the model (its attributes are not part of what
//! the namespace knows), and stays exactly so through a save and restore;
//! a full refresh stats every entry, as a READDIRPLUS does.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use locafs::meta::namespace::{Namespace, ROOT};
use locafs::source::{DirSource, EntryKind, Source, SourceAttr};
use locafs::testing::NoSource;
use proptest::prelude::*;

/// One entry of a tree: path, kind, size, mtime, source inode.
type Entry = (PathBuf, char, u64, i64, u64);

/// The size and mtime of an entry whose attributes are not known (listed,
/// never stat-ed).
const UNKNOWN: (u64, i64) = (u64::MAX, i64::MIN);

fn unknown(path: PathBuf, a: &SourceAttr) -> Entry {
    let e = entry(path, a);
    (e.0, e.1, UNKNOWN.0, UNKNOWN.1, e.4)
}

fn entry(path: PathBuf, a: &SourceAttr) -> Entry {
    let kind = match a.kind {
        EntryKind::Dir => 'd',
        EntryKind::File => 'f',
        EntryKind::Symlink => 'l',
        EntryKind::Other => 'o',
    };
    let size = if a.kind == EntryKind::Dir { 0 } else { a.size };
    (path, kind, size, a.mtime_ns, a.ino)
}

/// The tree a namespace knows, walked from the root with `read_dir` only
/// (no source access; entries never stat-ed are `UNKNOWN`); with
/// `refresh`, each directory is refreshed first and each entry's
/// attributes checked (which must succeed), as a READDIRPLUS walk does.
fn known(ns: &Namespace, refresh: bool) -> Vec<Entry> {
    let mut out = Vec::new();
    let mut stack = vec![(ROOT, PathBuf::new())];
    while let Some((ino, path)) = stack.pop() {
        if refresh {
            ns.refresh_dir(ino)
                .unwrap_or_else(|e| panic!("refresh_dir {path:?}: {e}"));
        }
        let mut kids = Vec::new();
        ns.read_dir(ino, 0, |e, _| {
            kids.push((e.ino, e.name.to_owned(), *e.attr, e.known));
            false
        })
        .unwrap_or_else(|e| panic!("read_dir {path:?}: {e}"));
        for (c, name, a, is_known) in kids {
            let p = path.join(&name);
            let (a, is_known) = if refresh {
                let a = ns
                    .getattr(c)
                    .unwrap_or_else(|e| panic!("getattr {p:?}: {e}"));
                (a, true)
            } else {
                (a, is_known)
            };
            if a.kind == EntryKind::Dir {
                stack.push((c, p.clone()));
            }
            out.push(if is_known {
                entry(p, &a)
            } else {
                unknown(p, &a)
            });
        }
    }
    out.sort();
    out
}

/// The source's tree as a fresh walk sees it.
fn source_tree(root: &Path) -> Vec<Entry> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        for e in std::fs::read_dir(root.join(&rel)).unwrap() {
            let e = e.unwrap();
            let p = rel.join(e.file_name());
            let m = std::fs::symlink_metadata(root.join(&p)).unwrap();
            if m.is_dir() {
                stack.push(p.clone());
            }
            out.push(entry(p, &SourceAttr::from_metadata(&m)));
        }
    }
    out.sort();
    out
}

/// The bytes of the files whose size is known.
fn file_bytes(tree: &[Entry]) -> u64 {
    tree.iter()
        .filter(|e| e.1 == 'f' && e.2 != UNKNOWN.0)
        .map(|e| e.2)
        .sum()
}

#[derive(Debug, Clone)]
enum Op {
    /// A new file or directory (with `kids` files) at `parent/n{name}`,
    /// replacing whatever was there (a new object: new inode).
    Put {
        parent: usize,
        name: u8,
        dir: bool,
        size: u16,
        kids: u8,
    },
    /// Deletes an entry (a directory with its subtree).
    Delete { pick: usize },
    /// Looks a path up through the namespace.
    Lookup { pick: usize },
    /// Lists a directory through the namespace.
    Refresh { pick: usize },
    /// Revalidates the attributes of an inode the namespace handed out
    /// (perhaps one no longer in the tree, which the kernel may still hold).
    Getattr { pick: usize },
    /// Saves the manifest and goes on with a namespace restored from it.
    SaveRestore,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (any::<usize>(), 0u8..4, any::<bool>(), 0u16..3000, 0u8..3).prop_map(
            |(parent, name, dir, size, kids)| Op::Put { parent, name, dir, size, kids }
        ),
        2 => any::<usize>().prop_map(|pick| Op::Delete { pick }),
        2 => any::<usize>().prop_map(|pick| Op::Lookup { pick }),
        3 => any::<usize>().prop_map(|pick| Op::Refresh { pick }),
        1 => any::<usize>().prop_map(|pick| Op::Getattr { pick }),
        2 => Just(Op::SaveRestore),
    ]
}

/// Paths (and whether each is a directory) known to the source or the
/// namespace, sorted, without duplicates.
fn candidates(src: &Path, ns: &Namespace) -> Vec<(PathBuf, bool)> {
    let mut v: Vec<(PathBuf, bool)> = source_tree(src)
        .into_iter()
        .chain(known(ns, false))
        .map(|e| (e.0, e.1 == 'd'))
        .collect();
    v.sort();
    v.dedup();
    v
}

fn remove_any(p: &Path) {
    match std::fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(p).unwrap(),
        Ok(_) => std::fs::remove_file(p).unwrap(),
        Err(_) => {}
    }
}

/// Saves `ns`, checks that an immutable restore (no source access) shows
/// exactly `want`, and returns a namespace restored from the same manifest
/// that revalidates everything against `source`.
fn save_restore(
    ns: &Namespace,
    source: &Arc<dyn Source>,
    want: &[Entry],
    refresh: bool,
) -> Result<Namespace, TestCaseError> {
    let bytes = ns.save(b"src", 1);
    let decode = || locafs::meta::manifest::decode(&bytes[..]).expect("the saved manifest decodes");
    let dead = Arc::new(NoSource::default());
    let frozen = Namespace::restore(dead.clone(), None, Arc::default(), decode(), Duration::ZERO)
        .expect("the saved manifest restores");
    prop_assert_eq!(known(&frozen, refresh), want.to_vec());
    prop_assert_eq!(frozen.known_bytes(), file_bytes(want));
    // Every entry answers a lookup (but those under or of an entry whose
    // attributes are unknown: a lookup would stat it); a name not in a
    // listed directory does not come back either.
    let unknown: Vec<&Path> = want
        .iter()
        .filter(|e| e.2 == UNKNOWN.0)
        .map(|e| e.0.as_path())
        .collect();
    for e in want {
        if unknown.iter().any(|u| e.0.starts_with(u)) {
            continue;
        }
        let (_, a) = frozen
            .lookup_path(&e.0)
            .map_err(|err| TestCaseError::fail(format!("lookup {:?}: {err}", e.0)))?;
        prop_assert_eq!(entry(e.0.clone(), &a), e.clone());
    }
    if refresh {
        let gone = frozen.lookup(ROOT, std::ffi::OsStr::new("no-such-name"));
        prop_assert_eq!(
            gone.map(|x| x.0).map_err(|e| e.raw_os_error()),
            Err(Some(libc::ENOENT))
        );
    }
    prop_assert_eq!(dead.calls(), 0, "the immutable restore asked the source");
    let always = Some(Duration::from_nanos(1));
    let ns = Namespace::restore(
        Arc::clone(source),
        always,
        Arc::default(),
        decode(),
        Duration::ZERO,
    )
    .expect("the saved manifest restores");
    Ok(ns)
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    std::fs::create_dir(&src).unwrap();
    for i in 0..3u8 {
        std::fs::write(src.join(format!("n{i}")), vec![i; 100 + i as usize]).unwrap();
    }
    let source: Arc<dyn Source> = Arc::new(DirSource::new(src.clone()));
    // Every entry is stale at once: each refresh asks the source.
    let mut ns = Namespace::new(Arc::clone(&source), Some(Duration::ZERO), Arc::default())?;
    // Inodes the namespace handed out (the kernel may hold them).
    let mut handed: Vec<u64> = Vec::new();
    for op in ops {
        match op {
            Op::Put {
                parent,
                name,
                dir,
                size,
                kids,
            } => {
                let mut dirs: Vec<PathBuf> = vec![PathBuf::new()];
                dirs.extend(
                    source_tree(&src)
                        .into_iter()
                        .filter(|e| e.1 == 'd')
                        .map(|e| e.0),
                );
                let at = src.join(&dirs[parent % dirs.len()]);
                let path = at.join(format!("n{name}"));
                // Made beside it first, so that it is a new inode.
                let tmp = at.join(".new");
                if dir {
                    std::fs::create_dir(&tmp).unwrap();
                    for k in 0..kids {
                        let len = size as usize + k as usize;
                        std::fs::write(tmp.join(format!("n{k}")), vec![k; len]).unwrap();
                    }
                } else {
                    std::fs::write(&tmp, vec![name; size as usize]).unwrap();
                }
                remove_any(&path);
                std::fs::rename(&tmp, &path).unwrap();
            }
            Op::Delete { pick } => {
                let all = source_tree(&src);
                if !all.is_empty() {
                    remove_any(&src.join(&all[pick % all.len()].0));
                }
            }
            Op::Lookup { pick } => {
                let c = candidates(&src, &ns);
                if !c.is_empty() {
                    if let Ok((ino, _)) = ns.lookup_path(&c[pick % c.len()].0) {
                        handed.push(ino);
                    }
                }
            }
            Op::Refresh { pick } => {
                let mut c: Vec<PathBuf> = vec![PathBuf::new()];
                c.extend(
                    candidates(&src, &ns)
                        .into_iter()
                        .filter(|e| e.1)
                        .map(|e| e.0),
                );
                if let Ok((ino, a)) = ns.lookup_path(&c[pick % c.len()]) {
                    handed.push(ino);
                    if a.kind == EntryKind::Dir {
                        let _ = ns.refresh_dir(ino);
                    }
                }
            }
            Op::Getattr { pick } => {
                if !handed.is_empty() {
                    let _ = ns.getattr(handed[pick % handed.len()]);
                }
            }
            Op::SaveRestore => {
                let before = known(&ns, false);
                ns = save_restore(&ns, &source, &before, false)?;
                // Inode numbers are the new mount's.
                handed.clear();
            }
        }
    }
    // Refreshed in full, the namespace is the source's tree, and so is
    // what a remount over its manifest shows.
    let want = source_tree(&src);
    prop_assert_eq!(known(&ns, true), want.clone());
    let ns = save_restore(&ns, &source, &want, true)?;
    prop_assert_eq!(known(&ns, true), want);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn save_and_restore_give_the_tree_last_seen(ops in proptest::collection::vec(op(), 1..50)) {
        run(ops)?;
    }
}

/// The user's sequence (trust issue 2) at the namespace level: a replaced
/// and a deleted file, seen by a listing, do not come back after a restore.
#[test]
fn replaced_and_deleted_files_do_not_come_back() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().to_owned();
    for i in 1..=5 {
        std::fs::write(src.join(format!("f{i}.txt")), format!("old {i}")).unwrap();
    }
    let source: Arc<dyn Source> = Arc::new(DirSource::new(src.clone()));
    let ns = Namespace::new(Arc::clone(&source), Some(Duration::ZERO), Arc::default()).unwrap();
    assert_eq!(known(&ns, true), source_tree(&src));
    for f in ["f1.txt", "f2.txt"] {
        ns.lookup(ROOT, f.as_ref()).unwrap();
    }
    std::fs::write(src.join("f1.txt.new"), "new 1").unwrap();
    std::fs::rename(src.join("f1.txt.new"), src.join("f1.txt")).unwrap();
    std::fs::remove_file(src.join("f2.txt")).unwrap();
    let want = source_tree(&src);
    assert_eq!(known(&ns, true), want);
    let ns = save_restore(&ns, &source, &want, true).unwrap();
    assert_eq!(known(&ns, true), want);
}

/// A manifest that does not describe one tree is not used (the mount walks
/// the source instead): two entries of one name in a directory, an entry
/// under a file, a name that is not one path component.
#[test]
fn a_manifest_that_is_not_one_tree_is_not_restored() {
    let tmp = tempfile::tempdir().unwrap();
    let m = std::fs::symlink_metadata(tmp.path()).unwrap();
    let dir = SourceAttr::from_metadata(&m);
    let file = SourceAttr {
        kind: EntryKind::File,
        size: 3,
        mode: 0o100644,
        ..dir
    };
    let restore = |records: &[(u64, &[u8], SourceAttr)]| {
        let mut e = locafs::meta::manifest::Encoder::new(b"src", 1);
        e.push(1, b"", &dir, true);
        for (parent, name, a) in records {
            e.push(*parent, name, a, false);
        }
        let m = locafs::meta::manifest::decode(e.finish(3)).expect("decodes");
        let source: Arc<dyn Source> = Arc::new(NoSource::default());
        Namespace::restore(source, None, Arc::default(), m, Duration::ZERO)
    };
    let ok = restore(&[(1, b"a", file), (1, b"d", dir), (3, b"a", file)]).expect("one tree");
    assert_eq!(known(&ok, false).len(), 3);
    assert_eq!(ok.known_bytes(), 6);
    assert!(restore(&[(1, b"a", file), (1, b"a", file)]).is_none());
    assert!(restore(&[
        (1, b"a", dir),
        (1, b"b", file),
        (2, b"x", file),
        (2, b"x", dir)
    ])
    .is_none());
    assert!(restore(&[(1, b"a", file), (2, b"b", file)]).is_none());
    for bad in [&b""[..], b".", b"..", b"a/b"] {
        assert!(restore(&[(1, bad, file)]).is_none(), "{bad:?}");
    }
}

/// An attribute check that finds another object at a path, or none, takes
/// the old entry out of the tree at once: a manifest saved before any
/// lookup or listing of that directory must not bring it back.
#[test]
fn an_entry_found_gone_by_getattr_is_not_saved() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().to_owned();
    for f in ["a.txt", "b.txt", "c.txt"] {
        std::fs::write(src.join(f), f).unwrap();
    }
    let source: Arc<dyn Source> = Arc::new(DirSource::new(src.clone()));
    let ns = Namespace::new(Arc::clone(&source), Some(Duration::ZERO), Arc::default()).unwrap();
    assert_eq!(known(&ns, true), source_tree(&src));
    let (a, _) = ns.lookup(ROOT, "a.txt".as_ref()).unwrap();
    let (b, _) = ns.lookup(ROOT, "b.txt".as_ref()).unwrap();
    std::fs::write(src.join("a.txt.new"), "new a").unwrap();
    std::fs::rename(src.join("a.txt.new"), src.join("a.txt")).unwrap();
    std::fs::remove_file(src.join("b.txt")).unwrap();
    for ino in [a, b] {
        let e = ns.getattr(ino).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{e}");
    }
    // Only c.txt is known for sure now (a.txt's new object is not looked
    // up yet).
    let want: Vec<Entry> = source_tree(&src)
        .into_iter()
        .filter(|e| e.0 == Path::new("c.txt"))
        .collect();
    save_restore(&ns, &source, &want, false).unwrap();
}
