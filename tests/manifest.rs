//! The namespace manifest: a remount does not walk the source again (with
//! --immutable, or within the revalidation interval), sees the same tree,
//! and a corrupt manifest is ignored.

mod common;

use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;
use std::time::Duration;

use common::inproc::{config, mount};
use common::Scratch;
use locafs::testing::SlowSource;

fn walk(root: &std::path::Path) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let m = std::fs::symlink_metadata(e.path()).unwrap();
            let rel = e.path().strip_prefix(root).unwrap().display().to_string();
            if m.is_dir() {
                stack.push(e.path());
            }
            out.push((rel, m.len()));
        }
    }
    out.sort();
    out
}

#[test]
fn remount_uses_the_manifest_instead_of_walking_the_source() {
    require_fuse!();
    let d = Scratch::new();
    for i in 0..50 {
        let dir = d.src.join(format!("d{}", i % 5));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("f{i}")), vec![b'x'; i]).unwrap();
    }
    std::os::unix::fs::symlink("d0/f0", d.src.join("link")).unwrap();
    let cfg = config(&d, &["--immutable", "--no-readahead"]);
    let first = {
        let src = Arc::new(SlowSource::new(&d.src, Duration::ZERO, 0));
        let m = mount(&cfg, src.clone());
        let tree = walk(m.mountpoint());
        assert!(src.metadata_ops.load(SeqCst) > 5);
        drop(m);
        tree
    };
    assert!(d.cache.read_dir().unwrap().next().is_some());
    // Second mount: the same tree, without listing or stat-ing the source
    // (only the root is stat-ed, to check the source is there).
    let src = Arc::new(SlowSource::new(&d.src, Duration::ZERO, 0));
    let m = mount(&cfg, src.clone());
    assert_eq!(walk(m.mountpoint()), first);
    assert!(
        src.metadata_ops.load(SeqCst) <= 1,
        "{} metadata ops",
        src.metadata_ops.load(SeqCst)
    );
    drop(m);

    // A corrupt manifest is ignored: the source is walked again, same tree.
    // The data set's directory (the cache dir also holds the budget).
    let ds = std::fs::read_dir(&d.cache)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.is_dir())
        .unwrap();
    let man = ds.join("manifest");
    let mut bytes = std::fs::read(&man).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&man, bytes).unwrap();
    let src = Arc::new(SlowSource::new(&d.src, Duration::ZERO, 0));
    let m = mount(&cfg, src.clone());
    assert_eq!(walk(m.mountpoint()), first);
    assert!(src.metadata_ops.load(SeqCst) > 5);
    drop(m);
}

#[test]
fn a_manifest_older_than_the_revalidation_interval_is_not_trusted() {
    require_fuse!();
    let d = Scratch::new();
    std::fs::write(d.src.join("a"), b"1").unwrap();
    let cfg = config(&d, &["--revalidate", "1s", "--no-readahead"]);
    {
        let m = mount(&cfg, Arc::new(SlowSource::new(&d.src, Duration::ZERO, 0)));
        walk(m.mountpoint());
    }
    std::fs::write(d.src.join("b"), b"22").unwrap();
    std::thread::sleep(Duration::from_millis(1200));
    let m = mount(&cfg, Arc::new(SlowSource::new(&d.src, Duration::ZERO, 0)));
    let names: Vec<String> = walk(m.mountpoint()).into_iter().map(|x| x.0).collect();
    assert_eq!(names, vec!["a", "b"]);
}
