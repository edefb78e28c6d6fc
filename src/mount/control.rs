//! The control channel of a running mount: a Unix socket in the abstract
//! namespace (`@locafs-<pid>-<random>`; the name is the `user.locafs.control`
//! extended attribute of the mount root, so nothing is added to the tree).
//! One JSON request per line, one JSON answer per line. Used by `locafs
//! warm`, `locafs plan` and `locafs where` (and the Python package,
//! packaging/python).
//!
//! Who may ask what is decided per connection from the kernel's word on the
//! caller (`SO_PEERCRED`, `SO_PEERGROUPS`), before any request is read:
//! the user running the daemon and root may ask anything; when the daemon
//! runs as root, another local user who may read the mount root (checked
//! by the kernel, on a thread that is that user: `sys::as_user`) may ask
//! `where` and `plan`, and only about the files they could reach through
//! the mount (a path whose directory they may not search is "not found",
//! a listing shows only what they could list); `warm`, which makes the
//! mount fetch and keep data, stays the owner's. Everyone else gets one
//! error answer saying why, and the connection is closed without a byte of
//! their request read. A reader's request is bounded lower than the
//! owner's ([`READER_MAX_REQUEST`]), and at most [`CONNECTIONS`] are served
//! at once (one more is answered "busy"). Why an abstract socket rather than a file: no
//! path to create (so no instant after `bind` in which a permissive umask
//! lets others in, no stale file after a crash, no length limit and no
//! fallback name in /tmp that another user could take first), and since
//! access is decided by credentials, not file modes, there is nothing a
//! file would add; the name is random, so nobody can take it before the
//! daemon does. It is reachable only from the daemon's network namespace
//! (a pod's containers share one).
//!
//! A malformed request gets an error answer; it never stops the server. An
//! `accept` that fails (out of descriptors) is retried after a pause, not
//! in a loop.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tracing::warn;

use crate::peer::locate::Asked;
use crate::peer::PeerNode;
use crate::read::prefetch::ReadAhead;

use crate::fs::CONTROL_XATTR;
/// Read buffer of each end of a connection.
const IO_BUFFER: usize = 1 << 20;
/// Longest request line, and longest `where` payload, of the owner (a plan
/// of a few million paths fits).
const MAX_LINE: usize = 256 << 20;
/// The same bound for a reader (another local user, `where` and `plan`
/// only): a plan or a `where` of a million paths of 60 bytes (the JSON of
/// a plan, or the NUL-separated payload of a `where`) fits; a larger data
/// set is asked about in parts. It bounds what one reader's connection
/// makes the daemon hold (root's daemon: the reader is not trusted with
/// 256 MiB per connection).
const READER_MAX_REQUEST: usize = 64 << 20;
/// Control connections served at once (each holds a 1 MiB read buffer and
/// up to a request); one more is answered "busy" and closed.
const CONNECTIONS: usize = 64;

/// A request on the control socket.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Cache every block of one file (path relative to the mount root).
    Warm { path: PathBuf },
    /// The loader's order for this epoch (paths relative to the mount root).
    Plan { paths: Vec<PathBuf> },
    /// Which node owns each file and whether it is cached here
    /// (docs/locality.md): for `paths`, or without them for the whole data
    /// set in listing order (the answer then has `paths`).
    Where {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        paths: Option<Vec<PathBuf>>,
        /// The paths as one string, separated by NUL characters (compact
        /// for millions of files; used instead of `paths`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        joined: Option<String>,
        /// The paths follow the request line as this many raw bytes,
        /// separated by NUL bytes (no JSON escaping to pay for, and names
        /// need not be UTF-8; used instead of `paths` and `joined`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        payload: Option<u64>,
        /// Answer in the packed form: `owners_packed`, `cached_packed` and
        /// `paths_joined` instead of `owners`, `cached` and `paths`.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        packed: bool,
    },
}

