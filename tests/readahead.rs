//! Read-ahead engine on real mounts over a slow source (latency per request,
//! one bandwidth cap): sequential prefetch and its stop on random access, the
//! global prefetch budget with many handles, epoch detection, plans and
//! divergence, warm's resumability and exit status, and loader reads staying
//! served while background prefetch saturates the source.

mod common;

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::inproc::{config, mount};
use common::*;
use locafs::testing::{Call, Hook, Hooked, SlowSource};
use rand::seq::SliceRandom;
use rand::{Rng as _, SeedableRng};

const MIB: u64 = 1 << 20;

/// Asserts that no block reached `source` twice.
fn assert_each_block_read_once(source: &SlowSource) {
    let mut per_block: HashMap<(PathBuf, u64), u32> = HashMap::new();
    for r in source.reads() {
        *per_block.entry((r.path, r.offset)).or_default() += 1;
    }
    assert!(
        per_block.values().all(|c| *c == 1),
        "a block was fetched twice"
    );
}

#[test]
fn sequential_reads_prefetch_ahead_and_random_reads_do_not() {
    require_fuse!();
    let d = Scratch::new();
    write_file(&d.src.join("seq.bin"), 1, (64 * MIB) as usize);
    write_file(&d.src.join("rand.bin"), 2, (64 * MIB) as usize);
    let mut cfg = config(&d, &["--no-passthrough", "--cache-size", "1G"]);
    cfg.readahead.epoch = false;
    let source = Arc::new(SlowSource::new(&d.src, Duration::from_millis(2), 0));
    let m = mount(&cfg, source.clone());

    // Sequential: 8 MiB in 128 KiB reads.
    let f = File::open(d.mnt.join("seq.bin")).unwrap();
    let mut buf = vec![0u8; 128 << 10];
    for i in 0..64u64 {
        f.read_exact_at(&mut buf, i * (128 << 10)).unwrap();
    }
    let beyond = |src: &SlowSource, name: &str, from: u64| {
        src.reads()
            .iter()
            .filter(|r| r.path == Path::new(name) && r.offset >= from)
            .count()
    };
    wait_until(
        "blocks past the read position",
        Duration::from_secs(10),
        || beyond(&source, "seq.bin", 9 * MIB) > 0,
    );
    let s = snapshot(m.mountpoint());
    assert!(s.read_ahead.prefetch_sequential_blocks > 0);
    // The window is bounded: nothing beyond 8 MiB + the 64 MiB max window
    // could have been asked for (the file is 64 MiB, so check the count of
    // blocks instead: at most the window past the read position).
    let fetched: HashSet<u64> = source
        .reads()
        .iter()
        .filter(|r| r.path == Path::new("seq.bin"))
        .map(|r| r.offset / MIB)
        .collect();
    assert!(fetched.len() as u64 <= 8 + 64);

    // Random 4 KiB reads: only the blocks touched reach the source.
    let before = s.read_ahead.prefetch_sequential_blocks;
    let f = File::open(d.mnt.join("rand.bin")).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let mut touched = HashSet::new();
    let mut small = vec![0u8; 4096];
    for _ in 0..40 {
        let off = rng.random_range(0..(64 * MIB - 4096)) & !4095;
        touched.insert(off / MIB);
        f.read_exact_at(&mut small, off).unwrap();
    }
    std::thread::sleep(Duration::from_millis(300));
    let fetched: HashSet<u64> = source
        .reads()
        .iter()
        .filter(|r| r.path == Path::new("rand.bin"))
        .map(|r| r.offset / MIB)
        .collect();
    // The kernel's own read-ahead may touch the block after a read; nothing
    // else may be fetched.
    let allowed: HashSet<u64> = touched.iter().flat_map(|b| [*b, b + 1]).collect();
    assert!(
        fetched.is_subset(&allowed),
        "random reads prefetched {:?}",
        fetched.difference(&allowed)
    );
    let after = snapshot(m.mountpoint())
        .read_ahead
        .prefetch_sequential_blocks;
    assert!(
        after - before <= 2,
        "read-ahead kept going on random reads: {}",
        after - before
    );
    drop(m);
}

