//! A sealed container is put by a thread of its own while the backup goes
//! on. These tests hold that put back (or fail it) to check what the
//! session promises meanwhile: it still answers for the segments it sealed
//! (with their length, which a server needs for a remote client's
//! reference), `commit` waits for the put, and a failed put fails the
//! backup and leaves none.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dedup_common::compress::Compression;
use dedup_common::testdata::noise;
use dedup_store::{Error, ObjectStore, RepoOptions, Repository, Result, Segmenting};

/// Container puts wait 200 ms, and fail while `fail` is set.
struct SlowPuts {
    inner: Arc<dyn ObjectStore>,
    fail: AtomicBool,
}

impl ObjectStore for SlowPuts {
    fn put(&self, name: &str, bytes: &[u8]) -> Result<()> {
        if name.starts_with("containers/") {
            std::thread::sleep(Duration::from_millis(200));
            if self.fail.load(Ordering::SeqCst) {
                return Err(Error::io(
                    format!("putting {name}"),
                    std::io::Error::other("the disk is gone"),
                ));
            }
        }
        self.inner.put(name, bytes)
    }
    fn get(&self, name: &str) -> Result<Vec<u8>> {
        self.inner.get(name)
    }
    fn get_range(&self, name: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        self.inner.get_range(name, offset, len)
    }
    fn get_tail(&self, name: &str, len: u64) -> Result<Vec<u8>> {
        self.inner.get_tail(name, len)
    }
    fn list(&self, prefix: &str) -> Result<Vec<String>> {
        self.inner.list(prefix)
    }
    fn size(&self, name: &str) -> Result<u64> {
        self.inner.size(name)
    }
    fn delete(&self, name: &str) -> Result<()> {
        self.inner.delete(name)
    }
    fn segment_hash(&self) -> dedup_store::segment_hash::SegmentHash {
        self.inner.segment_hash()
    }
}

fn repo(fail: bool) -> (tempfile::TempDir, Repository) {
    let tmp = tempfile::tempdir().unwrap();
    let options = RepoOptions {
        segmenting: Segmenting::DEFAULT,
        container_target: 16 << 10,
        compression: Compression::Lz4,
        ..RepoOptions::default()
    };
    drop(Repository::init_with(tmp.path(), options).unwrap());
    let repo = Repository::open_wrapped(tmp.path(), |inner| {
        Arc::new(SlowPuts {
            inner,
            fail: AtomicBool::new(fail),
        })
    })
    .unwrap();
    (tmp, repo)
}

#[test]
fn a_session_answers_for_a_container_whose_put_is_still_running() {
    let (_tmp, repo) = repo(false);
    let data = noise(7, 40 << 10);
    let mut session = repo.begin_backup("b", "g").unwrap();
    let mut stored = Vec::new();
    for segment in data.chunks(4096) {
        stored.push(session.store(segment).unwrap());
        session.append(segment).unwrap();
    }
    // The first containers are sealed; the newest of them is still being
    // put (200 ms), and the index does not know it yet.
    for (&(container, entry, fp), segment) in stored.iter().zip(data.chunks(4096)) {
        let r = session
            .lookup_ref(&fp)
            .unwrap()
            .expect("the session knows it");
        assert_eq!((r.container, r.entry), (container, entry));
        assert_eq!(r.len as usize, segment.len());
    }
    session.commit().unwrap();
    let mut out = Vec::new();
    repo.restore("b", &mut out).unwrap();
    assert!(out == data);
}

#[test]
fn a_failed_container_put_fails_the_backup_and_leaves_none() {
    let (_tmp, repo) = repo(true);
    let data = noise(8, 40 << 10);
    let mut session = repo.begin_backup("b", "g").unwrap();
    let appended = data.chunks(4096).try_for_each(|s| session.append(s));
    // The failure surfaces at the next seal or at the commit.
    let committed = appended.and_then(|()| session.commit().map(|_| ()));
    let e = committed.unwrap_err().to_string();
    assert!(e.contains("the disk is gone"), "{e}");
    assert!(repo.list_backups().unwrap().is_empty());
}
