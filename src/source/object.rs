//! The object-store source: a bucket (or container) and a key prefix of S3,
//! GCS or Azure Blob Storage, read through the `object_store` crate, behind
//! the same [`Source`] trait as a directory.
//!
//! Directories are the `/`-separated prefixes of the keys: one paged
//! listing (delimiter `/`: S3's ListObjectsV2, GCS's XML list, Azure's List
//! Blobs) per directory gives its files with their size, last-modified time
//! and ETag, so no HEAD is sent per open. A file's
//! version is its size, its last-modified time (whole seconds: the only
//! precision both a listing and a GET's headers carry) and, in `ino`, a
//! 64-bit hash of its ETag, or of its time where the store's listings carry
//! no ETag (s3s-fs; [`no_etag_ino`]). A GET's answer is compared with the
//! version on what both carry ([`same_version`]): the size always, the ETag
//! when both have one, else the time at whole seconds. The first GET of a
//! version without an ETag remembers the one it got, and every ranged GET
//! sends `If-Match` with the ETag this source knows for the version (a
//! bounded table) and checks the answer's against it, so a store that
//! ignores `If-Match` (s3s-fs) is still caught: a replaced object fails the
//! read with [`SourceError::Changed`], never mixing old and new bytes.
//! (What no store can tell: an object replaced by one of the same size in
//! the same second, before the first GET of it, on a store whose listings
//! carry no ETag.)
//!
//! The crate is async and needs a tokio runtime; the trait's synchronous
//! methods are called from the source guard's plain threads. So this source
//! owns a small runtime of its own and its synchronous methods wait on a
//! task spawned there: nothing here blocks a tokio worker of the mount.
//!
//! Which kind of store it reads is known here only, where the client is
//! built (the URL's scheme, `--endpoint`, and emulator settings such as
//! Azurite's: see [`ObjectSpec::build`]) and where a listing is continued
//! past a refused key ([`Resume`]).
//!
//! Its HTTP client is object_store's own, wrapped to count the store's
//! answers asking to slow down (503, 429): object_store retries them with
//! backoff, and the count tells read-ahead to cut its concurrency.
//!
//! It must never write to the store, never return bytes whose ETag it did not
//! check, and never name a key that is not a valid file name (such keys are
//! skipped with one warning each and counted, and the rest of their listing
//! page is still listed).

use std::collections::{BTreeMap, HashSet};
use std::ffi::OsString;
use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use object_store::list::{PaginatedListOptions, PaginatedListStore};
use object_store::path::Path as Key;
use object_store::{GetOptions, ObjectMeta, ObjectStore, ObjectStoreExt};
use tracing::warn;

use super::{EntryKind, Source, SourceAttr, SourceError, SourceVersion};

/// Which object store a URL names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    /// `s3://bucket/prefix` (AWS S3 or any S3-compatible store).
    S3,
    /// `gs://bucket/prefix` (Google Cloud Storage).
    Gcs,
    /// `az://container/prefix` (Azure Blob Storage).
    Azure,
}

/// Where an object data set lives and how to reach it: the URL's parts and
/// the options that go with it (`--endpoint`, `--region`,
/// `--no-sign-request`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectSpec {
    pub scheme: Scheme,
    pub bucket: String,
    /// The key prefix without leading or trailing `/` ("" for the bucket's
    /// root).
    pub prefix: String,
    pub endpoint: Option<String>,
    pub region: Option<String>,
    pub no_sign_request: bool,
    /// s3:// only: keys from an AWS profile (`--profile`, `AWS_PROFILE`),
    /// written in it or printed by its `credential_process`, signing
    /// instead of those of the environment (see
    /// [`aws_profile`](super::aws_profile)).
    pub keys: Option<super::aws_profile::ProfileKeys>,
}

/// Whether a SOURCE argument is an object-store URL rather than a path.
pub fn is_object_url(s: &str) -> bool {
    ["s3://", "gs://", "az://"].iter().any(|p| s.starts_with(p))
}

impl ObjectSpec {
    /// Parses `s3://bucket/prefix` (or gs://, az://). The prefix is
    /// normalized (no leading, trailing or doubled `/`); an empty bucket, or
    /// a `.` or `..` in the prefix, is refused with a sentence saying so.
    pub fn parse(url: &str) -> Result<ObjectSpec, String> {
        let (scheme, rest) = if let Some(r) = url.strip_prefix("s3://") {
            (Scheme::S3, r)
        } else if let Some(r) = url.strip_prefix("gs://") {
            (Scheme::Gcs, r)
        } else if let Some(r) = url.strip_prefix("az://") {
            (Scheme::Azure, r)
        } else {
            return Err(format!(
                "{url}: not an object-store URL (s3://, gs:// or az://)"
            ));
        };
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        let what = if scheme == Scheme::Azure {
            "container"
        } else {
            "bucket"
        };
        if bucket.is_empty() {
            return Err(format!("{url}: no {what} name"));
        }
        if !bucket
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            return Err(format!("{url}: {bucket:?} is not a valid {what} name"));
        }
        let mut parts = Vec::new();
        for seg in prefix.split('/').filter(|s| !s.is_empty()) {
            if seg == "." || seg == ".." {
                return Err(format!("{url}: the prefix may not contain '.' or '..'"));
            }
            parts.push(seg);
        }
        Ok(ObjectSpec {
            scheme,
            bucket: bucket.to_owned(),
            prefix: parts.join("/"),
            endpoint: None,
            region: None,
            no_sign_request: false,
            keys: None,
        })
    }

    /// The normalized URL (`s3://bucket/prefix`), as the mount names its
    /// source.
    pub fn url(&self) -> String {
        let s = match self.scheme {
            Scheme::S3 => "s3",
            Scheme::Gcs => "gs",
            Scheme::Azure => "az",
        };
        if self.prefix.is_empty() {
            format!("{s}://{}", self.bucket)
        } else {
            format!("{s}://{}/{}", self.bucket, self.prefix)
        }
    }

    /// What names the data set for its cache directory: the URL and the
    /// endpoint (the same bucket name at two endpoints is two data sets).
    /// Region and credentials are left out: they do not change the bytes.
    pub fn identity(&self) -> String {
        match &self.endpoint {
            Some(e) => format!("{} @ {}", self.url(), e.trim_end_matches('/')),
            None => self.url(),
        }
    }

    /// The store client for this spec: credentials from the provider's
    /// standard chain (environment, web identity, instance metadata), or
    /// the profile's keys (`keys`), none with `no_sign_request`. `timeout`
    /// bounds each HTTP request and the retries of one call (throttling
    /// answers are retried with backoff). A profile's `credential_process`
    /// is run here, once, before any request (within its own deadline):
    /// a failure is one line naming the profile and the command.
    pub fn build(&self, timeout: Duration) -> Result<Built, String> {
        use object_store::{ClientOptions, RetryConfig};
        // object_store's HTTP client (rustls) and the peer cache (quinn, on
        // ring) bring two crypto providers: name one for the process before
        // any TLS configuration is built.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let throttled = Arc::new(AtomicU64::new(0));
        let bad_replies = Arc::new(AtomicU64::new(0));
        let w = Wiring {
            connector: ThrottleWatch {
                throttled: Arc::clone(&throttled),
                bad_replies: Arc::clone(&bad_replies),
            },
            client: ClientOptions::new()
                .with_timeout(timeout)
                .with_connect_timeout(timeout.min(Duration::from_secs(10)))
                .with_allow_http(true),
            retry: RetryConfig {
                retry_timeout: timeout,
                ..RetryConfig::default()
            },
        };
        let built = match self.scheme {
            Scheme::S3 => self.build_s3(w)?,
            Scheme::Gcs => self.build_gcs(w)?,
            Scheme::Azure => self.build_azure(w)?,
        };
        Ok(Built {
            store: built.store,
            paged: built.paged,
            throttled,
            bad_replies,
            resume: built.resume,
        })
    }

    fn build_s3(&self, w: Wiring) -> Result<Store, String> {
        let err = |e: object_store::Error| format!("{}: {e}", self.url());
        let mut b = s3_builder_from_env(self.keys.is_some())
            .with_bucket_name(&self.bucket)
            .with_client_options(w.client)
            .with_http_connector(w.connector)
            .with_retry(w.retry)
            .with_skip_signature(self.no_sign_request);
        if let Some(r) = &self.region {
            b = b.with_region(r);
        }
        use super::aws_profile::ProfileKeys;
        match &self.keys {
            None => {}
            Some(ProfileKeys::Static(k)) => {
                b = b
                    .with_access_key_id(&k.access_key_id)
                    .with_secret_access_key(&k.secret_access_key);
                if let Some(t) = &k.session_token {
                    b = b.with_token(t);
                }
            }
            // Unsigned requests use no credentials: the command is
            // not run (apply_profile leaves no keys then anyway).
            Some(ProfileKeys::Process(_)) if self.no_sign_request => {}
            Some(ProfileKeys::Process(p)) => {
                let c = super::credential_process::ProcessCredentials::start(p.clone())?;
                b = b.with_credentials(Arc::new(c));
            }
        }
        if let Some(e) = &self.endpoint {
            b = b.with_endpoint(e).with_allow_http(e.starts_with("http://"));
        }
        let s = Arc::new(b.build().map_err(err)?);
        Ok(Store {
            store: Arc::clone(&s) as Arc<dyn ObjectStore>,
            paged: s as Arc<dyn PaginatedListStore>,
            resume: Resume::StartAfter,
        })
    }

    fn build_gcs(&self, w: Wiring) -> Result<Store, String> {
        if self.region.is_some() {
            return Err(format!("{}: --region is for s3:// only", self.url()));
        }
        let mut b = object_store::gcp::GoogleCloudStorageBuilder::from_env()
            .with_bucket_name(&self.bucket)
            .with_client_options(w.client)
            .with_http_connector(w.connector)
            .with_retry(w.retry)
            .with_skip_signature(self.no_sign_request);
        if let Some(e) = &self.endpoint {
            b = b.with_config(object_store::gcp::GoogleConfigKey::BaseUrl, e);
        }
        let s = Arc::new(b.build().map_err(|e| gcs_build_error(&self.url(), &e))?);
        Ok(Store {
            store: Arc::clone(&s) as Arc<dyn ObjectStore>,
            paged: s as Arc<dyn PaginatedListStore>,
            resume: Resume::StartAfter,
        })
    }

    fn build_azure(&self, w: Wiring) -> Result<Store, String> {
        let err = |e: object_store::Error| format!("{}: {e}", self.url());
        if self.region.is_some() {
            return Err(format!("{}: --region is for s3:// only", self.url()));
        }
        use object_store::azure::AzureConfigKey as K;
        let mut b = object_store::azure::MicrosoftAzureBuilder::from_env()
            .with_container_name(&self.bucket)
            .with_client_options(w.client)
            .with_http_connector(w.connector)
            .with_retry(w.retry)
            .with_skip_signature(self.no_sign_request);
        // Azurite (AZURE_STORAGE_USE_EMULATOR=true) names the account
        // in the path, not the host, and its listing continues
        // from a marker that is a blob name (it ignores startFrom).
        let emulator = b.get_config_value(&K::UseEmulator).is_some_and(|v| {
            matches!(
                v.to_ascii_lowercase().as_str(),
                "true" | "1" | "yes" | "y" | "on"
            )
        });
        if let Some(e) = &self.endpoint {
            let e = e.trim_end_matches('/');
            if emulator {
                // object_store takes an emulator's address only from
                // AZURITE_BLOB_STORAGE_URL; --endpoint is the same
                // address: the account's URL is it plus the account,
                // with the emulator's well-known account and key
                // unless others are set.
                let account = b
                    .get_config_value(&K::AccountName)
                    .unwrap_or_else(|| AZURITE_ACCOUNT.to_owned());
                if b.get_config_value(&K::AccessKey).is_none()
                    && b.get_config_value(&K::SasKey).is_none()
                    && b.get_config_value(&K::Token).is_none()
                {
                    b = b.with_access_key(AZURITE_KEY);
                }
                b = b
                    .with_use_emulator(false)
                    .with_account(&account)
                    .with_endpoint(format!("{e}/{account}"));
            } else {
                b = b.with_endpoint(e.to_owned());
            }
            b = b.with_allow_http(e.starts_with("http://"));
        }
        let s = Arc::new(b.build().map_err(|e| {
            if e.to_string().contains("Account must be specified") {
                format!(
                    "{}: no storage account: set AZURE_STORAGE_ACCOUNT_NAME \
                     (and a key, SAS or identity), or AZURE_STORAGE_USE_EMULATOR=true \
                     for Azurite: see docs/objstore.md",
                    self.url()
                )
            } else {
                err(e)
            }
        })?);
        Ok(Store {
            store: Arc::clone(&s) as Arc<dyn ObjectStore>,
            paged: s as Arc<dyn PaginatedListStore>,
            resume: if emulator {
                Resume::Marker
            } else {
                Resume::StartAfter
            },
        })
    }
}

