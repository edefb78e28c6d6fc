//! Counters of what the mount did (bytes by tier, corruption, errors) and the
//! snapshot that `locafs stats`, the stats xattr and the Prometheus exporter
//! all show ([`Stats::full_snapshot`]). Counting is a relaxed atomic add on
//! the read path; nothing here allocates or locks per read.
//!
//! A leaf of the crate: the parts of the snapshot that other modules own
//! (peers, read-ahead, cache usage, the memory tier) are types of this
//! module that those modules fill, through views the mount plugs in
//! ([`ViewSlot`]); nothing here imports the engine.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use serde::{Deserialize, Serialize};

/// The live counters of one mount.
#[derive(Debug)]
pub struct Stats {
    pub started: Instant,
    pub source_bytes: AtomicU64,
    pub source_reads: AtomicU64,
    /// Sum of the latencies of the data reads that reached the source, as
    /// the source guard's workers time them (what the read-ahead tuner
    /// measures the source by; not shown).
    pub source_read_nanos: AtomicU64,
    pub source_errors: AtomicU64,
    pub cache_hit_bytes: AtomicU64,
    pub cache_miss_bytes: AtomicU64,
    pub corrupt_blocks: AtomicU64,
    pub cache_write_errors: AtomicU64,
    /// Blocks served to the loader but not written to the disk cache: the
    /// write-back queue was full (the cache disk slower than the source).
    pub cache_writes_skipped: AtomicU64,
    /// Blocks the disk cache refused (no room in its share of the budget,
    /// or writes off), tried again later from memory.
    pub cache_writes_refused: AtomicU64,
    pub peer_bytes: AtomicU64,
    pub passthrough_opens: AtomicU64,
    pub opens: AtomicU64,
    /// Handles open now (a gauge: up at open, down at release).
    pub open_handles: AtomicU64,
    /// Passthrough backings kept for closed files (a gauge).
    pub passthrough_kept: AtomicU64,
    pub read_errors: AtomicU64,
    /// Bytes this node sent to peers that asked it as owner.
    pub peer_served_bytes: AtomicU64,
    /// Blocks from peers that did not match their checksum or length.
    pub peer_bad_blocks: AtomicU64,
    /// `Busy` answers from a peer that was then asked again.
    pub peer_busy: AtomicU64,
    /// Peer requests that failed (timeout, down, busy, not found, error).
    pub peer_failures: AtomicU64,
    /// Malformed requests received from peers.
    pub peer_bad_requests: AtomicU64,
    /// Incoming peer connections refused at the handshake.
    pub peer_refused_connections: AtomicU64,
    /// Incoming QUIC connection attempts sent a Retry (address validation)
    /// because many handshakes were in progress.
    pub peer_handshakes_retried: AtomicU64,
    /// When every listed member had been reached once, in ms after
    /// `started` (0: not yet).
    pub peer_mesh_formed_ms: AtomicU64,
    /// Listed members not reached yet (a gauge).
    pub peer_members_unreached: AtomicU64,
    /// Reads that waited for a block's owner that was listed but not
    /// reached yet, and those of them that got it within the wait.
    pub peer_owner_waits: AtomicU64,
    pub peer_owner_waits_met: AtomicU64,
    /// Blocks read from the source because their owner was listed but not
    /// reached yet (after the wait).
    pub peer_unreached_source_blocks: AtomicU64,
    /// Since when the source is stalled (Unix ms; 0: it answers).
    pub source_stalled_since_ms: AtomicU64,
    /// Times the source was found stalled.
    pub source_stalls: AtomicU64,
    /// Calls into the source refused at once because it was stalled.
    pub source_calls_refused: AtomicU64,
    /// Calls into the source whose caller stopped waiting at its deadline.
    pub source_timeouts: AtomicU64,
    /// Requests answered from the last known tree because the source did
    /// not answer in time.
    pub stale_answers: AtomicU64,
    /// Threads calling into the source now (the guard's workers and probe),
    /// and the most there ever were.
    pub source_threads: AtomicU64,
    pub source_threads_peak: AtomicU64,
    /// The peer module's view of each member, when peers are configured.
    pub peers: ViewSlot<Vec<PeerSnapshot>>,
    /// The read-ahead engine's state and counters.
    pub read_ahead: ViewSlot<ReadAheadSnapshot>,
    /// What the local cache holds.
    pub cache: ViewSlot<CacheUsage>,
    /// Bytes of blocks in the reader's memory tier.
    pub memory_cache: ViewSlot<u64>,
    /// The shared budget of the cache directory.
    pub budget: ViewSlot<BudgetSnapshot>,
    /// Source entries skipped because they cannot be file names (object
    /// keys with an empty segment, `.`, `..`, or both a file and a prefix).
    pub source_skipped: ViewSlot<u64>,
    /// Answers of the source asking to slow down (503 SlowDown, 429), each
    /// retried by the source itself; read-ahead cuts its concurrency on them.
    pub source_throttled: ViewSlot<u64>,
    /// Answers of the source refused as malformed (an object store's body
    /// longer or shorter than the range asked, a listing page past its
    /// bound or repeating its continuation token); each failed its call.
    pub source_bad_replies: ViewSlot<u64>,
    /// The serving process, the one holding the mount, and the restarts.
    pub process: ViewSlot<ProcessSnapshot>,
}

