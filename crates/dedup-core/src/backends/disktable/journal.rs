//! disktable's write-ahead (redo) journal, which makes its in-place tables
//! crash-consistent. A commit writes, in one sequential I/O at the start of
//! the journal area, a header, the block numbers and the images of every
//! dirty table block; syncs; writes the blocks to their homes and starts a
//! background sync of them (`home_sync.rs`), which the next journal write
//! waits for: the journal holds their images until it is written again.
//! The header holds a blake3 digest of everything after it, so a torn
//! journal write is ignored (the homes were not touched yet), and a
//! complete journal is replayed at open (the homes may be half-written).
//! Replay is idempotent.
//!
//! Why not crc32c for the body: the root block carries a state record that
//! ends in its own crc32c, and a CRC over a stream that contains `X ||
//! crc(X)` does not depend on X at all (the residue property). A torn
//! write that kept a newer root's state sectors under an older header then
//! passed the check and replayed a root that disagreed with its tables.

use std::sync::Arc;

use super::geometry::{Area, BLOCK, DESC_ENTRIES};
use super::home_sync::HomeSync;
use crate::backend::MetaIoStats;
use crate::blockfile::BlockFile;
use crate::codec::{is_sealed, seal, Decoder, Encoder};
use crate::error::{Error, Result};

const MAGIC: &[u8; 8] = b"DDUPJRNL";
const S: &str = "disktable journal";

pub struct Journal {
    pub seq: u64,
    /// The sync of the last commit's home writes, started in the
    /// background; made at open when writable (`None`: a commit syncs
    /// its homes itself).
    pub homes: Option<HomeSync>,
}

/// What the header keeps of the body's blake3 digest.
const DIGEST: usize = 16;

fn digest(body: &[u8]) -> [u8; DIGEST] {
    let mut d = [0u8; DIGEST];
    d.copy_from_slice(&blake3::hash(body).as_bytes()[..DIGEST]);
    d
}

fn header(seq: u64, count: u64, body_digest: &[u8; DIGEST]) -> Vec<u8> {
    let mut e = Encoder::with_capacity(BLOCK);
    e.bytes(MAGIC)
        .u64(seq)
        .u64(count)
        .bytes(body_digest)
        .pad_to(BLOCK);
    let mut h = e.buf;
    seal(&mut h);
    h
}

fn desc_blocks(count: u64) -> u64 {
    count.div_ceil(DESC_ENTRIES)
}

/// Journal blocks a transaction of `count` blocks occupies.
pub fn journal_len(count: u64) -> u64 {
    1 + desc_blocks(count) + count
}

impl Journal {
    /// Write `blocks` (sealed, sorted) through the journal to their homes.
    pub fn commit(
        &mut self,
        file: &Arc<dyn BlockFile>,
        geo: &Area,
        blocks: &[(u64, super::cache::Block)],
        io: &mut MetaIoStats,
    ) -> Result<()> {
        if blocks.is_empty() {
            return Ok(());
        }
        let count = blocks.len() as u64;
        if journal_len(count) > geo.journal_blocks {
            return Err(Error::corrupt(
                S,
                format!(
                    "a transaction of {count} blocks does not fit the {}-block journal",
                    geo.journal_blocks
                ),
            ));
        }
        let mut body = vec![0u8; ((desc_blocks(count) + count) as usize) * BLOCK];
        for (i, (n, _)) in blocks.iter().enumerate() {
            body[i * 8..i * 8 + 8].copy_from_slice(&n.to_le_bytes());
        }
        let data_start = desc_blocks(count) as usize * BLOCK;
        for (i, (_, b)) in blocks.iter().enumerate() {
            body[data_start + i * BLOCK..data_start + (i + 1) * BLOCK].copy_from_slice(&b[..]);
        }
        let mut all = header(self.seq + 1, count, &digest(&body));
        all.extend_from_slice(&body);
        // The last commit's homes must be durable before its journal,
        // which would replay them, is overwritten.
        self.settle()?;
        self.seq += 1;
        file.write_at(&all, geo.journal_start)?;
        file.sync()?;
        io.writes += 1;
        io.syncs += 1;
        io.bytes_written += all.len() as u64;
        write_homes(file.as_ref(), geo, blocks, io)?;
        io.syncs += 1;
        // No background sync (none made, or its thread gone): the homes
        // are synced here, before anything can overwrite this journal.
        match self.homes.as_mut().map(HomeSync::start) {
            Some(Ok(())) => Ok(()),
            _ => file.sync(),
        }
    }

