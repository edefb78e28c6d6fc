//! The namespace: the source tree as inodes. It maps inode numbers to paths
//! and attributes, lists directories, and revalidates what it knows against
//! the source once it is older than the revalidation interval (never with
//! `--immutable`), so that new, changed and deleted files show up in time.
//!
//! Over a source whose listings carry every attribute (an object store),
//! a stale entry is revalidated by listing its directory again, one
//! request for up to 1,000 entries instead of one each, and every listing
//! of a directory is shared by all that wait on it (single flight).
//!
//! It also holds each entry's POSIX ACLs (a directory source's; the kernel
//! checks users who do not own an entry against them): read from the
//! source when the kernel first asks after the attributes were read, held
//! until the attributes are read again, kept in the shared state like the
//! records (a server that dies takes none with it), and costing memory
//! only for the entries that have one (two flag bits otherwise).
//!
//! Inode numbers are stable for the life of the mount (a renamed or replaced
//! entry gets a new one) and never reused. This module never reads file data,
//! adds no entry of its own to the tree (no control files), and does no source
//! I/O while holding its lock.
//!
//! Millions of entries are the normal case, so each inode is one compact
//! record of 48 bytes in a dense table indexed by inode number (u32 ids):
//! its name lives in one byte arena, the attributes many entries share
//! (mode, uid, gid, nlink, rdev) are interned, and a directory's children
//! are one sorted run of u32 ids (a lookup is a binary search, a readdir
//! resume an index), plus a small side run for names found by lookups
//! since the last listing (merged at about the square root of the run, so
//! that lookups in a flat directory never listed are not quadratic). The kernel's lookup counts are kept (FORGET): an
//! entry that left the tree and that the kernel has forgotten loses its
//! name too (the arena is compacted when half of it is dead).
//! docs/cache.md ("Per-file memory: the namespace") has the layout.

use std::ffi::OsStr;
use std::io;
use std::ops::Range;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use std::collections::{HashMap, HashSet};

use futures::future::{BoxFuture, FutureExt, Shared};
use parking_lot::{Mutex, RwLock};
use tracing::warn;

use crate::obs::stats::Stats;
use crate::source::guard::{is_timeout, timed_out};
use crate::source::{Acls, DirName, EntryKind, Source, SourceAttr, SourceVersion};
use crate::sys::shm::{Pod, Region, SharedState, ShmVec};

/// The root's inode number (FUSE's convention).
pub const ROOT: u64 = 1;

/// `Node::dir` of a node that is not a directory.
const NO_DIR: u32 = u32::MAX;
/// `Node::flags`: the entry left the tree and the kernel forgot it: its
/// name is gone (only its inode number stays taken).
const GONE: u8 = 1;
/// `Node::flags`: listed (name, kind and source inode from `getdents`) but
/// never stat-ed: the attributes in the record are placeholders, never
/// handed out; a lookup or getattr stats the entry first.
const UNKNOWN: u8 = 2;
/// `Node::flags`: an unknown entry whose stat-ahead was started (not
/// started again; cleared with `UNKNOWN`).
const AHEAD: u8 = 4;
/// `Node::flags`: the kernel opened this file at the version in the record
/// and has held the inode since, so the pages it caches are of this
/// version (FUSE's keep_cache). Cleared when the version changes and when
/// the kernel forgets the inode (its pages go with it). One bit here
/// instead of a table of versions by inode in the open-file table: 24
/// bytes plus a hash table's slack for every file ever opened.
const OPENED: u8 = 8;
/// `Node::flags`: the entry is in no directory run (it left the tree, and
/// the kernel still holds it): a server that attaches to the shared state
/// rebuilds each directory's runs from the nodes whose parent it is,
/// without these.
const DETACHED: u8 = 16;
/// `Node::flags`: the entry is in its directory's side run (found by a
/// lookup since the last listing), not the main one: the runs a new server
/// rebuilds give every entry the readdir position it had.
const SIDE: u8 = 32;
/// `Node::flags`: the entry's POSIX ACLs were read from the source (none,
/// unless the ACL log of the shared state has a value for it: see
/// [`AclEntry`]): kept, like the attributes, as the last known answer, and
/// by a server that attaches to the shared state. Set only once the log
/// says the value read, so that no server answers "no ACL" for an entry
/// that has one.
const ACL_KNOWN: u8 = 64;
/// `Node::flags`: the ACLs were read since the attributes last were (a
/// fresh read of the attributes clears it): they are answered without
/// asking the source while the attributes are fresh.
const ACL_FRESH: u8 = 128;
/// `Node::checked` counts ticks of this many ms since the namespace started
/// (u32: 2.2 years). Rounded down, so an entry is revalidated up to one tick
/// early, never late.
const TICK_MS: u64 = 16;
/// Dead name bytes below which the arena is never compacted.
const COMPACT_MIN: usize = 1 << 20;

/// One inode: 48 bytes, no heap of its own. It lives in the shared state
/// (`shm`), so its layout is fixed (`repr(C)`).
///
/// atime and ctime are not kept: both are answered as mtime (what rclone
/// and mountpoint-s3 answer too; training loaders read neither). st_blocks
/// is kept exactly, as a code (see [`blocks_code`]).
#[derive(Debug)]
#[repr(C)]
struct Node {
    /// A file's size; a directory's index in `Inner::dirs` (`NO_DIR` when
    /// it has none), its size being kept in its `Dir`.
    size: u64,
    mtime_ns: i64,
    /// The source's inode number.
    src_ino: u64,
    parent: u32,
    /// The name: `name_len` bytes at `name_off` in `Inner::names`.
    name_off: u32,
    /// When the attributes were last read from the source (ticks).
    checked: u32,
    /// The kernel's lookup count (FORGET takes it back); counted under the
    /// read lock.
    lookups: AtomicU32,
    /// Index in `Inner::classes`: (mode, uid, gid, nlink, rdev).
    class: u32,
    /// st_blocks as a function of the size ([`blocks_code`]).
    blocks: u8,
    name_len: u8,
    kind: u8,
    /// `GONE`, `UNKNOWN`, `AHEAD`, `OPENED`, `DETACHED`, `SIDE`,
    /// `ACL_KNOWN`, `ACL_FRESH`.
    flags: u8,
}

// SAFETY: repr(C), plain integers (and an atomic integer), no padding.
unsafe impl Pod for Node {}

/// What a directory keeps in the shared state beside its node (by
/// directory index): its size, and when it was last listed in full
/// (`NEVER`: not since the mount). The rest of [`Dir`] is rebuilt.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
struct DirMeta {
    size: u64,
    listed_ms: u64,
}

// SAFETY: repr(C), two integers.
unsafe impl Pod for DirMeta {}

/// `DirMeta::listed_ms` of a directory not listed in full.
const NEVER: u64 = u64::MAX;

/// An entry of the ACL log in the shared state (`Region::AclLog`): from
/// now on, inode `ino` has the ACL value at `off` in `Region::AclValues`
/// ([`NO_ACL`]: none). The last entry of an inode wins. An entry is
/// logged only when its ACL is read and differs from what the log says,
/// so entries without an ACL are not in the log at all (their
/// [`ACL_KNOWN`] bit says it); the log and the values are rewritten
/// ([`Inner::compact_acls`]) when either has doubled since the last
/// rewrite.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
struct AclEntry {
    ino: u32,
    off: u32,
}

// SAFETY: repr(C), two integers.
unsafe impl Pod for AclEntry {}

/// `AclEntry::off`: the entry has no ACL (any more).
const NO_ACL: u32 = u32::MAX;
/// Log entries and value bytes below which the ACL tables are never
/// rewritten.
const ACL_LOG_MIN: usize = 1024;
const ACL_VALUES_MIN: usize = 64 << 10;

/// An ACL value as `Region::AclValues` holds it: for the access ACL, then
/// the default one, a u32 (little-endian) length (`u32::MAX`: none) and
/// the bytes.
fn encode_acls(a: &Acls) -> Vec<u8> {
    let mut out = Vec::new();
    for part in [&a.access, &a.default] {
        match part {
            Some(b) => {
                out.extend_from_slice(&(b.len() as u32).to_le_bytes());
                out.extend_from_slice(b);
            }
            None => out.extend_from_slice(&u32::MAX.to_le_bytes()),
        }
    }
    out
}

/// The value [`encode_acls`] wrote at the start of `b`; None if `b` does
/// not hold a whole one.
fn decode_acls(b: &[u8]) -> Option<Acls> {
    let mut at = 0usize;
    let mut part = || -> Option<Option<Box<[u8]>>> {
        let len = u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?);
        at += 4;
        if len == u32::MAX {
            return Some(None);
        }
        let bytes = b.get(at..at.checked_add(len as usize)?)?;
        at += len as usize;
        Some(Some(bytes.into()))
    };
    let access = part()?;
    let default = part()?;
    Some(Acls { access, default })
}

/// A source inode whose st_blocks is not its size rounded to a unit
/// (`BLOCKS_OTHER`), as stored in the shared state: a log, the last entry
/// of an inode wins.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
struct OddBlocks {
    src_ino: u64,
    blocks: u64,
}

// SAFETY: repr(C), two integers.
unsafe impl Pod for OddBlocks {}

impl Node {
    /// Whether the attributes were read from the source (not only listed).
    fn known(&self) -> bool {
        self.flags & UNKNOWN == 0
    }

    fn is_dir(&self) -> bool {
        self.kind == kind_code(EntryKind::Dir)
    }

    /// Index in `Inner::dirs`, or `NO_DIR` (a directory's kind never
    /// changes: `Inner::set_attr` keeps it).
    fn dir(&self) -> u32 {
        if self.is_dir() {
            u32::try_from(self.size).unwrap_or(NO_DIR)
        } else {
            NO_DIR
        }
    }
}

const _: () = assert!(std::mem::size_of::<Node>() == 48);

fn kind_code(k: EntryKind) -> u8 {
    match k {
        EntryKind::Dir => 0,
        EntryKind::File => 1,
        EntryKind::Symlink => 2,
        EntryKind::Other => 3,
    }
}

fn kind_of(code: u8) -> EntryKind {
    match code {
        0 => EntryKind::Dir,
        1 => EntryKind::File,
        2 => EntryKind::Symlink,
        _ => EntryKind::Other,
    }
}

/// The attributes held for an entry known only from a listing: its kind
/// and source inode, nothing else (never handed out; see `UNKNOWN`).
fn placeholder(kind: EntryKind, ino: u64) -> SourceAttr {
    let mode = match kind {
        EntryKind::Dir => libc::S_IFDIR,
        EntryKind::File => libc::S_IFREG,
        EntryKind::Symlink => libc::S_IFLNK,
        EntryKind::Other => 0,
    };
    SourceAttr {
        kind,
        size: 0,
        blocks: 0,
        mode,
        nlink: 1,
        uid: 0,
        gid: 0,
        rdev: 0,
        ino,
        atime_ns: 0,
        mtime_ns: 0,
        ctime_ns: 0,
    }
}

/// st_blocks held as `blocks_of(size, code)` with `code = blocks_code(size,
/// blocks)`: a file system allocates whole units of 512 << k bytes, so a
/// file's blocks are its size rounded up to its unit (k = 3 for ext4's and
/// xfs's 4 KiB) for almost every file. The few others (sparse or compressed
/// files, ext4's extent-tree blocks on large files) get `BLOCKS_OTHER` and
/// an entry in `Inner::odd_blocks`.
fn blocks_code(size: u64, blocks: u64) -> u8 {
    if blocks == 0 {
        return BLOCKS_ZERO;
    }
    (0..=BLOCKS_MAX_SHIFT)
        .find(|&k| blocks_of(size, k) == Some(blocks))
        .unwrap_or(BLOCKS_OTHER)
}

/// The blocks that `code` says for `size` (None for `BLOCKS_OTHER`).
fn blocks_of(size: u64, code: u8) -> Option<u64> {
    match code {
        BLOCKS_ZERO => Some(0),
        k if k <= BLOCKS_MAX_SHIFT => Some(size.div_ceil(512 << k) << k),
        _ => None,
    }
}

/// Allocation units tried: 512 bytes to 1 GiB.
const BLOCKS_MAX_SHIFT: u8 = 21;
const BLOCKS_ZERO: u8 = 254;
const BLOCKS_OTHER: u8 = 255;

/// A directory: its children (inode numbers sorted by name) and when it was
/// last listed in full, if ever.
///
/// A listing sets `children` in one piece. A name found by a lookup in a
/// directory not listed since goes into `side`, a second sorted run, which
/// is merged into `children` once it passes about the square root of their
/// number: n lookups of new names in a flat directory move O(n sqrt n)
/// entries, not O(n^2). A lookup searches both runs; `readdir` positions
/// count `children` first, then `side`.
///
/// `listed_ms` and `size` are copies of the directory's [`DirMeta`] in the
/// shared state (written through by [`Inner::set_dir_meta`]); the runs are
/// rebuilt from the nodes by a server that attaches ([`Inner::rebuild`]).
#[derive(Debug, Default)]
struct Dir {
    children: Vec<u32>,
    side: Vec<u32>,
    listed_ms: Option<u64>,
    /// The directory's own size (st_size) as the source gave it.
    size: u64,
    /// A large directory's sampled index into `children` (see [`Fence`]),
    /// built by the first lookup that needs it; dropped whenever
    /// `children` is rebuilt.
    fence: OnceLock<Box<Fence>>,
    /// Entries removed from `children` since it was last rebuilt: the
    /// fence stays usable, its windows widened by that many positions.
    removed: usize,
}

/// A directory of at least [`FENCE_MIN`] entries has a fence.
const FENCE_MIN: usize = 2048;
/// One fence key per this many children: 8 bytes per 64 entries.
const FENCE_STEP: usize = 64;

/// A sampled index of a large sorted run of names, so that a lookup in a
/// flat directory of a million files does not walk twenty random records
/// and names: the key of every 64th name, where a name's key is its 8
/// bytes after the prefix all the run's names share (big-endian, zero
/// padded: keys are in the names' order, ties allowed). A lookup searches
/// the keys (a dense array), then the names of the one or two windows of
/// 64 whose keys bound its own.
#[derive(Debug)]
struct Fence {
    /// The prefix every name of the run shares.
    prefix: Box<[u8]>,
    keys: Vec<u64>,
    /// `Dir::removed` when the fence was built.
    removed_at_build: usize,
}

impl Fence {
    /// The fence of `children` (sorted by name, not empty).
    fn build<'a>(children: &[u32], name_of: impl Fn(u32) -> &'a [u8], removed: usize) -> Fence {
        let first = children.first().map_or(&[][..], |&c| name_of(c));
        let last = children.last().map_or(&[][..], |&c| name_of(c));
        let skip = first.iter().zip(last).take_while(|(x, y)| x == y).count();
        let keys = children
            .iter()
            .step_by(FENCE_STEP)
            .map(|&c| fence_key(name_of(c).get(skip..).unwrap_or(&[])))
            .collect();
        Fence {
            prefix: first[..skip].into(),
            keys,
            removed_at_build: removed,
        }
    }

    /// The positions of the run (of `len` entries now, `removed` having
    /// gone since the build) where `name` can be; None: it is not there
    /// (it lacks the shared prefix).
    fn window(&self, name: &[u8], len: usize, removed: usize) -> Option<Range<usize>> {
        let k = fence_key(name.strip_prefix(&*self.prefix)?);
        let lo = self.keys.partition_point(|&f| f < k).saturating_sub(1) * FENCE_STEP;
        let hi = self.keys.partition_point(|&f| f <= k) * FENCE_STEP;
        // Removals only move entries toward the start.
        let shift = removed.saturating_sub(self.removed_at_build);
        Some(lo.saturating_sub(shift).min(len)..hi.min(len))
    }
}

fn fence_key(rest: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = rest.len().min(8);
    b[..n].copy_from_slice(&rest[..n]);
    u64::from_be_bytes(b)
}

/// Where a child is in its directory's runs.
#[derive(Clone, Copy, Debug)]
enum Slot {
    Main(usize),
    Side(usize),
}

/// The side run is merged when it has more entries than this or than the
/// square root of the main run's.
const SIDE_MIN: usize = 32;

impl Dir {
    /// The child at readdir position `i` (`children`, then `side`).
    fn get(&self, i: usize) -> Option<u32> {
        match i.checked_sub(self.children.len()) {
            None => self.children.get(i).copied(),
            Some(j) => self.side.get(j).copied(),
        }
    }

    fn len(&self) -> usize {
        self.children.len() + self.side.len()
    }

    fn at(&self, slot: Slot) -> u32 {
        match slot {
            Slot::Main(i) => self.children[i],
            Slot::Side(i) => self.side[i],
        }
    }

    fn set(&mut self, slot: Slot, ino: u32) {
        match slot {
            Slot::Main(i) => self.children[i] = ino,
            Slot::Side(i) => self.side[i] = ino,
        }
    }

