//! The source guard: the one way the mount calls into the source. Every call
//! runs on a bounded pool of worker threads owned by the guard, and its
//! caller waits at most a deadline: `--metadata-timeout` for `stat`, `list`,
//! `read_link`, `statvfs` and the POSIX ACLs (`acls`), `--source-timeout`
//! for data. Async callers (the reader) hold no thread at all while they
//! wait. A listing reports its
//! progress entry by entry, and its deadline runs from its last progress:
//! a directory of a million entries lists however long that takes, while a
//! listing that stops advancing times out a deadline after it stopped (and
//! nothing of it is returned).
//!
//! A call into a hung NFS server cannot be cancelled: its thread sleeps
//! uninterruptibly until the server answers. So the guard also watches the
//! source's health. When a call has been waiting longer than the metadata
//! deadline and no call has completed in that time, the source is
//! **stalled**: callers still waiting stop waiting (ETIMEDOUT), new calls
//! are refused at once rather than given another thread, and one probe
//! thread waits for the source to answer. The first answer, of the probe or of any stuck call,
//! ends the stall; nothing needs a remount. Callers above (the namespace, the
//! reader) answer what they can from what the mount already holds.
//!
//! A caller that must not wait at all (a FUSE thread answering a lookup)
//! hands over its answer instead ([`SourceGuard::stat_then`]): the worker
//! that gets the source's answer gives it, with no hop back to the runtime,
//! and the guard's deadline thread gives ETIMEDOUT if the deadline comes
//! first; exactly one of them answers.
//!
//! It must never let a caller wait past its deadline, never run more threads
//! than its pools' bounds plus one probe, and never change what a call that
//! completes in time returns.

use std::collections::{BTreeMap, VecDeque};
use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures::future::BoxFuture;
use parking_lot::{Condvar, Mutex};
use tracing::{info, warn};

use crate::obs::stats::Stats;
use crate::source::{Acls, DirName, Source, SourceAttr, SourceError, SourceVersion};

/// Deadlines and thread bounds of the guard.
#[derive(Clone, Copy, Debug)]
pub struct GuardConfig {
    /// The longest a metadata call is waited for; also how long the source
    /// may go without answering anything, while a call waits, before it
    /// counts as stalled.
    pub metadata_timeout: Duration,
    /// The longest a data read is waited for (`--source-timeout`).
    pub data_timeout: Duration,
    /// Worker threads for metadata calls, at most.
    pub metadata_threads: usize,
    /// Worker threads for data reads, at most.
    pub data_threads: usize,
}

/// Worker threads for metadata calls, at most: enough for a walk of many
/// directories at once; a `stat` that needs more is queued behind them.
pub const METADATA_THREADS: usize = 32;
/// Worker threads for data reads, at most: above the deepest read-ahead
/// (jobs plus windows) and loader concurrency seen; a read past it queues.
pub const DATA_THREADS: usize = 256;

impl GuardConfig {
    pub fn new(metadata_timeout: Duration, data_timeout: Duration) -> Self {
        GuardConfig {
            metadata_timeout,
            data_timeout,
            metadata_threads: METADATA_THREADS,
            data_threads: DATA_THREADS,
        }
    }
}

/// The error a caller sees when its deadline passed or the source is
/// stalled.
pub fn timed_out() -> io::Error {
    io::Error::from_raw_os_error(libc::ETIMEDOUT)
}

/// Whether an error means "the source did not answer in time" (from the
/// guard, or from the source itself, as a soft NFS mount says it).
pub fn is_timeout(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::ETIMEDOUT)
}

type Job = Box<dyn FnOnce() + Send>;

/// A bounded pool of worker threads. Threads start on demand up to `max` and
/// end after [`IDLE_EXIT`] without a job (counted from their last job, so a
/// trickle of calls that wakes idle workers in turn keeps no more of them
/// than it needs); jobs past `max` wait in the queue (their callers'
/// deadlines still run).
struct Pool {
    name: &'static str,
    max: usize,
    state: Mutex<PoolState>,
    work: Condvar,
    stats: Arc<Stats>,
}

#[derive(Default)]
struct PoolState {
    queue: VecDeque<Job>,
    threads: usize,
    idle: usize,
    /// The guard is gone: idle workers end now, not at their idle timeout.
    closed: bool,
}

/// How long a worker may go without a job before it ends. A read-ahead
/// burst starts up to [`DATA_THREADS`] of them; a thread costs about 20 µs
/// to start again, and an idle one holds its stack and a task slot, so
/// they go soon: measured on a mount after reading 2,000 files, 93
/// threads at the end of the burst, 14 five seconds later (62 after 30 s
/// when a worker stayed a minute; docs/operations.md, "Threads").
pub const IDLE_EXIT: Duration = Duration::from_secs(5);

impl Pool {
    fn new(name: &'static str, max: usize, stats: Arc<Stats>) -> Arc<Self> {
        Arc::new(Pool {
            name,
            max: max.max(1),
            state: Mutex::new(PoolState::default()),
            work: Condvar::new(),
            stats,
        })
    }

