//! The block cutter cuts exactly where `fastcdc`'s streaming `StreamCDC`
//! does (and fixed-size cutting in plain pieces), whatever the block size
//! and however the reader hands out bytes, so a repository's backups keep
//! deduplicating against those made before it, when StreamCDC cut them.

use std::io::{self, Read};

use dedup_store::segment_blocks::BlockCutter;
use dedup_store::segmenter::Segmenting;
use fastcdc::v2020::StreamCDC;
use proptest::prelude::*;

/// A reader that hands out at most `step` bytes a call.
struct Trickle<'a> {
    data: &'a [u8],
    step: usize,
}

impl Read for Trickle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = buf.len().min(self.step).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

/// Bytes with runs (so FastCDC finds both content cuts and forced ones).
fn data(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let run = (x % 64) as usize;
        if x % 5 == 0 {
            out.extend(std::iter::repeat_n(0u8, run * 300));
        } else {
            out.extend((0..run * 40).map(|i| (x >> (i % 56)) as u8));
        }
    }
    out.truncate(len);
    out
}

/// The segments as the streaming cutters make them.
fn streamed(how: Segmenting, bytes: &[u8]) -> Vec<Vec<u8>> {
    match how {
        Segmenting::Fixed { size } => bytes.chunks(size as usize).map(<[u8]>::to_vec).collect(),
        Segmenting::FastCdc { min, avg, max } => StreamCDC::new(bytes, min, avg, max)
            .map(|c| c.unwrap().data)
            .collect(),
    }
}

fn blocked(how: Segmenting, bytes: &[u8], block: usize, step: usize) -> Vec<Vec<u8>> {
    let mut cutter = BlockCutter::new(how, Trickle { data: bytes, step }, block);
    let mut out = Vec::new();
    while let Some(b) = cutter.next() {
        let b = b.unwrap();
        assert_eq!(b.ends.last(), Some(&b.bytes.len()));
        out.extend(b.segments().map(<[u8]>::to_vec));
        cutter.give_back(b.bytes);
    }
    out
}

const HOWS: [Segmenting; 4] = [
    Segmenting::FASTCDC_4K,
    Segmenting::FASTCDC_8K,
    Segmenting::FastCdc {
        min: 256,
        avg: 1024,
        max: 4096,
    },
    Segmenting::Fixed { size: 4096 },
];

#[test]
fn a_megabyte_block_cuts_as_the_stream_does() {
    let bytes = data(7, 5 << 20);
    for how in HOWS {
        assert_eq!(
            blocked(how, &bytes, 1 << 20, 1 << 16),
            streamed(how, &bytes),
            "{how:?}"
        );
    }
}

#[test]
fn empty_and_tiny_streams() {
    for how in HOWS {
        assert!(blocked(how, &[], 1 << 20, 100).is_empty());
        assert_eq!(blocked(how, b"x", 1 << 20, 100), vec![b"x".to_vec()]);
    }
}

#[test]
fn a_read_error_is_passed_on_and_ends_the_blocks() {
    struct Failing(usize);
    impl Read for Failing {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            if self.0 == 0 {
                return Err(io::Error::other("disk on fire"));
            }
            let n = buf.len().min(self.0);
            buf[..n].fill(7);
            self.0 -= n;
            Ok(n)
        }
    }
    let mut cutter = BlockCutter::new(Segmenting::FASTCDC_4K, Failing(100_000), 1 << 16);
    let mut results: Vec<_> = cutter.by_ref().collect();
    let last = results.pop().unwrap();
    assert!(last.is_err_and(|e| e.to_string().contains("fire")));
    assert!(results.iter().all(Result::is_ok));
    assert!(cutter.next().is_none());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn any_block_size_and_read_size_cut_as_the_stream_does(
        seed in any::<u64>(),
        len in 0usize..300_000,
        block in 1usize..100_000,
        step in 1usize..70_000,
        how in 0usize..3,
    ) {
        let bytes = data(seed, len);
        let how = HOWS[how];
        prop_assert_eq!(blocked(how, &bytes, block, step), streamed(how, &bytes));
    }
}
