//! The Prometheus exporter: an HTTP listener, and an updater task that
//! copies a stats snapshot into the recorder once per [`UPDATE_EVERY`]. It
//! knows the mount only through the snapshot function it is given
//! (`Stats::full_snapshot` at mount), never the engine's parts.

use std::net::SocketAddr;
use std::time::Duration;

use metrics::{counter, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};

use super::{fuse_op_count, peer_failures, FuseOp, Tier, TierHandles, TIERS};
use crate::obs::stats::StatsSnapshot;

/// How often the updater copies the counters into the exporter: a scrape
/// sees values at most this old.
pub const UPDATE_EVERY: Duration = Duration::from_millis(500);

/// Histogram buckets of the `_seconds` series: 10 µs (memory, a warm local
/// disk) to 2 min (the default source timeout).
const LATENCY_BUCKETS: &[f64] = &[
    0.00001, 0.00003, 0.0001, 0.0003, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0,
    120.0,
];

/// What the updater reads from a running mount: its full stats snapshot.
pub type SnapshotFn = Box<dyn Fn() -> StatsSnapshot + Send + Sync>;

/// The `locafs_info` labels: what is mounted where.
pub struct Labels {
    pub source: String,
    pub mountpoint: String,
}

/// Binds the listener, installs the recorder and starts the updater on
/// `rt`. Fails (with a one-line reason) if the address cannot be bound or a
/// recorder is already installed in this process.
pub fn start(
    addr: SocketAddr,
    rt: &tokio::runtime::Handle,
    labels: Labels,
    snapshot: SnapshotFn,
) -> Result<(), String> {
    let builder = PrometheusBuilder::new()
        .with_http_listener(addr)
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS)
        .map_err(|e| e.to_string())?;
    let (recorder, exporter) = {
        let _g = rt.enter();
        builder.build().map_err(|e| match e {
            metrics_exporter_prometheus::BuildError::FailedToCreateHTTPListener(s) => {
                format!("--metrics {addr}: {s}")
            }
            other => format!("--metrics {addr}: {other}"),
        })?
    };
    metrics::set_global_recorder(recorder)
        .map_err(|_| "metrics: a recorder is already installed in this process".to_string())?;
    rt.spawn(async move {
        if let Err(e) = exporter.await {
            tracing::warn!("metrics listener stopped: {e:?}");
        }
    });
    describe();
    let handles = TierHandles {
        latency: Tier::ALL
            .map(|t| histogram!("locafs_tier_read_duration_seconds", "tier" => t.label())),
        requests: Tier::ALL.map(|t| counter!("locafs_tier_requests_total", "tier" => t.label())),
    };
    let _ = TIERS.set(handles);
    gauge!(
        "locafs_info",
        "version" => env!("CARGO_PKG_VERSION"),
        "source" => labels.source,
        "mountpoint" => labels.mountpoint,
    )
    .set(1.0);
    let start_unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    gauge!("locafs_start_time_seconds").set(start_unix);
    update(&snapshot());
    rt.spawn(async move {
        loop {
            tokio::time::sleep(UPDATE_EVERY).await;
            update(&snapshot());
        }
    });
    tracing::info!("metrics: serving Prometheus text on http://{addr}/metrics");
    Ok(())
}

