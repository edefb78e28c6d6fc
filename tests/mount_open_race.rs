//! Concurrent passthrough opens of one fully cached file (trust issue 3):
//! DataLoader workers open the same shards at the same moment. Two OPENs
//! that both find the inode idle both prepare a backing, and so both pin
//! the cached file; the one that joins the other's passthrough must give
//! its pin back, or that version of the file can never be evicted, even
//! once it is stale, until the cache refuses all new data. Through a real
//! mount (passthrough, as root): many threads behind a barrier open, read
//! and close the same cached file, round after round; then the file changes
//! at the source and the cache fills up: the old version must go.

mod common;

use std::fs;
use std::io::Read;
use std::path::PathBuf;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use common::*;

const MIB: usize = 1 << 20;
const THREADS: usize = 16;
const ROUNDS: usize = 30;

#[test]
fn racing_passthrough_opens_leave_no_pin_behind() {
    require_fuse!();
    let s = Scratch::new();
    let a = PathBuf::from("a.shard");
    write_file(&s.src.join(&a), 7, 2 * MIB + 5);
    for i in 0..12 {
        write_file(
            &s.src.join(format!("f{i:02}")),
            100 + i,
            4 * MIB + i as usize,
        );
    }
    let m = s.mount(&["--cache-size", "24M", "--revalidate", "1s"]);
    let want = fs::read(s.src.join(&a)).unwrap();
    assert_eq!(fs::read(s.mnt.join(&a)).unwrap(), want);
    let old = s.cached_data_file(&a);
    assert!(
        wait_for(Duration::from_secs(20), || old.exists()),
        "a.shard was not cached: {}",
        m.stats()
    );

    // The workers: open at the same moment, read, close.
    let path = Arc::new(s.mnt.join(&a));
    let want = Arc::new(want);
    for _ in 0..ROUNDS {
        let barrier = Arc::new(Barrier::new(THREADS));
        let workers: Vec<_> = (0..THREADS)
            .map(|_| {
                let (barrier, path, want) = (barrier.clone(), path.clone(), want.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    let mut f = fs::File::open(&*path).expect("open");
                    let mut got = Vec::with_capacity(want.len());
                    f.read_to_end(&mut got).expect("read");
                    assert!(got == *want, "wrong bytes through the mount");
                })
            })
            .collect();
        for w in workers {
            w.join().expect("worker");
        }
    }
    let st = m.stats();
    assert!(
        st["passthrough_opens"].as_u64().unwrap() > 0,
        "no passthrough open: this test did not exercise its path ({st})"
    );
    assert_eq!(st["open_handles"], 0, "{st}");

    // a.shard changes at the source; once the mount sees the new version,
    // the old one is stale. Filling the cache must evict it.
    write_file(&s.src.join(&a), 8, 2 * MIB + 5);
    std::thread::sleep(Duration::from_millis(1500));
    assert_same_content(&s.src.join(&a), &s.mnt.join(&a));
    for i in 0..12 {
        let f = PathBuf::from(format!("f{i:02}"));
        assert_same_content(&s.src.join(&f), &s.mnt.join(&f));
    }
    let full = || m.stat("cache_used_bytes") + 4 * MIB as u64 > m.stat("cache_capacity_bytes");
    assert!(
        wait_for(Duration::from_secs(30), full),
        "the cache did not fill up: {}",
        m.stats()
    );
    assert!(
        wait_for(Duration::from_secs(20), || !old.exists()),
        "the old version of a.shard was never evicted (a pin leaked by the racing opens?): {}",
        m.stats()
    );
}
