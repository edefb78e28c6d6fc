//! The serving side of the peer cache: answers other nodes' `GetBlock`
//! requests for blocks this node owns.
//!
//! Only peers that passed mutual TLS with the cluster CA get a connection
//! (see `tls`); everything they send is still treated as hostile. A request
//! is answered only if it names this node's data set and block size, a valid
//! relative path whose version hashes to the requested version key, and that
//! path is, right now at this node's source, a regular file of exactly that
//! version reached through real directories (no symlink on the way). The
//! block then comes from `Reader::fetch_for_peer`: the local cache, else the
//! source through the same single flight as local reads, never forwarded to
//! another peer.
//!
//! Bounds: a request must arrive whole within the peer timeout and be at most
//! one `GetBlock` frame; a connection may have [`STREAMS_PER_CONNECTION`]
//! streams open; one peer (one remote address) may hold
//! [`CONNECTIONS_PER_PEER`] connections and one remote host
//! [`CONNECTIONS_PER_HOST`] (more are closed after the handshake and counted
//! as refused); one peer gets at most [`REQUESTS_PER_PEER`] requests served
//! at once and all peers together at most `slots` (more get `Busy` at once),
//! so memory for replies is bounded by slots x block size and no single peer
//! can take all of it. A malformed request gets an `Error` reply and ends its
//! stream; nothing a peer sends can panic this module or stop it serving.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::hash::Hash;
use std::net::{IpAddr, SocketAddr};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use parking_lot::Mutex;
use tokio::sync::Semaphore;
use tracing::{debug, info};

use super::codec::{self, Frame};
use super::membership::Membership;
use crate::cache::{FileVersion, VersionKey};
use crate::reader::Reader;
use crate::source::{EntryKind, Source, SourceVersion};
use crate::stats::Stats;

/// Streams a peer may have open on one connection.
pub const STREAMS_PER_CONNECTION: u32 = 64;
/// Connections one peer (remote `ip:port`) may hold at once. An honest node
/// holds one (from its listening endpoint), two for a moment while it
/// reconnects before we noticed the old one is dead.
pub const CONNECTIONS_PER_PEER: usize = 4;
/// Connections from one remote IP address at once (several nodes may share
/// a machine).
pub const CONNECTIONS_PER_HOST: usize = 32;
/// Requests of one peer served at once; an honest node sends at most
/// `membership::STREAMS_PER_PEER` at a time.
pub const REQUESTS_PER_PEER: usize = super::membership::STREAMS_PER_PEER;

/// Error codes of `Error` replies.
pub mod code {
    pub const MALFORMED: u16 = 1;
    pub const WRONG_BLOCK_SIZE: u16 = 2;
    pub const VERSION_MISMATCH: u16 = 3;
    pub const SOURCE_FAILED: u16 = 4;
    pub const TIMEOUT: u16 = 5;
}

/// What a node serves to its peers.
pub struct PeerServer {
    pub dataset: [u8; 16],
    pub block_size: u64,
    pub timeout: Duration,
    pub reader: Arc<Reader>,
    pub source: Arc<dyn Source>,
    pub membership: Arc<Membership>,
    pub stats: Arc<Stats>,
    /// Requests being served at once, across all peers.
    pub slots: Arc<Semaphore>,
    /// Connections and requests per peer.
    pub limits: Arc<PeerLimits>,
}

/// Counts of what each peer holds now, with RAII [`Held`] tokens.
#[derive(Default)]
pub struct PeerLimits {
    conns: Counter<SocketAddr>,
    hosts: Counter<IpAddr>,
    requests: Counter<SocketAddr>,
}

/// One unit held under a limit; released when dropped.
pub struct Held {
    release: Vec<Box<dyn FnOnce() + Send + Sync>>,
}

impl Drop for Held {
    fn drop(&mut self) {
        for r in self.release.drain(..) {
            r();
        }
    }
}

struct Counter<K>(Arc<Mutex<HashMap<K, usize>>>);

