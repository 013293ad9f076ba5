//! `dedup delete`: remove a backup from a repository.

use std::process::ExitCode;

use dedup_store::RepoLocation;

use serde::Serialize;

use super::shared::report::print_json;

const SPACE_NOTE: &str = "its containers stay on disk until a garbage collection (dedup gc REPO) reclaims what no other backup shares";

#[derive(clap::Args)]
#[command(
    about = "Delete a backup (its space comes back with dedup gc REPO)",
    after_help = "The backup disappears at once; its recipe is removed too. Its tree goes with it. The containers holding its segments stay, since other backups may share them: `dedup gc REPO` then reclaims what no backup needs.\n\nExamples:\n  dedup delete ./repo home-monday\n  dedup delete ./repo home-monday --json"
)]
pub struct Args {
    /// Repository directory.
    pub repo: RepoLocation,
    /// Backup to delete.
    pub name: String,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct Report<'a> {
    deleted: &'a str,
    bytes_freed: u64,
    note: &'a str,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    // Deleting needs no index and no part in the writers' protocol.
    let repo = dedup_store::Repository::open_to_delete(&a.repo)?;
    repo.delete_backup(&a.name)?;
    if a.json {
        print_json(&Report {
            deleted: &a.name,
            bytes_freed: 0,
            note: SPACE_NOTE,
        })?;
    } else {
        outln!("Deleted backup {}; {SPACE_NOTE}.", a.name);
    }
    Ok(ExitCode::SUCCESS)
}
