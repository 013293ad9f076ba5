//! One collection, epoch *n* (see `epochs/` and FORMATS.md): find what is
//! referenced (marks of the committed backups, pins of epoch *n*-1 and
//! later, this process's running backups), condemn the rest in the epoch
//! record `gc/epoch-<n>`, whose creation begins the epoch, then delete
//! what collection *n*-1 condemned that a second look, made after epoch
//! *n* began, still finds unreferenced.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use crate::backup::{RECIPES_PREFIX, TREES_PREFIX};
use crate::epochs::{self, pinned_from, EpochRecord, Pinned};
use crate::error::repo::{RepoError, RepoResult};
use crate::error::Error;
use crate::gc::candidates::Candidates;
use crate::gc::mark::SeenMarks;
use crate::gc::marks::Marks;
use crate::gc::{GcOptions, GcReport};
use crate::repo::Repository;

/// What one look at the repository found referenced.
struct View {
    /// Each live container's entries in use (a bitmap).
    live: BTreeMap<u64, Vec<u8>>,
    /// Recipes (standing for their parts) and trees no readable backup
    /// names, no pin holds and no session of this process is writing.
    unnamed: BTreeSet<String>,
    /// The objects listed that they stand for (parts included).
    orphans: BTreeSet<String>,
    pinned: Pinned,
    /// What is referenced cannot be known (a damaged backup's suspect
    /// recipe did not read): nothing may be condemned or deleted.
    withheld: bool,
}

impl View {
    fn keeps(&self, kept: &HashSet<u64>, id: u64) -> bool {
        self.live.contains_key(&id) || self.pinned.holds(id) || kept.contains(&id)
    }
}

