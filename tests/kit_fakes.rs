//! The test kit's fakes (`locafs::testing`, the one set the unit tests,
//! the integration tests and the benches use) answer as the real things do
//! wherever they inject nothing: `MemSource` as a `DirSource` over the same
//! tree (errors, ACLs and changes in place included), a hooked source as
//! its directory, `MemCache` as a `DiskCache` for the blocks it is given
//! (every kind of write), `MemComplete` as the `DiskCache`'s complete
//! files; and each injects what it says (a stall or a hold keeps every
//! call, a gate every write or read, a cache refuses, is full, or has
//! another write of a block in flight, the fake kernel registers or
//! refuses backings). A fake that drifted from its seam's contract would
//! let tests pass that the real thing fails. No root needed.

mod common;

use std::io;
use std::path::Path;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::wait_until;
use locafs::cache::disk::DiskCache;
use locafs::cache::{BlockStore, ChecksummedBytes, CompleteFiles, FileVersion};
use locafs::source::{Acls, DirSource, Source, SourceError, SourceVersion};
use locafs::testing::{
    GatedCache, Kernel, MemCache, MemComplete, MemSource, NoSource, SlowSource, StallSource,
};

/// The same small tree in a directory and in memory.
fn twin_sources() -> (tempfile::TempDir, DirSource, MemSource) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let mem = MemSource::new();
    for (rel, data) in [
        ("a", &b"hello, world"[..]),
        ("d/b", &[7u8; 5000][..]),
        ("d/e/c", &b""[..]),
    ] {
        std::fs::create_dir_all(root.join(rel).parent().unwrap()).unwrap();
        std::fs::write(root.join(rel), data).unwrap();
        mem.put_file(rel, Bytes::copy_from_slice(data));
    }
    std::fs::create_dir(root.join("empty")).unwrap();
    mem.mkdir("empty");
    std::os::unix::fs::symlink("a", root.join("l")).unwrap();
    mem.symlink("l", "a");
    let dir_source = DirSource::new(root.to_owned());
    (dir, dir_source, mem)
}

/// Runs `call` on a thread of its own and checks that it is held (one call
/// `waiting`, not finished) until `release`; its answer.
fn held_until<T: Send + 'static>(
    waiting: impl Fn() -> u64,
    call: impl FnOnce() -> T + Send + 'static,
    release: impl FnOnce(),
) -> T {
    let call = std::thread::spawn(call);
    wait_until("the call to be held", Duration::from_secs(10), || {
        waiting() == 1
    });
    assert!(!call.is_finished(), "answered while held");
    release();
    call.join().unwrap()
}

fn errno<T>(r: io::Result<T>) -> Option<i32> {
    r.err().and_then(|e| e.raw_os_error())
}

/// What a read gave, without the bytes' provenance: Ok(bytes), or which
/// error.
fn read(
    s: &dyn Source,
    rel: &str,
    v: &SourceVersion,
    off: u64,
    len: usize,
) -> Result<Bytes, &'static str> {
    s.read_at(Path::new(rel), v, off, len).map_err(|e| match e {
        SourceError::NotFound { .. } => "NotFound",
        SourceError::Changed { .. } => "Changed",
        SourceError::Io { .. } => "Io",
    })
}

