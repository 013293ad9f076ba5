//! Garbage collection: grouped mark-and-sweep (GMS, Guo & Efstathopoulos
//! §3.3) under the protection map.
//!
//! 1. *Mark changed groups.* Each backup group's marks (`marks.rs`) record
//!    the backups they were computed from; a group whose backups are the
//!    same (names and recipe objects) reuses them without reading a recipe,
//!    a changed group is marked again from its recipes, and the marks of a
//!    group with no backups left are dropped. Work follows the change.
//! 2. *Sweep.* A container is garbage when no group's marks reference it.
//!    Those are the containers listed in the store (a cheap LIST; nothing
//!    is read) minus the union of the marks: the containers a changed
//!    group stopped referencing, and those no backup ever committed (a
//!    crashed or refused backup, a GC that died before deleting).
//!    Protection decides what may go (`sweep.rs`).
//! 3. *Compaction* of the live containers that may have lost entries and
//!    are now mostly dead (`compact.rs`).
//! 4. *Orphans.* Recipes (with their parts) and trees no backup object
//!    names (a backup that died between its recipe and its commit point, a
//!    delete that died part-way) are removed, unless a running session is
//!    about to commit them.
//!
//! Why it is safe against backups running at the same time: see
//! `protection.rs`. In short, the backups are listed only after the GC has
//! begun (so a backup committed later keeps its containers held until the
//! GC ends), and a container is deleted only once condemned, which no
//! session holding it allows and after which no lookup hands it out.
//!
//! A damaged backup object does not stop the collection: its recipe and
//! tree are unknown, so every recipe and tree no readable backup names is
//! kept and what those recipes reference stays live (`suspects.rs`).
//!
//! Why it is restartable: marks are derived data, written put-new-then-
//! delete-old before anything is deleted; every deletion is repeatable and
//! a missing object is not an error. A GC that dies at any point leaves
//! every committed backup restorable, and the next GC finds what is left
//! by listing.

mod candidates;
mod compact;
mod mark;
pub mod marks;
mod suspects;
mod sweep;

use std::collections::BTreeSet;
use std::time::Instant;

pub use compact::DEFAULT_COMPACT_BELOW;
pub use marks::{Marks, MARKS_PREFIX};

use crate::backup::{BackupRecord, RECIPES_PREFIX, TREES_PREFIX};
use crate::error::repo::{RepoError, RepoResult};
use crate::error::Error;
use crate::repo::Repository;

/// Called as a GC proceeds: the phase ("mark", "sweep"), items done, and
/// items in the phase.
pub type Progress<'a> = dyn Fn(&str, u64, u64) + Send + Sync + 'a;

/// How to collect.
pub struct GcOptions<'a> {
    /// Rewrite a container whose live share of stored bytes is below this
    /// fraction (0 never compacts; default [`DEFAULT_COMPACT_BELOW`]).
    pub compact_below: f64,
    pub progress: Option<&'a Progress<'a>>,
}

impl Default for GcOptions<'_> {
    fn default() -> Self {
        GcOptions {
            compact_below: DEFAULT_COMPACT_BELOW,
            progress: None,
        }
    }
}

/// What one garbage collection did (also the server's answer to a GC).
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GcReport {
    /// Committed backups when the GC began.
    pub backups: u64,
    /// Groups whose backups changed, marked again from their recipes.
    pub groups_remarked: u64,
    /// Groups whose saved marks were reused (no recipe read).
    pub groups_reused: u64,
    /// Groups with no backups left, whose marks were dropped.
    pub groups_dropped: u64,
    /// Recipes read to mark.
    pub recipes_read: u64,
    /// Containers in the store.
    pub containers: u64,
    /// Containers no marks reference that a running backup holds (kept).
    pub containers_protected: u64,
    /// Containers deleted.
    pub containers_swept: u64,
    /// Containers rewritten with only their live segments.
    pub containers_compacted: u64,
    /// Catalogs read to decide on compaction (containers that lost
    /// entries since the last collection).
    pub catalogs_read: u64,
    /// Bytes freed: containers deleted, and what compaction saved.
    pub bytes_reclaimed: u64,
    /// Recipes, recipe parts and trees no backup names, removed.
    pub orphans_removed: u64,
    /// Backup objects that did not read or decode: what they reference
    /// is unknown, so what may be theirs was kept.
    pub backups_damaged: u64,
    /// Recipes, recipe parts and trees no readable backup names, kept
    /// because a damaged backup may own them (their segments stay live).
    pub orphans_kept: u64,
    /// No container was deleted or compacted: a damaged backup's recipe
    /// may be one that could not be read either.
    pub sweep_withheld: bool,
    pub seconds: f64,
}

