//! The client's backup pipeline (§3.4, Figure 3): a reader cuts the
//! stream the way the repository does, worker threads hash batches of
//! segments, a lookup stage sends each batch's fingerprints as soon as it
//! is hashed (several batches in flight), and the store stage, as each
//! lookup's answer arrives, appends the batch in stream order with the
//! bytes of only the segments the server lacks. While lookups find little
//! (new data), only a sample of each batch is hashed and looked up; the
//! rest goes unhashed, for the server hashes what it stores anyway.
//! Stages are joined by bounded queues, so memory stays at a few batches
//! per stage. A backup of files reads no file unchanged since its parent:
//! it sends the run of the parent's stream that holds it instead.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::io::Read;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex};

use super::batch::{cut_into, Batch, Batcher};
use super::client::{unexpected, Client, ClientError, Pending};
use super::item_ref::ItemRef;
use super::protocol::{Call, ErrorKind, Reply, WireBackup, MAX_BATCH, MAX_FRAME, MAX_TREE};
use crate::config::KeyedOf;
use crate::segment_hash::SegmentHash;
use crate::segmenter::Segmenting;
use crate::tree::parent::ParentIndex;
use crate::tree::walk::{TreeWalk, WalkCounts};
use crate::tree::Tree;

/// Told the stream bytes the server has taken so far, as they grow.
pub type Progress<'a> = dyn Fn(u64) + Sync + 'a;

#[derive(Clone, Copy, Debug)]
pub struct BackupOptions {
    /// Segments per lookup and append (the paper's 256).
    pub batch_segments: usize,
    /// Bytes per batch at most (a single larger segment goes alone).
    pub batch_bytes: usize,
    /// Lookups, and appends, in flight at once.
    pub in_flight: usize,
    /// Hashing threads.
    pub hashers: usize,
    /// A tree up to this many bytes goes in the commit; a larger one in
    /// `TreePart`s of this size first (clamped to fit a frame).
    pub tree_part: usize,
    /// Whether a backup of files reuses its parent's unchanged files
    /// (the server's newest backup of files in the group) without
    /// reading them.
    pub parent: bool,
    /// While lookups find less than 1 in `probe_every` of the bytes
    /// they ask about, only every `probe_every`th segment of a batch is
    /// hashed and looked up; the others go `Unhashed`, and the server,
    /// which hashes every segment it stores anyway, finds their repeats
    /// itself. A batch whose probes find that share or more is hashed
    /// and looked up whole before it goes. New data is then hashed once
    /// instead of twice, for at most about that share of repeats sent
    /// that need not have been. 1 hashes and looks up every segment.
    pub probe_every: usize,
    /// Whether a batch whose probes found repeats, and the batches hashed
    /// sparsely before the switch, are hashed whole and looked up again
    /// before they go, so their repeats cross the wire as fingerprints.
    /// That lookup waits for the server to answer every batch in flight
    /// first; the server finds the repeats itself either way. `None`:
    /// over TCP, where bytes may cost a network, and not over a Unix
    /// socket, where they cost a copy (a unique GiB with 11 % repeats
    /// waited there about 60 times, 0.06 s in all).
    pub complete_probed: Option<bool>,
}

impl Default for BackupOptions {
    fn default() -> BackupOptions {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        BackupOptions {
            batch_segments: 256,
            batch_bytes: 4 << 20,
            in_flight: 4,
            hashers: cores.clamp(1, 8),
            tree_part: 4 << 20,
            parent: true,
            probe_every: 8,
            complete_probed: None,
        }
    }
}

/// What a backup of files through a server did.
#[derive(Clone, Debug)]
pub struct FilesBackup {
    pub backup: WireBackup,
    pub counts: WalkCounts,
    /// Entries skipped (vanished, unreadable, sockets), one line each.
    pub warnings: Vec<String>,
    /// The backup whose unchanged files were reused, if any.
    pub parent: Option<String>,
    /// Files unchanged since the parent (same size, mtime, ctime and
    /// inode): not read, their segments reused by the server.
    pub files_unchanged: u64,
    pub bytes_unchanged: u64,
    /// Why the parent could not be reused, if a first try with it
    /// failed and every file was read instead.
    pub parent_refused: Option<String>,
}

