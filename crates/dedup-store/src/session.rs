//! A backup in progress (the paper's per-stream state in the Segment
//! Manager, §3.1 and §3.4): the recipe so far, the container being
//! filled, and the containers this backup holds in the protection map.
//!
//! Many sessions run at once on one shared [`Repository`], each filling
//! its own container, so streams never wait for each other's writes; they
//! meet only in short critical sections (the index, the catalog cache, the
//! protection map). A session that is dropped without `commit` leaves no
//! backup, only containers and recipe parts for GC.
//!
//! The steps are there for a server to run for a remote client that cut
//! and hashed the segments itself: `lookup` a fingerprint (public), `store`
//! the bytes of the new ones (public), `push` each segment's reference in
//! stream order (crate only: a reference pushed without a lookup, store or
//! reuse would not be protected from GC). A local backup uses `append`,
//! which does all three; a backup of files also `reuse_all`s unchanged
//! files' segments.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{SystemTime, UNIX_EPOCH};

use dedup_common::fingerprint::Fingerprint;

use crate::backup::{
    validate_name, BackupRecord, BackupReport, DeviceMark, RECIPES_PREFIX, TREES_PREFIX,
};
use crate::container::{container_name, Catalog, Container};
use crate::crypto::random::random_bytes;
use crate::error::repo::{RepoError, RepoResult};
use crate::error::Error;
use crate::fp_map::FpMap;
use crate::inflight::{Pending, Place, SettleGuard, State};
use crate::recipe::parts::{part_digest, part_name, PartInfo, RecipeIndex};
use crate::recipe::{Recipe, SegmentRef};
use crate::repo::Repository;
use crate::segment_hash::SegmentHash;
use crate::writer::ContainerWriter;

/// The container being filled, and what it holds so far (segments repeated
/// within it are found here: the index only learns of durable containers),
/// each with its catalog entry and raw length. Its writer is in the
/// repository's table of containers not yet durable (`inflight.rs`), from
/// which a session that reuses one of its segments may take it to seal it.
struct Open {
    pending: Arc<Pending>,
    holds: FpMap<(u32, u32)>,
}

/// A sealed container being put by a thread of its own, so the backup goes
/// on cutting, hashing and compressing while it is written and synced (a
/// put waited for on the backup's thread cost about 2 s of a 9 s backup of
/// 2 GiB). At most one per session; the index and the catalog cache learn
/// of it only once it is durable (the session looks every segment), and
/// `commit` waits for it.
struct Writing {
    id: u64,
    done: JoinHandle<Result<(Catalog, u64), Error>>,
}

pub struct BackupSession<'r> {
    repo: &'r Repository,
    id: u64,
    name: String,
    group: String,
    report: BackupReport,
    /// The references not yet written in a recipe part.
    recipe: Recipe,
    /// The recipe parts written so far (`recipe/parts.rs`), each durable.
    parts: Vec<PartInfo>,
    /// Names this backup's recipe and tree objects.
    nonce: u64,
    open: Option<Open>,
    /// What this session stored in containers it already sealed, and the
    /// segments a client sent that were found elsewhere (`append_sent`),
    /// newest generation first: a repeat is found here even when a sampled
    /// index has no hook for it (a client that sent a segment once names
    /// it as known later). Two generations of at most `generation` keep
    /// the last that many always.
    /// Each with its container, entry and raw length: a container whose put
    /// is still running has no catalog to look the length up in.
    sealed: [FpMap<(u64, u32, u32)>; 2],
    /// `LOCAL_GENERATION`, or `SEALED_GENERATION` once a client sent
    /// segments (`append_sent`).
    generation: usize,
    writing: Option<Writing>,
    /// This session's containers that another session claimed and is
    /// sealing: `commit` waits for them and counts them as written.
    sealed_by_others: Vec<Arc<Pending>>,
    /// Other sessions' containers not yet durable that this backup
    /// references: `commit` makes them durable (sealing one still open)
    /// before the backup object names them.
    borrowed: HashMap<u64, Arc<Pending>>,
    /// A container of this backup that did not become durable (its put
    /// failed): segments the recipe already references are in it, so the
    /// backup may no longer commit.
    broken: Option<String>,
    /// The device and changed-block tracking mark a backup by fingerprint
    /// saw, recorded with the backup (`backup_blocks.rs`).
    device_mark: Option<DeviceMark>,
    ended: bool,
}

/// Fingerprints one generation of `sealed` holds for a session a client
/// sends segments to (about 56 MiB at most for both): more than the
/// client remembers as sent (`rpc/pipeline.rs`, `MAX_SENT`), since it
/// names them as known later without a lookup.
const SEALED_GENERATION: usize = 1 << 19;

/// Fingerprints one generation of `sealed` holds for a backup cut in this
/// process (about 3.5 MiB at most for both), which looks every segment up:
/// the index learns of a container once it is durable, and this covers the
/// containers sealed since (a put runs at a time, each container holds
/// some 4,000-16,000 segments) and the recent past a sampled index may
/// have no hook for. At `SEALED_GENERATION` it held 55 MB of a 300 MB
/// peak on the first backup of `/usr/share` and `/usr/lib`, and found
/// nothing more there (the index holds every fingerprint of a store that
/// size).
const LOCAL_GENERATION: usize = 1 << 15;

