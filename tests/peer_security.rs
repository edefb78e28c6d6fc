//! What a hostile member can do to a real node: a peer that answers with
//! wrong blocks is caught (the reads stay byte-exact and a counter shows
//! it), and malformed, oversized, escaping or stale requests are refused
//! while the node keeps serving its peers and its mount; a flood of failed
//! handshakes is counted but logged once. And authentication
//! with an admin's own CA and certificates (`--peer-ca`, `--peer-cert`,
//! `--peer-key`): nodes of the CA share blocks whatever names their
//! certificates carry, even when they share one certificate, and a node
//! with a certificate of another CA gets nothing. A member that answers
//! `Busy` is asked again rather than passed over for the source.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use common::cluster::*;
use common::pki::TestCa;
use common::*;
use locafs::cache::VersionKey;
use locafs::peer::codec::{self, Frame};
use locafs::peer::tls::{ClusterIdentity, PEER_SERVER_NAME};
use locafs::source::SourceVersion;

/// A member that holds the cluster secret but answers every request with a
/// wrong block, in turn: garbage under a wrong checksum, a short block under
/// its own (valid) checksum, and a reply longer than any block.
async fn lying_peer(endpoint: quinn::Endpoint, asked: Arc<AtomicU64>) {
    while let Some(incoming) = endpoint.accept().await {
        let asked = Arc::clone(&asked);
        tokio::spawn(async move {
            let Ok(conn) = incoming.await else { return };
            while let Ok((mut send, mut recv)) = conn.accept_bi().await {
                let n = asked.fetch_add(1, Relaxed);
                let Ok(raw) = recv.read_to_end(1 << 16).await else {
                    continue;
                };
                let Ok(Some(Frame::GetBlock {
                    block,
                    block_size,
                    file,
                    ..
                })) = codec::decode_eof(&mut BytesMut::from(&raw[..]))
                else {
                    continue;
                };
                let len = file
                    .size
                    .saturating_sub(block * block_size as u64)
                    .min(block_size as u64) as usize;
                let reply = match n % 3 {
                    0 => Frame::Block {
                        checksum: [7; 16],
                        data: Bytes::from(vec![0xAA; len]),
                    },
                    1 => Frame::block(Bytes::from(vec![0x55; len.saturating_sub(1)])),
                    _ => Frame::block(Bytes::from(vec![0x11; len + 4096])),
                };
                let mut out = BytesMut::new();
                codec::encode(&reply, &mut out).unwrap();
                let _ = send.write_all(&out).await;
                let _ = send.finish();
            }
        });
    }
}

#[test]
fn a_lying_peer_is_caught_and_reads_stay_byte_exact() {
    require_fuse!();
    let c = Cluster::new(40, 1_000, 250_000, 10);
    let rt = runtime();
    let identity =
        ClusterIdentity::from_secret(&std::fs::read(&c.secret).unwrap()).expect("identity");
    let liar = {
        let _g = rt.enter();
        quinn::Endpoint::server(
            identity.server_config(),
            "127.0.0.1:0".parse::<SocketAddr>().unwrap(),
        )
        .unwrap()
    };
    let liar_port = liar.local_addr().unwrap().port();
    let asked = Arc::new(AtomicU64::new(0));
    rt.spawn(lying_peer(liar, Arc::clone(&asked)));

    let port = free_udp_port();
    let ports = [port, liar_port];
    // No read-ahead: while the liar is put aside after a lie, read-ahead
    // would fetch the files ahead from the source (the walk lists the tree
    // 16 directories at a time and is done early), and the loop below would
    // find them cached, with the liar asked twice in 40 files (seen once).
    let spec = NodeSpec {
        listen: format!("127.0.0.1:{port}"),
        peers: ports.iter().map(|p| format!("127.0.0.1:{p}")).collect(),
        secret: &c.secret,
        cache_size: "256M",
        peer_timeout: "1s",
        netns: None,
    };
    let node = Node::start_spec_with(&c, "honest", spec, &["--no-readahead"]);
    node.wait_peers_up(&ports);
    // A liar is put aside for a while after each lie: wait for it to be
    // back before each read until it has lied in all three ways.
    for (rel, data) in &c.files {
        if node.stats().peer_bad_blocks < 3 {
            node.wait_peers_up(&ports);
        }
        node.read_check(rel, data);
    }
    let s = node.stats();
    eprintln!(
        "liar asked {} times; bad blocks {}",
        asked.load(Relaxed),
        s.peer_bad_blocks
    );
    assert!(asked.load(Relaxed) >= 3, "the liar was never asked");
    assert!(
        s.peer_bad_blocks >= 3,
        "lies not counted: {}",
        s.peer_bad_blocks
    );
    assert_eq!(s.read_errors, 0);
    assert_eq!(s.peer_bytes, 0, "bytes from the liar were accepted");
    assert_eq!(s.source_bytes, c.total_bytes());
    let p = s
        .peers
        .iter()
        .find(|p| p.address == format!("127.0.0.1:{liar_port}"))
        .expect("liar listed");
    assert!(p.bad_blocks >= 3, "{p:?}");
    // Nothing wrong was cached either: a second pass is still exact.
    for (rel, data) in &c.files {
        node.read_check(rel, data);
    }
}

