//! Block writes with real bytes and a controlled dedup ratio,
//! compressibility and access pattern (ThinDedup §III-B's synthetic
//! workloads): what the window-persistence benchmark and tests write.
//!
//! Traces (the rest of this crate) name content by a seed and replay it as
//! incompressible bytes; this generator makes the bytes themselves, since
//! whether a block compresses is the point.

use crate::content;

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Access {
    /// LBNs in order from the start of the span, wrapping.
    Sequential,
    /// LBNs uniformly at random over the span.
    Random,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct WorkloadParams {
    pub seed: u64,
    /// Block writes in total.
    pub blocks: u64,
    pub block_size: usize,
    /// Blocks written / distinct contents (ThinDedup tests 1 to 16).
    pub dedup_ratio: f64,
    /// Share of distinct contents that compress (ThinDedup's
    /// "compressibility ratio"), 0 to 1.
    pub compressible_share: f64,
    /// How much a compressible block compresses: 1.25 frees a fifth of it.
    pub compression_ratio: f64,
    pub access: Access,
    /// LBNs fall in 0..span_blocks.
    pub span_blocks: u64,
}

impl WorkloadParams {
    pub fn validate(&self) -> Result<(), String> {
        if !(1.0..=1e6).contains(&self.dedup_ratio) {
            return Err(format!(
                "dedup ratio {} must be at least 1",
                self.dedup_ratio
            ));
        }
        if !(0.0..=1.0).contains(&self.compressible_share) {
            return Err(format!(
                "compressible share {} must be in [0, 1]",
                self.compressible_share
            ));
        }
        if !(1.0..=64.0).contains(&self.compression_ratio) {
            return Err(format!(
                "compression ratio {} must be in [1, 64]",
                self.compression_ratio
            ));
        }
        if self.block_size < 512 || self.span_blocks == 0 {
            return Err("blocks of at least 512 bytes over a span of at least one".into());
        }
        Ok(())
    }
}

/// The generator: an iterator of (LBN, block bytes).
pub struct Workload {
    p: WorkloadParams,
    rng: u64,
    n: u64,
    contents: u64,
}

impl Workload {
    pub fn new(p: WorkloadParams) -> Result<Workload, String> {
        p.validate()?;
        Ok(Workload {
            rng: p.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1,
            p,
            n: 0,
            contents: 0,
        })
    }

    fn next_u64(&mut self) -> u64 {
        // xorshift64*: same stream on every machine and version.
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    fn seed(&self, id: u64, salt: &[u8]) -> crate::Seed {
        content::seed_of(&[salt, &self.p.seed.to_le_bytes(), &id.to_le_bytes()].concat())
    }

    /// Whether content `id` compresses: a fixed property of the content,
    /// so its duplicates compress alike.
    pub fn compressible(&self, id: u64) -> bool {
        let s = self.seed(id, b"compressible");
        let x = u64::from_le_bytes(s[..8].try_into().expect("8 bytes"));
        (x >> 11) as f64 / (1u64 << 53) as f64 <= self.p.compressible_share
            && self.p.compressible_share > 0.0
    }

    /// The bytes of content `id`: random, or (compressible) a random head
    /// and a tail of one repeated 8-byte word, the head sized (by trying)
    /// so that LZ4 makes the block `block / ratio` bytes long.
    pub fn block(&self, id: u64) -> Vec<u8> {
        let size = self.p.block_size;
        let mut b = vec![0u8; size];
        let seed = self.seed(id, b"content");
        if !self.compressible(id) {
            content::fill(&seed, &mut b);
            return b;
        }
        let target = (size as f64 / self.p.compression_ratio) as i64;
        let mut head = target;
        for _ in 0..6 {
            let h = (head.max(8) as usize).min(size);
            self.shape(&seed, id, h, &mut b);
            let z = lz4_flex::block::compress(&b).len() as i64;
            if (z - target).abs() <= 8 || h == 8 {
                break;
            }
            head -= z - target;
        }
        b
    }

    fn shape(&self, seed: &crate::Seed, id: u64, head: usize, b: &mut [u8]) {
        content::fill(seed, &mut b[..head]);
        // The tail word is never all zeros (a zero block is not stored at all).
        let word = (id | 1).to_le_bytes();
        for (i, x) in b[head..].iter_mut().enumerate() {
            *x = word[(head + i) % 8];
        }
    }

    /// The content id of the next block: the ratio holds on every prefix.
    fn next_content(&mut self) -> u64 {
        let written = self.n + 1;
        if (self.contents as f64) < written as f64 / self.p.dedup_ratio {
            self.contents += 1;
            self.contents - 1
        } else {
            self.below(self.contents)
        }
    }
}

impl Iterator for Workload {
    type Item = (u64, Vec<u8>);

    fn next(&mut self) -> Option<(u64, Vec<u8>)> {
        if self.n >= self.p.blocks {
            return None;
        }
        let lbn = match self.p.access {
            Access::Sequential => self.n % self.p.span_blocks,
            Access::Random => self.below(self.p.span_blocks),
        };
        let id = self.next_content();
        self.n += 1;
        Some((lbn, self.block(id)))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    fn params() -> WorkloadParams {
        WorkloadParams {
            seed: 5,
            blocks: 4000,
            block_size: 4096,
            dedup_ratio: 2.0,
            compressible_share: 0.8,
            compression_ratio: 1.25,
            access: Access::Random,
            span_blocks: 1 << 20,
        }
    }

    #[test]
    fn ratio_compressibility_and_pattern_are_as_asked() {
        for (ratio, share, c) in [
            (1.0, 0.0, 1.0),
            (2.0, 0.8, 1.25),
            (16.0, 0.4, 2.0),
            (4.0, 1.0, 4.0),
        ] {
            let p = WorkloadParams {
                dedup_ratio: ratio,
                compressible_share: share,
                compression_ratio: c,
                ..params()
            };
            let blocks: Vec<(u64, Vec<u8>)> = Workload::new(p.clone()).unwrap().collect();
            let distinct: HashSet<&Vec<u8>> = blocks.iter().map(|(_, b)| b).collect();
            let got = blocks.len() as f64 / distinct.len() as f64;
            assert!(
                (got - ratio).abs() / ratio < 0.01,
                "ratio {got} for {ratio}"
            );
            let mut compressible = 0;
            for b in &distinct {
                assert!(b.iter().any(|&x| x != 0));
                let z = lz4_flex::block::compress(b).len();
                if z < 4096 * 9 / 10 {
                    compressible += 1;
                    // Within a few bytes of the asked-for ratio.
                    assert!(
                        (z as f64 - 4096.0 / c).abs() <= 16.0,
                        "{z} bytes compressed at ratio {c}"
                    );
                } else {
                    assert!(z >= 4096, "an incompressible block shrank to {z}");
                }
            }
            if c > 1.12 {
                let share_got = compressible as f64 / distinct.len() as f64;
                assert!(
                    (share_got - share).abs() < 0.06,
                    "share {share_got} for {share}"
                );
            }
        }
    }

    #[test]
    fn sequential_access_walks_the_span_and_random_stays_in_it() {
        let p = WorkloadParams {
            access: Access::Sequential,
            span_blocks: 100,
            blocks: 250,
            ..params()
        };
        let lbns: Vec<u64> = Workload::new(p).unwrap().map(|(l, _)| l).collect();
        assert_eq!(&lbns[..3], &[0, 1, 2]);
        assert_eq!(lbns[100], 0);
        let p = WorkloadParams {
            span_blocks: 10,
            ..params()
        };
        assert!(Workload::new(p).unwrap().all(|(l, _)| l < 10));
        let bad = WorkloadParams {
            dedup_ratio: 0.5,
            ..params()
        };
        assert!(Workload::new(bad).is_err());
    }
}
