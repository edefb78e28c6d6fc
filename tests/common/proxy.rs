//! An HTTP proxy in front of a test S3 server, as the network and the store
//! of a region would be: it counts the GET requests for each object key
//! (and the requests by the key that signed them), and can add latency to every request, cap the bandwidth of what it sends
//! back, answer a share of the requests with 503 SlowDown, and stop
//! answering altogether (a stalled store).
//!
//! Each request from the client is forwarded on a fresh connection to the
//! server (with `Connection: close`), its answer read whole and sent back on
//! the client's kept-alive connection. It runs on a runtime of its own and
//! stops when the [`Proxy`] is dropped.
//!
//! It must never change a request's bytes (signatures would break), only
//! its connection header.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the proxy does to requests; every knob can change while it runs.
#[derive(Default)]
pub struct Knobs {
    /// Added before each request is forwarded, in microseconds.
    pub latency_us: AtomicU64,
    /// Bytes per second sent back, for all connections together; 0: no cap.
    pub bandwidth: AtomicU64,
    /// Every Nth request is answered 503 SlowDown; 0: none.
    pub slowdown_every: AtomicU64,
    /// While set, requests are read and never answered.
    pub stalled: AtomicBool,
}

/// What the proxy saw.
#[derive(Default)]
pub struct Counts {
    /// Object GETs (not listings) per key ("bucket/key").
    pub gets: Mutex<HashMap<String, u64>>,
    /// Every request received.
    pub requests: AtomicU64,
    /// Requests answered 503 by the proxy itself.
    pub slowdowns: AtomicU64,
    /// 503 or 429 answers of the store itself, passed back (a loaded moto
    /// sends some).
    pub upstream_throttled: AtomicU64,
    /// Listing requests (GET on a bucket with a query).
    pub lists: AtomicU64,
    /// HEAD requests.
    pub heads: AtomicU64,
    /// Requests by who signed them: the access key id of the Authorization
    /// header's `Credential=` ("" unsigned) and the `X-Amz-Security-Token`
    /// sent with it, if any.
    pub signers: Mutex<HashMap<(String, Option<String>), u64>>,
}

impl Counts {
    /// Object GETs in all.
    pub fn total_gets(&self) -> u64 {
        self.gets.lock().values().sum()
    }

    /// Throttling answers the client got: the proxy's and the store's.
    pub fn throttled(&self) -> u64 {
        self.slowdowns.load(Relaxed) + self.upstream_throttled.load(Relaxed)
    }
}

/// A running proxy; `endpoint` is what clients use.
pub struct Proxy {
    pub endpoint: String,
    pub knobs: Arc<Knobs>,
    pub counts: Arc<Counts>,
    rt: Option<tokio::runtime::Runtime>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// A shared byte budget that refills at `bandwidth` bytes per second.
struct Pacer {
    next_free: Mutex<tokio::time::Instant>,
}

impl Pacer {
    async fn pace(&self, bytes: usize, rate: u64) {
        if rate == 0 {
            return;
        }
        let cost = Duration::from_secs_f64(bytes as f64 / rate as f64);
        let wait_until = {
            let mut n = self.next_free.lock();
            let now = tokio::time::Instant::now();
            let start = (*n).max(now);
            *n = start + cost;
            start + cost
        };
        tokio::time::sleep_until(wait_until).await;
    }
}

impl Proxy {
    /// A proxy on a free loopback port forwarding to `upstream`
    /// ("127.0.0.1:PORT").
    pub fn start(upstream: &str) -> Proxy {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("proxy runtime");
        let listener = rt
            .block_on(TcpListener::bind("127.0.0.1:0"))
            .expect("bind proxy");
        let addr = listener.local_addr().unwrap();
        let knobs = Arc::new(Knobs::default());
        let counts = Arc::new(Counts::default());
        let pacer = Arc::new(Pacer {
            next_free: Mutex::new(tokio::time::Instant::now()),
        });
        let (k, c, up) = (Arc::clone(&knobs), Arc::clone(&counts), upstream.to_owned());
        rt.spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let (k, c, up, p) = (
                    Arc::clone(&k),
                    Arc::clone(&c),
                    up.clone(),
                    Arc::clone(&pacer),
                );
                tokio::spawn(async move {
                    let _ = serve(conn, &up, &k, &c, &p).await;
                });
            }
        });
        Proxy {
            endpoint: format!("http://{addr}"),
            knobs,
            counts,
            rt: Some(rt),
        }
    }
}

