//! What one node grants the peers it serves: memory for replies, shared
//! fairly between the hosts that ask, and how often a refused peer may
//! write to the log.
//!
//! Reply memory ([`ReplyBudget`]) is a byte budget taken from
//! `--prefetch-memory` (see [`reply_memory`]). A reply takes its block's
//! length plus [`REPLY_OVERHEAD`] before the block is fetched and gives it
//! back only when the reply has left (written, finished and acknowledged,
//! or abandoned), so blocks held for slow or absent readers count. One host
//! (one IP address, whatever the number of its endpoints and ports) may
//! hold at most half of the budget; a request that does not fit waits, in a
//! queue served host with the least memory first, for at most the time the
//! server gives it, and is then answered `Busy`.
//!
//! QUIC handshakes not yet finished ([`HandshakeGate`]) are bounded per
//! host and in all: they cost the server a TLS state and a signature each
//! before the peer has proved anything. Under pressure an attempt from an
//! address not yet proven is sent a stateless Retry (QUIC's address
//! validation: it costs the server nothing to send, and only a peer that
//! receives at its address can answer it), so that spoofed attempts hold
//! no slot; past the bounds a proven address is refused.
//!
//! Nothing here does I/O; [`Shares`], [`HandshakeGate`] and [`LogLimiter`]
//! are plain accounting, tested as such.

use std::collections::HashMap;
use std::hash::Hash;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::oneshot;

/// One unit held under a limit; released when dropped.
pub struct Held {
    pub(super) release: Vec<Box<dyn FnOnce() + Send + Sync>>,
}

impl Drop for Held {
    fn drop(&mut self) {
        for r in self.release.drain(..) {
            r();
        }
    }
}

/// Units held per key (a peer, a host; `()` for a total), each given back
/// by the closure `take` returns (run by [`Held`]'s drop). Also the
/// handshake bounds' ([`HandshakeGate`]) and the server's `PeerLimits`.
pub(super) struct Counter<K>(Arc<Mutex<HashMap<K, usize>>>);

impl<K> Default for Counter<K> {
    fn default() -> Self {
        Counter(Arc::default())
    }
}

impl<K: Hash + Eq + Copy + Send + Sync + 'static> Counter<K> {
    /// Takes one unit for `k` if it has fewer than `max`.
    pub(super) fn take(&self, k: K, max: usize) -> Option<Box<dyn FnOnce() + Send + Sync>> {
        let mut m = self.0.lock();
        let n = m.entry(k).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        let map = Arc::clone(&self.0);
        Some(Box::new(move || {
            let mut m = map.lock();
            if let Some(n) = m.get_mut(&k) {
                *n -= 1;
                if *n == 0 {
                    m.remove(&k);
                }
            }
        }))
    }

    pub(super) fn get(&self, k: &K) -> usize {
        self.0.lock().get(k).copied().unwrap_or(0)
    }
}

/// What a reply costs besides its block: the frame header, the stream's
/// state in quinn and our task. Also makes a flood of tiny replies count.
pub const REPLY_OVERHEAD: u64 = 16 << 10;

/// The part of `--prefetch-memory` that replies to peers may hold (when the
/// node serves peers): an eighth, taken from read-ahead's share. With the
/// default 256 MiB that is 32 MiB, 31 one-MiB blocks in flight at once,
/// far more than the bandwidth-delay product of any link between the nodes
/// of a job (a 100 Gbit/s link with 1 ms round trips holds 12.5 MB), so an
/// honest cluster is not slowed by it.
pub fn reply_memory(prefetch_memory: u64) -> u64 {
    prefetch_memory / 8
}

/// Bytes held per key (host) under a total and a per-key bound. Pure.
#[derive(Debug)]
pub struct Shares<K> {
    total: u64,
    per_key: u64,
    used: u64,
    held: HashMap<K, u64>,
}

impl<K: Hash + Eq + Copy> Shares<K> {
    pub fn new(total: u64, per_key: u64) -> Self {
        Shares {
            total,
            per_key: per_key.min(total),
            used: 0,
            held: HashMap::new(),
        }
    }

