//! The state that outlives a serving process: one memfd, created by the
//! process that holds the mount (the holder, `supervisor`) and mapped by
//! each server in turn, that holds what the kernel may ask about after a
//! server dies: the namespace's inode records and names, the open file
//! handles and the passthrough backing ids registered on the connection,
//! the POSIX ACLs the namespace read, what the INIT handshake settled, and
//! the supervisor's own counters.
//! docs/architecture.md ("The mount outlives its process") has the design.
//!
//! The memfd is one sparse file of fixed regions (a header page, then one
//! region per table at a fixed offset with room for its largest size:
//! pages are only allocated when written), mapped whole once, so a table
//! grows without moving and a new process finds each where the last left
//! it. A [`ShmVec`] is a growable array in one region whose length lives in
//! the header: an element is written before the length that publishes it.
//!
//! Everything here is plain data (`repr(C)`, [`Pod`]): no pointer, no heap
//! data, nothing that means something in one process only. It must never
//! be written in an order that a process killed between two stores would
//! leave unusable: callers publish a record only once it is whole, and mark
//! (in the header's intents) what a multi-store change is in the middle of.
//! A leaf: it imports nothing from the crate.

use std::io;
use std::marker::PhantomData;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

/// "LOCAFS" and the layout's version: a process whose layout differs
/// refuses the state (a takeover by such a binary is refused).
const MAGIC: u64 = u64::from_le_bytes(*b"LOCAFSst");
/// The version of everything laid out in the memfd (header, regions and
/// every record type stored in them). Bump it whenever any of them change.
pub const LAYOUT: u64 = 2;

/// A type that may live in the shared state: plain data, the same bytes in
/// every process (`repr(C)`, no pointers, no `Drop`).
///
/// # Safety
/// Implement only for `repr(C)` (or primitive) types without pointers,
/// references, heap data or padding-dependent invariants, for which every
/// byte pattern a previous process stored is a valid value.
pub unsafe trait Pod: Sized + 'static {}

unsafe impl Pod for u8 {}
unsafe impl Pod for u32 {}
unsafe impl Pod for u64 {}
unsafe impl Pod for [u32; 5] {}

/// The tables of the shared state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub enum Region {
    /// The namespace's inode records (48 bytes each).
    Nodes,
    /// The namespace's name arena, and the other one a compaction writes
    /// (`Header::names_active` says which is live).
    NamesA,
    NamesB,
    /// A directory's size and when it was listed, by directory index.
    Dirs,
    /// Interned attribute classes (mode, uid, gid, nlink, rdev).
    Classes,
    /// st_blocks of the few inodes whose blocks are not their size rounded.
    OddBlocks,
    /// Open file handles.
    Handles,
    /// Passthrough backing ids registered on the connection.
    Backings,
    /// The distinct POSIX ACL values the namespace holds, back to back.
    AclValues,
    /// Which entry has which ACL value (a log, the last entry of an inode
    /// wins; 8 bytes each): only entries that have, or had, an ACL.
    AclLog,
}

const REGIONS: usize = 10;

/// Element size and most elements of each region, in [`Region`] order.
const SPECS: [(usize, u64); REGIONS] = [
    (48, 1 << 32),
    (1, 1 << 32),
    (1, 1 << 32),
    (16, 1 << 32),
    (20, 1 << 24),
    (16, 1 << 26),
    (64, 1 << 24),
    (16, 1 << 24),
    (1, 1 << 31),
    (8, 1 << 28),
];

/// Bytes of the header (one page rounded up to the regions' alignment).
const HEADER_BYTES: u64 = 1 << 21;
/// Regions start on 2 MiB boundaries.
const ALIGN: u64 = 1 << 21;

/// Where each region starts, and the size of the whole file.
const fn offsets() -> ([u64; REGIONS], u64) {
    let mut at = [0u64; REGIONS];
    let mut off = HEADER_BYTES;
    let mut i = 0;
    while i < REGIONS {
        at[i] = off;
        let bytes = SPECS[i].0 as u64 * SPECS[i].1;
        off += bytes.div_ceil(ALIGN) * ALIGN;
        i += 1;
    }
    (at, off)
}

