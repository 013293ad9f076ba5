//! The sweep: delete the containers the previous collection condemned
//! that are still unreferenced and unpinned (`collect.rs` decides which),
//! once the protection map condemns them here too.
//!
//! Order per container, each step repeatable: condemn (under the
//! protection lock: from then on no lookup hands it out, and a session
//! holding it keeps it), forget its catalog and its index hints (and its
//! fingerprints from the index's count), delete. Before each batch the
//! collection checks that its epoch is still the newest: one that finds a
//! newer stops, and the newer collection finishes the job.
//! A GC that dies after condemning leaves the container for the next GC,
//! which condemns it again.

use std::collections::HashSet;

use crate::container::container_name;
use crate::error::repo::RepoResult;
use crate::error::Error;
use crate::gc::{GcOptions, GcReport};
use crate::repo::Repository;

/// Deletions between two looks at the newest epoch.
const BATCH: usize = 64;

impl Repository {
    /// Delete `candidates` (but those a backup of this process holds) as
    /// collection `epoch`; false if a newer collection began and this one
    /// stopped.
    pub(super) fn sweep_containers(
        &self,
        candidates: &[u64],
        epoch: u64,
        options: &GcOptions,
        report: &mut GcReport,
    ) -> RepoResult<bool> {
        let condemned = self.protection().condemn(candidates.iter().copied());
        // The fingerprints they store, for the index's count (each
        // catalog from the cache, or read: only the deleted ones are).
        let fingerprints: u64 = condemned
            .iter()
            .filter_map(|&id| self.catalog(id).ok())
            .map(|c| c.entries().iter().filter(|e| !e.is_absent()).count() as u64)
            .sum();
        {
            let mut cache = self.catalog_cache();
            for &id in &condemned {
                cache.forget(id);
            }
        }
        let gone: HashSet<u64> = condemned.iter().copied().collect();
        {
            let mut index = self.index()?;
            index.forget(&gone);
            index.forget_fingerprints(fingerprints);
        }
        let total = condemned.len() as u64;
        for (i, &id) in condemned.iter().enumerate() {
            if i % BATCH == 0 && !self.still_newest(epoch)? {
                return Ok(false);
            }
            let name = container_name(id);
            // The size from the directory or a HEAD, not a read of the
            // container; one already gone is not counted.
            let size = match self.store.size(&name) {
                Ok(size) => size,
                Err(Error::NotFound { .. }) => 0,
                Err(e) => return Err(e.into()),
            };
            if self.delete_if_there(&name)? {
                report.containers_swept += 1;
                report.bytes_reclaimed += size;
            }
            if let Some(p) = options.progress {
                p("sweep", i as u64 + 1, total);
            }
        }
        Ok(true)
    }

    /// Whether no collection after `epoch` has begun.
    pub(super) fn still_newest(&self, epoch: u64) -> RepoResult<bool> {
        Ok(crate::epochs::epochs_after(&*self.store, Some(epoch))?.is_empty())
    }
}
