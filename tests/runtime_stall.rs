//! Installing a read-ahead plan (`locafs plan`) does not stall the
//! daemon's runtime: the plan's paths are resolved on the blocking pool,
//! so while its lookups wait on the source the runtime's worker threads
//! still run every other task (a FUSE read handed to the runtime, a peer's
//! request, a timer).
//!
//! The daemon's parts (runtime of 2 workers as on a 2-CPU machine,
//! `DiskCache`, `Namespace`, `Reader`, `ReadAhead`) over a source whose
//! calls are held at a gate: two plans are installed at once from tasks on
//! the runtime, as the control socket does, and each is seen waiting in
//! the source. Then a task spawned from outside the runtime, which sleeps
//! on the runtime's timer, must finish; it has 10 s (it takes
//! microseconds; a runtime whose workers resolve the plans would run it
//! only once the source answers, which it does not until the check is
//! over). How late such tasks are while a plan of 100k paths is installed
//! is measured by `cargo bench --bench plan_runtime`.

mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use locafs::source::Source;
use locafs::testing::StallSource;

#[test]
fn installing_a_plan_does_not_stall_the_runtime() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let mut paths = Vec::new();
    for d in 0..4 {
        std::fs::create_dir_all(src.join(format!("d{d}"))).unwrap();
        for f in 0..50 {
            let rel = PathBuf::from(format!("d{d}/f{f:03}.jpg"));
            std::fs::write(src.join(&rel), b"x").unwrap();
            paths.push(rel);
        }
    }
    let paths = Arc::new(paths);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let stall = Arc::new(StallSource::new(&src));
    let ra = common::inproc::read_ahead(
        Arc::clone(&stall) as Arc<dyn Source>,
        &tmp.path().join("cache"),
        &rt,
        2,
    );

    // The source holds every call from now on; two plans, one per worker.
    stall.stall();
    let plans: Vec<_> = (0..2)
        .map(|_| {
            let (ra, paths) = (Arc::clone(&ra), Arc::clone(&paths));
            rt.spawn(async move { ra.set_plan(&paths).await })
        })
        .collect();
    let waiting = common::wait_for(Duration::from_secs(60), || stall.waiting() >= 2);
    // Another task, from outside the runtime, on the runtime's timer.
    let (done, ran) = std::sync::mpsc::channel();
    rt.spawn(async move {
        tokio::time::sleep(Duration::from_millis(1)).await;
        let _ = done.send(());
    });
    let ran = ran.recv_timeout(Duration::from_secs(10));
    // (Resumed before asserting, so that a failure does not leave the
    // runtime's threads blocked in the source.)
    stall.resume();
    assert!(
        waiting,
        "the plans' lookups never reached the source ({} waiting)",
        stall.waiting()
    );
    assert!(
        ran.is_ok(),
        "while two plans' lookups waited on the source, the runtime ran no other task for 10 s"
    );
    for p in plans {
        assert_eq!(rt.block_on(p).unwrap(), (paths.len(), 0));
    }
}
