//! Cutting a backup stream into segments: fixed 4 KiB by default, as in the
//! paper (§3.1), or content-defined with FastCDC, whose cut points move with
//! the content so an insertion only changes the segments around it.
//!
//! Both read the stream as it comes (FastCDC through `fastcdc`'s streaming
//! `StreamCDC`; dedup-analyze's chunker wants whole buffers fed to it and
//! lives in a crate we should not depend on).

use std::io::{self, Read};

use fastcdc::v2020::StreamCDC;

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

/// The segments of a stream, in order; the last may be short.
pub enum Segmenter<R: Read> {
    Fixed { reader: R, size: usize, done: bool },
    Cdc(Box<StreamCDC<R>>),
}

impl<R: Read> Segmenter<R> {
    pub fn new(how: Segmenting, reader: R) -> Segmenter<R> {
        match how {
            Segmenting::Fixed { size } => Segmenter::Fixed {
                reader,
                size: size as usize,
                done: false,
            },
            Segmenting::FastCdc { min, avg, max } => {
                Segmenter::Cdc(Box::new(StreamCDC::new(reader, min, avg, max)))
            }
        }
    }
}

impl<R: Read> Iterator for Segmenter<R> {
    type Item = io::Result<Vec<u8>>;

    fn next(&mut self) -> Option<io::Result<Vec<u8>>> {
        match self {
            Segmenter::Fixed { reader, size, done } => {
                if *done {
                    return None;
                }
                let mut buf = vec![0u8; *size];
                let mut filled = 0;
                while filled < buf.len() {
                    match reader.read(&mut buf[filled..]) {
                        Ok(0) => break,
                        Ok(n) => filled += n,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => {
                            *done = true;
                            return Some(Err(e));
                        }
                    }
                }
                if filled < buf.len() {
                    *done = true;
                }
                if filled == 0 {
                    return None;
                }
                buf.truncate(filled);
                Some(Ok(buf))
            }
            Segmenter::Cdc(cdc) => cdc
                .next()
                .map(|r| r.map(|c| c.data).map_err(io::Error::from)),
        }
    }
}
