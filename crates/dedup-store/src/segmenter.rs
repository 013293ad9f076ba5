//! How a repository cuts backup streams into segments: fixed 4 KiB by
//! default, as in the paper (§3.1), or content-defined with FastCDC, whose
//! cut points move with the content so an insertion only changes the
//! segments around it. The cutting itself is `segment_blocks`'s.

/// How a repository cuts streams; recorded in its config so every backup
/// of one repository is cut the same way (otherwise they would not dedup).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Segmenting {
    Fixed { size: u32 },
    FastCdc { min: u32, avg: u32, max: u32 },
}

impl Segmenting {
    /// Fixed 4 KiB segments: the paper's choice.
    pub const DEFAULT: Segmenting = Segmenting::Fixed { size: 4096 };

    /// FastCDC averaging 4 KiB, from 1 KiB to 16 KiB: a wide range, so
    /// forced cuts at the maximum are rare and cut points stay content-defined.
    pub const FASTCDC_4K: Segmenting = Segmenting::FastCdc {
        min: 1024,
        avg: 4096,
        max: 16384,
    };

    /// Refuse sizes `fastcdc` or a container would not take.
    pub fn check(&self) -> Result<(), String> {
        use fastcdc::v2020 as f;
        match *self {
            Segmenting::Fixed { size }
                if size == 0 || size as usize > crate::format::MAX_SEGMENT_LEN =>
            {
                Err(format!("fixed segment size {size} is out of range"))
            }
            Segmenting::Fixed { .. } => Ok(()),
            Segmenting::FastCdc { min, avg, max } => {
                let ok = (f::MINIMUM_MIN..=f::MINIMUM_MAX).contains(&min)
                    && (f::AVERAGE_MIN..=f::AVERAGE_MAX).contains(&avg)
                    && (f::MAXIMUM_MIN..=f::MAXIMUM_MAX).contains(&max)
                    && min <= avg
                    && avg <= max;
                if ok {
                    Ok(())
                } else {
                    Err(format!("FastCDC sizes {min}/{avg}/{max} are out of range"))
                }
            }
        }
    }
}
