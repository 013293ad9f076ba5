//! Compaction: a container whose live share (raw bytes of the entries
//! some group's marks reference, over the raw bytes of all its present
//! entries; stored bytes belong to frames, which segments share) falls
//! below a threshold is rewritten with only its live segments. Recipes name (container id, entry index), so the new version
//! keeps the id and every entry number: a dead entry stays in the catalog
//! as *absent* (fingerprint and raw length, no stored bytes, see
//! `Entry::is_absent`).
//!
//! Objects are immutable, so the id's object is replaced in four steps,
//! each leaving a readable container under the id (readers fall back from
//! `containers/<id>` to `compacted/<id>`, see `container.rs`):
//!
//! 1. put `compacted/<id>` (the new version);
//! 2. delete `containers/<id>`;
//! 3. put `containers/<id>` (the new version again);
//! 4. delete `compacted/<id>`.
//!
//! `finish_compactions` (at a writable open and at the start of every GC)
//! completes any that a crash interrupted: if `containers/<id>` is missing
//! it puts it from `compacted/<id>`, then deletes `compacted/<id>`. Either
//! version serves every live reference: the old one holds more.
//!
//! Concurrency: the container is condemned in the protection map first,
//! so a compaction never starts on a container a running backup holds
//! (which may reference one of the dead entries: the back-up-X, delete-X,
//! back-up-X-again race), and no lookup hands it out while it is replaced;
//! after step 4 the catalog cache and the index learn the new catalog and
//! it is released. Which containers to look at: those the old marks of
//! changed groups referenced (only they can have lost entries), saved in
//! `gc/candidates-<gen>` before the new marks are written, so a GC that
//! dies before compacting leaves them for the next one; they stay there
//! until compacted (`candidates.rs`).

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::container::{compacted_name, container_name, Container, COMPACTED_PREFIX};
use crate::error::Error;
use dedup_common::compress::Compression;

use crate::error::repo::{RepoError, RepoResult};
use crate::format::Entry;
use crate::gc::candidates::{CandidateIds, SHARE_SCALE};
use crate::gc::marks::is_marked;
use crate::gc::{GcOptions, GcReport};
use crate::repo::Repository;
use crate::writer::ContainerWriter;

/// The default threshold: compact a container once less than half of it
/// is live.
pub const DEFAULT_COMPACT_BELOW: f64 = 0.5;

