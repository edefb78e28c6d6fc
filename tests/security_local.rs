//! Several users on one node (issue 33): a root mount made with the
//! defaults, and user `nobody` (`setpriv --reuid=65534 --regid=65534
//! --clear-groups`) trying what the source would refuse them, through the
//! cache directory, the log, the control socket and the mount helper; a
//! cache directory with symlinks and entries planted by another user;
//! secrets written and read; a source that does not answer at start.
//!
//! Real `locafs` processes and real FUSE mounts; docs/security.md cites
//! each test for the behaviour it shows.

mod common;

use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;

fn chmod(p: &Path, mode: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
}

fn mode_of(p: &Path) -> u32 {
    fs::symlink_metadata(p).unwrap().mode() & 0o7777
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `locafs ARGS` as nobody.
fn locafs_as_nobody(args: &[&OsStr]) -> Result<Output, String> {
    Ok(as_nobody(bin())?
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap())
}

/// A scratch directory other users may enter (a tempdir is 0700), with a
/// source holding what nobody may read: `secret.txt` (0600) and
/// `private/` (0700), beside public files.
struct Shared {
    s: Scratch,
    secret: Vec<u8>,
}

const HIDDEN_NAME: &str = "hidden-name-42.bin";

impl Shared {
    fn new() -> Shared {
        let s = Scratch::new();
        for d in [s.path(), &s.src, &s.mnt] {
            chmod(d, 0o755);
        }
        let secret = format!("TOPSECRET-{}", std::process::id()).into_bytes();
        fs::write(s.src.join("public.txt"), b"for everyone").unwrap();
        fs::write(s.src.join("secret.txt"), &secret).unwrap();
        chmod(&s.src.join("secret.txt"), 0o600);
        fs::create_dir(s.src.join("private")).unwrap();
        fs::write(s.src.join("private").join(HIDDEN_NAME), b"PRIVATEBYTES").unwrap();
        chmod(&s.src.join("private"), 0o700);
        fs::create_dir(s.src.join("pub")).unwrap();
        fs::write(s.src.join("pub/a.bin"), vec![7u8; 300_000]).unwrap();
        Shared { s, secret }
    }

    fn log(&self) -> PathBuf {
        self.s.path().join("locafs.log")
    }

    /// Reads every file through the mount as root, so that all of it is
    /// cached.
    fn cache_everything(&self, m: &Mount) {
        for f in ["public.txt", "secret.txt", "pub/a.bin"] {
            fs::read(self.s.mnt.join(f)).unwrap();
        }
        fs::read(self.s.mnt.join("private").join(HIDDEN_NAME)).unwrap();
        wait_until("4 files cached", Duration::from_secs(30), || {
            m.stat("files_cached") >= 4
        });
    }
}

/// Entries under `dir` (itself included) that the group or others may use,
/// or that are sockets: (path, mode).
fn loose_entries(dir: &Path) -> Vec<(PathBuf, u32)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        let m = fs::symlink_metadata(&d).unwrap();
        if m.mode() & 0o077 != 0 || m.file_type().is_symlink() {
            out.push((d.clone(), m.mode()));
        }
        if m.is_dir() {
            for e in fs::read_dir(&d).unwrap().flatten() {
                stack.push(e.path());
            }
        } else {
            use std::os::unix::fs::FileTypeExt;
            if m.file_type().is_socket() {
                out.push((d.clone(), m.mode()));
            }
        }
    }
    out
}

/// Every mode under `dir` is exactly 0700 (directories) or 0600 (files).
fn assert_exactly_owner_only(dir: &Path) {
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        let m = fs::symlink_metadata(&d).unwrap();
        let want = if m.is_dir() { 0o700 } else { 0o600 };
        assert_eq!(m.mode() & 0o7777, want, "{}", d.display());
        if m.is_dir() {
            for e in fs::read_dir(&d).unwrap().flatten() {
                stack.push(e.path());
            }
        }
    }
}

