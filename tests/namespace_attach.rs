//! A server that replaces a dead one attaches to the namespace it left in
//! the shared state (`Namespace::attach`): every inode number the kernel
//! may hold answers as before, with the same path, attributes, lookup
//! count and readdir positions, and the tree is the one the dead server
//! knew. A real `Namespace` over a real temp directory goes through random
//! sequences of source changes, lookups, listings, attribute checks and
//! kernel FORGETs, with attaches in between (the old namespace dropped as
//! a killed server's is: nothing of it but the shared state is used).

mod common;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use locafs::meta::namespace::{Namespace, ROOT};
use locafs::source::{DirSource, EntryKind, Source};
use locafs::sys::shm::SharedState;
use proptest::prelude::*;

/// One entry as a listing gives it: inode, name, kind, and its size and
/// mtime if its attributes are known.
type Listed = (u64, OsString, char, Option<(u64, i64)>);

/// What a kernel can observe of a namespace without it asking the source:
/// each directory's entries in readdir order (inode, name, kind, whether
/// the attributes are known, size and mtime if so), walked from the root,
/// and for each inode handed out its path, lookup count and known
/// attributes.
#[derive(Debug, PartialEq)]
struct Seen {
    dirs: Vec<(u64, Vec<Listed>)>,
    handed: Vec<(u64, Option<PathBuf>, u32, bool)>,
    known_bytes: u64,
}

fn kind(k: EntryKind) -> char {
    match k {
        EntryKind::Dir => 'd',
        EntryKind::File => 'f',
        EntryKind::Symlink => 'l',
        EntryKind::Other => 'o',
    }
}

fn seen(ns: &Namespace, handed: &[u64]) -> Seen {
    let mut dirs = Vec::new();
    let mut stack = vec![ROOT];
    while let Some(ino) = stack.pop() {
        let mut kids = Vec::new();
        ns.read_dir(ino, 0, |e, _| {
            let attrs = e.known.then_some((e.attr.size, e.attr.mtime_ns));
            kids.push((e.ino, e.name.to_owned(), kind(e.attr.kind), attrs));
            false
        })
        .unwrap();
        for k in &kids {
            if k.2 == 'd' {
                stack.push(k.0);
            }
        }
        dirs.push((ino, kids));
    }
    let mut handed: Vec<_> = handed
        .iter()
        .map(|&i| (i, ns.path(i).ok(), ns.lookups(i), ns.attrs_known(i)))
        .collect();
    handed.sort();
    handed.dedup();
    Seen {
        dirs,
        handed,
        known_bytes: ns.known_bytes(),
    }
}

#[derive(Debug, Clone)]
enum Op {
    /// A new file or directory at `parent/n{name}`, replacing whatever was
    /// there (a new object).
    Put {
        parent: usize,
        name: u8,
        dir: bool,
        size: u16,
    },
    Delete {
        pick: usize,
    },
    /// A lookup through the namespace (the kernel holds one more).
    Lookup {
        pick: usize,
    },
    /// A listing of a directory.
    Refresh {
        pick: usize,
    },
    Getattr {
        pick: usize,
    },
    /// The kernel forgets every lookup of an inode it was handed.
    Forget {
        pick: usize,
    },
    /// The server dies; a new one attaches to the shared state.
    Attach,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (any::<usize>(), 0u8..6, any::<bool>(), 0u16..3000)
            .prop_map(|(parent, name, dir, size)| Op::Put { parent, name, dir, size }),
        2 => any::<usize>().prop_map(|pick| Op::Delete { pick }),
        3 => any::<usize>().prop_map(|pick| Op::Lookup { pick }),
        3 => any::<usize>().prop_map(|pick| Op::Refresh { pick }),
        1 => any::<usize>().prop_map(|pick| Op::Getattr { pick }),
        2 => any::<usize>().prop_map(|pick| Op::Forget { pick }),
        3 => Just(Op::Attach),
    ]
}

/// Every path of the source (and whether it is a directory), sorted.
fn source_paths(root: &Path) -> Vec<(PathBuf, bool)> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        for e in std::fs::read_dir(root.join(&rel)).unwrap() {
            let e = e.unwrap();
            let p = rel.join(e.file_name());
            let dir = e.file_type().unwrap().is_dir();
            if dir {
                stack.push(p.clone());
            }
            out.push((p, dir));
        }
    }
    out.sort();
    out
}

