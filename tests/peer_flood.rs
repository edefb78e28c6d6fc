//! Two floods against a real `locafs mount` process.
//!
//! A member that floods a node from one host: eight client endpoints on one
//! address (many source ports) asking for more than one host may have
//! served, plus a client on the same address that never reads its
//! replies, against a real `locafs mount` process. An honest node on
//! another address still gets its blocks from it, and the flooded node's
//! memory (its peak RSS) stays within `--prefetch-memory` plus a fixed
//! base: replies in flight are bounded by the reply budget (at most half
//! of it for one host), and a reply nobody reads is given up at the peer
//! timeout.
//!
//! A host that floods a node with QUIC handshakes it never finishes (it
//! holds no cluster secret: each attempt's Initial is made by quinn's
//! sans-I/O state machine and sent from a plain UDP socket, and the rest
//! of the handshake is never sent), following the node's Retry packets as
//! a real host would: the node sends Retries once a few handshakes from
//! it are in progress, takes on at most `HANDSHAKES_PER_HOST` at once and
//! refuses the rest, and a legitimate peer connecting meanwhile from
//! another address gets its block.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use common::cluster::*;
use common::*;
use locafs::peer::codec::{self, Frame};
use locafs::peer::server::{CONNECTIONS_PER_PEER, STREAMS_PER_CONNECTION};
use locafs::peer::tls::{ClusterIdentity, PEER_SERVER_NAME};

const MIB: u64 = 1 << 20;
/// The flooded node's block size and memory budget.
const BLOCK_SIZE: &str = "1M";
const PREFETCH_MEMORY: u64 = 128 * MIB;
/// What the flooded node may hold besides `--prefetch-memory`: measured
/// here, 22 MiB idle after mounting (the debug binary's touched pages, the
/// tokio and FUSE threads, the QUIC endpoint, moka's and the namespace's
/// tables), plus the allocator's slack: locafs keeps glibc at 4 arenas that
/// each return free memory to the system only past 16 MiB (sys.rs,
/// tune_allocator), so up to 64 MiB freed but still resident. The flood
/// peaks at about 80 MiB here; before replies were bounded it took the
/// node past 500 MiB.
const BASE: u64 = 96 * MIB;

/// (VmRSS, VmHWM) of a process, in bytes.
fn memory_of(pid: u32) -> (u64, u64) {
    let field = |name: &str| {
        proc_status(pid, name).unwrap_or_else(|| panic!("{name} in /proc/{pid}/status")) * 1024
    };
    (field("VmRSS"), field("VmHWM"))
}

/// One encoded `GetBlock` for block 0 of each file of the data set.
fn requests(c: &Cluster, dataset: [u8; 16]) -> Vec<Bytes> {
    c.files
        .iter()
        .map(|(rel, _)| {
            let v = version_of(&c.source().join(rel));
            encoded(&get_block(dataset, rel, v, 0, MIB)).freeze()
        })
        .collect()
}

#[derive(Default)]
struct Counts {
    blocks: AtomicU64,
    busy: AtomicU64,
    opened_unread: AtomicU64,
}

/// Connections of each greedy endpoint: 8 x 3, and the 4 of the client that
/// never reads, stay within what one host may hold (32).
const GREEDY_CONNECTIONS: usize = 3;
/// Streams each greedy connection keeps busy: with the 256 of the client
/// that never reads, 448 requests at once from one host, more than
/// `REQUESTS_PER_HOST`.
const GREEDY_STREAMS: usize = 8;

/// One stream after another on `conn`, each reply read whole at once. After
/// a `Busy` it waits a little before asking again: an attacker would not,
/// but on two cores and a debug build a tight loop of `Busy` answers only
/// measures the CPU, which is not what this test is about.
async fn greedy(
    conn: quinn::Connection,
    reqs: Arc<Vec<Bytes>>,
    mut k: usize,
    counts: Arc<Counts>,
    stop: Arc<AtomicBool>,
) {
    while !stop.load(Relaxed) {
        let Ok((mut s, mut r)) = conn.open_bi().await else {
            return;
        };
        let _ = s.write_all(&reqs[k % reqs.len()]).await;
        let _ = s.finish();
        k += 7;
        if let Ok(raw) = r.read_to_end(codec::MAX_FRAME).await {
            match codec::decode_eof(&mut BytesMut::from(&raw[..])) {
                Ok(Some(Frame::Block { .. })) => counts.blocks.fetch_add(1, Relaxed),
                Ok(Some(Frame::Busy)) => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    counts.busy.fetch_add(1, Relaxed)
                }
                _ => 0,
            };
        }
    }
}

