//! [`SampledSegmentIndex`]: the sampled [`Index`] behind the repository's
//! [`SegmentIndex`] seam, prefetching catalogs through the repository's
//! catalog cache (or, on its own, from an [`ObjectStore`]).
//!
//! It answers with a (container, entry) pair only when it knows the entry:
//! from the fingerprint cache, or from the catalog of the container a hook
//! named (the one just prefetched, or one read for the purpose when the
//! cache is off or has dropped the entry). A hook alone names a container,
//! never an entry, so it is never turned into a guess. Every answer is still
//! checked against the catalog by the backup (see `index/seam.rs`).

use std::sync::Arc;

use dedup_common::fingerprint::Fingerprint;

use crate::container::Catalog;
use crate::error::Result;
use crate::format::Entry;
use crate::index::seam::{CatalogLoader, IndexRam, SegmentIndex};
use crate::objects::ObjectStore;

use super::{Index, IndexConfig};

pub struct SampledSegmentIndex {
    index: Index,
    store: Arc<dyn ObjectStore>,
    /// The repository's catalog cache, once given (`read_catalogs_through`).
    load: Option<CatalogLoader>,
    /// Hook hits the cache could not resolve and that were resolved (or
    /// refused) by reading the container's catalog.
    catalog_reads: u64,
}

impl SampledSegmentIndex {
    /// An empty index reading catalogs from `store` (for a repository's
    /// index, its `object_store()`). Give it the catalogs with
    /// [`SegmentIndex::insert`] (as `Repository::open_with_index` and
    /// `Repository::set_index` do), in container id order.
    pub fn new(store: Arc<dyn ObjectStore>, config: IndexConfig) -> SampledSegmentIndex {
        SampledSegmentIndex {
            index: Index::new(config),
            store,
            load: None,
            catalog_reads: 0,
        }
    }

    /// An index of every container already in `store`, for use on its own.
    /// Not for `Repository::open_with_index` or `set_index`, which insert
    /// every catalog again: hand those [`SampledSegmentIndex::new`] instead.
    pub fn rebuild(
        store: Arc<dyn ObjectStore>,
        config: IndexConfig,
    ) -> Result<SampledSegmentIndex> {
        let index = Index::rebuild(&*store, config)?;
        Ok(SampledSegmentIndex {
            index,
            store,
            load: None,
            catalog_reads: 0,
        })
    }

    /// An index starting from checkpoint `bytes` (see
    /// [`Index::from_checkpoint`]), reading catalogs from `store`.
    pub fn from_checkpoint(
        store: Arc<dyn ObjectStore>,
        bytes: &[u8],
        config: IndexConfig,
    ) -> Result<SampledSegmentIndex> {
        Ok(SampledSegmentIndex {
            index: Index::from_checkpoint(bytes, config)?,
            store,
            load: None,
            catalog_reads: 0,
        })
    }

    pub fn index(&self) -> &Index {
        &self.index
    }

    /// Catalogs read outside a prefetch to resolve a hook's entry.
    pub fn catalog_reads(&self) -> u64 {
        self.catalog_reads
    }

    fn read_catalog(&self, id: u64) -> Result<Vec<Entry>> {
        read_entries(&self.store, self.load.as_ref(), id)
    }
}

/// Container `id`'s catalog entries, through `load` if given.
fn read_entries(
    store: &Arc<dyn ObjectStore>,
    load: Option<&CatalogLoader>,
    id: u64,
) -> Result<Vec<Entry>> {
    match load {
        Some(load) => Ok(load(id)?.entries().to_vec()),
        None => Ok(Catalog::read(&**store, id)?.entries().to_vec()),
    }
}

/// Where `fp` is in `entries`, if it is there.
fn position(entries: &[Entry], fp: &Fingerprint) -> Option<u32> {
    entries
        .iter()
        .position(|e| e.fingerprint == *fp && !e.is_absent())
        .and_then(|i| u32::try_from(i).ok())
}

impl SegmentIndex for SampledSegmentIndex {
    fn lookup(&mut self, fp: &Fingerprint) -> Option<(u64, u32)> {
        let mut prefetched: Option<(u64, Vec<Entry>)> = None;
        let (store, load) = (&self.store, self.load.as_ref());
        let advice = self
            .index
            .lookup(fp, |id| {
                let entries = read_entries(store, load, id)?;
                prefetched = Some((id, entries.clone()));
                Ok(entries)
            })
            // A catalog that cannot be read costs dedup, not correctness.
            .ok()??;
        if let Some(entry) = advice.entry {
            return Some((advice.container, entry));
        }
        // A hook without a cached entry: find the entry in the container's
        // catalog, or give no answer.
        let entry = match prefetched {
            Some((id, entries)) if id == advice.container => position(&entries, fp),
            _ => {
                self.catalog_reads += 1;
                position(&self.read_catalog(advice.container).ok()?, fp)
            }
        }?;
        Some((advice.container, entry))
    }

    fn read_catalogs_through(&mut self, load: CatalogLoader) {
        self.load = Some(load);
    }

    fn insert(&mut self, container: u64, entries: &[Entry]) {
        let fps: Vec<Fingerprint> = entries
            .iter()
            .filter(|e| !e.is_absent())
            .map(|e| e.fingerprint)
            .collect();
        self.index.insert(container, &fps);
    }

    fn checkpoint(&self) -> Option<Vec<u8>> {
        Some(self.index.checkpoint())
    }

    fn forget(&mut self, containers: &std::collections::HashSet<u64>) {
        self.index.forget(containers);
    }

    fn forget_fingerprints(&mut self, n: u64) {
        self.index.forget_fingerprints(n);
    }

    fn compacted(&mut self, container: u64, entries: &[Entry]) {
        let present: Vec<Fingerprint> = entries
            .iter()
            .filter(|e| !e.is_absent())
            .map(|e| e.fingerprint)
            .collect();
        self.index.compacted(container, &present);
    }

    fn ram(&self) -> IndexRam {
        let f = self.index.figures();
        IndexRam {
            bytes: f.hook_bytes,
            cache_bytes: f.cache_bytes,
            fingerprints: f.fingerprints,
            budget: Some(f.index_memory),
        }
    }
}
