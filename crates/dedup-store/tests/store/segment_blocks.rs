//! The block cutter cuts exactly where `fastcdc`'s streaming `StreamCDC`
//! does (and fixed-size cutting in plain pieces), whatever the block size
//! and however the reader hands out bytes, so a repository's backups keep
//! deduplicating against those made before it, when StreamCDC cut them;
//! and so do blocks cut on the thread pool and stitched (`parallel_cut.rs`).

use std::io::{self, Read};

use dedup_store::parallel_cut::Stitcher;
use dedup_store::segment_blocks::{cut_ends, BlockCutter};
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
    data_with_zeros(seed, len, 300)
}

/// `data` whose runs of zeros are `zeros` times a random 0-63 long.
fn data_with_zeros(seed: u64, len: usize, zeros: usize) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let run = (x % 64) as usize;
        if x % 5 == 0 {
            out.extend(std::iter::repeat_n(0u8, run * zeros));
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

/// The content-defined ways of `HOWS`.
const CDC_HOWS: [Segmenting; 3] = [HOWS[0], HOWS[1], HOWS[2]];

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

// Blocks cut each from its own first byte (as the thread pool cuts them)
// and stitched in order (`parallel_cut.rs`) give exactly the segments of
// one thread cutting the whole stream, whatever the block size, on data
// with content cuts and with long runs where cuts are forced every `max`
// bytes and candidates never meet the true cuts.

/// Cut `bytes` in blocks of `block` bytes as the backup does: candidates
/// per block, stitched in order; each block's candidate segments are
/// numbered to check `main`'s first one.
fn stitched(how: Segmenting, bytes: &[u8], block: usize) -> Vec<Vec<u8>> {
    stitched_counting(how, bytes, block).0
}

/// `stitched`, and how many blocks were taken from their candidates on.
fn stitched_counting(how: Segmenting, bytes: &[u8], block: usize) -> (Vec<Vec<u8>>, usize) {
    let mut st = Stitcher::new(how);
    let (mut out, mut met) = (Vec::new(), 0);
    let mut blocks: Vec<&[u8]> = bytes.chunks(block).collect();
    if blocks.is_empty() || bytes.len() % block == 0 {
        blocks.push(&[]); // the reader's last read: short, maybe empty
    }
    let n = blocks.len();
    for (i, raw) in blocks.into_iter().enumerate() {
        let last = i + 1 == n;
        let cands = cut_ends(how, raw, last);
        let s = st.push(raw.to_vec(), &cands, last);
        if let Some(head) = s.head {
            out.extend(head.segments().map(<[u8]>::to_vec));
        }
        if let Some(m) = s.main {
            // After its `unhashed` segments, `main`'s are the candidate
            // segments from number `next` on.
            let b = &m.block;
            let start = if m.next == 0 { 0 } else { cands[m.next - 1] };
            let hashed_from = m.unhashed.checked_sub(1).map_or(b.start, |i| b.ends[i]);
            assert_eq!(hashed_from, start);
            assert_eq!(&b.ends[m.unhashed..], &cands[m.next..]);
            out.extend(b.segments().map(<[u8]>::to_vec));
            met += 1;
        }
    }
    (out, met)
}

#[test]
fn megabyte_blocks_cut_as_the_stream_does() {
    for zeros in [0, 300, 5000] {
        let bytes = data_with_zeros(7, 9 << 20, zeros);
        for how in CDC_HOWS {
            let (segments, met) = stitched_counting(how, &bytes, 1 << 20);
            assert_eq!(
                segments,
                streamed(how, &bytes),
                "{how:?}, zero runs of {zeros}"
            );
            // The candidates are used, not cut again: without zero runs
            // most blocks meet (this data's short repeating stretches
            // force cuts that can keep them apart for a while).
            if zeros == 0 {
                assert!(met >= 7, "{how:?}: {met} of 10 blocks met");
            }
        }
    }
}

#[test]
fn all_zeros_never_meet_and_still_cut_as_the_stream_does() {
    let bytes = vec![0u8; 3 << 20];
    for how in CDC_HOWS {
        assert_eq!(
            stitched(how, &bytes, (1 << 20) + 123),
            streamed(how, &bytes)
        );
    }
}

#[test]
fn stitched_empty_and_tiny_streams() {
    for how in CDC_HOWS {
        assert!(stitched(how, &[], 1 << 20).is_empty());
        assert_eq!(stitched(how, b"x", 1 << 20), vec![b"x".to_vec()]);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn any_block_size_cuts_as_the_stream_does(
        seed in any::<u64>(),
        len in 0usize..400_000,
        // Also blocks smaller than the largest segment.
        block in 512usize..100_000,
        zeros in prop_oneof![Just(0usize), 1usize..3000],
        how in 0usize..3,
    ) {
        let bytes = data_with_zeros(seed, len, zeros);
        let how = CDC_HOWS[how];
        prop_assert_eq!(stitched(how, &bytes, block), streamed(how, &bytes));
    }
}

#[test]
fn a_backup_cuts_its_stream_on_the_pool_as_one_thread_does() {
    use dedup_store::{RepoOptions, Repository};
    let tmp = tempfile::tempdir().unwrap();
    let options = RepoOptions {
        segmenting: Segmenting::FASTCDC_4K,
        container_target: 256 << 10,
        ..RepoOptions::default()
    };
    let repo = Repository::init_with(tmp.path().join("repo"), options).unwrap();
    // Exactly two blocks (the last read is then empty), a part-block
    // more, nothing; read a few KiB at a time, so spares are refilled.
    for (i, len) in [2 << 20, (2 << 20) + 12_345, 0, 100]
        .into_iter()
        .enumerate()
    {
        let bytes = data_with_zeros(i as u64 + 3, len, 2000);
        let name = format!("s{i}");
        let reader = Trickle {
            data: &bytes,
            step: 7000,
        };
        repo.backup_stream(&name, "g", reader).unwrap();
        let (_, recipe) = repo.recipe(&name).unwrap();
        let lens: Vec<usize> = recipe.segments.iter().map(|s| s.len as usize).collect();
        let want: Vec<usize> = streamed(Segmenting::FASTCDC_4K, &bytes)
            .iter()
            .map(Vec::len)
            .collect();
        assert_eq!(lens, want, "{len} bytes");
        let mut out = Vec::new();
        repo.restore(&name, &mut out).unwrap();
        assert!(out == bytes, "{len} bytes");
    }
}
