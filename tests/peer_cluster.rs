//! The peer cache with real `locafs mount` processes talking QUIC over
//! loopback: each block leaves the source once per cluster; a node killed
//! mid-epoch, a node joining and a node leaving cost no failed read and no
//! wrong byte.

mod common;

use std::sync::mpsc;
use std::time::Duration;

use common::cluster::*;
use common::*;

fn opts<'a>(peers: &'a [u16], c: &'a Cluster) -> NodeOpts<'a> {
    NodeOpts {
        peers,
        secret: &c.secret,
        cache_size: "256M",
        peer_timeout: "4s",
    }
}

#[test]
fn epochs_on_three_nodes_read_each_block_from_the_source_once() {
    require_fuse!();
    let c = Cluster::new(90, 1_000, 300_000, 1);
    let ports = [free_udp_port(), free_udp_port(), free_udp_port()];
    let nodes: Vec<Node> = (0..3)
        .map(|i| Node::start(&c, &format!("n{i}"), ports[i], opts(&ports, &c)))
        .collect();
    for n in &nodes {
        n.wait_peers_up(&ports);
    }
    let refs: Vec<&Node> = nodes.iter().collect();
    for epoch in 0..3 {
        run_epoch(&c, &refs, epoch, 1);
    }
    let stats: Vec<_> = nodes.iter().map(|n| n.stats()).collect();
    let source: u64 = stats.iter().map(|s| s.source_bytes).sum();
    let served: u64 = stats.iter().map(|s| s.peer_served_bytes).sum();
    for (n, s) in nodes.iter().zip(&stats) {
        // Why a block could leave the source twice: a peer request that
        // failed (timeout, busy) falls back to the source.
        eprintln!(
            "{}: source {} peers {} served {} hit {}; peer failures {} refused {}, writes skipped {}",
            n.name,
            s.source_bytes,
            s.peer_bytes,
            s.peer_served_bytes,
            s.cache_hit_bytes,
            s.peer_failures,
            s.peer_refused_connections,
            s.cache_writes_skipped
        );
        if s.peer_refused_connections > 0 {
            for l in n
                .log_text()
                .lines()
                .filter(|l| l.contains("refused") || l.contains("down"))
            {
                eprintln!("  {l}");
            }
        }
        assert_eq!(s.read_errors, 0);
        assert_eq!(s.peer_bad_blocks, 0);
        assert!(s.peer_bytes > 0, "{} got nothing from its peers", n.name);
        assert!(s.peer_served_bytes > 0, "{} served nothing", n.name);
        for p in &s.peers {
            assert!(p.state == "up" || p.state == "self", "{p:?}");
        }
    }
    assert_eq!(
        source,
        c.total_bytes(),
        "bytes read from the source over 3 epochs on 3 nodes"
    );
    // What one node received, another served.
    let received: u64 = stats.iter().map(|s| s.peer_bytes).sum();
    assert_eq!(received, served);
}

#[test]
fn a_node_killed_mid_epoch_costs_no_failed_read_and_no_wrong_byte() {
    require_fuse!();
    let c = Cluster::new(60, 1_000, 300_000, 2);
    let ports = [free_udp_port(), free_udp_port(), free_udp_port()];
    let a = Node::start(&c, "a", ports[0], opts(&ports, &c));
    let b = Node::start(&c, "b", ports[1], opts(&ports, &c));
    let mut victim = Node::start(&c, "victim", ports[2], opts(&ports, &c));
    for n in [&a, &b, &victim] {
        n.wait_peers_up(&ports);
    }
    // Epoch 0 on all three: the victim now owns and holds a third of it.
    run_epoch(&c, &[&a, &b, &victim], 0, 2);
    assert!(victim.stats().peer_served_bytes > 0);
    // Epoch 1 on a and b; the victim dies when each has read a third of
    // its share: the readers wait for the kill there, then read the rest
    // (asking the victim for its blocks until they find it gone).
    let shares = shares(c.files.len(), 2, 1, 2);
    let (arrived, at_third) = mpsc::channel();
    std::thread::scope(|s| {
        let mut go = Vec::new();
        for (node, share) in [&a, &b].into_iter().zip(&shares) {
            let (c, arrived) = (&c, arrived.clone());
            let (tx, wait) = mpsc::channel::<()>();
            go.push(tx);
            s.spawn(move || {
                let third = share.len() / 3;
                assert!(third > 0 && share.len() - third > 0, "{share:?}");
                for (n, &i) in share.iter().enumerate() {
                    if n == third {
                        arrived.send(()).unwrap();
                        wait.recv().expect("the go after the kill");
                    }
                    let (rel, data) = &c.files[i];
                    node.read_check(rel, data);
                }
            });
        }
        // (A reader that failed before its third drops its sender: then
        // this fails rather than waits forever.)
        drop(arrived);
        for _ in 0..2 {
            at_third
                .recv_timeout(Duration::from_secs(120))
                .expect("both readers at a third of their share");
        }
        victim.kill();
        for tx in go {
            let _ = tx.send(());
        }
    });
    // The survivors found the victim gone by asking it for blocks they
    // needed: the kill landed while the epoch still needed it.
    let failures: Vec<u64> = [&a, &b].iter().map(|n| n.stats().peer_failures).collect();
    assert!(
        failures.iter().sum::<u64>() > 0,
        "no request of the rest of the epoch reached the victim: {failures:?}"
    );
    // And everything once more on each survivor, with the victim gone.
    for n in [&a, &b] {
        for (rel, data) in &c.files {
            n.read_check(rel, data);
        }
        let s = n.stats();
        assert_eq!(s.read_errors, 0, "{}", n.name);
        assert_eq!(s.peer_bad_blocks, 0);
        assert_eq!(
            n.peer_state(ports[2]).as_deref(),
            Some("down"),
            "{}",
            n.name
        );
        assert_eq!(s.source_errors, 0);
    }
}

