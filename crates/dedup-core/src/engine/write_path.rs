//! The write path (Dmdedup §2.4, Figure 2), also used by TRIM and
//! WRITE_ZEROES. Per batch of chunks:
//!
//! 1. lock the batch's LBN stripes; build each chunk's new image (partial
//!    chunks by read-modify-write);
//! 2. drop all-zero chunks from storage; fingerprint the rest (no global lock);
//! 3. lock the fingerprint stripes, then under the metadata mutex (phase A)
//!    pin every chunk found in the hash index (+1) and allocate a PBN (count 1)
//!    for every new content;
//! 4. outside the mutex: compare bytes on hits (verify mode) and write the new
//!    chunks, coalescing consecutive PBNs into one I/O;
//! 5. under the mutex again (phase B) apply Figure 2's branches to the LBN map,
//!    hash index and reference counts.
//!
//! Data is written before any metadata that names it, and pins keep garbage
//! collection away from chunks between the two phases.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::Ordering;

use tracing::error;

use super::chunking::{self, Piece};
use super::Engine;
use crate::backend::MetadataBackend;
use crate::config::{Lbn, Pbn};
use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::stats::Counters;

/// Times a batch that found the device full is retried after making room.
const RECLAIM_ATTEMPTS: u32 = 8;

/// Where the new bytes of a request come from.
#[derive(Clone, Copy)]
pub(crate) enum Source<'a> {
    /// A client WRITE.
    Bytes(&'a [u8]),
    /// TRIM/discard or WRITE_ZEROES: the range reads back as zeros.
    Zeros,
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
    /// Same content as an earlier `New` chunk of this batch (its index).
    SameAsNew(usize),
    /// Verify mode: the fingerprint matched this PBN but the bytes did not.
    Collision(Pbn),
    /// Verify mode: same fingerprint as an earlier new chunk of this batch,
    /// different bytes. Nothing pinned; stored apart like a collision.
    Apart,
}

