//! Parsing and printing of sizes ("500G", "64MiB", "1.5T", "4096") and
//! durations ("60s", "5m", "1h", "0") as users write them on the command
//! line, in TOML files and in fstab options. Pure functions, no I/O.
//!
//! [`Size`] and [`Span`] parse where a value enters (clap through
//! `FromStr`, TOML and `-o` through `Deserialize`, from a string only), so
//! that what is past the edge is a number, never a string to parse.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A size or duration that does not parse: what was written and why (one
/// line, without the option's name: the caller knows it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError(String);

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ParseError {}

impl ParseError {
    /// Whether a message (from serde, which keeps only the text) is one of
    /// ours: every message of [`parse_size`] and [`parse_duration`] starts
    /// so.
    pub fn is_message(msg: &str) -> bool {
        msg.starts_with("bad size ") || msg.starts_with("bad duration ")
    }
}

/// A number of bytes, written as [`parse_size`] reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Size(pub u64);

impl FromStr for Size {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, ParseError> {
        parse_size(s).map(Size).map_err(ParseError)
    }
}

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// Written back as a plain number of bytes (what [`parse_size`] reads):
/// the options a holder hands its server (`config::serving_toml`).
impl Serialize for Size {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0.to_string())
    }
}

/// A length of time, written as [`parse_duration`] reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Span(pub Duration);

impl FromStr for Span {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, ParseError> {
        parse_duration(s).map(Span).map_err(ParseError)
    }
}

impl<'de> Deserialize<'de> for Span {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// Written back in milliseconds (what [`parse_duration`] reads).
impl Serialize for Span {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format!("{}ms", self.0.as_nanos() as f64 / 1e6))
    }
}

/// Parses a size. K, M, G, T, P and their KiB/MiB/... forms are powers of
/// 1024 (as in rclone, docker and mountpoint-s3); KB, MB, GB, TB, PB are
/// powers of 1000. A plain number is bytes. Fractions are allowed ("1.5T").
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        return Err(format!(
            "bad size {s:?}: expected a number like 500G, 64MiB or 4096"
        ));
    }
    let value: f64 = num
        .parse()
        .map_err(|_| format!("bad size {s:?}: {num:?} is not a number"))?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024f64,
        "m" | "mib" => 1024f64.powi(2),
        "g" | "gib" => 1024f64.powi(3),
        "t" | "tib" => 1024f64.powi(4),
        "p" | "pib" => 1024f64.powi(5),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        "pb" => 1e15,
        other => {
            return Err(format!(
                "bad size {s:?}: unknown unit {other:?} (use K, M, G, T, KiB.., KB..)"
            ))
        }
    };
    let bytes = value * mult;
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(format!("bad size {s:?}: too large"));
    }
    Ok(bytes.round() as u64)
}

/// Formats bytes for humans, in binary units ("1.5 GiB").
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// Parses a duration: a number with an optional unit ms, s, m, h, d
/// (seconds when none).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("bad duration {s:?}: expected e.g. 60s, 5m, 1h"))?;
    let secs = match unit.trim() {
        "" | "s" => value,
        "ms" => value / 1000.0,
        "m" | "min" => value * 60.0,
        "h" => value * 3600.0,
        "d" => value * 86400.0,
        other => return Err(format!("bad duration {s:?}: unknown unit {other:?}")),
    };
    if !secs.is_finite() || !(0.0..=1e12).contains(&secs) {
        return Err(format!("bad duration {s:?}"));
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("64MiB").unwrap(), 64 << 20);
        assert_eq!(parse_size("64M").unwrap(), 64 << 20);
        assert_eq!(parse_size("500G").unwrap(), 500 << 30);
        assert_eq!(parse_size("1.5T").unwrap(), 3 << 39);
        assert_eq!(parse_size("2GB").unwrap(), 2_000_000_000);
        assert_eq!(parse_size(" 1k ").unwrap(), 1024);
        assert!(parse_size("").is_err());
        assert!(parse_size("G").is_err());
        assert!(parse_size("12X").is_err());
        assert!(parse_size("1.2.3G").is_err());
        assert!(parse_size("99999999999P").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("60s").unwrap(), Duration::from_secs(60));
        assert_eq!(parse_duration("60").unwrap(), Duration::from_secs(60));
        assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
        assert!(parse_duration("abc").is_err());
        assert!(parse_duration("5y").is_err());
    }

    #[test]
    fn newtypes_parse_from_strings_only_and_say_why_not() {
        assert_eq!("64MiB".parse::<Size>(), Ok(Size(64 << 20)));
        assert_eq!(
            "250ms".parse::<Span>(),
            Ok(Span(Duration::from_millis(250)))
        );
        let e = "12X".parse::<Size>().unwrap_err().to_string();
        assert_eq!(e, parse_size("12X").unwrap_err());
        assert!(ParseError::is_message(&e), "{e}");
        let e = "5y".parse::<Span>().unwrap_err().to_string();
        assert_eq!(e, parse_duration("5y").unwrap_err());
        assert!(ParseError::is_message(&e), "{e}");
        // Every message of both parsers is recognised.
        for bad in ["", "G", "12X", "1.2.3G", "99999999999P", "x1"] {
            assert!(
                ParseError::is_message(&parse_size(bad).unwrap_err()),
                "{bad}"
            );
        }
        for bad in ["", "abc", "5y", "1e400", "-1"] {
            assert!(
                ParseError::is_message(&parse_duration(bad).unwrap_err()),
                "{bad}"
            );
        }
        // From TOML: strings parse, anything else is the same type error as
        // for a string option.
        #[derive(Deserialize, Debug)]
        struct T {
            s: Size,
            d: Span,
        }
        let t: T = toml::from_str("s = \"1G\"\nd = \"5m\"\n").unwrap();
        assert_eq!((t.s, t.d), (Size(1 << 30), Span(Duration::from_secs(300))));
        let e = toml::from_str::<T>("s = \"lots\"\nd = \"5m\"\n").unwrap_err();
        assert_eq!(e.message(), parse_size("lots").unwrap_err());
        let e = toml::from_str::<T>("s = 5\nd = \"5m\"\n").unwrap_err();
        assert_eq!(e.message(), "invalid type: integer `5`, expected a string");
    }

    #[test]
    fn format() {
        assert_eq!(format_size(512), "512 B");
        assert_eq!(format_size(1536), "1.5 KiB");
        assert_eq!(format_size(3 << 30), "3.0 GiB");
    }
}
