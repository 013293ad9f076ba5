//! The read path (Dmdedup §2.5): look LBNs up in the LBN map, have the
//! placement read the mapped chunks (consecutive blocks in one I/O), fill
//! unmapped ones with zeros without any I/O.

use super::chunking;
use super::Engine;
use crate::config::{Lbn, Pbn};
use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::placement::ReadPiece;
use crate::stats::Counters;

/// Most chunks one `extents` call looks at.
pub const EXTENT_SCAN_CHUNKS: u64 = 1 << 16;

/// A run of the device that is either all mapped or all unmapped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub offset: u64,
    pub len: u64,
    /// False: never written or trimmed (or all zeros): reads as zeros.
    pub mapped: bool,
}

/// What one logical chunk holds, as a backup by fingerprint sees it
/// (`Engine::block_map`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChunkState {
    /// Never written, trimmed or zeroed: reads as zeros.
    Unmapped,
    /// Mapped to a stored chunk whose fingerprint (the device's hash of
    /// its bytes) the metadata keeps.
    Known(Fingerprint),
    /// Mapped to a stored chunk the metadata keeps no fingerprint for:
    /// read it to know.
    Unknown,
}

impl Engine {
    /// The state of logical chunks `first..first + count`, in order: what
    /// a backup needs to name them without reading them. The metadata's
    /// word, not the data's: a chunk whose bytes no longer match its
    /// fingerprint is found only by reading it (the backup checks every
    /// chunk it reads against its fingerprint).
    pub fn block_map(&self, first: Lbn, count: u64) -> Result<Vec<ChunkState>> {
        let _g = self.enter()?;
        let cs = self.cfg.chunk_size as u64;
        self.check_lbns(first, count)?;
        let mut out = Vec::with_capacity(count as usize);
        let lbns: Vec<Lbn> = (first..first + count).collect();
        for batch in lbns.chunks(chunking::batch_chunks(cs as usize)) {
            let _guards = self.lbn_locks.read_many(batch.iter().copied());
            let _moving = self.move_gate.read();
            let mut m = self.meta.lock();
            for &lbn in batch {
                out.push(match m.store.lbn_map_lookup(lbn)? {
                    None => ChunkState::Unmapped,
                    Some(pbn) => match m.store.chunk_fingerprint(pbn)? {
                        Some(fp) => ChunkState::Known(fp),
                        None => ChunkState::Unknown,
                    },
                });
            }
        }
        Ok(out)
    }

    /// Fill `buf` from byte `offset`.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let _g = self.enter()?;
        self.check_range(offset, buf.len() as u64)?;
        Counters::add(&self.counters.read_requests, 1);
        Counters::add(&self.counters.bytes_read, buf.len() as u64);
        let cs = self.cfg.chunk_size as usize;
        let pieces = chunking::pieces(offset, buf.len(), cs);
        Counters::add(&self.counters.reads, pieces.len() as u64);
        for batch in pieces.chunks(chunking::batch_chunks(cs)) {
            let _guards = self.lbn_locks.read_many(batch.iter().map(|p| p.lbn));
            // A repack must not reuse a block this batch looked up.
            let _moving = self.move_gate.read();
            let mut mapped = Vec::with_capacity(batch.len());
            {
                let mut m = self.meta.lock();
                for p in batch {
                    match m.store.lbn_map_lookup(p.lbn)? {
                        Some(pbn) => mapped.push(ReadPiece {
                            pbn,
                            in_chunk: p.in_chunk.clone(),
                            in_buf: p.in_buf.clone(),
                        }),
                        None => buf[p.in_buf.clone()].fill(0),
                    }
                }
            }
            let bytes = self.placement.read(&mapped, buf)?;
            Counters::add(&self.counters.data_bytes_read, bytes);
        }
        Ok(())
    }

    /// Read one whole stored chunk.
    pub(crate) fn read_pbn(&self, pbn: Pbn, buf: &mut [u8]) -> Result<()> {
        let piece = ReadPiece {
            pbn,
            in_chunk: 0..buf.len(),
            in_buf: 0..buf.len(),
        };
        let bytes = self.placement.read(&[piece], buf)?;
        Counters::add(&self.counters.data_bytes_read, bytes);
        Ok(())
    }

    /// `check`'s and recovery's read: a chunk that cannot be decoded reads
    /// as zeros, so the caller reports its fingerprint mismatch instead of
    /// stopping.
    pub(crate) fn read_stored(&self, pbn: Pbn, buf: &mut [u8]) -> Result<()> {
        match self.read_pbn(pbn, buf) {
            Err(Error::Corrupt { .. }) => {
                buf.fill(0);
                Ok(())
            }
            other => other,
        }
    }

    pub fn extents(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        let _g = self.enter()?;
        self.check_range(offset, len)?;
        let cs = self.cfg.chunk_size as u64;
        let end = offset + len.min(EXTENT_SCAN_CHUNKS * cs);
        let mut out: Vec<Extent> = Vec::new();
        let mut m = self.meta.lock();
        let mut pos = offset;
        while pos < end {
            let next = ((pos / cs + 1) * cs).min(end);
            let mapped = m.store.lbn_map_lookup(pos / cs)?.is_some();
            match out.last_mut() {
                Some(e) if e.mapped == mapped => e.len += next - pos,
                _ => out.push(Extent {
                    offset: pos,
                    len: next - pos,
                    mapped,
                }),
            }
            pos = next;
        }
        Ok(out)
    }
}
