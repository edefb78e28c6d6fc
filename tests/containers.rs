//! The container deployments, in real containers (issue 36): the image
//! built from packaging/Dockerfile on a local base (no registry), run with
//! `--cap-add SYS_ADMIN --device /dev/fuse --security-opt
//! apparmor=unconfined` (this sandbox refuses `--privileged`).
//!
//! - The sidecar: locafs mounts on a folder shared with a trainer
//!   container through propagation (`rshared` in the sidecar, `rslave` in
//!   the trainer); `docker stop` unmounts and exits 0; after `docker kill`
//!   and a start, the trainer's new opens work, from the cache.
//! - The node daemon: one locafs container mounts on a host path; two pod
//!   containers read it at once, one cache and one source read between
//!   them; the container's restart behaves as docs/operations.md says.
//!
//! Skipped, loudly, without Docker (`.ci/run` installs `docker.io` and
//! starts `dockerd --storage-driver vfs` when none runs).

mod common;

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use common::docker::*;
use common::*;

macro_rules! require_docker {
    () => {
        require_fuse!();
        if let Some(why) = docker_missing() {
            skip!("{why}");
        }
    };
}

/// What a container needs to mount FUSE here (and to use passthrough).
const FUSE_CAPS: [&str; 6] = [
    "--cap-add",
    "SYS_ADMIN",
    "--device",
    "/dev/fuse",
    "--security-opt",
    "apparmor=unconfined",
];

/// A small data set: files of whole blocks and not, a folder, an empty
/// file. Its total size.
fn data_set(src: &Path) -> u64 {
    let mut total = 0;
    for (i, len) in [2 << 20, 2 << 20, 3 << 20, (1 << 20) + 12345, 4096, 0]
        .into_iter()
        .enumerate()
    {
        let p = src.join(format!("d{}/f{i}.bin", i % 2));
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(&p, pattern(36 + i as u64, len)).unwrap();
        total += len as u64;
    }
    total
}

/// In `c` (which has the source at /src): every file of the source and the
/// listing are the same under `mnt`; "" if so, else what differs.
const COMPARE: &str = r#"cd /src || exit 9
bad=0
for f in $(find . -type f | sort); do cmp "$f" "$MNT/$f" || bad=1; done
[ "$(find . | sort)" = "$(cd "$MNT" && find . | sort)" ] || { echo "listings differ"; bad=1; }
exit $bad"#;

fn compare(c: &Container, mnt: &str) {
    c.sh_ok(&format!("MNT={mnt}\n{COMPARE}"));
}

fn fuse_mounts_in(c: &Container) -> String {
    c.sh_ok("grep fuse.locafs /proc/self/mountinfo || true")
}

