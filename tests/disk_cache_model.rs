//! A property test of the disk cache against a reference model: random
//! sequences of put, get, corruption of a data file, clock advances, stale
//! marks and reopening (drop, then `DiskCache::open` on the same directory)
//! over a handful of file versions, and crashes: the cache dropped without
//! its clean shutdown (its index left as a `kill -9` leaves it: snapshot and
//! journal), or that plus the journal cut at a random byte (a torn write),
//! then reopened. The cache may forget blocks only where
//! the model allows it (an eviction it reported, a block found corrupt); it
//! may never return bytes other than what was put, and its books and its
//! real disk use stay within the capacity.

mod common;

use std::collections::HashSet;
use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use locafs::cache::disk::DiskCache;
use locafs::cache::{BlockStore, ChecksummedBytes, FileVersion};
use locafs::obs::stats::Stats;
use locafs::source::SourceVersion;
use proptest::prelude::*;

const BS: u64 = 64 * 1024;
const CAP: u64 = 4 << 20;

/// The file versions the sequences work on: sizes around block edges, two
/// versions of one path, an empty file.
fn versions() -> Vec<FileVersion> {
    let v = |rel: &str, size: u64, mtime_ns: i64, ino: u64| {
        FileVersion::new(
            Arc::from(Path::new(rel)),
            SourceVersion {
                size,
                mtime_ns,
                ino,
            },
        )
    };
    vec![
        v("a", 1, 1, 10),
        v("b", BS, 2, 11),
        v("c", 3 * BS + 5, 3, 12),
        v("dir/d", 20 * BS, 4, 13),
        v("a", 100_000, 5, 10),
        v("empty", 0, 6, 14),
        v("e", 12 * BS - 1, 7, 15),
    ]
}

fn content(f: usize, i: u64, len: usize) -> Bytes {
    Bytes::from(common::pattern((f as u64) << 32 | i, len))
}

#[derive(Debug, Clone)]
enum Op {
    Put(usize, u64),
    Get(usize, u64),
    Corrupt(usize, u64),
    Access(usize, u64),
    NoteCurrent(usize),
    Reopen,
    /// Dropped without a clean shutdown, reopened.
    Crash,
    /// As `Crash`, with the newest journal cut at this fraction (per
    /// mille) of its length.
    TornCrash(u64),
}

fn op() -> impl Strategy<Value = Op> {
    let n = versions().len();
    prop_oneof![
        6 => (0..n, 0..21u64).prop_map(|(f, i)| Op::Put(f, i)),
        5 => (0..n, 0..21u64).prop_map(|(f, i)| Op::Get(f, i)),
        1 => (0..n, 0..21u64).prop_map(|(f, i)| Op::Corrupt(f, i)),
        1 => (0..n, 0..(6u64 << 20)).prop_map(|(f, b)| Op::Access(f, b)),
        1 => (0..n).prop_map(Op::NoteCurrent),
        1 => Just(Op::Reopen),
        1 => Just(Op::Crash),
        1 => (0..1000u64).prop_map(Op::TornCrash),
    ]
}

/// The journal appends go to (the highest generation).
fn newest_journal(dir: &Path) -> PathBuf {
    std::fs::read_dir(dir.join("index"))
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let g: u64 = e
                .file_name()
                .to_str()?
                .strip_prefix("journal.")?
                .parse()
                .ok()?;
            Some((g, e.path()))
        })
        .max()
        .expect("a journal")
        .1
}

fn data_path(dir: &Path, f: &FileVersion) -> PathBuf {
    let hex = f.key.hex();
    dir.join("blocks")
        .join(&hex[..2])
        .join(format!("{hex}.data"))
}

struct Model {
    /// Blocks that must be served (put said stored; not corrupted since; not
    /// in a file the cache evicted).
    sure: HashSet<(usize, u64)>,
    /// Blocks corrupted on disk and not yet found out.
    corrupt: HashSet<(usize, u64)>,
}

fn open(dir: &Path) -> DiskCache {
    DiskCache::open(dir, Some(CAP), BS, Arc::new(Stats::default()))
        .expect("DiskCache::open")
        .0
}

/// What a run went through (to check that a fixed sequence reaches every
/// path).
#[derive(Debug, Default)]
struct Seen {
    evictions: u64,
    rejected: u64,
    corrupt_found: u64,
}

