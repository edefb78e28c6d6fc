//! The server's side of a mount held by another process (`locafs
//! __serve`, started by the holder, see the parent module): it finds its
//! descriptors (the connection's, the shared state, its options, the
//! READY pipe) by the numbers the holder put in its environment, builds
//! the server in the shared state (attaching to what a dead server left),
//! serves, says READY, and runs until the session ends (the mount is gone)
//! or SIGTERM, then saves and exits 0.
//!
//! It never mounts, unmounts or takes the lock: those are the holder's.

use std::io::Write;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use tracing::{error, info};

use super::{signals, SERVE_FDS};
use crate::mount::config::{MountConfig, MountRequest};
use crate::sys::shm::SharedState;

/// The descriptors a server was started with.
struct ServeFds {
    state: OwnedFd,
    config: RawFd,
    ready: OwnedFd,
    fuse: Vec<OwnedFd>,
}

fn serve_fds() -> Option<ServeFds> {
    let spec = std::env::var(SERVE_FDS).ok()?;
    let (mut state, mut config, mut ready, mut fuse) = (None, None, None, Vec::new());
    for part in spec.split(';') {
        let (k, v) = part.split_once('=')?;
        let nums: Vec<RawFd> = v
            .split(',')
            .filter(|s| !s.is_empty())
            .map(|s| s.parse().ok())
            .collect::<Option<_>>()?;
        match k {
            "state" => state = nums.first().copied(),
            "config" => config = nums.first().copied(),
            "ready" => ready = nums.first().copied(),
            "fuse" => fuse = nums,
            _ => return None,
        }
    }
    // SAFETY: the holder passed these descriptors to this process for it
    // alone, each once, by these numbers.
    unsafe {
        Some(ServeFds {
            state: OwnedFd::from_raw_fd(state?),
            config: config?,
            ready: OwnedFd::from_raw_fd(ready?),
            fuse: fuse.into_iter().map(|f| OwnedFd::from_raw_fd(f)).collect(),
        })
    }
}

/// `locafs __serve`: a server, started by the process that holds a mount
/// with the connection's descriptors, the shared state and the options
/// (see [`hold`]). Serves until the session ends (the mount is gone) or
/// SIGTERM, then saves and exits 0; a configuration error exits 2, any
/// other failure 1.
pub fn serve_main() -> ExitCode {
    serve_with(crate::mount::open_source)
}

/// [`serve_main`] over the source `source` makes of the options (a test
/// puts a source with a gate or a fault behind a server this way).
pub fn serve_with(
    source: impl FnOnce(&MountConfig) -> Result<Arc<dyn crate::source::Source>, (u8, String)>,
) -> ExitCode {
    let Some(fds) = serve_fds() else {
        eprintln!("locafs: __serve is started by `locafs mount`, not by hand");
        return ExitCode::from(2);
    };
    let state = match SharedState::open(fds.state) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("locafs: shared state: {e}");
            return ExitCode::from(2);
        }
    };
    // The options as the holder resolved them.
    let args = MountRequest {
        config: Some(format!("/proc/self/fd/{}", fds.config).into()),
        ..MountRequest::default()
    };
    let cfg = match crate::mount::config::resolve_live(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("locafs: {e}");
            return ExitCode::from(2);
        }
    };
    crate::obs::logging::init(cfg.log_format, cfg.log_file.as_deref());
    let signals = match signals::Signals::catch(&[libc::SIGTERM]) {
        Ok(s) => s,
        Err(e) => {
            error!("signals: {e}");
            return ExitCode::from(1);
        }
    };
    let mut server = match source(&cfg).and_then(|src| start_server(&cfg, src, &state, fds.fuse)) {
        Ok(s) => s,
        Err((code, msg)) => {
            error!("{msg}");
            eprintln!("locafs: {msg}");
            return ExitCode::from(code);
        }
    };
    // One write (a pipe keeps up to 4 KiB in one piece), read at once.
    let mut ready = std::fs::File::from(fds.ready);
    let mut line = format!("READY {}", server.summary);
    line.truncate(4000);
    line.push('\n');
    let _ = ready.write_all(line.as_bytes());
    drop(ready);
    crate::mount::detach_output();
    loop {
        let woke = signals::wait_readable(&[signals.fd()], Duration::from_millis(200));
        if woke[0] && signals.drain().contains(&libc::SIGTERM) {
            info!("SIGTERM: this server stops (the mount stays with its holder)");
            break;
        }
        if server.finished() {
            break;
        }
    }
    server.stop();
    ExitCode::SUCCESS
}

/// Assembles a server in `state` as every mount is (`Server::build`:
/// `mount::assemble`, then the services) and serves the connection read
/// through `fuse`.
fn start_server(
    cfg: &MountConfig,
    source: Arc<dyn crate::source::Source>,
    state: &Arc<SharedState>,
    fuse: Vec<OwnedFd>,
) -> Result<crate::mount::Server, (u8, String)> {
    let mut server = crate::mount::Server::build(cfg, source, state)?;
    server.serve(fuse, crate::mount::recorded_init(state))?;
    Ok(server)
}
