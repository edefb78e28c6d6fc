//! Changes at the source show through the mount within the revalidation
//! interval (new content, new size, new and deleted files), and never with
//! `--immutable`, which trusts the source never to change: that is the
//! intended trade-off (longest kernel caching, no stat traffic to the
//! source), so a changed source under `--immutable` keeps showing the state
//! of the first look, served from the cache.

mod common;

use std::fs;
use std::path::Path;
use std::time::{Duration, SystemTime};

use common::*;

struct Setup {
    s: Scratch,
    old_a: Vec<u8>,
    old_b: Vec<u8>,
    old_gone: Vec<u8>,
    old_list: Vec<String>,
}

fn setup() -> Setup {
    let s = Scratch::new();
    write_file(&s.src.join("a.bin"), 1, 100_000);
    write_file(&s.src.join("b.bin"), 2, 50_000);
    write_file(&s.src.join("gone.bin"), 3, 10_000);
    write_file(&s.src.join("sub/keep.bin"), 4, 1000);
    Setup {
        old_a: fs::read(s.src.join("a.bin")).unwrap(),
        old_b: fs::read(s.src.join("b.bin")).unwrap(),
        old_gone: fs::read(s.src.join("gone.bin")).unwrap(),
        old_list: listing(&s.src),
        s,
    }
}

/// Reads everything through the mount (so it is cached and known).
fn look(st: &Setup) {
    let m = &st.s.mnt;
    assert_eq!(fs::read(m.join("a.bin")).unwrap(), st.old_a);
    assert_eq!(fs::read(m.join("b.bin")).unwrap(), st.old_b);
    assert_eq!(fs::read(m.join("gone.bin")).unwrap(), st.old_gone);
    assert_eq!(listing(m), st.old_list);
}

/// Changes the source: a.bin new size, b.bin same size new content (and a
/// different mtime), new.bin added, gone.bin deleted.
fn change(src: &Path) {
    write_file(&src.join("a.bin"), 11, 150_000);
    write_file(&src.join("b.bin"), 22, 50_000);
    let f = fs::File::options()
        .write(true)
        .open(src.join("b.bin"))
        .unwrap();
    f.set_modified(SystemTime::now() + Duration::from_secs(5))
        .unwrap();
    write_file(&src.join("new.bin"), 33, 777);
    fs::remove_file(src.join("gone.bin")).unwrap();
}

#[test]
fn source_changes_show_within_the_revalidation_interval() {
    require_fuse!();
    let st = setup();
    let s = &st.s;
    let m = s.mount(&["--revalidate", "1s"]);
    look(&st);
    std::thread::sleep(Duration::from_millis(300));
    look(&st); // warm: from the cache (passthrough where complete)
    change(&s.src);
    std::thread::sleep(Duration::from_millis(2500));
    let mnt = &s.mnt;
    assert_eq!(listing(mnt), listing(&s.src), "listing after the change");
    assert_eq!(fs::metadata(mnt.join("a.bin")).unwrap().len(), 150_000);
    assert_same_content(&s.src.join("a.bin"), &mnt.join("a.bin"));
    assert_same_content(&s.src.join("b.bin"), &mnt.join("b.bin"));
    assert_same_content(&s.src.join("new.bin"), &mnt.join("new.bin"));
    let e = fs::metadata(mnt.join("gone.bin")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "gone.bin: {e}");
    assert_eq!(
        fs::read(mnt.join("gone.bin")).unwrap_err().raw_os_error(),
        Some(libc::ENOENT)
    );
    // And the next look at the new state comes from the cache, not stale.
    drop_page_cache();
    assert_same_content(&s.src.join("b.bin"), &mnt.join("b.bin"));
    let stats = m.stats();
    assert_eq!(stats["read_errors"], 0, "{stats}");
}

#[test]
fn immutable_mount_keeps_the_first_state() {
    require_fuse!();
    let st = setup();
    let s = &st.s;
    let _m = s.mount(&["--immutable"]);
    look(&st);
    std::thread::sleep(Duration::from_millis(300));
    change(&s.src);
    std::thread::sleep(Duration::from_millis(2500));
    // Nothing changed through the mount: same listing, same bytes (from the
    // cache), the deleted file still there, the new one not.
    look(&st);
    assert_eq!(fs::metadata(s.mnt.join("a.bin")).unwrap().len(), 100_000);
    assert!(
        !listing(&s.mnt).contains(&"new.bin".to_string()),
        "new.bin appeared in the listing under --immutable"
    );
}
