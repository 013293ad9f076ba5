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
//!
//! # The data beside the journal
//! A FLUSH needs the data and the metadata durable. Syncing the data first
//! and the journal after costs two synchronous writes in a row; instead
//! the journal lists every data block the transaction wrote, with a digest
//! of its bytes (`blockfile/written.rs`), and the two syncs run side by
//! side (`commit`'s `data_durable`, called after the journal's sync and
//! before any home is written). If the power fails between them, the
//! journal may be durable and its data not: recovery reads the listed
//! blocks, and a transaction whose blocks do not all hold their digests'
//! bytes is dropped whole (its FLUSH never returned, so nothing
//! acknowledged needed it; the homes were not touched yet). A root home
//! that already holds the commit proves the data sync returned (homes are
//! written after it), and then the data is not read. A transaction whose
//! blocks cannot be listed (too many, partial blocks, a list the journal
//! has no room for, a reserve given back to a full host) syncs the data
//! first, as before, and lists none. A data sync that fails after a
//! listed journal clears that journal.

use std::sync::Arc;

use super::geometry::{block_ok, Area, BLOCK, COMMIT_AT, DESC_ENTRIES, ROOT};
use super::home_sync::HomeSync;
use crate::backend::MetaIoStats;
// The header keeps the body's digest as the list keeps each data block's:
// the first 16 bytes of its blake3 hash.
use crate::blockfile::written::{self, digest, DataCheck, Listed, DIGEST};
use crate::blockfile::BlockFile;
use crate::codec::{is_sealed, seal, Decoder, Encoder};
use crate::error::{Error, Result};

/// A journal that lists no data blocks (its data was synced first, or it
/// wrote none that it still uses): replayed as it stands. The only kind
/// older versions wrote and read.
const MAGIC_V1: &[u8; 8] = b"DDUPJRNL";
/// A journal whose header counts the data blocks it lists.
const MAGIC: &[u8; 8] = b"DDUPJRN2";
/// Bytes of one listed data block: its offset and its digest.
const CHECK_ENTRY: usize = 8 + DIGEST;
const CHECK_ENTRIES: u64 = (BLOCK / CHECK_ENTRY) as u64;
const S: &str = "disktable journal";

pub struct Journal {
    pub seq: u64,
    /// A commit's home writes failed part-way (the host's disk full): the
    /// homes are a mix of two commits until a journal that holds all of
    /// them is replayed or written home. Until then no journal may be one
    /// recovery could drop, so none lists data (the data syncs first).
    pub unfinished: bool,
    /// The sync of the last commit's home writes, started in the
    /// background; made at open when writable (`None`: a commit syncs
    /// its homes itself).
    pub homes: Option<HomeSync>,
}

/// A header; one that lists no data blocks keeps the older layout
/// (`MAGIC_V1`, no count of them), which older versions still replay.
fn header(seq: u64, count: u64, checked: u64, body_digest: &[u8; DIGEST]) -> Vec<u8> {
    let mut e = Encoder::with_capacity(BLOCK);
    match checked {
        0 => e.bytes(MAGIC_V1).u64(seq).u64(count),
        _ => e.bytes(MAGIC).u64(seq).u64(count).u64(checked),
    };
    e.bytes(body_digest).pad_to(BLOCK);
    let mut h = e.buf;
    seal(&mut h);
    h
}

fn desc_blocks(count: u64) -> u64 {
    count.div_ceil(DESC_ENTRIES)
}

fn check_blocks(checked: u64) -> u64 {
    checked.div_ceil(CHECK_ENTRIES)
}

/// Journal blocks the longest list of data blocks takes.
pub const LIST_BLOCKS: u64 = (written::MAX_BLOCKS as u64).div_ceil(CHECK_ENTRIES);

/// Journal blocks a transaction of `count` blocks occupies (without its
/// list of data blocks: at most a few more, see `written::MAX_BLOCKS`).
pub fn journal_len(count: u64) -> u64 {
    1 + desc_blocks(count) + count
}

/// What recovery found in the journal.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Recovered {
    /// Table blocks replayed to their homes.
    pub replayed: u64,
    /// Data blocks of a transaction that did not all reach the disk: the
    /// transaction was dropped (0: none was).
    pub dropped_for_data: u64,
}

