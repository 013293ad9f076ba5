//! Restoring a stream into a target that takes writes at any offset (a
//! file, a block device), reading each container once, as restic reads
//! each pack once.
//!
//! Why: in stream order, a recipe comes back again and again to the
//! containers its duplicates live in, and from an object store each read
//! is a request. A 2 GiB ext4 image (44 containers) cost 481 ranged GETs
//! of containers in stream order, with windows of 4 MiB kept for the reads
//! that follow (`read_windows.rs`); keeping whole containers (8 of 16 MiB)
//! still cost 298. Here the runs of a pass over the recipe (up to
//! `PASS_SEGMENTS` references) are sorted by container, each container the
//! pass needs a fair share of is read whole in one request (up to
//! `WHOLE_MAX`; its catalog with it), and every run of it is written at
//! its own offset: one GET per container, 44 for that image. A container
//! the pass needs little of (a few duplicates in an old one) is read run
//! by run as in stream order, and so is one that is larger or cannot be
//! read whole (`read_checked`, which knows a compaction's fallbacks and
//! names the damage). Memory stays bounded: the pass's references (24
//! bytes each) and its runs (about 40 bytes each), `CONTAINERS_AHEAD`
//! containers, and the stream-order reads' windows and frames.
//!
//! Damage is handled as the stream-order salvage does it: a damaged range
//! is written as zeros (the target may be a device holding other bytes)
//! and named, and the list comes back in stream order.

use crate::container::{Container, FrameCache};
use crate::error::repo::{RepoError, RepoResult};
use crate::recipe::{Recipe, SegmentRef};
use crate::repo::Repository;
use crate::restore::salvage::{note, DamagedRange, Salvage};
use crate::restore::{bytes_of, check_run, run_len, writing, Run, FRAMES_KEPT, WINDOWS_KEPT};

/// References read per pass: their runs are sorted by container. At
/// 24 bytes a reference, 1 Mi of them hold 24 MiB, about 8 GiB of stream
/// at 8 KiB segments; a longer stream reads each container once per pass.
const PASS_SEGMENTS: usize = 1 << 20;
/// Largest container read whole (a full one is 16 MiB or so; a larger one
/// is read up to this and then run by run).
const WHOLE_MAX: u64 = 32 << 20;
/// A container is read whole when the pass needs at least this many runs
/// of it, or raw bytes of at least this share of the repository's
/// container target: reading 16 MiB for one duplicate segment would cost
/// more in bytes than the requests it saves.
const WHOLE_MIN_RUNS: usize = 16;
const WHOLE_MIN_SHARE: u64 = 4;
/// Containers being read and written at once (each task decompresses its
/// container's frames in turn).
const CONTAINERS_AHEAD: usize = 4;

/// A target that takes writes at any offset, from several threads.
pub trait WriteAt: Sync {
    fn write_at(&self, offset: u64, data: &[u8]) -> std::io::Result<()>;
}

impl WriteAt for std::fs::File {
    fn write_at(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        std::os::unix::fs::FileExt::write_all_at(self, data, offset)
    }
}

/// How a restore at offsets reads its containers.
struct Reading<'a> {
    /// For runs read one by one.
    frames: &'a FrameCache,
    /// Whether to read each container whole first.
    whole: bool,
}

/// A run of one container's entries, and where its bytes go.
struct Placed<'a> {
    at: u64,
    recipe: &'a str,
    run: &'a [SegmentRef],
}

impl Repository {
    /// Whether a stream restore into a file should go through
    /// `restore_salvage_at`: where each read is a request (S3). From a
    /// directory, reads cost little and a stream written in order goes
    /// past the page cache (`direct_write.rs`), which on the bench's VMs
    /// is several times cheaper than through it.
    pub fn restores_at_offsets(&self) -> bool {
        self.store.read_granule() > 0
    }

