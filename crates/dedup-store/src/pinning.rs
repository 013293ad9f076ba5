//! A writing process's side of the many-writers protocol (see
//! `epochs/mod.rs`): apply each
//! new epoch's condemned lists, pin what its backups hold, hand out
//! container ids from reserved ranges, and check a commit against the
//! epochs that began around it.
//!
//! Lock order: the epochs state, then the protection map, then the index
//! and the catalog cache. Nothing takes the epochs state while holding one
//! of the others.

use std::collections::HashSet;
use std::sync::MutexGuard;

use crate::epochs::ids::{self, RANGE};
use crate::epochs::{epochs_after, read_epoch_kept, EpochRecord, Epochs, PinRecord};
use crate::error::repo::RepoResult;
use crate::repo::Repository;

impl Repository {
    pub(crate) fn epochs(&self) -> MutexGuard<'_, Epochs> {
        self.epochs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Write no pins from now on: the protocol broken on purpose, for the
    /// test that shows the model catches it. Never for use.
    #[doc(hidden)]
    pub fn break_protocol_skip_pins(&self) {
        self.epochs().skip_pins = true;
    }

    /// A container id no process has or will hand out, held for
    /// `session` before any pin can leave it out: from this process's
    /// range, or from a new range, reserved and pinned first.
    pub(crate) fn take_container_id(&self, session: u64) -> RepoResult<u64> {
        let mut e = self.epochs();
        let exhausted = e.range.is_none_or(|(start, len)| e.next_id >= start + len);
        if exhausted {
            let floor = e.floor.max(e.next_id);
            let start = ids::reserve(&*self.store, floor, e.writer.as_bytes())?;
            e.range = Some((start, RANGE));
            e.next_id = start;
            e.floor = start + RANGE;
            e.dirty = true;
        }
        if e.dirty {
            // The pin holds the range's ids not handed out yet: none is
            // handed out before a pin (this one, or one that failed
            // before) holds it.
            self.refresh_locked(&mut e)?;
        }
        let id = e.next_id;
        e.next_id += 1;
        // Held from birth, under the epochs lock: a pin written after
        // this (which no longer has it in its range) holds it as held.
        self.protection().hold(session, id);
        Ok(id)
    }

    /// Hold `containers` for `session` (false if one is condemned: the
    /// caller must then not reference it; the others are held).
    /// One no backup of this process holds yet is pinned first, and the
    /// epochs listed again until none began since the pin: a collection
    /// that looks after that does not condemn it, and one that began
    /// before is applied here, the container refused if it condemned it,
    /// before any backup references it. Only a collection already looking
    /// as the pin was put can still condemn it, seen at the next look
    /// (pinned there while its epoch is the newest). Pinned only at the
    /// next look, any collection before that could condemn what a
    /// deleted backup left and a backup reused, and one more stop the
    /// backup.
    pub(crate) fn hold_pinned(&self, session: u64, containers: &[u64]) -> RepoResult<bool> {
        let mut e = self.epochs();
        let fresh: Vec<u64> = {
            let p = self.protection();
            let mut fresh: Vec<u64> = containers
                .iter()
                .copied()
                .filter(|&c| !p.is_condemned(c) && !p.kept_here(c))
                .collect();
            fresh.sort_unstable();
            fresh.dedup();
            fresh
        };
        if !fresh.is_empty() {
            e.about_to_hold = fresh;
            e.dirty = true;
            let pinned = self.refresh_locked(&mut e);
            e.about_to_hold.clear();
            pinned?;
        }
        // Under the epochs lock: no pin written meanwhile left them out.
        // Each is held that can be, even past one condemned.
        let mut p = self.protection();
        let held = containers.iter().filter(|&&c| p.hold(session, c)).count();
        Ok(held == containers.len())
    }

    /// Apply the epochs begun since the last call and pin what this
    /// process holds if they condemned any of it (or if something new
    /// must be pinned); backups holding what an epoch condemned that the
    /// next one may already have deleted are lost (`Protection::is_lost`).
    /// The epoch this process is at.
    pub(crate) fn refresh_epochs(&self) -> RepoResult<u64> {
        let mut e = self.epochs();
        self.refresh_locked(&mut e)?;
        Ok(e.applied)
    }

    /// `refresh_epochs`, unless the epochs were listed within the look
    /// interval and nothing is due (`Epochs::looked_lately`): for the
    /// looks that only keep a backup paced with collections.
    pub(crate) fn keep_up_epochs(&self) -> RepoResult<u64> {
        let mut e = self.epochs();
        if !e.looked_lately() {
            self.refresh_locked(&mut e)?;
        }
        Ok(e.applied)
    }

