//! Shared helpers of the operations tests (tests/ops_*.rs): a scratch data
//! set, real `locafs` processes, waiting for mounts, a minimal HTTP GET and a
//! Prometheus text parser. No fakes: everything runs the real binary.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_locafs")
}

/// Prints a loud skip notice; the caller returns.
pub fn skip(reason: &str) {
    eprintln!("SKIPPED: {reason}");
}

/// A scratch source with a few files, an empty mountpoint and a cache dir.
pub struct Scratch {
    pub dir: tempfile::TempDir,
    pub src: PathBuf,
    pub mnt: PathBuf,
    pub cache: PathBuf,
    /// (relative path, content)
    pub files: Vec<(String, Vec<u8>)>,
}

pub fn scratch() -> Scratch {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    let mnt = dir.path().join("mnt");
    let cache = dir.path().join("cache");
    for d in [&src, &mnt, &cache] {
        std::fs::create_dir_all(d).unwrap();
    }
    std::fs::create_dir_all(src.join("class_a")).unwrap();
    let mut files = Vec::new();
    let mut seed = 0x9e3779b97f4a7c15u64;
    for (name, len) in [
        ("class_a/big.bin", 3 * 1024 * 1024 + 123),
        ("class_a/small.txt", 4000),
        ("top.bin", 700 * 1024),
    ] {
        let data: Vec<u8> = (0..len)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed as u8
            })
            .collect();
        std::fs::write(src.join(name), &data).unwrap();
        files.push((name.to_string(), data));
    }
    Scratch {
        dir,
        src,
        mnt,
        cache,
        files,
    }
}

/// The file system type of the mount at `p`, if any.
pub fn mount_type(p: &Path) -> Option<String> {
    let target = std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mut found = None;
    for line in info.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        if f.len() > 4 && Path::new(f[4]) == target {
            let dash = f.iter().position(|x| *x == "-")?;
            found = f.get(dash + 1).map(|s| s.to_string());
        }
    }
    found
}

pub fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    f()
}

/// Unmounts `mnt` (lazily if busy), ignoring errors: test cleanup.
pub fn force_unmount(mnt: &Path) {
    if mount_type(mnt).is_some() {
        let ok = Command::new("umount")
            .arg(mnt)
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !ok {
            let _ = Command::new("umount")
                .arg("-l")
                .arg(mnt)
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// A foreground `locafs mount` child; unmounts and reaps on drop.
pub struct Daemon {
    pub child: Child,
    pub mnt: PathBuf,
}

impl Daemon {
    /// Starts `locafs mount ARGS` in the foreground and waits for the mount.
    pub fn start(mnt: &Path, args: &[&str]) -> Daemon {
        let child = Command::new(bin())
            .arg("mount")
            .args(args)
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let mut d = Daemon {
            child,
            mnt: mnt.to_path_buf(),
        };
        let ok = wait_until(Duration::from_secs(20), || {
            mount_type(mnt).as_deref() == Some("fuse.locafs")
                || d.child.try_wait().ok().flatten().is_some()
        });
        assert!(ok, "mount did not come up");
        assert!(
            d.child.try_wait().unwrap().is_none(),
            "locafs mount exited early"
        );
        d
    }

    /// Sends a signal to the daemon.
    pub fn signal(&self, sig: &str) {
        Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.child.id().to_string())
            .status()
            .unwrap();
    }

    /// Waits for the daemon to exit; its exit code.
    pub fn wait(&mut self, timeout: Duration) -> Option<i32> {
        let end = Instant::now() + timeout;
        while Instant::now() < end {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s.code();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        force_unmount(&self.mnt);
        if self.wait(Duration::from_secs(5)).is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        force_unmount(&self.mnt);
    }
}

/// A free TCP port on 127.0.0.1 (free when checked).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// GET http://addr/path with HTTP/1.0; (status code, body).
pub fn http_get(addr: &str, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = std::net::TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "GET {path} HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let code = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    Ok((code, body.to_string()))
}

/// One sample of the Prometheus text format.
#[derive(Debug, Clone)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// Parses Prometheus text exposition: comment lines (# HELP, # TYPE) and
/// blank lines are checked and skipped, every other line must be
/// `name{label="value",...} value`. Panics with the bad line otherwise.
pub fn parse_prometheus(text: &str) -> (Vec<Sample>, BTreeMap<String, String>) {
    let mut samples = Vec::new();
    let mut types = BTreeMap::new();
    let valid_name = |n: &str| {
        !n.is_empty()
            && n.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
            && !n.starts_with(|c: char| c.is_ascii_digit())
    };
    for line in text.lines() {
        if line.trim().is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut it = rest.split(' ');
            let (n, t) = (it.next().unwrap_or(""), it.next().unwrap_or(""));
            assert!(valid_name(n), "bad TYPE line: {line}");
            assert!(
                ["counter", "gauge", "histogram", "summary", "untyped"].contains(&t),
                "bad TYPE line: {line}"
            );
            types.insert(n.to_string(), t.to_string());
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let n = rest.split(' ').next().unwrap_or("");
            assert!(valid_name(n), "bad HELP line: {line}");
            continue;
        }
        assert!(!line.starts_with('#'), "unknown comment line: {line}");
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("no value: {line}"));
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse().unwrap_or_else(|_| panic!("bad value: {line}")),
        };
        let (name, labels) = match series.split_once('{') {
            None => (series, BTreeMap::new()),
            Some((name, rest)) => {
                let body = rest
                    .strip_suffix('}')
                    .unwrap_or_else(|| panic!("unclosed labels: {line}"));
                (name, parse_labels(body, line))
            }
        };
        assert!(valid_name(name), "bad metric name: {line}");
        samples.push(Sample {
            name: name.to_string(),
            labels,
            value,
        });
    }
    (samples, types)
}

fn parse_labels(body: &str, line: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut rest = body;
    while !rest.is_empty() {
        let (k, after) = rest
            .split_once("=\"")
            .unwrap_or_else(|| panic!("bad label: {line}"));
        let mut val = String::new();
        let mut chars = after.char_indices();
        let mut end = None;
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    if let Some((_, e)) = chars.next() {
                        val.push(match e {
                            'n' => '\n',
                            other => other,
                        });
                    }
                }
                '"' => {
                    end = Some(i);
                    break;
                }
                c => val.push(c),
            }
        }
        let end = end.unwrap_or_else(|| panic!("unterminated label value: {line}"));
        assert!(
            !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "bad label name: {line}"
        );
        out.insert(k.to_string(), val);
        rest = &after[end + 1..];
        rest = rest.strip_prefix(',').unwrap_or(rest);
    }
    out
}

/// The value of the sample `name` whose labels include all of `labels`.
pub fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    samples
        .iter()
        .find(|s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|s| s.value)
}