    /// `restore_salvage` into a target written at any offset, reading the
    /// containers in order (see the module's notes). The damaged ranges
    /// come back in stream order, written as zeros. It waits for jobs on
    /// the rayon pool: not for use on a pool thread.
    pub fn restore_salvage_at(&self, name: &str, out: &dyn WriteAt) -> RepoResult<Salvage> {
        // Where a read costs little (a directory), reading a container
        // whole for a few of its segments would cost more than it saves.
        let whole = self.store.read_granule() > 0;
        self.restore_salvage_at_in(name, out, PASS_SEGMENTS, whole)
    }

    /// `restore_salvage_at` in passes of `pass_segments` references,
    /// reading containers `whole` where it is worth it (for tests: several
    /// passes over a small recipe, both ways of reading).
    #[doc(hidden)]
    pub fn restore_salvage_at_in(
        &self,
        name: &str,
        out: &dyn WriteAt,
        pass_segments: usize,
        whole: bool,
    ) -> RepoResult<Salvage> {
        let (_, mut parts) = self.recipe_parts(name)?;
        let pass_segments = pass_segments.max(1);
        let frames =
            &FrameCache::reading_ahead(FRAMES_KEPT, self.store.read_granule(), WINDOWS_KEPT);
        let mut s = Salvage {
            bytes: parts.stream_len(),
            damaged: Vec::new(),
        };
        let mut at = 0u64;
        while parts.next_part_bytes().is_some() {
            // A pass: parts until `PASS_SEGMENTS` references are held.
            let mut pass: Vec<(String, Recipe, u64)> = Vec::new();
            let mut held = 0;
            while let Some(len) = parts.next_part_bytes().filter(|_| held < pass_segments) {
                let start = at;
                at += len;
                match parts.next_part(&*self.store) {
                    None => break,
                    Some(Ok((object, part))) => {
                        held += part.segments.len();
                        pass.push((object, part, start));
                    }
                    // A delete removes the parts after the backup object: a
                    // part gone under a restore may mean the backup went.
                    Some(Err(e)) => match self.backup(name) {
                        Err(gone @ RepoError::NoSuchBackup { .. }) => return Err(gone),
                        _ => damaged(name, out, &mut s.damaged, start, len, e.to_string())?,
                    },
                }
            }
            let mut runs = Vec::with_capacity(held);
            for (object, part, start) in &pass {
                let mut at = *start;
                let mut i = 0;
                while i < part.segments.len() {
                    let run = &part.segments[i..i + run_len(&part.segments[i..])];
                    runs.push(Placed {
                        at,
                        recipe: object,
                        run,
                    });
                    at += bytes_of(run);
                    i += run.len();
                }
            }
            runs.sort_unstable_by_key(|p| (p.run[0].container, p.run[0].entry, p.at));
            let read = Reading { frames, whole };
            let before = s.damaged.len();
            self.write_containers(name, &runs, &read, out, &mut s.damaged)?;
            // Containers gone under the pass may mean the backup went (a
            // delete, then a collection).
            if s.damaged.len() > before {
                if let Err(gone @ RepoError::NoSuchBackup { .. }) = self.backup(name) {
                    return Err(gone);
                }
            }
        }
        s.damaged.sort_unstable_by_key(|d| d.offset);
        let mut merged = Vec::with_capacity(s.damaged.len());
        for d in s.damaged {
            note(&mut merged, d.offset, d.len, d.error);
        }
        s.damaged = merged;
        Ok(s)
    }

