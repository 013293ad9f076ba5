//! How stored chunks are compressed (issue 7): the codec a device records
//! at create time. LZ4 is the default, as VDO's packer and ThinDedup use
//! it: it compresses at hundreds of MB/s per core and decompresses faster
//! still, so it costs less than the I/O it saves. zstd trades CPU for a
//! better ratio on text-like data.

use std::cell::RefCell;
use std::fmt;

use crate::error::{Error, Result};

/// Highest zstd level offered (zstd's own maximum).
pub const ZSTD_MAX_LEVEL: i32 = 22;
/// zstd's level when none is given (its own default).
pub const ZSTD_DEFAULT_LEVEL: i32 = 3;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Compression {
    /// Chunks are stored as they are.
    None,
    #[default]
    Lz4,
    /// zstd at a level from 1 to 22.
    Zstd(i32),
}

impl Compression {
    /// Parse `none`, `lz4`, `zstd` or `zstd:LEVEL` (the `--compression` values).
    pub fn parse(s: &str) -> Result<Compression> {
        let bad = || {
            Error::InvalidArgument(format!(
                "unknown compression {s:?}: give none, lz4 or zstd[:LEVEL] with LEVEL from 1 to {ZSTD_MAX_LEVEL} (e.g. --compression zstd:3)"
            ))
        };
        match s.to_ascii_lowercase().as_str() {
            "none" | "off" => Ok(Compression::None),
            "lz4" => Ok(Compression::Lz4),
            "zstd" => Ok(Compression::Zstd(ZSTD_DEFAULT_LEVEL)),
            other => {
                let level = other
                    .strip_prefix("zstd:")
                    .and_then(|l| l.parse::<i32>().ok())
                    .ok_or_else(bad)?;
                if !(1..=ZSTD_MAX_LEVEL).contains(&level) {
                    return Err(bad());
                }
                Ok(Compression::Zstd(level))
            }
        }
    }

    pub fn is_none(&self) -> bool {
        *self == Compression::None
    }

    /// The superblock's one-byte code: 0 none (also what devices made
    /// before compression existed hold), 1 lz4, 0x80 | level for zstd.
    pub fn code(&self) -> u8 {
        match *self {
            Compression::None => 0,
            Compression::Lz4 => 1,
            Compression::Zstd(level) => 0x80 | level as u8,
        }
    }

    pub fn from_code(code: u8) -> Option<Compression> {
        match code {
            0 => Some(Compression::None),
            1 => Some(Compression::Lz4),
            c if c & 0x80 != 0 && (1..=ZSTD_MAX_LEVEL).contains(&((c & 0x7f) as i32)) => {
                Some(Compression::Zstd((c & 0x7f) as i32))
            }
            _ => None,
        }
    }

    /// The chunk compressed, if that makes it smaller at all (callers
    /// apply their own thresholds). `None` for `Compression::None`.
    pub fn compress(&self, data: &[u8]) -> Option<Vec<u8>> {
        self.compress_tuned(data, ZstdTuning::default())
    }

    /// `compress` for a device chunk, giving up early on data that will
    /// not shrink, as ZFS's and VDO's early abort do: when both ends of
    /// the chunk (`SAMPLE` bytes each) look random, it is not compressed.
    /// Both ends, so a file's last block (its tail, then zeros) still is.
    /// The test reads an eighth of a 4 KiB chunk and costs far less than
    /// LZ4 on it (LZ4 of the two ends, tried first, cost two thirds).
    pub fn compress_chunk(&self, data: &[u8]) -> Option<Vec<u8>> {
        if self.is_none() {
            return None;
        }
        if data.len() >= 4 * SAMPLE
            && looks_random(&data[..SAMPLE])
            && looks_random(&data[data.len() - SAMPLE..])
        {
            return None;
        }
        match self {
            Compression::Lz4 => {
                lz4_with_table(data, |out| (out.len() < data.len()).then(|| out.to_vec()))
            }
            _ => self.compress(data),
        }
    }

    /// `compress`, with zstd's parameters past the level set as `tuning`
    /// says (lz4 has none). Any zstd decoder reads the output.
    pub fn compress_tuned(&self, data: &[u8], tuning: ZstdTuning) -> Option<Vec<u8>> {
        let out = match *self {
            Compression::None => return None,
            Compression::Lz4 => lz4_flex::block::compress(data),
            Compression::Zstd(level) => zstd_compress(data, level, tuning)?,
        };
        (out.len() < data.len()).then_some(out)
    }

