//! Restoring a stream backup onto a deduplicating device by fingerprint
//! (issue 39): the device already stores most of what an image of it
//! holds, so a block is only written where the device lacks its bytes.
//!
//! Two passes over the recipe. The first names every block of the image
//! by its segment's whole fingerprint (from the container's catalog,
//! checked against the recipe's reference) and compares it with what the
//! device holds there: the same chunk is left alone, a zero block is
//! trimmed, and any other block is handed to the device to map by
//! fingerprint (a reference to a chunk it stores, no data written). What
//! the device lacks, and every segment that is not one whole block, is
//! noted as wanted. The second pass reads only the wanted segments, each
//! checked as every restore checks them, and writes them through the
//! device's write path. A fingerprint is only ever taken from a catalog
//! whose entry the recipe names; the bytes behind it were checked against
//! it when they were stored, and are again when they are read.
//!
//! Damage costs only the blocks that need it: a recipe part or catalog
//! that cannot be read in the first pass leaves its blocks wanted, and the
//! second pass names the range it cannot restore and writes it as zeros
//! (as a restore to a file does), never leaving the device's old bytes
//! there unnamed.
//!
//! In an encrypted repository whose fingerprints key the plain digest
//! (`config::KeyedOf`), the comparison goes on by turning the device's
//! fingerprints into the repository's; a block the device lacks where it
//! is waits for one walk of the device's map to find its plain
//! fingerprint, then is mapped the same way (`restore::keyed`).
//!
//! Where the device's chunks cannot be the repository's segments (another
//! size or hash, fingerprints keyed over the bytes), every byte is wanted:
//! the image is written whole through the device's write path, which still
//! stores each chunk once, and the report says why.

use std::io;

use dedup_common::fingerprint::Fingerprint;
use serde::Serialize;
use std::collections::HashMap;

use crate::block_map::{BlockMap, BlockState};
use crate::container::Catalog;
use crate::error::repo::{RepoError, RepoResult};
use crate::recipe::SegmentRef;
use crate::repo::Repository;
use crate::restore::keyed::KeyedWaiting;
use crate::restore::salvage::{note, DamagedRange};
use crate::restore::{Piece, Wanted};
use crate::segment_hash::SegmentHash;

/// A deduplicating device as a restore by fingerprint sees it: its map
/// (whose hash `map_known` takes too), and writes.
pub trait BlockTarget: BlockMap {
    /// Point each block at the stored chunk of its fingerprint, where the
    /// device stores one; per block, whether it now holds those bytes.
    fn map_known(&self, blocks: &[(u64, Fingerprint)]) -> io::Result<Vec<bool>>;
    /// Write `data` at byte `offset`.
    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()>;
    /// Make `len` bytes at `offset` read as zeros (a trim).
    fn zero(&self, offset: u64, len: u64) -> io::Result<()>;
    /// Make everything before durable.
    fn flush(&self) -> io::Result<()>;
}

/// What a restore by fingerprint did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct BlocksRestored {
    /// Bytes of the image restored.
    pub bytes: u64,
    /// Whether blocks were named by fingerprint (else the image was
    /// written whole), and why not, when not.
    pub by_fingerprint: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub written_because: Option<String>,
    /// Blocks of the image walked.
    pub blocks: u64,
    /// Blocks the device held already, untouched.
    pub blocks_unchanged: u64,
    /// Blocks pointed at a chunk the device stores: no data written.
    pub blocks_mapped: u64,
    /// Zero blocks trimmed on the device.
    pub blocks_zeroed: u64,
    /// Bytes read from the repository and written to the device.
    pub bytes_written: u64,
    /// Ranges that could not be restored (written as zeros), and why.
    pub damaged: Vec<DamagedRange>,
}

/// Blocks compared and mapped as one step: 4 MiB of 4 KiB blocks.
const STEP_BLOCKS: usize = 1024;
/// Bytes gathered before one write to the device.
const WRITE_BYTES: usize = 1 << 20;

