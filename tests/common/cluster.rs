//! The peer tests' cluster: a shared source directory, and real `locafs
//! mount` processes on loopback (or in network namespaces, `netns`), each
//! with its own cache dir, mountpoint and UDP port, talking QUIC to each
//! other; and what a hand-made peer needs (a runtime, request frames).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use locafs::cache::VersionKey;
use locafs::obs::stats::StatsSnapshot;
use locafs::peer::codec::{self, Frame, WireVersion};
use locafs::source::{SourceAttr, SourceVersion};
use rand::{Rng, SeedableRng};

use super::daemon::{answers_stats, bin, snapshot};
use super::pki::PemFiles;
use super::sys::{wait_for, wait_until};

pub const BLOCK: u64 = 64 * 1024;

/// A runtime for a hand-made peer (two workers, as on a small node).
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// The version of the file at `p` now, as a source would stat it.
pub fn version_of(p: &Path) -> SourceVersion {
    SourceAttr::from_metadata(&std::fs::metadata(p).unwrap()).version()
}

/// A `GetBlock` for block `block` (of `block_size` bytes) of version `v` of
/// `rel` in the data set `dataset`.
pub fn get_block(
    dataset: [u8; 16],
    rel: &str,
    v: SourceVersion,
    block: u64,
    block_size: u64,
) -> Frame {
    Frame::GetBlock {
        dataset,
        version: VersionKey::new(Path::new(rel), &v).0,
        block,
        block_size: block_size as u32,
        file: WireVersion {
            size: v.size,
            mtime_ns: v.mtime_ns,
            ino: v.ino,
        },
        path: Bytes::copy_from_slice(rel.as_bytes()),
    }
}

/// `f` on the wire.
pub fn encoded(f: &Frame) -> BytesMut {
    let mut b = BytesMut::new();
    codec::encode(f, &mut b).unwrap();
    b
}

/// A test directory holding the source, the secret and one dir per node.
pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub files: Vec<(String, Vec<u8>)>,
    pub secret: PathBuf,
    /// What the nodes mount instead of the source directory (an object
    /// store URL holding the same files).
    pub url: Option<String>,
}

impl Cluster {
    /// `n` files of random sizes between `min` and `max` bytes.
    pub fn new(n: usize, min: usize, max: usize, seed: u64) -> Cluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let src = dir.path().join("source");
        std::fs::create_dir_all(src.join("train")).unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut files = Vec::new();
        for i in 0..n {
            let len = rng.random_range(min..=max);
            let mut data = vec![0u8; len];
            rng.fill(&mut data[..]);
            let rel = format!("train/f{i:04}.bin");
            std::fs::write(src.join(&rel), &data).unwrap();
            files.push((rel, data));
        }
        let secret = dir.path().join("secret");
        super::data::write_private(&secret, random_secret(&mut rng));
        Cluster {
            dir,
            files,
            secret,
            url: None,
        }
    }

    /// The source directory (the files' home, whatever the nodes mount).
    pub fn source(&self) -> PathBuf {
        self.dir.path().join("source")
    }

    /// What the nodes mount: [`Cluster::url`] if set, else the source.
    pub fn mounted(&self) -> PathBuf {
        match &self.url {
            Some(u) => PathBuf::from(u),
            None => self.source(),
        }
    }

    pub fn total_bytes(&self) -> u64 {
        self.files.iter().map(|(_, d)| d.len() as u64).sum()
    }

    /// A second secret, for a node that must not get in.
    pub fn other_secret(&self) -> PathBuf {
        let p = self.dir.path().join("other-secret");
        let mut rng = rand::rngs::StdRng::seed_from_u64(99);
        super::data::write_private(&p, random_secret(&mut rng));
        p
    }
}

/// How a node proves it belongs to the cluster.
pub enum Auth<'a> {
    /// `--cluster-secret-file`.
    Secret(&'a Path),
    /// `--peer-ca`, `--peer-cert`, `--peer-key` as flags.
    Certs(&'a PemFiles),
    /// The same as one fstab-style `-o` option.
    CertsInO(&'a PemFiles),
}

impl Auth<'_> {
    fn args(&self) -> Vec<std::ffi::OsString> {
        match self {
            Auth::Secret(p) => vec!["--cluster-secret-file".into(), p.into()],
            Auth::Certs(f) => vec![
                "--peer-ca".into(),
                (&f.ca).into(),
                "--peer-cert".into(),
                (&f.cert).into(),
                "--peer-key".into(),
                (&f.key).into(),
            ],
            Auth::CertsInO(f) => vec![
                "-o".into(),
                format!(
                    "peer_ca={},peer_cert={},peer_key={}",
                    f.ca.display(),
                    f.cert.display(),
                    f.key.display()
                )
                .into(),
            ],
        }
    }
}

/// A cluster secret in the form `locafs secret` prints, from `rng` (so that
/// a test's secrets are the same at every run).
fn random_secret(rng: &mut impl Rng) -> String {
    locafs::peer::tls::format_secret(&rng.random())
}

/// One running `locafs mount` process.
pub struct Node {
    pub name: String,
    pub port: u16,
    /// The `--listen` address (its member id for the other nodes).
    pub addr: String,
    pub mountpoint: PathBuf,
    pub cache: PathBuf,
    pub log: PathBuf,
    child: Option<Child>,
}

pub struct NodeOpts<'a> {
    pub peers: &'a [u16],
    pub secret: &'a Path,
    pub cache_size: &'a str,
    pub peer_timeout: &'a str,
}