    /// List the epochs for keeping up at most every `interval` (0: at
    /// every seal and recipe part), instead of `LOOK_INTERVAL`: for the
    /// model tests, which run both ways.
    #[doc(hidden)]
    pub fn set_look_interval(&self, interval: std::time::Duration) {
        self.epochs().look_interval = interval;
    }

    /// A session is about to put `objects`, which its backup object will
    /// name: announced in the protection map and pinned before the puts.
    pub(crate) fn announce(&self, session: u64, objects: &[&str]) -> RepoResult<()> {
        if objects.is_empty() {
            return self.refresh_epochs().map(drop);
        }
        let mut e = self.epochs();
        {
            let mut p = self.protection();
            for object in objects {
                p.will_write(session, object);
            }
        }
        e.dirty = true;
        self.refresh_locked(&mut e)
    }

    fn refresh_locked(&self, e: &mut Epochs) -> RepoResult<()> {
        // A pin due within the look interval of the last listing is put
        // at once: the listing after it finds any epoch begun meanwhile,
        // as one before it would have (and one begun just after that
        // listing is the same case), so the listing before is only a
        // request more.
        if e.dirty && e.listed_lately() && !self.pin_and_look_again(e)? {
            return Ok(());
        }
        loop {
            let after = e.started.then_some(e.applied);
            let newer = epochs_after(&*self.store, after)?;
            e.listed = Some(std::time::Instant::now());
            if newer.is_empty() {
                let first = !e.started;
                e.started = true;
                if !e.dirty {
                    if !first {
                        // Listed after the pin at `applied` was written:
                        // the next collection began after it was visible.
                        e.at_risk = Default::default();
                    }
                    return Ok(());
                }
            } else {
                // Past `applied` before its pin was known visible: what
                // was at risk there may be deleted.
                let risk = std::mem::take(&mut e.at_risk);
                self.lose(&risk);
                if e.started && newer[0] != e.applied + 1 {
                    // Epochs were begun and deleted as old while this
                    // process looked away.
                    self.lost_track();
                }
                let newest = *newer.last().expect("not empty");
                for &epoch in &newer {
                    let Some(record) = read_epoch_kept(&*self.store, &mut e.records, epoch)? else {
                        // Deleted as old since the listing, or unreadable
                        // here: what it condemned is unknown.
                        self.lost_track();
                        continue;
                    };
                    let held = self.apply_condemned(&record)?;
                    if epoch < newest {
                        self.lose(&held);
                    } else {
                        e.at_risk = held;
                    }
                }
                e.applied = newest;
                e.started = true;
                // A pin at the new epoch is due.
                e.dirty = true;
            }
            if !self.pin_and_look_again(e)? {
                return Ok(());
            }
        }
    }

    /// Pin what is held at `e.applied`; whether the epochs must be listed
    /// again (false: nothing held, so nothing pinned and nothing at
    /// risk).
    fn pin_and_look_again(&self, e: &mut Epochs) -> RepoResult<bool> {
        // Stays dirty (and at risk) if the put fails: the next look pins
        // again, or loses what was at risk.
        let pinned = self.write_pin(e)?;
        e.dirty = false;
        if !pinned {
            e.at_risk = Default::default();
            return Ok(false);
        }
        // The epochs are listed again after every pin, to know whether it
        // was visible before the next collection began: then that
        // collection honours it, and what is held (or about to be) is safe
        // until the one after; if not, what was at risk at the pinned
        // epoch is lost, and the pin is put again at the newest.
        Ok(true)
    }

    /// This process no longer knows what collections condemned (epochs
    /// it missed, or a record it cannot read): what its running backups
    /// hold may be gone, and so may any container it has a catalog of (a
    /// read finds a deleted one gone; what a missed epoch condemned was
    /// deleted by the next, long begun).
    fn lost_track(&self) {
        self.protection().lose_all();
        self.catalog_cache().forget_all();
    }

    /// The backups holding `held` (containers, objects) are lost, and
    /// the containers, which a collection may have deleted, are never
    /// handed out again.
    fn lose(&self, held: &(Vec<u64>, Vec<String>)) {
        if held.0.is_empty() && held.1.is_empty() {
            return;
        }
        {
            let mut p = self.protection();
            p.lose_holding(&held.0, &held.1);
            p.condemn_even_held(&held.0);
        }
        let gone: HashSet<u64> = held.0.iter().copied().collect();
        {
            let mut cache = self.catalog_cache();
            for &id in &gone {
                cache.forget(id);
            }
        }
        if let Ok(mut index) = self.index() {
            index.forget(&gone);
        }
    }