/// The processes behind a mount: the one serving it now, the one that
/// holds it (and starts a server again when one dies), and the restarts
/// so far (filled from the shared state, `supervisor`). The counters of
/// this snapshot count from the serving process's start.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct ProcessSnapshot {
    /// The serving process.
    #[serde(default)]
    pub pid: u32,
    /// The process that holds the mount.
    #[serde(default)]
    pub supervisor_pid: u32,
    /// Servers started after the first: crashes, kills, the watchdog's
    /// replacements, takeovers.
    #[serde(default)]
    pub restarts: u64,
    /// When the last one was started (Unix seconds); None without one.
    #[serde(default)]
    pub last_restart: Option<f64>,
    /// Why: `signal`, `exit`, `watchdog` or `takeover`.
    #[serde(default)]
    pub last_restart_reason: Option<String>,
    /// The signal that killed the server replaced, or its exit status.
    #[serde(default)]
    pub last_restart_detail: Option<i32>,
}

/// The budget that every mount of one cache directory shares (filled from
/// the mount's last booking, `budget.rs`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct BudgetSnapshot {
    /// The directory's budget, and the one in force (lower while the disk's
    /// free space is at the floor).
    pub cache_budget_bytes: u64,
    pub cache_budget_effective_bytes: u64,
    /// What every data set in the directory holds together.
    pub cache_dir_used_bytes: u64,
    /// What this mount's cache may hold now.
    pub cache_grant_bytes: u64,
    /// Each data set's share.
    pub cache_shares: Vec<DatasetShare>,
}

/// One data set's share of a cache directory.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct DatasetShare {
    pub dataset: String,
    pub used_bytes: u64,
    /// 0 when it is not mounted.
    pub grant_bytes: u64,
}

/// Produces one part of a snapshot.
pub type View<T> = Arc<dyn Fn() -> T + Send + Sync>;

/// Produces the per-peer part of a snapshot.
pub type PeerView = View<Vec<PeerSnapshot>>;

/// Where another module plugs in the part of the snapshot it owns (set once
/// at mount; the default value until then, and in tests that set nothing).
/// A view should hold its module weakly: the module usually holds the
/// [`Stats`].
pub struct ViewSlot<T>(OnceLock<View<T>>);

impl<T: Default> ViewSlot<T> {
    pub fn set(&self, view: View<T>) {
        let _ = self.0.set(view);
    }

    pub(crate) fn get(&self) -> T {
        self.0.get().map(|f| f()).unwrap_or_default()
    }
}

impl<T> Default for ViewSlot<T> {
    fn default() -> Self {
        ViewSlot(OnceLock::new())
    }
}

impl<T> std::fmt::Debug for ViewSlot<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.get().is_some() {
            "ViewSlot(set)"
        } else {
            "ViewSlot(unset)"
        })
    }
}

/// What the cache holds, for `stats` (filled by `BlockStore::usage`).
#[derive(Clone, Copy, Debug, Default)]
pub struct CacheUsage {
    pub used_bytes: u64,
    pub capacity_bytes: u64,
    pub files_cached: u64,
    pub evictions: u64,
    pub writable: bool,
}

/// What `stats` shows of the read-ahead engine (filled by
/// `ReadAhead::snapshot`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct ReadAheadSnapshot {
    pub epoch: u64,
    pub epoch_files_read: u64,
    pub epoch_files_total: u64,
    pub plan_active: bool,
    pub plan_position: u64,
    pub plan_length: u64,
    pub prefetch_sequential_blocks: u64,
    pub prefetch_background_files: u64,
    pub prefetch_background_bytes: u64,
    pub prefetch_memory_used: u64,
    pub prefetch_memory_limit: u64,
    /// Background fetches allowed in flight now (tuned, or the fixed
    /// `--prefetch-jobs N`), and whether it is tuned.
    #[serde(default)]
    pub prefetch_concurrency: u64,
    #[serde(default)]
    pub prefetch_concurrency_auto: bool,
}

