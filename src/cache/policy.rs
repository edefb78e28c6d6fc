//! The cache's admission and eviction policy, made for training: every epoch
//! reads the whole data set once in a new random order. Under that pattern
//! LRU is close to the worst policy and "keep what you have" is optimal
//! (shared/paper.md), so this policy admits while there is room, never churns
//! the current data set's entries to make room for other entries of it, and
//! evicts only stale versions and entries that nobody has read for two full
//! passes over the data set (a working set that moved on).
//!
//! Pure bookkeeping: no I/O, no clocks, no threads. The caller owns the lock
//! and does the unlinking; the simulation test drives this exact code.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::hash::Hash;

/// What the policy decided for a write.
#[derive(Debug, PartialEq, Eq)]
pub enum Admission<K> {
    /// Write it, after removing these entries (already taken off the books).
    Admit { evict: Vec<K> },
    /// Do not write it: the cache is full of data still in use.
    Reject,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    bytes: u64,
    /// The read clock at the last access.
    last: u64,
    pins: u32,
    stale: bool,
}

/// Epoch-aware accounting of what the cache holds, keyed by any entry id (the
/// disk cache uses one entry per file version).
#[derive(Debug)]
pub struct Policy<K: Copy + Ord + Hash> {
    capacity: u64,
    used: u64,
    /// Bytes the loader has read through the mount (hits and misses): the
    /// clock that measures "passes over the data set".
    clock: u64,
    dataset_bytes: u64,
    entries: HashMap<K, Entry>,
    by_last: BTreeSet<(u64, K)>,
    stale: HashSet<K>,
    evictions: u64,
}

impl<K: Copy + Ord + Hash> Policy<K> {
    pub fn new(capacity: u64) -> Self {
        Policy {
            capacity,
            used: 0,
            clock: 0,
            dataset_bytes: 0,
            entries: HashMap::new(),
            by_last: BTreeSet::new(),
            stale: HashSet::new(),
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
        self.entries.contains_key(key)
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

    /// Advances the read clock by bytes the loader read.
    pub fn record_read(&mut self, bytes: u64) {
        self.clock = self.clock.saturating_add(bytes);
    }

    /// Notes an access to an entry (a hit or a write).
    pub fn touch(&mut self, key: K) {
        if let Some(e) = self.entries.get_mut(&key) {
            self.by_last.remove(&(e.last, key));
            e.last = self.clock;
            self.by_last.insert((e.last, key));
        }
    }

    /// Takes an entry found on disk at start-up onto the books, as if last
    /// read before this mount (clock 0). Never refused: call
    /// [`Policy::shrink_to_capacity`] afterwards.
    pub fn insert_existing(&mut self, key: K, bytes: u64) {
        self.grow(key, bytes);
    }

    fn grow(&mut self, key: K, bytes: u64) {
        let clock = self.clock;
        let e = self.entries.entry(key).or_insert_with(|| Entry {
            bytes: 0,
            last: clock,
            pins: 0,
            stale: false,
        });
        e.bytes += bytes;
        let last = e.last;
        self.by_last.insert((last, key));
        self.used += bytes;
    }

    /// Asks to add `bytes` to entry `key` (creating it if needed).
    pub fn admit(&mut self, key: K, bytes: u64) -> Admission<K> {
        let need = (self.used + bytes).saturating_sub(self.capacity);
        if need == 0 {
            self.grow(key, bytes);
            self.touch(key);
            return Admission::Admit { evict: Vec::new() };
        }
        let victims = self.victims(need, Some(key), false);
        if victims.is_empty() {
            return Admission::Reject;
        }
        for v in &victims {
            self.remove(v);
            self.evictions += 1;
        }
        self.grow(key, bytes);
        self.touch(key);
        Admission::Admit { evict: victims }
    }

    /// Entries to remove to free `need` bytes: stale versions first, then
    /// entries abandoned for a whole horizon (oldest first); with `force`,
    /// then any unpinned entry, oldest first. Empty if that is not enough.
    fn victims(&self, need: u64, spare: Option<K>, force: bool) -> Vec<K> {
        let mut out = Vec::new();
        let mut freed = 0;
        let usable = |k: &K, e: &Entry| e.pins == 0 && Some(*k) != spare;
        for k in &self.stale {
            if freed >= need {
                break;
            }
            let e = &self.entries[k];
            if usable(k, e) {
                out.push(*k);
                freed += e.bytes;
            }
        }
        let horizon = self.horizon();
        for (last, k) in &self.by_last {
            if freed >= need {
                break;
            }
            if !force && self.clock.saturating_sub(*last) <= horizon {
                break;
            }
            let e = &self.entries[k];
            if usable(k, e) && !e.stale {
                out.push(*k);
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
        let victims = self.victims(need, None, true);
        for v in &victims {
            self.remove(v);
            self.evictions += 1;
        }
        victims
    }

    /// Takes an entry off the books entirely; returns the bytes it held.
    pub fn remove(&mut self, key: &K) -> u64 {
        match self.entries.remove(key) {
            Some(e) => {
                self.by_last.remove(&(e.last, *key));
                self.stale.remove(key);
                self.used -= e.bytes;
                e.bytes
            }
            None => 0,
        }
    }

    /// Gives back `bytes` of an entry (a block found corrupt, a failed write).
    pub fn shrink(&mut self, key: &K, bytes: u64) {
        if let Some(e) = self.entries.get_mut(key) {
            let b = bytes.min(e.bytes);
            e.bytes -= b;
            self.used -= b;
        }
    }

    /// Marks an entry as a version that will never be read again (the file
    /// changed or vanished at the source): it goes first when room is needed.
    pub fn mark_stale(&mut self, key: &K) {
        if let Some(e) = self.entries.get_mut(key) {
            e.stale = true;
            self.stale.insert(*key);
        }
    }

    /// Pinned entries are never evicted (a file open in passthrough mode).
    pub fn pin(&mut self, key: &K) {
        if let Some(e) = self.entries.get_mut(key) {
            e.pins += 1;
        }
    }

    pub fn unpin(&mut self, key: &K) {
        if let Some(e) = self.entries.get_mut(key) {
            e.pins = e.pins.saturating_sub(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::seq::SliceRandom;
    use rand::SeedableRng;
    use std::collections::VecDeque;

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
