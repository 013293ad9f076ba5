//! A journaled table file: 4 KiB checksummed table blocks behind the
//! buffer cache (`cache.rs`), made crash-safe by the redo journal
//! (`journal.rs`), with the store's state record in the root block (table
//! block 0). disktable and sparse lay their tables out differently (their
//! `Area`) and share this: opening (replay, read the root), commits and the
//! clean close.

use std::sync::Arc;

use super::cache::Cache;
use super::geometry::{Area, BLOCK, HEADER, ROOT};
use super::journal::Journal;
use crate::backends::kv::store::StoreState;
use crate::blockfile::BlockFile;
use crate::config::{Lbn, Pbn};
use crate::error::{Error, Result};
use crate::superblock::{DeviceState, Superblock};

pub struct Journaled {
    pub cache: Cache,
    journal: Journal,
    area: Area,
    pub file: Arc<dyn BlockFile>,
    superblock: Superblock,
    writable: bool,
    /// "disktable", "sparse": for log lines and errors.
    name: &'static str,
}

impl Journaled {
    /// The metadata device's length, refused when shorter than the tables
    /// need (`device_len`): a truncated file or the wrong device.
    pub fn check_len(file: &dyn BlockFile, device_len: u64) -> Result<u64> {
        let have = file.len()?;
        if have < device_len {
            return Err(Error::foreign(
                std::path::Path::new(&file.describe()),
                format!(
                    "metadata device is {have} bytes but this device's tables need {device_len}; was it truncated?"
                ),
            ));
        }
        Ok(have)
    }

    /// Replay a complete journal left by a crash, then read the state
    /// record of the last commit from the root block (empty when new).
    /// `salvage` (opened for check): from then on a damaged table block
    /// reads as empty (`Cache::lost`) instead of failing.
    pub fn open(
        superblock: Superblock,
        file: Arc<dyn BlockFile>,
        area: Area,
        cache_bytes: u64,
        writable: bool,
        salvage: bool,
        name: &'static str,
    ) -> Result<(Journaled, StoreState)> {
        let mut cache = Cache::new(file.clone(), area, cache_bytes);
        let (journal, replayed) = Journal::recover(file.as_ref(), &area, &mut cache.io)?;
        if replayed > 0 {
            tracing::info!("{name}: replayed {replayed} journaled blocks after an unclean stop");
        }
        let root = cache.get(ROOT)?;
        let state = if root.iter().all(|&b| b == 0) {
            StoreState::default()
        } else {
            let what = format!("{name} root block");
            let len = u32::from_le_bytes(root[HEADER..HEADER + 4].try_into().expect("4 bytes"));
            let len = len as usize;
            if len > BLOCK - HEADER - 4 {
                return Err(Error::corrupt(what, "state record too long"));
            }
            StoreState::decode(&root[HEADER + 4..HEADER + 4 + len], &what)?
        };
        if salvage {
            cache.salvage();
        }
        Ok((
            Journaled {
                cache,
                journal,
                area,
                file,
                superblock,
                writable,
                name,
            },
            state,
        ))
    }

    /// The little-endian u32 at (table block, payload offset).
    pub fn u32_at(&mut self, (b, off): (u64, usize)) -> Result<u32> {
        let block = self.cache.get(b)?;
        Ok(u32::from_le_bytes(
            block[HEADER + off..HEADER + off + 4]
                .try_into()
                .expect("4 bytes"),
        ))
    }

    /// The little-endian u16 at (table block, payload offset).
    pub fn u16_at(&mut self, (b, off): (u64, usize)) -> Result<u16> {
        let block = self.cache.get(b)?;
        Ok(u16::from_le_bytes(
            block[HEADER + off..HEADER + off + 2]
                .try_into()
                .expect("2 bytes"),
        ))
    }

    pub fn set_u16(&mut self, (b, off): (u64, usize), v: u16) -> Result<()> {
        let block = self.cache.get_mut(b)?;
        block[HEADER + off..HEADER + off + 2].copy_from_slice(&v.to_le_bytes());
        Ok(())
    }

    pub fn set_u32(&mut self, (b, off): (u64, usize), v: u32) -> Result<()> {
        let block = self.cache.get_mut(b)?;
        block[HEADER + off..HEADER + off + 4].copy_from_slice(&v.to_le_bytes());
        Ok(())
    }

    pub fn set_u64(&mut self, (b, off): (u64, usize), v: u64) -> Result<()> {
        let block = self.cache.get_mut(b)?;
        block[HEADER + off..HEADER + off + 8].copy_from_slice(&v.to_le_bytes());
        Ok(())
    }

    /// An LBN-map entry (`PBN + 1`, 0 = unmapped) at `at`; one past
    /// `pbn_space` is damage in `table`.
    pub fn mapping_at(
        &mut self,
        at: (u64, usize),
        lbn: Lbn,
        pbn_space: u64,
        table: &str,
    ) -> Result<Option<Pbn>> {
        let (b, off) = at;
        let block = self.cache.get(b)?;
        let v = u64::from_le_bytes(
            block[HEADER + off..HEADER + off + 8]
                .try_into()
                .expect("8 bytes"),
        );
        if v > pbn_space {
            return Err(Error::corrupt(
                table,
                format!("LBN {lbn} maps to PBN {} beyond the data device", v - 1),
            ));
        }
        Ok(v.checked_sub(1))
    }

    pub fn is_writable(&self) -> bool {
        self.writable
    }

    /// The sequence number of the last commit (the journal's).
    pub fn seq(&self) -> u64 {
        self.journal.seq
    }

    /// Serving from now on: the superblock says so until the clean close,
    /// so a crash is known at the next open.
    pub fn mark_open(&mut self) -> Result<()> {
        if self.writable {
            self.superblock.state = DeviceState::Open;
            self.superblock.write(self.file.as_ref())?;
        }
        Ok(())
    }

    /// Whether the store should ask for a commit: 75 % of the cache is
    /// dirty (Dmdedup §2.6.2's write-back threshold).
    pub fn wants_commit(&self) -> bool {
        self.cache.dirty_count() >= (self.cache.capacity_blocks() * 3 / 4).max(1)
    }

    /// Write `state` to the root and commit every dirty block through the
    /// journal; returns how many blocks the commit wrote.
    pub fn commit(&mut self, state: &StoreState) -> Result<usize> {
        let state = state.encode();
        if state.len() > BLOCK - HEADER - 4 {
            return Err(Error::InvalidArgument(format!(
                "the engine's record does not fit the {} root block",
                self.name
            )));
        }
        let root = self.cache.get_mut(ROOT)?;
        root[HEADER..HEADER + 4].copy_from_slice(&(state.len() as u32).to_le_bytes());
        root[HEADER + 4..HEADER + 4 + state.len()].copy_from_slice(&state);
        let blocks = self.cache.sealed_dirty();
        self.journal
            .commit(self.file.as_ref(), &self.area, &blocks, &mut self.cache.io)?;
        self.cache.mark_clean();
        Ok(blocks.len())
    }

    /// Clean shutdown: commit `state`, empty the journal, mark the
    /// superblock clean. Nothing is written when opened to inspect.
    pub fn close(&mut self, state: &StoreState) -> Result<()> {
        if !self.writable {
            return Ok(());
        }
        self.commit(state)?;
        self.journal.clear(self.file.as_ref(), &self.area)?;
        self.superblock.state = DeviceState::Clean;
        self.superblock.write(self.file.as_ref())?;
        self.writable = false;
        Ok(())
    }
}
