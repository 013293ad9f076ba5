//! thin's recovery after a crash: the entries of uncommitted C-zones and
//! of the log replayed on the structured area (see `replay` for why that
//! keeps the crash contract), each block's kind read back, the bitmaps of
//! dirty zones rebuilt; the engine commits the result before serving.

use std::collections::BTreeMap;
use std::time::Instant;

use super::placement::{zone_blocks, Thin, BLOCK, LOG_BLOCKS};
use super::replay::{self, UNMAPPED};
use super::{cblock, window};
use crate::backend::MetadataBackend;
use crate::config::Pbn;
use crate::error::Result;

impl Thin {
    /// The bytes of the chunk stored at `pbn` whose fingerprint starts
    /// with `fp`, and whether it is a C-block; `None` if neither reading of
    /// the block (as a C-block, as a plain chunk) matches. Recovery cannot
    /// always know from the zone record which one a block allocated since
    /// the last commit is, so it lets the fingerprint decide: a block
    /// cannot match both.
    /// A read error is an error, not "never written": recovery commits
    /// what it finds, so it must not drop flushed entries over a
    /// transient failure.
    pub(super) fn read_stored(&self, pbn: Pbn, fp: &[u8; 16]) -> Result<Option<(Vec<u8>, bool)>> {
        let data = &self.data;
        let mut b = vec![0u8; self.cfg.chunk_size as usize];
        data.read_at(&mut b, self.cfg.pbn_offset(pbn))?;
        let hash = self.cfg.hash;
        let matches = |c: &[u8]| hash.fingerprint(c).0[..16] == fp[..];
        if let Ok((chunk, _)) = cblock::open(&b) {
            if chunk.len() == b.len() && matches(&chunk) {
                return Ok(Some((chunk, true)));
            }
        }
        Ok(matches(&b).then_some((b, false)))
    }

    /// After a crash: the entries of uncommitted C-zones and of the log,
    /// replayed on the structured area; then bitmaps of dirty zones
    /// rebuilt, and the area marked due for a commit (the engine's first).
    /// Returns how replay changed the count of mapped LBNs and of index
    /// entries.
    pub(super) fn recover(&mut self, store: &mut dyn MetadataBackend) -> Result<(i64, i64)> {
        let started = Instant::now();
        let data = self.data.clone();
        let commit_ts = self.commit_ts;
        let mut entries = Vec::new();
        let mut b = vec![0u8; self.cfg.chunk_size as usize];
        for z in self.zones.uncommitted() {
            let zb = zone_blocks(&self.cfg) as u64;
            let first = z as u64 * zb;
            let last = (first + zb).min(self.cfg.physical_chunks);
            for pbn in first..last {
                // Plain blocks in use hold user data, never entries: not
                // read, so data shaped like a C-block cannot pose as one.
                if self.zones.is_used(pbn) && !self.zones.is_cblock(pbn) {
                    continue;
                }
                data.read_at(&mut b, self.cfg.pbn_offset(pbn))?;
                if let Ok((_, es)) = cblock::open(&b) {
                    entries.extend(es);
                }
            }
        }
        let mut b = vec![0u8; BLOCK];
        for i in 0..LOG_BLOCKS {
            self.meta
                .read_at(&mut b, self.layout.log + i * BLOCK as u64)?;
            if let Ok(es) = window::open_mblock(&b) {
                entries.extend(es);
            }
        }
        let hash = self.cfg.hash;
        // Entries naming PBNs or LBNs beyond the device are damage: never
        // applied.
        entries.retain(|e| e.pbn == UNMAPPED || e.pbn < self.cfg.physical_chunks);
        entries.retain(|e| e.lbn < self.cfg.logical_chunks());
        // Each entry's chunk, read once (every entry naming a PBN since the
        // commit names the same content: see `replay`).
        let mut reads: BTreeMap<Pbn, Option<(Vec<u8>, bool)>> = BTreeMap::new();
        for e in entries
            .iter()
            .filter(|e| e.timestamp > commit_ts && e.pbn != UNMAPPED)
        {
            if let std::collections::btree_map::Entry::Vacant(v) = reads.entry(e.pbn) {
                v.insert(self.read_stored(e.pbn, &e.fp)?);
            }
        }
        let report = replay::replay(store, entries, commit_ts, hash, &mut |p| {
            reads.get(&p).cloned().flatten().map(|(c, _)| c)
        })?;
        // Only applied (verified) entries move the clock: a damaged or
        // stray block cannot push it anywhere.
        self.ts = self.ts.max(report.newest_applied).max(commit_ts);
        // Dirty zones, and those whose counts replay changed: the bitmaps
        // are what the counts say now, C-blocks as the records or the
        // reads above found them.
        let found: BTreeMap<Pbn, bool> = reads
            .iter()
            .filter_map(|(&p, r)| r.as_ref().map(|(_, c)| (p, *c)))
            .collect();
        let mut zones = self.zones.dirty();
        zones.extend(report.touched.iter().map(|&p| self.zones.locate(p).0));
        zones.sort_unstable();
        zones.dedup();
        self.rebuild_bitmaps(store, zones, &found)?;
        self.must_commit = true;
        let deltas = (report.mapped_delta, report.indexed_delta);
        self.recovery = Some((report, started.elapsed()));
        tracing::info!(
            "thin: recovered in {:.3} s: {:?}",
            started.elapsed().as_secs_f64(),
            self.recovery.as_ref().map(|r| &r.0)
        );
        Ok(deltas)
    }

    /// Set these zones' bitmaps to the PBNs whose count is not zero.
    /// `found`: blocks whose kind recovery read (C-block or not); the rest
    /// keep what their zone record says.
    pub(super) fn rebuild_bitmaps(
        &mut self,
        store: &mut dyn MetadataBackend,
        zones: impl IntoIterator<Item = usize>,
        found: &BTreeMap<Pbn, bool>,
    ) -> Result<()> {
        for z in zones {
            let zb = zone_blocks(&self.cfg) as u64;
            let first = z as u64 * zb;
            let last = (first + zb).min(self.cfg.physical_chunks);
            let mut used = Vec::new();
            for pbn in first..last {
                if store.refcount_get(pbn)? > 0 {
                    let c = found
                        .get(&pbn)
                        .copied()
                        .unwrap_or_else(|| self.zones.is_cblock(pbn));
                    used.push(((pbn - first) as usize, c));
                }
            }
            self.zones.rebuild(z, used.into_iter());
        }
        Ok(())
    }
}