fn remove_any(p: &Path) {
    match std::fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(p).unwrap(),
        Ok(_) => std::fs::remove_file(p).unwrap(),
        Err(_) => {}
    }
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    std::fs::create_dir(&src).unwrap();
    for i in 0..3u8 {
        std::fs::write(src.join(format!("n{i}")), vec![i; 100 + i as usize]).unwrap();
    }
    let source: Arc<dyn Source> = Arc::new(DirSource::new(src.clone()));
    let state = SharedState::create().unwrap();
    let revalidate = Some(Duration::ZERO);
    let mut ns =
        Namespace::new_in(&state, Arc::clone(&source), revalidate, Arc::default()).unwrap();
    let mut handed: Vec<u64> = vec![ROOT];
    for op in ops {
        match op {
            Op::Put {
                parent,
                name,
                dir,
                size,
            } => {
                let mut dirs = vec![PathBuf::new()];
                dirs.extend(source_paths(&src).into_iter().filter(|e| e.1).map(|e| e.0));
                let at = src.join(&dirs[parent % dirs.len()]);
                let tmp = at.join(".new");
                if dir {
                    std::fs::create_dir(&tmp).unwrap();
                    std::fs::write(tmp.join("k"), vec![1; size as usize]).unwrap();
                } else {
                    std::fs::write(&tmp, vec![name; size as usize]).unwrap();
                }
                let path = at.join(format!("n{name}"));
                remove_any(&path);
                std::fs::rename(&tmp, &path).unwrap();
            }
            Op::Delete { pick } => {
                let all = source_paths(&src);
                if !all.is_empty() {
                    remove_any(&src.join(&all[pick % all.len()].0));
                }
            }
            Op::Lookup { pick } | Op::Refresh { pick } => {
                let all = source_paths(&src);
                let mut c: Vec<PathBuf> = vec![PathBuf::new()];
                c.extend(all.into_iter().map(|e| e.0));
                let p = &c[pick % c.len()];
                if let Ok((ino, a)) = ns.lookup_path(p) {
                    // (lookup_path counts each component's lookup)
                    handed.push(ino);
                    if matches!(op, Op::Refresh { .. }) && a.kind == EntryKind::Dir {
                        let _ = ns.refresh_dir(ino);
                    }
                }
            }
            Op::Getattr { pick } => {
                let _ = ns.getattr(handed[pick % handed.len()]);
            }
            Op::Forget { pick } => {
                let ino = handed[pick % handed.len()];
                if ino != ROOT {
                    let n = ns.lookups(ino) as u64;
                    ns.forget(&[(ino, n)]);
                }
            }
            Op::Attach => {
                let before = seen(&ns, &handed);
                drop(ns);
                ns = Namespace::attach(&state, Arc::clone(&source), revalidate, Arc::default())
                    .unwrap()
                    .expect("a namespace to attach to");
                prop_assert_eq!(seen(&ns, &handed), before);
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn an_attached_namespace_answers_as_the_one_that_died(
        ops in proptest::collection::vec(op(), 1..60)
    ) {
        run(ops)?;
    }
}

/// A state that no server finished building a namespace in has none to
/// attach to.
#[test]
fn nothing_to_attach_to_until_a_namespace_is_built() {
    let tmp = tempfile::tempdir().unwrap();
    let source: Arc<dyn Source> = Arc::new(DirSource::new(tmp.path().to_owned()));
    let state = SharedState::create().unwrap();
    assert!(
        Namespace::attach(&state, Arc::clone(&source), None, Arc::default())
            .unwrap()
            .is_none()
    );
    let ns = Namespace::new_in(&state, Arc::clone(&source), None, Arc::default()).unwrap();
    // One process holds the tables at a time.
    assert!(Namespace::attach(&state, Arc::clone(&source), None, Arc::default()).is_err());
    drop(ns);
    assert!(Namespace::attach(&state, source, None, Arc::default())
        .unwrap()
        .is_some());
}