/// One member of the peer list as `locafs stats` shows it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PeerSnapshot {
    /// The member id (resolved ip:port).
    pub address: String,
    /// The --peers entry it came from.
    pub name: String,
    /// "up", "down", "self", or "unreached": listed, never reached yet,
    /// and still within the join window (it owns its blocks meanwhile).
    pub state: String,
    /// Seconds in this state.
    pub since_s: f64,
    pub bytes_received: u64,
    pub bytes_sent: u64,
    pub requests: u64,
    pub failures: u64,
    pub bad_blocks: u64,
    /// Mean latency of recent successful requests.
    pub latency_ms: Option<f64>,
}

impl Default for Stats {
    fn default() -> Self {
        Stats {
            started: Instant::now(),
            source_bytes: AtomicU64::new(0),
            source_reads: AtomicU64::new(0),
            source_read_nanos: AtomicU64::new(0),
            source_errors: AtomicU64::new(0),
            cache_hit_bytes: AtomicU64::new(0),
            cache_miss_bytes: AtomicU64::new(0),
            corrupt_blocks: AtomicU64::new(0),
            cache_write_errors: AtomicU64::new(0),
            cache_writes_skipped: AtomicU64::new(0),
            cache_writes_refused: AtomicU64::new(0),
            peer_bytes: AtomicU64::new(0),
            passthrough_opens: AtomicU64::new(0),
            opens: AtomicU64::new(0),
            open_handles: AtomicU64::new(0),
            passthrough_kept: AtomicU64::new(0),
            read_errors: AtomicU64::new(0),
            peer_served_bytes: AtomicU64::new(0),
            peer_bad_blocks: AtomicU64::new(0),
            peer_busy: AtomicU64::new(0),
            peer_failures: AtomicU64::new(0),
            peer_bad_requests: AtomicU64::new(0),
            peer_refused_connections: AtomicU64::new(0),
            peer_handshakes_retried: AtomicU64::new(0),
            peer_mesh_formed_ms: AtomicU64::new(0),
            peer_members_unreached: AtomicU64::new(0),
            peer_owner_waits: AtomicU64::new(0),
            peer_owner_waits_met: AtomicU64::new(0),
            peer_unreached_source_blocks: AtomicU64::new(0),
            source_stalled_since_ms: AtomicU64::new(0),
            source_stalls: AtomicU64::new(0),
            source_calls_refused: AtomicU64::new(0),
            source_timeouts: AtomicU64::new(0),
            stale_answers: AtomicU64::new(0),
            source_threads: AtomicU64::new(0),
            source_threads_peak: AtomicU64::new(0),
            peers: ViewSlot::default(),
            read_ahead: ViewSlot::default(),
            cache: ViewSlot::default(),
            memory_cache: ViewSlot::default(),
            budget: ViewSlot::default(),
            source_skipped: ViewSlot::default(),
            source_throttled: ViewSlot::default(),
            source_bad_replies: ViewSlot::default(),
            process: ViewSlot::default(),
        }
    }
}

