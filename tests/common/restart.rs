//! What the restart tests share: the serving process of a mount (found
//! through the `user.locafs.ping` attribute, which its runtime answers),
//! killing it and waiting for its replacement, and a mount whose holder
//! and servers are this test binary run again in a role, so that a server
//! can put a fake source behind the real read path.
//!
//! A role process is the test binary started with `--ignored --exact
//! ROLE_TEST` and [`ROLE_ENV`] set: the test named ROLE_TEST (an ignored
//! test that calls [`run_role`]) then becomes a holder
//! (`supervisor::hold_with`, starting servers through [`RoleLauncher`]) or
//! a server (`supervisor::serve_with` over a [`FileGate`]d directory), or
//! one that exits at once (a crash loop). A gate that stops a server in
//! the middle of a request lives in files, so that it works across
//! processes: while `DIR/closed` exists, the gated call writes
//! `DIR/reached` and waits.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::daemon::Mount;
use locafs::testing::{Call, Hook, Hooked};

/// The pid of the process serving the mount at `mnt` now (it answers the
/// watchdog's attribute from its runtime; this waits as a reader would
/// while a server is replaced).
pub fn server_pid(mnt: &Path) -> Option<u32> {
    let v = locafs::sys::getxattr(mnt, locafs::fs::PING_XATTR).ok()?;
    String::from_utf8_lossy(&v).trim().parse().ok()
}

/// SIGKILLs the serving process of `mnt`; its pid.
pub fn kill_server(mnt: &Path) -> u32 {
    let pid = server_pid(mnt).expect("a server answers");
    super::sys::signal(pid, super::sys::Signal::KILL).expect("kill the server");
    pid
}

