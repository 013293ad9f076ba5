//! The write path (Dmdedup §2.4, Figure 2), also used by TRIM and
//! WRITE_ZEROES. Per batch of chunks:
//!
//! 1. lock the batch's LBN stripes; build each chunk's new image (partial
//!    chunks by read-modify-write: their mappings looked up under the
//!    metadata mutex, once for the batch, and read through the placement);
//! 2. drop all-zero chunks from storage; fingerprint the rest (no global lock);
//! 3. lock the fingerprint stripes, then under the metadata mutex (phase A)
//!    pin every chunk found in the hash index (+1) and allocate an address
//!    (count 1) for every new content, unless the placement wants the
//!    compressed form first;
//! 4. outside the mutex: compress the new chunks (a placement that packs
//!    or embeds them wants it), compare bytes on hits (verify mode); then,
//!    only if something is left to place, allocate for it under the mutex
//!    (phase A2); then hand the new chunks to the placement (`write`);
//! 5. under the mutex again (phase B) apply Figure 2's branches to the LBN
//!    map, hash index and reference counts, and ask whether to commit.
//!
//! So a batch takes the metadata mutex at most three times: phase A, phase
//! A2 (only when chunks wait for their compressed form, or a verify-mode
//! collision needs a chunk of its own) and phase B. A batch with partial
//! chunks takes it once more before phase A to look them up, and to stay
//! within three it compresses every chunk up front instead of only the new
//! ones (so phase A can allocate at once); only such a batch that also
//! meets a verify-mode collision takes it a fourth time.
//!
//! Data is written before any metadata that names it, and pins keep garbage
//! collection away from chunks between the phases.

use std::borrow::Cow;
use std::sync::atomic::Ordering;

use rustc_hash::FxHashMap;
use tracing::error;

use super::chunking::{self, Piece};
use super::{Engine, Meta};
use crate::config::{Lbn, Pbn};
use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::placement::NewChunk;
use crate::stats::Counters;

/// Times a batch that found the device full is retried after making room.
const RECLAIM_ATTEMPTS: u32 = 8;
/// The same for one chunk, once its batch kept losing the room it made:
/// each retry follows a reclaim that found room, so running out of them
/// means other writers took it that often.
const CHUNK_RECLAIM_ATTEMPTS: u32 = 1024;

/// Where the new bytes of a request come from.
#[derive(Clone, Copy)]
pub(crate) enum Source<'a> {
    /// A client WRITE.
    Bytes(&'a [u8]),
    /// TRIM/discard or WRITE_ZEROES: the range reads back as zeros.
    Zeros,
}

/// Whether a write batch waits for a commit that holds the commit gate or
/// waits for it, or gives up at once (nothing done).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum GateWait {
    Wait,
    Refuse,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Plan {
    /// All zeros: unmap, store nothing.
    Zero,
    /// Not yet looked up.
    Unplanned,
    /// Content already stored at this PBN (pinned with +1 in phase A).
    Hit(Pbn),
    /// New content, written to this freshly allocated PBN (count 1).
    New(Pbn),
    /// New content whose address phase A2 gives, once it is compressed.
    NewLater,
    /// Same content as an earlier `New`/`NewLater` chunk of this batch.
    SameAsNew(usize),
    /// Verify mode: the fingerprint matched the chunk `pinned` (or, with
    /// `None`, an earlier new chunk of this batch) but the bytes did not.
    /// Stored apart at `stored` (given in phase A2) with no index entry,
    /// referenced by its LBN only, and freed as soon as that LBN moves on.
    Collision {
        pinned: Option<Pbn>,
        stored: Option<Pbn>,
    },
}

struct Chunk<'a> {
    lbn: Lbn,
    data: Cow<'a, [u8]>,
    fp: Option<Fingerprint>,
    /// The chunk compressed with the device's codec, for a placement that
    /// wants it (computed outside the metadata mutex).
    compressed: Option<Vec<u8>>,
    plan: Plan,
}

/// A request that changes data, for its counters (write-back queues
/// these and performs them later).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mutation {
    Write,
    Discard,
    WriteZeroes,
}

