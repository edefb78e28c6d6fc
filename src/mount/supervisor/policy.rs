//! When the holder starts a server again, gives up, or takes a server for
//! hung: pure decisions over what it saw (how long a server lived, whether
//! it was ready, how long the watchdog's probe has waited), tested without
//! processes.
//!
//! It never sleeps, reads a clock or looks at a process itself: callers
//! give it durations and act on its answers.

use std::time::Duration;

/// A server that served this long after it said READY counts as healthy:
/// its death starts the count of quick failures again.
pub const STABLE: Duration = Duration::from_secs(10);
/// So does one that took this many requests: it made progress (a server
/// killed by a request it cannot survive, sent again to each new one,
/// dies long before).
pub const PROGRESS: u64 = 64;
/// Quick failures in a row after which the holder gives up.
pub const MAX_QUICK_FAILURES: u32 = 5;
/// The wait before the second quick failure's restart; each next one
/// doubles it, up to [`MAX_DELAY`]. The first restart is immediate: a
/// single crash costs the readers nothing but the new server's start.
pub const FIRST_DELAY: Duration = Duration::from_millis(250);
pub const MAX_DELAY: Duration = Duration::from_secs(4);

/// What to do after a server died.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Start a new server after this wait.
    Restart(Duration),
    /// Give up: unmount and exit non-zero.
    GiveUp,
}

/// The crash-loop bound: quick failures in a row.
#[derive(Debug, Default)]
pub struct Backoff {
    quick: u32,
}

impl Backoff {
    /// A server died `served` after it said READY (None: before), having
    /// taken `requests`: start another (after how long), or give up after
    /// [`MAX_QUICK_FAILURES`] quick ones in a row (each died before READY,
    /// or within [`STABLE`] of it having taken fewer than [`PROGRESS`]
    /// requests).
    pub fn after_exit(&mut self, served: Option<Duration>, requests: u64) -> Next {
        if served.is_some_and(|s| s >= STABLE) || requests >= PROGRESS {
            // Healthy until it died: not part of a loop.
            self.quick = 0;
            return Next::Restart(Duration::ZERO);
        }
        self.quick += 1;
        if self.quick > MAX_QUICK_FAILURES {
            return Next::GiveUp;
        }
        Next::Restart(delay(self.quick))
    }

    /// Quick failures in a row so far.
    pub fn quick_failures(&self) -> u32 {
        self.quick
    }
}

/// The wait before the restart after the `n`th quick failure in a row.
fn delay(n: u32) -> Duration {
    match n {
        0 | 1 => Duration::ZERO,
        n => FIRST_DELAY
            .saturating_mul(1 << (n - 2).min(16))
            .min(MAX_DELAY),
    }
}

/// Whether the serving process is hung: the watchdog's probe (a request
/// the server answers from its runtime, see `supervisor::watchdog`) has
/// waited longer than `deadline`, and requests other than the probe wait
/// in the kernel (`waiting` from fusectl; None when it cannot be read,
/// then the probe alone decides). A stalled source is not a hang: the
/// server answers the probe at once while the source is silent.
pub fn hung(probe_waited: Option<Duration>, deadline: Duration, waiting: Option<u64>) -> bool {
    match probe_waited {
        Some(w) if w > deadline => waiting.is_none_or(|n| n > 1),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_crash_loop_is_retried_with_a_growing_wait_then_given_up() {
        let mut b = Backoff::default();
        let quick = Duration::from_millis(50);
        let mut waits = Vec::new();
        while let Next::Restart(d) = b.after_exit(Some(quick), 3) {
            waits.push(d);
            assert!(waits.len() <= MAX_QUICK_FAILURES as usize);
        }
        assert_eq!(waits.len(), MAX_QUICK_FAILURES as usize);
        assert_eq!(waits[0], Duration::ZERO, "a single crash restarts at once");
        assert!(waits.windows(2).all(|w| w[0] <= w[1]));
        assert!(waits.iter().all(|w| *w <= MAX_DELAY));
        let total: Duration = waits.iter().sum();
        assert!(total < Duration::from_secs(10), "{total:?}");
    }

    #[test]
    fn a_server_that_lived_long_starts_the_count_again() {
        let mut b = Backoff::default();
        for _ in 0..MAX_QUICK_FAILURES - 1 {
            assert!(matches!(b.after_exit(None, 0), Next::Restart(_)));
        }
        // Healthy for a while, then a crash: an immediate restart.
        assert_eq!(b.after_exit(Some(STABLE), 0), Next::Restart(Duration::ZERO));
        assert_eq!(b.quick_failures(), 0);
        for _ in 0..MAX_QUICK_FAILURES {
            assert!(matches!(b.after_exit(None, 0), Next::Restart(_)));
        }
        assert_eq!(b.after_exit(None, 0), Next::GiveUp);
    }

    #[test]
    fn a_server_that_served_many_requests_is_no_crash_loop_however_short_it_lived() {
        let mut b = Backoff::default();
        for _ in 0..3 * MAX_QUICK_FAILURES {
            let short = Some(Duration::from_millis(300));
            assert_eq!(b.after_exit(short, PROGRESS), Next::Restart(Duration::ZERO));
        }
        // One that dies on the requests sent again to it does not.
        for _ in 0..MAX_QUICK_FAILURES {
            assert!(matches!(
                b.after_exit(Some(Duration::ZERO), 5),
                Next::Restart(_)
            ));
        }
        assert_eq!(b.after_exit(Some(Duration::ZERO), 5), Next::GiveUp);
    }

    #[test]
    fn only_an_overdue_probe_with_other_requests_waiting_is_a_hang() {
        let d = Duration::from_secs(5);
        let late = Some(Duration::from_secs(6));
        assert!(hung(late, d, Some(3)));
        assert!(hung(late, d, None), "no fusectl: the probe decides");
        assert!(
            !hung(late, d, Some(1)),
            "only the probe waits: nobody is held"
        );
        assert!(!hung(Some(Duration::from_secs(4)), d, Some(100)));
        assert!(!hung(None, d, Some(100)), "no probe out: answered");
    }
}
