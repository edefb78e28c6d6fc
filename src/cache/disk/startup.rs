//! Start-up of the disk cache: the books from the index (`recover.rs`: a
//! snapshot and a journal, replayed straight into the dense table), or, for a
//! cache without one (an older locafs), from a scan of every file's meta,
//! converted once; the checkpoints that fold the journal into a snapshot;
//! and the sweep of files no entry owns after a crash.
//!
//! Must never: count a block present that the index or its meta does not
//! vouch for (every block is still verified when first served), or delete a
//! file that an entry owns or a writer is creating.

use std::io;

use super::books::{index_puts, Books};
use super::format::BLOCK_SIZE_CHANGED;
use crate::cache::recover;

use super::{
    debug, info, new_books, warn, Core, Entry, Op, Ordering, Path, PrivateDir, Slot, State, Tier,
    VersionKey, CREATED, INLINE_LEN, MAX_BLOCKS, META_IN_XATTR, META_ON_GUEST, META_XATTR,
};

/// What the cache found in its directory at start-up.
#[derive(Debug, Default)]
pub struct Recovery {
    pub files: u64,
    pub blocks: u64,
    pub bytes: u64,
    pub discarded: u64,
    /// Entries written with another --block-size (discarded).
    pub other_block_size: u64,
    pub evicted: u64,
    /// Read from the index (snapshot and journal) rather than by scanning
    /// every cache file's meta.
    pub from_index: bool,
    /// Records replayed from the journal.
    pub journal_records: u64,
    /// Bytes of a torn journal tail cut off.
    pub torn_bytes: u64,
}

impl Core {
    pub(super) fn recover(&self) -> io::Result<Recovery> {
        let mut rec = Recovery::default();
        let mut st = self.state.lock();
        // Replayed straight into the books (no second table to copy from),
        // reserved at once to the snapshot's size (no rehash while filling).
        let found = &mut st.books;
        let loaded = recover::Index::load_with(&self.dir, self.block_size, |l| match l {
            recover::Loading::Count(n) => found.reserve(n.min(1 << 28) as usize),
            recover::Loading::Op(op) => self.replay(found, op),
        })
        .unwrap_or_else(|e| {
            warn!("cache: the index cannot be read ({e}); scanning the cache directory");
            None
        });
        match loaded {
            Some((index, l)) => {
                rec.from_index = true;
                rec.journal_records = l.journal_records;
                rec.torn_bytes = l.torn_bytes;
                if l.torn_bytes > 0 {
                    info!(
                        "cache: the index journal ended in {} bytes of a torn record (a crash); cut off",
                        l.torn_bytes
                    );
                }
                let st = &mut *st;
                let mut gens = st.gens;
                st.books.retain(|_, e| {
                    e.recount();
                    if e.present() == 0 {
                        return false;
                    }
                    let meta_on_guest = e.blocks.iter().all(|b| b.slot != Slot::Present || b.guest);
                    e.set_bit(META_ON_GUEST, meta_on_guest);
                    gens = gens.wrapping_add(1);
                    e.gen = gens;
                    true
                });
                st.gens = gens;
                let State {
                    books,
                    files_complete,
                    ..
                } = st;
                books.book_all(|_, e| self.book_parts(e, files_complete, &mut rec));
                // (Reserved per block: a cache of large files holds fewer
                // entries than records.)
                books.shrink_to_fit();
                st.index = Some(index);
            }
            None => {
                // (What a failed load replayed is dropped: scanned again.)
                let cap = st.books.capacity();
                st.books = new_books(cap, self.block_size);
                self.scan(&mut st, &mut rec);
                if rec.files + rec.discarded > 0 {
                    info!(
                        "cache: no index (a cache of an older locafs): read the meta of {} files once and wrote the index",
                        rec.files + rec.discarded
                    );
                }
                let puts = index_puts(&st.books);
                st.index = match recover::Index::create(&self.dir, self.block_size, puts) {
                    Ok(ix) => Some(ix),
                    Err(e) => {
                        warn!("cache: the index cannot be written ({e}); the next start-up scans the cache directory");
                        None
                    }
                };
            }
        }
        let victims = st.books.shrink_to_capacity();
        rec.evicted = victims.len() as u64;
        let work = self.plan_evictions(&mut st, victims);
        drop(st);
        self.evict(work);
        Ok(rec)
    }