    fn remove(&mut self, slot: Slot) -> u32 {
        match slot {
            Slot::Main(i) => {
                self.removed += 1;
                let widened = self
                    .fence
                    .get()
                    .is_some_and(|f| self.removed - f.removed_at_build > FENCE_STEP);
                if widened {
                    self.fence = OnceLock::new();
                }
                self.children.remove(i)
            }
            Slot::Side(i) => self.side.remove(i),
        }
    }

    /// Replaces the main run (a listing, a merge, a load): the fence goes.
    fn set_children(&mut self, children: Vec<u32>) {
        self.children = children;
        self.fence = OnceLock::new();
    }

    /// Whether the side run is due to be merged.
    fn side_full(&self) -> bool {
        let n = self.children.len();
        self.side.len() > SIDE_MIN && self.side.len() * self.side.len() > n
    }
}

/// (mode, uid, gid, nlink, rdev): shared by most entries of a data set.
type Class = [u32; 5];

#[derive(Debug)]
struct Inner {
    /// The shared state the tables below live in (its header: the
    /// intents, the live name arena).
    state: Arc<SharedState>,
    /// Node of inode `i` at index `i - 1`.
    nodes: ShmVec<Node>,
    /// Every name, back to back.
    names: Names,
    /// Bytes of `names` no node uses any more.
    dead_names: usize,
    /// Entries that left the tree since the last sweep.
    unlinked: u64,
    dirs: Vec<Dir>,
    /// Each directory's [`DirMeta`], by the same index as `dirs`.
    dir_meta: ShmVec<DirMeta>,
    /// Directories of gone nodes, free for the next directory.
    free_dirs: Vec<u32>,
    classes: ShmVec<Class>,
    class_ids: HashMap<Class, u32>,
    /// st_blocks of the source inodes whose blocks are not their size
    /// rounded to a unit (`BLOCKS_OTHER`): by source inode, which hard
    /// links share. Kept for the mount's life (one entry per such inode).
    odd_blocks: HashMap<u64, u64>,
    /// `odd_blocks` as the shared state keeps it (a log).
    odd_log: ShmVec<OddBlocks>,
    known_bytes: u64,
    /// Where `known_bytes` is published (the cache policy reads it).
    known_sink: Arc<AtomicU64>,
    /// Bumped on every change (so the manifest is saved only when needed).
    changes: u64,
    /// Child entries moved by inserts into, and merges of, directory runs
    /// (tests check that lookups are not quadratic).
    moves: u64,
    /// The POSIX ACLs of the entries known to have one, by inode: one map
    /// entry per such entry, the values shared; what the ACL log says for
    /// them (rebuilt from it by a server that attaches).
    acls: HashMap<u32, Arc<Acls>>,
    /// Every distinct ACL value held, each once (files under one default
    /// ACL all carry the same), with its offset in `acl_bytes`: pruned of
    /// values no entry holds when it has doubled since the last prune.
    acl_values: HashMap<Arc<Acls>, u32>,
    acl_values_pruned: usize,
    /// The ACL values and the ACL log in the shared state ([`AclEntry`]).
    acl_bytes: ShmVec<u8>,
    acl_log: ShmVec<AclEntry>,
    /// Entries whose ACL is not known ([`ACL_KNOWN`] clear) but for which
    /// the log has a value (a server killed between the log and the flag):
    /// the next read of their ACL is logged, whatever it is.
    acl_stale: HashSet<u32>,
    /// The sizes of the log and the values after their last rewrite.
    acl_compacted: (usize, usize),
    /// The answer for an entry without ACLs.
    no_acls: Arc<Acls>,
}

fn too_many() -> io::Error {
    io::Error::new(
        io::ErrorKind::OutOfMemory,
        "namespace full (2^32 inodes or 4 GiB of names)",
    )
}

/// The name arena: two regions of the shared state, one live
/// (`Header::names_active`), the other written by a compaction, then
/// switched to.
#[derive(Debug)]
struct Names {
    arenas: [ShmVec<u8>; 2],
}

impl Names {
    fn active(&self) -> usize {
        let h = self.arenas[0].state().header();
        h.names_active.load(Ordering::Acquire) as usize & 1
    }

    fn live(&self) -> &ShmVec<u8> {
        &self.arenas[self.active()]
    }

    fn len(&self) -> usize {
        self.live().len()
    }

    fn get(&self, r: Range<usize>) -> Option<&[u8]> {
        self.live().get(r)
    }

    fn extend_from_slice(&mut self, name: &[u8]) -> io::Result<()> {
        let a = self.active();
        self.arenas[a]
            .extend_from_slice(name)
            .map_err(|_| too_many())
    }
}

/// The tables of the namespace in `state`, and nothing else of it (its
/// derived indexes empty).
fn tables(state: &Arc<SharedState>, known_sink: Arc<AtomicU64>) -> io::Result<Inner> {
    let busy = || io::Error::other("the shared state's namespace is in use in this process");
    Ok(Inner {
        state: Arc::clone(state),
        nodes: state.vec(Region::Nodes).ok_or_else(busy)?,
        names: Names {
            arenas: [
                state.vec(Region::NamesA).ok_or_else(busy)?,
                state.vec(Region::NamesB).ok_or_else(busy)?,
            ],
        },
        dead_names: 0,
        unlinked: 0,
        dirs: Vec::new(),
        dir_meta: state.vec(Region::Dirs).ok_or_else(busy)?,
        free_dirs: Vec::new(),
        classes: state.vec(Region::Classes).ok_or_else(busy)?,
        class_ids: HashMap::new(),
        odd_blocks: HashMap::new(),
        odd_log: state.vec(Region::OddBlocks).ok_or_else(busy)?,
        known_bytes: 0,
        known_sink,
        changes: 0,
        moves: 0,
        acls: HashMap::new(),
        acl_values: HashMap::new(),
        acl_values_pruned: 0,
        acl_bytes: state.vec(Region::AclValues).ok_or_else(busy)?,
        acl_log: state.vec(Region::AclLog).ok_or_else(busy)?,
        acl_stale: HashSet::new(),
        acl_compacted: (0, 0),
        no_acls: Arc::default(),
    })
}

impl Inner {
    /// An empty namespace in `state`: whatever its tables held (a server
    /// that died while it built a namespace there) is dropped.
    fn new(state: &Arc<SharedState>, known_sink: Arc<AtomicU64>) -> io::Result<Self> {
        let h = state.header();
        h.ns_ready.store(0, Ordering::Release);
        let mut inner = tables(state, known_sink)?;
        inner.nodes.clear_and_release();
        for a in &mut inner.names.arenas {
            a.clear_and_release();
        }
        inner.dir_meta.clear_and_release();
        inner.classes.clear_and_release();
        inner.odd_log.clear_and_release();
        inner.acl_bytes.clear_and_release();
        inner.acl_log.clear_and_release();
        h.names_active.store(0, Ordering::Release);
        h.names_switching.store(0, Ordering::Release);
        h.intent_node.store(0, Ordering::Release);
        h.intent_dir.store(0, Ordering::Release);
        Ok(inner)
    }

    /// An empty namespace in a state of its own (nothing outlives it).
    #[cfg(test)]
    fn private(known_sink: Arc<AtomicU64>) -> Self {
        let state = SharedState::create().expect("memfd for the namespace");
        Inner::new(&state, known_sink).expect("a new state")
    }

    /// Writes a directory's size and listing time through to its
    /// [`DirMeta`] in the shared state.
    fn set_dir_meta(&mut self, d: u32, size: Option<u64>, listed_ms: Option<Option<u64>>) {
        let Some(dir) = self.dirs.get_mut(d as usize) else {
            return;
        };
        if let Some(s) = size {
            dir.size = s;
        }
        if let Some(l) = listed_ms {
            dir.listed_ms = l;
        }
        let meta = DirMeta {
            size: dir.size,
            listed_ms: dir.listed_ms.unwrap_or(NEVER),
        };
        if let Some(m) = self.dir_meta.get_mut(d as usize) {
            *m = meta;
        }
    }

    /// Marks `ino`'s record as in the middle of a change (until
    /// [`Inner::done_node`]): a server that finds the mark when it attaches
    /// reads the entry's attributes from the source again.
    fn intend_node(&self, ino: u64) {
        self.state.header().intent_node.store(ino, Ordering::SeqCst);
        // (the record's stores come after the mark, also for the compiler)
        std::sync::atomic::fence(Ordering::SeqCst);
    }

    fn done_node(&self) {
        std::sync::atomic::fence(Ordering::SeqCst);
        self.state.header().intent_node.store(0, Ordering::SeqCst);
    }

    /// Marks directory `ino`'s runs as in the middle of a change (until
    /// [`Inner::done_dir`]): a server that finds the mark when it attaches
    /// lists the directory again before it trusts its runs.
    fn intend_dir(&self, ino: u64) {
        self.state.header().intent_dir.store(ino, Ordering::SeqCst);
        std::sync::atomic::fence(Ordering::SeqCst);
    }

    fn done_dir(&self) {
        std::sync::atomic::fence(Ordering::SeqCst);
        self.state.header().intent_dir.store(0, Ordering::SeqCst);
    }

    /// The ACLs the namespace holds for `ino` (none if it holds none).
    fn acls_of(&self, ino: u64) -> Arc<Acls> {
        let live = self.node(ino).is_some();
        let held = live.then(|| self.acls.get(&(ino as u32))).flatten();
        held.map_or_else(|| Arc::clone(&self.no_acls), Arc::clone)
    }

    /// Stores `acls`, just read from the source, as `ino`'s: in the ACL
    /// log first (when it says otherwise), then the record's flags. If the
    /// shared state has no room for it, the entry's ACL is not held (it
    /// is read again at each ask).
    fn set_acls(&mut self, ino: u64, acls: Acls) -> Arc<Acls> {
        if self.node(ino).is_none() {
            return Arc::new(acls);
        }
        self.maybe_compact_acls();
        let key = ino as u32;
        let (value, off) = if acls.is_empty() {
            (Arc::clone(&self.no_acls), NO_ACL)
        } else {
            match self.acl_value(acls) {
                Ok(v) => v,
                Err(v) => return self.acls_unheld(ino, v),
            }
        };
        // What the log says for the entry now: `acls`' value if it holds
        // one, else none (no entry, or a NO_ACL one), unless it is stale.
        let logged = match self.acls.get(&key) {
            Some(held) => Arc::ptr_eq(held, &value),
            None => off == NO_ACL,
        };
        if !logged || self.acl_stale.contains(&key) {
            if self.acl_log.push(AclEntry { ino: key, off }).is_err() {
                return self.acls_unheld(ino, value);
            }
            self.acl_stale.remove(&key);
            // (the log's entry is published before the flag that trusts it)
            std::sync::atomic::fence(Ordering::SeqCst);
        }
        if value.is_empty() {
            self.acls.remove(&key);
        } else {
            self.acls.insert(key, Arc::clone(&value));
        }
        if let Some(n) = self.node_mut(ino) {
            n.flags |= ACL_KNOWN | ACL_FRESH;
        }
        value
    }

    /// `ino`'s ACL, `value`, could not be logged (the shared state's ACL
    /// tables are full): it is not held, and the log's entry for it, if
    /// any, no longer trusted.
    fn acls_unheld(&mut self, ino: u64, value: Arc<Acls>) -> Arc<Acls> {
        if let Some(n) = self.node_mut(ino) {
            n.flags &= !(ACL_KNOWN | ACL_FRESH);
        }
        if self.acls.remove(&(ino as u32)).is_some() {
            self.acl_stale.insert(ino as u32);
        }
        value
    }

    /// The shared copy of ACL value `acls` and its offset in the shared
    /// state's values (stored there if it is new); Err(the value) if there
    /// is no room.
    fn acl_value(&mut self, acls: Acls) -> Result<(Arc<Acls>, u32), Arc<Acls>> {
        if let Some((v, off)) = self.acl_values.get_key_value(&acls) {
            return Ok((Arc::clone(v), *off));
        }
        if self.acl_values.len() >= 2 * self.acl_values_pruned.max(32) {
            // (held by the map alone: no entry has it any more)
            self.acl_values.retain(|v, _| Arc::strong_count(v) > 1);
            self.acl_values_pruned = self.acl_values.len();
        }
        let v = Arc::new(acls);
        let bytes = encode_acls(&v);
        let Some(off) = u32::try_from(self.acl_bytes.len())
            .ok()
            .filter(|&o| o != NO_ACL)
        else {
            return Err(v);
        };
        if self.acl_bytes.extend_from_slice(&bytes).is_err() {
            return Err(v);
        }
        self.acl_values.insert(Arc::clone(&v), off);
        Ok((v, off))
    }

    /// Rewrites the ACL log and values with only what the entries hold
    /// now, once either has doubled since the last rewrite. The entries
    /// that hold a value lose their [`ACL_KNOWN`] bit first and get it
    /// back once the new log has them: a server killed half way reads
    /// their ACLs again, and never takes one for "none".
    fn maybe_compact_acls(&mut self) {
        let (log0, bytes0) = self.acl_compacted;
        let due = self.acl_log.len() >= 2 * log0.max(ACL_LOG_MIN)
            || self.acl_bytes.len() >= 2 * bytes0.max(ACL_VALUES_MIN);
        if due {
            self.compact_acls();
        }
    }

    fn compact_acls(&mut self) {
        let mut held: Vec<(u32, Arc<Acls>, u8)> = Vec::with_capacity(self.acls.len());
        for (ino, v) in std::mem::take(&mut self.acls) {
            if let Some(n) = self.node_mut(ino as u64) {
                let flags = n.flags & (ACL_KNOWN | ACL_FRESH);
                n.flags &= !(ACL_KNOWN | ACL_FRESH);
                held.push((ino, v, flags));
            }
        }
        std::sync::atomic::fence(Ordering::SeqCst);
        // (entries not known are read again anyway: their old values go)
        self.acl_stale.clear();
        self.acl_log.clear_and_release();
        self.acl_bytes.clear_and_release();
        self.acl_values.clear();
        for (ino, v, flags) in held {
            let off = match self.acl_values.get(&v) {
                Some(&off) => Some(off),
                None => {
                    let off = u32::try_from(self.acl_bytes.len()).ok();
                    let stored = self.acl_bytes.extend_from_slice(&encode_acls(&v)).is_ok();
                    let off = off.filter(|_| stored);
                    if let Some(off) = off {
                        self.acl_values.insert(Arc::clone(&v), off);
                    }
                    off
                }
            };
            let Some(off) = off else { continue };
            if self.acl_log.push(AclEntry { ino, off }).is_err() {
                continue;
            }
            std::sync::atomic::fence(Ordering::SeqCst);
            if let Some(n) = self.node_mut(ino as u64) {
                n.flags |= flags;
            }
            self.acls.insert(ino, v);
        }
        self.acl_values_pruned = self.acl_values.len();
        self.acl_compacted = (self.acl_log.len(), self.acl_bytes.len());
    }

    /// Rebuilds the ACL maps from the shared state's log (a server that
    /// attaches): each live entry's last logged value is held if its
    /// [`ACL_KNOWN`] bit is set; one whose value cannot be read back is
    /// read from the source again.
    fn rebuild_acls(&mut self) {
        let mut last: HashMap<u32, u32> = HashMap::new();
        for e in self.acl_log.iter() {
            last.insert(e.ino, e.off);
        }
        let mut by_off: HashMap<u32, Option<Arc<Acls>>> = HashMap::new();
        for (ino, off) in last {
            let Some(n) = self.node(ino as u64) else {
                continue;
            };
            let known = n.flags & ACL_KNOWN != 0;
            if off == NO_ACL {
                continue;
            }
            let bytes = &self.acl_bytes;
            let value = by_off
                .entry(off)
                .or_insert_with(|| {
                    let v = decode_acls(bytes.get(off as usize..)?)?;
                    (!v.is_empty()).then(|| Arc::new(v))
                })
                .clone();
            match value {
                Some(v) if known => {
                    self.acl_values.insert(Arc::clone(&v), off);
                    self.acls.insert(ino, v);
                }
                Some(_) => {
                    self.acl_stale.insert(ino);
                }
                None => {
                    self.acl_stale.insert(ino);
                    if let Some(n) = self.node_mut(ino as u64) {
                        n.flags &= !(ACL_KNOWN | ACL_FRESH);
                    }
                }
            }
        }
        // (an entry whose bit was set without a logged value: none)
        self.acl_values_pruned = self.acl_values.len();
        self.acl_compacted = (self.acl_log.len(), self.acl_bytes.len());
    }

    /// The node of `ino`; None if there is none or it is gone.
    fn node(&self, ino: u64) -> Option<&Node> {
        let i = usize::try_from(ino.checked_sub(1)?).ok()?;
        self.nodes.get(i).filter(|n| n.flags & GONE == 0)
    }

    fn node_mut(&mut self, ino: u64) -> Option<&mut Node> {
        let i = usize::try_from(ino.checked_sub(1)?).ok()?;
        self.nodes.get_mut(i).filter(|n| n.flags & GONE == 0)
    }

    fn name(&self, n: &Node) -> &[u8] {
        let at = n.name_off as usize;
        self.names.get(at..at + n.name_len as usize).unwrap_or(&[])
    }

    fn name_of(&self, ino: u64) -> &[u8] {
        self.node(ino).map(|n| self.name(n)).unwrap_or(&[])
    }

