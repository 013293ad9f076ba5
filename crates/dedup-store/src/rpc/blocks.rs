//! A dedup device backed up through a backup server by its fingerprints
//! (issue 39): the client's side of `backup_blocks.rs`, over the
//! protocol every backup already speaks. Each window of blocks is named
//! by the device's fingerprints (turned into the repository's, keyed if
//! it is encrypted), looked up in one `Lookup`, and appended as `Known`
//! where the server has the segment; only the chunks it lacks (and any
//! the device keeps no fingerprint of) are read from the device, hashed
//! here and sent as `New`, which the server hashes again before it
//! stores them. A chunk read whose bytes do not match its recorded
//! fingerprint stops the backup by name, before it is sent.
//!
//! With changed-block tracking, the server picks the parent as a backup
//! beside the repository does (`ParentImage`); if its mark is the
//! device's, each window the tracking calls unchanged goes as one
//! `Parent` run, which the server takes as whole blocks confirmed
//! against their catalogs, and the backup records a new mark
//! (`DeviceMark`) for the next. A parent the server cannot take from
//! fails the backup, which is made again walking every block.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io;

use dedup_common::fingerprint::Fingerprint;

use super::client::{unexpected, Client, ClientError, Pending};
use super::item_ref::ItemRef;
use super::pipeline::{BackupOptions, Source};
use super::protocol::{Call, ErrorKind, Reply, WireBackup};
use crate::backup::DeviceMark;
use crate::backup_blocks::{
    image_reader, new_mark, next_window, read_wanted, restart_tracking, why_not_by_fingerprint,
    BlockSource, BlocksReport,
};
use crate::block_map::BlockState;
use crate::error::repo::RepoError;
use crate::segment_hash::SegmentHash;

/// Bytes of blocks per window: one lookup and one append.
const WINDOW_BYTES: u64 = 4 << 20;
/// Appends sent and not yet answered: the server stores them while this
/// client reads the next windows.
const IN_FLIGHT: usize = 4;
/// Fingerprints remembered as sent in this session (about 12 MiB);
/// forgetting only costs a lookup that finds them.
const MAX_SENT: usize = 1 << 18;

