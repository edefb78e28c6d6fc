//! `locafs` as its own mount(8) helper: called by the name
//! `mount.fuse.locafs` (a link to the binary, in /sbin where mount(8) looks
//! for helpers), it does what mount(8) expects of a helper for the type
//! `fuse.locafs`, so that `mount -t fuse.locafs SRC MNT -o ...` and fstab
//! lines work with nothing installed but the binary and the link (README:
//! `ln -s /usr/local/bin/locafs /sbin/mount.fuse.locafs`).
//!
//! mount(8) runs `mount.fuse.locafs SOURCE MOUNTPOINT [-sfnvrw] [-N NS]
//! [-o OPTIONS] [-t TYPE]`; this runs `locafs mount --daemon -o OPTIONS --
//! SOURCE MOUNTPOINT` (the same binary, by its real path), which returns
//! once the mount is live, and answers with mount(8)'s statuses: 0 mounted,
//! 1 bad invocation or options (locafs's usage errors, exit 2), 32 the mount
//! failed. The option values reach locafs as one argument, never through a
//! shell. packaging/mount.fuse.locafs is the same helper as a shell script
//! (the Debian package installs it); tests/ops_mount_helper.rs holds both to
//! the same behaviour.
//!
//! It must never mount anything itself: it only translates and waits.

use std::ffi::{OsStr, OsString};
use std::path::Path;
use std::process::{Command, ExitCode};

/// The name mount(8) calls the helper by.
pub const HELPER_NAME: &str = "mount.fuse.locafs";

/// Whether this process was called as the helper (argv[0]'s file name).
pub fn called_as_helper(argv0: Option<&OsStr>) -> bool {
    argv0
        .and_then(|a| Path::new(a).file_name())
        .is_some_and(|n| n == HELPER_NAME)
}

/// What mount(8) asked for.
#[derive(Debug, Default, PartialEq)]
struct Invocation {
    source: OsString,
    mountpoint: OsString,
    /// The options for locafs, comma separated ("rw" dropped).
    options: String,
    /// -N: the mount namespace to mount in (a pid or a path).
    namespace: Option<OsString>,
    /// -f: do everything but mount.
    fake: bool,
    /// -v: say what runs.
    verbose: bool,
}

/// A usage problem: mount(8)'s status 1.
#[derive(Debug, PartialEq)]
struct Usage(String);

const USAGE: &str =
    "usage: mount.fuse.locafs SOURCE MOUNTPOINT [-sfnvrw] [-N NAMESPACE] [-o OPTIONS]";

fn parse(args: &[OsString]) -> Result<Invocation, Usage> {
    let [source, mountpoint, rest @ ..] = args else {
        return Err(Usage(USAGE.into()));
    };
    let mut inv = Invocation {
        source: source.clone(),
        mountpoint: mountpoint.clone(),
        ..Invocation::default()
    };
    // mount(8) adds "rw" when the user gave neither ro nor rw; the mount is
    // read-only whatever it says.
    let mut options: Vec<String> = Vec::new();
    let mut add = |opts: &str| {
        options.extend(
            opts.split(',')
                .filter(|o| !o.is_empty() && *o != "rw")
                .map(str::to_owned),
        )
    };
    let mut it = rest.iter();
    while let Some(a) = it.next() {
        let s = a
            .to_str()
            .ok_or_else(|| Usage(format!("{}: not UTF-8", a.to_string_lossy())))?;
        let mut value = |flag: &str| -> Result<String, Usage> {
            match s.strip_prefix(flag).filter(|v| !v.is_empty()) {
                Some(v) => Ok(v.to_owned()),
                None => it
                    .next()
                    .and_then(|v| v.to_str())
                    .map(str::to_owned)
                    .ok_or_else(|| Usage(USAGE.into())),
            }
        };
        if s.starts_with("-o") {
            add(&value("-o")?);
        } else if s.starts_with("-t") {
            value("-t")?;
        } else if s.starts_with("-N") {
            inv.namespace = Some(value("-N")?.into());
        } else if let Some(flags) = s.strip_prefix('-').filter(|f| !f.is_empty()) {
            for f in flags.chars() {
                match f {
                    'f' => inv.fake = true,
                    'v' => inv.verbose = true,
                    // no mtab, sloppy, ro, rw: nothing to do.
                    'n' | 's' | 'r' | 'w' => {}
                    _ => return Err(Usage(format!("unknown flag -{f}\n{USAGE}"))),
                }
            }
        } else {
            return Err(Usage(format!("unexpected argument: {s}\n{USAGE}")));
        }
    }
    inv.options = options.join(",");
    Ok(inv)
}