/// The header: counters and settings shared by the holder and the
/// servers, and the length of every region. All fields are atomics: the
/// holder and a server may read and write them at once.
#[repr(C)]
pub struct Header {
    magic: AtomicU64,
    layout: AtomicU64,
    lens: [AtomicU64; REGIONS],
    /// Set once a server built the namespace here (a later one attaches).
    pub ns_ready: AtomicU32,
    /// Which name arena is live: 0 for `NamesA`, 1 for `NamesB`.
    pub names_active: AtomicU32,
    /// 1 + the arena a compaction switches to, while it rewrites the
    /// names' offsets into it (it is whole; a new server finishes the
    /// switch); 0 otherwise.
    pub names_switching: AtomicU32,
    _pad0: AtomicU32,
    /// The inode whose record a change is in the middle of (0: none).
    pub intent_node: AtomicU64,
    /// The directory whose listing a change is in the middle of (0: none).
    pub intent_dir: AtomicU64,
    /// The namespace's clock origin, CLOCK_MONOTONIC in ns (every server's
    /// "checked" ticks count from it).
    pub started_mono_ns: AtomicU64,
    /// The next file handle number (never reused while the mount lives).
    pub next_fh: AtomicU64,
    /// The namespace's total of file sizes seen (what it reports to the
    /// cache policy).
    pub known_bytes: AtomicU64,
    /// What the INIT handshake settled (`INIT_*` bits), once
    /// `init_done` is 1, and the kernel's FUSE minor version.
    pub init_done: AtomicU32,
    pub proto_minor: AtomicU32,
    pub init_flags: AtomicU64,
    /// The holder's pid, and the pid of the server serving now (0 between
    /// two).
    pub supervisor_pid: AtomicU32,
    pub server_pid: AtomicU32,
    /// Servers started after the first, for any reason.
    pub restarts: AtomicU64,
    /// Unix time in ms of the last restart, why (`REASON_*`) and its
    /// detail (the signal, or the exit status).
    pub last_restart_ms: AtomicU64,
    pub last_reason: AtomicU32,
    pub last_detail: AtomicI32,
    /// Requests the servers took so far (the holder's measure of a
    /// server's progress: one that dies before it answered a few is in a
    /// crash loop).
    pub answered: AtomicU64,
    /// CLOCK_MONOTONIC ns when the current server was started.
    pub server_started_mono_ns: AtomicU64,
    /// A hash of the options that cannot change on a live mount (the
    /// holder's; a holder that gets the state back from systemd checks
    /// its own against it).
    pub fixed_options: AtomicU64,
}

/// `Header::init_flags`: passthrough was granted at INIT.
pub const INIT_PASSTHROUGH: u64 = 1;
/// `Header::init_flags`: the kernel opens files without OPEN
/// (`--open-mode kernel` granted).
pub const INIT_KERNEL_OPEN: u64 = 2;

/// Why the last server was replaced (`Header::last_reason`).
pub const REASON_NONE: u32 = 0;
pub const REASON_SIGNAL: u32 = 1;
pub const REASON_EXIT: u32 = 2;
pub const REASON_WATCHDOG: u32 = 3;
pub const REASON_TAKEOVER: u32 = 4;

/// The name of a `REASON_*` for stats and logs.
pub fn reason_name(r: u32) -> &'static str {
    match r {
        REASON_SIGNAL => "signal",
        REASON_EXIT => "exit",
        REASON_WATCHDOG => "watchdog",
        REASON_TAKEOVER => "takeover",
        _ => "none",
    }
}

const _: () = assert!(std::mem::size_of::<Header>() <= HEADER_BYTES as usize);

/// The shared state, mapped in this process.
pub struct SharedState {
    fd: OwnedFd,
    base: NonNull<u8>,
    len: usize,
    /// Regions a [`ShmVec`] of this process holds (one at a time each).
    taken: AtomicU32,
}

// SAFETY: the mapping is shared memory; all access goes through atomics
// (the header) or through a ShmVec, which follows Vec's rules.
unsafe impl Send for SharedState {}
unsafe impl Sync for SharedState {}

impl std::fmt::Debug for SharedState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedState")
            .field("len", &self.len)
            .finish()
    }
}

impl SharedState {
    /// A new, empty state in a new memfd (no pages allocated yet).
    pub fn create() -> io::Result<Arc<SharedState>> {
        let fd = rustix::fs::memfd_create("locafs-state", rustix::fs::MemfdFlags::CLOEXEC)?;
        let (_, total) = offsets();
        rustix::fs::ftruncate(&fd, total)?;
        let st = Self::map(fd)?;
        st.header().magic.store(MAGIC, Ordering::Relaxed);
        st.header().layout.store(LAYOUT, Ordering::Release);
        Ok(Arc::new(st))
    }

