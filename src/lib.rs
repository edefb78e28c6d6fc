//! locafs: a read-only caching FUSE file system for deep-learning training
//! data. See docs/architecture.md for the modules and the path of a read.

pub mod cache;
pub mod cli;
pub mod fs;
pub mod meta;
pub mod mount;
pub mod obs;
pub mod peer;
pub mod read;
pub mod source;
pub mod sys;

/// The test kit's fakes (tests/kit_fakes.rs checks them against the real
/// things): in the unit tests, and in the integration tests and benches
/// through the `testing` feature. Never in the product.
#[cfg(any(test, feature = "testing"))]
pub mod testing;

/// How a unit test skips (the SKIPPED line, or a failure in strict mode):
/// the test kit's own file, compiled into the unit tests only (nothing of
/// it ships; unit tests cannot import tests/common).
#[cfg(test)]
#[path = "../tests/common/strict.rs"]
mod test_skip;
