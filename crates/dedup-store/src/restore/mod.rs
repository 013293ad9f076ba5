//! Restoring a backup from its recipe alone: each run of consecutive
//! entries of one container (up to 4 MiB) is read with one ranged read of
//! exactly their stored bytes, each segment checked (crc32c, then BLAKE3
//! against its catalog entry, which must carry the recipe's fingerprint)
//! and written out in order. No index is consulted. The recipe is read one
//! part at a time (`recipe/parts.rs`), so a restore of any size holds at
//! most one part of it.

pub(crate) mod at_offsets;
pub(crate) mod blocks;
mod keyed;
pub(crate) mod salvage;

use std::io::Write;
use std::ops::Range;

use crate::backup::BackupRecord;
use crate::container::{container_name, Catalog, FrameCache};
use crate::error::repo::{RepoError, RepoResult};
use crate::error::Error;
use crate::recipe::parts::RecipeParts;
use crate::recipe::{Recipe, SegmentRef};
use crate::repo::Repository;

/// Most raw bytes one ranged read of a restore covers.
const MAX_RUN: u64 = 4 << 20;
/// Decompressed frames a restore keeps (at most 16 MiB of 1 MiB frames):
/// a run broken by a duplicate stored elsewhere resumes in a frame still
/// here.
const FRAMES_KEPT: usize = 16;
/// Runs being read ahead of the one being written (each at most `MAX_RUN`).
const RUNS_AHEAD: usize = 8;
/// Windows of stored bytes kept where the store reads in windows
/// (`read_windows.rs`; S3: 16 of 4 MiB, 64 MiB at most).
const WINDOWS_KEPT: usize = 16;

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
        self.recipe_parts_of(self.backup(name)?)
    }

    /// `recipe_parts` of a backup whose record was read already.
    pub(crate) fn recipe_parts_of(
        &self,
        record: BackupRecord,
    ) -> RepoResult<(BackupRecord, RecipeParts)> {
        let name = &record.name;
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
    /// on the rayon pool: not for use on a pool thread. (`restore::salvage`
    /// goes on past damage instead.)
    pub fn restore(&self, name: &str, mut out: impl Write) -> RepoResult<u64> {
        let (_, parts) = self.recipe_parts(name)?;
        let mut written = 0u64;
        self.restore_pieces(name, parts, None, &mut |piece| match piece {
            Piece::Data(data) => {
                written += data.len() as u64;
                out.write_all(data).map_err(|cause| writing(name, cause))
            }
            Piece::Damaged(_, e) => Err(e),
            // Nothing is skipped when every byte is wanted.
            Piece::Skipped(_) => Ok(()),
        })?;
        out.flush().map_err(|cause| writing(name, cause))?;
        Ok(written)
    }

    /// Hand backup `name`'s stream, read from `parts`, to `sink` piece by
    /// piece in stream order: the bytes read and checked, the bytes not
    /// `wanted` (never read: neither their recipe part nor their frames),
    /// and the bytes that could not be restored with why (a part of the
    /// recipe, a catalog or a frame missing or damaged). Damage costs only
    /// the bytes that need it and the restore goes on past it, unless
    /// `sink` refuses it. An error of the sink ends the restore with it;
    /// so does the backup going away under it.
    pub(crate) fn restore_pieces(
        &self,
        name: &str,
        mut parts: RecipeParts,
        wanted: Option<&Wanted>,
        sink: &mut dyn FnMut(Piece) -> RepoResult<()>,
    ) -> RepoResult<()> {
        let frames =
            FrameCache::reading_ahead(FRAMES_KEPT, self.store.read_granule(), WINDOWS_KEPT);
        let mut at = 0u64;
        while let Some(len) = parts.next_part_bytes() {
            let range = at..at + len;
            at += len;
            if wanted.is_some_and(|w| !w.overlaps(&range)) {
                parts.skip_part();
                sink(Piece::Skipped(len))?;
                continue;
            }
            let Some(part) = parts.next_part(&*self.store) else {
                break;
            };
            match part {
                Ok((object, part)) => {
                    let job = Part {
                        name,
                        recipe: &object,
                        segments: &part.segments,
                        at: range.start,
                    };
                    self.restore_part(job, wanted, &frames, sink)?;
                }
                // A delete removes the parts after the backup object: a
                // part gone under a restore may mean the backup went.
                Err(e) => match self.backup(name) {
                    Err(gone @ RepoError::NoSuchBackup { .. }) => return Err(gone),
                    _ => sink(Piece::Damaged(len, e))?,
                },
            }
        }
        Ok(())
    }

    /// Hand the segments of one part of a recipe to `sink` (see
    /// `restore_pieces`).
    fn restore_part(
        &self,
        part: Part,
        wanted: Option<&Wanted>,
        frames: &FrameCache,
        sink: &mut dyn FnMut(Piece) -> RepoResult<()>,
    ) -> RepoResult<()> {
        let Part { name, recipe, .. } = part;
        let jobs = jobs(&part, wanted);
        // Runs are read, decompressed and checked on the thread pool, up
        // to `RUNS_AHEAD` ahead, and handed on here in order: decompressing
        // zstd frames is the dearest step, and one thread did it alone.
        rayon::in_place_scope(|scope| -> RepoResult<()> {
            let mut ahead = std::collections::VecDeque::new();
            let mut next = jobs.iter();
            loop {
                while ahead.len() < RUNS_AHEAD {
                    let Some(job) = next.next() else { break };
                    let run = match job {
                        Job::Skip(n) => {
                            ahead.push_back(Ahead::Skip(*n));
                            continue;
                        }
                        Job::Read(run) => *run,
                    };
                    let (done, result) = std::sync::mpsc::sync_channel(1);
                    scope.spawn(move |_| {
                        let _ = done.send(self.read_checked(name, recipe, run, frames));
                    });
                    ahead.push_back(Ahead::Read(run, result));
                }
                let (run, result) = match ahead.pop_front() {
                    None => return Ok(()),
                    Some(Ahead::Skip(n)) => {
                        sink(Piece::Skipped(n))?;
                        continue;
                    }
                    Some(Ahead::Read(run, result)) => (run, result),
                };
                // A task always answers unless it panicked (a bug).
                let read = result.recv().map_err(|_| RepoError::Io {
                    context: format!("reading the restore of backup {name}"),
                    cause: std::io::Error::other("a reading task died"),
                })?;
                match read {
                    Ok(read) => {
                        for (s, data) in run.iter().zip(read) {
                            match data {
                                Ok(data) => sink(Piece::Data(&data))?,
                                Err(e) => sink(Piece::Damaged(s.len.into(), e.into()))?,
                            }
                        }
                    }
                    Err(e) => sink(Piece::Damaged(bytes_of(run), e))?,
                }
            }
        })
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
        // again, once, and the container's bytes too.
        self.catalog_cache().forget(first.container);
        frames.forget_read_ahead();
        let fresh = self.catalog(first.container)?;
        check_run(&fresh, run, recipe)?;
        Ok(fresh.read_run_cached(&*self.store, first.entry as usize, run.len(), frames)?)
    }
}

