//! `store check`: verify a repository's objects without writing anything,
//! and say which backups each damaged object costs.
//!
//! One function per object kind: config, backup objects (each names a
//! recipe and maybe a tree), trees (files' metadata), containers (catalogs,
//! and with `data` every segment), then recipes, each checked as it is read
//! against the catalog entries it names (catalogs read again, a bounded
//! number kept: nothing the size of the store is held in RAM but a few
//! bytes a container), then the garbage (objects no committed backup
//! needs), and last the many-writers protocol's objects (`protocol.rs`). Another kind named by the backup
//! object is one more function like `trees::check_trees`.
//!
//! Every failure to read or decode one object is recorded as that object's
//! problem, I/O errors included (a disk that cannot read a container has
//! lost it as far as its backups go); only a failure to list the store stops
//! the check. Nothing here panics on bad bytes: the decoders refuse them.

mod backups;
mod containers;
mod protocol;
mod references;
mod report;
mod repository;
mod trees;

use crate::backup::{BACKUPS_PREFIX, RECIPES_PREFIX, TREES_PREFIX};
use crate::container::{compacted_name, container_name, COMPACTED_PREFIX};
use crate::error::repo::{RepoError, RepoResult};
use crate::error::Error;
use crate::objects::ObjectStore;
use crate::repo::CONTAINERS_PREFIX;

pub use report::{CheckCounts, CheckReport, Garbage, Problem};

#[derive(Clone, Copy, Debug, Default)]
pub struct CheckOptions {
    /// Read every container whole and verify every segment (crc32c, then
    /// BLAKE3 after decompressing) against its catalog entry.
    pub data: bool,
}

/// Which kind of object the check is going through, in the order it
/// goes through them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckPhase {
    Backups,
    Trees,
    Containers,
    Recipes,
}

/// `done` of `total` objects of the phase's kind checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckProgress {
    pub phase: CheckPhase,
    pub done: u64,
    pub total: u64,
}

/// Check the repository in `store`. `Err` only when the store cannot be
/// listed; whatever is wrong with its objects is in the report. The check
/// only reads, but note that `LocalDir::open` creates a missing directory:
/// a caller checking a path it was given should see that it exists first.
pub fn check(
    store: &dyn ObjectStore,
    opts: CheckOptions,
    progress: &dyn Fn(CheckProgress),
) -> RepoResult<CheckReport> {
    let mut report = CheckReport {
        data_verified: opts.data,
        ..CheckReport::default()
    };
    let config_problem = backups::check_config(store, &mut report);
    // Listed in commit order (a backup puts its containers, then its
    // recipe and tree, then its backup object): a backup committing while we list
    // shows up at worst as garbage, never as a reference to something
    // missing. Deletions while we check (a backup deleted, a collection)
    // can still show as damage; a second check tells.
    let backup_names = store.list(BACKUPS_PREFIX)?;
    let tree_names = store.list(TREES_PREFIX)?;
    let recipe_names = store.list(RECIPES_PREFIX)?;
    let container_names = container_names(store)?;
    report.counts.backups = backup_names.len() as u64;
    // A recipe's parts are not recipes of their own.
    report.counts.recipes = recipe_names
        .iter()
        .filter(|o| crate::recipe::parts::part_of(o).is_none())
        .count() as u64;
    report.counts.trees = tree_names.len() as u64;

    let backups = backups::check_backups(store, &backup_names, &mut report, progress);
    if let Some(p) = config_problem {
        // Nothing restores without the config.
        let all: Vec<String> = backup_names.iter().map(|o| backup_of(o)).collect();
        report.affect(p, &all);
    }
    trees::check_trees(store, &tree_names, &backups, &mut report, progress);
    // Containers before recipes: each recipe is then checked against them
    // as it is read, and none is kept.
    let containers =
        containers::check_containers(store, &container_names, opts, &mut report, progress);
    let mut references = references::References::new(store, &containers);
    let recipes = backups::check_recipes(
        store,
        &recipe_names,
        &backups,
        &mut report,
        progress,
        |object, recipe, owners, report| references.check(object, recipe, owners, report),
    );
    references.finish(&recipes, &mut report);
    protocol::check_protocol(store, &mut report)?;

    report.garbage_complete = backups.damaged.is_empty() && recipes.complete;
    // Grouped by object; a container's segments stay in catalog order.
    report.problems.sort_by(|a, b| a.object.cmp(&b.object));
    Ok(report)
}

/// The containers to check: those listed, and those a compaction that a
/// crash interrupted left only as `compacted/<id>` (between deleting
/// `containers/<id>` and putting it again). Restores read that version in
/// the container's place, and the next writable open puts it back
/// (`gc/compact.rs`), so it is checked as the container.
fn container_names(store: &dyn ObjectStore) -> RepoResult<Vec<String>> {
    let mut names = store.list(CONTAINERS_PREFIX)?;
    let listed: std::collections::BTreeSet<String> = names.iter().cloned().collect();
    for object in store.list(COMPACTED_PREFIX)? {
        let id = object
            .strip_prefix(COMPACTED_PREFIX)
            .and_then(|h| u64::from_str_radix(h, 16).ok())
            .filter(|&id| compacted_name(id) == object);
        if let Some(name) = id.map(container_name).filter(|n| !listed.contains(n)) {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

/// The backup a `backups/<name>` object is, by its name alone (its bytes
/// may be what is damaged).
fn backup_of(object: &str) -> String {
    object
        .strip_prefix(BACKUPS_PREFIX)
        .unwrap_or(object)
        .to_string()
}

/// What a failed read or decode says about its object, without repeating
/// the object's name (the problem carries it).
fn detail(e: &RepoError) -> String {
    match e {
        RepoError::Store(e) => store_detail(e),
        RepoError::Corrupt { detail, .. } => detail.clone(),
        e => e.to_string(),
    }
}

fn store_detail(e: &Error) -> String {
    match e {
        Error::Corrupt { detail, .. } => detail.clone(),
        Error::NotFound { .. } => "missing".into(),
        e => e.to_string(),
    }
}