    /// Condemn here what `record` condemned and this process does not
    /// hold (never handed out again, dropped from the index and the
    /// catalog cache); the containers and objects it holds of them.
    fn apply_condemned(&self, record: &EpochRecord) -> RepoResult<(Vec<u64>, Vec<String>)> {
        let (unheld, held_objects, mut held) = {
            let mut p = self.protection();
            let unheld: HashSet<u64> = p
                .condemn(record.condemned.iter().copied())
                .into_iter()
                .collect();
            // Those held here too are never handed out again to a backup
            // that does not hold them yet: its hold would rest on this
            // process's pins, and once their holders end (a commit, or
            // giving up) the next pin no longer lists them, while a
            // collection that honoured the old pin may delete them after
            // reading the new one. All for good: a compaction here that
            // condemned one first must not release it.
            p.condemn_even_held(&record.condemned);
            // To be compacted: its dead entries are never handed out; a
            // container held here must be pinned (its backups may
            // reference one of them).
            let kept = p.kept();
            let mut held: Vec<u64> = Vec::new();
            for (id, live) in &record.compact {
                p.restrict(*id, live.clone());
                if kept.contains(id) {
                    held.push(*id);
                }
            }
            let pending = p.pending_objects();
            let held_objects: Vec<String> = record
                .objects
                .iter()
                .filter(|o| pending.contains(*o))
                .cloned()
                .collect();
            (unheld, held_objects, held)
        };
        held.extend(record.condemned.iter().filter(|c| !unheld.contains(c)));
        // Those to delete leave the index and the cache; those to compact
        // stay, their live entries still found.
        let doomed = unheld;
        {
            let mut cache = self.catalog_cache();
            for &id in &doomed {
                cache.forget(id);
            }
        }
        if let Ok(mut index) = self.index() {
            index.forget(&doomed);
        }
        Ok((held, held_objects))
    }

    /// Pin what this process holds at its epoch; false if it holds
    /// nothing (no pin written).
    fn write_pin(&self, e: &mut Epochs) -> RepoResult<bool> {
        let (mut containers, mut objects) = {
            let p = self.protection();
            let mut kept = p.kept();
            kept.extend(e.about_to_hold.iter().copied());
            (
                kept.into_iter().collect::<Vec<_>>(),
                p.pending_objects().into_iter().collect::<Vec<_>>(),
            )
        };
        // The ids not handed out yet: one handed out is held by its
        // session from birth, and pinned as held while it is.
        let ranges: Vec<(u64, u64)> = e
            .range
            .map(|(start, len)| (e.next_id, start + len - e.next_id))
            .filter(|&(_, len)| len > 0)
            .into_iter()
            .collect();
        if containers.is_empty() && objects.is_empty() && ranges.is_empty() {
            return Ok(false);
        }
        if e.skip_pins {
            return Ok(true);
        }
        containers.sort_unstable();
        objects.sort_unstable();
        let pin = PinRecord {
            epoch: e.applied,
            process: crate::process::tag(),
            containers,
            ranges,
            objects,
        };
        let name = PinRecord::object_name(e.applied, &e.writer, e.pins);
        e.pins += 1;
        if let Err(err) = self.store.put(&name, &pin.encode()) {
            e.stray_pins.push(name);
            return Err(err.into());
        }
        // The newer pin holds all the older held that is still held (a
        // backup released since committed, its object put first, or gave
        // up), at an epoch no older: a collection that listed the older
        // and finds it gone lists the pins again (`pinned_from`). Best
        // effort: collections expire it anyway.
        if let Some(old) = e.last_pin.replace(name) {
            if self.store.delete(&old).is_err() {
                e.stray_pins.push(old);
            }
        }
        Ok(true)
    }

    /// This process outlives its backups (a server): from now on, when
    /// its last running backup ends, its pin is replaced.
    pub(crate) fn repin_when_idle(&self) {
        self.epochs().repin_when_idle = true;
    }

    /// A backup ended. When it was the last and this process lives on,
    /// its pin, which may hold what the backups held, is replaced by one
    /// that holds only the id range (or deleted if there is none): else
    /// every collection would wait for this process to look
    /// (`gc/pace.rs`), which it does only when a backup runs. Best
    /// effort: collections expire the old pin anyway.
    pub(crate) fn backup_ended(&self) {
        let mut e = self.epochs();
        if !e.repin_when_idle || e.last_pin.is_none() || self.protection().sessions() > 0 {
            return;
        }
        if let Ok(false) = self.write_pin(&mut e) {
            if let Some(old) = e.last_pin.take() {
                if self.store.delete(&old).is_err() {
                    e.stray_pins.push(old);
                }
            }
        }
    }

    /// The pins this process wrote, deleted at close (when no backup
    /// runs): best effort, as collections expire them anyway.
    pub(crate) fn drop_own_pins(&self) {
        let mut e = self.epochs();
        if e.pins == 0 || e.skip_pins {
            return;
        }
        let mut mine = std::mem::take(&mut e.stray_pins);
        mine.extend(e.last_pin.take());
        for name in &mine {
            let _ = self.store.delete(name);
        }
    }
}