    fn submit(self: &Arc<Self>, job: Job) {
        let mut st = self.state.lock();
        st.queue.push_back(job);
        // `idle` counts workers asleep, including those already woken for
        // earlier jobs that have not taken them yet: only as many queued
        // jobs as that can be left to them. (Waking one idle worker per job
        // whatever the queue held let a burst of reads queue behind a few
        // workers, each read waiting for the ones before it: measured under
        // figure 5 of `cargo bench --bench readahead`, a background fetch
        // held its slot 86 ms for a 31 ms source read.)
        if st.idle > 0 {
            self.work.notify_one();
        }
        if st.queue.len() <= st.idle || st.threads >= self.max {
            return;
        }
        let me = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name(format!("locafs-{}", self.name))
            .spawn(move || me.worker());
        if spawned.is_ok() {
            st.threads += 1;
            let n = self.stats.source_threads.fetch_add(1, Relaxed) + 1;
            self.stats.source_threads_peak.fetch_max(n, Relaxed);
        }
        // If no thread could start, the job waits for a running one; its
        // caller's deadline still holds.
    }

    fn worker(self: Arc<Self>) {
        let mut st = self.state.lock();
        let mut last_job = Instant::now();
        loop {
            if let Some(job) = st.queue.pop_front() {
                drop(st);
                job();
                st = self.state.lock();
                last_job = Instant::now();
                continue;
            }
            // Woken without a job (another worker took it) counts as idle
            // time all the same.
            let retire_at = last_job + IDLE_EXIT;
            if st.closed || Instant::now() >= retire_at {
                st.threads -= 1;
                self.stats.source_threads.fetch_sub(1, Relaxed);
                return;
            }
            st.idle += 1;
            self.work.wait_until(&mut st, retire_at);
            st.idle -= 1;
        }
    }
}

impl Pool {
    /// Ends the idle workers (busy ones end when their call returns).
    fn close(&self) {
        self.state.lock().closed = true;
        self.work.notify_all();
    }
}

/// How a finished call reaches its caller, and whether the caller still
/// waits for it (a call queued behind stuck ones whose caller gave up is
/// never started).
enum Reply<T> {
    Blocking(mpsc::SyncSender<T>, Arc<AtomicBool>),
    Async(tokio::sync::oneshot::Sender<T>),
}

impl<T> Reply<T> {
    fn wanted(&self) -> bool {
        match self {
            Reply::Blocking(_, gave_up) => !gave_up.load(Relaxed),
            Reply::Async(tx) => !tx.is_closed(),
        }
    }

    fn send(self, v: T) {
        match self {
            Reply::Blocking(tx, _) => {
                let _ = tx.try_send(v);
            }
            Reply::Async(tx) => {
                let _ = tx.send(v);
            }
        }
    }
}

/// The source's health: the calls running now, when the source last
/// answered, and whether it is stalled.
struct Health {
    state: Mutex<HealthState>,
    stall_after: Duration,
    stats: Arc<Stats>,
}

struct HealthState {
    /// Calls running now by id (ids grow, so the first is the oldest), with
    /// what they do (for the log line).
    running: BTreeMap<u64, (Instant, &'static str)>,
    next_id: u64,
    /// When a call last returned (with any result).
    last_answer: Instant,
    /// Since when the source is stalled, if it is.
    stalled: Option<(Instant, SystemTime)>,
    /// A probe thread is waiting on the source.
    probing: bool,
}

impl Health {
    fn begin(&self, what: &'static str) -> u64 {
        let mut st = self.state.lock();
        let id = st.next_id;
        st.next_id += 1;
        st.running.insert(id, (Instant::now(), what));
        id
    }

    /// A call returned: the source answers.
    fn end(&self, id: u64) {
        let mut st = self.state.lock();
        st.running.remove(&id);
        self.answered(&mut st);
    }

    fn answered(&self, st: &mut HealthState) {
        st.last_answer = Instant::now();
        if let Some((at, _)) = st.stalled.take() {
            self.stats.source_stalled_since_ms.store(0, Relaxed);
            info!(
                "source answers again after {:.1}s stalled; revalidation and fetches resume",
                at.elapsed().as_secs_f64()
            );
        }
    }

    /// Whether the source is stalled now; declares the stall (once) when a
    /// call has waited `stall_after` with no answer from the source
    /// meanwhile.
    fn stalled(self: &Arc<Self>, source: &Arc<dyn Source>) -> bool {
        let mut st = self.state.lock();
        if st.stalled.is_some() {
            return true;
        }
        let Some((_, &(oldest, what))) = st.running.first_key_value() else {
            return false;
        };
        let now = Instant::now();
        if now.duration_since(oldest) < self.stall_after
            || now.duration_since(st.last_answer) < self.stall_after
        {
            return false;
        }
        // The source last answered when the oldest call started or later;
        // "stalled since" is the later of the two.
        let quiet = now.duration_since(st.last_answer.max(oldest));
        let since = SystemTime::now() - quiet;
        st.stalled = Some((now - quiet, since));
        let since_ms = since
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(1)
            .max(1);
        self.stats.source_stalled_since_ms.store(since_ms, Relaxed);
        self.stats.source_stalls.fetch_add(1, Relaxed);
        warn!(
            "source stalled: no answer for {:.1}s ({} calls waiting, the oldest a {what}); \
             cached data and the last known tree are served, calls that need the source \
             fail with ETIMEDOUT until it answers again",
            quiet.as_secs_f64(),
            st.running.len()
        );
        if !st.probing {
            st.probing = true;
            self.start_probe(source);
        }
        true
    }

