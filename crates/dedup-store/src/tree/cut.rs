//! The walk's files cut and hashed on the thread pool, appended in walk
//! order.
//!
//! A backup of files used to read, cut and hash every file on the one
//! thread that also walks the tree and appends to the session, with only
//! compression on the pool: on `/usr/share` and `/usr/lib` (4.8 GB,
//! 108,844 files) that thread did half of all the work and set the pace.
//! Here it only walks, reads and appends. Each block of a file is cut
//! from its own first byte and hashed as one job on the pool, as a stream
//! is (`backup_stream.rs`), and stitched in order (`parallel_cut.rs`)
//! into the segments one thread cutting file by file would make: files
//! still never share a segment, since every file's last block ends its
//! stream and leaves the stitcher nothing carried.

use std::collections::VecDeque;
use std::io::Read;
use std::sync::mpsc;

use crate::backup_stream::{append_stitched, cut_on_pool, Candidates, Sink, StreamError};
use crate::parallel_cut::Stitcher;
use crate::segment_blocks::{read_block, BLOCK};
use crate::segment_hash::SegmentHash;
use crate::segmenter::Segmenting;

/// Blocks cut or being cut on the pool, at most: many small files make
/// many small jobs, and the pool must not run dry between them.
const MAX_PENDING: usize = 64;

/// Bytes in blocks not yet appended, at most: enough to keep every core
/// busy (8 MiB, with 10 spares, was no faster on `/usr/share` and
/// `/usr/lib`), as few as a stream keeps in flight.
const MAX_PENDING_BYTES: usize = 4 << 20;

/// A file this small is read into room of its own size: the spare blocks
/// are kept for larger reads, which would otherwise fault in fresh pages,
/// and up to `MAX_PENDING` small files would each hold one.
const SMALL: usize = 64 << 10;

/// Spare blocks kept, at most: as many as can be pending, and two.
const MAX_SPARES: usize = MAX_PENDING_BYTES / BLOCK + 2;

/// Reads files into blocks, has them cut on the pool, and hands their
/// segments on in order.
pub(crate) struct FileCutter {
    how: Segmenting,
    hash: SegmentHash,
    /// The bytes of a block that is not its file's last.
    block: usize,
    stitcher: Stitcher,
    pending: VecDeque<(mpsc::Receiver<Candidates>, usize)>,
    pending_bytes: usize,
    /// Blocks appended, read into again: a fresh megabyte costs page
    /// faults and the kernel zeroing its pages.
    spares: Vec<Vec<u8>>,
}

impl FileCutter {
    pub(crate) fn new(how: Segmenting, hash: SegmentHash) -> FileCutter {
        FileCutter {
            how,
            hash,
            // Two of the largest segments at least, so most blocks hold
            // candidates for the stitching to meet.
            block: BLOCK.max(2 * how.largest()),
            stitcher: Stitcher::new(how),
            pending: VecDeque::new(),
            pending_bytes: 0,
            spares: Vec::new(),
        }
    }

    /// Read `file` to its end (`len` bytes, as it was when opened, though
    /// it may have changed since) and append its segments, some of them
    /// perhaps only after later files are read (`finish` appends all).
    pub(crate) fn file(
        &mut self,
        sink: &mut impl Sink,
        file: &mut impl Read,
        len: u64,
    ) -> Result<(), StreamError> {
        let mut read = 0u64;
        loop {
            // A byte past the expected end, so a file that has not grown
            // ends with its last block (no empty block after it); one
            // that grew is read on in whole blocks.
            let size = match len.checked_sub(read) {
                Some(left) => (left as usize).saturating_add(1).min(self.block),
                None => self.block,
            };
            let room = (size > SMALL).then(|| {
                self.spares
                    .pop()
                    .unwrap_or_else(|| Vec::with_capacity(self.block))
            });
            let (bytes, last) = read_block(file, &[], size, room).map_err(StreamError::Read)?;
            let n = bytes.len();
            read += n as u64;
            self.pending_bytes += n;
            self.pending
                .push_back((cut_on_pool(self.how, self.hash, Ok((bytes, last))), n));
            while self.pending.len() > MAX_PENDING || self.pending_bytes > MAX_PENDING_BYTES {
                self.append_oldest(sink)?;
            }
            if last {
                return Ok(());
            }
        }
    }

    /// Hand on the segments of every block read so far.
    pub(crate) fn finish(&mut self, sink: &mut impl Sink) -> Result<(), StreamError> {
        while !self.pending.is_empty() {
            self.append_oldest(sink)?;
        }
        Ok(())
    }