fn run(ops: Vec<Op>) -> Result<Seen, TestCaseError> {
    let mut seen = Seen::default();
    // On tmpfs when there is one: hundreds of cache directories are created
    // and removed, which costs seconds of journal waits on a busy disk.
    let shm = Path::new("/dev/shm");
    let tmp = if shm.is_dir() {
        tempfile::tempdir_in(shm).unwrap()
    } else {
        tempfile::tempdir().unwrap()
    };
    let dir = tmp.path().join("ds");
    let files = versions();
    let n_ops = ops.len();
    let mut cache = open(&dir);
    let mut model = Model {
        sure: HashSet::new(),
        corrupt: HashSet::new(),
    };
    for (step, op) in ops.into_iter().enumerate() {
        let ev_before = cache.usage().evictions;
        match op.clone() {
            Op::Put(f, i) => {
                let fv = &files[f];
                if i >= fv.block_count(BS) {
                    let len = 1 + i as usize % 100;
                    prop_assert!(
                        !cache.put(fv, i, &ChecksummedBytes::from_source(content(f, i, len))),
                        "step {step}: put of a block past the end was accepted"
                    );
                    continue;
                }
                let b = ChecksummedBytes::from_source(content(f, i, fv.block_len(i, BS)));
                let stored = cache.put(fv, i, &b);
                seen.rejected += u64::from(!stored);
                if stored && !model.corrupt.contains(&(f, i)) {
                    model.sure.insert((f, i));
                }
            }
            Op::Get(f, i) => {
                let fv = &files[f];
                let got = cache.get(fv, i);
                if let Some(b) = &got {
                    prop_assert!(i < fv.block_count(BS), "step {step}: block past the end");
                    let want = content(f, i, fv.block_len(i, BS));
                    prop_assert!(
                        b.data() == &want,
                        "step {step}: get({f}, {i}) returned bytes that were never put"
                    );
                    prop_assert!(
                        !model.corrupt.contains(&(f, i)),
                        "step {step}: corrupted block ({f}, {i}) was served"
                    );
                } else {
                    prop_assert!(
                        !model.sure.contains(&(f, i)),
                        "step {step}: block ({f}, {i}) was stored and not evicted, but get missed"
                    );
                }
                // A corrupt block is dropped once found.
                seen.corrupt_found += u64::from(model.corrupt.remove(&(f, i)));
            }
            Op::Corrupt(f, i) => {
                let fv = &files[f];
                let len = fv.block_len(i, BS).min(16);
                // Only blocks known stored; never twice (a second XOR would
                // restore the bytes).
                if len == 0 || !model.sure.contains(&(f, i)) {
                    continue;
                }
                let p = data_path(&dir, fv);
                let h = OpenOptions::new().read(true).write(true).open(&p);
                prop_assert!(
                    h.is_ok(),
                    "step {step}: data file of a stored block missing: {p:?}"
                );
                let h = h.unwrap();
                let mut buf = vec![0u8; len];
                h.read_exact_at(&mut buf, i * BS).unwrap();
                for x in &mut buf {
                    *x ^= 0xa5;
                }
                h.write_all_at(&buf, i * BS).unwrap();
                model.sure.remove(&(f, i));
                model.corrupt.insert((f, i));
            }
            Op::Access(f, bytes) => cache.record_access(&files[f], bytes),
            Op::NoteCurrent(f) => cache.note_current(&files[f]),
            Op::Reopen => {
                drop(cache);
                cache = open(&dir);
            }
            Op::Crash => {
                // Every record appended is in the journal: nothing is lost.
                cache.crash();
                cache = open(&dir);
                cache.sweep_orphans();
            }
            Op::TornCrash(cut) => {
                cache.crash();
                let j = newest_journal(&dir);
                let len = std::fs::metadata(&j).unwrap().len();
                OpenOptions::new()
                    .write(true)
                    .open(&j)
                    .unwrap()
                    .set_len(len * cut / 1000)
                    .unwrap();
                cache = open(&dir);
                cache.sweep_orphans();
                // What the cut took is gone: no block is sure any more, but
                // none may come back wrong (checked by every Get).
                model.sure.clear();
            }
        }
        // Evictions remove whole files and unlink them right away: the model
        // forgets exactly the files whose data file is gone, and only when
        // the cache reported an eviction.
        let evicted = matches!(op, Op::Reopen | Op::Crash | Op::TornCrash(_))
            || cache.usage().evictions > ev_before;
        seen.evictions += cache.usage().evictions.saturating_sub(ev_before);
        let gone: HashSet<usize> = model
            .sure
            .iter()
            .chain(model.corrupt.iter())
            .map(|(f, _)| *f)
            .filter(|f| !data_path(&dir, &files[*f]).exists())
            .collect();
        if !gone.is_empty() {
            prop_assert!(
                evicted,
                "step {step} ({op:?}): files {gone:?} vanished without an eviction"
            );
            model.sure.retain(|(f, _)| !gone.contains(f));
            model.corrupt.retain(|(f, _)| !gone.contains(f));
        }
        let u = cache.usage();
        prop_assert!(
            u.used_bytes <= u.capacity_bytes,
            "step {step}: used {} > capacity {}",
            u.used_bytes,
            u.capacity_bytes
        );
        // Walking the cache dir is the slow part: every few steps and at the end.
        if step % 8 == 7 || step + 1 == n_ops {
            let disk = common::disk_usage(&dir);
            prop_assert!(
                disk <= CAP,
                "step {step}: {disk} bytes on disk > capacity {CAP}"
            );
        }
    }
    Ok(seen)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 160, ..ProptestConfig::default() })]

    #[test]
    fn disk_cache_agrees_with_the_model(ops in proptest::collection::vec(op(), 1..80)) {
        run(ops)?;
    }
}

