//! Content-defined cutting on several cores, with the cut points of one
//! thread cutting the whole stream.
//!
//! A FastCDC cut depends only on the bytes from the start of its segment,
//! so blocks of the stream can be cut at once, each from its own first
//! byte as if a stream began there: a block's *candidate* cuts. They are
//! wrong only until the first place where they meet the true cuts: the
//! true segment running over from the block before starts elsewhere, but
//! once a true cut falls on a candidate, both restart from the same byte
//! and agree from there on. Stitching a block in stream order therefore
//! cuts only the bytes carried over and the block's first few segments
//! again, one thread, until a true cut meets a candidate, and takes the
//! rest of the candidates (and their fingerprints, computed with them on
//! the thread pool) as they are. A block where they never meet (a long run
//! of one byte, cut every `max` bytes from different starts) is cut again
//! whole, which is what a single thread would have done anyway.
//!
//! The reading thread only reads; before this, it also cut, and on a
//! stream of duplicate data that one thread was the backup's bottleneck.

use crate::segment_blocks::{cut_ends, Block};
use crate::segmenter::Segmenting;

use fastcdc::v2020::FastCDC;

/// How far into a block true cuts are sought where they meet its
/// candidates, in largest segments: they meet within a segment or two
/// unless the data forces cuts every `max` bytes.
const WINDOW_SEGMENTS: usize = 8;

/// Cuts blocks handed to it in stream order into whole segments.
pub struct Stitcher {
    how: Segmenting,
    /// The bytes after the last true cut: the start of the next segment.
    carry: Vec<u8>,
}

/// A block, stitched: whole segments, in stream order (`head`'s, then
/// `main`'s).
pub struct Stitched {
    /// Segments cut here, not hashed: the carried bytes with the block's
    /// first bytes, or, if the block could not use its candidates, the
    /// carried bytes and all of the block.
    pub head: Option<Block>,
    pub main: Option<Main>,
    /// The block's bytes back, if `main` did not take them, for reuse.
    pub spare: Option<Vec<u8>>,
}

/// The block itself, from the end of `head` on.
pub struct Main {
    pub block: Block,
    /// Its first segments, cut here until the true cuts met a
    /// candidate: not hashed.
    pub unhashed: usize,
    /// The number of the candidate segment (in cut order from the
    /// block's first byte) that its next segment is: from there on its
    /// segments are the candidates', fingerprints and all.
    pub next: usize,
}

impl Stitcher {
    pub fn new(how: Segmenting) -> Stitcher {
        Stitcher {
            how,
            carry: Vec::new(),
        }
    }

    /// Stitch the next block `raw`, whose candidate cuts (from its first
    /// byte, by `cut_ends(how, raw, last)`) are `candidates`; `last` if
    /// the stream ends with it.
    pub fn push(&mut self, raw: Vec<u8>, candidates: &[usize], last: bool) -> Stitched {
        if self.carry.is_empty() {
            // A segment starts at the block's first byte, as its
            // candidates did: they are all true cuts.
            return self.take(raw, 0, Vec::new(), 0, candidates, None);
        }
        let raw = if last {
            raw
        } else {
            match self.meet(raw, candidates) {
                Ok(s) => return s,
                Err(raw) => raw,
            }
        };
        // Cut the carried bytes and the whole block again, as one thread.
        let mut bytes = std::mem::take(&mut self.carry);
        bytes.extend_from_slice(&raw);
        let ends = cut_ends(self.how, &bytes, last);
        let used = ends.last().copied().unwrap_or(0);
        self.carry = bytes[used..].to_vec();
        bytes.truncate(used);
        Stitched {
            head: (!ends.is_empty()).then_some(Block {
                bytes,
                start: 0,
                ends,
            }),
            main: None,
            spare: Some(raw),
        }
    }

    /// Cut on from the carried bytes into `raw` until a true cut falls on
    /// a candidate of `raw` (or on its first byte, where they started);
    /// `raw` back if none does within the window.
    fn meet(&mut self, raw: Vec<u8>, candidates: &[usize]) -> Result<Stitched, Vec<u8>> {
        let Segmenting::FastCdc { min, avg, max } = self.how else {
            return Err(raw);
        };
        let (k, largest) = (self.carry.len(), max as usize);
        // The segment running over: the carried bytes and the block's
        // first bytes, copied together (at most `max` of them).
        let mut first = self.carry.clone();
        first.extend_from_slice(&raw[..raw.len().min(largest)]);
        let Some(e) = FastCDC::new(&first, min, avg, max)
            .next()
            .map(|c| c.length)
            .filter(|&e| e >= k && e < first.len())
        else {
            return Err(raw);
        };
        // Then true cuts within the block itself, until one is a
        // candidate's.
        let mut at = e - k;
        let mut cut = Vec::new();
        let window = (WINDOW_SEGMENTS * largest).min(raw.len());
        loop {
            let meets = match candidates.binary_search(&at) {
                _ if at == 0 => Some(0),
                Ok(j) => Some(j + 1),
                Err(_) => None,
            };
            if let Some(next) = meets {
                first.truncate(e);
                let head = Block {
                    bytes: first,
                    start: 0,
                    ends: vec![e],
                };
                self.carry.clear();
                return Ok(self.take(raw, e - k, cut, next, candidates, Some(head)));
            }
            if at >= window {
                return Err(raw);
            }
            // The next true cut; one that runs to the window's end is
            // not final.
            let len = FastCDC::new(&raw[at..window], min, avg, max)
                .next()
                .map_or(0, |c| c.length);
            if len == 0 || at + len >= window {
                return Err(raw);
            }
            at += len;
            cut.push(at);
        }
    }

    /// `raw` from byte `from` on: true cuts at `cut` (found here), then
    /// its candidates from segment `next` on; what runs past its last cut
    /// is carried.
    fn take(
        &mut self,
        raw: Vec<u8>,
        from: usize,
        cut: Vec<usize>,
        next: usize,
        candidates: &[usize],
        head: Option<Block>,
    ) -> Stitched {
        let unhashed = cut.len();
        let mut ends = cut;
        ends.extend_from_slice(&candidates[next.min(candidates.len())..]);
        let used = ends.last().copied().unwrap_or(from);
        self.carry.extend_from_slice(&raw[used..]);
        if ends.is_empty() {
            return Stitched {
                head,
                main: None,
                spare: Some(raw),
            };
        }
        Stitched {
            head,
            main: Some(Main {
                block: Block {
                    bytes: raw,
                    start: from,
                    ends,
                },
                unhashed,
                next,
            }),
            spare: None,
        }
    }
}