/// A member that holds the cluster secret and answers each block's first
/// two requests `Busy` (short of reply memory), then with the right block.
async fn busy_then_honest_peer(
    endpoint: quinn::Endpoint,
    files: Arc<std::collections::HashMap<String, Vec<u8>>>,
    busy: Arc<AtomicU64>,
    served: Arc<AtomicU64>,
) {
    let asked = Arc::new(parking_lot::Mutex::new(std::collections::HashMap::<
        (Vec<u8>, u64),
        u32,
    >::new()));
    while let Some(incoming) = endpoint.accept().await {
        let (files, busy, served, asked) = (
            Arc::clone(&files),
            Arc::clone(&busy),
            Arc::clone(&served),
            Arc::clone(&asked),
        );
        tokio::spawn(async move {
            let Ok(conn) = incoming.await else { return };
            while let Ok((mut send, mut recv)) = conn.accept_bi().await {
                let Ok(raw) = recv.read_to_end(1 << 16).await else {
                    continue;
                };
                let Ok(Some(Frame::GetBlock {
                    block,
                    block_size,
                    path,
                    ..
                })) = codec::decode_eof(&mut BytesMut::from(&raw[..]))
                else {
                    continue;
                };
                let times = {
                    let mut a = asked.lock();
                    let n = a.entry((path.to_vec(), block)).or_insert(0);
                    *n += 1;
                    *n
                };
                let reply = match files.get(std::str::from_utf8(&path).unwrap_or("")) {
                    _ if times <= 2 => {
                        busy.fetch_add(1, Relaxed);
                        Frame::Busy
                    }
                    Some(data) => {
                        let at = (block * block_size as u64).min(data.len() as u64) as usize;
                        let end = (at + block_size as usize).min(data.len());
                        served.fetch_add((end - at) as u64, Relaxed);
                        Frame::block(Bytes::copy_from_slice(&data[at..end]))
                    }
                    _ => Frame::NotFound,
                };
                let mut out = BytesMut::new();
                codec::encode(&reply, &mut out).unwrap();
                let _ = send.write_all(&out).await;
                let _ = send.finish();
            }
        });
    }
}

