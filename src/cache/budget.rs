//! One budget for a cache directory that many data sets share. Every mount
//! under one `--cache-dir` books its disk use in a ledger kept in that
//! directory (`budget.json`, changed only under an exclusive lock on
//! `budget.lock`), and gets a grant from it: the most its cache may hold now.
//! The grants of the mounted data sets, plus what unmounted data sets still
//! hold, never pass the budget, nor leave less free space on the disk than
//! the floor. When a mount needs room, it takes it in this order: data sets
//! not mounted now (least recently mounted first, whole), then the unused
//! grant of a mounted neighbour above its fair share, then a mounted
//! neighbour's entries that no pass has read for two epochs. A neighbour's
//! entries read within two epochs (its `hot` bytes) are never taken.
//!
//! It must never delete a data set that a running mount holds (the data
//! set's own lock, `lock.rs`, decides), never hold the ledger lock across
//! anything slow (a data set is renamed away under the lock and deleted
//! after it; its bytes stay booked as being deleted until they are off the
//! disk, so that nobody takes the wait for room another program took), and
//! never run on a FUSE thread: the mount calls it from a thread of its
//! own, every 250 ms. [`plan`] is pure. Everything in the cache directory
//! is reached through its checked handle (`private_dir`): no symlink is
//! followed, a data set directory another user owns is left alone, and
//! what this writes is owner-only.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Read, Write};
use std::time::{SystemTime, UNIX_EPOCH};

use rustix::fs::{FileType, OFlags};
use serde::{Deserialize, Serialize};

use crate::sys::private_dir::PrivateDir;

/// The ledger's file name in the cache directory.
pub const LEDGER: &str = "budget.json";
/// The lock file taken around every change of the ledger.
pub const LEDGER_LOCK: &str = "budget.lock";
/// The share of (free space + what the data sets hold) that a budget
/// derived from the disk takes.
pub const DEFAULT_SHARE_OF_DISK: f64 = 0.8;
/// The free space kept on the cache disk, in percent of its size, whatever
/// the budget says (as mountpoint-s3 and JuiceFS keep one).
pub const DEFAULT_FREE_FLOOR_PERCENT: f64 = 5.0;
/// Renamed-away data sets being deleted start with this.
const TRASH_PREFIX: &str = ".trash-";

/// What the ledger knows of one data set's cache.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Record {
    /// The source it caches, as its mount named it.
    pub source: String,
    /// Bytes its cache holds on disk, as its mount last counted them.
    pub used: u64,
    /// Files (versions) it holds.
    pub files: u64,
    /// The most its mount may hold now (0 when not mounted).
    pub grant: u64,
    /// Bytes of entries read by a pass within the last two epochs: never
    /// taken by a neighbour.
    pub hot: u64,
    /// The data set's size: what its mount would hold to cache it whole.
    pub want: u64,
    /// Unix seconds of its last mount.
    pub last_mount: u64,
    /// Unix seconds of its mount's last booking.
    pub last_seen: u64,
    /// A lower grant a neighbour asked for: applied by this data set's mount
    /// at its next booking. Until then its old grant counts as held.
    pub cap: Option<u64>,
}

/// The ledger of a cache directory.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Ledger {
    pub format: u32,
    /// The budget of the whole directory, in bytes.
    pub limit: u64,
    /// Whether an admin gave it (`--cache-size`), or it was derived from
    /// the disk at the first mount.
    pub explicit: bool,
    /// Free space kept on the disk, percent of its size.
    pub free_floor_percent: f64,
    pub datasets: BTreeMap<String, Record>,
    /// Data sets being deleted: the name their directory was renamed to
    /// (`.trash-ID-PID-TIME`) and the bytes they held. Their bytes leave
    /// the disk only when the deleter is done (a data set of many files
    /// takes seconds): until then [`plan`] counts them as the caches'
    /// bytes, not as room another program took.
    pub deleting: BTreeMap<String, u64>,
}

/// The disk under the cache directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Disk {
    pub total: u64,
    pub free: u64,
}

impl Disk {
    pub fn of(dir: &PrivateDir) -> io::Result<Disk> {
        let st = dir.statvfs()?;
        Ok(Disk {
            total: st.f_blocks * st.f_frsize,
            free: st.f_bavail * st.f_frsize,
        })
    }
}

/// What [`plan`] decided for the mount of `me`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    /// The budget in force: the limit, lowered when the disk's free space
    /// is at the floor.
    pub effective: u64,
    /// This mount's new grant.
    pub grant: u64,
    /// Unmounted data sets to delete, in order.
    pub delete: Vec<String>,
    /// Mounted neighbours asked to shrink: (id, new grant), applied at their
    /// next booking.
    pub lower: Vec<(String, u64)>,
}

