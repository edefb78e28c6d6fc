//! `locafs mount SRC MNT [options]` over a live locafs mount of the same
//! data set takes it over: the old holder stops its server and hands the
//! connection, the shared state and the lock to the new `locafs mount`
//! (here a copy of the binary at another path: an upgrade), whose servers
//! run with its options, and exits without unmounting; readers see no
//! failed read. A takeover that asks to change what cannot change on a
//! live mount (the block size) is refused with exit 2 and changes
//! nothing. A mount whose server hangs is taken over too (its holder is
//! there), and the hung server replaced.

mod common;

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::restart::server_pid;
use common::*;

fn tree(src: &Path) -> Arc<Vec<(PathBuf, Vec<u8>)>> {
    let mut v = Vec::new();
    for i in 0..30u64 {
        let rel = PathBuf::from(format!("d{}/f{i:02}.bin", i % 3));
        let data = pattern(i, 30_000 + 70_000 * (i as usize % 7));
        std::fs::create_dir_all(src.join(rel.parent().unwrap())).unwrap();
        std::fs::write(src.join(&rel), &data).unwrap();
        v.push((rel, data));
    }
    Arc::new(v)
}

/// Eight readers (open files read with pread, whole files, listings) until
/// `stop`: the failures they saw, and the reads they checked.
fn readers(
    mnt: &Path,
    files: &Arc<Vec<(PathBuf, Vec<u8>)>>,
    stop: &Arc<AtomicBool>,
) -> Vec<std::thread::JoinHandle<(Vec<String>, u64)>> {
    (0..8)
        .map(|t| {
            let (mnt, files, stop) = (mnt.to_owned(), Arc::clone(files), Arc::clone(stop));
            std::thread::spawn(move || {
                let mut failures = Vec::new();
                let mut n = 0u64;
                let held = File::open(mnt.join(&files[t].0)).unwrap();
                let mut i = t;
                while !stop.load(Ordering::Relaxed) {
                    i += 7;
                    let (rel, want) = &files[i % files.len()];
                    let r = match t % 3 {
                        0 => {
                            let want = &files[t].1;
                            let off = (i * 997) % want.len();
                            let mut buf = vec![0u8; (want.len() - off).min(65536)];
                            read_full_at(&held, &mut buf, off as u64)
                                .map(|k| buf[..k] == want[off..off + buf.len()])
                        }
                        1 => std::fs::read(mnt.join(rel)).map(|got| got == *want),
                        _ => std::fs::read_dir(mnt.join(rel.parent().unwrap()))
                            .map(|rd| rd.count() == 10),
                    };
                    match r {
                        Ok(true) => n += 1,
                        Ok(false) => failures.push(format!("{}: wrong answer", rel.display())),
                        Err(e) => failures.push(format!("{}: {e}", rel.display())),
                    }
                }
                (failures, n)
            })
        })
        .collect()
}