impl Client {
    /// Back up `source` through the server as backup `name` in `group`:
    /// by its fingerprints when its chunks can be the repository's
    /// segments, else its image read whole and sent by the pipelined
    /// client (the report says why). `progress` is told the blocks done.
    /// If the parent cannot be taken from after all (changed or damaged
    /// since the server picked it), the backup is made again walking
    /// every block, and `parent_refused` says why.
    pub fn backup_blocks(
        &self,
        name: &str,
        group: &str,
        source: &dyn BlockSource,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<(WireBackup, BlocksReport), ClientError> {
        match self.backup_blocks_with(name, group, source, progress, true) {
            Err(ClientError::Server(e)) if e.kind == ErrorKind::ParentUnusable => {
                let (b, mut report) =
                    self.backup_blocks_with(name, group, source, progress, false)?;
                report.parent_refused = Some(e.message);
                Ok((b, report))
            }
            other => other,
        }
    }

    /// `backup_blocks`, taking unchanged regions from the parent if
    /// `with_parent` and the device's tracking allows.
    fn backup_blocks_with(
        &self,
        name: &str,
        group: &str,
        source: &dyn BlockSource,
        progress: &(dyn Fn(u64) + Sync),
        with_parent: bool,
    ) -> Result<(WireBackup, BlocksReport), ClientError> {
        let (session, segmenting, hash) = self.begin(name, group)?;
        let mut report = BlocksReport {
            blocks: source.blocks(),
            ..BlocksReport::default()
        };
        let opts = BackupOptions::default();
        let mut mark = None;
        let piped =
            match why_not_by_fingerprint(segmenting, hash, source.block_size(), source.hash()) {
                Some(why) => {
                    report.read_because = Some(why);
                    let mut told = |n| progress(n);
                    let image = image_reader(source, &mut report, &mut told);
                    let how = (segmenting, hash);
                    self.pipeline(session, how, Source::Stream(image), &opts, &|_| {})
                }
                None => {
                    report.by_fingerprint = true;
                    self.tracked(session, source, with_parent, &mut report)
                        .and_then(|(tracked, m)| {
                            mark = m;
                            let mut windows = Windows {
                                client: self,
                                session,
                                name,
                                hash,
                                source,
                                report: &mut report,
                                sent: HashSet::new(),
                                acks: VecDeque::new(),
                            };
                            windows.all(tracked, progress)
                        })
                        .and_then(|()| match mark {
                            None => Ok(()),
                            Some(m) => match self.call(Call::DeviceMark {
                                session,
                                device: m.device,
                                mark: m.mark,
                            })? {
                                Reply::MarkSet => Ok(()),
                                other => Err(unexpected(&other)),
                            },
                        })
                }
            };
        let backup = self.end(session, piped, None, &opts)?;
        if let Some(m) = mark {
            report.tracking = restart_tracking(source, m);
        }
        Ok((backup, report))
    }

    /// Whether the device's tracking counts from the parent the server
    /// picks for `session` (asked only of a tracked device, and only if
    /// `with_parent`), and the mark this backup records: a fresh random
    /// one, if the device has an identity and one can be drawn.
    fn tracked(
        &self,
        session: u64,
        source: &dyn BlockSource,
        with_parent: bool,
        report: &mut BlocksReport,
    ) -> Result<(bool, Option<DeviceMark>), ClientError> {
        let device = source.device_id();
        let mut tracked = false;
        if let (true, Some(device), Some(now)) = (with_parent, device, source.tracking_mark()) {
            let size = source.blocks() * u64::from(source.block_size());
            match self.call(Call::ParentImage { session, size })? {
                Reply::ParentImage { name, mark } => {
                    tracked = name.is_some() && mark == Some((device, now));
                    report.parent = name.filter(|_| tracked);
                }
                other => return Err(unexpected(&other)),
            }
        }
        Ok((tracked, new_mark(device)))
    }
}

/// A backup by fingerprint through a server, a window at a time.
struct Windows<'a> {
    client: &'a Client,
    session: u64,
    name: &'a str,
    hash: SegmentHash,
    source: &'a dyn BlockSource,
    report: &'a mut BlocksReport,
    /// Segments sent as `New` in this session: later blocks with them
    /// are `Known` without a lookup.
    sent: HashSet<Fingerprint>,
    acks: VecDeque<Pending>,
}

/// Where the bytes of a block to send as `New` come from.
#[derive(Clone, Copy)]
enum Bytes {
    Zeros,
    /// Block `j` of the window, read.
    Block(usize),
}

/// A window mapped and its lookup sent, not yet answered; or one the
/// device's tracking says did not change, taken from the parent.
struct Planned {
    first: u64,
    count: u64,
    /// Taken from the parent whole: not mapped, nothing looked up.
    unchanged: bool,
    states: Vec<BlockState>,
    /// Each block's fingerprint as the repository names it; `None` for
    /// one the device keeps none of (read and hashed when finished).
    named: Vec<Option<Fingerprint>>,
    /// The fingerprints asked about, and the answer to come.
    lookup: Option<(Vec<[u8; 32]>, Pending)>,
}

