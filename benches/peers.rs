//! The peer cache against private caches, on 4 real `locafs mount` processes
//! talking QUIC, with a data set twice one node's cache and 3 epochs of a
//! DistributedSampler-like workload (a new permutation per epoch, cut in 4
//! disjoint shares, each node reading its share with 4 threads).
//!
//! Each node runs in its own network namespace (`nsenter --net=`), with a
//! veth to a bridge in another namespace, and every link is shaped to
//! 1 Gbit/s each way (`tc tbf` on the node's end and on its bridge port);
//! without namespaces the bench falls back to loopback, unshaped, and says
//! so.
//!
//! 1. bytes read from the source over the 3 epochs / data set size;
//! 2. wall time of the epochs with the source capped at 100 MB/s for the
//!    whole cluster: all 4 daemons run in one blkio cgroup (v1) whose read
//!    bandwidth on the source's disk is limited, the cache dirs are on tmpfs
//!    (not limited) and the page cache is dropped before each epoch, so every
//!    source read really goes through the cap;
//! 3. latency (p50, p99) and throughput of fetching one block from a peer
//!    over one link, against reading and verifying the same block from the
//!    local cache file.
//!
//! Needs root, /dev/fuse and the blkio cgroup; prints SKIPPED otherwise.

#[path = "../tests/common/mod.rs"]
mod common;
mod lab;

use std::net::{SocketAddr, UdpSocket};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use common::cluster::{encoded, get_block, version_of};
use lab::{cpu_ticks, disk_of, pct, start, wait_for_peers, Net, Node, NodeSpec};
use locafs::cache::VersionKey;
use locafs::peer::codec::{self, Frame};
use locafs::peer::placement::{block_key, MemberId, Placement};
use locafs::peer::tls::{ClusterIdentity, PEER_SERVER_NAME};
use locafs::source::SourceVersion;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

const NODES: usize = 4;
const BLOCK: u64 = 1 << 20;
const FILES: usize = 320;
const CAP_BPS: u64 = 100_000_000;
const CGROUP: &str = "/sys/fs/cgroup/blkio/locafs-bench-peers";

fn readahead() -> bool {
    std::env::var("LOCAFS_BENCH_READAHEAD").is_ok_and(|v| v == "1")
}

/// One epoch; returns its wall time and the machine's CPU use meanwhile
/// (0..1 of all cores).
fn epoch(nodes: &[Node], files: &[String], epoch: u64) -> (Duration, f64) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(1000 + epoch);
    let mut order: Vec<usize> = (0..files.len()).collect();
    order.shuffle(&mut rng);
    let _ = common::try_drop_page_cache();
    let cpu = cpu_ticks();
    let t = Instant::now();
    std::thread::scope(|s| {
        for (n, node) in nodes.iter().enumerate() {
            let share: Vec<usize> = order.iter().copied().skip(n).step_by(NODES).collect();
            let share = Arc::new(share);
            for w in 0..4 {
                let share = Arc::clone(&share);
                let mnt = &node.mnt;
                s.spawn(move || {
                    for &f in share.iter().skip(w).step_by(4) {
                        let data = std::fs::read(mnt.join(&files[f])).expect("read");
                        std::hint::black_box(data);
                    }
                });
            }
        }
    });
    let wall = t.elapsed();
    let now = cpu_ticks();
    let busy = (now.0 - cpu.0) as f64 / (now.1 - cpu.1).max(1) as f64;
    (wall, busy)
}

struct Run {
    source_bytes: u64,
    epoch_times: Vec<Duration>,
    epoch_cpu: Vec<f64>,
    peer_bytes_max_node: u64,
}

