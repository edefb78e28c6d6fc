//! The peer wire protocol as plain code: [`Frame`] values and the bytes that
//! carry them between nodes, with no sockets, no tasks and no clocks (the
//! quinn-proto habit), so that every rule below is tested without a network.
//!
//! One request travels on one QUIC bidirectional stream: the asking node
//! writes a single [`Frame::GetBlock`] and finishes its side, the serving node
//! answers with a single [`Frame::Block`], [`Frame::NotFound`],
//! [`Frame::Busy`] or [`Frame::Error`] and finishes. The stream pairs the
//! answer with its question, so frames carry no request id.
//!
//! Every frame starts with the same 12-byte header, so any frame read on its
//! own can be checked for protocol and version:
//!
//! ```text
//! offset size  field
//!      0    4  magic        b"LCFS"
//!      4    2  version      u16 big-endian, PROTOCOL_VERSION (2)
//!      6    1  frame type   1 GetBlock, 2 Block, 3 NotFound, 4 Busy, 5 Error
//!      7    1  flags        must be 0
//!      8    4  body length  u32 big-endian, bounded per frame type
//!     12    …  body
//! ```
//!
//! Bodies (all integers big-endian; written with `bytes::BufMut` and read
//! with `Buf`, as the manifest and the cache meta are):
//! `GetBlock` = dataset `[u8;16]`, version `[u8;16]`, block `u64`,
//! block_size `u32`, then the file version the key was computed from: size
//! `u64`, mtime_ns `i64`, inode `u64`, path length `u16` and the path relative
//! to the data set root (1..=[`MAX_PATH_LEN`] bytes, no NUL, not absolute, no
//! `.` or `..` component, no empty component); `Block` = checksum `[u8;16]`
//! (xxh3-128, [`block_checksum`]) then the data (at most [`MAX_BLOCK_LEN`] bytes); `NotFound` and `Busy` are
//! empty; `Error` = code `u16` then a UTF-8 message of at most
//! [`MAX_ERROR_MESSAGE`] bytes.
//!
//! This module must never do I/O, never trust a length field before checking
//! it against the bound for its frame type (so a peer cannot make us buffer or
//! allocate more than [`MAX_FRAME`] bytes), and never panic on any input. It
//! does not verify a `Block`'s checksum: that is the reader's job (invariant
//! 1), done with [`block_checksum`] on the same bytes it will cache. A peer
//! names data by data set id and version key; the path and version it sends
//! along only let an owner that never saw the file find it, and the owner
//! accepts them only if they hash to that version key and are still the
//! current version at its source (see `peer::server`).

use bytes::{Buf, BufMut, Bytes, BytesMut};
use thiserror::Error;

use crate::cache::Checksum;

/// First four bytes of every frame; lets a node reject a stream that does not
/// speak this protocol at all.
pub const MAGIC: [u8; 4] = *b"LCFS";

/// The only protocol version this code speaks; a new wire format gets a new
/// number so that mixed-version clusters fail loudly instead of misreading.
/// Version 2: block checksums are xxh3-128 (16 bytes), not blake3 (32).
pub const PROTOCOL_VERSION: u16 = 2;

/// Size of the fixed header that precedes every frame body.
pub const HEADER_LEN: usize = 12;

/// Largest block a peer may send or ask for (16 MiB).
pub const MAX_BLOCK_LEN: usize = 16 * 1024 * 1024;

/// Largest error message, in bytes of UTF-8.
pub const MAX_ERROR_MESSAGE: usize = 256;

/// Largest frame on the wire, header included: a `Block` of
/// [`MAX_BLOCK_LEN`] bytes. The decoder never buffers more than this.
pub const MAX_FRAME: usize = HEADER_LEN + BLOCK_PREFIX_LEN + MAX_BLOCK_LEN;

/// Longest relative path a `GetBlock` may carry.
pub const MAX_PATH_LEN: usize = 4096;

/// `GetBlock` body without the path bytes.
const GET_BLOCK_FIXED_LEN: usize = 16 + 16 + 8 + 4 + 8 + 8 + 8 + 2;
const BLOCK_PREFIX_LEN: usize = 16;
const ERROR_PREFIX_LEN: usize = 2;

/// One message of the peer protocol; the only thing the transport sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// Ask for block `block` (of `block_size` bytes per block, in
    /// `1..=MAX_BLOCK_LEN`) of one version of one data set. `path` and
    /// `file` say which file version `version` is the key of.
    GetBlock {
        dataset: [u8; 16],
        version: [u8; 16],
        block: u64,
        block_size: u32,
        file: WireVersion,
        path: Bytes,
    },
    /// The bytes of the asked block, with the checksum the sender claims
    /// for them.
    Block { checksum: Checksum, data: Bytes },
    /// The serving node does not have the block and will not fetch it.
    NotFound,
    /// The serving node is overloaded; ask the next owner or the source.
    Busy,
    /// The serving node failed; `code` is for programs, `message` for people.
    Error { code: u16, message: String },
}

