//! Roll-back recovery for stores that are not crash-safe (INRAM): after an
//! unclean stop, and only when the user accepts it, the store reloads its
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
    pub(super) fn recover_rolled_back(&self) -> Result<RecoveryReport> {
        let cfg = self.cfg.clone();
        let p = self.placement.as_ref();
        let mut m = self.meta.lock();
        let mut report = RecoveryReport::default();
        let mut indexed = vec![false; cfg.pbn_space() as usize];
        let mut bad = vec![false; cfg.pbn_space() as usize];
        let mut bad_fps = Vec::new();
        let mut page = Vec::new();
        let mut chunk = vec![0u8; cfg.chunk_size as usize];
        let mut cursor = Some(ScanCursor::start());
        while let Some(c) = cursor.take() {
            page.clear();
            cursor = m.store.hash_index_scan(&c, 4096, &mut page)?;
            for &(fp, pbn) in &page {
                indexed[pbn as usize] = true;
                // Undecodable: zeros, which cannot match its fingerprint.
                self.read_stored(pbn, &mut chunk)?;
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
            cursor = m.store.lbn_map_scan(&c, 4096, &mut lbn_page)?;
            unmap.extend(
                lbn_page
                    .iter()
                    .filter(|(_, pbn)| bad[*pbn as usize] || !indexed[*pbn as usize])
                    .copied(),
            );
        }
        for (lbn, pbn) in unmap {
            m.unmap(p, lbn)?;
            m.release(p, pbn)?;
            report.lbns_unmapped += 1;
        }
        for (fp, pbn) in bad_fps {
            m.unindex(&fp, pbn)?;
            m.release(p, pbn)?;
            report.chunks_dropped += 1;
        }
        Ok(report)
    }
}
