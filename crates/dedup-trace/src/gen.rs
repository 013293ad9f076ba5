//! Synthetic traces with a chosen dedup ratio, read/write mix, request
//! sizes, locality and working set, and presets shaped like the FIU Web,
//! Mail and Homes traces of Dmdedup Table 1 (their dedup ratios, read
//! shares and the small share of the address space their writes hit).

use crate::request::{Content, Op, Request, Seed, BLOCK};

#[derive(Clone, Debug, serde::Serialize)]
pub struct GenParams {
    pub seed: u64,
    /// Bytes the trace writes in total.
    pub write_bytes: u64,
    /// Non-zero blocks written / distinct contents (1 = all unique).
    pub dedup_ratio: f64,
    /// Share of requests that are reads (0 to <1).
    pub read_share: f64,
    /// Request sizes in bytes (multiples of 4 KiB), drawn uniformly.
    pub request_sizes: Vec<u64>,
    /// Probability that a request starts where the previous one ended.
    pub locality: f64,
    /// The span of offsets requests fall in, in bytes.
    pub working_set: u64,
    /// A FLUSH after every this many writes (0: none).
    pub flush_every: u64,
    /// Requests per second, for the timestamps (`replay --timing`).
    pub rate: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Preset {
    Web,
    Mail,
    Homes,
}

impl Preset {
    pub fn parse(s: &str) -> Option<Preset> {
        match s {
            "web" => Some(Preset::Web),
            "mail" => Some(Preset::Mail),
            "homes" => Some(Preset::Homes),
            _ => None,
        }
    }

    /// Table 1's shape scaled to `write_bytes`: its dedup ratio, its read
    /// share (read GB over read + written GB), and a working set the size
    /// of its "written unique by offset" relative to what it wrote (at
    /// least 64 MiB, or a small trace would hammer a handful of blocks).
    pub fn params(self, write_bytes: u64, seed: u64) -> GenParams {
        let (ratio, read_gb, written_gb, unique_offset_gb, sizes): (f64, f64, f64, f64, &[u64]) =
            match self {
                Preset::Web => (2.33, 11.89, 42.64, 0.95, &[4096, 4096, 8192, 16384]),
                Preset::Mail => (10.29, 188.94, 1483.41, 8.28, &[4096, 4096, 4096, 8192]),
                Preset::Homes => (3.43, 15.46, 65.27, 4.95, &[4096, 8192, 16384, 65536]),
            };
        let ws = (write_bytes as f64 * unique_offset_gb / written_gb) as u64;
        GenParams {
            seed,
            write_bytes,
            dedup_ratio: ratio,
            read_share: read_gb / (read_gb + written_gb),
            request_sizes: sizes.to_vec(),
            locality: 0.3,
            working_set: ws.max(64 << 20).div_ceil(BLOCK) * BLOCK,
            flush_every: 0,
            rate: 10_000.0,
        }
    }
}

impl GenParams {
    pub fn validate(&self) -> Result<(), String> {
        if !(self.dedup_ratio >= 1.0 && self.dedup_ratio.is_finite()) {
            return Err(format!(
                "dedup ratio {} must be at least 1",
                self.dedup_ratio
            ));
        }
        if !(0.0..1.0).contains(&self.read_share) {
            return Err(format!("read share {} must be in [0, 1)", self.read_share));
        }
        if !(0.0..=1.0).contains(&self.locality) {
            return Err(format!("locality {} must be in [0, 1]", self.locality));
        }
        if self.request_sizes.is_empty()
            || self.request_sizes.iter().any(|&s| s == 0 || s % BLOCK != 0)
        {
            return Err("request sizes must be non-zero multiples of 4 KiB".into());
        }
        let max = *self.request_sizes.iter().max().expect("non-empty");
        if self.working_set < max || self.working_set % BLOCK != 0 {
            return Err(format!(
                "the working set ({} bytes) must be a multiple of 4 KiB and hold the largest request ({max} bytes)",
                self.working_set
            ));
        }
        if self.rate.is_nan() || self.rate <= 0.0 {
            return Err("the rate must be positive".into());
        }
        Ok(())
    }
}

/// A small, fast, seedable generator (xorshift64*): the traces must be
/// the same on every machine and version, which a library RNG's stream
/// does not promise.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        ((self.next() as u128 * n as u128) >> 64) as u64
    }
    fn chance(&mut self, p: f64) -> bool {
        ((self.next() >> 11) as f64 / (1u64 << 53) as f64) < p
    }
}

/// The requests of a synthetic trace, generated lazily.
pub struct Generator {
    p: GenParams,
    rng: Rng,
    written: u64,
    blocks_written: u64,
    contents: u64,
    next_offset: u64,
    writes_since_flush: u64,
    n: u64,
    pending_flush: bool,
    done: bool,
}