/// What every store client is built with: the HTTP client's options
/// (timeouts), the retries, and the connector that watches each answer.
struct Wiring {
    client: object_store::ClientOptions,
    connector: ThrottleWatch,
    retry: object_store::RetryConfig,
}

/// A store client as one scheme builds it.
struct Store {
    store: Arc<dyn ObjectStore>,
    paged: Arc<dyn PaginatedListStore>,
    resume: Resume,
}

/// The variables naming GCS credentials (a service-account file or key,
/// application default credentials), as object_store reads them.
const GCS_CREDENTIAL_VARS: &[&str] = &[
    "GOOGLE_SERVICE_ACCOUNT",
    "GOOGLE_SERVICE_ACCOUNT_PATH",
    "GOOGLE_SERVICE_ACCOUNT_KEY",
    "GOOGLE_APPLICATION_CREDENTIALS",
];

/// A gs:// client that cannot be built (a service-account file that is
/// missing, not JSON, or holds a key that is not one): one line naming the
/// variables that give the credentials (the files they name; never a key's
/// text) and what object_store said.
fn gcs_build_error(url: &str, e: &object_store::Error) -> String {
    let text = one_line(e);
    let text = text
        .trim_start_matches("Generic GCS error: ")
        .trim_start_matches("GCP credential error: ");
    let named: Vec<String> = GCS_CREDENTIAL_VARS
        .iter()
        .filter_map(|k| {
            let v = std::env::var(k).ok().filter(|v| !v.is_empty())?;
            Some(if k.ends_with("_KEY") {
                format!("{k} (a key of {} bytes)", v.len())
            } else {
                format!("{k}={v}")
            })
        })
        .collect();
    if named.is_empty() {
        format!("{url}: {text}")
    } else {
        format!(
            "{url}: the credentials of {} cannot be used (see docs/objstore.md): {}",
            named.join(" and "),
            short(text)
        )
    }
}

/// object_store's S3 client configured from the `AWS_*` environment (as
/// `AmazonS3Builder::from_env`), without its keys and session token when
/// a profile's keys sign instead: an `AWS_SESSION_TOKEN` of the
/// environment must not go with another key.
fn s3_builder_from_env(without_keys: bool) -> object_store::aws::AmazonS3Builder {
    use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey as K};
    let mut b = AmazonS3Builder::new();
    for (k, v) in std::env::vars_os() {
        let (Some(k), Some(v)) = (k.to_str(), v.to_str()) else {
            continue;
        };
        if !k.starts_with("AWS_") {
            continue;
        }
        if let Ok(key) = k.to_ascii_lowercase().parse::<K>() {
            if without_keys && matches!(key, K::AccessKeyId | K::SecretAccessKey | K::Token) {
                continue;
            }
            b = b.with_config(key, v);
        }
    }
    b
}

/// Azurite's well-known account and key (public: the same in every
/// install; see Microsoft's Azurite documentation).
const AZURITE_ACCOUNT: &str = "devstoreaccount1";
const AZURITE_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

/// How a listing is continued from a position of the source's choosing
/// (past a key that cannot be a name; see `list_dir`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resume {
    /// The store takes a start-after position (S3's `start-after`, GCS's,
    /// Azure's `startFrom`).
    StartAfter,
    /// The store ignores that, but its continuation marker is the last key
    /// listed, so the position is sent as the marker (Azurite).
    Marker,
}

/// A store client and its page-at-a-time listing (a listing that reports
/// progress to the guard after each page).
pub struct Built {
    pub store: Arc<dyn ObjectStore>,
    pub paged: Arc<dyn PaginatedListStore>,
    /// Answers of the store asking to slow down, counted by its HTTP client.
    pub throttled: Arc<AtomicU64>,
    /// Answers refused as malformed (see [`ReplyCheck`]), counted by its
    /// HTTP client and by the reads and listings that find them.
    pub bad_replies: Arc<AtomicU64>,
    /// How its listing continues from a position of the source's choosing.
    pub resume: Resume,
}

/// The store's HTTP client (object_store's own, reqwest) with two
/// additions. It counts the answers that ask to slow down (503, as S3's
/// SlowDown and GCS's and Azure's ServerBusy, and 429) before
/// object_store's retry loop sees them: object_store backs off and retries
/// them itself; the count tells read-ahead to lower its concurrency (see
/// `throttled_responses`). And it checks each answer's length before its
/// body is read ([`ReplyCheck`]).
#[derive(Debug)]
struct ThrottleWatch {
    throttled: Arc<AtomicU64>,
    bad_replies: Arc<AtomicU64>,
}

impl object_store::client::HttpConnector for ThrottleWatch {
    fn connect(
        &self,
        options: &object_store::ClientOptions,
    ) -> object_store::Result<object_store::client::HttpClient> {
        use object_store::client::{HttpClient, ReqwestConnector};
        let inner = ReqwestConnector::default().connect(options)?;
        Ok(HttpClient::new(Watched {
            inner,
            throttled: Arc::clone(&self.throttled),
            bad_replies: Arc::clone(&self.bad_replies),
        }))
    }
}

#[derive(Debug)]
struct Watched {
    inner: object_store::client::HttpClient,
    throttled: Arc<AtomicU64>,
    bad_replies: Arc<AtomicU64>,
}

/// The most bytes of an answer that is not a ranged GET's data (a listing
/// page, an error's text) read into memory: a page of 1,000 keys of the
/// longest allowed (1,024 bytes, each character escaped in the XML) and
/// their properties is under 8 MiB. A longer body fails its request.
pub const MAX_REPLY_BODY: u64 = 16 << 20;

/// What an answer's length must be, from what was asked: a ranged GET's
/// data (206) exactly the range; a HEAD's, nothing (it has no body: its
/// `Content-Length` is the object's size); anything else at most
/// [`MAX_REPLY_BODY`].
/// A store that declares another length (`Content-Length`) is refused
/// before a byte of the body is read, and not asked again (object_store
/// retries transport errors, not a refused answer: `HttpErrorKind::Decode`).
/// A body without a declared length is cut where it passes its bound: a
/// ranged GET's by the read that collects it (`collect_range`), any other
/// by [`Capped`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ReplyCheck {
    /// Exactly this many bytes.
    Exactly(u64),
    /// At most this many.
    AtMost(u64),
    /// No body (a HEAD): its declared length is the object's.
    NoBody,
}

