//! The namespace manifest: a snapshot of the source tree as the namespace
//! knew it (inodes, names, attributes, which directories were listed in
//! full), saved in the data set's cache directory at unmount and
//! periodically, and loaded at the next mount so that a remount does not
//! walk the source again. With `--immutable` the snapshot is trusted; with
//! `--revalidate D` its entries count as checked when it was saved, so
//! after D they are checked again, lazily, as they are used.
//!
//! Plain encoding and decoding with a trailing checksum (little-endian,
//! written with `bytes::BufMut` and read with `Buf`'s `try_get_*`, as the
//! other binary formats are): a manifest that is truncated, corrupt or of
//! another format is ignored (the source is walked as if there were none);
//! it never fails a mount.

use bytes::{Buf, BufMut};

use crate::source::{EntryKind, SourceAttr};

/// Format 2: the records are exactly the tree the mount last saw. Format 1
/// held every inode the mount ever knew, deleted and replaced entries too,
/// so a remount brought them back; such a manifest is ignored (the source
/// is walked once more).
const MAGIC: &[u8; 8] = b"LOCAFSN2";

/// One inode of the snapshot.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    pub parent: u64,
    pub name: Vec<u8>,
    pub attr: SourceAttr,
    /// A directory whose full listing is in the snapshot.
    pub listed: bool,
}

/// Builds a manifest incrementally: the root first, then every parent
/// before its children; record `i` (from 0) is entry number `i + 1`, the
/// number its children give as `parent`.
pub struct Encoder {
    buf: Vec<u8>,
    count: u64,
}

impl Encoder {
    pub fn new(source: &[u8], saved_unix_s: u64) -> Self {
        let mut buf = Vec::with_capacity(1 << 20);
        buf.put_slice(MAGIC);
        buf.put_u64_le(saved_unix_s);
        buf.put_u32_le(source.len() as u32);
        buf.put_slice(source);
        buf.put_u64_le(0); // count, patched in finish
        Encoder { buf, count: 0 }
    }

    pub fn push(&mut self, parent: u64, name: &[u8], a: &SourceAttr, listed: bool) {
        let b = &mut self.buf;
        b.put_u64_le(parent);
        b.put_u32_le(name.len() as u32);
        b.put_slice(name);
        b.put_u8(match a.kind {
            EntryKind::Dir => 0,
            EntryKind::File => 1,
            EntryKind::Symlink => 2,
            EntryKind::Other => 3,
        });
        b.put_u8(listed as u8);
        for v in [a.size, a.blocks, a.ino] {
            b.put_u64_le(v);
        }
        for v in [a.mode, a.nlink, a.uid, a.gid, a.rdev] {
            b.put_u32_le(v);
        }
        for v in [a.atime_ns, a.mtime_ns, a.ctime_ns] {
            b.put_i64_le(v);
        }
        self.count += 1;
    }

    pub fn finish(mut self, source_len: usize) -> Vec<u8> {
        let at = 8 + 8 + 4 + source_len;
        (&mut self.buf[at..at + 8]).put_u64_le(self.count);
        let sum = blake3::hash(&self.buf);
        self.buf.put_slice(sum.as_bytes());
        self.buf
    }
}

/// The next `n` bytes of `c`, or None (and `c` untouched) if it is shorter.
fn take<'a>(c: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
    let (head, rest) = c.split_at_checked(n)?;
    *c = rest;
    Some(head)
}

/// A decoded manifest.
#[derive(Debug)]
pub struct Manifest {
    pub saved_unix_s: u64,
    pub source: Vec<u8>,
    pub records: Vec<Record>,
}

