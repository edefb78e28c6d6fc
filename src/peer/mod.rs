//! The cluster subsystem: the peer cache (this file and the wire up below),
//! the `where` query that names each file's owner and cached state
//! (`locate`), and the reference of locality-aware loading's assignment of
//! samples to learners, which the Python sampler implements bit for bit
//! (`sampler`).
//!
//! The peer cache: the nodes of one job act as one cache, so that each block
//! leaves the source once per cluster instead of once per node per epoch.
//!
//! Pieces, from the wire up: `codec` (frames, pure), `placement` (rendezvous
//! hashing, pure), `tls` (mutual authentication from the cluster secret or
//! the admin's CA and certificates),
//! `membership` (the `--peers` list, liveness, one pooled QUIC connection per
//! member), `client` (the [`crate::read::reader::PeerTier`] the reader asks:
//! owner first, then the next in line, verified, bounded in time) and
//! `server` (answers other nodes from `Reader::fetch_for_peer`, within
//! the per-host limits and reply memory of `limits`). [`PeerNode`]
//! binds the one QUIC endpoint that both serves and connects (so a peer's
//! connections come from its listening address) and starts the tasks.
//!
//! Nothing here may fail a read or hold one without a deadline: every fault
//! of a peer ends in the reader going to the source.

pub mod client;
pub mod codec;
pub mod limits;
pub mod locate;
pub mod membership;
pub mod placement;
pub mod sampler;
pub mod server;
pub mod tls;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Handle;

use crate::obs::stats::Stats;
use crate::read::reader::Reader;
use crate::source::Source;

use self::client::PeerClient;
use self::membership::Membership;
use self::server::PeerServer;
use self::tls::ClusterIdentity;

/// What `--listen`, `--peers`, `--cluster-secret-file` (or `--peer-ca`,
/// `--peer-cert` and `--peer-key`) and `--peer-timeout` resolve to.
#[derive(Clone, Debug)]
pub struct PeerConfig {
    pub listen: SocketAddr,
    /// `host:port` entries as given (names are resolved again periodically).
    pub peers: Vec<String>,
    pub identity: ClusterIdentity,
    pub timeout: Duration,
    /// Bytes that replies to other nodes may hold at once: the share of
    /// `--prefetch-memory` that [`limits::reply_memory`] gives (set by
    /// `config::resolve`).
    pub reply_memory: u64,
}

/// The 16-byte data set id on the wire, from the `--dataset-id` name (or the
/// default derived from the source path): nodes must agree on it.
pub fn wire_dataset_id(name: &str) -> [u8; 16] {
    let k = blake3::derive_key("locafs dataset id v1", name.as_bytes());
    let mut id = [0u8; 16];
    id.copy_from_slice(&k[..16]);
    id
}

/// The largest UDP payload path MTU discovery tries: a 9000-byte jumbo frame
/// less the IPv6 and UDP headers.
const JUMBO_UDP_PAYLOAD: u16 = 9000 - 40 - 8;

/// The receive buffer asked for the peer socket: one UDP socket takes the
/// packets of every other member (handshakes, requests, blocks), and while
/// the node's threads wait for a core the kernel queues them there; once it
/// is full it drops them, and QUIC resends each only after a timeout that
/// starts near a second and doubles. Measured: 64 nodes started together on
/// one 2-core machine, with the default 208 KiB the kernel dropped about 3%
/// of the peers' datagrams (`RcvbufErrors` in /proc/net/snmp), and
/// handshakes that lost two packets ran past their 5 s limit (the mesh took
/// 12-15 s); see docs/cluster.md.
pub const RECEIVE_BUFFER: usize = 4 << 20;

/// Asks for [`RECEIVE_BUFFER`] on `socket`: past `net.core.rmem_max` if the
/// process may (CAP_NET_ADMIN), else up to it. A refusal is logged and
/// costs only the drops above.
fn widen_receive_buffer(socket: &std::net::UdpSocket) {
    use rustix::net::sockopt;
    if sockopt::set_socket_recv_buffer_size_force(socket, RECEIVE_BUFFER).is_err() {
        if let Err(e) = sockopt::set_socket_recv_buffer_size(socket, RECEIVE_BUFFER) {
            tracing::info!("peer socket: cannot widen the receive buffer: {e}");
        }
    }
    if let Ok(got) = sockopt::socket_recv_buffer_size(socket) {
        tracing::debug!("peer socket: receive buffer {} KiB", got >> 10);
    }
}

/// The running peer cache of one mount.
pub struct PeerNode {
    endpoint: quinn::Endpoint,
    membership: Arc<Membership>,
    client: PeerClient,
    cfg: PeerConfig,
    dataset: [u8; 16],
    block_size: u64,
    stats: Arc<Stats>,
}

