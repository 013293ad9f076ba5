//! What opening a repository to write lists: only the containers its index
//! checkpoint does not cover (in a bucket, a listing of every container
//! costs a request per 1,000 of them).

use std::sync::{Arc, Mutex};

use dedup_common::testdata::noise;
use dedup_store::index::IndexConfig;
use dedup_store::{ObjectStore, RepoOptions, Repository, Result, Segmenting};

/// Records how many container names each listing returned.
struct Listings {
    inner: Arc<dyn ObjectStore>,
    containers_listed: Mutex<Vec<usize>>,
}

impl Listings {
    fn note(&self, prefix: &str, names: &Result<Vec<String>>) {
        if let (true, Ok(names)) = (prefix.starts_with("containers"), names) {
            self.containers_listed.lock().unwrap().push(names.len());
        }
    }
}

impl ObjectStore for Listings {
    fn put(&self, name: &str, bytes: &[u8]) -> Result<()> {
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
        let names = self.inner.list(prefix);
        self.note(prefix, &names);
        names
    }
    fn list_after(&self, prefix: &str, after: &str) -> Result<Vec<String>> {
        let names = self.inner.list_after(prefix, after);
        self.note(prefix, &names);
        names
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

fn open_counting(dir: &std::path::Path) -> (Repository, Arc<Listings>) {
    let mut slot = None;
    let repo = Repository::open_sampled_wrapped(dir, IndexConfig::default(), |s| {
        let l = Arc::new(Listings {
            inner: s,
            containers_listed: Mutex::new(Vec::new()),
        });
        slot = Some(l.clone());
        l
    })
    .unwrap();
    (repo, slot.unwrap())
}

#[test]
fn an_open_from_a_checkpoint_lists_only_the_containers_sealed_after_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("r");
    let options = RepoOptions {
        segmenting: Segmenting::DEFAULT,
        container_target: 16 << 10,
        ..RepoOptions::default()
    };
    drop(Repository::init_with(&dir, options).unwrap());
    let repo = Repository::open_sampled(&dir, IndexConfig::default()).unwrap();
    repo.backup_stream("a", "g", &noise(1, 400 << 10)[..])
        .unwrap();
    let sealed = repo.backup("a").unwrap().report.containers_written;
    assert!(sealed >= 10, "{sealed} containers");
    drop(repo); // leaves a checkpoint covering them

    let (repo, listings) = open_counting(&dir);
    assert_eq!(
        *listings.containers_listed.lock().unwrap(),
        [0],
        "an open from a checkpoint that covers every container lists none"
    );
    // One more backup: its containers are past the checkpoint it leaves
    // at close, and a new one seals after that.
    repo.backup_stream("b", "g", &noise(2, 100 << 10)[..])
        .unwrap();
    drop(repo);
    let (repo, listings) = open_counting(&dir);
    assert_eq!(*listings.containers_listed.lock().unwrap(), [0]);
    // Data is still found: b again is all duplicate.
    let again = repo
        .backup_stream("b2", "g", &noise(2, 100 << 10)[..])
        .unwrap();
    assert_eq!(again.bytes_new, 0, "{again:?}");
}
