//! The asking side of the peer cache: the [`PeerTier`] the reader consults
//! between its local cache and the source.
//!
//! For a block this node does not own, it asks the owner (over the pooled
//! QUIC connection that membership keeps to each live member), then the next
//! member in the block's ranking (the owner-to-be if the owner is gone),
//! never more than [`MAX_ATTEMPTS`] members, all within one budget of
//! [`BUDGET`] x `--peer-timeout` per block; after that the reader goes
//! to the source. A member is asked within `--peer-timeout`; past it, the
//! request goes on waiting only while the member is still heard from (its
//! connection carries packets: `Member::silent_for`), up to the end of the
//! budget. A member that is heard from but slow (a loaded machine) is not
//! passed over and not marked down: when the budget runs out the block is
//! read from the source, since the next member, not its owner, would only
//! read the source too, and the owner keeps its blocks (marking it down
//! would hand all of them to the next members, who would read them from
//! the source again). A member silent past `--peer-timeout` (stopped, dead,
//! cut off) is marked down and the next member is asked at once, as is one
//! whose connection failed; one heard from that has answered nothing at all
//! for [`UNANSWERED_LIMIT`] x `--peer-timeout` is marked down too (alive,
//! but not serving). An owner that is listed but
//! not reached yet (the mesh still forming: `Member::is_expected`) is waited
//! for, at most `--peer-timeout` (up to the budget less a quarter of a
//! timeout if it has tried to connect to us: it runs, our connection to it
//! is forming), and asked the moment it connects (the wait
//! and the ask are that member's one attempt); if it does not come in time the block is
//! read from the source at once and counted
//! (`peer_unreached_source_blocks`): asking the next member instead would
//! only make that member read the source. A member that answers `Busy`
//! (short of reply memory: flow control from a live owner) is asked again
//! after a short pause, within the same budget, rather than passed over:
//! the next member would read the block from its source, and the owner would
//! read it again for the next node that asks. Every block received is checked
//! against its checksum and its expected length before anyone sees it; a
//! peer that sends a wrong block is counted as lying and marked down, like a
//! silent peer or a failed connection.
//!
//! It must never make a read fail or wait without a deadline: any fault is
//! `None`, and the caller reads the source.

use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures::future::{BoxFuture, FutureExt};
use tracing::{debug, warn};

use super::codec::{self, Frame, WireVersion};
use super::membership::{Member, Membership, MAX_BACKOFF, SILENT_AFTER};
use super::placement::{block_key, path_id};
use crate::cache::{ChecksummedBytes, FileVersion};
use crate::obs::stats::Stats;
use crate::read::reader::PeerTier;

/// Members asked for one block before giving up on peers.
pub const MAX_ATTEMPTS: usize = 2;

/// A block's whole peer budget (every wait and request for it), in
/// `--peer-timeout`s: what a slow owner still heard from, or an owner not
/// reached yet that runs, may take before the block is read from the
/// source. Measured (64 nodes started together on 2 cores, docs/cluster.md):
/// with two, 1.0063-1.0143x the data set left the source (the excess all
/// in the first 10 s, while 4,032 handshakes shared the cores with the
/// loaders); with three, 1.0020-1.0034x. A silent or closed peer is given
/// up at `--peer-timeout` whatever the budget.
pub const BUDGET: u32 = 3;

/// How often a request waiting past `--peer-timeout` looks whether its
/// member is still heard from.
pub const LISTEN_EVERY: Duration = Duration::from_millis(100);

/// A member heard from that has answered none of our requests for this
/// many `--peer-timeout`s (twice a block's budget), when one more of them
/// runs out of time, is marked down: it is alive but not serving.
pub const UNANSWERED_LIMIT: u32 = 2 * BUDGET;

/// The first pause before a member that answered `Busy` is asked again;
/// it doubles up to [`BUSY_PAUSE_MAX`], all within the member's deadline.
pub const BUSY_PAUSE: Duration = Duration::from_millis(5);
pub const BUSY_PAUSE_MAX: Duration = Duration::from_millis(160);