/// The grant of the mount of `me`, and what it takes from others to get it.
/// `mounted(id)` says whether a data set is mounted now. Pure.
///
/// The mount wants room for its whole data set (`want`, at least what it
/// holds). Everyone else is counted at the larger of their grant and their
/// use (a neighbour told to shrink holds its bytes until it has), so the
/// sum of what is on disk stays within the effective budget at every step.
/// A mount is never told to drop bytes it holds for room that a neighbour
/// it lowers is about to give back: the neighbour gives, not both.
pub fn plan(ledger: &Ledger, me: &str, mounted: &dyn Fn(&str) -> bool, disk: Disk) -> Plan {
    // The disk's free space, less the floor, is the room for the caches'
    // bytes: what they hold, what is still being deleted (renamed away and
    // booked out, not yet off the disk), and what is free. Counting only
    // the first lowered the budget in force by a whole data set while a
    // neighbour deleted it, and a mount booking in that window evicted
    // most of a data set being read (issue 36: 352 -> 89 MiB on 1 GiB).
    let total_used: u64 = ledger.datasets.values().map(|r| r.used).sum();
    let deleting: u64 = ledger.deleting.values().sum();
    let floor = (disk.total as f64 * ledger.free_floor_percent / 100.0) as u64;
    let effective = ledger
        .limit
        .min((total_used + deleting + disk.free).saturating_sub(floor));
    let mine = ledger.datasets.get(me).cloned().unwrap_or_default();
    let mut unmounted: Vec<(&String, &Record)> = Vec::new();
    let mut neighbours: Vec<(&String, &Record)> = Vec::new();
    for (id, r) in &ledger.datasets {
        if id == me {
            continue;
        }
        if mounted(id) {
            neighbours.push((id, r));
        } else {
            unmounted.push((id, r));
        }
    }
    // Fair shares: the mounted data sets' wants water-filled into the
    // budget; when they all fit, the spare room is split evenly on top (a
    // want is an estimate: small files cost more than their bytes). A mount
    // asks for its fair share (or what it holds already), so that mounts
    // filling at once share the disk.
    let wants: Vec<u64> = neighbours
        .iter()
        .map(|(_, r)| r.want.max(r.used))
        .chain([mine.want.max(mine.used)])
        .collect();
    let (fair, spare) = fair_shares(effective, &wants);
    // What is taken from others is only what the data set needs; spare
    // room is taken only where it is free.
    let need = fair[neighbours.len()].max(mine.used).min(effective);
    // Other data sets' bytes (an unmounted one whole, a neighbour's cold
    // entries) go only for bytes this data set is known to need: a mount
    // that does not know its size yet deleted every unmounted data set of
    // the directory at its first booking (2026-12-05).
    let taking = if mine.want >= WANT_UNKNOWN {
        mine.used.min(effective)
    } else {
        need
    };
    let target = (fair[neighbours.len()] + spare)
        .max(mine.used)
        .min(effective);

    let held = |r: &Record| r.grant.max(r.used);
    let mut unmounted_held: u64 = unmounted.iter().map(|(_, r)| r.used).sum();
    let mut new: Vec<u64> = neighbours.iter().map(|(_, r)| held(r)).collect();
    let room = |new: &[u64], unmounted_held: u64| {
        effective as i128 - new.iter().sum::<u64>() as i128 - unmounted_held as i128
    };
    let mut out = Plan {
        effective,
        ..Plan::default()
    };
    // 1. Data sets nobody mounts, least recently mounted first, whole.
    unmounted.sort_by_key(|(id, r)| (r.last_mount, id.as_str()));
    for (id, r) in unmounted {
        if room(&new, unmounted_held) >= taking as i128 {
            break;
        }
        unmounted_held -= r.used;
        out.delete.push(id.clone());
    }
    // 2. The unused grant of mounted neighbours above the fair level, then
    // 3. their entries that no pass read for two epochs; never what they
    // read within two epochs. A lowered neighbour frees its bytes when it
    // has shrunk (at its next booking): until then they count as held.
    for pass in 0..2 {
        for (k, (_, r)) in neighbours.iter().enumerate() {
            let short = if pass == 0 { need } else { taking } as i128 - room(&new, unmounted_held);
            if short <= 0 {
                break;
            }
            let keep = if pass == 0 {
                r.used.max(fair[k] + spare)
            } else {
                r.hot
            };
            let take = (new[k].saturating_sub(keep) as i128).min(short) as u64;
            new[k] -= take;
        }
    }
    for (k, (id, r)) in neighbours.iter().enumerate() {
        if new[k] < held(r) {
            out.lower.push((id.to_string(), new[k]));
        }
    }
    // What is free now: a lowered neighbour holds its old grant until it
    // has applied the new one at its own booking.
    let free_now = room(
        &neighbours.iter().map(|(_, r)| held(r)).collect::<Vec<_>>(),
        unmounted_held,
    );
    out.grant = free_now.clamp(0, target as i128) as u64;
    // When the budget in force fell (another program filled the disk) and
    // this plan lowers neighbours to cover it, this mount keeps the bytes
    // it holds that their lowering pays for, instead of evicting them now
    // and growing back into the same room once they have shrunk: only the
    // neighbours give (their unused grant and cold entries), as the order
    // above says. The bytes it keeps are on the disk already; the disk
    // holds no more than before this booking.
    if out.grant < mine.used {
        let after = room(&new, unmounted_held);
        out.grant = out
            .grant
            .max(after.clamp(0, mine.used.min(target) as i128) as u64);
    }
    if let Some(cap) = mine.cap {
        out.grant = out.grant.min(cap);
    }
    out
}

/// Each want's fair share of `budget`, and the spare room each may take on
/// top: min(want, L) with L such that the shares fill the budget when the
/// wants do not all fit (no spare); each want, and an even part of what is
/// left, when they do.
fn fair_shares(budget: u64, wants: &[u64]) -> (Vec<u64>, u64) {
    let total: u128 = wants.iter().map(|&w| w as u128).sum();
    if total <= budget as u128 {
        let spare = (budget as u128 - total) as u64 / (wants.len() as u64).max(1);
        return (wants.to_vec(), spare);
    }
    let mut sorted = wants.to_vec();
    sorted.sort_unstable();
    let mut left = budget;
    let n = sorted.len() as u64;
    let mut level = budget;
    for (i, &w) in sorted.iter().enumerate() {
        let rest = n - i as u64;
        if w.saturating_mul(rest) >= left {
            level = left / rest;
            break;
        }
        left -= w;
    }
    (wants.iter().map(|&w| w.min(level)).collect(), 0)
}

/// Now, in unix seconds.
pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The exclusive lock on a cache directory's ledger; released when dropped.
pub struct LedgerLock {
    _file: File,
}

impl LedgerLock {
    /// Waits for the lock (held only for a read and a write of the ledger).
    pub fn acquire(cache_dir: &PrivateDir) -> io::Result<LedgerLock> {
        let f = cache_dir.open_file(LEDGER_LOCK, OFlags::WRONLY | OFlags::CREATE)?;
        rustix::fs::flock(&f, rustix::fs::FlockOperation::LockExclusive)?;
        Ok(LedgerLock { _file: f })
    }
}

impl Ledger {
    /// The ledger of `cache_dir` (empty if there is none). A ledger that
    /// cannot be read is set aside as `budget.json.bad` with a warning, and
    /// the mounts book themselves again in a new one.
    pub fn load(cache_dir: &PrivateDir, _lock: &LedgerLock) -> io::Result<Ledger> {
        let path = cache_dir.display(LEDGER);
        let mut text = String::new();
        match cache_dir.open_read(LEDGER) {
            Ok(mut f) => {
                f.read_to_string(&mut text)?;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Ledger::default()),
            Err(e) => return Err(e),
        }
        match serde_json::from_str::<Ledger>(&text) {
            Ok(l) => Ok(l),
            Err(e) => {
                tracing::warn!(
                    "cache budget {}: unreadable ({e}); set aside as {LEDGER}.bad, starting a new one",
                    path.display()
                );
                let _ = cache_dir.rename(LEDGER, format!("{LEDGER}.bad"));
                Ok(Ledger::default())
            }
        }
    }

    /// Writes the ledger whole (a new file renamed over the old one, so a
    /// crash of the process leaves the old or the new, never half of one).
    /// Not synced: it is rewritten four times a second per mount, and a
    /// ledger lost to a power cut is set aside and rebuilt from the data
    /// sets on disk (the next mount's --cache-size, or the derived default,
    /// sets the budget again).
    pub fn store(&self, cache_dir: &PrivateDir, _lock: &LedgerLock) -> io::Result<()> {
        let tmp = format!("{LEDGER}.tmp");
        let mut f = cache_dir.create_file(&tmp)?;
        f.write_all(&serde_json::to_vec_pretty(self).map_err(io::Error::other)?)?;
        cache_dir.rename(&tmp, LEDGER)
    }

