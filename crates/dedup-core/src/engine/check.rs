//! Consistency check (fsck): recompute every reference count from the LBN
//! map and the hash index and compare with the backend's; optionally re-hash
//! every indexed chunk. Online, it quiesces I/O for its duration (it holds
//! every LBN stripe), so it sees no write half-done.

use serde::{Deserialize, Serialize};

use super::Device;
use crate::backend::{MetadataBackend, ScanCursor};
use crate::config::DeviceConfig;
use crate::error::Result;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProblemKind {
    /// A count differs from the references found.
    RefcountMismatch,
    /// An LBN or index entry names a PBN whose count is 0 (free).
    MappedButFree,
    /// Two fingerprints name one PBN.
    IndexedTwice,
    /// A chunk with references but none from the index or LBN map.
    Leaked,
    /// The backend's usage totals disagree with what the scan found.
    UsageMismatch,
    /// A stored chunk no longer hashes to its fingerprint (`--data`).
    FingerprintMismatch,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Problem {
    pub kind: ProblemKind,
    pub detail: String,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct CheckReport {
    pub lbns_mapped: u64,
    pub pbns_used: u64,
    pub hash_index_entries: u64,
    /// Chunks held only by the hash index: garbage collection would free them.
    pub reclaimable_chunks: u64,
    /// Chunks re-hashed (with `--data`).
    pub chunks_verified: u64,
    pub problems: Vec<Problem>,
}

impl CheckReport {
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }

    fn problem(&mut self, kind: ProblemKind, detail: String) {
        // Keep reports readable on a badly damaged device.
        if self.problems.len() < 1000 {
            self.problems.push(Problem { kind, detail });
        }
    }
}

impl Device {
    /// Check metadata consistency; with `verify_data`, also re-hash chunks.
    pub fn check(&self, verify_data: bool) -> Result<CheckReport> {
        self.check_with_progress(verify_data, &|_, _| {})
    }

    /// `check`, reporting (hash index entries done, total) as it goes.
    pub fn check_with_progress(
        &self,
        verify_data: bool,
        progress: &dyn Fn(u64, u64),
    ) -> Result<CheckReport> {
        let _g = self.enter()?;
        let _gc = self.gc_lock.lock();
        let _quiet = self.lbn_locks.write_many(0..1024);
        let mut m = self.meta.lock();
        let data = |pbn, buf: &mut [u8]| self.read_pbn(pbn, buf);
        check_backend(&self.cfg, &mut **m, verify_data.then_some(&data), progress).map(|(r, _)| r)
    }

    /// Check, then rebuild what the check found wrong: unmap LBNs and drop
    /// index entries that name PBNs beyond the device, drop duplicate index
    /// entries (and, with `verify_data`, entries whose chunk no longer
    /// matches), and set every reference count (and so the free space) to
    /// the references actually found. Returns the check before the repair
    /// and what changed; the change is committed before this returns.
    pub fn repair(&self, verify_data: bool) -> Result<(CheckReport, RepairReport)> {
        let _g = self.enter()?;
        let _gc = self.gc_lock.lock();
        let _quiet = self.lbn_locks.write_many(0..1024);
        let (before, fixes) = {
            let mut m = self.meta.lock();
            let data = |pbn, buf: &mut [u8]| self.read_pbn(pbn, buf);
            check_backend(
                &self.cfg,
                &mut **m,
                verify_data.then_some(&data),
                &|_, _| {},
            )?
        };
        let mut report = RepairReport::default();
        {
            let mut m = self.meta.lock();
            for lbn in &fixes.unmap {
                m.lbn_map_delete(*lbn)?;
                report.lbns_unmapped += 1;
            }
            for fp in &fixes.drop_index {
                m.hash_index_delete(fp)?;
                report.index_entries_removed += 1;
            }
            for &(pbn, count) in &fixes.set_counts {
                m.refcount_set(pbn, count)?;
                report.refcounts_set += 1;
            }
        }
        self.commit()?;
        Ok((before, report))
    }
}

/// What `repair` changed.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RepairReport {
    pub lbns_unmapped: u64,
    pub index_entries_removed: u64,
    pub refcounts_set: u64,
}

/// The corrections a check implies.
#[derive(Default)]
struct Fixes {
    unmap: Vec<crate::config::Lbn>,
    drop_index: Vec<crate::fingerprint::Fingerprint>,
    set_counts: Vec<(u64, u32)>,
}

