//! Backing up a block device by the fingerprints it already keeps (issue
//! 39): a deduplicating device knows the fingerprint of every chunk it
//! stores, so where its chunks are the repository's segments (the same
//! size, plain BLAKE3) a backup needs only the device's map. Each block is
//! named by its fingerprint and looked up; only a chunk the repository
//! lacks is read, and its bytes are hashed again before they are stored:
//! a chunk whose bytes do not match its recorded fingerprint stops the
//! backup, named, and is never stored under a wrong name.
//!
//! The backup is a stream backup of the device's image (restored as an
//! image, like `nbdcopy | dedup backup --stdin`): an unmapped block is the
//! zero block's segment. A device whose chunks cannot be segments (another
//! size or hash, an encrypted repository whose fingerprints are keyed, a
//! repository of content-defined segments) is backed up by reading and
//! hashing its image, and the report says why.

use std::collections::HashMap;
use std::io::{self, Read};

use dedup_common::fingerprint::{Fingerprint, HashAlgo};
use serde::Serialize;

use crate::backup::BackupReport;
use crate::backup_stream::{append_stream, StreamError};
use crate::error::repo::{RepoError, RepoResult};
use crate::recipe::SegmentRef;
use crate::repo::Repository;
use crate::segmenter::Segmenting;
use crate::session::BackupSession;
use crate::writer::HASH;

/// What a source knows of one block without reading it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockState {
    /// Reads as zeros (never written, trimmed).
    Zero,
    /// Holds the bytes whose fingerprint (the source's hash) this is.
    Known(Fingerprint),
    /// Holds bytes the source keeps no fingerprint for: read them.
    Unknown,
}

/// A device as a backup by fingerprint sees it: blocks of one size, each
/// known by its state, readable in runs.
pub trait BlockSource: Send {
    /// Bytes in a block.
    fn block_size(&self) -> u32;
    /// Blocks in the device.
    fn blocks(&self) -> u64;
    /// The hash behind `BlockState::Known` fingerprints.
    fn hash(&self) -> HashAlgo;
    /// The states of blocks `first..first + count`, in order.
    fn map(&mut self, first: u64, count: u64) -> io::Result<Vec<BlockState>>;
    /// Fill `buf` (whole blocks) from block `first` on.
    fn read(&mut self, first: u64, buf: &mut [u8]) -> io::Result<()>;
    /// Block `block` named for a message (the device, the block and its
    /// byte offset) and what to do about a chunk that fails its check.
    fn describe(&self, block: u64) -> String;
}

/// What a backup of a block source did beyond a stream backup's report.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct BlocksReport {
    /// Whether blocks were named by the source's fingerprints (else its
    /// image was read and hashed whole).
    pub by_fingerprint: bool,
    /// Why not, when not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read_because: Option<String>,
    /// Blocks walked, and of those, blocks that read as zeros.
    pub blocks: u64,
    pub zero_blocks: u64,
    /// Blocks read from the source (the repository lacked them, or the
    /// source kept no fingerprint), and their bytes.
    pub blocks_read: u64,
    pub bytes_read: u64,
}

/// Blocks looked up, read and stored as one step: 4 MiB of 4 KiB blocks.
const STEP_BLOCKS: u64 = 1024;

impl Repository {
    /// Back up `source` as backup `name` in `group`: by its fingerprints
    /// when its blocks can be this repository's segments, else by reading
    /// it. `progress` is told the blocks walked so far.
    pub fn backup_blocks(
        &self,
        name: &str,
        group: &str,
        source: &mut dyn BlockSource,
        progress: &mut (dyn FnMut(u64) + Send),
    ) -> RepoResult<(BackupReport, BlocksReport)> {
        let mut session = self.begin_backup(name, group)?;
        let mut report = BlocksReport {
            blocks: source.blocks(),
            ..BlocksReport::default()
        };
        match self.why_not_by_fingerprint(source) {
            None => {
                report.by_fingerprint = true;
                append_by_fingerprint(&mut session, source, &mut report, progress)?;
            }
            Some(why) => {
                report.read_because = Some(why);
                let mut image = Image {
                    source,
                    next: 0,
                    block: Vec::new(),
                    taken: 0,
                    report: &mut report,
                    progress,
                };
                append_stream(&mut session, self.config.segmenting, &mut image).map_err(
                    |e| match e {
                        StreamError::Read(cause) => RepoError::Io {
                            context: format!("reading the device for backup {name}"),
                            cause,
                        },
                        StreamError::Repo(e) => e,
                    },
                )?;
            }
        }
        Ok((session.commit()?.report, report))
    }

    /// Why `source`'s fingerprints cannot name this repository's segments,
    /// if they cannot.
    fn why_not_by_fingerprint(&self, source: &dyn BlockSource) -> Option<String> {
        let size = source.block_size();
        match self.config.segmenting {
            Segmenting::Fixed { size: s } if s == size => {}
            Segmenting::Fixed { size: s } => {
                return Some(format!(
                    "the device's chunks are {size} bytes and the repository's segments {s}"
                ))
            }
            Segmenting::FastCdc { .. } => {
                return Some(
                    "the repository cuts content-defined segments (made with --segments fastcdc); \
                     one made with --segments fixed:4K takes a device's chunks as they are"
                        .into(),
                )
            }
        }
        if source.hash() != HASH {
            return Some(format!(
                "the device fingerprints chunks with {} and the repository with {HASH}",
                source.hash()
            ));
        }
        if self.segment_hash().is_keyed() {
            return Some(
                "the repository is encrypted: its fingerprints are keyed, the device's are not"
                    .into(),
            );
        }
        None
    }
}

