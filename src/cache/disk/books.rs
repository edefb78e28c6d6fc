//! The books of the disk cache: one dense record per cached file version
//! (`Entry`, 16 bytes, in the policy's table: see docs/cache.md, "Per-file
//! memory: the cache index"), the state under the cache's lock, and the
//! eviction plan (which blocks go on disk once the policy has chosen its
//! victims). Bookkeeping only: the files are touched by the caller, after
//! the lock is released.
//!
//! Must never: hold a per-entry heap allocation (or a checksum: that is in
//! its meta on disk) for a file of one block, or book a byte the cache does
//! not write (invariant 3).

use crate::cache::recover;

use super::{Checksum, Core, Evicted, Op, Policy, Put, Tier, VersionKey, SLOT};

pub(super) const ALLOC: u64 = 4096;

pub(super) fn round_alloc(n: u64) -> u64 {
    n.div_ceil(ALLOC) * ALLOC
}

/// Directory entries of a version's files (one or two), counted per version.
pub(super) const PER_FILE_OVERHEAD: u64 = 256;

/// The unit the books keep a part's bytes in (u32 of them: a part holds
/// at most 1 TiB; everything booked is a multiple of it).
pub(super) const BOOK_UNIT: u64 = 256;

/// Blocks of one file at most (the index's records and the in-memory slots
/// are sized for this; a larger file is not cached).
pub(super) const MAX_BLOCKS: u64 = 1 << 26;

/// The index records of every cached block (for a snapshot). A one-block
/// file's checksum is not in memory: its record carries zeros there, and
/// start-up does not read them (the block is checked against its meta on
/// disk when first served).
pub(super) fn index_puts(books: &Books) -> impl Iterator<Item = Put> + '_ {
    books.iter().flat_map(|(key, e)| {
        e.blocks
            .iter()
            .enumerate()
            .filter(|(_, b)| b.slot == Slot::Present)
            .map(move |(i, b)| Put {
                key: *key,
                index: i as u32,
                size: e.size(),
                path_hash: key.path_part() as u64,
                sum: e.sum(i).unwrap_or_default(),
                guest: b.guest,
                meta_in_xattr: e.meta_in_xattr(),
                table: e.table,
            })
    })
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(super) enum Slot {
    Empty,
    Writing,
    Present,
}

/// One block of a cached file version: its slot and two bits (3 bytes).
/// A present block's checksum is in the side table of a file of several
/// blocks ([`Many::sums`]); a one-block file's is only on disk, in its
/// meta (the xattr or the `.meta` slot), read when the block is served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Block {
    pub(super) slot: Slot,
    /// A guest block (meaningful where the slot is present or being
    /// written).
    pub(super) guest: bool,
    /// Checked against its checksum in this mount.
    pub(super) verified: bool,
}

pub(super) const NO_BLOCK: Block = Block {
    slot: Slot::Empty,
    guest: false,
    verified: false,
};

/// The books of a file of more than one block (19 bytes per block).
#[derive(Debug)]
pub(super) struct Many {
    pub(super) size: u64,
    pub(super) present: u32,
    pub(super) blocks: Box<[Block]>,
    /// The checksum of each present block (meaningless for the others).
    pub(super) sums: Box<[Checksum]>,
}

/// A one-block file's books, inline: a tag byte where a pointer's low byte
/// is (always odd here, always even in a pointer to [`Many`], whose
/// alignment is 8), its block and its size.
#[cfg(target_endian = "little")]
#[derive(Clone, Copy)]
#[repr(C)]
struct Inline {
    tag: u8,
    block: Block,
    size: u32,
}

#[cfg(target_endian = "big")]
#[derive(Clone, Copy)]
#[repr(C)]
struct Inline {
    size: u32,
    block: Block,
    tag: u8,
}

const INLINE_TAG: u8 = 1;

#[derive(Clone, Copy)]
union Repr {
    one: Inline,
    many: *mut Many,
}

/// The blocks of a file version, in 8 bytes: a one-block file (the bulk of
/// a data set of small files) keeps its block and its size inline; a larger
/// file's blocks, checksums, size and count of present blocks are a side
/// table behind one pointer, owned (freed on drop) as a `Box` would be.
///
/// (An enum of the two is 16 bytes: a `Box` has no niche for the inline
/// variant's bytes. The tag is the pointer's low bit instead.)
pub(super) struct Blocks(Repr);

// SAFETY: `Blocks` owns its `Many` alone, as a `Box<Many>` does; `Many` is
// Send and Sync.
unsafe impl Send for Blocks {}
// SAFETY: as above; shared access only reads.
unsafe impl Sync for Blocks {}

const _: () = assert!(std::mem::size_of::<Blocks>() == 8);
const _: () = assert!(std::mem::align_of::<Many>() >= 2);