    /// One thread that waits for the source to answer a `stat` of its root,
    /// however long that takes; its answer (any answer) ends the stall.
    fn start_probe(self: &Arc<Self>, source: &Arc<dyn Source>) {
        let me = Arc::clone(self);
        let source = Arc::clone(source);
        let n = self.stats.source_threads.fetch_add(1, Relaxed) + 1;
        self.stats.source_threads_peak.fetch_max(n, Relaxed);
        let spawned = std::thread::Builder::new()
            .name("locafs-probe".into())
            .spawn(move || {
                loop {
                    let _ = source.stat(Path::new(""));
                    let mut st = me.state.lock();
                    me.answered(&mut st);
                    // Stuck calls may still be running: keep probing only
                    // while the source would count as stalled again.
                    if st.running.is_empty()
                        || st
                            .running
                            .first_key_value()
                            .is_some_and(|(_, (t, _))| t.elapsed() < me.stall_after)
                    {
                        st.probing = false;
                        break;
                    }
                    drop(st);
                    std::thread::sleep(me.stall_after / 4);
                }
                me.stats.source_threads.fetch_sub(1, Relaxed);
            });
        if spawned.is_err() {
            self.stats.source_threads.fetch_sub(1, Relaxed);
            self.state.lock().probing = false;
        }
    }
}

/// How far one call has come: a listing reports each entry, and its caller
/// waits until the deadline has passed since the last one, not since the
/// start (a long listing that advances is not a stall; one that stops is).
struct Progress {
    base: Instant,
    /// When the call last advanced, in ms since `base`.
    last_ms: AtomicU64,
    /// When the source's health last heard of it, in ms since `base`.
    told_ms: AtomicU64,
    health: Arc<Health>,
}

/// How often a call's progress counts as an answer of the source (its
/// health is behind a lock: not taken for every entry).
const PROGRESS_TELL_MS: u64 = 20;

impl Progress {
    fn new(health: &Arc<Health>) -> Arc<Self> {
        Arc::new(Progress {
            base: Instant::now(),
            last_ms: AtomicU64::new(0),
            told_ms: AtomicU64::new(0),
            health: Arc::clone(health),
        })
    }

    /// The call advanced: its caller waits a deadline from now, and the
    /// source counts as answering.
    fn tick(&self) {
        let ms = self.base.elapsed().as_millis() as u64;
        self.last_ms.store(ms, Relaxed);
        if ms >= self.told_ms.load(Relaxed) + PROGRESS_TELL_MS {
            self.told_ms.store(ms, Relaxed);
            let mut st = self.health.state.lock();
            self.health.answered(&mut st);
        }
    }

    /// The end of a caller's wait: `deadline` after the last progress.
    fn end(&self, deadline: Duration) -> Instant {
        self.base + Duration::from_millis(self.last_ms.load(Relaxed)) + deadline
    }
}

/// What a caller of [`SourceGuard::stat_then`] is given: the source's
/// answer or ETIMEDOUT, on whatever thread has it.
pub type StatAnswer = Answer<SourceAttr>;

/// What a caller of a handed-over call is given (a stat's attributes, an
/// entry's ACLs): the source's answer or ETIMEDOUT.
pub type Answer<T> = Box<dyn FnOnce(io::Result<T>) + Send>;

/// One handed-over answer: taken (and called) by whoever answers first.
struct Once<T>(Mutex<Option<Answer<T>>>);

impl<T> Once<T> {
    fn take(&self) -> Option<Answer<T>> {
        self.0.lock().take()
    }
}

/// A handed-over answer as the deadline thread sees it, whatever it
/// carries.
trait Handed: Send + Sync {
    fn answered(&self) -> bool;
    /// Answers ETIMEDOUT unless answered; whether it did.
    fn time_out(&self) -> bool;
}

impl<T: 'static> Handed for Once<T> {
    fn answered(&self) -> bool {
        self.0.lock().is_none()
    }

    fn time_out(&self) -> bool {
        match self.take() {
            Some(done) => {
                done(Err(timed_out()));
                true
            }
            None => false,
        }
    }
}

/// The deadlines of handed-over answers, in the order they fall: every
/// call gets the same timeout, so a new one always falls last and pushing
/// it wakes nobody (unless the queue was empty). One thread sleeps until
/// the first deadline and answers ETIMEDOUT for a call still running.
struct Deadlines {
    state: Mutex<DeadlineState>,
    wake: Condvar,
    stats: Arc<Stats>,
}

#[derive(Default)]
struct DeadlineState {
    queue: VecDeque<(Instant, Arc<dyn Handed>)>,
    /// The deadline thread runs.
    running: bool,
    closed: bool,
}

impl Deadlines {
    fn new(stats: Arc<Stats>) -> Arc<Self> {
        Arc::new(Deadlines {
            state: Mutex::default(),
            wake: Condvar::new(),
            stats,
        })
    }

    /// Answers `once` with ETIMEDOUT at `at` unless it was answered. False
    /// if no deadline thread can run (the caller then must not hand over).
    fn push(self: &Arc<Self>, at: Instant, once: Arc<dyn Handed>) -> bool {
        let mut st = self.state.lock();
        if st.closed {
            return false;
        }
        if !st.running {
            let me = Arc::clone(self);
            let spawned = std::thread::Builder::new()
                .name("locafs-deadline".into())
                .spawn(move || me.run());
            if spawned.is_err() {
                return false;
            }
            st.running = true;
        }
        st.queue.push_back((at, once));
        if st.queue.len() == 1 {
            self.wake.notify_one();
        }
        true
    }

