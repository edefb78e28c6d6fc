//! The shared test vector of the locality sampler: `tests/data/locality_vectors.json`
//! is what `locafs::peer::sampler` gives for a handful of small layouts. The Python
//! sampler (packaging/python) is checked against the same file, so the two
//! implementations agree bit for bit. Regenerate it, after a deliberate change
//! of the algorithm, with `LOCAFS_WRITE_VECTORS=1 cargo test --test locality_vectors`
//! (the regenerating run writes the file and fails: it checked nothing; run
//! it again without the variable).

use locafs::peer::sampler::{epoch_batches, rank_indices, Layout, SplitMix64};
use serde_json::{json, Value};

const VECTORS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/data/locality_vectors.json"
);

/// (n, nodes, local world size, batch size, seed, epoch, skew): skew 0 gives
/// owners spread evenly at random, larger values pile them onto the last node.
const CASES: &[(usize, usize, usize, usize, u64, u64, u64)] = &[
    (40, 3, 1, 4, 0, 0, 0),
    (100, 3, 2, 3, 42, 1, 0),
    (97, 4, 1, 5, 7, 2, 2),
    (256, 4, 2, 8, 123_456_789, 5, 1),
    (64, 3, 1, 2, 18_446_744_073_709_551_615, 1, 3),
    (30, 1, 2, 4, 9, 0, 0),
];

fn owners(n: usize, p: usize, skew: u64, seed: u64) -> Vec<u32> {
    let mut rng = SplitMix64::for_epoch(seed, 0xA5A5);
    (0..n)
        .map(|_| ((rng.next_u64() % (p as u64 * (1 + skew))) as u32).min(p as u32 - 1))
        .collect()
}

fn compute() -> Value {
    let cases: Vec<Value> = CASES
        .iter()
        .map(|&(n, p, l, b, seed, epoch, skew)| {
            let layout = Layout {
                num_nodes: p,
                local_world_size: l,
                batch_size: b,
            };
            let owners = owners(n, p, skew, seed);
            let ranks: Vec<Vec<u32>> = (0..p)
                .flat_map(|q| (0..l).map(move |r| (q, r)))
                .map(|(q, r)| rank_indices(&owners, layout, seed, epoch, q, r))
                .collect();
            let moved: usize = epoch_batches(&owners, layout, seed, epoch)
                .map(|b| b.moved)
                .sum();
            json!({
                "n": n, "num_nodes": p, "local_world_size": l, "batch_size": b,
                "seed": seed, "epoch": epoch, "owners": owners, "ranks": ranks, "moved": moved,
            })
        })
        .collect();
    json!({ "cases": cases })
}

#[test]
fn the_shared_vector_is_what_the_algorithm_gives() {
    let now = compute();
    if std::env::var_os("LOCAFS_WRITE_VECTORS").is_some() {
        // A regeneration checks nothing (the file would be compared with
        // itself): it writes the file and fails, so that it never counts
        // as a pass.
        let text = serde_json::to_string(&now).unwrap() + "\n";
        std::fs::write(VECTORS, text).unwrap();
        panic!(
            "wrote {VECTORS} and checked nothing (LOCAFS_WRITE_VECTORS is set): review its \
             diff, then run the test again without LOCAFS_WRITE_VECTORS"
        );
    }
    let text = std::fs::read_to_string(VECTORS)
        .unwrap_or_else(|e| panic!("{VECTORS}: {e} (write it with LOCAFS_WRITE_VECTORS=1)"));
    let stored: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        stored, now,
        "the algorithm changed: the Python sampler must change with it"
    );
}

#[test]
fn the_vector_cases_exercise_balancing() {
    // A vector in which nothing moves would prove nothing about Algorithm 1.
    let v = compute();
    let moved: u64 = v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["moved"].as_u64().unwrap())
        .sum();
    assert!(moved > 0);
    let first = &v["cases"][0]["ranks"];
    assert_eq!(first.as_array().unwrap().len(), 3);
}
