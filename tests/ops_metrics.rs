//! The metrics endpoint of a real mount: after a workload (cold reads from
//! the source, warm rereads from the cache), `--metrics ADDR` serves
//! Prometheus text that parses line by line and carries the expected
//! `locafs_*` series with values that match the workload; every series the
//! shipped Grafana dashboard uses exists. Also: a bad or busy address is a
//! usage error before anything is mounted.

mod common;

use std::process::Command;
use std::time::Duration;

use common::prom::{scrape, value};
use common::*;

#[test]
fn metrics_endpoint_after_a_workload() {
    require_fuse!();
    let sc = Scratch::with_sample_files();
    let port = free_tcp_port();
    let addr = format!("127.0.0.1:{port}");
    let _m = sc.mount(&[
        "--cache-size",
        "64MiB",
        "--no-passthrough",
        // Without read-ahead every first read is a miss the metrics
        // must show (read-ahead could have fetched everything first).
        "--no-readahead",
        "--metrics",
        &addr,
    ]);
    let total: usize = sc.files.iter().map(|(_, d)| d.len()).sum();
    // Cold pass then warm pass; every byte must match the source. The page
    // cache is dropped in between, so the warm pass reaches the daemon and
    // is served from its disk cache (hits).
    for pass in 0..2 {
        if pass == 1 {
            drop_page_cache();
        }
        sc.check_files_through_mount();
    }
    // Writes are refused.
    assert!(std::fs::write(sc.mnt.join("new.txt"), b"x").is_err());
    let _ = std::fs::read_dir(&sc.mnt).unwrap().count();

    // The updater copies counters twice a second: wait until every byte
    // the daemon served, in both passes, is counted as a hit or a miss (the
    // cold pass alone makes `total` misses: waiting for that much read a
    // copy taken before the warm pass's hits, and a hit ratio of 0).
    let mut samples = Vec::new();
    let mut types = Default::default();
    let mut body = String::new();
    let settled = wait_for(Duration::from_secs(10), || {
        (samples, types, body) = scrape(&addr);
        let hit = value(&samples, "locafs_tier_bytes_total", &[("tier", "cache")]);
        let miss = value(&samples, "locafs_cache_miss_bytes_total", &[]);
        // The FUSE request counts are copied by the same updater, apart
        // from the tier bytes: wait for them too (the CI once scraped the
        // bytes of both passes with fewer than 4 reads counted).
        let opens = value(&samples, "locafs_fuse_requests_total", &[("op", "open")]);
        hit.unwrap_or(0.0) + miss.unwrap_or(0.0) >= 2.0 * total as f64
            && value(&samples, "locafs_open_handles", &[]) == Some(0.0)
            && opens.unwrap_or(0.0) >= 2.0 * sc.files.len() as f64
            // Each label of the FUSE counts is set apart: the CI once
            // scraped 6 opens with 0 reads and 0 releases counted.
            && value(&samples, "locafs_fuse_requests_total", &[("op", "read")]).unwrap_or(0.0) >= 4.0
            && value(&samples, "locafs_fuse_requests_total", &[("op", "release")]).unwrap_or(0.0)
                >= 2.0 * sc.files.len() as f64
            // (and the listing, made just before the scrape)
            && value(&samples, "locafs_fuse_requests_total", &[("op", "readdirplus")]).unwrap_or(0.0)
                + value(&samples, "locafs_fuse_requests_total", &[("op", "readdir")]).unwrap_or(0.0)
                >= 1.0
    });
    assert!(settled, "metrics never showed the workload:\n{body}");

    for s in &samples {
        assert!(s.name.starts_with("locafs_"), "foreign series {}", s.name);
    }
    let v = |n: &str, l: &[(&str, &str)]| {
        value(&samples, n, l).unwrap_or_else(|| panic!("missing {n} {l:?}\n{body}"))
    };
    // Bytes by tier: everything was read once from the source, the warm
    // pass from the cache; no peers here.
    assert!(v("locafs_tier_bytes_total", &[("tier", "source")]) >= total as f64);
    assert_eq!(v("locafs_tier_bytes_total", &[("tier", "peer")]), 0.0);
    assert!(v("locafs_cache_miss_bytes_total", &[]) > 0.0);
    let ratio = v("locafs_cache_hit_ratio", &[]);
    assert!(ratio > 0.0 && ratio < 1.0, "hit ratio {ratio}");
    // Requests by tier and latency histograms per tier.
    let source_reads = v("locafs_tier_requests_total", &[("tier", "source")]);
    assert!(source_reads >= sc.files.len() as f64);
    assert!(v("locafs_tier_requests_total", &[("tier", "cache")]) > 0.0);
    assert_eq!(v("locafs_tier_requests_total", &[("tier", "peer")]), 0.0);
    assert_eq!(
        types
            .get("locafs_tier_read_duration_seconds")
            .map(String::as_str),
        Some("histogram")
    );
    for tier in ["cache", "source"] {
        let buckets: Vec<(f64, f64)> = samples
            .iter()
            .filter(|s| {
                s.name == "locafs_tier_read_duration_seconds_bucket"
                    && s.labels.get("tier").map(String::as_str) == Some(tier)
            })
            .map(|s| (s.labels["le"].parse::<f64>().unwrap(), s.value))
            .collect();
        assert!(buckets.len() > 5, "{tier}: buckets {buckets:?}");
        assert!(
            buckets
                .windows(2)
                .all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1),
            "{tier}: buckets not cumulative {buckets:?}"
        );
        let count = v("locafs_tier_read_duration_seconds_count", &[("tier", tier)]);
        assert_eq!(buckets.last().unwrap(), &(f64::INFINITY, count));
        assert_eq!(count, v("locafs_tier_requests_total", &[("tier", tier)]));
        assert!(v("locafs_tier_read_duration_seconds_sum", &[("tier", tier)]) > 0.0);
    }
    // Cache state.
    assert_eq!(
        v("locafs_cache_capacity_bytes", &[]),
        64.0 * 1024.0 * 1024.0
    );
    assert!(v("locafs_cache_used_bytes", &[]) >= total as f64);
    assert_eq!(v("locafs_cache_files_complete", &[]), sc.files.len() as f64);
    assert_eq!(v("locafs_cache_writable", &[]), 1.0);
    assert_eq!(v("locafs_cache_evictions_total", &[]), 0.0);
    assert_eq!(v("locafs_cache_corrupt_blocks_total", &[]), 0.0);
    // Handles, opens, FUSE operations, errors.
    assert_eq!(v("locafs_opens_total", &[]), 2.0 * sc.files.len() as f64);
    assert_eq!(v("locafs_passthrough_opens_total", &[]), 0.0);
    assert!(
        v("locafs_fuse_requests_total", &[("op", "read")]) >= 4.0,
        "{body}"
    );
    assert!(
        v("locafs_fuse_requests_total", &[("op", "lookup")]) >= 3.0,
        "{body}"
    );
    assert_eq!(
        v("locafs_fuse_requests_total", &[("op", "open")]),
        2.0 * sc.files.len() as f64
    );
    assert!(
        v("locafs_fuse_requests_total", &[("op", "readdirplus")])
            + v("locafs_fuse_requests_total", &[("op", "readdir")])
            >= 1.0
    );
    // The kernel refuses writes on the read-only mount itself.
    assert_eq!(v("locafs_fuse_requests_total", &[("op", "modify")]), 0.0);
    for kind in ["source", "read", "cache_corrupt", "cache_write", "peer"] {
        assert_eq!(v("locafs_errors_total", &[("kind", kind)]), 0.0, "{kind}");
    }
    assert!(v("locafs_memory_cache_bytes", &[]) > 0.0);
    assert_eq!(
        v(
            "locafs_info",
            &[(
                "mountpoint",
                sc.mnt.canonicalize().unwrap().to_str().unwrap()
            )]
        ),
        1.0
    );
    // Counters are typed as counters and end in _total.
    for (name, t) in &types {
        if t == "counter" {
            assert!(name.ends_with("_total"), "counter {name} without _total");
        }
        if name.ends_with("_total") {
            assert_eq!(t, "counter", "{name}");
        }
    }

    // Every series the Grafana dashboard queries exists.
    let dash = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/grafana/locafs.json"),
    )
    .unwrap();
    let dash_json: serde_json::Value = serde_json::from_str(&dash).expect("dashboard is JSON");
    assert!(dash_json["panels"].as_array().unwrap().len() >= 8);
    let mut used = std::collections::BTreeSet::new();
    for (i, _) in dash.match_indices("locafs_") {
        let name: String = dash[i..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        used.insert(name);
    }
    assert!(used.len() >= 10, "{used:?}");
    for name in used {
        assert!(
            samples.iter().any(|s| s.name == name),
            "dashboard uses {name}, which the endpoint does not serve"
        );
    }
}

#[test]
fn bad_or_busy_metrics_address_is_a_usage_error() {
    let sc = Scratch::with_sample_files();
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy_addr = busy.local_addr().unwrap().to_string();
    for addr in ["nonsense", busy_addr.as_str()] {
        let out = Command::new(bin())
            .arg("mount")
            .arg(&sc.src)
            .arg(&sc.mnt)
            .arg("--cache-dir")
            .arg(&sc.cache)
            .arg("--metrics")
            .arg(addr)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{addr}: {err}");
        assert!(err.contains("--metrics"), "{addr}: {err}");
        assert!(
            mount_type(&sc.mnt).is_none(),
            "{addr}: something got mounted"
        );
    }
}