/// Fingerprints of segments sent, remembered to send repeats as `Known`.
const MAX_SENT: usize = 1 << 18;
/// A batch's fingerprints, segment by segment; none for a segment not
/// hashed (see `BackupOptions::probe_every`).
type Fps = Vec<Option<[u8; 32]>>;

/// What a client cuts and sends: one stream, or the files of a walk, each
/// file cut on its own (as a backup of files made where the repository is
/// cuts them: segments never span two files, so a later local backup can
/// reuse an unchanged file's segments).
pub(super) enum Source<'w, R> {
    Stream(R),
    Files(&'w mut TreeWalk, Option<&'w ParentIndex>, &'w mut Reused),
}

/// Files a walk did not read: their bytes are the parent's.
#[derive(Default)]
pub(super) struct Reused {
    files: u64,
    bytes: u64,
}

impl Client {
    /// Back `reader` up as backup `name` in `group`, with `tree` as its
    /// tree object. Nothing is left behind if it fails.
    pub fn backup_stream(
        &self,
        name: &str,
        group: &str,
        reader: impl Read + Send,
        tree: Option<Vec<u8>>,
        opts: &BackupOptions,
        progress: &Progress<'_>,
    ) -> Result<WireBackup, ClientError> {
        // A tree known up front is checked before anything is sent.
        if let Some(t) = &tree {
            tree_fits(t)?;
        }
        let (session, segmenting, hash) = self.begin(name, group)?;
        let piped = self.pipeline(
            session,
            (segmenting, hash),
            Source::Stream(reader),
            opts,
            progress,
        );
        self.end(session, piped, tree, opts)
    }

    /// Back up the files under `paths` as backup `name` in `group`, as
    /// [`Client::backup_files`] does with a walk of them. If the parent
    /// cannot be reused whole (it changed or is damaged since the server
    /// sent its tree), the backup is made again reading every file.
    pub fn backup_paths(
        &self,
        name: &str,
        group: &str,
        paths: &[impl AsRef<std::path::Path>],
        opts: &BackupOptions,
        progress: &Progress<'_>,
    ) -> Result<FilesBackup, ClientError> {
        let walk = || TreeWalk::new(paths).map_err(|e| ClientError::Local(e.to_string()));
        match self.backup_files(name, group, walk()?, opts, progress) {
            Err(ClientError::Server(e)) if e.kind == ErrorKind::ParentUnusable && opts.parent => {
                let opts = BackupOptions {
                    parent: false,
                    ..*opts
                };
                let mut b = self.backup_files(name, group, walk()?, &opts, progress)?;
                b.parent_refused = Some(e.message);
                Ok(b)
            }
            other => other,
        }
    }

    /// Back up the files `walk` finds as backup `name` in `group`: their
    /// contents go through the pipeline as a stream, file by file, and
    /// the tree the walk records goes with the commit. A file unchanged
    /// since the parent (`opts.parent`) is not read: the server reuses
    /// its segments; of the others, only segments the repository lacks
    /// are sent. Nothing is left behind if it fails, which it does with
    /// `ParentUnusable` if the parent cannot be reused whole (see
    /// [`Client::backup_paths`]).
    pub fn backup_files(
        &self,
        name: &str,
        group: &str,
        mut walk: TreeWalk,
        opts: &BackupOptions,
        progress: &Progress<'_>,
    ) -> Result<FilesBackup, ClientError> {
        let (session, segmenting, hash) = self.begin(name, group)?;
        let parent = match opts.parent {
            true => self.parent(session),
            false => Ok(None),
        };
        let parent = match parent {
            Ok(p) => p,
            Err(e) => {
                let _ = self.send(Call::Abort { session });
                return Err(e);
            }
        };
        let mut reused = Reused::default();
        let index = parent.as_ref().map(|(_, index)| index);
        let source = Source::<std::io::Empty>::Files(&mut walk, index, &mut reused);
        let piped = self.pipeline(session, (segmenting, hash), source, opts, progress);
        let (tree, counts, warnings) = walk.finish();
        let backup = self.end(session, piped, Some(tree.bytes), opts)?;
        Ok(FilesBackup {
            backup,
            counts,
            warnings,
            parent: parent.map(|(name, _)| name),
            files_unchanged: reused.files,
            bytes_unchanged: reused.bytes,
            parent_refused: None,
        })
    }