/// Copies a snapshot (and the recording side's counters) into the
/// recorder.
fn update(s: &StatsSnapshot) {
    let bytes = [s.cache_hit_bytes, s.peer_bytes, s.source_bytes];
    for (t, b) in Tier::ALL.iter().zip(bytes) {
        counter!("locafs_tier_bytes_total", "tier" => t.label()).absolute(b);
    }
    counter!("locafs_cache_miss_bytes_total").absolute(s.cache_miss_bytes);
    gauge!("locafs_cache_hit_ratio").set(s.hit_ratio());
    gauge!("locafs_cache_used_bytes").set(s.cache_used_bytes as f64);
    gauge!("locafs_cache_capacity_bytes").set(s.cache_capacity_bytes as f64);
    gauge!("locafs_cache_files_complete").set(s.files_cached as f64);
    let b = &s.budget;
    gauge!("locafs_cache_budget_bytes").set(b.cache_budget_bytes as f64);
    gauge!("locafs_cache_budget_effective_bytes").set(b.cache_budget_effective_bytes as f64);
    gauge!("locafs_cache_dir_used_bytes").set(b.cache_dir_used_bytes as f64);
    gauge!("locafs_cache_grant_bytes").set(b.cache_grant_bytes as f64);
    for d in &b.cache_shares {
        gauge!("locafs_cache_dataset_used_bytes", "dataset" => d.dataset.clone())
            .set(d.used_bytes as f64);
    }
    gauge!("locafs_cache_writable").set(if s.cache_writable { 1.0 } else { 0.0 });
    counter!("locafs_cache_evictions_total").absolute(s.cache_evictions);
    counter!("locafs_cache_corrupt_blocks_total").absolute(s.corrupt_blocks);
    gauge!("locafs_memory_cache_bytes").set(s.memory_cache_bytes as f64);
    gauge!("locafs_open_handles").set(s.open_handles as f64);
    let p = &s.process;
    counter!("locafs_restarts_total").absolute(p.restarts);
    gauge!("locafs_last_restart_time_seconds").set(p.last_restart.unwrap_or(0.0));
    gauge!("locafs_passthrough_kept").set(s.passthrough_kept as f64);
    counter!("locafs_opens_total").absolute(s.opens);
    counter!("locafs_passthrough_opens_total").absolute(s.passthrough_opens);
    let ra = &s.read_ahead;
    gauge!("locafs_epoch").set(ra.epoch as f64);
    gauge!("locafs_epoch_files_read").set(ra.epoch_files_read as f64);
    gauge!("locafs_dataset_files").set(ra.epoch_files_total as f64);
    gauge!("locafs_prefetch_memory_bytes").set(ra.prefetch_memory_used as f64);
    gauge!("locafs_prefetch_memory_limit_bytes").set(ra.prefetch_memory_limit as f64);
    gauge!("locafs_prefetch_concurrency").set(ra.prefetch_concurrency as f64);
    counter!("locafs_prefetch_blocks_total", "kind" => "sequential")
        .absolute(ra.prefetch_sequential_blocks);
    counter!("locafs_prefetch_bytes_total", "kind" => "background")
        .absolute(ra.prefetch_background_bytes);
    gauge!("locafs_plan_active").set(if ra.plan_active { 1.0 } else { 0.0 });
    gauge!("locafs_source_stalled").set(if s.source_stalled_since.is_some() {
        1.0
    } else {
        0.0
    });
    gauge!("locafs_source_stalled_since_seconds").set(s.source_stalled_since.unwrap_or(0.0));
    counter!("locafs_source_stalls_total").absolute(s.source_stalls);
    counter!("locafs_source_calls_refused_total").absolute(s.source_calls_refused);
    counter!("locafs_source_timeouts_total").absolute(s.source_timeouts);
    counter!("locafs_stale_answers_total").absolute(s.stale_answers);
    counter!("locafs_source_entries_skipped_total").absolute(s.source_entries_skipped);
    counter!("locafs_source_throttled_total").absolute(s.source_throttled_responses);
    counter!("locafs_source_bad_replies_total").absolute(s.source_bad_replies);
    gauge!("locafs_source_threads").set(s.source_threads as f64);
    if !s.peers.is_empty() {
        // NaN until every listed member has been reached once.
        gauge!("locafs_peer_mesh_formed_seconds").set(s.peer_mesh_formed_s.unwrap_or(f64::NAN));
        gauge!("locafs_peer_members_unreached").set(s.peer_members_unreached as f64);
        counter!("locafs_peer_owner_waits_total").absolute(s.peer_owner_waits);
        counter!("locafs_peer_unreached_source_blocks_total")
            .absolute(s.peer_unreached_source_blocks);
    }
    let errors = [
        ("source", s.source_errors),
        ("read", s.read_errors),
        ("cache_corrupt", s.corrupt_blocks),
        ("cache_write", s.cache_write_errors),
        ("cache_write_skipped", s.cache_writes_skipped),
        ("cache_write_refused", s.cache_writes_refused),
        ("peer", peer_failures()),
    ];
    for (kind, n) in errors {
        counter!("locafs_errors_total", "kind" => kind).absolute(n);
    }
    for op in FuseOp::ALL {
        counter!("locafs_fuse_requests_total", "op" => op.label()).absolute(fuse_op_count(op));
    }
}

