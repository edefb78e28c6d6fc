//! A hostile object store: a small HTTP/1.1 server on loopback that speaks
//! enough of S3's (and GCS's XML API, the same), and Azure Blob Storage's
//! protocol for `locafs mount s3://`, `gs://` and `az://` to list and read
//! a few objects, and that misbehaves on demand, as an untrusted store or
//! a man in the middle of a plain `http://` endpoint could:
//!
//! - a ranged GET of a key in [`Hostile::huge`] is answered with the right
//!   `Content-Range` but `Content-Length: 10 GiB`, and a body streamed
//!   until [`HUGE_STREAM`] bytes are out or the client hangs up;
//! - a listing of a prefix under [`Hostile::endless`] answers a page of
//!   new keys with the same continuation token (S3's and GCS's
//!   `NextContinuationToken`, Azure's `NextMarker`) every time, for ever.
//!
//! Everything else is answered as a store would: listings with a
//! delimiter, HEAD, ranged GETs. It counts what it sent. No signature is
//! checked (the mounts use `--no-sign-request`, the emulator's key, or an
//! OAuth-less service account). Each connection is served by a thread of
//! its own; the server stops accepting when dropped.
//!
//! It must never listen beyond loopback, and never block a test: a client
//! that hangs up ends its connection's thread.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

/// Which protocol the store speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    /// S3 (path-style) and GCS's XML API: `ListBucketResult`.
    S3,
    /// Azure Blob Storage as Azurite serves it (the account in the path):
    /// `EnumerationResults`.
    Azure,
}

/// The `Content-Length` a huge answer declares.
pub const HUGE_DECLARED: u64 = 10 << 30;
/// The bytes of a huge answer streamed at most, per request.
pub const HUGE_STREAM: u64 = 300 << 20;
/// Keys in each page of an endless listing.
pub const ENDLESS_PAGE_KEYS: usize = 100;
/// The pause before each page of an endless listing (so that a client that
/// follows it for ever grows slowly, not by gigabytes a minute).
pub const ENDLESS_PAGE_PAUSE: Duration = Duration::from_millis(50);

/// What the store holds, how it misbehaves, and what it counted.
#[derive(Default)]
pub struct Hostile {
    /// Keys and their bytes.
    pub objects: Mutex<BTreeMap<String, Vec<u8>>>,
    /// Keys whose ranged GETs get a huge answer.
    pub huge: Mutex<BTreeSet<String>>,
    /// Prefixes (ending in `/`) whose listings never end.
    pub endless: Mutex<BTreeSet<String>>,
    /// Bytes of huge bodies written out (accepted by the socket).
    pub huge_sent: AtomicU64,
    /// Requests for huge answers.
    pub huge_requests: AtomicU64,
    /// Ranged GETs of a range outside the object (416), as a client that
    /// retries a cut-short answer from where it thinks it was might ask.
    pub unsatisfiable: AtomicU64,
    /// Pages of endless listings sent.
    pub endless_pages: AtomicU64,
    /// Every request.
    pub requests: AtomicU64,
}

/// A running hostile store; stops accepting when dropped.
pub struct HostileStore {
    pub dialect: Dialect,
    /// `http://127.0.0.1:PORT`
    pub endpoint: String,
    /// The bucket (container) it serves.
    pub bucket: String,
    pub state: Arc<Hostile>,
    stop: Arc<AtomicBool>,
    port: u16,
}

impl HostileStore {
    /// Starts a store of `dialect` serving bucket (or container) `bucket`.
    pub fn start(dialect: Dialect, bucket: &str) -> HostileStore {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(Hostile::default());
        let stop = Arc::new(AtomicBool::new(false));
        let (st, sp, b) = (Arc::clone(&state), Arc::clone(&stop), bucket.to_owned());
        std::thread::Builder::new()
            .name("hostile-accept".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if sp.load(Relaxed) {
                        break;
                    }
                    let Ok(conn) = conn else { continue };
                    let (st, b) = (Arc::clone(&st), b.clone());
                    let _ = std::thread::Builder::new()
                        .name("hostile-conn".into())
                        .spawn(move || serve(conn, dialect, &b, &st));
                }
            })
            .expect("accept thread");
        HostileStore {
            dialect,
            endpoint: format!("http://127.0.0.1:{port}"),
            bucket: bucket.to_owned(),
            state,
            stop,
            port,
        }
    }

    /// Puts an object.
    pub fn put(&self, key: &str, bytes: &[u8]) {
        self.state
            .objects
            .lock()
            .insert(key.to_owned(), bytes.to_vec());
    }
}

impl Drop for HostileStore {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        // Wakes the accept loop so that it sees the flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// One request as far as the store reads it.
struct Request {
    method: String,
    /// Percent-decoded path segments.
    segments: Vec<String>,
    /// Percent-decoded query parameters.
    query: Vec<(String, String)>,
    range: Option<(u64, u64)>,
}

impl Request {
    fn param(&self, k: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.as_str())
    }
}

