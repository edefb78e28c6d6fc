//! Handing a live mount to a new holder: `locafs mount SRC MNT [options]`
//! (a newer binary, or new options) over a live locafs mount of the same
//! data set. The holder listens on a Unix socket in the abstract namespace
//! named after the data set's cache directory (no file in the cache
//! directory that another user could take first or that could be
//! replaced); each end checks the other's credentials (`SO_PEERCRED`): the
//! holder talks only to its own user or root, and the new `locafs mount`
//! only to a holder of its own user or root, so that a socket of that
//! name bound first by someone else gets neither a mount nor descriptors.
//! The new `locafs mount` connects, and:
//!
//! 1. the holder offers what cannot change on a live mount ([`Offer`]:
//!    the source, the cache directory, the block size, the open mode,
//!    the state's layout);
//! 2. the new one refuses (`REFUSE why`: it exits 2, the mount untouched)
//!    or takes (`TAKE`);
//! 3. the holder kills its server (what it held the kernel sends again to
//!    the next) and sends its descriptors over `SCM_RIGHTS`: the shared
//!    state, the data set's lock, the connection's descriptors;
//! 4. the new holder starts its own server with its own options and says
//!    `READY` once it serves; the old holder then exits without
//!    unmounting. If the new one goes away before, the old one serves
//!    again.
//!
//! A second `locafs mount` of the data set on another mountpoint
//! ([`super::attach`]) reads the same offer (which also names the holder's
//! mountpoint, its FUSE connection and its options: [`served`], [`tuning`])
//! and answers `ATTACH path` once it has bind-mounted it, or `REFUSE why`;
//! the holder serves on either way. `locafs cache ls` reads the offer only.
//!
//! The protocol is lines of text and one message with descriptors; the
//! compatibility checks ([`refusal`], [`attach_refusal`]) are pure.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::mount::config::{MountConfig, OpenMode};

/// The holder's socket: a name in the abstract namespace (shown with a
/// leading `@`) derived from the data set's cache directory.
pub fn socket_path(dataset_dir: &Path) -> PathBuf {
    let h = blake3::hash(dataset_dir.as_os_str().as_encoded_bytes()).to_hex();
    PathBuf::from(format!("@locafs-holder-{}", &h[..32]))
}

/// The abstract address of [`socket_path`]'s name.
fn address(name: &Path) -> io::Result<std::os::unix::net::SocketAddr> {
    use std::os::linux::net::SocketAddrExt;
    let name = name.as_os_str().as_encoded_bytes();
    let name = name.strip_prefix(b"@").unwrap_or(name);
    std::os::unix::net::SocketAddr::from_abstract_name(name)
}

/// Whether a socket of [`socket_path`]'s name listens (in this network
/// namespace), from /proc/net/unix: nothing is connected to it.
pub fn listening(name: &Path) -> bool {
    let want = name.as_os_str().as_encoded_bytes();
    std::fs::read("/proc/net/unix").is_ok_and(|t| {
        t.split(|b| *b == b'\n')
            .any(|l| l.split(|b| *b == b' ').next_back() == Some(want))
    })
}

/// How long a holder may take to offer its mount.
const OFFER_WAIT: Duration = Duration::from_secs(10);

/// Whether a peer of uid `uid` may be talked to: this user, or root.
fn trusted(uid: rustix::process::Uid) -> bool {
    uid == rustix::process::geteuid() || uid.is_root()
}

/// What cannot change on a live mount: the one list that both a takeover
/// ([`refusal`]) and a holder systemd starts with the state of the one
/// before ([`fixed_options`], [`stored_refusal`]) check.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Fixed {
    /// The shared state's layout (`shm::LAYOUT`).
    pub layout: u64,
    pub source: PathBuf,
    pub dataset_dir: PathBuf,
    pub block_size: u64,
    /// `passthrough` or `kernel`.
    pub open_mode: String,
    /// Whether the mount's holder allows passthrough (it can be turned
    /// off on a live mount, not on).
    pub passthrough: bool,
}

