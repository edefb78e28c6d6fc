//! The holder's watchdog: a serving process that stops answering (here
//! SIGSTOP) while requests wait is killed and replaced within
//! `--watchdog`, and readers see no failed read; a source that stalls (a
//! real FUSE file system stopped with SIGSTOP, as in mount_stall.rs) is
//! not a hang: the server goes on answering what it can, and is not
//! replaced.

mod common;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::restart::server_pid;
use common::*;

/// Readers that read every file again and again until told to stop: the
/// failures they saw, and how many reads they checked.
struct Readers {
    stop: Arc<AtomicBool>,
    failures: Arc<Mutex<Vec<String>>>,
    reads: Arc<AtomicU64>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Readers {
    fn start(mnt: &std::path::Path, files: &[(PathBuf, Vec<u8>)], n: usize) -> Readers {
        let stop = Arc::new(AtomicBool::new(false));
        let failures = Arc::new(Mutex::new(Vec::new()));
        let reads = Arc::new(AtomicU64::new(0));
        let files = Arc::new(files.to_vec());
        let threads = (0..n)
            .map(|t| {
                let (stop, failures, reads, files) = (
                    Arc::clone(&stop),
                    Arc::clone(&failures),
                    Arc::clone(&reads),
                    Arc::clone(&files),
                );
                let mnt = mnt.to_owned();
                std::thread::spawn(move || {
                    let mut i = t;
                    while !stop.load(Ordering::Relaxed) {
                        let (rel, want) = &files[i % files.len()];
                        i += 1;
                        match std::fs::read(mnt.join(rel)) {
                            Ok(got) if got == *want => {
                                reads.fetch_add(1, Ordering::Relaxed);
                            }
                            Ok(_) => failures
                                .lock()
                                .unwrap()
                                .push(format!("{rel:?}: wrong bytes")),
                            Err(e) => failures.lock().unwrap().push(format!("{rel:?}: {e}")),
                        }
                    }
                })
            })
            .collect();
        Readers {
            stop,
            failures,
            reads,
            threads,
        }
    }

    fn finish(self) -> (Vec<String>, u64) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join().unwrap();
        }
        let f = std::mem::take(&mut *self.failures.lock().unwrap());
        (f, self.reads.load(Ordering::Relaxed))
    }
}

fn files(src: &std::path::Path, n: u64) -> Vec<(PathBuf, Vec<u8>)> {
    (0..n)
        .map(|i| {
            let rel = PathBuf::from(format!("f{i:02}.bin"));
            let data = pattern(i, 50_000 + 20_000 * i as usize);
            std::fs::write(src.join(&rel), &data).unwrap();
            (rel, data)
        })
        .collect()
}

