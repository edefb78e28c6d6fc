//! Data for tests and benches: deterministic bytes and trees, a small RNG,
//! comparing what a mount shows with its source byte for byte, and the
//! cache's own files on disk.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::fs::{self, File};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

/// Deterministic pseudo-random bytes (xorshift64*), fast enough for MiBs.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        out.extend_from_slice(&s.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Writes a file of `len` pattern bytes (making its directories).
pub fn write_file(p: &Path, seed: u64, len: usize) {
    if let Some(d) = p.parent() {
        fs::create_dir_all(d).expect("mkdir -p");
    }
    fs::write(p, pattern(seed, len)).expect("write file");
}

/// Writes a file only its owner may read (mode 0600): a cluster secret or a
/// private key, which locafs refuses when the group or others may read
/// them.
pub fn write_private(p: &Path, content: impl AsRef<[u8]>) {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let _ = fs::remove_file(p);
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(p)
        .and_then(|mut f| f.write_all(content.as_ref()))
        .expect("write a private file");
}

/// A small deterministic RNG (splitmix64).
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    pub fn fill(&mut self, buf: &mut [u8]) {
        for c in buf.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
    }

    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            v.swap(i, j);
        }
    }
}

/// A seed for this run, printed so that a failure can be replayed
/// (LOCAFS_TEST_SEED=N).
pub fn seed(test: &str) -> u64 {
    let s = std::env::var("LOCAFS_TEST_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        });
    eprintln!("{test}: seed {s} (set LOCAFS_TEST_SEED={s} to replay)");
    s
}

/// The names in a directory, sorted.
pub fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read_dir {dir:?}: {e}"))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Every regular file under `root` (relative paths, sorted).
pub fn list_files(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    fn go(root: &Path, rel: &Path, out: &mut Vec<PathBuf>) {
        let mut ents: Vec<_> = fs::read_dir(root.join(rel))
            .expect("read_dir")
            .flatten()
            .collect();
        ents.sort_by_key(|e| e.file_name());
        for e in ents {
            let r = rel.join(e.file_name());
            let t = e.file_type().expect("file_type");
            if t.is_dir() {
                go(root, &r, out);
            } else if t.is_file() {
                out.push(r);
            }
        }
    }
    go(root, Path::new(""), &mut out);
    out
}

/// Calls `f` with every non-directory under `dir` (unsorted; unreadable
/// directories are skipped).
pub fn walk_files(dir: &Path, f: &mut dyn FnMut(&Path)) {
    let Ok(rd) = fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let p = e.path();
        match e.file_type() {
            Ok(t) if t.is_dir() => walk_files(&p, f),
            Ok(_) => f(&p),
            Err(_) => {}
        }
    }
}

/// Reads until `buf` is full or end of file.
pub fn read_full_at(f: &File, buf: &mut [u8], off: u64) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read_at(&mut buf[n..], off + n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Compares two files byte for byte in 1 MiB chunks.
pub fn assert_same_content(a: &Path, b: &Path) {
    let fa = File::open(a).unwrap_or_else(|e| panic!("open {a:?}: {e}"));
    let fb = File::open(b).unwrap_or_else(|e| panic!("open {b:?}: {e}"));
    let mut off = 0u64;
    let mut ba = vec![0u8; 1 << 20];
    let mut bb = vec![0u8; 1 << 20];
    loop {
        let na = read_full_at(&fa, &mut ba, off).unwrap_or_else(|e| panic!("read {a:?}: {e}"));
        let nb = read_full_at(&fb, &mut bb, off).unwrap_or_else(|e| panic!("read {b:?}: {e}"));
        assert_eq!(na, nb, "{b:?}: length differs from {a:?} at offset {off}");
        if ba[..na] != bb[..nb] {
            let i = (0..na).find(|&i| ba[i] != bb[i]).unwrap();
            panic!("{b:?}: byte {} differs from {a:?}", off + i as u64);
        }
        if na < ba.len() {
            return;
        }
        off += na as u64;
    }
}

/// Compares the whole tree at `mnt` with `src`: the same names in every
/// directory, the same type, mode, uid, gid, size and mtime (ns) of every
/// entry, the same symlink targets and the same bytes in every file.
pub fn assert_same_tree(src: &Path, mnt: &Path) {
    let ms = fs::symlink_metadata(src).expect("lstat src");
    let mm = fs::symlink_metadata(mnt).expect("lstat mnt");
    assert_same_meta(&ms, mnt, &mm, true);
    compare_dir(src, mnt);
}

fn compare_dir(src: &Path, mnt: &Path) {
    let names = |d: &Path| {
        let mut v: Vec<_> = fs::read_dir(d)
            .unwrap_or_else(|e| panic!("read_dir {d:?}: {e}"))
            .map(|e| e.expect("dirent").file_name())
            .collect();
        v.sort();
        v
    };
    let ns = names(src);
    let nm = names(mnt);
    assert_eq!(ns, nm, "listing of {mnt:?} differs from {src:?}");
    for n in ns {
        let (s, m) = (src.join(&n), mnt.join(&n));
        let ms = fs::symlink_metadata(&s).expect("lstat src");
        let mm = fs::symlink_metadata(&m).unwrap_or_else(|e| panic!("lstat {m:?}: {e}"));
        assert_same_meta(&ms, &m, &mm, false);
        let t = ms.file_type();
        if t.is_dir() {
            compare_dir(&s, &m);
        } else if t.is_symlink() {
            assert_eq!(
                fs::read_link(&s).unwrap(),
                fs::read_link(&m).unwrap_or_else(|e| panic!("readlink {m:?}: {e}")),
                "symlink target of {m:?}"
            );
        } else if t.is_file() {
            assert_same_content(&s, &m);
        }
    }
}

fn assert_same_meta(ms: &fs::Metadata, m: &Path, mm: &fs::Metadata, root: bool) {
    assert_eq!(ms.file_type(), mm.file_type(), "file type of {m:?}");
    assert_eq!(
        ms.mode(),
        mm.mode(),
        "mode of {m:?}: {:o} vs {:o}",
        ms.mode(),
        mm.mode()
    );
    assert_eq!((ms.uid(), ms.gid()), (mm.uid(), mm.gid()), "owner of {m:?}");
    if !ms.is_dir() {
        assert_eq!(ms.size(), mm.size(), "size of {m:?}");
    }
    if !root {
        assert_eq!(
            (ms.mtime(), ms.mtime_nsec()),
            (mm.mtime(), mm.mtime_nsec()),
            "mtime of {m:?}"
        );
    }
}

/// Calls `f` with a shared read-only mapping of the file at `p` (address
/// and length), unmapped afterwards; `f` is not called for an empty file.
fn with_mapping<T>(p: &Path, f: impl FnOnce(*mut libc::c_void, usize) -> T) -> Option<T> {
    use std::os::fd::AsRawFd;
    let file = File::open(p).unwrap_or_else(|e| panic!("open {p:?}: {e}"));
    let len = file.metadata().unwrap().len() as usize;
    if len == 0 {
        return None;
    }
    // SAFETY: a new shared read-only mapping of a file we keep open for as
    // long as it exists; unmapped below, after `f`, which only reads it.
    unsafe {
        let ptr = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        );
        assert_ne!(
            ptr,
            libc::MAP_FAILED,
            "mmap {p:?}: {}",
            io::Error::last_os_error()
        );
        let out = f(ptr, len);
        libc::munmap(ptr, len);
        Some(out)
    }
}

