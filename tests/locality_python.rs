//! The Python package (packaging/python, docs/locality.md) under `cargo
//! test`: its unittest suite (the sampler's invariants and the shared test
//! vector, `locafs.mount`'s supervision of stand-in binaries; unittest, so
//! that it needs nothing but python3) and a real 3-node run: three `locafs
//! mount` processes with peers on loopback, a Python process per node whose
//! local ranks read through that node's mount with worker threads in the
//! sampler's order, for 2 epochs. `pip install` of the package (the wheel,
//! with the binary) is tests/python_wheel.rs.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::cluster::*;
use common::*;
use serde_json::{json, Value};

fn package() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/python")
}

/// python3, or the reason the test cannot run.
fn python() -> Result<PathBuf, String> {
    which("python3").ok_or_else(|| "python3 is not installed".to_owned())
}

#[test]
fn python_unit_tests() {
    let py = match python() {
        Ok(p) => p,
        Err(why) => skip!("{why}"),
    };
    let out = Command::new(&py)
        .args(["-m", "unittest", "discover", "-v", "-s", "tests", "-t", "."])
        .current_dir(package())
        .output()
        .expect("run python3");
    let text = String::from_utf8_lossy(&out.stderr);
    eprintln!("{text}");
    // A Python test that skips says so. The torch form's skip without
    // torch (having checked the plain-iterable form) is reported by
    // the_sampler_is_a_torch_sampler_when_torch_is_there, below.
    let torch = python_has(&py, "torch");
    for l in text.lines().filter(|l| l.contains("... skipped")) {
        if !torch && l.starts_with("test_sampler_type (") {
            continue;
        }
        skipped(module_path!(), &format!("python: {}", l.trim()));
    }
    assert!(out.status.success(), "the Python tests failed");
    assert!(
        text.lines()
            .any(|l| l.starts_with("test_every_case_of_the_shared_vector") && l.ends_with("... ok")),
        "the shared vector was not checked"
    );
}

/// Whether `import module` works in `py`.
fn python_has(py: &Path, module: &str) -> bool {
    Command::new(py)
        .args(["-c", &format!("import {module}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// With torch installed, the sampler is a `torch.utils.data.Sampler` that a
/// DataLoader takes (the Python test `TorchForm`). Without torch it skips:
/// torch is ~5.4 GB, and `.ci/run` lists this test as an expected skip
/// unless LOCAFS_CI_TORCH=1.
#[test]
fn the_sampler_is_a_torch_sampler_when_torch_is_there() {
    let py = match python() {
        Ok(p) => p,
        Err(why) => skip!("{why}"),
    };
    if !python_has(&py, "torch") {
        skip!("torch is not installed for python3 (pip install torch)");
    }
    let out = Command::new(py)
        .args(["-m", "unittest", "-v", "tests.test_sampler.TorchForm"])
        .current_dir(package())
        .output()
        .expect("run python3");
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("test_sampler_type") && l.ends_with("... ok")),
        "{text}"
    );
}

const LOCAL_RANKS: usize = 2;
const BATCH: usize = 4;
const EPOCHS: usize = 2;

/// Starts 3 nodes named `prefix`0..2 over `c`'s source (fresh caches).
fn start_nodes(c: &Cluster, prefix: &str) -> Vec<Node> {
    let ports = [free_udp_port(), free_udp_port(), free_udp_port()];
    let nodes: Vec<Node> = (0..3)
        .map(|i| {
            Node::start(
                c,
                &format!("{prefix}{i}"),
                ports[i],
                NodeOpts {
                    peers: &ports,
                    secret: &c.secret,
                    cache_size: "256M",
                    peer_timeout: "2s",
                },
            )
        })
        .collect();
    for n in &nodes {
        n.wait_peers_up(&ports);
    }
    nodes
}

/// Runs node_run.py on every node at once; returns each node's output.
fn run_nodes(py: &Path, c: &Cluster, nodes: &[Node], mode: &str) -> Vec<Value> {
    let files: Vec<&str> = c.files.iter().map(|(r, _)| r.as_str()).collect();
    let script = package().join("tests/node_run.py");
    let children: Vec<_> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let dir = c.dir.path().join(format!("{}-{mode}", n.name));
            std::fs::create_dir_all(&dir).unwrap();
            let cfg = json!({
                "mount": n.mountpoint, "source": c.source(), "files": files,
                "batch_size": BATCH, "local_world_size": LOCAL_RANKS, "epochs": EPOCHS,
                "workers": 4, "seed": 7, "mode": mode, "node": i, "nodes": nodes.len(),
            });
            std::fs::write(dir.join("cfg.json"), cfg.to_string()).unwrap();
            let child = Command::new(py)
                .arg(&script)
                .arg(dir.join("cfg.json"))
                .arg(dir.join("out.json"))
                .spawn()
                .expect("python3");
            (child, dir)
        })
        .collect();
    children
        .into_iter()
        .zip(nodes)
        .map(|((mut child, dir), n)| {
            let st = child.wait().unwrap();
            assert!(st.success(), "{} ({mode}): node_run.py failed", n.name);
            serde_json::from_slice(&std::fs::read(dir.join("out.json")).unwrap()).unwrap()
        })
        .collect()
}