impl Engine {
    /// Apply a write (`buf`), TRIM/discard or WRITE_ZEROES now; with
    /// `fua`, durable before returning. Trim and write-zeroes both make
    /// the range read back as zeros: whole chunks are unmapped and their
    /// references dropped (Dmdedup §2.4), partial chunks get zeros over
    /// the covered bytes; they are counted apart so users can tell which
    /// their clients send.
    pub(crate) fn mutate(
        &self,
        what: Mutation,
        offset: u64,
        len: u64,
        buf: &[u8],
        fua: bool,
    ) -> Result<()> {
        let _g = self.enter()?;
        self.check_range(offset, len)?;
        self.perform(what, offset, len, buf)?;
        if fua {
            self.flush_entered()?;
        }
        Ok(())
    }

    /// Count and apply one mutation whose range was checked (`buf` is the
    /// data of a write, empty otherwise).
    pub(crate) fn perform(&self, what: Mutation, offset: u64, len: u64, buf: &[u8]) -> Result<()> {
        self.perform_unless(what, offset, len, buf, GateWait::Wait)
            .map(|_| ())
    }

    /// `perform`, unless a commit holds the commit gate or waits for it
    /// when the first batch would start: then nothing is done or counted
    /// and it returns false. Write-back then queues the write instead of
    /// letting it wait out the commit's syncs (`Device::mutate`).
    pub(crate) fn perform_unless_committing(
        &self,
        what: Mutation,
        offset: u64,
        len: u64,
        buf: &[u8],
    ) -> Result<bool> {
        self.perform_unless(what, offset, len, buf, GateWait::Refuse)
    }

    fn perform_unless(
        &self,
        what: Mutation,
        offset: u64,
        len: u64,
        buf: &[u8],
        gate: GateWait,
    ) -> Result<bool> {
        let c = &self.counters;
        let (requests, src, len) = match what {
            Mutation::Write => (&c.write_requests, Source::Bytes(buf), buf.len()),
            Mutation::Discard => (&c.discard_requests, Source::Zeros, len as usize),
            Mutation::WriteZeroes => (&c.write_zeroes_requests, Source::Zeros, len as usize),
        };
        // Counted once the first batch is done (or failed), before any
        // commit it asks for: a commit never persists a mutation's effect
        // without its count, and a refused one is not counted at all.
        let count = || {
            Counters::add(requests, 1);
            if what == Mutation::Write {
                Counters::add(&c.bytes_written, len as u64);
            }
        };
        self.apply(offset, len, src, gate, count)
    }

    /// Apply the batches of a mutation; false if `gate` refused the first
    /// (later ones always wait: the mutation is then under way). `count`
    /// runs once unless refused: after the first batch, before its commit.
    fn apply(
        &self,
        offset: u64,
        len: usize,
        src: Source,
        mut gate: GateWait,
        count: impl FnOnce(),
    ) -> Result<bool> {
        let cs = self.cfg.chunk_size as usize;
        let pieces = chunking::pieces(offset, len, cs);
        let mut count = Some(count);
        for batch in pieces.chunks(chunking::batch_chunks(cs)) {
            let wants_commit = self.write_making_room(batch, src, gate);
            if !matches!(wants_commit, Ok(None)) {
                if let Some(count) = count.take() {
                    count();
                }
            }
            let wants_commit = wants_commit.inspect_err(|e| {
                if matches!(e, Error::NoSpace { .. }) {
                    Counters::add(&self.counters.nospace_errors, 1);
                }
            })?;
            let Some(wants_commit) = wants_commit else {
                return Ok(false);
            };
            gate = GateWait::Wait;
            self.commit_if_wanted(wants_commit)?;
        }
        // A zero-length mutation has no batch but is still a request.
        if let Some(count) = count {
            count();
        }
        Ok(true)
    }

    /// A batch, making room when the device is full (GC, and a commit to
    /// release what it freed) and trying again. Concurrent writers may take
    /// the room first; a batch that keeps losing it goes on chunk by chunk,
    /// each needing at most one new chunk, so it fails with ENOSPC only
    /// when no room can be made at all.
    fn write_making_room(
        &self,
        batch: &[Piece],
        src: Source<'_>,
        gate: GateWait,
    ) -> Result<Option<bool>> {
        match self.write_retrying(batch, src, RECLAIM_ATTEMPTS, gate) {
            Err(Error::NoSpace { .. }) if batch.len() > 1 => {
                let mut wants_commit = false;
                for one in batch.chunks(1) {
                    wants_commit |= self
                        .write_retrying(one, src, CHUNK_RECLAIM_ATTEMPTS, GateWait::Wait)?
                        .unwrap_or(false);
                }
                Ok(Some(wants_commit))
            }
            other => other,
        }
    }

