//! A server killed in the middle of a request: the kernel sends the
//! request again (FUSE_NOTIFY_RESEND) to the server the holder starts in
//! its place, which answers it, with the namespace and handles the dead
//! one left. The servers here are this test binary in a role (see
//! `common::restart`): the real holder, the real server, over a source
//! whose one call stops at a gate the test controls, so that the kill
//! lands exactly in the middle of a cold READ or of a LOOKUP storm. And a
//! server that dies at start, again and again: the holder gives up,
//! unmounts and exits non-zero.

mod common;

use std::ffi::OsString;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

use common::restart::{
    close_gate, kill_server, open_gate, role_mount, run_role, server_pid, wait_new_server,
    wait_reached, Gated,
};
use common::*;

/// Where the role processes start: not a test of its own (ignored; the
/// role processes run it by name).
#[test]
#[ignore = "the entry of the restart tests' role processes"]
fn role_process() {
    run_role();
}

fn args(sc: &Scratch, extra: &[&str]) -> Vec<OsString> {
    let mut v: Vec<OsString> = vec![
        sc.src.clone().into(),
        sc.mnt.clone().into(),
        "--cache-dir".into(),
        sc.cache.clone().into(),
    ];
    v.extend(extra.iter().map(OsString::from));
    v
}

#[test]
fn a_cold_read_in_flight_when_its_server_dies_is_resent_and_completes() {
    require_fuse!();
    let sc = Scratch::new();
    let data = pattern(7, 24 << 20);
    std::fs::write(sc.src.join("big.bin"), &data).unwrap();
    let gate = sc.dir.path().join("gate");
    close_gate(&gate);
    let mut m = role_mount(
        "role_process",
        &args(&sc, &["--no-readahead"]),
        &sc.mnt,
        "server",
        Some((&gate, Gated::Read("big.bin".into()))),
    );
    m.wait_mounted(Duration::from_secs(30)).unwrap();
    let first = server_pid(&sc.mnt).expect("a server");
    let mnt = sc.mnt.clone();
    let reader = std::thread::spawn(move || {
        let mut f = std::fs::File::open(mnt.join("big.bin")).unwrap();
        let mut got = Vec::new();
        f.read_to_end(&mut got).map(|_| got)
    });
    // The first READ of the file is at the source, stopped at the gate:
    // the kernel waits for its answer.
    wait_reached(&gate, Duration::from_secs(30));
    assert!(!reader.is_finished());
    let killed = kill_server(&sc.mnt);
    assert_eq!(killed, first);
    // The next server answers the same READ (sent again) once the source
    // answers.
    open_gate(&gate);
    let new = wait_new_server(&sc.mnt, first, Duration::from_secs(30));
    let got = reader
        .join()
        .unwrap()
        .expect("the read in flight did not fail");
    assert!(got == data, "wrong bytes after the resent read");
    assert_ne!(new, first);
    let st = stats_of(&sc.mnt);
    assert_eq!(st["restarts"], 1, "{st}");
    assert_eq!(st["last_restart_reason"], "signal", "{st}");
    assert_eq!(m.unmount().code(), Some(0), "{}", m.stderr());
}

#[test]
fn a_lookup_storm_of_new_names_survives_a_kill_in_its_middle() {
    require_fuse!();
    let sc = Scratch::new();
    let dir = sc.src.join("flat");
    std::fs::create_dir(&dir).unwrap();
    let n = 600;
    for i in 0..n {
        std::fs::write(dir.join(format!("img{i:05}.jpg")), format!("body {i}")).unwrap();
    }
    let gate = sc.dir.path().join("gate");
    close_gate(&gate);
    // The 300th stat of a name under flat/ (a lookup of a name never seen:
    // nothing has listed the directory) stops at the gate.
    let mut m = role_mount(
        "role_process",
        &args(&sc, &["--no-readahead"]),
        &sc.mnt,
        "server",
        Some((&gate, Gated::NthStat("flat".into(), 300))),
    );
    m.wait_mounted(Duration::from_secs(30)).unwrap();
    let first = server_pid(&sc.mnt).expect("a server");
    let mnt = sc.mnt.clone();
    // Four threads look up every name once, in order, noting each inode.
    let storm: Vec<_> = (0..4)
        .map(|t| {
            let mnt = mnt.clone();
            std::thread::spawn(move || {
                let mut seen = Vec::new();
                for i in (t..n).step_by(4) {
                    let p = mnt.join(format!("flat/img{i:05}.jpg"));
                    match std::fs::metadata(&p) {
                        Ok(md) => seen.push((i, md.ino(), md.len())),
                        Err(e) => return Err(format!("{}: {e}", p.display())),
                    }
                }
                Ok(seen)
            })
        })
        .collect();
    wait_reached(&gate, Duration::from_secs(60));
    kill_server(&sc.mnt);
    open_gate(&gate);
    wait_new_server(&sc.mnt, first, Duration::from_secs(30));
    let mut seen = Vec::new();
    for t in storm {
        seen.extend(t.join().unwrap().expect("no lookup failed"));
    }
    assert_eq!(seen.len(), n);
    // Every name answers with the inode it was given, before or after the
    // kill, and its right size; and reads right.
    for (i, ino, len) in seen {
        let p = sc.mnt.join(format!("flat/img{i:05}.jpg"));
        let md = std::fs::metadata(&p).unwrap();
        assert_eq!((md.ino(), md.len()), (ino, len), "{}", p.display());
        assert_eq!(std::fs::read_to_string(&p).unwrap(), format!("body {i}"));
    }
    assert_eq!(listing(&sc.mnt.join("flat")).len(), n);
    assert_eq!(m.unmount().code(), Some(0), "{}", m.stderr());
}

#[test]
fn a_crash_loop_ends_in_a_clean_unmount_and_a_non_zero_exit() {
    require_fuse!();
    let sc = Scratch::with_sample_files();
    let t0 = Instant::now();
    let mut m = role_mount("role_process", &args(&sc, &[]), &sc.mnt, "crash", None);
    // Readers that come meanwhile wait, then get an error: none hangs.
    let mnt = sc.mnt.clone();
    let reader = std::thread::spawn(move || {
        // (it may come before the mount, or after the unmount)
        let _ = std::fs::read(mnt.join("top.bin"));
    });
    let status = m
        .wait_exit(Duration::from_secs(60))
        .unwrap_or_else(|| panic!("the holder did not give up; stderr:\n{}", m.stderr()));
    let took = t0.elapsed();
    assert!(!status.success(), "{status}");
    assert!(!is_mounted(&sc.mnt), "the mount was left behind");
    let err = m.stderr();
    assert!(err.contains("giving up"), "{err}");
    reader.join().unwrap();
    eprintln!("gave up after {took:?}");
}