impl Repository {
    /// Start backup `name` in `group`. Refused if the name is taken or the
    /// handle is read-only; two sessions racing for one name both run, and
    /// the second to commit is refused.
    pub fn begin_backup(&self, name: &str, group: &str) -> RepoResult<BackupSession<'_>> {
        validate_name(name)?;
        validate_name(group)?;
        if !self.is_writable() {
            return Err(RepoError::ReadOnly);
        }
        match self.store.get(&BackupRecord::object_name(name)) {
            Err(Error::NotFound { .. }) => {}
            Ok(_) => return Err(RepoError::BackupExists { name: name.into() }),
            Err(e) => return Err(e.into()),
        }
        let nonce = u64::from_le_bytes(random_bytes()?);
        // Every epoch's condemned list applied before the first lookup
        // (unless listed within the look interval: an open just did; a
        // lookup's reuse is pinned and confirmed by a listing anyway).
        self.keep_up_epochs()?;
        let id = self.protection().begin_session();
        Ok(BackupSession {
            repo: self,
            id,
            name: name.into(),
            group: group.into(),
            report: BackupReport::default(),
            recipe: Recipe::default(),
            parts: Vec::new(),
            nonce,
            open: None,
            sealed: [FpMap::default(), FpMap::default()],
            generation: LOCAL_GENERATION,
            writing: None,
            sealed_by_others: Vec::new(),
            borrowed: HashMap::new(),
            broken: None,
            device_mark: None,
            ended: false,
        })
    }
}