    /// Sets the limit: an admin's `--cache-size` (which replaces the one in
    /// force, with a log line when it changes it), or, when the ledger has
    /// none yet, [`DEFAULT_SHARE_OF_DISK`] of (free space + what the data
    /// sets hold).
    pub fn settle_limit(&mut self, asked: Option<u64>, floor_percent: Option<f64>, disk: Disk) {
        if self.format == 0 {
            self.format = 1;
            self.free_floor_percent = DEFAULT_FREE_FLOOR_PERCENT;
        }
        if let Some(p) = floor_percent {
            self.free_floor_percent = p;
        }
        match asked {
            Some(l) => {
                if self.limit != 0 && self.limit != l {
                    tracing::info!(
                        "cache budget changed from {} to {} (--cache-size)",
                        crate::sys::units::format_size(self.limit),
                        crate::sys::units::format_size(l)
                    );
                }
                self.limit = l;
                self.explicit = true;
            }
            None if self.limit == 0 => {
                let held: u64 = self.datasets.values().map(|r| r.used).sum();
                self.limit = ((disk.free + held) as f64 * DEFAULT_SHARE_OF_DISK) as u64;
                self.explicit = false;
            }
            None => {}
        }
    }

    /// The bytes all data sets hold.
    pub fn used(&self) -> u64 {
        self.datasets.values().map(|r| r.used).sum()
    }
}

/// Whether the data set cache in `dataset_dir` is held by a running mount:
/// the pid in its lock file when it is.
pub fn mounted_by(dataset_dir: &PrivateDir) -> Option<u32> {
    let mut f = dataset_dir.open_read(crate::cache::lock::LOCK_FILE).ok()?;
    // A shared lock is refused while a mount holds the exclusive one. It
    // is dropped at once; a mount starting in that instant retries
    // (`DatasetLock::acquire`).
    match rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockShared) {
        Ok(()) => None,
        Err(_) => {
            let mut s = String::new();
            let _ = f.read_to_string(&mut s);
            Some(s.trim().parse().unwrap_or(0))
        }
    }
}

/// Bytes on disk (allocated blocks) and files under `dir`
/// (`dir` names a directory below `under`; no symlink is followed).
pub fn disk_usage(under: &PrivateDir, dir: &str) -> (u64, u64) {
    let (mut bytes, mut files) = (0u64, 0u64);
    let mut stack = vec![std::path::PathBuf::from(dir)];
    while let Some(d) = stack.pop() {
        let Ok(it) = under.entries(&d) else { continue };
        for e in it {
            let rel = d.join(&e.name);
            let Ok(m) = under.stat(&rel) else { continue };
            bytes += m.st_blocks as u64 * 512;
            if e.kind == FileType::Directory {
                stack.push(rel);
            } else {
                files += 1;
            }
        }
    }
    (bytes, files)
}

/// The data set directories under `cache_dir` (every subdirectory but the
/// trash of a deletion under way; a symlink is not one).
pub fn dataset_dirs(cache_dir: &PrivateDir) -> io::Result<Vec<String>> {
    let mut v = Vec::new();
    for e in cache_dir.entries("")? {
        let name = e.name.to_string_lossy().into_owned();
        if e.kind == FileType::Directory && !name.starts_with('.') {
            v.push(name);
        }
    }
    v.sort();
    Ok(v)
}

/// Data set `id`'s directory, checked (None: gone, or not ours: left alone).
fn dataset(cache_dir: &PrivateDir, id: &str) -> Option<PrivateDir> {
    cache_dir.subdir(id, false).ok()
}

/// Why a data set's cache was not removed.
#[derive(Debug, thiserror::Error)]
pub enum RemoveError {
    #[error("no data set {0:?} in the cache directory")]
    Missing(String),
    #[error("data set {id:?} is mounted (pid {pid}); unmount it first")]
    Mounted { id: String, pid: u32 },
    #[error("data set {id:?}: {source}")]
    Io { id: String, source: io::Error },
}

/// Removes the cache of data set `id`, refused while a mount holds it:
/// takes the data set's lock, renames its directory away and books it out
/// of the ledger under the ledger lock, then deletes it. The bytes freed.
pub fn remove_dataset(cache_dir: &PrivateDir, id: &str) -> Result<u64, RemoveError> {
    let io_err = |source| RemoveError::Io {
        id: id.to_owned(),
        source,
    };
    if id.is_empty() || id.contains('/') || id.starts_with('.') {
        return Err(RemoveError::Missing(id.to_owned()));
    }
    let dir = match cache_dir.subdir(id, false) {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(RemoveError::Missing(id.to_owned()))
        }
        Err(e) => return Err(io_err(e)),
    };
    let trash = {
        let lock = crate::cache::lock::DatasetLock::acquire(&dir).map_err(|e| match e {
            crate::cache::lock::LockError::Held { .. } => RemoveError::Mounted {
                id: id.to_owned(),
                pid: mounted_by(&dir).unwrap_or(0),
            },
            crate::cache::lock::LockError::Io { source, .. } => io_err(source),
            crate::cache::lock::LockError::Moved { .. } => RemoveError::Missing(id.to_owned()),
        })?;
        let trash = format!("{TRASH_PREFIX}{id}-{}-{}", std::process::id(), now());
        let ledger_lock = LedgerLock::acquire(cache_dir).map_err(io_err)?;
        cache_dir.rename(id, &trash).map_err(io_err)?;
        let mut ledger = Ledger::load(cache_dir, &ledger_lock).map_err(io_err)?;
        if let Some(r) = ledger.datasets.remove(id) {
            ledger.deleting.insert(trash.clone(), r.used);
            ledger.store(cache_dir, &ledger_lock).map_err(io_err)?;
        }
        drop(lock);
        trash
    };
    let (bytes, _) = disk_usage(cache_dir, &trash);
    let removed = cache_dir.remove_tree(&trash);
    let _ = done_deleting(cache_dir, std::slice::from_ref(&trash));
    removed.map_err(io_err)?;
    Ok(bytes)
}

/// The pid in a trash directory's name (`.trash-ID-PID-TIME`): the process
/// deleting it.
fn trash_pid(name: &str) -> Option<u32> {
    name.strip_prefix(TRASH_PREFIX)?
        .rsplit('-')
        .nth(1)?
        .parse()
        .ok()
}