    /// The session's parent, as the server picked it: its name and what
    /// its tree says of its files. `None` if there is none.
    fn parent(&self, session: u64) -> Result<Option<(String, ParentIndex)>, ClientError> {
        let mut tree = Vec::new();
        // The parent's name and tree length, as the first answer gave them.
        let mut first: Option<(String, u64)> = None;
        loop {
            let at = tree.len() as u64;
            let (name, total, bytes) = match self.call(Call::ParentTree { session, at })? {
                Reply::ParentTree { name: None, .. } if first.is_none() => return Ok(None),
                Reply::ParentTree {
                    name: Some(name),
                    total,
                    bytes,
                } => (name, total, bytes),
                other => return Err(unexpected(&other)),
            };
            let end = at + bytes.len() as u64;
            let same = first
                .as_ref()
                .is_none_or(|(n, t)| *n == name && *t == total);
            if !same || total > MAX_TREE as u64 || end > total || (bytes.is_empty() && end < total)
            {
                return Err(ClientError::Protocol(format!(
                    "parent tree bytes {at}..{end} of {total} of backup {name}"
                )));
            }
            tree.extend_from_slice(&bytes);
            if end == total {
                let object = format!("the tree of the parent backup {name}");
                let tree = Tree::decode(&object, &tree)
                    .map_err(|e| ClientError::Protocol(e.to_string()))?;
                return Ok(Some((name, ParentIndex::new(tree))));
            }
            first = Some((name, total));
        }
    }

    /// Start a backup session: its id, how the repository cuts streams
    /// and how it fingerprints segments.
    pub(super) fn begin(
        &self,
        name: &str,
        group: &str,
    ) -> Result<(u64, Segmenting, SegmentHash), ClientError> {
        match self.call(Call::BeginBackup {
            name: name.into(),
            group: group.into(),
        })? {
            Reply::Begun {
                session,
                segmenting,
                fingerprint_key,
                keyed_plain_digest,
            } => Ok((
                session,
                segmenting.check().map_err(ClientError::Protocol)?,
                fingerprint_key.map_or(SegmentHash::PLAIN, |k| {
                    let of = match keyed_plain_digest {
                        true => KeyedOf::PlainDigest,
                        false => KeyedOf::Bytes,
                    };
                    SegmentHash::keyed(k.0, of)
                }),
            )),
            other => Err(unexpected(&other)),
        }
    }

    /// Commit the session with `tree` if its stream went through, else
    /// abort it. A tree larger than `opts.tree_part` goes ahead in parts.
    pub(super) fn end(
        &self,
        session: u64,
        piped: Result<(), ClientError>,
        tree: Option<Vec<u8>>,
        opts: &BackupOptions,
    ) -> Result<WireBackup, ClientError> {
        let part = opts.tree_part.clamp(1, MAX_FRAME - (64 << 10));
        let tree = piped
            .and_then(|()| tree.as_deref().map_or(Ok(()), tree_fits))
            .and_then(|()| match tree {
                Some(t) if t.len() > part => {
                    for bytes in t.chunks(part) {
                        let call = Call::TreePart {
                            session,
                            bytes: bytes.to_vec(),
                        };
                        match self.call(call)? {
                            Reply::TreeTaken { .. } => {}
                            other => return Err(unexpected(&other)),
                        }
                    }
                    Ok(None)
                }
                small => Ok(small),
            });
        match tree {
            Ok(tree) => match self.call(Call::Commit { session, tree })? {
                Reply::Committed(b) => Ok(b),
                other => Err(unexpected(&other)),
            },
            Err(e) => {
                // Already gone if an append failed; nobody waits for this.
                let _ = self.send(Call::Abort { session });
                Err(e)
            }
        }
    }