    /// `write_batch`, making room and trying again up to `attempts` times
    /// while making room finds any.
    fn write_retrying(
        &self,
        batch: &[Piece],
        src: Source<'_>,
        attempts: u32,
        gate: GateWait,
    ) -> Result<Option<bool>> {
        let mut tried = 0;
        loop {
            match self.write_batch(batch, src, gate) {
                Err(Error::NoSpace { .. }) if tried < attempts && self.reclaim_for_space()? => {
                    tried += 1;
                    // Let the writers that took the room finish with it.
                    std::thread::yield_now();
                }
                other => return other,
            }
        }
    }

    /// One batch under its locks. Returns whether a commit is wanted, or
    /// `None` if `gate` refused to wait for a commit (nothing was done).
    fn write_batch(
        &self,
        pieces: &[Piece],
        src: Source<'_>,
        gate: GateWait,
    ) -> Result<Option<bool>> {
        let cs = self.cfg.chunk_size as usize;
        let _lbn_guards = self.lbn_locks.write_many(pieces.iter().map(|p| p.lbn));
        // No commit may capture this batch half-applied.
        let _batch = match gate {
            GateWait::Wait => self.commit_gate.read(),
            GateWait::Refuse => match self.commit_gate.try_read() {
                Some(batch) => batch,
                None => return Ok(None),
            },
        };
        self.group.batch();

        let partial = pieces.iter().any(|p| !p.is_full(cs));
        let mut images = if partial {
            self.read_for_update(pieces)?
        } else {
            FxHashMap::default()
        };
        let mut chunks = Vec::with_capacity(pieces.len());
        for p in pieces {
            let data: Cow<[u8]> = match src {
                Source::Bytes(b) if p.is_full(cs) => Cow::Borrowed(&b[p.in_buf.clone()]),
                Source::Zeros if p.is_full(cs) => Cow::Borrowed(&[]),
                _ => {
                    let mut image = images.remove(&p.lbn).expect("read for update");
                    match src {
                        Source::Bytes(b) => {
                            image[p.in_chunk.clone()].copy_from_slice(&b[p.in_buf.clone()])
                        }
                        Source::Zeros => image[p.in_chunk.clone()].fill(0),
                    }
                    Cow::Owned(image)
                }
            };
            let zero = data.is_empty() || chunking::is_zero(&data);
            chunks.push(Chunk {
                lbn: p.lbn,
                fp: None,
                compressed: None,
                plan: if zero { Plan::Zero } else { Plan::Unplanned },
                data,
            });
        }
        self.fingerprint(&mut chunks);
        if let Source::Bytes(_) = src {
            Counters::add(&self.counters.writes, chunks.len() as u64);
        }
        let compress = self.placement.compresses();
        // With a read-modify-write lookup taken already, compress up front
        // so phase A can place new chunks at once (see the module comment).
        let defer = compress && !partial;
        if compress && !defer {
            self.compress(chunks.iter_mut().filter(|c| c.fp.is_some()));
        }

        let _fp_guards = self
            .fp_locks
            .lock_many(chunks.iter().filter_map(|c| c.fp.map(|f| f.prefix_u64())));
        {
            let mut m = self.meta.lock();
            if let Err(e) = self.phase_a(&mut m, &mut chunks, defer) {
                self.undo_pins(&mut m, &chunks);
                return Err(e);
            }
        }
        // Chunks found absent under their fingerprint stripes, still held,
        // stay absent: entries are only added under the stripe.
        self.compress(chunks.iter_mut().filter(|c| c.plan == Plan::NewLater));
        let placed = self.verify_hits(&mut chunks).and_then(|_| {
            if chunks.iter().any(|c| c.unplaced()) {
                let mut m = self.meta.lock();
                self.phase_a2(&mut m, &mut chunks)?;
            }
            self.write_new(&chunks)
        });
        if let Err(e) = placed {
            self.undo_pins(&mut self.meta.lock(), &chunks);
            return Err(e);
        }
        let mut m = self.meta.lock();
        self.phase_b(&mut m, &chunks, src)?;
        Ok(Some(
            m.store.wants_commit() || self.placement.wants_commit(),
        ))
    }

