//! The local cache subsystem: blocks on disk and the policy that keeps
//! them (this file, `disk`, `policy`, `recover`, `record_index`), the
//! queue that writes fetched blocks off the reply path (`writeback`), the
//! budget that data sets sharing a cache directory book (`budget`), and the
//! one-mount-per-directory lock (`lock`).
//!
//! The local block cache: what a block is, how it is named and checksummed,
//! and its two seams: [`BlockStore`], the blocks the read path gets and
//! puts, and [`CompleteFiles`], whole cached files the open path hands to
//! the kernel (passthrough). `disk` keeps blocks on local disk across
//! restarts and is both; `policy` decides what stays.
//!
//! Nothing here may serve a byte whose checksum was not verified, and nothing
//! here may fail a read: a cache fault is logged, counted and reported as a
//! miss, so the caller falls back to the source.

pub mod budget;
pub mod disk;
pub mod lock;
pub mod policy;
pub mod record_index;
pub mod recover;
pub mod writeback;

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;

use crate::source::SourceVersion;

/// The identity of one version of one file: 4 bytes of a hash of its path
/// (the path part: every version of a path has the same), then 12 bytes of
/// a hash of its path and [`SourceVersion`]. Cached bytes belong to a key,
/// never to a bare path.
///
/// Two versions share a key only if their paths share the 32 bits of the
/// path part and the 96 bits of the rest collide: 2^-128 for two paths,
/// 2^-96 for two versions of one path.
///
/// The cache's books hash a key by its path part only
/// (`policy::BookKey`), so that every version of a path falls in one probe
/// sequence: one table finds a key and a path's other versions (a second
/// table by path cost 10.5 bytes per cached file: docs/cache.md). Since
/// 2026-12-02 (issue 14); before, the key was 16 bytes of one hash and the
/// cache kept the path hash beside it. Everywhere else (`Hash`) it hashes
/// whole, so that many versions of one path cost no more than many paths.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VersionKey(pub [u8; 16]);

impl policy::BookKey for VersionKey {
    fn book_part(&self) -> u32 {
        self.path_part()
    }
}

impl VersionKey {
    pub fn new(rel: &Path, v: &SourceVersion) -> Self {
        use std::os::unix::ffi::OsStrExt;
        let path = rel.as_os_str().as_bytes();
        let mut h = blake3::Hasher::new();
        h.update(b"locafs version v2\0");
        h.update(&(path.len() as u64).to_le_bytes());
        h.update(path);
        h.update(&v.size.to_le_bytes());
        h.update(&v.mtime_ns.to_le_bytes());
        h.update(&v.ino.to_le_bytes());
        let mut k = [0u8; 16];
        k[..4].copy_from_slice(&Self::path_part_of(rel).to_le_bytes());
        k[4..].copy_from_slice(&h.finalize().as_bytes()[..12]);
        VersionKey(k)
    }

    /// The path part of the keys of `rel`'s versions: the low 32 bits
    /// (little endian) of blake3 of the path.
    pub fn path_part_of(rel: &Path) -> u32 {
        use std::os::unix::ffi::OsStrExt;
        let h = blake3::hash(rel.as_os_str().as_bytes());
        u32::from_le_bytes(h.as_bytes()[..4].try_into().expect("4 bytes"))
    }

    /// This key's path part (the same for every version of its path).
    pub fn path_part(&self) -> u32 {
        u32::from_le_bytes([self.0[0], self.0[1], self.0[2], self.0[3]])
    }

    /// The key whose [`Self::hex`] is `s`; None if `s` is not one.
    pub fn from_hex(s: &str) -> Option<Self> {
        let b = s.as_bytes();
        if b.len() != 32 {
            return None;
        }
        let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
        let mut k = [0u8; 16];
        for (i, out) in k.iter_mut().enumerate() {
            *out = digit(b[2 * i])? << 4 | digit(b[2 * i + 1])?;
        }
        Some(VersionKey(k))
    }

    pub fn hex(&self) -> String {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut s = String::with_capacity(2 * self.0.len());
        for b in self.0 {
            s.push(DIGITS[(b >> 4) as usize] as char);
            s.push(DIGITS[(b & 15) as usize] as char);
        }
        s
    }
}

/// One file version as the cache and the read path see it.
#[derive(Clone, Debug)]
pub struct FileVersion {
    pub key: VersionKey,
    pub rel: Arc<Path>,
    pub version: SourceVersion,
}

impl FileVersion {
    pub fn new(rel: Arc<Path>, version: SourceVersion) -> Self {
        FileVersion {
            key: VersionKey::new(&rel, &version),
            rel,
            version,
        }
    }