#[test]
fn a_stopped_server_is_replaced_within_the_watchdog_deadline() {
    require_fuse!();
    let sc = Scratch::new();
    let files = files(&sc.src, 20);
    let deadline = Duration::from_secs(3);
    let mut m = sc.mount(&["--watchdog", "3s"]);
    let readers = Readers::start(&sc.mnt, &files, 4);
    std::thread::sleep(Duration::from_millis(500));
    let stopped = server_pid(&sc.mnt).unwrap();
    signal(stopped, Signal::STOP).unwrap();
    let t0 = Instant::now();
    // The readers wait on the stopped server; the watchdog's probe does
    // too, and after the deadline the holder kills it.
    let new = loop {
        if let Some(p) = server_pid(&sc.mnt).filter(|p| *p != stopped) {
            break p;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "not replaced within 60 s; stderr:\n{}",
            m.stderr()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let took = t0.elapsed();
    std::thread::sleep(Duration::from_millis(500));
    let (failures, reads) = readers.finish();
    eprintln!("replaced after {took:?} (deadline {deadline:?}); {reads} reads checked");
    assert!(failures.is_empty(), "{failures:#?}");
    assert!(took >= deadline, "replaced before the deadline: {took:?}");
    assert!(!alive(stopped), "the stopped server still runs");
    let st = stats_of(&sc.mnt);
    assert_eq!(st["pid"], new, "{st}");
    assert_eq!(st["restarts"], 1, "{st}");
    assert_eq!(st["last_restart_reason"], "watchdog", "{st}");
    assert!(m.stderr().contains("watchdog:"), "{}", m.stderr());
    assert_eq!(m.unmount().code(), Some(0));
}

#[test]
fn a_stalled_source_does_not_trigger_the_watchdog() {
    require_fuse!();
    // The source is itself a FUSE mount (another locafs) whose server is
    // stopped: calls into it sleep in the kernel, as on a hard NFS mount
    // whose server hangs.
    let sc = Scratch::new();
    let inner_mnt = sc.dir.path().join("inner-mnt");
    let inner_cache = sc.dir.path().join("inner-cache");
    for d in [&inner_mnt, &inner_cache] {
        std::fs::create_dir(d).unwrap();
    }
    let files = files(&sc.src, 12);
    let inner = Mount::start(&sc.src, &inner_mnt, &inner_cache, &["--watchdog", "0"]);
    let mut m = Mount::start(
        &inner_mnt,
        &sc.mnt,
        &sc.cache,
        &[
            "--watchdog",
            "2s",
            "--metadata-timeout",
            "1s",
            "--source-timeout",
            "2s",
            "--no-readahead",
        ],
    );
    // Half the files cached; the rest only at the source.
    let (cached, cold) = files.split_at(6);
    for (rel, want) in cached {
        assert!(std::fs::read(sc.mnt.join(rel)).unwrap() == *want);
    }
    wait_until("six files cached", Duration::from_secs(60), || {
        stats_of(&sc.mnt)["files_cached"].as_u64() >= Some(6)
    });
    let ours = server_pid(&sc.mnt).unwrap();
    let stalled = server_pid(&inner_mnt).unwrap();
    signal(stalled, Signal::STOP).unwrap();
    let _resume = ResumeOnDrop(stalled);
    // Readers of cached files go on; readers of the others get errors at
    // their deadline; the server answers all along.
    let readers = Readers::start(&sc.mnt, cached, 3);
    let mnt = sc.mnt.clone();
    let cold = cold.to_vec();
    let t0 = Instant::now();
    let cold_reader = std::thread::spawn(move || {
        let mut errors = 0;
        while t0.elapsed() < Duration::from_secs(8) {
            for (rel, _) in &cold {
                if std::fs::read(mnt.join(rel)).is_err() {
                    errors += 1;
                }
            }
        }
        errors
    });
    // Four times the watchdog's deadline.
    std::thread::sleep(Duration::from_secs(8));
    let errors = cold_reader.join().unwrap();
    let (failures, reads) = readers.finish();
    let st = stats_of(&sc.mnt);
    eprintln!("stalled 8 s: {reads} cached reads, {errors} uncached reads failed; {st}");
    assert!(failures.is_empty(), "{failures:#?}");
    assert!(reads > 0);
    assert!(errors > 0, "the source answered: it did not stall");
    assert_eq!(st["pid"], ours, "the server was replaced: {}", m.stderr());
    assert_eq!(st["restarts"], 0, "{st}");
    assert!(!m.stderr().contains("watchdog:"), "{}", m.stderr());
    drop(_resume);
    assert_eq!(m.unmount().code(), Some(0));
    drop(inner);
}

#[test]
fn an_idle_holder_sleeps_between_its_looks() {
    require_fuse!();
    // The holder looks at its server ten times a second (signals, the
    // server's pipe, the watchdog). It once kept polling the pipe the
    // server says READY on after the server had closed its end: a closed
    // pipe is always readable, so it looped at once, again and again
    // (about 700 times a second, reading each time: a fifth of a core for
    // a mount nobody used, and 64 of them starved a 2-core machine).
    let sc = Scratch::new();
    let files = files(&sc.src, 2);
    let mut m = sc.mount(&[]);
    let holder = m.pid().unwrap();
    assert!(std::fs::read(sc.mnt.join(&files[0].0)).unwrap() == files[0].1);
    let server = server_pid(&sc.mnt).unwrap();
    assert_ne!(server, holder, "the mount has a holder and a server");
    let reads = || {
        let io = std::fs::read_to_string(format!("/proc/{holder}/io")).unwrap();
        io.lines()
            .find_map(|l| l.strip_prefix("syscr:"))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap()
    };
    let before = reads();
    std::thread::sleep(Duration::from_secs(3));
    let n = reads() - before;
    eprintln!("the idle holder made {n} read calls in 3 s");
    // About 40 a second when it sleeps between looks (some looks read a
    // file or two); the loop that did not sleep made thousands.
    assert!(
        n < 1_000,
        "{n} read calls in 3 s: the holder does not sleep"
    );
    assert_eq!(m.unmount().code(), Some(0));
}
