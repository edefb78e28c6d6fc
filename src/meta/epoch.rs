//! Epoch tracking: which files the loader has read in the current pass over
//! the data set, and when a new pass starts. A training loader reads every
//! file (or, under a DistributedSampler, its node's share) once per epoch in
//! a new order, so re-reads of files already read this epoch mark the next
//! epoch; a file opened twice in quick succession (a header, then the data)
//! is not a re-read.
//!
//! Pure bookkeeping with no I/O and no clock; the read-ahead engine feeds it
//! file opens. Per file it costs one bit (a bitset indexed by the file id,
//! an inode number: they are dense), plus a fixed ring of the last
//! [`REREAD_DISTANCE`] opens.

/// How many other files must have been opened since a file's last read for
/// a new read of it to count as a re-read (not the same access).
const REREAD_DISTANCE: u64 = 64;
/// Re-reads (as a share of files read this epoch) that start a new epoch.
const NEW_EPOCH_SHARE: f64 = 0.02;
const NEW_EPOCH_MIN: u64 = 4;

/// A set of dense ids, one bit each.
#[derive(Debug, Default, Clone)]
pub struct BitSet {
    words: Vec<u64>,
    len: u64,
}

impl BitSet {
    /// Sets `id`; true if it was not set.
    pub fn insert(&mut self, id: u64) -> bool {
        let (w, b) = ((id / 64) as usize, id % 64);
        if w >= self.words.len() {
            self.words.resize(w + 1, 0);
        }
        let new = self.words[w] & (1 << b) == 0;
        self.words[w] |= 1 << b;
        self.len += new as u64;
        new
    }

    pub fn contains(&self, id: u64) -> bool {
        self.words
            .get((id / 64) as usize)
            .is_some_and(|w| w & (1 << (id % 64)) != 0)
    }

    /// Ids set.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Empties the set, keeping its memory (it fills up again next epoch).
    pub fn clear(&mut self) {
        self.words.fill(0);
        self.len = 0;
    }

    /// The first id set at or after `from`.
    pub fn next_from(&self, from: u64) -> Option<u64> {
        let mut w = (from / 64) as usize;
        let mut word = *self.words.get(w)? & (!0u64 << (from % 64));
        loop {
            if word != 0 {
                return Some(w as u64 * 64 + word.trailing_zeros() as u64);
            }
            w += 1;
            word = *self.words.get(w)?;
        }
    }

    /// Heap bytes held.
    pub fn heap_bytes(&self) -> usize {
        self.words.capacity() * 8
    }
}

/// Files read in the current epoch and the epoch counter.
#[derive(Debug, Default)]
pub struct EpochTracker {
    epoch: u64,
    /// Files read this epoch.
    read: BitSet,
    /// The last `REREAD_DISTANCE` files opened, oldest overwritten first: a
    /// file read again while still in it is the same access, not a re-read.
    recent: Vec<u64>,
    seq: u64,
    rereads: u64,
}

impl EpochTracker {
    pub fn new() -> Self {
        EpochTracker {
            epoch: 1,
            ..Default::default()
        }
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    pub fn files_read(&self) -> u64 {
        self.read.len()
    }

    pub fn was_read(&self, file: u64) -> bool {
        self.read.contains(file)
    }

    /// Heap bytes held (one bit per file id, the ring).
    pub fn heap_bytes(&self) -> usize {
        self.read.heap_bytes() + self.recent.capacity() * 8
    }

    /// Records that the loader read (opened for reading) `file`. Returns true
    /// if this started a new epoch.
    pub fn on_read(&mut self, file: u64) -> bool {
        // Read within the last REREAD_DISTANCE opens: the same access.
        let recent = self.recent.contains(&file);
        let slot = (self.seq % REREAD_DISTANCE) as usize;
        if slot < self.recent.len() {
            self.recent[slot] = file;
        } else {
            self.recent.push(file);
        }
        self.seq += 1;
        if self.read.insert(file) || recent {
            return false;
        }
        self.rereads += 1;
        let threshold = ((self.read.len() as f64 * NEW_EPOCH_SHARE) as u64).max(NEW_EPOCH_MIN);
        if self.rereads >= threshold {
            self.epoch += 1;
            self.rereads = 0;
            self.read.clear();
            self.read.insert(file);
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::seq::SliceRandom;
    use rand::SeedableRng;

    #[test]
    fn shuffled_epochs_are_detected_near_their_start() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let mut t = EpochTracker::new();
        let mut files: Vec<u64> = (0..5000).collect();
        for epoch in 1..=4 {
            files.shuffle(&mut rng);
            for (i, f) in files.iter().enumerate() {
                if t.on_read(*f) {
                    // Detected within the first few percent of the new epoch.
                    assert_eq!(t.epoch(), epoch);
                    assert!(i < files.len() / 10, "late detection at {i}");
                }
            }
            assert_eq!(t.epoch(), epoch);
            assert!(t.files_read() as usize > files.len() * 9 / 10);
        }
    }

    #[test]
    fn distributed_share_epochs_are_detected() {
        // One node of four: a new random quarter of the data set each epoch.
        let mut rng = rand::rngs::StdRng::seed_from_u64(2);
        let mut t = EpochTracker::new();
        let mut files: Vec<u64> = (0..8000).collect();
        for epoch in 1..=3 {
            files.shuffle(&mut rng);
            for f in &files[..2000] {
                t.on_read(*f);
            }
            assert_eq!(t.epoch(), epoch, "epoch {epoch}");
        }
    }

    #[test]
    fn quick_reopens_are_not_rereads() {
        let mut t = EpochTracker::new();
        for f in 0..1000u64 {
            t.on_read(f);
            t.on_read(f);
            t.on_read(f);
        }
        assert_eq!(t.epoch(), 1);
        assert_eq!(t.files_read(), 1000);
    }
}