    /// Applies one index record to the entries being recovered.
    pub(super) fn replay(&self, found: &mut Books, op: Op) {
        match op {
            Op::Put(p) => {
                let n = p.size.div_ceil(self.block_size);
                if p.index as u64 >= n || n > MAX_BLOCKS {
                    return;
                }
                let e = found.get_or_insert_with(p.key, || {
                    Entry::new(p.size, n, p.table as u64, CREATED, 0)
                });
                if e.size() != p.size {
                    return;
                }
                // (A one-block file keeps no checksum in the books: its
                // record's is not read.)
                e.set_present(p.index as usize, p.sum);
                e.blocks[p.index as usize].guest = p.guest;
                e.set_bit(META_IN_XATTR, p.meta_in_xattr);
                e.table = p.table;
            }
            Op::DropBlock { key, index } => {
                if let Some(e) = found.get_mut(&key) {
                    e.set_slot(index as usize, Slot::Empty);
                }
            }
            Op::DropFile { key } => {
                found.remove(&key);
            }
        }
    }

    /// Takes a recovered entry onto the books.
    pub(super) fn book(
        &self,
        st: &mut State,
        key: VersionKey,
        mut entry: Entry,
        rec: &mut Recovery,
    ) {
        entry.gen = st.next_gen();
        let parts = self.book_parts(&entry, &mut st.files_complete, rec);
        st.books.get_or_insert_with(key, || entry);
        for (b, tier) in parts.into_iter().zip([Tier::Own, Tier::Guest]) {
            if let Some(b) = b {
                st.books.add(&key, b, tier);
            }
        }
    }

    /// The parts a recovered entry is booked as (own, guest: None if it has
    /// no such part), counted in `rec` and `files_complete`.
    pub(super) fn book_parts(
        &self,
        entry: &Entry,
        files_complete: &mut u64,
        rec: &mut Recovery,
    ) -> [Option<u64>; 2] {
        let own = self.part_bytes(entry, false);
        let guest = self.part_bytes(entry, true);
        rec.files += 1;
        rec.blocks += entry.present() as u64;
        rec.bytes += own + guest;
        if entry.complete() {
            *files_complete += 1;
        }
        let meta_on_guest = entry.meta_on_guest();
        [
            (!meta_on_guest || own > 0).then_some(own),
            (meta_on_guest || guest > 0).then_some(guest),
        ]
    }

    /// Folds the journal into a new snapshot: encoded in memory under the
    /// state lock (appends move to a new journal at the same moment),
    /// written, synced and installed outside it. One at a time; a failure leaves the old
    /// snapshot and both journals, which start-up replays. Whether a
    /// checkpoint was installed (not if another was being written, or the
    /// cache keeps no index).
    pub(super) fn checkpoint(&self) -> bool {
        if self.checkpointing.swap(true, Ordering::AcqRel) {
            return false;
        }
        let pending = {
            let mut st = self.state.lock();
            let State { books, index, .. } = &mut *st;
            index
                .as_mut()
                .map(|ix| ix.begin_checkpoint(index_puts(books)))
        };
        let installed = match pending {
            Some(Ok(p)) => match p.install() {
                Ok(()) => true,
                Err(e) => {
                    warn!("cache: installing an index checkpoint failed ({e})");
                    false
                }
            },
            Some(Err(e)) => {
                warn!("cache: writing an index checkpoint failed ({e})");
                false
            }
            None => false,
        };
        self.checkpointing.store(false, Ordering::Release);
        installed
    }

