//! A real S3-compatible server for tests: `moto_server` (PyPI
//! `moto[server]`) as a child process on a free loopback port, owned by a
//! [`Moto`] guard that kills it on drop; and a client to make buckets and
//! put, replace and delete objects in it (object_store itself, on a runtime
//! of its own). The process itself is a [`Server`] (tests/common/server.rs).
//!
//! It must never leave a server process behind, and never talk to anything
//! but loopback.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

pub use super::server::{raw_request, split_url};
use super::server::{Server, StoreWriter};

use object_store::aws::AmazonS3Builder;

/// A running moto_server. Dropping it kills and reaps it.
pub struct Moto {
    server: Server,
    pub port: u16,
    /// `http://127.0.0.1:PORT`
    pub endpoint: String,
}

/// Why a test that needs moto_server cannot run here, if it cannot.
pub fn moto_missing() -> Option<String> {
    super::which("moto_server")
        .is_none()
        .then(|| "needs moto_server on PATH (pip install 'moto[server]')".to_owned())
}

/// Skips the test unless moto_server is installed.
#[macro_export]
macro_rules! require_moto {
    () => {
        if let Some(why) = $crate::common::s3::moto_missing() {
            $crate::skip!("{why}");
        }
    };
}

/// The credentials every test process and daemon uses (moto takes any).
pub fn set_test_credentials() {
    // SAFETY (of the environment change): tests set these before any thread
    // of theirs reads the environment; every test sets the same values.
    unsafe {
        std::env::set_var("AWS_ACCESS_KEY_ID", "testing");
        std::env::set_var("AWS_SECRET_ACCESS_KEY", "testing");
        std::env::set_var("AWS_REGION", "us-east-1");
        std::env::remove_var("AWS_PROFILE");
        std::env::remove_var("AWS_SESSION_TOKEN");
    }
}

impl Moto {
    /// Starts moto_server on a free port and waits (at most 30 s) until it
    /// answers HTTP.
    pub fn start() -> Moto {
        Moto::start_with_env(&[])
    }

    /// Starts moto_server with credential checks on after its first
    /// `free_actions` requests (moto's `INITIAL_NO_AUTH_ACTION_COUNT`): then
    /// any access key not created in moto's own IAM is refused with 403
    /// InvalidAccessKeyId, as a real store refuses a wrong key.
    pub fn start_with_auth(free_actions: u32) -> Moto {
        Moto::start_with_env(&[("INITIAL_NO_AUTH_ACTION_COUNT", &free_actions.to_string())])
    }

    fn start_with_env(env: &[(&str, &str)]) -> Moto {
        set_test_credentials();
        let port = super::free_tcp_port();
        let mut cmd = Command::new("moto_server");
        cmd.args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .envs(env.iter().copied());
        let server = Server::start("moto_server", cmd, port);
        Moto {
            endpoint: server.endpoint.clone(),
            server,
            port,
        }
    }

    /// A client of bucket `bucket` at this server (or at `endpoint`).
    pub fn bucket(&self, bucket: &str) -> Bucket {
        Bucket::at(&self.endpoint, bucket)
    }

    /// Kills the server (as a store that went away).
    pub fn kill(&mut self) {
        self.server.kill();
    }
}

/// One bucket of an S3 endpoint, for writing test data.
pub struct Bucket {
    pub name: String,
    pub endpoint: String,
    writer: StoreWriter,
}

impl std::ops::Deref for Bucket {
    type Target = StoreWriter;
    fn deref(&self) -> &StoreWriter {
        &self.writer
    }
}

impl Bucket {
    pub fn at(endpoint: &str, bucket: &str) -> Bucket {
        set_test_credentials();
        let _ = rustls::crypto::ring::default_provider().install_default();
        let store = AmazonS3Builder::new()
            .with_endpoint(endpoint)
            .with_allow_http(true)
            .with_bucket_name(bucket)
            .with_region("us-east-1")
            .with_access_key_id("testing")
            .with_secret_access_key("testing")
            .build()
            .expect("s3 client");
        Bucket {
            name: bucket.to_owned(),
            endpoint: endpoint.to_owned(),
            writer: StoreWriter::new(Arc::new(store)),
        }
    }

    /// Creates the bucket (a plain PUT of the bucket's URL, as moto takes it).
    pub fn create(&self) {
        let url = format!("{}/{}", self.endpoint, self.name);
        let (host, path) = split_url(&url);
        let resp = raw_request(&host, "PUT", &path, b"");
        assert!(
            resp.contains(" 200 "),
            "create bucket {}: {resp}",
            self.name
        );
    }

    /// Puts a key as it is, even one object_store would not name (an empty
    /// segment): a raw PUT.
    pub fn put_raw(&self, key: &str, bytes: &[u8]) {
        let url = format!("{}/{}/{}", self.endpoint, self.name, key);
        let (host, path) = split_url(&url);
        let resp = raw_request(&host, "PUT", &path, bytes);
        assert!(resp.contains(" 200 "), "put {key}: {resp}");
    }
}
