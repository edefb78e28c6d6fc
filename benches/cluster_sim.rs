//! The 256-node picture, from the real code: `cargo bench --bench cluster_sim`.
//!
//! Nodes are objects in one process, with no I/O. What decides where bytes
//! come from is locafs's own code: block ownership is
//! `peer::placement::Placement` over the nodes' member ids, each node's
//! cache is `cache::policy::Policy` (own blocks, guests in spare room,
//! never churned by the epoch's own reads), and the LocalitySampler is
//! `locality::epoch_batches`, the algorithm the Python package implements
//! (tests/data/locality_vectors.json proves they agree).
//!
//! Three setups per cluster size, each for several epochs:
//! - private caches with DistributedSampler (each node on its own),
//! - the peer cache with DistributedSampler (unmodified training scripts),
//! - the peer cache with LocalitySampler.
//!
//! For each epoch it prints bytes from storage and between nodes (as
//! fractions of the data set D), the local hit rate, for LocalitySampler the
//! share of samples moved to a node that does not own them (the paper's
//! "imbalance", 3-7 % of a batch) and the largest surplus or deficit of one
//! node in one batch before balancing, and the modelled loading time:
//! every resource works in parallel, so an epoch's loading takes the time of
//! the busiest one, max(storage bytes / R, the busiest node's network bytes
//! / its link rate, the busiest node's cache bytes / its disk rate). That is
//! the paper's model (Eq. 7: D/R without caches; Eq. 8: (1-alpha)D/R +
//! alpha (D/Rc)(p-1)/p with shared caches), evaluated per resource from the
//! simulated bytes instead of from alpha alone. The binding resource is
//! named in the last column.
//!
//! Inputs (environment): LOCAFS_SIM_NODES (16,64,256,1024),
//! LOCAFS_SIM_LEARNERS (learners per node, 4), LOCAFS_SIM_FILES (1281167,
//! ImageNet-1K), LOCAFS_SIM_MEAN_KB (117, so D is about 150 GB; sizes are
//! log-normal with sigma 0.6), LOCAFS_SIM_CACHE (cache per node: bytes such
//! as 64G, or "2x" for twice the node's share 2D/p; default 2x),
//! LOCAFS_SIM_BATCH (32 per learner), LOCAFS_SIM_EPOCHS (3),
//! LOCAFS_SIM_STORAGE_GBPS (0.8 GB/s: 150 GB in the paper's 188 s),
//! LOCAFS_SIM_NET_GBPS (12.5 GB/s per node, EDR InfiniBand),
//! LOCAFS_SIM_DISK_GBPS (3 GB/s per node, NVMe).

use std::time::Instant;

use locafs::cache::policy::{Admission, Policy, Tier};
use locafs::peer::placement::{block_key, path_id, MemberId, Placement};
use locafs::peer::sampler::{distributed_split, epoch_batches, permutation, Layout, SplitMix64};

const GB: f64 = 1e9;
const BLOCK_SIZE: u32 = 1 << 20;
const SEED: u64 = 20191016;

#[derive(Clone, Copy)]
struct Params {
    nodes: usize,
    learners: usize,
    batch: usize,
    epochs: u64,
    cache_per_node: u64,
    storage_rate: f64,
    net_rate: f64,
    disk_rate: f64,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Setup {
    Private,
    PeerDistributed,
    PeerLocality,
}

impl Setup {
    fn name(self) -> &'static str {
        match self {
            Setup::Private => "private caches + DistributedSampler",
            Setup::PeerDistributed => "peer cache + DistributedSampler",
            Setup::PeerLocality => "peer cache + LocalitySampler",
        }
    }
}

