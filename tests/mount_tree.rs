//! What a mount shows equals the source: a generated tree compared entry by
//! entry (names, types, modes, owners, mtimes, symlink targets, bytes), cold
//! and warm; a 100k-entry directory; a sparse file larger than 4 GiB; mmap;
//! and 16 concurrent readers over random ranges.

mod common;

use std::ffi::OsStr;
use std::fs::{self, File};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use common::*;

const MIB: usize = 1 << 20;

/// Builds the tree of item 1 under `src` (block size `bs`).
fn generate_tree(src: &Path, bs: usize) {
    let sizes = [
        0,
        1,
        4095,
        4096,
        4097,
        bs - 1,
        bs,
        bs + 1,
        2 * bs + 4095,
        5 * MIB + 123,
    ];
    for (i, &n) in sizes.iter().enumerate() {
        write_file(&src.join(format!("sizes/f{i}_{n}")), i as u64 + 1, n);
    }
    // Nested directories.
    let deep = src.join("a/b/c/d/e");
    fs::create_dir_all(&deep).unwrap();
    write_file(&deep.join("leaf.bin"), 77, 70_000);
    write_file(&src.join("a/b/mid.bin"), 78, 3);
    fs::create_dir(src.join("empty_dir")).unwrap();

    // Awkward names.
    let names: Vec<&[u8]> = vec![
        "unicode ü 日本語 ✓".as_bytes(),
        b"with space",
        b" leading and trailing ",
        b"new\nline",
        b"tab\there",
        b"non-utf8 \xff\xfe\x80",
        b"-dash",
        b"...dots",
    ];
    let odd = src.join("names");
    fs::create_dir(&odd).unwrap();
    for (i, n) in names.iter().enumerate() {
        write_file(&odd.join(OsStr::from_bytes(n)), 100 + i as u64, 1000 + i);
    }
    fs::create_dir(odd.join(OsStr::from_bytes(b"dir \xc3\x28 \n"))).unwrap();
    write_file(
        &odd.join(OsStr::from_bytes(b"dir \xc3\x28 \n"))
            .join("inner"),
        5,
        10,
    );

    // Symlinks: relative, absolute, dangling, to a directory.
    let l = src.join("links");
    fs::create_dir(&l).unwrap();
    std::os::unix::fs::symlink("../sizes/f2_4095", l.join("relative")).unwrap();
    std::os::unix::fs::symlink("/etc/hostname", l.join("absolute")).unwrap();
    std::os::unix::fs::symlink("no/such/target", l.join("dangling")).unwrap();
    std::os::unix::fs::symlink("../a", l.join("to_dir")).unwrap();
    std::os::unix::fs::symlink(OsStr::from_bytes(b"odd \xff target"), l.join("odd")).unwrap();

    // Modes and owners.
    let m = src.join("modes");
    fs::create_dir(&m).unwrap();
    for (name, mode) in [
        ("private", 0o600),
        ("exec", 0o755),
        ("readonly", 0o444),
        ("none", 0o000),
        ("sticky_like", 0o1644),
    ] {
        let p = m.join(name);
        write_file(&p, mode as u64, 321);
        fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
    }
    let sg = m.join("setgid_dir");
    fs::create_dir(&sg).unwrap();
    fs::set_permissions(&sg, fs::Permissions::from_mode(0o2775)).unwrap();
    write_file(&sg.join("in_setgid"), 9, 99);
    let own = m.join("owned");
    write_file(&own, 10, 4096);
    std::os::unix::fs::chown(&own, Some(1234), Some(5678)).unwrap();
    std::os::unix::fs::chown(&sg, Some(1234), Some(5678)).unwrap();
    std::os::unix::fs::lchown(l.join("relative"), Some(1234), Some(5678)).unwrap();

    // Mtimes with nanoseconds, set last on every regular file and directory
    // (deepest first so that parents keep theirs).
    let mut all = Vec::new();
    fn walk(p: &Path, out: &mut Vec<PathBuf>) {
        for e in fs::read_dir(p).unwrap().flatten() {
            let t = e.file_type().unwrap();
            if t.is_dir() {
                walk(&e.path(), out);
            }
            if !t.is_symlink() {
                out.push(e.path());
            }
        }
    }
    walk(src, &mut all);
    for (i, p) in all.iter().enumerate() {
        let t = SystemTime::UNIX_EPOCH
            + Duration::new(1_600_000_000 + i as u64 * 1000, 123_456_789 + i as u32);
        let f = File::open(p).unwrap();
        f.set_modified(t).unwrap();
    }
}