/// The answer to a request.
#[derive(Debug, Serialize, Deserialize, Default)]
pub struct Response {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The caller may not ask this (`error` says why).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub refused: bool,
    /// `warm`: bytes of the file now cached, and bytes that did not fit
    /// (absent from other answers).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cached_bytes: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub missing_bytes: u64,
    #[serde(default)]
    pub files: u64,
    #[serde(default)]
    pub unknown: u64,
    /// `where`: this node's index (None: not found in its own --peers list
    /// yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_index: Option<u32>,
    /// `where`: the number of nodes (1 without peers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_nodes: Option<u32>,
    /// `where`: member ids by node index (empty without peers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub members: Option<Vec<String>>,
    /// `where` without paths: the data set's files in listing order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paths: Option<Vec<String>>,
    /// `where`: the owner of each file (null: not a file of the data set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owners: Option<Vec<Option<u32>>>,
    /// `where`: whether each file is fully cached on this node now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached: Option<Vec<bool>>,
    /// `where`, packed: the owners as base64 of one little-endian u32 per
    /// file ([`NOT_FOUND`] for a path that is not a file of the data set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owners_packed: Option<String>,
    /// `where`, packed: base64 of one byte per file, 1 if cached here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_packed: Option<String>,
    /// `where` without paths, packed: the data set's files in listing
    /// order, separated by NUL characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paths_joined: Option<String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A packed owner that is not a file of the data set.
pub const NOT_FOUND: u32 = u32::MAX;

impl Response {
    /// The owners of a `where` answer in either form (None: not a file).
    pub fn where_owners(&self) -> Result<Vec<Option<u32>>, String> {
        if let Some(o) = &self.owners {
            return Ok(o.clone());
        }
        let raw = unbase64(self.owners_packed.as_deref().unwrap_or(""))?;
        Ok(raw
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .map(|o| (o != NOT_FOUND).then_some(o))
            .collect())
    }

    /// The cached flags of a `where` answer in either form.
    pub fn where_cached(&self) -> Result<Vec<bool>, String> {
        if let Some(c) = &self.cached {
            return Ok(c.clone());
        }
        let raw = unbase64(self.cached_packed.as_deref().unwrap_or(""))?;
        Ok(raw.iter().map(|b| *b != 0).collect())
    }
}

fn unbase64(s: &str) -> Result<Vec<u8>, String> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .map_err(|e| format!("bad packed answer: {e}"))
}

fn base64(b: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(b)
}

/// Who a connection is, as the kernel recorded it when it connected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

/// What a connection may ask.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// The user running the daemon, or root: everything.
    Owner,
    /// A local user who may read the mount root (the daemon runs as root):
    /// `where` and `plan`, for the files they could reach.
    Reader(Caller),
    /// Nothing: every request is answered with this.
    Refused(String),
}

/// The role of `caller` at a mount owned by `owner` whose root is `root`:
/// `may_read_root` asks the kernel whether the caller may read it (only
/// asked when it decides).
pub fn role_of(
    caller: &Caller,
    owner: u32,
    root: &Path,
    may_read_root: impl FnOnce() -> bool,
) -> Role {
    if caller.uid == owner || caller.uid == 0 {
        return Role::Owner;
    }
    if owner != 0 {
        return Role::Refused(format!(
            "refused: this mount belongs to uid {owner}, and only that user and root may use \
             its control socket (you are uid {})",
            caller.uid
        ));
    }
    if may_read_root() {
        return Role::Reader(caller.clone());
    }
    Role::Refused(format!(
        "refused: uid {} may not read the mount root {} (where, plan and stats are for users \
         who may read it)",
        caller.uid,
        root.display()
    ))
}

/// Who is at the other end of `stream`, as the kernel recorded it.
fn caller_of(stream: &tokio::net::UnixStream) -> std::io::Result<Caller> {
    use std::os::fd::AsFd;
    let c = stream.peer_cred()?;
    Ok(Caller {
        uid: c.uid(),
        gid: c.gid(),
        groups: crate::sys::peer_groups(stream.as_fd())?,
    })
}

