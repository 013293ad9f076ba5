//! Checking the repository's own objects: the config, the backup objects
//! and the recipes they name, with their parts. A recipe no backup names is
//! garbage (a backup that died before its commit point leaves one), not
//! damage.

use std::collections::{BTreeMap, BTreeSet};

use crate::backup::{BackupRecord, RECIPES_PREFIX};
use crate::config::{RepoConfig, CONFIG_OBJECT};
use crate::error::repo::RepoError;
use crate::objects::ObjectStore;
use crate::recipe::parts::{part_name, part_of, read_part, RecipeObject};
use crate::recipe::Recipe;

use super::{backup_of, detail, CheckPhase, CheckProgress, CheckReport};

/// The config must be there and decode. Its problem, if any.
pub(super) fn check_config(store: &dyn ObjectStore, report: &mut CheckReport) -> Option<usize> {
    let result = store
        .get(CONFIG_OBJECT)
        .map_err(RepoError::from)
        .and_then(|bytes| RepoConfig::decode(&bytes));
    let e = result.err()?;
    Some(report.problem(CONFIG_OBJECT, detail(&e)))
}

/// The backup objects that decode, and the names of those that do not.
pub(super) struct Backups {
    pub records: Vec<BackupRecord>,
    pub damaged: Vec<String>,
}

pub(super) fn check_backups(
    store: &dyn ObjectStore,
    objects: &[String],
    report: &mut CheckReport,
    progress: &dyn Fn(CheckProgress),
) -> Backups {
    let mut out = Backups {
        records: Vec::new(),
        damaged: Vec::new(),
    };
    for (done, object) in objects.iter().enumerate() {
        let result = store
            .get(object)
            .map_err(RepoError::from)
            .and_then(|bytes| BackupRecord::decode(object, &bytes));
        match result {
            Ok(record) => out.records.push(record),
            Err(e) => {
                let name = backup_of(object);
                report.problem_affecting(object, detail(&e), [&name]);
                out.damaged.push(name);
            }
        }
        tick(progress, CheckPhase::Backups, done, objects.len());
    }
    out
}

/// What the recipes said beyond their own problems.
pub(super) struct Recipes {
    /// Recipes no backup names → the containers each references (none if
    /// it does not decode).
    pub orphans: BTreeMap<String, BTreeSet<u64>>,
    /// Every backup's recipe was read: nothing a backup needs is hidden.
    pub complete: bool,
}