    pub(super) fn pipeline<R: Read + Send>(
        &self,
        session: u64,
        (segmenting, hash): (Segmenting, SegmentHash),
        source: Source<'_, R>,
        opts: &BackupOptions,
        progress: &Progress<'_>,
    ) -> Result<(), ClientError> {
        let opts = &BackupOptions {
            // One item is left for a run of the parent's stream.
            batch_segments: opts.batch_segments.clamp(1, MAX_BATCH - 1),
            batch_bytes: opts.batch_bytes.clamp(1, 8 << 20),
            in_flight: opts.in_flight.max(1),
            hashers: opts.hashers.max(1),
            tree_part: opts.tree_part,
            parent: opts.parent,
            probe_every: opts.probe_every.max(1),
            complete_probed: Some(opts.complete_probed.unwrap_or(self.over_tcp())),
        };
        let (raw_tx, raw_rx) = sync_channel::<(u64, Batch)>(opts.hashers * 2);
        // Owned by the hashers: when the last one stops, the reader's next
        // send fails and it stops too (were it held here, a reader blocked
        // on a full queue would wait forever after a failure downstream).
        let raw_rx = Arc::new(Mutex::new(raw_rx));
        // A hasher that panicked sends why instead of its batch: the
        // others would wait for its token, and the lookup stage for its
        // batch, for ever.
        let (hashed_tx, hashed_rx) =
            sync_channel::<Result<(u64, Batch, Fps), String>>(opts.hashers * 2);
        let (looked_tx, looked_rx) = sync_channel::<(Batch, Fps, Option<Pending>)>(opts.in_flight);
        // Blocks sent, back to the reader to read into again.
        let (spares_tx, spares_rx) = sync_channel::<Vec<u8>>(8);
        // A hasher takes a token before a batch and the lookup stage gives
        // it back as it passes a batch on in order: at most `window`
        // batches are between the two. Hashers finish out of order, and
        // without this the lookup stage would hold every batch that one
        // slow (preempted) hasher's batch keeps waiting, and the hashers,
        // running ahead, would hash them all before `probing` is seen.
        let window = opts.hashers * 4;
        let (tokens_tx, tokens_rx) = sync_channel::<()>(window);
        for _ in 0..window {
            tokens_tx.send(()).expect("room for every token");
        }
        let tokens_rx = Arc::new(Mutex::new(tokens_rx));
        let stop = AtomicBool::new(false);
        // Set by the store stage while lookups find little; read by the
        // hashers, a few batches ahead of it.
        let probing = AtomicBool::new(false);
        std::thread::scope(|s| {
            let reading =
                s.spawn(|| read_batches(segmenting, source, opts, raw_tx, spares_rx, &stop));
            for _ in 0..opts.hashers {
                let (raw_rx, hashed_tx) = (raw_rx.clone(), hashed_tx.clone());
                let tokens_rx = tokens_rx.clone();
                let probing = &probing;
                s.spawn(move || loop {
                    // No token: the lookup stage has stopped.
                    let token = tokens_rx.lock().unwrap_or_else(|p| p.into_inner()).recv();
                    if token.is_err() {
                        return;
                    }
                    let job = raw_rx.lock().unwrap_or_else(|p| p.into_inner()).recv();
                    let Ok((seq, batch)) = job else { return };
                    let every = match probing.load(Ordering::Relaxed) {
                        true => opts.probe_every,
                        false => 1,
                    };
                    // The probes' place moves from batch to batch, so no
                    // layout repeating with the batches hides from them;
                    // a batch has one at least.
                    let last = batch.len().saturating_sub(1);
                    let first = (seq % every as u64) as usize;
                    let first = first.min(last);
                    let probe = |i: usize| i >= first && (i - first) % every == 0;
                    let probed: Vec<&[u8]> = (batch.segments().enumerate())
                        .filter(|&(i, _)| probe(i))
                        .map(|(_, b)| b)
                        .collect();
                    let hashed =
                        std::panic::catch_unwind(AssertUnwindSafe(|| hash.of_many(&probed)));
                    let Ok(hashed) = hashed else {
                        let _ = hashed_tx.send(Err("a hashing thread panicked".into()));
                        return;
                    };
                    let mut hashed = hashed.into_iter();
                    let fps = (0..batch.len())
                        .map(|i| probe(i).then(|| hashed.next().map(|f| f.0)).flatten())
                        .collect();
                    if hashed_tx.send(Ok((seq, batch, fps))).is_err() {
                        return;
                    }
                });
            }
            drop((hashed_tx, raw_rx, tokens_rx));
            let looking = s.spawn(move || -> Result<(), ClientError> {
                // Hashers finish out of order; lookups go in stream order.
                let (mut next, mut early) = (0u64, BTreeMap::new());
                for hashed in hashed_rx {
                    let (seq, batch, fps) = hashed.map_err(ClientError::Local)?;
                    early.insert(seq, (batch, fps));
                    while let Some((batch, fps)) = early.remove(&next) {
                        next += 1;
                        // A batch of only the parent's bytes, or none hashed,
                        // asks nothing.
                        let fingerprints: Vec<[u8; 32]> = fps.iter().flatten().copied().collect();
                        let p = match fingerprints.is_empty() {
                            true => None,
                            false => Some(self.send(Call::Lookup {
                                session,
                                fingerprints,
                            })?),
                        };
                        if looked_tx.send((batch, fps, p)).is_err() {
                            return Ok(());
                        }
                        // Never full: one token back for one taken.
                        let _ = tokens_tx.try_send(());
                    }
                }
                Ok(())
            });
            let stored = self.store_stage(
                session, hash, looked_rx, opts, &probing, &spares_tx, progress,
            );
            // Done or failed downstream: the reader stops at its next
            // segment instead of filling batches nobody will take.
            stop.store(true, Ordering::SeqCst);
            let read = reading
                .join()
                .unwrap_or_else(|_| Err("the reader panicked".into()));
            let looked = looking
                .join()
                .unwrap_or_else(|_| Err(ClientError::Local("the lookup stage panicked".into())));
            // A stream that could not be read is the cause of whatever
            // else failed; a truncated stream must never commit.
            read.map_err(ClientError::Local)?;
            stored?;
            looked
        })
    }

