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
//! as refused). One peer address gets at most [`REQUESTS_PER_PEER`] and one
//! host (IP address, whatever its ports) at most [`REQUESTS_PER_HOST`]
//! requests served at once (more get `Busy` at once). Replies hold memory
//! from the [`ReplyBudget`] (a share of `--prefetch-memory`, at most half
//! of it per host; a request waits at most half the peer timeout for it,
//! then gets `Busy`), and a request keeps its memory and its places under
//! these limits until its reply has left: written, finished and
//! acknowledged by the peer, or abandoned (the stream reset, so that quinn
//! drops what it still buffers) when that takes longer than the peer
//! timeout. So a peer that never reads its replies holds at most its
//! host's share for at most the peer timeout per reply, and no host can
//! take all of a node's serving memory. A malformed request gets an `Error`
//! reply and ends its stream; nothing a peer sends can panic this module or
//! stop it serving.
//!
//! Limits are per host, not per authenticated identity: from a cluster
//! secret every node's certificate says `locafs-peer` and carries a key made
//! at its start, so whoever holds the secret makes as many identities as
//! they like; an admin's certificate may be shared by every node of a job
//! (a supported set-up), so a limit per certificate would throttle the
//! whole cluster to one node's share. The source address is what a peer
//! cannot multiply cheaply.
//!
//! Before that, handshakes themselves are bounded (`limits::HandshakeGate`):
//! at most [`limits::HANDSHAKES_PER_HOST`] in progress from one host and
//! [`limits::HANDSHAKES_TOTAL`] in all; past [`limits::RETRY_ABOVE_PER_HOST`]
//! from a host or [`limits::RETRY_ABOVE_TOTAL`] in all, an attempt whose
//! address is not validated is sent a stateless Retry (counted in
//! `peer_handshakes_retried`), and past the bounds a validated one is
//! refused, unless it is a configured peer's own address. A handshake
//! holds its slot until it finishes or times out (the peer timeout, at
//! least 5 s).
//!
//! Refused handshakes and connections are logged at most once per
//! [`REFUSAL_LOG_EVERY`] each (with the number held back), so a flood of
//! them cannot fill the log; `peer_refused_connections` counts every one.

use std::ffi::OsStr;
use std::net::{IpAddr, SocketAddr};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use tracing::{debug, info};

use super::codec::{self, Frame};
use super::limits::{
    self, Admit, Counter, HandshakeGate, Held, LogLimiter, ReplyBudget, ReplyMemory,
};
use super::membership::Membership;
use crate::cache::{FileVersion, VersionKey};
use crate::obs::stats::Stats;
use crate::read::reader::Reader;
use crate::source::{EntryKind, Source, SourceVersion};

/// Streams a peer may have open on one connection.
pub const STREAMS_PER_CONNECTION: u32 = 64;
/// Connections one peer (remote `ip:port`) may hold at once. An honest node
/// holds one (from its listening endpoint), two for a moment while it
/// reconnects before we noticed the old one is dead.
pub const CONNECTIONS_PER_PEER: usize = 4;
/// Connections from one remote IP address at once (several nodes may share
/// a machine).
pub const CONNECTIONS_PER_HOST: usize = 32;
/// Requests of one peer address served at once. An honest node sends at
/// most `membership::STREAMS_PER_PEER` at a time; twice that because a
/// request keeps its place until the asker's acknowledgement of its reply
/// arrives, and the asker may send its next request before that.
pub const REQUESTS_PER_PEER: usize = 2 * super::membership::STREAMS_PER_PEER;
/// Requests of one host (IP address, all its ports) served at once: room
/// for four honest nodes on one machine each at its full
/// [`REQUESTS_PER_PEER`] (tests and small set-ups run several nodes per
/// machine; real jobs one), while a host with many endpoints cannot take
/// more.
pub const REQUESTS_PER_HOST: usize = 4 * REQUESTS_PER_PEER;
/// The shortest interval between two log lines about refused handshakes
/// (and, apart, about connections over the limits).
pub const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(10);
/// Connection attempts quinn holds before the accept loop decides on them
/// (it decides on each at once; more are refused by quinn).
pub const MAX_INCOMING: usize = 4096;
/// Application error code of a reply stream reset because the reply did
/// not leave in time.
const RESET_TOO_SLOW: u32 = 1;

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
    /// Memory for replies, shared between hosts.
    pub replies: Arc<ReplyBudget>,
    /// Connections and requests per peer and per host.
    pub limits: Arc<PeerLimits>,
    /// Log lines about refused handshakes.
    pub refused_log: LogLimiter,
    /// Log lines about connections over the limits.
    pub over_limit_log: LogLimiter,
    /// Handshakes in progress, per host and in all.
    pub handshakes: HandshakeGate,
    /// Versions found current at the source lately ([`is_current`]), for
    /// [`CURRENT_FOR`]: the blocks of one file come in bursts, and each
    /// check stats every component of the path (on an object store, a HEAD
    /// and a listing per directory).
    pub current: moka::sync::Cache<VersionKey, ()>,
}

