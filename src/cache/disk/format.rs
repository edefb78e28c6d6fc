//! The on-disk format of a cached file version's meta: the `.meta` file
//! (a header with the source version and path, then one 24-byte slot per
//! block: checksum, length, presence marker) and, for a one-block file, the
//! 40-byte `user.locafs.meta` xattr of its data file in its place. Encoding
//! and decoding only; `the_meta_formats_are_pinned_byte_for_byte` pins the
//! bytes.
//!
//! Must never: panic on bad bytes (a torn or foreign meta is "not an entry",
//! never an error that stops a start-up), or change a byte of the format
//! without a new magic.

use std::io;
use std::os::unix::ffi::OsStrExt;

use bytes::{Buf, BufMut};

use super::{
    Checksum, Core, Entry, FileVersion, Path, Slot, SourceVersion, VersionKey, CREATED, MAX_BLOCKS,
    META_IN_XATTR, META_ON_GUEST,
};

pub(super) const MAGIC: &[u8; 8] = b"LOCAFSM1";

/// 3 since 2026-12-02: the same bytes, with version keys whose first 4
/// bytes are their path part (`VersionKey`); a `.meta` of format 2 holds a
/// key of the old derivation and is discarded at the scan.
pub(super) const FORMAT: u32 = 3;

pub(super) const HEADER_FIXED: usize = 60;

pub(super) const SLOT: u64 = 24;

pub(super) const PRESENT: u32 = 0x5052_4553;

/// Presence marker of a guest block (owned by another node).
pub(super) const PRESENT_GUEST: u32 = 0x4755_4553;

pub(super) const BLOCK_SIZE_CHANGED: &str = "cached with another block size";

/// The extended attribute of a one-block file's `.data` file that holds its
/// meta in place of a `.meta` file, so that caching a small file creates one
/// file, not two. Its value is small enough (40 bytes) for ext4 to keep in
/// the inode (60 bytes fit under this name here), so setting it allocates
/// nothing: magic `LCI3`, size (8), path hash (8; its low 32 bits are the
/// key's path part), checksum of the block (16), presence marker (4). The
/// key is the file's name; the path and version need not be kept, since the
/// key is a hash of them. `LCI2` (until 2026-12-02) was written with keys
/// of the old derivation, which nothing asks for any more: such a file is
/// discarded at the scan.
pub(super) const META_XATTR: &str = "user.locafs.meta";

pub(super) const INLINE_MAGIC: &[u8; 4] = b"LCI3";

pub(super) const INLINE_LEN: usize = 40;

pub(super) fn path_hash(rel: &Path) -> u64 {
    (&blake3::hash(rel.as_os_str().as_bytes()).as_bytes()[..8]).get_u64_le()
}

fn marker(guest: bool) -> u32 {
    if guest {
        PRESENT_GUEST
    } else {
        PRESENT
    }
}

/// A block's slot in a `.meta` file's table: checksum, length, presence
/// marker (own or guest).
pub(super) fn encode_slot(sum: &Checksum, len: u32, guest: bool) -> [u8; SLOT as usize] {
    let mut slot = [0u8; SLOT as usize];
    let mut w = &mut slot[..];
    w.put_slice(sum);
    w.put_u32_le(len);
    w.put_u32_le(marker(guest));
    slot
}

/// A one-block file's [`META_XATTR`]: magic, size, path hash, checksum of
/// the block, presence marker ([`INLINE_LEN`] bytes).
pub(super) fn encode_inline(size: u64, path_hash: u64, sum: &Checksum, guest: bool) -> Vec<u8> {
    let mut raw = Vec::with_capacity(INLINE_LEN);
    raw.put_slice(INLINE_MAGIC);
    raw.put_u64_le(size);
    raw.put_u64_le(path_hash);
    raw.put_slice(sum);
    raw.put_u32_le(marker(guest));
    raw
}

/// A slot's bytes: checksum, length, presence marker.
pub(super) fn decode_slot(mut s: &[u8]) -> Option<(Checksum, u32, u32)> {
    if s.len() < SLOT as usize {
        return None;
    }
    let mut sum = Checksum::default();
    s.copy_to_slice(&mut sum);
    Some((sum, s.get_u32_le(), s.get_u32_le()))
}

/// The version key a `.meta` header names, if `raw` begins with a header of
/// this format (magic, format, block size, size, mtime, inode, key, ...).
pub(super) fn header_key(raw: &[u8]) -> Option<VersionKey> {
    let h = raw.get(..HEADER_FIXED)?;
    if &h[..8] != MAGIC || (&h[8..12]).get_u32_le() != FORMAT {
        return None;
    }
    Some(VersionKey(h[40..56].try_into().ok()?))
}