    /// Decompress `fragment` into `out`, which it must fill exactly.
    /// `what` names the chunk for the error.
    pub fn decompress(&self, fragment: &[u8], out: &mut [u8], what: &str) -> Result<()> {
        let bad = |detail: String| Error::corrupt(what, detail);
        let n = match *self {
            Compression::None => {
                return Err(bad(
                    "a compressed fragment on a device that does not compress".into(),
                ))
            }
            Compression::Lz4 => lz4_flex::block::decompress_into(fragment, out)
                .map_err(|e| bad(format!("LZ4 data does not decode: {e}")))?,
            Compression::Zstd(_) => zstd::bulk::decompress_to_buffer(fragment, out)
                .map_err(|e| bad(format!("zstd data does not decode: {e}")))?,
        };
        if n != out.len() {
            return Err(bad(format!(
                "decompresses to {n} bytes, not the chunk's {}",
                out.len()
            )));
        }
        Ok(())
    }
}

/// The bytes at each end of a chunk that `compress_chunk` looks at first.
const SAMPLE: usize = 256;
/// Distinct byte values in a sample at or above which it looks random.
/// 256 random bytes hold 162 distinct values on average (256 (1 -
/// (255/256)^256)), with a standard deviation near 5, so random data is
/// almost never below 144; text holds under 70, and structured binary
/// data (code, tables, headers) rarely as many as 144 in 256 bytes.
const RANDOM_DISTINCT: u32 = 144;

/// Does `sample` look like random bytes (compressed, encrypted)?
fn looks_random(sample: &[u8]) -> bool {
    // One byte per value, set with a plain store: no store waits for an
    // earlier one, where setting bits in shared words is a read-modify-
    // write that waits for the last store to its word. The flags are then
    // summed eight at a time: a word of eight 0/1 bytes times 0x0101...
    // holds their sum in its top byte (each partial sum is at most 8, so
    // no carry crosses a byte).
    let mut flags = [0u8; 256];
    for &b in sample {
        flags[b as usize] = 1;
    }
    flags
        .chunks_exact(8)
        .map(|w| {
            let w = u64::from_ne_bytes(w.try_into().expect("eight bytes"));
            (w.wrapping_mul(0x0101_0101_0101_0101) >> 56) as u32
        })
        .sum::<u32>()
        >= RANDOM_DISTINCT
}

thread_local! {
    /// This thread's LZ4 hash table and output buffer for chunks: a call
    /// of `lz4_flex::block::compress` allocates and zeroes a table and
    /// allocates its output, which for a 4 KiB chunk cost as much as the
    /// compression.
    static LZ4: RefCell<(lz4_flex::block::CompressTable, Vec<u8>)> =
        RefCell::new((lz4_flex::block::CompressTable::small(), Vec::new()));
}

/// `f` of `data` compressed by LZ4 with this thread's table and buffer.
fn lz4_with_table<T>(data: &[u8], f: impl FnOnce(&[u8]) -> T) -> T {
    LZ4.with(|cell| {
        let (table, out) = &mut *cell.borrow_mut();
        // A large input upgrades the table for good; a small one gets the
        // small table back, as `block::compress` would choose.
        if data.len() < u16::MAX as usize
            && matches!(table, lz4_flex::block::CompressTable::Large(_))
        {
            *table = lz4_flex::block::CompressTable::small();
        }
        // Grown once to the largest chunk's bound, never shrunk: resizing
        // back up would zero it again on every call.
        let need = lz4_flex::block::get_maximum_output_size(data.len());
        if out.len() < need {
            out.resize(need, 0);
        }
        let n = lz4_flex::block::compress_into_with_table(data, out, table)
            .expect("the output buffer has LZ4's maximum size for the input");
        f(&out[..n])
    })
}

/// zstd parameters a caller that knows its data sets past the level;
/// `None` leaves zstd's choice for the level and the input's size.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ZstdTuning {
    /// The shortest match zstd looks for (its `ZSTD_c_minMatch`, 3 to 7).
    pub min_match: Option<u32>,
}