/// Why passthrough cannot be turned on.
const NO_PASSTHROUGH: &str =
    "the mount was made with --no-passthrough: passthrough cannot be turned on";

impl Fixed {
    /// Those of a mount made with `cfg`.
    pub fn of(cfg: &MountConfig) -> Fixed {
        Fixed {
            layout: crate::sys::shm::LAYOUT,
            source: cfg.source.clone(),
            dataset_dir: cfg.dataset_dir.clone(),
            block_size: cfg.block_size,
            open_mode: mode_name(cfg.open_mode).to_string(),
            passthrough: cfg.passthrough,
        }
    }

    /// The options that must stay equal: (what it is, its value compared,
    /// its value as shown).
    fn equal(&self) -> [(&'static str, String, String); 5] {
        let path = |p: &Path| p.display().to_string();
        [
            (
                "the state's layout",
                self.layout.to_string(),
                self.layout.to_string(),
            ),
            ("the source", path(&self.source), path(&self.source)),
            (
                "the cache (--cache-dir, --dataset-id)",
                path(&self.dataset_dir),
                path(&self.dataset_dir),
            ),
            (
                "--block-size",
                self.block_size.to_string(),
                crate::sys::units::format_size(self.block_size),
            ),
            (
                "--open-mode",
                self.open_mode.clone(),
                self.open_mode.clone(),
            ),
        ]
    }

    /// What differs between a live mount's (`self`) and `new`, where it
    /// cannot: one phrase each.
    fn differences(&self, new: &Fixed) -> Vec<String> {
        let mut why: Vec<String> = self
            .equal()
            .into_iter()
            .zip(new.equal())
            .filter(|(live, new)| live.1 != new.1)
            .map(|(live, new)| format!("{} is {}, not {}", live.0, live.2, new.2))
            .collect();
        if !self.passthrough && new.passthrough {
            why.push(NO_PASSTHROUGH.into());
        }
        why
    }

    /// A digest of [`Fixed::equal`]'s values, its lowest bit
    /// `passthrough`.
    fn digest(&self) -> u64 {
        let values: Vec<String> = self.equal().into_iter().map(|e| e.1).collect();
        let h = blake3::hash(values.join("\0").as_bytes());
        let d = u64::from_le_bytes(h.as_bytes()[..8].try_into().unwrap_or_default());
        (d & !1) | u64::from(self.passthrough)
    }
}

/// What a live mount is, as far as a takeover must keep it: offered by
/// the holder, checked by the one that would take over.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Offer {
    /// What cannot change.
    #[serde(flatten)]
    pub fixed: Fixed,
    pub version: String,
    /// What INIT settled (`shm::INIT_*`) and the kernel's FUSE minor.
    pub granted: u64,
    pub minor: u32,
    /// The holder's pid.
    pub pid: u32,
    /// The holder's mountpoint, and the number of its FUSE connection (the
    /// minor of the mount's device: every mountpoint of the data set is a
    /// mount of it, see [`super::attach`]). Absent from an older holder.
    #[serde(default)]
    pub mountpoint: Option<PathBuf>,
    #[serde(default)]
    pub connection: Option<u32>,
    /// What the mount serves, as [`served`] names it, and how its process
    /// is tuned ([`tuning`]): what a second mountpoint is checked against.
    #[serde(default)]
    pub served: Vec<(String, String)>,
    #[serde(default)]
    pub tuning: Vec<(String, String)>,
}

fn mode_name(m: OpenMode) -> &'static str {
    match m {
        OpenMode::Passthrough => "passthrough",
        OpenMode::Kernel => "kernel",
    }
}

impl Offer {
    /// The offer of a mount made with `cfg`.
    pub fn of(cfg: &MountConfig, granted: u64, minor: u32) -> Offer {
        Offer {
            fixed: Fixed::of(cfg),
            version: env!("CARGO_PKG_VERSION").to_string(),
            granted,
            minor,
            pid: std::process::id(),
            mountpoint: Some(cfg.mountpoint.clone()),
            connection: None,
            served: served(cfg),
            tuning: tuning(cfg),
        }
    }
}

