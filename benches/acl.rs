//! `cargo bench --bench acl`: what enforcing the source's POSIX ACLs costs
//! a reader who does not own the files (issue 33). With FUSE_POSIX_ACL the
//! kernel asks the daemon for an inode's `system.posix_acl_access` the
//! first time a user other than the owner opens it (and again after its
//! attributes expire or the inode leaves the kernel's cache); the owner
//! (and root reading root's files) is never asked. The daemon answers from
//! the namespace, or reads the ACL from the source (two `lgetxattr`)
//! the first time after the attributes were read.
//!
//! Data: 10,000 files of 8 KiB in 100 directories, root's, mode 0644: one
//! tree without ACLs and one where every file has an ACL (`u:12345:r--`,
//! which leaves user nobody its read access). Through one `locafs mount`
//! (defaults; fully cached first), and on the source, a child process of
//! 8 reader threads reads every file of a tree, as root (the owner) and as
//! user nobody (`setpriv --reuid=65534 --regid=65534 --clear-groups`),
//! the kernel's page cache, dentries and inodes dropped before each pass
//! (so that each pass opens every inode anew: the kernel's own ACL cache
//! is empty). Printed: files/s, the median of `LOCAFS_BENCH_RUNS` (3)
//! passes, each beside root's on the same mount and the source's for the
//! same user, and the ratios. Then a fresh mount over the warm cache (its
//! namespace from the manifest, no ACL read yet): one pass as each user,
//! where nobody's makes the daemon read every file's ACL from the source.
//!
//! It measures and asserts nothing. Root, /dev/fuse, `setfacl` and
//! `setpriv` are needed (else SKIPPED). Data in `LOCAFS_BENCH_DIR`
//! (default /var/tmp/locafs-bench-acl), kept for the next run.

#[path = "../tests/common/mod.rs"]
mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

use common::{drop_page_cache, which, Mount};

const FILES: usize = 10_000;
const DIRS: usize = 100;
const FILE_SIZE: usize = 8 << 10;
const THREADS: usize = 8;
/// The child's environment variable: the list of files to read.
const CHILD: &str = "LOCAFS_ACL_BENCH_LIST";

fn main() {
    if let Ok(list) = std::env::var(CHILD) {
        return read_list(Path::new(&list));
    }
    require_fuse!();
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return common::skipped("acl", "needs root");
    }
    for tool in ["setfacl", "setpriv"] {
        if which(tool).is_none() {
            return common::skipped("acl", &format!("needs {tool}"));
        }
    }
    let runs: usize = std::env::var("LOCAFS_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let root = PathBuf::from(
        std::env::var("LOCAFS_BENCH_DIR").unwrap_or_else(|_| "/var/tmp/locafs-bench-acl".into()),
    );
    let (src, mnt, cache) = (root.join("src"), root.join("mnt"), root.join("cache"));
    // A mount an interrupted run left behind.
    if common::is_mounted(&mnt) {
        common::force_unmount(&mnt);
    }
    for d in [&root, &src, &mnt] {
        fs::create_dir_all(d).unwrap();
        fs::set_permissions(d, fs::Permissions::from_mode(0o755)).unwrap();
    }
    fs::create_dir_all(&cache).unwrap();
    for tree in ["plain", "acl"] {
        make_tree(&src.join(tree), tree == "acl");
    }
    let lists: Vec<(&str, PathBuf)> = ["plain", "acl"]
        .into_iter()
        .map(|t| (t, write_list(&root, t)))
        .collect();

    let m = Mount::start(&src, &mnt, &cache, &[]);
    // Cache everything (as root), then let the cache settle.
    for (_, list) in &lists {
        read_pass(&mnt, list, false);
    }
    std::thread::sleep(Duration::from_secs(2));
    println!("| tree | reader | source files/s | locafs files/s | locafs / source | reader / root on locafs |");
    println!("|---|---|---|---|---|---|");
    for (tree, list) in &lists {
        let med = |base: &Path, nobody: bool| {
            let mut v: Vec<f64> = (0..runs).map(|_| read_pass(base, list, nobody)).collect();
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let (src_root, mnt_root) = (med(&src, false), med(&mnt, false));
        let (src_nobody, mnt_nobody) = (med(&src, true), med(&mnt, true));
        println!(
            "| {tree} | root (owner) | {src_root:.0} | {mnt_root:.0} | {:.2} | 1.00 |",
            mnt_root / src_root
        );
        println!(
            "| {tree} | nobody | {src_nobody:.0} | {mnt_nobody:.0} | {:.2} | {:.2} |",
            mnt_nobody / src_nobody,
            mnt_nobody / mnt_root
        );
    }
    let rss = common::peak_rss(m.pid().unwrap()).unwrap_or(0);
    drop(m);
    println!("\ndaemon peak RSS after the warm passes: {} MiB", rss >> 20);

    // A fresh mount over the warm cache: the first pass of each reader.
    println!("\n| fresh mount, first pass | root files/s | nobody files/s | nobody / root |");
    println!("|---|---|---|---|");
    for (tree, list) in &lists {
        let m = Mount::start(&src, &mnt, &cache, &[]);
        let as_root = read_pass(&mnt, list, false);
        drop(m);
        let m = Mount::start(&src, &mnt, &cache, &[]);
        let as_nobody = read_pass(&mnt, list, true);
        drop(m);
        println!(
            "| {tree} | {as_root:.0} | {as_nobody:.0} | {:.2} |",
            as_nobody / as_root
        );
    }
}

