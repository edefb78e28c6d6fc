//! The ground floor, which knows nothing of the subsystems above it:
//! system calls std lacks (this file), directories only their owner may
//! touch (`private_dir`), the memfd of state that outlives a serving
//! process (`shm`), and sizes and durations as users write them (`units`).
//! It never imports another subsystem (`tests/module_graph.rs` checks).
//!
//! Thin safe wrappers over the few system calls std does not offer
//! (statvfs, xattrs, punching holes, unmounting, direct reads, ...), made
//! through `rustix`; `libc` only for what rustix lacks (`cachestat(2)`,
//! glibc's `mallopt`). One is a program: a user without CAP_SYS_ADMIN
//! unmounts through the setuid `fusermount3 -u`. Each returns `io::Result`; none of them may panic.
//! A path or name with a NUL byte is `InvalidInput` (rustix's EINVAL).

pub mod private_dir;
pub mod shm;
pub mod units;

use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::io::Errno;

/// `statvfs(3)`: rustix computes it from `statfs(2)` as glibc does.
pub fn statvfs(p: &Path) -> io::Result<libc::statvfs> {
    /// Set by the kernel in `f_flags` to say the other flags are valid;
    /// glibc clears it, and so do we.
    const ST_VALID: u64 = 0x0020;
    let v = rustix::fs::statvfs(p)?;
    let mut st = libc::statvfs::default();
    st.f_bsize = v.f_bsize as libc::c_ulong;
    st.f_frsize = v.f_frsize as libc::c_ulong;
    st.f_blocks = v.f_blocks as libc::fsblkcnt_t;
    st.f_bfree = v.f_bfree as libc::fsblkcnt_t;
    st.f_bavail = v.f_bavail as libc::fsblkcnt_t;
    st.f_files = v.f_files as libc::fsfilcnt_t;
    st.f_ffree = v.f_ffree as libc::fsfilcnt_t;
    st.f_favail = v.f_favail as libc::fsfilcnt_t;
    st.f_fsid = v.f_fsid as libc::c_ulong;
    st.f_flag = (v.f_flag.bits() & !ST_VALID) as libc::c_ulong;
    st.f_namemax = v.f_namemax as libc::c_ulong;
    Ok(st)
}

/// Bytes available to unprivileged users on the file system holding `p`.
pub fn available_bytes(p: &Path) -> io::Result<u64> {
    let st = statvfs(p)?;
    Ok(st.f_bavail as u64 * st.f_frsize as u64)
}

/// `getxattr(2)` into a growing buffer.
pub fn getxattr(p: &Path, name: &str) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; 64 * 1024];
    let n = rustix::fs::getxattr(p, name, &mut buf[..])?;
    buf.truncate(n);
    Ok(buf)
}

