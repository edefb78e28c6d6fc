//! Parsing and printing of sizes ("500G", "64MiB", "1.5T", "4096") and
//! durations ("60s", "5m", "1h", "0") as users write them on the command
//! line, in TOML files and in fstab options. Pure functions, no I/O.

use std::time::Duration;

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
    fn format() {
        assert_eq!(format_size(512), "512 B");
        assert_eq!(format_size(1536), "1.5 KiB");
        assert_eq!(format_size(3 << 30), "3.0 GiB");
    }
}