#[derive(Default, Clone)]
struct Epoch {
    storage: u64,
    between: u64,
    read: u64,
    local_hits: u64,
    /// Per node: bytes received from other nodes, bytes read from its cache.
    net_in: Vec<u64>,
    net_out: Vec<u64>,
    disk: Vec<u64>,
    largest_imbalance: usize,
    moved: u64,
}

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, mul) = match s.chars().last()? {
        'K' | 'k' => (&s[..s.len() - 1], 1u64 << 10),
        'M' | 'm' => (&s[..s.len() - 1], 1 << 20),
        'G' | 'g' => (&s[..s.len() - 1], 1 << 30),
        'T' | 't' => (&s[..s.len() - 1], 1 << 40),
        _ => (s, 1),
    };
    num.parse::<f64>().ok().map(|n| (n * mul as f64) as u64)
}

/// Log-normal file sizes with the given mean (sigma 0.6), deterministic.
fn sizes(n: usize, mean: f64) -> Vec<u64> {
    let sigma: f64 = 0.6;
    let median = mean / (sigma * sigma / 2.0).exp();
    let mut rng = SplitMix64::for_epoch(SEED, 1);
    let mut unit = move || (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
    (0..n)
        .map(|_| {
            let (u1, u2) = (unit().max(1e-12), unit());
            let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
            ((median * (sigma * z).exp()) as u64).max(1)
        })
        .collect()
}

/// The owner of each file's first block: the real placement over the
/// members "node<i>:7070", on the real block key of the file's path.
fn owners(files: usize, nodes: usize) -> Vec<u32> {
    let ids: Vec<MemberId> = (0..nodes)
        .map(|i| MemberId::new(format!("node{i}:7070")))
        .collect();
    let placement = Placement::new(ids.clone());
    let dataset = locafs::peer::wire_dataset_id("imagenet");
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let chunk = files.div_ceil(threads).max(1);
    let mut out = vec![0u32; files];
    std::thread::scope(|s| {
        for (c, part) in out.chunks_mut(chunk).enumerate() {
            let (placement, ids, dataset) = (&placement, &ids, &dataset);
            s.spawn(move || {
                for (j, o) in part.iter_mut().enumerate() {
                    let i = c * chunk + j;
                    let rel = format!("train/n{:05}/img{:08}.JPEG", i % 1000, i);
                    let id = path_id(std::path::Path::new(&rel));
                    let owner = placement.owner(&block_key(dataset, &id, 0, BLOCK_SIZE));
                    *o = owner
                        .and_then(|m| ids.iter().position(|x| x == m))
                        .unwrap_or(0) as u32;
                }
            });
        }
    });
    out
}

struct Cluster {
    setup: Setup,
    caches: Vec<Policy<u32>>,
}

impl Cluster {
    fn new(setup: Setup, p: &Params, dataset: u64) -> Self {
        let caches = (0..p.nodes)
            .map(|_| {
                let mut c = Policy::new(p.cache_per_node);
                c.set_dataset_bytes(dataset);
                c.set_grain(BLOCK_SIZE as u64);
                c
            })
            .collect();
        Cluster { setup, caches }
    }

    fn admit(cache: &mut Policy<u32>, f: u32, bytes: u64, tier: Tier) {
        // The evicted entries are already off the books: nothing to unlink.
        let _ = matches!(cache.admit_as(f, bytes, tier), Admission::Admit { .. });
    }

    /// Node `q` reads file `f`, as the reader does: its own cache, then the
    /// owner (which reads the source on a miss and keeps the block), then
    /// the source.
    fn read(&mut self, e: &mut Epoch, q: usize, f: u32, bytes: u64, owner: usize) {
        e.read += bytes;
        self.caches[q].record_read(bytes);
        if self.caches[q].contains(&f) {
            self.caches[q].touch(f);
            e.local_hits += bytes;
            e.disk[q] += bytes;
            return;
        }
        if self.setup == Setup::Private || owner == q {
            e.storage += bytes;
            Self::admit(&mut self.caches[q], f, bytes, Tier::Own);
            return;
        }
        let o = &mut self.caches[owner];
        if o.contains(&f) {
            o.touch(f);
            e.disk[owner] += bytes;
        } else {
            e.storage += bytes;
            Self::admit(o, f, bytes, Tier::Own);
        }
        e.between += bytes;
        e.net_in[q] += bytes;
        e.net_out[owner] += bytes;
        Self::admit(&mut self.caches[q], f, bytes, Tier::Guest);
    }
}

fn run_epoch(c: &mut Cluster, p: &Params, sizes: &[u64], owners: &[u32], epoch: u64) -> Epoch {
    let n = sizes.len();
    let mut e = Epoch {
        net_in: vec![0; p.nodes],
        net_out: vec![0; p.nodes],
        disk: vec![0; p.nodes],
        ..Default::default()
    };
    let layout = Layout {
        num_nodes: p.nodes,
        local_world_size: p.learners,
        batch_size: p.batch,
    };
    match c.setup {
        Setup::Private | Setup::PeerDistributed => {
            let world = p.nodes * p.learners;
            let ranks = distributed_split(&permutation(n, SEED, epoch), world);
            // Step by step: every learner reads its next batch.
            let steps = layout.batches(n);
            for k in 0..steps {
                for (r, idx) in ranks.iter().enumerate() {
                    let q = r / p.learners;
                    for &f in &idx[k * p.batch..(k + 1) * p.batch] {
                        c.read(&mut e, q, f, sizes[f as usize], owners[f as usize] as usize);
                    }
                }
            }
        }
        Setup::PeerLocality => {
            for batch in epoch_batches(owners, layout, SEED, epoch) {
                e.largest_imbalance = e.largest_imbalance.max(batch.largest_imbalance);
                e.moved += batch.moved as u64;
                for (q, share) in batch.per_node.iter().enumerate() {
                    for &f in share {
                        c.read(&mut e, q, f, sizes[f as usize], owners[f as usize] as usize);
                    }
                }
            }
        }
    }
    e
}

/// Seconds of loading, and the resource that binds it.
fn model(e: &Epoch, p: &Params) -> (f64, &'static str) {
    let storage = e.storage as f64 / p.storage_rate;
    let busiest_link = e
        .net_in
        .iter()
        .zip(&e.net_out)
        .map(|(i, o)| *i.max(o))
        .max()
        .unwrap_or(0);
    let net = busiest_link as f64 / p.net_rate;
    let disk = e.disk.iter().copied().max().unwrap_or(0) as f64 / p.disk_rate;
    let mut best = (storage, "storage");
    if net > best.0 {
        best = (net, "network");
    }
    if disk > best.0 {
        best = (disk, "local disk");
    }
    best
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let nodes_list: Vec<usize> = std::env::var("LOCAFS_SIM_NODES")
        .unwrap_or_else(|_| "16,64,256,1024".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let files: usize = env("LOCAFS_SIM_FILES", 1_281_167);
    let mean_kb: f64 = env("LOCAFS_SIM_MEAN_KB", 117.0);
    let cache_spec = std::env::var("LOCAFS_SIM_CACHE").unwrap_or_else(|_| "2x".into());
    let learners: usize = env("LOCAFS_SIM_LEARNERS", 4);
    let batch: usize = env("LOCAFS_SIM_BATCH", 32);
    let epochs: u64 = env("LOCAFS_SIM_EPOCHS", 3);
    let storage_rate = env("LOCAFS_SIM_STORAGE_GBPS", 0.8) * GB;
    let net_rate = env("LOCAFS_SIM_NET_GBPS", 12.5) * GB;
    let disk_rate = env("LOCAFS_SIM_DISK_GBPS", 3.0) * GB;

    let t = Instant::now();
    let sizes = sizes(files, mean_kb * 1000.0);
    let d: u64 = sizes.iter().sum();
    println!(
        "cluster_sim: {files} files, D = {:.1} GB (mean {:.0} KB), {learners} learners per node, batch {batch} per learner, {epochs} epochs",
        d as f64 / GB,
        d as f64 / files as f64 / 1000.0
    );
    println!(
        "rates: storage R = {:.2} GB/s (shared), network {:.1} GB/s per node, local disk {:.1} GB/s per node; cache per node: {cache_spec}",
        storage_rate / GB,
        net_rate / GB,
        disk_rate / GB
    );
    println!("baseline: private caches + DistributedSampler in the same run; 'x base' is its loading time over this setup's, same epoch\n");

    for &nodes in &nodes_list {
        let cache_per_node = if let Some(k) = cache_spec.strip_suffix('x') {
            (k.parse::<f64>().unwrap_or(2.0) * d as f64 / nodes as f64) as u64
        } else {
            parse_size(&cache_spec).unwrap_or(64 << 30)
        };
        let p = Params {
            nodes,
            learners,
            batch,
            epochs,
            cache_per_node,
            storage_rate,
            net_rate,
            disk_rate,
        };
        let t_own = Instant::now();
        let owners = owners(sizes.len(), nodes);
        let mut held = vec![0u64; nodes];
        for (f, &o) in owners.iter().enumerate() {
            held[o as usize] += sizes[f];
        }
        let (lo, hi) = (
            *held.iter().min().unwrap_or(&0),
            *held.iter().max().unwrap_or(&0),
        );
        println!(
            "== {nodes} nodes, {} learners, cache {:.2} GB per node ({:.2} D together); owners in {:.1} s; bytes owned per node {:.3}-{:.3} D/p",
            nodes * learners,
            cache_per_node as f64 / GB,
            cache_per_node as f64 * nodes as f64 / d as f64,
            t_own.elapsed().as_secs_f64(),
            lo as f64 * nodes as f64 / d as f64,
            hi as f64 * nodes as f64 / d as f64,
        );
        println!(
            "{:<38} {:>5} {:>9} {:>9} {:>6} {:>7} {:>7} {:>9} {:>8}  bound by",
            "setup", "epoch", "storage", "between", "hit", "moved", "imbal.", "load s", "x base"
        );
        let setups = [Setup::Private, Setup::PeerDistributed, Setup::PeerLocality];
        let mut clusters: Vec<Cluster> = setups.iter().map(|&s| Cluster::new(s, &p, d)).collect();
        let mut base = vec![0.0; epochs as usize];
        for (si, c) in clusters.iter_mut().enumerate() {
            for epoch in 0..p.epochs {
                let e = run_epoch(c, &p, &sizes, &owners, epoch);
                let (secs, bound) = model(&e, &p);
                if si == 0 {
                    base[epoch as usize] = secs;
                }
                let (moved, imbalance) = if c.setup == Setup::PeerLocality {
                    let samples = Layout {
                        num_nodes: nodes,
                        local_world_size: learners,
                        batch_size: batch,
                    };
                    let samples = samples.batches(files) * samples.global_batch();
                    (
                        format!("{:.1}%", 100.0 * e.moved as f64 / samples.max(1) as f64),
                        format!(
                            "{:.1}%",
                            100.0 * e.largest_imbalance as f64 / (learners * batch) as f64
                        ),
                    )
                } else {
                    ("-".into(), "-".into())
                };
                println!(
                    "{:<38} {:>5} {:>8.3}D {:>8.3}D {:>5.1}% {:>7} {:>7} {:>9.1} {:>7.1}x  {}",
                    setups[si].name(),
                    epoch + 1,
                    e.storage as f64 / d as f64,
                    e.between as f64 / d as f64,
                    100.0 * e.local_hits as f64 / e.read.max(1) as f64,
                    moved,
                    imbalance,
                    secs,
                    base[epoch as usize] / secs.max(1e-9),
                    bound
                );
            }
        }
        println!();
    }
    println!("cluster_sim done in {:.0} s", t.elapsed().as_secs_f64());
}