/// Decodes a manifest; None if it is not a valid, complete one.
pub fn decode(data: &[u8]) -> Option<Manifest> {
    if data.len() < 32 + 28 {
        return None;
    }
    let (body, sum) = data.split_at(data.len() - 32);
    if blake3::hash(body).as_bytes() != sum {
        return None;
    }
    // `try_get_*` fail (never panic) on a body cut short.
    let mut c = body;
    if take(&mut c, 8)? != MAGIC {
        return None;
    }
    let saved_unix_s = c.try_get_u64_le().ok()?;
    let slen = c.try_get_u32_le().ok()? as usize;
    let source = take(&mut c, slen)?.to_vec();
    let count = c.try_get_u64_le().ok()?;
    let mut records = Vec::with_capacity(count.min(1 << 24) as usize);
    for i in 0..count {
        let parent = c.try_get_u64_le().ok()?;
        let nlen = c.try_get_u32_le().ok()? as usize;
        let name = take(&mut c, nlen)?.to_vec();
        let kind = match c.try_get_u8().ok()? {
            0 => EntryKind::Dir,
            1 => EntryKind::File,
            2 => EntryKind::Symlink,
            3 => EntryKind::Other,
            _ => return None,
        };
        let listed = c.try_get_u8().ok()? != 0;
        let (size, blocks, ino) = (
            c.try_get_u64_le().ok()?,
            c.try_get_u64_le().ok()?,
            c.try_get_u64_le().ok()?,
        );
        let (mode, nlink, uid, gid, rdev) = (
            c.try_get_u32_le().ok()?,
            c.try_get_u32_le().ok()?,
            c.try_get_u32_le().ok()?,
            c.try_get_u32_le().ok()?,
            c.try_get_u32_le().ok()?,
        );
        let (atime_ns, mtime_ns, ctime_ns) = (
            c.try_get_i64_le().ok()?,
            c.try_get_i64_le().ok()?,
            c.try_get_i64_le().ok()?,
        );
        // Parents come before children; the root is its own parent.
        if parent == 0 || parent > i + 1 || (i > 0 && parent == i + 1) {
            return None;
        }
        records.push(Record {
            parent,
            name,
            attr: SourceAttr {
                kind,
                size,
                blocks,
                mode,
                nlink,
                uid,
                gid,
                rdev,
                ino,
                atime_ns,
                mtime_ns,
                ctime_ns,
            },
            listed,
        });
    }
    (!c.has_remaining()).then_some(Manifest {
        saved_unix_s,
        source,
        records,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(kind: EntryKind, size: u64) -> SourceAttr {
        SourceAttr {
            kind,
            size,
            blocks: 8,
            mode: 0o100644,
            nlink: 1,
            uid: 5,
            gid: 6,
            rdev: 0,
            ino: 77,
            atime_ns: -5,
            mtime_ns: 1_700_000_000_123_456_789,
            ctime_ns: 3,
        }
    }

    #[test]
    fn round_trip_and_corruption() {
        let mut e = Encoder::new(b"/data/set", 1234);
        e.push(1, b"", &attr(EntryKind::Dir, 0), true);
        e.push(1, b"a \xff name", &attr(EntryKind::File, 99), false);
        e.push(1, b"sub", &attr(EntryKind::Dir, 0), false);
        e.push(3, b"link", &attr(EntryKind::Symlink, 4), false);
        let bytes = e.finish(b"/data/set".len());
        let m = decode(&bytes).unwrap();
        assert_eq!(m.saved_unix_s, 1234);
        assert_eq!(m.source, b"/data/set");
        assert_eq!(m.records.len(), 4);
        assert_eq!(m.records[1].name, b"a \xff name");
        assert_eq!(m.records[1].attr, attr(EntryKind::File, 99));
        assert!(m.records[0].listed && !m.records[2].listed);
        for cut in [0, 10, bytes.len() / 2, bytes.len() - 1] {
            assert!(decode(&bytes[..cut]).is_none(), "truncated at {cut}");
        }
        let mut bad = bytes.clone();
        bad[40] ^= 1;
        assert!(decode(&bad).is_none());
    }

    /// `hex` with spaces and newlines for reading, as bytes.
    fn unhex(hex: &str) -> Vec<u8> {
        let digits: Vec<u8> = hex.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
        digits
            .chunks(2)
            .map(|d| u8::from_str_radix(std::str::from_utf8(d).unwrap(), 16).unwrap())
            .collect()
    }

    /// Today's manifest bytes, pinned: a manifest saved by this version must
    /// load in the next one (or the format gets a new magic).
    #[test]
    fn the_format_is_pinned_byte_for_byte() {
        let mut e = Encoder::new(b"/s", 0x0102_0304_0506_0708);
        e.push(1, b"", &attr(EntryKind::Dir, 0), true);
        e.push(1, b"f", &attr(EntryKind::File, 0x1122), false);
        let bytes = e.finish(2);
        // Every integer little-endian: magic, saved time, source length and
        // source, record count; per record parent, name length and name,
        // kind, listed, size, blocks, ino, mode, nlink, uid, gid, rdev,
        // atime, mtime, ctime (ns); then blake3 of all that.
        let record = |parent: &str, name: &str, kind_listed: &str, size: &str| {
            format!(
                "{parent} {name} {kind_listed} {size} 0800000000000000 4d00000000000000
                 a4810000 01000000 05000000 06000000 00000000
                 fbffffffffffffff 15cd853dfe9c9717 0300000000000000"
            )
        };
        let body = unhex(&format!(
            "4c4f434146534e32 0807060504030201 02000000 2f73 0200000000000000 {} {}",
            record("0100000000000000", "00000000", "00 01", "0000000000000000"),
            record(
                "0100000000000000",
                "01000000 66",
                "01 00",
                "2211000000000000"
            ),
        ));
        let mut want = body.clone();
        want.extend_from_slice(blake3::hash(&body).as_bytes());
        assert_eq!(bytes, want);
        let m = decode(&want).expect("the pinned bytes decode");
        assert_eq!(m.saved_unix_s, 0x0102_0304_0506_0708);
        assert_eq!(m.source, b"/s");
        assert_eq!(
            m.records,
            vec![
                Record {
                    parent: 1,
                    name: Vec::new(),
                    attr: attr(EntryKind::Dir, 0),
                    listed: true,
                },
                Record {
                    parent: 1,
                    name: b"f".to_vec(),
                    attr: attr(EntryKind::File, 0x1122),
                    listed: false,
                },
            ]
        );
    }

    #[test]
    fn a_format_1_manifest_is_ignored() {
        // Format 1 saved deleted and replaced entries too: not to be trusted.
        let mut e = Encoder::new(b"/s", 1);
        e.push(1, b"", &attr(EntryKind::Dir, 0), true);
        let mut bytes = e.finish(2);
        assert!(decode(&bytes).is_some());
        let n = bytes.len() - 32;
        bytes[..8].copy_from_slice(b"LOCAFSN1");
        let sum = blake3::hash(&bytes[..n]);
        bytes[n..].copy_from_slice(sum.as_bytes());
        assert!(decode(&bytes).is_none());
    }
}
