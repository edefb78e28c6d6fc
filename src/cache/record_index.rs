//! The one per-file lookup table of the cache's books: finds a record of
//! the dense table (`policy.rs`) by its key's hash. An open-addressing table
//! of 4-byte slots, linear probing, at most 7/8 full, grown by a quarter.
//!
//! Why not `hashbrown::HashTable<u32>`, which it replaced (2026-12-05,
//! issue 14): hashbrown's buckets are a power of two of 5 bytes (the value
//! and a control byte), so the table costs 5.7-11.4 bytes per cached file,
//! and at 0.5, 1 and 2 M files it sits just past 7/8 of the lower power of
//! two: 10.5. Here a slot holds the record number and, in the bits the
//! record number does not need, a tag of the hash (the control byte's
//! job), and the table grows by 5/4: 4.6-5.7 bytes per file.
//!
//! The records are dense (those of `0..len`, each in one slot), as the
//! table they index: an insertion adds record `len`, a removal takes one
//! record out and renumbers the last into its place (`Vec::swap_remove`).
//! So a rebuild reads the caller's records in order, not at random. A
//! growth rehashes every record under the caller's lock: about 70 ms at
//! 2 M records on the development VM (hashbrown's doubling of a table of
//! the same records: about 40 ms, half as often).
//!
//! Pure: no I/O, no locks. It never decides whether two records are equal;
//! the caller's `eq` does, behind the tag.

/// The fewest slots of a table that holds anything.
const MIN_SLOTS: usize = 16;

/// Record numbers of a dense table, found by a 64-bit hash of their keys.
#[derive(Debug, Default)]
pub struct RecordIndex {
    /// 0: empty; else `tag << bits | (record + 1)`.
    slots: Vec<u32>,
    len: usize,
    /// Bits of a slot that hold `record + 1`: the bit length of
    /// `slots.len()`, so that any record below it fits; the rest (at most
    /// 32 - 5) hold the tag.
    bits: u32,
}

impl RecordIndex {
    pub fn new() -> Self {
        Self::default()
    }

    /// Records held.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Heap bytes of the table.
    pub fn heap_bytes(&self) -> usize {
        self.slots.capacity() * 4
    }

    fn home(&self, h: u64) -> usize {
        // (the high half of the hash, scaled to the table: no power of two)
        (((h >> 32) * self.slots.len() as u64) >> 32) as usize
    }

    fn tag_mask(&self) -> u32 {
        if self.bits >= 32 {
            0
        } else {
            u32::MAX >> self.bits
        }
    }

    fn tag(&self, h: u64) -> u32 {
        h as u32 & self.tag_mask()
    }

    fn slot_tag(&self, v: u32) -> u32 {
        v.checked_shr(self.bits).unwrap_or(0)
    }

    fn record(&self, v: u32) -> u32 {
        (v & (u32::MAX >> (32 - self.bits))) - 1
    }

    fn pack(&self, tag: u32, record: u32) -> u32 {
        tag.checked_shl(self.bits).unwrap_or(0) | (record + 1)
    }

    fn next(&self, i: usize) -> usize {
        if i + 1 == self.slots.len() {
            0
        } else {
            i + 1
        }
    }

    /// The slot holding a record with hash `h` for which `eq` is true.
    fn find_slot(&self, h: u64, mut eq: impl FnMut(u32) -> bool) -> Option<usize> {
        if self.len == 0 {
            return None;
        }
        let tag = self.tag(h);
        let mut i = self.home(h);
        // (at most 7/8 full: an empty slot ends every probe)
        loop {
            let v = self.slots[i];
            if v == 0 {
                return None;
            }
            if self.slot_tag(v) == tag && eq(self.record(v)) {
                return Some(i);
            }
            i = self.next(i);
        }
    }

    /// The record with hash `h` for which `eq` is true.
    pub fn find(&self, h: u64, eq: impl FnMut(u32) -> bool) -> Option<u32> {
        self.find_slot(h, eq).map(|i| self.record(self.slots[i]))
    }

