//! Docker for the container tests: whether an engine answers; the locafs
//! image built on this machine with no registry (a root file system of
//! `busybox` and the C libraries `ldd` names, `docker import`ed as the base
//! image, then packaging/Dockerfile built on it with the locafs binary under
//! test as `LOCAFS_PREBUILT`); containers removed on drop; a host folder
//! made a shared mount point, as a Kubernetes `emptyDir` or `hostPath` with
//! `Bidirectional` propagation is.
//!
//! It must never leave a container, an image or a mount behind, nor touch
//! one it did not make: every name it gives starts with `t36-` and the
//! test process's pid; containers and mounts are owned by a guard whose
//! `Drop` removes them, also when a test panics; the images, shared by the
//! tests of a process, are removed when it exits (or, if it was killed, by
//! the next run).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::skip::which;
use super::sys::{force_unmount, mountinfo};

/// The longest any one `docker` command may take (a pull never happens:
/// every image is local).
const DOCKER_TIMEOUT: &str = "300";

/// What this machine lacks for the container tests, if anything: the
/// docker client, an engine that answers, `busybox` for the base image.
pub fn docker_missing() -> Option<String> {
    if which("docker").is_none() {
        return Some("needs docker (apt-get install docker.io) and a running dockerd".into());
    }
    if which("busybox").is_none() {
        return Some("needs busybox for the base image (apt-get install busybox-static)".into());
    }
    let out = docker_output(&["info", "--format", "{{.ServerVersion}}"]);
    if !out.status.success() {
        return Some(format!(
            "no Docker engine answers (docker info: {}); start one: dockerd --storage-driver vfs &",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    None
}

/// `docker ARGS`, bounded in time, whatever it returns.
pub fn docker_output(args: &[&str]) -> Output {
    Command::new("timeout")
        .arg(DOCKER_TIMEOUT)
        .arg("docker")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run docker")
}

/// `docker ARGS`, which must succeed: its standard output, trimmed.
pub fn docker(args: &[&str]) -> String {
    let out = docker_output(args);
    assert!(
        out.status.success(),
        "docker {}: {}\n{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// A name for something this test process makes.
pub fn unique_name(what: &str) -> String {
    format!("t36-{what}-{}", std::process::id())
}

/// The two images: the base (busybox and the C libraries) and locafs's,
/// built from packaging/Dockerfile on it.
pub struct Images {
    /// A busybox root file system: what the "trainer" and "pod"
    /// containers run.
    pub base: String,
    /// packaging/Dockerfile built on `base`.
    pub locafs: String,
    /// The size of the locafs image, as `docker image inspect` says.
    pub locafs_size: u64,
}

/// The images of this test process, built by the first test that asks
/// and kept for the others (building them takes seconds that every test
/// would pay again), removed when the process exits.
static IMAGES: Mutex<Option<&'static Images>> = Mutex::new(None);

/// The images (built now if no test of this process has asked before).
pub fn images() -> &'static Images {
    let mut g = IMAGES.lock();
    if let Some(i) = *g {
        return i;
    }
    remove_stale_images();
    let i: &'static Images = Box::leak(Box::new(build_images()));
    *g = Some(i);
    // The test harness ends the process with `exit`, which runs what
    // `atexit` registered: the images go then, whichever test was last.
    extern "C" fn remove_images() {
        if let Some(i) = *IMAGES.lock() {
            let _ = docker_output(&["rmi", "-f", &i.locafs, &i.base]);
        }
    }
    // SAFETY: registers a plain function with no arguments.
    unsafe { libc::atexit(remove_images) };
    i
}

/// Removes the images of test processes that are gone (killed before
/// their `atexit` ran): `t36-base-PID` and `t36-locafs-PID`.
fn remove_stale_images() {
    let listed = docker(&["images", "--format", "{{.Repository}}:{{.Tag}}"]);
    for image in listed.lines() {
        let Some(rest) = image
            .strip_prefix("t36-base-")
            .or_else(|| image.strip_prefix("t36-locafs-"))
        else {
            continue;
        };
        let pid = rest.split(':').next().unwrap_or("");
        if pid.parse::<u32>().is_ok() && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = docker_output(&["rmi", "-f", image]);
        }
    }
}

/// The libraries `ldd` names for `bin` (none for a static binary).
fn libraries(bin: &Path) -> Vec<PathBuf> {
    let out = Command::new("ldd").arg(bin).output().expect("ldd");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or
            // "/lib64/ld-linux-x86-64.so.2 (0x...)"
            let path = l.split("=>").last()?.split_whitespace().next()?;
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

fn build_images() -> Images {
    let t0 = Instant::now();
    let dir = tempfile::Builder::new()
        .prefix("t36-image-")
        .tempdir_in("/var/tmp")
        .expect("tempdir");
    let root = dir.path().join("rootfs");
    let busybox = std::fs::canonicalize(which("busybox").unwrap()).unwrap();
    let locafs = Path::new(super::daemon::bin());
    for d in ["bin", "etc", "tmp", "proc", "sys", "dev", "usr/bin", "root"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    std::fs::copy(&busybox, root.join("bin/busybox")).unwrap();
    let applets = Command::new(&busybox).arg("--list").output().unwrap();
    for a in String::from_utf8_lossy(&applets.stdout).lines() {
        if !a.is_empty() && a != "busybox" {
            let _ = std::os::unix::fs::symlink("busybox", root.join("bin").join(a));
        }
    }
    let mut libs = libraries(locafs);
    libs.extend(libraries(&busybox));
    for lib in libs {
        let to = root.join(lib.strip_prefix("/").unwrap());
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(&lib, &to).unwrap_or_else(|e| panic!("{}: {e}", lib.display()));
    }
    std::fs::write(root.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n").unwrap();
    std::fs::write(root.join("etc/group"), "root:x:0:\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(root.join("tmp"), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let tar = dir.path().join("rootfs.tar");
    let st = Command::new("tar")
        .arg("-C")
        .arg(&root)
        .arg("-cf")
        .arg(&tar)
        .arg(".")
        .status()
        .unwrap();
    assert!(st.success(), "tar of the base root file system");
    let base = format!("{}:1", unique_name("base"));
    docker(&["import", tar.to_str().unwrap(), &base]);

    // The build context: the binary under test (stripped: the image is
    // what a user would ship) and the entrypoint, where the Dockerfile
    // looks for them.
    let ctx = dir.path().join("context");
    std::fs::create_dir_all(ctx.join("packaging")).unwrap();
    let stripped = Command::new("strip")
        .arg("-o")
        .arg(ctx.join("locafs"))
        .arg(locafs)
        .status()
        .is_ok_and(|s| s.success());
    if !stripped {
        std::fs::copy(locafs, ctx.join("locafs")).unwrap();
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    std::fs::copy(
        repo.join("packaging/docker-entrypoint.sh"),
        ctx.join("packaging/docker-entrypoint.sh"),
    )
    .unwrap();
    let dangling = || docker(&["images", "-q", "--no-trunc", "--filter", "dangling=true"]);
    let before = dangling();
    let image = format!("{}:1", unique_name("locafs"));
    let built = docker_output(&[
        "build",
        "-q",
        "--force-rm",
        "-f",
        repo.join("packaging/Dockerfile").to_str().unwrap(),
        "-t",
        &image,
        "--build-arg",
        &format!("BUILD_IMAGE={base}"),
        "--build-arg",
        &format!("BASE_IMAGE={base}"),
        "--build-arg",
        "LOCAFS_PREBUILT=locafs",
        ctx.to_str().unwrap(),
    ]);
    // The build stage's image is left untagged: removed here, with
    // nothing that was dangling before.
    for id in dangling().lines() {
        if !before.lines().any(|b| b == id) {
            let _ = docker_output(&["rmi", "-f", id]);
        }
    }
    if !built.status.success() {
        let _ = docker_output(&["rmi", "-f", &base]);
        panic!(
            "docker build of packaging/Dockerfile: {}",
            String::from_utf8_lossy(&built.stderr)
        );
    }
    let size = docker(&["image", "inspect", "-f", "{{.Size}}", &image])
        .parse()
        .unwrap_or(0);
    eprintln!(
        "images built in {:.1}s: {base}, {image} ({:.1} MB)",
        t0.elapsed().as_secs_f64(),
        size as f64 / 1e6
    );
    Images {
        base,
        locafs: image,
        locafs_size: size,
    }
}

/// A container started with `docker run -d`, removed (`docker rm -f`) on
/// drop.
pub struct Container {
    pub name: String,
}

impl Container {
    /// `docker run -d --name t36-WHAT-PID ARGS...` (ARGS end with the
    /// image and its arguments).
    pub fn run(what: &str, args: &[&str]) -> Container {
        let name = unique_name(what);
        let _ = docker_output(&["rm", "-f", &name]);
        let mut a = vec!["run", "-d", "--name", &name];
        a.extend_from_slice(args);
        docker(&a);
        Container { name }
    }

    /// `docker exec NAME sh -c SCRIPT`.
    pub fn sh(&self, script: &str) -> Output {
        docker_output(&["exec", &self.name, "sh", "-c", script])
    }

    /// [`Container::sh`], which must succeed: its standard output.
    pub fn sh_ok(&self, script: &str) -> String {
        let out = self.sh(script);
        assert!(
            out.status.success(),
            "in {}: {script}: {}\n{}{}",
            self.name,
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `docker exec NAME sh -c SCRIPT`, not waited for.
    pub fn spawn_sh(&self, script: &str) -> std::process::Child {
        Command::new("docker")
            .args(["exec", &self.name, "sh", "-c", script])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("docker exec")
    }

    /// `docker stop|kill|start|restart NAME`, and the like.
    pub fn docker(&self, verb: &str) {
        docker(&[verb, &self.name]);
    }

    /// The exit status of its last run (`docker inspect`).
    pub fn exit_code(&self) -> i64 {
        docker(&["inspect", "-f", "{{.State.ExitCode}}", &self.name])
            .parse()
            .unwrap()
    }

    pub fn running(&self) -> bool {
        docker(&["inspect", "-f", "{{.State.Running}}", &self.name]) == "true"
    }

    /// Its log (standard output and error).
    pub fn logs(&self) -> String {
        let out = docker_output(&["logs", &self.name]);
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }

    /// `locafs stats MNT --json` in the container.
    pub fn stats(&self, mnt: &str) -> serde_json::Value {
        let out = self.sh_ok(&format!("locafs stats {mnt} --json"));
        serde_json::from_str(&out).expect("stats JSON")
    }

    /// Waits (at most `limit`) until the locafs in the container serves
    /// `mnt` (its control socket answers `locafs stats`).
    pub fn wait_serving(&self, mnt: &str, limit: Duration) {
        let t0 = Instant::now();
        while t0.elapsed() < limit {
            if self
                .sh(&format!("locafs stats {mnt} --json"))
                .status
                .success()
            {
                return;
            }
            assert!(
                self.running(),
                "{} exited ({}):\n{}",
                self.name,
                self.exit_code(),
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "{} did not serve {mnt} within {limit:?}:\n{}",
            self.name,
            self.logs()
        );
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = docker_output(&["rm", "-f", &self.name]);
    }
}

/// A host folder made a shared mount point (`mount --bind D D; mount
/// --make-rshared D`), so that mounts made under it in a container that
/// has it `rshared` show on the host and in containers that have it
/// `rslave`. On drop, everything mounted under it is unmounted, then it.
pub struct SharedDir {
    pub path: PathBuf,
}

impl SharedDir {
    pub fn new(path: &Path) -> SharedDir {
        std::fs::create_dir_all(path).unwrap();
        for args in [
            vec!["--bind", path.to_str().unwrap(), path.to_str().unwrap()],
            vec!["--make-rshared", path.to_str().unwrap()],
        ] {
            let st = Command::new("mount").args(&args).status().unwrap();
            assert!(st.success(), "mount {args:?}");
        }
        SharedDir {
            path: path.to_owned(),
        }
    }

    /// Mount points under it (not it), deepest last.
    pub fn mounts_under(&self) -> Vec<PathBuf> {
        mountinfo()
            .into_iter()
            .map(|m| m.point)
            .filter(|p| p.starts_with(&self.path) && *p != self.path)
            .collect()
    }
}

impl Drop for SharedDir {
    fn drop(&mut self) {
        for p in self.mounts_under().iter().rev() {
            force_unmount(p);
        }
        while mountinfo().iter().any(|m| m.point == self.path) {
            if !force_unmount(&self.path) {
                break;
            }
        }
    }
}
