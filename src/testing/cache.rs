//! Block stores to put behind the `BlockStore` and `CompleteFiles` seams: a
//! cache in memory (that can refuse writes, be full, or see another write
//! of a block in flight), a gate in front of any block store, and the
//! complete-file side of the cache in memory. Each answers as `DiskCache`
//! does wherever it injects nothing (`tests/kit_fakes.rs`); none of it may
//! ship.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use super::Gate;
use crate::cache::{
    BlockStore, CacheUsage, ChecksummedBytes, CompleteFiles, DroppedHook, FileVersion, VersionKey,
};

/// A [`BlockStore`] in memory: keeps every block it is given (no bound, no
/// eviction, no policy) and logs each write and its kind. On demand it
/// refuses writes ([`MemCache::refuse_puts`]: the file's share of the
/// budget is taken), is full ([`MemCache::full`]: no room, every write
/// refused), or has another write of a block in flight
/// ([`MemCache::begin_other_write`]: a write of that block gives up, as
/// `DiskCache`'s does after waiting). Its whole files for passthrough are
/// [`MemComplete`]'s.
pub struct MemCache {
    block_size: u64,
    blocks: Mutex<HashMap<(VersionKey, u64), ChecksummedBytes>>,
    /// Versions marked current (`note_current`), in order.
    pub current: Mutex<Vec<VersionKey>>,
    /// Writes taken: block index and kind ("put", "guest", "ahead",
    /// "ahead guest"), in order.
    puts: Mutex<Vec<(u64, &'static str)>>,
    /// Refuse every write while set.
    pub refuse_puts: AtomicBool,
    /// No room for anything while set (every write refused).
    pub full: AtomicBool,
    /// Blocks another writer is writing now.
    other_writes: Mutex<HashSet<(VersionKey, u64)>>,
}

impl MemCache {
    pub fn new(block_size: u64) -> Self {
        MemCache {
            block_size,
            blocks: Mutex::default(),
            current: Mutex::default(),
            puts: Mutex::default(),
            refuse_puts: AtomicBool::new(false),
            full: AtomicBool::new(false),
            other_writes: Mutex::default(),
        }
    }

    /// Caches every block of `file` (whose bytes are `data`).
    pub fn fill(&self, file: &FileVersion, data: &[u8]) {
        for (i, chunk) in data.chunks(self.block_size as usize).enumerate() {
            let block = ChecksummedBytes::from_source(Bytes::copy_from_slice(chunk));
            self.put(file, i as u64, &block);
        }
    }

    /// Drops block `index` of `key` (every block if None), as an eviction.
    pub fn drop_blocks(&self, key: &VersionKey, index: Option<u64>) {
        let mut blocks = self.blocks.lock().unwrap();
        blocks.retain(|(k, i), _| k != key || index.is_some_and(|x| x != *i));
    }

    /// The indices of the blocks held for `file`, sorted.
    pub fn stored(&self, file: &FileVersion) -> Vec<u64> {
        let blocks = self.blocks.lock().unwrap();
        let mut v: Vec<u64> = blocks
            .keys()
            .filter(|(k, _)| *k == file.key)
            .map(|(_, i)| *i)
            .collect();
        v.sort();
        v
    }

    /// The writes taken so far: block index and kind ("put", "guest",
    /// "ahead", "ahead guest"), in order.
    pub fn puts(&self) -> Vec<(u64, &'static str)> {
        self.puts.lock().unwrap().clone()
    }

    /// Another writer starts writing block `index` of `file`: until
    /// [`MemCache::end_other_write`], the block is being written and a
    /// write of it gives up.
    pub fn begin_other_write(&self, file: &FileVersion, index: u64) {
        self.other_writes.lock().unwrap().insert((file.key, index));
    }

