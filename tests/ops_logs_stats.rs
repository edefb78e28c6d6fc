//! What operators read: `locafs stats --json` (every key present with the
//! right JSON type), `stats --watch` (a table with rates every second),
//! and the logs: with `--log-format json` every line is one JSON object
//! carrying timestamp, level and message, the notable events are there
//! (mount, cache recovery, corruption found, unmount) and reads log nothing
//! at the default level; text logs in a file carry no colour codes.

mod common;

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

/// A small cache, no passthrough (every read reaches the daemon), `extra`.
fn mount(sc: &Scratch, extra: &[&str]) -> Mount {
    let mut args = vec!["--cache-size", "64MiB", "--no-passthrough"];
    args.extend_from_slice(extra);
    sc.mount(&args)
}

#[test]
fn stats_json_schema_and_watch() {
    require_fuse!();
    let sc = Scratch::with_sample_files();
    let _m = mount(&sc, &["--revalidate", "1s"]);
    sc.check_files_through_mount();
    let out = Command::new(bin())
        .args(["stats", "--json"])
        .arg(&sc.mnt)
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let obj = v.as_object().unwrap();
    let strings = ["source", "mountpoint"];
    let counts = [
        "source_bytes",
        "source_reads",
        "source_errors",
        "cache_hit_bytes",
        "cache_miss_bytes",
        "cache_used_bytes",
        "cache_capacity_bytes",
        "cache_evictions",
        "corrupt_blocks",
        "cache_write_errors",
        "cache_writes_skipped",
        "cache_writes_refused",
        "files_cached",
        "peer_bytes",
        "opens",
        "open_handles",
        "passthrough_kept",
        "passthrough_opens",
        "read_errors",
        "peer_served_bytes",
        "peer_bad_blocks",
        "peer_busy",
        "peer_failures",
        "peer_bad_requests",
        "peer_refused_connections",
        "peer_handshakes_retried",
        "peer_members_unreached",
        "peer_owner_waits",
        "peer_owner_waits_met",
        "peer_unreached_source_blocks",
        "source_stalls",
        "source_calls_refused",
        "source_timeouts",
        "stale_answers",
        "source_threads",
        "source_threads_peak",
        "source_entries_skipped",
        "source_throttled_responses",
        "source_bad_replies",
        "epoch",
        "epoch_files_read",
        "epoch_files_total",
        "plan_position",
        "plan_length",
        "prefetch_sequential_blocks",
        "prefetch_background_files",
        "prefetch_background_bytes",
        "prefetch_memory_used",
        "prefetch_memory_limit",
        "prefetch_concurrency",
        "cache_budget_bytes",
        "cache_budget_effective_bytes",
        "cache_dir_used_bytes",
        "cache_grant_bytes",
        // The processes: the server, its holder, the restarts.
        "pid",
        "supervisor_pid",
        "restarts",
    ];
    for k in strings {
        assert!(obj[k].is_string(), "{k}: {v}");
    }
    for k in counts {
        assert!(obj.get(k).is_some_and(|x| x.is_u64()), "{k}: {v}");
    }
    // null while the source answers.
    assert!(obj["source_stalled_since"].is_null(), "{v}");
    // null without peers (no mesh to form).
    assert!(obj["peer_mesh_formed_s"].is_null(), "{v}");
    assert!(obj["cache_writable"].is_boolean());
    assert!(obj["plan_active"].is_boolean());
    // The default --prefetch-jobs is auto; it starts at 4.
    assert_eq!(obj["prefetch_concurrency_auto"], serde_json::json!(true));
    assert!(obj["prefetch_concurrency"].as_u64().is_some_and(|c| c >= 4));
    assert!(obj["peers"].as_array().is_some_and(|p| p.is_empty()));
    // This mount's own share of the cache directory.
    assert!(obj["cache_shares"].as_array().is_some_and(|p| p.len() == 1));
    // Every mountpoint of the data set: here the one.
    assert_eq!(
        obj["mountpoints"],
        serde_json::json!([obj["mountpoint"]]),
        "{v}"
    );
    assert!(obj["uptime_s"].is_f64());
    // No restart yet: the last one's time, reason and detail are null; the
    // server is not its holder.
    for k in ["last_restart", "last_restart_reason", "last_restart_detail"] {
        assert!(obj[k].is_null(), "{k}: {v}");
    }
    assert_eq!(obj["restarts"], 0, "{v}");
    assert_ne!(obj["pid"], obj["supervisor_pid"], "{v}");
    assert_eq!(
        obj.len(),
        strings.len() + counts.len() + 12,
        "unexpected keys: {v}"
    );
    let total: u64 = sc.files.iter().map(|(_, d)| d.len() as u64).sum();
    assert_eq!(obj["source_bytes"], total);
    assert_eq!(obj["files_cached"], sc.files.len() as u64);
    assert_eq!(obj["opens"], sc.files.len() as u64);
    assert_eq!(obj["open_handles"], 0);
    // Not a locafs mount: exit 2 and a clear message.
    let out = Command::new(bin())
        .args(["stats", "--json"])
        .arg(sc.dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a locafs mount"));

    // --watch: a table every second with rates; reading while it runs
    // shows a non-zero source rate in some frame.
    let mut w = Command::new(bin())
        .args(["stats", "--watch"])
        .arg(&sc.mnt)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1200));
    std::fs::write(sc.src.join("late.bin"), vec![7u8; 2 << 20]).unwrap();
    // New files show up within --revalidate (1 s here): read-ahead has
    // listed the root, so until then the name is not known.
    std::thread::sleep(Duration::from_millis(1100));
    let got = std::fs::read(sc.mnt.join("late.bin")).unwrap();
    assert_eq!(got.len(), 2 << 20);
    std::thread::sleep(Duration::from_millis(2300));
    w.kill().unwrap();
    w.wait().unwrap();
    let mut text = String::new();
    w.stdout.take().unwrap().read_to_string(&mut text).unwrap();
    let frames: Vec<&str> = text
        .split("\n\n")
        .filter(|f| f.contains("uptime"))
        .collect();
    assert!(frames.len() >= 3, "{text}");
    for f in &frames {
        assert!(f.contains("rate source"), "{f}");
        assert!(f.contains("rate cache"), "{f}");
    }
    assert!(
        frames.iter().any(|f| f
            .lines()
            .any(|l| l.starts_with("rate source") && !l.contains(" 0 B/s"))),
        "no frame showed the source rate: {text}"
    );
    // --watch --json: one JSON object per line.
    let mut w = Command::new(bin())
        .args(["stats", "--watch", "--json"])
        .arg(&sc.mnt)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    w.kill().unwrap();
    w.wait().unwrap();
    let mut text = String::new();
    w.stdout.take().unwrap().read_to_string(&mut text).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines.len() >= 2, "{text}");
    for l in lines {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        assert!(v["uptime_s"].is_f64());
    }
}

