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
//!    local cache file;
//! 4. nodes started together (3, 8 and 64 `locafs mount` processes, each
//!    in its own network namespace, unshaped), with the defaults (read-ahead
//!    on), each node reading its DistributedSampler share for two epochs
//!    the moment its own mount returns, as a job script does: bytes from the
//!    source over the data set (goal <= 1.01), failed reads (goal 0), the
//!    time until every node had reached every other, and each daemon's RSS
//!    and threads at the end and after 10 s idle.
//!
//! `LOCAFS_BENCH_PEERS=startup` runs part 4 alone (no blkio cgroup needed);
//! `LOCAFS_BENCH_STARTUP_NODES=3,8` picks its cluster sizes.
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
use lab::{
    cpu_ticks, disk_of, pct, rss_and_threads, spawn, start, wait_for_peers, Net, Node, NodeSpec,
};
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
        &["--fuse-threads", "8"]
    } else {
        &["--fuse-threads", "8", "--no-readahead"]
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
    if std::env::var("LOCAFS_BENCH_PEERS").is_ok_and(|v| v == "startup") {
        startup(work.path());
        return;
    }
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
    drop(net);
    let _ = std::fs::remove_dir(CGROUP);
    startup(work.path());
}

/// Files of the part 4 data set, and their sizes (small images: one block
/// each, so every file has one owner).
const STARTUP_FILES: usize = 4096;
const STARTUP_MIN: usize = 4 << 10;
const STARTUP_MAX: usize = 28 << 10;

/// Part 4: for each cluster size, nodes started together, loaders at once.
fn startup(work: &Path) {
    let sizes: Vec<usize> = std::env::var("LOCAFS_BENCH_STARTUP_NODES")
        .ok()
        .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![3, 8, 64]);
    let src = work.join("startup-source");
    std::fs::create_dir_all(src.join("train")).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(64);
    let mut files = Vec::new();
    let mut total = 0u64;
    for i in 0..STARTUP_FILES {
        let len = rng.random_range(STARTUP_MIN..=STARTUP_MAX);
        let mut d = vec![0u8; len];
        rng.fill(&mut d[..]);
        let rel = format!("train/{:02}/s{i:05}.bin", i % 32);
        std::fs::create_dir_all(src.join(&rel).parent().unwrap()).unwrap();
        std::fs::write(src.join(&rel), &d).unwrap();
        files.push(rel);
        total += len as u64;
    }
    let secret = work.join("startup-secret");
    common::write_private(&secret, locafs::peer::tls::generate_secret().unwrap());
    println!(
        "\n4. nodes started together, loaders at once (defaults: read-ahead on, --peer-timeout 2s), \
         2 epochs of DistributedSampler shares, data set {:.1} MiB in {STARTUP_FILES} files",
        total as f64 / 1048576.0
    );
    for n in sizes {
        let r = startup_run(work, &src, &files, total, &secret, n);
        println!(
            "   {n:>2} nodes: source {:.4}x the data set (goal <= 1.01), failed reads {}, \
             blocks to the source while their owner was unreached {}, reads that waited for one {} ({} met), \
             failed peer requests {}, busy answers {}",
            r.source_bytes as f64 / total as f64,
            r.failed_reads,
            r.unreached_blocks,
            r.waits,
            r.waits_met,
            r.peer_failures,
            r.peer_busy
        );
        println!(
            "            mesh: every node reached every other {:.2} s after the first start \
             (slowest node's own mesh {:.2} s after its start; last mount {:.2} s after the first start); \
             epochs {:.2} s + {:.2} s",
            r.mesh_s, r.own_mesh_max_s, r.last_mount_s, r.epochs[0], r.epochs[1]
        );
        println!(
            "            per node: RSS median {:.0} MiB, max {:.0} MiB; threads median {}, max {} \
             after epoch 2; idle 10 s later: median {}, max {}; 30 s later: median {}, max {}",
            r.rss_med as f64 / 1048576.0,
            r.rss_max as f64 / 1048576.0,
            r.threads_busy.0,
            r.threads_busy.1,
            r.threads_idle.0,
            r.threads_idle.1,
            r.threads_idle30.0,
            r.threads_idle30.1
        );
    }
}

