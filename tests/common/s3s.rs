//! s3s-fs (crates.io `s3s-fs` 0.14.1, `cargo install s3s-fs --version
//! 0.14.1 --features binary`): an S3 server in Rust that serves each
//! directory under its root as a bucket, as a child process on a free
//! loopback port, owned by an [`S3sFs`] guard that kills it on drop; and a
//! client to fill its buckets (object_store, signed with the keys the
//! server was started with). It differs from moto_server where locafs must
//! not care: its listings carry no ETag, and its GETs ignore `If-Match`.
//!
//! It must never leave a server process behind, and never talk to anything
//! but loopback.

use std::process::Command;

use super::s3::{set_test_credentials, Bucket};
use super::server::Server;

/// Why a test that needs s3s-fs cannot run here, if it cannot.
pub fn s3s_missing() -> Option<String> {
    super::which("s3s-fs").is_none().then(|| {
        "needs s3s-fs on PATH (cargo install s3s-fs --version 0.14.1 --features binary)".to_owned()
    })
}

/// Skips the test unless s3s-fs is installed.
#[macro_export]
macro_rules! require_s3s {
    () => {
        if let Some(why) = $crate::common::s3s::s3s_missing() {
            $crate::skip!("{why}");
        }
    };
}

/// A running s3s-fs over a root directory of its own. Dropping it kills and
/// reaps it, then removes the root.
pub struct S3sFs {
    // Declared before `root`: the server goes before its directory.
    server: Server,
    root: tempfile::TempDir,
    pub port: u16,
    /// `http://127.0.0.1:PORT`
    pub endpoint: String,
}

impl S3sFs {
    /// Starts s3s-fs on a free port, with the test credentials as its only
    /// keys, and waits until it listens.
    pub fn start() -> S3sFs {
        set_test_credentials();
        let root = tempfile::tempdir().expect("s3s-fs root");
        let port = super::free_tcp_port();
        let mut cmd = Command::new("s3s-fs");
        cmd.args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--access-key", "testing", "--secret-key", "testing"])
            .arg(root.path());
        let server = Server::start("s3s-fs", cmd, port);
        S3sFs {
            endpoint: server.endpoint.clone(),
            server,
            root,
            port,
        }
    }

    /// A client of bucket `bucket`; [`S3sFs::create`] makes it.
    pub fn bucket(&self, bucket: &str) -> Bucket {
        Bucket::at(&self.endpoint, bucket)
    }

    /// Makes bucket `name`: s3s-fs serves each directory of its root as a
    /// bucket.
    pub fn create(&self, name: &str) {
        std::fs::create_dir_all(self.root.path().join(name)).expect("bucket directory");
    }

    /// Kills the server (as a store that went away).
    pub fn kill(&mut self) {
        self.server.kill();
    }
}
