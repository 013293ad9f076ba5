//! A trace's own statistics: the columns of Dmdedup Table 1 (written,
//! unique by content, unique by offset, read, dedup ratio, ranges
//! accessed), counted in 4 KiB blocks.

use std::collections::HashSet;

use serde::Serialize;

use crate::request::{Op, Request, Seed, BLOCK};

#[derive(Clone, Debug, Default, Serialize)]
pub struct TraceStats {
    pub requests: u64,
    pub reads: u64,
    pub writes: u64,
    pub trims: u64,
    pub zeroes: u64,
    pub flushes: u64,
    pub fua_writes: u64,
    /// Trace duration (last timestamp).
    pub duration_s: f64,
    pub block_size: u64,
    pub written_bytes: u64,
    /// Distinct contents written, in blocks' bytes (all-zero blocks excluded).
    pub written_unique_by_content_bytes: u64,
    /// Distinct block offsets written.
    pub written_unique_by_offset_bytes: u64,
    pub zero_blocks_written: u64,
    pub read_bytes: u64,
    /// Non-zero blocks written / distinct contents among them: what an
    /// ideal 4 KiB deduplicator stores once.
    pub dedup_ratio: f64,
    /// Distinct blocks read or written.
    pub accessed_bytes: u64,
    /// The end of the highest range accessed: the device size a replay needs.
    pub span_bytes: u64,
    /// Blocks read before the trace writes them (a replay can pre-fill
    /// them so those reads do I/O on every system, as Dmdedup did).
    pub read_before_written_blocks: u64,
}

#[derive(Default)]
pub struct StatsBuilder {
    s: TraceStats,
    contents: HashSet<Seed>,
    written: HashSet<u64>,
    accessed: HashSet<u64>,
    /// Blocks trimmed or zeroed (they read as zeros on purpose).
    unmapped: HashSet<u64>,
    prefilled: HashSet<u64>,
    prefill: Vec<u64>,
    nonzero_blocks: u64,
}

impl StatsBuilder {
    pub fn add(&mut self, r: &Request) {
        let s = &mut self.s;
        s.requests += 1;
        s.duration_s = s.duration_s.max(r.time_ns as f64 / 1e9);
        if r.op != Op::Flush {
            s.span_bytes = s.span_bytes.max(r.end());
        }
        match r.op {
            Op::Read => {
                s.reads += 1;
                s.read_bytes += r.len;
                for b in r.blocks() {
                    self.accessed.insert(b);
                    // The first read of a block nothing has written or trimmed yet.
                    if !self.written.contains(&b)
                        && !self.unmapped.contains(&b)
                        && self.prefilled.insert(b)
                    {
                        self.prefill.push(b);
                    }
                }
            }
            Op::Write => {
                s.writes += 1;
                s.fua_writes += r.fua as u64;
                s.written_bytes += r.len;
                for (b, seed) in r.blocks().zip(r.block_seeds()) {
                    self.accessed.insert(b);
                    self.written.insert(b);
                    match seed {
                        None => s.zero_blocks_written += 1,
                        Some(seed) => {
                            self.nonzero_blocks += 1;
                            self.contents.insert(seed);
                        }
                    }
                }
            }
            Op::Trim | Op::Zero => {
                if r.op == Op::Trim {
                    s.trims += 1
                } else {
                    s.zeroes += 1
                }
                for b in r.blocks() {
                    self.accessed.insert(b);
                    self.unmapped.insert(b);
                }
            }
            Op::Flush => s.flushes += 1,
        }
    }

    /// Blocks a replay should pre-fill (read before written), in order.
    pub fn prefill_blocks(&self) -> &[u64] {
        &self.prefill
    }

    pub fn finish(&self) -> TraceStats {
        let mut s = self.s.clone();
        s.block_size = BLOCK;
        s.written_unique_by_content_bytes = self.contents.len() as u64 * BLOCK;
        s.written_unique_by_offset_bytes = self.written.len() as u64 * BLOCK;
        s.accessed_bytes = self.accessed.len() as u64 * BLOCK;
        s.read_before_written_blocks = self.prefill.len() as u64;
        s.dedup_ratio = if self.contents.is_empty() {
            1.0
        } else {
            self.nonzero_blocks as f64 / self.contents.len() as f64
        };
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::native::write_request;

    #[test]
    fn n_writes_of_k_contents_give_ratio_n_over_k() {
        let mut b = StatsBuilder::default();
        let (n, k) = (60u64, 7u64);
        for i in 0..n {
            let block = vec![(i % k) as u8 + 1; 4096];
            b.add(&write_request(i, i * 4096 * 3, &block, false));
        }
        b.add(&write_request(n, 0, &[0u8; 8192], false));
        let s = b.finish();
        assert_eq!(s.dedup_ratio, n as f64 / k as f64);
        assert_eq!(s.written_unique_by_content_bytes, k * 4096);
        assert_eq!(s.written_unique_by_offset_bytes, (n + 1) * 4096);
        assert_eq!(s.zero_blocks_written, 2);
        assert_eq!(s.span_bytes, (n - 1) * 4096 * 3 + 4096);
    }

    #[test]
    fn reads_before_writes_are_found_once() {
        let mut b = StatsBuilder::default();
        let read = |off: u64| Request {
            time_ns: 0,
            op: Op::Read,
            fua: false,
            offset: off,
            len: 8192,
            content: crate::request::Content::None,
        };
        b.add(&write_request(0, 0, &[1u8; 4096], false));
        b.add(&read(0)); // block 0 written, block 1 not
        b.add(&read(4096)); // block 1 again, block 2 new
        let s = b.finish();
        assert_eq!(b.prefill_blocks(), &[1, 2]);
        assert_eq!(s.read_before_written_blocks, 2);
        assert_eq!(s.written_unique_by_offset_bytes, 4096);
        assert_eq!(s.read_bytes, 16384);
        assert_eq!(s.accessed_bytes, 3 * 4096);
    }
}
