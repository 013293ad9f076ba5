//! Garbage collection: grouped mark-and-sweep (GMS, Guo & Efstathopoulos
//! §3.3) under the protection map.
//!
//! 1. *Mark changed groups.* Each backup group's marks (`marks.rs`) record
//!    the backups they were computed from and count, per entry, the
//!    backups that reference it; a group whose backups are the same (names
//!    and recipe objects) reuses them without reading a recipe, a changed
//!    group reads the recipes of the backups that changed only (a deleted
//!    backup's references taken out, a new one's added; marks without
//!    counts, or a deleted recipe that does not read, mark it again from
//!    all its recipes), and the marks of a group with no backups left are
//!    dropped. Work follows the change.
//! 2. *Condemn.* A container is garbage when no group's marks reference
//!    it and no writer pins it: the containers listed in the store (a cheap
//!    LIST; nothing is read) minus the union of the marks and of the pins.
//!    They go into this collection's epoch record (`collect.rs`), which
//!    every writing process applies before it references anything again.
//! 3. *Sweep* what the previous collection condemned and a second look,
//!    made after this collection's epoch began, still finds unreferenced
//!    (`sweep.rs`); *compact* the containers it marked for compaction
//!    (`compact.rs`); delete the recipes (with their parts) and trees it
//!    found orphaned (a backup that died between its recipe and its
//!    commit point, a delete that died part-way) and still are.
//!
//! `gc` runs two collections, so what is unreferenced when it starts is
//! gone when it ends unless a backup began to reuse it meanwhile.
//!
//! Why it is safe against backups running at the same time, in this
//! process or in others on any host: see `epochs/` and FORMATS.md
//! ("Many writers: epochs, pins and id ranges"); in the process, the protection map
//! (`protection.rs`) holds what running backups reference, and a
//! container is deleted only once condemned there, which no session
//! holding it allows and after which no lookup hands it out.
//!
//! A damaged backup object does not stop the collection: its recipe and
//! tree are unknown, so every unnamed recipe and tree written for its
//! name is kept and what those recipes reference stays live
//! (`suspects.rs`).
//!
//! Why it is restartable: marks are derived data, written put-new-then-
//! delete-old before anything is deleted; every deletion is repeatable and
//! a missing object is not an error. A GC that dies at any point leaves
//! every committed backup restorable, and the next GC finds what is left
//! by listing.

mod candidates;
mod collect;
mod compact;
mod mark;
pub mod marks;
mod pace;
mod suspects;
mod sweep;

use std::time::{Duration, Instant};

pub use compact::DEFAULT_COMPACT_BELOW;
pub use marks::{Marks, MARKS_PREFIX};

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
    /// How long a collection waits for writers in other processes to
    /// look at the newest epoch before it begins the next (`pace.rs`):
    /// pacing only, never safety. Default [`DEFAULT_WRITER_WAIT`].
    pub writer_wait: Duration,
    pub progress: Option<&'a Progress<'a>>,
}

/// How long a collection waits, at most, for a writer still pinned at the
/// epoch before the newest.
pub const DEFAULT_WRITER_WAIT: Duration = Duration::from_secs(30);

impl Default for GcOptions<'_> {
    fn default() -> Self {
        GcOptions {
            compact_below: DEFAULT_COMPACT_BELOW,
            writer_wait: DEFAULT_WRITER_WAIT,
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
    /// Seconds spent waiting for writers in other processes to look at
    /// the newest epoch before a collection began (`pace.rs`).
    pub seconds_waiting_for_writers: f64,
    /// Writers still not caught up when a wait reached its bound (their
    /// backups may be stopped, never lose data).
    pub writers_not_caught_up: u64,
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
        // Two collections (`collect.rs`): the first condemns what is
        // unreferenced now, the second deletes it if a look made after the
        // first's epoch began still finds it so.
        self.collections(options, 2)
    }

    /// One collection only (one epoch): what a collection running beside
    /// others does between two of theirs. For tests that interleave
    /// collections with backups step by step.
    #[doc(hidden)]
    pub fn gc_one_epoch(&self, options: &GcOptions) -> RepoResult<GcReport> {
        self.collections(options, 1)
    }

    /// `count` collections in a row. The report is the first's, with what
    /// the later ones read and freed added (their marks are the first's,
    /// reused).
    fn collections(&self, options: &GcOptions, count: usize) -> RepoResult<GcReport> {
        if !self.is_writable() {
            return Err(RepoError::ReadOnly);
        }
        let start = Instant::now();
        if !self.protection().begin_gc() {
            return Err(RepoError::GcRunning);
        }
        let _running = Running(self);
        let mut report = GcReport::default();
        // Loaded and kept up to date even when nothing is compacted, so
        // a later collection compacts what this one left.
        let mut candidates = self.load_candidates()?;
        let mut seen = None;
        // Another collector running beside this one may put the next
        // generation of a group's marks or of the candidates first.
        let beside = |e| match e {
            RepoError::Store(Error::Exists { .. }) => RepoError::GcRunning,
            other => other,
        };
        self.collect(&mut candidates, &mut seen, options, &mut report)
            .map_err(beside)?;
        for _ in 1..count {
            if report.sweep_withheld {
                break;
            }
            let mut next = GcReport::default();
            self.collect(&mut candidates, &mut seen, options, &mut next)
                .map_err(beside)?;
            report.recipes_read += next.recipes_read;
            report.catalogs_read += next.catalogs_read;
            report.containers_swept += next.containers_swept;
            report.containers_compacted += next.containers_compacted;
            report.bytes_reclaimed += next.bytes_reclaimed;
            report.orphans_removed += next.orphans_removed;
            report.sweep_withheld = next.sweep_withheld;
            report.seconds_waiting_for_writers += next.seconds_waiting_for_writers;
            report.writers_not_caught_up += next.writers_not_caught_up;
        }
        report.seconds = start.elapsed().as_secs_f64();
        Ok(report)
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