/// Every stream the connection may have, each asking for a block whose
/// reply is never read; the streams are dropped and opened again every
/// `hold`.
async fn never_reads(
    conn: quinn::Connection,
    reqs: Arc<Vec<Bytes>>,
    mut k: usize,
    hold: Duration,
    counts: Arc<Counts>,
    stop: Arc<AtomicBool>,
) {
    while !stop.load(Relaxed) {
        let mut held = Vec::new();
        for _ in 0..STREAMS_PER_CONNECTION {
            let Ok(Ok((mut s, r))) =
                tokio::time::timeout(Duration::from_millis(500), conn.open_bi()).await
            else {
                break;
            };
            let _ = s.write_all(&reqs[k % reqs.len()]).await;
            let _ = s.finish();
            k += 5;
            counts.opened_unread.fetch_add(1, Relaxed);
            held.push((s, r));
        }
        tokio::time::sleep(hold).await;
        drop(held);
    }
}

fn endpoint(ip: &str, config: quinn::ClientConfig) -> quinn::Endpoint {
    let mut ep = quinn::Endpoint::client(format!("{ip}:0").parse().unwrap()).unwrap();
    ep.set_default_client_config(config);
    ep
}

#[test]
fn a_flood_from_one_host_and_a_reader_that_never_reads_neither_starve_an_honest_node_nor_grow_memory(
) {
    require_fuse!();
    // 128 one-block files: far more than the flooded node's memory tier
    // holds, so that nearly every reply is a block buffer of its own.
    let c = Cluster::new(128, MIB as usize, MIB as usize, 21);
    let (tp, hp) = (free_udp_port(), free_udp_port());
    let (target_addr, honest_addr) = (format!("127.0.0.1:{tp}"), format!("127.0.0.2:{hp}"));
    let peers = vec![target_addr.clone(), honest_addr.clone()];
    let spec = |listen: &str| NodeSpec {
        listen: listen.to_owned(),
        peers: peers.clone(),
        secret: &c.secret,
        cache_size: "512M",
        peer_timeout: "5s",
        netns: None,
    };
    let memory = format!("{}M", PREFETCH_MEMORY / MIB);
    let extra = ["--block-size", BLOCK_SIZE, "--prefetch-memory", &memory];
    let target = Node::start_spec_with(&c, "target", spec(&target_addr), &extra);
    // One request at a time from the honest node (no read-ahead of its
    // own), so that what is measured is whether the target serves it, not
    // how many requests a loaded two-core machine completes in time.
    let honest_extra = [&extra[..], &["--no-readahead"]].concat();
    let honest = Node::start_spec_with(&c, "honest", spec(&honest_addr), &honest_extra);
    for n in [&target, &honest] {
        n.wait_peers_in_state(&peers, &["up", "self"], Duration::from_secs(20));
    }
    // (the serving process, not the one holding the mount)
    let pid = common::restart::server_pid(&target.mountpoint).unwrap();
    eprintln!("target before: (VmRSS, VmHWM) {:?}", memory_of(pid));

    let dataset = locafs::peer::wire_dataset_id(&locafs::mount::config::dataset_id(
        &std::fs::canonicalize(c.source()).unwrap(),
    ));
    let reqs = Arc::new(requests(&c, dataset));
    let identity = ClusterIdentity::from_secret(&std::fs::read(&c.secret).unwrap()).unwrap();
    let counts = Arc::new(Counts::default());
    let stop = Arc::new(AtomicBool::new(false));
    let rt = runtime();
    let target_sock: SocketAddr = target_addr.parse().unwrap();
    let endpoints = rt.block_on(async {
        let mut eps = Vec::new();
        // Eight endpoints of one host, each with all the connections one
        // peer address may hold, each asking more than one peer address may
        // have served.
        for e in 0..8 {
            let ep = endpoint("127.0.0.1", identity.client_config());
            for i in 0..GREEDY_CONNECTIONS {
                let conn = ep
                    .connect(target_sock, PEER_SERVER_NAME)
                    .unwrap()
                    .await
                    .unwrap();
                for s in 0..GREEDY_STREAMS {
                    let k = e * 1000 + i * 100 + s;
                    rt_spawn(greedy(
                        conn.clone(),
                        Arc::clone(&reqs),
                        k,
                        Arc::clone(&counts),
                        Arc::clone(&stop),
                    ));
                }
            }
            eps.push(ep);
        }
        // A client that never reads, advertising windows that let through
        // only the beginning of each reply.
        let mut transport = quinn::TransportConfig::default();
        transport
            .stream_receive_window(quinn::VarInt::from_u32(16 << 10))
            .receive_window(quinn::VarInt::from_u32(64 << 20));
        let mut config = identity.client_config();
        config.transport_config(Arc::new(transport));
        let ep = endpoint("127.0.0.1", config);
        for i in 0..CONNECTIONS_PER_PEER {
            let conn = ep
                .connect(target_sock, PEER_SERVER_NAME)
                .unwrap()
                .await
                .unwrap();
            rt_spawn(never_reads(
                conn,
                Arc::clone(&reqs),
                i * 37,
                Duration::from_secs(6),
                Arc::clone(&counts),
                Arc::clone(&stop),
            ));
        }
        eps.push(ep);
        eps
    });
    // The flood is on: blocks flow to the greedy endpoints and the reader
    // that never reads has its streams open.
    wait_until("the flood to run", Duration::from_secs(60), || {
        counts.blocks.load(Relaxed) + counts.busy.load(Relaxed) >= 64
            && counts.opened_unread.load(Relaxed) >= 128
    });

    // Meanwhile the honest node reads its share of the data set.
    let before = honest.stats();
    let t0 = Instant::now();
    for (rel, data) in c.files.iter().take(48) {
        honest.read_check(rel, data);
    }
    let read_time = t0.elapsed();
    let after = honest.stats();
    let (rss, hwm) = memory_of(pid);
    stop.store(true, Relaxed);
    for ep in &endpoints {
        ep.close(0u32.into(), b"done");
    }
    drop(rt);

    let from_peer = after.peer_bytes - before.peer_bytes;
    let failures = after.peer_failures - before.peer_failures;
    let to_honest = after
        .peers
        .iter()
        .find(|p| p.address == target_addr)
        .map(|p| (p.requests, p.failures));
    let ts = target.stats();
    eprintln!(
        "flood: {} blocks to the greedy endpoints, {} busy, {} unread streams opened; \
         honest read 48 MiB in {read_time:?}: {} MiB from the target, {} from the source, \
         peer failures {failures}, requests/failures to the target {to_honest:?}; target \
         VmRSS {} MiB, VmHWM {} MiB (limit {} MiB), refused connections {}, served {} MiB",
        counts.blocks.load(Relaxed),
        counts.busy.load(Relaxed),
        counts.opened_unread.load(Relaxed),
        from_peer / MIB,
        (after.source_bytes - before.source_bytes) / MIB,
        rss / MIB,
        hwm / MIB,
        (PREFETCH_MEMORY + BASE) / MIB,
        ts.peer_refused_connections,
        ts.peer_served_bytes / MIB,
    );
    assert_eq!(after.read_errors, 0);
    assert!(
        hwm <= PREFETCH_MEMORY + BASE,
        "the flooded node peaked at {} MiB, more than --prefetch-memory {} MiB + {} MiB",
        hwm / MIB,
        PREFETCH_MEMORY / MIB,
        BASE / MIB
    );
    // The honest node asked the target for the blocks it owns and got them.
    let (asked, failed) = to_honest.expect("the target is a member");
    assert!(
        asked > 0 && from_peer > 0,
        "the honest node never got a block from the target"
    );
    assert!(
        failed * 10 <= asked,
        "{failed} of {asked} requests of the honest node to the target failed"
    );
}