/// What nobody gets out of the cache directory and the log by every means
/// a shell gives them: nothing of the secret file's bytes, nothing of the
/// private directory's names or bytes.
fn nobody_finds_nothing(sh: &Shared) {
    let cache = sh.s.cache.display().to_string();
    let log = sh.log().display().to_string();
    let script = format!(
        "cat {cache}/*/blocks/*/*.data {cache}/*/blocks/*/*.meta {cache}/*/manifest \
         {cache}/*/index/* {cache}/budget.json {log}; ls -laR {cache}; \
         grep -r {HIDDEN_NAME} {cache} {log}; true"
    );
    let out = as_nobody("/bin/sh")
        .unwrap()
        .args(["-c", &script])
        .output()
        .unwrap();
    let all = [out.stdout.as_slice(), out.stderr.as_slice()].concat();
    let seen = String::from_utf8_lossy(&all);
    assert!(
        !all.windows(sh.secret.len()).any(|w| w == sh.secret),
        "nobody read the 0600 file's bytes from the cache:\n{seen}"
    );
    assert!(!seen.contains("PRIVATEBYTES"), "{seen}");
    // (The name appears in the error messages of the shell only if
    // something listed it.)
    assert!(
        !seen.contains(&format!("{HIDDEN_NAME}\n")) && !seen.contains(&format!("/{HIDDEN_NAME}")),
        "nobody found a name inside the 0700 directory:\n{seen}"
    );
    // Through the mount, the source's modes hold.
    let out = as_nobody("cat")
        .unwrap()
        .arg(sh.s.mnt.join("secret.txt"))
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "nobody read secret.txt through the mount"
    );
}

#[test]
fn nobody_reads_nothing_from_the_cache_that_the_source_refuses_them() {
    require_fuse!();
    if let Err(why) = as_nobody("true") {
        return skipped(module_path!(), &why);
    }
    let sh = Shared::new();
    let log = sh.log();
    let log_arg = log.display().to_string();
    // The defaults a new user has: umask 022.
    let mut m = Mount::start_umask(
        &sh.s.src,
        &sh.s.mnt,
        &sh.s.cache,
        &["--log-file", &log_arg],
        0o022,
        &sh.s.path().join("stderr"),
    );
    sh.cache_everything(&m);
    nobody_finds_nothing(&sh);
    assert!(
        loose_entries(&sh.s.cache).is_empty(),
        "{:?}",
        loose_entries(&sh.s.cache)
    );
    assert_eq!(mode_of(&log), 0o600);
    let xattr = locafs::sys::getxattr(&sh.s.mnt, "user.locafs.control").unwrap();
    assert!(
        xattr.starts_with(b"@"),
        "the control socket is a file: {xattr:?}"
    );
    // After the unmount (the manifest and the ledger written last).
    assert_eq!(m.unmount().code(), Some(0), "{}", m.stderr());
    assert!(sh.s.dataset_dir().join("manifest").exists());
    assert!(
        loose_entries(&sh.s.cache).is_empty(),
        "{:?}",
        loose_entries(&sh.s.cache)
    );
    nobody_finds_nothing(&sh);
}

#[test]
fn everything_in_the_cache_directory_is_owner_only_whatever_the_umask() {
    require_fuse!();
    let sh = Shared::new();
    let log = sh.log();
    let log_arg = log.display().to_string();
    let mut m = Mount::start_umask(
        &sh.s.src,
        &sh.s.mnt,
        &sh.s.cache,
        &["--log-file", &log_arg],
        0o000,
        &sh.s.path().join("stderr"),
    );
    sh.cache_everything(&m);
    assert_exactly_owner_only(&sh.s.cache);
    assert_eq!(mode_of(&log), 0o600);
    assert_eq!(m.unmount().code(), Some(0), "{}", m.stderr());
    assert_exactly_owner_only(&sh.s.cache);
}

#[test]
fn a_cache_of_an_older_locafs_is_made_owner_only_once_at_its_first_mount() {
    require_fuse!();
    let sh = Shared::new();
    let s = &sh.s;
    let mut m = Mount::start(&s.src, &s.mnt, &s.cache, &[]);
    sh.cache_everything(&m);
    assert_eq!(m.unmount().code(), Some(0), "{}", m.stderr());
    // As an older locafs left it: 0755 directories, 0644 files, no mark.
    let ds = s.dataset_dir();
    let _ = fs::remove_file(ds.join("owner-only"));
    let st = Command::new("chmod")
        .args(["-R", "u=rwX,go=rX"])
        .arg(&s.cache)
        .status()
        .unwrap();
    assert!(st.success());
    let loose = loose_entries(&s.cache).len();
    assert!(loose > 10, "{loose}");
    let log = s.path().join("remount.log");
    let mut m = Mount::start_logged(&s.src, &s.mnt, &s.cache, &[], &log);
    assert!(
        loose_entries(&s.cache).is_empty(),
        "{:?}",
        loose_entries(&s.cache)
    );
    let said = fs::read_to_string(&log).unwrap();
    assert!(said.contains("owner-only"), "{said}");
    // Still the same cache: nothing is fetched again.
    s.check_files_through_mount();
    assert_eq!(fs::read(s.mnt.join("public.txt")).unwrap(), b"for everyone");
    assert_eq!(m.stat("source_bytes"), 0, "{}", m.stats());
    assert_eq!(m.unmount().code(), Some(0));
    // Once: with the mark there, the walk does not run again (a file
    // loosened by hand below the 0700 directories stays as it is).
    let meta = common::cache_files(&s.cache, "data").pop().unwrap();
    chmod(&meta, 0o644);
    let mut m = Mount::start(&s.src, &s.mnt, &s.cache, &[]);
    assert_eq!(mode_of(&meta), 0o644);
    assert_eq!(mode_of(&ds), 0o700);
    assert_eq!(mode_of(&s.cache), 0o700);
    assert_eq!(m.unmount().code(), Some(0));
}