/// Where a node listens and whom it asks, in general form.
pub struct NodeSpec<'a> {
    pub listen: String,
    pub peers: Vec<String>,
    pub secret: &'a Path,
    pub cache_size: &'a str,
    pub peer_timeout: &'a str,
    /// Runs the daemon in this network namespace (`nsenter --net=`), so its
    /// traffic stays there while its mount is visible everywhere.
    pub netns: Option<PathBuf>,
}

impl Node {
    /// Starts a node on loopback and waits until its mount answers.
    pub fn start(c: &Cluster, name: &str, port: u16, o: NodeOpts) -> Node {
        let spec = NodeSpec {
            listen: format!("127.0.0.1:{port}"),
            peers: o.peers.iter().map(|p| format!("127.0.0.1:{p}")).collect(),
            secret: o.secret,
            cache_size: o.cache_size,
            peer_timeout: o.peer_timeout,
            netns: None,
        };
        Node::start_spec(c, name, spec)
    }

    /// Starts a node on loopback that authenticates with `auth`, with a
    /// 256M cache and a 1s peer timeout.
    pub fn start_auth(c: &Cluster, name: &str, port: u16, peers: &[u16], auth: Auth) -> Node {
        let spec = NodeSpec {
            listen: format!("127.0.0.1:{port}"),
            peers: peers.iter().map(|p| format!("127.0.0.1:{p}")).collect(),
            secret: Path::new("unused"),
            cache_size: "256M",
            peer_timeout: "1s",
            netns: None,
        };
        Node::launch(c, name, spec, auth, &[])
    }

    /// Starts a node as `spec` says and waits until its mount answers.
    pub fn start_spec(c: &Cluster, name: &str, o: NodeSpec) -> Node {
        Node::start_spec_with(c, name, o, &[])
    }

    /// Like [`Node::start_spec`], with more `locafs mount` options (a
    /// `--block-size` there replaces the harness's [`BLOCK`]).
    pub fn start_spec_with(c: &Cluster, name: &str, o: NodeSpec, extra: &[&str]) -> Node {
        let secret = o.secret;
        Node::launch(c, name, o, Auth::Secret(secret), extra)
    }

