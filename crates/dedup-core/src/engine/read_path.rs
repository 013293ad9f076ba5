//! The read path (Dmdedup §2.5): look LBNs up in the LBN map, read mapped
//! chunks from the data device (consecutive PBNs in one I/O), fill unmapped
//! ones with zeros without any I/O.

use super::chunking;
use super::Engine;
use crate::backend::DataLocation;
use crate::backends::packed;
use crate::backends::thin::cblock;
use crate::config::Pbn;
use crate::error::{Error, Result};
use crate::pack;
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

impl Engine {
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
            let found: Vec<Option<(Pbn, DataLocation)>> = {
                let mut m = self.meta.lock();
                let mut out = Vec::with_capacity(batch.len());
                for p in batch {
                    out.push(match m.lbn_map_lookup(p.lbn)? {
                        Some(pbn) if self.places_data => Some((pbn, m.locate(pbn))),
                        Some(pbn) => Some((pbn, DataLocation::Plain)),
                        None => None,
                    });
                }
                out
            };
            self.read_batch(batch, &found, buf)?;
        }
        Ok(())
    }

    /// Read one batch's chunks into `buf`: consecutive chunks stored as
    /// they are go out as one I/O, fragments of one block read it once.
    fn read_batch(
        &self,
        batch: &[chunking::Piece],
        found: &[Option<(Pbn, DataLocation)>],
        buf: &mut [u8],
    ) -> Result<()> {
        let cs = self.cfg.chunk_size as usize;
        // Where a chunk stored as it is sits on the data device, in chunks.
        let plain = |f: &Option<(Pbn, DataLocation)>| match f {
            Some((pbn, DataLocation::Plain)) => Some(*pbn),
            Some((_, DataLocation::Block(b))) => Some(*b),
            _ => None,
        };
        let mut chunk = vec![0u8; cs];
        let mut packed = PackedBlock::default();
        let mut i = 0;
        while i < batch.len() {
            let Some((pbn, location)) = &found[i] else {
                buf[batch[i].in_buf.clone()].fill(0);
                i += 1;
                continue;
            };
            if let Some(first) = plain(&found[i]) {
                let mut j = i + 1;
                while j < batch.len() && plain(&found[j]) == Some(first + (j - i) as u64) {
                    j += 1;
                }
                let range = batch[i].in_buf.start..batch[j - 1].in_buf.end;
                let at = self.cfg.pbn_offset(first) + batch[i].in_chunk.start as u64;
                Counters::add(&self.counters.data_bytes_read, range.len() as u64);
                self.data.read_at(&mut buf[range], at)?;
                i = j;
                continue;
            }
            match location {
                DataLocation::Fragment { block, slot } => {
                    packed.load(self, *block)?;
                    self.decode_fragment(*block, *slot, &packed.bytes, &mut chunk)?;
                }
                other => self.read_located(*pbn, other.clone(), &mut chunk)?,
            }
            buf[batch[i].in_buf.clone()].copy_from_slice(&chunk[batch[i].in_chunk.clone()]);
            i += 1;
        }
        Ok(())
    }

    pub(crate) fn read_pbn(&self, pbn: Pbn, buf: &mut [u8]) -> Result<()> {
        let location = if self.places_data {
            self.meta.lock().locate(pbn)
        } else {
            DataLocation::Plain
        };
        self.read_located(pbn, location, buf)
    }

    /// Read one whole stored chunk from where the backend said it is.
    pub(crate) fn read_located(
        &self,
        pbn: Pbn,
        location: DataLocation,
        buf: &mut [u8],
    ) -> Result<()> {
        let at = self.cfg.pbn_offset(pbn);
        match location {
            DataLocation::Plain => {
                Counters::add(&self.counters.data_bytes_read, buf.len() as u64);
                self.data.read_at(buf, at)
            }
            DataLocation::Staged(bytes) => {
                buf.copy_from_slice(&bytes);
                Ok(())
            }
            DataLocation::Compressed => {
                Counters::add(&self.counters.data_bytes_read, buf.len() as u64);
                self.data.read_at(buf, at)?;
                decode_cblock(pbn, buf)
            }
            DataLocation::Block(block) => {
                Counters::add(&self.counters.data_bytes_read, buf.len() as u64);
                self.data.read_at(buf, self.cfg.pbn_offset(block))
            }
            DataLocation::Fragment { block, slot } => {
                let mut packed = PackedBlock::default();
                packed.load(self, block)?;
                self.decode_fragment(block, slot, &packed.bytes, buf)
            }
        }
    }

    fn decode_fragment(
        &self,
        block: u64,
        slot: usize,
        packed: &[u8],
        out: &mut [u8],
    ) -> Result<()> {
        decode_fragment(&self.cfg, block, slot, packed, out)
    }

    /// For `check` and `repair`, which hold the metadata mutex while they
    /// read chunks: end the open window (so nothing is staged) and note
    /// which PBNs hold C-blocks. `None` when the backend does not place data.
    pub(crate) fn compressed_map(
        &self,
        m: &mut dyn crate::backend::MetadataBackend,
    ) -> Result<Option<Vec<bool>>> {
        if !self.places_data {
            return Ok(None);
        }
        // Nothing staged afterwards: every chunk is where its address says.
        // (Opened to inspect, nothing was written, and nothing may be.)
        if self.writable {
            m.commit()?;
        }
        if self.cfg.packs() {
            return Ok(None);
        }
        Ok(Some(cblock_map(m, self.cfg.physical_chunks)))
    }

    /// `check`'s read: a C-block that cannot be decoded reads as zeros, so
    /// the check reports its fingerprint mismatch instead of stopping.
    pub(crate) fn read_mapped(
        &self,
        compressed: Option<&Vec<bool>>,
        pbn: Pbn,
        buf: &mut [u8],
    ) -> Result<()> {
        read_stored(&self.cfg, self.data.as_ref(), compressed, pbn, buf)
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
            let mapped = m.lbn_map_lookup(pos / cs)?.is_some();
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

/// Which of the first `pbns` blocks hold C-blocks, as the backend says.
/// Read a stored chunk where its address says it is, with nothing staged
/// (check, repair and roll-back recovery, after a commit): `compressed`
/// is thin's map of C-blocks. A chunk that does not decode reads as
/// zeros, so the caller reports its fingerprint mismatch instead of
/// stopping.
pub(crate) fn read_stored(
    cfg: &crate::config::DeviceConfig,
    data: &dyn crate::blockfile::BlockFile,
    compressed: Option<&Vec<bool>>,
    pbn: Pbn,
    buf: &mut [u8],
) -> Result<()> {
    let decoded = match compressed {
        _ if cfg.packs() => match packed::location(pbn) {
            DataLocation::Block(block) => return data.read_at(buf, cfg.pbn_offset(block)),
            DataLocation::Fragment { block, slot } => {
                let mut packed = vec![0u8; buf.len()];
                data.read_at(&mut packed, cfg.pbn_offset(block))?;
                decode_fragment(cfg, block, slot, &packed, buf)
            }
            _ => unreachable!("an address is a block or a fragment"),
        },
        Some(c) if c.get(pbn as usize).copied().unwrap_or(false) => {
            data.read_at(buf, cfg.pbn_offset(pbn))?;
            decode_cblock(pbn, buf)
        }
        _ => return data.read_at(buf, cfg.pbn_offset(pbn)),
    };
    match decoded {
        Err(Error::Corrupt { .. }) => {
            buf.fill(0);
            Ok(())
        }
        other => other,
    }
}

/// A chunk from its fragment in a packed block: checked against the
/// fragment's checksum, decompressed, and exactly a chunk long, or an
/// error for this chunk alone (never another chunk's bytes).
fn decode_fragment(
    cfg: &crate::config::DeviceConfig,
    block: u64,
    slot: usize,
    packed: &[u8],
    out: &mut [u8],
) -> Result<()> {
    let what = || format!("compressed chunk in data block {block}, slot {slot}");
    let fragment =
        pack::fragment(packed, slot).map_err(|e| Error::corrupt(what(), e.to_string()))?;
    cfg.compression.decompress(fragment, out, &what())
}

/// The last packed block a batch read, so fragments side by side in one
/// block cost one read.
#[derive(Default)]
struct PackedBlock {
    block: Option<u64>,
    bytes: Vec<u8>,
}

impl PackedBlock {
    fn load(&mut self, dev: &Engine, block: u64) -> Result<()> {
        if self.block == Some(block) {
            return Ok(());
        }
        self.block = None;
        self.bytes.resize(dev.cfg.chunk_size as usize, 0);
        Counters::add(&dev.counters.data_bytes_read, self.bytes.len() as u64);
        dev.data
            .read_at(&mut self.bytes, dev.cfg.pbn_offset(block))?;
        self.block = Some(block);
        Ok(())
    }
}

pub(crate) fn cblock_map(m: &mut dyn crate::backend::MetadataBackend, pbns: u64) -> Vec<bool> {
    (0..pbns)
        .map(|p| matches!(m.locate(p), DataLocation::Compressed))
        .collect()
}

/// Replace the C-block in `buf` by the chunk it holds. A damaged block
/// fails this one read (EIO), never returns other bytes.
pub(crate) fn decode_cblock(pbn: Pbn, buf: &mut [u8]) -> Result<()> {
    let what = || format!("compressed chunk at PBN {pbn}");
    let (chunk, _) = cblock::open(buf).map_err(|e| Error::corrupt(what(), e.to_string()))?;
    if chunk.len() != buf.len() {
        return Err(Error::corrupt(
            what(),
            format!("decompresses to {} bytes, not {}", chunk.len(), buf.len()),
        ));
    }
    buf.copy_from_slice(&chunk);
    Ok(())
}
