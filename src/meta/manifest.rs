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

/// Format 3: format 2's layout, with a flags byte where format 2 had
/// "listed" (0 or 1): bit 0 listed, bit 1 attributes unknown (an entry
/// only listed, never stat-ed: its attribute fields hold only its kind and
/// source inode, and the next mount stats it on first use). Format 2 (every
/// entry stat-ed) is read as it is. Format 1 held every inode the mount
/// ever knew, deleted and replaced entries too, so a remount brought them
/// back; such a manifest is ignored (the source is walked once more).
const MAGIC: &[u8; 8] = b"LOCAFSN3";
/// Format 2, still read.
const MAGIC_2: &[u8; 8] = b"LOCAFSN2";
/// Format 3's flags byte.
const LISTED: u8 = 1;
const UNKNOWN: u8 = 2;

/// One inode of the snapshot (its name borrowed from the manifest's bytes).
#[derive(Debug, Clone, PartialEq)]
pub struct Record<'a> {
    pub parent: u64,
    pub name: &'a [u8],
    pub attr: SourceAttr,
    /// A directory whose full listing is in the snapshot.
    pub listed: bool,
    /// The attributes were read from the source; false for an entry only
    /// listed (`attr` holds only its kind and source inode).
    pub known: bool,
}

/// Appends one record to `b`.
fn put_record(
    b: &mut Vec<u8>,
    parent: u64,
    name: &[u8],
    a: &SourceAttr,
    listed: bool,
    known: bool,
) {
    b.put_u64_le(parent);
    b.put_u32_le(name.len() as u32);
    b.put_slice(name);
    b.put_u8(match a.kind {
        EntryKind::Dir => 0,
        EntryKind::File => 1,
        EntryKind::Symlink => 2,
        EntryKind::Other => 3,
    });
    b.put_u8(if listed { LISTED } else { 0 } | if known { 0 } else { UNKNOWN });
    for v in [a.size, a.blocks, a.ino] {
        b.put_u64_le(v);
    }
    for v in [a.mode, a.nlink, a.uid, a.gid, a.rdev] {
        b.put_u32_le(v);
    }
    for v in [a.atime_ns, a.mtime_ns, a.ctime_ns] {
        b.put_i64_le(v);
    }
}

/// The bytes of a record with a name of `name_len` bytes.
pub const fn record_len(name_len: usize) -> u64 {
    (8 + 4 + 2 + 3 * 8 + 5 * 4 + 3 * 8 + name_len) as u64
}

/// The bytes of a manifest of records of `names` name bytes in all.
pub const fn manifest_len(source_len: usize, records: u64, names: u64) -> u64 {
    (8 + 8 + 4 + source_len + 8 + 32) as u64 + records * record_len(0) + names
}

/// Builds a manifest incrementally in memory: the root first, then every
/// parent before its children; record `i` (from 0) is entry number `i + 1`,
/// the number its children give as `parent`. (A mount streams its manifest
/// to the file with [`StreamEncoder`] instead.)
pub struct Encoder {
    buf: Vec<u8>,
    count: u64,
}

impl Encoder {
    pub fn new(source: &[u8], saved_unix_s: u64) -> Self {
        let mut buf = Vec::with_capacity(1 << 12);
        put_header(&mut buf, source, saved_unix_s, 0); // count patched in finish
        Encoder { buf, count: 0 }
    }

    pub fn push(&mut self, parent: u64, name: &[u8], a: &SourceAttr, listed: bool) {
        self.push_entry(parent, name, a, listed, true)
    }

