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
//! `repair_compactions` (at every writable open) puts `containers/<id>`
//! back from `compacted/<id>` where a crash between steps 2 and 3 left
//! only the latter: safe beside a compaction still running, whose step 3
//! then finds the same bytes there. Either version serves every live
//! reference: the old one holds more. Only a collection deletes a leftover
//! `compacted/<id>` (`finish_compactions`), and never one of the
//! containers the collection before it may still be compacting.
//!
//! Across processes a container is compacted like it is deleted, in two
//! collections (`epochs/`): collection *n* lists it in its epoch record
//! (every writing process then stops handing it out, or pins it if its
//! backups hold it), collection *n*+1 compacts it unless a pin or a backup
//! of this process holds it. In the process, the container is condemned
//! in the protection map first, so a compaction never starts on a
//! container a running backup holds (which may reference one of the dead
//! entries: the back-up-X, delete-X, back-up-X-again race), and no lookup
//! hands it out while it is replaced; after step 4 the catalog cache and
//! the index learn the new catalog and it is released. Which containers
//! to look at: those the old marks of changed groups referenced (only they
//! can have lost entries), saved in `gc/candidates-<gen>` before the new
//! marks are written, so a GC that dies before compacting leaves them for
//! the next one; they stay there until compacted (`candidates.rs`).

