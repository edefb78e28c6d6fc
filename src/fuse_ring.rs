//! FUSE over io_uring (`--fuse-uring`): the kernel hands requests to the
//! daemon in ring entries and takes each reply with the next fetch in one
//! io_uring command, instead of a read(2) and a writev(2) on /dev/fuse per
//! request. One queue per possible CPU (the kernel sends a request to the
//! queue of the CPU it was made on), each with its own ring and thread,
//! pinned to that CPU. A request is laid out as /dev/fuse would give it and
//! handed to fuser's decoding (`Dispatcher`, vendor/fuser); its reply may
//! come from any thread and is committed to the entry it came in.
//!
//! FORGET, INTERRUPT and notifications still go through /dev/fuse (the
//! kernel sends them there), so the session's classic threads keep running.
//!
//! It must never be the only way a request can be answered wrongly: a
//! request it cannot lay out is answered EIO, never dropped (a dropped entry
//! is a request the caller waits for forever). It never panics; a queue
//! that fails stops only itself. It holds no file system logic.

use std::cell::Cell;
use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

use fuser::{Dispatcher, ExternalReply, Filesystem};
use parking_lot::Mutex;
use tracing::{debug, info, warn};

use crate::stats::Stats;

/// Where the kernel says whether it may carry FUSE over io_uring.
pub const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// Ring entries per queue: each holds one request from the kernel until it
/// is answered (a cold read holds its entry while the source answers);
/// requests past them wait in the kernel's queue.
pub const QUEUE_DEPTH: usize = 64;

/// Largest write the kernel may send with the ring on (the mount is
/// read-only; this bounds each entry's payload buffer with the reads).
pub const RING_MAX_WRITE: u32 = 1 << 20;

// The kernel's FUSE-over-io_uring ABI (include/uapi/linux/fuse.h, 7.42).
const FUSE_IO_URING_CMD_REGISTER: u32 = 1;
const FUSE_IO_URING_CMD_COMMIT_AND_FETCH: u32 = 2;
/// `struct fuse_uring_req_header`: in_out[128], op_in[128], ring_ent_in_out.
const HEADER_OP_IN: usize = 128;
const HEADER_ENT_IN_OUT: usize = 256;
const HEADER_SIZE: usize = 256 + 32;
const IN_HEADER_LEN: usize = 40;
const OUT_HEADER_LEN: usize = 16;

// io_uring (include/uapi/linux/io_uring.h).
const IORING_SETUP_CQSIZE: u32 = 1 << 3;
const IORING_SETUP_SUBMIT_ALL: u32 = 1 << 7;
const IORING_SETUP_SQE128: u32 = 1 << 10;
const IORING_FEAT_SINGLE_MMAP: u32 = 1;
const IORING_ENTER_GETEVENTS: u32 = 1;
const IORING_ENTER_REGISTERED_RING: u32 = 1 << 4;
const IORING_REGISTER_FILES: u32 = 2;
const IORING_REGISTER_RING_FD: u32 = 20;
const IOSQE_FIXED_FILE: u8 = 1;
const IORING_OFF_SQ_RING: i64 = 0;
const IORING_OFF_CQ_RING: i64 = 0x800_0000;
const IORING_OFF_SQES: i64 = 0x1000_0000;
const IORING_OP_NOP: u8 = 0;
const IORING_OP_URING_CMD: u8 = 46;
const SQE_SIZE: usize = 128;
/// The user_data of the no-op that wakes a queue's thread to stop.
const WAKE: u64 = u64::MAX;

#[repr(C)]
#[derive(Default)]
struct SqOffsets {
    head: u32,
    tail: u32,
    ring_mask: u32,
    ring_entries: u32,
    flags: u32,
    dropped: u32,
    array: u32,
    resv1: u32,
    user_addr: u64,
}

#[repr(C)]
#[derive(Default)]
struct CqOffsets {
    head: u32,
    tail: u32,
    ring_mask: u32,
    ring_entries: u32,
    overflow: u32,
    cqes: u32,
    flags: u32,
    resv1: u32,
    user_addr: u64,
}