struct Chunk<'a> {
    lbn: Lbn,
    data: Cow<'a, [u8]>,
    fp: Option<Fingerprint>,
    /// For a backend that places data: the chunk compressed with the
    /// device's codec, if it is new and that makes it smaller (computed
    /// outside the metadata mutex).
    compressed: Option<Vec<u8>>,
    /// `compress_new` found the hash index without this content, under
    /// the fingerprint stripe still held: phase A need not look again.
    known_new: bool,
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
        let c = &self.counters;
        match what {
            Mutation::Write => {
                Counters::add(&c.write_requests, 1);
                Counters::add(&c.bytes_written, len);
                self.apply(offset, buf.len(), Source::Bytes(buf))
            }
            Mutation::Discard | Mutation::WriteZeroes => {
                let requests = match what {
                    Mutation::Discard => &c.discard_requests,
                    _ => &c.write_zeroes_requests,
                };
                Counters::add(requests, 1);
                self.apply(offset, len as usize, Source::Zeros)
            }
        }
    }

    fn apply(&self, offset: u64, len: usize, src: Source) -> Result<()> {
        let cs = self.cfg.chunk_size as usize;
        let pieces = chunking::pieces(offset, len, cs);
        for batch in pieces.chunks(chunking::batch_chunks(cs)) {
            // Full: make room (GC, and a commit to release what it freed),
            // then try again; concurrent writers may take the room first.
            let mut attempts = 0;
            let wants_commit = loop {
                match self.write_batch(batch, src) {
                    Err(Error::NoSpace { .. })
                        if attempts < RECLAIM_ATTEMPTS && self.reclaim_for_space()? =>
                    {
                        attempts += 1
                    }
                    other => break other,
                }
            }
            .inspect_err(|e| {
                if matches!(e, Error::NoSpace { .. }) {
                    Counters::add(&self.counters.nospace_errors, 1);
                }
            })?;
            self.commit_if_wanted(wants_commit)?;
        }
        Ok(())
    }

    /// One batch under its locks. Returns whether the backend wants a commit.
    fn write_batch(&self, pieces: &[Piece], src: Source<'_>) -> Result<bool> {
        let cs = self.cfg.chunk_size as usize;
        let _lbn_guards = self.lbn_locks.write_many(pieces.iter().map(|p| p.lbn));
        // No commit may capture this batch half-applied.
        let _batch = self.commit_gate.read();

        let mut chunks = Vec::with_capacity(pieces.len());
        for p in pieces {
            let data: Cow<[u8]> = match src {
                Source::Bytes(b) if p.is_full(cs) => Cow::Borrowed(&b[p.in_buf.clone()]),
                Source::Zeros if p.is_full(cs) => Cow::Borrowed(&[]),
                _ => {
                    let mut image = self.read_chunk_for_update(p.lbn)?;
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
                known_new: false,
                plan: if zero { Plan::Zero } else { Plan::Unplanned },
                data,
            });
        }
        self.fingerprint(&mut chunks);
        if let Source::Bytes(_) = src {
            Counters::add(&self.counters.writes, chunks.len() as u64);
        }

        let _fp_guards = self
            .fp_locks
            .lock_many(chunks.iter().filter_map(|c| c.fp.map(|f| f.prefix_u64())));
        self.compress_new(&mut chunks)?;

        {
            let mut m = self.meta.lock();
            if let Err(e) = self.phase_a(&mut **m, &mut chunks) {
                self.undo_pins(&mut **m, &chunks);
                return Err(e);
            }
        }
        if let Err(e) = self
            .verify_hits(&mut chunks)
            .and_then(|_| self.write_new(&chunks))
        {
            self.undo_pins(&mut **self.meta.lock(), &chunks);
            return Err(e);
        }
        self.phase_b(&chunks, src)?;
        self.store_collisions(&chunks)?;
        Ok(self.meta.lock().wants_commit())
    }

    /// The current bytes of a chunk, for read-modify-write. The caller holds
    /// the LBN's stripe exclusively, so the mapping cannot change meanwhile.
    fn read_chunk_for_update(&self, lbn: Lbn) -> Result<Vec<u8>> {
        let mut image = vec![0u8; self.cfg.chunk_size as usize];
        let mapped = self.meta.lock().lbn_map_lookup(lbn)?;
        if let Some(pbn) = mapped {
            self.read_pbn(pbn, &mut image)?;
            Counters::add(&self.counters.rmw_reads, 1);
        }
        Ok(image)
    }

    /// Phase A: look every fingerprint up; pin hits, allocate for new content.
    fn phase_a(&self, m: &mut dyn MetadataBackend, chunks: &mut [Chunk]) -> Result<()> {
        let mut batch_new: HashMap<Fingerprint, usize> = HashMap::new();
        for (i, chunk) in chunks.iter_mut().enumerate() {
            let Some(fp) = chunk.fp else { continue };
            if let Some(&j) = batch_new.get(&fp) {
                chunk.plan = Plan::SameAsNew(j);
                continue;
            }
            // Absent before means absent now: entries for this content are
            // only added under its fingerprint stripe, which this batch
            // holds, and GC only removes them.
            let stored = match chunk.known_new {
                true => None,
                false => m.hash_index_lookup(&fp)?,
            };
            chunk.plan = match stored {
                Some(pbn) => {
                    m.refcount_inc(pbn)?;
                    Plan::Hit(pbn)
                }
                None => {
                    batch_new.insert(fp, i);
                    Plan::New(self.alloc(m, &chunk.data, chunk.compressed.as_deref())?)
                }
            };
        }
        self.note_space(super::data_space(m).0);
        Ok(())
    }

    /// Allocate a PBN for a chunk (and its compressed form, if any), or
    /// fail with `NoSpace` (the caller makes room and retries).
    fn alloc(
        &self,
        m: &mut dyn MetadataBackend,
        data: &[u8],
        compressed: Option<&[u8]>,
    ) -> Result<Pbn> {
        m.alloc_pbn_for(data, compressed)?.ok_or(Error::NoSpace {
            total_chunks: self.cfg.physical_chunks,
        })
    }

    /// Fingerprint every non-zero chunk (no lock held).
    fn fingerprint(&self, chunks: &mut [Chunk]) {
        let hash = self.cfg.hash;
        for c in chunks.iter_mut().filter(|c| c.plan != Plan::Zero) {
            c.fp = Some(hash.fingerprint(&c.data));
        }
    }

    /// For a backend that places data: compress the chunks whose content
    /// the hash index does not hold yet (the caller holds their
    /// fingerprint stripes, so none can be stored meanwhile), outside the
    /// metadata mutex. Duplicates cost no compression.
    fn compress_new(&self, chunks: &mut [Chunk]) -> Result<()> {
        let codec = self.cfg.compression;
        if !self.places_data || codec.is_none() {
            return Ok(());
        }
        {
            let mut m = self.meta.lock();
            let mut seen = std::collections::HashSet::new();
            for c in chunks.iter_mut() {
                let Some(fp) = c.fp else { continue };
                c.known_new = seen.insert(fp) && m.hash_index_lookup(&fp)?.is_none();
            }
        }
        for c in chunks.iter_mut().filter(|c| c.known_new) {
            c.compressed = codec.compress(&c.data);
        }
        Ok(())
    }

    /// Drop one reference. A chunk left with count 1 is held by the hash
    /// index alone: garbage for the next collection.
    fn release(&self, m: &mut dyn MetadataBackend, pbn: Pbn) -> Result<()> {
        if m.refcount_dec(pbn)? == 1 {
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
                chunks[i].plan = match chunks[i].plan {
                    Plan::Hit(pbn) => Plan::Collision(pbn),
                    _ => Plan::Apart,
                };
            }
        }
        Ok(())
    }

    /// Write the batch's new chunks; consecutive PBNs go out as one I/O.
    /// A backend that places data takes them instead.
    fn write_new(&self, chunks: &[Chunk]) -> Result<()> {
        let news: Vec<(Pbn, &[u8])> = if self.places_data {
            // The backend takes each chunk, or names the block the engine
            // writes it to (outside the mutex, below).
            let mut m = self.meta.lock();
            let mut raw = Vec::new();
            for c in chunks {
                if let Plan::New(pbn) = c.plan {
                    let stored = c.compressed.as_ref().map_or(c.data.len(), Vec::len);
                    match m.stage_chunk(pbn, &c.data, c.compressed.clone())? {
                        Some(block) => raw.push((block, &c.data[..])),
                        None => Counters::add(&self.counters.data_bytes_written, stored as u64),
                    }
                }
            }
            raw
        } else {
            chunks
                .iter()
                .filter_map(|c| match c.plan {
                    Plan::New(pbn) => Some((pbn, &c.data[..])),
                    _ => None,
                })
                .collect()
        };
        let mut staging = Vec::new();
        let mut i = 0;
        while i < news.len() {
            let mut j = i + 1;
            while j < news.len() && news[j].0 == news[j - 1].0 + 1 {
                j += 1;
            }
            let offset = self.cfg.pbn_offset(news[i].0);
            if j == i + 1 {
                self.data.write_at(news[i].1, offset)?;
            } else {
                staging.clear();
                for (_, d) in &news[i..j] {
                    staging.extend_from_slice(d);
                }
                self.data.write_at(&staging, offset)?;
            }
            i = j;
        }
        let bytes = news.len() as u64 * self.cfg.chunk_size as u64;
        Counters::add(&self.counters.data_bytes_written, bytes);
        Ok(())
    }

    /// Phase B: Figure 2's metadata updates, chunk by chunk. If the backend
    /// fails part-way, the chunks not yet applied give back their pins.
    fn phase_b(&self, chunks: &[Chunk], src: Source<'_>) -> Result<()> {
        let mut m = self.meta.lock();
        for i in 0..chunks.len() {
            if let Err(e) = self.apply_chunk(&mut **m, chunks, i, src) {
                self.undo_pins(&mut **m, &chunks[i + 1..]);
                return Err(e);
            }
        }
        Ok(())
    }

    fn apply_chunk(
        &self,
        m: &mut dyn MetadataBackend,
        chunks: &[Chunk],
        i: usize,
        src: Source<'_>,
    ) -> Result<()> {
        let c = &self.counters;
        let lbn = chunks[i].lbn;
        let old = m.lbn_map_lookup(lbn)?;
        let target = match chunks[i].plan {
            Plan::Zero => {
                if let Some(o) = old {
                    m.lbn_map_delete(lbn)?;
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
            Plan::Hit(pbn) if old == Some(pbn) => {
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
                let fp = chunks[i].fp.expect("a New chunk has a fingerprint");
                m.hash_index_insert(&fp, pbn)?;
                m.refcount_inc(pbn)?;
                Counters::add(&c.unique_writes, 1);
                pbn
            }
            Plan::SameAsNew(j) => {
                let Plan::New(pbn) = chunks[j].plan else {
                    unreachable!("SameAsNew always points at a New chunk")
                };
                m.refcount_inc(pbn)?;
                Counters::add(&c.duplicate_writes, 1);
                pbn
            }
            Plan::Collision(pbn) => {
                // Unpin; the chunk is stored apart by `store_collisions`.
                self.release(m, pbn)?;
                return Ok(());
            }
            Plan::Apart => return Ok(()),
            Plan::Unplanned => unreachable!("phase A plans every non-zero chunk"),
        };
        let fp = chunks[i].fp.expect("a mapped chunk has a fingerprint");
        m.lbn_map_insert_fp(lbn, target, &fp)?;
        if let Some(o) = old {
            self.release(m, o)?;
            Counters::add(&c.overwrites, 1);
        }
        Ok(())
    }

    /// Verify mode's rare case: same fingerprint, different bytes. The chunk
    /// is stored without a hash index entry, referenced by its LBN only
    /// (count 1), and freed as soon as that LBN moves on.
    fn store_collisions(&self, chunks: &[Chunk]) -> Result<()> {
        for ch in chunks
            .iter()
            .filter(|c| matches!(c.plan, Plan::Collision(_) | Plan::Apart))
        {
            let pbn = self.alloc(&mut **self.meta.lock(), &ch.data, ch.compressed.as_deref())?;
            let block = if self.places_data {
                self.meta
                    .lock()
                    .stage_chunk(pbn, &ch.data, ch.compressed.clone())
            } else {
                Ok(Some(pbn))
            };
            let stored = block.and_then(|b| match b {
                Some(b) => self.data.write_at(&ch.data, self.cfg.pbn_offset(b)),
                None => Ok(()),
            });
            if let Err(e) = stored {
                self.release(&mut **self.meta.lock(), pbn)?;
                return Err(e);
            }
            Counters::add(&self.counters.data_bytes_written, ch.data.len() as u64);
            let mut m = self.meta.lock();
            let old = m.lbn_map_lookup(ch.lbn)?;
            let fp = ch.fp.expect("a stored chunk has a fingerprint");
            m.lbn_map_insert_fp(ch.lbn, pbn, &fp)?;
            if let Some(o) = old {
                self.release(&mut **m, o)?;
                Counters::add(&self.counters.overwrites, 1);
            }
            Counters::add(&self.counters.unique_writes, 1);
        }
        Ok(())
    }
}

impl Engine {
    /// Give back what phase A took (pins and allocations) after a failure,
    /// so a failed write changes no reference count.
    fn undo_pins(&self, m: &mut dyn MetadataBackend, chunks: &[Chunk]) {
        for c in chunks {
            if let Plan::Hit(pbn) | Plan::New(pbn) | Plan::Collision(pbn) = c.plan {
                if let Err(e) = self.release(m, pbn) {
                    error!("while undoing a failed write: {e}");
                }
            }
        }
    }
}
