//! The harness of the mount integration tests: generates source trees, runs
//! real `locafs mount` processes on real FUSE mounts, reads their stats, and
//! compares what the mount shows with the source.
//!
//! It must never leak a mount or a process: every mount is owned by a
//! [`Mount`] guard whose `Drop` unmounts (`umount`, then `umount -l`) and
//! kills and reaps the daemon, even when a test panics. A test that needs
//! what the machine lacks (root, /dev/fuse) prints `SKIPPED: reason` and
//! returns; it never passes silently.

#![allow(dead_code)]

use std::ffi::OsStr;
use std::fs::{self, File};
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The `locafs` binary under test.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_locafs")
}

/// Whether real FUSE mounts can be made here; if not, says so loudly.
pub fn fuse_available(module: &str) -> bool {
    let test = format!("{module}::{}", std::thread::current().name().unwrap_or("?"));
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let dev = Path::new("/dev/fuse").exists();
    if !root || !dev {
        eprintln!("SKIPPED: {test}: needs root and /dev/fuse (root: {root}, /dev/fuse: {dev})");
        return false;
    }
    true
}

/// Returns from the test (after a loud SKIPPED line) when FUSE mounts cannot
/// be made on this machine.
#[macro_export]
macro_rules! require_fuse {
    () => {
        if !$crate::common::fuse_available(module_path!()) {
            return;
        }
    };
}

/// The mount points listed in /proc/self/mountinfo with their fs type.
pub fn mounts() -> Vec<(PathBuf, String)> {
    let text = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let mp = f.get(4)?;
            let dash = f.iter().position(|x| *x == "-")?;
            let fstype = f.get(dash + 1)?;
            Some((
                PathBuf::from(OsStr::from_bytes(&locafs::sys::unescape_mount(mp))),
                fstype.to_string(),
            ))
        })
        .collect()
}

/// The "mount source" field of every mount (e.g. `locafs:/path/to/src`).
pub fn mounted_sources() -> Vec<String> {
    let text = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let dash = f.iter().position(|x| *x == "-")?;
            let src = f.get(dash + 2)?;
            Some(String::from_utf8_lossy(&locafs::sys::unescape_mount(src)).into_owned())
        })
        .collect()
}

/// Whether anything is mounted on `p` (exact path).
pub fn is_mounted(p: &Path) -> bool {
    mounts().iter().any(|(m, _)| m == p)
}

/// Whether a FUSE file system is mounted on `p`.
pub fn is_fuse_mounted(p: &Path) -> bool {
    mounts()
        .iter()
        .any(|(m, t)| m == p && t.starts_with("fuse"))
}

