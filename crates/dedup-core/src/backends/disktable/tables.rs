//! A journaled table file: 4 KiB checksummed table blocks behind the
//! buffer cache (`cache.rs`), made crash-safe by the redo journal
//! (`journal.rs`), with the store's state record in the root block (table
//! block 0). disktable and sparse lay their tables out differently (their
//! `Area`) and share this: opening (replay, read the root), commits and the
//! clean close.
//!
//! **Room for a save on a full host filesystem.** A writable store on a
//! regular file allocates, at open and as its tables grow, the journal
//! blocks a commit of as many blocks as its tables hold (plus
//! `RESERVE_SLACK`, 1 MiB) uses, at most what a commit of the whole buffer
//! cache uses (`reserve_blocks`: 1 header block, 1 descriptor block per
//! 511 blocks, one block per block: 64 MiB + 132 KiB at the default
//! `--cache 64M`). So the reserve follows the data as the rest of the
//! metadata does: a device holding little costs little. The journal is
//! written at the same offsets every commit, so once allocated it never
//! needs free space, and a commit of up to that many dirty blocks can
//! always be journaled. What a full filesystem can still refuse are table
//! blocks written for the first time (a sparse file's holes) and sparse's
//! index checkpoint: for those, a close or a commit that frees space
//! (a TRIM while writes stall, a collection) calls `release_reserve`,
//! which punches the journal blocks the next commit does not need,
//! giving them back to the filesystem, and retries. The next open
//! allocates them again where there is room.
//!
//! The root also counts the commits (its last 8 bytes, `COMMIT_AT`): the
//! number the data device records after each one (`generation.rs`), so a
//! copy of the metadata taken while serving, put back after a crash, is
//! refused at open instead of serving another time's data.

use std::sync::Arc;

use super::cache::Cache;
use super::geometry::{Area, BLOCK, COMMIT_AT, HEADER, ROOT};
use super::home_sync::HomeSync;
use super::journal::{journal_len, Journal, LIST_BLOCKS};
use crate::backends::kv::store::StoreState;
use crate::blockfile::latch::Latched;
use crate::blockfile::written::Listed;
use crate::blockfile::BlockFile;
use crate::config::{Lbn, Pbn};
use crate::error::{Error, Result};
use crate::generation;
use crate::options::OpenOptions;
use crate::superblock::{DeviceState, Superblock};

/// The longest state record the root holds, before the commit number.
const MAX_STATE: usize = COMMIT_AT - HEADER - 4;
/// Blocks the journal reserve holds beyond the tables' own (1 MiB).
const RESERVE_SLACK: u64 = 256;