impl PeerNode {
    /// Binds the endpoint and starts membership; fails if the address cannot
    /// be bound. Must be called inside the runtime `rt`.
    pub fn start(
        cfg: PeerConfig,
        dataset_name: &str,
        block_size: u64,
        stats: Arc<Stats>,
        rt: &Handle,
    ) -> std::io::Result<Arc<PeerNode>> {
        let _guard = rt.enter();
        let mut transport = quinn::TransportConfig::default();
        let window = (block_size * 4).max(8 << 20);
        // Peer traffic is bulk blocks, whose CPU cost is partly per packet:
        // path MTU discovery may go up to jumbo frames (on a 1500-byte
        // network it settles at 1452, quinn's default bound). Measured with
        // `LOCAFS_BENCH_MTU=9000 cargo bench --bench peers`: epochs 2-3
        // 2.57 -> 2.28 s. (Fewer ACKs, via the ACK frequency extension, made
        // no measurable difference and is not used.)
        let mut mtu = quinn::MtuDiscoveryConfig::default();
        mtu.upper_bound(JUMBO_UDP_PAYLOAD);
        transport
            .mtu_discovery_config(Some(mtu))
            .max_concurrent_bidi_streams(server::STREAMS_PER_CONNECTION.into())
            .max_concurrent_uni_streams(0u32.into())
            .stream_receive_window(quinn::VarInt::from_u64(window).unwrap_or(quinn::VarInt::MAX))
            .receive_window(quinn::VarInt::from_u64(window * 8).unwrap_or(quinn::VarInt::MAX))
            .send_window(window * 8)
            .keep_alive_interval(Some(membership::KEEP_ALIVE))
            .max_idle_timeout(Some(
                quinn::IdleTimeout::try_from(Duration::from_secs(5))
                    .map_err(std::io::Error::other)?,
            ));
        let transport = Arc::new(transport);
        let mut server_cfg = cfg.identity.server_config();
        server_cfg.transport_config(Arc::clone(&transport));
        // Attempts not yet decided on by the accept loop (which decides at
        // once: server.rs): quinn's defaults hold up to 65,536 of them and
        // 100 MiB of their packets. Past these it refuses new ones itself.
        // Our peers send no 0-RTT data, so an attempt's buffer holds only
        // a retransmitted Initial or two.
        server_cfg
            .max_incoming(server::MAX_INCOMING)
            .incoming_buffer_size(16 << 10)
            .incoming_buffer_size_total(4 << 20);
        let mut client_cfg = cfg.identity.client_config();
        client_cfg.transport_config(transport);
        let socket = std::net::UdpSocket::bind(cfg.listen)?;
        widen_receive_buffer(&socket);
        let runtime = quinn::default_runtime()
            .ok_or_else(|| std::io::Error::other("no async runtime found"))?;
        let mut endpoint = quinn::Endpoint::new(
            quinn::EndpointConfig::default(),
            Some(server_cfg),
            socket,
            runtime,
        )?;
        endpoint.set_default_client_config(client_cfg);
        let dataset = wire_dataset_id(dataset_name);
        let membership = Membership::new(
            cfg.peers.clone(),
            endpoint.local_addr()?,
            cfg.identity.leaf_certificate().to_vec(),
            cfg.identity.leaf_is_fresh(),
            endpoint.clone(),
            cfg.timeout.max(Duration::from_secs(1)),
            Arc::clone(&stats),
        );
        // Placement follows the configured list from the first request.
        membership.resolve_now(rt, cfg.timeout.max(Duration::from_secs(1)));
        rt.spawn(Arc::clone(&membership).run());
        let client = PeerClient::new(
            Arc::clone(&membership),
            dataset,
            block_size as u32,
            cfg.timeout,
            Arc::clone(&stats),
        );
        Ok(Arc::new(PeerNode {
            endpoint,
            membership,
            client,
            cfg,
            dataset,
            block_size,
            stats,
        }))
    }

    /// The data set id on the wire (part of every block's placement key).
    pub fn dataset(&self) -> [u8; 16] {
        self.dataset
    }

    /// The block size of placement keys.
    pub fn block_size(&self) -> u64 {
        self.block_size
    }

    /// The tier the reader asks.
    pub fn client(&self) -> PeerClient {
        self.client.clone()
    }

    pub fn membership(&self) -> &Arc<Membership> {
        &self.membership
    }

    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.endpoint.local_addr().ok()
    }

    /// Starts answering other nodes from `reader`.
    pub fn serve(&self, reader: Arc<Reader>, source: Arc<dyn Source>, rt: &Handle) {
        let server = Arc::new(PeerServer {
            dataset: self.dataset,
            block_size: self.block_size,
            timeout: self.cfg.timeout,
            reader,
            source,
            membership: Arc::clone(&self.membership),
            stats: Arc::clone(&self.stats),
            replies: limits::ReplyBudget::new(self.cfg.reply_memory, self.block_size),
            limits: Arc::default(),
            refused_log: limits::LogLimiter::new(server::REFUSAL_LOG_EVERY),
            over_limit_log: limits::LogLimiter::new(server::REFUSAL_LOG_EVERY),
            handshakes: limits::HandshakeGate::default(),
            current: server::current_table(),
        });
        rt.spawn(server.run(self.endpoint.clone()));
    }

    /// Closes every connection (at unmount).
    pub fn close(&self) {
        self.endpoint.close(0u32.into(), b"unmount");
    }
}