/// `umount`, then `umount -l` if that fails; true if nothing is mounted on
/// `p` afterwards.
pub fn force_unmount(p: &Path) -> bool {
    for _ in 0..20 {
        if !is_mounted(p) {
            return true;
        }
        let _ = Command::new("umount").arg(p).stderr(Stdio::null()).status();
        if !is_mounted(p) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = Command::new("umount").arg("-l").arg(p).status();
    !is_mounted(p)
}

/// A scratch directory with `src/`, `mnt/` and `cache/`.
pub struct Scratch {
    pub dir: tempfile::TempDir,
    pub src: PathBuf,
    pub mnt: PathBuf,
    pub cache: PathBuf,
}

impl Scratch {
    pub fn new() -> Scratch {
        let dir = tempfile::Builder::new()
            .prefix("locafs-test-")
            .tempdir()
            .expect("tempdir");
        let src = dir.path().join("src");
        let mnt = dir.path().join("mnt");
        let cache = dir.path().join("cache");
        for d in [&src, &mnt, &cache] {
            fs::create_dir(d).expect("mkdir");
        }
        Scratch {
            dir,
            src,
            mnt,
            cache,
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Starts a mount of `src` on `mnt` with the cache in `cache`.
    pub fn mount(&self, extra: &[&str]) -> Mount {
        Mount::start(&self.src, &self.mnt, &self.cache, extra)
    }

    /// The data set's directory inside the cache dir (the only one there).
    pub fn dataset_dir(&self) -> PathBuf {
        dataset_dir(&self.cache)
    }
}

impl Default for Scratch {
    fn default() -> Self {
        Self::new()
    }
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

/// Every `.data` (or `.meta`) file of a data set cache dir.
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

fn walk_files(dir: &Path, f: &mut dyn FnMut(&Path)) {
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

/// Disk space really used under `p` (files and directories, like `du -sB1`):
/// the sum of st_blocks * 512, each inode counted once.
pub fn disk_usage(p: &Path) -> u64 {
    let mut seen = std::collections::HashSet::new();
    fn go(p: &Path, seen: &mut std::collections::HashSet<(u64, u64)>) -> u64 {
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
    go(p, &mut seen)
}

/// A running `locafs mount` and its mountpoint. Dropping it unmounts and
/// reaps the process, whatever state they are in.
pub struct Mount {
    pub child: Option<Child>,
    pub mnt: PathBuf,
    pub src: PathBuf,
    pub cache: PathBuf,
    pub stderr_path: PathBuf,
}

/// What the child wrote to stderr so far.
fn read_lossy(p: &Path) -> String {
    let mut s = Vec::new();
    if let Ok(mut f) = File::open(p) {
        let _ = f.read_to_end(&mut s);
    }
    String::from_utf8_lossy(&s).into_owned()
}

static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl Mount {
    /// Starts `locafs mount SRC MNT --cache-dir CACHE EXTRA...` in the
    /// foreground as a child and waits (at most 20 s) until the mount shows
    /// in /proc/self/mountinfo; panics with the child's stderr if it dies.
    pub fn start(src: &Path, mnt: &Path, cache: &Path, extra: &[&str]) -> Mount {
        match Mount::try_start(src, mnt, cache, extra) {
            Ok(m) => m,
            Err(e) => panic!("{e}"),
        }
    }

    /// Like [`Mount::start`], returning the failure instead of panicking.
    pub fn try_start(
        src: &Path,
        mnt: &Path,
        cache: &Path,
        extra: &[&str],
    ) -> Result<Mount, String> {
        let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let stderr_path =
            std::env::temp_dir().join(format!("locafs-test-stderr-{}-{n}.log", std::process::id()));
        let errf = File::create(&stderr_path).map_err(|e| format!("stderr file: {e}"))?;
        let child = Command::new(bin())
            .arg("mount")
            .arg(src)
            .arg(mnt)
            .arg("--cache-dir")
            .arg(cache)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(errf)
            .spawn()
            .map_err(|e| format!("cannot start locafs: {e}"))?;
        let mut m = Mount {
            child: Some(child),
            mnt: mnt.to_owned(),
            src: src.to_owned(),
            cache: cache.to_owned(),
            stderr_path,
        };
        let t0 = Instant::now();
        loop {
            if is_fuse_mounted(mnt) {
                return Ok(m);
            }
            if let Some(st) = m.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                m.child = None;
                return Err(format!(
                    "locafs mount exited ({st}) before the mount appeared; stderr:\n{}",
                    m.stderr()
                ));
            }
            if t0.elapsed() > Duration::from_secs(20) {
                return Err(format!(
                    "mount did not appear within 20 s; stderr:\n{}",
                    m.stderr()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn stderr(&self) -> String {
        read_lossy(&self.stderr_path)
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// `locafs stats MNT --json` as JSON.
    pub fn stats(&self) -> Value {
        stats_of(&self.mnt)
    }

    /// One counter of the stats.
    pub fn stat(&self, key: &str) -> u64 {
        let v = self.stats();
        v[key]
            .as_u64()
            .unwrap_or_else(|| panic!("stats key {key} missing or not a number: {v}"))
    }

    /// Waits (at most `timeout`) for the daemon to exit, returning its status.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let t0 = Instant::now();
        while t0.elapsed() < timeout {
            if let Some(st) = self.child.as_mut()?.try_wait().ok().flatten() {
                self.child = None;
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// `umount MNT` and wait for the daemon to exit: its exit status.
    pub fn unmount(&mut self) -> ExitStatus {
        let t0 = Instant::now();
        loop {
            let out = Command::new("umount")
                .arg(&self.mnt)
                .output()
                .expect("umount");
            if out.status.success() {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "umount {:?} failed: {}",
                self.mnt,
                String::from_utf8_lossy(&out.stderr)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let st = self.wait_exit(Duration::from_secs(20)).unwrap_or_else(|| {
            panic!(
                "locafs did not exit after umount; stderr:\n{}",
                self.stderr()
            )
        });
        assert!(!is_mounted(&self.mnt));
        st
    }

    /// SIGKILL the daemon (the mount stays, dead: ENOTCONN), reap it, then
    /// `umount -l` the dead mount.
    pub fn kill9_and_detach(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        assert!(!is_mounted(&self.mnt), "dead mount still listed");
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if is_mounted(&self.mnt) {
            let _ = Command::new("umount")
                .arg(&self.mnt)
                .stderr(Stdio::null())
                .status();
            if let Some(c) = self.child.as_mut() {
                let t0 = Instant::now();
                while t0.elapsed() < Duration::from_secs(5) {
                    if c.try_wait().ok().flatten().is_some() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            if is_mounted(&self.mnt) {
                let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
            }
        }
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = fs::remove_file(&self.stderr_path);
    }
}

/// `locafs stats MNT --json` of any mount.
pub fn stats_of(mnt: &Path) -> Value {
    let out = Command::new(bin())
        .arg("stats")
        .arg(mnt)
        .arg("--json")
        .output()
        .expect("locafs stats");
    assert!(
        out.status.success(),
        "locafs stats failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("stats JSON")
}

/// Runs `locafs ARGS` to completion (at most 30 s).
pub fn run_locafs(args: &[&OsStr]) -> Output {
    let mut c = Command::new(bin())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn locafs");
    let t0 = Instant::now();
    while c.try_wait().ok().flatten().is_none() {
        if t0.elapsed() > Duration::from_secs(30) {
            let _ = c.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    c.wait_with_output().expect("wait locafs")
}

/// Drops the kernel's page cache (so that reads reach the daemon again).
pub fn drop_page_cache() {
    let _ = Command::new("sync").status();
    fs::write("/proc/sys/vm/drop_caches", "3").expect("drop_caches");
}

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

/// Writes a file of `len` pattern bytes.
pub fn write_file(p: &Path, seed: u64, len: usize) {
    if let Some(d) = p.parent() {
        fs::create_dir_all(d).expect("mkdir -p");
    }
    fs::write(p, pattern(seed, len)).expect("write file");
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

/// Compares the whole tree at `mnt` with `src`: the same names in every
/// directory, the same type, mode, uid, gid, size and mtime (ns) of every
/// entry, the same symlink targets and the same bytes in every file.
pub fn assert_same_tree(src: &Path, mnt: &Path) {
    let ms = fs::symlink_metadata(src).expect("lstat src");
    let mm = fs::symlink_metadata(mnt).expect("lstat mnt");
    assert_same_meta(src, &ms, mnt, &mm, true);
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
        assert_same_meta(&s, &ms, &m, &mm, false);
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

fn assert_same_meta(s: &Path, ms: &fs::Metadata, m: &Path, mm: &fs::Metadata, root: bool) {
    let _ = s;
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

/// A small tmpfs mounted on a directory, unmounted on drop.
pub struct Tmpfs {
    pub path: PathBuf,
}

impl Tmpfs {
    pub fn mount(path: &Path, size: &str) -> Tmpfs {
        fs::create_dir_all(path).expect("mkdir tmpfs dir");
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(path)
            .status()
            .expect("mount tmpfs");
        assert!(st.success(), "mount -t tmpfs failed");
        Tmpfs {
            path: path.to_owned(),
        }
    }

    pub fn remount_ro(&self) {
        let st = Command::new("mount")
            .args(["-o", "remount,ro"])
            .arg(&self.path)
            .status()
            .expect("remount");
        assert!(st.success(), "mount -o remount,ro failed");
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        force_unmount(&self.path);
    }
}

/// A small deterministic RNG for tests (splitmix64).
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

    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            v.swap(i, j);
        }
    }
}

/// A seed for this run, printed so a failure can be replayed
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

/// Maps a file read-only and returns a copy of its bytes.
pub fn mmap_read(p: &Path) -> Vec<u8> {
    use std::os::fd::AsRawFd;
    let f = File::open(p).unwrap();
    let len = f.metadata().unwrap().len() as usize;
    // SAFETY: a shared read-only mapping of a file we keep open; we only read
    // `len` bytes from it and unmap it before returning.
    unsafe {
        let ptr = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        );
        assert_ne!(
            ptr,
            libc::MAP_FAILED,
            "mmap {p:?}: {}",
            std::io::Error::last_os_error()
        );
        let v = std::slice::from_raw_parts(ptr as *const u8, len).to_vec();
        libc::munmap(ptr, len);
        v
    }
}
