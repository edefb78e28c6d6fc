//! Invariant 6 through real `locafs mount` processes: after a remount over
//! the same cache (which restores the namespace from its manifest instead
//! of walking the source), no entry that was deleted or replaced comes
//! back, with `--immutable` and with a long `--revalidate` alike. The
//! user's sequence from trust issue 2: an ImageFolder over such a mount
//! counted duplicate and deleted samples.

mod common;

use std::fs;
use std::time::Duration;

use common::*;

/// Runs the user's sequence, then remounts with `remount` flags and checks
/// that the mount shows exactly the source's tree.
fn replaced_and_deleted_stay_gone(remount: &[&str]) {
    let s = Scratch::new();
    for i in 1..=5 {
        fs::write(
            s.src.join(format!("f{i}.txt")),
            format!("old bytes of f{i}\n"),
        )
        .unwrap();
    }
    // A directory replaced by another one, and one deleted: their old
    // subtrees must not come back either.
    write_file(&s.src.join("d1/a.bin"), 1, 3000);
    write_file(&s.src.join("d2/b.bin"), 2, 4000);
    {
        let mut m = s.mount(&["--revalidate", "1s"]);
        assert_eq!(
            fs::read(s.mnt.join("f1.txt")).unwrap(),
            b"old bytes of f1\n"
        );
        assert_eq!(
            fs::read(s.mnt.join("f2.txt")).unwrap(),
            b"old bytes of f2\n"
        );
        assert_eq!(fs::read(s.mnt.join("d1/a.bin")).unwrap().len(), 3000);
        assert_eq!(fs::read(s.mnt.join("d2/b.bin")).unwrap().len(), 4000);
        assert_eq!(listing(&s.mnt), listing(&s.src));

        // f1 replaced (a new file moved over it), f2 deleted, d1 replaced by
        // a new directory, d2 deleted.
        fs::write(s.src.join("f1.txt.new"), b"new bytes of f1\n").unwrap();
        fs::rename(s.src.join("f1.txt.new"), s.src.join("f1.txt")).unwrap();
        fs::remove_file(s.src.join("f2.txt")).unwrap();
        write_file(&s.src.join("d1.new/c.bin"), 3, 5000);
        fs::remove_dir_all(s.src.join("d1")).unwrap();
        fs::rename(s.src.join("d1.new"), s.src.join("d1")).unwrap();
        fs::remove_dir_all(s.src.join("d2")).unwrap();
        std::thread::sleep(Duration::from_secs(2));
        assert_eq!(listing(&s.mnt), listing(&s.src), "ls after the change");
        assert_eq!(listing(&s.mnt.join("d1")), vec!["c.bin"]);
        assert_eq!(m.unmount().code(), Some(0), "{}", m.stderr());
    }
    let mut m = s.mount(remount);
    assert_eq!(
        listing(&s.mnt),
        vec!["d1", "f1.txt", "f3.txt", "f4.txt", "f5.txt"],
        "ls after the remount with {remount:?}"
    );
    let e = fs::read(s.mnt.join("f2.txt")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "cat f2.txt: {e}");
    let e = fs::metadata(s.mnt.join("d2/b.bin")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "d2/b.bin: {e}");
    assert_eq!(
        fs::read(s.mnt.join("f1.txt")).unwrap(),
        b"new bytes of f1\n"
    );
    assert_same_tree(&s.src, &s.mnt);
    // The remount did use the manifest (else this test proves nothing).
    assert_eq!(m.unmount().code(), Some(0));
    assert!(
        m.stderr().contains("entries from the manifest"),
        "the remount walked the source instead of restoring its manifest:\n{}",
        m.stderr()
    );
}

#[test]
fn remount_immutable_shows_no_deleted_or_replaced_entry() {
    require_fuse!();
    replaced_and_deleted_stay_gone(&["--immutable"]);
}

#[test]
fn remount_with_a_long_revalidation_shows_no_deleted_or_replaced_entry() {
    require_fuse!();
    replaced_and_deleted_stay_gone(&["--revalidate", "600s"]);
}
