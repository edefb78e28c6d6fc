//! The `where` query (issue 15): for each file of the data set, the node
//! that owns it and whether this node holds it whole now, so that a loader
//! (the Python package's `LocalitySampler`, docs/locality.md) can give each
//! node the samples it holds.
//!
//! The owner of a file is the member that rendezvous placement
//! (`peer::placement`) gives the file's first block: block 0 of the file's
//! current version, under the very key `peer::client` asks its owner with
//! (`block_key(data set id, version key, 0, block size)`), so "owner" is the
//! node that really serves that block. The placement is over the
//! **configured** `--peers` list as resolved (every member, up or down, and
//! this node), not the live view, so that every node gives the same answer
//! without talking to the others. A node index is a position in that list
//! sorted by member id (the resolved `ip:port`, compared as strings), the
//! order `Placement` keeps: the same on every node, whatever order each
//! command line lists the peers in. Without peers every file belongs to
//! node 0 of 1.
//!
//! It runs on a blocking thread, never asks a peer, and asks the source only
//! for a directory whose listing is stale (one listing per directory; its
//! entries' attributes come with it). A path that is not a regular file of
//! the data set is reported (owner `None`), never an error of the call.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use crate::cache::{BlockCache, FileVersion, VersionKey};
use crate::namespace::{Namespace, ROOT};
use crate::peer::placement::{block_key, MemberId, Placement};
use crate::peer::PeerNode;
use crate::source::{EntryKind, SourceVersion};

/// Who owns what: the placement over the configured member list.
pub struct Owners {
    placement: Placement,
    /// Sorted by id: a member's position is its node index.
    members: Vec<MemberId>,
    me: Option<usize>,
    dataset: [u8; 16],
    block_size: u32,
}

impl Owners {
    /// A mount without peers: node 0 of 1 owns everything.
    pub fn single() -> Owners {
        Owners {
            placement: Placement::new(Vec::new()),
            members: Vec::new(),
            me: Some(0),
            dataset: [0; 16],
            block_size: 0,
        }
    }

    /// The configured members of `node`'s peer list, as resolved now.
    pub fn of(node: &PeerNode) -> Owners {
        let (ids, me) = node.membership().configured();
        Owners::new(ids, me, node.dataset(), node.block_size())
    }

    /// Over `ids` (any order, duplicates ignored); `me` is this node's id.
    pub fn new(ids: Vec<MemberId>, me: Option<MemberId>, dataset: [u8; 16], block: u64) -> Self {
        let placement = Placement::new(ids);
        let members: Vec<MemberId> = placement.members().cloned().collect();
        let me = me.and_then(|m| members.binary_search(&m).ok());
        Owners {
            placement,
            members,
            me,
            dataset,
            block_size: block as u32,
        }
    }

    /// This node's index, once it has found itself in the list.
    pub fn me(&self) -> Option<usize> {
        self.me
    }

    pub fn num_nodes(&self) -> usize {
        self.members.len().max(1)
    }

    /// The members by node index.
    pub fn members(&self) -> &[MemberId] {
        &self.members
    }

    /// The node index of the owner of the first block of version `key`.
    pub fn owner(&self, key: &VersionKey) -> u32 {
        let k = block_key(&self.dataset, &key.0, 0, self.block_size);
        self.placement
            .owner(&k)
            .and_then(|m| self.members.binary_search(m).ok())
            .unwrap_or(0) as u32
    }
}

/// The answer: one entry per file asked (or per file of the data set, in
/// listing order, with its path).
#[derive(Debug, Default)]
pub struct Located {
    pub node_index: Option<u32>,
    pub num_nodes: u32,
    /// Member ids by node index (empty without peers).
    pub members: Vec<String>,
    /// The data set's files in listing order (the all-files form only).
    pub paths: Option<Vec<String>>,
    /// Owner node index of each file; None: not a regular file of the data
    /// set.
    pub owners: Vec<Option<u32>>,
    /// Whether this node's cache holds each file whole now.
    pub cached: Vec<bool>,
    pub unknown: u64,
    /// Directories that could not be listed (all-files form), and why.
    pub problems: Vec<String>,
}