/// Check every recipe listed, one part at a time (a whole recipe is one
/// part); each part of a recipe that committed backups name is handed to
/// `owned` with the part's object and their names, then dropped (a recipe
/// is 48 bytes a segment: all of them at once would not fit a large
/// store). Parts no index of a named recipe accounts for are garbage.
pub(super) fn check_recipes(
    store: &dyn ObjectStore,
    objects: &[String],
    backups: &Backups,
    report: &mut CheckReport,
    progress: &dyn Fn(CheckProgress),
    mut owned: impl FnMut(&str, &Recipe, &[String], &mut CheckReport),
) -> Recipes {
    let mut out = Recipes {
        orphans: BTreeMap::new(),
        complete: true,
    };
    let mut owners: BTreeMap<&str, Vec<&BackupRecord>> = BTreeMap::new();
    for record in &backups.records {
        owners.entry(&record.recipe).or_default().push(record);
    }
    // Parts, and the recipe objects proper.
    let (parts, recipes): (Vec<&String>, Vec<&String>) =
        objects.iter().partition(|o| part_of(o).is_some());
    let mut unaccounted: BTreeSet<&str> = parts.iter().map(|p| p.as_str()).collect();
    let listed: BTreeSet<&str> = recipes.iter().map(|o| o.as_str()).collect();
    for record in &backups.records {
        if !listed.contains(record.recipe.as_str()) {
            // Named as the missing object, as a missing container is.
            report.problem_affecting(
                &record.recipe,
                format!("missing, but backup {} names it", record.name),
                [&record.name],
            );
            out.complete = false;
        }
    }
    // Recipes backups name that could not be read: their parts are not
    // known to be garbage.
    let mut unreadable: BTreeSet<&str> = BTreeSet::new();
    let mut done = 0;
    let mut tick_one = |progress: &dyn Fn(CheckProgress)| {
        tick(progress, CheckPhase::Recipes, done, objects.len());
        done += 1;
    };
    for object in recipes {
        let decoded = store
            .get(object)
            .map_err(RepoError::from)
            .and_then(|bytes| RecipeObject::decode(object, &bytes));
        tick_one(progress);
        let (records, recipe) = match (owners.get(object.as_str()), decoded) {
            (None, decoded) => {
                let reason = orphan_reason(object, &backups.damaged, decoded.as_ref().err());
                report.garbage(object, reason);
                // An index's parts are listed, and counted, on their own.
                let refs = match decoded {
                    Ok(RecipeObject::Whole(r)) => r.segments.iter().map(|s| s.container).collect(),
                    _ => BTreeSet::new(),
                };
                out.orphans.insert(object.clone(), refs);
                continue;
            }
            (Some(records), Err(e)) => {
                report.problem_affecting(object, detail(&e), records.iter().map(|r| &r.name));
                out.complete = false;
                unreadable.insert(object);
                continue;
            }
            (Some(records), Ok(recipe)) => {
                for r in records {
                    // A restore refuses a recipe of another length than
                    // its backup read.
                    if recipe.stream_len() != r.report.bytes_in {
                        let d = format!(
                            "{} bytes long, but backup {} read {}",
                            recipe.stream_len(),
                            r.name,
                            r.report.bytes_in
                        );
                        report.problem_affecting(object, d, [&r.name]);
                    }
                }
                (records, recipe)
            }
        };
        let names: Vec<String> = records.iter().map(|r| r.name.clone()).collect();
        let index = match recipe {
            RecipeObject::Whole(recipe) => {
                owned(object, &recipe, &names, report);
                continue;
            }
            RecipeObject::Index(index) => index,
        };
        for (k, info) in index.parts.iter().enumerate() {
            let part = part_name(object, k);
            unaccounted.remove(part.as_str());
            match read_part(store, object, k, *info) {
                Ok((part, recipe)) => owned(&part, &recipe, &names, report),
                Err(e) => {
                    report.problem_affecting(&part, detail(&e), &names);
                    out.complete = false;
                }
            }
            tick_one(progress);
        }
    }
    // Parts of recipes no backup names, and parts past their index's end.
    for part in unaccounted {
        let (recipe, k) = part_of(part).expect("partitioned as a part");
        let reason = if unreadable.contains(recipe)
            || (owners.contains_key(recipe) && !listed.contains(recipe))
        {
            format!("a part of recipe {recipe}, which a backup names but which cannot be read; it may be needed to repair that recipe")
        } else if owners.contains_key(recipe) {
            format!("recipe {recipe} names fewer than {} parts", k + 1)
        } else {
            unnamed_reason(RECIPES_PREFIX, part, &backups.damaged)
        };
        let decoded = store
            .get(part)
            .map_err(RepoError::from)
            .and_then(|bytes| Recipe::decode(part, &bytes));
        let reason = match &decoded {
            Err(e) => format!("{reason}; it does not decode either: {}", detail(e)),
            Ok(_) => reason,
        };
        report.garbage(part, reason);
        let refs = decoded.map(|r| r.segments.iter().map(|s| s.container).collect());
        out.orphans
            .insert(part.to_string(), refs.unwrap_or_default());
        tick_one(progress);
    }
    out
}

/// Why an unnamed recipe is garbage, and what to know before removing it.
fn orphan_reason(object: &str, damaged: &[String], error: Option<&RepoError>) -> String {
    let mut reason = unnamed_reason(RECIPES_PREFIX, object, damaged);
    if let Some(e) = error {
        reason.push_str(&format!("; it does not decode either: {}", detail(e)));
    }
    reason
}

/// Why an object no backup names (`<prefix><backup>-<nonce>`) is garbage,
/// and whether it may be a damaged backup object's: that one looks unnamed
/// only because its namer cannot be read.
pub(super) fn unnamed_reason(prefix: &str, object: &str, damaged: &[String]) -> String {
    let suspect = damaged
        .iter()
        .find(|b| object.starts_with(&format!("{prefix}{b}-")));
    match suspect {
        Some(b) => format!("no backup names it, but it may be damaged backup {b}'s"),
        None => "no backup names it (a backup that did not finish, or a deleted one)".into(),
    }
}

pub(super) fn tick(progress: &dyn Fn(CheckProgress), phase: CheckPhase, done: usize, total: usize) {
    progress(CheckProgress {
        phase,
        done: done as u64 + 1,
        total: total as u64,
    });
}
