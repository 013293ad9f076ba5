//! The sweep: delete the containers no group's marks reference, once the
//! protection map condemns them.
//!
//! Order per container, each step repeatable: condemn (under the
//! protection lock: from then on no lookup hands it out, and a session
//! holding it keeps it), forget its catalog and its index hints (and its
//! fingerprints from the index's count), delete.
//! A GC that dies after condemning leaves the container for the next GC,
//! which lists it again; `condemn` returns it again.

use std::collections::{BTreeSet, HashSet};

use crate::container::container_name;
use crate::error::repo::RepoResult;
use crate::error::Error;
use crate::gc::{GcOptions, GcReport};
use crate::repo::Repository;

impl Repository {
    pub(super) fn sweep_containers(
        &self,
        live: &BTreeSet<u64>,
        options: &GcOptions,
        report: &mut GcReport,
    ) -> RepoResult<()> {
        let all = self.store_container_ids()?;
        report.containers = all.len() as u64;
        let candidates: Vec<u64> = all.into_iter().filter(|id| !live.contains(id)).collect();
        let condemned = self.protection().condemn(candidates.iter().copied());
        report.containers_protected = (candidates.len() - condemned.len()) as u64;
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
        Ok(())
    }
}