    /// Drops answered calls from the front (calls mostly end in the order
    /// they started, so the queue holds about the calls running).
    fn prune(&self) {
        let mut st = self.state.lock();
        while st.queue.front().is_some_and(|(_, o)| o.answered()) {
            st.queue.pop_front();
        }
    }

    fn run(self: Arc<Self>) {
        let mut st = self.state.lock();
        loop {
            while st.queue.front().is_some_and(|(_, o)| o.answered()) {
                st.queue.pop_front();
            }
            if st.closed {
                // The guard is gone: nobody will answer the rest.
                let left: Vec<_> = st.queue.drain(..).collect();
                st.running = false;
                drop(st);
                for (_, once) in left {
                    once.time_out();
                }
                return;
            }
            match st.queue.front() {
                None => self.wake.wait(&mut st),
                Some(&(at, _)) if at > Instant::now() => {
                    let _ = self.wake.wait_until(&mut st, at);
                }
                Some(_) => {
                    let Some((_, once)) = st.queue.pop_front() else {
                        continue;
                    };
                    drop(st);
                    if once.time_out() {
                        self.stats.source_timeouts.fetch_add(1, Relaxed);
                    }
                    st = self.state.lock();
                }
            }
        }
    }

    fn close(&self) {
        self.state.lock().closed = true;
        self.wake.notify_all();
    }
}

/// A [`Source`] behind deadlines, bounded threads and stall detection; see
/// the module's documentation.
pub struct SourceGuard {
    inner: Arc<dyn Source>,
    cfg: GuardConfig,
    metadata: Arc<Pool>,
    data: Arc<Pool>,
    health: Arc<Health>,
    deadlines: Arc<Deadlines>,
    stats: Arc<Stats>,
}

impl SourceGuard {
    pub fn new(inner: Arc<dyn Source>, cfg: GuardConfig, stats: Arc<Stats>) -> Self {
        SourceGuard {
            metadata: Pool::new("meta", cfg.metadata_threads, Arc::clone(&stats)),
            data: Pool::new("data", cfg.data_threads, Arc::clone(&stats)),
            health: Arc::new(Health {
                state: Mutex::new(HealthState {
                    running: BTreeMap::new(),
                    next_id: 0,
                    last_answer: Instant::now(),
                    stalled: None,
                    probing: false,
                }),
                stall_after: cfg.metadata_timeout,
                stats: Arc::clone(&stats),
            }),
            deadlines: Deadlines::new(Arc::clone(&stats)),
            inner,
            cfg,
            stats,
        }
    }

    /// Whether the source is stalled now (see the module documentation).
    pub fn is_stalled(&self) -> bool {
        self.health.stalled(&self.inner)
    }

    /// Refuses a call while the source is stalled.
    fn admit(&self) -> io::Result<()> {
        if self.is_stalled() {
            self.stats.source_calls_refused.fetch_add(1, Relaxed);
            return Err(timed_out());
        }
        Ok(())
    }

