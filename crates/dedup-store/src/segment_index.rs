//! The seam between a backup and the fingerprint index: "where might a
//! segment with this fingerprint already be?". Deliberately minimal so the
//! paper's sampled index (§3.2, being built in `index/`) can implement it.
//!
//! An answer is only a *hint*: the backup reads the named container's
//! catalog and compares the fingerprint before reusing the segment, so an
//! index that forgets, samples or lies costs dedup, never correctness.

use std::collections::{HashMap, HashSet};

use dedup_core::fingerprint::Fingerprint;

use crate::format::Entry;

pub trait SegmentIndex: Send {
    /// A container and catalog entry that may hold the segment `fp`.
    /// `&mut self`: a sampled index loads catalogs into its cache on a hit.
    fn lookup(&mut self, fp: &Fingerprint) -> Option<(u64, u32)>;

    /// Container `container` is durable and holds `entries` (its catalog,
    /// in order: entry `i` is catalog entry `i`). Called for every container
    /// at open, and for each new one once its `put` has succeeded.
    fn insert(&mut self, container: u64, entries: &[Entry]);

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
}

/// Every fingerprint in RAM: exact, and fine for repositories whose
/// fingerprints fit in memory (about 50 bytes per segment).
#[derive(Default)]
pub struct ExactIndex {
    map: HashMap<Fingerprint, (u64, u32)>,
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

    fn insert(&mut self, container: u64, entries: &[Entry]) {
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
    }

    fn compacted(&mut self, container: u64, entries: &[Entry]) {
        self.forget(&HashSet::from([container]));
        self.insert(container, entries);
    }
}
