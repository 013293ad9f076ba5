//! The data device's record of the metadata's generation: how a device
//! tells metadata that is older than its data (a copy put back from a
//! backup, a damaged newest superblock slot that left only the older one)
//! from metadata that belongs with it.
//!
//! Every superblock write syncs the metadata device and then writes the
//! new generation into one of two 512-byte slots of the data header (the
//! slot `generation % 2`, so a torn slot leaves the other). The data side
//! is written only after the metadata side is durable, so the data's
//! generation never runs ahead of the newest valid superblock: if it does,
//! the superblock read is older than one that was written, and the device
//! refuses to open (`Error::Stale`) rather than serve another time's data.
//! The slot write itself is not synced: a lost one only lags the check,
//! and the next data sync (every FLUSH) carries it.
//!
//! A generation moves only when the superblock is written (open, close,
//! repair), so a copy of the metadata taken while the device is served has
//! the generation of the live file. Each slot therefore also records the
//! store's **commit** number (journaled stores: the root block's count of
//! commits, `backends/disktable/tables.rs`), written after every commit is
//! durable on the metadata device. Within one generation, metadata whose
//! last commit is below the data's record is a copy from before that
//! commit, and it is refused like an older generation. The record rides
//! unsynced, so after a process crash (kill -9) it is exact, and after a
//! power cut it may lag by the last commit: such a copy is refused once a
//! second commit followed it.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crate::blockfile::BlockFile;
use crate::codec::{is_sealed, seal, Decoder, Encoder};
use crate::error::{Error, Result};

/// The data header's identity part, sealed on its own at its end; the
/// generation slots follow it.
pub const IDENTITY_LEN: usize = 2048;
const SLOT_LEN: usize = 512;
const SLOTS_AT: u64 = IDENTITY_LEN as u64;
const SLOT_MAGIC: &[u8; 8] = b"DDUPGEN1";
/// The record while older metadata is being kept and verified: above any
/// metadata generation, so a repair that stops half-way leaves the device
/// refused (the message says to run the repair again), never served with
/// metadata that was not verified.
pub const REPAIRING: u64 = u64::MAX;

/// What the data device last recorded of its metadata, ordered by
/// generation, then commit (a slot written by an older version has commit
/// 0, which only weakens the check).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Recorded {
    pub generation: u64,
    pub commit: u64,
}

fn encode_slot(uuid: &[u8; 16], r: Recorded) -> Vec<u8> {
    let mut e = Encoder::with_capacity(SLOT_LEN);
    e.bytes(SLOT_MAGIC)
        .u64(r.generation)
        .bytes(uuid)
        .u64(r.commit)
        .pad_to(SLOT_LEN);
    let mut slot = e.buf;
    seal(&mut slot);
    slot
}

fn decode_slot(slot: &[u8], uuid: &[u8; 16]) -> Option<Recorded> {
    if !is_sealed(slot) {
        return None;
    }
    let mut d = Decoder::new(slot, "data generation slot");
    if d.bytes(8).ok()? != SLOT_MAGIC {
        return None;
    }
    let generation = d.u64().ok()?;
    if d.array::<16>().ok()? != *uuid {
        return None;
    }
    let commit = d.u64().ok()?;
    Some(Recorded { generation, commit })
}

/// The newest record on the data device (zero: none yet, a device made
/// before generations were recorded, or both slots damaged, which only
/// weakens the check: it can never refuse good metadata).
pub fn read(file: &dyn BlockFile, uuid: &[u8; 16]) -> Result<Recorded> {
    let mut slots = vec![0u8; 2 * SLOT_LEN];
    file.read_at(&mut slots, SLOTS_AT)?;
    Ok(slots
        .chunks(SLOT_LEN)
        .filter_map(|s| decode_slot(s, uuid))
        .max()
        .unwrap_or_default())
}

/// Where the superblock records each new generation on the data device.
/// Carried by the superblock of a device opened for writing; a superblock
/// without one (format, tests, inspection) writes only the metadata side.
pub struct Witness {
    data: Arc<dyn BlockFile>,
    uuid: [u8; 16],
    /// Devices made before generations sealed the whole 4 KiB header;
    /// their identity is resealed at 2048 once, before the first slot
    /// write (which breaks the old seal).
    upgraded: AtomicBool,
    /// Older metadata being kept (`check --repair --data`): nothing is
    /// recorded until every chunk has been verified (`release`), so an
    /// interrupted repair leaves the device refused as stale, not served.
    held: AtomicBool,
    /// The newest generation written to the metadata device.
    last: AtomicU64,
    /// The newest commit durable on the metadata device.
    commit: AtomicU64,
}