/// What a mount made with `cfg` serves, option by option (name as the
/// command line spells it, value): a second mountpoint of the data set is
/// refused unless every one is the same ([`attach_refusal`]), since it is
/// served by the same process.
pub fn served(cfg: &MountConfig) -> Vec<(String, String)> {
    let secs = |d: std::time::Duration| format!("{}s", d.as_secs_f64());
    let mut v = vec![
        ("SOURCE".to_string(), cfg.source.display().to_string()),
        (
            "--cache-dir/--dataset-id".into(),
            cfg.dataset_dir.display().to_string(),
        ),
        (
            "--block-size".into(),
            crate::sys::units::format_size(cfg.block_size),
        ),
        (
            "--immutable".into(),
            if cfg.revalidate.is_none() {
                "on"
            } else {
                "off"
            }
            .into(),
        ),
        (
            "--revalidate".into(),
            cfg.revalidate.map_or("-".into(), secs),
        ),
        ("--open-mode".into(), mode_name(cfg.open_mode).into()),
        (
            "--no-passthrough".into(),
            if cfg.passthrough { "off" } else { "on" }.into(),
        ),
    ];
    if let Some(o) = &cfg.object {
        v.push(("--endpoint".into(), o.endpoint.clone().unwrap_or_default()));
        v.push(("--region".into(), o.region.clone().unwrap_or_default()));
    }
    let (listen, peers) = match &cfg.peer {
        Some(p) => (p.listen.to_string(), p.peers.join(",")),
        None => ("-".into(), "-".into()),
    };
    v.push(("--listen".into(), listen));
    v.push(("--peers".into(), peers));
    v
}

/// How the process serving a mount made with `cfg` is tuned: a second
/// mountpoint keeps the running process's values (said in one line).
pub fn tuning(cfg: &MountConfig) -> Vec<(String, String)> {
    let size = crate::sys::units::format_size;
    let secs = |d: std::time::Duration| format!("{}s", d.as_secs_f64());
    vec![
        (
            "--cache-size".into(),
            cfg.cache_size.map_or("-".into(), size),
        ),
        (
            "--cache-free-floor".into(),
            cfg.cache_free_floor.map_or("-".into(), |f| f.to_string()),
        ),
        ("--memory-cache".into(), size(cfg.memory_cache)),
        // (the budget: the write queue is a quarter of it)
        ("--prefetch-memory".into(), size(cfg.write_queue * 4)),
        ("--readahead-window".into(), size(cfg.readahead.max_window)),
        (
            "--no-readahead".into(),
            if cfg.readahead.sequential {
                "off"
            } else {
                "on"
            }
            .into(),
        ),
        ("--kernel-readahead".into(), size(cfg.kernel_readahead)),
        ("--fuse-threads".into(), cfg.fuse_threads.to_string()),
        ("--watchdog".into(), cfg.watchdog.map_or("0".into(), secs)),
        ("--source-timeout".into(), secs(cfg.source_timeout)),
        ("--metadata-timeout".into(), secs(cfg.metadata_timeout)),
        ("--log-format".into(), format!("{:?}", cfg.log_format)),
        (
            "--log-file".into(),
            cfg.log_file
                .as_ref()
                .map_or("-".into(), |p| p.display().to_string()),
        ),
        (
            "--metrics".into(),
            cfg.metrics.map_or("-".into(), |a| a.to_string()),
        ),
    ]
}

/// The options in which `mine` differs from `theirs` (the running mount's),
/// each as "NAME is THEIRS there, not MINE"; an option one side does not
/// name is not compared (an older holder's list).
fn differences(theirs: &[(String, String)], mine: &[(String, String)]) -> Vec<String> {
    mine.iter()
        .filter_map(|(name, v)| {
            let (_, t) = theirs.iter().find(|(n, _)| n == name)?;
            (t != v).then(|| format!("{name} is {t} there, not {v}"))
        })
        .collect()
}

