//! The peer cache over real links: three `locafs mount` processes, each in
//! its own network namespace with a veth to a bridge (tests/common/
//! netns.rs), each listening on its own address. Each block leaves the
//! source once across the nodes; a link cut in the middle of an epoch costs
//! the other nodes no failed read and no wrong byte and shows that peer down
//! on each of them; the link restored, the node rejoins.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Barrier;
use std::time::Duration;

use common::cluster::*;
use common::netns::Lab;
use common::*;

const PORT: u16 = 7070;

/// A lab of `n` namespaces, or None (SKIPPED) if the machine lacks what
/// one needs. Decided from the machine first: a lab that then fails to
/// build fails the test.
fn lab(n: usize) -> Option<Lab> {
    if let Some(why) = fuse_missing().or_else(common::netns::netns_missing) {
        skipped(module_path!(), &why);
        return None;
    }
    Some(Lab::new(n).unwrap_or_else(|e| panic!("the namespace lab could not be built: {e}")))
}

/// Starts node `i` of `lab` on its namespace address, naming the others.
/// (A generous peer timeout where the test counts source bytes: on a loaded
/// 2-core machine a 1 s timeout can send a block to the source twice.)
fn start(c: &Cluster, lab: &Lab, i: usize, name: &str, peer_timeout: &str) -> Node {
    let peers: Vec<String> = (0..lab.len())
        .map(|j| format!("{}:{PORT}", lab.addr(j)))
        .collect();
    Node::start_spec(
        c,
        name,
        NodeSpec {
            listen: format!("{}:{PORT}", lab.addr(i)),
            peers,
            secret: &c.secret,
            cache_size: "256M",
            peer_timeout,
            netns: Some(lab.ns_path(i)),
        },
    )
}

fn all_addrs(lab: &Lab) -> Vec<String> {
    (0..lab.len())
        .map(|j| format!("{}:{PORT}", lab.addr(j)))
        .collect()
}

#[test]
fn epochs_over_veth_links_read_each_block_from_the_source_once() {
    let Some(lab) = lab(3) else {
        return;
    };
    let c = Cluster::new(90, 1_000, 300_000, 21);
    let nodes: Vec<Node> = (0..3)
        .map(|i| start(&c, &lab, i, &format!("n{i}"), "3s"))
        .collect();
    let addrs = all_addrs(&lab);
    for n in &nodes {
        n.wait_peers_in_state(&addrs, &["up", "self"], Duration::from_secs(20));
    }
    let refs: Vec<&Node> = nodes.iter().collect();
    for epoch in 0..3 {
        run_epoch(&c, &refs, epoch, 21);
    }
    let stats: Vec<_> = nodes.iter().map(|n| n.stats()).collect();
    for (n, s) in nodes.iter().zip(&stats) {
        eprintln!(
            "{} ({}): source {} from peers {} served {} hit {} peer failures {}",
            n.name,
            n.addr,
            s.source_bytes,
            s.peer_bytes,
            s.peer_served_bytes,
            s.cache_hit_bytes,
            s.peer_failures
        );
        assert_eq!(s.read_errors, 0, "{}", n.name);
        assert_eq!(s.peer_bad_blocks, 0, "{}", n.name);
        assert!(s.peer_bytes > 0, "{} got nothing from its peers", n.name);
        assert!(s.peer_served_bytes > 0, "{} served nothing", n.name);
        // The members are the namespace addresses, all up.
        let mut seen: Vec<&str> = s.peers.iter().map(|p| p.address.as_str()).collect();
        seen.sort();
        assert_eq!(seen, addrs.iter().map(String::as_str).collect::<Vec<_>>());
        for p in &s.peers {
            assert!(p.state == "up" || p.state == "self", "{p:?}");
        }
    }
    let source: u64 = stats.iter().map(|s| s.source_bytes).sum();
    if source != c.total_bytes() {
        for n in &nodes {
            let log = n.log_text();
            let lines: Vec<&str> = log
                .lines()
                .filter(|l| l.contains("WARN") || l.contains("peer request failed"))
                .take(20)
                .collect();
            eprintln!("{} log:\n{}", n.name, lines.join("\n"));
        }
    }
    assert_eq!(
        source,
        c.total_bytes(),
        "bytes read from the source over 3 epochs on 3 nodes"
    );
    let received: u64 = stats.iter().map(|s| s.peer_bytes).sum();
    let served: u64 = stats.iter().map(|s| s.peer_served_bytes).sum();
    assert_eq!(received, served);
}

