//! Packing a write window's metadata into its own data blocks (ThinDedup
//! §II-A, Figures 1 and 2): at the window's end, blocks are compressed one
//! after another until the room they free holds every metadata entry of
//! the window; the blocks tried and found too incompressible stay plain,
//! as do the blocks after the last one needed (compressing only what is
//! needed keeps the CPU cost and the reads' decompression low). Entries
//! that still do not fit go to metadata blocks (`MBlock`), the fallback
//! for all-duplicate windows and incompressible data.
//!
//! Which blocks become C-blocks depends only on their bytes and the number
//! of entries, not on where they go, so the caller can plan first, then
//! place C-blocks in C-zones and plain ones in U-zones, then seal.

use super::cblock::{self, Compressed, Entry, ENTRY_BYTES};
use crate::error::{Error, Result};

/// What to do with a window's new blocks.
pub struct Plan {
    /// Per block (in window order): compressed to carry entries, or plain.
    pub compressed: Vec<Option<Compressed>>,
    /// Entries the C-blocks carry, in order: block i carries the next
    /// `carries[i]` entries.
    pub carries: Vec<usize>,
    /// Entries left for metadata blocks.
    pub leftover: usize,
    /// Blocks that were compressed to find room (CPU spent), including
    /// ones that turned out too incompressible.
    pub tried: usize,
}

/// Plan a window of `blocks` (the bytes of its new, unique chunks) that
/// must persist `entries` metadata entries.
pub fn plan(blocks: &[&[u8]], entries: usize) -> Plan {
    let mut compressed: Vec<Option<Compressed>> = (0..blocks.len()).map(|_| None).collect();
    let mut carries = vec![0; blocks.len()];
    let mut left = entries;
    let mut tried = 0;
    for (i, b) in blocks.iter().enumerate() {
        if left == 0 {
            break;
        }
        tried += 1;
        if let Some(c) = Compressed::new(b) {
            let take = c.capacity().min(left);
            carries[i] = take;
            left -= take;
            compressed[i] = Some(c);
        }
    }
    Plan {
        compressed,
        carries,
        leftover: left,
        tried,
    }
}

impl Plan {
    /// The blocks to write, in window order: C-blocks sealed with their
    /// share of `entries`, plain blocks as they are; and the entries left
    /// for metadata blocks.
    pub fn seal<'a>(
        &self,
        blocks: &[&'a [u8]],
        entries: &'a [Entry],
    ) -> (Vec<Vec<u8>>, &'a [Entry]) {
        assert_eq!(blocks.len(), self.compressed.len());
        let mut at = 0;
        let mut out = Vec::with_capacity(blocks.len());
        for (i, b) in blocks.iter().enumerate() {
            match &self.compressed[i] {
                Some(c) => {
                    let n = self.carries[i];
                    out.push(c.seal(&entries[at..at + n]));
                    at += n;
                }
                None => out.push(b.to_vec()),
            }
        }
        (out, &entries[at..])
    }
}

const M_MAGIC: &[u8; 4] = b"DTMB";
const M_HEADER: usize = 8;

/// Entries a metadata block of `block` bytes holds.
pub fn mblock_capacity(block: usize) -> usize {
    (block - M_HEADER - 4) / ENTRY_BYTES
}

/// A metadata block: magic, entry count, entries, zeros, crc32c.
pub fn mblock(entries: &[Entry], block: usize) -> Vec<u8> {
    assert!(entries.len() <= mblock_capacity(block));
    let mut b = vec![0u8; block];
    b[..4].copy_from_slice(M_MAGIC);
    b[4..8].copy_from_slice(&(entries.len() as u32).to_le_bytes());
    for (i, e) in entries.iter().enumerate() {
        let at = M_HEADER + i * ENTRY_BYTES;
        cblock::encode_entry(e, &mut b[at..at + ENTRY_BYTES]);
    }
    crate::codec::seal(&mut b);
    b
}

