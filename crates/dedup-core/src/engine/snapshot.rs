//! A snapshot of a served device for a backup by fingerprint (issue 39):
//! the LBN map frozen at one instant while writes go on.
//!
//! Copy-on-write of the map, kept in RAM beside it (under the metadata
//! mutex): the first time an LBN is mapped or unmapped after the freeze,
//! `Meta::map`/`unmap` keep what it mapped to then (its PBN and that
//! chunk's fingerprint). The snapshot reads an LBN from what it kept, or
//! else from the live map, which has not changed there since the freeze.
//!
//! The chunks it kept are *held*: a collection skips them, a release
//! that would free one waits for the snapshot's end, and a repack that
//! moves one tells the snapshot its new address. Nothing of the snapshot
//! is written to the metadata: a crash ends it with the process, and the
//! chunks it held are garbage for the next collection. (Except a chunk
//! the hash index does not hold, such as a verify-mode collision's: its
//! deferred release is not in the metadata, so after a crash during a
//! backup it stays counted until `dedup check --repair`.)
//!
//! A snapshot keeps at most `MAX_KEPT` LBNs; past that it is given up:
//! its later reads fail, saying why (what it held stays held to its end).
//!
//! Changed-block tracking: the snapshot starts flags of its own at the
//! freeze. When its backup has committed, the device's tracking goes on
//! from those flags under the backup's mark; a snapshot ended any other
//! way leaves the device's tracking as it was.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};

use super::{chunking, ChunkState, Engine};
use crate::changes::{ChangeMap, Changes};
use crate::config::{Lbn, Pbn};
use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::placement::ReadPiece;
use crate::stats::Counters;

/// Most LBNs a snapshot keeps (with the chunks they hold, up to about 130
/// bytes of RAM each: some 500 MB, the first overwrites of 16 GiB of 4 KiB
/// chunks while one backup runs).
/// Past it the snapshot is given up and its later reads fail, saying
/// why, rather than the server's memory growing without bound.
pub const MAX_KEPT: usize = 4 << 20;

/// Snapshot ids, so that a session ends only its own.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// What a snapshot kept of the map (see the module's comment).
pub(crate) struct Frozen {
    id: u64,
    /// `MAX_KEPT`, or less in a test.
    max_kept: usize,
    /// LBNs changed since the freeze: what each mapped to then.
    kept: HashMap<Lbn, Option<(Pbn, Option<Fingerprint>)>>,
    held: HashSet<Pbn>,
    /// Releases that would have freed a held chunk, done at the end.
    deferred: Vec<Pbn>,
    /// Regions changed since the freeze.
    pub(crate) since: ChangeMap,
    /// Given up (it would have kept more than `max_kept`): it keeps and
    /// reads nothing more (what it held, it holds until its end), and
    /// ends without restarting the tracking.
    abandoned: bool,
}

impl Frozen {
    /// Whether the first change of `lbn` since the freeze is yet to be kept.
    pub(crate) fn wants(&self, lbn: Lbn) -> bool {
        !self.abandoned && !self.kept.contains_key(&lbn)
    }

    /// What `dedup status` shows of it.
    pub(crate) fn figures(&self) -> crate::stats::SnapshotFigures {
        crate::stats::SnapshotFigures {
            lbns_kept: self.kept.len() as u64,
            chunks_held: self.held.len() as u64,
            given_up: self.abandoned,
        }
    }

    pub(crate) fn full(&self) -> bool {
        self.kept.len() >= self.max_kept
    }

    /// Give the snapshot up: it keeps no more, and reads nothing more.
    /// What it holds stays held until its end, so a read already past
    /// its lookup still gets the bytes of the freeze (the held chunks
    /// are at most `max_kept`).
    pub(crate) fn abandon(&mut self) {
        tracing::warn!(
            "a backup's snapshot is given up: more than {} chunks were overwritten while it ran",
            self.max_kept
        );
        self.abandoned = true;
        self.kept = HashMap::new();
    }