/// Ends the GC in the protection map however `gc` returns.
struct Running<'r>(&'r Repository);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.protection().end_gc();
    }
}

impl Repository {
    /// Collect garbage while backups may run on other threads. One GC at
    /// a time: a second is refused with [`RepoError::GcRunning`]. A damaged
    /// recipe of a readable backup stops the GC before anything is deleted
    /// (what it references cannot be known); a damaged backup object does
    /// not (what may be its is kept, see `suspects.rs`).
    pub fn gc(&self, options: &GcOptions) -> RepoResult<GcReport> {
        if !self.is_writable() {
            return Err(RepoError::ReadOnly);
        }
        let start = Instant::now();
        if !self.protection().begin_gc() {
            return Err(RepoError::GcRunning);
        }
        let _running = Running(self);
        let mut report = GcReport::default();
        self.finish_compactions()?;
        // Loaded and kept up to date even when nothing is compacted, so
        // a later collection compacts what this one left.
        let mut candidates = self.load_candidates()?;

        // Recipes and trees first, then what sessions are about to commit,
        // then the backups: an object listed here either belongs to a
        // session still pending, or to a backup object already put (and so
        // listed below), or to none.
        let mut named = self.store.list(RECIPES_PREFIX)?;
        named.extend(self.store.list(TREES_PREFIX)?);
        let pending = self.protection().pending_objects();
        let (backups, damaged) = self.committed_backups()?;
        report.backups = backups.len() as u64;
        report.backups_damaged = damaged as u64;

        let referenced: BTreeSet<&str> = backups
            .iter()
            .flat_map(|b| std::iter::once(b.recipe.as_str()).chain(b.tree.as_deref()))
            .collect();
        // Recipes (a recipe's parts live and die with it) and trees no
        // readable backup names, and no session is about to commit.
        let unnamed: Vec<&str> = named
            .iter()
            .map(String::as_str)
            .filter(|o| {
                let owner = crate::recipe::parts::recipe_of(o);
                !referenced.contains(owner) && !pending.contains(owner)
            })
            .collect();
        // With a damaged backup object, any of them may be its.
        let suspects = (damaged > 0).then(|| self.mark_suspects(&unnamed));

        let marks = self.mark(&backups, &mut candidates, options, &mut report)?;
        let mut union = Marks::default();
        for m in marks.values().chain(suspects.as_ref().map(|s| &s.marks)) {
            union.merge(m);
        }
        let union = union.containers;
        if suspects.as_ref().is_some_and(|s| s.unknown) {
            report.sweep_withheld = true;
        } else {
            let live: BTreeSet<u64> = union.keys().copied().collect();
            self.sweep_containers(&live, options, &mut report)?;
            if options.compact_below > 0.0 {
                let ids = candidates.ids.clone();
                let left = self.compact(&ids, &union, options, &mut report)?;
                if left != candidates.ids {
                    self.save_candidates(&mut candidates, &left)?;
                }
            }
        }

        for object in unnamed {
            if suspects.is_some() {
                report.orphans_kept += 1;
                continue;
            }
            if self.delete_if_there(object)? {
                report.orphans_removed += 1;
            }
        }
        report.seconds = start.elapsed().as_secs_f64();
        Ok(report)
    }

    /// The committed backups that read, and how many backup objects did
    /// not; one deleted while listing is left out.
    fn committed_backups(&self) -> RepoResult<(Vec<BackupRecord>, usize)> {
        let listing = self.list_backups_all()?;
        Ok((listing.backups, listing.damaged.len()))
    }

    /// Delete `object`; false if it was already gone.
    pub(crate) fn delete_if_there(&self, object: &str) -> RepoResult<bool> {
        match self.store.delete(object) {
            Ok(()) => Ok(true),
            Err(Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }
}