/// A [`META_XATTR`]'s fields, if its bytes are one: size, path hash,
/// checksum, guest (the marker is one of the two).
pub(super) fn decode_inline(raw: &[u8]) -> Option<(u64, u64, Checksum, bool)> {
    if raw.len() != INLINE_LEN || &raw[..4] != INLINE_MAGIC {
        return None;
    }
    // Exactly INLINE_LEN bytes (checked above): the gets cannot fail.
    let mut r = &raw[4..];
    let size = r.get_u64_le();
    let path_hash = r.get_u64_le();
    let mut sum = Checksum::default();
    r.copy_to_slice(&mut sum);
    match r.get_u32_le() {
        PRESENT => Some((size, path_hash, sum, false)),
        PRESENT_GUEST => Some((size, path_hash, sum, true)),
        _ => None,
    }
}

impl Core {
    pub(super) fn meta_layout(&self, rel: &Path, nblocks: u64) -> (u64, u64) {
        let table = (HEADER_FIXED + rel.as_os_str().len()).div_ceil(64) as u64 * 64;
        (table, table + nblocks * SLOT)
    }

    /// The meta of a new version as written at creation: header, then an
    /// empty slot table.
    pub(super) fn new_meta(&self, file: &FileVersion, nblocks: u64) -> Vec<u8> {
        let (table, meta_len) = self.meta_layout(&file.rel, nblocks);
        let mut header = Vec::with_capacity(table as usize);
        header.put_slice(MAGIC);
        header.put_u32_le(FORMAT);
        header.put_u32_le(self.block_size as u32);
        header.put_u64_le(file.version.size);
        header.put_i64_le(file.version.mtime_ns);
        header.put_u64_le(file.version.ino);
        header.put_slice(&file.key.0);
        let p = file.rel.as_os_str().as_bytes();
        header.put_u32_le(p.len() as u32);
        header.put_slice(p);
        header.resize(meta_len as usize, 0);
        header
    }

    /// Parses a `.meta` file's bytes; Ok(None) if they are not a valid entry
    /// of this cache.
    pub(super) fn parse_meta(&self, raw: &[u8]) -> io::Result<Option<(VersionKey, Entry)>> {
        if raw.len() < HEADER_FIXED || &raw[..8] != MAGIC {
            return Ok(None);
        }
        // The fixed header is all there (checked above): its gets cannot fail.
        let mut h = &raw[8..HEADER_FIXED];
        if h.get_u32_le() != FORMAT {
            return Ok(None);
        }
        if h.get_u32_le() as u64 != self.block_size {
            return Err(io::Error::other(BLOCK_SIZE_CHANGED));
        }
        let version = SourceVersion {
            size: h.get_u64_le(),
            mtime_ns: h.get_i64_le(),
            ino: h.get_u64_le(),
        };
        let mut key = [0u8; 16];
        h.copy_to_slice(&mut key);
        let plen = h.get_u32_le() as usize;
        if HEADER_FIXED + plen > raw.len() {
            return Ok(None);
        }
        let rel = Path::new(std::ffi::OsStr::from_bytes(
            &raw[HEADER_FIXED..HEADER_FIXED + plen],
        ));
        let key = VersionKey(key);
        if VersionKey::new(rel, &version) != key {
            return Ok(None);
        }
        let nblocks = version.size.div_ceil(self.block_size);
        let (table, _) = self.meta_layout(rel, nblocks);
        if table > u16::MAX as u64 || nblocks > MAX_BLOCKS {
            // (Never written so: `store` refuses such a layout.)
            return Ok(None);
        }
        let mut e = Entry::new(version.size, nblocks, table, CREATED, 0);
        for i in 0..nblocks as usize {
            let o = (table + i as u64 * SLOT) as usize;
            let Some((sum, len, marker)) = raw.get(o..).and_then(decode_slot) else {
                break;
            };
            let want = version
                .size
                .saturating_sub(i as u64 * self.block_size)
                .min(self.block_size);
            if (marker == PRESENT || marker == PRESENT_GUEST) && len as u64 == want {
                e.set_present(i, sum);
                e.blocks[i].guest = marker == PRESENT_GUEST;
            }
        }
        e.recount();
        // The meta file goes with the own blocks if there are any.
        let meta_on_guest =
            e.present() > 0 && e.blocks.iter().all(|b| b.slot != Slot::Present || b.guest);
        e.set_bit(META_ON_GUEST, meta_on_guest);
        Ok(Some((key, e)))
    }

    /// Reads a one-block file's [`META_XATTR`] (`data` is its data file);
    /// None if it is not a valid entry of this cache. A file cached under
    /// another block size is still one block if it fits in this one.
    pub(super) fn parse_inline(&self, data: &Path, raw: &[u8]) -> Option<(VersionKey, Entry)> {
        let (size, path_hash, _, guest) = decode_inline(raw)?;
        let key = VersionKey::from_hex(data.file_stem()?.to_str()?)?;
        if size == 0 || size > self.block_size || path_hash as u32 != key.path_part() {
            return None;
        }
        let bits = CREATED | META_IN_XATTR | if guest { META_ON_GUEST } else { 0 };
        let mut e = Entry::new(size, 1, 0, bits, 0);
        // (The checksum stays on disk: the books keep none for a one-block
        // file; `stored_sum` reads it when the block is served.)
        e.set_slot(0, Slot::Present);
        e.blocks[0].guest = guest;
        Some((key, e))
    }
}