thread_local! {
    /// This thread's zstd context, its level and tuning: a context costs
    /// an allocation and table set-up, which `zstd::bulk::compress` paid
    /// for every frame and chunk. It lives as long as its thread: about
    /// 1 MiB at level 1 for a 1 MiB frame, tens of MiB at levels near 22.
    static ZSTD: RefCell<Option<(i32, ZstdTuning, zstd::bulk::Compressor<'static>)>> =
        const { RefCell::new(None) };
}

/// `data` as one zstd frame at `level`, with this thread's context,
/// whatever its size (`None` only for want of memory): for framed objects
/// that keep their own bound on expansion, such as a backup store's
/// recipe parts.
pub fn zstd_frame(data: &[u8], level: i32) -> Option<Vec<u8>> {
    zstd_compress(data, level, ZstdTuning::default())
}

/// `data` compressed at `level` and `tuning` with this thread's context
/// (`None` if zstd refuses, which it does only for want of memory).
fn zstd_compress(data: &[u8], level: i32, tuning: ZstdTuning) -> Option<Vec<u8>> {
    ZSTD.with(|cell| {
        let mut cell = cell.borrow_mut();
        if cell
            .as_ref()
            .is_none_or(|(l, t, _)| (*l, *t) != (level, tuning))
        {
            let mut c = zstd::bulk::Compressor::new(level).ok()?;
            if let Some(m) = tuning.min_match {
                c.set_parameter(zstd::stream::raw::CParameter::MinMatch(m))
                    .ok()?;
            }
            *cell = Some((level, tuning, c));
        }
        let (_, _, c) = cell.as_mut()?;
        c.compress(data).ok()
    })
}

impl fmt::Display for Compression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Compression::None => write!(f, "none"),
            Compression::Lz4 => write!(f, "lz4"),
            Compression::Zstd(level) => write!(f, "zstd:{level}"),
        }
    }
}

impl serde::Serialize for Compression {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_codes_round_trip() {
        for c in [
            Compression::None,
            Compression::Lz4,
            Compression::Zstd(1),
            Compression::Zstd(19),
            Compression::Zstd(22),
        ] {
            assert_eq!(Compression::parse(&c.to_string()).unwrap(), c);
            assert_eq!(Compression::from_code(c.code()), Some(c));
        }
        assert_eq!(Compression::parse("zstd").unwrap(), Compression::Zstd(3));
        for bad in ["gzip", "zstd:0", "zstd:23", "zstd:x", "lz4:1", ""] {
            let e = Compression::parse(bad).unwrap_err().to_string();
            assert!(e.contains("none, lz4 or zstd"), "{bad}: {e}");
        }
        for code in [2u8, 0x80, 0x80 | 23, 0x7f] {
            assert_eq!(Compression::from_code(code), None, "{code}");
        }
    }

    #[test]
    fn a_chunk_gives_up_early_only_when_both_ends_look_random() {
        let noise = crate::testdata::noise(7, 4096);
        let mut tail_zeros = noise.clone();
        tail_zeros[1024..].fill(0);
        let mut head_zeros = noise.clone();
        head_zeros[..3072].fill(0);
        let text: Vec<u8> = (0..4096u32)
            .map(|i| b"let x = chunk.len();\n"[(i % 21) as usize])
            .collect();
        for codec in [Compression::Lz4, Compression::Zstd(3)] {
            assert_eq!(codec.compress_chunk(&noise), None, "{codec}");
            for shrinks in [&tail_zeros, &head_zeros, &text] {
                let c = codec.compress_chunk(shrinks).expect("shrinks");
                assert_eq!(Some(c), codec.compress(shrinks), "{codec}");
            }
        }
        assert_eq!(Compression::None.compress_chunk(&text), None);
        // Random bytes of 64 values (base64-like): not taken for random;
        // LZ4 decides, as it would without the test.
        let narrow: Vec<u8> = noise.iter().map(|b| b & 63).collect();
        assert!(!looks_random(&narrow[..SAMPLE]));
        assert_eq!(
            Compression::Lz4.compress_chunk(&narrow),
            Compression::Lz4.compress(&narrow)
        );
        // Random samples are always taken for random: 1,000 of them.
        for seed in 0..1000 {
            assert!(
                looks_random(&crate::testdata::noise(seed, SAMPLE)),
                "seed {seed}"
            );
        }
        // Short chunks skip the samples.
        let short = &text[..1024];
        assert_eq!(
            Compression::Lz4.compress_chunk(short),
            Compression::Lz4.compress(short)
        );
    }

