//! The cache index on disk, so that start-up reads two files instead of
//! every cached file's meta: a snapshot of every cached block
//! (`index/snapshot`) and an append-only journal of what changed since
//! (`index/journal.<gen>`), checkpointed into a new snapshot when the journal
//! grows past twice the live records.
//!
//! Records are 64 bytes, little endian, each with its own check (xxh3-64 of
//! its first 56 bytes, seeded with the file's generation), so that replay
//! stops at the first torn or foreign record. A record never makes a block
//! count as present before its data is on disk: the cache appends a `Put`
//! after the block's data and its meta are written, and a `DropBlock` or
//! `DropFile` before it deletes anything. No record is synced: after a
//! `kill -9` every appended record is in the page cache; after a power
//! loss the journal may be cut anywhere (replay keeps a prefix) or hold
//! records whose data never reached the disk, and every block is verified
//! against its checksum when it is first served (a whole file before its
//! first passthrough open), so either way it is a miss, never a wrong byte.
//! A checkpoint encodes the new snapshot in memory under the caller's lock
//! (64 bytes per cached block, while appends move to a new journal), then
//! writes it beside the old one, syncs it,
//! renames it over, syncs the directory, and only then deletes the journals
//! it replaces; until the rename, the old snapshot and both journals are
//! replayed.
//!
//! Pure encoding and decoding plus the files: no knowledge of the cache's
//! in-memory state (the caller applies the [`Op`]s). Nothing here panics on
//! bad bytes. The files are reached through the data set directory's
//! checked handle (`private_dir`): no symlink is followed, and they are
//! created owner-only.

use std::fs::File;
use std::io::{self, BufReader, Read, Write};
use std::path::{Path, PathBuf};

use bytes::{Buf, BufMut};
use rustix::fs::OFlags;

use super::{Checksum, VersionKey};
use crate::sys::private_dir::PrivateDir;

/// Bytes of one record, and of a file's header.
pub const REC: usize = 64;
const SNAP_MAGIC: &[u8; 8] = b"LOCAFSS1";
const JOURNAL_MAGIC: &[u8; 8] = b"LOCAFSJ1";
/// 2 since 2026-12-02: the version keys' first 4 bytes are their path
/// part (`VersionKey`). An index of format 1 holds keys nothing asks for
/// any more: it is not read, and start-up scans the cache directory
/// instead, which discards the files of such keys.
const FORMAT: u32 = 2;
const PUT: u8 = 1;
const DROP_BLOCK: u8 = 2;
const DROP_FILE: u8 = 3;
const F_GUEST: u8 = 1;
const F_XATTR: u8 = 2;

/// A block of a file version is cached (its data and meta are on disk).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Put {
    pub key: VersionKey,
    pub index: u32,
    /// The source file's size.
    pub size: u64,
    pub path_hash: u64,
    pub sum: Checksum,
    /// Owned by another node.
    pub guest: bool,
    /// The file's meta is its data file's xattr (one block), not a `.meta`.
    pub meta_in_xattr: bool,
    /// Offset of the slot table in the `.meta` file.
    pub table: u16,
}

/// One change of the cache's contents.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Put(Put),
    DropBlock { key: VersionKey, index: u32 },
    DropFile { key: VersionKey },
}

fn check(body: &[u8], gen: u64) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(body, gen)
}

/// A record's bytes: kind, flags, table (2), block index (4), key (16),
/// size (8), path hash (8), checksum (16), check (8).
pub fn encode(op: &Op, gen: u64) -> [u8; REC] {
    let (kind, p) = match *op {
        Op::Put(p) => (PUT, p),
        Op::DropBlock { key, index } => (
            DROP_BLOCK,
            Put {
                key,
                index,
                size: 0,
                path_hash: 0,
                sum: [0; 16],
                guest: false,
                meta_in_xattr: false,
                table: 0,
            },
        ),
        Op::DropFile { key } => (
            DROP_FILE,
            Put {
                key,
                index: 0,
                size: 0,
                path_hash: 0,
                sum: [0; 16],
                guest: false,
                meta_in_xattr: false,
                table: 0,
            },
        ),
    };
    let mut out = [0u8; REC];
    let mut w = &mut out[..];
    w.put_u8(kind);
    w.put_u8((u8::from(p.guest) * F_GUEST) | (u8::from(p.meta_in_xattr) * F_XATTR));
    w.put_u16_le(p.table);
    w.put_u32_le(p.index);
    w.put_slice(&p.key.0);
    w.put_u64_le(p.size);
    w.put_u64_le(p.path_hash);
    w.put_slice(&p.sum);
    let c = check(&out[..REC - 8], gen);
    out[REC - 8..].copy_from_slice(&c.to_le_bytes());
    out
}