/// How one request to a peer ended, when it did not give us the block.
#[derive(Debug)]
enum Miss {
    /// The member is up but short of reply memory: ask it again shortly.
    Busy,
    /// No answer by the end of the wait from a member still heard from:
    /// slow, not gone.
    Slow,
    /// It gave up sending its answer (the stream reset: we took longer
    /// than its `--peer-timeout` to take it). It has the block now: ask
    /// again within the budget.
    Abandoned,
    /// No answer within `--peer-timeout`, and nothing heard from the member
    /// for [`SILENT_AFTER`] either: gone, or stopped.
    Silent,
    /// Transport error, `Error`, `NotFound`: try elsewhere.
    Failed(String),
    /// A block that does not match its checksum or length.
    Lied(String),
}

/// The peer tier of one mount (cheap to clone: a request future owns one).
#[derive(Clone)]
pub struct PeerClient {
    membership: Arc<Membership>,
    dataset: [u8; 16],
    block_size: u32,
    timeout: Duration,
    stats: Arc<Stats>,
}

impl PeerClient {
    pub fn new(
        membership: Arc<Membership>,
        dataset: [u8; 16],
        block_size: u32,
        timeout: Duration,
        stats: Arc<Stats>,
    ) -> Self {
        PeerClient {
            membership,
            dataset,
            block_size,
            timeout,
            stats,
        }
    }

    fn key(&self, file: &FileVersion, index: u64) -> [u8; 44] {
        block_key(&self.dataset, &path_id(&file.rel), index, self.block_size)
    }

    /// One request to one member. Its answer is waited for until `soft`;
    /// past it only while the member is still heard from, and never past
    /// `hard`.
    async fn ask(
        &self,
        m: &Member,
        file: &FileVersion,
        index: u64,
        len: usize,
        soft: Instant,
        hard: Instant,
    ) -> Result<ChecksummedBytes, Miss> {
        let conn = m
            .connection()
            .ok_or_else(|| Miss::Failed("not connected".into()))?;
        let frame = Frame::GetBlock {
            dataset: self.dataset,
            version: file.key.0,
            block: index,
            block_size: self.block_size,
            file: WireVersion {
                size: file.version.size,
                mtime_ns: file.version.mtime_ns,
                ino: file.version.ino,
            },
            path: Bytes::copy_from_slice(file.rel.as_os_str().as_bytes()),
        };
        let mut req = BytesMut::new();
        codec::encode(&frame, &mut req).map_err(|e| Miss::Failed(format!("cannot ask: {e}")))?;
        let limit = codec::HEADER_LEN + 32 + len.max(codec::MAX_ERROR_MESSAGE);
        let started = Instant::now();
        let exchange = async {
            let _slot = m
                .slots
                .acquire()
                .await
                .map_err(|_| Miss::Failed("closed".into()))?;
            let (mut send, mut recv) = conn
                .open_bi()
                .await
                .map_err(|e| Miss::Failed(e.to_string()))?;
            send.write_all(&req)
                .await
                .map_err(|e| Miss::Failed(e.to_string()))?;
            let _ = send.finish();
            // The reply, gathered into one buffer (the only copy of the
            // block on this side); its data is then sliced, not copied.
            let mut raw = BytesMut::with_capacity(limit.min(codec::HEADER_LEN + 32 + len));
            while let Some(chunk) =
                recv.read_chunk(usize::MAX, true)
                    .await
                    .map_err(|e| match e {
                        // The member gave up sending its answer: it is alive
                        // (it answered), we took too long to take it.
                        quinn::ReadError::Reset(_) => Miss::Abandoned,
                        e => Miss::Failed(e.to_string()),
                    })?
            {
                if raw.len() + chunk.bytes.len() > limit {
                    return Err(Miss::Lied("reply longer than the block".into()));
                }
                raw.extend_from_slice(&chunk.bytes);
            }
            codec::decode_whole(raw.freeze(), len)
                .map(Some)
                .map_err(|e| Miss::Lied(format!("bad reply: {e}")))
        };
        tokio::pin!(exchange);
        // What has been heard so far: silence is counted from here on.
        m.silent_for(&conn);
        let at = tokio::time::Instant::from_std;
        let reply = match tokio::time::timeout_at(at(soft), &mut exchange).await {
            Ok(r) => r?,
            Err(_) => loop {
                let now = Instant::now();
                if m.silent_for(&conn) >= SILENT_AFTER {
                    return Err(Miss::Silent);
                }
                if now >= hard {
                    return Err(Miss::Slow);
                }
                let until = (now + LISTEN_EVERY).min(hard);
                if let Ok(r) = tokio::time::timeout_at(at(until), &mut exchange).await {
                    break r?;
                }
            },
        };
        m.note_answer();
        match reply {
            Some(Frame::Block { checksum, data }) => {
                if data.len() != len {
                    return Err(Miss::Lied(format!(
                        "sent {} bytes for a block of {len}",
                        data.len()
                    )));
                }
                let block = ChecksummedBytes::verified(data, checksum)
                    .ok_or_else(|| Miss::Lied("block does not match its checksum".into()))?;
                m.record_latency(started.elapsed());
                Ok(block)
            }
            Some(Frame::NotFound) => Err(Miss::Failed("not found".into())),
            Some(Frame::Busy) => Err(Miss::Busy),
            Some(Frame::Error { code, message }) => {
                Err(Miss::Failed(format!("error {code}: {message}")))
            }
            Some(Frame::GetBlock { .. }) | None => Err(Miss::Lied("not a reply".into())),
        }
    }

