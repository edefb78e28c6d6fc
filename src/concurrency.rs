//! How many background fetches read-ahead keeps in flight: a fixed number
//! (`--prefetch-jobs N`), or, by default (`auto`), a number tuned to the
//! source as it answers.
//!
//! A remote source (NFS across a data centre, an object store) answers each
//! request in 10-50 ms, and only many requests in flight reach its
//! bandwidth; a local disk or a busy server is saturated by few. So the
//! [`Tuner`] measures the source over short windows (bytes per second and
//! the mean latency of a read) and moves the limit as TCP does: it doubles
//! while throughput still rises by more than 10 % (slow start); then it adds
//! an eighth while a read's latency (smoothed over windows) stays near the
//! lowest seen (the source is not queueing yet). Once latency climbs past
//! 1.5x that, latency alone cannot say whether the source queues or only
//! this host is busy (a loaded machine's wake-ups slow every read), so
//! throughput decides: it takes off a sixth when throughput fell or when
//! its last step up bought nothing (requests wait at the source), and
//! otherwise steps up again and judges that step by the next window; it
//! halves on any source error or timeout, and on any answer of the source
//! asking to slow down (an object store's 503 SlowDown or 429, which the
//! source retried: the store said so, there is nothing to infer). A window in which
//! read-ahead did not use its whole limit says nothing about the source and
//! changes nothing. The limit stays between a floor and a ceiling, and under
//! what the prefetch memory can hold at the mean size of a read.
//!
//! The tuner is pure logic, driven by measured [`Window`]s (tested below
//! against simulated sources); [`Limiter`] is the semaphore whose permits it
//! resizes. It must never go below its floor or above its ceiling, and never
//! block: a shrink takes effect as fetches in flight complete.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// `--prefetch-jobs`: `auto` (the default) or a fixed number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Jobs {
    Auto,
    Fixed(usize),
}

/// Bounds of the automatic concurrency.
pub const AUTO_START: usize = 4;
pub const AUTO_FLOOR: usize = 4;
pub const AUTO_CEILING: usize = 256;

impl std::str::FromStr for Jobs {
    type Err = String;
    fn from_str(s: &str) -> Result<Jobs, String> {
        if s.eq_ignore_ascii_case("auto") {
            return Ok(Jobs::Auto);
        }
        match s.parse::<usize>() {
            Ok(n) if (1..=1024).contains(&n) => Ok(Jobs::Fixed(n)),
            _ => Err(format!(
                "{s:?}: expected `auto` or a number between 1 and 1024"
            )),
        }
    }
}

/// From a configuration file: `prefetch-jobs = 32` or `= "auto"`.
impl<'de> serde::Deserialize<'de> for Jobs {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u64),
            S(String),
        }
        match Raw::deserialize(d)? {
            Raw::N(n) => n.to_string().parse(),
            Raw::S(s) => s.parse(),
        }
        .map_err(serde::de::Error::custom)
    }
}

impl std::fmt::Display for Jobs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Jobs::Auto => f.write_str("auto"),
            Jobs::Fixed(n) => write!(f, "{n}"),
        }
    }
}

/// What the source did during one measuring window.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Window {
    /// Length of the window.
    pub secs: f64,
    /// Bytes and reads the source completed in it.
    pub bytes: u64,
    pub reads: u64,
    /// Sum of those reads' latencies.
    pub latency_total: Duration,
    /// Reads that failed or timed out.
    pub errors: u64,
    /// Answers of the source asking to slow down (retried by the source).
    pub throttled: u64,
    /// Whether read-ahead wanted more in flight than the limit allowed at
    /// some point of the window (a window without demand says nothing).
    pub saturated: bool,
}

/// The limit's controller (see the module's text).
#[derive(Clone, Debug)]
pub struct Tuner {
    limit: usize,
    floor: usize,
    ceiling: usize,
    /// Bytes of prefetch memory: the limit stays under memory / mean read.
    memory: u64,
    slow_start: bool,
    /// Throughput of the last window that counted, bytes/s.
    last_rate: f64,
    /// The lowest mean read latency seen (s). Learnt again when backing
    /// off has reached the floor and reads still take longer (a source that
    /// became slower for good).
    base_latency: f64,
    /// The mean read latency, smoothed over windows (s).
    latency: f64,
    /// The last window stepped the limit up (past slow start): this one
    /// says whether that step bought throughput.
    probed: bool,
    /// The last window cut the limit.
    cut: bool,
}

