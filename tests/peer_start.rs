//! Each byte leaves the source once from the first second: nodes started
//! together whose loaders begin the moment their mounts return, before the
//! nodes have reached each other (real `locafs mount` processes, real QUIC
//! on loopback). Placement follows the configured `--peers` list from the
//! first request: read-ahead fetches only the blocks this node owns by that
//! list, and a read of a block whose owner is listed but not reached yet
//! waits for it (at most `--peer-timeout`) instead of reading the source.
//! A member that never comes costs a wait, never a failed read; a member
//! that was reached and then lost costs no wait at all. Everything is
//! asserted on counts (bytes from the source, waits), never on times.

mod common;

use std::sync::Barrier;
use std::time::Duration;

use common::cluster::*;
use common::*;

/// Reads `share` of the files through `node`, checking every byte.
fn read_share(c: &Cluster, node: &Node, share: &[usize]) {
    for &i in share {
        let (rel, data) = &c.files[i];
        node.read_check(rel, data);
    }
}

#[test]
fn nodes_started_together_read_each_block_from_the_source_once() {
    require_fuse!();
    // 3 nodes started at once, read-ahead on (the defaults), each loader
    // starting its share the moment its own mount answers: before the fix
    // the first node to mount owned every block until it reached the
    // others, and its read-ahead pulled them from the source (1.06-1.22x
    // measured at 3 nodes).
    let c = Cluster::new(150, 1_000, 300_000, 34);
    let ports = [free_udp_port(), free_udp_port(), free_udp_port()];
    let epochs = 2;
    let barrier = Barrier::new(ports.len());
    let nodes: Vec<Node> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..ports.len())
            .map(|i| {
                let (c, ports, barrier) = (&c, &ports, &barrier);
                s.spawn(move || {
                    let node = Node::start(
                        c,
                        &format!("n{i}"),
                        ports[i],
                        NodeOpts {
                            peers: ports,
                            secret: &c.secret,
                            cache_size: "256M",
                            peer_timeout: "4s",
                        },
                    );
                    for epoch in 0..epochs {
                        let share = &shares(c.files.len(), ports.len(), epoch, 34)[i];
                        read_share(c, &node, share);
                        // The next epoch starts on every node together, as
                        // a DistributedSampler's does.
                        barrier.wait();
                    }
                    node
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let stats: Vec<_> = nodes.iter().map(|n| n.stats()).collect();
    for (n, s) in nodes.iter().zip(&stats) {
        eprintln!(
            "{}: source {} B, from peers {} B, served {} B, waited for an unreached owner {} times \
             ({} met), unreached-owner blocks from the source {}, mesh formed {:?} s",
            n.name,
            s.source_bytes,
            s.peer_bytes,
            s.peer_served_bytes,
            s.peer_owner_waits,
            s.peer_owner_waits_met,
            s.peer_unreached_source_blocks,
            s.peer_mesh_formed_s
        );
    }
    let source: u64 = stats.iter().map(|s| s.source_bytes).sum();
    assert_eq!(
        source,
        c.total_bytes(),
        "bytes read from the source over {epochs} epochs by 3 nodes started together \
         (the data set is {} B)",
        c.total_bytes()
    );
    for (n, s) in nodes.iter().zip(&stats) {
        assert_eq!(s.read_errors, 0, "{}", n.name);
        assert_eq!(s.peer_bad_blocks, 0, "{}", n.name);
        assert!(
            s.peer_mesh_formed_s.is_some(),
            "{}: the mesh time is not shown",
            n.name
        );
        assert_eq!(s.peer_members_unreached, 0, "{}", n.name);
    }
}

#[test]
fn a_member_listed_but_never_up_costs_a_wait_and_no_failed_read() {
    require_fuse!();
    let c = Cluster::new(40, 1_000, 200_000, 35);
    // Three members listed; the third never starts.
    let ports = [free_udp_port(), free_udp_port(), free_udp_port()];
    let opts = || NodeOpts {
        peers: &ports,
        secret: &c.secret,
        cache_size: "256M",
        peer_timeout: "1s",
    };
    let a = Node::start(&c, "a", ports[0], opts());
    let b = Node::start(&c, "b", ports[1], opts());
    let missing = format!("127.0.0.1:{}", ports[2]);
    // Both read everything, at once, while the third is still expected.
    std::thread::scope(|s| {
        for n in [&a, &b] {
            let c = &c;
            s.spawn(move || {
                for (rel, data) in &c.files {
                    n.read_check(rel, data);
                }
            });
        }
    });
    let mut waited = 0;
    for n in [&a, &b] {
        let s = n.stats();
        eprintln!(
            "{}: source {} waits {} met {} unreached-owner blocks {} state of the missing one {:?}",
            n.name,
            s.source_bytes,
            s.peer_owner_waits,
            s.peer_owner_waits_met,
            s.peer_unreached_source_blocks,
            n.peer_state_of(&missing)
        );
        assert_eq!(s.read_errors, 0, "{}", n.name);
        assert_eq!(s.source_errors, 0, "{}", n.name);
        assert_eq!(s.peer_members_unreached, 1, "{}", n.name);
        assert!(s.peer_mesh_formed_s.is_none(), "{}", n.name);
        // Each wait ended with the owner up (b, for a read of a that began
        // before b had started) or with a read of the source.
        assert_eq!(
            s.peer_owner_waits,
            s.peer_owner_waits_met + s.peer_unreached_source_blocks,
            "{}",
            n.name
        );
        waited += s.peer_unreached_source_blocks;
    }
    assert!(
        waited > 0,
        "no read of a block owned by the member that never came waited for it"
    );
    // Past the join window the member is down: its blocks go to the next
    // members, and reads no longer wait for it.
    wait_until(
        "the missing member to be given up",
        Duration::from_secs(60),
        || {
            a.peer_state_of(&missing).as_deref() == Some("down")
                && b.peer_state_of(&missing).as_deref() == Some("down")
        },
    );
    let before: Vec<u64> = [&a, &b]
        .iter()
        .map(|n| n.stats().peer_owner_waits)
        .collect();
    for n in [&a, &b] {
        for (rel, data) in c.files.iter().rev() {
            n.read_check(rel, data);
        }
    }
    for (n, w) in [&a, &b].iter().zip(before) {
        let s = n.stats();
        assert_eq!(s.read_errors, 0, "{}", n.name);
        assert_eq!(
            s.peer_owner_waits, w,
            "{} waited for a member given up",
            n.name
        );
    }
}

#[test]
fn a_member_lost_after_being_reached_costs_no_wait() {
    require_fuse!();
    let c = Cluster::new(40, 1_000, 200_000, 36);
    let ports = [free_udp_port(), free_udp_port(), free_udp_port()];
    let opts = |_: usize| NodeOpts {
        peers: &ports,
        secret: &c.secret,
        cache_size: "256M",
        peer_timeout: "1s",
    };
    // a also exports metrics: the mesh's figures are there too.
    let metrics = format!("127.0.0.1:{}", free_tcp_port());
    let a = Node::start_spec_with(
        &c,
        "a",
        NodeSpec {
            listen: format!("127.0.0.1:{}", ports[0]),
            peers: ports.iter().map(|p| format!("127.0.0.1:{p}")).collect(),
            secret: &c.secret,
            cache_size: "256M",
            peer_timeout: "1s",
            netns: None,
        },
        &["--metrics", &metrics],
    );
    let b = Node::start(&c, "b", ports[1], opts(1));
    let mut lost = Node::start(&c, "lost", ports[2], opts(2));
    for n in [&a, &b, &lost] {
        n.wait_peers_up(&ports);
    }
    lost.kill();
    let gone = format!("127.0.0.1:{}", ports[2]);
    wait_until(
        "a and b to see the lost member down",
        Duration::from_secs(30),
        || {
            a.peer_state_of(&gone).as_deref() == Some("down")
                && b.peer_state_of(&gone).as_deref() == Some("down")
        },
    );
    std::thread::scope(|s| {
        for n in [&a, &b] {
            let c = &c;
            s.spawn(move || {
                for (rel, data) in &c.files {
                    n.read_check(rel, data);
                }
            });
        }
    });
    let mut source = 0;
    for n in [&a, &b] {
        let s = n.stats();
        assert_eq!(s.read_errors, 0, "{}", n.name);
        // A member once reached and then lost is not waited for: its
        // blocks went to the next member in line at once.
        assert_eq!(s.peer_owner_waits, 0, "{}", n.name);
        assert_eq!(s.peer_unreached_source_blocks, 0, "{}", n.name);
        assert!(s.peer_mesh_formed_s.is_some(), "{}", n.name);
        source += s.source_bytes;
    }
    // With the lost member's blocks owned by a or b, each block left the
    // source once.
    assert_eq!(source, c.total_bytes());
    // The exporter mirrors the mesh's part of stats (copied twice a second).
    let formed = a.stats().peer_mesh_formed_s.unwrap();
    wait_until(
        "the mesh figures in the metrics",
        Duration::from_secs(10),
        || {
            let (samples, _, _) = common::prom::scrape(&metrics);
            let v = |n: &str| common::prom::value(&samples, n, &[]);
            v("locafs_peer_mesh_formed_seconds").is_some_and(|s| (s - formed).abs() < 1e-6)
                && v("locafs_peer_owner_waits_total") == Some(0.0)
                && v("locafs_peer_unreached_source_blocks_total") == Some(0.0)
                && v("locafs_peer_members_unreached") == Some(0.0)
        },
    );
}
