//! Who the other nodes of the job are and which of them are reachable now.
//!
//! The member list comes from `--peers` (host:port entries, IP literals or DNS
//! names; a name may resolve to several addresses, as a Kubernetes headless
//! service does), re-resolved every [`RESOLVE_EVERY`], so members join and
//! leave without a restart. A member's stable id is its resolved `ip:port`,
//! the same string on every node, which is what placement hashes.
//!
//! A node recognises itself in the list by its `--listen` address (exact
//! match, or the listen port on one of its own IPs when it listens on
//! 0.0.0.0/::), and, as a last resort, by meeting its own certificate when it
//! connects to an address. From a cluster secret each start makes a fresh
//! leaf certificate, which serves as the node id exchanged at connect. An
//! admin's certificate may be shared by several nodes, so there the match is
//! only a candidate: the connection is this node's own only if this node's
//! server accepted it, which both ends can tell from a TLS exporter value
//! (equal on the two ends of one connection, unguessable otherwise) that the
//! server side records for connections presenting our certificate
//! ([`Membership::note_accepted`]).
//!
//! Each other member is up (a live QUIC connection) or down since some time;
//! a down member is retried with a backoff from [`MIN_BACKOFF`] to
//! [`MAX_BACKOFF`], at once when it connects to us. Up is not the same as
//! answering fast: the client tells a slow member (its connection still
//! carries packets, [`Member::silent_for`]) from a silent one, and marks
//! only the silent one down. Placement follows the
//! configured list from the first request: it is computed over this node,
//! the members that are up, and the members not reached yet that are still
//! *expected* (listed less than [`JOIN_WINDOW`] ago). So a node that has not
//! reached its peers yet does not take their blocks for its own (each block
//! keeps one owner while the mesh forms); a member that was reached and then
//! lost leaves placement at once, and so does one never reached within the
//! window. The first resolution of the list runs before the mount is served
//! ([`Membership::resolve_now`]). The module keeps per-member counters
//! (bytes each way, requests, failures, lies, latency) and the time the mesh
//! took to form (every member reached once) for `stats`.
//!
//! It must never block a read: lookups are a lock and an `Arc` clone, and all
//! connecting and resolving happens in its own task with deadlines.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use tokio::sync::{Notify, Semaphore};
use tracing::{debug, info, warn};

use super::placement::{MemberId, Placement};
use super::tls::PEER_SERVER_NAME;
use crate::obs::stats::{PeerSnapshot, Stats};

/// How often `--peers` names are resolved again.
pub const RESOLVE_EVERY: Duration = Duration::from_secs(5);
/// First retry delay after a member goes down.
pub const MIN_BACKOFF: Duration = Duration::from_millis(250);
/// Longest delay between two connection attempts to a down member.
pub const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// Requests in flight to one member at a time; more wait (within the request
/// deadline) for a slot.
pub const STREAMS_PER_PEER: usize = 32;
/// Longest wait, after connecting to an address that presents this node's
/// own (shared) certificate, for our server side to report that it accepted
/// that very connection.
pub const SELF_CHECK_WAIT: Duration = Duration::from_secs(2);
/// TLS exporter label of the self check.
const SELF_CHECK_LABEL: &[u8] = b"locafs self check v1";
/// Accepted connections presenting our certificate that are remembered.
const SELF_CHECK_KEEP: usize = 64;
/// How often each side of a peer connection sends a keep-alive while it has
/// nothing else to send: a live member is heard from at least this often.
pub const KEEP_ALIVE: Duration = Duration::from_secs(1);
/// A member whose connection has carried no packet at all for this long
/// (twice [`KEEP_ALIVE`]) is *silent*: stopped, dead or cut off, not merely
/// slow. A request to a silent member is given up at `--peer-timeout` and
/// the member marked down; one to a member still heard from may wait
/// longer (`client`). quinn itself closes a connection silent for 5 s.
pub const SILENT_AFTER: Duration = Duration::from_secs(2);
/// How long a listed member that has not been reached yet still owns its
/// blocks (counted from when it entered the list: the mount's start, or a
/// later resolution that found it). Within it, read-ahead leaves its blocks
/// to it and a read of one waits for it (at most `--peer-timeout`, longer
/// if it runs: `client`); past it the member is treated as down, like one
/// that was lost. Measured: 64 nodes started together on one 2-core
/// machine, 4,032 TLS handshakes on those 2 cores, all reached each other
/// 7.2-11.4 s after the first start (docs/cluster.md; a member still
/// unreached at 10 s moves its blocks for a moment); real nodes, each with
/// cores of its own, sooner. A
/// longer window would cover later starters, at the price of a wait of up
/// to `--peer-timeout` per read of a block of a member that never comes.
pub const JOIN_WINDOW: Duration = Duration::from_secs(10);