    /// Append each looked-up batch in order, `opts.in_flight` appends at
    /// once, and set `probing` while lookups find little.
    #[allow(clippy::too_many_arguments)]
    fn store_stage(
        &self,
        session: u64,
        hash: SegmentHash,
        looked: Receiver<(Batch, Fps, Option<Pending>)>,
        opts: &BackupOptions,
        probing: &AtomicBool,
        spares: &SyncSender<Vec<u8>>,
        progress: &Progress<'_>,
    ) -> Result<(), ClientError> {
        let mut acks: VecDeque<Pending> = VecDeque::new();
        // Segments already sent in this session: later repeats are Known
        // even if their lookup ran before the bytes arrived.
        let mut sent = HashSet::new();
        let ack = |p: Pending| match p.wait()? {
            Reply::Appended { bytes_in } => {
                progress(bytes_in);
                Ok(())
            }
            other => Err(unexpected(&other)),
        };
        // An append sent before a lookup may have failed the session (a
        // parent run the server could not take), which then answers the
        // lookup "no such session": the append's error is the cause, and
        // the one a caller acts on.
        let found_or_cause =
            |acks: &mut VecDeque<Pending>, lookup: Pending, asked: usize| match lookup.wait() {
                Ok(Reply::Found(f)) if f.len() == asked => Ok(f),
                Ok(other) => Err(unexpected(&other)),
                Err(e) => {
                    for p in acks.drain(..) {
                        ack(p)?;
                    }
                    Err(e)
                }
            };
        for (batch, mut fps, lookup) in looked {
            let asked = fps.iter().flatten().count();
            let found = match lookup {
                Some(p) => found_or_cause(&mut acks, p, asked)?,
                None => Vec::new(),
            };
            // Whether the repository (or this session) has each segment;
            // false for one not hashed.
            let mut found = found.into_iter();
            let mut share = Share::default();
            let mut had: Vec<bool> = (batch.segments().zip(&fps))
                .map(|(data, fp)| {
                    let Some(fp) = fp else { return false };
                    let had = found.next().unwrap_or(false) || sent.contains(fp);
                    share.add(data.len(), had);
                    had
                })
                .collect();
            if let Some(little) = share.under(opts.probe_every) {
                probing.store(little, Ordering::Relaxed);
                // The probes of a batch hashed while probing find the
                // stream repeating the repository: the rest of the batch
                // is hashed and looked up here, before it goes, and so is
                // each batch the hashers took before they saw the switch
                // (a few dozen: they run that far ahead), if completing
                // is worth a wait (`complete_probed`).
                let rest: Vec<usize> = (0..fps.len()).filter(|&i| fps[i].is_none()).collect();
                if !little && !rest.is_empty() && opts.complete_probed == Some(true) {
                    let rest_bytes: Vec<&[u8]> = rest.iter().map(|&i| batch.segment(i)).collect();
                    let fingerprints: Vec<[u8; 32]> = (hash.of_many(&rest_bytes))
                        .into_iter()
                        .map(|f| f.0)
                        .collect();
                    let call = Call::Lookup {
                        session,
                        fingerprints: fingerprints.clone(),
                    };
                    let lookup = self.send(call)?;
                    let found = found_or_cause(&mut acks, lookup, rest.len())?;
                    for ((&i, fp), f) in rest.iter().zip(fingerprints).zip(found) {
                        had[i] = f || sent.contains(&fp);
                        fps[i] = Some(fp);
                    }
                }
            }
            let mut items = Vec::with_capacity(batch.len() + 1);
            if let Some(run) = batch.parent {
                items.push(ItemRef::Parent {
                    offset: run.offset,
                    len: run.size,
                });
            }
            for ((data, fp), had) in batch.segments().zip(fps).zip(had) {
                let Some(fingerprint) = fp else {
                    items.push(ItemRef::Unhashed { data });
                    continue;
                };
                // A repeat of a segment sent earlier in this batch too.
                if had || sent.contains(&fingerprint) {
                    items.push(ItemRef::Known { fingerprint });
                } else {
                    sent.insert(fingerprint);
                    items.push(ItemRef::New { fingerprint, data });
                }
            }
            // About 12 MiB at most; forgetting only costs a lookup miss.
            if sent.len() > MAX_SENT {
                sent.clear();
            }
            acks.push_back(self.send_append(session, &items)?);
            drop(items);
            batch.recycle(spares);
            while acks.len() > opts.in_flight {
                ack(acks.pop_front().expect("non-empty"))?;
            }
        }
        for p in acks {
            ack(p)?;
        }
        Ok(())
    }
}