impl ReplyCheck {
    /// The check for an answer of `status` to a request (a HEAD or not)
    /// whose `Range` header asked for `asked` bytes ([`range_len`]).
    fn of(head: bool, asked: Option<u64>, status: u16) -> ReplyCheck {
        match asked {
            _ if head => ReplyCheck::NoBody,
            Some(n) if status == 206 => ReplyCheck::Exactly(n),
            _ => ReplyCheck::AtMost(MAX_REPLY_BODY),
        }
    }

    /// Why an answer declaring `declared` bytes is refused, if it is.
    fn refuses(self, declared: u64) -> Option<String> {
        match self {
            ReplyCheck::Exactly(n) if declared != n => Some(format!(
                "a ranged GET of {n} bytes was answered with a body of {declared}"
            )),
            ReplyCheck::AtMost(n) if declared > n => Some(format!(
                "an answer declared a body of {declared} bytes, more than the {n} allowed"
            )),
            _ => None,
        }
    }
}

/// The length of a `Range: bytes=A-B` header's range (B - A + 1); None for
/// any other form (object_store sends only that one for a bounded range).
fn range_len(h: &str) -> Option<u64> {
    let (a, b) = h.trim().strip_prefix("bytes=")?.split_once('-')?;
    let (a, b): (u64, u64) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
    b.checked_sub(a)?.checked_add(1)
}

/// A malformed answer of the store (its length is not what was asked).
#[derive(Debug, thiserror::Error)]
#[error("malformed answer of the store: {0}")]
struct BadReply(String);

/// At most one line a minute about malformed answers (each is counted in
/// `source_bad_replies`).
static BAD_REPLIES: crate::obs::logging::RateLimit = crate::obs::logging::RateLimit::new(60_000);

/// Counts a malformed answer and logs it (at most once a minute).
fn bad_reply(count: &AtomicU64, what: &str) {
    count.fetch_add(1, Relaxed);
    if let Some(more) = BAD_REPLIES.allow() {
        warn!(
            "object store: {what}; that request failed (EIO) and the store is not trusted \
             for it ({more} more such answers not logged; counted in source_bad_replies)"
        );
    }
}

#[async_trait::async_trait]
impl object_store::client::HttpService for Watched {
    async fn call(
        &self,
        req: object_store::client::HttpRequest,
    ) -> Result<object_store::client::HttpResponse, object_store::client::HttpError> {
        use object_store::client::{HttpError, HttpErrorKind, HttpResponseBody};
        let head = req.method().as_str() == "HEAD";
        let asked = req
            .headers()
            .get("range")
            .and_then(|v| v.to_str().ok())
            .and_then(range_len);
        let resp = self.inner.execute(req).await?;
        let s = resp.status().as_u16();
        if s == 503 || s == 429 {
            self.throttled.fetch_add(1, Relaxed);
        }
        let check = ReplyCheck::of(head, asked, s);
        let declared = resp
            .headers()
            .get("content-length")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        if let Some(why) = declared.and_then(|d| check.refuses(d)) {
            bad_reply(&self.bad_replies, &why);
            return Err(HttpError::new(HttpErrorKind::Decode, BadReply(why)));
        }
        match check {
            // Collected by the read, which stops at the range's end; a
            // HEAD's body is empty whatever it declares (hyper reads none).
            ReplyCheck::Exactly(_) | ReplyCheck::NoBody => Ok(resp),
            ReplyCheck::AtMost(n) => Ok(resp.map(|body| {
                HttpResponseBody::new(Capped {
                    inner: body,
                    left: n,
                    bad_replies: Arc::clone(&self.bad_replies),
                })
            })),
        }
    }
}

/// A body cut at its bound: past it, an error (a `Decode` error, which
/// object_store does not retry) instead of more bytes. Its size hint is
/// never above the bound, so that nothing is allocated for a length the
/// store only claims.
struct Capped {
    inner: object_store::client::HttpResponseBody,
    left: u64,
    bad_replies: Arc<AtomicU64>,
}

impl http_body::Body for Capped {
    type Data = Bytes;
    type Error = object_store::client::HttpError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        use object_store::client::{HttpError, HttpErrorKind};
        use std::task::Poll;
        let frame = std::pin::Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(f))) = &frame {
            let n = f.data_ref().map_or(0, |d| d.len() as u64);
            if n > self.left {
                self.left = 0;
                let why = format!("an answer's body passed {MAX_REPLY_BODY} bytes");
                bad_reply(&self.bad_replies, &why);
                return Poll::Ready(Some(Err(HttpError::new(
                    HttpErrorKind::Decode,
                    BadReply(why),
                ))));
            }
            self.left -= n;
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        let inner = self.inner.size_hint();
        let mut h = http_body::SizeHint::new();
        h.set_lower(inner.lower().min(self.left));
        h.set_upper(inner.upper().unwrap_or(self.left).min(self.left));
        h
    }
}

/// Collects a ranged GET's body of exactly `len` bytes, reading no byte
/// past them: a body that goes on past `len` fails at its first byte too
/// many, one that ends short fails at its end (both counted in `bad`), so
/// at most `len` bytes (the block the reader asked for, counted in
/// `--prefetch-memory`) plus one network frame are ever held.
async fn collect_range(
    mut body: futures::stream::BoxStream<'static, object_store::Result<Bytes>>,
    len: usize,
    bad: &AtomicU64,
) -> Result<Bytes, RangeError> {
    let mut got: Option<Bytes> = None;
    let mut buf: Option<bytes::BytesMut> = None;
    let mut have = 0usize;
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(RangeError::Store)?;
        if chunk.len() > len - have {
            let why = format!(
                "a ranged GET of {len} bytes was answered with more ({} at least)",
                have + chunk.len()
            );
            bad_reply(bad, &why);
            return Err(RangeError::Bad);
        }
        have += chunk.len();
        // One chunk (the common case) is kept as it is; more are copied
        // into one buffer of the range's size.
        match (got.take(), buf.as_mut()) {
            (None, None) => got = Some(chunk),
            (Some(first), None) => {
                let mut b = bytes::BytesMut::with_capacity(len);
                b.extend_from_slice(&first);
                b.extend_from_slice(&chunk);
                buf = Some(b);
            }
            (_, Some(b)) => b.extend_from_slice(&chunk),
        }
    }
    if have != len {
        let why = format!("a ranged GET of {len} bytes was answered with {have}");
        bad_reply(bad, &why);
        return Err(RangeError::Bad);
    }
    Ok(buf.map_or_else(|| got.unwrap_or_default(), bytes::BytesMut::freeze))
}

/// Why a ranged GET's body was not collected.
#[derive(Debug)]
enum RangeError {
    Store(object_store::Error),
    /// The body was refused (counted and logged by `collect_range`).
    Bad,
}

/// ETags this source has seen, by path and version, for the `If-Match` of
/// the GETs that follow: bounded (a miss only means the GET goes without
/// `If-Match`, and its answer's ETag is still checked).
const ETAGS_KEPT: u64 = 64 * 1024;

/// One S3 ListObjectsV2 page holds at most 1000 keys.
const PAGE_KEYS: usize = 1000;

/// Listing pages of one directory refused for keys that cannot be names
/// before its listing fails (each such key costs about 10: see `list_dir`).
const MAX_REFUSED_PAGES: usize = 10_000;

/// The most entries one directory's listing may hold (files and
/// subdirectories): a flat prefix of ten million objects lists (ten
/// thousand pages, each restarting the guard's deadline); past that the
/// listing fails (EIO) with a line in the log saying so. While it runs a
/// listing holds about 200 bytes per entry (the store's answer, then the
/// names and attributes), 2 GB at this bound.
pub const LIST_MAX_ENTRIES: usize = 10_000_000;

/// The longest one directory's listing may take, all its pages together:
/// the guard's deadline restarts at every page (a long listing that
/// advances is not a stall), so without this a store that keeps sending
/// pages would hold a listing, and the `ls` waiting on it, for ever. Ten
/// million entries at S3's pace of about five pages of 1,000 a second take
/// about half of it.
pub const LIST_MAX_TIME: Duration = Duration::from_secs(3600);

/// Why a listing was stopped by its [`ListingBounds`].
#[derive(Debug, PartialEq, Eq)]
pub enum ListingStop {
    /// The store sent a continuation token (or position) it had sent
    /// before in this listing: it would never end.
    Repeated { page: usize },
    /// More than [`LIST_MAX_ENTRIES`].
    TooManyEntries { entries: usize, max: usize },
    /// Longer than [`LIST_MAX_TIME`].
    TooLong { pages: usize, max: Duration },
}

impl std::fmt::Display for ListingStop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ListingStop::Repeated { page } => write!(
                f,
                "the store's page {page} asked to continue from where an earlier page did \
                 (a repeated continuation token): the listing would never end"
            ),
            ListingStop::TooManyEntries { entries, max } => write!(
                f,
                "the listing passed {entries} entries, more than the {max} locafs lists \
                 in one directory (docs/objstore.md, \"Listing bounds\")"
            ),
            ListingStop::TooLong { pages, max } => write!(
                f,
                "the listing took longer than {}s ({pages} pages), the most locafs waits \
                 for one directory (docs/objstore.md, \"Listing bounds\")",
                max.as_secs()
            ),
        }
    }
}

/// The bounds of one directory's listing, whatever the store answers
/// (pure: the caller passes the time): no page may ask to continue from a
/// position an earlier page did (a repeated token is a loop), the pages
/// together hold at most `max_entries` and take at most `max_time`. The
/// same for S3, GCS and Azure: each page's continuation token is seen here
/// (object_store's `PaginatedListStore`).
#[derive(Debug)]
pub struct ListingBounds {
    started: std::time::Instant,
    max_entries: usize,
    max_time: Duration,
    entries: usize,
    pages: usize,
    /// Every position a page asked to continue from (a token, or a
    /// start-after key of ours), in this listing, by its 64-bit hash (a
    /// store's tokens can be long; a collision only stops a listing as a
    /// loop, at odds of 2^-64 per pair).
    positions: HashSet<u64>,
}