/// One other node of the job and what we know about it.
pub struct Member {
    pub id: MemberId,
    pub addr: SocketAddr,
    /// The `--peers` entry it was resolved from.
    pub name: String,
    state: Mutex<LinkState>,
    /// Bounds the requests in flight to this member.
    pub slots: Semaphore,
    pub bytes_received: AtomicU64,
    pub bytes_sent: AtomicU64,
    pub requests: AtomicU64,
    pub failures: AtomicU64,
    pub bad_blocks: AtomicU64,
    /// Exponentially weighted mean of successful request latency, in µs.
    latency_us: AtomicU64,
    /// Up at least once since it entered the list.
    reached: AtomicBool,
    /// Never reached and past [`JOIN_WINDOW`]: out of placement until it
    /// comes up (set once, by the membership task).
    absent: AtomicBool,
    /// When it entered the list.
    listed_at: Instant,
    /// Woken when it comes up (readers waiting for an expected owner).
    came_up: Notify,
    /// What was last heard on its connection (see [`Member::silent_for`]).
    heard: Mutex<Heard>,
    /// When it last answered a request of ours (any answer), or came up.
    answered: Mutex<Instant>,
    /// When it last tried to connect to us (an attempt seen, or a
    /// connection accepted): proof that it runs, while our connection to it
    /// may still be forming.
    tried_us: Mutex<Option<Instant>>,
}

/// The datagrams received on one connection when last looked at, and when
/// that count last grew.
struct Heard {
    conn: usize,
    datagrams: u64,
    at: Instant,
}

struct LinkState {
    conn: Option<quinn::Connection>,
    since: Instant,
    backoff: Duration,
    next_try: Instant,
    /// Connection attempts in flight (at most two: see `note_incoming`).
    connecting: u8,
    /// The member connected to us while an attempt of ours was in flight:
    /// start another now rather than wait for that one's timeout.
    urgent: bool,
}

impl Member {
    fn new(id: MemberId, addr: SocketAddr, name: String) -> Self {
        Member {
            id,
            addr,
            name,
            state: Mutex::new(LinkState {
                conn: None,
                since: Instant::now(),
                backoff: MIN_BACKOFF,
                next_try: Instant::now(),
                connecting: 0,
                urgent: false,
            }),
            slots: Semaphore::new(STREAMS_PER_PEER),
            bytes_received: AtomicU64::new(0),
            bytes_sent: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            bad_blocks: AtomicU64::new(0),
            latency_us: AtomicU64::new(0),
            reached: AtomicBool::new(false),
            absent: AtomicBool::new(false),
            listed_at: Instant::now(),
            came_up: Notify::new(),
            heard: Mutex::new(Heard {
                conn: usize::MAX,
                datagrams: 0,
                at: Instant::now(),
            }),
            answered: Mutex::new(Instant::now()),
            tried_us: Mutex::new(None),
        }
    }

    /// Whether it tried to connect to us within `d`: it runs, even if our
    /// connection to it has not formed yet.
    pub fn tried_us_within(&self, d: Duration) -> bool {
        self.tried_us.lock().is_some_and(|at| at.elapsed() < d)
    }

