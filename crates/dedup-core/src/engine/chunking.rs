//! Splitting a byte range of the device into aligned chunk pieces (Dmdedup
//! §2.4 "Chunking"): every request, whatever its offset and length, becomes a
//! list of (LBN, part of that chunk, part of the request buffer).

use std::ops::Range;

use crate::config::Lbn;

/// One chunk's share of a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Piece {
    pub lbn: Lbn,
    /// Bytes of the chunk the request covers.
    pub in_chunk: Range<usize>,
    /// The same bytes' place in the request buffer.
    pub in_buf: Range<usize>,
}

impl Piece {
    pub fn is_full(&self, chunk_size: usize) -> bool {
        self.in_chunk.start == 0 && self.in_chunk.end == chunk_size
    }
}

/// The pieces of `[offset, offset + len)` for chunks of `chunk_size` bytes.
pub fn pieces(offset: u64, len: usize, chunk_size: usize) -> Vec<Piece> {
    let cs = chunk_size as u64;
    let mut out = Vec::with_capacity(len / chunk_size + 2);
    let mut pos = offset;
    let end = offset + len as u64;
    while pos < end {
        let lbn = pos / cs;
        let start_in_chunk = (pos % cs) as usize;
        let take = ((cs - start_in_chunk as u64).min(end - pos)) as usize;
        let buf_start = (pos - offset) as usize;
        out.push(Piece {
            lbn,
            in_chunk: start_in_chunk..start_in_chunk + take,
            in_buf: buf_start..buf_start + take,
        });
        pos += take as u64;
    }
    out
}

/// Chunks handled together under one set of locks: enough to amortise the
/// metadata lock and coalesce data I/O, few enough to bound memory and
/// lock hold times (about 1 MiB of data).
pub fn batch_chunks(chunk_size: usize) -> usize {
    ((1 << 20) / chunk_size).clamp(1, 256)
}

/// Chunks `dedup create` adds to the data device beyond the physical size
/// asked for, so that overwrites of a full device always fit: a write
/// stores its new chunks before the ones it replaces are freed (and those
/// are reused only after the next commit), so a device whose every chunk
/// is live needs room for the batches in flight. Four batches (4 MiB with
/// 4 KiB chunks); a batch that finds even these taken makes room (GC and a
/// commit free what earlier overwrites replaced) and tries again.
pub fn overwrite_reserve_chunks(chunk_size: u32) -> u64 {
    4 * batch_chunks(chunk_size as usize) as u64
}

/// Is every byte zero? Word-at-a-time, since this runs on every chunk written.
pub fn is_zero(buf: &[u8]) -> bool {
    let mut blocks = buf.chunks_exact(64);
    for block in &mut blocks {
        let mut acc = 0u64;
        for word in block.chunks_exact(8) {
            acc |= u64::from_ne_bytes(word.try_into().expect("chunks_exact(8) yields 8 bytes"));
        }
        if acc != 0 {
            return false;
        }
    }
    blocks.remainder().iter().all(|&b| b == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_request_is_whole_chunks() {
        let p = pieces(8192, 8192, 4096);
        assert_eq!(p.len(), 2);
        assert_eq!(
            p[0],
            Piece {
                lbn: 2,
                in_chunk: 0..4096,
                in_buf: 0..4096
            }
        );
        assert_eq!(
            p[1],
            Piece {
                lbn: 3,
                in_chunk: 0..4096,
                in_buf: 4096..8192
            }
        );
        assert!(p.iter().all(|p| p.is_full(4096)));
    }

    #[test]
    fn unaligned_request_has_partial_edges() {
        let p = pieces(4000, 5000, 4096);
        assert_eq!(
            p[0],
            Piece {
                lbn: 0,
                in_chunk: 4000..4096,
                in_buf: 0..96
            }
        );
        assert_eq!(
            p[1],
            Piece {
                lbn: 1,
                in_chunk: 0..4096,
                in_buf: 96..4192
            }
        );
        assert_eq!(
            p[2],
            Piece {
                lbn: 2,
                in_chunk: 0..808,
                in_buf: 4192..5000
            }
        );
        let inside = pieces(5, 10, 4096);
        assert_eq!(
            inside,
            vec![Piece {
                lbn: 0,
                in_chunk: 5..15,
                in_buf: 0..10
            }]
        );
        assert!(pieces(123, 0, 4096).is_empty());
    }

    #[test]
    fn zero_detection_sees_a_single_set_bit_anywhere() {
        for len in [0, 1, 63, 64, 65, 4096] {
            let mut b = vec![0u8; len];
            assert!(is_zero(&b));
            for i in 0..len {
                b[i] = 0x10;
                assert!(!is_zero(&b), "len {len} byte {i}");
                b[i] = 0;
            }
        }
    }
}