    pub(crate) fn keep(&mut self, lbn: Lbn, old: Option<Pbn>, fp: Option<Fingerprint>) {
        if let Some(pbn) = old {
            self.held.insert(pbn);
        }
        self.kept.insert(lbn, old.map(|pbn| (pbn, fp)));
    }

    /// A repack moved chunks (old, new): what was kept follows them.
    pub(crate) fn moved(&mut self, moves: &[(Pbn, Pbn)]) {
        let moves: HashMap<Pbn, Pbn> = moves
            .iter()
            .copied()
            .filter(|(old, _)| self.held.contains(old))
            .collect();
        if moves.is_empty() {
            return;
        }
        for (pbn, _) in self.kept.values_mut().flatten() {
            if let Some(&new) = moves.get(pbn) {
                *pbn = new;
            }
        }
        for d in &mut self.deferred {
            if let Some(&new) = moves.get(d) {
                *d = new;
            }
        }
        for (old, new) in moves {
            self.held.remove(&old);
            self.held.insert(new);
        }
    }

    pub(crate) fn holds(&self, pbn: Pbn) -> bool {
        self.held.contains(&pbn)
    }

    pub(crate) fn defer_release(&mut self, pbn: Pbn) {
        self.deferred.push(pbn);
    }
}

/// What a snapshot tells its backup when it starts.
#[derive(Clone, Debug)]
pub struct SnapshotStart {
    /// What ends it (`snapshot_end`).
    pub id: u64,
    /// What the device's tracking said changed since its mark, at the
    /// freeze (`None`: untracked, walk everything).
    pub changes: Option<Changes>,
    /// Whether ending it with a mark restarts the device's tracking.
    pub can_track: bool,
}

/// Where one LBN's content was at the freeze.
enum Then {
    Unmapped,
    Chunk(Pbn, Option<Fingerprint>),
}

impl Engine {
    /// Freeze the LBN map, keeping at most `max_kept` LBNs (`MAX_KEPT`).
    /// One snapshot at a time.
    pub(crate) fn snapshot_start(&self, max_kept: usize) -> Result<SnapshotStart> {
        let _g = self.enter()?;
        let mut m = self.meta.lock();
        if m.snapshot.is_some() {
            return Err(Error::InvalidArgument(
                "a backup of this device is already running (one snapshot at a time): wait for it to finish".into(),
            ));
        }
        let mut since = ChangeMap::default();
        since.start(0, self.cfg.logical_chunks());
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        m.snapshot = Some(Frozen {
            id,
            max_kept,
            abandoned: false,
            kept: HashMap::new(),
            held: HashSet::new(),
            deferred: Vec::new(),
            since,
        });
        Ok(SnapshotStart {
            id,
            changes: m.changes.changes(),
            can_track: self.writable && self.changes_at.is_some(),
        })
    }

    /// End snapshot `id` (another is left alone). With `mark` (its backup
    /// committed, naming it), the device's tracking goes on from the
    /// freeze under that mark. Returns whether it did.
    pub(crate) fn snapshot_end(&self, id: u64, mark: Option<u64>) -> Result<bool> {
        let mut m = self.meta.lock();
        let Some(s) = m.snapshot.take_if(|s| s.id == id) else {
            return Ok(false);
        };
        let restarted = match mark {
            Some(mark) if self.writable && self.changes_at.is_some() && !s.abandoned => {
                let mut since = s.since;
                since.remark(mark);
                m.changes = since;
                true
            }
            _ => false,
        };
        // Failures are logged (a chunk left counted, for `check
        // --repair`); the tracking restarted all the same.
        let _ = m.release_all(self.placement.as_ref(), s.deferred);
        Ok(restarted)
    }