impl BackupSession<'_> {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Record with the backup the device and tracking mark it saw.
    pub fn set_device_mark(&mut self, mark: DeviceMark) {
        self.device_mark = Some(mark);
    }

    /// The group the backup belongs to.
    pub fn group(&self) -> &str {
        &self.group
    }

    /// What the backup has cost so far.
    pub fn report(&self) -> &BackupReport {
        &self.report
    }

    /// Where segment `fp` is already stored, if anywhere this backup may
    /// reuse it: in its own open container, or where the index says once
    /// the container is protected for this session and its catalog
    /// confirms the fingerprint. A hint that cannot be confirmed (no such
    /// container, condemned by GC, damaged catalog, another fingerprint) is
    /// no answer: storing the segment again costs space, reusing a wrong
    /// one would lose data.
    pub fn lookup(&mut self, fp: &Fingerprint) -> RepoResult<Option<(u64, u32)>> {
        Ok(self.lookup_ref(fp)?.map(|r| (r.container, r.entry)))
    }

    /// Catalog entry `entry` of `container`, once the container is
    /// protected for this session (protect first, then confirm: once held,
    /// GC cannot condemn it; see `Repository::hold_pinned`); `None` if it
    /// is condemned, unreadable, or has no such entry, or compaction
    /// removed it.
    fn held_entry(&self, container: u64, entry: u32) -> RepoResult<Option<crate::format::Entry>> {
        // Asked again once held: holding may apply an epoch (the pin's
        // look) that found the entry dead, and one found dead by a
        // collection this process applied is never handed out (a
        // compaction removes it if it is dead at its own look too).
        if !self.repo.protection().allows(container, entry)
            || !self.repo.hold_pinned(self.id, &[container])?
            || !self.repo.protection().allows(container, entry)
        {
            return Ok(None);
        }
        Ok(self.catalog_entry(container, entry))
    }

    /// Catalog entry `entry` of `container`, which this session holds;
    /// `None` if the catalog does not read or has no such entry.
    fn catalog_entry(&self, container: u64, entry: u32) -> Option<crate::format::Entry> {
        entry_in(&*self.repo.catalog(container).ok()?, entry)
    }

    /// [`lookup`](Self::lookup), answered as the full reference (with the
    /// segment's length from where it was found: this session's own
    /// containers or the catalog entry): what a server pushes for a segment
    /// a remote client names only by fingerprint, so the length in the
    /// recipe is the store's, never the client's word.
    pub fn lookup_ref(&mut self, fp: &Fingerprint) -> RepoResult<Option<SegmentRef>> {
        self.reap_written()?;
        let at = |container, entry, len| SegmentRef::new(container, entry, len, fp);
        if let Some(o) = &self.open {
            if let Some(&(i, len)) = o.holds.get(fp) {
                return Ok(Some(at(o.pending.id, i, len)));
            }
        }
        // Containers this session wrote are held from birth: no check.
        if let Some(&(c, e, len)) = self.sealed.iter().find_map(|g| g.get(fp)) {
            return Ok(Some(at(c, e, len)));
        }
        let hint = self.repo.index()?.lookup(fp);
        if let Some((container, entry)) = hint {
            let confirmed = self
                .held_entry(container, entry)?
                .filter(|e| e.fingerprint == *fp);
            if let Some(e) = confirmed {
                return Ok(Some(at(container, entry, e.location.raw_len)));
            }
        }
        // Another running backup's container, not durable yet: held for
        // this session under the table's lock (a listed container is held
        // by its owner, so no collection can have condemned or compacted
        // it), and made durable before this backup commits.
        let found = {
            let mut table = self.repo.inflight();
            table
                .find(fp, self.id)
                .filter(|(p, _)| self.repo.protection().hold(self.id, p.container))
        };
        let Some((p, pending)) = found else {
            return Ok(None);
        };
        self.borrowed.entry(p.container).or_insert(pending);
        Ok(Some(at(p.container, p.entry, p.len)))
    }

    /// Reuse segment `r` from an earlier backup's recipe without reading
    /// or hashing its bytes (a file unchanged since the parent backup):
    /// the container is protected for this session and its catalog must
    /// still hold `r`'s fingerprint and length at `r`'s entry. False (and
    /// nothing pushed) if it cannot be confirmed: the caller reads the
    /// data instead.
    pub fn reuse(&mut self, r: SegmentRef) -> RepoResult<bool> {
        self.reuse_all(std::slice::from_ref(&r))
    }

    /// `reuse` for a whole file's segments: all of them or none (false,
    /// nothing pushed), so a file is never half reused, half read.
    pub fn reuse_all(&mut self, refs: &[SegmentRef]) -> RepoResult<bool> {
        // The file's containers held (and pinned) together: one pin, not
        // one per container; a reference into one not held is refused.
        if !self.confirm_refs(refs)?.iter().all(|&ok| ok) {
            return Ok(false);
        }
        self.push_all(refs, false)?;
        Ok(true)
    }

    /// Which of `refs` (each a candidate for the segment of fingerprint
    /// `fps[i]`) are confirmed: held for this session, allowed (no
    /// collection this process applied found the entry dead), and its
    /// container's catalog holding exactly that fingerprint and length at
    /// that entry. Nothing is pushed: a confirmed reference is the
    /// caller's to `push`.
    pub(crate) fn confirm(
        &mut self,
        refs: &[SegmentRef],
        fps: &[Fingerprint],
    ) -> RepoResult<Vec<bool>> {
        self.confirm_with(refs, |i, e| {
            e.fingerprint == fps[i] && e.location.raw_len == refs[i].len
        })
    }

    /// `confirm` of references taken as they are (a parent's, for blocks
    /// a device's tracking says did not change): the catalog entry must
    /// have the reference's 8-byte check and length.
    pub(crate) fn confirm_refs(&mut self, refs: &[SegmentRef]) -> RepoResult<Vec<bool>> {
        self.confirm_with(refs, |i, e| refs[i].is(&e.fingerprint, e.location.raw_len))
    }

    /// Hold, allow and check each of `refs` against its catalog entry
    /// with `matches(i, entry)`; a run of equal references (a device's
    /// zero blocks, most of a large device) is held, allowed and looked
    /// up once.
    fn confirm_with(
        &mut self,
        refs: &[SegmentRef],
        matches: impl Fn(usize, &crate::format::Entry) -> bool,
    ) -> RepoResult<Vec<bool>> {
        if refs.is_empty() {
            return Ok(Vec::new());
        }
        // Every container that can be is held, even past one condemned;
        // a reference into one this session does not hold is refused.
        self.repo
            .hold_pinned(self.id, &SegmentRef::containers(refs))?;
        // Each run of equal references: where it ends.
        let mut runs = Vec::new();
        let mut i = 0;
        while i < refs.len() {
            let end = i + refs[i..].iter().take_while(|r| **r == refs[i]).count();
            runs.push(end);
            i = end;
        }
        // References run in container order, mostly: what is asked of a
        // container (held? its catalog) is asked once a run of them, not
        // once a reference (a device backup confirms millions).
        let allowed: Vec<bool> = {
            let p = self.repo.protection();
            let mut held: Option<(u64, bool)> = None;
            let mut start = 0;
            (runs.iter())
                .map(|&end| {
                    let r = refs[start];
                    start = end;
                    let holds = match held {
                        Some((c, h)) if c == r.container => h,
                        _ => {
                            let h = p.holds(self.id, r.container);
                            held = Some((r.container, h));
                            h
                        }
                    };
                    holds && p.allows(r.container, r.entry)
                })
                .collect()
        };
        // Each container's catalog fetched once for the call.
        let mut catalogs: HashMap<u64, Option<Arc<Catalog>>> = HashMap::new();
        let mut last: Option<(u64, Option<Arc<Catalog>>)> = None;
        let mut out = Vec::with_capacity(refs.len());
        let repo = self.repo;
        let mut start = 0;
        for (&end, allowed) in runs.iter().zip(allowed) {
            let r = refs[start];
            let entry = match allowed {
                true => {
                    if last.as_ref().is_none_or(|(c, _)| *c != r.container) {
                        let catalog = catalogs
                            .entry(r.container)
                            .or_insert_with(|| repo.catalog(r.container).ok())
                            .clone();
                        last = Some((r.container, catalog));
                    }
                    let catalog = last.as_ref().and_then(|(_, c)| c.as_ref());
                    catalog.and_then(|c| entry_in(c, r.entry))
                }
                false => None,
            };
            out.extend((start..end).map(|i| entry.is_some_and(|e| matches(i, &e))));
            start = end;
        }
        Ok(out)
    }

    /// Hold `containers` for this backup ahead of reusing them (a parent
    /// recipe part's), pinned together; those condemned are left out.
    pub(crate) fn hold_ahead(&mut self, containers: &[u64]) -> RepoResult<()> {
        self.repo.hold_pinned(self.id, containers).map(drop)
    }

    /// Store `data` as a new segment in this session's container, unless
    /// the container already holds it; its location and fingerprint.
    pub fn store(&mut self, data: &[u8]) -> RepoResult<(u64, u32, Fingerprint)> {
        self.store_hashed(data, self.segment_hash().of(data))
    }

    /// `store` of bytes this process hashed itself.
    fn store_hashed(
        &mut self,
        data: &[u8],
        fp: Fingerprint,
    ) -> RepoResult<(u64, u32, Fingerprint)> {
        if let Some(o) = &self.open {
            if let Some(&(i, _)) = o.holds.get(&fp) {
                return Ok((o.pending.id, i, fp));
            }
        }
        let len = data.len() as u32;
        loop {
            if self.open.is_none() {
                self.open = Some(self.new_container()?);
            }
            let o = self.open.as_mut().expect("just opened");
            let added = match o.pending.writer().as_mut() {
                Some(w) => {
                    let (_, i) = w.add_hashed(data, fp)?;
                    Some((i as u32, w.is_full()))
                }
                None => None,
            };
            let Some((i, full)) = added else {
                // Another backup took the container to seal it: carry on
                // in a new one.
                self.handed_over();
                continue;
            };
            o.holds.insert(fp, (i, len));
            let id = o.pending.id;
            let at = Place {
                container: id,
                entry: i,
                len,
            };
            self.repo.inflight().add(fp, at);
            if full {
                self.seal()?;
            }
            return Ok((id, i, fp));
        }
    }

    /// The open container was claimed by another session, which seals and
    /// puts it: what it holds is this session's sealed segments now, and
    /// `commit` waits for the put.
    fn handed_over(&mut self) {
        if let Some(o) = self.open.take() {
            self.remember_sealed(o.pending.id, &o.holds);
            self.sealed_by_others.push(o.pending);
        }
    }

    /// Remember what container `id` holds, sealed, for this session's own
    /// lookups (in generations, see `sealed`).
    fn remember_sealed(&mut self, id: u64, holds: &FpMap<(u32, u32)>) {
        self.sealed_room(holds.len())
            .extend(holds.iter().map(|(fp, &(i, len))| (*fp, (id, i, len))));
    }

    /// The newest generation of `sealed`, with room for `n` more (the
    /// older generation dropped, and this one made it, if not).
    fn sealed_room(&mut self, n: usize) -> &mut FpMap<(u64, u32, u32)> {
        if self.sealed[0].len() + n > self.generation {
            self.sealed[1] = std::mem::take(&mut self.sealed[0]);
        }
        &mut self.sealed[0]
    }

    /// Add the next segment of the stream to the recipe; `new` if this
    /// backup stored it. A full part of the recipe is written first.
    pub(crate) fn push(&mut self, segment: SegmentRef, new: bool) -> RepoResult<()> {
        self.push_all(std::slice::from_ref(&segment), new)
    }

    /// `push` of each of `segments`, in order, a run at a time: the
    /// recipe grows by slices, a part written wherever `push` one by one
    /// would have written one (before a segment, when the recipe is
    /// full). A device's unchanged windows come so: on a 64 GiB device
    /// 16 million references a backup, mostly one zero block's.
    pub(crate) fn push_all(&mut self, segments: &[SegmentRef], new: bool) -> RepoResult<()> {
        let part = self.repo.part_segments.load(Ordering::Relaxed);
        let mut rest = segments;
        while !rest.is_empty() {
            if self.recipe.segments.len() >= part {
                self.write_part()?;
            }
            let room = part - self.recipe.segments.len();
            let (now, later) = rest.split_at(room.min(rest.len()));
            let bytes = now.iter().map(|s| u64::from(s.len)).sum::<u64>();
            self.report.bytes_in += bytes;
            if new {
                self.report.segments_new += now.len() as u64;
                self.report.bytes_new += bytes;
            } else {
                self.report.segments_duplicate += now.len() as u64;
            }
            self.recipe.segments.extend_from_slice(now);
            rest = later;
        }
        Ok(())
    }

    /// The name of this backup's recipe object.
    fn recipe_name(&self) -> String {
        format!("{RECIPES_PREFIX}{}-{:016x}", self.name, self.nonce)
    }

    /// Write the references gathered so far as the recipe's next part.
    fn write_part(&mut self) -> RepoResult<()> {
        let recipe = self.recipe_name();
        if self.parts.is_empty() {
            // Announced (and pinned) before the first part: a GC must not
            // take the parts for orphans while the backup runs.
            self.repo.announce(self.id, &[&recipe])?;
        } else {
            self.keep_up()?;
        }
        // The references stay until their part is durable: a failed put
        // loses none of them, and the part is tried again.
        self.recipe.stream_len = self.recipe.segments.iter().map(|s| u64::from(s.len)).sum();
        let stream_len = self.recipe.stream_len;
        let count = self.recipe.segments.len() as u64;
        let bytes = self.recipe.encode();
        self.repo
            .store
            .put(&part_name(&recipe, self.parts.len()), &bytes)?;
        self.recipe.segments.clear();
        self.parts.push(PartInfo {
            segments: count,
            bytes: stream_len,
            digest: part_digest(&bytes),
        });
        Ok(())
    }

    /// Back up the next segment of the stream: reuse it or store it.
    pub fn append(&mut self, data: &[u8]) -> RepoResult<()> {
        self.append_hashed(data, self.segment_hash().of(data))
    }

    /// How this repository fingerprints segments.
    pub(crate) fn segment_hash(&self) -> SegmentHash {
        self.repo.segment_hash()
    }

    /// `append` of a segment whose fingerprint `fp` this process computed
    /// with `segment_hash` from `data` (on another thread, say). Not for
    /// fingerprints from elsewhere: a wrong one would be stored as truth.
    pub fn append_hashed(&mut self, data: &[u8], fp: Fingerprint) -> RepoResult<()> {
        let len = data.len() as u32;
        let (container, entry, new) = match self.lookup(&fp)? {
            Some((c, e)) => (c, e, false),
            None => {
                let (c, e, _) = self.store_hashed(data, fp)?;
                (c, e, true)
            }
        };
        self.push(SegmentRef::new(container, entry, len, &fp), new)
    }

    /// [`append_hashed`](Self::append_hashed) for bytes a remote client
    /// sent: looked up again first (a concurrent backup may have stored
    /// the segment since the client's lookup), and one found elsewhere
    /// (the index, another backup's container) is remembered with this
    /// session's own. The client names its later repeats `Known` without
    /// a lookup, and a sampled index need not find them again once that
    /// other container is durable.
    pub(crate) fn append_sent(&mut self, data: &[u8], fp: Fingerprint) -> RepoResult<()> {
        self.generation = SEALED_GENERATION;
        let len = data.len() as u32;
        let Some((c, e)) = self.lookup(&fp)? else {
            let (c, e, _) = self.store_hashed(data, fp)?;
            return self.push(SegmentRef::new(c, e, len, &fp), true);
        };
        self.sealed_room(1).insert(fp, (c, e, len));
        self.push(SegmentRef::new(c, e, len, &fp), false)
    }

    /// Make the backup of a stream durable and visible: the last
    /// container, then the recipe (its last part, then its index, if it
    /// grew past one part), then the backup object, whose `put` is the
    /// commit point.
    pub fn commit(self) -> RepoResult<BackupRecord> {
        self.commit_with_tree(None)
    }

    /// Commit, `tree` (if any) already checked (`tree/commit.rs` checks
    /// it).
    pub(crate) fn commit_checked(mut self, tree: Option<&[u8]>) -> RepoResult<BackupRecord> {
        if let Some(cause) = &self.broken {
            return Err(RepoError::Incomplete {
                name: self.name.clone(),
                detail: cause.clone(),
            });
        }
        self.seal()?;
        self.finish_writing()?;
        self.settle_shared()?;
        let repo = self.repo;
        let (nonce, recipe_name) = (self.nonce, self.recipe_name());
        let tree_name = tree.map(|_| format!("{TREES_PREFIX}{}-{nonce:016x}", self.name));
        // Announced (and pinned, in one pin) before their puts: a GC must
        // not take them for orphans before the backup object names them
        // (a recipe in parts was announced before its first part).
        let mut announced: Vec<&str> = tree_name.iter().map(String::as_str).collect();
        if self.parts.is_empty() {
            announced.push(&recipe_name);
        }
        repo.announce(self.id, &announced)?;
        let recipe = if self.parts.is_empty() {
            self.recipe.stream_len = self.report.bytes_in;
            std::mem::take(&mut self.recipe).into_encoded()
        } else {
            if !self.recipe.segments.is_empty() {
                self.write_part()?;
            }
            let parts = std::mem::take(&mut self.parts);
            RecipeIndex {
                stream_len: self.report.bytes_in,
                segments: parts.iter().map(|p| p.segments).sum(),
                parts,
            }
            .encode()
        };
        repo.store.put(&recipe_name, &recipe)?;
        if let (Some(name), Some(bytes)) = (&tree_name, tree) {
            repo.store.put(name, bytes)?;
        }
        let time = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let record = BackupRecord {
            name: self.name.clone(),
            group: self.group.clone(),
            time,
            recipe: recipe_name,
            tree: tree_name,
            report: self.report,
            device_mark: self.device_mark,
        };
        let object = BackupRecord::object_name(&self.name);
        // Everything it references pinned (or held by nothing a
        // collection could take), at the newest epoch: listed again unless
        // within the look interval with nothing due (an epoch begun since
        // is applied by the look after the put, which is what decides).
        repo.keep_up_epochs()?;
        self.check_lost()?;
        let encoded = record.encode();
        match repo.store.put(&object, &encoded) {
            Ok(()) => {}
            Err(Error::Exists { .. }) => {
                return Err(RepoError::BackupExists {
                    name: self.name.clone(),
                })
            }
            // It may have landed all the same: then it is checked like any
            // commit; if that cannot be known, it is unconfirmed.
            Err(e) => match repo.store.get(&object) {
                Ok(there) if there == encoded => {}
                Ok(_) => {
                    return Err(RepoError::BackupExists {
                        name: self.name.clone(),
                    })
                }
                Err(Error::NotFound { .. }) => return Err(e.into()),
                _ => {
                    return Err(RepoError::Unconfirmed {
                        name: self.name.clone(),
                        detail: e.to_string(),
                    })
                }
            },
        }
        // The epochs begun meanwhile, applied: one that condemned what
        // the backup references, and is not the newest, may have been
        // followed by a collection that looked before the object was
        // visible and deleted it; the backup is then lost. One the newest
        // condemned is safe: the next collection begins after this look,
        // so after the object was visible, and sees it.
        repo.refresh_epochs().map_err(|e| RepoError::Unconfirmed {
            name: self.name.clone(),
            detail: e.to_string(),
        })?;
        if repo.protection().is_lost(self.id) {
            if let Err(e) = repo.delete_if_there(&object) {
                return Err(RepoError::Unconfirmed {
                    name: self.name.clone(),
                    detail: format!(
                        "collections began while it committed, and deleting it failed: {e}"
                    ),
                });
            }
            return Err(RepoError::Overtaken {
                name: self.name.clone(),
            });
        }
        self.ended = true;
        repo.protection().commit_session(self.id);
        Ok(record)
    }

    fn new_container(&mut self) -> RepoResult<Open> {
        // Held from birth: no committed backup references it yet.
        let id = self.repo.take_container_id(self.id)?;
        let target = usize::try_from(self.repo.config.container_target).unwrap_or(usize::MAX);
        let writer = ContainerWriter::with_options(id, target, self.repo.config.compression);
        Ok(Open {
            pending: self.repo.inflight().open(writer),
            holds: FpMap::default(),
        })
    }

    /// Catch up with the collections other processes began (listing the
    /// epochs at most every look interval); refused if one may have
    /// deleted what this backup references.
    fn keep_up(&self) -> RepoResult<()> {
        self.repo.keep_up_epochs()?;
        self.check_lost()
    }

    fn check_lost(&self) -> RepoResult<()> {
        if self.repo.protection().is_lost(self.id) {
            return Err(RepoError::Overtaken {
                name: self.name.clone(),
            });
        }
        Ok(())
    }

    /// Seal the open container, if any, and start putting it (after the
    /// one before it is durable).
    fn seal(&mut self) -> RepoResult<()> {
        // Before the claim: a claimed container must be settled on every
        // path, or a backup reusing it would wait for ever.
        self.finish_writing()?;
        self.keep_up()?;
        let Some(open) = self.open.take() else {
            return Ok(());
        };
        let claimed = self.repo.inflight().claim(&open.pending);
        if !claimed {
            self.open = Some(open);
            self.handed_over();
            return Ok(());
        }
        let id = open.pending.id;
        // The session itself may reference the container at once: it is
        // held from birth, and `commit` waits for it to be durable.
        self.remember_sealed(id, &open.holds);
        let writer = open.pending.writer().take();
        let Some(writer) = writer else {
            let e = writer_gone(id);
            lose(self.repo, &open.pending, &e);
            self.broken = Some(e.to_string());
            return Err(e);
        };
        let bytes = writer.seal();
        let store = Arc::clone(&self.repo.store);
        let pending = open.pending;
        let watch = Arc::clone(&pending);
        let done = std::thread::Builder::new()
            .name(format!("put container {id:x}"))
            .spawn(move || {
                // Settled here, not when the session looks: a backup
                // waiting to commit with a reference to it must not wait
                // for this session's next segment. Lost if this panics.
                let _guard = SettleGuard(&pending);
                let put = put_container(&*store, id, bytes);
                pending.settle(match &put {
                    Ok((_, len)) => State::Durable(*len),
                    Err(e) => State::Lost(e.to_string()),
                });
                put
            })
            .map_err(|cause| RepoError::Io {
                context: format!("starting a thread to write container {id:x}"),
                cause,
            });
        match done {
            Ok(done) => {
                self.writing = Some(Writing { id, done });
                Ok(())
            }
            Err(e) => {
                lose(self.repo, &watch, &e);
                self.broken = Some(e.to_string());
                Err(e)
            }
        }
    }

    /// `finish_writing` once the put has ended, without waiting for it.
    /// Asked every segment: until the index learns of a container, no
    /// other session can reuse its segments, and waiting for this session's
    /// next seal (some 45 MiB of stream later, at zstd's ratio on an ext4
    /// image) meant that concurrent streams shorter than that never saw
    /// each other's containers.
    fn reap_written(&mut self) -> RepoResult<()> {
        if self.writing.as_ref().is_some_and(|w| w.done.is_finished()) {
            self.finish_writing()?;
        }
        Ok(())
    }

    /// Wait for the container being put, if any, then tell the index and
    /// the catalog cache.
    fn finish_writing(&mut self) -> RepoResult<()> {
        let Some(w) = self.writing.take() else {
            return Ok(());
        };
        let put = w.done.join().map_err(|_| RepoError::Io {
            context: format!("writing container {:x}", w.id),
            cause: std::io::Error::other("the writing thread panicked"),
        });
        let (catalog, len) = match put.and_then(|r| r.map_err(RepoError::from)) {
            Ok(done) => done,
            Err(e) => {
                // Settled lost by the thread (or its guard): unlisted too.
                self.repo.inflight().forget(w.id);
                self.broken = Some(e.to_string());
                return Err(e);
            }
        };
        self.report.containers_written += 1;
        self.report.bytes_written += len;
        tell_index(self.repo, w.id, catalog)
    }

    /// Before the backup object names them: wait for this session's
    /// containers that other sessions seal, and make durable every other
    /// session's container this backup references, sealing and putting
    /// one still open itself (its owner may be idle for an hour).
    fn settle_shared(&mut self) -> RepoResult<()> {
        for p in std::mem::take(&mut self.sealed_by_others) {
            match p.wait_settled() {
                State::Durable(len) => {
                    self.report.containers_written += 1;
                    self.report.bytes_written += len;
                }
                other => return Err(not_durable(p.id, &other)),
            }
        }
        for (_, p) in std::mem::take(&mut self.borrowed) {
            let claimed = self.repo.inflight().claim(&p);
            if claimed {
                seal_claimed(self.repo, &p)?;
            }
            match p.wait_settled() {
                State::Durable(_) => {}
                other => return Err(not_durable(p.id, &other)),
            }
        }
        Ok(())
    }
}

