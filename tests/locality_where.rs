//! The `where` query on real mounts (issue 15, docs/locality.md): without
//! peers every file is node 0's of 1; on a real 3-node cluster on loopback
//! every node gives the same owners and its own index, whatever order its
//! --peers list is in, and the owner is the node that really serves the
//! file's block; a call over a larger data set is timed (printed, never
//! asserted).

mod common;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::cluster::*;
use common::*;
use locafs::mount::control::{Client, Request, Response};
use locafs::peer::placement::{block_key, path_id, MemberId, Placement};
use serde_json::Value;

fn where_json(mnt: &Path, files: &[&str]) -> Value {
    let mut args: Vec<&OsStr> = vec![OsStr::new("where"), mnt.as_os_str()];
    args.extend(files.iter().map(OsStr::new));
    args.push(OsStr::new("--json"));
    let out = run_locafs(&args);
    assert!(
        out.status.success(),
        "locafs where: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("where JSON")
}

#[test]
fn without_peers_every_file_is_node_0_of_1() {
    require_fuse!();
    let s = Scratch::with_sample_files();
    let _m = s.mount(&[]);
    let all = where_json(&s.mnt, &[]);
    assert_eq!(all["ok"], true, "{all}");
    assert_eq!(all["node_index"], 0);
    assert_eq!(all["num_nodes"], 1);
    // Listing order: depth first, by name.
    assert_eq!(
        all["paths"],
        serde_json::json!(["class_a/big.bin", "class_a/small.txt", "top.bin"])
    );
    assert_eq!(all["owners"], serde_json::json!([0, 0, 0]));
    assert_eq!(all["cached"], serde_json::json!([false, false, false]));
    // Exactly the keys docs/locality.md documents (no warm counters that
    // are always 0 here).
    let mut keys: Vec<&str> = all
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "cached",
            "files",
            "members",
            "node_index",
            "num_nodes",
            "ok",
            "owners",
            "paths",
            "unknown"
        ]
    );

    // Cached here once read; a path that is not a file is reported, not
    // fatal.
    s.check_files_through_mount();
    wait_until("small.txt cached", Duration::from_secs(10), || {
        where_json(&s.mnt, &["class_a/small.txt"])["cached"][0] == true
    });
    let abs = s.mnt.join("top.bin");
    let some = where_json(
        &s.mnt,
        &[
            "class_a/small.txt",
            "nothere.bin",
            "class_a",
            abs.to_str().unwrap(),
        ],
    );
    assert_eq!(some["owners"], serde_json::json!([0, null, null, 0]));
    assert_eq!(some["unknown"], 2);
    assert!(some.get("paths").is_none());

    let out = run_locafs(&[
        OsStr::new("where"),
        s.mnt.as_os_str(),
        OsStr::new("class_a/small.txt"),
        OsStr::new("nothere.bin"),
    ]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("{text}");
    assert!(text.contains("this node: 0 of 1"), "{text}");
    assert!(
        text.contains("class_a/small.txt\tnode 0\tcached here"),
        "{text}"
    );
    assert!(text.contains("nothere.bin\tnot found"), "{text}");
    assert!(text.contains("1 not found"), "{text}");

    // Not a mount: a clear error, exit 2.
    let out = run_locafs(&[OsStr::new("where"), s.src.as_os_str()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not the root of a locafs mount"));
}

#[test]
fn three_nodes_agree_on_owners_and_the_owner_serves_the_block() {
    require_fuse!();
    // Files of one block each (BLOCK is 64 KiB).
    let c = Cluster::new(40, 1_000, 60_000, 15);
    let ports = [free_udp_port(), free_udp_port(), free_udp_port()];
    let addr = |p: u16| format!("127.0.0.1:{p}");
    // Each node lists the peers in another order.
    let mut nodes: Vec<Node> = (0..3)
        .map(|i| {
            let mut peers: Vec<String> = ports.iter().map(|p| addr(*p)).collect();
            peers.rotate_left(i);
            if i == 1 {
                peers.reverse();
            }
            Node::start_spec(
                &c,
                &format!("n{i}"),
                NodeSpec {
                    listen: addr(ports[i]),
                    peers,
                    secret: &c.secret,
                    cache_size: "256M",
                    peer_timeout: "2s",
                    netns: None,
                },
            )
        })
        .collect();
    for n in &nodes {
        n.wait_peers_up(&ports);
    }
    // The expected answer, from the placement itself: members sorted by id.
    let mut members: Vec<String> = ports.iter().map(|p| addr(*p)).collect();
    members.sort();
    let placement = Placement::new(members.iter().map(|m| MemberId::new(m.clone())).collect());
    let dataset = locafs::peer::wire_dataset_id(&locafs::mount::config::dataset_id(&c.source()));
    let expected: Vec<u64> = c
        .files
        .iter()
        .map(|(rel, _)| {
            let id = path_id(Path::new(rel));
            let owner = placement
                .owner(&block_key(&dataset, &id, 0, BLOCK as u32))
                .unwrap();
            members.iter().position(|m| m == owner.as_str()).unwrap() as u64
        })
        .collect();
    let rels: Vec<&str> = c.files.iter().map(|(r, _)| r.as_str()).collect();
    let mut indexes = Vec::new();
    for n in &nodes {
        let all = where_json(&n.mountpoint, &[]);
        assert_eq!(all["ok"], true, "{}: {all}", n.name);
        assert_eq!(all["num_nodes"], 3);
        assert_eq!(all["members"], serde_json::json!(members));
        assert_eq!(all["paths"], serde_json::json!(rels), "listing order");
        assert_eq!(all["owners"], serde_json::json!(expected), "{}", n.name);
        let me = all["node_index"].as_u64().unwrap() as usize;
        assert_eq!(members[me], n.addr, "{}'s index", n.name);
        indexes.push(me);
    }
    indexes.sort();
    assert_eq!(indexes, [0, 1, 2]);
    for k in 0..3 {
        assert!(expected.contains(&k), "node {k} owns nothing");
    }

    // "Owner" is the node that serves the block: node n0 reads one file of
    // each other node and gets its bytes from that node only.
    let reader = &nodes[0];
    let me = members.iter().position(|m| *m == reader.addr).unwrap() as u64;
    let received = |node: &Node| -> Vec<(String, u64)> {
        node.stats()
            .peers
            .into_iter()
            .map(|p| (p.address, p.bytes_received))
            .collect()
    };
    for owner in (0..3u64).filter(|o| *o != me) {
        let i = expected.iter().position(|o| *o == owner).unwrap();
        let (rel, data) = &c.files[i];
        let before = received(reader);
        reader.read_check(rel, data);
        let after = received(reader);
        for ((addr, b), (_, a)) in before.iter().zip(&after) {
            let want = if *addr == members[owner as usize] {
                data.len() as u64
            } else {
                0
            };
            assert_eq!(a - b, want, "{rel} (owner node {owner}): bytes from {addr}");
        }
    }

    // A node down changes no answer: owners are over the configured list,
    // not the live one.
    let gone = nodes[2].addr.clone();
    nodes[2].stop();
    nodes[0].wait_peers_in_state(&[gone], &["down"], Duration::from_secs(20));
    let all = where_json(&nodes[0].mountpoint, &[]);
    assert_eq!(all["num_nodes"], 3);
    assert_eq!(all["owners"], serde_json::json!(expected));
}

/// One call answers every file of a data set of 10 k files (in listing
/// order, and by paths), and prints its time. The figure at 100 k or 1.28 M
/// files is for a release build: LOCAFS_WHERE_FILES=100000 cargo test
/// --release --test locality_where one_call -- --nocapture (at 100 k files
/// in a debug build this test alone took 5 minutes of CI).
#[test]
fn one_call_answers_a_large_data_set() {
    require_fuse!();
    let files: usize = std::env::var("LOCAFS_WHERE_FILES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let s = Scratch::new();
    let per_dir = 1000;
    let mut rels = Vec::with_capacity(files);
    for d in 0..files.div_ceil(per_dir) {
        let dir = s.src.join(format!("c{d:04}"));
        std::fs::create_dir(&dir).unwrap();
        for f in 0..per_dir.min(files - d * per_dir) {
            let name = format!("i{f:05}.jpg");
            std::fs::write(dir.join(&name), [f as u8]).unwrap();
            rels.push(PathBuf::from(format!("c{d:04}/{name}")));
        }
    }
    let _m = s.mount(&[]);
    let mut client = Client::connect(&s.mnt).unwrap();
    let mut call = |req: Request| -> (Response, Duration) {
        let t0 = Instant::now();
        let r = client.call(&req).unwrap();
        (r, t0.elapsed())
    };
    let joined: Vec<&str> = rels.iter().map(|p| p.to_str().unwrap()).collect();
    let joined = joined.join("\0");
    let where_ =
        |paths: Option<Vec<PathBuf>>, joined: Option<String>, packed: bool| Request::Where {
            paths,
            joined,
            payload: None,
            packed,
        };
    let (first, t_first) = call(where_(None, None, true));
    let (all, t_all) = call(where_(None, None, true));
    let (plain, _) = call(where_(None, None, false));
    let joined_bytes = joined.clone();
    let (some, t_paths) = call(where_(None, Some(joined), true));
    let (by_list, _) = call(where_(Some(rels.clone()), None, false));
    let raw = Request::Where {
        paths: None,
        joined: None,
        payload: Some(joined_bytes.len() as u64),
        packed: true,
    };
    let by_payload = client.call_with(&raw, joined_bytes.as_bytes()).unwrap();
    for r in [&first, &all, &plain, &some, &by_list, &by_payload] {
        assert!(r.ok, "{:?}", r.error);
        assert_eq!(r.files, files as u64);
        assert_eq!(r.unknown, 0);
    }
    // The packed and plain forms say the same.
    let listed: Vec<PathBuf> = all
        .paths_joined
        .as_deref()
        .unwrap()
        .split('\0')
        .map(PathBuf::from)
        .collect();
    assert_eq!(listed, rels, "listing order");
    let plain_listed: Vec<PathBuf> = plain
        .paths
        .clone()
        .unwrap()
        .into_iter()
        .map(PathBuf::from)
        .collect();
    assert_eq!(plain_listed, rels);
    let owners = plain.where_owners().unwrap();
    assert_eq!(owners.len(), files);
    for r in [&first, &all, &some, &by_list, &by_payload] {
        assert_eq!(r.where_owners().unwrap(), owners);
        assert_eq!(r.where_cached().unwrap(), plain.where_cached().unwrap());
    }
    let per_m = |d: Duration| d.as_secs_f64() * 1.28e6 / files as f64;
    eprintln!(
        "where over {files} files ({} build): first call (lists the source) {:.0} ms, \
         all files {:.0} ms, by paths {:.0} ms; scaled to 1.28 M files: {:.2} s, {:.2} s",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        t_first.as_secs_f64() * 1e3,
        t_all.as_secs_f64() * 1e3,
        t_paths.as_secs_f64() * 1e3,
        per_m(t_all),
        per_m(t_paths),
    );
}