#[test]
fn mem_source_answers_as_a_directory_does() {
    let (dir, real, mem) = twin_sources();
    let sources: [&dyn Source; 2] = [&real, &mem];
    // Listings, kinds and sizes.
    for rel in ["", "d", "d/e", "empty"] {
        let names = |s: &dyn Source| {
            let mut v: Vec<_> = s
                .list(Path::new(rel))
                .unwrap()
                .into_iter()
                .map(|(n, a)| {
                    (
                        n,
                        a.kind,
                        if a.kind == locafs::source::EntryKind::Dir {
                            0
                        } else {
                            a.size
                        },
                    )
                })
                .collect();
            v.sort_by(|x, y| x.0.cmp(&y.0));
            v
        };
        assert_eq!(names(&real), names(&mem), "listing of {rel:?}");
    }
    for rel in ["a", "d/b", "d/e/c", "l", "empty"] {
        let (r, m) = (
            real.stat(Path::new(rel)).unwrap(),
            mem.stat(Path::new(rel)).unwrap(),
        );
        assert_eq!(r.kind, m.kind, "{rel}");
        assert_eq!(r.mode & libc::S_IFMT, m.mode & libc::S_IFMT, "{rel}");
        if r.kind != locafs::source::EntryKind::Dir {
            assert_eq!(r.size, m.size, "{rel}");
        }
    }
    assert_eq!(
        real.read_link(Path::new("l")).unwrap(),
        mem.read_link(Path::new("l")).unwrap()
    );
    // The same errors.
    for s in sources {
        assert_eq!(errno(s.stat(Path::new("missing"))), Some(libc::ENOENT));
        assert_eq!(errno(s.list(Path::new("missing"))), Some(libc::ENOENT));
        assert_eq!(errno(s.list(Path::new("a"))), Some(libc::ENOTDIR));
        assert_eq!(errno(s.read_link(Path::new("a"))), Some(libc::EINVAL));
        assert!(s.statvfs().is_ok());
    }
    // Reads: exact bytes of the version asked for, Changed past the end or
    // for another version, NotFound for a missing file.
    let (vr_a, vm_a) = (
        real.stat(Path::new("a")).unwrap().version(),
        mem.stat(Path::new("a")).unwrap().version(),
    );
    let (vr, vm) = (
        real.stat(Path::new("d/b")).unwrap().version(),
        mem.stat(Path::new("d/b")).unwrap().version(),
    );
    for (off, len) in [(0, 5000), (100, 1000), (4999, 1), (0, 0)] {
        assert_eq!(
            read(&real, "d/b", &vr, off, len),
            read(&mem, "d/b", &vm, off, len)
        );
    }
    assert_eq!(read(&real, "d/b", &vr, 4000, 2000), Err("Changed"));
    assert_eq!(read(&mem, "d/b", &vm, 4000, 2000), Err("Changed"));
    assert_eq!(read(&real, "gone", &vr, 0, 1), Err("NotFound"));
    assert_eq!(read(&mem, "gone", &vm, 0, 1), Err("NotFound"));
    // Replaced at the source: a new version; the old one is never read.
    std::fs::write(dir.path().join("d/b.new"), [8u8; 5000]).unwrap();
    std::fs::rename(dir.path().join("d/b.new"), dir.path().join("d/b")).unwrap();
    let vm2 = mem.put_file("d/b", vec![8u8; 5000]);
    assert_ne!(vm, vm2);
    assert_eq!(read(&real, "d/b", &vr, 0, 10), Err("Changed"));
    assert_eq!(read(&mem, "d/b", &vm, 0, 10), Err("Changed"));
    assert_eq!(read(&mem, "d/b", &vm2, 0, 3).unwrap(), &[8u8; 3][..]);
    // Changed in place: the same inode, a new version.
    std::fs::write(dir.path().join("a"), b"HELLO, WORLD!").unwrap();
    mem.write("a", b"HELLO, WORLD!");
    for (s, v0) in [(sources[0], vr_a), (sources[1], vm_a)] {
        let v1 = s.stat(Path::new("a")).unwrap().version();
        assert_eq!((v1.ino, v1.size), (v0.ino, 13));
        assert_ne!(v1, v0);
        assert_eq!(read(s, "a", &v0, 0, 5), Err("Changed"));
        assert_eq!(read(s, "a", &v1, 0, 5).unwrap(), &b"HELLO"[..]);
    }
    // ACLs: none on a plain entry, ENOENT for a missing one.
    for s in sources {
        assert!(s.has_acls());
        assert_eq!(s.acls(Path::new("a")).unwrap(), Acls::default());
        assert_eq!(errno(s.acls(Path::new("missing"))), Some(libc::ENOENT));
    }
    mem.remove("d");
    assert_eq!(errno(mem.stat(Path::new("d/e/c"))), Some(libc::ENOENT));
    assert!(mem.calls.load(SeqCst) > 0 && mem.reads.load(SeqCst) > 0);
    assert!(mem.metadata_calls.load(SeqCst) > 0 && mem.acl_calls.load(SeqCst) == 2);
}

#[test]
fn mem_source_injects_acls_and_holds() {
    let mem = Arc::new(MemSource::new());
    mem.put_file("a", &b"x"[..]);
    let acls = Acls {
        access: Some(vec![2, 0, 0, 0].into_boxed_slice()),
        default: None,
    };
    mem.set_acls("a", acls.clone());
    assert_eq!(mem.acls(Path::new("a")).unwrap(), acls);
    // Held: every call waits until the source resumes, then answers.
    mem.hold();
    let m = Arc::clone(&mem);
    let held = held_until(
        || mem.waiting(),
        move || m.stat(Path::new("a")).map(|a| a.size),
        || mem.resume(),
    );
    assert_eq!(held.unwrap(), 1);
    assert_eq!(mem.waiting(), 0);
}