/// A point-in-time copy of the counters plus the cache's state; the JSON
/// schema of `locafs stats --json`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct StatsSnapshot {
    pub source: String,
    pub mountpoint: String,
    /// Every mountpoint of the mount (the one it was made on, and those a
    /// second `locafs mount` of the data set attached), as the
    /// command that reads the stats sees them in its mount table; empty in
    /// the snapshot the server makes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mountpoints: Vec<String>,
    pub source_bytes: u64,
    pub source_reads: u64,
    pub source_errors: u64,
    pub cache_hit_bytes: u64,
    pub cache_miss_bytes: u64,
    pub cache_used_bytes: u64,
    pub cache_capacity_bytes: u64,
    pub cache_writable: bool,
    pub cache_evictions: u64,
    pub corrupt_blocks: u64,
    pub cache_write_errors: u64,
    /// Absent from the stats of older daemons.
    #[serde(default)]
    pub cache_writes_skipped: u64,
    pub cache_writes_refused: u64,
    pub files_cached: u64,
    pub peer_bytes: u64,
    pub opens: u64,
    /// Absent from the stats of older daemons.
    #[serde(default)]
    pub open_handles: u64,
    pub passthrough_opens: u64,
    /// Closed files whose passthrough backing is kept for their next open.
    #[serde(default)]
    pub passthrough_kept: u64,
    pub read_errors: u64,
    pub uptime_s: f64,
    #[serde(default)]
    pub peer_served_bytes: u64,
    #[serde(default)]
    pub peer_bad_blocks: u64,
    #[serde(default)]
    pub peer_busy: u64,
    #[serde(default)]
    pub peer_failures: u64,
    #[serde(default)]
    pub peer_bad_requests: u64,
    #[serde(default)]
    pub peer_refused_connections: u64,
    /// Connection attempts sent a QUIC Retry (their address had to be
    /// proven: many handshakes were in progress).
    #[serde(default)]
    pub peer_handshakes_retried: u64,
    /// Seconds from the mount's start until every listed member had been
    /// reached once (None: not yet, or no peers).
    #[serde(default)]
    pub peer_mesh_formed_s: Option<f64>,
    /// Listed members not reached yet.
    #[serde(default)]
    pub peer_members_unreached: u64,
    /// Reads that waited for an owner listed but not reached yet, and those
    /// that got it within the wait.
    #[serde(default)]
    pub peer_owner_waits: u64,
    #[serde(default)]
    pub peer_owner_waits_met: u64,
    /// Blocks read from the source because their owner was not reached yet.
    #[serde(default)]
    pub peer_unreached_source_blocks: u64,
    /// Since when the source has not answered (Unix seconds), or None
    /// while it answers.
    #[serde(default)]
    pub source_stalled_since: Option<f64>,
    /// Times the source was found stalled.
    #[serde(default)]
    pub source_stalls: u64,
    /// Calls that needed the source refused at once while it was stalled.
    #[serde(default)]
    pub source_calls_refused: u64,
    /// Calls into the source given up at their deadline.
    #[serde(default)]
    pub source_timeouts: u64,
    /// Requests (lookup, getattr, readdir, readlink, statfs, open) answered
    /// from the last known tree because the source did not answer in time.
    #[serde(default)]
    pub stale_answers: u64,
    /// Threads calling into the source now, and the most there ever were.
    #[serde(default)]
    pub source_threads: u64,
    #[serde(default)]
    pub source_threads_peak: u64,
    /// Source entries skipped because they cannot be file names, each
    /// warned about once in the log.
    #[serde(default)]
    pub source_entries_skipped: u64,
    /// Answers of the source asking to slow down (an object store's 503
    /// SlowDown or 429), each retried with backoff.
    #[serde(default)]
    pub source_throttled_responses: u64,
    /// Answers of the source refused as malformed (a body longer or
    /// shorter than the range asked, a listing that repeats its
    /// continuation token or passes its bounds); each failed only its call.
    #[serde(default)]
    pub source_bad_replies: u64,
    /// Empty without --peers.
    #[serde(default)]
    pub peers: Vec<PeerSnapshot>,
    /// Read-ahead and epoch state.
    #[serde(flatten, default)]
    pub read_ahead: ReadAheadSnapshot,
    /// The cache directory's shared budget.
    #[serde(flatten, default)]
    pub budget: BudgetSnapshot,
    /// The serving and holding processes, and the restarts.
    #[serde(flatten, default)]
    pub process: ProcessSnapshot,
    /// Bytes of blocks in the memory tier: for the exporter, not part of
    /// the JSON schema (always 0 in a snapshot read from a mount).
    #[serde(skip)]
    pub memory_cache_bytes: u64,
}

