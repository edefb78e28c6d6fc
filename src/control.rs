//! The control channel of a running mount: a Unix socket in the data set's
//! cache directory (its path is the `user.locafs.control` extended attribute
//! of the mount root, so nothing is added to the tree). One JSON request per
//! line, one JSON answer per line. Used by `locafs warm`, `locafs plan` and
//! `locafs where` (and the Python package, packaging/python).
//!
//! The socket is only reachable by the user running the daemon (mode 0600).
//! A malformed request gets an error answer; it never stops the server.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tracing::warn;

use crate::locate::Asked;
use crate::prefetch::ReadAhead;

/// The extended attribute of the mount root that names the control socket.
pub const CONTROL_XATTR: &str = "user.locafs.control";
/// Read buffer of each end of a connection.
const IO_BUFFER: usize = 1 << 20;
/// Longest request line (a plan of a few million paths fits).
const MAX_LINE: usize = 256 << 20;

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

/// Where the control socket of a data set lives (falls back to the runtime
/// dir when the cache path is too long for a socket address).
pub fn socket_path(dataset_dir: &Path) -> PathBuf {
    let p = dataset_dir.join("control.sock");
    if p.as_os_str().len() < 100 {
        return p;
    }
    let h = blake3::hash(dataset_dir.as_os_str().as_encoded_bytes()).to_hex();
    std::env::temp_dir().join(format!("locafs-{}.sock", &h[..16]))
}

/// Serves the control socket until the runtime stops.
pub fn serve(path: &Path, ra: Arc<ReadAhead>, rt: &tokio::runtime::Handle) -> std::io::Result<()> {
    let _ = std::fs::remove_file(path);
    let _guard = rt.enter();
    let listener = tokio::net::UnixListener::bind(path)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    rt.spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let ra = Arc::clone(&ra);
            tokio::spawn(async move {
                let (r, mut w) = stream.into_split();
                // Requests of tens of MB (a plan or a `where` of millions of
                // paths) in few reads.
                let mut lines = BufReader::with_capacity(IO_BUFFER, r);
                let mut line = String::new();
                loop {
                    line.clear();
                    match (&mut lines)
                        .take(MAX_LINE as u64)
                        .read_line(&mut line)
                        .await
                    {
                        Ok(0) | Err(_) => return,
                        Ok(_) => {}
                    }
                    let req = serde_json::from_str::<Request>(&line);
                    // A `where` with a payload: that many raw bytes follow
                    // the line.
                    let mut payload = Vec::new();
                    if let Ok(Request::Where {
                        payload: Some(n), ..
                    }) = &req
                    {
                        if *n > MAX_LINE as u64 {
                            return;
                        }
                        payload.resize(*n as usize, 0);
                        if lines.read_exact(&mut payload).await.is_err() {
                            return;
                        }
                    }
                    let resp = handle(&ra, req, payload).await;
                    let mut out = serde_json::to_vec(&resp).unwrap_or_default();
                    out.push(b'\n');
                    if w.write_all(&out).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    Ok(())
}

use tokio::io::AsyncReadExt;

async fn handle(
    ra: &Arc<ReadAhead>,
    req: serde_json::Result<Request>,
    payload: Vec<u8>,
) -> Response {
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
        Request::Warm { path } => match ra.warm(&path).await {
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
        },
        Request::Where {
            paths,
            joined,
            payload: bytes,
            packed,
        } => match ra
            .locate(match (paths, joined, bytes) {
                (_, _, Some(_)) => Asked::Joined(payload),
                (_, Some(j), None) => Asked::Joined(j.into_bytes()),
                (Some(p), None, None) => Asked::Paths(p),
                (None, None, None) => Asked::All,
            })
            .await
        {
            Ok(l) => {
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
            Err(e) => Response {
                ok: false,
                error: Some(e),
                ..Default::default()
            },
        },
        Request::Plan { paths } => {
            let (files, unknown) = ra.set_plan(&paths).await;
            Response {
                ok: true,
                files: files as u64,
                unknown: unknown as u64,
                ..Default::default()
            }
        }
    }
}

/// A client connection to a mount's control socket.
pub struct Client {
    stream: std::io::BufReader<std::os::unix::net::UnixStream>,
}

impl Client {
    /// Connects to the mount whose root is `mount_root`.
    pub fn connect(mount_root: &Path) -> Result<Self, String> {
        let raw = crate::sys::getxattr(mount_root, CONTROL_XATTR)
            .map_err(|_| format!("{}: not the root of a locafs mount", mount_root.display()))?;
        let path = PathBuf::from(String::from_utf8_lossy(&raw).into_owned());
        let s = std::os::unix::net::UnixStream::connect(&path)
            .map_err(|e| format!("control socket {}: {e}", path.display()))?;
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
        stream
            .write_all(&out)
            .and_then(|()| stream.write_all(payload))
            .map_err(|e| format!("control socket: {e}"))?;
        let mut line = String::new();
        self.stream
            .read_line(&mut line)
            .map_err(|e| format!("control socket: {e}"))?;
        if line.is_empty() {
            return Err("control socket closed".into());
        }
        serde_json::from_str(&line).map_err(|e| format!("control socket: bad answer: {e}"))
    }
}

/// Finds the locafs mount root containing `path` (walking up).
pub fn mount_root_of(path: &Path) -> Result<(PathBuf, PathBuf), String> {
    let abs = std::fs::canonicalize(path)
        .map_err(|e| format!("{}: {}", path.display(), crate::logging::short_io(&e)))?;
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
