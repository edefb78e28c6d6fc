//! Thin safe wrappers over the few libc calls std does not offer (statvfs,
//! xattrs, punching holes, unmounting). Each returns `io::Result`; none of
//! them may panic.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

fn cpath(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

fn cname(name: &str) -> io::Result<CString> {
    CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

pub fn statvfs(p: &Path) -> io::Result<libc::statvfs> {
    let c = cpath(p)?;
    // SAFETY: `st` is a plain C struct that statvfs fills; `c` is NUL-terminated.
    unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        if libc::statvfs(c.as_ptr(), &mut st) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(st)
    }
}

/// Bytes available to unprivileged users on the file system holding `p`.
pub fn available_bytes(p: &Path) -> io::Result<u64> {
    let st = statvfs(p)?;
    Ok(st.f_bavail as u64 * st.f_frsize as u64)
}

/// `getxattr(2)` into a growing buffer.
pub fn getxattr(p: &Path, name: &str) -> io::Result<Vec<u8>> {
    let c = cpath(p)?;
    let n = cname(name)?;
    let mut buf = vec![0u8; 64 * 1024];
    // SAFETY: buf is valid for buf.len() bytes; both strings are NUL-terminated.
    let r = unsafe {
        libc::getxattr(
            c.as_ptr(),
            n.as_ptr(),
            buf.as_mut_ptr() as *mut libc::c_void,
            buf.len(),
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(r as usize);
    Ok(buf)
}

/// `fsetxattr(2)`: sets (creates or replaces) one extended attribute.
pub fn fsetxattr(f: &std::fs::File, name: &str, value: &[u8]) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let name = cname(name)?;
    // SAFETY: value is valid for value.len() bytes; name is NUL-terminated.
    let r = unsafe {
        libc::fsetxattr(
            f.as_raw_fd(),
            name.as_ptr(),
            value.as_ptr() as *const libc::c_void,
            value.len(),
            0,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `fremovexattr(2)`.
pub fn fremovexattr(f: &std::fs::File, name: &str) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let name = cname(name)?;
    // SAFETY: plain syscall on an owned, open descriptor; name is NUL-terminated.
    let r = unsafe { libc::fremovexattr(f.as_raw_fd(), name.as_ptr()) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Frees the disk blocks of a byte range of a file, keeping its size.
pub fn punch_hole(f: &std::fs::File, offset: u64, len: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: plain syscall on an owned, open descriptor.
    let r = unsafe {
        libc::fallocate(
            f.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset as libc::off_t,
            len as libc::off_t,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Size, mtime (ns) and inode of an open file, as `statx(2)` with
/// `AT_STATX_FORCE_SYNC` gives them: a network file system (NFS, FUSE) asks
/// its server instead of answering from its attribute cache. Fails with
/// ENOSYS where the kernel (or a seccomp filter) lacks statx.
pub fn fstat_fresh(f: &std::fs::File) -> io::Result<(u64, i64, u64)> {
    use std::os::fd::AsRawFd;
    // SAFETY: `st` is a plain C struct that statx fills; the path is an
    // empty NUL-terminated string, used with AT_EMPTY_PATH on an open
    // descriptor.
    unsafe {
        let mut st: libc::statx = std::mem::zeroed();
        let r = libc::statx(
            f.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_STATX_FORCE_SYNC,
            libc::STATX_SIZE | libc::STATX_MTIME | libc::STATX_INO,
            &mut st,
        );
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        // As `SourceAttr::from_metadata` computes it, without a panic on
        // an absurd time.
        let mtime_ns = st
            .stx_mtime
            .tv_sec
            .wrapping_mul(1_000_000_000)
            .wrapping_add(st.stx_mtime.tv_nsec as i64);
        Ok((st.stx_size, mtime_ns, st.stx_ino))
    }
}

/// Detaches a mount even if it is busy (`umount -l`).
pub fn lazy_unmount(p: &Path) -> io::Result<()> {
    let c = cpath(p)?;
    // SAFETY: plain syscall with a NUL-terminated path.
    if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// True if `p` is the root of a mount (its device differs from its parent's,
/// or it is listed in /proc/self/mountinfo).
pub fn is_mountpoint(p: &Path) -> bool {
    if let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") {
        let target = p.as_os_str().as_bytes();
        for line in info.lines() {
            if let Some(mp) = line.split(' ').nth(4) {
                if unescape_mount(mp).as_slice() == target {
                    return true;
                }
            }
        }
    }
    false
}

/// The /proc/self/mountinfo line of the mount whose root is `p` (the last
/// one if several are stacked).
fn mountinfo_line(p: &Path) -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let target = p.as_os_str().as_bytes();
    info.lines()
        .rev()
        .find(|line| line.split(' ').nth(4).map(unescape_mount).as_deref() == Some(target))
        .map(str::to_owned)
}

/// The file system type of the mount whose root is `p` (the last one if
/// several are stacked), e.g. "fuse.locafs".
pub fn mount_fstype(p: &Path) -> Option<String> {
    let line = mountinfo_line(p)?;
    // After the optional fields, "-" then the type.
    line.split(' ')
        .skip_while(|f| *f != "-")
        .nth(1)
        .map(str::to_owned)
}

/// Decodes the octal escapes (`\040` for a space, ...) of /proc/self/mountinfo.
pub fn unescape_mount(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() {
            let oct = &s[i + 1..i + 4];
            if let Ok(v) = u8::from_str_radix(oct, 8) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    out
}

/// Whether this process may use FUSE passthrough (it needs CAP_SYS_ADMIN).
pub fn has_cap_sys_admin() -> bool {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return false;
    };
    for line in status.lines() {
        if let Some(hex) = line.strip_prefix("CapEff:") {
            if let Ok(v) = u64::from_str_radix(hex.trim(), 16) {
                return v & (1 << 21) != 0;
            }
        }
    }
    false
}

/// Unmounts `p` (not lazily: fails with EBUSY while files are open).
pub fn unmount(p: &Path) -> io::Result<()> {
    let c = cpath(p)?;
    // SAFETY: plain syscall with a NUL-terminated path.
    if unsafe { libc::umount2(c.as_ptr(), 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Tells systemd (Type=notify) something, if it is listening.
pub fn sd_notify(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let path = PathBuf::from(path);
    let Ok(sock) = std::os::unix::net::UnixDatagram::unbound() else {
        return;
    };
    let _ = if path.as_os_str().as_bytes().starts_with(b"@") {
        use std::os::linux::net::SocketAddrExt;
        match std::os::unix::net::SocketAddr::from_abstract_name(&path.as_os_str().as_bytes()[1..])
        {
            Ok(addr) => sock.send_to_addr(state.as_bytes(), &addr),
            Err(e) => Err(e),
        }
    } else {
        sock.send_to(state.as_bytes(), &path)
    };
}

/// Raises the open-file limit to its hard maximum (the cache keeps a bounded
/// number of files open, but a loader may hold many handles).
pub fn raise_nofile_limit() {
    // SAFETY: getrlimit/setrlimit on a stack struct.
    unsafe {
        let mut r: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 && r.rlim_cur < r.rlim_max {
            r.rlim_cur = r.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
}

/// The sysfs file holding the kernel read-ahead (in KiB) of the file system
/// mounted at `mountpoint`: `/sys/class/bdi/MAJOR:MINOR/read_ahead_kb`,
/// the device taken from /proc/self/mountinfo. (Not from a `stat` of the
/// mountpoint: that would go through the mount itself, and leave the
/// kernel holding the root's attributes, so a dead mount would still
/// answer `stat` until they expire.)
pub fn bdi_readahead_file(mountpoint: &Path) -> io::Result<PathBuf> {
    let line = mountinfo_line(mountpoint).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("{} is not a mountpoint", mountpoint.display()),
        )
    })?;
    let dev = line.split(' ').nth(2).unwrap_or_default();
    Ok(PathBuf::from(format!("/sys/class/bdi/{dev}/read_ahead_kb")))
}

/// Sets the kernel read-ahead of the file system mounted at `mountpoint` to
/// `bytes` (rounded down to KiB). Needs root.
pub fn set_bdi_readahead(mountpoint: &Path, bytes: u64) -> io::Result<()> {
    std::fs::write(
        bdi_readahead_file(mountpoint)?,
        format!("{}\n", bytes / 1024),
    )
}

/// Reads exactly `len` bytes at `offset` of `f` into a new vector, without
/// zeroing it first (that would be one more pass over memory per byte
/// read). An end of file before `len` bytes is `UnexpectedEof`.
pub fn read_vec_at(f: &std::fs::File, len: usize, offset: u64) -> io::Result<Vec<u8>> {
    use std::os::unix::io::AsRawFd;
    let mut buf: Vec<u8> = Vec::with_capacity(len);
    while buf.len() < len {
        let done = buf.len();
        let off = libc::off_t::try_from(offset + done as u64)
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        let spare = &mut buf.spare_capacity_mut()[..len - done];
        // SAFETY: the kernel writes at most spare.len() bytes into spare, a
        // valid writable region of the vector's capacity.
        let n = unsafe { libc::pread(f.as_raw_fd(), spare.as_mut_ptr().cast(), spare.len(), off) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        // SAFETY: pread initialized the first n <= spare.len() bytes past
        // the vector's length.
        unsafe { buf.set_len(done + n as usize) };
    }
    Ok(buf)
}

/// cachestat(2) (Linux 6.5), the same number on every architecture; not in
/// the libc crate for x86_64 yet.
const SYS_CACHESTAT: libc::c_long = 451;

/// Whether every page of `len` bytes at `offset` of `f` is in the page
/// cache (cachestat(2): no I/O, no side effects). False where the kernel
/// lacks the call.
pub fn is_cached(f: &std::fs::File, offset: u64, len: usize) -> bool {
    use std::os::unix::io::AsRawFd;
    #[repr(C)]
    struct Range {
        off: u64,
        len: u64,
    }
    #[repr(C)]
    #[derive(Default)]
    struct Stat {
        nr_cache: u64,
        nr_dirty: u64,
        nr_writeback: u64,
        nr_evicted: u64,
        nr_recently_evicted: u64,
    }
    if len == 0 {
        return false;
    }
    let range = Range {
        off: offset,
        len: len as u64,
    };
    let mut st = Stat::default();
    // SAFETY: cachestat reads `range` and writes `st`, both live repr(C)
    // structs of the kernel's layout.
    let r = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            f.as_raw_fd(),
            &range as *const Range,
            &mut st as *mut Stat,
            0u32,
        )
    };
    r == 0 && st.nr_cache >= (len as u64).div_ceil(4096)
}

/// Turns O_DIRECT on or off for an open descriptor.
pub fn set_direct(f: &std::fs::File, on: bool) -> io::Result<()> {
    use std::os::unix::io::AsRawFd;
    let fd = f.as_raw_fd();
    // SAFETY: F_GETFL/F_SETFL on an open descriptor, changing only O_DIRECT.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags < 0 {
            return Err(io::Error::last_os_error());
        }
        let want = if on {
            flags | libc::O_DIRECT
        } else {
            flags & !libc::O_DIRECT
        };
        if libc::fcntl(fd, libc::F_SETFL, want) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Alignment of direct reads: offsets, lengths and buffer addresses.
pub const DIRECT_READ_ALIGN: usize = 4096;

/// `len` bytes at `offset` of a file opened with O_DIRECT, read into an
/// aligned buffer: the bytes go from the device to this buffer without a copy
/// in the page cache. `offset` must be a multiple of [`DIRECT_READ_ALIGN`];
/// the read is rounded up to it and cut back. Ok(None) if it cannot be read
/// directly (an unaligned offset, or a short read before the end of the
/// file, after which the next read would be unaligned): read it buffered.
/// EINVAL if the file system wants another alignment.
pub fn read_direct_at(
    f: &std::fs::File,
    len: usize,
    offset: u64,
) -> io::Result<Option<bytes::Bytes>> {
    use std::os::unix::io::AsRawFd;
    const A: usize = DIRECT_READ_ALIGN;
    if offset % A as u64 != 0 {
        return Ok(None);
    }
    let padded = len.div_ceil(A) * A;
    let mut buf: Vec<u8> = Vec::with_capacity(padded + A);
    let start = buf.as_ptr().align_offset(A);
    // SAFETY: start < A <= the capacity: the prefix is zeroed, so the bytes
    // up to the aligned start are initialized.
    unsafe {
        std::ptr::write_bytes(buf.as_mut_ptr(), 0, start);
        buf.set_len(start);
    }
    let mut done = 0usize;
    while done < len {
        if done % A != 0 {
            // A short read: the end of the file, or else the next direct
            // read would be unaligned.
            if offset + done as u64 >= f.metadata()?.len() {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            return Ok(None);
        }
        let off = libc::off_t::try_from(offset + done as u64)
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        let spare = &mut buf.spare_capacity_mut()[..padded - done];
        // SAFETY: the kernel writes at most spare.len() bytes into spare, a
        // valid writable region of the vector's capacity, aligned to A (the
        // vector's length is start + done, both multiples of A from the
        // aligned start).
        let n = unsafe { libc::pread(f.as_raw_fd(), spare.as_mut_ptr().cast(), spare.len(), off) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        done += n as usize;
        // SAFETY: pread initialized n bytes past the vector's length.
        unsafe { buf.set_len(start + done) };
    }
    Ok(Some(bytes::Bytes::from(buf).slice(start..start + len)))
}

/// Sets glibc's allocator for a daemon whose big allocations are block
/// buffers of at most `block_size` bytes, churned at the source's rate.
///
/// The mmap threshold sits just above the block size, so block buffers come
/// from the heap and are reused when freed: served from their own mmap, each
/// 1 MiB buffer cost 256 page faults, zeroing by the kernel and a TLB
/// shootdown at munmap (measured: a fifth of the daemon's CPU on a cold pass
/// of small files). Fixing the threshold also stops glibc from raising it on
/// its own. The trim threshold lets each heap keep up to 16 MiB free at its
/// top instead of giving it back and faulting it in again; with at most 4
/// arenas, the resident size stays within the budgets the reader enforces
/// plus that slack (`cargo bench --bench readahead`, figure 4).
pub fn tune_allocator(block_size: u64) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator parameters.
    unsafe {
        // glibc caps the threshold at 32 MiB (HEAP_MAX / 2 on 64-bit).
        let threshold = (block_size + (64 << 10)).min(32 << 20) as libc::c_int;
        libc::mallopt(libc::M_MMAP_THRESHOLD, threshold);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 16 << 20);
        libc::mallopt(libc::M_ARENA_MAX, 4);
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = block_size;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_vec_at_reads_exactly_and_reports_a_short_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&p, &data).unwrap();
        let f = std::fs::File::open(&p).unwrap();
        assert_eq!(read_vec_at(&f, 4000, 5000).unwrap(), &data[5000..9000]);
        assert_eq!(read_vec_at(&f, 0, 0).unwrap(), Vec::<u8>::new());
        let e = read_vec_at(&f, 2000, 9000).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn read_direct_at_reads_exactly_and_refuses_what_it_cannot_align() {
        use std::os::unix::fs::OpenOptionsExt;
        // /var/tmp: a disk file system (tmpfs may refuse O_DIRECT).
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let p = dir.path().join("f");
        let data: Vec<u8> = (0..3 * 4096 + 1000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&p, &data).unwrap();
        let f = match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(&p)
        {
            Ok(f) => f,
            Err(e) => {
                eprintln!("SKIPPED: /var/tmp refuses O_DIRECT ({e})");
                return;
            }
        };
        // Whole, from an aligned offset to the unaligned end, and a part.
        let read = |len, off| read_direct_at(&f, len, off).map(|b| b.expect("read directly"));
        assert!(read(data.len(), 0).unwrap() == data[..]);
        assert!(read(data.len() - 8192, 8192).unwrap() == data[8192..]);
        assert!(read(100, 4096).unwrap() == data[4096..4196]);
        assert!(read(0, 0).unwrap().is_empty());
        // Past the end: the file is shorter than asked.
        let e = read_direct_at(&f, 8192, 8192).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        // An unaligned offset is left to a buffered read.
        assert!(read_direct_at(&f, 10, 100).unwrap().is_none());
    }

    #[test]
    fn is_cached_tells_a_range_in_the_page_cache_from_one_that_is_not() {
        use std::io::Write;
        use std::os::unix::io::AsRawFd;
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let p = dir.path().join("f");
        let mut f = std::fs::File::create(&p).unwrap();
        f.write_all(&vec![7u8; 64 << 10]).unwrap();
        f.sync_all().unwrap();
        let f = std::fs::File::open(&p).unwrap();
        // Just written: in the page cache.
        if !is_cached(&f, 0, 64 << 10) {
            eprintln!("SKIPPED: cachestat(2) not available here");
            return;
        }
        // Dropped from the page cache (clean, so DONTNEED evicts it).
        // SAFETY: posix_fadvise on an open descriptor.
        let r = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        assert_eq!(r, 0);
        assert!(!is_cached(&f, 0, 64 << 10));
        // Read back: cached again.
        let _ = std::fs::read(&p).unwrap();
        assert!(is_cached(&f, 4096, 8192));
        assert!(!is_cached(&f, 0, 0));
    }
}