#[test]
fn a_link_cut_mid_epoch_costs_no_failed_read_and_the_node_rejoins() {
    let Some(lab) = lab(3) else {
        return;
    };
    let c = Cluster::new(60, 1_000, 300_000, 22);
    let a = start(&c, &lab, 0, "a", "1s");
    let b = start(&c, &lab, 1, "b", "1s");
    let victim = start(&c, &lab, 2, "victim", "1s");
    let addrs = all_addrs(&lab);
    for n in [&a, &b, &victim] {
        n.wait_peers_in_state(&addrs, &["up", "self"], Duration::from_secs(20));
    }
    // Epoch 0 on all three: the victim owns and holds a third of it.
    run_epoch(&c, &[&a, &b, &victim], 0, 22);
    let served_before = victim.stats().peer_served_bytes;
    assert!(served_before > 0, "the victim served nothing in epoch 0");

    // Epoch 1 on a and b; the victim's cable is pulled once both have read
    // a few files (they wait for it there), so the rest of the epoch runs
    // into the cut.
    let shares = shares(c.files.len(), 2, 1, 22);
    let (before_cut, after_cut) = (Barrier::new(3), Barrier::new(3));
    let done = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for (node, share) in [&a, &b].into_iter().zip(&shares) {
            let (c, done) = (&c, &done);
            let (before_cut, after_cut) = (&before_cut, &after_cut);
            s.spawn(move || {
                for (k, &i) in share.iter().enumerate() {
                    if k == 4 {
                        before_cut.wait();
                        after_cut.wait();
                    }
                    let (rel, data) = &c.files[i];
                    node.read_check(rel, data);
                    done.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        before_cut.wait();
        lab.link(2, false).expect("cut the victim's link");
        after_cut.wait();
    });
    assert_eq!(done.load(Ordering::Relaxed), c.files.len());
    // Everything once more on each survivor, with the victim unreachable.
    let victim_addr = &addrs[2];
    for n in [&a, &b] {
        for (rel, data) in &c.files {
            n.read_check(rel, data);
        }
        n.wait_peers_in_state(
            std::slice::from_ref(victim_addr),
            &["down"],
            Duration::from_secs(10),
        );
        let s = n.stats();
        eprintln!(
            "{} after the cut: source {} from peers {} failures {}",
            n.name, s.source_bytes, s.peer_bytes, s.peer_failures
        );
        assert_eq!(s.read_errors, 0, "{}", n.name);
        assert_eq!(s.source_errors, 0, "{}", n.name);
        assert_eq!(s.peer_bad_blocks, 0, "{}", n.name);
    }
    // The victim, cut off, sees both others down.
    victim.wait_peers_in_state(&addrs[..2], &["down"], Duration::from_secs(10));

    // The cable back: it rejoins, and is used again.
    lab.link(2, true).expect("restore the victim's link");
    for n in [&a, &b, &victim] {
        n.wait_peers_in_state(&addrs, &["up", "self"], Duration::from_secs(20));
    }
    let got_before = victim.stats().peer_bytes;
    run_epoch(&c, &[&a, &b, &victim], 2, 22);
    for n in [&a, &b, &victim] {
        let s = n.stats();
        assert_eq!(s.read_errors, 0, "{}", n.name);
        assert_eq!(s.peer_bad_blocks, 0, "{}", n.name);
        for p in &s.peers {
            assert!(p.state == "up" || p.state == "self", "{}: {p:?}", n.name);
        }
    }
    assert!(
        victim.stats().peer_bytes > got_before,
        "the rejoined node got nothing from its peers"
    );
}
