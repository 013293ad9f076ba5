//! What a commit wrote to the data device, block by block, with a digest
//! of each block's new bytes: how a journaled store commits without
//! waiting for the data sync first (ThinDedup's crash consistency by
//! fingerprints).
//!
//! A FLUSH used to sync the data device, then write and sync the journal:
//! two synchronous writes one after the other. The journal now carries the
//! digest of every data block written since the last commit, and the two
//! syncs run side by side. A power cut between them can leave the journal
//! durable and the data not; recovery then reads the listed blocks, and a
//! transaction whose blocks do not all match their digests is dropped
//! whole. That is correct because its FLUSH never returned: the FLUSH
//! waits for both syncs, so nothing acknowledged depended on it.
//!
//! `WrittenBlocks` wraps the data device the placement writes through and
//! records those digests as the writes happen (on the writers' threads, off
//! the commit's path). A commit lists only the blocks still live when it
//! commits (`Placement::live_blocks`): those keep their bytes until the
//! next commit's journal replaces this one, since a block freed later is
//! reused or punched only after the commit that frees it. A block written
//! and freed within the transaction may be punched or rewritten right
//! after, and listing it would make recovery drop a transaction whose
//! FLUSH returned. It gives up on a transaction, which then commits the
//! old way (data synced first, no list), when one writes more than
//! `MAX_BLOCKS` blocks (long streams, where the data sync dominates anyway
//! and the list would cost journal space and recovery reads) or writes a
//! range that is not whole blocks.

use std::collections::HashMap;
use std::ops::Range;

use parking_lot::Mutex;

use super::BlockFile;
use crate::error::Result;

/// Most blocks one transaction's list holds (24 bytes each in the
/// journal: at most 7 journal blocks, and 4 MiB read back at recovery
/// with 4 KiB chunks).
pub const MAX_BLOCKS: usize = 1024;

/// Bytes of a block's blake3 digest kept in the list.
pub const DIGEST: usize = 16;

/// A data block as a transaction lists it: its offset on the data device
/// and the digest of its bytes.
pub type Listed = (u64, [u8; DIGEST]);

/// The digest recorded for a data block's bytes.
pub fn digest(block: &[u8]) -> [u8; DIGEST] {
    let mut d = [0u8; DIGEST];
    d.copy_from_slice(&blake3::hash(block).as_bytes()[..DIGEST]);
    d
}

/// The data device, recording what each transaction writes.
pub struct WrittenBlocks {
    inner: std::sync::Arc<dyn BlockFile>,
    /// The unit of the list: the device's chunk size, from `base` on.
    block: usize,
    base: u64,
    written: Mutex<Written>,
}

#[derive(Default)]
struct Written {
    /// Offset of each block written since the last commit -> its digest
    /// (a block written twice keeps its last bytes').
    blocks: HashMap<u64, [u8; DIGEST]>,
    /// The transaction cannot be listed (too many blocks, a partial one).
    unlisted: bool,
}

impl Written {
    /// Give up on listing this transaction (until `clear`).
    fn unlist(&mut self) {
        self.unlisted = true;
        self.blocks = HashMap::new();
    }
}

impl WrittenBlocks {
    /// Blocks of `block` bytes from `base` (the first chunk's offset).
    pub fn new(inner: std::sync::Arc<dyn BlockFile>, block: usize, base: u64) -> WrittenBlocks {
        WrittenBlocks {
            inner,
            block,
            base,
            written: Mutex::new(Written::default()),
        }
    }

    /// The blocks written since the last `clear`, sorted by offset, with
    /// their digests; `None` if they could not all be listed.
    pub fn listed(&self) -> Option<Vec<(u64, [u8; DIGEST])>> {
        let w = self.written.lock();
        if w.unlisted {
            return None;
        }
        let mut v: Vec<(u64, [u8; DIGEST])> = w.blocks.iter().map(|(o, d)| (*o, *d)).collect();
        v.sort_unstable_by_key(|(o, _)| *o);
        Some(v)
    }

    /// A commit made every write so far durable: start a new list.
    pub fn clear(&self) {
        let mut w = self.written.lock();
        w.blocks.clear();
        w.unlisted = false;
    }

    /// Record `bufs` written back to back from `offset`.
    fn record(&self, bufs: &[&[u8]], offset: u64) {
        let mut w = self.written.lock();
        if w.unlisted {
            return;
        }
        let aligned = offset >= self.base && (offset - self.base) % self.block as u64 == 0;
        let whole = bufs.iter().all(|b| b.len() % self.block == 0);
        let count: usize = bufs.iter().map(|b| b.len() / self.block).sum();
        if !aligned || !whole || w.blocks.len() + count > MAX_BLOCKS {
            w.unlist();
            return;
        }
        drop(w);
        // Hashed outside the lock: writers run side by side.
        let mut at = offset;
        let mut digests = Vec::with_capacity(count);
        for b in bufs {
            for block in b.chunks(self.block) {
                digests.push((at, digest(block)));
                at += self.block as u64;
            }
        }
        let mut w = self.written.lock();
        if !w.unlisted {
            w.blocks.extend(digests);
            if w.blocks.len() > MAX_BLOCKS {
                w.unlist();
            }
        }
    }
}

