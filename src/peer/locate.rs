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

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::cache::{BlockStore, FileVersion};
use crate::meta::namespace::{Namespace, ROOT};
use crate::peer::placement::{block_key, path_id, MemberId, Placement};
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

    /// The node index of the owner of the first block of the file at `rel`
    /// (relative to the data set root).
    pub fn owner(&self, rel: &Path) -> u32 {
        if self.members.len() < 2 {
            return 0;
        }
        let k = block_key(&self.dataset, &path_id(rel), 0, self.block_size);
        self.placement
            .owner(&k)
            .and_then(|m| self.members.binary_search(m).ok())
            .unwrap_or(0) as u32
    }
}

/// The files asked about.
pub enum Asked {
    /// Every file of the data set, in listing order (depth first, each
    /// directory's entries sorted by name bytes; regular files only).
    All,
    /// These paths, relative to the mount root.
    Paths(Vec<PathBuf>),
    /// These paths, separated by NUL bytes (the compact form for millions
    /// of files: no name holds a NUL).
    Joined(Vec<u8>),
}

/// The answer: one entry per file asked (or per file of the data set, in
/// listing order, with its path).
#[derive(Debug, Default)]
pub struct Located {
    pub node_index: Option<u32>,
    pub num_nodes: u32,
    /// Member ids by node index (empty without peers).
    pub members: Vec<String>,
    /// The data set's files in listing order, separated by NUL bytes (the
    /// all-files form only; names that are not UTF-8 lossily converted).
    pub paths: Option<String>,
    /// Owner node index of each file; None: not a regular file of the data
    /// set.
    pub owners: Vec<Option<u32>>,
    /// Whether this node's cache holds each file whole now (false for a
    /// file whose attributes were never read: it was never read here).
    pub cached: Vec<bool>,
    pub unknown: u64,
    /// Directories that could not be listed, and why.
    pub problems: Vec<String>,
}

/// What was found for a file of the all-files walk: its version, if its
/// attributes were read.
type Walked = (usize, usize, Option<SourceVersion>);

/// Answers the query. Nothing is asked of the source but the listings of
/// directories whose listing is stale (one per directory): owners depend
/// on paths only.
pub fn locate(ns: &Namespace, cache: &dyn BlockStore, owners: &Owners, asked: Asked) -> Located {
    let mut out = Located {
        node_index: owners.me().map(|i| i as u32),
        num_nodes: owners.num_nodes() as u32,
        members: owners.members().iter().map(|m| m.to_string()).collect(),
        ..Default::default()
    };
    let answer = |rel: &[u8], v: Option<SourceVersion>| {
        let rel = Path::new(OsStr::from_bytes(rel));
        let cached = v.is_some_and(|v| {
            v.size == 0 || cache.is_complete(&FileVersion::new(Arc::from(rel), v))
        });
        (Some(owners.owner(rel)), cached)
    };
    match &asked {
        Asked::All => {
            // Paths in one buffer, a NUL between two.
            let mut buf: Vec<u8> = Vec::new();
            let mut files: Vec<Walked> = Vec::new();
            walk(
                ns,
                ROOT,
                &mut Vec::new(),
                &mut buf,
                &mut files,
                &mut out.problems,
            );
            let found = in_parallel(&files, |&(from, to, v), _| answer(&buf[from..to], v));
            (out.owners, out.cached) = found.0;
            out.paths = Some(String::from_utf8_lossy(&buf).into_owned());
        }
        Asked::Paths(_) | Asked::Joined(_) => {
            let list: Vec<&[u8]> = match &asked {
                Asked::Paths(paths) => paths.iter().map(|p| p.as_os_str().as_bytes()).collect(),
                Asked::Joined(s) if !s.is_empty() => s.split(|b| *b == 0).collect(),
                _ => Vec::new(),
            };
            ((out.owners, out.cached), out.problems) =
                in_parallel(&list, |p, memo| match find(ns, p, memo) {
                    Some((rel, v)) => answer(rel, v),
                    None => (None, false),
                });
        }
    }
    out.unknown = out.owners.iter().filter(|o| o.is_none()).count() as u64;
    out
}

