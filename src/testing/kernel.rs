//! The kernel's side of FUSE passthrough, faked for the FUSE-free tests of
//! `fs`: backings registered (each unregistered when dropped, as fuser's
//! `BackingId` is), or refused as by a kernel without passthrough. No real
//! kernel is asked; none of it may ship.

use std::collections::HashSet;
use std::fs::File;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};

/// A backing registered with the fake kernel; unregistered when dropped
/// (as fuser's `BackingId` is).
#[derive(Debug)]
pub struct Backing {
    pub id: u64,
    kernel: Arc<Kernel>,
}

impl Drop for Backing {
    fn drop(&mut self) {
        self.kernel.live.lock().unwrap().remove(&self.id);
    }
}

/// The kernel's side of passthrough: which backings are registered.
#[derive(Debug, Default)]
pub struct Kernel {
    next: AtomicU64,
    live: Mutex<HashSet<u64>>,
    /// Registrations asked for (granted or not).
    pub asked: AtomicU64,
    /// Refuse every registration (a kernel without passthrough).
    pub refuse: AtomicBool,
}

impl Kernel {
    pub fn register(self: &Arc<Self>, _file: &File) -> io::Result<Backing> {
        self.asked.fetch_add(1, SeqCst);
        if self.refuse.load(SeqCst) {
            return Err(io::Error::from_raw_os_error(libc::EPERM));
        }
        let id = self.next.fetch_add(1, SeqCst) + 1;
        self.live.lock().unwrap().insert(id);
        Ok(Backing {
            id,
            kernel: Arc::clone(self),
        })
    }

    /// Backings registered and not dropped.
    pub fn live(&self) -> usize {
        self.live.lock().unwrap().len()
    }
}