#[test]
fn a_busy_owner_is_asked_again_not_passed_over_for_the_source() {
    require_fuse!();
    let c = Cluster::new(40, 1_000, 250_000, 11);
    let rt = runtime();
    let identity =
        ClusterIdentity::from_secret(&std::fs::read(&c.secret).unwrap()).expect("identity");
    let owner = {
        let _g = rt.enter();
        quinn::Endpoint::server(
            identity.server_config(),
            "127.0.0.1:0".parse::<SocketAddr>().unwrap(),
        )
        .unwrap()
    };
    let owner_port = owner.local_addr().unwrap().port();
    let files: std::collections::HashMap<String, Vec<u8>> = c.files.iter().cloned().collect();
    let (busy, served) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    rt.spawn(busy_then_honest_peer(
        owner,
        Arc::new(files),
        Arc::clone(&busy),
        Arc::clone(&served),
    ));

    let port = free_udp_port();
    let ports = [port, owner_port];
    let node = Node::start(
        &c,
        "asker",
        port,
        NodeOpts {
            peers: &ports,
            secret: &c.secret,
            cache_size: "256M",
            peer_timeout: "4s",
        },
    );
    node.wait_peers_up(&ports);
    for (rel, data) in &c.files {
        node.read_check(rel, data);
    }
    let s = node.stats();
    eprintln!(
        "busy answers {}, served by the busy owner {} B; node: source {} B, peers {} B, \
         peer busy {}, peer failures {}",
        busy.load(Relaxed),
        served.load(Relaxed),
        s.source_bytes,
        s.peer_bytes,
        s.peer_busy,
        s.peer_failures
    );
    assert_eq!(s.read_errors, 0);
    assert!(served.load(Relaxed) > 0, "the owner was never asked");
    // Every block the owner was asked for came from it after its Busy
    // answers: none was read from the source instead.
    assert_eq!(s.peer_failures, 0);
    assert_eq!(s.peer_bytes, served.load(Relaxed));
    assert_eq!(s.source_bytes + s.peer_bytes, c.total_bytes());
    assert_eq!(s.peer_busy, busy.load(Relaxed));
    assert!(s.peer_busy >= 2, "no Busy answer was waited out");
    let p = s
        .peers
        .iter()
        .find(|p| p.address == format!("127.0.0.1:{owner_port}"))
        .expect("owner listed");
    assert_eq!(p.state, "up", "{p:?}");
}

/// One raw request on its own stream; the reply frame, or None if the node
/// reset or closed the stream or sent something that is not a frame. A
/// node that does not answer within 10 s fails the test: hanging on a
/// request is not refusing it.
async fn exchange(conn: &quinn::Connection, raw: &[u8]) -> Option<Frame> {
    let (mut send, mut recv) = conn.open_bi().await.ok()?;
    let _ = send.write_all(raw).await;
    let _ = send.finish();
    let reply = tokio::time::timeout(Duration::from_secs(10), recv.read_to_end(codec::MAX_FRAME))
        .await
        .unwrap_or_else(|_| {
            panic!(
                "no answer within 10 s to a request of {} bytes: {:?}",
                raw.len(),
                String::from_utf8_lossy(&raw[..raw.len().min(120)])
            )
        })
        .ok()?;
    codec::decode_eof(&mut BytesMut::from(&reply[..])).ok()?
}

/// A GetBlock on the wire with any path, bypassing the encoder's checks.
fn raw_get_block(dataset: [u8; 16], path: &[u8], v: SourceVersion) -> BytesMut {
    let key = VersionKey::new(
        std::path::Path::new(std::ffi::OsStr::new(
            std::str::from_utf8(path).unwrap_or("x"),
        )),
        &v,
    );
    let mut b = BytesMut::new();
    b.put_slice(&codec::MAGIC);
    b.put_u16(codec::PROTOCOL_VERSION);
    b.put_u8(1);
    b.put_u8(0);
    b.put_u32((16 + 16 + 8 + 4 + 26 + path.len()) as u32);
    b.put_slice(&dataset);
    b.put_slice(&key.0);
    b.put_u64(0);
    b.put_u32(BLOCK as u32);
    b.put_u64(v.size);
    b.put_i64(v.mtime_ns);
    b.put_u64(v.ino);
    b.put_u16(path.len() as u16);
    b.put_slice(path);
    b
}

/// One node of `c` listening alone, with what a hand-made peer needs to talk
/// to it: its port, the data set's wire id and the cluster identity.
fn lone_target(c: &Cluster) -> (Node, u16, [u8; 16], ClusterIdentity) {
    let port = free_udp_port();
    let node = Node::start(
        c,
        "target",
        port,
        NodeOpts {
            peers: &[port],
            secret: &c.secret,
            cache_size: "256M",
            peer_timeout: "1s",
        },
    );
    let dataset = locafs::peer::wire_dataset_id(&locafs::mount::config::dataset_id(
        &std::fs::canonicalize(c.source()).unwrap(),
    ));
    let identity = ClusterIdentity::from_secret(&std::fs::read(&c.secret).unwrap()).unwrap();
    (node, port, dataset, identity)
}

