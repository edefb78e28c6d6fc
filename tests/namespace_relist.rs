//! Revalidation by listing: over a source whose listings carry every
//! attribute (an object store's do), the stale entries of a directory are
//! revalidated by listing the directory again, one listing shared by every
//! caller waiting on it, never by a stat of each (a HEAD request per open).
//! A replaced, a deleted and a new entry show as a stat would have shown
//! them; a directory too big to list again, and a source whose listings do
//! not carry attributes, are stat-ed; a listing that times out answers
//! from the last known tree. Lookups in a directory never listed wait for
//! its listing if one is under way (read-ahead's walk), else stat.

mod common;

use std::future::Future;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use locafs::meta::namespace::{Namespace, RELIST_MAX, ROOT};
use locafs::source::Source;
use locafs::testing::{Call, Hook, Hooked, MemSource, Stall};

/// What the [`MemSource`] behind it is asked: its listings say they carry
/// every attribute (or not, with `attrs` false); stats and listings are
/// counted; each listing takes `LIST_MS`, waits while `hold_lists` is
/// stalled, or fails with ETIMEDOUT while `fail_lists` is set.
struct Lists {
    attrs: bool,
    stats: AtomicU64,
    lists: AtomicU64,
    fail_lists: AtomicBool,
    hold_lists: Stall,
}

type Listing = Hooked<Lists, MemSource>;

const LIST_MS: u64 = 100;
/// --revalidate for these tests.
const REVALIDATE: Duration = Duration::from_millis(300);

fn listing(attrs: bool) -> Listing {
    let lists = Lists {
        attrs,
        stats: AtomicU64::new(0),
        lists: AtomicU64::new(0),
        fail_lists: AtomicBool::new(false),
        hold_lists: Stall::default(),
    };
    Hooked::over(MemSource::new(), lists)
}

impl Lists {
    fn counts(&self) -> (u64, u64) {
        (self.stats.load(SeqCst), self.lists.load(SeqCst))
    }
}

impl Hook for Lists {
    fn around<T>(&self, call: Call<'_>, real: impl FnOnce() -> T) -> T {
        match call {
            Call::Stat(_) => {
                self.stats.fetch_add(1, SeqCst);
            }
            Call::List(_) => {
                self.lists.fetch_add(1, SeqCst);
                self.hold_lists.around(call, || ());
                std::thread::sleep(Duration::from_millis(LIST_MS));
            }
            _ => {}
        }
        real()
    }
    fn refuse(&self, call: Call<'_>) -> Option<io::Error> {
        let fail = matches!(call, Call::List(_)) && self.fail_lists.load(SeqCst);
        fail.then(|| io::Error::from_raw_os_error(libc::ETIMEDOUT))
    }
    fn listing_carries_attrs(&self) -> bool {
        self.attrs
    }
}