    /// At a stop: a snapshot still running ends with it, its backup
    /// unfinished (the device's tracking goes on as it was).
    pub(super) fn end_snapshot_at_close(&self, m: &mut super::Meta) -> Result<()> {
        match m.snapshot.take() {
            Some(s) => m.release_all(self.placement.as_ref(), s.deferred),
            None => Ok(()),
        }
    }

    /// The states of LBNs `first..first + count` at the freeze.
    pub(crate) fn snapshot_map(&self, first: Lbn, count: u64) -> Result<Vec<ChunkState>> {
        let _g = self.enter()?;
        self.check_lbns(first, count)?;
        let mut out = Vec::with_capacity(count as usize);
        let cs = self.cfg.chunk_size as usize;
        let lbns: Vec<Lbn> = (first..first + count).collect();
        for batch in lbns.chunks(chunking::batch_chunks(cs)) {
            let _guards = self.lbn_locks.read_many(batch.iter().copied());
            let mut m = self.meta.lock();
            for &lbn in batch {
                out.push(match self.then(&mut m, lbn)? {
                    Then::Unmapped => ChunkState::Unmapped,
                    Then::Chunk(_, Some(fp)) => ChunkState::Known(fp),
                    Then::Chunk(_, None) => ChunkState::Unknown,
                });
            }
        }
        Ok(out)
    }

    /// Fill `buf` (whole chunks) with LBNs from `first` as they were at
    /// the freeze.
    pub(crate) fn snapshot_read(&self, first: Lbn, buf: &mut [u8]) -> Result<()> {
        let _g = self.enter()?;
        let cs = self.cfg.chunk_size as usize;
        if buf.len() % cs != 0 {
            return Err(Error::InvalidArgument(format!(
                "a snapshot is read in whole chunks of {cs} bytes, not {}",
                buf.len()
            )));
        }
        let count = (buf.len() / cs) as u64;
        self.check_lbns(first, count)?;
        Counters::add(&self.counters.read_requests, 1);
        let lbns: Vec<Lbn> = (first..first + count).collect();
        for (b, batch) in lbns.chunks(chunking::batch_chunks(cs)).enumerate() {
            let _guards = self.lbn_locks.read_many(batch.iter().copied());
            // A repack must not reuse a block this batch looked up.
            let _moving = self.move_gate.read();
            let base = b * chunking::batch_chunks(cs) * cs;
            let mut pieces = Vec::with_capacity(batch.len());
            {
                let mut m = self.meta.lock();
                for (i, &lbn) in batch.iter().enumerate() {
                    let at = base + i * cs;
                    match self.then(&mut m, lbn)? {
                        Then::Unmapped => buf[at..at + cs].fill(0),
                        Then::Chunk(pbn, _) => pieces.push(ReadPiece {
                            pbn,
                            in_chunk: 0..cs,
                            in_buf: at..at + cs,
                        }),
                    }
                }
            }
            let bytes = self.placement.read(&pieces, buf)?;
            Counters::add(&self.counters.data_bytes_read, bytes);
        }
        Ok(())
    }

    /// Where `lbn` was at the freeze.
    fn then(&self, m: &mut super::Meta, lbn: Lbn) -> Result<Then> {
        let Some(s) = m.snapshot.as_ref() else {
            return Err(Error::InvalidArgument(
                "no snapshot of this device is running (it ended, or the device was stopped)"
                    .into(),
            ));
        };
        if s.abandoned {
            return Err(Error::InvalidArgument(format!(
                "the backup's snapshot was given up: more than {} chunks were overwritten while it ran (back up when the device is quieter, or stopped)",
                s.max_kept
            )));
        }
        if let Some(kept) = s.kept.get(&lbn) {
            return Ok(match *kept {
                None => Then::Unmapped,
                Some((pbn, fp)) => Then::Chunk(pbn, fp),
            });
        }
        Ok(match m.store.lbn_map_lookup(lbn)? {
            None => Then::Unmapped,
            Some(pbn) => Then::Chunk(pbn, m.store.chunk_fingerprint(pbn)?),
        })
    }
}
