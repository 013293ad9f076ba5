//! Little-endian field encoding for on-disk structures, bounds-checked on the
//! way in so a short or damaged buffer becomes an error naming the structure,
//! never a panic.

use crate::error::{Error, Result};

/// Appends little-endian fields to a byte vector.
#[derive(Default)]
pub struct Encoder {
    pub buf: Vec<u8>,
}

impl Encoder {
    pub fn with_capacity(n: usize) -> Self {
        Encoder {
            buf: Vec::with_capacity(n),
        }
    }
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.buf.push(v);
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(v);
        self
    }
    /// Zero-fill up to `len` bytes in total.
    pub fn pad_to(&mut self, len: usize) -> &mut Self {
        debug_assert!(
            self.buf.len() <= len,
            "encoded structure overflows its slot"
        );
        self.buf.resize(len, 0);
        self
    }
}

/// Reads little-endian fields; every read past the end is a `Corrupt` error.
pub struct Decoder<'a> {
    buf: &'a [u8],
    pos: usize,
    structure: &'a str,
}

impl<'a> Decoder<'a> {
    pub fn new(buf: &'a [u8], structure: &'a str) -> Self {
        Decoder {
            buf,
            pos: 0,
            structure,
        }
    }

    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| {
                Error::corrupt(
                    self.structure,
                    format!(
                        "truncated: needed {n} bytes at offset {} of {}",
                        self.pos,
                        self.buf.len()
                    ),
                )
            })?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    pub fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.bytes(N)?);
        Ok(a)
    }
    pub fn u8(&mut self) -> Result<u8> {
        Ok(self.bytes(1)?[0])
    }
    pub fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    pub fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    pub fn skip(&mut self, n: usize) -> Result<()> {
        self.bytes(n).map(|_| ())
    }
}

/// crc32c of a block whose last four bytes hold the checksum of the rest.
pub fn seal(block: &mut [u8]) {
    let n = block.len() - 4;
    let crc = crc32c::crc32c(&block[..n]);
    block[n..].copy_from_slice(&crc.to_le_bytes());
}

/// Does the block's trailing crc32c match its contents?
pub fn is_sealed(block: &[u8]) -> bool {
    if block.len() < 4 {
        return false;
    }
    let n = block.len() - 4;
    let mut stored = [0u8; 4];
    stored.copy_from_slice(&block[n..]);
    crc32c::crc32c(&block[..n]) == u32::from_le_bytes(stored)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decoder_reports_truncation_as_corruption() {
        let mut d = Decoder::new(&[1, 2, 3], "test structure");
        assert_eq!(d.u8().unwrap(), 1);
        let err = d.u32().unwrap_err().to_string();
        assert!(
            err.contains("test structure") && err.contains("truncated"),
            "{err}"
        );
    }

    #[test]
    fn seal_detects_any_flipped_bit() {
        let mut block = vec![0xabu8; 64];
        seal(&mut block);
        assert!(is_sealed(&block));
        for i in 0..block.len() * 8 {
            let mut b = block.clone();
            b[i / 8] ^= 1 << (i % 8);
            assert!(!is_sealed(&b), "bit {i}");
        }
    }
}