impl std::fmt::Debug for Witness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Witness({})", self.data.describe())
    }
}

impl Witness {
    /// `generation`: the superblock's as read; `held`: older metadata is
    /// being kept: the record says `REPAIRING` (durably, before anything
    /// else is written) and nothing else until `release`.
    pub fn new(
        data: Arc<dyn BlockFile>,
        uuid: [u8; 16],
        generation: u64,
        held: bool,
    ) -> Result<Arc<Witness>> {
        let w = Witness {
            data,
            uuid,
            upgraded: AtomicBool::new(false),
            held: AtomicBool::new(false),
            last: AtomicU64::new(generation),
            commit: AtomicU64::new(0),
        };
        if held {
            w.hold()?;
        }
        Ok(Arc::new(w))
    }

    /// Older metadata is being kept (found stale by the generation, or by
    /// the commit once the store has read its own): record `REPAIRING`
    /// durably in both slots, and nothing else until `release`.
    pub fn hold(&self) -> Result<()> {
        self.held.store(true, Ordering::SeqCst);
        let repairing = Recorded {
            generation: REPAIRING,
            commit: 0,
        };
        self.try_record_slot(repairing, 0)?;
        self.try_record_slot(repairing, 1)?;
        self.data.sync()
    }

    /// Whether older metadata is being kept (`hold`) and not yet released.
    pub fn is_held(&self) -> bool {
        self.held.load(Ordering::SeqCst)
    }

    /// The kept metadata is verified: record its newest generation in both
    /// slots (the data's record was higher, so one slot would not do) and
    /// sync, making it the device's metadata.
    pub fn release(&self) -> Result<()> {
        self.held.store(false, Ordering::SeqCst);
        let r = self.current();
        self.try_record_slot(r, 0)?;
        self.try_record_slot(r, 1)?;
        self.data.sync()
    }

    fn current(&self) -> Recorded {
        Recorded {
            generation: self.last.load(Ordering::SeqCst),
            commit: self.commit.load(Ordering::SeqCst),
        }
    }

    /// Record `generation`, already durable on the metadata device. A
    /// failure (the data device refusing writes) is logged, not returned:
    /// the record only lags, which weakens the check and never refuses good
    /// metadata, and the metadata write it follows has succeeded.
    pub fn record(&self, generation: u64) {
        self.last.store(generation, Ordering::SeqCst);
        if self.held.load(Ordering::SeqCst) {
            return;
        }
        if let Err(e) = self.try_record(generation) {
            tracing::warn!("recording metadata generation {generation} on the data device: {e}");
        }
    }

    /// Record that commit `commit` is durable on the metadata device (its
    /// number in the store's own count). Written to the slot that does not
    /// hold the generation's own record, so a torn write leaves that one;
    /// logged on failure like `record`.
    pub fn record_commit(&self, commit: u64) {
        self.commit.store(commit, Ordering::SeqCst);
        if self.held.load(Ordering::SeqCst) {
            return;
        }
        let r = self.current();
        if let Err(e) = self.try_record_slot(r, 1 - r.generation % 2) {
            tracing::warn!("recording metadata commit {commit} on the data device: {e}");
        }
    }

    /// The store's last commit as read at open, before any new one.
    pub fn set_commit(&self, commit: u64) {
        self.commit.store(commit, Ordering::SeqCst);
    }

    fn try_record(&self, generation: u64) -> Result<()> {
        let r = Recorded {
            generation,
            commit: self.commit.load(Ordering::SeqCst),
        };
        self.try_record_slot(r, generation % 2)
    }

    fn try_record_slot(&self, r: Recorded, slot: u64) -> Result<()> {
        if !self.upgraded.load(Ordering::Acquire) {
            upgrade_identity(self.data.as_ref())?;
            self.upgraded.store(true, Ordering::Release);
        }
        let bytes = encode_slot(&self.uuid, r);
        self.data
            .write_at(&bytes, SLOTS_AT + slot * SLOT_LEN as u64)
    }
}

/// Reseal an old whole-block header's identity at `IDENTITY_LEN` and sync.
/// Bytes 0..2044 are the same in both layouts, so the one sector that
/// changes (the new seal) flips the header from one valid layout to the
/// other: a crash on either side of it leaves a readable header.
fn upgrade_identity(data: &dyn BlockFile) -> Result<()> {
    let mut identity = vec![0u8; IDENTITY_LEN];
    data.read_at(&mut identity, 0)?;
    if is_sealed(&identity) {
        return Ok(());
    }
    seal(&mut identity);
    const SECTOR: usize = 512;
    data.write_at(
        &identity[IDENTITY_LEN - SECTOR..],
        (IDENTITY_LEN - SECTOR) as u64,
    )?;
    data.sync()
}

