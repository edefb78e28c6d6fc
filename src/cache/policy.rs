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
use std::hash::{BuildHasher, Hash};

use hashbrown::HashTable;

/// What the policy decided for a write.
#[derive(Debug, PartialEq, Eq)]
pub enum Admission<K> {
    /// Write it, after removing these entries (already taken off the books).
    Admit { evict: Vec<K> },
    /// Do not write it: the cache is full of data still in use.
    Reject,
}

/// Which tier an entry belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// This node's own blocks (or a node without peers).
    Own,
    /// Blocks owned by another node: only in spare room, evicted first.
    Guest,
}

/// No entry (the end of a list).
const NIL: u32 = u32::MAX;
/// The lists: every entry by last access; the guests (not stale) by last
/// access; the stale entries, in the order they were marked.
const BY_LAST: usize = 0;
const GUESTS: usize = 1;
const STALE: usize = 2;

/// One entry of the dense table: its key, its books and its places in the
/// lists (`links[0]` in [`BY_LAST`], `links[1]` in [`GUESTS`] or [`STALE`]).
#[derive(Debug, Clone, Copy)]
struct Entry<K> {
    key: K,
    bytes: u64,
    /// The read clock at the last access.
    last: u64,
    pins: u32,
    tier: Tier,
    stale: bool,
    /// [prev, next] record numbers in each list.
    links: [[u32; 2]; 2],
}

#[derive(Debug, Clone, Copy)]
struct List {
    head: u32,
    tail: u32,
}

/// Epoch-aware accounting of what the cache holds, keyed by any entry id (the
/// disk cache uses one entry per part of a file version).
///
/// The books are one dense table (`Vec`, no holes: a removed entry's place
/// is taken by the last one), a hash table of u32 record numbers to find an
/// entry by key, and intrusive doubly linked lists through the table for
/// the orders the policy walks (by last access, the guests, the stale
/// entries). The read clock never goes back, so appending a touched entry
/// at the tail keeps a list sorted by last access. About 40 bytes plus the
/// key per entry.
#[derive(Debug)]
pub struct Policy<K: Copy + Ord + Hash> {
    capacity: u64,
    used: u64,
    /// Bytes the loader has read through the mount (hits and misses): the
    /// clock that measures "passes over the data set".
    clock: u64,
    /// Accesses less than this many bytes of reading apart are one moment:
    /// an entry is re-sorted at most once per grain (1 by default; the disk
    /// cache uses its block size).
    grain: u64,
    dataset_bytes: u64,
    entries: Vec<Entry<K>>,
    index: HashTable<u32>,
    hasher: RandomState,
    lists: [List; 3],
    evictions: u64,
}

