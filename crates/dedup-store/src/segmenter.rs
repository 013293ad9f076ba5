//! How a repository cuts backup streams into segments: fixed 4 KiB, as in
//! the paper (§3.1), or content-defined with FastCDC, whose cut points
//! move with the content so an insertion only changes the segments around
//! it. The cutting itself is `segment_blocks`'s.
//!
//! `dedup store init` makes FastCDC repositories (8 KiB average) unless
//! told otherwise: on the first backup of `/usr/share` and `/usr/lib` (4.4
//! GB, 104,000 files) they stored 1,587 MB where fixed 4 KiB stored 1,718
//! MB (restic 0.14 about 1,690, rustic 0.11 about 1,670), with half the
//! segments to hash, index and catalog (peak RSS 110 MB against 135 MB,
//! and faster), and store-bench has always measured dedup with FastCDC
//! on its workloads (8 KiB average since its run 9). The library's
//! `DEFAULT` stays the paper's.

/// How a repository cuts streams; recorded in its config so every backup
/// of one repository is cut the same way (otherwise they would not dedup).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Segmenting {
    Fixed { size: u32 },
    FastCdc { min: u32, avg: u32, max: u32 },
}

/// The smallest fixed segment `--segments fixed:SIZE` takes: a disk sector.
pub const MIN_FIXED: u32 = 512;

impl Segmenting {
    /// Fixed 4 KiB segments: the paper's choice, and `RepoOptions`'s
    /// (the CLI's default is [`Segmenting::FASTCDC_8K`]).
    pub const DEFAULT: Segmenting = Segmenting::Fixed { size: 4096 };

    /// FastCDC averaging 4 KiB, from 1 KiB to 16 KiB: a wide range, so
    /// forced cuts at the maximum are rare and cut points stay content-defined.
    pub const FASTCDC_4K: Segmenting = Segmenting::fastcdc(4096);

    /// FastCDC averaging 8 KiB (2-32 KiB), what `--segments fastcdc` gives:
    /// the FastCDC paper's and Data Domain's average. Against 4 KiB on a
    /// 2 GiB ext4 image it cut a backup's CPU by a tenth (half the
    /// segments to hash, look up and catalog; BLAKE3 hashes a 8 KiB
    /// segment's 1 KiB chunks eight abreast, a 4 KiB one's only four) and
    /// stored 2 % less (fewer catalog entries), while still finding a line
    /// inserted in a file within a segment or two.
    pub const FASTCDC_8K: Segmenting = Segmenting::fastcdc(8192);

    /// FastCDC averaging `avg`, from a quarter of it to four times it.
    pub const fn fastcdc(avg: u32) -> Segmenting {
        Segmenting::FastCdc {
            min: avg / 4,
            avg,
            max: avg.saturating_mul(4),
        }
    }

    /// The largest segment it cuts.
    pub fn largest(&self) -> usize {
        match *self {
            Segmenting::Fixed { size } => size as usize,
            Segmenting::FastCdc { max, .. } => max as usize,
        }
    }

    /// Parse `--segments`: `fixed` (4 KiB), `fixed:SIZE`, `fastcdc`
    /// (8 KiB average), `fastcdc:AVG` or `fastcdc:AVG:MIN:MAX`, sizes as
    /// `8K` or `8192`.
    pub fn parse(text: &str) -> Result<Segmenting, String> {
        let size = |field: &str| -> Result<u32, String> {
            let bytes = dedup_common::size::parse_size(field).map_err(|e| e.to_string())?;
            u32::try_from(bytes).map_err(|_| format!("segment size {field} is too large"))
        };
        let parts: Vec<&str> = text.split(':').collect();
        let how = match (parts[0].to_ascii_lowercase().as_str(), &parts[1..]) {
            ("fixed", []) => Segmenting::DEFAULT,
            ("fixed", [s]) => Segmenting::Fixed { size: size(s)? },
            ("fastcdc", []) => Segmenting::FASTCDC_8K,
            ("fastcdc", [avg]) => Segmenting::fastcdc(size(avg)?),
            ("fastcdc", [avg, min, max]) => Segmenting::FastCdc {
                min: size(min)?,
                avg: size(avg)?,
                max: size(max)?,
            },
            _ => {
                return Err(format!(
                    "unknown segmenting {text:?}: give fixed, fixed:SIZE, fastcdc, fastcdc:AVG or fastcdc:AVG:MIN:MAX (e.g. fastcdc:16K)"
                ))
            }
        };
        match how {
            Segmenting::Fixed { size } if size < MIN_FIXED => Err(format!(
                "fixed segment size {size} is too small: give at least {MIN_FIXED} bytes (every segment costs a catalog entry, an index lookup and a recipe reference)"
            )),
            Segmenting::FastCdc { avg, .. } if !avg.is_power_of_two() => Err(format!(
                "FastCDC average {avg} is not a power of two: FastCDC cuts at the nearest one (give e.g. 8K or 16K)"
            )),
            how => how.check().map(|()| how),
        }
    }

    /// Refuse sizes `fastcdc` or a container would not take.
    pub fn check(&self) -> Result<(), String> {
        use fastcdc::v2020 as f;
        match *self {
            Segmenting::Fixed { size }
                if size == 0 || size as usize > crate::format::MAX_SEGMENT_LEN =>
            {
                Err(format!(
                    "fixed segment size {size} is out of range: give 1 to {} bytes",
                    crate::format::MAX_SEGMENT_LEN
                ))
            }
            Segmenting::Fixed { .. } => Ok(()),
            Segmenting::FastCdc { min, avg, max } => {
                let range = |what: &str, v: u32, lo: u32, hi: u32| {
                    if (lo..=hi).contains(&v) {
                        Ok(())
                    } else {
                        Err(format!(
                            "FastCDC {what} size {v} is out of range: give {lo} to {hi} bytes"
                        ))
                    }
                };
                range("minimum", min, f::MINIMUM_MIN, f::MINIMUM_MAX)?;
                range("average", avg, f::AVERAGE_MIN, f::AVERAGE_MAX)?;
                range("maximum", max, f::MAXIMUM_MIN, f::MAXIMUM_MAX)?;
                if min > avg || avg > max {
                    return Err(format!(
                        "FastCDC sizes avg {avg}, min {min}, max {max} are out of order: need min <= avg <= max"
                    ));
                }
                Ok(())
            }
        }
    }
}