/// What one thread remembers while it finds paths: the directories it
/// resolved (the last one first: paths usually come grouped by directory)
/// and the directories it could not list.
#[derive(Default)]
struct Memo<'a> {
    last: Option<(&'a [u8], Option<u64>)>,
    /// Where the last name was found in the last directory.
    near: usize,
    dirs: std::collections::HashMap<&'a [u8], Option<u64>>,
    problems: Vec<String>,
}

/// `one` over every item, in order, on as many threads as there are cores
/// (up to 8), each with its own [`Memo`]: at 256 members an owner costs
/// about 0.6 µs on this project's 2-core VM, a path a binary search in its directory, a cached check a
/// hash of the version and a lookup in the cache's books.
#[allow(clippy::type_complexity)]
fn in_parallel<'a, T: Sync>(
    items: &'a [T],
    one: impl Fn(&'a T, &mut Memo<'a>) -> (Option<u32>, bool) + Sync,
) -> ((Vec<Option<u32>>, Vec<bool>), Vec<String>) {
    let mut own = vec![None; items.len()];
    let mut cached = vec![false; items.len()];
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(8));
    let chunk = items.len().div_ceil(threads).max(4096);
    let one = &one;
    let problems = std::thread::scope(|s| {
        let workers: Vec<_> = items
            .chunks(chunk)
            .zip(own.chunks_mut(chunk))
            .zip(cached.chunks_mut(chunk))
            .map(|((part, o), c)| {
                s.spawn(move || {
                    let mut memo = Memo::default();
                    for (i, item) in part.iter().enumerate() {
                        (o[i], c[i]) = one(item, &mut memo);
                    }
                    memo.problems
                })
            })
            .collect();
        let mut problems: Vec<String> = Vec::new();
        for w in workers {
            for p in w.join().unwrap_or_default() {
                if !problems.contains(&p) {
                    problems.push(p);
                }
            }
        }
        problems
    });
    ((own, cached), problems)
}

/// Finds `path` (relative to the root; a leading `/` is ignored) from the
/// listings, stat-ing nothing (an owner needs the path only): the path and
/// the file's version if known, or None if it is not a regular file of the
/// data set. Each parent directory is listed once if its listing is stale.
fn find<'a>(
    ns: &Namespace,
    path: &'a [u8],
    memo: &mut Memo<'a>,
) -> Option<(&'a [u8], Option<SourceVersion>)> {
    let path = path.strip_prefix(b"/").unwrap_or(path);
    // Plain names only: no empty segment, no `.` or `..`.
    if path
        .split(|b| *b == b'/')
        .any(|c| c.is_empty() || c == b"." || c == b"..")
    {
        return None;
    }
    let (parent, name) = match path.iter().rposition(|b| *b == b'/') {
        Some(i) => (&path[..i], &path[i + 1..]),
        None => (&path[..0], path),
    };
    let dir = match memo.last {
        Some((last, dir)) if last == parent => dir,
        _ => {
            let dir = match memo.dirs.get(parent) {
                Some(d) => *d,
                None => {
                    let d = listed_dir(ns, parent, &mut memo.problems);
                    memo.dirs.insert(parent, d);
                    d
                }
            };
            memo.last = Some((parent, dir));
            dir
        }
    }?;
    match ns.listed_child(dir, OsStr::from_bytes(name), &mut memo.near)? {
        (_, EntryKind::File, v) => Some((path, v)),
        _ => None,
    }
}

