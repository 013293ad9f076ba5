//! The mark phase (§3.3, step 1): reuse the saved marks of groups whose
//! backups are unchanged, mark the changed groups from their recipes, save
//! the compaction candidates, then the new marks (put new, delete old),
//! and drop the marks of groups with no backups left.

use std::collections::{BTreeMap, BTreeSet};

use crate::backup::BackupRecord;
use crate::error::repo::{RepoError, RepoResult};
use crate::error::Error;
use crate::gc::candidates::Candidates;
use crate::gc::marks::{Marks, MARKS_PREFIX};
use crate::gc::{GcOptions, GcReport};
use crate::recipe::parts::RecipeParts;
use crate::repo::Repository;

/// A group's saved marks objects (generation, name), every generation.
type Versions = Vec<(u64, String)>;

/// Each group's marks objects and newest readable marks, as the last look
/// of this GC left them, so that its later looks neither list nor read
/// them again. Marks are exact for the backups they name whoever wrote
/// them, and each look still lists the backups; a collector beside this
/// one that put a newer generation (or a group's first, for a group that
/// appeared between this GC's looks) only makes this one's next put of
/// that generation fail (`GcRunning`).
pub(super) type SeenMarks = Option<BTreeMap<String, (Versions, Option<Marks>)>>;

impl Repository {
    /// Every group's current marks, left in `seen`: saved ones reused
    /// where the group's backups are unchanged, the others computed and
    /// saved (new generation first, then the old ones deleted); marks of
    /// groups with no backups deleted.
    pub(super) fn mark(
        &self,
        backups: &[BackupRecord],
        c: &mut Candidates,
        seen: &mut SeenMarks,
        options: &GcOptions,
        report: &mut GcReport,
    ) -> RepoResult<()> {
        let mut groups: BTreeMap<&str, BTreeMap<String, String>> = BTreeMap::new();
        for b in backups {
            groups
                .entry(&b.group)
                .or_default()
                .insert(b.name.clone(), b.recipe.clone());
        }
        // Saved marks objects by group, every generation, with the newest
        // readable marks.
        let mut saved = match seen.take() {
            Some(known) => known,
            None => {
                let mut listed: BTreeMap<String, Versions> = BTreeMap::new();
                for object in self.store.list(MARKS_PREFIX)? {
                    if let Some((group, generation)) = Marks::parse_name(&object) {
                        listed.entry(group).or_default().push((generation, object));
                    }
                }
                listed
                    .into_iter()
                    .map(|(g, versions)| {
                        let m = self.newest_marks(&versions);
                        (g, (versions, m))
                    })
                    .collect()
            }
        };
        // Those of each group that has backups; the rest are dropped.
        let mut old: BTreeMap<&str, (Versions, Option<Marks>)> = BTreeMap::new();
        for group in groups.keys() {
            old.insert(group, saved.remove(*group).unwrap_or_default());
        }
        let unchanged = |g: &str| old[g].1.as_ref().is_some_and(|m| m.backups == groups[g]);
        let to_read: u64 = groups
            .iter()
            .filter(|(g, _)| !unchanged(g))
            .map(|(g, set)| match &old[g].1 {
                Some(m) if m.counts.is_some() => changes(m, set).count() as u64,
                _ => set.len() as u64,
            })
            .sum();
        let tick = |report: &mut GcReport| {
            report.recipes_read += 1;
            if let Some(p) = options.progress {
                p("mark", report.recipes_read, to_read);
            }
        };
        // Mark the changed groups (in memory for now).
        let mut out = BTreeMap::new();
        let mut remarked = Vec::new();
        for (group, set) in &groups {
            if let Some(m) = old[group].1.as_ref().filter(|m| m.backups == *set) {
                report.groups_reused += 1;
                out.insert(group.to_string(), m.clone());
                continue;
            }
            let by_change = match &old[group].1 {
                Some(before) if before.counts.is_some() => {
                    self.mark_changes(before, set, &mut |r| tick(r), report)?
                }
                _ => None,
            };
            let m = match by_change {
                Some(m) => m,
                None => {
                    let mut m = Marks::counted(group);
                    for (name, recipe) in set {
                        // Marked apart and added only if the backup is
                        // still there: a delete seen half-way leaves no
                        // marks behind.
                        let mut one = Marks::new(group);
                        if self.mark_recipe(&mut one, name, recipe)? {
                            m.add_backup(name, recipe, &one);
                        }
                        tick(report);
                    }
                    m
                }
            };
            remarked.push(*group);
            out.insert(group.to_string(), m);
        }
        // Containers that may have lost entries since the last collection:
        // those whose entries in a changed group's marks differ from its
        // old marks', those the marks of emptied groups reference, and
        // those no old marks reference (written since; a backup that used
        // them may already be deleted). A container whose entries are the
        // same in every group's old and new marks lost none, and its
        // catalog is not read again: the work follows the change (one
        // version deleted of ten read every catalog of the group before).
        // Saved before any marks change, so a GC that dies before
        // compacting leaves them for the next.
        {
            let dropped: Vec<&Marks> = saved.values().filter_map(|(_, m)| m.as_ref()).collect();
            let old_marks = || {
                old.values()
                    .filter_map(|(_, m)| m.as_ref())
                    .chain(dropped.iter().copied())
            };
            let known: BTreeSet<u64> = old_marks()
                .flat_map(|m| m.containers.keys().copied())
                .collect();
            // Added with no share: its marks changed, so it is looked at
            // again whatever share an earlier look found.
            let mut ids = c.ids.clone();
            let mut add = |id: &u64| {
                ids.insert(*id, None);
            };
            for g in &remarked {
                let now = &out[*g].containers;
                if let Some(before) = &old[g].1 {
                    before
                        .containers
                        .iter()
                        .filter(|(id, bits)| !same_entries(bits, now.get(id)))
                        .for_each(|(id, _)| add(id));
                }
                now.keys()
                    .filter(|id| !known.contains(id))
                    .for_each(&mut add);
            }
            for m in &dropped {
                m.containers.keys().for_each(&mut add);
            }
            if ids != c.ids {
                self.save_candidates(c, &ids)?;
            }
        }
        // Save: the changed groups' new marks first, then old versions go.
        let mut left = BTreeMap::new();
        for (group, (versions, _)) in &old {
            let m = out
                .remove(*group)
                .expect("every group with backups is marked");
            let kept = if remarked.contains(group) {
                let generation = versions.iter().map(|(g, _)| g + 1).max().unwrap_or(0);
                let object = Marks::object_name(group, generation);
                self.store.put(&object, &m.encode())?;
                self.delete_marks(versions, None)?;
                report.groups_remarked += 1;
                (generation, object)
            } else {
                let kept = newest(versions);
                self.delete_marks(versions, Some(&kept.1))?;
                kept.clone()
            };
            left.insert(group.to_string(), (vec![kept], Some(m)));
        }
        // Groups with no backups left.
        for (versions, _) in saved.values() {
            self.delete_marks(versions, None)?;
            report.groups_dropped += 1;
        }
        *seen = Some(left);
        Ok(())
    }