impl Repository {
    /// Collection `newest + 1`. Refused with `GcRunning` if another
    /// collector created that epoch first.
    pub(super) fn collect(
        &self,
        candidates: &mut Candidates,
        seen: &mut SeenMarks,
        options: &GcOptions,
        report: &mut GcReport,
    ) -> RepoResult<()> {
        let newest = epochs::newest(&*self.store)?;
        let waited = std::time::Instant::now();
        let (behind, slept) = self.wait_for_writers(newest, options.writer_wait)?;
        report.writers_not_caught_up += behind;
        report.seconds_waiting_for_writers += waited.elapsed().as_secs_f64();
        // Another collector may have begun an epoch while this one waited.
        let prev = match slept {
            true => epochs::newest(&*self.store)?,
            false => newest,
        };
        let n = prev + 1;
        // `None`: unreadable or gone, and what it condemned is never
        // deleted.
        let previous = match prev {
            0 => None,
            _ => self.epoch_record(prev)?,
        };
        // Listed before the pins: a container put after its writer's pin
        // was visible is then listed only if the pin is too.
        let all = self.store_container_ids()?;
        let view = self.look(prev, candidates, seen, options, report)?;
        if view.withheld {
            report.sweep_withheld = true;
            return Ok(());
        }
        report.containers = all.len() as u64;
        let kept = self.protection().kept();
        // A pin that does not read may hold anything: nothing is condemned
        // or deleted, but the epoch still begins, so that the pin expires
        // two collections on (and is deleted) instead of stopping every
        // collection for ever.
        let unsure = !view.pinned.damaged.is_empty();
        let condemned: Vec<u64> = all
            .iter()
            .copied()
            .filter(|&id| !unsure && !view.keeps(&kept, id))
            .collect();
        report.containers_protected = all
            .iter()
            .filter(|id| !view.live.contains_key(id) && view.keeps(&kept, **id))
            .count() as u64;
        // Not those with a compacted version already there: a compaction
        // that died, or one still running. Out of the epochs' lists, they
        // are soon not one a collection may be compacting, and the
        // leftover goes (`finish_compactions`); then they are listed again.
        let leftovers: HashSet<u64> = self
            .store
            .list(crate::container::COMPACTED_PREFIX)?
            .iter()
            .filter_map(|o| o.strip_prefix(crate::container::COMPACTED_PREFIX))
            .filter_map(|h| u64::from_str_radix(h, 16).ok())
            .collect();
        let skip = |id: u64| view.pinned.holds(id) || kept.contains(&id) || leftovers.contains(&id);
        // Compacting candidates, each with the entries live now.
        // Not those this collection compacts below (looked at again by
        // the next, if still candidates).
        let compacting: HashSet<u64> = previous
            .iter()
            .flat_map(|p| p.compact.iter().map(|(id, _)| *id))
            .collect();
        let (compact, left) = if options.compact_below > 0.0 && !unsure {
            let mut ids = candidates.ids.clone();
            ids.retain(|id, _| !compacting.contains(id));
            let (compact, mut left) =
                self.compaction_verdicts(&ids, &view.live, &skip, options, report)?;
            for id in candidates.ids.keys().filter(|id| compacting.contains(id)) {
                left.insert(*id, None);
            }
            (compact, left)
        } else {
            (Vec::new(), candidates.ids.clone())
        };
        let record = EpochRecord {
            epoch: n,
            condemned,
            compact,
            objects: match unsure {
                true => Vec::new(),
                false => view.unnamed.iter().cloned().collect(),
            },
        };
        match self
            .store
            .put(&EpochRecord::object_name(n), &record.encode())
        {
            Ok(()) => epochs::keep_epoch(&mut self.epochs().records, record.clone()),
            Err(Error::Exists { .. }) => return Err(RepoError::GcRunning),
            Err(e) => return Err(e.into()),
        }
        // This process's own backups learn of it at once.
        self.refresh_epochs()?;
        if left != candidates.ids {
            self.save_candidates(candidates, &left)?;
        }
        let Some(previous) = previous.filter(|_| !unsure) else {
            report.sweep_withheld |= unsure;
            return self.expire(n, &view.pinned);
        };
        // The second look, made after epoch n began.
        let mut scratch = GcReport::default();
        let again = self.look(prev, candidates, seen, options, &mut scratch)?;
        report.recipes_read += scratch.recipes_read;
        if again.withheld || !again.pinned.damaged.is_empty() {
            report.sweep_withheld = true;
            return self.expire(n, &again.pinned);
        }
        // Compacted versions left by crashes, but of the containers a
        // collection may be compacting now: the previous (epoch n-2's
        // list), this one (n-1's) and the next (n's).
        let older = match prev.checked_sub(1).filter(|&e| e > 0) {
            None => Some(Vec::new()),
            Some(e) => self.epoch_record(e)?.map(|r| r.compact),
        };
        if let Some(older) = older {
            let running: HashSet<u64> = older
                .iter()
                .chain(&previous.compact)
                .chain(&record.compact)
                .map(|(id, _)| *id)
                .collect();
            // Only where this collection listed leftovers before its
            // epoch: one left since is the next collection's to finish.
            if !leftovers.is_empty() && self.still_newest(n)? {
                self.finish_compactions(Some(&running))?;
            }
        }
        let kept = self.protection().kept();
        let doomed: Vec<u64> = previous
            .condemned
            .iter()
            .copied()
            .filter(|&id| !again.keeps(&kept, id))
            .collect();
        if !self.sweep_containers(&doomed, n, options, report)? {
            return Ok(());
        }
        if options.compact_below > 0.0 && !previous.compact.is_empty() && self.still_newest(n)? {
            let skip = |id: u64| again.pinned.holds(id);
            // An entry goes only if it was dead at both looks: one dead at
            // the first was refused by every writer since it applied the
            // epoch (and a writer holding the container pinned it).
            let mut live = BTreeMap::new();
            for (id, first) in &previous.compact {
                if let Some(now) = again.live.get(id) {
                    let len = first.len().max(now.len());
                    let bits = (0..len)
                        .map(|i| {
                            first.get(i).copied().unwrap_or(0) | now.get(i).copied().unwrap_or(0)
                        })
                        .collect();
                    live.insert(*id, bits);
                }
            }
            let ids: Vec<u64> = previous.compact.iter().map(|(id, _)| *id).collect();
            let settled = self.compact_now(&ids, &live, &skip, n, options, report)?;
            if !settled.is_empty() {
                let mut ids = candidates.ids.clone();
                for id in settled {
                    ids.remove(&id);
                }
                self.save_candidates(candidates, &ids)?;
            }
        }
        // Orphaned then and now (parts of a recipe with it).
        let pending = self.protection().pending_objects();
        let orphaned: BTreeSet<&str> = previous
            .objects
            .iter()
            .map(String::as_str)
            .filter(|o| again.unnamed.contains(*o) && !pending.contains(*o))
            .collect();
        for object in &again.orphans {
            if orphaned.contains(crate::recipe::parts::recipe_of(object))
                && self.delete_if_there(object)?
            {
                report.orphans_removed += 1;
            }
        }
        self.expire(n, &again.pinned)
    }