/// The arguments of the `locafs` command the helper runs.
fn locafs_args(inv: &Invocation) -> Vec<OsString> {
    let mut v: Vec<OsString> = vec!["mount".into(), "--daemon".into()];
    if !inv.options.is_empty() {
        v.push("-o".into());
        v.push(inv.options.clone().into());
    }
    v.push("--".into());
    v.push(inv.source.clone());
    v.push(inv.mountpoint.clone());
    v
}

/// Enters the mount namespace `ns` (a pid, or a path like
/// /proc/PID/ns/mnt), as `mount -N` asks.
fn enter_namespace(ns: &OsStr) -> Result<(), String> {
    use std::os::fd::AsRawFd;
    let path = match ns.to_str() {
        Some(pid) if !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()) => {
            format!("/proc/{pid}/ns/mnt").into()
        }
        _ => std::path::PathBuf::from(ns),
    };
    let f = std::fs::File::open(&path).map_err(|e| format!("-N {}: {e}", path.display()))?;
    // SAFETY: setns on a descriptor we own; the process has one thread.
    if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNS) } != 0 {
        return Err(format!(
            "-N {}: {}",
            path.display(),
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// The helper: `args` are the arguments after argv[0].
pub fn main(args: &[OsString]) -> ExitCode {
    let say = |m: &str| crate::obs::logging::say(&format!("{HELPER_NAME}: {m}"));
    let inv = match parse(args) {
        Ok(i) => i,
        Err(Usage(m)) => {
            say(&m);
            return ExitCode::from(1);
        }
    };
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            say(&format!("cannot find the locafs binary: {e}"));
            return ExitCode::from(1);
        }
    };
    let run = locafs_args(&inv);
    if inv.verbose {
        let line: Vec<String> = std::iter::once(exe.as_os_str())
            .chain(run.iter().map(OsString::as_os_str))
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        say(&line.join(" "));
    }
    if inv.fake {
        return ExitCode::SUCCESS;
    }
    if let Some(ns) = &inv.namespace {
        if let Err(e) = enter_namespace(ns) {
            say(&e);
            return ExitCode::from(32);
        }
    }
    match Command::new(&exe).args(&run).status() {
        Ok(st) => ExitCode::from(match st.code() {
            Some(0) => 0,
            // locafs's usage errors: mount(8)'s "bad options".
            Some(2) => 1,
            _ => 32,
        }),
        Err(e) => {
            say(&format!("cannot run {}: {e}", exe.display()));
            ExitCode::from(32)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<OsString> {
        a.iter().map(OsString::from).collect()
    }

    #[test]
    fn called_by_its_name_from_any_directory() {
        assert!(called_as_helper(Some(OsStr::new(
            "/sbin/mount.fuse.locafs"
        ))));
        assert!(called_as_helper(Some(OsStr::new("mount.fuse.locafs"))));
        assert!(!called_as_helper(Some(OsStr::new("/usr/bin/locafs"))));
        assert!(!called_as_helper(Some(OsStr::new("mount.fuse.locafs.old"))));
        assert!(!called_as_helper(None));
    }

    #[test]
    fn mount8s_arguments_become_one_locafs_command() {
        let inv = parse(&args(&[
            "/nfs/x",
            "/mnt/x",
            "-n",
            "-sv",
            "-o",
            "rw,cache_dir=/c,peers=[::1]:7070,[::2]:7070",
            "-t",
            "fuse.locafs",
            "-ocache_size=5G",
        ]))
        .unwrap();
        assert!(inv.verbose && !inv.fake);
        assert_eq!(
            inv.options,
            "cache_dir=/c,peers=[::1]:7070,[::2]:7070,cache_size=5G"
        );
        assert_eq!(
            locafs_args(&inv),
            args(&[
                "mount",
                "--daemon",
                "-o",
                "cache_dir=/c,peers=[::1]:7070,[::2]:7070,cache_size=5G",
                "--",
                "/nfs/x",
                "/mnt/x"
            ])
        );
        // No options: none passed. A value with a glob character stays as
        // it is (no shell in between).
        let inv = parse(&args(&["s", "m", "-f"])).unwrap();
        assert!(inv.fake);
        assert_eq!(
            locafs_args(&inv),
            args(&["mount", "--daemon", "--", "s", "m"])
        );
        let inv = parse(&args(&["s", "m", "-o", "dataset_id=*", "-N", "42"])).unwrap();
        assert_eq!(inv.options, "dataset_id=*");
        assert_eq!(inv.namespace.as_deref(), Some(OsStr::new("42")));
    }

    #[test]
    fn bad_invocations_are_usage_errors() {
        for bad in [
            &["only-one"][..],
            &["s", "m", "-Z"],
            &["s", "m", "-o"],
            &["s", "m", "extra"],
        ] {
            assert!(parse(&args(bad)).is_err(), "{bad:?}");
        }
        assert!(parse(&args(&["s", "m", "-Z"]))
            .unwrap_err()
            .0
            .contains("unknown flag -Z"));
    }
}