#[test]
fn malformed_oversized_and_escaping_requests_are_refused_and_the_node_keeps_serving() {
    require_fuse!();
    let c = Cluster::new(10, 100_000, 200_000, 11);
    // A directory symlink in the data set that leads out of it.
    std::os::unix::fs::symlink("/etc", c.source().join("train/escape")).unwrap();
    let (node, port, dataset, identity) = lone_target(&c);
    let rt = runtime();
    let (rel, data) = c.files[3].clone();
    let v = version_of(&c.source().join(&rel));
    rt.block_on(async {
        let mut ep = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
        ep.set_default_client_config(identity.client_config());
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let conn = ep.connect(addr, PEER_SERVER_NAME).unwrap().await.unwrap();

        // Streams that never finish their request must not hold anything up.
        let mut idle = Vec::new();
        for _ in 0..8 {
            let (mut s, r) = conn.open_bi().await.unwrap();
            s.write_all(&codec::MAGIC).await.unwrap();
            idle.push((s, r));
        }

        // Refused: an Error frame (the node answers every bad request with
        // one; a reset stream or silence is not a refusal).
        let is_error = |f: Option<Frame>| matches!(f, Some(Frame::Error { .. }));
        // Not the protocol at all.
        assert!(is_error(exchange(&conn, b"GET / HTTP/1.1\r\n\r\n").await));
        // A header announcing a 4 GiB frame.
        let mut huge = BytesMut::new();
        huge.put_slice(&codec::MAGIC);
        huge.put_u16(codec::PROTOCOL_VERSION);
        huge.put_u8(2);
        huge.put_u8(0);
        huge.put_u32(u32::MAX);
        assert!(is_error(exchange(&conn, &huge).await));
        // Really oversized: a valid request followed by 1 MiB more.
        let mut big = encoded(&get_block(dataset, &rel, v, 0, BLOCK));
        big.put_slice(&vec![0u8; 1 << 20]);
        assert!(is_error(exchange(&conn, &big).await));
        // Two frames where one is allowed.
        let mut two = encoded(&get_block(dataset, &rel, v, 0, BLOCK));
        two.extend_from_slice(&encoded(&get_block(dataset, &rel, v, 1, BLOCK)));
        assert!(is_error(exchange(&conn, &two).await));
        // A reply frame sent as a request.
        assert!(is_error(
            exchange(&conn, &encoded(&Frame::block(Bytes::from_static(b"x")))).await
        ));
        // Paths that leave the data set.
        let passwd = version_of(std::path::Path::new("/etc/passwd"));
        for bad in [
            &b"../../../../etc/passwd"[..],
            b"/etc/passwd",
            b"train/../../x",
        ] {
            let reply = exchange(&conn, &raw_get_block(dataset, bad, passwd)).await;
            assert!(is_error(reply), "{:?}", String::from_utf8_lossy(bad));
        }
        // Through a symlinked directory inside the data set.
        let escape = get_block(dataset, "train/escape/passwd", passwd, 0, BLOCK);
        assert_eq!(
            exchange(&conn, &encoded(&escape)).await,
            Some(Frame::NotFound)
        );
        // A version key that is not the hash of the path and version.
        let mut forged = get_block(dataset, &rel, v, 0, BLOCK);
        if let Frame::GetBlock { version, .. } = &mut forged {
            version[0] ^= 1;
        }
        assert!(matches!(
            exchange(&conn, &encoded(&forged)).await,
            Some(Frame::Error { .. })
        ));
        // A version that is not the current one at the source.
        let stale = SourceVersion {
            mtime_ns: v.mtime_ns - 1,
            ..v
        };
        assert_eq!(
            exchange(&conn, &encoded(&get_block(dataset, &rel, stale, 0, BLOCK))).await,
            Some(Frame::NotFound)
        );
        // Another data set; a block past the end.
        assert_eq!(
            exchange(&conn, &encoded(&get_block([9; 16], &rel, v, 0, BLOCK))).await,
            Some(Frame::NotFound)
        );
        assert_eq!(
            exchange(&conn, &encoded(&get_block(dataset, &rel, v, 1000, BLOCK))).await,
            Some(Frame::NotFound)
        );

        // And a proper request is still served, with the right bytes.
        match exchange(&conn, &encoded(&get_block(dataset, &rel, v, 1, BLOCK))).await {
            Some(Frame::Block {
                checksum,
                data: got,
            }) => {
                let want = &data[BLOCK as usize..(2 * BLOCK as usize).min(data.len())];
                assert_eq!(&got[..], want);
                assert_eq!(checksum, codec::block_checksum(want));
            }
            other => panic!("valid request answered with {other:?}"),
        }
        drop(idle);
        conn.close(0u32.into(), b"done");
    });
    let s = node.stats();
    assert!(
        s.peer_bad_requests >= 6,
        "bad requests counted: {}",
        s.peer_bad_requests
    );
    // The mount itself is unharmed.
    for (rel, data) in &c.files {
        node.read_check(rel, data);
    }
    assert_eq!(node.stats().read_errors, 0);
}