    /// Whether `k` may take `n` more bytes now.
    pub fn fits(&self, k: &K, n: u64) -> bool {
        self.used + n <= self.total && self.held(k) + n <= self.per_key
    }

    /// Whether `n` bytes could ever be granted (to a key holding nothing).
    pub fn possible(&self, n: u64) -> bool {
        n <= self.per_key
    }

    /// Takes `n` bytes for `k` if they fit.
    pub fn take(&mut self, k: K, n: u64) -> bool {
        if !self.fits(&k, n) {
            return false;
        }
        self.used += n;
        *self.held.entry(k).or_insert(0) += n;
        true
    }

    /// Gives back `n` bytes `k` took.
    pub fn give_back(&mut self, k: &K, n: u64) {
        self.used = self.used.saturating_sub(n);
        if let Some(h) = self.held.get_mut(k) {
            *h = h.saturating_sub(n);
            if *h == 0 {
                self.held.remove(k);
            }
        }
    }

    pub fn held(&self, k: &K) -> u64 {
        self.held.get(k).copied().unwrap_or(0)
    }

    pub fn used(&self) -> u64 {
        self.used
    }

    /// Keys holding something now.
    pub fn holders(&self) -> usize {
        self.held.len()
    }
}

/// Which of the waiting requests `(key, bytes)` may go now, in the order
/// to grant them: the key holding least first (ties: the earliest), each
/// taken from `shares` as it is chosen; a request that does not fit its
/// key's share is passed over, one that does not fit the total stops the
/// round (so that large requests are not starved by small ones). Pure.
pub fn grant_order<K: Hash + Eq + Copy>(
    shares: &mut Shares<K>,
    waiting: &[(K, u64)],
) -> Vec<usize> {
    let mut chosen = Vec::new();
    loop {
        let next = waiting
            .iter()
            .enumerate()
            .filter(|(i, (k, n))| !chosen.contains(i) && shares.held(k) + n <= shares.per_key)
            .min_by_key(|(i, (k, _))| (shares.held(k), *i));
        let Some((i, &(k, n))) = next else { break };
        if !shares.take(k, n) {
            break;
        }
        chosen.push(i);
    }
    chosen
}

struct Waiter {
    host: IpAddr,
    bytes: u64,
    id: u64,
    grant: oneshot::Sender<ReplyMemory>,
}

struct BudgetState {
    shares: Shares<IpAddr>,
    waiting: Vec<Waiter>,
    next_id: u64,
}

/// Memory for replies to peers, shared fairly between hosts.
pub struct ReplyBudget {
    state: Mutex<BudgetState>,
    total: u64,
}

/// Bytes of the reply budget held by one reply; given back when dropped.
pub struct ReplyMemory {
    budget: Arc<ReplyBudget>,
    host: IpAddr,
    bytes: u64,
}

impl Drop for ReplyMemory {
    fn drop(&mut self) {
        self.budget.give_back(self.host, self.bytes);
    }
}

impl ReplyBudget {
    /// `total` bytes for all replies, at most half of it for one host;
    /// raised if need be so that one reply of `largest` bytes fits.
    pub fn new(total: u64, largest: u64) -> Arc<ReplyBudget> {
        let one = largest + REPLY_OVERHEAD;
        let total = total.max(one);
        let per_host = (total / 2).max(one);
        Arc::new(ReplyBudget {
            state: Mutex::new(BudgetState {
                shares: Shares::new(total, per_host),
                waiting: Vec::new(),
                next_id: 0,
            }),
            total,
        })
    }

    pub fn total(&self) -> u64 {
        self.total
    }

    /// Bytes held by replies now.
    pub fn used(&self) -> u64 {
        self.state.lock().shares.used()
    }

