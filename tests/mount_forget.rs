//! FORGET through a real mount: the kernel's lookup counts reach the
//! namespace, and when the kernel drops its dentries (`drop_caches`) the
//! inodes it forgets cost nothing beyond their compact record: an entry
//! deleted at the source and forgotten by the kernel loses its name bytes.

mod common;

use std::fs::{self, File};
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use locafs::source::{DirSource, Source};

/// Drops the kernel's dentries and inodes (not the page cache), so that it
/// sends FORGET for every inode it no longer uses.
fn drop_dentries() {
    std::fs::write("/proc/sys/vm/drop_caches", "2").expect("drop_caches");
}

#[test]
fn forgotten_inodes_drop_their_lookups_and_deleted_ones_their_names() {
    require_fuse!();
    let s = Scratch::new();
    let d = s.src.join("set");
    fs::create_dir(&d).unwrap();
    const N: usize = 2000;
    let name = |i: usize| format!("image_{i:06}.jpg");
    for i in 0..N {
        File::create(d.join(name(i))).unwrap();
    }
    let cfg = inproc::config(&s, &["--revalidate", "1s", "--no-readahead"]);
    let source: Arc<dyn Source> = Arc::new(DirSource::new(s.src.clone()));
    let m = inproc::mount(&cfg, source);
    let ns = Arc::clone(m.namespace());
    let md = s.mnt.join("set");
    // Looked up one by one: the kernel holds each inode.
    let inos: Vec<u64> = (0..N)
        .map(|i| fs::symlink_metadata(md.join(name(i))).unwrap().ino())
        .collect();
    assert!(
        inos.iter().all(|i| ns.lookups(*i) > 0),
        "every inode handed to the kernel is counted"
    );
    // The kernel forgets what nothing uses.
    drop_dentries();
    wait_until("the kernel's FORGETs", Duration::from_secs(20), || {
        inos.iter().filter(|i| ns.lookups(**i) > 0).count() < N / 10
    });
    // Reachable entries stay: looked up again, they answer as before.
    let again = fs::symlink_metadata(md.join(name(7))).unwrap().ino();
    assert_eq!(again, inos[7], "a forgotten entry keeps its inode number");
    let (_, dead_before) = ns.name_bytes();
    // Delete half at the source; a listing after the revalidation interval
    // takes them out of the tree; once the kernel forgets them too, their
    // names go.
    let deleted: Vec<usize> = (0..N).step_by(2).filter(|i| *i != 7).collect();
    for i in &deleted {
        fs::remove_file(d.join(name(*i))).unwrap();
    }
    std::thread::sleep(Duration::from_millis(1100));
    let listed = fs::read_dir(&md).unwrap().count();
    assert_eq!(listed, N - deleted.len());
    drop_dentries();
    let want: usize = deleted.iter().map(|i| name(*i).len()).sum();
    wait_until(
        "the names of deleted, forgotten entries to go",
        Duration::from_secs(20),
        || ns.name_bytes().1.saturating_sub(dead_before) >= want * 9 / 10,
    );
    // What is left is whole.
    for i in (1..N).step_by(2) {
        assert!(md.join(name(i)).exists(), "{}", name(i));
    }
    drop(m);
}