    /// The job that runs `f` on a worker for a caller still waiting.
    fn job<T: Send + 'static>(
        &self,
        what: &'static str,
        reply: Reply<T>,
        progress: Arc<Progress>,
        f: impl FnOnce(&dyn Source, &Progress) -> T + Send + 'static,
    ) -> Job {
        let inner = Arc::clone(&self.inner);
        let health = Arc::clone(&self.health);
        Box::new(move || {
            if !reply.wanted() {
                return;
            }
            let id = health.begin(what);
            let v = f(&*inner, &progress);
            health.end(id);
            reply.send(v);
        })
    }

    /// Runs `f` on a worker of `pool` and waits for it at most `deadline`
    /// (from its last progress, if it reports any), holding the calling
    /// thread.
    fn call<T: Send + 'static>(
        &self,
        pool: &Arc<Pool>,
        deadline: Duration,
        what: &'static str,
        f: impl FnOnce(&dyn Source, &Progress) -> io::Result<T> + Send + 'static,
    ) -> io::Result<T> {
        self.admit()?;
        let (tx, rx) = mpsc::sync_channel(1);
        let gave_up = Arc::new(AtomicBool::new(false));
        let progress = Progress::new(&self.health);
        let reply = Reply::Blocking(tx, Arc::clone(&gave_up));
        pool.submit(self.job(what, reply, Arc::clone(&progress), f));
        loop {
            let left = progress
                .end(deadline)
                .saturating_duration_since(Instant::now());
            match rx.recv_timeout(self.slice(left)) {
                Ok(v) => return v,
                Err(mpsc::RecvTimeoutError::Timeout) if !left.is_zero() && !self.is_stalled() => {}
                Err(_) => {
                    gave_up.store(true, Relaxed);
                    self.stats.source_timeouts.fetch_add(1, Relaxed);
                    return Err(timed_out());
                }
            }
        }
    }

    /// How long a caller waits before it looks at the source's health
    /// again: a caller whose source stalled stops waiting within one and a
    /// half metadata deadlines of the source's last answer, however long
    /// its own deadline.
    fn slice(&self, left: Duration) -> Duration {
        left.min(self.cfg.metadata_timeout / 2)
            .max(Duration::from_millis(1))
    }

    /// Runs `f` on a worker of `pool` and waits for it at most `deadline`
    /// (from its last progress, if it reports any) without holding a
    /// thread.
    async fn call_async<T: Send + 'static>(
        &self,
        pool: &Arc<Pool>,
        deadline: Duration,
        what: &'static str,
        f: impl FnOnce(&dyn Source, &Progress) -> T + Send + 'static,
    ) -> io::Result<T> {
        self.admit()?;
        let (tx, rx) = tokio::sync::oneshot::channel();
        let progress = Progress::new(&self.health);
        pool.submit(self.job(what, Reply::Async(tx), Arc::clone(&progress), f));
        tokio::pin!(rx);
        loop {
            let left = progress
                .end(deadline)
                .saturating_duration_since(Instant::now());
            match tokio::time::timeout(self.slice(left), &mut rx).await {
                Ok(Ok(v)) => return Ok(v),
                Err(_) if !left.is_zero() && !self.is_stalled() => {}
                _ => {
                    self.stats.source_timeouts.fetch_add(1, Relaxed);
                    return Err(timed_out());
                }
            }
        }
    }

    /// `stat` of `rel` on a metadata worker, its answer handed to `done`
    /// on that worker (no thread waits, and no hop back to the runtime); or
    /// ETIMEDOUT from the deadline thread once `--metadata-timeout` has
    /// passed (at once if the source is stalled). `done` is called exactly
    /// once.
    fn stat_handed(&self, rel: PathBuf, done: StatAnswer) {
        self.handed("stat", rel, |s, rel| s.stat(rel), done)
    }

    /// The metadata call `f` of `rel` (named `what`) on a metadata worker,
    /// its answer handed to `done` as [`SourceGuard::stat_handed`] does.
    fn handed<T: Send + 'static>(
        &self,
        what: &'static str,
        rel: PathBuf,
        f: fn(&dyn Source, &Path) -> io::Result<T>,
        done: Answer<T>,
    ) {
        if let Err(e) = self.admit() {
            return done(Err(e));
        }
        let once = Arc::new(Once(Mutex::new(Some(done))));
        let at = Instant::now() + self.cfg.metadata_timeout;
        if !self
            .deadlines
            .push(at, Arc::clone(&once) as Arc<dyn Handed>)
        {
            // No deadline thread: answered through the runtime-free
            // blocking call instead, on this thread, with its deadline.
            if let Some(done) = once.take() {
                done(self.meta(what, move |s, _| f(s, &rel)));
            }
            return;
        }
        let (inner, health, deadlines) = (
            Arc::clone(&self.inner),
            Arc::clone(&self.health),
            Arc::clone(&self.deadlines),
        );
        self.metadata.submit(Box::new(move || {
            // Its caller was answered (the deadline came) before it started.
            if once.answered() {
                return;
            }
            let id = health.begin(what);
            let r = f(&*inner, &rel);
            health.end(id);
            if let Some(done) = once.take() {
                done(r);
            }
            deadlines.prune();
        }));
    }

    fn meta<T: Send + 'static>(
        &self,
        what: &'static str,
        f: impl FnOnce(&dyn Source, &Progress) -> io::Result<T> + Send + 'static,
    ) -> io::Result<T> {
        self.call(&self.metadata, self.cfg.metadata_timeout, what, f)
    }
}

impl Drop for SourceGuard {
    fn drop(&mut self) {
        self.metadata.close();
        self.data.close();
        self.deadlines.close();
    }
}

fn source_timeout(rel: &Path) -> SourceError {
    SourceError::Io {
        path: rel.to_owned(),
        source: timed_out(),
    }
}

impl Source for SourceGuard {
    fn stat(&self, rel: &Path) -> io::Result<SourceAttr> {
        let rel = rel.to_owned();
        self.meta("stat", move |s, _| s.stat(&rel))
    }

    fn list(&self, rel: &Path) -> io::Result<Vec<(OsString, SourceAttr)>> {
        let rel = rel.to_owned();
        self.meta("list", move |s, p| s.list_with_progress(&rel, &|| p.tick()))
    }

    fn list_names(&self, rel: &Path, _: &dyn Fn()) -> io::Result<Vec<DirName>> {
        let rel = rel.to_owned();
        self.meta("list", move |s, p| s.list_names(&rel, &|| p.tick()))
    }

    fn read_link(&self, rel: &Path) -> io::Result<PathBuf> {
        let rel = rel.to_owned();
        self.meta("readlink", move |s, _| s.read_link(&rel))
    }

    fn statvfs(&self) -> io::Result<libc::statvfs> {
        self.meta("statvfs", |s, _| s.statvfs())
    }

    fn read_at(
        &self,
        rel: &Path,
        version: &SourceVersion,
        offset: u64,
        len: usize,
    ) -> Result<Bytes, SourceError> {
        let (owned, version) = (rel.to_owned(), *version);
        let r = self.call(&self.data, self.cfg.data_timeout, "read", move |s, _| {
            Ok(s.read_at(&owned, &version, offset, len))
        });
        match r {
            Ok(r) => r,
            Err(_) => Err(source_timeout(rel)),
        }
    }