impl Stats {
    /// Everything the mount knows: the counters and every part the mount
    /// plugged in. The one snapshot behind `locafs stats`, the stats xattr
    /// and the Prometheus exporter.
    pub fn full_snapshot(&self, source: &str, mountpoint: &str) -> StatsSnapshot {
        let cache = self.cache.get();
        StatsSnapshot {
            source: source.to_owned(),
            mountpoint: mountpoint.to_owned(),
            mountpoints: Vec::new(),
            source_bytes: self.source_bytes.load(Relaxed),
            source_reads: self.source_reads.load(Relaxed),
            source_errors: self.source_errors.load(Relaxed),
            cache_hit_bytes: self.cache_hit_bytes.load(Relaxed),
            cache_miss_bytes: self.cache_miss_bytes.load(Relaxed),
            cache_used_bytes: cache.used_bytes,
            cache_capacity_bytes: cache.capacity_bytes,
            cache_writable: cache.writable,
            cache_evictions: cache.evictions,
            corrupt_blocks: self.corrupt_blocks.load(Relaxed),
            cache_write_errors: self.cache_write_errors.load(Relaxed),
            cache_writes_skipped: self.cache_writes_skipped.load(Relaxed),
            cache_writes_refused: self.cache_writes_refused.load(Relaxed),
            files_cached: cache.files_cached,
            peer_bytes: self.peer_bytes.load(Relaxed),
            opens: self.opens.load(Relaxed),
            open_handles: self.open_handles.load(Relaxed),
            passthrough_opens: self.passthrough_opens.load(Relaxed),
            passthrough_kept: self.passthrough_kept.load(Relaxed),
            read_errors: self.read_errors.load(Relaxed),
            uptime_s: self.started.elapsed().as_secs_f64(),
            peer_served_bytes: self.peer_served_bytes.load(Relaxed),
            peer_bad_blocks: self.peer_bad_blocks.load(Relaxed),
            peer_busy: self.peer_busy.load(Relaxed),
            peer_failures: self.peer_failures.load(Relaxed),
            peer_bad_requests: self.peer_bad_requests.load(Relaxed),
            peer_refused_connections: self.peer_refused_connections.load(Relaxed),
            peer_handshakes_retried: self.peer_handshakes_retried.load(Relaxed),
            peer_mesh_formed_s: match self.peer_mesh_formed_ms.load(Relaxed) {
                0 => None,
                ms => Some(ms as f64 / 1000.0),
            },
            peer_members_unreached: self.peer_members_unreached.load(Relaxed),
            peer_owner_waits: self.peer_owner_waits.load(Relaxed),
            peer_owner_waits_met: self.peer_owner_waits_met.load(Relaxed),
            peer_unreached_source_blocks: self.peer_unreached_source_blocks.load(Relaxed),
            source_stalled_since: match self.source_stalled_since_ms.load(Relaxed) {
                0 => None,
                ms => Some(ms as f64 / 1000.0),
            },
            source_stalls: self.source_stalls.load(Relaxed),
            source_calls_refused: self.source_calls_refused.load(Relaxed),
            source_timeouts: self.source_timeouts.load(Relaxed),
            stale_answers: self.stale_answers.load(Relaxed),
            source_threads: self.source_threads.load(Relaxed),
            source_threads_peak: self.source_threads_peak.load(Relaxed),
            source_entries_skipped: self.source_skipped.get(),
            source_throttled_responses: self.source_throttled.get(),
            source_bad_replies: self.source_bad_replies.get(),
            peers: self.peers.get(),
            read_ahead: self.read_ahead.get(),
            budget: self.budget.get(),
            process: self.process.get(),
            memory_cache_bytes: self.memory_cache.get(),
        }
    }
}

impl StatsSnapshot {
    /// The share of bytes served from the local cache (reads the kernel
    /// served from its page cache or by passthrough are not seen here).
    pub fn hit_ratio(&self) -> f64 {
        let total = self.cache_hit_bytes + self.cache_miss_bytes;
        if total == 0 {
            0.0
        } else {
            self.cache_hit_bytes as f64 / total as f64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_snapshot_takes_every_plugged_part_and_defaults_the_rest() {
        let s = Stats::default();
        s.source_bytes.fetch_add(7, Relaxed);
        let bare = s.full_snapshot("src", "mnt");
        assert_eq!(
            (bare.source.as_str(), bare.mountpoint.as_str()),
            ("src", "mnt")
        );
        assert_eq!(bare.source_bytes, 7);
        assert_eq!(bare.read_ahead, ReadAheadSnapshot::default());
        assert_eq!(bare.cache_capacity_bytes, 0);
        assert!(bare.peers.is_empty());

        s.cache.set(Arc::new(|| CacheUsage {
            used_bytes: 1,
            capacity_bytes: 2,
            files_cached: 3,
            evictions: 4,
            writable: true,
        }));
        s.read_ahead.set(Arc::new(|| ReadAheadSnapshot {
            epoch: 5,
            plan_active: true,
            ..Default::default()
        }));
        s.memory_cache.set(Arc::new(|| 6));
        let full = s.full_snapshot("src", "mnt");
        assert_eq!(
            (
                full.cache_used_bytes,
                full.cache_capacity_bytes,
                full.files_cached,
                full.cache_evictions,
                full.cache_writable
            ),
            (1, 2, 3, 4, true)
        );
        assert_eq!(full.read_ahead.epoch, 5);
        assert!(full.read_ahead.plan_active);
        assert_eq!(full.memory_cache_bytes, 6);
        // The JSON schema is unchanged: read-ahead flattened, no memory tier.
        let v = serde_json::to_value(&full).unwrap();
        assert_eq!(v["epoch"], 5);
        assert!(v.get("memory_cache_bytes").is_none() && v.get("read_ahead").is_none());
        let back: StatsSnapshot = serde_json::from_value(v).unwrap();
        assert_eq!(back.read_ahead, full.read_ahead);
        assert_eq!(back.memory_cache_bytes, 0);
    }
}
