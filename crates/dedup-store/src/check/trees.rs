//! Checking tree objects (`trees/<backup>-<nonce>`): the metadata of the
//! files a backup of files holds, named by its backup object. A named tree
//! must be there and decode (`Tree::decode`: frame, lengths, paths that
//! stay inside a restore's target), and its stream length must be the
//! bytes its backup read (a restore refuses it otherwise). A tree no backup names is garbage,
//! like an unnamed recipe.

use std::collections::BTreeSet;

use crate::backup::TREES_PREFIX;

use super::backups::{tick, unnamed_reason, Backups};
use super::{store_detail, CheckPhase, CheckProgress, CheckReport};
use crate::objects::ObjectStore;

pub(super) fn check_trees(
    store: &dyn ObjectStore,
    objects: &[String],
    backups: &Backups,
    report: &mut CheckReport,
    progress: &dyn Fn(CheckProgress),
) {
    let listed: BTreeSet<&str> = objects.iter().map(String::as_str).collect();
    let mut named = BTreeSet::new();
    for record in &backups.records {
        let Some(tree) = &record.tree else { continue };
        named.insert(tree.as_str());
        if !listed.contains(tree.as_str()) {
            let d = format!("missing, but backup {} names it", record.name);
            report.problem_affecting(tree, d, [&record.name]);
        }
    }
    for (done, object) in objects.iter().enumerate() {
        let read = store.get(object);
        if named.contains(object.as_str()) {
            let owners = || {
                backups
                    .records
                    .iter()
                    .filter(|r| r.tree.as_ref() == Some(object))
            };
            let detail = match read {
                Err(e) => Some(store_detail(&e)),
                // Decoded as a restore would: frame, lengths, and a tree
                // that stays inside its target.
                Ok(bytes) => match crate::tree::Tree::decode(object, &bytes) {
                    Ok(tree) => {
                        // A restore refuses a tree whose files do not add
                        // up to the stream its backup read.
                        for r in owners() {
                            if let Err(d) = tree.check_stream_len(&r.name, r.report.bytes_in) {
                                report.problem_affecting(object, d, [&r.name]);
                            }
                        }
                        None
                    }
                    Err(crate::RepoError::Corrupt { detail, .. }) => Some(detail),
                    Err(e) => Some(e.to_string()),
                },
            };
            if let Some(detail) = detail {
                report.problem_affecting(object, detail, owners().map(|r| &r.name));
            }
        } else {
            let reason = unnamed_reason(TREES_PREFIX, object, &backups.damaged);
            report.garbage(object, reason);
        }
        tick(progress, CheckPhase::Trees, done, objects.len());
    }
}
