//! Rabin fingerprinting over a sliding window (Rabin 1981; as in LBFS and
//! the VBH of "Demystifying Data Deduplication"): the fingerprint of the
//! last `WINDOW` bytes is their value as a polynomial over GF(2) modulo an
//! irreducible polynomial of degree 53; a chunk ends where its low bits are
//! all ones, and never before `min` or after `max` bytes.

/// An irreducible polynomial of degree 53 over GF(2) (the one restic uses).
const POLY: u64 = 0x003D_A335_8B4D_C173;
const DEGREE: u32 = 53;
/// The paper's window: 64 bytes ("the window size has a negligible effect").
pub const WINDOW: usize = 64;

/// `x` modulo `POLY` for `x` of up to 64 bits.
fn reduce(mut x: u64) -> u64 {
    for bit in (DEGREE..64).rev() {
        if x & (1 << bit) != 0 {
            x ^= POLY << (bit - DEGREE);
        }
    }
    x
}

/// Precomputed tables for appending and removing bytes.
pub struct Tables {
    /// out[b]: the contribution of byte b leaving the window.
    out: [u64; 256],
    /// shift[top]: what the top 8 bits of the fingerprint reduce to after a shift by 8.
    shift: [u64; 256],
}

impl Tables {
    pub fn new() -> Tables {
        let mut shift = [0u64; 256];
        for (top, s) in shift.iter_mut().enumerate() {
            // The top byte sits at bits DEGREE-8..DEGREE; shifted by 8 it
            // reaches DEGREE..DEGREE+8 and must be reduced.
            *s = reduce((top as u64) << DEGREE);
        }
        let mut t = Tables {
            out: [0; 256],
            shift,
        };
        for b in 0..256usize {
            // b followed by WINDOW-1 zero bytes.
            let mut fp = t.append(0, b as u8);
            for _ in 0..WINDOW - 1 {
                fp = t.append(fp, 0);
            }
            t.out[b] = fp;
        }
        t
    }

    #[inline]
    fn append(&self, fp: u64, b: u8) -> u64 {
        let top = (fp >> (DEGREE - 8)) as usize;
        (((fp << 8) | b as u64) & ((1 << DEGREE) - 1)) ^ self.shift[top]
    }
}

impl Default for Tables {
    fn default() -> Self {
        Tables::new()
    }
}

/// A streaming Rabin chunker: feed bytes, get chunk lengths.
pub struct Rabin {
    tables: std::sync::Arc<Tables>,
    mask: u64,
    min: usize,
    max: usize,
    window: [u8; WINDOW],
    pos: usize,
    fp: u64,
    /// Bytes in the current chunk so far.
    len: usize,
}

impl Rabin {
    /// `avg` must be a power of two; boundaries where the low log2(avg)
    /// bits are all ones.
    pub fn new(tables: std::sync::Arc<Tables>, min: usize, avg: usize, max: usize) -> Rabin {
        assert!(avg.is_power_of_two() && min <= avg && avg <= max);
        Rabin {
            tables,
            mask: avg as u64 - 1,
            min,
            max,
            window: [0; WINDOW],
            pos: 0,
            fp: 0,
            len: 0,
        }
    }

    /// Consume `data`; push the whole length of each chunk that ends inside
    /// it (counting its bytes from earlier calls). The bytes after the last
    /// cut belong to the next chunk.
    pub fn feed(&mut self, data: &[u8], cuts: &mut Vec<usize>) {
        let tables = self.tables.clone();
        let t = &*tables;
        let mut i = 0;
        while i < data.len() {
            // Below the minimum no boundary can fall: skip hashing all but
            // the last window before it (cut-point skipping).
            if self.len + WINDOW < self.min {
                let skip = (self.min - WINDOW - self.len).min(data.len() - i);
                self.len += skip;
                i += skip;
                continue;
            }
            let b = data[i];
            let old = self.window[self.pos];
            self.window[self.pos] = b;
            self.pos = (self.pos + 1) % WINDOW;
            self.fp = t.append(self.fp ^ t.out[old as usize], b);
            self.len += 1;
            i += 1;
            if (self.len >= self.min && self.fp & self.mask == self.mask) || self.len >= self.max {
                cuts.push(self.len);
                self.reset();
            }
        }
    }

    /// The file ended: the next bytes start a new chunk.
    pub fn finish(&mut self) {
        self.reset();
    }

    fn reset(&mut self) {
        self.window = [0; WINDOW];
        self.pos = 0;
        self.fp = 0;
        self.len = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testdata::random;
    use std::sync::Arc;

    fn chunks(data: &[u8], step: usize) -> Vec<usize> {
        let mut r = Rabin::new(Arc::new(Tables::new()), 4096, 8192, 16384);
        let mut cuts = Vec::new();
        for piece in data.chunks(step) {
            r.feed(piece, &mut cuts);
        }
        cuts
    }

    #[test]
    fn the_window_fingerprint_depends_on_the_window_only() {
        let t = Tables::new();
        let data = random(300, 3);
        // Rolling over 300 bytes equals appending only the last 64 to zero.
        let mut window = [0u8; WINDOW];
        let mut pos = 0;
        let mut fp = 0;
        for &b in &data {
            let old = window[pos];
            window[pos] = b;
            pos = (pos + 1) % WINDOW;
            fp = t.append(fp ^ t.out[old as usize], b);
        }
        let mut direct = 0;
        for &b in &data[data.len() - WINDOW..] {
            direct = t.append(direct, b);
        }
        assert_eq!(fp, direct);
        assert!(fp < 1 << DEGREE);
    }

    #[test]
    fn cuts_do_not_depend_on_how_the_stream_is_fed_and_average_near_avg() {
        let data = random(4 << 20, 9);
        let a = chunks(&data, 1 << 20);
        let b = chunks(&data, 777);
        assert_eq!(a, b);
        let avg = a.iter().sum::<usize>() as f64 / a.len() as f64;
        // min + avg (expected gap) for uniform data, capped by max.
        assert!((9000.0..14000.0).contains(&avg), "average chunk {avg}");
        assert!(a.iter().all(|&c| (4096..=16384).contains(&c)));
    }

    #[test]
    fn an_insertion_moves_only_nearby_boundaries() {
        let data = random(2 << 20, 5);
        let mut edited = data.clone();
        edited.splice(100_000..100_000, random(37, 1));
        let ends = |cuts: &[usize]| -> Vec<usize> {
            cuts.iter()
                .scan(0, |at, &c| {
                    *at += c;
                    Some(*at)
                })
                .collect()
        };
        let a = ends(&chunks(&data, 65536));
        let b: std::collections::HashSet<usize> = ends(&chunks(&edited, 65536))
            .into_iter()
            .map(|e| e - 37)
            .collect();
        let after: Vec<&usize> = a.iter().filter(|&&e| e > 150_000).collect();
        let kept = after.iter().filter(|e| b.contains(e)).count();
        assert_eq!(
            kept,
            after.len(),
            "boundaries far after the insertion moved"
        );
    }
}
