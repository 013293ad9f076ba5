//! Roll-back recovery for backends that are not crash-safe (INRAM): after an
//! unclean stop, and only when the user accepts it, the backend reloads its
//! last save. Chunks may have been freed and rewritten since, so every stored
//! chunk is re-hashed; any whose bytes no longer match its fingerprint is
//! dropped, and LBNs mapped to it read as zeros. No stale mapping ever serves
//! another chunk's bytes.

use serde::Serialize;

use super::Engine;
use crate::backend::ScanCursor;
use crate::error::Result;

#[derive(Clone, Debug, Default, Serialize)]
pub struct RecoveryReport {
    pub chunks_verified: u64,
    pub chunks_dropped: u64,
    pub lbns_unmapped: u64,
}

impl Engine {
    pub(super) fn recover_rolled_back(&mut self) -> Result<RecoveryReport> {
        let cfg = self.cfg.clone();
        let m = self.meta.get_mut();
        // Where chunks are, for a backend that places data (nothing is
        // staged right after open).
        let compressed: Option<Vec<bool>> = m
            .traits()
            .places_data
            .then(|| super::read_path::cblock_map(&mut **m, cfg.physical_chunks))
            .filter(|_| !cfg.packs());
        let mut report = RecoveryReport::default();
        let mut indexed = vec![false; cfg.pbn_space() as usize];
        let mut bad = vec![false; cfg.pbn_space() as usize];
        let mut bad_fps = Vec::new();
        let mut page = Vec::new();
        let mut chunk = vec![0u8; cfg.chunk_size as usize];
        let mut cursor = Some(ScanCursor::start());
        while let Some(c) = cursor.take() {
            page.clear();
            cursor = m.hash_index_scan(&c, 4096, &mut page)?;
            for &(fp, pbn) in &page {
                indexed[pbn as usize] = true;
                // Undecodable: zeros, which cannot match its fingerprint.
                super::read_path::read_stored(
                    &cfg,
                    self.data.as_ref(),
                    compressed.as_ref(),
                    pbn,
                    &mut chunk,
                )?;
                report.chunks_verified += 1;
                if cfg.hash.fingerprint(&chunk) != fp {
                    bad[pbn as usize] = true;
                    bad_fps.push((fp, pbn));
                }
            }
        }
        // LBNs naming a changed chunk, or an unindexed one (verify-mode
        // collisions, which have no fingerprint to check), are unmapped.
        let mut unmap = Vec::new();
        let mut lbn_page = Vec::new();
        let mut cursor = Some(ScanCursor::start());
        while let Some(c) = cursor.take() {
            lbn_page.clear();
            cursor = m.lbn_map_scan(&c, 4096, &mut lbn_page)?;
            unmap.extend(
                lbn_page
                    .iter()
                    .filter(|(_, pbn)| bad[*pbn as usize] || !indexed[*pbn as usize])
                    .copied(),
            );
        }
        for (lbn, pbn) in unmap {
            m.lbn_map_delete(lbn)?;
            m.refcount_dec(pbn)?;
            report.lbns_unmapped += 1;
        }
        for (fp, pbn) in bad_fps {
            m.hash_index_delete(&fp)?;
            m.refcount_dec(pbn)?;
            report.chunks_dropped += 1;
        }
        Ok(report)
    }
}
