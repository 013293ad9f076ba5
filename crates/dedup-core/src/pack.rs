//! Packed blocks (issue 7, first part: the format): compressed fragments
//! of several chunks in one data block, as VDO's packer does, so that a
//! chunk LZ4 shrinks to a fifth takes a fifth of a block. A chunk's
//! location becomes (block, slot). A fragment never spans blocks, so
//! reading one chunk reads one block.
//!
//! Layout of a packed block of B bytes:
//!
//! | bytes | field |
//! |---|---|
//! | 0–3 | magic `DPAK` |
//! | 4 | version (1) |
//! | 5 | slot count N (1 to `MAX_SLOTS`) |
//! | 6–7 | reserved (0) |
//! | 8 + 8·i | slot i: offset (2), length (2), crc32c of the fragment (4) |
//! | … | fragments, back to back after the slot table |
//! | last 4 | crc32c of the header and slot table |
//!
//! Each fragment has its own checksum, so a damaged fragment fails the
//! read of its one chunk (an I/O error for that chunk) and never returns
//! another chunk's bytes; the header checksum guards the slot table, so a
//! torn table is refused as a whole.

use crate::error::{Error, Result};

const MAGIC: &[u8; 4] = b"DPAK";
const VERSION: u8 = 1;
const HEADER: usize = 8;
const SLOT: usize = 8;
const TRAILER: usize = 4;
/// Most fragments in one block (VDO packs up to 14).
pub const MAX_SLOTS: usize = 14;
/// Largest packed block: slot offsets are 16-bit.
pub const MAX_BLOCK: usize = 1 << 16;

/// Room for fragments in a block of `block` bytes holding `n` of them.
pub fn room(block: usize, n: usize) -> usize {
    block.saturating_sub(HEADER + n * SLOT + TRAILER)
}

/// Fills one block: fragments are added while they fit.
#[derive(Debug)]
pub struct Packer {
    block: usize,
    fragments: Vec<Vec<u8>>,
    used: usize,
}

impl Packer {
    /// A packer for blocks of `block` bytes (offsets are 16-bit, so at
    /// most 64 KiB).
    pub fn new(block: usize) -> Packer {
        assert!(
            (HEADER + SLOT + TRAILER + 1..=MAX_BLOCK).contains(&block),
            "packed blocks are 21 bytes to 64 KiB"
        );
        Packer {
            block,
            fragments: Vec::new(),
            used: 0,
        }
    }

    /// Add a fragment; its slot, or `None` if it does not fit (the block
    /// is then as full as it gets for this fragment).
    pub fn add(&mut self, fragment: &[u8]) -> Option<usize> {
        let n = self.fragments.len() + 1;
        if n > MAX_SLOTS || fragment.is_empty() || self.used + fragment.len() > room(self.block, n)
        {
            return None;
        }
        self.used += fragment.len();
        self.fragments.push(fragment.to_vec());
        Some(n - 1)
    }

    pub fn len(&self) -> usize {
        self.fragments.len()
    }

    pub fn is_empty(&self) -> bool {
        self.fragments.is_empty()
    }

    /// Bytes of the block the fragments use (for the fill share).
    pub fn used(&self) -> usize {
        self.used
    }

    /// Fragment bytes still free if one more fragment were added (None:
    /// no slot left).
    pub fn room_for_next(&self) -> Option<usize> {
        let n = self.fragments.len() + 1;
        (n <= MAX_SLOTS).then(|| room(self.block, n).saturating_sub(self.used))
    }

    /// Bytes left over if a fragment of `len` bytes were added (None: it
    /// does not fit): what best-fit packing minimises.
    pub fn slack_after(&self, len: usize) -> Option<usize> {
        self.room_for_next()?.checked_sub(len)
    }

    /// The block.
    pub fn seal(&self) -> Vec<u8> {
        let n = self.fragments.len();
        assert!(
            (1..=MAX_SLOTS).contains(&n),
            "a packed block holds 1 to 14 fragments"
        );
        let mut b = vec![0u8; self.block];
        b[..4].copy_from_slice(MAGIC);
        b[4] = VERSION;
        b[5] = n as u8;
        let mut at = HEADER + n * SLOT;
        for (i, f) in self.fragments.iter().enumerate() {
            let s = HEADER + i * SLOT;
            b[s..s + 2].copy_from_slice(&(at as u16).to_le_bytes());
            b[s + 2..s + 4].copy_from_slice(&(f.len() as u16).to_le_bytes());
            b[s + 4..s + 8].copy_from_slice(&crc32c::crc32c(f).to_le_bytes());
            b[at..at + f.len()].copy_from_slice(f);
            at += f.len();
        }
        let t = self.block - TRAILER;
        let table = HEADER + n * SLOT;
        let crc = crc32c::crc32c(&b[..table]);
        b[t..].copy_from_slice(&crc.to_le_bytes());
        b
    }
}