fn parse_json_log(text: &str) -> Vec<serde_json::Value> {
    text.lines()
        .map(|l| {
            let v: serde_json::Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"));
            assert!(v["timestamp"].is_string(), "{l}");
            assert!(
                ["TRACE", "DEBUG", "INFO", "WARN", "ERROR"]
                    .contains(&v["level"].as_str().unwrap_or("")),
                "{l}"
            );
            assert!(v["fields"]["message"].is_string(), "{l}");
            v
        })
        .collect()
}

fn messages(v: &[serde_json::Value]) -> Vec<String> {
    v.iter()
        .map(|e| e["fields"]["message"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn json_logs_one_event_per_line_with_corruption_found() {
    require_fuse!();
    let sc = Scratch::with_sample_files();
    let log = sc.dir.path().join("log.json");
    let log_s = log.to_str().unwrap();
    {
        let _m = mount(&sc, &["--log-format", "json", "--log-file", log_s]);
        // Many reads: none of them may log at the default level.
        for _ in 0..5 {
            sc.check_files_through_mount();
        }
    }
    let first = parse_json_log(&std::fs::read_to_string(&log).unwrap());
    let msgs = messages(&first);
    assert!(msgs.iter().any(|m| m.starts_with("mounted ")), "{msgs:?}");
    assert!(msgs.iter().any(|m| m.starts_with("unmounted ")), "{msgs:?}");
    assert!(msgs.len() <= 6, "too chatty for 15 file reads: {msgs:#?}");

    // Damage one cached block on disk; the remount recovers the cache and
    // the read finds the corruption, logs it once and serves source bytes.
    let mut data_files = Vec::new();
    let mut stack = vec![sc.cache.clone()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "data") {
                data_files.push(p);
            }
        }
    }
    assert_eq!(data_files.len(), sc.files.len());
    for p in &data_files {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
        f.write_all_at(b"CORRUPTED", 100).unwrap();
    }
    {
        let _m = mount(&sc, &["--log-format", "json", "--log-file", log_s]);
        sc.check_files_through_mount();
    }
    let all = parse_json_log(&std::fs::read_to_string(&log).unwrap());
    let second = &all[first.len()..];
    let msgs = messages(second);
    assert!(
        msgs.iter()
            .any(|m| m.contains(&format!("recovered {} files", sc.files.len()))),
        "{msgs:?}"
    );
    let corrupt: Vec<_> = second
        .iter()
        .filter(|e| e["fields"]["message"].as_str().unwrap().contains("corrupt"))
        .collect();
    assert_eq!(corrupt.len(), sc.files.len(), "{msgs:#?}");
    for e in corrupt {
        assert_eq!(e["level"], "WARN");
        assert!(e["fields"]["file"].is_string(), "{e}");
    }
}

#[test]
fn text_log_file_has_no_colour_codes() {
    require_fuse!();
    let sc = Scratch::with_sample_files();
    let log = sc.dir.path().join("log.txt");
    {
        let _m = mount(&sc, &["--log-file", log.to_str().unwrap()]);
        sc.check_files_through_mount();
    }
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("mounted"), "{text}");
    assert!(
        !text.contains('\x1b'),
        "ANSI codes in the log file: {text:?}"
    );
    for l in text.lines() {
        assert!(l.contains(" INFO ") || l.contains(" WARN "), "{l}");
    }
}