/// Checks that every sample of each epoch's global batches was read once,
/// by equal shares; returns the samples read per epoch.
fn check_exactly_once(outs: &[Value], n: usize) -> usize {
    let g = 3 * LOCAL_RANKS * BATCH;
    let per_epoch = (n / g) * g;
    let mut nodes: Vec<u64> = outs
        .iter()
        .map(|o| o["node_index"].as_u64().unwrap())
        .collect();
    nodes.sort();
    assert_eq!(nodes, [0, 1, 2], "node indexes");
    for o in outs {
        assert_eq!(o["bad"], json!([]), "wrong bytes read");
    }
    for epoch in 0..EPOCHS {
        let mut count: HashMap<u64, usize> = HashMap::new();
        let mut ranks = 0;
        for o in outs {
            for (_, epochs) in o["ranks"].as_object().unwrap() {
                let read = epochs[epoch].as_array().unwrap();
                assert_eq!(read.len(), per_epoch / (3 * LOCAL_RANKS), "equal shares");
                for i in read {
                    *count.entry(i.as_u64().unwrap()).or_default() += 1;
                }
                ranks += 1;
            }
        }
        assert_eq!(ranks, 3 * LOCAL_RANKS);
        assert_eq!(count.len(), per_epoch, "epoch {epoch}: samples read");
        assert!(
            count.values().all(|c| *c == 1),
            "epoch {epoch}: a sample read twice"
        );
    }
    per_epoch
}

#[test]
fn three_real_nodes_train_on_what_they_hold() {
    require_fuse!();
    let py = match python() {
        Ok(p) => p,
        Err(why) => skip!("{why}"),
    };
    // 360 files of one block each (BLOCK is 64 KiB).
    let c = Cluster::new(360, 2_000, 60_000, 16);
    let mut outcome = Vec::new();
    for mode in ["locality", "plain"] {
        // Fresh caches for each sampler, over the same source.
        let nodes = start_nodes(&c, &format!("{}-", &mode[..1]));
        let outs = run_nodes(&py, &c, &nodes, mode);
        let per_epoch = check_exactly_once(&outs, c.files.len());
        let stats: Vec<_> = nodes.iter().map(|n| n.stats()).collect();
        let peer: u64 = stats.iter().map(|s| s.peer_bytes).sum();
        let source: u64 = stats.iter().map(|s| s.source_bytes).sum();
        for (n, s) in nodes.iter().zip(&stats) {
            assert_eq!(s.read_errors, 0, "{}", n.name);
            assert_eq!(s.peer_bad_blocks, 0, "{}", n.name);
        }
        let moved: Vec<String> = outs.iter().map(|o| o["moved"].to_string()).collect();
        eprintln!(
            "{mode}: {EPOCHS} epochs of {per_epoch} samples on 3 nodes x {LOCAL_RANKS} ranks: \
             between nodes {peer} bytes ({:.3} D per epoch), from the source {source} bytes \
             ({:.3} D); moved samples per epoch {}",
            peer as f64 / c.total_bytes() as f64 / EPOCHS as f64,
            source as f64 / c.total_bytes() as f64,
            moved.first().cloned().unwrap_or_default(),
        );
        outcome.push(peer);
    }
    let (locality, plain) = (outcome[0], outcome[1]);
    assert!(plain > 0, "the plain order fetched nothing from peers");
    assert!(
        locality * 2 < plain,
        "bytes between nodes: locality {locality} against plain {plain}"
    );
}