    fn read_at_async(
        self: Arc<Self>,
        rel: Arc<Path>,
        version: SourceVersion,
        offset: u64,
        len: usize,
    ) -> BoxFuture<'static, Result<Bytes, SourceError>> {
        Box::pin(async move {
            let r = Arc::clone(&rel);
            let stats = Arc::clone(&self.stats);
            // The source's own latency, timed on the worker (not the
            // caller's wake-up): what read-ahead tunes its concurrency by.
            let read = move |s: &dyn Source, _: &Progress| {
                let t = Instant::now();
                let got = s.read_at(&r, &version, offset, len);
                let nanos = t.elapsed().as_nanos().min(u64::MAX as u128) as u64;
                stats.source_read_nanos.fetch_add(nanos, Relaxed);
                got
            };
            match self
                .call_async(&self.data, self.cfg.data_timeout, "read", read)
                .await
            {
                Ok(v) => v,
                Err(_) => Err(source_timeout(&rel)),
            }
        })
    }

    fn stat_async(self: Arc<Self>, rel: PathBuf) -> BoxFuture<'static, io::Result<SourceAttr>> {
        Box::pin(async move {
            let f = move |s: &dyn Source, _: &Progress| s.stat(&rel);
            self.call_async(&self.metadata, self.cfg.metadata_timeout, "stat", f)
                .await?
        })
    }

    fn list_async(
        self: Arc<Self>,
        rel: PathBuf,
    ) -> BoxFuture<'static, io::Result<Vec<(OsString, SourceAttr)>>> {
        Box::pin(async move {
            let f = move |s: &dyn Source, p: &Progress| s.list_with_progress(&rel, &|| p.tick());
            self.call_async(&self.metadata, self.cfg.metadata_timeout, "list", f)
                .await?
        })
    }

    fn list_names_async(
        self: Arc<Self>,
        rel: PathBuf,
    ) -> BoxFuture<'static, io::Result<Vec<DirName>>> {
        Box::pin(async move {
            let f = move |s: &dyn Source, p: &Progress| s.list_names(&rel, &|| p.tick());
            self.call_async(&self.metadata, self.cfg.metadata_timeout, "list", f)
                .await?
        })
    }

    fn stat_then(self: Arc<Self>, rel: PathBuf, done: StatAnswer) {
        self.stat_handed(rel, done)
    }

    fn has_acls(&self) -> bool {
        self.inner.has_acls()
    }

    fn acls(&self, rel: &Path) -> io::Result<Acls> {
        let rel = rel.to_owned();
        self.meta("acls", move |s, _| s.acls(&rel))
    }

    fn acls_then(self: Arc<Self>, rel: PathBuf, done: Answer<Acls>) {
        self.handed("acls", rel, |s, rel| s.acls(rel), done)
    }

    fn stalled(&self) -> bool {
        self.is_stalled()
    }

    fn listing_carries_attrs(&self) -> bool {
        self.inner.listing_carries_attrs()
    }

    fn skipped_entries(&self) -> u64 {
        self.inner.skipped_entries()
    }

    fn throttled_responses(&self) -> u64 {
        self.inner.throttled_responses()
    }

    fn bad_replies(&self) -> u64 {
        self.inner.bad_replies()
    }
}

#[cfg(test)]
mod tests {
    //! The guard over a source that can be made to hang, as a hard NFS mount
    //! does: deadlines hold, a stall is declared and refuses new calls
    //! without new threads, and the first answer ends it.

    use super::*;
    use crate::source::EntryKind;

    /// A source that answers every path (a directory; reads give 7s)
    /// after the kit's gate, closed while the test stalls it; counts the
    /// calls that reached it and makes each read take `read_delay`.
    #[derive(Default)]
    struct Gate {
        gate: crate::testing::Gate,
        calls: std::sync::atomic::AtomicU64,
        read_delay: Duration,
    }

    impl Gate {
        fn set(&self, stalled: bool) {
            if stalled {
                self.gate.close();
            } else {
                self.gate.open();
            }
        }
        fn pass(&self) {
            self.calls.fetch_add(1, Relaxed);
            self.gate.pass();
        }
    }

    fn attr() -> SourceAttr {
        SourceAttr {
            kind: EntryKind::Dir,
            size: 0,
            blocks: 0,
            mode: 0o40755,
            nlink: 2,
            uid: 0,
            gid: 0,
            rdev: 0,
            ino: 1,
            atime_ns: 0,
            mtime_ns: 0,
            ctime_ns: 0,
        }
    }

    impl Source for Gate {
        fn stat(&self, _: &Path) -> io::Result<SourceAttr> {
            self.pass();
            Ok(attr())
        }
        fn list(&self, _: &Path) -> io::Result<Vec<(OsString, SourceAttr)>> {
            self.pass();
            Ok(Vec::new())
        }
        fn read_link(&self, _: &Path) -> io::Result<PathBuf> {
            self.pass();
            Ok(PathBuf::from("t"))
        }
        fn read_at(
            &self,
            _: &Path,
            _: &SourceVersion,
            _: u64,
            len: usize,
        ) -> Result<Bytes, SourceError> {
            self.pass();
            std::thread::sleep(self.read_delay);
            Ok(Bytes::from(vec![7u8; len]))
        }
        fn statvfs(&self) -> io::Result<libc::statvfs> {
            self.pass();
            // SAFETY: statvfs is plain data; all zeroes is a valid value.
            Ok(unsafe { std::mem::zeroed() })
        }
    }