type ReadChunk<'a> = &'a dyn Fn(u64, &mut [u8]) -> Result<()>;

fn check_backend(
    cfg: &DeviceConfig,
    m: &mut dyn MetadataBackend,
    read_chunk: Option<ReadChunk>,
    progress: &dyn Fn(u64, u64),
) -> Result<(CheckReport, Fixes)> {
    use ProblemKind::*;
    let nr = cfg.physical_chunks as usize;
    let mut report = CheckReport::default();
    let mut fixes = Fixes::default();
    let mut lbn_refs = vec![0u32; nr];
    // Indexed at all (for reporting), and by an entry a repair keeps.
    let mut indexed = vec![false; nr];
    let mut kept = vec![false; nr];

    let mut page = Vec::new();
    let mut cursor = Some(ScanCursor::start());
    while let Some(c) = cursor.take() {
        page.clear();
        cursor = m.lbn_map_scan(&c, 4096, &mut page)?;
        for &(lbn, pbn) in &page {
            report.lbns_mapped += 1;
            match lbn_refs.get_mut(pbn as usize) {
                Some(r) => *r += 1,
                None => {
                    report.problem(
                        MappedButFree,
                        format!("LBN {lbn} maps to PBN {pbn}, beyond the data device"),
                    );
                    fixes.unmap.push(lbn);
                }
            }
        }
    }

    let mut chunk = vec![0u8; cfg.chunk_size as usize];
    let mut fps = Vec::new();
    let total_entries = m.usage().hash_entries;
    let mut cursor = Some(ScanCursor::start());
    while let Some(c) = cursor.take() {
        progress(report.hash_index_entries, total_entries);
        fps.clear();
        cursor = m.hash_index_scan(&c, 4096, &mut fps)?;
        for &(fp, pbn) in &fps {
            report.hash_index_entries += 1;
            let Some(seen) = indexed.get_mut(pbn as usize) else {
                report.problem(
                    MappedButFree,
                    format!("hash index names PBN {pbn}, beyond the data device"),
                );
                fixes.drop_index.push(fp);
                continue;
            };
            if std::mem::replace(seen, true) {
                report.problem(
                    IndexedTwice,
                    format!("PBN {pbn} is in the hash index under two fingerprints"),
                );
                fixes.drop_index.push(fp);
                continue;
            }
            if let Some(read) = read_chunk {
                read(pbn, &mut chunk)?;
                report.chunks_verified += 1;
                if cfg.hash.fingerprint(&chunk) != fp {
                    report.problem(
                        FingerprintMismatch,
                        format!(
                            "PBN {pbn} no longer hashes to its fingerprint {}",
                            fp.to_hex(cfg.hash)
                        ),
                    );
                    fixes.drop_index.push(fp);
                    continue;
                }
            }
            kept[pbn as usize] = true;
        }
    }

    for pbn in 0..nr {
        let count = m.refcount_get(pbn as u64)?;
        let expected = lbn_refs[pbn] + indexed[pbn] as u32;
        if count != 0 {
            report.pbns_used += 1;
        }
        if expected > 0 && count == 0 {
            report.problem(
                MappedButFree,
                format!("PBN {pbn} is referenced {expected} times but marked free"),
            );
        } else if expected == 0 && count > 0 {
            report.problem(
                Leaked,
                format!("PBN {pbn} has count {count} but nothing references it"),
            );
        } else if count != expected {
            report.problem(
                RefcountMismatch,
                format!("PBN {pbn} has count {count}, expected {expected}"),
            );
        }
        if indexed[pbn] && lbn_refs[pbn] == 0 && count == 1 {
            report.reclaimable_chunks += 1;
        }
        let after_repair = lbn_refs[pbn] + kept[pbn] as u32;
        if count != after_repair {
            fixes.set_counts.push((pbn as u64, after_repair));
        }
    }

    let usage = m.usage();
    if usage.lbns_mapped != report.lbns_mapped
        || usage.pbns_used != report.pbns_used
        || usage.hash_entries != report.hash_index_entries
    {
        report.problem(
            UsageMismatch,
            format!(
                "backend totals (mapped {}, used {}, indexed {}) differ from the scan ({}, {}, {})",
                usage.lbns_mapped,
                usage.pbns_used,
                usage.hash_entries,
                report.lbns_mapped,
                report.pbns_used,
                report.hash_index_entries
            ),
        );
    }
    Ok((report, fixes))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::backends::{self, BackendParams, OpenOptions};
    use crate::blockfile::sim::SimDisk;
    use crate::blockfile::{BlockFile, MemBlockFile};
    use crate::config::DeviceConfig;
    use crate::engine::Device;
    use crate::fingerprint::{Fingerprint, HashAlgo};

    use super::ProblemKind;

    fn device(backend: &str) -> (Device, Arc<MemBlockFile>) {
        let cfg = DeviceConfig {
            uuid: [8; 16],
            backend: backend.into(),
            chunk_size: 4096,
            hash: HashAlgo::Blake3,
            verify: false,
            logical_size: 64 * 4096,
            physical_chunks: 64,
        };
        let data = Arc::new(MemBlockFile::new(cfg.data_device_len(), "data"));
        let meta = Arc::new(SimDisk::new(
            backends::metadata_device_len(&cfg).unwrap(),
            "meta",
            Arc::default(),
        ));
        let aux =
            std::env::temp_dir().join(format!("dedup-repair-{}-{backend}", std::process::id()));
        let _ = std::fs::remove_dir_all(&aux);
        Device::format(
            &cfg,
            data.as_ref(),
            meta.clone(),
            &BackendParams::default(),
            Some(&aux),
        )
        .unwrap();
        let opts = OpenOptions {
            writable: true,
            aux_dir: Some(aux),
            ..Default::default()
        };
        let dev = Device::open(
            Box::new(data.clone()) as Box<dyn BlockFile>,
            Box::new(meta),
            &opts,
            None,
        )
        .unwrap();
        (dev, data)
    }

    fn chunk(n: u8) -> Vec<u8> {
        (0..4096).map(|i| (i as u8).wrapping_mul(n) ^ n).collect()
    }

    #[test]
    fn repair_rebuilds_counts_and_drops_bad_index_entries_for_every_backend() {
        for backend in backends::NAMES {
            let (dev, data) = device(backend);
            for lbn in 0..6u8 {
                dev.write(lbn as u64 * 4096, &chunk(lbn % 3 + 1), false)
                    .unwrap();
            }
            dev.write(10 * 4096, &chunk(9), false).unwrap();
            dev.write(10 * 4096, &chunk(8), false).unwrap(); // leaves chunk(9) as garbage
            let (p1, _) = dev.inspect_lbn(0).unwrap().unwrap();
            let (p2, _) = dev.inspect_lbn(1).unwrap().unwrap();
            let (p3, _) = dev.inspect_lbn(2).unwrap().unwrap();
            {
                let mut m = dev.meta.lock();
                m.refcount_inc(p1).unwrap(); // a leaked reference
                m.refcount_set(p2, 7).unwrap(); // a wrong count
                m.hash_index_insert(&Fingerprint([0xee; 32]), p3).unwrap(); // indexed twice
            }
            // A chunk whose bytes changed under its fingerprint.
            let (p4, _) = dev.inspect_lbn(10).unwrap().unwrap();
            data.write_at(&chunk(42), dev.config().pbn_offset(p4))
                .unwrap();

            let report = dev.check(true).unwrap();
            let kinds: Vec<ProblemKind> = report.problems.iter().map(|p| p.kind).collect();
            for want in [
                ProblemKind::RefcountMismatch,
                ProblemKind::IndexedTwice,
                ProblemKind::FingerprintMismatch,
            ] {
                assert!(
                    kinds.contains(&want),
                    "{backend}: {want:?} not found in {kinds:?}"
                );
            }
            let (before, fixed) = dev.repair(true).unwrap();
            assert!(!before.is_clean());
            assert!(
                fixed.refcounts_set >= 2 && fixed.index_entries_removed == 2,
                "{backend}: {fixed:?}"
            );
            let after = dev.check(true).unwrap();
            assert!(
                after.is_clean(),
                "{backend}: after repair: {:#?}",
                after.problems
            );
            let mut b = vec![0u8; 4096];
            dev.read(4096, &mut b).unwrap();
            assert_eq!(b, chunk(2), "{backend}: data survives the repair");
            // The dropped fingerprint can no longer attract duplicates of other bytes.
            dev.write(20 * 4096, &chunk(8), false).unwrap();
            dev.read(20 * 4096, &mut b).unwrap();
            assert_eq!(b, chunk(8));
            dev.close().unwrap();
        }
    }
}
