//! Backing up a block device by the fingerprints it already keeps (issue
//! 39): a deduplicating device knows the fingerprint of every chunk it
//! stores, so where its chunks are the repository's segments (the same
//! size, plain BLAKE3) a backup needs only the device's map. Each block is
//! named by its fingerprint and looked up; only a chunk the repository
//! lacks is read, and its bytes are hashed again before they are stored:
//! a chunk read whose bytes do not match its recorded fingerprint stops
//! the backup, named, and is never stored under a wrong name. A chunk not
//! read (the repository holds its fingerprint) is backed up as the bytes
//! that fingerprint names, the ones written: damage to it on the device
//! is `dedup check --data`'s to find, not the backup's.
//!
//! The backup is a stream backup of the device's image (restored as an
//! image, like `nbdcopy | dedup backup --stdin`): an unmapped block is the
//! zero block's segment. In an encrypted repository the device's plain
//! fingerprints are turned into its keyed ones (`SegmentHash::from_plain`).
//! A device whose chunks cannot be segments (another size or hash, an
//! encrypted repository whose fingerprints key the bytes themselves, a
//! repository of content-defined segments) is backed up by reading and
//! hashing its image, and the report says why.

use std::collections::HashMap;
use std::io;
use std::sync::mpsc;

use dedup_common::fingerprint::{Fingerprint, HashAlgo};
use serde::Serialize;

use crate::backup::{BackupReport, DeviceMark};
use crate::backup_stream::append_stream;
pub use crate::block_map::{BlockMap, BlockState};
use crate::crypto::random::random_bytes;
use crate::error::repo::{RepoError, RepoResult};
use crate::recipe::SegmentRef;
use crate::repo::Repository;
use crate::segment_hash::SegmentHash;
use crate::segmenter::Segmenting;
use crate::session::BackupSession;
use crate::tree::parent::ParentRecipe;
use crate::writer::HASH;

/// A device as a backup by fingerprint sees it: its map, and its blocks
/// readable in runs.
pub trait BlockSource: BlockMap + Sync {
    /// Fill `buf` (whole blocks) from block `first` on.
    /// Called from another thread than `map` (a reader runs ahead).
    fn read(&self, first: u64, buf: &mut [u8]) -> io::Result<()>;
    /// Block `block` named for a message (the device, the block and its
    /// byte offset) and what to do about a chunk that fails its check.
    fn describe(&self, block: u64) -> String;
    /// The device's identity for changed-block tracking (its UUID);
    /// `None`: it tracks nothing, and every backup walks every block.
    fn device_id(&self) -> Option<[u8; 16]> {
        None
    }
    /// The mark the device's tracking runs from, if it tracks and trusts
    /// its tracking.
    fn tracking_mark(&self) -> Option<u64> {
        None
    }
    /// Whether blocks `first..first + count` may have changed since the
    /// tracking's mark (always, where nothing is tracked).
    fn changed_since_mark(&self, _first: u64, _count: u64) -> bool {
        true
    }
    /// Track changes anew from `mark`: called once a backup that walked
    /// the device as it is now, and recorded `mark`, has committed.
    fn start_tracking(&self, _mark: u64) -> io::Result<()> {
        Ok(())
    }
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
    /// The backup whose recipe named blocks as they were (the newest
    /// stream backup of the group no longer than the device), and the blocks
    /// taken from it, each confirmed against its container's catalog
    /// without a lookup.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    pub blocks_from_parent: u64,
    /// Of those, the blocks taken without walking the device's map: its
    /// changed-block tracking says they did not change since the parent
    /// (which recorded the tracking's mark).
    pub blocks_unwalked: u64,
    /// Through a backup server: why the parent could not be taken from
    /// (changed or damaged since it was picked), so the backup was made
    /// again walking every block.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent_refused: Option<String>,
    /// Whether the device's tracking restarted from this backup, so the
    /// next one can skip what does not change (else it walks every block).
    pub tracking: bool,
}