#[test]
fn hooked_sources_answer_as_their_directory_and_see_every_call() {
    let (dir, real, _) = twin_sources();
    let slow = SlowSource::new(dir.path(), Duration::from_millis(1), 0);
    let v = real.stat(Path::new("d/b")).unwrap().version();
    assert_eq!(
        read(&slow, "d/b", &v, 10, 100),
        read(&real, "d/b", &v, 10, 100)
    );
    assert_eq!(slow.list(Path::new("d")).unwrap().len(), 2);
    assert_eq!(slow.read_link(Path::new("l")).unwrap(), Path::new("a"));
    slow.statvfs().unwrap();
    assert_eq!(slow.metadata_ops.load(SeqCst), 2, "list and readlink");
    let reads = slow.reads();
    assert_eq!(reads.len(), 1);
    assert_eq!((reads[0].offset, reads[0].len), (10, 100));
    assert_eq!(slow.bytes_read(), 100);
    assert_eq!(slow.inflight_bytes.load(SeqCst), 0);

    // A stalled source holds every call until it resumes, then answers.
    let stall = Arc::new(StallSource::new(dir.path()));
    stall.stall();
    let s = Arc::clone(&stall);
    let held = held_until(
        || stall.waiting(),
        move || s.stat(Path::new("a")).map(|a| a.size),
        || stall.resume(),
    );
    assert_eq!(held.unwrap(), 12);
    assert_eq!(stall.max_waiting(), 1);
    assert_eq!(stall.waiting(), 0);
}

#[test]
fn no_source_refuses_every_call_and_counts_them() {
    let s = NoSource::default();
    assert!(s.stat(Path::new("")).is_err());
    assert!(s.list(Path::new("")).is_err());
    assert!(s.read_link(Path::new("l")).is_err());
    assert!(s.statvfs().is_err());
    let v = SourceVersion {
        size: 1,
        mtime_ns: 1,
        ino: 1,
    };
    assert_eq!(read(&s, "a", &v, 0, 1), Err("NotFound"));
    assert_eq!(s.calls(), 5);
}

fn file(name: &str, size: u64) -> FileVersion {
    FileVersion::new(
        Arc::from(Path::new(name)),
        SourceVersion {
            size,
            mtime_ns: 5,
            ino: 9,
        },
    )
}

fn block(i: u64, len: usize) -> ChecksummedBytes {
    ChecksummedBytes::from_source(Bytes::from(vec![i as u8 + 1; len]))
}

#[test]
fn mem_cache_keeps_blocks_as_the_disk_cache_does() {
    const BS: u64 = 4096;
    let dir = tempfile::tempdir().unwrap();
    let (disk, _) = DiskCache::open(dir.path(), Some(64 << 20), BS, Arc::default()).unwrap();
    let mem = MemCache::new(BS);
    let caches: [&dyn BlockStore; 2] = [&disk, &mem];
    let f = file("f", 2 * BS + 100);
    let other = file("g", BS);
    for c in caches {
        assert!(c.get(&f, 0).is_none());
        assert!(c.put(&f, 0, &block(0, BS as usize)));
        assert!(c.put(&f, 2, &block(2, 100)));
        assert!(c.is_block_cached(&f, 0) && c.is_block_cached(&f, 2));
        assert!(!c.is_block_cached(&f, 1) && !c.is_complete(&f));
        assert!(!c.is_block_cached(&other, 0));
        assert_eq!(c.get(&f, 2).unwrap().data(), block(2, 100).data());
        assert!(c.put(&f, 1, &block(1, BS as usize)));
        assert!(c.is_complete(&f));
        assert!(c.has_room_for(&other));
    }
    // Every kind of write keeps the block; nothing else is being written.
    let g = file("g2", 3 * BS);
    for c in caches {
        assert!(c.put_guest(&g, 0, &block(0, BS as usize)));
        assert!(c.put_ahead(&g, 1, &block(1, BS as usize), false));
        assert!(c.put_ahead(&g, 2, &block(2, BS as usize), true));
        assert!(c.is_complete(&g));
        assert_eq!(c.get(&g, 1).unwrap().data(), block(1, BS as usize).data());
        assert!(!c.is_block_being_written(&g, 0));
    }
    assert_eq!(mem.stored(&f), vec![0, 1, 2]);
    assert_eq!(mem.usage().used_bytes, 5 * BS + 100);
    assert_eq!(mem.usage().files_cached, 2);
    assert_eq!(
        mem.puts(),
        [
            (0, "put"),
            (2, "put"),
            (1, "put"),
            (0, "guest"),
            (1, "ahead"),
            (2, "ahead guest")
        ]
    );
}