/// Why `cfg` cannot be served as a second mountpoint of the mount offered
/// as `offer`: one line per option that differs in what is served; None
/// if it can.
pub fn attach_refusal(offer: &Offer, cfg: &MountConfig) -> Option<Vec<String>> {
    let mut why = Vec::new();
    if offer.served.is_empty() || offer.connection.is_none() {
        why.push(format!(
            "the running locafs ({}) does not tell its mount's options: take it over first (the same locafs mount over its mountpoint)",
            offer.version
        ));
    }
    why.extend(differences(&offer.served, &served(cfg)));
    (!why.is_empty()).then_some(why)
}

/// The process-tuning options in which `cfg` differs from the running
/// mount's (which stay).
pub fn tuning_kept(offer: &Offer, cfg: &MountConfig) -> Vec<String> {
    differences(&offer.tuning, &tuning(cfg))
}

/// The digest of what cannot change on a mount made with `cfg` ([`Fixed`]):
/// kept in the shared state, so that a holder systemd starts with the
/// state of the one before can tell whether its options fit the live
/// mount ([`stored_refusal`]).
pub fn fixed_options(cfg: &MountConfig) -> u64 {
    Fixed::of(cfg).digest()
}

/// Why a mount offered as `offer` cannot be taken over with `cfg`: the
/// options that cannot change on a live mount; None if it can.
pub fn refusal(offer: &Offer, cfg: &MountConfig) -> Option<String> {
    let mut why = offer.fixed.differences(&Fixed::of(cfg));
    if offer.fixed.layout != crate::sys::shm::LAYOUT {
        why.push(format!("(the holder runs locafs {})", offer.version));
    }
    (!why.is_empty()).then(|| why.join("; "))
}

/// Why a live mount whose shared state records `digest` ([`fixed_options`])
/// cannot be served with `cfg`, as [`refusal`] would say at a takeover
/// (without the values: the digest does not keep them); None if it can.
pub fn stored_refusal(digest: u64, cfg: &MountConfig) -> Option<String> {
    let new = Fixed::of(cfg);
    let mut why = Vec::new();
    if digest & !1 != new.digest() & !1 {
        let names: Vec<&str> = new.equal().iter().map(|e| e.0).collect();
        why.push(format!(
            "one of these differs from the mount's: {}",
            names.join(", ")
        ));
    }
    if digest & 1 == 0 && new.passthrough {
        why.push(NO_PASSTHROUGH.to_string());
    }
    (!why.is_empty()).then(|| why.join("; "))
}

/// The holder's end: a listening socket, owner-only.
pub struct Listener {
    sock: UnixListener,
}

impl Listener {
    /// Listens on the abstract socket `name` ([`socket_path`]); it goes
    /// away with the descriptor.
    pub fn bind(name: &Path) -> io::Result<Listener> {
        let sock = UnixListener::bind_addr(&address(name)?)?;
        sock.set_nonblocking(true)?;
        Ok(Listener { sock })
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }

    /// A connection waiting, if any, from a process of this user (or root);
    /// others are dropped.
    pub fn accept(&self) -> Option<UnixStream> {
        let (s, _) = self.sock.accept().ok()?;
        let cred = rustix::net::sockopt::socket_peercred(&s).ok()?;
        if !trusted(cred.uid) {
            tracing::warn!(
                "takeover socket: refused a connection from uid {}",
                cred.uid.as_raw()
            );
            return None;
        }
        s.set_nonblocking(false).ok()?;
        Some(s)
    }
}

/// One line (without its newline) from `r`, at most 64 KiB.
pub fn read_line(r: &mut impl Read) -> io::Result<String> {
    let mut out = Vec::new();
    let mut byte = [0u8; 1];
    loop {
        match r.read(&mut byte)? {
            0 => break,
            _ if byte[0] == b'\n' => break,
            _ => out.push(byte[0]),
        }
        if out.len() > 65536 {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "line too long"));
        }
    }
    if out.is_empty() {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "closed"));
    }
    String::from_utf8(out).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Sends `text` with the descriptors `fds`.
