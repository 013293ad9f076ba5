//! The seam between a backup and the fingerprint index: "where might a
//! segment with this fingerprint already be?". Deliberately minimal so the
//! paper's sampled index (§3.2, `sampled.rs` beside it) can implement it;
//! `ExactIndex` here is the exact one.
//!
//! An answer is only a *hint*: the backup reads the named container's
//! catalog and compares the fingerprint before reusing the segment, so an
//! index that forgets, samples or lies costs dedup, never correctness.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use dedup_common::fingerprint::Fingerprint;

use crate::container::Catalog;
use crate::error::Result;
use crate::format::Entry;

/// Reads container `id`'s catalog the way its repository does: through
/// its catalog cache (memory, then local disk), so that an index's
/// prefetch and the backup's confirmation after it read it once.
pub type CatalogLoader = Arc<dyn Fn(u64) -> Result<Arc<Catalog>> + Send + Sync>;

pub trait SegmentIndex: Send {
    /// A container and catalog entry that may hold the segment `fp`.
    /// `&mut self`: a sampled index loads catalogs into its cache on a hit.
    fn lookup(&mut self, fp: &Fingerprint) -> Option<(u64, u32)>;

    /// Container `container` is durable and holds `entries` (its catalog,
    /// in order: entry `i` is catalog entry `i`). Called for every container
    /// at open, and for each new one once its `put` has succeeded.
    fn insert(&mut self, container: u64, entries: &[Entry]);

    /// The index as bytes a later open can start from instead of reading
    /// every catalog (see `index/checkpoint_objects.rs`); `None` if it has no such
    /// form (an exact index is rebuilt from the catalogs).
    fn checkpoint(&self) -> Option<Vec<u8>> {
        None
    }

    /// Bytes of RAM the index's own tables take, and the fingerprints it
    /// has been given, for "index RAM per TB stored". Zeros if unknown.
    fn ram(&self) -> IndexRam {
        IndexRam::default()
    }

    /// Read catalogs through `load` from now on instead of from the
    /// object store directly (the repository hands it its catalog cache
    /// at open). The default reads none.
    fn read_catalogs_through(&mut self, _load: CatalogLoader) {}

    /// Garbage collection deleted `containers`: drop hints into them, so a
    /// segment stored again elsewhere is found there. The default keeps
    /// them, which costs dedup only (a hint into a deleted container is
    /// refused by the protection map or the catalog check).
    fn forget(&mut self, _containers: &HashSet<u64>) {}

    /// Garbage collection rewrote `container` with some entries removed
    /// (same numbering; `entries` is the new catalog). The default keeps
    /// the old hints: one to a removed entry is refused by the catalog
    /// check, so it costs dedup only.
    fn compacted(&mut self, _container: u64, _entries: &[Entry]) {}

    /// Garbage collection removed `n` stored fingerprints (containers
    /// deleted, entries compacted away): lower the count the index reports
    /// and checkpoints. The default counts nothing.
    fn forget_fingerprints(&mut self, _n: u64) {}
}

/// What an index costs in RAM, and for how much stored data.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct IndexRam {
    /// Bytes of the tables that grow with the store (the hooks, or the
    /// full map): what "RAM per TB stored" is about.
    pub bytes: u64,
    /// Bytes of fixed-size parts (the prefetch cache), whatever the store.
    pub cache_bytes: u64,
    /// Fingerprints inserted (stored segments), sampled or not.
    pub fingerprints: u64,
    /// The sampled index's budget for `bytes`; `None` for an exact index
    /// (it grows with the store).
    pub budget: Option<u64>,
}

/// Every fingerprint in RAM: exact, and fine for repositories whose
/// fingerprints fit in memory (about 50 bytes per segment).
#[derive(Default)]
pub struct ExactIndex {
    map: HashMap<Fingerprint, (u64, u32)>,
    /// Present (not removed) segments of each live container: what
    /// `ram().fingerprints` sums, so a collection takes them off again.
    segments: HashMap<u64, u64>,
}

impl ExactIndex {
    pub fn new() -> ExactIndex {
        ExactIndex::default()
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

impl SegmentIndex for ExactIndex {
    fn lookup(&mut self, fp: &Fingerprint) -> Option<(u64, u32)> {
        self.map.get(fp).copied()
    }

    fn ram(&self) -> IndexRam {
        // A hashbrown entry: the key, the value and a control byte, at a
        // 7/8 load factor.
        let entry = std::mem::size_of::<(Fingerprint, (u64, u32))>() as u64 + 1;
        IndexRam {
            bytes: self.map.capacity() as u64 * entry,
            cache_bytes: 0,
            fingerprints: self.segments.values().sum(),
            budget: None,
        }
    }

    fn insert(&mut self, container: u64, entries: &[Entry]) {
        let present = entries.iter().filter(|e| !e.is_absent()).count() as u64;
        self.segments.insert(container, present);
        // A segment removed by compaction is no hint.
        for (i, e) in entries.iter().enumerate().filter(|(_, e)| !e.is_absent()) {
            // Keep the first copy: garbage from a crashed backup may repeat
            // a segment, and either copy is as good.
            self.map
                .entry(e.fingerprint)
                .or_insert((container, i as u32));
        }
    }

    fn forget(&mut self, containers: &HashSet<u64>) {
        self.map.retain(|_, (c, _)| !containers.contains(c));
        self.segments.retain(|c, _| !containers.contains(c));
    }

    fn compacted(&mut self, container: u64, entries: &[Entry]) {
        self.forget(&HashSet::from([container]));
        self.insert(container, entries);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::writer::ContainerWriter;

    fn catalog(segments: &[&[u8]]) -> Vec<Entry> {
        let mut w = ContainerWriter::new(1);
        for s in segments {
            w.add(s).unwrap();
        }
        let bytes = w.seal();
        crate::Container::parse("c", bytes)
            .unwrap()
            .catalog()
            .entries()
            .to_vec()
    }

    #[test]
    fn the_exact_index_counts_only_present_segments_of_live_containers() {
        let mut index = ExactIndex::new();
        let entries = catalog(&[b"one", b"two", b"three"]);
        index.insert(1, &entries);
        index.insert(2, &entries[..1]);
        assert_eq!(index.ram().fingerprints, 4);
        // Compaction removes two of container 1's segments.
        let mut compacted = entries.clone();
        compacted[1] = compacted[1].absent_at(0);
        compacted[2] = compacted[2].absent_at(0);
        index.compacted(1, &compacted);
        assert_eq!(index.ram().fingerprints, 2);
        assert_eq!(index.lookup(&entries[1].fingerprint), None);
        index.forget(&HashSet::from([1, 2]));
        assert_eq!(index.ram().fingerprints, 0);
        assert!(index.is_empty());
    }
}
