//! Locality-aware loading: which learner trains on which sample, so that
//! each node trains mostly on what it holds (Yang & Cong, HiPC'19,
//! section V; docs/locality.md).
//!
//! Every learner derives the same permutation of the data set from a shared
//! seed and cuts it into global mini-batches. Each node takes the samples of
//! a batch that it owns; the imbalance is evened out with the paper's
//! Algorithm 1 (two heaps, surplus to deficit, at most p-1 moves), so that
//! every node gets exactly its share and only the moved samples cross the
//! network. The gradient of each global batch is unchanged: the same samples
//! are trained on, only by other learners.
//!
//! This is the reference of the algorithm that the Python sampler
//! (`packaging/python/locafs/sampler.py`) implements: both must agree bit
//! for bit, and `tests/data/locality_vectors.json` (written from this code
//! by `tests/locality_vectors.rs`) proves it. It is also what the cluster
//! simulator (`benches/cluster_sim.rs`) drives. Pure: no I/O, no clocks, no
//! global state; it must never depend on anything a node does not share
//! with every other node (the seed, the epoch, the owners, the layout).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// The splitmix64 generator: tiny, fast, and specified in a few lines, so
/// that a Python implementation gives the same numbers.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator for one epoch: seeded with `seed + epoch` (wrapping).
    pub fn for_epoch(seed: u64, epoch: u64) -> Self {
        SplitMix64(seed.wrapping_add(epoch))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// The epoch's permutation of `0..n`: Fisher-Yates from the top, with
/// `j = next() % (i + 1)` (the modulo bias is below 2^-40 for any real data
/// set, and it keeps the Python side one line).
pub fn permutation(n: usize, seed: u64, epoch: u64) -> Vec<u32> {
    let mut rng = SplitMix64::for_epoch(seed, epoch);
    let mut perm: Vec<u32> = (0..n as u32).collect();
    for i in (1..n).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        perm.swap(i, j);
    }
    perm
}

/// How the job is laid out: nodes, learners per node, samples per learner
/// per step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub num_nodes: usize,
    pub local_world_size: usize,
    pub batch_size: usize,
}

impl Layout {
    /// Samples per node per global batch.
    pub fn node_share(&self) -> usize {
        self.local_world_size * self.batch_size
    }

    /// Samples per global batch.
    pub fn global_batch(&self) -> usize {
        self.num_nodes * self.node_share()
    }

    /// Global batches in an epoch of `n` samples (the tail is dropped).
    pub fn batches(&self, n: usize) -> usize {
        n.checked_div(self.global_batch()).unwrap_or(0)
    }
}

/// One global batch, split among the nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchShares {
    /// Each node's samples, exactly [`Layout::node_share`] of them: first the
    /// ones it owns (in batch order), then the ones moved to it.
    pub per_node: Vec<Vec<u32>>,
    /// Samples moved from a node that owns them to one that does not.
    pub moved: usize,
    /// Moves made (at most `num_nodes - 1`).
    pub moves: usize,
    /// The largest surplus or deficit of one node before balancing.
    pub largest_imbalance: usize,
}

/// Evens out `own` (each node's samples of one batch) so that every node
/// has exactly `target`, with the paper's Algorithm 1: the node with the
/// largest surplus gives its last samples to the node with the largest
/// deficit (ties to the smaller node index), until no node is off. Returns
/// (samples moved, moves made). The lengths must sum to `target * own.len()`.
pub fn balance(own: &mut [Vec<u32>], target: usize) -> (usize, usize) {
    // Max-heaps keyed by (amount, smaller index first).
    let mut surplus: BinaryHeap<(usize, Reverse<usize>)> = BinaryHeap::new();
    let mut deficit: BinaryHeap<(usize, Reverse<usize>)> = BinaryHeap::new();
    for (q, v) in own.iter().enumerate() {
        if v.len() > target {
            surplus.push((v.len() - target, Reverse(q)));
        } else if v.len() < target {
            deficit.push((target - v.len(), Reverse(q)));
        }
    }
    let (mut moved, mut moves) = (0, 0);
    while let (Some((a, Reverse(s))), Some((b, Reverse(d)))) = (surplus.pop(), deficit.pop()) {
        let m = a.min(b);
        let from = own[s].len() - m;
        let taken: Vec<u32> = own[s].drain(from..).collect();
        own[d].extend_from_slice(&taken);
        moved += m;
        moves += 1;
        if a > m {
            surplus.push((a - m, Reverse(s)));
        }
        if b > m {
            deficit.push((b - m, Reverse(d)));
        }
    }
    (moved, moves)
}

/// The global batches of one epoch, each split among the nodes by
/// ownership and balanced. `owners[i]` is the node that holds sample `i`
/// (`< layout.num_nodes`; a larger value is treated as node 0, so that a
/// bad owner can cost locality but never drop a sample).
pub fn epoch_batches<'a>(
    owners: &'a [u32],
    layout: Layout,
    seed: u64,
    epoch: u64,
) -> impl Iterator<Item = BatchShares> + 'a {
    let perm = permutation(owners.len(), seed, epoch);
    let g = layout.global_batch();
    let target = layout.node_share();
    let p = layout.num_nodes;
    (0..layout.batches(owners.len())).map(move |k| {
        let mut per_node: Vec<Vec<u32>> = (0..p).map(|_| Vec::with_capacity(target)).collect();
        for &s in &perm[k * g..(k + 1) * g] {
            let o = owners[s as usize] as usize;
            per_node[if o < p { o } else { 0 }].push(s);
        }
        let largest_imbalance = per_node
            .iter()
            .map(|v| v.len().abs_diff(target))
            .max()
            .unwrap_or(0);
        let (moved, moves) = balance(&mut per_node, target);
        BatchShares {
            per_node,
            moved,
            moves,
            largest_imbalance,
        }
    })
}