/// Whether the deletion of trash directory `name` is still under way: the
/// directory is there and the process that renamed it runs.
fn deleting_now(cache_dir: &PrivateDir, name: &str) -> bool {
    cache_dir.is_dir(name)
        && trash_pid(name).is_some_and(|p| std::path::Path::new(&format!("/proc/{p}")).exists())
}

/// Books out deletions that are done (`names`: trash directories, deleted
/// or given up on). Should it fail, the next booking drops what is gone.
fn done_deleting(cache_dir: &PrivateDir, names: &[String]) -> io::Result<()> {
    let lock = LedgerLock::acquire(cache_dir)?;
    let mut ledger = Ledger::load(cache_dir, &lock)?;
    let before = ledger.deleting.len();
    for n in names {
        ledger.deleting.remove(n);
    }
    if ledger.deleting.len() != before {
        ledger.store(cache_dir, &lock)?;
    }
    Ok(())
}

/// Deletes what an interrupted removal left (`.trash-*`), if nobody else
/// is deleting it now (the trash names the pid that renamed it).
pub fn sweep_trash(cache_dir: &PrivateDir) {
    let Ok(it) = cache_dir.entries("") else {
        return;
    };
    for e in it {
        let name = e.name.to_string_lossy().into_owned();
        if !name.starts_with(TRASH_PREFIX) {
            continue;
        }
        let alive = trash_pid(&name).is_some_and(|p| {
            p != std::process::id() && std::path::Path::new(&format!("/proc/{p}")).exists()
        });
        if !alive {
            let _ = cache_dir.remove_tree(&e.name);
        }
    }
}

/// One line of `locafs cache ls`.
#[derive(Debug, Clone, Serialize)]
pub struct DatasetInfo {
    pub id: String,
    pub source: String,
    pub used: u64,
    pub files: u64,
    pub grant: u64,
    pub last_mount: u64,
    pub mounted: bool,
    pub pid: Option<u32>,
    /// Where it is mounted (every mountpoint of its mount), as the
    /// command line finds out from its holder; empty here.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub mountpoints: Vec<String>,
}

/// Every data set under `cache_dir`, with the ledger's figures, measured on
/// disk for data sets the ledger does not know (caches made before it).
pub fn list(cache_dir: &PrivateDir) -> io::Result<(Ledger, Vec<DatasetInfo>)> {
    let ledger = {
        let lock = LedgerLock::acquire(cache_dir)?;
        Ledger::load(cache_dir, &lock)?
    };
    let mut out = Vec::new();
    for id in dataset_dirs(cache_dir)? {
        let dir = match cache_dir.subdir(&id, false) {
            Ok(dir) => dir,
            Err(e) => {
                tracing::warn!("{}: not listed: {e}", cache_dir.display(&id).display());
                continue;
            }
        };
        let pid = mounted_by(&dir);
        let rec = ledger.datasets.get(&id).cloned();
        let (used, files) = match &rec {
            Some(r) => (r.used, r.files),
            None => disk_usage(cache_dir, &id),
        };
        let mut r = rec.unwrap_or_default();
        if r.last_mount == 0 {
            // A cache the ledger has not seen mounted: its lock file is
            // rewritten at each mount.
            r.last_mount = dir
                .stat(crate::cache::lock::LOCK_FILE)
                .map_or(0, |m| m.st_mtime.max(0) as u64);
        }
        out.push(DatasetInfo {
            id,
            source: r.source,
            used,
            files,
            grant: if pid.is_some() { r.grant } else { 0 },
            last_mount: r.last_mount,
            mounted: pid.is_some(),
            pid,
            mountpoints: Vec::new(),
        });
    }
    Ok((ledger, out))
}

/// What `locafs cache gc` removes: unmounted data sets last mounted more
/// than `older_than` seconds ago, then, least recently mounted first, more
/// until all data sets hold at most `to` bytes. Pure.
pub fn gc_victims(
    list: &[DatasetInfo],
    now: u64,
    older_than: Option<u64>,
    to: Option<u64>,
) -> Vec<String> {
    let mut idle: Vec<&DatasetInfo> = list.iter().filter(|d| !d.mounted).collect();
    idle.sort_by_key(|d| (d.last_mount, d.id.clone()));
    let mut total: u64 = list.iter().map(|d| d.used).sum();
    let mut out = Vec::new();
    for d in idle {
        let old = older_than.is_some_and(|age| now.saturating_sub(d.last_mount) > age);
        let over = to.is_some_and(|limit| total > limit);
        if old || over {
            total -= d.used;
            out.push(d.id.clone());
        }
    }
    out
}

/// The booking of one mount in its cache directory's ledger.
pub struct Booking {
    pub cache_dir: PrivateDir,
    pub id: String,
    pub source: String,
    /// `--cache-size`, if given: the budget of the whole directory.
    pub asked: Option<u64>,
    /// `--cache-free-floor`, if given.
    pub floor_percent: Option<f64>,
}

/// The want of a mount that does not know its data set's size yet (a first
/// mount before any file was stat-ed): it gets what is free, and nothing
/// another data set holds is deleted or evicted for it.
pub const WANT_UNKNOWN: u64 = u64::MAX / 4;

/// What a mount tells the ledger at each booking.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub used: u64,
    pub files: u64,
    pub hot: u64,
    pub want: u64,
}

/// What the mount learns from a booking.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Share {
    /// The budget of the directory (`limit`) and the one in force now.
    pub limit: u64,
    pub effective: u64,
    /// What all data sets hold.
    pub used_all: u64,
    /// This mount's grant.
    pub grant: u64,
    /// Data sets deleted by this booking to make room.
    pub deleted: Vec<String>,
    /// Every data set: (id, used, grant; 0 when not mounted).
    pub datasets: Vec<(String, u64, u64)>,
}

impl Share {
    /// The part of `stats` this fills.
    pub fn snapshot(&self) -> crate::obs::stats::BudgetSnapshot {
        crate::obs::stats::BudgetSnapshot {
            cache_budget_bytes: self.limit,
            cache_budget_effective_bytes: self.effective,
            cache_dir_used_bytes: self.used_all,
            cache_grant_bytes: self.grant,
            cache_shares: self
                .datasets
                .iter()
                .map(|(id, used, grant)| crate::obs::stats::DatasetShare {
                    dataset: id.clone(),
                    used_bytes: *used,
                    grant_bytes: *grant,
                })
                .collect(),
        }
    }
}