/// What a series is, for its description.
#[derive(Clone, Copy)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// Every series the exporter serves: its kind, name, unit and help text.
const SERIES: &[(Kind, &str, Option<metrics::Unit>, &str)] = {
    use metrics::Unit;
    use Kind::*;
    &[
        (
            Counter,
            "locafs_tier_bytes_total",
            Some(Unit::Bytes),
            "Bytes obtained from each tier: cache = served to readers from memory or the local disk cache; peer = blocks fetched from other nodes; source = blocks read from the data set's storage.",
        ),
        (
            Counter,
            "locafs_tier_requests_total",
            None,
            "Block accesses per tier: cache = blocks found in memory or read and verified from the local disk cache; peer = block fetches asked of other nodes (failed ones included); source = block reads from the source (failed ones included).",
        ),
        (
            Histogram,
            "locafs_tier_read_duration_seconds",
            Some(Unit::Seconds),
            "Time to obtain one block from a tier (see locafs_tier_requests_total).",
        ),
        (
            Counter,
            "locafs_cache_miss_bytes_total",
            Some(Unit::Bytes),
            "Bytes readers asked for that were not in the local cache.",
        ),
        (
            Gauge,
            "locafs_cache_hit_ratio",
            None,
            "Share of bytes served from the local cache since the mount started (reads served by the kernel page cache or passthrough are not seen). For a window, use rate() of locafs_tier_bytes_total and locafs_cache_miss_bytes_total.",
        ),
        (
            Gauge,
            "locafs_cache_used_bytes",
            Some(Unit::Bytes),
            "Disk space the cache uses, counting everything it writes.",
        ),
        (
            Gauge,
            "locafs_cache_capacity_bytes",
            Some(Unit::Bytes),
            "The cache's size limit.",
        ),
        (
            Gauge,
            "locafs_cache_budget_bytes",
            Some(Unit::Bytes),
            "The budget that all mounts of this cache directory share.",
        ),
        (
            Gauge,
            "locafs_cache_budget_effective_bytes",
            Some(Unit::Bytes),
            "The budget in force: lower than locafs_cache_budget_bytes while the cache disk is at its free-space floor.",
        ),
        (
            Gauge,
            "locafs_cache_dir_used_bytes",
            Some(Unit::Bytes),
            "What all data sets in this cache directory hold together.",
        ),
        (
            Gauge,
            "locafs_cache_grant_bytes",
            Some(Unit::Bytes),
            "What this mount's cache may hold now, out of the shared budget.",
        ),
        (
            Gauge,
            "locafs_cache_dataset_used_bytes",
            Some(Unit::Bytes),
            "What each data set in this cache directory holds (its share of the budget).",
        ),
        (
            Gauge,
            "locafs_cache_files_complete",
            None,
            "Files whose every block is cached.",
        ),
        (
            Gauge,
            "locafs_cache_writable",
            None,
            "1 while the cache disk takes writes, 0 while writes are off after a disk error.",
        ),
        (
            Counter,
            "locafs_cache_evictions_total",
            None,
            "Cache entries evicted to make room.",
        ),
        (
            Counter,
            "locafs_cache_corrupt_blocks_total",
            None,
            "Cached blocks that failed their checksum and were dropped (then refetched).",
        ),
        (
            Gauge,
            "locafs_memory_cache_bytes",
            Some(Unit::Bytes),
            "Bytes of blocks held in memory (bounded by --memory-cache).",
        ),
        (
            Gauge,
            "locafs_open_handles",
            None,
            "Open file handles on the mount.",
        ),
        (
            Gauge,
            "locafs_passthrough_kept",
            None,
            "Closed files whose passthrough backing is kept for their next open.",
        ),
        (
            Gauge,
            "locafs_epoch",
            None,
            "The loader's current epoch as detected by read-ahead.",
        ),
        (
            Gauge,
            "locafs_epoch_files_read",
            None,
            "Files read in the current epoch.",
        ),
        (
            Gauge,
            "locafs_dataset_files",
            None,
            "Files in the data set (as listed for read-ahead).",
        ),
        (
            Gauge,
            "locafs_prefetch_memory_bytes",
            None,
            "Prefetch buffers in use.",
        ),
        (
            Gauge,
            "locafs_prefetch_concurrency",
            None,
            "Background fetches allowed in flight now (tuned unless --prefetch-jobs N).",
        ),
        (
            Gauge,
            "locafs_prefetch_memory_limit_bytes",
            None,
            "The prefetch buffer budget.",
        ),
        (
            Counter,
            "locafs_prefetch_blocks_total",
            None,
            "Blocks prefetched within files.",
        ),
        (
            Counter,
            "locafs_prefetch_bytes_total",
            None,
            "Bytes prefetched ahead of the loader across files.",
        ),
        (
            Gauge,
            "locafs_plan_active",
            None,
            "1 while a loader's plan is followed.",
        ),
        (
            Gauge,
            "locafs_source_stalled",
            None,
            "1 while the source is stalled (answers nothing): cached data and the last known tree are served, calls that need the source fail with ETIMEDOUT.",
        ),
        (
            Gauge,
            "locafs_source_stalled_since_seconds",
            Some(Unit::Seconds),
            "Unix time since which the source has not answered (0 while it answers).",
        ),
        (
            Counter,
            "locafs_source_stalls_total",
            None,
            "Times the source was found stalled.",
        ),
        (
            Counter,
            "locafs_source_calls_refused_total",
            None,
            "Calls that needed the source, refused at once while it was stalled.",
        ),
        (
            Counter,
            "locafs_source_timeouts_total",
            None,
            "Calls into the source given up at their deadline (--metadata-timeout, --source-timeout).",
        ),
        (
            Counter,
            "locafs_source_entries_skipped_total",
            None,
            "Source entries skipped because they cannot be file names (object keys with an empty, '.' or '..' segment, or both an object and a prefix), each warned about once.",
        ),
        (
            Counter,
            "locafs_source_throttled_total",
            None,
            "Answers of the source asking to slow down (an object store's 503 SlowDown or 429), each retried with backoff; read-ahead halves its concurrency on them.",
        ),
        (
            Counter,
            "locafs_source_bad_replies_total",
            None,
            "Answers of the source refused as malformed (an object store's body longer or shorter than the range asked, a listing page past its bound or repeating its continuation token); each failed only its own call.",
        ),
        (
            Counter,
            "locafs_stale_answers_total",
            None,
            "Requests answered from the last known tree because the source did not answer in time.",
        ),
        (
            Gauge,
            "locafs_source_threads",
            None,
            "Threads calling into the source now (bounded; a hung source holds some of them).",
        ),
        (
            Gauge,
            "locafs_peer_mesh_formed_seconds",
            Some(Unit::Seconds),
            "Seconds from the mount's start until every listed peer had been reached once (NaN until then).",
        ),
        (
            Gauge,
            "locafs_peer_members_unreached",
            None,
            "Listed peers not reached yet since the mount started.",
        ),
        (
            Counter,
            "locafs_peer_owner_waits_total",
            None,
            "Reads that waited (at most --peer-timeout) for a block's owner that was listed but not reached yet.",
        ),
        (
            Counter,
            "locafs_peer_unreached_source_blocks_total",
            None,
            "Blocks read from the source because their owner was listed but not reached yet.",
        ),
        (
            Counter,
            "locafs_opens_total",
            None,
            "Files opened.",
        ),
        (
            Counter,
            "locafs_passthrough_opens_total",
            None,
            "Opens served by FUSE passthrough (the kernel reads the cached file; such reads are not counted elsewhere).",
        ),
        (
            Counter,
            "locafs_errors_total",
            None,
            "Errors by kind: source = failed source reads; read = reads that failed for the reader (EIO, ETIMEDOUT); cache_corrupt = corrupt cached blocks; cache_write = failed cache writes; peer = failed peer fetches (fell back to the source).",
        ),
        (
            Counter,
            "locafs_fuse_requests_total",
            None,
            "FUSE requests by operation (modify = any write-type request, all refused with EROFS).",
        ),
        (
            Gauge,
            "locafs_info",
            None,
            "Always 1; the labels say what is mounted where and the locafs version.",
        ),
        (
            Gauge,
            "locafs_start_time_seconds",
            Some(Unit::Seconds),
            "When the mount started, in seconds since the Unix epoch.",
        ),
    ]
};

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    for &(kind, name, unit, help) in SERIES {
        match (kind, unit) {
            (Kind::Counter, Some(u)) => describe_counter!(name, u, help),
            (Kind::Counter, None) => describe_counter!(name, help),
            (Kind::Gauge, Some(u)) => describe_gauge!(name, u, help),
            (Kind::Gauge, None) => describe_gauge!(name, help),
            (Kind::Histogram, Some(u)) => describe_histogram!(name, u, help),
            (Kind::Histogram, None) => describe_histogram!(name, help),
        }
    }
}