    /// The current bytes of the partial chunks of a batch, for
    /// read-modify-write: one metadata-mutex hold for their mappings, then
    /// reads through the placement. The caller holds the LBNs' stripes
    /// exclusively, so the mappings cannot change meanwhile.
    fn read_for_update(&self, pieces: &[Piece]) -> Result<FxHashMap<Lbn, Vec<u8>>> {
        let cs = self.cfg.chunk_size as usize;
        let partial: Vec<&Piece> = pieces.iter().filter(|p| !p.is_full(cs)).collect();
        let mut images = FxHashMap::with_capacity_and_hasher(partial.len(), Default::default());
        let mapped: Vec<Option<Pbn>> = {
            let mut m = self.meta.lock();
            partial
                .iter()
                .map(|p| m.store.lbn_map_lookup(p.lbn))
                .collect::<Result<_>>()?
        };
        for (p, pbn) in partial.iter().zip(mapped) {
            let mut image = vec![0u8; cs];
            if let Some(pbn) = pbn {
                self.read_pbn(pbn, &mut image)?;
                Counters::add(&self.counters.rmw_reads, 1);
            }
            images.insert(p.lbn, image);
        }
        Ok(images)
    }

    /// Phase A: look every fingerprint up; pin hits; allocate for new
    /// content, or (`defer`) leave it for phase A2 once compressed.
    fn phase_a(&self, m: &mut Meta, chunks: &mut [Chunk], defer: bool) -> Result<()> {
        let mut batch_new: FxHashMap<Fingerprint, usize> = FxHashMap::default();
        let mut allocated = false;
        for fp in chunks.iter().filter_map(|c| c.fp.as_ref()) {
            m.store.touch_for_lookup(fp);
        }
        for (i, c) in chunks.iter_mut().enumerate() {
            let Some(fp) = c.fp else { continue };
            if let Some(&j) = batch_new.get(&fp) {
                c.plan = Plan::SameAsNew(j);
                continue;
            }
            c.plan = match m.store.hash_index_lookup(&fp)? {
                Some(pbn) => {
                    m.pin(pbn)?;
                    Plan::Hit(pbn)
                }
                None => {
                    batch_new.insert(fp, i);
                    if defer {
                        Plan::NewLater
                    } else {
                        allocated = true;
                        Plan::New(self.alloc(m, &c.data, c.compressed.as_deref())?)
                    }
                }
            };
        }
        if allocated {
            self.note_space(self.space(m).used);
        }
        Ok(())
    }

    /// Phase A2: addresses for what phase A left unplaced (new chunks now
    /// compressed, verify-mode collisions).
    fn phase_a2(&self, m: &mut Meta, chunks: &mut [Chunk]) -> Result<()> {
        for c in chunks.iter_mut() {
            let plan = match c.plan {
                Plan::NewLater => Plan::New(self.alloc(m, &c.data, c.compressed.as_deref())?),
                Plan::Collision {
                    pinned,
                    stored: None,
                } => Plan::Collision {
                    pinned,
                    stored: Some(self.alloc(m, &c.data, c.compressed.as_deref())?),
                },
                other => other,
            };
            c.plan = plan;
        }
        self.note_space(self.space(m).used);
        Ok(())
    }

    /// Allocate an address for a chunk (and its compressed form, if any),
    /// or fail with `NoSpace` (the caller makes room and retries).
    fn alloc(&self, m: &mut Meta, data: &[u8], compressed: Option<&[u8]>) -> Result<Pbn> {
        self.placement
            .alloc(m.store.as_mut(), data, compressed)?
            .ok_or(Error::NoSpace {
                total_chunks: self.cfg.physical_chunks,
            })
    }

    /// Fingerprint every non-zero chunk (no lock held), all at once: BLAKE3
    /// then hashes the batch's chunks side by side in its SIMD lanes (a 4
    /// KiB chunk alone fills 4 of AVX-512's 16).
    fn fingerprint(&self, chunks: &mut [Chunk]) {
        let data: Vec<&[u8]> = (chunks.iter())
            .filter(|c| c.plan != Plan::Zero)
            .map(|c| &c.data[..])
            .collect();
        let fps = self.cfg.hash.fingerprint_many(&data);
        drop(data);
        let hashed = chunks.iter_mut().filter(|c| c.plan != Plan::Zero);
        for (c, fp) in hashed.zip(fps) {
            c.fp = Some(fp);
        }
    }