    /// [`Encoder::push`] of an entry whose attributes may be unknown
    /// (`known` false: only `a`'s kind and source inode mean anything).
    pub fn push_entry(
        &mut self,
        parent: u64,
        name: &[u8],
        a: &SourceAttr,
        listed: bool,
        known: bool,
    ) {
        put_record(&mut self.buf, parent, name, a, listed, known);
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

fn put_header(b: &mut Vec<u8>, source: &[u8], saved_unix_s: u64, count: u64) {
    b.put_slice(MAGIC);
    b.put_u64_le(saved_unix_s);
    b.put_u32_le(source.len() as u32);
    b.put_slice(source);
    b.put_u64_le(count);
}

/// Writes a manifest of `count` records (known before the first) to `W`
/// as they come, through a buffer of 64 KiB: no copy of the tree in
/// memory. The same bytes as [`Encoder`].
pub struct StreamEncoder<W: std::io::Write> {
    out: W,
    buf: Vec<u8>,
    hash: blake3::Hasher,
    count: u64,
    pushed: u64,
    written: u64,
}

const STREAM_BUF: usize = 64 << 10;

impl<W: std::io::Write> StreamEncoder<W> {
    pub fn new(out: W, source: &[u8], saved_unix_s: u64, count: u64) -> Self {
        let mut buf = Vec::with_capacity(STREAM_BUF + 512);
        put_header(&mut buf, source, saved_unix_s, count);
        StreamEncoder {
            out,
            buf,
            hash: blake3::Hasher::new(),
            count,
            pushed: 0,
            written: 0,
        }
    }

    pub fn push(
        &mut self,
        parent: u64,
        name: &[u8],
        a: &SourceAttr,
        listed: bool,
    ) -> std::io::Result<()> {
        self.push_entry(parent, name, a, listed, true)
    }

    /// [`StreamEncoder::push`] of an entry whose attributes may be unknown.
    pub fn push_entry(
        &mut self,
        parent: u64,
        name: &[u8],
        a: &SourceAttr,
        listed: bool,
        known: bool,
    ) -> std::io::Result<()> {
        put_record(&mut self.buf, parent, name, a, listed, known);
        self.pushed += 1;
        if self.buf.len() >= STREAM_BUF {
            self.flush_buf()?;
        }
        Ok(())
    }

    fn flush_buf(&mut self) -> std::io::Result<()> {
        self.hash.update(&self.buf);
        self.out.write_all(&self.buf)?;
        self.written += self.buf.len() as u64;
        self.buf.clear();
        Ok(())
    }

    /// Writes the checksum; returns the writer and the bytes written. An
    /// error if fewer or more records came than announced.
    pub fn finish(mut self) -> std::io::Result<(W, u64)> {
        if self.pushed != self.count {
            return Err(std::io::Error::other("manifest: record count changed"));
        }
        self.flush_buf()?;
        let sum = self.hash.finalize();
        self.out.write_all(sum.as_bytes())?;
        Ok((self.out, self.written + 32))
    }
}

/// The next `n` bytes of `c`, or None (and `c` untouched) if it is shorter.
fn take<'a>(c: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
    let (head, rest) = c.split_at_checked(n)?;
    *c = rest;
    Some(head)
}

/// A decoded manifest: its header, and its records read from its bytes as
/// they are used (no copy of the tree besides the file's bytes).
#[derive(Debug)]
pub struct Manifest {
    pub saved_unix_s: u64,
    pub source: Vec<u8>,
    count: u64,
    /// The records' bytes (checked: every record decodes).
    data: Vec<u8>,
    records_at: usize,
    /// Format 2 (every entry's attributes known).
    v2: bool,
}

impl Manifest {
    /// Number of records.
    pub fn len(&self) -> usize {
        self.count as usize
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The records, in order.
    pub fn records(&self) -> impl Iterator<Item = Record<'_>> + '_ {
        let body = &self.data[..self.data.len() - 32];
        let mut c = &body[self.records_at..];
        let v2 = self.v2;
        (0..self.count).map_while(move |i| record(&mut c, i, v2))
    }
}

/// Decodes record number `i` (from 0) at `c` (of format 2 if `v2`); None
/// if it is not a valid one.
fn record<'a>(c: &mut &'a [u8], i: u64, v2: bool) -> Option<Record<'a>> {
    let parent = c.try_get_u64_le().ok()?;
    let nlen = c.try_get_u32_le().ok()? as usize;
    let name = take(c, nlen)?;
    let kind = match c.try_get_u8().ok()? {
        0 => EntryKind::Dir,
        1 => EntryKind::File,
        2 => EntryKind::Symlink,
        3 => EntryKind::Other,
        _ => return None,
    };
    let flags = c.try_get_u8().ok()?;
    let (listed, known) = match (v2, flags) {
        (true, f) => (f != 0, true),
        (false, f) if f & !(LISTED | UNKNOWN) == 0 => (f & LISTED != 0, f & UNKNOWN == 0),
        _ => return None,
    };
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
    Some(Record {
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
        known,
    })
}