impl ListingBounds {
    pub fn new(started: std::time::Instant, max_entries: usize, max_time: Duration) -> Self {
        ListingBounds {
            started,
            max_entries,
            max_time,
            entries: 0,
            pages: 0,
            positions: HashSet::new(),
        }
    }

    /// A page of `entries` came at `now`, asking to continue from `next`
    /// (None: the listing is complete).
    pub fn page(
        &mut self,
        entries: usize,
        next: Option<&str>,
        now: std::time::Instant,
    ) -> Result<(), ListingStop> {
        self.pages += 1;
        self.entries = self.entries.saturating_add(entries);
        if self.entries > self.max_entries {
            return Err(ListingStop::TooManyEntries {
                entries: self.entries,
                max: self.max_entries,
            });
        }
        if let Some(next) = next {
            if !self
                .positions
                .insert(xxhash_rust::xxh3::xxh3_64(next.as_bytes()))
            {
                return Err(ListingStop::Repeated { page: self.pages });
            }
        }
        if now.saturating_duration_since(self.started) > self.max_time {
            return Err(ListingStop::TooLong {
                pages: self.pages,
                max: self.max_time,
            });
        }
        Ok(())
    }
}

/// At most one line a minute about listings stopped by their bounds.
static LISTING_STOPS: crate::obs::logging::RateLimit = crate::obs::logging::RateLimit::new(60_000);

/// A data set in an object store (see the module comment).
pub struct ObjectSource {
    store: Arc<dyn ObjectStore>,
    paged: Arc<dyn PaginatedListStore>,
    /// See [`Resume`].
    resume: Resume,
    /// The data set's key prefix, without a trailing `/`.
    prefix: String,
    label: String,
    /// The source's own runtime (see the module comment); shut down in the
    /// background when the source is dropped, wherever that happens.
    rt: Option<tokio::runtime::Runtime>,
    /// ETags seen, by path, `ino` and size: versions whose listing carried
    /// no ETag share one `ino` per second ([`no_etag_ino`]), so the size
    /// keeps a same-second replacement of another size from being asked
    /// with its predecessor's ETag.
    etags: moka::sync::Cache<(PathBuf, u64, u64), Arc<str>>,
    /// Keys skipped because they cannot be file names, each warned about
    /// once.
    warned: parking_lot::Mutex<HashSet<String>>,
    skipped: AtomicU64,
    /// See [`ThrottleWatch`].
    throttled: Arc<AtomicU64>,
    /// See [`Built::bad_replies`].
    bad_replies: Arc<AtomicU64>,
    /// Whether the store's listings carry ETags: [`LISTINGS_UNKNOWN`] until a
    /// listing showed an object (a HEAD's answer asks one first:
    /// `settle_listing_etags`). A HEAD's attributes follow the listings'
    /// rule, so that both name a version alike.
    listing_etags: std::sync::atomic::AtomicU8,
}

const LISTINGS_UNKNOWN: u8 = 0;
const LISTINGS_HAVE_ETAGS: u8 = 1;
const LISTINGS_LACK_ETAGS: u8 = 2;

impl Drop for ObjectSource {
    fn drop(&mut self) {
        // Dropping a runtime blocks, which tokio refuses inside another
        // runtime (the mount's may drop the last reference).
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// What a failed probe of the store at mount time says.
#[derive(Debug)]
pub enum ProbeError {
    /// One line naming the problem (a missing bucket, refused credentials,
    /// a URL or client that cannot be built).
    Refused(String),
    /// The store did not answer (no connection, no answer in time): a
    /// mount that has a saved tree and cache may start from them
    /// ([`ObjectSource::unprobed`]).
    Unreachable(String),
}

impl std::fmt::Display for ProbeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProbeError::Refused(s) | ProbeError::Unreachable(s) => f.write_str(s),
        }
    }
}

impl ObjectSource {
    /// The source without the probe, for a mount that starts from its saved
    /// tree while the store does not answer.
    pub fn unprobed(spec: &ObjectSpec, timeout: Duration) -> Result<ObjectSource, String> {
        let built = spec.build(timeout)?;
        ObjectSource::new(built, &spec.prefix, &spec.url())
            .map_err(|e| format!("{}: {e}", spec.url()))
    }

    /// Builds the client and asks the store for the first page of the data
    /// set's root, once, within `probe_timeout`: a bucket that does not
    /// exist, refused credentials or an endpoint that does not answer are
    /// found here, before anything is mounted.
    pub fn open(
        spec: &ObjectSpec,
        timeout: Duration,
        probe_timeout: Duration,
    ) -> Result<ObjectSource, ProbeError> {
        let built = spec.build(timeout).map_err(ProbeError::Refused)?;
        let src = ObjectSource::new(built, &spec.prefix, &spec.url())
            .map_err(|e| ProbeError::Refused(format!("{}: {e}", spec.url())))?;
        let paged = Arc::clone(&src.paged);
        let prefix = src.prefix.clone();
        let probe = async move {
            let p = key_prefix(&prefix, Path::new(""));
            // A key that cannot be a name is still an answer: the bucket
            // is there and the credentials are taken.
            any_key_under(&*paged, p.as_deref()).await.map(|_| ())
        };
        let what = match spec.scheme {
            Scheme::Azure => "container",
            _ => "bucket",
        };
        let r = src.run(async move { tokio::time::timeout(probe_timeout, probe).await });
        let where_ = spec
            .endpoint
            .as_deref()
            .map(|e| format!(" at {e}"))
            .unwrap_or_default();
        match r {
            Ok(Ok(Ok(()))) => Ok(src),
            Ok(Ok(Err(e))) => Err({
                let text = one_line(&e);
                let missing = matches!(e, object_store::Error::NotFound { .. })
                    || [
                        "NoSuchBucket",
                        "ContainerNotFound",
                        "The specified bucket does not exist",
                        // fake-gcs-server (a GCS emulator) answers a
                        // missing bucket's listing with a 500 saying so.
                        "no bucket named",
                    ]
                    .iter()
                    .any(|c| text.contains(c));
                let refused = matches!(
                    e,
                    object_store::Error::Unauthenticated { .. }
                        | object_store::Error::PermissionDenied { .. }
                ) || [
                    "InvalidAccessKeyId",
                    "SignatureDoesNotMatch",
                    "AccessDenied",
                    "403 Forbidden",
                    "401 Unauthorized",
                ]
                .iter()
                .any(|c| text.contains(c));
                if missing {
                    ProbeError::Refused(format!(
                        "{}: {what} {:?} does not exist{where_}",
                        spec.url(),
                        spec.bucket
                    ))
                } else if refused {
                    // The store's error code (Azure's AuthorizationFailure,
                    // S3's InvalidAccessKeyId) may sit past the cut.
                    let code = error_code(&text)
                        .map(|c| format!("{c}; "))
                        .unwrap_or_default();
                    ProbeError::Refused(format!(
                        "{}: the credentials were refused{where_} ({code}see docs/objstore.md): {}",
                        spec.url(),
                        short(&text)
                    ))
                } else {
                    ProbeError::Unreachable(format!(
                        "{}: cannot list{where_}: {}",
                        spec.url(),
                        short(&text)
                    ))
                }
            }),
            Ok(Err(_)) => Err(ProbeError::Unreachable(format!(
                "{}: the store{where_} did not answer within {}s",
                spec.url(),
                probe_timeout.as_secs_f64()
            ))),
            Err(e) => Err(ProbeError::Refused(format!("{}: {e}", spec.url()))),
        }
    }