#[test]
fn a_takeover_by_another_binary_under_load_loses_no_read_and_applies_the_new_options() {
    require_fuse!();
    let sc = Scratch::new();
    let files = tree(&sc.src);
    let mut old = sc.mount(&["--prefetch-memory", "128M"]);
    let old_server = server_pid(&sc.mnt).unwrap();
    let old_limit = stats_of(&sc.mnt)["prefetch_memory_limit"].as_u64().unwrap();
    // An upgrade: the binary, copied elsewhere.
    let newer = sc.dir.path().join("locafs-newer");
    std::fs::copy(bin(), &newer).unwrap();
    std::fs::set_permissions(&newer, std::fs::Permissions::from_mode(0o755)).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let load = readers(&sc.mnt, &files, &stop);
    std::thread::sleep(Duration::from_millis(500));
    let err = sc.dir.path().join("newer.log");
    let child = Command::new(&newer)
        .arg("mount")
        .arg(&sc.src)
        .arg(&sc.mnt)
        .arg("--cache-dir")
        .arg(&sc.cache)
        .args(["--prefetch-memory", "512M"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    let new_pid = child.id();
    let mut new = Mount::adopt(child, &sc.mnt, err);
    // The old holder hands over and exits 0, without unmounting.
    let st = old
        .wait_exit(Duration::from_secs(120))
        .unwrap_or_else(|| panic!("the old holder did not exit; new: {}", new.stderr()));
    let took = t0.elapsed();
    assert_eq!(
        st.code(),
        Some(0),
        "old: {}\nnew: {}",
        old.stderr(),
        new.stderr()
    );
    assert!(is_fuse_mounted(&sc.mnt));
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let (mut failures, mut reads) = (Vec::new(), 0);
    for t in load {
        let (f, n) = t.join().unwrap();
        failures.extend(f);
        reads += n;
    }
    eprintln!("takeover in {took:?}; {reads} reads checked");
    assert!(failures.is_empty(), "{failures:#?}\nnew: {}", new.stderr());
    let st = stats_of(&sc.mnt);
    let server = st["pid"].as_u64().unwrap() as u32;
    assert_ne!(server, old_server);
    assert_eq!(st["supervisor_pid"], new_pid, "{st}");
    assert_eq!(st["restarts"], 1, "{st}");
    assert_eq!(st["last_restart_reason"], "takeover", "{st}");
    // The new limit is in force, and the server is the new binary.
    let want = {
        use clap::Parser;
        let argv: Vec<std::ffi::OsString> = vec![
            "locafs".into(),
            "mount".into(),
            sc.src.clone().into(),
            sc.mnt.clone().into(),
            "--cache-dir".into(),
            sc.cache.clone().into(),
            "--prefetch-memory".into(),
            "512M".into(),
        ];
        let locafs::cli::Command::Mount(a) =
            locafs::cli::Cli::try_parse_from(argv).unwrap().command
        else {
            unreachable!()
        };
        locafs::mount::config::resolve_live(&a.into_request())
            .unwrap()
            .readahead
            .memory
    };
    assert_eq!(st["prefetch_memory_limit"], want, "{st}");
    assert_ne!(old_limit, want);
    let exe = std::fs::read_link(format!("/proc/{server}/exe")).unwrap();
    assert_eq!(exe, newer);
    // It goes on as any mount: a kill is survived, an unmount ends it.
    let old = common::restart::kill_server(&sc.mnt);
    common::restart::wait_new_server(&sc.mnt, old, Duration::from_secs(60));
    let (rel, want) = &files[3];
    let mut got = Vec::new();
    File::open(sc.mnt.join(rel))
        .unwrap()
        .read_to_end(&mut got)
        .unwrap();
    assert!(got == *want);
    assert_eq!(new.unmount().code(), Some(0), "{}", new.stderr());
}

#[test]
fn a_takeover_that_changes_the_block_size_is_refused_and_changes_nothing() {
    require_fuse!();
    let sc = Scratch::with_sample_files();
    let mut m = sc.mount(&[]);
    let server = server_pid(&sc.mnt).unwrap();
    let held = File::open(sc.mnt.join("top.bin")).unwrap();
    let out = run_locafs(&[
        "mount".as_ref(),
        sc.src.as_os_str(),
        sc.mnt.as_os_str(),
        "--cache-dir".as_ref(),
        sc.cache.as_os_str(),
        "--block-size".as_ref(),
        "4M".as_ref(),
        "--prefetch-memory".as_ref(),
        "512M".as_ref(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("cannot take over the live mount: --block-size is 1.0 MiB, not 4.0 MiB"),
        "{err}"
    );
    assert!(err.contains("nothing changed"), "{err}");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    // Untouched: same server, no restart, the open file reads on.
    assert_eq!(server_pid(&sc.mnt), Some(server));
    let st = stats_of(&sc.mnt);
    assert_eq!(st["restarts"], 0, "{st}");
    assert_eq!(st["supervisor_pid"], m.pid().unwrap(), "{st}");
    let mut got = Vec::new();
    (&held).read_to_end(&mut got).unwrap();
    assert!(got == sc.files[2].1);
    sc.check_files_through_mount();
    assert!(m.stderr().contains("was refused"), "{}", m.stderr());
    drop(held);
    assert_eq!(m.unmount().code(), Some(0));
}

/// A takeover of a mount whose server hangs (SIGSTOP, the watchdog off):
/// the dead-mount probe gets no answer, but the holder is there, so the
/// new `locafs mount` takes the mount over and the old holder kills the
/// stopped server; a read that waited on it is answered by the new one.
#[test]
fn a_takeover_of_a_mount_whose_server_hangs_replaces_the_server() {
    require_fuse!();
    let sc = Scratch::with_sample_files();
    let mut old = sc.mount(&["--watchdog", "0"]);
    let stopped = server_pid(&sc.mnt).unwrap();
    signal(stopped, Signal::STOP).unwrap();
    // A reader that waits on the stopped server (a name not looked up yet,
    // so that the kernel must ask).
    let (rel, want) = sc.files[0].clone();
    let mnt = sc.mnt.clone();
    let reader = std::thread::spawn(move || {
        std::fs::read(mnt.join("no-such-name"))
            .err()
            .map(|e| e.kind())
            == Some(std::io::ErrorKind::NotFound)
            && std::fs::read(mnt.join(&rel)).is_ok_and(|got| got == want)
    });
    let err = sc.dir.path().join("new.log");
    let child = Command::new(bin())
        .arg("mount")
        .arg(&sc.src)
        .arg(&sc.mnt)
        .arg("--cache-dir")
        .arg(&sc.cache)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let new_pid = child.id();
    let mut new = Mount::adopt(child, &sc.mnt, err);
    let st = old.wait_exit(Duration::from_secs(120)).unwrap_or_else(|| {
        let _ = signal(stopped, Signal::CONT);
        panic!("the old holder did not exit; new: {}", new.stderr())
    });
    assert_eq!(
        st.code(),
        Some(0),
        "old: {}\nnew: {}",
        old.stderr(),
        new.stderr()
    );
    assert!(reader.join().unwrap(), "the waiting reader failed");
    assert!(!alive(stopped), "the stopped server is still there");
    let st = stats_of(&sc.mnt);
    assert_eq!(st["supervisor_pid"], new_pid, "{st}");
    assert_eq!(st["last_restart_reason"], "takeover", "{st}");
    assert_ne!(server_pid(&sc.mnt), Some(stopped));
    sc.check_files_through_mount();
    assert_eq!(new.unmount().code(), Some(0), "{}", new.stderr());
}