/// Put sealed container `id` and read back its catalog (checking what was
/// put); its length.
fn put_container(
    store: &dyn crate::objects::ObjectStore,
    id: u64,
    bytes: Vec<u8>,
) -> Result<(Catalog, u64), Error> {
    let name = container_name(id);
    store.put(&name, &bytes)?;
    let len = bytes.len() as u64;
    Ok((Container::parse(&name, bytes)?.catalog().clone(), len))
}

/// Tell the index and the catalog cache of durable container `id`, and
/// unlist it from the containers not yet durable.
fn tell_index(repo: &Repository, id: u64, catalog: Catalog) -> RepoResult<()> {
    // A container condemned meanwhile (its session lost: a collection in
    // another process may have deleted it since its put) is not learnt.
    if !repo.protection().is_condemned(id) {
        let catalog = Arc::new(catalog);
        repo.index()?.insert(id, catalog.entries());
        repo.catalog_cache().insert(id, catalog);
    }
    repo.inflight().forget(id);
    Ok(())
}

/// Seal and put container `p`, which the caller claimed while it was open
/// (another session's, or this one's given up), on this thread; settle it
/// either way.
fn seal_claimed(repo: &Repository, p: &Pending) -> RepoResult<()> {
    let _guard = SettleGuard(p);
    let writer = p.writer().take();
    let put = writer
        .ok_or_else(|| writer_gone(p.id))
        .and_then(|w| put_container(&*repo.store, p.id, w.seal()).map_err(RepoError::from));
    match put {
        Ok((catalog, len)) => {
            p.settle(State::Durable(len));
            tell_index(repo, p.id, catalog)
        }
        Err(e) => {
            lose(repo, p, &e);
            Err(e)
        }
    }
}