    /// Wait until the last commit's home writes are durable (before the
    /// journal blocks that hold them are written again or given back).
    pub fn settle(&mut self) -> Result<()> {
        match &mut self.homes {
            Some(h) => h.wait(),
            None => Ok(()),
        }
    }

    /// At open: replay a complete journal, if there is one, then clear it.
    /// Returns the journal and how many blocks were replayed.
    pub fn recover(
        file: &dyn BlockFile,
        geo: &Area,
        io: &mut MetaIoStats,
    ) -> Result<(Journal, u64)> {
        let mut h = vec![0u8; BLOCK];
        file.read_at(&mut h, geo.journal_start)?;
        io.reads += 1;
        io.bytes_read += BLOCK as u64;
        if &h[..8] != MAGIC || !is_sealed(&h) {
            // Never written, or a torn write of a transaction whose homes
            // were never touched: nothing to replay.
            return Ok((
                Journal {
                    seq: 0,
                    homes: None,
                },
                0,
            ));
        }
        let mut d = Decoder::new(&h[8..], S);
        let seq = d.u64()?;
        let count = d.u64()?;
        let body_digest = d.bytes(DIGEST)?;
        if count == 0 || journal_len(count) > geo.journal_blocks {
            return Ok((Journal { seq, homes: None }, 0));
        }
        let mut body = vec![0u8; ((desc_blocks(count) + count) as usize) * BLOCK];
        file.read_at(&mut body, geo.journal_start + BLOCK as u64)?;
        io.reads += 1;
        io.bytes_read += body.len() as u64;
        if digest(&body)[..] != body_digest[..] {
            // Torn: the homes of this transaction were never written.
            return Ok((Journal { seq, homes: None }, 0));
        }
        let data_start = desc_blocks(count) as usize * BLOCK;
        let mut blocks = Vec::with_capacity(count as usize);
        for i in 0..count as usize {
            let n = u64::from_le_bytes(body[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
            if n >= geo.table_blocks {
                return Err(Error::corrupt(
                    S,
                    format!("entry {i} names block {n}, beyond the tables"),
                ));
            }
            let mut b: super::cache::Block = Box::new([0u8; BLOCK]);
            b.copy_from_slice(&body[data_start + i * BLOCK..data_start + (i + 1) * BLOCK]);
            blocks.push((n, b));
        }
        write_homes(file, geo, &blocks, io)?;
        // The homes must be durable before the journal that repairs them is
        // cleared, or a crash here could keep the clear and lose some homes.
        file.sync()?;
        io.syncs += 1;
        // Clear it, so the next open does not replay it again.
        file.write_at(&header(seq, 0, &[0; DIGEST]), geo.journal_start)?;
        file.sync()?;
        io.writes += 1;
        io.syncs += 1;
        Ok((Journal { seq, homes: None }, count))
    }

    /// After a clean close: an empty journal, so the next open replays
    /// nothing (once the last commit's homes are durable).
    pub fn clear(&mut self, file: &dyn BlockFile, geo: &Area) -> Result<()> {
        self.settle()?;
        file.write_at(&header(self.seq, 0, &[0; DIGEST]), geo.journal_start)?;
        file.sync()
    }
}

/// Write blocks to their home locations, runs of consecutive blocks as one I/O.
fn write_homes(
    file: &dyn BlockFile,
    geo: &Area,
    blocks: &[(u64, super::cache::Block)],
    io: &mut MetaIoStats,
) -> Result<()> {
    let mut i = 0;
    let mut run = Vec::new();
    while i < blocks.len() {
        let mut j = i + 1;
        while j < blocks.len() && blocks[j].0 == blocks[j - 1].0 + 1 {
            j += 1;
        }
        run.clear();
        for (_, b) in &blocks[i..j] {
            run.extend_from_slice(&b[..]);
        }
        file.write_at(&run, geo.table_start + blocks[i].0 * BLOCK as u64)?;
        io.writes += 1;
        io.bytes_written += run.len() as u64;
        i = j;
    }
    Ok(())
}