/// The source version of a file as it travels in a `GetBlock`: the fields
/// of `source::SourceVersion`, kept separate so this module stays pure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WireVersion {
    pub size: u64,
    pub mtime_ns: i64,
    pub ino: u64,
}

/// Names a frame type without its contents, for error messages and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameKind {
    GetBlock,
    Block,
    NotFound,
    Busy,
    Error,
}

/// Everything that can be wrong with bytes from a peer, or with a frame we
/// were asked to send; any of these ends the stream it came from.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum CodecError {
    #[error("not a locafs peer frame: bad magic")]
    BadMagic,
    #[error("unsupported peer protocol version {found} (this node speaks {supported})")]
    UnsupportedVersion { found: u16, supported: u16 },
    #[error("unknown frame type {0}")]
    UnknownFrameType(u8),
    #[error("frame flags {0:#04x} set, version 1 defines none")]
    NonZeroFlags(u8),
    #[error("{kind:?} frame body of {len} bytes, allowed {min}..={max}")]
    BodyLength {
        kind: FrameKind,
        len: u64,
        min: usize,
        max: usize,
    },
    #[error("block size {0} out of range 1..={MAX_BLOCK_LEN}")]
    BlockSizeOutOfRange(u32),
    #[error("bad path in request: {0}")]
    BadPath(&'static str),
    #[error("error message is not UTF-8")]
    MessageNotUtf8,
    #[error("stream ended inside a frame: have {have} bytes, frame needs {need}")]
    Truncated { have: usize, need: usize },
    #[error("{0} bytes after the frame")]
    TrailingBytes(usize),
}

impl FrameKind {
    fn from_wire(tag: u8) -> Result<Self, CodecError> {
        Ok(match tag {
            1 => FrameKind::GetBlock,
            2 => FrameKind::Block,
            3 => FrameKind::NotFound,
            4 => FrameKind::Busy,
            5 => FrameKind::Error,
            other => return Err(CodecError::UnknownFrameType(other)),
        })
    }

    fn wire(self) -> u8 {
        match self {
            FrameKind::GetBlock => 1,
            FrameKind::Block => 2,
            FrameKind::NotFound => 3,
            FrameKind::Busy => 4,
            FrameKind::Error => 5,
        }
    }

    /// Allowed body lengths for this frame type, inclusive.
    fn body_bounds(self, max_block_len: usize) -> (usize, usize) {
        match self {
            FrameKind::GetBlock => (GET_BLOCK_FIXED_LEN + 1, GET_BLOCK_FIXED_LEN + MAX_PATH_LEN),
            FrameKind::Block => (BLOCK_PREFIX_LEN, BLOCK_PREFIX_LEN + max_block_len),
            FrameKind::NotFound | FrameKind::Busy => (0, 0),
            FrameKind::Error => (ERROR_PREFIX_LEN, ERROR_PREFIX_LEN + MAX_ERROR_MESSAGE),
        }
    }
}

impl Frame {
    /// A `Block` reply whose checksum is computed from `data`.
    pub fn block(data: Bytes) -> Frame {
        Frame::Block {
            checksum: block_checksum(&data),
            data,
        }
    }

    /// An `Error` reply; a message longer than [`MAX_ERROR_MESSAGE`] bytes is
    /// cut at the last character boundary that fits.
    pub fn error(code: u16, message: &str) -> Frame {
        let mut end = message.len().min(MAX_ERROR_MESSAGE);
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        Frame::Error {
            code,
            message: message[..end].to_owned(),
        }
    }

    /// The type of this frame.
    pub fn kind(&self) -> FrameKind {
        match self {
            Frame::GetBlock { .. } => FrameKind::GetBlock,
            Frame::Block { .. } => FrameKind::Block,
            Frame::NotFound => FrameKind::NotFound,
            Frame::Busy => FrameKind::Busy,
            Frame::Error { .. } => FrameKind::Error,
        }
    }

    /// Bytes this frame takes on the wire, header included.
    pub fn encoded_len(&self) -> usize {
        HEADER_LEN
            + match self {
                Frame::GetBlock { path, .. } => GET_BLOCK_FIXED_LEN + path.len(),
                Frame::Block { data, .. } => BLOCK_PREFIX_LEN + data.len(),
                Frame::NotFound | Frame::Busy => 0,
                Frame::Error { message, .. } => ERROR_PREFIX_LEN + message.len(),
            }
    }
}

/// The checksum a `Block` frame's checksum must equal (the cache's).
pub use crate::cache::block_checksum;