    /// Memory for a reply of `len` bytes to `host`, waiting at most `wait`
    /// for it; None if it did not come in time.
    pub async fn acquire(
        self: &Arc<Self>,
        host: IpAddr,
        len: u64,
        wait: Duration,
    ) -> Option<ReplyMemory> {
        let bytes = len + REPLY_OVERHEAD;
        let (tx, rx) = oneshot::channel();
        let id = {
            let mut st = self.state.lock();
            if !st.shares.possible(bytes) {
                return None;
            }
            if st.waiting.is_empty() && st.shares.take(host, bytes) {
                return Some(self.memory(host, bytes));
            }
            let id = st.next_id;
            st.next_id += 1;
            st.waiting.push(Waiter {
                host,
                bytes,
                id,
                grant: tx,
            });
            id
        };
        // The queue may let it go at once (its host holds least).
        self.grant_waiting();
        match tokio::time::timeout(wait, rx).await {
            Ok(Ok(m)) => Some(m),
            _ => {
                // Out of the queue; a grant that raced with the deadline
                // was dropped with the channel, and so given back.
                self.state.lock().waiting.retain(|w| w.id != id);
                None
            }
        }
    }

    fn memory(self: &Arc<Self>, host: IpAddr, bytes: u64) -> ReplyMemory {
        ReplyMemory {
            budget: Arc::clone(self),
            host,
            bytes,
        }
    }

    fn give_back(self: &Arc<Self>, host: IpAddr, bytes: u64) {
        self.state.lock().shares.give_back(&host, bytes);
        self.grant_waiting();
    }

    /// Grants what fits to the waiting requests, fairest first. The grants
    /// are sent outside the lock: a grant whose waiter is gone is dropped,
    /// which gives it back (and takes the lock again).
    fn grant_waiting(self: &Arc<Self>) {
        let granted: Vec<Waiter> = {
            let mut st = self.state.lock();
            if st.waiting.is_empty() {
                return;
            }
            let st = &mut *st;
            let asks: Vec<(IpAddr, u64)> = st.waiting.iter().map(|w| (w.host, w.bytes)).collect();
            let mut order = grant_order(&mut st.shares, &asks);
            order.sort_unstable_by(|a, b| b.cmp(a));
            order.into_iter().map(|i| st.waiting.remove(i)).collect()
        };
        for w in granted {
            let m = self.memory(w.host, w.bytes);
            let _ = w.grant.send(m);
        }
    }
}

/// Handshakes in progress from one host (IP address) at most: an honest
/// node makes one connection to each peer (two for a moment when it
/// reconnects), and several nodes may share a machine.
pub const HANDSHAKES_PER_HOST: usize = 16;
/// Handshakes in progress at most, from all hosts together (each holds a
/// TLS state until it finishes or times out).
pub const HANDSHAKES_TOTAL: usize = 256;
/// Past this many handshakes in progress from one host, a new attempt from
/// an address not yet validated gets a Retry instead of a handshake.
pub const RETRY_ABOVE_PER_HOST: usize = 4;
/// Past this many handshakes in progress in all, every attempt from an
/// address not yet validated gets a Retry.
pub const RETRY_ABOVE_TOTAL: usize = 64;

/// What to do with a QUIC connection attempt.
pub enum Admit {
    /// Start the handshake; the slot is held until it ends (dropped).
    Accept(Held),
    /// Send a stateless Retry: the peer must come back with a token that
    /// proves its address.
    Retry,
    /// Refuse it (the bounds are reached for a proven address).
    Refuse,
}

/// The handshakes in progress, per host and in all (see the module
/// comment). Pure accounting: the caller says whether the attempt's
/// address is validated and whether it is a configured member's.
#[derive(Default)]
pub struct HandshakeGate {
    per_host: Counter<IpAddr>,
    total: Counter<()>,
}

impl HandshakeGate {
    /// An attempt from `host`. `validated`: its address is proven (it
    /// came back with a Retry's token); `member`: it is, proven, the
    /// listening address of a configured peer, which no bound refuses (a
    /// node of the job reaches its peers however many strangers knock).
    pub fn admit(&self, host: IpAddr, validated: bool, member: bool) -> Admit {
        let host = host.to_canonical();
        // The bounds of this attempt, and what it gets past them.
        let (per_host, total, past) = if !validated {
            (RETRY_ABOVE_PER_HOST, RETRY_ABOVE_TOTAL, Admit::Retry)
        } else if member {
            (usize::MAX, usize::MAX, Admit::Refuse)
        } else {
            (HANDSHAKES_PER_HOST, HANDSHAKES_TOTAL, Admit::Refuse)
        };
        let Some(h) = self.per_host.take(host, per_host) else {
            return past;
        };
        let Some(t) = self.total.take((), total) else {
            h();
            return past;
        };
        Admit::Accept(Held {
            release: vec![h, t],
        })
    }

