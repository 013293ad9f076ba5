//! Backing up one stream in this process: cut it into segments and append
//! them to a [`BackupSession`](crate::session::BackupSession), which keeps
//! each segment the index finds already stored, writes the new ones into
//! containers, then commits the recipe and the backup object, in that
//! order. Only the last `put` makes the backup visible, so a backup that
//! fails or dies part-way leaves no backup, only unreferenced containers
//! for GC.
//!
//! Stages, as the paper's client pipeline (§3.4) on one machine: a thread
//! reads and cuts (for FastCDC segments it only reads, and the thread
//! pool cuts: `parallel_cut.rs`), the thread pool hashes (BLAKE3) and
//! compresses frames,
//! this thread looks up and fills containers, and a thread per sealed
//! container writes it, so all of them overlap on the machine's cores.

use std::io::{self, Read};
use std::sync::mpsc;

use dedup_common::fingerprint::Fingerprint;

use crate::backup::BackupReport;
use crate::error::repo::{RepoError, RepoResult};
use crate::parallel_cut::Stitcher;
use crate::repo::Repository;
use crate::segment_blocks::{cut_ends, read_block, Block, BlockCutter, BLOCK};
use crate::segment_hash::SegmentHash;
use crate::segmenter::Segmenting;
use crate::session::BackupSession;

/// Blocks (each hashed as one job) in flight: enough to keep every core
/// busy and ride out a container write, little enough to bound RAM
/// (8 MiB).
const IN_FLIGHT: usize = 8;

type Hashed = io::Result<(Block, Vec<Fingerprint>)>;

impl Repository {
    /// Back up `reader` as backup `name` in `group`.
    pub fn backup_stream(
        &self,
        name: &str,
        group: &str,
        reader: impl Read + Send,
    ) -> RepoResult<BackupReport> {
        let mut session = self.begin_backup(name, group)?;
        append_stream(&mut session, self.config.segmenting, reader)
            .map_err(|e| e.into_repo(|| format!("reading the stream of backup {name}")))?;
        Ok(session.commit()?.report)
    }
}

pub(crate) enum StreamError {
    Read(io::Error),
    Repo(RepoError),
}

impl StreamError {
    /// As the repository's error, a failed read named by `context`.
    pub(crate) fn into_repo(self, context: impl FnOnce() -> String) -> RepoError {
        match self {
            StreamError::Read(cause) => RepoError::Io {
                context: context(),
                cause,
            },
            StreamError::Repo(e) => e,
        }
    }
}

/// Cut `reader` into segments with `how` and append them all to `session`.
/// (FastCDC segments are cut on the thread pool instead, below.)
/// A thread reads and cuts; each block of segments is hashed on the thread
/// pool (cutting and hashing cost about the same, so one thread doing both
/// was the bottleneck of a backup of duplicate data); this thread takes the
/// blocks in stream order, each once hashed.
pub(crate) fn append_stream(
    session: &mut BackupSession<'_>,
    how: Segmenting,
    reader: impl Read + Send,
) -> Result<(), StreamError> {
    if let Segmenting::FastCdc { .. } = how {
        return append_stream_cut_in_parallel(session, how, reader);
    }
    let hash = session.segment_hash();
    std::thread::scope(|scope| {
        let (tx, rx) = mpsc::sync_channel::<mpsc::Receiver<Hashed>>(IN_FLIGHT);
        let (give_back, spares) = mpsc::channel::<Vec<u8>>();
        scope.spawn(move || {
            let mut cutter = BlockCutter::new(how, reader, BLOCK);
            loop {
                while let Ok(spare) = spares.try_recv() {
                    cutter.give_back(spare);
                }
                let Some(block) = cutter.next() else { break };
                let failed = block.is_err();
                let (done, hashed) = mpsc::sync_channel(1);
                rayon::spawn(move || {
                    let _ = done.send(block.map(|b| {
                        let fps = fingerprints(hash, &b);
                        (b, fps)
                    }));
                });
                if tx.send(hashed).is_err() || failed {
                    return; // the appender stopped, or the stream failed
                }
            }
        });
        // Dropping `rx` on an error stops the reader at its next send.
        for hashed in rx {
            // The pool always answers unless hashing panicked (a bug).
            let (block, fps) = hashed
                .recv()
                .map_err(|_| StreamError::Read(io::Error::other("a hashing job died")))?
                .map_err(StreamError::Read)?;
            for (data, fp) in block.segments().zip(fps) {
                session.append_hashed(data, fp).map_err(StreamError::Repo)?;
            }
            // The reader may be gone (it stops after the last block).
            let _ = give_back.send(block.bytes);
        }
        Ok(())
    })
}