    /// Compress these chunks with the device's codec (no lock held).
    fn compress<'c, 'a: 'c>(&self, chunks: impl Iterator<Item = &'c mut Chunk<'a>>) {
        let codec = self.cfg.compression;
        if codec.is_none() {
            return;
        }
        for c in chunks {
            c.compressed = codec.compress_chunk(&c.data);
        }
    }

    /// Drop one reference. A chunk left with count 1 is held by the hash
    /// index alone: garbage for the next collection.
    pub(super) fn release(&self, m: &mut Meta, pbn: Pbn) -> Result<()> {
        if m.release(self.placement.as_ref(), pbn)? == 1 {
            self.releases.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Verify mode: a fingerprint match shares a chunk only if the bytes
    /// match, whether the match is on disk or earlier in this batch.
    fn verify_hits(&self, chunks: &mut [Chunk]) -> Result<()> {
        if !self.cfg.verify {
            return Ok(());
        }
        let mut stored = vec![0u8; self.cfg.chunk_size as usize];
        for i in 0..chunks.len() {
            let differs = match chunks[i].plan {
                Plan::Hit(pbn) => {
                    self.read_pbn(pbn, &mut stored)?;
                    stored[..] != chunks[i].data[..]
                }
                Plan::SameAsNew(j) => chunks[j].data[..] != chunks[i].data[..],
                _ => false,
            };
            if differs {
                Counters::add(&self.counters.verify_mismatches, 1);
                let pinned = match chunks[i].plan {
                    Plan::Hit(pbn) => Some(pbn),
                    _ => None,
                };
                let c = &mut chunks[i];
                if c.compressed.is_none() && self.placement.compresses() {
                    c.compressed = self.cfg.compression.compress_chunk(&c.data);
                }
                c.plan = Plan::Collision {
                    pinned,
                    stored: None,
                };
            }
        }
        Ok(())
    }

    /// Hand the batch's new chunks to the placement (outside the mutex).
    fn write_new(&self, chunks: &[Chunk]) -> Result<()> {
        // A one-chunk batch (4 KiB requests) needs no list on the heap.
        let one;
        let many: Vec<NewChunk>;
        let news: &[NewChunk] = match chunks {
            [c] => match c.new_chunk() {
                Some(n) => {
                    one = n;
                    std::slice::from_ref(&one)
                }
                None => &[],
            },
            _ => {
                many = chunks.iter().filter_map(Chunk::new_chunk).collect();
                &many
            }
        };
        if news.is_empty() {
            return Ok(());
        }
        let bytes = self.placement.write(news)?;
        Counters::add(&self.counters.data_bytes_written, bytes);
        Ok(())
    }

    /// Phase B: Figure 2's metadata updates, chunk by chunk. If the store
    /// fails part-way, the chunks not yet applied give back their pins.
    fn phase_b(&self, m: &mut Meta, chunks: &[Chunk], src: Source<'_>) -> Result<()> {
        for i in 0..chunks.len() {
            if let Err(e) = self.apply_chunk(m, chunks, i, src) {
                self.undo_pins(m, &chunks[i + 1..]);
                return Err(e);
            }
        }
        Ok(())
    }

    fn apply_chunk(&self, m: &mut Meta, chunks: &[Chunk], i: usize, src: Source<'_>) -> Result<()> {
        let c = &self.counters;
        let p = self.placement.as_ref();
        let lbn = chunks[i].lbn;
        let fp = chunks[i].fp;
        let target = match chunks[i].plan {
            Plan::Zero => {
                let old = m.unmap(p, lbn)?;
                if let Some(o) = old {
                    self.release(m, o)?;
                }
                match src {
                    Source::Bytes(_) => {
                        Counters::add(&c.zero_writes, 1);
                        Counters::add(&c.overwrites, old.is_some() as u64);
                    }
                    Source::Zeros => Counters::add(&c.discarded_chunks, old.is_some() as u64),
                }
                return Ok(());
            }
            Plan::Hit(pbn) if m.store.lbn_map_lookup(lbn)? == Some(pbn) => {
                // Rewrite of the data already there: drop the pin, change nothing.
                self.release(m, pbn)?;
                Counters::add(&c.duplicate_writes, 1);
                Counters::add(&c.rewrites, 1);
                return Ok(());
            }
            Plan::Hit(pbn) => {
                // Duplicate to a new LBN or over a different old LBN: the pin
                // becomes the LBN map's reference.
                Counters::add(&c.duplicate_writes, 1);
                pbn
            }
            Plan::New(pbn) => {
                // Dmdedup §2.4: +2, referenced from hash index and LBN map;
                // alloc gave the index's 1, this is the LBN's.
                m.index(fp.as_ref().expect("a New chunk has a fingerprint"), pbn)?;
                m.store.refcount_inc(pbn)?;
                Counters::add(&c.unique_writes, 1);
                pbn
            }
            Plan::SameAsNew(j) => {
                let Plan::New(pbn) = chunks[j].plan else {
                    unreachable!("SameAsNew always points at a New chunk")
                };
                m.store.refcount_inc(pbn)?;
                Counters::add(&c.duplicate_writes, 1);
                pbn
            }
            Plan::Collision { pinned, stored } => {
                // Unpin; the chunk's own copy (count 1, no index entry) is
                // the LBN's reference.
                if let Some(pinned) = pinned {
                    self.release(m, pinned)?;
                }
                Counters::add(&c.unique_writes, 1);
                stored.expect("phase A2 stores every collision")
            }
            Plan::Unplanned | Plan::NewLater => {
                unreachable!("phases A and A2 plan every non-zero chunk")
            }
        };
        if let Some(o) = m.map(p, lbn, target, fp.as_ref())? {
            self.release(m, o)?;
            Counters::add(&c.overwrites, 1);
        }
        Ok(())
    }

    /// Give back what phases A and A2 took (pins and allocations) after a
    /// failure, so a failed write changes no reference count.
    fn undo_pins(&self, m: &mut Meta, chunks: &[Chunk]) {
        for c in chunks {
            let taken = match c.plan {
                Plan::Hit(pbn) | Plan::New(pbn) => [Some(pbn), None],
                Plan::Collision { pinned, stored } => [pinned, stored],
                _ => [None, None],
            };
            for pbn in taken.into_iter().flatten() {
                if let Err(e) = self.release(m, pbn) {
                    error!("while undoing a failed write: {e}");
                }
            }
        }
    }
}

impl Chunk<'_> {
    /// The chunk as the placement's `write` takes it, if it was given an
    /// address of its own.
    fn new_chunk(&self) -> Option<NewChunk<'_>> {
        match self.plan {
            Plan::New(pbn)
            | Plan::Collision {
                stored: Some(pbn), ..
            } => Some(NewChunk {
                pbn,
                data: &self.data,
                compressed: self.compressed.as_deref(),
            }),
            _ => None,
        }
    }

    /// Left by phase A for phase A2.
    fn unplaced(&self) -> bool {
        matches!(
            self.plan,
            Plan::NewLater | Plan::Collision { stored: None, .. }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::Mutation;
    use crate::testrig::MemDevice;

    const CS: usize = 4096;

    /// A write that may not wait for a commit does nothing while one holds
    /// the commit gate (no data, no counters), and is applied once the
    /// gate is free: `Device::mutate` relies on both to queue it instead.
    #[test]
    fn a_write_that_may_not_wait_for_a_commit_does_nothing_during_one() {
        let mem = MemDevice::new(CS as u32, 16, 16);
        let dev = mem.open().unwrap();
        let e = &dev.engine;
        let data = vec![7u8; CS];
        {
            let _commit = e.commit_gate.write();
            let applied = e.perform_unless_committing(Mutation::Write, 0, CS as u64, &data);
            assert!(!applied.unwrap());
        }
        let counters = dev.stats().counters;
        assert_eq!((counters.write_requests, counters.bytes_written), (0, 0));
        let mut got = vec![1u8; CS];
        dev.read(0, &mut got).unwrap();
        assert_eq!(got, vec![0u8; CS], "nothing was written");

        let applied = e.perform_unless_committing(Mutation::Write, 0, CS as u64, &data);
        assert!(applied.unwrap());
        let counters = dev.stats().counters;
        assert_eq!(
            (counters.write_requests, counters.bytes_written),
            (1, CS as u64)
        );
        dev.read(0, &mut got).unwrap();
        assert_eq!(got, data);
        // A write of several batches goes on once its first is applied.
        let big = vec![9u8; 16 * CS];
        let applied = e.perform_unless_committing(Mutation::Write, 0, big.len() as u64, &big);
        assert!(applied.unwrap());
        let mut all = vec![0u8; 16 * CS];
        dev.read(0, &mut all).unwrap();
        assert_eq!(all, big);
        assert!(dev.check(true).unwrap().is_clean());
    }
}