impl Repository {
    /// Restore stream backup `name` onto `target` from its first byte,
    /// writing only what it lacks (see the module comment). The target
    /// must hold at least the image; its blocks past the image are left
    /// as they are. `progress` is told the image's bytes done so far: the
    /// first pass's, then the second's.
    pub fn restore_blocks(
        &self,
        name: &str,
        target: &dyn BlockTarget,
        progress: &mut dyn FnMut(RestorePass, u64),
    ) -> RepoResult<BlocksRestored> {
        let (record, parts) = self.recipe_parts(name)?;
        let record_again = record.clone();
        let len = record.report.bytes_in;
        let bs = target.block_size();
        let io = |what: &str, cause| RepoError::Io {
            context: format!("{what} the device for the restore of backup {name}"),
            cause,
        };
        if len > target.blocks() * u64::from(bs) {
            return Err(io(
                "restoring onto",
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "backup {name} holds {len} bytes and the device only {}: grow it first",
                        target.blocks() * u64::from(bs)
                    ),
                ),
            ));
        }
        let mut r = BlocksRestored {
            bytes: len,
            blocks: len.div_ceil(u64::from(bs)),
            ..BlocksRestored::default()
        };
        let mut wanted = Wanted::default();
        match self.why_not_by_fingerprint(bs, target.hash()) {
            Some(why) => {
                r.written_because = Some(why);
                wanted.push(0..len);
            }
            None => {
                r.by_fingerprint = true;
                let hash = self.segment_hash();
                let mut walk = Walk {
                    repo: self,
                    target,
                    bs: u64::from(bs),
                    hash,
                    zero_fp: hash.of(&vec![0u8; bs as usize]),
                    catalogs: HashMap::new(),
                    keyed: hash.is_keyed().then(KeyedWaiting::default),
                    wanted: &mut wanted,
                    report: &mut r,
                };
                walk.all(parts, &mut |done| progress(RestorePass::Compare, done))
                    .and_then(|()| walk.map_keyed())
                    .map_err(|e| io("mapping", e))?;
            }
        }
        // The same recipe as the first pass's, never one of a backup
        // deleted and made again under the name since.
        let (_, parts) = self.recipe_parts_of(record_again)?;
        let mut at = 0u64;
        let mut pending: Vec<u8> = Vec::with_capacity(WRITE_BYTES);
        let mut pending_at = 0u64;
        let mut damaged = Vec::new();
        let mut written = 0u64;
        let mut put = |pending: &mut Vec<u8>, at: u64| -> RepoResult<()> {
            if !pending.is_empty() {
                target.write(at, pending).map_err(|e| io("writing", e))?;
                written += pending.len() as u64;
                pending.clear();
            }
            Ok(())
        };
        self.restore_pieces(name, parts, Some(&wanted), &mut |piece| {
            match piece {
                Piece::Data(data) => {
                    if pending_at + pending.len() as u64 != at || pending.len() >= WRITE_BYTES {
                        put(&mut pending, pending_at)?;
                        pending_at = at;
                    }
                    pending.extend_from_slice(data);
                    at += data.len() as u64;
                }
                Piece::Skipped(n) => at += n,
                Piece::Damaged(n, e) => {
                    put(&mut pending, pending_at)?;
                    // Only what was to be written: a part that fails now
                    // also covers blocks the first pass left or mapped.
                    for r in wanted.within(&(at..at + n)) {
                        target
                            .zero(r.start, r.end - r.start)
                            .map_err(|e| io("writing", e))?;
                        note(&mut damaged, r.start, r.end - r.start, e.to_string());
                    }
                    at += n;
                }
            }
            progress(RestorePass::Write, at);
            Ok(())
        })?;
        put(&mut pending, pending_at)?;
        target.flush().map_err(|e| io("flushing", e))?;
        r.bytes_written = written;
        r.damaged = damaged;
        Ok(r)
    }
}

/// Which pass a restore by fingerprint's progress is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RestorePass {
    /// Comparing the image's blocks with the device's, mapping by
    /// fingerprint.
    Compare,
    /// Writing what the device lacked.
    Write,
}

/// The first pass: the image's blocks named and compared with the device's.
struct Walk<'a> {
    repo: &'a Repository,
    target: &'a dyn BlockTarget,
    bs: u64,
    /// The repository's: the device's fingerprints are compared as it
    /// names them.
    hash: SegmentHash,
    zero_fp: Fingerprint,
    /// Catalogs of this part, by container (a part names a few).
    catalogs: HashMap<u64, Option<std::sync::Arc<Catalog>>>,
    /// In a keyed repository: the blocks to map once the pass is done,
    /// and the trims held back till then.
    keyed: Option<KeyedWaiting>,
    wanted: &'a mut Wanted,
    report: &'a mut BlocksRestored,
}

/// A block of the image named by its segment's fingerprint.
struct Named {
    block: u64,
    fp: Fingerprint,
}