#[test]
fn a_node_with_another_secret_gets_nothing() {
    require_fuse!();
    let c = Cluster::new(30, 1_000, 200_000, 3);
    let other = c.other_secret();
    let ports = [free_udp_port(), free_udp_port(), free_udp_port()];
    let a = Node::start(&c, "a", ports[0], opts(&ports, &c));
    let b = Node::start(&c, "b", ports[1], opts(&ports, &c));
    let stranger = Node::start(
        &c,
        "stranger",
        ports[2],
        NodeOpts {
            secret: &other,
            ..opts(&ports, &c)
        },
    );
    wait_pair_up_and_stranger_refused(&a, &b, &ports[..2]);
    for (rel, data) in &c.files {
        stranger.read_check(rel, data);
    }
    assert_stranger_got_nothing(&c, &stranger);
    for n in [&a, &b] {
        let s = n.stats();
        assert_eq!(s.peer_served_bytes, 0, "{} served the stranger", n.name);
        assert_eq!(n.peer_state(ports[2]).as_deref(), Some("down"));
        let p = s
            .peers
            .iter()
            .find(|p| p.address.ends_with(&ports[2].to_string()));
        assert_eq!(p.map(|p| p.bytes_sent), Some(0));
    }
}

#[test]
fn members_joining_and_leaving_move_ownership_without_errors() {
    require_fuse!();
    let c = Cluster::new(60, 1_000, 300_000, 4);
    let ports = [free_udp_port(), free_udp_port(), free_udp_port()];
    let a = Node::start(&c, "a", ports[0], opts(&ports, &c));
    let mut b = Node::start(&c, "b", ports[1], opts(&ports, &c));
    a.wait_peers_up(&ports[..2]);
    b.wait_peers_up(&ports[..2]);
    run_epoch(&c, &[&a, &b], 0, 4);
    let before = a.stats().source_bytes + b.stats().source_bytes;
    assert_eq!(before, c.total_bytes());

    // A third node joins: it is listed from the start and found when it
    // comes up; a third of the blocks move to it.
    let late = Node::start(&c, "late", ports[2], opts(&ports, &c));
    for n in [&a, &b, &late] {
        n.wait_peers_up(&ports);
    }
    run_epoch(&c, &[&a, &b, &late], 1, 4);
    let ls = late.stats();
    assert!(ls.peer_served_bytes > 0, "the new member owns nothing");
    assert!(ls.source_bytes > 0, "the new member read no block it owns");

    // b leaves cleanly: its blocks move to the others.
    b.stop();
    wait_until("a to see b down", Duration::from_secs(10), || {
        a.peer_state(ports[1]).as_deref() == Some("down")
    });
    run_epoch(&c, &[&a, &late], 2, 4);
    for (rel, data) in &c.files {
        a.read_check(rel, data);
        late.read_check(rel, data);
    }
    for n in [&a, &late] {
        let s = n.stats();
        assert_eq!(s.read_errors, 0, "{}", n.name);
        assert_eq!(s.peer_bad_blocks, 0, "{}", n.name);
    }
}
