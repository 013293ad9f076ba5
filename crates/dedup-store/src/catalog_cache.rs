//! The catalogs a repository handle keeps, least recently used out. The
//! repository used to keep every catalog it read, which is a store's whole
//! fingerprint list in RAM (about 60 bytes a segment); a fixed number of
//! catalogs keeps a backup's confirmations and a restore's reads cheap
//! while memory stays independent of the store's size. Catalogs are
//! immutable but for compaction, which rewrites a container in place
//! (same id, dead entries removed): GC calls `forget` after compacting or
//! deleting one, and a reader that read a catalog before that `forget`
//! must not put it back, or a backup could confirm a removed entry
//! against it. So every `forget` starts a new epoch, and a catalog read in
//! an older epoch is not cached (`insert_read`).
//!
//! A catalog let go is kept on local disk (`catalog_spill.rs`) and comes
//! back from there instead of the repository; `forget` forgets it there
//! too.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use crate::catalog_spill::CatalogSpill;
use crate::container::Catalog;
use crate::error::{Error, Result};
use crate::objects::ObjectStore;

/// Catalogs kept by default: 16 catalogs of full containers (16 MiB of
/// compressed segments, some 8,000 segments of 4 KiB at zstd's ratio on
/// binaries, 88 bytes each decoded) is about 12 MiB. 64 of them held
/// 40-47 MB of the peak of a backup of `/usr/share` and `/usr/lib`; a
/// backup reads its duplicates' containers in stream order, so it asks
/// for few containers at a time.
pub const DEFAULT_CATALOGS: usize = 16;

/// Container `id`'s catalog, from `cache` or read from `store` (without
/// holding the cache's lock over the read) and kept.
pub(crate) fn cached_catalog(
    store: &dyn ObjectStore,
    cache: &Mutex<CatalogCache>,
    id: u64,
) -> Result<Arc<Catalog>> {
    let lock = || cache.lock().unwrap_or_else(|p| p.into_inner());
    let (epoch, load) = {
        let mut cache = lock();
        if let Some(c) = cache.get(id) {
            return Ok(c);
        }
        (cache.epoch(), cache.load_of(id))
    };
    // One read however many threads want it at once (a restore's runs of
    // one container start together): the others wait for it.
    let mut failed = None;
    let got = load
        .get_or_init(|| match read(store, id) {
            Ok(c) => Some(Arc::new(c)),
            Err(e) => {
                failed = Some(e);
                None
            }
        })
        .clone();
    {
        let mut cache = lock();
        cache.loaded(id, &load);
        if let Some(c) = &got {
            cache.insert_read(id, c.clone(), epoch);
        }
    }
    match (got, failed) {
        (Some(c), _) => Ok(c),
        (None, Some(e)) => Err(e),
        // The read this one waited for failed: its own says why.
        (None, None) => read(store, id).map(Arc::new),
    }
}

/// Container `id`'s catalog from `store`.
fn read(store: &dyn ObjectStore, id: u64) -> Result<Catalog> {
    match Catalog::read(store, id) {
        // A compaction replacing the container between the two ranged
        // reads of a catalog (or between its two names) looks like
        // damage or absence: read once more before saying so.
        Err(Error::Corrupt { .. } | Error::NotFound { .. }) => Catalog::read(store, id),
        other => other,
    }
}

/// A catalog's read under way: its result once done (`None`: it failed).
type Load = Arc<OnceLock<Option<Arc<Catalog>>>>;

pub(crate) struct CatalogCache {
    capacity: usize,
    tick: u64,
    map: HashMap<u64, (Arc<Catalog>, u64)>,
    epoch: u64,
    /// Made at the first catalog let go; `Err` if it could not be (then
    /// nothing is spilled).
    spill: Option<std::result::Result<CatalogSpill, ()>>,
    /// Reads under way, each with the epoch it began in: a reader joins
    /// one only in the same epoch (one begun before a `forget` may bring
    /// back what was forgotten).
    loading: HashMap<u64, (u64, Load)>,
}

impl CatalogCache {
    pub(crate) fn new(capacity: usize) -> CatalogCache {
        CatalogCache {
            capacity: capacity.max(1),
            tick: 0,
            map: HashMap::new(),
            epoch: 0,
            spill: None,
            loading: HashMap::new(),
        }
    }