    /// How long `conn` (this member's connection) has carried no packet
    /// from it, to the precision of how often this is asked (a request
    /// waiting past `--peer-timeout` asks every [`crate::peer::client::LISTEN_EVERY`]).
    /// Any packet counts: an answer, an acknowledgement, a keep-alive.
    pub fn silent_for(&self, conn: &quinn::Connection) -> Duration {
        let datagrams = conn.stats().udp_rx.datagrams;
        let now = Instant::now();
        let mut h = self.heard.lock();
        if h.conn != conn.stable_id() || h.datagrams != datagrams {
            *h = Heard {
                conn: conn.stable_id(),
                datagrams,
                at: now,
            };
        }
        now.saturating_duration_since(h.at)
    }

    /// Notes that it answered a request (a block, or a refusal of any kind).
    pub fn note_answer(&self) {
        *self.answered.lock() = Instant::now();
    }

    /// How long since it last answered one of our requests (or came up).
    pub fn unanswered_for(&self) -> Duration {
        self.answered.lock().elapsed()
    }

    /// Not reached yet, and still within [`JOIN_WINDOW`] of being listed:
    /// it owns its blocks, and reads of them wait for it.
    pub fn is_expected(&self) -> bool {
        !self.reached.load(Relaxed) && !self.absent.load(Relaxed)
    }

    /// Whether it was ever up since it was listed.
    pub fn was_reached(&self) -> bool {
        self.reached.load(Relaxed)
    }

    /// Waits until the member is up, at most `limit`; true if it is.
    pub async fn wait_up(&self, limit: Duration) -> bool {
        let woken = self.came_up.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        if self.is_up() {
            return true;
        }
        let _ = tokio::time::timeout(limit, woken).await;
        self.is_up()
    }

    /// The live connection, if the member is up.
    pub fn connection(&self) -> Option<quinn::Connection> {
        self.state.lock().conn.clone()
    }

    pub fn is_up(&self) -> bool {
        self.state.lock().conn.is_some()
    }

    /// Notes a successful request's latency.
    pub fn record_latency(&self, d: Duration) {
        let us = d.as_micros().min(u64::MAX as u128) as u64;
        let old = self.latency_us.load(Relaxed);
        let new = if old == 0 { us } else { (old * 7 + us) / 8 };
        self.latency_us.store(new.max(1), Relaxed);
    }
}

/// The member list of this node, its liveness view and the placement over it.
pub struct Membership {
    names: Vec<String>,
    listen: SocketAddr,
    own_cert: Vec<u8>,
    /// Only this process presents `own_cert` (made at this start).
    own_cert_is_fresh: bool,
    /// Exporter values of connections our server accepted from a client
    /// presenting `own_cert`, newest last.
    accepted_own_cert: Mutex<Vec<([u8; 32], Instant)>>,
    /// Whether "another node shares our certificate" was logged.
    told_shared_cert: AtomicBool,
    endpoint: quinn::Endpoint,
    connect_timeout: Duration,
    /// This node's member id, once found in the list.
    me: RwLock<Option<MemberId>>,
    members: RwLock<HashMap<SocketAddr, Arc<Member>>>,
    /// Addresses found to be this node by certificate.
    self_addrs: Mutex<Vec<SocketAddr>>,
    placement: RwLock<Arc<Placement>>,
    wake: Notify,
    /// Where the mesh's formation time goes (`stats.peer_mesh_formed_ms`).
    stats: Arc<Stats>,
}

/// Whether `ip` is an address of this machine (in this network namespace).
fn is_local_ip(ip: IpAddr) -> bool {
    ip.is_loopback() || std::net::UdpSocket::bind(SocketAddr::new(ip, 0)).is_ok()
}