    /// The daemon's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    fn launch(c: &Cluster, name: &str, o: NodeSpec, auth: Auth, extra: &[&str]) -> Node {
        let base = c.dir.path().join(name);
        let mountpoint = base.join("mnt");
        let cache = base.join("cache");
        std::fs::create_dir_all(&mountpoint).unwrap();
        std::fs::create_dir_all(&cache).unwrap();
        let log = base.join("log");
        let peers = &o.peers;
        let port = o
            .listen
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        let mut cmd = match &o.netns {
            None => Command::new(bin()),
            Some(ns) => {
                let mut c = Command::new("nsenter");
                c.arg(format!("--net={}", ns.display()))
                    .arg("--")
                    .arg(bin());
                c
            }
        };
        let child = cmd
            .arg("mount")
            .arg(c.mounted())
            .arg(&mountpoint)
            .arg("--cache-dir")
            .arg(&cache)
            .args(["--cache-size", o.cache_size])
            .args(if extra.contains(&"--block-size") {
                Vec::new()
            } else {
                vec!["--block-size".to_owned(), BLOCK.to_string()]
            })
            .arg("--no-passthrough")
            .args(["--listen", &o.listen])
            .args(["--peers", &peers.join(",")])
            .args(auth.args())
            .args(["--peer-timeout", o.peer_timeout])
            .args(extra)
            .arg("--log-file")
            .arg(&log)
            .env("RUST_LOG", "locafs=debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start locafs");
        let mut node = Node {
            name: name.to_owned(),
            port,
            addr: o.listen.clone(),
            mountpoint,
            cache,
            log,
            child: Some(child),
        };
        let start = Instant::now();
        loop {
            if answers_stats(&node.mountpoint) {
                break;
            }
            if let Some(Ok(Some(st))) = node.child.as_mut().map(|c| c.try_wait()) {
                panic!("{name} exited with {st}:\n{}", node.log_text());
            }
            // 60 s, as Mount::start_env gives: an s3:// node asks its store
            // (an emulator, slow on a loaded machine) before it mounts.
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "{name} did not mount within 60 s:\n{}",
                node.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        node
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn stats(&self) -> StatsSnapshot {
        snapshot(&self.mountpoint)
    }

    /// The peer entry for the node listening on `port`, as this node sees it.
    pub fn peer_state(&self, port: u16) -> Option<String> {
        self.peer_state_of(&format!("127.0.0.1:{port}"))
    }

    /// The peer entry for the member `addr` (ip:port), as this node sees it.
    pub fn peer_state_of(&self, want: &str) -> Option<String> {
        self.stats()
            .peers
            .into_iter()
            .find(|p| p.address == want)
            .map(|p| p.state)
    }

    /// Waits until this node sees every node of `ports` up (itself: self).
    pub fn wait_peers_up(&self, ports: &[u16]) {
        let addrs: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        self.wait_peers_in_state(&addrs, &["up", "self"], Duration::from_secs(60));
    }

    /// Waits until this node sees each member of `addrs` in one of `states`.
    pub fn wait_peers_in_state(&self, addrs: &[String], states: &[&str], limit: Duration) {
        wait_until(
            &format!("{} to see {addrs:?} {states:?}", self.name),
            limit,
            || {
                addrs.iter().all(|a| {
                    self.peer_state_of(a)
                        .is_some_and(|s| states.contains(&s.as_str()))
                })
            },
        );
    }

    /// Reads a file through the mount and checks every byte.
    pub fn read_check(&self, rel: &str, want: &[u8]) {
        let got = std::fs::read(self.mountpoint.join(rel))
            .unwrap_or_else(|e| panic!("{}: read {rel}: {e}", self.name));
        assert!(got == want, "{}: {rel}: wrong bytes", self.name);
    }

    /// SIGKILL, then detach the dead mount.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = locafs::sys::lazy_unmount(&self.mountpoint);
    }

    /// Unmounts cleanly and waits (at most 10 s) for the process to exit;
    /// kills it if it does not.
    pub fn stop(&mut self) {
        let Some(c) = self.child.as_mut() else { return };
        let _ = Command::new("umount").arg(&self.mountpoint).status();
        if wait_for(Duration::from_secs(10), || {
            matches!(c.try_wait(), Ok(Some(_)))
        }) {
            self.child = None;
        } else {
            self.kill();
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.stop();
        }
    }
}

/// A DistributedSampler-like split: a new permutation of the file indices
/// per epoch, cut into `n` disjoint shares.
pub fn shares(files: usize, n: usize, epoch: u64, seed: u64) -> Vec<Vec<usize>> {
    use rand::seq::SliceRandom;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed * 1000 + epoch);
    let mut order: Vec<usize> = (0..files).collect();
    order.shuffle(&mut rng);
    let mut out = vec![Vec::new(); n];
    for (i, f) in order.into_iter().enumerate() {
        out[i % n].push(f);
    }
    out
}

/// Waits until nodes `a` and `b` (listening on `ports`) see each other up
/// and both have refused the stranger at least once.
pub fn wait_pair_up_and_stranger_refused(a: &Node, b: &Node, ports: &[u16]) {
    a.wait_peers_up(ports);
    b.wait_peers_up(ports);
    wait_until(
        "the stranger to be refused",
        Duration::from_secs(10),
        || a.stats().peer_refused_connections > 0 && b.stats().peer_refused_connections > 0,
    );
}

/// A node outside the cluster (another secret or CA) read everything from
/// its own source, correctly, and sees every peer down.
pub fn assert_stranger_got_nothing(c: &Cluster, stranger: &Node) {
    let s = stranger.stats();
    assert_eq!(s.read_errors, 0);
    assert_eq!(s.peer_bytes, 0, "the stranger got bytes from a peer");
    assert_eq!(
        s.source_bytes,
        c.total_bytes(),
        "all from its own source reads"
    );
    for p in &s.peers {
        assert!(
            ["down", "unreached", "self"].contains(&p.state.as_str()),
            "stranger sees {p:?}"
        );
    }
}

/// Reads each node's share of one epoch, all nodes at once, checking bytes.
pub fn run_epoch(c: &Cluster, nodes: &[&Node], epoch: u64, seed: u64) {
    let shares = shares(c.files.len(), nodes.len(), epoch, seed);
    std::thread::scope(|s| {
        for (node, share) in nodes.iter().zip(&shares) {
            s.spawn(move || {
                for &i in share {
                    let (rel, data) = &c.files[i];
                    node.read_check(rel, data);
                }
            });
        }
    });
}