/// A fixed sequence that exercises every case at least once (put, reopen,
/// corrupt, get, eviction by a clock advance), so the property's paths are
/// known to be reachable.
#[test]
fn fixed_sequence_covers_every_branch() {
    use Op::*;
    let mut ops = vec![];
    for i in 0..20 {
        ops.push(Put(3, i));
    }
    for i in 0..12 {
        ops.push(Put(6, i));
    }
    ops.extend([Crash, Get(3, 0), Corrupt(3, 1), Reopen, Get(3, 1)]);
    ops.extend([Put(3, 1), Get(3, 1), Get(6, 4), Access(0, 5 << 20)]);
    for i in 0..4 {
        ops.push(Put(2, i));
    }
    ops.extend([
        Put(4, 0),
        Put(4, 1),
        NoteCurrent(0),
        Put(0, 0),
        Get(0, 0),
        Get(4, 1),
        TornCrash(500),
    ]);
    for i in 0..4 {
        ops.push(Get(2, i));
    }
    let seen = run(ops).unwrap();
    eprintln!("{seen:?}");
    assert!(seen.rejected > 0, "the cache never filled up: {seen:?}");
    assert!(seen.evictions > 0, "nothing was evicted: {seen:?}");
    assert_eq!(seen.corrupt_found, 1, "{seen:?}");
}

/// A remount reads the index, not the cache files' meta: with every meta
/// (`.meta` file, `user.locafs.meta` attribute) gone, what was cached is
/// still booked, and the blocks of larger files are served (verified
/// against the index's checksums). A one-block file's checksum is only in
/// its meta (the books keep none of it): such a block is booked but, its
/// meta gone, a miss when served, never wrong bytes. A crash loses nothing
/// that was cached. Before the index, start-up read each file's meta and
/// discarded every entry here.
#[test]
fn a_remount_reads_the_index_not_every_file() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ds");
    let files = versions();
    let put_all = |cache: &DiskCache| {
        for (f, fv) in files.iter().enumerate() {
            for i in 0..fv.block_count(BS).min(3) {
                let b = ChecksummedBytes::from_source(content(f, i, fv.block_len(i, BS)));
                assert!(cache.put(fv, i, &b), "({f}, {i})");
            }
        }
    };
    let check_all = |cache: &DiskCache, what: &str, meta_gone: bool| {
        for (f, fv) in files.iter().enumerate() {
            for i in 0..fv.block_count(BS).min(3) {
                assert!(
                    cache.is_block_cached(fv, i),
                    "{what}: ({f}, {i}) not booked"
                );
                let got = cache.get(fv, i);
                if meta_gone && fv.block_count(BS) == 1 {
                    assert!(got.is_none(), "{what}: ({f}, {i}) served without its meta");
                    continue;
                }
                let want = content(f, i, fv.block_len(i, BS));
                assert!(
                    got.as_ref().map(|b| b.data()) == Some(&want),
                    "{what}: ({f}, {i}) not served"
                );
            }
        }
    };
    let cache = open(&dir);
    put_all(&cache);
    drop(cache);
    for fv in &files {
        let data = data_path(&dir, fv);
        let _ = std::fs::remove_file(data.with_extension("meta"));
        if data.exists() {
            let _ = rustix::fs::removexattr(&data, "user.locafs.meta");
        }
    }
    let cache = open(&dir);
    check_all(&cache, "after a clean remount", true);
    drop(cache);
    // A crash: the journal alone has the blocks written since.
    std::fs::remove_dir_all(&dir).unwrap();
    let c = open(&dir);
    put_all(&c);
    c.crash();
    check_all(&open(&dir), "after a crash", false);
}