#[repr(C)]
#[derive(Default)]
struct Params {
    sq_entries: u32,
    cq_entries: u32,
    flags: u32,
    sq_thread_cpu: u32,
    sq_thread_idle: u32,
    features: u32,
    wq_fd: u32,
    resv: [u32; 3],
    sq_off: SqOffsets,
    cq_off: CqOffsets,
}

/// A 128-byte SQE as IORING_OP_URING_CMD reads it (the command's 80 bytes
/// at the end).
#[repr(C)]
struct Sqe {
    opcode: u8,
    flags: u8,
    ioprio: u16,
    fd: i32,
    cmd_op: u32,
    pad1: u32,
    addr: u64,
    len: u32,
    op_flags: u32,
    user_data: u64,
    buf_index: u16,
    personality: u16,
    file_index: u32,
    cmd: [u8; 80],
}

#[repr(C)]
struct Cqe {
    user_data: u64,
    res: i32,
    flags: u32,
}

/// An anonymous or ring mapping, unmapped on drop.
struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

impl Mapping {
    fn anonymous(len: usize) -> io::Result<Mapping> {
        Self::map(len, -1, 0, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS)
    }

    fn map(len: usize, fd: RawFd, offset: i64, flags: libc::c_int) -> io::Result<Mapping> {
        // SAFETY: a fresh mapping; no existing memory is touched.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                offset,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap gave null"))?;
        Ok(Mapping { ptr, len })
    }

