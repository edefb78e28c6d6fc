//! Observability: what a mount tells its operator. `stats` (the counters
//! and the one snapshot that `locafs stats`, the stats xattr and the
//! metrics all show), `metrics` (the Prometheus exporter and the recording
//! calls of the read path) and `logging` (tracing's set-up, one line per
//! notable event, and how an error reads in a message).
//!
//! The read path calls into this subsystem on every request, so it never
//! calls back: nothing here imports the engine (only `sys::units`); the
//! parts of the snapshot the engine owns are plugged in as views.

pub mod logging;
pub mod metrics;
pub mod stats;