    /// Deletes the files of the cache directory that no entry owns (left
    /// by a crash between a block's data and its journal record, or whose
    /// records a torn journal lost); returns how many. Each directory's
    /// names are checked and unlinked under the state lock, and a writer
    /// books its entry before it creates its files, so a file being written
    /// is never taken for an orphan.
    pub fn sweep_orphans(&self) -> u64 {
        let mut n = 0;
        for i in 0..256 {
            if self.closed.load(Ordering::Relaxed) {
                break;
            }
            let Some(d) = self.fan_for_walk(i) else {
                continue;
            };
            let Ok(rd) = d.entries("") else { continue };
            let names: Vec<std::ffi::OsString> = rd.into_iter().map(|e| e.name).collect();
            let st = self.state.lock();
            for name in names {
                if self.closed.load(Ordering::Relaxed) {
                    break;
                }
                let p = Path::new(&name);
                let owned = matches!(
                    p.extension().and_then(|e| e.to_str()),
                    Some("data" | "meta")
                ) && p
                    .file_stem()
                    .and_then(|s| s.to_str())
                    .and_then(VersionKey::from_hex)
                    .is_some_and(|k| st.books.contains(&k));
                if !owned && d.remove_file(&name).is_ok() {
                    n += 1;
                }
            }
        }
        // Gone through every directory: no orphan is left.
        if !self.closed.load(Ordering::Relaxed) {
            self.orphans_possible.store(false, Ordering::Relaxed);
        }
        n
    }

    /// Reads every cache file's meta (a cache without an index).
    pub(super) fn scan(&self, st: &mut State, rec: &mut Recovery) {
        for i in 0..256 {
            let Some(d) = self.fan_for_walk(i) else {
                continue;
            };
            let Ok(rd) = d.entries("") else { continue };
            for ent in rd {
                let p = Path::new(&ent.name);
                let data = p.with_extension("data");
                let loaded = match p.extension().and_then(|e| e.to_str()) {
                    Some("meta") => self.load_meta(&d, p),
                    Some("data") => {
                        if d.exists(p.with_extension("meta")) {
                            continue; // loaded with its .meta
                        }
                        // A one-block file keeps its meta in an xattr; a
                        // data file with neither is discarded below.
                        let mut raw = [0u8; INLINE_LEN];
                        match d
                            .open_read(p)
                            .and_then(|f| crate::sys::fgetxattr(&f, META_XATTR, &mut raw))
                        {
                            Ok(n) => Ok(self.parse_inline(p, &raw[..n])),
                            Err(_) => Ok(None),
                        }
                    }
                    _ => {
                        let _ = d.remove_file(p);
                        rec.discarded += 1;
                        continue;
                    }
                };
                match loaded {
                    Ok(Some((key, entry))) => self.book(st, key, entry, rec),
                    Err(e) if e.to_string() == BLOCK_SIZE_CHANGED => {
                        let _ = d.remove_file(p);
                        let _ = d.remove_file(&data);
                        rec.discarded += 1;
                        rec.other_block_size += 1;
                    }
                    Ok(None) | Err(_) => {
                        debug!(meta = %d.display(p).display(), "discarding unreadable cache entry");
                        let _ = d.remove_file(p);
                        let _ = d.remove_file(&data);
                        rec.discarded += 1;
                    }
                }
            }
        }
    }

    /// Reads one .meta file (`p`, in fan-out directory `d`); Ok(None) if it
    /// is not a valid entry of this cache or its data file is gone.
    pub(super) fn load_meta(
        &self,
        d: &PrivateDir,
        p: &Path,
    ) -> io::Result<Option<(VersionKey, Entry)>> {
        let raw = d.read(p)?;
        let loaded = self.parse_meta(&raw)?;
        if loaded.is_some() && !d.exists(p.with_extension("data")) {
            return Ok(None);
        }
        Ok(loaded)
    }
}