impl Repository {
    /// Finish the compactions a crash interrupted (see the module doc).
    pub(crate) fn finish_compactions(&self) -> RepoResult<()> {
        for object in self.store.list(COMPACTED_PREFIX)? {
            let id = object
                .strip_prefix(COMPACTED_PREFIX)
                .and_then(|h| u64::from_str_radix(h, 16).ok())
                .ok_or_else(|| RepoError::corrupt(&object, "not a compacted container name"))?;
            let name = container_name(id);
            // Only whether it is there: a damaged tail is the check's to
            // find, and must not stop every open to write.
            match self.store.size(&name) {
                Ok(_) => {}
                Err(Error::NotFound { .. }) => {
                    let bytes = self.store.get(&object)?;
                    match self.store.put(&name, &bytes) {
                        Ok(()) | Err(Error::Exists { .. }) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                Err(e) => return Err(e.into()),
            }
            self.delete_if_there(&object)?;
            self.catalog_cache().forget(id);
        }
        Ok(())
    }

    /// Compact the candidates that are live and mostly dead. Returns the
    /// candidates left for a later collection: those a running backup
    /// held (share unknown), and those not below this threshold (with the
    /// share found; one found before and not below it is not read again).
    pub(super) fn compact(
        &self,
        candidates: &CandidateIds,
        live: &BTreeMap<u64, Vec<u8>>,
        options: &GcOptions,
        report: &mut GcReport,
    ) -> RepoResult<CandidateIds> {
        let mut left = CandidateIds::new();
        let total = candidates.len() as u64;
        for (n, (&id, &share)) in candidates.iter().enumerate() {
            if let Some(p) = options.progress {
                p("compact", n as u64 + 1, total);
            }
            let Some(bits) = live.get(&id) else {
                continue; // swept, or never live
            };
            // Rounded down: a share at or above the threshold is surely so.
            if share.is_some_and(|s| f64::from(s) >= options.compact_below * SHARE_SCALE as f64) {
                left.insert(id, share);
                continue;
            }
            // The catalog says whether it is worth reading the container.
            report.catalogs_read += 1;
            let catalog = match self.catalog(id) {
                Ok(c) => c,
                Err(Error::NotFound { .. } | Error::Corrupt { .. }) => continue,
                Err(e) => return Err(e.into()),
            };
            let (mut all, mut kept) = (0u64, 0u64);
            // Raw bytes: segments share their frame's stored bytes.
            for (i, e) in catalog.entries().iter().enumerate() {
                if e.is_absent() {
                    continue;
                }
                let raw = u64::from(e.location.raw_len);
                all += raw;
                if is_marked(bits, i) {
                    kept += raw;
                }
            }
            if kept == all {
                continue; // nothing dead: no longer a candidate
            }
            if kept as f64 >= options.compact_below * all as f64 {
                left.insert(id, Some((kept * SHARE_SCALE / all) as u16));
                continue;
            }
            if self.protection().condemn([id]).is_empty() {
                left.insert(id, None);
                continue;
            }
            let result = self.replace(id, bits, report);
            // Released even on failure: both versions serve every live
            // reference, and the next GC (or open) finishes the switch.
            self.catalog_cache().forget(id);
            self.protection().release(id);
            result?;
        }
        Ok(left)
    }

    /// Steps 1 to 4 for container `id`, keeping the entries set in `bits`.
    fn replace(&self, id: u64, bits: &[u8], report: &mut GcReport) -> RepoResult<()> {
        let old = match Container::read(&*self.store, id) {
            Ok(c) => c,
            // A damaged container is left for `check` to report.
            Err(Error::Corrupt { .. }) => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        // Not read again: its size; 0 if only its compacted version is left.
        let old_len = match self.store.size(&container_name(id)) {
            Ok(size) => size,
            Err(Error::NotFound { .. }) => 0,
            Err(e) => return Err(e.into()),
        };
        let (bytes, entries) = compacted(id, &old, bits, self.config.compression)?;
        let tmp = compacted_name(id);
        self.store.put(&tmp, &bytes)?;
        self.delete_if_there(&container_name(id))?;
        self.store.put(&container_name(id), &bytes)?;
        self.delete_if_there(&tmp)?;
        report.containers_compacted += 1;
        report.bytes_reclaimed += old_len.saturating_sub(bytes.len() as u64);
        let present = |e: &[Entry]| e.iter().filter(|e| !e.is_absent()).count() as u64;
        let removed = present(old.catalog().entries()).saturating_sub(present(&entries));
        let mut index = self.index()?;
        index.compacted(id, &entries);
        index.forget_fingerprints(removed);
        drop(index);
        let catalog = Container::parse(&container_name(id), bytes)?
            .catalog()
            .clone();
        self.catalog_cache().insert(id, Arc::new(catalog));
        Ok(())
    }
}

/// Container `id` with only the entries set in `bits` stored: the same
/// numbering, dead entries absent, the live segments framed and
/// compressed again with `compression` (a frame may have lost some).
fn compacted(
    id: u64,
    old: &Container,
    bits: &[u8],
    compression: Compression,
) -> RepoResult<(Vec<u8>, Vec<Entry>)> {
    let mut writer = ContainerWriter::with_options(id, usize::MAX, compression);
    for (i, e) in old.catalog().entries().iter().enumerate() {
        if is_marked(bits, i) && !e.is_absent() {
            writer.add_hashed(&old.segment(i)?, e.fingerprint)?;
        } else {
            writer.add_absent(e);
        }
    }
    let out = writer.seal();
    // Checked as any container is read: a bug here fails the GC, not a
    // later restore.
    let entries = Container::parse(&compacted_name(id), out.clone())?
        .catalog()
        .entries()
        .to_vec();
    Ok((out, entries))
}
