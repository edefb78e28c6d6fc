//! Network namespaces for multi-node tests and benches: one namespace per
//! node, each with an `eth0` veth whose other end is a port of a bridge in
//! one more namespace, so the nodes talk over real links that can be cut
//! (`link`) or shaped (`shape`, `tc tbf`). Only namespaces created here are
//! touched, and `Drop` deletes all of them (links and bridge go with them).
//!
//! Daemons are started with `nsenter --net=…` (not `ip netns exec`, which
//! also makes a private mount namespace and would hide their FUSE mounts).
//! Used by tests/peer_netns.rs and benches/peers.rs.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The /24 every lab uses (addresses are private to the lab's namespaces).
pub const SUBNET: [u8; 3] = [10, 213, 7];

static NEXT: AtomicUsize = AtomicUsize::new(0);

/// A set of node namespaces on one bridge.
pub struct Lab {
    bridge_ns: String,
    nodes: Vec<String>,
    created: Vec<String>,
}

fn ip(args: &[&str]) -> Result<(), String> {
    run("ip", args)
}

fn run(program: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{program} {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// What this machine lacks for a lab, if anything: root (network
/// namespaces), `ip` (iproute2), `nsenter` (util-linux) and the kernel's
/// network namespaces. Decided from the machine, before building one, so
/// that a lab that fails to build is a failure, not a skip.
pub fn netns_missing() -> Option<String> {
    if !rustix::process::geteuid().is_root() {
        return Some("network namespaces need root".into());
    }
    for (program, package) in [("ip", "iproute2"), ("nsenter", "util-linux")] {
        if super::which(program).is_none() {
            return Some(format!(
                "needs {program} on PATH (apt-get install {package})"
            ));
        }
    }
    if !Path::new("/proc/self/ns/net").exists() {
        return Some("this kernel has no network namespaces (/proc/self/ns/net)".into());
    }
    None
}

impl Lab {
    /// `n` node namespaces; node `i` has `eth0` = 10.213.7.(i+1)/24. An
    /// error says which step failed (tests check [`netns_missing`] first,
    /// so for them it is a failure); whatever was created is removed again.
    pub fn new(n: usize) -> Result<Lab, String> {
        if let Some(why) = netns_missing() {
            return Err(why);
        }
        // LOCAFS_NETNS_PREFIX names a run's namespaces (several people or
        // runs sharing a machine tell theirs apart by it).
        let prefix = std::env::var("LOCAFS_NETNS_PREFIX").unwrap_or_else(|_| "lcfs".into());
        let tag = format!(
            "{prefix}{}x{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let mut lab = Lab {
            bridge_ns: format!("{tag}br"),
            nodes: (0..n).map(|i| format!("{tag}n{i}")).collect(),
            created: Vec::new(),
        };
        lab.build()?;
        Ok(lab)
    }

    fn build(&mut self) -> Result<(), String> {
        let br = self.bridge_ns.clone();
        ip(&["netns", "add", &br])?;
        self.created.push(br.clone());
        ip(&["-n", &br, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &br, "link", "set", "br0", "up"])?;
        for (i, ns) in self.nodes.clone().iter().enumerate() {
            ip(&["netns", "add", ns])?;
            self.created.push(ns.clone());
            let port = format!("p{i}");
            ip(&[
                "-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", &port, "netns",
                &br,
            ])?;
            ip(&["-n", &br, "link", "set", &port, "master", "br0"])?;
            ip(&["-n", &br, "link", "set", &port, "up"])?;
            let cidr = format!("{}/24", self.addr(i));
            ip(&["-n", ns, "addr", "add", &cidr, "dev", "eth0"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
            ip(&["-n", ns, "link", "set", "eth0", "up"])?;
        }
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Node `i`'s address.
    pub fn addr(&self, i: usize) -> Ipv4Addr {
        Ipv4Addr::new(SUBNET[0], SUBNET[1], SUBNET[2], i as u8 + 1)
    }

    pub fn ns_name(&self, i: usize) -> &str {
        &self.nodes[i]
    }

    /// The namespace file to hand to `nsenter --net=`.
    pub fn ns_path(&self, i: usize) -> PathBuf {
        Path::new("/run/netns").join(&self.nodes[i])
    }

    /// Sets the MTU of every link (both veth ends and the bridge), e.g. 9000
    /// for a network with jumbo frames.
    pub fn set_mtu(&self, mtu: u32) -> Result<(), String> {
        let mtu = mtu.to_string();
        for (i, ns) in self.nodes.iter().enumerate() {
            ip(&["-n", ns, "link", "set", "eth0", "mtu", &mtu])?;
            ip(&[
                "-n",
                &self.bridge_ns,
                "link",
                "set",
                &format!("p{i}"),
                "mtu",
                &mtu,
            ])?;
        }
        ip(&["-n", &self.bridge_ns, "link", "set", "br0", "mtu", &mtu])
    }

    /// Cuts (`up == false`) or restores node `i`'s link, from inside its
    /// namespace, as a pulled cable would.
    pub fn link(&self, i: usize, up: bool) -> Result<(), String> {
        let state = if up { "up" } else { "down" };
        ip(&["-n", &self.nodes[i], "link", "set", "eth0", state])
    }

    /// Shapes every node's link to `rate` (e.g. "1gbit") both ways: a tbf
    /// on the node's `eth0` (what it sends) and on its bridge port (what it
    /// receives).
    pub fn shape(&self, rate: &str) -> Result<(), String> {
        for (i, ns) in self.nodes.iter().enumerate() {
            let port = format!("p{i}");
            for (ns, dev) in [
                (ns.as_str(), "eth0"),
                (self.bridge_ns.as_str(), port.as_str()),
            ] {
                run(
                    "tc",
                    &[
                        "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate, "burst",
                        "128kb", "latency", "50ms",
                    ],
                )?;
            }
        }
        Ok(())
    }

    /// A command that runs `program` in node `i`'s network namespace only
    /// (its mounts stay visible to everyone).
    pub fn command(&self, i: usize, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net={}", self.ns_path(i).display()))
            .arg("--")
            .arg(program);
        c
    }

    /// Runs `f` on a thread that has joined node `i`'s network namespace
    /// (sockets made there stay in it when handed back).
    pub fn in_ns<T: Send>(&self, i: usize, f: impl FnOnce() -> T + Send) -> Result<T, String> {
        let path = self.ns_path(i);
        std::thread::scope(|s| {
            s.spawn(move || {
                let file = std::fs::File::open(&path)
                    .map_err(|e| format!("open {}: {e}", path.display()))?;
                use std::os::fd::AsRawFd;
                // SAFETY: a valid namespace fd; setns only changes this thread.
                if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                    return Err(format!("setns: {}", std::io::Error::last_os_error()));
                }
                Ok(f())
            })
            .join()
            .map_err(|_| "thread in namespace panicked".to_string())?
        })
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for ns in self.created.drain(..).rev() {
            let _ = ip(&["netns", "del", &ns]);
            let file = Path::new("/run/netns").join(&ns);
            if file.exists() {
                let _ = locafs::sys::unmount(&file);
                let _ = std::fs::remove_file(&file);
            }
        }
    }
}
