//! Prometheus metrics (`--metrics ADDR`): every series is named `locafs_*`,
//! in base units (`_bytes`, `_seconds`), counters end in `_total`, and the
//! tiers of the read path are one `tier` label (`cache`, `peer`, `source`).
//!
//! This file is the recording side, called from the read path: the latency
//! of each block fetched from a tier ([`observe_tier`], a histogram) and the
//! count of FUSE requests by operation ([`fuse_op`], a relaxed atomic add).
//! Both are cheap no-ops until the exporter has started. It is a leaf: it
//! imports nothing from the crate (`tests/module_graph.rs` checks).
//!
//! The exporter ([`prometheus`]) copies every other series from the mount's
//! stats snapshot once per [`prometheus::UPDATE_EVERY`], so the read path
//! pays nothing for them.
//!
//! Nothing here may block or fail a read, and nothing here panics: a metrics
//! listener that cannot bind is a usage error reported before mounting.

pub mod prometheus;

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::OnceLock;
use std::time::Instant;

use metrics::{Counter, Histogram};

/// A tier of the read path.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Tier {
    /// The local cache: memory, or the disk cache (reads and checks one
    /// cached block).
    Cache,
    /// Another node's cache (one block over the network).
    Peer,
    /// The data set's own storage (one block read).
    Source,
}

impl Tier {
    pub const ALL: [Tier; 3] = [Tier::Cache, Tier::Peer, Tier::Source];

    pub fn label(self) -> &'static str {
        match self {
            Tier::Cache => "cache",
            Tier::Peer => "peer",
            Tier::Source => "source",
        }
    }
}

/// The FUSE operations counted in `locafs_fuse_requests_total{op}`. Every
/// write-type request (all answered EROFS) is counted as `Modify`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[repr(usize)]
pub enum FuseOp {
    Lookup,
    Getattr,
    Readlink,
    Open,
    Read,
    Release,
    Flush,
    Readdir,
    Readdirplus,
    Statfs,
    Getxattr,
    Listxattr,
    Modify,
}

impl FuseOp {
    pub const ALL: [FuseOp; 13] = [
        FuseOp::Lookup,
        FuseOp::Getattr,
        FuseOp::Readlink,
        FuseOp::Open,
        FuseOp::Read,
        FuseOp::Release,
        FuseOp::Flush,
        FuseOp::Readdir,
        FuseOp::Readdirplus,
        FuseOp::Statfs,
        FuseOp::Getxattr,
        FuseOp::Listxattr,
        FuseOp::Modify,
    ];

    pub fn label(self) -> &'static str {
        match self {
            FuseOp::Lookup => "lookup",
            FuseOp::Getattr => "getattr",
            FuseOp::Readlink => "readlink",
            FuseOp::Open => "open",
            FuseOp::Read => "read",
            FuseOp::Release => "release",
            FuseOp::Flush => "flush",
            FuseOp::Readdir => "readdir",
            FuseOp::Readdirplus => "readdirplus",
            FuseOp::Statfs => "statfs",
            FuseOp::Getxattr => "getxattr",
            FuseOp::Listxattr => "listxattr",
            FuseOp::Modify => "modify",
        }
    }
}

#[allow(clippy::declare_interior_mutable_const)]
const ZERO: AtomicU64 = AtomicU64::new(0);
/// FUSE requests by operation since start (process-wide: one mount per
/// process).
static FUSE_OPS: [AtomicU64; FuseOp::ALL.len()] = [ZERO; FuseOp::ALL.len()];
/// Failed block fetches from peers (the read then went to the source).
static PEER_FAILURES: AtomicU64 = AtomicU64::new(0);

/// Failed block fetches from peers so far.
pub fn peer_failures() -> u64 {
    PEER_FAILURES.load(Relaxed)
}

/// Counts one FUSE request. Always on (one relaxed add).
#[inline]
pub fn fuse_op(op: FuseOp) {
    FUSE_OPS[op as usize].fetch_add(1, Relaxed);
}

/// FUSE requests of this operation so far.
pub fn fuse_op_count(op: FuseOp) -> u64 {
    FUSE_OPS[op as usize].load(Relaxed)
}

/// Handles registered once when the exporter starts: recording through them
/// is an atomic push, with no name lookup.
struct TierHandles {
    latency: [Histogram; 3],
    requests: [Counter; 3],
}

static TIERS: OnceLock<TierHandles> = OnceLock::new();

fn tier_index(t: Tier) -> usize {
    match t {
        Tier::Cache => 0,
        Tier::Peer => 1,
        Tier::Source => 2,
    }
}

/// The start of a timed tier access, or None when metrics are off (so the
/// read path does not even read the clock).
#[inline]
pub fn timer() -> Option<Instant> {
    TIERS.get().map(|_| Instant::now())
}

/// Records one block access on `tier` that began at `started` (from
/// [`timer`]); `ok` false for a failed peer fetch.
#[inline]
pub fn observe_tier(tier: Tier, started: Option<Instant>, ok: bool) {
    if tier == Tier::Peer && !ok {
        PEER_FAILURES.fetch_add(1, Relaxed);
    }
    let (Some(h), Some(t)) = (TIERS.get(), started) else {
        return;
    };
    let i = tier_index(tier);
    h.latency[i].record(t.elapsed().as_secs_f64());
    h.requests[i].increment(1);
}