/// The role of `caller` at this daemon's mount (see [`role_of`]); it may
/// wait on the mount (a thread that is the caller opens its root).
fn role_of_caller(caller: &Caller, root: &Path) -> Role {
    let owner = rustix::process::geteuid().as_raw();
    role_of(caller, owner, root, || {
        let root = root.to_owned();
        crate::sys::as_user(caller.uid, caller.gid, caller.groups.clone(), move || {
            // Open for reading: what `ls` of the root needs.
            std::fs::File::open(&root).is_ok()
        })
        .unwrap_or(false)
    })
}

/// Which of `paths` (relative to the mount `root`) `caller` could reach
/// through the mount: every directory on the way searchable by them, or,
/// with `listed`, readable and searchable (they could find the file by
/// listing). Asked of the kernel as that user, once per directory.
fn reachable(root: &Path, caller: &Caller, paths: &[&[u8]], listed: bool) -> Vec<bool> {
    use std::collections::HashMap;
    use std::os::unix::ffi::OsStrExt;
    // Each path's directory; a path that leaves the tree is unreachable.
    let dir_of = |p: &[u8]| -> Option<PathBuf> {
        let rel = Path::new(std::ffi::OsStr::from_bytes(p));
        if rel.is_absolute()
            || rel
                .components()
                .any(|c| !matches!(c, std::path::Component::Normal(_)))
        {
            return None;
        }
        Some(rel.parent().unwrap_or(Path::new("")).to_owned())
    };
    let dirs_of_paths: Vec<Option<PathBuf>> = paths.iter().map(|p| dir_of(p)).collect();
    let mut dirs: Vec<PathBuf> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for d in dirs_of_paths.iter().flatten() {
        // With `listed`, every ancestor is checked too.
        let mut cur = Some(d.as_path());
        while let Some(c) = cur {
            if !seen.insert(c.to_owned()) {
                break;
            }
            dirs.push(c.to_owned());
            if !listed {
                break;
            }
            cur = c.parent();
        }
    }
    let (root_owned, want) = (root.to_owned(), dirs.clone());
    let ok: Vec<bool> =
        crate::sys::as_user(caller.uid, caller.gid, caller.groups.clone(), move || {
            want.iter()
                .map(|d| {
                    let p = root_owned.join(d);
                    // Searchable: its "." can be looked up; readable: it opens.
                    std::fs::symlink_metadata(p.join(".")).is_ok()
                        && (!listed || std::fs::File::open(&p).is_ok())
                })
                .collect()
        })
        .unwrap_or_else(|_| vec![false; dirs.len()]);
    let ok: HashMap<&Path, bool> = dirs.iter().map(|d| d.as_path()).zip(ok).collect();
    dirs_of_paths
        .iter()
        .map(|d| match d {
            None => false,
            Some(d) if !listed => ok.get(d.as_path()).copied().unwrap_or(false),
            Some(d) => {
                let mut cur = Some(d.as_path());
                while let Some(c) = cur {
                    if !ok.get(c).copied().unwrap_or(false) {
                        return false;
                    }
                    cur = c.parent();
                }
                true
            }
        })
        .collect()
}

/// Pause after an `accept` that failed (out of descriptors, out of memory):
/// the listener is tried again after it, so that a full descriptor table
/// costs a wake-up every 100 ms, not a core.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// A fresh name for a control socket in the abstract namespace (without
/// its leading NUL): random, so that nobody can take it first.
fn socket_name() -> String {
    let r: u128 = rand::random();
    format!("locafs-{}-{r:032x}", std::process::id())
}

/// The address of a control socket from the `user.locafs.control` value:
/// `@name` is in the abstract namespace; anything else a path (a mount of
/// an older locafs).
fn address(value: &str) -> std::io::Result<std::os::unix::net::SocketAddr> {
    match value.strip_prefix('@') {
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
        }
        None => std::os::unix::net::SocketAddr::from_pathname(value),
    }
}

/// A control socket bound under a fresh name and not served yet: the
/// name goes into the file system core (the `user.locafs.control` value)
/// when a mount is assembled, the socket is served when it starts
/// ([`serve`]). Connections made before that wait in its backlog.
pub struct Listener {
    value: String,
    listener: std::os::unix::net::UnixListener,
}

impl Listener {
    /// The socket's name, as the `user.locafs.control` value (`@` and its
    /// abstract name).
    pub fn name(&self) -> &str {
        &self.value
    }
}