#[test]
fn a_sidecar_shares_its_mount_with_a_trainer_and_unmounts_on_stop() {
    require_docker!();
    let s = Scratch::new();
    let total = data_set(&s.src);
    let shared = SharedDir::new(&s.path().join("shared"));
    let images = images();
    let mnt = shared.path.join("dataset");
    let sidecar = Container::run(
        "sidecar",
        &[
            &FUSE_CAPS[..],
            &[
                "-v",
                &format!("{}:/data:ro", s.src.display()),
                "-v",
                &format!("{}:/cache", s.cache.display()),
                "-v",
                &format!("{}:/mnt/shared:rshared", shared.path.display()),
                "-e",
                "LOCAFS_MOUNTPOINT=/mnt/shared/dataset",
                &images.locafs,
                "--cache-size",
                "256M",
            ],
        ]
        .concat(),
    );
    sidecar.wait_serving("/mnt/shared/dataset", Duration::from_secs(30));
    let trainer = Container::run(
        "trainer",
        &[
            "-v",
            &format!("{}:/mnt/shared:rslave", shared.path.display()),
            "-v",
            &format!("{}:/src:ro", s.src.display()),
            &images.base,
            "sleep",
            "3600",
        ],
    );
    // The mount shows in the trainer and on the host.
    assert!(is_fuse_mounted(&mnt), "not on the host: {:?}", mountinfo());
    // Every byte right: from the source, then from the cache.
    for _ in 0..2 {
        compare(&trainer, "/mnt/shared/dataset");
    }
    let st = sidecar.stats("/mnt/shared/dataset");
    eprintln!("sidecar stats after two passes: {st}");
    assert_eq!(st["source_bytes"].as_u64(), Some(total), "{st}");
    assert_eq!(st["read_errors"].as_u64(), Some(0), "{st}");
    assert!(
        st["passthrough_opens"].as_u64() > Some(0),
        "no passthrough in the container: {st}\n{}",
        sidecar.logs()
    );

    // docker stop: SIGTERM, unmounted, exit 0, nothing left mounted.
    let t0 = Instant::now();
    sidecar.docker("stop");
    let stop_s = t0.elapsed().as_secs_f64();
    let logs = sidecar.logs();
    assert_eq!(sidecar.exit_code(), 0, "{logs}");
    // (the holder's line: "signal 15 received: unmounting MNT")
    assert!(logs.contains("received: unmounting"), "{logs}");
    assert!(!is_mounted(&mnt), "left mounted on the host");
    assert_eq!(shared.mounts_under(), Vec::<std::path::PathBuf>::new());
    assert_eq!(fuse_mounts_in(&trainer), "", "left mounted in the trainer");
    eprintln!("docker stop: exit 0 after {stop_s:.2}s");

    // Started again, then killed: the trainer sees a dead mount
    // (ENOTCONN) until the sidecar is back.
    sidecar.docker("start");
    sidecar.wait_serving("/mnt/shared/dataset", Duration::from_secs(30));
    compare(&trainer, "/mnt/shared/dataset");
    sidecar.docker("kill");
    assert_eq!(sidecar.exit_code(), 137);
    let dead = trainer.sh("cat /mnt/shared/dataset/d0/f0.bin > /dev/null");
    assert!(
        String::from_utf8_lossy(&dead.stderr).contains("not connected"),
        "{dead:?}"
    );
    // After a restart, the dead mount is detached, a new one made, and the
    // trainer's new opens work, from the cache the killed process left.
    sidecar.docker("start");
    sidecar.wait_serving("/mnt/shared/dataset", Duration::from_secs(30));
    compare(&trainer, "/mnt/shared/dataset");
    let st = sidecar.stats("/mnt/shared/dataset");
    assert_eq!(st["source_bytes"].as_u64(), Some(0), "{st}");
    assert_eq!(st["read_errors"].as_u64(), Some(0), "{st}");
    // One locafs mount, in the trainer and on the host: the dead one is
    // gone.
    assert_eq!(fuse_mounts_in(&trainer).lines().count(), 1);
    assert_eq!(shared.mounts_under(), vec![mnt.clone()]);
    eprintln!(
        "locafs image {:.1} MB; sidecar: stop -> exit 0, kill -> exit 137, restart -> new opens work",
        images.locafs_size as f64 / 1e6
    );
}