/// Latency past this multiple of the lowest: the source queues, back off.
const QUEUEING: f64 = 1.5;
/// Latency under this multiple of the lowest: room for more in flight.
const UNLOADED: f64 = 1.15;

impl Tuner {
    pub fn new(start: usize, floor: usize, ceiling: usize, memory: u64) -> Tuner {
        let floor = floor.max(1);
        let ceiling = ceiling.max(floor);
        Tuner {
            limit: start.clamp(floor, ceiling),
            floor,
            ceiling,
            memory,
            slow_start: true,
            last_rate: 0.0,
            base_latency: f64::INFINITY,
            latency: f64::INFINITY,
            probed: false,
            cut: false,
        }
    }

    /// The limit now.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// The mean latency of a read in the windows so far, lowest (seconds).
    pub fn base_latency(&self) -> f64 {
        self.base_latency
    }

    /// Feeds one window; returns the new limit.
    pub fn observe(&mut self, w: &Window) -> usize {
        if w.errors > 0 || w.throttled > 0 {
            self.slow_start = false;
            (self.probed, self.cut) = (false, true);
            self.set(self.limit / 2);
            return self.limit;
        }
        if w.reads == 0 || w.secs <= 0.0 || !w.saturated {
            return self.limit;
        }
        // Smoothed over windows: on a busy machine a read's latency jumps
        // with the scheduler, and one slow window must not cut the limit.
        let sample = w.latency_total.as_secs_f64() / w.reads as f64;
        let latency = if self.latency.is_finite() {
            0.7 * self.latency + 0.3 * sample
        } else {
            sample
        };
        self.latency = latency;
        let rate = w.bytes as f64 / w.secs;
        if self.limit == self.floor && latency > QUEUEING * self.base_latency {
            self.base_latency = latency;
        }
        self.base_latency = self.base_latency.min(latency);
        let ceiling = self.ceiling_for(w.bytes / w.reads);
        // Reads take longer than they did: the source queues, or only this
        // host is busy (its wake-ups inflate every read's latency, while
        // more in flight still pays: figure 5 of `cargo bench --bench
        // readahead` ended at 18-32 in flight where the raw reader still
        // gained from 64 to 128). Only throughput tells them apart: cut when
        // it fell, or when the last step up bought nothing; else step up
        // and judge that step by the next window. (Throughput that fell
        // after a cut of ours says nothing about the source.)
        let slow = latency > QUEUEING * self.base_latency;
        let fell = !self.cut && rate < self.last_rate * 0.9;
        let queueing = slow && (fell || (self.probed && rate < self.last_rate * 1.05));
        let next = if queueing {
            self.slow_start = false;
            // Below where a step up that bought nothing started (at small
            // limits both steps are one).
            self.limit - (self.limit / 6).max(1 + self.probed as usize)
        } else if self.slow_start {
            if rate > self.last_rate * 1.1 {
                self.limit * 2
            } else {
                // Doubling bought nothing: back to between the two.
                self.slow_start = false;
                self.limit * 3 / 4
            }
        } else if slow || latency < UNLOADED * self.base_latency {
            self.limit + (self.limit / 8).max(1)
        } else {
            self.limit
        };
        self.probed = !self.slow_start && next > self.limit;
        self.cut = next < self.limit;
        self.last_rate = rate;
        self.set(next.min(ceiling));
        self.limit
    }

    /// The ceiling, and what the memory holds at reads of `mean` bytes.
    fn ceiling_for(&self, mean: u64) -> usize {
        let by_memory = (self.memory / mean.max(4096)).min(usize::MAX as u64) as usize;
        self.ceiling.min(by_memory).max(self.floor)
    }

    fn set(&mut self, n: usize) {
        self.limit = n.clamp(self.floor, self.ceiling);
    }
}

/// A semaphore of fetch slots whose size can change while slots are held:
/// growing adds permits; shrinking forgets free permits at once and the
/// rest as held ones come back.
pub struct Limiter {
    sem: Arc<Semaphore>,
    limit: AtomicUsize,
    /// Permits to forget as they come back (a shrink past the free ones).
    owed: Arc<AtomicUsize>,
    /// An acquire found no free slot since the last `take_saturated`.
    saturated: AtomicBool,
}