/// Of a batch's hashed bytes, those the repository has (or the session
/// sent before).
#[derive(Default)]
struct Share {
    asked: usize,
    had: usize,
}

impl Share {
    fn add(&mut self, len: usize, had: bool) {
        self.asked += len;
        if had {
            self.had += len;
        }
    }

    /// Whether under 1 in `every` of the bytes asked about were had;
    /// none if nothing was asked.
    fn under(&self, every: usize) -> Option<bool> {
        (self.asked > 0).then(|| self.had.saturating_mul(every) < self.asked)
    }
}

/// The server holds a tree in RAM until the commit, up to `MAX_TREE`:
/// refused here if over it, before anything is sent for it.
fn tree_fits(tree: &[u8]) -> Result<(), ClientError> {
    if tree.len() > MAX_TREE {
        return Err(ClientError::Local(format!(
            "a tree of {} bytes is over the {MAX_TREE} bytes a server takes",
            tree.len()
        )));
    }
    Ok(())
}

/// Cut the source into batches of segments, numbered in order.
fn read_batches<R: Read>(
    segmenting: Segmenting,
    source: Source<'_, R>,
    opts: &BackupOptions,
    tx: std::sync::mpsc::SyncSender<(u64, Batch)>,
    spares: Receiver<Vec<u8>>,
    stop: &AtomicBool,
) -> Result<(), String> {
    let mut out = Batcher::new(opts, tx, spares);
    match source {
        Source::Stream(reader) => {
            if !cut_into(segmenting, reader, &mut out, stop)? {
                return Ok(());
            }
        }
        Source::Files(walk, parent, reused) => {
            // Runs go forward through the parent's stream (the server
            // takes no other): a file the parent holds before the last one
            // reused is read. The walk sorts what it visits, so this is
            // only for a parent walked in another order.
            let mut parent_end = 0;
            while walk.next_file().map_err(|e| e.to_string())? {
                let unchanged = parent
                    .and_then(|p| {
                        walk.current()
                            .and_then(|(node, len)| p.unchanged(node, len))
                    })
                    .filter(|file| file.offset >= parent_end);
                if let Some(file) = unchanged {
                    // Not read: the server takes the parent's segments.
                    parent_end = file.offset.saturating_add(file.size);
                    walk.skip_current(file.size);
                    reused.files += 1;
                    reused.bytes = reused.bytes.saturating_add(file.size);
                    if stop.load(Ordering::SeqCst) || !out.push_parent(file) {
                        return Ok(());
                    }
                    continue;
                }
                if !cut_into(segmenting, &mut *walk, &mut out, stop)? {
                    return Ok(());
                }
            }
        }
    }
    out.finish();
    Ok(())
}