    /// The group's marks from its counted marks `before`, changed to the
    /// backups `set`: the references of the backups `before` counted that
    /// are gone are taken out (their recipes, which `delete` leaves to the
    /// collection, read once more), those of new backups added. `None` if
    /// a gone backup's recipe does not read or its references do not
    /// match the counts: the group is then marked from all its recipes.
    fn mark_changes(
        &self,
        before: &Marks,
        set: &BTreeMap<String, String>,
        tick: &mut dyn FnMut(&mut GcReport),
        report: &mut GcReport,
    ) -> RepoResult<Option<Marks>> {
        let mut m = before.clone();
        for (name, recipe) in changes(before, set) {
            let mut one = Marks::new(&before.group);
            tick(report);
            if before.backups.get(name) == Some(recipe) {
                // Gone (or another backup by that name now).
                if !(self.recipe_marks(&mut one, recipe) && m.remove_backup(name, &one)) {
                    return Ok(None);
                }
            } else if self.mark_recipe(&mut one, name, recipe)? {
                m.add_backup(name, recipe, &one);
            }
        }
        Ok(Some(m))
    }

    /// Mark what `recipe` references, however it ends; false if any of it
    /// did not read (for a backup already gone, whose recipe only counts).
    fn recipe_marks(&self, m: &mut Marks, recipe: &str) -> bool {
        RecipeParts::open(&*self.store, recipe).is_ok_and(|p| self.mark_parts(m, p).is_ok())
    }

