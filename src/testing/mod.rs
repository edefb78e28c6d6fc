//! The test kit's fakes: the one set of stand-ins that the unit tests
//! (`src/**`), the integration tests (`tests/**`) and the benches put
//! behind the seams, to inject faults and slowness (everything else in a
//! test is real):
//!
//! - [`source`]: a directory (or any source) behind a [`source::Hook`] that
//!   sees every call ([`SlowSource`]: latency and a bandwidth cap;
//!   [`StallSource`]: every call hangs, as a hard NFS mount whose server
//!   stopped); [`MemSource`], a data set in memory that can change, stall
//!   and count its calls; [`NoSource`], which refuses and counts every call.
//! - [`cache`]: [`MemCache`], a `BlockStore` in memory that can refuse
//!   writes, be full, or have another write of a block in flight, and logs
//!   its writes; [`GatedCache`], any block store whose writes (or reads)
//!   wait at a gate the test opens; [`MemComplete`], the complete-file side
//!   of a `MemCache`, counting pins.
//! - [`kernel`]: the kernel's side of FUSE passthrough (backings
//!   registered, or refused).
//!
//! Compiled into the unit tests, and into the integration tests and
//! benches through the `testing` feature (the crate's dev-dependency on
//! itself). It must never ship: the feature is off by default, it is no
//! option of the command line, and no product module imports it
//! (`tests/module_graph.rs` checks). `tests/kit_fakes.rs` checks that each
//! fake answers as the real thing does wherever it injects nothing.

use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::{Condvar, Mutex};

pub mod cache;
pub mod kernel;
pub mod source;

pub use cache::{GatedCache, MemCache, MemComplete};
pub use kernel::{Backing, Kernel};
pub use source::{
    Call, Hook, Hooked, MemSource, NoSource, Slow, SlowSource, SourceRead, Stall, StallSource,
};

/// Where a fake holds calls while the test keeps it closed (a stalled
/// source, a cache's writes waiting for a slow disk); counts the calls
/// waiting.
#[derive(Default)]
pub struct Gate {
    closed: Mutex<bool>,
    opened: Condvar,
    waiting: AtomicU64,
    max_waiting: AtomicU64,
}

impl Gate {
    /// A gate, closed or open.
    pub fn new(closed: bool) -> Self {
        Gate {
            closed: Mutex::new(closed),
            ..Gate::default()
        }
    }

    /// From now on every call that passes waits until [`Gate::open`].
    pub fn close(&self) {
        *self.closed.lock().unwrap() = true;
    }

    pub fn open(&self) {
        *self.closed.lock().unwrap() = false;
        self.opened.notify_all();
    }

    /// Waits while the gate is closed.
    pub fn pass(&self) {
        let mut closed = self.closed.lock().unwrap();
        if !*closed {
            return;
        }
        let n = self.waiting.fetch_add(1, SeqCst) + 1;
        self.max_waiting.fetch_max(n, SeqCst);
        while *closed {
            closed = self.opened.wait(closed).unwrap();
        }
        self.waiting.fetch_sub(1, SeqCst);
    }

    /// Calls waiting at the gate now.
    pub fn waiting(&self) -> u64 {
        self.waiting.load(SeqCst)
    }

    /// The most calls that waited at once.
    pub fn max_waiting(&self) -> u64 {
        self.max_waiting.load(SeqCst)
    }
}