impl BlocksReport {
    /// How the device was backed up, in words: by fingerprint (blocks
    /// walked, unchanged by the tracking, read) or read whole and why.
    pub fn how(&self) -> String {
        let Some(why) = &self.read_because else {
            let skipped = match (self.blocks_unwalked, &self.parent) {
                (0, _) | (_, None) => String::new(),
                (n, Some(p)) => format!(", {n} more unchanged since {p} by the device's tracking"),
            };
            return format!(
                "by fingerprint: {} blocks walked ({} zero){skipped}, {} read from the device",
                self.blocks - self.blocks_unwalked,
                self.zero_blocks,
                self.blocks_read
            );
        };
        format!("read and hashed whole, because {why}")
    }
}

/// A fresh mark for a backup of `device` to record, if the device has an
/// identity. No mark without a good random one: two backups sharing one
/// could take blocks from the wrong parent.
pub(crate) fn new_mark(device: Option<[u8; 16]>) -> Option<DeviceMark> {
    let bytes = random_bytes().ok()?;
    Some(DeviceMark {
        device: device?,
        mark: u64::from_le_bytes(bytes),
    })
}

/// Restart `source`'s tracking from `mark`, once the backup that recorded
/// it has committed (a tracking restarted for a backup that then failed
/// would skip what only it walked); whether it restarted.
pub(crate) fn restart_tracking(source: &dyn BlockSource, mark: DeviceMark) -> bool {
    match source.start_tracking(mark.mark) {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(
                "changed-block tracking not restarted ({e}): the next backup of this device walks every block"
            );
            false
        }
    }
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
        source: &dyn BlockSource,
        progress: &mut (dyn FnMut(u64) + Send),
    ) -> RepoResult<(BackupReport, BlocksReport)> {
        let mut session = self.begin_backup(name, group)?;
        let mut report = BlocksReport {
            blocks: source.blocks(),
            ..BlocksReport::default()
        };
        match self.why_not_by_fingerprint(source.block_size(), source.hash()) {
            None => {
                report.by_fingerprint = true;
                let size = report.blocks * u64::from(source.block_size());
                let mut parent = self.parent_image(group, size);
                report.parent = parent.as_ref().map(|p| p.name.clone());
                // The device's tracking counts only from the parent's walk:
                // its mark is the one the parent recorded.
                let device = source.device_id();
                let tracked = match (&parent, device, source.tracking_mark()) {
                    (Some(p), Some(device), Some(mark)) => {
                        p.mark == Some(DeviceMark { device, mark })
                    }
                    _ => false,
                };
                let mark = new_mark(device);
                append_by_fingerprint(
                    self,
                    &mut session,
                    source,
                    parent.as_mut().map(|p| &mut p.recipe),
                    tracked,
                    &mut report,
                    progress,
                )?;
                if let Some(mark) = mark {
                    session.set_device_mark(mark);
                    let committed = session.commit()?.report;
                    report.tracking = restart_tracking(source, mark);
                    return Ok((committed, report));
                }
            }
            Some(why) => {
                report.read_because = Some(why);
                let mut image = image_reader(source, &mut report, progress);
                append_stream(&mut session, self.config.segmenting, &mut image)
                    .map_err(|e| e.into_repo(|| format!("reading the device for backup {name}")))?;
            }
        }
        Ok((session.commit()?.report, report))
    }

    /// The newest stream backup in `group` of at most `size` bytes (the
    /// device's, or before it grew) and its recipe, to take unchanged
    /// blocks from. A parent that cannot be read is no parent (every
    /// block is then looked up, never a reason to fail), nor is one of
    /// another device a danger: each block taken from it is confirmed by
    /// its whole fingerprint in the container's catalog.
    pub(crate) fn parent_image(&self, group: &str, size: u64) -> Option<ParentImage> {
        let newest = (self.list_backups_all().ok()?.backups.into_iter())
            .filter(|b| b.group == group && b.tree.is_none() && b.report.bytes_in <= size)
            .max_by_key(|b| b.time)?;
        let (name, mark) = (newest.name.clone(), newest.device_mark);
        let (record, parts) = self.recipe_parts_of(newest).ok()?;
        Some(ParentImage {
            name,
            mark,
            recipe: ParentRecipe::new(record.recipe, parts.into_head()),
        })
    }

    /// Why a device's fingerprints (of `size`-byte chunks, by `hash`)
    /// cannot name this repository's segments, if they cannot: for a
    /// backup by fingerprint, and for a restore by fingerprint.
    pub(crate) fn why_not_by_fingerprint(&self, size: u32, hash: HashAlgo) -> Option<String> {
        why_not_by_fingerprint(self.config.segmenting, self.segment_hash(), size, hash)
    }
}