    /// Maps a state that another process created (a descriptor it passed
    /// on); refused if it is not one, or of another layout.
    pub fn open(fd: OwnedFd) -> io::Result<Arc<SharedState>> {
        let (_, total) = offsets();
        let size = rustix::fs::fstat(&fd)?.st_size as u64;
        if size != total {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("not a locafs state of layout {LAYOUT} (size {size})"),
            ));
        }
        let st = Self::map(fd)?;
        let h = st.header();
        if h.magic.load(Ordering::Relaxed) != MAGIC {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "not a locafs state",
            ));
        }
        let layout = h.layout.load(Ordering::Acquire);
        if layout != LAYOUT {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("the mount's state has layout {layout}, this locafs reads layout {LAYOUT}"),
            ));
        }
        Ok(Arc::new(st))
    }

    fn map(fd: OwnedFd) -> io::Result<SharedState> {
        use rustix::mm::{mmap, MapFlags, ProtFlags};
        let (_, total) = offsets();
        let len = usize::try_from(total).map_err(|_| io::Error::other("state too large"))?;
        // SAFETY: a new mapping of our own descriptor, of its whole size.
        let p = unsafe {
            mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED | MapFlags::NORESERVE,
                &fd,
                0,
            )?
        };
        let base = NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap"))?;
        Ok(SharedState {
            fd,
            base,
            len,
            taken: AtomicU32::new(0),
        })
    }

    /// The descriptor, to pass on to another process.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    pub fn header(&self) -> &Header {
        // SAFETY: the header is at the start of the mapping, within it, and
        // made only of atomics (any bytes are a valid value).
        unsafe { &*self.base.as_ptr().cast::<Header>() }
    }

    /// The array in `region`, for this process alone until it is dropped;
    /// None if another `ShmVec` of this process holds it. `T` must be the
    /// region's element type (its size is checked).
    pub fn vec<T: Pod>(self: &Arc<Self>, region: Region) -> Option<ShmVec<T>> {
        let i = region as usize;
        assert_eq!(
            std::mem::size_of::<T>(),
            SPECS[i].0,
            "{region:?} holds elements of {} bytes",
            SPECS[i].0
        );
        let bit = 1u32 << i;
        if self.taken.fetch_or(bit, Ordering::AcqRel) & bit != 0 {
            return None;
        }
        let (at, _) = offsets();
        // SAFETY: the region lies within the mapping (offsets() and the
        // file's size agree) and is aligned to 2 MiB.
        let ptr = unsafe { self.base.as_ptr().add(at[i] as usize) }.cast::<T>();
        Some(ShmVec {
            state: Arc::clone(self),
            region,
            ptr: NonNull::new(ptr)?,
            cap: SPECS[i].1 as usize,
            _t: PhantomData,
        })
    }

    fn len_of(&self, region: Region) -> &AtomicU64 {
        &self.header().lens[region as usize]
    }

    /// Gives a region's pages back to the system (its contents become
    /// zeros).
    fn release(&self, region: Region) {
        let (at, _) = offsets();
        let i = region as usize;
        let bytes = SPECS[i].0 as u64 * SPECS[i].1;
        let _ = rustix::fs::fallocate(
            &self.fd,
            rustix::fs::FallocateFlags::PUNCH_HOLE | rustix::fs::FallocateFlags::KEEP_SIZE,
            at[i],
            bytes,
        );
    }

    /// Bytes of memory the state's pages take now (for stats and
    /// benchmarks).
    pub fn resident_bytes(&self) -> u64 {
        rustix::fs::fstat(&self.fd)
            .map(|s| s.st_blocks as u64 * 512)
            .unwrap_or(0)
    }
}

impl Drop for SharedState {
    fn drop(&mut self) {
        // SAFETY: our own mapping, no ShmVec left (each holds the Arc).
        unsafe {
            let _ = rustix::mm::munmap(self.base.as_ptr().cast(), self.len);
        }
    }
}

/// A growable array in one region of the shared state: a `Vec` whose
/// elements and length outlive the process. [`ShmVec::push`] writes the
/// element, then publishes it by storing the new length.
pub struct ShmVec<T: Pod> {
    state: Arc<SharedState>,
    region: Region,
    ptr: NonNull<T>,
    cap: usize,
    _t: PhantomData<T>,
}

// SAFETY: like Vec<T>: the elements are only reached through &self/&mut self.
unsafe impl<T: Pod + Send> Send for ShmVec<T> {}
unsafe impl<T: Pod + Sync> Sync for ShmVec<T> {}

/// A region is full (its table reached its most elements).
#[derive(Debug)]
pub struct Full;

impl<T: Pod> ShmVec<T> {
    fn len_cell(&self) -> &AtomicU64 {
        self.state.len_of(self.region)
    }

    pub fn state(&self) -> &Arc<SharedState> {
        &self.state
    }

    /// The most elements it can hold.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Appends `v`; `Full` at the region's capacity.
    pub fn push(&mut self, v: T) -> Result<(), Full> {
        let n = self.len();
        if n >= self.cap {
            return Err(Full);
        }
        // SAFETY: n < cap: within the region, and not part of any slice
        // handed out (they end at len).
        unsafe { self.ptr.as_ptr().add(n).write(v) };
        self.len_cell().store(n as u64 + 1, Ordering::Release);
        Ok(())
    }