    /// Number of blocks (a non-empty file smaller than a block is one block).
    pub fn block_count(&self, block_size: u64) -> u64 {
        self.version.size.div_ceil(block_size)
    }

    /// Length of block `index` (the last one may be short).
    pub fn block_len(&self, index: u64, block_size: u64) -> usize {
        let start = index * block_size;
        self.version.size.saturating_sub(start).min(block_size) as usize
    }
}

/// A block id: one aligned block of one file version.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockId {
    pub key: VersionKey,
    pub index: u64,
}

/// A block's checksum: xxh3-128 of its bytes (little endian). It guards
/// against corruption (bit rot, torn writes, edits of the cache dir, a
/// peer's bad disk), not against forgery: a peer is trusted by its
/// certificate, and could send any bytes under a matching hash of any kind.
/// xxh3 runs at 29 GB/s per core here against blake3's 8.4 GB/s.
pub type Checksum = [u8; 16];

/// The checksum of a block's bytes.
pub fn block_checksum(data: &[u8]) -> Checksum {
    xxhash_rust::xxh3::xxh3_128(data).to_le_bytes()
}

/// Bytes together with the checksum they must match. The only ways to make
/// one are to hash bytes we read from the source ourselves, or to check bytes
/// against a checksum ([`ChecksummedBytes::verified`]): integrity is a type.
#[derive(Clone, Debug)]
pub struct ChecksummedBytes {
    data: Bytes,
    sum: Checksum,
}

impl ChecksummedBytes {
    /// Bytes straight from the source: their checksum is computed here.
    pub fn from_source(data: Bytes) -> Self {
        let sum = block_checksum(&data);
        ChecksummedBytes { data, sum }
    }

    /// Bytes from an untrusted place (the disk, a peer), accepted only if they
    /// match `sum`.
    pub fn verified(data: Bytes, sum: Checksum) -> Option<Self> {
        (block_checksum(&data) == sum).then_some(ChecksummedBytes { data, sum })
    }

    pub fn data(&self) -> &Bytes {
        &self.data
    }

    pub fn checksum(&self) -> &Checksum {
        &self.sum
    }
}

/// What the cache holds, for `stats` (a part of the stats snapshot, so it
/// is defined with the others in stats.rs).
pub use crate::obs::stats::CacheUsage;

/// Called with a version's key when its cached file stops being complete.
pub type DroppedHook = Box<dyn Fn(&VersionKey) + Send + Sync>;

/// The seam between the read path and whatever keeps blocks locally: what
/// the reader, the write-back queue, read-ahead and `locate` need. Every
/// method is infallible from the caller's view: faults become misses.
///
/// A store with no policy (a fake in memory) writes `get`, `put`,
/// `is_block_cached`, `is_complete`, `usage` and `has_room_for`; the rest
/// have defaults. Handing whole files to the kernel is the other seam,
/// [`CompleteFiles`], which such a store need not have.
pub trait BlockStore: Send + Sync + 'static {
    /// A verified block, or None (absent, or found corrupt and dropped).
    fn get(&self, file: &FileVersion, index: u64) -> Option<ChecksummedBytes>;
    /// Stores a block if the policy admits it; returns whether it was stored.
    fn put(&self, file: &FileVersion, index: u64, block: &ChecksummedBytes) -> bool;
    /// Stores a block owned by another node (fetched from a peer): kept only
    /// in spare room and evicted before this node's own blocks. Until the
    /// peer module refines it, the same as `put`.
    fn put_guest(&self, file: &FileVersion, index: u64, block: &ChecksummedBytes) -> bool {
        self.put(file, index, block)
    }
    /// Stores a block that was fetched ahead of the loader (read-ahead), as
    /// `put` or `put_guest`: the loader will read it soon, so the cache may
    /// keep a copy in memory for that read (the page cache) rather than
    /// send it to the disk only and read it back.
    fn put_ahead(
        &self,
        file: &FileVersion,
        index: u64,
        block: &ChecksummedBytes,
        guest: bool,
    ) -> bool {
        if guest {
            self.put_guest(file, index, block)
        } else {
            self.put(file, index, block)
        }
    }
    /// Whether one block is cached (not verified).
    fn is_block_cached(&self, file: &FileVersion, index: u64) -> bool;
    /// Whether another writer (read-ahead, the loader's write-back) is
    /// writing this block now: a `put` that returned false meanwhile did not
    /// fail, it found the write taken.
    fn is_block_being_written(&self, _file: &FileVersion, _index: u64) -> bool {
        false
    }
    /// Whether every block of the file is cached (not verified).
    fn is_complete(&self, file: &FileVersion) -> bool;
    /// The version is the current one for its path: older versions of the
    /// same path are stale. A store with no policy may ignore it.
    fn note_current(&self, _file: &FileVersion) {}
    /// The loader read `bytes` of this file (advances the policy's clock).
    /// A store with no policy may ignore it.
    fn record_access(&self, _file: &FileVersion, _bytes: u64) {}
    /// What the store holds now, for `stats`.
    fn usage(&self) -> CacheUsage;
    /// Whether the whole file would fit in free room now, without evicting
    /// anything (read-ahead only fills free room).
    fn has_room_for(&self, file: &FileVersion) -> bool;
}

