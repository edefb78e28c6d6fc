//! Signals as bytes on a pipe (the self-pipe trick): a handler that only
//! writes the signal's number, so that the holder and the server wait for
//! signals, a server's death (SIGCHLD) and their other descriptors in one
//! `poll(2)`.
//!
//! One pipe per process; the handler never allocates, locks or logs.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicI32, Ordering};

/// The pipe's write end, for the handler (-1: none yet).
static WRITE_FD: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_signal(sig: libc::c_int) {
    let fd = WRITE_FD.load(Ordering::Relaxed);
    if fd >= 0 {
        let b = sig as u8;
        // SAFETY: write(2) is async-signal-safe; a full pipe drops the
        // byte (the reader drains it anyway, and the holder also polls
        // its child).
        unsafe {
            libc::write(fd, (&b as *const u8).cast(), 1);
        }
    }
}

/// The read end: readable when a signal came.
pub struct Signals {
    read: OwnedFd,
    _write: OwnedFd,
}

impl Signals {
    /// Catches `sigs` from now on (the process's only `Signals`).
    pub fn catch(sigs: &[libc::c_int]) -> io::Result<Signals> {
        let (read, write) = rustix::pipe::pipe_with(
            rustix::pipe::PipeFlags::CLOEXEC | rustix::pipe::PipeFlags::NONBLOCK,
        )?;
        WRITE_FD.store(write.as_raw_fd(), Ordering::Relaxed);
        for &sig in sigs {
            // SAFETY: a handler that only calls write(2); sigaction with a
            // zeroed struct and an empty mask.
            unsafe {
                let mut sa: libc::sigaction = std::mem::zeroed();
                sa.sa_sigaction = on_signal as *const () as usize;
                sa.sa_flags = libc::SA_RESTART;
                libc::sigemptyset(&mut sa.sa_mask);
                if libc::sigaction(sig, &sa, std::ptr::null_mut()) != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
        }
        Ok(Signals {
            read,
            _write: write,
        })
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.read.as_fd()
    }

    /// The signals that came since the last call.
    pub fn drain(&self) -> Vec<libc::c_int> {
        let mut out = Vec::new();
        let mut buf = [0u8; 64];
        while let Ok(n) = rustix::io::read(&self.read, &mut buf) {
            if n == 0 {
                break;
            }
            out.extend(buf[..n].iter().map(|b| *b as libc::c_int));
        }
        out
    }
}

/// Waits until one of `fds` is readable or `timeout` passed; which are.
pub fn wait_readable(fds: &[BorrowedFd<'_>], timeout: std::time::Duration) -> Vec<bool> {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|f| libc::pollfd {
            fd: f.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ms = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
    // SAFETY: poll over our own array of pollfd.
    let n = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, ms) };
    if n <= 0 {
        return vec![false; fds.len()];
    }
    pfds.iter()
        .map(|p| p.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0)
        .collect()
}
