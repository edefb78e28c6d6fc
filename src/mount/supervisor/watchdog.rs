//! The holder's watchdog probe: a thread that asks the mount, once a
//! second, for the `user.locafs.ping` attribute of its root (which the
//! server answers from a task on its runtime, so the answer shows that a
//! FUSE thread and the runtime both move) and keeps when the question it
//! waits on was sent. The holder compares that wait with `--watchdog`
//! (`policy::hung`).
//!
//! The probe is a request like a reader's: while the server is replaced
//! it waits, and the new server answers it. It never does anything but
//! that one request.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How often the probe asks.
pub const PROBE_EVERY: Duration = Duration::from_secs(1);

/// The probe thread's state, shared with the holder.
pub struct Probe {
    /// CLOCK_MONOTONIC ns when the question now waiting was sent; 0: none.
    sent_ns: Arc<AtomicU64>,
    /// Whether to ask (off while no server is ready).
    on: Arc<AtomicBool>,
}

impl Probe {
    /// Starts the thread asking `mountpoint` (off until [`Probe::set_on`]).
    /// Once `mountpoint` is no longer a mount of connection `conn` (it was
    /// unmounted while a mountpoint a second `locafs mount` attached
    /// remains), the probe asks one of the connection's other mountpoints:
    /// a server that hangs is found whichever mountpoint its readers use.
    pub fn start(mountpoint: PathBuf, conn: Option<u32>) -> std::io::Result<Probe> {
        let sent_ns = Arc::new(AtomicU64::new(0));
        let on = Arc::new(AtomicBool::new(false));
        let (s, o) = (Arc::clone(&sent_ns), Arc::clone(&on));
        let mut target = mountpoint;
        std::thread::Builder::new()
            .name("locafs-watchdog".into())
            .spawn(move || loop {
                if o.load(Ordering::Relaxed) {
                    if let Some(n) = conn {
                        if crate::mount::connection::connection_number(&target) != Some(n) {
                            if let Some(p) = crate::mount::connection::mountpoints_of(n)
                                .into_iter()
                                .next()
                            {
                                target = p;
                            }
                        }
                    }
                    s.store(crate::sys::shm::monotonic_ns().max(1), Ordering::Release);
                    let _ = crate::sys::getxattr(&target, crate::fs::PING_XATTR);
                    s.store(0, Ordering::Release);
                }
                std::thread::sleep(PROBE_EVERY);
            })?;
        Ok(Probe { sent_ns, on })
    }

    pub fn set_on(&self, on: bool) {
        self.on.store(on, Ordering::Relaxed);
    }

    /// How long the question now out has waited, counted from `since_ns`
    /// at the earliest (when the server now serving became ready: a
    /// question sent to the one before waited for its replacement too);
    /// None if none is out.
    pub fn waited(&self, since_ns: u64) -> Option<Duration> {
        let sent = self.sent_ns.load(Ordering::Acquire);
        if sent == 0 {
            return None;
        }
        let from = sent.max(since_ns);
        Some(Duration::from_nanos(
            crate::sys::shm::monotonic_ns().saturating_sub(from),
        ))
    }
}