fn rt_spawn<F: std::future::Future<Output = ()> + Send + 'static>(f: F) {
    tokio::spawn(f);
}

/// What a handshake flooder saw of its attempts.
#[derive(Debug, Default)]
struct Tally {
    /// Retry packets received (each answered with the token).
    retries: usize,
    /// Attempts the node took on (its hello arrived), with when, in order.
    accepted: Vec<Instant>,
    /// Attempts refused (CONNECTION_CLOSE with CONNECTION_REFUSED).
    refused: usize,
}

/// `attempts` QUIC connection attempts from one UDP socket on `from` to
/// `target`, none ever finished: the first Initial of each is sent, and
/// the Initial with the token after a Retry; nothing after the node's
/// hello. Watches the answers for `watch`.
fn flood_handshakes(
    from: &str,
    target: SocketAddr,
    attempts: usize,
    config: quinn_proto::ClientConfig,
    watch: Duration,
) -> Tally {
    use quinn_proto::{ConnectionError, DatagramEvent, Endpoint, EndpointConfig, Event};
    use std::collections::HashMap;
    let sock = std::net::UdpSocket::bind((from, 0)).expect("bind the flooder");
    sock.set_read_timeout(Some(Duration::from_millis(20)))
        .unwrap();
    let mut ep = Endpoint::new(Arc::new(EndpointConfig::default()), None, false, None);
    let mut conns = HashMap::new();
    let mut buf = Vec::new();
    let send = |conn: &mut quinn_proto::Connection, buf: &mut Vec<u8>| {
        buf.clear();
        while let Some(t) = conn.poll_transmit(Instant::now(), 1, buf) {
            let _ = sock.send_to(&buf[..t.size], t.destination);
            buf.clear();
        }
    };
    for _ in 0..attempts {
        let (h, mut conn) = ep
            .connect(Instant::now(), config.clone(), target, PEER_SERVER_NAME)
            .expect("an attempt");
        send(&mut conn, &mut buf);
        conns.insert(h, conn);
    }
    let mut tally = Tally::default();
    // When each attempt first got an answer that was not a Retry (the
    // node's hello, or its refusal).
    let mut answered: HashMap<quinn_proto::ConnectionHandle, Instant> = HashMap::new();
    let mut refused = std::collections::HashSet::new();
    let t0 = Instant::now();
    let mut raw = vec![0u8; 65536];
    while t0.elapsed() < watch {
        let Ok((n, peer)) = sock.recv_from(&mut raw) else {
            continue;
        };
        // QUIC v1 long header, packet type 3.
        let retry = n > 0 && raw[0] & 0x80 != 0 && (raw[0] >> 4) & 0x3 == 3;
        let data = bytes::BytesMut::from(&raw[..n]);
        let Some(DatagramEvent::ConnectionEvent(h, event)) =
            ep.handle(Instant::now(), peer, None, None, data, &mut buf)
        else {
            continue;
        };
        let Some(conn) = conns.get_mut(&h) else {
            continue;
        };
        conn.handle_event(event);
        while let Some(e) = conn.poll_endpoint_events() {
            if let Some(back) = ep.handle_event(h, e) {
                conn.handle_event(back);
            }
        }
        if retry {
            tally.retries += 1;
            send(conn, &mut buf);
        } else {
            answered.entry(h).or_insert_with(Instant::now);
        }
        while let Some(e) = conn.poll() {
            if let Event::ConnectionLost {
                reason: ConnectionError::ConnectionClosed(c),
            } = e
            {
                if c.error_code == quinn_proto::TransportErrorCode::CONNECTION_REFUSED {
                    refused.insert(h);
                }
            }
        }
    }
    tally.refused = refused.len();
    tally.accepted = answered
        .iter()
        .filter(|(h, _)| !refused.contains(*h))
        .map(|(_, t)| *t)
        .collect();
    tally.accepted.sort();
    tally
}