impl<K> Default for Counter<K> {
    fn default() -> Self {
        Counter(Arc::default())
    }
}

impl<K: Hash + Eq + Copy + Send + Sync + 'static> Counter<K> {
    /// Takes one unit for `k` if it has fewer than `max`.
    fn take(&self, k: K, max: usize) -> Option<Box<dyn FnOnce() + Send + Sync>> {
        let mut m = self.0.lock();
        let n = m.entry(k).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        let map = Arc::clone(&self.0);
        Some(Box::new(move || {
            let mut m = map.lock();
            if let Some(n) = m.get_mut(&k) {
                *n -= 1;
                if *n == 0 {
                    m.remove(&k);
                }
            }
        }))
    }

    fn get(&self, k: &K) -> usize {
        self.0.lock().get(k).copied().unwrap_or(0)
    }
}

impl PeerLimits {
    /// A connection from `remote`, if neither it nor its host is at its
    /// limit.
    pub fn connection(&self, remote: SocketAddr) -> Option<Held> {
        let ip = remote.ip().to_canonical();
        let remote = SocketAddr::new(ip, remote.port());
        let host = self.hosts.take(ip, CONNECTIONS_PER_HOST)?;
        let Some(peer) = self.conns.take(remote, CONNECTIONS_PER_PEER) else {
            host();
            return None;
        };
        Some(Held {
            release: vec![peer, host],
        })
    }

    /// A request of `remote` being served, if it has fewer than
    /// [`REQUESTS_PER_PEER`].
    pub fn request(&self, remote: SocketAddr) -> Option<Held> {
        let remote = SocketAddr::new(remote.ip().to_canonical(), remote.port());
        let r = self.requests.take(remote, REQUESTS_PER_PEER)?;
        Some(Held { release: vec![r] })
    }

    /// Connections `remote` holds now.
    pub fn connections_of(&self, remote: SocketAddr) -> usize {
        self.conns
            .get(&SocketAddr::new(remote.ip().to_canonical(), remote.port()))
    }
}

impl PeerServer {
    /// Accepts connections until the endpoint closes.
    pub async fn run(self: Arc<Self>, endpoint: quinn::Endpoint) {
        while let Some(incoming) = endpoint.accept().await {
            let me = Arc::clone(&self);
            tokio::spawn(async move {
                let remote = incoming.remote_address();
                match tokio::time::timeout(me.timeout.max(Duration::from_secs(5)), incoming).await {
                    Ok(Ok(conn)) => me.serve_connection(conn).await,
                    Ok(Err(e)) => {
                        me.stats.peer_refused_connections.fetch_add(1, Relaxed);
                        info!("peer connection from {remote} refused: {e}");
                    }
                    Err(_) => {
                        me.stats.peer_refused_connections.fetch_add(1, Relaxed);
                        debug!("peer handshake from {remote} timed out");
                    }
                }
            });
        }
    }

    async fn serve_connection(self: Arc<Self>, conn: quinn::Connection) {
        let remote = conn.remote_address();
        // Before any limit: this may be our own connection to ourselves.
        self.membership.note_accepted(&conn);
        let Some(_held) = self.limits.connection(remote) else {
            self.stats.peer_refused_connections.fetch_add(1, Relaxed);
            info!("peer connection from {remote} refused: too many connections from it");
            conn.close(2u32.into(), b"too many connections");
            return;
        };
        self.membership.note_incoming(remote);
        while let Ok((send, recv)) = conn.accept_bi().await {
            let me = Arc::clone(&self);
            tokio::spawn(async move { me.serve_stream(remote, send, recv).await });
        }
    }