/// Container `p`, claimed by the caller, will not be written: settle it as
/// lost (a backup reusing it fails instead of waiting) and unlist it.
fn lose(repo: &Repository, p: &Pending, e: &RepoError) {
    p.settle(State::Lost(e.to_string()));
    repo.inflight().forget(p.id);
}

fn writer_gone(id: u64) -> RepoError {
    RepoError::Io {
        context: format!("sealing container {id:x}"),
        cause: std::io::Error::other("its writer is gone: another backup took it"),
    }
}

/// The error for a backup whose segments are in container `id`, which did
/// not become durable.
fn not_durable(id: u64, state: &State) -> RepoError {
    let why = match state {
        State::Lost(why) => why.clone(),
        other => format!("it ended {other:?}"),
    };
    RepoError::Io {
        context: format!("writing container {id:x}, which holds segments of this backup"),
        cause: std::io::Error::other(why),
    }
}

impl Drop for BackupSession<'_> {
    fn drop(&mut self) {
        // A put still running ends before the session's containers are
        // given up, so GC never sees half of one.
        if let Some(w) = self.writing.take() {
            // Indexed if it was written: another backup may reference it,
            // and the index checkpoint will say it covers its id.
            match w.done.join() {
                Ok(Ok((catalog, _))) => {
                    let _ = tell_index(self.repo, w.id, catalog);
                }
                _ => self.repo.inflight().forget(w.id),
            }
        }
        // Containers of other backups this one reused are no longer
        // needed for it (a commit took them all already).
        if !self.borrowed.is_empty() {
            let mut table = self.repo.inflight();
            for id in std::mem::take(&mut self.borrowed).into_keys() {
                table.unwant(self.id, id);
            }
        }
        // The open container is dropped unless another backup references
        // its segments: then it is written, for that backup.
        if let Some(o) = self.open.take() {
            let wanted = self.repo.inflight().abandon(&o.pending);
            if wanted {
                let _ = seal_claimed(self.repo, &o.pending);
            }
        }
        if !self.ended {
            self.repo.protection().abort_session(self.id);
        }
        self.repo.backup_ended();
    }
}