impl Windows<'_> {
    /// Every window in order. The next window's lookup is sent before
    /// this one's blocks are read, so the server answers it while this
    /// client reads, and stores this window's append while it reads the
    /// next (a connection's requests are answered in order: a lookup
    /// sent after an append would wait for it).
    fn all(&mut self, tracked: bool, progress: &(dyn Fn(u64) + Sync)) -> Result<(), ClientError> {
        let bs = u64::from(self.source.block_size());
        let per = (WINDOW_BYTES / bs).clamp(1, 1024);
        let zeros = vec![0u8; bs as usize];
        let zero_fp = self.hash.of(&zeros);
        let mut buf = Vec::new();
        let blocks = self.report.blocks;
        let plan = |w: &mut Self, first: u64| {
            let (count, unchanged) = next_window(w.source, tracked, first, per.min(blocks - first));
            match unchanged {
                true => Ok(Planned {
                    first,
                    count,
                    unchanged: true,
                    states: Vec::new(),
                    named: Vec::new(),
                    lookup: None,
                }),
                false => w.plan(first, count, zero_fp),
            }
        };
        let mut next = (blocks > 0).then(|| plan(self, 0)).transpose()?;
        while let Some(window) = next.take() {
            let end = window.first + window.count;
            if end < blocks {
                next = Some(plan(self, end)?);
            }
            self.finish(window, &zeros, &mut buf)?;
            progress(end);
        }
        while let Some(p) = self.acks.pop_front() {
            ack(p)?;
        }
        Ok(())
    }

    /// Map blocks `first..first + count`, name each as the repository
    /// does, and send their lookup.
    fn plan(
        &mut self,
        first: u64,
        count: u64,
        zero_fp: Fingerprint,
    ) -> Result<Planned, ClientError> {
        let states = (self.source.map(first, count)).map_err(|e| self.local("mapping", e))?;
        if states.len() as u64 != count {
            let e = io::Error::other(format!("{} states for {count} blocks", states.len()));
            return Err(self.local("mapping", e));
        }
        let named: Vec<Option<Fingerprint>> = (states.iter())
            .map(|s| match s {
                BlockState::Zero => Some(zero_fp),
                BlockState::Known(fp) => self.hash.from_plain(fp),
                BlockState::Unknown => None,
            })
            .collect();
        self.report.zero_blocks +=
            (states.iter()).filter(|s| **s == BlockState::Zero).count() as u64;
        // Not those sent already: if the set is cleared (`MAX_SENT`)
        // before this window is finished, such a segment goes as `New`
        // again, which the server finds stored (harmless).
        let mut asked = HashSet::new();
        let fingerprints: Vec<[u8; 32]> = (named.iter().flatten())
            .filter(|fp| !self.sent.contains(*fp) && asked.insert(**fp))
            .map(|fp| fp.0)
            .collect();
        let lookup = match fingerprints.is_empty() {
            true => None,
            false => {
                let call = Call::Lookup {
                    session: self.session,
                    fingerprints: fingerprints.clone(),
                };
                Some((fingerprints, self.client.send(call)?))
            }
        };
        Ok(Planned {
            first,
            count,
            unchanged: false,
            states,
            named,
            lookup,
        })
    }

    /// A planned window: its lookup's answer, the missing blocks read and
    /// checked, and all its blocks appended in order.
    fn finish(
        &mut self,
        Planned {
            first,
            count,
            unchanged,
            states,
            named,
            lookup,
        }: Planned,
        zeros: &[u8],
        buf: &mut Vec<u8>,
    ) -> Result<(), ClientError> {
        let bs = self.source.block_size() as usize;
        if unchanged {
            // The server takes the parent's segments for these bytes, each
            // confirmed against its catalog, or fails the append with
            // `ParentUnusable` (and the backup is made again without it).
            let run = [ItemRef::Parent {
                offset: first * bs as u64,
                len: count * bs as u64,
            }];
            let append = self.client.send_append(self.session, &run)?;
            self.report.blocks_from_parent += count;
            self.report.blocks_unwalked += count;
            return self.in_flight(append);
        }
        let found = self.found(lookup)?;
        // Sent since the lookup went (by the window before) counts too.
        let had =
            |fp: &Fingerprint, sent: &HashSet<Fingerprint>| found.contains(fp) || sent.contains(fp);
        // The blocks to read: every unnamed one, and the first block of
        // each fingerprint the server lacks (zero blocks need no read).
        let mut wanted = vec![false; states.len()];
        let mut from: HashMap<Fingerprint, Bytes> = HashMap::new();
        for (i, (state, fp)) in states.iter().zip(&named).enumerate() {
            match fp {
                None => wanted[i] = true,
                Some(fp) if had(fp, &self.sent) => {}
                Some(fp) => {
                    from.entry(*fp).or_insert_with(|| match state {
                        BlockState::Zero => Bytes::Zeros,
                        _ => {
                            wanted[i] = true;
                            Bytes::Block(i)
                        }
                    });
                }
            }
        }
        let read = read_wanted(self.source, self.hash, first, &wanted, std::mem::take(buf))
            .map_err(|e| self.local("reading", e))?;
        self.report.blocks_read += read.blocks_read;
        self.report.bytes_read += read.blocks_read * bs as u64;
        let mut items = Vec::with_capacity(states.len());
        for (i, fp) in named.iter().enumerate() {
            let got = read.hashed[i];
            if let (Some(fp), Some(got)) = (fp, got) {
                if *fp != got {
                    let e = RepoError::SourceMismatch {
                        name: self.name.into(),
                        what: self.source.describe(first + i as u64),
                    };
                    return Err(ClientError::Local(e.to_string()));
                }
            }
            let fingerprint = fp.or(got).expect("every unnamed block was read and hashed");
            if had(&fingerprint, &self.sent) {
                items.push(ItemRef::Known {
                    fingerprint: fingerprint.0,
                });
                continue;
            }
            let data = match from.get(&fingerprint).copied() {
                Some(Bytes::Zeros) => zeros,
                Some(Bytes::Block(j)) => read.block(j, bs),
                // An unnamed block read: its own bytes.
                None => read.block(i, bs),
            };
            self.sent.insert(fingerprint);
            items.push(ItemRef::New {
                fingerprint: fingerprint.0,
                data,
            });
        }
        let append = self.client.send_append(self.session, &items);
        drop(items);
        *buf = read.bytes;
        if self.sent.len() > MAX_SENT {
            self.sent.clear();
        }
        self.in_flight(append?)
    }

    /// Keep `append` among those in flight, waiting for the oldest past
    /// `IN_FLIGHT`.
    fn in_flight(&mut self, append: Pending) -> Result<(), ClientError> {
        self.acks.push_back(append);
        while self.acks.len() > IN_FLIGHT {
            ack(self.acks.pop_front().expect("non-empty"))?;
        }
        Ok(())
    }

    /// The answer to a window's lookup: the fingerprints the repository
    /// has (held for the session from now on).
    fn found(
        &mut self,
        lookup: Option<(Vec<[u8; 32]>, Pending)>,
    ) -> Result<HashSet<Fingerprint>, ClientError> {
        let Some((fingerprints, pending)) = lookup else {
            return Ok(HashSet::new());
        };
        match pending.wait() {
            Ok(Reply::Found(f)) if f.len() == fingerprints.len() => {
                Ok((fingerprints.into_iter().zip(f))
                    .filter(|(_, had)| *had)
                    .map(|(fp, _)| Fingerprint(fp))
                    .collect())
            }
            Ok(other) => Err(unexpected(&other)),
            // An append in flight may have failed the session, which then
            // answers "no such session": the append's error is the cause.
            Err(e) => {
                while let Some(p) = self.acks.pop_front() {
                    ack(p)?;
                }
                Err(e)
            }
        }
    }

    fn local(&self, what: &str, e: io::Error) -> ClientError {
        ClientError::Local(format!("{what} the device for backup {}: {e}", self.name))
    }
}

fn ack(p: Pending) -> Result<(), ClientError> {
    match p.wait()? {
        Reply::Appended { .. } => Ok(()),
        other => Err(unexpected(&other)),
    }
}
