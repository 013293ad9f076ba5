//! Backups running on one repository handle reuse segments of each
//! other's containers before those are durable (`inflight.rs`): a backup
//! that commits with such a reference makes the container durable first,
//! sealing it itself if its owner is idle; an owner that gives up writes a
//! container another backup reuses, and drops one nobody does; a lost put
//! fails every backup that needs it.

use crate::gc_support;

use std::collections::BTreeMap;
use std::sync::mpsc;
use std::time::Duration;

use dedup_store::{BackupSession, CheckOptions, RepoOptions, Repository, Segmenting};
use gc_support::{check_backups, objects, open_faulty};
use rand::{rngs::StdRng, RngCore, SeedableRng};

fn random(n: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; n];
    StdRng::seed_from_u64(seed).fill_bytes(&mut v);
    v
}

/// Fixed 4 KiB segments in 64 KiB containers, so 32 KiB of random data
/// leaves its container open.
fn options() -> RepoOptions {
    RepoOptions {
        segmenting: Segmenting::DEFAULT,
        container_target: 64 << 10,
        ..RepoOptions::default()
    }
}

fn repo() -> (tempfile::TempDir, Repository) {
    let tmp = tempfile::tempdir().unwrap();
    let repo = Repository::init_with(tmp.path(), options()).unwrap();
    (tmp, repo)
}

fn append(s: &mut BackupSession<'_>, data: &[u8]) {
    for seg in data.chunks(4096) {
        s.append(seg).unwrap();
    }
}

/// A wait that never ends: the scope around it would wait for the stuck
/// thread too, so a panic would hang the test instead of failing it.
fn hung(what: &str) -> ! {
    eprintln!("{what} waited for ever");
    std::process::abort()
}

/// Backups "a" and "b" given the same 32 KiB (random from `seed`), a first:
/// b's segments are all in a's open container.
fn sharing(repo: &Repository, seed: u64) -> (BackupSession<'_>, BackupSession<'_>, Vec<u8>) {
    let shared = random(32 << 10, seed);
    let mut a = repo.begin_backup("a", "g").unwrap();
    let mut b = repo.begin_backup("b", "g").unwrap();
    append(&mut a, &shared);
    append(&mut b, &shared);
    (a, b, shared)
}

fn is_clean(repo: &Repository) {
    let r = repo.check(CheckOptions { data: true }, &|_| {}).unwrap();
    assert!(r.is_clean(), "{r:#?}");
}

#[test]
fn a_backup_reuses_another_s_open_container_and_seals_it_to_commit() {
    let (tmp, repo) = repo();
    let (mut a, b, shared) = sharing(&repo, 1);
    assert_eq!(b.report().segments_duplicate, 8, "{:?}", b.report());
    assert!(
        objects(tmp.path(), "containers/").is_empty(),
        "nothing sealed yet"
    );
    // `a` is idle, its container open: b's commit seals and puts it.
    let rb = b.commit().unwrap();
    assert_eq!((rb.report.bytes_new, rb.report.containers_written), (0, 0));
    assert_eq!(objects(tmp.path(), "containers/").len(), 1);
    // `a` goes on in a new container, and counts both as written.
    let more = random(16 << 10, 2);
    append(&mut a, &more);
    let ra = a.commit().unwrap();
    assert_eq!(ra.report.containers_written, 2, "{:?}", ra.report);
    assert_eq!(objects(tmp.path(), "containers/").len(), 2);
    let model = BTreeMap::from([
        ("a".to_string(), [&shared[..], &more[..]].concat()),
        ("b".to_string(), shared),
    ]);
    check_backups(&repo, &model);
    is_clean(&repo);
}

#[test]
fn a_given_up_container_another_backup_reuses_is_written_for_it() {
    let (tmp, repo) = repo();
    let (a, b, shared) = sharing(&repo, 3);
    drop(a);
    assert_eq!(objects(tmp.path(), "containers/").len(), 1, "written for b");
    b.commit().unwrap();
    let model = BTreeMap::from([("b".to_string(), shared)]);
    check_backups(&repo, &model);
    is_clean(&repo);
    // The collector keeps it: b references it.
    repo.gc(&Default::default()).unwrap();
    check_backups(&repo, &model);
    is_clean(&repo);
}