/// What one learner trains on in one epoch: global rank `node *
/// local_world_size + local_rank` gets `per_node[node][local_rank * b ..
/// (local_rank + 1) * b]` of every batch, batch after batch.
pub fn rank_indices(
    owners: &[u32],
    layout: Layout,
    seed: u64,
    epoch: u64,
    node: usize,
    local_rank: usize,
) -> Vec<u32> {
    let b = layout.batch_size;
    let mut out = Vec::with_capacity(layout.batches(owners.len()) * b);
    for batch in epoch_batches(owners, layout, seed, epoch) {
        if let Some(share) = batch.per_node.get(node) {
            out.extend_from_slice(
                &share[(local_rank * b).min(share.len())..((local_rank + 1) * b).min(share.len())],
            );
        }
    }
    out
}

/// What `torch.utils.data.DistributedSampler(shuffle=True, drop_last=True)`
/// gives a rank, over this module's permutation (torch's own generator is
/// not reproduced): the first `n - n % world` samples of the permutation,
/// every `world`-th from `rank`. The baseline the simulator compares with.
pub fn distributed_indices(n: usize, world: usize, rank: usize, seed: u64, epoch: u64) -> Vec<u32> {
    distributed_split(&permutation(n, seed, epoch), world)
        .into_iter()
        .nth(rank)
        .unwrap_or_default()
}

/// [`distributed_indices`] of every rank at once, from the epoch's
/// permutation (one permutation for all ranks).
pub fn distributed_split(perm: &[u32], world: usize) -> Vec<Vec<u32>> {
    if world == 0 {
        return Vec::new();
    }
    let total = perm.len() - perm.len() % world;
    let mut out: Vec<Vec<u32>> = (0..world)
        .map(|_| Vec::with_capacity(total / world))
        .collect();
    for (i, &s) in perm[..total].iter().enumerate() {
        out[i % world].push(s);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn splitmix_matches_the_reference_values() {
        // The first outputs of splitmix64 seeded with 0 and 1234567, from the
        // reference implementation (Vigna, prng.di.unimi.it/splitmix64.c).
        let mut r = SplitMix64::for_epoch(0, 0);
        assert_eq!(r.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(r.next_u64(), 0x6E78_9E6A_A1B9_65F4);
        let mut r = SplitMix64::for_epoch(1_234_560, 7);
        assert_eq!(r.next_u64(), 6_457_827_717_110_365_317);
        assert_eq!(r.next_u64(), 3_203_168_211_198_807_973);
    }

    #[test]
    fn balancing_moves_the_last_samples_from_surplus_to_deficit() {
        let mut own = vec![vec![1, 2, 3, 4, 5], vec![6], vec![7, 8, 9]];
        let (moved, moves) = balance(&mut own, 3);
        assert_eq!((moved, moves), (2, 1));
        assert_eq!(own, vec![vec![1, 2, 3], vec![6, 4, 5], vec![7, 8, 9]]);
        // Largest first, ties to the smaller index.
        let mut own = vec![vec![], vec![1, 2, 3, 4], vec![], vec![5, 6, 7, 8]];
        let (moved, moves) = balance(&mut own, 2);
        assert_eq!((moved, moves), (4, 2));
        assert_eq!(own, vec![vec![3, 4], vec![1, 2], vec![7, 8], vec![5, 6]]);
    }

    proptest! {
        #[test]
        fn every_sample_once_equal_shares_at_most_p_minus_1_moves(
            n in 0usize..600,
            p in 1usize..6,
            l in 1usize..3,
            b in 1usize..6,
            seed in any::<u64>(),
            skew in 0u32..4,
        ) {
            let layout = Layout { num_nodes: p, local_world_size: l, batch_size: b };
            let mut rng = SplitMix64(seed ^ 0x5555);
            let owners: Vec<u32> = (0..n)
                .map(|_| {
                    let r = (rng.next_u64() % (p as u64 * (1 + skew as u64))) as u32;
                    r.min(p as u32 - 1)
                })
                .collect();
            let mut seen = vec![0u8; n];
            let mut total = 0;
            for batch in epoch_batches(&owners, layout, seed, 3) {
                prop_assert!(batch.moves < p.max(1));
                for share in &batch.per_node {
                    prop_assert_eq!(share.len(), layout.node_share());
                }
                let owned: usize = batch.per_node.iter().enumerate()
                    .map(|(q, s)| s.iter().filter(|&&i| owners[i as usize] as usize == q).count())
                    .sum();
                prop_assert_eq!(owned + batch.moved, layout.global_batch());
            }
            for q in 0..p {
                for r in 0..l {
                    for i in rank_indices(&owners, layout, seed, 3, q, r) {
                        seen[i as usize] += 1;
                        total += 1;
                    }
                }
            }
            prop_assert_eq!(total, layout.batches(n) * layout.global_batch());
            prop_assert!(seen.iter().all(|&c| c <= 1));
        }

        #[test]
        fn distributed_indices_cover_each_sample_at_most_once(n in 0usize..500, world in 1usize..9, seed in any::<u64>()) {
            let mut seen = vec![0u8; n];
            for r in 0..world {
                let idx = distributed_indices(n, world, r, seed, 0);
                prop_assert_eq!(idx.len(), n / world);
                for i in idx {
                    seen[i as usize] += 1;
                }
            }
            prop_assert_eq!(seen.iter().filter(|&&c| c == 1).count(), n - n % world);
        }
    }
}