impl Membership {
    /// `own_cert` is this node's leaf certificate (DER); `own_cert_is_fresh`
    /// says that no other process can present it (see the module doc).
    pub fn new(
        names: Vec<String>,
        listen: SocketAddr,
        own_cert: Vec<u8>,
        own_cert_is_fresh: bool,
        endpoint: quinn::Endpoint,
        connect_timeout: Duration,
        stats: Arc<Stats>,
    ) -> Arc<Self> {
        Arc::new(Membership {
            names,
            listen,
            own_cert,
            own_cert_is_fresh,
            accepted_own_cert: Mutex::new(Vec::new()),
            told_shared_cert: AtomicBool::new(false),
            endpoint,
            connect_timeout,
            me: RwLock::new(None),
            members: RwLock::new(HashMap::new()),
            self_addrs: Mutex::new(Vec::new()),
            placement: RwLock::new(Arc::new(Placement::new(Vec::new()))),
            wake: Notify::new(),
            stats,
        })
    }

    /// Whether `addr` (from the peer list) is this node.
    fn is_me(&self, addr: &SocketAddr) -> bool {
        if *addr == self.listen || self.self_addrs.lock().contains(addr) {
            return true;
        }
        self.listen.ip().is_unspecified()
            && addr.port() == self.listen.port()
            && is_local_ip(addr.ip())
    }

    /// Whether `conn`'s peer presented this node's own certificate.
    fn presents_own_cert(&self, conn: &quinn::Connection) -> bool {
        conn.peer_identity()
            .and_then(|i| i.downcast::<Vec<rustls::pki_types::CertificateDer>>().ok())
            .is_some_and(|c| c.first().is_some_and(|c| c.as_ref() == self.own_cert))
    }

    /// The self-check value of a connection: the same on both of its ends.
    fn exporter(conn: &quinn::Connection) -> Option<[u8; 32]> {
        let mut out = [0u8; 32];
        conn.export_keying_material(&mut out, SELF_CHECK_LABEL, b"")
            .ok()
            .map(|()| out)
    }

    /// Called by the server for every connection it accepted: remembers the
    /// ones that present this node's own certificate, so that the connecting
    /// side can tell whether it reached this node itself.
    pub fn note_accepted(&self, conn: &quinn::Connection) {
        if self.own_cert_is_fresh || !self.presents_own_cert(conn) {
            return;
        }
        if let Some(v) = Self::exporter(conn) {
            let mut seen = self.accepted_own_cert.lock();
            if seen.len() >= SELF_CHECK_KEEP {
                seen.remove(0);
            }
            seen.push((v, Instant::now()));
        }
    }

