//! The cache's admission and eviction policy, made for training: every epoch
//! reads the whole data set once in a new random order. Under that pattern
//! LRU is close to the worst policy and "keep what you have" is optimal
//! (shared/paper.md), so this policy admits while there is room, never churns
//! the current data set's entries to make room for other entries of it, and
//! evicts only stale versions and entries that nobody has read for two full
//! passes over the data set (a working set that moved on).
//!
//! With a peer cache, entries come in two tiers: this node's own blocks, and
//! guests (blocks owned by another node, kept because this node read them).
//! Guests live only in spare room: a guest is admitted only into free space
//! (or space of stale and abandoned entries), never by evicting anything
//! else, and own entries evict guests, oldest first, before anything of the
//! current data set, so the caches of a cluster together hold as much of the
//! data set as they can.
//!
//! Pure bookkeeping: no I/O, no clocks, no threads. The caller owns the lock
//! and does the unlinking; the simulation test drives this exact code.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;

use super::record_index::RecordIndex;

/// What the policy decided for a write.
#[derive(Debug, PartialEq, Eq)]
pub enum Admission<K, X = ()> {
    /// Write it, after removing these parts (already taken off the books).
    Admit { evict: Vec<Evicted<K, X>> },
    /// Do not write it: the cache is full of data still in use.
    Reject,
}

/// A part of an entry taken off the books to make room.
#[derive(Debug, PartialEq, Eq)]
pub struct Evicted<K, X = ()> {
    pub key: K,
    /// Which part went (meaningful when the entry stays: `gone` is None).
    pub tier: Tier,
    /// The entry's record, if the entry went whole (it had no other part).
    pub gone: Option<X>,
}

/// Which tier a part of an entry belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// This node's own blocks (or a node without peers).
    Own,
    /// Blocks owned by another node: only in spare room, evicted first.
    Guest,
}

impl Tier {
    fn bit(self) -> u8 {
        match self {
            Tier::Own => OWN,
            Tier::Guest => GUEST,
        }
    }
}

/// How the books hash a key: by a part of it, so that keys with the same
/// part are found together ([`Policy::keys_like`]): the disk cache's
/// version keys hash by their path part, so one table finds a version and
/// the other versions of its path. (Seeded by a `RandomState` of the
/// books.)
pub trait BookKey: Copy + Eq {
    fn book_part(&self) -> u32;
}

impl BookKey for u32 {
    fn book_part(&self) -> u32 {
        *self
    }
}

/// No entry (the end of a list).
const NIL: u32 = u32::MAX;
/// The lists: every entry by last access; the guests (entries with a guest
/// part, not stale) by last access; the stale entries, in the order they
/// were marked.
const BY_LAST: usize = 0;
const GUESTS: usize = 1;
const STALE: usize = 2;
/// Flags of an entry: its parts, and whether it is stale.
const OWN: u8 = 1;
const GUEST: u8 = 2;
const BOTH: u8 = OWN | GUEST;
const STALE_F: u8 = 4;
/// [`Entry::own`] of an entry without an own part.
const NO_PART: u32 = u32::MAX;
/// A part's units saturate here (below [`NO_PART`]).
const MAX_UNITS: u32 = u32::MAX - 1;
/// [`Entry::last`]'s top bit: the entry has a [`Side`] record.
const SIDE_BIT: u32 = 1 << 31;
/// The read clock saturates here, in grains (31 bits).
const MAX_LAST: u32 = SIDE_BIT - 1;

/// One entry of the dense table: its key, the units of its own part, its
/// last access and its place in [`BY_LAST`], and the caller's record. 32
/// bytes with a 16-byte key. What few entries need (a guest part, stale,
/// pinned) is in a [`Side`] record, found by record number.
#[derive(Debug, Clone, Copy)]
struct Entry<K, X> {
    key: K,
    /// Units (`Policy::unit`) of the own part; [`NO_PART`] if it has none.
    own: u32,
    /// The read clock at the last access, in grains (`Policy::grain`), 31
    /// bits; the top bit is [`SIDE_BIT`].
    last: u32,
    /// [prev, next] record numbers in [`BY_LAST`].
    links: [u32; 2],
    x: X,
}

/// What an entry with a guest part, a stale one or a pinned one keeps
/// besides its record (20 bytes plus the map's). Such entries are few: the
/// guests and stale versions are what goes first, pins are the files open
/// in passthrough and the writes under way.
#[derive(Debug, Clone, Copy)]
struct Side {
    /// [prev, next] record numbers in [`GUESTS`] or [`STALE`].
    links: [u32; 2],
    /// Units of the guest part.
    guest: u32,
    /// Saturates at `u16::MAX` (the disk cache takes far fewer: see
    /// `MAX_PASSTHROUGH_PINS`).
    pins: u16,
    /// The pins taken by [`Policy::pin_held`] (counted in `pins` too): a
    /// count the caller asks about (the disk cache's passthrough opens).
    held: u16,
    /// [`GUEST`], [`STALE_F`].
    flags: u8,
}

const NO_SIDE: Side = Side {
    links: [NIL, NIL],
    guest: 0,
    pins: 0,
    held: 0,
    flags: 0,
};

#[derive(Debug, Clone, Copy)]
struct List {
    head: u32,
    tail: u32,
}