#[test]
fn a_handshake_flood_from_one_host_is_retried_and_bounded_and_a_peer_still_connects() {
    use locafs::peer::limits::{HANDSHAKES_PER_HOST, RETRY_ABOVE_PER_HOST};
    require_fuse!();
    let c = Cluster::new(8, MIB as usize, MIB as usize, 33);
    let tp = free_udp_port();
    let target_addr = format!("127.0.0.1:{tp}");
    let peers = vec![target_addr.clone()];
    let spec = NodeSpec {
        listen: target_addr.clone(),
        peers: peers.clone(),
        secret: &c.secret,
        cache_size: "512M",
        peer_timeout: "5s",
        netns: None,
    };
    let target = Node::start_spec_with(&c, "target", spec, &["--block-size", BLOCK_SIZE]);
    target.wait_peers_in_state(&peers, &["self"], Duration::from_secs(20));
    let target_sock: SocketAddr = target_addr.parse().unwrap();

    // The flooder holds no secret of this cluster: another one's keys.
    let stranger = ClusterIdentity::from_secret(&std::fs::read(c.other_secret()).unwrap()).unwrap();
    const ATTEMPTS: usize = 200;
    let flood = std::thread::spawn(move || {
        flood_handshakes(
            "127.0.0.3",
            target_sock,
            ATTEMPTS,
            stranger.client_config(),
            Duration::from_secs(3),
        )
    });
    // Meanwhile a legitimate peer (the cluster's keys) connects from
    // another address and gets a block.
    let identity = ClusterIdentity::from_secret(&std::fs::read(&c.secret).unwrap()).unwrap();
    let dataset = locafs::peer::wire_dataset_id(&locafs::mount::config::dataset_id(
        &std::fs::canonicalize(c.source()).unwrap(),
    ));
    let req = requests(&c, dataset).remove(0);
    let rt = runtime();
    std::thread::sleep(Duration::from_millis(300));
    let t_peer = Instant::now();
    let got = rt.block_on(async {
        let ep = endpoint("127.0.0.4", identity.client_config());
        let conn = tokio::time::timeout(
            Duration::from_secs(20),
            ep.connect(target_sock, PEER_SERVER_NAME).unwrap(),
        )
        .await
        .expect("the legitimate peer's handshake timed out")
        .expect("the legitimate peer was refused");
        let (mut s, mut r) = conn.open_bi().await.unwrap();
        s.write_all(&req).await.unwrap();
        let _ = s.finish();
        let raw = r.read_to_end(codec::MAX_FRAME).await.unwrap();
        codec::decode_eof(&mut BytesMut::from(&raw[..]))
    });
    let peer_time = t_peer.elapsed();
    let tally = flood.join().unwrap();
    drop(rt);
    let ts = target.stats();
    // Handshakes the node took on within any 4 s (each stays in progress
    // for the 5 s handshake timeout, the flooder never finishing it).
    let first = tally.accepted.first().copied();
    let at_once = tally
        .accepted
        .iter()
        .filter(|t| first.is_some_and(|f| t.duration_since(f) < Duration::from_secs(4)))
        .count();
    eprintln!(
        "{ATTEMPTS} attempts from one host: {} retries, {} taken on ({at_once} within 4 s), \
         {} refused; the node counted {} retried, {} refused; the legitimate peer got its \
         block in {peer_time:?}",
        tally.retries,
        tally.accepted.len(),
        tally.refused,
        ts.peer_handshakes_retried,
        ts.peer_refused_connections,
    );
    assert!(
        matches!(got, Ok(Some(Frame::Block { .. }))),
        "the legitimate peer got {got:?}"
    );
    assert!(
        at_once <= HANDSHAKES_PER_HOST,
        "{at_once} handshakes from one host in progress at once"
    );
    assert!(
        tally.retries >= ATTEMPTS - HANDSHAKES_PER_HOST,
        "only {} of {ATTEMPTS} attempts were sent a Retry",
        tally.retries
    );
    assert!(tally.accepted.len() >= RETRY_ABOVE_PER_HOST, "{tally:?}");
    // (Not every Initial sent again with its token gets through: the
    // burst overflows the node's socket buffer, as a flood does.)
    assert!(
        tally.refused >= ATTEMPTS / 2,
        "only {} attempts refused",
        tally.refused
    );
    assert!(ts.peer_handshakes_retried as usize >= tally.retries);
    assert!(ts.peer_refused_connections as usize >= tally.refused);
}