/// How long a version found current at the source stays trusted for the
/// requests of peers. A version replaced in that time is still served from
/// this node's cache with that version's own bytes (a block is always
/// keyed and checked by its version), never with another's; from the
/// source its read fails as changed.
pub const CURRENT_FOR: Duration = Duration::from_secs(5);
/// Versions remembered as current, at most.
pub const CURRENT_KEPT: u64 = 65_536;

/// The table of versions found current lately.
pub fn current_table() -> moka::sync::Cache<VersionKey, ()> {
    moka::sync::Cache::builder()
        .max_capacity(CURRENT_KEPT)
        .time_to_live(CURRENT_FOR)
        .build()
}

/// Counts of what each peer holds now, with RAII [`Held`] tokens.
#[derive(Default)]
pub struct PeerLimits {
    conns: Counter<SocketAddr>,
    hosts: Counter<IpAddr>,
    requests: Counter<SocketAddr>,
    host_requests: Counter<IpAddr>,
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

    /// A request of `remote` being served, if neither it nor its host has
    /// its most ([`REQUESTS_PER_PEER`], [`REQUESTS_PER_HOST`]).
    pub fn request(&self, remote: SocketAddr) -> Option<Held> {
        let ip = remote.ip().to_canonical();
        let host = self.host_requests.take(ip, REQUESTS_PER_HOST)?;
        let Some(peer) = self
            .requests
            .take(SocketAddr::new(ip, remote.port()), REQUESTS_PER_PEER)
        else {
            host();
            return None;
        };
        Some(Held {
            release: vec![peer, host],
        })
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
            let remote = incoming.remote_address();
            self.membership.note_attempt(remote);
            let validated = incoming.remote_address_validated();
            let member = validated && self.membership.member_at(&remote).is_some();
            let slot = match self.handshakes.admit(remote.ip(), validated, member) {
                Admit::Accept(slot) => slot,
                Admit::Retry => {
                    self.stats.peer_handshakes_retried.fetch_add(1, Relaxed);
                    // (an attempt that already carries a token is never
                    // retried: validated ones are accepted or refused)
                    if let Err(e) = incoming.retry() {
                        e.into_incoming().refuse();
                    }
                    continue;
                }
                Admit::Refuse => {
                    self.stats.peer_refused_connections.fetch_add(1, Relaxed);
                    if let Some(held_back) = self.refused_log.allow(Instant::now()) {
                        info!(
                            "peer connection from {remote} refused: too many handshakes in \
                             progress (at most {} from one host, {} in all){}",
                            limits::HANDSHAKES_PER_HOST,
                            limits::HANDSHAKES_TOTAL,
                            held_back_note(held_back)
                        );
                    }
                    incoming.refuse();
                    continue;
                }
            };
            let me = Arc::clone(&self);
            tokio::spawn(async move {
                let handshake =
                    tokio::time::timeout(me.timeout.max(Duration::from_secs(5)), incoming).await;
                // The slot is held while the handshake runs, not after.
                drop(slot);
                match handshake {
                    Ok(Ok(conn)) => me.serve_connection(conn).await,
                    Ok(Err(e)) => {
                        me.stats.peer_refused_connections.fetch_add(1, Relaxed);
                        if let Some(held_back) = me.refused_log.allow(Instant::now()) {
                            info!(
                                "peer connection from {remote} refused: {e}{}",
                                held_back_note(held_back)
                            );
                        }
                    }
                    Err(_) => {
                        me.stats.peer_refused_connections.fetch_add(1, Relaxed);
                        if let Some(held_back) = me.refused_log.allow(Instant::now()) {
                            info!(
                                "peer connection from {remote} refused: handshake timed out{}",
                                held_back_note(held_back)
                            );
                        }
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
            if let Some(held_back) = self.over_limit_log.allow(Instant::now()) {
                info!(
                    "peer connection from {remote} refused: too many connections from it{}",
                    held_back_note(held_back)
                );
            }
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
        let (reply, held) = match tokio::time::timeout(self.timeout, recv.read_to_end(limit)).await
        {
            Err(_) => (
                Frame::error(code::TIMEOUT, "request not received in time"),
                None,
            ),
            Ok(Err(e)) => {
                self.stats.peer_bad_requests.fetch_add(1, Relaxed);
                let e = Frame::error(code::MALFORMED, &format!("bad request stream: {e}"));
                (e, None)
            }
            Ok(Ok(raw)) => {
                let mut buf = BytesMut::from(&raw[..]);
                match codec::decode_eof(&mut buf) {
                    Ok(Some(frame)) if buf.is_empty() => self.answer(remote, frame).await,
                    Ok(_) => {
                        self.stats.peer_bad_requests.fetch_add(1, Relaxed);
                        let e =
                            Frame::error(code::MALFORMED, "expected exactly one GetBlock frame");
                        (e, None)
                    }
                    Err(e) => {
                        self.stats.peer_bad_requests.fetch_add(1, Relaxed);
                        (Frame::error(code::MALFORMED, &e.to_string()), None)
                    }
                }
            }
        };
        drop(recv);
        // The request's memory and places are given back only once the
        // reply has left, or has been abandoned and quinn has dropped it.
        if !send_reply(&mut send, reply, self.timeout).await {
            let _ = send.reset(RESET_TOO_SLOW.into());
            debug!("peer {remote}: reply abandoned (not read and acknowledged in time)");
        }
        drop(send);
        drop(held);
    }

    /// The reply to a decoded request, with what it holds while it is sent.
    async fn answer(&self, remote: SocketAddr, frame: Frame) -> (Frame, Option<Serving>) {
        let (fv, block) = match check_request(&self.dataset, self.block_size, frame) {
            Ok(ok) => ok,
            Err(Refusal { reply, hostile }) => {
                if hostile {
                    self.stats.peer_bad_requests.fetch_add(1, Relaxed);
                }
                return (reply, None);
            }
        };
        let (rel, v) = (Arc::clone(&fv.rel), fv.version);
        let Some(request) = self.limits.request(remote) else {
            return (Frame::Busy, None);
        };
        let source = Arc::clone(&self.source);
        let rel2 = Arc::clone(&rel);
        let current = remembered_or(&self.current, fv.key, async move {
            tokio::task::spawn_blocking(move || is_current(&*source, &rel2, &v))
                .await
                .unwrap_or(false)
        })
        .await;
        let mut serving = Serving {
            _memory: None,
            _request: request,
        };
        if !current {
            return (Frame::NotFound, Some(serving));
        }
        let len = fv.block_len(block, self.block_size) as u64;
        let host = remote.ip().to_canonical();
        let Some(memory) = self.replies.acquire(host, len, self.timeout / 2).await else {
            return (Frame::Busy, None);
        };
        serving._memory = Some(memory);
        match Arc::clone(&self.reader).fetch_for_peer(fv, block).await {
            Ok(b) => {
                let n = b.data().len() as u64;
                self.stats.peer_served_bytes.fetch_add(n, Relaxed);
                if let Some(m) = self.membership.member_at(&remote) {
                    m.bytes_sent.fetch_add(n, Relaxed);
                }
                let reply = Frame::Block {
                    checksum: *b.checksum(),
                    data: b.data().clone(),
                };
                (reply, Some(serving))
            }
            Err(e) => (
                Frame::error(code::SOURCE_FAILED, &e.to_string()),
                Some(serving),
            ),
        }
    }
}

/// What a request being served holds until its reply has left: its places
/// under the per-peer and per-host limits and, from the fetch of its block
/// on, reply memory.
struct Serving {
    _memory: Option<ReplyMemory>,
    _request: Held,
}

/// " (N more held back)" for a rate-limited log line.
fn held_back_note(n: u64) -> String {
    if n == 0 {
        String::new()
    } else {
        format!(" ({n} more since the last such line)")
    }
}

/// Writes `reply` (block data as it is held, no copy into a frame buffer),
/// finishes the stream and waits until the peer has acknowledged all of it,
/// within `limit`. False if that did not happen (the peer stopped the
/// stream, the connection failed, or it took too long): the caller resets
/// the stream. `reply` is dropped before this returns.
async fn send_reply(send: &mut quinn::SendStream, reply: Frame, limit: Duration) -> bool {
    let Ok(mut chunks) = codec::encode_chunks(&reply) else {
        return false;
    };
    drop(reply);
    chunks.retain(|c| !c.is_empty());
    let leave = async {
        let mut rest: &mut [Bytes] = &mut chunks;
        while !rest.is_empty() {
            let done = send.write_chunks(rest).await.ok()?.chunks;
            rest = &mut rest[done..];
        }
        send.finish().ok()?;
        // None: finished and every byte acknowledged; Some: stopped.
        send.stopped().await.ok()?.is_none().then_some(())
    };
    tokio::time::timeout(limit, leave)
        .await
        .ok()
        .flatten()
        .is_some()
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

/// Whether the version `key` is current: found so lately (in `table`), or
/// by `check`, then remembered if it is (a version found stale is asked
/// again next time).
async fn remembered_or(
    table: &moka::sync::Cache<VersionKey, ()>,
    key: VersionKey,
    check: impl std::future::Future<Output = bool>,
) -> bool {
    if table.contains_key(&key) {
        return true;
    }
    let yes = check.await;
    if yes {
        table.insert(key, ());
    }
    yes
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
    fn versions_found_current_are_remembered_and_stale_ones_asked_again() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let table = current_table();
        let checks = std::sync::atomic::AtomicU64::new(0);
        let ask = |key: VersionKey, answer: bool| {
            let checks = &checks;
            rt.block_on(remembered_or(&table, key, async move {
                checks.fetch_add(1, Relaxed);
                answer
            }))
        };
        let key = |n: u8| {
            let v = SourceVersion {
                size: 1,
                mtime_ns: n as i64,
                ino: 1,
            };
            VersionKey::new(Path::new("a/b"), &v)
        };
        // Current: checked once, then remembered.
        assert!(ask(key(1), true));
        assert!(ask(key(1), true));
        assert!(ask(key(1), false), "a remembered version is not asked");
        assert_eq!(checks.load(Relaxed), 1);
        // Stale: asked every time, never remembered.
        assert!(!ask(key(2), false));
        assert!(!ask(key(2), false));
        assert_eq!(checks.load(Relaxed), 3);
        assert!(ask(key(2), true));
        assert_eq!(checks.load(Relaxed), 4);
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

    #[test]
    fn requests_are_limited_per_host_whatever_its_ports() {
        let l = PeerLimits::default();
        let host: IpAddr = "10.0.0.1".parse().unwrap();
        // Many endpoints of one host, each within its own limit, together
        // get REQUESTS_PER_HOST.
        let mut held = Vec::new();
        let mut port = 7000;
        while let Some(h) = l.request(SocketAddr::new(host, port)) {
            held.push(h);
            if held.len() % REQUESTS_PER_PEER == 0 {
                port += 1;
            }
        }
        assert_eq!(held.len(), REQUESTS_PER_HOST);
        // Whatever new port it uses, and as a v4-mapped v6 address.
        assert!(l.request(SocketAddr::new(host, 9999)).is_none());
        assert!(l
            .request("[::ffff:10.0.0.1]:9998".parse().unwrap())
            .is_none());
        // Another host is not affected; a refused request took nothing.
        let other: SocketAddr = "10.0.0.2:7000".parse().unwrap();
        let o: Vec<Held> = (0..REQUESTS_PER_PEER)
            .map(|_| l.request(other).unwrap())
            .collect();
        held.pop();
        assert!(l.request(SocketAddr::new(host, 9999)).is_some());
        drop((held, o));
        // An honest node asks at most STREAMS_PER_PEER at once; with replies
        // waiting for their acknowledgement it stays within its limit.
        const { assert!(REQUESTS_PER_PEER >= 2 * crate::peer::membership::STREAMS_PER_PEER) };
        assert_eq!(l.host_requests.get(&host), 0);
    }
}
