//! locafs: a read-only caching FUSE file system for deep-learning training
//! data. See docs/architecture.md for the modules and the path of a read.

pub mod budget;
pub mod cache;
pub mod cli;
pub mod concurrency;
pub mod config;
pub mod connection;
pub mod control;
pub mod dead_mount;
pub mod epoch;
pub mod fs;
pub mod fuse;
pub mod handle_store;
pub mod handles;
pub mod locality;
pub mod locate;
pub mod lock;
pub mod logging;
pub mod manifest;
pub mod metrics;
pub mod mount;
pub mod namespace;
pub mod peer;
pub mod prefetch;
pub mod private_dir;
pub mod reader;
pub mod shm;
pub mod source;
pub mod source_guard;
pub mod stats;
pub mod supervisor;
pub mod sys;
pub mod units;
pub mod writeback;

/// How a unit test skips (the SKIPPED line, or a failure in strict mode):
/// the test kit's own file, compiled into the unit tests only (nothing of
/// it ships; unit tests cannot import tests/common).
#[cfg(test)]
#[path = "../tests/common/strict.rs"]
mod test_skip;