#[test]
fn small_files_are_fetched_whole_at_open() {
    require_fuse!();
    let d = Scratch::new();
    write_file(&d.src.join("small.bin"), 4, (3 * MIB + 5) as usize);
    let mut cfg = config(&d, &["--no-passthrough", "--cache-size", "1G"]);
    cfg.readahead.epoch = false;
    let source = Arc::new(SlowSource::new(&d.src, Duration::from_millis(20), 0));
    let m = mount(&cfg, source.clone());
    let f = File::open(d.mnt.join("small.bin")).unwrap();
    let mut b = [0u8; 10];
    f.read_exact_at(&mut b, 0).unwrap();
    wait_until("all 4 blocks fetched", Duration::from_secs(10), || {
        source.reads().len() >= 4
    });
    // Each block exactly once (single flight for the read that joined).
    let mut offs: Vec<u64> = source.reads().iter().map(|r| r.offset).collect();
    offs.sort();
    assert_eq!(offs, vec![0, MIB, 2 * MIB, 3 * MIB]);
    drop(m);
}

#[test]
fn prefetch_memory_budget_holds_with_many_handles() {
    require_fuse!();
    let d = Scratch::new();
    let n = 120;
    for i in 0..n {
        write_file(&d.src.join(format!("f{i:03}")), 100 + i, (2 * MIB) as usize);
    }
    let (m, source) = within_file_mount(
        &d,
        &[
            "--no-passthrough",
            "--cache-size",
            "4G",
            "--prefetch-memory",
            "16MiB",
            "--memory-cache",
            "4MiB",
        ],
        Duration::from_millis(1),
    );
    // The kernel's own read-ahead is turned off on these handles, so that
    // what the loader has in flight is exactly its own reads and anything
    // more at the source is locafs's read-ahead.
    let files: Vec<File> = (0..n)
        .map(|i| {
            let f = File::open(d.mnt.join(format!("f{i:03}"))).unwrap();
            // SAFETY: advice on an open descriptor.
            unsafe {
                use std::os::fd::AsRawFd;
                libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM);
            }
            f
        })
        .collect();
    let readers = 8;
    std::thread::scope(|s| {
        for t in 0..readers {
            let files = &files;
            s.spawn(move || {
                let mut buf = vec![0u8; 128 << 10];
                for chunk in 0..16u64 {
                    for (i, f) in files.iter().enumerate() {
                        if i % readers == t {
                            f.read_exact_at(&mut buf, chunk * (128 << 10)).unwrap();
                        }
                    }
                }
            });
        }
    });
    let st = snapshot(m.mountpoint());
    assert!(
        st.read_ahead.prefetch_sequential_blocks > 0,
        "no read-ahead happened"
    );
    // What was in flight at the source at once: prefetch (its share of the
    // 16 MiB budget) plus one block per concurrent loader read (a read may
    // straddle two blocks).
    let max = source
        .max_inflight_bytes
        .load(std::sync::atomic::Ordering::SeqCst);
    let bound = 16 * MIB + (readers as u64) * 2 * MIB;
    assert!(max <= bound, "in flight {max} > budget bound {bound}");
    drop(files);
    drop(m);
}

#[test]
fn epochs_are_detected_and_counted() {
    require_fuse!();
    let d = Scratch::new();
    let n = 300;
    for i in 0..n {
        write_file(
            &d.src.join(format!("c{}/f{i:04}", i % 5)),
            i,
            (4096 + i) as usize,
        );
    }
    let cfg = config(&d, &["--no-passthrough", "--cache-size", "1G"]);
    let source = Arc::new(SlowSource::new(&d.src, Duration::ZERO, 0));
    let m = mount(&cfg, source);
    let mut paths: Vec<PathBuf> = (0..n)
        .map(|i| d.mnt.join(format!("c{}/f{i:04}", i % 5)))
        .collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    for epoch in 1..=3u64 {
        paths.shuffle(&mut rng);
        for p in &paths {
            let mut v = Vec::new();
            File::open(p).unwrap().read_to_end(&mut v).unwrap();
        }
        let s = snapshot(m.mountpoint());
        assert_eq!(s.read_ahead.epoch, epoch);
        assert_eq!(s.read_ahead.epoch_files_total, n);
        assert!(
            s.read_ahead.epoch_files_read >= n * 9 / 10,
            "{:?}",
            s.read_ahead
        );
    }
    drop(m);
}