/// One authenticated peer (one remote address) may hold only
/// `CONNECTIONS_PER_PEER` connections: more are closed after the handshake
/// and counted as refused, the ones it holds keep being served, and a closed
/// one frees its place.
#[test]
fn one_peer_cannot_open_more_than_its_share_of_connections() {
    use locafs::peer::server::CONNECTIONS_PER_PEER;
    require_fuse!();
    let c = Cluster::new(4, 100_000, 200_000, 12);
    let (node, port, dataset, identity) = lone_target(&c);
    let (rel, data) = c.files[0].clone();
    let v = version_of(&c.source().join(&rel));
    let request = encoded(&get_block(dataset, &rel, v, 0, BLOCK));
    let want = &data[..BLOCK as usize];
    let served =
        |f: Option<Frame>| matches!(f, Some(Frame::Block { data, .. }) if &data[..] == want);
    let refused_before = node.stats().peer_refused_connections;
    runtime().block_on(async {
        // All connections from one socket: one peer address.
        let mut ep = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
        ep.set_default_client_config(identity.client_config());
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let connect = || async { ep.connect(addr, PEER_SERVER_NAME).unwrap().await.unwrap() };
        let mut held = Vec::new();
        for _ in 0..CONNECTIONS_PER_PEER {
            let conn = connect().await;
            assert!(served(exchange(&conn, &request).await), "a connection within the limit");
            held.push(conn);
        }
        for _ in 0..2 {
            let extra = connect().await;
            let why = tokio::time::timeout(Duration::from_secs(10), extra.closed())
                .await
                .expect("a connection over the limit is closed");
            assert!(
                matches!(&why, quinn::ConnectionError::ApplicationClosed(a) if a.reason.as_ref() == b"too many connections"),
                "{why:?}"
            );
        }
        // The held connections are still served.
        for conn in &held {
            assert!(served(exchange(conn, &request).await));
        }
        // Closing one frees its place (the server notices asynchronously).
        held.pop().unwrap().close(0u32.into(), b"bye");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let conn = connect().await;
            if served(exchange(&conn, &request).await) {
                held.push(conn);
                break;
            }
            assert!(std::time::Instant::now() < deadline, "the freed place was not reused");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for conn in held {
            conn.close(0u32.into(), b"done");
        }
    });
    let refused = node.stats().peer_refused_connections - refused_before;
    assert!(refused >= 2, "refused connections counted: {refused}");
    assert_eq!(node.stats().read_errors, 0);
}