    fn at(&self, offset: u32) -> *mut u8 {
        // SAFETY: offsets come from the kernel's ring layout, inside the
        // mapping it sized for them.
        unsafe { self.ptr.as_ptr().add(offset as usize) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping is ours and no longer used.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// One io_uring instance: its fd and the shared rings.
struct Ring {
    fd: OwnedFd,
    _rings: Mapping,
    _cq_rings: Option<Mapping>,
    sqes: Mapping,
    sq_head: *const AtomicU32,
    sq_tail: *const AtomicU32,
    sq_mask: u32,
    sq_entries: u32,
    sq_array: *mut u32,
    cq_head: *const AtomicU32,
    cq_tail: *const AtomicU32,
    cq_mask: u32,
    cqes: *const Cqe,
}

impl Ring {
    fn new(entries: u32) -> io::Result<Ring> {
        let mut p = Params {
            flags: IORING_SETUP_SQE128 | IORING_SETUP_CQSIZE | IORING_SETUP_SUBMIT_ALL,
            cq_entries: entries * 2,
            ..Params::default()
        };
        // SAFETY: io_uring_setup fills `p`, which lives across the call.
        let fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, entries, &mut p as *mut Params) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the kernel just gave us this fd.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
        let sq_len = p.sq_off.array as usize + p.sq_entries as usize * 4;
        let cq_len = p.cq_off.cqes as usize + p.cq_entries as usize * std::mem::size_of::<Cqe>();
        let shared = libc::MAP_SHARED | libc::MAP_POPULATE;
        let raw = fd.as_raw_fd();
        let (rings, cq_rings) = if p.features & IORING_FEAT_SINGLE_MMAP != 0 {
            (
                Mapping::map(sq_len.max(cq_len), raw, IORING_OFF_SQ_RING, shared)?,
                None,
            )
        } else {
            (
                Mapping::map(sq_len, raw, IORING_OFF_SQ_RING, shared)?,
                Some(Mapping::map(cq_len, raw, IORING_OFF_CQ_RING, shared)?),
            )
        };
        let sqes = Mapping::map(
            p.sq_entries as usize * SQE_SIZE,
            raw,
            IORING_OFF_SQES,
            shared,
        )?;
        let cq = cq_rings.as_ref().unwrap_or(&rings);
        // SAFETY (reads of the masks): inside the ring mapping.
        let (sq_mask, cq_mask) = unsafe {
            (
                *rings.at(p.sq_off.ring_mask).cast::<u32>(),
                *cq.at(p.cq_off.ring_mask).cast::<u32>(),
            )
        };
        Ok(Ring {
            sq_head: rings.at(p.sq_off.head).cast(),
            sq_tail: rings.at(p.sq_off.tail).cast(),
            sq_mask,
            sq_entries: p.sq_entries,
            sq_array: rings.at(p.sq_off.array).cast(),
            cq_head: cq.at(p.cq_off.head).cast(),
            cq_tail: cq.at(p.cq_off.tail).cast(),
            cq_mask,
            cqes: cq.at(p.cq_off.cqes).cast(),
            fd,
            _rings: rings,
            _cq_rings: cq_rings,
            sqes,
        })
    }

    /// Puts one SQE on the submission ring; the caller holds the queue's
    /// submission lock. False: the ring is full (cannot happen: it has a
    /// slot for every entry and the wake-up).
    fn push(&self, fill: impl FnOnce(&mut Sqe)) -> bool {
        // SAFETY: head and tail are the kernel's shared counters; only
        // lock holders move the tail.
        let (head, tail) = unsafe {
            (
                (*self.sq_head).load(Ordering::Acquire),
                (*self.sq_tail).load(Ordering::Relaxed),
            )
        };
        if tail.wrapping_sub(head) >= self.sq_entries {
            return false;
        }
        let idx = tail & self.sq_mask;
        // SAFETY: slot `idx` is not the kernel's until the tail moves past
        // it; the SQE array has sq_entries slots of SQE_SIZE bytes.
        unsafe {
            let sqe = self.sqes.at(idx * SQE_SIZE as u32).cast::<Sqe>();
            std::ptr::write_bytes(sqe.cast::<u8>(), 0, SQE_SIZE);
            fill(&mut *sqe);
            *self.sq_array.add(idx as usize) = idx;
            (*self.sq_tail).store(tail.wrapping_add(1), Ordering::Release);
        }
        true
    }

    /// Submits whatever is on the submission ring and, with `wait`, blocks
    /// for at least one completion. `registered`: the ring's index among
    /// this thread's registered rings (only the thread that registered it),
    /// which spares the kernel a file lookup per call.
    fn enter(&self, wait: bool, registered: Option<u32>) -> io::Result<()> {
        let (min, mut flags) = if wait {
            (1, IORING_ENTER_GETEVENTS)
        } else {
            (0, 0)
        };
        let fd = match registered {
            Some(i) => {
                flags |= IORING_ENTER_REGISTERED_RING;
                i as libc::c_long
            }
            None => self.fd.as_raw_fd() as libc::c_long,
        };
        loop {
            // SAFETY: plain syscall on our ring; no pointers passed.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_io_uring_enter,
                    fd,
                    self.sq_entries,
                    min,
                    flags,
                    std::ptr::null::<libc::c_void>(),
                    0usize,
                )
            };
            if r >= 0 {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) if wait => return Ok(()),
                Some(libc::EINTR | libc::EAGAIN | libc::EBUSY) => continue,
                _ => return Err(e),
            }
        }
    }

    /// Registers `fd` as the ring's fixed file 0 (SQEs then name it by
    /// index: no file lookup per command).
    fn register_file(&self, fd: RawFd) -> io::Result<()> {
        let fds = [fd];
        // SAFETY: the kernel reads one fd from `fds`, alive across the call.
        let r = unsafe {
            libc::syscall(
                libc::SYS_io_uring_register,
                self.fd.as_raw_fd(),
                IORING_REGISTER_FILES,
                fds.as_ptr(),
                1u32,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Registers the ring's fd for the calling thread; its index, if the
    /// kernel takes it (5.18 and later).
    fn register_for_thread(&self) -> Option<u32> {
        // struct io_uring_rsrc_update { offset, resv, data }: offset -1
        // lets the kernel pick the index, written back.
        let mut update: [u64; 2] = [u32::MAX as u64, self.fd.as_raw_fd() as u64];
        // SAFETY: the kernel reads and writes one 16-byte update in place.
        let r = unsafe {
            libc::syscall(
                libc::SYS_io_uring_register,
                self.fd.as_raw_fd(),
                IORING_REGISTER_RING_FD,
                update.as_mut_ptr(),
                1u32,
            )
        };
        (r == 1).then_some(update[0] as u32)
    }

    /// Takes the completions that are there (only the queue's thread).
    fn completions(&self, out: &mut Vec<(u64, i32)>) {
        // SAFETY: the kernel's shared counters; the head is ours to move.
        unsafe {
            let mut head = (*self.cq_head).load(Ordering::Relaxed);
            let tail = (*self.cq_tail).load(Ordering::Acquire);
            while head != tail {
                let c = &*self.cqes.add((head & self.cq_mask) as usize);
                out.push((c.user_data, c.res));
                head = head.wrapping_add(1);
            }
            (*self.cq_head).store(head, Ordering::Release);
        }
    }
}

/// One ring entry's buffers, shared with the kernel.
struct Entry {
    header: Mapping,
    payload: Mapping,
    /// The two buffers as REGISTER names them (kept: the kernel may read
    /// them after the submitting call).
    iov: [libc::iovec; 2],
    /// The commit id of the request it holds (from the kernel).
    commit_id: AtomicU64,
}

/// One queue: a ring, its entries and its thread's state.
struct Queue {
    qid: u16,
    /// A duplicate of the session's /dev/fuse fd (commands name it).
    fuse: OwnedFd,
    ring: Ring,
    /// Serialises pushes on the submission ring.
    submit: Mutex<()>,
    entries: Vec<Entry>,
    payload_len: usize,
    stopped: AtomicBool,
    stats: Arc<Stats>,
}

// SAFETY: the raw pointers are into mappings the queue owns; the rings are
// shared with the kernel under its protocol (pushes under `submit`,
// completions on the queue's thread only); an entry's buffers belong to
// whoever answers its request until the commit.
unsafe impl Send for Queue {}
// SAFETY: as above.
unsafe impl Sync for Queue {}

thread_local! {
    /// The queue whose thread this is (its replies are submitted by the
    /// thread's next wait, not each by a syscall of its own).
    static OWNER: Cell<*const Queue> = const { Cell::new(std::ptr::null()) };
}

impl Queue {
    fn new(
        qid: u16,
        fuse: BorrowedFd<'_>,
        depth: usize,
        payload_len: usize,
        stats: Arc<Stats>,
    ) -> io::Result<Queue> {
        let ring = Ring::new((depth + 1).next_power_of_two() as u32)?;
        let mut entries = Vec::with_capacity(depth);
        for _ in 0..depth {
            let header = Mapping::anonymous(4096)?;
            let payload = Mapping::anonymous(payload_len)?;
            let iov = [
                libc::iovec {
                    iov_base: header.ptr.as_ptr().cast(),
                    iov_len: HEADER_SIZE,
                },
                libc::iovec {
                    iov_base: payload.ptr.as_ptr().cast(),
                    iov_len: payload_len,
                },
            ];
            entries.push(Entry {
                header,
                payload,
                iov,
                commit_id: AtomicU64::new(0),
            });
        }
        Ok(Queue {
            qid,
            fuse: fuse.try_clone_to_owned()?,
            ring,
            submit: Mutex::new(()),
            entries,
            payload_len,
            stopped: AtomicBool::new(false),
            stats,
        })
    }

    /// Puts a command for `entry` on the ring: REGISTER (with its buffers)
    /// or COMMIT_AND_FETCH (with the commit id of the request it answers).
    fn push_command(&self, entry: usize, cmd: u32) -> bool {
        let e = &self.entries[entry];
        let commit_id = if cmd == FUSE_IO_URING_CMD_REGISTER {
            0
        } else {
            e.commit_id.load(Ordering::Acquire)
        };
        let qid = self.qid;
        let _g = self.submit.lock();
        let pushed = self.ring.push(|s| {
            s.opcode = IORING_OP_URING_CMD;
            // The session's /dev/fuse fd, registered as fixed file 0.
            s.flags = IOSQE_FIXED_FILE;
            s.fd = 0;
            s.cmd_op = cmd;
            s.user_data = entry as u64;
            if cmd == FUSE_IO_URING_CMD_REGISTER {
                s.addr = e.iov.as_ptr() as u64;
                s.len = 2;
            }
            // struct fuse_uring_cmd_req { flags, commit_id, qid, pad }.
            s.cmd[8..16].copy_from_slice(&commit_id.to_ne_bytes());
            s.cmd[16..18].copy_from_slice(&qid.to_ne_bytes());
        });
        if pushed && cmd == FUSE_IO_URING_CMD_REGISTER {
            if let Err(e) = self.ring.enter(false, None) {
                warn!("fuse ring {}: registering an entry: {e}", self.qid);
                return false;
            }
        }
        pushed
    }

    /// Commits the answer now in `entry`'s buffers and fetches its next
    /// request. From the queue's thread the submission waits for its next
    /// wait; from any other thread it is submitted at once.
    fn commit(&self, entry: usize) -> io::Result<()> {
        if !self.push_command(entry, FUSE_IO_URING_CMD_COMMIT_AND_FETCH) {
            return Err(io::Error::other("fuse ring: submission ring full"));
        }
        if OWNER.with(|o| o.get()) != self as *const Queue {
            let _g = self.submit.lock();
            self.ring.enter(false, None)?;
        }
        Ok(())
    }

    /// Writes an error answer to `unique` into `entry` and commits it.
    fn answer_error(&self, entry: usize, unique: u64, errno: i32) {
        let e = &self.entries[entry];
        let mut out = [0u8; OUT_HEADER_LEN];
        out[0..4].copy_from_slice(&(OUT_HEADER_LEN as u32).to_ne_bytes());
        out[4..8].copy_from_slice(&(-errno).to_ne_bytes());
        out[8..16].copy_from_slice(&unique.to_ne_bytes());
        // SAFETY: the entry's header mapping is 4096 bytes and ours until
        // the commit.
        unsafe {
            std::ptr::copy_nonoverlapping(out.as_ptr(), e.header.ptr.as_ptr(), OUT_HEADER_LEN);
            e.header
                .at(HEADER_ENT_IN_OUT as u32 + 16)
                .cast::<u32>()
                .write(0);
        }
        if let Err(err) = self.commit(entry) {
            warn!("fuse ring {}: answering a request failed: {err}", self.qid);
        }
    }

    /// Lays the request in `entry` out as /dev/fuse gives it, in `buf`.
    /// Returns its unique and whether it fits (None: the header itself is
    /// unreadable).
    fn lay_out(&self, entry: usize, buf: &mut Vec<u64>) -> Option<(u64, bool)> {
        let e = &self.entries[entry];
        let h = e.header.ptr.as_ptr();
        let mut in_header = [0u8; IN_HEADER_LEN];
        let mut ent = [0u8; 32];
        // SAFETY: the kernel filled the header before the completion; it
        // is ours until the commit.
        unsafe {
            std::ptr::copy_nonoverlapping(h, in_header.as_mut_ptr(), IN_HEADER_LEN);
            std::ptr::copy_nonoverlapping(h.add(HEADER_ENT_IN_OUT), ent.as_mut_ptr(), 32);
        }
        let len = u32::from_ne_bytes(in_header[0..4].try_into().ok()?) as usize;
        let unique = u64::from_ne_bytes(in_header[8..16].try_into().ok()?);
        let commit_id = u64::from_ne_bytes(ent[8..16].try_into().ok()?);
        let payload = u32::from_ne_bytes(ent[16..20].try_into().ok()?) as usize;
        e.commit_id.store(commit_id, Ordering::Release);
        // The header's length counts every argument; the first (the op's
        // own header) is in op_in, the rest in the payload.
        let Some(op_in) = len.checked_sub(IN_HEADER_LEN + payload) else {
            return Some((unique, false));
        };
        if op_in > 128 || payload > self.payload_len {
            return Some((unique, false));
        }
        buf.clear();
        buf.resize(len.div_ceil(8), 0);
        // SAFETY: `buf` holds len bytes (rounded up to whole u64s); the
        // sources are inside the entry's mappings (bounds checked above).
        unsafe {
            let dst = buf.as_mut_ptr().cast::<u8>();
            std::ptr::copy_nonoverlapping(in_header.as_ptr(), dst, IN_HEADER_LEN);
            std::ptr::copy_nonoverlapping(h.add(HEADER_OP_IN), dst.add(IN_HEADER_LEN), op_in);
            std::ptr::copy_nonoverlapping(
                e.payload.ptr.as_ptr(),
                dst.add(IN_HEADER_LEN + op_in),
                payload,
            );
        }
        Some((unique, true))
    }
}

/// The reply side of a queue, handed to fuser with each request.
struct Replies(Arc<Queue>);

impl ExternalReply for Replies {
    fn send(&self, tag: u64, data: &[IoSlice<'_>]) -> io::Result<()> {
        let q = &self.0;
        if q.stopped.load(Ordering::Acquire) {
            return Err(io::Error::new(
                io::ErrorKind::NotConnected,
                "fuse ring stopped",
            ));
        }
        let Some(e) = q.entries.get(tag as usize) else {
            return Err(io::Error::other("fuse ring: no such entry"));
        };
        let total: usize = data.iter().map(|d| d.len()).sum();
        let Some(payload) = total.checked_sub(OUT_HEADER_LEN) else {
            return Err(io::Error::other("fuse ring: reply shorter than its header"));
        };
        // SAFETY: the entry's buffers are this request's until the commit;
        // the payload part is copied only when it fits (checked above).
        unsafe { copy_reply(e, data, payload <= q.payload_len) };
        if payload > q.payload_len {
            // Cannot happen with the sizes negotiated at init; answer EIO
            // rather than leave the caller waiting.
            // SAFETY: inside the entry's header mapping, written above.
            let unique = unsafe { e.header.at(8).cast::<u64>().read_unaligned() };
            q.answer_error(tag as usize, unique, libc::EIO);
            return Ok(());
        }
        // SAFETY: inside the entry's header mapping.
        unsafe {
            e.header
                .at(HEADER_ENT_IN_OUT as u32 + 16)
                .cast::<u32>()
                .write(payload as u32);
        }
        q.commit(tag as usize)
    }
}

/// Copies a reply as fuser gives it (`fuse_out_header` first) into an
/// entry: the header to in_out, the rest (with `payload`) to the payload.
///
/// # Safety
/// The entry's buffers must be the caller's (its request unanswered) and,
/// with `payload`, the reply's rest must fit the payload mapping.
unsafe fn copy_reply(e: &Entry, data: &[IoSlice<'_>], payload: bool) {
    let mut at = 0usize;
    for d in data {
        let mut d: &[u8] = d;
        if at < OUT_HEADER_LEN {
            let n = (OUT_HEADER_LEN - at).min(d.len());
            // SAFETY: at + n <= 16, inside the header mapping.
            unsafe { std::ptr::copy_nonoverlapping(d.as_ptr(), e.header.ptr.as_ptr().add(at), n) };
            at += n;
            d = &d[n..];
        }
        if !d.is_empty() && payload {
            // SAFETY: the caller checked that the whole rest fits.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    d.as_ptr(),
                    e.payload.ptr.as_ptr().add(at - OUT_HEADER_LEN),
                    d.len(),
                )
            };
        }
        at += d.len();
    }
}

/// Checks that this host can carry FUSE over io_uring, with what to do
/// where it cannot.
pub fn check_available() -> Result<(), String> {
    match std::fs::read_to_string(ENABLE_URING) {
        Err(_) => {
            return Err(format!(
                "--fuse-uring: this kernel has no FUSE over io_uring ({ENABLE_URING} is missing; it needs Linux 6.14 or later built with CONFIG_FUSE_IO_URING)"
            ))
        }
        Ok(v) if v.trim() != "Y" => {
            return Err(format!(
                "--fuse-uring: FUSE over io_uring is off on this host ({ENABLE_URING} is {}); as root: echo Y > {ENABLE_URING}",
                v.trim()
            ))
        }
        Ok(_) => {}
    }
    Ring::new(2)
        .map(|_| ())
        .map_err(|e| format!("--fuse-uring: io_uring is not available to this process ({e}; see the kernel.io_uring_disabled sysctl)"))
}

/// The payload buffer each entry needs: the kernel refuses a smaller one
/// than the larger of max_write and its largest read (max_pages).
pub fn payload_len(max_write: u32) -> usize {
    let max_pages = std::fs::read_to_string("/proc/sys/fs/fuse/max_pages_limit")
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok())
        .unwrap_or(256)
        .min(4096);
    (max_write as usize).max(max_pages * 4096).max(8192)
}

/// How many queues the kernel expects: one per possible CPU.
fn possible_cpus() -> usize {
    let from_sys = std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .ok()
        .and_then(|s| {
            s.trim()
                .split(',')
                .filter_map(|r| r.rsplit('-').next()?.parse::<usize>().ok())
                .max()
        })
        .map(|m| m + 1);
    // SAFETY: sysconf has no preconditions.
    from_sys.unwrap_or_else(|| unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) }.max(1) as usize)
}

