//! The namespace's table: every inode the mount knows, as compact records
//! in the shared state (a dense table of 48-byte nodes, one name arena,
//! interned attributes, each directory's sorted run of children and its
//! side run), with the operations on it: lookups, listings merged in,
//! lookup counts and forgetting, ACLs, compaction. Pure bookkeeping under
//! the namespace's lock: nothing here calls the source, waits or knows of
//! time beyond the ticks it is given; `namespace.rs` does the revalidation
//! and the source's I/O around it.

use crate::source::{Acls, EntryKind, SourceAttr, SourceVersion};
use crate::sys::shm::{Pod, Region, SharedState, ShmVec};
use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::io;
use std::ops::Range;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

/// The root's inode number (FUSE's convention).
pub const ROOT: u64 = 1;

/// `Node::dir` of a node that is not a directory.
pub(super) const NO_DIR: u32 = u32::MAX;
/// `Node::flags`: the entry left the tree and the kernel forgot it: its
/// name is gone (only its inode number stays taken).
pub(super) const GONE: u8 = 1;
/// `Node::flags`: listed (name, kind and source inode from `getdents`) but
/// never stat-ed: the attributes in the record are placeholders, never
/// handed out; a lookup or getattr stats the entry first.
pub(super) const UNKNOWN: u8 = 2;
/// `Node::flags`: an unknown entry whose stat-ahead was started (not
/// started again; cleared with `UNKNOWN`).
pub(super) const AHEAD: u8 = 4;
/// `Node::flags`: the kernel opened this file at the version in the record
/// and has held the inode since, so the pages it caches are of this
/// version (FUSE's keep_cache). Cleared when the version changes and when
/// the kernel forgets the inode (its pages go with it). One bit here
/// instead of a table of versions by inode in the open-file table: 24
/// bytes plus a hash table's slack for every file ever opened.
pub(super) const OPENED: u8 = 8;
/// `Node::flags`: the entry is in no directory run (it left the tree, and
/// the kernel still holds it): a server that attaches to the shared state
/// rebuilds each directory's runs from the nodes whose parent it is,
/// without these.
pub(super) const DETACHED: u8 = 16;
/// `Node::flags`: the entry is in its directory's side run (found by a
/// lookup since the last listing), not the main one: the runs a new server
/// rebuilds give every entry the readdir position it had.
pub(super) const SIDE: u8 = 32;
/// `Node::flags`: the entry's POSIX ACLs were read from the source (none,
/// unless the ACL log of the shared state has a value for it: see
/// [`AclEntry`]): kept, like the attributes, as the last known answer, and
/// by a server that attaches to the shared state. Set only once the log
/// says the value read, so that no server answers "no ACL" for an entry
/// that has one.
pub(super) const ACL_KNOWN: u8 = 64;
/// `Node::flags`: the ACLs were read since the attributes last were (a
/// fresh read of the attributes clears it): they are answered without
/// asking the source while the attributes are fresh.
pub(super) const ACL_FRESH: u8 = 128;
/// `Node::checked` counts ticks of this many ms since the namespace started
/// (u32: 2.2 years). Rounded down, so an entry is revalidated up to one tick
/// early, never late.
pub(super) const TICK_MS: u64 = 16;
/// Dead name bytes below which the arena is never compacted.
pub(super) const COMPACT_MIN: usize = 1 << 20;

/// One inode: 48 bytes, no heap of its own. It lives in the shared state
/// (`shm`), so its layout is fixed (`repr(C)`).
///
/// atime and ctime are not kept: both are answered as mtime (what rclone
/// and mountpoint-s3 answer too; training loaders read neither). st_blocks
/// is kept exactly, as a code (see [`blocks_code`]).
#[derive(Debug)]
#[repr(C)]
pub(super) struct Node {
    /// A file's size; a directory's index in `Inner::dirs` (`NO_DIR` when
    /// it has none), its size being kept in its `Dir`.
    pub(super) size: u64,
    pub(super) mtime_ns: i64,
    /// The source's inode number.
    pub(super) src_ino: u64,
    pub(super) parent: u32,
    /// The name: `name_len` bytes at `name_off` in `Inner::names`.
    pub(super) name_off: u32,
    /// When the attributes were last read from the source (ticks).
    pub(super) checked: u32,
    /// The kernel's lookup count (FORGET takes it back); counted under the
    /// read lock.
    pub(super) lookups: AtomicU32,
    /// Index in `Inner::classes`: (mode, uid, gid, nlink, rdev).
    pub(super) class: u32,
    /// st_blocks as a function of the size ([`blocks_code`]).
    pub(super) blocks: u8,
    pub(super) name_len: u8,
    pub(super) kind: u8,
    /// `GONE`, `UNKNOWN`, `AHEAD`, `OPENED`, `DETACHED`, `SIDE`,
    /// `ACL_KNOWN`, `ACL_FRESH`.
    pub(super) flags: u8,
}