impl Journal {
    /// A journal whose last commit is `seq`, with nothing pending.
    fn numbered(seq: u64) -> Journal {
        Journal {
            seq,
            homes: None,
            unfinished: false,
        }
    }

    /// Write `blocks` (sealed, sorted) through the journal to their homes.
    /// `listed`: the data blocks this transaction wrote, with digests
    /// (`None`: not listed). `data_durable` makes the data durable; it is
    /// called exactly once (unless an error comes first): after the
    /// journal's sync when the data is listed, before the journal write
    /// otherwise, and always before any home is written.
    pub fn commit(
        &mut self,
        file: &Arc<dyn BlockFile>,
        geo: &Area,
        blocks: &[(u64, super::cache::Block)],
        listed: Option<&[Listed]>,
        data_durable: &mut dyn FnMut() -> Result<()>,
        io: &mut MetaIoStats,
    ) -> Result<()> {
        if blocks.is_empty() {
            return data_durable();
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
        // Listed only where the list fits beside the blocks, and never
        // over a commit whose homes are half-written.
        let listed = listed.filter(|l| {
            !self.unfinished
                && journal_len(count) + check_blocks(l.len() as u64) <= geo.journal_blocks
        });
        let checked = listed.map_or(0, |l| l.len() as u64);
        if listed.is_none() {
            data_durable()?;
        }
        let images = (desc_blocks(count) + count) as usize * BLOCK;
        let mut body = vec![0u8; images + check_blocks(checked) as usize * BLOCK];
        for (i, (n, _)) in blocks.iter().enumerate() {
            body[i * 8..i * 8 + 8].copy_from_slice(&n.to_le_bytes());
        }
        let data_start = desc_blocks(count) as usize * BLOCK;
        for (i, (_, b)) in blocks.iter().enumerate() {
            body[data_start + i * BLOCK..data_start + (i + 1) * BLOCK].copy_from_slice(&b[..]);
        }
        for (i, (offset, d)) in listed.unwrap_or_default().iter().enumerate() {
            let at = images + check_entry_at(i);
            body[at..at + 8].copy_from_slice(&offset.to_le_bytes());
            body[at + 8..at + CHECK_ENTRY].copy_from_slice(d);
        }
        let mut all = header(self.seq + 1, count, checked, &digest(&body));
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
        if listed.is_some() {
            // Recovery would drop this transaction if its data were not
            // all there; the homes cannot be dropped, so they wait.
            if let Err(e) = data_durable() {
                // The data may never reach the disk now, yet a restart
                // could read it back from the page cache (Linux keeps a
                // page whose write-back failed) and replay this journal:
                // it is cleared (the homes are untouched: state N-1).
                self.seq -= 1;
                if let Err(c) = clear_header(file.as_ref(), geo, self.seq) {
                    tracing::error!(
                        "{S}: the data sync failed ({e}) and the journal naming its blocks could not be cleared ({c}); stop the device and start it again before the host restarts"
                    );
                }
                return Err(e);
            }
        }
        self.unfinished = true;
        write_homes(file.as_ref(), geo, blocks, io)?;
        self.unfinished = false;
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
    /// A journal that lists data blocks is replayed only if `data` holds
    /// every one of them; otherwise it is dropped and cleared.
    pub fn recover(
        file: &dyn BlockFile,
        geo: &Area,
        data: Option<&DataCheck>,
        io: &mut MetaIoStats,
    ) -> Result<(Journal, Recovered)> {
        let none = |seq| Ok((Journal::numbered(seq), Recovered::default()));
        let mut h = vec![0u8; BLOCK];
        file.read_at(&mut h, geo.journal_start)?;
        io.reads += 1;
        io.bytes_read += BLOCK as u64;
        let v2 = &h[..8] == MAGIC;
        if !(v2 || &h[..8] == MAGIC_V1) || !is_sealed(&h) {
            // Never written, or a torn write of a transaction whose homes
            // were never touched: nothing to replay.
            return none(0);
        }
        let mut d = Decoder::new(&h[8..], S);
        let seq = d.u64()?;
        let count = d.u64()?;
        let checked = if v2 { d.u64()? } else { 0 };
        let body_digest = d.bytes(DIGEST)?;
        // Bounded before any arithmetic: a damaged header that still
        // passes its checksum must not overflow or ask for huge reads.
        if count == 0
            || count > geo.journal_blocks
            || checked > written::MAX_BLOCKS as u64
            || journal_len(count) + check_blocks(checked) > geo.journal_blocks
        {
            return none(seq);
        }
        let images = (desc_blocks(count) + count) as usize * BLOCK;
        let mut body = vec![0u8; images + check_blocks(checked) as usize * BLOCK];
        file.read_at(&mut body, geo.journal_start + BLOCK as u64)?;
        io.reads += 1;
        io.bytes_read += body.len() as u64;
        if digest(&body)[..] != body_digest[..] {
            // Torn: the homes of this transaction were never written.
            return none(seq);
        }
        // The homes are written only once the data is durable: a root
        // home that already holds this commit proves the data is there,
        // and it is not read (a bad sector in it would stop the open).
        if checked > 0 && root_commit(file, geo, io)? < seq {
            let Some(data) = data else {
                return Err(Error::InvalidArgument(format!(
                    "{S}: the last transaction must be checked against the data device, which was not given"
                )));
            };
            let listed: Vec<Listed> = (0..checked as usize)
                .map(|i| {
                    let at = images + check_entry_at(i);
                    let offset = u64::from_le_bytes(body[at..at + 8].try_into().expect("8 bytes"));
                    let d = body[at + 8..at + CHECK_ENTRY]
                        .try_into()
                        .expect("digest bytes");
                    (offset, d)
                })
                .collect();
            if !written::all_present(data, &listed)? {
                // Its FLUSH never returned: back to the commit before it.
                // Cleared, so no later open weighs it against data written
                // since.
                clear_header(file, geo, seq.saturating_sub(1))?;
                io.writes += 1;
                io.syncs += 1;
                let dropped = Recovered {
                    replayed: 0,
                    dropped_for_data: checked,
                };
                return Ok((Journal::numbered(seq.saturating_sub(1)), dropped));
            }
            // What was read back may be the page cache's after a kill -9,
            // not the disk's: durable before the homes that name it are.
            data.data.sync()?;
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
        clear_header(file, geo, seq)?;
        io.writes += 1;
        io.syncs += 1;
        let replayed = Recovered {
            replayed: count,
            dropped_for_data: 0,
        };
        Ok((Journal::numbered(seq), replayed))
    }

    /// After a clean close: an empty journal, so the next open replays
    /// nothing (once the last commit's homes are durable).
    pub fn clear(&mut self, file: &dyn BlockFile, geo: &Area) -> Result<()> {
        self.settle()?;
        clear_header(file, geo, self.seq)
    }
}

/// The commit number in the root block's home (0 if it cannot be read or
/// fails its checksum: a root write torn by the crash proves nothing).
fn root_commit(file: &dyn BlockFile, geo: &Area, io: &mut MetaIoStats) -> Result<u64> {
    let mut root = vec![0u8; BLOCK];
    // Unreadable (a write torn by the crash left a bad sector): no proof
    // either, and the replay will rewrite it.
    if file
        .read_at(&mut root, geo.table_start + ROOT * BLOCK as u64)
        .is_err()
    {
        return Ok(0);
    }
    io.reads += 1;
    io.bytes_read += BLOCK as u64;
    if !block_ok(ROOT, &root) {
        return Ok(0);
    }
    Ok(u64::from_le_bytes(
        root[COMMIT_AT..].try_into().expect("8 bytes"),
    ))
}

/// Where the `i`th listed data block's entry starts in its blocks.
fn check_entry_at(i: usize) -> usize {
    (i / CHECK_ENTRIES as usize) * BLOCK + (i % CHECK_ENTRIES as usize) * CHECK_ENTRY
}

/// An empty journal numbered `seq`, durably.
fn clear_header(file: &dyn BlockFile, geo: &Area, seq: u64) -> Result<()> {
    file.write_at(&header(seq, 0, 0, &[0; DIGEST]), geo.journal_start)?;
    file.sync()
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