    fn dir(&self, n: &Node) -> Option<&Dir> {
        self.dirs.get(n.dir() as usize)
    }

    fn dir_of(&self, ino: u64) -> Option<&Dir> {
        self.dir(self.node(ino)?)
    }

    fn dir_mut(&mut self, ino: u64) -> Option<&mut Dir> {
        let d = self.node(ino)?.dir();
        self.dirs.get_mut(d as usize)
    }

    fn attr(&self, n: &Node) -> SourceAttr {
        let [mode, uid, gid, nlink, rdev] = self.classes[n.class as usize];
        let size = if n.is_dir() {
            self.dir(n).map_or(0, |d| d.size)
        } else {
            n.size
        };
        let blocks = blocks_of(size, n.blocks)
            .or_else(|| self.odd_blocks.get(&n.src_ino).copied())
            .unwrap_or(size.div_ceil(512));
        SourceAttr {
            kind: kind_of(n.kind),
            size,
            blocks,
            mode,
            nlink,
            uid,
            gid,
            rdev,
            ino: n.src_ino,
            atime_ns: n.mtime_ns,
            mtime_ns: n.mtime_ns,
            ctime_ns: n.mtime_ns,
        }
    }

    fn attr_of(&self, ino: u64) -> Option<SourceAttr> {
        Some(self.attr(self.node(ino)?))
    }

    /// The attributes of `ino` if they were ever read from the source (an
    /// entry only listed has none to answer with).
    fn known_attr_of(&self, ino: u64) -> Option<SourceAttr> {
        let n = self.node(ino)?;
        n.known().then(|| self.attr(n))
    }

    fn class(&mut self, a: &SourceAttr) -> io::Result<u32> {
        let key = [a.mode, a.uid, a.gid, a.nlink, a.rdev];
        if let Some(id) = self.class_ids.get(&key) {
            return Ok(*id);
        }
        let id = self.classes.len() as u32;
        self.classes.push(key).map_err(|_| too_many())?;
        self.class_ids.insert(key, id);
        Ok(id)
    }

    /// Stores `a` as the attributes of `ino`, checked at `now` (ms).
    fn set_attr(&mut self, ino: u64, a: &SourceAttr, now: u64) -> io::Result<()> {
        let class = self.class(a)?;
        let blocks = blocks_code(a.size, a.blocks);
        if blocks == BLOCKS_OTHER && self.odd_blocks.insert(a.ino, a.blocks) != Some(a.blocks) {
            // (full: this mount still knows; a restarted server answers
            // the size rounded up)
            let _ = self.odd_log.push(OddBlocks {
                src_ino: a.ino,
                blocks: a.blocks,
            });
        }
        if self.node(ino).is_none() {
            return Ok(());
        }
        // Several stores to one record: marked until done.
        self.intend_node(ino);
        let dir_size = self.set_node_attr(ino, a, class, blocks, now);
        if let Some(d) = dir_size {
            self.set_dir_meta(d, Some(a.size), None);
        }
        self.done_node();
        Ok(())
    }

    /// The stores of [`Inner::set_attr`] to the record (`checked` last);
    /// a directory's index if its size is to be stored in its `DirMeta`.
    fn set_node_attr(
        &mut self,
        ino: u64,
        a: &SourceAttr,
        class: u32,
        blocks: u8,
        now: u64,
    ) -> Option<u32> {
        let n = self.node_mut(ino)?;
        if !Namespace::is_version(n, &a.version()) {
            // The kernel's pages, if any, are of the old version. (A
            // directory or a listed, never stat-ed entry was never opened.)
            n.flags &= !OPENED;
        }
        n.blocks = blocks;
        n.mtime_ns = a.mtime_ns;
        n.src_ino = a.ino;
        n.class = class;
        // The ACLs are read again after the attributes (the last known
        // ones stay, for when the source does not answer).
        n.flags &= !(UNKNOWN | AHEAD | ACL_FRESH);
        // (a listed kind is the stat's but where d_type lied; never
        // between directory and not: callers replace such an entry)
        if n.is_dir() == (a.kind == EntryKind::Dir) {
            n.kind = kind_code(a.kind);
        }
        let dir = if n.is_dir() {
            Some(n.dir())
        } else {
            n.size = a.size;
            None
        };
        n.checked = (now / TICK_MS).min(u32::MAX as u64) as u32;
        dir
    }

    fn path(&self, mut ino: u64) -> Option<PathBuf> {
        let mut parts: Vec<&[u8]> = Vec::new();
        while ino != ROOT {
            let n = self.node(ino)?;
            parts.push(self.name(n));
            ino = n.parent as u64;
        }
        let mut p = PathBuf::new();
        for part in parts.iter().rev() {
            p.push(OsStr::from_bytes(part));
        }
        Some(p)
    }

    /// Where `name` is among `dir`'s children, if it is; else the position
    /// in the side run where it would go.
    fn find_child(&self, dir: &Dir, name: &[u8]) -> Result<Slot, usize> {
        let by_name = |c: &u32| self.name_of(*c as u64).cmp(name);
        let n = dir.children.len();
        if n >= FENCE_MIN {
            let fence = dir.fence.get_or_init(|| {
                let name_of = |c: u32| self.name_of(c as u64);
                Box::new(Fence::build(&dir.children, name_of, dir.removed))
            });
            if let Some(w) = fence.window(name, n, dir.removed) {
                if let Ok(i) = dir.children[w.clone()].binary_search_by(by_name) {
                    return Ok(Slot::Main(w.start + i));
                }
            }
        } else if let Ok(i) = dir.children.binary_search_by(by_name) {
            return Ok(Slot::Main(i));
        }
        dir.side.binary_search_by(by_name).map(Slot::Side)
    }

    /// The inode of child `name` of `dir`, if there is one.
    fn child(&self, dir: &Dir, name: &[u8]) -> Option<u64> {
        self.find_child(dir, name).ok().map(|s| dir.at(s) as u64)
    }

    /// Merges directory `ino`'s side run into its main run: a binary
    /// search per side entry and one copy of the main run.
    fn merge_side(&mut self, ino: u64) {
        let Some(dir) = self.dir_mut(ino) else { return };
        let side = std::mem::take(&mut dir.side);
        let main = std::mem::take(&mut dir.children);
        let mut merged = Vec::with_capacity(main.len() + side.len());
        let mut from = 0;
        for s in &side {
            let name = self.name_of(*s as u64);
            let rest = &main[from..];
            let at = from + rest.partition_point(|c| self.name_of(*c as u64) < name);
            merged.extend_from_slice(&main[from..at]);
            merged.push(*s);
            from = at;
        }
        merged.extend_from_slice(&main[from..]);
        self.moves += merged.len() as u64;
        // (callers hold the directory's intent: the flags may be cleared
        // one by one)
        for s in &side {
            if let Some(n) = self.node_mut(*s as u64) {
                n.flags &= !SIDE;
            }
        }
        if let Some(dir) = self.dir_mut(ino) {
            dir.set_children(merged);
        }
    }

    fn account(&mut self, old: Option<&SourceAttr>, new: Option<&SourceAttr>) {
        let size = |a: Option<&SourceAttr>| match a {
            Some(a) if a.kind == EntryKind::File => a.size,
            _ => 0,
        };
        self.changes += 1;
        self.known_bytes = (self.known_bytes + size(new)).saturating_sub(size(old));
        self.known_sink.store(self.known_bytes, Ordering::Relaxed);
        self.state
            .header()
            .known_bytes
            .store(self.known_bytes, Ordering::Relaxed);
    }

    /// A new inode `name` under `parent` (not linked into its listing).
    fn push(&mut self, parent: u64, name: &[u8], attr: SourceAttr, now: u64) -> io::Result<u64> {
        self.push_flagged(parent, name, attr, now, 0)
    }

    /// [`Inner::push`] with `flags` set in the record from the start. The
    /// record is whole (attributes, flags, a directory's `DirMeta`) before
    /// the push that publishes it: a server that dies at any point leaves
    /// no half-made entry.
    fn push_flagged(
        &mut self,
        parent: u64,
        name: &[u8],
        attr: SourceAttr,
        now: u64,
        flags: u8,
    ) -> io::Result<u64> {
        let name_len = u8::try_from(name.len())
            .map_err(|_| io::Error::from_raw_os_error(libc::ENAMETOOLONG))?;
        let name_off = u32::try_from(self.names.len()).map_err(|_| too_many())?;
        if self.names.len() + name.len() > u32::MAX as usize
            || self.nodes.len() >= u32::MAX as usize - 1
        {
            return Err(too_many());
        }
        let parent = u32::try_from(parent).map_err(|_| too_many())?;
        let class = self.class(&attr)?;
        let blocks = blocks_code(attr.size, attr.blocks);
        if blocks == BLOCKS_OTHER
            && self.odd_blocks.insert(attr.ino, attr.blocks) != Some(attr.blocks)
        {
            let _ = self.odd_log.push(OddBlocks {
                src_ino: attr.ino,
                blocks: attr.blocks,
            });
        }
        // The name and the directory first; the node that uses them last
        // (its push publishes it).
        self.names.extend_from_slice(name)?;
        let dir = if attr.kind == EntryKind::Dir {
            match self.free_dirs.pop() {
                Some(d) => {
                    self.dirs[d as usize] = Dir::default();
                    self.set_dir_meta(d, Some(attr.size), Some(None));
                    d
                }
                None => {
                    self.dir_meta
                        .push(DirMeta {
                            size: attr.size,
                            listed_ms: NEVER,
                        })
                        .map_err(|_| too_many())?;
                    self.dirs.push(Dir {
                        size: attr.size,
                        ..Dir::default()
                    });
                    (self.dirs.len() - 1) as u32
                }
            }
        } else {
            NO_DIR
        };
        let pushed = self.nodes.push(Node {
            // (a directory's index in `dirs`: see `Node::size`)
            size: if dir == NO_DIR { attr.size } else { dir as u64 },
            mtime_ns: attr.mtime_ns,
            src_ino: attr.ino,
            parent,
            name_off,
            checked: (now / TICK_MS).min(u32::MAX as u64) as u32,
            lookups: AtomicU32::new(0),
            class,
            blocks,
            name_len,
            kind: kind_code(attr.kind),
            flags,
        });
        if pushed.is_err() {
            if dir != NO_DIR {
                self.free_dirs.push(dir);
            }
            return Err(too_many());
        }
        self.account(None, Some(&attr));
        Ok(self.nodes.len() as u64)
    }

    /// A new inode `name` under `parent` known only from a listing (its
    /// kind and source inode): attributes unknown until it is stat-ed.
    fn push_listed(
        &mut self,
        parent: u64,
        name: &[u8],
        kind: EntryKind,
        src_ino: u64,
    ) -> io::Result<u64> {
        self.push_flagged(parent, name, placeholder(kind, src_ino), 0, UNKNOWN)
    }

    /// The attributes of `ino` are not known (a listed entry, or one a
    /// manifest saved as such): it is stat-ed before they are handed out.
    fn mark_unknown(&mut self, ino: u64) {
        if let Some(n) = self.node_mut(ino) {
            n.flags |= UNKNOWN;
            n.checked = 0;
        }
    }

    /// Updates or replaces the child `name` of `parent` with a fresh `attr`;
    /// returns its inode.
    fn upsert_child(
        &mut self,
        parent: u64,
        name: &[u8],
        attr: SourceAttr,
        now: u64,
    ) -> io::Result<u64> {
        let pos = {
            let dir = self.dir_of(parent).ok_or_else(enoent)?;
            self.find_child(dir, name).map(|s| (s, dir.at(s) as u64))
        };
        match pos {
            Ok((slot, ino)) => {
                let old = self.attr_of(ino).ok_or_else(enoent)?;
                // (an entry only listed has getdents' inode number, a hint:
                // its first stat says which object it is)
                let listed = self.node(ino).is_some_and(|n| !n.known());
                if (old.kind == EntryKind::Dir) == (attr.kind == EntryKind::Dir)
                    && (old.ino == attr.ino || listed)
                {
                    self.account(Some(&old), Some(&attr));
                    self.set_attr(ino, &attr, now)?;
                    Ok(ino)
                } else {
                    // Replaced by another object: a new inode.
                    self.intend_dir(parent);
                    let r = self.replace_child(parent, name, slot, ino, &old, attr, now);
                    self.done_dir();
                    r
                }
            }
            Err(i) => {
                self.intend_dir(parent);
                let r = self.insert_side(parent, name, i, attr, now);
                self.done_dir();
                r
            }
        }
    }

    /// The child `ino` at `slot` of `parent` is another object now: a new
    /// inode takes its place in the run.
    #[allow(clippy::too_many_arguments)]
    fn replace_child(
        &mut self,
        parent: u64,
        name: &[u8],
        slot: Slot,
        ino: u64,
        old: &SourceAttr,
        attr: SourceAttr,
        now: u64,
    ) -> io::Result<u64> {
        self.account(Some(old), None);
        let side = if matches!(slot, Slot::Side(_)) {
            SIDE
        } else {
            0
        };
        let new = self.push_flagged(parent, name, attr, now, side)?;
        self.dir_mut(parent)
            .ok_or_else(enoent)?
            .set(slot, new as u32);
        self.unlinked(ino);
        Ok(new)
    }

    /// A name new to `parent` goes into its side run at `i` (merged into
    /// the main run when the side run is full).
    fn insert_side(
        &mut self,
        parent: u64,
        name: &[u8],
        i: usize,
        attr: SourceAttr,
        now: u64,
    ) -> io::Result<u64> {
        let new = self.push_flagged(parent, name, attr, now, SIDE)?;
        let dir = self.dir_mut(parent).ok_or_else(enoent)?;
        let moved = dir.side.len() - i;
        dir.side.insert(i, new as u32);
        let full = dir.side_full();
        self.moves += moved as u64;
        if full {
            self.merge_side(parent);
        }
        Ok(new)
    }

    /// Calls `f(parent, node)` for every node of the tree, that is every
    /// node reachable from the root through its parents' child lists:
    /// parents before their children, children in readdir order, the root
    /// first (as its own parent). Nodes are numbered 1, 2, ... in that
    /// order, and `parent` is the parent's number, not its inode. A node
    /// unlinked from its parent (deleted, or replaced by another object),
    /// and with it the subtree of a directory, is not visited.
    fn for_each_in_tree(&self, mut f: impl FnMut(u64, &Node)) {
        let Some(root) = self.node(ROOT) else {
            return;
        };
        f(ROOT, root);
        let mut numbered = ROOT;
        // (directory inode, its number, index of its next child)
        let mut stack: Vec<(u64, u64, usize)> = vec![(ROOT, ROOT, 0)];
        while let Some(top) = stack.last_mut() {
            let (dir, number, next) = *top;
            let child = self.dir_of(dir).and_then(|d| d.get(next));
            let Some(c) = child else {
                stack.pop();
                continue;
            };
            let c = c as u64;
            top.2 += 1;
            // A child is always a younger inode than its parent, which
            // also rules out cycles.
            let Some(n) = self.node(c).filter(|n| c > dir && n.parent as u64 == dir) else {
                continue;
            };
            numbered += 1;
            f(number, n);
            if n.dir() != NO_DIR {
                stack.push((c, numbered, 0));
            }
        }
    }

    /// Calls `f(ino)` for every inode of the tree (as
    /// [`Inner::for_each_in_tree`] finds them).
    fn for_each_in_tree_ino(&self, mut f: impl FnMut(u64)) {
        if self.node(ROOT).is_none() {
            return;
        }
        f(ROOT);
        let mut stack: Vec<(u64, usize)> = vec![(ROOT, 0)];
        while let Some(top) = stack.last_mut() {
            let (dir, next) = *top;
            let Some(c) = self.dir_of(dir).and_then(|d| d.get(next)) else {
                stack.pop();
                continue;
            };
            let c = c as u64;
            top.1 += 1;
            let Some(n) = self.node(c).filter(|n| c > dir && n.parent as u64 == dir) else {
                continue;
            };
            f(c);
            if n.dir() != NO_DIR {
                stack.push((c, 0));
            }
        }
    }

    fn remove_child(&mut self, parent: u64, name: &[u8]) {
        let pos = match self.dir_of(parent) {
            Some(dir) => self.find_child(dir, name),
            None => return,
        };
        if let Ok(slot) = pos {
            let Some(dir) = self.dir_mut(parent) else {
                return;
            };
            let ino = dir.remove(slot);
            let old = self.attr_of(ino as u64);
            self.account(old.as_ref(), None);
            self.intend_dir(parent);
            self.unlinked(ino as u64);
            self.done_dir();
        }
    }

    /// Takes inode `ino` out of its parent's listing, if it is still there:
    /// the source no longer has it at its path.
    fn unlink(&mut self, ino: u64) {
        let Some(n) = self.node(ino) else { return };
        let parent = n.parent as u64;
        let name = self.name(n).to_vec();
        let here = self.dir_of(parent).and_then(|d| self.child(d, &name));
        if ino != ROOT && here == Some(ino) {
            self.remove_child(parent, &name);
        }
    }