pub fn send_fds(s: &UnixStream, text: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(fds.len()))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::other("too many descriptors for one message"));
    }
    let iov = [io::IoSlice::new(text)];
    let n = rustix::net::sendmsg(s, &iov, &mut control, SendFlags::empty())?;
    if n != text.len() {
        return Err(io::Error::other("short send"));
    }
    Ok(())
}

/// Receives a message of text and at most `max` descriptors.
pub fn recv_fds(s: &UnixStream, max: usize) -> io::Result<(Vec<u8>, Vec<OwnedFd>)> {
    use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(max))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let mut buf = vec![0u8; 65536];
    let mut iov = [io::IoSliceMut::new(&mut buf)];
    let r = rustix::net::recvmsg(s, &mut iov, &mut control, RecvFlags::CMSG_CLOEXEC)?;
    let n = r.bytes;
    let mut fds = Vec::new();
    for msg in control.drain() {
        if let RecvAncillaryMessage::ScmRights(it) = msg {
            fds.extend(it);
        }
    }
    if n == 0 {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "closed"));
    }
    buf.truncate(n);
    Ok((buf, fds))
}

/// What the holder sends with its descriptors: how many of each, in the
/// order state, lock, FUSE descriptors.
#[derive(Debug, Serialize, Deserialize)]
pub struct Handover {
    pub fuse: usize,
    /// The pid of the server it stopped.
    pub server_pid: u32,
}

/// What a new holder gets from the old one.
pub struct Taken {
    pub offer: Offer,
    pub state: OwnedFd,
    pub lock: OwnedFd,
    pub fuse: Vec<OwnedFd>,
    pub handover: Handover,
    /// The connection to the old holder: `READY` goes there once a server
    /// of the new holder serves.
    pub stream: UnixStream,
}

/// Why a takeover did not happen.
#[derive(Debug)]
pub enum NotTaken {
    /// No holder answered at the socket (exit 2, with the reason).
    NoHolder(String),
    /// The options differ where they cannot (exit 2; the mount untouched).
    Refused(String),
    /// The exchange failed half-way (exit 1).
    Failed(String),
}

/// Connects to the holder listening at `socket` (checking that it is this
/// user's or root's) and reads its offer.
pub fn connect(socket: &Path) -> Result<(Offer, UnixStream), NotTaken> {
    let stream = address(socket)
        .and_then(|a| UnixStream::connect_addr(&a))
        .map_err(|e| NotTaken::NoHolder(format!("{}: {e}", socket.display())))?;
    // (a socket of this name bound by another user is no holder of ours)
    match rustix::net::sockopt::socket_peercred(&stream) {
        Ok(c) if trusted(c.uid) => {}
        Ok(c) => {
            return Err(NotTaken::NoHolder(format!(
                "{}: bound by uid {}, not by this user: not taken",
                socket.display(),
                c.uid.as_raw()
            )))
        }
        Err(e) => return Err(NotTaken::NoHolder(format!("{}: {e}", socket.display()))),
    }
    // A holder answers at once (it waits on its socket); one that does not
    // is stopped or hung: this command must not hang on it.
    let _ = stream.set_read_timeout(Some(OFFER_WAIT));
    let mut r = BufReader::new(&stream);
    let line = read_offer(&mut r).map_err(|e| {
        let why = if matches!(
            e.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
        ) {
            format!(
                "the holder does not answer within {} s (stopped or hung)",
                OFFER_WAIT.as_secs()
            )
        } else {
            e.to_string()
        };
        NotTaken::NoHolder(format!("{}: {why}", socket.display()))
    })?;
    let offer: Offer = serde_json::from_str(&line).map_err(|e| {
        NotTaken::NoHolder(format!("{}: not a locafs holder ({e})", socket.display()))
    })?;
    Ok((offer, stream))
}

