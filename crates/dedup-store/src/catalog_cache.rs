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
use std::sync::{Arc, Mutex};

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
    let epoch = {
        let mut cache = lock();
        if let Some(c) = cache.get(id) {
            return Ok(c);
        }
        cache.epoch()
    };
    let catalog = match Catalog::read(store, id) {
        // A compaction replacing the container between the two ranged
        // reads of a catalog (or between its two names) looks like
        // damage or absence: read once more before saying so.
        Err(Error::Corrupt { .. } | Error::NotFound { .. }) => Catalog::read(store, id)?,
        other => other?,
    };
    let catalog = Arc::new(catalog);
    lock().insert_read(id, catalog.clone(), epoch);
    Ok(catalog)
}

pub(crate) struct CatalogCache {
    capacity: usize,
    tick: u64,
    map: HashMap<u64, (Arc<Catalog>, u64)>,
    epoch: u64,
    /// Made at the first catalog let go; `Err` if it could not be (then
    /// nothing is spilled).
    spill: Option<std::result::Result<CatalogSpill, ()>>,
}

impl CatalogCache {
    pub(crate) fn new(capacity: usize) -> CatalogCache {
        CatalogCache {
            capacity: capacity.max(1),
            tick: 0,
            map: HashMap::new(),
            epoch: 0,
            spill: None,
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