/// A namespace over `src` with directory `d` of `files` files listed and
/// every entry known; the inodes of `d` and of its files.
fn listed(src: &Arc<Listing>, files: usize) -> (Namespace, u64, Vec<u64>) {
    for i in 0..files {
        src.inner()
            .put_file(format!("d/f{i:05}"), vec![i as u8; i % 7]);
    }
    let source: Arc<dyn Source> = Arc::clone(src) as Arc<dyn Source>;
    let ns = Namespace::new(source, Some(REVALIDATE), Arc::default()).unwrap();
    ns.refresh_dir(ROOT).unwrap();
    let (d, _) = ns.lookup(ROOT, "d".as_ref()).unwrap();
    ns.refresh_dir(d).unwrap();
    let inos = (0..files)
        .map(|i| ns.lookup(d, format!("f{i:05}").as_ref()).unwrap().0)
        .collect();
    (ns, d, inos)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stale_entries_of_a_directory_are_revalidated_by_one_shared_listing() {
    let src = Arc::new(listing(true));
    let (ns, _, inos) = listed(&src, 300);
    let ns = Arc::new(ns);
    let (stats0, lists0) = src.counts();
    tokio::time::sleep(REVALIDATE + Duration::from_millis(50)).await;
    // 300 opens at once, as loader threads give them: every entry stale.
    let asked: Vec<_> = inos
        .iter()
        .map(|&ino| {
            let ns = Arc::clone(&ns);
            tokio::spawn(async move { ns.getattr_async(ino).await })
        })
        .collect();
    for (i, t) in asked.into_iter().enumerate() {
        let a = t.await.unwrap().unwrap();
        assert_eq!(a.size, (i % 7) as u64, "f{i:05}");
    }
    let (stats, lists) = src.counts();
    assert_eq!(stats - stats0, 0, "stale entries were stat-ed");
    assert_eq!(lists - lists0, 1, "one listing for the whole directory");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_shows_replaced_deleted_and_new_entries_as_stats_would() {
    let src = Arc::new(listing(true));
    let (ns, d, inos) = listed(&src, 10);
    src.inner().put_file("d/f00003", vec![9u8; 1234]);
    src.inner().remove("d/f00004");
    src.inner().put_file("d/new", vec![1u8; 5]);
    let (stats0, lists0) = src.counts();
    tokio::time::sleep(REVALIDATE + Duration::from_millis(50)).await;
    // The replaced object is another inode, the deleted one is gone.
    let e = ns.getattr_async(inos[3]).await.unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{e}");
    let e = ns.getattr_async(inos[4]).await.unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{e}");
    let (ino, a) = ns.lookup_async(d, "f00003".as_ref()).await.unwrap();
    assert_ne!(ino, inos[3]);
    assert_eq!(a.size, 1234);
    let (_, a) = ns.lookup_async(d, "new".as_ref()).await.unwrap();
    assert_eq!(a.size, 5);
    let e = ns.lookup_async(d, "f00004".as_ref()).await.unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{e}");
    // An unchanged one keeps its inode.
    assert_eq!(ns.getattr_async(inos[5]).await.unwrap().size, 5);
    let (stats, lists) = src.counts();
    assert_eq!((stats - stats0, lists - lists0), (0, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lookups_in_a_directory_being_listed_wait_for_that_listing() {
    let src = Arc::new(listing(true));
    for i in 0..50 {
        src.inner().put_file(format!("d/f{i:05}"), vec![1u8; i]);
    }
    let source: Arc<dyn Source> = Arc::clone(&src) as Arc<dyn Source>;
    let ns = Arc::new(Namespace::new(source, Some(REVALIDATE), Arc::default()).unwrap());
    ns.refresh_dir(ROOT).unwrap();
    let (d, _) = ns.lookup(ROOT, "d".as_ref()).unwrap();
    let (stats0, lists0) = src.counts();
    // A listing of `d` under way (read-ahead's walk), held in the source
    // until every lookup has started: 50 lookups and one of a name that
    // is not there.
    src.hold_lists.stall();
    let walk = {
        let ns = Arc::clone(&ns);
        tokio::spawn(async move { ns.refresh_dir_async(d).await })
    };
    common::wait_until("the listing in the source", Duration::from_secs(30), || {
        src.hold_lists.waiting() == 1
    });
    let names: Vec<String> = (0..51).map(|i| format!("f{i:05}")).collect();
    let mut asked: Vec<_> = names
        .iter()
        .map(|n| Box::pin(ns.lookup_async(d, n.as_ref())))
        .collect();
    // Each polled once while the listing is held: none can answer yet.
    std::future::poll_fn(|cx| {
        for (i, a) in asked.iter_mut().enumerate() {
            assert!(
                a.as_mut().poll(cx).is_pending(),
                "{i} answered before the listing"
            );
        }
        std::task::Poll::Ready(())
    })
    .await;
    src.hold_lists.resume();
    for (i, t) in asked.into_iter().enumerate() {
        match t.await {
            Ok((_, a)) => assert_eq!(a.size, i as u64),
            Err(e) => assert!(
                i == 50 && e.raw_os_error() == Some(libc::ENOENT),
                "{i}: {e}"
            ),
        }
    }
    walk.await.unwrap().unwrap();
    assert_eq!(src.counts(), (stats0, lists0 + 1));
    // With no listing under way, a lookup in a directory never listed
    // stats (its listing could be a million entries long).
    let src = Arc::new(listing(true));
    src.inner().put_file("e/x", vec![1u8; 3]);
    let source: Arc<dyn Source> = Arc::clone(&src) as Arc<dyn Source>;
    let ns = Namespace::new(source, Some(REVALIDATE), Arc::default()).unwrap();
    ns.refresh_dir(ROOT).unwrap();
    let (e, _) = ns.lookup(ROOT, "e".as_ref()).unwrap();
    let (stats0, lists0) = src.counts();
    assert_eq!(ns.lookup_async(e, "x".as_ref()).await.unwrap().1.size, 3);
    assert_eq!(src.counts(), (stats0 + 1, lists0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_that_times_out_answers_from_the_last_known_tree() {
    let src = Arc::new(listing(true));
    let (ns, _, inos) = listed(&src, 10);
    tokio::time::sleep(REVALIDATE + Duration::from_millis(50)).await;
    src.fail_lists.store(true, SeqCst);
    let (stats0, lists0) = src.counts();
    assert_eq!(ns.getattr_async(inos[2]).await.unwrap().size, 2);
    assert_eq!(src.counts(), (stats0, lists0 + 1));
    // The listing is asked again (the entry is still stale), and answers.
    src.fail_lists.store(false, SeqCst);
    assert_eq!(ns.getattr_async(inos[2]).await.unwrap().size, 2);
    assert_eq!(src.counts(), (stats0, lists0 + 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn big_directories_and_sources_whose_listings_lack_attributes_are_stat_ed() {
    for (attrs, files) in [(true, RELIST_MAX + 1), (false, 10)] {
        let src = Arc::new(listing(attrs));
        let (ns, _, inos) = listed(&src, files);
        tokio::time::sleep(REVALIDATE + Duration::from_millis(50)).await;
        let (stats0, lists0) = src.counts();
        assert_eq!(ns.getattr_async(inos[6]).await.unwrap().size, 6);
        assert_eq!(
            src.counts(),
            (stats0 + 1, lists0),
            "{files} files, listings with attributes: {attrs}"
        );
    }
}