/// `lgetxattr(2)` of `name` (no symlink followed): None where the entry
/// has no such attribute (ENODATA) or its file system keeps none of that
/// kind (EOPNOTSUPP: an NFSv4 mount has no `system.posix_acl_*`). Values
/// up to the kernel's 64 KiB limit.
pub fn lgetxattr_opt(p: &Path, name: &str) -> io::Result<Option<Vec<u8>>> {
    let absent = |e: &rustix::io::Errno| {
        *e == rustix::io::Errno::NODATA || *e == rustix::io::Errno::OPNOTSUPP
    };
    // Most values (an ACL of a few entries) fit the first buffer.
    let mut buf = vec![0u8; 512];
    loop {
        match rustix::fs::lgetxattr(p, name, &mut buf[..]) {
            Ok(n) => {
                buf.truncate(n);
                return Ok(Some(buf));
            }
            Err(e) if absent(&e) => return Ok(None),
            Err(rustix::io::Errno::RANGE) if buf.len() < XATTR_SIZE_MAX => {
                let want = match rustix::fs::lgetxattr_query(p, name) {
                    Ok(n) => n,
                    Err(e) if absent(&e) => return Ok(None),
                    Err(e) => return Err(e.into()),
                };
                buf = vec![0u8; want.clamp(buf.len() * 2, XATTR_SIZE_MAX)];
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// The largest value of an extended attribute Linux keeps.
const XATTR_SIZE_MAX: usize = 64 * 1024;

/// `fgetxattr(2)` into `buf`; the value's length (ERANGE if it is longer).
pub fn fgetxattr(f: &std::fs::File, name: &str, buf: &mut [u8]) -> io::Result<usize> {
    Ok(rustix::fs::fgetxattr(f, name, buf)?)
}

/// `fsetxattr(2)`: sets (creates or replaces) one extended attribute.
pub fn fsetxattr(f: &std::fs::File, name: &str, value: &[u8]) -> io::Result<()> {
    Ok(rustix::fs::fsetxattr(
        f,
        name,
        value,
        rustix::fs::XattrFlags::empty(),
    )?)
}

/// `fremovexattr(2)`.
pub fn fremovexattr(f: &std::fs::File, name: &str) -> io::Result<()> {
    Ok(rustix::fs::fremovexattr(f, name)?)
}

/// Frees the disk blocks of a byte range of a file, keeping its size.
pub fn punch_hole(f: &std::fs::File, offset: u64, len: u64) -> io::Result<()> {
    use rustix::fs::FallocateFlags;
    let mode = FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE;
    Ok(rustix::fs::fallocate(f, mode, offset, len)?)
}

/// Size, mtime (ns) and inode of an open file, as `statx(2)` with
/// `AT_STATX_FORCE_SYNC` gives them: a network file system (NFS, FUSE) asks
/// its server instead of answering from its attribute cache. Fails with
/// ENOSYS where the kernel (or a seccomp filter) lacks statx.
pub fn fstat_fresh(f: &std::fs::File) -> io::Result<(u64, i64, u64)> {
    use rustix::fs::{AtFlags, StatxFlags};
    let st = rustix::fs::statx(
        f,
        c"",
        AtFlags::EMPTY_PATH | AtFlags::STATX_FORCE_SYNC,
        StatxFlags::SIZE | StatxFlags::MTIME | StatxFlags::INO,
    )?;
    // As `SourceAttr::from_metadata` computes it (the versions compare).
    let mtime_ns = unix_ns(st.stx_mtime.tv_sec, st.stx_mtime.tv_nsec as i64);
    Ok((st.stx_size, mtime_ns, st.stx_ino))
}

/// A time of `secs` seconds and `nanos` nanoseconds since 1970 in
/// nanoseconds, as the namespace keeps times (i64): saturated at the ends
/// of that range (years 1677 and 2262), never wrapped. A source may hold
/// later times (ext4 and xfs go to 2446, an object store's Last-Modified
/// is whatever its server says); such a time shows as 2262 through the
/// mount. An object's version still tells its contents apart (its ETag is
/// part of it); a file rewritten in place at the same size with both its
/// times past 2262 is not seen as changed.
pub fn unix_ns(secs: i64, nanos: i64) -> i64 {
    secs.saturating_mul(1_000_000_000).saturating_add(nanos)
}

/// Detaches a mount even if it is busy (`umount -l`); a user's own FUSE
/// mount through `fusermount3 -u -z` (see [`unmount`]).
pub fn lazy_unmount(p: &Path) -> io::Result<()> {
    match rustix::mount::unmount(p, rustix::mount::UnmountFlags::DETACH) {
        Err(Errno::PERM) => fusermount_unmount(p, true),
        r => Ok(r?),
    }
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

/// One mount of /proc/self/mountinfo, its fields decoded.
pub struct MountEntry {
    /// `major:minor` of its file system (`0:N` for FUSE connection N).
    pub dev: String,
    pub mountpoint: PathBuf,
    /// e.g. "fuse.locafs".
    pub fstype: String,
    /// The file system's name (for locafs, `locafs:SOURCE`).
    pub source: Vec<u8>,
}

/// Every mount of this mount namespace, in the order of
/// /proc/self/mountinfo (empty if it cannot be read).
pub fn mounts() -> Vec<MountEntry> {
    use std::os::unix::ffi::OsStringExt;
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    info.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let mut after = f.iter().skip_while(|x| **x != "-").skip(1);
            let (fstype, source) = (after.next()?, after.next()?);
            Some(MountEntry {
                dev: (*f.get(2)?).to_owned(),
                mountpoint: PathBuf::from(std::ffi::OsString::from_vec(unescape_mount(f.get(4)?))),
                fstype: (*fstype).to_owned(),
                source: unescape_mount(source),
            })
        })
        .collect()
}

/// The /proc/self/mountinfo line of the mount whose root is `p` (the last
/// one if several are stacked).
pub fn mountinfo_line(p: &Path) -> Option<String> {
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
/// Without CAP_SYS_ADMIN, umount2(2) answers EPERM whoever made the mount:
/// then the setuid `fusermount3 -u` unmounts it if it is a FUSE mount of
/// this user's (as libfuse and fuser do).
pub fn unmount(p: &Path) -> io::Result<()> {
    match rustix::mount::unmount(p, rustix::mount::UnmountFlags::empty()) {
        Err(Errno::PERM) => fusermount_unmount(p, false),
        r => Ok(r?),
    }
}

/// `fusermount3 -u [-z] -- p`; its refusal as the errno it names (EBUSY
/// for a busy mount, EINVAL for what is not a mount of this user's), EPERM
/// when there is no helper.
fn fusermount_unmount(p: &Path, lazy: bool) -> io::Result<()> {
    let Some(helper) = fusermount() else {
        return Err(Errno::PERM.into());
    };
    let mut cmd = std::process::Command::new(helper);
    cmd.arg("-u");
    if lazy {
        cmd.arg("-z");
    }
    let out = cmd
        .arg("--")
        .arg(p)
        .stdin(std::process::Stdio::null())
        .output()?;
    if out.status.success() {
        return Ok(());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    let errno = if err.contains("busy") {
        Errno::BUSY
    } else if err.contains("not found") || err.contains("Invalid argument") {
        Errno::INVAL
    } else {
        return Err(io::Error::other(err.trim().replace('\n', "; ")));
    };
    Err(errno.into())
}

/// The setuid helper that mounts and unmounts FUSE file systems for a user
/// without CAP_SYS_ADMIN (`fusermount3` of libfuse 3, or libfuse 2's
/// `fusermount`), looked for where fuser looks when it mounts:
/// `$FUSERMOUNT_PATH`, else each name on `$PATH`, else in /sbin and /bin.
pub fn fusermount() -> Option<PathBuf> {
    let runnable =
        |p: &Path| p.is_file() && rustix::fs::access(p, rustix::fs::Access::EXEC_OK).is_ok();
    if let Some(p) = std::env::var_os("FUSERMOUNT_PATH") {
        return Some(PathBuf::from(p)).filter(|p| runnable(p));
    }
    let names = ["fusermount3", "fusermount"];
    let path = std::env::var_os("PATH").unwrap_or_default();
    let on_path = names
        .iter()
        .flat_map(|n| std::env::split_paths(&path).map(move |d| d.join(n)));
    let fixed = ["/sbin", "/bin"]
        .iter()
        .flat_map(|d| names.iter().map(move |n| Path::new(d).join(n)));
    on_path.chain(fixed).find(|p| runnable(p))
}

/// systemd's notify socket, if this process is the one systemd started
/// for a `Type=notify` unit: `NOTIFY_SOCKET`, unless `SYSTEMD_EXEC_PID`
/// (systemd 248 and later) names another process (a child of the unit's
/// process that inherited the variable speaks for no unit).
pub fn notify_socket() -> Option<std::ffi::OsString> {
    notify_socket_of(
        std::env::var_os("NOTIFY_SOCKET"),
        std::env::var("SYSTEMD_EXEC_PID").ok(),
        std::process::id(),
    )
}

/// [`notify_socket`] from the two variables, for process `pid`.
fn notify_socket_of(
    socket: Option<std::ffi::OsString>,
    exec_pid: Option<String>,
    pid: u32,
) -> Option<std::ffi::OsString> {
    let socket = socket.filter(|p| !p.is_empty())?;
    match exec_pid {
        Some(p) if p.trim().parse::<u32>().ok() != Some(pid) => None,
        _ => Some(socket),
    }
}

/// Tells systemd (Type=notify) something, if it is listening
/// ([`notify_socket`]).
pub fn sd_notify(state: &str) {
    let _ = sd_notify_with_fds(state, &[]);
}

/// Sends `state` to systemd with `fds` (sd_pid_notify_with_fds), if it is
/// listening ([`notify_socket`]).
pub fn sd_notify_with_fds(state: &str, fds: &[std::os::fd::BorrowedFd<'_>]) -> io::Result<()> {
    match notify_socket() {
        Some(path) => send_notify(&path, state, fds),
        None => Ok(()),
    }
}

/// Sends `state` with `fds` in one datagram to the socket `path` (a
/// filesystem path, or `@name` in the abstract namespace), as systemd's
/// notify protocol does.
pub fn send_notify(
    path: &std::ffi::OsStr,
    state: &str,
    fds: &[std::os::fd::BorrowedFd<'_>],
) -> io::Result<()> {
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    use std::mem::MaybeUninit;
    let sock = std::os::unix::net::UnixDatagram::unbound()?;
    let bytes = path.as_bytes();
    let addr = if let Some(name) = bytes.strip_prefix(b"@") {
        rustix::net::SocketAddrUnix::new_abstract_name(name)?
    } else {
        rustix::net::SocketAddrUnix::new(bytes)?
    };
    let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(fds.len().max(1)))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::other("too many descriptors"));
    }
    let iov = [io::IoSlice::new(state.as_bytes())];
    rustix::net::sendmsg_addr(&sock, &addr, &iov, &mut control, SendFlags::empty())?;
    Ok(())
}

/// Raises the open-file limit to its hard maximum (the cache keeps a bounded
/// number of files open, but a loader may hold many handles).
pub fn raise_nofile_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let r = getrlimit(Resource::Nofile);
    // None is RLIM_INFINITY.
    if r.current.unwrap_or(u64::MAX) < r.maximum.unwrap_or(u64::MAX) {
        let _ = setrlimit(
            Resource::Nofile,
            Rlimit {
                current: r.maximum,
                maximum: r.maximum,
            },
        );
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
    // Reads into the spare capacity (rustix sets the length); capacity
    // beyond `len`, if the allocator gave any, is read and cut off.
    let mut buf: Vec<u8> = Vec::with_capacity(len);
    while buf.len() < len {
        let off = file_offset(offset, buf.len())?;
        match rustix::io::pread(f, rustix::buffer::spare_capacity(&mut buf), off) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(_) => {}
            Err(Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    buf.truncate(len);
    Ok(buf)
}

/// `offset + done` as a file offset (at most `i64::MAX`); EINVAL past it.
fn file_offset(offset: u64, done: usize) -> io::Result<u64> {
    offset
        .checked_add(done as u64)
        .filter(|o| i64::try_from(*o).is_ok())
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))
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
    use rustix::fs::OFlags;
    let mut flags = rustix::fs::fcntl_getfl(f)?;
    flags.set(OFlags::DIRECT, on);
    Ok(rustix::fs::fcntl_setfl(f, flags)?)
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
    const A: usize = DIRECT_READ_ALIGN;
    if offset % A as u64 != 0 {
        return Ok(None);
    }
    let padded = len.div_ceil(A) * A;
    let mut buf: Vec<u8> = Vec::with_capacity(padded + A);
    let start = buf.as_ptr().align_offset(A);
    // Zeros up to the aligned start (start < A: within the capacity, so the
    // vector does not move).
    buf.resize(start, 0);
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
        let off = file_offset(offset, done)?;
        // Exactly the aligned rest of the read (not all the spare capacity,
        // whose length is not a multiple of A): its start is aligned, since
        // the vector's length is start + done.
        let spare = &mut buf.spare_capacity_mut()[..padded - done];
        let n = match rustix::io::pread(f, spare, off) {
            Ok((read, _)) => read.len(),
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        };
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        done += n;
        // SAFETY: pread initialized these n bytes past the vector's length
        // (rustix returned them as initialized). Safe Rust has no way to
        // grow a vector over bytes a read filled in part of its spare
        // capacity; the alternative, zeroing the buffer first, is one more
        // pass over memory per byte read.
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

/// The supplementary groups of the process at the other end of a Unix
/// socket, as the kernel recorded them when it connected (`SO_PEERGROUPS`,
/// Linux 4.13).
pub fn peer_groups(fd: std::os::fd::BorrowedFd<'_>) -> io::Result<Vec<u32>> {
    use std::os::fd::AsRawFd;
    let mut groups = vec![0u32; 64];
    loop {
        let mut len = (groups.len() * 4) as libc::socklen_t;
        // SAFETY: the buffer holds `len` bytes; the kernel writes at most
        // that and says how many it wrote (or needs, with ERANGE).
        let r = unsafe {
            libc::getsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PEERGROUPS,
                groups.as_mut_ptr().cast(),
                &mut len,
            )
        };
        if r == 0 {
            groups.truncate(len as usize / 4);
            return Ok(groups);
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ERANGE) && groups.len() < 65536 {
            groups.resize((len as usize / 4).max(groups.len() * 2), 0);
            continue;
        }
        return Err(e);
    }
}

/// Runs `f` on a thread of its own that is user `uid`, group `gid` with
/// supplementary `groups` (real, effective, saved and file-system ids), so
/// that the kernel checks everything `f` does as it would check it for that
/// user. Only that thread changes (the system calls, not the C library's
/// wrappers, which would change every thread of the process), and it ends
/// with `f`. Needs root (CAP_SETUID and CAP_SETGID).
pub fn as_user<T: Send + 'static>(
    uid: u32,
    gid: u32,
    groups: Vec<u32>,
    f: impl FnOnce() -> T + Send + 'static,
) -> io::Result<T> {
    use rustix::process::{Gid, Uid};
    let t = std::thread::Builder::new()
        .name("locafs-as-user".into())
        .spawn(move || -> io::Result<T> {
            let groups: Vec<Gid> = groups.into_iter().map(Gid::from_raw).collect();
            rustix::thread::set_thread_groups(&groups)?;
            let g = Gid::from_raw(gid);
            rustix::thread::set_thread_res_gid(g, g, g)?;
            let u = Uid::from_raw(uid);
            rustix::thread::set_thread_res_uid(u, u, u)?;
            Ok(f())
        })?;
    t.join()
        .map_err(|_| io::Error::other("a check as another user panicked"))?
}

/// Why [`canonical_dir_within`] found no directory.
#[derive(Debug)]
pub enum ProbeError {
    /// No answer within the deadline (a hung network file system).
    Timeout,
    Io(io::Error),
}

/// The canonical path of the directory `path` (symlinks resolved), asked in
/// a child process and waited for at most `deadline`: a source on a hung
/// network file system (NFS `hard`, a stopped FUSE server) puts the asker
/// in uninterruptible sleep, and that must be a child that is left behind,
/// never this process. The child also asks the file system for the
/// directory's attributes afresh (`statx` with `AT_STATX_FORCE_SYNC`), so
/// that a server that does not answer is found here. Nothing in the child
/// allocates or takes a lock (it may be forked from a process with many
/// threads); its standard streams are /dev/null and it holds no descriptor
/// of ours but the pipe it answers on, so a caller waiting for our output
/// (`--daemon`) is never kept waiting by it.
pub fn canonical_dir_within(
    path: &Path,
    deadline: std::time::Duration,
) -> Result<PathBuf, ProbeError> {
    use std::ffi::CString;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let c_path = CString::new(path.as_os_str().as_bytes())
        .map_err(|e| ProbeError::Io(io::Error::other(e)))?;
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: pipe2 fills the two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(ProbeError::Io(io::Error::last_os_error()));
    }
    // SAFETY: both descriptors were just made and are ours alone.
    let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    const HELD: libc::c_int = 4;
    let link = c"/proc/self/fd/4";
    let mut buf = [0u8; 4096];
    // SAFETY: the child calls only async-signal-safe system calls on memory
    // prepared before the fork, and leaves with _exit.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(ProbeError::Io(io::Error::last_os_error()));
    }
    if pid == 0 {
        // SAFETY: see above; every pointer is to memory of this frame.
        unsafe {
            let answer = |buf: &[u8]| {
                libc::write(3, buf.as_ptr().cast(), buf.len());
                libc::_exit(0)
            };
            // The answer goes on descriptor 3, the standard streams to
            // /dev/null, and every other descriptor is closed.
            libc::dup2(wr.as_raw_fd(), 3);
            let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
            if null >= 0 {
                for i in 0..3 {
                    libc::dup2(null, i);
                }
            }
            if libc::syscall(libc::SYS_close_range, 4u32, u32::MAX, 0u32) != 0 {
                // (Before Linux 5.9.)
                for fd in 4..4096 {
                    libc::close(fd);
                }
            }
            let fd = libc::open(
                c_path.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            );
            let errno = |code: u8| {
                let e = *libc::__errno_location();
                let b = e.to_le_bytes();
                answer(&[code, b[0], b[1], b[2], b[3]])
            };
            if fd < 0 {
                errno(1);
            }
            if fd != HELD {
                libc::dup2(fd, HELD);
            }
            let mut stx: libc::statx = std::mem::zeroed();
            if libc::statx(
                HELD,
                c"".as_ptr(),
                libc::AT_EMPTY_PATH | libc::AT_STATX_FORCE_SYNC,
                libc::STATX_TYPE,
                &mut stx,
            ) != 0
                && *libc::__errno_location() != libc::ENOSYS
            {
                errno(1);
            }
            buf[0] = 0;
            let n = libc::readlink(link.as_ptr(), buf[1..].as_mut_ptr().cast(), buf.len() - 1);
            if n <= 0 {
                errno(1);
            }
            answer(&buf[..1 + n as usize]);
        }
    }
    drop(wr);
    let reap = move || {
        let mut status = 0;
        // SAFETY: waits for our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
    };
    let mut out = Vec::new();
    let end = std::time::Instant::now() + deadline;
    let timed_out = loop {
        let left = end.saturating_duration_since(std::time::Instant::now());
        let mut pfd = libc::pollfd {
            fd: rd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = left.as_millis().min(i32::MAX as u128) as libc::c_int;
        // SAFETY: one pollfd, ours.
        let r = unsafe { libc::poll(&mut pfd, 1, ms) };
        if r < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
            continue;
        }
        if r <= 0 {
            break true;
        }
        let mut chunk = [0u8; 4096];
        match rustix::io::read(&rd, &mut chunk) {
            Ok(0) => break false,
            Ok(n) => out.extend_from_slice(&chunk[..n]),
            Err(Errno::INTR) | Err(Errno::AGAIN) => {}
            Err(e) => return Err(ProbeError::Io(e.into())),
        }
    };
    if timed_out {
        // SAFETY: our own child. It may not die while the file system holds
        // it: a thread reaps it whenever it does.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        let _ = std::thread::Builder::new()
            .name("locafs-reap".into())
            .spawn(reap);
        return Err(ProbeError::Timeout);
    }
    reap();
    match out.split_first() {
        Some((0, p)) if !p.is_empty() => Ok(PathBuf::from(std::ffi::OsStr::from_bytes(p))),
        Some((1, e)) if e.len() == 4 => Err(ProbeError::Io(io::Error::from_raw_os_error(
            i32::from_le_bytes([e[0], e[1], e[2], e[3]]),
        ))),
        _ => Err(ProbeError::Io(io::Error::other(
            "the directory could not be examined",
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_process_systemd_started_takes_notify_socket_for_its_own() {
        let sock = || Some(std::ffi::OsString::from("/run/systemd/notify"));
        // systemd before 248: the variable alone.
        assert_eq!(notify_socket_of(sock(), None, 42), sock());
        // The unit's process.
        assert_eq!(notify_socket_of(sock(), Some("42".into()), 42), sock());
        // A child of it (a Python program's locafs.mount(), say).
        assert_eq!(notify_socket_of(sock(), Some("41".into()), 42), None);
        assert_eq!(notify_socket_of(None, Some("42".into()), 42), None);
        assert_eq!(notify_socket_of(Some("".into()), None, 42), None);
    }
    use crate::test_skip::skipped;

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
                skipped(module_path!(), &format!("/var/tmp refuses O_DIRECT ({e})"));
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
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let p = dir.path().join("f");
        let mut f = std::fs::File::create(&p).unwrap();
        f.write_all(&vec![7u8; 64 << 10]).unwrap();
        f.sync_all().unwrap();
        let f = std::fs::File::open(&p).unwrap();
        // Whether the kernel has cachestat(2) (Linux 6.5), asked of the
        // kernel itself with a bad descriptor and bad flags: a kernel that
        // has it refuses them (EBADF, EINVAL), one that does not answers
        // ENOSYS. Not from `is_cached`, the code under test: a bug making
        // it always false must fail here, not skip.
        // SAFETY: the call is refused before anything is read or written.
        let r = unsafe { libc::syscall(SYS_CACHESTAT, -1, 0usize, 0usize, 1u32) };
        if r != 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ENOSYS) {
            skipped(module_path!(), "cachestat(2) not available in this kernel");
            return;
        }
        // Just written: in the page cache.
        assert!(is_cached(&f, 0, 64 << 10), "a range just written");
        // Dropped from the page cache (clean, so DONTNEED evicts it).
        rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed).unwrap();
        assert!(!is_cached(&f, 0, 64 << 10));
        // Read back: cached again.
        let _ = std::fs::read(&p).unwrap();
        assert!(is_cached(&f, 4096, 8192));
        assert!(!is_cached(&f, 0, 0));
    }

    #[test]
    fn statvfs_describes_the_file_system_and_fails_cleanly() {
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let st = statvfs(dir.path()).unwrap();
        assert!(st.f_bsize > 0 && st.f_frsize > 0 && st.f_namemax >= 255);
        assert!(st.f_blocks > 0 && st.f_bfree <= st.f_blocks && st.f_bavail <= st.f_bfree);
        assert!(st.f_files > 0 && st.f_ffree <= st.f_files);
        assert_eq!(
            available_bytes(dir.path()).unwrap(),
            st.f_bavail as u64 * st.f_frsize as u64
        );
        let e = statvfs(&dir.path().join("missing")).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
        let nul = Path::new(std::ffi::OsStr::from_bytes(b"a\0b"));
        assert_eq!(
            statvfs(nul).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
    }

    #[test]
    fn xattrs_are_set_read_and_removed() {
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, b"x").unwrap();
        let f = std::fs::File::open(&p).unwrap();
        match fsetxattr(&f, "user.locafs.test", b"value \xff") {
            Err(e) if e.raw_os_error() == Some(libc::ENOTSUP) => {
                skipped(module_path!(), "no user xattrs in /var/tmp");
                return;
            }
            r => r.unwrap(),
        }
        assert_eq!(getxattr(&p, "user.locafs.test").unwrap(), b"value \xff");
        let mut buf = [0u8; 16];
        assert_eq!(fgetxattr(&f, "user.locafs.test", &mut buf).unwrap(), 7);
        assert_eq!(&buf[..7], b"value \xff");
        let e = fgetxattr(&f, "user.locafs.test", &mut buf[..3]).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ERANGE));
        fsetxattr(&f, "user.locafs.test", b"").unwrap();
        assert_eq!(getxattr(&p, "user.locafs.test").unwrap(), b"");
        fremovexattr(&f, "user.locafs.test").unwrap();
        let e = getxattr(&p, "user.locafs.test").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENODATA));
        let e = fremovexattr(&f, "user.locafs.test").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENODATA));
        let e = getxattr(&dir.path().join("missing"), "user.x").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
    }

    #[test]
    fn a_punched_hole_reads_as_zeros_frees_its_blocks_and_keeps_the_size() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, vec![9u8; 3 * 4096]).unwrap();
        let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
        f.sync_all().unwrap();
        let before = f.metadata().unwrap().blocks();
        punch_hole(&f, 4096, 4096).unwrap();
        let m = f.metadata().unwrap();
        assert_eq!(m.len(), 3 * 4096);
        assert_eq!(m.blocks(), before - 8, "one 4 KiB block freed");
        let back = std::fs::read(&p).unwrap();
        assert!(back[..4096].iter().all(|b| *b == 9));
        assert!(back[4096..8192].iter().all(|b| *b == 0));
        assert!(back[8192..].iter().all(|b| *b == 9));
        let ro = std::fs::File::open(&p).unwrap();
        assert_eq!(
            punch_hole(&ro, 0, 4096).unwrap_err().raw_os_error(),
            Some(libc::EBADF)
        );
    }

    #[test]
    fn fstat_fresh_agrees_with_fstat() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, vec![1u8; 12345]).unwrap();
        let f = std::fs::File::open(&p).unwrap();
        let m = f.metadata().unwrap();
        let want = (m.len(), unix_ns(m.mtime(), m.mtime_nsec()), m.ino());
        match fstat_fresh(&f) {
            Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => {
                skipped(module_path!(), "no statx(2) here");
            }
            r => assert_eq!(r.unwrap(), want),
        }
    }

    /// The file status flags of `f`, as /proc/self/fdinfo shows them.
    fn fd_flags(f: &std::fs::File) -> i32 {
        use std::os::fd::AsRawFd;
        let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", f.as_raw_fd())).unwrap();
        let flags = info.lines().find_map(|l| l.strip_prefix("flags:")).unwrap();
        i32::from_str_radix(flags.trim(), 8).unwrap()
    }

    #[test]
    fn set_direct_turns_o_direct_on_and_off_and_nothing_else() {
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, b"x").unwrap();
        let f = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
        let flags = fd_flags(&f);
        assert_eq!(flags & libc::O_DIRECT, 0);
        if let Err(e) = set_direct(&f, true) {
            skipped(module_path!(), &format!("/var/tmp refuses O_DIRECT ({e})"));
            return;
        }
        assert_eq!(fd_flags(&f), flags | libc::O_DIRECT);
        set_direct(&f, false).unwrap();
        assert_eq!(fd_flags(&f), flags);
    }

    #[test]
    fn unmount_refuses_what_is_not_a_mount_and_unmounts_what_is() {
        let dir = tempfile::tempdir().unwrap();
        for f in [unmount, lazy_unmount] {
            let e = f(dir.path()).unwrap_err();
            assert!(
                matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::EPERM)),
                "{e}"
            );
            let e = f(&dir.path().join("missing")).unwrap_err();
            assert!(
                matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::EPERM)),
                "{e}"
            );
        }
        for (name, f) in [
            ("unmount", unmount as fn(&Path) -> io::Result<()>),
            ("lazy", lazy_unmount),
        ] {
            let mnt = dir.path().join(name);
            std::fs::create_dir(&mnt).unwrap();
            let flags = rustix::mount::MountFlags::empty();
            if let Err(e) = rustix::mount::mount("tmpfs", &mnt, "tmpfs", flags, c"size=1m") {
                skipped(module_path!(), &format!("cannot mount a tmpfs here ({e})"));
                return;
            }
            assert!(is_mountpoint(&mnt));
            assert_eq!(mount_fstype(&mnt).as_deref(), Some("tmpfs"));
            f(&mnt).unwrap();
            assert!(!is_mountpoint(&mnt));
        }
    }

    #[test]
    fn canonical_dir_within_resolves_links_and_says_what_is_wrong() {
        let d = tempfile::tempdir().unwrap();
        let real = std::fs::canonicalize(d.path()).unwrap();
        std::fs::create_dir(real.join("dir")).unwrap();
        std::os::unix::fs::symlink("dir", real.join("link")).unwrap();
        std::fs::write(real.join("file"), b"x").unwrap();
        let t = std::time::Duration::from_secs(10);
        assert_eq!(
            canonical_dir_within(&real.join("link"), t).unwrap(),
            real.join("dir")
        );
        let code = |p: &str| match canonical_dir_within(&real.join(p), t) {
            Err(ProbeError::Io(e)) => e.raw_os_error(),
            other => panic!("{p}: {other:?}"),
        };
        assert_eq!(code("file"), Some(libc::ENOTDIR));
        assert_eq!(code("missing"), Some(libc::ENOENT));
    }

    #[test]
    fn as_user_checks_as_that_user_on_its_own_thread() {
        if rustix::process::geteuid().as_raw() != 0 {
            eprintln!("SKIPPED: sys::tests::as_user: needs root");
            return;
        }
        let d = tempfile::tempdir().unwrap();
        let private = d.path().join("private");
        std::fs::write(&private, b"x").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let p = private.clone();
        let read = as_user(65534, 65534, vec![], move || std::fs::read(&p).is_ok()).unwrap();
        assert!(!read, "nobody read a 0600 file of root's");
        let p = private.clone();
        let (uid, read) = as_user(65534, 65534, vec![], move || {
            (
                rustix::process::geteuid().as_raw(),
                std::fs::metadata(&p).is_ok(),
            )
        })
        .unwrap();
        assert_eq!((uid, read), (65534, true));
        // This thread (and the process) is still root.
        assert_eq!(rustix::process::geteuid().as_raw(), 0);
        assert!(std::fs::read(&private).is_ok());
    }

    #[test]
    fn raise_nofile_limit_raises_the_soft_limit_to_the_hard_one() {
        use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
        let r = getrlimit(Resource::Nofile);
        if let Some(max) = r.maximum {
            // One below the hard limit, so that there is something to raise.
            let lower = Rlimit {
                current: Some(max - 1),
                maximum: Some(max),
            };
            setrlimit(Resource::Nofile, lower).unwrap();
        }
        raise_nofile_limit();
        let limits = std::fs::read_to_string("/proc/self/limits").unwrap();
        let line = limits
            .lines()
            .find(|l| l.starts_with("Max open files"))
            .unwrap();
        let f: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(f[3], f[4], "{line}");
    }
}