/// Appends `frame` to `dst`. Fails, writing nothing, if the frame breaks a
/// bound the decoder enforces (block data over [`MAX_BLOCK_LEN`], message over
/// [`MAX_ERROR_MESSAGE`], block size 0 or over [`MAX_BLOCK_LEN`]), so that we
/// never send what a peer must reject.
pub fn encode(frame: &Frame, dst: &mut BytesMut) -> Result<(), CodecError> {
    let kind = frame.kind();
    let body_len = frame.encoded_len() - HEADER_LEN;
    let (min, max) = kind.body_bounds(MAX_BLOCK_LEN);
    if body_len < min || body_len > max {
        return Err(CodecError::BodyLength {
            kind,
            len: body_len as u64,
            min,
            max,
        });
    }
    if let Frame::GetBlock {
        block_size, path, ..
    } = frame
    {
        check_block_size(*block_size)?;
        check_path(path)?;
    }

    dst.reserve(HEADER_LEN + body_len);
    dst.put_slice(&MAGIC);
    dst.put_u16(PROTOCOL_VERSION);
    dst.put_u8(kind.wire());
    dst.put_u8(0);
    // body_len <= BLOCK_PREFIX_LEN + MAX_BLOCK_LEN, far below u32::MAX.
    dst.put_u32(body_len as u32);
    match frame {
        Frame::GetBlock {
            dataset,
            version,
            block,
            block_size,
            file,
            path,
        } => {
            dst.put_slice(dataset);
            dst.put_slice(version);
            dst.put_u64(*block);
            dst.put_u32(*block_size);
            dst.put_u64(file.size);
            dst.put_i64(file.mtime_ns);
            dst.put_u64(file.ino);
            // check_path bounded it to MAX_PATH_LEN.
            dst.put_u16(path.len() as u16);
            dst.put_slice(path);
        }
        Frame::Block { checksum, data } => {
            dst.put_slice(checksum);
            dst.put_slice(data);
        }
        Frame::NotFound | Frame::Busy => {}
        Frame::Error { code, message } => {
            dst.put_u16(*code);
            dst.put_slice(message.as_bytes());
        }
    }
    Ok(())
}

/// Like [`encode`], but as chunks to send in order, without copying block
/// data: a `Block` is its header and checksum, then its data as it is.
pub fn encode_chunks(frame: &Frame) -> Result<Vec<Bytes>, CodecError> {
    match frame {
        Frame::Block { checksum, data } => {
            // Encode an empty block for the bounds checks, then fix the length.
            let empty = Frame::Block {
                checksum: *checksum,
                data: Bytes::new(),
            };
            let body_len = BLOCK_PREFIX_LEN + data.len();
            let (min, max) = FrameKind::Block.body_bounds(MAX_BLOCK_LEN);
            if body_len < min || body_len > max {
                return Err(CodecError::BodyLength {
                    kind: FrameKind::Block,
                    len: body_len as u64,
                    min,
                    max,
                });
            }
            let mut head = BytesMut::with_capacity(HEADER_LEN + BLOCK_PREFIX_LEN);
            encode(&empty, &mut head)?;
            // body_len <= BLOCK_PREFIX_LEN + MAX_BLOCK_LEN, far below u32::MAX.
            (&mut head[8..12]).put_u32(body_len as u32);
            Ok(vec![head.freeze(), data.clone()])
        }
        other => {
            let mut out = BytesMut::with_capacity(other.encoded_len());
            encode(other, &mut out)?;
            Ok(vec![out.freeze()])
        }
    }
}

/// Decodes `buf` as exactly one whole frame (what a stream carried to its
/// end), with a `Block` data limit of `max_block_len`. Block data is a
/// slice of `buf`, not a copy. Missing or extra bytes are errors.
pub fn decode_whole(buf: Bytes, max_block_len: usize) -> Result<Frame, CodecError> {
    let Some((kind, body_len)) = header(&buf, max_block_len)? else {
        return Err(CodecError::Truncated {
            have: buf.len(),
            need: HEADER_LEN,
        });
    };
    let need = HEADER_LEN + body_len;
    if buf.len() < need {
        return Err(CodecError::Truncated {
            have: buf.len(),
            need,
        });
    }
    if buf.len() > need {
        return Err(CodecError::TrailingBytes(buf.len() - need));
    }
    Ok(match parse_body(kind, &buf[HEADER_LEN..])? {
        Frame::Block { checksum, .. } => Frame::Block {
            checksum,
            data: buf.slice(HEADER_LEN + BLOCK_PREFIX_LEN..),
        },
        other => other,
    })
}

/// Checks the header at the start of `buf` and returns the length of the
/// whole frame (header plus body), or `None` if the header is not all there
/// yet. Wrong bytes are reported as soon as they arrive, so garbage is
/// rejected without waiting for a full header.
pub fn frame_len(buf: &[u8]) -> Result<Option<usize>, CodecError> {
    frame_len_limited(buf, MAX_BLOCK_LEN)
}