#[test]
fn a_plan_is_followed_in_order_and_dropped_on_divergence() {
    require_fuse!();
    let d = Scratch::new();
    let n = 150;
    let names: Vec<String> = (0..n).map(|i| format!("f{i:04}")).collect();
    for (i, name) in names.iter().enumerate() {
        write_file(&d.src.join(name), i as u64, 64 << 10);
    }
    let mut cfg = config(
        &d,
        &[
            "--no-passthrough",
            "--cache-size",
            "1G",
            "--prefetch-jobs",
            "2",
        ],
    );
    cfg.readahead.plan_ahead = 8;
    let source = Arc::new(SlowSource::new(&d.src, Duration::from_millis(3), 0));
    let m = mount(&cfg, source.clone());
    let mut order = names.clone();
    order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(5));
    let plan_file = d.path().join("plan.txt");
    std::fs::write(&plan_file, order.join("\n")).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_locafs"))
        .args([
            "plan",
            m.mountpoint().to_str().unwrap(),
            plan_file.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("{n} files")));
    // The loader follows the plan for the first 60 files, slowly.
    let rank: HashMap<&str, usize> = order
        .iter()
        .enumerate()
        .map(|(i, n)| (n.as_str(), i))
        .collect();
    for (pos, name) in order.iter().take(60).enumerate() {
        let mut v = Vec::new();
        File::open(d.mnt.join(name))
            .unwrap()
            .read_to_end(&mut v)
            .unwrap();
        std::thread::sleep(Duration::from_millis(10));
        // Never further ahead than the plan distance (plus jobs in flight).
        let fetched: HashSet<usize> = source
            .reads()
            .iter()
            .filter_map(|r| rank.get(r.path.to_str().unwrap()).copied())
            .collect();
        let furthest = fetched.iter().max().copied().unwrap_or(0);
        assert!(
            furthest <= pos + 8 + 2,
            "prefetched plan position {furthest} while loader at {pos}"
        );
    }
    // Files were fetched in plan order.
    let mut seen = HashSet::new();
    let first_fetches: Vec<usize> = source
        .reads()
        .iter()
        .filter_map(|r| rank.get(r.path.to_str().unwrap()).copied())
        .filter(|r| seen.insert(*r))
        .collect();
    let inversions = first_fetches.windows(2).filter(|w| w[0] > w[1]).count();
    assert!(
        inversions * 10 <= first_fetches.len(),
        "fetch order strays from the plan: {inversions} inversions in {}",
        first_fetches.len()
    );
    let s = snapshot(m.mountpoint());
    assert!(s.read_ahead.plan_active);
    assert!(s.read_ahead.plan_position >= 59);
    // Diverge: read the rest in reverse plan order.
    for name in order.iter().skip(60).rev() {
        let mut v = Vec::new();
        File::open(d.mnt.join(name))
            .unwrap()
            .read_to_end(&mut v)
            .unwrap();
    }
    assert!(
        !snapshot(m.mountpoint()).read_ahead.plan_active,
        "plan kept after divergence"
    );
    drop(m);
}