    /// Mark what every part of `parts` references; the first part that
    /// does not read stops it.
    fn mark_parts(&self, m: &mut Marks, mut parts: RecipeParts) -> RepoResult<()> {
        while let Some(part) = parts.next_part(&*self.store) {
            m.mark(&part?.1);
        }
        Ok(())
    }

    /// The newest readable marks among `versions`; damaged ones are only
    /// a cost (the group is marked again).
    fn newest_marks(&self, versions: &[(u64, String)]) -> Option<Marks> {
        let object = versions.iter().max_by_key(|(g, _)| *g).map(|(_, o)| o)?;
        let bytes = self.store.get(object).ok()?;
        Marks::decode(object, &bytes).ok()
    }

    fn delete_marks(&self, versions: &[(u64, String)], keep: Option<&str>) -> RepoResult<()> {
        for (_, object) in versions {
            if Some(object.as_str()) != keep {
                self.delete_if_there(object)?;
            }
        }
        Ok(())
    }

    /// Mark what backup `name`'s recipe references, one part at a time;
    /// false if the backup was deleted since it was listed. A recipe (or a
    /// part of one) missing under a backup that is still there, or a
    /// damaged one, stops the GC.
    fn mark_recipe(&self, m: &mut Marks, name: &str, recipe: &str) -> RepoResult<bool> {
        let deleted = || match self.backup(name) {
            Err(RepoError::NoSuchBackup { .. }) => Ok(true),
            Ok(b) => Ok(b.recipe != recipe),
            Err(e) => Err(e),
        };
        let stopped = |e: RepoError| match e {
            RepoError::Corrupt { object, detail } => RepoError::Corrupt {
                object,
                detail: format!("{detail}; garbage collection stopped before deleting anything"),
            },
            e => e,
        };
        let parts = match RecipeParts::open(&*self.store, recipe) {
            Ok(parts) => parts,
            Err(RepoError::Store(Error::NotFound { .. })) if deleted()? => return Ok(false),
            Err(RepoError::Store(Error::NotFound { .. })) => {
                return Err(RepoError::corrupt(
                    recipe,
                    format!("missing, but backup {name} needs it; garbage collection stopped before deleting anything"),
                ))
            }
            Err(e) => return Err(stopped(e)),
        };
        match self.mark_parts(m, parts) {
            Ok(()) => Ok(true),
            // Deleted since it was listed, and its parts collected by a
            // collection beside this one.
            Err(_) if deleted()? => Ok(false),
            Err(e) => Err(stopped(e)),
        }
    }
}

/// The backups (name, recipe) counted in `before` that `set` no longer
/// has, then those of `set` that `before` did not count: the backups whose
/// recipes a change of the group reads.
fn changes<'a>(
    before: &'a Marks,
    set: &'a BTreeMap<String, String>,
) -> impl Iterator<Item = (&'a String, &'a String)> {
    let gone = before
        .backups
        .iter()
        .filter(|(name, recipe)| set.get(*name) != Some(*recipe));
    let new = set
        .iter()
        .filter(|(name, recipe)| before.backups.get(*name) != Some(*recipe));
    gone.chain(new)
}

/// Whether `before` and `now` mark the same entries of a container
/// (trailing zero bytes aside; `None`: none now).
fn same_entries(before: &[u8], now: Option<&Vec<u8>>) -> bool {
    let now = now.map_or(&[][..], |v| v.as_slice());
    let trim = |b: &[u8]| b.len() - b.iter().rev().take_while(|&&x| x == 0).count();
    before[..trim(before)] == now[..trim(now)]
}

/// The object of the highest generation.
fn newest(versions: &[(u64, String)]) -> &(u64, String) {
    versions
        .iter()
        .max_by_key(|(g, _)| *g)
        .expect("a saved group has at least one marks object")
}
