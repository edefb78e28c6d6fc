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
//! streams open; at most `serving_slots` requests are served at once across
//! all peers (more get `Busy` at once), so memory for replies is bounded by
//! slots x block size. A malformed request gets an `Error` reply and ends its
//! stream; nothing a peer sends can panic this module or stop it serving.

use std::ffi::OsStr;
use std::net::SocketAddr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
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
        let mut out = BytesMut::with_capacity(reply.encoded_len());
        if codec::encode(&reply, &mut out).is_ok() {
            let _ = tokio::time::timeout(self.timeout, send.write_all(&out)).await;
        }
        let _ = send.finish();
    }

    async fn answer(&self, remote: SocketAddr, frame: Frame) -> Frame {
        let Frame::GetBlock {
            dataset,
            version,
            block,
            block_size,
            file,
            path,
        } = frame
        else {
            self.stats.peer_bad_requests.fetch_add(1, Relaxed);
            return Frame::error(code::MALFORMED, "only GetBlock may be sent to a node");
        };
        if dataset != self.dataset {
            return Frame::NotFound;
        }
        if u64::from(block_size) != self.block_size {
            return Frame::error(
                code::WRONG_BLOCK_SIZE,
                "block size differs from this node's",
            );
        }
        let rel: Arc<Path> = Arc::from(Path::new(OsStr::from_bytes(&path)));
        let v = SourceVersion {
            size: file.size,
            mtime_ns: file.mtime_ns,
            ino: file.ino,
        };
        if VersionKey::new(&rel, &v).0 != version {
            self.stats.peer_bad_requests.fetch_add(1, Relaxed);
            return Frame::error(
                code::VERSION_MISMATCH,
                "version key does not match path and version",
            );
        }
        let fv = Arc::new(FileVersion::new(Arc::clone(&rel), v));
        if block >= fv.block_count(self.block_size) {
            return Frame::NotFound;
        }
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