fn bad(detail: impl Into<String>) -> Error {
    Error::corrupt("packed block", detail)
}

/// The slots of a packed block: (offset, length, crc32c) each, checked to
/// lie inside the block's fragment area without overlapping the table.
pub fn slots(b: &[u8]) -> Result<Vec<(usize, usize, u32)>> {
    if b.len() < HEADER + SLOT + TRAILER || b.len() > u16::MAX as usize + 1 {
        return Err(bad("block size out of range"));
    }
    if &b[..4] != MAGIC {
        return Err(bad(
            "no packed-block magic (never written, or not a packed block)",
        ));
    }
    if b[4] != VERSION {
        return Err(bad(format!(
            "version {} (this dedup reads {VERSION})",
            b[4]
        )));
    }
    let n = b[5] as usize;
    if n == 0 || n > MAX_SLOTS {
        return Err(bad(format!("{n} slots (1 to {MAX_SLOTS} allowed)")));
    }
    let table = HEADER + n * SLOT;
    let t = b.len() - TRAILER;
    if table > t {
        return Err(bad("slot table larger than the block"));
    }
    let stored = u32::from_le_bytes(b[t..].try_into().expect("4 bytes"));
    if crc32c::crc32c(&b[..table]) != stored {
        return Err(bad("slot table checksum mismatch (torn or damaged)"));
    }
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let s = HEADER + i * SLOT;
        let off = u16::from_le_bytes([b[s], b[s + 1]]) as usize;
        let len = u16::from_le_bytes([b[s + 2], b[s + 3]]) as usize;
        let crc = u32::from_le_bytes(b[s + 4..s + 8].try_into().expect("4 bytes"));
        if len == 0 || off < table || off + len > t {
            return Err(bad(format!("slot {i} lies outside the fragment area")));
        }
        out.push((off, len, crc));
    }
    Ok(out)
}

/// The fragment in `slot`, checked against its own checksum.
pub fn fragment(b: &[u8], slot: usize) -> Result<&[u8]> {
    let s = slots(b)?;
    let &(off, len, crc) = s
        .get(slot)
        .ok_or_else(|| bad(format!("slot {slot} of {} used", s.len())))?;
    let f = &b[off..off + len];
    if crc32c::crc32c(f) != crc {
        return Err(bad(format!(
            "fragment in slot {slot} is damaged (checksum mismatch)"
        )));
    }
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frag(n: usize, seed: u8) -> Vec<u8> {
        (0..n).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect()
    }

    #[test]
    fn fragments_pack_until_the_block_is_full_and_read_back_by_slot() {
        let mut p = Packer::new(4096);
        let mut put = Vec::new();
        for i in 0..20u8 {
            let f = frag(700, i);
            match p.add(&f) {
                Some(slot) => put.push((slot, f)),
                None => break,
            }
        }
        // 700-byte fragments: five fit in 4 KiB beside the table.
        assert_eq!(p.len(), 5);
        let b = p.seal();
        assert_eq!(b.len(), 4096);
        for (slot, f) in &put {
            assert_eq!(fragment(&b, *slot).unwrap(), &f[..]);
        }
        assert!(fragment(&b, 5).is_err());
        // Small fragments stop at the slot limit.
        let mut p = Packer::new(4096);
        let n = (0..40u8)
            .take_while(|&i| p.add(&frag(10, i)).is_some())
            .count();
        assert_eq!(n, MAX_SLOTS);
        assert!(p.add(&[]).is_none() || p.len() == MAX_SLOTS);
    }

    #[test]
    fn a_damaged_fragment_fails_only_its_own_read_and_a_torn_table_fails_all() {
        let mut p = Packer::new(4096);
        for i in 0..4u8 {
            p.add(&frag(500, i)).unwrap();
        }
        let b = p.seal();
        let s = slots(&b).unwrap();
        let mut d = b.clone();
        d[s[2].0 + 10] ^= 0x40;
        assert!(fragment(&d, 2).is_err());
        for other in [0, 1, 3] {
            assert_eq!(fragment(&d, other).unwrap(), fragment(&b, other).unwrap());
        }
        // Any flipped bit of the header or table is refused.
        for i in 0..HEADER + 4 * SLOT {
            let mut t = b.clone();
            t[i] ^= 1;
            assert!(slots(&t).is_err(), "byte {i}");
        }
        // A torn write: an old block's tail under a new header.
        let mut torn = vec![0u8; 4096];
        torn[..512].copy_from_slice(&b[..512]);
        assert!(slots(&torn).is_err());
    }
}