    /// Whether `ino` is in the tree: each node up to the root is the child
    /// its parent lists under its name.
    fn reachable(&self, mut ino: u64) -> bool {
        while ino != ROOT {
            let Some(n) = self.node(ino) else {
                return false;
            };
            let parent = n.parent as u64;
            let here = self
                .dir_of(parent)
                .and_then(|d| self.child(d, self.name(n)));
            if here != Some(ino) {
                return false;
            }
            ino = parent;
        }
        true
    }

    /// The kernel took back `n` lookups of `ino`. An entry out of the tree
    /// that the kernel no longer knows is gone for good: its name (and a
    /// directory's listing) is dropped.
    fn forget(&mut self, ino: u64, n: u64) {
        let Some(node) = self.node_mut(ino) else {
            return;
        };
        let left = node.lookups.get_mut();
        *left = left.saturating_sub(n.min(u32::MAX as u64) as u32);
        if *left > 0 {
            return;
        }
        // The kernel's inode, and its pages, are gone.
        node.flags &= !OPENED;
        if ino == ROOT || self.reachable(ino) {
            return;
        }
        self.mark_gone(ino);
    }

    /// `ino` just left the tree: gone at once if the kernel does not hold
    /// it (else when it forgets it).
    fn unlinked(&mut self, ino: u64) {
        self.unlinked += 1;
        if let Some(n) = self.node_mut(ino) {
            n.flags |= DETACHED;
        }
        let unused = self
            .node(ino)
            .is_some_and(|n| n.lookups.load(Ordering::Relaxed) == 0);
        if unused && ino != ROOT {
            self.mark_gone(ino);
        }
    }

    /// Every node out of the tree that the kernel does not hold is gone (a
    /// deleted directory's subtree, whose entries the kernel forgot before
    /// it left the tree). One pass over the table.
    fn sweep(&mut self) {
        let mut reachable = crate::meta::epoch::BitSet::default();
        self.for_each_in_tree_ino(|ino| {
            reachable.insert(ino);
        });
        for ino in 2..=self.nodes.len() as u64 {
            let unused = self
                .node(ino)
                .is_some_and(|n| n.lookups.load(Ordering::Relaxed) == 0);
            if unused && !reachable.contains(ino) {
                self.mark_gone(ino);
            }
        }
        self.unlinked = 0;
    }

    /// Drops all of `ino` but its inode number.
    fn mark_gone(&mut self, ino: u64) {
        let Some(i) = ino.checked_sub(1).map(|i| i as usize) else {
            return;
        };
        let Some(node) = self.nodes.get_mut(i).filter(|n| n.flags & GONE == 0) else {
            return;
        };
        // GONE first: a server that attaches takes the record for gone
        // whatever of the rest was done.
        node.flags |= GONE;
        self.acls.remove(&(ino as u32));
        self.dead_names += node.name_len as usize;
        node.name_len = 0;
        let d = node.dir();
        if node.is_dir() {
            node.size = NO_DIR as u64;
        }
        if let Some(dir) = self.dirs.get_mut(d as usize) {
            *dir = Dir::default();
            self.set_dir_meta(d, Some(0), Some(None));
            self.free_dirs.push(d);
        }
        if self.dead_names >= COMPACT_MIN && self.dead_names * 2 >= self.names.len() {
            self.compact_names();
        }
    }

    /// Rewrites the name arena without the names of gone nodes: into the
    /// other arena, then the records' offsets, then the switch. A server
    /// killed while the offsets are rewritten finds `names_switching` set
    /// and the other arena whole, and redoes the offsets
    /// ([`Inner::finish_switch`]: they are the running sum of the lengths of
    /// the records not gone, in record order).
    fn compact_names(&mut self) {
        let from = self.names.active();
        let to = 1 - from;
        let [a, b] = &mut self.names.arenas;
        let (old, new) = if from == 0 { (&*a, b) } else { (&*b, a) };
        new.clear_and_release();
        for n in self.nodes.iter().filter(|n| n.flags & GONE == 0) {
            let at = n.name_off as usize;
            let name = old.get(at..at + n.name_len as usize).unwrap_or(&[]);
            // (never full: the new arena is smaller than the old)
            let _ = new.extend_from_slice(name);
        }
        let h = self.state.header();
        h.names_switching.store(to as u32 + 1, Ordering::Release);
        self.finish_switch(to);
        self.dead_names = 0;
    }

    /// Points every record not gone at its name in arena `to` (written
    /// whole by a compaction; `names_switching` is `to + 1` meanwhile),
    /// switches to it and frees the other.
    fn finish_switch(&mut self, to: usize) {
        let mut off = 0u32;
        for n in self.nodes.iter_mut().filter(|n| n.flags & GONE == 0) {
            n.name_off = off;
            off += n.name_len as u32;
        }
        let h = self.state.header();
        h.names_active.store(to as u32, Ordering::Release);
        h.names_switching.store(0, Ordering::Release);
        self.names.arenas[1 - to].clear_and_release();
    }

    /// Rebuilds what a server keeps beside the shared tables (each
    /// directory's runs, the free directories, the interned classes' map,
    /// the odd blocks' map, the byte counts) from the tables an earlier
    /// server left, and undoes what it was in the middle of: a name
    /// compaction is finished; an entry whose record was being changed is
    /// read from the source again before it is answered; a directory whose
    /// runs were being changed is listed again, its entries' attributes
    /// revalidated. One pass over the records, then a sort of each run by
    /// name (the records of a run are nearly in name order already: a
    /// listing adds its new entries in order).
    fn rebuild(&mut self) {
        let h = Arc::clone(&self.state);
        let h = h.header();
        match h.names_switching.load(Ordering::Acquire) {
            0 => {
                // (a compaction that had not finished writing the other arena)
                let other = 1 - self.names.active();
                if !self.names.arenas[other].is_empty() {
                    self.names.arenas[other].clear_and_release();
                }
            }
            t => self.finish_switch((t - 1) as usize & 1),
        }
        let node_intent = h.intent_node.swap(0, Ordering::AcqRel);
        let dir_intent = h.intent_dir.swap(0, Ordering::AcqRel);
        if let Some(n) = self.node_mut(node_intent) {
            n.flags |= UNKNOWN;
            n.checked = 0;
        }
        self.dirs = self
            .dir_meta
            .iter()
            .map(|m| Dir {
                size: m.size,
                listed_ms: (m.listed_ms != NEVER).then_some(m.listed_ms),
                ..Dir::default()
            })
            .collect();
        self.class_ids = self
            .classes
            .iter()
            .enumerate()
            .map(|(i, c)| (*c, i as u32))
            .collect();
        self.odd_blocks = self.odd_log.iter().map(|o| (o.src_ino, o.blocks)).collect();
        let mut used_dirs = vec![false; self.dirs.len()];
        let (mut live_names, mut detached) = (0usize, 0u64);
        for i in 0..self.nodes.len() {
            let ino = i as u64 + 1;
            let n = &self.nodes[i];
            if n.flags & GONE != 0 {
                continue;
            }
            live_names += n.name_len as usize;
            if n.is_dir() {
                if let Some(u) = used_dirs.get_mut(n.dir() as usize) {
                    *u = true;
                }
            }
            if ino == ROOT {
                continue;
            }
            // A child is younger than its parent, which is a live directory.
            let parent = n.parent as u64;
            let pd = self
                .node(parent)
                .filter(|p| parent < ino && p.is_dir())
                .map(|p| p.dir() as usize);
            let side = n.flags & SIDE != 0;
            match pd.and_then(|d| self.dirs.get_mut(d)) {
                Some(dir) if n.flags & DETACHED == 0 => {
                    if side {
                        dir.side.push(ino as u32);
                    } else {
                        dir.children.push(ino as u32);
                    }
                }
                _ => {
                    detached += 1;
                    let n = &mut self.nodes[i];
                    n.flags |= DETACHED;
                    n.flags &= !SIDE;
                }
            }
        }
        // (stat-ahead was started by the dead server: not any more)
        for n in self.nodes.iter_mut() {
            n.flags &= !AHEAD;
        }
        self.rebuild_acls();
        self.free_dirs = used_dirs
            .iter()
            .enumerate()
            .filter(|(_, u)| !**u)
            .map(|(d, _)| d as u32)
            .collect();
        self.dead_names = self.names.len().saturating_sub(live_names);
        self.unlinked = detached;
        self.known_bytes = h.known_bytes.load(Ordering::Relaxed);
        self.known_sink.store(self.known_bytes, Ordering::Relaxed);
        for d in 0..self.dirs.len() {
            self.sort_runs(d);
        }
        if let Some(d) = self
            .node(dir_intent)
            .filter(|n| n.is_dir())
            .map(|n| n.dir())
        {
            self.set_dir_meta(d, None, Some(None));
            let kids: Vec<u32> = self.dirs[d as usize]
                .children
                .iter()
                .chain(&self.dirs[d as usize].side)
                .copied()
                .collect();
            for c in kids {
                if let Some(n) = self.node_mut(c as u64) {
                    n.checked = 0;
                }
            }
        }
        // (so that the manifest is saved again)
        self.changes = 1;
    }

    /// Sorts directory `d`'s two runs by name, and keeps one entry of each
    /// name (the oldest: a server killed as it replaced an entry left the
    /// new one beside the old, never answered).
    fn sort_runs(&mut self, d: usize) {
        let mut main = std::mem::take(&mut self.dirs[d].children);
        let mut side = std::mem::take(&mut self.dirs[d].side);
        if main.is_empty() && side.is_empty() {
            return;
        }
        let mut dropped = Vec::new();
        for run in [&mut main, &mut side] {
            run.sort_by(|a, b| {
                self.name_of(*a as u64)
                    .cmp(self.name_of(*b as u64))
                    .then(a.cmp(b))
            });
            run.dedup_by(|later, earlier| {
                let same = self.name_of(*later as u64) == self.name_of(*earlier as u64);
                if same {
                    dropped.push(*later);
                }
                same
            });
        }
        if !main.is_empty() && !side.is_empty() {
            // (the same name in both runs: the older entry stays, in its run)
            let mut out_of_main = Vec::new();
            side.retain(|s| {
                let name = self.name_of(*s as u64);
                match main.binary_search_by(|c| self.name_of(*c as u64).cmp(name)) {
                    Ok(i) if main[i] < *s => {
                        dropped.push(*s);
                        false
                    }
                    Ok(i) => {
                        out_of_main.push(i);
                        true
                    }
                    Err(_) => true,
                }
            });
            out_of_main.sort_unstable();
            for i in out_of_main.into_iter().rev() {
                dropped.push(main.remove(i));
            }
        }
        for ino in dropped {
            if let Some(n) = self.node_mut(ino as u64) {
                n.flags |= DETACHED;
                n.flags &= !SIDE;
            }
            self.unlinked += 1;
        }
        main.shrink_to_fit();
        self.dirs[d].set_children(main);
        self.dirs[d].side = side;
    }
}

/// A request the namespace answers alone, or the question it must put to
/// the source first. The FUSE adapter answers `Done` on its own thread and
/// puts `Ask` to the source without holding one.
pub enum Step<T> {
    Done(io::Result<T>),
    Ask(Ask),
}

/// What to ask the source (the path), and when the question was asked (the
/// answer counts as checked then).
#[derive(Debug)]
pub struct Ask {
    pub path: PathBuf,
    at_ms: u64,
    /// Asked by listing the parent directory instead of a stat (a source
    /// whose listing carries every attribute: an object store, where it
    /// is one LIST request for up to 1,000 entries instead of one HEAD
    /// each). Only [`Namespace::stat_for`] does so; a thread-holding
    /// caller stats.
    relist: Option<Relist>,
}

/// The directory to list for an [`Ask`].
#[derive(Clone, Debug)]
struct Relist {
    dir: u64,
    path: PathBuf,
}

impl Ask {
    /// Whether the question is a listing of the parent directory (asked
    /// with [`Namespace::stat_for`], from a task).
    pub fn by_listing(&self) -> bool {
        self.relist.is_some()
    }
}

/// Directories above this many entries are not listed again to revalidate
/// one entry (a listing of a flat directory of a million objects is a
/// thousand LIST pages, one after the other): their stale entries are
/// stat-ed (one HEAD each).
pub const RELIST_MAX: usize = 10_000;

/// A listing as every caller waiting on it gets it.
type Listed = Result<Arc<Vec<DirName>>, Arc<io::Error>>;

/// One listing of a directory, shared by every caller that waits on it
/// meanwhile (a `readdir`, read-ahead's walk, the revalidation of entries:
/// single flight): the first to get it applies it to the tree and takes it
/// out of the map of flights. Its callers are tasks that run to the end
/// (never dropped half-way), so a flight is never left unapplied.
struct Flight {
    listing: Shared<BoxFuture<'static, Listed>>,
    at_ms: u64,
    path: PathBuf,
    applied: OnceLock<Result<(), Arc<io::Error>>>,
}

/// A copy of a shared error, with its errno (a timeout stays one).
fn copy_err(e: &io::Error) -> io::Error {
    match e.raw_os_error() {
        Some(n) => io::Error::from_raw_os_error(n),
        None => io::Error::new(e.kind(), e.to_string()),
    }
}

/// One directory entry as `readdir` hands it out.
pub struct DirEntry<'a> {
    pub ino: u64,
    pub name: &'a OsStr,
    /// The attributes; only the kind and source inode if not `known`.
    pub attr: &'a SourceAttr,
    /// Whether `attr` was read from the source (else the entry was only
    /// listed: stat it before handing out its attributes).
    pub known: bool,
    /// Whether `attr` was read from the source within `--revalidate`.
    pub fresh: bool,
}

/// The inode table of one mount.
pub struct Namespace {
    source: Arc<dyn Source>,
    /// None: trust the source forever (`--immutable`).
    revalidate: Option<Duration>,
    started: Instant,
    inner: RwLock<Inner>,
    /// The last known answers that live outside the tree: symlink targets
    /// read so far, and the source's `statvfs`, for when it does not answer.
    last_known: Mutex<LastKnown>,
    /// Where answers from the last known tree are counted.
    stats: Option<Arc<Stats>>,
    /// Whether the source's listings carry every attribute (stale entries
    /// are then revalidated by listing their directory).
    listing_attrs: bool,
    /// Listings in flight, by directory inode (each shared by every
    /// caller waiting on it).
    relists: Mutex<HashMap<u64, Arc<Flight>>>,
    /// Whether the source's entries can carry POSIX ACLs (else every
    /// entry has none, and the source is never asked).
    acls_on: bool,
}

#[derive(Default)]
struct LastKnown {
    links: HashMap<u64, PathBuf>,
    statvfs: Option<libc::statvfs>,
}

/// At most one "answered from the last known tree" line a minute: an
/// outage must not flood the log (every such answer is counted in stats).
static STALE: crate::obs::logging::RateLimit = crate::obs::logging::RateLimit::new(60_000);

impl Namespace {
    /// `known_sink` receives the total size of the files seen so far, as it
    /// changes (the cache policy measures "passes over the data set" by it).
    /// The namespace lives in a shared state of its own: nothing of it
    /// outlives this process (see [`Namespace::new_in`]).
    pub fn new(
        source: Arc<dyn Source>,
        revalidate: Option<Duration>,
        known_sink: Arc<AtomicU64>,
    ) -> io::Result<Self> {
        Self::new_in(&SharedState::create()?, source, revalidate, known_sink)
    }