impl Blocks {
    /// No block present yet, of a file of `size` bytes in `n` blocks.
    pub(super) fn new(size: u64, n: u64) -> Self {
        match u32::try_from(size) {
            Ok(size) if n == 1 => Blocks(Repr {
                one: Inline {
                    tag: INLINE_TAG,
                    block: NO_BLOCK,
                    size,
                },
            }),
            _ => {
                let many = Box::new(Many {
                    size,
                    present: 0,
                    blocks: vec![NO_BLOCK; n as usize].into_boxed_slice(),
                    sums: vec![Checksum::default(); n as usize].into_boxed_slice(),
                });
                Blocks(Repr {
                    many: Box::into_raw(many),
                })
            }
        }
    }

    fn is_inline(&self) -> bool {
        // SAFETY: both fields are plain bytes of the same 8; reading the
        // tag's byte of a pointer reads its address's low byte (even: `Many`
        // is aligned to 8), so an odd tag means `one` was written.
        unsafe { self.0.one.tag & 1 == INLINE_TAG }
    }

    /// The two cases, to match on.
    fn view(&self) -> View<'_> {
        if self.is_inline() {
            // SAFETY: the tag says `one` was written.
            View::One(unsafe { &self.0.one })
        } else {
            // SAFETY: not inline, so `many` holds the pointer from
            // `Box::into_raw`, owned by `self` until drop.
            View::Many(unsafe { &*self.0.many })
        }
    }

    fn view_mut(&mut self) -> ViewMut<'_> {
        // SAFETY: as in `view`; `&mut self` makes the access unique.
        if self.is_inline() {
            ViewMut::One(unsafe { &mut self.0.one })
        } else {
            ViewMut::Many(unsafe { &mut *self.0.many })
        }
    }

    /// A larger file's side table; None for a one-block file.
    pub(super) fn many(&self) -> Option<&Many> {
        match self.view() {
            View::One(_) => None,
            View::Many(m) => Some(m),
        }
    }

    pub(super) fn many_mut(&mut self) -> Option<&mut Many> {
        match self.view_mut() {
            ViewMut::One(_) => None,
            ViewMut::Many(m) => Some(m),
        }
    }

    /// The file's size.
    pub(super) fn size(&self) -> u64 {
        match self.view() {
            View::One(i) => i.size as u64,
            View::Many(m) => m.size,
        }
    }

    /// Whether the blocks are inline (a one-block file of at most 4 GiB).
    #[cfg(test)]
    pub(super) fn is_one(&self) -> bool {
        self.is_inline()
    }
}

enum View<'a> {
    One(&'a Inline),
    Many(&'a Many),
}

enum ViewMut<'a> {
    One(&'a mut Inline),
    Many(&'a mut Many),
}

impl Drop for Blocks {
    fn drop(&mut self) {
        if !self.is_inline() {
            // SAFETY: the pointer came from `Box::into_raw` and is dropped
            // once, here.
            drop(unsafe { Box::from_raw(self.0.many) });
        }
    }
}

impl std::fmt::Debug for Blocks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.view() {
            View::One(i) => f
                .debug_struct("One")
                .field("block", &i.block)
                .field("size", &i.size)
                .finish(),
            View::Many(m) => m.fmt(f),
        }
    }
}

impl std::ops::Deref for Blocks {
    type Target = [Block];
    fn deref(&self) -> &[Block] {
        match self.view() {
            View::One(i) => std::slice::from_ref(&i.block),
            View::Many(m) => &m.blocks,
        }
    }
}

impl std::ops::DerefMut for Blocks {
    fn deref_mut(&mut self) -> &mut [Block] {
        match self.view_mut() {
            ViewMut::One(i) => std::slice::from_mut(&mut i.block),
            ViewMut::Many(m) => &mut m.blocks,
        }
    }
}

/// [`Entry::bits`]: whether the meta file's bytes are charged to the guest
/// part.
pub(super) const META_ON_GUEST: u8 = 1;

/// [`Entry::bits`]: whether the data file (and `.meta`) exist on disk.
pub(super) const CREATED: u8 = 2;

/// [`Entry::bits`]: the meta is in the data file's [`META_XATTR`], not in a
/// `.meta` file.
pub(super) const META_IN_XATTR: u8 = 4;

/// Versions of one path the books keep at most, counting the one being
/// booked (more only while pinned: open in passthrough, or a write under
/// way). The one table finds a key among the other versions of its path
/// (they share a hash), so a file rewritten and read again and again must
/// not make each lookup of it a walk of its old versions: when a new
/// version is booked and its path has this many, the others not pinned go
/// as evictions (versions other than the one read now: stale, or soon).
pub(super) const MAX_VERSIONS: usize = 8;