    /// A burst of jobs onto a pool with one idle worker runs at once, each
    /// on its own worker: none waits for the one before it. (One idle
    /// worker was woken per job however many were queued, so a burst of
    /// reads ran one after the other.)
    #[test]
    fn a_burst_of_jobs_does_not_queue_behind_an_idle_worker() {
        let stats = Arc::new(Stats::default());
        let pool = Pool::new("test", 8, Arc::clone(&stats));
        // One worker, idle once its job is done.
        let (tx, rx) = std::sync::mpsc::channel();
        pool.submit(Box::new(move || tx.send(()).unwrap()));
        rx.recv_timeout(Duration::from_secs(10)).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while pool.state.lock().idle == 0 {
            assert!(Instant::now() < deadline, "the worker never went idle");
            std::thread::sleep(Duration::from_millis(1));
        }
        // Four jobs that each wait for all four to have started.
        let n = 4;
        let barrier = Arc::new(std::sync::Barrier::new(n + 1));
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        for _ in 0..n {
            let (b, d) = (Arc::clone(&barrier), done_tx.clone());
            pool.submit(Box::new(move || {
                b.wait();
                d.send(()).unwrap();
            }));
        }
        // The test thread is the fifth party: it passes only if the four
        // run at once. A pool that ran them one by one would hang here, so
        // the wait is in a thread with a deadline.
        let (ok_tx, ok_rx) = std::sync::mpsc::channel();
        let b = Arc::clone(&barrier);
        std::thread::spawn(move || {
            b.wait();
            let _ = ok_tx.send(());
        });
        assert!(
            ok_rx.recv_timeout(Duration::from_secs(10)).is_ok(),
            "a burst of {n} jobs did not run at once (threads: {})",
            pool.state.lock().threads
        );
        for _ in 0..n {
            done_rx.recv_timeout(Duration::from_secs(10)).unwrap();
        }
        assert!(pool.state.lock().threads <= 8);
        pool.close();
    }

    fn guard(gate: &Arc<Gate>, meta_ms: u64) -> (SourceGuard, Arc<Stats>) {
        let stats = Arc::new(Stats::default());
        let cfg = GuardConfig {
            metadata_timeout: Duration::from_millis(meta_ms),
            data_timeout: Duration::from_millis(40 * meta_ms),
            metadata_threads: 4,
            data_threads: 8,
        };
        let g = SourceGuard::new(Arc::clone(gate) as Arc<dyn Source>, cfg, Arc::clone(&stats));
        (g, stats)
    }