    /// A source over a built client (no request is sent).
    pub fn new(built: Built, prefix: &str, label: &str) -> io::Result<ObjectSource> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("locafs-objstore")
            .enable_all()
            .build()?;
        Ok(ObjectSource {
            store: built.store,
            paged: built.paged,
            resume: built.resume,
            prefix: prefix.trim_matches('/').to_owned(),
            label: label.to_owned(),
            rt: Some(rt),
            etags: moka::sync::Cache::new(ETAGS_KEPT),
            listing_etags: std::sync::atomic::AtomicU8::new(LISTINGS_UNKNOWN),
            warned: parking_lot::Mutex::new(HashSet::new()),
            skipped: AtomicU64::new(0),
            throttled: built.throttled,
            bad_replies: built.bad_replies,
        })
    }

    /// Runs `f` on this source's runtime and waits for it (from a plain
    /// thread: the source guard's).
    fn run<T: Send + 'static>(&self, f: impl Future<Output = T> + Send + 'static) -> io::Result<T> {
        let rt = self
            .rt
            .as_ref()
            .ok_or_else(|| io::Error::other("object source shut down"))?;
        let h = rt.spawn(f);
        futures::executor::block_on(h).map_err(io::Error::other)
    }

    /// Notes whether a listing showed an object with an ETag.
    fn note_listing_etags(&self, has: bool) {
        let v = if has {
            LISTINGS_HAVE_ETAGS
        } else {
            LISTINGS_LACK_ETAGS
        };
        self.listing_etags.store(v, Relaxed);
    }

    /// Whether the store's listings carry ETags, settled by one page of one
    /// key under the data set's root while no listing has shown an object
    /// yet (a key that cannot be a name, or none, leaves it unknown).
    fn settle_listing_etags(&self) -> io::Result<()> {
        if self.listing_etags.load(Relaxed) != LISTINGS_UNKNOWN {
            return Ok(());
        }
        let paged = Arc::clone(&self.paged);
        let root = key_prefix(&self.prefix, Path::new(""));
        let under = self.run(async move { any_key_under(&*paged, root.as_deref()).await })?;
        if let Under::Object { etag } = under.map_err(store_io)? {
            self.note_listing_etags(etag);
        }
        Ok(())
    }

    /// A HEAD's attributes, named as a listing of the same object would
    /// name them; the HEAD's ETag is remembered for the GETs' `If-Match`.
    /// Before any listing showed an object (a mount started from its saved
    /// tree stats before it lists), the listings' rule is settled first:
    /// else a store whose listings carry no ETag would see the version a
    /// HEAD named by its ETag as another than the one its listing names.
    fn head_attr(&self, rel: &Path, m: &ObjectMeta) -> io::Result<SourceAttr> {
        self.settle_listing_etags()?;
        let lacking = self.listing_etags.load(Relaxed) == LISTINGS_LACK_ETAGS;
        let a = if lacking {
            file_attr(&ObjectMeta {
                e_tag: None,
                ..m.clone()
            })
        } else {
            file_attr(m)
        };
        if let Some(e) = &m.e_tag {
            self.etags
                .insert((rel.to_owned(), a.ino, a.size), Arc::from(e.as_str()));
        }
        Ok(a)
    }

    /// The key of a path of the data set.
    fn key(&self, rel: &Path) -> io::Result<Key> {
        let s = key_prefix(&self.prefix, rel).unwrap_or_default();
        Key::parse(&s).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))
    }

    /// The error of a listing of `rel` stopped by its bounds (EIO), logged
    /// (at most once a minute); a repeated token is also counted as a bad
    /// answer of the store.
    fn listing_stopped(&self, rel: &Path, stop: ListingStop) -> io::Error {
        if matches!(stop, ListingStop::Repeated { .. }) {
            self.bad_replies.fetch_add(1, Relaxed);
        }
        let what = format!("{}: listing of {:?} stopped: {stop}", self.label, rel);
        if let Some(more) = LISTING_STOPS.allow() {
            warn!("{what} ({more} more such lines not logged)");
        }
        io::Error::other(what)
    }

    /// Skips `key` (warning once) because it cannot be a file name.
    fn skip(&self, key: &str, why: &str) {
        if self.warned.lock().insert(key.to_owned()) {
            self.skipped.fetch_add(1, Relaxed);
            warn!("{}: key {key:?} skipped: {why}", self.label);
        }
    }

    /// One directory: every page of a delimited listing of its prefix.
    fn list_dir(&self, rel: &Path, progress: &dyn Fn()) -> io::Result<Vec<(OsString, SourceAttr)>> {
        let dir = key_prefix(&self.prefix, rel).map(|p| format!("{p}/"));
        let mut files: Vec<ObjectMeta> = Vec::new();
        let mut dirs: Vec<Key> = Vec::new();
        // Where the next page starts: the store's continuation token,
        // or, once a page was refused for a key that cannot be a
        // name, a start-after position kept from the pages before.
        let mut token: Option<String> = None;
        let mut after: Option<String> = None;
        let mut recovering = false;
        let mut max_keys = PAGE_KEYS;
        let mut refused = 0usize;
        let mut bounds =
            ListingBounds::new(std::time::Instant::now(), LIST_MAX_ENTRIES, LIST_MAX_TIME);
        loop {
            let (paged, prefix) = (Arc::clone(&self.paged), dir.clone());
            // A position of ours goes as the store takes it (see Resume).
            let (page_token, offset) = match (token.take(), self.resume) {
                (Some(t), _) => (Some(t), None),
                (None, Resume::StartAfter) => (None, after.clone()),
                (None, Resume::Marker) => (after.clone(), None),
            };
            let page = self.run(async move {
                let opts = PaginatedListOptions {
                    delimiter: Some("/".into()),
                    max_keys: Some(max_keys),
                    offset,
                    page_token,
                    ..Default::default()
                };
                paged.list_paginated(prefix.as_deref(), opts).await
            })?;
            progress();
            let page = match page {
                Ok(p) => p,
                Err(object_store::Error::InvalidPath { source }) => {
                    // object_store refuses a whole page that holds
                    // one key it cannot parse (an empty, `.` or `..`
                    // segment). Ask again from the same place for
                    // half as many keys, until the page is that one
                    // key alone; then step past it.
                    let bad = bad_key(&source);
                    self.skip(&bad, "a segment is empty, '.' or '..'");
                    refused += 1;
                    if refused > MAX_REFUSED_PAGES {
                        return Err(io::Error::other(format!(
                            "{}: more than {MAX_REFUSED_PAGES} listing pages \
                             refused for keys that cannot be names",
                            self.label
                        )));
                    }
                    recovering = true;
                    if max_keys > 1 {
                        max_keys /= 2;
                    } else {
                        after = Some(past(&bad));
                        max_keys = PAGE_KEYS;
                    }
                    continue;
                }
                Err(e) => return Err(store_io(e)),
            };
            let dir_key = dir.as_deref().unwrap_or("").trim_end_matches('/');
            if let Some(end) = page_end(dir_key, &page.result) {
                if after.as_ref().is_none_or(|a| *a < end) {
                    after = Some(end);
                }
            }
            let entries = page.result.objects.len() + page.result.common_prefixes.len();
            files.extend(page.result.objects);
            dirs.extend(page.result.common_prefixes);
            // Where the next page starts: the store's token, or our own
            // position (each must be new, or the listing is a loop).
            let next = match page.page_token {
                Some(t) if !recovering => {
                    let at = format!("token {t}");
                    token = Some(t);
                    Some(at)
                }
                Some(_) => Some(format!("after {}", after.as_deref().unwrap_or(""))),
                None => None,
            };
            if let Err(stop) = bounds.page(entries, next.as_deref(), std::time::Instant::now()) {
                return Err(self.listing_stopped(rel, stop));
            }
            if next.is_none() {
                break;
            }
        }
        let dir_key = dir.as_deref().unwrap_or("").trim_end_matches('/');
        let mut out: BTreeMap<String, SourceAttr> = BTreeMap::new();
        for d in dirs {
            let Some(name) = child_name(dir_key, d.as_ref()) else {
                self.skip(d.as_ref(), "not a name under its directory");
                continue;
            };
            out.insert(name.to_owned(), dir_attr(d.as_ref()));
        }
        for f in files {
            let k = f.location.as_ref();
            // "dir/" (a directory marker) parses to the directory itself.
            if k == dir_key {
                continue;
            }
            let Some(name) = child_name(dir_key, k) else {
                self.skip(k, "not a name under its directory");
                continue;
            };
            if out.contains_key(name) {
                self.skip(k, "it is both an object and a prefix of other keys");
                continue;
            }
            self.note_listing_etags(f.e_tag.is_some());
            let a = file_attr(&f);
            if let Some(e) = &f.e_tag {
                self.etags
                    .insert((rel.join(name), a.ino, a.size), Arc::from(e.as_str()));
            }
            out.insert(name.to_owned(), a);
        }
        Ok(out
            .into_iter()
            .map(|(n, a)| (OsString::from(n), a))
            .collect())
    }
}

/// The key (or common prefix, ending in `/`) a refused listing page named.
fn bad_key(e: &object_store::path::Error) -> String {
    use object_store::path::Error as P;
    match e {
        P::EmptySegment { path } | P::BadSegment { path, .. } => path.clone(),
        other => other.to_string(),
    }
}

/// The start-after position just past `key`: past every key under it when
/// it is a common prefix (U+10FFFF sorts after every other character, in
/// UTF-8 bytes as S3 orders keys).
fn past(key: &str) -> String {
    if key.ends_with('/') {
        format!("{key}\u{10FFFF}")
    } else {
        key.to_owned()
    }
}

/// The start-after position past everything one page of directory
/// `dir_key` returned (object_store strips a key's trailing `/`, so a
/// directory marker and the common prefixes get theirs back).
fn page_end(dir_key: &str, page: &object_store::ListResult) -> Option<String> {
    let obj = page.objects.iter().map(|o| {
        let k = o.location.as_ref();
        if k == dir_key {
            format!("{k}/")
        } else {
            k.to_owned()
        }
    });
    let pre = page
        .common_prefixes
        .iter()
        .map(|p| past(&format!("{}/", p.as_ref())));
    obj.chain(pre).max()
}

/// What lies under a prefix, as one page of at most one key says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Under {
    /// No key.
    Nothing,
    /// An object, listed with an ETag or without.
    Object { etag: bool },
    /// A key that cannot be a name (object_store refuses its page).
    Other,
}

/// What lies under `prefix` (a key without its trailing `/`; None for the
/// whole bucket): one page of at most one key, never more (a store that
/// answers an empty page with a token is not followed).
async fn any_key_under(
    paged: &dyn PaginatedListStore,
    prefix: Option<&str>,
) -> object_store::Result<Under> {
    let prefix = prefix.map(|p| format!("{}/", p.trim_end_matches('/')));
    let opts = PaginatedListOptions {
        max_keys: Some(1),
        ..Default::default()
    };
    match paged.list_paginated(prefix.as_deref(), opts).await {
        Ok(page) => Ok(match page.result.objects.first() {
            Some(m) => Under::Object {
                etag: m.e_tag.is_some(),
            },
            None if page.result.common_prefixes.is_empty() => Under::Nothing,
            None => Under::Other,
        }),
        Err(object_store::Error::InvalidPath { .. }) => Ok(Under::Other),
        Err(e) => Err(e),
    }
}

/// `prefix/rel` without leading or trailing `/`; None for the bucket's root.
fn key_prefix(prefix: &str, rel: &Path) -> Option<String> {
    let rel = rel.to_string_lossy();
    let rel = rel.trim_matches('/');
    match (prefix.is_empty(), rel.is_empty()) {
        (true, true) => None,
        (true, false) => Some(rel.to_owned()),
        (false, true) => Some(prefix.to_owned()),
        (false, false) => Some(format!("{prefix}/{rel}")),
    }
}