/// Binds a control socket under a fresh name in the abstract namespace.
pub fn bind() -> std::io::Result<Listener> {
    let mut tries = 0;
    loop {
        let value = format!("@{}", socket_name());
        match std::os::unix::net::UnixListener::bind_addr(&address(&value)?) {
            Ok(listener) => return Ok(Listener { value, listener }),
            // Taken (by chance, or by someone guessing): another name.
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && tries < 8 => tries += 1,
            Err(e) => return Err(e),
        }
    }
}

/// Serves the control socket `bound` for the mount whose root is `root`
/// until the runtime stops.
pub fn serve(
    bound: Listener,
    root: &Path,
    ra: Arc<ReadAhead>,
    peer: Option<Arc<PeerNode>>,
    rt: &tokio::runtime::Handle,
) -> std::io::Result<()> {
    let ra = Arc::new(Served { ra, peer });
    let std_listener = bound.listener;
    std_listener.set_nonblocking(true)?;
    let _guard = rt.enter();
    let listener = tokio::net::UnixListener::from_std(std_listener)?;
    let root = Arc::new(root.to_owned());
    let slots = Arc::new(tokio::sync::Semaphore::new(CONNECTIONS));
    rt.spawn(async move {
        let mut failing = false;
        loop {
            let stream = match listener.accept().await {
                Ok((s, _)) => {
                    failing = false;
                    s
                }
                Err(e) => {
                    if !failing {
                        warn!("control socket: accept failed ({e}); retrying every {ACCEPT_BACKOFF:?}");
                    }
                    failing = true;
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            };
            // At most CONNECTIONS at once; another is answered "busy" (a
            // write into the fresh socket's empty buffer: it does not
            // block) and closed.
            let permit = match Arc::clone(&slots).try_acquire_owned() {
                Ok(p) => p,
                Err(_) => {
                    let _ = stream.try_write(&answer_line(&busy()));
                    continue;
                }
            };
            let ra = Arc::clone(&ra);
            let root = Arc::clone(&root);
            tokio::spawn(async move {
                let _permit = permit;
                // Decided before any request is read (the check as another
                // user goes through the mount: on the blocking pool).
                let role = match caller_of(&stream) {
                    Ok(caller) => {
                        let root = Arc::clone(&root);
                        tokio::task::spawn_blocking(move || role_of_caller(&caller, &root))
                            .await
                            .unwrap_or_else(|_| Role::Refused("refused: the check failed".into()))
                    }
                    Err(e) => Role::Refused(format!("refused: who is asking is unknown ({e})")),
                };
                let limit = match &role {
                    Role::Owner => MAX_LINE,
                    Role::Reader(_) => READER_MAX_REQUEST,
                    // The one answer, and the connection is closed: not a
                    // byte of the request is read (no buffer, no line).
                    Role::Refused(why) => {
                        let mut stream = stream;
                        let _ = stream.write_all(&answer_line(&refused(why.clone()))).await;
                        return;
                    }
                };
                serve_connection(stream, ra, role, root, limit).await;
            });
        }
    });
    Ok(())
}

/// One answer as the line written on the socket.
fn answer_line(resp: &Response) -> Vec<u8> {
    let mut out = serde_json::to_vec(resp).unwrap_or_default();
    out.push(b'\n');
    out
}

/// The answer to a connection past [`CONNECTIONS`].
fn busy() -> Response {
    Response {
        ok: false,
        error: Some(format!(
            "busy: {CONNECTIONS} control connections are open at this mount; try again"
        )),
        ..Default::default()
    }
}

/// What the requests are answered from: read-ahead (plans, `warm`, the
/// namespace and cache a `where` reads) and the peer cache's members, when
/// there is one (the owners a `where` names).
struct Served {
    ra: Arc<ReadAhead>,
    peer: Option<Arc<PeerNode>>,
}

impl Served {
    /// The `where` query (`locate.rs`): owners and cached state of the
    /// files asked, or of the whole data set in listing order; on the
    /// blocking pool.
    async fn locate(&self, asked: Asked) -> Result<crate::peer::locate::Located, String> {
        let owners = match &self.peer {
            Some(node) => crate::peer::locate::Owners::of(node),
            None => crate::peer::locate::Owners::single(),
        };
        let ns = Arc::clone(self.ra.namespace());
        let reader = Arc::clone(self.ra.reader());
        tokio::task::spawn_blocking(move || {
            crate::peer::locate::locate(&ns, reader.cache().as_ref(), &owners, asked)
        })
        .await
        .map_err(|e| format!("where: {e}"))
    }
}

/// The requests of one connection of an owner or a reader, each line (and
/// a `where`'s payload) at most `limit` bytes; a longer one is answered
/// with an error and the connection closed.
async fn serve_connection(
    stream: tokio::net::UnixStream,
    ra: Arc<Served>,
    role: Role,
    root: Arc<PathBuf>,
    limit: usize,
) {
    let (r, mut w) = stream.into_split();
    // Requests of tens of MB (a plan or a `where` of millions of paths) in
    // few reads.
    let mut lines = BufReader::with_capacity(IO_BUFFER, r);
    let mut line = String::new();
    let too_long = |what: &str| Response {
        ok: false,
        error: Some(format!(
            "bad request: {what} longer than {limit} bytes, the most this connection may send"
        )),
        ..Default::default()
    };
    loop {
        line.clear();
        match (&mut lines).take(limit as u64).read_line(&mut line).await {
            Ok(0) | Err(_) => return,
            Ok(n) if n == limit && !line.ends_with('\n') => {
                let _ = w.write_all(&answer_line(&too_long("a request line"))).await;
                return;
            }
            Ok(_) => {}
        }
        let req = serde_json::from_str::<Request>(&line);
        // A `where` with a payload: that many raw bytes follow the line.
        let mut payload = Vec::new();
        if let Ok(Request::Where {
            payload: Some(n), ..
        }) = &req
        {
            if *n > limit as u64 {
                let _ = w.write_all(&answer_line(&too_long("a payload"))).await;
                return;
            }
            payload.resize(*n as usize, 0);
            if lines.read_exact(&mut payload).await.is_err() {
                return;
            }
        }
        let resp = handle(&ra, req, payload, &role, &root).await;
        if w.write_all(&answer_line(&resp)).await.is_err() {
            return;
        }
    }
}

use tokio::io::AsyncReadExt;

/// The answer to a request from a caller who may not ask it.
fn refused(why: String) -> Response {
    Response {
        ok: false,
        refused: true,
        error: Some(why),
        ..Default::default()
    }
}

async fn handle(
    ra: &Served,
    req: serde_json::Result<Request>,
    payload: Vec<u8>,
    role: &Role,
    root: &Path,
) -> Response {
    let reader = match role {
        Role::Owner => None,
        Role::Reader(c) => Some(c.clone()),
        Role::Refused(why) => return refused(why.clone()),
    };
    let req: Request = match req {
        Ok(r) => r,
        Err(e) => {
            return Response {
                ok: false,
                error: Some(format!("bad request: {e}")),
                ..Default::default()
            };
        }
    };
    match req {
        Request::Warm { .. } if reader.is_some() => refused(format!(
            "refused: warm makes the mount fetch and keep data; only its owner (uid {}) and \
             root may ask for it",
            rustix::process::geteuid().as_raw()
        )),
        Request::Warm { path } => warm(&ra.ra, &path).await,
        Request::Where {
            paths,
            joined,
            payload: bytes,
            packed,
        } => {
            let asked = match (paths, joined, bytes) {
                (_, _, Some(_)) => Asked::Joined(payload),
                (_, Some(j), None) => Asked::Joined(j.into_bytes()),
                (Some(p), None, None) => Asked::Paths(p),
                (None, None, None) => Asked::All,
            };
            where_(ra, asked, packed, reader.as_ref(), root).await
        }
        Request::Plan { paths } => plan(&ra.ra, paths, reader.as_ref(), root).await,
    }
}

/// `warm`: every block of one file cached.
async fn warm(ra: &Arc<ReadAhead>, path: &Path) -> Response {
    match ra.warm(path).await {
        Ok((cached, missing)) => Response {
            ok: missing == 0,
            cached_bytes: cached,
            missing_bytes: missing,
            files: 1,
            error: (missing > 0).then(|| {
                "the cache is full of data still in use, or its disk failed or \
                 took longer than --source-timeout to write (see the daemon's log)"
                    .into()
            }),
            ..Default::default()
        },
        Err(e) => {
            warn!("warm: {e}");
            Response {
                ok: false,
                error: Some(e),
                ..Default::default()
            }
        }
    }
}

/// `where`: the owner and cached state of the files asked; a reader's
/// paths that they could not reach are answered as not found.
async fn where_(
    ra: &Served,
    asked: Asked,
    packed: bool,
    reader: Option<&Caller>,
    root: &Path,
) -> Response {
    let hidden = match (reader, &asked) {
        (Some(c), Asked::Paths(p)) => {
            let p: Vec<Vec<u8>> = p
                .iter()
                .map(|p| p.as_os_str().as_encoded_bytes().to_vec())
                .collect();
            Some(reachable_blocking(root, c, p, false).await)
        }
        (Some(c), Asked::Joined(j)) => {
            let p: Vec<Vec<u8>> = if j.is_empty() {
                Vec::new()
            } else {
                j.split(|b| *b == 0).map(<[u8]>::to_vec).collect()
            };
            Some(reachable_blocking(root, c, p, false).await)
        }
        _ => None,
    };
    let mut l = match ra.locate(asked).await {
        Ok(l) => l,
        Err(e) => {
            return Response {
                ok: false,
                error: Some(e),
                ..Default::default()
            }
        }
    };
    if let Some(c) = reader {
        match hidden {
            Some(v) => hide(&mut l, &v),
            None => keep_listable(&mut l, root, c).await,
        }
        // (Which directories could not be listed: their names
        // are not the reader's to know.)
        if !l.problems.is_empty() {
            l.problems = vec![format!(
                "{} directories could not be listed",
                l.problems.len()
            )];
        }
    }
    located(l, packed)
}

/// The answer to a `where` from what was located: the owners and cached
/// states as lists, or packed (base64 of little-endian u32s and bytes).
fn located(l: crate::peer::locate::Located, packed: bool) -> Response {
    let mut error = (!l.problems.is_empty()).then(|| {
        let more = l.problems.len().saturating_sub(5);
        let mut s = l.problems[..l.problems.len().min(5)].join("; ");
        if more > 0 {
            s += &format!("; and {more} more directories not listed");
        }
        s
    });
    if l.node_index.is_none() {
        error = Some(
            "this node has not found itself in its --peers list (yet): \
             its --listen address must be one of them"
                .into(),
        );
    }
    let mut r = Response {
        ok: l.node_index.is_some(),
        error,
        files: l.owners.len() as u64,
        unknown: l.unknown,
        node_index: l.node_index,
        num_nodes: Some(l.num_nodes),
        members: Some(l.members),
        ..Default::default()
    };
    if packed {
        let mut owners = Vec::with_capacity(l.owners.len() * 4);
        for o in &l.owners {
            owners.extend_from_slice(&o.unwrap_or(NOT_FOUND).to_le_bytes());
        }
        let cached: Vec<u8> = l.cached.iter().map(|c| *c as u8).collect();
        r.owners_packed = Some(base64(&owners));
        r.cached_packed = Some(base64(&cached));
        r.paths_joined = l.paths;
    } else {
        r.paths = l.paths.map(|p| {
            if l.owners.is_empty() {
                Vec::new()
            } else {
                p.split('\0').map(str::to_owned).collect()
            }
        });
        r.owners = Some(l.owners);
        r.cached = Some(l.cached);
    }
    r
}

/// `plan`: read-ahead follows the loader's order; a reader plans only
/// what they could reach, the rest counts as not found.
async fn plan(
    ra: &Arc<ReadAhead>,
    paths: Vec<PathBuf>,
    reader: Option<&Caller>,
    root: &Path,
) -> Response {
    let (paths, hidden) = match reader {
        None => (paths, 0),
        Some(c) => {
            let p: Vec<Vec<u8>> = paths
                .iter()
                .map(|p| p.as_os_str().as_encoded_bytes().to_vec())
                .collect();
            let ok = reachable_blocking(root, c, p, false).await;
            let n = paths.len();
            let kept: Vec<PathBuf> = paths
                .into_iter()
                .zip(ok)
                .filter_map(|(p, ok)| ok.then_some(p))
                .collect();
            let hidden = n - kept.len();
            (kept, hidden)
        }
    };
    let (files, unknown) = ra.set_plan(&paths).await;
    Response {
        ok: true,
        files: files as u64,
        unknown: (unknown + hidden) as u64,
        ..Default::default()
    }
}

/// [`reachable`] on the blocking pool (it waits on the mount).
async fn reachable_blocking(
    root: &Path,
    caller: &Caller,
    paths: Vec<Vec<u8>>,
    listed: bool,
) -> Vec<bool> {
    let (root, caller) = (root.to_owned(), caller.clone());
    let n = paths.len();
    tokio::task::spawn_blocking(move || {
        let refs: Vec<&[u8]> = paths.iter().map(Vec::as_slice).collect();
        reachable(&root, &caller, &refs, listed)
    })
    .await
    .unwrap_or_else(|_| vec![false; n])
}

/// Answers the files of `l` that `visible` says no as not found.
fn hide(l: &mut crate::peer::locate::Located, visible: &[bool]) {
    for (i, v) in visible.iter().enumerate() {
        if *v {
            continue;
        }
        if let Some(o) = l.owners.get_mut(i) {
            if o.take().is_some() {
                l.unknown += 1;
            }
        }
        if let Some(c) = l.cached.get_mut(i) {
            *c = false;
        }
    }
}

/// Keeps, of a listing of every file, those the reader `c` could find by
/// listing directories through the mount.
async fn keep_listable(l: &mut crate::peer::locate::Located, root: &Path, c: &Caller) {
    let Some(joined) = l.paths.take() else { return };
    let names: Vec<&str> = if l.owners.is_empty() {
        Vec::new()
    } else {
        joined.split('\0').collect()
    };
    let ok = reachable_blocking(
        root,
        c,
        names.iter().map(|n| n.as_bytes().to_vec()).collect(),
        true,
    )
    .await;
    let mut kept = Vec::new();
    let (mut owners, mut cached) = (Vec::new(), Vec::new());
    for (i, name) in names.iter().enumerate() {
        if ok.get(i).copied().unwrap_or(false) {
            kept.push(*name);
            owners.push(l.owners.get(i).copied().flatten());
            cached.push(l.cached.get(i).copied().unwrap_or(false));
        }
    }
    l.paths = Some(kept.join("\0"));
    l.owners = owners;
    l.cached = cached;
}

/// A client connection to a mount's control socket.
pub struct Client {
    stream: std::io::BufReader<std::os::unix::net::UnixStream>,
}

impl Client {
    /// Connects to the mount whose root is `mount_root`.
    pub fn connect(mount_root: &Path) -> Result<Self, String> {
        let raw = crate::sys::getxattr(mount_root, CONTROL_XATTR).map_err(|e| {
            if e.raw_os_error() == Some(libc::EACCES) {
                format!(
                    "{}: you may not read the mount root, so its control socket is not yours \
                     to use",
                    mount_root.display()
                )
            } else {
                format!(
                    "{}: not the root of a locafs mount ({})",
                    mount_root.display(),
                    crate::obs::logging::short_io(&e)
                )
            }
        })?;
        let name = String::from_utf8_lossy(&raw).into_owned();
        let s = address(&name)
            .and_then(|a| std::os::unix::net::UnixStream::connect_addr(&a))
            .map_err(|e| {
                let hint =
                    if name.starts_with('@') && e.kind() == std::io::ErrorKind::ConnectionRefused {
                        " (an abstract socket: reachable only from the daemon's network namespace)"
                    } else {
                        ""
                    };
                format!("control socket {name}: {e}{hint}")
            })?;
        Ok(Client {
            stream: std::io::BufReader::with_capacity(IO_BUFFER, s),
        })
    }

    pub fn call(&mut self, req: &Request) -> Result<Response, String> {
        self.call_with(req, &[])
    }

    /// [`Client::call`] with `payload` sent after the request line (a
    /// `where` whose `payload` is `payload.len()`).
    pub fn call_with(&mut self, req: &Request, payload: &[u8]) -> Result<Response, String> {
        use std::io::{BufRead, Write};
        let mut out = serde_json::to_vec(req).map_err(|e| e.to_string())?;
        out.push(b'\n');
        let stream = self.stream.get_mut();
        // A write that fails may be the daemon having answered and closed
        // without reading (a refusal, "busy", a request too long): its
        // answer is read all the same.
        let sent = stream
            .write_all(&out)
            .and_then(|()| stream.write_all(payload));
        let mut line = String::new();
        let read = self.stream.read_line(&mut line);
        if line.is_empty() {
            sent.and(read).map_err(|e| format!("control socket: {e}"))?;
            return Err("control socket closed".into());
        }
        let r: Response =
            serde_json::from_str(&line).map_err(|e| format!("control socket: bad answer: {e}"))?;
        if r.refused {
            return Err(r.error.unwrap_or_else(|| "refused".into()));
        }
        Ok(r)
    }
}

/// Finds the locafs mount root containing `path` (walking up).
pub fn mount_root_of(path: &Path) -> Result<(PathBuf, PathBuf), String> {
    let abs = std::fs::canonicalize(path)
        .map_err(|e| format!("{}: {}", path.display(), crate::obs::logging::short_io(&e)))?;
    let mut cur = abs.as_path();
    loop {
        if crate::sys::getxattr(cur, CONTROL_XATTR).is_ok() {
            let rel = abs.strip_prefix(cur).unwrap_or(Path::new("")).to_owned();
            return Ok((cur.to_owned(), rel));
        }
        match cur.parent() {
            Some(p) => cur = p,
            None => return Err(format!("{}: not inside a locafs mount", path.display())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(uid: u32) -> Caller {
        Caller {
            uid,
            gid: uid,
            groups: vec![],
        }
    }

    #[test]
    fn roles_owner_and_root_ask_anything_others_what_the_root_allows() {
        let root = Path::new("/mnt/data");
        let never = || -> bool { panic!("not asked when the uid decides") };
        // The daemon's user and root: everything, without a check.
        assert_eq!(role_of(&caller(0), 0, root, never), Role::Owner);
        assert_eq!(role_of(&caller(1000), 1000, root, never), Role::Owner);
        assert_eq!(role_of(&caller(0), 1000, root, never), Role::Owner);
        // A daemon that is not root cannot check as another user: refused.
        match role_of(&caller(1001), 1000, root, never) {
            Role::Refused(why) => {
                assert!(why.contains("belongs to uid 1000") && why.contains("you are uid 1001"))
            }
            r => panic!("{r:?}"),
        }
        // A root daemon: what the kernel says of the mount root.
        assert_eq!(
            role_of(&caller(65534), 0, root, || true),
            Role::Reader(caller(65534))
        );
        match role_of(&caller(65534), 0, root, || false) {
            Role::Refused(why) => assert!(
                why.contains("uid 65534 may not read the mount root /mnt/data"),
                "{why}"
            ),
            r => panic!("{r:?}"),
        }
    }

    #[test]
    fn refused_answers_and_socket_names_parse() {
        use std::os::linux::net::SocketAddrExt;
        let r: Response =
            serde_json::from_str(r#"{"ok":false,"refused":true,"error":"refused: no"}"#).unwrap();
        assert!(r.refused);
        // Older answers without the field read as not refused.
        let r: Response = serde_json::from_str(r#"{"ok":true}"#).unwrap();
        assert!(!r.refused);
        assert_eq!(
            address("@locafs-1-ab").unwrap().as_abstract_name(),
            Some(&b"locafs-1-ab"[..])
        );
        assert_eq!(
            address("/run/x.sock").unwrap().as_pathname(),
            Some(Path::new("/run/x.sock"))
        );
    }
}