/// Segments read for a restore, each checked or the error that refused it.
type Run = Vec<crate::error::Result<Vec<u8>>>;

/// What a restore hands on, in stream order.
pub(crate) enum Piece<'a> {
    /// The stream's next bytes, checked.
    Data(&'a [u8]),
    /// The next bytes, not wanted, so not read.
    Skipped(u64),
    /// The next bytes could not be restored, and why.
    Damaged(u64, RepoError),
}

/// The ranges of a backup's stream a restore needs (the files asked
/// for), in stream order and apart.
#[derive(Debug, Default)]
pub(crate) struct Wanted(Vec<Range<u64>>);

impl Wanted {
    /// Add `range`, which lies after every range added before.
    pub fn push(&mut self, range: Range<u64>) {
        match self.0.last_mut() {
            Some(last) if last.end >= range.start => last.end = last.end.max(range.end),
            _ if range.is_empty() => {}
            _ => self.0.push(range),
        }
    }

    /// Whether any wanted byte lies in `range`.
    pub fn overlaps(&self, range: &Range<u64>) -> bool {
        let i = self.0.partition_point(|w| w.end <= range.start);
        self.0.get(i).is_some_and(|w| w.start < range.end)
    }

    /// Take the whole blocks `blocks` (in order) of `bs` bytes out of the
    /// wanted ranges.
    pub fn remove_blocks(&mut self, blocks: &[u64], bs: u64) {
        let mut out = Vec::with_capacity(self.0.len() + blocks.len());
        let mut blocks = blocks.iter().map(|b| b * bs..(b + 1) * bs).peekable();
        for range in self.0.drain(..) {
            let mut start = range.start;
            while let Some(gone) = blocks.peek().filter(|g| g.start < range.end).cloned() {
                if gone.start > start {
                    out.push(start..gone.start);
                }
                start = start.max(gone.end);
                // A block past this range's end may reach into the next.
                if gone.end > range.end {
                    break;
                }
                blocks.next();
            }
            if start < range.end {
                out.push(start..range.end);
            }
        }
        self.0 = out;
    }