/// One fetch slot; gives itself back on drop (or is forgotten, if the
/// limiter shrank meanwhile).
pub struct Slot {
    permit: Option<OwnedSemaphorePermit>,
    owed: Arc<AtomicUsize>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let owed = self
            .owed
            .fetch_update(Relaxed, Relaxed, |o| o.checked_sub(1))
            .is_ok();
        if let (true, Some(p)) = (owed, self.permit.take()) {
            p.forget();
        }
    }
}

impl Limiter {
    pub fn new(n: usize) -> Limiter {
        let n = n.max(1);
        Limiter {
            sem: Arc::new(Semaphore::new(n)),
            limit: AtomicUsize::new(n),
            owed: Arc::new(AtomicUsize::new(0)),
            saturated: AtomicBool::new(false),
        }
    }

    /// Waits for a slot; None once the limiter is closed.
    pub async fn acquire(&self) -> Option<Slot> {
        let permit = match Arc::clone(&self.sem).try_acquire_owned() {
            Ok(p) => p,
            Err(tokio::sync::TryAcquireError::Closed) => return None,
            Err(tokio::sync::TryAcquireError::NoPermits) => {
                self.saturated.store(true, Relaxed);
                Arc::clone(&self.sem).acquire_owned().await.ok()?
            }
        };
        Some(Slot {
            permit: Some(permit),
            owed: Arc::clone(&self.owed),
        })
    }

    /// Whether an acquire had to wait since the last call.
    pub fn take_saturated(&self) -> bool {
        self.saturated.swap(false, Relaxed)
    }

    pub fn limit(&self) -> usize {
        self.limit.load(Relaxed)
    }

    /// Sets the number of slots (at least 1).
    pub fn resize(&self, n: usize) {
        let n = n.max(1);
        let old = self.limit.swap(n, Relaxed);
        if n > old {
            let mut add = n - old;
            // Cancel debts first: slots not yet forgotten stay in use.
            while add > 0 {
                match self
                    .owed
                    .fetch_update(Relaxed, Relaxed, |o| o.checked_sub(1))
                {
                    Ok(_) => add -= 1,
                    Err(_) => break,
                }
            }
            self.sem.add_permits(add);
        } else if n < old {
            let cut = old - n;
            let forgotten = self.sem.forget_permits(cut);
            self.owed.fetch_add(cut - forgotten, Relaxed);
        }
    }