#[test]
fn tree_equals_source_cold_and_warm() {
    require_fuse!();
    let s = Scratch::new();
    generate_tree(&s.src, MIB);
    let m = s.mount(&[]);
    assert_same_tree(&s.src, &s.mnt);
    let cold = m.stats();
    assert!(cold["source_bytes"].as_u64().unwrap() > 0, "{cold}");
    // The cache is filled after the replies: give it a moment.
    std::thread::sleep(Duration::from_millis(500));
    drop_page_cache();
    assert_same_tree(&s.src, &s.mnt);
    let warm = m.stats();
    assert_eq!(
        warm["source_bytes"], cold["source_bytes"],
        "the warm pass read from the source again: {warm}"
    );
    assert!(warm["passthrough_opens"].as_u64().unwrap() > 0, "{warm}");
}

#[test]
fn tree_equals_source_without_passthrough_small_blocks() {
    require_fuse!();
    let s = Scratch::new();
    generate_tree(&s.src, 64 * 1024);
    let m = s.mount(&["--no-passthrough", "--block-size", "64KiB"]);
    assert_same_tree(&s.src, &s.mnt);
    std::thread::sleep(Duration::from_millis(500));
    drop_page_cache();
    assert_same_tree(&s.src, &s.mnt);
    let st = m.stats();
    assert_eq!(st["passthrough_opens"], 0, "{st}");
    assert!(
        st["cache_hit_bytes"].as_u64().unwrap() > 5 * MIB as u64,
        "{st}"
    );
}

#[test]
fn directory_of_100k_files() {
    require_fuse!();
    let s = Scratch::new();
    let d = s.src.join("big");
    fs::create_dir(&d).unwrap();
    const N: usize = 100_000;
    for i in 0..N {
        File::create(d.join(format!("{i:06}.jpg"))).unwrap();
    }
    // A few non-empty ones so that sizes are really compared.
    for i in (0..N).step_by(9973) {
        write_file(&d.join(format!("{i:06}.jpg")), i as u64, i % 5000 + 1);
    }
    let _m = s.mount(&[]);
    let md = s.mnt.join("big");
    for pass in 0..2 {
        let mut src_names: Vec<_> = fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        let mut mnt_names: Vec<_> = fs::read_dir(&md)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        src_names.sort();
        mnt_names.sort();
        assert_eq!(mnt_names.len(), N, "pass {pass}");
        assert!(src_names == mnt_names, "pass {pass}: listings differ");
        for n in &src_names {
            let a = fs::symlink_metadata(d.join(n)).unwrap();
            let b = fs::symlink_metadata(md.join(n)).unwrap();
            assert_eq!(a.size(), b.size(), "size of {n:?}");
            assert_eq!(a.mode(), b.mode(), "mode of {n:?}");
        }
    }
}

#[test]
fn sparse_file_over_4gib() {
    require_fuse!();
    let s = Scratch::new();
    let p = s.src.join("sparse.bin");
    const G: u64 = 1 << 30;
    let len = 5 * G + 12345;
    {
        let f = File::create(&p).unwrap();
        f.set_len(len).unwrap();
        for (off, seed) in [
            (0u64, 1u64),
            (4 * G - 70_000, 2),
            (4 * G + 3 * MIB as u64, 3),
            (len - 200_000, 4),
        ] {
            f.write_all_at(&pattern(seed, 150_000), off).unwrap();
        }
    }
    let m = s.mount(&["--no-passthrough"]);
    let mp = s.mnt.join("sparse.bin");
    assert_eq!(fs::metadata(&mp).unwrap().len(), len);
    let fs_ = File::open(&p).unwrap();
    let fm = File::open(&mp).unwrap();
    let offsets = [
        0,
        100_000,
        2 * G,
        4 * G - 100_000,
        4 * G - 4096,
        4 * G - 1,
        4 * G,
        4 * G + 1,
        4 * G + 3 * MIB as u64 - 10,
        len - 300_000,
        len - 4097,
        len - 1,
        len,
    ];
    for pass in 0..2 {
        for &off in &offsets {
            let mut a = vec![0u8; 200_000];
            let mut b = vec![0u8; 200_000];
            let na = read_full_at(&fs_, &mut a, off).unwrap();
            let nb =
                read_full_at(&fm, &mut b, off).unwrap_or_else(|e| panic!("pread at {off}: {e}"));
            assert_eq!(na, nb, "pass {pass}: length of the read at {off}");
            assert!(
                a[..na] == b[..nb],
                "pass {pass}: bytes at offset {off} differ"
            );
        }
        drop_page_cache();
    }
    // Only the blocks that were read were fetched, not 5 GiB.
    let st = m.stats();
    assert!(
        st["source_bytes"].as_u64().unwrap() < 64 * MIB as u64,
        "{st}"
    );
}

