//! One streaming chunker per algorithm: bytes go in as they are read, whole
//! chunks come out, so every algorithm sees a file in one read of it.

use std::sync::Arc;

use crate::algo::Algorithm;
use crate::rabin::{self, Rabin};

pub enum Chunker {
    /// WFH: the whole file is one chunk (hashed as it streams by).
    Whole(Box<blake3::Hasher>, u64),
    Fixed {
        size: usize,
        pending: Vec<u8>,
    },
    Rabin {
        r: Rabin,
        pending: Vec<u8>,
    },
    Fast {
        min: u32,
        avg: u32,
        max: u32,
        pending: Vec<u8>,
    },
}

/// A chunk as the analysis sees it.
pub enum Piece<'a> {
    Bytes(&'a [u8]),
    /// WFH: the file's hash and length.
    Hashed([u8; 32], u64),
}

impl Chunker {
    pub fn new(a: &Algorithm, tables: &Arc<rabin::Tables>) -> Chunker {
        match *a {
            Algorithm::Wfh => Chunker::Whole(Box::new(blake3::Hasher::new()), 0),
            Algorithm::Fbh { size } => Chunker::Fixed {
                size,
                pending: Vec::new(),
            },
            Algorithm::Rabin { min, avg, max } => Chunker::Rabin {
                r: Rabin::new(tables.clone(), min, avg, max),
                pending: Vec::new(),
            },
            Algorithm::Fastcdc { min, avg, max } => Chunker::Fast {
                min: min as u32,
                avg: avg as u32,
                max: max as u32,
                pending: Vec::new(),
            },
        }
    }

    /// Feed the next bytes of the file (`eof`: the last ones); `emit` gets
    /// each finished chunk. Returns the time spent outside `emit`: finding
    /// boundaries, or for WFH hashing the file.
    pub fn feed(
        &mut self,
        data: &[u8],
        eof: bool,
        emit: &mut dyn FnMut(Piece),
    ) -> std::time::Duration {
        // Fixed-size boundaries cost nothing: its time is all hashing,
        // which the caller counts around `emit`.
        match self {
            Chunker::Whole(h, len) => {
                // The whole file streams through the hasher here: this is
                // WFH's hashing time (the caller books it so).
                let t0 = crate::cpu::now();
                h.update(data);
                *len += data.len() as u64;
                let hash = eof.then(|| *h.finalize().as_bytes());
                let spent = crate::cpu::now().saturating_sub(t0);
                if let Some(hash) = hash {
                    emit(Piece::Hashed(hash, *len));
                }
                return spent;
            }
            Chunker::Fixed { size, pending } => {
                let mut data = data;
                if !pending.is_empty() {
                    let take = (*size - pending.len()).min(data.len());
                    pending.extend_from_slice(&data[..take]);
                    data = &data[take..];
                    if pending.len() == *size {
                        emit(Piece::Bytes(pending));
                        pending.clear();
                    }
                }
                let mut blocks = data.chunks_exact(*size);
                for b in &mut blocks {
                    emit(Piece::Bytes(b));
                }
                pending.extend_from_slice(blocks.remainder());
                if eof && !pending.is_empty() {
                    emit(Piece::Bytes(pending));
                    pending.clear();
                }
            }
            Chunker::Rabin { r, pending } => {
                let mut cuts = Vec::new();
                let c0 = crate::cpu::now();
                r.feed(data, &mut cuts);
                let chunking = crate::cpu::now().saturating_sub(c0);
                let mut at = 0;
                for c in cuts {
                    // A chunk may have started in earlier data.
                    let need = c - pending.len().min(c);
                    if pending.is_empty() {
                        emit(Piece::Bytes(&data[at..at + c]));
                    } else {
                        pending.extend_from_slice(&data[at..at + need]);
                        emit(Piece::Bytes(pending));
                        pending.clear();
                    }
                    at += need;
                }
                pending.extend_from_slice(&data[at..]);
                if eof && !pending.is_empty() {
                    emit(Piece::Bytes(pending));
                    pending.clear();
                    r.finish();
                }
                return chunking;
            }
            Chunker::Fast {
                min,
                avg,
                max,
                pending,
            } => {
                pending.extend_from_slice(data);
                let mut done = 0;
                let c0 = crate::cpu::now();
                let mut cuts = Vec::new();
                for chunk in fastcdc::v2020::FastCDC::new(pending, *min, *avg, *max) {
                    let end = chunk.offset + chunk.length;
                    // A chunk ending at the buffer's end may continue in the
                    // next bytes, unless this is the end of the file or it
                    // is already as long as chunks get.
                    if end == pending.len() && !eof && chunk.length < *max as usize {
                        break;
                    }
                    cuts.push((chunk.offset, chunk.length));
                    done = end;
                }
                let chunking = crate::cpu::now().saturating_sub(c0);
                for (off, len) in cuts {
                    emit(Piece::Bytes(&pending[off..off + len]));
                }
                pending.drain(..done);
                return chunking;
            }
        }
        std::time::Duration::ZERO
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testdata::random;

    /// Chunk lengths of `data` fed in pieces of `step`.
    fn lengths(a: &str, data: &[u8], step: usize) -> Vec<usize> {
        let tables = Arc::new(rabin::Tables::new());
        let mut c = Chunker::new(&Algorithm::parse(a).unwrap(), &tables);
        let mut out = Vec::new();
        let mut emit = |p: Piece| match p {
            Piece::Bytes(b) => out.push(b.len()),
            Piece::Hashed(_, n) => out.push(n as usize),
        };
        let pieces: Vec<&[u8]> = data.chunks(step).collect();
        for (i, p) in pieces.iter().enumerate() {
            c.feed(p, i + 1 == pieces.len(), &mut emit);
        }
        out
    }

    #[test]
    fn every_chunker_covers_the_file_whatever_the_read_size() {
        let data = random(3 << 20 | 12345, 4);
        for a in [
            "wfh",
            "fbh:4k",
            "fbh:64k",
            "rabin:8k",
            "fastcdc:8k",
            "fastcdc:64k",
        ] {
            let whole = lengths(a, &data, data.len());
            assert_eq!(whole.iter().sum::<usize>(), data.len(), "{a}");
            for step in [1000, 65536, 1 << 20] {
                assert_eq!(lengths(a, &data, step), whole, "{a} fed {step} at a time");
            }
        }
    }
}