    /// [`ask`](Self::ask), again after a pause while the member answers
    /// `Busy` or gives up sending its answer (it is heard from: up to
    /// `hard`).
    async fn ask_until_served(
        &self,
        m: &Member,
        file: &FileVersion,
        index: u64,
        len: usize,
        soft: Instant,
        hard: Instant,
    ) -> Result<ChecksummedBytes, Miss> {
        let mut pause = BUSY_PAUSE;
        loop {
            match self.ask(m, file, index, len, soft, hard).await {
                // Both after the same growing pause: a member that resets
                // every reply is not asked again back to back for the
                // whole budget.
                Err(miss @ (Miss::Busy | Miss::Abandoned)) if Instant::now() + pause < hard => {
                    if matches!(miss, Miss::Busy) {
                        self.stats.peer_busy.fetch_add(1, Relaxed);
                    } else {
                        debug!(peer = %m.id, file = %file.rel.display(), block = index, "peer gave up sending its answer (we were slow to take it): asking again");
                    }
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(BUSY_PAUSE_MAX);
                }
                r => return r,
            }
        }
    }

    async fn fetch_inner(
        self,
        file: Arc<FileVersion>,
        index: u64,
        len: usize,
    ) -> Option<ChecksummedBytes> {
        let placement = self.membership.placement();
        let me = self.membership.me();
        let key = self.key(&file, index);
        // Every wait and request for this block ends by then.
        let budget = Instant::now() + self.timeout * BUDGET;
        let mut attempts = 0;
        for id in placement.owners(&key) {
            if attempts >= MAX_ATTEMPTS || Some(id) == me.as_ref() || Instant::now() >= budget {
                // This node is next in line: it reads the source itself.
                break;
            }
            let Some(m) = self.membership.member(id) else {
                continue;
            };
            if !m.is_up() {
                if !m.is_expected() {
                    continue;
                }
                // The owner is listed but not reached yet: wait for it
                // (the wait and the ask below are one attempt).
                self.stats.peer_owner_waits.fetch_add(1, Relaxed);
                let waited = Instant::now();
                let limit = self
                    .timeout
                    .min(budget.saturating_duration_since(Instant::now()));
                let mut up = m.wait_up(limit).await;
                let runs = || m.tried_us_within(self.timeout * BUDGET);
                if !up && runs() {
                    // It has tried to connect to us: it runs, and our
                    // connection to it is forming (handshakes take seconds
                    // on a loaded machine). Wait on, leaving a quarter of a
                    // timeout of the budget to ask.
                    let end = budget - self.timeout / 4;
                    up = m
                        .wait_up(end.saturating_duration_since(Instant::now()))
                        .await;
                }
                if !up {
                    self.stats
                        .peer_unreached_source_blocks
                        .fetch_add(1, Relaxed);
                    debug!(peer = %m.id, file = %file.rel.display(), block = index, runs = runs(), "owner not reached within {:?}: reading the source", waited.elapsed());
                    return None;
                }
                self.stats.peer_owner_waits_met.fetch_add(1, Relaxed);
            }
            attempts += 1;
            m.requests.fetch_add(1, Relaxed);
            let started = Instant::now();
            let soft = (started + self.timeout).min(budget);
            match self
                .ask_until_served(&m, &file, index, len, soft, budget)
                .await
            {
                Ok(block) => {
                    m.bytes_received.fetch_add(len as u64, Relaxed);
                    return Some(block);
                }
                Err(Miss::Busy) => {
                    // Busy until the budget ran out: up, but not serving us
                    // now. The next member would only read the source.
                    m.failures.fetch_add(1, Relaxed);
                    self.stats.peer_failures.fetch_add(1, Relaxed);
                    debug!(peer = %m.id, file = %file.rel.display(), block = index, "peer stayed busy for {:?}", started.elapsed());
                    return None;
                }
                Err(miss @ (Miss::Slow | Miss::Abandoned)) => {
                    let what = match miss {
                        Miss::Slow => "no answer",
                        _ => "it gave up sending its answer",
                    };
                    // Heard from all along: slow (a loaded machine), not
                    // gone. It stays up and keeps its blocks; the next
                    // member would only read the source.
                    m.failures.fetch_add(1, Relaxed);
                    self.stats.peer_failures.fetch_add(1, Relaxed);
                    debug!(peer = %m.id, file = %file.rel.display(), block = index, "peer request failed: {what} after {:?} (the peer is connected and heard from: slow, kept up)", started.elapsed());
                    let quiet = m.unanswered_for();
                    if quiet >= self.timeout * UNANSWERED_LIMIT {
                        self.membership.mark_down(
                            &m,
                            &format!("connected but answered nothing for {quiet:.1?}"),
                        );
                    }
                    return None;
                }
                Err(Miss::Silent) => {
                    m.failures.fetch_add(1, Relaxed);
                    self.stats.peer_failures.fetch_add(1, Relaxed);
                    let why = format!(
                        "no answer within {:?}, and nothing heard from it for {SILENT_AFTER:?}",
                        started.elapsed()
                    );
                    debug!(peer = %m.id, file = %file.rel.display(), block = index, "peer request failed: {why}");
                    self.membership.mark_down(&m, &why);
                }
                Err(Miss::Failed(why)) => {
                    m.failures.fetch_add(1, Relaxed);
                    self.stats.peer_failures.fetch_add(1, Relaxed);
                    debug!(peer = %m.id, file = %file.rel.display(), block = index, "peer request failed: {why}");
                    // A peer that merely lacks the block stays up; one that
                    // does not answer goes down.
                    if !(why == "not found" || why.starts_with("error ")) {
                        self.membership.mark_down(&m, &why);
                    }
                }
                Err(Miss::Lied(why)) => {
                    m.failures.fetch_add(1, Relaxed);
                    m.bad_blocks.fetch_add(1, Relaxed);
                    self.stats.peer_bad_blocks.fetch_add(1, Relaxed);
                    warn!(peer = %m.id, file = %file.rel.display(), block = index, "peer sent a bad block ({why}); ignoring it");
                    self.membership.mark_down_for(
                        &m,
                        &format!("sent a bad block: {why}"),
                        Some(MAX_BACKOFF),
                    );
                }
            }
        }
        None
    }
}