    /// The other writer of block `index` finishes, storing `block` if any;
    /// whether it was writing.
    pub fn end_other_write(
        &self,
        file: &FileVersion,
        index: u64,
        block: Option<&ChecksummedBytes>,
    ) -> bool {
        let was = self.other_writes.lock().unwrap().remove(&(file.key, index));
        if let Some(block) = block.filter(|_| was) {
            let mut blocks = self.blocks.lock().unwrap();
            blocks.insert((file.key, index), block.clone());
        }
        was
    }

    fn store(
        &self,
        file: &FileVersion,
        index: u64,
        block: &ChecksummedBytes,
        kind: &'static str,
    ) -> bool {
        if self.refuse_puts.load(SeqCst) || self.full.load(SeqCst) {
            return false;
        }
        if self.is_block_being_written(file, index) {
            return false;
        }
        let mut blocks = self.blocks.lock().unwrap();
        blocks.insert((file.key, index), block.clone());
        self.puts.lock().unwrap().push((index, kind));
        true
    }
}

impl BlockStore for MemCache {
    fn get(&self, file: &FileVersion, index: u64) -> Option<ChecksummedBytes> {
        self.blocks.lock().unwrap().get(&(file.key, index)).cloned()
    }
    fn put(&self, file: &FileVersion, index: u64, block: &ChecksummedBytes) -> bool {
        self.store(file, index, block, "put")
    }
    fn put_guest(&self, file: &FileVersion, index: u64, block: &ChecksummedBytes) -> bool {
        self.store(file, index, block, "guest")
    }
    fn put_ahead(
        &self,
        file: &FileVersion,
        index: u64,
        block: &ChecksummedBytes,
        guest: bool,
    ) -> bool {
        let kind = if guest { "ahead guest" } else { "ahead" };
        self.store(file, index, block, kind)
    }
    fn is_block_cached(&self, file: &FileVersion, index: u64) -> bool {
        self.blocks.lock().unwrap().contains_key(&(file.key, index))
    }
    fn is_block_being_written(&self, file: &FileVersion, index: u64) -> bool {
        let writes = self.other_writes.lock().unwrap();
        writes.contains(&(file.key, index))
    }
    fn is_complete(&self, file: &FileVersion) -> bool {
        let blocks = self.blocks.lock().unwrap();
        (0..file.block_count(self.block_size)).all(|i| blocks.contains_key(&(file.key, i)))
    }
    fn note_current(&self, file: &FileVersion) {
        self.current.lock().unwrap().push(file.key);
    }
    fn usage(&self) -> CacheUsage {
        let blocks = self.blocks.lock().unwrap();
        let mut files: Vec<VersionKey> = blocks.keys().map(|(k, _)| *k).collect();
        files.sort();
        files.dedup();
        CacheUsage {
            used_bytes: blocks.values().map(|b| b.data().len() as u64).sum(),
            capacity_bytes: u64::MAX,
            files_cached: files.len() as u64,
            evictions: 0,
            writable: true,
        }
    }
    fn has_room_for(&self, _: &FileVersion) -> bool {
        !self.full.load(SeqCst)
    }
}

/// Any block store behind a gate the test opens: its writes (all kinds),
/// or with [`GatedCache::on_gets`] its reads (a disk read on a saturated
/// disk), wait while the gate is closed; everything else goes straight to
/// the cache inside.
pub struct GatedCache<C = MemCache> {
    pub inner: C,
    gate: Gate,
    gets: bool,
}

impl<C> GatedCache<C> {
    /// A closed gate in front of `inner`'s writes.
    pub fn new(inner: C) -> Self {
        GatedCache {
            inner,
            gate: Gate::new(true),
            gets: false,
        }
    }

    /// A closed gate in front of `inner`'s reads (`get`).
    pub fn on_gets(inner: C) -> Self {
        GatedCache {
            gets: true,
            ..GatedCache::new(inner)
        }
    }

    pub fn open_gate(&self) {
        self.gate.open();
    }

    pub fn close_gate(&self) {
        self.gate.close();
    }

    /// Calls waiting at the gate now.
    pub fn waiting(&self) -> u64 {
        self.gate.waiting()
    }

