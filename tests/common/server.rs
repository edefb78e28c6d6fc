//! What the test kit's storage servers share (moto_server in [`super::s3`],
//! Azurite in [`super::azurite`], fake-gcs-server in [`super::gcs`]): a
//! server program as a child process on a free loopback port, waited for
//! until it listens and killed and reaped on drop; and one raw HTTP/1.0
//! request to it, for what the servers take that object_store does not send
//! (making a bucket, keys object_store would not name).
//!
//! It must never leave a server process behind, and never talk to anything
//! but loopback.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use object_store::path::Path as Key;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

/// Calls `put(key, bytes)` for every file under `dir`, keyed
/// `prefix/relative/path` (the relative path alone for an empty prefix).
pub fn put_tree_with(dir: &Path, prefix: &str, mut put: impl FnMut(&str, &[u8])) {
    for rel in super::list_files(dir) {
        let bytes = std::fs::read(dir.join(&rel)).unwrap();
        let rel = rel.to_string_lossy().into_owned();
        let key = if prefix.is_empty() {
            rel
        } else {
            format!("{prefix}/{rel}")
        };
        put(&key, &bytes);
    }
}

/// Writes test data into a bucket or container through object_store, on a
/// runtime of its own (the servers' bucket and container types deref to
/// it).
pub struct StoreWriter {
    store: Arc<dyn ObjectStore>,
    rt: tokio::runtime::Runtime,
}

impl StoreWriter {
    pub fn new(store: Arc<dyn ObjectStore>) -> StoreWriter {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        StoreWriter { store, rt }
    }

    pub fn put(&self, key: &str, bytes: &[u8]) {
        let store = Arc::clone(&self.store);
        let (k, p) = (
            Key::parse(key).expect("key"),
            PutPayload::from(bytes.to_vec()),
        );
        self.rt
            .block_on(async move { store.put(&k, p).await })
            .unwrap_or_else(|e| panic!("put {key}: {e}"));
    }

    pub fn delete(&self, key: &str) {
        let store = Arc::clone(&self.store);
        let k = Key::parse(key).expect("key");
        self.rt
            .block_on(async move { store.delete(&k).await })
            .unwrap_or_else(|e| panic!("delete {key}: {e}"));
    }

    /// Puts every file under `dir` as `prefix/relative/path`.
    pub fn put_tree(&self, dir: &Path, prefix: &str) {
        put_tree_with(dir, prefix, |k, b| self.put(k, b));
    }
}

/// A running server process. Dropping it kills and reaps it.
pub struct Server {
    child: Option<Child>,
    /// The program's name, for messages.
    pub name: String,
    pub port: u16,
    /// `http://127.0.0.1:PORT`
    pub endpoint: String,
}

/// How long a server may take to listen, and to answer a request. Only a
/// server that hangs waits this long (one that exits fails at once, and a
/// fast one returns at once), so it is set by the worst machine seen: at
/// load 66 to 190 on the 2-core machine (other builds), Azurite and
/// moto_server at nice 19 did not listen within 120 s, and moto's first
/// answer (it imports the service's backend then) took over 120 s.
pub const SERVER_START: Duration = Duration::from_secs(300);

impl Server {
    /// Starts `cmd` (its output discarded) that is to listen on `port` of
    /// 127.0.0.1, and waits (at most [`SERVER_START`]) until it accepts
    /// connections; panics at once if it exits, or if it never listens.
    pub fn start(name: &str, mut cmd: Command, port: u16) -> Server {
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("start {name}: {e}"));
        let mut s = Server {
            child: Some(child),
            name: name.to_owned(),
            port,
            endpoint: format!("http://127.0.0.1:{port}"),
        };
        let t0 = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Some(c) = s.child.as_mut() {
                if let Ok(Some(st)) = c.try_wait() {
                    s.child = None;
                    panic!("{name} exited ({st}) before it listened on {port}");
                }
            }
            assert!(
                t0.elapsed() < SERVER_START,
                "{name} did not listen on {port} within {SERVER_START:?} (load average {})",
                super::sys::load_average()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        s
    }

    /// Kills the server (as a store that went away).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One HTTP/1.0 request with `headers` (each `Name: value`) added; the whole
/// answer as text, or, if none came, a line saying why (so that the
/// caller's assertion shows it). The answer may take [`SERVER_START`], as
/// a server's start may (the first request to moto_server imports the
/// service's backend); a fast answer returns at once.
pub fn raw_request_with(
    host: &str,
    method: &str,
    path: &str,
    headers: &[(String, String)],
    body: &[u8],
) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(host).expect("connect");
    s.set_read_timeout(Some(SERVER_START)).unwrap();
    let t0 = Instant::now();
    let mut head = format!(
        "{method} {path} HTTP/1.0\r\nHost: {host}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut raw = Vec::new();
    let read = s.read_to_end(&mut raw);
    let mut text = String::from_utf8_lossy(&raw).into_owned();
    if raw.is_empty() {
        let why = match read {
            Ok(_) => "the server closed the connection".to_owned(),
            Err(e) => e.to_string(),
        };
        text = format!(
            "(no answer after {:?}: {why}; load average {})",
            t0.elapsed(),
            super::sys::load_average()
        );
    }
    text
}

/// One unsigned HTTP/1.0 request; the whole answer as text.
pub fn raw_request(host: &str, method: &str, path: &str, body: &[u8]) -> String {
    raw_request_with(host, method, path, &[], body)
}

/// `http://host:port/path` -> ("host:port", "/path").
pub fn split_url(url: &str) -> (String, String) {
    let rest = url.strip_prefix("http://").expect("http URL");
    match rest.split_once('/') {
        Some((h, p)) => (h.to_owned(), format!("/{p}")),
        None => (rest.to_owned(), "/".to_owned()),
    }
}

/// The status code of a raw answer (0 if it has none).
pub fn status(resp: &str) -> u16 {
    resp.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

/// `s` percent-encoded for a URL path (`/` kept) or, with `keep_slash`
/// false, for a query value.
pub fn pct(s: &str, keep_slash: bool) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric()
            || matches!(b, b'-' | b'_' | b'.' | b'~')
            || (keep_slash && b == b'/')
        {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