/// Passthrough pins of one entry at most: more opens of it are served
/// through the daemon. Far below `u16::MAX`, so that the policy's count
/// (these plus the writes under way) cannot saturate either.
pub(super) const MAX_PASSTHROUGH_PINS: u16 = 1 << 14;

/// The record of one cached file version: 16 bytes, alignment 8 (see
/// docs/cache.md, "Per-file memory: the cache index"). What can be derived
/// is not stored: the meta file's booked bytes (from the layout), a
/// one-block file's count of present blocks (from its slot).
#[derive(Debug)]
pub(super) struct Entry {
    pub(super) blocks: Blocks,
    /// Tells this entry from a later one of the same key (the entry was
    /// dropped and the version cached again while a write was under way).
    pub(super) gen: u32,
    /// Offset of the slot table in the meta file (the index keeps 16 bits
    /// of it; `store` refuses a layout beyond).
    pub(super) table: u16,
    /// [`META_ON_GUEST`], [`CREATED`], [`META_IN_XATTR`].
    pub(super) bits: u8,
}

impl Entry {
    pub(super) fn new(size: u64, n: u64, table: u64, bits: u8, gen: u32) -> Self {
        Entry {
            blocks: Blocks::new(size, n),
            gen,
            table: table.min(u16::MAX as u64) as u16,
            bits,
        }
    }

    pub(super) fn size(&self) -> u64 {
        self.blocks.size()
    }

    /// Blocks present (not being written, not dropped).
    pub(super) fn present(&self) -> u32 {
        match self.blocks.many() {
            Some(m) => m.present,
            None => self
                .blocks
                .iter()
                .filter(|b| b.slot == Slot::Present)
                .count() as u32,
        }
    }

    /// Counts the present blocks again (after slots were set directly).
    pub(super) fn recount(&mut self) {
        if let Some(m) = self.blocks.many_mut() {
            m.present = m.blocks.iter().filter(|b| b.slot == Slot::Present).count() as u32;
        }
    }

    /// A present block's checksum, if the books keep it: a larger file's
    /// are in its side table; a one-block file's is only in its meta on
    /// disk (None: see [`Core::stored_sum`]).
    pub(super) fn sum(&self, i: usize) -> Option<Checksum> {
        let m = self.blocks.many()?;
        (m.blocks.get(i)?.slot == Slot::Present).then(|| m.sums[i])
    }

    pub(super) fn bit(&self, b: u8) -> bool {
        self.bits & b != 0
    }

    pub(super) fn set_bit(&mut self, b: u8, on: bool) {
        if on {
            self.bits |= b;
        } else {
            self.bits &= !b;
        }
    }

    pub(super) fn meta_on_guest(&self) -> bool {
        self.bit(META_ON_GUEST)
    }

    pub(super) fn created(&self) -> bool {
        self.bit(CREATED)
    }

    pub(super) fn meta_in_xattr(&self) -> bool {
        self.bit(META_IN_XATTR)
    }

    /// The meta's bytes as booked: a 4 KiB block for an xattr (ext4 keeps
    /// it in the inode, other file systems may not), else the `.meta`
    /// file's header and slot table in 4 KiB blocks.
    pub(super) fn meta_bytes(&self) -> u64 {
        if self.meta_in_xattr() {
            ALLOC
        } else {
            round_alloc(self.table as u64 + self.blocks.len() as u64 * SLOT)
        }
    }

    pub(super) fn slot(&self, i: usize) -> Option<Slot> {
        self.blocks.get(i).map(|b| b.slot)
    }

    /// Sets a block's slot, keeping the count of present blocks.
    pub(super) fn set_slot(&mut self, i: usize, slot: Slot) {
        let Some(b) = self.blocks.get_mut(i) else {
            return;
        };
        let was = b.slot == Slot::Present;
        let now = slot == Slot::Present;
        b.slot = slot;
        if let Some(m) = self.blocks.many_mut() {
            m.present = (m.present + now as u32).saturating_sub(was as u32);
        }
    }

    /// Marks a block present with this checksum (kept for a file of
    /// several blocks; a one-block file's is in its meta on disk).
    pub(super) fn set_present(&mut self, i: usize, sum: Checksum) {
        self.set_slot(i, Slot::Present);
        if let Some(s) = self.blocks.many_mut().and_then(|m| m.sums.get_mut(i)) {
            *s = sum;
        }
    }

    pub(super) fn complete(&self) -> bool {
        !self.blocks.is_empty() && self.present() as usize == self.blocks.len()
    }
}

/// The books: one dense table of records, one per cached file version,
/// holding the disk's record of it and the policy's (`policy.rs`), found
/// by version key through one hash table (the books hash a key by its path part,
/// so the same table finds a path's other versions).
pub(super) type Books = Policy<VersionKey, Entry>;