#[test]
fn warm_caches_resumes_and_reports_what_did_not_fit() {
    require_fuse!();
    let d = Scratch::new();
    for i in 0..40 {
        write_file(&d.src.join(format!("a/f{i:02}")), i, 256 << 10);
    }
    for i in 0..40 {
        write_file(&d.src.join(format!("b/f{i:02}")), 100 + i, MIB as usize);
    }
    // Room for a/ (10 MiB + meta) but not for a/ and b/ (50 MiB).
    let mut cfg = config(&d, &["--no-passthrough", "--cache-size", "24MiB"]);
    cfg.readahead.epoch = false;
    let source = Arc::new(SlowSource::new(&d.src, Duration::ZERO, 0));
    let m = mount(&cfg, source.clone());
    let warm = |path: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_locafs"))
            .args(["warm", "--jobs", "4", d.mnt.join(path).to_str().unwrap()])
            .output()
            .unwrap()
    };
    let out = warm("a");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("40 files"), "{text}");
    let after_first = source.bytes_read();
    assert_eq!(after_first, 40 * (256 << 10));
    // Resumable: a second run reads nothing from the source.
    let out = warm("a");
    assert!(out.status.success());
    assert_eq!(source.bytes_read(), after_first);
    // b/ does not fit: exit status says so, the summary says why.
    let out = warm("b");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("did not fit"), "{text}");
    assert!(text.contains("cache is full"), "{text}");
    // And bad paths are a usage error.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_locafs"))
        .args(["warm", "/nonexistent/path"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    drop(m);
}

#[test]
fn loader_reads_are_served_while_background_prefetch_saturates_the_source() {
    require_fuse!();
    let d = Scratch::new();
    for i in 0..400 {
        write_file(&d.src.join(format!("f{i:03}")), i, 256 << 10);
    }
    // 20 MB/s: the background alone would need 5 s for the data set.
    let cfg = config(
        &d,
        &[
            "--no-passthrough",
            "--cache-size",
            "1G",
            "--prefetch-jobs",
            "8",
        ],
    );
    let source = Arc::new(SlowSource::new(
        &d.src,
        Duration::from_millis(2),
        20_000_000,
    ));
    let m = mount(&cfg, source.clone());
    let mut order: Vec<usize> = (0..400).collect();
    order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(11));
    for i in order.iter().take(40) {
        let mut v = Vec::new();
        File::open(d.mnt.join(format!("f{i:03}")))
            .unwrap()
            .read_to_end(&mut v)
            .unwrap();
        assert_eq!(v, std::fs::read(d.src.join(format!("f{i:03}"))).unwrap());
    }
    let s = snapshot(m.mountpoint());
    assert_eq!(s.read_errors, 0);
    assert!(
        s.read_ahead.prefetch_background_files > 0,
        "background prefetch never ran"
    );
    // Every block reached the source once, prefetched or read.
    assert_each_block_read_once(&source);
    drop(m);
}