/// Takes over the mount whose holder listens at `socket`, with `cfg`.
pub fn take(socket: &Path, cfg: &MountConfig) -> Result<Taken, NotTaken> {
    let (offer, stream) = connect(socket)?;
    if let Some(why) = refusal(&offer, cfg) {
        let _ = (&stream).write_all(format!("REFUSE {why}\n").as_bytes());
        return Err(NotTaken::Refused(why));
    }
    (&stream)
        .write_all(b"TAKE\n")
        .map_err(|e| NotTaken::Failed(format!("takeover: {e}")))?;
    // The holder stops its server first (at most a few seconds).
    let _ = stream.set_read_timeout(Some(Duration::from_secs(120)));
    let (text, mut fds) =
        recv_fds(&stream, 300).map_err(|e| NotTaken::Failed(format!("takeover: {e}")))?;
    let handover: Handover =
        serde_json::from_slice(&text).map_err(|e| NotTaken::Failed(format!("takeover: {e}")))?;
    if fds.len() != 2 + handover.fuse || handover.fuse == 0 {
        return Err(NotTaken::Failed(format!(
            "takeover: {} descriptors for {} FUSE ones",
            fds.len(),
            handover.fuse
        )));
    }
    let fuse = fds.split_off(2);
    let lock = fds.pop().expect("two");
    let state = fds.pop().expect("one");
    let _ = stream.set_read_timeout(None);
    Ok(Taken {
        offer,
        state,
        lock,
        fuse,
        handover,
        stream,
    })
}