#[test]
fn mmap_equals_source_cold_and_warm() {
    require_fuse!();
    let s = Scratch::new();
    let sizes = [1usize, 4096, 100_000, 3 * MIB + 777];
    for (i, n) in sizes.iter().enumerate() {
        write_file(&s.src.join(format!("m{i}")), 500 + i as u64, *n);
    }
    let m = s.mount(&[]);
    for pass in 0..3 {
        for i in 0..sizes.len() {
            let want = fs::read(s.src.join(format!("m{i}"))).unwrap();
            let got = mmap_read(&s.mnt.join(format!("m{i}")));
            assert!(
                want == got,
                "pass {pass}: mmap of m{i} differs from the source"
            );
        }
        std::thread::sleep(Duration::from_millis(300));
        drop_page_cache();
    }
    let st = m.stats();
    assert!(
        st["passthrough_opens"].as_u64().unwrap() > 0,
        "warm mmaps should use passthrough: {st}"
    );
}

#[test]
fn sixteen_concurrent_readers_over_random_ranges() {
    require_fuse!();
    let seed = seed("sixteen_concurrent_readers_over_random_ranges");
    let s = Scratch::new();
    let sizes = [3 * MIB + 5, 7 * MIB, 64 * 1024 + 1, MIB, 5 * MIB - 3];
    let mut want = Vec::new();
    for (i, n) in sizes.iter().enumerate() {
        let p = s.src.join(format!("r{i}"));
        write_file(&p, 900 + i as u64, *n);
        want.push(fs::read(&p).unwrap());
    }
    let want = Arc::new(want);
    for (round, extra) in [&["--block-size", "256KiB"][..], &[][..]]
        .iter()
        .enumerate()
    {
        let _ = fs::remove_dir_all(&s.cache);
        fs::create_dir(&s.cache).unwrap();
        let m = s.mount(extra);
        for pass in 0..2 {
            let threads: Vec<_> = (0..16)
                .map(|t| {
                    let want = Arc::clone(&want);
                    let mnt = s.mnt.clone();
                    std::thread::spawn(move || {
                        let mut rng = Rng(seed ^ (t * 7919 + round as u64 * 31 + pass * 3));
                        let files: Vec<File> = (0..want.len())
                            .map(|i| File::open(mnt.join(format!("r{i}"))).unwrap())
                            .collect();
                        for _ in 0..150 {
                            let i = rng.below(want.len() as u64) as usize;
                            let w = &want[i];
                            let off = rng.below(w.len() as u64 + 10) as usize;
                            let len = 1 + rng.below(400_000) as usize;
                            let mut buf = vec![0u8; len];
                            let n = read_full_at(&files[i], &mut buf, off as u64)
                                .unwrap_or_else(|e| panic!("read r{i} at {off}: {e}"));
                            let end = (off + len).min(w.len());
                            let exp = if off < w.len() { &w[off..end] } else { &[][..] };
                            assert_eq!(n, exp.len(), "length of r{i} [{off}, +{len})");
                            assert!(buf[..n] == *exp, "bytes of r{i} [{off}, +{len}) differ");
                        }
                    })
                })
                .collect();
            for t in threads {
                t.join().expect("reader thread failed");
            }
            drop_page_cache();
        }
        let st = m.stats();
        assert_eq!(st["read_errors"], 0, "{st}");
        drop(m);
    }
}