impl BlockFile for WrittenBlocks {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        // Recorded before the write: a write that fails half-way has the
        // digest of bytes that may not all be there, which can only make
        // recovery drop a transaction whose FLUSH failed anyway.
        self.record(&[buf], offset);
        self.inner.write_at(buf, offset)
    }
    fn write_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> Result<()> {
        self.record(bufs, offset);
        self.inner.write_vectored_at(bufs, offset)
    }
    fn sync(&self) -> Result<()> {
        self.inner.sync()
    }
    fn len(&self) -> Result<u64> {
        self.inner.len()
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn capacity(&self) -> Result<Option<u64>> {
        self.inner.capacity()
    }
    fn allocated(&self) -> Result<Option<u64>> {
        self.inner.allocated()
    }
    fn data_ranges(&self, range: Range<u64>) -> Result<Option<Vec<Range<u64>>>> {
        self.inner.data_ranges(range)
    }
    fn punch(&self, offset: u64, len: u64) -> Result<()> {
        self.inner.punch(offset, len)
    }
    fn preallocate(&self, offset: u64, len: u64) -> Result<()> {
        self.inner.preallocate(offset, len)
    }
    fn ordered_io(&self) -> bool {
        self.inner.ordered_io()
    }
}

/// What a journaled store gets of the data device (through the
/// superblock, like the generation witness): the device to check a
/// journal's list against at recovery.
#[derive(Clone)]
pub struct DataCheck {
    pub data: std::sync::Arc<dyn BlockFile>,
    /// The chunk size, and the first chunk's offset: the list's units.
    pub block: usize,
    pub first: u64,
}

impl std::fmt::Debug for DataCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataCheck")
            .field("data", &self.data.describe())
            .field("block", &self.block)
            .field("first", &self.first)
            .finish()
    }
}

/// Do the data blocks `listed` hold the bytes their digests name? Read
/// from the data device at recovery; a block past the device's end was
/// never written, and an offset that is not a block's names none (a
/// damaged list). Read errors are errors: recovery does not guess.
pub fn all_present(check: &DataCheck, listed: &[(u64, [u8; DIGEST])]) -> Result<bool> {
    let (data, block) = (check.data.as_ref(), check.block as u64);
    let len = data.len()?;
    let mut buf = vec![0u8; check.block];
    for (offset, want) in listed {
        let aligned = *offset >= check.first && (offset - check.first) % block == 0;
        if !aligned || offset.checked_add(block).is_none_or(|end| end > len) {
            return Ok(false);
        }
        data.read_at(&mut buf, *offset)?;
        if digest(&buf) != *want {
            return Ok(false);
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blockfile::MemBlockFile;
    use std::sync::Arc;

    fn check(mem: &Arc<MemBlockFile>) -> DataCheck {
        DataCheck {
            data: mem.clone(),
            block: 4096,
            first: 8192,
        }
    }

    fn tracked() -> (Arc<MemBlockFile>, WrittenBlocks) {
        let mem = Arc::new(MemBlockFile::new(16 << 20, "data"));
        (mem.clone(), WrittenBlocks::new(mem, 4096, 8192))
    }

    #[test]
    fn lists_each_block_with_its_last_bytes() {
        let (mem, w) = tracked();
        let a = vec![1u8; 4096];
        let b = vec![2u8; 8192];
        w.write_at(&a, 8192).unwrap();
        w.write_vectored_at(&[&b, &a], 8192 + 4096).unwrap();
        w.write_at(&b[..4096], 8192).unwrap();
        let l = w.listed().unwrap();
        let offsets: Vec<u64> = l.iter().map(|(o, _)| *o).collect();
        assert_eq!(offsets, vec![8192, 12288, 16384, 20480]);
        assert_eq!(l[0].1, digest(&b[..4096]));
        assert!(all_present(&check(&mem), &l).unwrap());
        w.clear();
        assert_eq!(w.listed().unwrap(), vec![]);
    }

    #[test]
    fn a_block_that_did_not_land_is_found() {
        let (mem, w) = tracked();
        w.write_at(&[7u8; 4096], 8192).unwrap();
        let l = w.listed().unwrap();
        // The bytes on disk are older than the listed ones.
        mem.write_at(&[6u8; 4096], 8192).unwrap();
        assert!(!all_present(&check(&mem), &l).unwrap());
        // Past the end: never written; and an offset no device has.
        let far = vec![(1 << 30, l[0].1)];
        assert!(!all_present(&check(&mem), &far).unwrap());
        let absurd = vec![(u64::MAX - 10, l[0].1)];
        assert!(!all_present(&check(&mem), &absurd).unwrap());
        let unaligned = vec![(8192 + 512, l[0].1)];
        assert!(!all_present(&check(&mem), &unaligned).unwrap());
    }

    #[test]
    fn partial_or_too_many_blocks_are_not_listed_until_cleared() {
        let (_, w) = tracked();
        w.write_at(&[1u8; 512], 8192).unwrap();
        assert!(w.listed().is_none());
        w.clear();
        w.write_at(&[1u8; 4096], 100).unwrap();
        assert!(w.listed().is_none(), "unaligned");
        w.clear();
        let many = vec![3u8; 4096 * (MAX_BLOCKS + 1)];
        w.write_at(&many, 8192).unwrap();
        assert!(w.listed().is_none(), "too many");
        w.clear();
        w.write_at(&many[..4096], 8192).unwrap();
        assert_eq!(w.listed().unwrap().len(), 1);
    }
}