fn serve(conn: TcpStream, dialect: Dialect, bucket: &str, st: &Hostile) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(120)));
    let Ok(mut out) = conn.try_clone() else {
        return;
    };
    let mut r = BufReader::new(conn);
    while let Some(req) = read_request(&mut r) {
        st.requests.fetch_add(1, Relaxed);
        if !answer(&mut out, &req, dialect, bucket, st) {
            return;
        }
    }
}

fn read_request(r: &mut BufReader<TcpStream>) -> Option<Request> {
    let mut line = String::new();
    if r.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let mut parts = line.split_whitespace();
    let method = parts.next()?.to_owned();
    let target = parts.next()?.to_owned();
    let mut range = None;
    loop {
        let mut h = String::new();
        if r.read_line(&mut h).ok()? == 0 {
            return None;
        }
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            if k.eq_ignore_ascii_case("range") {
                range = v
                    .trim()
                    .strip_prefix("bytes=")
                    .and_then(|x| x.split_once('-'))
                    .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)));
            }
        }
    }
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    Some(Request {
        method,
        segments: path
            .split('/')
            .filter(|s| !s.is_empty())
            .map(pct_decode)
            .collect(),
        query: query
            .split('&')
            .filter(|s| !s.is_empty())
            .map(|kv| {
                let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                (pct_decode(k), pct_decode(v))
            })
            .collect(),
        range,
    })
}

fn pct_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(v) => {
                        out.push(v);
                        i += 3;
                        continue;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn xml(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

const LAST_MODIFIED: &str = "Mon, 01 Jan 2024 00:00:00 GMT";
const LAST_MODIFIED_ISO: &str = "2024-01-01T00:00:00.000Z";

fn etag(bytes: &[u8]) -> String {
    let sum = bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ *b as u64).wrapping_mul(0x100_0000_01b3)
    });
    format!("\"{sum:016x}\"")
}

