//! Consistency check (fsck): recompute every reference count from the LBN
//! map and the hash index and compare with the backend's; optionally re-hash
//! every indexed chunk. Online, it quiesces I/O for its duration (it holds
//! every LBN stripe), so it sees no write half-done.

mod damage;

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::{Engine, Meta};
use crate::backend::{scan_all, Held};
use crate::config::{DeviceConfig, Pbn};
use crate::error::Result;
use crate::fingerprint::Fingerprint;
use crate::record::Totals;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProblemKind {
    /// A count differs from the references found.
    RefcountMismatch,
    /// An LBN or index entry names a PBN whose count is 0 (free).
    MappedButFree,
    /// An LBN beyond the logical size, or a PBN beyond the data device.
    OutOfRange,
    /// Two fingerprints name one PBN.
    IndexedTwice,
    /// A chunk with references but none from the index or LBN map.
    Leaked,
    /// The backend's usage totals disagree with what the scan found.
    UsageMismatch,
    /// A stored chunk no longer hashes to its fingerprint (`--data`).
    FingerprintMismatch,
    /// A table block fails its checksum; it reads as empty (`LostBlock`).
    DamagedBlock,
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
    /// Logical ranges whose mappings were in a damaged block: they read
    /// as zeros.
    #[serde(default)]
    pub lost: Vec<LostRange>,
}

/// LBNs whose mappings a damaged LBN-map block held, and so are lost.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LostRange {
    /// The damaged block: its table and number.
    pub table: String,
    pub block: u64,
    /// The LBNs, first and last (inclusive).
    pub first_lbn: u64,
    pub last_lbn: u64,
    /// The same range in bytes on the device.
    pub offset: u64,
    pub length: u64,
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

impl Engine {
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
        let _quiet = self.lbn_locks.write_all();
        let mut m = self.meta.lock();
        let data = |pbn, buf: &mut [u8]| self.read_stored(pbn, buf);
        let how = How {
            verify_data,
            rehash_lost: false,
        };
        check_backend(&self.cfg, &mut m, &data, how, progress).map(|(r, _)| r)
    }

    /// Check, then rebuild what the check found wrong: unmap LBNs and drop
    /// index entries that name PBNs beyond the device; index again, by
    /// hashing them, the chunks the LBN map names whose fingerprints were in
    /// a damaged block (a damaged LBN-map block's LBNs are already unmapped,
    /// and named in the report); for a PBN indexed
    /// under several fingerprints, keep only the one its bytes hash to (none,
    /// if none does); with `verify_data`, drop entries whose chunk no longer
    /// matches; then set every reference count (and so the free space) and
    /// the totals to what the mappings say. Returns the check before the
    /// repair and what changed; the change is committed before this returns
    /// (in several transactions when it is large).
    pub fn repair(&self, verify_data: bool) -> Result<(CheckReport, RepairReport)> {
        let _g = self.enter()?;
        let _gc = self.gc_lock.lock();
        let _quiet = self.lbn_locks.write_all();
        let (before, fixes) = {
            let mut m = self.meta.lock();
            // What a repair changes is not tracked: untracked from here.
            m.changes.forget();
            let data = |pbn, buf: &mut [u8]| self.read_stored(pbn, buf);
            let how = How {
                verify_data,
                rehash_lost: true,
            };
            check_backend(&self.cfg, &mut m, &data, how, &|_, _| {})?
        };
        let mut report = RepairReport {
            lost: before.lost.clone(),
            ..Default::default()
        };
        // First make the totals those the scan counted, so the deletes
        // below bring them exactly to the repaired state and every commit
        // between slices records totals that match the tables.
        self.repair_slice(|m| {
            m.totals = Totals {
                lbns_mapped: before.lbns_mapped,
                hash_entries: before.hash_index_entries,
            };
            Ok(())
        })?;
        let p = self.placement.as_ref();
        for group in fixes.unmap.chunks(REPAIR_SLICE) {
            self.repair_slice(|m| {
                for lbn in group {
                    m.unmap(p, *lbn)?;
                }
                Ok(())
            })?;
            report.lbns_unmapped += group.len() as u64;
        }
        for group in fixes.drop_index.chunks(REPAIR_SLICE) {
            self.repair_slice(|m| {
                for (fp, pbn) in group {
                    m.unindex(fp, *pbn)?;
                }
                Ok(())
            })?;
            report.index_entries_removed += group.len() as u64;
        }
        for group in fixes.reindex.chunks(REPAIR_SLICE) {
            self.repair_slice(|m| {
                for (fp, pbn) in group {
                    m.index(fp, *pbn)?;
                }
                Ok(())
            })?;
            report.fingerprints_rebuilt += group.len() as u64;
        }
        for group in fixes.set_counts.chunks(REPAIR_SLICE) {
            self.repair_slice(|m| {
                for &(pbn, count) in group {
                    m.set_count(p, pbn, count)?;
                }
                Ok(())
            })?;
            report.refcounts_set += group.len() as u64;
        }
        {
            let mut m = self.meta.lock();
            m.totals = Totals {
                lbns_mapped: fixes.lbns_mapped,
                hash_entries: fixes.hash_entries,
            };
            m.count_awaiting_gc()?;
        }
        self.commit()?;
        Ok((before, report))
    }

    /// Apply part of a repair, then commit if the store wants to.
    fn repair_slice(&self, f: impl FnOnce(&mut Meta) -> Result<()>) -> Result<()> {
        let wants = {
            let mut m = self.meta.lock();
            f(&mut m)?;
            m.store.wants_commit() || self.placement.wants_commit()
        };
        self.commit_if_wanted(wants)
    }
}