/// Why a device's fingerprints (of `size`-byte chunks, by `device`)
/// cannot name the segments of a repository that cuts them so and names
/// them by `hash`, if they cannot: here, and through a backup server.
pub(crate) fn why_not_by_fingerprint(
    segmenting: Segmenting,
    hash: SegmentHash,
    size: u32,
    device: HashAlgo,
) -> Option<String> {
    match segmenting {
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
    if device != HASH {
        return Some(format!(
            "the device fingerprints chunks with {device} and the repository with {HASH}"
        ));
    }
    if hash.from_plain(&Fingerprint([0; 32])).is_none() {
        return Some(
            "the repository is encrypted with fingerprints keyed over segments' bytes (made \
             by a build before config version 3), so the device's cannot name them; a \
             repository made since keys the plain digest and takes them"
                .into(),
        );
    }
    None
}

/// A device backup's parent: its name, the device mark it recorded, and
/// its recipe.
pub(crate) struct ParentImage {
    pub(crate) name: String,
    pub(crate) mark: Option<DeviceMark>,
    pub(crate) recipe: ParentRecipe,
}

/// One block of a step: where it is stored already, or what must be read
/// to store it.
enum Step {
    Found(SegmentRef),
    /// To store: its fingerprint if known, and where its bytes are.
    Store(Option<Fingerprint>, Bytes),
}

/// Where the bytes of a block to store are.
#[derive(Clone, Copy)]
enum Bytes {
    /// The zero block's.
    Zero,
    /// Read in this step, at this block (itself, or an earlier block of
    /// the step with the same fingerprint).
    Here(usize),
    /// Read in the step before, at this block: that step stores it
    /// first, so this one finds it stored (the bytes are the fallback).
    Before(usize),
}

/// A step looked up: its first block and what each block needs.
struct Planned {
    first: u64,
    steps: Vec<Step>,
    /// Each fingerprint this step reads to store, at its first block.
    reads: HashMap<Fingerprint, usize>,
    /// The zero block's reference, if this step or one before found it.
    zero_ref: Option<SegmentRef>,
    /// Whether any block of the step is read (by the reader thread).
    reading: bool,
}

/// A step's blocks read (those wanted) and hashed.
#[derive(Default)]
pub(crate) struct Read {
    pub(crate) bytes: Vec<u8>,
    /// By block of the step: the hash of each block read.
    pub(crate) hashed: Vec<Option<Fingerprint>>,
    pub(crate) blocks_read: u64,
}

impl Planned {
    /// Which blocks of the step are to be read: those others store from.
    fn wanted(&self) -> Vec<bool> {
        let mut wanted = vec![false; self.steps.len()];
        for step in &self.steps {
            if let Step::Store(_, Bytes::Here(j)) = step {
                wanted[*j] = true;
            }
        }
        wanted
    }
}

impl Read {
    /// Block `j` of the step (of `bs` bytes).
    pub(crate) fn block(&self, j: usize, bs: usize) -> &[u8] {
        &self.bytes[j * bs..(j + 1) * bs]
    }
}

/// Steps read ahead of the one being stored: the reader reads and hashes
/// the next while this thread looks up and stores (its containers
/// compress on the thread pool), so the three overlap.
const READ_AHEAD: usize = 2;

fn append_by_fingerprint(
    repo: &Repository,
    session: &mut BackupSession<'_>,
    source: &dyn BlockSource,
    mut parent: Option<&mut ParentRecipe>,
    tracked: bool,
    report: &mut BlocksReport,
    progress: &mut (dyn FnMut(u64) + Send),
) -> RepoResult<()> {
    let bs = source.block_size() as usize;
    let zeros = vec![0u8; bs];
    // Every fingerprint below is the repository's: the device's plain
    // ones are turned into it as they are mapped (`plan`), read bytes
    // are hashed its way (`read_wanted`).
    let hash = session.segment_hash();
    let zero_fp = hash.of(&zeros);
    let name = session.name().to_string();
    let io = |what: &str, cause| RepoError::Io {
        context: format!("{what} the device for backup {name}"),
        cause,
    };
    std::thread::scope(|scope| {
        let (ask, asked) = mpsc::sync_channel::<(u64, Vec<bool>, Vec<u8>)>(READ_AHEAD);
        let (give, given) = mpsc::sync_channel::<io::Result<Read>>(READ_AHEAD);
        std::thread::Builder::new()
            .name("dedup-blocks".into())
            .spawn_scoped(scope, move || {
                for (first, wanted, buf) in asked {
                    if give
                        .send(read_wanted(source, hash, first, &wanted, buf))
                        .is_err()
                    {
                        return;
                    }
                }
            })
            .map_err(|e| io("starting a thread to read", e))?;
        let mut planned: std::collections::VecDeque<Planned> = Default::default();
        // Buffers the reader has given back, for the next steps it reads:
        // a new one costs 4 MiB of zeros and its page faults.
        let mut spares: Vec<Vec<u8>> = Vec::new();
        let mut before: Option<Read> = None;
        let mut zero_ref = None;
        let mut first = 0;
        loop {
            if first < report.blocks {
                let most = STEP_BLOCKS.min(report.blocks - first);
                let (count, unchanged) = next_window(source, tracked, first, most);
                let earlier = planned.back().map(|p| &p.reads);
                let at = Window {
                    first,
                    count,
                    zero_fp,
                    zero_ref,
                    unchanged,
                };
                let parent = parent.as_deref_mut().map(|p| (repo, p));
                let p = plan(session, source, at, parent, earlier, report)
                    .map_err(|e| e.into_repo(&io))?;
                zero_ref = p.zero_ref;
                // The reader is gone only if it panicked (a bug).
                // A step with nothing to read (its blocks all found, or
                // unchanged by the tracking) does not wait on the reader.
                let wanted = p.wanted();
                if p.reading {
                    let buf = spares.pop().unwrap_or_default();
                    ask.send((first, wanted, buf))
                        .map_err(|_| io("reading", io::Error::other("the reading thread died")))?;
                }
                planned.push_back(p);
                first += count;
                if planned.len() < READ_AHEAD {
                    continue;
                }
            }
            let Some(p) = planned.pop_front() else { break };
            let read = match p.reading {
                true => given
                    .recv()
                    .map_err(|_| io("reading", io::Error::other("the reading thread died")))?
                    .map_err(|e| io("reading", e))?,
                false => Read::default(),
            };
            report.blocks_read += read.blocks_read;
            report.bytes_read += read.blocks_read * bs as u64;
            let end = p.first + p.steps.len() as u64;
            store(session, source, p, &read, before.as_ref(), &zeros, &name)?;
            // The step before's bytes are free now; this one's stay for
            // the next step's `Bytes::Before`.
            // (An unread step's is empty.)
            if let Some(b) = before.replace(read) {
                if b.bytes.capacity() > 0 {
                    spares.push(b.bytes);
                }
            }
            progress(end);
        }
        Ok(())
    })
}

/// The blocks the device's tracking is asked about at a time: a region
/// of its flags, of a chunk each (a device's blocks are its chunks).
const TRACKED_BLOCKS: u64 = dedup_core::Changes::REGION_CHUNKS;

/// The next window of a walk from block `first`, at most `most` blocks:
/// where the device's tracking is asked (`tracked`), the longest run of
/// 64-block pieces it answers alike, and whether they are unchanged since
/// the parent's walk (taken from the parent without a walk). A step of
/// 1,024 blocks where one block changed would otherwise walk all 1,024,
/// each costing a read of its chunk record, most of them cold. Also how a
/// client of a backup server cuts its windows.
pub(crate) fn next_window(
    source: &dyn BlockSource,
    tracked: bool,
    first: u64,
    most: u64,
) -> (u64, bool) {
    if !tracked || most == 0 {
        return (most, false);
    }
    let end = first + most;
    let piece = |at: u64| TRACKED_BLOCKS.min(end - at);
    let changed = source.changed_since_mark(first, piece(first));
    let mut next = first + piece(first);
    while next < end && source.changed_since_mark(next, piece(next)) == changed {
        next += piece(next);
    }
    (next - first, !changed)
}

/// Why planning a step failed: the source or the repository.
enum PlanError {
    Source(io::Error),
    Repo(RepoError),
}

impl PlanError {
    fn into_repo(self, io: &impl Fn(&str, io::Error) -> RepoError) -> RepoError {
        match self {
            PlanError::Source(e) => io("mapping", e),
            PlanError::Repo(e) => e,
        }
    }
}

/// The blocks a step walks, and the zero block's fingerprint.
struct Window {
    first: u64,
    count: u64,
    zero_fp: Fingerprint,
    /// Where the zero block is stored, once found: held for the session,
    /// so every later zero block names it without a lookup.
    zero_ref: Option<SegmentRef>,
    /// The device's tracking says no block here changed since the
    /// parent's walk: take the parent's references without walking.
    unchanged: bool,
}

/// Map the window's blocks and name each: as the parent had it where its
/// segment there has the block's fingerprint (confirmed), else by a
/// lookup; the first block of each missing fingerprint is to be read,
/// later ones store from it (or find it stored by then).
fn plan(
    session: &mut BackupSession<'_>,
    source: &dyn BlockSource,
    Window {
        first,
        count,
        zero_fp,
        mut zero_ref,
        unchanged: untouched,
    }: Window,
    mut parent: Option<(&Repository, &mut ParentRecipe)>,
    earlier: Option<&HashMap<Fingerprint, usize>>,
    report: &mut BlocksReport,
) -> Result<Planned, PlanError> {
    if untouched {
        let bs = source.block_size();
        let taken =
            as_parent_had(session, parent.as_mut(), first, count, bs).map_err(PlanError::Repo)?;
        if let Some(refs) = taken {
            report.blocks_from_parent += count;
            report.blocks_unwalked += count;
            return Ok(Planned {
                first,
                steps: refs.into_iter().map(Step::Found).collect(),
                reads: HashMap::new(),
                zero_ref,
                reading: false,
            });
        }
    }
    let mut states = source.map(first, count).map_err(PlanError::Source)?;
    if states.len() as u64 != count {
        return Err(PlanError::Source(io::Error::other(format!(
            "{} states for {count} blocks",
            states.len()
        ))));
    }
    // The device's plain fingerprints as the repository's (the same in
    // the clear; keyed over them if encrypted).
    let hash = session.segment_hash();
    for state in &mut states {
        if let BlockState::Known(fp) = state {
            *state = hash
                .from_plain(fp)
                .map_or(BlockState::Unknown, BlockState::Known);
        }
    }
    let from_parent =
        unchanged(session, source, first, &states, parent).map_err(PlanError::Repo)?;
    report.blocks_from_parent += from_parent.iter().flatten().count() as u64;
    let mut steps = Vec::with_capacity(states.len());
    let mut first_missing: HashMap<Fingerprint, usize> = HashMap::new();
    for (i, state) in states.iter().enumerate() {
        if let Some(r) = from_parent.get(i).copied().flatten() {
            steps.push(Step::Found(r));
            continue;
        }
        let fp = match *state {
            BlockState::Zero => {
                report.zero_blocks += 1;
                zero_fp
            }
            BlockState::Known(fp) => fp,
            BlockState::Unknown => {
                steps.push(Step::Store(None, Bytes::Here(i)));
                continue;
            }
        };
        let found = match (state, zero_ref) {
            (BlockState::Zero, Some(r)) => Some(r),
            _ => session.lookup_ref(&fp).map_err(PlanError::Repo)?,
        };
        if *state == BlockState::Zero && zero_ref.is_none() {
            zero_ref = found;
        }
        let before = earlier.and_then(|e| e.get(&fp));
        steps.push(match (found, before) {
            (Some(r), _) => Step::Found(r),
            (None, _) if *state == BlockState::Zero => Step::Store(Some(fp), Bytes::Zero),
            (None, Some(&j)) => Step::Store(Some(fp), Bytes::Before(j)),
            (None, None) => {
                Step::Store(Some(fp), Bytes::Here(*first_missing.entry(fp).or_insert(i)))
            }
        });
    }
    let reading = steps
        .iter()
        .any(|s| matches!(s, Step::Store(_, Bytes::Here(_))));
    Ok(Planned {
        first,
        steps,
        reads: first_missing,
        zero_ref,
        reading,
    })
}

/// For each block of a step, the parent's reference if the parent's
/// recipe names the block as it is now: its segment at the block's offset has the block's fingerprint
/// (its 8-byte check and length, then the whole fingerprint in the
/// container's catalog, held for the session).
fn unchanged(
    session: &mut BackupSession<'_>,
    source: &dyn BlockSource,
    first: u64,
    states: &[BlockState],
    parent: Option<(&Repository, &mut ParentRecipe)>,
) -> RepoResult<Vec<Option<SegmentRef>>> {
    let mut out = vec![None; states.len()];
    let Some((repo, parent)) = parent else {
        return Ok(out);
    };
    let bs = source.block_size();
    let (mut at, mut refs, mut fps) = (Vec::new(), Vec::new(), Vec::new());
    for (i, state) in states.iter().enumerate() {
        // Zero blocks name the session's zero reference, found once.
        let BlockState::Known(fp) = *state else {
            continue;
        };
        let offset = (first + i as u64) * u64::from(bs);
        if let Some(r) = parent.segment_at(repo, session, offset)? {
            if r.is(&fp, bs) {
                at.push(i);
                refs.push(r);
                fps.push(fp);
            }
        }
    }
    let confirmed = session.confirm(&refs, &fps)?;
    for ((i, r), ok) in at.into_iter().zip(refs).zip(confirmed) {
        if ok {
            out[i] = Some(r);
        }
    }
    Ok(out)
}

/// The parent's references for blocks `first..first + count` (which the
/// device's tracking says did not change since the parent walked them),
/// if the parent has one whole block's segment at each and every one is
/// confirmed (held for the session, its catalog entry with the
/// reference's check and length); else `None`, and the window is walked.
/// Also how a backup server takes a device backup's `Parent` runs.
pub(crate) fn as_parent_had(
    session: &mut BackupSession<'_>,
    parent: Option<&mut (&Repository, &mut ParentRecipe)>,
    first: u64,
    count: u64,
    bs: u32,
) -> RepoResult<Option<Vec<SegmentRef>>> {
    let Some((repo, parent)) = parent else {
        return Ok(None);
    };
    let Some(refs) = parent.whole_blocks(repo, session, first * u64::from(bs), count, bs)? else {
        return Ok(None);
    };
    let confirmed = session.confirm_refs(&refs)?;
    Ok(confirmed.iter().all(|&ok| ok).then_some(refs))
}

/// Read the wanted blocks of the step at `first` into `buf` (in runs of
/// consecutive blocks) and hash each as the repository does.
pub(crate) fn read_wanted(
    source: &dyn BlockSource,
    hash: SegmentHash,
    first: u64,
    wanted: &[bool],
    mut buf: Vec<u8>,
) -> io::Result<Read> {
    let bs = source.block_size() as usize;
    buf.resize(wanted.len() * bs, 0);
    let mut blocks_read = 0;
    let mut i = 0;
    while i < wanted.len() {
        if !wanted[i] {
            i += 1;
            continue;
        }
        let end = (i..wanted.len())
            .find(|&j| !wanted[j])
            .unwrap_or(wanted.len());
        read_caught(source, first + i as u64, &mut buf[i * bs..end * bs])?;
        blocks_read += (end - i) as u64;
        i = end;
    }
    let read: Vec<usize> = (0..wanted.len()).filter(|&i| wanted[i]).collect();
    let fps = hash.of_many(
        &read
            .iter()
            .map(|&i| &buf[i * bs..(i + 1) * bs])
            .collect::<Vec<_>>(),
    );
    let mut hashed = vec![None; wanted.len()];
    for (i, fp) in read.into_iter().zip(fps) {
        hashed[i] = Some(fp);
    }
    Ok(Read {
        hashed,
        bytes: buf,
        blocks_read,
    })
}

/// `source.read`, tried again while it is `Interrupted`, with a panic in
/// it (a bug in a source) an error that fails the backup rather than the
/// process.
pub(crate) fn read_caught(source: &dyn BlockSource, first: u64, buf: &mut [u8]) -> io::Result<()> {
    loop {
        let read =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| source.read(first, buf)))
                .unwrap_or_else(|_| Err(io::Error::other("reading the device panicked")));
        match read {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

/// Push a step's blocks in order: each found one by reference, each other
/// stored from the bytes read, once they match its fingerprint.
fn store(
    session: &mut BackupSession<'_>,
    source: &dyn BlockSource,
    p: Planned,
    read: &Read,
    before: Option<&Read>,
    zeros: &[u8],
    name: &str,
) -> RepoResult<()> {
    let bs = source.block_size() as usize;
    // Blocks found stored go to the recipe a run at a time.
    let mut found: Vec<SegmentRef> = Vec::with_capacity(p.steps.len());
    for step in p.steps {
        let (fp, bytes) = match step {
            Step::Found(r) => {
                found.push(r);
                continue;
            }
            Step::Store(fp, bytes) => (fp, bytes),
        };
        session.push_all(&found, false)?;
        found.clear();
        match (fp, bytes) {
            // Known, and checked by the step before (which stopped the
            // backup had it not matched).
            (Some(fp), Bytes::Zero) => session.append_hashed(zeros, fp)?,
            (Some(fp), Bytes::Before(j)) => {
                let before = before.expect("a step before the one that names it");
                session.append_hashed(before.block(j, bs), fp)?;
            }
            (fp, Bytes::Here(j)) => {
                let got = read.hashed[j].expect("every block to store from was read");
                if fp.is_some_and(|fp| fp != got) {
                    return Err(RepoError::SourceMismatch {
                        name: name.into(),
                        what: source.describe(p.first + j as u64),
                    });
                }
                session.append_hashed(read.block(j, bs), got)?;
            }
            (None, _) => unreachable!("only blocks read are unnamed"),
        }
    }
    session.push_all(&found, false)
}

/// A source's image as a stream, for a backup that reads it.
/// `source`'s image as a stream, block after block from the first (what
/// a backup that cannot go by fingerprint reads, here or through a
/// backup server), counting the blocks read into `report` and telling
/// `progress` the blocks done.
pub fn image_reader<'a>(
    source: &'a dyn BlockSource,
    report: &'a mut BlocksReport,
    progress: &'a mut (dyn FnMut(u64) + Send),
) -> impl io::Read + Send + 'a {
    Image {
        source,
        next: 0,
        block: Vec::new(),
        taken: 0,
        report,
        progress,
    }
}

struct Image<'a> {
    source: &'a dyn BlockSource,
    /// The next block to read.
    next: u64,
    /// Blocks read and not all taken yet: `block[taken..]`.
    block: Vec<u8>,
    taken: usize,
    report: &'a mut BlocksReport,
    progress: &'a mut (dyn FnMut(u64) + Send),
}

impl io::Read for Image<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.taken == self.block.len() {
            let bs = self.source.block_size() as usize;
            let count = STEP_BLOCKS.min(self.source.blocks() - self.next);
            if count == 0 {
                return Ok(0);
            }
            self.block.resize(count as usize * bs, 0);
            // Nothing to hand out until the read succeeds: a read that
            // fails (even `Interrupted`, which callers try again) reads
            // the same blocks next time.
            self.taken = self.block.len();
            read_caught(self.source, self.next, &mut self.block)?;
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
