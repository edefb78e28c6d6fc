//! The README's commands, run in order as written, by `.ci/readme` (which
//! reads README.md, so the text is what is tested): the install block, a
//! look at the mount, the unmount, the fstab line mounted by mount(8)
//! through the helper that the install links (the binary itself, called
//! `mount.fuse.locafs`), and on that mount the Usage block's `stats`,
//! `warm`, `plan`, `where` and `secret` lines. Here in the tests' mode: the lines that install
//! the toolchain and build are replaced by this build's binary, put where
//! `cargo install` puts it; CI (.ci/run) runs the whole block literally,
//! `cargo install` included, from a clean clone. All of it in a private
//! mount namespace with throw-away overlays: nothing on the machine
//! changes.
//!
//! And the README's test command is the one CI runs.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn the_readme_install_mount_and_fstab_line_work_as_written() {
    require_fuse!();
    for tool in ["unshare", "mount", "bash", "diff"] {
        if which(tool).is_none() {
            skip!("{tool} not installed");
        }
    }
    if !std::fs::read_to_string("/proc/filesystems")
        .unwrap_or_default()
        .contains("overlay")
    {
        skip!("no overlayfs in this kernel (.ci/readme keeps /sbin untouched with it)");
    }
    let out = Command::new(repo().join(".ci/readme"))
        .env("LOCAFS_README_BIN", bin())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), ".ci/readme failed:\n{err}");
    assert!(
        err.contains(
            "readme: OK: the README's install, mount, unmount and fstab line work as written"
        ),
        "{err}"
    );
    // Nothing leaked out of its namespace.
    assert!(!is_mounted(Path::new("/mnt/dataset")));
    assert!(!is_mounted(Path::new("/mnt/imagenet")));
}

/// The fenced `sh` block under `heading` in README.md.
fn readme_block(heading: &str) -> String {
    let text = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let after = &text[text
        .find(heading)
        .unwrap_or_else(|| panic!("README.md has no {heading:?}"))..];
    let start = after.find("```sh\n").expect("a ```sh block") + 6;
    let len = after[start..].find("```").unwrap();
    after[start..start + len].trim().to_owned()
}

#[test]
fn ci_runs_the_readme_test_command_and_the_readme() {
    let test = readme_block("## Run the tests");
    let ci = std::fs::read_to_string(repo().join(".ci/run")).unwrap();
    let lines: Vec<&str> = ci.lines().map(str::trim).collect();
    for cmd in test.lines() {
        assert!(
            lines.contains(&cmd.trim()),
            ".ci/run does not run the README's test command {cmd:?}"
        );
    }
    assert!(
        lines.iter().any(|l| l.starts_with(".ci/readme")),
        ".ci/run does not run .ci/readme (the README's install block, as written)"
    );
}