    /// A namespace of the source's root alone, built in `state` (whatever
    /// namespace it held is dropped), where a server started after this
    /// one dies finds it ([`Namespace::attach`]).
    pub fn new_in(
        state: &Arc<SharedState>,
        source: Arc<dyn Source>,
        revalidate: Option<Duration>,
        known_sink: Arc<AtomicU64>,
    ) -> io::Result<Self> {
        let root = source.stat(Path::new(""))?;
        if root.kind != EntryKind::Dir {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the source is not a directory",
            ));
        }
        let mut inner = Inner::new(state, known_sink)?;
        inner.push(ROOT, b"", root, 0)?;
        Ok(Self::ready(source, revalidate, Instant::now(), inner))
    }

    /// The namespace `inner` (whole) from now on, with its clock started at
    /// `started`: published in the shared state as the one to attach to.
    fn ready(
        source: Arc<dyn Source>,
        revalidate: Option<Duration>,
        started: Instant,
        inner: Inner,
    ) -> Self {
        let h = inner.state.header();
        let age = started.elapsed().as_nanos() as u64;
        h.started_mono_ns.store(
            crate::sys::shm::monotonic_ns().saturating_sub(age),
            Ordering::Release,
        );
        h.ns_ready.store(1, Ordering::Release);
        Namespace {
            listing_attrs: source.listing_carries_attrs(),
            acls_on: source.has_acls(),
            source,
            revalidate,
            started,
            inner: RwLock::new(inner),
            last_known: Mutex::default(),
            stats: None,
            relists: Mutex::default(),
        }
    }

    /// The namespace an earlier server built in `state` (None if none was
    /// finished there), as it left it: every inode number, name,
    /// attribute, listing and kernel lookup count. Only the indexes
    /// derived from the records are rebuilt ([`Inner::rebuild`], one pass
    /// over the records); a change the server was in the middle of is
    /// undone to what can be trusted (docs/architecture.md).
    pub fn attach(
        state: &Arc<SharedState>,
        source: Arc<dyn Source>,
        revalidate: Option<Duration>,
        known_sink: Arc<AtomicU64>,
    ) -> io::Result<Option<Self>> {
        let h = state.header();
        if h.ns_ready.load(Ordering::Acquire) == 0 {
            return Ok(None);
        }
        let mut inner = tables(state, known_sink)?;
        if inner.nodes.first().is_none_or(|n| !n.is_dir()) {
            return Ok(None);
        }
        inner.rebuild();
        let since = crate::sys::shm::monotonic_ns()
            .saturating_sub(h.started_mono_ns.load(Ordering::Acquire));
        let started = Instant::now()
            .checked_sub(Duration::from_nanos(since))
            .unwrap_or_else(Instant::now);
        Ok(Some(Namespace {
            listing_attrs: source.listing_carries_attrs(),
            acls_on: source.has_acls(),
            source,
            revalidate,
            started,
            inner: RwLock::new(inner),
            last_known: Mutex::default(),
            stats: None,
            relists: Mutex::default(),
        }))
    }

    /// Rebuilds the namespace from a manifest saved `age` ago, if it is
    /// usable: same source, and (unless immutable) younger than the
    /// revalidation interval would make worthless. Entries count as checked
    /// when the manifest was saved. The tree is exactly the manifest's (the
    /// tree the saving mount last saw): a manifest that does not describe
    /// one tree (a record under a non-directory, two entries of one name in
    /// a directory, a name that is not one path component) is not used.
    pub fn restore(
        source: Arc<dyn Source>,
        revalidate: Option<Duration>,
        known_sink: Arc<AtomicU64>,
        manifest: crate::meta::manifest::Manifest,
        age: Duration,
    ) -> Option<Self> {
        let state = SharedState::create().ok()?;
        Self::restore_in(&state, source, revalidate, known_sink, manifest, age)
    }

    /// [`Namespace::restore`] built in `state` (see
    /// [`Namespace::new_in`]).
    pub fn restore_in(
        state: &Arc<SharedState>,
        source: Arc<dyn Source>,
        revalidate: Option<Duration>,
        known_sink: Arc<AtomicU64>,
        manifest: crate::meta::manifest::Manifest,
        age: Duration,
    ) -> Option<Self> {
        let started = Instant::now().checked_sub(age)?;
        if revalidate.is_some_and(|r| age >= r) {
            return None;
        }
        let mut inner = Inner::new(state, known_sink).ok()?;
        let mut records = 0;
        for r in manifest.records() {
            records += 1;
            let ino = inner.push(r.parent, r.name, r.attr, 0).ok()?;
            if ino != ROOT {
                let name = r.name;
                if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') {
                    return None;
                }
                inner.dir_mut(r.parent)?.children.push(ino as u32);
            }
            if r.listed {
                let d = inner.node(ino)?.dir();
                inner.set_dir_meta(d, None, Some(Some(0)));
            }
            if !r.known {
                inner.mark_unknown(ino);
            }
        }
        if records != manifest.len() || inner.nodes.first()?.kind != kind_code(EntryKind::Dir) {
            return None;
        }
        // Children sorted by name, as lookups expect; one entry per name.
        let mut dirs = std::mem::take(&mut inner.dirs);
        for dir in &mut dirs {
            let name = |x: &u32| inner.name_of(*x as u64);
            let mut children = std::mem::take(&mut dir.children);
            children.sort_unstable_by(|a, b| name(a).cmp(name(b)));
            if children.windows(2).any(|w| name(&w[0]) == name(&w[1])) {
                return None;
            }
            dir.set_children(children);
        }
        inner.dirs = dirs;
        inner.changes = 0;
        Some(Self::ready(source, revalidate, started, inner))
    }

    /// Reports the total size of the files seen to `sink` from now on
    /// (the cache's, once it is open: the namespace may be restored
    /// before).
    pub fn set_known_sink(&self, sink: Arc<AtomicU64>) {
        let mut inner = self.inner.write();
        sink.store(inner.known_bytes, Ordering::Relaxed);
        inner.known_sink = sink;
    }

    /// Counts answers given from the last known tree in `stats`.
    pub fn with_stats(mut self, stats: Arc<Stats>) -> Self {
        self.stats = Some(stats);
        self
    }

    /// An answer from the last known tree, because the source did not
    /// answer `op` in time: counted, and logged now and then.
    fn stale_answer(&self, op: &str, path: &Path) {
        if let Some(s) = &self.stats {
            s.stale_answers.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(more) = STALE.allow() {
            warn!(
                "source did not answer {op} of {:?} in time: answered from the last known tree \
                 ({more} more such answers not logged)",
                path
            );
        }
    }

    /// A manifest of the tree as the mount sees it now, for the next mount:
    /// every entry reachable from the root, and nothing else. Inodes that
    /// left the tree (deleted, or replaced by another object, with the
    /// subtree of a directory) stay in the table, answerable, for the
    /// kernel may still hold them, but are not saved; the saved entries are
    /// numbered afresh (the next mount's inode numbers).
    pub fn save(&self, source_label: &[u8], saved_unix_s: u64) -> Vec<u8> {
        let len = self.manifest_len(source_label);
        let out = Vec::with_capacity(len as usize);
        match self.save_to(out, source_label, saved_unix_s) {
            Ok((bytes, _)) => bytes,
            Err(_) => Vec::new(), // not for a Vec
        }
    }

    /// [`Namespace::save`] streamed to `out` as the tree is walked (no copy
    /// of the tree in memory); returns `out` and the bytes written. Holds
    /// the read lock while it writes (lookups and listings that change the
    /// tree wait; answers do not): call it off the FUSE threads.
    pub fn save_to<W: std::io::Write>(
        &self,
        out: W,
        source_label: &[u8],
        saved_unix_s: u64,
    ) -> io::Result<(W, u64)> {
        let inner = self.inner.read();
        let mut count = 0;
        inner.for_each_in_tree(|_, _| count += 1);
        let mut e =
            crate::meta::manifest::StreamEncoder::new(out, source_label, saved_unix_s, count);
        let mut r = Ok(());
        inner.for_each_in_tree(|parent, n| {
            if r.is_ok() {
                let listed = inner.dir(n).is_some_and(|d| d.listed_ms.is_some());
                r = e.push_entry(parent, inner.name(n), &inner.attr(n), listed, n.known());
            }
        });
        r?;
        e.finish()
    }

    /// The size of the manifest [`Namespace::save`] would write now.
    pub fn manifest_len(&self, source_label: &[u8]) -> u64 {
        let inner = self.inner.read();
        let (mut count, mut names) = (0, 0);
        inner.for_each_in_tree(|_, n| {
            count += 1;
            names += n.name_len as u64;
        });
        crate::meta::manifest::manifest_len(source_label.len(), count, names)
    }

    /// The kernel was handed `ino` (a lookup's or a READDIRPLUS entry's
    /// reply): one more lookup to take back with [`Namespace::forget`].
    pub fn looked_up(&self, ino: u64) {
        if let Some(n) = self.inner.read().node(ino) {
            bump(&n.lookups);
        }
    }

    /// Whether the kernel may keep its page cache of `ino` at an open of
    /// version `v`: it opened the file at this version before and has held
    /// the inode since ([`OPENED`]).
    pub fn opened_at(&self, ino: u64, v: &SourceVersion) -> bool {
        let inner = self.inner.read();
        inner
            .node(ino)
            .is_some_and(|n| n.flags & OPENED != 0 && Self::is_version(n, v))
    }

    /// An open of `ino` at version `v` succeeded: the pages the kernel
    /// caches from now on are of `v`, if that is still the version in the
    /// record (an open of a version already replaced marks nothing).
    pub fn note_opened(&self, ino: u64, v: &SourceVersion) {
        if self.opened_at(ino, v) {
            return;
        }
        let mut inner = self.inner.write();
        if let Some(n) = inner.node_mut(ino) {
            if Self::is_version(n, v) {
                n.flags |= OPENED;
            }
        }
    }

    fn is_version(n: &Node, v: &SourceVersion) -> bool {
        !n.is_dir()
            && n.known()
            && n.size == v.size
            && n.mtime_ns == v.mtime_ns
            && n.src_ino == v.ino
    }

    /// Several [`Namespace::looked_up`] under one lock.
    pub fn looked_up_all(&self, inos: &[u64]) {
        if inos.is_empty() {
            return;
        }
        let inner = self.inner.read();
        for ino in inos {
            if let Some(n) = inner.node(*ino) {
                bump(&n.lookups);
            }
        }
    }

    /// The kernel forgot `n` lookups of each inode (FORGET, BATCH_FORGET).
    /// Returns the inodes the kernel no longer knows at all (their lookup
    /// count is 0): what hangs off them elsewhere can go. An entry that
    /// also left the tree is dropped but for its inode number.
    pub fn forget(&self, nodes: &[(u64, u64)]) -> Vec<u64> {
        let mut inner = self.inner.write();
        let mut dropped = Vec::new();
        for &(ino, n) in nodes {
            inner.forget(ino, n);
            if inner
                .node(ino)
                .is_none_or(|x| x.lookups.load(Ordering::Relaxed) == 0)
            {
                dropped.push(ino);
            }
        }
        dropped
    }

    /// Drops what entries out of the tree still hold, unless the kernel
    /// holds them (one pass over the table under the write lock, only if
    /// an entry left the tree since the last time): called before a save.
    pub fn sweep(&self) {
        if self.inner.read().unlinked == 0 {
            return;
        }
        self.inner.write().sweep();
    }

    /// The kernel's lookup count of `ino` (0 for an unknown inode).
    pub fn lookups(&self, ino: u64) -> u32 {
        self.inner
            .read()
            .node(ino)
            .map_or(0, |n| n.lookups.load(Ordering::Relaxed))
    }

    /// Bytes of names held, and of them the bytes of dropped entries not
    /// yet compacted away (for tests and memory reporting).
    pub fn name_bytes(&self) -> (usize, usize) {
        let inner = self.inner.read();
        (inner.names.len(), inner.dead_names)
    }

    /// A counter that moves whenever the namespace changes.
    pub fn changes(&self) -> u64 {
        self.inner.read().changes
    }

    fn ask<T>(&self, path: PathBuf) -> Step<T> {
        Step::Ask(Ask {
            path,
            at_ms: self.now_ms(),
            relist: None,
        })
    }

    /// The question for entry `path` of directory `parent`: a listing of
    /// the directory where the source's listings carry every attribute and
    /// the directory was listed before (and is not too big to list again),
    /// or is being listed now (a listing of it is in flight: read-ahead's
    /// walk of the tree, a `readdir`), else a stat.
    fn ask_entry<T>(&self, inner: &Inner, parent: u64, path: PathBuf) -> Step<T> {
        let dir = inner.dir_of(parent);
        let listable = |d: &Dir| d.listed_ms.is_some() && d.len() <= RELIST_MAX;
        if !self.listing_attrs
            || !(dir.is_some_and(listable) || self.relists.lock().contains_key(&parent))
        {
            return self.ask(path);
        }
        let dir_path = path.parent().unwrap_or(Path::new("")).to_owned();
        Step::Ask(Ask {
            path,
            at_ms: self.now_ms(),
            relist: Some(Relist {
                dir: parent,
                path: dir_path,
            }),
        })
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    fn stale(&self, checked_ms: u64) -> bool {
        self.stale_at(checked_ms, self.now_ms())
    }

    /// Whether what was checked at `checked_ms` is stale at `now_ms`. Loops
    /// over a directory's entries read the clock once, before the loop: a
    /// clock read per entry was 8 % of the daemon's CPU in a walk of 500 k
    /// entries (perf, 2026-12-04).
    fn stale_at(&self, checked_ms: u64, now_ms: u64) -> bool {
        match self.revalidate {
            None => false,
            Some(d) => now_ms.saturating_sub(checked_ms) >= d.as_millis() as u64,
        }
    }

    /// Whether a node's attributes are stale.
    fn stale_node(&self, n: &Node) -> bool {
        self.stale(n.checked as u64 * TICK_MS)
    }

    /// Whether a node's attributes are stale at `now_ms`.
    fn stale_node_at(&self, n: &Node, now_ms: u64) -> bool {
        self.stale_at(n.checked as u64 * TICK_MS, now_ms)
    }

    /// Total size of the regular files seen so far.
    pub fn known_bytes(&self) -> u64 {
        self.inner.read().known_bytes
    }

    /// The number of inodes known (for memory reporting).
    pub fn len(&self) -> usize {
        self.inner.read().nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        false
    }

    /// The path of an inode relative to the source root.
    pub fn path(&self, ino: u64) -> io::Result<PathBuf> {
        self.inner
            .read()
            .path(ino)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))
    }

    /// Finds `name` in directory `parent`.
    pub fn lookup(&self, parent: u64, name: &OsStr) -> io::Result<(u64, SourceAttr)> {
        match self.lookup_local(parent, name) {
            Step::Done(r) => r,
            Step::Ask(ask) => {
                let r = self.source.stat(&ask.path);
                self.lookup_answer(parent, name, ask, r)
            }
        }
    }

    /// [`Namespace::lookup`] without holding a thread while the source
    /// answers.
    pub async fn lookup_async(&self, parent: u64, name: &OsStr) -> io::Result<(u64, SourceAttr)> {
        match self.lookup_local(parent, name) {
            Step::Done(r) => r,
            Step::Ask(ask) => {
                let r = self.stat_for(&ask).await;
                self.lookup_answer(parent, name, ask, r)
            }
        }
    }

    /// The source's `stat` for `ask`, without holding a thread (or the
    /// entry's attributes from a listing of its directory, see [`Ask`]).
    pub async fn stat_for(&self, ask: &Ask) -> io::Result<SourceAttr> {
        match &ask.relist {
            Some(by) => self.relisted(by, &ask.path).await,
            None => Arc::clone(&self.source).stat_async(ask.path.clone()).await,
        }
    }

    /// Lists directory `by` again (one listing for every caller waiting on
    /// it) and answers entry `path` of it from the tree as listed: its
    /// fresh attributes, or NotFound if the listing has it no more. The
    /// listing's error (a timeout: the caller answers from the last known
    /// tree) if it failed.
    async fn relisted(&self, by: &Relist, path: &Path) -> io::Result<SourceAttr> {
        let (listing, applied) = self.listing_shared(by.dir, &by.path).await;
        if let Err(e) = &listing {
            return Err(copy_err(e));
        }
        if let Err(e) = applied {
            return Err(copy_err(&e));
        }
        let name = path.file_name().unwrap_or_default().as_bytes();
        let inner = self.inner.read();
        inner
            .dir_of(by.dir)
            .and_then(|d| inner.child(d, name))
            .and_then(|c| inner.known_attr_of(c))
            .ok_or_else(enoent)
    }

    /// Lists directory `dir` (at `path`) from the source, one listing for
    /// every caller that waits on it meanwhile (single flight), applied to
    /// the tree once ([`Namespace::listing_answer`]): the listing as the
    /// source gave it, and what applying it gave.
    async fn listing_shared(&self, dir: u64, path: &Path) -> (Listed, Result<(), Arc<io::Error>>) {
        let flight = Arc::clone(self.relists.lock().entry(dir).or_insert_with(|| {
            let (source, at) = (Arc::clone(&self.source), path.to_owned());
            let listing = async move {
                source
                    .list_names_async(at)
                    .await
                    .map(Arc::new)
                    .map_err(Arc::new)
            };
            Arc::new(Flight {
                listing: listing.boxed().shared(),
                at_ms: self.now_ms(),
                path: path.to_owned(),
                applied: OnceLock::new(),
            })
        }));
        let listing = flight.listing.clone().await;
        let applied = flight.applied.get_or_init(|| {
            {
                let mut m = self.relists.lock();
                if m.get(&dir).is_some_and(|f| Arc::ptr_eq(f, &flight)) {
                    m.remove(&dir);
                }
            }
            let ask = Ask {
                path: flight.path.clone(),
                at_ms: flight.at_ms,
                relist: None,
            };
            let r = match &listing {
                Ok(v) => Ok(v.as_ref().clone()),
                Err(e) => Err(copy_err(e)),
            };
            self.listing_answer(dir, ask, r).map_err(Arc::new)
        });
        (listing, applied.clone())
    }

    /// Asks the source for `ask` and hands `answer` the source's
    /// attributes (or its error) on whatever thread has them, holding none:
    /// with the mount's source guard, the worker that did the `stat`, or
    /// its deadline thread.
    pub fn stat_then(
        &self,
        ask: Ask,
        answer: impl FnOnce(Ask, io::Result<SourceAttr>) + Send + 'static,
    ) {
        let path = ask.path.clone();
        Arc::clone(&self.source).stat_then(path, Box::new(move |r| answer(ask, r)));
    }

    /// A lookup's answer if the namespace knows it fresh, else what to ask
    /// the source.
    pub fn lookup_local(&self, parent: u64, name: &OsStr) -> Step<(u64, SourceAttr)> {
        let name = name.as_bytes();
        let inner = self.inner.read();
        let Some(p) = inner.node(parent) else {
            return Step::Done(Err(enoent()));
        };
        let Some(dir) = inner.dir(p) else {
            return Step::Done(Err(io::Error::from_raw_os_error(libc::ENOTDIR)));
        };
        let listed_fresh = dir.listed_ms.is_some_and(|t| !self.stale(t));
        match inner.find_child(dir, name) {
            Ok(slot) => {
                let ino = dir.at(slot) as u64;
                if let Some(n) = inner.node(ino) {
                    if n.known() && !self.stale_node(n) {
                        return Step::Done(Ok((ino, inner.attr(n))));
                    }
                }
            }
            // A fresh full listing knows every name: no need to ask.
            Err(_) if listed_fresh => return Step::Done(Err(enoent())),
            Err(_) => {}
        }
        let Some(path) = inner.path(parent) else {
            return Step::Done(Err(enoent()));
        };
        if self.source.stalled() {
            // No point asking: the last known answer now, or none (an
            // entry only listed has no attributes to answer with).
            let known = inner
                .child(dir, name)
                .and_then(|ino| Some((ino, inner.known_attr_of(ino)?)));
            drop(inner);
            return Step::Done(match known {
                Some(k) => {
                    self.stale_answer("lookup", &path.join(OsStr::from_bytes(name)));
                    Ok(k)
                }
                None => Err(timed_out()),
            });
        }
        self.ask_entry(&inner, parent, path.join(OsStr::from_bytes(name)))
    }

    /// Applies the source's answer `r` to [`Namespace::lookup_local`]'s
    /// question.
    pub fn lookup_answer(
        &self,
        parent: u64,
        name: &OsStr,
        ask: Ask,
        r: io::Result<SourceAttr>,
    ) -> io::Result<(u64, SourceAttr)> {
        let name = name.as_bytes();
        match r {
            Ok(attr) => {
                let mut inner = self.inner.write();
                let ino = inner.upsert_child(parent, name, attr, ask.at_ms)?;
                Ok((ino, attr))
            }
            Err(e) if is_timeout(&e) => {
                // A known entry is answered as last seen; an unknown name
                // cannot be.
                let inner = self.inner.read();
                let known = inner
                    .dir_of(parent)
                    .and_then(|d| inner.child(d, name))
                    .and_then(|ino| Some((ino, inner.known_attr_of(ino)?)));
                drop(inner);
                match known {
                    Some(k) => {
                        self.stale_answer("lookup", &ask.path);
                        Ok(k)
                    }
                    None => Err(e),
                }
            }
            Err(e) => {
                if e.kind() == io::ErrorKind::NotFound {
                    self.inner.write().remove_child(parent, name);
                }
                Err(e)
            }
        }
    }

    /// Attributes of an inode, revalidated against the source when stale.
    pub fn getattr(&self, ino: u64) -> io::Result<SourceAttr> {
        match self.getattr_local(ino) {
            Step::Done(r) => r,
            Step::Ask(ask) => {
                let r = self.source.stat(&ask.path);
                self.getattr_answer(ino, ask, r)
            }
        }
    }

    /// [`Namespace::getattr`] without holding a thread while the source
    /// answers.
    pub async fn getattr_async(&self, ino: u64) -> io::Result<SourceAttr> {
        match self.getattr_local(ino) {
            Step::Done(r) => r,
            Step::Ask(ask) => {
                let r = self.stat_for(&ask).await;
                self.getattr_answer(ino, ask, r)
            }
        }
    }

    /// An inode's attributes if they are fresh, else what to ask the source.
    pub fn getattr_local(&self, ino: u64) -> Step<SourceAttr> {
        let inner = self.inner.read();
        let Some(n) = inner.node(ino) else {
            return Step::Done(Err(enoent()));
        };
        let attr = inner.attr(n);
        let known = n.known();
        if known && !self.stale_node(n) {
            return Step::Done(Ok(attr));
        }
        let Some(path) = inner.path(ino) else {
            return Step::Done(Err(enoent()));
        };
        if self.source.stalled() {
            drop(inner);
            // No point asking: the last known attributes now (none for an
            // entry only listed).
            if !known {
                return Step::Done(Err(timed_out()));
            }
            self.stale_answer("stat", &path);
            return Step::Done(Ok(attr));
        }
        if ino == ROOT {
            return self.ask(path);
        }
        self.ask_entry(&inner, n.parent as u64, path)
    }

    /// Applies the source's answer `r` to [`Namespace::getattr_local`]'s
    /// question.
    pub fn getattr_answer(
        &self,
        ino: u64,
        ask: Ask,
        r: io::Result<SourceAttr>,
    ) -> io::Result<SourceAttr> {
        let attr = match r {
            Ok(a) => a,
            Err(e) if is_timeout(&e) => {
                let known = self.inner.read().known_attr_of(ino);
                let Some(known) = known else { return Err(e) };
                self.stale_answer("stat", &ask.path);
                return Ok(known);
            }
            Err(e) => {
                if e.kind() == io::ErrorKind::NotFound {
                    // Gone: not in the tree any more (nor in the next
                    // manifest).
                    self.inner.write().unlink(ino);
                }
                return Err(e);
            }
        };
        let mut inner = self.inner.write();
        let old = inner.attr_of(ino).ok_or_else(enoent)?;
        // (an entry only listed has getdents' inode number, a hint: its
        // first stat says which object it is)
        let listed = inner.node(ino).is_some_and(|n| !n.known());
        if (old.kind == EntryKind::Dir) != (attr.kind == EntryKind::Dir)
            || (old.ino != attr.ino && !listed)
        {
            // Another object now lives at this path: this inode is gone
            // (the next lookup or listing finds the new one).
            inner.unlink(ino);
            return Err(enoent());
        }
        inner.account(Some(&old), Some(&attr));
        inner.set_attr(ino, &attr, ask.at_ms)?;
        Ok(attr)
    }

    /// Lists directory `ino` from the source if it was never listed or its
    /// listing is stale. Called at the start of a directory read.
    pub fn refresh_dir(&self, ino: u64) -> io::Result<()> {
        match self.listing_local(ino) {
            Step::Done(r) => r,
            Step::Ask(ask) => {
                let r = self.source.list_names(&ask.path, &|| {});
                self.listing_answer(ino, ask, r)
            }
        }
    }

    /// [`Namespace::refresh_dir`] without holding a thread while the source
    /// answers.
    pub async fn refresh_dir_async(&self, ino: u64) -> io::Result<()> {
        match self.listing_local(ino) {
            Step::Done(r) => r,
            // (shared with every lookup, open and listing of the same
            // directory meanwhile)
            Step::Ask(ask) => self
                .listing_shared(ino, &ask.path)
                .await
                .1
                .map_err(|e| copy_err(&e)),
        }
    }

    /// Done if directory `ino`'s listing is fresh, else what to ask the
    /// source.
    pub fn listing_local(&self, ino: u64) -> Step<()> {
        let inner = self.inner.read();
        let Some(n) = inner.node(ino) else {
            return Step::Done(Err(enoent()));
        };
        let Some(dir) = inner.dir(n) else {
            return Step::Done(Err(io::Error::from_raw_os_error(libc::ENOTDIR)));
        };
        if dir.listed_ms.is_some_and(|t| !self.stale(t)) {
            return Step::Done(Ok(()));
        }
        let listed = dir.listed_ms.is_some();
        let Some(path) = inner.path(ino) else {
            return Step::Done(Err(enoent()));
        };
        drop(inner);
        if self.source.stalled() {
            // No point asking: the last listing now, if there is one.
            if !listed {
                return Step::Done(Err(timed_out()));
            }
            self.stale_answer("readdir", &path);
            return Step::Done(Ok(()));
        }
        self.ask(path)
    }

    /// Applies the source's listing `r` (names, kinds and source inodes,
    /// no attributes) to [`Namespace::listing_local`]'s question. An entry
    /// listed before keeps its inode and its attributes (and when they were
    /// checked: revalidated as any) if it is still the same object (same
    /// kind, same source inode); a new one is known by name and kind only
    /// until it is stat-ed (a lookup, a getattr, a READDIRPLUS that
    /// returns it).
    pub fn listing_answer(
        &self,
        ino: u64,
        ask: Ask,
        r: io::Result<Vec<crate::source::DirName>>,
    ) -> io::Result<()> {
        let (path, now) = (ask.path, ask.at_ms);
        let mut entries = match r {
            Ok(e) => e,
            Err(e) if is_timeout(&e) => {
                // A directory listed before is served as last listed; one
                // never listed in full cannot be (its known children may
                // be only some of them).
                let listed = self
                    .inner
                    .read()
                    .dir_of(ino)
                    .is_some_and(|d| d.listed_ms.is_some());
                if !listed {
                    return Err(e);
                }
                self.stale_answer("readdir", &path);
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        entries.sort_unstable_by(|a, b| a.name.as_bytes().cmp(b.name.as_bytes()));
        entries.dedup_by(|a, b| a.name == b.name);
        let mut inner = self.inner.write();
        // The old listing, sorted by name (taken out; put back below).
        // (the side run merged in first: names found by lookups since the
        // last listing)
        if inner.dir_of(ino).is_none() {
            return Err(enoent());
        }
        // Many stores to the directory's entries: marked until done.
        inner.intend_dir(ino);
        if inner.dir_of(ino).is_some_and(|d| !d.side.is_empty()) {
            inner.merge_side(ino);
        }
        let old = std::mem::take(&mut inner.dir_mut(ino).ok_or_else(enoent)?.children);
        // Merge the sorted old and new listings, keeping inodes of entries
        // that are still the same object: linear in the two listings.
        let mut children = Vec::with_capacity(entries.len());
        let mut oi = 0;
        for e in &entries {
            let (name, nb) = (&e.name, e.name.as_bytes());
            while oi < old.len() && inner.name_of(old[oi] as u64) < nb {
                let gone = inner.attr_of(old[oi] as u64);
                inner.account(gone.as_ref(), None);
                inner.unlinked(old[oi] as u64);
                oi += 1;
            }
            let mut reuse = None;
            if oi < old.len() && inner.name_of(old[oi] as u64) == nb {
                let c = old[oi] as u64;
                oi += 1;
                if let Some(prev) = inner.attr_of(c) {
                    // (a source inode of 0: getdents did not say)
                    if prev.kind == e.kind && (e.ino == 0 || prev.ino == e.ino) {
                        reuse = Some(c);
                    } else {
                        inner.account(Some(&prev), None);
                        inner.unlinked(c);
                    }
                }
            }
            let c = match reuse {
                Some(c) => c,
                None => match inner.push_listed(ino, nb, e.kind, e.ino) {
                    Ok(c) => c,
                    Err(e) => {
                        warn!("{:?}: entry {name:?} left out: {e}", path);
                        continue;
                    }
                },
            };
            // Attributes that came with the listing: as fresh as a stat.
            if let Some(a) = &e.attr {
                let prev = inner.attr_of(c);
                inner.account(prev.as_ref(), Some(a));
                if let Err(e) = inner.set_attr(c, a, now) {
                    warn!("{:?}: attributes of {name:?} not kept: {e}", path);
                }
            }
            children.push(c as u32);
        }
        while oi < old.len() {
            let gone = inner.attr_of(old[oi] as u64);
            inner.account(gone.as_ref(), None);
            inner.unlinked(old[oi] as u64);
            oi += 1;
        }
        children.shrink_to_fit();
        inner.changes += 1;
        if let Some(d) = inner.node(ino).map(|n| n.dir()) {
            if let Some(dir) = inner.dirs.get_mut(d as usize) {
                dir.set_children(children);
            }
            inner.set_dir_meta(d, None, Some(Some(now)));
        }
        inner.done_dir();
        Ok(())
    }

    /// Hands the entries of directory `ino` from position `offset` on to `f`
    /// (with the position after each) until `f` returns true (buffer full).
    /// Call [`Namespace::refresh_dir`] first.
    pub fn read_dir(
        &self,
        ino: u64,
        offset: u64,
        mut f: impl FnMut(DirEntry<'_>, u64) -> bool,
    ) -> io::Result<()> {
        let inner = self.inner.read();
        let n = inner.node(ino).ok_or_else(enoent)?;
        let dir = inner
            .dir(n)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOTDIR))?;
        // A resume starts at its index: no cost for the entries before.
        let from = usize::try_from(offset).unwrap_or(usize::MAX);
        let now = self.now_ms();
        for i in from..dir.len() {
            let Some(c) = dir.get(i) else { break };
            let Some(child) = inner.node(c as u64) else {
                continue;
            };
            let attr = inner.attr(child);
            let e = DirEntry {
                ino: c as u64,
                name: OsStr::from_bytes(inner.name(child)),
                attr: &attr,
                known: child.known(),
                fresh: child.known() && !self.stale_node_at(child, now),
            };
            if f(e, i as u64 + 1) {
                break;
            }
        }
        Ok(())
    }

    /// The entries of directory `ino` at positions `from..from + max` whose
    /// attributes a READDIRPLUS cannot hand out as they are (never stat-ed,
    /// or stale), with the question to put to the source for each (answer
    /// it with [`Namespace::getattr_answer`]). Empty while the source is
    /// stalled (the reply then ends before the first such entry).
    pub fn plus_asks(&self, ino: u64, from: u64, max: usize) -> Vec<(u64, Ask)> {
        if self.source.stalled() {
            return Vec::new();
        }
        let inner = self.inner.read();
        let Some(dir) = inner.dir_of(ino) else {
            return Vec::new();
        };
        let from = usize::try_from(from).unwrap_or(usize::MAX);
        let at_ms = self.now_ms();
        let mut out = Vec::new();
        for i in from..dir.len().min(from.saturating_add(max)) {
            let Some(c) = dir.get(i) else { break };
            let Some(n) = inner.node(c as u64) else {
                continue;
            };
            if n.known() && !self.stale_node_at(n, at_ms) {
                continue;
            }
            if let Some(path) = inner.path(c as u64) {
                out.push((
                    c as u64,
                    Ask {
                        path,
                        at_ms,
                        relist: None,
                    },
                ));
            }
        }
        out
    }

    /// Stat-ahead for lookups in listing order (`ls -l`, `os.scandir` then
    /// `stat` of each entry, in the order the listing gave them): when the
    /// lookup of `name` in `parent` must stat it and the entry listed just
    /// before it is known (it was looked up just before), the entries
    /// after it that were never stat-ed (at most `max`), with the
    /// questions to ask of the source for them (answer with
    /// [`Namespace::getattr_answer`]). Empty otherwise (a lookup of one
    /// entry here and there costs no stat of its neighbours).
    pub fn ahead_asks(&self, parent: u64, name: &OsStr, max: usize) -> Vec<(u64, Ask)> {
        if self.source.stalled() {
            return Vec::new();
        }
        let mut inner = self.inner.write();
        let Some(dir) = inner.dir_of(parent) else {
            return Vec::new();
        };
        let Ok(Slot::Main(i)) = inner.find_child(dir, name.as_bytes()) else {
            return Vec::new();
        };
        let before = i
            .checked_sub(1)
            .and_then(|j| inner.node(dir.children[j] as u64));
        if !before.is_some_and(|n| n.known()) {
            return Vec::new();
        }
        let next: Vec<u32> = dir.children.iter().skip(i + 1).take(max).copied().collect();
        let at_ms = self.now_ms();
        let mut out = Vec::new();
        for c in next {
            let c = c as u64;
            match inner.node(c) {
                Some(n) if n.flags & (UNKNOWN | AHEAD) == UNKNOWN => {}
                _ => continue,
            }
            if let Some(path) = inner.path(c) {
                out.push((
                    c,
                    Ask {
                        path,
                        at_ms,
                        relist: None,
                    },
                ));
                if let Some(n) = inner.node_mut(c) {
                    n.flags |= AHEAD;
                }
            }
        }
        out
    }

    /// Whether `ino`'s attributes were read from the source (false for an
    /// entry only listed, and for an unknown inode).
    pub fn attrs_known(&self, ino: u64) -> bool {
        self.inner.read().node(ino).is_some_and(|n| n.known())
    }

    /// The parent of a directory inode (for "..").
    pub fn parent(&self, ino: u64) -> u64 {
        self.inner
            .read()
            .node(ino)
            .map(|n| n.parent as u64)
            .unwrap_or(ROOT)
    }

    /// The target of a symlink; the last one read if the source does not
    /// answer in time.
    pub fn read_link(&self, ino: u64) -> io::Result<PathBuf> {
        let path = self.path(ino)?;
        match self.source.read_link(&path) {
            Ok(t) => {
                self.last_known.lock().links.insert(ino, t.clone());
                Ok(t)
            }
            Err(e) if is_timeout(&e) => {
                let known = self.last_known.lock().links.get(&ino).cloned();
                let Some(t) = known else { return Err(e) };
                self.stale_answer("readlink", &path);
                Ok(t)
            }
            Err(e) => Err(e),
        }
    }

    /// The POSIX ACLs of `ino` if the namespace holds them read since its
    /// attributes were last read; else the question for the source. A
    /// source without ACLs is never asked.
    ///
    /// Whether the attributes themselves are stale is not asked here: the
    /// kernel keeps an ACL as long as the attributes it got with it, and
    /// asks for the attributes again (which reads them again here if they
    /// are stale, and so marks the ACL to be read again) before it asks
    /// for the ACL again. Asking the source whenever the record is stale
    /// made every check of an entry whose attributes the kernel still held
    /// a source call: the mount's root, whose ACL the kernel asks for at
    /// every path walk that crosses it, cost one per open of any file once
    /// `--revalidate` had passed (seen in `cargo bench --bench acl`).
    pub fn acls_local(&self, ino: u64) -> Step<Arc<Acls>> {
        let inner = self.inner.read();
        let Some(n) = inner.node(ino) else {
            return Step::Done(Err(enoent()));
        };
        if !self.acls_on {
            return Step::Done(Ok(Arc::clone(&inner.no_acls)));
        }
        let fresh = n.flags & ACL_FRESH != 0 && n.known();
        if fresh {
            return Step::Done(Ok(inner.acls_of(ino)));
        }
        let known = n.flags & ACL_KNOWN != 0;
        let Some(path) = inner.path(ino) else {
            return Step::Done(Err(enoent()));
        };
        if known && self.source.stalled() {
            let acls = inner.acls_of(ino);
            drop(inner);
            self.stale_answer("acls", &path);
            return Step::Done(Ok(acls));
        }
        drop(inner);
        self.ask(path)
    }

    /// Applies the source's answer `r` to [`Namespace::acls_local`]'s
    /// question: the ACLs are held from now on (revalidated with the
    /// attributes). When the source did not answer in time, the last
    /// known ACLs; with none known, the error (the kernel then refuses the
    /// access: an ACL is never guessed).
    pub fn acls_answer(&self, ino: u64, ask: Ask, r: io::Result<Acls>) -> io::Result<Arc<Acls>> {
        match r {
            Ok(a) => Ok(self.inner.write().set_acls(ino, a)),
            Err(e) if is_timeout(&e) => {
                let inner = self.inner.read();
                let known = inner.node(ino).is_some_and(|n| n.flags & ACL_KNOWN != 0);
                if !known {
                    return Err(e);
                }
                let acls = inner.acls_of(ino);
                drop(inner);
                self.stale_answer("acls", &ask.path);
                Ok(acls)
            }
            Err(e) => Err(e),
        }
    }

    /// Asks the source for the POSIX ACLs of `ask`'s entry and hands
    /// `answer` them (or the error) on whatever thread has them, holding
    /// none: with the mount's guard, the metadata worker that read them,
    /// or its deadline thread (as [`Namespace::stat_then`]).
    pub fn acls_then(&self, ask: Ask, answer: impl FnOnce(Ask, io::Result<Acls>) + Send + 'static) {
        let path = ask.path.clone();
        Arc::clone(&self.source).acls_then(path, Box::new(move |r| answer(ask, r)));
    }

    /// Entries holding an ACL now (for tests and memory reporting).
    pub fn entries_with_acls(&self) -> usize {
        self.inner.read().acls.len()
    }

    /// `statvfs` of the source; the last one if it does not answer in time.
    pub fn statfs(&self) -> io::Result<libc::statvfs> {
        match self.source.statvfs() {
            Ok(s) => {
                self.last_known.lock().statvfs = Some(s);
                Ok(s)
            }
            Err(e) if is_timeout(&e) => {
                let known = self.last_known.lock().statvfs;
                let Some(s) = known else { return Err(e) };
                self.stale_answer("statfs", Path::new(""));
                Ok(s)
            }
            Err(e) => Err(e),
        }
    }

    /// Child `name` of directory `parent` as the namespace knows it now:
    /// its inode, kind, and version if its attributes were read (None: only
    /// listed). Never asks the source and counts no kernel lookup: for
    /// `locafs where`, whose owners need only paths (refresh the listing
    /// first with [`Namespace::refresh_dir`]).
    ///
    /// `near` is where the last name found in this directory sat: a list of
    /// names in listing order (an image folder's, as a loader holds it)
    /// finds each next to the last one, without a binary search.
    pub fn listed_child(
        &self,
        parent: u64,
        name: &OsStr,
        near: &mut usize,
    ) -> Option<(u64, EntryKind, Option<SourceVersion>)> {
        let name = name.as_bytes();
        let inner = self.inner.read();
        let dir = inner.dir(inner.node(parent)?)?;
        let next = [*near, near.wrapping_add(1)];
        let hit = next.into_iter().find_map(|i| {
            let c = *dir.children.get(i)?;
            (inner.name_of(c as u64) == name).then_some((i, c as u64))
        });
        let ino = match hit {
            Some((i, ino)) => {
                *near = i;
                ino
            }
            None => match inner.find_child(dir, name).ok()? {
                Slot::Main(i) => {
                    *near = i;
                    dir.children[i] as u64
                }
                side => dir.at(side) as u64,
            },
        };
        let n = inner.node(ino)?;
        Some((
            ino,
            kind_of(n.kind),
            n.known().then(|| inner.attr(n).version()),
        ))
    }

    /// Resolves a path relative to the root, component by component (no
    /// "..", no symlinks followed).
    pub fn lookup_path(&self, rel: &Path) -> io::Result<(u64, SourceAttr)> {
        use std::path::Component;
        let mut cur = (ROOT, self.getattr(ROOT)?);
        for c in rel.components() {
            match c {
                Component::Normal(name) => cur = self.lookup(cur.0, name)?,
                Component::CurDir | Component::RootDir => {}
                _ => return Err(io::Error::from_raw_os_error(libc::EINVAL)),
            }
        }
        Ok(cur)
    }

    /// Path and fresh attributes of a regular file about to be opened.
    pub fn open_file(&self, ino: u64) -> io::Result<(Arc<Path>, SourceAttr)> {
        self.file_with(ino, self.getattr(ino)?)
    }

    /// [`Namespace::open_file`] without holding a thread while the source
    /// answers.
    pub async fn open_file_async(&self, ino: u64) -> io::Result<(Arc<Path>, SourceAttr)> {
        self.file_with(ino, self.getattr_async(ino).await?)
    }

    /// The path of `ino`, a regular file whose attributes are `attr`.
    pub fn file_with(&self, ino: u64, attr: SourceAttr) -> io::Result<(Arc<Path>, SourceAttr)> {
        match attr.kind {
            EntryKind::File => {}
            EntryKind::Dir => return Err(io::Error::from_raw_os_error(libc::EISDIR)),
            _ => return Err(io::Error::from_raw_os_error(libc::EINVAL)),
        }
        Ok((Arc::from(self.path(ino)?), attr))
    }
}

