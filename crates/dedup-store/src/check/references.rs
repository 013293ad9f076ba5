//! Checking what the recipes of committed backups point at: every
//! reference must find an existing container whose catalog entry has the
//! reference's fingerprint and length. Each damaged container or segment
//! learns which backups need it; containers no such recipe references are
//! garbage.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::catalog_cache::CatalogCache;
use crate::container::{container_name, Catalog};
use crate::objects::ObjectStore;
use crate::recipe::{fingerprint_check, Recipe, SegmentRef};

use super::backups::Recipes;
use super::containers::ContainerState;
use super::{store_detail, CheckReport};

/// Catalogs kept while recipes are checked: a recipe references its
/// containers in runs, so a few dozen serve it without reading one twice.
const CATALOGS: usize = 64;

/// The references of committed backups' recipes, checked one recipe at a
/// time against the catalogs (read again, a bounded number kept).
pub(super) struct References<'a> {
    store: &'a dyn ObjectStore,
    containers: &'a BTreeMap<u64, ContainerState>,
    catalogs: CatalogCache,
    /// Catalogs that read in the containers phase but not again: the
    /// problem each got.
    unreadable: BTreeMap<u64, usize>,
    referenced: BTreeSet<u64>,
    /// One problem per missing container, however many references find
    /// it gone.
    missing: BTreeMap<u64, usize>,
}

impl<'a> References<'a> {
    pub(super) fn new(
        store: &'a dyn ObjectStore,
        containers: &'a BTreeMap<u64, ContainerState>,
    ) -> References<'a> {
        References {
            store,
            containers,
            catalogs: CatalogCache::new(CATALOGS),
            unreadable: BTreeMap::new(),
            referenced: BTreeSet::new(),
            missing: BTreeMap::new(),
        }
    }

    /// The catalog of readable container `id`, or the problem it has now.
    fn catalog(&mut self, id: u64, report: &mut CheckReport) -> Result<Arc<Catalog>, usize> {
        if let Some(&p) = self.unreadable.get(&id) {
            return Err(p);
        }
        if let Some(c) = self.catalogs.get(id) {
            return Ok(c);
        }
        match Catalog::read(self.store, id) {
            Ok(c) => {
                let c = Arc::new(c);
                self.catalogs.insert(id, c.clone());
                Ok(c)
            }
            Err(e) => {
                let d = format!("its catalog read once, then not: {}", store_detail(&e));
                let p = report.problem(&container_name(id), d);
                self.unreadable.insert(id, p);
                Err(p)
            }
        }
    }

    /// Check recipe `object`, which backups `owners` name.
    pub(super) fn check(
        &mut self,
        object: &str,
        recipe: &Recipe,
        owners: &[String],
        report: &mut CheckReport,
    ) {
        let mut wrong: Vec<String> = Vec::new();
        for (k, s) in recipe.segments.iter().enumerate() {
            self.referenced.insert(s.container);
            match self.containers.get(&s.container) {
                None => {
                    let p = *self.missing.entry(s.container).or_insert_with(|| {
                        report.problem(
                            &container_name(s.container),
                            "missing, but a backup's recipe references it",
                        )
                    });
                    report.affect(p, owners);
                }
                Some(ContainerState::Damaged(p)) => report.affect(*p, owners),
                Some(ContainerState::Readable { bad_segments }) => {
                    let catalog = match self.catalog(s.container, report) {
                        Ok(c) => c,
                        Err(p) => {
                            report.affect(p, owners);
                            continue;
                        }
                    };
                    match entry_mismatch(s, catalog.entries()) {
                        Some(why) => wrong.push(format!("reference {k}: {why}")),
                        None => {
                            if let Some(&p) = bad_segments.get(&s.entry) {
                                report.affect(p, owners);
                            }
                        }
                    }
                }
            }
        }
        if let Some(first) = wrong.first() {
            // A recipe pointing wrongly points wrongly many times: the
            // first says what, the count how much.
            let more = match wrong.len() {
                1 => String::new(),
                n => format!(" (and {} more wrong references)", n - 1),
            };
            report.problem_affecting(object, format!("{first}{more}"), owners);
        }
    }

    /// Name the containers no committed backup's recipe references as
    /// garbage.
    pub(super) fn finish(self, recipes: &Recipes, report: &mut CheckReport) {
        for &id in self.containers.keys() {
            if self.referenced.contains(&id) {
                continue;
            }
            let by: Vec<&str> = recipes
                .orphans
                .iter()
                .filter(|(_, ids)| ids.contains(&id))
                .map(|(name, _)| name.as_str())
                .collect();
            let reason = if by.is_empty() {
                "no recipe references it".to_string()
            } else {
                format!(
                    "no backup's recipe references it, only recipes no backup names: {}",
                    by.join(", ")
                )
            };
            report.garbage(&container_name(id), reason);
        }
    }
}

/// Why catalog entry `s.entry` is not the segment `s` expects, if it is not.
fn entry_mismatch(s: &SegmentRef, entries: &[crate::format::Entry]) -> Option<String> {
    let c = container_name(s.container);
    let Some(e) = entries.get(s.entry as usize) else {
        return Some(format!(
            "{c} has no catalog entry {} (it has {})",
            s.entry,
            entries.len()
        ));
    };
    if fingerprint_check(&e.fingerprint) != s.check {
        return Some(format!(
            "catalog entry {} of {c} holds another segment (fingerprints differ)",
            s.entry
        ));
    }
    if e.location.raw_len != s.len {
        return Some(format!(
            "catalog entry {} of {c} is {} bytes, the recipe says {}",
            s.entry, e.location.raw_len, s.len
        ));
    }
    if e.is_absent() {
        return Some(format!(
            "catalog entry {} of {c} was removed by garbage collection, but a recipe needs it",
            s.entry
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{Entry, Location};
    use dedup_common::compress::Compression;
    use dedup_common::fingerprint::Fingerprint;

    #[test]
    fn a_reference_to_a_segment_compaction_removed_is_damage() {
        let fingerprint = Fingerprint([7; 32]);
        let entry = Entry {
            fingerprint,
            location: Location {
                offset: 32,
                stored_len: 10,
                raw_len: 4096,
                compression: Compression::Lz4,
                stored_crc: 1,
                frame_at: 0,
                frame_len: 4096,
            },
        };
        let s = SegmentRef::new(3, 0, 4096, &fingerprint);
        assert_eq!(entry_mismatch(&s, &[entry]), None);
        let removed = entry.absent_at(32);
        assert!(removed.is_absent());
        let why = entry_mismatch(&s, &[removed]).expect("damage");
        assert!(why.contains("removed by garbage collection"), "{why}");
    }
}