/// Entry `entry` of `catalog`, unless it is absent (or past its end).
fn entry_in(catalog: &Catalog, entry: u32) -> Option<crate::format::Entry> {
    catalog
        .entries()
        .get(entry as usize)
        .copied()
        .filter(|e| !e.is_absent())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::repo::RepoOptions;

    #[test]
    fn a_local_backup_remembers_a_bounded_number_of_sealed_segments() {
        let tmp = tempfile::tempdir().unwrap();
        let options = RepoOptions {
            container_target: 64 << 10,
            ..RepoOptions::default()
        };
        let repo = Repository::init_with(tmp.path(), options).unwrap();
        let mut s = repo.begin_backup("b", "g").unwrap();
        // Distinct 16-byte segments, in many small containers.
        let n = 3 * LOCAL_GENERATION as u64;
        for i in 0..n {
            s.append(&[i.to_le_bytes(), (!i).to_le_bytes()].concat())
                .unwrap();
        }
        let held = s.sealed[0].len() + s.sealed[1].len();
        assert!(
            held <= 2 * LOCAL_GENERATION && held > 0,
            "{held} sealed segments remembered of {n}"
        );
        assert_eq!(s.commit().unwrap().report.segments_new, n);
    }

    #[test]
    fn segments_pushed_a_run_at_a_time_make_the_recipe_one_at_a_time_does() {
        let tmp = tempfile::tempdir().unwrap();
        let repo = Repository::init(tmp.path()).unwrap();
        let mut s = repo.begin_backup("seed", "g").unwrap();
        let data = |i: u32| i.to_le_bytes().repeat(i as usize + 1);
        let refs: Vec<SegmentRef> = (0..40u32)
            .map(|i| {
                let d = data(i);
                let (container, entry, fp) = s.store(&d).unwrap();
                let r = SegmentRef {
                    container,
                    entry,
                    len: d.len() as u32,
                    check: crate::recipe::fingerprint_check(&fp),
                };
                s.push(r, true).unwrap();
                r
            })
            .collect();
        s.commit().unwrap();
        // Runs that end before, on and past part boundaries (parts of 7).
        let runs = [0usize, 3, 4, 7, 1, 0, 15, 10];
        repo.set_recipe_part_segments(7);
        let backup = |name: &str, by_run: bool| {
            let mut s = repo.begin_backup(name, "g").unwrap();
            let mut at = 0;
            for &n in &runs {
                let run = &refs[at..at + n];
                match by_run {
                    true => s.push_all(run, false).unwrap(),
                    false => run.iter().for_each(|r| s.push(*r, false).unwrap()),
                }
                at += n;
            }
            let parts = s
                .parts
                .iter()
                .map(|p| (p.segments, p.bytes))
                .collect::<Vec<_>>();
            let record = s.commit().unwrap();
            (parts, record.report)
        };
        let (one_parts, one) = backup("one", false);
        let (run_parts, run) = backup("run", true);
        assert_eq!(
            one_parts.len(),
            5,
            "40 references in parts of 7, the last 5 at commit"
        );
        assert_eq!(run_parts, one_parts);
        assert_eq!(run.bytes_in, one.bytes_in);
        assert_eq!(run.segments_duplicate, one.segments_duplicate);
        assert_eq!(one.segments_duplicate, 40);
        let image = |name: &str| {
            let mut out = Vec::new();
            repo.restore(name, &mut out).unwrap();
            out
        };
        assert_eq!(image("one"), (0..40).flat_map(data).collect::<Vec<u8>>());
        assert_eq!(image("run"), image("one"));
    }

    #[test]
    fn a_session_a_client_sends_to_remembers_more_than_the_client() {
        let tmp = tempfile::tempdir().unwrap();
        let repo = Repository::init(tmp.path()).unwrap();
        let mut s = repo.begin_backup("b", "g").unwrap();
        let data = b"sent by a client";
        s.append_sent(data, s.segment_hash().of(data)).unwrap();
        assert_eq!(s.generation, SEALED_GENERATION);
    }
}