/// One block of a step: where it is stored already, or what must be read
/// to store it.
enum Step {
    Found(SegmentRef),
    /// To store: its fingerprint if known, and the block whose bytes to
    /// store (an earlier block of the step with the same fingerprint, or
    /// itself); `None`: the zero block.
    Store(Option<Fingerprint>, Option<usize>),
}

fn append_by_fingerprint(
    session: &mut BackupSession<'_>,
    source: &mut dyn BlockSource,
    report: &mut BlocksReport,
    progress: &mut (dyn FnMut(u64) + Send),
) -> RepoResult<()> {
    let bs = source.block_size() as usize;
    let zeros = vec![0u8; bs];
    let zero_fp = HASH.fingerprint(&zeros);
    let name = session.name().to_string();
    let io = |what: &str, cause| RepoError::Io {
        context: format!("{what} the device for backup {name}"),
        cause,
    };
    let mut buf = Vec::new();
    let mut first = 0;
    while first < report.blocks {
        let count = STEP_BLOCKS.min(report.blocks - first);
        let states = source.map(first, count).map_err(|e| io("mapping", e))?;
        if states.len() as u64 != count {
            return Err(io(
                "mapping",
                io::Error::other(format!("{} states for {count} blocks", states.len())),
            ));
        }
        // Look every named block up; the first of each missing fingerprint
        // is read, later ones store from it (or find it stored by then).
        let mut steps = Vec::with_capacity(states.len());
        let mut first_missing: HashMap<Fingerprint, usize> = HashMap::new();
        for (i, state) in states.iter().enumerate() {
            let fp = match *state {
                BlockState::Zero => {
                    report.zero_blocks += 1;
                    zero_fp
                }
                BlockState::Known(fp) => fp,
                BlockState::Unknown => {
                    steps.push(Step::Store(None, Some(i)));
                    continue;
                }
            };
            steps.push(match session.lookup_ref(&fp)? {
                Some(r) => Step::Found(r),
                None if *state == BlockState::Zero => Step::Store(Some(fp), None),
                None => Step::Store(Some(fp), Some(*first_missing.entry(fp).or_insert(i))),
            });
        }
        // Read what must be read, in runs of consecutive blocks.
        let mut wanted = vec![false; states.len()];
        for step in &steps {
            if let Step::Store(_, Some(j)) = step {
                wanted[*j] = true;
            }
        }
        buf.resize(states.len() * bs, 0);
        let mut i = 0;
        while i < wanted.len() {
            if !wanted[i] {
                i += 1;
                continue;
            }
            let end = (i..wanted.len())
                .find(|&j| !wanted[j])
                .unwrap_or(wanted.len());
            source
                .read(first + i as u64, &mut buf[i * bs..end * bs])
                .map_err(|e| io("reading", e))?;
            report.blocks_read += (end - i) as u64;
            report.bytes_read += ((end - i) * bs) as u64;
            i = end;
        }
        // Every block read is hashed: a known one must match its
        // fingerprint, an unknown one is named by its hash.
        let read: Vec<usize> = (0..wanted.len()).filter(|&i| wanted[i]).collect();
        let hashed = HASH.fingerprint_many(
            &read
                .iter()
                .map(|&i| &buf[i * bs..(i + 1) * bs])
                .collect::<Vec<_>>(),
        );
        let actual: HashMap<usize, Fingerprint> = read.into_iter().zip(hashed).collect();
        for (i, step) in steps.into_iter().enumerate() {
            match step {
                Step::Found(r) => session.push(r, false)?,
                Step::Store(fp, from) => {
                    let (data, fp) = match from {
                        None => (&zeros[..], fp.unwrap_or(zero_fp)),
                        Some(j) => {
                            let got = actual[&j];
                            if fp.is_some_and(|fp| fp != got) {
                                return Err(RepoError::SourceMismatch {
                                    name,
                                    what: source.describe(first + j as u64),
                                });
                            }
                            (&buf[j * bs..(j + 1) * bs], got)
                        }
                    };
                    debug_assert!(from.is_none_or(|j| j <= i));
                    session.append_hashed(data, fp)?;
                }
            }
        }
        first += count;
        progress(first);
    }
    Ok(())
}

/// A source's image as a stream, for a backup that reads it.
struct Image<'a> {
    source: &'a mut dyn BlockSource,
    /// The next block to read.
    next: u64,
    /// Blocks read and not all taken yet: `block[taken..]`.
    block: Vec<u8>,
    taken: usize,
    report: &'a mut BlocksReport,
    progress: &'a mut (dyn FnMut(u64) + Send),
}

impl Read for Image<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.taken == self.block.len() {
            let bs = self.source.block_size() as usize;
            let count = STEP_BLOCKS.min(self.source.blocks() - self.next);
            if count == 0 {
                return Ok(0);
            }
            self.block.resize(count as usize * bs, 0);
            self.source.read(self.next, &mut self.block)?;
            self.taken = 0;
            self.next += count;
            self.report.blocks_read += count;
            self.report.bytes_read += self.block.len() as u64;
            (self.progress)(self.next);
        }
        let n = buf.len().min(self.block.len() - self.taken);
        buf[..n].copy_from_slice(&self.block[self.taken..self.taken + n]);
        self.taken += n;
        Ok(n)
    }
}
