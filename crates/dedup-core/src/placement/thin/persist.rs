//! thin's writes: a window closed as its policy says (thin: C-blocks
//! carrying the entries and metadata blocks, no ordering, one flush;
//! ordered: data, flush, metadata, flush; ideal: data, flush), and the
//! commits of the structured area (made by the engine when `area_due`
//! says so) that empty the log, commit the C-zones' entries and release
//! the chunks freed since the last commit, punching them out of the data
//! file (`area_committed`).

use std::sync::Arc;

use super::cblock::{self, Entry};
use super::placement::{Policy, Thin, BLOCK, COMMIT_WINDOWS, LOG_BLOCKS};
use super::window;
use super::zones::Changes;
use crate::backend::MetadataBackend;
use crate::blockfile::BlockFile;
use crate::config::Pbn;
use crate::error::Result;

impl Thin {
    /// End the open window: write its blocks and entries as the policy
    /// says, and make them durable.
    ///
    /// If that fails (the host's disk full, an I/O error), nothing of the
    /// window is known to be on disk: it stays staged (reads keep finding
    /// it), its entries stay queued, the log takes back the blocks it gave
    /// it, and the error goes to the caller; the next commit (a FLUSH, the
    /// write-back's retry) writes it again, with whatever joined it since.
    /// That retry is sound even after a failed flush, which may have
    /// dropped written pages: every data block written since the last
    /// flush that succeeded is one of the window's and is written again,
    /// and so are its log blocks, at the same places, before the next
    /// flush. Blocks the failed attempt did write are unreferenced by the
    /// committed tables (allocated since), so recovery weighs any entry
    /// they carry by its chunk's fingerprint, as for any unflushed window.
    pub(super) fn close_window(&mut self) -> Result<()> {
        if self.staged.is_empty() && self.entries.is_empty() {
            return Ok(());
        }
        let staged = std::mem::take(&mut self.staged);
        let entries = std::mem::take(&mut self.entries);
        let before = (self.log_next, self.log_used, self.stats);
        match self.write_window(&staged, entries.clone()) {
            Ok(()) => {
                self.window_started = None;
                self.stats.windows += 1;
                self.stats.entries += entries.len() as u64;
                Ok(())
            }
            Err(e) => {
                self.staged = staged;
                self.entries = entries;
                (self.log_next, self.log_used, self.stats) = before;
                Err(e)
            }
        }
    }

    /// Write one window's blocks and entries as the policy says.
    fn write_window(
        &mut self,
        staged: &std::collections::BTreeMap<Pbn, super::placement::Staged>,
        mut entries: Vec<Entry>,
    ) -> Result<()> {
        let data = self.data.clone();
        if self.policy == Policy::Ideal {
            entries.clear();
        }
        // Embed entries in the window's C-blocks (thin only).
        let mut blocks: Vec<(Pbn, Vec<u8>)> = Vec::with_capacity(staged.len());
        for (&pbn, s) in staged {
            if self.zones.is_cblock(pbn) {
                let c = cblock::Compressed::from_lz4(
                    s.lz4.clone().expect("C-zone chunks compress"),
                    s.raw.len(),
                );
                let take = if self.policy == Policy::Thin {
                    c.capacity().min(entries.len())
                } else {
                    0
                };
                let carried: Vec<Entry> = entries.drain(..take).collect();
                self.stats.entries_embedded += carried.len() as u64;
                blocks.push((pbn, c.seal(&carried)));
                self.stats.c_blocks += 1;
            } else {
                blocks.push((pbn, s.raw.to_vec()));
                self.stats.u_blocks += 1;
            }
        }
        // What did not fit: metadata blocks in the log. The log must not
        // wrap over entries the structured area does not hold yet.
        let per = window::mblock_capacity(BLOCK);
        let mblocks = entries.len().div_ceil(per) as u64;
        if self.log_used + mblocks > LOG_BLOCKS {
            // The log is full: make this window's data durable, then commit
            // the structured area, which holds every change made so far
            // (this window's included), so its entries need no carrier.
            self.write_blocks(&data, &blocks)?;
            data.sync()?;
            self.stats.windows_via_commit += 1;
            self.must_commit = true;
            return Ok(());
        }
        let mut meta_blocks = Vec::new();
        for part in entries.chunks(per) {
            let at = self.layout.log + self.log_next * BLOCK as u64;
            meta_blocks.push((at, window::mblock(part, BLOCK)));
            self.log_next = (self.log_next + 1) % LOG_BLOCKS;
            self.log_used += 1;
        }
        let write_data = |blocks: &[(Pbn, Vec<u8>)]| self.write_blocks(&data, blocks);
        match self.policy {
            Policy::Thin => {
                // No ordering: everything out, then one flush of each.
                write_data(&blocks)?;
                for (at, b) in &meta_blocks {
                    self.meta_write(b, *at)?;
                }
                data.sync()?;
                if !meta_blocks.is_empty() {
                    self.meta_sync()?;
                }
            }
            Policy::Ordered => {
                write_data(&blocks)?;
                data.sync()?;
                for (at, b) in &meta_blocks {
                    self.meta_write(b, *at)?;
                }
                if !meta_blocks.is_empty() {
                    self.meta_sync()?;
                }
            }
            Policy::Ideal => {
                write_data(&blocks)?;
                data.sync()?;
            }
        }
        self.stats.meta_blocks += meta_blocks.len() as u64;
        self.windows_since_commit += 1;
        Ok(())
    }