/// `locafs mount` that is expected to fail: its exit code and stderr.
fn mount_fails(src: &Path, mnt: &Path, cache: &Path, extra: &[&str]) -> (Option<i32>, String) {
    let mut m = Mount::spawn(src, mnt, cache, extra);
    let code = m
        .wait_exit(Duration::from_secs(30))
        .map(|st| st.code())
        .unwrap_or_else(|| panic!("still running: {}", m.stderr()));
    assert!(!is_mounted(mnt));
    (code, m.stderr())
}

#[test]
fn a_cache_directory_others_may_write_or_own_is_refused_with_what_to_run() {
    require_fuse!();
    let s = Scratch::with_sample_files();
    // Readable by all (a hostPath, /var/cache/locafs of an older version):
    // ours, so it is fixed.
    chmod(&s.cache, 0o755);
    let mut m = Mount::start(&s.src, &s.mnt, &s.cache, &[]);
    assert_eq!(mode_of(&s.cache), 0o700);
    assert_eq!(m.unmount().code(), Some(0));
    // Writable by every user: anyone could have planted things (unless it
    // is empty: a fresh tmpfs is 1777).
    let fresh = s.path().join("fresh");
    fs::create_dir(&fresh).unwrap();
    chmod(&fresh, 0o1777);
    let mut m = Mount::start(&s.src, &s.mnt, &fresh, &[]);
    assert_eq!(mode_of(&fresh), 0o700);
    assert_eq!(m.unmount().code(), Some(0));
    chmod(&s.cache, 0o777);
    let (code, err) = mount_fails(&s.src, &s.mnt, &s.cache, &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("writable by every user")
            && err.contains(&format!("chmod -R go-rwx {}", s.cache.display())),
        "{err}"
    );
    chmod(&s.cache, 0o700);
    // A data set directory another user made.
    let ds = s.dataset_dir();
    std::os::unix::fs::chown(&ds, Some(NOBODY), Some(NOBODY)).unwrap();
    let (code, err) = mount_fails(&s.src, &s.mnt, &s.cache, &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains(&format!("belongs to uid {NOBODY}")) && err.contains("chown -R 0"),
        "{err}"
    );
    // A cache directory another user owns.
    std::os::unix::fs::chown(&ds, Some(0), Some(0)).unwrap();
    std::os::unix::fs::chown(&s.cache, Some(NOBODY), Some(NOBODY)).unwrap();
    let (code, err) = mount_fails(&s.src, &s.mnt, &s.cache, &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains(&format!("belongs to uid {NOBODY}")), "{err}");
    // `locafs cache` refuses it as well.
    let out = run_locafs(&[
        OsStr::new("cache"),
        OsStr::new("ls"),
        OsStr::new("--cache-dir"),
        s.cache.as_os_str(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("belongs to uid"), "{}", text(&out));
}

#[test]
fn symlinks_and_entries_planted_in_a_cache_directory_are_never_followed() {
    require_fuse!();
    if let Err(why) = as_nobody("true") {
        return skipped(module_path!(), &why);
    }
    let s = Scratch::with_sample_files();
    chmod(s.path(), 0o755);
    let victim = s.path().join("victim");
    fs::write(&victim, b"root's file").unwrap();
    chmod(&victim, 0o644);
    let untouched = || {
        assert_eq!(
            fs::read(&victim).unwrap(),
            b"root's file",
            "the victim was written"
        );
    };
    let cache_rm = |cache: &Path, id: &str| {
        run_locafs(&[
            OsStr::new("cache"),
            OsStr::new("rm"),
            OsStr::new(id),
            OsStr::new("--cache-dir"),
            cache.as_os_str(),
        ])
    };

    // 1. CACHE/ds/lock -> VICTIM, then `locafs cache rm ds`.
    let mut m = Mount::start(&s.src, &s.mnt, &s.cache, &[]);
    m.unmount();
    let ds = s.dataset_dir();
    let id = ds.file_name().unwrap().to_str().unwrap().to_owned();
    fs::remove_file(ds.join("lock")).unwrap();
    std::os::unix::fs::symlink(&victim, ds.join("lock")).unwrap();
    let out = cache_rm(&s.cache, &id);
    assert!(!out.status.success());
    assert!(text(&out).contains("is a symlink"), "{}", text(&out));
    untouched();
    // A mount over it is refused too.
    let (code, err) = mount_fails(&s.src, &s.mnt, &s.cache, &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("is a symlink"), "{err}");
    untouched();

    // 2. CACHE/evil -> OUTSIDE, then `locafs cache rm evil`.
    let outside = s.path().join("outside");
    fs::create_dir(&outside).unwrap();
    std::os::unix::fs::symlink(&outside, s.cache.join("evil")).unwrap();
    let out = cache_rm(&s.cache, "evil");
    assert!(!out.status.success());
    assert!(text(&out).contains("is a symlink"), "{}", text(&out));
    assert_eq!(
        fs::read_dir(&outside).unwrap().count(),
        0,
        "written outside"
    );

    // 3. A shared cache directory (1777, as /tmp) where nobody made the
    //    data set's directory first, with its lock and write probe linked
    //    to a root file; data set ids are predictable.
    let shared = s.path().join("shared");
    fs::create_dir(&shared).unwrap();
    chmod(&shared, 0o1777);
    let plant = format!(
        "mkdir {d} && ln -s {v} {d}/lock && ln -s {v} {d}/.write-test",
        d = shared.join("ds2").display(),
        v = victim.display()
    );
    let out = as_nobody("/bin/sh")
        .unwrap()
        .args(["-c", &plant])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let (code, err) = mount_fails(&s.src, &s.mnt, &shared, &["--dataset-id", "ds2"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("writable by every user"), "{err}");
    untouched();
    // The same directory made root's and 0755 by hand: the data set
    // directory is still nobody's, and refused.
    chmod(&shared, 0o755);
    let (code, err) = mount_fails(&s.src, &s.mnt, &shared, &["--dataset-id", "ds2"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains(&format!("belongs to uid {NOBODY}")), "{err}");
    untouched();
}

#[test]
fn secrets_are_written_owner_only_and_refused_when_others_may_read_them() {
    let d = tempfile::tempdir().unwrap();
    let sh = |script: &str| {
        Command::new("/bin/sh")
            .args(["-c", script])
            .env("LOCAFS", bin())
            .current_dir(d.path())
            .output()
            .unwrap()
    };
    // --out under umask 022: 0600.
    let out = sh("umask 022; \"$LOCAFS\" secret --out s1");
    assert!(out.status.success(), "{}", text(&out));
    let s1 = d.path().join("s1");
    assert_eq!(mode_of(&s1), 0o600);
    let secret = fs::read_to_string(&s1).unwrap();
    assert!(secret.starts_with("locafs-secret-v1:"), "{secret}");
    // Never over an existing file.
    let out = sh("\"$LOCAFS\" secret --out s1");
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out).contains("exists"), "{}", text(&out));
    assert_eq!(fs::read_to_string(&s1).unwrap(), secret);
    // `> FILE` under umask 022: the shell made a 0644 file; refused, and
    // the file holds nothing.
    let out = sh("umask 022; \"$LOCAFS\" secret > s2");
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out).contains("--out FILE"), "{}", text(&out));
    assert_eq!(fs::read(d.path().join("s2")).unwrap(), b"");
    // Under umask 077, and into a pipe: printed.
    let out = sh("umask 077; \"$LOCAFS\" secret > s3 && \"$LOCAFS\" secret | cat");
    assert!(out.status.success(), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("locafs-secret-v1:"));
    assert!(fs::read_to_string(d.path().join("s3"))
        .unwrap()
        .starts_with("locafs-secret-v1:"));

    // A secret or a key others may read is refused before anything is
    // mounted, with the chmod to run.
    if fuse_missing().is_some() {
        return skipped(module_path!(), "the mount half needs /dev/fuse");
    }
    let s = Scratch::with_sample_files();
    chmod(&s1, 0o644);
    let addr = format!("127.0.0.1:{}", free_udp_port());
    let peer = ["--listen", &addr, "--peers", &addr];
    let secret_arg = s1.display().to_string();
    let mut args = peer.to_vec();
    args.extend(["--cluster-secret-file", &secret_arg]);
    let (code, err) = mount_fails(&s.src, &s.mnt, &s.cache, &args);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("the group or others may read it (mode 0644)")
            && err.contains(&format!("chmod 600 {}", s1.display())),
        "{err}"
    );
    let files = common::pki::TestCa::new("test CA").node_files(d.path(), "n1", "n1.example.com");
    chmod(&files.key, 0o640);
    let (ca, cert, key) = (
        files.ca.display().to_string(),
        files.cert.display().to_string(),
        files.key.display().to_string(),
    );
    let mut args = peer.to_vec();
    args.extend(["--peer-ca", &ca, "--peer-cert", &cert, "--peer-key", &key]);
    let (code, err) = mount_fails(&s.src, &s.mnt, &s.cache, &args);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains(&format!("--peer-key {key}: the group or others")),
        "{err}"
    );
    // Made owner-only, the same mount starts.
    chmod(&files.key, 0o600);
    let mut m = Mount::start(&s.src, &s.mnt, &s.cache, &args);
    assert_eq!(m.unmount().code(), Some(0), "{}", m.stderr());
}