/// Each segment's fingerprint, in order.
fn fingerprints(hash: SegmentHash, block: &Block) -> Vec<Fingerprint> {
    hash.of_many(&block.segments().collect::<Vec<_>>())
}

/// A block as read, cut from its own first byte (its candidate cuts) and
/// hashed on the pool, and whether the stream ends with it.
pub(crate) type Candidates = io::Result<(Block, Vec<Fingerprint>, bool)>;

/// Where stitched segments go, in stream order, each with its fingerprint
/// if the pool computed it (the stitching cuts a few segments again,
/// unhashed): a backup session, or a test's list.
pub(crate) trait Sink {
    fn segment(&mut self, data: &[u8], fp: Option<&Fingerprint>) -> Result<(), StreamError>;
}

impl Sink for BackupSession<'_> {
    fn segment(&mut self, data: &[u8], fp: Option<&Fingerprint>) -> Result<(), StreamError> {
        match fp {
            Some(fp) => self.append_hashed(data, *fp),
            None => self.append(data),
        }
        .map_err(StreamError::Repo)
    }
}

/// Cut a block read (`read_block`'s answer) from its own first byte and
/// hash its candidate segments, as a job on the thread pool.
pub(crate) fn cut_on_pool(
    how: Segmenting,
    hash: SegmentHash,
    block: io::Result<(Vec<u8>, bool)>,
) -> mpsc::Receiver<Candidates> {
    let (done, cut) = mpsc::sync_channel(1);
    rayon::spawn(move || {
        let _ = done.send(block.map(|(bytes, last)| {
            let ends = cut_ends(how, &bytes, last);
            let block = Block {
                bytes,
                start: 0,
                ends,
            };
            let fps = fingerprints(hash, &block);
            (block, fps, last)
        }));
    });
    cut
}

/// Wait for the next block cut on the pool (`cut_on_pool`), stitch it in
/// order and hand its segments to `sink`; its bytes back, once used, to
/// read into again.
pub(crate) fn append_stitched(
    stitcher: &mut Stitcher,
    cut: &mpsc::Receiver<Candidates>,
    sink: &mut impl Sink,
) -> Result<Option<Vec<u8>>, StreamError> {
    // The pool always answers unless cutting panicked (a bug).
    let (block, fps, last) = cut
        .recv()
        .map_err(|_| StreamError::Read(io::Error::other("a cutting job died")))?
        .map_err(StreamError::Read)?;
    let s = stitcher.push(block.bytes, &block.ends, last);
    for segment in s.head.iter().flat_map(Block::segments) {
        sink.segment(segment, None)?;
    }
    let Some(m) = s.main else {
        return Ok(s.spare);
    };
    debug_assert_eq!(m.block.ends.len(), m.unhashed + fps.len() - m.next);
    let fps = std::iter::repeat_n(None, m.unhashed).chain(fps[m.next..].iter().map(Some));
    for (data, fp) in m.block.segments().zip(fps) {
        sink.segment(data, fp)?;
    }
    Ok(Some(m.block.bytes))
}

/// `append_stream` for content-defined segments, cut on the thread pool
/// (`parallel_cut.rs`): a thread only reads blocks; each is cut from its
/// own first byte and hashed on the pool; this thread stitches them in
/// order into the segments one thread cutting the stream would make,
/// hashing only the few it cut again, and appends them.
fn append_stream_cut_in_parallel(
    session: &mut BackupSession<'_>,
    how: Segmenting,
    mut reader: impl Read + Send,
) -> Result<(), StreamError> {
    // Two of the largest segments at least, as `BlockCutter` reads, so
    // most blocks hold candidates for the stitching to meet.
    let size = BLOCK.max(2 * how.largest());
    let hash = session.segment_hash();
    std::thread::scope(|scope| {
        let (tx, rx) = mpsc::sync_channel::<mpsc::Receiver<Candidates>>(IN_FLIGHT);
        let (give_back, spares) = mpsc::channel::<Vec<u8>>();
        scope.spawn(move || loop {
            let block = read_block(&mut reader, &[], size, spares.try_recv().ok());
            let stop = !matches!(&block, Ok((_, false)));
            if tx.send(cut_on_pool(how, hash, block)).is_err() || stop {
                return; // the appender stopped, the stream ended or failed
            }
        });
        let mut stitcher = Stitcher::new(how);
        for cut in rx {
            if let Some(spare) = append_stitched(&mut stitcher, &cut, session)? {
                let _ = give_back.send(spare);
            }
        }
        Ok(())
    })
}