/// The name of `key` as an entry of directory `dir` (keys without leading
/// or trailing `/`), if it is one plain name.
fn child_name<'a>(dir: &str, key: &'a str) -> Option<&'a str> {
    let rest = if dir.is_empty() {
        key
    } else {
        key.strip_prefix(dir)?.strip_prefix('/')?
    };
    let rest = rest.trim_end_matches('/');
    (!rest.is_empty() && !rest.contains('/') && rest != "." && rest != "..").then_some(rest)
}

/// A 64-bit hash of an ETag, quotes and weak marker left out (a listing and
/// a GET may quote it differently).
pub fn etag_hash(etag: &str) -> u64 {
    let t = etag.trim().trim_start_matches("W/").trim_matches('"');
    xxhash_rust::xxh3::xxh3_64(t.as_bytes())
}

/// The `ino` of a version whose listing carried no ETag (some stores):
/// the size and time stand for the version, and this hash of the time
/// (whole seconds, in ns) tells such a version from one named by its ETag.
pub fn no_etag_ino(mtime_ns: i64) -> u64 {
    xxhash_rust::xxh3::xxh3_64(&mtime_ns.to_le_bytes())
}

/// A time at whole seconds, in ns: the precision both a listing (ms or
/// finer) and a GET's `Last-Modified` header (seconds) carry.
fn whole_seconds_ns(t: &chrono::DateTime<chrono::Utc>) -> i64 {
    // (saturated past 2262: see `unix_ns`)
    super::unix_ns(t.timestamp(), 0)
}

/// Whether a GET's answer (`meta`) is the object of `version`, on what both
/// carry: the size always; the ETag when both have one (`known`: the ETag
/// this source saw for the version, from its listing, a HEAD or the first
/// GET; else the version's own `ino` when that is an ETag's hash); the
/// time at whole seconds otherwise.
pub fn same_version(version: &SourceVersion, known: Option<&str>, meta: &ObjectMeta) -> bool {
    if meta.size != version.size {
        return false;
    }
    let want = known
        .map(etag_hash)
        .or_else(|| (version.ino != no_etag_ino(version.mtime_ns)).then_some(version.ino));
    match (want, meta.e_tag.as_deref()) {
        (Some(w), Some(got)) => etag_hash(got) == w,
        _ => whole_seconds_ns(&meta.last_modified) == version.mtime_ns,
    }
}

fn file_attr(m: &ObjectMeta) -> SourceAttr {
    // Whole seconds: a GET's Last-Modified header has no more.
    let mtime_ns = whole_seconds_ns(&m.last_modified);
    let ino = match &m.e_tag {
        Some(e) => etag_hash(e),
        None => no_etag_ino(mtime_ns),
    };
    SourceAttr {
        kind: EntryKind::File,
        size: m.size,
        blocks: m.size.div_ceil(512),
        mode: libc::S_IFREG | 0o444,
        nlink: 1,
        uid: 0,
        gid: 0,
        rdev: 0,
        ino,
        atime_ns: mtime_ns,
        mtime_ns,
        ctime_ns: mtime_ns,
    }
}

fn dir_attr(key: &str) -> SourceAttr {
    SourceAttr {
        kind: EntryKind::Dir,
        size: 0,
        blocks: 0,
        mode: libc::S_IFDIR | 0o555,
        nlink: 2,
        uid: 0,
        gid: 0,
        rdev: 0,
        ino: xxhash_rust::xxh3::xxh3_64(key.as_bytes()),
        atime_ns: 0,
        mtime_ns: 0,
        ctime_ns: 0,
    }
}

/// A store error as the io::Error the trait speaks.
fn store_io(e: object_store::Error) -> io::Error {
    use object_store::Error as E;
    let kind = match &e {
        E::NotFound { .. } => io::ErrorKind::NotFound,
        E::PermissionDenied { .. } | E::Unauthenticated { .. } => io::ErrorKind::PermissionDenied,
        _ => io::ErrorKind::Other,
    };
    io::Error::new(kind, one_line(&e))
}

/// The `<Code>` of a store's XML error answer, if the text holds one.
fn error_code(text: &str) -> Option<&str> {
    let (_, rest) = text.split_once("<Code>")?;
    let (code, _) = rest.split_once("</Code>")?;
    let code = code.trim();
    (!code.is_empty() && code.len() < 64).then_some(code)
}

/// At most 300 characters of an error (a store's XML answer can be long).
fn short(s: &str) -> String {
    match s.char_indices().nth(300) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s.to_owned(),
    }
}

/// An error and its causes on one line.
fn one_line(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let t = c.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        cur = c.source();
    }
    s.replace('\n', " ")
}

impl Source for ObjectSource {
    fn stat(&self, rel: &Path) -> io::Result<SourceAttr> {
        let store = Arc::clone(&self.store);
        let prefix = key_prefix(&self.prefix, rel);
        let paged = Arc::clone(&self.paged);
        if rel.as_os_str().is_empty() {
            // The root: one page of one key says the store answers.
            let under = self.run(async move { any_key_under(&*paged, prefix.as_deref()).await })?;
            if let Under::Object { etag } = under.map_err(store_io)? {
                self.note_listing_etags(etag);
            }
            return Ok(dir_attr(""));
        }
        let key = self.key(rel)?;
        let r = self.run(async move {
            // Both at once (one round trip): a key that is an object and
            // also a prefix of other keys is a directory, as in a listing.
            let under = any_key_under(&*paged, Some(key.as_ref()));
            let (head, under) = tokio::join!(store.head(&key), under);
            match (head, under? != Under::Nothing) {
                (_, true) => Ok(None),
                (Ok(m), false) => Ok(Some(m)),
                (Err(e), false) => Err(e),
            }
        })?;
        match r.map_err(store_io)? {
            Some(m) => self.head_attr(rel, &m),
            None => Ok(dir_attr(prefix.as_deref().unwrap_or(""))),
        }
    }

    fn list(&self, rel: &Path) -> io::Result<Vec<(OsString, SourceAttr)>> {
        self.list_dir(rel, &|| {})
    }

    fn list_with_progress(
        &self,
        rel: &Path,
        progress: &dyn Fn(),
    ) -> io::Result<Vec<(OsString, SourceAttr)>> {
        self.list_dir(rel, progress)
    }

    fn read_link(&self, _: &Path) -> io::Result<PathBuf> {
        // An object store has no symlinks.
        Err(io::Error::from_raw_os_error(libc::EINVAL))
    }

    fn read_at(
        &self,
        rel: &Path,
        version: &SourceVersion,
        offset: u64,
        len: usize,
    ) -> Result<Bytes, SourceError> {
        let changed = || SourceError::Changed {
            path: rel.to_owned(),
        };
        if offset.saturating_add(len as u64) > version.size {
            return Err(changed());
        }
        if len == 0 {
            return Ok(Bytes::new());
        }
        let key = self.key(rel).map_err(|e| SourceError::io(rel, e))?;
        let known = self.etags.get(&(rel.to_owned(), version.ino, version.size));
        let if_match = known.as_ref().map(|e| e.to_string());
        let store = Arc::clone(&self.store);
        let bad = Arc::clone(&self.bad_replies);
        let range = offset..offset + len as u64;
        let r = self
            .run(async move {
                let opts = GetOptions {
                    if_match,
                    range: Some(range.into()),
                    ..Default::default()
                };
                let got = store
                    .get_opts(&key, opts)
                    .await
                    .map_err(RangeError::Store)?;
                let meta = got.meta.clone();
                let bytes = collect_range(got.into_stream(), len, &bad).await?;
                Ok::<_, RangeError>((meta, bytes))
            })
            .map_err(|e| SourceError::io(rel, e))?;
        let (meta, bytes) = match r {
            Ok(x) => x,
            // The object is gone or is another version: the opened one is
            // gone.
            Err(RangeError::Store(object_store::Error::Precondition { .. }))
            | Err(RangeError::Store(object_store::Error::NotFound { .. })) => return Err(changed()),
            Err(RangeError::Store(e)) => return Err(SourceError::io(rel, store_io(e))),
            // (counted and logged where it was found)
            Err(RangeError::Bad) => {
                return Err(SourceError::io(
                    rel,
                    io::Error::from_raw_os_error(libc::EIO),
                ))
            }
        };
        // (`collect_range` gave exactly `len` bytes or failed)
        if !same_version(version, known.as_deref(), &meta) {
            return Err(changed());
        }
        // The first GET of a version its listing named without an ETag:
        // the ETag it got is the version's from now on (`If-Match` on the
        // next GETs, and checked on their answers).
        if known.is_none() {
            if let Some(e) = &meta.e_tag {
                self.etags.insert(
                    (rel.to_owned(), version.ino, version.size),
                    Arc::from(e.as_str()),
                );
            }
        }
        Ok(bytes)
    }

    fn statvfs(&self) -> io::Result<libc::statvfs> {
        // SAFETY: statvfs is plain old data; all zeros is a valid value.
        let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
        s.f_bsize = 1 << 20;
        s.f_frsize = 1 << 20;
        s.f_namemax = 1024;
        Ok(s)
    }

    fn listing_carries_attrs(&self) -> bool {
        true
    }

    fn skipped_entries(&self) -> u64 {
        self.skipped.load(Relaxed)
    }

    fn throttled_responses(&self) -> u64 {
        self.throttled.load(Relaxed)
    }

