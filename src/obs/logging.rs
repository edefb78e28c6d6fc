//! Logging through `tracing`: RUST_LOG-style filters (default `info`), text
//! or JSON lines, to stderr or a file. One line per notable event (mount,
//! unmount, recovery, corruption, disk trouble); nothing per read at the
//! default level. Also how an I/O error reads in a one-line message
//! ([`short_io`]), and the one line on stderr of a command ([`say`]). A leaf: imports nothing from the crate. A log file is
//! owner-only (it names files of the data set): created 0600 whatever the
//! umask, an existing one of ours made so, and a symlink in its place is
//! not followed.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use serde::Deserialize;
use tracing_subscriber::EnvFilter;

/// The format of log lines (`--log-format`, whose values the command line
/// lists in `cli::mount_args`).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// An io::Error without the "(os error N)" suffix.
pub fn short_io(e: &std::io::Error) -> String {
    let s = e.to_string();
    match s.find(" (os error") {
        Some(i) => s[..i].to_lowercase(),
        None => s,
    }
}

/// Prints `locafs: LINE` on stderr, as every message of the command line
/// reads; a closed stderr is ignored (`eprintln!` would panic on it, and a
/// reader that went away is no reason for a mount to fail).
pub fn say(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "locafs: {line}");
}

static TO_FILE: AtomicBool = AtomicBool::new(false);

/// Whether logs go to a file (so a daemon keeps its stderr open).
pub fn logs_to_file() -> bool {
    TO_FILE.load(Ordering::Relaxed)
}

/// The log filter without `RUST_LOG`. The metrics listener logs every
/// client that hangs up mid-scrape at warn, and object_store every retry
/// at info (ten lines before a dead endpoint's one error): neither is a
/// notable event (locafs counts and reports retries itself).
pub const DEFAULT_FILTER: &str =
    "info,fuser=error,metrics_exporter_prometheus=error,object_store=warn";

pub fn init(format: LogFormat, file: Option<&Path>) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    // Colours only for a person at a terminal: never in files or journals
    // (turned off below when logging to a file).
    let mut ansi_ok = {
        use std::io::IsTerminal;
        std::env::var_os("NO_COLOR").is_none() && std::io::stderr().is_terminal()
    };
    let writer = match file {
        Some(p) => match open_log(p) {
            Ok(f) => {
                TO_FILE.store(true, Ordering::Relaxed);
                ansi_ok = false;
                tracing_subscriber::fmt::writer::BoxMakeWriter::new(std::sync::Mutex::new(f))
            }
            Err(e) => {
                eprintln!("locafs: log file {}: {e}; logging to stderr", p.display());
                tracing_subscriber::fmt::writer::BoxMakeWriter::new(std::io::stderr)
            }
        },
        None => tracing_subscriber::fmt::writer::BoxMakeWriter::new(std::io::stderr),
    };
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let lines = tracing_subscriber::fmt::layer()
        .with_writer(writer)
        .with_ansi(ansi_ok);
    let base = tracing_subscriber::registry()
        .with(filter)
        .with(QuietLateReplies);
    let _ = match format {
        LogFormat::Json => base.with(lines.json()).try_init(),
        LogFormat::Text => base.with(lines.with_target(false)).try_init(),
    };
}

/// Opens (or creates, 0600) the log file `p` for appending; a symlink in
/// its place is refused, and an existing file of ours that the group or
/// others may read is made owner-only.
fn open_log(p: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
    let f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(p)?;
    let m = f.metadata()?;
    if m.uid() == rustix::process::geteuid().as_raw() && m.mode() & 0o077 != 0 {
        f.set_permissions(std::fs::Permissions::from_mode(m.mode() & 0o700))?;
    }
    Ok(f)
}

/// Holds back fuser's "Failed to send FUSE reply: No such file or
/// directory": the kernel answers a reply with ENOENT when it no longer
/// waits for that request, because it was interrupted or because the file
/// system was unmounted while the request was in flight (an asynchronous
/// RELEASE or read-ahead the kernel aborts at unmount). Nothing is lost, so
/// it is not an error a person should see. Every other fuser error passes.
struct QuietLateReplies;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for QuietLateReplies {
    fn event_enabled(
        &self,
        event: &tracing::Event<'_>,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) -> bool {
        if *event.metadata().level() != tracing::Level::ERROR {
            return true;
        }
        let mut late = LateReply(false);
        event.record(&mut late);
        !late.0
    }
}

struct LateReply(bool);

impl tracing::field::Visit for LateReply {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = is_late_reply(&format!("{value:?}"));
        }
    }

    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "message" {
            self.0 = is_late_reply(value);
        }
    }
}

fn is_late_reply(message: &str) -> bool {
    message.starts_with("Failed to send FUSE reply")
        && message.contains(&std::io::Error::from_raw_os_error(libc::ENOENT).to_string())
}

/// Lets one event through per interval and counts the ones it held back.
pub struct RateLimit {
    interval_ms: u64,
    last_ms: std::sync::atomic::AtomicU64,
    suppressed: std::sync::atomic::AtomicU64,
}

impl RateLimit {
    pub const fn new(interval_ms: u64) -> Self {
        RateLimit {
            interval_ms,
            last_ms: std::sync::atomic::AtomicU64::new(0),
            suppressed: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Some(number held back since the last one let through) if this event
    /// may be logged, None if it is held back.
    pub fn allow(&self) -> Option<u64> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        let last = self.last_ms.load(Ordering::Relaxed);
        if now.saturating_sub(last) >= self.interval_ms
            && self
                .last_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            return Some(self.suppressed.swap(0, Ordering::Relaxed));
        }
        self.suppressed.fetch_add(1, Ordering::Relaxed);
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;
    use tracing_subscriber::layer::SubscriberExt;

    struct Count(Arc<AtomicUsize>);

    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Count {
        fn on_event(&self, _: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn late_fuse_replies_are_held_back_and_other_errors_pass() {
        let seen = Arc::new(AtomicUsize::new(0));
        let subscriber = tracing_subscriber::registry()
            .with(QuietLateReplies)
            .with(Count(seen.clone()));
        tracing::subscriber::with_default(subscriber, || {
            let enoent = std::io::Error::from_raw_os_error(libc::ENOENT);
            let enodev = std::io::Error::from_raw_os_error(libc::ENODEV);
            tracing::error!("Failed to send FUSE reply: {enoent}");
            assert_eq!(seen.load(Ordering::Relaxed), 0, "a late reply got through");
            tracing::error!("Failed to send FUSE reply: {enodev}");
            tracing::error!("cache disk: {enoent}");
            tracing::warn!("Failed to send FUSE reply: {enoent}");
        });
        assert_eq!(seen.load(Ordering::Relaxed), 3);
    }
}