    /// Whether an outgoing connection reached this very process: from a
    /// fresh certificate, meeting it is proof; from a shared one, only our
    /// server having accepted this same connection is.
    async fn reached_myself(&self, conn: &quinn::Connection) -> bool {
        if !self.presents_own_cert(conn) {
            return false;
        }
        if self.own_cert_is_fresh {
            return true;
        }
        let Some(v) = Self::exporter(conn) else {
            return false;
        };
        // The server side completes its handshake a moment after ours.
        let deadline = Instant::now() + SELF_CHECK_WAIT;
        loop {
            {
                let mut seen = self.accepted_own_cert.lock();
                seen.retain(|(_, at)| at.elapsed() < Duration::from_secs(60));
                if seen.iter().any(|(s, _)| *s == v) {
                    return true;
                }
            }
            if Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if !self.told_shared_cert.swap(true, Relaxed) {
            info!(
                "peer {} presents this node's certificate: the certificate is shared by \
                 several nodes (fine; nodes are told apart by their connections)",
                conn.remote_address()
            );
        }
        false
    }

    /// This node's member id, if it is in the list.
    pub fn me(&self) -> Option<MemberId> {
        self.me.read().clone()
    }

    /// Every member of the configured `--peers` list as last resolved, up or
    /// down, this node included once it has found itself: the members the
    /// placement has when every node is up (the `where` query's owners).
    pub fn configured(&self) -> (Vec<MemberId>, Option<MemberId>) {
        let me = self.me();
        let mut ids: Vec<MemberId> = self.members.read().values().map(|m| m.id.clone()).collect();
        ids.extend(me.clone());
        (ids, me)
    }

    /// The placement over this node, the members that are up now and the
    /// members still expected (see the module doc).
    pub fn placement(&self) -> Arc<Placement> {
        Arc::clone(&self.placement.read())
    }

    pub fn member(&self, id: &MemberId) -> Option<Arc<Member>> {
        let addr: SocketAddr = id.as_str().parse().ok()?;
        self.members.read().get(&addr).cloned()
    }

    /// The member that connects from `addr`, if any (connections come from
    /// each node's listening endpoint, so this is its peer-list address on
    /// flat networks).
    pub fn member_at(&self, addr: &SocketAddr) -> Option<Arc<Member>> {
        let members = self.members.read();
        if let Some(m) = members.get(addr) {
            return Some(Arc::clone(m));
        }
        // An IPv4 peer seen through a dual-stack socket.
        let canon = SocketAddr::new(addr.ip().to_canonical(), addr.port());
        members.get(&canon).cloned()
    }

    fn rebuild_placement(&self) {
        let mut ids: Vec<MemberId> = self
            .members
            .read()
            .values()
            .filter(|m| m.is_up() || m.is_expected())
            .map(|m| m.id.clone())
            .collect();
        if let Some(me) = self.me() {
            ids.push(me);
        }
        *self.placement.write() = Arc::new(Placement::new(ids));
    }

    /// Marks the members never reached within [`JOIN_WINDOW`] absent (out
    /// of placement), and notes when every listed member has been reached
    /// once: the time the mesh took to form, from the mount's start.
    fn check_window_and_mesh(&self) {
        let (mut expired, mut all_reached, mut unreached) = (false, true, 0u64);
        for m in self.members.read().values() {
            if m.was_reached() {
                continue;
            }
            all_reached = false;
            unreached += 1;
            if !m.absent.load(Relaxed) && m.listed_at.elapsed() >= JOIN_WINDOW {
                m.absent.store(true, Relaxed);
                info!(peer = %m.id, "peer not reached within {JOIN_WINDOW:?} of being listed: its blocks go to the next members until it comes up");
                expired = true;
            }
        }
        self.stats.peer_members_unreached.store(unreached, Relaxed);
        if all_reached && self.me().is_some() && self.stats.peer_mesh_formed_ms.load(Relaxed) == 0 {
            let ms = self.stats.started.elapsed().as_millis() as u64;
            self.stats.peer_mesh_formed_ms.store(ms.max(1), Relaxed);
            info!(
                "peer mesh formed: every member reached, {:.2} s after start",
                ms as f64 / 1000.0
            );
        }
        if expired {
            self.rebuild_placement();
        }
    }

    /// Takes a member out of placement after a failure; it is retried later.
    pub fn mark_down(&self, m: &Member, why: &str) {
        self.mark_down_for(m, why, None)
    }

    /// Like [`Membership::mark_down`], with a fixed retry delay (a peer that
    /// sent a bad block waits [`MAX_BACKOFF`]).
    pub fn mark_down_for(&self, m: &Member, why: &str, delay: Option<Duration>) {
        let was_up = {
            let mut st = m.state.lock();
            let was_up = st.conn.is_some();
            if let Some(c) = st.conn.take() {
                c.close(1u32.into(), b"marked down");
            }
            if was_up {
                st.since = Instant::now();
                st.backoff = MIN_BACKOFF;
            } else {
                st.backoff = (st.backoff * 2).min(MAX_BACKOFF);
            }
            st.next_try = Instant::now() + delay.unwrap_or(st.backoff);
            was_up
        };
        if was_up {
            warn!(peer = %m.id, "peer down: {why}");
            self.rebuild_placement();
        }
    }

    /// A connection came in from `addr`: if that is a member we think is
    /// down, try it now instead of waiting for its backoff, and even if an
    /// attempt of ours is in flight. At start that attempt was likely sent
    /// before the member listened, and QUIC resends its first packet only
    /// after about a second (then two): a fresh attempt to a member known
    /// to be up takes a round trip. Measured at 64 nodes started together
    /// on one machine: the mesh formed in 7.2 s without this (docs/cluster.md).
    pub fn note_incoming(&self, addr: SocketAddr) {
        if let Some(m) = self.member_at(&addr) {
            *m.tried_us.lock() = Some(Instant::now());
            let mut st = m.state.lock();
            if st.conn.is_none() {
                st.next_try = Instant::now();
                st.urgent = st.connecting > 0;
                drop(st);
                self.wake.notify_one();
            }
        }
    }

    /// A connection attempt came in from `addr` (before any handshake):
    /// if that is a member, it runs. Readers waiting for it while it is not
    /// reached yet may wait a little longer (`client`). The address is not
    /// proven yet, so this decides nothing else.
    pub fn note_attempt(&self, addr: SocketAddr) {
        if let Some(m) = self.member_at(&addr) {
            *m.tried_us.lock() = Some(Instant::now());
        }
    }

    /// The first resolution of the list, before the mount serves anything,
    /// so that placement follows the configured members from the first
    /// request; bounded by `limit` (a name that has not resolved by then is
    /// left to the membership task).
    pub fn resolve_now(self: &Arc<Self>, rt: &tokio::runtime::Handle, limit: Duration) {
        let me = Arc::clone(self);
        let rt = rt.clone();
        // On a thread of its own: the caller may be inside the runtime.
        let _ = std::thread::spawn(move || {
            rt.block_on(async {
                let _ = tokio::time::timeout(limit, me.resolve()).await;
            })
        })
        .join();
        self.check_window_and_mesh();
    }

    /// Resolves the peer list once, updating the members.
    async fn resolve(self: &Arc<Self>) {
        let mut found: HashMap<SocketAddr, String> = HashMap::new();
        let mut failed = false;
        for name in &self.names {
            let lookup = tokio::net::lookup_host(name.as_str());
            match tokio::time::timeout(Duration::from_secs(5), lookup).await {
                Ok(Ok(addrs)) => {
                    for a in addrs {
                        let a = SocketAddr::new(a.ip().to_canonical(), a.port());
                        found.entry(a).or_insert_with(|| name.clone());
                    }
                }
                Ok(Err(e)) => {
                    failed = true;
                    debug!("peer list: cannot resolve {name}: {e}");
                }
                Err(_) => {
                    failed = true;
                    debug!("peer list: resolving {name} timed out");
                }
            }
        }
        let mut changed = false;
        {
            let mut members = self.members.write();
            for (addr, name) in &found {
                if self.is_me(addr) {
                    let mut me = self.me.write();
                    if me.is_none() {
                        info!("peer list: this node is {addr}");
                        *me = Some(MemberId::new(addr.to_string()));
                        changed = true;
                    }
                    if let Some(m) = members.remove(addr) {
                        if let Some(c) = m.state.lock().conn.take() {
                            c.close(0u32.into(), b"self");
                        }
                    }
                    continue;
                }
                if !members.contains_key(addr) {
                    debug!("peer list: member {addr} ({name})");
                    // Expected from now on: it owns its blocks at once.
                    changed = true;
                    members.insert(
                        *addr,
                        Arc::new(Member::new(
                            MemberId::new(addr.to_string()),
                            *addr,
                            name.clone(),
                        )),
                    );
                }
            }
            // A name that failed to resolve keeps its old members: a DNS
            // hiccup must not empty the cluster.
            if !failed {
                members.retain(|addr, m| {
                    let keep = found.contains_key(addr);
                    if !keep {
                        info!(peer = %m.id, "peer left the peer list");
                        if let Some(c) = m.state.lock().conn.take() {
                            c.close(0u32.into(), b"left");
                            changed = true;
                        }
                    }
                    keep
                });
            }
        }
        if changed {
            self.rebuild_placement();
        }
    }

    /// One connection attempt to a down member.
    async fn connect(self: Arc<Self>, m: Arc<Member>) {
        let attempt = async {
            let connecting = self
                .endpoint
                .connect(m.addr, PEER_SERVER_NAME)
                .map_err(|e| e.to_string())?;
            connecting.await.map_err(|e| e.to_string())
        };
        let res = match tokio::time::timeout(self.connect_timeout, attempt).await {
            Ok(r) => r,
            Err(_) => Err("connect timed out".to_owned()),
        };
        // Still "connecting" while the self check may wait, so that no second
        // attempt starts meanwhile.
        let own = match &res {
            Ok(conn) => self.reached_myself(conn).await,
            Err(_) => false,
        };
        let already_up = {
            let mut st = m.state.lock();
            st.connecting = st.connecting.saturating_sub(1);
            st.conn.is_some()
        };
        if already_up {
            // Another attempt (see `note_incoming`) got there first.
            if let Ok(conn) = res {
                conn.close(0u32.into(), b"duplicate");
            }
            return;
        }
        match res {
            Ok(conn) => {
                if own {
                    info!("peer list: {} is this node (same certificate)", m.addr);
                    conn.close(0u32.into(), b"self");
                    self.self_addrs.lock().push(m.addr);
                    self.members.write().remove(&m.addr);
                    let mut me = self.me.write();
                    if me.is_none() {
                        *me = Some(m.id.clone());
                    }
                    drop(me);
                    self.rebuild_placement();
                    return;
                }
                {
                    let mut st = m.state.lock();
                    st.conn = Some(conn.clone());
                    st.since = Instant::now();
                    st.backoff = MIN_BACKOFF;
                }
                m.note_answer();
                m.reached.store(true, Relaxed);
                m.absent.store(false, Relaxed);
                m.came_up.notify_waiters();
                info!(peer = %m.id, "peer up");
                self.rebuild_placement();
                self.check_window_and_mesh();
                // Watch the connection: closed by the peer, idle timeout, or
                // our own mark_down.
                let me = Arc::clone(&self);
                tokio::spawn(async move {
                    let why = conn.closed().await;
                    let current = m
                        .state
                        .lock()
                        .conn
                        .as_ref()
                        .is_some_and(|c| c.stable_id() == conn.stable_id());
                    if current {
                        me.mark_down(&m, &format!("connection lost: {why}"));
                    }
                });
            }
            Err(e) => {
                debug!(peer = %m.id, "peer connect failed: {e}");
                self.mark_down(&m, &e);
            }
        }
    }

    /// Resolves, connects and retries forever; run as one task.
    pub async fn run(self: Arc<Self>) {
        let mut next_resolve = Instant::now();
        loop {
            if Instant::now() >= next_resolve {
                self.resolve().await;
                next_resolve = Instant::now() + RESOLVE_EVERY;
            }
            let now = Instant::now();
            let due: Vec<Arc<Member>> = self
                .members
                .read()
                .values()
                .filter(|m| {
                    let mut st = m.state.lock();
                    let free = st.connecting == 0 || (st.urgent && st.connecting < 2);
                    let due = st.conn.is_none() && free && st.next_try <= now;
                    if due {
                        st.connecting += 1;
                        st.urgent = false;
                    }
                    due
                })
                .cloned()
                .collect();
            for m in due {
                tokio::spawn(Arc::clone(&self).connect(m));
            }
            self.check_window_and_mesh();
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                _ = self.wake.notified() => {}
            }
        }
    }