    async fn serve_stream(
        self: Arc<Self>,
        remote: SocketAddr,
        mut send: quinn::SendStream,
        mut recv: quinn::RecvStream,
    ) {
        let limit = codec::HEADER_LEN + 16 + 16 + 8 + 4 + 26 + codec::MAX_PATH_LEN;
        let reply = match tokio::time::timeout(self.timeout, recv.read_to_end(limit)).await {
            Err(_) => Frame::error(code::TIMEOUT, "request not received in time"),
            Ok(Err(e)) => {
                self.stats.peer_bad_requests.fetch_add(1, Relaxed);
                Frame::error(code::MALFORMED, &format!("bad request stream: {e}"))
            }
            Ok(Ok(raw)) => {
                let mut buf = BytesMut::from(&raw[..]);
                match codec::decode_eof(&mut buf) {
                    Ok(Some(frame)) if buf.is_empty() => self.answer(remote, frame).await,
                    Ok(_) => {
                        self.stats.peer_bad_requests.fetch_add(1, Relaxed);
                        Frame::error(code::MALFORMED, "expected exactly one GetBlock frame")
                    }
                    Err(e) => {
                        self.stats.peer_bad_requests.fetch_add(1, Relaxed);
                        Frame::error(code::MALFORMED, &e.to_string())
                    }
                }
            }
        };
        // Block data goes out as it is held (no copy into a frame buffer).
        if let Ok(mut chunks) = codec::encode_chunks(&reply) {
            let _ = tokio::time::timeout(self.timeout, send.write_all_chunks(&mut chunks)).await;
        }
        let _ = send.finish();
    }

    async fn answer(&self, remote: SocketAddr, frame: Frame) -> Frame {
        let (fv, block) = match check_request(&self.dataset, self.block_size, frame) {
            Ok(ok) => ok,
            Err(Refusal { reply, hostile }) => {
                if hostile {
                    self.stats.peer_bad_requests.fetch_add(1, Relaxed);
                }
                return reply;
            }
        };
        let (rel, v) = (Arc::clone(&fv.rel), fv.version);
        let Some(mine) = self.limits.request(remote) else {
            return Frame::Busy;
        };
        let Ok(permit) = Arc::clone(&self.slots).try_acquire_owned() else {
            return Frame::Busy;
        };
        let source = Arc::clone(&self.source);
        let rel2 = Arc::clone(&rel);
        let current = tokio::task::spawn_blocking(move || is_current(&*source, &rel2, &v))
            .await
            .unwrap_or(false);
        if !current {
            return Frame::NotFound;
        }
        let res = Arc::clone(&self.reader).fetch_for_peer(fv, block).await;
        drop(permit);
        drop(mine);
        match res {
            Ok(b) => {
                let n = b.data().len() as u64;
                self.stats.peer_served_bytes.fetch_add(n, Relaxed);
                if let Some(m) = self.membership.member_at(&remote) {
                    m.bytes_sent.fetch_add(n, Relaxed);
                }
                Frame::Block {
                    checksum: *b.checksum(),
                    data: b.data().clone(),
                }
            }
            Err(e) => Frame::error(code::SOURCE_FAILED, &e.to_string()),
        }
    }
}

/// Why a request is not served: the reply to send, and whether the request
/// was one an honest node never sends (counted as a bad request).
#[derive(Debug, PartialEq, Eq)]
pub struct Refusal {
    pub reply: Frame,
    pub hostile: bool,
}

