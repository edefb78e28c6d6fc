//! The wheel (`pip install locafs`, packaging/python): built by maturin
//! from this tree, installed into a fresh virtual environment by an
//! unprivileged user (nobody), who then mounts a generated data set with
//! `locafs.mount`, reads every byte, samples it with `LocalitySampler`
//! and unmounts (packaging/python/tests/user_mount.py); what that user sees
//! without access to /dev/fuse or without fusermount3; and the wheel's
//! manylinux tag, as `auditwheel show` names it.
//!
//! The user's /dev/fuse: a character device node of mode 0666 bind-mounted
//! over /dev/fuse in a private mount namespace (`unshare -m`), so that the
//! machine's /dev/fuse (0600 here) is never changed; in that namespace
//! `fusermount3` mounts for the user as on a desktop distribution.
//!
//! The wheel is built once per run of this binary (`maturin build
//! --release --zig`: zig links the binary against glibc 2.28 for the
//! manylinux_2_28 tag), from cargo's cache of that release build when there
//! is one; its build time and size are printed. Skipped, loudly, without
//! maturin or ziglang (`pip install maturin ziglang`; .ci/run installs them
//! and auditwheel in a venv of their own and names them in $MATURIN and
//! $AUDITWHEEL).

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

const NOBODY: u32 = 65534;

fn package() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/python")
}

/// A tool named by `$var`, else found on PATH, else beside maturin (the
/// same venv).
fn tool(var: &str, name: &str) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(var).filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    which(name).or_else(|| {
        // Beside maturin (the wheel's tools share one venv); maturin
        // itself has nowhere else to be looked for.
        if var == "MATURIN" {
            return None;
        }
        let m = tool("MATURIN", "maturin")?;
        Some(m.parent()?.join(name)).filter(|p| p.is_file())
    })
}

struct Wheel {
    path: PathBuf,
    seconds: f64,
    bytes: u64,
}

/// Builds the wheel once for every test of this binary (Err: why not).
fn wheel() -> Result<&'static Wheel, String> {
    static BUILT: OnceLock<Result<Wheel, String>> = OnceLock::new();
    BUILT
        .get_or_init(build_wheel)
        .as_ref()
        .map_err(Clone::clone)
}

fn build_wheel() -> Result<Wheel, String> {
    let maturin = tool("MATURIN", "maturin")
        .ok_or("maturin is not installed (pip install maturin; .ci/run installs it)")?;
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("python-wheel");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).unwrap();
    let start = Instant::now();
    // zig links against the glibc of the tag (manylinux_2_28); maturin
    // finds it as `python3 -m ziglang`, with the python of its own venv.
    let mut path = std::ffi::OsString::from(maturin.parent().unwrap_or(Path::new(".")));
    path.push(":");
    path.push(std::env::var_os("PATH").unwrap_or_default());
    let has_zig = Command::new("python3")
        .args(["-c", "import ziglang"])
        .env("PATH", &path)
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_zig {
        return Err(
            "ziglang is not installed beside maturin (pip install ziglang; .ci/run installs it)"
                .into(),
        );
    }
    // pyproject.toml says the rest: bin bindings, strip, the manylinux tag.
    let built = Command::new(&maturin)
        .args(["build", "--release", "--zig", "--quiet", "--out"])
        .arg(&out)
        .env("PATH", &path)
        .current_dir(package())
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", maturin.display()))?;
    let seconds = start.elapsed().as_secs_f64();
    assert!(
        built.status.success(),
        "maturin build failed:\n{}\n{}",
        String::from_utf8_lossy(&built.stdout),
        String::from_utf8_lossy(&built.stderr)
    );
    let wheels: Vec<PathBuf> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "whl"))
        .collect();
    assert_eq!(wheels.len(), 1, "one wheel expected: {wheels:?}");
    let path = wheels.into_iter().next().unwrap();
    let bytes = std::fs::metadata(&path).unwrap().len();
    eprintln!(
        "wheel {}: {:.1} MB, built in {seconds:.1} s",
        path.file_name().unwrap().to_string_lossy(),
        bytes as f64 / 1e6
    );
    Ok(Wheel {
        path,
        seconds,
        bytes,
    })
}

/// A python3 that user nobody can run and that makes virtual
/// environments with pip (`/root` is 0700 here: pyenv's is no use).
fn user_python() -> Result<PathBuf, String> {
    let candidates = [Some(PathBuf::from("/usr/bin/python3")), which("python3")];
    for py in candidates.into_iter().flatten() {
        let ok = as_nobody(Command::new("setpriv"), &py)
            .args(["-c", "import venv, ensurepip"])
            .output()
            .is_ok_and(|o| o.status.success());
        if ok {
            return Ok(py);
        }
    }
    Err(
        "no python3 with venv and ensurepip that user nobody can run (apt install python3-venv)"
            .into(),
    )
}