/// Answers the query: for `paths` (relative to the mount root), or for the
/// whole data set in listing order (depth first, each directory's entries
/// sorted by name bytes; regular files only) when `paths` is None.
pub fn locate(
    ns: &Namespace,
    cache: &dyn BlockCache,
    owners: &Owners,
    paths: Option<&[PathBuf]>,
) -> Located {
    let mut out = Located {
        node_index: owners.me().map(|i| i as u32),
        num_nodes: owners.num_nodes() as u32,
        members: owners.members().iter().map(|m| m.to_string()).collect(),
        ..Default::default()
    };
    let entry = |out: &mut Located, rel: &Path, v: Option<SourceVersion>| match v {
        Some(v) => {
            let f = FileVersion::new(Arc::from(rel), v);
            out.owners.push(Some(owners.owner(&f.key)));
            out.cached.push(v.size == 0 || cache.is_complete(&f));
        }
        None => {
            out.owners.push(None);
            out.cached.push(false);
            out.unknown += 1;
        }
    };
    match paths {
        None => {
            let mut files = Vec::new();
            let mut problems = Vec::new();
            walk(ns, ROOT, &mut PathBuf::new(), &mut files, &mut problems);
            stat_listed(ns, &mut files);
            out.owners.reserve(files.len());
            out.cached.reserve(files.len());
            let mut names = Vec::with_capacity(files.len());
            for (rel, _, v) in files {
                entry(&mut out, &rel, v);
                names.push(rel.to_string_lossy().into_owned());
            }
            out.paths = Some(names);
            out.problems = problems;
        }
        Some(paths) => {
            out.owners.reserve(paths.len());
            out.cached.reserve(paths.len());
            // Each parent directory once: looked up, its listing refreshed
            // (which freshens its entries), so that the files' lookups are
            // answered from the namespace.
            let mut dirs: HashMap<&Path, Option<u64>> = HashMap::new();
            for p in paths {
                let rel = p.strip_prefix("/").unwrap_or(p);
                let plain = rel.components().all(|c| matches!(c, Component::Normal(_)));
                let (Some(parent), Some(name), true) = (rel.parent(), rel.file_name(), plain)
                else {
                    entry(&mut out, rel, None);
                    continue;
                };
                let dir = *dirs.entry(parent).or_insert_with(|| {
                    let (ino, attr) = ns.lookup_path(parent).ok()?;
                    if attr.kind != EntryKind::Dir {
                        return None;
                    }
                    let _ = ns.refresh_dir(ino);
                    Some(ino)
                });
                let v = dir
                    .and_then(|d| ns.lookup(d, name).ok())
                    .filter(|(_, a)| a.kind == EntryKind::File)
                    .map(|(_, a)| a.version());
                entry(&mut out, rel, v);
            }
        }
    }
    out
}

/// Threads that stat files known only from a listing (each waits on the
/// source, bounded by the guard's metadata deadline).
const STAT_THREADS: usize = 32;

/// Fills the versions of files known only from a listing (their attributes
/// are not read until first needed, and the owner depends on the version),
/// with a bounded number of stats in flight. A file whose stat fails stays
/// `None`: reported as unknown, never given a made-up owner.
fn stat_listed(ns: &Namespace, files: &mut [(PathBuf, u64, Option<SourceVersion>)]) {
    let todo: Vec<usize> = (0..files.len()).filter(|&i| files[i].2.is_none()).collect();
    if todo.is_empty() {
        return;
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let found: Vec<(usize, Option<SourceVersion>)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..STAT_THREADS.min(todo.len()))
            .map(|_| {
                s.spawn(|| {
                    let mut got = Vec::new();
                    loop {
                        let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(&i) = todo.get(k) else { break };
                        let v = ns
                            .getattr(files[i].1)
                            .ok()
                            .filter(|a| a.kind == EntryKind::File)
                            .map(|a| a.version());
                        got.push((i, v));
                    }
                    got
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap_or_default())
            .collect()
    });
    for (i, v) in found {
        files[i].2 = v;
    }
}

/// The regular files under `dir` (at `rel`), depth first, by name, with
/// their inode and their version where it is known (None: only listed).
fn walk(
    ns: &Namespace,
    dir: u64,
    rel: &mut PathBuf,
    files: &mut Vec<(PathBuf, u64, Option<SourceVersion>)>,
    problems: &mut Vec<String>,
) {
    if let Err(e) = ns.refresh_dir(dir) {
        problems.push(format!("{}: {}", rel.display(), e));
        return;
    }
    let mut entries: Vec<(Vec<u8>, u64, EntryKind, Option<SourceVersion>)> = Vec::new();
    let _ = ns.read_dir(dir, 0, |e, _| {
        entries.push((
            e.name.as_bytes().to_vec(),
            e.ino,
            e.attr.kind,
            e.known.then(|| e.attr.version()),
        ));
        false
    });
    entries.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    for (name, ino, kind, v) in entries {
        rel.push(OsStr::from_bytes(&name));
        match kind {
            EntryKind::Dir => walk(ns, ino, rel, files, problems),
            EntryKind::File => files.push((rel.clone(), ino, v)),
            _ => {}
        }
        rel.pop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(ports: &[u16]) -> Vec<MemberId> {
        ports
            .iter()
            .map(|p| MemberId::new(format!("127.0.0.1:{p}")))
            .collect()
    }

    #[test]
    fn node_indexes_do_not_depend_on_the_order_of_the_peer_list() {
        let key = VersionKey([3; 16]);
        let a = Owners::new(ids(&[7002, 7000, 7001]), ids(&[7001]).pop(), [1; 16], 65536);
        let b = Owners::new(ids(&[7001, 7002, 7000]), ids(&[7001]).pop(), [1; 16], 65536);
        assert_eq!(a.me(), Some(1));
        assert_eq!(b.me(), Some(1));
        assert_eq!(a.num_nodes(), 3);
        for i in 0..200u8 {
            let k = VersionKey([i; 16]);
            assert_eq!(a.owner(&k), b.owner(&k));
        }
        // The owner is the member placement gives block 0.
        let p = Placement::new(ids(&[7000, 7001, 7002]));
        let want = p.owner(&block_key(&[1; 16], &key.0, 0, 65536)).unwrap();
        assert_eq!(&a.members()[a.owner(&key) as usize], want);
        let single = Owners::single();
        assert_eq!((single.me(), single.num_nodes()), (Some(0), 1));
        assert_eq!(single.owner(&key), 0);
    }
}