#[test]
fn mem_cache_refuses_is_full_or_races_another_write_on_demand() {
    let mem = MemCache::new(4096);
    let f = file("f", 3 * 4096);
    mem.refuse_puts.store(true, SeqCst);
    assert!(!mem.put(&f, 0, &block(0, 4096)) && !mem.put_guest(&f, 0, &block(0, 4096)));
    assert!(mem.has_room_for(&f), "refusing is not being full");
    mem.refuse_puts.store(false, SeqCst);
    mem.full.store(true, SeqCst);
    assert!(!mem.put_ahead(&f, 0, &block(0, 4096), false));
    assert!(!mem.has_room_for(&f));
    mem.full.store(false, SeqCst);
    assert!(mem.stored(&f).is_empty() && mem.puts().is_empty());
    // Another writer holds block 1: a write of it gives up until that
    // write ends (and stores its block); other blocks are written.
    mem.begin_other_write(&f, 1);
    assert!(mem.is_block_being_written(&f, 1) && !mem.is_block_being_written(&f, 0));
    assert!(!mem.put(&f, 1, &block(1, 4096)));
    assert!(mem.put(&f, 0, &block(0, 4096)));
    assert!(mem.end_other_write(&f, 1, Some(&block(1, 4096))));
    assert!(!mem.is_block_being_written(&f, 1) && mem.is_block_cached(&f, 1));
    assert!(!mem.end_other_write(&f, 1, None));
    assert_eq!(mem.stored(&f), vec![0, 1]);
}

#[test]
fn mem_complete_hands_out_and_pins_whole_files_as_the_disk_cache_does() {
    const BS: u64 = 4096;
    let dir = tempfile::tempdir().unwrap();
    let (disk, _) = DiskCache::open(dir.path(), Some(64 << 20), BS, Arc::default()).unwrap();
    let cache = Arc::new(MemCache::new(BS));
    let mem = MemComplete::new(Arc::clone(&cache));
    let (whole, part) = (file("whole", 2 * BS), file("part", 2 * BS));
    for c in [&disk as &dyn BlockStore, &*cache] {
        for i in 0..2 {
            assert!(c.put(&whole, i, &block(i, BS as usize)));
        }
        assert!(c.put(&part, 0, &block(0, BS as usize)));
    }
    let completes: [&dyn CompleteFiles; 2] = [&disk, &*mem];
    for c in completes {
        assert!(c.open_complete(&part).is_none());
        assert!(!c.pin_complete(&part));
        assert!(c.open_complete(&whole).is_some());
        assert!(c.pin_complete(&whole));
        assert!(c.pin_in_use(&whole));
        for _ in 0..3 {
            c.unpin(&whole);
        }
    }
    // The fake counts its pins: every one was given back, none twice.
    assert_eq!(mem.all_pins(), 0);
    assert!(!mem.unpin_underflow.load(SeqCst));
    mem.unpin(&whole);
    assert!(mem.unpin_underflow.load(SeqCst));
    // A file the test drops is no longer whole, and the hook hears of it.
    let dropped = Arc::new(std::sync::Mutex::new(Vec::new()));
    let heard = Arc::clone(&dropped);
    mem.on_file_dropped(Box::new(move |k| heard.lock().unwrap().push(*k)));
    mem.drop_file(&whole.key);
    assert!(mem.open_complete(&whole).is_none());
    assert_eq!(*dropped.lock().unwrap(), [whole.key]);
}

#[test]
fn the_fake_kernel_registers_backings_until_dropped_or_refuses() {
    let kernel = Arc::new(Kernel::default());
    let f = std::fs::File::open("/dev/null").unwrap();
    let (a, b) = (kernel.register(&f).unwrap(), kernel.register(&f).unwrap());
    assert_ne!(a.id, b.id);
    assert_eq!(kernel.live(), 2);
    drop(a);
    assert_eq!(kernel.live(), 1);
    kernel.refuse.store(true, SeqCst);
    let e = kernel.register(&f).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EPERM));
    assert_eq!((kernel.asked.load(SeqCst), kernel.live()), (3, 1));
}

#[test]
fn a_gated_cache_holds_writes_until_the_gate_opens() {
    let gated = Arc::new(GatedCache::new(MemCache::new(4096)));
    let f = file("f", 4096);
    let (g, f2) = (Arc::clone(&gated), f.clone());
    let put = held_until(
        || gated.waiting(),
        move || g.put(&f2, 0, &block(0, 4096)),
        || {
            assert!(!gated.is_block_cached(&f, 0), "written through the gate");
            gated.open_gate()
        },
    );
    assert!(put);
    assert!(gated.is_block_cached(&f, 0));
    assert_eq!(gated.inner.stored(&f), vec![0]);
    // Gated reads instead: writes pass, a read waits for the gate.
    let gated = Arc::new(GatedCache::on_gets(MemCache::new(4096)));
    assert!(gated.put(&f, 0, &block(0, 4096)));
    let (g, f2) = (Arc::clone(&gated), f.clone());
    let get = held_until(
        || gated.waiting(),
        move || g.get(&f2, 0).map(|b| b.data().len()),
        || gated.open_gate(),
    );
    assert_eq!(get, Some(4096));
}