impl Booking {
    /// Books `usage`, makes room as [`plan`] says, and returns the grant.
    /// Unmounted data sets it deletes are renamed away under the lock and
    /// deleted after it.
    pub fn book(&self, usage: Usage, first: bool) -> io::Result<Share> {
        let disk = Disk::of(&self.cache_dir)?;
        let mut trash = Vec::new();
        let share = {
            let lock = LedgerLock::acquire(&self.cache_dir)?;
            let mut ledger = Ledger::load(&self.cache_dir, &lock)?;
            // Data sets the ledger does not know yet (made before it, or
            // its ledger set aside): measured once.
            for id in dataset_dirs(&self.cache_dir)? {
                if !ledger.datasets.contains_key(&id)
                    && id != self.id
                    && dataset(&self.cache_dir, &id).is_some()
                {
                    let (used, files) = disk_usage(&self.cache_dir, &id);
                    ledger.datasets.insert(
                        id,
                        Record {
                            used,
                            files,
                            ..Record::default()
                        },
                    );
                }
            }
            ledger.datasets.retain(|id, _| self.cache_dir.is_dir(id));
            // A deleter that died leaves its trash uncounted (and the
            // next mount's sweep deletes it).
            ledger
                .deleting
                .retain(|name, _| deleting_now(&self.cache_dir, name));
            if first {
                ledger.settle_limit(self.asked, self.floor_percent, disk);
            }
            let t = now();
            let rec = ledger.datasets.entry(self.id.clone()).or_default();
            rec.source.clone_from(&self.source);
            rec.used = usage.used;
            rec.files = usage.files;
            rec.hot = usage.hot;
            rec.want = usage.want;
            rec.last_seen = t;
            if first {
                rec.last_mount = t;
            }
            // Probed once per booking: a lock attempt per data set.
            let live: std::collections::BTreeSet<String> = ledger
                .datasets
                .keys()
                .filter(|id| {
                    **id == self.id
                        || dataset(&self.cache_dir, id).is_some_and(|d| mounted_by(&d).is_some())
                })
                .cloned()
                .collect();
            let mounted = |id: &str| live.contains(id);
            let p = plan(&ledger, &self.id, &mounted, disk);
            let mut deleted = Vec::new();
            for id in &p.delete {
                // Only a data set directory of ours, taken only if still
                // unmounted; renamed away at once.
                let Some(ds) = dataset(&self.cache_dir, id) else {
                    continue;
                };
                let Ok(l) = crate::cache::lock::DatasetLock::try_acquire(&ds) else {
                    continue;
                };
                let name = format!("{TRASH_PREFIX}{id}-{}-{t}", std::process::id());
                if self.cache_dir.rename(id, &name).is_ok() {
                    if let Some(r) = ledger.datasets.remove(id) {
                        ledger.deleting.insert(name.clone(), r.used);
                    }
                    deleted.push(id.clone());
                    trash.push(name);
                }
                drop(l);
            }
            for (id, g) in &p.lower {
                if let Some(r) = ledger.datasets.get_mut(id) {
                    r.cap = Some(r.cap.map_or(*g, |c| c.min(*g)));
                }
            }
            // The grant in force for this mount: what the plan gives, but
            // never more than room that deletions have not freed yet.
            let unmade: u64 = p
                .delete
                .iter()
                .filter(|id| !deleted.contains(id))
                .filter_map(|id| ledger.datasets.get(id).map(|r| r.used))
                .sum();
            let grant = p.grant.saturating_sub(unmade);
            if let Some(r) = ledger.datasets.get_mut(&self.id) {
                r.grant = grant;
                r.cap = None;
            }
            ledger.store(&self.cache_dir, &lock)?;
            Share {
                limit: ledger.limit,
                effective: p.effective,
                used_all: ledger.used(),
                grant,
                deleted,
                datasets: ledger
                    .datasets
                    .iter()
                    .map(|(id, r)| {
                        (
                            id.clone(),
                            r.used,
                            if live.contains(id) { r.grant } else { 0 },
                        )
                    })
                    .collect(),
            }
        };
        if !trash.is_empty() {
            for t in &trash {
                let _ = self.cache_dir.remove_tree(t);
            }
            if let Err(e) = done_deleting(&self.cache_dir, &trash) {
                tracing::debug!("cache budget: booking a deletion out: {e}");
            }
        }
        Ok(share)
    }

    /// Books the mount out: its grant goes back to the ledger, its use stays
    /// booked (its cache stays on disk for the next mount).
    pub fn release(&self, usage: Usage) -> io::Result<()> {
        let lock = LedgerLock::acquire(&self.cache_dir)?;
        let mut ledger = Ledger::load(&self.cache_dir, &lock)?;
        if let Some(r) = ledger.datasets.get_mut(&self.id) {
            r.used = usage.used;
            r.files = usage.files;
            r.grant = 0;
            r.last_seen = now();
        }
        ledger.store(&self.cache_dir, &lock)
    }
}

/// The mount's side of the budget: a thread that books the cache's use
/// every [`BOOKING_INTERVAL`] and applies the grant it gets (the cache shrinks to it, or
/// may grow to it). Dropping it stops the thread and books the mount out.
pub struct BudgetKeeper {
    stop: std::sync::Arc<(parking_lot::Mutex<bool>, parking_lot::Condvar)>,
    thread: Option<std::thread::JoinHandle<()>>,
    share: std::sync::Arc<parking_lot::Mutex<Share>>,
}

/// How often a mount books its use.
pub const BOOKING_INTERVAL: std::time::Duration = std::time::Duration::from_millis(250);

impl BudgetKeeper {
    /// Books once now (the grant is applied before this returns, so the
    /// cache starts within it) and then every [`BOOKING_INTERVAL`].
    pub fn start(
        booking: Booking,
        usage: Box<dyn Fn() -> Usage + Send>,
        apply: Box<dyn Fn(u64) + Send>,
    ) -> io::Result<BudgetKeeper> {
        sweep_trash(&booking.cache_dir);
        let first = booking.book(usage(), true)?;
        apply(first.grant);
        log_share(&booking, &first);
        let share = std::sync::Arc::new(parking_lot::Mutex::new(first));
        let stop =
            std::sync::Arc::new((parking_lot::Mutex::new(false), parking_lot::Condvar::new()));
        let thread = {
            let (share, stop) = (share.clone(), stop.clone());
            std::thread::Builder::new()
                .name("locafs-budget".into())
                .spawn(move || {
                    let mut failing = false;
                    loop {
                        {
                            let mut s = stop.0.lock();
                            if !*s {
                                stop.1.wait_for(&mut s, BOOKING_INTERVAL);
                            }
                            if *s {
                                break;
                            }
                        }
                        match booking.book(usage(), false) {
                            Ok(sh) => {
                                apply(sh.grant);
                                if !sh.deleted.is_empty() {
                                    log_share(&booking, &sh);
                                }
                                *share.lock() = sh;
                                failing = false;
                            }
                            Err(e) if !failing => {
                                // The grant in force stays; the next booking
                                // retries.
                                tracing::warn!(
                                    "cache budget {}: {}",
                                    booking.cache_dir.display(LEDGER).display(),
                                    crate::obs::logging::short_io(&e)
                                );
                                failing = true;
                            }
                            Err(_) => {}
                        }
                    }
                    if let Err(e) = booking.release(usage()) {
                        tracing::warn!(
                            "cache budget: booking out: {}",
                            crate::obs::logging::short_io(&e)
                        );
                    }
                })?
        };
        Ok(BudgetKeeper {
            stop,
            thread: Some(thread),
            share,
        })
    }

