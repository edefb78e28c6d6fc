//! The serving process of a real `locafs mount` is SIGKILLed again and
//! again under load: the holder starts another, which takes over the
//! connection, the namespace and the open handles, and the kernel sends
//! it what the dead one held. Sixteen readers (open files read with pread,
//! whole files read buffered, files mapped, new opens, listings, lookups)
//! see no failed read and no wrong byte through 20 kills, during a cold
//! and a warm epoch; a file opened just before a kill (through the daemon
//! or in passthrough) reads on through the same descriptor.

mod common;

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::restart::{kill_server, server_pid, wait_new_server};
use common::Mount;
use common::*;

/// The data set: (relative path, bytes).
type Tree = Arc<BTreeMap<PathBuf, Vec<u8>>>;

fn make_tree(src: &Path) -> Tree {
    let mut tree = BTreeMap::new();
    let mut rng = Rng(0x005e_ed35);
    for d in 0..4 {
        for i in 0..12u64 {
            let len = if i == 0 {
                6 << 20
            } else {
                20_000 + rng.below(600_000) as usize
            };
            let rel = PathBuf::from(format!("d{d}/f{i:02}.bin"));
            let data = pattern(d * 100 + i, len);
            std::fs::create_dir_all(src.join(format!("d{d}"))).unwrap();
            std::fs::write(src.join(&rel), &data).unwrap();
            tree.insert(rel, data);
        }
    }
    Arc::new(tree)
}

/// What the readers share.
struct Load {
    mnt: PathBuf,
    tree: Tree,
    stop: AtomicBool,
    failures: Mutex<Vec<String>>,
    ops: AtomicU64,
}

impl Load {
    fn fail(&self, what: String) {
        let mut f = self.failures.lock().unwrap();
        if f.len() < 50 {
            f.push(what);
        }
    }

    fn pick(&self, rng: &mut Rng) -> (&PathBuf, &Vec<u8>) {
        let i = rng.below(self.tree.len() as u64) as usize;
        self.tree.iter().nth(i).unwrap()
    }

    fn check(&self, what: &str, rel: &Path, off: usize, got: &[u8], want: &[u8]) {
        if got != want {
            let first = got.iter().zip(want).position(|(a, b)| a != b);
            self.fail(format!(
                "{what} {}: wrong bytes at {off} (+{first:?}; {} of {} bytes)",
                rel.display(),
                got.len(),
                want.len()
            ));
        }
        self.ops.fetch_add(1, Ordering::Relaxed);
    }
}