/// Repair changes applied per metadata-mutex hold.
const REPAIR_SLICE: usize = 1024;

/// What `repair` changed.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RepairReport {
    pub lbns_unmapped: u64,
    pub index_entries_removed: u64,
    pub refcounts_set: u64,
    /// Chunks indexed again by hashing them, their fingerprints having
    /// been in a damaged block.
    #[serde(default)]
    pub fingerprints_rebuilt: u64,
    /// Logical ranges lost with a damaged LBN-map block: unmapped, they
    /// read as zeros.
    #[serde(default)]
    pub lost: Vec<LostRange>,
}

/// The corrections a check implies, and the totals after them.
#[derive(Default)]
struct Fixes {
    unmap: Vec<crate::config::Lbn>,
    drop_index: Vec<(Fingerprint, Pbn)>,
    /// Chunks to index again (their fingerprints were lost).
    reindex: Vec<(Fingerprint, Pbn)>,
    set_counts: Vec<(u64, u32)>,
    lbns_mapped: u64,
    hash_entries: u64,
}

type ReadChunk<'a> = &'a dyn Fn(u64, &mut [u8]) -> Result<()>;

/// What a check does beyond reading metadata.
#[derive(Clone, Copy)]
struct How {
    /// Re-hash every indexed chunk (`--data`).
    verify_data: bool,
    /// Hash the mapped chunks whose fingerprints were lost with a damaged
    /// block, to index them again (repair).
    rehash_lost: bool,
}

/// What a check found for one PBN.
#[derive(Clone, Copy, Default)]
struct Seen {
    /// LBNs mapped to it.
    lbn_refs: u32,
    /// Index entries naming it (saturating).
    index_count: u8,
    /// An index entry a repair keeps names it.
    kept: bool,
    /// Its reference count in the store.
    count: u32,
}