use std::collections::{BTreeMap, HashSet};
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
    /// Put back `containers/<id>` where only `compacted/<id>` is left
    /// (see the module doc); deletes nothing.
    pub(crate) fn repair_compactions(&self) -> RepoResult<()> {
        self.finish_compactions(None)
    }

    /// Repair as `repair_compactions` does, then, with `Some(running)`,
    /// delete every leftover `compacted/<id>` whose container is in place,
    /// except those of `running` (a collection may still be replacing
    /// them).
    pub(crate) fn finish_compactions(&self, running: Option<&HashSet<u64>>) -> RepoResult<()> {
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
                    let bytes = match self.store.get(&object) {
                        Ok(bytes) => bytes,
                        // Finished by its compactor meanwhile.
                        Err(Error::NotFound { .. }) => continue,
                        Err(e) => return Err(e.into()),
                    };
                    match self.store.put(&name, &bytes) {
                        Ok(()) | Err(Error::Exists { .. }) => {}
                        Err(e) => return Err(e.into()),
                    }
                    self.catalog_cache().forget(id);
                }
                Err(e) => return Err(e.into()),
            }
            let Some(running) = running else {
                continue;
            };
            // Past step 3 (both versions the same bytes), only step 4 is
            // left, which anyone may do; before it, only once no
            // collection may still be replacing it.
            if !running.contains(&id) || self.same_bytes(&object, &name)? {
                self.delete_if_there(&object)?;
            }
        }
        Ok(())
    }

    /// Whether objects `a` and `b` both exist and hold the same bytes.
    fn same_bytes(&self, a: &str, b: &str) -> RepoResult<bool> {
        let sizes = (self.store.size(a), self.store.size(b));
        match sizes {
            (Ok(x), Ok(y)) if x == y => {}
            (Ok(_) | Err(Error::NotFound { .. }), Ok(_) | Err(Error::NotFound { .. })) => {
                return Ok(false)
            }
            (Err(e), _) | (_, Err(e)) => return Err(e.into()),
        }
        match (self.store.get(a), self.store.get(b)) {
            (Ok(x), Ok(y)) => Ok(x == y),
            (Err(Error::NotFound { .. }), _) | (_, Err(Error::NotFound { .. })) => Ok(false),
            (Err(e), _) | (_, Err(e)) => Err(e.into()),
        }
    }

    /// Which candidates to compact: live, mostly dead, and not in `skip`
    /// (pinned by another process or held here). Returns them and the
    /// candidates left for a later collection (those to compact among
    /// them, until they are).
    pub(super) fn compaction_verdicts(
        &self,
        candidates: &CandidateIds,
        live: &BTreeMap<u64, Vec<u8>>,
        skip: &dyn Fn(u64) -> bool,
        options: &GcOptions,
        report: &mut GcReport,
    ) -> RepoResult<(Vec<LiveEntries>, CandidateIds)> {
        let mut left = CandidateIds::new();
        let mut compact = Vec::new();
        for (&id, &share) in candidates.iter() {
            match self.verdict(id, share, live, options, report)? {
                Verdict::Drop => {}
                Verdict::Keep(share) => {
                    left.insert(id, share);
                }
                Verdict::Compact(bits) => {
                    left.insert(id, None);
                    if !skip(id) {
                        compact.push((id, bits));
                    }
                }
            }
        }
        Ok((compact, left))
    }

    /// Compact those of `ids` that are still mostly dead under `live` and
    /// not in `skip`; the ids that are settled (compacted, or no longer
    /// candidates), to drop from the candidates.
    pub(super) fn compact_now(
        &self,
        ids: &[u64],
        live: &BTreeMap<u64, Vec<u8>>,
        skip: &dyn Fn(u64) -> bool,
        epoch: u64,
        options: &GcOptions,
        report: &mut GcReport,
    ) -> RepoResult<Vec<u64>> {
        let mut settled = Vec::new();
        let total = ids.len() as u64;
        for (n, &id) in ids.iter().enumerate() {
            if let Some(p) = options.progress {
                p("compact", n as u64 + 1, total);
            }
            if skip(id) {
                continue;
            }
            let bits = match self.verdict(id, None, live, options, report)? {
                Verdict::Drop => {
                    settled.push(id);
                    continue;
                }
                Verdict::Keep(_) => continue,
                Verdict::Compact(bits) => bits,
            };
            // A newer collection begun: it finishes what is left.
            if !self.still_newest(epoch)? {
                break;
            }
            // Condemned here while it is replaced; released after unless it
            // was condemned already (by an epoch this process applied: then
            // it stays out of reach, whatever this compaction does).
            let (held, already) = {
                let mut p = self.protection();
                let already = p.is_condemned(id);
                (p.condemn([id]).is_empty(), already)
            };
            if held {
                continue; // a backup of this process holds it
            }
            let result = self.replace(id, &bits, epoch, report);
            // Released even on failure: both versions serve every live
            // reference, and the next GC (or open) finishes the switch.
            self.catalog_cache().forget(id);
            if !already {
                self.protection().release(id);
            }
            if result? {
                settled.push(id);
            }
        }
        Ok(settled)
    }

    /// Whether candidate `id` (with the live share an earlier look found)
    /// is to be compacted under `live`.
    fn verdict(
        &self,
        id: u64,
        share: Option<u16>,
        live: &BTreeMap<u64, Vec<u8>>,
        options: &GcOptions,
        report: &mut GcReport,
    ) -> RepoResult<Verdict> {
        let Some(bits) = live.get(&id) else {
            return Ok(Verdict::Drop); // swept, or never live
        };
        // Rounded down: a share at or above the threshold is surely so.
        if share.is_some_and(|s| f64::from(s) >= options.compact_below * SHARE_SCALE as f64) {
            return Ok(Verdict::Keep(share));
        }
        // The catalog says whether it is worth reading the container.
        report.catalogs_read += 1;
        let catalog = match self.catalog(id) {
            Ok(c) => c,
            Err(Error::NotFound { .. } | Error::Corrupt { .. }) => return Ok(Verdict::Drop),
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
            return Ok(Verdict::Drop); // nothing dead: no longer a candidate
        }
        if kept as f64 >= options.compact_below * all as f64 {
            return Ok(Verdict::Keep(Some((kept * SHARE_SCALE / all) as u16)));
        }
        Ok(Verdict::Compact(bits.clone()))
    }

    /// Steps 1 to 4 for container `id`, keeping the entries set in `bits`;
    /// false if it was left as it is (damaged, or a compacted version of
    /// it is already there: an earlier compaction's, maybe still running).
    fn replace(&self, id: u64, bits: &[u8], epoch: u64, report: &mut GcReport) -> RepoResult<bool> {
        let old = match Container::read(&*self.store, id) {
            Ok(c) => c,
            // A damaged container is left for `check` to report.
            Err(Error::Corrupt { .. }) => return Ok(false),
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
        match self.store.put(&tmp, &bytes) {
            Ok(()) => {}
            Err(Error::Exists { .. }) => return Ok(false),
            Err(e) => return Err(e.into()),
        }
        // Looked at again between the two puts' halves: a newer collection
        // may take a `compacted/<id>` that is not yet the only copy for a
        // leftover (`finish_compactions`), so this one stops first, and
        // takes its own back.
        if !self.still_newest(epoch)? {
            self.delete_if_there(&tmp)?;
            return Ok(false);
        }
        self.delete_if_there(&container_name(id))?;
        match self.store.put(&container_name(id), &bytes) {
            // Put back from `compacted/<id>` by an open's repair.
            Ok(()) | Err(Error::Exists { .. }) => {}
            Err(e) => return Err(e.into()),
        }
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
        Ok(true)
    }
}

/// A container to compact and a bitmap of its entries live now.
pub(super) type LiveEntries = (u64, Vec<u8>);

enum Verdict {
    /// No longer a candidate.
    Drop,
    /// Not worth it now; the share found, if read.
    Keep(Option<u16>),
    /// Compact, keeping these entries.
    Compact(Vec<u8>),
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