impl PeerTier for PeerClient {
    fn owns(&self, file: &FileVersion, index: u64) -> bool {
        let p = self.membership.placement();
        match p.owner(&self.key(file, index)) {
            None => true,
            Some(owner) => self.membership.me().as_ref() == Some(owner),
        }
    }

    fn fetch(
        &self,
        file: Arc<FileVersion>,
        index: u64,
        len: usize,
    ) -> BoxFuture<'static, Option<ChecksummedBytes>> {
        self.clone().fetch_inner(file, index, len).boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::block_checksum;
    use crate::peer::placement::{MemberId, Placement};
    use crate::peer::tls::test_pki::{admin_identity, test_ca};
    use crate::source::SourceVersion;
    use std::net::{SocketAddr, UdpSocket};
    use std::path::Path;

    /// A member at `addr` answering every request with `reply`.
    fn answer_all(identity: &crate::peer::tls::ClusterIdentity, addr: SocketAddr, reply: Frame) {
        let ep = quinn::Endpoint::server(identity.server_config(), addr).unwrap();
        tokio::spawn(async move {
            while let Some(incoming) = ep.accept().await {
                let reply = reply.clone();
                tokio::spawn(async move {
                    let Ok(conn) = incoming.await else { return };
                    while let Ok((mut send, mut recv)) = conn.accept_bi().await {
                        let _ = recv.read_to_end(1 << 20).await;
                        let mut out = BytesMut::new();
                        codec::encode(&reply, &mut out).unwrap();
                        let _ = send.write_all(&out).await;
                        let _ = send.finish();
                    }
                });
            }
        });
    }