/// `FILES` files of `FILE_SIZE` under `dir` (kept if there), each with an
/// ACL `u:12345:r--` when `acl`.
fn make_tree(dir: &Path, acl: bool) {
    let done = dir.join(".done");
    if done.exists() {
        return;
    }
    let data = vec![0x33u8; FILE_SIZE];
    for d in 0..DIRS {
        let sub = dir.join(format!("d{d:03}"));
        fs::create_dir_all(&sub).unwrap();
        fs::set_permissions(&sub, fs::Permissions::from_mode(0o755)).unwrap();
        for f in 0..FILES / DIRS {
            let p = sub.join(format!("f{f:04}.bin"));
            fs::write(&p, &data).unwrap();
            fs::set_permissions(&p, fs::Permissions::from_mode(0o644)).unwrap();
        }
    }
    fs::set_permissions(dir, fs::Permissions::from_mode(0o755)).unwrap();
    if acl {
        let ok = Command::new("setfacl")
            .args(["-R", "-m", "u:12345:r--"])
            .arg(dir)
            .status()
            .unwrap()
            .success();
        assert!(ok, "setfacl -R");
    }
    fs::write(done, b"").unwrap();
}

/// The relative paths of `tree`'s files, one a line, in a file others
/// may read.
fn write_list(root: &Path, tree: &str) -> PathBuf {
    let mut s = String::new();
    for d in 0..DIRS {
        for f in 0..FILES / DIRS {
            s.push_str(&format!("{tree}/d{d:03}/f{f:04}.bin\n"));
        }
    }
    let p = root.join(format!("{tree}.list"));
    fs::write(&p, s).unwrap();
    fs::set_permissions(&p, fs::Permissions::from_mode(0o644)).unwrap();
    p
}

/// One pass over `list` under `base`, by a child as root or as nobody,
/// with the kernel's caches dropped first: files/s.
fn read_pass(base: &Path, list: &Path, nobody: bool) -> f64 {
    drop_page_cache();
    let exe = std::env::current_exe().unwrap();
    let mut cmd = if nobody {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(&exe);
        c
    } else {
        Command::new(&exe)
    };
    let out = cmd
        .env(CHILD, list)
        .env("LOCAFS_ACL_BENCH_BASE", base)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "reader failed: {text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let secs: f64 = text.trim().parse().expect("the reader's seconds");
    FILES as f64 / secs
}

/// The child: reads every file of the list under `LOCAFS_ACL_BENCH_BASE`
/// with `THREADS` threads, prints the seconds it took.
fn read_list(list: &Path) {
    let base = PathBuf::from(std::env::var("LOCAFS_ACL_BENCH_BASE").unwrap());
    let files: Vec<PathBuf> = fs::read_to_string(list)
        .unwrap()
        .lines()
        .map(|l| base.join(l))
        .collect();
    let next = AtomicUsize::new(0);
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..THREADS {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Relaxed);
                let Some(p) = files.get(i) else { break };
                let got = fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
                assert_eq!(got.len(), FILE_SIZE);
            });
        }
    });
    println!("{}", t0.elapsed().as_secs_f64());
}
