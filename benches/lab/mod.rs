//! A cluster of real `locafs mount` processes on one machine, for the
//! benches that need several nodes (`peers`, `locality`): each node in its
//! own network namespace (`nsenter --net=`) with a veth to a bridge, every
//! link shaped to 1 Gbit/s each way (`tc tbf`), or loopback, unshaped, when
//! namespaces are unavailable (said on stdout). Caches live in /dev/shm.
//!
//! Bench-only: nothing here is used by the product or by `cargo test`.

#![allow(dead_code)] // each bench uses its own part of the lab

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common;
use crate::common::netns;

pub const PEER_PORT: u16 = 7070;
pub const LINK_RATE: &str = "1gbit";

/// LOCAFS_BENCH_LINK=unshaped keeps the namespaces but not the 1 Gbit/s
/// shaping (to tell the cost of the links from the cost of namespaces).
pub fn shaped() -> bool {
    std::env::var("LOCAFS_BENCH_LINK").map_or(true, |v| v != "unshaped")
}

/// `LOCAFS_BENCH_MTU`: the links' MTU (default: the veth default, 1500).
pub fn mtu() -> Option<u32> {
    std::env::var("LOCAFS_BENCH_MTU")
        .ok()
        .and_then(|v| v.parse().ok())
}

/// Where the nodes talk: their own namespaces and shaped links, or loopback.
pub enum Net {
    Lab(netns::Lab),
    Loopback(Vec<u16>),
    /// Node `i` on 127.34.0.(i+1):7070: loopback, with an address per node
    /// (a node limits the connections from one host IP, so many nodes on
    /// 127.0.0.1 would refuse each other past 32).
    LoopbackHosts(usize),
}

impl Net {
    /// `n` nodes in namespaces with shaped links, or loopback if that fails.
    pub fn new(n: usize) -> Net {
        match netns::Lab::new(n).and_then(|lab| {
            if let Some(mtu) = mtu() {
                lab.set_mtu(mtu)?;
            }
            if shaped() {
                lab.shape(LINK_RATE)?;
            }
            Ok(lab)
        }) {
            Ok(lab) => Net::Lab(lab),
            Err(e) => {
                eprintln!(
                    "network namespaces or tc unavailable ({e}): peers on loopback, NOT shaped"
                );
                Net::Loopback((0..n).map(|_| common::free_udp_port()).collect())
            }
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Net::Lab(lab) => lab.len(),
            Net::Loopback(ports) => ports.len(),
            Net::LoopbackHosts(n) => *n,
        }
    }

    pub fn addr(&self, i: usize) -> SocketAddr {
        match self {
            Net::Lab(lab) => SocketAddr::new(lab.addr(i).into(), PEER_PORT),
            Net::Loopback(ports) => SocketAddr::from(([127, 0, 0, 1], ports[i])),
            Net::LoopbackHosts(_) => SocketAddr::from(([127, 34, 0, i as u8 + 1], PEER_PORT)),
        }
    }

    pub fn describe(&self) -> String {
        let mtu = match (self, mtu()) {
            (Net::Lab(_), Some(m)) => format!(", MTU {m} (LOCAFS_BENCH_MTU)"),
            (Net::Lab(_), None) => ", MTU 1500".to_string(),
            _ => String::new(),
        };
        let links = match self {
            Net::Lab(_) if shaped() => format!(
                "one network namespace per node, veth links shaped to {LINK_RATE}/s each way (tc tbf)"
            ),
            Net::Lab(_) => {
                "one network namespace per node, veth links NOT shaped (LOCAFS_BENCH_LINK=unshaped)"
                    .to_string()
            }
            Net::Loopback(_) => "loopback, NOT shaped (network namespaces unavailable)".to_string(),
            Net::LoopbackHosts(_) => "loopback, one address per node, NOT shaped".to_string(),
        };
        links + &mtu
    }
}

/// One running node; unmounts, stops the daemon and removes its cache when
/// dropped.
pub struct Node {
    pub child: Child,
    pub mnt: PathBuf,
    pub cache: PathBuf,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg(&self.mnt)
            .stderr(Stdio::null())
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut exited = false;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                exited = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        if !exited {
            let _ = self.child.kill();
            let _ = self.child.wait();
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        }
        // The cache lives in /dev/shm, i.e. in RAM: leaving it behind would
        // take memory from every later run.
        let _ = std::fs::remove_dir_all(&self.cache);
    }
}

/// The whole disk a path lives on, as `major:minor` (a partition's parent:
/// the blkio throttle is set on the whole disk).
pub fn disk_of(p: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(p).ok()?.dev();
    let (maj, min) = (libc::major(dev), libc::minor(dev));
    let sys = format!("/sys/dev/block/{maj}:{min}");
    let part = Path::new(&sys).join("partition").exists();
    if part {
        let parent = std::fs::read_to_string(Path::new(&sys).join("../dev")).ok()?;
        return Some(parent.trim().to_owned());
    }
    Some(format!("{maj}:{min}"))
}

