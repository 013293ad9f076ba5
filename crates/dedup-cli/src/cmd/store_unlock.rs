//! `dedup store unlock REPO`: remove the writer's lock object a killed
//! process left in a bucket (`dedup_store::repo::LOCK_OBJECT`). A lock in
//! a directory is the kernel's and goes with its process: nothing to do.

use std::process::ExitCode;

use anyhow::bail;
use dedup_store::repo::{describe_holder, remove_lock_holding, Holder, LOCK_OBJECT};
use dedup_store::{Error, RepoLocation};
use serde::Serialize;

use super::shared::report::print_json;

#[derive(clap::Args)]
#[command(
    about = "Remove the writer's lock a killed process left in a repository in a bucket",
    after_help = "A process that writes to a repository in a bucket (backup, delete, gc, store serve) holds the object locks/writer while it runs and deletes it when it finishes. One that was killed leaves it behind, and every other writer is then refused, naming the holder. A lock left by a dead process of this host is taken over by the next writer on its own; one from another host is never guessed stale. Make sure the process it names is gone, then remove the lock with this command. Removing the lock of a process that still runs lets two writers run at once.\n\nExamples:\n  dedup store unlock s3://backups/hosts\n  dedup store unlock s3://backups/hosts --json"
)]
pub struct Args {
    /// Repository: s3://BUCKET/PREFIX.
    pub repo: RepoLocation,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct Report {
    repository: String,
    /// Who held the lock that was removed; null if there was none.
    removed: Option<String>,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    if a.repo.dir().is_some() {
        bail!(
            "{}: a repository in a directory is locked by the kernel while its writer runs, and unlocked when it ends: there is no lock to remove",
            a.repo
        );
    }
    let store = a.repo.open_store()?;
    let removed = match store.get(LOCK_OBJECT) {
        Ok(bytes) => {
            let holder = Holder::decode(&bytes);
            if let Some(h) = holder.as_ref().filter(|h| h.is_alive_here()) {
                bail!(
                    "{}: the lock is held by {}, which is running on this machine; stop it (it removes its lock when it ends) instead of removing the lock under it",
                    a.repo,
                    h.describe()
                );
            }
            // Only the lock read above: one taken meanwhile is a live
            // writer's.
            remove_lock_holding(&*store, &bytes)?;
            Some(describe_holder(holder.as_ref()))
        }
        Err(Error::NotFound { .. }) => None,
        Err(e) => return Err(e.into()),
    };
    let report = Report {
        repository: a.repo.to_string(),
        removed,
    };
    if a.json {
        print_json(&report)?;
    } else {
        match &report.removed {
            Some(holder) => println!("{}: removed the writer's lock of {holder}.", a.repo),
            None => println!("{}: no writer's lock to remove.", a.repo),
        }
    }
    Ok(ExitCode::SUCCESS)
}