/// Decodes a manifest (taking its bytes); None if it is not a valid,
/// complete one.
pub fn decode(data: impl Into<Vec<u8>>) -> Option<Manifest> {
    let data = data.into();
    if data.len() < 32 + 28 {
        return None;
    }
    let (body, sum) = data.split_at(data.len() - 32);
    if blake3::hash(body).as_bytes() != sum {
        return None;
    }
    // `try_get_*` fail (never panic) on a body cut short.
    let mut c = body;
    let v2 = match take(&mut c, 8)? {
        m if m == MAGIC => false,
        m if m == MAGIC_2 => true,
        _ => return None,
    };
    let saved_unix_s = c.try_get_u64_le().ok()?;
    let slen = c.try_get_u32_le().ok()? as usize;
    let source = take(&mut c, slen)?.to_vec();
    let count = c.try_get_u64_le().ok()?;
    let records_at = body.len() - c.len();
    for i in 0..count {
        record(&mut c, i, v2)?;
    }
    if c.has_remaining() {
        return None;
    }
    Some(Manifest {
        saved_unix_s,
        source,
        count,
        data,
        records_at,
        v2,
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
        let m = decode(&bytes[..]).unwrap();
        assert_eq!(m.saved_unix_s, 1234);
        assert_eq!(m.source, b"/data/set");
        let records: Vec<_> = m.records().collect();
        assert_eq!(records.len(), 4);
        assert_eq!(m.len(), 4);
        assert_eq!(records[1].name, b"a \xff name");
        assert_eq!(records[1].attr, attr(EntryKind::File, 99));
        assert!(records[0].listed && !records[2].listed);
        for cut in [0, 10, bytes.len() / 2, bytes.len() - 1] {
            assert!(decode(&bytes[..cut]).is_none(), "truncated at {cut}");
        }
        let mut bad = bytes.clone();
        bad[40] ^= 1;
        assert!(decode(bad).is_none());
    }

    #[test]
    fn the_stream_encoder_writes_the_same_bytes() {
        let mut e = Encoder::new(b"/data/set", 7);
        let mut s = StreamEncoder::new(Vec::new(), b"/data/set", 7, 3000);
        for i in 0..3000u64 {
            let name = format!("file-{i:05}");
            let a = attr(EntryKind::File, i);
            e.push(1 + i / 1000, name.as_bytes(), &a, false);
            s.push(1 + i / 1000, name.as_bytes(), &a, false).unwrap();
        }
        let (streamed, n) = s.finish().unwrap();
        let want = e.finish(9);
        assert_eq!(streamed, want);
        assert_eq!(n, want.len() as u64);
        assert_eq!(manifest_len(9, 3000, 3000 * 10), n);
        // A count that does not match is an error, not a bad manifest.
        let mut s = StreamEncoder::new(Vec::new(), b"/s", 7, 2);
        s.push(1, b"", &attr(EntryKind::Dir, 0), true).unwrap();
        assert!(s.finish().is_err());
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
            "4c4f434146534e33 0807060504030201 02000000 2f73 0200000000000000 {} {}",
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
        let m = decode(&want[..]).expect("the pinned bytes decode");
        assert_eq!(m.saved_unix_s, 0x0102_0304_0506_0708);
        assert_eq!(m.source, b"/s");
        assert_eq!(
            m.records().collect::<Vec<_>>(),
            vec![
                Record {
                    parent: 1,
                    name: b"",
                    attr: attr(EntryKind::Dir, 0),
                    listed: true,
                    known: true,
                },
                Record {
                    parent: 1,
                    name: b"f",
                    attr: attr(EntryKind::File, 0x1122),
                    listed: false,
                    known: true,
                },
            ]
        );
    }

    /// Re-signs `bytes` (a manifest) under another magic.
    fn with_magic(mut bytes: Vec<u8>, magic: &[u8; 8]) -> Vec<u8> {
        let n = bytes.len() - 32;
        bytes[..8].copy_from_slice(magic);
        let sum = blake3::hash(&bytes[..n]);
        bytes[n..].copy_from_slice(sum.as_bytes());
        bytes
    }

    #[test]
    fn entries_only_listed_round_trip_flagged_and_format_2_still_loads() {
        let mut e = Encoder::new(b"/s", 1);
        e.push(1, b"", &attr(EntryKind::Dir, 0), true);
        e.push_entry(1, b"listed", &attr(EntryKind::File, 0), false, false);
        e.push_entry(1, b"dir", &attr(EntryKind::Dir, 0), true, false);
        e.push_entry(1, b"statted", &attr(EntryKind::File, 9), false, true);
        let bytes = e.finish(2);
        let m = decode(&bytes[..]).unwrap();
        let got: Vec<_> = m.records().map(|r| (r.name, r.listed, r.known)).collect();
        assert_eq!(
            got,
            vec![
                (&b""[..], true, true),
                (&b"listed"[..], false, false),
                (&b"dir"[..], true, false),
                (&b"statted"[..], false, true),
            ]
        );
        // Flag bits beyond the two are not a manifest of this format.
        let mut bad = bytes.clone();
        let at = 8 + 8 + 4 + 2 + 8 + 8 + 4 + 1; // the root's flags byte
        assert_eq!(bad[at], LISTED);
        bad[at] |= 4;
        assert!(decode(with_magic(bad, MAGIC)).is_none());
        // Format 2 (every entry stat-ed; "listed" 0 or 1) loads, known.
        let mut old = Encoder::new(b"/s", 1);
        old.push(1, b"", &attr(EntryKind::Dir, 0), true);
        old.push(1, b"f", &attr(EntryKind::File, 5), false);
        let old = with_magic(old.finish(2), MAGIC_2);
        let m = decode(old).expect("format 2 loads");
        let got: Vec<_> = m.records().map(|r| (r.listed, r.known)).collect();
        assert_eq!(got, vec![(true, true), (false, true)]);
    }

    #[test]
    fn a_format_1_manifest_is_ignored() {
        // Format 1 saved deleted and replaced entries too: not to be trusted.
        let mut e = Encoder::new(b"/s", 1);
        e.push(1, b"", &attr(EntryKind::Dir, 0), true);
        let mut bytes = e.finish(2);
        assert!(decode(&bytes[..]).is_some());
        let n = bytes.len() - 32;
        bytes[..8].copy_from_slice(b"LOCAFSN1");
        let sum = blake3::hash(&bytes[..n]);
        bytes[n..].copy_from_slice(sum.as_bytes());
        assert!(decode(bytes).is_none());
    }
}