#[test]
fn a_given_up_container_nobody_reuses_is_never_written() {
    let (tmp, repo) = repo();
    let data = random(32 << 10, 4);
    let mut a = repo.begin_backup("a", "g").unwrap();
    append(&mut a, &data);
    drop(a);
    assert!(objects(tmp.path(), "containers/").is_empty());
    let mut b = repo.begin_backup("b", "g").unwrap();
    append(&mut b, &data);
    assert_eq!(b.report().segments_new, 8, "a's segments are gone");
    b.commit().unwrap();
    check_backups(&repo, &BTreeMap::from([("b".to_string(), data)]));
}

/// b reuses a's open container, then gives up; a gives up too: nobody needs
/// the container any more, and it is not written.
#[test]
fn a_container_whose_only_reuser_gave_up_is_not_written() {
    let (tmp, repo) = repo();
    let (a, b, _) = sharing(&repo, 5);
    assert_eq!(b.report().segments_duplicate, 8, "b reuses a's segments");
    drop(b);
    drop(a);
    assert!(objects(tmp.path(), "containers/").is_empty());
    is_clean(&repo);
}

/// Each reuses the other's open container, then both commit at once: each
/// may seal the other's container, and neither waits for ever.
#[test]
fn two_backups_reusing_each_other_s_open_containers_both_commit() {
    for seed in 0..20u64 {
        let (_tmp, repo) = repo();
        let (x, y) = (random(24 << 10, 10 + seed), random(24 << 10, 50 + seed));
        let mut a = repo.begin_backup("a", "g").unwrap();
        let mut b = repo.begin_backup("b", "g").unwrap();
        append(&mut a, &x);
        append(&mut b, &y);
        append(&mut a, &y);
        append(&mut b, &x);
        assert_eq!(a.report().segments_duplicate, 6);
        assert_eq!(b.report().segments_duplicate, 6);
        let (done, finished) = mpsc::channel();
        std::thread::scope(|s| {
            for session in [a, b] {
                let done = done.clone();
                s.spawn(move || done.send(session.commit().map(|_| ())).unwrap());
            }
            for _ in 0..2 {
                let r = finished
                    .recv_timeout(Duration::from_secs(30))
                    .unwrap_or_else(|_| hung("a commit"));
                r.unwrap();
            }
        });
        let model = BTreeMap::from([
            ("a".to_string(), [&x[..], &y[..]].concat()),
            ("b".to_string(), [&y[..], &x[..]].concat()),
        ]);
        check_backups(&repo, &model);
        is_clean(&repo);
    }
}

/// The put of a container another backup sealed fails: that backup fails,
/// and so does the owner's (its segments are not stored), and nothing is
/// committed that references the lost container.
#[test]
fn a_lost_container_fails_every_backup_that_needs_it() {
    let (tmp, repo) = repo();
    drop(repo);
    let (repo, faulty) = open_faulty(tmp.path());
    let (a, b, shared) = sharing(&repo, 5);
    faulty.fail_puts_under("containers/");
    let e = b.commit().unwrap_err().to_string();
    assert!(e.contains("crashed"), "{e}");
    faulty.allow_puts();
    let e = a.commit().unwrap_err().to_string();
    assert!(e.contains("holds segments of this backup"), "{e}");
    assert!(repo.list_backups().unwrap().is_empty());
    // Later backups store the data afresh.
    let mut c = repo.begin_backup("c", "g").unwrap();
    append(&mut c, &shared);
    assert_eq!(c.report().segments_new, 8);
    c.commit().unwrap();
    check_backups(&repo, &BTreeMap::from([("c".to_string(), shared)]));
}