/// The inode of directory `rel` (plain names joined by `/`; empty: the
/// root), each directory on the way listed if its listing is stale and its
/// child found in that listing; None if there is no such directory.
fn listed_dir(ns: &Namespace, rel: &[u8], problems: &mut Vec<String>) -> Option<u64> {
    let mut cur = ROOT;
    let names = rel.split(|b| *b == b'/').filter(|n| !n.is_empty());
    for name in names.map(Some).chain([None]) {
        if let Err(e) = ns.refresh_dir(cur) {
            let at = String::from_utf8_lossy(rel);
            problems.push(format!(
                "{}: {e}",
                if at.is_empty() { ".".into() } else { at }
            ));
            return None;
        }
        let Some(name) = name else { break };
        match ns.listed_child(cur, OsStr::from_bytes(name), &mut 0)? {
            (ino, EntryKind::Dir, _) => cur = ino,
            _ => return None,
        }
    }
    Some(cur)
}

/// The regular files under `dir` (at `rel`), depth first, by name: each
/// path appended to `buf`, with its version where it is known.
fn walk(
    ns: &Namespace,
    dir: u64,
    rel: &mut Vec<u8>,
    buf: &mut Vec<u8>,
    files: &mut Vec<Walked>,
    problems: &mut Vec<String>,
) {
    if let Err(e) = ns.refresh_dir(dir) {
        problems.push(format!(
            "{}: {}",
            OsStr::from_bytes(rel).to_string_lossy(),
            e
        ));
        return;
    }
    // The directory's entries, names in one buffer, sorted by name bytes.
    let mut names: Vec<u8> = Vec::new();
    let mut entries: Vec<(usize, usize, u64, EntryKind, Option<SourceVersion>)> = Vec::new();
    let _ = ns.read_dir(dir, 0, |e, _| {
        let from = names.len();
        names.extend_from_slice(e.name.as_bytes());
        let v = e.known.then(|| e.attr.version());
        entries.push((from, names.len(), e.ino, e.attr.kind, v));
        false
    });
    // Usually sorted already (a listing keeps its names sorted, until
    // entries found later are merged in).
    let by_name = |a: &(usize, usize, u64, EntryKind, Option<SourceVersion>),
                   b: &(usize, usize, u64, EntryKind, Option<SourceVersion>)| {
        names[a.0..a.1].cmp(&names[b.0..b.1])
    };
    if !entries.is_sorted_by(|a, b| by_name(a, b).is_le()) {
        entries.sort_unstable_by(by_name);
    }
    for (from, to, ino, kind, v) in entries {
        let len = rel.len();
        if !rel.is_empty() {
            rel.push(b'/');
        }
        rel.extend_from_slice(&names[from..to]);
        match kind {
            EntryKind::Dir => walk(ns, ino, rel, buf, files, problems),
            EntryKind::File => {
                if !buf.is_empty() {
                    buf.push(0);
                }
                let start = buf.len();
                buf.extend_from_slice(rel);
                files.push((start, buf.len(), v));
            }
            _ => {}
        }
        rel.truncate(len);
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
        let a = Owners::new(ids(&[7002, 7000, 7001]), ids(&[7001]).pop(), [1; 16], 65536);
        let b = Owners::new(ids(&[7001, 7002, 7000]), ids(&[7001]).pop(), [1; 16], 65536);
        assert_eq!(a.me(), Some(1));
        assert_eq!(b.me(), Some(1));
        assert_eq!(a.num_nodes(), 3);
        let path = |i: u32| PathBuf::from(format!("c{}/img{i}.jpg", i % 7));
        for i in 0..200 {
            assert_eq!(a.owner(&path(i)), b.owner(&path(i)));
        }
        // The owner is the member placement gives block 0 of the path.
        let p = Placement::new(ids(&[7000, 7001, 7002]));
        let rel = path(3);
        let want = p
            .owner(&block_key(&[1; 16], &path_id(&rel), 0, 65536))
            .unwrap();
        assert_eq!(&a.members()[a.owner(&rel) as usize], want);
        // Every node owns some.
        let mut seen = [false; 3];
        for i in 0..200 {
            seen[a.owner(&path(i)) as usize] = true;
        }
        assert_eq!(seen, [true; 3]);
        let single = Owners::single();
        assert_eq!((single.me(), single.num_nodes()), (Some(0), 1));
        assert_eq!(single.owner(&rel), 0);
    }
}