    /// The records that may have hash `h` (those with another hash are
    /// few: the tag's misses); the caller tells them apart.
    pub fn candidates(&self, h: u64) -> impl Iterator<Item = u32> + '_ {
        let tag = self.tag(h);
        let mut i = if self.len == 0 {
            usize::MAX
        } else {
            self.home(h)
        };
        std::iter::from_fn(move || loop {
            let v = *self.slots.get(i)?;
            if v == 0 {
                return None;
            }
            i = self.next(i);
            if self.slot_tag(v) == tag {
                return Some(self.record(v));
            }
        })
    }

    fn place(&mut self, h: u64, record: u32) {
        let v = self.pack(self.tag(h), record);
        let mut i = self.home(h);
        while self.slots[i] != 0 {
            i = self.next(i);
        }
        self.slots[i] = v;
    }

    /// Adds record number `len()`, of hash `h`. `hash_of` gives the hash of
    /// any record held (a growth reads them all, in order).
    pub fn insert(&mut self, h: u64, record: u32, hash_of: impl Fn(u32) -> u64) {
        debug_assert_eq!(record as usize, self.len, "records are dense");
        self.reserve(1, hash_of);
        self.place(h, record);
        self.len += 1;
    }

    /// Takes record `record`, of hash `h`, out. The table then misses
    /// that number until [`RecordIndex::renumber`] moves the last record
    /// into it (unless it was the last). `hash_of`: as for
    /// [`RecordIndex::insert`] (the records after it in its probe run).
    pub fn remove(&mut self, h: u64, record: u32, hash_of: impl Fn(u32) -> u64) -> bool {
        let Some(mut hole) = self.find_slot(h, |r| r == record) else {
            return false;
        };
        self.slots[hole] = 0;
        self.len -= 1;
        // Backward shift: each later record of the run whose home is not
        // between the hole and itself moves into the hole, so that no
        // probe meets an empty slot before its record.
        let mut j = self.next(hole);
        loop {
            let v = self.slots[j];
            if v == 0 {
                return true;
            }
            let home = self.home(hash_of(self.record(v)));
            let stays = if hole <= j {
                hole < home && home <= j
            } else {
                hole < home || home <= j
            };
            if !stays {
                self.slots[hole] = v;
                self.slots[j] = 0;
                hole = j;
            }
            j = self.next(j);
        }
    }

    /// Record `from` (of hash `h`) is now numbered `to`.
    pub fn renumber(&mut self, h: u64, from: u32, to: u32) -> bool {
        let Some(i) = self.find_slot(h, |r| r == from) else {
            return false;
        };
        self.slots[i] = self.pack(self.slot_tag(self.slots[i]), to);
        true
    }

    /// Makes room for `n` more records without a growth.
    pub fn reserve(&mut self, n: usize, hash_of: impl Fn(u32) -> u64) {
        let need = self.len + n;
        if need * 8 <= self.slots.len() * 7 {
            return;
        }
        let grown = self.slots.len() + self.slots.len() / 4;
        self.rebuild(grown.max(need * 8 / 7 + 1), hash_of);
    }

    /// Gives back slots beyond what the records need, if that is much
    /// (after a [`RecordIndex::reserve`] for more than came).
    pub fn shrink_to_fit(&mut self, hash_of: impl Fn(u32) -> u64) {
        let fit = self.len * 8 / 7 + 1;
        if self.slots.len() > fit + fit / 4 + MIN_SLOTS {
            self.rebuild(fit, hash_of);
        }
    }

    fn rebuild(&mut self, slots: usize, hash_of: impl Fn(u32) -> u64) {
        let slots = slots.max(MIN_SLOTS);
        let mut fresh = Vec::new();
        fresh.reserve_exact(slots);
        fresh.resize(slots, 0);
        self.slots = fresh;
        self.bits = usize::BITS - slots.leading_zeros();
        // Hashes a batch, then places it: hashing between the random
        // stores of the placements made a rebuild of 2 M records 3.5x
        // slower (149 ms against 26 + 40 ms apart).
        let mut hashes = [0u64; 1024];
        let len = self.len as u32;
        for start in (0..len).step_by(hashes.len()) {
            let batch = start..len.min(start + hashes.len() as u32);
            for (h, r) in hashes.iter_mut().zip(batch.clone()) {
                *h = hash_of(r);
            }
            for (&h, r) in hashes.iter().zip(batch) {
                self.place(h, r);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The model: a dense table of keys (`Vec::swap_remove` order), found
    /// by a scan. Hashes are chosen few so that runs and tags collide.
    struct Both {
        keys: Vec<u64>,
        index: RecordIndex,
        spread: u64,
    }

    impl Both {
        fn hash(&self, key: u64) -> u64 {
            // A few distinct hashes, over the whole 64 bits (home and tag).
            (key % self.spread).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        }

        fn insert(&mut self, key: u64) {
            if self.keys.contains(&key) {
                return;
            }
            let r = self.keys.len() as u32;
            self.keys.push(key);
            let h = self.hash(key);
            let Both { keys, index, .. } = self;
            let spread = self.spread;
            index.insert(h, r, |j| {
                (keys[j as usize] % spread).wrapping_mul(0x9E37_79B9_7F4A_7C15)
            });
        }

        fn remove(&mut self, key: u64) {
            let Some(r) = self.keys.iter().position(|&k| k == key) else {
                return;
            };
            let spread = self.spread;
            let hash = |k: u64| (k % spread).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            let keys = &self.keys;
            assert!(self
                .index
                .remove(hash(key), r as u32, |j| hash(keys[j as usize])));
            let last = self.keys.len() - 1;
            if r != last {
                assert!(self
                    .index
                    .renumber(hash(self.keys[last]), last as u32, r as u32));
            }
            self.keys.swap_remove(r);
        }

        fn check(&self) {
            assert_eq!(self.index.len(), self.keys.len());
            assert!(self.index.len() * 8 <= self.index.slots.len() * 7 || self.index.is_empty());
            for (r, &k) in self.keys.iter().enumerate() {
                let h = self.hash(k);
                assert_eq!(
                    self.index.find(h, |j| self.keys[j as usize] == k),
                    Some(r as u32),
                    "key {k}"
                );
                assert!(self.index.candidates(h).any(|j| j == r as u32));
            }
        }

        fn absent(&self, key: u64) {
            let h = self.hash(key);
            assert_eq!(self.index.find(h, |j| self.keys[j as usize] == key), None);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Any sequence of insertions, removals, reservations and shrinks:
        /// every record is found at its number, nothing else is, and the
        /// table stays at most 7/8 full.
        #[test]
        fn the_index_finds_what_a_scan_finds(
            spread in 1u64..64,
            ops in prop::collection::vec((0u8..10, 0u64..300), 1..600),
        ) {
            let mut b = Both { keys: Vec::new(), index: RecordIndex::new(), spread };
            for (op, key) in ops {
                match op {
                    0..=5 => b.insert(key),
                    6..=8 => b.remove(key),
                    _ if key % 2 == 0 => {
                        let Both { keys, index, .. } = &mut b;
                        index.reserve(key as usize, |j| {
                            (keys[j as usize] % spread).wrapping_mul(0x9E37_79B9_7F4A_7C15)
                        });
                    }
                    _ => {
                        let Both { keys, index, .. } = &mut b;
                        index.shrink_to_fit(|j| {
                            (keys[j as usize] % spread).wrapping_mul(0x9E37_79B9_7F4A_7C15)
                        });
                    }
                }
                b.check();
                b.absent(key + 1000);
            }
        }
    }

    #[test]
    fn a_table_of_a_million_records_costs_under_six_bytes_each() {
        let hash = |j: u32| (j as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let mut index = RecordIndex::new();
        for r in 0..1_000_000u32 {
            index.insert(hash(r), r, hash);
        }
        let per = index.heap_bytes() as f64 / index.len() as f64;
        assert!((4.0..6.0).contains(&per), "{per} bytes per record");
        for r in (0..1_000_000u32).step_by(997) {
            assert_eq!(index.find(hash(r), |j| j == r), Some(r));
        }
    }
}
