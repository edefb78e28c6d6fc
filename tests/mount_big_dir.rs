//! A directory whose cold listing takes longer than `--metadata-timeout`
//! lists anyway, as long as the source keeps answering: the deadline runs
//! from the listing's last progress, not from its start. A source that
//! stops answering in the middle of a listing still fails it with ETIMEDOUT
//! about a deadline later, is detected as stalled, and what was listed so
//! far is not served as the directory.

mod common;

use std::fs;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{inproc, snapshot};
use locafs::testing::{Call, Hook, Hooked, Stall};

const ENTRIES: u64 = 20_000;
const DEADLINE: Duration = Duration::from_secs(1);

/// Each entry of a listing of `big` takes `per_entry` (a slow network file
/// system); after `stop_after` of them, the whole source stops answering
/// until resumed.
struct SlowLister {
    per_entry: Duration,
    stop_after: u64,
    seen: AtomicU64,
    stopped_at: Mutex<Option<Instant>>,
    stall: Stall,
}

impl Hook for SlowLister {
    fn around<T>(&self, call: Call<'_>, real: impl FnOnce() -> T) -> T {
        if let Call::ListEntry(p) = call {
            if p == Path::new("big") {
                std::thread::sleep(self.per_entry);
                if self.seen.fetch_add(1, SeqCst) + 1 == self.stop_after {
                    *self.stopped_at.lock().unwrap() = Some(Instant::now());
                    self.stall.stall();
                }
            }
        }
        self.stall.around(call, real)
    }
}

/// A source with a directory `big` of `ENTRIES` empty files, listed at
/// `per_entry` each.
fn setup(d: &common::Scratch, stop_after: u64) -> (Arc<Hooked<SlowLister>>, Vec<String>) {
    let big = d.src.join("big");
    fs::create_dir(&big).unwrap();
    let mut names: Vec<String> = (0..ENTRIES).map(|i| format!("n{i:06}.JPEG")).collect();
    for n in &names {
        fs::write(big.join(n), b"").unwrap();
    }
    names.sort();
    let hook = SlowLister {
        per_entry: Duration::from_micros(100),
        stop_after,
        seen: AtomicU64::new(0),
        stopped_at: Mutex::new(None),
        stall: Stall::default(),
    };
    (Arc::new(Hooked::wrap(&d.src, hook)), names)
}

fn config(d: &common::Scratch) -> locafs::mount::config::MountConfig {
    inproc::config(d, &["--metadata-timeout", "1s", "--no-readahead"])
}

/// The names of `dir`, or the first error.
fn try_listing(dir: &Path) -> std::io::Result<Vec<String>> {
    let mut v = Vec::new();
    for e in fs::read_dir(dir)? {
        v.push(e?.file_name().to_string_lossy().into_owned());
    }
    v.sort();
    Ok(v)
}

#[test]
fn a_listing_longer_than_the_deadline_that_advances_succeeds() {
    require_fuse!();
    let d = common::Scratch::new();
    let (source, names) = setup(&d, u64::MAX);
    let m = inproc::mount(&config(&d), Arc::clone(&source) as _);
    let t = Instant::now();
    let got = try_listing(&d.mnt.join("big"));
    let took = t.elapsed();
    let got = got.unwrap_or_else(|e| panic!("cold listing failed after {took:?}: {e}"));
    eprintln!("{ENTRIES} entries listed in {took:?} (deadline {DEADLINE:?})");
    assert!(source.seen.load(SeqCst) >= ENTRIES);
    assert_eq!(got.len(), names.len());
    assert!(got == names, "the listing differs from the source's");
    // The listing took longer than the deadline (20k entries at 100 us
    // each: 2 s at least), and nothing counted it a stall.
    assert!(took > DEADLINE, "{took:?}: the listing proved nothing");
    let s = snapshot(&d.mnt);
    assert!(s.source_stalled_since.is_none(), "{s:?}");
    assert_eq!(s.source_stalls, 0, "{s:?}");
    drop(m);
}

#[test]
fn a_listing_whose_source_stops_midway_times_out_and_serves_nothing_of_it() {
    require_fuse!();
    let d = common::Scratch::new();
    let (source, names) = setup(&d, 3_000);
    let m = inproc::mount(&config(&d), Arc::clone(&source) as _);
    let big = d.mnt.join("big");
    // Resume the source whatever happens, so that the mount can go.
    struct Resume(Arc<Hooked<SlowLister>>);
    impl Drop for Resume {
        fn drop(&mut self) {
            self.0.stall.resume();
        }
    }
    let _resume = Resume(Arc::clone(&source));
    let e = try_listing(&big).unwrap_err();
    let stopped = *source.stopped_at.lock().unwrap();
    let stopped = stopped.expect("never stopped");
    let after = stopped.elapsed();
    assert_eq!(e.raw_os_error(), Some(libc::ETIMEDOUT), "{e}");
    eprintln!("the listing failed {after:?} after the source stopped");
    // About a deadline after it stopped (1 s); the bound is far from it,
    // and far from never.
    assert!(after >= DEADLINE / 2, "{after:?}");
    assert!(after < 20 * DEADLINE, "{after:?}");
    // The source is stalled, and what was listed is not the directory.
    let s = snapshot(&d.mnt);
    assert!(s.source_stalled_since.is_some(), "{s:?}");
    let again = try_listing(&big);
    assert!(
        again
            .as_ref()
            .is_err_and(|e| e.raw_os_error() == Some(libc::ETIMEDOUT)),
        "a partial listing was served: {:?} entries",
        again.map(|v| v.len())
    );
    // Once the source answers again, the directory lists in full.
    source.stall.resume();
    let t = Instant::now();
    let got = loop {
        match try_listing(&big) {
            Ok(v) => break v,
            Err(e) if t.elapsed() < Duration::from_secs(30) => {
                eprintln!("not yet: {e}");
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => panic!("no full listing after the source came back: {e}"),
        }
    };
    assert!(got == names, "{} of {} entries", got.len(), names.len());
    drop(m);
}