fn run(
    work: &Path,
    src: &Path,
    files: &[String],
    cache_size: u64,
    net: &Net,
    secret: Option<&Path>,
) -> (Run, Vec<Node>) {
    // Cross-file read-ahead prefetches the whole epoch on every node (a node
    // does not know its sampler share), and on one machine the nodes share
    // one page cache: a private node then gets the other nodes' source reads
    // for free from memory, which real nodes never do. So read-ahead is off
    // here unless LOCAFS_BENCH_READAHEAD=1.
    let extra: &[&str] = if readahead() {
        &[]
    } else {
        &["--no-readahead"]
    };
    let spec = NodeSpec {
        work,
        src,
        cache_size,
        net,
        secret,
        cgroup: Some(CGROUP),
        extra,
        tag: if secret.is_some() { "peers" } else { "private" },
    };
    let nodes: Vec<Node> = (0..NODES).map(|i| start(i, &spec)).collect();
    if secret.is_some() {
        wait_for_peers(&nodes);
    }
    let mut times = Vec::new();
    let mut cpus = Vec::new();
    let mut peer_max = 0;
    for e in 0..3 {
        let before: Vec<u64> = nodes
            .iter()
            .map(|n| locafs::cli::stats::fetch(&n.mnt).unwrap().peer_bytes)
            .collect();
        let (wall, cpu) = epoch(&nodes, files, e);
        times.push(wall);
        cpus.push(cpu);
        if e > 0 {
            for (n, b) in nodes.iter().zip(before) {
                let now = locafs::cli::stats::fetch(&n.mnt).unwrap().peer_bytes;
                peer_max = peer_max.max(now - b);
            }
        }
    }
    let source_bytes = nodes
        .iter()
        .map(|n| locafs::cli::stats::fetch(&n.mnt).unwrap().source_bytes)
        .sum();
    (
        Run {
            source_bytes,
            epoch_times: times,
            epoch_cpu: cpus,
            peer_bytes_max_node: peer_max,
        },
        nodes,
    )
}

fn main() {
    // `cargo test --all-targets` runs bench binaries without --bench.
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!("peers: a benchmark; run it with `cargo bench --bench peers`");
        return;
    }
    require_fuse!();
    let work = tempfile::tempdir_in("/var/tmp").unwrap();
    let src = work.path().join("source");
    let Some(disk) = disk_of(work.path()) else {
        skip!("cannot find the source disk");
    };
    if std::fs::create_dir_all(CGROUP).is_err()
        || std::fs::write(
            format!("{CGROUP}/blkio.throttle.read_bps_device"),
            format!("{disk} {CAP_BPS}"),
        )
        .is_err()
    {
        skip!("no blkio cgroup (v1) to cap the source");
    }
    std::fs::create_dir_all(src.join("train")).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let mut files = Vec::new();
    let mut total = 0u64;
    for i in 0..FILES {
        let len = rng.random_range(BLOCK as usize / 2..=3 * BLOCK as usize / 2);
        let mut d = vec![0u8; len];
        rng.fill(&mut d[..]);
        let rel = format!("train/s{i:04}.bin");
        std::fs::write(src.join(&rel), &d).unwrap();
        files.push(rel);
        total += len as u64;
    }
    // Half the data set per node, plus the cache's fixed and per-file overhead.
    let cache_size = total / 2 + (4 << 20) + FILES as u64 * 8192;
    let secret = work.path().join("secret");
    common::write_private(&secret, locafs::peer::tls::generate_secret().unwrap());
    println!(
        "peers bench: {NODES} nodes, data set {:.0} MiB in {FILES} files, cache {:.0} MiB per node, \
         source capped at {} MB/s for the cluster (blkio cgroup on {disk}), caches on tmpfs",
        total as f64 / 1048576.0,
        cache_size as f64 / 1048576.0,
        CAP_BPS / 1_000_000
    );

    let net = Net::new(NODES);
    println!(
        "peer links: {}; read-ahead {}",
        net.describe(),
        if readahead() {
            "on (LOCAFS_BENCH_READAHEAD=1)"
        } else {
            "off (--no-readahead)"
        }
    );

    let (private, nodes) = run(work.path(), &src, &files, cache_size, &net, None);
    drop(nodes);
    let (peers, nodes) = run(work.path(), &src, &files, cache_size, &net, Some(&secret));

    let r = |b: u64| b as f64 / total as f64;
    println!("\n1. source bytes over 3 epochs / data set size (goal with peers <= 1.05)");
    println!(
        "   peers {:.3}   private caches {:.3}   ratio private/peers {:.2}x",
        r(peers.source_bytes),
        r(private.source_bytes),
        private.source_bytes as f64 / peers.source_bytes.max(1) as f64
    );
    println!("\n2. epoch wall time, source capped at 100 MB/s (goal: epochs 2-3 >= 3x faster)");
    for e in 0..3 {
        println!(
            "   epoch {}: peers {:>7.2} s   private {:>7.2} s   speed-up {:.1}x   (CPU busy: peers {:.0} %, private {:.0} %)",
            e + 1,
            peers.epoch_times[e].as_secs_f64(),
            private.epoch_times[e].as_secs_f64(),
            private.epoch_times[e].as_secs_f64() / peers.epoch_times[e].as_secs_f64(),
            peers.epoch_cpu[e] * 100.0,
            private.epoch_cpu[e] * 100.0
        );
    }
    let p23: f64 = peers.epoch_times[1..].iter().map(|d| d.as_secs_f64()).sum();
    let v23: f64 = private.epoch_times[1..]
        .iter()
        .map(|d| d.as_secs_f64())
        .sum();
    println!(
        "   epochs 2+3: peers {p23:.2} s   private {v23:.2} s   speed-up {:.1}x",
        v23 / p23
    );
    println!(
        "   (the busiest node received {:.0} MiB from peers in epochs 2-3: {:.2} s of a 1 Gbit/s link)",
        peers.peer_bytes_max_node as f64 / 1048576.0,
        peers.peer_bytes_max_node as f64 * 8.0 / 1e9
    );

    println!(
        "   per node after 3 epochs (peer requests, failures, mean latency of recent requests):"
    );
    for (i, n) in nodes.iter().enumerate() {
        let Ok(st) = locafs::cli::stats::fetch(&n.mnt) else {
            continue;
        };
        let peers: Vec<String> = st
            .peers
            .iter()
            .filter(|p| p.state != "self")
            .map(|p| {
                format!(
                    "{} req {} fail {} {:.1} ms",
                    p.address,
                    p.requests,
                    p.failures,
                    p.latency_ms.unwrap_or(f64::NAN)
                )
            })
            .collect();
        println!("   node {i}: {}", peers.join("; "));
    }

    latency(&nodes, &net, &src, &files, &secret);
    drop(nodes);
    let _ = std::fs::remove_dir(CGROUP);
}