/// How to start one node.
pub struct NodeSpec<'a> {
    pub work: &'a Path,
    pub src: &'a Path,
    pub cache_size: u64,
    pub net: &'a Net,
    /// With peers: the cluster secret (every node of `net` is a peer).
    pub secret: Option<&'a Path>,
    /// A cgroup directory to run the daemon in (the source's read cap).
    pub cgroup: Option<&'a str>,
    /// More `locafs mount` arguments.
    pub extra: &'a [&'a str],
    /// Tells caches of different runs apart.
    pub tag: &'a str,
}

/// Starts node `i` and waits until it answers `stats`.
pub fn start(i: usize, spec: &NodeSpec) -> Node {
    let node = spawn(i, spec);
    common::wait_until(
        &format!("node {i} to mount"),
        Duration::from_secs(30),
        || common::answers_stats(&node.mnt),
    );
    node
}

/// Starts node `i` without waiting for its mount (for nodes started all at
/// once: each caller waits for its own).
pub fn spawn(i: usize, spec: &NodeSpec) -> Node {
    let base = spec.work.join(format!("node{i}"));
    let mnt = base.join("mnt");
    let cache = Path::new("/dev/shm").join(format!(
        "locafs-bench-{}-{i}-{}",
        std::process::id(),
        spec.tag
    ));
    let _ = std::fs::remove_dir_all(&cache);
    std::fs::create_dir_all(&mnt).unwrap();
    std::fs::create_dir_all(&cache).unwrap();
    let mut args: Vec<String> = vec![
        "mount".into(),
        spec.src.display().to_string(),
        mnt.display().to_string(),
        "--cache-dir".into(),
        cache.display().to_string(),
        "--cache-size".into(),
        spec.cache_size.to_string(),
        "--log-file".into(),
        base.join("log").display().to_string(),
    ];
    args.extend(spec.extra.iter().map(|s| s.to_string()));
    if let Some(secret) = spec.secret {
        let list: Vec<String> = (0..spec.net.len())
            .map(|j| spec.net.addr(j).to_string())
            .collect();
        args.extend([
            "--listen".into(),
            spec.net.addr(i).to_string(),
            "--peers".into(),
            list.join(","),
            "--cluster-secret-file".into(),
            secret.display().to_string(),
        ]);
    }
    // Into the node's network namespace, if any.
    let mut argv: Vec<String> = Vec::new();
    if let Net::Lab(lab) = spec.net {
        argv.push("nsenter".into());
        argv.push(format!("--net={}", lab.ns_path(i).display()));
        argv.push("--".into());
    }
    argv.push(common::bin().into());
    argv.extend(args);
    // Into the capped cgroup, if any, then become locafs.
    let enter = spec
        .cgroup
        .map(|cg| format!("echo $$ > {cg}/cgroup.procs && "))
        .unwrap_or_default();
    let child = Command::new("sh")
        .arg("-c")
        .arg(format!("{enter}exec \"$0\" \"$@\""))
        .args(&argv)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    Node { child, mnt, cache }
}

/// The node's resident memory (bytes) and threads now, from /proc: its
/// holder (the process started, `locafs mount`: `sh` and `nsenter` exec it)
/// and the server serving the mount, together.
pub fn rss_and_threads(node: &Node) -> (u64, u64) {
    let of = |pid: u32| {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let field = |name: &str| {
            status
                .lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        (field("VmRSS:") * 1024, field("Threads:"))
    };
    let holder = node.child.id();
    let (mut rss, mut threads) = of(holder);
    if let Some(server) = common::restart::server_pid(&node.mnt).filter(|p| *p != holder) {
        let (r, t) = of(server);
        rss += r;
        threads += t;
    }
    (rss, threads)
}

/// Waits until every node sees every peer up.
pub fn wait_for_peers(nodes: &[Node]) {
    let deadline = Instant::now() + Duration::from_secs(30);
    for n in nodes {
        while !locafs::cli::stats::fetch(&n.mnt)
            .map(|s| s.peers.iter().all(|p| p.state == "up" || p.state == "self"))
            .unwrap_or(false)
        {
            assert!(Instant::now() < deadline, "peers did not come up");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// (busy, total) CPU ticks of the whole machine so far, from /proc/stat.
pub fn cpu_ticks() -> (u64, u64) {
    let s = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let v: Vec<u64> = s
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let total: u64 = v.iter().sum();
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    (total - idle, total)
}

/// The `p` quantile of `v` (sorted in place).
pub fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}