/// Like [`frame_len`], but with a `Block` data limit of `max_block_len`
/// (clamped to [`MAX_BLOCK_LEN`]), for a node that only expects small blocks.
pub fn frame_len_limited(buf: &[u8], max_block_len: usize) -> Result<Option<usize>, CodecError> {
    header(buf, max_block_len).map(|h| h.map(|(_, body_len)| HEADER_LEN + body_len))
}

/// Takes one frame off the front of `src`. Returns `Ok(None)` and leaves
/// `src` untouched when more bytes are needed; on error `src` is left as it
/// was and the stream must be dropped. Block data is split off `src` without
/// copying.
pub fn decode(src: &mut BytesMut) -> Result<Option<Frame>, CodecError> {
    decode_limited(src, MAX_BLOCK_LEN)
}

/// Like [`decode`], with a `Block` data limit of `max_block_len` (clamped to
/// [`MAX_BLOCK_LEN`]).
pub fn decode_limited(
    src: &mut BytesMut,
    max_block_len: usize,
) -> Result<Option<Frame>, CodecError> {
    let Some((kind, body_len)) = header(src, max_block_len)? else {
        return Ok(None);
    };
    if src.len() < HEADER_LEN + body_len {
        return Ok(None);
    }
    let frame = parse_body(kind, &src[HEADER_LEN..HEADER_LEN + body_len])?;
    // Only now, with a valid frame in hand, consume its bytes.
    src.advance(HEADER_LEN);
    let mut body = src.split_to(body_len);
    Ok(Some(match frame {
        Frame::Block { checksum, .. } => {
            body.advance(BLOCK_PREFIX_LEN);
            Frame::Block {
                checksum,
                data: body.freeze(),
            }
        }
        other => other,
    }))
}

/// Like [`decode`], for when the stream has ended: bytes left over that do
/// not make a whole frame are an error instead of `Ok(None)`.
pub fn decode_eof(src: &mut BytesMut) -> Result<Option<Frame>, CodecError> {
    match decode(src)? {
        Some(frame) => Ok(Some(frame)),
        None if src.is_empty() => Ok(None),
        None => Err(CodecError::Truncated {
            have: src.len(),
            need: frame_len(src)?.unwrap_or(HEADER_LEN),
        }),
    }
}

/// Validates as much of the header as `buf` holds; returns the frame type and
/// body length once the header is complete.
fn header(buf: &[u8], max_block_len: usize) -> Result<Option<(FrameKind, usize)>, CodecError> {
    let magic_seen = buf.len().min(MAGIC.len());
    if buf[..magic_seen] != MAGIC[..magic_seen] {
        return Err(CodecError::BadMagic);
    }
    if buf.len() >= 6 {
        let found = (&buf[4..6]).get_u16();
        if found != PROTOCOL_VERSION {
            return Err(CodecError::UnsupportedVersion {
                found,
                supported: PROTOCOL_VERSION,
            });
        }
    }
    if buf.len() >= 7 {
        FrameKind::from_wire(buf[6])?;
    }
    if buf.len() >= 8 && buf[7] != 0 {
        return Err(CodecError::NonZeroFlags(buf[7]));
    }
    if buf.len() < HEADER_LEN {
        return Ok(None);
    }
    let kind = FrameKind::from_wire(buf[6])?;
    let len = (&buf[8..12]).get_u32();
    let (min, max) = kind.body_bounds(max_block_len.min(MAX_BLOCK_LEN));
    // Compare in u64 so no length field can wrap on any platform.
    if u64::from(len) < min as u64 || u64::from(len) > max as u64 {
        return Err(CodecError::BodyLength {
            kind,
            len: u64::from(len),
            min,
            max,
        });
    }
    Ok(Some((kind, len as usize)))
}

/// Parses a complete body whose length already fits `kind`'s bounds. `Block`
/// data is returned empty; the caller splits it off without copying.
fn parse_body(kind: FrameKind, mut body: &[u8]) -> Result<Frame, CodecError> {
    Ok(match kind {
        FrameKind::GetBlock => {
            let mut dataset = [0; 16];
            let mut version = [0; 16];
            body.copy_to_slice(&mut dataset);
            body.copy_to_slice(&mut version);
            let block = body.get_u64();
            let block_size = body.get_u32();
            check_block_size(block_size)?;
            let file = WireVersion {
                size: body.get_u64(),
                mtime_ns: body.get_i64(),
                ino: body.get_u64(),
            };
            let plen = body.get_u16() as usize;
            if plen != body.len() {
                return Err(CodecError::BadPath("length field disagrees with the frame"));
            }
            check_path(body)?;
            Frame::GetBlock {
                dataset,
                version,
                block,
                block_size,
                file,
                path: Bytes::copy_from_slice(body),
            }
        }
        FrameKind::Block => {
            let mut checksum = Checksum::default();
            body.copy_to_slice(&mut checksum);
            Frame::Block {
                checksum,
                data: Bytes::new(),
            }
        }
        FrameKind::NotFound => Frame::NotFound,
        FrameKind::Busy => Frame::Busy,
        FrameKind::Error => {
            let code = body.get_u16();
            let message = std::str::from_utf8(body)
                .map_err(|_| CodecError::MessageNotUtf8)?
                .to_owned();
            Frame::Error { code, message }
        }
    })
}