    /// The interleaved bitmaps count exactly the distinct bytes, whatever
    /// the sample's length.
    #[test]
    fn looks_random_counts_distinct_bytes_exactly() {
        for len in [0, 1, 7, 8, 9, 143, 144, 255, 256, 300] {
            for seed in 0..20 {
                let mut s = crate::testdata::noise(seed, len);
                // Narrow some samples so that both answers occur.
                if seed % 2 == 0 {
                    s.iter_mut().for_each(|b| *b %= 150);
                }
                let distinct = s.iter().collect::<std::collections::HashSet<_>>().len();
                assert_eq!(
                    looks_random(&s),
                    distinct >= RANDOM_DISTINCT as usize,
                    "len {len} seed {seed}"
                );
            }
        }
        // At the threshold exactly, with values from every part of the
        // byte range (the top eight among them), repeated to 256 bytes.
        for seed in 0..50 {
            let noise = crate::testdata::noise(seed, 512);
            let mut values: Vec<u8> = (0..=255).collect();
            // A seeded shuffle, then the top values moved to the front.
            for (i, r) in noise.chunks_exact(2).enumerate() {
                let j = i + usize::from(u16::from_le_bytes([r[0], r[1]])) % (256 - i);
                values.swap(i, j);
            }
            values.sort_by_key(|&v| v < 248);
            for distinct in [RANDOM_DISTINCT - 1, RANDOM_DISTINCT] {
                let s: Vec<u8> = values[..distinct as usize]
                    .iter()
                    .cycle()
                    .take(SAMPLE)
                    .copied()
                    .collect();
                assert_eq!(
                    looks_random(&s),
                    distinct >= RANDOM_DISTINCT,
                    "seed {seed}, {distinct} distinct"
                );
            }
        }
    }

    #[test]
    fn compresses_text_round_trips_and_refuses_what_does_not_shrink() {
        let text: Vec<u8> = b"fn main() { println!(\"hello\"); }\n"
            .iter()
            .cycle()
            .take(4096)
            .copied()
            .collect();
        let random = crate::testdata::noise(1, 4096);
        for c in [Compression::Lz4, Compression::Zstd(3)] {
            let z = c.compress(&text).expect("text compresses");
            assert!(z.len() < 1024, "{c}: {}", z.len());
            let mut out = vec![0u8; 4096];
            c.decompress(&z, &mut out, "test chunk").unwrap();
            assert_eq!(out, text);
            assert!(c.compress(&random).is_none(), "{c}");
            // Damage is an error, never a panic; a short output is refused.
            let mut short = vec![0u8; 4000];
            assert!(c.decompress(&z, &mut short, "test chunk").is_err());
            assert!(c.decompress(&z[..z.len() / 2], &mut out, "t").is_err());
        }
        assert!(Compression::None.compress(&text).is_none());
    }

    /// One thread's reused zstd context gives each call the level asked
    /// for, and what one call left in it never leaks into the next: the
    /// output is what a fresh context gives.
    #[test]
    fn a_reused_zstd_context_follows_the_level_and_keeps_nothing() {
        let mut data = crate::testdata::noise(7, 1 << 16);
        data.extend_from_within(..1 << 15);
        data.extend(b"abcdefgh".iter().cycle().take(1 << 16));
        for level in [1, 19, 1, 3, 3, 22, 1] {
            let got = Compression::Zstd(level).compress(&data).unwrap();
            assert_eq!(
                got,
                zstd::bulk::compress(&data, level).unwrap(),
                "level {level}"
            );
            let mut out = vec![0u8; data.len()];
            Compression::Zstd(level)
                .decompress(&got, &mut out, "test chunk")
                .unwrap();
            assert_eq!(out, data);
        }
    }

    /// A tuned context gives what a fresh context with the same
    /// parameters gives, decodes as any zstd, and a call without the
    /// tuning after it gets plain output again.
    #[test]
    fn a_tuned_zstd_context_sets_its_parameters_and_only_for_its_calls() {
        let mut data = crate::testdata::noise(8, 1 << 16);
        data.extend_from_within(..1 << 15);
        data.extend(b"abcdefgh12345".iter().cycle().take(1 << 16));
        let six = ZstdTuning { min_match: Some(6) };
        let fresh = |m: u32| {
            let mut c = zstd::bulk::Compressor::new(1).unwrap();
            c.set_parameter(zstd::stream::raw::CParameter::MinMatch(m))
                .unwrap();
            c.compress(&data).unwrap()
        };
        let plain = zstd::bulk::compress(&data, 1).unwrap();
        for _ in 0..2 {
            let tuned = Compression::Zstd(1).compress_tuned(&data, six).unwrap();
            assert_eq!(tuned, fresh(6));
            let mut out = vec![0u8; data.len()];
            Compression::Zstd(1)
                .decompress(&tuned, &mut out, "test chunk")
                .unwrap();
            assert_eq!(out, data);
            assert_eq!(Compression::Zstd(1).compress(&data).unwrap(), plain);
        }
        let lz4 = Compression::Lz4.compress_tuned(&data, six).unwrap();
        assert_eq!(lz4, Compression::Lz4.compress(&data).unwrap());
    }
}