    fn bad_replies(&self) -> u64 {
        self.bad_replies.load(Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_into_bucket_and_normalized_prefix() {
        let s = ObjectSpec::parse("s3://my-bucket/imagenet//train/").unwrap();
        assert_eq!(s.scheme, Scheme::S3);
        assert_eq!(s.bucket, "my-bucket");
        assert_eq!(s.prefix, "imagenet/train");
        assert_eq!(s.url(), "s3://my-bucket/imagenet/train");
        let s = ObjectSpec::parse("gs://b").unwrap();
        assert_eq!((s.scheme, s.prefix.as_str()), (Scheme::Gcs, ""));
        assert_eq!(s.url(), "gs://b");
        let s = ObjectSpec::parse("az://container/p").unwrap();
        assert_eq!((s.scheme, s.bucket.as_str()), (Scheme::Azure, "container"));
        for bad in [
            "s3://",
            "s3:///x",
            "s3://b/../x",
            "s3://b/./x",
            "s3://b c/x",
            "http://b/x",
        ] {
            assert!(ObjectSpec::parse(bad).is_err(), "{bad} was accepted");
        }
    }

    #[test]
    fn endpoints_must_be_http_urls_with_a_host() {
        use crate::source::aws_profile::check_endpoint;
        for ok in [
            "http://10.0.0.5:9000",
            "https://s3.eu-west-1.amazonaws.com/",
            "http://[::1]:9000/x",
            "http://user@host:1",
            "http://localhost",
        ] {
            assert_eq!(check_endpoint(ok), Ok(()), "{ok}");
        }
        for (bad, why) in [
            ("10.0.0.5:9000", "is not an http:// or https:// URL"),
            ("ftp://h", "is not an http:// or https:// URL"),
            ("http://", "has no host"),
            ("http://:9000", "has no host"),
            ("http://h:0", "has a port \"0\""),
            ("http://h:90o0", "has a port \"90o0\""),
            ("http://h :1", "holds a space"),
            ("http://[::1", "malformed [IPv6] host"),
        ] {
            let e = check_endpoint(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn the_identity_names_the_endpoint_but_not_the_region() {
        let mut a = ObjectSpec::parse("s3://b/p/").unwrap();
        let b = ObjectSpec::parse("s3://b/p").unwrap();
        assert_eq!(a.identity(), b.identity());
        a.region = Some("eu-west-1".into());
        assert_eq!(a.identity(), b.identity());
        a.endpoint = Some("http://10.0.0.5:9000/".into());
        assert_eq!(a.identity(), "s3://b/p @ http://10.0.0.5:9000");
        assert_ne!(a.identity(), b.identity());
    }

    #[test]
    fn only_plain_names_become_entries() {
        assert_eq!(child_name("", "a"), Some("a"));
        assert_eq!(child_name("p/d", "p/d/x"), Some("x"));
        assert_eq!(child_name("p/d", "p/d/x/"), Some("x"));
        assert_eq!(child_name("p/d", "p/d/x/y"), None);
        assert_eq!(child_name("p/d", "p/dx"), None);
        assert_eq!(child_name("p/d", "p/d/"), None);
        assert_eq!(child_name("p/d", "p/d/.."), None);
        assert_eq!(key_prefix("", Path::new("")), None);
        assert_eq!(key_prefix("p", Path::new("a/b")).as_deref(), Some("p/a/b"));
    }

    #[test]
    fn a_refused_page_restarts_past_its_bad_key() {
        // A key: start after it; a common prefix: after every key under it.
        assert_eq!(past("p/x/."), "p/x/.");
        let p = past("p//");
        assert!(p.as_str() > "p//c" && p.as_str() > "p//\u{FFFF}" && p.as_str() < "p0");
        // The end of a page: its greatest key or prefix, a directory
        // marker and prefixes with their `/` back.
        let meta = |k: &str| ObjectMeta {
            location: Key::parse(k).unwrap(),
            last_modified: Default::default(),
            size: 0,
            e_tag: None,
            version: None,
        };
        let page = object_store::ListResult {
            common_prefixes: vec![Key::parse("p/a").unwrap(), Key::parse("p/b").unwrap()],
            objects: vec![meta("p"), meta("p/a0")],
            extensions: Default::default(),
        };
        assert_eq!(page_end("p", &page), Some(past("p/b/")));
        let page = object_store::ListResult {
            common_prefixes: vec![],
            objects: vec![meta("p")],
            extensions: Default::default(),
        };
        assert_eq!(page_end("p", &page).as_deref(), Some("p/"));
        let e = Key::parse("p//c").unwrap_err();
        assert_eq!(bad_key(&e), "p//c");
        let e = Key::parse("p/../").unwrap_err();
        assert_eq!(bad_key(&e), "p/../");
    }

    #[test]
    fn a_stores_error_code_is_found_in_its_answer() {
        let t = "403 Forbidden: <?xml version=\"1.0\"?> <Error> <Code>AuthorizationFailure</Code> <Message>...";
        assert_eq!(error_code(t), Some("AuthorizationFailure"));
        assert_eq!(error_code("403 Forbidden"), None);
        assert_eq!(error_code("<Code></Code>"), None);
    }

    fn meta(size: u64, secs: i64, nanos: u32, etag: Option<&str>) -> ObjectMeta {
        ObjectMeta {
            location: Key::from("k"),
            last_modified: chrono::DateTime::from_timestamp(secs, nanos).unwrap(),
            size,
            e_tag: etag.map(str::to_owned),
            version: None,
        }
    }

    #[test]
    fn a_get_is_compared_with_its_version_on_what_both_carry() {
        // Listed without an ETag (s3s-fs), at ms precision; the GET has an
        // ETag and whole seconds: the same object.
        let listed = file_attr(&meta(10, 1_700_000_000, 250_000_000, None)).version();
        let got = meta(10, 1_700_000_000, 0, Some("\"abc\""));
        assert!(same_version(&listed, None, &got));
        // Once its ETag is known (the first GET), another one is a change,
        // whatever the time says.
        assert!(same_version(&listed, Some("abc"), &got));
        assert!(!same_version(
            &listed,
            Some("abc"),
            &meta(10, 1_700_000_000, 0, Some("def"))
        ));
        // Without an ETag known, a later time or another size is a change.
        assert!(!same_version(
            &listed,
            None,
            &meta(10, 1_700_000_001, 0, Some("abc"))
        ));
        assert!(!same_version(
            &listed,
            None,
            &meta(11, 1_700_000_000, 0, Some("abc"))
        ));
        // Listed with an ETag: the ETag decides, not the time.
        let tagged = file_attr(&meta(10, 1_700_000_000, 0, Some("abc"))).version();
        assert!(same_version(
            &tagged,
            None,
            &meta(10, 1_700_000_000, 0, Some("abc"))
        ));
        assert!(!same_version(
            &tagged,
            None,
            &meta(10, 1_700_000_000, 0, Some("abd"))
        ));
        // A GET without an ETag: the time at whole seconds.
        assert!(same_version(
            &tagged,
            None,
            &meta(10, 1_700_000_000, 900_000_000, None)
        ));
        assert!(!same_version(
            &tagged,
            None,
            &meta(10, 1_700_000_002, 0, None)
        ));
    }

    #[test]
    fn a_last_modified_time_past_2262_saturates_instead_of_overflowing() {
        use chrono::TimeZone;
        let meta = |y: i32| ObjectMeta {
            location: Key::parse("k").unwrap(),
            last_modified: chrono::Utc.with_ymd_and_hms(y, 1, 1, 0, 0, 0).unwrap(),
            size: 5,
            e_tag: Some("\"e\"".into()),
            version: None,
        };
        let a = file_attr(&meta(2300));
        assert_eq!(a.mtime_ns, i64::MAX);
        assert_eq!((a.size, a.ino), (5, etag_hash("e")));
        // The far past too, and an ordinary date exactly.
        assert_eq!(file_attr(&meta(1000)).mtime_ns, i64::MIN);
        assert_eq!(file_attr(&meta(2024)).mtime_ns, 1_704_067_200_000_000_000);
    }

    #[test]
    fn an_answer_is_held_to_the_length_asked() {
        assert_eq!(range_len("bytes=0-99"), Some(100));
        assert_eq!(range_len("bytes=314572800-314572899"), Some(100));
        assert_eq!(range_len("bytes=314572800-99"), None);
        assert_eq!(range_len("bytes=5-"), None);
        assert_eq!(range_len("items=0-9"), None);
        let ranged = ReplyCheck::of(false, range_len("bytes=0-99"), 206);
        assert_eq!(ranged, ReplyCheck::Exactly(100));
        assert_eq!(ranged.refuses(100), None);
        assert!(ranged.refuses(10 << 30).unwrap().contains("of 100 bytes"));
        assert!(ranged.refuses(99).is_some());
        // A listing, an error's text, a 200 to a ranged GET (object_store
        // refuses that itself): bounded, not exact.
        for check in [
            ReplyCheck::of(false, None, 200),
            ReplyCheck::of(false, Some(100), 503),
            ReplyCheck::of(false, Some(100), 200),
        ] {
            assert_eq!(check, ReplyCheck::AtMost(MAX_REPLY_BODY));
            assert_eq!(check.refuses(MAX_REPLY_BODY), None);
            assert!(check.refuses(MAX_REPLY_BODY + 1).is_some());
        }
        // A HEAD declares the object's size (a 1 GiB object's HEAD is no
        // bad answer) and has no body.
        let head = ReplyCheck::of(true, None, 200);
        assert_eq!(head, ReplyCheck::NoBody);
        assert_eq!(head.refuses(1 << 30), None);
    }

    fn chunks(
        parts: &[&'static [u8]],
    ) -> futures::stream::BoxStream<'static, object_store::Result<Bytes>> {
        let parts: Vec<_> = parts.iter().map(|p| Ok(Bytes::from_static(p))).collect();
        futures::stream::iter(parts).boxed()
    }

    #[tokio::test]
    async fn a_ranged_body_is_collected_to_its_length_and_no_further() {
        let bad = AtomicU64::new(0);
        let one = collect_range(chunks(&[b"0123456789"]), 10, &bad)
            .await
            .unwrap();
        assert_eq!(&one[..], b"0123456789");
        let three = collect_range(chunks(&[b"012", b"3456", b"789"]), 10, &bad);
        assert_eq!(&three.await.unwrap()[..], b"0123456789");
        assert_eq!(bad.load(Relaxed), 0);
        // Longer: refused at the first byte too many; shorter: at its end.
        let longer = collect_range(chunks(&[b"01234", b"56789", b"x"]), 10, &bad);
        assert!(matches!(longer.await, Err(RangeError::Bad)));
        let shorter = collect_range(chunks(&[b"01234"]), 10, &bad);
        assert!(matches!(shorter.await, Err(RangeError::Bad)));
        assert_eq!(bad.load(Relaxed), 2);
        // A stream that would never end is left at its first extra byte.
        let endless = futures::stream::repeat_with(|| Ok(Bytes::from_static(&[7u8; 64]))).boxed();
        assert!(matches!(
            collect_range(endless, 100, &bad).await,
            Err(RangeError::Bad)
        ));
        assert_eq!(bad.load(Relaxed), 3);
    }

    #[tokio::test]
    async fn a_body_past_its_bound_fails_without_being_held() {
        use object_store::client::HttpResponseBody;
        let bad = Arc::new(AtomicU64::new(0));
        let capped = |n: usize, left: u64| {
            HttpResponseBody::new(Capped {
                inner: HttpResponseBody::from(vec![1u8; n]),
                left,
                bad_replies: Arc::clone(&bad),
            })
        };
        assert_eq!(capped(1000, 1000).bytes().await.unwrap().len(), 1000);
        assert!(capped(1001, 1000).bytes().await.is_err());
        assert_eq!(bad.load(Relaxed), 1);
        // What it claims is not believed past the bound.
        let body = capped(1001, 1000);
        assert_eq!(http_body::Body::size_hint(&body).lower(), 1000);
    }

    #[test]
    fn a_listing_stops_at_a_repeated_token_and_at_its_bounds() {
        let t0 = std::time::Instant::now();
        let later = |s: u64| t0 + Duration::from_secs(s);
        // The same token twice: page 2 is refused, whatever it holds.
        let mut b = ListingBounds::new(t0, 100_000, Duration::from_secs(60));
        assert_eq!(b.page(1000, Some("token t"), t0), Ok(()));
        assert_eq!(
            b.page(1000, Some("token t"), t0),
            Err(ListingStop::Repeated { page: 2 })
        );
        // A cycle of two is one too.
        let mut b = ListingBounds::new(t0, 100_000, Duration::from_secs(60));
        for t in ["token a", "token b"] {
            assert_eq!(b.page(10, Some(t), t0), Ok(()));
        }
        assert!(matches!(
            b.page(10, Some("token a"), t0),
            Err(ListingStop::Repeated { .. })
        ));
        // Fresh tokens for ever: stopped at the entry bound...
        let mut b = ListingBounds::new(t0, 5_000, Duration::from_secs(60));
        let mut stop = None;
        for page in 0..100 {
            if let Err(e) = b.page(1000, Some(&format!("token {page}")), t0) {
                stop = Some((page, e));
                break;
            }
        }
        assert_eq!(
            stop,
            Some((
                5,
                ListingStop::TooManyEntries {
                    entries: 6000,
                    max: 5000
                }
            ))
        );
        // ...or, with empty pages, at the time bound.
        let mut b = ListingBounds::new(t0, 5_000, Duration::from_secs(60));
        assert_eq!(b.page(0, Some("token 1"), later(59)), Ok(()));
        let e = b.page(0, Some("token 2"), later(61)).unwrap_err();
        assert_eq!(
            e,
            ListingStop::TooLong {
                pages: 2,
                max: Duration::from_secs(60)
            }
        );
        assert!(e.to_string().contains("docs/objstore.md"), "{e}");
        // A listing that ends is never stopped, its last page included.
        let mut b = ListingBounds::new(t0, 2_000, Duration::from_secs(60));
        assert_eq!(b.page(1000, Some("token x"), t0), Ok(()));
        assert_eq!(b.page(1000, None, later(1)), Ok(()));
    }

    #[test]
    fn an_etag_hashes_the_same_quoted_or_not() {
        assert_eq!(etag_hash("\"abc\""), etag_hash("abc"));
        assert_eq!(etag_hash("W/\"abc\""), etag_hash("abc"));
        assert_ne!(etag_hash("abc"), etag_hash("abd"));
    }

    #[test]
    fn each_scheme_builds_a_client_without_a_request() {
        // Credentials come from the environment; no request is sent here.
        for url in ["s3://b/p", "gs://b/p"] {
            let mut s = ObjectSpec::parse(url).unwrap();
            s.no_sign_request = true;
            let b = s.build(Duration::from_secs(5));
            assert!(b.is_ok(), "{url}: {:?}", b.err());
        }
        // Azure names its account outside the URL: without one, a sentence
        // saying where it goes (unless this machine's environment has one).
        if std::env::var_os("AZURE_STORAGE_ACCOUNT_NAME").is_none() {
            let mut s = ObjectSpec::parse("az://c/p").unwrap();
            s.no_sign_request = true;
            let e = s.build(Duration::from_secs(5)).err().unwrap();
            assert!(e.contains("AZURE_STORAGE_ACCOUNT_NAME"), "{e}");
        }
        let mut s = ObjectSpec::parse("gs://b").unwrap();
        s.region = Some("x".into());
        let e = s.build(Duration::from_secs(5)).err().unwrap();
        assert!(e.contains("--region is for s3:// only"), "{e}");
    }

    /// A store whose listings carry no ETag while its HEADs and GETs do (as
    /// s3s-fs): an in-memory store behind a listing that drops them.
    struct ListsWithoutEtags(Arc<object_store::memory::InMemory>);

    #[async_trait::async_trait]
    impl PaginatedListStore for ListsWithoutEtags {
        async fn list_paginated(
            &self,
            prefix: Option<&str>,
            opts: PaginatedListOptions,
        ) -> object_store::Result<object_store::list::PaginatedListResult> {
            let prefix = prefix.unwrap_or("");
            let all: Vec<ObjectMeta> = self.0.list(None).map(|m| m.unwrap()).collect().await;
            let mut result = object_store::ListResult {
                common_prefixes: Vec::new(),
                objects: Vec::new(),
                extensions: Default::default(),
            };
            for m in all {
                let Some(rest) = m.location.as_ref().strip_prefix(prefix) else {
                    continue;
                };
                match rest.split_once('/') {
                    Some((d, _)) if opts.delimiter.is_some() => {
                        let p = Key::parse(format!("{prefix}{d}")).unwrap();
                        if !result.common_prefixes.contains(&p) {
                            result.common_prefixes.push(p);
                        }
                    }
                    _ => result.objects.push(ObjectMeta { e_tag: None, ..m }),
                }
            }
            result.objects.truncate(opts.max_keys.unwrap_or(usize::MAX));
            Ok(object_store::list::PaginatedListResult {
                result,
                page_token: None,
            })
        }
    }

    type Mem = Arc<object_store::memory::InMemory>;

    fn put(mem: &Mem, key: &str, bytes: &'static [u8]) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let key = Key::parse(key).unwrap();
        rt.block_on(mem.put(&key, Bytes::from_static(bytes).into()))
            .unwrap();
    }

    /// A source over `keys` (each holding `bytes`) in a store whose
    /// listings carry no ETag, and the store.
    fn without_listed_etags(keys: &[&str]) -> (ObjectSource, Mem) {
        let mem: Mem = Arc::default();
        for k in keys {
            put(&mem, k, b"bytes");
        }
        let built = Built {
            store: Arc::clone(&mem) as Arc<dyn ObjectStore>,
            paged: Arc::new(ListsWithoutEtags(Arc::clone(&mem))),
            throttled: Arc::default(),
            bad_replies: Arc::default(),
            resume: Resume::StartAfter,
        };
        (ObjectSource::new(built, "", "test").unwrap(), mem)
    }

    #[test]
    fn a_head_before_any_listing_names_a_version_as_its_listing_does() {
        // A mount started from its saved tree stats a file before it lists
        // anything: the HEAD's ETag must not name the version when the
        // listings name it by its time.
        let (src, _) = without_listed_etags(&["d/f", "e"]);
        let head = src.stat(Path::new("d/f")).unwrap();
        let listed = src.list(Path::new("d")).unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].1.ino, head.ino, "the HEAD named another version");
        assert_eq!(head.ino, no_etag_ino(head.mtime_ns));
        assert_eq!((head.size, head.mtime_ns), (5, listed[0].1.mtime_ns));
        // The ETag the HEAD saw goes with the GETs of that version.
        assert!(src
            .etags
            .get(&(PathBuf::from("d/f"), head.ino, head.size))
            .is_some());
    }

    #[test]
    fn a_same_second_replacement_of_another_size_is_read_as_itself() {
        // Without ETags in the listings, both versions share one `ino`
        // (their second); the ETag the first GET of the old one remembered
        // must not be the new one's `If-Match`.
        let (src, mem) = without_listed_etags(&[]);
        let listed = |src: &ObjectSource| src.list(Path::new("")).unwrap()[0].1;
        let f = Path::new("f");
        for _ in 0..5 {
            put(&mem, "f", b"bytes");
            let old = listed(&src);
            assert_eq!(&src.read_at(f, &old.version(), 0, 5).unwrap()[..], b"bytes");
            put(&mem, "f", b"longer");
            let new = listed(&src);
            if new.mtime_ns != old.mtime_ns {
                // The second turned between the two: try again.
                continue;
            }
            assert_eq!((new.ino, new.size), (old.ino, 6));
            let got = src.read_at(f, &new.version(), 0, 6);
            assert_eq!(&got.unwrap()[..], b"longer");
            let gone = src.read_at(f, &old.version(), 0, 5);
            assert!(matches!(gone, Err(SourceError::Changed { .. })), "{gone:?}");
            return;
        }
        panic!("no two puts within one second in five tries");
    }
}
