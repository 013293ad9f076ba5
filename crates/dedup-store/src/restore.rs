//! Restoring a backup from its recipe alone: each run of consecutive
//! entries of one container (up to 4 MiB) is read with one ranged read of
//! exactly their stored bytes, each segment checked (crc32c, then BLAKE3
//! against its catalog entry, which must carry the recipe's fingerprint)
//! and written out in order. No index is consulted. The recipe is read one
//! part at a time (`recipe_parts.rs`), so a restore of any size holds at
//! most one part of it.

use std::io::Write;

use crate::backup::BackupRecord;
use crate::container::{container_name, Catalog, FrameCache};
use crate::error::Error;
use crate::recipe::{Recipe, SegmentRef};
use crate::recipe_parts::RecipeParts;
use crate::repo::Repository;
use crate::repo_error::{RepoError, RepoResult};

/// Most raw bytes one ranged read of a restore covers.
const MAX_RUN: u64 = 4 << 20;
/// Decompressed frames a restore keeps (at most 16 MiB of 1 MiB frames):
/// a run broken by a duplicate stored elsewhere resumes in a frame still
/// here.
const FRAMES_KEPT: usize = 16;
/// Runs being read ahead of the one being written (each at most `MAX_RUN`).
const RUNS_AHEAD: usize = 8;

impl Repository {
    /// Backup `name`'s record and whole recipe (all its parts at once),
    /// checked against each other.
    pub fn recipe(&self, name: &str) -> RepoResult<(BackupRecord, Recipe)> {
        let (record, parts) = self.recipe_parts(name)?;
        let recipe = parts.read_all(&*self.store)?;
        Ok((record, recipe))
    }

    /// Backup `name`'s record and its recipe, to read part by part; the
    /// recipe's length checked against the record's.
    pub fn recipe_parts(&self, name: &str) -> RepoResult<(BackupRecord, RecipeParts)> {
        let record = self.backup(name)?;
        let parts = match RecipeParts::open(&*self.store, &record.recipe) {
            Err(RepoError::Store(Error::NotFound { .. })) => {
                return Err(RepoError::corrupt(
                    &record.recipe,
                    format!("missing, but backup {name} needs it"),
                ))
            }
            other => other?,
        };
        if parts.stream_len() != record.report.bytes_in {
            return Err(RepoError::corrupt(
                &record.recipe,
                format!(
                    "{} bytes long, but backup {name} read {}",
                    parts.stream_len(),
                    record.report.bytes_in
                ),
            ));
        }
        Ok((record, parts))
    }

    /// Write backup `name`'s stream to `out`; the number of bytes written.
    /// A missing or damaged recipe or container is refused, naming it;
    /// `out` then holds the segments before the run (at most 4 MiB of one
    /// container) holding the damaged one, all checked. It waits for jobs
    /// on the rayon pool: not for use on a pool thread.
    pub fn restore(&self, name: &str, mut out: impl Write) -> RepoResult<u64> {
        let (_, mut parts) = self.recipe_parts(name)?;
        let frames = FrameCache::new(FRAMES_KEPT);
        let mut written = 0u64;
        while let Some(part) = parts.next_part(&*self.store) {
            let (object, part) = match part {
                Ok(part) => part,
                // A delete removes the parts after the backup object: a
                // part gone under a restore may mean the backup went.
                Err(e) => match self.backup(name) {
                    Err(gone @ RepoError::NoSuchBackup { .. }) => return Err(gone),
                    _ => return Err(e),
                },
            };
            written += self.restore_part(name, &object, &part.segments, &frames, &mut out)?;
        }
        out.flush().map_err(|cause| RepoError::Io {
            context: format!("writing the restore of backup {name}"),
            cause,
        })?;
        Ok(written)
    }