// SAFETY: repr(C), plain integers (and an atomic integer), no padding.
unsafe impl Pod for Node {}

/// What a directory keeps in the shared state beside its node (by
/// directory index): its size, and when it was last listed in full
/// (`NEVER`: not since the mount). The rest of [`Dir`] is rebuilt.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub(super) struct DirMeta {
    pub(super) size: u64,
    pub(super) listed_ms: u64,
}

// SAFETY: repr(C), two integers.
unsafe impl Pod for DirMeta {}

/// `DirMeta::listed_ms` of a directory not listed in full.
pub(super) const NEVER: u64 = u64::MAX;

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
pub(super) struct AclEntry {
    pub(super) ino: u32,
    pub(super) off: u32,
}

// SAFETY: repr(C), two integers.
unsafe impl Pod for AclEntry {}

/// `AclEntry::off`: the entry has no ACL (any more).
pub(super) const NO_ACL: u32 = u32::MAX;
/// Log entries and value bytes below which the ACL tables are never
/// rewritten.
pub(super) const ACL_LOG_MIN: usize = 1024;
pub(super) const ACL_VALUES_MIN: usize = 64 << 10;

/// An ACL value as `Region::AclValues` holds it: for the access ACL, then
/// the default one, a u32 (little-endian) length (`u32::MAX`: none) and
/// the bytes.
pub(super) fn encode_acls(a: &Acls) -> Vec<u8> {
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
pub(super) fn decode_acls(b: &[u8]) -> Option<Acls> {
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
pub(super) struct OddBlocks {
    pub(super) src_ino: u64,
    pub(super) blocks: u64,
}

// SAFETY: repr(C), two integers.
unsafe impl Pod for OddBlocks {}

impl Node {
    /// Whether this is the file version `v` (known, same size, mtime and
    /// source inode).
    pub(super) fn is_version(&self, v: &SourceVersion) -> bool {
        !self.is_dir()
            && self.known()
            && self.size == v.size
            && self.mtime_ns == v.mtime_ns
            && self.src_ino == v.ino
    }

    /// Whether the attributes were read from the source (not only listed).
    pub(super) fn known(&self) -> bool {
        self.flags & UNKNOWN == 0
    }

    pub(super) fn is_dir(&self) -> bool {
        self.kind == kind_code(EntryKind::Dir)
    }

    /// Index in `Inner::dirs`, or `NO_DIR` (a directory's kind never
    /// changes: `Inner::set_attr` keeps it).
    pub(super) fn dir(&self) -> u32 {
        if self.is_dir() {
            u32::try_from(self.size).unwrap_or(NO_DIR)
        } else {
            NO_DIR
        }
    }
}

const _: () = assert!(std::mem::size_of::<Node>() == 48);

pub(super) fn kind_code(k: EntryKind) -> u8 {
    match k {
        EntryKind::Dir => 0,
        EntryKind::File => 1,
        EntryKind::Symlink => 2,
        EntryKind::Other => 3,
    }
}

pub(super) fn kind_of(code: u8) -> EntryKind {
    match code {
        0 => EntryKind::Dir,
        1 => EntryKind::File,
        2 => EntryKind::Symlink,
        _ => EntryKind::Other,
    }
}

/// The attributes held for an entry known only from a listing: its kind
/// and source inode, nothing else (never handed out; see `UNKNOWN`).
pub(super) fn placeholder(kind: EntryKind, ino: u64) -> SourceAttr {
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
pub(super) fn blocks_code(size: u64, blocks: u64) -> u8 {
    if blocks == 0 {
        return BLOCKS_ZERO;
    }
    (0..=BLOCKS_MAX_SHIFT)
        .find(|&k| blocks_of(size, k) == Some(blocks))
        .unwrap_or(BLOCKS_OTHER)
}

/// The blocks that `code` says for `size` (None for `BLOCKS_OTHER`).
pub(super) fn blocks_of(size: u64, code: u8) -> Option<u64> {
    match code {
        BLOCKS_ZERO => Some(0),
        k if k <= BLOCKS_MAX_SHIFT => Some(size.div_ceil(512 << k) << k),
        _ => None,
    }
}

/// Allocation units tried: 512 bytes to 1 GiB.
pub(super) const BLOCKS_MAX_SHIFT: u8 = 21;
pub(super) const BLOCKS_ZERO: u8 = 254;
pub(super) const BLOCKS_OTHER: u8 = 255;

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
pub(super) struct Dir {
    pub(super) children: Vec<u32>,
    pub(super) side: Vec<u32>,
    pub(super) listed_ms: Option<u64>,
    /// The directory's own size (st_size) as the source gave it.
    pub(super) size: u64,
    /// A large directory's sampled index into `children` (see [`Fence`]),
    /// built by the first lookup that needs it; dropped whenever
    /// `children` is rebuilt.
    pub(super) fence: OnceLock<Box<Fence>>,
    /// Entries removed from `children` since it was last rebuilt: the
    /// fence stays usable, its windows widened by that many positions.
    pub(super) removed: usize,
}

/// A directory of at least [`FENCE_MIN`] entries has a fence.
pub(super) const FENCE_MIN: usize = 2048;
/// One fence key per this many children: 8 bytes per 64 entries.
pub(super) const FENCE_STEP: usize = 64;

/// A sampled index of a large sorted run of names, so that a lookup in a
/// flat directory of a million files does not walk twenty random records
/// and names: the key of every 64th name, where a name's key is its 8
/// bytes after the prefix all the run's names share (big-endian, zero
/// padded: keys are in the names' order, ties allowed). A lookup searches
/// the keys (a dense array), then the names of the one or two windows of
/// 64 whose keys bound its own.
#[derive(Debug)]
pub(super) struct Fence {
    /// The prefix every name of the run shares.
    pub(super) prefix: Box<[u8]>,
    pub(super) keys: Vec<u64>,
    /// `Dir::removed` when the fence was built.
    pub(super) removed_at_build: usize,
}

impl Fence {
    /// The fence of `children` (sorted by name, not empty).
    pub(super) fn build<'a>(
        children: &[u32],
        name_of: impl Fn(u32) -> &'a [u8],
        removed: usize,
    ) -> Fence {
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
    pub(super) fn window(&self, name: &[u8], len: usize, removed: usize) -> Option<Range<usize>> {
        let k = fence_key(name.strip_prefix(&*self.prefix)?);
        let lo = self.keys.partition_point(|&f| f < k).saturating_sub(1) * FENCE_STEP;
        let hi = self.keys.partition_point(|&f| f <= k) * FENCE_STEP;
        // Removals only move entries toward the start.
        let shift = removed.saturating_sub(self.removed_at_build);
        Some(lo.saturating_sub(shift).min(len)..hi.min(len))
    }
}

pub(super) fn fence_key(rest: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = rest.len().min(8);
    b[..n].copy_from_slice(&rest[..n]);
    u64::from_be_bytes(b)
}

/// Where a child is in its directory's runs.
#[derive(Clone, Copy, Debug)]
pub(super) enum Slot {
    Main(usize),
    Side(usize),
}

/// The side run is merged when it has more entries than this or than the
/// square root of the main run's.
pub(super) const SIDE_MIN: usize = 32;

impl Dir {
    /// The child at readdir position `i` (`children`, then `side`).
    pub(super) fn get(&self, i: usize) -> Option<u32> {
        match i.checked_sub(self.children.len()) {
            None => self.children.get(i).copied(),
            Some(j) => self.side.get(j).copied(),
        }
    }

    pub(super) fn len(&self) -> usize {
        self.children.len() + self.side.len()
    }

    pub(super) fn at(&self, slot: Slot) -> u32 {
        match slot {
            Slot::Main(i) => self.children[i],
            Slot::Side(i) => self.side[i],
        }
    }

    pub(super) fn set(&mut self, slot: Slot, ino: u32) {
        match slot {
            Slot::Main(i) => self.children[i] = ino,
            Slot::Side(i) => self.side[i] = ino,
        }
    }

    pub(super) fn remove(&mut self, slot: Slot) -> u32 {
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
    pub(super) fn set_children(&mut self, children: Vec<u32>) {
        self.children = children;
        self.fence = OnceLock::new();
    }

    /// Whether the side run is due to be merged.
    pub(super) fn side_full(&self) -> bool {
        let n = self.children.len();
        self.side.len() > SIDE_MIN && self.side.len() * self.side.len() > n
    }
}

/// (mode, uid, gid, nlink, rdev): shared by most entries of a data set.
pub(super) type Class = [u32; 5];

#[derive(Debug)]
pub(super) struct Inner {
    /// The shared state the tables below live in (its header: the
    /// intents, the live name arena).
    pub(super) state: Arc<SharedState>,
    /// Node of inode `i` at index `i - 1`.
    pub(super) nodes: ShmVec<Node>,
    /// Every name, back to back.
    pub(super) names: Names,
    /// Bytes of `names` no node uses any more.
    pub(super) dead_names: usize,
    /// Entries that left the tree since the last sweep.
    pub(super) unlinked: u64,
    pub(super) dirs: Vec<Dir>,
    /// Each directory's [`DirMeta`], by the same index as `dirs`.
    pub(super) dir_meta: ShmVec<DirMeta>,
    /// Directories of gone nodes, free for the next directory.
    pub(super) free_dirs: Vec<u32>,
    pub(super) classes: ShmVec<Class>,
    pub(super) class_ids: HashMap<Class, u32>,
    /// st_blocks of the source inodes whose blocks are not their size
    /// rounded to a unit (`BLOCKS_OTHER`): by source inode, which hard
    /// links share. Kept for the mount's life (one entry per such inode).
    pub(super) odd_blocks: HashMap<u64, u64>,
    /// `odd_blocks` as the shared state keeps it (a log).
    pub(super) odd_log: ShmVec<OddBlocks>,
    pub(super) known_bytes: u64,
    /// Where `known_bytes` is published (the cache policy reads it).
    pub(super) known_sink: Arc<AtomicU64>,
    /// Bumped on every change (so the manifest is saved only when needed).
    pub(super) changes: u64,
    /// Child entries moved by inserts into, and merges of, directory runs
    /// (tests check that lookups are not quadratic).
    pub(super) moves: u64,
    /// The POSIX ACLs of the entries known to have one, by inode: one map
    /// entry per such entry, the values shared; what the ACL log says for
    /// them (rebuilt from it by a server that attaches).
    pub(super) acls: HashMap<u32, Arc<Acls>>,
    /// Every distinct ACL value held, each once (files under one default
    /// ACL all carry the same), with its offset in `acl_bytes`: pruned of
    /// values no entry holds when it has doubled since the last prune.
    pub(super) acl_values: HashMap<Arc<Acls>, u32>,
    pub(super) acl_values_pruned: usize,
    /// The ACL values and the ACL log in the shared state ([`AclEntry`]).
    pub(super) acl_bytes: ShmVec<u8>,
    pub(super) acl_log: ShmVec<AclEntry>,
    /// Entries whose ACL is not known ([`ACL_KNOWN`] clear) but for which
    /// the log has a value (a server killed between the log and the flag):
    /// the next read of their ACL is logged, whatever it is.
    pub(super) acl_stale: HashSet<u32>,
    /// The sizes of the log and the values after their last rewrite.
    pub(super) acl_compacted: (usize, usize),
    /// The answer for an entry without ACLs.
    pub(super) no_acls: Arc<Acls>,
}

pub(super) fn too_many() -> io::Error {
    io::Error::new(
        io::ErrorKind::OutOfMemory,
        "namespace full (2^32 inodes or 4 GiB of names)",
    )
}

/// The name arena: two regions of the shared state, one live
/// (`Header::names_active`), the other written by a compaction, then
/// switched to.
#[derive(Debug)]
pub(super) struct Names {
    pub(super) arenas: [ShmVec<u8>; 2],
}

impl Names {
    pub(super) fn active(&self) -> usize {
        let h = self.arenas[0].state().header();
        h.names_active.load(Ordering::Acquire) as usize & 1
    }

    pub(super) fn live(&self) -> &ShmVec<u8> {
        &self.arenas[self.active()]
    }

    pub(super) fn len(&self) -> usize {
        self.live().len()
    }

    pub(super) fn get(&self, r: Range<usize>) -> Option<&[u8]> {
        self.live().get(r)
    }

    pub(super) fn extend_from_slice(&mut self, name: &[u8]) -> io::Result<()> {
        let a = self.active();
        self.arenas[a]
            .extend_from_slice(name)
            .map_err(|_| too_many())
    }
}

/// The tables of the namespace in `state`, and nothing else of it (its
/// derived indexes empty).
pub(super) fn tables(state: &Arc<SharedState>, known_sink: Arc<AtomicU64>) -> io::Result<Inner> {
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
    pub(super) fn new(state: &Arc<SharedState>, known_sink: Arc<AtomicU64>) -> io::Result<Self> {
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
    pub(super) fn private(known_sink: Arc<AtomicU64>) -> Self {
        let state = SharedState::create().expect("memfd for the namespace");
        Inner::new(&state, known_sink).expect("a new state")
    }

    /// Writes a directory's size and listing time through to its
    /// [`DirMeta`] in the shared state.
    pub(super) fn set_dir_meta(
        &mut self,
        d: u32,
        size: Option<u64>,
        listed_ms: Option<Option<u64>>,
    ) {
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
    pub(super) fn intend_node(&self, ino: u64) {
        self.state.header().intent_node.store(ino, Ordering::SeqCst);
        // (the record's stores come after the mark, also for the compiler)
        std::sync::atomic::fence(Ordering::SeqCst);
    }

    pub(super) fn done_node(&self) {
        std::sync::atomic::fence(Ordering::SeqCst);
        self.state.header().intent_node.store(0, Ordering::SeqCst);
    }

    /// Marks directory `ino`'s runs as in the middle of a change (until
    /// [`Inner::done_dir`]): a server that finds the mark when it attaches
    /// lists the directory again before it trusts its runs.
    pub(super) fn intend_dir(&self, ino: u64) {
        self.state.header().intent_dir.store(ino, Ordering::SeqCst);
        std::sync::atomic::fence(Ordering::SeqCst);
    }

    pub(super) fn done_dir(&self) {
        std::sync::atomic::fence(Ordering::SeqCst);
        self.state.header().intent_dir.store(0, Ordering::SeqCst);
    }

    /// The ACLs the namespace holds for `ino` (none if it holds none).
    pub(super) fn acls_of(&self, ino: u64) -> Arc<Acls> {
        let live = self.node(ino).is_some();
        let held = live.then(|| self.acls.get(&(ino as u32))).flatten();
        held.map_or_else(|| Arc::clone(&self.no_acls), Arc::clone)
    }

    /// Stores `acls`, just read from the source, as `ino`'s: in the ACL
    /// log first (when it says otherwise), then the record's flags. If the
    /// shared state has no room for it, the entry's ACL is not held (it
    /// is read again at each ask).
    pub(super) fn set_acls(&mut self, ino: u64, acls: Acls) -> Arc<Acls> {
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
    pub(super) fn acls_unheld(&mut self, ino: u64, value: Arc<Acls>) -> Arc<Acls> {
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
    pub(super) fn acl_value(&mut self, acls: Acls) -> Result<(Arc<Acls>, u32), Arc<Acls>> {
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
    pub(super) fn maybe_compact_acls(&mut self) {
        let (log0, bytes0) = self.acl_compacted;
        let due = self.acl_log.len() >= 2 * log0.max(ACL_LOG_MIN)
            || self.acl_bytes.len() >= 2 * bytes0.max(ACL_VALUES_MIN);
        if due {
            self.compact_acls();
        }
    }

    pub(super) fn compact_acls(&mut self) {
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
    pub(super) fn rebuild_acls(&mut self) {
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
    pub(super) fn node(&self, ino: u64) -> Option<&Node> {
        let i = usize::try_from(ino.checked_sub(1)?).ok()?;
        self.nodes.get(i).filter(|n| n.flags & GONE == 0)
    }

    pub(super) fn node_mut(&mut self, ino: u64) -> Option<&mut Node> {
        let i = usize::try_from(ino.checked_sub(1)?).ok()?;
        self.nodes.get_mut(i).filter(|n| n.flags & GONE == 0)
    }

    pub(super) fn name(&self, n: &Node) -> &[u8] {
        let at = n.name_off as usize;
        self.names.get(at..at + n.name_len as usize).unwrap_or(&[])
    }

    pub(super) fn name_of(&self, ino: u64) -> &[u8] {
        self.node(ino).map(|n| self.name(n)).unwrap_or(&[])
    }

    pub(super) fn dir(&self, n: &Node) -> Option<&Dir> {
        self.dirs.get(n.dir() as usize)
    }

    pub(super) fn dir_of(&self, ino: u64) -> Option<&Dir> {
        self.dir(self.node(ino)?)
    }

    pub(super) fn dir_mut(&mut self, ino: u64) -> Option<&mut Dir> {
        let d = self.node(ino)?.dir();
        self.dirs.get_mut(d as usize)
    }

    pub(super) fn attr(&self, n: &Node) -> SourceAttr {
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

    pub(super) fn attr_of(&self, ino: u64) -> Option<SourceAttr> {
        Some(self.attr(self.node(ino)?))
    }

    /// The attributes of `ino` if they were ever read from the source (an
    /// entry only listed has none to answer with).
    pub(super) fn known_attr_of(&self, ino: u64) -> Option<SourceAttr> {
        let n = self.node(ino)?;
        n.known().then(|| self.attr(n))
    }

    pub(super) fn class(&mut self, a: &SourceAttr) -> io::Result<u32> {
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
    pub(super) fn set_attr(&mut self, ino: u64, a: &SourceAttr, now: u64) -> io::Result<()> {
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
    pub(super) fn set_node_attr(
        &mut self,
        ino: u64,
        a: &SourceAttr,
        class: u32,
        blocks: u8,
        now: u64,
    ) -> Option<u32> {
        let n = self.node_mut(ino)?;
        if !n.is_version(&a.version()) {
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

    pub(super) fn path(&self, mut ino: u64) -> Option<PathBuf> {
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
    pub(super) fn find_child(&self, dir: &Dir, name: &[u8]) -> Result<Slot, usize> {
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
    pub(super) fn child(&self, dir: &Dir, name: &[u8]) -> Option<u64> {
        self.find_child(dir, name).ok().map(|s| dir.at(s) as u64)
    }

    /// Merges directory `ino`'s side run into its main run: a binary
    /// search per side entry and one copy of the main run.
    pub(super) fn merge_side(&mut self, ino: u64) {
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

    pub(super) fn account(&mut self, old: Option<&SourceAttr>, new: Option<&SourceAttr>) {
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
    pub(super) fn push(
        &mut self,
        parent: u64,
        name: &[u8],
        attr: SourceAttr,
        now: u64,
    ) -> io::Result<u64> {
        self.push_flagged(parent, name, attr, now, 0)
    }

    /// [`Inner::push`] with `flags` set in the record from the start. The
    /// record is whole (attributes, flags, a directory's `DirMeta`) before
    /// the push that publishes it: a server that dies at any point leaves
    /// no half-made entry.
    pub(super) fn push_flagged(
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
    pub(super) fn push_listed(
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
    pub(super) fn mark_unknown(&mut self, ino: u64) {
        if let Some(n) = self.node_mut(ino) {
            n.flags |= UNKNOWN;
            n.checked = 0;
        }
    }

    /// Updates or replaces the child `name` of `parent` with a fresh `attr`;
    /// returns its inode.
    pub(super) fn upsert_child(
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
    pub(super) fn replace_child(
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
    pub(super) fn insert_side(
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
    pub(super) fn for_each_in_tree(&self, mut f: impl FnMut(u64, &Node)) {
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
    pub(super) fn for_each_in_tree_ino(&self, mut f: impl FnMut(u64)) {
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

    pub(super) fn remove_child(&mut self, parent: u64, name: &[u8]) {
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
    pub(super) fn unlink(&mut self, ino: u64) {
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
    pub(super) fn reachable(&self, mut ino: u64) -> bool {
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
    pub(super) fn forget(&mut self, ino: u64, n: u64) {
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
    pub(super) fn unlinked(&mut self, ino: u64) {
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
    pub(super) fn sweep(&mut self) {
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
    pub(super) fn mark_gone(&mut self, ino: u64) {
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
    pub(super) fn compact_names(&mut self) {
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
    pub(super) fn finish_switch(&mut self, to: usize) {
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
    pub(super) fn rebuild(&mut self) {
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
    pub(super) fn sort_runs(&mut self, d: usize) {
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

pub(super) fn enoent() -> io::Error {
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
}
