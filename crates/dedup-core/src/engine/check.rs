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
        check_backend(&self.cfg, &mut **m, verify_data.then_some(&data), progress)
    }
}

type ReadChunk<'a> = &'a dyn Fn(u64, &mut [u8]) -> Result<()>;

fn check_backend(
    cfg: &DeviceConfig,
    m: &mut dyn MetadataBackend,
    read_chunk: Option<ReadChunk>,
    progress: &dyn Fn(u64, u64),
) -> Result<CheckReport> {
    use ProblemKind::*;
    let nr = cfg.physical_chunks as usize;
    let mut report = CheckReport::default();
    let mut lbn_refs = vec![0u32; nr];
    let mut indexed = vec![false; nr];

    let mut page = Vec::new();
    let mut cursor = Some(ScanCursor::start());
    while let Some(c) = cursor.take() {
        page.clear();
        cursor = m.lbn_map_scan(&c, 4096, &mut page)?;
        for &(lbn, pbn) in &page {
            report.lbns_mapped += 1;
            match lbn_refs.get_mut(pbn as usize) {
                Some(r) => *r += 1,
                None => report.problem(
                    MappedButFree,
                    format!("LBN {lbn} maps to PBN {pbn}, beyond the data device"),
                ),
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
                continue;
            };
            if std::mem::replace(seen, true) {
                report.problem(
                    IndexedTwice,
                    format!("PBN {pbn} is in the hash index under two fingerprints"),
                );
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
                }
            }
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
    Ok(report)
}