/// Waits (at most `limit`) until a server other than `old` answers; its
/// pid.
pub fn wait_new_server(mnt: &Path, old: u32, limit: Duration) -> u32 {
    let t0 = Instant::now();
    loop {
        if let Some(p) = server_pid(mnt).filter(|p| *p != old) {
            return p;
        }
        assert!(
            t0.elapsed() < limit,
            "no new server within {limit:?} (load average {})",
            super::sys::load_average()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The environment variable that names a role process's role.
pub const ROLE_ENV: &str = "LOCAFS_TEST_ROLE";
/// The test (ignored, run by name) that runs the roles.
const ROLE_TEST_ENV: &str = "LOCAFS_TEST_ROLE_TEST";
/// For a holder: its `locafs mount` arguments, one per line.
const ARGS_ENV: &str = "LOCAFS_TEST_MOUNT_ARGS";
/// For a holder: the role of its servers (`server` or `crash`).
const SERVERS_ENV: &str = "LOCAFS_TEST_SERVERS";
/// For a server: the gate's directory, and what it gates.
const GATE_ENV: &str = "LOCAFS_TEST_GATE";
const GATE_WHAT_ENV: &str = "LOCAFS_TEST_GATE_WHAT";

/// What a [`FileGate`] stops at.
#[derive(Clone, Debug)]
pub enum Gated {
    /// A read of this file (relative to the source) at the source.
    Read(PathBuf),
    /// The `n`th stat at the source of a name under this directory.
    NthStat(PathBuf, u64),
}

impl Gated {
    fn encode(&self) -> String {
        match self {
            Gated::Read(p) => format!("read:{}", p.display()),
            Gated::NthStat(p, n) => format!("stat:{n}:{}", p.display()),
        }
    }

    fn decode(s: &str) -> Option<Gated> {
        if let Some(p) = s.strip_prefix("read:") {
            return Some(Gated::Read(p.into()));
        }
        let rest = s.strip_prefix("stat:")?;
        let (n, p) = rest.split_once(':')?;
        Some(Gated::NthStat(p.into(), n.parse().ok()?))
    }
}

/// A hook that stops the gated call while `DIR/closed` exists (after
/// writing `DIR/reached`): the server holding that request can then be
/// killed, and the test removes `closed` for the next.
pub struct FileGate {
    dir: PathBuf,
    what: Gated,
    stats: AtomicU64,
}

impl FileGate {
    fn hit(&self, call: &Call<'_>) -> bool {
        match (&self.what, call) {
            (Gated::Read(p), Call::Read { path, .. }) => *path == p.as_path(),
            (Gated::NthStat(dir, n), Call::Stat(path)) if path.starts_with(dir) => {
                self.stats.fetch_add(1, Ordering::SeqCst) + 1 == *n
            }
            _ => false,
        }
    }
}

impl Hook for FileGate {
    fn around<T>(&self, call: Call<'_>, real: impl FnOnce() -> T) -> T {
        if self.hit(&call) {
            let closed = self.dir.join("closed");
            if closed.exists() {
                let _ = std::fs::write(self.dir.join("reached"), b"");
                while closed.exists() {
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
        real()
    }
}

/// Closes the gate in `dir` (a gated call will stop).
pub fn close_gate(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let _ = std::fs::remove_file(dir.join("reached"));
    std::fs::write(dir.join("closed"), b"").unwrap();
}

/// Opens the gate in `dir` (a call waiting there goes on).
pub fn open_gate(dir: &Path) {
    let _ = std::fs::remove_file(dir.join("closed"));
}

/// Waits (at most `limit`) until a call stopped at the gate in `dir`.
pub fn wait_reached(dir: &Path, limit: Duration) {
    super::sys::wait_until("a request stopped at the gate", limit, || {
        dir.join("reached").exists()
    });
}

/// Starts servers as this test binary in a role.
pub struct RoleLauncher {
    role: String,
}

impl locafs::mount::supervisor::Launcher for RoleLauncher {
    fn command(&self) -> Command {
        let test = std::env::var(ROLE_TEST_ENV).expect("a role process");
        let mut c = Command::new(std::env::current_exe().unwrap());
        c.args([
            "--ignored",
            "--exact",
            &test,
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ROLE_ENV, &self.role);
        c
    }
}

/// In a role process, runs the role and exits; otherwise returns.
pub fn run_role() {
    let Ok(role) = std::env::var(ROLE_ENV) else {
        return;
    };
    let code = match role.as_str() {
        "holder" => holder(),
        "server" => server(),
        // A server that dies at once, every time.
        "crash" => 1,
        other => panic!("no role {other:?}"),
    };
    std::process::exit(code);
}

fn holder() -> i32 {
    use clap::Parser;
    let args: Vec<String> = std::env::var(ARGS_ENV)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    let argv = ["locafs".to_string(), "mount".to_string()]
        .into_iter()
        .chain(args);
    let cli = locafs::cli::Cli::try_parse_from(argv).unwrap();
    let locafs::cli::Command::Mount(m) = cli.command else {
        unreachable!()
    };
    let request = m.into_request();
    let cfg = locafs::mount::config::resolve(&request).unwrap();
    locafs::obs::logging::init(cfg.log_format, cfg.log_file.as_deref());
    let launcher = RoleLauncher {
        role: std::env::var(SERVERS_ENV).unwrap(),
    };
    let code = locafs::mount::supervisor::hold_with(&request, cfg, Box::new(launcher));
    // (ExitCode has no accessor: report through the process's status)
    if code == std::process::ExitCode::SUCCESS {
        0
    } else {
        1
    }
}

fn server() -> i32 {
    let gate = std::env::var_os(GATE_ENV).map(PathBuf::from);
    let what = std::env::var(GATE_WHAT_ENV)
        .ok()
        .and_then(|s| Gated::decode(&s));
    let code = locafs::mount::supervisor::serve_with(move |cfg| {
        let src: Arc<dyn locafs::source::Source> = match (gate, what) {
            (Some(dir), Some(what)) => Arc::new(Hooked::wrap(
                &cfg.source,
                FileGate {
                    dir,
                    what,
                    stats: AtomicU64::new(0),
                },
            )),
            _ => Arc::new(locafs::source::DirSource::new(cfg.source.clone())),
        };
        Ok(src)
    });
    if code == std::process::ExitCode::SUCCESS {
        0
    } else {
        1
    }
}

/// A mount whose holder and servers are this test binary in roles
/// (`role_test`: the name of the test that calls [`run_role`]): `servers`
/// is `server` (over a directory, with `gate` if given) or `crash`.
pub fn role_mount(
    role_test: &str,
    args: &[OsString],
    mnt: &Path,
    servers: &str,
    gate: Option<(&Path, Gated)>,
) -> Mount {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let stderr_path = std::env::temp_dir().join(format!(
        "locafs-test-role-{}-{}.log",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let errf = std::fs::File::create(&stderr_path).unwrap();
    let lines: Vec<String> = args
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args([
        "--ignored",
        "--exact",
        role_test,
        "--nocapture",
        "--test-threads=1",
    ])
    .env(ROLE_ENV, "holder")
    .env(ROLE_TEST_ENV, role_test)
    .env(ARGS_ENV, lines.join("\n"))
    .env(SERVERS_ENV, servers)
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(errf);
    if let Some((dir, what)) = gate {
        c.env(GATE_ENV, dir).env(GATE_WHAT_ENV, what.encode());
    }
    let child = c.spawn().expect("start the holder role");
    Mount::adopt(child, mnt, stderr_path)
}