    /// The last booking's figures.
    pub fn share(&self) -> Share {
        self.share.lock().clone()
    }

    /// A handle on the last booking's figures, for stats.
    pub fn share_handle(&self) -> std::sync::Arc<parking_lot::Mutex<Share>> {
        self.share.clone()
    }
}

fn log_share(b: &Booking, s: &Share) {
    for d in &s.deleted {
        tracing::info!(
            "cache budget: removed data set {d:?} (not mounted) from {} to make room",
            b.cache_dir.path().display()
        );
    }
}

impl Drop for BudgetKeeper {
    fn drop(&mut self) {
        *self.stop.0.lock() = true;
        self.stop.1.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    const G: u64 = 1 << 30;

    fn rec(used: u64, grant: u64, hot: u64, want: u64, last_mount: u64) -> Record {
        Record {
            used,
            grant,
            hot,
            want,
            last_mount,
            ..Record::default()
        }
    }

    fn ledger(limit: u64, ds: &[(&str, Record)]) -> Ledger {
        Ledger {
            format: 1,
            limit,
            explicit: true,
            free_floor_percent: 5.0,
            datasets: ds.iter().map(|(k, r)| (k.to_string(), r.clone())).collect(),
            deleting: BTreeMap::new(),
        }
    }

    fn disk_free(free: u64) -> Disk {
        Disk {
            total: 1000 * G,
            free,
        }
    }

    #[test]
    fn a_lone_mount_gets_its_data_set_within_the_budget() {
        let l = ledger(100 * G, &[("a", rec(0, 0, 0, 30 * G, 1))]);
        // Its data set and the spare room (a want is an estimate).
        let p = plan(&l, "a", &|_| true, disk_free(500 * G));
        assert_eq!((p.grant, p.effective), (100 * G, 100 * G));
        let l = ledger(100 * G, &[("a", rec(0, 0, 0, 300 * G, 1))]);
        assert_eq!(plan(&l, "a", &|_| true, disk_free(500 * G)).grant, 100 * G);
    }

    #[test]
    fn the_free_space_floor_lowers_the_budget_in_force() {
        // 1000 G disk, 5 % floor = 50 G; 60 G free and 20 G held: at most
        // 20 + 60 - 50 = 30 G.
        let l = ledger(100 * G, &[("a", rec(20 * G, 20 * G, 0, 90 * G, 1))]);
        let p = plan(&l, "a", &|_| true, disk_free(60 * G));
        assert_eq!((p.effective, p.grant), (30 * G, 30 * G));
        // Another program filled the disk: the grant falls below what is
        // held, and the cache gives space back.
        let p = plan(&l, "a", &|_| true, disk_free(40 * G));
        assert_eq!(p.grant, 10 * G);
    }

    #[test]
    fn unmounted_data_sets_go_first_least_recently_mounted_first() {
        let l = ledger(
            100 * G,
            &[
                ("me", rec(0, 0, 0, 50 * G, 9)),
                ("old", rec(30 * G, 0, 0, 30 * G, 1)),
                ("older", rec(30 * G, 0, 0, 30 * G, 0)),
                ("b", rec(30 * G, 30 * G, 30 * G, 30 * G, 5)),
            ],
        );
        let mounted = |id: &str| id == "me" || id == "b";
        let p = plan(&l, "me", &mounted, disk_free(500 * G));
        // 10 G free; 40 G more needed: "older" (30 G), then "old"; the
        // spare room that leaves (10 G, split with b) comes on top.
        assert_eq!(p.delete, vec!["older".to_string(), "old".to_string()]);
        assert!(p.lower.is_empty(), "{p:?}");
        assert_eq!(p.grant, 60 * G);
        // Only what is needed is deleted: with 20 G more free, "old" stays.
        let mut l2 = l.clone();
        l2.datasets.get_mut("older").unwrap().used = 60 * G;
        l2.limit = 160 * G;
        let p = plan(&l2, "me", &mounted, disk_free(500 * G));
        assert_eq!(p.delete, vec!["older".to_string()], "{p:?}");
    }

    #[test]
    fn a_mount_that_does_not_know_its_size_takes_only_what_is_free() {
        let l = ledger(
            100 * G,
            &[
                ("me", rec(0, 0, 0, WANT_UNKNOWN, 9)),
                ("old", rec(30 * G, 0, 0, 30 * G, 1)),
                ("b", rec(50 * G, 50 * G, 0, 50 * G, 5)),
            ],
        );
        let mounted = |id: &str| id == "me" || id == "b";
        let p = plan(&l, "me", &mounted, disk_free(500 * G));
        // 20 G free: taken; "old" and b's cold entries stay.
        assert!(p.delete.is_empty(), "{p:?}");
        assert!(p.lower.is_empty(), "{p:?}");
        assert_eq!(p.grant, 20 * G);
        // Nothing free: no grant, still nothing deleted.
        let mut full = l.clone();
        full.limit = 80 * G;
        let p = plan(&full, "me", &mounted, disk_free(500 * G));
        assert!(p.delete.is_empty() && p.lower.is_empty(), "{p:?}");
        assert_eq!(p.grant, 0);
        // Once its size is known (files stat-ed), room is made for that.
        full.datasets.get_mut("me").unwrap().want = 10 * G;
        let p = plan(&full, "me", &mounted, disk_free(500 * G));
        assert_eq!(p.delete, vec!["old".to_string()], "{p:?}");
        assert!(p.grant >= 10 * G, "{p:?}");
    }

    /// Issue 36, as measured on a 1 GiB tmpfs (MiB): C deleted A (444)
    /// and took its room; B, being read, booked while A's files were still
    /// being deleted. The disk's free space did not show A's room yet, and
    /// B was told to shrink to 85 (and C to give back what it had just
    /// been given), though nothing but the deletion had changed.
    #[test]
    fn a_booking_while_a_neighbour_deletes_a_data_set_takes_nothing_from_anyone() {
        const M: u64 = 1 << 20;
        let mut l = ledger(
            819 * M,
            &[
                ("b", rec(352 * M, 373 * M, 352 * M, 374 * M, 5)),
                ("c", rec(2 * M, 445 * M, 2 * M, 640 * M, 9)),
            ],
        );
        l.deleting.insert(".trash-a-4242-9".into(), 444 * M);
        let disk = Disk {
            total: 1024 * M,
            free: (1024 - 352 - 2 - 444) * M,
        };
        let p = plan(&l, "b", &|_| true, disk);
        assert_eq!(p.effective, 819 * M, "{p:?}");
        assert!(p.lower.is_empty(), "{p:?}");
        assert!(p.grant >= 352 * M, "B keeps its cache: {p:?}");
        // Once the deletion is done, the same: the room was C's already.
        l.deleting.clear();
        let disk = Disk {
            total: 1024 * M,
            free: (1024 - 352 - 2) * M,
        };
        assert_eq!(plan(&l, "b", &|_| true, disk), p);
    }

    /// The disk filled by another program: 20 G short. The booking mount
    /// (read in epochs) lowers its neighbour's cold entries by 20 G; until
    /// 2026-12 it also cut its own grant by the same 20 G at once, and grew
    /// back into that room after its neighbour had shrunk: 40 G evicted
    /// for 20.
    #[test]
    fn when_the_disk_fills_the_neighbour_lowered_gives_and_the_booking_mount_keeps() {
        let mut l = ledger(
            100 * G,
            &[
                ("b", rec(50 * G, 50 * G, 50 * G, 50 * G, 5)),
                ("c", rec(50 * G, 50 * G, 10 * G, 60 * G, 9)),
            ],
        );
        // 1000 G disk, floor 50 G, 30 G free: 80 G in force.
        let p = plan(&l, "b", &|_| true, disk_free(30 * G));
        assert_eq!(p.effective, 80 * G);
        assert_eq!(p.lower, vec![("c".to_string(), 30 * G)]);
        assert_eq!(p.grant, 50 * G, "{p:?}");
        // C applies the lower grant at its booking; then the disk holds the
        // budget in force.
        l.datasets.get_mut("c").unwrap().cap = Some(30 * G);
        let pc = plan(&l, "c", &|_| true, disk_free(30 * G));
        assert_eq!(pc.grant, 30 * G, "{pc:?}");
        // With nobody to give (C read in epochs too), B gives.
        l.datasets.get_mut("c").unwrap().cap = None;
        l.datasets.get_mut("c").unwrap().hot = 50 * G;
        let p = plan(&l, "b", &|_| true, disk_free(30 * G));
        assert!(p.lower.is_empty(), "{p:?}");
        assert_eq!(p.grant, 30 * G, "{p:?}");
    }

    #[test]
    fn a_neighbour_read_in_epochs_is_never_churned() {
        // b holds 60 G, all of it read within two epochs.
        let l = ledger(
            100 * G,
            &[
                ("me", rec(0, 0, 0, 80 * G, 9)),
                ("b", rec(60 * G, 60 * G, 60 * G, 60 * G, 5)),
            ],
        );
        let p = plan(&l, "me", &|_| true, disk_free(500 * G));
        assert!(p.lower.is_empty(), "{p:?}");
        assert_eq!(p.grant, 40 * G);
    }

    #[test]
    fn cold_entries_and_unused_grant_of_a_neighbour_are_taken_down_to_its_hot_bytes() {
        let mut l = ledger(
            100 * G,
            &[
                ("me", rec(0, 0, 0, 80 * G, 9)),
                ("b", rec(70 * G, 90 * G, 20 * G, 90 * G, 5)),
            ],
        );
        let p = plan(&l, "me", &|_| true, disk_free(500 * G));
        // The fair level is 50 G. b held max(90, 70) = 90: its unused grant
        // goes first (to 70), then cold entries, down to 50 (its hot bytes
        // are 20). b holds its grant until it has shrunk: 10 G now.
        assert_eq!(p.lower, vec![("b".to_string(), 50 * G)]);
        assert_eq!(p.grant, 10 * G);
        l.datasets.get_mut("me").unwrap().grant = 10 * G;
        l.datasets.get_mut("b").unwrap().cap = Some(50 * G);
        // b's own booking applies the cap, and it shrinks.
        let pb = plan(&l, "b", &|_| true, disk_free(500 * G));
        assert_eq!(pb.grant, 50 * G);
        let b = l.datasets.get_mut("b").unwrap();
        (b.grant, b.used, b.cap) = (50 * G, 50 * G, None);
        // The next booking gets the rest.
        let p = plan(&l, "me", &|_| true, disk_free(500 * G));
        assert_eq!((p.grant, p.lower.len()), (50 * G, 0));
    }

    #[test]
    fn grants_never_pass_the_budget_whatever_the_order_of_bookings() {
        // Three mounts filling at once, each wanting the whole budget,
        // booking in turn with their use growing to their grant.
        let mut l = ledger(90 * G, &[]);
        for id in ["a", "b", "c"] {
            l.datasets.insert(id.into(), rec(0, 0, 0, 200 * G, 1));
        }
        for round in 0..30 {
            for id in ["a", "b", "c"] {
                let p = plan(&l, id, &|_| true, disk_free(900 * G));
                for (n, g) in &p.lower {
                    l.datasets.get_mut(n).unwrap().cap = Some(*g);
                }
                let r = l.datasets.get_mut(id).unwrap();
                r.grant = p.grant;
                r.cap = None;
                // It fills to its grant, or shrinks to it.
                r.used = p.grant;
                r.hot = r.used / 2;
                let held: u64 = l.datasets.values().map(|r| r.grant.max(r.used)).sum();
                assert!(held <= 90 * G, "round {round}: {held} > budget: {l:?}");
            }
        }
        // They end with fair shares.
        for r in l.datasets.values() {
            assert_eq!(r.grant, 30 * G, "{l:?}");
        }
    }

    #[test]
    fn a_derived_limit_is_kept_and_an_explicit_one_replaces_it() {
        let mut l = Ledger::default();
        l.datasets.insert("x".into(), rec(10 * G, 0, 0, 0, 0));
        l.settle_limit(None, None, disk_free(90 * G));
        assert_eq!((l.limit, l.explicit), (80 * G, false));
        assert_eq!(l.free_floor_percent, DEFAULT_FREE_FLOOR_PERCENT);
        l.settle_limit(None, None, disk_free(10 * G));
        assert_eq!(l.limit, 80 * G, "derived once");
        l.settle_limit(Some(5 * G), Some(10.0), disk_free(10 * G));
        assert_eq!(
            (l.limit, l.explicit, l.free_floor_percent),
            (5 * G, true, 10.0)
        );
    }

    #[test]
    fn gc_picks_old_unmounted_data_sets_then_more_until_under_the_size() {
        let d = |id: &str, used: u64, last: u64, mounted: bool| DatasetInfo {
            id: id.into(),
            source: String::new(),
            used,
            files: 1,
            grant: 0,
            last_mount: last,
            mounted,
            pid: None,
            mountpoints: Vec::new(),
        };
        let list = [
            d("a", 10, 100, false),
            d("b", 10, 900, false),
            d("c", 10, 50, true),
            d("d", 10, 500, false),
        ];
        assert_eq!(
            gc_victims(&list, 1000, Some(600), None),
            vec!["a".to_string()]
        );
        assert_eq!(
            gc_victims(&list, 1000, None, Some(15)),
            vec!["a".to_string(), "d".to_string(), "b".to_string()]
        );
        assert!(gc_victims(&list, 1000, None, Some(40)).is_empty());
    }

    #[test]
    fn ledger_round_trips_and_a_bad_one_is_set_aside() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = PrivateDir::open(tmp.path()).unwrap();
        let lock = LedgerLock::acquire(&dir).unwrap();
        let l = ledger(7 * G, &[("a", rec(1, 2, 3, 4, 5))]);
        l.store(&dir, &lock).unwrap();
        assert_eq!(Ledger::load(&dir, &lock).unwrap(), l);
        {
            use std::os::unix::fs::MetadataExt;
            let mode = fs::metadata(tmp.path().join(LEDGER)).unwrap().mode();
            assert_eq!(
                mode & 0o777,
                0o600,
                "the ledger names the sources: owner-only"
            );
        }
        fs::write(tmp.path().join(LEDGER), b"{not json").unwrap();
        assert_eq!(Ledger::load(&dir, &lock).unwrap(), Ledger::default());
        assert!(tmp.path().join(format!("{LEDGER}.bad")).exists());
    }