/// One more kernel lookup (saturating).
fn bump(c: &AtomicU32) {
    let _ = c.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| v.checked_add(1));
}

fn enoent() -> io::Error {
    io::Error::from_raw_os_error(libc::ENOENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(kind: EntryKind, ino: u64) -> SourceAttr {
        SourceAttr {
            kind,
            size: 0,
            blocks: 0,
            mode: if kind == EntryKind::Dir {
                0o40755
            } else {
                0o100644
            },
            nlink: 1,
            uid: 0,
            gid: 0,
            rdev: 0,
            ino,
            atime_ns: 0,
            mtime_ns: 0,
            ctime_ns: 0,
        }
    }

    /// The children of `ino` in readdir order.
    fn run(inner: &Inner, ino: u64) -> Vec<u32> {
        let d = inner.dir_of(ino).unwrap();
        (0..d.len()).map(|i| d.get(i).unwrap()).collect()
    }

    /// What a new server makes of the tables `inner` leaves (dropped as a
    /// killed server's is: only the shared state remains).
    fn attached(inner: Inner) -> Inner {
        let state = Arc::clone(&inner.state);
        drop(inner);
        let mut again = tables(&state, Arc::default()).unwrap();
        again.rebuild();
        again
    }

    /// The names of a directory's entries in readdir order.
    fn names(inner: &Inner, ino: u64) -> Vec<String> {
        run(inner, ino)
            .iter()
            .map(|c| String::from_utf8_lossy(inner.name_of(*c as u64)).into_owned())
            .collect()
    }

    #[test]
    fn a_name_compaction_killed_half_way_is_finished_by_the_next_server() {
        let mut inner = Inner::private(Arc::default());
        inner.push(ROOT, b"", attr(EntryKind::Dir, 1), 0).unwrap();
        let mut inos = Vec::new();
        for i in 0..200u64 {
            let name = format!("{i:0>200}");
            let ino = inner
                .upsert_child(ROOT, name.as_bytes(), attr(EntryKind::File, 10 + i), 0)
                .unwrap();
            inos.push((name, ino));
        }
        // Half of them gone (not held by the kernel, out of the tree).
        for (name, _) in inos.iter().step_by(2) {
            inner.remove_child(ROOT, name.as_bytes());
        }
        let (len, dead) = (inner.names.len(), inner.dead_names);
        assert!(dead > 0 && len > dead);
        let before = names(&inner, ROOT);
        // Killed after the other arena was written whole and half of the
        // offsets were rewritten: what compact_names does, cut short.
        let to = 1 - inner.names.active();
        let live: Vec<Vec<u8>> = inner
            .nodes
            .iter()
            .filter(|n| n.flags & GONE == 0)
            .map(|n| inner.name(n).to_vec())
            .collect();
        for name in &live {
            inner.names.arenas[to].extend_from_slice(name).unwrap();
        }
        inner
            .state
            .header()
            .names_switching
            .store(to as u32 + 1, Ordering::Release);
        let mut off = 0;
        for n in inner
            .nodes
            .iter_mut()
            .take(50)
            .filter(|n| n.flags & GONE == 0)
        {
            n.name_off = off;
            off += n.name_len as u32;
        }
        let again = attached(inner);
        assert_eq!(again.names.active(), to);
        assert_eq!(again.names.len(), live.iter().map(Vec::len).sum::<usize>());
        let after = names(&again, ROOT);
        assert_eq!(after.len(), before.len());
        for (i, (a, b)) in after.iter().zip(&before).enumerate() {
            assert_eq!(a, b, "entry {i}");
        }
        for (name, ino) in inos.iter().skip(1).step_by(2) {
            let dir = again.dir_of(ROOT).unwrap();
            assert_eq!(again.child(dir, name.as_bytes()), Some(*ino));
        }
    }

    #[test]
    fn a_change_killed_half_way_is_undone_to_what_can_be_trusted() {
        let mut inner = Inner::private(Arc::default());
        inner.push(ROOT, b"", attr(EntryKind::Dir, 1), 0).unwrap();
        let d = inner
            .upsert_child(ROOT, b"d", attr(EntryKind::Dir, 2), 5000)
            .unwrap();
        let a = inner
            .upsert_child(d, b"a", attr(EntryKind::File, 3), 5000)
            .unwrap();
        let b = inner
            .upsert_child(ROOT, b"b", attr(EntryKind::File, 4), 5000)
            .unwrap();
        let dm = inner.node(d).unwrap().dir();
        inner.set_dir_meta(dm, None, Some(Some(5000)));
        // Killed while replacing `a` by another object: the new record is
        // pushed, not yet in the run; and while `b`'s record was changed.
        inner.intend_dir(d);
        let twin = inner
            .push_flagged(d, b"a", attr(EntryKind::File, 30), 6000, 0)
            .unwrap();
        inner.intend_node(b);
        let again = attached(inner);
        // One `a`: the one the kernel may know (the older), the other out.
        assert_eq!(run(&again, d), vec![a as u32]);
        assert!(again.node(twin).unwrap().flags & DETACHED != 0);
        // The directory is listed again before it is trusted, its entries'
        // attributes revalidated, and `b` stat-ed before it is answered.
        assert_eq!(again.dir_of(d).unwrap().listed_ms, None);
        assert_eq!(again.node(a).unwrap().checked, 0);
        assert!(!again.node(b).unwrap().known());
        assert!(again.node(d).unwrap().known());
        let h = again.state.header();
        assert_eq!(h.intent_dir.load(Ordering::Relaxed), 0);
        assert_eq!(h.intent_node.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn only_entries_with_an_acl_hold_one_and_equal_acls_are_held_once() {
        let mut inner = Inner::private(Arc::default());
        inner.push(ROOT, b"", attr(EntryKind::Dir, 1), 0).unwrap();
        let files: Vec<u64> = (0..100u64)
            .map(|i| {
                let name = format!("f{i}");
                inner
                    .push(ROOT, name.as_bytes(), attr(EntryKind::File, 10 + i), 0)
                    .unwrap()
            })
            .collect();
        let acl = |b: u8| Acls {
            access: Some(vec![2, 0, 0, 0, b].into_boxed_slice()),
            default: None,
        };
        // Files without an ACL hold nothing but their flag bits.
        for &f in &files[..50] {
            assert!(inner.set_acls(f, Acls::default()).is_empty());
        }
        assert!(inner.acls.is_empty() && inner.acl_values.is_empty());
        // Fifty files under one default ACL: fifty map entries, one value.
        for &f in &files[50..] {
            inner.set_acls(f, acl(1));
        }
        assert_eq!((inner.acls.len(), inner.acl_values.len()), (50, 1));
        assert!(Arc::ptr_eq(
            &inner.acls_of(files[50]),
            &inner.acls_of(files[99])
        ));
        assert!(inner.acls_of(files[0]).is_empty());
        // An ACL removed at the source, an entry gone: their entries go.
        inner.set_acls(files[50], Acls::default());
        assert!(inner.acls_of(files[50]).is_empty());
        inner.mark_gone(files[51]);
        assert_eq!(inner.acls.len(), 48);
        // A fresh read of the attributes keeps the last known ACL (for
        // when the source does not answer) but marks it to be read again.
        let n = |inner: &Inner, f: u64| inner.node(f).unwrap().flags;
        assert_ne!(n(&inner, files[52]) & ACL_FRESH, 0);
        inner
            .set_attr(files[52], &attr(EntryKind::File, 62), 100)
            .unwrap();
        assert_eq!(n(&inner, files[52]) & (ACL_FRESH | ACL_KNOWN), ACL_KNOWN);
        assert_eq!(
            inner.acls_of(files[52]).access.as_deref(),
            Some(&[2, 0, 0, 0, 1][..])
        );
        // Values no entry holds are pruned as new ones come.
        for (i, &f) in files[52..].iter().enumerate() {
            inner.set_acls(f, acl(2 + i as u8));
        }
        assert_eq!(inner.acls.len(), 48);
        assert!(
            inner.acl_values.len() <= 2 * 48,
            "{}",
            inner.acl_values.len()
        );
    }

    #[test]
    fn a_server_that_attaches_keeps_the_acls_the_dead_one_held() {
        let mut inner = Inner::private(Arc::default());
        inner.push(ROOT, b"", attr(EntryKind::Dir, 1), 0).unwrap();
        let files: Vec<u64> = (0..10u64)
            .map(|i| {
                let name = format!("f{i}");
                inner
                    .push(ROOT, name.as_bytes(), attr(EntryKind::File, 10 + i), 0)
                    .unwrap()
            })
            .collect();
        let acl = |b: u8| Acls {
            access: Some(vec![2, 0, 0, 0, b].into_boxed_slice()),
            default: (b % 2 == 0).then(|| vec![b; 3].into_boxed_slice()),
        };
        // Four without an ACL (never logged), four with one, two not read.
        for &f in &files[..4] {
            inner.set_acls(f, Acls::default());
        }
        for (i, &f) in files[4..8].iter().enumerate() {
            inner.set_acls(f, acl(i as u8 % 2));
        }
        assert_eq!(inner.acl_log.len(), 4);
        let flags = |inner: &Inner, f: u64| inner.node(f).unwrap().flags & (ACL_KNOWN | ACL_FRESH);
        let mut again = attached(inner);
        for &f in &files[..8] {
            assert_eq!(flags(&again, f), ACL_KNOWN | ACL_FRESH, "{f}");
        }
        for &f in &files[..4] {
            assert!(again.acls_of(f).is_empty());
        }
        for (i, &f) in files[4..8].iter().enumerate() {
            assert_eq!(*again.acls_of(f), acl(i as u8 % 2));
        }
        assert_eq!(again.acl_values.len(), 2);
        for &f in &files[8..] {
            assert_eq!(flags(&again, f), 0);
        }
        // Killed after it logged a value and before it set the flag: the
        // entry is read again, and what it reads is logged (also "none").
        again
            .acl_log
            .push(AclEntry {
                ino: files[8] as u32,
                off: 0,
            })
            .unwrap();
        let mut again = attached(again);
        assert_eq!(flags(&again, files[8]), 0);
        again.set_acls(files[8], Acls::default());
        let again = attached(again);
        assert_eq!(flags(&again, files[8]), ACL_KNOWN | ACL_FRESH);
        assert!(again.acls_of(files[8]).is_empty());
        // A value that cannot be read back: read from the source again.
        let mut again = again;
        let at = again.acl_values[&again.acls_of(files[4])] as usize;
        again.acl_bytes[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes()[..]);
        again.acl_bytes[at + 4..at + 8].copy_from_slice(&u32::MAX.to_le_bytes()[..]);
        let again = attached(again);
        assert_eq!(flags(&again, files[4]), 0);
        assert_eq!(flags(&again, files[5]), ACL_KNOWN | ACL_FRESH);
    }

    #[test]
    fn acl_tables_stay_bounded_under_churn_and_survive_a_rewrite_cut_short() {
        let mut inner = Inner::private(Arc::default());
        inner.push(ROOT, b"", attr(EntryKind::Dir, 1), 0).unwrap();
        let files: Vec<u64> = (0..20u64)
            .map(|i| {
                let name = format!("f{i}");
                inner
                    .push(ROOT, name.as_bytes(), attr(EntryKind::File, 10 + i), 0)
                    .unwrap()
            })
            .collect();
        let acl = |n: u32| Acls {
            access: Some(n.to_le_bytes().to_vec().into_boxed_slice()),
            default: None,
        };
        // Every read of every entry a new value: the log and the values
        // are rewritten as they double, never grow with the reads.
        for round in 0..2000u32 {
            for (i, &f) in files.iter().enumerate() {
                inner.set_acls(f, acl(round * 100 + i as u32));
            }
            assert!(
                inner.acl_log.len() <= 2 * ACL_LOG_MIN,
                "{}",
                inner.acl_log.len()
            );
            assert!(inner.acl_bytes.len() <= 2 * ACL_VALUES_MIN);
        }
        let last = |i: usize| acl(1999 * 100 + i as u32);
        let again = attached(inner);
        for (i, &f) in files.iter().enumerate() {
            assert_eq!(*again.acls_of(f), last(i));
            assert_ne!(again.node(f).unwrap().flags & ACL_KNOWN, 0);
        }
        // A rewrite killed after it dropped the old log (the holders' bits
        // cleared first): their ACLs are read again, never taken for none.
        let mut inner = again;
        for &f in &files {
            inner.node_mut(f).unwrap().flags &= !(ACL_KNOWN | ACL_FRESH);
        }
        inner.acl_log.clear_and_release();
        let again = attached(inner);
        for &f in &files {
            assert_eq!(again.node(f).unwrap().flags & ACL_KNOWN, 0);
        }
    }

    #[test]
    fn attributes_round_trip_through_the_48_byte_record() {
        let mut inner = Inner::private(Arc::default());
        let mut root = attr(EntryKind::Dir, 1);
        (root.size, root.blocks, root.mtime_ns) = (4096, 8, 1_700_000_000_123_456_789);
        inner.push(ROOT, b"", root, 0).unwrap();
        // (size, st_blocks): ext4 and xfs files, a small file with inline
        // data, sparse and compressed files, extent-tree blocks, empty.
        let cases = [
            (1, 8),
            (4096, 8),
            (4097, 16),
            (60, 0),
            (1 << 30, 8),
            (1 << 20, 100),
            (128 << 20, 262_152),
            (0, 0),
            (100, 1),
            (u64::MAX / 2, u64::MAX / 1024),
        ];
        for (i, &(size, blocks)) in cases.iter().enumerate() {
            let mut a = attr(EntryKind::File, 100 + i as u64);
            (a.size, a.blocks, a.mtime_ns) = (size, blocks, -5 - i as i64);
            let ino = inner.push(ROOT, format!("f{i}").as_bytes(), a, 0).unwrap();
            let got = inner.attr_of(ino).unwrap();
            assert_eq!((got.size, got.blocks), (size, blocks), "case {i}");
            assert_eq!(got.mtime_ns, a.mtime_ns);
            // atime and ctime are answered as mtime.
            assert_eq!((got.atime_ns, got.ctime_ns), (a.mtime_ns, a.mtime_ns));
            assert_eq!(got.ino, a.ino);
        }
        // A directory's size lives in its `Dir`, beside its children.
        let mut d = attr(EntryKind::Dir, 50);
        (d.size, d.blocks) = (12288, 24);
        let sub = inner.push(ROOT, b"sub", d, 0).unwrap();
        inner.push(sub, b"x", attr(EntryKind::File, 51), 0).unwrap();
        inner.dir_mut(sub).unwrap().children.push(sub as u32 + 1);
        let got = inner.attr_of(sub).unwrap();
        assert_eq!((got.size, got.blocks), (12288, 24));
        (d.size, d.blocks) = (4096, 8);
        inner.set_attr(sub, &d, 1).unwrap();
        assert_eq!(inner.attr_of(sub).unwrap().size, 4096);
        assert_eq!(run(&inner, sub), vec![sub as u32 + 1]);
        assert_eq!(inner.attr_of(ROOT).unwrap().size, 4096);
    }

    #[test]
    fn blocks_codes_give_back_the_blocks_they_were_made_from() {
        for size in [
            0u64,
            1,
            511,
            512,
            513,
            4095,
            4096,
            4097,
            1 << 20,
            (1 << 40) + 3,
        ] {
            for blocks in [0u64, 1, 7, 8, 9, 16, 2048, 2056, size.div_ceil(512)] {
                match blocks_of(size, blocks_code(size, blocks)) {
                    Some(b) => assert_eq!(b, blocks, "size {size}"),
                    None => assert_eq!(blocks_code(size, blocks), BLOCKS_OTHER),
                }
            }
        }
        // The usual cases need no side entry.
        assert_eq!(blocks_code(1, 8), 3);
        assert_eq!(blocks_code(5000, 16), 3);
        assert_eq!(blocks_code(100, 1), 0);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]

        /// A large directory's fence finds every name a binary search of
        /// the whole run finds, and no other: names that share long
        /// prefixes (an image folder's), keys that tie in their 8 bytes,
        /// names outside the shared prefix, and removals (which the fence
        /// outlives up to a window's worth) between lookups.
        #[test]
        fn the_fence_of_a_large_directory_finds_what_the_whole_run_finds(
            n in FENCE_MIN..6000usize,
            // 0: distinct early; 1: a long shared prefix; 2: ties in the
            // first 8 bytes after the prefix.
            style in 0u8..3,
            seed in proptest::prelude::any::<u64>(),
            removals in 0usize..200,
        ) {
            let name_of = |i: usize| match style {
                0 => format!("{i:07}.jpg"),
                1 => format!("ILSVRC2012_val_{i:08}.JPEG"),
                _ => format!("img_{}_{i:06}", i % 7),
            };
            let mut inner = Inner::private(Arc::default());
            inner.push(ROOT, b"", attr(EntryKind::Dir, 1), 0).unwrap();
            let mut model = std::collections::BTreeMap::new();
            let mut kids = Vec::new();
            for i in 0..n {
                let name = name_of(i);
                let ino = inner.push(ROOT, name.as_bytes(), attr(EntryKind::File, 10 + i as u64), 0).unwrap();
                kids.push(ino as u32);
                model.insert(name, ino);
            }
            let mut sorted = kids;
            sorted.sort_unstable_by(|a, b| inner.name_of(*a as u64).cmp(inner.name_of(*b as u64)));
            inner.dir_mut(ROOT).unwrap().set_children(sorted);
            let mut rng = seed | 1;
            let mut next = move |m: usize| {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                (rng % m as u64) as usize
            };
            let check = |inner: &Inner, model: &std::collections::BTreeMap<String, u64>, probes: &[String]| {
                let dir = inner.dir_of(ROOT).unwrap();
                for p in probes {
                    proptest::prop_assert_eq!(inner.child(dir, p.as_bytes()), model.get(p).copied(), "{}", p);
                }
                Ok(())
            };
            let mut probes: Vec<String> = (0..300).map(|_| name_of(next(n + 50))).collect();
            probes.extend(["", "0", "zzzz", "ILSVRC", "img_", "img_9_999999"].map(String::from));
            check(&inner, &model, &probes)?;
            for r in 0..removals {
                let gone = name_of(next(n));
                inner.remove_child(ROOT, gone.as_bytes());
                model.remove(&gone);
                if r % 17 == 0 {
                    check(&inner, &model, &probes)?;
                }
            }
            check(&inner, &model, &probes)?;
            // Every remaining name is found at its own inode.
            let dir = inner.dir_of(ROOT).unwrap();
            for (name, ino) in &model {
                proptest::prop_assert_eq!(inner.child(dir, name.as_bytes()), Some(*ino));
            }
        }
    }

    #[test]
    fn lookups_of_new_names_in_a_directory_never_listed_are_not_quadratic() {
        let mut inner = Inner::private(Arc::default());
        inner.push(ROOT, b"", attr(EntryKind::Dir, 1), 0).unwrap();
        let n: u64 = 20_000;
        // Every name once, in a scrambled order (7919 is prime to n).
        let mut inos = HashMap::new();
        for k in 0..n {
            let i = k * 7919 % n;
            let name = format!("n{i:06}.JPEG");
            let ino = inner
                .upsert_child(ROOT, name.as_bytes(), attr(EntryKind::File, 100 + i), 0)
                .unwrap();
            inos.insert(name, ino);
        }
        // Moving the tail on each insert would be about n^2/4 = 1e8 moves.
        let bound = 4 * n * (n as f64).sqrt() as u64;
        eprintln!("{} moves for {n} lookups", inner.moves);
        assert!(
            inner.moves < bound,
            "{} moves for {n} lookups (bound {bound})",
            inner.moves
        );
        // Every name is found where it was put, and listed once.
        let dir = inner.dir_of(ROOT).unwrap();
        for (name, ino) in &inos {
            assert_eq!(inner.child(dir, name.as_bytes()), Some(*ino), "{name}");
        }
        let mut listed = run(&inner, ROOT);
        assert_eq!(listed.len() as u64, n);
        listed.sort_unstable();
        listed.dedup();
        assert_eq!(listed.len() as u64, n);
        // A lookup of a known name adds nothing.
        let again = inner
            .upsert_child(ROOT, b"n000007.JPEG", attr(EntryKind::File, 107), 0)
            .unwrap();
        assert_eq!(Some(&again), inos.get("n000007.JPEG"));
        assert_eq!(run(&inner, ROOT).len() as u64, n);
    }

    /// keep_cache's bit: set by an open at the record's version, read back
    /// at the next open of that version only, gone when the file changes
    /// or the kernel forgets the inode (not when it forgets some lookups).
    #[test]
    fn the_opened_bit_follows_the_version_and_the_kernels_inode() {
        let src = tempfile::tempdir().unwrap();
        let f = src.path().join("f");
        std::fs::write(&f, b"one").unwrap();
        let source = Arc::new(crate::source::DirSource::new(src.path().to_owned()));
        // Everything stale at once: every getattr asks the source.
        let ns = Namespace::new(source, Some(Duration::ZERO), Arc::default()).unwrap();
        let (ino, a) = ns.lookup(ROOT, "f".as_ref()).unwrap();
        ns.looked_up(ino);
        ns.looked_up(ino);
        let v = a.version();
        assert!(!ns.opened_at(ino, &v), "never opened");
        ns.note_opened(ino, &v);
        assert!(ns.opened_at(ino, &v));
        // An open of another version says nothing of this one's pages and
        // marks nothing.
        let other = SourceVersion { size: 9, ..v };
        assert!(!ns.opened_at(ino, &other));
        ns.note_opened(ino, &other);
        assert!(!ns.opened_at(ino, &other) && ns.opened_at(ino, &v));
        // The kernel still holds one lookup: its pages stay.
        assert_eq!(ns.forget(&[(ino, 1)]), Vec::<u64>::new());
        assert!(ns.opened_at(ino, &v));
        // Forgotten: the pages went with the inode.
        assert_eq!(ns.forget(&[(ino, 1)]), vec![ino]);
        assert!(!ns.opened_at(ino, &v));
        ns.note_opened(ino, &v);
        assert!(ns.opened_at(ino, &v));
        // The file changed at the source: the bit goes with the old version,
        // and an open of the old version (raced with the change) marks
        // nothing.
        std::fs::write(&f, b"three").unwrap();
        let a2 = ns.getattr(ino).unwrap();
        assert_eq!(a2.size, 5);
        let v2 = a2.version();
        assert!(!ns.opened_at(ino, &v) && !ns.opened_at(ino, &v2));
        ns.note_opened(ino, &v);
        assert!(!ns.opened_at(ino, &v2));
        ns.note_opened(ino, &v2);
        assert!(ns.opened_at(ino, &v2));
    }

    #[test]
    fn listed_entries_are_stat_ed_on_first_use_and_keep_their_attributes_when_listed_again() {
        let src = tempfile::tempdir().unwrap();
        std::fs::write(src.path().join("a"), b"aaa").unwrap();
        std::fs::write(src.path().join("b"), b"b").unwrap();
        let source = Arc::new(crate::source::DirSource::new(src.path().to_owned()));
        // Everything stale at once: every refresh lists again.
        let ns = Namespace::new(source, Some(Duration::ZERO), Arc::default()).unwrap();
        ns.refresh_dir(ROOT).unwrap();
        let listed = |ns: &Namespace| {
            let mut v = Vec::new();
            ns.read_dir(ROOT, 0, |e, _| {
                v.push((e.name.to_owned(), e.ino, e.known, e.attr.kind));
                false
            })
            .unwrap();
            v
        };
        let l = listed(&ns);
        assert_eq!(l.len(), 2);
        assert!(l.iter().all(|e| !e.2 && e.3 == EntryKind::File), "{l:?}");
        let (a, b) = (l[0].1, l[1].1);
        // "a" replaced by another object before its first stat: the stat
        // says which object the entry is (getdents' inode was a hint).
        std::fs::write(src.path().join("a.new"), b"aaaaa").unwrap();
        std::fs::rename(src.path().join("a.new"), src.path().join("a")).unwrap();
        assert_eq!(ns.getattr(a).unwrap().size, 5);
        assert!(ns.attrs_known(a) && !ns.attrs_known(b));
        // Listed again: same inodes; "a" keeps its attributes.
        ns.refresh_dir(ROOT).unwrap();
        let l = listed(&ns);
        assert_eq!((l[0].1, l[0].2, l[1].1, l[1].2), (a, true, b, false));
        assert_eq!(ns.inner.read().attr_of(a).unwrap().size, 5);
        // Replaced again after its stat: a listing sees another object (a
        // new inode, attributes unknown).
        std::fs::write(src.path().join("a.new"), b"a").unwrap();
        std::fs::rename(src.path().join("a.new"), src.path().join("a")).unwrap();
        ns.refresh_dir(ROOT).unwrap();
        let l = listed(&ns);
        assert!(l[0].1 != a && !l[0].2, "{l:?}");
        assert_eq!(
            ns.lookup(ROOT, "a".as_ref()).unwrap(),
            (l[0].1, ns.getattr(l[0].1).unwrap())
        );
    }

    #[test]
    fn a_listing_after_lookups_keeps_their_inodes_and_resumes_at_stable_offsets() {
        let src = tempfile::tempdir().unwrap();
        let n = 500;
        for i in 0..n {
            std::fs::write(src.path().join(format!("f{i:04}")), b"x").unwrap();
        }
        let source = Arc::new(crate::source::DirSource::new(src.path().to_owned()));
        let ns = Namespace::new(source, None, Arc::default()).unwrap();
        // Lookups of every third name, scrambled: more than the side run
        // holds, so it is merged on the way.
        let mut looked = Vec::new();
        for k in 0..n {
            let i = k * 13 % n;
            if i % 3 == 0 {
                let name = format!("f{i:04}");
                let (ino, _) = ns.lookup(ROOT, name.as_ref()).unwrap();
                looked.push((name, ino));
            }
        }
        let entries = |from: u64| {
            let mut v = Vec::new();
            ns.read_dir(ROOT, from, |e, next| {
                v.push((e.name.to_string_lossy().into_owned(), e.ino, next));
                false
            })
            .unwrap();
            v
        };
        // Before any listing: the names looked up, each once.
        let known = entries(0);
        assert_eq!(known.len(), looked.len());
        for (name, ino) in &looked {
            assert!(
                known.iter().any(|(n, i, _)| n == name && i == ino),
                "{name}"
            );
        }
        // A resume at any position gives the rest, as the whole listing
        // does.
        for (k, (_, _, next)) in known.iter().enumerate() {
            assert_eq!(entries(*next)[..], known[k + 1..]);
        }
        // The listing: every name, in order, the looked-up ones with their
        // inodes.
        ns.refresh_dir(ROOT).unwrap();
        let all = entries(0);
        let names: Vec<String> = (0..n).map(|i| format!("f{i:04}")).collect();
        assert_eq!(all.iter().map(|e| e.0.clone()).collect::<Vec<_>>(), names);
        for (name, ino) in &looked {
            assert!(all.iter().any(|(n, i, _)| n == name && i == ino), "{name}");
        }
        for (k, (_, _, next)) in all.iter().enumerate().step_by(37) {
            assert_eq!(entries(*next)[..], all[k + 1..]);
        }
        for (name, ino) in &looked {
            assert_eq!(ns.lookup(ROOT, name.as_ref()).unwrap().0, *ino);
        }
    }
}