    /// What `locafs stats` shows about each member.
    pub fn snapshot(&self) -> Vec<PeerSnapshot> {
        let mut out: Vec<PeerSnapshot> = Vec::new();
        if let Some(me) = self.me() {
            out.push(PeerSnapshot {
                address: me.to_string(),
                name: "(this node)".into(),
                state: "self".into(),
                since_s: 0.0,
                bytes_received: 0,
                bytes_sent: 0,
                requests: 0,
                failures: 0,
                bad_blocks: 0,
                latency_ms: None,
            });
        }
        for m in self.members.read().values() {
            let st = m.state.lock();
            let lat = m.latency_us.load(Relaxed);
            out.push(PeerSnapshot {
                address: m.id.to_string(),
                name: m.name.clone(),
                state: if st.conn.is_some() {
                    "up"
                } else if m.is_expected() {
                    "unreached"
                } else {
                    "down"
                }
                .into(),
                since_s: st.since.elapsed().as_secs_f64(),
                bytes_received: m.bytes_received.load(Relaxed),
                bytes_sent: m.bytes_sent.load(Relaxed),
                requests: m.requests.load(Relaxed),
                failures: m.failures.load(Relaxed),
                bad_blocks: m.bad_blocks.load(Relaxed),
                latency_ms: (lat > 0).then(|| lat as f64 / 1000.0),
            });
        }
        out.sort_by(|a, b| a.address.cmp(&b.address));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::peer::tls::ClusterIdentity;

    /// One admin certificate (and key) that several nodes are given.
    fn shared_identity() -> ClusterIdentity {
        use crate::peer::tls::test_pki::{admin_identity, test_ca};
        admin_identity(&test_ca("test CA"), "locafs.example.com")
    }

    /// A node's endpoint whose server side reports what it accepts to
    /// `membership` (as `PeerServer` does) and keeps the connections open.
    fn endpoint(id: &ClusterIdentity) -> quinn::Endpoint {
        let mut ep =
            quinn::Endpoint::server(id.server_config(), "127.0.0.1:0".parse().unwrap()).unwrap();
        ep.set_default_client_config(id.client_config());
        ep
    }

    fn serve(ep: quinn::Endpoint, membership: Arc<Membership>) {
        tokio::spawn(async move {
            while let Some(incoming) = ep.accept().await {
                let membership = Arc::clone(&membership);
                tokio::spawn(async move {
                    if let Ok(conn) = incoming.await {
                        membership.note_accepted(&conn);
                        conn.closed().await;
                    }
                });
            }
        });
    }

    #[tokio::test]
    async fn a_shared_certificate_tells_this_node_from_another_node() {
        let id = shared_identity();
        assert!(!id.leaf_is_fresh());
        let (mine, theirs) = (endpoint(&id), endpoint(&id));
        let (my_addr, their_addr) = (mine.local_addr().unwrap(), theirs.local_addr().unwrap());
        let new = |ep: &quinn::Endpoint, names: Vec<String>| {
            Membership::new(
                names,
                // Not the endpoint's address: only the certificate check can
                // find this node in the list.
                "127.0.0.1:1".parse().unwrap(),
                id.leaf_certificate().to_vec(),
                id.leaf_is_fresh(),
                ep.clone(),
                Duration::from_secs(5),
                Arc::new(Stats::default()),
            )
        };
        let m = new(&mine, vec![my_addr.to_string(), their_addr.to_string()]);
        let other = new(&theirs, Vec::new());
        serve(mine, Arc::clone(&m));
        serve(theirs, other);
        tokio::spawn(Arc::clone(&m).run());
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let me = m.me().map(|id| id.to_string());
            let up = m.member_at(&their_addr).is_some_and(|p| p.is_up());
            if me.as_deref() == Some(my_addr.to_string().as_str()) && up {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "me {me:?} (want {my_addr}), other up {up}: {:?}",
                m.snapshot()
                    .iter()
                    .map(|p| (&p.address, &p.state))
                    .collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(m.member_at(&my_addr).is_none());
        assert_eq!(m.placement().len(), 2);
    }
}