pub(super) fn new_books(capacity: u64, block_size: u64) -> Books {
    let mut p = Policy::new(capacity);
    p.set_grain(block_size);
    p.set_unit(BOOK_UNIT);
    p
}

pub(super) fn tier_of(guest: bool) -> Tier {
    if guest {
        Tier::Guest
    } else {
        Tier::Own
    }
}

#[derive(Debug)]
pub(super) struct State {
    pub(super) books: Books,
    pub(super) files_complete: u64,
    /// The last [`Entry::gen`] given out.
    pub(super) gens: u32,
    /// The index on disk (snapshot and journal); None if it could not be
    /// written (the next start-up scans the cache directory).
    pub(super) index: Option<recover::Index>,
}

impl State {
    pub(super) fn next_gen(&mut self) -> u32 {
        self.gens = self.gens.wrapping_add(1);
        self.gens
    }

    /// Appends a change to the index journal (under the state lock, so that
    /// the journal's order is the books' order).
    pub(super) fn log(&mut self, op: Op) {
        if let Some(ix) = &mut self.index {
            ix.append(&op);
        }
    }

    pub(super) fn forget(&mut self, key: &VersionKey) {
        if let Some((e, _)) = self.books.remove(key) {
            self.forgotten(key, &e);
        }
    }

    /// The books of an entry that went whole.
    pub(super) fn forgotten(&mut self, key: &VersionKey, e: &Entry) {
        self.log(Op::DropFile { key: *key });
        if e.complete() {
            self.files_complete -= 1;
        }
    }

    pub(super) fn touch(&mut self, key: VersionKey) {
        self.books.touch(key);
    }
}

/// What to do on disk for one evicted policy entry.
pub(super) enum Eviction {
    /// The whole file version goes.
    File(VersionKey),
    /// Only these blocks (index, length) go: the guests, or the own blocks,
    /// of a file whose other part stays.
    Blocks {
        key: VersionKey,
        table: u64,
        blocks: Vec<(u64, u64)>,
        meta_in_xattr: bool,
        /// The entry's generation (its slots stay `Writing` until punched).
        gen: u32,
    },
}

impl Core {
    /// Does the books' part of evicted parts (already off the policy's
    /// books); returns the disk work to do once the lock is released.
    pub(super) fn plan_evictions(
        &self,
        st: &mut State,
        victims: Vec<Evicted<VersionKey, Entry>>,
    ) -> Vec<Eviction> {
        let mut work = Vec::new();
        for v in victims {
            if let Some(e) = v.gone {
                st.forgotten(&v.key, &e);
                work.push(Eviction::File(v.key));
                continue;
            }
            // Only this part's blocks go; the meta file stays with the other.
            let guest = v.tier == Tier::Guest;
            let Some(e) = st.books.get_mut(&v.key) else {
                continue;
            };
            let was_complete = e.complete();
            let mut blocks = Vec::new();
            for i in 0..e.blocks.len() {
                if e.blocks[i].slot == Slot::Present && e.blocks[i].guest == guest {
                    if let Some(ix) = &mut st.index {
                        ix.append(&Op::DropBlock {
                            key: v.key,
                            index: i as u32,
                        });
                    }
                    // Writing until punched (see `drop_block`).
                    e.set_slot(i, Slot::Writing);
                    e.blocks[i].verified = false;
                    let len = e
                        .size()
                        .saturating_sub(i as u64 * self.block_size)
                        .min(self.block_size);
                    blocks.push((i as u64, len));
                }
            }
            let moved_meta = e.meta_on_guest() == guest;
            if moved_meta {
                e.set_bit(META_ON_GUEST, !guest);
            }
            let meta = e.meta_bytes() + PER_FILE_OVERHEAD;
            let table = e.table as u64;
            let meta_in_xattr = e.meta_in_xattr();
            let gen = e.gen;
            if was_complete && !e.complete() {
                st.files_complete -= 1;
            }
            if moved_meta {
                st.books.add(&v.key, meta, tier_of(!guest));
            }
            work.push(Eviction::Blocks {
                key: v.key,
                table,
                blocks,
                meta_in_xattr,
                gen,
            });
        }
        work
    }

    /// The bytes one part of an entry holds: its blocks, plus the meta file
    /// if it carries it.
    pub(super) fn part_bytes(&self, e: &Entry, guest: bool) -> u64 {
        let mut b = if e.meta_on_guest() == guest {
            e.meta_bytes() + PER_FILE_OVERHEAD
        } else {
            0
        };
        for (i, blk) in e.blocks.iter().enumerate() {
            if blk.slot == Slot::Present && blk.guest == guest {
                let len = e
                    .size()
                    .saturating_sub(i as u64 * self.block_size)
                    .min(self.block_size);
                b += round_alloc(len);
            }
        }
        b
    }
}