    async fn until(what: &str, mut cond: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !cond() {
            assert!(Instant::now() < deadline, "{what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_unreached_owner_that_runs_is_waited_for_past_the_timeout() {
        // Nodes started together on a loaded machine: the owner has tried
        // to connect to us (it runs), but our handshake to it is still
        // forming when --peer-timeout has passed. The read waits on (within
        // the block's budget) instead of reading the source, which the
        // owner reads too.
        let ca = test_ca("test CA");
        let mine = admin_identity(&ca, "locafs.example.com");
        let mut ep =
            quinn::Endpoint::server(mine.server_config(), "127.0.0.1:0".parse().unwrap()).unwrap();
        ep.set_default_client_config(mine.client_config());
        let me = ep.local_addr().unwrap();
        // The owner's port is held, unanswered, until it serves.
        let held = UdpSocket::bind("127.0.0.1:0").unwrap();
        let owner = held.local_addr().unwrap();
        let file = Arc::new(FileVersion::new(
            Arc::from(Path::new("f")),
            SourceVersion {
                size: 1 << 30,
                mtime_ns: 1,
                ino: 2,
            },
        ));
        let (dataset, block_size, len) = ([4u8; 16], 4096u32, 4096usize);
        let ranking = Placement::new(vec![
            MemberId::new(me.to_string()),
            MemberId::new(owner.to_string()),
        ]);
        let key = |i| block_key(&dataset, &path_id(&file.rel), i, block_size);
        let index = (0..)
            .find(|&i| ranking.owner(&key(i)).unwrap().as_str() == owner.to_string())
            .unwrap();
        let stats = Arc::new(Stats::default());
        let membership = Membership::new(
            vec![me.to_string(), owner.to_string()],
            me,
            mine.leaf_certificate().to_vec(),
            mine.leaf_is_fresh(),
            ep,
            Duration::from_millis(500),
            Arc::clone(&stats),
        );
        tokio::spawn(Arc::clone(&membership).run());
        until("the owner listed", || {
            membership
                .member_at(&owner)
                .is_some_and(|m| m.is_expected())
        })
        .await;
        let timeout = Duration::from_secs(4);
        let client = PeerClient::new(
            Arc::clone(&membership),
            dataset,
            block_size,
            timeout,
            Arc::clone(&stats),
        );
        let fetch = tokio::spawn(client.fetch_inner(Arc::clone(&file), index, len));
        until("a wait for the owner", || {
            stats.peer_owner_waits.load(Relaxed) == 1
        })
        .await;
        let waiting = Instant::now();
        // Its attempt to connect to us arrives (what the server reports).
        membership.note_attempt(owner);
        // Past --peer-timeout (the first wait has ended), within the
        // budget less a quarter of a timeout, our connection to it forms.
        tokio::time::sleep(timeout + Duration::from_millis(500)).await;
        assert!(
            !fetch.is_finished(),
            "the read did not wait past the timeout"
        );
        drop(held);
        let data = Bytes::from(vec![9u8; len]);
        answer_all(
            &admin_identity(&ca, "locafs.example.com"),
            owner,
            Frame::Block {
                checksum: block_checksum(&data),
                data: data.clone(),
            },
        );
        membership.note_incoming(owner);
        let got = tokio::time::timeout(Duration::from_secs(60), fetch)
            .await
            .expect("the fetch ended")
            .unwrap();
        eprintln!(
            "the read ended {:?} after its wait began",
            waiting.elapsed()
        );
        assert_eq!(stats.peer_owner_waits_met.load(Relaxed), 1);
        assert_eq!(stats.peer_unreached_source_blocks.load(Relaxed), 0);
        let got = got.expect("the owner that had tried to connect to us was not waited for");
        assert_eq!(got.data(), &data);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_answer_the_owner_gave_up_sending_is_asked_for_again() {
        // On a loaded machine the asker can take longer than the owner's
        // --peer-timeout to take a reply, and the owner resets the stream.
        // The owner has the block by then: it is asked again within the
        // budget, rather than read from the source (which the owner did).
        let ca = test_ca("test CA");
        let mine = admin_identity(&ca, "locafs.example.com");
        let mut ep =
            quinn::Endpoint::server(mine.server_config(), "127.0.0.1:0".parse().unwrap()).unwrap();
        ep.set_default_client_config(mine.client_config());
        let me = ep.local_addr().unwrap();
        let theirs = admin_identity(&ca, "locafs.example.com");
        let owner_ep =
            quinn::Endpoint::server(theirs.server_config(), "127.0.0.1:0".parse().unwrap())
                .unwrap();
        let owner = owner_ep.local_addr().unwrap();
        let data = Bytes::from(vec![5u8; 4096]);
        let block = Frame::Block {
            checksum: block_checksum(&data),
            data: data.clone(),
        };
        // The owner resets its first reply stream, then answers.
        let streams = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let seen = Arc::clone(&streams);
        tokio::spawn(async move {
            while let Some(incoming) = owner_ep.accept().await {
                let (block, seen) = (block.clone(), Arc::clone(&seen));
                tokio::spawn(async move {
                    let Ok(conn) = incoming.await else { return };
                    while let Ok((mut send, mut recv)) = conn.accept_bi().await {
                        let _ = recv.read_to_end(1 << 20).await;
                        if seen.fetch_add(1, Relaxed) == 0 {
                            let _ = send.reset(1u32.into());
                            continue;
                        }
                        let mut out = BytesMut::new();
                        codec::encode(&block, &mut out).unwrap();
                        let _ = send.write_all(&out).await;
                        let _ = send.finish();
                    }
                });
            }
        });
        let file = Arc::new(FileVersion::new(
            Arc::from(Path::new("f")),
            SourceVersion {
                size: 1 << 30,
                mtime_ns: 1,
                ino: 2,
            },
        ));
        let (dataset, block_size) = ([6u8; 16], 4096u32);
        let ranking = Placement::new(vec![
            MemberId::new(me.to_string()),
            MemberId::new(owner.to_string()),
        ]);
        let index = (0..)
            .find(|&i| {
                let key = block_key(&dataset, &path_id(&file.rel), i, block_size);
                ranking.owner(&key).unwrap().as_str() == owner.to_string()
            })
            .unwrap();
        let stats = Arc::new(Stats::default());
        let membership = Membership::new(
            vec![me.to_string(), owner.to_string()],
            me,
            mine.leaf_certificate().to_vec(),
            mine.leaf_is_fresh(),
            ep,
            Duration::from_secs(5),
            Arc::clone(&stats),
        );
        tokio::spawn(Arc::clone(&membership).run());
        until("the owner up", || {
            membership.member_at(&owner).is_some_and(|m| m.is_up())
        })
        .await;
        let client = PeerClient::new(
            Arc::clone(&membership),
            dataset,
            block_size,
            Duration::from_secs(5),
            Arc::clone(&stats),
        );
        let got = client.fetch_inner(Arc::clone(&file), index, 4096).await;
        assert_eq!(streams.load(Relaxed), 2, "asked once more after the reset");
        let got = got.expect("the block was not asked for again");
        assert_eq!(got.data(), &data);
        assert!(membership.member_at(&owner).unwrap().is_up());
        assert_eq!(stats.peer_failures.load(Relaxed), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_owner_waited_for_that_fails_is_followed_by_the_next_member() {
        let ca = test_ca("test CA");
        let mine = admin_identity(&ca, "locafs.example.com");
        let mut ep =
            quinn::Endpoint::server(mine.server_config(), "127.0.0.1:0".parse().unwrap()).unwrap();
        ep.set_default_client_config(mine.client_config());
        let me = ep.local_addr().unwrap();
        // Two members whose ports are held, unanswered, until they serve.
        let held: Vec<UdpSocket> = (0..2)
            .map(|_| UdpSocket::bind("127.0.0.1:0").unwrap())
            .collect();
        let addrs: Vec<SocketAddr> = held.iter().map(|s| s.local_addr().unwrap()).collect();
        let file = Arc::new(FileVersion::new(
            Arc::from(Path::new("f")),
            SourceVersion {
                size: 1 << 30,
                mtime_ns: 1,
                ino: 2,
            },
        ));
        let (dataset, block_size, len) = ([3u8; 16], 4096u32, 4096usize);
        // A block ranked: one member, the other, this node last.
        let ids: Vec<MemberId> = [me, addrs[0], addrs[1]]
            .iter()
            .map(|a| MemberId::new(a.to_string()))
            .collect();
        let ranking = Placement::new(ids.clone());
        let key = |i| block_key(&dataset, &path_id(&file.rel), i, block_size);
        let index = (0..)
            .find(|&i| ranking.owners(&key(i))[2] == &ids[0])
            .unwrap();
        let owners = ranking.owners(&key(index));
        let pos = |id: &MemberId| ids.iter().position(|x| x == id).unwrap() - 1;
        let (late, next) = (pos(owners[0]), pos(owners[1]));

        let stats = Arc::new(Stats::default());
        let membership = Membership::new(
            [me, addrs[0], addrs[1]]
                .iter()
                .map(|a| a.to_string())
                .collect(),
            me,
            mine.leaf_certificate().to_vec(),
            mine.leaf_is_fresh(),
            ep,
            Duration::from_millis(500),
            Arc::clone(&stats),
        );
        tokio::spawn(Arc::clone(&membership).run());
        // The next-ranked member serves the block from the start.
        let data = Bytes::from(vec![7u8; len]);
        let mut held: Vec<Option<UdpSocket>> = held.into_iter().map(Some).collect();
        held[next] = None;
        let block = Frame::Block {
            checksum: block_checksum(&data),
            data: data.clone(),
        };
        answer_all(
            &admin_identity(&ca, "locafs.example.com"),
            addrs[next],
            block,
        );
        let member = |i: usize| membership.member_at(&addrs[i]);
        until("the next member up", || {
            member(next).is_some_and(|m| m.is_up())
        })
        .await;
        assert!(member(late).unwrap().is_expected());

        // The owner is waited for; it comes up and lacks the block.
        let client = PeerClient::new(
            Arc::clone(&membership),
            dataset,
            block_size,
            Duration::from_secs(20),
            Arc::clone(&stats),
        );
        let fetch = tokio::spawn(client.fetch_inner(Arc::clone(&file), index, len));
        until("a wait for the owner", || {
            stats.peer_owner_waits.load(Relaxed) == 1
        })
        .await;
        held[late] = None;
        answer_all(
            &admin_identity(&ca, "locafs.example.com"),
            addrs[late],
            Frame::NotFound,
        );
        let got = tokio::time::timeout(Duration::from_secs(60), fetch)
            .await
            .expect("the fetch ended")
            .unwrap();
        assert_eq!(stats.peer_owner_waits_met.load(Relaxed), 1);
        assert_eq!(member(late).unwrap().requests.load(Relaxed), 1);
        assert_eq!(member(next).unwrap().requests.load(Relaxed), 1);
        let got = got.expect("the next member was not asked after the owner failed");
        assert_eq!(got.data(), &data);
    }
}
