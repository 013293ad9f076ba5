//! A C-block (ThinDedup §II-B): one data chunk compressed with LZ4 and, in
//! the room that frees, metadata entries of its window: LBN → PBN with a
//! 128-bit fingerprint prefix of the mapped chunk and a timestamp, 40 bytes
//! each as in the paper (ThinDedup §III-A). A C-block lives only in a
//! C-zone, so the zone says what the block is; the magic and the trailing
//! crc32c catch a block that was never written, torn, or damaged. Layout
//! in `FORMATS.md` ("thin: C-blocks").

use crate::error::{Error, Result};

const MAGIC: &[u8; 4] = b"DTCB";
const VERSION: u8 = 1;
/// Magic, version, reserved, entry count, compressed length.
const HEADER: usize = 12;
const CRC: usize = 4;
pub const ENTRY_BYTES: usize = 40;

/// One metadata entry embedded in a C-block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub lbn: u64,
    pub pbn: u64,
    /// First 16 bytes of the mapped chunk's fingerprint: recovery checks
    /// the chunk at `pbn` against it and ignores the entry on a mismatch.
    pub fp: [u8; 16],
    /// Orders entries of one kind: an older one never overwrites a newer.
    pub timestamp: u64,
}

/// Encode an entry into 40 bytes (C-blocks and metadata blocks alike).
pub(crate) fn encode_entry(e: &Entry, out: &mut [u8]) {
    e.encode(out)
}

/// Decode the 40 bytes at the start of `b`.
pub(crate) fn decode_entry(b: &[u8]) -> Entry {
    Entry::decode(b)
}

impl Entry {
    fn encode(&self, out: &mut [u8]) {
        out[..8].copy_from_slice(&self.lbn.to_le_bytes());
        out[8..16].copy_from_slice(&self.pbn.to_le_bytes());
        out[16..32].copy_from_slice(&self.fp);
        out[32..40].copy_from_slice(&self.timestamp.to_le_bytes());
    }

    fn decode(b: &[u8]) -> Entry {
        let u = |r: std::ops::Range<usize>| u64::from_le_bytes(b[r].try_into().expect("8 bytes"));
        Entry {
            lbn: u(0..8),
            pbn: u(8..16),
            fp: b[16..32].try_into().expect("16 bytes"),
            timestamp: u(32..40),
        }
    }
}

/// A chunk compressed, ready to take entries.
pub struct Compressed {
    payload: Vec<u8>,
    block: usize,
}

impl Compressed {
    /// Compress `chunk`; `None` if not even one entry would fit.
    pub fn new(chunk: &[u8]) -> Option<Compressed> {
        let payload = lz4_flex::block::compress(chunk);
        let c = Compressed {
            payload,
            block: chunk.len(),
        };
        (c.capacity() > 0).then_some(c)
    }

    /// A chunk of `block` bytes already compressed to `payload` (LZ4
    /// block format).
    pub fn from_lz4(payload: Vec<u8>, block: usize) -> Compressed {
        Compressed { payload, block }
    }

    /// Entries this block can carry.
    pub fn capacity(&self) -> usize {
        capacity_for(self.payload.len(), self.block)
    }

    /// The block with `entries` (at most `capacity`) embedded.
    pub fn seal(&self, entries: &[Entry]) -> Vec<u8> {
        assert!(entries.len() <= self.capacity(), "more entries than room");
        let mut b = vec![0u8; self.block];
        b[..4].copy_from_slice(MAGIC);
        b[4] = VERSION;
        b[6..8].copy_from_slice(&(entries.len() as u16).to_le_bytes());
        b[8..12].copy_from_slice(&(self.payload.len() as u32).to_le_bytes());
        let mut at = HEADER;
        b[at..at + self.payload.len()].copy_from_slice(&self.payload);
        at += self.payload.len();
        for e in entries {
            e.encode(&mut b[at..at + ENTRY_BYTES]);
            at += ENTRY_BYTES;
        }
        crate::codec::seal(&mut b);
        b
    }
}