fn check_backend(
    cfg: &DeviceConfig,
    meta: &mut Meta,
    read_chunk: ReadChunk,
    how: How,
    progress: &dyn Fn(u64, u64),
) -> Result<(CheckReport, Fixes)> {
    use ProblemKind::*;
    let verify_data = how.verify_data;
    let nr = cfg.pbn_space();
    let mut report = CheckReport::default();
    let mut fixes = Fixes::default();
    let lost = meta.store.lost_blocks();
    for l in &lost {
        report.problem(DamagedBlock, damage::describe(cfg, l));
        if let Held::Mappings(lbns) = &l.held {
            report.lost.push(damage::lost_range(cfg, l, lbns));
        }
    }
    // What the scans found for each PBN they name: memory follows the
    // chunks stored, not the size of the device.
    let mut seen: HashMap<Pbn, Seen> = HashMap::new();
    let totals = meta.totals;
    let m = meta.store.as_mut();

    scan_all(
        |c, page| m.lbn_map_scan(c, 4096, page),
        |lbn, pbn| {
            report.lbns_mapped += 1;
            if lbn >= cfg.logical_chunks() {
                report.problem(
                    OutOfRange,
                    format!(
                        "LBN {lbn} is mapped but the device has {} chunks",
                        cfg.logical_chunks()
                    ),
                );
                fixes.unmap.push(lbn);
                return Ok(());
            }
            if pbn >= nr {
                report.problem(
                    OutOfRange,
                    format!("LBN {lbn} maps to PBN {pbn}, beyond the data device"),
                );
                fixes.unmap.push(lbn);
                return Ok(());
            }
            seen.entry(pbn).or_default().lbn_refs += 1;
            Ok(())
        },
    )?;

    let mut chunk = vec![0u8; cfg.chunk_size as usize];
    let total_entries = totals.hash_entries;
    let mut dropped_for_data = Vec::new();
    let mut scanned = 0u64;
    scan_all(
        |c, page| m.hash_index_scan(c, 4096, page),
        |fp, pbn| {
            report.hash_index_entries += 1;
            scanned += 1;
            if scanned % 4096 == 0 {
                progress(scanned, total_entries);
            }
            if pbn >= nr {
                report.problem(
                    OutOfRange,
                    format!("hash index names PBN {pbn}, beyond the data device"),
                );
                fixes.drop_index.push((fp, pbn));
                return Ok(());
            }
            let e = seen.entry(pbn).or_default();
            e.index_count = e.index_count.saturating_add(1);
            if e.index_count > 1 {
                return Ok(()); // resolved below, once all its entries are known
            }
            if verify_data {
                read_chunk(pbn, &mut chunk)?;
                report.chunks_verified += 1;
                if cfg.hash.fingerprint(&chunk) != fp {
                    report.problem(
                        FingerprintMismatch,
                        format!(
                            "PBN {pbn} no longer hashes to its fingerprint {}",
                            fp.to_hex(cfg.hash)
                        ),
                    );
                    dropped_for_data.push((fp, pbn));
                    return Ok(());
                }
            }
            seen.get_mut(&pbn).expect("just added").kept = true;
            Ok(())
        },
    )?;
    progress(scanned, total_entries);

    let mut pbns: Vec<Pbn> = seen.keys().copied().collect();
    pbns.sort_unstable();
    for &pbn in &pbns {
        seen.get_mut(&pbn).expect("a key").count = m.refcount_get(pbn)?;
    }
    // Counts held by nothing the scans saw: when the store's own count of
    // PBNs in use says there are some, find them (a walk of every PBN, so
    // only on a device that has them).
    let referenced_in_use = seen.values().filter(|e| e.count > 0).count() as u64;
    if m.usage().pbns_used != referenced_in_use {
        for pbn in 0..nr {
            if let std::collections::hash_map::Entry::Vacant(v) = seen.entry(pbn) {
                let count = m.refcount_get(pbn)?;
                if count > 0 {
                    v.insert(Seen {
                        count,
                        ..Default::default()
                    });
                    pbns.push(pbn);
                }
            }
        }
        pbns.sort_unstable();
    }

    // Entries a repair must not keep on trust, resolved by re-hashing the
    // chunk: a PBN indexed under several fingerprints (keep only the one its
    // bytes hash to, never the scan's first), and an indexed PBN marked free
    // (its chunk may have been reused for other bytes; keeping the entry
    // unchecked would let a later write share the wrong chunk).
    let suspect: std::collections::BTreeSet<u64> = seen
        .iter()
        .filter(|(_, e)| {
            e.index_count > 1 || (e.index_count == 1 && e.kept && e.count == 0 && !verify_data)
        })
        .map(|(&p, _)| p)
        .collect();
    if !suspect.is_empty() {
        let mut entries: std::collections::BTreeMap<u64, Vec<Fingerprint>> =
            std::collections::BTreeMap::new();
        scan_all(
            |c, page| m.hash_index_scan(c, 4096, page),
            |fp, pbn| {
                if suspect.contains(&pbn) {
                    entries.entry(pbn).or_default().push(fp);
                }
                Ok(())
            },
        )?;
        for (pbn, fps) in entries {
            if fps.len() > 1 {
                report.problem(
                    IndexedTwice,
                    format!(
                        "PBN {pbn} is in the hash index under {} fingerprints",
                        fps.len()
                    ),
                );
            }
            read_chunk(pbn, &mut chunk)?;
            report.chunks_verified += 1;
            let actual = cfg.hash.fingerprint(&chunk);
            seen.get_mut(&pbn).expect("a suspect was seen").kept = fps.contains(&actual);
            fixes
                .drop_index
                .extend(fps.into_iter().filter(|f| *f != actual).map(|f| (f, pbn)));
        }
    }
    fixes.drop_index.extend(
        dropped_for_data
            .into_iter()
            .filter(|(_, p)| !suspect.contains(p)),
    );
    if how.rehash_lost {
        fixes.reindex = damage::rehash_lost(cfg, m, &lost, &mut seen, read_chunk, &mut chunk)?;
    }

    for pbn in pbns {
        let e = seen[&pbn];
        let count = e.count;
        let indexed = e.index_count > 0;
        let expected = e.lbn_refs + indexed as u32;
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
        } else if count != expected && e.index_count <= 1 {
            report.problem(
                RefcountMismatch,
                format!("PBN {pbn} has count {count}, expected {expected}"),
            );
        }
        if indexed && e.lbn_refs == 0 && count == 1 {
            report.reclaimable_chunks += 1;
        }
        let after_repair = e.lbn_refs + e.kept as u32;
        if count != after_repair {
            fixes.set_counts.push((pbn, after_repair));
        }
        fixes.hash_entries += e.kept as u64;
    }
    fixes.lbns_mapped = report.lbns_mapped - fixes.unmap.len() as u64;

    let usage = m.usage();
    if totals.lbns_mapped != report.lbns_mapped
        || usage.pbns_used != report.pbns_used
        || totals.hash_entries != report.hash_index_entries
    {
        report.problem(
            UsageMismatch,
            format!(
                "recorded totals (mapped {}, used {}, indexed {}) differ from the scan ({}, {}, {})",
                totals.lbns_mapped,
                usage.pbns_used,
                totals.hash_entries,
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

    use crate::blockfile::{BlockFile, MemBlockFile};
    use crate::config::DeviceConfig;
    use crate::engine::Device;
    use crate::fingerprint::{Fingerprint, HashAlgo};
    use crate::options::{BackendParams, OpenOptions};

    use std::path::Path;

    use super::ProblemKind;
    use crate::superblock::Superblock;
    use crate::testrig::MemDevice;

    /// The crate's in-memory device of `backend`, kept so a test can close
    /// and reopen it.
    fn rig(backend: &str) -> MemDevice {
        let cfg = DeviceConfig {
            uuid: [8; 16],
            backend: backend.into(),
            chunk_size: 4096,
            hash: HashAlgo::Blake3,
            verify: false,
            logical_size: 64 * 4096,
            physical_chunks: 64,
            compression: crate::compress::Compression::None,
        };
        MemDevice::format(cfg, &BackendParams::default())
    }

    fn open(rig: &MemDevice, for_check: bool) -> crate::error::Result<Device> {
        rig.open_opts(OpenOptions {
            for_check,
            ..rig.options()
        })
    }

    fn device(backend: &str) -> (Device, Arc<MemBlockFile>, MemDevice) {
        let rig = rig(backend);
        let dev = open(&rig, false).unwrap();
        (dev, rig.data.clone(), rig)
    }

    fn kinds(report: &super::CheckReport) -> Vec<ProblemKind> {
        report.problems.iter().map(|p| p.kind).collect()
    }

    fn chunk(n: u8) -> Vec<u8> {
        (0..4096).map(|i| (i as u8).wrapping_mul(n) ^ n).collect()
    }

    /// A count that nothing references is found (the check visits only
    /// the PBNs the scans name, unless the store's own count of PBNs in use
    /// says there are more) and repair frees it.
    #[test]
    fn a_leaked_count_is_found_and_freed_on_every_backend() {
        for backend in crate::registry::names() {
            let (dev, _data, _rig) = device(backend);
            dev.write(0, &chunk(1), false).unwrap();
            dev.flush().unwrap();
            let (p, _) = dev.inspect_lbn(0).unwrap().unwrap();
            // An address far from the data, never handed out.
            let leak = dev.config().pbn_space() - 1;
            assert_ne!(leak, p);
            dev.engine.meta.lock().store.refcount_set(leak, 3).unwrap();
            let report = dev.check(false).unwrap();
            assert!(
                kinds(&report).contains(&ProblemKind::Leaked),
                "{backend}: {:?}",
                report.problems
            );
            dev.repair(false).unwrap();
            let after = dev.check(false).unwrap();
            assert!(after.is_clean(), "{backend}: {:?}", after.problems);
            assert_eq!(dev.engine.meta.lock().store.refcount_get(leak).unwrap(), 0);
        }
    }

    #[test]
    fn repair_rebuilds_counts_and_drops_bad_index_entries_for_every_backend() {
        for backend in crate::registry::names() {
            let (dev, data, _rig) = device(backend);
            for lbn in 0..6u8 {
                dev.write(lbn as u64 * 4096, &chunk(lbn % 3 + 1), false)
                    .unwrap();
            }
            dev.write(10 * 4096, &chunk(9), false).unwrap();
            dev.write(10 * 4096, &chunk(8), false).unwrap(); // leaves chunk(9) as garbage
            let (p1, _) = dev.inspect_lbn(0).unwrap().unwrap();
            let (p2, _) = dev.inspect_lbn(1).unwrap().unwrap();
            let (p3, _) = dev.inspect_lbn(2).unwrap().unwrap();
            // Indexed twice; a store whose index is keyed by PBN (sparse)
            // cannot hold that, and refuses it.
            let twice = {
                let mut m = dev.engine.meta.lock();
                m.store.refcount_inc(p1).unwrap(); // a leaked reference
                m.store.refcount_set(p2, 7).unwrap(); // a wrong count
                m.store
                    .hash_index_insert(&Fingerprint([0xee; 32]), p3)
                    .is_ok()
            };
            // A chunk whose bytes changed under its fingerprint (written
            // out first: thin holds new chunks in its window).
            dev.flush().unwrap();
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
                    kinds.contains(&want) || want == ProblemKind::IndexedTwice && !twice,
                    "{backend}: {want:?} not found in {kinds:?}"
                );
            }
            let (before, fixed) = dev.repair(true).unwrap();
            assert!(!before.is_clean());
            assert!(
                fixed.refcounts_set >= 2 && fixed.index_entries_removed == 1 + twice as u64,
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

    #[test]
    fn repair_drops_an_index_entry_on_a_free_chunk_unless_its_bytes_still_match() {
        for backend in crate::registry::names() {
            let (dev, data, _rig) = device(backend);
            dev.write(0, &chunk(1), false).unwrap();
            dev.write(4096, &chunk(2), false).unwrap();
            let (reused, _) = dev.inspect_lbn(0).unwrap().unwrap();
            let (intact, _) = dev.inspect_lbn(1).unwrap().unwrap();
            // Both chunks are now held only by the hash index (count 1).
            dev.write(0, &chunk(3), false).unwrap();
            dev.write(4096, &chunk(4), false).unwrap();
            {
                let mut m = dev.engine.meta.lock();
                // Counts lost: both chunks look free while still indexed.
                m.store.refcount_set(reused, 0).unwrap();
                m.store.refcount_set(intact, 0).unwrap();
            }
            // One of them was reused for other bytes meanwhile.
            dev.flush().unwrap();
            data.write_at(&chunk(42), dev.config().pbn_offset(reused))
                .unwrap();

            let report = dev.check(false).unwrap();
            assert!(
                kinds(&report).contains(&ProblemKind::MappedButFree),
                "{backend}: {:#?}",
                report.problems
            );
            // Without --data, repair still re-hashes exactly these chunks.
            let (_, fixed) = dev.repair(false).unwrap();
            assert_eq!(fixed.index_entries_removed, 1, "{backend}: {fixed:?}");
            let after = dev.check(true).unwrap();
            assert!(after.is_clean(), "{backend}: {:#?}", after.problems);
            assert_eq!(
                dev.engine.meta.lock().store.refcount_get(intact).unwrap(),
                1
            );

            // The stale fingerprint no longer attracts its old content...
            let mut b = vec![0u8; 4096];
            dev.write(5 * 4096, &chunk(1), false).unwrap();
            dev.read(5 * 4096, &mut b).unwrap();
            assert_eq!(b, chunk(1), "{backend}: stale entry shared a reused chunk");
            // ...while the one whose bytes match still deduplicates.
            dev.write(6 * 4096, &chunk(2), false).unwrap();
            assert_eq!(dev.inspect_lbn(6).unwrap().unwrap().0, intact);
            dev.read(6 * 4096, &mut b).unwrap();
            assert_eq!(b, chunk(2));
            // New chunks never land on the block whose count repair gave
            // back (thin's zones had seen it freed).
            for lbn in 20..60u8 {
                dev.write(lbn as u64 * 4096, &chunk(100 + lbn), false)
                    .unwrap();
            }
            dev.flush().unwrap();
            dev.read(6 * 4096, &mut b).unwrap();
            assert_eq!(b, chunk(2), "{backend}: a restored chunk was overwritten");
            dev.close().unwrap();
        }
    }

    #[test]
    fn repair_restores_wrong_totals_recorded_with_the_tables() {
        for backend in crate::registry::names() {
            let rig = rig(backend);
            let dev = open(&rig, false).unwrap();
            for lbn in 0..5u8 {
                dev.write(lbn as u64 * 4096, &chunk(lbn + 1), false)
                    .unwrap();
            }
            {
                // The engine's totals drift from its tables.
                let mut m = dev.engine.meta.lock();
                m.totals.lbns_mapped += 7;
                m.totals.hash_entries += 3;
            }
            let report = dev.check(false).unwrap();
            assert!(
                kinds(&report).contains(&ProblemKind::UsageMismatch),
                "{backend}: {:#?}",
                report.problems
            );
            dev.close().unwrap();
            drop(dev);

            // The wrong totals were committed with the tables: a reopen
            // still sees them, and a repair sets them right.
            let dev = open(&rig, true).unwrap();
            let report = dev.check(false).unwrap();
            assert!(
                kinds(&report).contains(&ProblemKind::UsageMismatch),
                "{backend} after reopening: {:#?}",
                report.problems
            );
            dev.repair(false).unwrap();
            assert!(dev.check(true).unwrap().is_clean(), "{backend}");
            dev.close().unwrap();
            drop(dev);

            let dev = open(&rig, false).unwrap();
            let after = dev.check(true).unwrap();
            assert!(after.is_clean(), "{backend}: {:#?}", after.problems);
            assert_eq!(after.lbns_mapped, 5);
            let mut b = vec![0u8; 4096];
            dev.read(3 * 4096, &mut b).unwrap();
            assert_eq!(b, chunk(4));
            dev.close().unwrap();
        }
    }

    #[test]
    fn repair_unmaps_entries_out_of_range() {
        for backend in crate::registry::names() {
            let (dev, _data, _rig) = device(backend);
            dev.write(0, &chunk(1), false).unwrap();
            dev.write(4096, &chunk(2), false).unwrap();
            // An LBN naming a PBN beyond the data device (INRAM refuses to
            // hold one at all).
            if dev
                .engine
                .meta
                .lock()
                .store
                .lbn_map_insert(1, 1_000_000)
                .is_err()
            {
                assert!(
                    matches!(
                        backend,
                        "inram" | "disktable" | "sparse" | "thin" | "ordered" | "ideal"
                    ),
                    "{backend}"
                );
                continue;
            }
            let report = dev.check(false).unwrap();
            assert!(
                kinds(&report).contains(&ProblemKind::OutOfRange),
                "{backend}: {:#?}",
                report.problems
            );
            dev.repair(false).unwrap();
            let after = dev.check(true).unwrap();
            assert!(after.is_clean(), "{backend}: {:#?}", after.problems);
            let mut b = vec![0u8; 4096];
            dev.read(4096, &mut b).unwrap();
            assert_eq!(b, vec![0u8; 4096], "{backend}: the bad LBN reads as a hole");
            dev.read(0, &mut b).unwrap();
            assert_eq!(b, chunk(1));
            dev.close().unwrap();
        }
    }

    #[test]
    fn repair_unmaps_lbns_beyond_a_shrunken_device() {
        // Key-value backends store LBNs as keys, so a damaged superblock
        // size can leave keys beyond the device; the tables of inram and
        // disktable are sized by the superblock and cannot hold one.
        for backend in ["cowbtree", "lsm"] {
            let rig = rig(backend);
            let dev = open(&rig, false).unwrap();
            dev.write(0, &chunk(1), false).unwrap();
            dev.write(60 * 4096, &chunk(2), false).unwrap();
            dev.close().unwrap();
            drop(dev);
            let mut sb = Superblock::read(rig.meta.as_ref(), Path::new("meta")).unwrap();
            sb.config.logical_size = 32 * 4096;
            sb.write(rig.meta.as_ref()).unwrap();

            let dev = open(&rig, true).unwrap();
            let report = dev.check(false).unwrap();
            assert!(
                kinds(&report).contains(&ProblemKind::OutOfRange),
                "{backend}: {:#?}",
                report.problems
            );
            let (_, fixed) = dev.repair(false).unwrap();
            assert_eq!(fixed.lbns_unmapped, 1, "{backend}: {fixed:?}");
            let after = dev.check(true).unwrap();
            assert!(after.is_clean(), "{backend}: {:#?}", after.problems);
            assert_eq!(after.lbns_mapped, 1);
            dev.close().unwrap();
        }
    }
}
