//! The read path (Dmdedup §2.5): look LBNs up in the LBN map, read mapped
//! chunks from the data device (consecutive PBNs in one I/O), fill unmapped
//! ones with zeros without any I/O.

use super::chunking;
use super::Device;
use crate::backend::DataLocation;
use crate::backends::thin::cblock;
use crate::config::Pbn;
use crate::error::{Error, Result};
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

impl Device {
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
            // Shared stripes: no writer can remap (and GC can then never free)
            // these chunks until the bytes are copied out.
            let _guards = self.lbn_locks.read_many(batch.iter().map(|p| p.lbn));
            let pbns: Vec<Option<Pbn>> = {
                let mut m = self.meta.lock();
                batch
                    .iter()
                    .map(|p| m.lbn_map_lookup(p.lbn))
                    .collect::<Result<_>>()?
            };
            if self.places_data {
                // The backend says where each chunk is (window, C-block or
                // plain); one chunk at a time.
                let mut chunk = vec![0u8; cs];
                for (p, pbn) in batch.iter().zip(&pbns) {
                    match pbn {
                        Some(pbn) => {
                            self.read_pbn(*pbn, &mut chunk)?;
                            buf[p.in_buf.clone()].copy_from_slice(&chunk[p.in_chunk.clone()]);
                        }
                        None => buf[p.in_buf.clone()].fill(0),
                    }
                }
                continue;
            }
            let mut i = 0;
            while i < batch.len() {
                let Some(first) = pbns[i] else {
                    buf[batch[i].in_buf.clone()].fill(0);
                    i += 1;
                    continue;
                };
                // Pieces after the first start at offset 0 of their chunk and
                // all but the last end at its end, so consecutive PBNs are
                // consecutive bytes on the data device.
                let mut j = i + 1;
                while j < batch.len() && pbns[j] == Some(first + (j - i) as u64) {
                    j += 1;
                }
                let range = batch[i].in_buf.start..batch[j - 1].in_buf.end;
                let at = self.cfg.pbn_offset(first) + batch[i].in_chunk.start as u64;
                Counters::add(&self.counters.data_bytes_read, range.len() as u64);
                self.data.read_at(&mut buf[range], at)?;
                i = j;
            }
        }
        Ok(())
    }

    /// Read one whole stored chunk.
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
        }
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
        m.commit()?;
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
        let location = match compressed {
            Some(c) if c.get(pbn as usize).copied().unwrap_or(false) => DataLocation::Compressed,
            _ => DataLocation::Plain,
        };
        match self.read_located(pbn, location, buf) {
            Err(Error::Corrupt { .. }) => {
                buf.fill(0);
                Ok(())
            }
            other => other,
        }
    }

    /// Which parts of `[offset, offset + len)` hold data (NBD block status),
    /// at chunk granularity, merged into runs. Like NBD allows, the answer
    /// may cover only a prefix of the range (at most `EXTENT_SCAN_CHUNKS`
    /// chunks), so one call never holds the metadata mutex for long.
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