#[test]
fn background_prefetch_fills_the_cache_whole_when_the_source_outruns_cache_writes() {
    require_fuse!();
    // A source with no delay outruns checksumming and writing the cache;
    // a small budget gives a small write-back queue. Every block must still
    // land in the cache, each read from the source once: read-ahead waits
    // for the write queue instead of dropping what it fetched.
    let d = Scratch::new();
    let files = 6u64;
    let len = 24 * MIB;
    for i in 0..files {
        write_file(&d.src.join(format!("shard-{i}")), 100 + i, len as usize);
    }
    let cfg = config(
        &d,
        &[
            "--no-passthrough",
            "--cache-size",
            "1G",
            "--prefetch-memory",
            "16M",
            "--prefetch-jobs",
            "8",
            "--block-size",
            "1M",
        ],
    );
    let source = Arc::new(SlowSource::new(&d.src, Duration::ZERO, 0));
    let m = mount(&cfg, source.clone());
    // One read of shard-0's first block starts the epoch; the background
    // prefetch fetches the files not read yet this epoch, all the others.
    let mut b = [0u8; 4096];
    File::open(d.mnt.join("shard-0"))
        .unwrap()
        .read_exact(&mut b)
        .unwrap();
    let t = Instant::now();
    while snapshot(m.mountpoint()).files_cached < files - 1 {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "background prefetch left files partly cached: {:?}",
            snapshot(m.mountpoint())
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let s = snapshot(m.mountpoint());
    // The loader's own block may have been turned away by the full queue
    // and read once more by the background completion; read-ahead's blocks
    // are read once each.
    let expect = (files - 1) * len + MIB;
    assert!(
        s.source_bytes >= expect && s.source_bytes <= expect + s.cache_writes_skipped * MIB,
        "{s:?}"
    );
    let mut per_block: HashMap<(PathBuf, u64), u32> = HashMap::new();
    for r in source.reads() {
        *per_block.entry((r.path, r.offset)).or_default() += 1;
    }
    for ((path, offset), n) in &per_block {
        let limit = if path == Path::new("shard-0") { 2 } else { 1 };
        assert!(*n <= limit, "{} at {offset} read {n} times", path.display());
    }
    // What read-ahead wrote is still in memory for the loader's coming
    // reads (written through the page cache, not straight to the disk to
    // be read back).
    let data_files = cache_files(&d.cache, "data");
    assert_eq!(data_files.len() as u64, files, "{data_files:?}");
    let resident: u64 = data_files.iter().map(|p| resident_bytes(p)).sum();
    assert!(
        resident >= (files - 1) * len,
        "only {resident} bytes of the prefetched files are in the page cache"
    );
    drop(m);
}

#[test]
fn the_kernel_read_ahead_of_the_mount_is_set() {
    require_fuse!();
    for (args, want_kb) in [(vec![], 4096u64), (vec!["--kernel-readahead", "1M"], 1024)] {
        let d = Scratch::new();
        write_file(&d.src.join("f"), 1, 4096);
        let cfg = config(&d, &args);
        let m = mount(&cfg, Arc::new(SlowSource::new(&d.src, Duration::ZERO, 0)));
        let file = locafs::sys::bdi_readahead_file(m.mountpoint()).unwrap();
        let kb: u64 = std::fs::read_to_string(&file)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert_eq!(kb, want_kb, "{} with {args:?}", file.display());
        drop(m);
    }
}

#[test]
fn small_reads_of_a_block_fetch_it_once_when_memory_is_full() {
    require_fuse!();
    // A memory tier of 2 blocks, kept full, and a disk cache too small to
    // take anything: a block lives only in memory between the small reads
    // that cover it. The block just fetched must stay there for the next
    // read (an admission policy that turned it away had each 128 KiB read
    // of a block fetch it again).
    let d = Scratch::new();
    for i in 0..4 {
        write_file(&d.src.join(format!("f{i}")), 10 + i, (4 * MIB) as usize);
    }
    let cfg = config(
        &d,
        &[
            "--no-passthrough",
            "--no-readahead",
            "--prefetch-memory",
            "16M",
            "--memory-cache",
            "2M",
            "--cache-size",
            "4M",
            "--kernel-readahead",
            "0",
        ],
    );
    let source = Arc::new(SlowSource::new(&d.src, Duration::ZERO, 0));
    let m = mount(&cfg, source.clone());
    for i in 0..4 {
        let path = d.mnt.join(format!("f{i}"));
        let want = std::fs::read(d.src.join(format!("f{i}"))).unwrap();
        // O_DIRECT: every 64 KiB read reaches the daemon, in order.
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(&path)
            .unwrap();
        let mut buf = vec![0u8; 64 << 10];
        for off in (0..4 * MIB).step_by(64 << 10) {
            let n = f.read_at(&mut buf, off).unwrap();
            assert_eq!(&buf[..n], &want[off as usize..off as usize + n]);
        }
    }
    assert_each_block_read_once(&source);
    drop(m);
}

#[test]
fn blocks_the_cache_disk_could_not_take_are_completed_in_the_background() {
    require_fuse!();
    // A source with no delay and the smallest budget (a write-back queue of
    // two blocks, and room for one more of the loader's blocks to wait): 32
    // readers fetching different blocks of one file at once have most of
    // their blocks turned away (a loader's read never waits for the queue). Background prefetch must still complete the
    // file, without waiting for the next epoch to read those blocks again.
    // Blocks of 128 KiB: each reader's read is one request for one block.
    // Whether the queue turns a block away depends on timing: up to three
    // tries (each a fresh mount) to get the path under test exercised.
    let bs = 128 * 1024u64;
    let blocks = 32u64;
    let mut tries = 0;
    let (_d, m, source, s) = loop {
        tries += 1;
        let d = Scratch::new();
        write_file(&d.src.join("big"), 7, (blocks * bs) as usize);
        let cfg = config(
            &d,
            &[
                "--no-passthrough",
                "--cache-size",
                "1G",
                "--prefetch-memory",
                "1M",
                "--block-size",
                "128K",
            ],
        );
        // The first 32 source reads wait for each other and end together, so
        // their cache writes arrive at once (reads that end one by one, as fast
        // as they start, may let the queue keep up).
        let source = Arc::new(Hooked::over(
            SlowSource::new(&d.src, Duration::ZERO, 0),
            Burst {
                barrier: std::sync::Barrier::new(blocks as usize),
                arrived: std::sync::atomic::AtomicU64::new(0),
                size: blocks,
            },
        ));
        let m = mount(&cfg, source.clone());
        let want = std::fs::read(d.src.join("big")).unwrap();
        std::thread::scope(|s| {
            for i in 0..blocks {
                let (mnt, want) = (&d.mnt, &want);
                s.spawn(move || {
                    // O_DIRECT: one request per reader, no page cache.
                    let f = std::fs::OpenOptions::new()
                        .read(true)
                        .custom_flags(libc::O_DIRECT)
                        .open(mnt.join("big"))
                        .unwrap();
                    let mut buf = vec![0u8; bs as usize];
                    f.read_exact_at(&mut buf, i * bs).unwrap();
                    let at = (i * bs) as usize;
                    assert!(buf[..] == want[at..at + bs as usize], "block {i}");
                });
            }
        });
        wait_until(
            "the file to be cached whole",
            Duration::from_secs(60),
            || snapshot(m.mountpoint()).files_cached == 1,
        );
        let s = snapshot(m.mountpoint());
        if s.cache_writes_skipped > 0 || tries == 3 {
            break (d, m, source, s);
        }
        eprintln!("try {tries}: no block was turned away; again");
    };
    assert!(
        s.cache_writes_skipped > 0,
        "the write-back queue never turned a block away in {tries} tries: this test did not exercise its path ({s:?})"
    );
    // A turned-away block is written from memory or read once more, never
    // more than that.
    let mut per_block: HashMap<u64, u32> = HashMap::new();
    for r in source.inner().reads() {
        *per_block.entry(r.offset).or_default() += 1;
    }
    assert!(per_block.values().all(|c| *c <= 2), "{per_block:?}");
    drop(m);
}

/// A hook whose first `size` source reads wait until all of them have
/// arrived, then go on together; later reads pass straight through.
struct Burst {
    barrier: std::sync::Barrier,
    arrived: std::sync::atomic::AtomicU64,
    size: u64,
}

impl Hook for Burst {
    fn around<T>(&self, call: Call<'_>, real: impl FnOnce() -> T) -> T {
        if let Call::Read { .. } = call {
            let n = self
                .arrived
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            if n < self.size {
                self.barrier.wait();
            }
        }
        real()
    }
}

/// A data set of `n` files of 64 KiB (one block each) behind a source that
/// takes 20 ms per read and has no bandwidth cap: more reads in flight
/// always buy more. Mounted with `args`; one file read starts the epoch,
/// and the background prefetch fetches the others.
fn remote_epoch(n: usize, args: &[&str]) -> (Scratch, Arc<SlowSource>, locafs::mount::Mount) {
    let d = Scratch::new();
    for i in 0..n {
        write_file(&d.src.join(format!("img{i:04}.jpg")), i as u64, 64 << 10);
    }
    let mut a = vec!["--no-passthrough", "--cache-size", "1G"];
    a.extend_from_slice(args);
    let cfg = config(&d, &a);
    let source = Arc::new(SlowSource::new(&d.src, Duration::from_millis(20), 0));
    let m = mount(&cfg, source.clone());
    let mut v = Vec::new();
    File::open(d.mnt.join("img0000.jpg"))
        .unwrap()
        .read_to_end(&mut v)
        .unwrap();
    (d, source, m)
}

#[test]
fn auto_concurrency_rises_above_its_start_when_the_source_rewards_it() {
    require_fuse!();
    let (d, source, m) = remote_epoch(3000, &[]);
    let start = locafs::read::concurrency::AUTO_START as u64;
    let s = snapshot(&d.mnt);
    assert!(
        s.read_ahead.prefetch_concurrency_auto,
        "auto is the default"
    );
    wait_until(
        "the tuned concurrency to reach 4x its start",
        Duration::from_secs(60),
        || snapshot(&d.mnt).read_ahead.prefetch_concurrency >= 4 * start,
    );
    // And the source did see more reads at once than the start allows.
    let most = source
        .max_inflight_bytes
        .load(std::sync::atomic::Ordering::SeqCst)
        / (64 << 10);
    assert!(most > start, "at most {most} reads in flight at the source");
    let s = snapshot(&d.mnt);
    assert_eq!(s.read_errors, 0);
    assert_each_block_read_once(&source);
    drop(m);
}

#[test]
fn fixed_prefetch_jobs_stays_fixed() {
    require_fuse!();
    let (d, source, m) = remote_epoch(400, &["--prefetch-jobs", "8"]);
    wait_until(
        "the background prefetch to fetch every file",
        Duration::from_secs(60),
        || snapshot(&d.mnt).read_ahead.prefetch_background_files >= 399,
    );
    let s = snapshot(&d.mnt);
    assert!(!s.read_ahead.prefetch_concurrency_auto);
    assert_eq!(s.read_ahead.prefetch_concurrency, 8);
    // 8 background fetches, and the loader's one read (the background
    // starts at its open): never more at the source.
    let most = source
        .max_inflight_bytes
        .load(std::sync::atomic::Ordering::SeqCst)
        / (64 << 10);
    assert!(
        most <= 9,
        "{most} reads in flight at the source with 8 jobs"
    );
    drop(m);
}

#[test]
fn sequential_windows_on_many_files_stay_within_the_fetch_limit() {
    // 8 large files read side by side, as a loader of tar shards does: each
    // handle's window grows to 64 blocks, so without a bound a hundred block
    // reads wait at the source, and a store that queues them makes the
    // loader's opens and lookups wait behind them. Read-ahead's fetches take
    // the slots of `--prefetch-jobs` (4 here); the loader's own reads add
    // at most the kernel's read-ahead (4 MiB: 4 blocks) per file. (Without
    // the bound: 63 blocks in flight; with it, 24.)
    require_fuse!();
    let d = Scratch::new();
    for i in 0..8u64 {
        write_file(
            &d.src.join(format!("s{i}.tar")),
            10 + i,
            (24 * MIB) as usize,
        );
    }
    let (m, source) = within_file_mount(
        &d,
        &[
            "--no-passthrough",
            "--cache-size",
            "1G",
            "--prefetch-jobs",
            "4",
        ],
        Duration::from_millis(20),
    );
    std::thread::scope(|s| {
        for i in 0..8u64 {
            let path = d.mnt.join(format!("s{i}.tar"));
            s.spawn(move || {
                let f = File::open(&path).unwrap();
                let mut buf = vec![0u8; 128 << 10];
                for k in 0..(24 * MIB / (128 << 10)) {
                    f.read_exact_at(&mut buf, k * (128 << 10)).unwrap();
                }
            });
        }
    });
    let s = snapshot(m.mountpoint());
    assert!(
        s.read_ahead.prefetch_sequential_blocks >= 8,
        "no window opened: {}",
        s.read_ahead.prefetch_sequential_blocks
    );
    let most = source
        .max_inflight_bytes
        .load(std::sync::atomic::Ordering::SeqCst)
        .div_ceil(MIB);
    assert!(
        most <= 4 + 8 * 4,
        "{most} blocks in flight at the source with 4 jobs and 8 readers"
    );
    drop(m);
}

/// A mount with within-file read-ahead only (no prefetch of the epoch's
/// files) over a source that takes `latency` per read.
fn within_file_mount(
    d: &Scratch,
    args: &[&str],
    latency: Duration,
) -> (locafs::mount::Mount, Arc<SlowSource>) {
    let mut cfg = config(d, args);
    cfg.readahead.epoch = false;
    let source = Arc::new(SlowSource::new(&d.src, latency, 0));
    (mount(&cfg, source.clone()), source)
}

/// Counts the directory listings in flight at a source, and the most at
/// once. Listings of the class directories (`cNN`) are held until 16 are in
/// flight together (or, for a walk that never lists 16 at once, until the
/// first has waited 10 s); from then on none is held. So a walk that lists
/// up to 16 at once is seen doing so however slowly the machine starts
/// them, and one that lists fewer is seen listing fewer. Each then takes
/// 30 ms, so that one that lists more is seen starting a 17th meanwhile.
#[derive(Default)]
struct Listings {
    now: std::sync::atomic::AtomicU64,
    max: std::sync::atomic::AtomicU64,
    all: std::sync::atomic::AtomicU64,
    open: std::sync::Mutex<bool>,
    opened: std::sync::Condvar,
}

impl locafs::testing::Hook for Listings {
    fn around<T>(&self, call: locafs::testing::Call<'_>, real: impl FnOnce() -> T) -> T {
        use std::sync::atomic::Ordering::SeqCst;
        let locafs::testing::Call::List(p) = call else {
            return real();
        };
        let n = self.now.fetch_add(1, SeqCst) + 1;
        self.max.fetch_max(n, SeqCst);
        self.all.fetch_add(1, SeqCst);
        if p.to_str().is_some_and(|p| p.starts_with('c')) {
            let mut open = self.open.lock().unwrap();
            if n >= 16 {
                *open = true;
                self.opened.notify_all();
            }
            let (mut open, waited) = self
                .opened
                .wait_timeout_while(open, Duration::from_secs(10), |open| !*open)
                .unwrap();
            if waited.timed_out() {
                *open = true;
                self.opened.notify_all();
            }
            drop(open);
            std::thread::sleep(Duration::from_millis(30));
        }
        let r = real();
        self.now.fetch_sub(1, SeqCst);
        r
    }
}

#[test]
fn the_tree_is_listed_for_read_ahead_several_directories_at_a_time() {
    use std::sync::atomic::Ordering::SeqCst;
    require_fuse!();
    let d = Scratch::new();
    // 48 class directories of 4 files, as an image folder.
    for i in 0..192 {
        write_file(&d.src.join(format!("c{:02}/f{i:04}", i % 48)), i, 1000);
    }
    // (A metadata deadline far above the 10 s a listing may be held.)
    let cfg = config(
        &d,
        &[
            "--no-passthrough",
            "--cache-size",
            "1G",
            "--metadata-timeout",
            "60s",
        ],
    );
    let source = Arc::new(locafs::testing::Hooked::wrap(&d.src, Listings::default()));
    let m = mount(&cfg, source.clone());
    let t0 = Instant::now();
    while snapshot(m.mountpoint()).read_ahead.epoch_files_total < 192 {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the walk did not list the tree"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let (max, all) = (source.max.load(SeqCst), source.all.load(SeqCst));
    // The root, then its 48 directories 16 at a time (the walk's bound).
    assert!(all >= 49, "{all} listings");
    assert!((8..=16).contains(&max), "{max} listings at once");
    eprintln!(
        "{all} listings, at most {max} at once, in {:?}",
        t0.elapsed()
    );
    drop(m);
}