    /// Restore `runs` (sorted by container) a container at a time on the
    /// thread pool, up to `CONTAINERS_AHEAD` at once, each run written at
    /// its offset by the task that read it.
    fn write_containers(
        &self,
        name: &str,
        runs: &[Placed],
        read: &Reading,
        out: &dyn WriteAt,
        list: &mut Vec<DamagedRange>,
    ) -> RepoResult<()> {
        rayon::in_place_scope(|scope| -> RepoResult<()> {
            let mut ahead = std::collections::VecDeque::new();
            let mut next = runs.chunk_by(|a, b| a.run[0].container == b.run[0].container);
            loop {
                while ahead.len() < CONTAINERS_AHEAD {
                    let Some(group) = next.next() else { break };
                    let (done, result) = std::sync::mpsc::sync_channel(1);
                    scope.spawn(move |_| {
                        let _ = done.send(self.write_container(name, group, read, out));
                    });
                    ahead.push_back(result);
                }
                let Some(result) = ahead.pop_front() else {
                    return Ok(());
                };
                // A task always answers unless it panicked (a bug).
                let lost = result.recv().map_err(|_| RepoError::Io {
                    context: format!("reading the restore of backup {name}"),
                    cause: std::io::Error::other("a reading task died"),
                })??;
                list.extend(lost);
            }
        })
    }

    /// The runs of one container, from the container read whole where it
    /// can be, else run by run; the damaged ranges.
    fn write_container(
        &self,
        name: &str,
        group: &[Placed],
        read: &Reading,
        out: &dyn WriteAt,
    ) -> RepoResult<Vec<DamagedRange>> {
        let id = group[0].run[0].container;
        let raw: u64 = group.iter().map(|p| bytes_of(p.run)).sum();
        let worth =
            group.len() >= WHOLE_MIN_RUNS || raw >= self.config.container_target / WHOLE_MIN_SHARE;
        // Any failure here (too large, missing, damaged) is left to the
        // run-by-run reads, which name it.
        let whole = match read.whole && worth {
            true => Container::read_upto(&*self.store, id, WHOLE_MAX)
                .ok()
                .flatten(),
            false => None,
        };
        let mut lost = Vec::new();
        for p in group {
            let read = match &whole {
                Some(c) if check_run(c.catalog(), p.run, p.recipe).is_ok() => {
                    Ok(c.run(p.run[0].entry as usize, p.run.len()))
                }
                _ => self.read_checked(name, p.recipe, p.run, read.frames),
            };
            lost.extend(write_run(name, p, read, out)?);
        }
        Ok(lost)
    }
}

/// Write a run's segments at their offsets, zeros in place of the damaged
/// ones; the damaged ranges, or the error writing the target.
fn write_run(
    name: &str,
    p: &Placed,
    read: RepoResult<Run>,
    out: &dyn WriteAt,
) -> RepoResult<Vec<DamagedRange>> {
    let mut lost = Vec::new();
    let segments = match read {
        Ok(segments) => segments,
        Err(e) => {
            damaged(name, out, &mut lost, p.at, bytes_of(p.run), e.to_string())?;
            return Ok(lost);
        }
    };
    // One write for the run: a write per segment (8 KiB) cost more in
    // system calls than the copy into one buffer.
    let mut bytes = Vec::with_capacity(bytes_of(p.run) as usize);
    for (s, data) in p.run.iter().zip(segments) {
        let at = p.at + bytes.len() as u64;
        match data {
            Ok(data) => bytes.extend_from_slice(&data),
            Err(e) => {
                note(&mut lost, at, s.len.into(), RepoError::from(e).to_string());
                bytes.resize(bytes.len() + s.len as usize, 0);
            }
        }
    }
    out.write_at(p.at, &bytes).map_err(|e| writing(name, e))?;
    Ok(lost)
}

/// Zeros over `len` damaged bytes at `offset`, listed with why.
fn damaged(
    name: &str,
    out: &dyn WriteAt,
    list: &mut Vec<DamagedRange>,
    offset: u64,
    len: u64,
    error: String,
) -> RepoResult<()> {
    let zeros = &crate::restore::salvage::ZEROS;
    let mut done = 0;
    while done < len {
        let n = (len - done).min(zeros.len() as u64);
        out.write_at(offset + done, &zeros[..n as usize])
            .map_err(|e| writing(name, e))?;
        done += n;
    }
    note(list, offset, len, error);
    Ok(())
}