    /// The read of `id`'s catalog under way in this epoch, or a new one.
    fn load_of(&mut self, id: u64) -> Load {
        let epoch = self.epoch;
        match self.loading.get(&id) {
            Some((e, load)) if *e == epoch => load.clone(),
            _ => {
                let load = Load::default();
                self.loading.insert(id, (epoch, load.clone()));
                load
            }
        }
    }

    /// `load` is done: later readers read again unless it was cached.
    fn loaded(&mut self, id: u64, load: &Load) {
        if self
            .loading
            .get(&id)
            .is_some_and(|(_, l)| Arc::ptr_eq(l, load))
        {
            self.loading.remove(&id);
        }
    }

    pub(crate) fn get(&mut self, id: u64) -> Option<Arc<Catalog>> {
        self.tick += 1;
        let tick = self.tick;
        if let Some((c, used)) = self.map.get_mut(&id) {
            *used = tick;
            return Some(c.clone());
        }
        let spilled = Arc::new(self.spill.as_mut()?.as_mut().ok()?.get(id)?);
        self.keep(id, spilled.clone());
        Some(spilled)
    }

    /// Cache `catalog`, which supersedes any spilled one of `id` (a
    /// compaction's).
    pub(crate) fn insert(&mut self, id: u64, catalog: Arc<Catalog>) {
        if let Some(Ok(spill)) = &mut self.spill {
            spill.forget(id);
        }
        self.keep(id, catalog);
    }

    /// Keep `catalog` in memory, the least recently used one out to disk.
    fn keep(&mut self, id: u64, catalog: Arc<Catalog>) {
        self.tick += 1;
        if !self.map.contains_key(&id) && self.map.len() >= self.capacity {
            // O(capacity), and the capacity is small.
            let oldest = self.map.iter().min_by_key(|(_, (_, used))| *used);
            if let Some(&id) = oldest.map(|(id, _)| id) {
                if let Some((catalog, _)) = self.map.remove(&id) {
                    self.spill(&catalog);
                }
            }
        }
        self.map.insert(id, (catalog, self.tick));
    }

    /// Keep `catalog`, let go from memory, on local disk (once: a spilled
    /// record stays what the memory held until `insert` or `forget`).
    fn spill(&mut self, catalog: &Catalog) {
        let spill = self
            .spill
            .get_or_insert_with(|| CatalogSpill::new().ok_or(()));
        if let Ok(spill) = spill {
            if !spill.contains(catalog.container_id()) {
                spill.put(catalog);
            }
        }
    }

    pub(crate) fn forget(&mut self, id: u64) {
        self.map.remove(&id);
        if let Some(Ok(spill)) = &mut self.spill {
            spill.forget(id);
        }
        self.epoch += 1;
    }

    /// Forget every catalog (a process that missed collections must read
    /// them again: a read finds a deleted container gone).
    pub(crate) fn forget_all(&mut self) {
        self.map.clear();
        if let Some(Ok(spill)) = &mut self.spill {
            spill.clear();
        }
        self.epoch += 1;
    }

    /// The current epoch, to be given to `insert_read` with a catalog read
    /// after this call.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Cache `catalog`, read after `epoch()` returned `epoch`, unless a
    /// container was forgotten since (it may be this one's old version).
    pub(crate) fn insert_read(&mut self, id: u64, catalog: Arc<Catalog>, epoch: u64) {
        if epoch == self.epoch {
            self.insert(id, catalog);
        }
    }

    #[allow(dead_code)] // for garbage collection, which lands next
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn catalog(id: u64) -> Arc<Catalog> {
        catalog_of(id, 1)
    }

    fn catalog_of(id: u64, segments: u64) -> Arc<Catalog> {
        Arc::new(crate::catalog_spill::test_catalog(id, segments))
    }