/// Everything about a decoded request that can be checked without the
/// source: it is a `GetBlock` for this node's data set (`dataset`) and block
/// size, its version key is the hash of the path and version it names (the
/// codec already checked that the path is relative with plain components),
/// and the block is inside the file. Returns the file version and block to
/// serve, or the reply. Pure, so it is property-tested and fuzzed on its own
/// (fuzz/fuzz_targets/peer_request.rs); must never panic on any frame.
pub fn check_request(
    dataset: &[u8; 16],
    block_size: u64,
    frame: Frame,
) -> Result<(Arc<FileVersion>, u64), Refusal> {
    let refuse = |reply, hostile| Err(Refusal { reply, hostile });
    let Frame::GetBlock {
        dataset: asked,
        version,
        block,
        block_size: asked_block_size,
        file,
        path,
    } = frame
    else {
        return refuse(
            Frame::error(code::MALFORMED, "only GetBlock may be sent to a node"),
            true,
        );
    };
    if asked != *dataset {
        return refuse(Frame::NotFound, false);
    }
    if u64::from(asked_block_size) != block_size || block_size == 0 {
        return refuse(
            Frame::error(
                code::WRONG_BLOCK_SIZE,
                "block size differs from this node's",
            ),
            false,
        );
    }
    // The decoder checked the path; a frame built in memory may not have been.
    if codec::check_path(&path).is_err() {
        return refuse(Frame::error(code::MALFORMED, "bad path"), true);
    }
    let rel: Arc<Path> = Arc::from(Path::new(OsStr::from_bytes(&path)));
    let v = SourceVersion {
        size: file.size,
        mtime_ns: file.mtime_ns,
        ino: file.ino,
    };
    if VersionKey::new(&rel, &v).0 != version {
        return refuse(
            Frame::error(
                code::VERSION_MISMATCH,
                "version key does not match path and version",
            ),
            true,
        );
    }
    let fv = Arc::new(FileVersion::new(rel, v));
    if block >= fv.block_count(block_size) {
        return refuse(Frame::NotFound, false);
    }
    Ok((fv, block))
}