fn respond(
    out: &mut TcpStream,
    code: u16,
    headers: &[(&str, String)],
    body: &[u8],
    head: bool,
) -> bool {
    let reason = match code {
        200 => "OK",
        206 => "Partial Content",
        404 => "Not Found",
        416 => "Range Not Satisfiable",
        _ => "Error",
    };
    let mut h = format!("HTTP/1.1 {code} {reason}\r\n");
    let mut has_len = false;
    for (k, v) in headers {
        has_len |= k.eq_ignore_ascii_case("content-length");
        h.push_str(&format!("{k}: {v}\r\n"));
    }
    if !has_len {
        h.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    h.push_str("\r\n");
    out.write_all(h.as_bytes()).is_ok() && (head || out.write_all(body).is_ok())
}

/// Answers one request; false when the connection is to end.
fn answer(
    out: &mut TcpStream,
    req: &Request,
    dialect: Dialect,
    bucket: &str,
    st: &Hostile,
) -> bool {
    let Some(at) = req.segments.iter().position(|s| s == bucket) else {
        return respond(out, 404, &[], b"no such bucket", false);
    };
    let key = req.segments[at + 1..].join("/");
    let listing = req.param("list-type").is_some() || req.param("comp") == Some("list");
    if listing {
        let page = list_page(req, dialect, bucket, st);
        return respond(
            out,
            200,
            &[("Content-Type", "application/xml".into())],
            page.as_bytes(),
            false,
        );
    }
    let head = req.method == "HEAD";
    let obj = st.objects.lock().get(&key).cloned();
    let Some(obj) = obj else {
        return respond(out, 404, &[], b"", head);
    };
    let size = obj.len() as u64;
    let common = [
        ("ETag", etag(&obj)),
        ("Last-Modified", LAST_MODIFIED.to_owned()),
        ("Accept-Ranges", "bytes".to_owned()),
    ];
    let Some((a, b)) = req.range.filter(|_| !head) else {
        let mut h = common.to_vec();
        h.push(("Content-Length", size.to_string()));
        return respond(out, 200, &h, &obj, head);
    };
    if a > b || b >= size {
        st.unsatisfiable.fetch_add(1, Relaxed);
        return respond(out, 416, &[], b"", false);
    }
    let mut h = common.to_vec();
    h.push(("Content-Range", format!("bytes {a}-{b}/{size}")));
    if st.huge.lock().contains(&key) {
        st.huge_requests.fetch_add(1, Relaxed);
        h.push(("Content-Length", HUGE_DECLARED.to_string()));
        if !respond(out, 206, &h, b"", true) {
            return false;
        }
        let chunk = vec![0x5au8; 1 << 20];
        let mut sent = 0;
        while sent < HUGE_STREAM {
            if out.write_all(&chunk).is_err() {
                break;
            }
            sent += chunk.len() as u64;
            st.huge_sent.fetch_add(chunk.len() as u64, Relaxed);
        }
        // The answer is cut short of what it declared: the connection ends.
        return false;
    }
    respond(out, 206, &h, &obj[a as usize..=b as usize], false)
}

/// An object in a listing page: key, size, ETag.
type Listed = (String, u64, String);

/// One page of a listing (with `delimiter` `/` or none), in the dialect's
/// XML; an endless prefix's page carries a token that never changes.
fn list_page(req: &Request, dialect: Dialect, bucket: &str, st: &Hostile) -> String {
    let prefix = req.param("prefix").unwrap_or("").to_owned();
    let delim = req.param("delimiter").filter(|d| !d.is_empty());
    let max: usize = req
        .param("max-keys")
        .or(req.param("maxresults"))
        .and_then(|m| m.parse().ok())
        .unwrap_or(1000);
    let endless = st
        .endless
        .lock()
        .iter()
        .any(|e| prefix.starts_with(e.as_str()));
    let (files, dirs, next): (Vec<Listed>, Vec<String>, Option<String>) = if endless {
        std::thread::sleep(ENDLESS_PAGE_PAUSE);
        let n = st.endless_pages.fetch_add(1, Relaxed);
        let files = (0..ENDLESS_PAGE_KEYS)
            .map(|i| (format!("{prefix}e{n:06}_{i:03}"), 1, etag(b"e")))
            .collect();
        (files, Vec::new(), Some("again".to_owned()))
    } else {
        // Continue after a token (the last key of the page before) or a
        // start-after / startFrom / marker position.
        let after = req
            .param("continuation-token")
            .or(req.param("marker"))
            .or(req.param("start-after"))
            .unwrap_or("")
            .to_owned();
        let objects = st.objects.lock();
        let mut files = Vec::new();
        let mut dirs: Vec<String> = Vec::new();
        let mut next = None;
        let mut last = String::new();
        for (k, v) in objects.range(prefix.clone()..) {
            if !k.starts_with(&prefix) {
                break;
            }
            if !after.is_empty() && k.as_str() <= after.as_str() {
                continue;
            }
            let rest = &k[prefix.len()..];
            let dir = delim.and_then(|d| rest.find(d).map(|i| format!("{prefix}{}", &rest[..=i])));
            if dir.as_ref().is_some_and(|d| dirs.last() == Some(d)) {
                continue;
            }
            if files.len() + dirs.len() >= max {
                // Past the last key or prefix of this page (a prefix is
                // passed whole: no key is greater than it plus DEL).
                next = Some(last.clone());
                break;
            }
            match dir {
                Some(d) => {
                    last = format!("{d}\u{7f}");
                    dirs.push(d);
                }
                None => {
                    last = k.clone();
                    files.push((k.clone(), v.len() as u64, etag(v)));
                }
            }
        }
        (files, dirs, next)
    };
    match dialect {
        Dialect::S3 => {
            let mut x = format!(
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\
                 <ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">\
                 <Name>{}</Name><Prefix>{}</Prefix><KeyCount>{}</KeyCount><MaxKeys>{max}</MaxKeys>\
                 <IsTruncated>{}</IsTruncated>",
                xml(bucket),
                xml(&prefix),
                files.len() + dirs.len(),
                next.is_some()
            );
            for (k, size, e) in &files {
                x.push_str(&format!(
                    "<Contents><Key>{}</Key><LastModified>{LAST_MODIFIED_ISO}</LastModified>\
                     <ETag>{}</ETag><Size>{size}</Size><StorageClass>STANDARD</StorageClass></Contents>",
                    xml(k),
                    xml(e)
                ));
            }
            for d in &dirs {
                x.push_str(&format!(
                    "<CommonPrefixes><Prefix>{}</Prefix></CommonPrefixes>",
                    xml(d)
                ));
            }
            if let Some(t) = &next {
                x.push_str(&format!(
                    "<NextContinuationToken>{}</NextContinuationToken>",
                    xml(t)
                ));
            }
            x.push_str("</ListBucketResult>");
            x
        }
        Dialect::Azure => {
            let mut x = format!(
                "<?xml version=\"1.0\" encoding=\"utf-8\"?>\
                 <EnumerationResults ContainerName=\"{}\"><Prefix>{}</Prefix>\
                 <MaxResults>{max}</MaxResults><Blobs>",
                xml(bucket),
                xml(&prefix)
            );
            for (k, size, e) in &files {
                x.push_str(&format!(
                    "<Blob><Name>{}</Name><Properties><Last-Modified>{LAST_MODIFIED}</Last-Modified>\
                     <Etag>{}</Etag><Content-Length>{size}</Content-Length>\
                     <Content-Type>application/octet-stream</Content-Type><BlobType>BlockBlob</BlobType>\
                     </Properties></Blob>",
                    xml(k),
                    xml(e)
                ));
            }
            for d in &dirs {
                x.push_str(&format!("<BlobPrefix><Name>{}</Name></BlobPrefix>", xml(d)));
            }
            x.push_str("</Blobs>");
            match &next {
                Some(t) => x.push_str(&format!("<NextMarker>{}</NextMarker>", xml(t))),
                None => x.push_str("<NextMarker/>"),
            }
            x.push_str("</EnumerationResults>");
            x
        }
    }
}