/// Starts one queue per possible CPU on the session's /dev/fuse fd, each
/// with its entries registered, and returns the function that stops them
/// (fuser calls it when the session ends). Fails, with every queue stopped,
/// if any queue cannot be set up.
pub fn start<FS: Filesystem + Send + Sync + 'static>(
    dispatcher: Dispatcher<FS>,
    fuse: BorrowedFd<'_>,
    depth: usize,
    payload: usize,
    stats: Arc<Stats>,
) -> io::Result<Box<dyn FnOnce() + Send>> {
    let n = possible_cpus();
    let mut queues = Vec::with_capacity(n);
    let mut threads: Vec<JoinHandle<()>> = Vec::with_capacity(n);
    let (ready_tx, ready_rx) = mpsc::channel::<io::Result<()>>();
    let mut failed = None;
    for qid in 0..n {
        let q = match Queue::new(qid as u16, fuse, depth, payload, Arc::clone(&stats)) {
            Ok(q) => Arc::new(q),
            Err(e) => {
                failed = Some(io::Error::new(e.kind(), format!("fuse ring {qid}: {e}")));
                break;
            }
        };
        queues.push(Arc::clone(&q));
        let d = dispatcher.clone();
        let tx = ready_tx.clone();
        match std::thread::Builder::new()
            .name(format!("locafs-ring-{qid}"))
            .spawn(move || run_queue(q, d, tx))
        {
            Ok(t) => threads.push(t),
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    drop(ready_tx);
    drop(dispatcher);
    for _ in 0..threads.len() {
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failed = failed.or(Some(e)),
            Err(_) => failed = failed.or(Some(io::Error::other("fuse ring thread ended"))),
        }
    }
    let stop = move || {
        for q in &queues {
            q.stopped.store(true, Ordering::Release);
            let pushed = {
                let _g = q.submit.lock();
                q.ring.push(|s| {
                    s.opcode = IORING_OP_NOP;
                    s.user_data = WAKE;
                }) && q.ring.enter(false, None).is_ok()
            };
            if !pushed {
                warn!("fuse ring {}: could not wake its thread to stop", q.qid);
            }
        }
        for t in threads {
            let _ = t.join();
        }
        debug!("fuse rings stopped");
    };
    if let Some(e) = failed {
        stop();
        return Err(e);
    }
    info!(
        "FUSE over io_uring: {n} queues of {depth} entries ({} payload each)",
        crate::units::format_size(payload as u64)
    );
    Ok(Box::new(stop))
}

/// A queue's thread: registers the entries, then answers what completes.
fn run_queue<FS: Filesystem + Send + Sync + 'static>(
    q: Arc<Queue>,
    dispatcher: Dispatcher<FS>,
    ready: mpsc::Sender<io::Result<()>>,
) {
    pin_to_cpu(q.qid as usize);
    OWNER.with(|o| o.set(Arc::as_ptr(&q)));
    let sink: Arc<dyn ExternalReply> = Arc::new(Replies(Arc::clone(&q)));
    if let Err(e) = q.ring.register_file(q.fuse.as_raw_fd()) {
        let _ = ready.send(Err(io::Error::new(
            e.kind(),
            format!(
                "fuse ring {}: registering /dev/fuse with the ring: {e}",
                q.qid
            ),
        )));
        return;
    }
    let own = q.ring.register_for_thread();
    let mut registered = 0;
    for i in 0..q.entries.len() {
        if q.push_command(i, FUSE_IO_URING_CMD_REGISTER) {
            registered += 1;
        }
    }
    // A refused registration completes at once, with its error.
    let mut done = Vec::new();
    q.ring.completions(&mut done);
    let refused = done.iter().find(|(_, res)| *res < 0).map(|(_, res)| *res);
    if registered < q.entries.len() || refused.is_some() {
        let e = refused.map_or_else(
            || io::Error::other("could not register every entry"),
            io::Error::from_raw_os_error,
        );
        let _ = ready.send(Err(io::Error::new(
            e.kind(),
            format!("fuse ring {}: the kernel refused its entries: {e}", q.qid),
        )));
        return;
    }
    let _ = ready.send(Ok(()));
    drop(ready);
    let mut live = q.entries.len();
    let mut buf: Vec<u64> = Vec::new();
    loop {
        for (user_data, res) in done.drain(..) {
            if user_data == WAKE {
                if q.stopped.load(Ordering::Acquire) {
                    return;
                }
                continue;
            }
            let entry = user_data as usize;
            if entry >= q.entries.len() {
                continue;
            }
            if res < 0 {
                match -res {
                    libc::EINTR | libc::EAGAIN => {
                        // Fetch again; no request was taken.
                        let cmd = if q.entries[entry].commit_id.load(Ordering::Acquire) == 0 {
                            FUSE_IO_URING_CMD_REGISTER
                        } else {
                            FUSE_IO_URING_CMD_COMMIT_AND_FETCH
                        };
                        if q.push_command(entry, cmd) {
                            continue;
                        }
                    }
                    libc::ENOTCONN | libc::ENODEV => {}
                    e => warn!(
                        "fuse ring {}: entry {entry} ended: {}",
                        q.qid,
                        io::Error::from_raw_os_error(e)
                    ),
                }
                live -= 1;
                continue;
            }
            q.stats.fuse_ring_requests.fetch_add(1, Ordering::Relaxed);
            match q.lay_out(entry, &mut buf) {
                Some((unique, true)) => {
                    // SAFETY: `buf` holds the request's bytes, u64-aligned.
                    let bytes = unsafe {
                        std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), buf.len() * 8)
                    };
                    if !dispatcher.dispatch(bytes, &sink, entry as u64) {
                        q.answer_error(entry, unique, libc::EIO);
                    }
                }
                Some((unique, false)) => {
                    warn!(
                        "fuse ring {}: a request that does not fit its entry; answered EIO",
                        q.qid
                    );
                    q.answer_error(entry, unique, libc::EIO);
                }
                None => q.answer_error(entry, 0, libc::EIO),
            }
        }
        if live == 0 || q.stopped.load(Ordering::Acquire) {
            return;
        }
        if let Err(e) = q.ring.enter(true, own) {
            warn!("fuse ring {}: waiting for requests failed: {e}", q.qid);
            return;
        }
        q.ring.completions(&mut done);
    }
}

/// Keeps a queue's thread on the CPU whose requests it takes (best effort).
fn pin_to_cpu(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is empty; CPU_SET stays inside it for
    // cpu < CPU_SETSIZE, checked.
    unsafe {
        if cpu >= libc::CPU_SETSIZE as usize {
            return;
        }
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}