struct Startup {
    source_bytes: u64,
    failed_reads: u64,
    unreached_blocks: u64,
    waits: u64,
    waits_met: u64,
    peer_failures: u64,
    peer_busy: u64,
    mesh_s: f64,
    own_mesh_max_s: f64,
    last_mount_s: f64,
    epochs: [f64; 2],
    rss_med: u64,
    rss_max: u64,
    threads_busy: (u64, u64),
    threads_idle: (u64, u64),
    threads_idle30: (u64, u64),
}

/// Median and maximum.
fn med_max(mut v: Vec<u64>) -> (u64, u64) {
    v.sort_unstable();
    (v[v.len() / 2], *v.last().unwrap())
}

fn startup_run(
    work: &Path,
    src: &Path,
    files: &[String],
    total: u64,
    secret: &Path,
    n: usize,
) -> Startup {
    // Namespaces without shaping: what is measured is who reads what, and
    // how long the mesh takes to form, not the links. The kernel's ARP
    // table is one for all namespaces, bounded by gc_thresh3 (1024 by
    // default): past it no new neighbour is made and a send fails with
    // ENOBUFS (at 64 nodes, 4,032 neighbours: seen as 1,024 links up and the
    // rest timing out). Then the nodes use loopback ports instead.
    let neighbours = std::fs::read_to_string("/proc/sys/net/ipv4/neigh/default/gc_thresh3")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    let lab = if n * n + n > neighbours {
        Err(format!(
            "{} ARP entries needed, net.ipv4.neigh.default.gc_thresh3 is {neighbours}",
            n * n
        ))
    } else {
        locafs_lab_netns(n)
    };
    let net = match lab {
        Ok(lab) => Net::Lab(lab),
        Err(e) => {
            println!(
                "   ({n} nodes on loopback, one address each (127.34.0.x), not in namespaces: {e})"
            );
            Net::LoopbackHosts(n)
        }
    };
    let tag = format!("startup{n}");
    let spec = NodeSpec {
        work,
        src,
        // Every node could hold the whole data set: nothing is evicted, so
        // a second read of a block is the peer cache's doing, not the
        // cache's size.
        cache_size: total * 2 + (64 << 20),
        net: &net,
        secret: Some(secret),
        cgroup: None,
        extra: &[],
        tag: &tag,
    };
    let wall_start = std::time::SystemTime::now();
    let t0 = Instant::now();
    let nodes: Vec<Node> = (0..n).map(|i| spawn(i, &spec)).collect();
    let barrier = std::sync::Barrier::new(n);
    let failed = std::sync::atomic::AtomicU64::new(0);
    let mounted_at: Vec<f64>;
    let mut epochs = [0.0; 2];
    {
        let epoch_end = parking_lot::Mutex::new([Duration::ZERO; 2]);
        mounted_at = std::thread::scope(|s| {
            let hs: Vec<_> = nodes
                .iter()
                .enumerate()
                .map(|(i, node)| {
                    let (barrier, failed, epoch_end) = (&barrier, &failed, &epoch_end);
                    s.spawn(move || {
                        common::wait_until(
                            &format!("node {i} to mount"),
                            Duration::from_secs(300),
                            || common::answers_stats(&node.mnt),
                        );
                        let mounted = t0.elapsed().as_secs_f64();
                        for e in 0..2u64 {
                            let mut rng = rand::rngs::StdRng::seed_from_u64(4000 + e);
                            let mut order: Vec<usize> = (0..files.len()).collect();
                            order.shuffle(&mut rng);
                            for &f in order.iter().skip(i).step_by(n) {
                                let want = std::fs::read(src.join(&files[f])).unwrap();
                                match std::fs::read(node.mnt.join(&files[f])) {
                                    Ok(got) if got == want => {}
                                    _ => {
                                        failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                    }
                                }
                            }
                            let mut ends = epoch_end.lock();
                            ends[e as usize] = ends[e as usize].max(t0.elapsed());
                            drop(ends);
                            barrier.wait();
                        }
                        mounted
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let ends = epoch_end.lock();
        let last_mount = mounted_at.iter().cloned().fold(0.0, f64::max);
        epochs[0] = ends[0].as_secs_f64() - last_mount;
        epochs[1] = ends[1].as_secs_f64() - ends[0].as_secs_f64();
    }
    let busy: Vec<(u64, u64)> = nodes.iter().map(rss_and_threads).collect();
    let stats: Vec<_> = nodes
        .iter()
        .map(|node| locafs::cli::stats::fetch(&node.mnt).unwrap())
        .collect();
    let now = std::time::SystemTime::now();
    let since_start = now.duration_since(wall_start).unwrap().as_secs_f64();
    // A node's mesh time is from its own start; its start is `uptime` ago.
    let mut mesh_s: f64 = 0.0;
    let mut own_max: f64 = 0.0;
    for st in &stats {
        match st.peer_mesh_formed_s {
            Some(m) => {
                mesh_s = mesh_s.max(since_start - st.uptime_s + m);
                own_max = own_max.max(m);
            }
            None => mesh_s = f64::INFINITY,
        }
    }
    for (i, st) in stats.iter().enumerate() {
        if st.peer_mesh_formed_s.is_none() {
            let mut states = std::collections::BTreeMap::new();
            for p in &st.peers {
                *states.entry(p.state.as_str()).or_insert(0) += 1;
            }
            println!("   node {i}: the mesh did not form: peers {states:?}");
        }
    }
    std::thread::sleep(Duration::from_secs(10));
    let idle: Vec<u64> = nodes.iter().map(|n| rss_and_threads(n).1).collect();
    std::thread::sleep(Duration::from_secs(20));
    let idle30: Vec<u64> = nodes.iter().map(|n| rss_and_threads(n).1).collect();
    let r = Startup {
        source_bytes: stats.iter().map(|s| s.source_bytes).sum(),
        failed_reads: failed.into_inner() + stats.iter().map(|s| s.read_errors).sum::<u64>(),
        unreached_blocks: stats.iter().map(|s| s.peer_unreached_source_blocks).sum(),
        waits: stats.iter().map(|s| s.peer_owner_waits).sum(),
        waits_met: stats.iter().map(|s| s.peer_owner_waits_met).sum(),
        peer_failures: stats.iter().map(|s| s.peer_failures).sum(),
        peer_busy: stats.iter().map(|s| s.peer_busy).sum(),
        mesh_s,
        own_mesh_max_s: own_max,
        last_mount_s: mounted_at.iter().cloned().fold(0.0, f64::max),
        epochs,
        rss_med: med_max(busy.iter().map(|b| b.0).collect()).0,
        rss_max: med_max(busy.iter().map(|b| b.0).collect()).1,
        threads_busy: med_max(busy.iter().map(|b| b.1).collect()),
        threads_idle: med_max(idle),
        threads_idle30: med_max(idle30),
    };
    // Unmount all at once (each drop waits for its daemon).
    std::thread::scope(|s| {
        for node in nodes {
            s.spawn(move || drop(node));
        }
    });
    drop(net);
    r
}

/// `n` node namespaces on one bridge, unshaped.
fn locafs_lab_netns(n: usize) -> Result<common::netns::Lab, String> {
    common::netns::Lab::new(n)
}

/// Figure 3: one block from a peer (over QUIC, from the owner's cache)
/// against the same block read and verified from the local cache file.
fn latency(nodes: &[Node], net: &Net, src: &Path, files: &[String], secret: &Path) {
    let canon = std::fs::canonicalize(src).unwrap();
    let ds_name = locafs::mount::config::dataset_id(&canon);
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
        Net::Loopback(_) | Net::LoopbackHosts(_) => UdpSocket::bind("127.0.0.1:0").unwrap(),
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