/// Figure 3: one block from a peer (over QUIC, from the owner's cache)
/// against the same block read and verified from the local cache file.
fn latency(nodes: &[Node], net: &Net, src: &Path, files: &[String], secret: &Path) {
    let canon = std::fs::canonicalize(src).unwrap();
    let ds_name = locafs::config::dataset_id(&canon);
    let dataset = locafs::peer::wire_dataset_id(&ds_name);
    let placement = Placement::new(
        (0..NODES)
            .map(|i| MemberId::new(net.addr(i).to_string()))
            .collect(),
    );
    let owner0 = MemberId::new(net.addr(0).to_string());
    // Whole blocks that node 0 owns (and so holds in its cache).
    let mut blocks: Vec<(String, SourceVersion, u64)> = Vec::new();
    for rel in files {
        let v = version_of(&src.join(rel));
        let key = VersionKey::new(Path::new(rel), &v);
        for b in 0..v.size / BLOCK {
            if placement.owner(&block_key(&dataset, &key.0, b, BLOCK as u32)) == Some(&owner0) {
                blocks.push((rel.clone(), v, b));
            }
        }
    }
    let identity = ClusterIdentity::from_secret(&std::fs::read(secret).unwrap()).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    // The asker sits where node 1 is: in its namespace, behind its link.
    let socket = match net {
        Net::Lab(lab) => {
            let bind = SocketAddr::new(lab.addr(1).into(), 0);
            lab.in_ns(1, move || UdpSocket::bind(bind))
                .unwrap()
                .unwrap()
        }
        Net::Loopback(_) => UdpSocket::bind("127.0.0.1:0").unwrap(),
    };
    let (mut peer_lat, peer_tput) = rt.block_on(async {
        let mut ep = quinn::Endpoint::new(
            quinn::EndpointConfig::default(),
            None,
            socket,
            Arc::new(quinn::TokioRuntime),
        )
        .unwrap();
        ep.set_default_client_config(identity.client_config());
        let addr = net.addr(0);
        let conn = ep.connect(addr, PEER_SERVER_NAME).unwrap().await.unwrap();
        let req = |i: usize| {
            let (rel, v, b) = &blocks[i % blocks.len()];
            encoded(&get_block(dataset, rel, *v, *b, BLOCK))
        };
        let one = |conn: quinn::Connection, raw: BytesMut| async move {
            let (mut s, mut r) = conn.open_bi().await.unwrap();
            s.write_all(&raw).await.unwrap();
            s.finish().unwrap();
            let reply = r.read_to_end(codec::MAX_FRAME).await.unwrap();
            match codec::decode_eof(&mut BytesMut::from(&reply[..])).unwrap() {
                Some(Frame::Block { checksum, data }) => {
                    assert_eq!(codec::block_checksum(&data), checksum);
                    data.len()
                }
                other => panic!("unexpected reply {other:?}"),
            }
        };
        let mut lat = Vec::new();
        for i in 0..400 {
            let t = Instant::now();
            one(conn.clone(), req(i)).await;
            lat.push(t.elapsed());
        }
        // Throughput: 16 requests in flight for 3 s.
        let t = Instant::now();
        let mut bytes = 0usize;
        let mut i = 0;
        while t.elapsed() < Duration::from_secs(3) {
            let batch: Vec<_> = (0..16)
                .map(|k| tokio::spawn(one(conn.clone(), req(i + k))))
                .collect();
            i += 16;
            for b in batch {
                bytes += b.await.unwrap();
            }
        }
        (lat, bytes as f64 / t.elapsed().as_secs_f64())
    });
    // The local tier: pread of the block from the cache file and blake3.
    let cache_dir = nodes[0].cache.join(&ds_name).join("blocks");
    let mut local_lat = Vec::new();
    let mut buf = vec![0u8; BLOCK as usize];
    let mut local_bytes = 0usize;
    // The blocks node 0 still holds: with read-ahead on, its cache (half
    // the data set) may have evicted some of those it owns.
    let held: Vec<(std::fs::File, u64)> = blocks
        .iter()
        .filter_map(|(rel, v, b)| {
            let hex = VersionKey::new(Path::new(rel), v).hex();
            let f = std::fs::File::open(cache_dir.join(&hex[..2]).join(format!("{hex}.data")));
            f.ok().map(|f| (f, *b))
        })
        .collect();
    assert!(!held.is_empty(), "node 0 holds none of the blocks it owns");
    for i in 0..2000 {
        let (f, b) = &held[i % held.len()];
        let t = Instant::now();
        f.read_exact_at(&mut buf, b * BLOCK).unwrap();
        std::hint::black_box(blake3::hash(&buf));
        local_lat.push(t.elapsed());
        local_bytes += buf.len();
    }
    let local_tput = local_bytes as f64 / local_lat.iter().sum::<Duration>().as_secs_f64();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let (pp50, pp99) = (pct(&mut peer_lat, 0.5), pct(&mut peer_lat, 0.99));
    let (lp50, lp99) = (pct(&mut local_lat, 0.5), pct(&mut local_lat, 0.99));
    println!(
        "\n3. one 1 MiB block ({} blocks owned by node 0)",
        blocks.len()
    );
    println!(
        "   peer (QUIC, one link)   p50 {:.3} ms  p99 {:.3} ms   throughput {:.0} MB/s (16 in flight)",
        ms(pp50),
        ms(pp99),
        peer_tput / 1e6
    );
    println!(
        "   local cache (pread+b3)  p50 {:.3} ms  p99 {:.3} ms   throughput {:.0} MB/s (1 thread)",
        ms(lp50),
        ms(lp99),
        local_tput / 1e6
    );
    println!(
        "   peer / local: p50 {:.1}x  p99 {:.1}x  throughput {:.2}",
        ms(pp50) / ms(lp50),
        ms(pp99) / ms(lp99),
        peer_tput / local_tput
    );
}