/// `setpriv ... PROGRAM` as user nobody, with a clean environment.
fn as_nobody(mut setpriv: Command, program: &Path) -> Command {
    setpriv
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "env",
            "-i",
            "PATH=/usr/bin:/bin",
        ])
        .arg(program);
    setpriv
}

/// A scratch tree that user nobody can use: `source/` (root's, readable by
/// all), `home/` and `mnt/` (nobody's), a 0666 FUSE device node.
struct UserScratch {
    dir: tempfile::TempDir,
    files: Vec<String>,
}

impl UserScratch {
    fn new() -> UserScratch {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o755)).unwrap();
        // Sizes around the 1 MiB block: empty, one byte, small, a block
        // exactly, several blocks and a tail; nested directories.
        let sizes = [0usize, 1, 4095, 70_000, 1 << 20, (3 << 20) + 17, 300_000, 9];
        let mut files = Vec::new();
        for (i, len) in sizes.iter().enumerate() {
            let rel = format!("class{}/sample_{i:03}.bin", i % 3);
            write_file(&root.join("source").join(&rel), 38_000 + i as u64, *len);
            files.push(rel);
        }
        files.sort();
        for p in list_dirs_and_files(&root.join("source")) {
            let mode = if p.is_dir() { 0o755 } else { 0o644 };
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        }
        for d in ["home", "mnt"] {
            let p = root.join(d);
            std::fs::create_dir(&p).unwrap();
            std::os::unix::fs::chown(&p, Some(NOBODY), Some(NOBODY)).unwrap();
        }
        UserScratch { dir, files }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// A FUSE device node (10, 229) of mode 0666, or why there is none.
    fn fuse_node(&self) -> Result<PathBuf, String> {
        let node = self.path("fuse");
        let dev = std::fs::metadata("/dev/fuse")
            .map_err(|e| format!("/dev/fuse: {e}"))?
            .rdev();
        let made = Command::new("mknod")
            .args(["-m", "0666"])
            .arg(&node)
            .args([
                "c",
                &libc_major(dev).to_string(),
                &libc_minor(dev).to_string(),
            ])
            .output()
            .map_err(|e| format!("mknod: {e}"))?;
        if !made.status.success() {
            return Err(format!(
                "cannot make a FUSE device node: {}",
                String::from_utf8_lossy(&made.stderr).trim()
            ));
        }
        Ok(node)
    }
}

fn libc_major(dev: u64) -> u64 {
    ((dev >> 32) & 0xffff_f000) | ((dev >> 8) & 0xfff)
}

fn libc_minor(dev: u64) -> u64 {
    ((dev >> 12) & 0xffff_ff00) | (dev & 0xff)
}

fn list_dirs_and_files(root: &Path) -> Vec<PathBuf> {
    let mut out = vec![root.to_path_buf()];
    let mut i = 0;
    while i < out.len() {
        if out[i].is_dir() {
            let mut entries: Vec<PathBuf> = std::fs::read_dir(&out[i])
                .unwrap()
                .map(|e| e.unwrap().path())
                .collect();
            entries.sort();
            out.extend(entries);
        }
        i += 1;
    }
    out
}