/// The record in `b`, if it is whole, of generation `gen` and of a known
/// kind with known flags; every record accepted encodes back to the same
/// bytes (the fuzz target `cache_index` checks both).
pub fn decode(b: &[u8], gen: u64) -> Option<Op> {
    let b = b.get(..REC)?;
    let mut c = &b[REC - 8..];
    if c.get_u64_le() != check(&b[..REC - 8], gen) {
        return None;
    }
    let mut r = b;
    let kind = r.get_u8();
    let flags = r.get_u8();
    if flags & !(F_GUEST | F_XATTR) != 0 {
        return None;
    }
    let table = r.get_u16_le();
    let index = r.get_u32_le();
    let mut key = [0u8; 16];
    r.copy_to_slice(&mut key);
    let key = VersionKey(key);
    let size = r.get_u64_le();
    let path_hash = r.get_u64_le();
    let mut sum = [0u8; 16];
    r.copy_to_slice(&mut sum);
    match kind {
        PUT => Some(Op::Put(Put {
            key,
            index,
            size,
            path_hash,
            sum,
            guest: flags & F_GUEST != 0,
            meta_in_xattr: flags & F_XATTR != 0,
            table,
        })),
        // A drop carries nothing else: anything there is not one of ours
        // (so that every record accepted encodes back to its bytes).
        _ if flags != 0 || table != 0 || size != 0 || path_hash != 0 || sum != [0; 16] => None,
        DROP_BLOCK => Some(Op::DropBlock { key, index }),
        DROP_FILE if index == 0 => Some(Op::DropFile { key }),
        _ => None,
    }
}

/// A file's header: magic, format, block size, generation, record count
/// (snapshots; 0 in a journal), zeros, check.
pub fn header(magic: &[u8; 8], block_size: u64, gen: u64, count: u64) -> [u8; REC] {
    let mut out = [0u8; REC];
    let mut w = &mut out[..];
    w.put_slice(magic);
    w.put_u32_le(FORMAT);
    w.put_u32_le(block_size as u32);
    w.put_u64_le(gen);
    w.put_u64_le(count);
    let c = check(&out[..REC - 8], 0);
    out[REC - 8..].copy_from_slice(&c.to_le_bytes());
    out
}

/// (generation, count) of a header of this magic and block size.
pub fn parse_header(b: &[u8], magic: &[u8; 8], block_size: u64) -> Option<(u64, u64)> {
    let b = b.get(..REC)?;
    let mut c = &b[REC - 8..];
    if c.get_u64_le() != check(&b[..REC - 8], 0)
        || &b[..8] != magic
        || b[32..REC - 8].iter().any(|x| *x != 0)
    {
        return None;
    }
    let mut r = &b[8..];
    if r.get_u32_le() != FORMAT || r.get_u32_le() as u64 != block_size {
        return None;
    }
    Some((r.get_u64_le(), r.get_u64_le()))
}

/// The index's directory's name in a data set's directory.
const INDEX_DIR: &str = "index";

/// Where the index lives in a cache directory.
pub fn index_dir(cache_dir: &Path) -> PathBuf {
    cache_dir.join(INDEX_DIR)
}

/// Left in the index directory by a clean shutdown, once its last
/// checkpoint is installed and no file outside the index can be on disk:
/// the next start-up takes it away (before anything is written) and needs
/// no sweep of the block directories for orphans (a walk of every cached
/// file's name: seconds at millions of files, beside the first epoch).
const CLEAN: &str = "clean";

/// Marks the cache as shut down cleanly (see [`take_clean`]).
pub fn mark_clean(cache_dir: &PrivateDir) -> io::Result<()> {
    let dir = cache_dir.subdir(INDEX_DIR, false)?;
    dir.create_file(CLEAN)?.sync_all()?;
    dir.sync()
}

/// Whether the last shutdown was clean (the mark is taken away, durably,
/// so that a crash from now on leaves none). A mark that cannot be taken
/// away counts as absent.
pub fn take_clean(cache_dir: &PrivateDir) -> bool {
    let Ok(dir) = cache_dir.subdir(INDEX_DIR, false) else {
        return false;
    };
    if dir.remove_file(CLEAN).is_err() {
        return false;
    }
    dir.sync().is_ok()
}

const SNAPSHOT: &str = "snapshot";

fn journal_name(gen: u64) -> String {
    format!("journal.{gen}")
}