/// Maps a file read-only and returns a copy of its bytes.
pub fn mmap_read(p: &Path) -> Vec<u8> {
    with_mapping(p, |ptr, len| {
        // SAFETY: `len` readable bytes at `ptr`, mapped for this call.
        unsafe { std::slice::from_raw_parts(ptr as *const u8, len) }.to_vec()
    })
    .unwrap_or_default()
}

/// Bytes of the file at `p` in the page cache (mincore over a mapping).
pub fn resident_bytes(p: &Path) -> u64 {
    const PAGE: usize = 4096;
    with_mapping(p, |ptr, len| {
        let mut vec = vec![0u8; len.div_ceil(PAGE)];
        // SAFETY: mincore writes one byte per page of the mapping into a
        // vector of that many bytes.
        let r = unsafe { libc::mincore(ptr, len, vec.as_mut_ptr()) };
        assert_eq!(r, 0, "mincore {p:?}: {}", io::Error::last_os_error());
        vec.iter().filter(|b| **b & 1 == 1).count() as u64 * PAGE as u64
    })
    .unwrap_or(0)
}

/// Disk space really used under `p` (files and directories, like `du -sB1`):
/// the sum of st_blocks * 512, each inode counted once.
pub fn disk_usage(p: &Path) -> u64 {
    fn go(p: &Path, seen: &mut HashSet<(u64, u64)>) -> u64 {
        let Ok(m) = fs::symlink_metadata(p) else {
            return 0;
        };
        let mut n = 0;
        if seen.insert((m.dev(), m.ino())) {
            n += m.blocks() * 512;
        }
        if m.is_dir() {
            if let Ok(rd) = fs::read_dir(p) {
                for e in rd.flatten() {
                    n += go(&e.path(), seen);
                }
            }
        }
        n
    }
    go(p, &mut HashSet::new())
}

/// The single data set directory under a cache dir.
pub fn dataset_dir(cache: &Path) -> PathBuf {
    let mut ds: Vec<PathBuf> = fs::read_dir(cache)
        .expect("read cache dir")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    assert_eq!(
        ds.len(),
        1,
        "expected one data set dir in {cache:?}: {ds:?}"
    );
    ds.pop().unwrap()
}

/// Every `.data` (or `.meta`) file under a cache dir, sorted.
pub fn cache_files(cache: &Path, ext: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    walk_files(cache, &mut |p| {
        if p.extension() == Some(OsStr::new(ext)) {
            out.push(p.to_owned());
        }
    });
    out.sort();
    out
}

/// The cached data file, under a data set dir, of the version of `rel`
/// that is at the source `src` now.
pub fn cached_data_file(dataset_dir: &Path, src: &Path, rel: &Path) -> PathBuf {
    let m = fs::metadata(src.join(rel)).unwrap_or_else(|e| panic!("stat {rel:?}: {e}"));
    let v = locafs::source::SourceAttr::from_metadata(&m).version();
    let key = locafs::cache::VersionKey::new(rel, &v).hex();
    dataset_dir
        .join("blocks")
        .join(&key[..2])
        .join(format!("{key}.data"))
}

/// The source path (relative) recorded in a `.meta` file's header: the meta
/// header ends with the path, so the longest suffix of the header that names
/// an existing file under `src` is it. Returns None if not found.
pub fn meta_source_path(meta: &Path, src: &Path, candidates: &[PathBuf]) -> Option<PathBuf> {
    let head = fs::read(meta).ok()?;
    let head = &head[..head.len().min(60 + 4096)];
    candidates
        .iter()
        .filter(|rel| {
            let b = rel.as_os_str().as_bytes();
            head.windows(b.len()).any(|w| w == b)
        })
        .max_by_key(|rel| rel.as_os_str().len())
        .map(|rel| src.join(rel))
}