/// Epoch-aware accounting of what the cache holds: one entry per key (the
/// disk cache: per file version), each with two parts (its own blocks, its
/// guest blocks), and the caller's record of it.
///
/// The books are one dense table (`Vec`, no holes: a removed entry's place
/// is taken by the last one), a hash table of u32 record numbers to find an
/// entry by key (hashed by its [`BookKey::book_part`], so the keys that
/// share one are found together: the disk cache's versions of a path), and
/// intrusive doubly linked lists for the orders the policy walks (by last
/// access through the table; the guests and the stale entries through the
/// side records). The read clock never goes back, so appending a touched
/// entry at the tail keeps a list sorted by last access. 16 bytes plus the
/// key and the record per entry.
#[derive(Debug)]
pub struct Policy<K: BookKey, X = ()> {
    capacity: u64,
    /// Bytes booked: the entries' parts and `fixed`.
    used: u64,
    /// Bytes booked outside the entries ([`Policy::admit_fixed`]), never
    /// evicted.
    fixed: u64,
    /// Bytes the loader has read through the mount (hits and misses): the
    /// clock that measures "passes over the data set".
    clock: u64,
    /// Accesses less than this many bytes of reading apart are one moment:
    /// an entry is re-sorted at most once per grain (1 by default; the disk
    /// cache uses its block size). Last accesses are kept in grains (31
    /// bits).
    grain: u64,
    /// Parts' bytes are kept in this unit (u32 each; 1 by default, the disk
    /// cache books in multiples of 256 bytes). A part saturates at
    /// `u32::MAX - 1` units.
    unit: u64,
    dataset_bytes: u64,
    entries: Vec<Entry<K, X>>,
    index: RecordIndex,
    /// The side records, by record number (the entries whose
    /// [`SIDE_BIT`] is set).
    side: HashMap<u32, Side>,
    hasher: RandomState,
    lists: [List; 3],
    evictions: u64,
}

impl<K: BookKey, X> Policy<K, X> {
    pub fn new(capacity: u64) -> Self {
        Policy {
            capacity,
            used: 0,
            fixed: 0,
            clock: 0,
            grain: 1,
            unit: 1,
            dataset_bytes: 0,
            entries: Vec::new(),
            index: RecordIndex::new(),
            side: HashMap::new(),
            hasher: RandomState::new(),
            lists: [List {
                head: NIL,
                tail: NIL,
            }; 3],
            evictions: 0,
        }
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    pub fn set_capacity(&mut self, capacity: u64) {
        self.capacity = capacity;
    }

    pub fn used(&self) -> u64 {
        self.used
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    pub fn contains(&self, key: &K) -> bool {
        self.find(key).is_some()
    }

    /// Whether the entry has a part of this tier.
    pub fn has_part(&self, key: &K, tier: Tier) -> bool {
        self.find(key)
            .is_some_and(|i| self.flags(i) & tier.bit() != 0)
    }

    /// Bytes of one record of the table.
    pub fn record_size() -> usize {
        std::mem::size_of::<Entry<K, X>>()
    }

    /// Heap bytes the books hold (for the documentation of per-file
    /// memory).
    pub fn heap_bytes(&self) -> usize {
        // (A map's bucket: the key, the side record and a control byte.)
        let side = if self.side.capacity() == 0 {
            0
        } else {
            (self.side.capacity() * 8 / 7).next_power_of_two()
                * (std::mem::size_of::<(u32, Side)>() + 1)
        };
        self.entries.capacity() * Self::record_size() + self.index.heap_bytes() + side
    }

    /// Makes room for `n` more entries at once (a start-up that books a
    /// known number): the tables are not grown again while they fill.
    pub fn reserve(&mut self, n: usize) {
        self.entries.reserve_exact(n);
        let (index, hash) = self.index_and_hash();
        index.reserve(n, hash);
    }

    /// Gives back what [`Policy::reserve`] took beyond the entries (a
    /// reservation by records, not entries), if that is much.
    pub fn shrink_to_fit(&mut self) {
        if self.entries.capacity() / 2 <= self.entries.len() {
            return;
        }
        self.entries.shrink_to_fit();
        let (index, hash) = self.index_and_hash();
        index.shrink_to_fit(hash);
    }

    /// The index, and the hash of any record's key (what a growth or a
    /// removal of the index rehashes).
    fn index_and_hash(&mut self) -> (&mut RecordIndex, impl Fn(u32) -> u64 + '_) {
        let Policy {
            index,
            entries,
            hasher,
            ..
        } = self;
        let (entries, hasher) = (&*entries, &*hasher);
        (index, move |j: u32| {
            hasher.hash_one(entries[j as usize].key.book_part())
        })
    }

    fn find(&self, key: &K) -> Option<u32> {
        let h = self.hasher.hash_one(key.book_part());
        let entries = &self.entries;
        self.index.find(h, |i| entries[i as usize].key == *key)
    }

    /// The caller's record of an entry.
    pub fn get(&self, key: &K) -> Option<&X> {
        self.find(key).map(|i| &self.entries[i as usize].x)
    }

    pub fn get_mut(&mut self, key: &K) -> Option<&mut X> {
        self.find(key).map(|i| &mut self.entries[i as usize].x)
    }

    /// Every entry's key and record, in table order.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &X)> + '_ {
        self.entries.iter().map(|e| (&e.key, &e.x))
    }

    /// The keys on the books with the same [`BookKey::book_part`] as
    /// `probe` (`probe` among them if it is on the books), found through
    /// the one table: the disk cache's versions of a path.
    pub fn keys_like(&self, probe: &K) -> impl Iterator<Item = K> + '_ {
        let part = probe.book_part();
        self.index
            .candidates(self.hasher.hash_one(part))
            .map(|i| self.entries[i as usize].key)
            .filter(move |k| k.book_part() == part)
    }

    /// Entry `i`'s side record, if it has one.
    fn side_of(&self, i: u32) -> Option<&Side> {
        if self.entries[i as usize].last & SIDE_BIT == 0 {
            None
        } else {
            self.side.get(&i)
        }
    }

    /// Entry `i`'s side record, made if it has none.
    fn side_mut(&mut self, i: u32) -> &mut Side {
        self.entries[i as usize].last |= SIDE_BIT;
        self.side.entry(i).or_insert(NO_SIDE)
    }

    /// Drops entry `i`'s side record if it holds nothing (call once the
    /// entry is out of the side lists its flags no longer call for).
    fn tidy_side(&mut self, i: u32) {
        if let Some(s) = self.side_of(i) {
            if s.flags == 0 && s.pins == 0 && s.guest == 0 {
                debug_assert_eq!(s.links, [NIL, NIL]);
                self.side.remove(&i);
                self.entries[i as usize].last &= !SIDE_BIT;
            }
        }
    }

