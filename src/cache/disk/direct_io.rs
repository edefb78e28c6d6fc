//! Writing block data to the cache disk with O_DIRECT: the data files'
//! descriptors, and at most `BOUNCE_MAX` aligned bounce buffers for bytes
//! that are not aligned already (a fixed few blocks of memory whatever the
//! number of writes in flight). A file system that refuses O_DIRECT turns it
//! off for good, with one log line; blocks then go through the page cache.
//!
//! Must never: hold more than `BOUNCE_MAX` buffers, or leave a data file
//! longer than its source file (the kernel reads a passthrough file to its
//! end).

use std::io;
use std::os::unix::fs::FileExt;

use super::{info, Core, File, OFlags, Ordering, PrivateDir};

/// A data file open for writing blocks, and whether it was opened with
/// O_DIRECT.
pub(super) struct DataFile {
    pub(super) file: File,
    pub(super) direct: bool,
    /// Its fan-out directory and name (a buffered descriptor for the tail
    /// is opened there).
    pub(super) dir: PrivateDir,
    pub(super) name: String,
}

/// How a block is written: straight to the disk, or through the page cache
/// because the loader will read it soon (see [`BlockStore::put_ahead`]) or
/// because other blocks of its file are being written at the same time.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Via {
    Direct,
    PageCache,
}

/// Direct I/O alignment (offsets, lengths and buffer addresses).
pub(super) const DIRECT_ALIGN: usize = 4096;

/// Bounce buffers for direct writes, at most: a writer beyond that waits for
/// one, so the copies stay a fixed few blocks of memory whatever the number
/// of writes in flight.
pub(super) const BOUNCE_MAX: usize = 16;

#[derive(Default)]
pub(super) struct Bounce {
    pub(super) free: Vec<Vec<u8>>,
    pub(super) made: usize,
}

impl Core {
    /// Opens (or creates: a new file, `AlreadyExists` if there is one) a
    /// data file for writing blocks: with
    /// O_DIRECT while the file system takes it, so block data goes from our
    /// buffer to the disk without a copy into the page cache (the loader
    /// already has these bytes in its own page cache; a second copy costs a
    /// memory copy per byte, and in VMs that hand freed memory back to the
    /// host, a page fault on the host per 4 KiB: the larger part of the
    /// daemon's CPU on a cold pass). Falls back to buffered writes for good
    /// when the file system refuses O_DIRECT. `Via::PageCache` (blocks the
    /// loader has yet to read) opens it buffered.
    pub(super) fn open_data(
        &self,
        dir: &PrivateDir,
        name: &str,
        create: bool,
        via: Via,
    ) -> io::Result<DataFile> {
        let mut o = OFlags::WRONLY;
        if create {
            o |= OFlags::CREATE | OFlags::EXCL;
        }
        let data_file = |file, direct| DataFile {
            file,
            direct,
            dir: dir.clone(),
            name: name.to_owned(),
        };
        if via == Via::Direct && self.direct.load(Ordering::Relaxed) {
            match dir.open_file(name, o | OFlags::DIRECT) {
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => self.direct_refused(&e),
                r => return r.map(|file| data_file(file, true)),
            }
        }
        dir.open_file(name, o).map(|file| data_file(file, false))
    }

    /// A bounce buffer (one block plus the alignment), waiting for one if
    /// `BOUNCE_MAX` are in use.
    pub(super) fn take_bounce(&self) -> Vec<u8> {
        let mut b = self.bounce.lock();
        loop {
            if let Some(buf) = b.free.pop() {
                return buf;
            }
            if b.made < BOUNCE_MAX {
                b.made += 1;
                drop(b);
                return vec![0u8; self.block_size as usize + DIRECT_ALIGN];
            }
            self.bounce_free.wait(&mut b);
        }
    }

    pub(super) fn direct_refused(&self, e: &io::Error) {
        if self.direct.swap(false, Ordering::Relaxed) {
            info!("cache: the cache directory's file system refuses direct I/O ({e}); writing blocks through the page cache");
        }
    }

    /// Writes one block's data at `offset` of data file `d` (see
    /// [`Self::open_data`]). A direct write goes through an aligned bounce
    /// buffer, unless the bytes are aligned already (as the source's direct
    /// reads leave them). Only the last block of a file can end off the alignment: its
    /// tail (under 4 KiB) is written through the page cache by a second,
    /// buffered descriptor, so the file ends exactly at the source file's
    /// size without padding to cut back (a truncate to an unaligned size
    /// reads the last disk block back to zero its end: a synchronous read
    /// per cached file).
    pub(super) fn write_data(&self, d: &DataFile, offset: u64, data: &[u8]) -> io::Result<()> {
        if !d.direct {
            d.file.write_all_at(data, offset)?;
            return Ok(());
        }
        // Blocks are at most block_size, a multiple of the alignment.
        let (head, tail) = data.split_at(data.len() / DIRECT_ALIGN * DIRECT_ALIGN);
        if !head.is_empty() {
            let res = if head.as_ptr().align_offset(DIRECT_ALIGN) == 0 {
                // Bytes read from the source with O_DIRECT are aligned
                // already: written as they are, without a copy.
                d.file.write_all_at(head, offset)
            } else {
                let mut buf = self.take_bounce();
                let start = buf.as_ptr().align_offset(DIRECT_ALIGN);
                let res = {
                    let aligned = &mut buf[start..start + head.len()];
                    aligned.copy_from_slice(head);
                    d.file.write_all_at(aligned, offset)
                };
                self.bounce.lock().free.push(buf);
                self.bounce_free.notify_one();
                res
            };
            match res {
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    // The device wants a larger alignment: buffered from now
                    // on (O_DIRECT can be cleared on the open descriptor).
                    self.direct_refused(&e);
                    crate::sys::set_direct(&d.file, false)?;
                    d.file.write_all_at(head, offset)?;
                }
                Err(e) => return Err(e),
                Ok(()) => {}
            }
        }
        if !tail.is_empty() {
            d.dir
                .open_file(&d.name, OFlags::WRONLY)?
                .write_all_at(tail, offset + head.len() as u64)?;
        }
        Ok(())
    }
}