    #[test]
    fn remove_is_refused_while_mounted_and_books_the_data_set_out() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = PrivateDir::open(tmp.path()).unwrap();
        let ds = tmp.path().join("imagenet");
        fs::create_dir_all(ds.join("blocks")).unwrap();
        fs::write(ds.join("blocks/x.data"), vec![1u8; 10000]).unwrap();
        {
            let lock = LedgerLock::acquire(&dir).unwrap();
            ledger(G, &[("imagenet", rec(12288, 0, 0, 0, 1))])
                .store(&dir, &lock)
                .unwrap();
        }
        let ds_dir = dir.subdir("imagenet", false).unwrap();
        let held = crate::cache::lock::DatasetLock::acquire(&ds_dir).unwrap();
        assert_eq!(mounted_by(&ds_dir), Some(std::process::id()));
        let e = remove_dataset(&dir, "imagenet").unwrap_err();
        assert!(matches!(e, RemoveError::Mounted { .. }), "{e}");
        assert!(ds.join("blocks/x.data").exists());
        drop(held);
        assert_eq!(mounted_by(&ds_dir), None);
        let freed = remove_dataset(&dir, "imagenet").unwrap();
        assert!(freed >= 10000, "{freed}");
        assert!(!ds.exists());
        let lock = LedgerLock::acquire(&dir).unwrap();
        assert!(Ledger::load(&dir, &lock).unwrap().datasets.is_empty());
        assert!(matches!(
            remove_dataset(&dir, "imagenet"),
            Err(RemoveError::Missing(_))
        ));
        assert!(matches!(
            remove_dataset(&dir, "../etc"),
            Err(RemoveError::Missing(_))
        ));
    }

    #[test]
    fn keepers_of_two_mounts_share_the_budget_and_delete_an_unmounted_data_set_first() {
        use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
        use std::sync::Arc;
        const M: u64 = 1 << 20;
        let tmp = tempfile::tempdir_in("/var/tmp").unwrap();
        let dir = PrivateDir::open(tmp.path()).unwrap();
        // An unmounted data set holding about 3 MiB.
        let old = tmp.path().join("old");
        fs::create_dir_all(&old).unwrap();
        fs::write(old.join("x.data"), vec![7u8; 3 << 20]).unwrap();
        let start = |id: &str, want: u64| {
            let ds = dir.subdir(id, true).unwrap();
            let lock = crate::cache::lock::DatasetLock::acquire(&ds).unwrap();
            let used = Arc::new(AtomicU64::new(0));
            let grant = Arc::new(AtomicU64::new(0));
            let booking = Booking {
                cache_dir: dir.clone(),
                id: id.into(),
                source: format!("/data/{id}"),
                asked: Some(8 * M),
                floor_percent: Some(0.0),
            };
            let (u, g) = (used.clone(), grant.clone());
            let k = BudgetKeeper::start(
                booking,
                Box::new(move || Usage {
                    used: u.load(Relaxed),
                    files: 1,
                    hot: u.load(Relaxed),
                    want,
                }),
                Box::new(move |x| g.store(x, Relaxed)),
            )
            .unwrap();
            (lock, k, used, grant)
        };
        let a = start("a", 6 * M);
        // a fills to its grant.
        a.2.store(a.3.load(Relaxed), Relaxed);
        let b = start("b", 6 * M);
        for _ in 0..40 {
            // Each cache holds what its grant allows (a cache shrinks to a
            // lower grant, grows into a higher one).
            for m in [&a, &b] {
                m.2.store(m.3.load(Relaxed), Relaxed);
            }
            let sum = a.3.load(Relaxed) + b.3.load(Relaxed);
            assert!(sum <= 8 * M, "grants {sum} over the budget");
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        assert!(
            !old.exists(),
            "the unmounted data set was not removed first"
        );
        // Filling at once, they end with fair shares.
        assert_eq!((a.3.load(Relaxed), b.3.load(Relaxed)), (4 * M, 4 * M));
        let (list_ledger, list) = list(&dir).unwrap();
        assert_eq!(list_ledger.limit, 8 * M);
        assert_eq!(
            list.iter().map(|d| d.id.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );
        assert!(list
            .iter()
            .all(|d| d.mounted && d.source.starts_with("/data/")));
        // Unmounting: the keeper books out before the lock goes (a mount
        // drops them in this order), and the cache stays for the next mount.
        // (b's keeper is stopped first: it would take the room a leaves.)
        drop(b);
        let (lock, keeper, _, _) = a;
        drop(keeper);
        drop(lock);
        let (_, list) = super::list(&dir).unwrap();
        let a = list.iter().find(|d| d.id == "a").unwrap();
        assert!(!a.mounted && a.used == 4 * M && a.grant == 0, "{a:?}");
    }
}