/// The entries of a metadata block, or why it is not one.
pub fn open_mblock(b: &[u8]) -> Result<Vec<Entry>> {
    let bad = |d: &str| Error::corrupt("thin metadata block", d.to_string());
    if b.len() < M_HEADER + 4 || &b[..4] != M_MAGIC {
        return Err(bad("no metadata-block magic (never written, or not one)"));
    }
    if !crate::codec::is_sealed(b) {
        return Err(bad("checksum mismatch (torn or damaged)"));
    }
    let n = u32::from_le_bytes(b[4..8].try_into().expect("4 bytes")) as usize;
    if n > mblock_capacity(b.len()) {
        return Err(bad("more entries than the block holds"));
    }
    Ok((0..n)
        .map(|i| cblock::decode_entry(&b[M_HEADER + i * ENTRY_BYTES..]))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(head: usize, seed: u64) -> Vec<u8> {
        let mut b = crate::testdata::noise(seed, 4096);
        b[head..].fill(7);
        b
    }

    fn entries(n: usize) -> Vec<Entry> {
        (0..n as u64)
            .map(|i| Entry {
                lbn: i,
                pbn: 1000 + i,
                fp: [i as u8; 16],
                timestamp: i,
            })
            .collect()
    }

    #[test]
    fn one_compressible_block_carries_a_whole_window() {
        // ThinDedup Fig. 1a: a window's 32 entries (1,280 bytes) fit in one
        // block compressed to under 65 %.
        let data: Vec<Vec<u8>> = (0..32).map(|i| block(2600, i + 1)).collect();
        let refs: Vec<&[u8]> = data.iter().map(|b| b.as_slice()).collect();
        let p = plan(&refs, 32);
        assert_eq!((p.tried, p.leftover), (1, 0));
        let es = entries(32);
        let (out, left) = p.seal(&refs, &es);
        assert!(left.is_empty());
        let (chunk, got) = cblock::open(&out[0]).unwrap();
        assert_eq!((chunk, got), (data[0].clone(), es.clone()));
        assert!(
            out[1..].iter().zip(&data[1..]).all(|(o, d)| o == d),
            "only one block compressed"
        );
    }

    #[test]
    fn several_blocks_share_the_entries_and_incompressible_ones_are_skipped() {
        // Fig. 1b: little room per block; an incompressible block in between.
        let mut data: Vec<Vec<u8>> = (0..8).map(|i| block(4096 - 500, i + 1)).collect();
        data[1] = block(4096, 99);
        let refs: Vec<&[u8]> = data.iter().map(|b| b.as_slice()).collect();
        let cap = Compressed::new(&data[0]).unwrap().capacity();
        let want = cap * 2 + 1;
        let p = plan(&refs, want);
        assert_eq!(p.leftover, 0);
        assert!(p.compressed[1].is_none());
        assert_eq!(p.tried, 4);
        let es = entries(want);
        let (out, left) = p.seal(&refs, &es);
        assert!(left.is_empty());
        let mut back = Vec::new();
        for i in [0, 2, 3] {
            back.extend(cblock::open(&out[i]).unwrap().1);
        }
        assert_eq!(back, es);
        assert_eq!(out[1], data[1]);
    }

    #[test]
    fn leftovers_go_to_metadata_blocks() {
        // Fig. 2: all duplicates (no new blocks), or nothing compresses.
        let p = plan(&[], 10);
        assert_eq!(p.leftover, 10);
        let data: Vec<Vec<u8>> = (0..4).map(|i| block(4096, i + 1)).collect();
        let refs: Vec<&[u8]> = data.iter().map(|b| b.as_slice()).collect();
        let p = plan(&refs, 10);
        assert_eq!((p.leftover, p.tried), (10, 4));
        let es = entries(10);
        let (out, left) = p.seal(&refs, &es);
        assert_eq!(out, data);
        assert_eq!(left.len(), 10);
        let m = mblock(left, 4096);
        assert_eq!(open_mblock(&m).unwrap(), es);
        assert_eq!(mblock_capacity(4096), 102);
        let mut torn = m.clone();
        torn[2048] ^= 1;
        assert!(open_mblock(&torn).is_err());
        assert!(open_mblock(&[0u8; 4096]).is_err());
        assert!(open_mblock(&block(4096, 5)).is_err());
    }
}
