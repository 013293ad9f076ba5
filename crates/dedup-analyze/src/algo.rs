//! The algorithms compared and their parameters, as named on the command
//! line: `wfh`, `fbh:4k`, `fastcdc:8k` (min = avg/2, max = 2×avg, as in
//! the paper) or `fastcdc:8k:2k:64k` (avg:min:max), `rabin:8k[:min:max]`.

use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Algorithm {
    /// Whole-file hashing.
    Wfh,
    /// Fixed-size chunks from the start of each file.
    Fbh { size: usize },
    /// Content-defined chunks, Rabin fingerprints over a 64-byte window.
    Rabin { min: usize, avg: usize, max: usize },
    /// Content-defined chunks, FastCDC (Gear hash, normalized chunking).
    Fastcdc { min: usize, avg: usize, max: usize },
}

fn size(s: &str) -> Result<usize, String> {
    dedup_core::size::parse_size(s)
        .map(|v| v as usize)
        .map_err(|e| format!("`{s}`: {e}"))
}

impl Algorithm {
    pub fn parse(s: &str) -> Result<Algorithm, String> {
        let parts: Vec<&str> = s.split(':').collect();
        let cdc = |parts: &[&str]| -> Result<(usize, usize, usize), String> {
            let avg = size(
                parts
                    .get(1)
                    .ok_or("needs an average size, e.g. fastcdc:8k")?,
            )?;
            let min = parts
                .get(2)
                .map(|p| size(p))
                .transpose()?
                .unwrap_or(avg / 2);
            let max = parts
                .get(3)
                .map(|p| size(p))
                .transpose()?
                .unwrap_or(avg * 2);
            if parts.len() > 4 {
                return Err("too many fields (avg:min:max at most)".into());
            }
            Ok((min, avg, max))
        };
        let a = match parts[0] {
            "wfh" if parts.len() == 1 => Algorithm::Wfh,
            "fbh" if parts.len() == 2 => Algorithm::Fbh {
                size: size(parts[1])?,
            },
            "rabin" | "vbh" => {
                let (min, avg, max) = cdc(&parts)?;
                Algorithm::Rabin { min, avg, max }
            }
            "fastcdc" | "cdc" => {
                let (min, avg, max) = cdc(&parts)?;
                Algorithm::Fastcdc { min, avg, max }
            }
            _ => {
                return Err(format!(
                    "unknown algorithm `{s}`: use wfh, fbh:SIZE, rabin:AVG[:MIN:MAX] or fastcdc:AVG[:MIN:MAX]"
                ))
            }
        };
        a.validate().map_err(|e| format!("`{s}`: {e}"))?;
        Ok(a)
    }

    /// Sizes from 4 KiB to 1 MiB, averages powers of two, min ≤ avg ≤ max.
    pub fn validate(&self) -> Result<(), String> {
        const LO: usize = 4 << 10;
        const HI: usize = 1 << 20;
        match *self {
            Algorithm::Wfh => Ok(()),
            Algorithm::Fbh { size } => {
                if !(LO..=HI).contains(&size) || !size.is_power_of_two() {
                    return Err(format!(
                        "the block size {size} must be a power of two from 4 KiB to 1 MiB"
                    ));
                }
                Ok(())
            }
            Algorithm::Rabin { min, avg, max } | Algorithm::Fastcdc { min, avg, max } => {
                if !(LO..=HI).contains(&avg) || !avg.is_power_of_two() {
                    return Err(format!(
                        "the average size {avg} must be a power of two from 4 KiB to 1 MiB"
                    ));
                }
                if !(min <= avg && avg <= max) {
                    return Err(format!("need min ≤ avg ≤ max, got {min} / {avg} / {max}"));
                }
                if min < 256 || max > 16 * HI {
                    return Err(format!(
                        "min {min} must be at least 256 and max {max} at most 16 MiB"
                    ));
                }
                Ok(())
            }
        }
    }

    /// A short name for tables: `fbh-4K`, `fastcdc-8K`.
    pub fn label(&self) -> String {
        let k = |v: usize| {
            if v >= 1 << 20 && v % (1 << 20) == 0 {
                format!("{}M", v >> 20)
            } else if v % 1024 == 0 {
                format!("{}K", v >> 10)
            } else {
                v.to_string()
            }
        };
        match *self {
            Algorithm::Wfh => "wfh".into(),
            Algorithm::Fbh { size } => format!("fbh-{}", k(size)),
            Algorithm::Rabin { avg, .. } => format!("rabin-{}", k(avg)),
            Algorithm::Fastcdc { avg, .. } => format!("fastcdc-{}", k(avg)),
        }
    }

    /// The nominal chunk size (average for CDC; None for whole files).
    pub fn nominal_size(&self) -> Option<usize> {
        match *self {
            Algorithm::Wfh => None,
            Algorithm::Fbh { size } => Some(size),
            Algorithm::Rabin { avg, .. } | Algorithm::Fastcdc { avg, .. } => Some(avg),
        }
    }
}

/// The default comparison: WFH, and FBH, Rabin and FastCDC at 4, 8, 16,
/// 32 and 64 KiB (the paper's Table 3 ranges 16 KiB to 512 KiB; a block
/// device deduplicates at 4 KiB).
pub fn defaults() -> Vec<Algorithm> {
    let mut v = vec![Algorithm::Wfh];
    for kib in [4usize, 8, 16, 32, 64] {
        let s = kib << 10;
        v.push(Algorithm::Fbh { size: s });
        v.push(Algorithm::Rabin {
            min: s / 2,
            avg: s,
            max: s * 2,
        });
        v.push(Algorithm::Fastcdc {
            min: s / 2,
            avg: s,
            max: s * 2,
        });
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_with_the_papers_defaults_and_bad_ones_say_why() {
        assert_eq!(Algorithm::parse("wfh").unwrap(), Algorithm::Wfh);
        assert_eq!(
            Algorithm::parse("fastcdc:16k").unwrap(),
            Algorithm::Fastcdc {
                min: 8192,
                avg: 16384,
                max: 32768
            }
        );
        assert_eq!(
            Algorithm::parse("rabin:8k:2k:64k").unwrap(),
            Algorithm::Rabin {
                min: 2048,
                avg: 8192,
                max: 65536
            }
        );
        for (bad, says) in [
            ("fbh:3k", "power of two"),
            ("fastcdc:8k:16k", "min ≤ avg ≤ max"),
            ("fbh:2M", "1 MiB"),
            ("lzw", "unknown algorithm"),
            ("fastcdc", "average size"),
        ] {
            let e = Algorithm::parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
        assert_eq!(Algorithm::parse("fbh:1M").unwrap().label(), "fbh-1M");
    }
}
