//! The data path: bytes of a file version, verified, from the fastest tier
//! that has them. `reader` (memory, the disk cache, a peer, then the source;
//! one fetch per missing block however many wait), `prefetch` (read-ahead
//! within a file and across the epoch's unread files, or the loader's plan)
//! and `concurrency` (how many background fetches it keeps in flight, tuned
//! to the source).
//!
//! Nothing here may panic, serve a byte that failed its checksum, or wait
//! on the source or a peer without a deadline; a cache fault is a miss, and
//! only a source failure fails a read, and only that read.

pub mod concurrency;
pub mod prefetch;
pub mod reader;