    #[test]
    fn the_least_recently_used_catalog_goes_first_to_disk() {
        let mut cache = CatalogCache::new(2);
        cache.insert(1, catalog(1));
        cache.insert(2, catalog(2));
        assert!(cache.get(1).is_some());
        cache.insert(3, catalog(3));
        assert!(!cache.map.contains_key(&2), "2 was the least recently used");
        assert!(cache.get(1).is_some() && cache.get(3).is_some());
        // Back from the spill file, into memory (and 1 out to disk).
        assert_eq!(cache.get(2).unwrap().container_id(), 2);
        assert!(cache.map.contains_key(&2) && !cache.map.contains_key(&1));
        let before = cache.epoch();
        cache.forget(1);
        assert!(cache.get(1).is_none(), "forgotten in memory and on disk");
        assert_eq!(cache.len(), 2);
        // A catalog read before a forget is not cached after it.
        cache.insert_read(4, catalog(4), before);
        assert!(cache.get(4).is_none());
        cache.insert_read(4, catalog(4), cache.epoch());
        assert!(cache.get(4).is_some());
        cache.forget_all();
        assert!((1..=4).all(|id| cache.get(id).is_none()));
    }

    /// Reads of one catalog at once are one read; a `forget` starts
    /// another, which readers after it join.
    #[test]
    fn readers_of_one_catalog_at_once_read_it_once() {
        let tmp = tempfile::tempdir().unwrap();
        let repo = crate::repo::Repository::init(tmp.path()).unwrap();
        repo.backup_stream("b", "g", &dedup_common::testdata::noise(1, 1 << 20)[..])
            .unwrap();
        let store = Slow {
            inner: crate::local::LocalDir::open(tmp.path()).unwrap(),
            reads: Default::default(),
        };
        let reads = || store.reads.swap(0, std::sync::atomic::Ordering::SeqCst);
        let alone = {
            let cache = Mutex::new(CatalogCache::new(4));
            cached_catalog(&store, &cache, 0).unwrap();
            reads()
        };
        assert!(alone > 0);
        let cache = Mutex::new(CatalogCache::new(4));
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| cached_catalog(&store, &cache, 0).unwrap());
            }
        });
        assert_eq!(reads(), alone, "eight readers at once");
        let mut c = cache.lock().unwrap();
        let load = c.load_of(0);
        assert!(Arc::ptr_eq(&load, &c.load_of(0)), "joined");
        c.forget(0);
        let after = c.load_of(0);
        assert!(!Arc::ptr_eq(&load, &after), "a forget starts another");
        c.loaded(0, &load);
        assert!(
            Arc::ptr_eq(&after, &c.load_of(0)),
            "the old one's end leaves it"
        );
        c.loaded(0, &after);
        assert!(c.loading.is_empty());
    }

    /// A directory whose reads take a while and are counted.
    struct Slow {
        inner: crate::local::LocalDir,
        reads: std::sync::atomic::AtomicUsize,
    }

    impl Slow {
        fn read(&self) {
            self.reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    impl ObjectStore for Slow {
        fn put(&self, name: &str, bytes: &[u8]) -> Result<()> {
            self.inner.put(name, bytes)
        }
        fn get(&self, name: &str) -> Result<Vec<u8>> {
            self.read();
            self.inner.get(name)
        }
        fn get_range(&self, name: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
            self.read();
            self.inner.get_range(name, offset, len)
        }
        fn get_tail(&self, name: &str, len: u64) -> Result<Vec<u8>> {
            self.read();
            self.inner.get_tail(name, len)
        }
        fn get_upto(&self, name: &str, offset: u64, len: u64) -> Result<(Vec<u8>, u64)> {
            self.read();
            self.inner.get_upto(name, offset, len)
        }
        fn get_tail_sized(&self, name: &str, len: u64) -> Result<(Vec<u8>, u64)> {
            self.read();
            self.inner.get_tail_sized(name, len)
        }
        fn list(&self, prefix: &str) -> Result<Vec<String>> {
            self.inner.list(prefix)
        }
        fn size(&self, name: &str) -> Result<u64> {
            self.inner.size(name)
        }
        fn segment_hash(&self) -> crate::segment_hash::SegmentHash {
            self.inner.segment_hash()
        }
        fn delete(&self, name: &str) -> Result<()> {
            self.inner.delete(name)
        }
    }

    #[test]
    fn an_inserted_catalog_supersedes_the_spilled_one() {
        let mut cache = CatalogCache::new(1);
        cache.insert(1, catalog(1));
        cache.insert(2, catalog(2)); // 1 spilled
        let newer = catalog_of(1, 3); // a compaction's, say; 2 spilled
        cache.insert(1, newer.clone());
        cache.insert(3, catalog(3)); // 1 spilled again: the newer one
        assert_eq!(cache.get(1).unwrap().entries(), newer.entries());
    }
}
