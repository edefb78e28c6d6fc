//! The books of the disk cache: one dense record per cached file version
//! (`Entry`, 40 bytes, in the policy's table: see docs/cache.md, "Per-file
//! memory: the cache index"), the state under the cache's lock, and the
//! eviction plan (which blocks go on disk once the policy has chosen its
//! victims). Bookkeeping only: the files are touched by the caller, after
//! the lock is released.
//!
//! Must never: hold a per-entry heap allocation for a file of one block,
//! or book a byte the cache does not write (invariant 3).

use super::*;

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

/// The index records of every cached block (for a snapshot).
pub(super) fn index_puts(books: &Books) -> impl Iterator<Item = Put> + '_ {
    books.iter().flat_map(|(key, e)| {
        e.blocks
            .iter()
            .enumerate()
            .filter_map(move |(i, b)| match b.slot {
                Slot::Present(sum) => Some(Put {
                    key: *key,
                    index: i as u32,
                    size: e.size(),
                    path_hash: key.path_part() as u64,
                    sum,
                    guest: b.guest,
                    meta_in_xattr: e.meta_in_xattr(),
                    table: e.table,
                }),
                _ => None,
            })
    })
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Slot {
    Empty,
    Writing,
    Present(Checksum),
}

/// One block of a cached file version: its slot and two bits.
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

/// The blocks of a file version: a one-block file (the bulk of a data set
/// of small files) keeps its block and its size inline in the record (24
/// bytes with the tag); a larger file's blocks, size and count of present
/// blocks are a side table behind one pointer (19 bytes per block).
#[derive(Debug)]
pub(super) enum Blocks {
    One { block: Block, size: u32 },
    Many(Box<Many>),
}

/// The books of a file of more than one block.
#[derive(Debug)]
pub(super) struct Many {
    pub(super) size: u64,
    pub(super) present: u32,
    pub(super) blocks: Box<[Block]>,
}

impl Blocks {
    /// No block present yet, of a file of `size` bytes in `n` blocks.
    pub(super) fn new(size: u64, n: u64) -> Self {
        match u32::try_from(size) {
            Ok(size) if n == 1 => Blocks::One {
                block: NO_BLOCK,
                size,
            },
            _ => Blocks::Many(Box::new(Many {
                size,
                present: 0,
                blocks: vec![NO_BLOCK; n as usize].into_boxed_slice(),
            })),
        }
    }
}

impl std::ops::Deref for Blocks {
    type Target = [Block];
    fn deref(&self) -> &[Block] {
        match self {
            Blocks::One { block, .. } => std::slice::from_ref(block),
            Blocks::Many(m) => &m.blocks,
        }
    }
}

impl std::ops::DerefMut for Blocks {
    fn deref_mut(&mut self) -> &mut [Block] {
        match self {
            Blocks::One { block, .. } => std::slice::from_mut(block),
            Blocks::Many(m) => &mut m.blocks,
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

/// The record of one cached file version: 32 bytes, alignment 8 (see
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
        match &self.blocks {
            Blocks::One { size, .. } => *size as u64,
            Blocks::Many(m) => m.size,
        }
    }

    /// Blocks present (not being written, not dropped).
    pub(super) fn present(&self) -> u32 {
        match &self.blocks {
            Blocks::One { block, .. } => matches!(block.slot, Slot::Present(_)) as u32,
            Blocks::Many(m) => m.present,
        }
    }

    /// Counts the present blocks again (after slots were set directly).
    pub(super) fn recount(&mut self) {
        if let Blocks::Many(m) = &mut self.blocks {
            m.present = m
                .blocks
                .iter()
                .filter(|b| matches!(b.slot, Slot::Present(_)))
                .count() as u32;
        }
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

    pub(super) fn slot(&self, i: usize) -> Option<&Slot> {
        self.blocks.get(i).map(|b| &b.slot)
    }

    /// Sets a block's slot, keeping the count of present blocks.
    pub(super) fn set_slot(&mut self, i: usize, slot: Slot) {
        let Some(b) = self.blocks.get_mut(i) else {
            return;
        };
        let was = matches!(b.slot, Slot::Present(_));
        let now = matches!(slot, Slot::Present(_));
        b.slot = slot;
        if let Blocks::Many(m) = &mut self.blocks {
            m.present = (m.present + now as u32).saturating_sub(was as u32);
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
                if matches!(e.blocks[i].slot, Slot::Present(_)) && e.blocks[i].guest == guest {
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
            if matches!(blk.slot, Slot::Present(_)) && blk.guest == guest {
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