    /// Whether the structured area is due a commit: every
    /// `COMMIT_WINDOWS` windows, when its cache fills, after a change
    /// recovery could not replay, when chunks were freed (garbage
    /// collection frees chunks to make room: they become reusable only
    /// after a commit), and at close. If so, the zone records go out first
    /// and the engine commits the store next (then `area_committed`).
    pub(super) fn area_due(
        &mut self,
        meta: &mut dyn MetadataBackend,
        closing: bool,
    ) -> Result<bool> {
        if self.policy == Policy::Ideal {
            // Metadata in memory only: freed chunks are reusable at once
            // (after a crash the engine re-verifies every chunk anyway).
            let mut changes = Changes::default();
            for pbn in std::mem::take(&mut self.quarantine) {
                self.zones.free(pbn, &mut changes);
            }
            if !(closing || meta.wants_commit()) {
                return Ok(false);
            }
        } else {
            let due = closing
                || meta.wants_commit()
                || !self.quarantine.is_empty()
                || self.must_commit
                || self.windows_since_commit >= COMMIT_WINDOWS;
            if !due {
                return Ok(false);
            }
        }
        if !self.writable {
            return Ok(false);
        }
        // A failure leaves the area due: the next commit prepares it again.
        self.prepare_area()?;
        self.area_pending = true;
        Ok(true)
    }

    /// Data blocks out; consecutive PBNs in one write.
    pub(super) fn write_blocks(
        &self,
        data: &Arc<dyn BlockFile>,
        blocks: &[(Pbn, Vec<u8>)],
    ) -> Result<()> {
        let mut i = 0;
        let mut buf = Vec::new();
        while i < blocks.len() {
            let mut j = i + 1;
            while j < blocks.len() && blocks[j].0 == blocks[j - 1].0 + 1 {
                j += 1;
            }
            buf.clear();
            for (_, b) in &blocks[i..j] {
                buf.extend_from_slice(b);
            }
            data.write_at(&buf, self.cfg.pbn_offset(blocks[i].0))?;
            i = j;
        }
        Ok(())
    }

    /// Before the structured area is committed with the newest timestamp.
    fn prepare_area(&mut self) -> Result<()> {
        // First the zones' bitmaps as they are (status unchanged): after a
        // crash from here on, recovery knows every block allocated before
        // this commit, C-blocks included, from the records.
        // Zones whose blocks this commit frees are written dirty: a crash
        // between the commit and their clean records leaves them rebuilt
        // from the counts, not holding freed blocks forever.
        let mut touched = Changes::default();
        for &pbn in &self.quarantine {
            let (z, _) = self.zones.locate(pbn);
            self.zones.touch(z, &mut touched);
        }
        let mut dirty = self.zones.dirty();
        dirty.extend(self.zones.uncommitted());
        dirty.sort_unstable();
        dirty.dedup();
        for &z in &dirty {
            self.write_zone(z, false)?;
        }
        if !dirty.is_empty() {
            self.meta_sync()?;
        }
        Ok(())
    }

    /// After the engine committed the structured area (or failed to): the
    /// C-zones' entries are committed, the log is empty, and chunks freed
    /// since the last commit become reusable.
    ///
    /// A failed commit changes nothing here: the C-zones stay uncommitted,
    /// the log keeps its entries and freed chunks stay quarantined (all
    /// safe whether or not the tables reached the disk, since entries at or
    /// before a commit's timestamp are skipped), and the next commit of
    /// the engine commits the area again. A failure writing the clean zone
    /// records after a commit leaves them dirty or uncommitted on disk,
    /// which only makes recovery rebuild or scan them.
    pub(super) fn area_committed(&mut self, committed: bool) -> Result<()> {
        if !std::mem::take(&mut self.area_pending) {
            return Ok(());
        }
        if !committed {
            self.must_commit = true;
            return Ok(());
        }
        self.finish_area()
    }

    fn finish_area(&mut self) -> Result<()> {
        self.commit_ts = self.ts;
        let mut changes = Changes::default();
        let mut freed = std::mem::take(&mut self.quarantine);
        for &pbn in &freed {
            self.zones.free(pbn, &mut changes);
        }
        // Their freeing is committed, so they go back to the host: no
        // committed mapping names them, any entries their C-blocks carry
        // are at or before this commit (skipped by recovery), and no
        // allocation can hand one out before the punch (the engine's
        // metadata mutex and our lock are held). `ideal` empties its
        // quarantine without commits and rolls back to its last save after
        // a crash, whose mappings may name them: it never gets here with
        // any, and must not punch.
        if self.policy != Policy::Ideal {
            crate::placement::punch_blocks(&self.cfg, self.data.as_ref(), &mut freed);
        }
        let mut write: Vec<usize> = self.zones.uncommitted();
        for &z in &write {
            self.zones.committed(z, self.ts);
        }
        // Written clean with their bitmaps: zones that changed, and the
        // C-zones just committed (so recovery stops scanning them).
        write.extend(self.zones.dirty());
        write.sort_unstable();
        write.dedup();
        for z in write {
            self.write_zone(z, true)?;
        }
        self.meta_sync()?;
        self.log_used = 0;
        self.windows_since_commit = 0;
        self.must_commit = false;
        self.stats.area_commits += 1;
        Ok(())
    }
}