    pub fn close(&self) {
        self.sem.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A source that serves at most `n` reads at a time at `latency` each;
    /// past `n`, reads queue (latency grows with the queue). Reads of 110 KiB.
    struct Simulated {
        n: usize,
        latency: f64,
    }

    const READ: u64 = 110 << 10;

    impl Simulated {
        fn window(&self, inflight: usize, secs: f64) -> Window {
            let served = inflight.min(self.n) as f64;
            let latency = self.latency * (inflight as f64 / self.n as f64).max(1.0);
            let reads = (served / self.latency * secs) as u64;
            Window {
                secs,
                bytes: reads * READ,
                reads,
                latency_total: Duration::from_secs_f64(latency * reads as f64),
                errors: 0,
                throttled: 0,
                saturated: true,
            }
        }
    }

    fn run(t: &mut Tuner, src: &Simulated, windows: usize) -> Vec<usize> {
        (0..windows)
            .map(|_| t.observe(&src.window(t.limit(), 0.1)))
            .collect()
    }

    #[test]
    fn converges_near_where_the_source_saturates() {
        for n in [6, 20, 64, 100, 200] {
            let mut t = Tuner::new(AUTO_START, AUTO_FLOOR, AUTO_CEILING, 1 << 30);
            let src = Simulated { n, latency: 0.02 };
            let limits = run(&mut t, &src, 200);
            // After the start, the limit stays between n and 1.5 n (where
            // reads queue): all the source gives, little queued.
            for &l in &limits[100..] {
                assert!(
                    l >= n.max(AUTO_FLOOR) && l as f64 <= (1.5 * n as f64).max(AUTO_FLOOR as f64),
                    "source saturating at {n}: limit {l} ({limits:?})"
                );
            }
        }
    }

    #[test]
    fn a_source_asking_to_slow_down_halves_the_limit_each_window() {
        // An object store serving 100 at a time at 20 ms: the limit climbs
        // past 100. Then it answers some requests 503 SlowDown; the source
        // retries them, so throughput and latency barely move (the retries
        // succeed), but each window with such answers halves the limit,
        // down to the floor, and says nothing else.
        let src = Simulated {
            n: 100,
            latency: 0.02,
        };
        let mut t = Tuner::new(AUTO_START, AUTO_FLOOR, AUTO_CEILING, 1 << 30);
        run(&mut t, &src, 100);
        let high = t.limit();
        assert!(high >= 100, "{high}");
        let mut limits = Vec::new();
        for _ in 0..10 {
            let mut w = src.window(t.limit(), 0.1);
            w.throttled = 3;
            limits.push(t.observe(&w));
        }
        assert_eq!(limits[0], high / 2, "{limits:?}");
        assert_eq!(limits[1], high / 4, "{limits:?}");
        assert_eq!(*limits.last().unwrap(), AUTO_FLOOR, "{limits:?}");
        // A throttled window counts even when read-ahead did not fill its
        // limit (the loader's own reads were throttled).
        let mut t = Tuner::new(64, AUTO_FLOOR, AUTO_CEILING, 1 << 30);
        let mut w = src.window(64, 0.1);
        w.saturated = false;
        assert_eq!(t.observe(&w), 64);
        w.throttled = 1;
        assert_eq!(t.observe(&w), 32);
        // Once the store stops asking, the limit climbs again.
        let mut t = Tuner::new(AUTO_START, AUTO_FLOOR, AUTO_CEILING, 1 << 30);
        let mut w = src.window(t.limit(), 0.1);
        w.throttled = 1;
        t.observe(&w);
        let after = run(&mut t, &src, 100);
        assert!(*after.last().unwrap() >= 100, "{after:?}");
    }

    #[test]
    fn scheduler_noise_in_latency_does_not_drag_the_limit_down() {
        // Each window's latency off by -30 %..+50 % (a busy machine's
        // wake-ups), throughput as the source gives it.
        let src = Simulated {
            n: 100,
            latency: 0.02,
        };
        let mut t = Tuner::new(AUTO_START, AUTO_FLOOR, AUTO_CEILING, 1 << 30);
        let mut seed = 7u64;
        let mut limits = Vec::new();
        for _ in 0..300 {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let noise = 0.7 + 0.8 * ((seed >> 33) as f64 / (1u64 << 31) as f64);
            let mut w = src.window(t.limit(), 0.1);
            w.latency_total = w.latency_total.mul_f64(noise);
            limits.push(t.observe(&w));
        }
        let mut tail = limits[100..].to_vec();
        tail.sort();
        let median = tail[tail.len() / 2];
        assert!((80..=200).contains(&median), "median {median}: {limits:?}");
    }

    #[test]
    fn a_busy_host_that_slows_every_read_does_not_drag_the_limit_down() {
        // The source serves 100 at a time at 20 ms; after a while this host
        // gets busy and every read it times takes 1.7x as long (wake-ups),
        // while the source still gives what it did: more in flight pays.
        let src = Simulated {
            n: 100,
            latency: 0.02,
        };
        let mut t = Tuner::new(AUTO_START, AUTO_FLOOR, AUTO_CEILING, 1 << 30);
        run(&mut t, &src, 30);
        let mut limits = Vec::new();
        for _ in 0..200 {
            let mut w = src.window(t.limit(), 0.1);
            w.latency_total = w.latency_total.mul_f64(1.7);
            limits.push(t.observe(&w));
        }
        // Never down to half of what the source serves at once (the
        // latency-only cut walked it down to the floor, where the lowest
        // latency is learnt again, and back up).
        let low = *limits.iter().min().unwrap();
        assert!(low >= 50, "lowest {low}: {limits:?}");
    }

    #[test]
    fn backs_off_when_the_source_slows_and_climbs_again() {
        let mut t = Tuner::new(AUTO_START, AUTO_FLOOR, AUTO_CEILING, 1 << 30);
        run(
            &mut t,
            &Simulated {
                n: 100,
                latency: 0.02,
            },
            100,
        );
        let before = t.limit();
        assert!(before >= 100, "{before}");
        // The source now serves 25 at a time (another job took the rest).
        let limits = run(
            &mut t,
            &Simulated {
                n: 25,
                latency: 0.02,
            },
            100,
        );
        assert!(limits[..20].iter().any(|&l| l < before), "{limits:?}");
        for &l in &limits[60..] {
            assert!((25..=38).contains(&l), "{limits:?}");
        }
        // And gives 100 again: the limit climbs back.
        let limits = run(
            &mut t,
            &Simulated {
                n: 100,
                latency: 0.02,
            },
            100,
        );
        assert!(*limits.last().unwrap() >= 100, "{limits:?}");
    }

    #[test]
    fn a_source_that_became_slower_for_good_is_learnt_again() {
        let mut t = Tuner::new(AUTO_START, AUTO_FLOOR, AUTO_CEILING, 1 << 30);
        run(
            &mut t,
            &Simulated {
                n: 64,
                latency: 0.02,
            },
            100,
        );
        // Every read now takes 3x longer, but 64 at a time still helps.
        let limits = run(
            &mut t,
            &Simulated {
                n: 64,
                latency: 0.06,
            },
            300,
        );
        assert!(*limits.last().unwrap() >= 64, "{limits:?}");
    }

    #[test]
    fn errors_halve_and_idle_windows_hold() {
        let mut t = Tuner::new(64, AUTO_FLOOR, AUTO_CEILING, 1 << 30);
        let mut w = Simulated {
            n: 100,
            latency: 0.02,
        }
        .window(64, 0.1);
        w.saturated = false;
        assert_eq!(t.observe(&w), 64, "no demand: no change");
        assert_eq!(t.observe(&Window::default()), 64, "nothing read: no change");
        w.errors = 1;
        assert_eq!(t.observe(&w), 32);
        for _ in 0..10 {
            t.observe(&w);
        }
        assert_eq!(t.limit(), AUTO_FLOOR, "never below the floor");
    }

    #[test]
    fn never_above_the_ceiling_nor_what_memory_holds() {
        let src = Simulated {
            n: 10_000,
            latency: 0.02,
        };
        let mut t = Tuner::new(AUTO_START, AUTO_FLOOR, AUTO_CEILING, 1 << 30);
        assert!(run(&mut t, &src, 100).iter().all(|&l| l <= AUTO_CEILING));
        assert_eq!(t.limit(), AUTO_CEILING);
        // 4 MiB of prefetch memory holds 37 reads of 110 KiB.
        let mut t = Tuner::new(AUTO_START, AUTO_FLOOR, AUTO_CEILING, 4 << 20);
        let limits = run(&mut t, &src, 100);
        assert!(limits.iter().all(|&l| l <= 37), "{limits:?}");
        assert_eq!(t.limit(), 37);
    }

    #[test]
    fn jobs_parse() {
        assert_eq!("auto".parse(), Ok(Jobs::Auto));
        assert_eq!("AUTO".parse(), Ok(Jobs::Auto));
        assert_eq!("32".parse(), Ok(Jobs::Fixed(32)));
        assert!("0".parse::<Jobs>().is_err());
        assert!("1025".parse::<Jobs>().is_err());
        assert!("many".parse::<Jobs>().is_err());
        assert_eq!(Jobs::Fixed(8).to_string(), "8");
    }

    #[tokio::test]
    async fn limiter_grows_and_shrinks_while_slots_are_held() {
        let l = Limiter::new(2);
        let a = l.acquire().await.unwrap();
        let b = l.acquire().await.unwrap();
        assert!(!l.take_saturated());
        assert!(l.sem.available_permits() == 0);
        l.resize(4);
        let c = l.acquire().await.unwrap();
        let _d = l.acquire().await.unwrap();
        // Shrink to 1 with 4 held: 3 are forgotten as they come back.
        l.resize(1);
        drop((a, b, c));
        assert_eq!(l.sem.available_permits(), 0);
        assert!(
            tokio::time::timeout(Duration::from_millis(20), l.acquire())
                .await
                .is_err(),
            "a fifth slot while the one allowed is held"
        );
        assert!(l.take_saturated());
        drop(_d);
        assert_eq!(l.sem.available_permits(), 1);
        // Growing while debts remain cancels them first.
        l.resize(3);
        let held = [
            l.acquire().await.unwrap(),
            l.acquire().await.unwrap(),
            l.acquire().await.unwrap(),
        ];
        l.resize(1);
        l.resize(2);
        drop(held);
        assert_eq!(l.sem.available_permits(), 2);
    }
}