    /// Wait for the oldest block's cut and append its segments.
    fn append_oldest(&mut self, sink: &mut impl Sink) -> Result<(), StreamError> {
        let Some((cut, n)) = self.pending.pop_front() else {
            return Ok(());
        };
        self.pending_bytes -= n;
        let spare = append_stitched(&mut self.stitcher, &cut, sink)?;
        if let Some(bytes) = spare.filter(|b| b.capacity() >= self.block) {
            if self.spares.len() < MAX_SPARES {
                self.spares.push(bytes);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::segment_blocks::BlockCutter;
    use crate::writer::HASH;
    use dedup_common::fingerprint::Fingerprint;
    use proptest::prelude::*;

    /// Every segment handed on, and whether its fingerprint came along.
    #[derive(Default)]
    struct Collect(Vec<(Vec<u8>, bool)>);

    impl Sink for Collect {
        fn segment(&mut self, data: &[u8], fp: Option<&Fingerprint>) -> Result<(), StreamError> {
            if let Some(fp) = fp {
                assert_eq!(
                    *fp,
                    HASH.fingerprint(data),
                    "a wrong fingerprint came along"
                );
            }
            self.0.push((data.to_vec(), fp.is_some()));
            Ok(())
        }
    }

    /// A file's bytes: random, one repeated byte (cut only at the largest
    /// size), or a short pattern.
    fn content(kind: u8, len: usize, seed: u64) -> Vec<u8> {
        match kind % 3 {
            0 => dedup_common::testdata::noise(seed, len),
            1 => vec![7; len],
            _ => (0..len).map(|i| (i % 251) as u8).collect(),
        }
    }

    /// Sizes near the edges the cutter cares about.
    fn size() -> impl Strategy<Value = usize> {
        prop_oneof![
            Just(0usize),
            0usize..100,
            Just(SMALL),
            Just(SMALL + 1),
            Just(BLOCK - 1),
            Just(BLOCK),
            Just(BLOCK + 1),
            0usize..3 * BLOCK,
        ]
    }

    fn cutter_of_one_thread(how: Segmenting, bytes: &[u8]) -> Vec<Vec<u8>> {
        BlockCutter::new(how, bytes, BLOCK)
            .flat_map(|b| {
                let b = b.expect("reading memory");
                b.segments().map(<[u8]>::to_vec).collect::<Vec<_>>()
            })
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        /// Files cut on the pool are cut exactly as one thread cuts each
        /// file alone, whatever their sizes and contents, and whether the
        /// size given when opened is right, short or long (a file that
        /// changed while read).
        #[test]
        fn files_are_cut_as_one_thread_cuts_each_alone(
            files in prop::collection::vec((size(), 0u8..3, any::<u64>(), -2000i64..2000), 1..12),
            fixed in any::<bool>(),
        ) {
            let how = if fixed {
                Segmenting::Fixed { size: 4096 }
            } else {
                Segmenting::FASTCDC_8K
            };
            let mut cutter = FileCutter::new(how, SegmentHash::PLAIN);
            let mut got = Collect::default();
            let mut want = Vec::new();
            for &(len, kind, seed, off) in &files {
                let bytes = content(kind, len, seed);
                let hint = (len as i64 + off).max(0) as u64;
                let before = got.0.len();
                cutter.file(&mut got, &mut &bytes[..], hint).map_err(|_| "cutting failed").unwrap();
                prop_assert!(got.0.len() >= before);
                want.extend(cutter_of_one_thread(how, &bytes));
            }
            cutter.finish(&mut got).map_err(|_| "cutting failed").unwrap();
            let got_segments: Vec<&Vec<u8>> = got.0.iter().map(|(s, _)| s).collect();
            let want_segments: Vec<&Vec<u8>> = want.iter().collect();
            prop_assert_eq!(got_segments, want_segments);
            prop_assert!(cutter.spares.len() <= MAX_SPARES);
        }
    }

    #[test]
    fn most_segments_of_a_large_file_come_hashed_from_the_pool() {
        let bytes = content(0, 4 * BLOCK + 12345, 99);
        let mut cutter = FileCutter::new(Segmenting::FASTCDC_8K, SegmentHash::PLAIN);
        let mut got = Collect::default();
        cutter
            .file(&mut got, &mut &bytes[..], bytes.len() as u64)
            .map_err(|_| ())
            .unwrap();
        cutter.finish(&mut got).map_err(|_| ()).unwrap();
        let hashed = got.0.iter().filter(|(_, h)| *h).count();
        assert!(
            hashed * 10 >= got.0.len() * 9,
            "{hashed} of {} hashed",
            got.0.len()
        );
        let joined: Vec<u8> = got.0.iter().flat_map(|(s, _)| s.iter().copied()).collect();
        assert_eq!(joined, bytes);
    }
}