    /// A handed-over stat is answered exactly once: by the worker while the
    /// source answers, with ETIMEDOUT by the deadline thread when it hangs
    /// (the worker's late answer then goes nowhere), at once while the
    /// source is stalled, and with ETIMEDOUT when the guard goes.
    #[test]
    fn a_handed_over_stat_is_answered_exactly_once() {
        let gate = Arc::new(Gate::default());
        let (g, stats) = guard(&gate, 100);
        let (tx, rx) = std::sync::mpsc::channel();
        let answer = |tx: &std::sync::mpsc::Sender<_>| -> StatAnswer {
            let tx = tx.clone();
            Box::new(move |r: io::Result<SourceAttr>| {
                let _ = tx.send((
                    r.map_err(|e| e.raw_os_error()),
                    std::thread::current().name().map(String::from),
                ));
            })
        };
        g.stat_handed(PathBuf::from("a"), answer(&tx));
        let (r, thread) = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(r, Ok(attr()));
        assert_eq!(
            thread.as_deref(),
            Some("locafs-meta"),
            "answered by the worker"
        );
        // The source hangs: ETIMEDOUT once the deadline passed, from the
        // deadline thread; nothing more when the source answers late.
        gate.set(true);
        let t = Instant::now();
        g.stat_handed(PathBuf::from("b"), answer(&tx));
        let (r, thread) = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(r, Err(Some(libc::ETIMEDOUT)));
        assert_eq!(thread.as_deref(), Some("locafs-deadline"));
        assert!(
            t.elapsed() >= Duration::from_millis(100),
            "{:?}",
            t.elapsed()
        );
        // (Counted by the deadline thread right after it answered.)
        let t = Instant::now();
        while stats.source_timeouts.load(Relaxed) == 0 && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(stats.source_timeouts.load(Relaxed), 1);
        // Stalled by now (a call waited a deadline, no answer since):
        // refused at once, on the calling thread.
        while !g.is_stalled() {
            std::thread::sleep(Duration::from_millis(10));
        }
        g.stat_handed(PathBuf::from("c"), answer(&tx));
        let (r, thread) = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(r, Err(Some(libc::ETIMEDOUT)));
        assert_eq!(thread, std::thread::current().name().map(String::from));
        gate.set(false);
        // The late answer of "b" (and the probe's) reached nobody.
        while g.is_stalled() {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(rx.recv_timeout(Duration::from_millis(300)).is_err());
        // The guard goes with a call running: its caller still hears.
        gate.set(true);
        g.stat_handed(PathBuf::from("d"), answer(&tx));
        drop(g);
        let (r, _) = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(r, Err(Some(libc::ETIMEDOUT)));
        gate.set(false);
        assert!(rx.recv_timeout(Duration::from_millis(300)).is_err());
    }

    #[test]
    fn calls_pass_through_unchanged_while_the_source_answers() {
        let gate = Arc::new(Gate::default());
        let (g, stats) = guard(&gate, 500);
        assert_eq!(g.stat(Path::new("x")).unwrap(), attr());
        assert_eq!(g.read_link(Path::new("x")).unwrap(), PathBuf::from("t"));
        let v = SourceVersion {
            size: 3,
            mtime_ns: 0,
            ino: 1,
        };
        assert_eq!(
            &g.read_at(Path::new("x"), &v, 0, 3).unwrap()[..],
            &[7, 7, 7]
        );
        assert!(!g.is_stalled());
        assert_eq!(stats.source_stalls.load(Relaxed), 0);
    }

    #[test]
    fn a_stall_is_bounded_refused_without_new_threads_and_ends_on_its_own() {
        let gate = Arc::new(Gate::default());
        let (g, stats) = guard(&gate, 200);
        let g = Arc::new(g);
        gate.set(true);
        // The first call waits its deadline, no longer.
        let t = Instant::now();
        let e = g.stat(Path::new("a")).unwrap_err();
        assert!(is_timeout(&e), "{e}");
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        // It was the sign of a stall: declared (once the call itself, which
        // started on its worker a little after the caller began to wait, has
        // waited the threshold too), with a probe waiting.
        let t = Instant::now();
        while !g.is_stalled() {
            assert!(t.elapsed() < Duration::from_secs(1), "no stall declared");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(stats.source_stalls.load(Relaxed), 1);
        assert!(stats.source_stalled_since_ms.load(Relaxed) > 0);
        // The probe's own call reaches the source a moment after the stall
        // is declared (later still on a loaded machine): the first call and
        // the probe, then nothing more.
        let t = Instant::now();
        while gate.calls.load(Relaxed) < 2 {
            assert!(t.elapsed() < Duration::from_secs(2), "no probe");
            std::thread::sleep(Duration::from_millis(5));
        }
        let reached = gate.calls.load(Relaxed);
        let threads = stats.source_threads.load(Relaxed);
        // Many more calls, of every kind: refused at once, none reaches the
        // source or takes a thread.
        let t = Instant::now();
        for i in 0..200 {
            assert!(is_timeout(&g.stat(Path::new("b")).unwrap_err()));
            assert!(is_timeout(&g.list(Path::new("")).unwrap_err()));
            let v = SourceVersion {
                size: 1,
                mtime_ns: 0,
                ino: i,
            };
            assert!(g.read_at(Path::new("c"), &v, 0, 1).is_err());
        }
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        assert_eq!(gate.calls.load(Relaxed), reached);
        assert_eq!(stats.source_threads.load(Relaxed), threads);
        assert!(stats.source_calls_refused.load(Relaxed) >= 600);
        // The source comes back: the stall ends without any new call.
        gate.set(false);
        let deadline = Instant::now() + Duration::from_secs(10);
        while g.is_stalled() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!g.is_stalled());
        assert_eq!(stats.source_stalled_since_ms.load(Relaxed), 0);
        assert_eq!(g.stat(Path::new("d")).unwrap(), attr());
    }

    #[test]
    fn async_reads_wait_without_a_thread_and_stop_waiting_when_the_source_stalls() {
        let gate = Arc::new(Gate::default());
        let (g, stats) = guard(&gate, 150);
        let g = Arc::new(g);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        gate.set(true);
        let v = SourceVersion {
            size: 4,
            mtime_ns: 0,
            ino: 1,
        };
        // Several reads at once, on one runtime thread: they wait while
        // the source might still answer, and stop once it is stalled (no
        // answer for 150 ms), long before their own 6 s deadline.
        let t = Instant::now();
        let results =
            rt.block_on(futures::future::join_all((0..4).map(|i| {
                Arc::clone(&g).read_at_async(Arc::from(Path::new("f")), v, i, 1)
            })));
        let took = t.elapsed();
        assert!(took >= Duration::from_millis(150), "{took:?}");
        assert!(took < Duration::from_secs(3), "{took:?}");
        for r in results {
            match r {
                Err(SourceError::Io { source, .. }) => assert!(is_timeout(&source)),
                other => panic!("{other:?}"),
            }
        }
        assert!(g.is_stalled());
        // Refused at once now.
        let t = Instant::now();
        assert!(rt
            .block_on(Arc::clone(&g).read_at_async(Arc::from(Path::new("f")), v, 0, 1))
            .is_err());
        assert!(t.elapsed() < Duration::from_millis(100));
        // Threads: the four stuck reads and the probe, no more.
        assert!(stats.source_threads_peak.load(Relaxed) <= 5);
        gate.set(false);
        let deadline = Instant::now() + Duration::from_secs(10);
        while g.is_stalled() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let got = rt
            .block_on(Arc::clone(&g).read_at_async(Arc::from(Path::new("f")), v, 0, 4))
            .unwrap();
        assert_eq!(&got[..], &[7; 4]);
    }

    #[test]
    fn a_busy_source_that_keeps_answering_is_not_stalled() {
        // Every read takes 200 ms, under the 300 ms threshold, but 32 of them
        // share 4 threads: callers wait up to 1.6 s in the queue. Waiting
        // for a thread is not a stall; only a source that stops answering is.
        let stats = Arc::new(Stats::default());
        let cfg = GuardConfig {
            metadata_timeout: Duration::from_millis(300),
            data_timeout: Duration::from_secs(30),
            metadata_threads: 4,
            data_threads: 4,
        };
        let g = Arc::new(SourceGuard::new(
            Arc::new(Gate {
                read_delay: Duration::from_millis(200),
                ..Gate::default()
            }),
            cfg,
            Arc::clone(&stats),
        ));
        let v = SourceVersion {
            size: 1,
            mtime_ns: 0,
            ino: 1,
        };
        let handles: Vec<_> = (0..32)
            .map(|i| {
                let g = Arc::clone(&g);
                std::thread::spawn(move || g.read_at(Path::new("f"), &v, i, 1).is_ok())
            })
            .collect();
        for h in handles {
            assert!(h.join().unwrap());
        }
        assert_eq!(stats.source_stalls.load(Relaxed), 0);
        assert!(stats.source_threads_peak.load(Relaxed) <= 4);
    }
}
