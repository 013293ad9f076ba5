//! Blocks cut each from its own first byte (as the thread pool cuts them)
//! and stitched in order give exactly the segments of one thread cutting
//! the whole stream (`fastcdc`'s `StreamCDC`), whatever the block size,
//! on data with content cuts and with long runs where cuts are forced
//! every `max` bytes and candidates never meet the true cuts.

use dedup_store::parallel_cut::Stitcher;
use dedup_store::segment_blocks::cut_ends;
use dedup_store::segmenter::Segmenting;
use fastcdc::v2020::StreamCDC;
use proptest::prelude::*;

/// Bytes with runs of zeros (forced cuts) between varied stretches.
fn data(seed: u64, len: usize, zeros: usize) -> Vec<u8> {
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

fn streamed(how: Segmenting, bytes: &[u8]) -> Vec<Vec<u8>> {
    let Segmenting::FastCdc { min, avg, max } = how else {
        return bytes.chunks(4096).map(<[u8]>::to_vec).collect();
    };
    StreamCDC::new(bytes, min, avg, max)
        .map(|c| c.unwrap().data)
        .collect()
}

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

const HOWS: [Segmenting; 3] = [
    Segmenting::FASTCDC_4K,
    Segmenting::FASTCDC_8K,
    Segmenting::FastCdc {
        min: 256,
        avg: 1024,
        max: 4096,
    },
];

#[test]
fn megabyte_blocks_cut_as_the_stream_does() {
    for zeros in [0, 300, 5000] {
        let bytes = data(7, 9 << 20, zeros);
        for how in HOWS {
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
    for how in HOWS {
        assert_eq!(
            stitched(how, &bytes, (1 << 20) + 123),
            streamed(how, &bytes)
        );
    }
}

#[test]
fn empty_and_tiny_streams() {
    for how in HOWS {
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
        // At least twice the largest segment, as the backup's blocks are.
        block in 8192usize..100_000,
        zeros in prop_oneof![Just(0usize), 1usize..3000],
        how in 0usize..3,
    ) {
        let bytes = data(seed, len, zeros);
        let how = HOWS[how];
        let block = match how {
            Segmenting::FastCdc { max, .. } => block.max(2 * max as usize),
            Segmenting::Fixed { .. } => block,
        };
        prop_assert_eq!(stitched(how, &bytes, block), streamed(how, &bytes));
    }
}