/// Whether `rel` is, at the source now, a regular file of version `v` whose
/// every parent is a real directory (a symlinked directory could lead out of
/// the data set).
fn is_current(source: &dyn Source, rel: &Path, v: &SourceVersion) -> bool {
    let mut prefix = PathBuf::new();
    let mut comps = rel.components().peekable();
    while let Some(c) = comps.next() {
        prefix.push(c);
        let Ok(attr) = source.stat(&prefix) else {
            return false;
        };
        let want = if comps.peek().is_some() {
            EntryKind::Dir
        } else {
            EntryKind::File
        };
        if attr.kind != want {
            return false;
        }
        if want == EntryKind::File {
            return attr.version() == *v;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::peer::codec::WireVersion;
    use bytes::{Bytes, BytesMut};
    use proptest::prelude::*;

    const DS: [u8; 16] = [7; 16];
    const BS: u64 = 65536;

    fn valid(path: &str, size: u64, block: u64) -> Frame {
        let v = SourceVersion {
            size,
            mtime_ns: 5,
            ino: 9,
        };
        Frame::GetBlock {
            dataset: DS,
            version: VersionKey::new(Path::new(path), &v).0,
            block,
            block_size: BS as u32,
            file: WireVersion {
                size,
                mtime_ns: 5,
                ino: 9,
            },
            path: Bytes::copy_from_slice(path.as_bytes()),
        }
    }

    #[test]
    fn check_request_accepts_exactly_the_consistent_requests() {
        let (fv, block) = check_request(&DS, BS, valid("a/b.jpg", 3 * BS, 2)).unwrap();
        assert_eq!((&*fv.rel, block), (Path::new("a/b.jpg"), 2));
        // Past the end, other data set, other block size: not found / error,
        // not hostile.
        assert!(matches!(
            check_request(&DS, BS, valid("a/b.jpg", 3 * BS, 3)),
            Err(Refusal {
                reply: Frame::NotFound,
                hostile: false
            })
        ));
        assert!(matches!(
            check_request(&[1; 16], BS, valid("a", 10, 0)),
            Err(Refusal {
                reply: Frame::NotFound,
                hostile: false
            })
        ));
        assert!(matches!(
            check_request(&DS, BS * 2, valid("a", 10, 0)),
            Err(Refusal { hostile: false, .. })
        ));
        // A forged key, an escaping path built in memory, a reply frame.
        let mut forged = valid("a", 10, 0);
        if let Frame::GetBlock { file, .. } = &mut forged {
            file.size += 1;
        }
        let mut escaping = valid("a", 10, 0);
        if let Frame::GetBlock { path, .. } = &mut escaping {
            *path = Bytes::from_static(b"../etc/passwd");
        }
        for f in [forged, escaping, Frame::Busy, Frame::block(Bytes::new())] {
            assert!(matches!(
                check_request(&DS, BS, f),
                Err(Refusal { hostile: true, .. })
            ));
        }
    }

    /// What the server does with raw request bytes up to the source: decode
    /// exactly one frame, then check it. Must never panic.
    fn serve_bytes(raw: &[u8]) -> Result<(Arc<FileVersion>, u64), Option<Frame>> {
        let mut buf = BytesMut::from(raw);
        match codec::decode_eof(&mut buf) {
            Ok(Some(f)) if buf.is_empty() => check_request(&DS, BS, f).map_err(|r| Some(r.reply)),
            _ => Err(None),
        }
    }

    proptest! {
        #[test]
        fn arbitrary_and_mutated_requests_never_panic_and_only_consistent_ones_pass(
            path in "[a-z]{1,8}(/[a-z.]{1,8}){0,2}",
            size in 0u64..(1 << 24),
            block in prop_oneof![0u64..300, any::<u64>()],
            flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..3),
            noise in prop::collection::vec(any::<u8>(), 0..200),
        ) {
            prop_assert!(serve_bytes(&noise).is_err() || noise.starts_with(&codec::MAGIC));
            let mut raw = BytesMut::new();
            if codec::encode(&valid(&path, size, block), &mut raw).is_err() {
                // A path with a dot component: not encodable, fine.
                return Ok(());
            }
            let pristine = raw.clone();
            for (at, x) in &flips {
                let i = at.index(raw.len());
                raw[i] ^= x;
            }
            if let Ok((fv, b)) = serve_bytes(&raw) {
                // Whatever passes names a block inside a file whose key
                // matches: the untouched request, or an equally consistent one.
                prop_assert!(b < fv.block_count(BS));
                prop_assert_eq!(VersionKey::new(&fv.rel, &fv.version).0, fv.key.0);
                if raw == pristine {
                    prop_assert_eq!(b, block);
                }
            }
        }
    }

    #[test]
    fn per_peer_limits_count_and_release() {
        let l = PeerLimits::default();
        let a: SocketAddr = "10.0.0.1:7070".parse().unwrap();
        let b: SocketAddr = "10.0.0.1:7071".parse().unwrap();
        let held: Vec<Held> = (0..CONNECTIONS_PER_PEER)
            .map(|_| l.connection(a).unwrap())
            .collect();
        assert!(l.connection(a).is_none(), "over the per-peer limit");
        assert_eq!(l.connections_of(a), CONNECTIONS_PER_PEER);
        // Another peer on the same host still gets in, up to the host limit.
        let more: Vec<Held> = (0..CONNECTIONS_PER_HOST - CONNECTIONS_PER_PEER)
            .map(|i| {
                let p = SocketAddr::new(a.ip(), 8000 + (i / CONNECTIONS_PER_PEER) as u16);
                l.connection(p).unwrap()
            })
            .collect();
        assert!(l.connection(b).is_none(), "over the per-host limit");
        // A refused connection took nothing.
        drop(more);
        assert!(l.connection(b).is_some());
        drop(held);
        assert_eq!(l.connections_of(a), 0);
        // A v4-mapped address is the same peer.
        let mapped: SocketAddr = "[::ffff:10.0.0.1]:7070".parse().unwrap();
        let _x: Vec<Held> = (0..CONNECTIONS_PER_PEER)
            .map(|_| l.connection(a).unwrap())
            .collect();
        assert!(l.connection(mapped).is_none());

        let reqs: Vec<Held> = (0..REQUESTS_PER_PEER)
            .map(|_| l.request(a).unwrap())
            .collect();
        assert!(l.request(a).is_none());
        assert!(l.request(b).is_some());
        drop(reqs);
        assert!(l.request(a).is_some());
    }
}
