//! What a skip does: by hand, a test that needs what the machine lacks
//! prints one line, `SKIPPED: <test>: <reason>`, and passes; in strict mode
//! (`LOCAFS_TEST_STRICT=1`, which `.ci/run` sets) it fails with that
//! reason, unless the test is named in `LOCAFS_TEST_EXPECTED_SKIPS` (the
//! skips CI cannot avoid, listed in `.ci/run`).
//!
//! One file for both kinds of test: the kit (tests/common/skip.rs, for the
//! integration tests and benches) and the library's unit tests (src/lib.rs
//! compiles this same file under `cfg(test)`; they cannot import the kit).
//! So it uses nothing but std, and nothing of it ships in the library.
//!
//! A test is named `<test binary>::<path of the test>`, as `cargo test`
//! lists it after the binary: `objstore::az_reads_through_the_mount` for
//! an integration test, `locafs::sys::tests::is_cached_tells_...` for a
//! unit test.
//!
//! Must never: let a skip pass silently, or let a mistyped
//! `LOCAFS_TEST_STRICT` turn strict mode off.

/// Set to `1`, every skip not listed in [`EXPECTED_SKIPS`] fails its test.
pub const STRICT: &str = "LOCAFS_TEST_STRICT";

/// The tests allowed to skip in strict mode: their names (see the module
/// doc), separated by commas or white space.
pub const EXPECTED_SKIPS: &str = "LOCAFS_TEST_EXPECTED_SKIPS";

/// Whether strict mode is on. Unset, empty or `0`: off; `1`: on; anything
/// else is a mistake, and fails the test that asks rather than turning
/// strict mode off unnoticed.
pub fn strict() -> bool {
    match std::env::var(STRICT).as_deref() {
        Err(std::env::VarError::NotPresent) | Ok("") | Ok("0") => false,
        Ok("1") => true,
        other => panic!("{STRICT} must be 0 or 1, not {other:?}"),
    }
}

/// The running test's name: the test binary (the first part of the
/// caller's `module_path!()`) and the test's path (the name libtest gives
/// the test's thread).
pub fn test_name(module: &str) -> String {
    let binary = module.split("::").next().unwrap_or(module);
    let test = std::thread::current()
        .name()
        .unwrap_or("<not on a test thread>")
        .to_owned();
    format!("{binary}::{test}")
}

/// Whether `name` is in the [`EXPECTED_SKIPS`] list.
pub fn expected(name: &str) -> bool {
    std::env::var(EXPECTED_SKIPS)
        .unwrap_or_default()
        .split(|c: char| c == ',' || c.is_whitespace())
        .any(|n| n == name)
}

/// Reports that the running test (called from `module_path!()` = `module`)
/// cannot run, or cannot run a part, for `why`. By hand: prints the
/// SKIPPED line and returns (the caller then returns, or goes on without
/// that part). In strict mode, unless the test is an expected skip: fails
/// the test with the reason.
pub fn skipped(module: &str, why: &str) {
    let name = test_name(module);
    if strict() && !expected(&name) {
        panic!(
            "SKIPPED in strict mode ({STRICT}=1): {name}: {why}\n\
             Install what it needs, or, if CI cannot provide it, list {name} in {EXPECTED_SKIPS}."
        );
    }
    let note = if expected(&name) { " (expected)" } else { "" };
    eprintln!("SKIPPED{note}: {name}: {why}");
}
