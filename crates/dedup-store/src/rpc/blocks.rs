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
//! Unlike a backup beside the repository, this one takes nothing from a
//! parent and restarts no changed-block tracking: every block's
//! fingerprint is walked and looked up, and only new chunks are read.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io;

use dedup_common::fingerprint::Fingerprint;

use super::client::{unexpected, Client, ClientError, Pending};
use super::item_ref::ItemRef;
use super::pipeline::{BackupOptions, Source};
use super::protocol::{Call, Reply, WireBackup};
use crate::backup_blocks::{
    image_reader, read_wanted, why_not_by_fingerprint, BlockSource, BlocksReport,
};
use crate::block_map::BlockState;
use crate::error::repo::RepoError;
use crate::segment_hash::SegmentHash;

/// Bytes of blocks per window: one lookup and one append.
const WINDOW_BYTES: u64 = 4 << 20;
/// Appends sent and not yet answered, so the server stores one window
/// while this client reads the next.
const IN_FLIGHT: usize = 4;
/// Fingerprints remembered as sent in this session (about 12 MiB);
/// forgetting only costs a lookup that finds them.
const MAX_SENT: usize = 1 << 18;

impl Client {
    /// Back up `source` through the server as backup `name` in `group`:
    /// by its fingerprints when its chunks can be the repository's
    /// segments, else its image read whole and sent by the pipelined
    /// client (the report says why). `progress` is told the blocks done.
    pub fn backup_blocks(
        &self,
        name: &str,
        group: &str,
        source: &dyn BlockSource,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<(WireBackup, BlocksReport), ClientError> {
        let (session, segmenting, hash) = self.begin(name, group)?;
        let mut report = BlocksReport {
            blocks: source.blocks(),
            ..BlocksReport::default()
        };
        let opts = BackupOptions::default();
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
                    windows.all(progress)
                }
            };
        let backup = self.end(session, piped, None, &opts)?;
        Ok((backup, report))
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

impl Windows<'_> {
    fn all(&mut self, progress: &(dyn Fn(u64) + Sync)) -> Result<(), ClientError> {
        let bs = u64::from(self.source.block_size());
        let per = (WINDOW_BYTES / bs).clamp(1, 1024);
        let zeros = vec![0u8; bs as usize];
        let zero_fp = self.hash.of(&zeros);
        let mut buf = Vec::new();
        let mut first = 0;
        while first < self.report.blocks {
            let count = per.min(self.report.blocks - first);
            self.window(first, count, (&zeros, zero_fp), &mut buf)?;
            first += count;
            progress(first);
        }
        while let Some(p) = self.acks.pop_front() {
            ack(p)?;
        }
        Ok(())
    }

    /// Blocks `first..first + count`: named, looked up, the missing ones
    /// read and checked, and all appended in order.
    fn window(
        &mut self,
        first: u64,
        count: u64,
        (zeros, zero_fp): (&[u8], Fingerprint),
        buf: &mut Vec<u8>,
    ) -> Result<(), ClientError> {
        let bs = self.source.block_size() as usize;
        let name = self.name;
        let local = |what: &str, e: io::Error| {
            ClientError::Local(format!("{what} the device for backup {name}: {e}"))
        };
        let states = (self.source.map(first, count)).map_err(|e| local("mapping", e))?;
        if states.len() as u64 != count {
            let e = io::Error::other(format!("{} states for {count} blocks", states.len()));
            return Err(local("mapping", e));
        }
        // Each block's fingerprint as the repository names it; `None`
        // for one the device keeps none of (read and hashed below).
        let named: Vec<Option<Fingerprint>> = (states.iter())
            .map(|s| match s {
                BlockState::Zero => Some(zero_fp),
                BlockState::Known(fp) => self.hash.from_plain(fp),
                BlockState::Unknown => None,
            })
            .collect();
        self.report.zero_blocks +=
            (states.iter()).filter(|s| **s == BlockState::Zero).count() as u64;
        let found = self.lookup(&named)?;
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
            .map_err(|e| local("reading", e))?;
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
        self.acks.push_back(append?);
        if self.sent.len() > MAX_SENT {
            self.sent.clear();
        }
        while self.acks.len() > IN_FLIGHT {
            ack(self.acks.pop_front().expect("non-empty"))?;
        }
        Ok(())
    }

    /// Which of the named fingerprints not sent in this session the
    /// repository has (held for the session from now on).
    fn lookup(
        &mut self,
        named: &[Option<Fingerprint>],
    ) -> Result<HashSet<Fingerprint>, ClientError> {
        let mut asked = HashSet::new();
        let fingerprints: Vec<[u8; 32]> = (named.iter().flatten())
            .filter(|fp| !self.sent.contains(*fp) && asked.insert(**fp))
            .map(|fp| fp.0)
            .collect();
        if fingerprints.is_empty() {
            return Ok(HashSet::new());
        }
        let call = Call::Lookup {
            session: self.session,
            fingerprints: fingerprints.clone(),
        };
        match self.client.call(call) {
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
}

fn ack(p: Pending) -> Result<(), ClientError> {
    match p.wait()? {
        Reply::Appended { .. } => Ok(()),
        other => Err(unexpected(&other)),
    }
}