fn read_offer(r: &mut BufReader<&UnixStream>) -> io::Result<String> {
    let mut line = String::new();
    r.read_line(&mut line)?;
    if line.is_empty() {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "closed"));
    }
    Ok(line.trim_end().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> MountConfig {
        use crate::mount::config::{MountFlags, MountRequest};
        let dir = tempfile::tempdir().unwrap();
        let (src, mnt) = (dir.path().join("src"), dir.path().join("mnt"));
        std::fs::create_dir(&src).unwrap();
        std::fs::create_dir(&mnt).unwrap();
        // `locafs mount SRC MNT --cache-dir CACHE`: every other option its default.
        let request = MountRequest {
            source: Some(src),
            mountpoint: Some(mnt),
            flags: MountFlags {
                cache_dir: Some(dir.path().join("cache")),
                ..MountFlags::default()
            },
            ..MountRequest::default()
        };
        let c = crate::mount::config::resolve(&request).unwrap();
        std::mem::forget(dir);
        c
    }

    #[test]
    fn only_options_a_live_mount_can_change_are_taken() {
        let c = cfg();
        let offer = Offer::of(&c, crate::sys::shm::INIT_PASSTHROUGH, 45);
        let mut new = c.clone();
        new.memory_cache *= 2;
        new.readahead.memory *= 2;
        new.fuse_threads = 3;
        new.cache_size = Some(1 << 40);
        new.passthrough = false;
        assert_eq!(refusal(&offer, &new), None);
        let mut bs = c.clone();
        bs.block_size = 4 << 20;
        let why = refusal(&offer, &bs).expect("refused");
        assert!(
            why.contains("--block-size is 1.0 MiB, not 4.0 MiB"),
            "{why}"
        );
        let mut other = c.clone();
        other.source = "/elsewhere".into();
        other.open_mode = OpenMode::Kernel;
        let why = refusal(&offer, &other).expect("refused");
        assert!(
            why.contains("the source is") && why.contains("--open-mode"),
            "{why}"
        );
        let mut old = offer.clone();
        old.fixed.layout += 1;
        assert!(refusal(&old, &c).unwrap().contains("layout"));
        let mut nopt = offer.clone();
        nopt.fixed.passthrough = false;
        assert!(refusal(&nopt, &c).unwrap().contains("--no-passthrough"));
    }

    #[test]
    fn a_restart_from_the_store_refuses_what_a_takeover_refuses() {
        let c = cfg();
        let mut nopt = c.clone();
        nopt.passthrough = false;
        let mut news = Vec::new();
        for live in [c.clone(), nopt.clone()] {
            let mut v = vec![live.clone(), nopt.clone()];
            let mut x = live.clone();
            x.passthrough = true;
            v.push(x);
            let mut x = live.clone();
            x.memory_cache *= 2;
            x.fuse_threads = 3;
            v.push(x);
            let mut x = live.clone();
            x.block_size = 4 << 20;
            v.push(x);
            let mut x = live.clone();
            x.source = "/elsewhere".into();
            v.push(x);
            let mut x = live.clone();
            x.dataset_dir = "/elsewhere/cache".into();
            v.push(x);
            let mut x = live.clone();
            x.open_mode = OpenMode::Kernel;
            v.push(x);
            news.push((live, v));
        }
        for (live, v) in news {
            let offer = Offer::of(&live, 0, 45);
            let digest = fixed_options(&live);
            for new in v {
                let (at_takeover, at_restart) =
                    (refusal(&offer, &new), stored_refusal(digest, &new));
                assert_eq!(
                    at_takeover.is_some(),
                    at_restart.is_some(),
                    "{at_takeover:?} / {at_restart:?}"
                );
                if let (Some(t), Some(r)) = (at_takeover, at_restart) {
                    assert_eq!(
                        t.contains("--no-passthrough"),
                        r.contains("--no-passthrough")
                    );
                }
            }
        }
        // Turning passthrough off is no change that needs a new mount.
        assert_eq!(stored_refusal(fixed_options(&c), &nopt), None);
    }

    #[test]
    fn a_second_mountpoint_must_serve_the_same_and_may_tune_otherwise() {
        let c = cfg();
        let mut offer = Offer::of(&c, 0, 45);
        offer.connection = Some(77);
        assert_eq!(attach_refusal(&offer, &c), None);
        let mut tuned = c.clone();
        tuned.fuse_threads = 3;
        tuned.cache_size = Some(1 << 40);
        assert_eq!(attach_refusal(&offer, &tuned), None);
        let kept = tuning_kept(&offer, &tuned);
        assert_eq!(kept.len(), 2, "{kept:?}");
        assert!(kept[1].starts_with("--fuse-threads is ") && kept[1].ends_with(", not 3"));
        let mut other = c.clone();
        other.block_size = 4 << 20;
        other.revalidate = None;
        other.passthrough = false;
        let why = attach_refusal(&offer, &other).expect("refused");
        assert_eq!(
            why,
            [
                "--block-size is 1.0 MiB there, not 4.0 MiB",
                "--immutable is off there, not on",
                "--revalidate is 60s there, not -",
                "--no-passthrough is off there, not on",
            ],
            "{why:?}"
        );
        // An older holder tells neither its connection nor its options.
        let mut old = offer.clone();
        (old.connection, old.served) = (None, Vec::new());
        let why = attach_refusal(&old, &c).expect("refused");
        assert!(why[0].contains("take it over first"), "{why:?}");
    }

    #[test]
    fn descriptors_and_text_cross_a_socket_together() {
        let (a, b) = UnixStream::pair().unwrap();
        let f = tempfile::tempfile().unwrap();
        let g = tempfile::tempfile().unwrap();
        send_fds(&a, b"{\"x\":1}", &[f.as_fd(), g.as_fd()]).unwrap();
        let (text, fds) = recv_fds(&b, 8).unwrap();
        assert_eq!(text, b"{\"x\":1}");
        assert_eq!(fds.len(), 2);
        let (sa, sb) = (
            rustix::fs::fstat(&f).unwrap(),
            rustix::fs::fstat(&fds[0]).unwrap(),
        );
        assert_eq!((sa.st_dev, sa.st_ino), (sb.st_dev, sb.st_ino));
        drop(a);
        assert!(recv_fds(&b, 8).is_err());
        let _ = read_line(&mut std::io::empty()).unwrap_err();
    }
}