#[test]
fn the_mount_helper_passes_option_values_as_they_are() {
    // Files whose names the options would glob-match in the directory
    // mount(8) runs the helper from.
    let d = tempfile::tempdir().unwrap();
    for f in ["dataset_id=pwn", "peers=1:7070", "peers=::7070"] {
        fs::write(d.path().join(f), b"").unwrap();
    }
    let helper = Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/mount.fuse.locafs");
    let out = Command::new("sh")
        .arg(&helper)
        .args(["/src", "/mnt", "-f", "-v", "-o"])
        .arg("dataset_id=*,peers=[::1]:7070,listen=[::]:7070")
        .env("LOCAFS_BIN", bin())
        .current_dir(d.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("-o dataset_id=*,peers=[::1]:7070,listen=[::]:7070 "),
        "option values were changed: {err}"
    );
    assert!(
        !err.contains("pwn") && !err.contains("peers=1:7070"),
        "{err}"
    );
}

/// The `where --json` answer of `locafs where MNT FILES...`, as nobody.
fn where_as_nobody(mnt: &Path, files: &[&str]) -> serde_json::Value {
    let mut args: Vec<&OsStr> = vec![OsStr::new("where"), mnt.as_os_str()];
    let paths: Vec<PathBuf> = files.iter().map(|f| mnt.join(f)).collect();
    args.extend(paths.iter().map(|p| p.as_os_str()));
    args.push(OsStr::new("--json"));
    let out = locafs_as_nobody(&args).unwrap();
    assert!(out.status.success(), "{}", text(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Python 3 that user nobody can run (not one under /root), with the
/// package on its path.
fn python_as_nobody(code: &str, arg: &Path) -> Result<Output, String> {
    let py = ["/usr/bin/python3", "/usr/local/bin/python3"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .ok_or("no python3 outside /root")?;
    // A copy of the package that nobody may read: the checkout may sit in
    // a directory only its owner can enter (a clone under `mktemp -d`).
    let pkg = tempfile::tempdir().unwrap();
    fs::set_permissions(pkg.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let to = pkg.path().join("locafs");
    fs::create_dir(&to).unwrap();
    let from = Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/python/locafs");
    for e in fs::read_dir(&from).unwrap().flatten() {
        if e.path().extension().is_some_and(|x| x == "py") {
            fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
    fs::set_permissions(&to, fs::Permissions::from_mode(0o755)).unwrap();
    Ok(as_nobody(py)?
        .args(["-c", code])
        .arg(arg)
        .env("PYTHONPATH", pkg.path())
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .unwrap())
}

const SAMPLER: &str = "import sys, locafs\n\
locafs.LocalitySampler(['public.txt'], sys.argv[1], batch_size=1)\n";

#[test]
fn a_local_user_may_ask_where_and_plan_about_what_they_can_reach_but_not_warm() {
    require_fuse!();
    if let Err(why) = as_nobody("true") {
        return skipped(module_path!(), &why);
    }
    let sh = Shared::new();
    let s = &sh.s;
    let mut m = Mount::start_umask(&s.src, &s.mnt, &s.cache, &[], 0o022, &s.path().join("e1"));
    sh.cache_everything(&m);
    let private = format!("private/{HIDDEN_NAME}");

    // where, about given files: one they cannot reach is not found.
    let w = where_as_nobody(&s.mnt, &[&private, "public.txt"]);
    assert_eq!(w["owners"], serde_json::json!([null, 0]), "{w}");
    assert_eq!(w["unknown"], 1, "{w}");
    // Root gets both.
    let out = run_locafs(&[
        OsStr::new("where"),
        s.mnt.as_os_str(),
        s.mnt.join(&private).as_os_str(),
        OsStr::new("--json"),
    ]);
    let w: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(w["owners"], serde_json::json!([0]), "{w}");
    // where, about the whole data set: what they could list.
    let w = where_as_nobody(&s.mnt, &[]);
    let mut paths: Vec<String> = serde_json::from_value(w["paths"].clone()).unwrap();
    paths.sort();
    assert_eq!(paths, ["pub/a.bin", "public.txt", "secret.txt"], "{w}");

    // plan: what they cannot reach counts as not found.
    let list = s.path().join("plan.txt");
    fs::write(&list, format!("{private}\npublic.txt\npub/a.bin\n")).unwrap();
    chmod(&list, 0o644);
    let out = locafs_as_nobody(&[OsStr::new("plan"), s.mnt.as_os_str(), list.as_os_str()]).unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("plan: 2 files in order, 1 paths not found"),
        "{}",
        text(&out)
    );
    // stats: the mount root's extended attribute, readable by whoever may
    // read the root.
    let out = locafs_as_nobody(&[OsStr::new("stats"), s.mnt.as_os_str()]).unwrap();
    assert!(out.status.success(), "{}", text(&out));
    // warm makes the mount fetch and keep data: the owner's.
    let out =
        locafs_as_nobody(&[OsStr::new("warm"), s.mnt.join("public.txt").as_os_str()]).unwrap();
    assert!(!out.status.success());
    assert!(text(&out).contains("only its owner"), "{}", text(&out));
    // The Python sampler: a mount without peers, so it falls back, and
    // says that this is why.
    if let Ok(out) = python_as_nobody(SAMPLER, &s.mnt) {
        assert!(out.status.success(), "{}", text(&out));
        assert!(text(&out).contains("has no peers"), "{}", text(&out));
    }
    assert_eq!(m.unmount().code(), Some(0));

    // A mount whose root nobody may not read: refused, saying why; by the
    // daemon itself too, to a client that knows the socket's name.
    // (A cache of its own: the first one's manifest would show the root
    // as it was.)
    chmod(&s.src, 0o700);
    let mut m = Mount::start(&s.src, &s.mnt, &s.path().join("cache2"), &[]);
    let out = locafs_as_nobody(&[OsStr::new("where"), s.mnt.as_os_str()]).unwrap();
    assert!(!out.status.success());
    assert!(
        text(&out).contains("may not read the mount root"),
        "{}",
        text(&out)
    );
    let name = locafs::sys::getxattr(&s.mnt, "user.locafs.control").unwrap();
    let name = String::from_utf8(name).unwrap();
    let ask = "import socket, sys\n\
s = socket.socket(socket.AF_UNIX)\n\
s.connect('\\0' + sys.argv[1][1:])\n\
s.sendall(b'{\"op\": \"where\"}\\n')\n\
print(s.makefile().readline())\n";
    match python_as_nobody(ask, Path::new(&name)) {
        Ok(out) => {
            assert!(out.status.success(), "{}", text(&out));
            let answer = text(&out);
            assert!(
                answer.contains("\"refused\":true")
                    && answer.contains("uid 65534 may not read the mount root"),
                "{answer}"
            );
            assert!(!answer.contains("public.txt"), "{answer}");
            let out = python_as_nobody(SAMPLER, &s.mnt).unwrap();
            assert!(
                text(&out).contains("control socket cannot be used")
                    && text(&out).contains("may not read the mount root"),
                "{}",
                text(&out)
            );
            let out = python_as_nobody(SAMPLER, s.path()).unwrap();
            assert!(
                text(&out).contains("not the root of a locafs mount"),
                "{}",
                text(&out)
            );
        }
        Err(why) => skipped(module_path!(), &format!("the Python half: {why}")),
    }
    assert_eq!(m.unmount().code(), Some(0));
}

/// The peak resident memory of process `pid` in KiB (/proc/PID/status).
fn peak_rss_kib(pid: u32) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn a_refused_caller_gets_its_answer_and_a_closed_connection_before_any_request_is_read() {
    require_fuse!();
    if let Err(why) = as_nobody("true") {
        return skipped(module_path!(), &why);
    }
    let sh = Shared::new();
    let s = &sh.s;
    // A mount root nobody may not read: nobody is refused.
    chmod(&s.src, 0o700);
    let mut m = Mount::start(&s.src, &s.mnt, &s.cache, &[]);
    let pid = m.pid().unwrap();
    let name =
        String::from_utf8(locafs::sys::getxattr(&s.mnt, "user.locafs.control").unwrap()).unwrap();
    let before = peak_rss_kib(pid);
    // A `where` announcing a payload of 256 MiB, and 4 MiB of it sent: a
    // daemon that read the request would make room for it and wait for
    // the rest (no answer within the minute).
    let ask = r#"import socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(60)
s.connect('\0' + sys.argv[1][1:])
try:
    s.sendall(b'{"op": "where", "payload": 268435455}\n')
    s.sendall(b'x' * (4 << 20))
except OSError as e:
    print('send failed:', type(e).__name__)
f = s.makefile('rb')
try:
    print('answer:', f.readline().decode().strip())
    print('closed' if f.read() == b'' else 'more')
except ConnectionResetError:
    print('closed')
except socket.timeout:
    print('no answer, still open')
"#;
    match python_as_nobody(ask, Path::new(&name)) {
        Ok(out) => {
            assert!(out.status.success(), "{}", text(&out));
            let said = text(&out);
            assert!(
                said.contains("\"refused\":true")
                    && said.contains("uid 65534 may not read the mount root"),
                "{said}"
            );
            assert!(said.trim_end().ends_with("closed"), "{said}");
            let grew = peak_rss_kib(pid).saturating_sub(before);
            assert!(
                grew < 64 << 10,
                "the daemon's peak memory grew by {grew} KiB for a refused request"
            );
        }
        Err(why) => skipped(module_path!(), &format!("the Python half: {why}")),
    }
    // The daemon still serves its owner.
    let out = run_locafs(&[OsStr::new("where"), s.mnt.as_os_str()]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(m.unmount().code(), Some(0));
}

#[test]
fn no_control_socket_path_another_user_can_take_first() {
    require_fuse!();
    // A cache path too long for a socket address: a locafs before the
    // abstract socket fell back to /tmp/locafs-<hash>.sock, which another
    // user could make first (here a directory) to make the mount fail.
    let s = Scratch::with_sample_files();
    let deep = s.path().join("c".repeat(60)).join("d".repeat(60));
    fs::create_dir_all(&deep).unwrap();
    let id = "dataset";
    let ds = fs::canonicalize(&deep).unwrap().join(id);
    let h = blake3::hash(ds.as_os_str().as_encoded_bytes()).to_hex();
    let squat = std::env::temp_dir().join(format!("locafs-{}.sock", &h[..16]));
    let _ = fs::create_dir(&squat);
    let mut m =
        Mount::try_start(&s.src, &s.mnt, &deep, &["--dataset-id", id]).unwrap_or_else(|e| {
            let _ = fs::remove_dir(&squat);
            panic!("{e}")
        });
    let _ = fs::remove_dir(&squat);
    s.check_files_through_mount();
    let name = locafs::sys::getxattr(&s.mnt, "user.locafs.control").unwrap();
    assert!(name.starts_with(b"@locafs-"), "{name:?}");
    // And it answers.
    let out = run_locafs(&[OsStr::new("where"), s.mnt.as_os_str()]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(m.unmount().code(), Some(0));
}

/// The hard limit on open files of process `pid` (/proc/PID/limits).
fn hard_nofile(pid: u32) -> u64 {
    let limits = fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    line.split_whitespace().nth(4).unwrap().parse().unwrap()
}

#[test]
fn an_accept_that_fails_pauses_instead_of_spinning() {
    require_fuse!();
    let s = Scratch::with_sample_files();
    let mut m = Mount::start(&s.src, &s.mnt, &s.cache, &[]);
    // Serving (its FUSE threads have their descriptors: they take them
    // after the mount shows), and the socket's name known, before the
    // descriptors run short.
    s.check_files_through_mount();
    let name = locafs::sys::getxattr(&s.mnt, "user.locafs.control").unwrap();
    let name = String::from_utf8(name).unwrap();
    let connect = || {
        use std::os::linux::net::SocketAddrExt;
        use std::os::unix::net::{SocketAddr, UnixStream};
        let addr = match name.strip_prefix('@') {
            Some(n) => SocketAddr::from_abstract_name(n).unwrap(),
            None => SocketAddr::from_pathname(&name).unwrap(),
        };
        UnixStream::connect_addr(&addr).expect("connect")
    };
    // The serving process (the control socket is its; `m` is the holder).
    let pid = common::restart::server_pid(&s.mnt).unwrap();
    let open_fds = || fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count() as u64;
    use rustix::process::{prlimit, Pid, Resource, Rlimit};
    let p = Pid::from_raw(pid as i32);
    // Room for two more descriptors: the third connection waits in the
    // backlog, and every accept of it fails with EMFILE.
    let old = prlimit(
        p,
        Resource::Nofile,
        Rlimit {
            current: Some(open_fds() + 2),
            maximum: Some(hard_nofile(pid)),
        },
    )
    .unwrap();
    let clients: Vec<_> = (0..8).map(|_| connect()).collect();
    std::thread::sleep(Duration::from_millis(500));
    // The baseline, in the same window: what a loop with no pause gets of
    // this machine now (a loaded machine gives any loop less).
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let spin = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                n = std::hint::black_box(n + 1);
            }
            let mut t = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: writes one timespec of ours.
            unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
            Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
        })
    };
    let before = cpu_time(pid).unwrap();
    let window = Duration::from_secs(3);
    std::thread::sleep(window);
    let used = cpu_time(pid).unwrap() - before;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let spun = spin.join().unwrap();
    prlimit(p, Resource::Nofile, old).unwrap();
    eprintln!(
        "daemon CPU while accept fails: {used:?} in {window:?}; a loop with no pause: {spun:?}"
    );
    // A loop with no pause gets about what the baseline gets; a pause of
    // 100 ms between tries takes milliseconds.
    assert!(
        spun > Duration::from_millis(100),
        "the baseline did not run: {spun:?}"
    );
    assert!(
        used < spun / 5,
        "{used:?} of CPU in {window:?}, a loop with no pause {spun:?}"
    );
    // It did fail, and said so once per run of failures, not once per try
    // (about 30 in the window; descriptors that the cache's books take and
    // give back let an accept through now and then).
    let said = m.stderr();
    let n = said.matches("accept failed").count();
    assert!((1..=10).contains(&n), "{n} times: {said}");
    // The waiting connections are served once descriptors are back.
    drop(clients);
    let out = run_locafs(&[OsStr::new("where"), s.mnt.as_os_str()]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(m.unmount().code(), Some(0));
}

#[test]
fn a_source_that_does_not_answer_at_start_ends_the_mount_command() {
    require_fuse!();
    // The source: a directory served by another locafs process (attributes
    // never cached by the kernel: --revalidate 0s), stopped with SIGSTOP,
    // as a hung NFS server leaves its clients.
    let s = Scratch::with_sample_files();
    let server_mnt = s.path().join("server");
    let server_cache = s.path().join("server-cache");
    fs::create_dir_all(&server_mnt).unwrap();
    let server = Mount::start(
        &s.src,
        &server_mnt,
        &server_cache,
        &["--no-readahead", "--no-passthrough", "--revalidate", "0s"],
    );
    // (its serving process: stopping its holder would stop nothing)
    let server_pid = common::restart::server_pid(&server_mnt).unwrap();
    signal(server_pid, Signal::STOP).unwrap();
    let cont = ResumeOnDrop(server_pid);
    for daemon in [false, true] {
        let mut cmd = Command::new(bin());
        cmd.arg("mount");
        if daemon {
            cmd.arg("--daemon");
        }
        let mut child = cmd
            .arg(&server_mnt)
            .arg(&s.mnt)
            .args(["--metadata-timeout", "1s", "--cache-dir"])
            .arg(&s.cache)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let t = Instant::now();
        let limit = Duration::from_secs(30);
        while child.try_wait().unwrap().is_none() {
            if t.elapsed() > limit {
                // Hung in the kernel on the source: let it go, then fail.
                let _ = signal(server_pid, Signal::CONT);
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "locafs mount (--daemon {daemon}) still waiting on the source after {limit:?}"
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let took = t.elapsed();
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        eprintln!(
            "--daemon {daemon}: exit {:?} after {took:?}: {err}",
            out.status.code()
        );
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(
            err.contains(&format!("source {}", server_mnt.display()))
                && err.contains("did not answer within --metadata-timeout (1s)"),
            "{err}"
        );
        assert!(!is_mounted(&s.mnt));
    }
    drop(cont);
    drop(server);
}