/// The generations of the journals in `dir`, ascending.
fn journal_gens(dir: &PrivateDir) -> Vec<u64> {
    let mut gens: Vec<u64> = dir
        .entries("")
        .into_iter()
        .flatten()
        .filter_map(|e| e.name.to_str()?.strip_prefix("journal.")?.parse().ok())
        .collect();
    gens.sort_unstable();
    gens
}

/// What [`Index::load`] read.
#[derive(Debug, Default, Clone, Copy)]
pub struct Loaded {
    pub snapshot_records: u64,
    pub journal_records: u64,
    /// Bytes cut off the newest journal (a torn or garbled tail).
    pub torn_bytes: u64,
}

/// What [`Index::load_with`] hands its caller.
pub enum Loading {
    /// The number of records in the snapshot (before them).
    Count(u64),
    /// One record, in order.
    Op(Op),
}

/// The open index: appends go to the newest journal.
#[derive(Debug)]
pub struct Index {
    dir: PrivateDir,
    block_size: u64,
    gen: u64,
    journal: File,
    /// Records in the journal (replayed or appended).
    records: u64,
    /// Records in the snapshot.
    snapshot_records: u64,
    /// An append failed: warned once; the next checkpoint starts afresh.
    failed: bool,
}

/// A checkpoint whose snapshot is written but not yet installed (see
/// [`Index::begin_checkpoint`]).
pub struct Pending {
    dir: PrivateDir,
    /// The whole snapshot, encoded (64 bytes per cached block): made under
    /// the caller's lock, written outside it.
    bytes: Vec<u8>,
    gen: u64,
}

impl Index {
    /// Reads the snapshot and replays the journals after it, in order,
    /// handing each record to `apply`. None if there is no usable index (no
    /// snapshot, or a damaged one, or another block size): the caller then
    /// scans the cache directory (and may have been handed records already:
    /// it starts again from nothing). A journal is replayed up to its first
    /// bad record, and the newest one is cut there (it is appended to next).
    pub fn load(
        cache_dir: &PrivateDir,
        block_size: u64,
        mut apply: impl FnMut(Op),
    ) -> io::Result<Option<(Index, Loaded)>> {
        Self::load_with(cache_dir, block_size, |l| {
            if let Loading::Op(op) = l {
                apply(op)
            }
        })
    }