/// The seam between the open path (fs.rs) and a cache that keeps whole
/// files it can hand to the kernel for passthrough: an open read-only
/// file, pinned (kept whole, never evicted) until it is given back. A mount
/// whose cache keeps no such files has none of it (`Option` in
/// `FsCore::new`), and opens every file through the daemon.
pub trait CompleteFiles: Send + Sync + 'static {
    /// If every block of the file is cached and verified since this mount, an
    /// open read-only handle on the cached file (for passthrough); the file is
    /// pinned until [`CompleteFiles::unpin`].
    fn open_complete(&self, file: &FileVersion) -> Option<File>;
    /// Pins a file again that [`CompleteFiles::open_complete`] handed out
    /// earlier in this mount, if it is still complete (no I/O): for a
    /// backing kept from that open. False if it is not (or the cache keeps
    /// no such files).
    fn pin_complete(&self, _file: &FileVersion) -> bool {
        false
    }
    /// Pins a file the kernel already reads through a passthrough backing
    /// that an earlier server of this mount registered (a server restarted
    /// over a live mount): it was verified before that open, so only its
    /// being whole is checked. False if it is not.
    fn pin_in_use(&self, file: &FileVersion) -> bool {
        self.pin_complete(file)
    }
    /// Gives back one pin taken by `open_complete`, `pin_complete` or
    /// `pin_in_use`.
    fn unpin(&self, file: &FileVersion);
    /// What to call with a version's key when its cached file is deleted or
    /// loses a block, so that nobody keeps reading it as complete (kept
    /// passthrough backings). A cache that never says yes to
    /// [`CompleteFiles::pin_complete`] may ignore it.
    fn on_file_dropped(&self, _hook: DroppedHook) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_of_a_path_share_the_path_part_and_hash_alike() {
        use std::hash::BuildHasher;
        let v = |size, ino| SourceVersion {
            size,
            mtime_ns: 7,
            ino,
        };
        let p = Path::new("n01440764/n01440764_10026.JPEG");
        let (a, b) = (VersionKey::new(p, &v(10, 1)), VersionKey::new(p, &v(11, 1)));
        let c = VersionKey::new(Path::new("n01440764/n01440764_10027.JPEG"), &v(10, 1));
        assert_ne!(a, b);
        assert_eq!(a.path_part(), b.path_part());
        assert_eq!(a.path_part(), VersionKey::path_part_of(p));
        assert_ne!(a.path_part(), c.path_part());
        assert_ne!(a.0[4..], b.0[4..]);
        // The path part is blake3's first 4 bytes of the path (the cache's
        // file names are made of keys: this must not change by accident).
        assert_eq!(
            a.0[..4],
            blake3::hash(p.as_os_str().as_encoded_bytes()).as_bytes()[..4]
        );
        use policy::BookKey;
        assert_eq!(a.book_part(), b.book_part());
        assert_ne!(a.book_part(), c.book_part());
        // Elsewhere a key hashes whole: the versions of one path do not
        // share a hash (a map of 100k of them is not a list).
        let s = std::collections::hash_map::RandomState::new();
        assert_ne!(s.hash_one(a), s.hash_one(b));
    }

    #[test]
    fn version_key_hex_is_lowercase_two_digits_per_byte() {
        // Cache file names are made of it: it must not change across
        // versions of locafs.
        let mut k = VersionKey([0u8; 16]);
        for (i, b) in k.0.iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(37).wrapping_add(5);
        }
        let want: String = k.0.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(k.hex(), want);
        assert_eq!(VersionKey([0xab; 16]).hex(), "ab".repeat(16));
        // Cache file names are read back into keys (one-block files).
        assert_eq!(VersionKey::from_hex(&k.hex()), Some(k));
        assert_eq!(VersionKey::from_hex(&k.hex().to_uppercase()), Some(k));
        for bad in ["", "ab", &"g0".repeat(16), &"ab".repeat(17)] {
            assert_eq!(VersionKey::from_hex(bad), None, "{bad:?}");
        }
    }
}