    fn pass(&self, get: bool) {
        if get == self.gets {
            self.gate.pass();
        }
    }
}

impl<C: BlockStore> BlockStore for GatedCache<C> {
    fn get(&self, file: &FileVersion, index: u64) -> Option<ChecksummedBytes> {
        self.pass(true);
        self.inner.get(file, index)
    }
    fn put(&self, file: &FileVersion, index: u64, block: &ChecksummedBytes) -> bool {
        self.pass(false);
        self.inner.put(file, index, block)
    }
    fn put_guest(&self, file: &FileVersion, index: u64, block: &ChecksummedBytes) -> bool {
        self.pass(false);
        self.inner.put_guest(file, index, block)
    }
    fn put_ahead(
        &self,
        file: &FileVersion,
        index: u64,
        block: &ChecksummedBytes,
        guest: bool,
    ) -> bool {
        self.pass(false);
        self.inner.put_ahead(file, index, block, guest)
    }
    fn is_block_cached(&self, file: &FileVersion, index: u64) -> bool {
        self.inner.is_block_cached(file, index)
    }
    fn is_block_being_written(&self, file: &FileVersion, index: u64) -> bool {
        self.inner.is_block_being_written(file, index)
    }
    fn is_complete(&self, file: &FileVersion) -> bool {
        self.inner.is_complete(file)
    }
    fn note_current(&self, file: &FileVersion) {
        self.inner.note_current(file)
    }
    fn record_access(&self, file: &FileVersion, bytes: u64) {
        self.inner.record_access(file, bytes)
    }
    fn usage(&self) -> CacheUsage {
        self.inner.usage()
    }
    fn has_room_for(&self, file: &FileVersion) -> bool {
        self.inner.has_room_for(file)
    }
}

/// The complete-file side of a [`MemCache`]: counts the pins of each file
/// version as the disk cache keeps them (`open_complete` and `pin_complete`
/// take one, `unpin` gives one back), and calls the dropped-file hook when
/// a test drops a file.
pub struct MemComplete {
    pub cache: Arc<MemCache>,
    pins: Mutex<HashMap<VersionKey, i64>>,
    /// An unpin of a file with no pin (a pin given back twice).
    pub unpin_underflow: AtomicBool,
    hook: Mutex<Option<DroppedHook>>,
}

impl MemComplete {
    pub fn new(cache: Arc<MemCache>) -> Arc<Self> {
        Arc::new(MemComplete {
            cache,
            pins: Mutex::default(),
            unpin_underflow: AtomicBool::new(false),
            hook: Mutex::default(),
        })
    }

    /// Drops a file from the cache (evicted), telling the hook.
    pub fn drop_file(&self, key: &VersionKey) {
        self.cache.drop_blocks(key, None);
        if let Some(hook) = &*self.hook.lock().unwrap() {
            hook(key);
        }
    }

    pub fn pins(&self, key: &VersionKey) -> i64 {
        self.pins.lock().unwrap().get(key).copied().unwrap_or(0)
    }

    /// Pins of every version together.
    pub fn all_pins(&self) -> i64 {
        self.pins.lock().unwrap().values().sum()
    }
}

impl CompleteFiles for MemComplete {
    fn open_complete(&self, file: &FileVersion) -> Option<File> {
        // Any open file will do: the fake kernel never reads it.
        let f = File::open("/dev/null").ok()?;
        self.pin_complete(file).then_some(f)
    }
    fn pin_complete(&self, file: &FileVersion) -> bool {
        let whole = self.cache.is_complete(file);
        if whole {
            *self.pins.lock().unwrap().entry(file.key).or_default() += 1;
        }
        whole
    }
    fn unpin(&self, file: &FileVersion) {
        let mut pins = self.pins.lock().unwrap();
        let n = pins.entry(file.key).or_default();
        if *n == 0 {
            self.unpin_underflow.store(true, SeqCst);
        } else {
            *n -= 1;
        }
    }
    fn on_file_dropped(&self, hook: DroppedHook) {
        *self.hook.lock().unwrap() = Some(hook);
    }
}