/// Model: threads run backups that share blocks (so they reuse each
/// other's open containers), give up a quarter of them at random, and a
/// collector runs beside them all along. Every committed backup restores
/// byte-exact, during and after, the repository checks clean, and a last
/// collection leaves them whole.
#[test]
fn sharing_backups_commit_or_give_up_at_random_beside_a_collector() {
    use rand::Rng;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    for seed in 0..8u64 {
        let (tmp, repo) = repo();
        let repo = Arc::new(repo);
        let pool: Arc<Vec<Vec<u8>>> =
            Arc::new((0..12).map(|i| random(16 << 10, 1000 * seed + i)).collect());
        let done = Arc::new(AtomicBool::new(false));
        let collector = {
            let (repo, done) = (repo.clone(), done.clone());
            std::thread::spawn(move || {
                while !done.load(Ordering::SeqCst) {
                    repo.gc(&Default::default()).unwrap();
                }
            })
        };
        let threads: Vec<_> = (0..6u64)
            .map(|t| {
                let (repo, pool) = (repo.clone(), pool.clone());
                std::thread::spawn(move || {
                    let mut rng = StdRng::seed_from_u64(seed * 100 + t);
                    let mut kept = Vec::new();
                    for b in 0..4 {
                        let name = format!("s{seed}-t{t}-b{b}");
                        let mut s = repo.begin_backup(&name, &format!("g{t}")).unwrap();
                        let mut data = Vec::new();
                        for _ in 0..rng.random_range(2..8) {
                            let piece = if rng.random_bool(0.7) {
                                pool[rng.random_range(0..pool.len())].clone()
                            } else {
                                random(4096 * rng.random_range(1..4), rng.random())
                            };
                            append(&mut s, &piece);
                            data.extend_from_slice(&piece);
                            std::thread::yield_now();
                        }
                        if rng.random_bool(0.25) {
                            drop(s);
                        } else {
                            s.commit().unwrap();
                            kept.push((name, data));
                        }
                    }
                    kept
                })
            })
            .collect();
        let mut model = BTreeMap::new();
        for t in threads {
            model.extend(t.join().unwrap());
        }
        done.store(true, Ordering::SeqCst);
        collector.join().unwrap();
        check_backups(&repo, &model);
        is_clean(&repo);
        repo.gc(&Default::default()).unwrap();
        check_backups(&repo, &model);
        is_clean(&repo);
        drop(repo);
        check_backups(&Repository::open(tmp.path()).unwrap(), &model);
    }
}

/// Puts that panic (a bug in a store, say).
struct PanicOnPut {
    inner: std::sync::Arc<dyn dedup_store::ObjectStore>,
    on: std::sync::atomic::AtomicBool,
}

impl dedup_store::ObjectStore for PanicOnPut {
    fn put(&self, name: &str, bytes: &[u8]) -> dedup_store::Result<()> {
        if self.on.load(std::sync::atomic::Ordering::SeqCst) && name.starts_with("containers/") {
            panic!("simulated bug putting {name}");
        }
        self.inner.put(name, bytes)
    }
    fn get(&self, name: &str) -> dedup_store::Result<Vec<u8>> {
        self.inner.get(name)
    }
    fn get_range(&self, name: &str, offset: u64, len: u64) -> dedup_store::Result<Vec<u8>> {
        self.inner.get_range(name, offset, len)
    }
    fn get_tail(&self, name: &str, len: u64) -> dedup_store::Result<Vec<u8>> {
        self.inner.get_tail(name, len)
    }
    fn list(&self, prefix: &str) -> dedup_store::Result<Vec<String>> {
        self.inner.list(prefix)
    }
    fn size(&self, name: &str) -> dedup_store::Result<u64> {
        self.inner.size(name)
    }
    fn delete(&self, name: &str) -> dedup_store::Result<()> {
        self.inner.delete(name)
    }
    fn segment_hash(&self) -> dedup_store::segment_hash::SegmentHash {
        self.inner.segment_hash()
    }
}

/// The owner's put of a container another backup reuses panics: that
/// backup's commit fails, it does not wait for ever, and so does the
/// owner's.
#[test]
fn a_put_that_panics_fails_the_backups_that_wait_for_it() {
    use std::sync::atomic::Ordering;
    use std::sync::Arc;
    let (tmp, repo) = repo();
    drop(repo);
    let mut store = None;
    let repo = Repository::open_wrapped(tmp.path(), |inner| {
        let s = Arc::new(PanicOnPut {
            inner,
            on: false.into(),
        });
        store = Some(s.clone());
        s
    })
    .unwrap();
    let store = store.unwrap();
    let (mut a, b, _) = sharing(&repo, 6);
    store.on.store(true, Ordering::SeqCst);
    // a fills its container: sealed, put on a thread that panics.
    append(&mut a, &random(48 << 10, 7));
    let (done, finished) = mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(move || {
            done.send(b.commit().map(|_| ()).map_err(|e| e.to_string()))
                .unwrap()
        });
        let r = finished
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| hung("b's commit"));
        let e = r.unwrap_err();
        assert!(e.contains("panicked"), "{e}");
    });
    store.on.store(false, Ordering::SeqCst);
    let e = a.commit().unwrap_err().to_string();
    assert!(e.contains("panicked"), "{e}");
    assert!(repo.list_backups().unwrap().is_empty());
}