/// One reader: `kind` says what it does, in a loop until told to stop.
fn reader(load: Arc<Load>, kind: usize, seed: u64) {
    let mut rng = Rng(seed);
    // Holders keep one large file open for the whole phase.
    let held = if kind < 4 {
        let rel = PathBuf::from(format!("d{kind}/f00.bin"));
        match File::open(load.mnt.join(&rel)) {
            Ok(f) => Some((rel, f)),
            Err(e) => {
                load.fail(format!("open {}: {e}", rel.display()));
                return;
            }
        }
    } else {
        None
    };
    while !load.stop.load(Ordering::Relaxed) {
        match kind {
            0..=3 => {
                let (rel, f) = held.as_ref().unwrap();
                let want = &load.tree[rel];
                let len = 4096 + rng.below(1 << 20) as usize;
                let off = rng.below((want.len() - 1) as u64) as usize;
                let end = (off + len).min(want.len());
                let mut buf = vec![0u8; end - off];
                match read_full_at(f, &mut buf, off as u64) {
                    Ok(n) => load.check("pread", rel, off, &buf[..n], &want[off..end]),
                    Err(e) => load.fail(format!("pread {}: {e}", rel.display())),
                }
            }
            4 | 5 => {
                let (rel, want) = load.pick(&mut rng);
                match std::fs::read(load.mnt.join(rel)) {
                    Ok(got) => load.check("read", rel, 0, &got, want),
                    Err(e) => load.fail(format!("read {}: {e}", rel.display())),
                }
            }
            6 | 7 => {
                let (rel, want) = load.pick(&mut rng);
                let got = mmap_read(&load.mnt.join(rel));
                load.check("mmap", rel, 0, &got, want);
            }
            8..=11 => {
                let (rel, want) = load.pick(&mut rng);
                match File::open(load.mnt.join(rel)) {
                    Ok(f) => {
                        let off = rng.below(want.len() as u64) as usize;
                        let end = (off + 256 * 1024).min(want.len());
                        let mut buf = vec![0u8; end - off];
                        match f.read_exact_at(&mut buf, off as u64) {
                            Ok(()) => load.check("open+pread", rel, off, &buf, &want[off..end]),
                            Err(e) => load.fail(format!("pread {}: {e}", rel.display())),
                        }
                    }
                    Err(e) => load.fail(format!("open {}: {e}", rel.display())),
                }
            }
            12 | 13 => {
                let d = format!("d{}", rng.below(4));
                match std::fs::read_dir(load.mnt.join(&d)) {
                    Ok(rd) => {
                        let mut names = Vec::new();
                        for e in rd {
                            match e.and_then(|e| e.metadata().map(|m| (e.file_name(), m.len()))) {
                                Ok((n, len)) => names.push((n, len)),
                                Err(e) => load.fail(format!("readdir {d}: {e}")),
                            }
                        }
                        names.sort();
                        let want: Vec<_> = load
                            .tree
                            .iter()
                            .filter(|(p, _)| p.starts_with(&d))
                            .map(|(p, v)| (p.file_name().unwrap().to_owned(), v.len() as u64))
                            .collect();
                        if names != want {
                            load.fail(format!("listing of {d}: {names:?}"));
                        }
                        load.ops.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => load.fail(format!("readdir {d}: {e}")),
                }
            }
            _ => {
                let (rel, want) = load.pick(&mut rng);
                match std::fs::metadata(load.mnt.join(rel)) {
                    Ok(m) if m.len() == want.len() as u64 => {
                        load.ops.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(m) => load.fail(format!("stat {}: size {}", rel.display(), m.len())),
                    Err(e) => load.fail(format!("stat {}: {e}", rel.display())),
                }
                match std::fs::metadata(load.mnt.join("d1/no-such-file")) {
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    other => load.fail(format!("stat of a missing name: {other:?}")),
                }
            }
        }
    }
}

/// Runs 16 readers while the server is killed `kills` times; the
/// readers' failures.
fn kills_under_load(m: &Mount, tree: &Tree, kills: usize, seed: u64) -> (Vec<String>, u64) {
    let mnt = m.mnt.as_path();
    let load = Arc::new(Load {
        mnt: mnt.to_owned(),
        tree: Arc::clone(tree),
        stop: AtomicBool::new(false),
        failures: Mutex::new(Vec::new()),
        ops: AtomicU64::new(0),
    });
    let threads: Vec<_> = (0..16)
        .map(|k| {
            let load = Arc::clone(&load);
            std::thread::spawn(move || reader(load, k, seed + k as u64))
        })
        .collect();
    let mut rng = Rng(seed);
    for k in 0..kills {
        std::thread::sleep(Duration::from_millis(300 + rng.below(300)));
        let old = kill_server(mnt);
        let t0 = Instant::now();
        while server_pid(mnt).is_none_or(|p| p == old) {
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "kill {k}: no new server within 60 s (load average {}); holder's stderr:\n{}",
                load_average(),
                m.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    load.stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    let ops = load.ops.load(Ordering::Relaxed);
    let failures = std::mem::take(&mut *load.failures.lock().unwrap());
    (failures, ops)
}

#[test]
fn sixteen_readers_see_no_failed_read_through_twenty_kills_cold_and_warm() {
    require_fuse!();
    let sc = Scratch::new();
    let tree = make_tree(&sc.src);
    let mut m = sc.mount(&[]);
    let seed = seed("restart_kill");
    // Cold: nothing cached, the page cache dropped.
    drop_page_cache();
    let (failures, ops) = kills_under_load(&m, &tree, 10, seed);
    assert!(failures.is_empty(), "cold epoch: {failures:#?}");
    eprintln!("cold epoch: {ops} checked reads and listings through 10 kills");
    // Warm: everything cached (complete files open in passthrough).
    for rel in tree.keys() {
        std::fs::read(sc.mnt.join(rel)).unwrap();
    }
    wait_until("every file cached", Duration::from_secs(120), || {
        stats_of(&sc.mnt)["files_cached"].as_u64() == Some(tree.len() as u64)
    });
    drop_page_cache();
    let (failures, ops) = kills_under_load(&m, &tree, 10, seed ^ 1);
    assert!(failures.is_empty(), "warm epoch: {failures:#?}");
    eprintln!("warm epoch: {ops} checked reads and listings through 10 kills");
    let st = stats_of(&sc.mnt);
    assert_eq!(st["restarts"], 20, "{st}");
    assert_eq!(st["last_restart_reason"], "signal", "{st}");
    assert_eq!(st["last_restart_detail"], 9, "{st}");
    assert_eq!(st["supervisor_pid"], m.pid().unwrap(), "{st}");
    assert_eq!(st["pid"], server_pid(&sc.mnt).unwrap(), "{st}");
    assert!(st["passthrough_opens"].as_u64().unwrap() > 0, "{st}");
    assert_eq!(m.unmount().code(), Some(0), "{}", m.stderr());
}

#[test]
fn a_file_opened_just_before_a_kill_reads_on_through_the_same_descriptor() {
    require_fuse!();
    let sc = Scratch::new();
    let cached = pattern(1, 3 << 20);
    let cold = pattern(2, 5 << 20);
    std::fs::write(sc.src.join("cached.bin"), &cached).unwrap();
    std::fs::write(sc.src.join("cold.bin"), &cold).unwrap();
    let metrics = format!("127.0.0.1:{}", free_tcp_port());
    // No read-ahead: cold.bin stays uncached (read through the daemon),
    // and "cached.bin cached" means one file cached (read-ahead of the
    // epoch's other file, under load, made it two before the count was
    // seen at one: the test waited for a count it had passed).
    let mut m = sc.mount(&["--metrics", &metrics, "--no-readahead"]);
    // cached.bin whole in the cache: its next open is in passthrough.
    assert!(std::fs::read(sc.mnt.join("cached.bin")).unwrap() == cached);
    wait_until("cached.bin cached", Duration::from_secs(60), || {
        stats_of(&sc.mnt)["files_cached"].as_u64() == Some(1)
    });
    let before = stats_of(&sc.mnt)["passthrough_opens"].as_u64().unwrap();
    let pt = File::open(sc.mnt.join("cached.bin")).unwrap();
    assert_eq!(
        stats_of(&sc.mnt)["passthrough_opens"].as_u64().unwrap(),
        before + 1,
        "opened in passthrough"
    );
    let daemon = File::open(sc.mnt.join("cold.bin")).unwrap();
    // The OPENs were answered: the server dies now.
    let old = kill_server(&sc.mnt);
    wait_new_server(&sc.mnt, old, Duration::from_secs(60));
    drop_page_cache();
    let mut got = Vec::new();
    (&pt).read_to_end(&mut got).unwrap();
    assert!(got == cached, "passthrough descriptor: wrong bytes");
    let mut got = Vec::new();
    (&daemon).read_to_end(&mut got).unwrap();
    assert!(got == cold, "daemon descriptor: wrong bytes");
    let st = stats_of(&sc.mnt);
    assert_eq!(st["open_handles"], 2, "both handles taken over: {st}");
    assert_eq!(st["restarts"], 1, "{st}");
    assert_eq!(st["last_restart_reason"], "signal", "{st}");
    // The new server's metrics endpoint (same address) counts the restart.
    let mut seen = (None, None, String::new());
    let counted = wait_for(Duration::from_secs(20), || {
        let Ok((200, body)) = common::prom::http_get(&metrics, "/metrics") else {
            return false;
        };
        let (samples, types) = common::prom::parse_prometheus(&body);
        let v = |n| common::prom::value(&samples, n, &[]);
        seen = (
            v("locafs_restarts_total"),
            v("locafs_last_restart_time_seconds"),
            types
                .get("locafs_restarts_total")
                .cloned()
                .unwrap_or_default(),
        );
        seen.0 == Some(1.0)
    });
    assert!(counted, "metrics after one restart: {seen:?}");
    assert_eq!(seen.2, "counter");
    assert!(seen.1.is_some_and(|t| t > 1.0e9), "{seen:?}");
    // A second open of the inode in passthrough shares its backing (the
    // kernel refuses another), then both close and it opens again.
    let again = File::open(sc.mnt.join("cached.bin")).unwrap();
    let mut got = Vec::new();
    (&again).read_to_end(&mut got).unwrap();
    assert!(got == cached);
    drop((pt, again, daemon));
    wait_until("handles released", Duration::from_secs(10), || {
        stats_of(&sc.mnt)["open_handles"] == 0
    });
    assert!(std::fs::read(sc.mnt.join("cached.bin")).unwrap() == cached);
    assert!(std::fs::read(sc.mnt.join("cold.bin")).unwrap() == cold);
    assert_eq!(m.unmount().code(), Some(0), "{}", m.stderr());
}