    /// [`Index::load`], telling `apply` first how many records the snapshot
    /// holds (so that the caller can size its tables once).
    pub fn load_with(
        cache_dir: &PrivateDir,
        block_size: u64,
        mut apply: impl FnMut(Loading),
    ) -> io::Result<Option<(Index, Loaded)>> {
        let dir = match cache_dir.subdir(INDEX_DIR, false) {
            Ok(d) => d,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut loaded = Loaded::default();
        let f = match dir.open_read(SNAPSHOT) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut r = BufReader::with_capacity(1 << 20, f);
        let mut buf = [0u8; REC];
        if r.read_exact(&mut buf).is_err() {
            return Ok(None);
        }
        let Some((snap_gen, count)) = parse_header(&buf, SNAP_MAGIC, block_size) else {
            return Ok(None);
        };
        apply(Loading::Count(count));
        for _ in 0..count {
            if r.read_exact(&mut buf).is_err() {
                return Ok(None);
            }
            match decode(&buf, snap_gen) {
                Some(op) => apply(Loading::Op(op)),
                None => return Ok(None),
            }
        }
        loaded.snapshot_records = count;
        let mut gen = snap_gen;
        let mut last: Option<(u64, u64)> = None; // (gen, good length)
        for g in journal_gens(&dir).into_iter().filter(|g| *g >= snap_gen) {
            if g != gen {
                // A journal missing in between: what follows is not replayed.
                break;
            }
            let Ok(f) = dir.open_read(journal_name(g)) else {
                break;
            };
            let mut r = BufReader::with_capacity(1 << 20, f);
            if r.read_exact(&mut buf).is_err()
                || parse_header(&buf, JOURNAL_MAGIC, block_size).map(|h| h.0) != Some(g)
            {
                break;
            }
            let mut good = REC as u64;
            let mut n = 0;
            while r.read_exact(&mut buf).is_ok() {
                let Some(op) = decode(&buf, g) else { break };
                apply(Loading::Op(op));
                good += REC as u64;
                n += 1;
            }
            loaded.journal_records += n;
            last = Some((g, good));
            gen = g + 1;
        }
        let (gen, journal) = match last {
            Some((g, good)) => {
                let p = journal_name(g);
                let f = dir.open_file(&p, OFlags::RDWR)?;
                let len = f.metadata()?.len();
                if len > good {
                    loaded.torn_bytes = len - good;
                    f.set_len(good)?;
                }
                drop(f);
                (g, dir.open_file(&p, OFlags::WRONLY | OFlags::APPEND)?)
            }
            None => (snap_gen, new_journal(&dir, block_size, snap_gen)?),
        };
        // Journals past a gap are not replayed, and must not be later.
        for g in journal_gens(&dir).into_iter().filter(|x| *x > gen) {
            let _ = dir.remove_file(journal_name(g));
        }
        Ok(Some((
            Index {
                dir,
                block_size,
                gen,
                journal,
                records: loaded.journal_records,
                snapshot_records: count,
                failed: false,
            },
            loaded,
        )))
    }

    /// A new index holding exactly `puts` (a converted or fresh cache):
    /// written, synced and installed before this returns.
    pub fn create(
        cache_dir: &PrivateDir,
        block_size: u64,
        puts: impl Iterator<Item = Put>,
    ) -> io::Result<Index> {
        let dir = cache_dir.subdir(INDEX_DIR, true)?;
        let gen = journal_gens(&dir).last().map_or(1, |g| g + 1);
        let (bytes, n) = encode_snapshot(block_size, gen, puts);
        let journal = new_journal(&dir, block_size, gen)?;
        let pending = Pending {
            dir: dir.clone(),
            bytes,
            gen,
        };
        pending.install()?;
        Ok(Index {
            dir,
            block_size,
            gen,
            journal,
            records: 0,
            snapshot_records: n,
            failed: false,
        })
    }

    /// Appends one record (best effort: a failed append is warned about
    /// once; the record is lost, which replay tolerates).
    pub fn append(&mut self, op: &Op) {
        let rec = encode(op, self.gen);
        if let Err(e) = self.journal.write_all(&rec) {
            if !self.failed {
                tracing::warn!("cache: appending to the index journal failed ({e}); a restart may lose some cached blocks");
            }
            self.failed = true;
        }
        self.records += 1;
    }

    /// Whether the journal has grown enough that a checkpoint pays: more
    /// records than twice the last snapshot's (and a floor), so that the
    /// snapshots written cost a constant factor of the records appended.
    pub fn checkpoint_due(&self) -> bool {
        self.records > (2 * self.snapshot_records).max(1 << 16) || (self.failed && self.records > 0)
    }

    /// Bytes of the index files (snapshot and journal), about.
    pub fn bytes(&self) -> u64 {
        (self.snapshot_records + self.records + 2) * REC as u64
    }

    /// First half of a checkpoint, under the caller's lock: encodes the
    /// new snapshot in memory (no I/O but the new journal's creation) and
    /// moves appends to a new journal. The caller then releases its lock
    /// and calls [`Pending::install`], which writes it.
    pub fn begin_checkpoint(&mut self, puts: impl Iterator<Item = Put>) -> io::Result<Pending> {
        let gen = self.gen + 1;
        let (bytes, n) = encode_snapshot(self.block_size, gen, puts);
        let journal = new_journal(&self.dir, self.block_size, gen)?;
        self.journal = journal;
        self.gen = gen;
        self.records = 0;
        self.snapshot_records = n;
        self.failed = false;
        Ok(Pending {
            dir: self.dir.clone(),
            bytes,
            gen,
        })
    }
}

impl Pending {
    /// Second half of a checkpoint, outside the caller's lock: writes the
    /// snapshot beside the old one, syncs it, renames it over, syncs the
    /// directory, then deletes the journals it replaces.
    pub fn install(self) -> io::Result<()> {
        let tmp = "snapshot.tmp";
        let mut f = self.dir.create_file(tmp)?;
        f.write_all(&self.bytes)?;
        f.sync_all()?;
        drop(f);
        self.dir.rename(tmp, SNAPSHOT)?;
        self.dir.sync()?;
        for g in journal_gens(&self.dir)
            .into_iter()
            .filter(|g| *g < self.gen)
        {
            let _ = self.dir.remove_file(journal_name(g));
        }
        Ok(())
    }
}

fn new_journal(dir: &PrivateDir, block_size: u64, gen: u64) -> io::Result<File> {
    let p = journal_name(gen);
    let mut f = dir.create_file(&p)?;
    f.write_all(&header(JOURNAL_MAGIC, block_size, gen, 0))?;
    drop(f);
    dir.open_file(&p, OFlags::WRONLY | OFlags::APPEND)
}

/// A snapshot of generation `gen` holding `puts`, and its record count.
fn encode_snapshot(block_size: u64, gen: u64, puts: impl Iterator<Item = Put>) -> (Vec<u8>, u64) {
    let mut out = vec![0u8; REC];
    let mut n = 0u64;
    for p in puts {
        out.extend_from_slice(&encode(&Op::Put(p), gen));
        n += 1;
    }
    out[..REC].copy_from_slice(&header(SNAP_MAGIC, block_size, gen, n));
    (out, n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(k: u8, index: u32) -> Put {
        Put {
            key: VersionKey([k; 16]),
            index,
            size: 1000 + k as u64,
            path_hash: 77,
            sum: [k ^ 0x5a; 16],
            guest: k % 2 == 1,
            meta_in_xattr: k % 3 == 0,
            table: 128,
        }
    }

    #[test]
    fn records_round_trip_and_refuse_any_flipped_bit() {
        for op in [
            Op::Put(put(3, 9)),
            Op::Put(put(4, 0)),
            Op::DropBlock {
                key: VersionKey([1; 16]),
                index: 7,
            },
            Op::DropFile {
                key: VersionKey([2; 16]),
            },
        ] {
            let b = encode(&op, 5);
            assert_eq!(decode(&b, 5), Some(op));
            assert_eq!(decode(&b, 6), None, "another generation's record");
            assert_eq!(decode(&b[..REC - 1], 5), None, "a torn record");
            for bit in 0..REC * 8 {
                let mut c = b;
                c[bit / 8] ^= 1 << (bit % 8);
                assert_eq!(decode(&c, 5), None, "bit {bit}");
            }
        }
        let h = header(SNAP_MAGIC, 4096, 3, 12);
        assert_eq!(parse_header(&h, SNAP_MAGIC, 4096), Some((3, 12)));
        assert_eq!(parse_header(&h, SNAP_MAGIC, 8192), None);
        assert_eq!(parse_header(&h, JOURNAL_MAGIC, 4096), None);
    }

    fn load(dir: &PrivateDir) -> Option<(Index, Vec<Op>)> {
        let mut ops = Vec::new();
        Index::load(dir, 4096, |op| ops.push(op))
            .unwrap()
            .map(|(i, _)| (i, ops))
    }

    #[test]
    fn snapshot_journal_checkpoint_and_a_torn_tail() {
        let tmp = tempfile::tempdir().unwrap();
        let d = PrivateDir::open(tmp.path()).unwrap();
        assert!(load(&d).is_none(), "no index yet");
        let mut ix = Index::create(&d, 4096, [put(1, 0)].into_iter()).unwrap();
        ix.append(&Op::Put(put(2, 0)));
        ix.append(&Op::DropFile {
            key: VersionKey([1; 16]),
        });
        drop(ix);
        let (mut ix, ops) = load(&d).unwrap();
        assert_eq!(
            ops,
            vec![
                Op::Put(put(1, 0)),
                Op::Put(put(2, 0)),
                Op::DropFile {
                    key: VersionKey([1; 16])
                }
            ]
        );
        // A checkpoint interrupted before its install: both journals are
        // replayed over the old snapshot.
        let pending = ix.begin_checkpoint([put(2, 0)].into_iter()).unwrap();
        ix.append(&Op::Put(put(3, 1)));
        drop(ix);
        let (_, ops) = load(&d).unwrap();
        assert_eq!(ops.len(), 4);
        assert_eq!(ops[3], Op::Put(put(3, 1)));
        // Installed: the new snapshot and the new journal only.
        pending.install().unwrap();
        let (ix, ops) = load(&d).unwrap();
        assert_eq!(ops, vec![Op::Put(put(2, 0)), Op::Put(put(3, 1))]);
        drop(ix);
        // A torn tail is cut off, and appends go on after the good part.
        let j = journal_gens(&d.subdir(INDEX_DIR, false).unwrap());
        assert_eq!(j.len(), 1);
        let p = index_dir(tmp.path()).join(journal_name(j[0]));
        let mut f = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
        f.write_all(&encode(&Op::Put(put(4, 0)), j[0])[..40])
            .unwrap();
        drop(f);
        let (mut ix, ops) = load(&d).unwrap();
        assert_eq!(ops.len(), 2);
        ix.append(&Op::Put(put(5, 0)));
        drop(ix);
        let (_, ops) = load(&d).unwrap();
        assert_eq!(ops.last(), Some(&Op::Put(put(5, 0))));
        // A damaged snapshot: no index (the caller scans).
        let s = index_dir(tmp.path()).join(SNAPSHOT);
        let mut b = std::fs::read(&s).unwrap();
        b[REC + 3] ^= 1;
        std::fs::write(&s, b).unwrap();
        assert!(load(&d).is_none());
    }
}