    /// Removes every element (the pages stay until
    /// [`ShmVec::clear_and_release`]).
    pub fn truncate(&mut self, n: usize) {
        if n < self.len() {
            self.len_cell().store(n as u64, Ordering::Release);
        }
    }

    /// Empties the array and gives its memory back.
    pub fn clear_and_release(&mut self) {
        self.len_cell().store(0, Ordering::Release);
        self.state.release(self.region);
    }
}

impl<T: Pod + Copy> ShmVec<T> {
    /// Appends every element of `s`; `Full` (and nothing added) if they do
    /// not all fit.
    pub fn extend_from_slice(&mut self, s: &[T]) -> Result<(), Full> {
        let n = self.len();
        if s.len() > self.cap - n {
            return Err(Full);
        }
        // SAFETY: within the region, past every slice handed out.
        unsafe {
            std::ptr::copy_nonoverlapping(s.as_ptr(), self.ptr.as_ptr().add(n), s.len());
        }
        self.len_cell()
            .store((n + s.len()) as u64, Ordering::Release);
        Ok(())
    }
}

impl<T: Pod> std::ops::Deref for ShmVec<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        let n = (self.len_cell().load(Ordering::Acquire) as usize).min(self.cap);
        // SAFETY: elements 0..n were written (published by the length) and
        // lie within the region.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), n) }
    }
}

impl<T: Pod> std::ops::DerefMut for ShmVec<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        let n = (self.len_cell().load(Ordering::Acquire) as usize).min(self.cap);
        // SAFETY: as in deref, and &mut self is the only way in.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), n) }
    }
}

impl<T: Pod> Drop for ShmVec<T> {
    fn drop(&mut self) {
        let bit = 1u32 << self.region as usize;
        self.state.taken.fetch_and(!bit, Ordering::AcqRel);
    }
}

impl<T: Pod + std::fmt::Debug> std::fmt::Debug for ShmVec<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmVec")
            .field("region", &self.region)
            .field("len", &self.len())
            .finish()
    }
}

/// CLOCK_MONOTONIC now, in ns (the clock `std::time::Instant` reads, the
/// same in every process).
pub fn monotonic_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[repr(C)]
    #[derive(Clone, Copy, Debug, PartialEq)]
    struct Rec {
        a: u64,
        b: u64,
    }
    unsafe impl Pod for Rec {}

    #[test]
    fn tables_outlive_the_process_view_that_wrote_them() {
        let st = SharedState::create().unwrap();
        {
            let mut v: ShmVec<Rec> = st.vec(Region::Backings).unwrap();
            assert!(
                st.vec::<Rec>(Region::Backings).is_none(),
                "one holder at a time"
            );
            v.push(Rec { a: 1, b: 2 }).unwrap();
            v.push(Rec { a: 3, b: 4 }).unwrap();
            v[1].b = 5;
            let mut names: ShmVec<u8> = st.vec(Region::NamesA).unwrap();
            names.extend_from_slice(b"hello").unwrap();
            st.header().restarts.store(7, Ordering::Relaxed);
        }
        // Another mapping of the same memfd (another process gets it the
        // same way: a descriptor passed on).
        let fd = rustix::io::fcntl_dupfd_cloexec(st.fd(), 0).unwrap();
        let again = SharedState::open(fd).unwrap();
        let v: ShmVec<Rec> = again.vec(Region::Backings).unwrap();
        assert_eq!(&v[..], &[Rec { a: 1, b: 2 }, Rec { a: 3, b: 5 }]);
        let names: ShmVec<u8> = again.vec(Region::NamesA).unwrap();
        assert_eq!(&names[..], b"hello");
        assert_eq!(again.header().restarts.load(Ordering::Relaxed), 7);
    }

    #[test]
    fn a_released_region_gives_its_memory_back() {
        let st = SharedState::create().unwrap();
        let before = st.resident_bytes();
        let mut names: ShmVec<u8> = st.vec(Region::NamesB).unwrap();
        names.extend_from_slice(&vec![7u8; 8 << 20]).unwrap();
        assert!(st.resident_bytes() >= before + (8 << 20));
        names.clear_and_release();
        assert!(names.is_empty());
        assert!(st.resident_bytes() < before + (1 << 20));
    }

    #[test]
    fn anything_but_a_state_of_this_layout_is_refused() {
        let f = rustix::fs::memfd_create("x", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        assert!(SharedState::open(f).is_err());
        let st = SharedState::create().unwrap();
        st.header().layout.store(LAYOUT + 1, Ordering::Relaxed);
        let fd = rustix::io::fcntl_dupfd_cloexec(st.fd(), 0).unwrap();
        let e = SharedState::open(fd).unwrap_err().to_string();
        assert!(e.contains("layout"), "{e}");
    }
}
