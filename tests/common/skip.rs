//! The one way to skip: a test (or bench) that needs what this machine
//! lacks prints one line, `SKIPPED: <module>::<test>: <reason>`, and
//! returns. Nothing else in the kit prints SKIPPED.

use std::path::{Path, PathBuf};

/// What this machine lacks for a FUSE mount (root and /dev/fuse), if
/// anything.
pub fn fuse_missing() -> Option<String> {
    let root = rustix::process::geteuid().is_root();
    let dev = Path::new("/dev/fuse").exists();
    (!root || !dev).then(|| format!("needs root and /dev/fuse (root: {root}, /dev/fuse: {dev})"))
}

/// The program `name` on PATH, if it is installed.
pub fn which(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// Prints the SKIPPED line for the running test of `module` (the caller
/// then returns; [`skip!`] does both).
pub fn skipped(module: &str, why: &str) {
    let test = std::thread::current().name().unwrap_or("?").to_owned();
    eprintln!("SKIPPED: {module}::{test}: {why}");
}

/// `skip!("reason {}", x)`: prints the SKIPPED line and returns from the
/// test (or bench `main`).
#[macro_export]
macro_rules! skip {
    ($($why:tt)+) => {{
        $crate::common::skipped(module_path!(), &format!($($why)+));
        return;
    }};
}

/// Skips the test unless FUSE mounts can be made here (root, /dev/fuse).
#[macro_export]
macro_rules! require_fuse {
    () => {
        if let Some(why) = $crate::common::fuse_missing() {
            $crate::skip!("{why}");
        }
    };
}
