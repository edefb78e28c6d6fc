//! The human table of `locafs stats`: the mount's snapshot as aligned
//! rows, the lines of trouble only when there is some, and one row per
//! peer. Formatting only: it reads a [`StatsSnapshot`] and never asks the
//! mount for anything.

use crate::obs::stats::StatsSnapshot;
use crate::sys::units::format_size;

type Rows = Vec<(&'static str, String)>;

/// The short human table of `locafs stats`.
pub fn table(s: &StatsSnapshot) -> String {
    let mut rows = main_rows(s);
    rows.extend(trouble_rows(s));
    rows.extend(peer_rows(s));
    let w = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    rows.iter()
        .map(|(k, v)| format!("{k:<w$}  {v}\n"))
        .collect()
}

/// What every mount has: where, how long, the cache, the tiers, opens,
/// the epoch, read-ahead and the count of problems.
fn main_rows(s: &StatsSnapshot) -> Rows {
    vec![
        (
            "mount",
            if s.mountpoints.len() > 1 {
                format!("{} <- {}", s.mountpoints.join(", "), s.source)
            } else {
                format!("{} <- {}", s.mountpoint, s.source)
            },
        ),
        ("uptime", format!("{:.0} s", s.uptime_s)),
        ("processes", process_line(s)),
        (
            "cache",
            format!(
                "{} of {} used ({:.1} %), {} files complete{}",
                format_size(s.cache_used_bytes),
                format_size(s.cache_capacity_bytes),
                100.0 * s.cache_used_bytes as f64 / s.cache_capacity_bytes.max(1) as f64,
                s.files_cached,
                if s.cache_writable {
                    ""
                } else {
                    ", WRITES OFF (disk error)"
                }
            ),
        ),
        (
            "served from cache",
            format!(
                "{} ({:.1} % hit)",
                format_size(s.cache_hit_bytes),
                100.0 * s.hit_ratio()
            ),
        ),
        (
            "read from source",
            format!(
                "{} in {} requests",
                format_size(s.source_bytes),
                s.source_reads
            ),
        ),
        ("from peers", format_size(s.peer_bytes)),
        ("shared budget", budget_line(s)),
        (
            "opens",
            format!(
                "{} ({} passthrough), {} open now, {} closed kept for passthrough",
                s.opens, s.passthrough_opens, s.open_handles, s.passthrough_kept
            ),
        ),
        ("epoch", epoch_line(s)),
        (
            "read-ahead",
            format!(
                "{} blocks within files, {} files ({}) ahead of the loader, memory {} of {}, \
                 {} fetches in flight at most ({})",
                s.read_ahead.prefetch_sequential_blocks,
                s.read_ahead.prefetch_background_files,
                format_size(s.read_ahead.prefetch_background_bytes),
                format_size(s.read_ahead.prefetch_memory_used),
                format_size(s.read_ahead.prefetch_memory_limit),
                s.read_ahead.prefetch_concurrency,
                if s.read_ahead.prefetch_concurrency_auto {
                    "auto"
                } else {
                    "fixed"
                }
            ),
        ),
        (
            "problems",
            format!(
                "{} corrupt blocks, {} cache write errors, {} source errors, {} failed reads",
                s.corrupt_blocks, s.cache_write_errors, s.source_errors, s.read_errors
            ),
        ),
    ]
}

/// The source's and the cache's trouble, a row each only when there is
/// some.
fn trouble_rows(s: &StatsSnapshot) -> Rows {
    let mut rows = Rows::new();
    if let Some(since) = s.source_stalled_since {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(since);
        rows.push((
            "SOURCE STALLED",
            format!(
                "no answer for {:.0} s: cached data and the last known tree are served, \
                 the rest fails with ETIMEDOUT until it answers",
                (now - since).max(0.0)
            ),
        ));
    }
    if s.source_stalls + s.stale_answers + s.source_timeouts > 0 {
        rows.push((
            "source outages",
            format!(
                "{} stalls, {} answers from the last known tree, {} calls timed out, \
                 {} refused while stalled; {} source threads now ({} at most)",
                s.source_stalls,
                s.stale_answers,
                s.source_timeouts,
                s.source_calls_refused,
                s.source_threads,
                s.source_threads_peak
            ),
        ));
    }
    if s.source_throttled_responses > 0 {
        rows.push((
            "source throttled",
            format!(
                "{} answers asked to slow down (503 SlowDown, 429), each retried; \
                 read-ahead cut its concurrency",
                s.source_throttled_responses
            ),
        ));
    }
    if s.source_bad_replies > 0 {
        rows.push((
            "source bad replies",
            format!(
                "{} answers refused as malformed (a body not the length asked, a listing \
                 that repeats itself or passes its bounds); each failed its own call",
                s.source_bad_replies
            ),
        ));
    }
    if s.source_entries_skipped > 0 {
        rows.push((
            "entries skipped",
            format!(
                "{} source names that cannot be file names (warned about in the log)",
                s.source_entries_skipped
            ),
        ));
    }
    if s.cache_writes_skipped > 0 {
        rows.push((
            "not cached",
            format!(
                "{} blocks served but not written (the cache disk fell behind the source; \
                 read-ahead completes those files in the background)",
                s.cache_writes_skipped
            ),
        ));
    }
    if s.cache_writes_refused > 0 {
        rows.push((
            "not taken",
            format!(
                "{} block writes refused by the cache (its share of the budget was full); \
                 tried again from memory in the background",
                s.cache_writes_refused
            ),
        ));
    }
    rows
}

/// The peer cache's traffic and mesh, and one row per member.
fn peer_rows(s: &StatsSnapshot) -> Rows {
    let mut rows = Rows::new();
    if !s.peers.is_empty() {
        rows.push((
            "peer traffic",
            format!(
                "{} served to peers, {} bad blocks caught, {} failed requests, \
                 {} busy answers waited out, {} malformed requests, {} refused connections, \
                 {} handshakes retried",
                format_size(s.peer_served_bytes),
                s.peer_bad_blocks,
                s.peer_failures,
                s.peer_busy,
                s.peer_bad_requests,
                s.peer_refused_connections,
                s.peer_handshakes_retried
            ),
        ));
        let formed = match s.peer_mesh_formed_s {
            Some(t) => format!("every member reached {t:.2} s after start"),
            None => format!("{} members not reached yet", s.peer_members_unreached),
        };
        rows.push((
            "peer mesh",
            format!(
                "{formed}; {} blocks read from the source while their owner was not \
                 reached yet; {} reads waited for such an owner ({} got it)",
                s.peer_unreached_source_blocks, s.peer_owner_waits, s.peer_owner_waits_met
            ),
        ));
    }
    let peer_rows: Vec<String> = s
        .peers
        .iter()
        .map(|p| {
            if p.state == "self" {
                return format!("{} (this node)", p.address);
            }
            format!(
                "{} ({}): {} for {:.0} s, received {}, sent {}, {} requests, {} failed, \
                 {} bad blocks, latency {}",
                p.address,
                p.name,
                p.state,
                p.since_s,
                format_size(p.bytes_received),
                format_size(p.bytes_sent),
                p.requests,
                p.failures,
                p.bad_blocks,
                p.latency_ms
                    .map(|l| format!("{l:.2} ms"))
                    .unwrap_or_else(|| "-".into())
            )
        })
        .collect();
    for r in peer_rows {
        rows.push(("peer", r));
    }
    rows
}

fn budget_line(s: &StatsSnapshot) -> String {
    let b = &s.budget;
    if b.cache_budget_bytes == 0 {
        return "none".into();
    }
    let mounted = b.cache_shares.iter().filter(|d| d.grant_bytes > 0).count();
    format!(
        "{} used of {}{} by {} data sets ({} mounted); this mount may hold {}",
        format_size(b.cache_dir_used_bytes),
        format_size(b.cache_budget_bytes),
        if b.cache_budget_effective_bytes < b.cache_budget_bytes {
            format!(
                " (now {}: the disk is at its free-space floor)",
                format_size(b.cache_budget_effective_bytes)
            )
        } else {
            String::new()
        },
        b.cache_shares.len(),
        mounted,
        format_size(b.cache_grant_bytes)
    )
}

fn epoch_line(s: &StatsSnapshot) -> String {
    let ra = &s.read_ahead;
    let plan = if ra.plan_active {
        format!(
            ", following a plan ({}/{})",
            ra.plan_position, ra.plan_length
        )
    } else {
        String::new()
    };
    format!(
        "{}: {} of {} files read{plan}",
        ra.epoch, ra.epoch_files_read, ra.epoch_files_total
    )
}

/// The serving and holding processes and the restarts, in one line.
fn process_line(s: &StatsSnapshot) -> String {
    let p = &s.process;
    let mut line = format!(
        "server {} (held by {}), {} restarts",
        p.pid, p.supervisor_pid, p.restarts
    );
    if let (Some(at), Some(why)) = (p.last_restart, &p.last_restart_reason) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(at);
        line += &format!(
            ", the last {:.0} s ago ({why} {})",
            (now - at).max(0.0),
            p.last_restart_detail.unwrap_or(0)
        );
    }
    line
}