    /// Handshakes in progress now, in all.
    pub fn in_progress(&self) -> usize {
        self.total.get(&())
    }
}

/// Lets a kind of log line through at most once per interval, counting the
/// ones held back, so that a flood of refused handshakes cannot fill the
/// log. Pure: the caller passes the time.
#[derive(Debug)]
pub struct LogLimiter {
    every: Duration,
    state: Mutex<(Option<Instant>, u64)>,
}

impl LogLimiter {
    pub const fn new(every: Duration) -> Self {
        LogLimiter {
            every,
            state: Mutex::new((None, 0)),
        }
    }

    /// Some(number of lines held back since the last one) if a line may be
    /// written at `now`; None (and one more held back) otherwise.
    pub fn allow(&self, now: Instant) -> Option<u64> {
        let mut st = self.state.lock();
        match st.0 {
            Some(last) if now.saturating_duration_since(last) < self.every => {
                st.1 += 1;
                None
            }
            _ => {
                st.0 = Some(now);
                Some(std::mem::take(&mut st.1))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: u64 = 1 << 20;

    #[test]
    fn shares_bound_the_total_and_each_host() {
        let mut s: Shares<u8> = Shares::new(8 * MB, 4 * MB);
        // One host: at most its half, whatever the number of requests.
        let mut a = 0;
        while s.take(1, MB) {
            a += 1;
        }
        assert_eq!(a, 4);
        assert!(!s.fits(&1, 1));
        // Another host still gets the rest, up to the total.
        assert!(s.take(2, 3 * MB));
        assert!(s.take(3, MB));
        assert!(!s.fits(&4, 1));
        assert_eq!(s.used(), 8 * MB);
        s.give_back(&1, MB);
        assert!(
            !s.fits(&2, MB + 1),
            "host 2 is at 3 MiB of 4 and 1 MiB is free"
        );
        assert!(s.fits(&2, MB));
        for _ in 0..3 {
            s.give_back(&1, MB);
        }
        assert_eq!(s.held(&1), 0);
        assert_eq!(s.holders(), 2);
        assert!(s.possible(4 * MB) && !s.possible(4 * MB + 1));
    }

    #[test]
    fn grants_go_to_the_host_holding_least() {
        let mut s: Shares<char> = Shares::new(4 * MB, 2 * MB);
        assert!(s.take('x', 2 * MB));
        assert!(s.take('y', MB));
        // Waiting: x (at its share), y twice, then z who holds nothing.
        let waiting = [('x', MB), ('y', MB), ('y', MB), ('z', MB)];
        // 1 MiB free: z first (holds least), although it came last.
        assert_eq!(grant_order(&mut s, &waiting), [3]);
        // x gives back its 2 MiB: it now holds least and goes first, then
        // the first y; the second y would pass y's share.
        s.give_back(&'x', 2 * MB);
        assert_eq!(grant_order(&mut s, &waiting[..3]), [0, 1]);
        assert_eq!((s.held(&'x'), s.held(&'y'), s.held(&'z')), (MB, 2 * MB, MB));
        // A request that does not fit the total stops the round.
        let mut s: Shares<char> = Shares::new(3 * MB, 3 * MB);
        assert!(s.take('a', 2 * MB));
        assert_eq!(
            grant_order(&mut s, &[('b', 2 * MB), ('c', MB / 2)]),
            Vec::<usize>::new()
        );
    }

    #[tokio::test]
    async fn a_greedy_host_waits_while_another_is_served_and_memory_comes_back() {
        let budget = ReplyBudget::new(4 * MB, MB);
        let (greedy, honest): (IpAddr, IpAddr) =
            ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let wait = Duration::from_millis(50);
        // The greedy host gets its half (two replies of 1 MiB), no more.
        let mut held = Vec::new();
        while let Some(m) = budget.acquire(greedy, MB - REPLY_OVERHEAD, wait).await {
            held.push(m);
        }
        assert_eq!(held.len(), 2);
        // The honest host is served at once.
        let h = budget.acquire(honest, MB - REPLY_OVERHEAD, wait).await;
        assert!(h.is_some());
        // A waiter is granted as soon as memory comes back.
        let b = Arc::clone(&budget);
        let waiter = tokio::spawn(async move {
            b.acquire(greedy, MB - REPLY_OVERHEAD, Duration::from_secs(10))
                .await
                .is_some()
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(held.pop());
        assert!(waiter.await.unwrap());
        // Timed-out waiters leave nothing behind; all comes back.
        drop((held, h));
        assert_eq!(budget.used(), 0);
        assert!(
            budget.acquire(honest, 3 * MB, wait).await.is_none(),
            "more than a host's half"
        );
        assert_eq!(budget.used(), 0);
        assert!(budget.state.lock().waiting.is_empty());
    }

    #[test]
    fn handshakes_are_retried_under_pressure_and_refused_past_the_bounds() {
        let gate = HandshakeGate::default();
        let flood: IpAddr = "10.0.0.9".parse().unwrap();
        let accepted = |a: Admit| match a {
            Admit::Accept(slot) => Some(slot),
            _ => None,
        };
        // Unproven attempts of one host: a few handshakes, then Retry.
        let mut held: Vec<Held> = (0..RETRY_ABOVE_PER_HOST)
            .map(|_| accepted(gate.admit(flood, false, false)).unwrap())
            .collect();
        for _ in 0..100 {
            assert!(matches!(gate.admit(flood, false, false), Admit::Retry));
        }
        // Proven ones up to the host's bound, then refused.
        while let Some(s) = accepted(gate.admit(flood, true, false)) {
            held.push(s);
        }
        assert_eq!(held.len(), HANDSHAKES_PER_HOST);
        assert!(matches!(gate.admit(flood, true, false), Admit::Refuse));
        // Another host is not held back by this one.
        let other: IpAddr = "10.0.0.10".parse().unwrap();
        let o = accepted(gate.admit(other, false, false)).expect("another host");
        assert_eq!(gate.in_progress(), HANDSHAKES_PER_HOST + 1);
        // Finished handshakes give their slots back, and the host is held
        // to its bound again.
        drop(held.pop());
        held.push(accepted(gate.admit(flood, true, false)).unwrap());
        assert!(matches!(gate.admit(flood, true, false), Admit::Refuse));
        drop((held, o));
        assert_eq!(gate.in_progress(), 0);

        // Many hosts: every unproven attempt retried past the total's
        // threshold, proven ones refused past the total, but a proven
        // member's address always gets its handshake.
        let gate = HandshakeGate::default();
        let host =
            |i: usize| -> IpAddr { format!("10.1.{}.{}", i / 250, i % 250).parse().unwrap() };
        let mut held = Vec::new();
        let mut i = 0;
        while gate.in_progress() < RETRY_ABOVE_TOTAL {
            held.push(accepted(gate.admit(host(i), false, false)).unwrap());
            i += 1;
        }
        assert!(matches!(gate.admit(host(i), false, false), Admit::Retry));
        while gate.in_progress() < HANDSHAKES_TOTAL {
            held.push(accepted(gate.admit(host(i), true, false)).unwrap());
            i += 1;
        }
        assert!(matches!(gate.admit(host(i), true, false), Admit::Refuse));
        let member: IpAddr = "10.2.0.1".parse().unwrap();
        assert!(matches!(gate.admit(member, false, true), Admit::Retry));
        assert!(accepted(gate.admit(member, true, true)).is_some());
    }

    #[test]
    fn log_limiter_lets_one_line_through_per_interval_and_counts_the_rest() {
        let l = LogLimiter::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(l.allow(t0), Some(0));
        for i in 1..=5 {
            assert_eq!(l.allow(t0 + Duration::from_secs(i)), None);
        }
        assert_eq!(l.allow(t0 + Duration::from_secs(10)), Some(5));
        assert_eq!(l.allow(t0 + Duration::from_secs(11)), None);
        assert_eq!(l.allow(t0 + Duration::from_secs(25)), Some(1));
    }
}
