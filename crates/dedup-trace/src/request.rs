//! One traced request.

use serde::{Deserialize, Serialize};

use crate::content;

/// The block size seeds are given in (native format), and the unit of the
/// statistics: Dmdedup's dedup block size for the Web and Mail traces.
pub const BLOCK: u64 = 4096;

/// The largest request a trace may hold (NBD's own limit is 32 MiB): a
/// replay allocates a buffer of this size, so a damaged length must not
/// ask for more.
pub const MAX_REQUEST: u64 = 64 << 20;

/// Requests name written content by seeds; the type lives with what turns
/// a seed into bytes (`content`, the layer below), re-exported here.
pub use crate::content::Seed;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Op {
    Read,
    Write,
    /// Discard (TRIM): the range reads as zeros afterwards.
    Trim,
    /// WRITE_ZEROES.
    Zero,
    Flush,
}

/// What a write puts in its range.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Content {
    /// No data (reads, trims, zeroes, flushes).
    None,
    /// One seed for the whole request (FIU: one md5 per request).
    Whole(Seed),
    /// One entry per `BLOCK`-aligned block the range touches, first to
    /// last; `None` is an all-zero block. A partial block's seed names
    /// only the bytes inside the range.
    PerBlock(Vec<Option<Seed>>),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// Nanoseconds since the trace began.
    pub time_ns: u64,
    pub op: Op,
    /// Force unit access: durable when acknowledged.
    pub fua: bool,
    pub offset: u64,
    pub len: u64,
    pub content: Content,
}

impl Request {
    /// The `BLOCK`-aligned blocks the request touches.
    pub fn blocks(&self) -> std::ops::Range<u64> {
        if self.len == 0 {
            return self.offset / BLOCK..self.offset / BLOCK;
        }
        self.offset / BLOCK..(self.offset + self.len).div_ceil(BLOCK)
    }

    pub fn end(&self) -> u64 {
        self.offset + self.len
    }

    /// The content seed of each touched block of a write (`None`: zeros),
    /// as the statistics count them. A whole-request seed names each block
    /// by the seed and the block's place in the request.
    pub fn block_seeds(&self) -> Vec<Option<Seed>> {
        match &self.content {
            Content::None => Vec::new(),
            Content::PerBlock(v) => v.clone(),
            Content::Whole(seed) => self
                .blocks()
                .enumerate()
                .map(|(i, _)| Some(content::derive(seed, i as u64, self.len)))
                .collect(),
        }
    }
}