    /// Entry `i`'s flags: [`OWN`], [`GUEST`], [`STALE_F`].
    fn flags(&self, i: u32) -> u8 {
        let own = if self.entries[i as usize].own == NO_PART {
            0
        } else {
            OWN
        };
        own | self.side_of(i).map_or(0, |s| s.flags)
    }

    /// Sets entry `i`'s flags (its lists are the caller's: see
    /// [`Policy::reside`]). A part whose flag goes keeps no units.
    fn set_flags(&mut self, i: u32, flags: u8) {
        let e = &mut self.entries[i as usize];
        if flags & OWN == 0 {
            e.own = NO_PART;
        } else if e.own == NO_PART {
            e.own = 0;
        }
        let side = flags & (GUEST | STALE_F);
        if side != 0 || e.last & SIDE_BIT != 0 {
            let s = self.side_mut(i);
            s.flags = side;
            if side & GUEST == 0 {
                s.guest = 0;
            }
        }
    }

    /// Units of part `tier` of entry `i`.
    fn units(&self, i: u32, tier: Tier) -> u32 {
        match tier {
            Tier::Own => match self.entries[i as usize].own {
                NO_PART => 0,
                u => u,
            },
            Tier::Guest => self.side_of(i).map_or(0, |s| s.guest),
        }
    }

    /// Sets the units of part `tier` of entry `i`, which has that part.
    fn set_units(&mut self, i: u32, tier: Tier, units: u32) {
        debug_assert!(self.flags(i) & tier.bit() != 0);
        let units = units.min(MAX_UNITS);
        match tier {
            Tier::Own => self.entries[i as usize].own = units,
            Tier::Guest => self.side_mut(i).guest = units,
        }
    }

    fn pins(&self, i: u32) -> u16 {
        self.side_of(i).map_or(0, |s| s.pins)
    }

    /// The last access of entry `i`, in grains.
    fn last(&self, i: u32) -> u32 {
        self.entries[i as usize].last & MAX_LAST
    }

    /// Entry `i`'s [prev, next] in list `l`.
    fn links(&self, l: usize, i: u32) -> [u32; 2] {
        if l == BY_LAST {
            self.entries[i as usize].links
        } else {
            self.side_of(i).map_or([NIL, NIL], |s| s.links)
        }
    }

    fn links_mut(&mut self, l: usize, i: u32) -> &mut [u32; 2] {
        if l == BY_LAST {
            &mut self.entries[i as usize].links
        } else {
            &mut self.side_mut(i).links
        }
    }

    /// Appends entry `i` at the tail of list `l`.
    fn push_back(&mut self, l: usize, i: u32) {
        let tail = self.lists[l].tail;
        *self.links_mut(l, i) = [tail, NIL];
        if tail == NIL {
            self.lists[l].head = i;
        } else {
            self.links_mut(l, tail)[1] = i;
        }
        self.lists[l].tail = i;
    }

    /// Takes entry `i` out of list `l`.
    fn unlink(&mut self, l: usize, i: u32) {
        let [prev, next] = self.links(l, i);
        if prev == NIL {
            self.lists[l].head = next;
        } else {
            self.links_mut(l, prev)[1] = next;
        }
        if next == NIL {
            self.lists[l].tail = prev;
        } else {
            self.links_mut(l, next)[0] = prev;
        }
        *self.links_mut(l, i) = [NIL, NIL];
    }

    /// The second list an entry is in, if any.
    fn side_list(flags: u8) -> Option<usize> {
        if flags & STALE_F != 0 {
            Some(STALE)
        } else if flags & GUEST != 0 {
            Some(GUESTS)
        } else {
            None
        }
    }

    /// Sets entry `i`'s flags (before: `was`) and moves it to the side
    /// list they call for.
    fn reflag(&mut self, i: u32, was: u8, flags: u8) {
        let (a, b) = (Self::side_list(was), Self::side_list(flags));
        if a != b {
            if let Some(l) = a {
                self.unlink(l, i);
            }
        }
        self.set_flags(i, flags);
        if a != b {
            if let Some(l) = b {
                self.push_back(l, i);
            }
        }
        self.tidy_side(i);
    }