#[test]
fn nodes_with_admin_certificates_share_blocks_and_a_node_of_another_ca_gets_nothing() {
    require_fuse!();
    let c = Cluster::new(30, 1_000, 200_000, 13);
    let pki = c.dir.path().join("pki");
    let ca = TestCa::new("Example Corp CA");
    // Same name, another key: what an attacker could make.
    let foreign = TestCa::new("Example Corp CA");
    // The certificates name the nodes, not the addresses in --peers.
    let a_files = ca.node_files(&pki, "a", "node-a.example.com");
    let b_files = ca.node_files(&pki, "b", "node-b.example.com");
    let x_files = foreign.node_files(&pki, "x", "node-x.example.com");
    let ports = [free_udp_port(), free_udp_port(), free_udp_port()];
    let a = Node::start_auth(&c, "a", ports[0], &ports, Auth::Certs(&a_files));
    let b = Node::start_auth(&c, "b", ports[1], &ports, Auth::CertsInO(&b_files));
    let stranger = Node::start_auth(&c, "stranger", ports[2], &ports, Auth::Certs(&x_files));
    wait_pair_up_and_stranger_refused(&a, &b, &ports[..2]);

    run_epoch(&c, &[&a, &b], 0, 13);
    for (rel, data) in &c.files {
        stranger.read_check(rel, data);
    }
    let (sa, sb) = (a.stats(), b.stats());
    eprintln!(
        "a: source {} peers {} served {}; b: source {} peers {} served {}",
        sa.source_bytes,
        sa.peer_bytes,
        sa.peer_served_bytes,
        sb.source_bytes,
        sb.peer_bytes,
        sb.peer_served_bytes
    );
    for s in [&sa, &sb] {
        assert_eq!(s.read_errors, 0);
        assert_eq!(s.peer_bad_blocks, 0);
    }
    assert!(
        sa.peer_bytes + sb.peer_bytes > 0,
        "a and b exchanged no block"
    );
    assert_eq!(
        sa.peer_bytes + sb.peer_bytes,
        sa.peer_served_bytes + sb.peer_served_bytes
    );
    assert_eq!(
        sa.source_bytes + sb.source_bytes,
        c.total_bytes(),
        "each block from the source once between a and b"
    );

    assert_stranger_got_nothing(&c, &stranger);
    for n in [&a, &b] {
        assert_eq!(
            n.peer_state(ports[2]).as_deref(),
            Some("down"),
            "{}",
            n.name
        );
        let p = n
            .stats()
            .peers
            .into_iter()
            .find(|p| p.address == format!("127.0.0.1:{}", ports[2]));
        assert_eq!(
            p.map(|p| p.bytes_sent),
            Some(0),
            "{} served the stranger",
            n.name
        );
    }
}

#[test]
fn nodes_sharing_one_admin_certificate_still_tell_each_other_apart() {
    require_fuse!();
    let c = Cluster::new(20, 1_000, 200_000, 14);
    let ca = TestCa::new("Example Corp CA");
    // One certificate for the whole job, as one Kubernetes Secret would be.
    let files = ca.node_files(&c.dir.path().join("pki"), "all", "locafs.example.com");
    let ports = [free_udp_port(), free_udp_port()];
    let a = Node::start_auth(&c, "a", ports[0], &ports, Auth::Certs(&files));
    let b = Node::start_auth(&c, "b", ports[1], &ports, Auth::Certs(&files));
    // Each sees the other up, not as itself.
    a.wait_peers_up(&ports);
    b.wait_peers_up(&ports);
    run_epoch(&c, &[&a, &b], 0, 14);
    let (sa, sb) = (a.stats(), b.stats());
    assert_eq!(sa.read_errors + sb.read_errors, 0);
    assert!(
        sa.peer_bytes + sb.peer_bytes > 0,
        "a and b exchanged no block"
    );
    assert_eq!(sa.source_bytes + sb.source_bytes, c.total_bytes());
}

/// Failed handshakes are all counted but logged at most once per
/// `REFUSAL_LOG_EVERY` (with the number held back), so that whoever can
/// reach the port cannot fill the node's log.
#[test]
fn a_flood_of_failed_handshakes_is_counted_but_logged_once() {
    require_fuse!();
    let c = Cluster::new(2, 1_000, 2_000, 15);
    let (node, port, _, _) = lone_target(&c);
    let stranger = ClusterIdentity::from_secret(&std::fs::read(c.other_secret()).unwrap()).unwrap();
    let refused_before = node.stats().peer_refused_connections;
    let lines = |log: &str| log.matches("peer connection from 127.0.0.1").count();
    let logged_before = lines(&node.log_text());
    const TRIES: u64 = 40;
    runtime().block_on(async {
        let mut ep = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
        ep.set_default_client_config(stranger.client_config());
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        for _ in 0..TRIES {
            let attempt = ep.connect(addr, PEER_SERVER_NAME).unwrap();
            let r = tokio::time::timeout(Duration::from_secs(10), attempt).await;
            assert!(matches!(r, Ok(Err(_))), "a stranger got in: {r:?}");
        }
    });
    wait_until(
        "every refusal to be counted",
        Duration::from_secs(10),
        || node.stats().peer_refused_connections - refused_before >= TRIES,
    );
    let log = node.log_text();
    let logged = lines(&log) - logged_before;
    assert!(
        (1..=2).contains(&logged),
        "{logged} log lines for {TRIES} refused handshakes:\n{log}"
    );
    // The node still serves its mount.
    for (rel, data) in &c.files {
        node.read_check(rel, data);
    }
}
