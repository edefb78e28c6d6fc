//! Reading a metrics endpoint: a minimal HTTP GET and a parser of the
//! Prometheus text format that checks every line.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::time::Duration;

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
/// Returns the samples and the declared type of each metric.
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

/// Scrapes `http://addr/metrics`: (samples, types, body); fails the test
/// unless it answers 200.
pub fn scrape(addr: &str) -> (Vec<Sample>, BTreeMap<String, String>, String) {
    let (code, body) = http_get(addr, "/metrics").expect("metrics endpoint reachable");
    assert_eq!(code, 200, "{body}");
    let (s, t) = parse_prometheus(&body);
    (s, t, body)
}
