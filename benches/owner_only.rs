//! `cargo bench --bench owner_only`: what making a cache of an older locafs
//! owner-only costs at its first mount (`PrivateDir::make_private`, issue
//! 33), against the command an admin would run for the same, `chmod -R
//! go-rwx`, on the same tree in the same state, and what every later mount
//! pays once the walk has left its mark (`make_private_once`).
//!
//! The tree is a data set directory as an older locafs left it:
//! `LOCAFS_OWNER_ONLY_FILES` (default 1,000,000) empty `.data` files in
//! the 256 fan-out directories under `blocks/`, files 0644 and directories
//! 0755 (empty files: the walk touches inodes, never data). It is built
//! under `LOCAFS_BENCH_DIR` (default /var/tmp/locafs-bench-owner-only) and
//! removed at the end. Each figure is the median of 3 runs, cold (page
//! cache, dentries and inodes dropped before each) and warm; between runs
//! the modes are set back with `chmod -R u=rwX,go=rX` (not timed). It
//! measures and asserts nothing. Root is needed to drop the caches (the
//! cold figures are skipped without it).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use locafs::sys::private_dir::PrivateDir;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn drop_caches() -> bool {
    std::fs::write("/proc/sys/vm/drop_caches", "3\n").is_ok()
}

fn loosen(dir: &Path) {
    let st = Command::new("chmod")
        .args(["-R", "u=rwX,go=rX"])
        .arg(dir)
        .status()
        .expect("chmod");
    assert!(st.success());
}

fn build(ds: &Path, files: usize) {
    for i in 0..256 {
        std::fs::create_dir_all(ds.join(format!("blocks/{i:02x}"))).unwrap();
    }
    std::fs::create_dir_all(ds.join("index")).unwrap();
    for name in ["lock", "manifest", "index/snapshot", "index/journal.1"] {
        std::fs::write(ds.join(name), b"").unwrap();
    }
    for n in 0..files {
        let key = blake3::hash(&(n as u64).to_le_bytes()).to_hex();
        std::fs::File::create(ds.join(format!("blocks/{}/{}.data", &key[..2], &key[..32])))
            .unwrap();
    }
    loosen(ds);
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Median of 3 runs of `f` over `ds` (modes set back before each; caches
/// dropped before each if `cold`).
fn time(ds: &Path, cold: bool, mut f: impl FnMut(&Path)) -> Duration {
    let mut v = Vec::new();
    for _ in 0..3 {
        loosen(ds);
        if cold {
            drop_caches();
        }
        let t = Instant::now();
        f(ds);
        v.push(t.elapsed());
    }
    median(v)
}

fn main() {
    let files = env_usize("LOCAFS_OWNER_ONLY_FILES", 1_000_000);
    let root = PathBuf::from(
        std::env::var("LOCAFS_BENCH_DIR")
            .unwrap_or_else(|_| "/var/tmp/locafs-bench-owner-only".into()),
    );
    let _ = std::fs::remove_dir_all(&root);
    let ds = root.join("cache").join("dataset");
    let t = Instant::now();
    build(&ds, files);
    println!(
        "owner_only bench: a data set directory of {files} cached files (+256 directories), built in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let ours = |ds: &Path| {
        let w = PrivateDir::open(ds).unwrap().make_private().unwrap();
        assert!(w.entries as usize >= files);
    };
    let chmod = |ds: &Path| {
        let st = Command::new("chmod")
            .args(["-R", "go-rwx"])
            .arg(ds)
            .status()
            .unwrap();
        assert!(st.success());
    };
    let can_drop = drop_caches();
    for cold in [true, false] {
        if cold && !can_drop {
            println!("cold: SKIPPED (dropping the page cache needs root)");
            continue;
        }
        let a = time(&ds, cold, ours);
        let b = time(&ds, cold, chmod);
        let label = if cold { "cold" } else { "warm" };
        println!(
            "{label}: make_private {:.2} s ({:.2} us/file), chmod -R go-rwx {:.2} s; ratio {:.2}",
            a.as_secs_f64(),
            a.as_secs_f64() * 1e6 / files as f64,
            b.as_secs_f64(),
            a.as_secs_f64() / b.as_secs_f64()
        );
    }
    // Every later mount: the mark is there, the walk does not run.
    let d = PrivateDir::open(&ds).unwrap();
    d.make_private_once("owner-only").unwrap();
    let t = Instant::now();
    for _ in 0..1000 {
        assert!(d.make_private_once("owner-only").unwrap().is_none());
    }
    println!(
        "with the mark: {:.1} us per mount (one stat of the mark)",
        t.elapsed().as_secs_f64() * 1e6 / 1000.0
    );
    std::fs::remove_dir_all(&root).unwrap();
}
