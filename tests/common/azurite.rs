//! A real Azure Blob Storage server for tests: Azurite's blob service
//! (npm `azurite`, the `azurite-blob` program) as a child process on a free
//! loopback port with its data in a temporary directory, owned by an
//! [`Azurite`] guard that kills it on drop (a [`Server`], as moto is); and a
//! client to make containers and put and delete blobs in them: object_store
//! itself for ordinary keys, and requests signed here with the emulator's
//! Shared Key for what object_store does not send (making a container,
//! keys with empty, `.` or `..` segments).
//!
//! It must never leave a server process behind, and never talk to anything
//! but loopback.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use base64::Engine;
use object_store::azure::MicrosoftAzureBuilder;

use super::server::{pct, raw_request_with, split_url, status, Server, StoreWriter};

/// Azurite's well-known account and key (the same in every install).
pub const ACCOUNT: &str = "devstoreaccount1";
pub const KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

/// Why a test that needs Azurite cannot run here, if it cannot.
pub fn azurite_missing() -> Option<String> {
    super::which("azurite-blob")
        .is_none()
        .then(|| "needs azurite-blob on PATH (npm install -g azurite)".to_owned())
}

/// Skips the test unless Azurite is installed.
#[macro_export]
macro_rules! require_azurite {
    () => {
        if let Some(why) = $crate::common::azurite::azurite_missing() {
            $crate::skip!("{why}");
        }
    };
}

/// A running Azurite blob service. Dropping it kills it and removes its
/// data.
pub struct Azurite {
    server: Server,
    pub port: u16,
    /// The blob service, `http://127.0.0.1:PORT` (what `--endpoint` takes
    /// with `AZURE_STORAGE_USE_EMULATOR=true`).
    pub endpoint: String,
    _data: tempfile::TempDir,
}

impl Azurite {
    /// Starts azurite-blob on a free port and waits until it listens.
    /// `--skipApiVersionCheck`: object_store may speak a newer API version
    /// than the installed Azurite knows (it serves the calls used here).
    pub fn start() -> Azurite {
        let data = tempfile::tempdir().unwrap();
        let port = super::free_tcp_port();
        let mut cmd = Command::new("azurite-blob");
        cmd.args(["--silent", "--skipApiVersionCheck", "--location"])
            .arg(data.path())
            .args(["--blobHost", "127.0.0.1", "--blobPort", &port.to_string()]);
        let server = Server::start("azurite-blob", cmd, port);
        Azurite {
            endpoint: server.endpoint.clone(),
            server,
            port,
            _data: data,
        }
    }

    /// The environment a `locafs mount az://...` of this server needs
    /// besides `--endpoint`.
    pub fn mount_env() -> Vec<(&'static str, &'static str)> {
        vec![("AZURE_STORAGE_USE_EMULATOR", "true")]
    }

    /// A client of container `name` at this server.
    pub fn container(&self, name: &str) -> Container {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let store = MicrosoftAzureBuilder::new()
            .with_account(ACCOUNT)
            .with_access_key(KEY)
            .with_endpoint(format!("{}/{ACCOUNT}", self.endpoint))
            .with_allow_http(true)
            .with_container_name(name)
            .build()
            .expect("azure client");
        Container {
            name: name.to_owned(),
            endpoint: self.endpoint.clone(),
            writer: StoreWriter::new(Arc::new(store)),
        }
    }

    /// Kills the server (as a store that went away).
    pub fn kill(&mut self) {
        self.server.kill();
    }
}

/// One container of an Azurite server, for writing test data.
pub struct Container {
    pub name: String,
    pub endpoint: String,
    writer: StoreWriter,
}

impl std::ops::Deref for Container {
    type Target = StoreWriter;
    fn deref(&self) -> &StoreWriter {
        &self.writer
    }
}

impl Container {
    /// Creates the container.
    pub fn create(&self) {
        let resp = self.signed("PUT", "", &[("restype", "container")], &[], b"");
        assert_eq!(status(&resp), 201, "create container {}: {resp}", self.name);
    }

    /// Puts a blob named `key` as it is, even one object_store would not
    /// name (an empty, `.` or `..` segment).
    pub fn put_raw(&self, key: &str, bytes: &[u8]) {
        let resp = self.signed("PUT", key, &[], &[("x-ms-blob-type", "BlockBlob")], bytes);
        assert_eq!(status(&resp), 201, "put {key}: {resp}");
    }

    /// One request on `key` of this container ("" for the container)
    /// signed with the account's Shared Key (Azure's "Authorize with Shared
    /// Key"; Azurite names the account in the path, so the canonicalized
    /// resource holds it twice).
    fn signed(
        &self,
        method: &str,
        key: &str,
        query: &[(&str, &str)],
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> String {
        let mut path = format!("/{ACCOUNT}/{}", self.name);
        if !key.is_empty() {
            path.push('/');
            path.push_str(&pct(key, true));
        }
        let mut hs: Vec<(String, String)> = vec![
            (
                "x-ms-date".into(),
                httpdate::fmt_http_date(std::time::SystemTime::now()),
            ),
            ("x-ms-version".into(), "2021-10-04".into()),
        ];
        hs.extend(headers.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        hs.sort();
        let len = if body.is_empty() {
            String::new()
        } else {
            body.len().to_string()
        };
        // VERB, Content-Encoding, -Language, -Length, -MD5, -Type, Date,
        // If-Modified-Since, If-Match, If-None-Match, If-Unmodified-Since,
        // Range; then the x-ms- headers; then the resource.
        let mut sts = format!("{method}\n\n\n{len}\n\n\n\n\n\n\n\n\n");
        for (k, v) in &hs {
            sts.push_str(&format!("{k}:{v}\n"));
        }
        sts.push_str(&format!("/{ACCOUNT}{path}"));
        let mut q: Vec<_> = query.to_vec();
        q.sort();
        for (k, v) in &q {
            sts.push_str(&format!("\n{k}:{v}"));
        }
        let secret = base64::engine::general_purpose::STANDARD
            .decode(KEY)
            .unwrap();
        let tag = ring::hmac::sign(
            &ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &secret),
            sts.as_bytes(),
        );
        let sig = base64::engine::general_purpose::STANDARD.encode(tag.as_ref());
        hs.push(("Authorization".into(), format!("SharedKey {ACCOUNT}:{sig}")));
        if !q.is_empty() {
            let qs: Vec<String> = q
                .iter()
                .map(|(k, v)| format!("{k}={}", pct(v, false)))
                .collect();
            path.push('?');
            path.push_str(&qs.join("&"));
        }
        let (host, _) = split_url(&self.endpoint);
        raw_request_with(&host, method, &path, &hs, body)
    }
}