/// A path a peer may name: relative to the data set root, made of plain
/// components only, so it can never leave the data set.
pub fn check_path(path: &[u8]) -> Result<(), CodecError> {
    if path.is_empty() {
        return Err(CodecError::BadPath("empty"));
    }
    if path.len() > MAX_PATH_LEN {
        return Err(CodecError::BadPath("too long"));
    }
    if path.contains(&0) {
        return Err(CodecError::BadPath("contains NUL"));
    }
    if path[0] == b'/' {
        return Err(CodecError::BadPath("absolute"));
    }
    for c in path.split(|b| *b == b'/') {
        match c {
            b"" => return Err(CodecError::BadPath("empty component")),
            b"." | b".." => return Err(CodecError::BadPath("dot component")),
            _ => {}
        }
    }
    Ok(())
}

fn check_block_size(block_size: u32) -> Result<(), CodecError> {
    if block_size == 0 || block_size as usize > MAX_BLOCK_LEN {
        return Err(CodecError::BlockSizeOutOfRange(block_size));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn arb_frame() -> impl Strategy<Value = Frame> {
        prop_oneof![
            (
                any::<[u8; 16]>(),
                any::<[u8; 16]>(),
                any::<u64>(),
                1..=MAX_BLOCK_LEN as u32,
                any::<(u64, i64, u64)>(),
                "[a-z0-9_]{1,12}(/[a-zA-Z0-9_.-]{1,12}){0,3}"
                    .prop_filter("no dot components", |p| check_path(p.as_bytes()).is_ok()),
            )
                .prop_map(
                    |(dataset, version, block, block_size, (size, mtime_ns, ino), path)| {
                        Frame::GetBlock {
                            dataset,
                            version,
                            block,
                            block_size,
                            file: WireVersion {
                                size,
                                mtime_ns,
                                ino,
                            },
                            path: Bytes::from(path),
                        }
                    }
                ),
            (
                any::<Checksum>(),
                prop::collection::vec(any::<u8>(), 0..4096)
            )
                .prop_map(|(checksum, data)| Frame::Block {
                    checksum,
                    data: Bytes::from(data),
                }),
            Just(Frame::NotFound),
            Just(Frame::Busy),
            (any::<u16>(), ".{0,80}").prop_map(|(code, msg)| Frame::error(code, &msg)),
        ]
    }

    fn encoded(frame: &Frame) -> BytesMut {
        let mut buf = BytesMut::new();
        encode(frame, &mut buf).expect("valid frame encodes");
        buf
    }

    fn header_bytes(tag: u8, len: u32) -> BytesMut {
        let mut buf = BytesMut::new();
        buf.put_slice(&MAGIC);
        buf.put_u16(PROTOCOL_VERSION);
        buf.put_u8(tag);
        buf.put_u8(0);
        buf.put_u32(len);
        buf
    }

    /// Decodes everything in `buf` until it needs more bytes or fails;
    /// checks on the way that a returned frame re-encodes to the bytes it
    /// consumed.
    fn decode_all(mut buf: BytesMut) {
        loop {
            let before = buf.clone();
            match decode(&mut buf) {
                Ok(Some(frame)) => {
                    let consumed = before.len() - buf.len();
                    assert_eq!(consumed, frame.encoded_len());
                    assert!(consumed <= MAX_FRAME);
                    assert_eq!(&encoded(&frame)[..], &before[..consumed]);
                }
                Ok(None) => {
                    assert_eq!(buf, before, "Ok(None) must not consume");
                    return;
                }
                Err(_) => {
                    assert_eq!(buf, before, "an error must not consume");
                    return;
                }
            }
        }
    }

    proptest! {
        #[test]
        fn every_frame_round_trips(frame in arb_frame()) {
            let mut buf = encoded(&frame);
            prop_assert_eq!(buf.len(), frame.encoded_len());
            prop_assert_eq!(frame_len(&buf), Ok(Some(buf.len())));
            let decoded = decode(&mut buf).unwrap();
            prop_assert_eq!(decoded, Some(frame));
            prop_assert!(buf.is_empty());
        }

        #[test]
        fn chunks_are_the_encoding_and_decode_whole_reads_it_back(frame in arb_frame()) {
            let chunks = encode_chunks(&frame).unwrap();
            let joined: Vec<u8> = chunks.iter().flat_map(|c| c.iter().copied()).collect();
            prop_assert_eq!(&joined[..], &encoded(&frame)[..]);
            prop_assert_eq!(decode_whole(Bytes::from(joined), MAX_BLOCK_LEN), Ok(frame));
        }

        #[test]
        fn decode_whole_refuses_cut_or_padded_frames(
            frame in arb_frame(),
            cut in any::<prop::sample::Index>(),
            tail in prop::collection::vec(any::<u8>(), 1..16),
        ) {
            let buf = encoded(&frame);
            let short = Bytes::copy_from_slice(&buf[..cut.index(buf.len())]);
            prop_assert!(decode_whole(short, MAX_BLOCK_LEN).is_err());
            let mut long = buf.to_vec();
            long.extend_from_slice(&tail);
            prop_assert!(decode_whole(Bytes::from(long), MAX_BLOCK_LEN).is_err());
        }

        #[test]
        fn frames_round_trip_back_to_back(frames in prop::collection::vec(arb_frame(), 0..8)) {
            let mut buf = BytesMut::new();
            for f in &frames {
                encode(f, &mut buf).unwrap();
            }
            let mut out = Vec::new();
            while let Some(f) = decode_eof(&mut buf).unwrap() {
                out.push(f);
            }
            prop_assert_eq!(out, frames);
        }

        #[test]
        fn every_prefix_of_a_frame_asks_for_more(frame in arb_frame(), cut in any::<prop::sample::Index>()) {
            let buf = encoded(&frame);
            let mut prefix = BytesMut::from(&buf[..cut.index(buf.len())]);
            let before = prefix.clone();
            prop_assert_eq!(decode(&mut prefix), Ok(None));
            prop_assert_eq!(prefix, before);
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
            decode_all(BytesMut::from(&bytes[..]));
            let _ = decode_whole(Bytes::copy_from_slice(&bytes), MAX_BLOCK_LEN);
            let _ = frame_len(&bytes);
            let _ = decode_eof(&mut BytesMut::from(&bytes[..]));
        }

        #[test]
        fn arbitrary_bytes_after_a_valid_header_never_panic(
            tag in 0u8..8,
            len in prop_oneof![0u32..100, any::<u32>()],
            body in prop::collection::vec(any::<u8>(), 0..256),
        ) {
            let mut buf = header_bytes(tag, len);
            buf.put_slice(&body);
            decode_all(buf);
        }

        #[test]
        fn mutated_and_truncated_frames_never_panic(
            frame in arb_frame(),
            flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
            cut in any::<prop::sample::Index>(),
            tail in prop::collection::vec(any::<u8>(), 0..64),
        ) {
            let mut buf = encoded(&frame);
            for (at, x) in flips {
                let i = at.index(buf.len());
                buf[i] ^= x;
            }
            buf.truncate(cut.index(buf.len() + 1));
            buf.put_slice(&tail);
            decode_all(buf);
        }
    }

    #[test]
    fn oversized_block_length_is_rejected_from_the_header_alone() {
        let too_big = (BLOCK_PREFIX_LEN + MAX_BLOCK_LEN + 1) as u32;
        let mut buf = header_bytes(FrameKind::Block.wire(), too_big);
        assert!(matches!(
            decode(&mut buf),
            Err(CodecError::BodyLength {
                kind: FrameKind::Block,
                ..
            })
        ));
        let mut buf = header_bytes(FrameKind::Block.wire(), u32::MAX);
        assert!(decode(&mut buf).is_err());
        assert!(frame_len(&buf).is_err());
    }

    #[test]
    fn largest_block_is_accepted_and_limit_is_configurable() {
        let frame = Frame::block(Bytes::from(vec![7u8; MAX_BLOCK_LEN]));
        let mut buf = encoded(&frame);
        assert_eq!(buf.len(), MAX_FRAME);
        let mut small = buf.clone();
        assert!(matches!(
            decode_limited(&mut small, 1024),
            Err(CodecError::BodyLength { max: 1040, .. })
        ));
        assert_eq!(decode(&mut buf).unwrap(), Some(frame));
    }

    #[test]
    fn fixed_size_frames_reject_other_lengths() {
        for (kind, len) in [
            (FrameKind::GetBlock, GET_BLOCK_FIXED_LEN as u32),
            (
                FrameKind::GetBlock,
                (GET_BLOCK_FIXED_LEN + MAX_PATH_LEN + 1) as u32,
            ),
            (FrameKind::NotFound, 1),
            (FrameKind::Busy, 1),
            (FrameKind::Error, 1),
            (
                FrameKind::Error,
                (ERROR_PREFIX_LEN + MAX_ERROR_MESSAGE + 1) as u32,
            ),
            (FrameKind::Block, BLOCK_PREFIX_LEN as u32 - 1),
        ] {
            let mut buf = header_bytes(kind.wire(), len);
            assert!(
                matches!(decode(&mut buf), Err(CodecError::BodyLength { .. })),
                "{kind:?} with {len}"
            );
        }
    }

    #[test]
    fn wrong_magic_is_rejected_early() {
        assert_eq!(
            decode(&mut BytesMut::from(&b"LX"[..])),
            Err(CodecError::BadMagic)
        );
        let mut buf = encoded(&Frame::Busy);
        buf[0] = b'X';
        assert_eq!(decode(&mut buf), Err(CodecError::BadMagic));
        // HTTP or TLS bytes by mistake.
        assert_eq!(
            decode(&mut BytesMut::from(&b"GET / HTTP/1.1\r\n"[..])),
            Err(CodecError::BadMagic)
        );
    }

    #[test]
    fn wrong_version_is_rejected() {
        let mut buf = encoded(&Frame::NotFound);
        // Version 1 (blake3 checksums of 32 bytes) and a future version.
        for found in [1u16, 3] {
            let mut buf = buf.clone();
            (&mut buf[4..6]).put_u16(found);
            assert_eq!(
                decode(&mut buf),
                Err(CodecError::UnsupportedVersion {
                    found,
                    supported: 2
                })
            );
        }
        (&mut buf[4..6]).put_u16(3);
        // Reported before the rest of the header arrives.
        let mut partial = BytesMut::from(&buf[..6]);
        assert!(matches!(
            decode(&mut partial),
            Err(CodecError::UnsupportedVersion { .. })
        ));
    }

    #[test]
    fn unknown_frame_type_and_flags_are_rejected() {
        for tag in [0u8, 6, 255] {
            let mut buf = header_bytes(tag, 0);
            assert_eq!(decode(&mut buf), Err(CodecError::UnknownFrameType(tag)));
        }
        let mut buf = encoded(&Frame::Busy);
        buf[7] = 0x80;
        assert_eq!(decode(&mut buf), Err(CodecError::NonZeroFlags(0x80)));
    }

    #[test]
    fn truncated_frame_waits_then_fails_at_end_of_stream() {
        let frame = Frame::block(Bytes::from_static(b"some block bytes"));
        let full = encoded(&frame);
        let mut buf = BytesMut::from(&full[..full.len() - 1]);
        assert_eq!(decode(&mut buf), Ok(None));
        assert_eq!(
            decode_eof(&mut buf),
            Err(CodecError::Truncated {
                have: full.len() - 1,
                need: full.len()
            })
        );
        let mut short_header = BytesMut::from(&full[..5]);
        assert_eq!(
            decode_eof(&mut short_header),
            Err(CodecError::Truncated {
                have: 5,
                need: HEADER_LEN
            })
        );
        assert_eq!(decode_eof(&mut BytesMut::new()), Ok(None));
    }

    #[test]
    fn get_block_with_bad_block_size_is_rejected_both_ways() {
        for block_size in [0, MAX_BLOCK_LEN as u32 + 1] {
            let frame = get_block(block_size, b"a/b");
            let mut out = BytesMut::new();
            assert_eq!(
                encode(&frame, &mut out),
                Err(CodecError::BlockSizeOutOfRange(block_size))
            );
            assert!(out.is_empty());
            let mut wire = header_bytes(FrameKind::GetBlock.wire(), GET_BLOCK_FIXED_LEN as u32 + 1);
            wire.put_slice(&[0; 40]);
            wire.put_u32(block_size);
            wire.put_slice(&[0; 24]);
            wire.put_u16(1);
            wire.put_u8(b'a');
            assert_eq!(
                decode(&mut wire),
                Err(CodecError::BlockSizeOutOfRange(block_size))
            );
        }
    }

    fn get_block(block_size: u32, path: &[u8]) -> Frame {
        Frame::GetBlock {
            dataset: [1; 16],
            version: [2; 16],
            block: 3,
            block_size,
            file: WireVersion {
                size: 10,
                mtime_ns: -5,
                ino: 7,
            },
            path: Bytes::copy_from_slice(path),
        }
    }

    /// The wire bytes of a GetBlock with `path`, bypassing encode's checks.
    fn raw_get_block(path: &[u8], plen: u16) -> BytesMut {
        let mut wire = header_bytes(
            FrameKind::GetBlock.wire(),
            (GET_BLOCK_FIXED_LEN + path.len()) as u32,
        );
        wire.put_slice(&[0; 40]);
        wire.put_u32(4096);
        wire.put_slice(&[0; 24]);
        wire.put_u16(plen);
        wire.put_slice(path);
        wire
    }

    #[test]
    fn paths_that_could_leave_the_data_set_are_rejected_both_ways() {
        let nul: &[u8] = b"a\0b";
        let long = vec![b'x'; MAX_PATH_LEN + 1];
        for bad in [
            &b"/etc/passwd"[..],
            b"..",
            b"../x",
            b"a/../../x",
            b"a/./b",
            b"a//b",
            b"a/",
            nul,
            &long,
        ] {
            assert!(
                check_path(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
            assert!(encode(&get_block(4096, bad), &mut BytesMut::new()).is_err());
            if bad.len() <= MAX_PATH_LEN {
                let mut wire = raw_get_block(bad, bad.len() as u16);
                assert!(
                    matches!(decode(&mut wire), Err(CodecError::BadPath(_))),
                    "{:?}",
                    String::from_utf8_lossy(bad)
                );
            }
        }
        for good in [&b"a"[..], b"train/n0144/img_1.JPEG", b"...x", b"a/.hidden"] {
            assert!(check_path(good).is_ok());
            let mut buf = encoded(&get_block(4096, good));
            assert_eq!(decode(&mut buf).unwrap(), Some(get_block(4096, good)));
        }
        // A path length field that disagrees with the frame length.
        let mut wire = raw_get_block(b"abc", 2);
        assert!(matches!(decode(&mut wire), Err(CodecError::BadPath(_))));
    }

    #[test]
    fn error_message_is_bounded_and_utf8() {
        let long = "é".repeat(MAX_ERROR_MESSAGE);
        let Frame::Error { message, .. } = Frame::error(9, &long) else {
            unreachable!()
        };
        assert!(message.len() <= MAX_ERROR_MESSAGE);
        assert!(long.starts_with(&message));

        let unbounded = Frame::Error {
            code: 1,
            message: "x".repeat(MAX_ERROR_MESSAGE + 1),
        };
        assert!(encode(&unbounded, &mut BytesMut::new()).is_err());

        let mut wire = header_bytes(FrameKind::Error.wire(), 4);
        wire.put_u16(5);
        wire.put_slice(&[0xff, 0xfe]);
        assert_eq!(decode(&mut wire), Err(CodecError::MessageNotUtf8));
    }

    /// `hex` with spaces and newlines for reading, as bytes.
    fn unhex(hex: &str) -> Vec<u8> {
        let digits: Vec<u8> = hex.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
        digits
            .chunks(2)
            .map(|d| u8::from_str_radix(std::str::from_utf8(d).unwrap(), 16).unwrap())
            .collect()
    }

    /// Today's wire bytes of every frame type, pinned: an encoding change
    /// (byte order, field order, widths) must show here and come with a new
    /// PROTOCOL_VERSION.
    #[test]
    fn the_wire_format_is_pinned_byte_for_byte() {
        let golden = [
            (
                get_block(4096, b"a/b"),
                "4c434653 0002 01 00 00000049
                 01010101010101010101010101010101
                 02020202020202020202020202020202
                 0000000000000003 00001000
                 000000000000000a fffffffffffffffb 0000000000000007
                 0003 612f62",
            ),
            (
                Frame::Block {
                    checksum: [0x11; 16],
                    data: Bytes::from_static(b"xyz"),
                },
                "4c434653 0002 02 00 00000013 11111111111111111111111111111111 78797a",
            ),
            (Frame::NotFound, "4c434653 0002 03 00 00000000"),
            (Frame::Busy, "4c434653 0002 04 00 00000000"),
            (
                Frame::Error {
                    code: 0x1234,
                    message: "no".into(),
                },
                "4c434653 0002 05 00 00000004 1234 6e6f",
            ),
        ];
        for (frame, hex) in golden {
            let want = unhex(hex);
            assert_eq!(&encoded(&frame)[..], &want[..], "{frame:?}");
            let chunks: Vec<u8> = encode_chunks(&frame).unwrap().concat();
            assert_eq!(chunks, want, "{frame:?} in chunks");
            assert_eq!(frame_len(&want), Ok(Some(want.len())));
            let mut buf = BytesMut::from(&want[..]);
            assert_eq!(decode(&mut buf), Ok(Some(frame.clone())));
            assert_eq!(decode_whole(Bytes::from(want), MAX_BLOCK_LEN), Ok(frame));
        }
    }

    #[test]
    fn block_helper_sets_the_cache_checksum() {
        let data = Bytes::from_static(b"abc");
        let Frame::Block { checksum, .. } = Frame::block(data) else {
            unreachable!()
        };
        assert_eq!(checksum, xxhash_rust::xxh3::xxh3_128(b"abc").to_le_bytes());
        assert_eq!(checksum, crate::cache::block_checksum(b"abc"));
    }
}
