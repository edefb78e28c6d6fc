//! Logging through `tracing`: RUST_LOG-style filters (default `info`), text
//! or JSON lines, to stderr or a file. One line per notable event (mount,
//! unmount, recovery, corruption, disk trouble); nothing per read at the
//! default level.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

static TO_FILE: AtomicBool = AtomicBool::new(false);

/// Whether logs go to a file (so a daemon keeps its stderr open).
pub fn logs_to_file() -> bool {
    TO_FILE.load(Ordering::Relaxed)
}

pub fn init(format: LogFormat, file: Option<&Path>) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,fuser=error"));
    let writer = match file {
        Some(p) => match std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
        {
            Ok(f) => {
                TO_FILE.store(true, Ordering::Relaxed);
                tracing_subscriber::fmt::writer::BoxMakeWriter::new(std::sync::Mutex::new(f))
            }
            Err(e) => {
                eprintln!("locafs: log file {}: {e}; logging to stderr", p.display());
                tracing_subscriber::fmt::writer::BoxMakeWriter::new(std::io::stderr)
            }
        },
        None => tracing_subscriber::fmt::writer::BoxMakeWriter::new(std::io::stderr),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.with_target(false).try_init(),
    };
}