    /// Look at what is referenced now: recipes and trees listed first,
    /// then what this process's sessions are about to commit, then the
    /// pins, then the backups (an object listed here either belongs to a
    /// writer still running, which announced and pinned it before putting
    /// it, or to a backup object already put, or to none).
    fn look(
        &self,
        prev: u64,
        candidates: &mut Candidates,
        seen: &mut SeenMarks,
        options: &GcOptions,
        report: &mut GcReport,
    ) -> RepoResult<View> {
        let mut named = self.store.list(RECIPES_PREFIX)?;
        named.extend(self.store.list(TREES_PREFIX)?);
        let pending = self.protection().pending_objects();
        let own = self.epochs().writer().to_string();
        let pinned = pinned_from(&*self.store, prev, &own)?;
        let listing = self.list_backups_all()?;
        let damaged: BTreeSet<&str> = listing.damaged.iter().map(|d| d.name.as_str()).collect();
        let backups = &listing.backups;
        report.backups = backups.len() as u64;
        report.backups_damaged = damaged.len() as u64;
        let referenced: BTreeSet<&str> = backups
            .iter()
            .flat_map(|b| std::iter::once(b.recipe.as_str()).chain(b.tree.as_deref()))
            .collect();
        // Recipes (a recipe's parts live and die with it) and trees no
        // readable backup names, and no writer is about to commit.
        let owners: BTreeSet<&str> = named
            .iter()
            .map(|o| crate::recipe::parts::recipe_of(o))
            .collect();
        let unnamed: Vec<&str> = owners
            .into_iter()
            .filter(|o| {
                !referenced.contains(o) && !pending.contains(*o) && !pinned.objects.contains(*o)
            })
            .collect();
        // Those named for a damaged backup object (`<prefix><name>-<nonce>`,
        // as every writer names them) may be its: they are suspects, kept
        // with what they reference. A recipe a delete left for the
        // collection is an orphan like any other.
        let suspect = |o: &str| owner_name(o).is_some_and(|n| damaged.contains(n));
        let (unnamed, suspected): (Vec<&str>, Vec<&str>) =
            unnamed.into_iter().partition(|o| !suspect(o));
        let orphan_of = |set: &[&str]| -> Vec<&str> {
            named
                .iter()
                .map(String::as_str)
                .filter(|o| set.contains(&crate::recipe::parts::recipe_of(o)))
                .collect()
        };
        let (orphans, kept) = (orphan_of(&unnamed), orphan_of(&suspected));
        let suspects = (!damaged.is_empty()).then(|| self.mark_suspects(&kept));
        report.orphans_kept = kept.len() as u64;
        self.mark(backups, candidates, seen, options, report)?;
        let marks = seen
            .iter()
            .flat_map(|s| s.values().filter_map(|(_, m)| m.as_ref()));
        let mut union = Marks::default();
        for m in marks.chain(suspects.as_ref().map(|s| &s.marks)) {
            union.merge(m);
        }
        let owned = |v: Vec<&str>| v.into_iter().map(str::to_string).collect();
        Ok(View {
            live: union.containers,
            unnamed: owned(unnamed),
            orphans: owned(orphans),
            withheld: suspects.as_ref().is_some_and(|s| s.unknown),
            pinned,
        })
    }

    /// Epoch `epoch`'s record, read once by this process
    /// (`epochs::read_epoch_kept`).
    fn epoch_record(&self, epoch: u64) -> RepoResult<Option<EpochRecord>> {
        epochs::read_epoch_kept(&*self.store, &mut self.epochs().records, epoch)
    }

    /// Delete the pins no collection from `n` on honours (older than
    /// epoch `n`-1) and the epoch records older than `n`-3 (four kept).
    fn expire(&self, n: u64, pinned: &Pinned) -> RepoResult<()> {
        for (epoch, name) in &pinned.all {
            if epoch + 1 < n {
                self.delete_if_there(name)?;
            }
        }
        for epoch in epochs::epochs_after(&*self.store, None)? {
            if epoch + 3 < n {
                self.delete_if_there(&EpochRecord::object_name(epoch))?;
            }
        }
        Ok(())
    }
}

/// The backup a recipe or tree object (`recipes/<name>-<nonce>`,
/// `trees/<name>-<nonce>`, nonce 16 hex digits) was written for.
fn owner_name(object: &str) -> Option<&str> {
    let rest = object
        .strip_prefix(RECIPES_PREFIX)
        .or_else(|| object.strip_prefix(TREES_PREFIX))?;
    let (name, nonce) = rest.rsplit_once('-')?;
    (nonce.len() == 16 && nonce.bytes().all(|b| b.is_ascii_hexdigit())).then_some(name)
}