    /// The record numbers of list `l`, head first.
    fn iter_list(&self, l: usize) -> impl Iterator<Item = u32> + '_ {
        let mut at = self.lists[l].head;
        std::iter::from_fn(move || {
            if at == NIL {
                return None;
            }
            let i = at;
            at = self.links(l, i)[1];
            Some(i)
        })
    }

    fn part_bytes(&self, i: u32, parts: u8) -> u64 {
        let mut b = 0;
        for t in [Tier::Own, Tier::Guest] {
            if parts & t.bit() != 0 {
                b += self.units(i, t) as u64 * self.unit;
            }
        }
        b
    }

    /// The size of the data set as far as it is known; entries untouched for
    /// twice this many bytes of reads (or twice the capacity, if larger) are
    /// considered abandoned and may be evicted.
    pub fn set_dataset_bytes(&mut self, bytes: u64) {
        self.dataset_bytes = bytes;
    }

    fn horizon(&self) -> u64 {
        2 * self.dataset_bytes.max(self.capacity)
    }

    /// Bytes read since entry `i`'s last access.
    fn age(&self, i: u32) -> u64 {
        self.clock
            .saturating_sub((self.last(i) as u64).saturating_mul(self.grain))
    }

    /// Bytes of entries read within the horizon (two passes over the data
    /// set): what a neighbouring data set may never take (`budget.rs`).
    /// Stale versions, guests and abandoned entries are not counted. Costs
    /// the number of those, not of all entries.
    pub fn hot_bytes(&self) -> u64 {
        let horizon = self.horizon();
        let mut cold = 0;
        if self.clock > horizon {
            for i in self.iter_list(BY_LAST) {
                if self.age(i) <= horizon {
                    break;
                }
                if self.flags(i) & STALE_F == 0 {
                    cold += self.part_bytes(i, OWN);
                }
            }
        }
        for i in self.iter_list(STALE) {
            cold += self.part_bytes(i, BOTH);
        }
        for i in self.iter_list(GUESTS) {
            cold += self.part_bytes(i, GUEST);
        }
        self.used.saturating_sub(cold)
    }

    /// Advances the read clock by bytes the loader read.
    pub fn record_read(&mut self, bytes: u64) {
        self.clock = self.clock.saturating_add(bytes);
    }

    /// Bytes read through the mount so far (the read clock).
    pub fn clock(&self) -> u64 {
        self.clock
    }

    /// Sets the clock's grain (see the field). Set it before any entry is
    /// booked.
    pub fn set_grain(&mut self, bytes: u64) {
        self.grain = bytes.max(1);
    }

    /// Sets the unit of the parts' bytes (see the field). Set it before any
    /// entry is booked.
    pub fn set_unit(&mut self, bytes: u64) {
        self.unit = bytes.max(1);
    }

    /// The clock, in grains (never before the newest access on the books,
    /// so that the lists stay sorted).
    fn now(&self) -> u32 {
        let tail = self.lists[BY_LAST].tail;
        let newest = if tail == NIL { 0 } else { self.last(tail) };
        ((self.clock / self.grain).min(MAX_LAST as u64) as u32).max(newest)
    }

    /// Notes an access to an entry (a hit or a write).
    pub fn touch(&mut self, key: K) {
        if let Some(i) = self.find(&key) {
            self.touch_at(i);
        }
    }

    fn touch_at(&mut self, i: u32) {
        let now = self.now();
        if self.last(i) == now {
            // Already in place: many small files are opened per grain.
            return;
        }
        let e = &mut self.entries[i as usize];
        e.last = (e.last & SIDE_BIT) | now;
        self.unlink(BY_LAST, i);
        self.push_back(BY_LAST, i);
        if Self::side_list(self.flags(i)) == Some(GUESTS) {
            self.unlink(GUESTS, i);
            self.push_back(GUESTS, i);
        }
    }

    /// The tier of an entry: own if it has an own part, else guest.
    pub fn tier(&self, key: &K) -> Option<Tier> {
        let f = self.flags(self.find(key)?);
        Some(if f & GUEST != 0 && f & OWN == 0 {
            Tier::Guest
        } else {
            Tier::Own
        })
    }

    /// Adds an entry with no parts yet (a start-up that fills the records
    /// first, then books them with [`Policy::book_all`]); returns its record
    /// (the existing one if the key is on the books).
    pub fn get_or_insert_with(&mut self, key: K, make: impl FnOnce() -> X) -> &mut X {
        let i = match self.find(&key) {
            Some(i) => i,
            None => self.insert(key, make()),
        };
        &mut self.entries[i as usize].x
    }

    fn insert(&mut self, key: K, x: X) -> u32 {
        let last = self.now();
        let i = self.entries.len() as u32;
        self.entries.push(Entry {
            key,
            own: NO_PART,
            last,
            links: [NIL; 2],
            x,
        });
        let h = self.hasher.hash_one(key.book_part());
        let (index, hash) = self.index_and_hash();
        index.insert(h, i, hash);
        self.push_back(BY_LAST, i);
        i
    }

    /// Adds `bytes` to part `tier` of entry `i` (creating the part).
    fn add_at(&mut self, i: u32, bytes: u64, tier: Tier) {
        let units = bytes.div_ceil(self.unit);
        let was = self.flags(i);
        self.reflag(i, was, was | tier.bit());
        let have = self.units(i, tier);
        let now = (have as u64 + units).min(MAX_UNITS as u64) as u32;
        self.set_units(i, tier, now);
        self.used += (now - have) as u64 * self.unit;
    }

    /// Books every entry at once (a start-up): `f` tells the bytes of its
    /// own and its guest part (None: no such part).
    pub fn book_all(&mut self, mut f: impl FnMut(&K, &X) -> [Option<u64>; 2]) {
        for i in 0..self.entries.len() as u32 {
            let e = &self.entries[i as usize];
            let [own, guest] = f(&e.key, &e.x);
            if let Some(b) = own {
                self.add_at(i, b, Tier::Own);
            }
            if let Some(b) = guest {
                self.add_at(i, b, Tier::Guest);
            }
        }
    }

    /// Keeps the entries for which `f` says true (the others leave the
    /// books, their bytes with them).
    pub fn retain(&mut self, mut f: impl FnMut(&K, &mut X) -> bool) {
        let mut i = 0;
        while i < self.entries.len() {
            let e = &mut self.entries[i];
            if f(&e.key, &mut e.x) {
                i += 1;
            } else {
                // (The last entry takes its place.)
                self.remove_at(i as u32);
            }
        }
    }

    /// Takes an entry onto the books as if last read before this mount
    /// (clock 0; a start-up), or adds bytes to part `tier` of an entry
    /// without asking (the caller moves bytes between parts it holds).
    /// Never refused: call [`Policy::shrink_to_capacity`] afterwards.
    pub fn insert_existing_as(&mut self, key: K, bytes: u64, tier: Tier)
    where
        X: Default,
    {
        let i = match self.find(&key) {
            Some(i) => i,
            None => self.insert(key, X::default()),
        };
        self.add_at(i, bytes, tier);
    }

    /// [`Policy::insert_existing_as`] of the own part.
    pub fn insert_existing(&mut self, key: K, bytes: u64)
    where
        X: Default,
    {
        self.insert_existing_as(key, bytes, Tier::Own);
    }

    /// Adds `bytes` to part `tier` of an entry on the books, without asking.
    pub fn add(&mut self, key: &K, bytes: u64, tier: Tier) {
        if let Some(i) = self.find(key) {
            self.add_at(i, bytes, tier);
        }
    }

    /// Asks to add `bytes` to the own part of entry `key` (creating it if
    /// needed).
    pub fn admit(&mut self, key: K, bytes: u64) -> Admission<K, X>
    where
        X: Default,
    {
        self.admit_with(key, bytes, Tier::Own, X::default)
    }

    /// Asks to add `bytes` to part `tier` of entry `key`.
    pub fn admit_as(&mut self, key: K, bytes: u64, tier: Tier) -> Admission<K, X>
    where
        X: Default,
    {
        self.admit_with(key, bytes, tier, X::default)
    }

    /// Asks to add `bytes` to part `tier` of entry `key`, the entry made by
    /// `make` if it is not on the books. Own parts may evict guests; a
    /// guest only takes spare room (or stale and abandoned entries'). The
    /// entry itself is never a victim.
    pub fn admit_with(
        &mut self,
        key: K,
        bytes: u64,
        tier: Tier,
        make: impl FnOnce() -> X,
    ) -> Admission<K, X> {
        let need = (self.used + bytes).saturating_sub(self.capacity);
        let mut evict = Vec::new();
        if need > 0 {
            let spare = Some((key, tier));
            let victims = self.victims(need, spare, false, tier == Tier::Own);
            if victims.is_empty() {
                return Admission::Reject;
            }
            evict = self.take(&victims, spare);
        }
        let i = match self.find(&key) {
            Some(i) => i,
            None => self.insert(key, make()),
        };
        self.add_at(i, bytes, tier);
        self.touch_at(i);
        Admission::Admit { evict }
    }

    /// Books `bytes` outside the entries (files kept beside the cache),
    /// never evicted; makes room like an own part.
    pub fn admit_fixed(&mut self, bytes: u64) -> Admission<K, X> {
        let need = (self.used + bytes).saturating_sub(self.capacity);
        let mut evict = Vec::new();
        if need > 0 {
            let victims = self.victims(need, None, false, true);
            if victims.is_empty() {
                return Admission::Reject;
            }
            evict = self.take(&victims, None);
        }
        self.fixed += bytes;
        self.used += bytes;
        Admission::Admit { evict }
    }

    /// Gives back bytes booked by [`Policy::admit_fixed`].
    pub fn release_fixed(&mut self, bytes: u64) {
        let b = bytes.min(self.fixed);
        self.fixed -= b;
        self.used -= b;
    }

    /// Parts to remove to free `need` bytes: stale entries first; for an
    /// own part (`evict_guests`), then guest parts, oldest first; then
    /// entries abandoned for a whole horizon (oldest first); with `force`,
    /// then any unpinned entry, oldest first. Empty if that is not enough.
    /// The `spare` part (the one being admitted) is never a victim; the
    /// other part of its entry may be.
    fn victims(
        &self,
        need: u64,
        spare: Option<(K, Tier)>,
        force: bool,
        evict_guests: bool,
    ) -> Vec<(K, u8)> {
        let mut out = Vec::new();
        let mut freed = 0;
        // The parts of entry `i` that may go, of `parts`.
        let usable = |i: u32, parts: u8| {
            if self.pins(i) != 0 {
                return 0;
            }
            let f = self.flags(i);
            match spare {
                Some((k, t)) if k == self.entries[i as usize].key => f & parts & !t.bit(),
                _ => f & parts,
            }
        };
        for i in self.iter_list(STALE) {
            if freed >= need {
                break;
            }
            let p = usable(i, BOTH);
            if p != 0 {
                out.push((self.entries[i as usize].key, p));
                freed += self.part_bytes(i, p);
            }
        }
        if evict_guests {
            for i in self.iter_list(GUESTS) {
                if freed >= need {
                    break;
                }
                if usable(i, GUEST) != 0 {
                    out.push((self.entries[i as usize].key, GUEST));
                    freed += self.part_bytes(i, GUEST);
                }
            }
        }
        let horizon = self.horizon();
        // (With `evict_guests`, the guest parts were all considered above.)
        let parts = if evict_guests { OWN } else { BOTH };
        for i in self.iter_list(BY_LAST) {
            if freed >= need {
                break;
            }
            if !force && self.age(i) <= horizon {
                break;
            }
            let p = usable(i, parts);
            if self.flags(i) & STALE_F == 0 && p != 0 {
                out.push((self.entries[i as usize].key, p));
                freed += self.part_bytes(i, p);
            }
        }
        if freed >= need {
            out
        } else {
            Vec::new()
        }
    }

    /// Takes the chosen parts off the books: an entry left with no part
    /// goes whole (its record returned), but for the `spare` one.
    fn take(&mut self, victims: &[(K, u8)], spare: Option<(K, Tier)>) -> Vec<Evicted<K, X>> {
        let mut out = Vec::with_capacity(victims.len());
        for &(key, parts) in victims {
            let Some(i) = self.find(&key) else { continue };
            self.evictions += 1;
            let was = self.flags(i);
            let parts = parts & was;
            let freed = self.part_bytes(i, parts);
            // (Out of the guests' list if its guest part went.)
            self.reflag(i, was, was & !parts);
            self.used -= freed;
            let tier = if parts & GUEST != 0 && parts & OWN == 0 {
                Tier::Guest
            } else {
                Tier::Own
            };
            let kept = spare.is_some_and(|(k, _)| k == key);
            if self.flags(i) & BOTH == 0 && !kept {
                let (x, _) = self.remove_at(i);
                out.push(Evicted {
                    key,
                    tier,
                    gone: Some(x),
                });
            } else {
                out.push(Evicted {
                    key,
                    tier,
                    gone: None,
                });
            }
        }
        out
    }
    /// Removes entries until the books fit the capacity (after start-up or a
    /// smaller --cache-size), stale ones first. Returns what went.
    pub fn shrink_to_capacity(&mut self) -> Vec<Evicted<K, X>> {
        let need = self.used.saturating_sub(self.capacity);
        if need == 0 {
            return Vec::new();
        }
        let victims = self.victims(need, None, true, true);
        self.take(&victims, None)
    }

    /// Takes an entry off the books entirely; returns its record and the
    /// bytes it held.
    pub fn remove(&mut self, key: &K) -> Option<(X, u64)> {
        let i = self.find(key)?;
        Some(self.remove_at(i))
    }

    fn remove_at(&mut self, i: u32) -> (X, u64) {
        let flags = self.flags(i);
        let e = &self.entries[i as usize];
        let key = e.key;
        let bytes = self.part_bytes(i, BOTH);
        self.unlink(BY_LAST, i);
        if let Some(l) = Self::side_list(flags) {
            self.unlink(l, i);
        }
        if self.entries[i as usize].last & SIDE_BIT != 0 {
            self.side.remove(&i);
        }
        let h = self.hasher.hash_one(key.book_part());
        let (index, hash) = self.index_and_hash();
        index.remove(h, i, hash);
        // The last entry takes the freed place.
        let last = self.entries.len() as u32 - 1;
        let e = self.entries.swap_remove(i as usize);
        if i != last {
            let moved = &self.entries[i as usize];
            let mkey = moved.key;
            if moved.last & SIDE_BIT != 0 {
                if let Some(s) = self.side.remove(&last) {
                    self.side.insert(i, s);
                }
            }
            let mflags = self.flags(i);
            for l in [Some(BY_LAST), Self::side_list(mflags)] {
                let Some(l) = l else { continue };
                let [prev, next] = self.links(l, i);
                if prev == NIL {
                    self.lists[l].head = i;
                } else {
                    self.links_mut(l, prev)[1] = i;
                }
                if next == NIL {
                    self.lists[l].tail = i;
                } else {
                    self.links_mut(l, next)[0] = i;
                }
            }
            let h = self.hasher.hash_one(mkey.book_part());
            self.index.renumber(h, last, i);
        }
        self.used -= bytes;
        (e.x, bytes)
    }

    /// Gives back `bytes` of part `tier` of an entry (a block found corrupt,
    /// a failed write).
    pub fn shrink(&mut self, key: &K, bytes: u64, tier: Tier) {
        if let Some(i) = self.find(key) {
            let have = self.units(i, tier);
            if have == 0 {
                return;
            }
            let u = bytes.div_ceil(self.unit).min(have as u64) as u32;
            self.set_units(i, tier, have - u);
            self.used -= u as u64 * self.unit;
        }
    }

    /// Marks an entry as a version that will never be read again (the file
    /// changed or vanished at the source): it goes first when room is needed.
    pub fn mark_stale(&mut self, key: &K) {
        let Some(i) = self.find(key) else { return };
        let was = self.flags(i);
        self.reflag(i, was, was | STALE_F);
    }

    /// Pinned entries are never evicted (a file open in passthrough mode, a
    /// block being written).
    pub fn pin(&mut self, key: &K) {
        if let Some(i) = self.find(key) {
            let s = self.side_mut(i);
            s.pins = s.pins.saturating_add(1);
        }
    }

    /// Takes back a [`Policy::pin`] (never one of [`Policy::pin_held`]'s).
    pub fn unpin(&mut self, key: &K) {
        if let Some(i) = self.find(key) {
            let held = self.side_of(i).map_or(0, |s| s.held);
            if self.pins(i) > held {
                let s = self.side_mut(i);
                s.pins -= 1;
                self.tidy_side(i);
            }
        }
    }

    /// Whether the entry is pinned (never a victim).
    pub fn is_pinned(&self, key: &K) -> bool {
        self.find(key).is_some_and(|i| self.pins(i) > 0)
    }

    /// A pin that the caller counts apart ([`Policy::held`]): the disk
    /// cache's passthrough opens, which it must tell from its writes under
    /// way. Kept in the side record, so an entry never pinned so pays
    /// nothing for the count.
    pub fn pin_held(&mut self, key: &K) {
        if let Some(i) = self.find(key) {
            let s = self.side_mut(i);
            if s.held < u16::MAX && s.pins < u16::MAX {
                s.held += 1;
                s.pins += 1;
            }
        }
    }

    /// Takes back a [`Policy::pin_held`].
    pub fn unpin_held(&mut self, key: &K) {
        if let Some(i) = self.find(key) {
            if self.side_of(i).is_some_and(|s| s.held > 0) {
                let s = self.side_mut(i);
                s.held -= 1;
                s.pins -= 1;
                self.tidy_side(i);
            }
        }
    }

    /// The pins of [`Policy::pin_held`] an entry holds (0 if it is not on
    /// the books).
    pub fn held(&self, key: &K) -> u16 {
        self.find(key)
            .and_then(|i| self.side_of(i))
            .map_or(0, |s| s.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::seq::SliceRandom;
    use rand::SeedableRng;
    use std::collections::{HashSet, VecDeque};

    /// The keys an admission evicted (None: refused).
    fn keys<K, X>(a: Admission<K, X>) -> Option<Vec<K>> {
        match a {
            Admission::Admit { evict } => Some(evict.into_iter().map(|v| v.key).collect()),
            Admission::Reject => None,
        }
    }

    fn last(p: &Policy<u32>, k: u32) -> u32 {
        p.last(p.find(&k).unwrap())
    }

    /// Plain LRU, for comparison in the simulation.
    struct Lru {
        cap: usize,
        q: VecDeque<u32>,
        set: HashSet<u32>,
    }
    impl Lru {
        fn access(&mut self, k: u32) -> bool {
            if self.set.contains(&k) {
                let pos = self.q.iter().position(|x| *x == k).unwrap();
                self.q.remove(pos);
                self.q.push_back(k);
                return true;
            }
            if self.q.len() == self.cap {
                let old = self.q.pop_front().unwrap();
                self.set.remove(&old);
            }
            self.q.push_back(k);
            self.set.insert(k);
            false
        }
    }

    /// Drives the real policy like the disk cache does: a hit touches, a miss
    /// asks for admission.
    fn policy_hit_rate(n: u32, frac: f64, epochs: usize, seed: u64) -> (f64, f64) {
        let block = 1 << 20;
        let cap = (n as f64 * frac) as u64 * block;
        let mut p: Policy<u32> = Policy::new(cap);
        p.set_grain(block);
        p.set_dataset_bytes(n as u64 * block);
        let mut lru = Lru {
            cap: (n as f64 * frac) as usize,
            q: VecDeque::new(),
            set: HashSet::new(),
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut order: Vec<u32> = (0..n).collect();
        let (mut hits, mut lru_hits, mut total) = (0u64, 0u64, 0u64);
        for epoch in 0..epochs {
            order.shuffle(&mut rng);
            for &k in &order {
                p.record_read(block);
                let hit = if p.contains(&k) {
                    p.touch(k);
                    true
                } else {
                    let _ = p.admit(k, block);
                    false
                };
                let lhit = lru.access(k);
                assert!(p.used() <= p.capacity());
                if epoch > 0 {
                    total += 1;
                    hits += hit as u64;
                    lru_hits += lhit as u64;
                }
            }
        }
        (hits as f64 / total as f64, lru_hits as f64 / total as f64)
    }

    #[test]
    fn touches_within_a_grain_leave_the_order_alone() {
        let mut p: Policy<u32> = Policy::new(1000);
        p.set_grain(100);
        p.insert_existing(1, 10);
        p.insert_existing(2, 10);
        p.record_read(50);
        p.touch(2);
        assert_eq!(last(&p, 2), 0, "same grain: not moved");
        p.record_read(60);
        p.touch(1);
        assert_eq!(last(&p, 1), 1, "next grain: moved");
        let order: Vec<_> = p
            .iter_list(BY_LAST)
            .map(|i| (p.last(i), p.entries[i as usize].key))
            .collect();
        assert_eq!(order, vec![(0, 2), (1, 1)]);
        // Without a grain every read moves the clock.
        let mut q: Policy<u32> = Policy::new(1000);
        q.insert_existing(1, 10);
        q.record_read(7);
        q.touch(1);
        assert_eq!(last(&q, 1), 7);
    }

    #[test]
    fn random_permutation_epochs_hit_close_to_cache_fraction() {
        for frac in [0.1, 0.25, 0.5, 0.75] {
            let (hit, lru) = policy_hit_rate(4000, frac, 5, 7);
            // Within 5 % of the cache fraction: nothing can do better than c.
            assert!(hit >= frac * 0.95, "c={frac}: policy hit {hit:.3}");
            assert!(hit <= frac + 1e-9, "c={frac}: impossible hit rate {hit:.3}");
            // LRU gets about c + (1-c) ln(1-c), far less.
            let lru_theory = frac + (1.0 - frac) * (1.0 - frac).ln();
            assert!((lru - lru_theory).abs() < 0.05, "c={frac}: lru {lru:.3}");
            assert!(
                hit > lru + 0.05,
                "c={frac}: policy {hit:.3} vs lru {lru:.3}"
            );
        }
    }

    #[test]
    fn moved_working_set_replaces_abandoned_entries() {
        let mut p: Policy<u32> = Policy::new(100);
        p.set_dataset_bytes(100);
        for k in 0..100 {
            p.record_read(1);
            assert_eq!(p.admit(k, 1), Admission::Admit { evict: vec![] });
        }
        // Still within the horizon: new keys are refused, nothing churns.
        p.record_read(1);
        assert_eq!(p.admit(1000, 1), Admission::Reject);
        // After two full passes of reads that never touch the old keys, the
        // old keys go, oldest first.
        p.record_read(250);
        assert_eq!(keys(p.admit(1000, 1)), Some(vec![0]));
        assert!(p.used() <= p.capacity());
    }

    #[test]
    fn stale_and_pinned() {
        let mut p: Policy<u32> = Policy::new(10);
        assert!(matches!(p.admit(1, 5), Admission::Admit { .. }));
        assert!(matches!(p.admit(2, 5), Admission::Admit { .. }));
        assert_eq!(p.admit(3, 5), Admission::Reject);
        p.mark_stale(&2);
        p.pin(&2);
        assert_eq!(p.admit(3, 5), Admission::Reject, "pinned entries stay");
        p.unpin(&2);
        assert_eq!(keys(p.admit(3, 5)), Some(vec![2]));
        assert_eq!(p.used(), 10);
        p.shrink(&3, 5, Tier::Own);
        assert_eq!(p.used(), 5);
        assert_eq!(p.remove(&1).map(|r| r.1), Some(5));
        assert_eq!(p.used(), 0);
    }

    #[test]
    fn guests_use_only_spare_room_and_go_first() {
        let mut p: Policy<u32> = Policy::new(10);
        p.set_dataset_bytes(100);
        assert!(matches!(
            p.admit_as(100, 3, Tier::Guest),
            Admission::Admit { .. }
        ));
        assert!(matches!(
            p.admit_as(101, 3, Tier::Guest),
            Admission::Admit { .. }
        ));
        assert!(matches!(p.admit(1, 3), Admission::Admit { .. }));
        // Full (9 of 10): a guest never evicts anything of the data set in
        // use, not even another guest.
        assert_eq!(p.admit_as(102, 3, Tier::Guest), Admission::Reject);
        // An own entry evicts guests, oldest first, and only as many as needed.
        p.record_read(1);
        p.touch(100);
        assert_eq!(keys(p.admit(2, 3)), Some(vec![101]));
        assert_eq!(keys(p.admit(3, 4)), Some(vec![100]));
        assert_eq!(p.tier(&3), Some(Tier::Own));
        assert_eq!(p.tier(&100), None);
        // Own entries are not churned for each other.
        assert_eq!(p.admit(4, 1), Admission::Reject);
        assert!(p.used() <= p.capacity());
        // Pinned guests stay; an entry's own and guest parts are booked
        // apart, and a guest part goes first, alone.
        let mut q: Policy<u32> = Policy::new(6);
        assert!(matches!(
            q.admit_as(7, 3, Tier::Guest),
            Admission::Admit { .. }
        ));
        q.pin(&7);
        assert!(matches!(q.admit(8, 3), Admission::Admit { .. }));
        assert_eq!(q.admit(9, 3), Admission::Reject);
        q.unpin(&7);
        assert!(matches!(
            q.admit_as(7, 0, Tier::Own),
            Admission::Admit { .. }
        ));
        assert_eq!(q.tier(&7), Some(Tier::Own));
        assert!(q.has_part(&7, Tier::Guest));
        assert_eq!(keys(q.admit(9, 3)), Some(vec![7]));
        assert!(q.has_part(&7, Tier::Own) && !q.has_part(&7, Tier::Guest));
        assert_eq!(q.used(), 6);
    }

    /// Two nodes' caches, each half the data set, under a peer cache: each
    /// keeps its own half and the guests of the other half never push it out.
    #[test]
    fn own_blocks_survive_a_stream_of_guests() {
        let n = 1000u32;
        let mut p: Policy<u32> = Policy::new(500);
        p.set_dataset_bytes(n as u64);
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let mut order: Vec<u32> = (0..n).collect();
        for _ in 0..4 {
            order.shuffle(&mut rng);
            for &k in &order {
                p.record_read(1);
                if p.contains(&k) {
                    p.touch(k);
                } else if k % 2 == 0 {
                    let _ = p.admit(k, 1);
                } else {
                    let _ = p.admit_as(k, 1, Tier::Guest);
                }
            }
        }
        let own = (0..n).filter(|k| k % 2 == 0 && p.contains(k)).count();
        assert_eq!(own, 500, "every own block is kept");
        assert!(p.used() <= p.capacity());
    }

    /// The lists and the index stay consistent through random operations
    /// (removals move the last record into the freed place): every list is
    /// sorted by last access (the stale one by marking order aside), holds
    /// exactly its entries, and every key is found at its record.
    #[test]
    fn the_dense_books_stay_consistent() {
        use rand::Rng;
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let mut p: Policy<u32> = Policy::new(200);
        p.set_dataset_bytes(50);
        for _ in 0..20_000 {
            let k = rng.random_range(0..60u32);
            match rng.random_range(0..15) {
                0 => {
                    let _ = p.admit(k, rng.random_range(1..8));
                }
                1 => {
                    let _ = p.admit_as(k, rng.random_range(1..8), Tier::Guest);
                }
                2 => p.touch(k),
                3 => {
                    p.remove(&k);
                }
                8 => {
                    let _ = p.admit_fixed(rng.random_range(1..8));
                }
                9 => p.release_fixed(rng.random_range(1..8)),
                10 => p.pin(&k),
                11 => p.unpin(&k),
                13 => p.pin_held(&k),
                14 => p.unpin_held(&k),
                12 => p.shrink(&k, rng.random_range(0..4), Tier::Guest),
                4 => p.mark_stale(&k),
                5 => p.record_read(rng.random_range(0..20)),
                _ => {
                    p.set_capacity(rng.random_range(50..200));
                    let _ = p.shrink_to_capacity();
                }
            }
            assert_eq!(p.index.len(), p.entries.len());
            for (i, e) in p.entries.iter().enumerate() {
                assert_eq!(p.find(&e.key), Some(i as u32));
            }
            let all: Vec<u32> = p.iter_list(BY_LAST).collect();
            assert_eq!(all.len(), p.len());
            assert!(all.windows(2).all(|w| p.last(w[0]) <= p.last(w[1])));
            let guests: Vec<u32> = p.iter_list(GUESTS).collect();
            let stale: Vec<u32> = p.iter_list(STALE).collect();
            assert!(guests.windows(2).all(|w| p.last(w[0]) <= p.last(w[1])));
            let n = p.len() as u32;
            let stale_f = |i: u32| p.flags(i) & STALE_F != 0;
            let want_g = (0..n).filter(|&i| p.flags(i) & GUEST != 0 && !stale_f(i));
            assert_eq!(guests.len(), want_g.count());
            assert_eq!(stale.len(), (0..n).filter(|&i| stale_f(i)).count());
            assert!(guests.iter().all(|&i| p.flags(i) & GUEST != 0));
            assert!(stale.iter().all(|&i| stale_f(i)));
            // Every entry has a part; a part without its flag holds nothing;
            // exactly the entries with something besides their record (a
            // guest part, stale, pinned) have a side record.
            for i in 0..n {
                assert_ne!(p.flags(i) & BOTH, 0);
                assert!(p.flags(i) & OWN != 0 || p.units(i, Tier::Own) == 0);
                assert!(p.flags(i) & GUEST != 0 || p.units(i, Tier::Guest) == 0);
                let needs_side = p.flags(i) & (GUEST | STALE_F) != 0 || p.pins(i) != 0;
                assert!(p.side_of(i).is_none_or(|s| s.held <= s.pins), "entry {i}");
                assert_eq!(p.side_of(i).is_some(), needs_side, "entry {i}");
                assert_eq!(p.side.contains_key(&i), needs_side, "entry {i}");
            }
            assert_eq!(
                p.side.len(),
                (0..n).filter(|&i| p.side_of(i).is_some()).count()
            );
            let booked: u64 = (0..n)
                .map(|i| (p.units(i, Tier::Own) + p.units(i, Tier::Guest)) as u64)
                .sum();
            assert_eq!(p.used(), booked + p.fixed);
        }
    }

    #[test]
    fn shrink_to_capacity_after_restart() {
        let mut p: Policy<u32> = Policy::new(10);
        for k in 0..5 {
            p.insert_existing(k, 4);
        }
        p.mark_stale(&3);
        let gone: Vec<u32> = p.shrink_to_capacity().into_iter().map(|v| v.key).collect();
        assert!(gone.contains(&3));
        assert!(p.used() <= 10);
        assert_eq!(gone.len(), 3);
    }
}
