//! The test kit: the one home of what the tests under tests/ and the
//! benches under benches/ share. Tests say `mod common;` and benches
//! `#[path = "../tests/common/mod.rs"] mod common;`: one copy of each
//! helper, compiled into each test or bench, and nothing of it in the
//! library. The fakes to put behind the seams are the library's own test
//! kit, `locafs::testing` (src/testing; the unit tests use it too).
//!
//! - [`skip`]: the one way to skip. A test that needs what the machine
//!   lacks (root, /dev/fuse, a program) prints `SKIPPED: binary::test:
//!   reason` (`require_fuse!()`, `skip!(...)`) and returns; it never
//!   passes silently, and in strict mode ([`strict`], `.ci/run`) it fails
//!   unless it is an expected skip.
//! - [`sys`]: mountinfo, unmounting, the page cache, free ports, `/proc`,
//!   signals, waiting for a condition.
//! - [`data`]: deterministic bytes and trees, comparing a mount with its
//!   source, the cache's files on disk.
//! - [`daemon`]: real `locafs` processes ([`Mount`], [`Scratch`],
//!   `locafs stats`), a tmpfs.
//! - [`docker`]: a Docker engine, the locafs image built from
//!   packaging/Dockerfile on a local base (no registry), containers and a
//!   shared mount point removed on drop (the container tests).
//! - [`inproc`]: mounting inside the test process over any `Source`.
//! - [`pki`]: an admin's CA and node certificates.
//! - [`prom`]: a minimal HTTP GET and a Prometheus text parser.
//! - [`cluster`]: several `locafs mount` processes talking QUIC (the peer
//!   tests), and what a hand-made peer needs.
//! - [`netns`]: network namespaces joined by a bridge.
//! - [`server`]: what the storage servers share: a server process on a
//!   free loopback port, killed on drop, and raw HTTP requests to it.
//! - [`s3`]: a real S3 server (moto_server) and a client to fill its buckets.
//! - [`s3s`]: another S3 server (s3s-fs: listings without ETags, GETs that
//!   ignore `If-Match`), filled with the same client.
//! - [`azurite`]: Azure Blob Storage's emulator (Azurite) and a client to
//!   fill its containers.
//! - [`gcs`]: a GCS emulator (fake-gcs-server) and a client to fill its
//!   buckets.
//! - [`restart`]: the serving process of a mount (find it, kill it, wait
//!   for its replacement), and mounts whose holder and servers are the
//!   test binary in a role, with a gate that stops a server mid-request.
//! - [`proxy`]: an HTTP proxy before it that counts GETs per key and adds
//!   latency, a bandwidth cap, 503 SlowDown answers or a stall.
//! - [`hostile`]: a hostile object store (S3, GCS's XML API and Azure
//!   dialects): answers longer than the range asked, listings that repeat
//!   their continuation token for ever.
//!
//! It must never leak a mount, a process or a namespace: each is owned by
//! a guard whose `Drop` cleans up, even when a test panics.

#![allow(dead_code, unused_imports, unused_macros)]

pub mod azurite;
pub mod cluster;
pub mod daemon;
pub mod data;
pub mod docker;
pub mod gcs;
pub mod hostile;
pub mod inproc;
pub mod netns;
pub mod pki;
pub mod prom;
pub mod proxy;
pub mod restart;
pub mod s3;
pub mod s3s;
pub mod server;
pub mod skip;
pub mod strict;
pub mod sys;

pub use daemon::*;
pub use data::*;
pub use skip::*;
pub use sys::*;