    /// The wanted bytes of `range`, as ranges in order.
    pub fn within(&self, range: &Range<u64>) -> Vec<Range<u64>> {
        let i = self.0.partition_point(|w| w.end <= range.start);
        (self.0[i..].iter())
            .take_while(|w| w.start < range.end)
            .map(|w| w.start.max(range.start)..w.end.min(range.end))
            .collect()
    }
}

/// One part of a backup's recipe to restore: its segments from stream
/// offset `at`.
struct Part<'a> {
    name: &'a str,
    recipe: &'a str,
    segments: &'a [SegmentRef],
    at: u64,
}

/// A step of a part's restore: bytes to skip, or a run to read.
enum Job<'a> {
    Skip(u64),
    Read(&'a [SegmentRef]),
}

/// A job under way: a skip, or a run being read.
enum Ahead<'a> {
    Skip(u64),
    Read(&'a [SegmentRef], std::sync::mpsc::Receiver<RepoResult<Run>>),
}

/// The jobs of `part`: its wanted segments (all, without `wanted`) in
/// runs, the others as skips between them.
fn jobs<'a>(part: &Part<'a>, wanted: Option<&Wanted>) -> Vec<Job<'a>> {
    let segments = part.segments;
    let mut at = part.at;
    let want =
        |at: u64, s: &SegmentRef| wanted.is_none_or(|w| w.overlaps(&(at..at + u64::from(s.len))));
    let mut jobs = Vec::new();
    let mut i = 0;
    while i < segments.len() {
        if !want(at, &segments[i]) {
            let n = u64::from(segments[i].len);
            match jobs.last_mut() {
                Some(Job::Skip(skip)) => *skip += n,
                _ => jobs.push(Job::Skip(n)),
            }
            at += n;
            i += 1;
            continue;
        }
        let mut n = run_len(&segments[i..]);
        let mut end = at;
        for (k, s) in segments[i..i + n].iter().enumerate() {
            if !want(end, s) {
                n = k;
                break;
            }
            end += u64::from(s.len);
        }
        jobs.push(Job::Read(&segments[i..i + n]));
        at = end;
        i += n;
    }
    jobs
}

/// The raw bytes of `run`.
fn bytes_of(run: &[SegmentRef]) -> u64 {
    run.iter().map(|s| u64::from(s.len)).sum()
}

/// The error for a restore's writer failing.
pub(crate) fn writing(name: &str, cause: std::io::Error) -> RepoError {
    RepoError::Io {
        context: format!("writing the restore of backup {name}"),
        cause,
    }
}

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

#[cfg(test)]
mod tests {
    use super::Wanted;

    /// Blocks taken out of the wanted ranges, checked against a set of
    /// wanted bytes.
    #[test]
    fn remove_blocks_takes_out_exactly_those_blocks() {
        use rand::{Rng, SeedableRng};
        let bs = 4u64;
        for seed in 0..200 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let mut wanted = Wanted::default();
            let mut model = vec![false; 400];
            let mut at = 0u64;
            while at < 380 {
                let start = at + rng.random_range(0..12);
                let end = (start + rng.random_range(1..30)).min(400);
                wanted.push(start..end);
                model[start as usize..end as usize].fill(true);
                at = end;
            }
            let mut blocks: Vec<u64> = (0..100).filter(|_| rng.random_bool(0.3)).collect();
            blocks.dedup();
            for b in &blocks {
                model[(b * bs) as usize..((b + 1) * bs) as usize].fill(false);
            }
            wanted.remove_blocks(&blocks, bs);
            let got: Vec<bool> = (0..400u64).map(|i| wanted.overlaps(&(i..i + 1))).collect();
            assert_eq!(got, model, "seed {seed}");
            assert!(wanted.0.windows(2).all(|w| w[0].end <= w[1].start));
            assert!(wanted.0.iter().all(|r| !r.is_empty()));
        }
    }
}