#[test]
fn a_node_daemon_serves_two_pods_from_one_cache_and_one_source_read() {
    require_docker!();
    let s = Scratch::new();
    let total = data_set(&s.src);
    // The node's folder of mounts (a hostPath with Bidirectional
    // propagation in the DaemonSet).
    let node_dir = SharedDir::new(&s.path().join("locafs"));
    let images = images();
    let mnt = node_dir.path.join("dataset");
    let node = Container::run(
        "node",
        &[
            &FUSE_CAPS[..],
            &[
                "-v",
                &format!("{}:/data:ro", s.src.display()),
                "-v",
                &format!("{}:/cache", s.cache.display()),
                "-v",
                &format!("{}:/mnt/locafs:rshared", node_dir.path.display()),
                "-e",
                "LOCAFS_MOUNTPOINT=/mnt/locafs/dataset",
                &images.locafs,
                "--cache-size",
                "256M",
            ],
        ]
        .concat(),
    );
    node.wait_serving("/mnt/locafs/dataset", Duration::from_secs(30));
    assert!(is_fuse_mounted(&mnt));
    let pod = |what: &str| {
        Container::run(
            what,
            &[
                "-v",
                &format!("{}:/mnt/locafs:rslave", node_dir.path.display()),
                "-v",
                &format!("{}:/src:ro", s.src.display()),
                &images.base,
                "sleep",
                "3600",
            ],
        )
    };
    let pods = [pod("pod1"), pod("pod2")];
    // Both pods read everything at once, twice.
    for _ in 0..2 {
        std::thread::scope(|sc| {
            for p in &pods {
                sc.spawn(|| compare(p, "/mnt/locafs/dataset"));
            }
        });
    }
    let st = node.stats("/mnt/locafs/dataset");
    eprintln!("node stats after two passes of two pods: {st}");
    // One source read of every byte, one cache.
    assert_eq!(st["source_bytes"].as_u64(), Some(total), "{st}");
    assert_eq!(st["read_errors"].as_u64(), Some(0), "{st}");
    assert!(st["passthrough_opens"].as_u64() > Some(0), "{st}");
    let sets: Vec<_> = fs::read_dir(&s.cache)
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_dir())
        .collect();
    assert_eq!(sets.len(), 1, "one data set in the cache: {sets:?}");

    // The node container restarts (docker restart: SIGTERM, then a new
    // process), as docs/operations.md says: the new process mounts again
    // over the same cache, and a pod's descriptors opened before it...
    node.docker("restart");
    node.wait_serving("/mnt/locafs/dataset", Duration::from_secs(30));
    // ... read on if they were opened in passthrough (the kernel reads the
    // cache file itself), and fail with ENOTCONN if they were served by
    // the daemon. f2 is opened until the new process has verified it (its
    // first open here queues it for the verifier), then held in
    // passthrough; f0's first open here is served by the daemon.
    let pt = |st: &serde_json::Value| st["passthrough_opens"].as_u64().unwrap();
    wait_until("f2 verified", Duration::from_secs(30), || {
        pods[1].sh_ok("cat /mnt/locafs/dataset/d0/f2.bin > /dev/null");
        pt(&node.stats("/mnt/locafs/dataset")) > 0
    });
    let before = pt(&node.stats("/mnt/locafs/dataset"));
    let held = pods[1].spawn_sh(
        "exec 3< /mnt/locafs/dataset/d0/f0.bin 4< /mnt/locafs/dataset/d0/f2.bin
         : > /tmp/opened
         while [ ! -e /tmp/go ]; do sleep 0.1; done
         cat <&3 > /dev/null && echo daemon-open: read || echo daemon-open: failed
         cmp - /src/d0/f2.bin <&4 && echo passthrough-open: read || echo passthrough-open: failed",
    );
    wait_until("the pod's opens", Duration::from_secs(30), || {
        pods[1].sh("test -e /tmp/opened").status.success()
    });
    assert_eq!(
        pt(&node.stats("/mnt/locafs/dataset")),
        before + 1,
        "f2 in passthrough, f0 through the daemon"
    );
    node.docker("restart");
    let logs = node.logs();
    assert!(
        logs.contains("is busy: detaching it"),
        "a busy mount is detached at SIGTERM: {logs}"
    );
    node.wait_serving("/mnt/locafs/dataset", Duration::from_secs(30));
    pods[1].sh_ok(": > /tmp/go");
    let out = held.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!(
        "descriptors held across the restart: {said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("daemon-open: failed"), "{said}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not connected"),
        "{out:?}"
    );
    assert!(said.contains("passthrough-open: read"), "{said}");
    // New opens in both pods work, from the cache: the restarted process
    // reads nothing from the source.
    for p in &pods {
        compare(p, "/mnt/locafs/dataset");
    }
    let st = node.stats("/mnt/locafs/dataset");
    assert_eq!(st["source_bytes"].as_u64(), Some(0), "{st}");
    assert_eq!(st["read_errors"].as_u64(), Some(0), "{st}");
    assert_eq!(node_dir.mounts_under(), vec![mnt.clone()]);
    assert!(node.running());
}

/// Runs the locafs image with `args` until it exits: its exit status and
/// log.
fn run_to_exit(what: &str, args: &[&str]) -> (i64, String) {
    let c = Container::run(what, args);
    wait_until(&format!("{what} to exit"), Duration::from_secs(30), || {
        !c.running()
    });
    (c.exit_code(), c.logs())
}

#[test]
fn the_entrypoint_says_what_the_container_lacks_and_exits_non_zero() {
    require_docker!();
    let s = Scratch::new();
    data_set(&s.src);
    let images = images();
    let src = format!("{}:/data:ro", s.src.display());
    // No /dev/fuse.
    let (code, logs) = run_to_exit(
        "nodev",
        &["--cap-add", "SYS_ADMIN", "-v", &src, &images.locafs],
    );
    assert_eq!(code, 2, "{logs}");
    assert!(logs.contains("--device /dev/fuse"), "{logs}");
    // No CAP_SYS_ADMIN.
    let (code, logs) = run_to_exit(
        "nocap",
        &["--device", "/dev/fuse", "-v", &src, &images.locafs],
    );
    assert_eq!(code, 2, "{logs}");
    assert!(logs.contains("--cap-add SYS_ADMIN"), "{logs}");
    // A bad option, a missing source: configuration errors, exit 2 too
    // (what a restart will not mend).
    let mut bad = FUSE_CAPS.to_vec();
    bad.extend(["-v", &src, &images.locafs, "--cache-size", "lots"]);
    let (code, logs) = run_to_exit("badopt", &bad);
    assert_eq!(code, 2, "{logs}");
    assert!(logs.contains("lots"), "{logs}");
    let mut missing = FUSE_CAPS.to_vec();
    missing.extend(["-e", "LOCAFS_SOURCE=/nowhere", &images.locafs]);
    let (code, logs) = run_to_exit("nosrc", &missing);
    assert_eq!(code, 2, "{logs}");
    assert!(logs.contains("/nowhere"), "{logs}");
}