/// Entries a C-block of `block` bytes carries beside a payload of
/// `compressed` bytes (0: the chunk does not compress enough).
pub fn capacity_for(compressed: usize, block: usize) -> usize {
    block.saturating_sub(HEADER + CRC + compressed) / ENTRY_BYTES
}

fn corrupt(detail: impl Into<String>) -> Error {
    Error::corrupt("thin C-block", detail)
}

/// The chunk and the entries of a C-block; refused (never panics) if the
/// block is not a whole, undamaged C-block of this size.
pub fn open(block: &[u8]) -> Result<(Vec<u8>, Vec<Entry>)> {
    if block.len() < HEADER + CRC || &block[..4] != MAGIC {
        return Err(corrupt(
            "no C-block magic (never written, or not a C-block)",
        ));
    }
    if !crate::codec::is_sealed(block) {
        return Err(corrupt("checksum mismatch (torn or damaged)"));
    }
    if block[4] != VERSION {
        return Err(corrupt(format!(
            "version {} (this dedup reads {VERSION})",
            block[4]
        )));
    }
    let n = u16::from_le_bytes([block[6], block[7]]) as usize;
    let len = u32::from_le_bytes(block[8..12].try_into().expect("4 bytes")) as usize;
    let end = HEADER
        .checked_add(len)
        .and_then(|x| x.checked_add(n * ENTRY_BYTES))
        .filter(|&x| x + CRC <= block.len())
        .ok_or_else(|| {
            corrupt(format!(
                "{len} payload bytes and {n} entries overflow the block"
            ))
        })?;
    let payload = &block[HEADER..HEADER + len];
    let chunk = lz4_flex::block::decompress(payload, block.len())
        .map_err(|e| corrupt(format!("payload does not decompress: {e}")))?;
    if chunk.len() != block.len() {
        return Err(corrupt(format!(
            "payload decompresses to {} bytes, not {}",
            chunk.len(),
            block.len()
        )));
    }
    let entries = block[HEADER + len..end]
        .chunks_exact(ENTRY_BYTES)
        .map(Entry::decode)
        .collect();
    Ok((chunk, entries))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(i: u64) -> Entry {
        Entry {
            lbn: i * 3,
            pbn: i + 100,
            fp: [i as u8; 16],
            timestamp: 1000 + i,
        }
    }

    fn compressible(n: usize, head: usize) -> Vec<u8> {
        (0..n)
            .map(|i| {
                if i < head {
                    (i * 7919 % 251) as u8 ^ (i >> 8) as u8
                } else {
                    9
                }
            })
            .collect()
    }

    #[test]
    fn a_block_carries_its_chunk_and_entries_back() {
        let chunk = compressible(4096, 2000);
        let c = Compressed::new(&chunk).unwrap();
        let cap = c.capacity();
        assert!(cap >= 40, "capacity {cap}");
        for n in [0, 1, cap] {
            let entries: Vec<Entry> = (0..n as u64).map(entry).collect();
            let block = c.seal(&entries);
            assert_eq!(block.len(), 4096);
            let (back, got) = open(&block).unwrap();
            assert_eq!(back, chunk);
            assert_eq!(got, entries);
        }
    }

    #[test]
    fn incompressible_chunks_take_no_entries() {
        let chunk = crate::testdata::noise(1, 4096);
        assert!(Compressed::new(&chunk).is_none());
    }

    #[test]
    fn damage_anywhere_is_refused() {
        let chunk = compressible(4096, 1500);
        let c = Compressed::new(&chunk).unwrap();
        let block = c.seal(&(0..10).map(entry).collect::<Vec<_>>());
        for at in (0..4096).step_by(37) {
            let mut bad = block.clone();
            bad[at] ^= 0x40;
            assert!(open(&bad).is_err(), "a flipped byte at {at} passed");
        }
        // A torn write: the first sectors new, the rest from an older block.
        let old = c.seal(&[entry(99)]);
        for sectors in 1..8 {
            let mut torn = old.clone();
            torn[..sectors * 512].copy_from_slice(&block[..sectors * 512]);
            assert!(open(&torn).is_err(), "torn after {sectors} sectors passed");
        }
        assert!(open(&[0u8; 4096]).is_err());
        assert!(open(&[]).is_err());
    }
}
