//! A node of the peer cache whose serving process dies: its holder starts
//! another, which listens again on the same port, so the node is down for
//! its peers for that moment only; a peer reading meanwhile falls back to
//! the source (no failed read, no wrong byte), and afterwards the node
//! serves its cached blocks to peers again. Its cache, budget booking and
//! control socket carry on.

mod common;

use std::time::Duration;

use common::cluster::*;
use common::restart::{kill_server, wait_new_server};
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
fn a_node_whose_server_restarts_rejoins_and_serves_its_peers_again() {
    require_fuse!();
    let c = Cluster::new(60, 1_000, 300_000, 3);
    let ports = [free_udp_port(), free_udp_port(), free_udp_port()];
    let a = Node::start(&c, "a", ports[0], opts(&ports, &c));
    let b = Node::start(&c, "b", ports[1], opts(&ports, &c));
    for n in [&a, &b] {
        n.wait_peers_in_state(
            &[a.addr.clone(), b.addr.clone()],
            &["up", "self"],
            Duration::from_secs(30),
        );
    }
    // Epoch 0 on a and b: b owns and holds about half of the data set.
    run_epoch(&c, &[&a, &b], 0, 3);
    let cached = b.stats().files_cached;
    assert!(cached > 0);
    // b's server dies while a reads every file (asking b for b's blocks).
    std::thread::scope(|s| {
        s.spawn(|| {
            for (rel, data) in &c.files {
                a.read_check(rel, data);
            }
        });
        std::thread::sleep(Duration::from_millis(30));
        let old = kill_server(&b.mountpoint);
        wait_new_server(&b.mountpoint, old, Duration::from_secs(60));
    });
    let sa = a.stats();
    assert_eq!(sa.read_errors, 0);
    assert_eq!(sa.peer_bad_blocks, 0);
    // b is up again for a, with its cache: what it held is still there.
    a.wait_peers_in_state(
        std::slice::from_ref(&b.addr),
        &["up"],
        Duration::from_secs(60),
    );
    let sb = b.stats();
    assert_eq!(sb.process.restarts, 1);
    assert!(
        sb.files_cached >= cached,
        "{} files cached before, {} after",
        cached,
        sb.files_cached
    );
    // A new node reads everything: b serves it the blocks it owns.
    let n = Node::start(&c, "n", ports[2], opts(&ports, &c));
    n.wait_peers_up(&ports);
    for (rel, data) in &c.files {
        n.read_check(rel, data);
    }
    let (sb, sn) = (b.stats(), n.stats());
    assert!(
        sb.peer_served_bytes > 0,
        "the restarted server served nothing to its peers"
    );
    assert_eq!(sn.read_errors, 0);
    assert_eq!(sn.peer_bad_blocks, 0);
    // b's control socket answers again (`locafs where` asks it).
    let out = run_locafs(&["where".as_ref(), b.mountpoint.as_os_str()]);
    assert!(
        out.status.success(),
        "locafs where after the restart: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