impl Walk<'_> {
    fn all(
        &mut self,
        mut parts: crate::recipe::parts::RecipeParts,
        progress: &mut dyn FnMut(u64),
    ) -> io::Result<()> {
        let store = &*self.repo.store;
        let mut at = 0u64;
        while let Some(len) = parts.next_part_bytes() {
            match parts.next_part(store) {
                Some(Ok((_, part))) => self.part(at, &part.segments)?,
                // The second pass names the range it cannot read.
                Some(Err(_)) => self.wanted.push(at..at + len),
                None => break,
            }
            at += len;
            self.catalogs.clear();
            progress(at);
        }
        Ok(())
    }

    /// One part of the recipe, from stream offset `at`, a step at a time.
    fn part(&mut self, at: u64, segments: &[SegmentRef]) -> io::Result<()> {
        let mut step: Vec<Named> = Vec::with_capacity(STEP_BLOCKS);
        let mut others: Vec<std::ops::Range<u64>> = Vec::new();
        let mut off = at;
        for s in segments {
            let len = u64::from(s.len);
            match self.whole_block(off, s) {
                Some(fp) => {
                    let block = off / self.bs;
                    // A step is a run of consecutive blocks.
                    if step.last().is_some_and(|n| n.block + 1 != block)
                        || step.len() == STEP_BLOCKS
                    {
                        self.step(&step, &mut others)?;
                        step.clear();
                    }
                    step.push(Named { block, fp });
                }
                None => {
                    if !step.is_empty() {
                        self.step(&step, &mut others)?;
                        step.clear();
                    }
                    others.push(off..off + len);
                }
            }
            off += len;
        }
        self.step(&step, &mut others)?;
        for range in others.drain(..) {
            self.wanted.push(range);
        }
        Ok(())
    }

    /// The fingerprint of segment `s` at stream offset `off`, if it is
    /// one whole block and its catalog can be read and names it.
    fn whole_block(&mut self, off: u64, s: &SegmentRef) -> Option<Fingerprint> {
        if u64::from(s.len) != self.bs || off % self.bs != 0 {
            return None;
        }
        let repo = self.repo;
        let catalog = self
            .catalogs
            .entry(s.container)
            .or_insert_with(|| repo.catalog(s.container).ok())
            .as_ref()?;
        let entry = catalog.entries().get(s.entry as usize)?;
        s.is(&entry.fingerprint, entry.location.raw_len)
            .then_some(entry.fingerprint)
    }

    /// Compare a run of consecutive blocks with the device's and map the
    /// ones it lacks by fingerprint; ranges still wanted go to `others`,
    /// which stays in stream order: a part's ranges that are not blocks
    /// are added as they come, and a step is done before the next is.
    fn step(&mut self, step: &[Named], others: &mut Vec<std::ops::Range<u64>>) -> io::Result<()> {
        let Some(first) = step.first().map(|n| n.block) else {
            return Ok(());
        };
        let states = self.target.map(first, step.len() as u64)?;
        if states.len() != step.len() {
            return Err(io::Error::other(format!(
                "the device answered {} states for {} blocks",
                states.len(),
                step.len()
            )));
        }
        let mut to_map = Vec::new();
        let mut zero_run: Option<(u64, u64)> = None;
        for (n, state) in step.iter().zip(&states) {
            let zero = n.fp == self.zero_fp;
            match (zero, state) {
                (true, BlockState::Zero) => self.report.blocks_unchanged += 1,
                (false, BlockState::Known(fp)) if self.hash.from_plain(fp) == Some(n.fp) => {
                    self.report.blocks_unchanged += 1
                }
                (true, _) => {
                    self.report.blocks_zeroed += 1;
                    zero_run = match zero_run {
                        Some((start, count)) if start + count == n.block => {
                            Some((start, count + 1))
                        }
                        other => {
                            self.zero_blocks(other)?;
                            Some((n.block, 1))
                        }
                    };
                }
                (false, _) => match self.keyed.as_mut() {
                    // The device's index holds plain fingerprints only:
                    // wanted unless `map_keyed` finds the plain one.
                    Some(keyed) => {
                        keyed.wait(n.block, n.fp);
                        want(others, n.block, self.bs)
                    }
                    None => to_map.push((n.block, n.fp)),
                },
            }
        }
        self.zero_blocks(zero_run)?;
        if to_map.is_empty() {
            return Ok(());
        }
        let done = map_known_checked(self.target, &to_map)?;
        for ((block, _), mapped) in to_map.iter().zip(done) {
            match mapped {
                true => self.report.blocks_mapped += 1,
                false => want(others, *block, self.bs),
            }
        }
        Ok(())
    }

    /// Trim a run of blocks (first, count), if any (in a keyed
    /// repository, once `map_keyed` is done).
    fn zero_blocks(&mut self, run: Option<(u64, u64)>) -> io::Result<()> {
        match (run, self.keyed.as_mut()) {
            (None, _) => Ok(()),
            (Some((first, count)), Some(keyed)) => keyed.trim(self.target, first, count),
            (Some((first, count)), None) => self.target.zero(first * self.bs, count * self.bs),
        }
    }

    /// In a keyed repository, after the pass: map the blocks set aside
    /// whose plain fingerprints the device's map gives, and want them no
    /// more.
    fn map_keyed(&mut self) -> io::Result<()> {
        let Some(keyed) = self.keyed.take() else {
            return Ok(());
        };
        let mapped = keyed.resolve(self.target, &self.hash)?;
        self.report.blocks_mapped += mapped.len() as u64;
        self.wanted.remove_blocks(&mapped, self.bs);
        Ok(())
    }
}

/// `target.map_known`, refusing an answer of another length than asked.
pub(super) fn map_known_checked(
    target: &dyn BlockTarget,
    blocks: &[(u64, Fingerprint)],
) -> io::Result<Vec<bool>> {
    let done = target.map_known(blocks)?;
    if done.len() != blocks.len() {
        return Err(io::Error::other(format!(
            "the device answered {} of {} blocks",
            done.len(),
            blocks.len()
        )));
    }
    Ok(done)
}

/// Add block `block` (of `bs` bytes) to the ranges still wanted, joined
/// to the last one where they touch.
fn want(others: &mut Vec<std::ops::Range<u64>>, block: u64, bs: u64) {
    let range = block * bs..(block + 1) * bs;
    match others.last_mut() {
        Some(last) if last.end == range.start => last.end = range.end,
        _ => others.push(range),
    }
}
