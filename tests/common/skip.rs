//! The one way to skip: a test (or bench) that needs what this machine
//! lacks calls `skip!(reason)` (or `require_fuse!()`, ...): by hand it
//! prints one line, `SKIPPED: <test binary>::<test>: <reason>`, and
//! returns; in strict mode (`LOCAFS_TEST_STRICT=1`, set by `.ci/run`) the
//! test fails with the reason unless it is listed in
//! `LOCAFS_TEST_EXPECTED_SKIPS` (tests/common/strict.rs decides, for the
//! unit tests too). Nothing else in the kit prints SKIPPED.
//!
//! What a machine lacks is decided from the machine (a program on PATH, a
//! device that opens), never from the outcome of the code under test.

use std::path::{Path, PathBuf};

pub use super::strict::skipped;

/// What this machine lacks for a FUSE mount (root, and a `/dev/fuse` that
/// is a character device and opens), if anything.
pub fn fuse_missing() -> Option<String> {
    use std::os::unix::fs::FileTypeExt;
    let root = rustix::process::geteuid().is_root();
    let dev = match std::fs::metadata("/dev/fuse") {
        Err(e) => format!("no /dev/fuse ({e})"),
        Ok(m) if !m.file_type().is_char_device() => "/dev/fuse is not a character device".into(),
        Ok(_) => match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/fuse")
        {
            Err(e) => format!("/dev/fuse does not open ({e})"),
            Ok(_) => String::new(),
        },
    };
    match (root, dev.is_empty()) {
        (true, true) => None,
        (false, true) => Some("needs root for FUSE mounts".into()),
        (true, false) => Some(format!("needs /dev/fuse: {dev}")),
        (false, false) => Some(format!("needs root and /dev/fuse: {dev}")),
    }
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

/// `skip!("reason {}", x)`: reports the skip ([`skipped`]: the SKIPPED
/// line, or in strict mode a failure) and returns from the test (or bench
/// `main`).
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