impl Generator {
    pub fn new(p: GenParams) -> Result<Generator, String> {
        p.validate()?;
        Ok(Generator {
            rng: Rng(p.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1),
            p,
            written: 0,
            blocks_written: 0,
            contents: 0,
            next_offset: 0,
            writes_since_flush: 0,
            n: 0,
            pending_flush: false,
            done: false,
        })
    }

    fn content_seed(&self, id: u64) -> Seed {
        crate::content::seed_of(&[self.p.seed.to_le_bytes(), id.to_le_bytes()].concat())
    }

    /// A new content whenever the distinct contents so far fall below
    /// blocks / ratio, else an earlier one: the ratio holds on every
    /// prefix of the trace, not only on average.
    fn next_block_seed(&mut self) -> Seed {
        self.blocks_written += 1;
        let id = if (self.contents as f64) < self.blocks_written as f64 / self.p.dedup_ratio {
            self.contents += 1;
            self.contents - 1
        } else {
            self.rng.below(self.contents)
        };
        self.content_seed(id)
    }

    fn place(&mut self, len: u64) -> u64 {
        let last_start = self.p.working_set - len;
        let off = if self.rng.chance(self.p.locality) && self.next_offset <= last_start {
            self.next_offset
        } else {
            self.rng.below(last_start / BLOCK + 1) * BLOCK
        };
        self.next_offset = off + len;
        off
    }
}

impl Iterator for Generator {
    type Item = Request;

    fn next(&mut self) -> Option<Request> {
        if self.done {
            return None;
        }
        let time_ns = (self.n as f64 * 1e9 / self.p.rate) as u64;
        self.n += 1;
        if self.pending_flush {
            self.pending_flush = false;
            return Some(Request {
                time_ns,
                op: Op::Flush,
                fua: false,
                offset: 0,
                len: 0,
                content: Content::None,
            });
        }
        if self.written >= self.p.write_bytes {
            self.done = true;
            return None;
        }
        let size = self.p.request_sizes[self.rng.below(self.p.request_sizes.len() as u64) as usize];
        let offset = self.place(size);
        if self.rng.chance(self.p.read_share) {
            return Some(Request {
                time_ns,
                op: Op::Read,
                fua: false,
                offset,
                len: size,
                content: Content::None,
            });
        }
        let seeds = (0..size / BLOCK)
            .map(|_| Some(self.next_block_seed()))
            .collect();
        self.written += size;
        self.writes_since_flush += 1;
        if self.p.flush_every > 0 && self.writes_since_flush >= self.p.flush_every {
            self.writes_since_flush = 0;
            self.pending_flush = true;
        }
        Some(Request {
            time_ns,
            op: Op::Write,
            fua: false,
            offset,
            len: size,
            content: Content::PerBlock(seeds),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::StatsBuilder;

    fn stats(p: GenParams) -> crate::stats::TraceStats {
        let mut b = StatsBuilder::default();
        for r in Generator::new(p).unwrap() {
            b.add(&r);
        }
        b.finish()
    }

    #[test]
    fn presets_reproduce_their_ratio_and_read_share() {
        for (preset, ratio, reads) in [
            (Preset::Web, 2.33, 0.218),
            (Preset::Mail, 10.29, 0.113),
            (Preset::Homes, 3.43, 0.19),
        ] {
            let s = stats(preset.params(64 << 20, 7));
            assert!(
                (s.dedup_ratio - ratio).abs() / ratio < 0.01,
                "{preset:?}: ratio {}",
                s.dedup_ratio
            );
            let share = s.reads as f64 / (s.reads + s.writes) as f64;
            assert!(
                (share - reads).abs() < 0.03,
                "{preset:?}: read share {share}"
            );
            assert!(s.span_bytes <= 64 << 20);
        }
    }

    #[test]
    fn the_same_seed_gives_the_same_trace_and_flushes_come_when_asked() {
        let p = GenParams {
            seed: 3,
            write_bytes: 4 << 20,
            dedup_ratio: 4.0,
            read_share: 0.5,
            request_sizes: vec![4096, 65536],
            locality: 0.9,
            working_set: 1 << 20,
            flush_every: 10,
            rate: 1000.0,
        };
        let a: Vec<Request> = Generator::new(p.clone()).unwrap().collect();
        let b: Vec<Request> = Generator::new(p.clone()).unwrap().collect();
        assert_eq!(a, b);
        let s = stats(p);
        assert_eq!(s.flushes, s.writes / 10);
        assert!(s.span_bytes <= 1 << 20);
        assert!((s.dedup_ratio - 4.0).abs() < 0.05, "{}", s.dedup_ratio);
    }

    #[test]
    fn bad_parameters_are_refused() {
        let mut p = Preset::Web.params(1 << 20, 1);
        p.dedup_ratio = 0.5;
        assert!(Generator::new(p.clone()).is_err());
        p.dedup_ratio = 2.0;
        p.request_sizes = vec![1000];
        assert!(Generator::new(p).is_err());
    }
}