impl<K: Copy + Ord + Hash> Policy<K> {
    pub fn new(capacity: u64) -> Self {
        Policy {
            capacity,
            used: 0,
            clock: 0,
            grain: 1,
            dataset_bytes: 0,
            entries: Vec::new(),
            index: HashTable::new(),
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

    /// Heap bytes the books hold (for the documentation of per-file
    /// memory).
    pub fn heap_bytes(&self) -> usize {
        self.entries.capacity() * std::mem::size_of::<Entry<K>>()
            + super::disk::table_bytes(&self.index)
    }

    /// Makes room for `n` more entries at once (a start-up that books a
    /// known number).
    pub fn reserve(&mut self, n: usize) {
        self.entries.reserve_exact(n);
        let Policy {
            index,
            entries,
            hasher,
            ..
        } = self;
        index.reserve(n, |&j| hasher.hash_one(entries[j as usize].key));
    }

    fn find(&self, key: &K) -> Option<u32> {
        let h = self.hasher.hash_one(key);
        let entries = &self.entries;
        self.index
            .find(h, |&i| entries[i as usize].key == *key)
            .copied()
    }

    fn get(&self, key: &K) -> Option<&Entry<K>> {
        self.find(key).map(|i| &self.entries[i as usize])
    }

    fn get_mut(&mut self, key: &K) -> Option<&mut Entry<K>> {
        self.find(key).map(|i| &mut self.entries[i as usize])
    }

    /// Appends entry `i` at the tail of list `l`.
    fn push_back(&mut self, l: usize, i: u32) {
        let which = (l != BY_LAST) as usize;
        let tail = self.lists[l].tail;
        self.entries[i as usize].links[which] = [tail, NIL];
        if tail == NIL {
            self.lists[l].head = i;
        } else {
            self.entries[tail as usize].links[which][1] = i;
        }
        self.lists[l].tail = i;
    }

    /// Takes entry `i` out of list `l`.
    fn unlink(&mut self, l: usize, i: u32) {
        let which = (l != BY_LAST) as usize;
        let [prev, next] = self.entries[i as usize].links[which];
        if prev == NIL {
            self.lists[l].head = next;
        } else {
            self.entries[prev as usize].links[which][1] = next;
        }
        if next == NIL {
            self.lists[l].tail = prev;
        } else {
            self.entries[next as usize].links[which][0] = prev;
        }
        self.entries[i as usize].links[which] = [NIL, NIL];
    }

    /// The second list an entry is in, if any.
    fn side(e: &Entry<K>) -> Option<usize> {
        if e.stale {
            Some(STALE)
        } else if e.tier == Tier::Guest {
            Some(GUESTS)
        } else {
            None
        }
    }

    /// The record numbers of list `l`, head first.
    fn iter(&self, l: usize) -> impl Iterator<Item = u32> + '_ {
        let which = (l != BY_LAST) as usize;
        let mut at = self.lists[l].head;
        std::iter::from_fn(move || {
            if at == NIL {
                return None;
            }
            let i = at;
            at = self.entries[i as usize].links[which][1];
            Some(i)
        })
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

    /// Bytes of entries read within the horizon (two passes over the data
    /// set): what a neighbouring data set may never take (`budget.rs`).
    /// Stale versions, guests and abandoned entries are not counted. Costs
    /// the number of those, not of all entries.
    pub fn hot_bytes(&self) -> u64 {
        let cold_before = self.clock.saturating_sub(self.horizon());
        let mut cold = 0;
        for i in self.iter(BY_LAST) {
            let e = &self.entries[i as usize];
            if e.last >= cold_before || self.clock <= self.horizon() {
                break;
            }
            if !e.stale && e.tier == Tier::Own {
                cold += e.bytes;
            }
        }
        for i in self.iter(STALE).chain(self.iter(GUESTS)) {
            cold += self.entries[i as usize].bytes;
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

    /// Sets the clock's grain (see the field).
    pub fn set_grain(&mut self, bytes: u64) {
        self.grain = bytes.max(1);
    }

    /// The clock, down to its grain (never before the newest access on the
    /// books, so that the lists stay sorted if the grain is changed).
    fn now(&self) -> u64 {
        let tail = self.lists[BY_LAST].tail;
        let newest = if tail == NIL {
            0
        } else {
            self.entries[tail as usize].last
        };
        (self.clock / self.grain * self.grain).max(newest)
    }

    /// Notes an access to an entry (a hit or a write).
    pub fn touch(&mut self, key: K) {
        let Some(i) = self.find(&key) else { return };
        let now = self.now();
        let e = &mut self.entries[i as usize];
        if e.last == now {
            // Already in place: many small files are opened per grain.
            return;
        }
        e.last = now;
        let guest = e.tier == Tier::Guest && !e.stale;
        self.unlink(BY_LAST, i);
        self.push_back(BY_LAST, i);
        if guest {
            self.unlink(GUESTS, i);
            self.push_back(GUESTS, i);
        }
    }

    /// The tier of an entry, if it is on the books.
    pub fn tier(&self, key: &K) -> Option<Tier> {
        self.get(key).map(|e| e.tier)
    }

    /// Takes an entry found on disk at start-up onto the books, as if last
    /// read before this mount (clock 0). Never refused: call
    /// [`Policy::shrink_to_capacity`] afterwards.
    pub fn insert_existing(&mut self, key: K, bytes: u64) {
        self.grow(key, bytes, Tier::Own);
    }

    /// [`Policy::insert_existing`] for an entry of a given tier. Also adds
    /// bytes to an entry without asking (the caller moves bytes between
    /// entries it already holds).
    pub fn insert_existing_as(&mut self, key: K, bytes: u64, tier: Tier) {
        self.grow(key, bytes, tier);
    }

    fn grow(&mut self, key: K, bytes: u64, tier: Tier) {
        self.used += bytes;
        if let Some(e) = self.get_mut(&key) {
            e.bytes += bytes;
            return;
        }
        let last = self.now();
        let i = self.entries.len() as u32;
        self.entries.push(Entry {
            key,
            bytes,
            last,
            pins: 0,
            tier,
            stale: false,
            links: [[NIL; 2]; 2],
        });
        let Policy {
            index,
            entries,
            hasher,
            ..
        } = self;
        index.insert_unique(hasher.hash_one(key), i, |&j| {
            hasher.hash_one(entries[j as usize].key)
        });
        self.push_back(BY_LAST, i);
        if tier == Tier::Guest {
            self.push_back(GUESTS, i);
        }
    }

    /// Asks to add `bytes` to own entry `key` (creating it if needed).
    pub fn admit(&mut self, key: K, bytes: u64) -> Admission<K> {
        self.admit_as(key, bytes, Tier::Own)
    }

    /// Asks to add `bytes` to entry `key` of tier `tier` (an existing entry
    /// keeps its tier).
    pub fn admit_as(&mut self, key: K, bytes: u64, tier: Tier) -> Admission<K> {
        let tier = self.tier(&key).unwrap_or(tier);
        let need = (self.used + bytes).saturating_sub(self.capacity);
        if need == 0 {
            self.grow(key, bytes, tier);
            self.touch(key);
            return Admission::Admit { evict: Vec::new() };
        }
        let victims = self.victims(need, Some(key), false, tier == Tier::Own);
        if victims.is_empty() {
            return Admission::Reject;
        }
        for v in &victims {
            self.remove(v);
            self.evictions += 1;
        }
        self.grow(key, bytes, tier);
        self.touch(key);
        Admission::Admit { evict: victims }
    }

    /// Entries to remove to free `need` bytes: stale versions first; for an
    /// own entry (`evict_guests`), then guests, oldest first; then entries
    /// abandoned for a whole horizon (oldest first); with `force`, then any
    /// unpinned entry, oldest first. Empty if that is not enough.
    fn victims(&self, need: u64, spare: Option<K>, force: bool, evict_guests: bool) -> Vec<K> {
        let mut out = Vec::new();
        let mut freed = 0;
        let usable = |e: &Entry<K>| e.pins == 0 && Some(e.key) != spare;
        for i in self.iter(STALE) {
            if freed >= need {
                break;
            }
            let e = &self.entries[i as usize];
            if usable(e) {
                out.push(e.key);
                freed += e.bytes;
            }
        }
        if evict_guests {
            for i in self.iter(GUESTS) {
                if freed >= need {
                    break;
                }
                let e = &self.entries[i as usize];
                if usable(e) {
                    out.push(e.key);
                    freed += e.bytes;
                }
            }
        }
        let horizon = self.horizon();
        for i in self.iter(BY_LAST) {
            if freed >= need {
                break;
            }
            let e = &self.entries[i as usize];
            if !force && self.clock.saturating_sub(e.last) <= horizon {
                break;
            }
            let taken = evict_guests && e.tier == Tier::Guest;
            if usable(e) && !e.stale && !taken {
                out.push(e.key);
                freed += e.bytes;
            }
        }
        if freed >= need {
            out
        } else {
            Vec::new()
        }
    }

    /// Removes entries until the books fit the capacity (after start-up or a
    /// smaller --cache-size), stale ones first. Returns what to delete.
    pub fn shrink_to_capacity(&mut self) -> Vec<K> {
        let need = self.used.saturating_sub(self.capacity);
        if need == 0 {
            return Vec::new();
        }
        let victims = self.victims(need, None, true, true);
        for v in &victims {
            self.remove(v);
            self.evictions += 1;
        }
        victims
    }

    /// Takes an entry off the books entirely; returns the bytes it held.
    pub fn remove(&mut self, key: &K) -> u64 {
        let Some(i) = self.find(key) else { return 0 };
        let e = self.entries[i as usize];
        self.unlink(BY_LAST, i);
        if let Some(l) = Self::side(&e) {
            self.unlink(l, i);
        }
        let h = self.hasher.hash_one(key);
        if let Ok(o) = self.index.find_entry(h, |&j| j == i) {
            o.remove();
        }
        // The last entry takes the freed place.
        let last = self.entries.len() as u32 - 1;
        self.entries.swap_remove(i as usize);
        if i != last {
            let moved = self.entries[i as usize];
            for (which, l) in [(0, Some(BY_LAST)), (1, Self::side(&moved))] {
                let Some(l) = l else { continue };
                let [prev, next] = moved.links[which];
                if prev == NIL {
                    self.lists[l].head = i;
                } else {
                    self.entries[prev as usize].links[which][1] = i;
                }
                if next == NIL {
                    self.lists[l].tail = i;
                } else {
                    self.entries[next as usize].links[which][0] = i;
                }
            }
            let h = self.hasher.hash_one(moved.key);
            if let Some(j) = self.index.find_mut(h, |&j| j == last) {
                *j = i;
            }
        }
        self.used -= e.bytes;
        e.bytes
    }

    /// Gives back `bytes` of an entry (a block found corrupt, a failed write).
    pub fn shrink(&mut self, key: &K, bytes: u64) {
        if let Some(e) = self.get_mut(key) {
            let b = bytes.min(e.bytes);
            e.bytes -= b;
            self.used -= b;
        }
    }

    /// Marks an entry as a version that will never be read again (the file
    /// changed or vanished at the source): it goes first when room is needed.
    pub fn mark_stale(&mut self, key: &K) {
        let Some(i) = self.find(key) else { return };
        let e = self.entries[i as usize];
        if e.stale {
            return;
        }
        if let Some(l) = Self::side(&e) {
            self.unlink(l, i);
        }
        self.entries[i as usize].stale = true;
        self.push_back(STALE, i);
    }

    /// Pinned entries are never evicted (a file open in passthrough mode).
    pub fn pin(&mut self, key: &K) {
        if let Some(e) = self.get_mut(key) {
            e.pins += 1;
        }
    }

    pub fn unpin(&mut self, key: &K) {
        if let Some(e) = self.get_mut(key) {
            e.pins = e.pins.saturating_sub(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::seq::SliceRandom;
    use rand::SeedableRng;
    use std::collections::{HashSet, VecDeque};

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
        assert_eq!(p.get(&2).unwrap().last, 0, "same grain: not moved");
        p.record_read(60);
        p.touch(1);
        assert_eq!(p.get(&1).unwrap().last, 100, "next grain: moved");
        let order: Vec<_> = p
            .iter(BY_LAST)
            .map(|i| (p.entries[i as usize].last, p.entries[i as usize].key))
            .collect();
        assert_eq!(order, vec![(0, 2), (100, 1)]);
        // Without a grain every read moves the clock.
        let mut q: Policy<u32> = Policy::new(1000);
        q.insert_existing(1, 10);
        q.record_read(7);
        q.touch(1);
        assert_eq!(q.get(&1).unwrap().last, 7);
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
        match p.admit(1000, 1) {
            Admission::Admit { evict } => assert_eq!(evict, vec![0]),
            r => panic!("{r:?}"),
        }
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
        assert_eq!(p.admit(3, 5), Admission::Admit { evict: vec![2] });
        assert_eq!(p.used(), 10);
        p.shrink(&3, 5);
        assert_eq!(p.used(), 5);
        assert_eq!(p.remove(&1), 5);
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
        assert_eq!(p.admit(2, 3), Admission::Admit { evict: vec![101] });
        assert_eq!(p.admit(3, 4), Admission::Admit { evict: vec![100] });
        assert_eq!(p.tier(&3), Some(Tier::Own));
        assert_eq!(p.tier(&100), None);
        // Own entries are not churned for each other.
        assert_eq!(p.admit(4, 1), Admission::Reject);
        assert!(p.used() <= p.capacity());
        // Pinned guests stay; an existing entry keeps its tier.
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
        assert_eq!(q.tier(&7), Some(Tier::Guest));
        assert_eq!(q.admit(9, 3), Admission::Admit { evict: vec![7] });
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
            match rng.random_range(0..7) {
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
            let all: Vec<u32> = p.iter(BY_LAST).collect();
            assert_eq!(all.len(), p.len());
            assert!(all
                .windows(2)
                .all(|w| p.entries[w[0] as usize].last <= p.entries[w[1] as usize].last));
            let guests: Vec<u32> = p.iter(GUESTS).collect();
            let stale: Vec<u32> = p.iter(STALE).collect();
            assert!(guests
                .windows(2)
                .all(|w| p.entries[w[0] as usize].last <= p.entries[w[1] as usize].last));
            let want_g = p
                .entries
                .iter()
                .filter(|e| e.tier == Tier::Guest && !e.stale);
            assert_eq!(guests.len(), want_g.count());
            assert_eq!(stale.len(), p.entries.iter().filter(|e| e.stale).count());
            assert!(guests
                .iter()
                .all(|&i| p.entries[i as usize].tier == Tier::Guest));
            assert!(stale.iter().all(|&i| p.entries[i as usize].stale));
            assert_eq!(p.used(), p.entries.iter().map(|e| e.bytes).sum::<u64>());
        }
    }

    #[test]
    fn shrink_to_capacity_after_restart() {
        let mut p: Policy<u32> = Policy::new(10);
        for k in 0..5 {
            p.insert_existing(k, 4);
        }
        p.mark_stale(&3);
        let gone = p.shrink_to_capacity();
        assert!(gone.contains(&3));
        assert!(p.used() <= 10);
        assert_eq!(gone.len(), 3);
    }
}
