//! Checking the repository's own objects: the config, the backup objects
//! and the recipes they name. A recipe no backup names is garbage (a backup
//! that died before its commit point leaves one), not damage.

use std::collections::{BTreeMap, BTreeSet};

use crate::backup::{BackupRecord, RECIPES_PREFIX};
use crate::config::{RepoConfig, CONFIG_OBJECT};
use crate::objects::ObjectStore;
use crate::recipe::Recipe;
use crate::repo_error::RepoError;

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

/// Check every recipe listed, one at a time; each that committed backups
/// name is handed to `owned` with their names, then dropped (a recipe is
/// 48 bytes a segment: all of them at once would not fit a large store).
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
    let listed: BTreeSet<&str> = objects.iter().map(String::as_str).collect();
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
    for (done, object) in objects.iter().enumerate() {
        let decoded = store
            .get(object)
            .map_err(RepoError::from)
            .and_then(|bytes| Recipe::decode(object, &bytes));
        match (owners.get(object.as_str()), decoded) {
            (None, decoded) => {
                let reason = orphan_reason(object, &backups.damaged, decoded.as_ref().err());
                report.garbage(object, reason);
                let refs = decoded.map(|r| r.segments.iter().map(|s| s.container).collect());
                out.orphans.insert(object.clone(), refs.unwrap_or_default());
            }
            (Some(records), Err(e)) => {
                report.problem_affecting(object, detail(&e), records.iter().map(|r| &r.name));
                out.complete = false;
            }
            (Some(records), Ok(recipe)) => {
                for r in records {
                    // A restore refuses a recipe of another length than
                    // its backup read.
                    if recipe.stream_len != r.report.bytes_in {
                        let d = format!(
                            "{} bytes long, but backup {} read {}",
                            recipe.stream_len, r.name, r.report.bytes_in
                        );
                        report.problem_affecting(object, d, [&r.name]);
                    }
                }
                let names: Vec<String> = records.iter().map(|r| r.name.clone()).collect();
                owned(object, &recipe, &names, report);
            }
        }
        tick(progress, CheckPhase::Recipes, done, objects.len());
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