/// Reads one HTTP message head (up to the blank line) and its body by
/// Content-Length; None at a clean end of the connection.
async fn read_message(
    conn: &mut TcpStream,
    buf: &mut Vec<u8>,
) -> std::io::Result<Option<(String, Vec<u8>)>> {
    loop {
        if let Some(end) = find(buf, b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).into_owned();
            let len = header(&head, "content-length")
                .and_then(|v| v.parse::<usize>().ok())
                .unwrap_or(0);
            while buf.len() < end + 4 + len {
                let mut chunk = [0u8; 64 * 1024];
                let n = conn.read(&mut chunk).await?;
                if n == 0 {
                    return Err(std::io::ErrorKind::UnexpectedEof.into());
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            let body = buf[end + 4..end + 4 + len].to_vec();
            buf.drain(..end + 4 + len);
            return Ok(Some((head, body)));
        }
        let mut chunk = [0u8; 64 * 1024];
        let n = conn.read(&mut chunk).await?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().skip(1).find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then_some(v.trim())
    })
}

/// The head without its Connection header, with `extra` lines added.
fn rewrite_head(head: &str, extra: &[String]) -> String {
    let mut out: Vec<&str> = head
        .split("\r\n")
        .filter(|l| {
            let k = l.split(':').next().unwrap_or("").trim();
            !k.eq_ignore_ascii_case("connection")
                && !k.eq_ignore_ascii_case("keep-alive")
                && !k.eq_ignore_ascii_case("content-length")
                && !k.eq_ignore_ascii_case("transfer-encoding")
        })
        .collect();
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    out.extend(extra);
    out.join("\r\n") + "\r\n\r\n"
}

async fn serve(
    mut conn: TcpStream,
    upstream: &str,
    knobs: &Knobs,
    counts: &Counts,
    pacer: &Pacer,
) -> std::io::Result<()> {
    let mut buf = Vec::new();
    while let Some((head, body)) = read_message(&mut conn, &mut buf).await? {
        let n = counts.requests.fetch_add(1, Relaxed) + 1;
        let mut first = head.lines().next().unwrap_or("").split(' ');
        let (method, target) = (first.next().unwrap_or(""), first.next().unwrap_or(""));
        let (path, query) = target.split_once('?').unwrap_or((target, ""));
        let key = path.trim_start_matches('/');
        if method == "GET" && key.contains('/') && !query.contains("list-type") {
            *counts.gets.lock().entry(key.to_owned()).or_default() += 1;
        } else if method == "GET" && query.contains("list-type") {
            counts.lists.fetch_add(1, Relaxed);
        } else if method == "HEAD" {
            counts.heads.fetch_add(1, Relaxed);
        }
        let key_id = header(&head, "authorization")
            .and_then(|a| a.split("Credential=").nth(1))
            .and_then(|c| c.split('/').next())
            .unwrap_or("");
        let token = header(&head, "x-amz-security-token").map(str::to_owned);
        *counts
            .signers
            .lock()
            .entry((key_id.to_owned(), token))
            .or_default() += 1;
        while knobs.stalled.load(Relaxed) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let lat = knobs.latency_us.load(Relaxed);
        if lat > 0 {
            tokio::time::sleep(Duration::from_micros(lat)).await;
        }
        let every = knobs.slowdown_every.load(Relaxed);
        if every > 0 && n % every == 0 {
            counts.slowdowns.fetch_add(1, Relaxed);
            let body = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>SlowDown</Code>\
                        <Message>Please reduce your request rate.</Message></Error>";
            let resp = format!(
                "HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            conn.write_all(resp.as_bytes()).await?;
            continue;
        }
        let mut up = TcpStream::connect(upstream).await?;
        let fwd = rewrite_head(
            &head,
            &[
                "Connection: close".into(),
                format!("Content-Length: {}", body.len()),
            ],
        );
        up.write_all(fwd.as_bytes()).await?;
        up.write_all(&body).await?;
        let mut raw = Vec::new();
        up.read_to_end(&mut raw).await?;
        let Some(end) = find(&raw, b"\r\n\r\n") else {
            return Ok(());
        };
        let rhead = String::from_utf8_lossy(&raw[..end]).into_owned();
        let status = rhead.split(' ').nth(1).unwrap_or("");
        if status == "503" || status == "429" {
            counts.upstream_throttled.fetch_add(1, Relaxed);
        }
        let rbody = &raw[end + 4..];
        // A HEAD answer says the object's length but has no body.
        let len = if method == "HEAD" {
            header(&rhead, "content-length")
                .map(str::to_owned)
                .unwrap_or_else(|| "0".into())
        } else {
            rbody.len().to_string()
        };
        let out = rewrite_head(&rhead, &[format!("Content-Length: {len}")]);
        conn.write_all(out.as_bytes()).await?;
        if method != "HEAD" {
            for chunk in rbody.chunks(64 * 1024) {
                pacer.pace(chunk.len(), knobs.bandwidth.load(Relaxed)).await;
                conn.write_all(chunk).await?;
            }
        }
    }
    Ok(())
}