pub struct Journaled {
    pub cache: Cache,
    journal: Journal,
    area: Area,
    pub file: Arc<dyn BlockFile>,
    superblock: Superblock,
    writable: bool,
    /// "disktable", "sparse": for log lines and errors.
    name: &'static str,
    /// The metadata was older than the data's record and is kept as
    /// asked (`accept_stale`): the engine verifies every chunk before the
    /// device serves (a roll-back).
    pub kept_stale: bool,
    /// The journal blocks allocated at open (`reserve_blocks`), until a
    /// full host filesystem makes `release_reserve` give most back.
    reserved: u64,
    /// `release_reserve` gave some back: not topped up again until the
    /// next open (the filesystem is full).
    gave_back: bool,
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
        opts: &OpenOptions,
        name: &'static str,
    ) -> Result<(Journaled, StoreState)> {
        let (writable, salvage) = (opts.writable, opts.for_check);
        // Every write of the store from here on, tables, journal,
        // superblock and checkpoint alike, stops after a failed sync.
        let file: Arc<dyn BlockFile> = Arc::new(Latched::new(file));
        let mut cache = Cache::new(file.clone(), area, cache_bytes);
        let (mut journal, recovered) = Journal::recover(
            file.as_ref(),
            &area,
            superblock.data_check.as_ref(),
            &mut cache.io,
        )?;
        if writable {
            journal.homes = Some(HomeSync::new(file.clone())?);
        }
        if recovered.replayed > 0 {
            tracing::info!(
                "{name}: replayed {} journaled blocks after an unclean stop",
                recovered.replayed
            );
        }
        if recovered.dropped_for_data > 0 {
            tracing::warn!(
                "{name}: the last transaction's data ({} blocks) did not all reach the disk before the unclean stop; its FLUSH never returned, so the device goes back to the commit before it",
                recovered.dropped_for_data
            );
        }
        let root = cache.get(ROOT)?;
        let (state, commit) = if root.iter().all(|&b| b == 0) {
            (StoreState::default(), 0)
        } else {
            let what = format!("{name} root block");
            let len = u32::from_le_bytes(root[HEADER..HEADER + 4].try_into().expect("4 bytes"));
            let len = len as usize;
            if len > MAX_STATE {
                return Err(Error::corrupt(what, "state record too long"));
            }
            let commit = u64::from_le_bytes(root[COMMIT_AT..].try_into().expect("8 bytes"));
            (
                StoreState::decode(&root[HEADER + 4..HEADER + 4 + len], &what)?,
                commit,
            )
        };
        // A torn journal header reads as sequence 0: count on from the
        // root's, so the numbers the data records never go backwards.
        journal.seq = journal.seq.max(commit);
        let kept_stale = match generation::check_commit(
            superblock.generation,
            commit,
            superblock.recorded,
            std::path::Path::new(&file.describe()),
            &superblock.recorded_from,
        ) {
            Ok(()) => false,
            Err(e) => {
                match &superblock.witness {
                    Some(w) if opts.accept_stale && writable => {
                        tracing::warn!("{e}; keeping the older metadata as asked: verifying every stored chunk");
                        w.hold()?;
                        true
                    }
                    _ => return Err(e),
                }
            }
        };
        if let Some(w) = &superblock.witness {
            w.set_commit(journal.seq);
        }
        if salvage {
            cache.salvage();
        }
        let mut t = Journaled {
            cache,
            journal,
            area,
            file,
            superblock,
            writable,
            name,
            kept_stale,
            reserved: 0,
            gave_back: false,
        };
        if writable && !salvage {
            t.make_reserve()?;
        }
        Ok((t, state))
    }

    /// Journal blocks to hold in reserve: a commit of as many blocks as
    /// the tables hold now (the file's allocation less the reserve), plus
    /// `RESERVE_SLACK`, at most the whole cache and the journal.
    pub fn reserve_blocks(&self) -> Result<u64> {
        let in_use =
            (self.file.allocated()?.unwrap_or(0) / BLOCK as u64).saturating_sub(self.reserved);
        let blocks = (self.cache.capacity_blocks() as u64).min(in_use + RESERVE_SLACK);
        // And room for a list of data blocks (`journal.rs`).
        Ok((journal_len(blocks) + LIST_BLOCKS).min(self.area.journal_blocks))
    }

    /// Allocate the journal blocks a commit of the whole cache needs (a
    /// regular file only: a block device's blocks are all there). A full
    /// filesystem is told, not refused: the device serves, with less room
    /// for a stop while it stays full.
    fn make_reserve(&mut self) -> Result<()> {
        if self.file.capacity()?.is_some() {
            return Ok(());
        }
        let blocks = self.reserve_blocks()?;
        if blocks <= self.reserved || self.gave_back {
            return Ok(());
        }
        match self
            .file
            .preallocate(self.area.journal_start, blocks * BLOCK as u64)
        {
            Ok(()) => self.reserved = blocks,
            Err(e) if e.errno() == libc::ENOSPC => {
                // Told once: tried again at the next open.
                self.gave_back = true;
                tracing::warn!(
                "{}: no room to reserve {} KiB for the metadata journal ({e}); a stop while the host filesystem stays full may fail to save",
                self.name,
                blocks * BLOCK as u64 / 1024
                )
            }
            Err(e) => return Err(e),
        }
        Ok(())
    }

    /// The host filesystem is full while the metadata must be saved (a
    /// close, a commit that frees space): give back the reserved journal
    /// blocks the next commit does not need (its dirty blocks and the
    /// root), so the table blocks and checkpoint it writes find room.
    /// Returns the bytes given back (0: nothing left to give).
    pub fn release_reserve(&mut self) -> Result<u64> {
        // The last journal may hold a list of data blocks after its
        // images, and its homes may be half-written (a commit that failed
        // for space): it stays whole.
        let keep = journal_len(self.cache.dirty_count() as u64 + 1) + LIST_BLOCKS;
        if self.reserved <= keep {
            return Ok(0);
        }
        let (from, blocks) = (keep, self.reserved - keep);
        // The last commit's journal may reach past `keep`: its homes
        // must be durable before its blocks are given back.
        self.journal.settle()?;
        self.file.punch(
            self.area.journal_start + from * BLOCK as u64,
            blocks * BLOCK as u64,
        )?;
        self.reserved = keep;
        self.gave_back = true;
        let bytes = blocks * BLOCK as u64;
        tracing::warn!(
            "{}: the host filesystem is full: gave back {} KiB of the metadata journal's reserve to save the metadata (reserved again at the next start)",
            self.name,
            bytes / 1024
        );
        Ok(bytes)
    }

    /// Check the checksum of every table block in `blocks` that was ever
    /// written (a sparse file's holes are never-written blocks, valid by
    /// definition), reading them in long runs past the cache. The first
    /// damaged one is refused as the cache would refuse it, but at open,
    /// before any write is acknowledged: found later, by a queued write
    /// that needs it, the write could only fail after its acknowledgement.
    pub fn verify_blocks(&self, blocks: std::ops::Range<u64>) -> Result<()> {
        const RUN: u64 = 256;
        let start = self.area.table_start;
        let runs = (self.written_runs(blocks.clone())?).unwrap_or_else(|| vec![blocks]);
        let mut buf = vec![0u8; RUN as usize * BLOCK];
        for std::ops::Range { start: mut b, end } in runs {
            while b < end {
                let n = RUN.min(end - b);
                let run = &mut buf[..n as usize * BLOCK];
                self.file.read_at(run, start + b * BLOCK as u64)?;
                for (i, block) in run.chunks(BLOCK).enumerate() {
                    let block_no = b + i as u64;
                    if !super::geometry::block_ok(block_no, block) {
                        return Err(self.area.damaged(block_no));
                    }
                }
                b += n;
            }
        }
        Ok(())
    }

    /// The table blocks of `blocks` that the file says were ever written
    /// (a sparse file's holes were not), as sorted runs of whole blocks
    /// that never share a block (two extents may lie in one 4 KiB block on
    /// a filesystem of smaller blocks); `None` where the file cannot tell
    /// (a block device).
    pub fn written_runs(
        &self,
        blocks: std::ops::Range<u64>,
    ) -> Result<Option<Vec<std::ops::Range<u64>>>> {
        let start = self.area.table_start;
        let bytes = start + blocks.start * BLOCK as u64..start + blocks.end * BLOCK as u64;
        let Some(ranges) = self.file.data_ranges(bytes)? else {
            return Ok(None);
        };
        let mut runs: Vec<std::ops::Range<u64>> = Vec::new();
        for r in ranges {
            let done = runs.last().map_or(blocks.start, |last| last.end);
            let first = (r.start.saturating_sub(start) / BLOCK as u64).max(done);
            let end = (r.end.saturating_sub(start).div_ceil(BLOCK as u64)).min(blocks.end);
            if first < end {
                runs.push(first..end);
            }
        }
        Ok(Some(runs))
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
        self.commit_beside_data(state, None, &mut || Ok(()))
    }

    /// `commit`, with the data device's sync (`data_durable`) run beside
    /// the journal's when the data blocks the transaction wrote are
    /// `listed` (`journal.rs`), before the journal otherwise.
    pub fn commit_beside_data(
        &mut self,
        state: &StoreState,
        listed: Option<&[Listed]>,
        data_durable: &mut dyn FnMut() -> Result<()>,
    ) -> Result<usize> {
        let state = state.encode();
        if state.len() > MAX_STATE {
            return Err(Error::InvalidArgument(format!(
                "the engine's record does not fit the {} root block",
                self.name
            )));
        }
        let commit = self.journal.seq + 1;
        let root = self.cache.get_mut(ROOT)?;
        root[HEADER..HEADER + 4].copy_from_slice(&(state.len() as u32).to_le_bytes());
        root[HEADER + 4..HEADER + 4 + state.len()].copy_from_slice(&state);
        root[COMMIT_AT..].copy_from_slice(&commit.to_le_bytes());
        let blocks = self.cache.sealed_dirty();
        // With the journal's reserve given back (a full host filesystem),
        // no list: it would land in blocks a full filesystem cannot give.
        let listed = listed.filter(|_| !self.gave_back);
        self.journal.commit(
            &self.file,
            &self.area,
            &blocks,
            listed,
            data_durable,
            &mut self.cache.io,
        )?;
        debug_assert_eq!(
            self.journal.seq, commit,
            "the journal numbers commits one by one"
        );
        self.cache.mark_clean();
        // Durable on the metadata device: the data may now record it.
        if let Some(w) = &self.superblock.witness {
            w.record_commit(commit);
        }
        // The tables grew: so does the room a save needs.
        if self.writable {
            self.make_reserve()?;
        }
        Ok(blocks.len())
    }

    /// Clean shutdown: commit `state`, empty the journal, mark the
    /// superblock clean. Nothing is written when opened to inspect.
    pub fn close(&mut self, state: &StoreState) -> Result<()> {
        if !self.writable {
            return Ok(());
        }
        match self.commit(state) {
            Err(e) if e.errno() == libc::ENOSPC && self.release_reserve()? > 0 => {
                self.commit(state)?;
            }
            r => {
                r?;
            }
        }
        self.journal.clear(self.file.as_ref(), &self.area)?;
        self.superblock.state = DeviceState::Clean;
        self.superblock.write(self.file.as_ref())?;
        self.writable = false;
        Ok(())
    }
}