    /// Write the segments of one part of backup `name`'s recipe (object
    /// `recipe`) to `out`; the number of bytes written.
    fn restore_part(
        &self,
        name: &str,
        recipe: &str,
        segments: &[SegmentRef],
        frames: &FrameCache,
        out: &mut impl Write,
    ) -> RepoResult<u64> {
        let io = |cause| RepoError::Io {
            context: format!("writing the restore of backup {name}"),
            cause,
        };
        // Runs are read, decompressed and checked on the thread pool, up
        // to `RUNS_AHEAD` ahead, and written here in order: decompressing
        // zstd frames is the dearest step, and one thread did it alone.
        let mut runs = Vec::new();
        let mut i = 0;
        while i < segments.len() {
            let n = run_len(&segments[i..]);
            runs.push(&segments[i..i + n]);
            i += n;
        }
        let mut written = 0u64;
        rayon::in_place_scope(|scope| -> RepoResult<()> {
            let mut ahead = std::collections::VecDeque::new();
            let mut next = runs.iter();
            loop {
                while ahead.len() < RUNS_AHEAD {
                    let Some(run) = next.next() else { break };
                    let (done, result) = std::sync::mpsc::sync_channel(1);
                    scope.spawn(move |_| {
                        let _ = done.send(self.read_checked(name, recipe, run, frames));
                    });
                    ahead.push_back(result);
                }
                let Some(result) = ahead.pop_front() else {
                    return Ok(());
                };
                // A task always answers unless it panicked (a bug).
                let read = result.recv().map_err(|_| RepoError::Io {
                    context: format!("reading the restore of backup {name}"),
                    cause: std::io::Error::other("a reading task died"),
                })?;
                for data in read? {
                    let data = data?;
                    out.write_all(&data).map_err(io)?;
                    written += data.len() as u64;
                }
            }
        })?;
        Ok(written)
    }

    /// The segments of `run` (consecutive entries of one container), each
    /// checked against the recipe and its catalog, read with one ranged
    /// read. A damaged segment is an `Err` in its place, so the ones before
    /// it are still written.
    fn read_checked(
        &self,
        name: &str,
        recipe: &str,
        run: &[SegmentRef],
        frames: &FrameCache,
    ) -> RepoResult<Run> {
        let first = run[0];
        let catalog = match self.catalog(first.container) {
            Err(Error::NotFound { .. }) => {
                return Err(RepoError::corrupt(
                    container_name(first.container),
                    format!("missing, but backup {name} needs it"),
                ))
            }
            other => other?,
        };
        check_run(&catalog, run, recipe)?;
        let read = catalog.read_run_cached(&*self.store, first.entry as usize, run.len(), frames);
        if matches!(&read, Ok(v) if v.iter().all(|d| d.is_ok())) {
            return Ok(read?);
        }
        // A garbage collection may have compacted the container since its
        // catalog was read (same entries, new offsets): read the catalog
        // again, once.
        self.catalog_cache().forget(first.container);
        let fresh = self.catalog(first.container)?;
        check_run(&fresh, run, recipe)?;
        Ok(fresh.read_run_cached(&*self.store, first.entry as usize, run.len(), frames)?)
    }
}

/// Segments read for a restore, each checked or the error that refused it.
type Run = Vec<crate::error::Result<Vec<u8>>>;

/// How many of `segments` (from the first) make one run: consecutive
/// entries of one container, up to `MAX_RUN` raw bytes.
fn run_len(segments: &[SegmentRef]) -> usize {
    let first = segments[0];
    let mut n = 1;
    let mut bytes = u64::from(first.len);
    while let Some(next) = segments.get(n) {
        if next.container != first.container
            || first.entry.checked_add(n as u32) != Some(next.entry)
            || bytes >= MAX_RUN
        {
            break;
        }
        bytes += u64::from(next.len);
        n += 1;
    }
    n
}

/// Every reference of `run` names an entry of `catalog` with its
/// fingerprint and length.
fn check_run(catalog: &Catalog, run: &[SegmentRef], recipe: &str) -> RepoResult<()> {
    for s in run {
        let entry = catalog.entries().get(s.entry as usize).copied();
        if !entry.is_some_and(|e| s.is(&e.fingerprint, e.location.raw_len)) {
            return Err(RepoError::corrupt(
                container_name(s.container),
                format!(
                    "entry {} is not the segment recipe {recipe} expects",
                    s.entry
                ),
            ));
        }
    }
    Ok(())
}
