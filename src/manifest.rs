//! The namespace manifest: a snapshot of the source tree as the namespace
//! knew it (inodes, names, attributes, which directories were listed in
//! full), saved in the data set's cache directory at unmount and
//! periodically, and loaded at the next mount so that a remount does not
//! walk the source again. With `--immutable` the snapshot is trusted; with
//! `--revalidate D` its entries count as checked when it was saved, so
//! after D they are checked again, lazily, as they are used.
//!
//! Plain encoding and decoding with a trailing checksum: a manifest that is
//! truncated, corrupt or of another format is ignored (the source is walked
//! as if there were none); it never fails a mount.

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
        buf.extend_from_slice(MAGIC);
        buf.extend_from_slice(&saved_unix_s.to_le_bytes());
        buf.extend_from_slice(&(source.len() as u32).to_le_bytes());
        buf.extend_from_slice(source);
        buf.extend_from_slice(&0u64.to_le_bytes()); // count, patched in finish
        Encoder { buf, count: 0 }
    }

    pub fn push(&mut self, parent: u64, name: &[u8], a: &SourceAttr, listed: bool) {
        let b = &mut self.buf;
        b.extend_from_slice(&parent.to_le_bytes());
        b.extend_from_slice(&(name.len() as u32).to_le_bytes());
        b.extend_from_slice(name);
        b.push(match a.kind {
            EntryKind::Dir => 0,
            EntryKind::File => 1,
            EntryKind::Symlink => 2,
            EntryKind::Other => 3,
        });
        b.push(listed as u8);
        for v in [a.size, a.blocks, a.ino] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        for v in [a.mode, a.nlink, a.uid, a.gid, a.rdev] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        for v in [a.atime_ns, a.mtime_ns, a.ctime_ns] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        self.count += 1;
    }

    pub fn finish(mut self, source_len: usize) -> Vec<u8> {
        let at = 8 + 8 + 4 + source_len;
        self.buf[at..at + 8].copy_from_slice(&self.count.to_le_bytes());
        let sum = blake3::hash(&self.buf);
        self.buf.extend_from_slice(sum.as_bytes());
        self.buf
    }
}

struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.b.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(s)
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
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
    let mut c = Cursor { b: body, at: 0 };
    if c.take(8)? != MAGIC {
        return None;
    }
    let saved_unix_s = c.u64()?;
    let slen = c.u32()? as usize;
    let source = c.take(slen)?.to_vec();
    let count = c.u64()?;
    let mut records = Vec::with_capacity(count.min(1 << 24) as usize);
    for i in 0..count {
        let parent = c.u64()?;
        let nlen = c.u32()? as usize;
        let name = c.take(nlen)?.to_vec();
        let kind = match c.u8()? {
            0 => EntryKind::Dir,
            1 => EntryKind::File,
            2 => EntryKind::Symlink,
            3 => EntryKind::Other,
            _ => return None,
        };
        let listed = c.u8()? != 0;
        let (size, blocks, ino) = (c.u64()?, c.u64()?, c.u64()?);
        let (mode, nlink, uid, gid, rdev) = (c.u32()?, c.u32()?, c.u32()?, c.u32()?, c.u32()?);
        let (atime_ns, mtime_ns, ctime_ns) = (c.u64()? as i64, c.u64()? as i64, c.u64()? as i64);
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
    (c.at == body.len()).then_some(Manifest {
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