/// Makes a virtual environment as nobody and pip-installs the wheel into
/// it as nobody, with no Rust on PATH and no index: the wheel alone.
fn user_venv(scratch: &UserScratch, wheel: &Path) -> PathBuf {
    let py = match user_python() {
        Ok(p) => p,
        Err(why) => panic!("{why}"),
    };
    let home = scratch.path("home");
    let copy = home.join(wheel.file_name().unwrap());
    std::fs::copy(wheel, &copy).unwrap();
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o644)).unwrap();
    let venv = home.join("venv");
    let made = as_nobody(Command::new("setpriv"), &py)
        .args(["-m", "venv"])
        .arg(&venv)
        .output()
        .unwrap();
    assert!(made.status.success(), "venv: {}", text(&made.stderr));
    let start = Instant::now();
    let pip = as_nobody(Command::new("setpriv"), &venv.join("bin/python"))
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-index",
            "--no-cache-dir",
            "--disable-pip-version-check",
        ])
        .arg(&copy)
        .env_remove("PIP_INDEX_URL")
        .output()
        .unwrap();
    assert!(pip.status.success(), "pip install: {}", text(&pip.stderr));
    eprintln!(
        "pip install of the wheel: {:.1} s",
        start.elapsed().as_secs_f64()
    );
    venv
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Runs user_mount.py as nobody with the venv's python, in a private
/// mount namespace: `/dev/fuse` replaced by `fuse_node` if given, and each
/// of `hide` covered by /dev/null. The shell checks after Python's exit
/// that nothing is left mounted on the mountpoint (the namespace ends with
/// it).
fn run_as_user(
    scratch: &UserScratch,
    venv: &Path,
    mode: &str,
    fuse_node: Option<&Path>,
    hide: &[PathBuf],
) -> Output {
    let cfg = json!({
        "source": scratch.path("source"),
        "mountpoint": scratch.path("mnt"),
        "files": scratch.files,
        "mode": mode,
    });
    let script = package().join("tests/user_mount.py");
    let script_copy = scratch.path("home/user_mount.py");
    std::fs::copy(&script, &script_copy).unwrap();
    let home = scratch.path("home");
    let mut sh = String::from("set -e\n");
    if let Some(node) = fuse_node {
        sh += &format!("mount --bind '{}' /dev/fuse\n", node.display());
    }
    for h in hide {
        sh += &format!("mount --bind /dev/null '{}'\n", h.display());
    }
    sh += &format!(
        "set +e\nsetpriv --reuid=65534 --regid=65534 --clear-groups env -i PATH=/usr/bin:/bin \
         HOME='{home}' XDG_CACHE_HOME='{home}/.cache' '{py}' '{script}' \"$1\"\nrc=$?\n\
         if grep -q ' {mnt} ' /proc/self/mountinfo; then echo 'STILL MOUNTED after exit' >&2; exit 97; fi\n\
         exit $rc\n",
        home = home.display(),
        py = venv.join("bin/python").display(),
        script = script_copy.display(),
        mnt = scratch.path("mnt").display(),
    );
    let mut child = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", &sh, "sh"])
        .arg(cfg.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("unshare");
    // Far above the few seconds it takes: a hang fails instead of hanging.
    let limit = Duration::from_secs(600);
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("user_mount.py ({mode}) did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

/// The JSON line a run printed last.
fn facts(out: &Output) -> Value {
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "user_mount.py failed ({}):\nstdout: {stdout}\nstderr: {}",
        out.status,
        text(&out.stderr)
    );
    let line = stdout.lines().last().expect("a JSON line");
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"))
}

/// Everything the user-side tests need, or the reason to skip.
fn setup() -> Result<(&'static Wheel, UserScratch), String> {
    if let Some(why) = fuse_missing() {
        return Err(why);
    }
    for prog in ["unshare", "setpriv", "mknod"] {
        if which(prog).is_none() {
            return Err(format!("{prog} is not installed (util-linux, coreutils)"));
        }
    }
    user_python()?;
    let wheel = wheel()?;
    Ok((wheel, UserScratch::new()))
}

#[test]
fn a_user_pip_installs_the_wheel_and_mounts_reads_samples_and_unmounts() {
    let (wheel, scratch) = match setup() {
        Ok(s) => s,
        Err(why) => skip!("{why}"),
    };
    if sys_fusermount().is_none() {
        skip!("fusermount3 is not installed (apt install fuse3): a user cannot mount");
    }
    let node = match scratch.fuse_node() {
        Ok(n) => n,
        Err(why) => skip!("{why}"),
    };
    let venv = user_venv(&scratch, &wheel.path);
    let out = run_as_user(&scratch, &venv, "mount", Some(&node), &[]);
    let f = facts(&out);
    eprintln!("{}", text(&out.stderr));
    assert_eq!(f["uid"], NOBODY);
    assert_eq!(
        f["binary"].as_str().unwrap(),
        venv.join("bin/locafs").to_str().unwrap()
    );
    // The cache under $XDG_CACHE_HOME/locafs, owned by the user.
    let cache = scratch.path("home/.cache/locafs");
    assert_eq!(std::fs::metadata(&cache).unwrap().uid(), NOBODY);
    let entries: Vec<&str> = f["cache_entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(
        entries.iter().any(|e| e.starts_with("source-")),
        "no data set under {}: {entries:?}",
        cache.display()
    );
    // The daemons' logs, through Python's logging: without CAP_SYS_ADMIN
    // no passthrough, said at INFO; not one warning or error (an unmount
    // refused with EPERM was one, before fusermount3 -u took over).
    let lines: Vec<(String, String)> = serde_json::from_value(f["log"].clone()).unwrap();
    for (level, line) in &lines {
        eprintln!("  daemon {level}: {line}");
    }
    assert!(
        lines
            .iter()
            .any(|(l, m)| l == "INFO" && m.contains("passthrough off: it needs CAP_SYS_ADMIN")),
        "{lines:?}"
    );
    let bad: Vec<_> = lines
        .iter()
        .filter(|(l, _)| l != "INFO" && l != "DEBUG")
        .collect();
    assert!(bad.is_empty(), "warnings or errors: {bad:?}");
    assert!(f["usage_error"]
        .as_str()
        .unwrap()
        .contains("--no-such-option"));
    // Every daemon ended: closed, context-managed, and left for atexit.
    for key in ["with_pid", "atexit_pid"] {
        let pid = f[key].as_u64().unwrap() as u32;
        assert!(
            wait_for(Duration::from_secs(30), || !alive(pid)),
            "{key} {pid} still runs"
        );
    }
    assert!(!is_mounted(&scratch.path("mnt")));
}

/// The setuid helper where locafs looks for it.
fn sys_fusermount() -> Option<PathBuf> {
    ["fusermount3", "fusermount"].iter().find_map(|n| which(n))
}

#[test]
fn without_access_to_dev_fuse_a_user_gets_one_clear_message() {
    let (wheel, scratch) = match setup() {
        Ok(s) => s,
        Err(why) => skip!("{why}"),
    };
    let mode = std::fs::metadata("/dev/fuse").unwrap().permissions().mode();
    if mode & 0o006 == 0o006 {
        skip!("/dev/fuse is usable by every user here (mode {mode:o}): nothing to refuse");
    }
    let venv = user_venv(&scratch, &wheel.path);
    let out = run_as_user(&scratch, &venv, "error", None, &[]);
    let f = facts(&out);
    assert_eq!(f["type"], "MountError", "{f}");
    assert_eq!(f["returncode"], 2, "{f}");
    let msg = f["message"].as_str().unwrap();
    assert!(
        msg.starts_with(&format!(
            "cannot open /dev/fuse (permission denied, mode {:04o}): mounting as a user needs /dev/fuse readable and writable by all",
            mode & 0o7777
        )),
        "{msg}"
    );
}

#[test]
fn without_fusermount3_a_user_gets_one_clear_message() {
    let (wheel, scratch) = match setup() {
        Ok(s) => s,
        Err(why) => skip!("{why}"),
    };
    let node = match scratch.fuse_node() {
        Ok(n) => n,
        Err(why) => skip!("{why}"),
    };
    // Every place locafs (and fuser) would find the helper, covered.
    let mut hide: Vec<PathBuf> = Vec::new();
    for dir in ["/usr/local/bin", "/usr/bin", "/bin", "/usr/sbin", "/sbin"] {
        for name in ["fusermount3", "fusermount"] {
            if let Ok(p) = std::fs::canonicalize(Path::new(dir).join(name)) {
                if !hide.contains(&p) {
                    hide.push(p);
                }
            }
        }
    }
    let venv = user_venv(&scratch, &wheel.path);
    let out = run_as_user(&scratch, &venv, "error", Some(&node), &hide);
    let f = facts(&out);
    assert_eq!(f["type"], "MountError", "{f}");
    let msg = f["message"].as_str().unwrap();
    assert!(
        msg.starts_with("mounting as a user needs fusermount3, the setuid FUSE helper"),
        "{msg}"
    );
}

#[test]
fn auditwheel_names_the_manylinux_tag_the_wheel_carries() {
    let wheel = match wheel() {
        Ok(w) => w,
        Err(why) => skip!("{why}"),
    };
    let Some(auditwheel) = tool("AUDITWHEEL", "auditwheel") else {
        skip!("auditwheel is not installed (pip install auditwheel; .ci/run installs it)");
    };
    let out = Command::new(&auditwheel)
        .arg("show")
        .arg(&wheel.path)
        .output()
        .unwrap();
    let said = text(&out.stdout).replace('\n', " ");
    assert!(
        out.status.success(),
        "auditwheel show: {said} {}",
        text(&out.stderr)
    );
    let name = wheel
        .path
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    // locafs-VERSION-py3-none-PLATFORM.whl
    let platform = name
        .trim_end_matches(".whl")
        .rsplit('-')
        .next()
        .unwrap()
        .to_owned();
    assert!(platform.starts_with("manylinux_"), "{name}");
    assert!(
        said.contains(&format!(
            "consistent with the following platform tag: \"{platform}\""
        )),
        "auditwheel does not name {platform}: {said}"
    );
    // The wheel: the binary as a script, the package, no ABI tag.
    let list = Command::new("python3")
        .args(["-m", "zipfile", "-l"])
        .arg(&wheel.path)
        .output()
        .unwrap();
    let listing = text(&list.stdout);
    for want in [
        ".data/scripts/locafs",
        "locafs/__init__.py",
        "locafs/_daemon.py",
        "locafs/sampler.py",
    ] {
        assert!(
            listing.contains(want),
            "{want} not in the wheel:\n{listing}"
        );
    }
    assert!(name.contains("-py3-none-"), "{name}");
    eprintln!(
        "wheel {name}: {} bytes, built in {:.1} s; {platform}",
        wheel.bytes, wheel.seconds
    );
}