/// Compare the superblock's generation with the data's: metadata older
/// than what the data device last recorded is refused.
pub fn check(
    meta_generation: u64,
    data_generation: u64,
    damaged_slot: bool,
    meta: &Path,
    data: &Path,
) -> Result<()> {
    if meta_generation >= data_generation {
        return Ok(());
    }
    Err(Error::Stale {
        meta: meta.to_path_buf(),
        data: data.to_path_buf(),
        meta_generation,
        data_generation,
        damaged_slot,
        repair_stopped: data_generation == REPAIRING,
    })
}

/// Compare the store's last commit (read at open, after its journal is
/// replayed) with the data's record: within one generation, metadata that
/// stops before a commit the data saw is a copy from before it.
pub fn check_commit(
    meta_generation: u64,
    meta_commit: u64,
    recorded: Recorded,
    meta: &Path,
    data: &Path,
) -> Result<()> {
    if meta_generation != recorded.generation || meta_commit >= recorded.commit {
        return Ok(());
    }
    Err(Error::StaleCommit {
        meta: meta.to_path_buf(),
        data: data.to_path_buf(),
        meta_commit,
        data_commit: recorded.commit,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blockfile::MemBlockFile;

    #[test]
    fn the_newest_valid_slot_wins_and_a_torn_one_falls_back() {
        let f = Arc::new(MemBlockFile::new(4096, "data"));
        let uuid = [7; 16];
        let w = Witness::new(f.clone(), uuid, 0, false).unwrap();
        assert_eq!(read(f.as_ref(), &uuid).unwrap().generation, 0);
        w.try_record(5).unwrap();
        w.try_record(6).unwrap();
        assert_eq!(read(f.as_ref(), &uuid).unwrap().generation, 6);
        // Tear generation 6's slot (slot 0): 5 remains.
        f.write_at(&[0xee; 100], SLOTS_AT + 40).unwrap();
        assert_eq!(read(f.as_ref(), &uuid).unwrap().generation, 5);
        // Another device's slots do not count.
        assert_eq!(read(f.as_ref(), &[8; 16]).unwrap().generation, 0);
    }

    #[test]
    fn an_old_whole_block_header_is_resealed_once_before_the_first_slot() {
        let f = Arc::new(MemBlockFile::new(4096, "data"));
        let mut old = vec![0u8; 4096];
        old[..8].copy_from_slice(b"DDUPDATA");
        seal(&mut old);
        f.write_at(&old, 0).unwrap();
        Witness::new(f.clone(), [1; 16], 0, false)
            .unwrap()
            .try_record(1)
            .unwrap();
        let mut now = vec![0u8; 4096];
        f.read_at(&mut now, 0).unwrap();
        assert!(is_sealed(&now[..IDENTITY_LEN]));
        assert_eq!(now[..IDENTITY_LEN - 4], old[..IDENTITY_LEN - 4]);
        assert_eq!(read(f.as_ref(), &[1; 16]).unwrap().generation, 1);
    }

    #[test]
    fn kept_older_metadata_is_refused_until_its_repair_releases_it() {
        let f = Arc::new(MemBlockFile::new(4096, "data"));
        let uuid = [3; 16];
        Witness::new(f.clone(), uuid, 0, false)
            .unwrap()
            .try_record(9)
            .unwrap();
        // Keeping generation 4 over a record of 9: any metadata is refused
        // while the repair runs, its superblock writes included.
        let w = Witness::new(f.clone(), uuid, 4, true).unwrap();
        w.record(5);
        w.record(6);
        let during = read(f.as_ref(), &uuid).unwrap().generation;
        assert_eq!(during, REPAIRING);
        let e = check(6, during, false, Path::new("m"), Path::new("d")).unwrap_err();
        assert!(e.to_string().contains("run it again"), "{e}");
        w.release().unwrap();
        assert_eq!(read(f.as_ref(), &uuid).unwrap().generation, 6);
        check(6, 6, false, Path::new("m"), Path::new("d")).unwrap();
    }

    #[test]
    fn older_metadata_is_refused_naming_both_generations() {
        check(4, 4, false, Path::new("m"), Path::new("d")).unwrap();
        check(9, 4, false, Path::new("m"), Path::new("d")).unwrap();
        let e = check(3, 4, false, Path::new("m"), Path::new("d"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("generation 3") && e.contains("generation 4"),
            "{e}"
        );
        assert!(e.contains("check --repair --data"), "{e}");
    }
}
